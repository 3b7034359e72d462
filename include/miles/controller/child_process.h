// ChildProcess: a process the controller started (a rollout engine), its output appended to a log
// file, killed with the controller.
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
  // Starts argv[0] (a path) with argv; stdout and stderr append to `log_path`.
  static Result<ChildProcess> spawn(const std::vector<std::string>& argv,
                                    const std::string& log_path);
  ChildProcess() = default;
  ChildProcess(ChildProcess&& o) noexcept : pid_(o.pid_) { o.pid_ = -1; }
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ~ChildProcess();  // terminate()

  pid_t pid() const { return pid_; }
  // True while the process runs; reaps it once it has exited (exit_description() then says how).
  bool alive();
  const std::string& exit_description() const { return exit_; }
  // SIGTERM, up to 5 s for it to exit, then SIGKILL; reaps it.
  void terminate();

 private:
  pid_t pid_ = -1;
  std::string exit_;
};

// The path of the running `miles` binary.
std::string miles_executable();

}  // namespace miles::controller
