#include "services/rose/model/gpt_oss.h"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <unordered_set>
#include <utility>

#include "common/safetensors.h"
#include "services/rose/model/weights.h"
#include "services/rose/model/mxfp4.h"
#include "services/rose/ops/router_split.h"
#include "services/rose/ops/sampler.h"

namespace garden::rose {
namespace {

using simdjson::dom::element;
using simdjson::dom::object;

// Optional number / bool / string fields of a JSON object; absent or null keeps `out`.
Status optNumber(object o, std::string_view key, const std::string& label, double* out) {
  element e;
  if (o[key].get(e) || e.is_null()) return okStatus();
  double d;
  if (e.get_double().get(d))
    return invalidArgument(label + ": " + std::string(key) + ": must be a number");
  *out = d;
  return okStatus();
}
Status optBool(object o, std::string_view key, const std::string& label, bool* out) {
  element e;
  if (o[key].get(e) || e.is_null()) return okStatus();
  bool b;
  if (e.get_bool().get(b))
    return invalidArgument(label + ": " + std::string(key) + ": must be true or false");
  *out = b;
  return okStatus();
}
Status optString(object o, std::string_view key, const std::string& label, std::string* out) {
  element e;
  if (o[key].get(e) || e.is_null()) return okStatus();
  std::string_view s;
  if (e.get_string().get(s))
    return invalidArgument(label + ": " + std::string(key) + ": must be a string");
  *out = std::string(s);
  return okStatus();
}

// One or more checkpoint tensors stacked along rows into a new tensor of `dtype`.
Result<OwnedTensor> uploadStacked(Backend& b, DType dtype,
                                  const std::vector<const TensorView*>& parts) {
  int64_t rows = 0;
  const bool two_d = parts[0]->shape.size() == 2;
  const int64_t cols = two_d ? parts[0]->shape[1] : 1;
  for (const TensorView* p : parts) rows += p->shape[0];
  Result<OwnedTensor> t =
      two_d ? b.allocateTensor(dtype, {rows, cols}) : b.allocateTensor(dtype, {rows});
  if (!t.isOk()) return t.status();
  int64_t row = 0;
  for (const TensorView* p : parts) {
    RETURN_IF_ERROR(uploadInto(b, t->view.rowSlice(row, p->shape[0]), *p));
    row += p->shape[0];
  }
  return t;
}

Result<OwnedTensor> uploadOne(Backend& b, const SafetensorsCheckpoint& ck, const std::string& name,
                              const std::vector<int64_t>& shape, DType dtype) {
  ASSIGN_OR_RETURN(const TensorView* t, requireHfTensor(ck, name, shape));
  return uploadStacked(b, dtype, {t});
}

// [TAG_ROUTER_F32] wt[k, e] = router[e, k] · norm[k] in f32, [H, E] (exact for bf16 inputs: the
// product of two 8-bit significands fits f32's 24). split: as its exact bf16 halves, BF16
// [2, Ep, Hp] (router_split.h), for ops whose routerF32Split() [TAG_ROUTER_MMA].

// Expert weight [E, out, in] into `dst` (allocated [E, out, in]), from MXFP4 blocks/scales
// ([E, out, in/32, 16] / [E, out, in/32]) or a dense tensor ([E, in, out] transposed HF layout
// when `transposed`, else [E, out, in]).
Status uploadExpertsMxfp4(Backend& b, const Tensor& dst, const TensorView& blocks,
                          const TensorView& scales, int64_t e, int64_t out, int64_t in) {
  ASSIGN_OR_RETURN(Mxfp4Shape ms, checkMxfp4(blocks, scales));
  if (ms.prefix != std::vector<int64_t>{e, out} || ms.groups * 32 != in) {
    return invalidArgument("MXFP4 tensor '" + blocks.name + "' has shape " +
                           shapeString(blocks.shape) + ", config.json implies [" +
                           std::to_string(e) + ", " + std::to_string(out) + ", " +
                           std::to_string(in / 32) + ", 16]");
  }
  std::vector<uint16_t> staging(static_cast<size_t>(out * in));
  const auto* bp = reinterpret_cast<const uint8_t*>(blocks.data);
  const auto* sp = reinterpret_cast<const uint8_t*>(scales.data);
  const int64_t groups = in / 32;
  for (int64_t x = 0; x < e; ++x) {
    dequantizeMxfp4Bf16(bp + x * out * groups * 16, sp + x * out * groups, out, groups,
                        staging.data());
    RETURN_IF_ERROR(
        b.uploadConvert(dst.rowSlice(x, 1), HostView{staging.data(), DType::kBF16, out * in})
            .withContext(blocks.name));
  }
  return okStatus();
}

Status uploadExpertsDense(Backend& b, const Tensor& dst, const TensorView& src, int64_t e,
                          int64_t out, int64_t in, bool transposed) {
  const std::vector<int64_t> want =
      transposed ? std::vector<int64_t>{e, in, out} : std::vector<int64_t>{e, out, in};
  if (src.shape != want) {
    return invalidArgument("tensor '" + src.name + "' has shape " + shapeString(src.shape) +
                           ", expected " + shapeString(want) +
                           (transposed ? " (transformers' [E, in, out] layout, as "
                                         "gate_up_proj implies)"
                                       : " ([E, out, in], as gate_up_proj implies)"));
  }
  if (src.dtype != DType::kF32 && src.dtype != DType::kBF16 && src.dtype != DType::kF16) {
    return invalidArgument("tensor '" + src.name + "' has dtype " +
                           std::string(dtypeName(src.dtype)));
  }
  std::vector<float> raw(static_cast<size_t>(out * in)), staging(raw.size());
  const size_t esize = dtypeSize(src.dtype);
  for (int64_t x = 0; x < e; ++x) {
    RETURN_IF_ERROR(convertToF32(src.data + static_cast<size_t>(x * out * in) * esize, src.dtype,
                                 raw.size(), raw.data()));
    if (transposed) {  // raw [in, out] → staging [out, in]
      for (int64_t i = 0; i < in; ++i) {
        for (int64_t o = 0; o < out; ++o)
          staging[static_cast<size_t>(o * in + i)] = raw[static_cast<size_t>(i * out + o)];
      }
    } else {
      staging.swap(raw);
    }
    RETURN_IF_ERROR(
        b.uploadConvert(dst.rowSlice(x, 1), HostView{staging.data(), DType::kF32, out * in})
            .withContext(src.name));
  }
  return okStatus();
}

Result<ExpertWeights> allocateDenseExperts(Backend& b, DType wt, int64_t e, int64_t rows,
                                           int64_t cols) {
  ASSIGN_OR_RETURN(OwnedTensor t, b.allocateTensor(wt, {e, rows, cols}));
  ExpertWeights w;
  w.format = ExpertFormat::kDense;
  w.experts = e;
  w.rows = rows;
  w.cols = cols;
  w.dense = t.view;
  w.storage.push_back(std::move(t.buffer));
  return w;
}

// MXFP4 experts kept resident by the ops, read straight from the mmap'ed checkpoint.
Result<ExpertWeights> uploadResidentMxfp4(LlmOps& ops, const TensorView& blocks,
                                          const TensorView& scales, int64_t e, int64_t out,
                                          int64_t in, ExpertCopy copy) {
  ASSIGN_OR_RETURN(Mxfp4Shape ms, checkMxfp4(blocks, scales));
  if (ms.prefix != std::vector<int64_t>{e, out} || ms.groups * 32 != in) {
    return invalidArgument("MXFP4 tensor '" + blocks.name + "' has shape " +
                           shapeString(blocks.shape) + ", config.json implies [" +
                           std::to_string(e) + ", " + std::to_string(out) + ", " +
                           std::to_string(in / 32) + ", 16]");
  }
  Result<ExpertWeights> w =
      ops.uploadMxfp4Experts(reinterpret_cast<const uint8_t*>(blocks.data),
                             reinterpret_cast<const uint8_t*>(scales.data), e, out, in, copy);
  if (!w.isOk()) return w.status().withContext(blocks.name);
  return w;
}

}  // namespace

Result<OwnedTensor> uploadGptOssRouterF32(Backend& b, const TensorView& router,
                                          const TensorView& norm, bool split) {
  ASSIGN_OR_RETURN(std::vector<float> r, router.toF32());
  ASSIGN_OR_RETURN(std::vector<float> g, norm.toF32());
  const int64_t e = router.shape[0], h = router.shape[1];
  std::vector<float> wt(static_cast<size_t>(h * e));
  for (int64_t x = 0; x < e; ++x)
    for (int64_t k = 0; k < h; ++k)
      wt[static_cast<size_t>(k * e + x)] =
          r[static_cast<size_t>(x * h + k)] * g[static_cast<size_t>(k)];
  if (split) {
    bool exact = false;
    const std::vector<uint16_t> s = routerSplitWeights(wt.data(), h, e, &exact);
    if (!exact) return internalError("router weights: a router x norm product is not two bf16 halves");
    const int64_t ep = routerSplitPaddedE(e), hp = routerSplitPaddedH(h);
    ASSIGN_OR_RETURN(OwnedTensor t, b.allocateTensor(DType::kBF16, {2, ep, hp}));
    RETURN_IF_ERROR(b.uploadConvert(t.view, HostView{s.data(), DType::kBF16, 2 * ep * hp}));
    return t;
  }
  ASSIGN_OR_RETURN(OwnedTensor t, b.allocateTensor(DType::kF32, {h, e}));
  RETURN_IF_ERROR(b.uploadConvert(t.view, HostView{wt.data(), DType::kF32, h * e}));
  return t;
}

Result<GptOssConfig> parseGptOssConfig(std::string_view json, std::string_view label_sv) {
  const std::string label(label_sv);
  GptOssConfig c;
  ASSIGN_OR_RETURN(c.base, parseModelConfig(json, label));
  const ModelConfig& m = c.base;
  simdjson::dom::parser parser;
  element root;
  if (parser.parse(json.data(), json.size(), true).get(root))
    return invalidArgument(label + ": not valid JSON");
  object o;
  if (root.get_object().get(o)) return invalidArgument(label + ": not a JSON object");

  if (!m.model_type.empty() && m.model_type != "gpt_oss") {
    return invalidArgument(label + ": model_type: '" + m.model_type + "' is not gpt_oss");
  }
  if (m.num_local_experts <= 0)
    return invalidArgument(label + ": num_local_experts: must be a positive integer");
  if (m.num_experts_per_tok <= 0 || m.num_experts_per_tok > m.num_local_experts) {
    return invalidArgument(label + ": num_experts_per_tok: must be in [1, num_local_experts]");
  }
  if (m.intermediate_size <= 0)
    return invalidArgument(label + ": intermediate_size: must be a positive integer");
  if (m.head_dim % 2 != 0) return invalidArgument(label + ": head_dim: must be even (RoPE)");

  c.rope.type = "default";
  for (std::string_view key : {"rope_scaling", "rope_parameters"}) {
    element e;
    if (o[key].get(e) || e.is_null()) continue;
    object ro;
    if (e.get_object().get(ro))
      return invalidArgument(label + ": " + std::string(key) + ": must be an object");
    const std::string sub = label + "." + std::string(key);
    RETURN_IF_ERROR(optString(ro, "rope_type", sub, &c.rope.type));
    RETURN_IF_ERROR(optString(ro, "type", sub, &c.rope.type));
    RETURN_IF_ERROR(optNumber(ro, "factor", sub, &c.rope.factor));
    RETURN_IF_ERROR(optNumber(ro, "beta_fast", sub, &c.rope.beta_fast));
    RETURN_IF_ERROR(optNumber(ro, "beta_slow", sub, &c.rope.beta_slow));
    double omax = static_cast<double>(c.rope.original_max_position_embeddings);
    RETURN_IF_ERROR(optNumber(ro, "original_max_position_embeddings", sub, &omax));
    c.rope.original_max_position_embeddings = static_cast<int64_t>(omax);
    RETURN_IF_ERROR(optBool(ro, "truncate", sub, &c.rope.truncate));
    RETURN_IF_ERROR(optNumber(ro, "attention_factor", sub, &c.rope.attention_factor));
  }
  double limit = c.swiglu_limit, alpha = c.swiglu_alpha;
  RETURN_IF_ERROR(optNumber(o, "swiglu_limit", label, &limit));
  RETURN_IF_ERROR(optNumber(o, "swiglu_alpha", label, &alpha));
  if (!(limit > 0)) return invalidArgument(label + ": swiglu_limit: must be positive");
  c.swiglu_limit = static_cast<float>(limit);
  c.swiglu_alpha = static_cast<float>(alpha);
  {
    element e;
    if (!o["quantization_config"].get(e) && !e.is_null()) {
      object qo;
      if (e.get_object().get(qo))
        return invalidArgument(label + ": quantization_config: must be an object");
      RETURN_IF_ERROR(
          optString(qo, "quant_method", label + ".quantization_config", &c.quant_method));
      if (!c.quant_method.empty() && c.quant_method != "mxfp4") {
        return unimplemented(label + ": quantization_config.quant_method: '" + c.quant_method +
                             "' is not supported (mxfp4 or none)");
      }
    }
  }
  c.sliding.assign(static_cast<size_t>(m.num_hidden_layers), 0);
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    if (m.layer_types.empty()) {
      c.sliding[static_cast<size_t>(l)] = l % 2 == 0;  // transformers' GptOssConfig default
    } else {
      const std::string& t = m.layer_types[static_cast<size_t>(l)];
      if (t != "sliding_attention" && t != "full_attention") {
        return invalidArgument(label + ": layer_types[" + std::to_string(l) + "]: '" + t +
                               "' (want sliding_attention or full_attention)");
      }
      c.sliding[static_cast<size_t>(l)] = t == "sliding_attention";
    }
    if (c.sliding[static_cast<size_t>(l)] && m.sliding_window <= 0) {
      return invalidArgument(
          label + ": sliding_window: must be positive when a layer is sliding_attention");
    }
  }
  return c;
}

