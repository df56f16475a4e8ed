#pragma once
// The gpt-oss decoder (gpt-oss-20b / gpt-oss-120b and any GptOssForCausalLM checkpoint), written
// once against the op interfaces (services/rose/ops/backend.h + services/rose/ops/llm_ops.h).
// Spec: the project's gpt-oss specification (gpt-oss.md).
//
// Loading: DIR/config.json + safetensors (one file or an index + shards), Hugging Face names.
// Expert weights come as published (MXFP4 `*_blocks` / `*_scales`) or dense (a bf16/f32
// re-export: `mlp.experts.gate_up_proj` in transformers' [E, H, 2I] layout, or [E, 2I, H]); both
// are W1 [E, 2I, H] (gate/up rows interleaved) and W2 [E, H, I]. MXFP4 experts stay MXFP4 on a
// backend whose LLM ops run them (CUDA: uploadMxfp4Experts, straight from the mmap'ed file) or
// are dequantized exactly at load (the CPU reference; GptOssOptions::moe_weights = kDense).
// q/k/v are fused into one GEMM; sinks are kept in F32.
//
// Forward of one step (services/rose/model/llm_step.h): per sequence, new tokens at positions
// position.., K/V written into the paged cache through its block table, then
//   embed → L × [RMSNorm → QKV(+bias) → YaRN RoPE (half split) + K/V into the paged cache →
//   paged attention with the per-head sink (sliding window on `sliding_attention` layers) →
//   O(+bias) → add+RMSNorm → router (f32 logits, +bias) → top-k, softmax over the selected →
//   clamped SwiGLU experts (+biases) → add]
//   → final RMSNorm → unembedding of the rows asked for → logits and/or sampled token ids.
// Chunked prefill is the same call with fewer tokens per step; decode is one token per step.
//
// Threads: load() on any thread; enqueueStep() on the backend's launching thread (inside
// Backend::launch(), or directly followed by Backend::synchronize() in tests). The step's host
// arrays are read while enqueueStep() runs; results land in the caller's buffers when the
// enqueued work completes.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/model_config.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "services/rose/ops/paged_kv_cache.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/model/rope.h"
#include "services/rose/model/llm_step.h"
#include "services/rose/model/moe_chunk_runs.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {

struct GptOssConfig {
  ModelConfig base;
  RopeScaling rope;
  float swiglu_limit = 7.f;
  float swiglu_alpha = 1.702f;
  std::string quant_method;      // quantization_config.quant_method ("mxfp4" for the published)
  std::vector<uint8_t> sliding;  // per layer: 1 = sliding-window attention
};

// Parses config.json text (the ModelConfig fields plus rope_scaling / rope_parameters YaRN keys,
// swiglu_limit, quantization_config, layer_types defaulting to sliding on even layers).
// INVALID_ARGUMENT naming the field.
Result<GptOssConfig> parseGptOssConfig(std::string_view json,
                                       std::string_view label = "config.json");
Result<GptOssConfig> loadGptOssConfig(const std::string& dir);

// [TAG_ROUTER_F32] A layer's router weights with its post-attention norm folded in, for
// LlmOps::moeRouteF32: f32 [H, E] (wt[k][e] = router[e][k] * norm[k]), or the ops' bf16 split
// when `split` (ops.routerF32Split()). router [E, H], norm [H] as in the checkpoint.
Result<OwnedTensor> uploadGptOssRouterF32(Backend& b, const TensorView& router,
                                          const TensorView& norm, bool split);

// [TAG_KV_WINDOW_GROUP] The sliding layers' window in keys (0 when no layer slides), and a cache
// shape given a window pool of `num_blocks_window` blocks for them (unchanged when that is 0, no
// layer slides or there are more than 64 layers). Shared by GptOssModel and GptOssShard.
int32_t slidingWindowOf(const GptOssConfig& c);
void addWindowPool(const GptOssConfig& c, int32_t num_blocks_window, KvCacheShape& shape);

