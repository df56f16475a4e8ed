// [TAG_EMBED_FP8] The FP8 dense-layer ops of the CUDA backend (ops/cuda/fp8_dense.cuh,
// fp8_gemm.h) on fresh random inputs: the quantization kernels against a host computation of the
// same rule bit for bit (codes and scales), the fused producers (RMSNorm, SwiGLU) against their
// bf16 op followed by the quantize op bit for bit, and the GEMM against the f64 product of the
// dequantized operands.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "services/rose/ops/cuda/attention.cuh"
#include "services/rose/ops/cuda/fp8_block.h"
#include "services/rose/ops/cuda/gemm.h"
#include "tests/gpu/gpu_test_util.h"

namespace garden::rose::gputest {
namespace {

using cuda::fp8E4m3FromFloat;
using cuda::fp8E4m3ToFloat;

// The rule of fp8_dense.cuh on one block's values (already rounded as the op's bf16 output).
void quantizeBlock(const std::vector<float>& v, std::vector<uint8_t>& codes, float& scale) {
  float amax = 0.f;
  for (float x : v) amax = std::max(amax, std::fabs(x));
  scale = 1.f;
  float inv = 0.f;
  if (amax > 0.f) {
    scale = amax / 448.f;
    inv = 448.f / amax;
  }
  codes.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) codes[i] = fp8E4m3FromFloat(v[i] * inv);
}

// Host activation quantization of x [rows, k]: codes [rows, k], scales [k/128, rows].
void hostQuantRows(const std::vector<float>& x, int64_t rows, int64_t k, std::vector<uint8_t>& codes,
                   std::vector<float>& scales) {
  codes.assign(static_cast<size_t>(rows * k), 0);
  scales.assign(static_cast<size_t>(k / 128 * rows), 0.f);
  std::vector<float> blk(128);
  std::vector<uint8_t> c;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < k / 128; ++b) {
      for (int i = 0; i < 128; ++i) blk[static_cast<size_t>(i)] = x[static_cast<size_t>(r * k + b * 128 + i)];
      float s;
      quantizeBlock(blk, c, s);
      std::memcpy(&codes[static_cast<size_t>(r * k + b * 128)], c.data(), 128);
      scales[static_cast<size_t>(b * rows + r)] = s;
    }
}

std::vector<uint8_t> downloadBytes(Backend& b, const Tensor& t) {
  std::vector<uint8_t> raw(t.bytes());
  b.copyToHost(raw.data(), t, raw.size());
  EXPECT_TRUE(b.synchronize().isOk());
  return raw;
}

// EXPECTs equal bytes; reports how many differ and the first.
void expectSameBytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      if (first == got.size()) first = i;
      ++bad;
    }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " bytes differ (first at "
                     << first << ": " << (first < got.size() ? int(got[first]) : -1) << " vs "
                     << (first < got.size() ? int(want[first]) : -1) << ")";
}
void expectSameFloats(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  std::vector<uint8_t> a(got.size() * 4), b(want.size() * 4);
  std::memcpy(a.data(), got.data(), a.size());
  std::memcpy(b.data(), want.data(), b.size());
  expectSameBytes(a, b, what);
}

class GpuFp8Dense : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = makeBackends();
    ASSERT_TRUE(be_.gpu);
    ASSERT_TRUE(gpu().supportsFp8Linear());
    rng_.seed(::testing::UnitTest::GetInstance()->random_seed() + 8128);
  }
  Backend& gpu() { return *be_.gpu; }
  // An activation Fp8Matrix [rows, k] on the GPU, poisoned.
  struct Act {
    OwnedTensor codes, scales;
    Fp8Matrix m() const { return {codes.view, scales.view}; }
  };
  Act act(int64_t rows, int64_t k) {
    Act a{allocate(gpu(), DType::kU8, {rows, k}), allocate(gpu(), DType::kF32, {k / 128, rows})};
    poison(gpu(), a.codes.view);
    poison(gpu(), a.scales.view);
    return a;
  }
  Backends be_;
  std::mt19937 rng_;
};

