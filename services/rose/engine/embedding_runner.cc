#include "services/rose/engine/embedding_runner.h"

#include <cstring>
#include <string>

#include "common/metrics/registry.h"

namespace garden::rose {

Result<std::unique_ptr<EmbeddingRunner>> EmbeddingRunner::create(
    Backend& backend, Qwen3Model& model, const EmbeddingRunnerOptions& opts) {
  std::unique_ptr<EmbeddingRunner> r(new EmbeddingRunner(backend, model, opts));
  if (opts.cuda_graphs && backend.graphs() != nullptr && model.graphsEnabled()) {
    r->graphs_ = backend.graphs();
  }
  if (!opts.precapture.empty() && r->graphs_ == nullptr) {
    return invalidArgument("precapture needs CUDA graphs (backend " + std::string(backend.name()) +
                           ", cuda graphs " + (opts.cuda_graphs ? "on" : "off") + ")");
  }
  for (const auto& [seqs, tokens] : opts.precapture) {
    Status st = model.precaptureEmbed(*r->graphs_, seqs, tokens, opts.default_pooling, true);
    if (!st.isOk()) {
      return Status(st.code(), "precapture " + std::to_string(seqs) + "x" + std::to_string(tokens) +
                                   ": " + st.message());
    }
  }
  if (!opts.precapture.empty()) RETURN_IF_ERROR(backend.synchronize());
  return r;
}

RunnerTraits EmbeddingRunner::traits() const {
  return {"embedding", "batch", "rose_batches_total", "Batches answered by rose, by outcome",
          "rose_step_seconds", "Batch taken until its result was published"};
}

shm::Layout EmbeddingRunner::layoutFor(uint32_t slots) const {
  const auto tokens = static_cast<uint64_t>(model_.maxBatchTokens());
  shm::Layout l;
  l.slots = slots;
  l.input_bytes = (2 * tokens + 1) * sizeof(int32_t) + 4096;
  l.output_bytes = tokens * static_cast<uint64_t>(model_.hiddenSize()) * sizeof(float);
  return l;
}

Status EmbeddingRunner::bind(const shm::Layout& layout) {
  input_bytes_ = layout.input_bytes;
  output_bytes_ = layout.output_bytes;
  const auto cap = static_cast<size_t>(model_.maxBatchTokens());
  slots_.resize(layout.slots);
  for (Slot& s : slots_) {
    s.tokens.resize(cap);
    s.seqlens.resize(cap);
  }
  return okStatus();
}

shm::ModelFacts EmbeddingRunner::facts() const {
  shm::ModelFacts f;
  f.hidden_size = static_cast<uint32_t>(model_.hiddenSize());
  f.max_seq_len = static_cast<uint32_t>(model_.maxSeqLen());
  f.vocab_size = static_cast<uint32_t>(model_.vocabSize());
  f.pooling = static_cast<uint32_t>(opts_.default_pooling);
  f.has_score_head = model_.hasScoreHead() ? 1 : 0;
  f.max_batch_tokens = static_cast<uint32_t>(model_.maxBatchTokens());
  return f;
}

Result<OutputShape> EmbeddingRunner::admit(const shm::BatchDesc& d,
                                           std::span<const std::byte> input) {
  if (d.kind != shm::BatchKind::kEmbed && d.kind != shm::BatchKind::kScore) {
    if (d.kind == shm::BatchKind::kGenerate) {
      return unimplemented("batch kind generate is not served by this rose (embedding model)");
    }
    return invalidArgument("batch kind " + std::to_string(static_cast<uint32_t>(d.kind)) +
                           " is unknown");
  }
  if (d.num_seqs == 0) return invalidArgument("num_seqs is 0");
  if (d.num_tokens == 0) return invalidArgument("num_tokens is 0");
  if (d.num_tokens > model_.maxBatchTokens()) {
    return invalidArgument("num_tokens " + std::to_string(d.num_tokens) +
                           " exceeds max_batch_tokens " + std::to_string(model_.maxBatchTokens()));
  }
  if (d.num_seqs > d.num_tokens) {
    return invalidArgument("num_seqs " + std::to_string(d.num_seqs) + " exceeds num_tokens " +
                           std::to_string(d.num_tokens));
  }
  const uint64_t tok_bytes = uint64_t{d.num_tokens} * sizeof(int32_t);
  const uint64_t len_bytes = uint64_t{d.num_seqs} * sizeof(int32_t);
  if (!arenaFits(d.tokens_offset, tok_bytes, input.size())) {
    return invalidArgument("tokens (offset " + std::to_string(d.tokens_offset) + ", " +
                           std::to_string(tok_bytes) + " bytes) run past the input arena (" +
                           std::to_string(input.size()) + " bytes)");
  }
  if (!arenaFits(d.seqlens_offset, len_bytes, input.size())) {
    return invalidArgument("seqlens (offset " + std::to_string(d.seqlens_offset) + ", " +
                           std::to_string(len_bytes) + " bytes) run past the input arena (" +
                           std::to_string(input.size()) + " bytes)");
  }
  OutputShape shape;
  shape.rows = d.num_seqs;
  shape.cols = d.kind == shm::BatchKind::kEmbed ? static_cast<uint32_t>(model_.hiddenSize()) : 1;
  if (shape.bytes() > output_bytes_) {
    return invalidArgument("result needs " + std::to_string(shape.bytes()) +
                           " bytes, more than the output arena's " +
                           std::to_string(output_bytes_));
  }
  if (d.kind == shm::BatchKind::kEmbed) {
    if (static_cast<uint32_t>(d.pooling) > static_cast<uint32_t>(shm::PoolingMode::kCls)) {
      return invalidArgument("pooling " + std::to_string(static_cast<uint32_t>(d.pooling)) +
                             " is unknown");
    }
  } else {
    RETURN_IF_ERROR(model_.validateScore({d.score_yes, d.score_no}));
  }
  // Copy out of shared memory first: what is validated is what runs, whatever the other side
  // writes afterwards.
  Slot& s = slots_[d.slot];
  std::memcpy(s.tokens.data(), input.data() + d.tokens_offset, tok_bytes);
  std::memcpy(s.seqlens.data(), input.data() + d.seqlens_offset, len_bytes);
  const BatchInput bi{std::span<const int32_t>(s.tokens.data(), d.num_tokens),
                      std::span<const int32_t>(s.seqlens.data(), d.num_seqs)};
  RETURN_IF_ERROR(model_.validate(bi));
  return shape;
}

Status EmbeddingRunner::launch(const shm::BatchDesc& d, std::span<std::byte> output) {
  const Slot& s = slots_[d.slot];
  float* out = reinterpret_cast<float*>(output.data());
  const BatchInput in{std::span<const int32_t>(s.tokens.data(), d.num_tokens),
                      std::span<const int32_t>(s.seqlens.data(), d.num_seqs)};
  const PoolMode mode = d.pooling == shm::PoolingMode::kDefault
                            ? opts_.default_pooling
                            : static_cast<PoolMode>(static_cast<uint32_t>(d.pooling));
  const bool normalize = d.normalize != 0;
  const ScoreRequest req{d.score_yes, d.score_no};
  if (graphs_ == nullptr) {
    if (d.kind == shm::BatchKind::kEmbed) {
      backend_.launch(
          [this, in, mode, normalize, out] { model_.enqueueEmbed(in, mode, normalize, out); });
    } else {
      backend_.launch([this, in, req, out] { model_.enqueueScore(in, req, out); });
    }
    return okStatus();
  }
  // Padded to the bucket and replayed (see the header); runs on this thread, enqueues only.
  const GraphExecStats before = graphs_->graphStats();
  Status st = d.kind == shm::BatchKind::kEmbed
                  ? model_.enqueueEmbedGraphed(*graphs_, in, mode, normalize, out)
                  : model_.enqueueScoreGraphed(*graphs_, in, req, out);
  const GraphExecStats after = graphs_->graphStats();
  static auto& graph_runs = metrics::Registry::global().counter(
      "rose_cuda_graph_runs_total", "Batches run through the CUDA graph cache, by how", {"how"});
  static auto& replayed = graph_runs.labels({"replay"});
  static auto& captured = graph_runs.labels({"capture"});
  static auto& eager = graph_runs.labels({"eager"});
  if (after.replays > before.replays) replayed.inc();
  if (after.captures > before.captures) captured.inc();
  if (after.eager > before.eager) eager.inc();
  return st;
}

GraphExecStats EmbeddingRunner::graphStats() const {
  return graphs_ != nullptr ? graphs_->graphStats() : GraphExecStats{};
}

}  // namespace garden::rose
