// Running the `miles` program from a test: exit code and output (stdout, and stderr unless asked
// not).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "test_paths.h"

namespace miles::test {

struct CliRun {
  int exit_code;
  std::string out;
};

inline std::string miles_binary() { return binary_dir() + "/bin/miles"; }

// A shell command line: exit code and output (as the command redirects it).
inline CliRun run_shell(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline CliRun run_miles(const std::string& args, bool with_stderr = true) {
  return run_shell(miles_binary() + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

// `miles ARGS` (stderr included) from the source directory: the configs/ files use paths
// relative to it.
inline CliRun run_miles_in_source(const std::string& args) {
  return run_shell("cd '" + source_dir() + "' && " + miles_binary() + " " + args + " 2>&1");
}

// The JSON lines of a run's output that report a step (`miles sft`'s).
inline std::vector<nlohmann::json> steps_of(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("step")) v.push_back(j);
  }
  return v;
}

}  // namespace miles::test
