// init_logging / set_log_level (log.h).
#include "miles/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>

namespace miles {

const char* log_level_names() { return "trace, debug, info, warn, error, critical, off"; }

namespace {

bool parse_level(std::string_view name, spdlog::level::level_enum* out) {
  static constexpr std::pair<std::string_view, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace},       {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},         {"warn", spdlog::level::warn},
      {"warning", spdlog::level::warn},      {"error", spdlog::level::err},
      {"critical", spdlog::level::critical}, {"off", spdlog::level::off}};
  for (const auto& [n, level] : kLevels)
    if (n == name) {
      *out = level;
      return true;
    }
  return false;
}

}  // namespace

void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_logger_mt("miles");
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %l %v");
    logger->flush_on(spdlog::level::trace);  // lines reach a redirected stderr at once
    spdlog::set_default_logger(logger);
    spdlog::level::level_enum level = spdlog::level::info;
    if (const char* env = std::getenv("MILES_LOG_LEVEL"); env && !parse_level(env, &level))
      spdlog::warn("MILES_LOG_LEVEL={} is not a level ({}); using info", env, log_level_names());
    spdlog::set_level(level);
  });
}

Status set_log_level(std::string_view name) {
  spdlog::level::level_enum level;
  if (!parse_level(name, &level))
    return Status::Error("--log-level " + std::string(name) + ": expected one of " +
                         log_level_names());
  init_logging();
  spdlog::set_level(level);
  ::setenv("MILES_LOG_LEVEL", std::string(name).c_str(), 1);
  return Status::Ok();
}

}  // namespace miles
