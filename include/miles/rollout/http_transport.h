// The connections under the engine's HTTP server: one thread per open connection up to a cap, and
// a deadline on reading each request.
//
// Why: httplib 0.11 serves connections from a fixed pool of threads and bounds each recv(), not a
// request: 513 sockets that send one header byte every few seconds hold a 512-thread pool forever
// and every other client waits. Here a connection is refused (503, JSON body, closed) when
// `max_connections` are already open, a request's line and headers must arrive within
// `header_timeout` of its first byte (the TLS handshake too) and its body within `body_timeout` of
// its headers, and an idle keep-alive connection is closed after the server's keep-alive timeout.
// A slow client costs one thread for a bounded time, never the server.
//
// The server is httplib's (routing, parsing, responses); this replaces only the per-connection
// loop (Server::process_and_close_socket) and the stream it reads from and writes to.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace httplib {
class Server;
}  // namespace httplib

namespace miles::rollout {

struct ConnectionLimits {
  int max_connections = 1024;    // open connections served at once; 0: no cap
  double header_timeout_s = 10;  // request line + headers (and the TLS handshake), from 1st byte
  double body_timeout_s = 60;    // the body, from the end of the headers
};

struct TransportCounters {
  std::atomic<int64_t> open{0};        // connections being served now
  std::atomic<uint64_t> refused{0};    // over max_connections
  std::atomic<uint64_t> timed_out{0};  // requests whose headers or body missed their deadline
};

// A plain HTTP server, or HTTPS when `certfile` is set (PEM certificate and key). `counters` must
// outlive the server.
std::unique_ptr<httplib::Server> make_bounded_server(const ConnectionLimits& limits,
                                                     const std::string& certfile,
                                                     const std::string& keyfile,
                                                     TransportCounters* counters);

// Called by the server's pre-routing handler on the thread serving the request: its headers are
// in, so the body's deadline starts now.
void request_headers_received();
// On that thread: the connection closes after this response (a reply sent before the body was
// read: the body must not be parsed as the next request). The close lingers briefly, reading
// and discarding what the client still sends, so that it sees the reply rather than a reset.
void close_after_response();
// On that thread: whether the request being answered missed its header or body deadline (its
// reply is then a 408; the connection closes after it).
bool request_timed_out();

}  // namespace miles::rollout
