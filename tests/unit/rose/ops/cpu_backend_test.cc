// The CPU backend's ops against the naive formulas in naive.h, on random inputs with awkward
// sizes, single- and multi-threaded; plus the launch/event contract and makeBackend.

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "services/rose/ops/backend.h"
#include "tests/unit/rose/ops/naive.h"

namespace garden::rose {
namespace {

std::vector<float> randomVec(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

void expectNear(const std::vector<float>& got, const std::vector<float>& want, float tol,
                const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1.f + std::fabs(want[i]))) << what << " at " << i;
  }
}

class CpuOps : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    BackendOptions o;
    o.threads = GetParam();
    o.max_batch_tokens = 256;
    auto b = makeBackend("cpu", o);
    ASSERT_TRUE(b.isOk()) << b.status().toString();
    backend_ = std::move(b).value();
  }
  // A device tensor holding `data`.
  OwnedTensor put(const std::vector<float>& data, std::initializer_list<int64_t> dims) {
    auto t = backend_->allocateTensor(DType::kF32, dims);
    EXPECT_TRUE(t.isOk());
    EXPECT_TRUE(
        backend_
            ->uploadConvert(t->view, {data.data(), DType::kF32, static_cast<int64_t>(data.size())})
            .isOk());
    return std::move(t).value();
  }
  OwnedTensor putI32(const std::vector<int32_t>& data) {
    auto t = backend_->allocateTensor(DType::kI32, {static_cast<int64_t>(data.size())});
    EXPECT_TRUE(t.isOk());
    backend_->copyToDevice(t->view, data.data(), data.size() * 4);
    return std::move(t).value();
  }
  std::vector<float> get(const Tensor& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    backend_->copyToHost(out.data(), t, t.bytes());
    EXPECT_TRUE(backend_->synchronize().isOk());
    return out;
  }
  void checkAttention(const std::vector<int32_t>& cu, int64_t hq, int64_t hkv, int64_t d,
                      float scale);
  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_{1234};
};

TEST_P(CpuOps, LinearMatchesNaive) {
  for (auto [t, n, k] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 1},
           {1, 17, 97},
           {5, 13, 8},
           {17, 97, 64},
           {33, 50, 129},
           {64, 96, 128},
           {300, 70, 33},
           {2, 1000, 17}}) {  // several row blocks (256); many column blocks
    auto x = randomVec(static_cast<size_t>(t * k), rng_);
    auto w = randomVec(static_cast<size_t>(n * k), rng_);
    auto bias = randomVec(static_cast<size_t>(n), rng_);
    auto X = put(x, {t, k});
    auto W = put(w, {n, k});
    auto B = put(bias, {n});
    auto Y = backend_->allocateTensor(DType::kF32, {t, n});
    ASSERT_TRUE(Y.isOk());
    backend_->linear(X.view, W.view, Tensor(), Y->view);
    expectNear(get(Y->view), naive::linear(x, w, {}, t, n, k), 1e-4f, "linear");
    backend_->linear(X.view, W.view, B.view, Y->view);
    expectNear(get(Y->view), naive::linear(x, w, bias, t, n, k), 1e-4f, "linear+bias");
  }
}

// [TAG_CPU_ROW_INVARIANT] With setRowInvariantLinear, a row's output bits are the ones it gets
// alone, whatever the step's row count (1..300: partial 8-row groups, several 256-row blocks)
// and whatever the other rows hold; the values stay the product (naive, 1e-4). (Without it this
// does not hold on OpenBLAS: on the 2026-12-05 dev VM, a row alone and the same row among others
// differed in bits.)
TEST_P(CpuOps, RowInvariantLinearGivesEachRowItsBitsAlone) {
  backend_->setRowInvariantLinear(true);
  for (auto [n, k] : std::vector<std::array<int64_t, 2>>{{97, 64}, {300, 129}, {64, 2880}}) {
    auto w = randomVec(static_cast<size_t>(n * k), rng_);
    auto bias = randomVec(static_cast<size_t>(n), rng_);
    auto W = put(w, {n, k});
    auto B = put(bias, {n});
    auto probe = randomVec(static_cast<size_t>(k), rng_);
    auto P = put(probe, {1, k});
    auto Y1 = backend_->allocateTensor(DType::kF32, {1, n});
    ASSERT_TRUE(Y1.isOk());
    backend_->linear(P.view, W.view, B.view, Y1->view);
    const std::vector<float> alone = get(Y1->view);
    expectNear(alone, naive::linear(probe, w, bias, 1, n, k), 1e-4f, "alone");
    for (int64_t t : {2, 3, 7, 8, 9, 17, 64, 255, 300}) {
      for (int64_t at : {int64_t{0}, t / 2, t - 1}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " k=" + std::to_string(k) + " t=" +
                     std::to_string(t) + " row " + std::to_string(at));
        auto x = randomVec(static_cast<size_t>(t * k), rng_);
        std::copy(probe.begin(), probe.end(), x.begin() + at * k);
        auto X = put(x, {t, k});
        auto Y = backend_->allocateTensor(DType::kF32, {t, n});
        ASSERT_TRUE(Y.isOk());
        backend_->linear(X.view, W.view, B.view, Y->view);
        const std::vector<float> y = get(Y->view);
        ASSERT_EQ(std::memcmp(y.data() + at * n, alone.data(), alone.size() * sizeof(float)), 0);
      }
    }
  }
}

