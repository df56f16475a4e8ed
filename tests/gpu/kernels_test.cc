// Every CUDA op against the CPU fp32 reference backend on fresh random inputs (bf16-representable,
// never zeros), GPU outputs poisoned with NaN before each run, many shapes including odd sizes and
// batch 1. Label `gpu`: needs a CUDA device (fails, never skips, without one).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>

#include "services/rose/ops/cuda/attention.cuh"
#include "services/rose/ops/cuda/cuda_backend.h"
#include "services/rose/ops/cuda/gemm_chain.cuh"
#include "services/rose/ops/cuda/gemm_smallm.cuh"
#include "services/rose/ops/cuda/gemv.cuh"
#include "services/rose/ops/cuda/pool.cuh"
#include "services/rose/ops/cuda/qk_norm_rope.cuh"
#include "services/rose/ops/cuda/rms_norm.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace garden::rose::gputest {
namespace {

std::string shape(std::initializer_list<int64_t> dims) {
  std::ostringstream s;
  bool first = true;
  for (int64_t d : dims) {
    if (!first) s << 'x';
    s << d;
    first = false;
  }
  return s.str();
}

class GpuOps : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = makeBackends();
    ASSERT_TRUE(be_.cpu && be_.gpu);
    rng_.seed(::testing::UnitTest::GetInstance()->random_seed() + 12345);
  }
  Backend& cpu() { return *be_.cpu; }
  Backend& gpu() { return *be_.gpu; }
  DType act() { return gpu().activationDType(); }
  // One linear layer's operands: x [m, k] in [-1, 1], w [n, k] in +-0.03, bias [n] in +-0.5 (drawn
  // in that order), on the GPU as bf16 with a y of `ydt`, and the CPU's f32 y of the first
  // `ref_rows` rows (with the bias when `bias`).
  struct LinearCase {
    OwnedTensor gx, gw, gb, gy;
    std::vector<float> ref;
  };
  LinearCase linearCase(int64_t m, int64_t n, int64_t k, bool bias, DType ydt, int64_t ref_rows) {
    auto x = randomBf16(static_cast<size_t>(m * k), rng_, -1.f, 1.f);
    auto w = randomBf16(static_cast<size_t>(n * k), rng_, -0.03f, 0.03f);
    auto b = randomBf16(static_cast<size_t>(n), rng_, -0.5f, 0.5f);
    LinearCase c{upload(gpu(), act(), {m, k}, x), upload(gpu(), gpu().weightDType(), {n, k}, w),
                 upload(gpu(), gpu().weightDType(), {n}, b), allocate(gpu(), ydt, {m, n}), {}};
    auto cx = upload(cpu(), DType::kF32, {ref_rows, k},
                     std::vector<float>(x.begin(), x.begin() + ref_rows * k));
    auto cw = upload(cpu(), DType::kF32, {n, k}, w);
    auto cbias = upload(cpu(), DType::kF32, {n}, b);
    auto cy = allocate(cpu(), DType::kF32, {ref_rows, n});
    cpu().linear(cx.view, cw.view, bias ? cbias.view : Tensor(), cy.view);
    c.ref = download(cpu(), cy.view);
    return c;
  }
  Backends be_;
  std::mt19937 rng_;
};

TEST_F(GpuOps, EmbeddingGatherIsExact) {
  const int64_t vocab = 777;
  for (auto [t, h] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {17, 1024}, {300, 1024}, {1000, 2560}}) {
    SCOPED_TRACE(shape({t, h}));
    auto table = randomBf16(static_cast<size_t>(vocab * h), rng_);
    std::vector<int32_t> ids(static_cast<size_t>(t));
    std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
    for (auto& x : ids) x = d(rng_);
    ids[0] = static_cast<int32_t>(vocab - 1);
    auto ct = upload(cpu(), DType::kF32, {vocab, h}, table);
    auto gt = upload(gpu(), gpu().weightDType(), {vocab, h}, table);
    auto ci = uploadI32(cpu(), {t}, ids);
    auto gi = uploadI32(gpu(), {t}, ids);
    auto co = allocate(cpu(), DType::kF32, {t, h});
    auto go = allocate(gpu(), gpu().residualDType(), {t, h});
    poison(gpu(), go.view);
    cpu().embedding(ct.view, ci.view, co.view);
    gpu().embedding(gt.view, gi.view, go.view);
    expectClose(download(gpu(), go.view), download(cpu(), co.view), 0, 0, "embedding");
  }
}

TEST_F(GpuOps, RmsNormWithAndWithoutResidual) {
  for (auto [t, h] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1024}, {17, 8}, {97, 2560}, {1000, 1024}, {64, 4096}, {33, 2880}, {2000, 1024}}) {
    for (bool with_res : {false, true}) {
      SCOPED_TRACE(shape({t, h}) + (with_res ? " residual" : " plain"));
      auto x = randomBf16(static_cast<size_t>(t * h), rng_, -2.f, 2.f);
      auto r = randomBf16(static_cast<size_t>(t * h), rng_, -2.f, 2.f);
      auto w = randomBf16(static_cast<size_t>(h), rng_, 0.5f, 1.5f);
      auto cx = upload(cpu(), DType::kF32, {t, h}, x);
      auto gx = upload(gpu(), act(), {t, h}, x);
      auto cr = upload(cpu(), DType::kF32, {t, h}, r);
      auto gr = upload(gpu(), gpu().residualDType(), {t, h}, r);
      auto cw = upload(cpu(), DType::kF32, {h}, w);
      auto gw = upload(gpu(), gpu().weightDType(), {h}, w);
      auto co = allocate(cpu(), DType::kF32, {t, h});
      auto go = allocate(gpu(), act(), {t, h});
      poison(gpu(), go.view);
      RmsNormParams p;
      p.eps = 1e-6f;
      cpu().rmsNorm(cx.view, with_res ? cr.view : Tensor(), cw.view, co.view, p);
      gpu().rmsNorm(gx.view, with_res ? gr.view : Tensor(), gw.view, go.view, p);
      expectClose(download(gpu(), go.view), download(cpu(), co.view), 2e-2, 2e-2, "rms_norm out");
      if (with_res) {
        expectClose(download(gpu(), gr.view), download(cpu(), cr.view), 1e-2, 8e-3,
                    "rms_norm residual");
      }
    }
  }
}

TEST_F(GpuOps, RmsNormF32ResidualStream) {
  // gpt-oss keeps its residual stream in f32 (GptOssOptions::f32_residual): the add is the CPU
  // reference's f32 add, so the stream must equal it bit for bit; residual_init starts the stream
  // from x (the old contents, poisoned here, are not read). Both kernels (few rows: one row per
  // block; many rows) and both modes.
  for (auto [t, h] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 2880}, {3, 1024}, {17, 8}, {97, 2880}, {1000, 2880}, {2000, 1024}}) {
    for (bool init : {false, true}) {
      SCOPED_TRACE(shape({t, h}) + (init ? " init" : " add"));
      auto x = randomBf16(static_cast<size_t>(t * h), rng_, -2.f, 2.f);
      std::vector<float> r(static_cast<size_t>(t * h));
      std::uniform_real_distribution<float> d(-30.f, 30.f);
      for (auto& v : r) v = d(rng_);  // f32 values, not bf16-representable
      auto w = randomBf16(static_cast<size_t>(h), rng_, 0.5f, 1.5f);
      auto cx = upload(cpu(), DType::kF32, {t, h}, x);
      auto gx = upload(gpu(), act(), {t, h}, x);
      auto cr = upload(cpu(), DType::kF32, {t, h}, r);
      auto gr = upload(gpu(), DType::kF32, {t, h}, r);
      if (init) poison(gpu(), gr.view);
      auto cw = upload(cpu(), DType::kF32, {h}, w);
      auto gw = upload(gpu(), gpu().weightDType(), {h}, w);
      auto co = allocate(cpu(), DType::kF32, {t, h});
      auto go = allocate(gpu(), act(), {t, h});
      poison(gpu(), go.view);
      RmsNormParams p;
      p.eps = 1e-6f;
      p.residual_init = init;
      cpu().rmsNorm(cx.view, cr.view, cw.view, co.view, p);
      gpu().rmsNorm(gx.view, gr.view, gw.view, go.view, p);
      expectClose(download(gpu(), gr.view), download(cpu(), cr.view), 0, 0, "f32 residual");
      expectClose(download(gpu(), go.view), download(cpu(), co.view), 2e-2, 2e-2, "rms_norm out");
    }
  }
}

TEST_F(GpuOps, RmsNormRowDoesNotDependOnRowCount) {
  // Few rows (< 4 per SM) take the one-row-per-block kernel with one chunk per thread, many rows
  // the multi-row kernel; both sum a row's squares in the same order, so a row's bits (out and
  // the updated residual) are the same whether it is normalized among 1000 rows or among 100.
  const int64_t t = 1000, few = 100;
  for (int64_t h : {1024, 2880, 4096}) {
    for (bool with_res : {false, true}) {
      SCOPED_TRACE("hidden " + std::to_string(h) + (with_res ? " residual" : " plain"));
      auto x = randomBf16(static_cast<size_t>(t * h), rng_, -2.f, 2.f);
      auto r = randomBf16(static_cast<size_t>(t * h), rng_, -2.f, 2.f);
      auto w = randomBf16(static_cast<size_t>(h), rng_, 0.5f, 1.5f);
      auto gw = upload(gpu(), gpu().weightDType(), {h}, w);
      // The first `rows` rows of x and r uploaded, and a poisoned output.
      struct Io {
        OwnedTensor x, r, out;
      };
      auto inputs = [&](int64_t rows) {
        const auto len = static_cast<std::ptrdiff_t>(rows * h);
        Io io{upload(gpu(), act(), {rows, h}, std::vector<float>(x.begin(), x.begin() + len)),
              upload(gpu(), gpu().residualDType(), {rows, h},
                     std::vector<float>(r.begin(), r.begin() + len)),
              allocate(gpu(), act(), {rows, h})};
        poison(gpu(), io.out.view);
        return io;
      };
      std::vector<float> outs[2], ress[2];
      for (int64_t rows : {t, few}) {
        auto [gx, gr, go] = inputs(rows);
        gpu().rmsNorm(gx.view, with_res ? gr.view : Tensor(), gw.view, go.view, {});
        outs[rows == few] = download(gpu(), go.view);
        ress[rows == few] = download(gpu(), gr.view);
      }
      const size_t n = static_cast<size_t>(few * h);
      EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[1].data(), n * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(ress[0].data(), ress[1].data(), n * sizeof(float)));
      for (size_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(outs[1][i])) << i;
      // The launcher's kernel at 1, 63, 64 and 100 rows (the split kernel for few rows): the
      // same bits as among 1000 rows.
      for (int64_t rows : {int64_t{1}, int64_t{63}, int64_t{64}, few}) {
        SCOPED_TRACE(std::to_string(rows) + " rows");
        auto [gx, gr, go] = inputs(rows);
        cuda::RmsNormArgs a;
        a.x = gx.view.as<__nv_bfloat16>();
        if (with_res && gr.view.dtype == DType::kF32) {
          a.residual_f32 = gr.view.as<float>();
        } else if (with_res) {
          a.residual = gr.view.as<__nv_bfloat16>();
        }
        a.weight = gw.view.as<__nv_bfloat16>();
        a.out = go.view.as<__nv_bfloat16>();
        a.rows = rows;
        a.hidden = h;
        ASSERT_TRUE(cuda::launchRmsNorm(a, nullptr, false).isOk());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const size_t m = static_cast<size_t>(rows * h);
        const std::vector<float> o = download(gpu(), go.view), rr = download(gpu(), gr.view);
        EXPECT_EQ(0, std::memcmp(outs[0].data(), o.data(), m * sizeof(float)));
        if (with_res) {
          EXPECT_EQ(0, std::memcmp(ress[0].data(), rr.data(), m * sizeof(float)));
        }
      }
    }
  }
}

