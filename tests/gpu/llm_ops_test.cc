// The CUDA LLM ops (services/rose/ops/cuda/llm_ops_cuda.h: gpt-oss's RoPE + paged K/V write,
// paged attention with sinks and sliding windows incl. split-KV, router top-k, MXFP4 and bf16
// grouped expert GEMMs, gather, token copy, sampling) against the CPU fp32 reference ops on fresh
// random inputs (bf16-representable, never zeros), GPU outputs poisoned with NaN first, many shapes
// (batch 1, odd lengths, window and block edges, long contexts). Plus the properties the engine
// relies on: a row's result does not depend on the batch (bit for bit), MXFP4-resident and bf16
// experts give the same bits, sampling is deterministic per (seed, counter) and draws from the
// CPU sampler's distribution. Label `gpu`: needs a CUDA device (fails, never skips, without one).

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "services/rose/model/mxfp4.h"
#include "services/rose/model/rope.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/ops/cuda/cuda_backend.h"
#include "services/rose/ops/cuda/moe_gemm.cuh"
#include "services/rose/ops/cuda/moe_permute.cuh"
#include "services/rose/ops/cuda/moe_router_f32.cuh"
#include "services/rose/ops/router_split.h"
#include "services/rose/ops/cuda/paged_attention.cuh"
#include "services/rose/ops/cuda/paged_attention_sm90.cuh"
#include "services/rose/ops/paged_kv_cache.h"
#include "services/rose/ops/sampler.h"
#include "tests/gpu/gpu_test_util.h"

namespace garden::rose::gputest {
namespace {

// Relative L2 error ‖got − ref‖ / ‖ref‖ (NaN when got has a non-finite value).
double relErr(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return NAN;
    num += (got[i] - ref[i]) * static_cast<double>(got[i] - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

class GpuLlmOps : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = makeBackends();
    ASSERT_TRUE(be_.cpu && be_.gpu);
    auto c = makeLlmOps(*be_.cpu, 4);
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    auto g = makeLlmOps(*be_.gpu);
    ASSERT_TRUE(g.isOk()) << g.status().toString();
    cops_ = std::move(c).value();
    gops_ = std::move(g).value();
    rng_.seed(::testing::UnitTest::GetInstance()->random_seed() + 777);
  }
  // wt [h, e] = router (bf16, [e, h]) x norm weight (bf16, [h]) transposed, as the model folds
  // them [TAG_ROUTER_F32]: exact in f32.
  std::vector<float> foldedRouterWeights(int64_t h, int64_t e) {
    auto router = randomBf16(static_cast<size_t>(e * h), rng_, -0.05f, 0.05f);
    auto gamma = randomBf16(static_cast<size_t>(h), rng_, 0.5f, 1.5f);
    std::vector<float> wt(static_cast<size_t>(h * e));
    for (int64_t x = 0; x < e; ++x)
      for (int64_t k = 0; k < h; ++k)
        wt[static_cast<size_t>(k * e + x)] =
            router[static_cast<size_t>(x * h + k)] * gamma[static_cast<size_t>(k)];
    return wt;
  }
  // wt F32 [h, e] as the tensor-core router's BF16 split [2, Ep, Hp] [TAG_ROUTER_MMA].
  OwnedTensor uploadRouterSplit(const std::vector<float>& wt, int64_t h, int64_t e) {
    const std::vector<uint16_t> s = routerSplitWeights(wt.data(), h, e);
    std::vector<float> f(s.size());
    for (size_t i = 0; i < s.size(); ++i) f[i] = bf16ToF32(s[i]);  // bf16 values: exact
    return upload(gpu(), DType::kBF16, {2, routerSplitPaddedE(e), routerSplitPaddedH(h)}, f);
  }
  // Sizes the GPU ops' workspaces for steps up to these limits.
  void reserve(int64_t tokens, int32_t seqs, int32_t hq, int32_t hkv, int32_t hidden = 64,
               int32_t inter = 64, int32_t experts = 4, int32_t top_k = 2, int64_t rows = 64) {
    LlmOpsLimits l;
    l.max_tokens = tokens;
    l.max_seqs = seqs;
    l.max_logits_rows = rows;
    l.max_model_len = 131072;
    l.vocab = 201088;
    l.hidden = hidden;
    l.intermediate = inter;
    l.num_experts = experts;
    l.top_k = top_k;
    l.num_q_heads = hq;
    l.num_kv_heads = hkv;
    l.head_dim = 64;
    Status s = gops_->reserve(l);
    ASSERT_TRUE(s.isOk()) << s.toString();
  }
  Backend& cpu() { return *be_.cpu; }
  Backend& gpu() { return *be_.gpu; }

  // Top-k routing of t tokens over e experts: k distinct experts per token (a shuffle each), the
  // weight of each choice from `weight()`, drawn right after its expert.
  template <typename Weight>
  void randomRouting(int64_t t, int64_t e, int32_t k, Weight&& weight, std::vector<int32_t>& ids,
                     std::vector<float>& wts) {
    for (int64_t i = 0; i < t; ++i) {
      std::vector<int32_t> perm(static_cast<size_t>(e));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng_);
      for (int32_t j = 0; j < k; ++j) {
        ids.push_back(perm[static_cast<size_t>(j)]);
        wts.push_back(weight());
      }
    }
  }

  // Random MXFP4 experts (codes uniform, scales around 1 / sqrt(in)) uploaded twice: resident
  // MXFP4 (mx1, mx2) and the same values dequantized as bf16 dense experts (dense), plus random
  // bf16 biases — for the tests that compare the MoE kernels with each other bit for bit.
  struct RandomExperts {
    ExpertWeights mx1, mx2;
    OwnedTensor gw1, gw2;  // own the dense views' memory
    DenseExperts dense;
    OwnedTensor b1, b2;
  };
  RandomExperts randomExperts(int64_t e, int64_t h, int64_t inter) {
    std::uniform_int_distribution<int> byte(0, 255);
    auto mx = [&](int64_t out, int64_t in, std::vector<uint8_t>& codes, std::vector<uint8_t>& sc) {
      codes.resize(static_cast<size_t>(e * out * in / 2));
      sc.resize(static_cast<size_t>(e * out * in / 32));
      for (auto& b : codes) b = static_cast<uint8_t>(byte(rng_));
      const int base = 127 + static_cast<int>(std::lround(std::log2(1.0 / (std::sqrt(double(in)) * 2.93))));
      for (auto& v : sc) v = static_cast<uint8_t>(base + byte(rng_) % 3 - 1);
    };
    std::vector<uint8_t> c1, s1, c2, s2;
    mx(2 * inter, h, c1, s1);
    mx(h, inter, c2, s2);
    std::vector<float> w1(static_cast<size_t>(e * 2 * inter * h)), w2(static_cast<size_t>(e * h * inter));
    dequantizeMxfp4(c1.data(), s1.data(), e * 2 * inter, h / 32, w1.data());
    dequantizeMxfp4(c2.data(), s2.data(), e * h, inter / 32, w2.data());
    auto m1 = gops_->uploadMxfp4Experts(c1.data(), s1.data(), e, 2 * inter, h);
    auto m2 = gops_->uploadMxfp4Experts(c2.data(), s2.data(), e, h, inter);
    EXPECT_TRUE(m1.isOk() && m2.isOk());
    RandomExperts r{std::move(m1).value(), std::move(m2).value(),
                    upload(gpu(), DType::kBF16, {e, 2 * inter, h}, w1),
                    upload(gpu(), DType::kBF16, {e, h, inter}, w2), {}, {}, {}};
    r.dense = denseExperts(r.gw1.view, r.gw2.view, e, inter, h);
    r.b1 = upload(gpu(), DType::kBF16, {e, 2 * inter},
                  randomBf16(static_cast<size_t>(e * 2 * inter), rng_, -0.1f, 0.1f));
    r.b2 = upload(gpu(), DType::kBF16, {e, h}, randomBf16(static_cast<size_t>(e * h), rng_, -0.1f, 0.1f));
    return r;
  }

  // The MoE op over the first t tokens of the host rows x [>= t, hidden] with their ids / weights
  // [>= t, top_k], through ex's MXFP4 (mxfp4) or dense experts; the output poisoned first.
  std::vector<float> runExperts(const RandomExperts& ex, const MoeExpertsParams& p, int64_t t,
                                const std::vector<float>& x, const std::vector<int32_t>& ids,
                                const std::vector<float>& wts, bool mxfp4) {
    const int64_t h = p.hidden, k = p.top_k;
    auto gx = upload(gpu(), DType::kBF16, {t, h}, std::vector<float>(x.begin(), x.begin() + t * h));
    auto gid = uploadI32(gpu(), {t, k}, std::vector<int32_t>(ids.begin(), ids.begin() + t * k));
    auto gwt = upload(gpu(), DType::kF32, {t, k}, std::vector<float>(wts.begin(), wts.begin() + t * k));
    auto gout = allocate(gpu(), DType::kBF16, {t, h});
    poison(gpu(), gout.view);
    if (mxfp4) {
      gops_->moeExperts(gx.view, gid.view, gwt.view, ex.mx1, ex.b1.view, ex.mx2, ex.b2.view,
                        gout.view, p);
    } else {
      gops_->moeExperts(gx.view, gid.view, gwt.view, ex.dense.w1, ex.b1.view, ex.dense.w2,
                        ex.b2.view, gout.view, p);
    }
    return download(gpu(), gout.view);
  }

