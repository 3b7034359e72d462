// Multi-turn samples (group_runner.h): each sample a TITO session — the model's turns generated
// by the engines, the environment's messages appended through the chat template's append-only API
// (include/miles/rollout/sessions.h), the exact token record kept for training. Two drivers:
// rollout.environment calculator (here) and rollout.function, a user's Python function
// (rollout_function.h) whose client's calls land in FunctionHost.
#include <atomic>

#include "controller/calculator.h"
#include "controller/group_runner.h"
#include "miles/rollout/sessions.h"

namespace miles::controller {

namespace {

FinishReason finish_of(const std::string& s) {
  return s == "stop"     ? FinishReason::kStop
         : s == "length" ? FinishReason::kLength
                         : FinishReason::kAbort;
}

// The completions outside the record (client.generate) draw seeds past any turn's.
constexpr int64_t kCompletionSeedBase = int64_t{1} << 32;

}  // namespace

// One sample's session and what it has produced so far.
struct GroupRunner::SessionRun {
  GroupRunner& runner;
  const Prompt& prompt;
  uint64_t seed;
  int32_t index;
  const std::atomic<bool>& cancel;
  rollout::Session session;
  RolloutSample out;
  std::string last_text;    // the last model turn, decoded
  std::string plan_error;   // set when the last turn failed because it could not be planned
  int64_t turns = 0;        // model turns made
  int64_t completions = 0;  // client.generate calls

  GroupRequest request(std::vector<int32_t> ids, int64_t max_new_tokens,
                       std::vector<std::string> stop, int64_t draw) const {
    const RolloutSection& cfg = runner.cfg_;
    GroupRequest req;
    req.input_ids = std::move(ids);
    req.n = 1;
    req.max_new_tokens = max_new_tokens;
    req.temperature = cfg.temperature;
    req.top_p = cfg.top_p;
    req.top_k = cfg.top_k;
    req.seed = group_seed(seed + static_cast<uint64_t>(index), draw);
    req.stop = std::move(stop);
    req.return_routed_experts = runner.experts_;
    return req;
  }

  // One model turn: `messages` must extend the conversation (sessions.h). The reply as the
  // client sees it: {"content", "finish_reason", "completion_tokens", "messages"}.
  Result<nlohmann::json> turn(const nlohmann::ordered_json& messages, const RenderOptions& options,
                              int64_t max_new_tokens, std::vector<std::string> stop) {
    plan_error.clear();
    std::lock_guard<std::mutex> lock(session.mu);
    const int64_t done = turns;
    if (done >= runner.cfg_.max_turns)
      return Status::Error("rollout.max_turns (" + std::to_string(runner.cfg_.max_turns) +
                           ") model turns reached");
    auto planned = rollout::plan_turn(session, messages, *runner.chat_, runner.tok_, options);
    if (!planned.ok()) {
      plan_error = planned.message();
      return planned.status();
    }
    rollout::TurnPlan plan = std::move(planned).value();
    MILES_ASSIGN_OR_RETURN(
        std::vector<GeneratedSample> gen,
        runner.pool_.generate(request(plan.input_ids, max_new_tokens, std::move(stop), done),
                              cancel));
    GeneratedSample& g = gen.front();
    if (g.finish_reason == "abort")
      return Status::Error(
          "a session turn was aborted (use async.pause_mode retract or in_place with "
          "multi-turn rollouts)");
    SampleEvent fin;
    fin.finished = true;
    fin.finish_reason = finish_of(g.finish_reason);
    fin.prompt_tokens = g.prompt_tokens;
    fin.output = g.tokens;
    fin.routed_experts = g.routed_experts;
    std::vector<int32_t> ids;
    for (const TokenOutput& t : g.tokens) ids.push_back(t.id);
    const Tokenizer& tok = runner.tok_;
    last_text = tok.decode(ids);
    // The reply as OpenAI's API returns it: the text without the stop token, which the chat
    // template writes back after the content.
    std::string content = last_text;
    if (fin.finish_reason == FinishReason::kStop && !ids.empty() && ids.back() == tok.eos_id())
      content = tok.decode(std::span<const int32_t>(ids.data(), ids.size() - 1));
    const nlohmann::json reply = {{"role", "assistant"}, {"content", content}};
    rollout::commit_turn(session, std::move(plan), fin, reply, runner.experts_per_token_);
    out.tokens.insert(out.tokens.end(), g.tokens.begin(), g.tokens.end());
    out.finish_reason = g.finish_reason;
    out.turns = ++turns;
    return nlohmann::json{{"content", content},
                          {"finish_reason", g.finish_reason},
                          {"completion_tokens", g.tokens.size()},
                          {"messages", session.conversation}};
  }

