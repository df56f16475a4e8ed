#include "services/rose/parallel/gpt_oss_shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/safetensors.h"
#include "services/rose/model/mxfp4.h"
#include "services/rose/model/weights.h"

namespace garden::rose {
namespace {

// Rows `rows` and columns `cols` of a [R, C] tensor (a 1-D tensor is [R, 1]), appended to `out`
// as f32, row-major.
Status appendSlice(const TensorView& t, IndexRange rows, IndexRange cols, std::vector<float>& out) {
  const int64_t c = t.shape.size() == 2 ? t.shape[1] : 1;
  CHECK(rows.end() <= t.shape[0] && cols.end() <= c);
  const size_t es = dtypeSize(t.dtype);
  const size_t at = out.size();
  out.resize(at + static_cast<size_t>(rows.count * cols.count));
  for (int64_t r = 0; r < rows.count; ++r) {
    RETURN_IF_ERROR(
        convertToF32(t.data + static_cast<size_t>((rows.begin + r) * c + cols.begin) * es, t.dtype,
                     static_cast<size_t>(cols.count),
                     out.data() + at + static_cast<size_t>(r * cols.count))
            .withContext(t.name));
  }
  return okStatus();
}

Result<OwnedTensor> uploadHost(Backend& b, DType dtype, std::initializer_list<int64_t> dims,
                               const std::vector<float>& host) {
  ASSIGN_OR_RETURN(OwnedTensor t, b.allocateTensor(dtype, dims));
  CHECK(static_cast<int64_t>(host.size()) == t.view.numel());
  RETURN_IF_ERROR(b.uploadConvert(
      t.view, HostView{host.data(), DType::kF32, static_cast<int64_t>(host.size())}));
  return t;
}

// One slice of a checkpoint tensor, uploaded.
Result<OwnedTensor> uploadSlice(Backend& b, DType dtype, const SafetensorsCheckpoint& ck,
                                const std::string& name, const std::vector<int64_t>& shape,
                                IndexRange rows, IndexRange cols) {
  ASSIGN_OR_RETURN(const TensorView* t, requireHfTensor(ck, name, shape));
  std::vector<float> host;
  RETURN_IF_ERROR(appendSlice(*t, rows, cols, host));
  if (shape.size() == 1) return uploadHost(b, dtype, {rows.count}, host);
  return uploadHost(b, dtype, {rows.count, cols.count}, host);
}

Result<ExpertWeights> uploadDenseExperts(Backend& b, DType dtype, int64_t e, int64_t rows,
                                         int64_t cols, const std::vector<float>& host) {
  ASSIGN_OR_RETURN(OwnedTensor t, uploadHost(b, dtype, {e, rows, cols}, host));
  ExpertWeights w;
  w.format = ExpertFormat::kDense;
  w.experts = e;
  w.rows = rows;
  w.cols = cols;
  w.dense = t.view;
  w.storage.push_back(std::move(t.buffer));
  return w;
}

// Expert e of a projection [E, out, in] as f32 [out, in]: from MXFP4 blocks/scales, or dense
// ([E, out, in], or transformers' [E, in, out] when `transposed`).
Status readExpert(const TensorView* blocks, const TensorView* scales, const TensorView* dense,
                  bool transposed, int64_t e, int64_t out, int64_t in, std::vector<float>& dst) {
  dst.resize(static_cast<size_t>(out * in));
  if (blocks != nullptr) {
    const int64_t groups = in / 32;
    dequantizeMxfp4(reinterpret_cast<const uint8_t*>(blocks->data) + e * out * groups * 16,
                    reinterpret_cast<const uint8_t*>(scales->data) + e * out * groups, out, groups,
                    dst.data());
    return okStatus();
  }
  const size_t es = dtypeSize(dense->dtype);
  std::vector<float> raw(dst.size());
  RETURN_IF_ERROR(convertToF32(dense->data + static_cast<size_t>(e * out * in) * es, dense->dtype,
                               raw.size(), raw.data())
                      .withContext(dense->name));
  if (!transposed) {
    dst.swap(raw);
    return okStatus();
  }
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      dst[static_cast<size_t>(o * in + i)] = raw[static_cast<size_t>(i * out + o)];
    }
  }
  return okStatus();
}

Tensor i32View(const OwnedTensor& t, int64_t n) { return Tensor(t.view.data, DType::kI32, {n}); }

}  // namespace

GptOssShard::~GptOssShard() = default;

