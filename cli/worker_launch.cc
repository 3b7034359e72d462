// Local multi-process launch over ChildProcess (the one spawner): start every rank, watch them,
// stop the rest on the first failure.
#include "cli/worker_launch.h"

#include <chrono>
#include <optional>
#include <thread>

#include "miles/controller/child_process.h"

namespace miles::cli {

Status run_local_workers(int world_size, const std::vector<std::vector<std::string>>& argvs) {
  std::vector<std::optional<controller::ChildProcess>> ranks(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    auto child = controller::ChildProcess::spawn(argvs[r], /*log_path=*/"");
    // On failure the ranks started so far are terminated as `ranks` goes out of scope.
    if (!child.ok()) return child.status().with_context("cannot start rank " + std::to_string(r));
    ranks[r] = std::move(child).value();
  }
  for (;;) {
    bool running = false;
    for (int r = 0; r < world_size; ++r) {
      controller::ChildProcess& c = *ranks[r];
      if (c.alive()) {
        running = true;
      } else if (!c.succeeded()) {
        const std::string how = c.exit_description();
        ranks.clear();  // SIGTERM (then SIGKILL) to every rank still running
        return Status::Error("rank " + std::to_string(r) + " " + how);
      }
    }
    if (!running) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace miles::cli
