#pragma once
// The Runner (runner.h) for a decoder LLM (gpt-oss, GptOssModel): one BatchKind::kGenerate
// descriptor is one forward step (the format of common/shm/llm_batch.h [TAG_LLM_STEP_FORMAT]).
// admit() checks it against the slot's input arena (offsets, sizes, alignment, counts), copies
// the three arrays (sequences, token ids, block ids) into the slot's private staging and checks
// the copy against the model and the KV cache (GptOssModel::validate); launch() enqueues
// GptOssModel::enqueueStep with the sampled ids going straight into the slot's output arena
// (rows = sampled ids, cols = 1, int32). A refused step is INVALID_ARGUMENT naming the field and
// writes nothing to the KV cache; any other batch kind is INVALID_ARGUMENT ("this worker serves
// an llm").
//
// The runner owns the paged KV cache (kv_num_blocks blocks of kv_block_size tokens), allocated
// once in create() and announced in ModelFacts; tulip owns the block ids, the runner only reads
// and writes the blocks a step names.
//
// Prefill/decode disaggregation [TAG_KV_PULL] (docs/multi-gpu.md): with kv_export set the cache
// lives in a named export (parallel/kv_handoff.h SharedKvPools::createNamed, announced as
// ModelFacts.kv_export) that other workers may read; a BatchKind::kKvPull batch
// (common/shm/llm_batch.h) copies blocks of another worker's export into this cache (admit()
// opens the export once per name and exporter pid and checks the pairs; launch() enqueues the
// copy) and completes with no rows once the copy is done. On the cpu backend the cache lives in
// the shm segment; on cuda [TAG_KV_PULL_CUDA] it stays device memory, the segment carries its
// CUDA IPC handles (SharedKvPools::createNamedDevice), the importer maps them once
// (Backend::openPeerMemory) and the copy is one kernel (Backend::copyKvBlocks). Both workers
// must be on the same kind of device (a pull across kinds is FAILED_PRECONDITION).
//
// Threads: create() on the loading thread; everything else on the step thread (kvCache() also
// after the loop stopped, or in tests between steps). The Backend and model must outlive the
// runner.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/shm/channel.h"
#include "common/status.h"
#include "services/rose/engine/runner.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/model/llm_step_model.h"
#include "services/rose/ops/backend.h"
#include "services/rose/ops/paged_kv_cache.h"
#include "services/rose/parallel/kv_handoff.h"

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

struct LlmRunnerOptions {
  int32_t kv_num_blocks = 0;   // > 0
  int32_t kv_block_size = 16;  // > 0
  // Announced as ModelFacts::kv_block_groups: the block ids form this many groups and tulip
  // keeps each sequence in one (a sharded rose's --dp; kv_num_blocks a multiple). >= 1.
  int32_t kv_block_groups = 1;
  // [TAG_KV_WINDOW_GROUP] Blocks of the sliding layers' own pool (0: none; every layer in the
  // kv_num_blocks pool). Needs a model with kvWindow() > 0 and a multiple of kv_block_groups;
  // announced as ModelFacts kv_num_blocks_window / kv_window.
  int32_t kv_num_blocks_window = 0;
  // Per-step staging; use the values the model was loaded with (GptOssOptions). Larger steps
  // are answered INVALID_ARGUMENT here, before the model sees them.
  int32_t max_seqs = 256;
  int64_t max_batch_tokens = 2048;
  std::vector<int32_t> eos_ids;  // at most kMaxEosIds, each inside the vocabulary
  // Late token masks [TAG_LATE_MASKS]: how long a step waits for tulip's masks before it samples
  // without them (tulip then ends the step's constrained sequences).
  std::chrono::milliseconds late_mask_timeout{10000};
  // Whether late masks are announced (shm::kLlmCapLateMask): kAuto where the model's backend has
  // verified them (LlmStepModel::supportsLateMask), kOn wherever the step path implements them
  // (to test an unverified backend through the mesh), kOff never.
  enum class LateMasks { kAuto, kOn, kOff };
  LateMasks late_masks = LateMasks::kAuto;
  // [TAG_KV_PULL] Export the KV cache under this name (cpu: SharedKvPools::createNamed, the cache
  // in the segment; cuda: createNamedDevice, its IPC handles [TAG_KV_PULL_CUDA]; empty: a private
  // cache).
  std::string kv_export;
  // [TAG_KV_PULL] Serve kKvPull batches (announced as kLlmCapKvPull; cpu and cuda backends). A
  // sharded model's cache lives in its ranks: false there.
  bool kv_pull = true;
};

