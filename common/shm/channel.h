#pragma once
// The shared-memory channel between tulip (owner, producer of batches) and rose (worker, consumer
// of batches, producer of completions). One POSIX shm segment per worker:
//
//   [Header][submission ring][completion ring][input arena: slots x input_bytes]
//   [output arena: slots x output_bytes]
//
// Rings are single-producer single-consumer with `slots` entries (= pipeline depth). tulip owns
// slot allocation: it only submits a batch into a free slot, so the submission ring can never
// overflow; rose answers each batch with exactly one completion for the same slot. Doorbells are
// futexes on the rings' head counters: a waiter spins briefly, then sleeps. Descriptors are plain
// data (counts, byte offsets into the slot's input arena); no pointers cross the boundary.
//
// Threading: each ring has one producer thread and one consumer thread (per process); the header's
// heartbeat/state fields are atomics any thread may touch. Channel objects are move-only owners of
// the mapping; the creator (tulip) also unlinks the name on destruction.
//
// A creator killed with SIGKILL cannot unlink its segment: create() replaces a segment left under
// its name only once it is known to be stale [TAG_SHM_STALE] (removeStaleSegment below), so a
// restart cleans up after a crash while a live tulip or rose, or another user's file, is never
// pulled out from under its owner.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include <sys/types.h>

#include "common/status.h"