// How the experts stay resident: kAuto keeps a published MXFP4 checkpoint in MXFP4 when the
// backend's LLM ops run MXFP4 experts (CUDA), else dense (the weight dtype; the CPU reference
// always dequantizes at load). kFp8: MXFP4 resident plus an FP8 e4m3 copy with 128x128 block
// scales requantized on the GPU at load, which the ops use for prefill-sized steps (CUDA;
// [TAG_FP8_EXPERTS] in docs/gpt-oss-cuda.md) — both copies stay in memory. kMxfp4Bf16: MXFP4
// resident plus a bf16 copy dequantized once at load, which the bf16 cuBLASLt prefill path reads
// instead of dequantizing every expert per call (CUDA; [TAG_MOE_BF16_COPY]; same bits as without
// it; 4.5x the expert memory: gpt-oss-20b +38 GB, so for models whose copy fits).
enum class MoeWeightsMode : uint8_t { kAuto = 0, kDense = 1, kMxfp4 = 2, kFp8 = 3, kMxfp4Bf16 = 4 };

// The --moe-weights names (rose, rose_llm_bench): auto, mxfp4, fp8, mxfp4-bf16, bf16 (kDense).
// False for any other name (`out` untouched).
bool moeWeightsFromName(std::string_view name, MoeWeightsMode* out);
// The --moe-weights name of a mode.
const char* moeWeightsName(MoeWeightsMode mode);

struct GptOssOptions {
  int64_t max_batch_tokens = 2048;  // new tokens per step
  int32_t max_seqs = 256;           // sequences per step
  int64_t max_logits_rows = 256;    // logits rows computed per step (returned + sampled)
  int64_t max_model_len = 0;        // 0: min(max_position_embeddings, 131072)
  int32_t min_block_size = 16;      // sizes the block-table workspace: max_seqs sequences of
                                    // max_model_len tokens in blocks of this many tokens
  MoeWeightsMode moe_weights = MoeWeightsMode::kAuto;
  // Decode steps (every sequence one new token, sampled, no logits returned) of up to
  // kMaxGraphSeqs sequences run as CUDA graphs on a backend that has them: padded to a power of
  // two sequences, the block tables to a power-of-two stride, captured lazily per bucket.
  bool cuda_graphs = true;
  // The residual stream in f32 (the cuda backend's own default stream is bf16, rounded after
  // every add): 24+ adds of a random-weight model's large activations lose the top-1 of close
  // logits in bf16 (tests/gpu/hf_llm_bar.py). false: the backend's residualDType() (A/B runs).
  bool f32_residual = true;
  // With the f32 stream on a backend whose activations are narrower (CUDA: bf16): the router
  // reads the f32 stream with the post-attention norm folded into f32 router weights
  // (LlmOps::moeRouteF32 [TAG_ROUTER_F32]) instead of the bf16 normalized row, so near-tied
  // expert logits choose as the f32 reference does. false: the router GEMM on the bf16 row.
  bool f32_router = true;
  // RMSNorm outputs rounded once, after the weight multiply in f32 (the spec's and
  // GptOssRMSNorm's rounding); false: rounded before it too (the Qwen3 convention the CUDA
  // backend used before; A/B runs).
  bool norm_round_once = true;
  // [TAG_COMBINE_NORM] Each layer's MoE combine fused into the next RMSNorm (one kernel, no moe
  // tensor; the same bits) on ops that support it (LlmOps::supportsCombineNorm: CUDA). On since
  // it was measured on the H200 (2026-12-03: decode b1@8k 3.211 -> 3.085 ms, b64@1k 8.982 ->
  // 8.954 ms; GpuGptOss.CombineNormFusionIsBitExact passed); rose_llm_bench
  // --fuse-combine-norm off for the A/B.
  bool fuse_combine_norm = true;
  // Profiling only (rose_llm_bench --profile-skip): op groups left out of every forward pass, so
  // a step's time without them, against the full step, is their cost inside the CUDA graph. The
  // results are wrong when any bit is set. Bits: kSkip* below.
  uint32_t profile_skip = 0;
  static constexpr uint32_t kSkipNorm = 1, kSkipQkv = 2, kSkipRope = 4, kSkipAttn = 8,
                            kSkipOproj = 16, kSkipRouter = 32, kSkipMoe = 64, kSkipHead = 128;
  // [TAG_ATTN_F16] The attention block in IEEE fp16 instead of the backend's bf16: the QKV and
  // O-proj weights and biases, the attention-input norm's output, q/k/v, the KV cache, the
  // attention output and the O-proj output (10 significand bits instead of 7; the MoE side stays
  // bf16). Needs a bf16 backend (CUDA) and the f32 residual stream. Weights convert exactly where
  // their magnitude is within fp16's normal range (bf16 values below 2^-14 lose bits, above
  // 65504 fail to load).
  bool attn_f16 = false;
  // The MoE side in fp16 the same way [TAG_ATTN_F16]: the post-attention norm's output, the expert
  // biases (and dense experts), the expert GEMMs (MXFP4 dequantized to fp16: every scale byte
  // must be <= 128), their outputs and the combine. Needs the f32 router (route from the f32
  // stream); not with --moe-weights fp8 / mxfp4-bf16. lm_head stays bf16.
  bool moe_f16 = false;
  // lm_head in fp16 the same way: its weight and the final norm's output (the logits stay f32).
  // Needs a bf16 backend and the f32 stream.
  bool head_f16 = false;
  // The MoE output (the combine of the expert rows) kept in f32 on its way into the f32 stream
  // instead of rounded to the activation type (A/B: rose_llm_bench --moe-out f32). Needs the f32
  // stream.
  bool moe_out_f32 = false;
  // [TAG_PROJ_F32] The QKV and O-proj GEMMs write f32 (their biases in f32): q/k/v are rounded
  // once, after RoPE, into fp16 q and the cache (not also at the GEMM's output), and the O-proj
  // output joins the f32 stream unrounded — the roundings a TF32 run does not make. Needs
  // attn_f16 (the f16-in / f32-out GEMM; A/B: rose_llm_bench --proj-out f16).
  bool proj_f32 = false;
  // With proj_f32, which of the two write f32 (A/B of the real-shape bar: rose_llm_bench
  // --proj-out qkv / o). Both by default.
  bool proj_f32_qkv = true;
  bool proj_f32_o = true;
  bool qkvF32() const { return proj_f32 && proj_f32_qkv; }
  bool oF32() const { return proj_f32 && proj_f32_o; }
};