TEST_P(CpuOps, EmbeddingGathersRows) {
  const int64_t v = 11, h = 19;
  auto table = randomVec(static_cast<size_t>(v * h), rng_);
  std::vector<int32_t> ids = {3, 0, 10, 3, 7};
  auto T = put(table, {v, h});
  auto I = putI32(ids);
  auto O = backend_->allocateTensor(DType::kF32, {5, h});
  backend_->embedding(T.view, I.view, O->view);
  auto got = get(O->view);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t j = 0; j < h; ++j)
      ASSERT_EQ(got[i * h + static_cast<size_t>(j)], table[static_cast<size_t>(ids[i] * h + j)]);
}

TEST_P(CpuOps, RmsNormWithAndWithoutResidual) {
  const int64_t t = 7, h = 97;
  auto x = randomVec(static_cast<size_t>(t * h), rng_);
  auto r = randomVec(static_cast<size_t>(t * h), rng_);
  auto w = randomVec(static_cast<size_t>(h), rng_);
  // Without residual.
  auto X = put(x, {t, h});
  auto W = put(w, {h});
  auto O = backend_->allocateTensor(DType::kF32, {t, h});
  backend_->rmsNorm(X.view, Tensor(), W.view, O->view, {1e-6f});
  std::vector<float> want(x.size());
  for (int64_t i = 0; i < t; ++i) naive::rmsNormRow(&x[i * h], w.data(), &want[i * h], h, 1e-6);
  expectNear(get(O->view), want, 1e-5f, "rmsnorm");
  // With residual, in place (out aliases x).
  auto R = put(r, {t, h});
  backend_->rmsNorm(X.view, R.view, W.view, X.view, {1e-6f});
  std::vector<float> sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + r[i];
  for (int64_t i = 0; i < t; ++i) naive::rmsNormRow(&sum[i * h], w.data(), &want[i * h], h, 1e-6);
  expectNear(get(R.view), sum, 1e-6f, "residual updated");
  expectNear(get(X.view), want, 1e-5f, "fused add rmsnorm");
  // residual_init: the stream starts from x (its old contents, garbage here, are not added).
  auto X2 = put(x, {t, h});
  auto R2 = put(std::vector<float>(x.size(), 1e30f), {t, h});
  RmsNormParams init{1e-6f};
  init.residual_init = true;
  backend_->rmsNorm(X2.view, R2.view, W.view, X2.view, init);
  for (int64_t i = 0; i < t; ++i) naive::rmsNormRow(&x[i * h], w.data(), &want[i * h], h, 1e-6);
  expectNear(get(R2.view), x, 0.f, "residual = x");
  expectNear(get(X2.view), want, 1e-5f, "rmsnorm of x");
}

