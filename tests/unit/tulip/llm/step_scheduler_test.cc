// LlmStepScheduler step by step, without threads or clocks (vLLM's tests/v1/core/test_scheduler.py
// and test_prefix_caching.py are the model): tiny block pools, exact block ids, the free queue's
// order (eviction order), preemption by recompute, prefix-cache hits, chunked prefill,
// stop/eos/length/cancel/deadline, and two steps in flight [TAG_LLM_PREV_TOKEN] (placeholders,
// dropped speculative tokens, failures and preemption while two steps are out). Each test is a
// table of expected states: a plan renders as "A@6+1*^0 [0 1]" (sequence A, position 6, one new
// token, samples (*), its token is row 0 of the previous step's ids (^0), block table [0 1]);
// events as "A=20" (a token), "A=2 stop", "A length", "A cancelled" or the error's code; the KV
// free queue front first, "c" marking a cached block. Every call is followed by an accounting
// check (KvBlockManager invariants; only running sequences hold blocks, covering what is
// scheduled). The last tests run many random requests through the fake model
// (tests/fakes/tulip/fake_llm_model.h) in both modes and compare the streams with the reference.
#include "services/tulip/llm/step_scheduler.h"

#include <gtest/gtest.h>

#include <deque>
#include <iostream>
#include <map>
#include <optional>
#include <random>

#include "common/grammar/json_schema.h"
#include "common/shm/llm_batch.h"
#include "tests/fakes/tulip/fake_llm_model.h"
#include "tests/unit/tulip/llm/llm_test_util.h"

namespace garden::tulip {
namespace {

constexpr int32_t kEos = 2;
constexpr uint32_t kVocab = 1000;

LlmWorkerLimits limits(uint32_t blocks, uint32_t block_size, uint32_t context_len) {
  LlmWorkerLimits l;
  l.kv_num_blocks = blocks;
  l.kv_block_size = block_size;
  l.context_len = context_len;
  l.eos_ids = {kEos};
  return l;
}

using testing::range;

// Structured outputs: a test vocabulary (`toks`: id -> bytes; `excluded` ids are never sampled
// text) and a schema's grammar compiled over it.
// The shared toy-vocabulary helpers, eos excluded by default.
std::shared_ptr<grammar::Vocabulary> testVocab(const std::vector<std::string>& toks,
                                               const std::vector<int32_t>& excluded_ids = {kEos}) {
  return testing::testVocab(toks, excluded_ids);
}
using testing::compileSchema;
using testing::enumTokens;
constexpr auto gp = testing::params;

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s;
}

// Drives one LlmStepScheduler as the threaded driver does, with the worker's results given by
// the test (complete) or computed by the fake model (runOldest).
class Sim {
 public:
  Sim(LlmSchedulerOptions opts, LlmWorkerLimits l) : s_(opts), limits_(l) {
    EXPECT_TRUE(s_.configure(l));
  }

  SeqId add(char name, GenerateParams p) {
    auto id = s_.add(std::move(p), tick());
    EXPECT_TRUE(id.isOk()) << id.status().toString();
    names_[*id] = name;
    ids_[name] = *id;
    check();
    return *id;
  }
  // A request with n = names.size() choices [TAG_LLM_CHOICES]: choice i is names[i].
  SeqId addChoices(const std::string& names, GenerateParams p) {
    p.n = static_cast<uint32_t>(names.size());
    auto id = s_.add(std::move(p), tick());
    EXPECT_TRUE(id.isOk()) << id.status().toString();
    for (size_t i = 0; i < names.size(); ++i) {
      names_[*id + i] = names[i];
      ids_[names[i]] = *id + i;
    }
    check();
    return *id;
  }
  SeqId id(char name) { return ids_.at(name); }
  // [TAG_DISAGG] Decode side: adopts `h` as `name`; the pairs to copy (or the error).
  Result<SeqId> adopt(char name, SeqHandoff h, std::vector<int32_t>* pairs,
                      std::vector<int32_t>* window_pairs) {
    auto id = s_.adopt(h, pairs, window_pairs);
    if (id.isOk()) {
      names_[*id] = name;
      ids_[name] = *id;
    }
    check();
    return id;
  }
  std::string adopted(char name, const Status& copy) {
    s_.adopted(id(name), copy, tick());
    check();
    return events();
  }

  // Plans the next step; its rendering, or "-" for none.
  std::string schedule() {
    StepPlan p = s_.schedule(tick());
    check();
    if (p.empty()) return "-";
    std::string out;
    for (size_t i = 0; i < p.seqs.size(); ++i) {
      const llm::LlmStepSeq& d = p.seqs[i];
      std::vector<int32_t> table(p.block_ids.begin() + d.block_offset,
                                 p.block_ids.begin() + d.block_offset + d.num_blocks);
      out += (i ? "; " : "") + std::string(1, names_.at(p.refs[i].id)) + "@" +
             std::to_string(d.position) + "+" + std::to_string(d.num_tokens) +
             (d.sample ? "*" : "") + (d.prev_row >= 0 ? "^" + std::to_string(d.prev_row) : "") +
             " [" + join(table) + "]";
    }
    last_tokens_ = p.tokens;
    plans_.push_back(std::move(p));
    return out;
  }
  // The token array of the last plan.
  const std::vector<int32_t>& tokens() const { return last_tokens_; }
  // The last plan (its masks, [TAG_TOKEN_MASK]).
  const StepPlan& lastPlan() const { return plans_.back(); }

  // The oldest plan in flight sampled `ids`; the events that followed.
  std::string complete(std::vector<int32_t> ids) { return answer(okStatus(), ids); }
  // The oldest plan in flight failed.
  std::string fail(Status st) { return answer(st, {}); }
  // The newest plan never reached the worker.
  void retractNewest() {
    s_.retract(plans_.back());
    plans_.pop_back();
    check();
  }
  std::string cancel(char name) {
    s_.cancel(id(name), tick());
    check();
    return events();
  }
  std::string stop(char name) {
    s_.stop(id(name), tick());
    check();
    return events();
  }
  std::string expire(int64_t now) {
    s_.expire(now);
    check();
    return events();
  }

  // Events since the last call: "A=20, A=2 stop, B cancelled".
  std::string events() {
    std::string out;
    for (const SeqEvent& e : s_.takeEvents()) {
      std::string one(1, names_.at(e.id));
      if (e.handoff) one += " handoff";  // [TAG_DISAGG]
      if (e.event.token >= 0) one += "=" + std::to_string(e.event.token);
      if (e.event.last) {
        if (!e.event.status.isOk())
          one += " " + std::string(statusCodeName(e.event.status.code()));
        else if (e.event.finish == FinishReason::kStop)
          one += " stop";
        else if (e.event.finish == FinishReason::kLength)
          one += " length";
        if (e.event.finish == FinishReason::kCancelled) one = one.substr(0, 1) + " cancelled";
        last_[e.id] = e.event;
      }
      out += (out.empty() ? "" : ", ") + one;
    }
    return out;
  }
  const GenerateEvent& lastEvent(char name) { return last_.at(id(name)); }

  // The free queue, front (reused first) to back; "c": cached.
  std::string freeQueue() const {
    std::string out;
    for (int32_t b : s_.kv()->freeQueue())
      out += (out.empty() ? "" : " ") + std::to_string(b) + (s_.kv()->isCached(b) ? "c" : "");
    return out;
  }
  std::string table(char name) const { return join(spanVec(s_.kv()->blockTable(ids_.at(name)))); }

  // Accounting after every call: the block manager's invariants; only running sequences hold
  // blocks, and their tables cover every position a planned step writes.
  void check() {
    const KvBlockManager* kv = s_.kv();
    if (!kv) return;
    Status st = kv->checkInvariants();
    EXPECT_TRUE(st.isOk()) << st.toString();
    // Parked (handed off) and adopting sequences hold blocks too [TAG_DISAGG].
    EXPECT_EQ(kv->numSeqs(), s_.running().size() + s_.parked() + s_.adopting());
    for (SeqId id : s_.waiting()) EXPECT_FALSE(kv->hasSeq(id)) << "waiting seq holds blocks";
    for (SeqId id : s_.running()) {
      const auto& st2 = s_.seq(id);
      EXPECT_GE(kv->blockTable(id).size(), kv->blocksFor(st2.num_scheduled));
      EXPECT_LE(st2.num_computed, st2.num_scheduled);
      EXPECT_LE(st2.num_computed, st2.tokens.size());
    }
  }

  LlmStepScheduler& sched() { return s_; }
  size_t inFlight() const { return plans_.size(); }
  // [TAG_LATE_MASKS] The oldest plan in flight, and filling its late masks as the driver does
  // once the plan before it has been applied; the worker did not take them.
  const StepPlan& oldestPlan() const { return plans_.front(); }
  void fillLateMasks() { s_.fillLateMasks(plans_.front()); }
  std::string lateMasksLost() {
    s_.lateMasksLost(plans_.front(), tick());
    check();
    return events();
  }

 private:
  std::string answer(const Status& st, const std::vector<int32_t>& ids) {
    EXPECT_FALSE(plans_.empty());
    if (plans_.empty()) return "no plan";
    if (st.isOk())
      s_.update(plans_.front(), ids, tick());
    else
      s_.stepFailed(plans_.front(), st, tick());
    plans_.pop_front();
    check();
    return events();
  }
  static std::vector<int32_t> spanVec(std::span<const int32_t> s) { return {s.begin(), s.end()}; }
  int64_t tick() { return now_ += 1000; }

  LlmStepScheduler s_;
  LlmWorkerLimits limits_;
  std::deque<StepPlan> plans_;
  std::vector<int32_t> last_tokens_;
  std::map<SeqId, char> names_;
  std::map<char, SeqId> ids_;
  std::map<SeqId, GenerateEvent> last_;
  int64_t now_ = 1'000'000;
};

LlmSchedulerOptions sync(uint32_t budget = 64, uint32_t seqs = 8) {
  return {.max_batch_tokens = budget, .max_num_seqs = seqs};
}
LlmSchedulerOptions async(uint32_t budget = 64, uint32_t seqs = 8) {
  return {.max_batch_tokens = budget, .max_num_seqs = seqs, .async_steps = true};
}

// One row of a one-step-at-a-time table: schedule() gives `plan`, the worker samples `ids`,
// update() gives `events`, and the free queue is then `free`.
struct Row {
  const char* plan;
  std::vector<int32_t> ids;
  const char* events;
  const char* free;
};

void runTable(Sim& sim, const std::vector<Row>& rows) {
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    ASSERT_EQ(sim.schedule(), rows[i].plan);
    if (std::string(rows[i].plan) == "-") continue;
    EXPECT_EQ(sim.complete(rows[i].ids), rows[i].events);
    EXPECT_EQ(sim.freeQueue(), rows[i].free);
  }
}

// ---- Choices (n > 1) [TAG_LLM_CHOICES] --------------------------------------------------------

// The prompt is computed once: choices 1 and 2 wait until a plan has scheduled choice 0's full
// prompt blocks, share them, and compute only the partly filled block's tokens before sampling.
TEST(StepScheduler, ChoicesSharePromptBlocksAndComputeOnlyTheTail) {
  Sim sim(sync(), limits(8, 4, 32));
  GenerateParams p = gp(range(10, 10), 2);
  p.sampling.seed = 7;
  sim.addChoices("ABC", p);
  EXPECT_EQ(sim.sched().seq(sim.id('A')).params.sampling.seed, 7u);
  EXPECT_EQ(sim.sched().seq(sim.id('B')).params.sampling.seed, 8u);
  EXPECT_EQ(sim.sched().seq(sim.id('C')).params.sampling.seed, 9u);
  EXPECT_EQ(sim.sched().stats().waiting, 3u);
  EXPECT_EQ(sim.sched().stats().waiting_tokens, 10u);  // the prompt once
  runTable(sim, {
                    {"A@0+10* [0 1 2]", {30}, "A=30", "3 4 5 6 7"},
                    {"A@10+1* [0 1 2]; B@8+2* [0 1 3]; C@8+2* [0 1 4]",
                     {31, 40, 50},
                     "A=31 length, B=40, C=50",
                     "2 5 6 7"},
                    {"B@10+1* [0 1 3]; C@10+1* [0 1 4]",
                     {41, 51},
                     "B=41 length, C=51 length",
                     "4 3 2 5 6 7 1c 0c"},
                    {"-", {}, "", ""},
                });
  EXPECT_EQ(sim.sched().stats().computed_prompt_tokens, 14u);  // 10 + 2 + 2, not 30
  EXPECT_EQ(sim.sched().stats().shared_prompt_tokens, 16u);
  EXPECT_EQ(sim.sched().stats().queried_prompt_tokens, 10u);
  EXPECT_EQ(sim.lastEvent('A').index, 0u);
  EXPECT_EQ(sim.lastEvent('B').index, 1u);
  EXPECT_EQ(sim.lastEvent('C').index, 2u);
  for (char c : {'A', 'B', 'C'}) {
    EXPECT_EQ(sim.lastEvent(c).prompt_tokens, 10u);
    EXPECT_EQ(sim.lastEvent(c).completion_tokens, 2u);
  }
  EXPECT_EQ(sim.lastEvent('B').cached_prompt_tokens, 8u);
  for (int32_t b = 0; b < 8; ++b) EXPECT_EQ(sim.sched().kv()->refCount(b), 0) << b;
}