// `rose --dtype` [TAG_ATTN_F16]: "bfloat16" leaves `o` as it is; "float16" sets attn_f16,
// moe_f16, head_f16, moe_out_f32 and proj_f32. false for any other name.
bool applyGptOssDtype(std::string_view dtype, GptOssOptions& o);

// The step checks of GptOssModel::validate that do not depend on the cache's head layout (token
// ids, positions, block tables inside [0, num_blocks), KV slots, sampling, budgets), shared with
// the sharded model (services/rose/parallel/gpt_oss_shard.h). INVALID_ARGUMENT naming the
// sequence and field.
struct GptOssStepLimits {
  int64_t vocab = 0;
  int64_t max_batch_tokens = 0;
  int64_t max_seqs = 0;
  int64_t max_logits_rows = 0;
  int64_t max_model_len = 0;
  int64_t table_capacity = 0;  // block-table entries of one step (sequences x longest table)
  bool sampler_state = false;  // the ops implement state slots, penalties, logprobs, min_p
  bool token_mask = false;     // the ops honour token masks [TAG_TOKEN_MASK]
  // [TAG_KV_WINDOW_GROUP] The cache's window pool (0: none; then no sequence may carry a window
  // table) and the sliding layers' window in keys. With one, every sequence carries its window
  // table (LlmStepSeq.window_table): ids in [-1, num_blocks_window), present for every block
  // holding a position position - window + 1 .. position + num_tokens - 1, no two tokens
  // writing one of its slots.
  int32_t num_blocks_window = 0;
  int32_t window = 0;
};
Status validateGptOssStep(const GptOssStepLimits& lim, const LlmStep& step, int32_t block_size,
                          int32_t num_blocks, int64_t prev_sampled);

