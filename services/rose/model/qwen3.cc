#include "services/rose/model/qwen3.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "common/safetensors.h"
#include "services/rose/model/weights.h"
#include "services/rose/ops/cuda/fp8_block.h"  // the FP8 weight scales' shape (plain C++)

namespace garden::rose {
namespace {

// Finds `name` with or without the "model." prefix.
const TensorView* findTensor(const SafetensorsCheckpoint& ck, const std::string& name) {
  if (const TensorView* t = ck.find("model." + name)) return t;
  return ck.find(name);
}

Result<const TensorView*> requireTensor(const SafetensorsCheckpoint& ck, const std::string& name,
                                        std::vector<int64_t> shape) {
  const TensorView* t = findTensor(ck, name);
  if (t == nullptr) {
    return invalidArgument("checkpoint has no tensor '" + name + "' (nor 'model." + name + "')");
  }
  RETURN_IF_ERROR(checkTensor(*t, shape));
  return t;
}

// Uploads one or more checkpoint tensors stacked along rows into a new weight tensor.
Result<OwnedTensor> uploadStacked(Backend& b, std::vector<const TensorView*> parts) {
  int64_t rows = 0;
  const int64_t cols = parts[0]->shape.size() == 2 ? parts[0]->shape[1] : 1;
  for (const TensorView* p : parts) rows += p->shape[0];
  Result<OwnedTensor> t = parts[0]->shape.size() == 2
                              ? b.allocateTensor(b.weightDType(), {rows, cols})
                              : b.allocateTensor(b.weightDType(), {rows});
  if (!t.isOk()) return t.status();
  int64_t row = 0;
  for (const TensorView* p : parts) {
    RETURN_IF_ERROR(uploadInto(b, t->view.rowSlice(row, p->shape[0]), *p));
    row += p->shape[0];
  }
  return t;
}

Result<OwnedTensor> uploadOne(Backend& b, const SafetensorsCheckpoint& ck, const std::string& name,
                              std::vector<int64_t> shape) {
  ASSIGN_OR_RETURN(const TensorView* t, requireTensor(ck, name, std::move(shape)));
  return uploadStacked(b, {t});
}

}  // namespace

bool fp8ProjectionsFromName(std::string_view name, uint32_t* out) {
  if (name == "bf16") {
    *out = 0;
  } else if (name == "fp8") {
    *out = kFp8All;
  } else if (name == "fp8-mlp") {
    *out = kFp8Mlp;
  } else {
    return false;
  }
  return true;
}

Qwen3Model::~Qwen3Model() = default;

Qwen3Model::Qwen3Model(Backend& b) : backend_(b) {
  // Graphs captured by one model are never replayed for another on the same backend (a bench or
  // test holding two, e.g. bf16 and --weights fp8): the kind carries this model's number.
  static std::atomic<uint32_t> next{1};
  graph_id_ = next.fetch_add(1) & 0x0FFFFFFFu;
}

Result<std::unique_ptr<Qwen3Model>> Qwen3Model::load(const std::string& dir, Backend& backend,
                                                     const Qwen3Options& opts) {
  std::unique_ptr<Qwen3Model> m(new Qwen3Model(backend));
  ASSIGN_OR_RETURN(m->config_, loadModelConfig(dir));
  const ModelConfig& c = m->config_;
  if (!c.model_type.empty() && c.model_type != "qwen3") {
    return invalidArgument(dir + "/config.json: model_type '" + c.model_type +
                           "' is not qwen3 (the qwen3 loader serves Qwen3 checkpoints)");
  }
  if (c.rope_type != "default") {
    return unimplemented(dir + "/config.json: rope_type '" + c.rope_type +
                         "' is not supported by the qwen3 loader (default only)");
  }
  if (c.intermediate_size <= 0) return invalidArgument(dir + "/config.json: intermediate_size");
  if (opts.pooling_override) {
    m->pooling_.mode = *opts.pooling_override;
  } else {
    ASSIGN_OR_RETURN(m->pooling_, loadPoolingConfig(dir));
  }
  m->causal_ = opts.causal < 0 ? c.is_causal : opts.causal != 0;
  if (opts.max_batch_tokens <= 0) return invalidArgument("max_batch_tokens must be positive");
  m->max_tokens_ = opts.max_batch_tokens;
  m->rotary_dim_ = static_cast<int64_t>(static_cast<double>(c.head_dim) * c.partial_rotary_factor);
  m->rotary_dim_ -= m->rotary_dim_ % 2;
  if (m->rotary_dim_ <= 0) return invalidArgument(dir + "/config.json: rotary dimension is 0");

  ASSIGN_OR_RETURN(auto ck, SafetensorsCheckpoint::openDir(dir));
  Backend& b = backend;
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads,
                hkv = c.num_key_value_heads, inter = c.intermediate_size, v = c.vocab_size;

  m->fp8_ = opts.fp8_projections & kFp8All;
  if (m->fp8_ != 0) {  // [TAG_EMBED_FP8]
    if (!b.supportsFp8Linear())
      return invalidArgument("--weights fp8: the " + std::string(b.name()) +
                             " backend has no FP8 linear layers (use --device cuda)");
    if (c.attention_bias && (m->fp8_ & (kFp8Qkv | kFp8O)) != 0)
      return invalidArgument("--weights fp8: the checkpoint has attention biases (not supported "
                             "on FP8 projections; --weights fp8-mlp keeps them bf16)");
    if (h % 128 != 0 || (hq * d) % 128 != 0 || inter % 128 != 0)
      return invalidArgument("--weights fp8: hidden_size, num_attention_heads * head_dim and "
                             "intermediate_size must be multiples of 128 (got " +
                             std::to_string(h) + ", " + std::to_string(hq * d) + ", " +
                             std::to_string(inter) + ")");
  }
  // [TAG_EMBED_FP8] w quantized into a new FP8 weight; w freed once the quantization ran.
  auto toFp8 = [&b](OwnedTensor& w, Fp8Weight& out) -> Status {
    const int64_t n = w.view.rows(), k = w.view.cols();
    ASSIGN_OR_RETURN(out.codes, b.allocateTensor(DType::kU8, {n, k}));
    ASSIGN_OR_RETURN(out.scales,
                     b.allocateTensor(DType::kF32, {cuda::fp8RowBlocks(n), cuda::fp8KBlocks4(k)}));
    b.quantizeFp8Weight(w.view, out.matrix());
    RETURN_IF_ERROR(b.synchronize());
    w = OwnedTensor{};
    return okStatus();
  };

  ASSIGN_OR_RETURN(m->embed_, uploadOne(b, *ck, "embed_tokens.weight", {v, h}));
  ASSIGN_OR_RETURN(m->final_norm_, uploadOne(b, *ck, "norm.weight", {h}));
  m->layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    Layer& L = m->layers_[static_cast<size_t>(l)];
    const std::string p = "layers." + std::to_string(l) + ".";
    ASSIGN_OR_RETURN(L.input_norm, uploadOne(b, *ck, p + "input_layernorm.weight", {h}));
    ASSIGN_OR_RETURN(L.post_norm, uploadOne(b, *ck, p + "post_attention_layernorm.weight", {h}));
    ASSIGN_OR_RETURN(L.q_norm, uploadOne(b, *ck, p + "self_attn.q_norm.weight", {d}));
    ASSIGN_OR_RETURN(L.k_norm, uploadOne(b, *ck, p + "self_attn.k_norm.weight", {d}));
    ASSIGN_OR_RETURN(auto* q, requireTensor(*ck, p + "self_attn.q_proj.weight", {hq * d, h}));
    ASSIGN_OR_RETURN(auto* k, requireTensor(*ck, p + "self_attn.k_proj.weight", {hkv * d, h}));
    ASSIGN_OR_RETURN(auto* vv, requireTensor(*ck, p + "self_attn.v_proj.weight", {hkv * d, h}));
    ASSIGN_OR_RETURN(L.qkv, uploadStacked(b, {q, k, vv}));
    ASSIGN_OR_RETURN(L.o, uploadOne(b, *ck, p + "self_attn.o_proj.weight", {h, hq * d}));
    if (c.attention_bias) {
      ASSIGN_OR_RETURN(auto* qb, requireTensor(*ck, p + "self_attn.q_proj.bias", {hq * d}));
      ASSIGN_OR_RETURN(auto* kb, requireTensor(*ck, p + "self_attn.k_proj.bias", {hkv * d}));
      ASSIGN_OR_RETURN(auto* vb, requireTensor(*ck, p + "self_attn.v_proj.bias", {hkv * d}));
      ASSIGN_OR_RETURN(L.qkv_bias, uploadStacked(b, {qb, kb, vb}));
      if (findTensor(*ck, p + "self_attn.o_proj.bias") != nullptr) {
        ASSIGN_OR_RETURN(L.o_bias, uploadOne(b, *ck, p + "self_attn.o_proj.bias", {h}));
      }
    }
    ASSIGN_OR_RETURN(auto* g, requireTensor(*ck, p + "mlp.gate_proj.weight", {inter, h}));
    ASSIGN_OR_RETURN(auto* u, requireTensor(*ck, p + "mlp.up_proj.weight", {inter, h}));
    ASSIGN_OR_RETURN(L.gate_up, uploadStacked(b, {g, u}));
    ASSIGN_OR_RETURN(L.down, uploadOne(b, *ck, p + "mlp.down_proj.weight", {h, inter}));
    if (m->fp8_ & kFp8Qkv) RETURN_IF_ERROR(toFp8(L.qkv, L.qkv8));
    if (m->fp8_ & kFp8O) RETURN_IF_ERROR(toFp8(L.o, L.o8));
    if (m->fp8_ & kFp8GateUp) RETURN_IF_ERROR(toFp8(L.gate_up, L.gate_up8));
    if (m->fp8_ & kFp8Down) RETURN_IF_ERROR(toFp8(L.down, L.down8));
  }
  // LM head: lm_head.weight unless tied (or absent: a bare Qwen3Model, use the embeddings only
  // when tied).
  const TensorView* lm = ck->find("lm_head.weight");
  if (c.tie_word_embeddings) {
    m->lm_head_ = &m->embed_;
  } else if (lm != nullptr && opts.load_lm_head) {
    ASSIGN_OR_RETURN(m->lm_head_own_, uploadOne(b, *ck, "lm_head.weight", {v, h}));
    m->lm_head_ = &m->lm_head_own_;
  }  // else: no LM head (yes/no scoring answers FAILED_PRECONDITION)
  if (const TensorView* sc = ck->find("score.weight")) {
    if (sc->shape.size() != 2 || sc->shape[1] != h || sc->shape[0] < 1) {
      return invalidArgument("tensor 'score.weight' has shape " + shapeString(sc->shape) +
                             ", want [num_labels, " + std::to_string(h) + "]");
    }
    ASSIGN_OR_RETURN(m->score_, uploadStacked(b, {sc}));
  }