Result<std::unique_ptr<GptOssShard>> GptOssShard::load(const std::string& dir, Backend& backend,
                                                       LlmOps& ops, ShardOps& shard_ops,
                                                       const GptOssOptions& opts,
                                                       const ParallelConfig& parallel, int32_t rank,
                                                       ShardComms comms) {
  std::unique_ptr<GptOssShard> m(new GptOssShard(backend, ops, shard_ops));
  ASSIGN_OR_RETURN(m->config_, loadGptOssConfig(dir));
  // [TAG_CPU_ROW_INVARIANT] As the unsharded model: a sequence's tokens must not depend on its
  // batch (and one rank must give the unsharded model's bits).
  backend.setRowInvariantLinear(true);
  if (opts.max_batch_tokens <= 0 || opts.max_seqs <= 0 || opts.max_logits_rows <= 0 ||
      opts.max_model_len < 0 || opts.min_block_size <= 0) {
    return invalidArgument(
        "gpt-oss options: max_batch_tokens, max_seqs, max_logits_rows and min_block_size must "
        "be positive");
  }
  if (opts.attn_f16 || opts.moe_f16 || opts.head_f16) {  // [TAG_ATTN_F16]
    return invalidArgument("--dtype float16: not implemented for a sharded gpt-oss (--tp / --dp / "
                           "--ep); run one rank");
  }
  const ModelConfig& c = m->config_.base;
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads,
                hkv = c.num_key_value_heads, inter = c.intermediate_size, v = c.vocab_size,
                ne = c.num_local_experts, k = c.num_experts_per_tok;
  RETURN_IF_ERROR(checkParallelConfig(parallel, hq, hkv, ne, inter, v));
  if (rank < 0 || rank >= parallel.world()) {
    return invalidArgument("rank " + std::to_string(rank) + " outside the world of " +
                           std::to_string(parallel.world()));
  }
  if (comms.world == nullptr || comms.world->size() != parallel.world() ||
      comms.world->rank() != rank || comms.tp == nullptr || comms.tp->size() != parallel.tp ||
      comms.tp->rank() != rank % parallel.tp) {
    return invalidArgument("communicators do not match the parallel layout");
  }
  m->opts_ = opts;
  m->par_ = parallel;
  m->coords_ = rankCoords(parallel, rank);
  m->comms_ = comms;
  m->attn_shard_ = attentionShard(hq, hkv, parallel.tp, m->coords_.tp_rank);
  m->moe_shard_ = moeShard(parallel, ne, inter, rank);
  m->vocab_ = evenSplit(v, parallel.tp, m->coords_.tp_rank);
  m->max_model_len_ = opts.max_model_len > 0 ? opts.max_model_len
                                             : std::min<int64_t>(c.max_position_embeddings, 131072);
  const IndexRange qh = m->attn_shard_.q_heads, kh = m->attn_shard_.kv_heads;
  const IndexRange ex = m->moe_shard_.experts, ir = m->moe_shard_.inter;
  const IndexRange all_h{0, h};

  LlmOpsLimits lim;
  lim.max_tokens = std::max<int64_t>(opts.max_batch_tokens * k, opts.max_batch_tokens);
  lim.max_seqs = opts.max_seqs;
  lim.max_logits_rows = opts.max_logits_rows;
  lim.max_model_len = m->max_model_len_;
  lim.vocab = v;
  lim.hidden = static_cast<int32_t>(h);
  lim.intermediate = static_cast<int32_t>(ir.count);
  // Every expert: the router (replicated) routes over all of them; the expert calls take this
  // rank's ex.count <= ne (LlmOps allow fewer than reserved).
  lim.num_experts = static_cast<int32_t>(ne);
  lim.top_k = static_cast<int32_t>(k);
  lim.num_q_heads = static_cast<int32_t>(qh.count);
  lim.num_kv_heads = static_cast<int32_t>(kh.count);
  lim.head_dim = static_cast<int32_t>(d);
  RETURN_IF_ERROR(ops.reserve(lim));

  Backend& b = backend;
  const DType wt = b.weightDType();
  // The residual stream in f32 on a backend with narrower activations (CUDA), as GptOssModel
  // keeps it (GptOssOptions::f32_residual), and the router reading it (f32_router,
  // [TAG_ROUTER_F32]); on the CPU the backend's own stream is f32 already.
  m->f32_res_ = opts.f32_residual && b.activationDType() != DType::kF32;
  m->route_f32_ = m->f32_res_ && opts.f32_router;
  ASSIGN_OR_RETURN(auto ck, SafetensorsCheckpoint::openDir(dir));
  const std::string head_name =
      c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  ASSIGN_OR_RETURN(m->embed_,
                   uploadSlice(b, wt, *ck, "model.embed_tokens.weight", {v, h}, m->vocab_, all_h));
  ASSIGN_OR_RETURN(m->lm_head_, uploadSlice(b, wt, *ck, head_name, {v, h}, m->vocab_, all_h));
  ASSIGN_OR_RETURN(m->final_norm_,
                   uploadSlice(b, wt, *ck, "model.norm.weight", {h}, all_h, {0, 1}));

  m->layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  std::vector<float> host, one;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    Layer& L = m->layers_[static_cast<size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ASSIGN_OR_RETURN(L.input_norm,
                     uploadSlice(b, wt, *ck, p + "input_layernorm.weight", {h}, all_h, {0, 1}));
    ASSIGN_OR_RETURN(L.post_norm, uploadSlice(b, wt, *ck, p + "post_attention_layernorm.weight",
                                              {h}, all_h, {0, 1}));
    // q/k/v rows of this rank's heads, stacked as the fused qkv of the unsharded model.
    const IndexRange q_rows{qh.begin * d, qh.count * d}, kv_rows{kh.begin * d, kh.count * d};
    ASSIGN_OR_RETURN(auto* q, requireHfTensor(*ck, p + "self_attn.q_proj.weight", {hq * d, h}));
    ASSIGN_OR_RETURN(auto* kk, requireHfTensor(*ck, p + "self_attn.k_proj.weight", {hkv * d, h}));
    ASSIGN_OR_RETURN(auto* vv, requireHfTensor(*ck, p + "self_attn.v_proj.weight", {hkv * d, h}));
    host.clear();
    RETURN_IF_ERROR(appendSlice(*q, q_rows, all_h, host));
    RETURN_IF_ERROR(appendSlice(*kk, kv_rows, all_h, host));
    RETURN_IF_ERROR(appendSlice(*vv, kv_rows, all_h, host));
    const int64_t qkv_rows = q_rows.count + 2 * kv_rows.count;
    ASSIGN_OR_RETURN(L.qkv, uploadHost(b, wt, {qkv_rows, h}, host));
    ASSIGN_OR_RETURN(auto* qb, requireHfTensor(*ck, p + "self_attn.q_proj.bias", {hq * d}));
    ASSIGN_OR_RETURN(auto* kb, requireHfTensor(*ck, p + "self_attn.k_proj.bias", {hkv * d}));
    ASSIGN_OR_RETURN(auto* vb, requireHfTensor(*ck, p + "self_attn.v_proj.bias", {hkv * d}));
    host.clear();
    RETURN_IF_ERROR(appendSlice(*qb, q_rows, {0, 1}, host));
    RETURN_IF_ERROR(appendSlice(*kb, kv_rows, {0, 1}, host));
    RETURN_IF_ERROR(appendSlice(*vb, kv_rows, {0, 1}, host));
    ASSIGN_OR_RETURN(L.qkv_bias, uploadHost(b, wt, {qkv_rows}, host));
    // W_o [H, Hq·D]: the columns of this rank's heads; the bias is added once (tp rank 0).
    ASSIGN_OR_RETURN(
        L.o, uploadSlice(b, wt, *ck, p + "self_attn.o_proj.weight", {h, hq * d}, all_h, q_rows));
    if (m->coords_.tp_rank == 0) {
      ASSIGN_OR_RETURN(L.o_bias,
                       uploadSlice(b, wt, *ck, p + "self_attn.o_proj.bias", {h}, all_h, {0, 1}));
    }
    ASSIGN_OR_RETURN(L.sinks,
                     uploadSlice(b, DType::kF32, *ck, p + "self_attn.sinks", {hq}, qh, {0, 1}));
    ASSIGN_OR_RETURN(L.router,
                     uploadSlice(b, wt, *ck, p + "mlp.router.weight", {ne, h}, {0, ne}, all_h));
    ASSIGN_OR_RETURN(L.router_bias,
                     uploadSlice(b, wt, *ck, p + "mlp.router.bias", {ne}, {0, ne}, {0, 1}));
    if (m->route_f32_) {
      ASSIGN_OR_RETURN(auto* rw, requireHfTensor(*ck, p + "mlp.router.weight", {ne, h}));
      ASSIGN_OR_RETURN(auto* nw, requireHfTensor(*ck, p + "post_attention_layernorm.weight", {h}));
      ASSIGN_OR_RETURN(L.router_f32t, uploadGptOssRouterF32(b, *rw, *nw, ops.routerF32Split()));
    }
    // Experts: this rank's experts, its intermediate columns (gate/up rows 2i, 2i+1 together).
    const std::string xp = p + "mlp.experts.";
    ASSIGN_OR_RETURN(auto* b1, requireHfTensor(*ck, xp + "gate_up_proj_bias", {ne, 2 * inter}));
    host.clear();
    RETURN_IF_ERROR(appendSlice(*b1, ex, {2 * ir.begin, 2 * ir.count}, host));
    ASSIGN_OR_RETURN(L.b1, uploadHost(b, wt, {ex.count, 2 * ir.count}, host));
    if (m->moe_shard_.adds_bias) {
      ASSIGN_OR_RETURN(L.b2, uploadSlice(b, wt, *ck, xp + "down_proj_bias", {ne, h}, ex, all_h));
    }
    const TensorView* gu_blocks = findHfTensor(*ck, xp + "gate_up_proj_blocks");
    const TensorView *gu_scales = nullptr, *dn_blocks = nullptr, *dn_scales = nullptr,
                     *gu = nullptr, *dn = nullptr;
    bool transposed = false;
    if (gu_blocks != nullptr) {
      gu_scales = findHfTensor(*ck, xp + "gate_up_proj_scales");
      dn_blocks = findHfTensor(*ck, xp + "down_proj_blocks");
      dn_scales = findHfTensor(*ck, xp + "down_proj_scales");
      if (gu_scales == nullptr || dn_blocks == nullptr || dn_scales == nullptr) {
        return invalidArgument("checkpoint has '" + gu_blocks->name + "' but not all of " + xp +
                               "{gate_up_proj_scales, down_proj_blocks, down_proj_scales}");
      }
      ASSIGN_OR_RETURN(Mxfp4Shape s1, checkMxfp4(*gu_blocks, *gu_scales));
      ASSIGN_OR_RETURN(Mxfp4Shape s2, checkMxfp4(*dn_blocks, *dn_scales));
      if (s1.prefix != std::vector<int64_t>{ne, 2 * inter} || s1.groups * 32 != h ||
          s2.prefix != std::vector<int64_t>{ne, h} || s2.groups * 32 != inter) {
        return invalidArgument("MXFP4 experts of layer " + std::to_string(l) +
                               " do not match config.json's shapes");
      }
    } else {
      gu = findHfTensor(*ck, xp + "gate_up_proj");
      dn = findHfTensor(*ck, xp + "down_proj");
      if (gu == nullptr || dn == nullptr) {
        return invalidArgument("checkpoint has neither MXFP4 nor dense experts under " + xp);
      }
      transposed = gu->shape == std::vector<int64_t>{ne, h, 2 * inter};
      const std::vector<int64_t> w1s = transposed ? std::vector<int64_t>{ne, h, 2 * inter}
                                                  : std::vector<int64_t>{ne, 2 * inter, h};
      const std::vector<int64_t> w2s =
          transposed ? std::vector<int64_t>{ne, inter, h} : std::vector<int64_t>{ne, h, inter};
      if (gu->shape != w1s || dn->shape != w2s) {
        return invalidArgument("dense experts of layer " + std::to_string(l) +
                               " do not match config.json's shapes");
      }
    }
    std::vector<float> w1h, w2h;
    w1h.reserve(static_cast<size_t>(ex.count * 2 * ir.count * h));
    w2h.reserve(static_cast<size_t>(ex.count * h * ir.count));
    for (int64_t e = ex.begin; e < ex.end(); ++e) {
      RETURN_IF_ERROR(readExpert(gu_blocks, gu_scales, gu, transposed, e, 2 * inter, h, one));
      w1h.insert(w1h.end(), one.begin() + 2 * ir.begin * h,
                 one.begin() + 2 * (ir.begin + ir.count) * h);
      RETURN_IF_ERROR(readExpert(dn_blocks, dn_scales, dn, transposed, e, h, inter, one));
      for (int64_t r = 0; r < h; ++r) {
        w2h.insert(w2h.end(), one.begin() + r * inter + ir.begin,
                   one.begin() + r * inter + ir.begin + ir.count);
      }
    }
    ASSIGN_OR_RETURN(L.w1, uploadDenseExperts(b, wt, ex.count, 2 * ir.count, h, w1h));
    ASSIGN_OR_RETURN(L.w2, uploadDenseExperts(b, wt, ex.count, h, ir.count, w2h));
  }

  ASSIGN_OR_RETURN(RopeFrequencies freqs, computeRopeFrequencies(d, c.rope_theta, m->config_.rope,
                                                                 c.max_position_embeddings));
  {
    const int64_t half = d / 2, n = m->max_model_len_;
    std::vector<float> cosv(static_cast<size_t>(n * half)), sinv(cosv.size());
    buildRopeTables(freqs, n, cosv.data(), sinv.data());
    ASSIGN_OR_RETURN(m->rope_cos_, uploadHost(b, DType::kF32, {n, half}, cosv));
    ASSIGN_OR_RETURN(m->rope_sin_, uploadHost(b, DType::kF32, {n, half}, sinv));
  }

  // Workspace. t: tokens of a step (a dp group has at most all of them); r: logits rows.
  // Expert dispatch bounds [TAG_EP_DISPATCH]: a rank receives at most one row per token of the
  // step (≤ t), sends at most one row per (own row, rank holding one of its experts), and
  // computes at most k pairs per row it holds.
  const int64_t t = opts.max_batch_tokens, s = opts.max_seqs, r = opts.max_logits_rows;
  const int64_t n_share = (t + parallel.tp - 1) / parallel.tp;
  const int64_t send_max = n_share * std::min<int64_t>(k * parallel.etp(), parallel.world());
  const DType act = b.activationDType();
  m->table_capacity_ = s * kvBlocksFor(m->max_model_len_, opts.min_block_size);
  ASSIGN_OR_RETURN(m->block_tables_, b.allocateTensor(DType::kI32, {m->table_capacity_}));
  ASSIGN_OR_RETURN(m->ids_, b.allocateTensor(DType::kI32, {t}));
  ASSIGN_OR_RETURN(m->positions_, b.allocateTensor(DType::kI32, {t}));
  ASSIGN_OR_RETURN(m->slots_, b.allocateTensor(DType::kI32, {t}));
  if (m->slidingWindow() > 0) {  // [TAG_KV_WINDOW_GROUP] for a cache with a window pool
    ASSIGN_OR_RETURN(m->block_tables_w_, b.allocateTensor(DType::kI32, {m->table_capacity_}));
    ASSIGN_OR_RETURN(m->slots_w_, b.allocateTensor(DType::kI32, {t}));
  }
  ASSIGN_OR_RETURN(m->cu_q_, b.allocateTensor(DType::kI32, {s + 1}));
  ASSIGN_OR_RETURN(m->rows_, b.allocateTensor(DType::kI32, {r}));
  ASSIGN_OR_RETURN(m->residual_,
                   b.allocateTensor(m->f32_res_ ? DType::kF32 : b.residualDType(), {t, h}));
  ASSIGN_OR_RETURN(m->x_, b.allocateTensor(act, {t, h}));
  ASSIGN_OR_RETURN(m->moe_out_, b.allocateTensor(act, {t, h}));
  ASSIGN_OR_RETURN(m->moe_mine_, b.allocateTensor(act, {n_share, h}));
  ASSIGN_OR_RETURN(m->qkv_buf_, b.allocateTensor(act, {t, (qh.count + 2 * kh.count) * d}));
  ASSIGN_OR_RETURN(m->attn_, b.allocateTensor(act, {t, qh.count * d}));
  ASSIGN_OR_RETURN(m->router_logits_, b.allocateTensor(DType::kF32, {t, ne}));
  ASSIGN_OR_RETURN(m->topk_ids_, b.allocateTensor(DType::kI32, {t, k}));
  ASSIGN_OR_RETURN(m->topk_w_, b.allocateTensor(DType::kF32, {t, k}));
  ASSIGN_OR_RETURN(m->gathered_, b.allocateTensor(act, {r, h}));
  ASSIGN_OR_RETURN(m->logits_part_, b.allocateTensor(DType::kF32, {r, m->vocab_.count}));
  ASSIGN_OR_RETURN(m->logits_cols_, b.allocateTensor(DType::kF32, {r * v}));
  ASSIGN_OR_RETURN(m->logits_group_, b.allocateTensor(DType::kF32, {r, v}));
  ASSIGN_OR_RETURN(m->logits_recv_, b.allocateTensor(DType::kF32, {r, v}));
  ASSIGN_OR_RETURN(m->logits_, b.allocateTensor(DType::kF32, {r, v}));
  ASSIGN_OR_RETURN(m->perm_, b.allocateTensor(DType::kI32, {r}));
  ASSIGN_OR_RETURN(m->sampled_, b.allocateTensor(DType::kI32, {s}));
  if (rank == 0) {
    ASSIGN_OR_RETURN(m->sampled_lp_,
                     b.allocateTensor(DType::kU8,
                                      {s * static_cast<int64_t>(sizeof(llm::LlmTokenLogprobs))}));
  }
  ASSIGN_OR_RETURN(m->prev_pairs_, b.allocateTensor(DType::kI32, {s, 2}));
  ASSIGN_OR_RETURN(m->pair_rows_, b.allocateTensor(DType::kI32, {t * k}));
  ASSIGN_OR_RETURN(m->pair_ids_, b.allocateTensor(DType::kI32, {t * k, 1}));
  ASSIGN_OR_RETURN(m->pair_w_, b.allocateTensor(DType::kF32, {t * k, 1}));
  ASSIGN_OR_RETURN(m->pair_x_, b.allocateTensor(act, {t * k, h}));
  ASSIGN_OR_RETURN(m->pair_y_, b.allocateTensor(act, {t * k, h}));
  if (parallel.dp > 1) {
    ASSIGN_OR_RETURN(m->send_x_, b.allocateTensor(act, {send_max, h}));
    ASSIGN_OR_RETURN(m->send_ids_, b.allocateTensor(DType::kI32, {send_max, k}));
    ASSIGN_OR_RETURN(m->send_w_, b.allocateTensor(DType::kF32, {send_max, k}));
    ASSIGN_OR_RETURN(m->send_rows_, b.allocateTensor(DType::kI32, {send_max}));
    ASSIGN_OR_RETURN(m->back_, b.allocateTensor(act, {send_max, h}));
    ASSIGN_OR_RETURN(m->recv_x_, b.allocateTensor(act, {t, h}));
    ASSIGN_OR_RETURN(m->recv_ids_, b.allocateTensor(DType::kI32, {t, k}));
    ASSIGN_OR_RETURN(m->recv_w_, b.allocateTensor(DType::kF32, {t, k}));
    ASSIGN_OR_RETURN(m->part_, b.allocateTensor(act, {t, h}));
  }
  return m;
}

