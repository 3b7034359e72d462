// LineProcess: a child `/bin/sh -c COMMAND` that answers one line on stdout for each line written
// to its stdin, every exchange bounded by a timeout.
//
// Why: the command reward keeps one external grader alive across samples. A grader may crash, hang
// or stop reading; none of that may hang or kill the caller. The child's stdin and stdout are one
// end of a Unix socket pair (so writes use MSG_NOSIGNAL: no SIGPIPE, without touching the process's
// signal dispositions), it runs in its own process group (a timeout kills its children too), and
// the destructor kills and reaps it (no zombies).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <string_view>

#include "miles/status.h"

namespace miles::reward {

class LineProcess {
 public:
  // Starts the command. A command that cannot run shows later, as sh exiting with status 127.
  static Result<std::unique_ptr<LineProcess>> spawn(const std::string& command);
  ~LineProcess();  // kills the process group, reaps the child
  LineProcess(const LineProcess&) = delete;
  LineProcess& operator=(const LineProcess&) = delete;

  // Writes `line` and a newline, then reads one line back (without its newline), all within
  // `timeout_s`. An error (timeout, exit, closed pipe, over-long line) leaves the process unusable:
  // destroy it and spawn another.
  Result<std::string> exchange(std::string_view line, double timeout_s);

  // Before a request: reads whatever the child wrote unasked. true: alive and quiet; false: it has
  // exited or closed its output (spawn another); an error: it wrote lines nobody asked for (its
  // replies may be out of step).
  Result<bool> check_idle();

  pid_t pid() const { return pid_; }

 private:
  LineProcess(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  // Why the child stopped talking: its exit status if it exits within a moment.
  std::string describe_exit();

  pid_t pid_;
  int fd_;
  std::string buffer_;  // bytes read past the last reply line
};

}  // namespace miles::reward
