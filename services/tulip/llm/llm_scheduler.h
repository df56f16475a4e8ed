#pragma once
// LlmScheduler: runs tulip's continuous batching of text generation on one rose worker. The
// decisions (which tokens each step computes, KV blocks, preemption, prefix cache, stop
// conditions) are LlmStepScheduler's (step_scheduler.h); this class is the plumbing around it:
// it validates requests against the worker's facts (validateGenerate), feeds them and the
// worker's step results to the step scheduler, hands its plans to the worker, watches
// cancellation, deadlines and the worker's health, delivers the events, and keeps the metrics.
//
// Steps in flight: one (the next decode needs this step's token), or two with
// options.async_steps on a worker whose depth() is at least 2 — step N+1 is planned and
// submitted while step N runs, its continuing sequences reading their first token from step N's
// sampled ids [TAG_LLM_PREV_TOKEN]. Results are applied in submission order whatever order the
// worker answers in (a dying worker answers its slots in slot order).
//
// Threads: submit()/cancel()/stopChoice()/stats() from any thread. One scheduler thread owns the
// loop: it applies results the worker's thread hands over, plans and submits steps, and delivers
// every GenerateEvent on that thread, in order, with no lock held.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "services/tulip/llm/generate_request.h"
#include "services/tulip/llm/llm_frontend.h"
#include "services/tulip/llm/step_scheduler.h"
#include "services/tulip/worker/worker.h"

namespace garden::tulip {

struct LlmRequest {
  GenerateParams params;
  // Called on the scheduler thread (see the header comment); must not call back into the
  // scheduler's submit().
  std::function<void(const GenerateEvent&)> on_event;
  std::atomic<bool> cancelled{false};
  // A request with params.n > 1: the id stopChoice() names it by, set by submit() before any
  // event and never changed after (0: none, n = 1 or not admitted) [TAG_STOP_CHOICE].
  uint64_t call_id = 0;
  // [TAG_DISAGG] Choices stopped by the caller (bit i: choice i; kMaxChoices <= 32), for
  // schedulers that share the request (prefill and decode): each ends its choices whose bit is
  // set, like a cancellation of one choice with status OK and FINISH_STOP.
  std::atomic<uint32_t> stopped_choices{0};
};

// [TAG_DISAGG] A sequence on its way from a prefill scheduler to a decode one (LlmScheduler::
// setHandoff / adopt): its state, its stream, where its blocks are (the prefill worker's export
// and pid) and how to free them there once copied.
struct LlmHandoff {
  SeqHandoff seq;
  std::shared_ptr<LlmRequest> req;
  int64_t arrival_ns = 0;
  int64_t last_token_ns = 0;
  std::string source;      // the prefill worker's ModelFacts.kv_export
  int32_t source_pid = 0;  // its pid
  std::function<void()> release;  // frees the parked blocks on the prefill side (any thread)
};

// The LLM gauges (tulip_llm_running_sequences, ..._waiting_..., tulip_kv_blocks_used/free, the
// window pool's) from `s`.
void publishLlmGauges(const LlmStats& s);

class LlmScheduler final : public LlmFrontend {
 public:
  // async_steps takes effect only when worker.depth() >= 2.
  LlmScheduler(Worker& worker, LlmSchedulerOptions opts);
  ~LlmScheduler() override;

  // Validates against the worker's facts and admits, or returns the error (INVALID_ARGUMENT
  // naming the field, RESOURCE_EXHAUSTED, UNAVAILABLE, FAILED_PRECONDITION for a non-LLM
  // worker) without any event. After OK, the request gets its events (the last one exactly once).
  Status submit(std::shared_ptr<LlmRequest> req) override;
  // Ends the request with FINISH_CANCELLED and frees its blocks (at the next loop turn).
  void cancel(const std::shared_ptr<LlmRequest>& req) override;
  // Ends one choice of a call with several (n > 1), named by its LlmRequest::call_id, with
  // status OK and FINISH_STOP, and frees its blocks; the call's other choices go on
  // [TAG_STOP_CHOICE]. For the caller's own stop conditions (ivy's stop strings). OK also when
  // that choice already ended (idempotent); NOT_FOUND when no call with that id is running (an
  // unknown id, or every choice of it has ended); INVALID_ARGUMENT for index >= n. Ids are drawn
  // at random per process, so a stale id from an earlier tulip finds nothing.
  Status stopChoice(uint64_t call_id, uint32_t index) override;