TEST_F(GpuOps, RmsNormOutAliasesX) {
  const int64_t t = 19, h = 1024;
  auto x = randomBf16(static_cast<size_t>(t * h), rng_, -2.f, 2.f);
  auto w = randomBf16(static_cast<size_t>(h), rng_, 0.5f, 1.5f);
  auto cx = upload(cpu(), DType::kF32, {t, h}, x);
  auto gx = upload(gpu(), act(), {t, h}, x);
  auto cw = upload(cpu(), DType::kF32, {h}, w);
  auto gw = upload(gpu(), gpu().weightDType(), {h}, w);
  cpu().rmsNorm(cx.view, Tensor(), cw.view, cx.view, {});
  gpu().rmsNorm(gx.view, Tensor(), gw.view, gx.view, {});
  expectClose(download(gpu(), gx.view), download(cpu(), cx.view), 2e-2, 2e-2, "rms_norm in place");
}

TEST_F(GpuOps, LinearMatchesReference) {
  struct S {
    int64_t m, n, k;
    bool bias;
  };
  for (S s : std::vector<S>{{1, 1024, 1024, false},
                            {17, 6144, 1024, false},
                            {97, 1024, 3072, false},
                            {300, 2048, 1024, true},
                            {1000, 256, 128, false},
                            {5, 1032, 520, true},
                            // Qwen3-0.6B shapes at 128 tokens (tuned choices: split-K likely).
                            {128, 1024, 2048, false},
                            {128, 1024, 3072, false},
                            {128, 6144, 1024, false}}) {
    SCOPED_TRACE(shape({s.m, s.n, s.k}) + (s.bias ? " bias" : ""));
    auto x = randomBf16(static_cast<size_t>(s.m * s.k), rng_, -1.f, 1.f);
    auto w = randomBf16(static_cast<size_t>(s.n * s.k), rng_, -0.06f, 0.06f);
    auto b = randomBf16(static_cast<size_t>(s.n), rng_, -0.5f, 0.5f);
    auto cx = upload(cpu(), DType::kF32, {s.m, s.k}, x);
    auto gx = upload(gpu(), act(), {s.m, s.k}, x);
    auto cw = upload(cpu(), DType::kF32, {s.n, s.k}, w);
    auto gw = upload(gpu(), gpu().weightDType(), {s.n, s.k}, w);
    auto cb = upload(cpu(), DType::kF32, {s.n}, b);
    auto gb = upload(gpu(), gpu().weightDType(), {s.n}, b);
    auto cy = allocate(cpu(), DType::kF32, {s.m, s.n});
    auto gy = allocate(gpu(), act(), {s.m, s.n});
    poison(gpu(), gy.view);
    cpu().linear(cx.view, cw.view, s.bias ? cb.view : Tensor(), cy.view);
    gpu().linear(gx.view, gw.view, s.bias ? gb.view : Tensor(), gy.view);
    auto ref = download(cpu(), cy.view);
    double mx = 0;
    for (float v : ref) mx = std::max(mx, static_cast<double>(std::fabs(v)));
    expectClose(download(gpu(), gy.view), ref, 1e-2 * mx, 1e-2, "linear");
  }
}

// [TAG_ATTN_F16] [TAG_PROJ_F32] fp16 operands: y in fp16 with an fp16 bias (gpt-oss's fp16
// attention projections), y in f32 with an f32 bias (the projections kept in f32) and without one
// (lm_head). The reference is the CPU's f32 GEMM on the same (fp16-exact) values: the f32 output
// differs from it only by the summation order, the fp16 output also by its rounding.
TEST_F(GpuOps, LinearF16OperandsMatchReference) {
  struct S {
    int64_t m, n, k;
  };
  for (S s : std::vector<S>{{1, 5120, 2880}, {7, 2880, 4096}, {300, 1032, 520}, {1000, 256, 128}}) {
    SCOPED_TRACE(shape({s.m, s.n, s.k}));
    auto gx = upload(gpu(), DType::kF16, {s.m, s.k},
                     randomBf16(static_cast<size_t>(s.m * s.k), rng_, -1.f, 1.f));
    auto gw = upload(gpu(), DType::kF16, {s.n, s.k},
                     randomBf16(static_cast<size_t>(s.n * s.k), rng_, -0.06f, 0.06f));
    auto gb16 =
        upload(gpu(), DType::kF16, {s.n}, randomBf16(static_cast<size_t>(s.n), rng_, -0.5f, 0.5f));
    auto bias = download(gpu(), gb16.view);
    auto gb32 = upload(gpu(), DType::kF32, {s.n}, bias);
    auto cx = upload(cpu(), DType::kF32, {s.m, s.k}, download(gpu(), gx.view));
    auto cw = upload(cpu(), DType::kF32, {s.n, s.k}, download(gpu(), gw.view));
    auto cb = upload(cpu(), DType::kF32, {s.n}, bias);
    auto cy = allocate(cpu(), DType::kF32, {s.m, s.n});
    auto cyn = allocate(cpu(), DType::kF32, {s.m, s.n});
    cpu().linear(cx.view, cw.view, cb.view, cy.view);
    cpu().linear(cx.view, cw.view, Tensor(), cyn.view);
    auto ref = download(cpu(), cy.view);
    auto ref_nb = download(cpu(), cyn.view);
    double mx = 0;
    for (float v : ref) mx = std::max(mx, static_cast<double>(std::fabs(v)));
    auto y16 = allocate(gpu(), DType::kF16, {s.m, s.n});
    auto y32 = allocate(gpu(), DType::kF32, {s.m, s.n});
    auto y32n = allocate(gpu(), DType::kF32, {s.m, s.n});
    for (auto* y : {&y16, &y32, &y32n}) poison(gpu(), y->view);
    gpu().linear(gx.view, gw.view, gb16.view, y16.view);
    gpu().linear(gx.view, gw.view, gb32.view, y32.view);
    gpu().linear(gx.view, gw.view, Tensor(), y32n.view);
    const auto got16 = download(gpu(), y16.view), got32 = download(gpu(), y32.view);
    // fp16 output: half an ulp (2^-11 relative) plus the summation order.
    expectClose(got16, ref, 1e-4 * mx, 1e-3, "fp16 out, fp16 bias");
    // f32 output: the summation order only (K terms of exact products, f32 sums).
    expectClose(got32, ref, 5e-5 * mx, 1e-5, "f32 out, f32 bias");
    expectClose(download(gpu(), y32n.view), ref_nb, 5e-5 * mx, 1e-5, "f32 out, no bias");
    double e16 = 0, e32 = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      e16 = std::max(e16, std::fabs(static_cast<double>(got16[i]) - ref[i]));
      e32 = std::max(e32, std::fabs(static_cast<double>(got32[i]) - ref[i]));
    }
    std::cout << "[ f16 linear ] " << shape({s.m, s.n, s.k}) << ": max |err| fp16 out " << e16
              << ", f32 out " << e32 << " (max |y| " << mx << ")\n";
    EXPECT_LT(e32, e16) << "the f32 output must be closer than the rounded one";
  }
}

TEST_F(GpuOps, LinearRowBitsDependOnlyOnTheMBucket) {
  // gemm.h: with tuning on, one algorithm per (M bucket, N, K): a row's bits do not change with
  // the number of rows inside one bucket (that is what keeps graphed == eager bit for bit, the
  // graph padding M within its bucket). Across buckets the timed choice may differ (split-K
  // changes the f32 summation order), so rows only agree to within bf16 rounding. With tuning
  // off (GARDEN_GEMM_TUNE=0) there is one algorithm per (N, K) and every M gives the same bits.
  const int64_t n = 1024, k = 3072, m = 1000;
  auto x = randomBf16(static_cast<size_t>(m * k), rng_, -1.f, 1.f);
  auto w = randomBf16(static_cast<size_t>(n * k), rng_, -0.06f, 0.06f);
  auto gw = upload(gpu(), gpu().weightDType(), {n, k}, w);
  auto gx = upload(gpu(), act(), {m, k}, x);
  auto gy = allocate(gpu(), act(), {m, n});
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  ASSERT_TRUE(gpu().synchronize().isOk());
  for (bool tune : {true, false}) {
    SCOPED_TRACE(tune ? "tuned" : "untuned");
    auto runner = cuda::GemmRunner::create(size_t{32} << 20, tune);
    ASSERT_TRUE(runner.isOk()) << runner.status().toString();
    cuda::GemmRunner& g = **runner;
    auto run = [&](int64_t rows, const Tensor& y) {
      Status s = g.run(gx.view.as<__nv_bfloat16>(), gw.view.as<__nv_bfloat16>(), nullptr,
                       y.as<__nv_bfloat16>(), rows, n, k, cb.stream());
      ASSERT_TRUE(s.isOk()) << s.toString();
    };
    poison(gpu(), gy.view);
    run(m, gy.view);
    auto full = download(gpu(), gy.view);
    EXPECT_EQ(g.tunedShapes() > 0, tune);  // 1000 x 1024 x 3072 has many candidates
    for (int64_t rows : {961, 999, 1, 2, 17, 64, 97, 640}) {
      SCOPED_TRACE("rows " + std::to_string(rows));
      auto sub = gy.view.rowSlice(0, rows);
      poison(gpu(), sub);
      run(rows, sub);
      auto part = download(gpu(), sub);
      std::vector<float> want(full.begin(),
                              full.begin() + static_cast<std::ptrdiff_t>(part.size()));
      if (!tune || cuda::GemmRunner::algoBucket(rows) == cuda::GemmRunner::algoBucket(m)) {
        EXPECT_EQ(0, std::memcmp(part.data(), want.data(), part.size() * sizeof(float)));
      } else {
        expectWithinBf16Rounding(part, want, "rows " + std::to_string(rows) + " vs 1000");
      }
    }
    EXPECT_EQ(g.untimedInCapture(), 0u);
    EXPECT_EQ(g.variantFallbacks(), 0u);  // every M ran its bucket's algorithm
  }
  EXPECT_EQ(cuda::GemmRunner::algoBucket(1), 64);
  EXPECT_EQ(cuda::GemmRunner::algoBucket(1000), 1024);
  EXPECT_EQ(cuda::GemmRunner::algoBucket(1025), 1280);
  EXPECT_EQ(cuda::GemmRunner::algoBucket(4097), 5120);
  for (uint32_t t = 1; t <= 9000; ++t) {  // graph buckets nest in algorithm buckets
    ASSERT_EQ(cuda::GemmRunner::algoBucket(graphTokensBucket(t)), cuda::GemmRunner::algoBucket(t))
        << t;
  }
}

