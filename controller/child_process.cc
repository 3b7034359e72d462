// ChildProcess (child_process.h): fork + exec with the log redirected and a parent-death signal.
#include "miles/controller/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

namespace miles::controller {

std::string miles_executable() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("miles") : p.string();
}

Result<ChildProcess> ChildProcess::spawn(const std::vector<std::string>& argv,
                                         const std::string& log_path) {
  if (argv.empty()) return Status::Error("spawn: empty command");
  const int log = log_path.empty()
                      ? -1
                      : open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (!log_path.empty() && log < 0)
    return Status::Error("cannot open " + log_path + ": " + std::strerror(errno));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    if (log >= 0) close(log);
    return Status::Error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    if (log >= 0) {
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
    }
    const int null_in = open("/dev/null", O_RDONLY);
    if (null_in >= 0) dup2(null_in, STDIN_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  if (log >= 0) close(log);
  ChildProcess c;
  c.pid_ = pid;
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
