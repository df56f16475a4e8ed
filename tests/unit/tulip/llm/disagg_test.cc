// Prefill/decode disaggregation in tulip's threaded drivers [TAG_DISAGG]: DisaggLlm over two
// LlmSchedulers, each on an in-process fake LLM worker (tests/fakes/tulip/fake_llm_worker.h) —
// the prefill worker's cache an export, the decode worker taking kv pulls — with a thread per
// worker running its batches as they come. The fake model reads every earlier token back
// through the block tables (an unwritten slot fails the step), so a handoff that copied the
// wrong blocks, or none, changes or fails the stream. Many concurrent streams (greedy and
// seeded, with and without two steps in flight, choices, a small decode cache that preempts)
// equal the fake's reference; cancellation and stopped choices reach sequences wherever they
// are; every block of both workers is free at the end. Run under ThreadSanitizer by
// scripts/test.sh (unit_tulip_llm).
#include "services/tulip/llm/disagg.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

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

struct Stream {
  std::mutex mu;
  std::map<uint32_t, std::vector<int32_t>> tokens;  // by choice
  std::map<uint32_t, GenerateEvent> last;
  int events_after_last = 0;
  std::shared_ptr<LlmRequest> req;
  size_t lasts() {
    std::lock_guard<std::mutex> l(mu);
    return last.size();
  }
  size_t count(uint32_t choice) {
    std::lock_guard<std::mutex> l(mu);
    return tokens[choice].size();
  }
};

std::shared_ptr<Stream> start(LlmFrontend& s, GenerateParams p) {
  auto out = std::make_shared<Stream>();
  out->req = std::make_shared<LlmRequest>();
  out->req->params = std::move(p);
  // Weak: a scheduler stopped after a failed test still ends its streams.
  out->req->on_event = [w = std::weak_ptr<Stream>(out)](const GenerateEvent& ev) {
    auto o = w.lock();
    if (!o) return;
    std::lock_guard<std::mutex> l(o->mu);
    if (o->last.count(ev.index)) ++o->events_after_last;
    if (ev.token >= 0) o->tokens[ev.index].push_back(ev.token);
    if (ev.last) o->last[ev.index] = ev;
  };
  Status st = s.submit(out->req);
  EXPECT_TRUE(st.isOk()) << st.toString();
  return out;
}

// Both fake workers, their schedulers and the pair, with a thread per worker running its
// batches as they come.
struct Rig {
  FakeLlmWorker prefill_worker, decode_worker;
  std::unique_ptr<LlmScheduler> prefill, decode;
  std::unique_ptr<DisaggLlm> pair;
  std::atomic<bool> stop{false};
  std::atomic<bool> decode_paused{false};  // the decode worker runs nothing while set
  std::mutex pause_mu;
  std::function<bool()> pause_when;  // checked by the decode worker before each step: true pauses it
  std::thread pt, dt;