  // RoPE tables, computed in float32 the way transformers does (inv_freq, then pos · inv_freq).
  const int64_t half = m->rotary_dim_ / 2, max_pos = c.max_position_embeddings;
  {
    std::vector<float> cosv(static_cast<size_t>(max_pos * half)), sinv(cosv.size());
    for (int64_t i = 0; i < half; ++i) {
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(m->rotary_dim_);
      const float inv_freq =
          1.0f / static_cast<float>(std::pow(static_cast<double>(static_cast<float>(c.rope_theta)),
                                             static_cast<double>(exponent)));
      for (int64_t pos = 0; pos < max_pos; ++pos) {
        const float angle = static_cast<float>(pos) * inv_freq;
        cosv[static_cast<size_t>(pos * half + i)] = std::cos(angle);
        sinv[static_cast<size_t>(pos * half + i)] = std::sin(angle);
      }
    }
    ASSIGN_OR_RETURN(m->rope_cos_, b.allocateTensor(DType::kF32, {max_pos, half}));
    ASSIGN_OR_RETURN(m->rope_sin_, b.allocateTensor(DType::kF32, {max_pos, half}));
    RETURN_IF_ERROR(b.uploadConvert(m->rope_cos_.view, {cosv.data(), DType::kF32, max_pos * half}));
    RETURN_IF_ERROR(b.uploadConvert(m->rope_sin_.view, {sinv.data(), DType::kF32, max_pos * half}));
  }

