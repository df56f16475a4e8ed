#pragma once
// CompletionQueue: the completion half of rose's step loop (step_loop.h). The step thread pushes
// one PendingCompletion per batch it took, launched or rejected; the queue's thread answers them
// in order: it waits for a launched batch's event (a failed wait turns the answer into that
// error), frees the slot, publishes the completion on the channel (retrying while the completion
// ring is full, until drain() stops it) and then counts it (the runner's outcome counter and step
// histogram). drain() waits until every pushed batch is answered and stops the thread.
//
// Step progress [TAG_STEP_PROGRESS]: start() points the backend's progress counter at the
// channel's and records in the header whether the backend advances it (before the engine
// announces kReady, so tulip reads it with the model facts); the destructor detaches it again
// once the queue has drained, so a backend that outlives the engine never writes to a channel
// that may be gone.
//
// Threads: push() from the step thread; the hooks run on the queue's thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "common/metrics/registry.h"
#include "common/mutex.h"
#include "common/shm/channel.h"
#include "common/status.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {

struct PendingCompletion {
  shm::Completion completion;  // filled except step_us (and status when run)
  bool launched = false;
  std::chrono::steady_clock::time_point taken;
};

// Copies `msg` into a completion's message field (truncated, NUL-terminated).
void copyCompletionMessage(char (&dst)[160], const std::string& msg);

class CompletionQueue {
 public:
  struct Hooks {
    std::function<Status(uint32_t slot)> wait;   // a launched batch's event
    std::function<void(uint32_t slot)> release;  // its slot may take a new batch
    // After publishing: +1 on `outcomes` labelled with the status code name; a launched batch's
    // taken-to-published time into `step_seconds`.
    metrics::CounterFamily* outcomes = nullptr;
    metrics::Histogram* step_seconds = nullptr;
    const char* failure_log = "step failed";  // log line of a failed wait
  };

  CompletionQueue(shm::Channel& channel, Backend& backend) : channel_(channel), backend_(backend) {}
  ~CompletionQueue() {
    drain(std::chrono::seconds(30));
    backend_.setProgressCounter(nullptr);
  }
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  void start(Hooks hooks);  // connects step progress, starts the queue's thread
  void push(PendingCompletion p) EXCLUDES(mu_);
  // Logs the refusal of `d` (warn, `log_line` with its ids and `st`) and queues its answer.
  void reject(const shm::BatchDesc& d, const Status& st,
              std::chrono::steady_clock::time_point taken, const char* log_line) EXCLUDES(mu_);
  // Waits up to `timeout` until every pushed batch is answered and counted (published() and
  // inFlight() settled); the thread keeps running. True when none is pending.
  bool waitIdle(std::chrono::milliseconds timeout) EXCLUDES(mu_);
  // Waits up to `timeout` for every pushed batch to be answered, then stops the thread (after a
  // timeout it lets the backend finish what it holds first). True when all were answered.
  bool drain(std::chrono::milliseconds timeout) EXCLUDES(mu_);

  uint32_t inFlight() const { return in_flight_.load(); }
  uint64_t published() const { return published_.load(); }

 private:
  void loop() EXCLUDES(mu_);

  shm::Channel& channel_;
  Backend& backend_;
  Hooks hooks_;
  metrics::Counter* ok_ = nullptr;  // hooks_.outcomes' "OK" child (the common case, cached)
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<PendingCompletion> pending_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::atomic<uint32_t> in_flight_{0};
  std::atomic<uint64_t> published_{0};
};

}  // namespace garden::rose
