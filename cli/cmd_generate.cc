// `miles generate`: text generation from a prompt with the shared model (prefill, then one token per
// step), streaming each token's text as llama2.c's run.c prints it.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/model_files.h"
#include "miles/chat_template.h"
#include "miles/model.h"
#include "miles/sampler.h"
#include "miles/thread_pool.h"

namespace miles::cli {

namespace {

struct GenerateOptions {
  std::string model, tokenizer, prompt, system;
  bool chat = false;
  int64_t max_new_tokens = 256;
  SamplingParams sampling{.temperature = 1.0f, .top_p = 0.9f};
  int threads = 0;
};

// The prompt as a one-turn conversation in the model's chat template (tokenizer_config.json beside
// the model), with the assistant's generation prompt.
Result<std::string> render_chat(const GenerateOptions& o) {
  const std::string config = o.model + "/tokenizer_config.json";
  MILES_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::from_tokenizer_config(config));
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  messages.push_back({{"role", "user"}, {"content", o.prompt}});
  RenderOptions ro;
  ro.add_generation_prompt = true;
  return tmpl.render(messages, ro);
}

int run_generate(const GenerateOptions& o) {
  if (Status s = o.sampling.validate(); !s.ok()) return fail("generate", s.message());
  if (o.max_new_tokens < 0) return fail("generate", "--max-new-tokens must be >= 0");
  auto model = Model::load(o.model);
  if (!model.ok()) return fail("generate", model.message());
  const Model& m = **model;
  auto tok = find_tokenizer(o.model, o.tokenizer, static_cast<int32_t>(m.config().vocab_size));
  if (!tok.ok()) return fail("generate", tok.message());
  const Tokenizer& t = **tok;
  std::vector<int32_t> ids;
  if (o.chat) {
    auto text = render_chat(o);
    if (!text.ok()) return fail("generate", text.message());
    ids = t.encode(*text, /*add_special=*/false);
  } else {
    ids = t.encode(o.prompt, /*add_special=*/true);
  }
  if (ids.empty()) return fail("generate", "the prompt encodes to no tokens");
  const int64_t context = m.config().max_position_embeddings;
  if (static_cast<int64_t>(ids.size()) >= context)
    return fail("generate", "the prompt has " + std::to_string(ids.size()) +
                                " tokens; the model's context length is " + std::to_string(context));

  ThreadPool pool(o.threads);
  auto kv = m.make_kv_cache();
  // Echo the prompt as run.c does (without a leading BOS); in chat mode only the answer is printed.
  if (!o.chat) {
    const size_t first = ids[0] == t.bos_id() ? 1 : 0;
    if (first == 0) std::fputs(t.decode(std::span(ids).first(1)).c_str(), stdout);
    for (size_t i = std::max<size_t>(first, 1); i < ids.size(); ++i)
      std::fputs(t.decode_piece(ids[i - 1], ids[i]).c_str(), stdout);
    std::fflush(stdout);
  }

  const auto t0 = std::chrono::steady_clock::now();
  ForwardOptions fo;
  fo.all_logits = false;
  SeqSpan span{0, 0, static_cast<int64_t>(ids.size())};
  std::vector<int32_t> feed = ids;
  int64_t generated = 0;
  while (generated < o.max_new_tokens) {
    auto out = m.forward(feed, {&span, 1}, *kv, fo, &pool);
    if (!out.ok()) return fail("generate", out.message());
    const SampleResult s = sample_token(out->logits, o.sampling, static_cast<uint64_t>(generated));
    ++generated;
    if (s.token == t.eos_id() || s.token == t.bos_id()) break;
    std::fputs(t.decode_piece(feed.back(), s.token).c_str(), stdout);
    std::fflush(stdout);
    span.start_pos += span.n_tokens;
    span.n_tokens = 1;
    feed.assign(1, s.token);
    if (span.start_pos >= context) break;
  }
  std::fputs("\n", stdout);
  std::fflush(stdout);  // the answer first, then the timing line on stderr
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("miles generate: {} tokens in {:.3f} s ({:.1f} tokens/s, {} threads)", generated,
               secs, generated / std::max(secs, 1e-9), pool.num_threads());
  return 0;
}

}  // namespace

void register_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* sub = app.add_subcommand("generate", "Generate text from a prompt");
  sub->add_option("--model", o->model, "HF model directory or llama2.c checkpoint")->required();
  sub->add_option("--tokenizer", o->tokenizer, "tokenizer file (default: found beside the model)");
  sub->add_option("--prompt", o->prompt, "prompt text")->required();
  sub->add_flag("--chat", o->chat, "render the prompt as a user turn with the model's chat template");
  sub->add_option("--system", o->system, "system message (with --chat)");
  sub->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate at most")
      ->capture_default_str();
  sub->add_option("--temperature", o->sampling.temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top-p", o->sampling.top_p, "nucleus sampling mass")->capture_default_str();
  sub->add_option("--top-k", o->sampling.top_k, "0 = off")->capture_default_str();
  sub->add_option("--seed", o->sampling.seed, "sampling seed")->capture_default_str();
  sub->add_option("--threads", o->threads, "0 = all cores")->capture_default_str();
  sub->callback([o] {
    if (int rc = run_generate(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace miles::cli