  Rig(uint32_t prefill_blocks, uint32_t decode_blocks, bool async, uint32_t seqs = 8)
      : prefill_worker(prefill_blocks, 4), decode_worker(decode_blocks, 4) {
    prefill_worker.setKvExport("fake-prefill-kv", 4242);
    decode_worker.setLlmCaps(shm::kLlmCapKvPull);
    LlmSchedulerOptions o{.max_batch_tokens = 24, .max_num_seqs = seqs, .async_steps = async};
    LlmSchedulerOptions po = o;
    po.handoff = true;
    prefill = std::make_unique<LlmScheduler>(prefill_worker, po);
    decode = std::make_unique<LlmScheduler>(decode_worker, o);
    prefill_worker.setOnChange([p = prefill.get()] { p->poke(); });
    decode_worker.setOnChange([d = decode.get()] { d->poke(); });
    pair = std::make_unique<DisaggLlm>(*prefill, prefill_worker, *decode, decode_worker);
    auto run = [this](FakeLlmWorker& w, std::atomic<bool>* paused) {
      while (!stop) {
        if (paused != nullptr && !*paused) {
          std::lock_guard<std::mutex> l(pause_mu);
          if (pause_when && pause_when()) {
            *paused = true;
            pause_when = nullptr;
          }
        }
        if ((paused != nullptr && *paused) || !w.completeNext()) {
          std::this_thread::sleep_for(100us);
        }
      }
    };
    pt = std::thread(run, std::ref(prefill_worker), nullptr);
    dt = std::thread(run, std::ref(decode_worker), &decode_paused);
  }
  ~Rig() {
    prefill->stop();
    decode->stop();
    stop = true;
    pt.join();
    dt.join();
  }
  // The decode worker pauses itself before the first step after which `pred` holds, so a test
  // acts on a sequence at a known point however slow the machine is; resume with
  // decode_paused = false.
  void pauseDecodeWhen(std::function<bool()> pred) {
    std::lock_guard<std::mutex> l(pause_mu);
    pause_when = std::move(pred);
  }
  bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds limit = 20s) {
    const auto t0 = std::chrono::steady_clock::now();
    while (!pred()) {
      if (std::chrono::steady_clock::now() - t0 > limit) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }
  // For failure messages: both sides' counts.
  std::string state() {
    const LlmStats p = prefill->stats(), d = decode->stats();
    auto one = [](const char* n, const LlmStats& s, FakeLlmWorker& w) {
      return std::string(n) + ": running " + std::to_string(s.running) + " waiting " +
             std::to_string(s.waiting) + " used blocks " + std::to_string(s.kv_used_blocks) +
             " steps " + std::to_string(s.steps) + " inflight " + std::to_string(w.inflight()) +
             " errors " + std::to_string(w.errors().size()) +
             (w.errors().empty() ? "" : " (" + w.errors()[0] + ")");
    };
    return one("prefill", p, prefill_worker) + "; " + one("decode", d, decode_worker) +
           "; pulls " + std::to_string(decode_worker.pulls());
  }
  bool allFree() {
    const LlmStats p = prefill->stats(), d = decode->stats();
    return p.running == 0 && d.running == 0 && p.waiting == 0 && d.waiting == 0 &&
           p.kv_used_blocks == 0 && d.kv_used_blocks == 0;
  }
};

class DisaggModes : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Steps, DisaggModes, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Async" : "Sync";
                         });

// 24 concurrent streams of different prompts, lengths and sampling, submitted from 4 threads:
// each equals the fake's reference; every sequence but the one-token ones was handed over.
TEST_P(DisaggModes, ConcurrentStreamsEqualTheReference) {
  Rig rig(256, 256, GetParam());
  std::vector<std::shared_ptr<Stream>> streams(24);
  std::vector<GenerateParams> ps(24);
  for (int i = 0; i < 24; ++i) {
    ps[i] = params(range(3 + (i * 7) % 29, (37 * i) % 800 + 5), 1 + (i * 5) % 13);
    ps[i].ignore_eos = true;
    if (i % 3 == 1) {
      ps[i].sampling.temperature = 0.8f;
      ps[i].sampling.seed = 1000 + i;
    }
  }
  std::vector<std::thread> submitters;
  for (int t = 0; t < 4; ++t) {
    submitters.emplace_back([&, t] {
      for (int i = t; i < 24; i += 4) streams[i] = start(*rig.pair, ps[i]);
    });
  }
  for (auto& t : submitters) t.join();
  ASSERT_TRUE(rig.eventually([&] {
    for (auto& s : streams)
      if (s->lasts() != 1) return false;
    return true;
  })) << "streams did not end: " << rig.state();
  int handed = 0;
  for (int i = 0; i < 24; ++i) {
    SCOPED_TRACE("stream " + std::to_string(i));
    const auto want = fakeReference(ps[i].prompt, ps[i].max_tokens, ps[i].sampling, kVocab);
    std::lock_guard<std::mutex> l(streams[i]->mu);
    EXPECT_EQ(streams[i]->tokens[0], want);
    const GenerateEvent& last = streams[i]->last[0];
    EXPECT_TRUE(last.status.isOk()) << last.status.toString();
    EXPECT_EQ(last.finish, FinishReason::kLength);
    EXPECT_EQ(last.completion_tokens, ps[i].max_tokens);
    EXPECT_EQ(last.prompt_tokens, ps[i].prompt.size());
    EXPECT_EQ(streams[i]->events_after_last, 0);
    handed += ps[i].max_tokens > 1 ? 1 : 0;
  }
  EXPECT_EQ(rig.decode_worker.pulls(), static_cast<uint64_t>(handed));
  EXPECT_TRUE(rig.prefill_worker.errors().empty()) << rig.prefill_worker.errors()[0];
  EXPECT_TRUE(rig.decode_worker.errors().empty()) << rig.decode_worker.errors()[0];
  EXPECT_TRUE(rig.eventually([&] { return rig.allFree(); }));
  const LlmStats s = rig.pair->stats();
  EXPECT_EQ(s.kv_total_blocks, 512u);
}