  Backends be_;
  std::unique_ptr<LlmOps> cops_, gops_;
  std::mt19937 rng_;
};

// ---- RoPE + K/V write -------------------------------------------------------------------------

TEST_F(GpuLlmOps, RopeKvWriteMatchesCpu) {
  const int64_t d = 64, max_pos = 8192;
  RopeScaling yarn;
  yarn.type = "yarn";
  yarn.factor = 32;
  yarn.beta_fast = 32;
  yarn.beta_slow = 1;
  yarn.original_max_position_embeddings = 4096;
  yarn.truncate = false;
  struct Case {
    int64_t t;
    int32_t hq, hkv;
    int64_t rot = 64;
    bool f16 = false;
    bool f32_in = false;
  };
  // rotary_dim 64 (gpt-oss) and 48 take the 16-byte kernel [TAG_ROPE_KV_VEC] (48: two pass-through
  // chunks per head), 36 the warp-per-head one (18 pairs: not a multiple of 8). f16: qkv and the
  // caches in IEEE fp16 [TAG_ATTN_F16], both kernels. f32_in: the unrotated q/k/v read from an
  // f32 tensor (ropeKvWriteF32In [TAG_PROJ_F32]) of values no 16-bit type holds exactly.
  for (Case c :
       {Case{1, 64, 8}, Case{7, 64, 8}, Case{133, 64, 8}, Case{1000, 4, 2}, Case{33, 8, 8},
        Case{133, 64, 8, 48}, Case{33, 8, 8, 36}, Case{1000, 4, 2, 36}, Case{133, 64, 8, 64, true},
        Case{1000, 4, 2, 36, true}, Case{1, 64, 8, 64, true}, Case{133, 64, 8, 64, true, true},
        Case{1, 64, 8, 64, true, true}, Case{33, 8, 8, 48, true, true},
        Case{1000, 4, 2, 36, true, true}, Case{7, 64, 8, 64, false, true}}) {
    SCOPED_TRACE("T=" + std::to_string(c.t) + " Hq=" + std::to_string(c.hq) + " rotary=" +
                 std::to_string(c.rot) + (c.f16 ? " f16" : "") + (c.f32_in ? " f32 in" : ""));
    const DType gdt = c.f16 ? DType::kF16 : gpu().activationDType();
    auto freqs = computeRopeFrequencies(c.rot, 150000, yarn, 131072);
    ASSERT_TRUE(freqs.isOk()) << freqs.status().toString();
    std::vector<float> cosv(static_cast<size_t>(max_pos * c.rot / 2)), sinv(cosv.size());
    buildRopeTables(*freqs, max_pos, cosv.data(), sinv.data());
    auto ccos = upload(cpu(), DType::kF32, {max_pos, c.rot / 2}, cosv);
    auto csin = upload(cpu(), DType::kF32, {max_pos, c.rot / 2}, sinv);
    auto gcos = upload(gpu(), DType::kF32, {max_pos, c.rot / 2}, cosv);
    auto gsin = upload(gpu(), DType::kF32, {max_pos, c.rot / 2}, sinv);
    const int64_t width = (c.hq + 2 * c.hkv) * d;
    const int32_t num_blocks = static_cast<int32_t>((c.t + 15) / 16 + 7), bs = 16;
    auto qkv = randomBf16(static_cast<size_t>(c.t * width), rng_, -2.f, 2.f);
    if (c.f32_in) {
      std::uniform_real_distribution<float> u(-2.f, 2.f);
      for (float& v : qkv) v = u(rng_);
    }
    std::vector<int32_t> pos(static_cast<size_t>(c.t)), slots(static_cast<size_t>(num_blocks * bs));
    std::uniform_int_distribution<int32_t> pd(0, static_cast<int32_t>(max_pos - 1));
    for (auto& p : pos) p = pd(rng_);
    pos[0] = static_cast<int32_t>(max_pos - 1);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(static_cast<size_t>(c.t));
    KvCacheShape ks{1, num_blocks, bs, c.hkv, static_cast<int32_t>(d)};
    auto ckv = PagedKvCache::create(cpu(), ks, DType::kF32);
    auto gkv = PagedKvCache::create(gpu(), ks, gdt);
    ASSERT_TRUE(ckv.isOk() && gkv.isOk());
    // Fill both caches with the same random values so untouched slots compare too.
    auto fill = randomBf16(static_cast<size_t>(ks.elementsPerLayer()), rng_);
    for (auto* kv : {ckv->get(), gkv->get()}) {
      Backend& b = kv == ckv->get() ? cpu() : gpu();
      ASSERT_TRUE(b.uploadConvert(kv->keys(0), {fill.data(), DType::kF32, ks.elementsPerLayer()}).isOk());
      ASSERT_TRUE(b.uploadConvert(kv->values(0), {fill.data(), DType::kF32, ks.elementsPerLayer()}).isOk());
    }
    auto cq = upload(cpu(), DType::kF32, {c.t, width}, qkv);
    auto gq = upload(gpu(), gdt, {c.t, width}, qkv);
    auto gq32 = upload(gpu(), DType::kF32, {c.t, width}, qkv);
    if (c.f32_in) poison(gpu(), gq.view);  // every head must be written, v heads included
    auto cp = uploadI32(cpu(), {c.t}, pos);
    auto gp = uploadI32(gpu(), {c.t}, pos);
    auto cs = uploadI32(cpu(), {c.t}, slots);
    auto gs = uploadI32(gpu(), {c.t}, slots);
    const RopeKvParams rp{c.hq, c.hkv, static_cast<int32_t>(d), static_cast<int32_t>(c.rot)};
    cops_->ropeKvWrite(cq.view, cp.view, ccos.view, csin.view, cs.view, (*ckv)->keys(0),
                       (*ckv)->values(0), rp);
    if (c.f32_in) {
      gops_->ropeKvWriteF32In(gq32.view, gq.view, gp.view, gcos.view, gsin.view, gs.view,
                              (*gkv)->keys(0), (*gkv)->values(0), rp);
    } else {
      gops_->ropeKvWrite(gq.view, gp.view, gcos.view, gsin.view, gs.view, (*gkv)->keys(0),
                         (*gkv)->values(0), rp);
    }
    // bf16 output of an f32 rotation of values up to ~2.7: half an ulp of bf16 at 4 is 2^-7; of
    // fp16 2^-10 (the bf16 bound would pass a bf16 rounding: this one does not). f32 in: one
    // rounding of the f32 rotation, so within half an ulp (2^-10 = 9.8e-4 for |y| < 4, the f32
    // arithmetic's error far below it); input rounded first would add up to ~7e-4 more.
    double atol = c.f16 ? 2.2e-3 : 1.6e-2, rtol = c.f16 ? 5e-4 : 4e-3;
    if (c.f32_in) atol = c.f16 ? 1e-3 : 7.9e-3, rtol = 0;
    expectClose(download(gpu(), gq.view), download(cpu(), cq.view), atol, rtol, "qkv rotated");
    expectClose(download(gpu(), (*gkv)->keys(0)), download(cpu(), (*ckv)->keys(0)), atol, rtol,
                "k cache");
    // v: copied exactly from a 16-bit qkv; from f32 rounded once: up to half an ulp below 2
    // (fp16 2^-11, bf16 2^-8), exactly half at a tie, which rounds to even (H100 2026-12-05: 5 of
    // 65,536 bf16 values were such ties, 1.65234375 -> 1.65625, against a bound of 3.9e-3).
    const double vtol = c.f32_in ? (c.f16 ? 4.9e-4 : 3.91e-3) : 0;
    expectClose(download(gpu(), (*gkv)->values(0)), download(cpu(), (*ckv)->values(0)), vtol, 0,
                "v cache");
  }
}

// ---- paged attention ---------------------------------------------------------------------------

struct AttnCase {
  std::vector<int> fresh;    // new tokens per sequence
  std::vector<int> history;  // tokens already cached per sequence
  int window = 0;
  bool sinks = true;
  int32_t hq = 64, hkv = 8;
  int32_t block_size = 16;
  std::string name;
  // [TAG_PAGED_ATTN_SM90] chunks of >= sm90_min tokens take the Hopper kernel (0: none; 1: every
  // sequence, decode tokens too), pipelined or basic.
  int32_t sm90_min = 0;
  bool sm90_pipelined = true;
  int32_t sm90_stages = 2;
  int32_t sm90_consumers = 3;
  bool f16 = false;  // qkv, caches and out IEEE fp16 on the GPU [TAG_ATTN_F16]
  // [TAG_ATTN_DECODE_WARPS] single-token items on the four-warp path (1), the one-warp
  // two-stage path (0) or the default (-1).
  int decode_warps = -1;
};

struct AttnInputs {
  int64_t t = 0;
  int32_t maxb = 0;
  std::vector<float> qkv, cache_k, cache_v, sinks;
  std::vector<int32_t> cu, pos, tables;
  int32_t num_blocks = 0;
};

AttnInputs makeAttnInputs(const AttnCase& c, std::mt19937& rng) {
  AttnInputs in;
  const int s = static_cast<int>(c.fresh.size());
  std::vector<int32_t> need(static_cast<size_t>(s));
  int32_t total_blocks = 0;
  in.cu.push_back(0);
  for (int i = 0; i < s; ++i) {
    const int ctx = c.history[static_cast<size_t>(i)] + c.fresh[static_cast<size_t>(i)];
    need[static_cast<size_t>(i)] = (ctx + c.block_size - 1) / c.block_size;
    total_blocks += need[static_cast<size_t>(i)];
    in.maxb = std::max(in.maxb, need[static_cast<size_t>(i)]);
    in.cu.push_back(in.cu.back() + c.fresh[static_cast<size_t>(i)]);
    for (int j = 0; j < c.fresh[static_cast<size_t>(i)]; ++j)
      in.pos.push_back(c.history[static_cast<size_t>(i)] + j);
  }
  in.t = in.cu.back();
  in.num_blocks = total_blocks + 5;
  std::vector<int32_t> ids(static_cast<size_t>(in.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  in.tables.assign(static_cast<size_t>(s * in.maxb), -1);
  size_t next = 0;
  for (int i = 0; i < s; ++i) {
    for (int b = 0; b < need[static_cast<size_t>(i)]; ++b)
      in.tables[static_cast<size_t>(i * in.maxb + b)] = ids[next++];
  }
  const int64_t width = (c.hq + 2 * c.hkv) * 64;
  in.qkv = randomBf16(static_cast<size_t>(in.t * width), rng, -1.f, 1.f);
  const int64_t cache_elems = static_cast<int64_t>(in.num_blocks) * c.block_size * c.hkv * 64;
  in.cache_k = randomBf16(static_cast<size_t>(cache_elems), rng, -1.f, 1.f);
  in.cache_v = randomBf16(static_cast<size_t>(cache_elems), rng, -1.f, 1.f);
  in.sinks = randomBf16(static_cast<size_t>(c.hq), rng, -1.f, 3.f);
  return in;
}

class GpuPagedAttention : public GpuLlmOps,
                          public ::testing::WithParamInterface<AttnCase> {
 protected:
  // Runs one backend's attention; returns out [T, Hq*64] as float.
  std::vector<float> run(Backend& b, LlmOps& ops, const AttnCase& c, const AttnInputs& in) {
    const int64_t width = (c.hq + 2 * c.hkv) * 64;
    const DType act = c.f16 && b.activationDType() != DType::kF32 ? DType::kF16 : b.activationDType();
    KvCacheShape ks{1, in.num_blocks, c.block_size, c.hkv, 64};
    auto kv = PagedKvCache::create(b, ks, act);
    EXPECT_TRUE(kv.isOk());
    EXPECT_TRUE(b.uploadConvert((*kv)->keys(0), {in.cache_k.data(), DType::kF32,
                                                  static_cast<int64_t>(in.cache_k.size())}).isOk());
    EXPECT_TRUE(b.uploadConvert((*kv)->values(0), {in.cache_v.data(), DType::kF32,
                                                    static_cast<int64_t>(in.cache_v.size())}).isOk());
    auto qkv = upload(b, act, {in.t, width}, in.qkv);
    const int s = static_cast<int>(c.fresh.size());
    auto cu = uploadI32(b, {s + 1}, in.cu);
    auto pos = uploadI32(b, {in.t}, in.pos);
    auto tables = uploadI32(b, {s, in.maxb}, in.tables);
    auto sinks = upload(b, DType::kF32, {c.hq}, in.sinks);
    auto out = allocate(b, act, {in.t, c.hq * 64});
    poison(b, out.view);
    const std::vector<int32_t> windows{c.window};
    AttentionPlanInput plan;
    plan.cu_q = in.cu;
    plan.positions = in.pos;
    plan.windows = windows;
    plan.num_q_heads = c.hq;
    plan.num_kv_heads = c.hkv;
    plan.head_dim = 64;
    ops.planAttention(plan);
    PagedAttentionParams p;
    p.num_seqs = s;
    p.num_q_heads = c.hq;
    p.num_kv_heads = c.hkv;
    p.head_dim = 64;
    p.block_size = c.block_size;
    p.max_blocks_per_seq = in.maxb;
    p.max_context = 0;
    for (size_t i = 0; i < c.fresh.size(); ++i)
      p.max_context = std::max(p.max_context, c.fresh[i] + c.history[i]);
    p.sliding_window = c.window;
    p.scale = 0.125f * 1.3465736f * 1.3465736f;  // gpt-oss: 1/8, YaRN's C folded into q and k
    ops.pagedAttention(qkv.view, (*kv)->keys(0), (*kv)->values(0), cu.view, pos.view,
                       tables.view, c.sinks ? sinks.view : Tensor(), out.view, p);
    return download(b, out.view);
  }
  void TearDown() override {
    rose::cuda::setPagedAttnSm90(rose::cuda::kPagedAttnSm90DefaultMinTokens, true);
    rose::cuda::setPagedAttnDecodeWarps(rose::cuda::kPagedAttnDecodeWarpsDefault);
    GpuLlmOps::TearDown();
  }
};

TEST_P(GpuPagedAttention, MatchesCpu) {
  const AttnCase& c = GetParam();
  int64_t tokens = 0;
  for (int f : c.fresh) tokens += f;
  reserve(std::max<int64_t>(tokens, 64), static_cast<int32_t>(c.fresh.size()) + 4, c.hq, c.hkv);
  AttnInputs in = makeAttnInputs(c, rng_);
  auto ref = run(cpu(), *cops_, c, in);
  rose::cuda::setPagedAttnSm90(c.sm90_min, c.sm90_pipelined, c.sm90_stages, /*windows=*/true,
                               c.sm90_consumers);
  if (c.decode_warps >= 0) rose::cuda::setPagedAttnDecodeWarps(c.decode_warps == 1);
  auto got = run(gpu(), *gops_, c, in);
  if (c.sm90_min > 0) {
    auto fired = rose::cuda::pagedAttnSm90WatchdogFired();
    ASSERT_TRUE(fired.isOk());
    EXPECT_FALSE(*fired) << c.name << ": the Hopper kernel's mbarrier watchdog fired";
  }
  // P is rounded to bf16 before P·V (FlashAttention's choice) and the output is bf16. In fp16
  // (10 significand bits instead of 7) the bound is 8x tighter: a bf16 rounding anywhere fails it.
  const double scale = c.f16 ? 0.125 : 1.0;
  expectClose(got, ref, 1.5e-2 * scale, 2e-2 * scale, c.name);
  const double err = relErr(got, ref);
  EXPECT_LT(err, 1e-2 * scale) << c.name;
  std::cout << "[ attention ] " << c.name << " T=" << in.t << " rel_l2=" << err << "\n";
}

std::vector<AttnCase> attnCases() {
  std::vector<AttnCase> v;
  v.push_back({{1, 1, 1, 1, 1}, {0, 15, 16, 700, 5000}, 0, true, 64, 8, 16, "decode full (split-KV at 5000)"});
  v.push_back({{1, 1, 1, 1, 1}, {0, 127, 128, 129, 5000}, 128, true, 64, 8, 16, "decode window 128 edges"});
  v.push_back({{1, 17, 97, 300}, {0, 64, 5, 1000}, 0, true, 64, 8, 16, "prefill chunks with history"});
  v.push_back({{1, 17, 97, 300}, {0, 64, 5, 1000}, 128, true, 64, 8, 16, "prefill chunks window 128"});
  v.push_back({{3, 130}, {10, 0}, 8, false, 4, 2, 16, "group 2, window 8, no sinks"});
  v.push_back({{33}, {0}, 0, true, 8, 8, 16, "group 1"});
  v.push_back({{5, 1}, {40, 3000}, 0, true, 16, 1, 32, "group 16, block 32"});
  v.push_back({{1, 64}, {20000, 0}, 0, true, 64, 8, 64, "block 64, 20k decode"});
  v.push_back({{1024}, {0}, 0, true, 64, 8, 16, "prefill 1024"});
  v.push_back({{777}, {1234}, 128, true, 64, 8, 16, "prefill 777 after 1234, window"});
  // The Hopper kernel [TAG_PAGED_ATTN_SM90]: every case above with every sequence on it (decode
  // tokens included: one valid row of 192), then cases of its own: chunks crossing 128-key tiles
  // off the tile grid, windows whose bottom falls inside a page, block sizes 8..256, a chunk
  // mixed with decodes under the default threshold, and the basic schedule.
  const size_t base = v.size();
  for (size_t i = 0; i < base; ++i) {
    AttnCase c = v[i];
    c.name = "sm90: " + c.name;
    c.sm90_min = 1;
    v.push_back(c);
  }
  auto hopper = [&](AttnCase c, int32_t min_tokens = 1, bool pipelined = true) {
    c.sm90_min = min_tokens;
    c.sm90_pipelined = pipelined;
    v.push_back(c);
  };
  hopper({{300}, {5000}, 0, true, 64, 8, 16, "sm90: 300 after 5000"});
  hopper({{300}, {5000}, 128, true, 64, 8, 16, "sm90: 300 after 5000, window 128"});
  hopper({{1000}, {37}, 200, true, 64, 8, 16, "sm90: 1000 after 37, window 200"});
  hopper({{2048}, {0}, 0, true, 64, 8, 16, "sm90: 2048"});
  hopper({{129, 255, 1}, {3, 130, 900}, 0, true, 64, 8, 8, "sm90: block 8"});
  hopper({{129, 255}, {3, 130}, 128, true, 64, 8, 32, "sm90: block 32, window"});
  hopper({{400}, {700}, 0, false, 64, 8, 64, "sm90: block 64, no sinks"});
  hopper({{400, 50}, {700, 9}, 0, true, 64, 8, 128, "sm90: block 128"});
  hopper({{400, 50}, {700, 9}, 128, true, 64, 8, 256, "sm90: block 256, window"});
  hopper({{200}, {70}, 0, true, 16, 1, 16, "sm90: group 16"});
  hopper({{200}, {70}, 0, true, 8, 8, 16, "sm90: group 1"});
  hopper({{1, 600, 1, 130, 127}, {5000, 30, 17, 0, 40}, 0, true, 64, 8, 16,
          "sm90 at the default threshold, mixed with decodes and a 127-token chunk"},
         rose::cuda::kPagedAttnSm90DefaultMinTokens);
  hopper({{300}, {5000}, 0, true, 64, 8, 16, "sm90 basic: 300 after 5000"}, 1, false);
  {
    AttnCase c{{1000, 300}, {37, 4000}, 0, true, 64, 8, 8, "sm90 2 consumers, 4 stages: block 8"};
    c.sm90_consumers = 2;
    c.sm90_stages = 4;
    hopper(c);
    c.window = 200;
    c.name = "sm90 2 consumers, 4 stages: block 8, window 200";
    hopper(c);
  }
  // Two consumer warpgroups (128 query rows per block; the default is three, 192), pipelined
  // and basic.
  for (bool pipelined : {true, false}) {
    const std::string tag = pipelined ? "sm90 2 consumers: " : "sm90 2 consumers basic: ";
    for (AttnCase c : {AttnCase{{300}, {5000}, 0, true, 64, 8, 16, "300 after 5000"},
                       AttnCase{{1000, 191, 193}, {37, 0, 64}, 200, true, 64, 8, 16,
                                "1000 after 37 + 191 + 193 after 64, window 200"},
                       AttnCase{{1, 600, 1, 130}, {5000, 30, 17, 0}, 0, true, 64, 8, 32,
                                "mixed with decodes, block 32"},
                       AttnCase{{400, 50}, {700, 9}, 128, true, 64, 8, 256, "block 256, window"}}) {
      c.name = tag + c.name;
      c.sm90_consumers = 2;
      hopper(c, 1, pipelined);
    }
  }
  hopper({{1000}, {37}, 200, true, 64, 8, 16, "sm90 basic: 1000 after 37, window 200"}, 1,
         false);
  // [TAG_ATTN_F16] The base cases and their Hopper twins (the default 3-consumer pipelined
  // shape, the only one fp16 runs) in fp16.
  for (size_t i = 0; i < 2 * base; ++i) {
    AttnCase c = v[i];
    c.name = "f16 " + c.name;
    c.f16 = true;
    v.push_back(c);
  }
  // [TAG_ATTN_DECODE_WARPS] Single-token items around the tile (64 keys), warp (4 tiles) and
  // split (256 / 512-key chunks, 4096) edges, windows whose bottom falls inside a tile, GQA groups
  // 4 / 8 / 16 (the four-warp kernel is built for group 8; the others take the one-warp path
  // either way), block sizes 16-64, decodes batched with chunks (the
  // single-token kernel running multi-token items too), fp16; each on the four-warp path and on
  // the one-warp path (the default).
  std::vector<AttnCase> single{
      {{1, 1, 1, 1, 1, 1, 1, 1, 1}, {0, 62, 63, 64, 127, 128, 191, 255, 256}, 0, true, 64, 8, 16,
       "single: tile edges"},
      {{1, 1, 1, 1, 1, 1, 1, 1}, {300, 511, 512, 700, 4094, 4095, 4096, 8191}, 0, true, 64, 8, 16,
       "single: split edges"},
      {{1, 1, 1, 1, 1, 1, 1}, {0, 100, 127, 128, 150, 191, 6000}, 128, true, 64, 8, 16,
       "single: window 128"},
      {{1, 1, 1, 1}, {37, 200, 999, 3000}, 100, false, 64, 8, 32, "single: window 100, block 32, no sinks"},
      {{1, 1, 1}, {5, 300, 2000}, 0, true, 16, 1, 16, "single: group 16"},
      {{1, 1, 1}, {9, 70, 1300}, 8, true, 16, 4, 64, "single: group 4, window 8, block 64"},
      {{1, 17, 1, 64, 1}, {700, 5, 129, 0, 5000}, 0, true, 64, 8, 16, "single: with chunks"},
      {{1, 17, 1, 64, 1}, {700, 5, 129, 0, 5000}, 128, true, 64, 8, 16, "single: with chunks, window 128"},
  };
  for (bool one_warp : {false, true}) {
    for (bool f16 : {false, true}) {
      for (AttnCase c : single) {
        c.decode_warps = one_warp ? 0 : 1;
        c.f16 = f16;
        c.name = std::string(f16 ? "f16 " : "") + (one_warp ? "one warp " : "") + c.name;
        v.push_back(c);
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuPagedAttention, ::testing::ValuesIn(attnCases()));

// A graph launch gives a layer no combine kernel and one work block per sequence when
// pagedAttnWindowCanSplit says no token of that window splits: checked against the planner itself
// for every position up to the window, for windows around the chunk sizes and with the bench's
// fixed-chunk override.
TEST(GpuPagedAttentionPlan, WindowCanSplitMatchesThePlanner) {
  for (int32_t chunk : {0, 64, 128, 256, 512}) {
    rose::cuda::setPagedAttnSplitKeys(chunk);
    for (int32_t window : {0, 1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1000,
                           4095, 4096, 4097, 6000}) {
      bool splits = false;
      const int32_t last = window > 0 ? window + 70 : 6000;
      for (int32_t p = 0; p <= last && !splits; ++p) {
        const int32_t cu[2] = {0, 1};
        const rose::cuda::PagedAttnPlan plan =
            rose::cuda::planPagedAttention(cu, 1, &p, 8, window);
        splits = !plan.combine.empty();
        if (!splits) {
          ASSERT_EQ(plan.work.size(), 1u) << "window " << window << " position " << p;
        }
      }
      EXPECT_EQ(rose::cuda::pagedAttnWindowCanSplit(window), splits)
          << "window " << window << " chunk override " << chunk;
    }
  }
  rose::cuda::setPagedAttnSplitKeys(0);
}

// The Hopper kernel's items [TAG_PAGED_ATTN_SM90]: every query token of a chunk at or above the
// threshold (and only those) in exactly one item of 128 (or 192) rows; each item's key range holds every
// key its rows see and nothing below the lowest one's window; most keys first; a chunk whose
// positions are not consecutive stays on the mma.sync kernel.
TEST(GpuPagedAttentionPlan, Sm90ItemsCoverLongChunksAndTheirKeys) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t window = trial % 3 == 0 ? 0 : 1 + static_cast<int32_t>(rng() % 700);
    const int32_t min_tokens = 1 + static_cast<int32_t>(rng() % 300);
    const int32_t seqs = 1 + static_cast<int32_t>(rng() % 6);
    std::vector<int32_t> cu{0}, pos;
    for (int32_t s = 0; s < seqs; ++s) {
      const int32_t n = rng() % 4 == 0 ? 1 : 1 + static_cast<int32_t>(rng() % 1100);
      const int32_t hist = static_cast<int32_t>(rng() % 5000);
      for (int32_t j = 0; j < n; ++j) pos.push_back(hist + j);
      cu.push_back(cu.back() + n);
    }
    const bool gap = trial % 7 == 0 && cu[1] > 2;  // sequence 0 not consecutive
    if (gap) pos[1] += 1;
    const int32_t rows = trial % 2 == 0 ? 128 : 192;
    const rose::cuda::PagedAttnPlan plan =
        rose::cuda::planPagedAttention(cu.data(), seqs, pos.data(), 8, window, min_tokens, rows);
    std::vector<int> covered(pos.size(), 0);
    for (size_t i = 0; i < plan.sm90.size(); ++i) {
      const auto& w = plan.sm90[i];
      ASSERT_GE(w.seq, 0);
      ASSERT_LT(w.seq, seqs);
      const int32_t n = cu[static_cast<size_t>(w.seq) + 1] - cu[static_cast<size_t>(w.seq)];
      ASSERT_GE(n, min_tokens);
      ASSERT_FALSE(gap && w.seq == 0);
      ASSERT_EQ(w.tok0 % rows, 0);
      int32_t lowest = INT32_MAX;
      for (int32_t r = w.tok0; r < std::min(n, w.tok0 + rows); ++r) {
        const int32_t p = pos[static_cast<size_t>(cu[static_cast<size_t>(w.seq)] + r)];
        ++covered[static_cast<size_t>(cu[static_cast<size_t>(w.seq)] + r)];
        const int32_t lo = window > 0 ? std::max(0, p - window + 1) : 0;
        lowest = std::min(lowest, lo);
        EXPECT_LE(w.key_begin, lo);
        EXPECT_GE(w.key_end, p + 1);
      }
      EXPECT_EQ(w.key_begin, lowest);
      EXPECT_EQ(w.key_end, std::min(pos[static_cast<size_t>(cu[static_cast<size_t>(w.seq)] +
                                                             std::min(n, w.tok0 + rows) - 1)],
                                    pos[static_cast<size_t>(cu[static_cast<size_t>(w.seq)] + n -
                                                            1)]) +
                                1);
      if (i > 0) {
        const auto& prev = plan.sm90[i - 1];
        EXPECT_GE(prev.key_end - prev.key_begin, w.key_end - w.key_begin);
      }
    }
    for (int32_t s = 0; s < seqs; ++s) {
      const int32_t n = cu[static_cast<size_t>(s) + 1] - cu[static_cast<size_t>(s)];
      const bool hopper = n >= min_tokens && !(gap && s == 0);
      for (int32_t r = 0; r < n; ++r) {
        EXPECT_EQ(covered[static_cast<size_t>(cu[static_cast<size_t>(s)] + r)], hopper ? 1 : 0)
            << "trial " << trial << " sequence " << s << " token " << r;
      }
      bool in_mma = false;
      for (const auto& w : plan.work) in_mma = in_mma || w.seq == s;
      EXPECT_EQ(in_mma, !hopper) << "trial " << trial << " sequence " << s;
    }
  }
}

// A decode token's output does not depend on the other sequences of the step (bit for bit):
// alone, and batched with prefill chunks and other decodes (different work splits around it).
TEST_F(GpuLlmOps, PagedAttentionIsBatchInvariant) {
  reserve(4096, 16, 64, 8);
  AttnCase batch{{1, 300, 1, 64, 1}, {5000, 0, 17, 3000, 200}, 0, true, 64, 8, 16, "batch"};
  AttnInputs in = makeAttnInputs(batch, rng_);
  auto runOne = [&](const AttnCase& c, const AttnInputs& x) {
    const int64_t width = (c.hq + 2 * c.hkv) * 64;
    KvCacheShape ks{1, x.num_blocks, c.block_size, c.hkv, 64};
    auto kv = PagedKvCache::create(gpu(), ks, gpu().activationDType());
    EXPECT_TRUE(gpu().uploadConvert((*kv)->keys(0), {x.cache_k.data(), DType::kF32, static_cast<int64_t>(x.cache_k.size())}).isOk());
    EXPECT_TRUE(gpu().uploadConvert((*kv)->values(0), {x.cache_v.data(), DType::kF32, static_cast<int64_t>(x.cache_v.size())}).isOk());
    const int s = static_cast<int>(c.fresh.size());
    auto qkv = upload(gpu(), gpu().activationDType(), {x.t, width}, x.qkv);
    auto cu = uploadI32(gpu(), {s + 1}, x.cu);
    auto pos = uploadI32(gpu(), {x.t}, x.pos);
    auto tables = uploadI32(gpu(), {s, x.maxb}, x.tables);
    auto sinks = upload(gpu(), DType::kF32, {c.hq}, x.sinks);
    auto out = allocate(gpu(), gpu().activationDType(), {x.t, c.hq * 64});
    poison(gpu(), out.view);
    const std::vector<int32_t> windows{0};
    AttentionPlanInput plan{x.cu, x.pos, windows, c.hq, c.hkv, 64};
    gops_->planAttention(plan);
    PagedAttentionParams p;
    p.num_seqs = s;
    p.num_q_heads = c.hq;
    p.num_kv_heads = c.hkv;
    p.head_dim = 64;
    p.block_size = c.block_size;
    p.max_blocks_per_seq = x.maxb;
    p.scale = 0.125f;
    gops_->pagedAttention(qkv.view, (*kv)->keys(0), (*kv)->values(0), cu.view, pos.view,
                          tables.view, sinks.view, out.view, p);
    return download(gpu(), out.view);
  };
  auto all = runOne(batch, in);
  // Sequence 0 (decode at 5000, split-KV) and sequence 2 (decode at 17) alone.
  for (int which : {0, 2, 4}) {
    AttnCase one{{1}, {batch.history[static_cast<size_t>(which)]}, 0, true, 64, 8, 16, "alone"};
    AttnInputs x = in;
    const int64_t width = (64 + 16) * 64;
    x.qkv.assign(in.qkv.begin() + in.cu[static_cast<size_t>(which)] * width,
                 in.qkv.begin() + (in.cu[static_cast<size_t>(which)] + 1) * width);
    x.cu = {0, 1};
    x.pos = {in.pos[static_cast<size_t>(in.cu[static_cast<size_t>(which)])]};
    x.t = 1;
    x.tables.assign(in.tables.begin() + which * in.maxb, in.tables.begin() + (which + 1) * in.maxb);
    auto alone = runOne(one, x);
    const int64_t row = in.cu[static_cast<size_t>(which)];
    for (int64_t i = 0; i < 64 * 64; ++i) {
      ASSERT_EQ(std::memcmp(&alone[static_cast<size_t>(i)], &all[static_cast<size_t>(row * 64 * 64 + i)], 4), 0)
          << "sequence " << which << " element " << i << ": alone " << alone[static_cast<size_t>(i)]
          << " batched " << all[static_cast<size_t>(row * 64 * 64 + i)];
    }
  }
}

// ---- router --------------------------------------------------------------------------------------

TEST_F(GpuLlmOps, MoeRouteMatchesCpu) {
  for (auto [t, e, k] : std::vector<std::tuple<int64_t, int64_t, int32_t>>{
           {1, 32, 4}, {33, 4, 2}, {1000, 128, 4}, {7, 8, 8}, {257, 32, 1}}) {
    SCOPED_TRACE("T=" + std::to_string(t) + " E=" + std::to_string(e) + " k=" + std::to_string(k));
    std::vector<float> logits(static_cast<size_t>(t * e));
    std::normal_distribution<float> nd(0.f, 2.f);
    for (auto& x : logits) x = nd(rng_);
    auto bias = randomBf16(static_cast<size_t>(e), rng_, -0.5f, 0.5f);
    auto cl = upload(cpu(), DType::kF32, {t, e}, logits);
    auto gl = upload(gpu(), DType::kF32, {t, e}, logits);
    auto cb = upload(cpu(), DType::kF32, {e}, bias);
    auto gb = upload(gpu(), gpu().weightDType(), {e}, bias);
    auto ci = allocate(cpu(), DType::kI32, {t, k});
    auto gi = allocate(gpu(), DType::kI32, {t, k});
    auto cw = allocate(cpu(), DType::kF32, {t, k});
    auto gw = allocate(gpu(), DType::kF32, {t, k});
    poison(gpu(), gi.view);
    poison(gpu(), gw.view);
    cops_->moeRoute(cl.view, cb.view, ci.view, cw.view, MoeRouteParams{k});
    gops_->moeRoute(gl.view, gb.view, gi.view, gw.view, MoeRouteParams{k});
    EXPECT_EQ(download(gpu(), gi.view), download(cpu(), ci.view));
    expectClose(download(gpu(), gw.view), download(cpu(), cw.view), 1e-6, 1e-5, "weights");
  }
}

// [TAG_ROUTER_F32] The f32 router (logits from the f32 stream, the norm folded into f32 weights)
// against the CPU op (double sums): the same experts wherever the k-th and (k+1)-th logits are
// apart by more than f32 rounding could move them, weights within 1e-5; and a row alone gives the
// bits it gives inside a batch of 1000 (the K split depends on the hidden size only). Both
// kernels: the CUDA-core one (wt F32 [H, E]) and the tensor-core one (the BF16 split,
// [TAG_ROUTER_MMA]).
TEST_F(GpuLlmOps, MoeRouteF32MatchesCpuAndIsBatchInvariant) {
  struct Case { int64_t t, h, e; int32_t k; };
  for (bool mma : {false, true})
  for (Case c : {Case{1, 2880, 32, 4}, Case{16, 2880, 32, 4}, Case{17, 288, 8, 4},
                 Case{1000, 2880, 128, 4}, Case{257, 96, 4, 2}, Case{3, 2880, 32, 4},
                 Case{40, 260, 12, 3}, Case{5, 4608, 32, 4}, Case{130, 2880, 36, 4}}) {
    SCOPED_TRACE(std::string(mma ? "mma" : "simt") + " T=" + std::to_string(c.t) + " H=" +
                 std::to_string(c.h) + " E=" + std::to_string(c.e) + " k=" + std::to_string(c.k));
    reserve(std::max<int64_t>(c.t, 64), 8, 8, 8, static_cast<int32_t>(c.h), 64,
            static_cast<int32_t>(c.e), c.k);
    std::normal_distribution<float> nd(0.f, 3.f);
    std::vector<float> res(static_cast<size_t>(c.t * c.h));
    for (auto& x : res) x = nd(rng_);
    const std::vector<float> wt = foldedRouterWeights(c.h, c.e);
    auto bias = randomBf16(static_cast<size_t>(c.e), rng_, -0.5f, 0.5f);
    auto cr = upload(cpu(), DType::kF32, {c.t, c.h}, res);
    auto gr = upload(gpu(), DType::kF32, {c.t, c.h}, res);
    auto cwt = upload(cpu(), DType::kF32, {c.h, c.e}, wt);
    auto gwt = mma ? uploadRouterSplit(wt, c.h, c.e) : upload(gpu(), DType::kF32, {c.h, c.e}, wt);
    auto cb = upload(cpu(), DType::kF32, {c.e}, bias);
    auto gb = upload(gpu(), gpu().weightDType(), {c.e}, bias);
    auto ci = allocate(cpu(), DType::kI32, {c.t, c.k});
    auto gi = allocate(gpu(), DType::kI32, {c.t, c.k});
    auto cw = allocate(cpu(), DType::kF32, {c.t, c.k});
    auto gw = allocate(gpu(), DType::kF32, {c.t, c.k});
    poison(gpu(), gi.view);
    poison(gpu(), gw.view);
    const MoeRouteParams p{c.k, 1e-5f};
    cops_->moeRouteF32(cr.view, cwt.view, cb.view, ci.view, cw.view, p);
    gops_->moeRouteF32(gr.view, gwt.view, gb.view, gi.view, gw.view, p);
    const auto gids = download(gpu(), gi.view), cids = download(cpu(), ci.view);
    const auto gws = download(gpu(), gw.view), cws = download(cpu(), cw.view);
    // Host logits in double for the margins between the k-th and (k+1)-th expert.
    int compared = 0;
    for (int64_t t = 0; t < c.t; ++t) {
      std::vector<double> lg(static_cast<size_t>(c.e), 0.0);
      double ss = 0;
      for (int64_t k = 0; k < c.h; ++k) {
        const double x = res[static_cast<size_t>(t * c.h + k)];
        ss += x * x;
        for (int64_t e = 0; e < c.e; ++e) lg[static_cast<size_t>(e)] += x * wt[static_cast<size_t>(k * c.e + e)];
      }
      const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(c.h) + 1e-5);
      for (int64_t e = 0; e < c.e; ++e) lg[static_cast<size_t>(e)] = lg[static_cast<size_t>(e)] * rstd + bias[static_cast<size_t>(e)];
      std::vector<double> sorted = lg;
      std::sort(sorted.rbegin(), sorted.rend());
      const double gap = c.k < c.e ? sorted[static_cast<size_t>(c.k) - 1] - sorted[static_cast<size_t>(c.k)] : 1.0;
      if (gap < 1e-4) continue;  // a near-tie f32 rounding may break either way
      ++compared;
      for (int32_t j = 0; j < c.k; ++j) {
        const size_t i = static_cast<size_t>(t * c.k + j);
        ASSERT_EQ(gids[i], cids[i]) << "token " << t << " slot " << j;
        ASSERT_NEAR(gws[i], cws[i], 1e-5) << "token " << t << " slot " << j;
      }
    }
    EXPECT_GE(compared, c.t * 9 / 10) << "too many near-ties to compare";
    // Batch invariance: the last row alone.
    const int64_t last = c.t - 1;
    auto g1 = upload(gpu(), DType::kF32, {1, c.h},
                     std::vector<float>(res.begin() + last * c.h, res.end()));
    auto gi1 = allocate(gpu(), DType::kI32, {1, c.k});
    auto gw1 = allocate(gpu(), DType::kF32, {1, c.k});
    gops_->moeRouteF32(g1.view, gwt.view, gb.view, gi1.view, gw1.view, p);
    const auto ids1 = download(gpu(), gi1.view);
    const auto ws1 = download(gpu(), gw1.view);
    for (int32_t j = 0; j < c.k; ++j) {
      const size_t i = static_cast<size_t>(last * c.k + j);
      EXPECT_EQ(ids1[static_cast<size_t>(j)], gids[i]);
      EXPECT_EQ(std::memcmp(&ws1[static_cast<size_t>(j)], &gws[i], 4), 0) << "slot " << j;
    }
  }
}

// The router kernels' common arguments (RouterF32Args or RouterMmaArgs; weights set by the caller).
template <typename Args>
Args routerArgs(const OwnedTensor& residual, const OwnedTensor& part, const OwnedTensor& ss,
                int64_t t, int64_t h, int64_t e) {
  Args a;
  a.residual = residual.view.as<float>();
  a.part = part.view.as<float>();
  a.ss = ss.view.as<float>();
  a.num_tokens = t;
  a.hidden = static_cast<int32_t>(h);
  a.num_experts = static_cast<int32_t>(e);
  return a;
}

// [TAG_ROUTER_F32_TILED] The register-tiled kernel that large steps take gives routerF32Kernel's
// partials and sums of squares bit for bit (both of its stagings, [TAG_ROUTER_F32_TILED_ROWS];
// the 32-token tile, [TAG_ROUTER_F32_TILED_TOK]): token counts around its 32/64-token tiles, expert counts
// off its 32/64-expert tiles, K tails (260, 4100), inputs with zeros and negative zeros.
TEST_F(GpuLlmOps, MoeRouteF32TiledKernelGivesTheSameBits) {
  struct Case { int64_t t, h, e; };
  for (Case c : {Case{1, 2880, 32}, Case{63, 2880, 32}, Case{64, 2880, 128}, Case{65, 260, 12},
                 Case{200, 2880, 36}, Case{1000, 2880, 128}, Case{3000, 2880, 32},
                 Case{130, 4100, 8}, Case{777, 96, 4}, Case{129, 4608, 32}}) {
    SCOPED_TRACE("T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) + " E=" +
                 std::to_string(c.e));
    std::normal_distribution<float> nd(0.f, 3.f);
    std::uniform_int_distribution<int> pick(0, 49);
    std::vector<float> res(static_cast<size_t>(c.t * c.h));
    for (auto& x : res) {
      const int p = pick(rng_);
      x = p == 0 ? 0.f : p == 1 ? -0.f : nd(rng_);
    }
    std::vector<float> wt(static_cast<size_t>(c.h * c.e));
    for (auto& x : wt) x = pick(rng_) == 0 ? -0.f : nd(rng_) * 0.02f;
    const int32_t splits = rose::cuda::routerF32Splits(c.h);
    auto gr = upload(gpu(), DType::kF32, {c.t, c.h}, res);
    auto gwt = upload(gpu(), DType::kF32, {c.h, c.e}, wt);
    auto part = allocate(gpu(), DType::kF32, {splits, c.t, c.e});
    auto ss = allocate(gpu(), DType::kF32, {splits, c.t});
    auto run = [&](int64_t tiled_min, bool rows = false, int tok = 64) {
      poison(gpu(), part.view);
      poison(gpu(), ss.view);
      rose::cuda::setRouterF32TiledMinTokens(tiled_min);
      rose::cuda::setRouterF32TiledRows(rows);  // [TAG_ROUTER_F32_TILED_ROWS]
      rose::cuda::setRouterF32TiledTok(tok);    // [TAG_ROUTER_F32_TILED_TOK]
      auto a = routerArgs<rose::cuda::RouterF32Args>(gr, part, ss, c.t, c.h, c.e);
      a.wt = gwt.view.as<float>();
      EXPECT_TRUE(
          rose::cuda::launchRouterF32Partials(a, dynamic_cast<cuda::CudaBackend&>(gpu()).stream())
              .isOk());
      rose::cuda::setRouterF32TiledMinTokens(rose::cuda::kRouterF32TiledMinTokens);
      rose::cuda::setRouterF32TiledRows(false);
      rose::cuda::setRouterF32TiledTok(rose::cuda::kRouterF32TiledTok);
      return std::make_pair(download(gpu(), part.view), download(gpu(), ss.view));
    };
    const auto ref = run(0);  // routerF32Kernel
    // The tiled kernel at every size: both stagings of the 64-token tile, the 32-token tile.
    for (int variant = 0; variant < 3; ++variant) {
      const bool rows = variant == 1;
      const int tok = variant == 2 ? 32 : 64;
      SCOPED_TRACE(variant == 0 ? "rows staged transposed" : variant == 1 ? "rows staged as they lie"
                                                                          : "32-token tile");
      const auto got = run(1, rows, tok);
      ASSERT_EQ(ref.first.size(), got.first.size());
      size_t diffs = 0;
      for (size_t i = 0; i < ref.first.size(); ++i)
        diffs += std::memcmp(&ref.first[i], &got.first[i], 4) != 0;
      EXPECT_EQ(diffs, 0u) << "partials differ in bits (of " << ref.first.size() << ")";
      EXPECT_EQ(std::memcmp(ref.second.data(), got.second.data(), ref.second.size() * 4), 0)
          << "sums of squares differ in bits";
    }
  }
}

// [TAG_ROUTER_MMA] The tensor-core router's slice partials and sums of squares against f64 sums
// of the same products, beside the CUDA-core kernel's: every partial within 2^-18 of the slice's
// sum of |x·w| (one dropped product of the split — hi·lo, mid·hi — would be off by ~2^-9).
// Shapes with a K tail (260, 4100), an expert count off the 8-expert tile (12, 36), one token and
// 3000. Measured on the H200 (2026-12-04 s11): worst error / sum |p| 1.2e-6 .. 2.1e-6 for the
// tensor cores' f32 sums, 1.3e-7 .. 2.8e-7 for the CUDA-core kernel's (printed per shape).
TEST_F(GpuLlmOps, MoeRouteMmaPartialsTrackF64Sums) {
  struct Case { int64_t t, h, e; };
  for (Case c : {Case{1, 2880, 32}, Case{3000, 2880, 128}, Case{77, 260, 12}, Case{65, 4100, 36},
                 Case{200, 2880, 32}}) {
    SCOPED_TRACE("T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) + " E=" +
                 std::to_string(c.e));
    std::normal_distribution<float> nd(0.f, 3.f);
    std::uniform_real_distribution<float> scale(-12.f, 12.f);
    std::vector<float> res(static_cast<size_t>(c.t * c.h));
    for (auto& x : res) x = nd(rng_) * std::exp2(std::round(scale(rng_)));  // wide exponents
    const std::vector<float> wt = foldedRouterWeights(c.h, c.e);
    const int32_t splits = rose::cuda::routerF32Splits(c.h);
    auto gr = upload(gpu(), DType::kF32, {c.t, c.h}, res);
    auto gwt = upload(gpu(), DType::kF32, {c.h, c.e}, wt);
    auto gsplit = uploadRouterSplit(wt, c.h, c.e);
    auto part = allocate(gpu(), DType::kF32, {splits, c.t, c.e});
    auto ss = allocate(gpu(), DType::kF32, {splits, c.t});
    auto run = [&](bool mma) {
      poison(gpu(), part.view);
      poison(gpu(), ss.view);
      const cudaStream_t st = dynamic_cast<cuda::CudaBackend&>(gpu()).stream();
      if (mma) {
        auto a = routerArgs<rose::cuda::RouterMmaArgs>(gr, part, ss, c.t, c.h, c.e);
        a.w = gsplit.view.as<uint16_t>();
        EXPECT_TRUE(rose::cuda::launchRouterMmaPartials(a, st).isOk());
      } else {
        auto a = routerArgs<rose::cuda::RouterF32Args>(gr, part, ss, c.t, c.h, c.e);
        a.wt = gwt.view.as<float>();
        EXPECT_TRUE(rose::cuda::launchRouterF32Partials(a, st).isOk());
      }
      return std::make_pair(download(gpu(), part.view), download(gpu(), ss.view));
    };
    // Relative error of every partial against its slice's sum of |products|.
    auto worst = [&](const std::pair<std::vector<float>, std::vector<float>>& got) {
      double w = 0;
      for (int32_t s = 0; s < splits; ++s) {
        const int64_t k0 = static_cast<int64_t>(s) * rose::cuda::kRouterF32SliceK;
        const int64_t k1 = std::min<int64_t>(c.h, k0 + rose::cuda::kRouterF32SliceK);
        for (int64_t t = 0; t < c.t; ++t) {
          double sq = 0;
          std::vector<double> dot(static_cast<size_t>(c.e), 0.0), mag(static_cast<size_t>(c.e), 0.0);
          for (int64_t k = k0; k < k1; ++k) {
            const double x = res[static_cast<size_t>(t * c.h + k)];
            sq += x * x;
            for (int64_t e = 0; e < c.e; ++e) {
              const double p = x * wt[static_cast<size_t>(k * c.e + e)];
              dot[static_cast<size_t>(e)] += p;
              mag[static_cast<size_t>(e)] += std::fabs(p);
            }
          }
          const double gs = got.second[static_cast<size_t>(s * c.t + t)];
          EXPECT_LE(std::fabs(gs - sq), std::ldexp(sq, -18) + 1e-30)
              << "ss slice " << s << " token " << t;
          for (int64_t e = 0; e < c.e; ++e) {
            const double g = got.first[static_cast<size_t>((s * c.t + t) * c.e + e)];
            const double m = mag[static_cast<size_t>(e)];
            const double err = std::fabs(g - dot[static_cast<size_t>(e)]);
            if (m > 0) w = std::max(w, err / m);
            if (err > std::ldexp(m, -18) + 1e-30) {
              ADD_FAILURE() << "slice " << s << " token " << t << " expert " << e << ": " << g
                            << " vs " << dot[static_cast<size_t>(e)] << " (sum |p| " << m << ")";
              return w;
            }
          }
        }
      }
      return w;
    };
    const double w_simt = worst(run(false));
    const double w_mma = worst(run(true));
    std::printf("router partials T=%lld H=%lld E=%lld: worst |err| / sum|p| simt %.3g mma %.3g\n",
                static_cast<long long>(c.t), static_cast<long long>(c.h),
                static_cast<long long>(c.e), w_simt, w_mma);
  }
}

// [TAG_ROUTER_FUSED_ROUTE] The route done by the router kernel's last block per token tile gives
// the bits of the separate route kernel: one and several token tiles (partial last tiles), one
// and several expert tiles, several launches in a row (each leaves its tile counters zeroed for
// the next), a smaller T after a larger one.
TEST_F(GpuLlmOps, MoeRouteF32FusedRouteEqualsTheRouteKernel) {
  struct Case { int64_t t, h, e; int32_t k; };
  for (Case c : {Case{1, 2880, 32, 4}, Case{1000, 2880, 128, 4}, Case{16, 2880, 32, 4},
                 Case{17, 2880, 128, 4}, Case{333, 2880, 128, 8}, Case{3, 288, 8, 1},
                 Case{1, 2880, 32, 4}, Case{20, 4608, 32, 4}}) {
    SCOPED_TRACE("T=" + std::to_string(c.t) + " E=" + std::to_string(c.e) + " k=" +
                 std::to_string(c.k));
    reserve(1000, 8, 8, 8, static_cast<int32_t>(c.h), 64, static_cast<int32_t>(c.e), c.k);
    std::normal_distribution<float> nd(0.f, 3.f);
    std::vector<float> res(static_cast<size_t>(c.t * c.h));
    for (auto& x : res) x = nd(rng_);
    std::vector<float> wt(static_cast<size_t>(c.h * c.e));
    for (auto& x : wt) x = nd(rng_) * 0.02f;
    auto bias = randomBf16(static_cast<size_t>(c.e), rng_, -0.5f, 0.5f);
    auto gr = upload(gpu(), DType::kF32, {c.t, c.h}, res);
    auto gwt = upload(gpu(), DType::kF32, {c.h, c.e}, wt);
    auto gb = upload(gpu(), gpu().weightDType(), {c.e}, bias);
    const MoeRouteParams p{c.k, 1e-5f};
    auto run = [&](bool fused) {
      auto gi = allocate(gpu(), DType::kI32, {c.t, c.k});
      auto gw = allocate(gpu(), DType::kF32, {c.t, c.k});
      poison(gpu(), gi.view);
      poison(gpu(), gw.view);
      rose::cuda::setRouterFusedRoute(fused);
      gops_->moeRouteF32(gr.view, gwt.view, gb.view, gi.view, gw.view, p);
      rose::cuda::setRouterFusedRoute(false);
      return std::make_pair(download(gpu(), gi.view), download(gpu(), gw.view));
    };
    const auto ref = run(false);
    for (int rep = 0; rep < 3; ++rep) {
      const auto got = run(true);
      ASSERT_EQ(got.first, ref.first) << "launch " << rep;
      ASSERT_EQ(got.second.size(), ref.second.size());
      ASSERT_EQ(std::memcmp(got.second.data(), ref.second.data(), got.second.size() * 4), 0)
          << "launch " << rep << ": weights differ in bits";
    }
  }
}

// The one-warp align of small steps (<= 32 assignments: decode) writes exactly what the
// 1024-thread kernel writes, on random assignments with repeated experts, invalid ids (-1, >= E),
// several block_m and a max_tiles above the bound; outputs poisoned alike first.
TEST_F(GpuLlmOps, MoeAlignWarpPathEqualsTheBlockKernel) {
  struct Buf {
    int32_t* p = nullptr;
    size_t n = 0;
    explicit Buf(size_t count) : n(count) {
      EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), count * 4), cudaSuccess);
    }
    ~Buf() { cudaFree(p); }
    std::vector<int32_t> get() const {
      std::vector<int32_t> v(n);
      EXPECT_EQ(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      return v;
    }
  };
  cudaStream_t st = dynamic_cast<cuda::CudaBackend&>(gpu()).stream();
  int cases = 0;
  for (int32_t ne : {4, 8, 32, 128}) {
    for (int32_t bm : {16, 64}) {
      for (int32_t k : {1, 2, 4, 8}) {
        if (k > ne) continue;
        for (int64_t t = 1; t * k <= 32; t = t < 4 ? t + 1 : t * 2) {
          SCOPED_TRACE("E=" + std::to_string(ne) + " bm=" + std::to_string(bm) + " k=" +
                       std::to_string(k) + " T=" + std::to_string(t));
          const int64_t n = t * k;
          std::vector<int32_t> ids(static_cast<size_t>(n));
          std::uniform_int_distribution<int32_t> d(0, ne - 1), bad(0, 19);
          for (auto& x : ids) {
            x = d(rng_) % std::max<int32_t>(1, ne / (1 + static_cast<int32_t>(rng_() % 3)));  // repeats
            const int32_t b = bad(rng_);
            if (b == 0) x = -1;
            if (b == 1) x = ne + 3;
          }
          const int32_t max_tiles =
              static_cast<int32_t>(cuda::moeAlignMaxTiles(n, ne, bm)) + static_cast<int32_t>(rng_() % 3);
          const size_t max_rows = static_cast<size_t>(max_tiles) * static_cast<size_t>(bm);
          Buf dids(static_cast<size_t>(n));
          ASSERT_EQ(cudaMemcpy(dids.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
          std::vector<std::vector<int32_t>> got[2];
          for (int which = 0; which < 2; ++which) {
            Buf rt(max_rows), ro(static_cast<size_t>(n)), te(static_cast<size_t>(max_tiles)), nt(1);
            for (const Buf* b : {&rt, &ro, &te, &nt}) ASSERT_EQ(cudaMemset(b->p, 0x5A, b->n * 4), cudaSuccess);
            cuda::MoeAlignArgs a;
            a.topk_ids = dids.p;
            a.row_token = rt.p;
            a.row_of = ro.p;
            a.tile_expert = te.p;
            a.num_tiles = nt.p;
            a.num_tokens = t;
            a.top_k = k;
            a.num_experts = ne;
            a.block_m = bm;
            a.max_tiles = max_tiles;
            ASSERT_TRUE((which == 0 ? cuda::launchMoeAlign(a, st) : cuda::launchMoeAlignOneBlock(a, st)).isOk());
            ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
            got[which] = {rt.get(), ro.get(), te.get(), nt.get()};
          }
          EXPECT_EQ(got[0][3], got[1][3]) << "num_tiles";
          EXPECT_EQ(got[0][2], got[1][2]) << "tile_expert";
          EXPECT_EQ(got[0][1], got[1][1]) << "row_of";
          EXPECT_EQ(got[0][0], got[1][0]) << "row_token";
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 50);
}

// A device buffer of raw bytes for the kernel-level tests.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t b) : bytes(b) { EXPECT_EQ(cudaMalloc(&p, b), cudaSuccess); }
  ~DevBuf() { cudaFree(p); }
  template <typename T>
  std::vector<T> get() const {
    std::vector<T> v(bytes / sizeof(T));
    EXPECT_EQ(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  template <typename T>
  void put(const std::vector<T>& v) {
    ASSERT_EQ(v.size() * sizeof(T), bytes);
    ASSERT_EQ(cudaMemcpy(p, v.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
};

// [TAG_ROUTE_ALIGN] The route + align kernel of decode-sized steps writes exactly what the route
// kernel and then the align kernel write: random logits (and the f32 router's slice partials with
// sums of squares), 1..8 tokens, top-4 of 32 and 128 experts and top-8 of 32, with a bias, NaN
// logits and ties; outputs poisoned alike first; twice in a row (nothing carried between launches).
TEST_F(GpuLlmOps, MoeRouteAlignKernelEqualsRouteThenAlign) {
  cudaStream_t st = dynamic_cast<cuda::CudaBackend&>(gpu()).stream();
  int cases = 0;
  struct Case { int32_t e, k, splits; };
  for (Case c : {Case{32, 4, 0}, Case{32, 4, 12}, Case{128, 4, 0}, Case{128, 4, 12}, Case{32, 8, 12}}) {
    for (int64_t t = 1; t <= cuda::kMoeRouteAlignMaxTokens && t * c.k <= 32; ++t) {
      SCOPED_TRACE("E=" + std::to_string(c.e) + " k=" + std::to_string(c.k) + " splits=" +
                   std::to_string(c.splits) + " T=" + std::to_string(t));
      const int32_t s = std::max(1, c.splits);
      std::normal_distribution<float> nd(0.f, 2.f);
      std::vector<float> logits(static_cast<size_t>(s * t * c.e));
      for (auto& x : logits) x = nd(rng_);
      logits[static_cast<size_t>(rng_() % logits.size())] = std::nanf("");
      logits[1] = logits[0];  // a tie
      std::vector<float> ss(static_cast<size_t>(s * t));
      for (auto& x : ss) x = std::fabs(nd(rng_)) * 100.f;
      std::vector<uint16_t> bias(static_cast<size_t>(c.e));
      for (auto& b : bias) b = f32ToBf16(nd(rng_) * 0.1f);
      DevBuf dl(logits.size() * 4), dss(ss.size() * 4), db(bias.size() * 2);
      dl.put(logits);
      dss.put(ss);
      db.put(bias);
      const int64_t n = t * c.k;
      const int32_t bm = 16;
      const int32_t tiles = static_cast<int32_t>(cuda::moeAlignMaxTiles(n, c.e, bm));
      std::vector<std::vector<int32_t>> ints[2];
      std::vector<float> weights[2];
      for (int which = 0; which < 2; ++which) {
        for (int rep = 0; rep < 2; ++rep) {
          DevBuf ids(static_cast<size_t>(n) * 4), w(static_cast<size_t>(n) * 4),
              rt(static_cast<size_t>(tiles * bm) * 4), ro(static_cast<size_t>(n) * 4),
              te(static_cast<size_t>(tiles) * 4), nt(4);
          for (const DevBuf* d : {&ids, &w, &rt, &ro, &te, &nt})
            ASSERT_EQ(cudaMemset(d->p, 0x5A, d->bytes), cudaSuccess);
          cuda::MoeRouteArgs r;
          r.logits = static_cast<const float*>(dl.p);
          r.bias = static_cast<const __nv_bfloat16*>(db.p);
          r.topk_ids = static_cast<int32_t*>(ids.p);
          r.topk_weights = static_cast<float*>(w.p);
          r.num_tokens = t;
          r.num_experts = c.e;
          r.top_k = c.k;
          if (c.splits > 0) {
            r.splits = c.splits;
            r.ss = static_cast<const float*>(dss.p);
            r.hidden = 2880;
            r.eps = 1e-5f;
          }
          cuda::MoeAlignArgs a;
          a.topk_ids = r.topk_ids;
          a.row_token = static_cast<int32_t*>(rt.p);
          a.row_of = static_cast<int32_t*>(ro.p);
          a.tile_expert = static_cast<int32_t*>(te.p);
          a.num_tiles = static_cast<int32_t*>(nt.p);
          a.num_tokens = t;
          a.top_k = c.k;
          a.num_experts = c.e;
          a.block_m = bm;
          a.max_tiles = tiles;
          if (which == 0) {
            ASSERT_TRUE(cuda::launchMoeRoute(r, st).isOk());
            ASSERT_TRUE(cuda::launchMoeAlign(a, st).isOk());
          } else {
            ASSERT_TRUE(cuda::launchMoeRouteAlign(r, a, st).isOk());
          }
          ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
          std::vector<std::vector<int32_t>> got = {ids.get<int32_t>(), rt.get<int32_t>(),
                                                   ro.get<int32_t>(), te.get<int32_t>(),
                                                   nt.get<int32_t>()};
          std::vector<float> gw = w.get<float>();
          if (rep == 0) {
            ints[which] = got;
            weights[which] = gw;
          } else {
            EXPECT_EQ(got, ints[which]) << "second launch";
          }
        }
      }
      EXPECT_EQ(ints[0][0], ints[1][0]) << "topk_ids";
      ASSERT_EQ(weights[0].size(), weights[1].size());
      EXPECT_EQ(std::memcmp(weights[0].data(), weights[1].data(), weights[0].size() * 4), 0)
          << "topk_weights differ in bits";
      EXPECT_EQ(ints[0][4], ints[1][4]) << "num_tiles";
      EXPECT_EQ(ints[0][3], ints[1][3]) << "tile_expert";
      EXPECT_EQ(ints[0][2], ints[1][2]) << "row_of";
      EXPECT_EQ(ints[0][1], ints[1][1]) << "row_token";
      ++cases;
    }
  }
  EXPECT_EQ(cases, 8 + 8 + 8 + 8 + 4);
  // Outside its sizes it refuses rather than launching.
  cuda::MoeRouteArgs r;
  r.num_tokens = 9;
  r.num_experts = 32;
  r.top_k = 2;
  cuda::MoeAlignArgs a;
  a.num_tokens = 9;
  a.top_k = 2;
  a.num_experts = 32;
  a.block_m = 16;
  a.max_tiles = 64;
  EXPECT_EQ(cuda::launchMoeRouteAlign(r, a, st).code(), StatusCode::kInvalidArgument);
}

// [TAG_MOE_ALIGN_RANGES] The block kernel (steps above 32 assignments: prefill) against the CPU
// statement of the layout: expert e's rows start at the sum of the padded row counts of the experts
// before it, an assignment's row is its expert's start + the earlier assignments of its expert in
// (token, k) order, padding rows hold -1, tiles name their expert then -1. Random ids with skewed
// experts and invalid ones, sizes that do not divide among the 32 warps, up to a 128k-token step;
// with the workspace, steps of >= kMoeAlignMultiBlockMin assignments take the multi-block kernels
// [TAG_MOE_ALIGN_MULTIBLOCK] and must write the same.
TEST_F(GpuLlmOps, MoeAlignBlockKernelMatchesTheCpuLayout) {
  cudaStream_t st = dynamic_cast<cuda::CudaBackend&>(gpu()).stream();
  struct Case { int64_t t; int32_t k, ne, bm; };
  for (const Case c : {Case{9, 4, 32, 16}, Case{250, 4, 32, 16}, Case{1000, 4, 128, 16},
                       Case{2049, 4, 32, 64}, Case{16384, 4, 32, 16}, Case{8191, 4, 128, 16},
                       Case{777, 8, 256, 64}, Case{1024, 4, 32, 16}, Case{32768, 4, 128, 16},
                       Case{131072, 4, 32, 16}, Case{40000, 4, 128, 64}}) {
    SCOPED_TRACE("T=" + std::to_string(c.t) + " k=" + std::to_string(c.k) + " E=" +
                 std::to_string(c.ne) + " bm=" + std::to_string(c.bm));
    const int64_t n = c.t * c.k;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::uniform_int_distribution<int32_t> d(0, c.ne - 1), bad(0, 49);
    for (auto& x : ids) {
      x = d(rng_);
      if (x % 3 == 0) x = d(rng_) % std::max(1, c.ne / 4);  // skew: a few experts get more rows
      const int32_t b = bad(rng_);
      if (b == 0) x = -1;
      if (b == 1) x = c.ne + 1;
    }
    // The CPU statement.
    std::vector<int64_t> cnt(static_cast<size_t>(c.ne), 0), start(static_cast<size_t>(c.ne), 0);
    for (int32_t x : ids)
      if (x >= 0 && x < c.ne) ++cnt[static_cast<size_t>(x)];
    const int32_t max_tiles = static_cast<int32_t>(cuda::moeAlignMaxTiles(n, c.ne, c.bm)) + 2;
    std::vector<int32_t> want_te(static_cast<size_t>(max_tiles), -1);
    int64_t row = 0, tile = 0;
    for (int32_t e = 0; e < c.ne; ++e) {
      start[static_cast<size_t>(e)] = row;
      const int64_t tiles = (cnt[static_cast<size_t>(e)] + c.bm - 1) / c.bm;
      for (int64_t x = 0; x < tiles; ++x) want_te[static_cast<size_t>(tile + x)] = e;
      tile += tiles;
      row += tiles * c.bm;
    }
    std::vector<int32_t> want_rt(static_cast<size_t>(row), -1), want_ro(static_cast<size_t>(n), -1);
    std::vector<int64_t> seen(static_cast<size_t>(c.ne), 0);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t e = ids[static_cast<size_t>(i)];
      if (e < 0 || e >= c.ne) continue;
      const int64_t r = start[static_cast<size_t>(e)] + seen[static_cast<size_t>(e)]++;
      want_ro[static_cast<size_t>(i)] = static_cast<int32_t>(r);
      want_rt[static_cast<size_t>(r)] = static_cast<int32_t>(i / c.k);
    }
    // The GPU: the one-block kernel, then (from kMoeAlignMultiBlockMin assignments) the
    // multi-block kernels [TAG_MOE_ALIGN_MULTIBLOCK].
    auto dids = uploadI32(gpu(), {n}, ids);
    auto counts_ws = allocate(gpu(), DType::kI32,
                              {int64_t{cuda::kMoeAlignMaxBlocks} * cuda::kMoeAlignMaxExperts});
    for (const bool multi : {false, true}) {
      SCOPED_TRACE(multi ? "multi-block" : "one block");
      auto rt = allocate(gpu(), DType::kI32, {static_cast<int64_t>(max_tiles) * c.bm});
      auto ro = allocate(gpu(), DType::kI32, {n});
      auto te = allocate(gpu(), DType::kI32, {max_tiles});
      auto nt = allocate(gpu(), DType::kI32, {1});
      for (auto* v : {&rt, &ro, &te, &nt})  // 0x5A5A5A5A: not -1 (poison()'s 0xFF bytes would be)
        ASSERT_EQ(cudaMemset(v->view.data, 0x5A, v->view.bytes()), cudaSuccess);
      cuda::MoeAlignArgs a;
      a.topk_ids = dids.view.as<int32_t>();
      a.row_token = rt.view.as<int32_t>();
      a.row_of = ro.view.as<int32_t>();
      a.tile_expert = te.view.as<int32_t>();
      a.num_tiles = nt.view.as<int32_t>();
      a.num_tokens = c.t;
      a.top_k = c.k;
      a.num_experts = c.ne;
      a.block_m = c.bm;
      a.max_tiles = max_tiles;
      if (multi) {
        ASSERT_EQ(cudaMemset(counts_ws.view.data, 0x5A, counts_ws.view.bytes()), cudaSuccess);
        a.block_counts = counts_ws.view.as<int32_t>();
      }
      ASSERT_TRUE(cuda::launchMoeAlign(a, st).isOk());
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      auto i32 = [&](const OwnedTensor& t) {
        std::vector<int32_t> v(static_cast<size_t>(t.view.numel()));
        EXPECT_EQ(cudaMemcpy(v.data(), t.view.data, v.size() * 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        return v;
      };
      EXPECT_EQ(i32(nt)[0], static_cast<int32_t>(tile)) << "num_tiles";
      EXPECT_EQ(i32(te), want_te) << "tile_expert";
      EXPECT_EQ(i32(ro), want_ro) << "row_of";
      const auto got_rt = i32(rt);
      EXPECT_EQ(std::vector<int32_t>(got_rt.begin(), got_rt.begin() + row), want_rt) << "row_token";
    }
  }
}

// ---- experts -------------------------------------------------------------------------------------

struct MoeCase {
  int64_t t, h, inter, e;
  int32_t k;
  bool big_scales = false;  // some scale bytes > 128: the decode kernel's fallback
};

TEST_F(GpuLlmOps, MoeExpertsMatchCpuMxfp4AndBf16) {
  // T <= 24 per expert on average takes the decode kernel (MXFP4, block_m 16; 8-row token tile
  // when T <= 8), larger T the tiled kernel; bf16 experts always the tiled one.
  for (MoeCase c :
       {MoeCase{1, 2880, 2880, 32, 4}, MoeCase{37, 288, 160, 4, 2}, MoeCase{200, 2880, 2880, 32, 4},
        MoeCase{1000, 288, 160, 8, 4}, MoeCase{64, 96, 32, 8, 4}, MoeCase{6, 2880, 2880, 32, 4},
        MoeCase{20, 2880, 2880, 32, 4}, MoeCase{150, 2880, 2880, 32, 4}, MoeCase{5, 320, 96, 3, 2},
        MoeCase{3, 288, 160, 4, 2, true}}) {
    SCOPED_TRACE("T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) +
                 " I=" + std::to_string(c.inter) + " E=" + std::to_string(c.e));
    reserve(std::max<int64_t>(c.t, 64), 8, 8, 8, static_cast<int32_t>(c.h),
            static_cast<int32_t>(c.inter), static_cast<int32_t>(c.e), c.k);
    // MXFP4 weights: random codes, scales so that |w| ~ 1/sqrt(in).
    auto mx = [&](int64_t out, int64_t in, std::vector<uint8_t>& codes, std::vector<uint8_t>& sc) {
      const int64_t g = in / 32;
      codes.resize(static_cast<size_t>(c.e * out * g * 16));
      sc.resize(static_cast<size_t>(c.e * out * g));
      std::uniform_int_distribution<int> byte(0, 255);
      for (auto& b : codes) b = static_cast<uint8_t>(byte(rng_));
      const int base = 127 + static_cast<int>(std::lround(std::log2(1.0 / (std::sqrt(double(in)) * 2.93))));
      std::uniform_int_distribution<int> jitter(-1, 1);
      for (auto& s : sc) s = static_cast<uint8_t>(base + jitter(rng_));
      if (c.big_scales) {
        for (size_t i = 0; i < sc.size(); i += 7) sc[i] = 130;  // |w| up to 6 * 8
      }
    };
    std::vector<uint8_t> c1, s1, c2, s2;
    mx(2 * c.inter, c.h, c1, s1);
    mx(c.h, c.inter, c2, s2);
    std::vector<float> w1(static_cast<size_t>(c.e * 2 * c.inter * c.h)), w2(static_cast<size_t>(c.e * c.h * c.inter));
    dequantizeMxfp4(c1.data(), s1.data(), c.e * 2 * c.inter, c.h / 32, w1.data());
    dequantizeMxfp4(c2.data(), s2.data(), c.e * c.h, c.inter / 32, w2.data());
    auto x = randomBf16(static_cast<size_t>(c.t * c.h), rng_, -2.f, 2.f);
    auto b1 = randomBf16(static_cast<size_t>(c.e * 2 * c.inter), rng_, -0.1f, 0.1f);
    auto b2 = randomBf16(static_cast<size_t>(c.e * c.h), rng_, -0.1f, 0.1f);
    std::vector<int32_t> ids;
    std::vector<float> wts;
    for (int64_t i = 0; i < c.t; ++i) {
      std::vector<int32_t> perm(static_cast<size_t>(c.e));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng_);
      float sum = 0;
      std::vector<float> w(static_cast<size_t>(c.k));
      for (auto& v : w) sum += (v = std::uniform_real_distribution<float>(0.1f, 1.f)(rng_));
      for (int32_t j = 0; j < c.k; ++j) {
        ids.push_back(perm[static_cast<size_t>(j)]);
        wts.push_back(w[static_cast<size_t>(j)] / sum);
      }
    }
    MoeExpertsParams p{static_cast<int32_t>(c.e), c.k, static_cast<int32_t>(c.h),
                       static_cast<int32_t>(c.inter), 7.f, 1.702f};
    // CPU reference: dense f32.
    auto cx = upload(cpu(), DType::kF32, {c.t, c.h}, x);
    auto cw1 = upload(cpu(), DType::kF32, {c.e, 2 * c.inter, c.h}, w1);
    auto cw2 = upload(cpu(), DType::kF32, {c.e, c.h, c.inter}, w2);
    auto cb1 = upload(cpu(), DType::kF32, {c.e, 2 * c.inter}, b1);
    auto cb2 = upload(cpu(), DType::kF32, {c.e, c.h}, b2);
    auto cid = uploadI32(cpu(), {c.t, c.k}, ids);
    auto cwt = upload(cpu(), DType::kF32, {c.t, c.k}, wts);
    auto cout = allocate(cpu(), DType::kF32, {c.t, c.h});
    const auto [ce1, ce2] = denseExperts(cw1.view, cw2.view, c.e, c.inter, c.h);
    cops_->moeExperts(cx.view, cid.view, cwt.view, ce1, cb1.view, ce2, cb2.view, cout.view, p);
    auto ref = download(cpu(), cout.view);
    // GPU, MXFP4 resident and bf16 dense.
    auto gx = upload(gpu(), DType::kBF16, {c.t, c.h}, x);
    auto gb1 = upload(gpu(), DType::kBF16, {c.e, 2 * c.inter}, b1);
    auto gb2 = upload(gpu(), DType::kBF16, {c.e, c.h}, b2);
    auto gid = uploadI32(gpu(), {c.t, c.k}, ids);
    auto gwt = upload(gpu(), DType::kF32, {c.t, c.k}, wts);
    auto m1 = gops_->uploadMxfp4Experts(c1.data(), s1.data(), c.e, 2 * c.inter, c.h);
    auto m2 = gops_->uploadMxfp4Experts(c2.data(), s2.data(), c.e, c.h, c.inter);
    ASSERT_TRUE(m1.isOk() && m2.isOk()) << m1.status().toString() << m2.status().toString();
    auto gw1 = upload(gpu(), DType::kBF16, {c.e, 2 * c.inter, c.h}, w1);
    auto gw2 = upload(gpu(), DType::kBF16, {c.e, c.h, c.inter}, w2);
    const auto [d1, d2] = denseExperts(gw1.view, gw2.view, c.e, c.inter, c.h);
    std::vector<std::vector<float>> got;
    for (int variant = 0; variant < 2; ++variant) {
      auto gout = allocate(gpu(), DType::kBF16, {c.t, c.h});
      poison(gpu(), gout.view);
      if (variant == 0) {
        gops_->moeExperts(gx.view, gid.view, gwt.view, *m1, gb1.view, *m2, gb2.view, gout.view, p);
      } else {
        gops_->moeExperts(gx.view, gid.view, gwt.view, d1, gb1.view, d2, gb2.view, gout.view, p);
      }
      got.push_back(download(gpu(), gout.view));
      const double err = relErr(got.back(), ref);
      EXPECT_LT(err, 1e-2) << (variant == 0 ? "mxfp4" : "bf16");
      double worst_cos = 1;
      for (int64_t r = 0; r < c.t; ++r) worst_cos = std::min(worst_cos, rowCosine(got.back(), ref, r, c.h));
      EXPECT_GT(worst_cos, 0.9995) << (variant == 0 ? "mxfp4" : "bf16");
      std::cout << "[ experts ] T=" << c.t << " H=" << c.h << " I=" << c.inter << " E=" << c.e
                << (variant == 0 ? " mxfp4" : " bf16 ") << " rel_l2=" << err
                << " worst_row_cos=" << worst_cos << "\n";
    }
    // Same bf16 weight values, same K order: the two formats agree bit for bit.
    EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)), 0)
        << "MXFP4-resident and bf16 experts differ";
    // [TAG_ATTN_F16] The same in fp16 (scales <= 128 only): x, biases, the SwiGLU output, the
    // expert outputs and the combine round to 10 significand bits instead of 7, so the error is a
    // fraction of bf16's (a bf16 rounding left anywhere would not be), and MXFP4 dequantized to fp16
    // equals the same weights uploaded as fp16 bit for bit.
    if (!c.big_scales) {
      auto hx = upload(gpu(), DType::kF16, {c.t, c.h}, x);
      auto hb1 = upload(gpu(), DType::kF16, {c.e, 2 * c.inter}, b1);
      auto hb2 = upload(gpu(), DType::kF16, {c.e, c.h}, b2);
      auto hw1 = upload(gpu(), DType::kF16, {c.e, 2 * c.inter, c.h}, w1);
      auto hw2 = upload(gpu(), DType::kF16, {c.e, c.h, c.inter}, w2);
      const auto [h1, h2] = denseExperts(hw1.view, hw2.view, c.e, c.inter, c.h);
      std::vector<std::vector<float>> hg;
      for (int variant = 0; variant < 2; ++variant) {
        auto hout = allocate(gpu(), DType::kF16, {c.t, c.h});
        poison(gpu(), hout.view);
        if (variant == 0) {
          gops_->moeExperts(hx.view, gid.view, gwt.view, *m1, hb1.view, *m2, hb2.view, hout.view, p);
        } else {
          gops_->moeExperts(hx.view, gid.view, gwt.view, h1, hb1.view, h2, hb2.view, hout.view, p);
        }
        hg.push_back(download(gpu(), hout.view));
        const double err = relErr(hg.back(), ref);
        const double err_bf16 = relErr(got[static_cast<size_t>(variant)], ref);
        EXPECT_LT(err, err_bf16 / 3) << (variant == 0 ? "mxfp4 f16" : "dense f16");
        std::cout << "[ experts ] T=" << c.t << " H=" << c.h << " I=" << c.inter << " E=" << c.e
                  << (variant == 0 ? " mxfp4 f16" : " dense f16") << " rel_l2=" << err
                  << " (bf16 " << err_bf16 << ")\n";
      }
      EXPECT_EQ(std::memcmp(hg[0].data(), hg[1].data(), hg[0].size() * sizeof(float)), 0)
          << "MXFP4-resident and dense fp16 experts differ";
    }
    // Batch invariance: row 0 alone (the smallest tile) equals row 0 of the batch — bit for bit
    // when the batch is in the decode regime too (block_m 16: the same K slicing), to f32
    // rounding when it takes the prefill tiles (K in one chain) [TAG_MOE_K_SLICES].
    if (c.t > 1) {
      auto gx1 = upload(gpu(), DType::kBF16, {1, c.h}, std::vector<float>(x.begin(), x.begin() + c.h));
      auto gid1 = uploadI32(gpu(), {1, c.k}, std::vector<int32_t>(ids.begin(), ids.begin() + c.k));
      auto gwt1 = upload(gpu(), DType::kF32, {1, c.k}, std::vector<float>(wts.begin(), wts.begin() + c.k));
      auto gout1 = allocate(gpu(), DType::kBF16, {1, c.h});
      gops_->moeExperts(gx1.view, gid1.view, gwt1.view, *m1, gb1.view, *m2, gb2.view, gout1.view, p);
      auto one = download(gpu(), gout1.view);
      const bool same_regime =
          cuda::moeGemmBlockM(c.t * c.k, static_cast<int32_t>(c.e)) == 16 || cuda::moeKSlices() == 1;
      if (same_regime) {
        EXPECT_EQ(std::memcmp(one.data(), got[0].data(), one.size() * sizeof(float)), 0)
            << "row 0 alone differs from row 0 batched";
      } else {
        const std::vector<float> row0(got[0].begin(), got[0].begin() + c.h);
        EXPECT_LT(relErr(one, row0), 4e-3) << "row 0 alone vs row 0 batched (other regime)";
      }
    }
  }
}

// [TAG_MOE_K_SLICES] For each K slice count: in the decode regime (block_m 16) the decode
// kernel (MXFP4) and the tiled kernel (bf16 experts with the same values) give the same bits, and
// a row alone equals the row in a decode-sized batch; a slice count changes the result only by
// f32 rounding (vs one chain); with one slice a row's bits are also the same in a prefill-sized
// step (the one-chain contract). K = 2880 (45 tiles: 12 + 12 + 12 + 9 at 4 slices) and the odd
// K of the tiny checkpoints (288: 5 tiles, 160: 3).
TEST_F(GpuLlmOps, MoeKSlicesKeepTheDecodeRegimeBitExact) {
  struct Shape {
    int64_t h, inter, e;
    int32_t k;
  };
  for (Shape sh : {Shape{2880, 2880, 8, 4}, Shape{288, 160, 8, 4}}) {
    SCOPED_TRACE("H=" + std::to_string(sh.h) + " I=" + std::to_string(sh.inter));
    constexpr int64_t kMaxT = 100;  // 100 x 4 / 8 = 50 rows per expert: block_m 64
    reserve(kMaxT, 8, 8, 8, static_cast<int32_t>(sh.h), static_cast<int32_t>(sh.inter),
            static_cast<int32_t>(sh.e), sh.k);
    const RandomExperts ex = randomExperts(sh.e, sh.h, sh.inter);
    const auto x = randomBf16(static_cast<size_t>(kMaxT * sh.h), rng_, -2.f, 2.f);
    std::vector<int32_t> ids;
    std::vector<float> wts;
    randomRouting(kMaxT, sh.e, sh.k, [&] { return 1.f / static_cast<float>(sh.k); }, ids, wts);
    MoeExpertsParams p{static_cast<int32_t>(sh.e), sh.k, static_cast<int32_t>(sh.h),
                       static_cast<int32_t>(sh.inter), 7.f, 1.702f};
    // The first t tokens through the MXFP4 (mx) or bf16 experts.
    auto run = [&](int64_t t, bool mxfp4) { return runExperts(ex, p, t, x, ids, wts, mxfp4); };
    const std::vector<int64_t> decode_ts = {1, 5, 9, 16, 40};
    std::map<int64_t, std::vector<float>> one_chain;  // slices = 1, per T
    for (int slices : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE("slices " + std::to_string(slices));
      cuda::setMoeKSlices(slices);
      std::vector<float> alone;
      bool any_diff = false;  // vs one chain, over all T
      for (int64_t t : decode_ts) {
        SCOPED_TRACE("T=" + std::to_string(t));
        ASSERT_EQ(cuda::moeGemmBlockM(t * sh.k, static_cast<int32_t>(sh.e)), 16);
        const auto mx_out = run(t, true);
        const auto bf_out = run(t, false);
        EXPECT_EQ(std::memcmp(mx_out.data(), bf_out.data(), mx_out.size() * sizeof(float)), 0)
            << "decode kernel (MXFP4) and tiled kernel (bf16) differ";
        if (t == 1) alone = mx_out;
        EXPECT_EQ(std::memcmp(alone.data(), mx_out.data(), alone.size() * sizeof(float)), 0)
            << "row 0 alone differs from row 0 of a decode-sized batch";
        if (slices == 1) {
          one_chain[t] = mx_out;
          // [TAG_MOE_L2_PREFETCH] Asking L2 for the weights ahead changes no arithmetic.
          cuda::setMoeL2Prefetch(8);
          const auto pf_out = run(t, true);
          cuda::setMoeL2Prefetch(cuda::kMoeDefaultL2Prefetch);
          EXPECT_EQ(std::memcmp(pf_out.data(), mx_out.data(), mx_out.size() * sizeof(float)), 0)
              << "the decode kernel with the L2 prefetch differs";
        } else {
          const double err = relErr(mx_out, one_chain[t]);
          EXPECT_LT(err, 4e-3) << "slicing changed more than rounding";
          any_diff = any_diff || err > 0;
        }
      }
      // f32 reassociation moves a bf16 output in roughly 1 of 2,500 elements at K = 2880: over
      // these T (~290k outputs) some must move, or the slice count is not reaching the kernels.
      // (Not asserted at the tiny K, where few elements may move at all.)
      if (slices > 1 && sh.h == 2880) {
        EXPECT_TRUE(any_diff) << "the slice count changed nothing";
      }
      // A prefill-sized step (block_m 64): one chain there.
      ASSERT_EQ(cuda::moeGemmBlockM(kMaxT * sh.k, static_cast<int32_t>(sh.e)), 64);
      const auto big = run(kMaxT, true);
      const std::vector<float> row0(big.begin(), big.begin() + sh.h);
      if (slices == 1) {
        EXPECT_EQ(std::memcmp(row0.data(), alone.data(), alone.size() * sizeof(float)), 0)
            << "one chain: row 0 in a prefill-sized step differs from row 0 alone";
      } else {
        EXPECT_LT(relErr(alone, row0), 4e-3);
      }
    }
    cuda::setMoeKSlices(cuda::kMoeDefaultKSlices);
  }
}

// Every shape of the decode kernel (setMoeDecodeVariant 0: the default, 1: depth 4 throughout,
// 5: without the branch-free steady loop) gives the tiled kernel's bits (the same weights as bf16
// dense experts) at every block_m 16 size (8- and 16-row token tiles, a tile's rows 1..16), at
// K = 2880 and the tiny checkpoints' odd K (288: 4.5 K tiles, 160: 2.5), in one chain and in 2
// and 3 K slices (clusters summing the slices).
TEST_F(GpuLlmOps, MoeDecodeKernelShapesEqualTheTiledKernel) {
  struct Shape {
    int64_t h, inter, e;
    int32_t k;
  };
  for (Shape sh : {Shape{2880, 2880, 32, 4}, Shape{288, 160, 8, 4}, Shape{160, 64, 3, 2}}) {
    SCOPED_TRACE("H=" + std::to_string(sh.h) + " I=" + std::to_string(sh.inter));
    constexpr int64_t kMaxT = 40;
    reserve(kMaxT, 8, 8, 8, static_cast<int32_t>(sh.h), static_cast<int32_t>(sh.inter),
            static_cast<int32_t>(sh.e), sh.k);
    const RandomExperts ex = randomExperts(sh.e, sh.h, sh.inter);
    const auto x = randomBf16(static_cast<size_t>(kMaxT * sh.h), rng_, -2.f, 2.f);
    std::vector<int32_t> ids;
    std::vector<float> wts;
    randomRouting(kMaxT, sh.e, sh.k,
                  [&] { return std::uniform_real_distribution<float>(0.1f, 0.4f)(rng_); }, ids, wts);
    MoeExpertsParams p{static_cast<int32_t>(sh.e), sh.k, static_cast<int32_t>(sh.h),
                       static_cast<int32_t>(sh.inter), 7.f, 1.702f};
    auto run = [&](int64_t t, bool mxfp4) { return runExperts(ex, p, t, x, ids, wts, mxfp4); };
    for (int slices : {1, 2, 3}) {
      SCOPED_TRACE("slices " + std::to_string(slices));
      cuda::setMoeKSlices(slices);
      for (int64_t t : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{12}, int64_t{40}}) {
        if (cuda::moeGemmBlockM(t * sh.k, static_cast<int32_t>(sh.e)) != 16) continue;
        SCOPED_TRACE("T=" + std::to_string(t));
        const auto tiled = run(t, false);
        for (int v : {0, 1, 5}) {
          SCOPED_TRACE("decode variant " + std::to_string(v));
          cuda::setMoeDecodeVariant(v);
          const auto got = run(t, true);
          EXPECT_EQ(std::memcmp(tiled.data(), got.data(), tiled.size() * sizeof(float)), 0)
              << "the decode kernel differs from the tiled kernel";
        }
        cuda::setMoeDecodeVariant(0);
      }
    }
    cuda::setMoeKSlices(cuda::kMoeDefaultKSlices);
  }
  cuda::setMoeDecodeVariant(0);
}

// [TAG_MOE_WIDE] The wide kernel (MXFP4, block_m 64 tiles, weights as the mma A operand, token
// rows streamed through shared memory) gives the bits of the tiled kernel: the same weights as
// bf16 dense experts (always the tiled kernel) and the MXFP4 experts with the wide kernel off must
// equal it, for token counts from a few rows per expert (most n8 tiles empty) to tiles that are
// full or spill into a second tile of the same expert, at K = 2880 and the tiny checkpoints' odd K
// (288: 4.5 K tiles, 160: 2.5), for every wide-kernel shape.
TEST_F(GpuLlmOps, MoeWideKernelEqualsTheTiledKernel) {
  struct Shape {
    int64_t h, inter, e;
    int32_t k;
    std::vector<int64_t> ts;
  };
  for (const Shape& sh : {Shape{2880, 2880, 32, 4, {3, 40, 150, 300, 700}},
                          Shape{288, 160, 8, 4, {1, 9, 37, 100, 150}}}) {
    const int64_t tmax = *std::max_element(sh.ts.begin(), sh.ts.end());
    reserve(tmax, 8, 8, 8, static_cast<int32_t>(sh.h), static_cast<int32_t>(sh.inter),
            static_cast<int32_t>(sh.e), sh.k);
    const RandomExperts ex = randomExperts(sh.e, sh.h, sh.inter);
    MoeExpertsParams p{static_cast<int32_t>(sh.e), sh.k, static_cast<int32_t>(sh.h),
                       static_cast<int32_t>(sh.inter), 7.f, 1.702f};
    for (int64_t t : sh.ts) {
      SCOPED_TRACE("T=" + std::to_string(t) + " H=" + std::to_string(sh.h));
      const auto x = randomBf16(static_cast<size_t>(t * sh.h), rng_, -2.f, 2.f);
      std::vector<int32_t> ids;
      std::vector<float> wts;
      // Skewed routing: expert 0 in every token's top-k (its tile overflows into more tiles),
      // the rest drawn at random.
      for (int64_t i = 0; i < t; ++i) {
        std::vector<int32_t> perm(static_cast<size_t>(sh.e - 1));
        std::iota(perm.begin(), perm.end(), 1);
        std::shuffle(perm.begin(), perm.end(), rng_);
        ids.push_back(0);
        for (int32_t j = 1; j < sh.k; ++j) ids.push_back(perm[static_cast<size_t>(j)]);
        for (int32_t j = 0; j < sh.k; ++j) wts.push_back(std::uniform_real_distribution<float>(0.1f, 0.4f)(rng_));
      }
      auto run = [&](bool mxfp4) { return runExperts(ex, p, t, x, ids, wts, mxfp4); };
      cuda::setMoeBlockMOverride(64);
      const auto dense = run(false);  // the tiled kernel at block_m 64
      cuda::setMoeWideVariant(-1);
      const auto tiled = run(true);
      EXPECT_EQ(std::memcmp(dense.data(), tiled.data(), dense.size() * sizeof(float)), 0)
          << "MXFP4 and bf16 experts differ in the tiled kernel";
      for (int v = 0; v < 4; ++v) {
        SCOPED_TRACE("wide variant " + std::to_string(v));
        cuda::setMoeWideVariant(v);
        const auto wide = run(true);
        EXPECT_EQ(std::memcmp(dense.data(), wide.data(), dense.size() * sizeof(float)), 0)
            << "the wide kernel differs from the tiled kernel";
      }
      cuda::setMoeBlockMOverride(0);
      // The default choice (block_m 16 or 64 by the average rows per expert): the same bits,
      // one K chain either way.
      cuda::setMoeWideVariant(0);
      const auto chosen = run(true);
      EXPECT_EQ(std::memcmp(dense.data(), chosen.data(), dense.size() * sizeof(float)), 0)
          << "the default tile choice differs from block_m 64";
    }
  }
  cuda::setMoeBlockMOverride(0);
  cuda::setMoeWideVariant(0);
}

// ---- gather / token copy ------------------------------------------------------------------------

TEST_F(GpuLlmOps, GatherRowsAndCopyTokens) {
  auto in = randomBf16(97 * 40, rng_);
  auto gin = upload(gpu(), DType::kBF16, {97, 40}, in);
  auto cin = upload(cpu(), DType::kF32, {97, 40}, in);
  std::vector<int32_t> rows{96, 0, 5, 5, 50};
  auto gr = uploadI32(gpu(), {5}, rows);
  auto cr = uploadI32(cpu(), {5}, rows);
  auto go = allocate(gpu(), DType::kBF16, {5, 40});
  auto co = allocate(cpu(), DType::kF32, {5, 40});
  poison(gpu(), go.view);
  gops_->gatherRows(gin.view, gr.view, go.view);
  cops_->gatherRows(cin.view, cr.view, co.view);
  expectClose(download(gpu(), go.view), download(cpu(), co.view), 0, 0, "gather");
  std::vector<int32_t> src{11, 22, 33}, ids{1, 2, 3, 4, 5}, pairs{4, 0, 0, 2, 2, 1};
  auto gs = uploadI32(gpu(), {3}, src);
  auto gi = uploadI32(gpu(), {5}, ids);
  auto gp = uploadI32(gpu(), {3, 2}, pairs);
  gops_->copyTokens(gs.view, gp.view, gi.view);
  EXPECT_EQ(download(gpu(), gi.view), (std::vector<float>{33, 2, 22, 4, 11}));
}

// ---- sampling ------------------------------------------------------------------------------------

TEST_F(GpuLlmOps, GreedyIsTheCpuArgmax) {
  const int64_t v = 201088, r = 37;
  reserve(64, 8, 8, 8, 64, 64, 4, 2, r);
  std::vector<float> logits(static_cast<size_t>(v * r));
  std::normal_distribution<float> nd(0.f, 3.f);
  for (auto& x : logits) x = nd(rng_);
  // Row 1: a tie between two maxima (lower id must win); row 2: NaNs; row 3: all -inf but one.
  logits[static_cast<size_t>(v + 100)] = 50.f;
  logits[static_cast<size_t>(v + 99999)] = 50.f;
  for (int i = 0; i < 1000; ++i) logits[static_cast<size_t>(2 * v + i * 7)] = NAN;
  logits[static_cast<size_t>(2 * v + 7)] = 1e30f;  // NaN neighbours never win
  std::fill(logits.begin() + 3 * v, logits.begin() + 4 * v, -INFINITY);
  logits[static_cast<size_t>(3 * v + 123456)] = -5.f;
  auto gl = upload(gpu(), DType::kF32, {r, v}, logits);
  std::vector<SampleRow> rows;
  for (int i = 0; i < r; ++i) rows.push_back(SampleRow{(i * 5) % static_cast<int>(r), 0, SamplingParams{}});
  auto out = allocate(gpu(), DType::kI32, {r});
  gops_->sample(gl.view, rows, out.view);
  auto got = download(gpu(), out.view);
  for (int i = 0; i < r; ++i) {
    const int row = rows[static_cast<size_t>(i)].row;
    std::span<const float> lr(logits.data() + static_cast<int64_t>(row) * v, static_cast<size_t>(v));
    EXPECT_EQ(static_cast<int32_t>(got[static_cast<size_t>(i)]), argmaxToken(lr)) << "row " << row;
  }
}

// Temperature / top-k / top-p draws: deterministic per (seed, counter), only from the kept set,
// and with the CPU sampler's distribution (4000 draws per setting, max |freq - p| <= 0.03).
TEST_F(GpuLlmOps, SamplingFollowsTheCpuDistribution) {
  const int64_t v = 50, draws = 4000;
  reserve(64, 8, 8, 8, 64, 64, 4, 2, draws);
  std::vector<float> row(static_cast<size_t>(v));
  std::normal_distribution<float> nd(0.f, 1.5f);
  for (auto& x : row) x = nd(rng_);
  row[3] = row[4];  // a tie
  auto gl = upload(gpu(), DType::kF32, {1, v}, row);
  Sampler cpu_sampler;
  struct Setting { float t; int32_t k; float p; float m = 0.f; };
  for (Setting s : {Setting{1.f, 0, 1.f}, Setting{0.7f, 5, 1.f}, Setting{1.3f, 0, 0.8f},
                    Setting{1.f, 10, 0.6f}, Setting{2.f, 1, 1.f}, Setting{1.f, 0, 1.f, 0.1f},
                    Setting{1.5f, 12, 0.9f, 0.05f}, Setting{0.8f, 0, 0.7f, 0.3f}}) {
    SCOPED_TRACE("T=" + std::to_string(s.t) + " k=" + std::to_string(s.k) + " p=" + std::to_string(s.p) +
                 " min_p=" + std::to_string(s.m));
    SamplingParams sp;
    sp.temperature = s.t;
    sp.top_k = s.k;
    sp.top_p = s.p;
    sp.min_p = s.m;
    sp.seed = 42;
    std::vector<SampleRow> rows;
    for (int64_t i = 0; i < draws; ++i) rows.push_back(SampleRow{0, static_cast<uint64_t>(i), sp});
    auto out = allocate(gpu(), DType::kI32, {draws});
    gops_->sample(gl.view, rows, out.view);
    auto got = download(gpu(), out.view);
    auto out2 = allocate(gpu(), DType::kI32, {draws});
    gops_->sample(gl.view, rows, out2.view);
    EXPECT_EQ(download(gpu(), out2.view), got) << "not deterministic";
    const auto& dist = cpu_sampler.distribution(row, sp);
    std::map<int32_t, double> want;
    for (const auto& [id, pr] : dist) want[id] = pr;
    std::map<int32_t, double> freq;
    for (float g : got) freq[static_cast<int32_t>(g)] += 1.0 / draws;
    for (const auto& [id, f] : freq) {
      EXPECT_TRUE(want.count(id)) << "drew token " << id << " outside the kept set";
    }
    double worst = 0;
    for (const auto& [id, pr] : want) worst = std::max(worst, std::abs(freq[id] - pr));
    EXPECT_LT(worst, 0.03) << "empirical distribution off by " << worst;
    std::cout << "[ sample ] T=" << s.t << " k=" << s.k << " p=" << s.p << " min_p=" << s.m
              << " kept=" << want.size()
              << " max|freq-p|=" << worst << "\n";
  }
}

// Structured outputs [TAG_TOKEN_MASK]: greedy rows with token bitmasks pick the CPU's masked
// argmax (random masks of 1, ~5%, ~50% and all-but-one allowed ids; a row whose allowed logits
// are all -inf or NaN gets the lowest allowed id), over the full o200k width.
TEST_F(GpuLlmOps, MaskedGreedyIsTheCpuMaskedArgmax) {
  const int64_t v = 201088, r = 17;
  const size_t words = static_cast<size_t>((v + 31) / 32);
  reserve(64, 8, 8, 8, 64, 64, 4, 2, r);
  std::vector<float> logits(static_cast<size_t>(v * r));
  std::normal_distribution<float> nd(0.f, 3.f);
  for (auto& x : logits) x = nd(rng_);
  std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(r), std::vector<uint32_t>(words, 0));
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t i = 0; i < r; ++i) {
    auto& m = masks[static_cast<size_t>(i)];
    const double density = i % 4 == 0 ? 0.0 : i % 4 == 1 ? 0.05 : i % 4 == 2 ? 0.5 : 0.999;
    for (int64_t id = 0; id < v; ++id) {
      if (u(rng_) < density) m[static_cast<size_t>(id / 32)] |= 1u << (id % 32);
    }
    const int64_t one = static_cast<int64_t>(u(rng_) * static_cast<double>(v));
    m[static_cast<size_t>(one / 32)] |= 1u << (one % 32);  // at least one allowed id
  }
  // Row 5: every allowed logit -inf or NaN.
  for (int64_t id = 0; id < v; ++id) {
    logits[static_cast<size_t>(5 * v + id)] = id % 2 ? -INFINITY : NAN;
  }
  auto gl = upload(gpu(), DType::kF32, {r, v}, logits);
  std::vector<SampleRow> rows;
  for (int i = 0; i < r; ++i) {
    SampleRow sr{i, 0, SamplingParams{}};
    sr.mask = masks[static_cast<size_t>(i)].data();
    rows.push_back(sr);
  }
  auto out = allocate(gpu(), DType::kI32, {r});
  gops_->sample(gl.view, rows, out.view);
  auto got = download(gpu(), out.view);
  for (int i = 0; i < r; ++i) {
    std::vector<float> lr(logits.begin() + i * v, logits.begin() + (i + 1) * v);
    const int32_t first = applyTokenBitmask(lr, masks[static_cast<size_t>(i)].data());
    int32_t want = argmaxToken(lr);
    if (!tokenAllowed(masks[static_cast<size_t>(i)].data(), want)) want = first;
    EXPECT_EQ(static_cast<int32_t>(got[static_cast<size_t>(i)]), want) << "row " << i;
  }
}

// Masked temperature / top-k / top-p draws: never a masked id, and the CPU sampler's
// distribution over the masked logits (4000 draws, max |freq - p| <= 0.03).
TEST_F(GpuLlmOps, MaskedSamplingFollowsTheCpuDistribution) {
  const int64_t v = 97, draws = 4000;
  reserve(64, 8, 8, 8, 64, 64, 4, 2, draws);
  std::vector<float> row(static_cast<size_t>(v));
  std::normal_distribution<float> nd(0.f, 1.5f);
  for (auto& x : row) x = nd(rng_);
  std::vector<uint32_t> mask(static_cast<size_t>((201088 + 31) / 32), 0);
  for (int64_t id = 0; id < v; ++id) {
    if (id % 3 == 0 || id == 40 || id == 96) mask[static_cast<size_t>(id / 32)] |= 1u << (id % 32);
  }
  auto gl = upload(gpu(), DType::kF32, {1, v}, row);
  std::vector<float> masked = row;
  applyTokenBitmask(masked, mask.data());
  Sampler cpu_sampler;
  struct Setting { float t; int32_t k; float p; };
  for (Setting s : {Setting{1.f, 0, 1.f}, Setting{0.8f, 6, 1.f}, Setting{1.2f, 0, 0.7f}}) {
    SCOPED_TRACE("T=" + std::to_string(s.t) + " k=" + std::to_string(s.k) + " p=" + std::to_string(s.p));
    SamplingParams sp;
    sp.temperature = s.t;
    sp.top_k = s.k;
    sp.top_p = s.p;
    sp.seed = 7;
    std::vector<SampleRow> rows;
    for (int64_t i = 0; i < draws; ++i) {
      SampleRow sr{0, static_cast<uint64_t>(i), sp};
      sr.mask = mask.data();
      rows.push_back(sr);
    }
    auto out = allocate(gpu(), DType::kI32, {draws});
    gops_->sample(gl.view, rows, out.view);
    auto got = download(gpu(), out.view);
    const auto& dist = cpu_sampler.distribution(masked, sp);
    std::map<int32_t, double> want;
    for (const auto& [id, pr] : dist) {
      if (pr > 0) want[id] = pr;
    }
    std::map<int32_t, double> freq;
    for (float g : got) {
      const auto id = static_cast<int32_t>(g);
      EXPECT_TRUE(tokenAllowed(mask.data(), id)) << "drew masked token " << id;
      freq[id] += 1.0 / draws;
    }
    double worst = 0;
    for (const auto& [id, pr] : want) worst = std::max(worst, std::abs(freq[id] - pr));
    for (const auto& [id, f] : freq) {
      if (!want.count(id)) worst = std::max(worst, f);
    }
    EXPECT_LT(worst, 0.03) << "empirical distribution off by " << worst;
    std::cout << "[ masked sample ] T=" << s.t << " k=" << s.k << " p=" << s.p
              << " kept=" << want.size() << " max|freq-p|=" << worst << "\n";
  }
}

// ---- sampler state and logprobs [TAG_LLM_SAMPLER_STATE] -----------------------------------------

// One row's sampler state as resetSamplerState takes it.
struct SlotState {
  std::vector<int32_t> prompt, output;
  std::vector<LogitBias> bias;
};
SamplerStateReset resetOf(int32_t slot, const SlotState& st) {
  return SamplerStateReset{slot, st.prompt, st.output, st.bias};
}

std::vector<llm::LlmTokenLogprobs> readLogprobs(Backend& b, const Tensor& t, size_t n) {
  std::vector<llm::LlmTokenLogprobs> out(n);
  b.copyToHost(out.data(), t, n * sizeof(llm::LlmTokenLogprobs));
  (void)b.synchronize();
  return out;
}

void reserveCpu(LlmOps& ops, int32_t seqs) {
  LlmOpsLimits l;
  l.max_seqs = seqs;
  ASSERT_TRUE(ops.reserve(l).isOk());
}

// Greedy rows with logit_bias, repetition / frequency / presence penalties and min_p over five
// steps on the same logits (the penalties move the argmax among a "hot" set as the slots count
// the drawn tokens on the device), a reload mid-way, rows asking for 0, 5 or 20 top logprobs and
// a row without a slot: every id equals the CPU sampler's, every logprob is within 1e-5 of the
// CPU's (raw logits), top lists are identical, and the GPU logits come back unchanged.
TEST_F(GpuLlmOps, SamplerStateGreedyAndLogprobsMatchCpu) {
  const int64_t v = 201088;
  const int32_t r = 12, seqs = 16, steps = 5;
  reserve(64, seqs, 8, 8, 64, 64, 4, 2, r);
  reserveCpu(*cops_, seqs);
  std::vector<float> logits(static_cast<size_t>(v * r));
  std::normal_distribution<float> nd(0.f, 2.f);
  for (auto& x : logits) x = nd(rng_);
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(v) - 1);
  std::vector<std::vector<int32_t>> hot(r);
  for (int32_t i = 0; i < r; ++i) {
    for (int j = 0; j < 8; ++j) {
      const int32_t t = any(rng_);
      hot[static_cast<size_t>(i)].push_back(t);
      logits[static_cast<size_t>(i * v + t)] = 12.f + 0.25f * static_cast<float>(j % 3) + 0.01f * nd(rng_);
    }
  }
  // Row 3: an exact tie at the top (lower id first in greedy and in the top list).
  logits[static_cast<size_t>(3 * v + 7)] = 40.f;
  logits[static_cast<size_t>(3 * v + 70001)] = 40.f;
  std::vector<SlotState> st(static_cast<size_t>(r));
  std::vector<SampleRow> rows(static_cast<size_t>(r));
  std::uniform_real_distribution<float> ub(-5.f, 5.f);
  const float reps[] = {1.f, 1.3f, 0.8f, 1.1f};
  const float freqs[] = {0.f, 0.5f, -0.3f, 2.f, 1.f};
  const float pres[] = {0.f, 1.f, -0.5f};
  const int32_t lps[] = {-1, 0, 5, 20};
  int32_t forced = -1, banned = -1;
  for (int32_t i = 0; i < r; ++i) {
    const auto& h = hot[static_cast<size_t>(i)];
    SlotState& s = st[static_cast<size_t>(i)];
    for (int j = 0; j < 30; ++j) s.prompt.push_back(j % 3 == 0 ? h[static_cast<size_t>(j % 8)] : any(rng_));
    for (int j = 0; j < 5; ++j) s.output.push_back(j % 2 == 0 ? h[static_cast<size_t>(j)] : any(rng_));
    for (int j = 0; j < 10; ++j) s.bias.push_back(LogitBias{j % 2 == 0 ? h[static_cast<size_t>(j % 8)] : any(rng_), ub(rng_)});
    s.bias.push_back(LogitBias{h[0], 1.5f});  // a later entry for the same id wins
    SampleRow& row = rows[static_cast<size_t>(i)];
    row.row = (i * 5) % r;  // distinct rows, not in order
    row.counter = 100 + static_cast<uint64_t>(i);
    SamplingParams& p = row.params;
    p.temperature = 0.f;
    p.repetition_penalty = reps[i % 4];
    p.frequency_penalty = freqs[i % 5];
    p.presence_penalty = pres[i % 3];
    p.min_p = i % 2 == 0 ? 0.2f : 0.f;  // greedy ignores it
    p.logprobs = lps[i % 4];
    p.state_slot = (i * 3) % seqs;
  }
  // The row sampling logits row 0 gets +100 on a cold token (forced); the one sampling row 5
  // gets −100 on its hottest token (banned).
  for (int32_t i = 0; i < r; ++i) {
    const int32_t lr = rows[static_cast<size_t>(i)].row;
    if (lr == 0) {
      forced = any(rng_);
      st[static_cast<size_t>(i)].bias.push_back(LogitBias{forced, 100.f});
    }
    if (lr == 5) {
      banned = 70001;
      logits[static_cast<size_t>(5 * v + banned)] = 60.f;
      st[static_cast<size_t>(i)].bias.push_back(LogitBias{banned, -100.f});
    }
  }
  rows[11].params.state_slot = -1;  // no state: plain greedy with logprobs
  rows[11].params.repetition_penalty = 1.f;
  rows[11].params.frequency_penalty = 0.f;
  rows[11].params.presence_penalty = 0.f;
  rows[11].params.logprobs = 3;
  auto gl = upload(gpu(), DType::kF32, {r, v}, logits);
  auto cl = upload(cpu(), DType::kF32, {r, v}, logits);
  std::vector<SamplerStateReset> resets;
  for (int32_t i = 0; i < r; ++i) {
    if (rows[static_cast<size_t>(i)].params.state_slot >= 0)
      resets.push_back(resetOf(rows[static_cast<size_t>(i)].params.state_slot, st[static_cast<size_t>(i)]));
  }
  gops_->resetSamplerState(resets);
  cops_->resetSamplerState(resets);
  const size_t lp_bytes = static_cast<size_t>(r) * sizeof(llm::LlmTokenLogprobs);
  int changed = 0;
  std::vector<float> prev;
  for (int32_t step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step == 3) {  // a reload (as after a preemption): row 2's slot starts over
      SlotState fresh;
      fresh.prompt = {hot[2][1], hot[2][1], hot[2][2]};
      fresh.bias = {LogitBias{hot[2][3], -2.f}};
      std::vector<SamplerStateReset> one{resetOf(rows[2].params.state_slot, fresh)};
      gops_->resetSamplerState(one);
      cops_->resetSamplerState(one);
    }
    auto gout = allocate(gpu(), DType::kI32, {r});
    auto cout_ = allocate(cpu(), DType::kI32, {r});
    auto glp = allocate(gpu(), DType::kU8, {static_cast<int64_t>(lp_bytes)});
    auto clp = allocate(cpu(), DType::kU8, {static_cast<int64_t>(lp_bytes)});
    poison(gpu(), gout.view);
    poison(gpu(), glp.view);
    gops_->sample(gl.view, rows, gout.view, glp.view);
    cops_->sample(cl.view, rows, cout_.view, clp.view);
    const auto got = download(gpu(), gout.view);
    const auto want = download(cpu(), cout_.view);
    EXPECT_EQ(got, want) << "greedy ids under bias / penalties differ from the CPU's";
    if (!prev.empty() && prev != got) ++changed;
    prev = got;
    const auto g = readLogprobs(gpu(), glp.view, static_cast<size_t>(r));
    const auto c = readLogprobs(cpu(), clp.view, static_cast<size_t>(r));
    for (int32_t i = 0; i < r; ++i) {
      SCOPED_TRACE("row " + std::to_string(i));
      const auto& gi = g[static_cast<size_t>(i)];
      const auto& ci = c[static_cast<size_t>(i)];
      ASSERT_EQ(gi.num_top, ci.num_top);
      if (ci.num_top < 0) continue;
      EXPECT_NEAR(gi.logprob, ci.logprob, 1e-5);
      for (int32_t j = 0; j < ci.num_top; ++j) {
        EXPECT_EQ(gi.top_ids[j], ci.top_ids[j]) << "top " << j;
        EXPECT_NEAR(gi.top_logprobs[j], ci.top_logprobs[j], 1e-5) << "top " << j;
      }
    }
    for (int32_t i = 0; i < r; ++i) {
      const int32_t lr = rows[static_cast<size_t>(i)].row;
      const auto id = static_cast<int32_t>(got[static_cast<size_t>(i)]);
      if (lr == 0) {
        EXPECT_EQ(id, forced) << "+100 must force its token";
      }
      if (lr == 5) {
        EXPECT_NE(id, banned) << "−100 must ban its token";
      }
    }
    for (auto& row : rows) ++row.counter;
  }
  EXPECT_GT(changed, 0) << "the penalties never moved an argmax: the test lost its teeth";
  EXPECT_EQ(download(gpu(), gl.view), logits) << "sample() must leave the raw logits in place";
  std::cout << "[ state ] " << r << " rows x " << steps << " steps, argmax moved in " << changed
            << " steps\n";
}

// Drawn rows (temperature > 0) with a state: +100 bias forces its token, −100 bans (with top-k,
// the banned tokens never come back), min_p 1 keeps only the maximum, and the logprobs of a
// drawn row are the CPU's log-softmax of the raw logits at the token the GPU drew.
TEST_F(GpuLlmOps, SamplerStateBiasForcesAndBansWhenDrawing) {
  const int64_t v = 32000;
  const int32_t r = 8, seqs = 8;
  reserve(64, seqs, 8, 8, 64, 64, 4, 2, r);
  reserveCpu(*cops_, seqs);
  std::vector<float> logits(static_cast<size_t>(v * r));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : logits) x = nd(rng_);
  auto gl = upload(gpu(), DType::kF32, {r, v}, logits);
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(v) - 1);
  std::vector<SlotState> st(static_cast<size_t>(r));
  std::vector<SampleRow> rows(static_cast<size_t>(r));
  std::vector<int32_t> forced(static_cast<size_t>(r), -1);
  std::vector<std::vector<int32_t>> banned(static_cast<size_t>(r));
  for (int32_t i = 0; i < r; ++i) {
    SampleRow& row = rows[static_cast<size_t>(i)];
    row.row = i;
    row.counter = 7;
    row.params.temperature = 1.f;
    row.params.seed = 1234 + static_cast<uint64_t>(i);
    row.params.state_slot = i;
    row.params.logprobs = 4;
    std::span<const float> raw(logits.data() + static_cast<int64_t>(i) * v, static_cast<size_t>(v));
    if (i % 3 == 0) {
      forced[static_cast<size_t>(i)] = any(rng_);
      st[static_cast<size_t>(i)].bias.push_back(LogitBias{forced[static_cast<size_t>(i)], 100.f});
    } else if (i % 3 == 1) {
      // Ban the 5 most likely raw tokens; top_k 5 then keeps the next 5.
      llm::LlmTokenLogprobs top;
      computeLogprobs(raw, 5, 0, &top);
      for (int j = 0; j < 5; ++j) {
        banned[static_cast<size_t>(i)].push_back(top.top_ids[j]);
        st[static_cast<size_t>(i)].bias.push_back(LogitBias{top.top_ids[j], -100.f});
      }
      row.params.top_k = 5;
    } else {
      row.params.min_p = 1.f;  // only the maximum (after bias) survives
      st[static_cast<size_t>(i)].bias.push_back(LogitBias{any(rng_), 3.f});
    }
  }
  std::vector<SamplerStateReset> resets;
  for (int32_t i = 0; i < r; ++i) resets.push_back(resetOf(i, st[static_cast<size_t>(i)]));
  gops_->resetSamplerState(resets);
  cops_->resetSamplerState(resets);
  for (int rep = 0; rep < 20; ++rep) {
    auto gout = allocate(gpu(), DType::kI32, {r});
    auto glp = allocate(gpu(), DType::kU8, {static_cast<int64_t>(r * sizeof(llm::LlmTokenLogprobs))});
    gops_->sample(gl.view, rows, gout.view, glp.view);
    const auto got = download(gpu(), gout.view);
    const auto g = readLogprobs(gpu(), glp.view, static_cast<size_t>(r));
    for (int32_t i = 0; i < r; ++i) {
      SCOPED_TRACE("row " + std::to_string(i) + " draw " + std::to_string(rep));
      const auto id = static_cast<int32_t>(got[static_cast<size_t>(i)]);
      std::span<const float> raw(logits.data() + static_cast<int64_t>(i) * v, static_cast<size_t>(v));
      if (i % 3 == 0) {
        EXPECT_EQ(id, forced[static_cast<size_t>(i)]);
      }
      if (i % 3 == 1) {
        for (int32_t b : banned[static_cast<size_t>(i)]) EXPECT_NE(id, b);
      }
      if (i % 3 == 2) {
        std::vector<float> w(raw.begin(), raw.end());
        for (const LogitBias& b : st[static_cast<size_t>(i)].bias) w[static_cast<size_t>(b.id)] += b.bias;
        EXPECT_EQ(id, argmaxToken(w)) << "min_p 1 keeps only the maximum";
      }
      llm::LlmTokenLogprobs want;
      computeLogprobs(raw, 4, id, &want);
      EXPECT_NEAR(g[static_cast<size_t>(i)].logprob, want.logprob, 1e-5);
      ASSERT_EQ(g[static_cast<size_t>(i)].num_top, 4);
      for (int j = 0; j < 4; ++j) EXPECT_EQ(g[static_cast<size_t>(i)].top_ids[j], want.top_ids[j]);
    }
    for (auto& row : rows) ++row.counter;
  }
}

