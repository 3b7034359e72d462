// Confining the hosts a server connects to on a client's word (weight-group joins) to hosts it
// was told to trust.
//
// Why: /join_weight_group names a rendezvous store; an engine that joins any store connects
// wherever it is told and presents the run's token there. Joins reach only this machine and the
// hosts the engine trusts: its controller's, and --weight-store-host.
#pragma once

#include <string>
#include <vector>

#include "miles/status.h"

namespace miles {

// Ok when the host of `address` ("host:port", "[v6]:port") is a loopback or unspecified address,
// or resolves to an address that one of `trusted` resolves to. The error names the address and
// `flag`.
Status confine_host(const std::string& address, const std::vector<std::string>& trusted,
                    const std::string& flag);

}  // namespace miles
