#pragma once
// Token sampling on the host, shared by the CPU LlmOps and tests: greedy, temperature, min-p,
// top-k, top-p, logit_bias and the OpenAI / vLLM penalties, with a per-sequence counter-based
// random stream so a draw depends only on (seed, counter, logits, params, the sequence's state),
// never on the batch or the order of calls; and logprobs.
//
// Procedure [TAG_SAMPLER_ORDER] (vLLM v1's order):
//   w = logits; with a SamplerSlot: w[t] += logit_bias[t]; then for every token t seen (in the
//   prompt or generated): repetition_penalty r: w > 0 ? w / r : w * r; then w[t] -=
//   frequency_penalty * count[t] + presence_penalty * (count[t] > 0), count = generated
//   occurrences. Only the tokens the slot holds are touched (sparse).
//   temperature == 0: argmax of w (lowest id among equal maxima). Otherwise z = w / T; candidates
//   sorted by z descending (ties: lower id first); min_p > 0 keeps those with z - z_max >=
//   log(min_p) (p >= min_p * p_max); top_k > 0 keeps the first k; probabilities are
//   the softmax over the kept candidates (float64); top_p < 1 keeps the shortest prefix whose
//   probability mass reaches top_p (at least one token) and renormalizes; then u =
//   uniform(seed, counter) ∈ [0, 1) picks the first candidate whose cumulative probability
//   exceeds u. NaN logits never win (treated as −inf).
//   With a token mask [TAG_TOKEN_MASK] (structured outputs), after bias and penalties and before
//   temperature: w[t] = -inf for every t the mask does not allow; if every allowed w is -inf or
//   NaN, the draw is the lowest allowed id.
//   Then the drawn token joins the slot's generated counts; logprobs (when asked) are
//   logits[i] − logsumexp(logits) over the RAW logits (max-shifted, the sum in float64, NaN
//   excluded), reported in fp32.
//
// Threads: pure functions; a Sampler holds scratch space and is used by one thread at a time.

#include <cstdint>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "services/rose/model/llm_step.h"

namespace garden::rose {

// INVALID_ARGUMENT naming the field: temperature finite and >= 0; top_p in (0, 1]; top_k >= 0;
// min_p in [0, 1]; presence_penalty / frequency_penalty in [-2, 2]; repetition_penalty finite
// and > 0; logprobs in [-1, kMaxTopLogprobs]; state_slot >= -1 and >= 0 when a penalty is on.
Status validateSamplingParams(const SamplingParams& p);

// One logit_bias entry (the shm state array carries them as two int32 words: id, float bits).
struct LogitBias {  // trivial (no initializers): copied from the shm words with memcpy
  int32_t id;
  float bias;
};
static_assert(sizeof(LogitBias) == 8 && std::is_trivial_v<LogitBias>);

// The per-sequence state of [TAG_LLM_SAMPLER_STATE]: the tokens seen (prompt membership and
// generated counts) and the logit_bias, sparse over the tokens it names.
class SamplerSlot {
 public:
  // Forgets everything, then loads the prompt tokens, the generated tokens (each occurrence
  // counts) and the bias entries (a later entry for the same id wins).
  void reset(std::span<const int32_t> prompt, std::span<const int32_t> output,
             std::span<const LogitBias> bias);
  void addOutput(int32_t token) { ++seen_[token].output; }
  // Bias, then the penalties of `p` (see the header comment) on w, over the tokens held. Ids
  // outside w are skipped (callers validate them against the vocabulary).
  void apply(std::span<float> w, const SamplingParams& p) const;
  // True when apply() can change anything with `p`.
  bool active(const SamplingParams& p) const {
    return !seen_.empty() && (has_bias_ || llm::needsPenaltyState(p));
  }
  uint32_t outputCount(int32_t t) const {
    auto it = seen_.find(t);
    return it == seen_.end() ? 0 : it->second.output;
  }
  size_t size() const { return seen_.size(); }

 private:
  struct Entry {
    uint32_t output = 0;
    bool prompt = false;
    bool has_bias = false;
    float bias = 0.f;
  };
  std::unordered_map<int32_t, Entry> seen_;
  bool has_bias_ = false;
};

// The log-softmax of the raw `logits` at `sampled` and the n most likely tokens (highest first,
// ties: lower id first; n <= logits.size()) into *out (num_top = n). See the header comment.
void computeLogprobs(std::span<const float> logits, int32_t n, int32_t sampled,
                     llm::LlmTokenLogprobs* out);

// The counter-based stream: a 64-bit mix of (seed, counter) (SplitMix64 finalizer, two rounds)
// turned into a double in [0, 1) with 53 random bits.
uint64_t mixCounter(uint64_t seed, uint64_t counter);
double uniformFromCounter(uint64_t seed, uint64_t counter);

class Sampler {
 public:
  // One draw. logits must be non-empty.
  int32_t sample(std::span<const float> logits, const SamplingParams& p, uint64_t counter);
  // The whole procedure: `slot` (may be null: no bias, no penalties) adjusts the logits and
  // counts the drawn token; `lp` (may be null) receives the logprobs when p.logprobs >= 0 (of
  // the raw logits: neither bias, penalties nor the mask change them); `mask` (may be null,
  // ceil(V / 32) words) restricts the draw to the ids it allows.
  int32_t sample(std::span<const float> logits, const SamplingParams& p, uint64_t counter,
                 SamplerSlot* slot, llm::LlmTokenLogprobs* lp, const uint32_t* mask = nullptr);
  // The distribution sample() draws from (temperature > 0): (token id, probability) in draw
  // order. For tests.
  const std::vector<std::pair<int32_t, double>>& distribution(std::span<const float> logits,
                                                              const SamplingParams& p);

 private:
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<std::pair<int32_t, double>> dist_;
  std::vector<uint64_t> order_, order_tmp_;  // [TAG_SAMPLER_RADIX] scratch of the draw order
  std::vector<float> w_;  // logits adjusted by a slot and/or a mask
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