  // Workspace. With graphs, sized for the largest padded bucket too (enqueueEmbedGraphed).
  if (b.graphs() != nullptr) {
    m->graph_tokens_ = graphTokensBucket(static_cast<uint32_t>(m->max_tokens_));
    m->graph_seqs_ =
        static_cast<int32_t>(graphSeqsBucket(static_cast<uint32_t>(m->max_tokens_) + 1));
  }
  // [TAG_EMBED_FP8] FP8 GEMMs take a multiple of 4 rows: the eager path pads with one more
  // sequence (enqueueBody).
  const int64_t t = std::max((m->max_tokens_ + 3) / 4 * 4, m->graph_tokens_);
  const int64_t ns = std::max<int64_t>(m->max_tokens_ + (m->fp8_ != 0 ? 1 : 0), m->graph_seqs_);
  const DType act = b.activationDType();
  ASSIGN_OR_RETURN(m->ids_, b.allocateTensor(DType::kI32, {t}));
  ASSIGN_OR_RETURN(m->positions_, b.allocateTensor(DType::kI32, {t}));
  ASSIGN_OR_RETURN(m->cu_seqlens_, b.allocateTensor(DType::kI32, {ns + 1}));
  ASSIGN_OR_RETURN(m->residual_, b.allocateTensor(b.residualDType(), {t, h}));
  ASSIGN_OR_RETURN(m->x_, b.allocateTensor(act, {t, h}));
  ASSIGN_OR_RETURN(m->qkv_buf_, b.allocateTensor(act, {t, (hq + 2 * hkv) * d}));
  ASSIGN_OR_RETURN(m->attn_, b.allocateTensor(act, {t, hq * d}));
  ASSIGN_OR_RETURN(m->gate_up_buf_, b.allocateTensor(act, {t, 2 * inter}));
  ASSIGN_OR_RETURN(m->mlp_, b.allocateTensor(act, {t, inter}));
  if (m->fp8_ != 0) {  // the widest GEMM input: hidden, q heads or intermediate
    const int64_t kmax = std::max({h, hq * d, inter});
    ASSIGN_OR_RETURN(m->fp8_codes_, b.allocateTensor(DType::kU8, {t, kmax}));
    ASSIGN_OR_RETURN(m->fp8_scales_, b.allocateTensor(DType::kF32, {kmax / 128 * t}));
  }
  ASSIGN_OR_RETURN(m->pooled_, b.allocateTensor(DType::kF32, {ns, h}));
  ASSIGN_OR_RETURN(m->scores_, b.allocateTensor(DType::kF32, {ns}));
  m->host_positions_.resize(static_cast<size_t>(t));
  m->host_cu_.resize(static_cast<size_t>(ns + 1));
  m->host_pad_ids_.assign(256, 0);
  return m;
}

