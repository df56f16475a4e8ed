// The split operands of the tensor-core router [TAG_ROUTER_MMA] (services/rose/ops/router_split.h
// and the kernel's three-part split of the residual, ops/cuda/moe_router_f32.cu splitPair),
// checked on the CPU: the weight split is exact and laid out as the kernel reads it, the residual
// split is exact, and the five products the kernel sums give x·w to well below f32 rounding.
#include "services/rose/ops/router_split.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/safetensors.h"

namespace garden::rose {
namespace {

float bf(float x) { return bf16ToF32(f32ToBf16(x)); }

TEST(RouterSplit, WeightsAreExactHalvesInTheKernelLayout) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::uniform_real_distribution<float> ud(0.5f, 1.5f);
  for (auto [h, e] : {std::pair<int64_t, int64_t>{2880, 32}, {2880, 128}, {260, 12}, {96, 4}}) {
    SCOPED_TRACE("H=" + std::to_string(h) + " E=" + std::to_string(e));
    // wt[k, e] = router[e, k] · gamma[k], both bf16 (as the model folds them).
    std::vector<float> router(static_cast<size_t>(e * h)), gamma(static_cast<size_t>(h));
    for (auto& x : router) x = bf(nd(rng));
    for (auto& x : gamma) x = bf(ud(rng));
    std::vector<float> wt(static_cast<size_t>(h * e));
    for (int64_t x = 0; x < e; ++x)
      for (int64_t k = 0; k < h; ++k)
        wt[static_cast<size_t>(k * e + x)] =
            router[static_cast<size_t>(x * h + k)] * gamma[static_cast<size_t>(k)];
    bool exact = false;
    const auto s = routerSplitWeights(wt.data(), h, e, &exact);
    EXPECT_TRUE(exact);
    const int64_t ep = routerSplitPaddedE(e), hp = routerSplitPaddedH(h);
    EXPECT_EQ(ep % 8, 0);
    EXPECT_EQ(hp % 32, 0);
    EXPECT_GE(ep, e);
    EXPECT_GE(hp, h);
    ASSERT_EQ(s.size(), static_cast<size_t>(2 * ep * hp));
    int64_t lo_nonzero = 0;
    for (int64_t x = 0; x < ep; ++x)
      for (int64_t k = 0; k < hp; ++k) {
        const float hi = bf16ToF32(s[static_cast<size_t>(x * hp + k)]);
        const float lo = bf16ToF32(s[static_cast<size_t>(ep * hp + x * hp + k)]);
        if (x >= e || k >= h) {  // padding
          ASSERT_EQ(hi, 0.f);
          ASSERT_EQ(lo, 0.f);
          continue;
        }
        const float w = wt[static_cast<size_t>(k * e + x)];
        ASSERT_EQ(hi + lo, w) << "expert " << x << " k " << k;
        ASSERT_EQ(hi, bf(w));
        ASSERT_LE(std::fabs(lo), std::fabs(hi) * std::ldexp(1.f, -8));
        if (lo != 0.f) ++lo_nonzero;
      }
    // Products of two random bf16 values mostly need both halves.
    EXPECT_GT(lo_nonzero, e * h / 2);
  }
  // A value with more than 16 significant bits is not two bf16 halves.
  const float odd = 1.f + std::ldexp(1.f, -9) + std::ldexp(1.f, -20);  // 12 bits below hi
  bool exact = true;
  (void)routerSplitWeights(&odd, 1, 1, &exact);
  EXPECT_FALSE(exact);
}

// The kernel's residual split (hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid), round to
// nearest) and its five products (hi·whi, hi·wlo, mid·whi, mid·wlo, lo·whi; lo·wlo dropped).
TEST(RouterSplit, ResidualSplitIsExactAndFiveProductsKeepF32Accuracy) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::uniform_real_distribution<float> ex(-30.f, 30.f);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = nd(rng) * std::exp2(std::round(ex(rng)));
    const float w = bf(nd(rng) * 0.02f) * bf(1.f + nd(rng) * 0.1f);  // a product of two bf16
    const float hi = bf(x), mid = bf(x - hi), lo = bf(x - hi - mid);
    ASSERT_EQ(static_cast<double>(hi) + mid + lo, static_cast<double>(x)) << x;
    const float whi = bf(w), wlo = bf(w - whi);
    ASSERT_EQ(whi + wlo, w);
    // Each product of two bf16 values is exact in f32.
    const float p[5] = {lo * whi, mid * wlo, mid * whi, hi * wlo, hi * whi};
    const double exact_p[5] = {static_cast<double>(lo) * whi, static_cast<double>(mid) * wlo,
                               static_cast<double>(mid) * whi, static_cast<double>(hi) * wlo,
                               static_cast<double>(hi) * whi};
    double sum = 0;
    for (int j = 0; j < 5; ++j) {
      ASSERT_EQ(static_cast<double>(p[j]), exact_p[j]);
      sum += exact_p[j];
    }
    const double ref = static_cast<double>(x) * w;
    if (ref != 0) worst = std::max(worst, std::fabs(sum - ref) / std::fabs(ref));
  }
  // The dropped lo·wlo term is below 2^-24 of x·w (f32's own rounding of one product).
  EXPECT_LT(worst, std::ldexp(1.0, -24));
  EXPECT_GT(worst, 0.0);  // it is dropped, not zero
}

}  // namespace
}  // namespace garden::rose
