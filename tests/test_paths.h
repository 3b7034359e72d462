// Where tests find their data: the repository's tests/data, and ../shared (MILES_SHARED_DIR overrides).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace miles::test {

inline std::string source_dir() { return MILES_SOURCE_DIR; }
inline std::string data_dir() { return std::string(MILES_SOURCE_DIR) + "/tests/data"; }
inline std::string binary_dir() { return MILES_BINARY_DIR; }
inline std::string shared_dir() {
  if (const char* env = std::getenv("MILES_SHARED_DIR")) return env;
  return std::string(MILES_SOURCE_DIR) + "/../shared";
}
inline bool shared_available() { return std::filesystem::exists(shared_dir() + "/models/stories260K"); }

}  // namespace miles::test

// Skips the test (with the reason) when ../shared is not there.
#define MILES_REQUIRE_SHARED()                                                          \
  do {                                                                                  \
    if (!::miles::test::shared_available())                                             \
      GTEST_SKIP() << "shared/ not found at " << ::miles::test::shared_dir()           \
                   << " (set MILES_SHARED_DIR); skipping";                              \
  } while (0)