TEST_F(GpuFp8Dense, WeightQuantizationMatchesTheHostRuleBitForBit) {
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{
           {384, 1024}, {200, 256}, {1024, 3072}, {4, 128}, {130, 640}}) {
    SCOPED_TRACE(std::to_string(n) + "x" + std::to_string(k));
    auto w = randomBf16(static_cast<size_t>(n * k), rng_, -0.08f, 0.08f);
    // One all-zero block, one block with a single large weight (the others round to zero or to
    // subnormals), and exact zeros scattered elsewhere.
    for (int64_t r = 0; r < std::min<int64_t>(n, 128); ++r)
      for (int64_t c = 0; c < 128; ++c) w[static_cast<size_t>(r * k + c)] = 0.f;
    if (k >= 256) w[static_cast<size_t>(128 + 1)] = 24.f;
    for (size_t i = 7; i < w.size(); i += 61) w[i] = 0.f;
    auto gw = upload(gpu(), DType::kBF16, {n, k}, w);
    const int64_t nb = (n + 127) / 128, kb4 = cuda::fp8KBlocks4(k);
    Act q{allocate(gpu(), DType::kU8, {n, k}), allocate(gpu(), DType::kF32, {nb, kb4})};
    poison(gpu(), q.codes.view);
    poison(gpu(), q.scales.view);
    gpu().quantizeFp8Weight(gw.view, q.m());
    std::vector<uint8_t> codes(static_cast<size_t>(n * k));
    std::vector<float> scales(static_cast<size_t>(nb * kb4), 0.f);
    std::vector<float> blk;
    std::vector<uint8_t> c;
    for (int64_t p = 0; p < nb; ++p)
      for (int64_t b = 0; b < k / 128; ++b) {
        blk.clear();
        for (int64_t r = p * 128; r < std::min(n, p * 128 + 128); ++r)
          for (int64_t j = 0; j < 128; ++j) blk.push_back(w[static_cast<size_t>(r * k + b * 128 + j)]);
        float s;
        quantizeBlock(blk, c, s);
        size_t i = 0;
        for (int64_t r = p * 128; r < std::min(n, p * 128 + 128); ++r)
          for (int64_t j = 0; j < 128; ++j) codes[static_cast<size_t>(r * k + b * 128 + j)] = c[i++];
        scales[static_cast<size_t>(cuda::fp8WeightScaleIndex(k, p, b))] = s;
      }
    expectSameBytes(downloadBytes(gpu(), q.codes.view), codes, "weight codes");
    expectSameFloats(download(gpu(), q.scales.view), scales, "weight scales (padding 0)");
  }
}

TEST_F(GpuFp8Dense, RowQuantizationMatchesTheHostRuleBitForBit) {
  for (auto [rows, k] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 128}, {4, 1024}, {37, 2048}, {1000, 1024}, {3, 3072}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(k));
    auto x = randomBf16(static_cast<size_t>(rows * k), rng_, -3.f, 3.f);
    for (int64_t c = 0; c < 128; ++c) x[static_cast<size_t>(c)] = 0.f;  // an all-zero block
    if (rows > 2) x[static_cast<size_t>(2 * k + 5)] = 300.f;           // one outlier
    auto gx = upload(gpu(), DType::kBF16, {rows, k}, x);
    Act q = act(rows, k);
    gpu().quantizeFp8(gx.view, q.m());
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    hostQuantRows(x, rows, k, codes, scales);
    expectSameBytes(downloadBytes(gpu(), q.codes.view), codes, "codes");
    expectSameFloats(download(gpu(), q.scales.view), scales, "scales");
  }
}

