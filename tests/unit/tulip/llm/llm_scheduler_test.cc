// LlmScheduler (the threaded driver) against the in-process fake LLM
// (tests/fakes/tulip/fake_llm_worker.h): exact step layouts (tokens, positions, block tables),
// chunked prefill, prefix-cache hits, preemption by recompute, stop conditions, cancellation,
// worker failure and admission errors. The fake model reads earlier tokens back through the block
// tables, so any bookkeeping error changes a stream. Tests named LlmSchedulerModes run with one
// step in flight (Sync) and with two (Async: the fake resolves prev_row, [TAG_LLM_PREV_TOKEN]);
// the streams must be the same. The decisions themselves are tested step by step, without
// threads, in step_scheduler_test.cc.
#include "services/tulip/llm/llm_scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "common/grammar/grammar.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/vocabulary.h"
#include "common/shm/llm_batch.h"
#include "tests/fakes/tulip/fake_llm_worker.h"
#include "tests/unit/tulip/llm/llm_test_util.h"

namespace garden::tulip {
namespace {

using namespace std::chrono_literals;
using testing::FakeLlmWorker;
using testing::fakeReference;
using testing::params;
using testing::range;

constexpr uint32_t kVocab = 1000;
constexpr int32_t kEos = 999;

struct Stream {
  std::mutex mu;
  std::vector<int32_t> tokens;
  std::optional<GenerateEvent> last;
  std::shared_ptr<LlmRequest> req;
  int events_after_last = 0;
  bool done() {
    std::lock_guard<std::mutex> l(mu);
    return last.has_value();
  }
};

std::shared_ptr<Stream> start(LlmScheduler& s, GenerateParams p, Status* st_out = nullptr) {
  auto out = std::make_shared<Stream>();
  out->req = std::make_shared<LlmRequest>();
  out->req->params = std::move(p);
  out->req->on_event = [o = out.get()](const GenerateEvent& ev) {
    std::lock_guard<std::mutex> l(o->mu);
    if (o->last) ++o->events_after_last;
    if (ev.token >= 0) o->tokens.push_back(ev.token);
    if (ev.last) o->last = ev;
  };
  Status st = s.submit(out->req);
  if (st_out)
    *st_out = st;
  else
    EXPECT_TRUE(st.isOk()) << st.toString();
  return out;
}

// The fake's tokens for `prompt`, eos or not: what a request with ignore_eos streams, and what
// any request streams when the reference holds no eos (the caller knows its prompt's stream).
std::vector<int32_t> ref(const std::vector<int32_t>& prompt, uint32_t n,
                         llm::SamplingParams p = {}) {
  return fakeReference(prompt, n, p, kVocab);
}

// What the scheduler streams for a request without ignore_eos: the reference up to and including
// the first eos (FINISH_STOP). Tests whose prompts are generated (not chosen) compare against
// this; the fake's tokens are uniform over [3, kVocab), so about one token in a thousand is eos.
std::vector<int32_t> stream(const std::vector<int32_t>& prompt, uint32_t n,
                            llm::SamplingParams p = {}) {
  return fakeReference(prompt, n, p, kVocab, {kEos});
}

// Param: async_steps.
class LlmSchedulerModes : public ::testing::TestWithParam<bool> {
 protected:
  LlmSchedulerOptions opts(uint32_t max_batch_tokens, uint32_t max_num_seqs) const {
    return {.max_batch_tokens = max_batch_tokens,
            .max_num_seqs = max_num_seqs,
            .async_steps = GetParam()};
  }
};
INSTANTIATE_TEST_SUITE_P(Steps, LlmSchedulerModes, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Async" : "Sync";
                         });

TEST(LlmScheduler, PrefillThenDecodeStepsHaveExactLayout) {
  FakeLlmWorker w(16, 4);
  LlmScheduler s(w, {.max_batch_tokens = 64, .max_num_seqs = 8});
  auto a = start(s, params(range(6), 3));
  ASSERT_TRUE(w.waitHeld(1));
  auto b = start(s, params(range(3, 50), 2));
  // Step 1: a's whole prompt, sampling; blocks 0,1.
  auto st = w.submitted();
  ASSERT_EQ(st.size(), 1u);
  ASSERT_EQ(st[0].llm_seqs.size(), 1u);
  EXPECT_EQ(st[0].tokens, range(6));
  EXPECT_EQ(st[0].block_ids, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(st[0].llm_seqs[0].position, 0);
  EXPECT_EQ(st[0].llm_seqs[0].num_tokens, 6);
  EXPECT_EQ(st[0].llm_seqs[0].sample, 1);
  ASSERT_TRUE(w.completeNext());
  ASSERT_TRUE(w.waitHeld(1));
  // Step 2: a's decode (position 6) and b's prefill (blocks 2).
  st = w.submitted();
  ASSERT_EQ(st.size(), 2u);
  ASSERT_EQ(st[1].llm_seqs.size(), 2u);
  EXPECT_EQ(st[1].llm_seqs[0].position, 6);
  EXPECT_EQ(st[1].llm_seqs[0].num_tokens, 1);
  EXPECT_EQ(st[1].tokens[0], ref(range(6), 1)[0]);
  EXPECT_EQ(st[1].llm_seqs[1].position, 0);
  EXPECT_EQ(st[1].llm_seqs[1].num_tokens, 3);
  EXPECT_EQ(st[1].block_ids, (std::vector<int32_t>{0, 1, 2}));
  ASSERT_TRUE(w.runUntil([&] { return a->done() && b->done(); }));
  EXPECT_EQ(a->tokens, ref(range(6), 3));
  EXPECT_EQ(b->tokens, ref(range(3, 50), 2));
  EXPECT_EQ(a->last->finish, FinishReason::kLength);
  EXPECT_TRUE(a->last->status.isOk());
  EXPECT_EQ(a->last->prompt_tokens, 6u);
  EXPECT_EQ(a->last->completion_tokens, 3u);
  EXPECT_EQ(a->events_after_last, 0);
  EXPECT_TRUE(w.errors().empty()) << w.errors()[0];
  auto stats = s.stats();
  EXPECT_EQ(stats.running, 0u);
  EXPECT_EQ(stats.kv_free_blocks, 16u);
}

TEST(LlmScheduler, ChunkedPrefillUnderTokenBudget) {
  FakeLlmWorker w(32, 4);
  LlmScheduler s(w, {.max_batch_tokens = 4, .max_num_seqs = 8});
  auto a = start(s, params(range(10), 2));
  std::vector<std::pair<int, int>> want = {{0, 4}, {4, 4}, {8, 2}};
  for (auto [pos, n] : want) {
    ASSERT_TRUE(w.waitHeld(1));
    auto last = w.submitted().back();
    ASSERT_EQ(last.llm_seqs.size(), 1u);
    EXPECT_EQ(last.llm_seqs[0].position, pos);
    EXPECT_EQ(last.llm_seqs[0].num_tokens, n);
    EXPECT_EQ(last.llm_seqs[0].sample, pos + n == 10 ? 1 : 0);
    EXPECT_EQ(last.llm_seqs[0].num_blocks, (pos + n + 3) / 4);
    ASSERT_TRUE(w.completeNext());
  }
  ASSERT_TRUE(w.runUntil([&] { return a->done(); }));
  EXPECT_EQ(a->tokens, ref(range(10), 2));
  EXPECT_TRUE(w.errors().empty());
}

TEST(LlmScheduler, RepeatedPromptHitsThePrefixCache) {
  FakeLlmWorker w(32, 4);
  LlmScheduler s(w, {.max_batch_tokens = 64, .max_num_seqs = 8});
  const auto prompt = range(12);
  auto a = start(s, params(prompt, 2));
  ASSERT_TRUE(w.runUntil([&] { return a->done(); }));
  EXPECT_EQ(a->last->cached_prompt_tokens, 0u);
  auto b = start(s, params(prompt, 4));
  ASSERT_TRUE(w.waitHeld(1));
  auto step = w.submitted().back();
  // 12 tokens: two full blocks hit (the third full block holds the last token: recomputed).
  ASSERT_EQ(step.llm_seqs.size(), 1u);
  EXPECT_EQ(step.llm_seqs[0].position, 8);
  EXPECT_EQ(step.llm_seqs[0].num_tokens, 4);
  auto a_first = w.submitted()[0].block_ids;
  EXPECT_EQ(step.block_ids[0], a_first[0]);
  EXPECT_EQ(step.block_ids[1], a_first[1]);
  ASSERT_TRUE(w.runUntil([&] { return b->done(); }));
  EXPECT_EQ(b->tokens, ref(prompt, 4));
  EXPECT_EQ(b->last->cached_prompt_tokens, 8u);
  EXPECT_EQ(s.stats().cached_prompt_tokens, 8u);
  EXPECT_EQ(s.stats().kv_free_blocks, 32u);

  // Caching off: no hit.
  FakeLlmWorker w2(32, 4);
  LlmScheduler s2(w2, {.max_batch_tokens = 64, .max_num_seqs = 8, .enable_prefix_caching = false});
  auto c = start(s2, params(prompt, 1));
  ASSERT_TRUE(w2.runUntil([&] { return c->done(); }));
  auto d = start(s2, params(prompt, 1));
  ASSERT_TRUE(w2.runUntil([&] { return d->done(); }));
  EXPECT_EQ(d->last->cached_prompt_tokens, 0u);
  EXPECT_EQ(d->tokens, c->tokens);
}

TEST_P(LlmSchedulerModes, PreemptionByRecomputeKeepsStreamsExact) {
  // 8 blocks of 2 tokens = 16 token slots for three sequences that want 10 + 10 + 10.
  FakeLlmWorker w(8, 2, 64);
  LlmScheduler s(w, opts(64, 8));
  llm::SamplingParams hot;
  hot.temperature = 0.8f;
  hot.seed = 42;
  auto pa = params(range(4, 100), 6);
  pa.sampling = hot;
  auto a = start(s, pa);
  auto b = start(s, params(range(4, 200), 6));
  auto c = start(s, params(range(4, 300), 6));
  ASSERT_TRUE(w.runUntil([&] { return a->done() && b->done() && c->done(); }));
  EXPECT_EQ(a->tokens, ref(range(4, 100), 6, hot));
  EXPECT_EQ(b->tokens, ref(range(4, 200), 6));
  EXPECT_EQ(c->tokens, ref(range(4, 300), 6));
  EXPECT_GT(s.stats().preemptions, 0u);
  EXPECT_TRUE(w.errors().empty()) << w.errors()[0];
  EXPECT_EQ(s.stats().kv_free_blocks, 8u);
  EXPECT_EQ(s.stats().waiting, 0u);
}

TEST_P(LlmSchedulerModes, StopConditions) {
  FakeLlmWorker w(64, 4, 20);
  LlmScheduler s(w, opts(64, 8));
  const auto full = ref(range(5), 10);
  // A stop token: the stream ends with it.
  auto p = params(range(5), 10);
  p.stop_token_ids = {full[3]};
  auto a = start(s, p);
  ASSERT_TRUE(w.runUntil([&] { return a->done(); }));
  EXPECT_EQ(a->tokens, std::vector<int32_t>(full.begin(), full.begin() + 4));
  EXPECT_EQ(a->last->finish, FinishReason::kStop);
  EXPECT_EQ(a->last->token, full[3]);
  // max_tokens 0: until the context (20) is full.
  auto b = start(s, params(range(5), 0));
  ASSERT_TRUE(w.runUntil([&] { return b->done(); }));
  EXPECT_EQ(b->tokens.size(), 15u);
  EXPECT_EQ(b->last->finish, FinishReason::kLength);
  // max_tokens beyond the context also stops at the context.
  auto c = start(s, params(range(18), 100));
  ASSERT_TRUE(w.runUntil([&] { return c->done(); }));
  EXPECT_EQ(c->tokens.size(), 2u);
  EXPECT_EQ(c->last->finish, FinishReason::kLength);
}

TEST_P(LlmSchedulerModes, EosStopsUnlessIgnored) {
  // Find a prompt whose greedy stream hits the eos id (999) within 8 tokens.
  std::vector<int32_t> prompt;
  size_t at = 0;
  for (int32_t x = 0; x < 200000 && prompt.empty(); ++x) {
    std::vector<int32_t> cand = {x % 997, x / 997 + 1};
    auto r = ref(cand, 8);
    for (size_t i = 0; i < r.size(); ++i)
      if (r[i] == kEos) {
        prompt = cand;
        at = i;
        break;
      }
  }
  ASSERT_FALSE(prompt.empty());
  FakeLlmWorker w(64, 4);
  LlmScheduler s(w, opts(64, 8));
  auto a = start(s, params(prompt, 8));
  auto p = params(prompt, 8);
  p.ignore_eos = true;
  auto b = start(s, p);
  ASSERT_TRUE(w.runUntil([&] { return a->done() && b->done(); }));
  EXPECT_EQ(a->tokens.size(), at + 1);
  EXPECT_EQ(a->tokens.back(), kEos);
  EXPECT_EQ(a->last->finish, FinishReason::kStop);
  EXPECT_EQ(b->tokens, ref(prompt, 8));
  EXPECT_EQ(b->last->finish, FinishReason::kLength);
}

// A cancel that comes after the stream ended (here at eos, its first token) changes nothing: no
// second last event, the FINISH_STOP stands, the next requests run. This is the order a loaded
// machine gave ConcurrentSubmitCancelAndCompletion's eos stream.
TEST_P(LlmSchedulerModes, CancelAfterTheStreamEndedAtEosChangesNothing) {
  std::vector<int32_t> prompt;
  for (int32_t x = 0; x < 200000 && prompt.empty(); ++x) {
    std::vector<int32_t> cand = {x % 997, x / 997 + 1};
    if (ref(cand, 1)[0] == kEos) prompt = cand;
  }
  ASSERT_FALSE(prompt.empty());
  FakeLlmWorker w(16, 4);
  LlmScheduler s(w, opts(64, 8));
  auto a = start(s, params(prompt, 7));
  ASSERT_TRUE(w.runUntil([&] { return a->done(); }));
  s.cancel(a->req);
  auto b = start(s, params(range(5), 3));
  ASSERT_TRUE(w.runUntil([&] { return b->done(); }));
  EXPECT_EQ(b->tokens, ref(range(5), 3));
  std::lock_guard<std::mutex> l(a->mu);
  EXPECT_EQ(a->tokens, std::vector<int32_t>{kEos});
  EXPECT_EQ(a->events_after_last, 0);
  EXPECT_EQ(a->last->finish, FinishReason::kStop);
  EXPECT_TRUE(a->last->status.isOk());
  EXPECT_EQ(a->last->completion_tokens, 1u);
  EXPECT_TRUE(w.errors().empty()) << w.errors()[0];
  EXPECT_EQ(s.stats().kv_free_blocks, 16u);
}

TEST_P(LlmSchedulerModes, CancelWhileInFlightFreesBlocksAtOnce) {
  FakeLlmWorker w(16, 4);
  LlmScheduler s(w, opts(64, 8));
  auto a = start(s, params(range(9), 50));
  ASSERT_TRUE(w.waitHeld(1));
  ASSERT_TRUE(w.completeNext());
  ASSERT_TRUE(w.waitHeld(1));  // a decode step is on the worker (Async: up to two)
  s.cancel(a->req);
  auto t0 = std::chrono::steady_clock::now();
  while (!a->done() && std::chrono::steady_clock::now() - t0 < 30s)
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(a->done());
  EXPECT_EQ(a->last->finish, FinishReason::kCancelled);
  EXPECT_EQ(a->last->status.code(), StatusCode::kCancelled);
  EXPECT_EQ(s.stats().kv_free_blocks, 16u);
  EXPECT_EQ(s.stats().running, 0u);
  // The steps' late results change nothing and emit nothing.
  ASSERT_TRUE(w.completeNext());
  while (w.completeNext()) {
  }
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(a->events_after_last, 0);
  EXPECT_EQ(a->tokens.size(), 1u);
  // A waiting request can be cancelled too.
  auto b = start(s, params(range(3), 5));
  s.cancel(b->req);
  ASSERT_TRUE(w.runUntil([&] { return b->done(); }));
  EXPECT_EQ(b->last->finish, FinishReason::kCancelled);
  EXPECT_EQ(s.stats().kv_free_blocks, 16u);
}

TEST_P(LlmSchedulerModes, WorkerFailureEndsRunningStreamsAndRecovers) {
  FakeLlmWorker w(16, 4);
  LlmScheduler s(w, opts(64, 8));
  auto a = start(s, params(range(5), 20));
  auto b = start(s, params(range(6, 40), 20));
  ASSERT_TRUE(w.waitHeld(1));
  ASSERT_TRUE(w.completeNext());
  ASSERT_TRUE(w.waitHeld(1));
  w.fail("rose worker (pid 1) was killed by signal 9");
  // The dead worker answers every step it held (Async: up to two).
  ASSERT_TRUE(w.completeNext(unavailable("rose worker (pid 1) was killed by signal 9")));
  while (w.completeNext(unavailable("rose worker (pid 1) was killed by signal 9"))) {
  }
  auto t0 = std::chrono::steady_clock::now();
  while (!(a->done() && b->done()) && std::chrono::steady_clock::now() - t0 < 30s)
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(a->done() && b->done());
  // Either the failed step or the loop noticing the worker down ends each first; both name the
  // failure that took the worker down.
  EXPECT_EQ(a->last->status.code(), StatusCode::kUnavailable);
  EXPECT_NE(a->last->status.message().find("killed by signal 9"), std::string::npos)
      << a->last->status.message();
  EXPECT_EQ(b->last->status.code(), StatusCode::kUnavailable);
  EXPECT_NE(b->last->status.message().find("killed by signal 9"), std::string::npos)
      << b->last->status.message();
  // While down, new requests are refused; once ready, the cache is rebuilt and streams work.
  Status st;
  start(s, params(range(3), 2), &st);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("restarting: rose worker (pid 1) was killed by signal 9"),
            std::string::npos)
      << st.message();
  w.setReady(true);
  auto c = start(s, params(range(5), 4));
  ASSERT_TRUE(w.runUntil([&] { return c->done(); }));
  EXPECT_EQ(c->tokens, ref(range(5), 4));
  EXPECT_EQ(c->last->cached_prompt_tokens, 0u);  // the old cache is gone
  EXPECT_TRUE(w.errors().empty()) << w.errors()[0];
}

TEST_P(LlmSchedulerModes, FailedStepEndsItsStreamsWithTheWorkersReason) {
  FakeLlmWorker w(16, 4);
  LlmScheduler s(w, opts(64, 8));
  auto a = start(s, params(range(5), 20));
  ASSERT_TRUE(w.waitHeld(1));
  ASSERT_TRUE(w.completeNext(unavailable("rose worker (pid 1) was killed by signal 9")));
  ASSERT_TRUE(w.runUntil([&] { return a->done(); }));
  EXPECT_EQ(a->last->status.code(), StatusCode::kUnavailable);
  EXPECT_NE(a->last->status.message().find("killed by signal 9"), std::string::npos)
      << a->last->status.message();
  EXPECT_EQ(s.stats().kv_free_blocks, 16u);
}

TEST_P(LlmSchedulerModes, StepsStayWithinTheChannelArena) {
  FakeLlmWorker w(64, 4);
  // Room for one sequence of a few tokens and blocks per step, not two.
  w.input_bytes_ = shm::llmStepBytes(1, 12, 8);
  LlmScheduler s(w, opts(64, 8));
  auto a = start(s, params(range(6), 4));
  auto b = start(s, params(range(7, 100), 4));
  ASSERT_TRUE(w.runUntil([&] { return a->done() && b->done(); }));
  EXPECT_EQ(a->tokens, ref(range(6), 4));
  EXPECT_EQ(b->tokens, ref(range(7, 100), 4));
  for (auto& st : w.submitted()) {
    EXPECT_LE(shm::llmStepBytes(st.llm_seqs.size(), st.tokens.size(), st.block_ids.size()),
              w.input_bytes_);
  }
}

TEST(LlmScheduler, AdmissionErrorsNameTheField) {
  FakeLlmWorker w(16, 4, 32);
  LlmScheduler s(w, {.max_batch_tokens = 64, .max_num_seqs = 8, .max_waiting_tokens = 10});
  struct Case {
    GenerateParams p;
    StatusCode code;
    std::string needle;
  };
  std::vector<Case> cases;
  cases.push_back({params({}, 1), StatusCode::kInvalidArgument, "prompt_ids"});
  cases.push_back({params(range(32), 1), StatusCode::kInvalidArgument, "context is 32"});
  cases.push_back({params({1, 5000}, 1), StatusCode::kInvalidArgument, "prompt_ids[1]"});
  auto t = params({1}, 1);
  t.sampling.temperature = -1;
  cases.push_back({t, StatusCode::kInvalidArgument, "sampling.temperature"});
  auto tp = params({1}, 1);
  tp.sampling.top_p = 1.5f;
  cases.push_back({tp, StatusCode::kInvalidArgument, "sampling.top_p"});
  auto tk = params({1}, 1);
  tk.sampling.top_k = -2;
  cases.push_back({tk, StatusCode::kInvalidArgument, "sampling.top_k"});
  auto stop = params({1}, 1);
  stop.stop_token_ids = {-3};
  cases.push_back({stop, StatusCode::kInvalidArgument, "stop_token_ids[0]"});
  cases.push_back({params(range(11), 1), StatusCode::kResourceExhausted, "limit 10"});
  for (auto& c : cases) {
    Status st;
    start(s, c.p, &st);
    EXPECT_EQ(st.code(), c.code) << st.toString();
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << st.toString();
  }
  // The waiting limit counts waiting prompts only: a running one no longer counts.
  auto a = start(s, params(range(8), 2));
  ASSERT_TRUE(w.waitHeld(1));
  auto b = start(s, params(range(8), 2));
  ASSERT_TRUE(w.runUntil([&] { return a->done() && b->done(); }));
}

// [TAG_LLM_SAMPLER_STATE] The fake worker announces no sampler state (like rose on CUDA): a
// request asking for logprobs / a penalty / logit_bias is refused at submit, naming the field,
// never reaches a step, and the requests around it run to their reference streams.
TEST_P(LlmSchedulerModes, SamplerExtrasWithoutWorkerSupportAreRefusedAlone) {
  FakeLlmWorker w(32, 4);
  LlmScheduler s(w, opts(64, 4));
  auto a = start(s, params(range(5), 6));
  GenerateParams lp = params(range(5, 20), 6);
  lp.sampling.logprobs = 2;
  Status st;
  start(s, lp, &st);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  EXPECT_EQ(st.message().rfind("logprobs: not supported by this worker's sampler (fake)", 0), 0u)
      << st.toString();
  GenerateParams pen = params(range(4, 30), 6);
  pen.sampling.frequency_penalty = 0.5f;
  start(s, pen, &st);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  EXPECT_EQ(st.message().rfind("frequency_penalty:", 0), 0u) << st.toString();
  GenerateParams bias = params(range(4, 40), 6);
  bias.logit_bias = {{3, 5.f}};
  start(s, bias, &st);
  EXPECT_EQ(st.message().rfind("logit_bias:", 0), 0u) << st.toString();
  auto b = start(s, params(range(3, 50), 6));
  ASSERT_TRUE(w.runUntil([&] { return a->done() && b->done(); }));
  EXPECT_TRUE(a->last->status.isOk()) << a->last->status.toString();
  EXPECT_TRUE(b->last->status.isOk()) << b->last->status.toString();
  EXPECT_EQ(a->tokens, ref(range(5), 6));
  EXPECT_EQ(b->tokens, ref(range(3, 50), 6));
  // No step carried a refused request (each would have logprobs or a state slot).
  for (const auto& step : w.submitted()) {
    for (const llm::LlmStepSeq& q : step.llm_seqs) {
      EXPECT_EQ(q.sampling.logprobs, -1);
      EXPECT_EQ(q.sampling.state_slot, -1);
    }
  }
}

TEST_P(LlmSchedulerModes, ManyRandomStreamsOnATinyCacheAllMatchTheReference) {
  FakeLlmWorker w(12, 2, 48);
  LlmScheduler s(w, opts(16, 4));
  std::mt19937 rng(7);
  std::vector<std::shared_ptr<Stream>> streams;
  std::vector<std::vector<int32_t>> want;
  std::vector<std::vector<int32_t>> prompts = {range(5, 1), range(7, 1), range(3, 60)};
  for (int i = 0; i < 24; ++i) {
    std::vector<int32_t> prompt = prompts[rng() % prompts.size()];
    for (uint32_t k = rng() % 4; k > 0; --k) prompt.push_back(static_cast<int32_t>(rng() % 900));
    const uint32_t n = 1 + rng() % 9;
    auto p = params(prompt, n);
    if (i % 3 == 0) {
      p.sampling.temperature = 1.f;
      p.sampling.seed = i;
    }
    want.push_back(stream(prompt, n, p.sampling));
    streams.push_back(start(s, p));
  }
  ASSERT_TRUE(w.runUntil(
      [&] {
        for (auto& st : streams)
          if (!st->done()) return false;
        return true;
      },
      30000ms));
  for (size_t i = 0; i < streams.size(); ++i) {
    EXPECT_EQ(streams[i]->tokens, want[i]) << "stream " << i;
    EXPECT_TRUE(streams[i]->last->status.isOk());
  }
  EXPECT_TRUE(w.errors().empty()) << w.errors()[0];
  auto st = s.stats();
  EXPECT_EQ(st.kv_free_blocks, 12u);
  EXPECT_EQ(st.running + st.waiting, 0u);
  EXPECT_GT(st.cached_prompt_tokens, 0u);
  // Every step respected the budget and the sequence cap.
  for (auto& b : w.submitted()) {
    EXPECT_LE(b.tokens.size(), 16u);
    EXPECT_LE(b.llm_seqs.size(), 4u);
  }
}

TEST(LlmScheduler, AsyncStepsKeepTwoStepsOnTheWorker) {
  FakeLlmWorker w(16, 4);
  LlmScheduler s(w, {.max_batch_tokens = 64, .max_num_seqs = 8, .async_steps = true});
  EXPECT_TRUE(s.asyncSteps());
  auto a = start(s, params(range(6), 4));
  // Step 2 goes out before step 1 has answered: its token is row 0 of step 1's ids.
  ASSERT_TRUE(w.waitHeld(2));
  auto st = w.submitted();
  ASSERT_GE(st.size(), 2u);
  ASSERT_EQ(st[0].llm_seqs.size(), 1u);
  EXPECT_EQ(st[0].llm_seqs[0].prev_row, -1);
  EXPECT_EQ(st[0].tokens, range(6));
  ASSERT_EQ(st[1].llm_seqs.size(), 1u);
  EXPECT_EQ(st[1].llm_seqs[0].position, 6);
  EXPECT_EQ(st[1].llm_seqs[0].num_tokens, 1);
  EXPECT_EQ(st[1].llm_seqs[0].sample, 1);
  EXPECT_EQ(st[1].llm_seqs[0].prev_row, 0);
  EXPECT_EQ(st[1].tokens, (std::vector<int32_t>{-1}));
  EXPECT_EQ(st[1].block_ids, (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(w.runUntil([&] { return a->done(); }));
  EXPECT_EQ(a->tokens, ref(range(6), 4));
  EXPECT_EQ(a->last->finish, FinishReason::kLength);
  EXPECT_TRUE(w.errors().empty()) << w.errors()[0];
  EXPECT_EQ(s.stats().kv_free_blocks, 16u);
}

TEST(LlmScheduler, AsyncStepsNeedAWorkerDepthOfTwo) {
  FakeLlmWorker w(16, 4);
  w.depth_ = 1;
  LlmScheduler s(w, {.max_batch_tokens = 64, .max_num_seqs = 8, .async_steps = true});
  EXPECT_FALSE(s.asyncSteps());
  auto a = start(s, params(range(6), 4));
  ASSERT_TRUE(w.runUntil([&] { return a->done(); }));
  EXPECT_EQ(a->tokens, ref(range(6), 4));
  for (const auto& b : w.submitted())
    for (const auto& d : b.llm_seqs) EXPECT_EQ(d.prev_row, -1);
  EXPECT_EQ(w.submitted().size(), 4u);  // one step per token
}

// Submitters on four threads, cancellations among them, the worker completing steps on its own
// thread: every stream ends exactly once, the uncancelled ones equal the reference, the
// cancelled ones are a prefix of it, and every block is free at the end. A cancelled stream that
// ended before its cancel arrived must be whole. The reference stops at eos as the scheduler
// does: thread 2's first stream (cancelled, 7 tokens asked) samples eos first, so when its cancel
// comes late (a loaded machine) it ends FINISH_STOP after that one token; compared with the
// eos-blind reference that read as "ended OK after 1 of 7 tokens" (1 run in 60 under load).
TEST_P(LlmSchedulerModes, ConcurrentSubmitCancelAndCompletion) {
  FakeLlmWorker w(24, 2, 48);
  LlmScheduler s(w, opts(16, 4));
  constexpr int kThreads = 4, kPerThread = 12;
  std::mutex mu;
  std::vector<std::shared_ptr<Stream>> streams;
  std::vector<std::vector<int32_t>> want;
  std::vector<bool> cancelled;
  std::atomic<int> submitted{0};
  std::thread worker([&] {
    EXPECT_TRUE(w.runUntil(
        [&] {
          if (submitted.load() < kThreads * kPerThread) return false;
          std::lock_guard<std::mutex> l(mu);
          for (auto& st : streams)
            if (!st->done()) return false;
          return true;
        },
        60000ms));
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      std::shared_ptr<Stream> to_cancel;
      for (int i = 0; i < kPerThread; ++i) {
        std::vector<int32_t> prompt = range(3 + static_cast<int32_t>(rng() % 6), 10 * t + 1);
        prompt.push_back(static_cast<int32_t>(3 + rng() % 900));
        const uint32_t n = 1 + rng() % 8;
        auto p = params(prompt, n);
        if (i % 2 == 0) {
          p.sampling.temperature = 1.f;
          p.sampling.seed = 7 * t + i;
        }
        const auto expect = stream(prompt, n, p.sampling);
        auto st = start(s, p);
        // Cancel the previous stream of every third: it may be waiting, running or done.
        if (to_cancel) s.cancel(to_cancel->req);
        {
          std::lock_guard<std::mutex> l(mu);
          streams.push_back(st);
          want.push_back(expect);
          cancelled.push_back(i % 3 == 0);
        }
        to_cancel = i % 3 == 0 ? st : nullptr;
        ++submitted;
      }
      if (to_cancel) s.cancel(to_cancel->req);
    });
  }
  for (auto& th : threads) th.join();
  worker.join();
  std::lock_guard<std::mutex> l(mu);
  ASSERT_EQ(streams.size(), size_t{kThreads * kPerThread});
  for (size_t i = 0; i < streams.size(); ++i) {
    Stream& st = *streams[i];
    std::lock_guard<std::mutex> g(st.mu);
    ASSERT_TRUE(st.last.has_value()) << i;
    EXPECT_EQ(st.events_after_last, 0) << i;
    ASSERT_LE(st.tokens.size(), want[i].size()) << i;
    EXPECT_TRUE(std::equal(st.tokens.begin(), st.tokens.end(), want[i].begin())) << i;
    if (!cancelled[i] || st.last->finish != FinishReason::kCancelled) {
      EXPECT_TRUE(st.last->status.isOk()) << i << ": " << st.last->status.toString();
      EXPECT_EQ(st.tokens, want[i]) << i;
    }
  }
  EXPECT_TRUE(w.errors().empty()) << w.errors()[0];
  const auto stats = s.stats();
  EXPECT_EQ(stats.kv_free_blocks, 24u);
  EXPECT_EQ(stats.running + stats.waiting, 0u);
}

// ---- stopChoice: one choice of n ends, the others go on [TAG_STOP_CHOICE] ---------------------

// Every choice's stream of one request (Stream above merges them).
struct Choices {
  explicit Choices(uint32_t n) : tokens(n), last(n), events_after_last(n, 0) {}
  std::mutex mu;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::optional<GenerateEvent>> last;
  std::vector<int> events_after_last;
  std::shared_ptr<LlmRequest> req;
  bool done(uint32_t i) {
    std::lock_guard<std::mutex> l(mu);
    return last[i].has_value();
  }
  bool allDone() {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& x : last)
      if (!x) return false;
    return true;
  }
  size_t count(uint32_t i) {
    std::lock_guard<std::mutex> l(mu);
    return tokens[i].size();
  }
};

std::shared_ptr<Choices> startChoices(LlmScheduler& s, GenerateParams p) {
  auto out = std::make_shared<Choices>(p.n);
  out->req = std::make_shared<LlmRequest>();
  out->req->params = std::move(p);
  out->req->on_event = [o = out.get()](const GenerateEvent& ev) {
    std::lock_guard<std::mutex> l(o->mu);
    if (o->last[ev.index]) ++o->events_after_last[ev.index];
    if (ev.token >= 0) o->tokens[ev.index].push_back(ev.token);
    if (ev.last) o->last[ev.index] = ev;
  };
  Status st = s.submit(out->req);
  EXPECT_TRUE(st.isOk()) << st.toString();
  return out;
}

// Choice i's reference: the fake model sampling with seed + i (ignore_eos).
std::vector<int32_t> choiceRef(const GenerateParams& p, uint32_t i) {
  llm::SamplingParams sp = p.sampling;
  sp.seed += i;
  return ref(p.prompt, p.max_tokens, sp);
}

TEST_P(LlmSchedulerModes, StopChoiceFreesThatChoiceAndTheOthersFinish) {
  FakeLlmWorker w(32, 4);
  LlmScheduler s(w, opts(64, 8));
  GenerateParams p = params(range(9), 40);
  p.n = 3;
  p.ignore_eos = true;
  p.sampling.temperature = 1.f;
  p.sampling.seed = 11;
  auto c = startChoices(s, p);
  const uint64_t call = c->req->call_id;
  ASSERT_NE(call, 0u);
  // Run until choice 1 has a few tokens, then hold the next step on the worker.
  ASSERT_TRUE(w.runUntil([&] { return c->count(1) >= 3; }));
  ASSERT_TRUE(w.waitHeld(1));
  const LlmStats before = s.stats();
  EXPECT_EQ(before.running, 3u);
  ASSERT_TRUE(s.stopChoice(call, 1).isOk());
  // Ends with no step completing: the loop's next turn frees it.
  auto t0 = std::chrono::steady_clock::now();
  while (!c->done(1) && std::chrono::steady_clock::now() - t0 < 10s)
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(c->done(1));
  const LlmStats after = s.stats();
  EXPECT_EQ(after.running, 2u);
  EXPECT_LT(after.kv_used_blocks, before.kv_used_blocks);  // its own blocks (not the shared ones)
  EXPECT_GT(after.kv_used_blocks, 0u);
  // Idempotent while the call runs; out-of-range index refused.
  EXPECT_TRUE(s.stopChoice(call, 1).isOk());
  EXPECT_EQ(s.stopChoice(call, 3).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.runUntil([&] { return c->allDone(); }));
  std::lock_guard<std::mutex> l(c->mu);
  // The stopped choice: OK, FINISH_STOP, a prefix of its reference, counted as streamed.
  const GenerateEvent& e1 = *c->last[1];
  EXPECT_TRUE(e1.status.isOk()) << e1.status.toString();
  EXPECT_EQ(e1.finish, FinishReason::kStop);
  EXPECT_GE(c->tokens[1].size(), 3u);
  EXPECT_LT(c->tokens[1].size(), 40u);
  EXPECT_EQ(e1.completion_tokens, c->tokens[1].size());
  const auto want1 = choiceRef(p, 1);
  EXPECT_TRUE(std::equal(c->tokens[1].begin(), c->tokens[1].end(), want1.begin()));
  // The others: every token, as if nothing happened.
  for (uint32_t i : {0u, 2u}) {
    EXPECT_EQ(c->tokens[i], choiceRef(p, i)) << i;
    EXPECT_EQ(c->last[i]->finish, FinishReason::kLength) << i;
    EXPECT_EQ(c->last[i]->completion_tokens, 40u) << i;
  }
  for (int n : c->events_after_last) EXPECT_EQ(n, 0);
  EXPECT_TRUE(w.errors().empty()) << w.errors()[0];
  EXPECT_EQ(s.stats().kv_free_blocks, 32u);
  // Every choice ended: the call is gone.
  EXPECT_EQ(s.stopChoice(call, 0).code(), StatusCode::kNotFound);
}

TEST_P(LlmSchedulerModes, StopChoiceOfAWaitingOrUnknownCall) {
  FakeLlmWorker w(32, 4);
  LlmScheduler s(w, opts(64, 8));
  EXPECT_EQ(s.stopChoice(0, 0).code(), StatusCode::kNotFound);
  EXPECT_EQ(s.stopChoice(12345, 0).code(), StatusCode::kNotFound);
  // n = 1 has no call id: the whole request is cancel()'s.
  auto one = start(s, params(range(4), 3));
  EXPECT_EQ(one->req->call_id, 0u);
  // Choice 0 (the leader) stopped before any step: the followers compute the prompt themselves.
  GenerateParams p = params(range(10), 6);
  p.n = 2;
  p.ignore_eos = true;
  auto c = startChoices(s, p);
  ASSERT_NE(c->req->call_id, 0u);
  ASSERT_TRUE(s.stopChoice(c->req->call_id, 0).isOk());
  ASSERT_TRUE(w.runUntil([&] { return c->allDone() && one->done(); }));
  std::lock_guard<std::mutex> l(c->mu);
  EXPECT_EQ(c->last[0]->finish, FinishReason::kStop);
  EXPECT_TRUE(c->last[0]->status.isOk());
  EXPECT_LE(c->tokens[0].size(), 6u);
  EXPECT_EQ(c->tokens[1], ref(range(10), 6));
  EXPECT_EQ(c->last[1]->finish, FinishReason::kLength);
  EXPECT_EQ(s.stats().kv_free_blocks, 32u);
}

// Threads submitting n-choice requests, stopping one of their choices (waiting, running or
// already ended) and cancelling others while the worker runs: every choice not stopped streams its
// whole reference, a stopped one a prefix of it (FINISH_STOP, OK), and nothing leaks.
TEST_P(LlmSchedulerModes, ConcurrentStopChoiceSubmitAndCancel) {
  FakeLlmWorker w(40, 2, 48);
  LlmScheduler s(w, opts(16, 6));
  constexpr int kThreads = 4, kPerThread = 10;
  struct Entry {
    std::shared_ptr<Choices> c;
    GenerateParams p;
    int stopped = -1;  // the choice asked to stop
    bool cancelled = false;
  };
  std::mutex mu;
  std::vector<Entry> entries;
  std::atomic<int> submitted{0};
  std::thread worker([&] {
    EXPECT_TRUE(w.runUntil(
        [&] {
          if (submitted.load() < kThreads * kPerThread) return false;
          std::lock_guard<std::mutex> l(mu);
          for (auto& e : entries)
            if (!e.c->allDone()) return false;
          return true;
        },
        60000ms));
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(200 + t);
      std::shared_ptr<Choices> prev;
      uint32_t prev_n = 0;
      for (int i = 0; i < kPerThread; ++i) {
        std::vector<int32_t> prompt = range(3 + static_cast<int32_t>(rng() % 6), 10 * t + 1);
        prompt.push_back(static_cast<int32_t>(3 + rng() % 900));
        GenerateParams p = params(prompt, 4 + rng() % 10);
        p.n = 2 + rng() % 3;
        p.ignore_eos = true;
        p.sampling.temperature = 1.f;
        p.sampling.seed = 31 * t + i;
        auto c = startChoices(s, p);
        Entry e{c, p};
        // Stop a choice of this request or of the previous one (which may have ended); cancel
        // every fifth.
        if (i % 2 == 0) {
          // NOT_FOUND when every choice ended before this line ran (short requests, the fake
          // worker's instant steps and a descheduled thread: seen under load): nothing stopped.
          const int which = static_cast<int>(rng() % p.n);
          const Status st = s.stopChoice(c->req->call_id, which);
          EXPECT_TRUE(st.isOk() || st.code() == StatusCode::kNotFound) << st.toString();
          if (st.isOk()) e.stopped = which;
        } else if (prev) {
          const Status st = s.stopChoice(prev->req->call_id, rng() % prev_n);
          EXPECT_TRUE(st.isOk() || st.code() == StatusCode::kNotFound) << st.toString();
        }
        if (i % 5 == 4) {
          s.cancel(c->req);
          e.cancelled = true;
        }
        {
          std::lock_guard<std::mutex> l(mu);
          entries.push_back(e);
        }
        prev = c;
        prev_n = p.n;
        ++submitted;
      }
    });
  }
  for (auto& th : threads) th.join();
  worker.join();
  std::lock_guard<std::mutex> l(mu);
  ASSERT_EQ(entries.size(), size_t{kThreads * kPerThread});
  for (size_t k = 0; k < entries.size(); ++k) {
    Entry& e = entries[k];
    std::lock_guard<std::mutex> g(e.c->mu);
    for (uint32_t i = 0; i < e.p.n; ++i) {
      ASSERT_TRUE(e.c->last[i].has_value()) << k << "/" << i;
      EXPECT_EQ(e.c->events_after_last[i], 0) << k << "/" << i;
      const auto want = choiceRef(e.p, i);
      const auto& got = e.c->tokens[i];
      ASSERT_LE(got.size(), want.size()) << k << "/" << i;
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << k << "/" << i;
      const GenerateEvent& last = *e.c->last[i];
      if (e.cancelled && last.finish == FinishReason::kCancelled) continue;
      EXPECT_TRUE(last.status.isOk()) << k << "/" << i << ": " << last.status.toString();
      if (static_cast<int>(i) == e.stopped && last.finish != FinishReason::kLength) {
        EXPECT_EQ(last.finish, FinishReason::kStop) << k << "/" << i;
        EXPECT_EQ(last.completion_tokens, got.size()) << k << "/" << i;
      } else if (static_cast<int>(i) == e.stopped) {
        // The stop is queued for the loop's next turn: a choice that reached max_tokens first
        // (the fake worker runs steps at once, this thread may be descheduled) ends by length,
        // complete (seen once in 2026-12-04's clean-clone run on 2 busy cores).
        EXPECT_EQ(got, want) << k << "/" << i;
      } else if (last.finish != FinishReason::kStop) {  // a later stop of a previous request's
        EXPECT_EQ(got, want) << k << "/" << i;
        EXPECT_EQ(last.finish, FinishReason::kLength) << k << "/" << i;
      }
    }
    EXPECT_EQ(s.stopChoice(e.c->req->call_id, 0).code(), StatusCode::kNotFound) << k;
  }
  EXPECT_TRUE(w.errors().empty()) << w.errors()[0];
  const auto stats = s.stats();
  EXPECT_EQ(stats.kv_free_blocks, 40u);
  EXPECT_EQ(stats.running + stats.waiting, 0u);
}

