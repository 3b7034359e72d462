// Scratch directories under the system temp directory that a test process removes when it exits
// (normally or through a failed assertion), so repeated test runs do not fill the disk with run
// directories and weights.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

namespace miles::test {

namespace detail {
struct ScratchDirs {
  std::mutex mu;
  std::vector<std::string> dirs;
  ~ScratchDirs() {
    for (const std::string& d : dirs) {
      std::error_code ec;  // best effort: a leftover is not a test failure
      std::filesystem::remove_all(d, ec);
    }
  }
};
inline ScratchDirs& scratch_dirs() {
  static ScratchDirs s;
  return s;
}
}  // namespace detail

// <temp>/<prefix><name>_<pid>, emptied now and removed at exit. Not created: the caller (or the
// program it runs) creates it.
inline std::string scratch_dir(const std::string& prefix, const std::string& name) {
  const std::string d =
      (std::filesystem::temp_directory_path() / (prefix + name + "_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(d);
  detail::ScratchDirs& s = detail::scratch_dirs();
  const std::lock_guard<std::mutex> lock(s.mu);
  s.dirs.push_back(d);
  return d;
}

}  // namespace miles::test
