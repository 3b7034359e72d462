// The subcommands of `miles`, one file each; main.cc registers them.
#pragma once

#include <CLI/CLI.hpp>

namespace miles::cli {

void register_generate(CLI::App& app);
void register_score(CLI::App& app);
void register_bench(CLI::App& app);
void register_bench_rollout(CLI::App& bench);  // under `miles bench`
void register_bench_train(CLI::App& bench);    // under `miles bench`
void register_bench_sync(CLI::App& bench);     // under `miles bench`
void register_bench_step(CLI::App& bench);     // under `miles bench`
void register_serve(CLI::App& app);
void register_run(CLI::App& app);
void register_report(CLI::App& app);
void register_convert(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_sft(CLI::App& app);

}  // namespace miles::cli