  // A completion outside the record: {"text", "ids", "finish_reason"}.
  Result<nlohmann::json> complete(std::vector<int32_t> ids, int64_t max_new_tokens,
                                  std::vector<std::string> stop) {
    if (completions >= runner.cfg_.max_turns)
      return Status::Error("rollout.max_turns (" + std::to_string(runner.cfg_.max_turns) +
                           ") completions reached");
    const int64_t draw = kCompletionSeedBase + completions++;
    MILES_ASSIGN_OR_RETURN(
        std::vector<GeneratedSample> gen,
        runner.pool_.generate(request(std::move(ids), max_new_tokens, std::move(stop), draw),
                              cancel));
    std::vector<int32_t> out_ids;
    for (const TokenOutput& t : gen.front().tokens) out_ids.push_back(t.id);
    return nlohmann::json{{"text", runner.tok_.decode(out_ids)},
                          {"ids", out_ids},
                          {"finish_reason", gen.front().finish_reason}};
  }

  // The training sample: the session's record (empty when no turn was made).
  RolloutSample finish() && {
    out.index = index;
    out.prompt_tokens = static_cast<int64_t>(prompt.ids.size());
    out.response = last_text;
    if (session.turns.empty()) return std::move(out);
    const nlohmann::json t = rollout::trajectory_json(session, runner.experts_per_token_, 0);
    out.trajectory = t["tokens"].get<std::vector<int32_t>>();
    out.response_start = t["response_start"].get<int64_t>();
    for (const auto& m : t["loss_mask"]) out.trajectory_mask.push_back(m.get<float>());
    out.trajectory_mask.erase(out.trajectory_mask.begin(),
                              out.trajectory_mask.begin() + out.response_start);
    out.trajectory_logp = t["rollout_logprobs"].get<std::vector<float>>();
    if (t.contains("routed_experts"))
      out.routed_experts = t["routed_experts"].get<std::vector<int32_t>>();
    return std::move(out);
  }
};

namespace {

// The run's limits unless the request narrows them (never widens: max_new_tokens is bounded by
// rollout.max_new_tokens).
Result<int64_t> max_new_tokens_of(const nlohmann::ordered_json& request, int64_t limit) {
  if (!request.contains("max_new_tokens")) return limit;
  const int64_t n = request["max_new_tokens"].get<int64_t>();
  if (n < 1 || n > limit)
    return Status::Error("max_new_tokens must be in [1, rollout.max_new_tokens = " +
                         std::to_string(limit) + "], got " + std::to_string(n));
  return n;
}

}  // namespace

// What a rollout function's client calls (rollout_function.h).
class GroupRunner::FunctionHost : public RolloutHost {
 public:
  explicit FunctionHost(SessionRun& run) : run_(run) {}

  Result<nlohmann::json> call(const std::string& op,
                              const nlohmann::ordered_json& request) override {
    try {
      if (op == "chat") return chat(request);
      if (op == "generate") return generate(request);
      return Status::Error("unknown client operation " + op);
    } catch (const nlohmann::ordered_json::exception& e) {
      return Status::Error(std::string("a malformed request: ") + e.what());
    }
  }

