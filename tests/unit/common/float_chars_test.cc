// writeShortestFloat must write exactly what std::to_chars(first, last, float) writes (the JSON
// writer's documented form), for every float class: zeros, subnormals (the smallest ones print one
// digit: "1e-45"), binade edges where the gap below halves, exact
// integers wider than their shortest digits, powers of two and ten, the extremes, and ten million
// random bit patterns. (The whole positive range, 2^31 patterns, was also compared once off-line:
// bench/results/ivy-hop-2026-12-02.md.)
#include "common/float_chars.h"

#include <gtest/gtest.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

namespace garden {
namespace {

std::string ours(float f) {
  char buf[64];
  return std::string(buf, writeShortestFloat(buf, f));
}
std::string theirs(float f) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  return std::string(buf, r.ptr);
}

// Compares both signs of the pattern; counts mismatches and reports the first few.
int check(uint32_t bits, int& reported) {
  int bad = 0;
  for (uint32_t sign : {0u, 0x8000'0000u}) {
    const float f = std::bit_cast<float>((bits & 0x7fff'ffffu) | sign);
    if (!std::isfinite(f)) continue;
    const std::string a = ours(f), b = theirs(f);
    if (a != b) {
      ++bad;
      if (reported++ < 10) ADD_FAILURE() << std::hex << "bits " << (bits | sign) << ": ours " << a
                                         << ", std::to_chars " << b;
    }
  }
  return bad;
}

TEST(FloatChars, KnownValues) {
  EXPECT_EQ(ours(0.0f), "0");
  EXPECT_EQ(ours(-0.0f), "-0");
  EXPECT_EQ(ours(0.1f), "0.1");
  EXPECT_EQ(ours(1.0f), "1");
  EXPECT_EQ(ours(-2.5f), "-2.5");
  EXPECT_EQ(ours(100.0f), "100");
  EXPECT_EQ(ours(1e-4f), "1e-04");
  EXPECT_EQ(ours(0.001f), "0.001");
  EXPECT_EQ(ours(33584488.0f), "33584488");
  EXPECT_EQ(ours(1e21f), "1e+21");
  EXPECT_EQ(ours(std::numeric_limits<float>::max()), "3.4028235e+38");
  EXPECT_EQ(ours(std::numeric_limits<float>::min()), "1.1754944e-38");
  EXPECT_EQ(ours(std::numeric_limits<float>::denorm_min()), "1e-45");
  EXPECT_EQ(ours(-0.012345678f), "-0.012345678");
}

TEST(FloatChars, EveryBinadeEdgeAndSubnormalsMatchToChars) {
  int bad = 0, reported = 0;
  // Every subnormal below 2^16 patterns (all the tiny ones) and around each binade's start/end.
  for (uint32_t b = 0; b < (1u << 16); ++b) bad += check(b, reported);
  for (uint32_t e = 1; e < 255; ++e) {
    const uint32_t base = e << 23;
    for (uint32_t d = 0; d < 512; ++d) {
      bad += check(base + d, reported);
      bad += check(base + (1u << 23) - 1 - d, reported);
    }
    bad += check(base + (1u << 22), reported);
  }
  // Integers near 2^24..2^31 (exact values printed in fixed notation), powers of ten.
  for (uint32_t i = 1; i < 200000; ++i) {
    bad += check(std::bit_cast<uint32_t>(static_cast<float>(16777216u + i * 97u)), reported);
  }
  for (int p = -45; p <= 38; ++p) {
    bad += check(std::bit_cast<uint32_t>(std::pow(10.0f, static_cast<float>(p))), reported);
  }
  EXPECT_EQ(bad, 0);
}

TEST(FloatChars, TenMillionRandomPatternsMatchToChars) {
  std::mt19937 rng(20261202);
  int bad = 0, reported = 0;
  for (int i = 0; i < 10'000'000; ++i) bad += check(static_cast<uint32_t>(rng()), reported) != 0;
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace garden
