#pragma once
// EmbedScheduler: token-budget batching of embedding and scoring requests.
//
// Requests arrive tokenized. Their sequences wait in one FIFO; whenever the worker has a free slot,
// the scheduler thread forms a batch first-come-first-served up to a token budget (and a sequence
// cap), so up to `depth` batches are in flight while the next one is being prepared. A request's
// sequences may span several batches; it completes when its last sequence has a result. Admission
// is bounded in tokens (RESOURCE_EXHAUSTED past the limit), expired or cancelled sequences are
// dropped before they reach the worker, and a worker failure fails exactly the requests it held.
//
// Threads: submit()/cancel() from any thread (gRPC handlers); batching state lives behind one mutex
// and is driven by the scheduler thread; completion callbacks run on the worker's thread.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/shm/channel.h"
#include "common/status.h"
#include "services/tulip/worker/worker.h"

namespace garden::tulip {

struct SchedulerOptions {
  uint32_t max_batch_tokens = 8192;  // token budget per batch
  uint32_t max_batch_seqs = 256;     // sequence cap per batch
  uint64_t queue_limit_tokens = 1u << 20;
};

// One caller's request. Filled by the server, completed by the scheduler.
struct EmbedJob {
  shm::BatchKind kind = shm::BatchKind::kEmbed;
  std::vector<std::vector<int32_t>> inputs;
  shm::PoolingMode pooling = shm::PoolingMode::kDefault;
  bool normalize = true;
  uint32_t dimensions = 0;  // 0 = full width; else truncate (and re-normalize when normalize)
  int32_t score_yes = -1;
  int32_t score_no = -1;
  int64_t deadline_ns = 0;  // CLOCK_MONOTONIC, 0 = none
  std::string request_id;

  // Results, in input order: `dim` floats per input for kEmbed, one float for kScore.
  uint32_t dim = 0;
  std::vector<float> values;
  uint64_t queue_us = 0;      // enqueue until its first sequence went into a batch
  uint64_t inference_us = 0;  // wall time from its first batch's submission to its last result
  int64_t first_submit_ns = 0;  // (scheduler bookkeeping for inference_us)
  uint64_t step_us = 0;       // sum of rose's own step times

  // Called exactly once with the final status (from the worker or scheduler thread).
  std::function<void(const Status&)> on_done;

  std::atomic<bool> cancelled{false};
};

struct SchedulerStats {
  uint64_t queued_requests = 0;
  uint64_t queued_tokens = 0;
  uint64_t inflight_tokens = 0;
  uint64_t queue_limit_tokens = 0;
};

class EmbedScheduler {
 public:
  EmbedScheduler(Worker& worker, SchedulerOptions opts);
  ~EmbedScheduler();

  // Validates the job against the model's facts and admits it, or returns the error without
  // calling on_done. After OK, on_done is called exactly once.
  Status submit(std::shared_ptr<EmbedJob> job);
  // Marks the job cancelled: its queued sequences are dropped and on_done gets CANCELLED (at once
  // if nothing of it is in flight, else when its in-flight batches return).
  void cancel(const std::shared_ptr<EmbedJob>& job);

  SchedulerStats stats() const;
  // Stops the scheduler thread; queued jobs get CANCELLED.
  void stop();

  // Wake the scheduler (the worker calls this when a slot frees or readiness changes).
  void poke();

 private:
  struct Pending {
    std::shared_ptr<EmbedJob> job;
    size_t remaining = 0;      // sequences without a result yet
    size_t next_seq = 0;       // next sequence to batch
    uint64_t queued_tokens = 0;
    int64_t enqueued_ns = 0;
    bool started = false;
    bool finished = false;
    Status error;  // first failure
  };
  struct Part {
    std::shared_ptr<Pending> p;
    size_t seq;
  };

  void loop();
  // Forms one batch from the queue head (mu_ held). Empty when nothing is runnable.
  std::vector<Part> formBatch(WorkBatch& batch);
  void finish(const std::shared_ptr<Pending>& p, Status st);  // mu_ NOT held
  void onResult(std::vector<Part> parts, uint64_t tokens, int64_t submitted_ns,
                const WorkResult& r);
  void dropDead();  // fails expired/cancelled queued sequences (mu_ held; collects finishes)

  Worker& worker_;
  const SchedulerOptions opts_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> queue_;  // guarded by mu_
  uint64_t queued_tokens_ = 0;                  // guarded by mu_
  uint64_t inflight_tokens_ = 0;                // guarded by mu_
  std::vector<std::pair<std::shared_ptr<Pending>, Status>> to_finish_;  // guarded by mu_
  bool stop_ = false;                                                   // guarded by mu_
  std::thread thread_;
};

}  // namespace garden::tulip
