// miles: the command-line program. Subcommands live in cmd_*.cc.
#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"miles: RL post-training for LLMs (rollout and trainer computing the same numbers)"};
  app.require_subcommand(1);
  miles::cli::register_generate(app);
  miles::cli::register_score(app);
  miles::cli::register_bench(app);
  miles::cli::register_serve(app);
  miles::cli::register_convert(app);
  miles::cli::register_tokenize(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
