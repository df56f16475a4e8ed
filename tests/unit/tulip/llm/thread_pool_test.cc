// common/thread_pool.h's parallelTasks as tulip fills a step's structured-output masks with it
// [TAG_MASK_POOL]: every index runs exactly once per round, its writes are visible to the caller
// when it returns, rounds follow each other cleanly, and the pool shuts down cleanly. Kept in
// unit_tulip_llm so the ThreadSanitizer stage runs it (the plain-int writes below are checked for
// races there).
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace garden::tulip {
namespace {

TEST(MaskThreadPool, EveryIndexOnceAndVisibleAfterRun) {
  for (int helpers : {0, 1, 3, 7}) {
    SCOPED_TRACE("helpers " + std::to_string(helpers));
    ThreadPool pool(helpers + 1);
    EXPECT_EQ(pool.size(), helpers + 1);
    std::mt19937 rng(static_cast<uint32_t>(helpers));
    std::vector<int> out;
    for (int round = 0; round < 500; ++round) {
      const size_t n = rng() % 70;
      out.assign(n, 0);
      // Plain writes, one per index: a duplicate run or a write after parallelTasks returned
      // would be a wrong count below (and a race under TSan).
      pool.parallelTasks(static_cast<int64_t>(n),
                         [&](int64_t i, int) { out[static_cast<size_t>(i)] += round + 1; });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], round + 1) << "round " << round << " i " << i;
    }
  }
}

TEST(MaskThreadPool, HelpersShareTheWork) {
  ThreadPool pool(4);
  std::mutex mu;
  std::set<std::thread::id> seen;
  std::atomic<int> ran{0};
  // Each call waits a little, so one thread cannot drain 64 indices before the helpers wake.
  for (int round = 0; round < 20 && seen.size() < 2; ++round) {
    pool.parallelTasks(64, [&](int64_t, int) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      ran.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu);
      seen.insert(std::this_thread::get_id());
    });
  }
  EXPECT_GE(seen.size(), 2u) << "no helper ever ran an index";
  EXPECT_EQ(ran.load() % 64, 0);
}

TEST(MaskThreadPool, NoHelpersRunsOnTheCaller) {
  ThreadPool pool(1);
  const auto me = std::this_thread::get_id();
  int count = 0;
  pool.parallelTasks(10, [&](int64_t, int) {
    EXPECT_EQ(std::this_thread::get_id(), me);
    ++count;
  });
  EXPECT_EQ(count, 10);
  pool.parallelTasks(0, [&](int64_t, int) { ADD_FAILURE() << "n = 0 ran something"; });
}

}  // namespace
}  // namespace garden::tulip