// The fused producers equal their bf16 op followed by quantizeFp8, bit for bit (and the norm's
// residual update equals the plain norm's).
TEST_F(GpuFp8Dense, FusedRmsNormAndSwigluEqualTheOpThenQuantize) {
  for (auto [t, h] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1024}, {3, 2560}, {64, 1024}, {600, 1024}, {2000, 1024}, {5, 128}}) {
    for (bool with_res : {false, true}) {
      SCOPED_TRACE("norm " + std::to_string(t) + "x" + std::to_string(h) +
                   (with_res ? " residual" : " plain"));
      auto x = randomBf16(static_cast<size_t>(t * h), rng_, -2.f, 2.f);
      auto r = randomBf16(static_cast<size_t>(t * h), rng_, -2.f, 2.f);
      auto w = randomBf16(static_cast<size_t>(h), rng_, 0.5f, 1.5f);
      auto gx = upload(gpu(), DType::kBF16, {t, h}, x);
      auto gr1 = upload(gpu(), DType::kBF16, {t, h}, r);
      auto gr2 = upload(gpu(), DType::kBF16, {t, h}, r);
      auto gw = upload(gpu(), DType::kBF16, {h}, w);
      auto out = allocate(gpu(), DType::kBF16, {t, h});
      RmsNormParams p;
      gpu().rmsNorm(gx.view, with_res ? gr1.view : Tensor(), gw.view, out.view, p);
      Act ref = act(t, h), fused = act(t, h);
      gpu().quantizeFp8(out.view, ref.m());
      gpu().rmsNormFp8(gx.view, with_res ? gr2.view : Tensor(), gw.view, fused.m(), p);
      expectSameBytes(downloadBytes(gpu(), fused.codes.view), downloadBytes(gpu(), ref.codes.view),
                      "codes");
      expectSameFloats(download(gpu(), fused.scales.view), download(gpu(), ref.scales.view),
                       "scales");
      if (with_res)
        expectSameFloats(download(gpu(), gr2.view), download(gpu(), gr1.view), "residual");
    }
  }
  for (auto [t, inter] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 3072}, {37, 384}, {3000, 3072}, {8, 128}}) {
    SCOPED_TRACE("swiglu " + std::to_string(t) + "x" + std::to_string(inter));
    auto gu = randomBf16(static_cast<size_t>(t * 2 * inter), rng_, -4.f, 4.f);
    auto ggu = upload(gpu(), DType::kBF16, {t, 2 * inter}, gu);
    auto out = allocate(gpu(), DType::kBF16, {t, inter});
    gpu().swiglu(ggu.view, out.view);
    Act ref = act(t, inter), fused = act(t, inter);
    gpu().quantizeFp8(out.view, ref.m());
    gpu().swigluFp8(ggu.view, fused.m());
    expectSameBytes(downloadBytes(gpu(), fused.codes.view), downloadBytes(gpu(), ref.codes.view),
                    "codes");
    expectSameFloats(download(gpu(), fused.scales.view), download(gpu(), ref.scales.view), "scales");
  }
}

// [TAG_ATTN_FP8_OUT] attentionFp8 (the Hopper kernel writing the O-proj's codes and scales from
// its epilogue) equals attention() followed by quantizeFp8, bit for bit: varlen batches, causal
// and bidirectional, lengths that end inside and on a 128-row tile, GQA 16:8 (Qwen3-0.6B) and
// 8:1. Where the options fuse (the sm90 policy with GARDEN_ATTN_FP8_OUT on, the default), the
// bf16 scratch must stay untouched.
TEST_F(GpuFp8Dense, FusedAttentionOutputEqualsAttentionThenQuantize) {
  CudaKernelOptions opts;
  ASSERT_TRUE(cudaKernelOptionsFromEnv(opts).isOk());
  const bool fused = opts.attention_sm90 && opts.attention_fp8_out;
  struct C {
    int32_t hq, hkv;
    std::vector<int32_t> lens;
  };
  for (const C& c : std::vector<C>{{16, 8, {1}},
                                   {16, 8, {17, 300, 1, 128}},
                                   {16, 8, {1000}},
                                   {8, 1, {129, 255, 64}},
                                   {16, 8, {2049, 3}}}) {
    for (bool causal : {true, false}) {
      const std::vector<int32_t> cu = cumulative(c.lens);
      const int64_t t = cu.back(), d = 128, width = (c.hq + 2 * c.hkv) * d;
      SCOPED_TRACE("T=" + std::to_string(t) + " hq " + std::to_string(c.hq) + " hkv " +
                   std::to_string(c.hkv) + (causal ? " causal" : " bidirectional"));
      auto qkv = randomBf16(static_cast<size_t>(t * width), rng_, -2.f, 2.f);
      auto gq = upload(gpu(), DType::kBF16, {t, width}, qkv);
      auto gcu = uploadI32(gpu(), {static_cast<int64_t>(cu.size())}, cu);
      AttentionParams p;
      p.num_seqs = static_cast<int32_t>(c.lens.size());
      p.num_q_heads = c.hq;
      p.num_kv_heads = c.hkv;
      p.head_dim = static_cast<int32_t>(d);
      p.max_seqlen = *std::max_element(c.lens.begin(), c.lens.end());
      p.scale = 1.f / std::sqrt(128.f);
      p.causal = causal;
      auto out = allocate(gpu(), DType::kBF16, {t, c.hq * d});
      gpu().attention(gq.view, gcu.view, out.view, p);
      Act ref = act(t, c.hq * d), got = act(t, c.hq * d);
      gpu().quantizeFp8(out.view, ref.m());
      auto scratch = allocate(gpu(), DType::kBF16, {t, c.hq * d});
      poison(gpu(), scratch.view);
      gpu().attentionFp8(gq.view, gcu.view, scratch.view, got.m(), p);
      expectSameBytes(downloadBytes(gpu(), got.codes.view), downloadBytes(gpu(), ref.codes.view),
                      "codes");
      expectSameFloats(download(gpu(), got.scales.view), download(gpu(), ref.scales.view), "scales");
      if (fused) {
        const auto sc = downloadBytes(gpu(), scratch.view);
        EXPECT_TRUE(std::all_of(sc.begin(), sc.end(), [](uint8_t b) { return b == 0xFF; }))
            << "the fused path wrote the bf16 scratch";
      }
    }
  }
}

