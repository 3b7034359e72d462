// LineProcess (line_process.h): /bin/sh -c over a socket pair (started by spawn_process, the one
// spawner), line exchanges bounded by poll() deadlines, and a kill-and-reap destructor.
#include "controller/line_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <sstream>
#include <thread>

#include "controller/reward_internal.h"
#include "miles/controller/child_process.h"

namespace miles::reward {
namespace {

using controller::SpawnOptions;

using Clock = std::chrono::steady_clock;

// A reply line longer than this is garbage, not a score.
constexpr size_t kMaxLineBytes = size_t{1} << 20;

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Milliseconds until `deadline`, rounded up (a poll never spins on a sub-millisecond rest).
int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
}

// Waits until `fd` has `events` or `deadline` passes: the revents, 0 on timeout, -1 on error.
int wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, ms_left(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r;
    return p.revents;
  }
}

std::string timeout_text(double timeout_s) {
  std::ostringstream os;
  os << "no reply within " << timeout_s << " s";
  return os.str();
}

}  // namespace

Result<std::unique_ptr<LineProcess>> LineProcess::spawn(const std::string& command) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return Status::Error(errno_text("socketpair"));
  }
  // The child: stdin and stdout on its end of the pair, stderr ours, its own process group.
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", command};
  o.stdin_fd = o.stdout_fd = fds[1];
  o.own_process_group = true;
  Result<pid_t> pid = controller::spawn_process(o);
  close(fds[1]);
  if (!pid.ok()) {
    close(fds[0]);
    return pid.status();
  }
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return std::unique_ptr<LineProcess>(new LineProcess(*pid, fds[0]));
}

LineProcess::~LineProcess() {
  close(fd_);
  // The child is not reaped yet (describe_exit only peeks), so its pid still names its group.
  kill(-pid_, SIGKILL);
  while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

std::string LineProcess::describe_exit() {
  // The child may still be on its way out when its socket closes: peek (WNOWAIT) for a moment.
  auto until = Clock::now() + std::chrono::milliseconds(200);
  for (;;) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid_) {
      if (info.si_code == CLD_EXITED) return "exited with status " + std::to_string(info.si_status);
      const char* name = sigabbrev_np(info.si_status);  // thread-safe, unlike strsignal
      return "was killed by signal " + std::to_string(info.si_status) +
             (name ? std::string(" (SIG") + name + ")" : std::string());
    }
    if (Clock::now() >= until) return "closed its output";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

Result<bool> LineProcess::check_idle() {
  for (;;) {
    char chunk[4096];
    ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
    if (n > 0) {
      buffer_.append(chunk, static_cast<size_t>(n));
      if (buffer_.size() > kMaxLineBytes) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (!buffer_.empty()) break;
    return false;  // EOF or reset with nothing said: it exited between requests
  }
  if (buffer_.empty()) return true;
  return Status::Error("the command wrote output that answers no request: '" + excerpt(buffer_) +
                       "'");
}

Result<std::string> LineProcess::exchange(std::string_view line, double timeout_s) {
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(bounded_timeout(timeout_s)));
  std::string data(line);
  data += '\n';
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int r = wait_for(fd_, POLLOUT, deadline);
      if (r == 0) return Status::Error(timeout_text(timeout_s) + " (it is not reading its input)");
      if (r < 0) return Status::Error(errno_text("poll"));
      continue;  // writable, or an error that the next send reports
    }
    return Status::Error("the command stopped reading its input: it " + describe_exit());
  }
  for (;;) {
    size_t newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string reply = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      if (!reply.empty() && reply.back() == '\r') reply.pop_back();
      return reply;
    }
    if (buffer_.size() > kMaxLineBytes) {
      return Status::Error("the command wrote a line longer than " + std::to_string(kMaxLineBytes) +
                           " bytes");
    }
    char chunk[4096];
    ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
    if (n > 0) {
      buffer_.append(chunk, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int r = wait_for(fd_, POLLIN, deadline);
      if (r == 0) return Status::Error(timeout_text(timeout_s));
      if (r < 0) return Status::Error(errno_text("poll"));
      continue;
    }
    if (n == 0 || errno == ECONNRESET) {
      return Status::Error("the command " + describe_exit() + " before replying");
    }
    return Status::Error(errno_text("recv"));
  }
}

}  // namespace miles::reward
