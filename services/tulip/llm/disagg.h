#pragma once
// DisaggLlm: prefill/decode disaggregation [TAG_DISAGG] (docs/multi-gpu.md) — generation over
// two rose workers, behind the LlmFrontend calls the gRPC service makes. Requests go to the
// prefill scheduler (a worker whose KV cache is exported, rose --kv-export), which runs their
// prompts (chunked, prefix cache, choices as usual) and samples the first token; every sequence
// that does not end there is handed to the decode scheduler, which copies its KV blocks out of
// the prefill worker's export into its own cache (a kKvPull batch on the decode worker), frees
// them on the prefill side once copied and streams the rest. A request's events thus come from
// the prefill scheduler's thread (the first token) and then the decode scheduler's (the rest),
// in order, each stream's last event exactly once.
//
// cancel() and stopChoice() reach a sequence wherever it is (queued, prefilling, being copied or
// decoding) through the request object (LlmRequest::cancelled / stopped_choices); stats() adds
// the two sides up.
//
// Threads: any thread. The two schedulers must outlive this object, and their stop() must not
// run before this object's last use.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "services/tulip/llm/llm_frontend.h"
#include "services/tulip/llm/llm_scheduler.h"
#include "services/tulip/worker/worker.h"

namespace garden::tulip {

class DisaggLlm final : public LlmFrontend {
 public:
  // `prefill` must have been made with LlmSchedulerOptions::handoff (this sets its handoff
  // target to `decode`).
  DisaggLlm(LlmScheduler& prefill, Worker& prefill_worker, LlmScheduler& decode,
            Worker& decode_worker);

  // FAILED_PRECONDITION when the prefill worker exports no KV cache or the decode worker takes
  // no kv pulls (naming which); otherwise the prefill scheduler's answer.
  Status submit(std::shared_ptr<LlmRequest> req) override;
  void cancel(const std::shared_ptr<LlmRequest>& req) override;
  // NOT_FOUND when no running call has that id; INVALID_ARGUMENT for index >= n; OK otherwise
  // (also when that choice already ended).
  Status stopChoice(uint64_t call_id, uint32_t index) override;
  LlmStats stats() const override;
  // Sets the LLM gauges to the two sides' sums (the schedulers leave them alone); the owner
  // calls it periodically.
  void publishGauges() const;

 private:
  LlmScheduler& prefill_;
  Worker& prefill_worker_;
  LlmScheduler& decode_;
  Worker& decode_worker_;
  std::mutex mu_;
  // Calls with several choices, by call id (entries whose request is gone are dropped lazily).
  std::map<uint64_t, std::weak_ptr<LlmRequest>> calls_;
};

// The sum of two schedulers' stats (gauges and counters alike).
LlmStats addLlmStats(const LlmStats& a, const LlmStats& b);

}  // namespace garden::tulip
