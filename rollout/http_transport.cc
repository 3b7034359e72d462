// Bounded connections for the engine's HTTP server (see http_transport.h): a task queue that gives
// each connection its own thread, a per-connection loop that caps open connections and arms a
// deadline per request, and streams (plain and TLS) that honour that deadline on every read.
#include "miles/rollout/http_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

namespace miles::rollout {
namespace {

using Clock = std::chrono::steady_clock;

// One thread per task (a task is one connection), so that a slow connection never holds up
// another; the cap on connections lives in the connection loop, which can answer the one refused.
class ThreadPerConnection : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++running_;
    }
    try {
      std::thread([this, fn = std::move(fn)] {
        fn();
        finished();
      }).detach();
    } catch (const std::system_error& e) {  // no thread to be had: serve (and close) it here
      spdlog::warn("http: cannot start a connection thread ({}); serving it on the acceptor",
                   e.what());
      fn();
      finished();
    }
  }
  void shutdown() override {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return running_ == 0; });
  }

 private:
  void finished() {
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    done_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable done_;
  int running_ = 0;
};

std::string address_of(const sockaddr_storage& addr, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
    *port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    *port = ntohs(a->sin6_port);
  }
  return text;
}

// Waits until `fd` is ready for `events`, at most until `until`, in slices so that a stopping
// server is noticed. False on timeout, error, or stop.
bool wait_fd(int fd, short events, Clock::time_point until, const std::function<bool()>& stopping) {
  for (;;) {
    // Rounded up: a timeout means `until` has passed, never that it is less than 1 ms away.
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0 || (stopping && stopping())) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 200)));
    if (r > 0) return (p.revents & (events | POLLHUP | POLLERR)) != 0;
    if (r < 0 && errno != EINTR) return false;
  }
}

// A connection's byte stream with a deadline for the request being read. Reads are buffered
// (httplib reads the request line and headers a byte at a time).
class Connection : public httplib::Stream {
 public:
  Connection(int fd, Clock::duration io_timeout, TransportCounters* counters)
      : fd_(fd), io_timeout_(io_timeout), counters_(counters) {}

  void set_deadline(Clock::time_point t) {
    deadline_ = t;
    expired_ = false;
  }
  void clear_deadline() { deadline_ = Clock::time_point::max(); }
  bool expired() const { return expired_; }

