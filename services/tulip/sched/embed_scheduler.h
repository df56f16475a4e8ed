#pragma once
// EmbedScheduler: token-budget batching of embedding and scoring requests, fair across callers.
//
// Requests arrive tokenized. Batches are formed up to a token budget (and a sequence cap), taking
// turns across *flows* [TAG_EMBED_FAIR]: a flow is every queued request that carries the same
// request id (ivy sends the chunks of one split caller request with that request's id, so one big
// caller request is one flow however many chunks it became; a request without an id is a flow of
// its own). Each batch is filled in rounds: in every round each flow, in turn order, adds its next
// sequence (its requests FIFO, a request's sequences in order) while the batch has room; a flow
// whose next sequence does not fit, or whose next request cannot share the batch (another kind,
// pooling, normalization or score tokens than the flow that opened the batch), sits out the rest
// of that batch. Flows that got sequences then move behind those that got none, and a new flow
// joins at the back. So a request of 2048 x 512 tokens cannot hold the worker until it completes:
// a small request that arrives behind it is in the next batch formed (as long as fewer flows wait
// than a batch has sequences; beyond that, within a rotation) and waits about one batch, not the
// big request's whole run. A flow's share is counted in sequences, not tokens (as vLLM's
// per-request chunk cap and TEI's per-request split do, in their own units). Every request records
// how many batches were formed ahead of it while it waited (EmbedJob::queue_batches; logged and
// exported as tulip_queue_wait_batches).
//
// [TAG_EMBED_INFLIGHT]: at most `max_inflight_batches` batches are on the worker at once (default
// 2: one running, one staged behind it so rose's host preparation overlaps the GPU). A request that
// finds the worker below that cap is dispatched at once, by the thread that submitted it (no
// hand-off, no timer); requests that arrive while the cap is reached accumulate in the queue and go
// out together as the next batch, dispatched by the completion that frees the place. So a lone
// request pays no added latency, and concurrent small requests coalesce instead of queueing inside
// rose one by one. A small request arriving while the cap is reached therefore waits for the
// running batch, runs behind the staged one, then in its own: at most max_inflight_batches + 1
// batch times end to end — with immediate staging. [TAG_EMBED_LATE_STAGE]: by default the staged
// batch is formed late instead: while a batch runs, the next one is formed only when the work on
// the worker is predicted to end within `stage_lead_us` (plus the model's recent error), from a
// cost model (service time = a + b x tokens, exponentially weighted least squares over recent
// batches as tulip saw them complete). Until then arrivals coalesce. Before, the first request
// after a completion went out alone as the staged batch and everyone after it waited for a third
// batch; closed-loop clients kept that split forever (on the H200 at 4-16 clients of 512 tokens
// ~2.4 sequences per batch, each paying the ~0.9 ms fixed cost of a forward). Now a request
// arriving while a batch runs waits for that batch, then runs in the next: about one batch
// time, not two. The staged batch still reaches the worker ~stage_lead_us before the running one
// ends, so the worker is not left idle; a prediction that runs late only costs the gap of
// max_inflight_batches = 1 (the completion dispatches what waits). Off with stage_lead_us = 0,
// with a cap of 1 or 0, and until the model has seen a few batches.
// A request's sequences may span several batches; it completes when its
// last sequence has a result. Admission is bounded in tokens (RESOURCE_EXHAUSTED past the limit),
// expired or cancelled sequences are dropped before they reach the worker, and a worker failure
// fails exactly the requests it held.
//
// Threads: submit()/cancel() from any thread (gRPC handlers). Batching state lives behind one
// mutex; batches are formed and handed to the worker with it held (so they reach the worker in
// the order they were formed) by whichever thread changed the picture: submit() (work arrived),
// the completion callback (a place freed; it runs on the worker's thread) or the scheduler thread
// (wake-ups from the worker, deadlines, cancellations, retries). on_done runs on the worker's
// thread, the scheduler thread, or — only when the worker refuses a batch submitted inline —
// inside submit().
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/shm/channel.h"
#include "common/status.h"
#include "services/tulip/worker/worker.h"

