#pragma once
// gpt-oss over the ranks of one node (docs/multi-gpu.md): one GptOssShard per rank, each on its
// own Backend (one GPU; on the CPU, one thread per rank in tests), holding its slice of the
// weights and of the KV cache, talking to its peers through Communicators (collective.h). The
// single-GPU model (services/rose/model/gpt_oss.h) is untouched: tp = dp = ep = 1 keeps using it.
//
// What a rank holds (shard_plan.h has the arithmetic):
//   attention  tp rank t of its dp group: its q heads and their kv heads (rows of q/k/v and
//              their biases, sinks), the matching columns of W_o (bias on t = 0 only); an
//              all-reduce over the tp group after the O projection.
//   MoE        ep group g: experts evenSplit(E, ep)[g]; its etp rank j: intermediate columns
//              unitSplit(I, 32, etp)[j] of those experts (W1 rows 2i/2i+1, W2 columns i, b1),
//              b2 on j = 0 only. The router is replicated (every rank routes its tokens).
//              dp == 1: every rank has every token; a rank computes its (token, expert) pairs and
//              an all-reduce over the world sums them (the combine). dp > 1: the tp ranks of a
//              dp group take disjoint shares of its tokens and dispatch each to the ranks holding
//              its experts by all-to-all, which send back weighted partial sums (the combine),
//              then an all-gather in the tp group [TAG_EP_DISPATCH].
//   vocabulary tp rank t: rows evenSplit(V, tp)[t] of the embedding (masked lookup +
//              all-reduce) and of lm_head (logit columns gathered in the tp group).
//   KV cache   its kv heads, the blocks of its dp group: tulip's block ids [d·B, (d+1)·B) live
//              in group d (B = blocks per group); a sequence's blocks all lie in one group, and
//              that group runs the sequence.
// Every rank is handed the same step; rank 0 writes the logits and sampled ids (the rows of the
// other dp groups reach it by all-to-all) and broadcasts the sampled ids for [TAG_LLM_PREV_TOKEN].
//
// Threads: as GptOssModel (load on any thread; enqueueStep on the backend's launching thread).
// enqueueStep synchronizes the host with the queue where the expert dispatch needs routing
// results (EP layouts), so on a GPU backend it is not yet the asynchronous step of the
// single-GPU model (see docs/multi-gpu.md, "Not there yet").

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/model/llm_step.h"
#include "services/rose/ops/backend.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/ops/paged_kv_cache.h"
#include "services/rose/parallel/collective.h"
#include "services/rose/parallel/shard_ops.h"
#include "services/rose/parallel/shard_plan.h"

namespace garden::rose {

struct ShardComms {
  Communicator* world = nullptr;  // all tp·dp ranks, rank order = global rank
  Communicator* tp = nullptr;     // the tp ranks of this rank's dp group, rank order = tp rank
};

// Per-layer outputs, for tests (host copies, which synchronize): the attention block's output
// (after the all-reduce) and the MoE block's output (after the combine), for the tokens this
// rank's dp group runs; token[i] is the step-wide row (in sequence order) of local row i.
struct LayerTap {
  std::vector<int32_t> token;
  std::vector<std::vector<float>> attn, moe;  // [layer][local rows x hidden]
};

class GptOssShard {
 public:
  static Result<std::unique_ptr<GptOssShard>> load(const std::string& dir, Backend& backend,
                                                   LlmOps& ops, ShardOps& shard_ops,
                                                   const GptOssOptions& opts,
                                                   const ParallelConfig& parallel, int32_t rank,
                                                   ShardComms comms);
  ~GptOssShard();

  const GptOssConfig& config() const { return config_; }
  const ParallelConfig& parallel() const { return par_; }
  int32_t rank() const { return coords_.rank; }
  int64_t vocabSize() const { return config_.base.vocab_size; }
  int64_t maxModelLen() const { return max_model_len_; }

  // This rank's cache: its kv heads, blocks_per_group blocks; with window_blocks_per_group > 0
  // its sliding layers in a window pool of that many blocks [TAG_KV_WINDOW_GROUP] (tulip's
  // window ids form dp groups of that size, like the full pool's).
  KvCacheShape kvShape(int32_t blocks_per_group, int32_t block_size,
                       int32_t window_blocks_per_group = 0) const;
  // The sliding layers' window in keys; 0 when no layer slides.
  int32_t slidingWindow() const;
  DType kvDType() const { return backend_.activationDType(); }

