// Multi-process test harness: runs one forked child per rank and collects what each one reports.
//
// Why: communicators are tested between real processes over loopback sockets, and a failing test
// must not leave processes behind or hang. Children are forked from the (single-threaded) gtest
// process before they start any thread, die with the parent (PR_SET_PDEATHSIG), report through a
// pipe, and are killed when they overrun the deadline. A child never runs gtest assertions: it
// returns a string of "key=value" lines that the parent checks.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "miles/tcp_store.h"

namespace miles::testing {

struct ChildResult {
  bool exited = false;     // exited normally (else killed by a signal or by the harness)
  int exit_code = -1;      // when exited
  int term_signal = 0;     // when killed
  bool timed_out = false;  // killed by the harness at the deadline
  std::string output;      // what body(rank) returned
  // "key=value" lines of output.
  std::map<std::string, std::string> fields() const {
    std::map<std::string, std::string> m;
    std::istringstream in(output);
    std::string line;
    while (std::getline(in, line)) {
      const size_t eq = line.find('=');
      if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return m;
  }
  std::string describe() const {
    std::string s =
        exited ? "exit " + std::to_string(exit_code) : "signal " + std::to_string(term_signal);
    if (timed_out) s += " (timed out)";
    return s + ", output:\n" + output;
  }
};

namespace detail {

inline void write_fully(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    off += static_cast<size_t>(n);
  }
}

// In the child: never returns.
[[noreturn]] inline void run_child(int rank, int write_fd,
                                   const std::function<std::string(int)>& body) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::string out;
  try {
    out = body(rank);
  } catch (const std::exception& e) {
    out = "exception=" + std::string(e.what()) + "\n";
  }
  write_fully(write_fd, out);
  ::close(write_fd);
  _exit(0);  // skip gtest's and the parent's atexit handlers
}

}  // namespace detail

// Runs body(rank) for rank in [0, n) in n child processes; waits until all have exited or
// `deadline` passed (then kills the rest). Always reaps every child.
inline std::vector<ChildResult> run_processes(int n, const std::function<std::string(int)>& body,
                                              std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  std::vector<ChildResult> results(n);
  std::vector<pid_t> pids(n, -1);
  std::vector<int> fds(n, -1);
  std::fflush(nullptr);  // no buffered output duplicated into the children
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (::pipe(p) != 0) break;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      detail::run_child(r, p[1], body);
    }
    ::close(p[1]);
    if (pid < 0) {
      ::close(p[0]);
      break;
    }
    pids[r] = pid;
    fds[r] = p[0];
  }
  // Drain the pipes until every child closed its end or the deadline passes.
  for (;;) {
    std::vector<pollfd> polls;
    std::vector<int> owners;
    for (int r = 0; r < n; ++r) {
      if (fds[r] >= 0) {
        polls.push_back({fds[r], POLLIN, 0});
        owners.push_back(r);
      }
    }
    if (polls.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (::poll(polls.data(), polls.size(), static_cast<int>(left.count())) <= 0) continue;
    for (size_t i = 0; i < polls.size(); ++i) {
      if (!polls[i].revents) continue;
      const int r = owners[i];
      char buf[4096];
      const ssize_t got = ::read(fds[r], buf, sizeof(buf));
      if (got > 0) {
        results[r].output.append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        ::close(fds[r]);
        fds[r] = -1;
      }
    }
  }
  // Reap; whoever is still running at the deadline is killed.
  for (int r = 0; r < n; ++r) {
    if (fds[r] >= 0) ::close(fds[r]);
    if (pids[r] < 0) continue;
    int status = 0;
    pid_t done = 0;
    while ((done = ::waitpid(pids[r], &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (done == 0) {
      ::kill(pids[r], SIGKILL);
      ::waitpid(pids[r], &status, 0);
      results[r].timed_out = true;
    }
    results[r].exited = WIFEXITED(status);
    results[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    results[r].term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }
  return results;
}

// A TcpStoreServer on 127.0.0.1 in a child process (so that the test process itself never has
// threads when it forks ranks); the parent learns the port through a pipe. Killed and reaped by the
// destructor.
class StoreProcess {
 public:
  StoreProcess() {
    int p[2];
    if (::pipe(p) != 0) return;
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::close(p[0]);
      auto server = TcpStoreServer::start({});
      const int port = server.ok() ? (*server)->port() : -1;
      detail::write_fully(p[1], std::string(reinterpret_cast<const char*>(&port), sizeof(port)));
      ::close(p[1]);
      for (;;) ::pause();  // until killed
    }
    ::close(p[1]);
    int port = -1;
    if (pid_ > 0 && ::read(p[0], &port, sizeof(port)) == sizeof(port)) port_ = port;
    ::close(p[0]);
  }
  ~StoreProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  StoreProcess(const StoreProcess&) = delete;
  StoreProcess& operator=(const StoreProcess&) = delete;

  bool ok() const { return port_ > 0; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  int port_ = -1;
};

// Hex of raw bytes, to compare floats bit for bit across processes.
inline std::string to_hex(const void* data, size_t bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    s += kDigits[p[i] >> 4];
    s += kDigits[p[i] & 15];
  }
  return s;
}

template <typename T>
std::vector<T> from_hex(const std::string& s) {
  std::vector<unsigned char> bytes(s.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<unsigned char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  }
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

template <typename T>
std::string to_hex(const std::vector<T>& v) {
  return to_hex(v.data(), v.size() * sizeof(T));
}

}  // namespace miles::testing