bool moeWeightsFromName(std::string_view name, MoeWeightsMode* out) {
  for (MoeWeightsMode m : {MoeWeightsMode::kAuto, MoeWeightsMode::kDense, MoeWeightsMode::kMxfp4,
                           MoeWeightsMode::kFp8, MoeWeightsMode::kMxfp4Bf16}) {
    if (name == moeWeightsName(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

const char* moeWeightsName(MoeWeightsMode mode) {
  switch (mode) {
    case MoeWeightsMode::kAuto: return "auto";
    case MoeWeightsMode::kDense: return "bf16";
    case MoeWeightsMode::kMxfp4: return "mxfp4";
    case MoeWeightsMode::kFp8: return "fp8";
    case MoeWeightsMode::kMxfp4Bf16: return "mxfp4-bf16";
  }
  return "?";
}

bool applyGptOssDtype(std::string_view dtype, GptOssOptions& o) {
  if (dtype == "bfloat16") return true;
  if (dtype != "float16") return false;
  o.attn_f16 = o.moe_f16 = o.head_f16 = true;
  o.moe_out_f32 = o.proj_f32 = true;  // the roundings TF32 does not make [TAG_PROJ_F32]
  return true;
}

Result<GptOssConfig> loadGptOssConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return notFound(path + ": cannot open");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parseGptOssConfig(text, path);
}

GptOssModel::~GptOssModel() = default;

Result<std::unique_ptr<GptOssModel>> GptOssModel::load(const std::string& dir, Backend& backend,
                                                       LlmOps& ops, const GptOssOptions& opts) {
  std::unique_ptr<GptOssModel> m(new GptOssModel(backend, ops));
  ASSIGN_OR_RETURN(m->config_, loadGptOssConfig(dir));
  if (opts.max_batch_tokens <= 0 || opts.max_seqs <= 0 || opts.max_logits_rows <= 0 ||
      opts.max_model_len < 0 || opts.min_block_size <= 0) {
    return invalidArgument(
        "gpt-oss options: max_batch_tokens, max_seqs, max_logits_rows and min_block_size must "
        "be positive");
  }
  m->opts_ = opts;
  // [TAG_CPU_ROW_INVARIANT] A sequence's tokens must not depend on its batch.
  backend.setRowInvariantLinear(true);
  const ModelConfig& c = m->config_.base;
  m->max_model_len_ = opts.max_model_len > 0 ? opts.max_model_len
                                             : std::min<int64_t>(c.max_position_embeddings, 131072);
  Backend& b = backend;
  const DType wt = b.weightDType();
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads,
                hkv = c.num_key_value_heads, inter = c.intermediate_size, v = c.vocab_size,
                ne = c.num_local_experts;
  LlmOpsLimits lim;
  lim.max_tokens = opts.max_batch_tokens;
  lim.max_seqs = opts.max_seqs;
  lim.max_logits_rows = opts.max_logits_rows;
  lim.max_model_len = m->max_model_len_;
  lim.vocab = v;
  lim.hidden = static_cast<int32_t>(h);
  lim.intermediate = static_cast<int32_t>(inter);
  lim.num_experts = static_cast<int32_t>(ne);
  lim.top_k = static_cast<int32_t>(c.num_experts_per_tok);
  lim.num_q_heads = static_cast<int32_t>(hq);
  lim.num_kv_heads = static_cast<int32_t>(hkv);
  lim.head_dim = static_cast<int32_t>(d);
  RETURN_IF_ERROR(ops.reserve(lim));

  m->route_f32_ = opts.f32_residual && opts.f32_router && b.activationDType() != DType::kF32;
  // [TAG_ATTN_F16] Each part's 16-bit type: the backend's, or fp16 on a bf16 backend with the f32
  // stream (the MoE side also with the f32 router: it routes from the stream, not its fp16 input).
  const bool bf16_backend = b.activationDType() == DType::kBF16;
  auto refuseF16 = [&](const char* part, const char* needs) {
    return invalidArgument(std::string("--dtype float16 (") + part + "): needs a bf16 backend " +
                           "(cuda) and the f32 residual stream" + needs + "; the " +
                           std::string(b.name()) + " backend computes in " +
                           std::string(dtypeName(b.activationDType())));
  };
  if (opts.attn_f16 && (!bf16_backend || !opts.f32_residual)) return refuseF16("attention", "");
  if (opts.moe_f16 && (!bf16_backend || !m->route_f32_)) return refuseF16("MoE", " and the f32 router");
  if (opts.head_f16 && (!bf16_backend || !opts.f32_residual)) return refuseF16("lm_head", "");
  if (opts.moe_f16 && (opts.moe_weights == MoeWeightsMode::kFp8 ||
                       opts.moe_weights == MoeWeightsMode::kMxfp4Bf16)) {
    return invalidArgument(std::string("--dtype float16: not with --moe-weights ") +
                           moeWeightsName(opts.moe_weights) + " (its expert copy is for bf16 steps)");
  }
  if (opts.moe_out_f32 && !opts.f32_residual) {
    return invalidArgument("moe_out_f32: needs the f32 residual stream");
  }
  if (opts.proj_f32 && !opts.attn_f16) {  // [TAG_PROJ_F32]
    return invalidArgument("proj_f32: needs the fp16 attention block (--dtype float16)");
  }
  auto dtypes = [&](bool f16) {  // (activations, weights) of a part
    return std::pair{f16 ? DType::kF16 : b.activationDType(), f16 ? DType::kF16 : wt};
  };
  const auto [adt, awt] = dtypes(opts.attn_f16);
  const auto [mdt, mwt] = dtypes(opts.moe_f16);
  const auto [hdt, hwt] = dtypes(opts.head_f16);
  m->attn_dtype_ = adt;
  ASSIGN_OR_RETURN(auto ck, SafetensorsCheckpoint::openDir(dir));
  ASSIGN_OR_RETURN(m->embed_, uploadOne(b, *ck, "model.embed_tokens.weight", {v, h}, wt));
  ASSIGN_OR_RETURN(m->final_norm_, uploadOne(b, *ck, "model.norm.weight", {h}, wt));
  if (c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(m->lm_head_, uploadOne(b, *ck, "model.embed_tokens.weight", {v, h}, hwt));
  } else {
    ASSIGN_OR_RETURN(m->lm_head_, uploadOne(b, *ck, "lm_head.weight", {v, h}, hwt));
  }
  m->layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    Layer& L = m->layers_[static_cast<size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ASSIGN_OR_RETURN(L.input_norm, uploadOne(b, *ck, p + "input_layernorm.weight", {h}, wt));
    ASSIGN_OR_RETURN(L.post_norm,
                     uploadOne(b, *ck, p + "post_attention_layernorm.weight", {h}, wt));
    ASSIGN_OR_RETURN(auto* q, requireHfTensor(*ck, p + "self_attn.q_proj.weight", {hq * d, h}));
    ASSIGN_OR_RETURN(auto* k, requireHfTensor(*ck, p + "self_attn.k_proj.weight", {hkv * d, h}));
    ASSIGN_OR_RETURN(auto* vv, requireHfTensor(*ck, p + "self_attn.v_proj.weight", {hkv * d, h}));
    ASSIGN_OR_RETURN(L.qkv, uploadStacked(b, awt, {q, k, vv}));
    ASSIGN_OR_RETURN(auto* qb, requireHfTensor(*ck, p + "self_attn.q_proj.bias", {hq * d}));
    ASSIGN_OR_RETURN(auto* kb, requireHfTensor(*ck, p + "self_attn.k_proj.bias", {hkv * d}));
    ASSIGN_OR_RETURN(auto* vb, requireHfTensor(*ck, p + "self_attn.v_proj.bias", {hkv * d}));
    // [TAG_PROJ_F32] f32 projections take f32 biases (cuBLASLt: the bias has D's type).
    ASSIGN_OR_RETURN(L.qkv_bias,
                     uploadStacked(b, opts.qkvF32() ? DType::kF32 : awt, {qb, kb, vb}));
    ASSIGN_OR_RETURN(L.o, uploadOne(b, *ck, p + "self_attn.o_proj.weight", {h, hq * d}, awt));
    ASSIGN_OR_RETURN(L.o_bias, uploadOne(b, *ck, p + "self_attn.o_proj.bias", {h},
                                         opts.oF32() ? DType::kF32 : awt));
    ASSIGN_OR_RETURN(L.sinks, uploadOne(b, *ck, p + "self_attn.sinks", {hq}, DType::kF32));
    ASSIGN_OR_RETURN(L.router, uploadOne(b, *ck, p + "mlp.router.weight", {ne, h}, wt));
    ASSIGN_OR_RETURN(L.router_bias, uploadOne(b, *ck, p + "mlp.router.bias", {ne}, wt));
    if (m->route_f32_) {
      ASSIGN_OR_RETURN(auto* rw, requireHfTensor(*ck, p + "mlp.router.weight", {ne, h}));
      ASSIGN_OR_RETURN(auto* nw,
                       requireHfTensor(*ck, p + "post_attention_layernorm.weight", {h}));
      ASSIGN_OR_RETURN(L.router_f32t, uploadGptOssRouterF32(b, *rw, *nw, ops.routerF32Split()));
    }
    ASSIGN_OR_RETURN(L.b1,
                     uploadOne(b, *ck, p + "mlp.experts.gate_up_proj_bias", {ne, 2 * inter}, mwt));
    ASSIGN_OR_RETURN(L.b2, uploadOne(b, *ck, p + "mlp.experts.down_proj_bias", {ne, h}, mwt));
    const std::string ex = p + "mlp.experts.";
    const TensorView* gu_blocks = findHfTensor(*ck, ex + "gate_up_proj_blocks");
    if (gu_blocks != nullptr) {
      const TensorView* gu_scales = findHfTensor(*ck, ex + "gate_up_proj_scales");
      const TensorView* dn_blocks = findHfTensor(*ck, ex + "down_proj_blocks");
      const TensorView* dn_scales = findHfTensor(*ck, ex + "down_proj_scales");
      if (gu_scales == nullptr || dn_blocks == nullptr || dn_scales == nullptr) {
        return invalidArgument("checkpoint has '" + gu_blocks->name + "' but not all of " + ex +
                               "{gate_up_proj_scales, down_proj_blocks, down_proj_scales}");
      }
      const bool fp8 = opts.moe_weights == MoeWeightsMode::kFp8;
      const bool bf16_copy = opts.moe_weights == MoeWeightsMode::kMxfp4Bf16;
      const ExpertCopy copy = fp8 ? ExpertCopy::kFp8 : bf16_copy ? ExpertCopy::kBf16 : ExpertCopy::kNone;
      const bool resident = opts.moe_weights == MoeWeightsMode::kMxfp4 || fp8 || bf16_copy ||
                            (opts.moe_weights == MoeWeightsMode::kAuto &&
                             ops.supportsExpertFormat(ExpertFormat::kMxfp4));
      if (resident) {
        if (!ops.supportsExpertFormat(ExpertFormat::kMxfp4)) {
          return invalidArgument(std::string("--moe-weights ") + moeWeightsName(opts.moe_weights) +
                                 ": the " + std::string(b.name()) +
                                 " backend runs dense experts only");
        }
        if (fp8 && !ops.supportsFp8Experts()) {
          return invalidArgument("--moe-weights fp8: the " + std::string(b.name()) +
                                 " backend's LLM ops have no FP8 experts");
        }
        if (bf16_copy && !ops.supportsBf16ExpertCopy()) {
          return invalidArgument("--moe-weights mxfp4-bf16: the " + std::string(b.name()) +
                                 " backend's LLM ops keep no bf16 expert copy");
        }
        ASSIGN_OR_RETURN(L.w1,
                         uploadResidentMxfp4(ops, *gu_blocks, *gu_scales, ne, 2 * inter, h, copy));
        ASSIGN_OR_RETURN(L.w2, uploadResidentMxfp4(ops, *dn_blocks, *dn_scales, ne, h, inter, copy));
        if (opts.moe_f16 && std::max(L.w1.mx_max_scale, L.w2.mx_max_scale) > 128) {
          return invalidArgument("--dtype float16: layer " + std::to_string(l) +
                                 " has MXFP4 scale bytes above 128 (weights >= 12), which the "
                                 "fp16 dequantization does not take");
        }
        m->expert_format_ = ExpertFormat::kMxfp4;
        if (fp8) {
          m->fp8_experts_ = true;
          m->fp8_inexact_ += L.w1.fp8_inexact + L.w2.fp8_inexact;
          m->fp8_nonzero_ += L.w1.fp8_nonzero + L.w2.fp8_nonzero;
        }
        continue;
      }
      ASSIGN_OR_RETURN(L.w1, allocateDenseExperts(b, mwt, ne, 2 * inter, h));
      ASSIGN_OR_RETURN(L.w2, allocateDenseExperts(b, mwt, ne, h, inter));
      RETURN_IF_ERROR(uploadExpertsMxfp4(b, L.w1.dense, *gu_blocks, *gu_scales, ne, 2 * inter, h));
      RETURN_IF_ERROR(uploadExpertsMxfp4(b, L.w2.dense, *dn_blocks, *dn_scales, ne, h, inter));
    } else {
      if (opts.moe_weights == MoeWeightsMode::kMxfp4 || opts.moe_weights == MoeWeightsMode::kFp8 ||
          opts.moe_weights == MoeWeightsMode::kMxfp4Bf16) {
        return invalidArgument(std::string("--moe-weights ") + moeWeightsName(opts.moe_weights) +
                               ": the checkpoint's experts are not MXFP4");
      }
      ASSIGN_OR_RETURN(L.w1, allocateDenseExperts(b, mwt, ne, 2 * inter, h));
      ASSIGN_OR_RETURN(L.w2, allocateDenseExperts(b, mwt, ne, h, inter));
      const TensorView* gu = findHfTensor(*ck, ex + "gate_up_proj");
      const TensorView* dn = findHfTensor(*ck, ex + "down_proj");
      if (gu == nullptr || dn == nullptr) {
        return invalidArgument("checkpoint has neither MXFP4 experts (" + ex +
                               "gate_up_proj_blocks) nor "
                               "dense ones (" +
                               ex + "gate_up_proj, " + ex + "down_proj)");
      }
      // transformers keeps [E, H, 2I] / [E, I, H] (x @ W); [E, 2I, H] / [E, H, I] is accepted too.
      // When H == 2I the shape cannot tell: the transformers layout is assumed.
      const bool transposed = gu->shape == std::vector<int64_t>{ne, h, 2 * inter};
      RETURN_IF_ERROR(uploadExpertsDense(b, L.w1.dense, *gu, ne, 2 * inter, h, transposed));
      RETURN_IF_ERROR(uploadExpertsDense(b, L.w2.dense, *dn, ne, h, inter, transposed));
    }
  }

  // YaRN RoPE tables with the attention scaling folded in.
  ASSIGN_OR_RETURN(RopeFrequencies freqs, computeRopeFrequencies(d, c.rope_theta, m->config_.rope,
                                                                 c.max_position_embeddings));
  {
    const int64_t half = d / 2, n = m->max_model_len_;
    std::vector<float> cosv(static_cast<size_t>(n * half)), sinv(cosv.size());
    buildRopeTables(freqs, n, cosv.data(), sinv.data());
    ASSIGN_OR_RETURN(m->rope_cos_, b.allocateTensor(DType::kF32, {n, half}));
    ASSIGN_OR_RETURN(m->rope_sin_, b.allocateTensor(DType::kF32, {n, half}));
    RETURN_IF_ERROR(b.uploadConvert(m->rope_cos_.view, {cosv.data(), DType::kF32, n * half}));
    RETURN_IF_ERROR(b.uploadConvert(m->rope_sin_.view, {sinv.data(), DType::kF32, n * half}));
  }

  // Workspace. block_tables holds [num_seqs, longest table] of a step; its capacity is
  // max_seqs sequences of max_model_len tokens in blocks of min_block_size (validate() checks).
  const int64_t t = opts.max_batch_tokens, s = opts.max_seqs, r = opts.max_logits_rows;
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
  ASSIGN_OR_RETURN(m->residual_, b.allocateTensor(opts.f32_residual ? DType::kF32
                                                                      : b.residualDType(),
                                                  {t, h}));
  ASSIGN_OR_RETURN(m->x_, b.allocateTensor(act, {t, h}));
  if (opts.attn_f16) {
    ASSIGN_OR_RETURN(m->xa_, b.allocateTensor(adt, {t, h}));
  }
  if (opts.moe_f16) {
    ASSIGN_OR_RETURN(m->xm_, b.allocateTensor(mdt, {t, h}));
  }
  if (opts.head_f16) {
    ASSIGN_OR_RETURN(m->xf_, b.allocateTensor(hdt, {t, h}));
  }
  if (opts.proj_f32) {
    ASSIGN_OR_RETURN(m->proj32_,
                     b.allocateTensor(DType::kF32, {t, std::max((hq + 2 * hkv) * d, h)}));
  }
  ASSIGN_OR_RETURN(m->moe_out_, b.allocateTensor(opts.moe_out_f32 ? DType::kF32 : mdt, {t, h}));
  ASSIGN_OR_RETURN(m->qkv_buf_, b.allocateTensor(adt, {t, (hq + 2 * hkv) * d}));
  ASSIGN_OR_RETURN(m->attn_, b.allocateTensor(adt, {t, hq * d}));
  ASSIGN_OR_RETURN(m->router_logits_, b.allocateTensor(DType::kF32, {t, ne}));
  ASSIGN_OR_RETURN(m->topk_ids_, b.allocateTensor(DType::kI32, {t, c.num_experts_per_tok}));
  ASSIGN_OR_RETURN(m->topk_w_, b.allocateTensor(DType::kF32, {t, c.num_experts_per_tok}));
  ASSIGN_OR_RETURN(m->gathered_, b.allocateTensor(hdt, {r, h}));
  ASSIGN_OR_RETURN(m->logits_, b.allocateTensor(DType::kF32, {r, v}));
  ASSIGN_OR_RETURN(m->sampled_, b.allocateTensor(DType::kI32, {s}));
  ASSIGN_OR_RETURN(m->prev_pairs_, b.allocateTensor(DType::kI32, {s, 2}));
  if (opts.cuda_graphs && b.graphs() != nullptr) {
    m->graphs_ = b.graphs();
    // Padded decode rows never get attention output; start them at zero, not at whatever the
    // allocation held.
    const int64_t rows = std::min<int64_t>(t, kMaxGraphSeqs);
    std::vector<uint8_t> zeros(static_cast<size_t>(rows * hq * d) * dtypeSize(adt), 0);
    b.copyToDevice(m->attn_.view.rowSlice(0, rows), zeros.data(), zeros.size());
    RETURN_IF_ERROR(b.synchronize());
  }
  ASSIGN_OR_RETURN(m->sampled_lp_,
                   b.allocateTensor(DType::kU8, {s * static_cast<int64_t>(sizeof(llm::LlmTokenLogprobs))}));
  return m;
}

KvCacheShape GptOssModel::kvShape(int32_t num_blocks, int32_t block_size,
                                  int32_t num_blocks_window) const {
  KvCacheShape s;
  s.num_layers = static_cast<int32_t>(config_.base.num_hidden_layers);
  s.num_blocks = num_blocks;
  s.block_size = block_size;
  s.num_kv_heads = static_cast<int32_t>(config_.base.num_key_value_heads);
  s.head_dim = static_cast<int32_t>(config_.base.head_dim);
  addWindowPool(config_, num_blocks_window, s);
  return s;
}

int32_t GptOssModel::slidingWindow() const { return slidingWindowOf(config_); }

int32_t slidingWindowOf(const GptOssConfig& c) {
  for (uint8_t sl : c.sliding) {
    if (sl) return static_cast<int32_t>(c.base.sliding_window);
  }
  return 0;
}

void addWindowPool(const GptOssConfig& c, int32_t num_blocks_window, KvCacheShape& shape) {
  if (num_blocks_window <= 0 || slidingWindowOf(c) <= 0 || shape.num_layers > 64) return;
  shape.num_blocks_window = num_blocks_window;
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    if (c.sliding[static_cast<size_t>(l)]) shape.window_layers |= uint64_t{1} << l;
  }
}

DType GptOssModel::kvDType() const { return attn_dtype_; }

// [TAG_LLM_SAMPLER_STATE] The sampler-state fields of one sequence: the slot inside
// [0, max_seqs) and used by one sequence of the step, the reload's words inside the state array
// with ids in the vocabulary and biases in [-100, 100], and features the ops implement.
namespace {
Status validateSamplerState(const GptOssStepLimits& lim, const LlmStep& step, const LlmStepSeq& s,
                            std::unordered_set<int32_t>& used) {
  const SamplingParams& p = s.sampling;
  const bool extras = p.state_slot >= 0 || p.logprobs >= 0 || p.min_p > 0.f ||
                      llm::needsPenaltyState(p) || s.state_offset >= 0;
  if (extras && !lim.sampler_state) {
    return invalidArgument(
        "sampling: this backend's sampler does not implement logprobs, min_p, penalties or "
        "logit_bias (sampler state)");
  }
  if (p.state_slot < -1 || p.state_slot >= lim.max_seqs) {
    return invalidArgument("sampling.state_slot " + std::to_string(p.state_slot) +
                           " outside [-1, max_seqs " + std::to_string(lim.max_seqs) + ")");
  }
  if (p.state_slot >= 0 && !used.insert(p.state_slot).second) {
    return invalidArgument("sampling.state_slot " + std::to_string(p.state_slot) +
                           " is used by another sequence of this step");
  }
  if (s.state_offset < -1) return invalidArgument("state_offset must be >= -1");
  if (s.state_offset < 0) return okStatus();
  if (p.state_slot < 0) return invalidArgument("state_offset set without a sampling.state_slot");
  if (s.state_prompt < 0 || s.state_output < 0 || s.state_bias < 0 ||
      s.state_bias > llm::kMaxLogitBias) {
    return invalidArgument("state_prompt/state_output must be >= 0 and state_bias in [0, " +
                           std::to_string(llm::kMaxLogitBias) + "]");
  }
  const uint64_t words = static_cast<uint64_t>(s.state_prompt) +
                         static_cast<uint64_t>(s.state_output) + 2 * static_cast<uint64_t>(s.state_bias);
  if (static_cast<uint64_t>(s.state_offset) + words > step.state.size()) {
    return invalidArgument("state_offset/state_prompt/state_output/state_bias outside the state "
                           "array (" + std::to_string(step.state.size()) + " words)");
  }
  const int64_t v = lim.vocab;
  const auto ids = step.state.subspan(static_cast<size_t>(s.state_offset),
                                      static_cast<size_t>(s.state_prompt + s.state_output));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= v) {
      return invalidArgument("state token " + std::to_string(i) + " has id " +
                             std::to_string(ids[i]) + " outside the vocabulary");
    }
  }
  const size_t b0 = static_cast<size_t>(s.state_offset) + ids.size();
  for (int32_t i = 0; i < s.state_bias; ++i) {
    LogitBias b;
    std::memcpy(&b, step.state.data() + b0 + 2 * static_cast<size_t>(i), sizeof(b));
    if (b.id < 0 || b.id >= v) {
      return invalidArgument("logit_bias entry " + std::to_string(i) + " has id " +
                             std::to_string(b.id) + " outside the vocabulary");
    }
    if (!(b.bias >= -100.f && b.bias <= 100.f)) {
      return invalidArgument("logit_bias entry " + std::to_string(i) +
                             ": bias must be in [-100, 100]");
    }
  }
  return okStatus();
}
}  // namespace