KvCacheShape GptOssShard::kvShape(int32_t blocks_per_group, int32_t block_size,
                                  int32_t window_blocks_per_group) const {
  KvCacheShape s;
  s.num_layers = static_cast<int32_t>(config_.base.num_hidden_layers);
  s.num_blocks = blocks_per_group;
  s.block_size = block_size;
  s.num_kv_heads = static_cast<int32_t>(attn_shard_.kv_heads.count);
  s.head_dim = static_cast<int32_t>(config_.base.head_dim);
  addWindowPool(config_, window_blocks_per_group, s);
  return s;
}

int32_t GptOssShard::slidingWindow() const { return slidingWindowOf(config_); }

Status GptOssShard::validate(const LlmStep& step, const PagedKvCache& kv,
                             int64_t prev_sampled) const {
  const KvCacheShape& ks = kv.shape();
  const KvCacheShape want = kvShape(ks.num_blocks, ks.block_size, ks.num_blocks_window);
  if (ks.num_layers != want.num_layers || ks.num_kv_heads != want.num_kv_heads ||
      ks.head_dim != want.head_dim || kv.dtype() != kvDType() ||
      ks.num_blocks_window != want.num_blocks_window || ks.window_layers != want.window_layers) {
    return invalidArgument(
        "kv cache shape/dtype does not match this rank's shard (layers, kv heads, head_dim, "
        "dtype, window pool layers)");
  }
  GptOssStepLimits lim;
  lim.vocab = config_.base.vocab_size;
  lim.max_batch_tokens = opts_.max_batch_tokens;
  lim.max_seqs = opts_.max_seqs;
  lim.max_logits_rows = opts_.max_logits_rows;
  lim.max_model_len = max_model_len_;
  lim.table_capacity = table_capacity_;
  lim.sampler_state = ops_.supportsSamplerState();
  lim.num_blocks_window = ks.num_blocks_window * par_.dp;  // [TAG_KV_WINDOW_GROUP]
  lim.window = ks.num_blocks_window > 0 ? slidingWindow() : 0;
  RETURN_IF_ERROR(
      validateGptOssStep(lim, step, ks.block_size, ks.num_blocks * par_.dp, prev_sampled));
  for (size_t i = 0; i < step.seqs.size(); ++i) {
    const LlmStepSeq& s = step.seqs[i];
    const auto table = step.block_ids.subspan(static_cast<size_t>(s.block_offset),
                                              static_cast<size_t>(s.num_blocks));
    for (int32_t id : table) {
      if (dpGroupOfBlock(id, ks.num_blocks) != dpGroupOfBlock(table[0], ks.num_blocks)) {
        return invalidArgument("sequence " + std::to_string(i) + ": block " + std::to_string(id) +
                               " lies in another dp group than block " + std::to_string(table[0]) +
                               " (" + std::to_string(ks.num_blocks) + " blocks per group)");
      }
    }
    if (s.window_table == 1) {  // [TAG_KV_WINDOW_GROUP] the window ids: the same dp group
      const auto wt = step.block_ids.subspan(static_cast<size_t>(s.block_offset + s.num_blocks),
                                             static_cast<size_t>(s.num_blocks));
      const int64_t g = dpGroupOfBlock(table[0], ks.num_blocks);
      for (int32_t id : wt) {
        if (id >= 0 && dpGroupOfBlock(id, ks.num_blocks_window) != g) {
          return invalidArgument("sequence " + std::to_string(i) + ": window block " +
                                 std::to_string(id) + " lies in another dp group than block " +
                                 std::to_string(table[0]) + " (" +
                                 std::to_string(ks.num_blocks_window) +
                                 " window blocks per group)");
        }
      }
    }
  }
  return okStatus();
}