// Two steps in flight: the choices fork in the plan right after the one that schedules the
// shared blocks, without waiting for its result (the worker runs steps in order).
TEST(StepScheduler, ChoicesForkInTheNextPlanWithTwoStepsInFlight) {
  Sim sim(async(), limits(8, 4, 32));
  sim.addChoices("AB", gp(range(10, 10), 2));
  ASSERT_EQ(sim.schedule(), "A@0+10* [0 1 2]");
  ASSERT_EQ(sim.schedule(), "A@10+1*^0 [0 1 2]; B@8+2* [0 1 3]");
  EXPECT_EQ(sim.complete({30}), "A=30");
  EXPECT_EQ(sim.complete({31, 40}), "A=31 length, B=40");
  ASSERT_EQ(sim.schedule(), "B@10+1* [0 1 3]");
  EXPECT_EQ(sim.complete({41}), "B=41 length");
  EXPECT_EQ(sim.freeQueue(), "3 2 4 5 6 7 1c 0c");
}

// Under a chunked prefill the choices wait for the chunk that completes the shared blocks; a
// request queued behind them is not held up meanwhile.
TEST(StepScheduler, ChoicesWaitForTheSharedChunkWithoutBlockingTheQueue) {
  Sim sim(sync(/*budget=*/6), limits(8, 4, 32));
  sim.addChoices("AB", gp(range(10, 10), 2));
  sim.add('D', gp({60, 61}, 1));
  runTable(sim, {
                    {"A@0+6 [0 1]", {}, "", "2 3 4 5 6 7"},
                    // A's chunk reaches 8 shared tokens in this plan: B forks in the next one;
                    // D, behind B in the queue, goes now.
                    {"A@6+4* [0 1 2]; D@0+2* [3]", {30, 70}, "A=30, D=70 length", "3 4 5 6 7"},
                    {"A@10+1* [0 1 2]; B@8+2* [0 1 3]", {31, 40}, "A=31 length, B=40",
                     "2 4 5 6 7"},
                    {"B@10+1* [0 1 3]", {41}, "B=41 length", "3 2 4 5 6 7 1c 0c"},
                });
  EXPECT_EQ(sim.sched().stats().computed_prompt_tokens, 14u);  // A 10, D 2, B 2
}

// A client that goes away cancels every choice; all blocks come back, shared ones included.
TEST(StepScheduler, CancellingEveryChoiceFreesAllBlocks) {
  for (int when = 0; when < 3; ++when) {
    SCOPED_TRACE("cancel after " + std::to_string(when) + " steps");
    Sim sim(async(), limits(8, 4, 32));
    sim.addChoices("ABC", gp(range(10, 10), 5));
    for (int i = 0; i < when; ++i) ASSERT_NE(sim.schedule(), "-");
    EXPECT_EQ(sim.cancel('A'), "A cancelled");
    EXPECT_EQ(sim.cancel('B'), "B cancelled");
    EXPECT_EQ(sim.cancel('C'), "C cancelled");
    // The steps still out come back: their entries are stale, nothing is streamed.
    if (when >= 1) {
      EXPECT_EQ(sim.complete({99}), "");
    }
    if (when == 2) {
      EXPECT_EQ(sim.complete({99, 99, 99}), "");
    }
    EXPECT_FALSE(sim.sched().hasWork());
    EXPECT_EQ(sim.sched().kv()->blocksFree(), 8u);
    EXPECT_EQ(sim.sched().kv()->numSeqs(), 0u);
    for (int32_t b = 0; b < 8; ++b) EXPECT_EQ(sim.sched().kv()->refCount(b), 0) << b;
    EXPECT_EQ(sim.sched().stats().waiting_tokens, 0u);
  }
}

// [TAG_STOP_CHOICE] stop() ends one choice (OK, FINISH_STOP) with a step in flight: its own block
// is freed at once, the shared prompt blocks stay with choice 0, the step's entry for it is
// stale, and choice 0 runs to its end. Stopping it again, or an unknown id, changes nothing.
TEST(StepScheduler, StoppingOneChoiceFreesItsOwnBlocksOnly) {
  Sim sim(async(), limits(8, 4, 32));
  sim.addChoices("AB", gp(range(10, 10), 5));
  ASSERT_EQ(sim.schedule(), "A@0+10* [0 1 2]");
  ASSERT_EQ(sim.schedule(), "A@10+1*^0 [0 1 2]; B@8+2* [0 1 3]");
  EXPECT_EQ(sim.complete({30}), "A=30");
  EXPECT_EQ(sim.complete({31, 40}), "A=31, B=40");
  ASSERT_NE(sim.schedule(), "-");  // A and B decode: B's token 41 is in flight
  EXPECT_EQ(sim.sched().kv()->refCount(3), 1);
  EXPECT_EQ(sim.stop('B'), "B stop");
  EXPECT_EQ(sim.sched().kv()->refCount(3), 0);  // B's own block
  for (int32_t b = 0; b < 3; ++b) EXPECT_EQ(sim.sched().kv()->refCount(b), 1) << b;  // A's
  EXPECT_EQ(sim.sched().kv()->numSeqs(), 1u);
  EXPECT_TRUE(sim.lastEvent('B').status.isOk());
  EXPECT_EQ(sim.lastEvent('B').finish, FinishReason::kStop);
  EXPECT_EQ(sim.lastEvent('B').completion_tokens, 1u);  // 40; 41 was never streamed
  EXPECT_EQ(sim.stop('B'), "");
  EXPECT_EQ(sim.complete({32, 41}), "A=32");
  std::string rest;
  for (int32_t t = 33; sim.sched().hasWork(); ++t) {
    ASSERT_NE(sim.schedule(), "-");
    rest += sim.complete({t});
  }
  EXPECT_EQ(rest, "A=33A=34 length");
  EXPECT_EQ(sim.lastEvent('A').completion_tokens, 5u);
  EXPECT_EQ(sim.sched().kv()->numSeqs(), 0u);
  for (int32_t b = 0; b < 8; ++b) EXPECT_EQ(sim.sched().kv()->refCount(b), 0) << b;
}

// Choice 0 gone before the others could fork: they fall back to computing the prompt (the
// prefix cache would serve its committed blocks).
TEST(StepScheduler, ChoicesWhoseLeaderIsGoneComputeThePromptThemselves) {
  Sim sim(sync(), limits(12, 4, 32));
  sim.addChoices("AB", gp(range(10, 10), 3));
  ASSERT_EQ(sim.schedule(), "A@0+10* [0 1 2]");
  EXPECT_EQ(sim.cancel('A'), "A cancelled");
  EXPECT_EQ(sim.complete({30}), "");
  ASSERT_EQ(sim.schedule(), "B@0+10* [0 1 2]");
  EXPECT_EQ(sim.complete({40}), "B=40");
}

// A step the worker refused wrote nothing: the choices forked off it end with it.
TEST(StepScheduler, ChoicesForkedOffARefusedStepEndWithIt) {
  Sim sim(async(), limits(8, 4, 32));
  sim.addChoices("AB", gp(range(10, 10), 3));
  ASSERT_EQ(sim.schedule(), "A@0+10* [0 1 2]");
  ASSERT_EQ(sim.schedule(), "A@10+1*^0 [0 1 2]; B@8+2* [0 1 3]");
  EXPECT_EQ(sim.fail(invalidArgument("bad step")), "A INTERNAL, B INTERNAL");
  EXPECT_EQ(sim.complete({1, 2}), "");
  EXPECT_EQ(sim.sched().kv()->blocksFree(), 8u);
  EXPECT_FALSE(sim.sched().hasWork());
}

// ---- One step in flight ---------------------------------------------------------------------

TEST(StepScheduler, PrefillThenDecodeExactBlocks) {
  Sim sim(sync(), limits(8, 4, 32));
  sim.add('A', gp(range(6, 10), 3));
  sim.add('B', gp({50, 51, 52}, 2));
  runTable(sim, {
                    {"A@0+6* [0 1]; B@0+3* [2]", {20, 21}, "A=20, B=21", "3 4 5 6 7"},
                    // B's block fills with its sampled token: cached when B ends.
                    {"A@6+1* [0 1]; B@3+1* [2]", {22, 23}, "A=22, B=23 length", "3 4 5 6 7 2c"},
                    // A's two full blocks go to the back, its first block last (evicted last).
                    {"A@7+1* [0 1]", {24}, "A=24 length", "3 4 5 6 7 2c 1c 0c"},
                    {"-", {}, "", ""},
                });
  EXPECT_EQ(sim.lastEvent('A').completion_tokens, 3u);
  EXPECT_EQ(sim.lastEvent('A').prompt_tokens, 6u);
  EXPECT_EQ(sim.sched().stats().steps, 3u);
  EXPECT_EQ(sim.sched().stats().generated_tokens, 5u);
}

