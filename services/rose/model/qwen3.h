#pragma once
// The Qwen3 transformer (Qwen3-Embedding, Qwen3-Reranker, Qwen3ForSequenceClassification, any
// Qwen3ForCausalLM/Qwen3Model checkpoint) for embedding and scoring batches, written once
// against the op interface (services/rose/ops/backend.h).
//
// Loading: DIR/config.json + safetensors (single file or sharded). Tensor names are accepted with
// and without the `model.` prefix; `lm_head.weight` when present and the embeddings are not tied,
// else the embedding table is the LM head; `score.weight` ([num_labels, hidden]) when present is
// the classification head. q/k/v and gate/up weights are fused at load (one GEMM each).
//
// Forward, for a ragged batch (sequences back to back, positions restart at 0 per sequence):
//   embed → L × [RMSNorm → QKV → per-head QK RMSNorm + RoPE → attention (causal or
//   bidirectional, GQA) → O → add+RMSNorm → gate_up → SwiGLU → down → add] → final RMSNorm
// then pooling (+ L2 normalization) or a score head. The activation workspace is allocated once
// at load for max_batch_tokens tokens; enqueue*() never allocates device memory.
//
// Threads: load() on any thread; enqueue*() on the backend's launching thread, either inside
// Backend::launch() (the engine) or directly followed by Backend::synchronize() (tests). The
// enqueued work reads only the model's own buffers, so the caller's input spans may be reused
// once enqueue*() has run (inside launch, that is when the closure runs).

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/model_config.h"
#include "common/status.h"
#include "services/rose/model/pooling_config.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {

struct Qwen3Options {
  int64_t max_batch_tokens = 8192;
  // Attention override: -1 = from config.json (`is_causal`, default causal), 0 = bidirectional,
  // 1 = causal.
  int causal = -1;
  bool load_lm_head = true;  // the LM head is only needed for yes/no scoring
  // When set, the pooling mode is this and modules.json / 1_Pooling are not read (so a model
  // whose files name a mode rose does not serve can still be served with an explicit one).
  std::optional<PoolMode> pooling_override;
  // [TAG_EMBED_FP8] Which projections of every layer run in FP8 e4m3 (kFp8* bits; 0: none):
  // their weights quantized at load with 128x128 block scales (the bf16 copies freed), their
  // inputs quantized per row and 128 inputs by the producing op (RMSNorm, SwiGLU; the attention
  // output by a quantize op): Backend::linearFp8. Needs a backend with supportsFp8Linear() (cuda),
  // no bias on an FP8 projection, and the hidden, q and intermediate widths multiples of 128.
  // The eager path pads the batch to a multiple of 4 tokens (a padding sequence, as the graph
  // buckets do). rose --weights fp8 (all four) | fp8-mlp (gate_up and down).
  uint32_t fp8_projections = 0;
};

// [TAG_EMBED_FP8] Qwen3Options::fp8_projections bits.
inline constexpr uint32_t kFp8Qkv = 1, kFp8O = 2, kFp8GateUp = 4, kFp8Down = 8;
inline constexpr uint32_t kFp8All = kFp8Qkv | kFp8O | kFp8GateUp | kFp8Down;
inline constexpr uint32_t kFp8Mlp = kFp8GateUp | kFp8Down;
// "bf16" 0, "fp8" all four, "fp8-mlp" gate_up + down; false for anything else.
bool fp8ProjectionsFromName(std::string_view name, uint32_t* out);

// One batch, host side: token ids back to back, one length per sequence.
struct BatchInput {
  std::span<const int32_t> tokens;
  std::span<const int32_t> seqlens;
};

// What a score batch asks for: the yes/no logit difference at the last position through the LM
// head (yes_id/no_id >= 0), or the classification head (both -1).
struct ScoreRequest {
  int32_t yes_id = -1;
  int32_t no_id = -1;
};

class Qwen3Model {
 public:
  static Result<std::unique_ptr<Qwen3Model>> load(const std::string& dir, Backend& backend,
                                                  const Qwen3Options& opts);
  ~Qwen3Model();

  const ModelConfig& config() const { return config_; }
  const PoolingConfig& pooling() const { return pooling_; }
  bool causal() const { return causal_; }
  bool hasScoreHead() const { return !score_.view.empty(); }
  bool hasLmHead() const { return lm_head_ != nullptr; }
  int64_t hiddenSize() const { return config_.hidden_size; }
  int64_t maxBatchTokens() const { return max_tokens_; }
  int64_t maxSeqLen() const { return config_.max_position_embeddings; }
  int64_t vocabSize() const { return config_.vocab_size; }

  // Host-side checks of a batch (counts, lengths, token ids, token budget): INVALID_ARGUMENT
  // naming the problem. enqueue*() require a batch that passed.
  Status validate(const BatchInput& in) const;
  // Checks that a score request can be served (head present, ids in range).
  Status validateScore(const ScoreRequest& req) const;

