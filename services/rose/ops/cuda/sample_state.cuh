#pragma once
// The GPU side of the sampler contract beyond temperature / top-k / top-p [TAG_LLM_SAMPLER_STATE]
// [TAG_SAMPLER_ORDER] (the CPU reference is services/rose/ops/sampler.h; min_p lives in
// sample.cu's draw). CudaLlmOps::sample() runs these around launchSample when a row has a state
// slot or asks for logprobs (eager steps only: CUDA-graph decode takes plain sampling only):
//
//   launchApplySamplerState: for each row with a slot, every entry the slot holds (sparse: the
//     tokens of its prompt, its generated tokens and its logit_bias ids) rewrites that token's
//     logit IN PLACE, bit for bit as SamplerSlot::apply (bias, repetition, frequency/presence;
//     rounded float ops, no contraction), keeping the raw value in the entry;
//   launchSample (sample.cuh) then draws from the adjusted logits (greedy included);
//   launchRestoreAndCount: puts the raw logits back and adds each row's sampled token to its
//     slot (count + 1, or a new entry), so the logits returned to the caller are the raw ones;
//   launchLogprobs: for each row, the log-softmax of the RAW logits (max-shifted, the sum in
//     float64, NaN excluded) at the sampled token and the top-N (N <= 20: N block-wide argmax
//     rounds, highest first, ties lower id first), one llm::LlmTokenLogprobs per row (num_top -1
//     and zeros where the row did not ask), as computeLogprobs() writes them.
//
// A slot's entries: capacity distinct ids, size in sizes[slot]; the host (resetSamplerState)
// builds them deduplicated from a reload. Rows with a slot must name distinct logits rows and
// distinct slots (the caller checks). Pointers are device memory owned by the caller.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/llm/step.h"
#include "common/status.h"

namespace garden::rose::cuda {

inline constexpr uint32_t kSamplerPromptBit = 0x80000000u;
struct SamplerEntryDev {
  int32_t id = 0;
  uint32_t count = 0;  // kSamplerPromptBit: in the prompt; the rest: generated occurrences
  float bias = 0.f;    // logit_bias (0: none)
  float saved = 0.f;   // the raw logit launchApplySamplerState overwrote
};
static_assert(sizeof(SamplerEntryDev) == 16);

struct StateRowDev {
  int32_t row = 0;    // logits row
  int32_t slot = -1;  // -1: no state
  float repetition_penalty = 1.f;
  float frequency_penalty = 0.f;
  float presence_penalty = 0.f;
  int32_t logprobs = -1;  // top-N; -1: none
};
static_assert(sizeof(StateRowDev) == 24);

struct SamplerStateArgs {
  float* logits = nullptr;             // [R, V]
  const StateRowDev* rows = nullptr;   // [num_rows]
  int32_t num_rows = 0;
  int64_t vocab = 0;
  SamplerEntryDev* entries = nullptr;  // [slots, capacity]
  int32_t* sizes = nullptr;            // [slots]
  int64_t capacity = 0;
  const int32_t* sampled = nullptr;    // [num_rows]: launchRestoreAndCount, launchLogprobs
  llm::LlmTokenLogprobs* logprobs = nullptr;  // [num_rows]: launchLogprobs
};

Status launchApplySamplerState(const SamplerStateArgs& a, cudaStream_t stream);
Status launchRestoreAndCount(const SamplerStateArgs& a, cudaStream_t stream);
Status launchLogprobs(const SamplerStateArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