// [TAG_LLM_SAMPLER_STATE] The sampler-state reloads a validated step asks for, in sequence
// order; `bias` holds the logit biases the resets' spans point into (and step.state the rest).
void samplerStateResets(const LlmStep& step, std::vector<SamplerStateReset>& resets,
                        std::vector<LogitBias>& bias);

class GptOssModel {
 public:
  static Result<std::unique_ptr<GptOssModel>> load(const std::string& dir, Backend& backend,
                                                   LlmOps& ops, const GptOssOptions& opts);
  ~GptOssModel();

  const GptOssConfig& config() const { return config_; }
  int64_t vocabSize() const { return config_.base.vocab_size; }
  int64_t maxModelLen() const { return max_model_len_; }
  // Whether the ops' sampler implements logprobs, min_p, penalties and logit_bias (validate()
  // refuses a step that asks for them otherwise); announced as shm::kLlmCapSamplerState.
  bool supportsSamplerState() const { return ops_.supportsSamplerState(); }
  // Whether the ops honour token masks (structured outputs); shm::kLlmCapTokenMask.
  bool supportsTokenMask() const { return ops_.supportsTokenMask(); }
  // Whether a step may bring its masks late (LlmStep::await_masks); shm::kLlmCapLateMask.
  bool supportsLateMask() const { return ops_.supportsTokenMask() && ops_.supportsLateMask(); }
  // The cache shape this model needs for `num_blocks` blocks of `block_size` tokens; with
  // `num_blocks_window` > 0 its sliding-window layers live in a window pool of that many blocks
  // [TAG_KV_WINDOW_GROUP] (a model without sliding layers ignores it: slidingWindow() == 0).
  KvCacheShape kvShape(int32_t num_blocks, int32_t block_size, int32_t num_blocks_window = 0) const;
  // The sliding layers' window in keys; 0 when no layer slides.
  int32_t slidingWindow() const;
  // The dtype the cache must have (the backend's activation dtype).
  DType kvDType() const;

  // Host-side checks (counts, ranges, token ids, block tables cover the tokens, block ids inside
  // the cache, no two tokens writing one slot, sampling params, budgets): INVALID_ARGUMENT
  // naming the sequence and field. enqueueStep() requires a step that passed.
  // prev_row is checked against the ids the last enqueued step sampled; a caller that validates
  // a step before the previous one was enqueued (LlmRunner: enqueueing runs on the backend's
  // queue) passes that step's sample count as `prev_sampled` instead.
  Status validate(const LlmStep& step, const PagedKvCache& kv) const {
    return validate(step, kv, last_sampled_);
  }
  Status validate(const LlmStep& step, const PagedKvCache& kv, int64_t prev_sampled) const;

  // Enqueues the step. logits_out: F32 [logitsRows(step), vocab] (may be null when that is 0);
  // sampled_out: I32, one id per sequence with sample != 0, in sequence order (may be null when
  // none samples); logprobs_out: one llm::LlmTokenLogprobs per sampled id (may be null when no
  // sampling sequence has sampling.logprobs >= 0). All are written when the enqueued work
  // completes. Sampler-state reloads (state_offset >= 0) happen before anything samples. A sequence with
  // prev_row >= 0 takes its first token from row prev_row of the ids the previous enqueued
  // step sampled ([TAG_LLM_PREV_TOKEN]; validate() checks the row exists).
  void enqueueStep(const LlmStep& step, PagedKvCache& kv, float* logits_out, int32_t* sampled_out,
                   llm::LlmTokenLogprobs* logprobs_out = nullptr);

  // Load time, optional: readies the dense projections (QKV, O-proj, lm_head, the bf16 router)
  // for every row count a step can bring (Backend::prewarmLinear: on CUDA, the GEMM tuning of
  // each M bucket, which otherwise stalls the first step of each size — the first burst of a
  // fresh mesh). Returns the number of (weight, row count) runs.
  Result<int64_t> prewarmGemms();