  // Before closing on our own decision (an early reply, a timeout): stops sending, then reads and
  // discards what the client still sends, for at most `time` or `bytes`, so that closing with
  // unread input does not reset the connection before the client has read the reply.
  void linger(Clock::duration time, size_t bytes) {
    end_writes();
    const auto until = Clock::now() + time;
    char sink[16384];
    for (size_t got = 0; got < bytes && wait_fd(fd_, POLLIN, until, nullptr);) {
      const ssize_t n = ::recv(fd_, sink, sizeof sink, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
      if (n > 0) got += static_cast<size_t>(n);
    }
  }

  // Keep-alive: whether another request starts within `idle`.
  bool wait_request(Clock::duration idle, const std::function<bool()>& stopping) {
    return buffered() > 0 || pending() || wait_fd(fd_, POLLIN, Clock::now() + idle, stopping);
  }

  bool is_readable() const override {
    return buffered() > 0 || pending() || wait_fd(fd_, POLLIN, read_until(), nullptr);
  }
  bool is_writable() const override {
    return wait_fd(fd_, POLLOUT, Clock::now() + io_timeout_, nullptr) && peer_alive();
  }
  ssize_t read(char* ptr, size_t size) override {
    if (buffered() == 0) {
      begin_ = end_ = 0;
      const ssize_t n = fill(buf_, sizeof buf_);
      if (n <= 0) return n < 0 ? -1 : 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, buffered());
    std::memcpy(ptr, buf_ + begin_, n);
    begin_ += n;
    return static_cast<ssize_t>(n);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    port = 0;
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      ip = address_of(addr, &port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    port = 0;
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      ip = address_of(addr, &port);
  }
  ::socket_t socket() const override { return fd_; }

 protected:
  // Reads up to `size` bytes once some are available, by the deadline: > 0, 0 at end of stream,
  // -1 on error or timeout.
  virtual ssize_t fill(char* ptr, size_t size) = 0;
  // Bytes the transport holds that the socket no longer shows (TLS records already decrypted).
  virtual bool pending() const { return false; }
  // Tells the client nothing more will come.
  virtual void end_writes() { ::shutdown(fd_, SHUT_WR); }

  // The earlier of the request's deadline and one I/O timeout from now; counts the request as
  // timed out when its deadline is what ran out.
  Clock::time_point read_until() const {
    const auto io = Clock::now() + io_timeout_;
    return std::min(io, deadline_);
  }
  bool deadline_passed() {
    if (Clock::now() < deadline_) return false;
    if (!expired_ && counters_) ++counters_->timed_out;
    expired_ = true;
    return true;
  }
  bool peer_alive() const {
    char c;
    const ssize_t r = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
  }

  int fd_;
  Clock::duration io_timeout_;

 private:
  size_t buffered() const { return end_ - begin_; }

  TransportCounters* counters_;
  Clock::time_point deadline_ = Clock::time_point::max();
  bool expired_ = false;
  char buf_[4096];
  size_t begin_ = 0, end_ = 0;
};

class PlainConnection : public Connection {
 public:
  using Connection::Connection;
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    return ::send(fd_, ptr, size, MSG_NOSIGNAL);
  }

 private:
  ssize_t fill(char* ptr, size_t size) override {
    for (;;) {
      if (deadline_passed()) return -1;
      if (!wait_fd(fd_, POLLIN, read_until(), nullptr)) {
        deadline_passed();  // counts it when the deadline (not one read's timeout) ran out
        return -1;
      }
      const ssize_t n = ::recv(fd_, ptr, size, 0);
      if (n >= 0) return n;
      if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    }
  }
};

// TLS over a non-blocking socket, so that no SSL call can block past a deadline.
class TlsConnection : public Connection {
 public:
  TlsConnection(int fd, SSL* ssl, Clock::duration io_timeout, TransportCounters* counters)
      : Connection(fd, io_timeout, counters), ssl_(ssl) {}
  ~TlsConnection() override {
    if (handshaken_) SSL_shutdown(ssl_);  // best effort close_notify; never waits
    SSL_free(ssl_);
  }

  // The handshake, by `until`.
  bool accept(Clock::time_point until) {
    for (;;) {
      ERR_clear_error();
      const int r = SSL_accept(ssl_);
      if (r == 1) return handshaken_ = true;
      if (!wait_for(SSL_get_error(ssl_, r), until)) return false;
    }
  }
  SSL* ssl() const { return ssl_; }

  ssize_t write(const char* ptr, size_t size) override {
    if (size == 0) return 0;
    if (!peer_alive()) return -1;
    const auto until = Clock::now() + io_timeout_;
    const int len = static_cast<int>(std::min<size_t>(size, 1 << 30));
    for (;;) {
      ERR_clear_error();
      const int r = SSL_write(ssl_, ptr, len);
      if (r > 0) return r;
      if (!wait_for(SSL_get_error(ssl_, r), until)) return -1;
    }
  }

 private:
  bool pending() const override { return SSL_pending(ssl_) > 0; }
  void end_writes() override {
    if (handshaken_) SSL_shutdown(ssl_);  // close_notify (non-blocking: never waits)
    handshaken_ = false;
  }
  ssize_t fill(char* ptr, size_t size) override {
    const int len = static_cast<int>(std::min<size_t>(size, 1 << 30));
    for (;;) {
      if (deadline_passed()) return -1;
      ERR_clear_error();
      const int r = SSL_read(ssl_, ptr, len);
      if (r > 0) return r;
      const int err = SSL_get_error(ssl_, r);
      if (err == SSL_ERROR_ZERO_RETURN) return 0;
      if (!wait_for(err, read_until())) {
        deadline_passed();
        return -1;
      }
    }
  }
  // Waits for what OpenSSL asked for; false on any other error or at `until`.
  bool wait_for(int ssl_error, Clock::time_point until) const {
    if (ssl_error == SSL_ERROR_WANT_READ) return wait_fd(fd_, POLLIN, until, nullptr);
    if (ssl_error == SSL_ERROR_WANT_WRITE) return wait_fd(fd_, POLLOUT, until, nullptr);
    return false;
  }

