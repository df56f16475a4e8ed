// MaskFillPool [TAG_MASK_POOL]: every index runs exactly once per round, its writes are visible
// to the caller when run() returns, rounds follow each other without a helper running a stale
// round's function, and the pool shuts down cleanly. Under the TSan stage (unit_tulip_llm) the
// plain-int writes below are also checked for races.
#include "services/tulip/llm/mask_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace garden::tulip {
namespace {

TEST(MaskFillPool, EveryIndexOnceAndVisibleAfterRun) {
  for (uint32_t helpers : {0u, 1u, 3u, 7u}) {
    SCOPED_TRACE("helpers " + std::to_string(helpers));
    MaskFillPool pool(helpers);
    EXPECT_EQ(pool.helpers(), helpers);
    std::mt19937 rng(helpers);
    std::vector<int> out;
    for (int round = 0; round < 500; ++round) {
      const size_t n = rng() % 70;
      out.assign(n, 0);
      // Plain writes, one per index: a duplicate run or a write after run() returned would be
      // a wrong count below (and a race under TSan).
      pool.run(n, [&](size_t i) { out[i] += round + 1; });
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(out[i], round + 1) << "round " << round << " i " << i;
    }
  }
}

TEST(MaskFillPool, HelpersShareTheWork) {
  MaskFillPool pool(3);
  std::mutex mu;
  std::set<std::thread::id> seen;
  std::atomic<int> ran{0};
  // Each call waits a little, so one thread cannot drain 64 indices before the helpers wake.
  for (int round = 0; round < 20 && seen.size() < 2; ++round) {
    pool.run(64, [&](size_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      ran.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu);
      seen.insert(std::this_thread::get_id());
    });
  }
  EXPECT_GE(seen.size(), 2u) << "no helper ever ran an index";
  EXPECT_EQ(ran.load() % 64, 0);
}

TEST(MaskFillPool, NoHelpersRunsOnTheCaller) {
  MaskFillPool pool(0);
  const auto me = std::this_thread::get_id();
  int count = 0;
  pool.run(10, [&](size_t) {
    EXPECT_EQ(std::this_thread::get_id(), me);
    ++count;
  });
  EXPECT_EQ(count, 10);
  pool.run(0, [&](size_t) { ADD_FAILURE() << "n = 0 ran something"; });
}

}  // namespace
}  // namespace garden::tulip