namespace garden::tulip {

struct SchedulerOptions {
  uint32_t max_batch_tokens = 8192;  // token budget per batch
  uint32_t max_batch_seqs = 256;     // sequence cap per batch
  uint64_t queue_limit_tokens = 1u << 20;
  // Batches on the worker at once (see the header comment); 0 = up to the worker's depth (every
  // free slot takes a batch at once: the pre-2026-11-30 behaviour, no coalescing under load).
  uint32_t max_inflight_batches = 2;
  // [TAG_EMBED_LATE_STAGE] With a batch running, form the next one only when the running work is
  // predicted to end within this many µs (0 = stage at once, the 2026-11-30 behaviour). It must
  // cover the hand-off to the worker and its host preparation of the staged batch.
  uint32_t stage_lead_us = 1000;
  // Clock of the staging policy (CLOCK_MONOTONIC ns); tests may substitute one. nullptr = real.
  int64_t (*clock_ns)() = nullptr;
};

// Predicts a batch's service time from its tokens: a + b x tokens, fitted by exponentially
// weighted least squares over recent batches [TAG_EMBED_LATE_STAGE]. Not thread-safe.
class BatchCostModel {
 public:
  void add(uint64_t tokens, int64_t service_ns);
  // ns; 0 before the first sample.
  int64_t predict(uint64_t tokens) const;
  // Exponentially weighted mean absolute error of the predictions made before each sample (ns).
  int64_t error() const { return static_cast<int64_t>(err_); }
  uint32_t samples() const { return n_; }

 private:
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0, err_ = 0;
  uint32_t n_ = 0;
};

// Where one request's time went (CLOCK_MONOTONIC ns; 0 = not reached). For batch-1 requests every
// stamp is its only batch's; for multi-batch requests the last batch's.
struct EmbedTrace {
  int64_t arrived_ns = 0;         // the server got the call
  int64_t dispatched_ns = 0;      // its (last) batch was handed to the worker
  int64_t rose_taken_ns = 0;      // rose's step thread took the batch off the ring
  int64_t rose_launched_ns = 0;   // ... and had launched its forward pass
  int64_t rose_ready_ns = 0;      // rose's completion thread saw the result in memory
  int64_t rose_published_ns = 0;  // ... and published the completion
  int64_t seen_ns = 0;            // tulip's worker thread took the completion
  int64_t done_ns = 0;            // results copied, about to answer
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
  // Names the job's flow for fair batching [TAG_EMBED_FAIR]: queued jobs with the same non-empty
  // id share one turn (the chunks of one split caller request); empty = a flow of its own.
  std::string request_id;

  // Results, in input order: `dim` floats per input for kEmbed, one float for kScore.
  uint32_t dim = 0;
  std::vector<float> values;
  uint64_t queue_us = 0;      // enqueue until its first sequence went into a batch
  uint32_t queue_batches = 0;  // batches formed ahead of its first sequence while it waited
  uint64_t inference_us = 0;  // wall time from its first batch's submission to its last result
  int64_t first_submit_ns = 0;  // (scheduler bookkeeping for inference_us)
  uint64_t step_us = 0;       // sum of rose's own step times
  EmbedTrace trace;

  // Called exactly once with the final status (from the worker or scheduler thread).
  std::function<void(const Status&)> on_done;

  std::atomic<bool> cancelled{false};
};

struct SchedulerStats {
  uint64_t queued_requests = 0;
  uint64_t queued_tokens = 0;
  uint64_t inflight_tokens = 0;
  uint64_t queue_limit_tokens = 0;
  // [TAG_EMBED_LATE_STAGE] When the batch held back for late staging is to be formed (the
  // staging clock's ns); 0: none held.
  int64_t staged_at_ns = 0;
};

class EmbedScheduler {
 public:
  EmbedScheduler(Worker& worker, SchedulerOptions opts);
  ~EmbedScheduler();

  // Validates the job against the model's facts and admits it, or returns the error without
  // calling on_done. After OK, on_done is called exactly once.
  Status submit(std::shared_ptr<EmbedJob> job) EXCLUDES(mu_);
  // Marks the job cancelled: its queued sequences are dropped and on_done gets CANCELLED (at once
  // if nothing of it is in flight, else when its in-flight batches return).
  void cancel(const std::shared_ptr<EmbedJob>& job) EXCLUDES(mu_);

  SchedulerStats stats() const EXCLUDES(mu_);
  // Batches this scheduler has on the worker now, and the most there ever were at once.
  uint32_t inflightBatches() const EXCLUDES(mu_);
  uint32_t maxInflightBatchesSeen() const EXCLUDES(mu_);
  // Stops the scheduler thread; queued jobs get CANCELLED.
  void stop() EXCLUDES(mu_);

  // Wake the scheduler (the worker calls this when a slot frees or readiness changes).
  void poke() EXCLUDES(mu_);