// The mma.sync variants have no fp8 output: asked for one, they refuse (UNIMPLEMENTED, the
// variant named) instead of writing bf16 where codes are expected.
TEST_F(GpuFp8Dense, OnlyTheHopperAttentionWritesFp8) {
  cuda::AttentionArgs a;
  a.num_tokens = 4;
  a.num_seqs = 1;
  a.num_q_heads = 16;
  a.num_kv_heads = 8;
  a.head_dim = 128;
  a.scale = 0.088f;
  alignas(16) static uint8_t codes[16];
  alignas(16) static float scales[4];
  a.out_fp8 = codes;
  a.out_scales = scales;
  a.out_scale_rows = 4;
  for (auto v : {cuda::AttentionVariant::kNarrow16, cuda::AttentionVariant::kNarrow64,
                 cuda::AttentionVariant::kWide64, cuda::AttentionVariant::kWide128}) {
    const Status st = cuda::checkAttentionVariant(a, v);
    EXPECT_FALSE(st.isOk()) << cuda::attentionVariantName(v);
    EXPECT_NE(st.toString().find(cuda::attentionVariantName(v)), std::string::npos) << st.toString();
  }
  a.out_scale_rows = 3;  // fewer scale rows than tokens
  EXPECT_FALSE(cuda::checkAttentionVariant(a, cuda::AttentionVariant::kSm90).isOk());
}

