#pragma once
// rose's step loop on the shared-memory channel [TAG_ROSE_LAZY], one for every kind of model.
// step() takes one batch descriptor from the submission ring, checks its slot (in range, free)
// and its deadline (an expired one is answered DEADLINE_EXCEEDED without running), lets the
// Runner (runner.h) admit it — validate it against the arena and the model and copy its inputs
// into the slot's private staging; a refused batch is answered with the runner's error, nothing
// run — then has the runner launch it on the backend, records the slot's event and returns
// without waiting. The completion queue (completion_queue.h) waits on the events in submission
// order on its own thread and publishes each Completion once its result is in memory.
// Heartbeats: every step() beats, and run() never blocks longer than `poll` between steps.
//
// The loop counts batches (run, rejected, published: stats()), exports the runner's outcome
// counter and step histogram, and logs one debug line per launched batch with the id of its first
// request [TAG_REQUEST_ID_LOGS]. It knows nothing of the model kind: what a batch means, what
// staging it needs and what a result is belong to the runner.
//
// Threads: step()/run() on one thread (the step thread; it also owns the backend's launching
// side); the completion thread is owned by the StepLoop and joined by drain()/the destructor.
// stats()/inFlight() from any thread. The Channel, Backend and Runner (and the runner's model)
// must outlive the StepLoop.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/shm/channel.h"
#include "common/status.h"
#include "services/rose/engine/completion_queue.h"
#include "services/rose/engine/runner.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {

struct StepLoopOptions {
  std::string model_name;  // ModelFacts.name (truncated to 63 bytes)
  std::chrono::microseconds poll = std::chrono::milliseconds(20);  // run(): longest wait per step
};

struct StepLoopStats {
  uint64_t batches_run = 0;       // launched (embed/score batches, generate steps)
  uint64_t batches_rejected = 0;  // answered with an error without running
  uint64_t completions = 0;       // published completions (run + rejected)
};

class StepLoop {
 public:
  // Binds the runner to the channel's layout (Runner::bind), creates one backend event per slot,
  // registers the output arena with the backend (results are copied straight into it) and starts
  // the completion thread. INVALID_ARGUMENT for a channel without slots or one the runner
  // cannot use.
  static Result<std::unique_ptr<StepLoop>> create(shm::Channel& channel, Backend& backend,
                                                  Runner& runner, const StepLoopOptions& opts);
  ~StepLoop();
  StepLoop(const StepLoop&) = delete;
  StepLoop& operator=(const StepLoop&) = delete;

  // Writes ModelFacts (the runner's, with the model name and kind), the worker pid, beats and
  // sets the worker state to kReady.
  void announceReady();

  // Takes at most one batch (waiting up to `wait`), beats the heartbeat. Returns true when a
  // batch was taken (run or rejected). Never waits for the device.
  bool step(std::chrono::microseconds wait);

  // Steps until should_stop() returns true (checked every step), then sets kStopping and drains.
  void run(const std::function<bool()>& should_stop);

  // Waits (up to `timeout`) until every taken batch has been published and counted in stats()
  // and inFlight(); keeps serving. A caller that has seen its last completion on the channel
  // calls this before reading the counters (the queue publishes first, counts after).
  bool waitIdle(std::chrono::milliseconds timeout) { return queue_.waitIdle(timeout); }

  // Waits (up to `timeout`) until every taken batch has been published, then stops the
  // completion thread. Returns false on timeout. Called by run() and the destructor.
  bool drain(std::chrono::milliseconds timeout);

  StepLoopStats stats() const;
  uint32_t inFlight() const { return queue_.inFlight(); }

 private:
  struct Slot {
    std::unique_ptr<Event> event;
    std::atomic<bool> busy{false};  // launched and not yet published
  };
  StepLoop(shm::Channel& c, Backend& b, Runner& r, const StepLoopOptions& o);
  // Slot in range and free, deadline not passed: OK when the batch may be admitted.
  Status checkTaken(const shm::BatchDesc& d) const;
  void reject(const shm::BatchDesc& d, const Status& st, std::chrono::steady_clock::time_point t);

  shm::Channel& channel_;
  Backend& backend_;
  Runner& runner_;
  StepLoopOptions opts_;
  RunnerTraits traits_;
  std::string reject_log_, failure_log_;  // "<kind> <unit> rejected" / "... failed"
  bool registered_ = false;               // the output arena is registered with the backend
  std::vector<std::unique_ptr<Slot>> slots_;

  CompletionQueue queue_;  // answers taken batches in order on its own thread
  std::atomic<uint64_t> run_{0}, rejected_{0};
};

}  // namespace garden::rose
