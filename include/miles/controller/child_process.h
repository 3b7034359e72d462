// ChildProcess: a process started by this one (a rollout engine, a trainer rank), its output
// appended to a log file or shared with ours, killed with us. The one way miles starts a `miles`
// process (reward commands that talk over pipes are controller/line_process.h).
//
// Why: engines started by `miles run` must not outlive it (PR_SET_PDEATHSIG: SIGTERM when the
// controller dies, even by SIGKILL), must be restartable after a crash, and their logs must survive
// for the post-mortem (RUN_DIR/engines/engine_K.log).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "miles/status.h"

namespace miles::controller {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv; stdout and stderr append to `log_path` ("": ours).
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
