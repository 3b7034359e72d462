// miles: the command-line program. Subcommands live in cmd_*.cc.
#include <cstdio>

#include "cli/commands.h"
#include "cli/serve_tp.h"

int main(int argc, char** argv) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("fma") || !__builtin_cpu_supports("avx")) {
    std::fprintf(
        stderr,
        "miles: this CPU lacks FMA3/AVX, which this build requires (x86-64 from 2013 on)\n");
    return 1;
  }
#endif
  CLI::App app{"miles: RL post-training for LLMs (rollout and trainer computing the same numbers)"};
  app.require_subcommand(1);
  miles::cli::register_generate(app);
  miles::cli::register_score(app);
  miles::cli::register_bench(app);
  miles::cli::register_serve(app);
  miles::cli::register_engine_tp_worker(app);
  miles::cli::register_run(app);
  miles::cli::register_report(app);
  miles::cli::register_convert(app);
  miles::cli::register_tokenize(app);
  miles::cli::register_sft(app, argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
