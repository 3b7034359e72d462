// TcpStore: a small key-value store over TCP, for rendezvous.
//
// Why: processes of a job must find each other before they can talk: each publishes its transport
// address under a key and waits for the others' keys. Debian's gloo ships a file store, a hash
// store and a Redis store, but no TCP store, so this is one (in the spirit of PyTorch's TCPStore).
// The server is run by rank 0 (CommOptions::host_store) or by an external process such as the
// controller; it knows nothing of gloo, so a gRPC controller can embed it as is. The gloo adapter
// lives privately in src/comm.
//
// Semantics: values are opaque bytes; `set` overwrites; `get` and `wait` block until the keys exist
// or the timeout passes (an error naming the missing keys); `add` is an atomic counter stored as
// decimal text.
//
// Wire protocol (one request, one reply, in order, on one connection; integers little-endian):
//   request  = u8 op, then per op:  SET key value | GET key u64 timeout_ms | WAIT u32 n key*n u64
//   timeout_ms
//              | ADD key i64 delta | CHECK u32 n key*n | DELETE key        (key, value = u32 length
//              + bytes)
//              | AUTH token
//   reply    = u8 code (0 ok, 1 timeout, 2 bad request, 3 unauthorized), then: GET value | WAIT on
//              timeout u32 n missing key*n | ADD i64 new value | CHECK u8 all present | DELETE u8
//              existed
// Authentication: a server given a token takes AUTH with that token as the first request of a
// connection (within 30 s of connecting) and closes a connection that sends anything else (reply
// 3). The token is the run's (MILES_RUN_TOKEN, see secret.h) unless the options say otherwise, so
// every store and client of a `miles run` job authenticates without being told; it travels in
// the clear, so the store's network must be private (docs/security.md). The server binds
// 127.0.0.1 unless told otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "miles/secret.h"
#include "miles/status.h"

namespace miles {

struct TcpStoreServerOptions {
  std::string host = "127.0.0.1";  // address to bind; "0.0.0.0" for every interface
  int port = 0;                    // 0: an ephemeral port, see TcpStoreServer::port()
  std::string token = run_token();  // clients must present it; "": no authentication
};

class TcpStoreServer {
 public:
  // Binds, listens and starts serving on background threads (one acceptor, one per connection).
  static Result<std::unique_ptr<TcpStoreServer>> start(const TcpStoreServerOptions& options);
  // Stops: closes every connection (blocked clients get an error) and joins the threads.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const;
  // "host:port" to give to clients.
  std::string address() const;

  struct Impl;

 private:
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct TcpStoreClientOptions {
  std::string address;  // "host:port" or "[v6 address]:port"
  // How long to keep retrying the first connection (the server may start after its clients).
  std::chrono::milliseconds connect_timeout{60'000};
  std::string token = run_token();  // presented on connecting when not empty
};

// One connection to a TcpStoreServer. Thread-safe (requests are serialized on the connection).
class TcpStoreClient {
 public:
  static Result<std::unique_ptr<TcpStoreClient>> connect(const TcpStoreClientOptions& options);
  ~TcpStoreClient();
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  const std::string& address() const { return address_; }

  Status set(const std::string& key, const std::string& value);
  // Blocks until `key` exists, at most `timeout`.
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout);
  // Blocks until every key exists, at most `timeout`; the error lists the keys still missing.
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Atomically adds `delta` to the counter at `key` (absent counts as 0) and returns the new value.
  Result<int64_t> add(const std::string& key, int64_t delta);
  // Whether every key exists now (does not block).
  Result<bool> check(const std::vector<std::string>& keys);
  // Removes `key`; returns whether it existed.
  Result<bool> remove(const std::string& key);

 private:
  TcpStoreClient(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  Status authenticate(const std::string& token);
  // Sends `request`, reads the reply code and hands the connection to `read_rest` for the payload.
  // `wait_budget` is how long the server may legitimately block before replying.
  template <typename ReadRest>
  Status roundtrip(const std::string& what, const std::string& request,
                   std::chrono::milliseconds wait_budget, uint8_t* code, ReadRest read_rest);

  std::mutex mu_;
  int fd_ = -1;
  std::string address_;
  bool broken_ = false;  // a transport error left the connection mid-message; every call now fails
};

}  // namespace miles
