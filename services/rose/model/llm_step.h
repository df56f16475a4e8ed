#pragma once
// The LLM step descriptor: what one forward step of a decoder (gpt-oss) is asked to do, as plain
// data. tulip's scheduler owns KV block allocation; per step it hands rose, for each sequence,
// its new token ids, its position offset (tokens already in the KV cache), its block table
// (block ids, in order) and what it wants back (logits and/or one sampled token). Everything
// here is trivially copyable and pointer-free apart from the spans of LlmStep, whose arrays
// are flat (offsets into shared token / block arrays), so the shm batch format can carry the
// same three arrays verbatim [TAG_LLM_STEP_FORMAT].
//
// Semantics:
//   - sequence s owns tokens[token_offset, token_offset + num_tokens) and
//     block_ids[block_offset, block_offset + num_blocks);
//   - its new tokens take absolute positions position .. position + num_tokens - 1; the KV of
//     positions < position is already in the cache (written by earlier steps through the same
//     block table); block_ids must cover position + num_tokens tokens;
//   - logits: kNone, kLast (the last new token's row) or kAll (every new token's row);
//   - sample != 0: one token is drawn from the last new token's logits with `sampling`; the
//     random stream is counter-based: (seed, position + num_tokens) → the same draw whatever
//     the batch, chunking or step the sequence is in.
//
// The POD types live in common/llm/step.h (tulip builds them too).
//
// Threads: plain value types.

#include <cstdint>
#include <functional>
#include <span>

#include "common/llm/step.h"

namespace garden::rose {

using llm::LlmStepSeq;
using llm::LogitsMode;
using llm::SamplingParams;

// A view of one step's three flat arrays (host memory).
struct LlmStep {
  std::span<const LlmStepSeq> seqs;
  std::span<const int32_t> tokens;
  std::span<const int32_t> block_ids;
  std::span<const int32_t> state;  // sampler-state words [TAG_LLM_SAMPLER_STATE]
  // Token bitmasks [TAG_TOKEN_MASK]: mask k (LlmStepSeq.mask_index k + 1) is
  // masks[k * mask_words, (k + 1) * mask_words).
  std::span<const uint32_t> masks;
  int64_t mask_words = 0;
  // Late masks [TAG_LATE_MASKS]: when set, `masks` is sized but filled only by this call, which
  // the model makes after the forward pass and before it samples (it may block until tulip has
  // written them). It returns false when they never came (the step then samples with every
  // token allowed where a mask was asked for; tulip discards those draws).
  std::function<bool()> await_masks;
};

// Rows of logits a step returns, in sequence order: num_tokens for kAll, 1 for kLast, 0 else.
inline int64_t logitsRows(const LlmStep& step) {
  int64_t rows = 0;
  for (const LlmStepSeq& s : step.seqs) {
    rows += s.logits == LogitsMode::kAll ? s.num_tokens : (s.logits == LogitsMode::kLast ? 1 : 0);
  }
  return rows;
}

}  // namespace garden::rose