void GptOssShard::tapRows(std::vector<std::vector<float>>& dst, const Tensor& src, int64_t rows) {
  std::vector<float> host(static_cast<size_t>(rows * src.cols()));
  if (rows > 0) {
    backend_.copyToHost(host.data(), src.rowSlice(0, rows), host.size() * sizeof(float));
    CHECK(backend_.synchronize().isOk());
  }
  dst.push_back(std::move(host));
}

// Expert pairs of x_rows (pair j: row pairs.pair_row[j], local expert, weight) → out [R, H] =
// Σ over a row's pairs, in pair order, of w · (W2 a + b2) over this rank's columns.
void GptOssShard::runExpertPairs(const Layer& L, const Tensor& x_rows, const DispatchPairs& pairs,
                                 const Tensor& out) {
  Backend& b = backend_;
  const int64_t np = static_cast<int64_t>(pairs.pair_row.size());
  const Tensor rows = i32View(pair_rows_, np);
  if (np > 0) {
    b.copyToDevice(rows, pairs.pair_row.data(), sizeof(int32_t) * static_cast<size_t>(np));
    const Tensor ids(pair_ids_.view.data, DType::kI32, {np, 1});
    const Tensor w(pair_w_.view.data, DType::kF32, {np, 1});
    b.copyToDevice(ids, pairs.expert.data(), sizeof(int32_t) * static_cast<size_t>(np));
    b.copyToDevice(w, pairs.weight.data(), sizeof(float) * static_cast<size_t>(np));
    const Tensor xp = pair_x_.view.rowSlice(0, np);
    const Tensor yp = pair_y_.view.rowSlice(0, np);
    ops_.gatherRows(x_rows, rows, xp);
    MoeExpertsParams mp;
    mp.num_experts = static_cast<int32_t>(moe_shard_.experts.count);
    mp.top_k = 1;
    mp.hidden = static_cast<int32_t>(config_.base.hidden_size);
    mp.intermediate = static_cast<int32_t>(moe_shard_.inter.count);
    mp.swiglu_limit = config_.swiglu_limit;
    mp.swiglu_alpha = config_.swiglu_alpha;
    ops_.moeExperts(xp, ids, w, L.w1, L.b1.view, L.w2, L.b2.view, yp, mp);
    shard_ops_.combineRows(yp, rows, pairs.pair_row, out);
  } else {
    shard_ops_.combineRows(pair_y_.view.rowSlice(0, 0), rows, {}, out);
  }
}

