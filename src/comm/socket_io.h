// Blocking TCP helpers with deadlines, for the rendezvous store (not for bulk data: that is gloo's
// job).
//
// Why: every wait on the network must end, with an error naming the peer, when the peer is gone; so
// each read, write and connect here takes an absolute deadline and polls before touching the
// socket.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "miles/status.h"

namespace miles::comm::detail {

using Clock = std::chrono::steady_clock;

struct HostPort {
  std::string host;
  int port = 0;
  std::string to_string() const;  // "host:port", IPv6 hosts in brackets
};

// "host:port", "[::1]:port". The port must be in [0, 65535].
Result<HostPort> parse_host_port(std::string_view address);

// Connects (TCP_NODELAY), retrying refused / unreachable attempts until `deadline`.
Result<int> connect_tcp(const HostPort& peer, Clock::time_point deadline);
// Binds (SO_REUSEADDR) and listens; port 0 picks an ephemeral port.
Result<int> listen_tcp(const HostPort& where, int backlog = 128);
// The local port of a bound socket, or -1.
int local_port(int fd);

// Whole-buffer I/O; errors on EOF, socket errors, or when `deadline` passes first. Writes never
// raise SIGPIPE.
Status write_all(int fd, const void* data, size_t bytes, Clock::time_point deadline);
Status read_all(int fd, void* data, size_t bytes, Clock::time_point deadline);

void close_fd(int fd);

}  // namespace miles::comm::detail