class LlmRunner final : public Runner {
 public:
  // Checks the options (INVALID_ARGUMENT naming the field) and allocates the KV cache
  // (RESOURCE_EXHAUSTED when it does not fit): model.kvShape(kv_num_blocks, kv_block_size,
  // kv_num_blocks_window).
  static Result<std::unique_ptr<LlmRunner>> create(Backend& backend, LlmStepModel& model,
                                                   const LlmRunnerOptions& opts);
  // The single-device gpt-oss (wrapped in a GptOssStepModel the runner owns).
  static Result<std::unique_ptr<LlmRunner>> create(Backend& backend, GptOssModel& model,
                                                   const LlmRunnerOptions& opts);

  const PagedKvCache& kvCache() const { return *kv_; }
  // Block ids one step may carry in total (staging): max_seqs block tables of the model's
  // longest length (twice that with a window pool: each window table follows its table),
  // capped by the input arena. Set by bind().
  int64_t maxStepBlocks() const { return max_step_blocks_; }

  RunnerTraits traits() const override;
  // INVALID_ARGUMENT when the output arena cannot hold max_seqs sampled ids.
  Status bind(const shm::Layout& layout) override;
  // A step of max_seqs sequences, max_batch_tokens tokens and max_seqs block tables of the
  // model's longest length in; max_seqs sampled ids with their logprobs out (at least 4096
  // bytes).
  shm::Layout layoutFor(uint32_t slots) const override;
  shm::ModelFacts facts() const override;
  Result<OutputShape> admit(const shm::BatchDesc& d, std::span<const std::byte> input) override;
  Status launch(const shm::BatchDesc& d, std::span<std::byte> output) override;

 private:
  struct Slot {
    std::vector<llm::LlmStepSeq> seqs;  // staging, max_seqs
    std::vector<int32_t> tokens;        // staging, max_batch_tokens
    std::unique_ptr<int32_t[]> blocks;  // staging, max_step_blocks_ (left untouched until used)
    std::vector<int32_t> state;         // staging: sampler-state words [TAG_LLM_SAMPLER_STATE]
    uint32_t sampled = 0;               // sequences of the admitted step that sample
    bool logprobs = false;              // the admitted step returns logprobs
    std::vector<uint32_t> masks;        // staging: token bitmasks [TAG_TOKEN_MASK]
    uint32_t num_masks = 0;
    // The late-mask region in the slot's input arena (its ready word), or null [TAG_LATE_MASKS].
    std::byte* late = nullptr;
    // [TAG_KV_PULL] The admitted pull: its source and pairs (full pool, then window pool).
    const SharedKvPools* pull_source = nullptr;
    std::vector<int32_t> pull_pairs;
    size_t pull_full = 0;  // entries of pull_pairs that belong to the full pool
  };
  // [TAG_KV_PULL] admit() of a kKvPull batch.
  Result<OutputShape> admitPull(const shm::BatchDesc& d, std::span<const std::byte> input);
  bool pullServed() const { return opts_.kv_pull; }
  // The export `name` of process `pid`, opened once (reopened when the pid changed).
  Result<const SharedKvPools*> pullSource(const std::string& name, int32_t pid);
  // A just-opened export: refused when it lives on the other kind of memory; a device export
  // is mapped through the backend [TAG_KV_PULL_CUDA].
  Status mapPullSource(SharedKvPools& pools);
  LlmRunner(Backend& b, LlmStepModel& m, const LlmRunnerOptions& o)
      : backend_(b),
        model_(m),
        opts_(o),
        late_masks_(o.late_masks == LlmRunnerOptions::LateMasks::kOn    ? m.implementsLateMask()
                    : o.late_masks == LlmRunnerOptions::LateMasks::kOff ? false
                                                                        : m.supportsLateMask()) {}
  // The step admit() staged for `slot`.
  LlmStep stagedStep(uint32_t slot, const shm::BatchDesc& d) const;

  Backend& backend_;
  std::unique_ptr<LlmStepModel> owned_model_;  // the GptOssModel overload's wrapper
  LlmStepModel& model_;
  LlmRunnerOptions opts_;
  const bool late_masks_;  // announced and served [TAG_LATE_MASKS]
  std::unique_ptr<SharedKvPools> export_;  // [TAG_KV_PULL] kv_'s memory when exported
  std::unique_ptr<PagedKvCache> kv_;
  // [TAG_KV_PULL] Exports pulled from, by name (at most kMaxPullSources).
  static constexpr size_t kMaxPullSources = 16;
  std::vector<std::pair<std::string, std::unique_ptr<SharedKvPools>>> pull_sources_;
  int64_t max_step_blocks_ = 0;
  uint64_t output_bytes_ = 0;  // per slot, from bind()
  std::vector<Slot> slots_;
  // Ids the last launched step samples: what the next step's prev_row may name (loop thread).
  int64_t launched_sampled_ = 0;
};

}  // namespace garden::rose
