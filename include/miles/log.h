// Logging: every component logs through spdlog (spdlog::info / warn / error / debug), to stderr,
// with a timestamp and a level; this sets it up once per process.
//
// Why one place: the level is chosen by the user (`miles --log-level LEVEL`, or MILES_LOG_LEVEL in
// the environment) and must reach the processes `miles run` starts (engines, trainer ranks),
// which inherit the environment. Console output that is not a log line (the run's progress bar
// and step lines, a command's result on stdout) stays plain.
#pragma once

#include <string>
#include <string_view>

#include "miles/status.h"

namespace miles {

// The names --log-level takes: trace, debug, info, warn, error, critical, off.
const char* log_level_names();

// Sends spdlog's default logger to stderr with the pattern "2026-12-02 13:20:01.123 info <text>"
// at MILES_LOG_LEVEL (default info). Idempotent.
void init_logging();

// Sets the level of this process and of the processes it starts (MILES_LOG_LEVEL); an error naming
// the accepted names otherwise.
Status set_log_level(std::string_view name);

}  // namespace miles
