// Sampling: greedy ties, determinism of the counter-based stream (same seed and counter → same
// draw, whatever else was drawn before), top-k / top-p masks, frequencies vs the filtered
// distribution, parameter validation, and the CPU op's use of per-row counters.

#include "services/rose/ops/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <span>
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

// [TAG_SAMPLER_NINF_TAIL] [TAG_SAMPLER_RADIX] The distribution (ids, probabilities bit for bit)
// and the draws equal those of sorting every candidate with std::sort, the procedure before the
// −inf tail and the radix sort: a reference copy of it here, on logits with masked (−inf), NaN,
// ±0 and repeated values, a 201,088-token vocabulary unmasked and 97 % masked (a grammar's mask:
// both on the radix path) and small ones (std::sort), over temperatures, top-k (small: the
// partial sort; below, at and above the unmasked count), top-p and min-p.
std::vector<std::pair<int32_t, double>> fullSortDistribution(std::span<const float> logits,
                                                             const SamplingParams& p) {
  const size_t v = logits.size();
  const float inv_t = 1.f / p.temperature;
  std::vector<std::pair<float, int32_t>> cand(v);
  for (size_t i = 0; i < v; ++i) {
    const float z =
        std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i] * inv_t;
    cand[i] = {z, static_cast<int32_t>(i)};
  }
  auto order = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::sort(cand.begin(), cand.end(), order);
  size_t keep = v;
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < v) keep = static_cast<size_t>(p.top_k);
  if (p.min_p > 0.f && std::isfinite(cand[0].first)) {
    const double cut = static_cast<double>(cand[0].first) + std::log(static_cast<double>(p.min_p));
    size_t n = 1;
    while (n < keep && static_cast<double>(cand[n].first) >= cut) ++n;
    keep = n;
  }
  std::vector<std::pair<int32_t, double>> dist;
  const double mx = cand[0].first;
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    const double z = cand[i].first;
    double e;
    if (std::isinf(mx)) {
      e = mx > 0 ? (z == mx ? 1.0 : 0.0) : (i == 0 ? 1.0 : 0.0);
    } else {
      e = std::exp(z - mx);
    }
    dist.emplace_back(cand[i].second, e);
    sum += e;
  }
  for (auto& d : dist) d.second /= sum;
  if (p.top_p < 1.f) {
    double mass = 0.0;
    size_t n = 0;
    while (n < dist.size()) {
      mass += dist[n].second;
      ++n;
      if (mass >= static_cast<double>(p.top_p)) break;
    }
    dist.resize(n);
    for (auto& d : dist) d.second /= mass;
  }
  return dist;
}

TEST(Sampler, MaskedTailGivesTheFullSortsDistribution) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 2.f);
  struct Shape {
    size_t v;
    double masked;
  };
  for (const Shape sh : {Shape{201088, 0.0}, Shape{201088, 0.97}, Shape{1000, 0.5}, Shape{300, 0.0},
                         Shape{64, 1.0}}) {
    std::vector<float> l(sh.v);
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    size_t unmasked = 0;
    for (size_t i = 0; i < sh.v; ++i) {
      const double r = u01(rng);
      if (r < sh.masked) {
        l[i] = -INFINITY;
      } else {
        l[i] = std::round(nd(rng) * 8.f) / 8.f;  // repeated values: ties broken by id
        ++unmasked;
      }
    }
    if (sh.v > 10 && sh.masked < 1.0) {  // a few special values among the unmasked
      l[3] = NAN;
      l[5] = -0.f;  // before +0 in id order: equal values, so id 5 draws first
      l[6] = 0.f;
      l[sh.v - 1] = std::numeric_limits<float>::lowest();
    }
    const bool big = sh.v > 100000;  // fewer combinations where one reference sort is ~30 ms
    const std::vector<float> temps = big ? std::vector<float>{0.7f} : std::vector<float>{1.f, 0.7f, 1.3f};
    std::vector<int32_t> ks = {0, 5, static_cast<int32_t>(unmasked) + 3};
    if (!big) {
      ks.push_back(static_cast<int32_t>(unmasked) - 1);
      ks.push_back(static_cast<int32_t>(unmasked));
    }
    for (const float t : temps) {
      for (const int32_t k : ks) {
        for (const float top_p : {1.f, 0.9f}) {
          for (const float min_p : {0.f, 0.05f}) {
            SamplingParams p = params(t, top_p, std::max(0, k), 11);
            p.min_p = min_p;
            SCOPED_TRACE("v=" + std::to_string(sh.v) + " t=" + std::to_string(t) + " k=" +
                         std::to_string(k) + " top_p=" + std::to_string(top_p) + " min_p=" +
                         std::to_string(min_p));
            Sampler s;
            const auto got = s.distribution(l, p);
            const auto want = fullSortDistribution(l, p);
            ASSERT_EQ(got.size(), want.size());
            for (size_t i = 0; i < got.size(); ++i) {
              ASSERT_EQ(got[i].first, want[i].first) << i;
              ASSERT_EQ(std::memcmp(&got[i].second, &want[i].second, sizeof(double)), 0) << i;
            }
            for (uint64_t c = 0; c < (big ? 2u : 4u); ++c) {
              const double u = uniformFromCounter(p.seed, c);
              double cum = 0.0;
              int32_t tok = want.back().first;
              for (const auto& [id, prob] : want) {
                cum += prob;
                if (u < cum) {
                  tok = id;
                  break;
                }
              }
              EXPECT_EQ(s.sample(l, p, c), tok) << c;
            }
          }
        }
      }
    }
  }
  // Also with a +inf logit (it takes the mass) and all −inf (the first id).
  std::vector<float> l = {1.f, -INFINITY, INFINITY, 2.f, -INFINITY};
  Sampler s;
  EXPECT_EQ(s.distribution(l, params(1.f, 1.f, 0, 1)), fullSortDistribution(l, params(1.f, 1.f, 0, 1)));
  std::vector<float> all(5, -INFINITY);
  EXPECT_EQ(s.distribution(all, params(1.f, 1.f, 0, 1)), fullSortDistribution(all, params(1.f, 1.f, 0, 1)));
  EXPECT_EQ(s.sample(all, params(1.f, 1.f, 0, 1), 3), 0);
}

}  // namespace
}  // namespace garden::rose