// [TAG_GEMM_CHAIN] The K-chain tensor-core kernel against the CPU (within bf16 rounding of the
// output) at gpt-oss's QKV / O-proj shapes and small odd ones, M = 1 .. 16 (one and two n8 token
// tiles), both ring depths; and a row's bits do not depend on M or the depth (one K chain per
// output, the same for every shape) — the property that lets the tuner compare it with the
// reference algorithm at one M for its whole bucket.
TEST_F(GpuOps, ChainGemmMatchesCpuAndKeepsRowsAcrossM) {
  struct Shape {
    int64_t n, k;
    bool bias;
  };
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  ASSERT_TRUE(cuda::prepareChainGemm().isOk());
  constexpr int64_t kMaxM = 16;
  for (Shape sh : {Shape{5120, 2880, true}, Shape{2880, 4096, true}, Shape{64, 128, false},
                   Shape{48, 192, true}}) {
    SCOPED_TRACE(shape({kMaxM, sh.n, sh.k}));
    LinearCase lc = linearCase(kMaxM, sh.n, sh.k, sh.bias, DType::kBF16, kMaxM);
    const OwnedTensor &gx = lc.gx, &gw = lc.gw, &gb = lc.gb, &gy = lc.gy;
    const auto& ref = lc.ref;
    std::vector<float> first;  // row 0 of the first run
    for (int stages : {8, 16}) {
      for (int64_t m : {1, 3, 8, 9, 16}) {
        SCOPED_TRACE("M=" + std::to_string(m) + " stages " + std::to_string(stages));
        ASSERT_TRUE(cuda::chainGemmSupported(m, sh.n, sh.k, stages));
        auto y = gy.view.rowSlice(0, m);
        poison(gpu(), gy.view);
        cuda::ChainGemmArgs a;
        a.x = gx.view.as<__nv_bfloat16>();
        a.w = gw.view.as<__nv_bfloat16>();
        a.bias = sh.bias ? gb.view.as<__nv_bfloat16>() : nullptr;
        a.y = y.as<__nv_bfloat16>();
        a.m = m;
        a.n = sh.n;
        a.k = sh.k;
        a.stages = stages;
        Status st = cuda::launchChainGemm(a, cb.stream());
        ASSERT_TRUE(st.isOk()) << st.toString();
        const auto got = download(gpu(), y);
        std::vector<float> cref(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(got.size()));
        double mx = 0;
        for (float v : cref) mx = std::max(mx, static_cast<double>(std::fabs(v)));
        expectClose(got, cref, 1e-2 * mx, 1e-2, "chain gemm vs CPU");
        // Rows past m untouched (poisoned): the full buffer's row m is still the poison.
        if (m < kMaxM) {
          const auto all = download(gpu(), gy.view);
          EXPECT_TRUE(std::isnan(all[static_cast<size_t>(m * sh.n)]) ||
                      std::fabs(all[static_cast<size_t>(m * sh.n)]) > 1e30)
              << "a row past m was written";
        }
        const std::vector<float> row0(got.begin(), got.begin() + sh.n);
        if (first.empty()) first = row0;
        EXPECT_EQ(0, std::memcmp(first.data(), row0.data(), row0.size() * sizeof(float)))
            << "row 0's bits depend on M or the ring depth";
        // [TAG_CHAIN_PDL] Launched programmatically: the same bits.
        poison(gpu(), gy.view);
        a.pdl = true;
        st = cuda::launchChainGemm(a, cb.stream());
        ASSERT_TRUE(st.isOk()) << st.toString();
        const auto pdl_got = download(gpu(), y);
        EXPECT_EQ(0, std::memcmp(pdl_got.data(), got.data(), got.size() * sizeof(float)))
            << "the programmatic launch changed the output";
      }
    }
  }
}

// [TAG_CHAIN_PDL] A programmatic K-chain launch streams weights before its wait but reads its
// input only after the previous kernel is done: a chain GEMM (O-proj-shaped, itself programmatic,
// so it lets the next one be scheduled at once) writes x2 right after x2 was poisoned (NaN bytes),
// and a QKV-shaped chain GEMM launched programmatically behind it reads x2. 40 rounds (both ring
// depths, M = 1 and 9) must each give the bits of the same pair run plainly with a
// synchronization between them; a read before the wait would see NaN.
TEST_F(GpuOps, ChainGemmPdlReadsItsInputAfterThePreviousKernel) {
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  ASSERT_TRUE(cuda::prepareChainGemm().isOk());
  const int64_t k1 = 4096, n1 = 2880, n2 = 5120, mmax = 9;
  auto gx = upload(gpu(), DType::kBF16, {mmax, k1},
                   randomBf16(static_cast<size_t>(mmax * k1), rng_, -1.f, 1.f));
  auto gw1 = upload(gpu(), DType::kBF16, {n1, k1},
                    randomBf16(static_cast<size_t>(n1 * k1), rng_, -0.03f, 0.03f));
  auto gw2 = upload(gpu(), DType::kBF16, {n2, n1},
                    randomBf16(static_cast<size_t>(n2 * n1), rng_, -0.03f, 0.03f));
  auto gb2 = upload(gpu(), DType::kBF16, {n2}, randomBf16(static_cast<size_t>(n2), rng_, -0.5f, 0.5f));
  auto gx2 = allocate(gpu(), DType::kBF16, {mmax, n1});
  auto gy = allocate(gpu(), DType::kBF16, {mmax, n2});
  auto args = [](const OwnedTensor& x, const OwnedTensor& w, const OwnedTensor* bias,
                 const OwnedTensor& y, int64_t m, int64_t n, int64_t k, int stages, bool pdl) {
    cuda::ChainGemmArgs a;
    a.x = x.view.as<__nv_bfloat16>();
    a.w = w.view.as<__nv_bfloat16>();
    a.bias = bias != nullptr ? bias->view.as<__nv_bfloat16>() : nullptr;
    a.y = y.view.as<__nv_bfloat16>();
    a.m = m;
    a.n = n;
    a.k = k;
    a.stages = stages;
    a.pdl = pdl;
    return a;
  };
  auto pair = [&](int64_t m, int stages, bool pdl, bool sync_between) {
    const cuda::ChainGemmArgs a1 = args(gx, gw1, nullptr, gx2, m, n1, k1, stages, pdl);
    const cuda::ChainGemmArgs a2 = args(gx2, gw2, &gb2, gy, m, n2, n1, stages, pdl);
    poison(gpu(), gx2.view);
    poison(gpu(), gy.view);
    Status st = cuda::launchChainGemm(a1, cb.stream());
    if (st.isOk() && sync_between && cudaStreamSynchronize(cb.stream()) != cudaSuccess)
      st = internalError("sync");
    if (st.isOk()) st = cuda::launchChainGemm(a2, cb.stream());
    EXPECT_TRUE(st.isOk()) << st.toString();
    auto all = download(gpu(), gy.view);
    all.resize(static_cast<size_t>(m * n2));
    return all;
  };
  for (int64_t m : {1, 9}) {
    for (int stages : {8, 16}) {
      SCOPED_TRACE("M=" + std::to_string(m) + " stages " + std::to_string(stages));
      const auto want = pair(m, stages, false, true);
      size_t nan = 0;
      for (float v : want) nan += std::isnan(v) ? 1 : 0;
      ASSERT_EQ(nan, 0u) << "the plain pair left NaN: the check could not tell";
      for (int round = 0; round < 10; ++round) {
        const auto got = pair(m, stages, true, false);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
            << "round " << round << ": the programmatic pair differs (an input read too early?)";
      }
    }
  }
}

// [TAG_GEMM_ROW_INVARIANT] With row invariance on, every M bucket of a shape gives a row the
// reference algorithm's bits: the first rows at M = 1 .. 2048 (small buckets on, as the gpt-oss
// ops run them) equal those of M = 2048 bit for bit, for gpt-oss's QKV (5120 x 2880, bias), O-proj
// (2880 x 4096, bias) and an f32-output shape like its lm_head (32768 x 2880), and stay within
// bf16 rounding of the CPU. Without it the same runner may pick split-K at small M (the O-proj
// did on the H200): how many buckets then differ is printed, not held.
TEST_F(GpuOps, LinearRowInvariantGivesEveryBucketTheReferenceBits) {
  struct Shape {
    int64_t n, k;
    bool f32_out;
  };
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  constexpr int64_t kMaxM = 2048;
  constexpr int64_t kRows = 3;  // rows compared
  for (Shape sh : {Shape{5120, 2880, false}, Shape{2880, 4096, false}, Shape{32768, 2880, true}}) {
    SCOPED_TRACE(shape({kMaxM, sh.n, sh.k}) + (sh.f32_out ? " f32 out" : " bf16 out, bias"));
    LinearCase lc = linearCase(kMaxM, sh.n, sh.k, !sh.f32_out,
                               sh.f32_out ? DType::kF32 : DType::kBF16, kRows);
    const OwnedTensor &gx = lc.gx, &gw = lc.gw, &gb = lc.gb, &gy = lc.gy;
    const auto& ref = lc.ref;
    for (bool invariant : {true, false}) {
      SCOPED_TRACE(invariant ? "row invariant" : "per-bucket tuning");
      auto runner = cuda::GemmRunner::create(size_t{32} << 20, true);
      ASSERT_TRUE(runner.isOk()) << runner.status().toString();
      cuda::GemmRunner& g = **runner;
      g.setSmallBuckets(true);
      g.setRowInvariant(invariant);
      g.setChainGemm(invariant);  // [TAG_GEMM_CHAIN] a candidate, kept only if its rows equal
      auto run = [&](int64_t rows) {
        auto y = gy.view.rowSlice(0, rows);
        poison(gpu(), y);
        Status st = sh.f32_out
                        ? g.runF32(gx.view.as<__nv_bfloat16>(), gw.view.as<__nv_bfloat16>(),
                                   y.as<float>(), rows, sh.n, sh.k, cb.stream())
                        : g.run(gx.view.as<__nv_bfloat16>(), gw.view.as<__nv_bfloat16>(),
                                gb.view.as<__nv_bfloat16>(), y.as<__nv_bfloat16>(), rows, sh.n,
                                sh.k, cb.stream());
        EXPECT_TRUE(st.isOk()) << st.toString();
        auto all = download(gpu(), y);
        all.resize(static_cast<size_t>(std::min(rows, kRows) * sh.n));
        return all;
      };
      const auto top = run(kMaxM);
      int differing = 0;
      std::string which;
      for (int64_t rows : {1, 2, 3, 4, 8, 16, 64, 65, 256, 1100}) {
        SCOPED_TRACE("M=" + std::to_string(rows));
        const auto got = run(rows);
        const bool same = std::memcmp(got.data(), top.data(), got.size() * sizeof(float)) == 0;
        if (!same) {
          ++differing;
          which += ' ';
          which += std::to_string(rows);
        }
        if (invariant) {
          EXPECT_TRUE(same) << "a row's bits depend on the bucket";
        }
        std::vector<float> cref(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(got.size()));
        double mx = 0;
        for (float v : cref) mx = std::max(mx, static_cast<double>(std::fabs(v)));
        expectClose(got, cref, 1e-2 * mx, 1e-2, "vs CPU");
      }
      if (invariant) {
        EXPECT_EQ(g.invariantMisses(), 0u);
      }
      std::cout << "[ row invariance ] n=" << sh.n << " k=" << sh.k << (sh.f32_out ? " f32" : "")
                << (invariant ? " on" : " off") << ": " << differing
                << " of 10 M differ from M = 2048 in their first rows" << (which.empty() ? "" : " (M =")
                << which << (which.empty() ? "" : ")") << "; candidates refused for it "
                << g.invariantRejects() << ", buckets won by the K-chain kernel " << g.chainWins()
                << "\n";
    }
  }
}