Status Qwen3Model::validate(const BatchInput& in) const {
  const int64_t n_tok = static_cast<int64_t>(in.tokens.size());
  const int64_t n_seq = static_cast<int64_t>(in.seqlens.size());
  if (n_seq == 0) return invalidArgument("batch has no sequences");
  if (n_tok > max_tokens_) {
    return invalidArgument("batch has " + std::to_string(n_tok) +
                           " tokens, more than max_batch_tokens " + std::to_string(max_tokens_));
  }
  int64_t sum = 0;
  for (int64_t s = 0; s < n_seq; ++s) {
    const int32_t len = in.seqlens[static_cast<size_t>(s)];
    if (len <= 0) {
      return invalidArgument("sequence " + std::to_string(s) + " has length " +
                             std::to_string(len) + " (must be >= 1)");
    }
    if (len > config_.max_position_embeddings) {
      return invalidArgument("sequence " + std::to_string(s) + " has " + std::to_string(len) +
                             " tokens, more than the model's max_seq_len " +
                             std::to_string(config_.max_position_embeddings));
    }
    sum += len;
  }
  if (sum != n_tok) {
    return invalidArgument("sequence lengths sum to " + std::to_string(sum) +
                           " but the batch has " + std::to_string(n_tok) + " tokens");
  }
  for (int64_t i = 0; i < n_tok; ++i) {
    const int32_t id = in.tokens[static_cast<size_t>(i)];
    if (id < 0 || id >= config_.vocab_size) {
      return invalidArgument("token " + std::to_string(i) + " has id " + std::to_string(id) +
                             " outside the vocabulary [0, " + std::to_string(config_.vocab_size) +
                             ")");
    }
  }
  return okStatus();
}

