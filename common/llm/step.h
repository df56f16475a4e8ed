#pragma once
// The plain-data part of an LLM step (one forward pass of a decoder such as gpt-oss), shared by
// tulip (which builds steps: its scheduler owns KV block allocation) and rose (which runs them).
// Everything here is trivially copyable and pointer-free so the shm batch format
// (common/shm/llm_batch.h) carries the arrays verbatim [TAG_LLM_STEP_FORMAT].
// services/rose/model/llm_step.h documents the semantics and adds the host view (LlmStep).
//
// Threads: plain value types.

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace garden::llm {

// temperature 0 = greedy (argmax, lowest id on ties). top_k 0 = off, top_p 1 = off, min_p 0 = off.
// Order of application [TAG_SAMPLER_ORDER] (vLLM v1's): logit_bias → repetition_penalty →
// frequency/presence penalties → token mask (structured outputs, LlmStepSeq.mask_index: -inf
// outside the allowed set) → temperature → min_p → top-k → top-p → draw. The first three
// need per-sequence state in the worker (state_slot, see [TAG_LLM_SAMPLER_STATE]).
// logprobs >= 0: the worker also returns the sampled token's log-probability and the `logprobs`
// most likely tokens, all from an fp32 log-softmax of the RAW logits (before bias, penalties,
// the token mask and temperature; vLLM's default "raw_logprobs" without the grammar bitmask,
// which vLLM applies before its sampler).
inline constexpr int32_t kMaxTopLogprobs = 20;
inline constexpr int32_t kMaxLogitBias = 1024;  // logit_bias entries per sequence
struct SamplingParams {
  float temperature = 0.f;
  float top_p = 1.f;
  int32_t top_k = 0;
  float min_p = 0.f;  // keep tokens with p >= min_p * p_max (after temperature)
  uint64_t seed = 0;
  // OpenAI: logit -= frequency_penalty * count + presence_penalty * (count > 0), count = times
  // the token was generated so far. vLLM: repetition_penalty r over prompt + generated tokens:
  // a positive logit is divided by r, a negative one multiplied.
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  float repetition_penalty = 1.f;  // 1 = off
  int32_t logprobs = -1;           // -1: none; 0..kMaxTopLogprobs top entries besides the sampled
  // The worker-side sampler state of this sequence (its generated-token counts, prompt tokens and
  // logit_bias) [TAG_LLM_SAMPLER_STATE]; -1: none. Required when a penalty is on or the state
  // carries a logit_bias.
  int32_t state_slot = -1;
  int32_t reserved = 0;
};
static_assert(sizeof(SamplingParams) == 48);

// True when sampling with `p` reads per-sequence state (penalties).
inline bool needsPenaltyState(const SamplingParams& p) {
  return p.presence_penalty != 0.f || p.frequency_penalty != 0.f || p.repetition_penalty != 1.f;
}

enum class LogitsMode : uint8_t { kNone = 0, kLast = 1, kAll = 2 };

// Sequence s of a step owns tokens[token_offset, token_offset + num_tokens) and
// block_ids[block_offset, block_offset + num_blocks); its new tokens take absolute positions
// position .. position + num_tokens - 1 (the KV of earlier positions is already cached through
// the same block table, which must cover position + num_tokens tokens). sample != 0: one token
// is drawn from the last new token's logits with `sampling`, RNG counter = position + num_tokens.
//
// Two steps in flight [TAG_LLM_PREV_TOKEN]: a scheduler may submit step N+1 before it has seen
// step N's sampled ids. A sequence that continues from a token step N samples sets prev_row to
// that token's row in step N's sampled output (its index among the sequences of step N with
// sample != 0); the worker then takes the sequence's FIRST new token from there instead of
// tokens[token_offset] (whose value is ignored; write -1). "Step N" is the last step the worker
// ran (a step it refused does not count: a scheduler that sees a refusal fails what it has in
// flight); prev_row must be < the number of ids step N sampled. -1: none.
struct LlmStepSeq {
  int32_t token_offset = 0;
  int32_t num_tokens = 0;
  int32_t position = 0;  // tokens already in the KV cache
  int32_t block_offset = 0;
  int32_t num_blocks = 0;
  LogitsMode logits = LogitsMode::kNone;
  uint8_t sample = 0;
  // [TAG_KV_WINDOW_GROUP] 1: the worker keeps its sliding-window layers in a pool of their own
  // (ModelFacts kv_num_blocks_window) and this sequence's window table follows its block table:
  // block_ids[block_offset + num_blocks, block_offset + 2 * num_blocks), ids of that pool, -1
  // where the window has dropped a block (every block holding a position a sliding layer of
  // this step reads or writes, position - window + 1 .. position + num_tokens - 1, is present).
  // Required (1) exactly when the worker announced a window pool; else 0.
  uint8_t window_table = 0;
  uint8_t reserved = 0;
  SamplingParams sampling;
  int32_t prev_row = -1;  // see [TAG_LLM_PREV_TOKEN]
  // Structured outputs [TAG_TOKEN_MASK]: k > 0 = the draw is restricted to the tokens set in
  // token bitmask k - 1 of the step (bit id % 32 of word id / 32; needs sample != 0). 0: none.
  int32_t mask_index = 0;
  // [TAG_LLM_SAMPLER_STATE] state_offset >= 0: before anything of this step samples, the worker
  // (re)loads slot sampling.state_slot from the step's int32 state array at state_offset:
  // state_prompt prompt token ids, then state_output generated token ids (each occurrence counts),
  // then state_bias (token id, float bits of the bias) pairs. Afterwards the worker itself adds
  // every token it samples for the slot, so a scheduler sends the state once per admission of a
  // sequence (and again after a preemption), never per step; tokens sampled by a step in flight
  // are counted without the scheduler knowing them [TAG_LLM_PREV_TOKEN]. A slot belongs to one
  // sequence of a step at most. -1: no reload.
  int32_t state_offset = -1;
  int32_t state_prompt = 0;
  int32_t state_output = 0;
  int32_t state_bias = 0;
};
static_assert(std::is_trivially_copyable_v<LlmStepSeq>);
static_assert(std::is_standard_layout_v<LlmStepSeq>);
static_assert(sizeof(LlmStepSeq) == 96);
static_assert(offsetof(LlmStepSeq, mask_index) == 76 && offsetof(LlmStepSeq, state_offset) == 80);
static_assert(offsetof(LlmStepSeq, window_table) == 22);

// What the worker returns per sampled sequence when the step asks for logprobs
// (SamplingParams.logprobs >= 0 on any sampling sequence; common/shm/llm_batch.h): the sampled
// token's log-probability and the num_top most likely tokens (highest first, ties: lower id
// first) with theirs. num_top = -1 for a sequence that did not ask.
struct LlmTokenLogprobs {
  float logprob = 0.f;
  int32_t num_top = -1;
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};
static_assert(sizeof(LlmTokenLogprobs) == 168);
static_assert(std::is_trivially_copyable_v<LlmTokenLogprobs>);

}  // namespace garden::llm
