// Joining a group through the TcpStore, shared by the Gloo and NCCL back-ends.
//
// Why: a transport's own bootstrap (gloo's full mesh, ncclCommInitRank) reports a missing peer as a
// timeout on an address, or hangs. Publishing "<prefix>/joined/<rank>" and waiting for every
// member's key first turns that into an error that says which ranks did not show up.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "miles/status.h"
#include "miles/tcp_store.h"

namespace miles::comm::detail {

// "0,1,5".
std::string ranks_text(const std::vector<int>& ranks);

// Announces `rank` (group numbering) under `prefix` and waits until all world_ranks.size() members
// have. The error names the store, the group and the missing ranks (group and world numbering).
Status join_members(TcpStoreClient& store, const std::string& prefix, int rank,
                    const std::vector<int>& world_ranks, const std::string& name,
                    std::chrono::milliseconds timeout);

}  // namespace miles::comm::detail
