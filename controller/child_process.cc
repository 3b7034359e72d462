// spawn_process and ChildProcess (child_process.h): posix_spawn with the child's descriptors,
// process group and signal state; the parent-death signal armed by the `miles` child itself.
#include "miles/controller/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

extern char** environ;

namespace miles::controller {

namespace {

constexpr const char* kParentPidVar = "MILES_PARENT_PID";

// Our environment, with MILES_PARENT_PID naming this process when the child is to die with it.
std::vector<std::string> child_environment(bool die_with_parent) {
  std::vector<std::string> env;
  const std::string prefix = std::string(kParentPidVar) + "=";
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, prefix.c_str(), prefix.size()) != 0) env.emplace_back(*e);
  if (die_with_parent) env.push_back(prefix + std::to_string(getpid()));
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The child's descriptors: 0, 1, 2 as asked, nothing else of ours.
void set_file_actions(const SpawnOptions& o, posix_spawn_file_actions_t* fa) {
  if (o.stdin_fd >= 0) {
    posix_spawn_file_actions_adddup2(fa, o.stdin_fd, STDIN_FILENO);
  } else {
    posix_spawn_file_actions_addopen(fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  }
  if (o.stdout_fd >= 0) posix_spawn_file_actions_adddup2(fa, o.stdout_fd, STDOUT_FILENO);
  if (o.stderr_fd >= 0) posix_spawn_file_actions_adddup2(fa, o.stderr_fd, STDERR_FILENO);
  posix_spawn_file_actions_addclosefrom_np(fa, 3);
}

// No blocked signals, SIGPIPE at its default (we may ignore it), optionally its own group.
void set_attributes(const SpawnOptions& o, posix_spawnattr_t* attr) {
  sigset_t none, pipe_default;
  sigemptyset(&none);
  sigemptyset(&pipe_default);
  sigaddset(&pipe_default, SIGPIPE);
  posix_spawnattr_setsigmask(attr, &none);
  posix_spawnattr_setsigdefault(attr, &pipe_default);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (o.own_process_group) {
    posix_spawnattr_setpgroup(attr, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(attr, flags);
}

}  // namespace

std::string miles_executable() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("miles") : p.string();
}

Result<pid_t> spawn_process(const SpawnOptions& o) {
  if (o.argv.empty()) return Status::Error("spawn: empty command");
  std::vector<std::string> argv = o.argv;
  std::vector<std::string> env = child_environment(o.die_with_parent);
  std::vector<char*> argp = pointers(argv), envp = pointers(env);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  set_file_actions(o, &fa);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  set_attributes(o, &attr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argp[0], &fa, &attr, argp.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Status::Error("cannot start " + o.argv[0] + ": " + std::strerror(rc));
  return pid;
}

void arm_parent_death_signal() {
  const char* v = std::getenv(kParentPidVar);
  if (!v) return;
  const long parent = std::strtol(v, nullptr, 10);
  ::unsetenv(kParentPidVar);  // not for the processes this one starts
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != static_cast<pid_t>(parent)) _exit(1);  // the parent died before prctl
}

Result<ChildProcess> ChildProcess::spawn(const std::vector<std::string>& argv,
                                         const std::string& log_path) {
  const int log = log_path.empty()
                      ? -1
                      : open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (!log_path.empty() && log < 0)
    return Status::Error("cannot open " + log_path + ": " + std::strerror(errno));
  SpawnOptions o;
  o.argv = argv;
  o.stdout_fd = o.stderr_fd = log;
  o.die_with_parent = true;
  Result<pid_t> pid = spawn_process(o);
  if (log >= 0) close(log);
  if (!pid.ok()) return pid.status();
  ChildProcess c;
  c.pid_ = *pid;
  return c;
}
ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    terminate();
    pid_ = o.pid_;
    exit_ = std::move(o.exit_);
    succeeded_ = o.succeeded_;
    o.pid_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() { terminate(); }

bool ChildProcess::alive() {
  if (pid_ < 0) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  if (r == pid_) {
    succeeded_ = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    exit_ = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                              : "killed by signal " + std::to_string(WTERMSIG(status));
  } else {
    exit_ = "lost (waitpid failed)";
  }
  pid_ = -1;
  return false;
}

void ChildProcess::terminate() {
  if (!alive()) return;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 100 && alive(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (alive()) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    exit_ = "killed after SIGTERM timed out";
    pid_ = -1;
  }
}

}  // namespace miles::controller