 private:
  Result<nlohmann::json> chat(const nlohmann::ordered_json& request) {
    const RolloutSection& cfg = run_.runner.cfg_;
    RenderOptions options;
    if (request.contains("tools")) options.tools = request["tools"];
    if (request.contains("chat_template_kwargs")) options.kwargs = request["chat_template_kwargs"];
    MILES_ASSIGN_OR_RETURN(int64_t max_new, max_new_tokens_of(request, cfg.max_new_tokens));
    const nlohmann::ordered_json messages = request.at("messages");
    Result<nlohmann::json> reply = run_.turn(messages, options, max_new, stop_of(request));
    // A conversation the record cannot take is the caller's error (ValueError in Python).
    if (!reply.ok() && !run_.plan_error.empty()) {
      run_.out.append_error = run_.plan_error;  // counted as session_append_errors
      return nlohmann::json{{"rejected", run_.plan_error}};
    }
    return reply;
  }

  Result<nlohmann::json> generate(const nlohmann::ordered_json& request) {
    const RolloutSection& cfg = run_.runner.cfg_;
    MILES_ASSIGN_OR_RETURN(int64_t max_new, max_new_tokens_of(request, cfg.max_new_tokens));
    std::vector<int32_t> ids =
        request.contains("text")
            ? run_.runner.tok_.encode(request["text"].get<std::string>(), false)
            : request.at("input_ids").get<std::vector<int32_t>>();
    if (ids.empty()) return Status::Error("generate: an empty prompt");
    return run_.complete(std::move(ids), max_new, stop_of(request));
  }

  std::vector<std::string> stop_of(const nlohmann::ordered_json& request) const {
    if (!request.contains("stop")) return run_.runner.cfg_.stop;
    return request["stop"].get<std::vector<std::string>>();
  }

  SessionRun& run_;
};

Result<RolloutSample> GroupRunner::run_session(const Prompt& prompt, uint64_t seed, int32_t index,
                                               const std::atomic<bool>& cancel) {
  if (!chat_ || prompt.messages.empty())
    return Status::Error(std::string(function_ ? "rollout.function" : "rollout.environment") +
                         " needs chat prompts (data.apply_chat_template) and a chat template");
  SessionRun run{*this, prompt, seed, index, cancel, {}, {}, {}, {}, 0, 0};
  if (function_) return run_function(run);
  nlohmann::ordered_json messages = prompt.messages;
  for (int64_t turn = 0; turn < cfg_.max_turns; ++turn) {
    Result<nlohmann::json> reply =
        run.turn(messages, RenderOptions{}, cfg_.max_new_tokens, cfg_.stop);
    if (!reply.ok()) {
      // The first turn must render; a later one that cannot extend the record (e.g. the model
      // ended its turn with another stop token than the template's) ends the episode as it is.
      if (turn == 0 || run.plan_error.empty()) return reply.status();
      run.out.append_error = run.plan_error;
      break;
    }
    if ((*reply)["finish_reason"] != "stop") break;  // a cut reply cannot be appended to
    auto call = find_calculator_call((*reply)["content"].get<std::string>());
    if (!call) break;
    messages = (*reply)["messages"];
    messages.push_back({{"role", "tool"}, {"content", calculator_reply(*call)}});
  }
  return std::move(run).finish();
}

Result<RolloutSample> GroupRunner::run_function(SessionRun& run) {
  const nlohmann::ordered_json sample = {{"messages", run.prompt.messages},
                                         {"prompt", run.prompt.text},
                                         {"label", run.prompt.label},
                                         {"row", run.prompt.row},
                                         {"index", run.index}};
  FunctionHost host(run);
  RolloutOutcome outcome = function_->run(sample, host);
  if (run.cancel) return Status::Error("cancelled");
  RolloutSample out = std::move(run).finish();
  out.rollout_result = std::move(outcome.result);
  out.rollout_error = std::move(outcome.error);
  if (out.rollout_error.empty() && out.trajectory.empty())
    out.rollout_error = "rollout function " + function_->name() +
                        " made no model turn (await client.chat(messages))";
  return out;
}

}  // namespace miles::controller
