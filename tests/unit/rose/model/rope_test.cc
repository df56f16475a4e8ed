// YaRN frequencies and tables against the formula and the values in the gpt-oss spec
// (gpt-oss.md §2.3: d = 64, θ = 150000, factor 32, L0 = 4096, β 32/1, no
// truncation), plus the default RoPE and the truncating variant.

#include "services/rose/model/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

namespace garden::rose {
namespace {

RopeScaling gptOssYarn() {
  RopeScaling s;
  s.type = "yarn";
  s.factor = 32.0;
  s.beta_fast = 32.0;
  s.beta_slow = 1.0;
  s.original_max_position_embeddings = 4096;
  s.truncate = false;
  return s;
}

TEST(YarnRope, MatchesSpecTable) {
  auto f = computeRopeFrequencies(64, 150000.0, gptOssYarn(), 131072);
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  ASSERT_EQ(f->inv_freq.size(), 32u);
  // ω[i] from the spec's table (float64, derived there).
  const double spec[32] = {1.000000000e+00, 6.890443059e-01, 4.747820555e-01, 3.271458719e-01,
                           2.254180002e-01, 1.553229895e-01, 1.070244215e-01, 7.374456821e-02,
                           5.081327482e-02, 3.170569618e-02, 1.933500113e-02, 1.159204926e-02,
                           6.794959490e-03, 3.860359317e-03, 2.093792379e-03, 1.052602101e-03,
                           4.564839192e-04, 1.293187012e-04, 3.830881237e-05, 2.639646903e-05,
                           1.818833668e-05, 1.253256982e-05, 8.635495875e-06, 5.950239261e-06,
                           4.099978482e-06, 2.825066827e-06, 1.946596211e-06, 1.341291035e-06,
                           9.242089502e-07, 6.368209146e-07, 4.387978251e-07, 3.023511428e-07};
  for (int i = 0; i < 32; ++i) {
    EXPECT_NEAR(f->inv_freq[static_cast<size_t>(i)], spec[i], 2e-6 * spec[i]) << "i=" << i;
  }
  EXPECT_NEAR(f->attention_scaling, 1.3465735902799727, 1e-7);
}

TEST(YarnRope, MatchesFormulaInFloat64) {
  // The formula written out independently, for a head_dim of 16 (the fixture model).
  const int d = 16, half = 8;
  const double theta = 150000.0, s = 32.0, l0 = 4096;
  auto corr = [&](double rot) {
    return d * std::log(l0 / (rot * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  const double low = corr(32.0), high = corr(1.0);
  auto f = computeRopeFrequencies(d, theta, gptOssYarn(), 131072);
  ASSERT_TRUE(f.isOk());
  int blended = 0;
  for (int i = 0; i < half; ++i) {
    const double base = std::pow(theta, -2.0 * i / d);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double m = 1 - ramp;
    const double want = base / s * (1 - m) + base * m;
    blended += m > 0 && m < 1;
    EXPECT_NEAR(f->inv_freq[static_cast<size_t>(i)], want, 2e-6 * want) << i;
  }
  EXPECT_GE(blended, 2);  // the ramp really blends some frequencies at this size
  // Tables: C·cos(p·ω), C·sin(p·ω).
  const int n = 300;
  std::vector<float> c(n * half), sn(n * half);
  buildRopeTables(*f, n, c.data(), sn.data());
  for (int p : {0, 1, 7, 128, 299}) {
    for (int i = 0; i < half; ++i) {
      const double ang = static_cast<double>(p) * f->inv_freq[static_cast<size_t>(i)];
      EXPECT_NEAR(c[static_cast<size_t>(p * half + i)], f->attention_scaling * std::cos(ang), 1e-5)
          << p << "," << i;
      EXPECT_NEAR(sn[static_cast<size_t>(p * half + i)], f->attention_scaling * std::sin(ang), 1e-5)
          << p << "," << i;
    }
  }
  EXPECT_FLOAT_EQ(c[0], f->attention_scaling);  // position 0: cos = C, sin = 0
  EXPECT_FLOAT_EQ(sn[0], 0.f);
}

TEST(YarnRope, TruncateRoundsTheRamp) {
  RopeScaling s = gptOssYarn();
  s.truncate = true;  // floor(low) = 8, ceil(high) = 18 at d = 64
  auto f = computeRopeFrequencies(64, 150000.0, s, 131072);
  ASSERT_TRUE(f.isOk());
  auto g = computeRopeFrequencies(64, 150000.0, gptOssYarn(), 131072);
  // i = 8: ramp 0 under truncation (unchanged frequency), i = 9: (9-8)/10 blend.
  EXPECT_NEAR(f->inv_freq[8], std::pow(150000.0, -16.0 / 64), 1e-8);
  const double b9 = std::pow(150000.0, -18.0 / 64);
  EXPECT_NEAR(f->inv_freq[9], b9 / 32 * 0.1 + b9 * 0.9, 1e-8);
  EXPECT_GT(std::fabs(f->inv_freq[9] - g->inv_freq[9]), 1e-5);
}

TEST(YarnRope, DefaultAndErrors) {
  auto f = computeRopeFrequencies(8, 10000.0, RopeScaling{}, 4096);
  ASSERT_TRUE(f.isOk());
  EXPECT_FLOAT_EQ(f->attention_scaling, 1.f);
  EXPECT_NEAR(f->inv_freq[1], std::pow(10000.0, -0.25), 1e-7);
  RopeScaling bad;
  bad.type = "longrope";
  EXPECT_EQ(computeRopeFrequencies(8, 10000.0, bad, 4096).status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(computeRopeFrequencies(7, 10000.0, RopeScaling{}, 4096).status().code(),
            StatusCode::kInvalidArgument);
  RopeScaling explicit_factor = gptOssYarn();
  explicit_factor.attention_factor = 1.25;
  EXPECT_FLOAT_EQ(computeRopeFrequencies(64, 150000.0, explicit_factor, 131072)->attention_scaling,
                  1.25f);
}

}  // namespace
}  // namespace garden::rose
