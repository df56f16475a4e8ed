#pragma once
// Token sampling on the host, shared by the CPU LlmOps and tests: greedy, temperature, top-k,
// top-p, with a per-sequence counter-based random stream so a draw depends only on
// (seed, counter, logits, params), never on the batch or the order of calls.
//
// Procedure (matches the usual temperature → top-k → top-p order of HF / vLLM):
//   temperature == 0: argmax (lowest id among equal maxima). Otherwise z = logits / T; candidates
//   sorted by z descending (ties: lower id first); top_k > 0 keeps the first k; probabilities are
//   the softmax over the kept candidates (float64); top_p < 1 keeps the shortest prefix whose
//   probability mass reaches top_p (at least one token) and renormalizes; then u =
//   uniform(seed, counter) ∈ [0, 1) picks the first candidate whose cumulative probability
//   exceeds u. NaN logits never win (treated as −inf).
//
// Threads: pure functions; a Sampler holds scratch space and is used by one thread at a time.

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/status.h"
#include "services/rose/model/llm_step.h"

namespace garden::rose {

// INVALID_ARGUMENT naming the field: temperature finite and >= 0; top_p in (0, 1]; top_k >= 0.
Status validateSamplingParams(const SamplingParams& p);

// The counter-based stream: a 64-bit mix of (seed, counter) (SplitMix64 finalizer, two rounds)
// turned into a double in [0, 1) with 53 random bits.
uint64_t mixCounter(uint64_t seed, uint64_t counter);
double uniformFromCounter(uint64_t seed, uint64_t counter);

class Sampler {
 public:
  // One draw. logits must be non-empty.
  int32_t sample(std::span<const float> logits, const SamplingParams& p, uint64_t counter);
  // The distribution sample() draws from (temperature > 0): (token id, probability) in draw
  // order. For tests.
  const std::vector<std::pair<int32_t, double>>& distribution(std::span<const float> logits,
                                                              const SamplingParams& p);

 private:
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<std::pair<int32_t, double>> dist_;
};

// argmax with the lowest id among equal maxima; NaN never wins (all NaN: 0).
int32_t argmaxToken(std::span<const float> logits);

// Structured outputs [TAG_TOKEN_MASK]: logits[i] = -inf where bit i of `mask` (word i / 32) is
// clear. Returns the lowest allowed id (-1: none), the draw when every allowed logit is -inf/NaN.
int32_t applyTokenBitmask(std::span<float> logits, const uint32_t* mask);
inline bool tokenAllowed(const uint32_t* mask, int32_t id) {
  return mask == nullptr || ((mask[static_cast<uint32_t>(id) / 32] >> (id % 32)) & 1u) != 0;
}

}  // namespace garden::rose