Status GptOssModel::validate(const LlmStep& step, const PagedKvCache& kv,
                             int64_t prev_sampled) const {
  const KvCacheShape& ks = kv.shape();
  const KvCacheShape want = kvShape(ks.num_blocks, ks.block_size, ks.num_blocks_window);
  if (ks.num_layers != want.num_layers || ks.num_kv_heads != want.num_kv_heads ||
      ks.head_dim != want.head_dim || kv.dtype() != kvDType() ||
      ks.num_blocks_window != want.num_blocks_window || ks.window_layers != want.window_layers) {
    return invalidArgument(
        "kv cache shape/dtype does not match the model (layers, kv heads, head_dim, dtype, "
        "window pool layers)");
  }
  GptOssStepLimits lim;
  lim.vocab = config_.base.vocab_size;
  lim.max_batch_tokens = opts_.max_batch_tokens;
  lim.max_seqs = opts_.max_seqs;
  lim.max_logits_rows = opts_.max_logits_rows;
  lim.max_model_len = max_model_len_;
  lim.table_capacity = table_capacity_;
  lim.sampler_state = ops_.supportsSamplerState();
  lim.token_mask = ops_.supportsTokenMask();
  lim.num_blocks_window = ks.num_blocks_window;
  lim.window = ks.num_blocks_window > 0 ? slidingWindow() : 0;
  return validateGptOssStep(lim, step, ks.block_size, ks.num_blocks, prev_sampled);
}

