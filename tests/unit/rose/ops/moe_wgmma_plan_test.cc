// The token tiles of the wgmma MXFP4 expert GEMM [TAG_MOE_WGMMA]
// (services/rose/ops/cuda/moe_wgmma_plan.h), checked on the CPU: every row of every expert in
// exactly one tile of its own expert, tiles in order, each tile's N one of the kernel's
// instances (a multiple of 16 up to 256) covering its rows with less than 16 to spare, full
// 256-row tiles and then the rest, and refusal when the capacity or int32 offsets do not suffice.
#include "services/rose/ops/cuda/moe_wgmma_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace garden::rose::cuda {
namespace {

std::vector<MoeWgmmaTile> plan(const std::vector<int64_t>& off, int64_t cap = 1 << 20) {
  std::vector<MoeWgmmaTile> t(static_cast<size_t>(cap));
  const int64_t n = moeWgmmaPlanTiles(off.data(), static_cast<int32_t>(off.size() - 1), t.data(), cap);
  EXPECT_GE(n, 0);
  t.resize(static_cast<size_t>(n < 0 ? 0 : n));
  return t;
}

TEST(MoeWgmmaPlan, TilesCoverEveryRowOnceWithinItsExpert) {
  std::mt19937 rng(7);
  for (int rep = 0; rep < 200; ++rep) {
    const int experts = 1 + static_cast<int>(rng() % 130);
    std::vector<int64_t> off(static_cast<size_t>(experts + 1), 0);
    for (int e = 0; e < experts; ++e) {
      const int64_t rows = rng() % 4 == 0 ? 0 : 16 * static_cast<int64_t>(rng() % 60);
      off[static_cast<size_t>(e + 1)] = off[static_cast<size_t>(e)] + rows;
    }
    const auto tiles = plan(off);
    std::vector<int> cover(static_cast<size_t>(off.back()), 0);
    int64_t next_row = 0;
    for (const MoeWgmmaTile& t : tiles) {
      ASSERT_TRUE(t.n % 16 == 0 && t.n >= 16 && t.n <= 256) << t.n;
      ASSERT_GE(t.rows, 1);
      ASSERT_LE(t.rows, t.n);
      EXPECT_LT(t.n - t.rows, 16) << "a tile computes 16 or more rows it does not own";
      // Only an expert's last tile is short of 256 rows.
      if (t.rows < 256) {
        EXPECT_EQ(t.row0 + t.rows, off[static_cast<size_t>(t.expert + 1)]);
      }
      ASSERT_GE(t.expert, 0);
      ASSERT_LT(t.expert, experts);
      EXPECT_GE(t.row0, off[static_cast<size_t>(t.expert)]);
      EXPECT_LE(t.row0 + t.rows, off[static_cast<size_t>(t.expert + 1)]);
      EXPECT_EQ(t.row0, next_row) << "tiles out of order or a gap";
      next_row = t.row0 + t.rows;
      for (int32_t r = 0; r < t.rows; ++r) ++cover[static_cast<size_t>(t.row0 + r)];
    }
    EXPECT_EQ(next_row, off.back());
    for (int c : cover) ASSERT_EQ(c, 1);
  }
}

// [TAG_MOE_WGMMA_DEVICE_PLAN] The device plan launches moeWgmmaMaxTiles items' worth of tiles
// before it knows the count: for T·k assignments over E experts, each expert padded to 16 rows
// (the align), the rows are at most (min(E, T·k) + T·k / 16) · 16 and the plan never needs more
// tiles than the bound on them.
TEST(MoeWgmmaPlan, TheDevicePlansBoundHoldsForEveryRouting) {
  std::mt19937 rng(19);
  for (int rep = 0; rep < 2000; ++rep) {
    const int experts = 1 + static_cast<int>(rng() % 256);
    const int64_t assignments = 1 + static_cast<int64_t>(rng() % 40000);
    std::vector<int64_t> count(static_cast<size_t>(experts), 0);
    // Skewed or uniform routings.
    const bool skew = rng() % 2 == 0;
    for (int64_t a = 0; a < assignments; ++a) {
      const int e = skew ? static_cast<int>(rng() % (1 + rng() % experts)) : static_cast<int>(rng() % experts);
      ++count[static_cast<size_t>(e)];
    }
    std::vector<int64_t> off(static_cast<size_t>(experts + 1), 0);
    for (int e = 0; e < experts; ++e)
      off[static_cast<size_t>(e + 1)] =
          off[static_cast<size_t>(e)] + (count[static_cast<size_t>(e)] + 15) / 16 * 16;
    const int64_t busy = std::min<int64_t>(experts, assignments);
    const int64_t max_rows = (busy + assignments / 16) * 16;
    ASSERT_LE(off.back(), max_rows);
    const int64_t bound = moeWgmmaMaxTiles(max_rows, busy);
    std::vector<MoeWgmmaTile> t(static_cast<size_t>(bound));
    const int64_t n = moeWgmmaPlanTiles(off.data(), experts, t.data(), bound);
    ASSERT_GE(n, 0) << "the plan needs more tiles than the bound (" << bound << ")";
    EXPECT_LE(n, bound);
  }
}

TEST(MoeWgmmaPlan, FullTilesThenTheRest) {
  EXPECT_EQ(moeWgmmaTileN(1), 16);
  EXPECT_EQ(moeWgmmaTileN(16), 16);
  EXPECT_EQ(moeWgmmaTileN(17), 32);
  EXPECT_EQ(moeWgmmaTileN(240), 240);
  EXPECT_EQ(moeWgmmaTileN(255), 256);
  EXPECT_EQ(moeWgmmaTileN(256), 256);
  // One expert of 272 rows: 256 + a 16-row tile.
  auto t = plan({0, 272});
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].n, 256);
  EXPECT_EQ(t[0].rows, 256);
  EXPECT_EQ(t[1].n, 16);
  EXPECT_EQ(t[1].rows, 16);
  EXPECT_EQ(t[1].row0, 256);
  // 1,040 rows: 256 x 4 + 16; an empty expert gets no tile; 16 rows: one tile of 16; 130: n 144.
  t = plan({0, 1040, 1040, 1056, 1186});
  ASSERT_EQ(t.size(), 7u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t[static_cast<size_t>(i)].n, 256);
  EXPECT_EQ(t[4].n, 16);
  EXPECT_EQ(t[4].rows, 16);
  EXPECT_EQ(t[4].row0, 1024);
  EXPECT_EQ(t[5].expert, 2);
  EXPECT_EQ(t[5].row0, 1040);
  EXPECT_EQ(t[5].n, 16);
  EXPECT_EQ(t[6].expert, 3);
  EXPECT_EQ(t[6].rows, 130);
  EXPECT_EQ(t[6].n, 144);
}

TEST(MoeWgmmaPlan, RefusesWhatDoesNotFit) {
  std::vector<MoeWgmmaTile> t(3);
  const std::vector<int64_t> off = {0, 512, 1024};  // 4 tiles
  EXPECT_EQ(moeWgmmaPlanTiles(off.data(), 2, t.data(), 3), -1);
  EXPECT_EQ(moeWgmmaPlanTiles(off.data(), 2, t.data(), 0), -1);
  std::vector<MoeWgmmaTile> big(4);
  EXPECT_EQ(moeWgmmaPlanTiles(off.data(), 2, big.data(), 4), 4);
  const std::vector<int64_t> huge = {0, int64_t{1} << 32};
  EXPECT_EQ(moeWgmmaPlanTiles(huge.data(), 1, big.data(), 4), -1);
  const std::vector<int64_t> down = {100, 50};
  EXPECT_EQ(moeWgmmaPlanTiles(down.data(), 1, big.data(), 4), -1);
}

}  // namespace
}  // namespace garden::rose::cuda
