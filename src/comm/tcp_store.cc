// TcpStore server and client (protocol in include/miles/tcp_store.h).
//
// The server keeps the map under one mutex; a blocking GET / WAIT sleeps on a condition variable
// that every SET / ADD notifies. One thread per connection: a job has tens to hundreds of ranks,
// each with one connection, so the simplicity is worth the threads.
#include "miles/tcp_store.h"

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <list>
#include <map>
#include <thread>

#include "socket_io.h"

namespace miles {

using comm::detail::Clock;
namespace sio = comm::detail;

namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kCheck = 5, kDelete = 6, kAuth = 7 };
enum Code : uint8_t { kOk = 0, kTimeout = 1, kBadRequest = 2, kUnauthorized = 3 };

constexpr uint32_t kMaxKeyBytes = 1u << 16;
constexpr uint32_t kMaxValueBytes = 1u << 30;
constexpr uint32_t kMaxKeys = 1u << 20;
// Once a request or reply has started, the rest of it must arrive within this.
constexpr auto kMessageGrace = std::chrono::seconds(30);
// A connection to a store with a token must authenticate within this, with a token this long.
constexpr auto kAuthGrace = std::chrono::seconds(30);
constexpr uint32_t kMaxTokenBytes = 4096;

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86-64 and aarch64 are little-endian, as the protocol says
  out.append(b, sizeof(T));
}
void put_str(std::string& out, const std::string& s) {
  put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out += s;
}
void put_keys(std::string& out, const std::vector<std::string>& keys) {
  put<uint32_t>(out, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) put_str(out, k);
}

template <typename T>
Status read_pod(int fd, T* v, Clock::time_point deadline) {
  return sio::read_all(fd, v, sizeof(T), deadline);
}
Status get_str(int fd, std::string* s, uint32_t limit, Clock::time_point deadline) {
  uint32_t n = 0;
  MILES_RETURN_IF_ERROR(read_pod(fd, &n, deadline));
  if (n > limit)
    return Status::Error("string of " + std::to_string(n) + " bytes is over the limit");
  s->resize(n);
  return sio::read_all(fd, s->data(), n, deadline);
}
Status get_keys(int fd, std::vector<std::string>* keys, Clock::time_point deadline) {
  uint32_t n = 0;
  MILES_RETURN_IF_ERROR(read_pod(fd, &n, deadline));
  if (n > kMaxKeys) return Status::Error("too many keys: " + std::to_string(n));
  keys->resize(n);
  for (auto& k : *keys) MILES_RETURN_IF_ERROR(get_str(fd, &k, kMaxKeyBytes, deadline));
  return Status::Ok();
}

Clock::time_point deadline_after(std::chrono::milliseconds d) {
  // Saturate: a huge timeout means "forever", not an overflow into the past.
  const auto cap = std::chrono::hours(24 * 365);
  return Clock::now() + std::min<std::chrono::milliseconds>(std::max(d, {}), cap);
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", " : "") + keys[i];
  return s;
}

}  // namespace

// ---- server ------------------------------------------------------------------------------------

struct TcpStoreServer::Impl {
  struct Conn {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  int listen_fd = -1;
  int port = 0;
  std::string host;
  std::string token;
  std::atomic<bool> stopping{false};
  std::thread acceptor;

  std::mutex mu;  // guards data
  std::condition_variable changed;
  std::map<std::string, std::string> data;

  std::mutex conns_mu;  // guards conns
  std::list<std::unique_ptr<Conn>> conns;

