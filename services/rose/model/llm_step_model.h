#pragma once
// What LlmRunner (engine/llm_runner.h) needs from a decoder LLM: the step checks, the step itself
// and the facts it announces. Two implementations: GptOssStepModel below (the single-device
// GptOssModel) and the rank-0 end of a model sharded over rank processes
// (parallel/rank_runtime.h ShardedStepModel, --tp/--dp/--ep).
//
// Threads: as the wrapped model (validate on the step thread; enqueueStep on the backend's queue,
// inside Backend::launch).

#include <cstdint>

#include "common/llm/step.h"
#include "common/status.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/model/llm_step.h"
#include "services/rose/ops/paged_kv_cache.h"

namespace garden::rose {

class LlmStepModel {
 public:
  virtual ~LlmStepModel() = default;
  virtual int64_t hiddenSize() const = 0;
  virtual int64_t maxModelLen() const = 0;
  virtual int64_t vocabSize() const = 0;
  // Logprobs, min_p, penalties and logit_bias (shm::kLlmCapSamplerState).
  virtual bool supportsSamplerState() const = 0;
  // Token masks of structured outputs (shm::kLlmCapTokenMask) [TAG_TOKEN_MASK].
  virtual bool supportsTokenMask() const = 0;
  // Token masks handed over after the step was launched (LlmStep::await_masks,
  // shm::kLlmCapLateMask) [TAG_LATE_MASKS].
  virtual bool supportsLateMask() const { return false; }
  // Whether the step path can take them at all, verified on this backend or not (rose
  // --late-masks on: for running the backend's tests through the whole mesh).
  virtual bool implementsLateMask() const { return false; }
  // The cache this process allocates for tulip's `num_blocks` block ids of `block_size` tokens
  // (a dp-sharded model holds only its group's share of them), its sliding layers in a window
  // pool of `num_blocks_window` blocks when that is > 0 [TAG_KV_WINDOW_GROUP] (only a model
  // with kvWindow() > 0 takes one).
  virtual KvCacheShape kvShape(int32_t num_blocks, int32_t block_size,
                               int32_t num_blocks_window) const = 0;
  // The sliding layers' window in keys when the model can keep them in a window pool; 0: it
  // cannot (no sliding layers, or not implemented).
  virtual int32_t kvWindow() const { return 0; }
  virtual DType kvDType() const = 0;
  // As GptOssModel::validate(step, kv, prev_sampled).
  virtual Status validate(const LlmStep& step, const PagedKvCache& kv,
                          int64_t prev_sampled) const = 0;
  // As GptOssModel::enqueueStep without logits (they never cross the shm channel).
  virtual void enqueueStep(const LlmStep& step, PagedKvCache& kv, int32_t* sampled_out,
                           llm::LlmTokenLogprobs* logprobs_out) = 0;
};

class GptOssStepModel final : public LlmStepModel {
 public:
  explicit GptOssStepModel(GptOssModel& m) : m_(m) {}
  int64_t hiddenSize() const override { return m_.config().base.hidden_size; }
  int64_t maxModelLen() const override { return m_.maxModelLen(); }
  int64_t vocabSize() const override { return m_.vocabSize(); }
  bool supportsSamplerState() const override { return m_.supportsSamplerState(); }
  bool supportsTokenMask() const override { return m_.supportsTokenMask(); }
  bool supportsLateMask() const override { return m_.supportsLateMask(); }
  bool implementsLateMask() const override { return m_.supportsTokenMask(); }
  KvCacheShape kvShape(int32_t num_blocks, int32_t block_size,
                       int32_t num_blocks_window) const override {
    return m_.kvShape(num_blocks, block_size, num_blocks_window);
  }
  int32_t kvWindow() const override { return m_.slidingWindow(); }
  DType kvDType() const override { return m_.kvDType(); }
  Status validate(const LlmStep& step, const PagedKvCache& kv,
                  int64_t prev_sampled) const override {
    return m_.validate(step, kv, prev_sampled);
  }
  void enqueueStep(const LlmStep& step, PagedKvCache& kv, int32_t* sampled_out,
                   llm::LlmTokenLogprobs* logprobs_out) override {
    m_.enqueueStep(step, kv, nullptr, sampled_out, logprobs_out);
  }

 private:
  GptOssModel& m_;
};

}  // namespace garden::rose
