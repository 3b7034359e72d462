// The one spawner (include/miles/controller/child_process.h): a `miles` child dies with its parent
// even when the parent is killed outright; a child gets exactly the descriptors asked for (stdin
// /dev/null by default, nothing of ours leaked), its own process group when asked, and the
// parent-death variable only when it is to die with us.
#include "miles/controller/child_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "cli_run.h"

namespace miles::controller {
namespace {

// Runs `script` with /bin/sh as a spawn_process child (stdout to a pipe); its output.
std::string output_of(const std::string& script, SpawnOptions o = {}) {
  int out[2];
  EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
  o.argv = {"/bin/sh", "-c", script};
  o.stdout_fd = out[1];
  Result<pid_t> pid = spawn_process(o);
  close(out[1]);
  EXPECT_TRUE(pid.ok()) << pid.message();
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<size_t>(n));
  close(out[0]);
  if (pid.ok()) waitpid(*pid, nullptr, 0);
  return text;
}

// Gone, or a zombie nobody reaps (a container's init may not).
bool dead(pid_t pid) {
  if (kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  stat >> pid_field >> comm >> state;
  return state == "Z" || state == "X";
}

TEST(ChildProcess, MilesChildDiesWhenItsParentIsKilled) {
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t parent = fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {  // the parent to be killed: starts a long-lived miles child, says its pid
    close(report[0]);
    ::setenv("MILES_RUN_TOKEN", "child-process-test", 1);
    // Asks a controller that is not there for a trainer seat for a minute.
    auto child = ChildProcess::spawn({test::miles_binary(), "train-worker", "--controller",
                                      "127.0.0.1:9", "--join-timeout", "60"},
                                     "/dev/null");
    const pid_t pid = child.ok() ? child->pid() : -1;
    if (write(report[1], &pid, sizeof pid) != sizeof pid) _exit(2);
    for (;;) pause();
  }
  close(report[1]);
  pid_t child = -1;
  ASSERT_EQ(read(report[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  close(report[0]);
  ASSERT_GT(child, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it is running main()
  EXPECT_FALSE(dead(child));
  kill(parent, SIGKILL);
  waitpid(parent, nullptr, 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!dead(child) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(dead(child)) << "pid " << child << " outlived its parent";
  if (!dead(child)) kill(child, SIGKILL);
}

TEST(ChildProcess, ChildGetsOnlyTheDescriptorsAskedFor) {
  // Not close-on-exec, at numbers the shell does not use: a careless spawner would pass them on.
  int leak[2];
  ASSERT_EQ(pipe(leak), 0);
  ASSERT_EQ(dup2(leak[0], 100), 100);
  ASSERT_EQ(dup2(leak[1], 101), 101);
  const std::string fds = output_of(
      "for f in /proc/$$/fd/*; do printf '%s ' \"${f##*/}\"; done; readlink /proc/$$/fd/0");
  for (int fd : {leak[0], leak[1], 100, 101}) close(fd);
  // The shell's own: 0, 1, 2, and the directory it lists while globbing.
  EXPECT_TRUE(fds == "0 1 2 /dev/null\n" || fds == "0 1 2 3 /dev/null\n") << fds;
}

TEST(ChildProcess, ProcessGroupAndParentPidVariableOnlyWhenAsked) {
  const std::string group_and_pid = "echo $(cut -d' ' -f5 /proc/$$/stat) $$";
  SpawnOptions own;
  own.own_process_group = true;
  const std::string mine = output_of(group_and_pid, own);
  const size_t space = mine.find(' ');
  ASSERT_NE(space, std::string::npos) << mine;
  EXPECT_EQ(mine.substr(0, space) + "\n", mine.substr(space + 1)) << "its own group: pgid = pid";
  const std::string shared = output_of(group_and_pid);
  EXPECT_EQ(shared.substr(0, shared.find(' ')), std::to_string(getpgrp())) << shared;

  // An inherited MILES_PARENT_PID is never passed on; ours only to a child that dies with us.
  ::setenv("MILES_PARENT_PID", "12345", 1);
  EXPECT_EQ(output_of("echo ${MILES_PARENT_PID:-none}"), "none\n");
  SpawnOptions dies;
  dies.die_with_parent = true;
  EXPECT_EQ(output_of("echo ${MILES_PARENT_PID:-none}", dies), std::to_string(getpid()) + "\n");
  ::unsetenv("MILES_PARENT_PID");
}

}  // namespace
}  // namespace miles::controller