// [TAG_GEMM_SMALL_BUCKETS] With small buckets (the gpt-oss ops turn them on), M <= 8 is tuned in
// power-of-two buckets: the rows of M = 3 equal those of M = 4 (the graph pads 3 sequences to 4)
// bit for bit, M = 1 and M = 5..8 get their own timed choices, each within bf16 rounding of the
// 64-row bucket's and of the CPU reference, and M >= 9 keeps the 64-row bucket. The gpt-oss
// decode shapes (QKV 5120 x 2880 with bias, O 2880 x 4096).
TEST_F(GpuOps, LinearSmallBucketsNestPowerOfTwoGraphs) {
  struct Shape {
    int64_t n, k;
  };
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  for (Shape sh : {Shape{5120, 2880}, Shape{2880, 4096}}) {
    SCOPED_TRACE(shape({64, sh.n, sh.k}));
    const int64_t m = 64;
    auto x = randomBf16(static_cast<size_t>(m * sh.k), rng_, -1.f, 1.f);
    auto w = randomBf16(static_cast<size_t>(sh.n * sh.k), rng_, -0.03f, 0.03f);
    auto b = randomBf16(static_cast<size_t>(sh.n), rng_, -0.5f, 0.5f);
    auto gw = upload(gpu(), gpu().weightDType(), {sh.n, sh.k}, w);
    auto gb = upload(gpu(), gpu().weightDType(), {sh.n}, b);
    auto gx = upload(gpu(), act(), {m, sh.k}, x);
    auto gy = allocate(gpu(), act(), {m, sh.n});
    auto cx = upload(cpu(), DType::kF32, {m, sh.k}, x);
    auto cw = upload(cpu(), DType::kF32, {sh.n, sh.k}, w);
    auto cbias = upload(cpu(), DType::kF32, {sh.n}, b);
    auto cy = allocate(cpu(), DType::kF32, {m, sh.n});
    cpu().linear(cx.view, cw.view, cbias.view, cy.view);
    const auto ref = download(cpu(), cy.view);
    auto runner = cuda::GemmRunner::create(size_t{32} << 20, true);
    ASSERT_TRUE(runner.isOk()) << runner.status().toString();
    cuda::GemmRunner& g = **runner;
    g.setSmallBuckets(true);
    auto run = [&](int64_t rows) {
      auto y = gy.view.rowSlice(0, rows);
      poison(gpu(), y);
      Status st = g.run(gx.view.as<__nv_bfloat16>(), gw.view.as<__nv_bfloat16>(),
                        gb.view.as<__nv_bfloat16>(), y.as<__nv_bfloat16>(), rows, sh.n, sh.k,
                        cb.stream());
      EXPECT_TRUE(st.isOk()) << st.toString();
      return download(gpu(), y);
    };
    const auto full = run(m);  // the 64-row bucket
    std::map<int64_t, std::vector<float>> got;
    for (int64_t rows : {4, 3, 1, 2, 8, 5, 9}) got[rows] = run(rows);
    EXPECT_EQ(g.bucketOf(1), 1);
    EXPECT_EQ(g.bucketOf(3), 4);
    EXPECT_EQ(g.bucketOf(5), 8);
    EXPECT_EQ(g.bucketOf(9), 64);
    EXPECT_EQ(0, std::memcmp(got[3].data(), got[4].data(), got[3].size() * sizeof(float)))
        << "M = 3 and its padded graph M = 4 differ";
    EXPECT_EQ(0, std::memcmp(got[5].data(), got[8].data(), got[5].size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(got[9].data(), full.data(), got[9].size() * sizeof(float)))
        << "M = 9 left the 64-row bucket";
    for (const auto& [rows, y] : got) {
      SCOPED_TRACE("rows " + std::to_string(rows));
      std::vector<float> want(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(y.size()));
      expectWithinBf16Rounding(y, want, "small bucket vs the 64-row bucket");
      std::vector<float> cref(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(y.size()));
      double mx = 0;
      for (float v : cref) mx = std::max(mx, static_cast<double>(std::fabs(v)));
      expectClose(y, cref, 1e-2 * mx, 1e-2, "small bucket vs CPU");
    }
    EXPECT_EQ(g.untimedInCapture(), 0u);
    std::cout << "[ small buckets ] n=" << sh.n << " k=" << sh.k << ": " << g.tunedShapes()
              << " tuned shapes\n";
  }
}

// [TAG_GEMV] The CUDA-core GEMV against the host reference for M = 1..8 on gpt-oss's decode
// shapes (QKV 5120 x 2880 with bias, O 2880 x 4096) and an N that no shape divides (1001) with
// K = 2888 (361 chunks: lanes end at different steps); every (rows, unroll) shape gives the same
// bits, and a row's bits do not depend on M.
TEST_F(GpuOps, GemvMatchesReferenceAndRowBitsIgnoreMAndShape) {
  struct Shape {
    int64_t n, k;
    bool bias;
  };
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  for (Shape sh : {Shape{5120, 2880, true}, Shape{2880, 4096, true}, Shape{1001, 2888, false}}) {
    SCOPED_TRACE(shape({8, sh.n, sh.k}));
    const int64_t mmax = 8;
    LinearCase lc = linearCase(mmax, sh.n, sh.k, sh.bias, act(), mmax);
    const OwnedTensor &gx = lc.gx, &gw = lc.gw, &gb = lc.gb, &gy = lc.gy;
    const auto& ref = lc.ref;
    double mx = 0;
    for (float v : ref) mx = std::max(mx, static_cast<double>(std::fabs(v)));
    std::vector<float> first;  // M = 8, the first shape: the bits every other run must give
    for (int64_t m : {8, 1, 2, 3, 4, 5, 7}) {
      cuda::GemvShape shapes[4];
      const int ns = cuda::gemvShapes(m, shapes);
      ASSERT_GT(ns, 0);
      for (int i = 0; i < ns; ++i) {
        SCOPED_TRACE("M=" + std::to_string(m) + " rows " + std::to_string(shapes[i].rows) +
                     " unroll " + std::to_string(shapes[i].unroll));
        auto y = gy.view.rowSlice(0, m);
        poison(gpu(), gy.view);
        cuda::GemvArgs a;
        a.x = gx.view.as<__nv_bfloat16>();
        a.w = gw.view.as<__nv_bfloat16>();
        a.bias = sh.bias ? gb.view.as<__nv_bfloat16>() : nullptr;
        a.y = y.as<__nv_bfloat16>();
        a.m = m;
        a.n = sh.n;
        a.k = sh.k;
        a.rows = shapes[i].rows;
        a.unroll = shapes[i].unroll;
        ASSERT_TRUE(cuda::launchGemv(a, cb.stream()).isOk());
        auto all = download(gpu(), gy.view);  // rows past m must keep the poison
        std::vector<float> got(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(m * sh.n));
        for (size_t j = static_cast<size_t>(m * sh.n); j < all.size(); ++j) {
          ASSERT_TRUE(std::isnan(all[j]))  // poison() fills 0xFF bytes: a bf16 NaN
              << "row " << j / static_cast<size_t>(sh.n) << " past M was written";
        }
        std::vector<float> want(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(m * sh.n));
        expectClose(got, want, 1e-2 * mx, 1e-2, "gemv vs host");
        if (first.empty()) first = got;
        EXPECT_EQ(0, std::memcmp(got.data(), first.data(), got.size() * sizeof(float)))
            << "the bits depend on M or on the shape";
        // [TAG_PDL_GEMV] Launched programmatically: the same bits.
        poison(gpu(), gy.view);
        a.pdl = true;
        ASSERT_TRUE(cuda::launchGemv(a, cb.stream()).isOk());
        const auto pdl_all = download(gpu(), gy.view);
        EXPECT_EQ(0, std::memcmp(pdl_all.data(), all.data(), all.size() * sizeof(float)))
            << "the programmatic launch changed the output";
      }
    }
  }
}

// [TAG_GEMV] Through the GemmRunner: with small buckets and the GEMV on, the M <= 8 buckets time
// it beside cuBLASLt, whatever wins agrees with the CPU, and the M = 3 / M = 4 nesting holds.
TEST_F(GpuOps, LinearTimesTheGemvForSmallBuckets) {
  const int64_t n = 5120, k = 2880, m = 8;
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  auto x = randomBf16(static_cast<size_t>(m * k), rng_, -1.f, 1.f);
  auto w = randomBf16(static_cast<size_t>(n * k), rng_, -0.03f, 0.03f);
  auto gx = upload(gpu(), act(), {m, k}, x);
  auto gw = upload(gpu(), gpu().weightDType(), {n, k}, w);
  auto gy = allocate(gpu(), act(), {m, n});
  auto cx = upload(cpu(), DType::kF32, {m, k}, x);
  auto cw = upload(cpu(), DType::kF32, {n, k}, w);
  auto cy = allocate(cpu(), DType::kF32, {m, n});
  cpu().linear(cx.view, cw.view, Tensor(), cy.view);
  const auto ref = download(cpu(), cy.view);
  double mx = 0;
  for (float v : ref) mx = std::max(mx, static_cast<double>(std::fabs(v)));
  auto runner = cuda::GemmRunner::create(size_t{32} << 20, true);
  ASSERT_TRUE(runner.isOk()) << runner.status().toString();
  cuda::GemmRunner& g = **runner;
  g.setSmallBuckets(true);
  g.setGemv(true);
  std::map<int64_t, std::vector<float>> got;
  for (int64_t rows : {1, 4, 3, 8}) {
    auto y = gy.view.rowSlice(0, rows);
    poison(gpu(), y);
    Status st = g.run(gx.view.as<__nv_bfloat16>(), gw.view.as<__nv_bfloat16>(), nullptr,
                      y.as<__nv_bfloat16>(), rows, n, k, cb.stream());
    ASSERT_TRUE(st.isOk()) << st.toString();
    got[rows] = download(gpu(), y);
    std::vector<float> want(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(rows * n));
    expectClose(got[rows], want, 1e-2 * mx, 1e-2, "rows " + std::to_string(rows));
  }
  EXPECT_EQ(0, std::memcmp(got[3].data(), got[4].data(), got[3].size() * sizeof(float)));
  EXPECT_EQ(g.tunedShapes(), 3u);  // buckets 1, 4, 8
  std::cout << "[ gemv ] buckets won by the GEMV: " << g.gemvWins() << " of " << g.tunedShapes()
            << "\n";
  // [TAG_PDL_GEMV] GEMV only (at M = 1), launched programmatically: bucket 1 takes a GEMV shape
  // (cuBLASLt not timed), buckets 4 and 8 cuBLASLt alone; every bucket agrees with the CPU.
  auto only = cuda::GemmRunner::create(size_t{32} << 20, true);
  ASSERT_TRUE(only.isOk()) << only.status().toString();
  cuda::GemmRunner& o = **only;
  o.setSmallBuckets(true);
  o.setGemvOnly(true);
  o.setGemvPdl(true);
  for (int64_t rows : {1, 4, 3, 8}) {
    auto y = gy.view.rowSlice(0, rows);
    poison(gpu(), y);
    Status st = o.run(gx.view.as<__nv_bfloat16>(), gw.view.as<__nv_bfloat16>(), nullptr,
                      y.as<__nv_bfloat16>(), rows, n, k, cb.stream());
    ASSERT_TRUE(st.isOk()) << st.toString();
    const auto v = download(gpu(), y);
    std::vector<float> want(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(rows * n));
    expectClose(v, want, 1e-2 * mx, 1e-2, "gemv only, rows " + std::to_string(rows));
  }
  EXPECT_EQ(o.gemvWins(), 1u);
  EXPECT_EQ(o.tunedShapes(), 3u);
}

TEST_F(GpuOps, LinearFirstSeenInsideACaptureIsUntimedAndCaptures) {
  // A shape first seen while the stream is captured takes the heuristic's first pick without
  // timing (no events or syncs in the capture); the graph replays to the same bits as an eager
  // call of the same runner, and to within bf16 rounding of the timed choice. (A timed runner
  // goes first, as the graph cache's eager first run would, so every candidate's kernel is
  // already loaded when the capture starts.)
  const int64_t n = 2048, k = 1024, m = 200;
  auto x = randomBf16(static_cast<size_t>(m * k), rng_, -1.f, 1.f);
  auto w = randomBf16(static_cast<size_t>(n * k), rng_, -0.06f, 0.06f);
  auto gw = upload(gpu(), gpu().weightDType(), {n, k}, w);
  auto gx = upload(gpu(), act(), {m, k}, x);
  auto gy = allocate(gpu(), act(), {m, n});
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  auto run = [&](cuda::GemmRunner& r) {
    return r.run(gx.view.as<__nv_bfloat16>(), gw.view.as<__nv_bfloat16>(), nullptr,
                 gy.view.as<__nv_bfloat16>(), m, n, k, cb.stream());
  };
  auto timed_runner = cuda::GemmRunner::create(size_t{32} << 20, true);
  ASSERT_TRUE(timed_runner.isOk()) << timed_runner.status().toString();
  poison(gpu(), gy.view);
  ASSERT_TRUE(run(**timed_runner).isOk());
  auto timed = download(gpu(), gy.view);
  EXPECT_EQ((*timed_runner)->tunedShapes(), 1u);
  EXPECT_EQ((*timed_runner)->untimedInCapture(), 0u);

  auto runner = cuda::GemmRunner::create(size_t{32} << 20, true);
  ASSERT_TRUE(runner.isOk()) << runner.status().toString();
  cuda::GemmRunner& g = **runner;
  poison(gpu(), gy.view);
  ASSERT_TRUE(gpu().synchronize().isOk());
  cudaStream_t s = cb.stream();
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  Status st = run(g);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_TRUE(st.isOk()) << st.toString();
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(g.untimedInCapture(), 1u);
  EXPECT_EQ(g.tunedShapes(), 0u);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  auto graphed = download(gpu(), gy.view);
  cudaGraphExecDestroy(exec);
  poison(gpu(), gy.view);
  ASSERT_TRUE(run(g).isOk());  // eager: the cached (untimed) choice, no tuning now
  auto eager = download(gpu(), gy.view);
  EXPECT_EQ(g.tunedShapes(), 0u);
  EXPECT_EQ(0, std::memcmp(graphed.data(), eager.data(), eager.size() * sizeof(float)));
  expectWithinBf16Rounding(timed, eager, "timed vs untimed choice");
}

// The custom small-M GEMM (gemm_smallm.cuh), launched directly.
struct SmallMShape {
  int64_t n, k;
};
const SmallMShape kQwen3Linears[] = {{4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}};

Status launchSmallM(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y,
                    int64_t m, cuda::SmallMConfig cfg, cudaStream_t s) {
  cuda::SmallMGemmArgs a;
  a.x = x.as<__nv_bfloat16>();
  a.w = w.as<__nv_bfloat16>();
  a.bias = bias != nullptr ? bias->as<__nv_bfloat16>() : nullptr;
  a.y = y.as<__nv_bfloat16>();
  a.m = m;
  a.n = w.rows();
  a.k = w.cols();
  a.splits = cfg.splits;
  a.tile_n = cfg.tile_n;
  return cuda::launchSmallMGemm(a, s);
}

TEST_F(GpuOps, SmallMGemmMatchesReferenceAndRowBitsIgnoreM) {
  // Every (N tile, split count) the tuner would time, bias on and off, M from 1 to 256 (masked
  // tails): within bf16 rounding of the f32 reference, rows past M left untouched (still
  // poisoned), each row bit-identical to the same row computed at M = 256, and both N tiles
  // bit-identical at the same split count.
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  const int sms = deviceSms();
  const int64_t mmax = 256;
  for (const SmallMShape& sh : kQwen3Linears) {
    const int64_t n = sh.n, k = sh.k;
    auto x = randomBf16(static_cast<size_t>(mmax * k), rng_, -1.f, 1.f);
    auto w = randomBf16(static_cast<size_t>(n * k), rng_, -0.06f, 0.06f);
    auto b = randomBf16(static_cast<size_t>(n), rng_, -0.5f, 0.5f);
    auto gx = upload(gpu(), act(), {mmax, k}, x);
    auto gw = upload(gpu(), gpu().weightDType(), {n, k}, w);
    auto gb = upload(gpu(), gpu().weightDType(), {n}, b);
    auto gy = allocate(gpu(), act(), {mmax, n});
    const auto ref0 = hostLinear(x, w, mmax, n, k);
    cuda::SmallMConfig cfgs[8] = {};
    const int nc = cuda::smallMGemmCandidates(n, k, sms, cfgs);
    ASSERT_GT(nc, 0) << n << "x" << k;
    std::map<std::pair<int, bool>, std::vector<float>> by_splits;  // M = 256 results
    for (int ci = 0; ci < nc; ++ci) {
      for (bool bias : {false, true}) {
        std::vector<float> ref = ref0;
        if (bias) {
          for (size_t i = 0; i < ref.size(); ++i) ref[i] += b[i % static_cast<size_t>(n)];
        }
        double mx = 0;
        for (float v : ref) mx = std::max(mx, static_cast<double>(std::fabs(v)));
        std::vector<float> full;  // the M = 256 result
        for (int64_t m : {256, 1, 7, 16, 63, 64, 100, 128, 129, 200}) {
          SCOPED_TRACE(shape({m, n, k}) + " tile_n " + std::to_string(cfgs[ci].tile_n) +
                       " splits " + std::to_string(cfgs[ci].splits) + (bias ? " bias" : ""));
          poison(gpu(), gy.view);
          Status st = launchSmallM(gx.view, gw.view, bias ? &gb.view : nullptr, gy.view, m,
                                   cfgs[ci], cb.stream());
          ASSERT_TRUE(st.isOk()) << st.toString();
          auto all = download(gpu(), gy.view);
          const size_t valid = static_cast<size_t>(m * n);
          std::vector<float> got(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(valid));
          std::vector<float> want(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(valid));
          expectClose(got, want, 2e-3 * mx, 1e-2, "smallm gemm");
          size_t written_past_m = 0;
          for (size_t i = valid; i < all.size(); ++i) written_past_m += std::isnan(all[i]) ? 0 : 1;
          EXPECT_EQ(written_past_m, 0u) << "rows past M were written";
          if (m == mmax) {
            full = got;
            auto [it, fresh] = by_splits.emplace(std::make_pair(cfgs[ci].splits, bias), got);
            if (!fresh) {
              EXPECT_EQ(0, std::memcmp(got.data(), it->second.data(), valid * sizeof(float)))
                  << "N tiles 64 and 128 differ at the same split count";
            }
          } else {
            EXPECT_EQ(0, std::memcmp(got.data(), full.data(), valid * sizeof(float)))
                << "rows differ from the same rows at M = 256";
          }
        }
      }
    }
  }
  // Shapes outside the kernel's rules are refused with a clear error, never launched.
  auto gx = allocate(gpu(), act(), {300, 1024});
  auto gw = allocate(gpu(), gpu().weightDType(), {1024, 1024});
  auto gy = allocate(gpu(), act(), {300, 1024});
  EXPECT_FALSE(launchSmallM(gx.view, gw.view, nullptr, gy.view, 300, {64, 1}, cb.stream()).isOk());
  EXPECT_FALSE(launchSmallM(gx.view, gw.view, nullptr, gy.view, 0, {64, 1}, cb.stream()).isOk());
  EXPECT_FALSE(launchSmallM(gx.view, gw.view, nullptr, gy.view, 8, {64, 3}, cb.stream()).isOk());
  EXPECT_FALSE(launchSmallM(gx.view, gw.view, nullptr, gy.view, 8, {96, 1}, cb.stream()).isOk());
  EXPECT_FALSE(cuda::smallMGemmSupported(8, 1000, 1024, 1));       // N not a multiple of 64
  EXPECT_FALSE(cuda::smallMGemmSupported(8, 1088, 1024, 1, 128));  // ... nor of 128
  EXPECT_FALSE(cuda::smallMGemmSupported(8, 1024, 1024 + 64, 2));  // K not split evenly
  EXPECT_TRUE(cuda::smallMGemmSupported(256, 1024, 3072, 8));
}

TEST_F(GpuOps, SmallMGemmRepeatsAndReplaysInAGraph) {
  // No state survives a launch (cluster reduction, no counters): repeated launches and graph
  // replays give the same bits; M = 37 gives the first 37 rows of M = 128 bit for bit.
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  cudaStream_t s = cb.stream();
  const int sms = deviceSms();
  for (int pick : {0, 1, 2, 3}) {  // o and gate_up; the first and the last configuration
    const SmallMShape& sh = kQwen3Linears[pick < 2 ? 1 : 2];
    const int64_t n = sh.n, k = sh.k, m = 128, m2 = 37;
    cuda::SmallMConfig cfgs[8] = {};
    const int nc = cuda::smallMGemmCandidates(n, k, sms, cfgs);
    ASSERT_GT(nc, 0);
    const cuda::SmallMConfig sp = cfgs[pick % 2 == 0 ? 0 : nc - 1];
    SCOPED_TRACE(shape({n, k}) + " tile_n " + std::to_string(sp.tile_n) + " splits " +
                 std::to_string(sp.splits));
    auto x = randomBf16(static_cast<size_t>(m * k), rng_, -1.f, 1.f);
    auto w = randomBf16(static_cast<size_t>(n * k), rng_, -0.06f, 0.06f);
    auto b = randomBf16(static_cast<size_t>(n), rng_, -0.5f, 0.5f);
    auto gx = upload(gpu(), act(), {m, k}, x);
    auto gw = upload(gpu(), gpu().weightDType(), {n, k}, w);
    auto gb = upload(gpu(), gpu().weightDType(), {n}, b);
    auto gy = allocate(gpu(), act(), {m, n});
    auto gy2 = allocate(gpu(), act(), {m2, n});
    poison(gpu(), gy.view);
    ASSERT_TRUE(launchSmallM(gx.view, gw.view, &gb.view, gy.view, m, sp, s).isOk());
    const auto first = download(gpu(), gy.view);
    for (int rep = 0; rep < 3; ++rep) {
      poison(gpu(), gy.view);
      ASSERT_TRUE(launchSmallM(gx.view, gw.view, &gb.view, gy.view, m, sp, s).isOk());
      EXPECT_EQ(0, std::memcmp(download(gpu(), gy.view).data(), first.data(),
                               first.size() * sizeof(float)))
          << "repeat " << rep;
    }
    poison(gpu(), gy2.view);
    ASSERT_TRUE(launchSmallM(gx.view, gw.view, &gb.view, gy2.view, m2, sp, s).isOk());
    const auto part = download(gpu(), gy2.view);
    EXPECT_EQ(0, std::memcmp(part.data(), first.data(), part.size() * sizeof(float)))
        << "M = 37 rows differ from M = 128";

    ASSERT_TRUE(gpu().synchronize().isOk());
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    Status st = launchSmallM(gx.view, gw.view, &gb.view, gy.view, m, sp, s);
    Status st2 = launchSmallM(gx.view, gw.view, &gb.view, gy2.view, m2, sp, s);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    ASSERT_TRUE(st.isOk()) << st.toString();
    ASSERT_TRUE(st2.isOk()) << st2.toString();
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
    for (int rep = 0; rep < 3; ++rep) {
      poison(gpu(), gy.view);
      poison(gpu(), gy2.view);
      ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
      EXPECT_EQ(0, std::memcmp(download(gpu(), gy.view).data(), first.data(),
                               first.size() * sizeof(float)))
          << "replay " << rep;
      EXPECT_EQ(0, std::memcmp(download(gpu(), gy2.view).data(), part.data(),
                               part.size() * sizeof(float)))
          << "replay " << rep << " (M = 37)";
    }
    cudaGraphExecDestroy(exec);
  }
}

TEST_F(GpuOps, LinearTunesTheSmallMKernelAsACandidate) {
  // GemmRunner with the custom kernel among its candidates (the default) and without it
  // (GARDEN_GEMM_SMALLM=0): both within bf16 rounding of each other on the Qwen3 shapes at few
  // tokens; which one won each bucket is printed (timing decides it, so it is not asserted).
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  auto with = cuda::GemmRunner::create(size_t{32} << 20, true, 1);
  auto without = cuda::GemmRunner::create(size_t{32} << 20, true, 0);
  auto untuned = cuda::GemmRunner::create(size_t{32} << 20, false, 1);
  ASSERT_TRUE(with.isOk() && without.isOk() && untuned.isOk());
  EXPECT_TRUE((*with)->smallMEnabled());
  EXPECT_FALSE((*without)->smallMEnabled());
  EXPECT_FALSE((*untuned)->smallMEnabled());  // tuning off: the old policy exactly
  for (const SmallMShape& sh : kQwen3Linears) {
    for (int64_t m : {1, 128, 256}) {
      const int64_t n = sh.n, k = sh.k;
      SCOPED_TRACE(shape({m, n, k}));
      auto x = randomBf16(static_cast<size_t>(m * k), rng_, -1.f, 1.f);
      auto w = randomBf16(static_cast<size_t>(n * k), rng_, -0.06f, 0.06f);
      auto gx = upload(gpu(), act(), {m, k}, x);
      auto gw = upload(gpu(), gpu().weightDType(), {n, k}, w);
      auto gy = allocate(gpu(), act(), {m, n});
      std::vector<float> outs[2];
      for (int r = 0; r < 2; ++r) {
        cuda::GemmRunner& g = r == 0 ? **with : **without;
        poison(gpu(), gy.view);
        Status st = g.run(gx.view.as<__nv_bfloat16>(), gw.view.as<__nv_bfloat16>(), nullptr,
                          gy.view.as<__nv_bfloat16>(), m, n, k, cb.stream());
        ASSERT_TRUE(st.isOk()) << st.toString();
        outs[r] = download(gpu(), gy.view);
      }
      expectWithinBf16Rounding(outs[0], outs[1], "smallm candidate vs cuBLASLt only");
      // A row at M - 1 (same bucket) has the same bits as at M, whichever kind won the bucket.
      if (m > 1) {
        auto sub = gy.view.rowSlice(0, m - 1);
        poison(gpu(), sub);
        ASSERT_TRUE((*with)
                        ->run(gx.view.as<__nv_bfloat16>(), gw.view.as<__nv_bfloat16>(), nullptr,
                              sub.as<__nv_bfloat16>(), m - 1, n, k, cb.stream())
                        .isOk());
        auto half = download(gpu(), sub);
        EXPECT_EQ(0, std::memcmp(half.data(), outs[0].data(), half.size() * sizeof(float)));
      }
    }
  }
  std::cout << "small-M kernel won " << (*with)->smallMWins() << " of " << (*with)->tunedShapes()
            << " tuned buckets\n";
  EXPECT_EQ((*without)->smallMWins(), 0u);
  EXPECT_EQ((*with)->variantFallbacks(), 0u);
  // The runner never reads the environment (rose reads GARDEN_GEMM_SMALLM once at start-up into
  // CudaKernelOptions; its parsing is tested in tests/unit/rose/ops).
  ASSERT_EQ(setenv("GARDEN_GEMM_SMALLM", "1", 1), 0);
  auto plain = cuda::GemmRunner::create(size_t{1} << 20, true);
  ASSERT_EQ(unsetenv("GARDEN_GEMM_SMALLM"), 0);
  ASSERT_TRUE(plain.isOk()) << plain.status().toString();
  EXPECT_FALSE((*plain)->smallMEnabled());
  EXPECT_TRUE((*with)->smallMEnabled());
  EXPECT_FALSE((*untuned)->smallMEnabled());
}

std::pair<std::vector<float>, std::vector<float>> ropeTables(int64_t max_pos, int64_t rot,
                                                             double theta) {
  const int64_t half = rot / 2;
  std::vector<float> c(static_cast<size_t>(max_pos * half)), s(c.size());
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double inv = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot));
      c[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(p * inv));
      s[static_cast<size_t>(p * half + i)] = static_cast<float>(std::sin(p * inv));
    }
  }
  return {c, s};
}