TEST_P(CpuOps, QkNormRope) {
  for (bool norm : {true, false}) {
    const int64_t t = 9, hq = 4, hkv = 2, d = 16, rot = 16;
    const double theta = 10000.0;
    auto qkv = randomVec(static_cast<size_t>(t * (hq + 2 * hkv) * d), rng_);
    auto qw = randomVec(static_cast<size_t>(d), rng_);
    auto kw = randomVec(static_cast<size_t>(d), rng_);
    std::vector<int32_t> pos = {0, 1, 2, 3, 0, 1, 0, 1, 40};
    const int64_t max_pos = 64, half = rot / 2;
    std::vector<float> cosv(static_cast<size_t>(max_pos * half)), sinv(cosv.size());
    for (int64_t p = 0; p < max_pos; ++p)
      for (int64_t j = 0; j < half; ++j) {
        double a = p / std::pow(theta, 2.0 * j / rot);
        cosv[static_cast<size_t>(p * half + j)] = static_cast<float>(std::cos(a));
        sinv[static_cast<size_t>(p * half + j)] = static_cast<float>(std::sin(a));
      }
    auto QKV = put(qkv, {t, (hq + 2 * hkv) * d});
    auto QW = put(qw, {d});
    auto KW = put(kw, {d});
    auto P = putI32(pos);
    auto C = put(cosv, {max_pos, half});
    auto S = put(sinv, {max_pos, half});
    QkNormRopeParams p{static_cast<int32_t>(hq),
                       static_cast<int32_t>(hkv),
                       static_cast<int32_t>(d),
                       static_cast<int32_t>(rot),
                       1e-6f,
                       norm};
    backend_->qkNormRope(QKV.view, QW.view, KW.view, P.view, C.view, S.view, p);
    auto want = qkv;
    naive::qkNormRope(want, qw, kw, pos, t, hq, hkv, d, rot, theta, 1e-6, norm);
    expectNear(get(QKV.view), want, 1e-4f, norm ? "qknorm+rope" : "rope");
  }
}

// Ragged attention over sequences `cu`, causal and bidirectional, against the naive formula.
void CpuOps::checkAttention(const std::vector<int32_t>& cu, int64_t hq, int64_t hkv, int64_t d,
                            float scale) {
  const int64_t t = cu.back();
  int32_t longest = 0;
  for (size_t s = 0; s + 1 < cu.size(); ++s) longest = std::max(longest, cu[s + 1] - cu[s]);
  for (bool causal : {true, false}) {
    auto qkv = randomVec(static_cast<size_t>(t * (hq + 2 * hkv) * d), rng_);
    auto QKV = put(qkv, {t, (hq + 2 * hkv) * d});
    auto CU = putI32(cu);
    auto O = backend_->allocateTensor(DType::kF32, {t, hq * d});
    AttentionParams p;
    p.num_seqs = static_cast<int32_t>(cu.size() - 1);
    p.num_q_heads = static_cast<int32_t>(hq);
    p.num_kv_heads = static_cast<int32_t>(hkv);
    p.head_dim = static_cast<int32_t>(d);
    p.max_seqlen = longest;
    p.scale = scale;
    p.causal = causal;
    backend_->attention(QKV.view, CU.view, O->view, p);
    expectNear(get(O->view), naive::attention(qkv, cu, hq, hkv, d, scale, causal), 1e-4f,
               causal ? "causal" : "bidirectional");
  }
}

TEST_P(CpuOps, AttentionCausalAndBidirectional) {
  checkAttention({0, 1, 6, 23, 40}, 4, 2, 16, 0.25f);
}

// Sequences longer than the attention's query block (128), so a sequence spans several score
// tiles, the causal ones of different widths.
TEST_P(CpuOps, AttentionAcrossQueryBlocks) { checkAttention({0, 130, 433, 434}, 4, 1, 8, 0.35f); }

// [TAG_STEP_PROGRESS] The counter moves while ops run: inside a long linear (one tick per GEMM
// task) and an attention (one per tile), and at markProgress().
TEST_P(CpuOps, OpsAdvanceTheProgressCounter) {
  EXPECT_TRUE(backend_->reportsProgress());
  std::atomic<uint64_t> counter{0};
  backend_->setProgressCounter(&counter);
  const int64_t t = 600, n = 40, k = 16;  // three row blocks of 256
  auto X = put(randomVec(static_cast<size_t>(t * k), rng_), {t, k});
  auto W = put(randomVec(static_cast<size_t>(n * k), rng_), {n, k});
  auto Y = backend_->allocateTensor(DType::kF32, {t, n});
  ASSERT_TRUE(Y.isOk());
  backend_->linear(X.view, W.view, Tensor(), Y->view);
  ASSERT_TRUE(backend_->synchronize().isOk());
  const uint64_t after_linear = counter.load();
  EXPECT_GE(after_linear, 3u);
  const std::vector<int32_t> cu = {0, 300};
  auto QKV = put(randomVec(static_cast<size_t>(300 * 4 * 8), rng_), {300, 4 * 8});
  auto CU = putI32(cu);
  auto O = backend_->allocateTensor(DType::kF32, {300, 2 * 8});
  AttentionParams p{1, 2, 1, 8, 300, 0.3f, true};
  backend_->attention(QKV.view, CU.view, O->view, p);
  ASSERT_TRUE(backend_->synchronize().isOk());
  const uint64_t after_attention = counter.load();
  EXPECT_GE(after_attention, after_linear + 6);  // 3 query blocks x 2 heads
  backend_->markProgress();
  EXPECT_GE(counter.load(), after_attention + 1);
  backend_->setProgressCounter(nullptr);  // the counter dies before the backend
}

