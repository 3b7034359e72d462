// Local multi-process launch: posix_spawn per rank, waitpid, SIGTERM the rest on a failure.
#include "cli/worker_launch.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>

extern char** environ;

namespace miles::cli {

std::string self_executable() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("miles") : p.string();
}

Status run_local_workers(int world_size, const std::vector<std::vector<std::string>>& argvs) {
  std::map<pid_t, int> rank_of;
  Status failure;
  for (int r = 0; r < world_size; ++r) {
    std::vector<char*> argv;
    for (const std::string& a : argvs[r]) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (int err = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ); err != 0) {
      failure = Status::Error("cannot start rank " + std::to_string(r) + " (" + argvs[r][0] +
                              "): " + std::strerror(err));
      break;
    }
    rank_of[pid] = r;
  }
  if (!failure.ok())
    for (const auto& [pid, r] : rank_of) kill(pid, SIGTERM);
  while (!rank_of.empty()) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    auto it = rank_of.find(pid);
    if (it == rank_of.end()) continue;
    const int r = it->second;
    rank_of.erase(it);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok || !failure.ok()) continue;
    failure = Status::Error("rank " + std::to_string(r) +
                            (WIFEXITED(status)
                                 ? " exited with status " + std::to_string(WEXITSTATUS(status))
                                 : " was killed by signal " + std::to_string(WTERMSIG(status))));
    for (const auto& [other, rr] : rank_of) kill(other, SIGTERM);
  }
  return failure;
}

}  // namespace miles::cli
