#include "bench/loadgen/workload.h"

#include <gtest/gtest.h>

#include <sstream>

#include "bench/loadgen/stats.h"

namespace garden::bench {
namespace {

// Without --pool, a chat run gives every request its own prompt (count + warm-up, or warm-up +
// 4 x concurrency for --duration runs, at least 32), so no request repeats another's prompt and
// hits the prefix cache; embed and score cycle 32 payloads; an explicit pool is kept.
TEST(Workload, ChatRequestsGetDistinctPromptsByDefault) {
  EXPECT_EQ(requestPool(Mode::kChat, 0, 256, 0, 256), 256);
  EXPECT_EQ(requestPool(Mode::kChat, 0, 3, 0, 1), 32);
  EXPECT_EQ(requestPool(Mode::kChat, 0, 1000, 64, 64), 1064);
  EXPECT_EQ(requestPool(Mode::kChat, 0, 0, 16, 64), 16 + 4 * 64);  // --duration: no count
  EXPECT_EQ(requestPool(Mode::kChat, 8, 256, 0, 256), 8);           // explicit
  EXPECT_EQ(requestPool(Mode::kEmbed, 0, 5000, 50, 16), 32);
  EXPECT_EQ(requestPool(Mode::kScore, 0, 5000, 50, 16), 32);
  EXPECT_EQ(requestPool(Mode::kEmbed, 100, 5000, 50, 16), 100);
}

TEST(Workload, RandomTokensHaveExactLengthRangeAndSeed) {
  for (int32_t len : {0, 1, 17, 97, 4096}) {
    Rng a(7), b(7), c(8);
    auto x = randomTokens(a, len, 10, 2000);
    auto y = randomTokens(b, len, 10, 2000);
    auto z = randomTokens(c, len, 10, 2000);
    ASSERT_EQ(x.size(), static_cast<size_t>(len));
    EXPECT_EQ(x, y);
    if (len > 16) {
      EXPECT_NE(x, z);
    }
    for (int32_t t : x) {
      EXPECT_GE(t, 10);
      EXPECT_LT(t, 2000);
    }
  }
  Rng r(1);
  auto one = randomTokens(r, 50, 5, 6);
  for (int32_t t : one) EXPECT_EQ(t, 5);
}

TEST(Workload, RandomWordsCountAndDeterminism) {
  Rng a(3), b(3);
  std::string s = randomWords(a, 37);
  EXPECT_EQ(s, randomWords(b, 37));
  std::istringstream in(s);
  std::string w;
  int n = 0;
  while (in >> w) ++n;
  EXPECT_EQ(n, 37);
  EXPECT_EQ(s.find("  "), std::string::npos);
  Rng c(3);
  EXPECT_EQ(randomWords(c, 0), "");
}

// A stand-in tokenizer: each word is 1 + (length > 4) tokens, plus one special token.
int32_t fakeTokens(const std::string& text) {
  std::istringstream in(text);
  std::string w;
  int32_t n = 1;
  while (in >> w) n += w.size() > 4 ? 2 : 1;
  return n;
}

TEST(Workload, NextWordCountConvergesOnTheTarget) {
  for (int32_t target : {8, 128, 512, 4096}) {
    Rng seed(target);
    int32_t words = std::max(1, target / 3);  // a poor first guess
    int32_t tokens = 0;
    int probes = 0;
    for (; probes < 12; ++probes) {
      Rng r = seed;
      tokens = fakeTokens(randomWords(r, words));
      if (std::abs(tokens - target) <= std::max(1, target / 100)) break;
      words = nextWordCount(words, tokens, target);
    }
    EXPECT_LE(std::abs(tokens - target), std::max(1, target / 100)) << "target " << target;
    EXPECT_LT(probes, 12);
  }
  EXPECT_EQ(nextWordCount(10, 20, 20), 10);
  EXPECT_EQ(nextWordCount(10, 19, 20), 11);  // at least one word toward the target
  EXPECT_EQ(nextWordCount(10, 21, 20), 9);
  EXPECT_EQ(nextWordCount(1, 50, 2), 1);  // never below one word
}

TEST(Workload, NamesAndParsing) {
  EXPECT_EQ(workloadName(Mode::kEmbed, InputKind::kTokens, 128, 1, 1), "embed_tok128_b1_c1");
  EXPECT_EQ(workloadName(Mode::kScore, InputKind::kTokens, 512, 25, 1), "score_tok512_b25_c1");
  EXPECT_EQ(workloadName(Mode::kEmbed, InputKind::kText, 512, 1, 16), "embed_text512_b1_c16");
  EXPECT_EQ(workloadName(Mode::kChat, InputKind::kText, 512, 1, 64), "chat_text512_c64");
  EXPECT_EQ(*parseMode("score"), Mode::kScore);
  EXPECT_EQ(*parseProtocol("http"), Protocol::kHttp);
  EXPECT_EQ(*parseInputKind("text"), InputKind::kText);
  auto bad = parseMode("embedding");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("--mode"), std::string::npos);
  EXPECT_FALSE(parseProtocol("grpcs").isOk());
  EXPECT_FALSE(parseInputKind("").isOk());
}

TEST(Stats, NearestRankPercentiles) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // unsorted input
  LatencySummary s = summarize(v);
  EXPECT_EQ(s.count, 100u);
  EXPECT_EQ(s.p50, 50);
  EXPECT_EQ(s.p90, 90);
  EXPECT_EQ(s.p99, 99);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 100);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  LatencySummary ten = summarize({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  EXPECT_EQ(ten.p50, 5);
  EXPECT_EQ(ten.p90, 9);
  EXPECT_EQ(ten.p99, 10);
  LatencySummary one = summarize({4.5});
  EXPECT_EQ(one.p50, 4.5);
  EXPECT_EQ(one.p99, 4.5);
  LatencySummary none = summarize({});
  EXPECT_EQ(none.count, 0u);
  EXPECT_EQ(none.p99, 0);
}

TEST(Stats, RecorderMergeKeepsCountsAndBoundsErrorSamples) {
  Recorder a, b;
  a.success(1.0);
  a.items = 3;
  a.failure("UNAVAILABLE", "down");
  for (int i = 0; i < 7; ++i) b.failure("HTTP_429", "busy " + std::to_string(i));
  b.success(2.0);
  b.tokens = 9;
  a.merge(b);
  EXPECT_EQ(a.ok, 2u);
  EXPECT_EQ(a.errors, 8u);
  EXPECT_EQ(a.by_status["OK"], 2u);
  EXPECT_EQ(a.by_status["HTTP_429"], 7u);
  EXPECT_EQ(a.by_status["UNAVAILABLE"], 1u);
  EXPECT_EQ(a.latency_ms.size(), 2u);
  EXPECT_EQ(a.items, 3u);
  EXPECT_EQ(a.tokens, 9u);
  EXPECT_EQ(a.error_samples.size(), 5u);
  EXPECT_EQ(a.error_samples[0], "UNAVAILABLE: down");
}

}  // namespace
}  // namespace garden::bench