  void accept_loop();
  void serve(Conn* conn);
  // The connection's first request, when the store has a token: AUTH with that token.
  bool authenticate(int fd);
  // Handles one request whose op byte was read; false to drop the connection.
  bool handle(int fd, uint8_t op);
  bool all_present(const std::vector<std::string>& keys) const {
    for (const auto& k : keys) {
      if (!data.count(k)) return false;
    }
    return true;
  }
};

void TcpStoreServer::Impl::accept_loop() {
  while (!stopping.load()) {
    pollfd p{listen_fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(conns_mu);
    // Reap finished connections so a long-lived server does not accumulate threads.
    for (auto it = conns.begin(); it != conns.end();) {
      if ((*it)->done.load()) {
        (*it)->thread.join();
        sio::close_fd((*it)->fd);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
    if (stopping.load()) {
      sio::close_fd(fd);
      break;
    }
    auto conn = std::make_unique<Conn>();
    conn->fd = fd;
    Conn* raw = conn.get();
    conn->thread = std::thread([this, raw] { serve(raw); });
    conns.push_back(std::move(conn));
  }
}

bool TcpStoreServer::Impl::authenticate(int fd) {
  const auto deadline = Clock::now() + kAuthGrace;
  uint8_t op = 0;
  std::string presented;
  const bool ok = sio::read_all(fd, &op, 1, deadline).ok() && op == kAuth &&
                  get_str(fd, &presented, kMaxTokenBytes, deadline).ok() &&
                  secret_equal(presented, token);
  const uint8_t code = ok ? kOk : kUnauthorized;
  return sio::write_all(fd, &code, 1, Clock::now() + kMessageGrace).ok() && ok;
}

void TcpStoreServer::Impl::serve(Conn* conn) {
  if (!token.empty() && !authenticate(conn->fd)) {
    conn->done.store(true);
    return;
  }
  for (;;) {
    uint8_t op = 0;
    // Idle connections wait forever; stop() shuts the socket down, which ends this read.
    if (!sio::read_all(conn->fd, &op, 1, Clock::time_point::max()).ok()) break;
    if (stopping.load() || !handle(conn->fd, op)) break;
  }
  conn->done.store(true);
}

bool TcpStoreServer::Impl::handle(int fd, uint8_t op) {
  const auto deadline = Clock::now() + kMessageGrace;
  std::string reply;
  const auto send_reply = [&] {
    return sio::write_all(fd, reply.data(), reply.size(), deadline).ok();
  };
  const auto bad_request = [&] {
    reply.assign(1, static_cast<char>(kBadRequest));
    send_reply();
    return false;
  };
  std::string key, value;
  std::vector<std::string> keys;
  uint64_t timeout_ms = 0;
  switch (op) {
    case kSet: {
      if (!get_str(fd, &key, kMaxKeyBytes, deadline).ok()) return bad_request();
      if (!get_str(fd, &value, kMaxValueBytes, deadline).ok()) return bad_request();
      {
        std::lock_guard<std::mutex> lock(mu);
        data[key] = std::move(value);
      }
      changed.notify_all();
      put<uint8_t>(reply, kOk);
      return send_reply();
    }
    case kGet:
    case kWait: {
      if (op == kGet) {
        if (!get_str(fd, &key, kMaxKeyBytes, deadline).ok()) return bad_request();
        keys = {key};
      } else if (!get_keys(fd, &keys, deadline).ok()) {
        return bad_request();
      }
      if (!read_pod(fd, &timeout_ms, deadline).ok()) return bad_request();
      const auto until = deadline_after(std::chrono::milliseconds(
          static_cast<int64_t>(std::min<uint64_t>(timeout_ms, uint64_t{1} << 50))));
      std::unique_lock<std::mutex> lock(mu);
      const bool present =
          changed.wait_until(lock, until, [&] { return stopping.load() || all_present(keys); });
      if (stopping.load()) return false;
      if (!present) {
        std::vector<std::string> missing;
        for (const auto& k : keys) {
          if (!data.count(k)) missing.push_back(k);
        }
        lock.unlock();
        put<uint8_t>(reply, kTimeout);
        if (op == kWait) put_keys(reply, missing);
        return send_reply();
      }
      put<uint8_t>(reply, kOk);
      if (op == kGet) put_str(reply, data[key]);
      lock.unlock();
      return send_reply();
    }
    case kAdd: {
      int64_t delta = 0;
      if (!get_str(fd, &key, kMaxKeyBytes, deadline).ok()) return bad_request();
      if (!read_pod(fd, &delta, deadline).ok()) return bad_request();
      int64_t now = 0;
      {
        std::lock_guard<std::mutex> lock(mu);
        auto it = data.find(key);
        if (it != data.end()) now = std::strtoll(it->second.c_str(), nullptr, 10);
        now += delta;
        data[key] = std::to_string(now);
      }
      changed.notify_all();
      put<uint8_t>(reply, kOk);
      put<int64_t>(reply, now);
      return send_reply();
    }
    case kCheck: {
      if (!get_keys(fd, &keys, deadline).ok()) return bad_request();
      bool present;
      {
        std::lock_guard<std::mutex> lock(mu);
        present = all_present(keys);
      }
      put<uint8_t>(reply, kOk);
      put<uint8_t>(reply, present ? 1 : 0);
      return send_reply();
    }
    case kAuth: {  // already authenticated (or no token): accepted, whatever it holds
      if (!get_str(fd, &key, kMaxTokenBytes, deadline).ok()) return bad_request();
      put<uint8_t>(reply, kOk);
      return send_reply();
    }
    case kDelete: {
      if (!get_str(fd, &key, kMaxKeyBytes, deadline).ok()) return bad_request();
      bool existed;
      {
        std::lock_guard<std::mutex> lock(mu);
        existed = data.erase(key) > 0;
      }
      put<uint8_t>(reply, kOk);
      put<uint8_t>(reply, existed ? 1 : 0);
      return send_reply();
    }
    default:
      return bad_request();
  }
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(
    const TcpStoreServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return Status::Error("tcp store: port " + std::to_string(options.port) +
                         " is not in [0, 65535]");
  }
  auto impl = std::make_unique<Impl>();
  impl->host = options.host;
  impl->token = options.token;
  auto fd = sio::listen_tcp(sio::HostPort{options.host, options.port});
  if (!fd.ok()) return fd.status().with_context("tcp store server");
  impl->listen_fd = *fd;
  impl->port = sio::local_port(*fd);
  Impl* raw = impl.get();
  impl->acceptor = std::thread([raw] { raw->accept_loop(); });
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stopping.store(true);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);  // no waiter misses the notification
  }
  impl_->changed.notify_all();
  impl_->acceptor.join();
  std::lock_guard<std::mutex> lock(impl_->conns_mu);
  for (auto& c : impl_->conns) ::shutdown(c->fd, SHUT_RDWR);
  for (auto& c : impl_->conns) {
    c->thread.join();
    sio::close_fd(c->fd);
  }
  sio::close_fd(impl_->listen_fd);
}

int TcpStoreServer::port() const { return impl_->port; }

std::string TcpStoreServer::address() const {
  return sio::HostPort{impl_->host, impl_->port}.to_string();
}

// ---- client ------------------------------------------------------------------------------------

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::connect(
    const TcpStoreClientOptions& options) {
  auto hp = sio::parse_host_port(options.address);
  if (!hp.ok()) return hp.status().with_context("tcp store");
  auto fd = sio::connect_tcp(*hp, deadline_after(options.connect_timeout));
  if (!fd.ok()) {
    return fd.status().with_context("tcp store: no server at " + options.address + " within " +
                                    std::to_string(options.connect_timeout.count()) + " ms");
  }
  auto client = std::unique_ptr<TcpStoreClient>(new TcpStoreClient(*fd, hp->to_string()));
  if (!options.token.empty()) MILES_RETURN_IF_ERROR(client->authenticate(options.token));
  return client;
}

Status TcpStoreClient::authenticate(const std::string& token) {
  std::string req;
  put<uint8_t>(req, kAuth);
  put_str(req, token);
  uint8_t code = 0;
  return roundtrip("authenticate", req, {}, &code,
                   [](int, Clock::time_point) { return Status::Ok(); });
}

TcpStoreClient::~TcpStoreClient() { sio::close_fd(fd_); }

template <typename ReadRest>
Status TcpStoreClient::roundtrip(const std::string& what, const std::string& request,
                                 std::chrono::milliseconds wait_budget, uint8_t* code,
                                 ReadRest read_rest) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string context = "tcp store " + address_ + ": " + what;
  if (broken_) return Status::Error(context + ": the connection failed earlier");
  Status s = sio::write_all(fd_, request.data(), request.size(), Clock::now() + kMessageGrace);
  if (s.ok()) {
    // The server may block up to wait_budget before it replies (GET / WAIT).
    const auto deadline = deadline_after(wait_budget) + kMessageGrace;
    s = read_pod(fd_, code, deadline);
    if (s.ok() && *code == kBadRequest) s = Status::Error("the server rejected the request");
    if (s.ok() && *code == kUnauthorized)
      s = Status::Error(
          "the store refused the connection: its token is missing or wrong (the stores of a "
          "`miles run` job take the run's MILES_RUN_TOKEN; give this process the same one)");
    if (s.ok()) s = read_rest(fd_, deadline);
  }
  if (!s.ok()) {
    broken_ = true;
    return s.with_context(context);
  }
  return Status::Ok();
}

Status TcpStoreClient::set(const std::string& key, const std::string& value) {
  if (key.size() > kMaxKeyBytes || value.size() > kMaxValueBytes) {
    return Status::Error("tcp store: set \"" + key + "\": key or value too large");
  }
  std::string req;
  put<uint8_t>(req, kSet);
  put_str(req, key);
  put_str(req, value);
  uint8_t code = 0;
  return roundtrip("set \"" + key + "\"", req, {}, &code,
                   [](int, Clock::time_point) { return Status::Ok(); });
}

Result<std::string> TcpStoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::string req;
  put<uint8_t>(req, kGet);
  put_str(req, key);
  put<uint64_t>(req, static_cast<uint64_t>(std::max<int64_t>(0, timeout.count())));
  uint8_t code = 0;
  std::string value;
  MILES_RETURN_IF_ERROR(roundtrip("get \"" + key + "\"", req, timeout, &code,
                                  [&](int fd, Clock::time_point deadline) {
                                    if (code != kOk) return Status::Ok();
                                    return get_str(fd, &value, kMaxValueBytes, deadline);
                                  }));
  if (code == kTimeout) {
    return Status::Error("tcp store " + address_ + ": key \"" + key + "\" did not appear within " +
                         std::to_string(timeout.count()) + " ms");
  }
  return value;
}