// y = x · wᵀ on the quantized operands: within bf16 rounding of the f64 product of the
// dequantized values, and ~3-5 % (relative L2) from the unquantized product, as e4m3's 3
// mantissa bits on both operands give.
TEST_F(GpuFp8Dense, LinearMatchesTheDequantizedProduct) {
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {4, 1024, 1024}, {64, 4096, 1024}, {520, 1024, 3072}, {2048, 6144, 1024}, {12, 256, 512}}) {
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
    auto x = randomBf16(static_cast<size_t>(m * k), rng_, -2.f, 2.f);
    auto w = randomBf16(static_cast<size_t>(n * k), rng_, -0.05f, 0.05f);
    auto gx = upload(gpu(), DType::kBF16, {m, k}, x);
    auto gw = upload(gpu(), DType::kBF16, {n, k}, w);
    const int64_t nb = (n + 127) / 128, kb4 = cuda::fp8KBlocks4(k);
    Act wq{allocate(gpu(), DType::kU8, {n, k}), allocate(gpu(), DType::kF32, {nb, kb4})};
    gpu().quantizeFp8Weight(gw.view, wq.m());
    Act xq = act(m, k);
    gpu().quantizeFp8(gx.view, xq.m());
    auto y = allocate(gpu(), DType::kBF16, {m, n});
    poison(gpu(), y.view);
    gpu().linearFp8(xq.m(), wq.m(), y.view);
    const auto yv = download(gpu(), y.view);
    const auto xc = downloadBytes(gpu(), xq.codes.view), wc = downloadBytes(gpu(), wq.codes.view);
    const auto xs = download(gpu(), xq.scales.view), ws = download(gpu(), wq.scales.view);
    // Sampled rows (all for small m) x every column.
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < m; r += std::max<int64_t>(1, m / 16)) rows.push_back(r);
    rows.push_back(m - 1);
    std::vector<float> got, ref;
    double qerr2 = 0, exact2 = 0;
    for (int64_t r : rows)
      for (int64_t c = 0; c < n; ++c) {
        double acc = 0, exact = 0;
        for (int64_t j = 0; j < k; ++j) {
          const double xv = fp8E4m3ToFloat(xc[static_cast<size_t>(r * k + j)]) *
                            static_cast<double>(xs[static_cast<size_t>(j / 128 * m + r)]);
          const double wv =
              fp8E4m3ToFloat(wc[static_cast<size_t>(c * k + j)]) *
              static_cast<double>(ws[static_cast<size_t>(cuda::fp8WeightScaleIndex(k, c / 128, j / 128))]);
          acc += xv * wv;
          exact += static_cast<double>(x[static_cast<size_t>(r * k + j)]) * w[static_cast<size_t>(c * k + j)];
        }
        got.push_back(yv[static_cast<size_t>(r * n + c)]);
        ref.push_back(static_cast<float>(acc));
        qerr2 += (acc - exact) * (acc - exact);
        exact2 += exact * exact;
      }
    // bf16 output: 2^-8 relative, plus f32 summation order against the scale of the row.
    expectClose(got, ref, 2e-3, 8e-3, "fp8 linear vs dequantized product");
    const double qrel = std::sqrt(qerr2 / exact2);
    EXPECT_GT(qrel, 0.005) << "quantization changed nothing: were the operands quantized?";
    EXPECT_LT(qrel, 0.08) << "quantization error too large";
    std::printf("  %ldx%ldx%ld: quantized vs unquantized product rel. L2 %.4f\n",
                static_cast<long>(m), static_cast<long>(n), static_cast<long>(k), qrel);
  }
}

// Rows of M's in one GEMM bucket (GemmRunner::algoBucket: 516 and 576) get the same bits: eager
// (padded to 4 rows) and graphed (padded to the bucket) batches must agree.
TEST_F(GpuFp8Dense, LinearRowsDoNotDependOnMInsideABucket) {
  const int64_t n = 1024, k = 2048, m1 = 516, m2 = 576;
  ASSERT_EQ(cuda::GemmRunner::algoBucket(m1), cuda::GemmRunner::algoBucket(m2));
  auto x = randomBf16(static_cast<size_t>(m2 * k), rng_, -2.f, 2.f);
  auto w = randomBf16(static_cast<size_t>(n * k), rng_, -0.05f, 0.05f);
  auto gw = upload(gpu(), DType::kBF16, {n, k}, w);
  Act wq{allocate(gpu(), DType::kU8, {n, k}), allocate(gpu(), DType::kF32, {n / 128, cuda::fp8KBlocks4(k)})};
  gpu().quantizeFp8Weight(gw.view, wq.m());
  std::vector<std::vector<float>> ys;
  for (int64_t m : {m2, m1, m2}) {
    std::vector<float> xm(x.begin(), x.begin() + m * k);
    auto gx = upload(gpu(), DType::kBF16, {m, k}, xm);
    Act xq = act(m, k);
    gpu().quantizeFp8(gx.view, xq.m());
    auto y = allocate(gpu(), DType::kBF16, {m, n});
    gpu().linearFp8(xq.m(), wq.m(), y.view);
    auto v = download(gpu(), y.view);
    v.resize(static_cast<size_t>(m1 * n));
    ys.push_back(v);
  }
  expectSameFloats(ys[1], ys[0], "rows 0..515 at M=516 vs M=576");
  expectSameFloats(ys[2], ys[0], "M=576 twice");
}

}  // namespace
}  // namespace garden::rose::gputest