// dp == 1: every rank holds every token. The pairs whose expert this rank's group holds, then
// the world all-reduce (in enqueueStep) sums ranks — the combine.
void GptOssShard::moeReplicated(const Layer& L, const Tensor& x, const Tensor& tk_ids,
                                const Tensor& tk_w, const Tensor& out) {
  const int64_t t = x.rows(), k = config_.base.num_experts_per_tok;
  if (par_.ep == 1) {  // every expert here: the unsharded op on this rank's columns
    MoeExpertsParams mp;
    mp.num_experts = static_cast<int32_t>(config_.base.num_local_experts);
    mp.top_k = static_cast<int32_t>(k);
    mp.hidden = static_cast<int32_t>(config_.base.hidden_size);
    mp.intermediate = static_cast<int32_t>(moe_shard_.inter.count);
    mp.swiglu_limit = config_.swiglu_limit;
    mp.swiglu_alpha = config_.swiglu_alpha;
    ops_.moeExperts(x, tk_ids, tk_w, L.w1, L.b1.view, L.w2, L.b2.view, out, mp);
    return;
  }
  h_topk_ids_.resize(static_cast<size_t>(t * k));
  h_topk_w_.resize(static_cast<size_t>(t * k));
  backend_.copyToHost(h_topk_ids_.data(), tk_ids, h_topk_ids_.size() * sizeof(int32_t));
  backend_.copyToHost(h_topk_w_.data(), tk_w, h_topk_w_.size() * sizeof(float));
  CHECK(backend_.synchronize().isOk());
  const DispatchPairs pairs = localPairs(par_, config_.base.num_local_experts, coords_.rank,
                                         static_cast<int32_t>(k), h_topk_ids_, h_topk_w_);
  runExpertPairs(L, x, pairs, out);
}

// dp > 1 [TAG_EP_DISPATCH]: this rank's share of its group's rows goes to the ranks holding
// their experts (all-to-all), comes back as weighted partial sums (all-to-all), is summed per row
// in rank order, and the tp group all-gathers the shares. Every rank calls this every layer, also
// with no rows of its own: its experts may serve other groups.
void GptOssShard::moeDispatched(const Layer& L, const Tensor& x, const Tensor& tk_ids,
                                const Tensor& tk_w, int64_t t_local, const Tensor& out) {
  Backend& b = backend_;
  const int32_t k = static_cast<int32_t>(config_.base.num_experts_per_tok);
  const int32_t world = par_.world();
  const IndexRange share = evenSplit(t_local, par_.tp, coords_.tp_rank);
  const int64_t n = share.count;
  h_topk_ids_.resize(static_cast<size_t>(n * k));
  h_topk_w_.resize(static_cast<size_t>(n * k));
  if (n > 0) {
    b.copyToHost(h_topk_ids_.data(), tk_ids.rowSlice(share.begin, n),
                 h_topk_ids_.size() * sizeof(int32_t));
    b.copyToHost(h_topk_w_.data(), tk_w.rowSlice(share.begin, n), h_topk_w_.size() * sizeof(float));
    CHECK(b.synchronize().isOk());
  }
  const DispatchSend ds =
      planDispatch(par_, config_.base.num_local_experts, k, h_topk_ids_, h_topk_w_);
  const int64_t sent = static_cast<int64_t>(ds.src_row.size());
  std::vector<int64_t> recv_from(static_cast<size_t>(world));
  comms_.world->exchangeCounts(ds.rows_to, recv_from);
  int64_t received = 0;
  for (int64_t c : recv_from) received += c;
  CHECK(sent <= send_x_.view.rows() && received <= recv_x_.view.rows());

  const Tensor send_x = send_x_.view.rowSlice(0, sent);
  const Tensor send_ids = send_ids_.view.rowSlice(0, sent);
  const Tensor send_w = send_w_.view.rowSlice(0, sent);
  const Tensor src_rows = i32View(send_rows_, sent);
  if (sent > 0) {
    b.copyToDevice(src_rows, ds.src_row.data(), sizeof(int32_t) * static_cast<size_t>(sent));
    b.copyToDevice(send_ids, ds.local_id.data(), ds.local_id.size() * sizeof(int32_t));
    b.copyToDevice(send_w, ds.weight.data(), ds.weight.size() * sizeof(float));
    ops_.gatherRows(x.rowSlice(share.begin, n), src_rows, send_x);
  }
  const Tensor recv_x = recv_x_.view.rowSlice(0, received);
  const Tensor recv_ids = recv_ids_.view.rowSlice(0, received);
  const Tensor recv_w = recv_w_.view.rowSlice(0, received);
  comms_.world->allToAllRows(send_x, ds.rows_to, recv_x, recv_from);
  comms_.world->allToAllRows(send_ids, ds.rows_to, recv_ids, recv_from);
  comms_.world->allToAllRows(send_w, ds.rows_to, recv_w, recv_from);

  // Destination: one pair per (received row, local slot); the partial sum per received row.
  h_recv_ids_.resize(static_cast<size_t>(received * k));
  h_recv_w_.resize(static_cast<size_t>(received * k));
  if (received > 0) {
    b.copyToHost(h_recv_ids_.data(), recv_ids, h_recv_ids_.size() * sizeof(int32_t));
    b.copyToHost(h_recv_w_.data(), recv_w, h_recv_w_.size() * sizeof(float));
    CHECK(b.synchronize().isOk());
  }
  const DispatchPairs pairs = expandPairs(h_recv_ids_, h_recv_w_, k);
  const Tensor part = part_.view.rowSlice(0, received);
  if (received > 0) runExpertPairs(L, recv_x, pairs, part);

  // Combine: partial sums back to their sources, summed per own row in rank order.
  const Tensor back = back_.view.rowSlice(0, sent);
  comms_.world->allToAllRows(part, recv_from, back, ds.rows_to);
  if (t_local == 0) return;
  const Tensor mine = par_.tp == 1 ? out.rowSlice(0, n) : moe_mine_.view.rowSlice(0, n);
  shard_ops_.combineRows(back, src_rows, ds.src_row, mine);
  if (par_.tp > 1) {
    std::vector<int64_t> shares(static_cast<size_t>(par_.tp));
    for (int32_t i = 0; i < par_.tp; ++i) {
      shares[static_cast<size_t>(i)] = evenSplit(t_local, par_.tp, i).count;
    }
    comms_.tp->allGatherRows(mine, shares, out.rowSlice(0, t_local));
  }
}

