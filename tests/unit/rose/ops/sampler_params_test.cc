// The OpenAI / vLLM sampling parameters of the host sampler ([TAG_SAMPLER_ORDER]), each against
// a straightforward reference computed here: logprobs == a float64 log-softmax of the raw logits;
// logit_bias and the penalties change exactly the logits of the tokens seen, by the formula;
// -100 bans a token and +100 forces it; min_p keeps exactly the tokens with p >= min_p * p_max;
// the sampler-state slot counts what it draws; the draw depends on (seed, counter, state) only,
// not on the batch around it (through the CPU LlmOps); the token mask of structured outputs comes
// after bias and penalties, logprobs stay raw; and parameter validation names the field.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "services/rose/ops/llm_ops.h"
#include "services/rose/ops/sampler.h"

namespace garden::rose {
namespace {

std::vector<float> randomLogits(size_t v, uint32_t seed, float scale = 4.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> x(v);
  for (float& f : x) f = d(rng);
  return x;
}

// log_softmax in float64 (the reference).
std::vector<double> logSoftmax(const std::vector<float>& x) {
  double mx = -INFINITY;
  for (float f : x) mx = std::max(mx, static_cast<double>(f));
  double sum = 0;
  for (float f : x) sum += std::exp(static_cast<double>(f) - mx);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<double>(x[i]) - mx - std::log(sum);
  return out;
}

SamplingParams sp(float t, uint64_t seed) {
  SamplingParams p;
  p.temperature = t;
  p.seed = seed;
  return p;
}

TEST(SamplerParams, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  for (uint32_t trial = 0; trial < 20; ++trial) {
    const std::vector<float> x = randomLogits(997, 100 + trial);
    const std::vector<double> ref = logSoftmax(x);
    // The reference top 7: value descending, lower id first on ties.
    std::vector<int32_t> order(x.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
    SamplingParams p = sp(0.7f + 0.05f * static_cast<float>(trial), trial);
    p.logprobs = 7;
    // A slot with a bias and penalties: logprobs must still be of the RAW logits.
    p.presence_penalty = 1.f;
    p.repetition_penalty = 1.7f;
    p.state_slot = 0;
    SamplerSlot slot;
    std::vector<int32_t> prompt = {order[0], order[3]};
    std::vector<LogitBias> bias = {{order[1], -30.f}, {5, 12.f}};
    slot.reset(prompt, {}, bias);
    Sampler s;
    llm::LlmTokenLogprobs lp;
    const int32_t tok = s.sample(x, p, 1000 + trial, &slot, &lp);
    ASSERT_GE(tok, 0);
    EXPECT_NEAR(lp.logprob, ref[static_cast<size_t>(tok)], 1e-5) << trial;
    ASSERT_EQ(lp.num_top, 7);
    for (int32_t j = 0; j < 7; ++j) {
      EXPECT_EQ(lp.top_ids[j], order[static_cast<size_t>(j)]) << trial << " " << j;
      EXPECT_NEAR(lp.top_logprobs[j], ref[static_cast<size_t>(order[static_cast<size_t>(j)])], 1e-5);
    }
  }
}

TEST(SamplerParams, SampledLogprobReportedEvenOutsideTheTopList) {
  std::vector<float> x = randomLogits(300, 7);
  const std::vector<double> ref = logSoftmax(x);
  const int32_t low = static_cast<int32_t>(std::min_element(x.begin(), x.end()) - x.begin());
  SamplingParams p = sp(0.f, 1);  // greedy
  p.logprobs = 2;
  p.state_slot = 0;
  SamplerSlot slot;
  std::vector<LogitBias> bias = {{low, 100.f}};
  slot.reset({}, {}, bias);
  Sampler s;
  llm::LlmTokenLogprobs lp;
  ASSERT_EQ(s.sample(x, p, 3, &slot, &lp), low);  // +100 forces the least likely token
  EXPECT_NEAR(lp.logprob, ref[static_cast<size_t>(low)], 1e-5);
  ASSERT_EQ(lp.num_top, 2);
  EXPECT_NE(lp.top_ids[0], low);
  EXPECT_NE(lp.top_ids[1], low);
  // logprobs 0: only the sampled token's.
  p.logprobs = 0;
  ASSERT_EQ(s.sample(x, p, 4, &slot, &lp), low);
  EXPECT_EQ(lp.num_top, 0);
  EXPECT_NEAR(lp.logprob, ref[static_cast<size_t>(low)], 1e-5);
  // Not asked: num_top -1.
  p.logprobs = -1;
  (void)s.sample(x, p, 5, &slot, &lp);
  EXPECT_EQ(lp.num_top, -1);
}

TEST(SamplerParams, BiasAndPenaltiesChangeExactlyTheTokensSeen) {
  const std::vector<float> x = randomLogits(64, 11);
  const std::vector<int32_t> prompt = {1, 2, 9, 9};
  const std::vector<int32_t> output = {2, 3, 3, 40, 3};
  const std::vector<LogitBias> bias = {{4, 1.5f}, {3, -2.f}, {63, 7.f}};
  SamplingParams p = sp(1.f, 0);
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.3f;
  p.repetition_penalty = 1.3f;
  p.state_slot = 0;
  SamplerSlot slot;
  slot.reset(prompt, output, bias);
  std::vector<float> w = x;
  slot.apply(w, p);
  // The reference, token by token.
  std::map<int32_t, int> count;
  for (int32_t t : output) ++count[t];
  std::set<int32_t> in_prompt(prompt.begin(), prompt.end());
  std::map<int32_t, float> b;
  for (const LogitBias& e : bias) b[e.id] = e.bias;
  for (int32_t t = 0; t < 64; ++t) {
    float want = x[static_cast<size_t>(t)];
    if (b.count(t)) want += b[t];
    const int c = count.count(t) ? count[t] : 0;
    if (in_prompt.count(t) || c > 0) {
      want = want > 0 ? want / 1.3f : want * 1.3f;
      want -= 0.3f * static_cast<float>(c) + (c > 0 ? 0.5f : 0.f);
    }
    EXPECT_FLOAT_EQ(w[static_cast<size_t>(t)], want) << t;
    const bool touched = b.count(t) || in_prompt.count(t) || c > 0;
    if (!touched) {
      EXPECT_EQ(w[static_cast<size_t>(t)], x[static_cast<size_t>(t)]) << t;
    }
  }
  // Repetition alone never touches a token only generated-penalty would: tokens outside prompt
  // and output stay. And the counts are what was loaded.
  EXPECT_EQ(slot.outputCount(3), 3u);
  EXPECT_EQ(slot.outputCount(40), 1u);
  EXPECT_EQ(slot.outputCount(1), 0u);
}

TEST(SamplerParams, GreedyFollowsThePenalizedLogitsAndTheSlotCountsDraws) {
  std::vector<float> x(16, 0.f);
  x[3] = 5.f;
  x[7] = 4.f;
  SamplingParams p = sp(0.f, 0);
  p.frequency_penalty = 0.6f;
  p.state_slot = 0;
  SamplerSlot slot;
  slot.reset({}, {}, {});
  Sampler s;
  // 5 − 0.6·n vs 4: token 3 wins while 0.6·n < 1 (n = 0, 1), then 7 (ties go to the lower id:
  // at n = 2, 3.8 < 4).
  EXPECT_EQ(s.sample(x, p, 0, &slot, nullptr), 3);
  EXPECT_EQ(s.sample(x, p, 1, &slot, nullptr), 3);
  EXPECT_EQ(s.sample(x, p, 2, &slot, nullptr), 7);
  EXPECT_EQ(slot.outputCount(3), 2u);
  EXPECT_EQ(slot.outputCount(7), 1u);
  // Presence: once seen, a flat penalty.
  SamplingParams q = sp(0.f, 0);
  q.presence_penalty = 1.5f;
  q.state_slot = 0;
  const std::vector<int32_t> three = {3};
  slot.reset({}, three, {});
  EXPECT_EQ(s.sample(x, q, 3, &slot, nullptr), 7);  // 5 − 1.5 < 4
  // Repetition over the prompt: 5 / 1.3 = 3.85 < 4.
  SamplingParams r = sp(0.f, 0);
  r.repetition_penalty = 1.3f;
  r.state_slot = 0;
  std::vector<int32_t> prompt = {3};
  slot.reset(prompt, {}, {});
  EXPECT_EQ(s.sample(x, r, 4, &slot, nullptr), 7);
  r.repetition_penalty = 1.2f;  // 4.17 > 4
  slot.reset(prompt, {}, {});
  EXPECT_EQ(s.sample(x, r, 5, &slot, nullptr), 3);
}

TEST(SamplerParams, LogitBiasMinus100BansPlus100Forces) {
  const std::vector<float> x = randomLogits(50, 3, 2.f);
  const int32_t best = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  const int32_t worst = static_cast<int32_t>(std::min_element(x.begin(), x.end()) - x.begin());
  Sampler s;
  SamplingParams p = sp(1.f, 77);
  p.state_slot = 0;
  SamplerSlot ban;
  std::vector<LogitBias> b1 = {{best, -100.f}};
  ban.reset({}, {}, b1);
  std::set<int32_t> seen;
  for (uint64_t c = 0; c < 2000; ++c) seen.insert(s.sample(x, p, c, &ban, nullptr));
  EXPECT_EQ(seen.count(best), 0u);
  EXPECT_GT(seen.size(), 5u);  // still a real draw over the others
  // Without the bias the best token does come up.
  std::set<int32_t> plain;
  for (uint64_t c = 0; c < 2000; ++c) plain.insert(s.sample(x, p, c));
  EXPECT_EQ(plain.count(best), 1u);
  SamplerSlot force;
  std::vector<LogitBias> b2 = {{worst, 100.f}};
  force.reset({}, {}, b2);
  for (uint64_t c = 0; c < 500; ++c) ASSERT_EQ(s.sample(x, p, c, &force, nullptr), worst) << c;
}

TEST(SamplerParams, MinPKeepsExactlyTheTokensAboveTheCut) {
  for (uint32_t trial = 0; trial < 10; ++trial) {
    const std::vector<float> x = randomLogits(200, 50 + trial, 2.f);
    const float t = 0.9f, min_p = 0.05f + 0.03f * static_cast<float>(trial);
    SamplingParams p = sp(t, 1);
    p.min_p = min_p;
    // Reference: p_i ∝ exp(x_i / T); keep p_i >= min_p · p_max; renormalize.
    double mx = -INFINITY;
    for (float f : x) mx = std::max(mx, static_cast<double>(f / t));
    std::map<int32_t, double> keep;
    double sum = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double e = std::exp(static_cast<double>(x[i] / t) - mx);  // p_i / p_max
      if (e >= min_p) {
        keep[static_cast<int32_t>(i)] = e;
        sum += e;
      }
    }
    Sampler s;
    const auto& d = s.distribution(x, p);
    ASSERT_EQ(d.size(), keep.size()) << trial;
    for (const auto& [id, prob] : d) {
      ASSERT_TRUE(keep.count(id)) << trial << " " << id;
      EXPECT_NEAR(prob, keep[id] / sum, 2e-6);  // z = x · (1/T) in float
    }
    // And draws never leave the kept set.
    for (uint64_t c = 0; c < 300; ++c) ASSERT_TRUE(keep.count(s.sample(x, p, c))) << c;
  }
}

TEST(SamplerParams, SeededDrawsIgnoreTheBatchAroundThem) {
  auto b = makeBackend("cpu", BackendOptions{});
  ASSERT_TRUE(b.isOk());
  auto ops = makeLlmOps(**b, 1);
  ASSERT_TRUE(ops.isOk());
  LlmOpsLimits lim;
  lim.max_seqs = 4;
  ASSERT_TRUE((*ops)->reserve(lim).isOk());
  ASSERT_TRUE((*ops)->supportsSamplerState());
  const int64_t v = 120;
  std::vector<float> logits = randomLogits(static_cast<size_t>(3 * v), 9, 1.5f);
  auto lt = (*b)->allocateTensor(DType::kF32, {3, v});
  ASSERT_TRUE((*b)->uploadConvert(lt->view, {logits.data(), DType::kF32, 3 * v}).isOk());
  auto ids = (*b)->allocateTensor(DType::kI32, {3});
  auto lps = (*b)->allocateTensor(DType::kU8, {3 * static_cast<int64_t>(sizeof(llm::LlmTokenLogprobs))});
  // The sequence under test: seed 1234, penalties, logprobs, slot 2 in batch A, slot 0 in B.
  auto target = [](int32_t slot) {
    SamplingParams p;
    p.temperature = 1.1f;
    p.top_p = 0.95f;
    p.min_p = 0.01f;
    p.seed = 1234;
    p.frequency_penalty = 0.4f;
    p.repetition_penalty = 1.1f;
    p.logprobs = 3;
    p.state_slot = slot;
    return p;
  };
  const std::vector<int32_t> prompt = {5, 6, 7};
  std::vector<int32_t> a_tokens, b_tokens;
  std::vector<float> a_lps, b_lps;
  for (int run = 0; run < 2; ++run) {
    const int32_t my_slot = run == 0 ? 2 : 0;
    std::vector<SamplerStateReset> resets(1);
    resets[0].slot = my_slot;
    resets[0].prompt = prompt;
    (*ops)->resetSamplerState(resets);
    for (uint64_t pos = 3; pos < 40; ++pos) {
      std::vector<SampleRow> rows;
      SamplingParams other;
      other.temperature = 0.5f;
      other.seed = pos * 31 + static_cast<uint64_t>(run);
      if (run == 0) {
        rows.push_back({0, pos + 100, other});
        rows.push_back({static_cast<int32_t>(pos % 3), pos, target(my_slot)});
      } else {
        rows.push_back({static_cast<int32_t>(pos % 3), pos, target(my_slot)});
        rows.push_back({2, pos * 7, other});
        rows.push_back({1, pos + 1, other});
      }
      const size_t me = run == 0 ? 1 : 0;
      (*ops)->sample(lt->view, rows, ids->view, lps->view);
      std::vector<int32_t> got(rows.size());
      std::vector<llm::LlmTokenLogprobs> lp(rows.size());
      (*b)->copyToHost(got.data(), ids->view.rowSlice(0, static_cast<int64_t>(rows.size())),
                       4 * rows.size());
      (*b)->copyToHost(lp.data(), lps->view, sizeof(llm::LlmTokenLogprobs) * rows.size());
      ASSERT_TRUE((*b)->synchronize().isOk());
      EXPECT_EQ(lp[me].num_top, 3);
      EXPECT_EQ(lp[1 - me].num_top, -1);  // the other row did not ask
      (run == 0 ? a_tokens : b_tokens).push_back(got[me]);
      (run == 0 ? a_lps : b_lps).push_back(lp[me].logprob);
    }
  }
  EXPECT_EQ(a_tokens, b_tokens);
  EXPECT_EQ(a_lps, b_lps);
  EXPECT_GT(std::set<int32_t>(a_tokens.begin(), a_tokens.end()).size(), 3u);  // not degenerate
}

// Structured outputs with the sampler state [TAG_TOKEN_MASK] [TAG_SAMPLER_ORDER]: the token mask
// applies after logit_bias and the penalties (a +100 bias cannot bring back a forbidden token; a
// penalty can move the choice among the allowed ones) and before temperature / top-k / min_p;
// logprobs stay those of the raw logits (the top list may name forbidden tokens). Through the
// CPU LlmOps over 60 draws, each against a reference built here: raw + bias + penalties by the
// formula (counts kept by the test), forbidden ids -inf, then the plain sampler.
TEST(SamplerParams, MaskAppliesAfterBiasAndPenaltiesLogprobsStayRaw) {
  auto b = makeBackend("cpu", BackendOptions{});
  ASSERT_TRUE(b.isOk());
  auto ops = makeLlmOps(**b, 1);
  ASSERT_TRUE(ops.isOk());
  LlmOpsLimits lim;
  lim.max_seqs = 2;
  ASSERT_TRUE((*ops)->reserve(lim).isOk());
  ASSERT_TRUE((*ops)->supportsTokenMask());
  const int64_t v = 70;  // three mask words, the last partly used
  std::vector<float> x = randomLogits(static_cast<size_t>(v), 21, 1.f);
  const std::vector<int32_t> allowed = {5, 20, 33, 41, 64, 69};
  std::vector<uint32_t> mask(3, 0);
  for (int32_t id : allowed) mask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  x[10] = 9.f;   // forbidden, the raw favourite, and +100 biased below
  x[20] = 6.f;   // allowed favourite, but penalized
  x[33] = 5.5f;  // allowed runner-up, +0.3 bias (5.8 < 6: unpenalized, 20 would win)
  const std::vector<int32_t> prompt = {20, 41};
  const std::vector<int32_t> output = {20, 20};
  const std::vector<LogitBias> bias = {{10, 100.f}, {33, 0.3f}, {64, -100.f}};
  std::map<int32_t, int> count;
  for (int32_t t : output) ++count[t];
  auto reference = [&](const SamplingParams& p) {
    std::vector<float> w = x;
    for (int32_t t = 0; t < v; ++t) {
      float y = w[static_cast<size_t>(t)];
      for (const LogitBias& e : bias) {
        if (e.id == t) y += e.bias;
      }
      const int c = count.count(t) ? count[t] : 0;
      const bool seen = c > 0 || std::find(prompt.begin(), prompt.end(), t) != prompt.end();
      if (seen) {
        y = y > 0 ? y / p.repetition_penalty : y * p.repetition_penalty;
        y -= p.frequency_penalty * static_cast<float>(c) + (c > 0 ? p.presence_penalty : 0.f);
      }
      if (!tokenAllowed(mask.data(), t)) y = -INFINITY;
      w[static_cast<size_t>(t)] = y;
    }
    return w;
  };
  const std::vector<double> raw_lp = logSoftmax(x);
  auto lt = (*b)->allocateTensor(DType::kF32, {1, v});
  ASSERT_TRUE((*b)->uploadConvert(lt->view, {x.data(), DType::kF32, v}).isOk());
  auto ids = (*b)->allocateTensor(DType::kI32, {1});
  auto lps = (*b)->allocateTensor(DType::kU8, {static_cast<int64_t>(sizeof(llm::LlmTokenLogprobs))});
  SamplerStateReset reset;
  reset.slot = 1;
  reset.prompt = prompt;
  reset.output = output;
  reset.bias = bias;
  (*ops)->resetSamplerState(std::span<const SamplerStateReset>(&reset, 1));
  Sampler plain;
  std::set<int32_t> drawn;
  int greedy_moved = 0;
  for (uint64_t c = 0; c < 60; ++c) {
    SamplingParams p = sp(c < 10 ? 0.f : 1.3f, 99);
    p.frequency_penalty = 0.4f;
    p.presence_penalty = 0.3f;
    p.repetition_penalty = 1.2f;
    p.top_k = c % 3 == 0 ? 3 : 0;
    p.min_p = c % 2 == 0 ? 0.05f : 0.f;
    p.logprobs = 3;
    p.state_slot = 1;
    SampleRow row{0, c, p};
    row.mask = mask.data();
    (*ops)->sample(lt->view, std::span<const SampleRow>(&row, 1), ids->view, lps->view);
    int32_t got = -1;
    llm::LlmTokenLogprobs lp;
    (*b)->copyToHost(&got, ids->view, 4);
    (*b)->copyToHost(&lp, lps->view, sizeof(lp));
    ASSERT_TRUE((*b)->synchronize().isOk());
    const std::vector<float> w = reference(p);
    const int32_t want = plain.sample(w, p, c);
    ASSERT_EQ(got, want) << "draw " << c;
    ASSERT_TRUE(tokenAllowed(mask.data(), got)) << got;
    EXPECT_NE(got, 64) << "-100 on an allowed token still bans it";
    if (c < 10) {
      // Greedy: without the mask the +100 token 10 would win; without the penalties token 20.
      std::vector<float> unmasked = w;
      unmasked[10] = x[10] + 100.f;
      EXPECT_EQ(argmaxToken(unmasked), 10);
      if (got != 20) ++greedy_moved;
    }
    // Logprobs of the raw logits: token 10 (forbidden) heads the top list.
    EXPECT_NEAR(lp.logprob, raw_lp[static_cast<size_t>(got)], 1e-5);
    ASSERT_EQ(lp.num_top, 3);
    EXPECT_EQ(lp.top_ids[0], 10);
    EXPECT_EQ(lp.top_ids[1], 20);
    EXPECT_NEAR(lp.top_logprobs[0], raw_lp[10], 1e-5);
    ++count[got];  // the slot counts what it drew; so does the reference
    drawn.insert(got);
  }
  EXPECT_GT(greedy_moved, 0) << "the penalties never moved the masked argmax off token 20";
  EXPECT_GE(drawn.size(), 3u) << "the draws are stuck on too few ids";
}

TEST(SamplerParams, ValidationNamesTheField) {
  auto msg = [](auto set) {
    SamplingParams p;
    p.temperature = 1.f;
    set(p);
    Status st = validateSamplingParams(p);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    return st.message();
  };
  EXPECT_NE(msg([](SamplingParams& p) { p.min_p = 1.5f; }).find("min_p"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.min_p = NAN; }).find("min_p"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.presence_penalty = 2.5f, p.state_slot = 0; })
                .find("presence_penalty"),
            std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.frequency_penalty = -3.f, p.state_slot = 0; })
                .find("frequency_penalty"),
            std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.repetition_penalty = 0.f; }).find("repetition_penalty"),
            std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.logprobs = 21; }).find("logprobs"), std::string::npos);
  EXPECT_NE(msg([](SamplingParams& p) { p.frequency_penalty = 0.5f; }).find("state_slot"),
            std::string::npos);
  SamplingParams ok;
  ok.presence_penalty = -2.f;
  ok.state_slot = 3;
  ok.logprobs = 20;
  ok.min_p = 1.f;
  EXPECT_TRUE(validateSamplingParams(ok).isOk());
}

}  // namespace
}  // namespace garden::rose
