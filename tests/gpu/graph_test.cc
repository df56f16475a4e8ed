// CUDA graphs for whole forward passes built from the backend's ops: a small Qwen3-like model
// (embedding, fused norms, QKV GEMM, QK-norm + RoPE, varlen attention, SwiGLU MLP, pooling) padded
// to a (sequences, tokens) bucket. Checks lazy capture (eager, capture, replay), that replays
// give bit-identical results to eager runs on new inputs, precapture, and that the CUDA forward
// matches the CPU reference backend. Label `gpu`.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "services/rose/graph/graph_cache.h"
#include "services/rose/ops/cuda/cuda_backend.h"
#include "tests/gpu/gpu_test_util.h"

namespace garden::rose::gputest {
namespace {

constexpr int64_t kVocab = 1000, kHidden = 256, kInter = 512, kLayers = 2;
constexpr int32_t kHq = 2, kHkv = 1, kD = 128;
constexpr int64_t kWidth = (kHq + 2 * kHkv) * kD;
constexpr int64_t kMaxPos = 2048;

struct Weights {
  std::vector<float> embed, final_norm;
  struct L {
    std::vector<float> in_norm, post_norm, q_norm, k_norm, qkv, o, gate_up, down;
  };
  std::vector<L> layers;
  std::vector<float> cos, sin;
};

Weights randomWeights(std::mt19937& rng) {
  Weights w;
  w.embed = randomBf16(kVocab * kHidden, rng, -1.f, 1.f);
  w.final_norm = randomBf16(kHidden, rng, 0.8f, 1.2f);
  for (int l = 0; l < kLayers; ++l) {
    Weights::L x;
    x.in_norm = randomBf16(kHidden, rng, 0.8f, 1.2f);
    x.post_norm = randomBf16(kHidden, rng, 0.8f, 1.2f);
    x.q_norm = randomBf16(kD, rng, 0.8f, 1.2f);
    x.k_norm = randomBf16(kD, rng, 0.8f, 1.2f);
    x.qkv = randomBf16(kWidth * kHidden, rng, -0.1f, 0.1f);
    x.o = randomBf16(kHidden * kHq * kD, rng, -0.05f, 0.05f);
    x.gate_up = randomBf16(2 * kInter * kHidden, rng, -0.1f, 0.1f);
    x.down = randomBf16(kHidden * kInter, rng, -0.05f, 0.05f);
    w.layers.push_back(std::move(x));
  }
  const int64_t half = kD / 2;
  w.cos.resize(kMaxPos * half);
  w.sin.resize(kMaxPos * half);
  for (int64_t p = 0; p < kMaxPos; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double inv = std::pow(1e6, -2.0 * i / kD);
      w.cos[p * half + i] = static_cast<float>(std::cos(p * inv));
      w.sin[p * half + i] = static_cast<float>(std::sin(p * inv));
    }
  return w;
}

// The model on one backend, with activation buffers for exactly `tokens` rows (one bucket).
struct Mini {
  Backend& b;
  int64_t tokens;
  int32_t seqs;
  OwnedTensor embed, final_norm, cos, sin;
  struct L {
    OwnedTensor in_norm, post_norm, q_norm, k_norm, qkv, o, gate_up, down;
  };
  std::vector<L> layers;
  OwnedTensor ids, pos, cu, residual, x, qkv, attn, gu, act, mlp, pooled;