Status Qwen3Model::validateScore(const ScoreRequest& req) const {
  if (req.yes_id < 0 && req.no_id < 0) {
    if (!hasScoreHead()) {
      return failedPrecondition(
          "score: the model has no classification head (score.weight); "
          "pass yes/no token ids to score with the LM head");
    }
    return okStatus();
  }
  if (req.yes_id < 0 || req.no_id < 0) {
    return invalidArgument("score: give both yes and no token ids, or neither");
  }
  if (req.yes_id >= config_.vocab_size || req.no_id >= config_.vocab_size) {
    return invalidArgument("score: yes/no token id outside the vocabulary");
  }
  if (lm_head_ == nullptr) {
    return failedPrecondition(
        "score: the checkpoint has no LM head (no lm_head.weight, embeddings "
        "not tied)");
  }
  return okStatus();
}

void Qwen3Model::stageInputs(const BatchInput& in, int64_t tokens, int32_t seqs) {
  Backend& b = backend_;
  const int64_t t = static_cast<int64_t>(in.tokens.size());
  const int32_t n_seq = static_cast<int32_t>(in.seqlens.size());
  CHECK(t > 0 && tokens >= t && n_seq > 0 && seqs >= n_seq);
  CHECK(tokens == t || seqs > n_seq);  // spare tokens need the padding sequence
  CHECK(tokens <= static_cast<int64_t>(host_positions_.size()) &&
        static_cast<size_t>(seqs) < host_cu_.size());
  CHECK(tokens - t <= static_cast<int64_t>(host_pad_ids_.size()));

  // Host plan: cu_seqlens, per-token positions, longest sequence.
  host_cu_[0] = 0;
  max_seqlen_ = 0;
  for (int32_t s = 0; s < n_seq; ++s) {
    const int32_t len = in.seqlens[static_cast<size_t>(s)];
    const int32_t start = host_cu_[static_cast<size_t>(s)];
    host_cu_[static_cast<size_t>(s) + 1] = start + len;
    max_seqlen_ = std::max(max_seqlen_, len);
    for (int32_t i = 0; i < len; ++i) host_positions_[static_cast<size_t>(start + i)] = i;
  }
  CHECK(host_cu_[static_cast<size_t>(n_seq)] == t);
  // Padding: one sequence holding the spare tokens (position 0 each: always inside the RoPE
  // table; its result is discarded), then empty ones.
  for (int64_t i = t; i < tokens; ++i) host_positions_[static_cast<size_t>(i)] = 0;
  for (int32_t s = n_seq; s < seqs; ++s)
    host_cu_[static_cast<size_t>(s) + 1] = static_cast<int32_t>(tokens);

  b.copyToDevice(ids_.view.rowSlice(0, t), in.tokens.data(),
                 sizeof(int32_t) * static_cast<size_t>(t));
  if (tokens > t) {
    b.copyToDevice(ids_.view.rowSlice(t, tokens - t), host_pad_ids_.data(),
                   sizeof(int32_t) * static_cast<size_t>(tokens - t));
  }
  b.copyToDevice(positions_.view.rowSlice(0, tokens), host_positions_.data(),
                 sizeof(int32_t) * static_cast<size_t>(tokens));
  b.copyToDevice(cu_seqlens_.view.rowSlice(0, seqs + 1), host_cu_.data(),
                 sizeof(int32_t) * static_cast<size_t>(seqs + 1));
}

Tensor Qwen3Model::enqueueBody(const BatchInput& in) {
  const int64_t t = static_cast<int64_t>(in.tokens.size());
  const int32_t n_seq = static_cast<int32_t>(in.seqlens.size());
  CHECK(t > 0 && t <= max_tokens_ && n_seq > 0);
  // [TAG_EMBED_FP8] A multiple of 4 rows for the FP8 GEMMs: the spare tokens in one more sequence.
  const int64_t tp = fp8_ != 0 ? (t + 3) / 4 * 4 : t;
  const int32_t sp = n_seq + (tp > t ? 1 : 0);
  stageInputs(in, tp, sp);
  return enqueueLayers(tp, sp, max_seqlen_);
}

Fp8Matrix Qwen3Model::fp8Input(int64_t t, int64_t k) const {
  CHECK(t * k <= fp8_codes_.view.numel() && k / 128 * t <= fp8_scales_.view.numel());
  return {Tensor(fp8_codes_.view.data, DType::kU8, {t, k}),
          Tensor(fp8_scales_.view.data, DType::kF32, {k / 128, t})};
}

