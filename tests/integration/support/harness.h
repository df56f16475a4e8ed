#pragma once
// Integration-test support: real processes on real ports, and a small blocking HTTP/1.1 client.
// Used only by tests (single-threaded unless stated).

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace garden::testing {

// Repository and build paths from the environment ctest sets (GARDEN_SOURCE_DIR/GARDEN_BUILD_DIR).
std::string sourceDir();
std::string buildDir();
std::string binary(const std::string& rel);  // buildDir() + "/" + rel

// A fresh temporary directory, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A port that was free a moment ago: random below the ephemeral range, bound and released
// (harness.cc says why), never the same twice from one process.
int freePort();

// The argv every integration test's tulip starts with: listening on 127.0.0.1:`port`, metrics on
// `metrics_port`, serving `model` through the worker binary `binary(worker_rel)` (e.g.
// "services/rose/rose" or "tests/fakes/fake-rose") over the shm name
// "/garden-<shm_tag>-<pid>-<port>" (unique per process and port). Tests append their own flags.
std::vector<std::string> tulipArgv(int port, int metrics_port, const std::string& model,
                                   const std::string& worker_rel, const std::string& shm_tag);

// A child process whose stdout+stderr go to `log_path`. The destructor sends SIGTERM, waits up to
// 5 s, then SIGKILLs.
class Process {
 public:
  Process(std::vector<std::string> argv, std::string log_path);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool alive();
  // Sends `sig`; for SIGTERM/SIGKILL waits for exit (up to `wait`) and returns the wait status.
  int signal(int sig, std::chrono::milliseconds wait = std::chrono::milliseconds(5000));
  std::string log() const;
  const std::string& logPath() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
  std::string log_path_;
};

// Holds process `pid` stopped (SIGSTOP) while it lives and resumes it (SIGCONT) when destroyed or
// resume()d. Tests pause a worker so that work they send piles up in the scheduler and then runs
// from a known state, instead of assuming it all arrives within one batch's time (a loaded CI
// machine breaks that). The process's supervisor must tolerate the pause: give tulip a long
// --heartbeat-timeout-ms.
class Paused {
 public:
  explicit Paused(pid_t pid);
  ~Paused() { resume(); }
  Paused(const Paused&) = delete;
  Paused& operator=(const Paused&) = delete;
  bool stopped() const { return pid_ > 0; }  // false when SIGSTOP failed (no such process)
  void resume();

 private:
  pid_t pid_ = -1;
};

// Polls `pred` every `every` until it holds or `limit` passes; returns its last value. For
// waiting on an observable condition (a metric, a counter) instead of sleeping a fixed time.
bool eventually(std::chrono::milliseconds limit, const std::function<bool()>& pred,
                std::chrono::milliseconds every = std::chrono::milliseconds(20));

// Prometheus text exposition `page`: the sum of the samples on every line that starts with
// `prefix` — a whole family ("name{") or one series ("name{labels} ", "name ") — 0 when none.
double metricSum(const std::string& page, const std::string& prefix);
// One series' value (`series` as exposed: "name" or "name{labels}"), 0 when absent.
inline double metricValue(const std::string& page, const std::string& series) {
  return metricSum(page, series + " ");
}

// Direct children of `pid` (from /proc).
std::vector<pid_t> childrenOf(pid_t pid);
// Whether `pid` exists and is not a zombie (from /proc/<pid>/stat).
bool processRunning(pid_t pid);
// The direct children of `pid` that are running (childrenOf filtered by processRunning).
std::vector<pid_t> runningChildrenOf(pid_t pid);
// tulip --disaggregate's two running roses (prefill, decode), told apart by the prefill one's
// --kv-export on its command line; 0 for a side that is not running.
std::pair<pid_t, pid_t> prefillAndDecodeRose(pid_t tulip);

struct HttpResponse {
  int status = 0;                              // 0 = connection failed
  std::map<std::string, std::string> headers;  // lower-cased names
  std::string body;
};

// One request on a new connection (Connection: close).
HttpResponse http(int port, const std::string& method, const std::string& path,
                  const std::string& body = "",
                  const std::map<std::string, std::string>& headers = {},
                  std::chrono::milliseconds timeout = std::chrono::milliseconds(60000));

// Polls GET path until it answers `want` or the limit passes.
bool waitForHttp(int port, const std::string& path, int want, std::chrono::milliseconds limit);

// Runs a command, returns its exit status; output appended to `log_path` if given.
int run(const std::vector<std::string>& argv, const std::string& log_path = "");

}  // namespace garden::testing