TEST_F(GpuOps, QkNormRope) {
  struct S {
    int32_t hq, hkv, d, rot;
    bool norm;
  };
  const int64_t max_pos = 4096;
  for (S s : std::vector<S>{{16, 8, 128, 128, true},
                            {16, 8, 128, 64, true},
                            {4, 4, 64, 64, true},
                            {8, 2, 128, 128, false},
                            {3, 1, 128, 0, true}}) {
    for (int64_t t : {1, 17, 300, 1000}) {  // 1000: the prefill (4 heads per warp) path
      SCOPED_TRACE(shape({t, s.hq, s.hkv, s.d, s.rot}) + (s.norm ? " norm" : " rope-only"));
      const int64_t width = static_cast<int64_t>(s.hq + 2 * s.hkv) * s.d;
      auto qkv = randomBf16(static_cast<size_t>(t * width), rng_, -2.f, 2.f);
      auto qw = randomBf16(static_cast<size_t>(s.d), rng_, 0.5f, 1.5f);
      auto kw = randomBf16(static_cast<size_t>(s.d), rng_, 0.5f, 1.5f);
      std::vector<int32_t> pos(static_cast<size_t>(t));
      std::uniform_int_distribution<int32_t> pd(0, max_pos - 1);
      for (auto& p : pos) p = pd(rng_);
      const int64_t rot = std::max<int64_t>(s.rot, 2);  // a [max_pos, 1] table when rot is 0
      auto [c, sn] = ropeTables(max_pos, rot, 1e6);
      auto cq = upload(cpu(), DType::kF32, {t, width}, qkv);
      auto gq = upload(gpu(), act(), {t, width}, qkv);
      auto cqw = upload(cpu(), DType::kF32, {s.d}, qw);
      auto gqw = upload(gpu(), gpu().weightDType(), {s.d}, qw);
      auto ckw = upload(cpu(), DType::kF32, {s.d}, kw);
      auto gkw = upload(gpu(), gpu().weightDType(), {s.d}, kw);
      auto cp = uploadI32(cpu(), {t}, pos);
      auto gp = uploadI32(gpu(), {t}, pos);
      const int64_t half = rot / 2;
      auto cc = upload(cpu(), DType::kF32, {max_pos, half}, c);
      auto gc = upload(gpu(), DType::kF32, {max_pos, half}, c);
      auto cs = upload(cpu(), DType::kF32, {max_pos, half}, sn);
      auto gs = upload(gpu(), DType::kF32, {max_pos, half}, sn);
      QkNormRopeParams p;
      p.num_q_heads = s.hq;
      p.num_kv_heads = s.hkv;
      p.head_dim = s.d;
      p.rotary_dim = s.rot;
      p.apply_norm = s.norm;
      if (s.rot == 0) {
        // rotary_dim 0: the tables are not read; pass empty views to the CPU as well as the GPU.
        QkNormRopeParams p0 = p;
        cpu().qkNormRope(cq.view, cqw.view, ckw.view, cp.view, cc.view.reshaped({max_pos, 0}),
                         cs.view.reshaped({max_pos, 0}), p0);
        gpu().qkNormRope(gq.view, gqw.view, gkw.view, gp.view, Tensor(), Tensor(), p0);
      } else {
        cpu().qkNormRope(cq.view, cqw.view, ckw.view, cp.view, cc.view, cs.view, p);
        gpu().qkNormRope(gq.view, gqw.view, gkw.view, gp.view, gc.view, gs.view, p);
      }
      const std::vector<float> ref = download(cpu(), cq.view);
      expectClose(download(gpu(), gq.view), ref, 3e-2, 2e-2, "qk_norm_rope");
      // [TAG_QK_ROPE_PAIR] every kernel the launcher can pick, on fresh copies of the input: each
      // as close to the reference as the backend's; the pair kernel's values do not depend on
      // how many heads a warp takes (bit-equal across 1, 2, 4 and 8).
      std::vector<float> pair_bits;
      for (int32_t variant : {-1, 1, 2, 4, 8}) {
        SCOPED_TRACE("variant " + std::to_string(variant));
        auto gv = upload(gpu(), act(), {t, width}, qkv);
        cuda::QkNormRopeArgs a;
        a.qkv = gv.view.as<__nv_bfloat16>();
        a.q_weight = s.norm ? gqw.view.as<__nv_bfloat16>() : nullptr;
        a.k_weight = s.norm ? gkw.view.as<__nv_bfloat16>() : nullptr;
        a.positions = gp.view.as<int32_t>();
        a.cos = s.rot > 0 ? gc.view.as<float>() : nullptr;
        a.sin = s.rot > 0 ? gs.view.as<float>() : nullptr;
        a.num_tokens = t;
        a.num_q_heads = s.hq;
        a.num_kv_heads = s.hkv;
        a.head_dim = s.d;
        a.rotary_dim = s.rot;
        a.max_pos = s.rot > 0 ? static_cast<int32_t>(max_pos) : 0;
        a.apply_norm = s.norm;
        a.variant = variant;
        ASSERT_TRUE(cuda::launchQkNormRope(a, nullptr, false).isOk());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> got = download(gpu(), gv.view);
        expectClose(got, ref, 3e-2, 2e-2, "qk_norm_rope variant");
        if (variant > 0 && s.rot == s.d) {
          if (pair_bits.empty()) {
            pair_bits = got;
          } else {
            ASSERT_EQ(got.size(), pair_bits.size());
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_EQ(std::memcmp(&got[i], &pair_bits[i], sizeof(float)), 0) << "element " << i;
          }
        }
      }
    }
  }
  cuda::QkNormRopeArgs bad;
  bad.num_tokens = 1;
  bad.num_q_heads = bad.num_kv_heads = 1;
  bad.head_dim = bad.rotary_dim = 128;
  bad.max_pos = 1;
  bad.variant = 3;
  EXPECT_FALSE(cuda::launchQkNormRope(bad, nullptr, false).isOk());
}