Tensor Qwen3Model::enqueueLayers(int64_t t, int32_t n_seq, int32_t max_seqlen) {
  Backend& b = backend_;
  const ModelConfig& c = config_;
  const Tensor ids = ids_.view.rowSlice(0, t);
  const Tensor pos = positions_.view.rowSlice(0, t);
  const Tensor cu = cu_seqlens_.view.rowSlice(0, n_seq + 1);

  const Tensor res = residual_.view.rowSlice(0, t);
  const Tensor x = x_.view.rowSlice(0, t);
  const Tensor qkv = qkv_buf_.view.rowSlice(0, t);
  const Tensor attn = attn_.view.rowSlice(0, t);
  const Tensor gate_up = gate_up_buf_.view.rowSlice(0, t);
  const Tensor mlp = mlp_.view.rowSlice(0, t);
  const RmsNormParams norm{static_cast<float>(c.rms_norm_eps)};
  QkNormRopeParams qk;
  qk.num_q_heads = static_cast<int32_t>(c.num_attention_heads);
  qk.num_kv_heads = static_cast<int32_t>(c.num_key_value_heads);
  qk.head_dim = static_cast<int32_t>(c.head_dim);
  qk.rotary_dim = static_cast<int32_t>(rotary_dim_);
  qk.eps = static_cast<float>(c.rms_norm_eps);
  AttentionParams ap;
  ap.num_seqs = n_seq;
  ap.num_q_heads = qk.num_q_heads;
  ap.num_kv_heads = qk.num_kv_heads;
  ap.head_dim = qk.head_dim;
  ap.max_seqlen = max_seqlen;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  ap.causal = causal_;

  // [TAG_EMBED_FP8] A projection in FP8 takes its input from the producing op as FP8 codes and
  // scales (one workspace, consumed by the next GEMM before the next producer writes it).
  const bool fq = (fp8_ & kFp8Qkv) != 0, fo = (fp8_ & kFp8O) != 0, fg = (fp8_ & kFp8GateUp) != 0,
             fd = (fp8_ & kFp8Down) != 0;
  Fp8Matrix xh, xq, xi;
  if (fp8_ != 0) {
    xh = fp8Input(t, c.hidden_size);
    xq = fp8Input(t, c.num_attention_heads * c.head_dim);
    xi = fp8Input(t, c.intermediate_size);
  }
  b.embedding(embed_.view, ids, res);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    // res += mlp out (the first layer reads the embedding in res); x = norm(res)
    const Tensor& norm_in = l == 0 ? res : x;
    const Tensor norm_res = l == 0 ? Tensor() : res;
    if (fq) {
      b.rmsNormFp8(norm_in, norm_res, L.input_norm.view, xh, norm);
      b.linearFp8(xh, L.qkv8.matrix(), qkv);
    } else {
      b.rmsNorm(norm_in, norm_res, L.input_norm.view, x, norm);
      b.linear(x, L.qkv.view, L.qkv_bias.view, qkv);
    }
    b.qkNormRope(qkv, L.q_norm.view, L.k_norm.view, pos, rope_cos_.view, rope_sin_.view, qk);
    if (fo) {  // [TAG_ATTN_FP8_OUT] the O-proj's operand straight from the attention
      b.attentionFp8(qkv, cu, attn, xq, ap);
      b.linearFp8(xq, L.o8.matrix(), x);
    } else {
      b.attention(qkv, cu, attn, ap);
      b.linear(attn, L.o.view, L.o_bias.view, x);
    }
    if (fg) {  // res += attn out; x = norm(res)
      b.rmsNormFp8(x, res, L.post_norm.view, xh, norm);
      b.linearFp8(xh, L.gate_up8.matrix(), gate_up);
    } else {
      b.rmsNorm(x, res, L.post_norm.view, x, norm);
      b.linear(x, L.gate_up.view, Tensor(), gate_up);
    }
    if (fd) {
      b.swigluFp8(gate_up, xi);
      b.linearFp8(xi, L.down8.matrix(), x);
    } else {
      b.swiglu(gate_up, mlp);
      b.linear(mlp, L.down.view, Tensor(), x);
    }
    b.markProgress();  // [TAG_STEP_PROGRESS]
  }
  b.rmsNorm(x, res, final_norm_.view, x, norm);
  return x;
}