  // Enqueue the forward pass and the copy of the result into `out` (host memory that stays valid
  // until an event recorded after this call fires):
  //   embed:  out F32 [num_seqs, hidden]
  //   score:  out F32 [num_seqs] (sigmoid of the logit / logit difference)
  //   hidden: out F32 [num_tokens, hidden] (the last hidden state after the final norm)
  void enqueueEmbed(const BatchInput& in, PoolMode mode, bool normalize, float* out);
  void enqueueScore(const BatchInput& in, const ScoreRequest& req, float* out);
  void enqueueHidden(const BatchInput& in, float* out);

  // ---- CUDA-graph path [TAG_GRAPH_EXEC] (backends whose graphs() is not null) ----
  // The same forward pass padded to a bucket and run through `g` (lazy capture: eager, capture,
  // replay). Padding: tokens to graphTokensBucket(num_tokens), sequences to
  // graphSeqsBucket(num_seqs + 1): the real sequences, then one padding sequence that holds the
  // spare tokens (id 0, possibly none), then empty ones. Every op is per row or per sequence, so
  // the real sequences' results equal the unpadded pass. The ids/positions/cu_seqlens copies are
  // enqueued before the graph into the fixed workspace buffers, the copy of the first num_seqs
  // result rows into `out` after it. Runs on the calling thread (no Backend::launch); errors are
  // the graph run's (the result copy is then not enqueued). Requires graphsEnabled().
  Status enqueueEmbedGraphed(GraphExecutor& g, const BatchInput& in, PoolMode mode, bool normalize,
                             float* out);
  Status enqueueScoreGraphed(GraphExecutor& g, const BatchInput& in, const ScoreRequest& req,
                             float* out);
  // Captures the embed graph of the bucket that a batch of `seqs` sequences and `tokens` tokens
  // lands in, now (a synthetic batch of equal lengths). INVALID_ARGUMENT when it does not fit.
  Status precaptureEmbed(GraphExecutor& g, int32_t seqs, int64_t tokens, PoolMode mode,
                         bool normalize);
  // True when the workspace was sized for padded buckets (the backend had graphs() at load).
  bool graphsEnabled() const { return graph_tokens_ > 0; }

 private:
  struct Fp8Weight {  // [TAG_EMBED_FP8] codes + block scales
    OwnedTensor codes, scales;
    Fp8Matrix matrix() const { return {codes.view, scales.view}; }
  };
  struct Layer {
    OwnedTensor input_norm, post_norm, q_norm, k_norm;
    OwnedTensor qkv, qkv_bias, o, o_bias, gate_up, down;
    Fp8Weight qkv8, o8, gate_up8, down8;  // per fp8_projections (the bf16 ones then empty)
  };
  // [TAG_EMBED_FP8] The FP8 activation workspace as the input of a GEMM of `t` rows and `k`
  // inputs.
  Fp8Matrix fp8Input(int64_t t, int64_t k) const;

  explicit Qwen3Model(Backend& b);
  // GraphShapeKey::kind: what the graph computes (low 4 bits) and which model (graph_id_).
  uint32_t graphKind(uint32_t what) const { return (graph_id_ << 4) | what; }
  // Runs everything up to the final norm; returns the hidden-state view [T, H].
  Tensor enqueueBody(const BatchInput& in);
  // enqueueBody's two halves: the host plan + copies of ids/positions/cu_seqlens, with the batch
  // padded to (tokens, seqs) as described at enqueueEmbedGraphed (no padding when equal to the
  // batch's own counts); and the device work for that shape, reading the staged buffers.
  void stageInputs(const BatchInput& in, int64_t tokens, int32_t seqs);
  Tensor enqueueLayers(int64_t tokens, int32_t seqs, int32_t max_seqlen);
  void enqueueScoreHead(const Tensor& x, int32_t seqs, const ScoreRequest& req);
  struct Bucket {
    int64_t tokens = 0;
    int32_t seqs = 0;
  };
  Result<Bucket> bucketFor(int64_t tokens, int32_t seqs) const;

  Backend& backend_;
  ModelConfig config_;
  PoolingConfig pooling_;
  bool causal_ = true;
  int64_t max_tokens_ = 0;
  int64_t rotary_dim_ = 0;

  OwnedTensor embed_, final_norm_, lm_head_own_, score_, rope_cos_, rope_sin_;
  const OwnedTensor* lm_head_ = nullptr;  // &embed_ when tied
  std::vector<Layer> layers_;

  // Workspace, sized for max_tokens_.
  OwnedTensor ids_, positions_, cu_seqlens_, residual_, x_, qkv_buf_, attn_, gate_up_buf_, mlp_,
      pooled_, scores_;
  // Host staging for positions and cu_seqlens.
  std::vector<int32_t> host_positions_, host_cu_;
  std::vector<int32_t> host_pad_ids_;  // zeros: the padding sequence's token ids
  int32_t max_seqlen_ = 0;
  uint32_t fp8_ = 0;                   // [TAG_EMBED_FP8] Qwen3Options::fp8_projections
  uint32_t graph_id_ = 0;              // this model's number in its graph keys
  OwnedTensor fp8_codes_, fp8_scales_;  // the FP8 activation workspace (one GEMM input at a time)
  int64_t graph_tokens_ = 0;  // padded-bucket capacity of the workspace (0: no graph path)
  int32_t graph_seqs_ = 0;
};

}  // namespace garden::rose
