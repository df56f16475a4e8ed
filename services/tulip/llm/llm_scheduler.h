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
};

class LlmScheduler {
 public:
  // async_steps takes effect only when worker.depth() >= 2.
  LlmScheduler(Worker& worker, LlmSchedulerOptions opts);
  ~LlmScheduler();

  // Validates against the worker's facts and admits, or returns the error (INVALID_ARGUMENT
  // naming the field, RESOURCE_EXHAUSTED, UNAVAILABLE, FAILED_PRECONDITION for a non-LLM
  // worker) without any event. After OK, the request gets its events (the last one exactly once).
  Status submit(std::shared_ptr<LlmRequest> req);
  // Ends the request with FINISH_CANCELLED and frees its blocks (at the next loop turn).
  void cancel(const std::shared_ptr<LlmRequest>& req);
  // Ends one choice of a call with several (n > 1), named by its LlmRequest::call_id, with
  // status OK and FINISH_STOP, and frees its blocks; the call's other choices go on
  // [TAG_STOP_CHOICE]. For the caller's own stop conditions (ivy's stop strings). OK also when
  // that choice already ended (idempotent); NOT_FOUND when no call with that id is running (an
  // unknown id, or every choice of it has ended); INVALID_ARGUMENT for index >= n. Ids are drawn
  // at random per process, so a stale id from an earlier tulip finds nothing.
  Status stopChoice(uint64_t call_id, uint32_t index);

  LlmStats stats() const;
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
  std::thread thread_;
};

}  // namespace garden::tulip