// ---- token masks with the sampler state [TAG_TOKEN_MASK] [TAG_LLM_SAMPLER_STATE] ------------

// Random bitmask over v ids with the given density, at least one id allowed; `words` wide.
std::vector<uint32_t> randomMask(std::mt19937& rng, int64_t v, size_t words, double density) {
  std::vector<uint32_t> m(words, 0);
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t id = 0; id < v; ++id) {
    if (u(rng) < density) m[static_cast<size_t>(id / 32)] |= 1u << (id % 32);
  }
  const int64_t one = static_cast<int64_t>(u(rng) * static_cast<double>(v));
  m[static_cast<size_t>(one / 32)] |= 1u << (one % 32);
  return m;
}

// Greedy rows over the o200k width with a token mask AND a state slot (logit_bias with +100 on
// a forbidden id, penalties) AND logprobs, over four steps (the slots count their draws on the
// device): ids equal the CPU's (whose order is bias → penalties → mask, sampler.h), never a
// forbidden id, logprobs are the CPU's of the RAW logits (the top list may name forbidden ids),
// and the logits come back unchanged. Rows without a mask or without a slot are mixed in.
TEST_F(GpuLlmOps, MaskedSamplerStateAndLogprobsMatchCpu) {
  const int64_t v = 201088;
  const size_t words = static_cast<size_t>((v + 31) / 32);
  const int32_t r = 10, seqs = 16, steps = 4;
  reserve(64, seqs, 8, 8, 64, 64, 4, 2, r);
  reserveCpu(*cops_, seqs);
  std::vector<float> logits(static_cast<size_t>(v * r));
  std::normal_distribution<float> nd(0.f, 2.f);
  for (auto& x : logits) x = nd(rng_);
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(v) - 1);
  const double densities[] = {0.0, 0.001, 0.05, 0.5, 0.999};
  std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(r));
  std::vector<SlotState> st(static_cast<size_t>(r));
  std::vector<SampleRow> rows(static_cast<size_t>(r));
  std::vector<int32_t> forbidden_forced(static_cast<size_t>(r), -1);
  const int32_t lps[] = {0, 3, 20, -1};
  for (int32_t i = 0; i < r; ++i) {
    const int64_t lr = (i * 3) % r;  // distinct logits rows, not in order
    auto& m = masks[static_cast<size_t>(i)];
    m = randomMask(rng_, v, words, densities[i % 5]);
    // A few allowed "hot" ids the penalties move the argmax among.
    std::vector<int32_t> hot;
    for (int j = 0; j < 6; ++j) {
      const int32_t t = any(rng_);
      m[static_cast<size_t>(t / 32)] |= 1u << (t % 32);
      logits[static_cast<size_t>(lr * v + t)] = 12.f + 0.2f * static_cast<float>(j % 3);
      hot.push_back(t);
    }
    // A forbidden id with the largest raw logit and a +100 bias: must never be drawn.
    int32_t f = any(rng_);
    while (tokenAllowed(m.data(), f)) f = any(rng_);
    logits[static_cast<size_t>(lr * v + f)] = 30.f;
    forbidden_forced[static_cast<size_t>(i)] = f;
    SlotState& s = st[static_cast<size_t>(i)];
    for (int j = 0; j < 6; ++j) s.prompt.push_back(hot[static_cast<size_t>(j % 3)]);
    s.output = {hot[0], hot[1]};
    s.bias = {LogitBias{f, 100.f}, LogitBias{hot[2], 0.5f}};
    SampleRow& row = rows[static_cast<size_t>(i)];
    row.row = static_cast<int32_t>(lr);
    row.counter = 50 + static_cast<uint64_t>(i);
    row.params.temperature = 0.f;
    row.params.repetition_penalty = 1.2f;
    row.params.frequency_penalty = 0.7f;
    row.params.presence_penalty = 0.4f;
    row.params.logprobs = lps[i % 4];
    row.params.state_slot = i;
    row.mask = m.data();
  }
  // Row 7: a mask but no slot; row 8: a slot but no mask (its forbidden id is then forced).
  rows[7].params.state_slot = -1;
  rows[7].params.repetition_penalty = 1.f;
  rows[7].params.frequency_penalty = 0.f;
  rows[7].params.presence_penalty = 0.f;
  rows[8].mask = nullptr;
  auto gl = upload(gpu(), DType::kF32, {r, v}, logits);
  auto cl = upload(cpu(), DType::kF32, {r, v}, logits);
  std::vector<SamplerStateReset> resets;
  for (int32_t i = 0; i < r; ++i) {
    if (rows[static_cast<size_t>(i)].params.state_slot >= 0) resets.push_back(resetOf(i, st[static_cast<size_t>(i)]));
  }
  gops_->resetSamplerState(resets);
  cops_->resetSamplerState(resets);
  const size_t lp_bytes = static_cast<size_t>(r) * sizeof(llm::LlmTokenLogprobs);
  int moved = 0;
  std::vector<float> prev;
  for (int32_t step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    auto gout = allocate(gpu(), DType::kI32, {r});
    auto cout_ = allocate(cpu(), DType::kI32, {r});
    auto glp = allocate(gpu(), DType::kU8, {static_cast<int64_t>(lp_bytes)});
    auto clp = allocate(cpu(), DType::kU8, {static_cast<int64_t>(lp_bytes)});
    poison(gpu(), gout.view);
    poison(gpu(), glp.view);
    gops_->sample(gl.view, rows, gout.view, glp.view);
    cops_->sample(cl.view, rows, cout_.view, clp.view);
    const auto got = download(gpu(), gout.view);
    const auto want = download(cpu(), cout_.view);
    EXPECT_EQ(got, want) << "masked greedy ids under bias / penalties differ from the CPU's";
    if (!prev.empty() && prev != got) ++moved;
    prev = got;
    for (int32_t i = 0; i < r; ++i) {
      const auto id = static_cast<int32_t>(got[static_cast<size_t>(i)]);
      const SampleRow& row = rows[static_cast<size_t>(i)];
      if (row.mask != nullptr) {
        EXPECT_TRUE(tokenAllowed(row.mask, id)) << "row " << i << " drew forbidden id " << id;
      } else {
        EXPECT_EQ(id, forbidden_forced[static_cast<size_t>(i)]) << "unmasked: +100 forces it";
      }
    }
    const auto g = readLogprobs(gpu(), glp.view, static_cast<size_t>(r));
    const auto c = readLogprobs(cpu(), clp.view, static_cast<size_t>(r));
    for (int32_t i = 0; i < r; ++i) {
      SCOPED_TRACE("row " + std::to_string(i));
      const auto& gi = g[static_cast<size_t>(i)];
      const auto& ci = c[static_cast<size_t>(i)];
      ASSERT_EQ(gi.num_top, ci.num_top);
      if (ci.num_top < 0) continue;
      EXPECT_NEAR(gi.logprob, ci.logprob, 1e-5);
      for (int32_t j = 0; j < ci.num_top; ++j) {
        EXPECT_EQ(gi.top_ids[j], ci.top_ids[j]) << "top " << j;
        EXPECT_NEAR(gi.top_logprobs[j], ci.top_logprobs[j], 1e-5) << "top " << j;
      }
      // Raw logprobs: the forbidden id with the largest raw logit heads the list.
      if (ci.num_top > 0) {
        EXPECT_EQ(gi.top_ids[0], forbidden_forced[static_cast<size_t>(i)]);
      }
    }
    for (auto& row : rows) ++row.counter;
  }
  EXPECT_GT(moved, 0) << "the penalties never moved a masked argmax: the test lost its teeth";
  EXPECT_EQ(download(gpu(), gl.view), logits) << "sample() must leave the raw logits in place";
  std::cout << "[ masked state ] " << r << " rows x " << steps << " steps, argmax moved in "
            << moved << " steps\n";
}

