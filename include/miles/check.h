// MILES_CHECK: broken invariants abort with context.
//
// Why: a bug must stop the process where it happens, with file, line and the values involved, instead of
// producing wrong numbers. User input is never checked with these: it gets a Status (status.h).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace miles::detail {
[[noreturn]] inline void check_failed(const char* file, int line, const char* cond, const char* msg) {
  std::fprintf(stderr, "miles: invariant violated at %s:%d: %s%s%s\n", file, line, cond,
               msg[0] ? " — " : "", msg);
  std::fflush(stderr);
  std::abort();
}
}  // namespace miles::detail

// MILES_CHECK(cond) or MILES_CHECK(cond, "what it means").
#define MILES_CHECK(cond, ...)                                                        \
  do {                                                                                \
    if (!(cond)) ::miles::detail::check_failed(__FILE__, __LINE__, #cond, "" __VA_ARGS__); \
  } while (0)