void GptOssShard::enqueueStep(const LlmStep& step, PagedKvCache& kv, float* logits_out,
                              int32_t* sampled_out, llm::LlmTokenLogprobs* logprobs_out) {
  Backend& b = backend_;
  const ModelConfig& c = config_.base;
  const int32_t n_seq = static_cast<int32_t>(step.seqs.size());
  const int32_t bs = kv.shape().block_size;
  const int32_t per_group = kv.shape().num_blocks;
  const int32_t my_group = coords_.dp_rank;
  auto groupOf = [&](const LlmStepSeq& s) {
    return dpGroupOfBlock(step.block_ids[static_cast<size_t>(s.block_offset)], per_group);
  };

  // ---- global plan (the same on every rank): output rows as GptOssModel orders them ----
  struct OutRow {
    int32_t seq, token;  // sequence, token index in it
  };
  std::vector<OutRow> out_rows;
  for (int32_t si = 0; si < n_seq; ++si) {
    const LlmStepSeq& s = step.seqs[static_cast<size_t>(si)];
    if (s.logits == LogitsMode::kAll) {
      for (int32_t j = 0; j < s.num_tokens; ++j) out_rows.push_back({si, j});
    } else if (s.logits == LogitsMode::kLast) {
      out_rows.push_back({si, s.num_tokens - 1});
    }
  }
  const int64_t n_out_rows = static_cast<int64_t>(out_rows.size());
  h_samples_.clear();
  for (int32_t si = 0; si < n_seq; ++si) {
    const LlmStepSeq& s = step.seqs[static_cast<size_t>(si)];
    if (!s.sample) continue;
    int32_t r = -1;
    for (int64_t k = 0; k < n_out_rows; ++k) {
      const OutRow& o = out_rows[static_cast<size_t>(k)];
      if (o.seq == si && o.token == s.num_tokens - 1) r = static_cast<int32_t>(k);
    }
    if (r < 0) {
      r = static_cast<int32_t>(out_rows.size());
      out_rows.push_back({si, s.num_tokens - 1});
    }
    SampleRow sr;
    sr.row = r;
    sr.counter = static_cast<uint64_t>(s.position) + static_cast<uint64_t>(s.num_tokens);
    sr.params = s.sampling;
    h_samples_.push_back(sr);
  }
  const int64_t n_rows = static_cast<int64_t>(out_rows.size());
  CHECK(n_rows <= opts_.max_logits_rows);
  if (coords_.rank == 0) {
    // [TAG_LLM_SAMPLER_STATE] Rank 0 samples, so it holds the state slots: reloads first, in
    // order before this step's draws (also for a step that reloads without sampling).
    samplerStateResets(step, h_resets_, h_bias_);
    if (!h_resets_.empty()) ops_.resetSamplerState(h_resets_);
  }

  // ---- this dp group's sequences ----
  std::vector<int32_t> local_row_of_seq(static_cast<size_t>(n_seq), -1);  // first local row
  std::vector<int32_t> global_row_of_seq(static_cast<size_t>(n_seq), 0);  // first step-wide row
  std::vector<int64_t> rows_of_group(static_cast<size_t>(par_.dp), 0);    // output rows per group
  h_positions_.clear();
  h_slots_.clear();
  h_ids_.clear();
  h_cu_.assign(1, 0);
  h_prev_pairs_.clear();
  int32_t maxb = 1, max_ctx = 1, local_seqs = 0, global_row = 0;
  for (int32_t si = 0; si < n_seq; ++si) {
    const LlmStepSeq& s = step.seqs[static_cast<size_t>(si)];
    global_row_of_seq[static_cast<size_t>(si)] = global_row;
    global_row += s.num_tokens;
    if (groupOf(s) != my_group) continue;
    maxb = std::max(maxb, static_cast<int32_t>(kvBlocksFor(s.position + s.num_tokens, bs)));
    max_ctx = std::max(max_ctx, s.position + s.num_tokens);
  }
  for (const OutRow& o : out_rows) {
    ++rows_of_group[static_cast<size_t>(groupOf(step.seqs[static_cast<size_t>(o.seq)]))];
  }
  h_tables_.clear();
  // [TAG_KV_WINDOW_GROUP] Sliding layers through the window tables (validate() checked them).
  const bool wpool = kv.shape().num_blocks_window > 0;
  const int32_t per_group_w = kv.shape().num_blocks_window;
  CHECK(!wpool || slots_w_.view.data != nullptr);
  h_slots_w_.clear();
  h_tables_w_.clear();
  if (tap_ != nullptr) tap_->token.clear();
  for (int32_t si = 0; si < n_seq; ++si) {
    const LlmStepSeq& s = step.seqs[static_cast<size_t>(si)];
    if (groupOf(s) != my_group) continue;
    const auto table = step.block_ids.subspan(static_cast<size_t>(s.block_offset),
                                              static_cast<size_t>(s.num_blocks));
    const int32_t row = h_cu_.back();
    local_row_of_seq[static_cast<size_t>(si)] = row;
    std::vector<int32_t> local_table(table.size());
    for (size_t bi = 0; bi < table.size(); ++bi) local_table[bi] = table[bi] % per_group;
    const int32_t needed = static_cast<int32_t>(kvBlocksFor(s.position + s.num_tokens, bs));
    for (int32_t bi = 0; bi < maxb; ++bi) {
      h_tables_.push_back(bi < needed ? local_table[static_cast<size_t>(bi)] : -1);
    }
    std::vector<int32_t> local_wtable;
    if (wpool) {
      const auto wt = step.block_ids.subspan(static_cast<size_t>(s.block_offset + s.num_blocks),
                                             static_cast<size_t>(s.num_blocks));
      local_wtable.resize(wt.size());
      for (size_t bi = 0; bi < wt.size(); ++bi) {
        local_wtable[bi] = wt[bi] < 0 ? -1 : wt[bi] % per_group_w;
      }
      for (int32_t bi = 0; bi < maxb; ++bi) {
        h_tables_w_.push_back(bi < needed ? local_wtable[static_cast<size_t>(bi)] : -1);
      }
    }
    if (s.prev_row >= 0) {
      h_prev_pairs_.push_back(row);
      h_prev_pairs_.push_back(s.prev_row);
    }
    for (int32_t j = 0; j < s.num_tokens; ++j) {
      const int32_t id = step.tokens[static_cast<size_t>(s.token_offset + j)];
      h_ids_.push_back(j == 0 && s.prev_row >= 0 ? 0 : id);
      h_positions_.push_back(s.position + j);
      h_slots_.push_back(static_cast<int32_t>(kvSlot(local_table, s.position + j, bs)));
      if (wpool) {
        h_slots_w_.push_back(static_cast<int32_t>(kvSlot(local_wtable, s.position + j, bs)));
      }
      if (tap_ != nullptr) tap_->token.push_back(global_row_of_seq[static_cast<size_t>(si)] + j);
    }
    h_cu_.push_back(row + s.num_tokens);
    ++local_seqs;
  }
  const int64_t t = h_cu_.back();
  h_local_rows_.clear();
  for (const OutRow& o : out_rows) {
    const int32_t lr = local_row_of_seq[static_cast<size_t>(o.seq)];
    if (lr >= 0) h_local_rows_.push_back(lr + o.token);
  }
  const int64_t r_local = static_cast<int64_t>(h_local_rows_.size());
  const int64_t kk = c.num_experts_per_tok;

  // ---- forward ----
  const Tensor ids_t = i32View(ids_, t);
  const Tensor pos = i32View(positions_, t);
  const Tensor slots = i32View(slots_, t);
  const Tensor cu = i32View(cu_q_, local_seqs + 1);
  const Tensor tables(block_tables_.view.data, DType::kI32, {local_seqs, maxb});
  const Tensor slots_w = wpool ? i32View(slots_w_, t) : Tensor();
  const Tensor tables_w =
      wpool ? Tensor(block_tables_w_.view.data, DType::kI32, {local_seqs, maxb}) : Tensor();
  const Tensor res = residual_.view.rowSlice(0, t);
  const Tensor x = x_.view.rowSlice(0, t);
  const Tensor moe = moe_out_.view.rowSlice(0, t);
  const Tensor qkv = qkv_buf_.view.rowSlice(0, t);
  const Tensor attn = attn_.view.rowSlice(0, t);
  const Tensor rl = router_logits_.view.rowSlice(0, t);
  const Tensor tk_ids = topk_ids_.view.rowSlice(0, t);
  const Tensor tk_w = topk_w_.view.rowSlice(0, t);
  RmsNormParams norm{static_cast<float>(c.rms_norm_eps)};
  norm.round_normalized = !opts_.norm_round_once;  // as GptOssModel (no-op on the f32 CPU)
  RopeKvParams rope;
  rope.num_q_heads = static_cast<int32_t>(attn_shard_.q_heads.count);
  rope.num_kv_heads = static_cast<int32_t>(attn_shard_.kv_heads.count);
  rope.head_dim = static_cast<int32_t>(c.head_dim);
  rope.rotary_dim = rope.head_dim;
  PagedAttentionParams ap;
  ap.num_seqs = local_seqs;
  ap.num_q_heads = rope.num_q_heads;
  ap.num_kv_heads = rope.num_kv_heads;
  ap.head_dim = rope.head_dim;
  ap.block_size = bs;
  ap.max_blocks_per_seq = maxb;
  ap.max_context = max_ctx;
  ap.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  if (t > 0) {
    b.copyToDevice(ids_t, h_ids_.data(), sizeof(int32_t) * static_cast<size_t>(t));
    b.copyToDevice(pos, h_positions_.data(), sizeof(int32_t) * static_cast<size_t>(t));
    b.copyToDevice(slots, h_slots_.data(), sizeof(int32_t) * static_cast<size_t>(t));
    b.copyToDevice(cu, h_cu_.data(), sizeof(int32_t) * h_cu_.size());
    b.copyToDevice(tables, h_tables_.data(), sizeof(int32_t) * h_tables_.size());
    if (wpool) {
      b.copyToDevice(slots_w, h_slots_w_.data(), sizeof(int32_t) * static_cast<size_t>(t));
      b.copyToDevice(tables_w, h_tables_w_.data(), sizeof(int32_t) * h_tables_w_.size());
    }
    if (!h_prev_pairs_.empty()) {  // [TAG_LLM_PREV_TOKEN]: sampled_ holds the broadcast ids
      const int64_t np = static_cast<int64_t>(h_prev_pairs_.size() / 2);
      const Tensor pairs(prev_pairs_.view.data, DType::kI32, {np, 2});
      b.copyToDevice(pairs, h_prev_pairs_.data(), sizeof(int32_t) * h_prev_pairs_.size());
      ops_.copyTokens(i32View(sampled_, last_sampled_), pairs, ids_t);
    }
    // With the f32 stream the embedding lands in x (the activations' dtype: the row is exact
    // there, and a sum with zeros stays exact) and the first norm copies it into the stream.
    const Tensor emb = f32_res_ ? x : res;
    if (par_.tp == 1) {
      b.embedding(embed_.view, ids_t, emb);
    } else {
      shard_ops_.embeddingSlice(embed_.view, ids_t, vocab_.begin, emb);
      comms_.tp->allReduceSum(emb);
    }
    h_windows_.clear();
    for (size_t l = 0; l < layers_.size(); ++l) {
      const int32_t w = config_.sliding[l] ? static_cast<int32_t>(c.sliding_window) : 0;
      if (std::find(h_windows_.begin(), h_windows_.end(), w) == h_windows_.end()) {
        h_windows_.push_back(w);
      }
    }
    AttentionPlanInput plan;
    plan.cu_q = h_cu_;
    plan.positions = h_positions_;
    plan.windows = h_windows_;
    plan.num_q_heads = rope.num_q_heads;
    plan.num_kv_heads = rope.num_kv_heads;
    plan.head_dim = rope.head_dim;
    ops_.planAttention(plan);
  }
  last_sampled_ = static_cast<int64_t>(h_samples_.size());
  if (tap_ != nullptr) {
    tap_->attn.clear();
    tap_->moe.clear();
  }

  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const int32_t li = static_cast<int32_t>(l);
    if (t > 0) {
      if (l == 0 && f32_res_) {
        RmsNormParams init = norm;
        init.residual_init = true;  // res = x, then x = norm(res)
        b.rmsNorm(x, res, L.input_norm.view, x, init);
      } else if (l == 0) {
        b.rmsNorm(res, Tensor(), L.input_norm.view, x, norm);
      } else {
        b.rmsNorm(moe, res, L.input_norm.view, x, norm);
      }
      b.linear(x, L.qkv.view, L.qkv_bias.view, qkv);
      const bool in_window_pool = kv.shape().windowLayer(li);  // [TAG_KV_WINDOW_GROUP]
      ops_.ropeKvWrite(qkv, pos, rope_cos_.view, rope_sin_.view, in_window_pool ? slots_w : slots,
                       kv.keys(li), kv.values(li), rope);
      ap.sliding_window = config_.sliding[l] ? static_cast<int32_t>(c.sliding_window) : 0;
      ops_.pagedAttention(qkv, kv.keys(li), kv.values(li), cu, pos,
                          in_window_pool ? tables_w : tables, L.sinks.view, attn, ap);
      b.linear(attn, L.o.view, L.o_bias.view, x);
      if (par_.tp > 1) comms_.tp->allReduceSum(x);
      if (tap_ != nullptr) tapRows(tap_->attn, x, t);
      b.rmsNorm(x, res, L.post_norm.view, x, norm);
      if (route_f32_) {  // [TAG_ROUTER_F32]: from the f32 stream, the norm folded in
        ops_.moeRouteF32(res, L.router_f32t.view, L.router_bias.view, tk_ids, tk_w,
                         MoeRouteParams{static_cast<int32_t>(kk), norm.eps});
      } else {
        b.linear(x, L.router.view, Tensor(), rl);
        ops_.moeRoute(rl, L.router_bias.view, tk_ids, tk_w,
                      MoeRouteParams{static_cast<int32_t>(kk)});
      }
    }
    if (par_.dp == 1) {
      moeReplicated(L, x, tk_ids, tk_w, moe);
      if (par_.world() > 1) comms_.world->allReduceSum(moe);
    } else {
      moeDispatched(L, x_.view, topk_ids_.view, topk_w_.view, t, moe_out_.view);
    }
    if (tap_ != nullptr) tapRows(tap_->moe, moe, t);
    b.markProgress();  // [TAG_STEP_PROGRESS]
  }
  if (t > 0) b.rmsNorm(moe, res, final_norm_.view, x, norm);
  if (n_rows == 0) return;

  // ---- logits: vocabulary slices gathered in the tp group, groups gathered on rank 0 ----
  const int64_t v = c.vocab_size;
  const Tensor group_logits = logits_group_.view.rowSlice(0, r_local);
  if (r_local > 0) {
    const Tensor rows = i32View(rows_, r_local);
    b.copyToDevice(rows, h_local_rows_.data(), sizeof(int32_t) * static_cast<size_t>(r_local));
    const Tensor gathered = gathered_.view.rowSlice(0, r_local);
    ops_.gatherRows(x, rows, gathered);
    if (par_.tp == 1) {
      b.linear(gathered, lm_head_.view, Tensor(), group_logits);
    } else {
      const Tensor part(logits_part_.view.data, DType::kF32, {r_local, vocab_.count});
      b.linear(gathered, lm_head_.view, Tensor(), part);
      std::vector<int64_t> counts(static_cast<size_t>(par_.tp)), cols(counts.size());
      for (int32_t i = 0; i < par_.tp; ++i) {
        cols[static_cast<size_t>(i)] = evenSplit(v, par_.tp, i).count;
        counts[static_cast<size_t>(i)] = r_local * cols[static_cast<size_t>(i)];
      }
      const Tensor flat_in(part.data, DType::kF32, {r_local * vocab_.count, 1});
      const Tensor flat_out(logits_cols_.view.data, DType::kF32, {r_local * v, 1});
      comms_.tp->allGatherRows(flat_in, counts, flat_out);
      shard_ops_.concatColumns(flat_out, cols, group_logits);
    }
  }
  const Tensor logits = logits_.view.rowSlice(0, n_rows);
  const Tensor* final_logits = &group_logits;
  if (par_.dp > 1) {
    // Group leaders (tp rank 0) send their rows to rank 0, which puts them in step order.
    const int32_t world = par_.world();
    std::vector<int64_t> send(static_cast<size_t>(world), 0), recv(send.size(), 0);
    if (coords_.tp_rank == 0) send[0] = r_local;
    if (coords_.rank == 0) {
      for (int32_t g = 0; g < par_.dp; ++g) {
        recv[static_cast<size_t>(g * par_.tp)] = rows_of_group[static_cast<size_t>(g)];
      }
    }
    const Tensor recv_t = logits_recv_.view.rowSlice(0, coords_.rank == 0 ? n_rows : 0);
    comms_.world->allToAllRows(group_logits, send, recv_t, recv);
    if (coords_.rank == 0) {
      // recv holds group 0's rows, then group 1's, ... each in step order.
      std::vector<int64_t> next(static_cast<size_t>(par_.dp), 0);
      for (int32_t g = 1; g < par_.dp; ++g) {
        next[static_cast<size_t>(g)] =
            next[static_cast<size_t>(g - 1)] + rows_of_group[static_cast<size_t>(g - 1)];
      }
      h_perm_.clear();
      for (const OutRow& o : out_rows) {
        const int32_t g = groupOf(step.seqs[static_cast<size_t>(o.seq)]);
        h_perm_.push_back(static_cast<int32_t>(next[static_cast<size_t>(g)]++));
      }
      const Tensor perm = i32View(perm_, n_rows);
      b.copyToDevice(perm, h_perm_.data(), sizeof(int32_t) * h_perm_.size());
      ops_.gatherRows(recv_t, perm, logits);
      final_logits = &logits;
    }
  }
  if (coords_.rank == 0) {
    if (n_out_rows > 0) {
      CHECK(logits_out != nullptr);
      b.copyToHost(logits_out, *final_logits,
                   static_cast<size_t>(n_out_rows * c.vocab_size) * sizeof(float));
    }
    if (!h_samples_.empty()) {
      CHECK(sampled_out != nullptr);
      bool want_lp = false;
      for (const SampleRow& r : h_samples_) want_lp = want_lp || r.params.logprobs >= 0;
      const int64_t lp_bytes =
          want_lp ? static_cast<int64_t>(h_samples_.size() * sizeof(llm::LlmTokenLogprobs)) : 0;
      const Tensor lps = want_lp ? sampled_lp_.view.rowSlice(0, lp_bytes) : Tensor();
      const Tensor sampled = i32View(sampled_, static_cast<int64_t>(h_samples_.size()));
      ops_.sample(*final_logits, h_samples_, sampled, lps);
      b.copyToHost(sampled_out, sampled, sizeof(int32_t) * h_samples_.size());
      if (want_lp) {
        CHECK(logprobs_out != nullptr);
        b.copyToHost(logprobs_out, lps, static_cast<size_t>(lp_bytes));
      }
    }
  }
  if (!h_samples_.empty() && par_.world() > 1) {  // [TAG_LLM_PREV_TOKEN] on every rank
    comms_.world->broadcast(i32View(sampled_, static_cast<int64_t>(h_samples_.size())), 0);
  }
}

}  // namespace garden::rose
