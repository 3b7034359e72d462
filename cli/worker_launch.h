// Starting whole `miles` processes from a benchmark on this machine and waiting for them.
//
// Why: `miles bench sync` runs a trainer and its engines as processes, `miles bench step` one
// `miles run` per mode; if any fails, the others are stopped so that nothing is left waiting on a
// dead peer. (Jobs start their ranks through the controller's trainer group, trainer_group.h.)
#pragma once

#include <string>
#include <vector>

#include "miles/status.h"

namespace miles::cli {

// Runs `argvs[rank]` for rank 0..world_size-1 (stdout / stderr inherited; each dies with this
// process), waits for all of them. The first rank to exit non-zero (or die by a signal) makes the
// launcher terminate the rest; the error names that rank and how it ended.
Status run_local_workers(int world_size, const std::vector<std::vector<std::string>>& argvs);

}  // namespace miles::cli