// A small decode cache (the prefill one is large): the decode side preempts and recomputes
// there, choices (n = 3) are handed over one by one; every stream still equals the reference.
TEST_P(DisaggModes, DecodeSidePreemptionAndChoices) {
  Rig rig(256, 14, GetParam(), 4);
  // Any two of these sequences at their full length (9-14 prompt tokens + 20) need 16 or more
  // of the decode cache's 14 blocks. The decode worker holds still until two handed-over
  // sequences wait for their copies, so at least two decode together and one must be
  // preempted, however a loaded machine staggers the prefills (with the sequences arriving one
  // by one, each could finish before the next came).
  constexpr uint32_t kLen = 20;
  std::vector<std::shared_ptr<Stream>> streams;
  std::vector<GenerateParams> ps;
  rig.decode_paused = true;
  for (int i = 0; i < 6; ++i) {
    GenerateParams p = params(range(9 + i, 30 * i + 1), kLen);
    p.ignore_eos = true;
    if (i == 2) p.n = 3;
    ps.push_back(p);
    streams.push_back(start(*rig.pair, p));
  }
  ASSERT_TRUE(rig.eventually([&] { return rig.decode_worker.inflight() >= 2; }))
      << "no copies reached the decode side: " << rig.state();
  rig.decode_paused = false;
  ASSERT_TRUE(rig.eventually([&] {
    for (size_t i = 0; i < streams.size(); ++i)
      if (streams[i]->lasts() != std::max<uint32_t>(ps[i].n, 1)) return false;
    return true;
  })) << "streams did not end: " << rig.state();
  for (size_t i = 0; i < streams.size(); ++i) {
    for (uint32_t c = 0; c < std::max<uint32_t>(ps[i].n, 1); ++c) {
      SCOPED_TRACE("stream " + std::to_string(i) + " choice " + std::to_string(c));
      llm::SamplingParams sp = ps[i].sampling;
      sp.seed += c;
      std::lock_guard<std::mutex> l(streams[i]->mu);
      EXPECT_EQ(streams[i]->tokens[c], fakeReference(ps[i].prompt, kLen, sp, kVocab));
      EXPECT_TRUE(streams[i]->last[c].status.isOk()) << streams[i]->last[c].status.toString();
    }
  }
  EXPECT_GT(rig.decode->stats().preemptions, 0u);
  EXPECT_TRUE(rig.decode_worker.errors().empty()) << rig.decode_worker.errors()[0];
  EXPECT_TRUE(rig.eventually([&] { return rig.allFree(); }));
}