struct AttnCase {
  int32_t hq, hkv, d;
  bool causal;
  std::vector<int32_t> lens;
};

TEST_F(GpuOps, VarlenAttentionBothTileSizes) {
  std::vector<AttnCase> cases;
  for (bool causal : {true, false}) {
    const std::vector<std::vector<int32_t>> all_lens = {
        {1},    {17},  {1, 63, 64, 65, 130, 7},     {300, 5, 1000},
        {1537}, {129}, {65, 1, 1000, 127, 63, 129}, {4096}};
    for (const auto& lens : all_lens) {
      cases.push_back({16, 8, 128, causal, lens});
    }
    cases.push_back({4, 4, 128, causal, {33, 129, 2}});
    cases.push_back({8, 2, 64, causal, {1, 77, 200}});
    cases.push_back({6, 2, 128, causal, {100, 3, 257}});  // group 3: one head per block
  }
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  for (const AttnCase& c : cases) {
    const auto cu = cumulative(c.lens);
    const int64_t t = cu.back();
    const int64_t width = static_cast<int64_t>(c.hq + 2 * c.hkv) * c.d;
    std::string name = shape({t, c.hq, c.hkv, c.d}) + (c.causal ? " causal" : " bidir") + " seqs";
    for (int32_t l : c.lens) {
      name += ' ';
      name += std::to_string(l);
    }
    SCOPED_TRACE(name);
    auto qkv = randomBf16(static_cast<size_t>(t * width), rng_, -2.f, 2.f);
    auto cq = upload(cpu(), DType::kF32, {t, width}, qkv);
    auto gq = upload(gpu(), act(), {t, width}, qkv);
    const int64_t ns = static_cast<int64_t>(c.lens.size());
    auto ccu = uploadI32(cpu(), {ns + 1}, cu);
    auto gcu = uploadI32(gpu(), {ns + 1}, cu);
    auto co = allocate(cpu(), DType::kF32, {t, static_cast<int64_t>(c.hq) * c.d});
    AttentionParams p;
    p.num_seqs = static_cast<int32_t>(ns);
    p.num_q_heads = c.hq;
    p.num_kv_heads = c.hkv;
    p.head_dim = c.d;
    p.max_seqlen = *std::max_element(c.lens.begin(), c.lens.end());
    p.scale = 1.f / std::sqrt(static_cast<float>(c.d));
    p.causal = c.causal;
    cpu().attention(cq.view, ccu.view, co.view, p);
    auto ref = download(cpu(), co.view);
    // 0: the backend op (the default policy: the Hopper kernel for head_dim 128, else the size
    // policy); 1: the narrow-only policy; 2..6: each variant forced (narrow16, narrow64, wide64,
    // wide128, sm90) where checkAttentionVariant says it can run.
    constexpr int kVariants = 7;
    static const cuda::AttentionVariant kForced[] = {
        cuda::AttentionVariant::kNarrow16, cuda::AttentionVariant::kNarrow64,
        cuda::AttentionVariant::kWide64, cuda::AttentionVariant::kWide128,
        cuda::AttentionVariant::kSm90};
    static const char* const kNames[] = {"attention (backend op)", "attention (narrow policy)",
                                         "attention narrow16",     "attention narrow64",
                                         "attention wide64",       "attention wide128",
                                         "attention sm90"};
    std::vector<float> results[kVariants];
    for (int variant = 0; variant < kVariants; ++variant) {
      auto go = allocate(gpu(), act(), {t, static_cast<int64_t>(c.hq) * c.d});
      poison(gpu(), go.view);
      cuda::AttentionArgs a;
      a.qkv = gq.view.as<__nv_bfloat16>();
      a.cu_seqlens = gcu.view.as<int32_t>();
      a.out = go.view.as<__nv_bfloat16>();
      a.num_tokens = t;
      a.num_seqs = p.num_seqs;
      a.num_q_heads = c.hq;
      a.num_kv_heads = c.hkv;
      a.head_dim = c.d;
      a.scale = p.scale;
      a.causal = c.causal;
      if (variant == 0) {
        gpu().attention(gq.view, gcu.view, go.view, p);
      } else if (variant == 1) {
        Status s = cuda::launchAttention(a, cb.stream(), cuda::AttentionPolicy::kNarrow);
        ASSERT_TRUE(s.isOk()) << s.toString();
      } else {
        const cuda::AttentionVariant v = kForced[variant - 2];
        // The wide variants need head_dim 128 (and wide64 an even GQA group): the check says so
        // by name, and the launch refuses the same way.
        const bool wide =
            v == cuda::AttentionVariant::kWide64 || v == cuda::AttentionVariant::kWide128;
        const bool runs =
            v == cuda::AttentionVariant::kSm90
                ? c.d == 128
                : !wide || (c.d == 128 &&
                            (v == cuda::AttentionVariant::kWide128 || (c.hq / c.hkv) % 2 == 0));
        const Status check = cuda::checkAttentionVariant(a, v);
        EXPECT_EQ(check.isOk(), runs) << kNames[variant] << ": " << check.toString();
        if (!runs) {
          EXPECT_NE(check.message().find(cuda::attentionVariantName(v)), std::string::npos)
              << check.toString();
          EXPECT_FALSE(cuda::launchAttentionVariant(a, cb.stream(), v).isOk());
          continue;
        }
        Status s = cuda::launchAttentionVariant(a, cb.stream(), v);
        ASSERT_TRUE(s.isOk()) << s.toString();
      }
      results[variant] = download(gpu(), go.view);
      expectClose(results[variant], ref, 1e-2, 2e-2, kNames[variant]);
      // Per (token, head) relative L2 error: long diffuse rows have small outputs that an
      // absolute tolerance would not police.
      double worst = 0;
      int64_t worst_row = -1;
      for (int64_t r = 0; r < t * c.hq; ++r) {
        double num = 0, den = 0;
        for (int64_t i = r * c.d; i < (r + 1) * c.d; ++i) {
          const double dlt = results[variant][static_cast<size_t>(i)] - ref[static_cast<size_t>(i)];
          num += dlt * dlt;
          den += static_cast<double>(ref[static_cast<size_t>(i)]) * ref[static_cast<size_t>(i)];
        }
        const double rel = std::sqrt(num / std::max(den, 1e-30));
        if (!(rel <= worst)) {
          worst = rel;
          worst_row = r;
        }
      }
      EXPECT_LE(worst, 1e-2) << "worst relative L2 error at token " << worst_row / c.hq << " head "
                             << worst_row % c.hq;
    }
    // No mma.sync variant changes a row's arithmetic: all equal narrow16 bit for bit. The Hopper
    // kernel (its own arithmetic, checked against the reference above) is what the backend op
    // runs for head_dim 128: those two equal each other bit for bit.
    const bool hopper = c.d == 128;
    if (hopper) {
      ASSERT_FALSE(results[6].empty());
      EXPECT_EQ(0, std::memcmp(results[6].data(), results[0].data(),
                               results[6].size() * sizeof(float)))
          << "the backend op differs from the sm90 variant";
    }
    for (int v = 0; v < kVariants; ++v) {
      if (v == 2 || v == 6 || (v == 0 && hopper) || results[v].empty()) continue;
      EXPECT_EQ(
          0, std::memcmp(results[2].data(), results[v].data(), results[2].size() * sizeof(float)))
          << kNames[v] << " differs from narrow16";
    }
  }
}