// Drawn (temperature > 0) masked rows with a state: never a forbidden id even with +100 on it,
// +100 on an ALLOWED id forces that id, min_p / top-k act among the allowed ids (min_p 1: the
// allowed maximum), and the logprobs are the CPU's raw log-softmax at the id the GPU drew.
TEST_F(GpuLlmOps, MaskedDrawsWithBiasAndLogprobs) {
  const int64_t v = 50000;
  const size_t words = static_cast<size_t>((201088 + 31) / 32);  // reserve()'s mask width
  const int32_t r = 9, seqs = 9, draws = 40;
  reserve(64, seqs, 8, 8, 64, 64, 4, 2, r);
  std::vector<float> logits(static_cast<size_t>(v * r));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : logits) x = nd(rng_);
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(v) - 1);
  auto gl = upload(gpu(), DType::kF32, {r, v}, logits);
  std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(r));
  std::vector<SlotState> st(static_cast<size_t>(r));
  std::vector<int32_t> forced(static_cast<size_t>(r), -1);
  std::vector<SamplerStateReset> resets;
  for (int32_t i = 0; i < r; ++i) {
    masks[static_cast<size_t>(i)] = randomMask(rng_, v, words, i % 2 ? 0.01 : 0.3);
    const auto& m = masks[static_cast<size_t>(i)];
    int32_t f = any(rng_);
    while (tokenAllowed(m.data(), f)) f = any(rng_);
    st[static_cast<size_t>(i)].bias.push_back(LogitBias{f, 100.f});
    if (i % 3 == 0) {
      int32_t a = any(rng_);
      while (!tokenAllowed(m.data(), a)) a = any(rng_);
      forced[static_cast<size_t>(i)] = a;
      st[static_cast<size_t>(i)].bias.push_back(LogitBias{a, 100.f});
    }
  }
  for (int32_t i = 0; i < r; ++i) resets.push_back(resetOf(i, st[static_cast<size_t>(i)]));
  gops_->resetSamplerState(resets);
  std::set<int32_t> distinct;
  for (int32_t d = 0; d < draws; ++d) {
    std::vector<SampleRow> rows(static_cast<size_t>(r));
    for (int32_t i = 0; i < r; ++i) {
      SampleRow& row = rows[static_cast<size_t>(i)];
      row.row = i;
      row.counter = 1000 + static_cast<uint64_t>(d);
      row.params.temperature = 1.f;
      row.params.seed = 99 + static_cast<uint64_t>(i);
      row.params.top_k = i % 3 == 1 ? 5 : 0;
      row.params.min_p = i % 3 == 2 ? 1.f : 0.f;
      row.params.logprobs = 2;
      row.params.state_slot = i;
      row.mask = masks[static_cast<size_t>(i)].data();
    }
    auto gout = allocate(gpu(), DType::kI32, {r});
    auto glp = allocate(gpu(), DType::kU8, {static_cast<int64_t>(r * sizeof(llm::LlmTokenLogprobs))});
    poison(gpu(), gout.view);
    gops_->sample(gl.view, rows, gout.view, glp.view);
    const auto got = download(gpu(), gout.view);
    const auto g = readLogprobs(gpu(), glp.view, static_cast<size_t>(r));
    for (int32_t i = 0; i < r; ++i) {
      SCOPED_TRACE("row " + std::to_string(i) + " draw " + std::to_string(d));
      const auto id = static_cast<int32_t>(got[static_cast<size_t>(i)]);
      const auto& m = masks[static_cast<size_t>(i)];
      ASSERT_TRUE(tokenAllowed(m.data(), id)) << "drew forbidden id " << id;
      std::span<const float> raw(logits.data() + static_cast<int64_t>(i) * v, static_cast<size_t>(v));
      if (forced[static_cast<size_t>(i)] >= 0) {
        EXPECT_EQ(id, forced[static_cast<size_t>(i)]) << "+100 on an allowed id forces it";
      } else if (i % 3 == 2) {
        std::vector<float> w(raw.begin(), raw.end());
        applyTokenBitmask(w, m.data());
        EXPECT_EQ(id, argmaxToken(w)) << "min_p 1 keeps only the allowed maximum";
      } else {
        distinct.insert(id);
      }
      llm::LlmTokenLogprobs want;
      computeLogprobs(raw, 2, id, &want);
      EXPECT_NEAR(g[static_cast<size_t>(i)].logprob, want.logprob, 1e-5);
      ASSERT_EQ(g[static_cast<size_t>(i)].num_top, 2);
      for (int j = 0; j < 2; ++j) EXPECT_EQ(g[static_cast<size_t>(i)].top_ids[j], want.top_ids[j]);
    }
  }
  EXPECT_GT(distinct.size(), 6u) << "the masked draws are not a real draw";
}