TEST(StepScheduler, DecodeTokensAreTheSampledOnes) {
  Sim sim(sync(), limits(8, 4, 32));
  sim.add('A', gp({10, 11, 12}, 3));
  ASSERT_EQ(sim.schedule(), "A@0+3* [0]");
  EXPECT_EQ(sim.tokens(), (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(sim.complete({77}), "A=77");
  ASSERT_EQ(sim.schedule(), "A@3+1* [0]");
  EXPECT_EQ(sim.tokens(), (std::vector<int32_t>{77}));
}

TEST(StepScheduler, ChunkedPrefillUnderTheTokenBudgetThenAdmission) {
  Sim sim(sync(/*budget=*/4), limits(8, 4, 32));
  sim.add('A', gp(range(10, 10), 2));
  sim.add('B', gp({40, 41}, 3));
  runTable(sim,
           {
               // A's prompt in chunks of the budget; a chunk that does not end the prompt
               // samples nothing. B waits until the budget has room.
               {"A@0+4 [0]", {}, "", "1 2 3 4 5 6 7"},
               {"A@4+4 [0 1]", {}, "", "2 3 4 5 6 7"},
               {"A@8+2* [0 1 2]; B@0+2* [3]", {30, 50}, "A=30, B=50", "4 5 6 7"},
               {"A@10+1* [0 1 2]; B@2+1* [3]", {31, 51}, "A=31 length, B=51", "2 4 5 6 7 1c 0c"},
               {"B@3+1* [3]", {52}, "B=52 length", "2 4 5 6 7 1c 0c 3c"},
           });
}

TEST(StepScheduler, PrefixCacheHitsAndLeastRecentlyReleasedEviction) {
  Sim sim(sync(), limits(6, 4, 24));
  const auto prompt = range(9, 10);
  sim.add('A', gp(prompt, 1));
  // A's two full blocks are cached when it ends; its partial block is reused first.
  runTable(sim, {{"A@0+9* [0 1 2]", {50}, "A=50 length", "2 3 4 5 1c 0c"}});
  EXPECT_EQ(sim.lastEvent('A').cached_prompt_tokens, 0u);
  // D needs five blocks: the plain free ones, then the least recently released cached one
  // (block 1, A's tail; A's head, block 0, stays).
  sim.add('D', gp(range(17, 100), 1));
  runTable(sim, {{"D@0+17* [2 3 4 5 1]", {60}, "D=60 length", "1 0c 5c 4c 3c 2c"}});
  EXPECT_EQ(sim.sched().kv()->evictions(), 1u);
  // B repeats A's prompt: block 0 is a hit, block 1 was evicted (recomputed). Its new blocks:
  // the plain free block 1, then D's tail (5) evicted.
  sim.add('B', gp(prompt, 2));
  ASSERT_EQ(sim.schedule(), "B@4+5* [0 1 5]");
  EXPECT_EQ(sim.freeQueue(), "4c 3c 2c");
  EXPECT_EQ(sim.sched().kv()->evictions(), 2u);
  EXPECT_EQ(sim.complete({70}), "B=70");
  EXPECT_EQ(sim.cancel('B'), "B cancelled");
  // B's recomputed block 1 is cached again; block 5 holds one token (not full, not cached).
  EXPECT_EQ(sim.freeQueue(), "5 4c 3c 2c 1c 0c");
  EXPECT_EQ(sim.lastEvent('B').cached_prompt_tokens, 4u);
  EXPECT_EQ(sim.sched().stats().cached_prompt_tokens, 4u);
  EXPECT_EQ(sim.sched().stats().queried_prompt_tokens, 9u + 17u + 9u);
}

TEST(StepScheduler, PrefixCacheOffNeverHits) {
  LlmSchedulerOptions o = sync();
  o.enable_prefix_caching = false;
  Sim sim(o, limits(6, 4, 24));
  sim.add('A', gp(range(9, 10), 1));
  runTable(sim, {{"A@0+9* [0 1 2]", {50}, "A=50 length", "0 1 2 3 4 5"}});
  sim.add('B', gp(range(9, 10), 1));
  runTable(sim, {{"B@0+9* [0 1 2]", {50}, "B=50 length", "0 1 2 3 4 5"}});
}

TEST(StepScheduler, PreemptionByRecomputeTable) {
  // 4 blocks of 2 tokens for two sequences that want 7 tokens each.
  Sim sim(sync(), limits(4, 2, 16));
  sim.add('A', gp({10, 11, 12}, 4));
  sim.add('B', gp({20, 21, 22}, 4));
  runTable(sim, {
                    {"A@0+3* [0 1]; B@0+3* [2 3]", {30, 40}, "A=30, B=40", ""},
                    {"A@3+1* [0 1]; B@3+1* [2 3]", {31, 41}, "A=31, B=41", ""},
                    // A needs a third block: B (admitted last) is preempted; A takes B's tail
                    // (cached, evicted). A step that preempts admits nobody.
                    {"A@4+1* [0 1 3]", {32}, "A=32", "2c"},
                    // B (prompt now 20 21 22 40 41) finds only block 2 cached and cannot get
                    // the two more it needs.
                    {"A@5+1* [0 1 3]", {33}, "A=33 length", "2c 3c 1c 0c"},
                    // B recomputes from its cached first block; its generated tokens are prompt.
                    {"B@2+3* [2 3 1]", {42}, "B=42", "0c"},
                    {"B@5+1* [2 3 1]", {43}, "B=43 length", "0c 1c 3c 2c"},
                });
  EXPECT_EQ(sim.sched().stats().preemptions, 1u);
  EXPECT_EQ(sim.lastEvent('B').completion_tokens, 4u);
  EXPECT_EQ(sim.lastEvent('B').prompt_tokens, 3u);
  EXPECT_EQ(sim.lastEvent('B').cached_prompt_tokens, 0u);  // counted at first admission only
}

TEST(StepScheduler, TheLastRunningSequencePreemptsItself) {
  // B needs a second block, none is free, and B is the most recently admitted: B is the victim
  // of its own allocation and waits; A, which needs nothing new, goes on.
  Sim sim(sync(), limits(3, 2, 6));
  sim.add('A', gp({10, 11, 12}, 8));
  sim.add('B', gp({20, 21}, 8));
  runTable(sim, {
                    {"A@0+3* [0 1]; B@0+2* [2]", {30, 40}, "A=30, B=40", ""},
                    {"A@3+1* [0 1]", {31}, "A=31", "2c"},
                });
  EXPECT_EQ(sim.sched().waiting().size(), 1u);
  EXPECT_EQ(sim.sched().stats().preemptions, 1u);
  EXPECT_EQ(sim.sched().seq(sim.id('B')).tokens, (std::vector<int32_t>{20, 21, 40}));
}

// Block groups (rose --dp): a sequence that cannot grow preempts the latest admitted sequence
// of its own group — here itself — and the sequences of the other group go on in the same step
// (one group would have preempted C, then B, then A, and run nothing).
TEST(StepScheduler, PreemptionStaysInsideTheBlockGroup) {
  LlmWorkerLimits l = limits(8, 2, 16);  // group 0: blocks 0-3, group 1: 4-7
  l.kv_block_groups = 2;
  Sim sim(sync(), l);
  sim.add('A', gp(range(7, 10), 6));  // 7 tokens: all of group 0
  sim.add('B', gp({20, 21}, 6));       // group 1 has every free block
  sim.add('C', gp({30, 31}, 6));
  runTable(sim, {
                    {"A@0+7* [0 1 2 3]; B@0+2* [4]; C@0+2* [5]", {50, 60, 70},
                     "A=50, B=60, C=70", "6 7"},
                    {"A@7+1* [0 1 2 3]; B@2+1* [4 6]; C@2+1* [5 7]", {51, 61, 71},
                     "A=51, B=61, C=71", ""},
                    // A needs a fifth block; group 0 has none and A is its latest sequence.
                    {"B@3+1* [4 6]; C@3+1* [5 7]", {62, 72}, "B=62, C=72", "3c 2c 1c 0c"},
                });
  EXPECT_EQ(sim.sched().stats().preemptions, 1u);
  EXPECT_EQ(sim.sched().waiting().size(), 1u);
  EXPECT_EQ(sim.sched().seq(sim.id('A')).tokens.size(), 9u);
}

// [TAG_DP_ADMIT] Block groups: a prompt whose cached prefix lies in a group without room for it
// starts in a group with room (computing the prefix again) instead of waiting while that group
// idles. Before the change Q waited behind A until A ended.
TEST(StepScheduler, PrefixInAFullGroupStartsInAnotherGroup) {
  LlmWorkerLimits l = limits(8, 2, 16);  // group 0: blocks 0-3, group 1: 4-7
  l.kv_block_groups = 2;
  Sim sim(sync(), l);
  sim.add('P', gp(range(5, 10), 1));  // caches blocks 0 and 1 (tokens 10-13) in group 0
  runTable(sim, {{"P@0+5* [0 1 2]", {50}, "P=50 length", "2 3 1c 0c 4 5 6 7"}});
  sim.add('A', gp(range(3, 40), 10));  // group 0 again (both idle, as many free blocks)
  runTable(sim, {{"A@0+3* [2 3]", {60}, "A=60", "1c 0c 4 5 6 7"}});
  // Q starts with P's 4 cached tokens, in group 0, which has no block for Q's third one.
  sim.add('Q', gp(range(6, 10), 10));
  runTable(sim, {{"A@3+1* [2 3]; Q@0+6* [4 5 6]", {61, 70}, "A=61, Q=70", "1c 0c 7"}});
  EXPECT_EQ(sim.sched().stats().dp_prefix_forgone, 1u);
  EXPECT_EQ(sim.sched().stats().cached_prompt_tokens, 0u);  // Q's hit was given up
  EXPECT_TRUE(sim.sched().waiting().empty());
}

// [TAG_DP_ADMIT] Block groups: a new sequence goes to the group with the fewest running
// sequences that has room, not to the one with the most free blocks: N joins L's group (one
// long sequence, three free blocks) rather than S and T's (two short ones, six free blocks).
TEST(StepScheduler, NewSequencesGoToTheLeastLoadedGroup) {
  LlmWorkerLimits l = limits(16, 2, 32);  // group 0: blocks 0-7, group 1: 8-15
  l.kv_block_groups = 2;
  Sim sim(sync(), l);
  sim.add('L', gp(range(9, 10), 10));
  sim.add('S', gp(range(2, 40), 10));
  sim.add('T', gp(range(2, 50), 10));
  sim.add('N', gp(range(2, 60), 10));
  EXPECT_EQ(sim.schedule(), "L@0+9* [0 1 2 3 4]; S@0+2* [8]; T@0+2* [9]; N@0+2* [5]");
  EXPECT_EQ(sim.sched().stats().dp_prefix_forgone, 0u);
}

TEST(StepScheduler, StopEosLengthAndContext) {
  Sim sim(sync(), limits(16, 4, 8));
  auto stop = gp({10, 11}, 10);
  stop.stop_token_ids = {77};
  sim.add('S', stop);
  sim.add('E', gp({20, 21}, 10));
  auto ign = gp({30, 31}, 2);
  ign.ignore_eos = true;
  sim.add('I', ign);
  sim.add('C', gp({40, 41, 42, 43, 44}, 0));  // until the context (8) is full
  runTable(sim, {
                    {"S@0+2* [0]; E@0+2* [1]; I@0+2* [2]; C@0+5* [3 4]",
                     {5, 6, kEos, 7},
                     "S=5, E=6, I=2, C=7",
                     "5 6 7 8 9 10 11 12 13 14 15"},
                    // Ended sequences' partial blocks go to the front, the last ended first.
                    {"S@2+1* [0]; E@2+1* [1]; I@2+1* [2]; C@5+1* [3 4]",
                     {77, kEos, kEos, 8},
                     "S=77 stop, E=2 stop, I=2 length, C=8",
                     "2 1 0 5 6 7 8 9 10 11 12 13 14 15"},
                    {"C@6+1* [3 4]", {9}, "C=9 length", "4 2 1 0 5 6 7 8 9 10 11 12 13 14 15 3c"},
                });
  EXPECT_EQ(sim.lastEvent('S').token, 77);
  EXPECT_EQ(sim.lastEvent('C').completion_tokens, 3u);
}

TEST(StepScheduler, CancelAndDeadlineFreeBlocksAtOnce) {
  Sim sim(sync(), limits(8, 4, 32));
  sim.add('A', gp(range(5, 10), 10));
  auto d = gp({20, 21}, 10);
  d.deadline_ns = 1'000'000'000;
  sim.add('D', d);
  auto w = gp({30}, 10);
  w.deadline_ns = 1'000'000'000;
  ASSERT_EQ(sim.schedule(), "A@0+5* [0 1]; D@0+2* [2]");
  sim.add('W', w);                            // waiting
  EXPECT_EQ(sim.cancel('A'), "A cancelled");  // while its step is in flight
  EXPECT_EQ(sim.freeQueue(), "0 1 3 4 5 6 7");
  EXPECT_EQ(sim.complete({40, 41}), "D=41");  // A's token is dropped
  EXPECT_EQ(sim.expire(999'999'999), "");
  EXPECT_EQ(sim.expire(1'000'000'000), "D DEADLINE_EXCEEDED, W DEADLINE_EXCEEDED");
  EXPECT_EQ(sim.freeQueue(), "2 0 1 3 4 5 6 7");
  EXPECT_EQ(sim.lastEvent('D').completion_tokens, 1u);
  EXPECT_EQ(sim.lastEvent('A').finish, FinishReason::kCancelled);
  EXPECT_EQ(sim.lastEvent('A').status.code(), StatusCode::kCancelled);
  EXPECT_EQ(sim.cancel('A'), "");  // a finished id: nothing
  EXPECT_FALSE(sim.sched().hasWork());
}

TEST(StepScheduler, RefusedStepEndsItsSequencesOnly) {
  Sim sim(sync(), limits(8, 4, 32));
  sim.add('A', gp({10, 11}, 5));
  ASSERT_EQ(sim.schedule(), "A@0+2* [0]");
  sim.add('B', gp({20, 21}, 5));
  EXPECT_EQ(sim.fail(invalidArgument("num_seqs 9 exceeds max_seqs")), "A INTERNAL");
  EXPECT_NE(sim.lastEvent('A').status.message().find("generation step failed: num_seqs 9"),
            std::string::npos);
  EXPECT_FALSE(sim.sched().needsConfigure());
  ASSERT_EQ(sim.schedule(), "B@0+2* [0]");
  // A result with the wrong number of ids fails the step as INTERNAL.
  EXPECT_EQ(sim.complete({1, 2}), "B INTERNAL");
  EXPECT_NE(sim.lastEvent('B').status.message().find("returned 2 token ids for a step that "
                                                     "sampled 1"),
            std::string::npos)
      << sim.lastEvent('B').status.message();
}

TEST(StepScheduler, LostWorkerEndsRunningSequencesAndNeedsAFreshCache) {
  Sim sim(sync(), limits(8, 4, 32));
  sim.add('A', gp({10, 11}, 5));
  ASSERT_EQ(sim.schedule(), "A@0+2* [0]");
  EXPECT_EQ(sim.complete({30}), "A=30");
  ASSERT_EQ(sim.schedule(), "A@2+1* [0]");
  sim.add('W', gp({20, 21}, 5));
  EXPECT_EQ(sim.fail(unavailable("killed by signal 9")), "A UNAVAILABLE");
  EXPECT_NE(sim.lastEvent('A').status.message().find("killed by signal 9"), std::string::npos);
  EXPECT_TRUE(sim.sched().needsConfigure());
  EXPECT_EQ(sim.schedule(), "-");
  // W waited through it and runs on the rebuilt (empty) cache.
  ASSERT_TRUE(sim.sched().configure(limits(8, 4, 32)));
  EXPECT_EQ(sim.schedule(), "W@0+2* [0]");
  // The worker going down ends waiting sequences too.
  sim.add('X', gp({5}, 1));
  sim.sched().failAll(unavailable("kv lost"), unavailable("not ready"), 0);
  EXPECT_EQ(sim.events(), "W UNAVAILABLE, X UNAVAILABLE");
  EXPECT_EQ(sim.lastEvent('X').status.message(), "not ready");
  EXPECT_TRUE(sim.sched().needsConfigure());
  EXPECT_FALSE(sim.sched().configure(limits(8, 4, 32)));  // W's step is still out
  EXPECT_EQ(sim.complete({1}), "");
  EXPECT_TRUE(sim.sched().configure(limits(8, 4, 32)));
}

TEST(StepScheduler, WaitingQueueLimit) {
  LlmSchedulerOptions o = sync();
  o.max_waiting_tokens = 5;
  LlmStepScheduler s(o);
  ASSERT_TRUE(s.add(gp({1, 2, 3}, 1), 0).isOk());
  auto r = s.add(gp({1, 2, 3}, 1), 0);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("limit 5"), std::string::npos);
  // Once running, a prompt no longer counts.
  ASSERT_TRUE(s.configure(limits(8, 4, 32)));
  ASSERT_FALSE(s.schedule(0).empty());
  EXPECT_TRUE(s.add(gp({1, 2, 3}, 1), 0).isOk());
}

TEST(StepScheduler, StepsStayWithinTheArenaAndTheWorkersLimits) {
  LlmWorkerLimits l = limits(16, 4, 32);
  l.input_bytes = shm::llmStepBytes(1, 12, 8);  // one sequence per step
  l.max_batch_tokens = 5;                       // below the options' budget
  l.max_seqs = 8;
  Sim sim(sync(), l);
  sim.add('A', gp(range(6, 10), 1));
  sim.add('B', gp(range(3, 50), 1));
  EXPECT_EQ(sim.schedule(), "A@0+5 [0 1]");
  EXPECT_EQ(sim.complete({}), "");
  // A's last token and B's prompt would fit the budget, not the arena: B waits.
  EXPECT_EQ(sim.schedule(), "A@5+1* [0 1]");
}

TEST(StepScheduler, RetractUndoesAPlan) {
  Sim sim(sync(), limits(8, 4, 32));
  sim.add('A', gp({10, 11, 12}, 3));
  const std::string first = sim.schedule();
  sim.retractNewest();
  // A stays admitted with its block; the plan comes out the same.
  EXPECT_EQ(sim.sched().running().size(), 1u);
  EXPECT_EQ(sim.schedule(), first);
  EXPECT_EQ(sim.complete({5}), "A=5");
}

// ---- Two steps in flight [TAG_LLM_PREV_TOKEN] -------------------------------------------------

TEST(StepSchedulerAsync, PlaceholdersThenRealTokensThenCacheHit) {
  Sim sim(async(), limits(8, 4, 32));
  sim.add('A', gp(range(6, 10), 3));
  ASSERT_EQ(sim.schedule(), "A@0+6* [0 1]");
  // Planned before step 1's result: A's next token is row 0 of step 1's ids.
  ASSERT_EQ(sim.schedule(), "A@6+1*^0 [0 1]");
  EXPECT_EQ(sim.tokens(), (std::vector<int32_t>{-1}));
  EXPECT_EQ(sim.sched().seq(sim.id('A')).pending, 2u);
  EXPECT_EQ(sim.schedule(), "-");  // two in flight
  EXPECT_EQ(sim.complete({20}), "A=20");
  ASSERT_EQ(sim.schedule(), "A@7+1*^0 [0 1]");
  EXPECT_EQ(sim.complete({21}), "A=21");
  // A's third token is pending and max_tokens is 3: nothing more is planned for it.
  EXPECT_EQ(sim.schedule(), "-");
  // Block 1 (14 15 20 21) filled with known tokens only when step 3's result came: it is hashed
  // with the real ids, so a prompt that continues A's stream hits both blocks.
  EXPECT_FALSE(sim.sched().kv()->isCached(1));
  EXPECT_EQ(sim.complete({22}), "A=22 length");
  EXPECT_EQ(sim.freeQueue(), "2 3 4 5 6 7 1c 0c");
  sim.add('B', gp({10, 11, 12, 13, 14, 15, 20, 21, 99}, 1));
  EXPECT_EQ(sim.schedule(), "B@8+1* [0 1 2]");
}

TEST(StepSchedulerAsync, EosDropsTheSpeculativeTokenAndFreesAtOnce) {
  Sim sim(async(), limits(8, 4, 32));
  sim.add('A', gp({10, 11, 12}, 10));
  ASSERT_EQ(sim.schedule(), "A@0+3* [0]");
  ASSERT_EQ(sim.schedule(), "A@3+1*^0 [0]");
  EXPECT_EQ(sim.complete({kEos}), "A=2 stop");
  EXPECT_EQ(sim.freeQueue(), "0 1 2 3 4 5 6 7");
  // The freed block goes to the next plan while step 2 (which writes A's position 3 into it)
  // is still out: the worker runs steps in order, so B's writes come after.
  sim.add('B', gp({20, 21, 22}, 10));
  ASSERT_EQ(sim.schedule(), "B@0+3* [0]");
  EXPECT_EQ(sim.complete({55}), "");  // A's speculative token: dropped, never streamed
  EXPECT_EQ(sim.complete({60}), "B=60");
  EXPECT_EQ(sim.sched().stats().generated_tokens, 2u);
  EXPECT_EQ(sim.lastEvent('A').completion_tokens, 1u);
}

TEST(StepSchedulerAsync, LengthAndContextLimitsPlanNothingPastThem) {
  Sim sim(async(), limits(4, 4, 8));
  sim.add('A', gp({10, 11, 12, 13, 14}, 0));  // until the context (8)
  ASSERT_EQ(sim.schedule(), "A@0+5* [0 1]");
  ASSERT_EQ(sim.schedule(), "A@5+1*^0 [0 1]");
  EXPECT_EQ(sim.complete({30}), "A=30");
  ASSERT_EQ(sim.schedule(), "A@6+1*^0 [0 1]");
  EXPECT_EQ(sim.complete({31}), "A=31");
  EXPECT_EQ(sim.schedule(), "-");  // its pending token makes 8: the context is full
  EXPECT_EQ(sim.complete({32}), "A=32 length");
  EXPECT_EQ(sim.freeQueue(), "1 2 3 0c");  // block 1 holds 3 computed tokens: not cached
}

TEST(StepSchedulerAsync, StopTokenInStepNWhileStepNPlusOneCarriesOthers) {
  Sim sim(async(), limits(8, 4, 32));
  auto a = gp({10, 11}, 10);
  a.stop_token_ids = {77};
  sim.add('A', a);
  sim.add('B', gp({20, 21}, 10));
  ASSERT_EQ(sim.schedule(), "A@0+2* [0]; B@0+2* [1]");
  ASSERT_EQ(sim.schedule(), "A@2+1*^0 [0]; B@2+1*^1 [1]");
  EXPECT_EQ(sim.complete({77, 40}), "A=77 stop, B=40");
  ASSERT_EQ(sim.schedule(), "B@3+1*^1 [1]");  // B was row 1 of step 2
  EXPECT_EQ(sim.complete({99, 41}), "B=41");  // A's 99 dropped
  EXPECT_EQ(sim.complete({42}), "B=42");
  EXPECT_EQ(sim.lastEvent('A').completion_tokens, 1u);
}

TEST(StepSchedulerAsync, PreemptionWhileTwoStepsAreOutKeepsAccountingExact) {
  // The sync PreemptionByRecomputeTable's requests with two steps in flight.
  Sim sim(async(), limits(4, 2, 16));
  sim.add('A', gp({10, 11, 12}, 4));
  sim.add('B', gp({20, 21, 22}, 4));
  ASSERT_EQ(sim.schedule(), "A@0+3* [0 1]; B@0+3* [2 3]");
  ASSERT_EQ(sim.schedule(), "A@3+1*^0 [0 1]; B@3+1*^1 [2 3]");
  EXPECT_EQ(sim.complete({30, 40}), "A=30, B=40");
  // A needs a third block while step 2 is out: B is preempted; its pending token (step 2) is
  // dropped with its KV; A takes B's uncached tail.
  ASSERT_EQ(sim.schedule(), "A@4+1*^0 [0 1 3]");
  EXPECT_EQ(sim.freeQueue(), "2c");
  EXPECT_EQ(sim.sched().seq(sim.id('B')).tokens, (std::vector<int32_t>{20, 21, 22, 40}));
  EXPECT_EQ(sim.complete({31, 41}), "A=31");      // B's 41 is stale: never streamed
  ASSERT_EQ(sim.schedule(), "A@5+1*^0 [0 1 3]");  // B still cannot get its blocks
  EXPECT_EQ(sim.complete({32}), "A=32");
  EXPECT_EQ(sim.schedule(), "-");  // A's 4th token is pending; B still waits
  EXPECT_EQ(sim.complete({33}), "A=33 length");
  EXPECT_EQ(sim.freeQueue(), "2c 3c 1c 0c");
  // B recomputes from its cached first block and samples its 2nd token again.
  ASSERT_EQ(sim.schedule(), "B@2+2* [2 3]");
  EXPECT_EQ(sim.tokens(), (std::vector<int32_t>{22, 40}));
  ASSERT_EQ(sim.schedule(), "B@4+1*^0 [2 3 1]");
  EXPECT_EQ(sim.complete({41}), "B=41");
  EXPECT_EQ(sim.complete({42}), "B=42");
  EXPECT_EQ(sim.cancel('B'), "B cancelled");
  EXPECT_EQ(sim.sched().kv()->blocksFree(), 4u);
  EXPECT_EQ(sim.sched().stats().preemptions, 1u);
}

TEST(StepSchedulerAsync, FailureOfStepNWithStepNPlusOneOut) {
  Sim sim(async(), limits(8, 4, 32));
  sim.add('A', gp({10, 11}, 10));
  sim.add('B', gp({20, 21}, 10));
  ASSERT_EQ(sim.schedule(), "A@0+2* [0]; B@0+2* [1]");
  ASSERT_EQ(sim.schedule(), "A@2+1*^0 [0]; B@2+1*^1 [1]");
  sim.add('W', gp({30}, 1));
  EXPECT_EQ(sim.fail(unavailable("rose worker was killed by signal 9")),
            "A UNAVAILABLE, B UNAVAILABLE");
  EXPECT_EQ(sim.sched().kv()->blocksFree(), 8u);
  EXPECT_TRUE(sim.sched().needsConfigure());
  EXPECT_FALSE(sim.sched().configure(limits(8, 4, 32)));  // step 2 is still out
  EXPECT_EQ(sim.fail(unavailable("rose worker was killed by signal 9")), "");
  ASSERT_TRUE(sim.sched().configure(limits(8, 4, 32)));
  EXPECT_EQ(sim.schedule(), "W@0+1* [0]");
}

TEST(StepSchedulerAsync, RefusedStepNEndsItsSequencesAndStepNPlusOnesNewcomerGoesOn) {
  Sim sim(async(), limits(8, 4, 32));
  sim.add('A', gp({10, 11}, 10));
  ASSERT_EQ(sim.schedule(), "A@0+2* [0]");
  sim.add('B', gp({20, 21}, 10));
  ASSERT_EQ(sim.schedule(), "A@2+1*^0 [0]; B@0+2* [1]");
  EXPECT_EQ(sim.fail(invalidArgument("block id 99 out of range")), "A INTERNAL");
  // Step 2's ids: A's is stale (rose resolved A's prev_row from the last step it ran, the one
  // before the refused step); B's stands.
  EXPECT_EQ(sim.complete({1, 40}), "B=40");
  ASSERT_EQ(sim.schedule(), "B@2+1* [1]");
  ASSERT_EQ(sim.schedule(), "B@3+1*^0 [1]");
}

TEST(StepSchedulerAsync, CancelAndDeadlineWithTwoStepsOut) {
  Sim sim(async(), limits(8, 4, 32));
  sim.add('A', gp({10, 11}, 10));
  auto d = gp({20, 21}, 10);
  d.deadline_ns = 5'000'000'000;
  sim.add('D', d);
  ASSERT_EQ(sim.schedule(), "A@0+2* [0]; D@0+2* [1]");
  ASSERT_EQ(sim.schedule(), "A@2+1*^0 [0]; D@2+1*^1 [1]");
  EXPECT_EQ(sim.cancel('A'), "A cancelled");
  EXPECT_EQ(sim.freeQueue(), "0 2 3 4 5 6 7");
  EXPECT_EQ(sim.complete({30, 40}), "D=40");
  EXPECT_EQ(sim.expire(5'000'000'000), "D DEADLINE_EXCEEDED");
  EXPECT_EQ(sim.complete({31, 41}), "");
  EXPECT_EQ(sim.sched().kv()->blocksFree(), 8u);
  EXPECT_EQ(sim.lastEvent('D').completion_tokens, 1u);
}

TEST(StepSchedulerAsync, RetractRestoresThePlaceholderChain) {
  Sim sim(async(), limits(8, 4, 32));
  sim.add('A', gp({10, 11}, 10));
  sim.add('B', gp({20, 21}, 10));
  ASSERT_EQ(sim.schedule(), "A@0+2* [0]; B@0+2* [1]");
  const std::string second = sim.schedule();
  ASSERT_EQ(second, "A@2+1*^0 [0]; B@2+1*^1 [1]");
  sim.retractNewest();
  EXPECT_EQ(sim.sched().seq(sim.id('B')).pending, 1u);
  EXPECT_EQ(sim.schedule(), second);
  EXPECT_EQ(sim.complete({30, 40}), "A=30, B=40");
  EXPECT_EQ(sim.complete({31, 41}), "A=31, B=41");
}

TEST(StepSchedulerAsync, OffMeansOneStepInFlight) {
  Sim sim(sync(), limits(8, 4, 32));
  sim.add('A', gp({10, 11}, 10));
  ASSERT_EQ(sim.schedule(), "A@0+2* [0]");
  EXPECT_EQ(sim.schedule(), "-");
  EXPECT_EQ(sim.sched().maxStepsInFlight(), 1u);
}

// ---- Many random requests through the fake model, both modes -----------------------------------

struct Req {
  GenerateParams params;
  std::vector<int32_t> want;  // the reference stream
  FinishReason want_finish = FinishReason::kNone;
};

struct Outcome {
  std::map<SeqId, std::vector<int32_t>> tokens;
  std::map<SeqId, GenerateEvent> last;
  size_t placeholders = 0;  // sequences planned from a placeholder
  size_t events_after_last = 0;
  uint64_t dp_prefix_forgone = 0;  // LlmStats [TAG_DP_ADMIT]
};

// Runs `reqs` to the end: the fake model runs each step when its result is taken, in plan order,
// resolving prev_row from the step it ran before (as rose does). With async_steps, up to two
// plans are out; cancel_at: (step count, request index) pairs cancelled after that many results.
// [TAG_KV_WINDOW_GROUP] What a sliding-window layer would see: every step's new tokens are
// written through both tables (each plan's block table and its window table) into two slot
// arrays, and every query position q of the step must read keys q - W + 1 .. q through its
// window table, equal to what the full table holds there — so a window table with a hole where
// the window still reads, a block reused while still read or a wrong prefix hit fails it.
class WindowShadow {
 public:
  WindowShadow(const LlmWorkerLimits& l)
      : bs_(l.kv_block_size),
        window_(l.kv_window),
        full_(uint64_t{l.kv_num_blocks} * l.kv_block_size, -1),
        win_(uint64_t{l.kv_num_blocks_window} * l.kv_block_size, -1) {}

  // Checks and applies plan `p`; `sampled` are the ids the engine returned for it.
  void step(const StepPlan& p, const std::vector<int32_t>& sampled) {
    for (size_t i = 0; i < p.seqs.size(); ++i) {
      const llm::LlmStepSeq& d = p.seqs[i];
      ASSERT_EQ(d.window_table, 1);
      ASSERT_LE(size_t(d.block_offset) + 2 * size_t(d.num_blocks), p.block_ids.size());
      auto table = std::span<const int32_t>(p.block_ids).subspan(d.block_offset, d.num_blocks);
      auto wt = std::span<const int32_t>(p.block_ids).subspan(d.block_offset + d.num_blocks, d.num_blocks);
      for (int32_t k = 0; k < d.num_tokens; ++k) {
        const int32_t id = k == 0 && d.prev_row >= 0 ? prev_[d.prev_row] : p.tokens[d.token_offset + k];
        const uint64_t pos = uint64_t(d.position) + k;
        ASSERT_GE(wt[pos / bs_], 0) << "seq " << i << " writes position " << pos << " into a hole";
        full_[slot(table, pos)] = id;
        win_[slot(wt, pos)] = id;
      }
      if (wt.size() > 0 && wt[0] < 0) ++holes_;
    }
    for (size_t i = 0; i < p.seqs.size(); ++i) {
      const llm::LlmStepSeq& d = p.seqs[i];
      auto table = std::span<const int32_t>(p.block_ids).subspan(d.block_offset, d.num_blocks);
      auto wt = std::span<const int32_t>(p.block_ids).subspan(d.block_offset + d.num_blocks, d.num_blocks);
      for (int32_t k = 0; k < d.num_tokens; ++k) {
        const uint64_t q = uint64_t(d.position) + k;
        for (uint64_t j = q + 1 > window_ ? q + 1 - window_ : 0; j <= q; ++j) {
          ASSERT_GE(wt[j / bs_], 0) << "seq " << i << " query " << q << " reads a hole at " << j;
          ASSERT_EQ(win_[slot(wt, j)], full_[slot(table, j)])
              << "seq " << i << " query " << q << " key " << j;
        }
      }
    }
    prev_ = sampled;
  }
  size_t holes() const { return holes_; }

 private:
  uint64_t slot(std::span<const int32_t> table, uint64_t pos) const {
    return uint64_t(table[pos / bs_]) * bs_ + pos % bs_;
  }
  uint32_t bs_, window_;
  std::vector<int32_t> full_, win_, prev_;
  size_t holes_ = 0;  // sequences planned with dropped window blocks
};

Outcome runModel(const LlmSchedulerOptions& opts, const LlmWorkerLimits& l,
                 const std::vector<Req>& reqs,
                 const std::vector<std::pair<size_t, size_t>>& cancel_at = {},
                 size_t* window_holes = nullptr) {
  Outcome out;
  LlmStepScheduler s(opts);
  EXPECT_TRUE(s.configure(l));
  testing::FakeLlmEngine engine(l.kv_num_blocks, l.kv_block_size, kVocab);
  std::optional<WindowShadow> shadow;
  if (l.kv_num_blocks_window > 0) shadow.emplace(l);
  std::vector<SeqId> ids;
  int64_t now = 1;
  for (const Req& r : reqs) ids.push_back(*s.add(r.params, now));
  std::deque<StepPlan> out_plans;
  size_t results = 0;
  auto drain = [&] {
    for (SeqEvent& e : s.takeEvents()) {
      if (out.last.count(e.id)) ++out.events_after_last;
      if (e.event.token >= 0) out.tokens[e.id].push_back(e.event.token);
      if (e.event.last) out.last[e.id] = e.event;
    }
    EXPECT_TRUE(s.kv()->checkInvariants().isOk()) << s.kv()->checkInvariants().toString();
    EXPECT_EQ(s.kv()->numSeqs(), s.running().size());
    if (const KvBlockManager* w = s.kvWindow()) {
      EXPECT_TRUE(w->checkInvariants().isOk()) << w->checkInvariants().toString();
      EXPECT_EQ(w->numSeqs(), s.running().size());
    }
  };
  for (int guard = 0; guard < 100000 && (s.hasWork() || !out_plans.empty()); ++guard) {
    while (true) {
      StepPlan p = s.schedule(++now);
      drain();
      if (p.empty()) break;
      for (const auto& d : p.seqs) out.placeholders += d.prev_row >= 0 ? 1 : 0;
      out_plans.push_back(std::move(p));
    }
    if (out_plans.empty()) {
      ADD_FAILURE() << "work left but nothing planned";
      break;
    }
    StepPlan p = std::move(out_plans.front());
    out_plans.pop_front();
    auto ids_or = engine.step(p.seqs, p.tokens, p.block_ids);
    if (!ids_or.isOk()) {
      ADD_FAILURE() << "the fake model refused a step: " << ids_or.status().toString();
      s.stepFailed(p, ids_or.status(), ++now);
    } else {
      if (shadow) shadow->step(p, *ids_or);
      s.update(p, *ids_or, ++now);
    }
    ++results;
    for (auto [at, idx] : cancel_at)
      if (at == results) s.cancel(ids[idx], ++now);
    drain();
  }
  EXPECT_FALSE(s.hasWork());
  EXPECT_EQ(s.kv()->blocksFree(), l.kv_num_blocks);
  if (s.kvWindow()) {
    EXPECT_EQ(s.kvWindow()->blocksFree(), l.kv_num_blocks_window);
  }
  EXPECT_EQ(s.stepsInFlight(), 0u);
  if (window_holes && shadow) *window_holes = shadow->holes();
  out.dp_prefix_forgone = s.stats().dp_prefix_forgone;
  return out;
}

std::vector<Req> randomRequests(uint32_t seed, size_t n, uint32_t context_len) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prefixes = {range(5, 100), range(7, 100), range(3, 300)};
  std::vector<Req> reqs;
  for (size_t i = 0; i < n; ++i) {
    Req r;
    std::vector<int32_t> prompt = prefixes[rng() % prefixes.size()];
    for (uint32_t k = rng() % 5; k > 0; --k)
      prompt.push_back(3 + static_cast<int32_t>(rng() % 900));
    const uint32_t max_tokens = rng() % 4 == 0 ? 0 : 1 + rng() % 10;
    r.params = gp(prompt, max_tokens);
    if (i % 3 == 0) {
      r.params.sampling.temperature = 1.f;
      r.params.sampling.seed = 1000 + i;
    }
    const uint32_t room = context_len - static_cast<uint32_t>(prompt.size());
    const uint32_t n_out = max_tokens == 0 ? room : std::min(max_tokens, room);
    std::vector<int32_t> full = testing::fakeReference(prompt, n_out, r.params.sampling, kVocab);
    // Every 4th request stops at a token of its own stream (the stop token is the last one).
    if (i % 4 == 1 && full.size() > 2) r.params.stop_token_ids = {full[full.size() / 2]};
    r.want =
        testing::fakeReference(prompt, n_out, r.params.sampling, kVocab, r.params.stop_token_ids);
    const bool stopped =
        !r.params.stop_token_ids.empty() && r.want.back() == r.params.stop_token_ids[0];
    r.want_finish = stopped ? FinishReason::kStop : FinishReason::kLength;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// [TAG_DP_ADMIT] The same over 2 and 4 block groups (rose --dp): prefix hits per group, the
// fallback to another group when the prefix's group is full, placement by load, preemption inside
// a group; the fake model checks every block's contents, checkInvariants that no table straddles
// groups.
TEST(StepSchedulerModel, BlockGroupStreamsEqualTheReference) {
  uint64_t forgone = 0;
  for (uint32_t groups : {2u, 4u}) {
    LlmWorkerLimits l = limits(32, 2, 16);
    l.kv_block_groups = groups;
    l.context_len = std::min<uint32_t>(16, 32 / groups * 2);
    for (uint32_t seed : {1u, 2u, 3u, 4u}) {
      SCOPED_TRACE("groups " + std::to_string(groups) + ", seed " + std::to_string(seed));
      const std::vector<Req> reqs = randomRequests(seed, 32, l.context_len);
      for (const LlmSchedulerOptions& o : {sync(16, 4), async(16, 4)}) {
        const Outcome a = runModel(o, l, reqs);
        forgone += a.dp_prefix_forgone;
        for (size_t i = 0; i < reqs.size(); ++i) {
          const SeqId id = i + 1;
          EXPECT_EQ(a.tokens.at(id), reqs[i].want) << "request " << i;
          EXPECT_EQ(a.last.at(id).finish, reqs[i].want_finish) << i;
        }
        EXPECT_EQ(a.events_after_last, 0u);
      }
    }
  }
  std::cout << "[ dp admit ] prefixes given up for another group: " << forgone << "\n";
  EXPECT_GT(forgone, 0u) << "the runs never took the fallback";
}

TEST(StepSchedulerModel, SyncAndAsyncStreamsEqualTheReference) {
  // Tiny pool (preemption), small budget (chunked prefill), shared prefixes (cache hits), seeded
  // sampling; eos is outside the fake's range [3, vocab), so streams end by stop or length.
  const LlmWorkerLimits l = limits(16, 2, 32);
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::vector<Req> reqs = randomRequests(seed, 24, 32);
    const Outcome a = runModel(sync(16, 4), l, reqs);
    const Outcome b = runModel(async(16, 4), l, reqs);
    EXPECT_EQ(a.placeholders, 0u);
    EXPECT_GT(b.placeholders, 0u);  // steps did overlap
    for (size_t i = 0; i < reqs.size(); ++i) {
      const SeqId id = i + 1;
      EXPECT_EQ(a.tokens.at(id), reqs[i].want) << "sync, request " << i;
      EXPECT_EQ(b.tokens.at(id), reqs[i].want) << "async, request " << i;
      EXPECT_EQ(a.last.at(id).finish, reqs[i].want_finish) << i;
      EXPECT_EQ(b.last.at(id).finish, reqs[i].want_finish) << i;
      EXPECT_EQ(b.last.at(id).completion_tokens, reqs[i].want.size()) << i;
    }
    EXPECT_EQ(a.events_after_last + b.events_after_last, 0u);
  }
}

// [TAG_KV_WINDOW_GROUP] With a pool for sliding-window layers (window 4 tokens, blocks of 2, a
// pool smaller than the full one: trims, window preemptions, joint prefix hits, forks of
// choices): the streams still equal the reference in both modes, every query's window reads the
// tokens the full table holds (WindowShadow), and both pools come back whole.
TEST(StepSchedulerModel, WindowGroupKeepsTheWindowAndTheStreams) {
  LlmWorkerLimits l = limits(16, 2, 32);
  l.kv_num_blocks_window = 10;
  l.kv_window = 4;
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::vector<Req> reqs = randomRequests(seed, 24, 32);
    if (seed == 4) {  // choices: followers fork their leader's blocks, both tables
      for (size_t i = 0; i < reqs.size(); i += 5) reqs[i].params.n = 2;
    }
    for (bool is_async : {false, true}) {
      SCOPED_TRACE(is_async ? "async" : "sync");
      size_t holes = 0;
      const Outcome o = runModel(is_async ? async(16, 4) : sync(16, 4), l, reqs, {}, &holes);
      EXPECT_GT(holes, 0u) << "no window block was ever dropped";
      EXPECT_EQ(o.events_after_last, 0u);
      // Ids are handed out in order, n per request; choice 0 is the reference stream, and so is
      // every other choice of a greedy request (choice c samples with seed + c).
      SeqId next = 1;
      size_t forked = 0;
      for (size_t i = 0; i < reqs.size(); ++i) {
        const uint32_t n = std::max<uint32_t>(1, reqs[i].params.n);
        for (uint32_t c = 0; c < n; ++c) {
          const SeqId id = next + c;
          if (c > 0 && reqs[i].params.sampling.temperature > 0) continue;
          ASSERT_TRUE(o.tokens.count(id)) << "request " << i << " choice " << c;
          EXPECT_EQ(o.tokens.at(id), reqs[i].want) << "request " << i << " choice " << c;
          EXPECT_EQ(o.last.at(id).finish, reqs[i].want_finish) << i;
          forked += c > 0 ? 1 : 0;
        }
        next += n;
      }
      if (seed == 4) {
        EXPECT_GT(forked, 0u);
      }
    }
  }
}

TEST(StepSchedulerModel, CancellationsInBothModesLeaveExactAccounting) {
  const LlmWorkerLimits l = limits(12, 2, 24);
  const std::vector<Req> reqs = randomRequests(9, 16, 24);
  std::vector<std::pair<size_t, size_t>> cancels = {{1, 0}, {2, 3}, {4, 5}, {7, 8}, {9, 15}};
  for (bool is_async : {false, true}) {
    SCOPED_TRACE(is_async ? "async" : "sync");
    const Outcome o = runModel(is_async ? async(16, 4) : sync(16, 4), l, reqs, cancels);
    EXPECT_EQ(o.events_after_last, 0u);
    for (size_t i = 0; i < reqs.size(); ++i) {
      const SeqId id = i + 1;
      ASSERT_TRUE(o.last.count(id)) << i;
      const auto& got = o.tokens.count(id) ? o.tokens.at(id) : std::vector<int32_t>{};
      // Every stream is a prefix of its reference; the uncancelled ones are all of it.
      ASSERT_LE(got.size(), reqs[i].want.size()) << i;
      EXPECT_TRUE(std::equal(got.begin(), got.end(), reqs[i].want.begin())) << i;
      if (o.last.at(id).finish != FinishReason::kCancelled) {
        EXPECT_EQ(got, reqs[i].want) << i;
      }
    }
  }
}

// Structured outputs [TAG_TOKEN_MASK]: a constrained sequence carries its token bitmask in every
// step that samples it, the mask follows the grammar as its tokens come back, it is never
// planned ahead of its pending token (its next mask depends on it) while an unconstrained
// neighbour is (constrained_overlap), and the end token is allowed only once the value is
// complete.
TEST(StepSchedulerAsync, ConstrainedSequenceCarriesItsMaskAndWaitsForItsToken) {
  std::vector<std::string> toks = enumTokens(kVocab);
  toks[35] = "x";
  auto compiled = compileSchema(R"({"enum":["ab","ac"]})", testVocab(toks));
  ASSERT_TRUE(compiled.isOk());
  LlmWorkerLimits l = limits(8, 4, 32);
  l.vocab = kVocab;
  LlmSchedulerOptions o = async();
  o.constrained_overlap = true;
  Sim sim(o, l);
  GenerateParams a = gp(range(3, 10), 10);
  a.grammar = *compiled;
  a.constraint.end_tokens = {kEos};
  sim.add('A', std::move(a));
  sim.add('B', gp(range(3, 10), 10));
  auto allowed = [&]() {
    const StepPlan& p = sim.lastPlan();
    std::vector<int32_t> ids;
    for (const auto& d : p.seqs) {
      if (d.mask_index <= 0) continue;
      const size_t w = (kVocab + 31) / 32;
      EXPECT_EQ(p.masks.size(), w * static_cast<size_t>(d.mask_index));
      for (uint32_t id = 0; id < kVocab; ++id) {
        if ((p.masks[(d.mask_index - 1) * w + id / 32] >> (id % 32)) & 1u) {
          ids.push_back(static_cast<int32_t>(id));
        }
      }
    }
    return ids;
  };
  ASSERT_EQ(sim.schedule(), "A@0+3* [0]; B@0+3* [1]");
  EXPECT_EQ(sim.lastPlan().seqs[1].mask_index, 0);
  EXPECT_EQ(allowed(), (std::vector<int32_t>{30, 34}));
  // Two steps may be out: B goes ahead on a placeholder, A waits for its token.
  ASSERT_EQ(sim.schedule(), "B@3+1*^1 [1]");
  EXPECT_TRUE(sim.lastPlan().masks.empty());
  EXPECT_EQ(sim.complete({34, 40}), "A=34, B=40");  // A wrote "\"a"
  // A's token is known: A goes again, with the mask after "a; B continues ahead of step 2.
  ASSERT_EQ(sim.schedule(), "A@3+1* [0]; B@4+1*^0 [1 2]");
  EXPECT_EQ(allowed(), (std::vector<int32_t>{32, 33}));
  EXPECT_EQ(sim.complete({41}), "B=41");
  EXPECT_EQ(sim.complete({33, 43}), "A=33, B=43");
  ASSERT_EQ(sim.schedule(), "A@4+1* [0 3]; B@5+1* [1 2]");
  EXPECT_EQ(allowed(), (std::vector<int32_t>{30}));  // "ac: only the closing quote
  ASSERT_EQ(sim.schedule(), "B@6+1*^1 [1 2]");
  EXPECT_EQ(sim.complete({30, 44}), "A=30, B=44");
  ASSERT_EQ(sim.schedule(), "A@5+1* [0 3]; B@7+1*^0 [1 2]");
  EXPECT_EQ(allowed(), (std::vector<int32_t>{kEos}));  // complete: only the end token
  EXPECT_EQ(sim.complete({45}), "B=45");
  EXPECT_EQ(sim.complete({kEos, 46}), "A=2 stop, B=46");
}

// [TAG_CONSTRAINED_SYNC] The default: while a constrained sequence waits for its token nothing is
// planned ahead, so it is in every step with its unconstrained neighbour (one step in flight);
// once no constrained sequence is running, steps overlap again.
TEST(StepSchedulerAsync, ConstrainedSequenceHoldsThePlanAheadByDefault) {
  std::vector<std::string> toks(kVocab);
  toks[30] = "\"";
  toks[31] = "a";
  toks[32] = "b";
  auto compiled = compileSchema(R"({"enum":["ab"]})", testVocab(toks));
  ASSERT_TRUE(compiled.isOk());
  LlmWorkerLimits l = limits(8, 4, 32);
  l.vocab = kVocab;
  Sim sim(async(), l);
  GenerateParams a = gp(range(3, 10), 10);
  a.grammar = *compiled;
  a.constraint.end_tokens = {kEos};
  sim.add('A', std::move(a));
  sim.add('B', gp(range(3, 10), 10));
  ASSERT_EQ(sim.schedule(), "A@0+3* [0]; B@0+3* [1]");
  EXPECT_EQ(sim.schedule(), "-");  // A waits for its token: no plan ahead, B waits with it
  EXPECT_EQ(sim.complete({30, 40}), "A=30, B=40");
  ASSERT_EQ(sim.schedule(), "A@3+1* [0]; B@3+1* [1]");
  EXPECT_EQ(sim.schedule(), "-");
  EXPECT_EQ(sim.complete({31, 41}), "A=31, B=41");
  ASSERT_EQ(sim.schedule(), "A@4+1* [0 2]; B@4+1* [1 3]");
  EXPECT_EQ(sim.complete({32, 42}), "A=32, B=42");
  ASSERT_EQ(sim.schedule(), "A@5+1* [0 2]; B@5+1* [1 3]");
  EXPECT_EQ(sim.complete({30, 43}), "A=30, B=43");  // "ab" complete
  ASSERT_EQ(sim.schedule(), "A@6+1* [0 2]; B@6+1* [1 3]");
  EXPECT_EQ(sim.complete({kEos, 44}), "A=2 stop, B=44");
  // A has ended: B alone goes ahead on placeholders again.
  ASSERT_EQ(sim.schedule(), "B@7+1* [1 3]");
  EXPECT_EQ(sim.schedule(), "B@8+1*^0 [1 3 2]");  // A's freed block
}

// The ids mask `mask_index` of `p` allows (kVocab ids).
std::vector<int32_t> allowedIds(const StepPlan& p, int32_t mask_index) {
  std::vector<int32_t> ids;
  const size_t w = (kVocab + 31) / 32;
  EXPECT_GE(p.masks.size(), w * static_cast<size_t>(mask_index));
  for (uint32_t id = 0; id < kVocab; ++id) {
    if ((p.masks[(mask_index - 1) * w + id / 32] >> (id % 32)) & 1u) {
      ids.push_back(static_cast<int32_t>(id));
    }
  }
  return ids;
}

// [TAG_LATE_MASKS] With a worker that takes masks late, a constrained sequence is planned ahead
// of its pending token like any other (both steps in flight carry both sequences): the plan
// marks its mask late and leaves it unfilled; once the step before is applied, fillLateMasks()
// writes the mask the grammar allows after that token.
TEST(StepSchedulerAsync, LateMasksPlanConstrainedSequencesAhead) {
  std::vector<std::string> toks = enumTokens(kVocab);
  auto compiled = compileSchema(R"({"enum":["ab","ac"]})", testVocab(toks));
  ASSERT_TRUE(compiled.isOk());
  LlmWorkerLimits l = limits(8, 4, 32);
  l.vocab = kVocab;
  l.late_masks = true;
  Sim sim(async(), l);
  GenerateParams a = gp(range(3, 10), 10);
  a.grammar = *compiled;
  a.constraint.end_tokens = {kEos};
  sim.add('A', std::move(a));
  sim.add('B', gp(range(3, 10), 10));
  const size_t w = (kVocab + 31) / 32;
  ASSERT_EQ(sim.schedule(), "A@0+3* [0]; B@0+3* [1]");
  EXPECT_TRUE(sim.lastPlan().late.empty());  // A's token is known: filled at planning
  EXPECT_EQ(allowedIds(sim.lastPlan(), 1), (std::vector<int32_t>{30, 34}));
  // A goes ahead on its placeholder with B; its mask is late and not filled yet.
  ASSERT_EQ(sim.schedule(), "A@3+1*^0 [0]; B@3+1*^1 [1]");
  {
    const StepPlan& p = sim.lastPlan();
    ASSERT_EQ(p.late.size(), 1u);
    EXPECT_EQ(p.late[0].seq, 0u);
    EXPECT_EQ(p.late[0].at, 0u);
    EXPECT_EQ(p.seqs[0].mask_index, 1);
    EXPECT_EQ(p.seqs[1].mask_index, 0);
    EXPECT_EQ(p.masks, std::vector<uint32_t>(w, 0u));
  }
  EXPECT_EQ(sim.schedule(), "-");  // two in flight
  EXPECT_EQ(sim.complete({34, 40}), "A=34, B=40");  // A wrote "\"a"
  sim.fillLateMasks();
  EXPECT_EQ(allowedIds(sim.oldestPlan(), 1), (std::vector<int32_t>{32, 33}));
  ASSERT_EQ(sim.schedule(), "A@4+1*^0 [0 2]; B@4+1*^1 [1 3]");
  EXPECT_EQ(sim.lastPlan().late.size(), 1u);
  EXPECT_EQ(sim.complete({33, 41}), "A=33, B=41");
  sim.fillLateMasks();
  EXPECT_EQ(allowedIds(sim.oldestPlan(), 1), (std::vector<int32_t>{30}));  // "ac: the quote
  ASSERT_EQ(sim.schedule(), "A@5+1*^0 [0 2]; B@5+1*^1 [1 3]");
  EXPECT_EQ(sim.complete({30, 42}), "A=30, B=42");
  sim.fillLateMasks();
  EXPECT_EQ(allowedIds(sim.oldestPlan(), 1), (std::vector<int32_t>{kEos}));  // complete
  ASSERT_EQ(sim.schedule(), "A@6+1*^0 [0 2]; B@6+1*^1 [1 3]");
  EXPECT_EQ(sim.complete({kEos, 43}), "A=2 stop, B=43");
  // A ended while its next step was out: that step's late mask allows every token (its draw is
  // dropped), and nothing more of A is planned.
  sim.fillLateMasks();
  EXPECT_EQ(allowedIds(sim.oldestPlan(), 1).size(), static_cast<size_t>(kVocab));
  ASSERT_EQ(sim.schedule(), "B@7+1*^1 [1 3]");
  EXPECT_TRUE(sim.lastPlan().late.empty());
  EXPECT_EQ(sim.complete({99, 44}), "B=44");
  EXPECT_EQ(sim.complete({45}), "B=45");
  const LlmStats st = sim.sched().stats();
  EXPECT_EQ(st.masks, 4u);  // one at planning, three late (the ended one's is not the grammar's)
  EXPECT_EQ(st.masked_steps, 5u);
  EXPECT_EQ(st.late_mask_steps, 4u);
}

// [TAG_LATE_MASKS] The worker sampled without the late masks (it stopped waiting): the step's
// constrained sequences end INTERNAL, the others go on.
TEST(StepSchedulerAsync, LateMasksLostEndTheConstrainedSequences) {
  std::vector<std::string> toks(kVocab);
  toks[30] = "\"";
  toks[31] = "a";
  auto compiled = compileSchema(R"({"type":"string"})", testVocab(toks));
  ASSERT_TRUE(compiled.isOk());
  LlmWorkerLimits l = limits(8, 4, 32);
  l.vocab = kVocab;
  l.late_masks = true;
  Sim sim(async(), l);
  GenerateParams a = gp(range(3, 10), 10);
  a.grammar = *compiled;
  a.constraint.end_tokens = {kEos};
  sim.add('A', std::move(a));
  sim.add('B', gp(range(3, 10), 10));
  ASSERT_EQ(sim.schedule(), "A@0+3* [0]; B@0+3* [1]");
  ASSERT_EQ(sim.schedule(), "A@3+1*^0 [0]; B@3+1*^1 [1]");
  EXPECT_EQ(sim.complete({30, 40}), "A=30, B=40");
  sim.fillLateMasks();
  EXPECT_EQ(sim.lateMasksLost(), "A INTERNAL");
  EXPECT_NE(sim.lastEvent('A').status.message().find("did not reach rose"), std::string::npos);
  EXPECT_EQ(sim.complete({31, 41}), "B=41");  // A's unconstrained token is never streamed
  ASSERT_EQ(sim.schedule(), "B@4+1* [1 0]");  // A's freed block
}

// [TAG_MASK_POOL] With mask helper threads the step's masks are the same words as when the
// scheduler's thread fills them alone: 12 constrained sequences (three schemas, each sequence
// taking a different allowed token every step so their grammar states differ) driven in lockstep
// through a scheduler with mask_threads 0 and one with 3; every plan's masks are compared.
TEST(StepScheduler, MaskThreadsFillTheSameMasks) {
  std::vector<std::string> toks(kVocab);
  const std::string chars = "\"{}[],:0123456789abcdefghijklmnopqrstuvwxyz -.";
  for (size_t i = 0; i < chars.size(); ++i) toks[30 + i] = std::string(1, chars[i]);
  toks[100] = "\"a";
  toks[101] = "true";
  toks[102] = "null";
  auto vocab = testVocab(toks);
  std::vector<std::shared_ptr<const grammar::CompiledGrammar>> grammars;
  for (const char* schema :
       {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a","b"]})",
        R"({"type":"array","items":{"enum":["ab","cd",true,null]}})", R"({"type":"string"})"}) {
    auto c = compileSchema(schema, vocab);
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    grammars.push_back(*c);
  }
  LlmWorkerLimits l = limits(256, 4, 64);
  l.vocab = kVocab;
  LlmSchedulerOptions serial = sync(256, 16), threaded = sync(256, 16);
  threaded.mask_threads = 3;
  Sim a(serial, l), b(threaded, l);
  for (int i = 0; i < 12; ++i) {
    for (Sim* sim : {&a, &b}) {
      GenerateParams p = gp(range(3, 4 + i % 5), 20);
      p.grammar = grammars[static_cast<size_t>(i % 3)];
      p.constraint.end_tokens = {kEos};
      sim->add(static_cast<char>('A' + i), std::move(p));
    }
  }
  const size_t w = (kVocab + 31) / 32;
  size_t most_masks = 0;
  for (int step = 0; step < 12; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::string plan = a.schedule();
    ASSERT_EQ(b.schedule(), plan);
    if (plan == "-") break;
    const StepPlan& pa = a.lastPlan();
    const StepPlan& pb = b.lastPlan();
    ASSERT_EQ(pa.masks, pb.masks);
    most_masks = std::max(most_masks, pa.masks.size() / w);
    // Sequence i samples the (step + i)-th allowed id of its mask (or the end token when its
    // value is complete and only that is allowed), so the sequences walk different paths.
    std::vector<int32_t> ids;
    for (size_t i = 0; i < pa.seqs.size(); ++i) {
      const auto& d = pa.seqs[i];
      if (!d.sample) continue;
      ASSERT_GT(d.mask_index, 0);
      std::vector<int32_t> allowed;
      for (uint32_t id = 0; id < kVocab; ++id) {
        if ((pa.masks[(d.mask_index - 1) * w + id / 32] >> (id % 32)) & 1u) {
          allowed.push_back(static_cast<int32_t>(id));
        }
      }
      ASSERT_FALSE(allowed.empty());
      ids.push_back(allowed[(static_cast<size_t>(step) + i) % allowed.size()]);
    }
    ASSERT_EQ(b.complete(ids), a.complete(ids));
  }
  EXPECT_GE(most_masks, 12u) << "no step had the 12 masks side by side";
}

// Strict function tools [TAG_STRICT_TOOLS]: a request with tool grammars and no response_format
// grammar is a constrained sequence. Its turn prefix (a forced call header) makes the first
// sampled token masked; the mask follows the tool's grammar, allows only <|call|> once the
// arguments are complete, the steps after <|call|> carry no mask, and a later call header
// written by the model switches the mask back on.
TEST(StepScheduler, StrictToolCallBodiesCarryMasksAndFreeTextDoesNot) {
  constexpr int32_t kStart = 900, kChannel = 901, kConstrain = 902, kMessage = 903, kEnd = 904,
                    kCall = 905, kReturn = 906, kEot = 907;
  std::vector<std::string> toks = enumTokens(kVocab);
  toks[35] = "x";
  toks[50] = "commentary to=functions.f";
  toks[51] = "assistant";
  const std::vector<int32_t> special = {kEos,  kStart, kChannel, kConstrain, kMessage,
                                        kEnd,  kCall,  kReturn,  kEot};
  for (int32_t id : special) toks[static_cast<size_t>(id)] = "<|special|>";
  auto compiled = compileSchema(R"({"enum":["ab","ac"]})", testVocab(toks, special));
  ASSERT_TRUE(compiled.isOk());
  LlmWorkerLimits l = limits(8, 4, 64);
  l.vocab = kVocab;
  Sim sim(sync(), l);
  GenerateParams a = gp(range(3, 10), 30);
  a.constraint.tools = {{"f", *compiled}};
  a.constraint.harmony = {kStart, kChannel, kConstrain, kMessage, kEnd, kCall, kReturn, kEot};
  a.constraint.turn_prefix = {kChannel, 50, kMessage};
  ASSERT_TRUE(a.constrained());
  sim.add('A', std::move(a));
  // The ids the last plan's mask allows; empty when it carries no mask.
  auto allowed = [&]() {
    const StepPlan& p = sim.lastPlan();
    std::vector<int32_t> ids;
    EXPECT_EQ(p.seqs.size(), 1u);
    const auto& d = p.seqs.at(0);
    if (d.mask_index <= 0) {
      EXPECT_TRUE(p.masks.empty());
      return ids;
    }
    const size_t w = (kVocab + 31) / 32;
    for (uint32_t id = 0; id < kVocab; ++id) {
      if ((p.masks[(d.mask_index - 1) * w + id / 32] >> (id % 32)) & 1u) {
        ids.push_back(static_cast<int32_t>(id));
      }
    }
    return ids;
  };
  auto step = [&](int32_t token) {
    EXPECT_NE(sim.schedule(), "-");
    std::vector<int32_t> ids = allowed();
    EXPECT_EQ(sim.complete({token}).rfind("A=" + std::to_string(token), 0), 0u);
    return ids;
  };
  using V = std::vector<int32_t>;
  EXPECT_EQ(step(34), (V{30, 34}));  // the first generated token is already masked
  EXPECT_EQ(step(32), (V{32, 33}));
  EXPECT_EQ(step(30), (V{30}));
  EXPECT_EQ(step(kCall), (V{kCall}));  // complete: only <|call|>
  // After <|call|>: free, whatever the model writes (text, a header to another recipient).
  for (int32_t t : {35, kStart, 51, kChannel, 35, kMessage, 35, 35, kEnd, kStart, 51, kChannel,
                    50}) {
    EXPECT_EQ(step(t), V{}) << t;
  }
  EXPECT_EQ(step(kMessage), V{});       // the header to functions.f is complete ...
  EXPECT_EQ(step(34), (V{30, 34}));     // ... so the next token is masked again
}


// ---- Prefill/decode disaggregation [TAG_DISAGG] ------------------------------------------------

LlmSchedulerOptions prefillSide(bool two_steps) {
  LlmSchedulerOptions o = two_steps ? async() : sync();
  o.handoff = true;
  return o;
}

// The prefill side streams the first token, then parks the sequence with its blocks: nothing
// more is planned for it, a cancel reaching it is for the decode side, and its blocks are freed
// (full ones into the prefix cache) only by releaseHandoff.
TEST(StepSchedulerDisagg, PrefillSideHandsOffAfterTheFirstToken) {
  for (bool two_steps : {false, true}) {
    SCOPED_TRACE(two_steps ? "two steps in flight" : "one step");
    Sim sim(prefillSide(two_steps), limits(8, 4, 32));
    GenerateParams p = gp(range(10), 5);
    p.sampling.temperature = 0.7f;
    sim.add('A', p);
    sim.add('B', gp(range(3, 40), 5));
    ASSERT_EQ(sim.schedule(), "A@0+10* [0 1 2]; B@0+3* [3]");
    EXPECT_EQ(sim.schedule(), "-");  // nothing after a first token, even planned ahead
    EXPECT_EQ(sim.complete({20, 21}), "A=20, A handoff, B=21, B handoff");
    EXPECT_EQ(sim.schedule(), "-");
    EXPECT_EQ(sim.sched().parked(), 2u);
    EXPECT_TRUE(sim.sched().running().empty());
    EXPECT_EQ(sim.freeQueue(), "4 5 6 7");
    EXPECT_EQ(sim.cancel('A'), "");  // its stream is the decode side's now
    std::optional<SeqHandoff> h = sim.sched().takeHandoff(sim.id('A'));
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->tokens.size(), 11u);
    EXPECT_EQ(h->tokens.back(), 20);
    EXPECT_EQ(h->prompt_len, 10u);
    EXPECT_EQ(h->generated, 1u);
    EXPECT_EQ(h->params.max_tokens, 5u);
    EXPECT_FLOAT_EQ(h->params.sampling.temperature, 0.7f);
    EXPECT_EQ(h->table, (std::vector<int32_t>{0, 1, 2}));
    EXPECT_TRUE(h->window.empty());
    EXPECT_FALSE(sim.sched().takeHandoff(sim.id('A') + 100).has_value());
    sim.sched().releaseHandoff(sim.id('A'));
    sim.check();
    // The two full prompt blocks are cached (at the back); the partly filled one is free first.
    EXPECT_EQ(sim.freeQueue(), "2 4 5 6 7 1c 0c");
    sim.sched().releaseHandoff(sim.id('B'));
    sim.sched().releaseHandoff(sim.id('B'));  // twice: no-op
    sim.check();
    EXPECT_EQ(sim.sched().parked(), 0u);
    EXPECT_EQ(sim.sched().stats().generated_tokens, 2u);
  }
}

// A first token that ends the sequence (eos, a stop token, max_tokens 1) ends it on the prefill
// side: no handoff.
TEST(StepSchedulerDisagg, AFirstTokenThatEndsTheSequenceIsNoHandoff) {
  Sim sim(prefillSide(false), limits(8, 4, 32));
  sim.add('A', gp(range(4), 5));
  sim.add('B', gp(range(4, 30), 1));
  GenerateParams c = gp(range(4, 50), 5);
  c.stop_token_ids = {99};
  sim.add('C', c);
  ASSERT_EQ(sim.schedule(), "A@0+4* [0]; B@0+4* [1]; C@0+4* [2]");
  EXPECT_EQ(sim.complete({kEos, 7, 99}), "A=2 stop, B=7 length, C=99 stop");
  EXPECT_EQ(sim.sched().parked(), 0u);
  EXPECT_EQ(sim.freeQueue(), "3 4 5 6 7 0c 1c 2c");
}

SeqHandoff handoffOf(std::vector<int32_t> prompt, int32_t first, uint32_t max_tokens,
                     std::vector<int32_t> table) {
  SeqHandoff h;
  h.params = gp({}, max_tokens);
  h.tokens = std::move(prompt);
  h.prompt_len = static_cast<uint32_t>(h.tokens.size());
  h.tokens.push_back(first);
  h.generated = 1;
  h.cached_prompt = 4;
  h.table = std::move(table);
  h.arrival_ns = 1000;
  h.first_sched_ns = 2000;
  return h;
}

// The decode side takes a handed-off sequence: blocks for its prompt's KV (the pairs to copy),
// nothing planned while the copy runs, then its first token at position prompt_len and the rest
// of its stream; usage counts the prompt and every generated token (the first one included).
TEST(StepSchedulerDisagg, DecodeSideAdoptsCopiesThenContinues) {
  Sim sim(sync(), limits(8, 4, 32));
  sim.add('X', gp(range(5, 60), 2));  // an ordinary request first: blocks 0 1
  ASSERT_EQ(sim.schedule(), "X@0+5* [0 1]");
  std::vector<int32_t> pairs, wpairs;
  auto id = sim.adopt('A', handoffOf(range(10), 20, 4, {7, 3, 5}), &pairs, &wpairs);
  ASSERT_TRUE(id.isOk()) << id.status().toString();
  EXPECT_EQ(pairs, (std::vector<int32_t>{7, 2, 3, 3, 5, 4}));
  EXPECT_TRUE(wpairs.empty());
  EXPECT_EQ(sim.sched().adopting(), 1u);
  EXPECT_EQ(sim.complete({30}), "X=30");
  ASSERT_EQ(sim.schedule(), "X@5+1* [0 1]");  // A waits for its copy
  EXPECT_EQ(sim.adopted('A', okStatus()), "");
  EXPECT_EQ(sim.complete({31}), "X=31 length");
  ASSERT_EQ(sim.schedule(), "A@10+1* [2 3 4]");
  EXPECT_EQ(sim.tokens(), (std::vector<int32_t>{20}));
  EXPECT_EQ(sim.complete({21}), "A=21");
  ASSERT_EQ(sim.schedule(), "A@11+1* [2 3 4]");
  EXPECT_EQ(sim.complete({22}), "A=22");
  // X's partly filled block came free first (its full one stays cached).
  ASSERT_EQ(sim.schedule(), "A@12+1* [2 3 4 1]");
  EXPECT_EQ(sim.complete({23}), "A=23 length");
  const GenerateEvent& last = sim.lastEvent('A');
  EXPECT_EQ(last.prompt_tokens, 10u);
  EXPECT_EQ(last.cached_prompt_tokens, 4u);
  EXPECT_EQ(last.completion_tokens, 4u);
  EXPECT_GT(last.total_us, 0u);
  EXPECT_EQ(sim.sched().adopting(), 0u);
}

// Ends that come while the copy runs wait for it (its blocks may still be written), then end
// the sequence; a failed copy ends it with the error; unadopt() undoes an adopt that never
// reached the worker; a full running set or cache is RESOURCE_EXHAUSTED, changing nothing.
TEST(StepSchedulerDisagg, EndsDuringTheCopyFailedCopiesAndNoRoom) {
  Sim sim(sync(64, 2), limits(6, 4, 32));
  std::vector<int32_t> pairs, wpairs;
  ASSERT_TRUE(sim.adopt('A', handoffOf(range(6), 20, 8, {0, 1}), &pairs, &wpairs).isOk());
  ASSERT_TRUE(sim.adopt('B', handoffOf(range(6), 21, 8, {2, 3}), &pairs, &wpairs).isOk());
  // The running set (2) is full with the two adopting.
  SeqHandoff extra = handoffOf(range(2), 22, 8, {4});
  auto full = sim.sched().adopt(extra, &pairs, &wpairs);
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(sim.cancel('A'), "");
  EXPECT_EQ(sim.stop('B'), "");
  EXPECT_EQ(sim.freeQueue(), "4 5");
  EXPECT_EQ(sim.adopted('A', okStatus()), "A cancelled");
  EXPECT_EQ(sim.adopted('B', okStatus()), "B stop");
  EXPECT_EQ(sim.lastEvent('B').completion_tokens, 1u);
  ASSERT_TRUE(sim.adopt('C', handoffOf(range(6), 23, 8, {0, 1}), &pairs, &wpairs).isOk());
  EXPECT_EQ(sim.adopted('C', unavailable("rose worker is restarting")), "C UNAVAILABLE");
  ASSERT_TRUE(sim.adopt('D', handoffOf(range(6), 24, 8, {0, 1}), &pairs, &wpairs).isOk());
  EXPECT_EQ(sim.adopted('D', invalidArgument("kv handoff: pair 0: ...")), "D INTERNAL");
  EXPECT_NE(sim.lastEvent('D').status.message().find("handoff to the decode worker failed"),
            std::string::npos);
  // No blocks for 30 tokens (8 blocks) in a cache of 6.
  SeqHandoff too_big = handoffOf(range(30), 25, 8, {0, 1, 2, 3, 4, 5, 6, 7});
  auto big = sim.sched().adopt(too_big, &pairs, &wpairs);
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(sim.adopt('E', handoffOf(range(6), 26, 8, {0, 1}), &pairs, &wpairs).isOk());
  sim.sched().unadopt(sim.id('E'));
  sim.check();
  EXPECT_EQ(sim.sched().adopting(), 0u);
  EXPECT_EQ(sim.schedule(), "-");
  EXPECT_EQ(sim.freeQueue().size(), std::string("x x x x x x").size());
  // A deadline that passed during the copy.
  SeqHandoff late = handoffOf(range(6), 27, 8, {0, 1});
  late.params.deadline_ns = 1;
  ASSERT_TRUE(sim.adopt('F', std::move(late), &pairs, &wpairs).isOk());
  EXPECT_EQ(sim.adopted('F', okStatus()), "F DEADLINE_EXCEEDED");
}

// With a window pool the decode side copies only the window blocks the next query reads.
TEST(StepSchedulerDisagg, WindowPoolsCopyWhatTheNextQueryReads) {
  LlmWorkerLimits l = limits(16, 4, 64);
  l.kv_num_blocks_window = 16;
  l.kv_window = 8;
  Sim sim(sync(), l);
  SeqHandoff h = handoffOf(range(14), 20, 8, {9, 8, 7, 6});
  h.window = {-1, 11, 12, 13};
  std::vector<int32_t> pairs, wpairs;
  ASSERT_TRUE(sim.adopt('A', h, &pairs, &wpairs).isOk());
  EXPECT_EQ(pairs, (std::vector<int32_t>{9, 0, 8, 1, 7, 2, 6, 3}));
  // Position 14's query reads keys 7..14: blocks 1..3 of the window table.
  ASSERT_EQ(wpairs.size(), 6u);
  EXPECT_EQ(wpairs[0], 11);
  EXPECT_EQ(wpairs[2], 12);
  EXPECT_EQ(wpairs[4], 13);
  EXPECT_EQ(sim.adopted('A', okStatus()), "");
  ASSERT_EQ(sim.schedule(), "A@14+1* [0 1 2 3]");
  // The prefill side dropped a block the query reads: refused, nothing held.
  SeqHandoff bad = handoffOf(range(14), 20, 8, {9, 8, 7, 6});
  bad.window = {-1, -1, 12, 13};
  auto r = sim.sched().adopt(bad, &pairs, &wpairs);
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  sim.check();
}

}  // namespace
}  // namespace garden::tulip