void samplerStateResets(const LlmStep& step, std::vector<SamplerStateReset>& resets,
                        std::vector<LogitBias>& bias) {
  resets.clear();
  bias.clear();
  size_t bias_total = 0;
  for (const LlmStepSeq& s : step.seqs) {
    if (s.state_offset >= 0) bias_total += static_cast<size_t>(s.state_bias);
  }
  bias.resize(bias_total);  // stable storage for the spans below
  size_t bias_at = 0;
  for (const LlmStepSeq& s : step.seqs) {
    if (s.state_offset < 0) continue;
    const size_t off = static_cast<size_t>(s.state_offset);
    SamplerStateReset r;
    r.slot = s.sampling.state_slot;
    r.prompt = step.state.subspan(off, static_cast<size_t>(s.state_prompt));
    r.output = step.state.subspan(off + r.prompt.size(), static_cast<size_t>(s.state_output));
    if (s.state_bias > 0) {
      std::memcpy(bias.data() + bias_at, step.state.data() + off + r.prompt.size() + r.output.size(),
                  sizeof(LogitBias) * static_cast<size_t>(s.state_bias));
      r.bias = std::span<const LogitBias>(bias.data() + bias_at, static_cast<size_t>(s.state_bias));
      bias_at += static_cast<size_t>(s.state_bias);
    }
    resets.push_back(r);
  }
}