void Qwen3Model::enqueueEmbed(const BatchInput& in, PoolMode mode, bool normalize, float* out) {
  const Tensor x = enqueueBody(in);
  const int32_t n_seq = static_cast<int32_t>(in.seqlens.size());
  const Tensor pooled = pooled_.view.rowSlice(0, n_seq);
  backend_.pool(x, cu_seqlens_.view.rowSlice(0, n_seq + 1), pooled,
                PoolParams{n_seq, mode, normalize});
  backend_.copyToHost(out, pooled, pooled.bytes());
}

void Qwen3Model::enqueueScoreHead(const Tensor& x, int32_t n_seq, const ScoreRequest& req) {
  const Tensor scores = scores_.view.rowSlice(0, n_seq);
  ScoreParams sp;
  sp.num_seqs = n_seq;
  sp.apply_sigmoid = true;
  const Tensor* head;
  if (req.yes_id >= 0) {
    CHECK(lm_head_ != nullptr);
    head = &lm_head_->view;
    sp.pos_row = req.yes_id;
    sp.neg_row = req.no_id;
  } else {
    CHECK(hasScoreHead());
    head = &score_.view;
    // One label: sigmoid(logit). Two labels: sigmoid(l1 - l0) = softmax probability of label 1.
    sp.pos_row = score_.view.rows() >= 2 ? 1 : 0;
    sp.neg_row = score_.view.rows() >= 2 ? 0 : -1;
  }
  backend_.score(x, cu_seqlens_.view.rowSlice(0, n_seq + 1), *head, scores, sp);
}

void Qwen3Model::enqueueScore(const BatchInput& in, const ScoreRequest& req, float* out) {
  const Tensor x = enqueueBody(in);
  const int32_t n_seq = static_cast<int32_t>(in.seqlens.size());
  enqueueScoreHead(x, n_seq, req);
  const Tensor scores = scores_.view.rowSlice(0, n_seq);
  backend_.copyToHost(out, scores, scores.bytes());
}

void Qwen3Model::enqueueHidden(const BatchInput& in, float* out) {
  const Tensor x = enqueueBody(in);
  // The raw hidden state is a test/conformance path; it is served from f32 backends only.
  CHECK_MSG(x.dtype == DType::kF32, "enqueueHidden needs float32 activations");
  backend_.copyToHost(out, x, x.bytes());
}

namespace {
constexpr uint32_t kGraphEmbed = 1, kGraphScore = 2;  // GraphShapeKey::kind, low 4 bits
}  // namespace

Result<Qwen3Model::Bucket> Qwen3Model::bucketFor(int64_t tokens, int32_t seqs) const {
  if (!graphsEnabled()) {
    return failedPrecondition("the model was loaded on a backend without CUDA graphs");
  }
  if (tokens <= 0 || seqs <= 0 || tokens > max_tokens_) {
    return invalidArgument("graph bucket: " + std::to_string(seqs) + " sequences of " +
                           std::to_string(tokens) + " tokens do not fit max_batch_tokens " +
                           std::to_string(max_tokens_));
  }
  Bucket bk;
  bk.tokens = graphTokensBucket(static_cast<uint32_t>(tokens));
  bk.seqs = static_cast<int32_t>(graphSeqsBucket(static_cast<uint32_t>(seqs) + 1));
  CHECK(bk.tokens <= graph_tokens_ && bk.seqs <= graph_seqs_);
  return bk;
}

