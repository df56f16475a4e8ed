// Sampling: greedy ties, determinism of the counter-based stream (same seed and counter → same
// draw, whatever else was drawn before), top-k / top-p masks, frequencies vs the filtered
// distribution, parameter validation, and the CPU op's use of per-row counters.

#include "services/rose/ops/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "services/rose/ops/llm_ops.h"

namespace garden::rose {
namespace {

SamplingParams params(float t, float top_p, int32_t top_k, uint64_t seed) {
  SamplingParams p;
  p.temperature = t;
  p.top_p = top_p;
  p.top_k = top_k;
  p.seed = seed;
  return p;
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  Sampler s;
  std::vector<float> l = {0.f, 3.f, -1.f, 3.f, NAN};
  EXPECT_EQ(s.sample(l, params(0, 1, 0, 1), 0), 1);
  EXPECT_EQ(argmaxToken(std::vector<float>{NAN, -INFINITY, -5.f}), 2);
}

TEST(Sampler, SameSeedAndCounterSameDraw) {
  std::vector<float> l(50);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i)) * 2.f;
  const SamplingParams p = params(1.0f, 1.f, 0, 1234);
  Sampler a, b;
  std::vector<int32_t> first;
  for (uint64_t c = 0; c < 64; ++c) first.push_back(a.sample(l, p, c));
  // b draws in another order, with other requests in between: same answers per counter.
  for (uint64_t c = 64; c-- > 0;) {
    (void)b.sample(l, params(0.7f, 0.9f, 5, 99), c * 7);
    EXPECT_EQ(b.sample(l, p, c), first[static_cast<size_t>(c)]) << c;
  }
  // Another seed gives another sequence of draws.
  std::vector<int32_t> other;
  for (uint64_t c = 0; c < 64; ++c) other.push_back(a.sample(l, params(1.0f, 1.f, 0, 1235), c));
  EXPECT_NE(first, other);
  EXPECT_GT(std::set<int32_t>(first.begin(), first.end()).size(), 5u);  // really random
  EXPECT_EQ(mixCounter(1, 2), mixCounter(1, 2));
  EXPECT_NE(mixCounter(1, 2), mixCounter(2, 1));
  const double u = uniformFromCounter(5, 6);
  EXPECT_GE(u, 0.0);
  EXPECT_LT(u, 1.0);
}

TEST(Sampler, TopKMask) {
  std::vector<float> l = {1.0f, 5.0f, 4.9f, 0.5f, 4.8f, -2.f};
  Sampler s;
  std::set<int32_t> seen;
  for (uint64_t c = 0; c < 2000; ++c) seen.insert(s.sample(l, params(5.f, 1.f, 3, 7), c));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 2, 4}));  // high temperature: all three kept appear
  const auto& d = s.distribution(l, params(1.f, 1.f, 2, 0));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].first, 1);
  EXPECT_EQ(d[1].first, 2);
  EXPECT_NEAR(d[0].second, 1.0 / (1.0 + std::exp(-0.1)), 1e-6);
}

TEST(Sampler, TopPMask) {
  // Probabilities at T=1: softmax(log(0.5), log(0.3), log(0.15), log(0.05)).
  std::vector<float> l = {std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  Sampler s;
  auto d = s.distribution(l, params(1.f, 0.79f, 0, 0));  // 0.5 + 0.3 reaches 0.79
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].first, 1);
  EXPECT_EQ(d[1].first, 3);
  EXPECT_NEAR(d[0].second, 0.5 / 0.8, 1e-6);
  EXPECT_NEAR(d[1].second, 0.3 / 0.8, 1e-6);
  d = s.distribution(l, params(1.f, 0.81f, 0, 0));  // needs the third
  EXPECT_EQ(d.size(), 3u);
  d = s.distribution(l, params(1.f, 0.01f, 0, 0));  // at least one token
  EXPECT_EQ(d.size(), 1u);
  std::set<int32_t> seen;
  for (uint64_t c = 0; c < 1000; ++c) seen.insert(s.sample(l, params(1.f, 0.79f, 0, 3), c));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3}));
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  std::vector<float> l = {0.f, 1.f, 2.f, -1.f};
  const SamplingParams p = params(0.8f, 1.f, 0, 42);
  Sampler s;
  const auto d = s.distribution(l, p);
  std::map<int32_t, double> want;
  for (auto [id, pr] : d) want[id] = pr;
  std::map<int32_t, int> got;
  const int n = 20000;
  for (uint64_t c = 0; c < n; ++c) got[s.sample(l, p, c)]++;
  for (auto [id, pr] : want) {
    const double sd = std::sqrt(pr * (1 - pr) / n);
    EXPECT_NEAR(got[id] / static_cast<double>(n), pr, 5 * sd + 1e-3) << id;
  }
}