// The graph decode path's staging (stageSample outside, sampleStaged inside a captured body):
// masked rows staged then sampled give the ids sample() gives, greedy and seeded, with masks
// lying back to back (one copy), out of order and repeated (separate copies) on the host.
TEST_F(GpuLlmOps, MaskedStagedSampleEqualsSample) {
  const int64_t v = 201088;
  const size_t words = static_cast<size_t>((v + 31) / 32);
  const int32_t r = 12;
  reserve(64, 16, 8, 8, 64, 64, 4, 2, r);
  std::vector<float> logits(static_cast<size_t>(v * r));
  std::normal_distribution<float> nd(0.f, 2.f);
  for (auto& x : logits) x = nd(rng_);
  auto gl = upload(gpu(), DType::kF32, {r, v}, logits);
  std::vector<uint32_t> block(words * 8);  // 8 masks back to back
  for (int k = 0; k < 8; ++k) {
    auto m = randomMask(rng_, v, words, k % 2 ? 0.002 : 0.2);
    std::copy(m.begin(), m.end(), block.begin() + static_cast<std::ptrdiff_t>(k * words));
  }
  const int order[r] = {0, 1, 2, 5, 3, -1, 4, 7, 7, -1, 6, 0};  // -1: unmasked
  std::vector<SampleRow> rows(static_cast<size_t>(r));
  for (int32_t i = 0; i < r; ++i) {
    SampleRow& row = rows[static_cast<size_t>(i)];
    row.row = (i * 5) % r;
    row.counter = 7 + static_cast<uint64_t>(i);
    row.params.temperature = i % 2 ? 0.9f : 0.f;
    row.params.top_p = i % 4 == 1 ? 0.8f : 1.f;
    row.params.seed = 5 + static_cast<uint64_t>(i);
    if (order[i] >= 0) row.mask = block.data() + static_cast<size_t>(order[i]) * words;
  }
  auto a = allocate(gpu(), DType::kI32, {r});
  auto b = allocate(gpu(), DType::kI32, {r});
  poison(gpu(), a.view);
  poison(gpu(), b.view);
  gops_->sample(gl.view, rows, a.view);
  gops_->stageSample(rows);
  gops_->sampleStaged(gl.view, r, b.view);
  const auto ga = download(gpu(), a.view);
  const auto gb = download(gpu(), b.view);
  EXPECT_EQ(ga, gb);
  for (int32_t i = 0; i < r; ++i) {
    const auto id = static_cast<int32_t>(gb[static_cast<size_t>(i)]);
    const SampleRow& row = rows[static_cast<size_t>(i)];
    EXPECT_TRUE(tokenAllowed(row.mask, id)) << "row " << i << " drew forbidden id " << id;
    if (row.params.temperature == 0.f) {
      std::vector<float> w(logits.begin() + row.row * v, logits.begin() + (row.row + 1) * v);
      if (row.mask != nullptr) applyTokenBitmask(w, row.mask);
      EXPECT_EQ(id, argmaxToken(w)) << "row " << i;
    }
  }
}

}  // namespace
}  // namespace garden::rose::gputest
