#pragma once
// What tulip's gRPC service needs of LLM generation: one LlmScheduler (one rose worker), or a
// prefill/decode pair (DisaggLlm, disagg.h) behind the same calls.
//
// Threads: every method from any thread.

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "services/tulip/llm/step_scheduler.h"

namespace garden::tulip {

struct LlmRequest;

class LlmFrontend {
 public:
  virtual ~LlmFrontend() = default;
  // LlmScheduler::submit: validates and admits, or returns the error without any event.
  virtual Status submit(std::shared_ptr<LlmRequest> req) = 0;
  // Ends the request with FINISH_CANCELLED.
  virtual void cancel(const std::shared_ptr<LlmRequest>& req) = 0;
  // LlmScheduler::stopChoice [TAG_STOP_CHOICE].
  virtual Status stopChoice(uint64_t call_id, uint32_t index) = 0;
  virtual LlmStats stats() const = 0;
};

}  // namespace garden::tulip