  SSL* ssl_;
  bool handshaken_ = false;
};

thread_local Connection* t_connection = nullptr;
thread_local Clock::duration t_body_timeout{};
thread_local bool t_close_after = false;

// A refused connection learns why before it is closed (plain HTTP only: a TLS client would read
// the text as a broken record).
void refuse(int fd) {
  const std::string body =
      R"({"error":{"message":"the server has too many open connections; retry shortly",)"
      R"("type":"server_error","code":503}})";
  const std::string reply =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
      "Connection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// httplib's server with its per-connection loop replaced (the loop is a private virtual of
// httplib::Server; overriding it is the library's own extension point, used by its SSLServer).
template <class Base>
class BoundedServer : public Base {
 public:
  template <class... Args>
  BoundedServer(const ConnectionLimits& limits, TransportCounters* counters, Args&&... args)
      : Base(std::forward<Args>(args)...), limits_(limits), counters_(counters) {
    this->new_task_queue = [] { return new ThreadPerConnection; };
  }

 private:
  bool process_and_close_socket(::socket_t sock) override {
    const int64_t open = ++counters_->open;
    bool ret = false;
    if (limits_.max_connections > 0 && open > limits_.max_connections) {
      ++counters_->refused;
      if constexpr (!std::is_same_v<Base, httplib::SSLServer>) refuse(sock);
    } else {
      ret = serve(sock);
    }
    --counters_->open;
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ret;
  }

  bool serve(int sock) {
    const auto io = seconds(static_cast<double>(this->read_timeout_sec_) +
                            static_cast<double>(this->read_timeout_usec_) * 1e-6);
    std::unique_ptr<Connection> conn;
    std::function<void(httplib::Request&)> setup;
    if constexpr (std::is_same_v<Base, httplib::SSLServer>) {
      SSL* ssl = SSL_new(this->ssl_context());
      if (!ssl) return false;
      ::fcntl(sock, F_SETFL, ::fcntl(sock, F_GETFL) | O_NONBLOCK);
      SSL_set_fd(ssl, sock);
      auto tls = std::make_unique<TlsConnection>(sock, ssl, io, counters_);
      if (!tls->accept(Clock::now() + seconds(limits_.header_timeout_s))) return false;
      setup = [ssl](httplib::Request& req) { req.ssl = ssl; };
      conn = std::move(tls);
    } else {
      conn = std::make_unique<PlainConnection>(sock, io, counters_);
    }
    const auto stopping = [this] { return this->svr_sock_ == INVALID_SOCKET; };
    const auto idle = std::chrono::seconds(this->keep_alive_timeout_sec_);
    bool ret = false;
    for (size_t left = this->keep_alive_max_count_; left > 0; --left) {
      if (!conn->wait_request(idle, stopping)) break;
      conn->set_deadline(Clock::now() + seconds(limits_.header_timeout_s));
      t_connection = conn.get();
      t_body_timeout = seconds(limits_.body_timeout_s);
      t_close_after = false;
      bool connection_closed = false;
      ret = this->process_request(*conn, left == 1, connection_closed, setup);
      t_connection = nullptr;
      conn->clear_deadline();
      if (conn->expired() || t_close_after) {
        conn->linger(std::chrono::milliseconds(500), size_t{8} << 20);
        break;
      }
      if (!ret || connection_closed) break;
    }
    return ret;
  }

  ConnectionLimits limits_;
  TransportCounters* counters_;
};

}  // namespace

std::unique_ptr<httplib::Server> make_bounded_server(const ConnectionLimits& limits,
                                                     const std::string& certfile,
                                                     const std::string& keyfile,
                                                     TransportCounters* counters) {
  if (certfile.empty()) return std::make_unique<BoundedServer<httplib::Server>>(limits, counters);
  return std::make_unique<BoundedServer<httplib::SSLServer>>(limits, counters, certfile.c_str(),
                                                             keyfile.c_str());
}

void request_headers_received() {
  if (t_connection) t_connection->set_deadline(Clock::now() + t_body_timeout);
}

void close_after_response() { t_close_after = true; }

bool request_timed_out() { return t_connection && t_connection->expired(); }

}  // namespace miles::rollout
