#pragma once
// Worker: tulip's view of a model worker (rose). The scheduler submits plain batches and gets
// exactly one callback per accepted batch, from the worker's completion thread — also when the
// worker dies (UNAVAILABLE) — so no request is ever left hanging.
//
// Implementations: ShmWorker (a rose process over shared memory), and fakes in tests/fakes/tulip/.
// Threads: trySubmit and the accessors from any thread (implementations lock internally). `done`
// callbacks run without the implementation's own lock held, so a callback may submit the next
// batch (the embedding scheduler does).

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/llm/step.h"
#include "common/shm/channel.h"
#include "common/status.h"

namespace garden::tulip {

// The token masks of a kGenerate step that come after it was submitted [TAG_LATE_MASKS]
// (common/shm/llm_batch.h; a worker announcing shm::kLlmCapLateMask).
struct LateMasks {
  // Set by the worker when it accepts the batch (trySubmit OK; unset otherwise). Writes `masks`
  // (the step's whole mask array, as WorkBatch::masks would carry it: late_mask_words words)
  // where the worker reads them and tells it they are ready. False when the worker stopped
  // waiting for them (its timeout) or no longer holds the step: its masked draws were then not
  // constrained. Called at most once, from the scheduler's thread.
  std::function<bool(std::span<const uint32_t> masks)> deliver;
};

struct WorkBatch {
  shm::BatchKind kind = shm::BatchKind::kEmbed;
  std::vector<int32_t> tokens;    // all sequences back to back
  std::vector<int32_t> seq_lens;  // one per sequence (kEmbed / kScore)
  // kGenerate (one LLM step, common/shm/llm_batch.h): one descriptor per sequence and the flat
  // block-id array their block_offset/num_blocks index; `tokens` holds the new tokens.
  std::vector<llm::LlmStepSeq> llm_seqs;
  std::vector<int32_t> block_ids;
  std::vector<int32_t> llm_state;  // kGenerate: sampler-state words [TAG_LLM_SAMPLER_STATE]
  std::vector<uint32_t> masks;  // kGenerate: token bitmasks [TAG_TOKEN_MASK] (may be empty)
  // kGenerate with late masks [TAG_LATE_MASKS]: `masks` is empty, room for late_mask_words words
  // is reserved and `late_masks` gets its deliver function.
  uint64_t late_mask_words = 0;
  std::shared_ptr<LateMasks> late_masks;
  shm::PoolingMode pooling = shm::PoolingMode::kDefault;
  bool normalize = true;
  int32_t score_yes = -1;
  int32_t score_no = -1;
  int64_t deadline_ns = 0;  // CLOCK_MONOTONIC, 0 = none
  std::string request_id;   // of the batch's first request, for rose's log line
  // kKvPull [TAG_KV_PULL] (common/shm/llm_batch.h): copy blocks of the export `kv_source`
  // (written by process kv_source_pid) into this worker's cache; block_ids holds the (src, dst)
  // pairs, the full pool's first, then kv_window_pairs pairs of the window pool.
  std::string kv_source;
  int32_t kv_source_pid = 0;
  uint32_t kv_window_pairs = 0;
};

// The batch's result. `rows` points into the worker's output arena and is valid only during the
// callback: copy what you keep. On error, rows is empty.
struct WorkResult {
  Status status;
  std::span<const float> rows;
  std::span<const int32_t> token_ids;  // kGenerate: one sampled id per sequence with sample != 0
  // kGenerate, when the step asked for logprobs: one entry per token id (else empty).
  std::span<const llm::LlmTokenLogprobs> logprobs;
  uint32_t num_rows = 0;
  uint32_t cols = 0;
  uint64_t step_us = 0;
  // Trace stamps (CLOCK_MONOTONIC ns, 0 = unknown): rose took the batch, had launched it, saw its
  // result ready, published the completion; the worker's thread took the completion.
  int64_t rose_taken_ns = 0;
  int64_t rose_launched_ns = 0;
  int64_t rose_ready_ns = 0;
  int64_t rose_published_ns = 0;
  int64_t seen_ns = 0;
};

using WorkDone = std::function<void(const WorkResult&)>;

class Worker {
 public:
  virtual ~Worker() = default;

  // Ready to take batches (model loaded, heartbeat fresh).
  virtual bool ready() const = 0;
  // Why the worker last went down ("rose worker (pid 12) was killed by signal 9 (Killed)"), or
  // empty if it never has. Kept after recovery until the next failure.
  virtual std::string lastFailure() const { return {}; }
  // Facts the worker reported about its model (valid once ready() has been true).
  virtual shm::ModelFacts facts() const = 0;
  // Maximum batches in flight, and how many are in flight now.
  virtual uint32_t depth() const = 0;
  virtual uint32_t inflight() const = 0;
  // The worker process's pid (0: unknown or not a process) [TAG_KV_PULL].
  virtual int32_t pid() const { return 0; }
  // Capacity of one batch's input/output in the channel (tokens + sequences, output floats).
  virtual uint64_t maxBatchInts() const = 0;
  virtual uint64_t maxBatchFloats() const = 0;
  // Bytes of one batch's input arena (bounds a kGenerate step: shm::llmStepBytes).
  virtual uint64_t inputBytes() const { return maxBatchInts() * sizeof(int32_t); }

  // Accepts the batch when the worker is ready and a slot is free; `done` is then called exactly
  // once. Returns FAILED_PRECONDITION (no free slot: retry after a completion), UNAVAILABLE (not
  // ready) or INVALID_ARGUMENT (batch larger than the channel) without calling `done`.
  virtual Status trySubmit(WorkBatch batch, WorkDone done) = 0;

  // Called (from the worker's thread) whenever a slot frees up or readiness changes, so the
  // scheduler can re-check its queue. Set once before use.
  virtual void setOnChange(std::function<void()> fn) = 0;
};

// UNAVAILABLE for work that finds the worker down, naming `last_failure` (what took it down) so
// that a caller whose request raced a crash learns the cause, whichever path answered it.
inline Status workerDown(const std::string& last_failure,
                         const std::string& what = "rose worker is restarting") {
  if (last_failure.empty()) return unavailable("rose worker is not ready; retry shortly");
  return unavailable(what + ": " + last_failure + "; retry shortly");
}
inline Status workerDown(const Worker& w, const std::string& what = "rose worker is restarting") {
  return workerDown(w.lastFailure(), what);
}

}  // namespace garden::tulip