TEST_P(CpuOps, SwiGlu) {
  const int64_t t = 5, inter = 37;
  auto gu = randomVec(static_cast<size_t>(t * 2 * inter), rng_, 3.f);
  auto GU = put(gu, {t, 2 * inter});
  auto O = backend_->allocateTensor(DType::kF32, {t, inter});
  backend_->swiglu(GU.view, O->view);
  std::vector<float> want(static_cast<size_t>(t * inter));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < inter; ++j) {
      double g = gu[static_cast<size_t>(i * 2 * inter + j)],
             u = gu[static_cast<size_t>(i * 2 * inter + inter + j)];
      want[static_cast<size_t>(i * inter + j)] = static_cast<float>(g / (1 + std::exp(-g)) * u);
    }
  expectNear(get(O->view), want, 1e-5f, "swiglu");
}

TEST_P(CpuOps, PoolModesAndNormalization) {
  const int64_t h = 13;
  const std::vector<int32_t> cu = {0, 1, 4, 9};
  const int64_t t = cu.back();
  auto hid = randomVec(static_cast<size_t>(t * h), rng_);
  auto H = put(hid, {t, h});
  auto CU = putI32(cu);
  auto O = backend_->allocateTensor(DType::kF32, {3, h});
  for (PoolMode mode : {PoolMode::kLast, PoolMode::kMean, PoolMode::kCls}) {
    for (bool normalize : {false, true}) {
      backend_->pool(H.view, CU.view, O->view, PoolParams{3, mode, normalize});
      std::vector<float> want(static_cast<size_t>(3 * h));
      for (int s = 0; s < 3; ++s) {
        std::vector<double> acc(static_cast<size_t>(h), 0.0);
        if (mode == PoolMode::kMean) {
          for (int64_t i = cu[s]; i < cu[s + 1]; ++i)
            for (int64_t j = 0; j < h; ++j)
              acc[static_cast<size_t>(j)] += hid[static_cast<size_t>(i * h + j)];
          for (auto& a : acc) a /= (cu[s + 1] - cu[s]);
        } else {
          int64_t row = mode == PoolMode::kLast ? cu[s + 1] - 1 : cu[s];
          for (int64_t j = 0; j < h; ++j)
            acc[static_cast<size_t>(j)] = hid[static_cast<size_t>(row * h + j)];
        }
        double norm = 0;
        for (double a : acc) norm += a * a;
        norm = std::sqrt(norm);
        for (int64_t j = 0; j < h; ++j)
          want[static_cast<size_t>(s * h + j)] = static_cast<float>(
              normalize ? acc[static_cast<size_t>(j)] / norm : acc[static_cast<size_t>(j)]);
      }
      expectNear(get(O->view), want, 1e-5f, "pool");
    }
  }
}

TEST_P(CpuOps, ScoreYesNoAndSingleLabel) {
  const int64_t h = 21, rows = 6;
  const std::vector<int32_t> cu = {0, 3, 4, 10};
  const int64_t t = cu.back();
  auto hid = randomVec(static_cast<size_t>(t * h), rng_, 0.3f);
  auto head = randomVec(static_cast<size_t>(rows * h), rng_, 0.3f);
  auto H = put(hid, {t, h});
  auto W = put(head, {rows, h});
  auto CU = putI32(cu);
  auto O = backend_->allocateTensor(DType::kF32, {3});
  for (int neg : {-1, 2}) {
    ScoreParams p;
    p.num_seqs = 3;
    p.pos_row = 4;
    p.neg_row = neg;
    backend_->score(H.view, CU.view, W.view, O->view, p);
    auto got = get(O->view);
    for (int s = 0; s < 3; ++s) {
      const float* last = &hid[static_cast<size_t>((cu[s + 1] - 1) * h)];
      double z = 0;
      for (int64_t j = 0; j < h; ++j)
        z += static_cast<double>(last[j]) * head[static_cast<size_t>(4 * h + j)];
      if (neg >= 0)
        for (int64_t j = 0; j < h; ++j)
          z -= static_cast<double>(last[j]) * head[static_cast<size_t>(neg * h + j)];
      EXPECT_NEAR(got[static_cast<size_t>(s)], 1.0 / (1.0 + std::exp(-z)), 1e-6);
    }
  }
}