Status validateGptOssStep(const GptOssStepLimits& lim, const LlmStep& step, int32_t block_size,
                          int32_t num_blocks, int64_t prev_sampled) {
  const int64_t n_seq = static_cast<int64_t>(step.seqs.size());
  if (n_seq == 0) return invalidArgument("step has no sequences");
  if (n_seq > lim.max_seqs) {
    return invalidArgument("step has " + std::to_string(n_seq) + " sequences, more than max_seqs " +
                           std::to_string(lim.max_seqs));
  }
  int64_t total = 0, rows = 0;
  std::unordered_set<int64_t> slots, window_slots;
  std::unordered_set<int32_t> state_slots;
  for (int64_t i = 0; i < n_seq; ++i) {
    const LlmStepSeq& s = step.seqs[static_cast<size_t>(i)];
    const std::string who = "sequence " + std::to_string(i) + ": ";
    if (s.num_tokens <= 0) return invalidArgument(who + "num_tokens must be >= 1");
    if (s.token_offset < 0 ||
        static_cast<size_t>(s.token_offset) + static_cast<size_t>(s.num_tokens) >
            step.tokens.size()) {
      return invalidArgument(who + "token_offset/num_tokens outside the token array");
    }
    if (s.position < 0) return invalidArgument(who + "position must be >= 0");
    const int64_t end = static_cast<int64_t>(s.position) + s.num_tokens;
    if (end > lim.max_model_len) {
      return invalidArgument(who + "position + num_tokens = " + std::to_string(end) +
                             " exceeds max_model_len " + std::to_string(lim.max_model_len));
    }
    if (s.num_blocks < 0 || s.block_offset < 0 ||
        static_cast<size_t>(s.block_offset) + static_cast<size_t>(s.num_blocks) >
            step.block_ids.size()) {
      return invalidArgument(who + "block_offset/num_blocks outside the block id array");
    }
    if (s.num_blocks < kvBlocksFor(end, block_size)) {
      return invalidArgument(who + "block table has " + std::to_string(s.num_blocks) + " blocks, " +
                             std::to_string(kvBlocksFor(end, block_size)) + " needed for " +
                             std::to_string(end) + " tokens");
    }
    const auto table = step.block_ids.subspan(static_cast<size_t>(s.block_offset),
                                              static_cast<size_t>(s.num_blocks));
    for (size_t bi = 0; bi < table.size(); ++bi) {
      if (table[bi] < 0 || table[bi] >= num_blocks) {
        return invalidArgument(who + "block id " + std::to_string(table[bi]) +
                               " outside the cache [0, " + std::to_string(num_blocks) + ")");
      }
    }
    // [TAG_KV_WINDOW_GROUP] The window table: after the block table, ids of the window pool,
    // holes (-1) only where no sliding layer of this step reads or writes.
    std::span<const int32_t> wtable;
    if (s.window_table > 1 || (s.window_table == 1) != (lim.num_blocks_window > 0)) {
      return invalidArgument(who + "window_table " + std::to_string(s.window_table) +
                             (lim.num_blocks_window > 0
                                  ? ": the cache keeps sliding layers in a window pool, so every "
                                    "sequence must carry its window table (1)"
                                  : ": the cache has no window pool (0)"));
    }
    if (s.window_table == 1) {
      if (static_cast<size_t>(s.block_offset) + 2 * static_cast<size_t>(s.num_blocks) >
          step.block_ids.size()) {
        return invalidArgument(who + "window table outside the block id array");
      }
      wtable = step.block_ids.subspan(static_cast<size_t>(s.block_offset + s.num_blocks),
                                      static_cast<size_t>(s.num_blocks));
      for (size_t bi = 0; bi < wtable.size(); ++bi) {
        if (wtable[bi] < -1 || wtable[bi] >= lim.num_blocks_window) {
          return invalidArgument(who + "window block id " + std::to_string(wtable[bi]) +
                                 " outside the window pool [0, " +
                                 std::to_string(lim.num_blocks_window) + ") (or -1)");
        }
      }
      const int64_t lo = std::max<int64_t>(0, static_cast<int64_t>(s.position) - lim.window + 1);
      for (int64_t bi = lo / block_size; bi * block_size < end; ++bi) {
        if (wtable[static_cast<size_t>(bi)] < 0) {
          return invalidArgument(who + "window table has a hole at block " + std::to_string(bi) +
                                 ", which a sliding layer reads or writes (positions " +
                                 std::to_string(lo) + ".." + std::to_string(end - 1) + ")");
        }
      }
      for (int32_t j = 0; j < s.num_tokens; ++j) {
        if (!window_slots.insert(kvSlot(wtable, s.position + j, block_size)).second) {
          return invalidArgument(who + "token " + std::to_string(j) +
                                 " writes a window-pool KV slot another token of this step writes");
        }
      }
    }
    if (s.prev_row < -1 || s.prev_row >= prev_sampled) {
      return invalidArgument(who + "prev_row " + std::to_string(s.prev_row) +
                             " is not a row of the previous step's " +
                             std::to_string(prev_sampled) + " sampled ids");
    }
    for (int32_t j = 0; j < s.num_tokens; ++j) {
      const int32_t id = step.tokens[static_cast<size_t>(s.token_offset + j)];
      if (j == 0 && s.prev_row >= 0) {  // taken from the previous step's output
        if (!slots.insert(kvSlot(table, s.position, block_size)).second) {
          return invalidArgument(who + "token 0 writes a KV slot another token of this step writes");
        }
        continue;
      }
      if (id < 0 || id >= lim.vocab) {
        return invalidArgument(who + "token " + std::to_string(j) + " has id " +
                               std::to_string(id) + " outside the vocabulary [0, " +
                               std::to_string(lim.vocab) + ")");
      }
      if (!slots.insert(kvSlot(table, s.position + j, block_size)).second) {
        return invalidArgument(who + "token " + std::to_string(j) +
                               " writes a KV slot another token of this step writes");
      }
    }
    if (s.logits != LogitsMode::kNone && s.logits != LogitsMode::kLast &&
        s.logits != LogitsMode::kAll) {
      return invalidArgument(who + "logits mode must be 0 (none), 1 (last) or 2 (all)");
    }
    if (s.sample > 1) return invalidArgument(who + "sample must be 0 or 1");
    if (s.mask_index < 0 ||
        static_cast<size_t>(s.mask_index) * static_cast<size_t>(step.mask_words) >
            step.masks.size() ||
        (s.mask_index > 0 && (!s.sample || step.mask_words * 32 < lim.vocab))) {
      return invalidArgument(who + "mask_index " + std::to_string(s.mask_index) +
                             " names no token mask of this step");
    }
    if (s.mask_index > 0 && !lim.token_mask) {
      return invalidArgument(who + "mask_index: this backend's sampler does not implement token "
                                   "masks (structured outputs)");
    }
    if (s.sample) RETURN_IF_ERROR(validateSamplingParams(s.sampling).withContext(who + "sampling"));
    RETURN_IF_ERROR(validateSamplerState(lim, step, s, state_slots).withContext(who));
    total += s.num_tokens;
    rows += s.logits == LogitsMode::kAll ? s.num_tokens
                                         : (s.logits == LogitsMode::kLast || s.sample ? 1 : 0);
  }
  if (total > lim.max_batch_tokens) {
    return invalidArgument("step has " + std::to_string(total) +
                           " tokens, more than max_batch_tokens " +
                           std::to_string(lim.max_batch_tokens));
  }
  int64_t longest_table = 0;
  for (const LlmStepSeq& s : step.seqs) {
    longest_table = std::max(
        longest_table, kvBlocksFor(static_cast<int64_t>(s.position) + s.num_tokens, block_size));
  }
  if (n_seq * longest_table > lim.table_capacity) {
    return invalidArgument(
        "step's block tables (" + std::to_string(n_seq) + " x " + std::to_string(longest_table) +
        " blocks) exceed the model's table capacity " + std::to_string(lim.table_capacity) +
        " (blocks smaller than min_block_size)");
  }
  if (rows > lim.max_logits_rows) {
    return invalidArgument("step asks for " + std::to_string(rows) +
                           " logits rows, more than max_logits_rows " +
                           std::to_string(lim.max_logits_rows));
  }
  return okStatus();
}