  // Largest decode batch replayed as a CUDA graph; graph buckets used so far (tests, benches).
  static constexpr int32_t kMaxGraphSeqs = 256;
  uint64_t graphSteps() const { return graph_steps_; }

  // Expert format the model loaded (MXFP4 resident or dense).
  ExpertFormat expertFormat() const { return expert_format_; }
  // --moe-weights fp8: whether the experts carry the FP8 copy; its weights over all layers that
  // e4m3 does not hold exactly, and all its non-zero weights.
  bool fp8Experts() const { return fp8_experts_; }
  uint64_t fp8InexactWeights() const { return fp8_inexact_; }
  uint64_t fp8NonzeroWeights() const { return fp8_nonzero_; }

 private:
  struct Layer {
    OwnedTensor input_norm, post_norm, qkv, qkv_bias, o, o_bias, sinks;
    OwnedTensor router, router_bias, b1, b2;
    OwnedTensor router_f32t;  // [H, E] f32 (router ⊙ post_norm)ᵀ when route_f32_ (or its bf16
                              // split [2, Ep, Hp] when the ops ask, [TAG_ROUTER_MMA])
    ExpertWeights w1, w2;  // [E, 2I, H] and [E, H, I]
  };

  GptOssModel(Backend& b, LlmOps& ops) : backend_(b), ops_(ops) {}

  Backend& backend_;
  LlmOps& ops_;
  GptOssConfig config_;
  GptOssOptions opts_;
  int64_t max_model_len_ = 0;
  ExpertFormat expert_format_ = ExpertFormat::kDense;
  bool fp8_experts_ = false;
  bool route_f32_ = false;  // GptOssOptions::f32_router in effect
  uint64_t fp8_inexact_ = 0, fp8_nonzero_ = 0;
  int64_t last_sampled_ = 0;  // ids the last enqueued step sampled [TAG_LLM_PREV_TOKEN]
  GraphExecutor* graphs_ = nullptr;  // decode graphs (null: eager only)
  uint64_t graph_steps_ = 0;         // steps that went through graphs_

  OwnedTensor embed_, lm_head_, final_norm_, rope_cos_, rope_sin_;
  std::vector<Layer> layers_;

  // Workspace.
  // slots_w_ / block_tables_w_: the sliding layers' slot mapping and tables through the window
  // tables [TAG_KV_WINDOW_GROUP] (allocated when a layer slides).
  OwnedTensor ids_, positions_, slots_, slots_w_, cu_q_, block_tables_, block_tables_w_, rows_,
      residual_, x_, xa_, xm_, xf_, proj32_, moe_out_, qkv_buf_, attn_, router_logits_, topk_ids_,
      topk_w_, gathered_, logits_, sampled_, prev_pairs_, sampled_lp_;
  // xa_: the attention block's input and O-proj output in fp16 when opts_.attn_f16 (else x_ serves)
  // [TAG_ATTN_F16]; attn_dtype_: the attention block's activation type. proj32_: the f32 output
  // of QKV, then of O-proj, when opts_.proj_f32 [TAG_PROJ_F32] ([T, max(qkv width, H)]).
  DType attn_dtype_ = DType::kF32;
  int64_t table_capacity_ = 0;  // elements of block_tables_
  // Host staging (valid until the next enqueueStep()).
  std::vector<MoeRun> moe_runs_;  // [TAG_MOE_LT_BF16] this step's MoE calls (moe_chunk_runs.h)
  std::vector<int32_t> h_ids_, h_positions_, h_slots_, h_slots_w_, h_cu_, h_tables_, h_tables_w_,
      h_rows_, h_last_row_, h_prev_pairs_, h_windows_;
  std::vector<SampleRow> h_samples_;
  std::vector<SamplerStateReset> h_resets_;
  std::vector<LogitBias> h_bias_;
};

}  // namespace garden::rose
