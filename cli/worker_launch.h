// Starting the worker processes of a multi-process job on this machine and waiting for them.
//
// Why: `miles sft --layout dp=2` (and the controller later) runs one `miles train-worker` process
// per rank. The launcher hosts the rendezvous store, starts the ranks, and if any rank fails, stops
// the others so that nothing is left waiting on a dead peer.
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
