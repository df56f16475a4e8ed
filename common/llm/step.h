#pragma once
// The plain-data part of an LLM step (one forward pass of a decoder such as gpt-oss), shared by
// tulip (which builds steps: its scheduler owns KV block allocation) and rose (which runs them).
// Everything here is trivially copyable and pointer-free so the shm batch format
// (common/shm/llm_batch.h) carries the arrays verbatim [TAG_LLM_STEP_FORMAT].
// services/rose/model/llm_step.h documents the semantics and adds the host view (LlmStep).
//
// Threads: plain value types.

#include <cstdint>
#include <type_traits>

namespace garden::llm {

// temperature 0 = greedy (argmax, lowest id on ties). top_k 0 = off, top_p 1 = off.
// Order of application: temperature → top-k → top-p → draw.
struct SamplingParams {
  float temperature = 0.f;
  float top_p = 1.f;
  int32_t top_k = 0;
  int32_t reserved = 0;
  uint64_t seed = 0;
};

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
  uint8_t reserved[2] = {0, 0};
  SamplingParams sampling;
  int32_t prev_row = -1;  // see [TAG_LLM_PREV_TOKEN]
  // Structured outputs [TAG_TOKEN_MASK]: k > 0 = the draw is restricted to the tokens set in
  // token bitmask k - 1 of the step (bit id % 32 of word id / 32; needs sample != 0). 0: none.
  int32_t mask_index = 0;
};
static_assert(std::is_trivially_copyable_v<LlmStepSeq>);
static_assert(std::is_standard_layout_v<LlmStepSeq>);
static_assert(sizeof(LlmStepSeq) == 56);

}  // namespace garden::llm