  LlmStats stats() const override;
  // [TAG_DISAGG] Prefill side (options.handoff): where handed-off sequences go, called on the
  // scheduler thread with no lock held, after the sequence's first-token event. Set before the
  // first submit().
  void setHandoff(std::function<void(LlmHandoff)> fn);
  // Whether publishMetrics sets the gauges (running, waiting, KV blocks) from this scheduler
  // alone (default); off for the two schedulers of a disaggregated pair, whose sum the owner
  // publishes (publishLlmGauges) [TAG_DISAGG]. Counters always add up.
  void setPublishGauges(bool on);
  // Frees a handed-off sequence's parked blocks (any thread; no-op for an unknown id).
  void releaseHandoff(SeqId prefill_id);
  // [TAG_DISAGG] Decode side: queues `h`; the loop adopts it when the running set and the KV
  // cache have room, copies its blocks from the prefill worker (a kKvPull batch), calls
  // h.release and then streams the rest of it to h.req like a request of its own. Every
  // adopted handoff's stream ends exactly once (also when the copy fails or the worker is down).
  // Moves `h` into the queue. UNAVAILABLE after stop(): nothing queued, `h` left as it was (the
  // caller ends it).
  Status adopt(LlmHandoff& h);
  // Whether steps are planned ahead of their results (two in flight).
  bool asyncSteps() const { return core_.options().async_steps; }
  // Stops the loop; requests still there end CANCELLED.
  void stop();
  // Wakes the loop (the worker calls this when a slot frees or readiness changes).
  void poke();

 private:
  struct Active {
    std::shared_ptr<LlmRequest> req;
    int64_t arrival_ns = 0;
    int64_t last_token_ns = 0;
    uint32_t index = 0;          // the choice
    bool in_calls = false;       // counted in calls_ (submitted here with n > 1)
  };
  // A running call with several choices [TAG_STOP_CHOICE]: sequences first .. first + n - 1,
  // `live` of them not ended yet (their last event not collected).
  struct Call {
    SeqId first = 0;
    uint32_t n = 0;
    uint32_t live = 0;
  };
  struct StepResult {
    Status status;
    std::vector<int32_t> ids;
    std::vector<llm::LlmTokenLogprobs> logprobs;
    uint64_t step_us = 0;
  };
  using Outbox = std::vector<std::pair<std::shared_ptr<LlmRequest>, GenerateEvent>>;
  // [TAG_DISAGG] Copies in flight, by the decode-side sequence id.
  struct Pull {
    std::function<void()> release;
    bool done = false;
    Status status;
  };

  void loop();
  // All below: mu_ held.
  void applyResults();
  void watch(int64_t now);
  Outbox collectEvents(int64_t now);
  enum class Submitted { kNone, kStep, kNoSlot };
  // Plans the next step and hands it to the worker (kStep; kNoSlot: the worker had no free slot
  // and the plan was retracted; kNone: nothing to plan now). Unlocks `l` around the handover.
  Submitted submitStep(std::unique_lock<std::mutex>& l);
  bool resultReady() const;
  // [TAG_DISAGG] Builds the bookkeeping when the worker is ready and nothing is in flight.
  bool ensureConfigured();
  // [TAG_DISAGG] Starts the copy of the oldest queued handoff when there is room (true: it left
  // the queue); unlocks `l` around the handover.
  bool startAdoption(std::unique_lock<std::mutex>& l);
  // Applies finished copies (adopted()).
  void applyPulls(int64_t now);
  // Ends a queued handoff that never reached the step scheduler (its stream's last event).
  void endQueued(LlmHandoff& h, Status st, FinishReason why);
  // Fills and hands over the late masks of the oldest step in flight, if it has any left
  // [TAG_LATE_MASKS].
  void deliverLateMasks(int64_t now);
  void publishMetrics();

  Worker& worker_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  LlmStepScheduler core_;  // guarded by mu_ (its options are immutable: read freely)
  std::unordered_map<SeqId, Active> active_;  // guarded by mu_: sequences with a stream
  std::unordered_map<uint64_t, Call> calls_;  // guarded by mu_: by LlmRequest::call_id
  uint64_t next_call_id_;                     // guarded by mu_
  // Choices stopChoice() asked to stop, applied by the loop's watch() like cancellations.
  std::vector<SeqId> stops_;                  // guarded by mu_
  // A submitted step; `late` carries its masks to the worker when they come late
  // [TAG_LATE_MASKS] (delivered once the step before it has been applied).
  struct InflightStep {
    StepPlan plan;
    std::shared_ptr<LateMasks> late;
    bool delivered = false;
  };
  std::deque<InflightStep> inflight_;         // guarded by mu_: submitted, oldest first
  std::map<uint64_t, StepResult> results_;    // guarded by mu_: by step, not yet applied
  LlmStats published_;                        // guarded by mu_: counters already exported
  bool stop_ = false;                         // guarded by mu_
  bool publish_gauges_ = true;                // guarded by mu_
  // [TAG_DISAGG]
  std::function<void(LlmHandoff)> on_handoff_;  // set before use
  std::vector<LlmHandoff> handoffs_;            // guarded by mu_: to hand over, outside the lock
  std::deque<LlmHandoff> adoptions_;            // guarded by mu_: queued, oldest first
  std::map<SeqId, Pull> pulls_;                 // guarded by mu_: copies in flight
  Outbox direct_;                               // guarded by mu_: last events of queued ones
  std::vector<std::function<void()>> releases_;  // guarded by mu_: to call outside the lock
  std::thread thread_;
};

}  // namespace garden::tulip
