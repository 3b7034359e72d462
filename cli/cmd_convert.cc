// `miles convert --gguf FILE --out DIR`: a llama.cpp GGUF checkpoint -> an HF model directory that
// `miles generate --model DIR` (and transformers) load: config.json, float32 model.safetensors,
// tokenizer.json, tokenizer_config.json (chat template), generation_config.json. The work is
// convert_gguf (include/miles/convert.h); this file only parses flags and reports.
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/model_files.h"
#include "miles/convert.h"

namespace miles::cli {

namespace {

struct ConvertFlags {
  std::string gguf, out;
  bool force = false;
};

int run_convert(const ConvertFlags& o) {
  const auto t0 = std::chrono::steady_clock::now();
  auto s = convert_gguf(o.gguf, o.out, ConvertOptions{.overwrite = o.force});
  if (!s.ok()) return fail("convert", s.message());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "miles convert: wrote %s (%s, %lld tensors, %.1f M parameters as float32; %s) in %.1f s\n",
      o.out.c_str(), s->architecture.c_str(), static_cast<long long>(s->tensors),
      static_cast<double>(s->parameters) / 1e6, s->tokenizer_file.c_str(), secs);
  return 0;
}

}  // namespace

void register_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertFlags>();
  CLI::App* sub = app.add_subcommand("convert", "Convert a GGUF checkpoint to an HF directory");
  sub->add_option(
         "--gguf", o->gguf,
         "GGUF file (llama, phi3, qwen2, qwen3, gemma3, glm4moe or deepseek2 architecture)")
      ->required();
  sub->add_option("--out", o->out, "output directory (must not exist unless --force)")->required();
  sub->add_flag("--force", o->force, "replace an existing output directory");
  sub->callback([o] {
    if (int rc = run_convert(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace miles::cli