namespace garden::shm {

inline constexpr uint64_t kMagic = 0x314D534E44524147ULL;  // "GARDNSM1" little-endian
// 3: Completion carries rose's trace stamps (taken/launched/ready/published).
// 4: LlmStepSeq.prev_row (56 bytes). 5: step progress counter in the header.
// 6: sampler state and logprobs (LlmStepSeq 96 bytes, BatchDesc.state_offset/num_state).
// 7: ModelFacts.llm_caps / sampler (what the worker's sampler implements).
// 8: token masks (LlmStepSeq.mask_index in the former reserved2, kGenerate masks at
//    BatchDesc.seqlens_offset; kLlmCapTokenMask) [TAG_TOKEN_MASK].
// 9: late token masks (BatchDesc.flags in the former reserved_state, kBatchLateMasks,
//    kLlmCapLateMask) [TAG_LATE_MASKS].
// 10: ModelFacts.kv_block_groups (rose --dp: tulip keeps each sequence's blocks in one group).
// 11: ModelFacts.kv_num_blocks_window / kv_window, LlmStepSeq.window_table in the former
//     reserved[0] (sliding-window layers in a pool of their own) [TAG_KV_WINDOW_GROUP].
// 12: BatchKind::kKvPull and ModelFacts.kv_export (prefill/decode disaggregation) [TAG_KV_PULL].
inline constexpr uint32_t kVersion = 12;

enum class BatchKind : uint32_t {
  kEmbed = 1,     // pooled (optionally L2-normalized) embeddings: rows=num_seqs, cols=hidden
  kScore = 2,     // one float per sequence
  kGenerate = 3,  // one LLM step (common/shm/llm_batch.h): sampled token ids back
  // Copy KV blocks from another worker's exported cache into this worker's (common/shm/
  // llm_batch.h, [TAG_KV_PULL]); completes with rows = 0 once the copy is done.
  kKvPull = 4,
};

enum class PoolingMode : uint32_t { kDefault = 0, kLast = 1, kMean = 2, kCls = 3 };

enum class WorkerState : uint32_t { kStarting = 0, kReady = 1, kStopping = 2, kFailed = 3 };

// Sizes fixed at creation.
struct Layout {
  uint32_t slots = 4;                  // pipeline depth
  uint64_t input_bytes = 1ull << 20;   // per slot
  uint64_t output_bytes = 8ull << 20;  // per slot
};

// What rose tells tulip about its model once loaded (written before state becomes kReady).
struct ModelFacts {
  uint32_t hidden_size = 0;
  uint32_t max_seq_len = 0;
  uint32_t vocab_size = 0;
  uint32_t pooling = 0;         // PoolingMode rose applies for kDefault
  uint32_t has_score_head = 0;  // 1 when the checkpoint has a classification head
  uint32_t max_batch_tokens = 0;
  char name[64] = {};
  char kind[16] = {};  // "embedding" or "llm"
  // kind "llm" only: the paged KV cache rose allocated (tulip's block manager hands out ids
  // 0..kv_num_blocks-1, each holding kv_block_size tokens) and the model's end-of-sequence ids
  // (generation_config.json / config.json eos_token_id; -1 = unused entry).
  uint32_t kv_num_blocks = 0;
  uint32_t kv_block_size = 0;
  int32_t eos_ids[4] = {-1, -1, -1, -1};
  // kind "llm" only: most sequences one kGenerate step may carry (rose's --max-seqs); a step
  // with more is answered INVALID_ARGUMENT. max_batch_tokens bounds its new tokens likewise.
  uint32_t max_seqs = 0;
  // kind "llm" only: kLlmCap* bits, what the worker's sampler implements beyond temperature,
  // top-k and top-p, and the sampler's name for messages ("cpu", "cuda"). tulip refuses a
  // request that needs a missing capability before admitting it, naming the field, so one such
  // request never reaches (and fails) a step shared with other requests. 0: none.
  uint32_t llm_caps = 0;
  char sampler[16] = {};
  // kind "llm" only: the block ids form this many equal groups (rose --dp: group g =
  // ids [g * n / groups, (g + 1) * n / groups) is cached by dp group g's ranks); every
  // sequence's blocks must lie in one group. 0 or 1: one group.
  uint32_t kv_block_groups = 0;
  // kind "llm" only [TAG_KV_WINDOW_GROUP]: the model's sliding-window layers (kv_window keys)
  // keep their K/V in a pool of their own of kv_num_blocks_window blocks (ids
  // 0..kv_num_blocks_window-1, kv_block_size tokens each, in kv_block_groups groups like the
  // full pool); every sequence of a step then carries a window table (LlmStepSeq.window_table).
  // 0: none, every layer reads the one table.
  uint32_t kv_num_blocks_window = 0;
  uint32_t kv_window = 0;
  // kind "llm" only [TAG_KV_PULL]: the name this worker's KV cache is exported under (rose
  // --kv-export; another worker's kKvPull reads it), empty when not exported; and whether this
  // worker takes kKvPull batches (kLlmCapKvPull in llm_caps).
  char kv_export[64] = {};
};
// logprobs, min_p, presence/frequency/repetition penalties and logit_bias (sampler-state slots,
// [TAG_LLM_SAMPLER_STATE]; rose: LlmOps::supportsSamplerState()).
inline constexpr uint32_t kLlmCapSamplerState = 1u << 0;
// Token bitmasks restricting a draw (structured outputs, [TAG_TOKEN_MASK]; rose:
// LlmOps::supportsTokenMask()).
inline constexpr uint32_t kLlmCapTokenMask = 1u << 1;
// Token bitmasks handed over after the step was submitted (BatchDesc kBatchLateMasks,
// common/shm/llm_batch.h) [TAG_LATE_MASKS].
inline constexpr uint32_t kLlmCapLateMask = 1u << 2;
// kKvPull batches: copying KV blocks out of another worker's exported cache [TAG_KV_PULL].
inline constexpr uint32_t kLlmCapKvPull = 1u << 3;

// BatchDesc.flags bits.
// kGenerate: the token masks at seqlens_offset follow a ready word and are written after the
// step was submitted (common/shm/llm_batch.h) [TAG_LATE_MASKS].
inline constexpr uint32_t kBatchLateMasks = 1u << 0;

// A batch, as tulip submits it. Input data lives in the slot's input arena at the given offsets:
// token ids (int32 x num_tokens, sequences back to back) and sequence lengths (int32 x num_seqs).
// kGenerate batches (one LLM step) use seqs_offset/blocks_offset/num_blocks instead of
// seqlens_offset; see common/shm/llm_batch.h for their layout and their completion.
struct BatchDesc {
  uint64_t batch_id = 0;
  uint32_t slot = 0;
  BatchKind kind = BatchKind::kEmbed;
  uint32_t num_seqs = 0;
  uint32_t num_tokens = 0;
  PoolingMode pooling = PoolingMode::kDefault;
  uint32_t normalize = 1;
  int32_t score_yes = -1;  // kScore: logits of these two ids at the last position, or -1/-1 for
  int32_t score_no = -1;   //         the classification head
  uint32_t num_blocks = 0;       // kGenerate: entries of the block-id array
  uint64_t tokens_offset = 0;   // bytes into the slot's input arena
  uint64_t seqlens_offset = 0;  // bytes into the slot's input arena
  uint64_t seqs_offset = 0;     // kGenerate: llm::LlmStepSeq x num_seqs
  uint64_t blocks_offset = 0;   // kGenerate: int32 block ids x num_blocks
  uint64_t state_offset = 0;    // kGenerate: int32 sampler-state words x num_state
  uint32_t num_state = 0;
  uint32_t flags = 0;            // kBatch* bits
  int64_t deadline_ns = 0;      // CLOCK_MONOTONIC; 0 = none. Expired batches are answered, not run.
  char request_id[48] = {};     // for log lines (first request of the batch)
};

// rose's answer for one batch. Output rows are float32, row-major, at offset 0 of the slot's
// output arena.
struct Completion {
  uint64_t batch_id = 0;
  uint32_t slot = 0;
  int32_t status_code = 0;  // garden::StatusCode
  uint32_t rows = 0;
  uint32_t cols = 0;
  uint64_t output_bytes = 0;
  uint64_t step_us = 0;  // time from rose taking the batch to its result being ready
  // Trace stamps, CLOCK_MONOTONIC ns (0 = not recorded): rose's step thread took the batch and
  // had launched it; its completion thread saw the result in memory and published this entry.
  int64_t taken_ns = 0;
  int64_t launched_ns = 0;
  int64_t ready_ns = 0;
  int64_t published_ns = 0;
  char message[160] = {};
};

int64_t monotonicNowNs();

// What Channel::create() does with a segment already under `name` [TAG_SHM_STALE]. Returns false
// when there is none. Removes it (and returns true) when it is stale: a regular file owned by
// `uid`, mode 0600 (as create() makes it), and not in use — with a garden header of this version,
// neither the owner pid nor the worker pid it records is a live process that maps the segment
// (by device and inode in /proc/<pid>/maps; a pid whose maps cannot be read counts as mapping it),
// so a pid reused by an unrelated process does not keep a dead channel; without a readable header
// (never initialized, another version), no process on the host may map it. Otherwise
// FAILED_PRECONDITION naming why it stays (in use by pid N, owned by another uid, another mode),
// and the file is left as it is.
Result<bool> removeStaleSegment(const std::string& name, uid_t uid);

class Channel {
 public:
  // tulip: create (replacing a stale segment of the same name) and map.
  static Result<Channel> create(const std::string& name, const Layout& layout);
  // rose: map an existing segment; checks magic, version and layout sizes.
  static Result<Channel> attach(const std::string& name);

