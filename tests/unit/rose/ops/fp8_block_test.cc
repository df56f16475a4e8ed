// The FP8 expert format's host-side arithmetic (services/rose/ops/cuda/fp8_block.h) on the CPU:
// K padding and block counts at gpt-oss's sizes and odd ones, the e4m3 conversion against a
// brute-force nearest-value search, which MXFP4 weights the block exponent keeps exact, the
// cuBLASLt scale layouts (activation scales of every expert range tile [0, rows * L) once with
// the row fastest; weight scales per (row block, K block) with a column stride that is a
// multiple of 4), and the expert ranges derived from the align step's tile list.
#include "services/rose/ops/cuda/fp8_block.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

namespace garden::rose::cuda {
namespace {

TEST(Fp8Block, PaddingAndBlockCounts) {
  EXPECT_EQ(fp8PaddedK(2880), 2944);
  EXPECT_EQ(fp8KBlocks(2880), 23);
  EXPECT_EQ(fp8KBlocks4(2880), 24);
  EXPECT_EQ(fp8RowBlocks(2880), 23);
  EXPECT_EQ(fp8RowBlocks(5760), 45);
  EXPECT_EQ(fp8WeightScalesPerExpert(5760, 2880), 45 * 24);
  EXPECT_EQ(fp8PaddedK(288), 384);
  EXPECT_EQ(fp8KBlocks(288), 3);
  EXPECT_EQ(fp8KBlocks4(288), 4);
  EXPECT_EQ(fp8PaddedK(160), 256);
  EXPECT_EQ(fp8KBlocks4(160), 4);
  EXPECT_EQ(fp8PaddedK(128), 128);
  EXPECT_EQ(fp8KBlocks(128), 1);
  EXPECT_EQ(fp8PaddedK(129), 256);
  EXPECT_EQ(fp8KBlocks4(4 * 128), 4);
  EXPECT_EQ(fp8KBlocks4(5 * 128), 8);
  for (int64_t k = 32; k <= 6000; k += 32) {
    EXPECT_EQ(fp8PaddedK(k) % 128, 0);
    EXPECT_GE(fp8PaddedK(k), k);
    EXPECT_LT(fp8PaddedK(k) - k, 128);
    EXPECT_EQ(fp8KBlocks(k) * 128, fp8PaddedK(k));
    EXPECT_EQ(fp8KBlocks4(k) % 4, 0);
  }
}

// The nearest finite e4m3 value, ties to the even code (even mantissa), saturating.
uint8_t bruteE4m3(float f) {
  if (std::isnan(f)) return 0x7F;
  const float a = std::fabs(f);
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c < 0x7F; ++c) {  // 0x00 .. 0x7E: all finite non-negative codes
    const double d = std::fabs(static_cast<double>(fp8E4m3ToFloat(static_cast<uint8_t>(c))) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>((f < 0 || (f == 0 && std::signbit(f)) ? 0x80 : 0) | best);
}

TEST(Fp8Block, E4m3ConversionRoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(fp8E4m3FromFloat(1.f), 0x38);
  EXPECT_EQ(fp8E4m3FromFloat(448.f), 0x7E);
  EXPECT_EQ(fp8E4m3FromFloat(500.f), 0x7E);
  EXPECT_EQ(fp8E4m3FromFloat(-1e9f), 0xFE);
  EXPECT_EQ(fp8E4m3FromFloat(0.015625f), 0x08);          // 2^-6, smallest normal
  EXPECT_EQ(fp8E4m3FromFloat(std::ldexp(1.f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(fp8E4m3FromFloat(std::ldexp(1.f, -10)), 0x00);  // tie -> even (0)
  EXPECT_EQ(fp8E4m3FromFloat(std::ldexp(3.f, -10)), 0x02);  // tie between 1 and 2 -> 2
  EXPECT_EQ(fp8E4m3FromFloat(1.0625f), 0x38);               // tie between 1 and 1.125 -> 1
  EXPECT_EQ(fp8E4m3FromFloat(1.1875f), 0x3A);               // tie between 1.125 and 1.25
  EXPECT_FLOAT_EQ(fp8E4m3ToFloat(0x7E), 448.f);
  EXPECT_FLOAT_EQ(fp8E4m3ToFloat(0xB8), -1.f);
  EXPECT_TRUE(std::isnan(fp8E4m3ToFloat(0x7F)));
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(fp8E4m3FromFloat(fp8E4m3ToFloat(static_cast<uint8_t>(c))), c) << c;
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> mant(-1.f, 1.f);
  std::uniform_int_distribution<int> ex(-14, 10);
  for (int i = 0; i < 200000; ++i) {
    const float f = std::ldexp(mant(rng), ex(rng));
    ASSERT_EQ(fp8E4m3FromFloat(f), bruteE4m3(f)) << f;
  }
  // Midpoints between neighbouring codes: ties to even.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = fp8E4m3ToFloat(static_cast<uint8_t>(c)), hi = fp8E4m3ToFloat(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);
    EXPECT_EQ(fp8E4m3FromFloat(mid), (c & 1) ? c + 1 : c) << c;
  }
}

TEST(Fp8Block, BlockExponentKeepsMxfp4WeightsExact) {
  const float kE2m1[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (uint32_t m = 0; m < 8; ++m) {
    if (m == 0) {
      EXPECT_EQ(e2m1Log2(m), kFp8NoWeight);
    } else {
      EXPECT_EQ(e2m1Log2(m), static_cast<int>(std::floor(std::log2(kE2m1[m])))) << m;
    }
  }
  // A block whose largest weight has floor(log2) = x: every weight >= 2^(x-16) is exact, the
  // largest stays <= 448, and a two-bit weight at 2^(x-17) is not exact.
  for (int x = -30; x <= 5; ++x) {
    const int e = fp8BlockExponent(x);
    const float scale = std::ldexp(1.f, e);
    for (int s = 0; s < 255; ++s) {
      for (uint32_t m = 1; m < 8; ++m) {
        const float w = std::ldexp(kE2m1[m], s - 127);
        const int lw = e2m1Log2(m) + s - 127;
        if (lw > x || lw < x - 16) continue;
        const float rel = w / scale;
        ASSERT_LE(rel, 448.f);
        ASSERT_EQ(fp8E4m3ToFloat(fp8E4m3FromFloat(rel)), rel) << "x=" << x << " s=" << s << " m=" << m;
      }
    }
    const float w = std::ldexp(1.5f, x - 17);
    EXPECT_NE(fp8E4m3ToFloat(fp8E4m3FromFloat(w / scale)), w / scale);
  }
  EXPECT_EQ(fp8BlockExponent(-130), -126);  // the scale stays a normal float
}

TEST(Fp8Block, ActivationScalesTileEachExpertRangeRowFastest) {
  std::mt19937 rng(7);
  for (int64_t k : {2880, 288, 160, 128}) {
    const int64_t nb = fp8KBlocks(k);
    std::vector<int64_t> off = {0};
    for (int e = 0; e < 9; ++e) off.push_back(off.back() + 16 * static_cast<int64_t>(rng() % 5));
    const int64_t rows = off.back();
    std::vector<int> seen(static_cast<size_t>(rows * nb), 0);
    for (size_t e = 0; e + 1 < off.size(); ++e) {
      const int64_t r0 = off[e], cnt = off[e + 1] - off[e];
      for (int64_t r = r0; r < r0 + cnt; ++r) {
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t i = fp8ActScaleIndex(k, r0, cnt, r, b);
          ASSERT_GE(i, r0 * nb);  // inside the expert's own block, which starts at r0 * L
          ASSERT_LT(i, (r0 + cnt) * nb);
          ++seen[static_cast<size_t>(i)];
          // cuBLASLt's VEC128 B scales of this matmul: [L][cnt], the row (N) contiguous.
          EXPECT_EQ(i - r0 * nb, b * cnt + (r - r0));
        }
      }
      // 16-byte aligned start when ranges are multiples of 4 rows.
      EXPECT_EQ((r0 * nb * 4) % 16, 0);
    }
    for (int v : seen) ASSERT_EQ(v, 1);
  }
}

TEST(Fp8Block, WeightScalesAreKMajorWithAStrideOfFour) {
  for (int64_t n : {5760, 2880, 320, 288}) {
    for (int64_t k : {2880, 288, 160}) {
      std::set<int64_t> seen;
      for (int64_t p = 0; p < fp8RowBlocks(n); ++p) {
        for (int64_t b = 0; b < fp8KBlocks4(k); ++b) {
          const int64_t i = fp8WeightScaleIndex(k, p, b);
          ASSERT_GE(i, 0);
          ASSERT_LT(i, fp8WeightScalesPerExpert(n, k));
          EXPECT_TRUE(seen.insert(i).second);
          if (b + 1 < fp8KBlocks4(k)) {
            EXPECT_EQ(fp8WeightScaleIndex(k, p, b + 1), i + 1);
          }
        }
        EXPECT_EQ(fp8WeightScaleIndex(k, p + 1, 0) - fp8WeightScaleIndex(k, p, 0), fp8KBlocks4(k));
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), fp8WeightScalesPerExpert(n, k));
      EXPECT_EQ(fp8WeightScalesPerExpert(n, k) * 4 % 16, 0);  // the next expert stays 16-byte aligned
    }
  }
}

TEST(Fp8Block, ExpertOffsetsFromTheAlignTileList) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t ne = 1 + static_cast<int32_t>(rng() % 40), bm = 16;
    std::vector<int64_t> counts(static_cast<size_t>(ne));
    std::vector<int32_t> tiles;
    for (int32_t e = 0; e < ne; ++e) {
      counts[static_cast<size_t>(e)] = rng() % 3 == 0 ? 0 : static_cast<int64_t>(rng() % 100);
      const int64_t t = (counts[static_cast<size_t>(e)] + bm - 1) / bm;  // as moeAlignKernel
      for (int64_t x = 0; x < t; ++x) tiles.push_back(e);
    }
    const size_t used = tiles.size();
    tiles.resize(used + 1 + rng() % 5, -1);
    std::vector<int64_t> off(static_cast<size_t>(ne + 1));
    ASSERT_TRUE(moeExpertOffsetsFromTiles(tiles.data(), static_cast<int64_t>(tiles.size()), bm, ne, off.data()));
    int64_t row = 0;
    for (int32_t e = 0; e < ne; ++e) {
      EXPECT_EQ(off[static_cast<size_t>(e)], row);
      row += (counts[static_cast<size_t>(e)] + bm - 1) / bm * bm;
    }
    EXPECT_EQ(off[static_cast<size_t>(ne)], row);
    EXPECT_EQ(off[static_cast<size_t>(ne)], static_cast<int64_t>(used) * bm);
  }
  int64_t off[4];
  const int32_t unsorted[] = {1, 0, -1};
  EXPECT_FALSE(moeExpertOffsetsFromTiles(unsorted, 3, 16, 3, off));
  const int32_t outside[] = {0, 3, -1};
  EXPECT_FALSE(moeExpertOffsetsFromTiles(outside, 3, 16, 3, off));
  const int32_t full[] = {0, 2, 2};  // no -1 terminator: the whole list counts
  ASSERT_TRUE(moeExpertOffsetsFromTiles(full, 3, 16, 3, off));
  EXPECT_EQ(off[1], 16);
  EXPECT_EQ(off[2], 16);
  EXPECT_EQ(off[3], 48);
}

}  // namespace
}  // namespace garden::rose::cuda