Result<int64_t> GptOssModel::prewarmGemms() {
  if (layers_.empty()) return int64_t{0};
  // Every layer's projections have layer 0's shapes; the tuning is per shape, not per weight.
  const Layer& L = layers_[0];
  // The QKV / O-proj outputs [TAG_ATTN_F16] (f32 with proj_f32 [TAG_PROJ_F32]).
  const DType qkv_out = opts_.qkvF32() ? DType::kF32 : attn_dtype_;
  const DType o_out = opts_.oF32() ? DType::kF32 : attn_dtype_;
  int64_t runs = 0;
  ASSIGN_OR_RETURN(int64_t r, backend_.prewarmLinear(L.qkv.view, L.qkv_bias.view, qkv_out,
                                                     opts_.max_batch_tokens));
  runs += r;
  ASSIGN_OR_RETURN(r, backend_.prewarmLinear(L.o.view, L.o_bias.view, o_out, opts_.max_batch_tokens));
  runs += r;
  if (!route_f32_) {
    ASSIGN_OR_RETURN(r, backend_.prewarmLinear(L.router.view, Tensor(), DType::kF32,
                                               opts_.max_batch_tokens));
    runs += r;
  }
  ASSIGN_OR_RETURN(r, backend_.prewarmLinear(lm_head_.view, Tensor(), DType::kF32,
                                             std::max<int64_t>(opts_.max_logits_rows, 1)));
  return runs + r;
}

