// miles: the command-line program. Subcommands live in cmd_*.cc.
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/serve_tp.h"
#include "miles/controller/child_process.h"
#include "miles/log.h"

namespace {

// --log-level takes effect before any subcommand runs (they run inside CLI11's parse), so it is
// read from argv first; CLI11 still lists and validates it.
int apply_log_level(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    std::string value;
    if (a == "--log-level" && i + 1 < argc)
      value = argv[i + 1];
    else if (a.rfind("--log-level=", 0) == 0)
      value = a.substr(12);
    else
      continue;
    if (miles::Status s = miles::set_log_level(value); !s.ok()) {
      std::fprintf(stderr, "miles: %s\n", s.message().c_str());
      return 2;
    }
  }
  return 0;
}

// What the binary was built for: the compiler's optimisation and whether CUDA is in.
std::string miles_build_kind() {
  std::string kind =
#if defined(__OPTIMIZE__)
      "optimised";
#else
      "unoptimised";
#endif
#if defined(MILES_HAVE_CUDA)
  kind += ", CUDA";
#else
  kind += ", CPU only";
#endif
  return kind;
}

}  // namespace

int main(int argc, char** argv) {
  // Started by another miles process (an engine, a trainer rank): die with it.
  miles::controller::arm_parent_death_signal();
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("fma") || !__builtin_cpu_supports("avx")) {
    std::fprintf(
        stderr,
        "miles: this CPU lacks FMA3/AVX, which this build requires (x86-64 from 2013 on)\n");
    return 1;
  }
#endif
  miles::init_logging();
  if (int rc = apply_log_level(argc, argv); rc != 0) return rc;
  CLI::App app{"miles: RL post-training for LLMs (rollout and trainer computing the same numbers)"};
  app.require_subcommand(1);
  app.fallthrough();  // --log-level may come before or after the subcommand
  app.set_version_flag("--version", std::string("miles ") + MILES_VERSION + " (commit " +
                                        MILES_GIT_COMMIT + ", " + miles_build_kind() + ")");
  std::string log_level = "info";
  app.add_option("--log-level", log_level,
                 std::string("log lines at this level and above: ") + miles::log_level_names() +
                     " (default: MILES_LOG_LEVEL, else info); engines and ranks started by "
                     "`miles run` inherit it");
  miles::cli::register_generate(app);
  miles::cli::register_score(app);
  miles::cli::register_bench(app);
  miles::cli::register_serve(app);
  miles::cli::register_engine_tp_worker(app);
  miles::cli::register_run(app);
  miles::cli::register_report(app);
  miles::cli::register_convert(app);
  miles::cli::register_tokenize(app);
  miles::cli::register_sft(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