 private:
  struct Pending {
    std::shared_ptr<EmbedJob> job;
    size_t remaining = 0;      // sequences without a result yet
    size_t next_seq = 0;       // next sequence to batch
    uint64_t queued_tokens = 0;
    int64_t enqueued_ns = 0;
    uint64_t formed_at_enqueue = 0;  // batches_formed_ when it was queued
    bool started = false;
    bool finished = false;
    Status error;  // first failure
  };
  struct Part {
    std::shared_ptr<Pending> p;
    size_t seq;
  };
  // Queued requests sharing one request id, FIFO [TAG_EMBED_FAIR]. A request leaves its flow once
  // its last sequence is in a batch; an empty flow leaves flows_.
  struct Flow {
    std::string key;  // empty: a flow of one request, not in flow_by_key_
    std::deque<std::shared_ptr<Pending>> reqs;
    bool took = false;  // formBatch's scratch: it got sequences in the batch being formed
  };

  // What a dispatch leaves to do once mu_ is released: batches the worker refused (answered
  // through onResult) and requests dropped from the queue (expired, cancelled, worker down).
  struct Refused {
    std::vector<Part> parts;
    uint64_t tokens = 0;
    int64_t submitted_ns = 0;
    Status status;
    uint64_t batch_id = 0;
  };
  struct Outbox {
    std::vector<Refused> refused;
    std::vector<std::pair<std::shared_ptr<Pending>, Status>> finished;
    bool empty() const { return refused.empty() && finished.empty(); }
  };

  void loop() EXCLUDES(mu_);
  // Forms one batch, taking turns across flows [TAG_EMBED_FAIR]. Empty when nothing is runnable.
  std::vector<Part> formBatch(WorkBatch& batch) REQUIRES(mu_);
  // Removes the flow at flows_[i].
  void eraseFlow(size_t i) REQUIRES(mu_);
  // Cap on batches in flight (mu_ not needed: options and worker depth are fixed).
  uint32_t inflightCap() const;
  // Drops dead queued requests, then forms and submits batches while the queue has work and the
  // cap, the worker's free slots and its readiness allow (mu_ held). Stops at the first refusal.
  void dispatchLocked(Outbox& out) REQUIRES(mu_);
  // Answers what dispatchLocked left (mu_ NOT held).
  void flush(Outbox& out) EXCLUDES(mu_);
  void finish(const std::shared_ptr<Pending>& p, Status st) EXCLUDES(mu_);
  // A batch's result (mu_ NOT held). With `dispatch_next`, the freed place is refilled from the
  // queue at once, before the finished requests are answered.
  void onResult(std::vector<Part>& parts, uint64_t tokens, int64_t submitted_ns,
                const WorkResult& r, bool dispatch_next, uint64_t batch_id) EXCLUDES(mu_);
  // Fails expired/cancelled queued sequences (collects finishes).
  void dropDead() REQUIRES(mu_);
  int64_t nowNs() const;
  // With work on the worker: when the next batch should be formed [TAG_EMBED_LATE_STAGE]; 0 = now.
  int64_t stageAtNs(int64_t now) const REQUIRES(mu_);

  Worker& worker_;
  const SchedulerOptions opts_;

  mutable Mutex mu_;
  CondVar cv_;
  // Flows with queued sequences, in turn order (the front gets the first turn of the next batch).
  std::deque<std::unique_ptr<Flow>> flows_ GUARDED_BY(mu_);
  std::unordered_map<std::string, Flow*> flow_by_key_ GUARDED_BY(mu_);
  uint64_t queued_requests_ GUARDED_BY(mu_) = 0;
  uint64_t queued_tokens_ GUARDED_BY(mu_) = 0;
  uint64_t batches_formed_ GUARDED_BY(mu_) = 0;
  uint64_t inflight_tokens_ GUARDED_BY(mu_) = 0;
  uint32_t inflight_batches_ GUARDED_BY(mu_) = 0;
  uint32_t inflight_batches_max_ GUARDED_BY(mu_) = 0;
  std::vector<std::pair<std::shared_ptr<Pending>, Status>> to_finish_ GUARDED_BY(mu_);
  // [TAG_EMBED_LATE_STAGE] Batches on the worker (FIFO), the cost model, when tulip last saw a
  // batch complete, when a held batch is due, and until when the scheduler thread sleeps (0: awake).
  struct InflightBatch {
    uint64_t id;
    int64_t submitted_ns;
    uint64_t tokens;
  };
  std::deque<InflightBatch> inflight_ GUARDED_BY(mu_);
  uint64_t next_batch_id_ GUARDED_BY(mu_) = 0;
  BatchCostModel cost_ GUARDED_BY(mu_);
  int64_t last_done_ns_ GUARDED_BY(mu_) = 0;
  int64_t stage_at_ns_ GUARDED_BY(mu_) = 0;
  int64_t loop_wake_ns_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace garden::tulip