void GptOssModel::enqueueStep(const LlmStep& step, PagedKvCache& kv, float* logits_out,
                              int32_t* sampled_out, llm::LlmTokenLogprobs* logprobs_out) {
  Backend& b = backend_;
  const ModelConfig& c = config_.base;
  const int32_t n_seq = static_cast<int32_t>(step.seqs.size());
  const int32_t bs = kv.shape().block_size;

  // ---- host plan ----
  int64_t t_total = 0;
  int32_t maxb = 1, max_ctx = 1;
  bool decode_only = graphs_ != nullptr;  // every sequence: one new token, sampled, no logits
  for (const LlmStepSeq& s : step.seqs) {
    t_total += s.num_tokens;
    maxb = std::max(maxb, static_cast<int32_t>(kvBlocksFor(s.position + s.num_tokens, bs)));
    max_ctx = std::max(max_ctx, s.position + s.num_tokens);
    // ... with plain sampling (the staged graph sampler has no state, logprobs or min_p).
    const SamplingParams& sp = s.sampling;
    const bool extras = sp.state_slot >= 0 || sp.logprobs >= 0 || sp.min_p > 0.f ||
                        llm::needsPenaltyState(sp) || s.state_offset >= 0;
    decode_only = decode_only && s.num_tokens == 1 && s.sample && s.logits == LogitsMode::kNone &&
                  !extras;
  }
  CHECK(n_seq > 0 && t_total > 0 && t_total <= opts_.max_batch_tokens && n_seq <= opts_.max_seqs);
  CHECK(static_cast<int64_t>(n_seq) * maxb <= table_capacity_);
  // CUDA-graph decode: pad to a power of two sequences (padding rows: token 0 at position 0, no
  // K/V write, outside the attention plan, sampled greedily and dropped) and the block tables to
  // a power-of-two stride, so the captured launches depend on the bucket only.
  int32_t n_pad = n_seq;
  if (decode_only) {
    n_pad = static_cast<int32_t>(graphSeqsBucket(static_cast<uint32_t>(n_seq)));
    const int64_t cap = std::min<int64_t>({kMaxGraphSeqs, opts_.max_seqs, opts_.max_batch_tokens,
                                           opts_.max_logits_rows});
    int32_t maxb_pad = 16;
    while (maxb_pad < maxb) maxb_pad *= 2;
    const int32_t table_max = static_cast<int32_t>(kvBlocksFor(max_model_len_, bs));
    maxb_pad = std::max(maxb, std::min(maxb_pad, table_max));
    if (n_pad <= cap && static_cast<int64_t>(n_pad) * maxb_pad <= table_capacity_) {
      maxb = maxb_pad;
    } else {
      decode_only = false;
      n_pad = n_seq;
    }
  }
  const int64_t t = decode_only ? n_pad : t_total;
  // [TAG_KV_WINDOW_GROUP] Sliding layers through the window tables (validate() checked them).
  const bool wpool = kv.shape().num_blocks_window > 0;
  CHECK(!wpool || slots_w_.view.data != nullptr);
  h_positions_.assign(static_cast<size_t>(t), 0);
  h_slots_.assign(static_cast<size_t>(t), -1);
  h_slots_w_.assign(wpool ? static_cast<size_t>(t) : 0, -1);
  h_tables_w_.assign(wpool ? static_cast<size_t>(n_pad) * static_cast<size_t>(maxb) : 0, -1);
  h_cu_.assign(static_cast<size_t>(n_pad) + 1, 0);
  h_tables_.assign(static_cast<size_t>(n_pad) * static_cast<size_t>(maxb), -1);
  h_rows_.clear();
  h_samples_.clear();
  h_prev_pairs_.clear();
  std::vector<int32_t>& ids = h_ids_;
  std::vector<int32_t>& last_row = h_last_row_;
  ids.assign(static_cast<size_t>(t), 0);
  last_row.assign(static_cast<size_t>(n_seq), 0);
  int32_t row = 0;
  for (int32_t si = 0; si < n_seq; ++si) {
    const LlmStepSeq& s = step.seqs[static_cast<size_t>(si)];
    const auto table = step.block_ids.subspan(static_cast<size_t>(s.block_offset),
                                              static_cast<size_t>(s.num_blocks));
    const int32_t needed = static_cast<int32_t>(kvBlocksFor(s.position + s.num_tokens, bs));
    for (int32_t bi = 0; bi < needed; ++bi) {
      h_tables_[static_cast<size_t>(si) * maxb + bi] = table[static_cast<size_t>(bi)];
    }
    std::span<const int32_t> wtable;
    if (wpool) {
      wtable = step.block_ids.subspan(static_cast<size_t>(s.block_offset + s.num_blocks),
                                      static_cast<size_t>(s.num_blocks));
      for (int32_t bi = 0; bi < needed; ++bi) {
        h_tables_w_[static_cast<size_t>(si) * maxb + bi] = wtable[static_cast<size_t>(bi)];
      }
    }
    if (s.prev_row >= 0) {
      h_prev_pairs_.push_back(row);
      h_prev_pairs_.push_back(s.prev_row);
    }
    for (int32_t j = 0; j < s.num_tokens; ++j) {
      const size_t r = static_cast<size_t>(row + j);
      ids[r] = step.tokens[static_cast<size_t>(s.token_offset + j)];
      if (j == 0 && s.prev_row >= 0) ids[r] = 0;  // replaced on the device by copyTokens
      h_positions_[r] = s.position + j;
      h_slots_[r] = static_cast<int32_t>(kvSlot(table, s.position + j, bs));
      if (wpool) h_slots_w_[r] = static_cast<int32_t>(kvSlot(wtable, s.position + j, bs));
    }
    if (s.logits == LogitsMode::kAll) {
      for (int32_t j = 0; j < s.num_tokens; ++j) h_rows_.push_back(row + j);
    } else if (s.logits == LogitsMode::kLast) {
      h_rows_.push_back(row + s.num_tokens - 1);
    }
    last_row[static_cast<size_t>(si)] = row + s.num_tokens - 1;
    row += s.num_tokens;
    h_cu_[static_cast<size_t>(si) + 1] = row;
  }
  for (int32_t si = n_seq; si < n_pad; ++si) h_cu_[static_cast<size_t>(si) + 1] = si + 1;
  const int64_t n_out_rows = static_cast<int64_t>(h_rows_.size());
  // Sampling rows: the last-token row where it is already computed, else an extra row.
  for (int32_t si = 0; si < n_seq; ++si) {
    const LlmStepSeq& s = step.seqs[static_cast<size_t>(si)];
    if (!s.sample) continue;
    int32_t r = -1;
    for (int64_t k = 0; k < n_out_rows; ++k) {
      if (h_rows_[static_cast<size_t>(k)] == last_row[static_cast<size_t>(si)])
        r = static_cast<int32_t>(k);
    }
    if (r < 0) {
      r = static_cast<int32_t>(h_rows_.size());
      h_rows_.push_back(last_row[static_cast<size_t>(si)]);
    }
    SampleRow sr;
    sr.row = r;
    sr.counter = static_cast<uint64_t>(s.position) + static_cast<uint64_t>(s.num_tokens);
    sr.params = s.sampling;
    if (s.mask_index > 0) {  // [TAG_TOKEN_MASK]
      const size_t k = static_cast<size_t>(s.mask_index - 1);
      CHECK((k + 1) * static_cast<size_t>(step.mask_words) <= step.masks.size());
      sr.mask = step.masks.data() + k * static_cast<size_t>(step.mask_words);
    }
    h_samples_.push_back(sr);
  }
  const size_t n_samples = h_samples_.size();
  for (int32_t si = n_seq; si < n_pad; ++si) {  // graph padding: greedy rows, never read
    SampleRow sr;
    sr.row = static_cast<int32_t>(h_rows_.size());
    h_rows_.push_back(si);
    h_samples_.push_back(sr);
  }
  const int64_t n_rows = static_cast<int64_t>(h_rows_.size());
  CHECK(n_rows <= opts_.max_logits_rows);
  // [TAG_LLM_SAMPLER_STATE] Reloads first: this step's draws read them.
  samplerStateResets(step, h_resets_, h_bias_);
  if (!h_resets_.empty()) ops_.resetSamplerState(h_resets_);
  bool want_lp = false;
  for (const SampleRow& r : h_samples_) want_lp = want_lp || r.params.logprobs >= 0;
  const int64_t lp_bytes =
      want_lp ? static_cast<int64_t>(n_samples * sizeof(llm::LlmTokenLogprobs)) : 0;
  const Tensor lps = want_lp ? sampled_lp_.view.rowSlice(0, lp_bytes) : Tensor();

  const Tensor ids_t = ids_.view.rowSlice(0, t);
  const Tensor pos = positions_.view.rowSlice(0, t);
  const Tensor slots = slots_.view.rowSlice(0, t);
  const Tensor cu = cu_q_.view.rowSlice(0, n_pad + 1);
  // block_tables: a [S, maxb] view at the front of its buffer.
  const Tensor tables(block_tables_.view.data, DType::kI32, {n_pad, maxb});
  b.copyToDevice(ids_t, ids.data(), sizeof(int32_t) * static_cast<size_t>(t));
  b.copyToDevice(pos, h_positions_.data(), sizeof(int32_t) * static_cast<size_t>(t));
  b.copyToDevice(slots, h_slots_.data(), sizeof(int32_t) * static_cast<size_t>(t));
  b.copyToDevice(cu, h_cu_.data(), sizeof(int32_t) * static_cast<size_t>(n_pad + 1));
  b.copyToDevice(tables, h_tables_.data(), sizeof(int32_t) * h_tables_.size());
  const Tensor slots_w = wpool ? slots_w_.view.rowSlice(0, t) : Tensor();
  const Tensor tables_w =
      wpool ? Tensor(block_tables_w_.view.data, DType::kI32, {n_pad, maxb}) : Tensor();
  if (wpool) {
    b.copyToDevice(slots_w, h_slots_w_.data(), sizeof(int32_t) * static_cast<size_t>(t));
    b.copyToDevice(tables_w, h_tables_w_.data(), sizeof(int32_t) * h_tables_w_.size());
  }
  if (!h_prev_pairs_.empty()) {  // [TAG_LLM_PREV_TOKEN]: before sampled_ is overwritten below
    const int64_t np = static_cast<int64_t>(h_prev_pairs_.size() / 2);
    const Tensor pairs(prev_pairs_.view.data, DType::kI32, {np, 2});
    b.copyToDevice(pairs, h_prev_pairs_.data(), sizeof(int32_t) * h_prev_pairs_.size());
    ops_.copyTokens(sampled_.view.rowSlice(0, last_sampled_), pairs, ids_t);
  }
  last_sampled_ = static_cast<int64_t>(n_samples);

  // ---- per-step device inputs the forward reads: attention plan, logits rows, sampling ----
  const int64_t h = c.hidden_size;
  RopeKvParams rope;
  rope.num_q_heads = static_cast<int32_t>(c.num_attention_heads);
  rope.num_kv_heads = static_cast<int32_t>(c.num_key_value_heads);
  rope.head_dim = static_cast<int32_t>(c.head_dim);
  rope.rotary_dim = rope.head_dim;
  h_windows_.clear();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int32_t w = config_.sliding[l] ? static_cast<int32_t>(c.sliding_window) : 0;
    if (std::find(h_windows_.begin(), h_windows_.end(), w) == h_windows_.end()) {
      h_windows_.push_back(w);
    }
  }
  AttentionPlanInput plan;  // the real sequences only
  plan.cu_q = std::span<const int32_t>(h_cu_.data(), static_cast<size_t>(n_seq) + 1);
  plan.positions = std::span<const int32_t>(h_positions_.data(), static_cast<size_t>(t_total));
  plan.windows = h_windows_;
  plan.num_q_heads = rope.num_q_heads;
  plan.num_kv_heads = rope.num_kv_heads;
  plan.head_dim = rope.head_dim;
  ops_.planAttention(plan);
  const Tensor rows = rows_.view.rowSlice(0, n_rows);
  if (n_rows > 0) {
    b.copyToDevice(rows, h_rows_.data(), sizeof(int32_t) * static_cast<size_t>(n_rows));
  }
  const Tensor sampled = sampled_.view.rowSlice(0, static_cast<int64_t>(h_samples_.size()));
  // [TAG_LATE_MASKS] Masks that come late: the forward pass (the graph body on decode) stops at
  // the logits; the masks are awaited and the rows staged and sampled after it.
  const bool late = static_cast<bool>(step.await_masks) && n_samples > 0;
  if (decode_only && !late) ops_.stageSample(h_samples_);
  auto sample_rows = [&] {
    const Tensor logits = logits_.view.rowSlice(0, n_rows);
    if (decode_only) {
      ops_.sampleStaged(logits, static_cast<int32_t>(h_samples_.size()), sampled);
    } else if (!h_samples_.empty()) {
      ops_.sample(logits, h_samples_, sampled, lps);
    }
  };

  PagedAttentionParams ap;
  ap.num_seqs = n_pad;
  ap.num_q_heads = rope.num_q_heads;
  ap.num_kv_heads = rope.num_kv_heads;
  ap.head_dim = rope.head_dim;
  ap.block_size = bs;
  ap.max_blocks_per_seq = maxb;
  ap.max_context = max_ctx;
  ap.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  ap.graph_seqs = decode_only ? n_pad : 0;
  MoeExpertsParams mp;
  mp.num_experts = static_cast<int32_t>(c.num_local_experts);
  mp.top_k = static_cast<int32_t>(c.num_experts_per_tok);
  mp.hidden = static_cast<int32_t>(h);
  mp.intermediate = static_cast<int32_t>(c.intermediate_size);
  mp.swiglu_limit = config_.swiglu_limit;
  mp.swiglu_alpha = config_.swiglu_alpha;
  // [TAG_MOE_LT_BF16] Large prefill chunks as MoE calls of their own (moe_chunk_runs.h) where the
  // ops ask for it; decode steps (graph-captured) never have one.
  const int64_t chunk_rows = decode_only ? 0 : ops_.moeChunkMinRowsPerExpert();
  if (chunk_rows > 0 && ops_.moeWholeStep()) {  // [TAG_MOE_PREFILL_AUTO]
    moeWholeStepRun(t, h_cu_[static_cast<size_t>(n_seq)], mp.top_k, mp.num_experts, chunk_rows,
                    moe_runs_);
  } else {
    moeChunkRuns(std::span<const int32_t>(h_cu_.data(), static_cast<size_t>(n_seq) + 1), t,
                 mp.top_k, mp.num_experts, chunk_rows, moe_runs_);
  }
  if (moe_runs_.empty()) moe_runs_.push_back(MoeRun{0, t, false});  // one call for the step
  // [TAG_COMBINE_NORM] The combine left to the next norm (the next layer's input norm, or the
  // final one), which then reads the experts' rows instead of `moe`: one MoE call per layer only.
  // profile_skip: op groups left out (a benchmark's profile; wrong results).
  const uint32_t skip = opts_.profile_skip;
  auto keep = [skip](uint32_t group) { return (skip & group) == 0; };
  const bool fuse_cn = opts_.fuse_combine_norm && ops_.supportsCombineNorm() &&
                       moe_runs_.size() <= 1 && keep(GptOssOptions::kSkipMoe);
  mp.defer_combine = fuse_cn;
  auto combineNorm = [&](const Tensor& moe_out, const Tensor& res, const Tensor& w, const Tensor& out,
                         const RmsNormParams& np) {
    if (!keep(GptOssOptions::kSkipNorm)) return;
    if (fuse_cn) {
      ops_.combineRmsNorm(res, w, out, np);
    } else {
      b.rmsNorm(moe_out, res, w, out, np);
    }
  };

  // ---- forward (a CUDA-graph body on the decode path: kernels only, every host value above
  // depends on the bucket alone) ----
  auto forward = [&] {
    const Tensor res = residual_.view.rowSlice(0, t);
    const Tensor x = x_.view.rowSlice(0, t);
    // The attention block's input and O-proj output: x, or its fp16 twin [TAG_ATTN_F16].
    const Tensor xa = opts_.attn_f16 ? xa_.view.rowSlice(0, t) : x;
    const Tensor xm = opts_.moe_f16 ? xm_.view.rowSlice(0, t) : x;  // the MoE side's input
    const Tensor xf = opts_.head_f16 ? xf_.view.rowSlice(0, t) : x;  // lm_head's input
    const Tensor moe = moe_out_.view.rowSlice(0, t);
    const Tensor qkv = qkv_buf_.view.rowSlice(0, t);
    // [TAG_PROJ_F32] QKV's f32 output, then O-proj's, in one buffer (each read before the next).
    const Tensor qkv32 =
        opts_.qkvF32() ? Tensor(proj32_.view.data, DType::kF32, {t, qkv.cols()}) : Tensor();
    const Tensor o32 =
        opts_.oF32() ? Tensor(proj32_.view.data, DType::kF32, {t, x.cols()}) : Tensor();
    const Tensor attn = attn_.view.rowSlice(0, t);
    const Tensor rl = router_logits_.view.rowSlice(0, t);
    const Tensor tk_ids = topk_ids_.view.rowSlice(0, t);
    const Tensor tk_w = topk_w_.view.rowSlice(0, t);
    RmsNormParams norm{static_cast<float>(c.rms_norm_eps)};
    norm.round_normalized = !opts_.norm_round_once;
    norm.programmatic_in_graphs = true;  // [TAG_PDL_GRAPH]
    // A stream wider than the activations starts from the embedding rows in x (res = x).
    const bool wide_res = res.dtype != x.dtype;
    b.embedding(embed_.view, ids_t, wide_res ? x : res);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& L = layers_[l];
      if (l == 0 && wide_res) {
        RmsNormParams init = norm;
        init.residual_init = true;
        b.rmsNorm(x, res, L.input_norm.view, xa, init);
      } else if (l == 0) {
        b.rmsNorm(res, Tensor(), L.input_norm.view, xa, norm);
      } else {
        combineNorm(moe, res, L.input_norm.view, xa, norm);  // res += moe out; xa = norm(res)
      }
      const int32_t li = static_cast<int32_t>(l);
      const bool in_window_pool = kv.shape().windowLayer(li);  // [TAG_KV_WINDOW_GROUP]
      // [TAG_PROJ_F32] With f32 projections, q/k/v are rounded once, after RoPE, into qkv.
      if (keep(GptOssOptions::kSkipQkv))
        b.linear(xa, L.qkv.view, L.qkv_bias.view, opts_.qkvF32() ? qkv32 : qkv);
      const Tensor& layer_slots = in_window_pool ? slots_w : slots;
      if (!keep(GptOssOptions::kSkipRope)) {
        // left out (profile)
      } else if (opts_.qkvF32()) {
        ops_.ropeKvWriteF32In(qkv32, qkv, pos, rope_cos_.view, rope_sin_.view, layer_slots,
                              kv.keys(li), kv.values(li), rope);
      } else {
        ops_.ropeKvWrite(qkv, pos, rope_cos_.view, rope_sin_.view, layer_slots, kv.keys(li),
                         kv.values(li), rope);
      }
      PagedAttentionParams lp = ap;
      lp.sliding_window = config_.sliding[l] ? static_cast<int32_t>(c.sliding_window) : 0;
      if (keep(GptOssOptions::kSkipAttn))
        ops_.pagedAttention(qkv, kv.keys(li), kv.values(li), cu, pos,
                            in_window_pool ? tables_w : tables, L.sinks.view, attn, lp);
      // res += attn out; xm = norm(res). The O-proj output in f32 with proj_f32.
      const Tensor ao = opts_.oF32() ? o32 : xa;
      if (keep(GptOssOptions::kSkipOproj)) b.linear(attn, L.o.view, L.o_bias.view, ao);
      if (keep(GptOssOptions::kSkipNorm)) b.rmsNorm(ao, res, L.post_norm.view, xm, norm);
      if (!keep(GptOssOptions::kSkipRouter)) {
        // left out (profile)
      } else if (route_f32_) {  // [TAG_ROUTER_F32]: from the f32 stream, the norm folded in
        ops_.moeRouteF32(res, L.router_f32t.view, L.router_bias.view, tk_ids, tk_w,
                         MoeRouteParams{mp.top_k, norm.eps});
      } else {
        b.linear(xm, L.router.view, Tensor(), rl);  // f32 logits; the bias joins in moeRoute
        ops_.moeRoute(rl, L.router_bias.view, tk_ids, tk_w, MoeRouteParams{mp.top_k});
      }
      for (const MoeRun& run : moe_runs_) {
        if (!keep(GptOssOptions::kSkipMoe)) break;
        MoeExpertsParams rp = mp;
        rp.lt = chunk_rows <= 0 ? MoeLtChoice::kBySize
                : run.large     ? MoeLtChoice::kTake
                                : MoeLtChoice::kSkip;
        const int64_t n = run.end - run.begin;
        ops_.moeExperts(xm.rowSlice(run.begin, n), tk_ids.rowSlice(run.begin, n),
                        tk_w.rowSlice(run.begin, n), L.w1, L.b1.view, L.w2, L.b2.view,
                        moe.rowSlice(run.begin, n), rp);
      }
      b.markProgress();  // [TAG_STEP_PROGRESS]
    }
    combineNorm(moe, res, final_norm_.view, xf, norm);
    if (n_rows == 0 || !keep(GptOssOptions::kSkipHead)) return;
    const Tensor gathered = gathered_.view.rowSlice(0, n_rows);
    const Tensor logits = logits_.view.rowSlice(0, n_rows);
    ops_.gatherRows(xf, rows, gathered);
    b.linear(gathered, lm_head_.view, Tensor(), logits);
    if (!late) sample_rows();
  };
  if (decode_only) {
    GraphShapeKey key;
    key.kind = late ? 0x474F4432u : 0x474F4431u;  // "GOD2" / "GOD1": decode without / with sampling
    key.seqs = static_cast<uint32_t>(n_pad);
    key.tokens = static_cast<uint32_t>(n_pad);
    // The window pool's tables are inputs of their own [TAG_KV_WINDOW_GROUP].
    key.variant = static_cast<uint64_t>(maxb) | (wpool ? uint64_t{1} << 32 : 0);
    const Status st = graphs_->run(key, forward);
    CHECK(st.isOk());
    ++graph_steps_;
  } else {
    forward();
  }
  if (late) {
    // The host waits here while the device runs the forward pass (CUDA: it was only enqueued).
    if (!step.await_masks()) {
      // Never came (tulip gave up on the step or is gone): draw unconstrained; tulip learns it
      // from its failed publish and discards these draws.
      for (SampleRow& r : h_samples_) r.mask = nullptr;
    }
    if (decode_only) ops_.stageSample(h_samples_);
    sample_rows();
  }
  if (n_out_rows > 0) {
    CHECK(logits_out != nullptr);
    b.copyToHost(logits_out, logits_.view.rowSlice(0, n_out_rows),
                 static_cast<size_t>(n_out_rows * c.vocab_size) * sizeof(float));
  }
  if (n_samples > 0) {
    CHECK(sampled_out != nullptr);
    b.copyToHost(sampled_out, sampled, sizeof(int32_t) * n_samples);
    if (want_lp) {
      CHECK(logprobs_out != nullptr);
      b.copyToHost(logprobs_out, lps, static_cast<size_t>(lp_bytes));
    }
  }
}

}  // namespace garden::rose