// Cancels and stopped choices reach a sequence wherever it is: prefilling, waiting for its copy
// (the decode worker paused), decoding. Each stream ends exactly once and every block comes
// free on both sides.
TEST_P(DisaggModes, CancelAndStopChoiceReachEverySide) {
  Rig rig(128, 128, GetParam());
  GenerateParams p = params(range(10, 7), 200);
  p.ignore_eos = true;
  // Decoding: cancel after a few tokens. The decode worker holds still from the third token on
  // until the cancel is in, so the sequence cannot reach its length first however loaded the
  // machine is (CI's two cores once let it).
  rig.decode_paused = true;
  auto a = start(*rig.pair, p);
  rig.pauseDecodeWhen([a] { return a->count(0) >= 3; });
  rig.decode_paused = false;
  ASSERT_TRUE(rig.eventually([&] { return a->count(0) >= 3 && rig.decode_paused; }));
  rig.pair->cancel(a->req);
  rig.decode_paused = false;
  ASSERT_TRUE(rig.eventually([&] { return a->lasts() == 1; }));
  // Handed over while the decode worker is paused (its copy waits): cancel, then resume.
  rig.decode_paused = true;
  auto b = start(*rig.pair, params(range(10, 300), 50));
  ASSERT_TRUE(rig.eventually([&] { return b->count(0) >= 1; }));  // the prefill side's token
  std::this_thread::sleep_for(20ms);
  rig.pair->cancel(b->req);
  rig.decode_paused = false;
  ASSERT_TRUE(rig.eventually([&] { return b->lasts() == 1; }));
  // A call with two choices: stop choice 1 once it streams, choice 0 runs to its end.
  GenerateParams c = params(range(12, 900), 40);
  c.ignore_eos = true;
  c.n = 2;
  rig.decode_paused = true;  // held again from choice 1's second token until it is stopped
  auto cs = start(*rig.pair, c);
  ASSERT_NE(cs->req->call_id, 0u);
  rig.pauseDecodeWhen([cs] { return cs->count(1) >= 2; });
  rig.decode_paused = false;
  ASSERT_TRUE(rig.eventually([&] { return cs->count(1) >= 2 && rig.decode_paused; }));
  EXPECT_TRUE(rig.pair->stopChoice(cs->req->call_id, 1).isOk());
  EXPECT_EQ(rig.pair->stopChoice(cs->req->call_id, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.pair->stopChoice(cs->req->call_id + 1, 0).code(), StatusCode::kNotFound);
  rig.decode_paused = false;
  ASSERT_TRUE(rig.eventually([&] { return cs->lasts() == 2; }));
  {
    std::lock_guard<std::mutex> l(a->mu);
    EXPECT_EQ(a->last[0].finish, FinishReason::kCancelled);
    EXPECT_EQ(a->events_after_last, 0);
  }
  {
    std::lock_guard<std::mutex> l(b->mu);
    EXPECT_EQ(b->last[0].finish, FinishReason::kCancelled);
    EXPECT_EQ(b->events_after_last, 0);
  }
  {
    std::lock_guard<std::mutex> l(cs->mu);
    EXPECT_EQ(cs->last[1].finish, FinishReason::kStop);
    EXPECT_LT(cs->tokens[1].size(), 40u);
    EXPECT_EQ(cs->last[0].finish, FinishReason::kLength);
    EXPECT_EQ(cs->tokens[0], fakeReference(c.prompt, 40, c.sampling, kVocab));
    EXPECT_EQ(cs->events_after_last, 0);
  }
  EXPECT_TRUE(rig.eventually([&] { return rig.allFree(); }));
  EXPECT_TRUE(rig.decode_worker.errors().empty()) << rig.decode_worker.errors()[0];
}

// A prefill worker that exports nothing, or a decode worker that takes no pulls: refused at
// submit, naming which.
TEST(Disagg, RefusesAPairThatCannotHandOff) {
  FakeLlmWorker pw(16, 4), dw(16, 4);
  LlmSchedulerOptions po{.max_batch_tokens = 16, .max_num_seqs = 4};
  po.handoff = true;
  LlmScheduler prefill(pw, po);
  LlmScheduler decode(dw, {.max_batch_tokens = 16, .max_num_seqs = 4});
  DisaggLlm pair(prefill, pw, decode, dw);
  auto req = std::make_shared<LlmRequest>();
  req->params = params(range(4), 2);
  Status st = pair.submit(req);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("--kv-export"), std::string::npos) << st.message();
  pw.setKvExport("fake-prefill-kv-2", 7);
  st = pair.submit(req);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("does not take kv pulls"), std::string::npos) << st.message();
  prefill.stop();
  decode.stop();
}

}  // namespace
}  // namespace garden::tulip
