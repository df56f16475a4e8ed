#pragma once
// The Runner (runner.h) for embedding and scoring models (Qwen3Model): BatchKind::kEmbed
// (pooled, optionally L2-normalized rows: rows = sequences, cols = hidden, float32) and kScore
// (one float32 per sequence). admit() checks the descriptor against the input and output arenas
// and the model (counts, token budget, pooling mode, score ids; token ids and lengths after the
// copy into the slot's staging): INVALID_ARGUMENT naming the field; a kGenerate batch is
// UNIMPLEMENTED (this worker serves an embedding model).
//
// CUDA graphs [TAG_GRAPH_EXEC]: with EmbeddingRunnerOptions::cuda_graphs and a backend whose
// graphs() is set (cuda), every batch runs padded to its (sequences, tokens) bucket through the
// backend's graph cache on the step thread (Qwen3Model::enqueueEmbedGraphed: eager the first time
// a bucket is seen, captured the second, replayed after): same results, bit for bit, without
// ~300 launches. Off, or on a backend without graphs (cpu): batches run eagerly, unpadded,
// inside Backend::launch.
//
// Threads: create() on the loading thread; everything else on the step thread (graphStats()
// also after the loop stopped). The Backend and model must outlive the runner.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/status.h"
#include "services/rose/engine/runner.h"
#include "services/rose/model/qwen3.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {

struct EmbeddingRunnerOptions {
  PoolMode default_pooling = PoolMode::kLast;  // for BatchDesc.pooling == kDefault
  // CUDA graphs (see above). On a backend without graphs this is ignored.
  bool cuda_graphs = true;
  // Embed buckets captured by create() (sequences, tokens per batch), with the default pooling
  // and normalization on. Needs graphs; create() fails on a bad entry, naming it.
  std::vector<std::pair<int32_t, int64_t>> precapture;
};

class EmbeddingRunner final : public Runner {
 public:
  // Captures the precapture buckets (and waits for them). INVALID_ARGUMENT when precapture is
  // asked without graphs or names a bucket that does not fit.
  static Result<std::unique_ptr<EmbeddingRunner>> create(Backend& backend, Qwen3Model& model,
                                                         const EmbeddingRunnerOptions& opts);

  // True when batches run through CUDA graphs.
  bool graphs() const { return graphs_ != nullptr; }
  // eager / captures / replays (zero without graphs). Step thread, or after the loop stopped.
  GraphExecStats graphStats() const;

  RunnerTraits traits() const override;
  Status bind(const shm::Layout& layout) override;
  // Token ids + lengths of max_batch_tokens in, one hidden-size float row per token (the most
  // sequences a batch can hold) out.
  shm::Layout layoutFor(uint32_t slots) const override;
  shm::ModelFacts facts() const override;
  Result<OutputShape> admit(const shm::BatchDesc& d, std::span<const std::byte> input) override;
  Status launch(const shm::BatchDesc& d, std::span<std::byte> output) override;

 private:
  struct Slot {
    std::vector<int32_t> tokens;   // staging, max_batch_tokens
    std::vector<int32_t> seqlens;  // staging, max_batch_tokens
  };
  EmbeddingRunner(Backend& b, Qwen3Model& m, const EmbeddingRunnerOptions& o)
      : backend_(b), model_(m), opts_(o) {}

  Backend& backend_;
  Qwen3Model& model_;
  EmbeddingRunnerOptions opts_;
  GraphExecutor* graphs_ = nullptr;  // backend_.graphs() when opts_.cuda_graphs
  uint64_t input_bytes_ = 0, output_bytes_ = 0;  // per slot, from bind()
  std::vector<Slot> slots_;
};

}  // namespace garden::rose
