// validateGenerate: a Generate request checked against the worker's facts, apart from scheduling.
// Each bad field is named; a request that passes can always be scheduled (its prompt leaves room
// for one generated token within min(KV capacity, max_seq_len)).
#include "services/tulip/llm/generate_request.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tests/unit/tulip/llm/llm_test_util.h"

namespace garden::tulip {
namespace {

using testing::params;
using testing::range;

shm::ModelFacts llmFacts(uint32_t blocks, uint32_t block_size, uint32_t max_seq_len,
                         uint32_t vocab) {
  shm::ModelFacts f;
  std::strcpy(f.kind, "llm");
  f.kv_num_blocks = blocks;
  f.kv_block_size = block_size;
  f.max_seq_len = max_seq_len;
  f.vocab_size = vocab;
  return f;
}

TEST(GenerateRequest, ContextIsTheSmallerOfKvCapacityAndMaxSeqLen) {
  EXPECT_EQ(llmContextLength(llmFacts(8, 4, 100, 50)), 32u);
  EXPECT_EQ(llmContextLength(llmFacts(8, 4, 20, 50)), 20u);
  EXPECT_EQ(llmContextLength(llmFacts(8, 4, 0, 50)), 32u);  // max_seq_len unknown
}

TEST(GenerateRequest, EachBadFieldIsNamed) {
  const shm::ModelFacts f = llmFacts(8, 4, 20, 50);
  struct Case {
    GenerateParams p;
    StatusCode code;
    std::string needle;
  };
  std::vector<Case> cases;
  cases.push_back({params({}, 1), StatusCode::kInvalidArgument, "prompt_ids: at least one"});
  cases.push_back({params(range(20, 1), 1), StatusCode::kInvalidArgument,
                   "prompt_ids: 20 tokens, but the model's context is 20"});
  cases.push_back({params({1, 2, 50}, 1), StatusCode::kInvalidArgument,
                   "prompt_ids[2]: token id 50 is outside the vocabulary [0, 50)"});
  cases.push_back({params({-1}, 1), StatusCode::kInvalidArgument, "prompt_ids[0]: token id -1"});
  auto stop = params({1}, 1);
  stop.stop_token_ids = {3, 99};
  cases.push_back({stop, StatusCode::kInvalidArgument, "stop_token_ids[1]: token id 99"});
  auto t = params({1}, 1);
  t.sampling.temperature = -0.5f;
  cases.push_back({t, StatusCode::kInvalidArgument, "sampling.temperature"});
  auto nan = params({1}, 1);
  nan.sampling.temperature = std::nanf("");
  cases.push_back({nan, StatusCode::kInvalidArgument, "sampling.temperature"});
  auto tp = params({1}, 1);
  tp.sampling.top_p = 1.01f;
  cases.push_back({tp, StatusCode::kInvalidArgument, "sampling.top_p"});
  auto tpn = params({1}, 1);
  tpn.sampling.top_p = -0.1f;
  cases.push_back({tpn, StatusCode::kInvalidArgument, "sampling.top_p"});
  auto tk = params({1}, 1);
  tk.sampling.top_k = -1;
  cases.push_back({tk, StatusCode::kInvalidArgument, "sampling.top_k"});
  for (auto& c : cases) {
    Status st = validateGenerate(c.p, f);
    EXPECT_EQ(st.code(), c.code) << st.toString();
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << st.toString();
  }
}

TEST(GenerateRequest, WorkerWithoutAnLlmOrACache) {
  auto p = params({1}, 1);
  shm::ModelFacts embed;
  std::strcpy(embed.kind, "embedding");
  Status st = validateGenerate(p, embed);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("does not serve an LLM"), std::string::npos);
  st = validateGenerate(p, llmFacts(0, 4, 20, 50));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("no KV cache"), std::string::npos);
}

TEST(GenerateRequest, AcceptsTheLongestPromptAndNormalizesTopP) {
  auto p = params(range(19, 1), 1);  // leaves one token of the 20
  p.sampling.top_p = 0;              // proto3's unset
  EXPECT_TRUE(validateGenerate(p, llmFacts(8, 4, 20, 50)).isOk());
  EXPECT_EQ(p.sampling.top_p, 1.f);
  // Vocabulary unknown (0): any id >= 0.
  auto q = params({123456}, 1);
  EXPECT_TRUE(validateGenerate(q, llmFacts(8, 4, 20, 0)).isOk());
}

// [TAG_LLM_SAMPLER_STATE] A worker whose sampler keeps no per-sequence state (rose's CUDA sampler
// today) announces llm_caps without kLlmCapSamplerState: each request that needs it is refused
// alone, naming the OpenAI field, and plain sampling still passes. With the bit, all pass.
TEST(GenerateRequest, SamplerExtrasNeedTheWorkersSamplerStateCapability) {
  shm::ModelFacts plain = llmFacts(8, 4, 20, 50);
  std::strcpy(plain.sampler, "cuda");
  shm::ModelFacts stateful = plain;
  stateful.llm_caps = shm::kLlmCapSamplerState;
  auto with = [](auto set) {
    GenerateParams p = params({1, 2}, 3);
    p.sampling.temperature = 0.7f;
    p.sampling.top_k = 5;
    p.sampling.top_p = 0.9f;
    set(p);
    return p;
  };
  struct Case {
    GenerateParams p;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({with([](GenerateParams& p) { p.sampling.logprobs = 0; }), "logprobs"});
  cases.push_back({with([](GenerateParams& p) { p.sampling.logprobs = 5; }), "logprobs"});
  cases.push_back({with([](GenerateParams& p) { p.sampling.min_p = 0.05f; }), "min_p"});
  cases.push_back(
      {with([](GenerateParams& p) { p.sampling.presence_penalty = -0.5f; }), "presence_penalty"});
  cases.push_back(
      {with([](GenerateParams& p) { p.sampling.frequency_penalty = 0.1f; }), "frequency_penalty"});
  cases.push_back(
      {with([](GenerateParams& p) { p.sampling.repetition_penalty = 1.1f; }), "repetition_penalty"});
  cases.push_back({with([](GenerateParams& p) { p.logit_bias = {{7, -100.f}}; }), "logit_bias"});
  for (Case& c : cases) {
    GenerateParams p = c.p;
    Status st = validateGenerate(p, plain);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(st.message().rfind(c.field + ": not supported by this worker's sampler (cuda)", 0),
              0u)
        << st.toString();
    GenerateParams q = c.p;
    EXPECT_TRUE(validateGenerate(q, stateful).isOk()) << c.field;
  }
  // Plain sampling, and the proto3 "unset" values (repetition_penalty 0, top_p 0), need nothing.
  GenerateParams p = with([](GenerateParams& p) {
    p.sampling.repetition_penalty = 0.f;
    p.sampling.top_p = 0.f;
  });
  EXPECT_TRUE(validateGenerate(p, plain).isOk());
  // Range errors still come first and keep their own names.
  GenerateParams bad = with([](GenerateParams& p) { p.sampling.min_p = 2.f; });
  EXPECT_EQ(validateGenerate(bad, plain).message().rfind("sampling.min_p", 0), 0u);
  // A worker that announces no sampler name still gets a readable message.
  shm::ModelFacts anon = llmFacts(8, 4, 20, 50);
  GenerateParams lp = with([](GenerateParams& p) { p.sampling.logprobs = 1; });
  EXPECT_NE(validateGenerate(lp, anon).message().find("(unknown)"), std::string::npos);
}

}  // namespace
}  // namespace garden::tulip
