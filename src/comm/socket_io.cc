// Deadline-bounded TCP helpers: getaddrinfo, non-blocking connect with retries, poll-guarded I/O.
#include "socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

#include "miles/host_port.h"

namespace miles::comm::detail {

namespace {

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

std::string errno_text(int err) { return std::strerror(err); }

// Waits until `fd` is ready for `events`; an error when the deadline passes.
Status poll_fd(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int timeout_ms = ms_until(deadline);
    const int n = ::poll(&p, 1, timeout_ms);
    if (n > 0) return Status::Ok();  // readable / writable / error: the next syscall tells which
    if (n == 0) return Status::Error(std::string("timed out waiting to ") + what);
    if (errno != EINTR) return Status::Error(std::string("poll: ") + errno_text(errno));
  }
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

Status resolve(const HostPort& hp, bool passive, AddrInfo* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string port = std::to_string(hp.port);
  const int rc =
      getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), port.c_str(), &hints, &out->list);
  if (rc != 0) {
    return Status::Error("cannot resolve " + hp.to_string() + ": " + gai_strerror(rc));
  }
  return Status::Ok();
}

// One non-blocking connect attempt bounded by `deadline`; returns the fd or -1 with *err set.
int try_connect(const addrinfo* ai, Clock::time_point deadline, int* err) {
  const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = ::poll(&p, 1, std::max(1, ms_until(deadline)));
    if (rc == 1) {
      int so_error = 0;
      socklen_t len = sizeof(so_error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
      rc = so_error == 0 ? 0 : -1;
      errno = so_error;
    } else {
      rc = -1;
      errno = ETIMEDOUT;
    }
  }
  if (rc != 0) {
    *err = errno;
    ::close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, flags);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

std::string HostPort::to_string() const { return host_port(host, port); }

Result<HostPort> parse_host_port(std::string_view address) {
  const auto bad = [&](const std::string& why) {
    return Status::Error("address \"" + std::string(address) + "\": " + why +
                         " (expected host:port)");
  };
  HostPort hp;
  std::string_view port_text;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return bad("unterminated [ipv6] host");
    }
    hp.host = std::string(address.substr(1, close - 1));
    port_text = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    hp.host = std::string(address.substr(0, colon));
    port_text = address.substr(colon + 1);
    if (hp.host.find(':') != std::string::npos) return bad("IPv6 hosts need brackets");
  }
  if (hp.host.empty()) return bad("empty host");
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), hp.port);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
      hp.port < 0 || hp.port > 65535) {
    return bad("port \"" + std::string(port_text) + "\" is not in [0, 65535]");
  }
  return hp;
}

Result<int> connect_tcp(const HostPort& peer, Clock::time_point deadline) {
  AddrInfo ai;
  MILES_RETURN_IF_ERROR(resolve(peer, /*passive=*/false, &ai));
  int last_err = 0;
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    for (const addrinfo* p = ai.list; p != nullptr; p = p->ai_next) {
      const int fd = try_connect(p, deadline, &last_err);
      if (fd >= 0) return fd;
    }
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(250));
  }
  return Status::Error("cannot connect to " + peer.to_string() +
                       " before the timeout (last error: " + errno_text(last_err) + ")");
}

Result<int> listen_tcp(const HostPort& where, int backlog) {
  AddrInfo ai;
  MILES_RETURN_IF_ERROR(resolve(where, /*passive=*/true, &ai));
  int last_err = 0;
  for (const addrinfo* p = ai.list; p != nullptr; p = p->ai_next) {
    const int fd = ::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
    if (fd < 0) {
      last_err = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, p->ai_addr, p->ai_addrlen) == 0 && ::listen(fd, backlog) == 0) return fd;
    last_err = errno;
    ::close(fd);
  }
  return Status::Error("cannot listen on " + where.to_string() + ": " + errno_text(last_err));
}

int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return -1;
}

Status write_all(int fd, const void* data, size_t bytes, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    MILES_RETURN_IF_ERROR(poll_fd(fd, POLLOUT, deadline, "send"));
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Status::Error("send: " + errno_text(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status read_all(int fd, void* data, size_t bytes, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    MILES_RETURN_IF_ERROR(poll_fd(fd, POLLIN, deadline, "receive"));
    const ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n == 0) return Status::Error("connection closed by the peer");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Status::Error("recv: " + errno_text(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

void close_fd(int fd) {
  if (fd >= 0) ::close(fd);
}

}  // namespace miles::comm::detail
