// The one way miles starts a process: spawn_process (posix_spawn with the descriptors, process
// group and signal state a child needs), and ChildProcess on top of it — a process started by this
// one (a rollout engine, a trainer rank), its output appended to a log file or shared with ours,
// killed with us. Reward commands that talk over a socket (controller/line_process.h) are
// spawn_process children too.
//
// Why: engines started by `miles run` must not outlive it (SIGTERM when the controller dies, even
// by SIGKILL), must be restartable after a crash, and their logs must survive for the post-mortem
// (RUN_DIR/engines/engine_K.log). posix_spawn rather than fork + exec: glibc starts the child with
// a vfork-style clone, so a controller holding gigabytes of weights copies no page tables (nor
// fails for want of overcommit), and no code of ours runs in a forked copy of a multi-threaded
// process. The parent-death signal cannot be set through posix_spawn, so a `miles` child arms it
// itself first thing in main() (arm_parent_death_signal), told whom to watch by MILES_PARENT_PID.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "miles/status.h"

namespace miles::controller {

struct SpawnOptions {
  std::vector<std::string> argv;   // argv[0]: a path
  int stdin_fd = -1;               // the child's stdin; -1: /dev/null
  int stdout_fd = -1;              // the child's stdout; -1: ours
  int stderr_fd = -1;              // the child's stderr; -1: ours
  bool own_process_group = false;  // its own group: kill(-pid) reaches its children too
  // A `miles` child: dies with this process (SIGTERM), see arm_parent_death_signal.
  bool die_with_parent = false;
};

// Starts the child: no descriptor of ours but the three above, no blocked signals, SIGPIPE at its
// default. Returns its pid (reap it with waitpid).
Result<pid_t> spawn_process(const SpawnOptions& options);

// In a `miles` process started with die_with_parent, first thing in main(): SIGTERM when the
// parent dies (PR_SET_PDEATHSIG), or exit at once when it already has. No-op otherwise.
void arm_parent_death_signal();

class ChildProcess {
 public:
  // Starts `miles` (argv[0], a path) with argv, dying with us; stdout and stderr append to
  // `log_path` ("": ours), stdin is /dev/null.
  static Result<ChildProcess> spawn(const std::vector<std::string>& argv,
                                    const std::string& log_path);
  ChildProcess() = default;
  ChildProcess(ChildProcess&& o) noexcept
      : pid_(o.pid_), exit_(std::move(o.exit_)), succeeded_(o.succeeded_) {
    o.pid_ = -1;
  }
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ~ChildProcess();  // terminate()

  pid_t pid() const { return pid_; }
  // True while the process runs; reaps it once it has exited (exit_description() then says how).
  bool alive();
  const std::string& exit_description() const { return exit_; }
  // Once it has exited: whether with status 0.
  bool succeeded() const { return succeeded_; }
  // SIGTERM, up to 5 s for it to exit, then SIGKILL; reaps it.
  void terminate();

 private:
  pid_t pid_ = -1;
  std::string exit_;
  bool succeeded_ = false;
};

// The path of the running `miles` binary.
std::string miles_executable();

}  // namespace miles::controller
