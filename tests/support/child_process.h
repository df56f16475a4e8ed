#pragma once
// Header-only helpers for unit tests that run a built binary as a child process (the rose binary
// tests): its path under $GARDEN_BUILD_DIR, a process-unique shm name, fork+exec and a bounded
// wait. Integration tests have the fuller harness in tests/integration/support/harness.h.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace garden::testing {

// $GARDEN_BUILD_DIR/<rel> (ctest sets it; "." otherwise).
inline std::string builtBinary(const std::string& rel) {
  const char* b = std::getenv("GARDEN_BUILD_DIR");
  return std::string(b ? b : ".") + "/" + rel;
}

// "<prefix><tag>-<pid>-<n>": a shm name no other test process or call uses.
inline std::string uniqueShmName(const std::string& prefix, const char* tag) {
  static std::atomic<int> n{0};
  return prefix + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

// Every child spawnChild started, killed (SIGKILL) and reaped when the test process exits if it
// is still running: a test that fails an ASSERT before stopping its child would otherwise leave
// it holding the test's stdout, and ctest waits for that pipe until its timeout.
class ChildReaper {
 public:
  static ChildReaper& get() {
    static ChildReaper r;
    return r;
  }
  void add(pid_t pid) {
    std::lock_guard<std::mutex> l(mu_);
    pids_.push_back(pid);
  }
  ~ChildReaper() {
    for (pid_t pid : pids_) {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == 0) {  // still running and ours
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
      }
    }
  }

 private:
  std::mutex mu_;
  std::vector<pid_t> pids_;
};

// fork + execv(args[0], args); the child exits 127 when exec fails.
inline pid_t spawnChild(const std::vector<std::string>& args) {
  ChildReaper& reaper = ChildReaper::get();  // constructed before the child exists
  pid_t pid = fork();
  if (pid > 0) reaper.add(pid);
  if (pid == 0) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Waits for `pid` to exit; returns its wait status, or -1 after the timeout.
inline int waitChildExit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

}  // namespace garden::testing