  Channel(Channel&& o) noexcept;
  Channel& operator=(Channel&& o) noexcept;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel();

  const std::string& name() const { return name_; }
  const Layout& layout() const { return layout_; }

  // --- submission ring (tulip produces, rose consumes) ---
  // Returns false when the ring is full (cannot happen if tulip only submits to free slots).
  bool trySubmit(const BatchDesc& d);
  // Waits up to `timeout` for a batch. nullopt on timeout or after wakeAll().
  std::optional<BatchDesc> waitSubmission(std::chrono::microseconds timeout);

  // --- completion ring (rose produces, tulip consumes) ---
  bool tryComplete(const Completion& c);
  // Waits up to `timeout`; with `spin` it first spins briefly (like waitSubmission) before
  // sleeping on the doorbell, without it it sleeps at once (for a caller running its own spin).
  std::optional<Completion> waitCompletion(std::chrono::microseconds timeout, bool spin = true);
  // Takes a published completion if there is one; never waits.
  std::optional<Completion> tryTakeCompletion();

  // Wakes every sleeper on both rings (used at shutdown so threads re-check their stop flag).
  void wakeAll();

  // --- arenas ---
  std::span<std::byte> inputArena(uint32_t slot);
  std::span<std::byte> outputArena(uint32_t slot);
  // The whole output arena (rose registers it with cudaHostRegister once).
  std::span<std::byte> outputArenaAll();

  // --- header fields ---
  void setWorkerPid(int32_t pid);
  int32_t workerPid() const;
  int32_t ownerPid() const;
  void beat();                         // heartbeat_ns = now
  int64_t lastBeatNs() const;
  // True when the worker has beaten at least once and not within `threshold`.
  bool heartbeatStale(std::chrono::milliseconds threshold) const;
  // Step progress [TAG_STEP_PROGRESS]: a counter rose's backend advances while it computes (per
  // layer and inside long ops), distinct from the heartbeat, which the step thread beats even
  // when the compute is wedged. progressReported says whether this worker's backend advances it
  // (set by rose before kReady); tulip judges a worker that does by the counter moving while a
  // batch is in flight. The counter only grows.
  std::atomic<uint64_t>* progressCounter();
  uint64_t progress() const;
  void setProgressReported(bool reported);
  bool progressReported() const;
  void setState(WorkerState s);
  WorkerState state() const;
  void setModelFacts(const ModelFacts& f);
  ModelFacts modelFacts() const;

  // Raw mapping (for tests).
  void* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  Channel() = default;
  void reset();
  struct Header* header() const;

  std::string name_;
  Layout layout_;
  void* base_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;
};

}  // namespace garden::shm
