#include "services/tulip/llm/generate_request.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

namespace garden::tulip {
namespace {

// OK when every id of `ids` is in [0, vocab) (vocab 0: unknown, any id >= 0); else
// INVALID_ARGUMENT naming `field`[i].
Status checkIds(std::span<const int32_t> ids, uint32_t vocab, const char* field) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || (vocab > 0 && static_cast<uint32_t>(id) >= vocab)) {
      return invalidArgument(std::string(field) + "[" + std::to_string(i) + "]: token id " +
                             std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(vocab) + ")");
    }
  }
  return okStatus();
}

// A request that needs the worker's sampler state [TAG_LLM_SAMPLER_STATE] is refused here, alone,
// when the worker's sampler lacks it: rose refuses a whole step that asks for it, which would end
// every other sequence of that step. Fields are named as the OpenAI API names them (ivy reports
// them as the 400's param); the checks run after normalization (repetition_penalty 0 → 1).
Status checkSamplerCaps(const GenerateParams& p, const shm::ModelFacts& f) {
  if (p.constrained() && (f.llm_caps & shm::kLlmCapTokenMask) == 0) {  // [TAG_TOKEN_MASK]
    const size_t n = strnlen(f.sampler, sizeof(f.sampler));
    // [TAG_STRICT_TOOLS] strict tools alone are named as such (ivy reports the field).
    const std::string field = p.grammar != nullptr ? "response_format" : "tools";
    return invalidArgument(field + ": structured outputs are not supported by this "
                           "worker's sampler (" +
                           (n > 0 ? std::string(f.sampler, n) : std::string("unknown")) +
                           "): it does not implement token masks");
  }
  if ((f.llm_caps & shm::kLlmCapSamplerState) != 0) return okStatus();
  const llm::SamplingParams& s = p.sampling;
  const char* field = s.logprobs >= 0                ? "logprobs"
                      : s.min_p > 0.f                ? "min_p"
                      : s.presence_penalty != 0.f    ? "presence_penalty"
                      : s.frequency_penalty != 0.f   ? "frequency_penalty"
                      : s.repetition_penalty != 1.f  ? "repetition_penalty"
                      : !p.logit_bias.empty()        ? "logit_bias"
                                                     : nullptr;
  if (field == nullptr) return okStatus();
  const size_t n = strnlen(f.sampler, sizeof(f.sampler));
  return invalidArgument(std::string(field) + ": not supported by this worker's sampler (" +
                         (n > 0 ? std::string(f.sampler, n) : std::string("unknown")) +
                         "); logprobs, min_p, penalties and logit_bias need a worker whose "
                         "sampler keeps per-sequence state");
}

}  // namespace

uint32_t llmContextLength(const shm::ModelFacts& f) {
  // A sequence's blocks lie in one block group (rose --dp): it can use that group's only.
  const uint32_t groups = f.kv_block_groups > 1 ? f.kv_block_groups : 1;
  uint64_t len = uint64_t{f.kv_num_blocks / groups} * f.kv_block_size;
  if (f.max_seq_len > 0) len = std::min<uint64_t>(len, f.max_seq_len);
  return static_cast<uint32_t>(std::min<uint64_t>(len, UINT32_MAX));
}

Status validateGenerate(GenerateParams& p, const shm::ModelFacts& f) {
  if (std::string(f.kind, strnlen(f.kind, sizeof(f.kind))) != "llm")
    return failedPrecondition("the worker does not serve an LLM");
  if (f.kv_num_blocks == 0 || f.kv_block_size == 0)
    return failedPrecondition("the worker reported no KV cache");
  if (p.n < 1 || p.n > kMaxChoices)
    return invalidArgument("n: must be in [1, " + std::to_string(kMaxChoices) + "], got " +
                           std::to_string(p.n));
  const uint32_t max_len = llmContextLength(f);
  if (p.prompt.empty()) return invalidArgument("prompt_ids: at least one token is required");
  if (p.prompt.size() >= max_len) {
    return invalidArgument("prompt_ids: " + std::to_string(p.prompt.size()) +
                           " tokens, but the model's context is " + std::to_string(max_len) +
                           " tokens and the prompt must leave room for one generated token");
  }
  if (Status st = checkIds(p.prompt, f.vocab_size, "prompt_ids"); !st.isOk()) return st;
  if (Status st = checkIds(p.stop_token_ids, f.vocab_size, "stop_token_ids"); !st.isOk()) return st;
  llm::SamplingParams& s = p.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    return invalidArgument("sampling.temperature: must be a finite number >= 0 (0 = greedy)");
  if (s.top_p == 0) s.top_p = 1.f;  // proto3 default: off
  if (!(s.top_p > 0 && s.top_p <= 1))
    return invalidArgument("sampling.top_p: must be in (0, 1] (0 or 1 = off)");
  if (s.top_k < 0) return invalidArgument("sampling.top_k: must be >= 0 (0 = off)");
  if (!(s.min_p >= 0 && s.min_p <= 1)) return invalidArgument("sampling.min_p: must be in [0, 1]");
  if (!(s.presence_penalty >= -2 && s.presence_penalty <= 2))
    return invalidArgument("sampling.presence_penalty: must be in [-2, 2]");
  if (!(s.frequency_penalty >= -2 && s.frequency_penalty <= 2))
    return invalidArgument("sampling.frequency_penalty: must be in [-2, 2]");
  if (s.repetition_penalty == 0) s.repetition_penalty = 1.f;  // proto3 default: off
  if (!std::isfinite(s.repetition_penalty) || !(s.repetition_penalty > 0))
    return invalidArgument("sampling.repetition_penalty: must be a finite number > 0");
  if (s.logprobs < -1 || s.logprobs > llm::kMaxTopLogprobs) {
    return invalidArgument("sampling.top_logprobs: must be in [0, " +
                           std::to_string(llm::kMaxTopLogprobs) + "]");
  }
  if (p.logit_bias.size() > static_cast<size_t>(llm::kMaxLogitBias)) {
    return invalidArgument("sampling.logit_bias: " + std::to_string(p.logit_bias.size()) +
                           " entries, at most " + std::to_string(llm::kMaxLogitBias));
  }
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const LogitBiasEntry& b = p.logit_bias[i];
    const std::string field = "sampling.logit_bias[" + std::to_string(i) + "]";
    if (b.token_id < 0 || (f.vocab_size > 0 && static_cast<uint32_t>(b.token_id) >= f.vocab_size)) {
      return invalidArgument(field + ": token id " + std::to_string(b.token_id) +
                             " is outside the vocabulary [0, " + std::to_string(f.vocab_size) + ")");
    }
    if (!(b.bias >= -100 && b.bias <= 100))
      return invalidArgument(field + ": bias must be in [-100, 100]");
  }
  if (Status st = checkSamplerCaps(p, f); !st.isOk()) return st;
  s.state_slot = -1;  // the scheduler's
  return okStatus();
}

}  // namespace garden::tulip
