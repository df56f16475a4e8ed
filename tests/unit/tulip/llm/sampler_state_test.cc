// The sampling parameters on their way through tulip [TAG_LLM_SAMPLER_STATE]: validateGenerate
// names each out-of-range field; the step scheduler copies them into every LlmStepSeq, gives a
// request with penalties / logit_bias a state slot, sends the slot's reload (prompt, generated
// tokens, bias words) once per admission — again after a retraction or a preemption, with the
// generated tokens then — frees the slot when the request ends, and hands the worker's logprobs
// to the events of the requests that asked; a structured-outputs request carries its sampler
// state and its token mask side by side, and is refused alone by a worker without token masks.
#include <gtest/gtest.h>

#include <cstring>

#include "common/grammar/json_schema.h"
#include "common/shm/llm_batch.h"
#include "services/tulip/llm/step_scheduler.h"
#include "tests/unit/tulip/llm/llm_test_util.h"

namespace garden::tulip {
namespace {

using testing::params;
using testing::range;

shm::ModelFacts llmFacts(uint32_t vocab) {
  shm::ModelFacts f;
  std::strcpy(f.kind, "llm");
  f.kv_num_blocks = 8;
  f.kv_block_size = 4;
  f.max_seq_len = 32;
  f.vocab_size = vocab;
  f.llm_caps = shm::kLlmCapSamplerState;
  return f;
}

std::string invalidField(GenerateParams p) {
  Status st = validateGenerate(p, llmFacts(100));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  return st.message();
}

TEST(SamplerParamsTulip, ValidationNamesTheField) {
  auto with = [](auto set) {
    GenerateParams p = params(range(3), 4);
    set(p);
    return p;
  };
  EXPECT_EQ(invalidField(with([](GenerateParams& p) { p.sampling.min_p = 1.5f; })).find("sampling.min_p"), 0u);
  EXPECT_EQ(invalidField(with([](GenerateParams& p) { p.sampling.presence_penalty = 2.5f; }))
                .find("sampling.presence_penalty"),
            0u);
  EXPECT_EQ(invalidField(with([](GenerateParams& p) { p.sampling.frequency_penalty = -2.1f; }))
                .find("sampling.frequency_penalty"),
            0u);
  EXPECT_EQ(invalidField(with([](GenerateParams& p) { p.sampling.repetition_penalty = -1.f; }))
                .find("sampling.repetition_penalty"),
            0u);
  EXPECT_EQ(invalidField(with([](GenerateParams& p) { p.sampling.logprobs = 21; }))
                .find("sampling.top_logprobs"),
            0u);
  EXPECT_EQ(invalidField(with([](GenerateParams& p) { p.logit_bias = {{100, 1.f}}; }))
                .find("sampling.logit_bias[0]"),
            0u);
  EXPECT_EQ(invalidField(with([](GenerateParams& p) { p.logit_bias = {{3, 1.f}, {4, 101.f}}; }))
                .find("sampling.logit_bias[1]"),
            0u);
  GenerateParams ok = params(range(3), 4);
  ok.sampling.repetition_penalty = 0.f;  // proto3's unset
  ok.sampling.state_slot = 5;            // not the caller's to set
  ok.logit_bias = {{99, -100.f}};
  ASSERT_TRUE(validateGenerate(ok, llmFacts(100)).isOk());
  EXPECT_EQ(ok.sampling.repetition_penalty, 1.f);
  EXPECT_EQ(ok.sampling.state_slot, -1);
}

int32_t bits(float f) {
  int32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

LlmWorkerLimits limits() {
  LlmWorkerLimits l;
  l.kv_num_blocks = 16;
  l.kv_block_size = 4;
  l.context_len = 64;
  l.eos_ids = {2};
  return l;
}

TEST(SamplerParamsTulip, ParamsCarriedStateReloadedOncePerAdmission) {
  LlmSchedulerOptions o;
  o.max_num_seqs = 2;
  LlmStepScheduler s(o);
  ASSERT_TRUE(s.configure(limits()));
  GenerateParams a = params({10, 11, 12}, 10);
  a.sampling.temperature = 0.8f;
  a.sampling.presence_penalty = 0.5f;
  a.sampling.frequency_penalty = 0.25f;
  a.sampling.repetition_penalty = 1.2f;
  a.sampling.min_p = 0.1f;
  a.sampling.logprobs = 3;
  a.sampling.seed = 42;
  a.logit_bias = {{5, -100.f}, {7, 2.5f}};
  GenerateParams b = params({20, 21}, 10);
  b.sampling.logprobs = -1;
  auto ida = s.add(a, 1);
  auto idb = s.add(b, 1);
  ASSERT_TRUE(ida.isOk() && idb.isOk());

  StepPlan p1 = s.schedule(2);
  ASSERT_EQ(p1.seqs.size(), 2u);
  const llm::LlmStepSeq& da = p1.seqs[0];
  const llm::LlmStepSeq& db = p1.seqs[1];
  EXPECT_EQ(da.sampling.temperature, 0.8f);
  EXPECT_EQ(da.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(da.sampling.frequency_penalty, 0.25f);
  EXPECT_EQ(da.sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(da.sampling.min_p, 0.1f);
  EXPECT_EQ(da.sampling.logprobs, 3);
  EXPECT_EQ(da.sampling.seed, 42u);
  ASSERT_GE(da.sampling.state_slot, 0);
  const int32_t slot_a = da.sampling.state_slot;
  EXPECT_EQ(da.state_offset, 0);
  EXPECT_EQ(da.state_prompt, 3);
  EXPECT_EQ(da.state_output, 0);
  EXPECT_EQ(da.state_bias, 2);
  EXPECT_EQ(p1.state, (std::vector<int32_t>{10, 11, 12, 5, bits(-100.f), 7, bits(2.5f)}));
  EXPECT_EQ(db.sampling.state_slot, -1);  // no penalties, no bias: no state
  EXPECT_EQ(db.state_offset, -1);
  EXPECT_EQ(db.sampling.logprobs, -1);

  llm::LlmTokenLogprobs lp;
  lp.logprob = -0.5f;
  lp.num_top = 3;
  lp.top_ids[0] = 30;
  lp.top_logprobs[0] = -0.25f;
  llm::LlmTokenLogprobs lpb;  // the other row: not asked
  const std::vector<int32_t> ids = {30, 40};
  const std::vector<llm::LlmTokenLogprobs> lps = {lp, lpb};
  s.update(p1, ids, 3, lps);
  std::vector<SeqEvent> ev = s.takeEvents();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].id, *ida);
  EXPECT_TRUE(ev[0].event.has_logprobs);
  EXPECT_EQ(ev[0].event.logprobs.logprob, -0.5f);
  EXPECT_EQ(ev[0].event.logprobs.top_ids[0], 30);
  EXPECT_FALSE(ev[1].event.has_logprobs);

  // The next steps: the same slot, no reload.
  StepPlan p2 = s.schedule(4);
  ASSERT_EQ(p2.seqs.size(), 2u);
  EXPECT_EQ(p2.seqs[0].sampling.state_slot, slot_a);
  EXPECT_EQ(p2.seqs[0].state_offset, -1);
  EXPECT_TRUE(p2.state.empty());
  // A retracted plan carried no reload: the next one carries none either.
  s.retract(p2);
  StepPlan p2b = s.schedule(5);
  EXPECT_EQ(p2b.seqs[0].state_offset, -1);
  s.update(p2b, std::vector<int32_t>{31, 41}, 6, lps);
  (void)s.takeEvents();

  // A ends (cancel): its slot goes to the next request that needs one, with a reload.
  s.cancel(*ida, 7);
  (void)s.takeEvents();
  GenerateParams c = params({50, 51}, 5);
  c.sampling.repetition_penalty = 1.5f;
  auto idc = s.add(c, 8);
  ASSERT_TRUE(idc.isOk());
  StepPlan p3 = s.schedule(9);
  const llm::LlmStepSeq* dc = nullptr;
  for (size_t i = 0; i < p3.seqs.size(); ++i)
    if (p3.refs[i].id == *idc) dc = &p3.seqs[i];
  ASSERT_NE(dc, nullptr);
  EXPECT_EQ(dc->sampling.state_slot, slot_a);
  EXPECT_GE(dc->state_offset, 0);
  EXPECT_EQ(dc->state_prompt, 2);
  EXPECT_EQ(dc->state_bias, 0);
  EXPECT_EQ(std::vector<int32_t>(p3.state.begin() + dc->state_offset,
                                 p3.state.begin() + dc->state_offset + 2),
            (std::vector<int32_t>{50, 51}));
  // Retracting the plan that carried C's reload: the next plan carries it again.
  s.retract(p3);
  StepPlan p3b = s.schedule(10);
  bool reloaded = false;
  for (size_t i = 0; i < p3b.seqs.size(); ++i)
    if (p3b.refs[i].id == *idc) reloaded = p3b.seqs[i].state_offset >= 0;
  EXPECT_TRUE(reloaded);
}

// Structured outputs combined with the sampler state [TAG_TOKEN_MASK] [TAG_LLM_SAMPLER_STATE]:
// one request with response_format, logit_bias, a penalty and logprobs gets a state slot with
// one reload AND a token mask in every step that samples it (the mask follows the grammar, the
// reload is not repeated); a worker whose facts lack kLlmCapTokenMask refuses it naming
// response_format (and only when it is constrained).
TEST(SamplerParamsTulip, ConstrainedRequestCarriesStateAndMask) {
  constexpr uint32_t kV = 64;
  // eos (2) is allowed only at the end.
  auto compiled = testing::compileSchema(R"({"enum":["ab","ac"]})",
                                         testing::testVocab(testing::enumTokens(kV), {2}));
  ASSERT_TRUE(compiled.isOk());

  GenerateParams a = params({10, 11, 12}, 10);
  a.grammar = *compiled;
  a.constraint.end_tokens = {2};
  a.sampling.frequency_penalty = 0.5f;
  a.sampling.logprobs = 2;
  a.logit_bias = {{31, 5.f}};
  shm::ModelFacts no_masks = llmFacts(kV);
  Status refused = validateGenerate(a, no_masks);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message().find("response_format"), 0u) << refused.message();
  GenerateParams plain = params({10, 11, 12}, 10);
  plain.logit_bias = {{31, 5.f}};
  EXPECT_TRUE(validateGenerate(plain, no_masks).isOk());
  shm::ModelFacts with_masks = no_masks;
  with_masks.llm_caps |= shm::kLlmCapTokenMask;
  ASSERT_TRUE(validateGenerate(a, with_masks).isOk());

  LlmSchedulerOptions o;
  o.max_num_seqs = 2;
  LlmStepScheduler s(o);
  LlmWorkerLimits l = limits();
  l.vocab = kV;
  ASSERT_TRUE(s.configure(l));
  auto id = s.add(a, 1);
  ASSERT_TRUE(id.isOk());
  const size_t words = shm::llmMaskWords(kV);
  auto allowed = [&](const StepPlan& p) {
    std::vector<int32_t> ids;
    const int32_t k = p.seqs[0].mask_index;
    EXPECT_GT(k, 0);
    if (k <= 0) return ids;
    for (uint32_t t = 0; t < kV; ++t) {
      if ((p.masks[static_cast<size_t>(k - 1) * words + t / 32] >> (t % 32)) & 1u) {
        ids.push_back(static_cast<int32_t>(t));
      }
    }
    return ids;
  };
  StepPlan p1 = s.schedule(2);
  ASSERT_EQ(p1.seqs.size(), 1u);
  const llm::LlmStepSeq& d1 = p1.seqs[0];
  EXPECT_GE(d1.sampling.state_slot, 0);
  EXPECT_EQ(d1.sampling.frequency_penalty, 0.5f);
  EXPECT_EQ(d1.sampling.logprobs, 2);
  EXPECT_EQ(d1.state_offset, 0);
  EXPECT_EQ(d1.state_prompt, 3);
  EXPECT_EQ(d1.state_bias, 1);
  EXPECT_EQ(p1.state, (std::vector<int32_t>{10, 11, 12, 31, bits(5.f)}));
  EXPECT_EQ(p1.masks.size(), words);
  EXPECT_EQ(allowed(p1), (std::vector<int32_t>{30, 34}));
  s.update(p1, std::vector<int32_t>{34}, 3);  // "\"a"
  (void)s.takeEvents();
  StepPlan p2 = s.schedule(4);
  ASSERT_EQ(p2.seqs.size(), 1u);
  EXPECT_EQ(p2.seqs[0].sampling.state_slot, d1.sampling.state_slot);
  EXPECT_EQ(p2.seqs[0].state_offset, -1);  // no second reload
  EXPECT_TRUE(p2.state.empty());
  EXPECT_EQ(allowed(p2), (std::vector<int32_t>{32, 33}));
}

TEST(SamplerParamsTulip, PreemptedRequestReloadsWithItsGeneratedTokens) {
  // 3 blocks of 4: A (admitted first) and B both grow until B is preempted by recompute; B's
  // re-admission reloads its state with the tokens it had generated.
  LlmSchedulerOptions o;
  o.max_num_seqs = 2;
  o.enable_prefix_caching = false;
  LlmStepScheduler s(o);
  LlmWorkerLimits l = limits();
  l.kv_num_blocks = 3;
  ASSERT_TRUE(s.configure(l));
  GenerateParams a = params({10, 11, 12}, 4);  // ends soon after B's preemption
  GenerateParams b = params({20, 21, 22}, 20);
  b.sampling.frequency_penalty = 1.f;
  auto ida = s.add(a, 1);
  auto idb = s.add(b, 1);
  ASSERT_TRUE(ida.isOk() && idb.isOk());
  std::vector<int32_t> b_generated;
  bool reload_seen = false;
  for (int step = 0; step < 12 && !reload_seen; ++step) {
    StepPlan p = s.schedule(2 + step);
    if (p.empty()) continue;
    std::vector<int32_t> ids;
    for (size_t i = 0; i < p.seqs.size(); ++i) {
      const llm::LlmStepSeq& d = p.seqs[i];
      if (p.refs[i].id == *idb && d.state_offset >= 0 && !b_generated.empty()) {
        reload_seen = true;
        EXPECT_EQ(d.state_prompt, 3);
        EXPECT_EQ(d.state_output, static_cast<int32_t>(b_generated.size()));
        EXPECT_EQ(std::vector<int32_t>(p.state.begin() + d.state_offset + 3,
                                       p.state.begin() + d.state_offset + 3 + d.state_output),
                  b_generated);
      }
      if (d.sample) ids.push_back(100 + step * 2 + static_cast<int32_t>(i));
    }
    s.update(p, ids, 3 + step);
    for (const SeqEvent& e : s.takeEvents())
      if (e.id == *idb && e.event.token >= 0) b_generated.push_back(e.event.token);
  }
  EXPECT_TRUE(reload_seen);
  EXPECT_GE(s.stats().preemptions, 1u);
}

}  // namespace
}  // namespace garden::tulip