TEST(Sampler, Validation) {
  EXPECT_TRUE(validateSamplingParams(params(0, 1, 0, 0)).isOk());
  auto e = validateSamplingParams(params(-1, 1, 0, 0));
  EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.message().find("temperature"), std::string::npos);
  EXPECT_NE(validateSamplingParams(params(1, 0, 0, 0)).message().find("top_p"), std::string::npos);
  EXPECT_NE(validateSamplingParams(params(1, 1.5f, 0, 0)).message().find("top_p"),
            std::string::npos);
  EXPECT_NE(validateSamplingParams(params(1, 1, -2, 0)).message().find("top_k"), std::string::npos);
  EXPECT_FALSE(validateSamplingParams(params(NAN, 1, 0, 0)).isOk());
}

TEST(Sampler, CpuOpUsesPerRowCounters) {
  auto b = makeBackend("cpu", BackendOptions{});
  ASSERT_TRUE(b.isOk());
  auto ops = makeLlmOps(**b, 1);
  ASSERT_TRUE(ops.isOk());
  std::vector<float> logits(2 * 40);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::cos(static_cast<float>(i) * 0.37f);
  auto lt = (*b)->allocateTensor(DType::kF32, {2, 40});
  ASSERT_TRUE((*b)->uploadConvert(lt->view, {logits.data(), DType::kF32, 80}).isOk());
  auto out = (*b)->allocateTensor(DType::kI32, {3});
  std::vector<SampleRow> rows(3);
  rows[0] = {1, 17, params(1.f, 0.9f, 10, 5)};
  rows[1] = {0, 3, params(0.f, 1.f, 0, 0)};
  rows[2] = {1, 18, params(1.f, 0.9f, 10, 5)};
  (*ops)->sample(lt->view, rows, out->view);
  std::vector<int32_t> got(3);
  (*b)->copyToHost(got.data(), out->view, 12);
  ASSERT_TRUE((*b)->synchronize().isOk());
  Sampler s;
  std::span<const float> r0(logits.data(), 40), r1(logits.data() + 40, 40);
  EXPECT_EQ(got[0], s.sample(r1, rows[0].params, 17));
  EXPECT_EQ(got[1], argmaxToken(r0));
  EXPECT_EQ(got[2], s.sample(r1, rows[2].params, 18));
}

// Structured outputs [TAG_TOKEN_MASK]: a masked row draws only allowed ids, greedy is the argmax
// over them, the draw equals sampling the masked copy, and a row whose allowed logits are all
// -inf gets the lowest allowed id.
TEST(Sampler, CpuOpAppliesTokenBitmasks) {
  auto b = makeBackend("cpu", BackendOptions{});
  ASSERT_TRUE(b.isOk());
  auto ops = makeLlmOps(**b, 1);
  ASSERT_TRUE(ops.isOk());
  const int v = 70;  // three mask words, the last partly used
  std::vector<float> logits(2 * v);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i) * 0.73f) * 4;
  for (int i = 0; i < v; ++i) logits[static_cast<size_t>(v + i)] = -INFINITY;
  auto lt = (*b)->allocateTensor(DType::kF32, {2, v});
  ASSERT_TRUE((*b)->uploadConvert(lt->view, {logits.data(), DType::kF32, 2 * v}).isOk());
  std::vector<uint32_t> mask(3, 0);
  std::vector<int32_t> allowed_ids = {5, 33, 34, 64, 69};
  for (int32_t id : allowed_ids) mask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  const int n = 200;
  std::vector<SampleRow> rows;
  for (int i = 0; i < n; ++i) {
    SampleRow r{0, static_cast<uint64_t>(i), params(i % 4 == 0 ? 0.f : 1.5f, 1.f, 0, 9)};
    r.mask = mask.data();
    rows.push_back(r);
  }
  SampleRow dead{1, 0, params(1.f, 1.f, 0, 1)};
  dead.mask = mask.data();
  rows.push_back(dead);
  auto out = (*b)->allocateTensor(DType::kI32, {n + 1});
  (*ops)->sample(lt->view, rows, out->view);
  std::vector<int32_t> got(static_cast<size_t>(n + 1));
  (*b)->copyToHost(got.data(), out->view, 4 * (n + 1));
  ASSERT_TRUE((*b)->synchronize().isOk());
  std::vector<float> masked(logits.begin(), logits.begin() + v);
  EXPECT_EQ(applyTokenBitmask(masked, mask.data()), 5);
  Sampler s;
  std::set<int32_t> seen;
  for (int i = 0; i < n; ++i) {
    const int32_t id = got[static_cast<size_t>(i)];
    EXPECT_TRUE(tokenAllowed(mask.data(), id)) << id;
    EXPECT_EQ(id, s.sample(masked, rows[static_cast<size_t>(i)].params, static_cast<uint64_t>(i)));
    seen.insert(id);
  }
  EXPECT_GE(seen.size(), 3u);  // the draw is not stuck on one id
  EXPECT_EQ(got[static_cast<size_t>(n)], 5);
}

}  // namespace
}  // namespace garden::rose