// ---- Late token masks through the driver [TAG_LATE_MASKS] ----

// An enum grammar over the shared toy vocabulary (testing::enumTokens) of the fake's 1000 ids;
// the fake's eos ends a value.
struct EnumGrammar {
  std::vector<std::string> toks = testing::enumTokens(kVocab);
  std::shared_ptr<const grammar::CompiledGrammar> compiled;
  EnumGrammar() {
    auto c = testing::compileSchema(R"({"enum":["ab","ac","abc"]})", testing::testVocab(toks, {kEos}));
    EXPECT_TRUE(c.isOk());
    compiled = *c;
  }
  GenerateParams request(std::vector<int32_t> prompt) const {
    GenerateParams p = params(std::move(prompt), 16);
    p.grammar = compiled;
    p.constraint.end_tokens = {kEos};
    return p;
  }
  std::string text(const std::vector<int32_t>& ids) const {
    std::string out;
    for (int32_t id : ids)
      if (id != kEos) out += toks[static_cast<size_t>(id)];
    return out;
  }
};

// Constrained streams go ahead with the others: a step is planned while the one before runs,
// carrying the constrained sequences on placeholders, and their masks reach the worker once
// that step's ids are applied (the fake runs a step only after). Every constrained stream is
// one of the enum's values and ends at eos; the unconstrained ones are the fake's reference.
TEST(LlmSchedulerLateMasks, ConstrainedStreamsGoAheadWithLateMasks) {
  const EnumGrammar g;
  FakeLlmWorker w(64, 4, 64);
  w.setLlmCaps(shm::kLlmCapTokenMask | shm::kLlmCapLateMask);
  LlmScheduler s(w, {.max_batch_tokens = 64, .max_num_seqs = 8, .async_steps = true});
  std::vector<std::shared_ptr<Stream>> constrained, plain;
  for (int i = 0; i < 5; ++i) constrained.push_back(start(s, g.request(range(3 + i, 10 + 7 * i))));
  for (int i = 0; i < 2; ++i) {
    GenerateParams p = params(range(4, 100 + 9 * i), 12);
    p.ignore_eos = true;
    plain.push_back(start(s, p));
  }
  ASSERT_TRUE(w.runUntil([&] {
    for (auto* v : {&constrained, &plain})
      for (auto& st : *v)
        if (!st->done()) return false;
    return true;
  })) << "a step waited for late masks that never came";
  for (auto& st : constrained) {
    ASSERT_TRUE(st->last->status.isOk()) << st->last->status.toString();
    EXPECT_EQ(st->last->finish, FinishReason::kStop);
    const std::string text = g.text(st->tokens);
    EXPECT_TRUE(text == "\"ab\"" || text == "\"ac\"" || text == "\"abc\"") << text;
  }
  for (int i = 0; i < 2; ++i) EXPECT_EQ(plain[static_cast<size_t>(i)]->tokens, ref(range(4, 100 + 9 * i), 12));
  EXPECT_TRUE(w.errors().empty()) << w.errors().front();
  // Some step carried a constrained sequence on a placeholder with its mask late.
  bool ahead = false;
  for (const WorkBatch& b : w.submitted()) {
    if (!b.late_masks) continue;
    EXPECT_TRUE(b.masks.empty());
    for (const auto& q : b.llm_seqs) ahead = ahead || (q.prev_row >= 0 && q.mask_index > 0);
  }
  EXPECT_TRUE(ahead);
  EXPECT_GT(w.lateDelivered(), 0u);
  EXPECT_EQ(s.stats().late_mask_steps, w.lateDelivered());
}

