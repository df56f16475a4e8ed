#pragma once
// rose's step loop for an LLM (gpt-oss) on the shared-memory channel [TAG_ROSE_LAZY]. The same
// shape as Engine (engine.h): step() takes one BatchKind::kGenerate descriptor (the format of
// common/shm/llm_batch.h [TAG_LLM_STEP_FORMAT]), validates it against the slot's arena (offsets,
// sizes, alignment, counts) and then against the model and the KV cache
// (GptOssModel::validate), copies the three arrays into the slot's private staging, launches
// GptOssModel::enqueueStep with the sampled ids going straight into the slot's output arena, and
// returns without waiting. A completion thread publishes each Completion (rows = sampled ids,
// cols = 1, int32) once the step's event fired. A descriptor that fails validation is answered
// INVALID_ARGUMENT naming the field and writes nothing to the KV cache; an expired deadline is
// DEADLINE_EXCEEDED without running; any other batch kind is INVALID_ARGUMENT ("this worker
// serves an llm"). Heartbeats: every step() beats; run() never blocks longer than ~20 ms
// between steps.
//
// The paged KV cache (kv_num_blocks blocks of kv_block_size tokens) is allocated once in
// create() and announced in ModelFacts; tulip owns the block ids, rose only reads and writes
// the blocks a step names.
//
// Threads: step()/run() on one thread (the step thread; it also owns the backend's launching
// side); the completion thread is owned by the LlmEngine and joined by drain()/the destructor.
// The Channel, Backend and model must outlive the LlmEngine.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/shm/channel.h"
#include "common/status.h"
#include "services/rose/engine/completion_queue.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/ops/paged_kv_cache.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {

// True when DIR/config.json describes a gpt-oss checkpoint (model_type "gpt_oss" or
// architectures containing "GptOssForCausalLM"). NOT_FOUND / INVALID_ARGUMENT when config.json
// cannot be read or parsed.
Result<bool> isGptOssCheckpoint(const std::string& dir);

// The model's end-of-sequence ids: generation_config.json's eos_token_id (an integer or a list)
// when the file has one, else config.json's; duplicates dropped, order kept; empty when neither
// names any. INVALID_ARGUMENT (naming file and field) on a malformed value or more than
// kMaxEosIds ids.
inline constexpr size_t kMaxEosIds = sizeof(shm::ModelFacts::eos_ids) / sizeof(int32_t);
Result<std::vector<int32_t>> loadEosIds(const std::string& dir);

struct LlmEngineOptions {
  std::string model_name;      // ModelFacts.name (truncated to 63 bytes)
  int32_t kv_num_blocks = 0;   // > 0
  int32_t kv_block_size = 16;  // > 0
  // Per-step staging; use the values the model was loaded with (GptOssOptions). Larger steps
  // are answered INVALID_ARGUMENT here, before the model sees them.
  int32_t max_seqs = 256;
  int64_t max_batch_tokens = 2048;
  std::vector<int32_t> eos_ids;  // at most kMaxEosIds, each inside the vocabulary
  std::chrono::microseconds poll = std::chrono::milliseconds(20);  // run(): longest wait per step
};

struct LlmEngineStats {
  uint64_t steps_run = 0;       // launched forward steps
  uint64_t steps_rejected = 0;  // answered with an error without running
  uint64_t completions = 0;     // published completions (run + rejected)
};

class LlmEngine {
 public:
  // Allocates the KV cache (RESOURCE_EXHAUSTED when it does not fit) and the slot staging,
  // registers the output arena with the backend and starts the completion thread.
  static Result<std::unique_ptr<LlmEngine>> create(shm::Channel& channel, Backend& backend,
                                                   GptOssModel& model,
                                                   const LlmEngineOptions& opts);
  ~LlmEngine();
  LlmEngine(const LlmEngine&) = delete;
  LlmEngine& operator=(const LlmEngine&) = delete;

  // Writes ModelFacts (kind "llm", KV facts, eos ids) and sets the worker state to kReady.
  void announceReady();

  // Takes at most one batch (waiting up to `wait`), beats the heartbeat. Returns true when a
  // batch was taken (run or rejected). Never waits for a forward step.
  bool step(std::chrono::microseconds wait);

  // Steps until should_stop() returns true (checked every step), then sets kStopping and drains.
  void run(const std::function<bool()>& should_stop);

  // Waits (up to `timeout`) until every taken batch has been published, then stops the
  // completion thread. Returns false on timeout. Called by run() and the destructor.
  bool drain(std::chrono::milliseconds timeout);

  LlmEngineStats stats() const;
  uint32_t inFlight() const { return queue_.inFlight(); }
  const PagedKvCache& kvCache() const { return *kv_; }
  // Block ids one step may carry in total (staging): max_seqs block tables of the model's
  // longest length, capped by the input arena.
  int64_t maxStepBlocks() const { return max_step_blocks_; }

 private:
  struct Slot {
    std::unique_ptr<Event> event;
    std::vector<llm::LlmStepSeq> seqs;  // staging, max_seqs
    std::vector<int32_t> tokens;        // staging, max_batch_tokens
    std::unique_ptr<int32_t[]> blocks;  // staging, max_step_blocks_ (left untouched until used)
    std::atomic<bool> busy{false};
  };
  LlmEngine(shm::Channel& c, Backend& b, GptOssModel& m, const LlmEngineOptions& o)
      : channel_(c), backend_(b), model_(m), opts_(o), queue_(c, b) {}
  // Validates `d` against the arena, copies it into the slot staging, validates the step
  // against the model and the cache; *rows = sequences that sample.
  Status admit(const shm::BatchDesc& d, uint32_t* rows);
  void reject(const shm::BatchDesc& d, const Status& st, std::chrono::steady_clock::time_point t);

  shm::Channel& channel_;
  Backend& backend_;
  GptOssModel& model_;
  LlmEngineOptions opts_;
  std::unique_ptr<PagedKvCache> kv_;
  int64_t max_step_blocks_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;

  CompletionQueue queue_;  // answers taken steps in order on its own thread
  std::atomic<uint64_t> run_{0}, rejected_{0};
};

}  // namespace garden::rose