TEST_P(CpuOps, UploadConvertsBf16AndF16) {
  std::vector<uint16_t> bf = {f32ToBf16(1.5f), f32ToBf16(-2.25f), f32ToBf16(3.0e-3f)};
  std::vector<uint16_t> hf = {f32ToF16(1.5f), f32ToF16(-2.25f), f32ToF16(3.0e-3f)};
  auto T = backend_->allocateTensor(DType::kF32, {3});
  ASSERT_TRUE(backend_->uploadConvert(T->view, {bf.data(), DType::kBF16, 3}).isOk());
  auto got = get(T->view);
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_EQ(got[1], -2.25f);
  EXPECT_NEAR(got[2], 3.0e-3f, 3e-5f);
  ASSERT_TRUE(backend_->uploadConvert(T->view, {hf.data(), DType::kF16, 3}).isOk());
  got = get(T->view);
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_NEAR(got[2], 3.0e-3f, 3e-6f);
  // Count mismatch is an error, not a crash.
  EXPECT_FALSE(backend_->uploadConvert(T->view, {bf.data(), DType::kBF16, 2}).isOk());
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuOps, ::testing::Values(1, 3));

TEST(CpuBackend, LaunchReturnsBeforeWorkAndEventsTrackCompletion) {
  auto b = makeBackend("cpu", BackendOptions{});
  ASSERT_TRUE(b.isOk());
  Backend& backend = **b;
  auto ev = backend.createEvent();
  ASSERT_TRUE(ev.isOk());
  EXPECT_TRUE((*ev)->query());  // never recorded: ready
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  auto start = std::chrono::steady_clock::now();
  backend.launch([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ran.fetch_add(1);
  });
  ASSERT_TRUE(backend.recordEvent(**ev).isOk());
  // launch returned although the work is blocked.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_FALSE((*ev)->query());
  EXPECT_EQ(ran.load(), 0);
  release = true;
  ASSERT_TRUE((*ev)->wait().isOk());
  EXPECT_TRUE((*ev)->query());
  EXPECT_EQ(ran.load(), 1);
}

// markProgress() is enqueued: launched behind blocked work, it advances the counter only once
// the queue reaches it.
TEST(CpuBackend, MarkProgressAdvancesWhenTheQueueReachesIt) {
  auto b = makeBackend("cpu", BackendOptions{});
  ASSERT_TRUE(b.isOk());
  Backend& backend = **b;
  std::atomic<uint64_t> counter{0};
  backend.setProgressCounter(&counter);
  std::atomic<bool> release{false}, blocked{false};
  backend.launch([&] {
    blocked = true;
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  backend.launch([&] { backend.markProgress(); });
  while (!blocked.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(counter.load(), 0u);  // the mark is queued behind the blocked work
  release = true;
  ASSERT_TRUE(backend.synchronize().isOk());
  EXPECT_EQ(counter.load(), 1u);
  backend.setProgressCounter(nullptr);
}

TEST(CpuBackend, LaunchedWorkRunsInOrder) {
  auto b = makeBackend("cpu", BackendOptions{});
  ASSERT_TRUE(b.isOk());
  std::vector<int> order;
  for (int i = 0; i < 50; ++i) (*b)->launch([&order, i] { order.push_back(i); });
  ASSERT_TRUE((*b)->synchronize().isOk());
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
}

TEST(MakeBackend, UnknownAndCudaWithoutCuda) {
  auto bad = makeBackend("tpu", BackendOptions{});
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
#if !(defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA)
  auto cuda = makeBackend("cuda", BackendOptions{});
  ASSERT_FALSE(cuda.isOk());
  EXPECT_EQ(cuda.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(cuda.status().message().find("CUDA"), std::string::npos);
#endif
}

}  // namespace
}  // namespace garden::rose