TEST_F(GpuOps, AttentionRowDoesNotDependOnBatch) {
  const int32_t hq = 16, hkv = 8, d = 128;
  const int64_t width = (hq + 2 * hkv) * d;
  for (bool causal : {true, false}) {
    const int32_t la = 130;
    auto a_rows = randomBf16(static_cast<size_t>(la * width), rng_, -2.f, 2.f);
    auto run = [&](const std::vector<int32_t>& lens, int which) {
      const auto cu = cumulative(lens);
      const int64_t t = cu.back();
      auto qkv = randomBf16(static_cast<size_t>(t * width), rng_, -2.f, 2.f);
      std::copy(a_rows.begin(), a_rows.end(), qkv.begin() + cu[static_cast<size_t>(which)] * width);
      auto gq = upload(gpu(), act(), {t, width}, qkv);
      auto gcu = uploadI32(gpu(), {static_cast<int64_t>(lens.size()) + 1}, cu);
      auto go = allocate(gpu(), act(), {t, static_cast<int64_t>(hq) * d});
      poison(gpu(), go.view);
      AttentionParams p;
      p.num_seqs = static_cast<int32_t>(lens.size());
      p.num_q_heads = hq;
      p.num_kv_heads = hkv;
      p.head_dim = d;
      p.max_seqlen = 1000;
      p.scale = 1.f / std::sqrt(128.f);
      p.causal = causal;
      gpu().attention(gq.view, gcu.view, go.view, p);
      auto all = download(gpu(), go.view);
      return std::vector<float>(all.begin() + cu[static_cast<size_t>(which)] * hq * d,
                                all.begin() + (cu[static_cast<size_t>(which)] + la) * hq * d);
    };
    auto alone = run({la}, 0);
    auto batched = run({5, la, 64, 1000}, 1);
    ASSERT_EQ(alone.size(), batched.size());
    EXPECT_EQ(0, std::memcmp(alone.data(), batched.data(), alone.size() * sizeof(float)))
        << (causal ? "causal" : "bidirectional")
        << ": a sequence's attention changed with its batch";
  }
}

