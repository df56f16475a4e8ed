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
//                  no sequence has a mask_index); with BatchDesc.flags & kBatchLateMasks
//                  the masks follow an 8-byte header and arrive late (below)
// BatchDesc.num_tokens must equal the sum of the sequences' num_tokens.
// Block ids index the paged KV cache rose announced in ModelFacts (kv_num_blocks blocks of
// kv_block_size tokens); tulip owns allocation, rose only reads and writes the blocks it is told.
// With a window pool (ModelFacts.kv_num_blocks_window > 0) every sequence's window table follows
// its block table in the same array (LlmStepSeq.window_table) [TAG_KV_WINDOW_GROUP].
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
// Late token masks [TAG_LATE_MASKS] (BatchDesc.flags & kBatchLateMasks, to a worker that
// announces kLlmCapLateMask): the region at seqlens_offset is a ready word (uint32), 4 bytes of
// padding, then the masks as above. A constrained sequence's next mask depends on the token the
// step before samples, but the step's forward pass does not need it: tulip submits the step with
// the word pending and the masks unwritten, writes them once the step before has returned its
// tokens and calls publishLateMasks(); rose takes everything else at admission as usual, runs
// the forward pass and waits (awaitLateMasks) only before it samples. The word moves once:
// pending -> ready (tulip, after writing the masks) or pending -> abandoned (rose, after waiting
// `timeout`: it samples that step without the masks, and tulip, whose publish then fails, ends
// the step's constrained sequences with an error).
//
// KV pull [TAG_KV_PULL] (BatchKind::kKvPull, to a worker announcing kLlmCapKvPull): prefill/
// decode disaggregation's handoff. Input: one KvPullDesc at seqs_offset, then int32 (src, dst)
// block-id pairs at blocks_offset — num_pairs pairs of the full pool, then num_window_pairs of the
// window pool (ModelFacts.kv_num_blocks_window; 0 without one); BatchDesc.num_blocks =
// 2 * (num_pairs + num_window_pairs), num_seqs = num_tokens = 0. The worker copies block src of
// the exported cache `source` (another worker's ModelFacts.kv_export, written by process
// source_pid) into its own block dst, every layer of that pool, K and V. The completion (rows =
// 0) comes once the copy is done: the source blocks may be reused from then on, and the
// destination blocks hold what the source held when the pull was submitted (tulip submits it
// only after the source's last write to them completed). Refused with INVALID_ARGUMENT naming the
// pair or field (an id out of range, a destination written twice, shapes or dtypes that differ),
// FAILED_PRECONDITION when no export `source` of process source_pid exists (never made, or
// re-created by a restarted worker: its blocks are gone) or when it lives in the other kind of
// memory (a cpu worker's host pools vs a cuda worker's device pools [TAG_KV_PULL_CUDA]). Nothing
// is copied when refused.
//
// Threads: plain functions over caller-owned memory; the late-mask word is shared by the two
// processes (atomic, futex).

#include <chrono>
#include <cstddef>
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

// The late-mask region [TAG_LATE_MASKS]: header (ready word + padding), then the masks.
inline constexpr uint64_t kLateMaskHeaderBytes = 8;
inline uint64_t llmLateMaskBytes(uint64_t num_masks, uint64_t vocab) {
  return kLateMaskHeaderBytes + llmMaskBytes(num_masks, vocab);
}
enum LateMaskState : uint32_t {
  kLateMasksPending = 0,
  kLateMasksReady = 1,
  kLateMasksAbandoned = 2,
};
// `region`: the 8-byte aligned start of a late-mask region (its ready word).
// tulip, before submitting the step: the word to pending.
void initLateMasks(std::byte* region);
// tulip, after writing the masks: pending -> ready, and wakes a waiting rose. False when rose
// had abandoned them (its draws did not use them).
bool publishLateMasks(std::byte* region);
// rose, before sampling: waits up to `timeout` for ready (true: the masks may be read). On
// timeout moves pending -> abandoned and returns false (unless tulip published in between).
bool awaitLateMasks(std::byte* region, std::chrono::nanoseconds timeout);
LateMaskState lateMaskState(const std::byte* region);

// The head of a kKvPull batch's input [TAG_KV_PULL].
struct KvPullDesc {
  char source[64] = {};     // the exporting worker's ModelFacts.kv_export
  int32_t source_pid = 0;   // its pid (Channel::workerPid): an export of another process is refused
  uint32_t num_pairs = 0;   // (src, dst) pairs of the full pool
  uint32_t num_window_pairs = 0;  // then of the window pool
  uint32_t reserved = 0;
};
static_assert(sizeof(KvPullDesc) == 80);

// Completion.cols of a step result that carries logprobs: the id plus one LlmTokenLogprobs,
// in 4-byte words.
inline constexpr uint32_t kLlmLogprobsCols = 1 + sizeof(llm::LlmTokenLogprobs) / 4;
static_assert(sizeof(llm::LlmTokenLogprobs) % 4 == 0);

}  // namespace garden::shm