Status TcpStoreClient::wait(const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) {
  std::string req;
  put<uint8_t>(req, kWait);
  put_keys(req, keys);
  put<uint64_t>(req, static_cast<uint64_t>(std::max<int64_t>(0, timeout.count())));
  uint8_t code = 0;
  std::vector<std::string> missing;
  MILES_RETURN_IF_ERROR(
      roundtrip("wait", req, timeout, &code, [&](int fd, Clock::time_point deadline) {
        if (code != kTimeout) return Status::Ok();
        return get_keys(fd, &missing, deadline);
      }));
  if (code == kTimeout) {
    return Status::Error("tcp store " + address_ + ": keys still missing after " +
                         std::to_string(timeout.count()) + " ms: " + join_keys(missing));
  }
  return Status::Ok();
}

Result<int64_t> TcpStoreClient::add(const std::string& key, int64_t delta) {
  std::string req;
  put<uint8_t>(req, kAdd);
  put_str(req, key);
  put<int64_t>(req, delta);
  uint8_t code = 0;
  int64_t value = 0;
  MILES_RETURN_IF_ERROR(roundtrip(
      "add \"" + key + "\"", req, {}, &code,
      [&](int fd, Clock::time_point deadline) { return read_pod(fd, &value, deadline); }));
  return value;
}

Result<bool> TcpStoreClient::check(const std::vector<std::string>& keys) {
  std::string req;
  put<uint8_t>(req, kCheck);
  put_keys(req, keys);
  uint8_t code = 0, present = 0;
  MILES_RETURN_IF_ERROR(roundtrip("check", req, {}, &code, [&](int fd, Clock::time_point deadline) {
    return read_pod(fd, &present, deadline);
  }));
  return present != 0;
}

Result<bool> TcpStoreClient::remove(const std::string& key) {
  std::string req;
  put<uint8_t>(req, kDelete);
  put_str(req, key);
  uint8_t code = 0, existed = 0;
  MILES_RETURN_IF_ERROR(roundtrip(
      "delete \"" + key + "\"", req, {}, &code,
      [&](int fd, Clock::time_point deadline) { return read_pod(fd, &existed, deadline); }));
  return existed != 0;
}

}  // namespace miles