// The worker refused the late masks (it had stopped waiting and drew unconstrained): the
// constrained stream ends INTERNAL naming why; the unconstrained one is untouched.
TEST(LlmSchedulerLateMasks, RefusedLateMasksEndOnlyTheConstrainedStream) {
  const EnumGrammar g;
  FakeLlmWorker w(64, 4, 64);
  w.setLlmCaps(shm::kLlmCapTokenMask | shm::kLlmCapLateMask);
  w.abandon_late = true;
  LlmScheduler s(w, {.max_batch_tokens = 64, .max_num_seqs = 8, .async_steps = true});
  auto c = start(s, g.request(range(3, 10)));
  GenerateParams p = params(range(4, 100), 8);
  p.ignore_eos = true;
  auto u = start(s, p);
  ASSERT_TRUE(w.runUntil([&] { return c->done() && u->done(); }));
  EXPECT_EQ(c->last->status.code(), StatusCode::kInternal);
  EXPECT_NE(c->last->status.message().find("did not reach rose"), std::string::npos)
      << c->last->status.message();
  EXPECT_TRUE(u->last->status.isOk());
  EXPECT_EQ(u->tokens, ref(range(4, 100), 8));
}

// tulip stops while a step waits for its late masks: it hands over masks allowing every token,
// so the worker is not left waiting for the timeout.
TEST(LlmSchedulerLateMasks, StopReleasesAStepWaitingForItsMasks) {
  const EnumGrammar g;
  FakeLlmWorker w(64, 4, 64);
  w.setLlmCaps(shm::kLlmCapTokenMask | shm::kLlmCapLateMask);
  auto s = std::make_unique<LlmScheduler>(
      w, LlmSchedulerOptions{.max_batch_tokens = 64, .max_num_seqs = 8, .async_steps = true});
  auto c = start(*s, g.request(range(3, 10)));
  ASSERT_TRUE(w.waitHeld(2));  // the prefill (masks with it) and the next step (masks late)
  EXPECT_EQ(w.lateDelivered(), 0u);
  s->stop();
  EXPECT_EQ(w.lateDelivered(), 1u);
  ASSERT_TRUE(c->done());
  EXPECT_EQ(c->last->finish, FinishReason::kCancelled);
  s.reset();  // before the fake, which still holds the two steps' callbacks (never called)
}

}  // namespace
}  // namespace garden::tulip
