#pragma once
// The shm format of one LLM step (BatchKind::kGenerate) [TAG_LLM_STEP_FORMAT].
//
// Input (the slot's input arena; offsets in the BatchDesc, each 8-byte aligned):
//   seqs_offset:   llm::LlmStepSeq x num_seqs  (token_offset / block_offset index the arrays below)
//   tokens_offset: int32 token ids x num_tokens
//   blocks_offset: int32 KV block ids x num_blocks
//   state_offset:  int32 sampler-state words x num_state (LlmStepSeq.state_offset indexes them;
//                  [TAG_LLM_SAMPLER_STATE]); num_state 0: none
//   seqlens_offset: uint32 token bitmasks x (the largest LlmStepSeq.mask_index), each
//                  llmMaskWords(vocab) words [TAG_TOKEN_MASK] (structured outputs; absent when
//                  no sequence has a mask_index)
// BatchDesc.num_tokens must equal the sum of the sequences' num_tokens.
// Block ids index the paged KV cache rose announced in ModelFacts (kv_num_blocks blocks of
// kv_block_size tokens); tulip owns allocation, rose only reads and writes the blocks it is told.
//
// Limits (rose answers INVALID_ARGUMENT naming the field, before anything runs):
//   num_seqs <= ModelFacts.max_seqs, num_tokens <= ModelFacts.max_batch_tokens,
//   position + num_tokens <= ModelFacts.max_seq_len per sequence, every block id in
//   [0, kv_num_blocks), num_blocks <= max_seqs * ceil(max_seq_len / kv_block_size), and
//   LlmStepSeq.logits == kNone (logits never cross the channel).
//
// Output (the slot's output arena, offset 0): int32 sampled token ids, one per sequence with
// sample != 0, in sequence order. Completion.rows = that count, cols = 1, output_bytes = 4*rows
// (a step where no sequence samples, e.g. a prefill chunk, completes with rows = 0). When a
// sampling sequence of the step asks for logprobs (SamplingParams.logprobs >= 0), the ids are
// followed (at byte 4*rows) by one llm::LlmTokenLogprobs per sampled id, in the same order
// (num_top = -1 for those that did not ask), and cols = kLlmLogprobsCols (output_bytes =
// 4*rows*cols).
// A step that fails validation is answered INVALID_ARGUMENT with nothing written to the KV
// cache; an expired deadline DEADLINE_EXCEEDED, not run; a batch of another kind sent to an
// llm worker INVALID_ARGUMENT.
//
// Threads: plain functions over caller-owned memory.

#include <cstdint>
#include <span>

#include "common/llm/step.h"
#include "common/shm/channel.h"

namespace garden::shm {

inline constexpr uint64_t kLlmAlign = 8;
inline uint64_t llmAlignUp(uint64_t v) { return (v + kLlmAlign - 1) & ~(kLlmAlign - 1); }

// Bytes of input arena a step needs.
inline uint64_t llmStepBytes(uint64_t num_seqs, uint64_t num_tokens, uint64_t num_blocks,
                             uint64_t num_state = 0) {
  return llmAlignUp(num_seqs * sizeof(llm::LlmStepSeq)) + llmAlignUp(num_tokens * 4) +
         llmAlignUp(num_blocks * 4) + llmAlignUp(num_state * 4);
}

// Words of one token bitmask (bit id % 32 of word id / 32, 1 = allowed) [TAG_TOKEN_MASK].
inline uint64_t llmMaskWords(uint64_t vocab) { return (vocab + 31) / 32; }
inline uint64_t llmMaskBytes(uint64_t num_masks, uint64_t vocab) {
  return llmAlignUp(num_masks * llmMaskWords(vocab) * 4);
}

// Completion.cols of a step result that carries logprobs: the id plus one LlmTokenLogprobs,
// in 4-byte words.
inline constexpr uint32_t kLlmLogprobsCols = 1 + sizeof(llm::LlmTokenLogprobs) / 4;
static_assert(sizeof(llm::LlmTokenLogprobs) % 4 == 0);

}  // namespace garden::shm