// The size policy and each wide variant: a sequence alone and in a batch give identical bits.
// Alone, the 1000-token sequence is small enough that the policy runs narrow16; in the batch
// (with a 4096-token sequence) it runs wide64, so this also checks that the narrow and the wide
// kernel agree bit for bit.
TEST_F(GpuOps, AttentionWideRowDoesNotDependOnBatch) {
  const int32_t hq = 16, hkv = 8, d = 128;
  const int64_t width = (hq + 2 * hkv) * d;
  auto& cb = static_cast<cuda::CudaBackend&>(gpu());
  for (bool causal : {true, false}) {
    const int32_t la = 1000;
    auto a_rows = randomBf16(static_cast<size_t>(la * width), rng_, -2.f, 2.f);
    auto run = [&](const std::vector<int32_t>& lens, int which, int tile) {
      const auto cu = cumulative(lens);
      const int64_t t = cu.back();
      auto qkv = randomBf16(static_cast<size_t>(t * width), rng_, -2.f, 2.f);
      std::copy(a_rows.begin(), a_rows.end(), qkv.begin() + cu[static_cast<size_t>(which)] * width);
      auto gq = upload(gpu(), act(), {t, width}, qkv);
      auto gcu = uploadI32(gpu(), {static_cast<int64_t>(lens.size()) + 1}, cu);
      auto go = allocate(gpu(), act(), {t, static_cast<int64_t>(hq) * d});
      poison(gpu(), go.view);
      cuda::AttentionArgs a;
      a.qkv = gq.view.as<__nv_bfloat16>();
      a.cu_seqlens = gcu.view.as<int32_t>();
      a.out = go.view.as<__nv_bfloat16>();
      a.num_tokens = t;
      a.num_seqs = static_cast<int32_t>(lens.size());
      a.num_q_heads = hq;
      a.num_kv_heads = hkv;
      a.head_dim = d;
      a.scale = 1.f / std::sqrt(128.f);
      a.causal = causal;
      Status s = tile == 0
                     ? cuda::launchAttention(a, cb.stream())
                     : cuda::launchAttentionVariant(a, cb.stream(),
                                                    tile == 1 ? cuda::AttentionVariant::kWide64
                                                              : cuda::AttentionVariant::kWide128);
      EXPECT_TRUE(s.isOk()) << s.toString();
      auto all = download(gpu(), go.view);
      return std::vector<float>(all.begin() + cu[static_cast<size_t>(which)] * hq * d,
                                all.begin() + (cu[static_cast<size_t>(which)] + la) * hq * d);
    };
    // 0: the size policy; 1: wide64; 2: wide128.
    for (int tile = 0; tile <= 2; ++tile) {
      SCOPED_TRACE("tile " + std::to_string(tile));
      auto alone = run({la}, 0, tile);
      auto batched = run({5, 4096, la, 1, 77}, 2, tile);
      ASSERT_EQ(alone.size(), batched.size());
      EXPECT_EQ(0, std::memcmp(alone.data(), batched.data(), alone.size() * sizeof(float)))
          << (causal ? "causal" : "bidirectional")
          << ": a sequence's attention changed with its batch";
      // Not vacuous: the poisoned output was overwritten with finite values.
      EXPECT_TRUE(
          std::all_of(alone.begin(), alone.end(), [](float v) { return std::isfinite(v); }));
    }
  }
}

TEST_F(GpuOps, Swiglu) {
  for (auto [t, i] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {17, 3072}, {300, 3072}, {1000, 1536}}) {
    SCOPED_TRACE(shape({t, i}));
    auto gu = randomBf16(static_cast<size_t>(t * 2 * i), rng_, -4.f, 4.f);
    auto cg = upload(cpu(), DType::kF32, {t, 2 * i}, gu);
    auto gg = upload(gpu(), act(), {t, 2 * i}, gu);
    auto co = allocate(cpu(), DType::kF32, {t, i});
    auto go = allocate(gpu(), act(), {t, i});
    poison(gpu(), go.view);
    cpu().swiglu(cg.view, co.view);
    gpu().swiglu(gg.view, go.view);
    expectClose(download(gpu(), go.view), download(cpu(), co.view), 2e-2, 2e-2, "swiglu");
  }
}

TEST_F(GpuOps, PoolingModesWithAndWithoutL2) {
  for (int64_t h : {8, 1024, 4096}) {
    for (auto lens :
         std::vector<std::vector<int32_t>>{{1}, {17}, {1, 63, 300, 2}, {2000}, {5, 777, 64}}) {
      for (PoolMode mode : {PoolMode::kLast, PoolMode::kMean, PoolMode::kCls}) {
        for (bool norm : {true, false}) {
          SCOPED_TRACE("h " + std::to_string(h) + " seqs " + std::to_string(lens.size()) +
                       " mode " + std::to_string(static_cast<int>(mode)) + (norm ? " l2" : ""));
          const auto cu = cumulative(lens);
          const int64_t t = cu.back(), ns = static_cast<int64_t>(lens.size());
          auto hid = randomBf16(static_cast<size_t>(t * h), rng_, -3.f, 3.f);
          auto ch = upload(cpu(), DType::kF32, {t, h}, hid);
          auto gh = upload(gpu(), act(), {t, h}, hid);
          auto ccu = uploadI32(cpu(), {ns + 1}, cu);
          auto gcu = uploadI32(gpu(), {ns + 1}, cu);
          auto co = allocate(cpu(), DType::kF32, {ns, h});
          auto go = allocate(gpu(), DType::kF32, {ns, h});
          poison(gpu(), go.view);
          PoolParams p;
          p.num_seqs = static_cast<int32_t>(ns);
          p.mode = mode;
          p.normalize = norm;
          cpu().pool(ch.view, ccu.view, co.view, p);
          gpu().pool(gh.view, gcu.view, go.view, p);
          const auto want = download(cpu(), co.view);
          expectClose(download(gpu(), go.view), want, 1e-5, 1e-4, "pool (default kernel)");
          // Each variant explicitly: block per sequence for every mode, cluster per sequence for
          // mean (the other modes refuse it by name).
          for (auto v :
               {cuda::PoolVariant::kBlockPerSequence, cuda::PoolVariant::kClusterPerSequence}) {
            poison(gpu(), go.view);
            cuda::PoolArgs a;
            a.hidden = gh.view.as<__nv_bfloat16>();
            a.cu_seqlens = gcu.view.as<int32_t>();
            a.out = go.view.as<float>();
            a.num_seqs = static_cast<int32_t>(ns);
            a.hidden_size = h;
            a.kind = static_cast<cuda::PoolKind>(static_cast<int32_t>(mode));
            a.normalize = norm;
            const bool cluster = v == cuda::PoolVariant::kClusterPerSequence;
            if (cluster && mode != PoolMode::kMean) {
              const Status check = cuda::checkPoolVariant(a, v);
              EXPECT_NE(check.message().find("mean only"), std::string::npos) << check.toString();
              continue;
            }
            Status s =
                cuda::launchPoolVariant(a, static_cast<cuda::CudaBackend&>(gpu()).stream(), v);
            ASSERT_TRUE(s.isOk()) << s.toString();
            expectClose(download(gpu(), go.view), want, 1e-5, 1e-4,
                        cluster ? "pool cluster per sequence" : "pool block per sequence");
          }
        }
      }
    }
  }
}

TEST_F(GpuOps, MeanPoolRowDoesNotDependOnBatch) {
  const int64_t h = 1024;
  const int32_t la = 1000;
  auto a_rows = randomBf16(static_cast<size_t>(la * h), rng_, -3.f, 3.f);
  auto run = [&](const std::vector<int32_t>& lens, int which) {
    const auto cu = cumulative(lens);
    const int64_t t = cu.back(), ns = static_cast<int64_t>(lens.size());
    auto hid = randomBf16(static_cast<size_t>(t * h), rng_, -3.f, 3.f);
    std::copy(a_rows.begin(), a_rows.end(), hid.begin() + cu[static_cast<size_t>(which)] * h);
    auto gh = upload(gpu(), act(), {t, h}, hid);
    auto gcu = uploadI32(gpu(), {ns + 1}, cu);
    auto go = allocate(gpu(), DType::kF32, {ns, h});
    poison(gpu(), go.view);
    PoolParams p;
    p.num_seqs = static_cast<int32_t>(ns);
    p.mode = PoolMode::kMean;
    p.normalize = true;
    gpu().pool(gh.view, gcu.view, go.view, p);
    auto all = download(gpu(), go.view);
    return std::vector<float>(all.begin() + which * h, all.begin() + (which + 1) * h);
  };
  auto alone = run({la}, 0);
  auto batched = run({7, 300, la, 64, 1}, 2);
  EXPECT_EQ(0, std::memcmp(alone.data(), batched.data(), alone.size() * sizeof(float)))
      << "a sequence's mean pooling changed with its batch";
}

TEST_F(GpuOps, ScoreHead) {
  const int64_t h = 1024, rows = 10;
  const std::vector<int32_t> lens = {1, 17, 300, 5};
  const auto cu = cumulative(lens);
  const int64_t t = cu.back(), ns = static_cast<int64_t>(lens.size());
  auto hid = randomBf16(static_cast<size_t>(t * h), rng_, -1.f, 1.f);
  auto head = randomBf16(static_cast<size_t>(rows * h), rng_, -0.1f, 0.1f);
  auto ch = upload(cpu(), DType::kF32, {t, h}, hid);
  auto gh = upload(gpu(), act(), {t, h}, hid);
  auto chd = upload(cpu(), DType::kF32, {rows, h}, head);
  auto ghd = upload(gpu(), gpu().weightDType(), {rows, h}, head);
  auto ccu = uploadI32(cpu(), {ns + 1}, cu);
  auto gcu = uploadI32(gpu(), {ns + 1}, cu);
  for (auto [pos, neg, sig] :
       std::vector<std::tuple<int, int, bool>>{{3, 7, true}, {0, -1, true}, {9, 2, false}}) {
    SCOPED_TRACE("pos " + std::to_string(pos) + " neg " + std::to_string(neg));
    auto co = allocate(cpu(), DType::kF32, {ns});
    auto go = allocate(gpu(), DType::kF32, {ns});
    poison(gpu(), go.view);
    ScoreParams p;
    p.num_seqs = static_cast<int32_t>(ns);
    p.pos_row = pos;
    p.neg_row = neg;
    p.apply_sigmoid = sig;
    cpu().score(ch.view, ccu.view, chd.view, co.view, p);
    gpu().score(gh.view, gcu.view, ghd.view, go.view, p);
    expectClose(download(gpu(), go.view), download(cpu(), co.view), 1e-4, 1e-4, "score");
  }
}

TEST_F(GpuOps, EventsAndStagedCopies) {
  // copyToDevice may reuse its source at once; many staged copies wrap the ring.
  const int64_t n = 300000;
  auto dst = allocate(gpu(), DType::kI32, {n});
  std::vector<int32_t> src(static_cast<size_t>(n));
  auto ev = gpu().createEvent();
  ASSERT_TRUE(ev.isOk());
  for (int round = 0; round < 40; ++round) {
    std::iota(src.begin(), src.end(), round * 7);
    gpu().copyToDevice(dst.view, src.data(), src.size() * 4);
    std::fill(src.begin(), src.end(), -1);  // reuse at once
    ASSERT_TRUE(gpu().recordEvent(**ev).isOk());
    ASSERT_TRUE((*ev)->wait().isOk());
    EXPECT_TRUE((*ev)->query());
    auto back = download(gpu(), dst.view);
    ASSERT_EQ(back[0], static_cast<float>(round * 7));
    ASSERT_EQ(back[static_cast<size_t>(n - 1)], static_cast<float>(round * 7 + n - 1));
  }
}

}  // namespace
}  // namespace garden::rose::gputest
