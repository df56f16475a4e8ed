// moeChunkRuns [TAG_MOE_LT_BF16]: how GptOssModel cuts a step's rows into MoE calls when the ops
// take large prefill chunks on their own path.

#include "services/rose/model/moe_chunk_runs.h"

#include <gtest/gtest.h>

#include <vector>

namespace garden::rose {
namespace {

std::vector<MoeRun> runs(std::vector<int32_t> cu, int64_t rows, int64_t min_rows = 256) {
  std::vector<MoeRun> out;
  moeChunkRuns(cu, rows, /*top_k=*/4, /*experts=*/32, min_rows, out);  // large: >= 2048 tokens
  return out;
}

void expectRuns(const std::vector<MoeRun>& got, const std::vector<MoeRun>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].begin, want[i].begin) << "run " << i;
    EXPECT_EQ(got[i].end, want[i].end) << "run " << i;
    EXPECT_EQ(got[i].large, want[i].large) << "run " << i;
  }
}

TEST(MoeChunkRuns, NoLargeChunkMeansOneCall) {
  EXPECT_TRUE(runs({0, 1, 2, 3}, 3).empty());           // decode
  EXPECT_TRUE(runs({0, 2047, 2048}, 2048).empty());     // just under: 2047 x 4 < 256 x 32
  EXPECT_TRUE(runs({0, 5000}, 5000, 0).empty());        // switched off
  EXPECT_TRUE(runs({0}, 0).empty());
}

TEST(MoeChunkRuns, ALargeChunkAloneIsOneLargeRun) {
  expectRuns(runs({0, 2048}, 2048), {{0, 2048, true}});
  expectRuns(runs({0, 16384}, 16384), {{0, 16384, true}});
}

TEST(MoeChunkRuns, SmallNeighboursMergeAndLargeChunksStayApart) {
  // decode, decode, large, small, large, large, decode
  expectRuns(runs({0, 1, 2, 3002, 3102, 6102, 8150, 8151}, 8151),
             {{0, 2, false}, {2, 3002, true}, {3002, 3102, false}, {3102, 6102, true},
              {6102, 8150, true}, {8150, 8151, false}});
}

TEST(MoeChunkRuns, PaddingRowsJoinASmallRun) {
  expectRuns(runs({0, 3000, 3001}, 3008), {{0, 3000, true}, {3000, 3008, false}});
  expectRuns(runs({0, 1, 3001}, 3004), {{0, 1, false}, {1, 3001, true}, {3001, 3004, false}});
}

TEST(MoeChunkRuns, EmptySequencesAreSkipped) {
  expectRuns(runs({0, 0, 2500, 2500, 2510}, 2510), {{0, 2500, true}, {2500, 2510, false}});
}

TEST(MoeChunkRuns, TheThresholdScalesWithTheExperts) {
  std::vector<MoeRun> out;
  moeChunkRuns(std::vector<int32_t>{0, 4096}, 4096, 4, 128, 256, out);  // 120b: needs 8192
  EXPECT_TRUE(out.empty());
  moeChunkRuns(std::vector<int32_t>{0, 8192}, 8192, 4, 128, 256, out);
  expectRuns(out, {{0, 8192, true}});
  moeChunkRuns(std::vector<int32_t>{0, 512}, 512, 4, 8, 256, out);  // the tiny GPU test model
  expectRuns(out, {{0, 512, true}});
}

// [TAG_MOE_PREFILL_AUTO] The whole step is one run, large by its real rows per expert (padding
// rows ride along, not counted).
TEST(MoeWholeStepRun, OneRunLargeByTheRealRows) {
  std::vector<MoeRun> out;
  moeWholeStepRun(520, 512, 4, 32, 64, out);  // 20b: 512 x 4 / 32 = 64 rows per expert
  expectRuns(out, {{0, 520, true}});
  moeWholeStepRun(520, 511, 4, 32, 64, out);  // 63.9: below the floor
  expectRuns(out, {{0, 520, false}});
  moeWholeStepRun(8192, 8192, 4, 128, 64, out);  // 120b 8k: 256 rows per expert
  expectRuns(out, {{0, 8192, true}});
  moeWholeStepRun(64, 1, 4, 32, 64, out);  // one decode row, padded
  expectRuns(out, {{0, 64, false}});
  moeWholeStepRun(0, 0, 4, 32, 64, out);
  EXPECT_TRUE(out.empty());
  moeWholeStepRun(4096, 4096, 4, 32, 0, out);  // no floor: never large
  expectRuns(out, {{0, 4096, false}});
}

}  // namespace
}  // namespace garden::rose