  // The unsharded model's step checks against tulip's dp·B block ids, plus: every sequence's
  // blocks lie in one dp group. INVALID_ARGUMENT naming the sequence and field. Same answer on
  // every rank.
  Status validate(const LlmStep& step, const PagedKvCache& kv) const {
    return validate(step, kv, last_sampled_);
  }
  // prev_row checked against `prev_sampled` ids (a caller validating before the previous step
  // was enqueued, as GptOssModel::validate).
  Status validate(const LlmStep& step, const PagedKvCache& kv, int64_t prev_sampled) const;

  // Every rank, the same (validated) step. Rank 0: logits_out F32 [logitsRows(step), vocab],
  // sampled_out and logprobs_out as GptOssModel::enqueueStep; other ranks ignore all three (may
  // be null). Only rank 0 samples, so only rank 0 reads the step's sampler-state words and
  // fields [TAG_LLM_SAMPLER_STATE] (its LlmOps hold the state slots); the other ranks may be
  // handed the step without them (state_offset -1, default sampling).
  void enqueueStep(const LlmStep& step, PagedKvCache& kv, float* logits_out, int32_t* sampled_out,
                   llm::LlmTokenLogprobs* logprobs_out = nullptr);
  // Whether rank 0's sampler implements logprobs, min_p, penalties and logit_bias.
  bool supportsSamplerState() const { return ops_.supportsSamplerState(); }

  void setLayerTap(LayerTap* tap) { tap_ = tap; }

 private:
  struct Layer {
    OwnedTensor input_norm, post_norm, qkv, qkv_bias, o, o_bias, sinks;
    OwnedTensor router, router_bias, b1, b2;
    OwnedTensor router_f32t;  // [TAG_ROUTER_F32] the norm folded in (route_f32_ only)
    ExpertWeights w1, w2;  // [E_local, 2·I_local, H] and [E_local, H, I_local], dense
  };

  GptOssShard(Backend& b, LlmOps& ops, ShardOps& so) : backend_(b), ops_(ops), shard_ops_(so) {}
  void moeReplicated(const Layer& L, const Tensor& x, const Tensor& tk_ids, const Tensor& tk_w,
                     const Tensor& out);
  void moeDispatched(const Layer& L, const Tensor& x, const Tensor& tk_ids, const Tensor& tk_w,
                     int64_t t_local, const Tensor& out);
  void runExpertPairs(const Layer& L, const Tensor& x_rows, const DispatchPairs& pairs,
                      const Tensor& out);
  void tapRows(std::vector<std::vector<float>>& dst, const Tensor& src, int64_t rows);

  Backend& backend_;
  LlmOps& ops_;
  ShardOps& shard_ops_;
  GptOssConfig config_;
  GptOssOptions opts_;
  ParallelConfig par_;
  RankCoords coords_;
  ShardComms comms_;
  AttentionShard attn_shard_;
  MoeShard moe_shard_;
  IndexRange vocab_;
  int64_t max_model_len_ = 0;
  int64_t table_capacity_ = 0;
  int64_t last_sampled_ = 0;
  bool f32_res_ = false;    // the residual stream in f32 on a narrower backend (see load())
  bool route_f32_ = false;  // route from that stream (LlmOps::moeRouteF32), as GptOssModel
  LayerTap* tap_ = nullptr;

  OwnedTensor embed_, lm_head_, final_norm_, rope_cos_, rope_sin_;
  std::vector<Layer> layers_;

  // Workspace (sizes in gpt_oss_shard.cc load()).
  // slots_w_ / block_tables_w_: the sliding layers' through the window tables (when a layer
  // slides) [TAG_KV_WINDOW_GROUP].
  OwnedTensor slots_w_, block_tables_w_;
  OwnedTensor ids_, positions_, slots_, cu_q_, block_tables_, rows_, residual_, x_, moe_out_,
      moe_mine_, qkv_buf_, attn_, router_logits_, topk_ids_, topk_w_, gathered_, logits_part_,
      logits_cols_, logits_group_, logits_recv_, logits_, sampled_, prev_pairs_, pair_rows_,
      pair_ids_, pair_w_, pair_x_, pair_y_, send_x_, send_ids_, send_w_, send_rows_, recv_x_,
      recv_ids_, recv_w_, part_, back_, perm_, sampled_lp_;
  // Host staging (valid until the next enqueueStep()).
  std::vector<int32_t> h_slots_w_, h_tables_w_;
  std::vector<int32_t> h_ids_, h_positions_, h_slots_, h_cu_, h_tables_, h_prev_pairs_, h_windows_,
      h_topk_ids_, h_recv_ids_, h_local_rows_, h_perm_, h_i32_;
  std::vector<float> h_topk_w_, h_recv_w_, h_f32_;
  std::vector<SampleRow> h_samples_;
  std::vector<SamplerStateReset> h_resets_;
  std::vector<LogitBias> h_bias_;
};

}  // namespace garden::rose
