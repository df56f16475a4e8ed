// The resident MXFP4 tile layout (services/rose/ops/cuda/mxfp4_tiles.h) checked on the CPU: the
// element -> (byte, nibble) map and its inverse agree on every position, and a tile packed with it
// and read back the way the decode GEMM reads it (one 16-byte chunk per lane, fragment registers
// by shifts and masks, one multiply by 2^(s-1)) gives exactly the reference dequantization.
#include "services/rose/ops/cuda/mxfp4_tiles.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "services/rose/model/mxfp4.h"

namespace garden::rose::cuda {
namespace {

float bf16BitsToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(Mxfp4Tiles, PositionsAreABijectionAndInvertible) {
  std::set<std::pair<int, int>> seen;
  for (int r = 0; r < kMxTileRows; ++r) {
    for (int k = 0; k < kMxTileK; ++k) {
      const Mxfp4TilePos p = mxfp4TilePos(r, k);
      ASSERT_GE(p.byte, 0);
      ASSERT_LT(p.byte, kMxTileBytes);
      EXPECT_TRUE(seen.insert({p.byte, p.nibble}).second) << "r=" << r << " k=" << k;
      // Inverse through the lane/word/register view.
      const int grp = p.byte / 512, lane = (p.byte % 512) / 16, s = (p.byte % 16) / 4;
      const int bit = (p.byte % 4) * 8 + p.nibble * 4;
      const int odd = bit / 16, j = 3 - (bit % 16) / 4;
      const Mxfp4Element e = mxfp4WordElement(lane, s, j, odd);
      EXPECT_EQ(grp * kMxGroupRows + e.row, r);
      EXPECT_EQ(e.k, k);
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kMxTileBytes * 2));
}

TEST(Mxfp4Tiles, LaneFragmentsDequantizeExactly) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  // One 128-row x 64-k tile: checkpoint codes [128][2 groups][16], scales [128][2] covering the
  // whole decode range, including the smallest (subnormal results) and the largest.
  std::vector<uint8_t> codes(128 * 2 * 16), scales(128 * 2);
  for (auto& c : codes) c = static_cast<uint8_t>(byte(rng));
  for (size_t i = 0; i < scales.size(); ++i)
    scales[i] = static_cast<uint8_t>(i < 4 ? i : i < 8 ? kMxfp4MaxDecodeScale - (i - 4)
                                                       : 100 + byte(rng) % 29);
  std::vector<float> ref(128 * 64);
  dequantizeMxfp4(codes.data(), scales.data(), 128, 2, ref.data());
  // Pack with mxfp4TilePos.
  std::vector<uint8_t> tile(kMxTileBytes, 0);
  for (int r = 0; r < 128; ++r) {
    for (int k = 0; k < 64; ++k) {
      const uint8_t b = codes[static_cast<size_t>((r * 2 + k / 32) * 16 + (k % 32) / 2)];
      const uint8_t nib = (k % 2) ? (b >> 4) : (b & 15);
      const Mxfp4TilePos p = mxfp4TilePos(r, k);
      tile[static_cast<size_t>(p.byte)] |= static_cast<uint8_t>(nib << (4 * p.nibble));
    }
  }
  // Read back as a lane does.
  int checked = 0;
  for (int grp = 0; grp < 8; ++grp) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int s = 0; s < 4; ++s) {
        uint32_t w;
        std::memcpy(&w, tile.data() + grp * 512 + lane * 16 + s * 4, 4);
        for (int j = 0; j < 4; ++j) {
          const uint32_t bits = mxfp4WordToBf16x2Bits(w, j);
          for (int odd = 0; odd < 2; ++odd) {
            const Mxfp4Element e = mxfp4WordElement(lane, s, j, odd);
            const int row = grp * 16 + e.row;
            const uint32_t sc = scales[static_cast<size_t>(row * 2 + e.k / 32)];
            const float v = bf16BitsToFloat(static_cast<uint16_t>(bits >> (16 * odd)));
            const float f = bf16BitsToFloat(mxfp4DecodeScaleBits(sc));
            // bf16 product: exact here (a power of two times a value with 2 significant bits).
            const float got = v * f;
            const float want = ref[static_cast<size_t>(row * 64 + e.k)];
            ASSERT_EQ(got, want) << "row " << row << " k " << e.k << " scale " << sc;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 128 * 64);
}

TEST(Mxfp4Tiles, DecodeScaleIsThePowerOfTwo) {
  for (uint32_t s = 0; s <= kMxfp4MaxDecodeScale; ++s) {
    EXPECT_EQ(bf16BitsToFloat(mxfp4DecodeScaleBits(s)), std::ldexp(1.f, static_cast<int>(s) - 1));
  }
}

// The decode-regime K slicing [TAG_MOE_K_SLICES]: slices tile [0, kt) contiguously in order,
// none empty, no more than requested, and the gpt-oss shape (K = 2880: 45 tiles) with the
// 4 slices gives 12 + 12 + 12 + 9.
TEST(Mxfp4Tiles, KSlicesPartitionTheKTiles) {
  for (int kt = 1; kt <= 200; ++kt) {
    for (int req = 0; req <= 10; ++req) {
      const MoeKSlicing sl = moeKSlicing(kt, req);
      ASSERT_GE(sl.len, 1);
      ASSERT_GE(sl.count, 1);
      EXPECT_LE(sl.count, std::max(1, req)) << "kt=" << kt << " req=" << req;
      // Slice i = [i * len, min(kt, (i + 1) * len)): covers [0, kt) exactly, every slice non-empty.
      EXPECT_GE(sl.count * sl.len, kt);
      EXPECT_LT((sl.count - 1) * sl.len, kt) << "last slice empty: kt=" << kt << " req=" << req;
      if (req <= 1) {
        EXPECT_EQ(sl.count, 1);
      }
    }
  }
  constexpr MoeKSlicing g = moeKSlicing(45, 4);
  static_assert(g.len == 12 && g.count == 4, "gpt-oss K = 2880 in 4 slices");
  EXPECT_EQ(moeKSlicing(5, 4).count, 3);  // K = 288: 2 + 2 + 1
  EXPECT_EQ(moeKSlicing(3, 4).count, 3);  // K = 160 (3 tiles, the last half padding)
}

}  // namespace
}  // namespace garden::rose::cuda