Status Qwen3Model::enqueueEmbedGraphed(GraphExecutor& g, const BatchInput& in, PoolMode mode,
                                       bool normalize, float* out) {
  const int32_t n_seq = static_cast<int32_t>(in.seqlens.size());
  ASSIGN_OR_RETURN(const Bucket bk, bucketFor(static_cast<int64_t>(in.tokens.size()), n_seq));
  stageInputs(in, bk.tokens, bk.seqs);
  struct Ctx {
    Qwen3Model* m;
    Bucket bk;
    PoolMode mode;
    bool normalize;
  } ctx{this, bk, mode, normalize};
  const GraphShapeKey key{graphKind(kGraphEmbed), static_cast<uint32_t>(bk.seqs),
                          static_cast<uint32_t>(bk.tokens),
                          (static_cast<uint64_t>(mode) << 1) | (normalize ? 1u : 0u)};
  RETURN_IF_ERROR(g.run(key, [&ctx] {
    Qwen3Model& m = *ctx.m;
    const Tensor x =
        m.enqueueLayers(ctx.bk.tokens, ctx.bk.seqs, static_cast<int32_t>(ctx.bk.tokens));
    m.backend_.pool(x, m.cu_seqlens_.view.rowSlice(0, ctx.bk.seqs + 1),
                    m.pooled_.view.rowSlice(0, ctx.bk.seqs),
                    PoolParams{ctx.bk.seqs, ctx.mode, ctx.normalize});
  }));
  const Tensor pooled = pooled_.view.rowSlice(0, n_seq);
  backend_.copyToHost(out, pooled, pooled.bytes());
  return okStatus();
}

Status Qwen3Model::enqueueScoreGraphed(GraphExecutor& g, const BatchInput& in,
                                       const ScoreRequest& req, float* out) {
  const int32_t n_seq = static_cast<int32_t>(in.seqlens.size());
  ASSIGN_OR_RETURN(const Bucket bk, bucketFor(static_cast<int64_t>(in.tokens.size()), n_seq));
  stageInputs(in, bk.tokens, bk.seqs);
  struct Ctx {
    Qwen3Model* m;
    Bucket bk;
    ScoreRequest req;
  } ctx{this, bk, req};
  const GraphShapeKey key{graphKind(kGraphScore), static_cast<uint32_t>(bk.seqs),
                          static_cast<uint32_t>(bk.tokens),
                          (static_cast<uint64_t>(static_cast<uint32_t>(req.yes_id)) << 32) |
                              static_cast<uint32_t>(req.no_id)};
  RETURN_IF_ERROR(g.run(key, [&ctx] {
    const Tensor x =
        ctx.m->enqueueLayers(ctx.bk.tokens, ctx.bk.seqs, static_cast<int32_t>(ctx.bk.tokens));
    ctx.m->enqueueScoreHead(x, ctx.bk.seqs, ctx.req);
  }));
  const Tensor scores = scores_.view.rowSlice(0, n_seq);
  backend_.copyToHost(out, scores, scores.bytes());
  return okStatus();
}

Status Qwen3Model::precaptureEmbed(GraphExecutor& g, int32_t seqs, int64_t tokens, PoolMode mode,
                                   bool normalize) {
  if (seqs <= 0 || tokens < seqs) {
    return invalidArgument("precapture: need 1 <= sequences <= tokens (got " +
                           std::to_string(seqs) + "x" + std::to_string(tokens) + ")");
  }
  if (tokens > max_tokens_) {
    return invalidArgument("precapture: " + std::to_string(tokens) +
                           " tokens exceed max_batch_tokens " + std::to_string(max_tokens_));
  }
  const int64_t per = tokens / seqs;
  if (per + tokens % seqs > config_.max_position_embeddings) {
    return invalidArgument("precapture: sequences of " + std::to_string(per + tokens % seqs) +
                           " tokens exceed the model's max_seq_len " +
                           std::to_string(config_.max_position_embeddings));
  }
  std::vector<int32_t> ids(static_cast<size_t>(tokens), 0);
  std::vector<int32_t> lens(static_cast<size_t>(seqs), static_cast<int32_t>(per));
  lens.back() += static_cast<int32_t>(tokens % seqs);
  const BatchInput in{ids, lens};
  ASSIGN_OR_RETURN(const Bucket bk, bucketFor(tokens, seqs));
  stageInputs(in, bk.tokens, bk.seqs);
  const GraphShapeKey key{graphKind(kGraphEmbed), static_cast<uint32_t>(bk.seqs),
                          static_cast<uint32_t>(bk.tokens),
                          (static_cast<uint64_t>(mode) << 1) | (normalize ? 1u : 0u)};
  return g.precapture(key, [&] {
    const Tensor x = enqueueLayers(bk.tokens, bk.seqs, static_cast<int32_t>(bk.tokens));
    backend_.pool(x, cu_seqlens_.view.rowSlice(0, bk.seqs + 1), pooled_.view.rowSlice(0, bk.seqs),
                  PoolParams{bk.seqs, mode, normalize});
  });
}

}  // namespace garden::rose
