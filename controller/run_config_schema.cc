// The job config's key table (every section and key, its type, its field) and the small helpers
// its users share: "did you mean" hints and ${VAR} expansion.
//
// Why: a key added to run_config.h must be added here once, and then parses, overrides, validates
// its origin and is written by run_config_to_yaml; tests/run_config_test.cc sets every key.
#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include "controller/run_config_internal.h"

namespace miles::run_config_internal {

std::span<const std::string_view> section_names() {
  static constexpr std::array<std::string_view, 15> kNames = {
      "model",   "sft",         "rollout", "trainer",    "parallel", "algorithm",  "data", "eval",
      "rewards", "weight_sync", "async",   "checkpoint", "logging",  "controller", "check"};
  return kNames;
}

std::vector<Section> sections_of(RunConfig& c) {
  auto& m = c.model;
  auto& s = c.sft;
  auto& r = c.rollout;
  auto& t = c.trainer;
  auto& p = c.parallel;
  auto& a = c.algorithm;
  auto& d = c.data;
  auto& e = c.eval;
  auto& w = c.weight_sync;
  auto& y = c.async;
  auto& k = c.checkpoint;
  auto& l = c.logging;
  auto& n = c.controller;
  auto& q = c.check;
  return {
      {"model", {{"path", &m.path}, {"tokenizer", &m.tokenizer}, {"reference", &m.reference}}},
      {"sft", {{"data", &s.data}, {"steps", &s.steps}, {"max_len", &s.max_len}}},
      {"rollout",
       {{"num_rollouts", &r.num_rollouts},
        {"rollout_batch_size", &r.rollout_batch_size},
        {"n_samples_per_prompt", &r.n_samples_per_prompt},
        {"over_sampling_batch_size", &r.over_sampling_batch_size},
        {"filter_zero_variance", &r.filter_zero_variance},
        {"max_new_tokens", &r.max_new_tokens},
        {"temperature", &r.temperature},
        {"top_p", &r.top_p},
        {"top_k", &r.top_k},
        {"stop", &r.stop},
        {"seed", &r.seed},
        {"environment", &r.environment},
        {"max_turns", &r.max_turns},
        {"function", &r.function},
        {"python_path", &r.python_path},
        {"num_engines", &r.num_engines},
        {"engines", &r.engines},
        {"engine_threads", &r.engine_threads},
        {"engine_tp", &r.engine_tp},
        {"engine_device", &r.engine_device},
        {"engine_num_blocks", &r.engine_num_blocks},
        {"engine_max_batch_tokens", &r.engine_max_batch_tokens},
        {"engine_max_running", &r.engine_max_running},
        {"speculative", &r.speculative},
        {"speculative_max_draft_tokens", &r.speculative_max_draft_tokens},
        {"speculative_adaptive", &r.speculative_adaptive},
        {"speculative_draft_head", &r.speculative_draft_head},
        {"speculative_draft_lr", &r.speculative_draft_lr},
        {"speculative_draft_vocab", &r.speculative_draft_vocab},
        {"speculative_draft_layers", &r.speculative_draft_layers},
        {"speculative_draft_ttt_length", &r.speculative_draft_ttt_length},
        {"health_check_interval_s", &r.health_check_interval_s},
        {"engine_start_timeout_s", &r.engine_start_timeout_s},
        {"max_engine_restarts", &r.max_engine_restarts}}},
      {"trainer",
       {{"global_batch_size", &t.global_batch_size},
        {"num_steps_per_rollout", &t.num_steps_per_rollout},
        {"micro_batch_size", &t.micro_batch_size},
        {"device", &t.device},
        {"lr", &t.lr},
        {"min_lr", &t.min_lr},
        {"warmup_steps", &t.warmup_steps},
        {"decay", &t.decay},
        {"weight_decay", &t.weight_decay},
        {"beta1", &t.beta1},
        {"beta2", &t.beta2},
        {"eps", &t.eps},
        {"clip_grad_norm", &t.clip_grad_norm},
        {"threads", &t.threads}}},
      {"parallel",
       {{"dp", &p.dp},
        {"pp", &p.pp},
        {"tp", &p.tp},
        {"comm", &p.comm},
        {"remote_ranks", &p.remote_ranks},
        {"host", &p.host},
        {"timeout_s", &p.timeout_s}}},
      {"algorithm",
       {{"advantage", &a.advantage},
        {"std_normalize", &a.std_normalize},
        {"policy_loss", &a.policy_loss},
        {"eps_clip", &a.eps_clip},
        {"eps_clip_high", &a.eps_clip_high},
        {"dual_clip_c", &a.dual_clip_c},
        {"kl_estimator", &a.kl_estimator},
        {"kl_coef", &a.kl_coef},
        {"entropy_coef", &a.entropy_coef},
        {"loss_reduction", &a.loss_reduction},
        {"constant_normaliser", &a.constant_normaliser},
        {"correction", &a.correction},
        {"tis_c", &a.tis_c},
        {"mis_low", &a.mis_low},
        {"mis_high", &a.mis_high},
        {"old_logp", &a.old_logp}}},
      {"data",
       {{"path", &d.path},
        {"prompt_key", &d.prompt_key},
        {"label_key", &d.label_key},
        {"apply_chat_template", &d.apply_chat_template},
        {"shuffle", &d.shuffle},
        {"seed", &d.seed}}},
      {"eval",
       {{"data", &e.data},
        {"every", &e.every},
        {"n_samples", &e.n_samples},
        {"temperature", &e.temperature},
        {"max_prompts", &e.max_prompts},
        {"max_new_tokens", &e.max_new_tokens},
        {"pass_threshold", &e.pass_threshold}}},
      {"weight_sync",
       {{"transport", &w.transport},
        {"dir", &w.dir},
        {"full_every", &w.full_every},
        {"keep_versions", &w.keep_versions},
        {"encoding", &w.encoding},
        {"compression", &w.compression},
        {"check_checksums", &w.check_checksums},
        {"group_timeout_s", &w.group_timeout_s},
        {"comm", &w.comm}}},
      {"async",
       {{"mode", &y.mode},
        {"max_weight_staleness", &y.max_weight_staleness},
        {"stale_policy", &y.stale_policy},
        {"update_weights_interval", &y.update_weights_interval},
        {"buffer_groups", &y.buffer_groups},
        {"pause_mode", &y.pause_mode}}},
      {"checkpoint",
       {{"dir", &k.dir},
        {"save_every", &k.save_every},
        {"save_final", &k.save_final},
        {"resume", &k.resume}}},
      {"logging",
       {{"run_dir", &l.run_dir},
        {"progress", &l.progress},
        {"tensorboard", &l.tensorboard},
        {"samples_every", &l.samples_every},
        {"samples_keep", &l.samples_keep},
        {"report_every", &l.report_every}}},
      {"controller", {{"host", &n.host}, {"port", &n.port}}},
      {"check",
       {{"max_logp_abs_diff", &q.max_logp_abs_diff},
        {"max_rollout_kl", &q.max_rollout_kl},
        {"min_ess", &q.min_ess},
        {"min_r3_agreement", &q.min_r3_agreement},
        {"max_ppo_kl", &q.max_ppo_kl},
        {"max_clipfrac", &q.max_clipfrac},
        {"layouts", &q.layouts},
        {"grad_norm_rel_tol", &q.grad_norm_rel_tol},
        {"grad_norm_rel_tol_tp", &q.grad_norm_rel_tol_tp},
        {"report", &q.report}}},
  };
}

bool rl_only(std::string_view section, std::string_view key) {
  static constexpr std::array<std::string_view, 8> kSections = {
      "rollout", "algorithm", "data", "eval", "rewards", "weight_sync", "async", "check"};
  if (std::find(kSections.begin(), kSections.end(), section) != kSections.end()) return true;
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 5> kKeys = {{
      {"model", "reference"},
      {"trainer", "num_steps_per_rollout"},
      {"logging", "samples_every"},
      {"logging", "samples_keep"},
      {"logging", "report_every"},
  }};
  return std::find(kKeys.begin(), kKeys.end(), std::pair{section, key}) != kKeys.end();
}

bool rl_only_path(std::string_view path) {
  const size_t end = path.find_first_of(".[");
  const std::string_view section = path.substr(0, end);
  const std::string_view key = end == std::string_view::npos ? "" : path.substr(end + 1);
  return rl_only(section, key);
}

std::vector<Field> reward_fields(RewardSpec& s) {
  return {{"kind", &s.kind},
          {"name", &s.name},
          {"weight", &s.weight},
          {"answer_prefix", &s.answer_prefix},
          {"tolerance", &s.tolerance},
          {"pattern", &s.pattern},
          {"keywords", &s.keywords},
          {"case_sensitive", &s.case_sensitive},
          {"max_tokens", &s.max_tokens},
          {"require_finish", &s.require_finish},
          {"url", &s.url},
          {"command", &s.command},
          {"function", &s.function},
          {"python_path", &s.python_path},
          {"timeout_s", &s.timeout_s}};
}

std::string type_name(const FieldPtr& ptr) {
  static constexpr std::array<std::string_view, 7> kNames = {
      "a string",      "an integer",        "a non-negative integer", "a number",
      "true or false", "a list of strings", "a list of integers"};
  return std::visit(
      [&](auto* field) -> std::string {
        using T = std::remove_cvref_t<decltype(*field)>;
        if constexpr (std::is_enum_v<T>)
          return "one of " + enum_choices<T>();
        else
          return std::string(kNames[ptr.index()]);
      },
      ptr);
}

// Optimal string alignment distance (insertions, deletions, substitutions, adjacent swaps),
// ignoring ASCII case.
size_t edit_distance(std::string_view a, std::string_view b) {
  auto lower = [](char ch) { return std::tolower(static_cast<unsigned char>(ch)); };
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
          lower(a[i - 2]) == lower(b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::string nearest(std::string_view word, std::span<const std::string_view> candidates) {
  const size_t budget = word.size() <= 4 ? 1 : word.size() <= 8 ? 2 : 3;
  std::string_view best;
  size_t best_distance = budget + 1;
  for (std::string_view candidate : candidates) {
    size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return std::string(best);
}

Result<std::string> expand_env(std::string_view text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, 3, "$${") == 0) {
      out += "${";
      i += 3;
      continue;
    }
    if (text.compare(i, 2, "${") != 0) {
      out += text[i++];
      continue;
    }
    size_t close = text.find('}', i + 2);
    if (close == std::string_view::npos) {
      return Status::Error("unterminated ${ in \"" + std::string(text) + "\"");
    }
    std::string_view inner = text.substr(i + 2, close - i - 2);
    size_t dash = inner.find(":-");
    std::string name(inner.substr(0, dash));
    bool valid = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
    for (char ch : name)
      valid = valid && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_');
    if (!valid) return Status::Error("bad variable name in ${" + std::string(inner) + "}");
    const char* value = std::getenv(name.c_str());
    if (value != nullptr && (*value != '\0' || dash == std::string_view::npos)) {
      out += value;  // like the shell's :-, an empty variable takes the default
    } else if (dash != std::string_view::npos) {
      out += inner.substr(dash + 2);
    } else {
      return Status::Error("environment variable " + name + " is not set (write ${" + name +
                           ":-default} for a fallback)");
    }
    i = close + 1;
  }
  return out;
}

std::string format_number(double value) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, r.ptr);
}

std::string escape_env(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "${") == 0) out += '$';
    out += text[i];
  }
  return out;
}

}  // namespace miles::run_config_internal