  Mini(Backend& be, const Weights& w, int64_t t, int32_t s) : b(be), tokens(t), seqs(s) {
    const DType wd = b.weightDType(), ad = b.activationDType();
    embed = upload(b, wd, {kVocab, kHidden}, w.embed);
    final_norm = upload(b, wd, {kHidden}, w.final_norm);
    cos = upload(b, DType::kF32, {kMaxPos, kD / 2}, w.cos);
    sin = upload(b, DType::kF32, {kMaxPos, kD / 2}, w.sin);
    for (const auto& l : w.layers) {
      L x;
      x.in_norm = upload(b, wd, {kHidden}, l.in_norm);
      x.post_norm = upload(b, wd, {kHidden}, l.post_norm);
      x.q_norm = upload(b, wd, {kD}, l.q_norm);
      x.k_norm = upload(b, wd, {kD}, l.k_norm);
      x.qkv = upload(b, wd, {kWidth, kHidden}, l.qkv);
      x.o = upload(b, wd, {kHidden, kHq * kD}, l.o);
      x.gate_up = upload(b, wd, {2 * kInter, kHidden}, l.gate_up);
      x.down = upload(b, wd, {kHidden, kInter}, l.down);
      layers.push_back(std::move(x));
    }
    ids = allocate(b, DType::kI32, {t});
    pos = allocate(b, DType::kI32, {t});
    cu = allocate(b, DType::kI32, {s + 1});
    residual = allocate(b, b.residualDType(), {t, kHidden});
    x = allocate(b, ad, {t, kHidden});
    qkv = allocate(b, ad, {t, kWidth});
    attn = allocate(b, ad, {t, kHq * kD});
    gu = allocate(b, ad, {t, 2 * kInter});
    act = allocate(b, ad, {t, kInter});
    mlp = allocate(b, ad, {t, kHidden});
    pooled = allocate(b, DType::kF32, {s, kHidden});
  }

  // Inputs padded to the bucket: the real sequences, then one padding sequence holding the rest
  // of the tokens, then empty sequences... (the CPU reference wants no empty sequences, so the
  // tests keep real + 1 == seqs).
  void setInputs(const std::vector<int32_t>& tok, const std::vector<int32_t>& lens) {
    std::vector<int32_t> all_ids(tokens, 0), positions(tokens, 0), cus(seqs + 1, 0);
    std::copy(tok.begin(), tok.end(), all_ids.begin());
    std::vector<int32_t> l = lens;
    int32_t used = 0;
    for (int32_t v : lens) used += v;
    l.push_back(static_cast<int32_t>(tokens) - used);
    while (static_cast<int32_t>(l.size()) < seqs) l.push_back(0);
    int32_t at = 0;
    for (size_t s = 0; s < l.size(); ++s) {
      for (int32_t i = 0; i < l[s]; ++i) positions[at + i] = i;
      at += l[s];
      cus[s + 1] = at;
    }
    b.copyToDevice(ids.view, all_ids.data(), all_ids.size() * 4);
    b.copyToDevice(pos.view, positions.data(), positions.size() * 4);
    b.copyToDevice(cu.view, cus.data(), cus.size() * 4);
  }

