#pragma once
// LlmScheduler: continuous batching of text generation onto one rose worker.
//
// Each request is a sequence whose *computed* tokens (KV written) catch up with its tokens
// (prompt + generated). A step takes, under a token budget (max_batch_tokens) and a sequence cap
// (max_num_seqs), first the running sequences in admission order (a decode is 1 token, an
// unfinished prompt a chunk), then waiting ones first-come-first-served (their cached prefix
// skips recompute; the rest of the prompt is prefilled in chunks). A sequence whose last token
// is in the step samples one new token. When KV blocks run out, the most recently admitted
// running sequence is preempted by recompute: its blocks are freed and it goes back to the front
// of the waiting queue with its generated tokens appended to its prompt (rose's sampling counter
// is position + num_tokens, so the recomputed draw is the same one).
//
// Generation stops on an eos id (unless ignore_eos) or a stop_token_id (FINISH_STOP, the stop
// token is the last one streamed), after max_tokens or at the model's context length
// (FINISH_LENGTH), on cancellation (FINISH_CANCELLED) or deadline (DEADLINE_EXCEEDED); a
// finished or abandoned sequence frees its blocks at once. If rose fails a step or dies, every
// running sequence ends UNAVAILABLE and the KV bookkeeping is rebuilt from the worker's facts
// once it is ready again.
//
// Threads: submit()/cancel()/stats() from any thread. One scheduler thread owns the step loop:
// it forms a step, submits it (one step in flight: the next decode needs this step's token),
// and handles the result the worker thread hands back; every GenerateEvent is delivered on that
// thread, in order, with no lock held.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/llm/step.h"
#include "common/status.h"
#include "services/tulip/kv/block_manager.h"
#include "services/tulip/worker/worker.h"

namespace garden::tulip {

struct LlmSchedulerOptions {
  uint32_t max_batch_tokens = 8192;        // tokens per step
  uint32_t max_num_seqs = 256;             // running sequences (and so sequences per step)
  uint64_t max_waiting_tokens = 1u << 20;  // prompt tokens waiting; beyond: RESOURCE_EXHAUSTED
  bool enable_prefix_caching = true;
};

// Values match garden.v1.FinishReason.
enum class FinishReason : int { kNone = 0, kStop = 1, kLength = 2, kCancelled = 3 };

struct GenerateParams {
  std::vector<int32_t> prompt;
  uint32_t max_tokens = 0;  // 0: until the context is full
  llm::SamplingParams sampling;
  bool has_seed = false;  // false: the scheduler draws a seed
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int64_t deadline_ns = 0;  // CLOCK_MONOTONIC, 0 = none
  std::string request_id;
};

// One event of a request's stream. A request gets zero or more token events, then exactly one
// last event (last = true), which may also carry a token.
struct GenerateEvent {
  int32_t token = -1;  // >= 0: the next generated token
  bool last = false;
  // Last event only: status OK with finish set, or the error that ended the stream.
  Status status;
  FinishReason finish = FinishReason::kNone;
  uint32_t prompt_tokens = 0;
  uint32_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  uint32_t completion_tokens = 0;
  uint64_t queue_us = 0;      // arrival until first scheduled
  uint64_t inference_us = 0;  // first scheduled until the end
  uint64_t total_us = 0;
};

struct LlmRequest {
  GenerateParams params;
  // Called on the scheduler thread (see the header comment); must not call back into the
  // scheduler's submit().
  std::function<void(const GenerateEvent&)> on_event;
  std::atomic<bool> cancelled{false};
};

struct LlmStats {
  uint32_t running = 0;
  uint32_t waiting = 0;
  uint64_t waiting_tokens = 0;
  uint64_t inflight_tokens = 0;
  uint64_t max_waiting_tokens = 0;
  uint32_t kv_free_blocks = 0;
  uint32_t kv_total_blocks = 0;
  uint64_t preemptions = 0;
  uint64_t cached_prompt_tokens = 0;
  uint64_t steps = 0;
};

class LlmScheduler {
 public:
  LlmScheduler(Worker& worker, LlmSchedulerOptions opts);
  ~LlmScheduler();

  // Validates against the worker's facts and admits, or returns the error (INVALID_ARGUMENT
  // naming the field, RESOURCE_EXHAUSTED, UNAVAILABLE, FAILED_PRECONDITION for a non-LLM
  // worker) without any event. After OK, the request gets its events (the last one exactly once).
  Status submit(std::shared_ptr<LlmRequest> req);
  // Ends the request with FINISH_CANCELLED and frees its blocks (at the next loop turn).
  void cancel(const std::shared_ptr<LlmRequest>& req);

  LlmStats stats() const;
  // Stops the loop; requests still there end CANCELLED.
  void stop();
  // Wakes the loop (the worker calls this when a slot frees or readiness changes).
  void poke();

 private:
  struct Seq;
  struct Entry {
    std::shared_ptr<Seq> seq;
    uint32_t num_new = 0;
    uint32_t position = 0;
    bool sample = false;
  };
  struct StepResult {
    Status status;
    std::vector<int32_t> ids;
    uint64_t step_us = 0;
  };
  using Outbox = std::vector<std::pair<std::shared_ptr<LlmRequest>, GenerateEvent>>;

  void loop();
  // All below: mu_ held.
  bool ensureKv();
  void reap(Outbox& out);
  std::vector<Entry> schedule(WorkBatch& batch);
  void preempt(const std::shared_ptr<Seq>& victim);
  void handleResult(StepResult r, Outbox& out);
  void finishSeq(const std::shared_ptr<Seq>& s, Status st, FinishReason why, int32_t token,
                 Outbox& out);
  void failRunning(const Status& st, Outbox& out);
  void updateGauges();

  Worker& worker_;
  const LlmSchedulerOptions opts_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<KvBlockManager> kv_;  // guarded by mu_; null until the worker is ready
  bool kv_stale_ = true;                // guarded by mu_: rebuild from facts before the next step
  uint32_t max_len_ = 0;                // guarded by mu_: tokens a sequence may reach
  uint32_t max_running_ = 0;            // guarded by mu_: min(max_num_seqs, worker's max_seqs)
  std::vector<int32_t> eos_;            // guarded by mu_
  std::deque<std::shared_ptr<Seq>> waiting_;   // guarded by mu_
  std::vector<std::shared_ptr<Seq>> running_;  // guarded by mu_, admission order
  uint64_t waiting_tokens_ = 0;                // guarded by mu_
  std::vector<Entry> inflight_;                // guarded by mu_: the step on the worker
  bool step_busy_ = false;                     // guarded by mu_
  uint64_t inflight_tokens_ = 0;               // guarded by mu_
  int64_t step_submitted_ns_ = 0;              // guarded by mu_
  std::optional<StepResult> result_;           // guarded by mu_: handed over by the worker
  Outbox pending_out_;                         // guarded by mu_: events formed while scheduling
  uint64_t next_id_ = 1;                       // guarded by mu_
  uint64_t preemptions_ = 0;                   // guarded by mu_
  uint64_t cached_tokens_ = 0;                 // guarded by mu_
  uint64_t steps_ = 0;                         // guarded by mu_
  bool stop_ = false;                          // guarded by mu_
  std::thread thread_;
};

}  // namespace garden::tulip
