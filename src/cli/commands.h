// The subcommands of `miles`, one file each; main.cc registers them.
#pragma once

#include <CLI/CLI.hpp>

namespace miles::cli {

void register_generate(CLI::App& app);
void register_score(CLI::App& app);
void register_bench(CLI::App& app);

}  // namespace miles::cli