  // Device work only ([TAG_GRAPH_BODY]).
  void forward() {
    b.embedding(embed.view, ids.view, residual.view);
    RmsNormParams np;
    QkNormRopeParams qp{kHq, kHkv, kD, kD, 1e-6f, true};
    AttentionParams ap{
        seqs, kHq, kHkv, kD, static_cast<int32_t>(tokens), 1.f / std::sqrt(float(kD)), true};
    for (size_t l = 0; l < layers.size(); ++l) {
      const L& w = layers[l];
      if (l == 0) {
        b.rmsNorm(residual.view, Tensor(), w.in_norm.view, x.view, np);
      } else {
        b.rmsNorm(mlp.view, residual.view, w.in_norm.view, x.view, np);
      }
      b.linear(x.view, w.qkv.view, Tensor(), qkv.view);
      b.qkNormRope(qkv.view, w.q_norm.view, w.k_norm.view, pos.view, cos.view, sin.view, qp);
      b.attention(qkv.view, cu.view, attn.view, ap);
      b.linear(attn.view, w.o.view, Tensor(), mlp.view);
      b.rmsNorm(mlp.view, residual.view, w.post_norm.view, x.view, np);
      b.linear(x.view, w.gate_up.view, Tensor(), gu.view);
      b.swiglu(gu.view, act.view);
      b.linear(act.view, w.down.view, Tensor(), mlp.view);
    }
    b.rmsNorm(mlp.view, residual.view, final_norm.view, x.view, np);
    b.pool(x.view, cu.view, pooled.view, PoolParams{seqs, PoolMode::kLast, true});
  }
};

std::vector<int32_t> randomIds(std::mt19937& rng, int64_t n) {
  std::uniform_int_distribution<int32_t> d(0, kVocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(GpuGraphs, BucketsPadTokensAndSequences) {
  EXPECT_EQ(tokensBucket(1), 64u);
  EXPECT_EQ(tokensBucket(64), 64u);
  EXPECT_EQ(tokensBucket(65), 128u);
  EXPECT_EQ(tokensBucket(1024), 1024u);
  EXPECT_EQ(tokensBucket(1025), 1280u);
  EXPECT_EQ(tokensBucket(4000), 4096u);
  EXPECT_EQ(seqsBucket(1), 1u);
  EXPECT_EQ(seqsBucket(3), 4u);
  EXPECT_EQ(seqsBucket(5), 8u);
}

TEST(GpuGraphs, LazyCaptureReplayMatchesEagerAndCpu) {
  Backends be = makeBackends();
  ASSERT_TRUE(be.cpu && be.gpu);
  auto& gpu = static_cast<cuda::CudaBackend&>(*be.gpu);
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed() + 7);
  Weights w = randomWeights(rng);
  const int64_t bucket_tokens = tokensBucket(100);  // 128
  const int32_t bucket_seqs = 4;                    // 3 real + 1 padding sequence
  Mini g(gpu, w, bucket_tokens, bucket_seqs);
  Mini c(*be.cpu, w, bucket_tokens, bucket_seqs);
  const GraphKey key{1, static_cast<uint32_t>(bucket_seqs), static_cast<uint32_t>(bucket_tokens)};
  const std::vector<std::vector<int32_t>> batches = {
      {5, 50, 17}, {60, 3, 1}, {1, 1, 100}, {33, 33, 33}, {2, 90, 7}};
  for (size_t i = 0; i < batches.size(); ++i) {
    SCOPED_TRACE("batch " + std::to_string(i));
    int64_t n = 0;
    for (int32_t l : batches[i]) n += l;
    auto tok = randomIds(rng, n);
    // Eager reference on the GPU.
    g.setInputs(tok, batches[i]);
    poison(gpu, g.pooled.view);
    g.forward();
    auto eager = download(gpu, g.pooled.view);
    // Through the graph cache.
    g.setInputs(tok, batches[i]);
    poison(gpu, g.pooled.view);
    Status s = gpu.runGraph(key, [&] { g.forward(); });
    ASSERT_TRUE(s.isOk()) << s.toString();
    auto graphed = download(gpu, g.pooled.view);
    ASSERT_EQ(eager.size(), graphed.size());
    EXPECT_EQ(0, std::memcmp(eager.data(), graphed.data(), eager.size() * 4))
        << "graph run differs from the eager run";
    // CPU reference, same padded batch.
    c.setInputs(tok, batches[i]);
    c.forward();
    auto ref = download(*be.cpu, c.pooled.view);
    for (int64_t r = 0; r < static_cast<int64_t>(batches[i].size()); ++r) {
      const double cs = rowCosine(graphed, ref, r, kHidden);
      EXPECT_GE(cs, 0.999) << "sequence " << r << " cosine vs CPU " << cs;
    }
  }
  const auto& st = gpu.graphStats();
  EXPECT_EQ(st.eager, 1u);
  EXPECT_EQ(st.captures, 1u);
  EXPECT_EQ(st.replays, batches.size() - 2);
  EXPECT_EQ(st.capture_failures, 0u);
}

TEST(GpuGraphs, PrecaptureMakesFirstSightAReplay) {
  Backends be = makeBackends();
  ASSERT_TRUE(be.gpu);
  auto& gpu = static_cast<cuda::CudaBackend&>(*be.gpu);
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed() + 9);
  Weights w = randomWeights(rng);
  Mini g(gpu, w, 64, 2);
  const GraphKey key{1, 2, 64};
  std::vector<int32_t> lens = {40};
  g.setInputs(randomIds(rng, 40), lens);
  ASSERT_TRUE(gpu.precaptureGraph(key, [&] { g.forward(); }).isOk());
  EXPECT_EQ(gpu.graphStats().captures, 1u);
  auto tok = randomIds(rng, 40);
  g.setInputs(tok, lens);
  g.forward();
  auto eager = download(gpu, g.pooled.view);
  g.setInputs(tok, lens);
  poison(gpu, g.pooled.view);
  ASSERT_TRUE(gpu.runGraph(key, [&] { g.forward(); }).isOk());
  EXPECT_EQ(gpu.graphStats().replays, 1u);
  auto graphed = download(gpu, g.pooled.view);
  EXPECT_EQ(0, std::memcmp(eager.data(), graphed.data(), eager.size() * 4));
}

}  // namespace
}  // namespace garden::rose::gputest
