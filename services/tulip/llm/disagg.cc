#include "services/tulip/llm/disagg.h"

#include <string>
#include <utility>

#include "common/logging.h"

namespace garden::tulip {

DisaggLlm::DisaggLlm(LlmScheduler& prefill, Worker& prefill_worker, LlmScheduler& decode,
                     Worker& decode_worker)
    : prefill_(prefill),
      prefill_worker_(prefill_worker),
      decode_(decode),
      decode_worker_(decode_worker) {
  // The gauges are the pair's sums (publishGauges()), not whichever side published last.
  prefill_.setPublishGauges(false);
  decode_.setPublishGauges(false);
  prefill_.setHandoff([this](LlmHandoff h) {
    Status st = decode_.adopt(h);  // moves h into the decode side's queue when it takes it
    if (st.isOk()) return;
    // Shutting down: the stream ends here and the prefill side frees the blocks.
    if (h.req->on_event) {
      h.req->on_event(handoffLastEvent(h.seq, st, FinishReason::kNone, shm::monotonicNowNs()));
    }
    if (h.release) h.release();
  });
}

Status DisaggLlm::submit(std::shared_ptr<LlmRequest> req) {
  if (prefill_worker_.ready()) {
    const shm::ModelFacts pf = prefill_worker_.facts();
    if (pf.kv_export[0] == '\0') {
      return failedPrecondition("the prefill worker does not export its KV cache (rose "
                                "--kv-export): it cannot hand sequences to the decode worker");
    }
  }
  if (decode_worker_.ready() && (decode_worker_.facts().llm_caps & shm::kLlmCapKvPull) == 0) {
    return failedPrecondition("the decode worker does not take kv pulls (its backend: " +
                              std::string(decode_worker_.facts().sampler) + ")");
  }
  if (!decode_worker_.ready()) return workerDown(decode_worker_);
  RETURN_IF_ERROR(prefill_.submit(req));
  if (req->call_id != 0) {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = calls_.begin(); it != calls_.end();) {
      it = it->second.expired() ? calls_.erase(it) : std::next(it);
    }
    calls_[req->call_id] = req;
  }
  return okStatus();
}

void DisaggLlm::cancel(const std::shared_ptr<LlmRequest>& req) {
  req->cancelled = true;
  prefill_.poke();
  decode_.poke();
}

Status DisaggLlm::stopChoice(uint64_t call_id, uint32_t index) {
  std::shared_ptr<LlmRequest> req;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = calls_.find(call_id);
    if (call_id != 0 && it != calls_.end()) req = it->second.lock();
  }
  if (!req) return notFound("call " + std::to_string(call_id) + " is not running here");
  const uint32_t n = std::max<uint32_t>(req->params.n, 1);
  if (index >= n) {
    return invalidArgument("index: the call has " + std::to_string(n) + " choices, got " +
                           std::to_string(index));
  }
  req->stopped_choices.fetch_or(1u << index);
  prefill_.poke();
  decode_.poke();
  return okStatus();
}

LlmStats DisaggLlm::stats() const { return addLlmStats(prefill_.stats(), decode_.stats()); }

void DisaggLlm::publishGauges() const { publishLlmGauges(stats()); }

LlmStats addLlmStats(const LlmStats& a, const LlmStats& b) {
  LlmStats s;
  s.running = a.running + b.running;
  s.waiting = a.waiting + b.waiting;
  s.waiting_tokens = a.waiting_tokens + b.waiting_tokens;
  s.inflight_tokens = a.inflight_tokens + b.inflight_tokens;
  s.inflight_steps = a.inflight_steps + b.inflight_steps;
  s.max_waiting_tokens = a.max_waiting_tokens;
  s.kv_free_blocks = a.kv_free_blocks + b.kv_free_blocks;
  s.kv_used_blocks = a.kv_used_blocks + b.kv_used_blocks;
  s.kv_total_blocks = a.kv_total_blocks + b.kv_total_blocks;
  s.kv_window_free_blocks = a.kv_window_free_blocks + b.kv_window_free_blocks;
  s.kv_window_used_blocks = a.kv_window_used_blocks + b.kv_window_used_blocks;
  s.kv_window_total_blocks = a.kv_window_total_blocks + b.kv_window_total_blocks;
  s.preemptions = a.preemptions + b.preemptions;
  s.cached_prompt_tokens = a.cached_prompt_tokens + b.cached_prompt_tokens;
  s.shared_prompt_tokens = a.shared_prompt_tokens + b.shared_prompt_tokens;
  s.computed_prompt_tokens = a.computed_prompt_tokens + b.computed_prompt_tokens;
  s.queried_prompt_tokens = a.queried_prompt_tokens + b.queried_prompt_tokens;
  s.dp_prefix_forgone = a.dp_prefix_forgone + b.dp_prefix_forgone;
  s.generated_tokens = a.generated_tokens + b.generated_tokens;
  s.steps = a.steps + b.steps;
  s.masked_steps = a.masked_steps + b.masked_steps;
  s.masks = a.masks + b.masks;
  s.mask_fill_ns = a.mask_fill_ns + b.mask_fill_ns;
  s.late_mask_steps = a.late_mask_steps + b.late_mask_steps;
  return s;
}

}  // namespace garden::tulip
