#include "services/tulip/sched/embed_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "common/metrics/registry.h"
#include "tests/fakes/tulip/fake_worker.h"

namespace garden::tulip {
namespace {

using namespace std::chrono_literals;
using testing::FakeWorker;

template <typename Pred>
bool waitFor(Pred pred, std::chrono::milliseconds limit = 30000ms) {
  auto t0 = std::chrono::steady_clock::now();
  while (!pred()) {
    if (std::chrono::steady_clock::now() - t0 > limit) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

struct Outcome {
  std::promise<Status> p;
  std::future<Status> f = p.get_future();
  bool ready() const { return f.wait_for(0s) == std::future_status::ready; }
};

std::shared_ptr<EmbedJob> makeJob(std::vector<std::vector<int32_t>> inputs, Outcome& out) {
  auto j = std::make_shared<EmbedJob>();
  j->inputs = std::move(inputs);
  j->on_done = [&out](const Status& s) { out.p.set_value(s); };
  return j;
}

// tulip_embed_dropped_sequences_total{reason} as exposed now (0 before the first drop).
double droppedSequences(const std::string& reason) {
  const std::string text = metrics::Registry::global().expose();
  const std::string key = "tulip_embed_dropped_sequences_total{reason=\"" + reason + "\"} ";
  const size_t pos = text.find(key);
  return pos == std::string::npos ? 0.0 : std::stod(text.substr(pos + key.size()));
}

std::vector<int32_t> seq(int len, int start = 1) {
  std::vector<int32_t> s;
  for (int i = 0; i < len; ++i) s.push_back(start + i);
  return s;
}

TEST(EmbedScheduler, OneRequestOneBatchValuesInOrder) {
  FakeWorker w(2, 4);
  EmbedScheduler s(w, SchedulerOptions{});
  w.setOnChange([&] { s.poke(); });
  Outcome out;
  auto job = makeJob({{1, 2}, {10}, {3, 3, 3}}, out);
  ASSERT_TRUE(s.submit(job).isOk());
  ASSERT_TRUE(waitFor([&] { return w.heldCount() == 1; }));
  auto b = w.submitted();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].tokens, (std::vector<int32_t>{1, 2, 10, 3, 3, 3}));
  EXPECT_EQ(b[0].seq_lens, (std::vector<int32_t>{2, 1, 3}));
  EXPECT_FALSE(out.ready());
  ASSERT_TRUE(w.completeNext());
  ASSERT_TRUE(out.f.wait_for(30s) == std::future_status::ready);
  EXPECT_TRUE(out.f.get().isOk());
  ASSERT_EQ(job->dim, 4u);
  ASSERT_EQ(job->values.size(), 12u);
  // row[k] = sum(ids) + k, in input order.
  EXPECT_EQ(job->values[0], 3.0f);
  EXPECT_EQ(job->values[3], 6.0f);
  EXPECT_EQ(job->values[4], 10.0f);
  EXPECT_EQ(job->values[8], 9.0f);
  EXPECT_EQ(job->values[11], 12.0f);
}

TEST(EmbedScheduler, TokenBudgetSplitsFcfsAcrossRequests) {
  FakeWorker w(8, 2);
  SchedulerOptions o;
  o.max_batch_tokens = 12;
  o.max_inflight_batches = 0;  // every free slot takes a batch (no completions in this test)
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  Outcome a, b;
  auto ja = makeJob({seq(5, 1), seq(5, 2), seq(5, 3)}, a);
  auto jb = makeJob({seq(5, 4), seq(2, 5)}, b);
  // Hold batching until both are queued, so the expected batches are exact.
  w.setReady(true);
  ASSERT_TRUE(s.submit(ja).isOk());
  ASSERT_TRUE(s.submit(jb).isOk());
  ASSERT_TRUE(waitFor([&] {
    size_t toks = 0;
    for (auto& x : w.submitted()) toks += x.tokens.size();
    return toks == 22;
  }));
  auto batches = w.submitted();
  // Budget 12: [a0 a1] [a2 b0 ... ] must respect 12 tokens and FCFS order.
  std::vector<std::vector<int32_t>> lens;
  for (auto& x : batches) {
    lens.push_back(x.seq_lens);
    int total = 0;
    for (int l : x.seq_lens) total += l;
    EXPECT_LE(total, 12);
  }
  // Whatever the timing, sequences go out in FCFS order: 5,5,5,5,2.
  std::vector<int32_t> flat;
  for (auto& l : lens) flat.insert(flat.end(), l.begin(), l.end());
  EXPECT_EQ(flat, (std::vector<int32_t>{5, 5, 5, 5, 2}));
  while (w.completeNext()) {
  }
  ASSERT_EQ(a.f.wait_for(30s), std::future_status::ready);
  ASSERT_EQ(b.f.wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(a.f.get().isOk());
  EXPECT_TRUE(b.f.get().isOk());
  // a2 = {3..7} sums to 25.
  EXPECT_EQ(ja->values[2 * 2], 25.0f);
  EXPECT_EQ(jb->values[1 * 2 + 1], 5.0f + 6.0f + 1.0f);
}

TEST(EmbedScheduler, ExactBatchesWhenQueuedBeforeWorkerFrees) {
  FakeWorker w(1, 2);
  SchedulerOptions o;
  o.max_batch_tokens = 10;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  Outcome first, second;
  ASSERT_TRUE(s.submit(makeJob({seq(4)}, first)).isOk());
  ASSERT_TRUE(waitFor([&] { return w.heldCount() == 1; }));
  // Depth 1 and busy: these queue up and are batched together once the slot frees.
  auto js = makeJob({seq(3), seq(3), seq(3), seq(3)}, second);
  ASSERT_TRUE(s.submit(js).isOk());
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(w.submitted().size(), 1u) << "depth 1 must not exceed one batch in flight";
  auto st = s.stats();
  EXPECT_EQ(st.queued_requests, 1u);
  EXPECT_EQ(st.queued_tokens, 12u);
  EXPECT_EQ(st.inflight_tokens, 4u);
  ASSERT_TRUE(w.completeNext());
  ASSERT_TRUE(waitFor([&] { return w.submitted().size() == 2; }));
  EXPECT_EQ(w.submitted()[1].seq_lens, (std::vector<int32_t>{3, 3, 3}));
  ASSERT_TRUE(w.completeNext());
  ASSERT_TRUE(waitFor([&] { return w.submitted().size() == 3; }));
  EXPECT_EQ(w.submitted()[2].seq_lens, (std::vector<int32_t>{3}));
  EXPECT_FALSE(second.ready());
  ASSERT_TRUE(w.completeNext());
  ASSERT_EQ(second.f.wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(second.f.get().isOk());
  EXPECT_EQ(s.stats().queued_tokens, 0u);
  EXPECT_EQ(s.stats().inflight_tokens, 0u);
}

TEST(EmbedScheduler, SequenceCapLimitsBatch) {
  FakeWorker w(4, 2);
  SchedulerOptions o;
  o.max_batch_seqs = 2;
  o.max_inflight_batches = 0;  // all three batches go out before any completes
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  Outcome out;
  ASSERT_TRUE(s.submit(makeJob({{1}, {2}, {3}, {4}, {5}}, out)).isOk());
  ASSERT_TRUE(waitFor([&] { return w.submitted().size() == 3; }));
  for (auto& b : w.submitted()) EXPECT_LE(b.seq_lens.size(), 2u);
  while (w.completeNext()) {
  }
  ASSERT_EQ(out.f.wait_for(30s), std::future_status::ready);
}

TEST(EmbedScheduler, ValidationErrorsNameTheInput) {
  FakeWorker w(2, 4);
  w.facts_.has_score_head = 0;
  EmbedScheduler s(w, SchedulerOptions{});
  Outcome o;
  auto check = [&](std::shared_ptr<EmbedJob> j, const std::string& needle) {
    Status st = s.submit(j);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  check(makeJob({}, o), "at least one");
  check(makeJob({{1}, {}}, o), "inputs[1]: empty");
  check(makeJob({seq(65)}, o), "inputs[0]: 65 tokens");
  check(makeJob({{1, 1000}}, o), "token id 1000");
  check(makeJob({{1, -3}}, o), "token id -3");
  auto dims = makeJob({{1}}, o);
  dims->dimensions = 5;
  check(dims, "dimensions");
  auto score = makeJob({{1}}, o);
  score->kind = shm::BatchKind::kScore;
  check(score, "classification head");
  score->score_yes = 3;
  score->score_no = 5000;
  check(score, "yes_token/no_token");
  EXPECT_TRUE(w.submitted().empty());
}

TEST(EmbedScheduler, QueueLimitRejectsWithResourceExhausted) {
  FakeWorker w(1, 2);
  SchedulerOptions o;
  o.queue_limit_tokens = 10;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  w.setReady(true);
  Outcome a, b, c;
  ASSERT_TRUE(s.submit(makeJob({seq(8)}, a)).isOk());
  ASSERT_TRUE(waitFor([&] { return w.heldCount() == 1; }));
  // In flight does not count against the queue; 8 queued fit, 3 more do not.
  ASSERT_TRUE(s.submit(makeJob({seq(8)}, b)).isOk());
  Status st = s.submit(makeJob({seq(3)}, c));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("limit 10"), std::string::npos);
  while (!b.ready()) {
    w.completeNext();
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(a.f.get().isOk());
  EXPECT_TRUE(b.f.get().isOk());
}

TEST(EmbedScheduler, CancelledQueuedJobNeverReachesWorker) {
  FakeWorker w(1, 2);
  EmbedScheduler s(w, SchedulerOptions{});
  w.setOnChange([&] { s.poke(); });
  Outcome a, b;
  ASSERT_TRUE(s.submit(makeJob({seq(2)}, a)).isOk());
  ASSERT_TRUE(waitFor([&] { return w.heldCount() == 1; }));
  const double dropped_before = droppedSequences("cancelled");
  auto jb = makeJob({seq(3, 50), seq(2, 60)}, b);
  ASSERT_TRUE(s.submit(jb).isOk());
  s.cancel(jb);
  ASSERT_EQ(b.f.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(b.f.get().code(), StatusCode::kCancelled);
  EXPECT_EQ(droppedSequences("cancelled") - dropped_before, 2.0);  // both of its sequences
  ASSERT_TRUE(w.completeNext());
  ASSERT_EQ(a.f.wait_for(30s), std::future_status::ready);
  std::this_thread::sleep_for(30ms);
  ASSERT_EQ(w.submitted().size(), 1u);
  EXPECT_EQ(s.stats().queued_tokens, 0u);
}

TEST(EmbedScheduler, ExpiredDeadlineDroppedBeforeWorker) {
  FakeWorker w(1, 2);
  EmbedScheduler s(w, SchedulerOptions{});
  w.setOnChange([&] { s.poke(); });
  Outcome a, b;
  ASSERT_TRUE(s.submit(makeJob({seq(2)}, a)).isOk());
  ASSERT_TRUE(waitFor([&] { return w.heldCount() == 1; }));
  const double dropped_before = droppedSequences("deadline");
  auto jb = makeJob({seq(3)}, b);
  jb->deadline_ns = shm::monotonicNowNs() + 20'000'000;  // 20 ms
  ASSERT_TRUE(s.submit(jb).isOk());
  ASSERT_EQ(b.f.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(b.f.get().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(droppedSequences("deadline") - dropped_before, 1.0);
  w.completeNext();
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(w.submitted().size(), 1u);
}

TEST(EmbedScheduler, WorkerFailureFailsOnlyItsRequestsThenRecovers) {
  FakeWorker w(2, 2);
  EmbedScheduler s(w, SchedulerOptions{});
  w.setOnChange([&] { s.poke(); });
  Outcome a, b;
  ASSERT_TRUE(s.submit(makeJob({seq(2)}, a)).isOk());
  ASSERT_TRUE(waitFor([&] { return w.heldCount() == 1; }));
  ASSERT_TRUE(w.completeNext(unavailable("rose worker (pid 7) was killed by signal 9")));
  ASSERT_EQ(a.f.wait_for(30s), std::future_status::ready);
  Status st = a.f.get();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("signal 9"), std::string::npos);
  ASSERT_TRUE(s.submit(makeJob({seq(2)}, b)).isOk());
  ASSERT_TRUE(waitFor([&] { return w.heldCount() == 1; }));
  ASSERT_TRUE(w.completeNext());
  ASSERT_EQ(b.f.wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(b.f.get().isOk());
}

TEST(EmbedScheduler, NotReadyRejectsAndFailsQueued) {
  FakeWorker w(1, 2);
  EmbedScheduler s(w, SchedulerOptions{});
  w.setOnChange([&] { s.poke(); });
  Outcome a, b, c;
  ASSERT_TRUE(s.submit(makeJob({seq(2)}, a)).isOk());
  ASSERT_TRUE(waitFor([&] { return w.heldCount() == 1; }));
  ASSERT_TRUE(s.submit(makeJob({seq(2)}, b)).isOk());
  // The worker died: queued work fails fast instead of hanging, and names the cause (a request
  // split across several batches must say why whichever of its parts answers first).
  w.fail("rose worker (pid 7) was killed by signal 9 (Killed)");
  ASSERT_EQ(b.f.wait_for(30s), std::future_status::ready);
  const Status queued = b.f.get();
  EXPECT_EQ(queued.code(), StatusCode::kUnavailable);
  EXPECT_NE(queued.message().find("restarting: rose worker (pid 7) was killed by signal 9"),
            std::string::npos)
      << queued.message();
  const Status rejected = s.submit(makeJob({seq(2)}, c));
  EXPECT_EQ(rejected.code(), StatusCode::kUnavailable);
  EXPECT_NE(rejected.message().find("signal 9"), std::string::npos) << rejected.message();
  w.completeNext(unavailable("gone"));
  ASSERT_EQ(a.f.wait_for(30s), std::future_status::ready);
}

TEST(EmbedScheduler, DimensionsTruncateAndRenormalize) {
  FakeWorker w(1, 4);
  EmbedScheduler s(w, SchedulerOptions{});
  w.setOnChange([&] { s.poke(); });
  Outcome out;
  auto j = makeJob({{1, 2}}, out);  // row = 3,4,5,6
  j->dimensions = 2;
  ASSERT_TRUE(s.submit(j).isOk());
  ASSERT_TRUE(waitFor([&] { return w.heldCount() == 1; }));
  w.completeNext();
  ASSERT_EQ(out.f.wait_for(30s), std::future_status::ready);
  ASSERT_EQ(j->values.size(), 2u);
  EXPECT_NEAR(j->values[0], 0.6f, 1e-6);
  EXPECT_NEAR(j->values[1], 0.8f, 1e-6);
}

TEST(EmbedScheduler, IncompatibleKindsGoInSeparateBatches) {
  FakeWorker w(1, 2);
  EmbedScheduler s(w, SchedulerOptions{});
  w.setOnChange([&] { s.poke(); });
  Outcome a, b, c;
  ASSERT_TRUE(s.submit(makeJob({seq(1)}, a)).isOk());
  ASSERT_TRUE(waitFor([&] { return w.heldCount() == 1; }));
  auto score = makeJob({seq(3), seq(4)}, b);
  score->kind = shm::BatchKind::kScore;
  score->score_yes = 1;
  score->score_no = 2;
  ASSERT_TRUE(s.submit(score).isOk());
  ASSERT_TRUE(s.submit(makeJob({seq(2)}, c)).isOk());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(waitFor([&] { return w.heldCount() == 1; }));
    w.completeNext();
  }
  ASSERT_EQ(c.f.wait_for(30s), std::future_status::ready);
  auto bs = w.submitted();
  ASSERT_EQ(bs.size(), 3u);
  EXPECT_EQ(bs[1].kind, shm::BatchKind::kScore);
  EXPECT_EQ(bs[1].score_yes, 1);
  EXPECT_EQ(bs[2].kind, shm::BatchKind::kEmbed);
  EXPECT_TRUE(b.f.get().isOk());
  EXPECT_EQ(score->values, (std::vector<float>{3.0f, 4.0f}));
}

// `threads` submitter threads, `per` requests each, while a completer thread answers the fake
// worker's batches (and records the most batches it ever held). `inputs(t, i)` makes request i of
// thread t; `check(t, i, job)` judges a successful result. Returns the requests judged correct.
template <typename Inputs, typename Check>
int runConcurrentSubmitters(EmbedScheduler& s, FakeWorker& w, int threads, int per, Inputs inputs,
                            Check check, size_t* most_held = nullptr) {
  std::atomic<bool> run{true};
  std::atomic<size_t> held_max{0};
  std::thread completer([&] {
    while (run) {
      const size_t held = w.heldCount();
      if (held > held_max) held_max = held;
      if (!w.completeNext()) std::this_thread::sleep_for(50us);
    }
  });
  std::atomic<int> ok{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < per; ++i) {
        Outcome o;
        auto j = makeJob(inputs(t, i), o);
        if (!s.submit(j).isOk()) continue;
        if (o.f.wait_for(60s) == std::future_status::ready && o.f.get().isOk() && check(t, i, *j)) {
          ok++;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  run = false;
  completer.join();
  if (most_held != nullptr) *most_held = held_max;
  return ok.load();
}

TEST(EmbedScheduler, ManyConcurrentSubmittersAllComplete) {
  FakeWorker w(3, 2);
  SchedulerOptions o;
  o.max_batch_tokens = 64;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  constexpr int kThreads = 4, kPer = 50;
  const int ok = runConcurrentSubmitters(
      s, w, kThreads, kPer,
      [](int t, int i) {
        return std::vector<std::vector<int32_t>>{seq(1 + (i % 7), t), seq(3, i)};
      },
      [](int t, int i, const EmbedJob& j) {
        float expect0 = 0;
        for (int k = 0; k < 1 + (i % 7); ++k) expect0 += t + k;
        return j.values[0] == expect0;
      });
  EXPECT_EQ(ok, kThreads * kPer);
}

// --- batch formation under concurrency [TAG_EMBED_INFLIGHT] -----------------------------------
// The fake worker's completions run the scheduler's callback on the test thread, and dispatch
// happens inline (in submit() and in the completion), so these expectations are exact: no
// waiting, no timing.

std::vector<std::vector<int32_t>> lensOf(const std::vector<WorkBatch>& bs) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& b : bs) out.push_back(b.seq_lens);
  return out;
}

TEST(EmbedSchedulerBatching, LoneRequestOnIdleWorkerIsDispatchedBeforeSubmitReturns) {
  FakeWorker w(4, 2);
  EmbedScheduler s(w, SchedulerOptions{});  // default cap 2
  w.setOnChange([&] { s.poke(); });
  Outcome a;
  auto ja = makeJob({seq(7)}, a);
  ASSERT_TRUE(s.submit(ja).isOk());
  // No hand-off to another thread, no timer: the batch is on the worker already.
  ASSERT_EQ(w.submitted().size(), 1u);
  EXPECT_EQ(w.submitted()[0].seq_lens, (std::vector<int32_t>{7}));
  EXPECT_EQ(s.inflightBatches(), 1u);
  EXPECT_GT(ja->trace.dispatched_ns, 0);
  ASSERT_TRUE(w.completeNext());
  ASSERT_EQ(a.f.wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(a.f.get().isOk());
  EXPECT_GE(ja->trace.done_ns, ja->trace.dispatched_ns);
  EXPECT_EQ(s.inflightBatches(), 0u);
  // Idle again: the next lone request goes out at once too.
  Outcome b;
  ASSERT_TRUE(s.submit(makeJob({seq(3)}, b)).isOk());
  EXPECT_EQ(w.submitted().size(), 2u);
  ASSERT_TRUE(w.completeNext());
  EXPECT_TRUE(b.f.get().isOk());
}

TEST(EmbedSchedulerBatching, ArrivalsWhileOneBatchRunsFormOneNextBatch) {
  FakeWorker w(4, 2);
  SchedulerOptions o;
  o.max_inflight_batches = 1;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  Outcome a, b, c, d, e;
  ASSERT_TRUE(s.submit(makeJob({seq(4, 1)}, a)).isOk());
  ASSERT_EQ(w.submitted().size(), 1u);
  auto jb = makeJob({seq(2, 10)}, b);
  auto jc = makeJob({seq(3, 20)}, c);
  auto jd = makeJob({seq(1, 30)}, d);
  auto je = makeJob({seq(5, 40)}, e);
  for (auto& j : {jb, jc, jd, je}) ASSERT_TRUE(s.submit(j).isOk());
  // The worker has free slots (depth 4), but the cap holds them back: they wait, coalescing.
  EXPECT_EQ(w.submitted().size(), 1u);
  EXPECT_EQ(s.stats().queued_requests, 4u);
  EXPECT_EQ(s.stats().queued_tokens, 11u);
  ASSERT_TRUE(w.completeNext());  // the running batch ends: its completion dispatches the next
  ASSERT_EQ(w.submitted().size(), 2u);
  EXPECT_EQ(w.submitted()[1].seq_lens, (std::vector<int32_t>{2, 3, 1, 5}));
  EXPECT_EQ(s.stats().queued_requests, 0u);
  EXPECT_EQ(s.stats().inflight_tokens, 11u);
  EXPECT_TRUE(a.f.get().isOk());
  EXPECT_FALSE(b.ready());
  ASSERT_TRUE(w.completeNext());
  for (auto* out : {&b, &c, &d, &e}) EXPECT_TRUE(out->f.get().isOk());
  // Each request got its own row: row[k] = sum(ids) + k.
  EXPECT_EQ(jc->values[0], 20.0f + 21.0f + 22.0f);
  EXPECT_EQ(je->values[1], 40.0f + 41.0f + 42.0f + 43.0f + 44.0f + 1.0f);
  EXPECT_EQ(s.maxInflightBatchesSeen(), 1u);
}

TEST(EmbedSchedulerBatching, ImmediateStagingStagesOneBatchAndCoalescesTheRest) {
  FakeWorker w(4, 2);
  SchedulerOptions o;  // cap 2: one running, one staged — formed at once (the 2026-11-30 policy;
  o.stage_lead_us = 0;  // the default forms it late: EmbedSchedulerLateStage below)
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  Outcome a, b, c, d, e;
  ASSERT_TRUE(s.submit(makeJob({seq(4)}, a)).isOk());
  ASSERT_TRUE(s.submit(makeJob({seq(2)}, b)).isOk());  // staged behind a, alone
  ASSERT_TRUE(s.submit(makeJob({seq(3)}, c)).isOk());
  ASSERT_TRUE(s.submit(makeJob({seq(1)}, d)).isOk());
  ASSERT_TRUE(s.submit(makeJob({seq(6)}, e)).isOk());
  EXPECT_EQ(lensOf(w.submitted()), (std::vector<std::vector<int32_t>>{{4}, {2}}));
  EXPECT_EQ(w.heldCount(), 2u);
  ASSERT_TRUE(w.completeNext());
  EXPECT_EQ(lensOf(w.submitted()), (std::vector<std::vector<int32_t>>{{4}, {2}, {3, 1, 6}}));
  EXPECT_EQ(w.heldCount(), 2u);
  while (w.completeNext()) {
  }
  for (auto* out : {&a, &b, &c, &d, &e}) EXPECT_TRUE(out->f.get().isOk());
  EXPECT_EQ(w.submitted().size(), 3u);
  EXPECT_EQ(s.maxInflightBatchesSeen(), 2u);
}

TEST(EmbedSchedulerBatching, CoalescedBatchesStillHonourBudgetSeqCapAndTakeTurns) {
  FakeWorker w(4, 2);
  SchedulerOptions o;
  o.max_inflight_batches = 1;
  o.max_batch_tokens = 12;
  o.max_batch_seqs = 3;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  Outcome x, a, b, c;
  ASSERT_TRUE(s.submit(makeJob({seq(1)}, x)).isOk());  // running
  auto ja = makeJob({seq(5, 1), seq(5, 2), seq(5, 3)}, a);
  auto jb = makeJob({seq(5, 4), seq(2, 5)}, b);
  auto jc = makeJob({seq(1, 6), seq(1, 7), seq(1, 8), seq(1, 9)}, c);
  for (auto& j : {ja, jb, jc}) ASSERT_TRUE(s.submit(j).isOk());
  ASSERT_EQ(w.submitted().size(), 1u);
  // Each completion dispatches exactly the next batch: 12-token budget, 3-sequence cap, one
  // sequence per request per round [TAG_EMBED_FAIR]: {a0 b0 c0}, then a1 (5) + b1 (2) + c1 (1),
  // then a2 + c2 + c3 (a and b are done with, c takes the rest).
  const std::vector<std::vector<int32_t>> want = {{1}, {5, 5, 1}, {5, 2, 1}, {5, 1, 1}};
  for (size_t i = 1; i < want.size(); ++i) {
    ASSERT_TRUE(w.completeNext());
    ASSERT_EQ(w.submitted().size(), i + 1);
    EXPECT_EQ(w.submitted()[i].seq_lens, want[i]) << "batch " << i;
    EXPECT_EQ(w.heldCount(), 1u);
  }
  ASSERT_TRUE(w.completeNext());
  for (auto* out : {&x, &a, &b, &c}) EXPECT_TRUE(out->f.get().isOk());
  EXPECT_EQ(ja->values[2 * 2], 25.0f);  // a2 = {3..7}
  EXPECT_EQ(jb->values[1 * 2], 11.0f);  // b1 = {5, 6}
  EXPECT_EQ(jc->values[3 * 2], 9.0f);
  EXPECT_EQ(s.stats().inflight_tokens, 0u);
  EXPECT_EQ(s.stats().queued_requests, 0u);
}

TEST(EmbedSchedulerBatching, CancelledAndExpiredWaitersStayOutOfTheCoalescedBatch) {
  FakeWorker w(4, 2);
  SchedulerOptions o;
  o.max_inflight_batches = 1;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  Outcome a, b, c, d, e;
  ASSERT_TRUE(s.submit(makeJob({seq(1)}, a)).isOk());
  auto jb = makeJob({seq(2)}, b);
  auto jc = makeJob({seq(3)}, c);
  auto jd = makeJob({seq(4)}, d);
  auto je = makeJob({seq(5)}, e);
  jd->deadline_ns = shm::monotonicNowNs() - 1;  // already expired when the batch forms
  for (auto& j : {jb, jc, jd, je}) ASSERT_TRUE(s.submit(j).isOk());
  s.cancel(jc);
  ASSERT_EQ(c.f.wait_for(30s), std::future_status::ready);  // dropped by the scheduler thread
  EXPECT_EQ(c.f.get().code(), StatusCode::kCancelled);
  ASSERT_TRUE(w.completeNext());
  ASSERT_EQ(d.f.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(d.f.get().code(), StatusCode::kDeadlineExceeded);
  ASSERT_EQ(w.submitted().size(), 2u);
  EXPECT_EQ(w.submitted()[1].seq_lens, (std::vector<int32_t>{2, 5}));
  EXPECT_EQ(w.submitted()[1].deadline_ns, 0);
  ASSERT_TRUE(w.completeNext());
  EXPECT_TRUE(b.f.get().isOk());
  EXPECT_TRUE(e.f.get().isOk());
}

TEST(EmbedSchedulerBatching, CapZeroFillsEveryFreeSlot) {
  FakeWorker w(3, 2);
  SchedulerOptions o;
  o.max_inflight_batches = 0;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  Outcome a, b, c, d;
  for (auto* out : {&a, &b, &c, &d}) ASSERT_TRUE(s.submit(makeJob({seq(2)}, *out)).isOk());
  EXPECT_EQ(w.submitted().size(), 3u);  // depth 3: three single-request batches at once
  EXPECT_EQ(s.stats().queued_requests, 1u);
  while (!d.ready()) {
    ASSERT_TRUE(waitFor([&] { return w.heldCount() > 0; }));
    w.completeNext();
  }
  EXPECT_EQ(s.maxInflightBatchesSeen(), 3u);
}

TEST(EmbedSchedulerBatching, NeverMoreThanCapInFlightUnderConcurrentLoad) {
  FakeWorker w(4, 2);
  SchedulerOptions o;
  o.max_inflight_batches = 2;
  o.max_batch_tokens = 32;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  constexpr int kThreads = 6, kPer = 40;
  size_t most_held = 0;
  const int ok = runConcurrentSubmitters(
      s, w, kThreads, kPer,
      [](int t, int i) { return std::vector<std::vector<int32_t>>{seq(1 + (i % 5), t)}; },
      [](int, int, const EmbedJob&) { return true; }, &most_held);
  EXPECT_EQ(ok, kThreads * kPer);
  EXPECT_LE(s.maxInflightBatchesSeen(), 2u);
  EXPECT_LE(most_held, 2u);
  EXPECT_EQ(s.inflightBatches(), 0u);
  // What the scheduler guarantees whatever the interleaving: every sequence went to the worker
  // exactly once, in batches within the budget. (How many requests share a batch depends on how
  // the threads happen to interleave: a full test run on a loaded 2-core machine saw one batch
  // per request, so coalescing is asserted only where the tests fix the order: the
  // EmbedSchedulerBatching cases above and tests/integration/tulip_batching.)
  size_t seqs = 0, tokens = 0;
  for (const auto& b : w.submitted()) {
    EXPECT_LE(b.tokens.size(), 32u);
    EXPECT_FALSE(b.seq_lens.empty());
    seqs += b.seq_lens.size();
    tokens += b.tokens.size();
  }
  EXPECT_EQ(seqs, static_cast<size_t>(kThreads * kPer));
  size_t want_tokens = 0;
  for (int i = 0; i < kPer; ++i) want_tokens += kThreads * (1 + (i % 5));
  EXPECT_EQ(tokens, want_tokens);
  EXPECT_EQ(s.stats().queued_requests, 0u);
  EXPECT_EQ(s.stats().queued_tokens, 0u);
}

// --- the staged batch formed late [TAG_EMBED_LATE_STAGE] ------------------------------------------

TEST(BatchCostModel, FitsFixedAndPerTokenCost) {
  BatchCostModel m;
  EXPECT_EQ(m.predict(100), 0);
  m.add(100, 3'000'000);  // one size seen: proportional
  EXPECT_EQ(m.predict(200), 6'000'000);
  for (int i = 0; i < 100; ++i) {
    const uint64_t tokens = 64u << (i % 4);  // 64..512
    m.add(tokens, 2'000'000 + 1'000 * static_cast<int64_t>(tokens));
  }
  // The first sample (off the line) has decayed away: 2 ms + 1 µs per token.
  EXPECT_NEAR(static_cast<double>(m.predict(4096)), 6'096'000.0, 60'000.0);
  EXPECT_NEAR(static_cast<double>(m.predict(1)), 2'001'000.0, 60'000.0);
  EXPECT_LT(m.error(), 200'000);
  // Never negative, even from samples that fall with size.
  BatchCostModel d;
  for (int i = 0; i < 8; ++i) d.add(100 + 100 * i, 1'000'000 - 100'000 * i);
  EXPECT_GE(d.predict(10'000), 0);
  EXPECT_GT(d.predict(100), 0);
}

std::atomic<int64_t> g_fake_now{1'000'000'000};
int64_t fakeNow() { return g_fake_now.load(); }

// Exact, on a fake clock: the fake worker runs nothing until the test completes a batch, and the
// test moves the clock.
TEST(EmbedSchedulerLateStage, ArrivalsDuringARunningBatchGoTogetherShortlyBeforeItEnds) {
  FakeWorker w(4, 2);
  SchedulerOptions o;  // cap 2, lead 1000 µs: the defaults
  o.clock_ns = fakeNow;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  // Teach the cost model: batches of 4..32 tokens, each 2 ms + 10 µs per token.
  for (int i = 0; i < 20; ++i) {
    Outcome out;
    const int len = 4 << (i % 4);
    ASSERT_TRUE(s.submit(makeJob({seq(len)}, out)).isOk());
    ASSERT_EQ(w.heldCount(), 1u);  // nothing running: out at once
    g_fake_now += 2'000'000 + 10'000 * len;
    ASSERT_TRUE(w.completeNext());
    ASSERT_TRUE(out.f.get().isOk());
  }
  ASSERT_EQ(w.submitted().size(), 20u);
  // A runs (16 tokens: predicted 2.16 ms). B, C, D arrive 0.1, 0.2, 0.3 ms into it: they wait.
  Outcome a, b, c, d;
  ASSERT_TRUE(s.submit(makeJob({seq(16, 100)}, a)).isOk());
  ASSERT_EQ(w.submitted().size(), 21u);
  int k = 0;
  for (auto* out : {&b, &c, &d}) {
    g_fake_now += 100'000;
    ASSERT_TRUE(s.submit(makeJob({seq(2, 200 + 10 * k++)}, *out)).isOk());
  }
  EXPECT_EQ(w.submitted().size(), 21u);
  EXPECT_EQ(s.stats().queued_requests, 3u);
  // 1.5 ms in: within the lead (1 ms) of A's predicted end. The scheduler thread forms them into
  // one batch, staged behind A.
  g_fake_now += 1'200'000;
  s.poke();
  ASSERT_TRUE(waitFor([&] { return w.submitted().size() == 22u; }));
  EXPECT_EQ(w.submitted()[21].seq_lens, (std::vector<int32_t>{2, 2, 2}));
  EXPECT_EQ(w.heldCount(), 2u);
  EXPECT_EQ(s.stats().queued_requests, 0u);
  // A completes on time and the staged batch runs; E and F arrive during it and wait.
  g_fake_now += 660'000;
  ASSERT_TRUE(w.completeNext());
  EXPECT_TRUE(a.f.get().isOk());
  Outcome e, f;
  g_fake_now += 100'000;
  ASSERT_TRUE(s.submit(makeJob({seq(3, 300)}, e)).isOk());
  ASSERT_TRUE(s.submit(makeJob({seq(3, 400)}, f)).isOk());
  EXPECT_EQ(w.submitted().size(), 22u);
  // The staged batch ends before its predicted time: its completion sends E and F at once.
  g_fake_now += 100'000;
  ASSERT_TRUE(w.completeNext());
  ASSERT_EQ(w.submitted().size(), 23u);
  EXPECT_EQ(w.submitted()[22].seq_lens, (std::vector<int32_t>{3, 3}));
  for (auto* out : {&b, &c, &d}) EXPECT_TRUE(out->f.get().isOk());
  g_fake_now += 2'000'000;
  ASSERT_TRUE(w.completeNext());
  for (auto* out : {&e, &f}) EXPECT_TRUE(out->f.get().isOk());
}

// Same arrivals with immediate staging: B goes alone at once, C and D wait for a third batch.
TEST(EmbedSchedulerLateStage, ImmediateStagingSplitsTheSameArrivals) {
  FakeWorker w(4, 2);
  SchedulerOptions o;
  o.stage_lead_us = 0;
  o.clock_ns = fakeNow;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  for (int i = 0; i < 12; ++i) {
    Outcome out;
    ASSERT_TRUE(s.submit(makeJob({seq(4 << (i % 4))}, out)).isOk());
    g_fake_now += 2'000'000;
    ASSERT_TRUE(w.completeNext());
  }
  Outcome a, b, c, d;
  ASSERT_TRUE(s.submit(makeJob({seq(16, 100)}, a)).isOk());
  for (auto* out : {&b, &c, &d}) {
    g_fake_now += 200'000;
    ASSERT_TRUE(s.submit(makeJob({seq(2, 200)}, *out)).isOk());
  }
  ASSERT_EQ(w.submitted().size(), 14u);
  EXPECT_EQ(w.submitted()[13].seq_lens, (std::vector<int32_t>{2}));
  ASSERT_TRUE(w.completeNext());
  ASSERT_EQ(w.submitted().size(), 15u);
  EXPECT_EQ(w.submitted()[14].seq_lens, (std::vector<int32_t>{2, 2}));
  while (w.completeNext()) {
  }
  for (auto* out : {&a, &b, &c, &d}) EXPECT_TRUE(out->f.get().isOk());
}

// A worker that runs its batches one after another on its own thread, each a sleep of
// fixed + per_seq x sequences (like a GPU: cost grows with the batch, a fixed part per batch),
// and records when each ran and the first token of each of its sequences.
class SlowWorker final : public Worker {
 public:
  struct Ran {
    int64_t start_ns, end_ns;
    std::vector<int32_t> markers;
  };
  SlowWorker(std::chrono::microseconds fixed, std::chrono::microseconds per_seq)
      : fixed_(fixed), per_seq_(per_seq) {
    facts_.hidden_size = 2;
    facts_.max_seq_len = 64;
    facts_.vocab_size = 100000;
    thread_ = std::thread([this] { run(); });
  }
  ~SlowWorker() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  bool ready() const override { return true; }
  shm::ModelFacts facts() const override { return facts_; }
  uint32_t depth() const override { return 4; }
  uint32_t inflight() const override {
    std::lock_guard<std::mutex> l(mu_);
    return static_cast<uint32_t>(queue_.size()) + (busy_ ? 1 : 0);
  }
  uint64_t maxBatchInts() const override { return 1 << 20; }
  uint64_t maxBatchFloats() const override { return 1 << 20; }
  Status trySubmit(WorkBatch batch, WorkDone done) override {
    std::lock_guard<std::mutex> l(mu_);
    if (queue_.size() + (busy_ ? 1 : 0) >= 4) return failedPrecondition("no free slot");
    queue_.push_back({std::move(batch), std::move(done)});
    cv_.notify_all();
    return okStatus();
  }
  void setOnChange(std::function<void()> fn) override { on_change_ = std::move(fn); }
  std::vector<Ran> ran() const {
    std::lock_guard<std::mutex> l(mu_);
    return ran_;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      auto [batch, done] = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      l.unlock();
      Ran r{shm::monotonicNowNs(), 0, {}};
      std::this_thread::sleep_for(fixed_ + per_seq_ * batch.seq_lens.size());
      r.end_ns = shm::monotonicNowNs();
      size_t off = 0;
      for (int32_t len : batch.seq_lens) {
        r.markers.push_back(batch.tokens[off]);
        off += static_cast<size_t>(len);
      }
      std::vector<float> rows(batch.seq_lens.size() * facts_.hidden_size, 1.0f);
      WorkResult res;
      res.rows = rows;
      res.num_rows = static_cast<uint32_t>(batch.seq_lens.size());
      res.cols = facts_.hidden_size;
      done(res);
      l.lock();
      busy_ = false;
      ran_.push_back(std::move(r));
      l.unlock();
      if (on_change_) on_change_();
      l.lock();
    }
  }
  shm::ModelFacts facts_;
  const std::chrono::microseconds fixed_, per_seq_;
  std::function<void()> on_change_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<WorkBatch, WorkDone>> queue_;
  std::vector<Ran> ran_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

struct Batch {
  int64_t start_ns, end_ns;
  std::vector<int32_t> markers;  // the first token of each sequence
};

struct ClosedLoopResult {
  double seqs_per_batch = 0;
  int requests = 0;
  // Requests that did not run in the batch after the one ahead of them on arrival (the batch
  // running then, else the first to start after it), nor in that one.
  int over_one_batch = 0;
  int64_t worst_wait_ns = 0;  // arrival to the start of its batch
  int64_t longest_batch_ns = 0;
};

// For every request: the batch ahead of it when it arrived (the one running, or if none the first
// to start after its arrival: a concurrent arrival's), and the batch it ran in: that one or the
// very next. `warm`: batches before the clients started.
ClosedLoopResult analyse(const std::vector<Batch>& ran, size_t warm,
                         const std::vector<std::pair<int32_t, int64_t>>& arrivals) {
  ClosedLoopResult res;
  size_t seqs = 0;
  for (size_t b = warm; b < ran.size(); ++b) {
    seqs += ran[b].markers.size();
    res.longest_batch_ns = std::max(res.longest_batch_ns, ran[b].end_ns - ran[b].start_ns);
  }
  res.seqs_per_batch = double(seqs) / double(ran.size() - warm);
  for (const auto& [marker, t] : arrivals) {
    size_t mine = ran.size(), ahead = ran.size();
    for (size_t b = 0; b < ran.size(); ++b) {
      for (int32_t m : ran[b].markers) {
        if (m == marker) mine = b;
      }
      if (ahead == ran.size() && t < ran[b].end_ns) ahead = b;  // running at t, or next to start
    }
    EXPECT_LT(mine, ran.size()) << marker;
    if (mine == ran.size()) continue;
    ++res.requests;
    if (mine > ahead + 1) ++res.over_one_batch;
    res.worst_wait_ns = std::max(res.worst_wait_ns, ran[mine].start_ns - t);
  }
  return res;
}

// `clients` closed-loop clients, each sending `rounds` one-sequence requests back to back (1 ms
// between an answer and the next request, like ivy's hop), through a scheduler on a worker that
// runs its batches one after another, each taking 20 ms + 5 ms per sequence — simulated on the
// scheduler's fake clock, so the run is exact and the same on any machine, loaded or not. The
// test plays the clients and the worker, event by event in time order: an arrival (submit at that
// time), the running batch's end (complete it), and the time the scheduler said it would form a
// held-back batch (stats().staged_at_ns: move the clock there and wait until the scheduler's
// own thread, not poked, has handed the batch over).
ClosedLoopResult closedLoop(uint32_t stage_lead_us, int clients, int rounds) {
  constexpr int64_t kFixedNs = 20'000'000, kPerSeqNs = 5'000'000, kThinkNs = 1'000'000;
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  FakeWorker w(4, 2);
  SchedulerOptions o;
  o.stage_lead_us = stage_lead_us;
  o.clock_ns = fakeNow;
  EmbedScheduler s(w, o);
  std::vector<int64_t> handed;  // per batch on the worker: when it was handed over
  std::vector<Batch> ran;
  int64_t last_end = 0;
  auto noteHanded = [&] {
    while (handed.size() < w.submitted().size()) handed.push_back(g_fake_now.load());
  };
  // The oldest batch not yet complete runs from its hand-over or the previous batch's end.
  auto headEnd = [&](int64_t* start) {
    if (ran.size() >= handed.size()) return kNever;
    *start = std::max(handed[ran.size()], last_end);
    const WorkBatch b = w.submitted()[ran.size()];
    return *start + kFixedNs + kPerSeqNs * static_cast<int64_t>(b.seq_lens.size());
  };
  auto completeHead = [&] {
    int64_t start = 0;
    const int64_t end = headEnd(&start);
    const WorkBatch b = w.submitted()[ran.size()];
    Batch r{start, end, {}};
    size_t off = 0;
    for (int32_t len : b.seq_lens) {
      r.markers.push_back(b.tokens[off]);
      off += static_cast<size_t>(len);
    }
    ran.push_back(std::move(r));
    last_end = end;
    g_fake_now = end;
    EXPECT_TRUE(w.completeNext());
    noteHanded();  // what the completion dispatched
  };
  // Warm-up: three lone batches of 1, 2 and 3 sequences teach the cost model.
  for (int n = 1; n <= 3; ++n) {
    Outcome out;
    std::vector<std::vector<int32_t>> in(n, seq(8, 1));
    EXPECT_TRUE(s.submit(makeJob(std::move(in), out)).isOk());
    noteHanded();
    completeHead();
    EXPECT_TRUE(out.ready());
  }
  const size_t warm = ran.size();
  struct Client {
    int64_t next = 0;  // next arrival; kNever while a request is out
    int round = 0;
    int32_t marker = 0;
    std::unique_ptr<Outcome> out;
  };
  std::vector<Client> cs(static_cast<size_t>(clients));
  for (auto& c : cs) c.next = g_fake_now.load() + kThinkNs;
  std::vector<std::pair<int32_t, int64_t>> arrivals;  // (marker, submitted at)
  int answered = 0;
  while (answered < clients * rounds) {
    int64_t start = 0;
    const int64_t end = headEnd(&start);
    const SchedulerStats st = s.stats();
    const int64_t stage = st.queued_requests > 0 && st.staged_at_ns != 0 ? st.staged_at_ns : kNever;
    size_t first = 0;
    for (size_t c = 1; c < cs.size(); ++c) {
      if (cs[c].next < cs[first].next) first = c;
    }
    const int64_t arrive = cs[first].next;
    if (stage == kNever && end == kNever && arrive == kNever) {
      ADD_FAILURE() << "stalled: nothing on the worker, nothing held, every client waiting";
      break;
    }
    if (stage <= end && stage <= arrive) {  // on a tie the held batch goes first
      const size_t before = w.submitted().size();
      g_fake_now = std::max(stage, g_fake_now.load());
      if (!waitFor([&] { return w.submitted().size() > before; }, 10000ms)) {
        ADD_FAILURE() << "the held batch was not handed over at its time";
        break;
      }
      noteHanded();
    } else if (end <= arrive) {
      completeHead();
      for (auto& c : cs) {
        if (c.out && c.out->ready()) {
          EXPECT_TRUE(c.out->f.get().isOk());
          c.out.reset();
          ++answered;
          if (++c.round < rounds) c.next = end + kThinkNs;
        }
      }
    } else {
      Client& c = cs[first];
      g_fake_now = arrive;
      c.marker = 100 + static_cast<int32_t>(first) * rounds + c.round;
      c.out = std::make_unique<Outcome>();
      c.next = kNever;
      arrivals.emplace_back(c.marker, arrive);
      EXPECT_TRUE(s.submit(makeJob({seq(8, c.marker)}, *c.out)).isOk());
      noteHanded();
    }
  }
  return analyse(ran, warm, arrivals);
}

TEST(EmbedSchedulerLateStage, ConcurrentSmallRequestsCoalesceAndWaitAboutOneBatch) {
  // 16 clients x 8 requests: with late staging every request runs right after the batch ahead of
  // it (so it waits at most about one batch), and batches carry ~8 sequences on average (the 16
  // clients in two alternating groups). Exact: the fake clock makes the run the same everywhere.
  const ClosedLoopResult late = closedLoop(1000, 16, 8);
  EXPECT_EQ(late.requests, 16 * 8);
  EXPECT_EQ(late.over_one_batch, 0);
  EXPECT_GE(late.seqs_per_batch, 7.5);
  EXPECT_LE(late.worst_wait_ns, late.longest_batch_ns);
  std::printf("late staging: %.2f sequences per batch, %d of %d requests waited past the next "
              "batch, worst wait %.1f ms (longest batch %.1f ms)\n",
              late.seqs_per_batch, late.over_one_batch, late.requests, late.worst_wait_ns / 1e6,
              late.longest_batch_ns / 1e6);
}

TEST(EmbedSchedulerLateStage, ImmediateStagingMakesClosedLoopClientsWaitTwoBatches) {
  // What the test above guards against: with the staged batch formed at once, the first client
  // back after a completion goes out alone and the others wait behind it, a whole second batch.
  const ClosedLoopResult now = closedLoop(0, 16, 8);
  EXPECT_EQ(now.requests, 16 * 8);
  EXPECT_GT(now.over_one_batch, 16 * 8 * 3 / 4);
  EXPECT_LT(now.seqs_per_batch, 6.0);
  std::printf("immediate staging: %.2f sequences per batch, %d of %d requests waited past the "
              "next batch, worst wait %.1f ms (longest batch %.1f ms)\n",
              now.seqs_per_batch, now.over_one_batch, now.requests, now.worst_wait_ns / 1e6,
              now.longest_batch_ns / 1e6);
}

// The same closed loop on the real clock: the worker sleeps its batch times on its own thread, 16
// client threads submit and wait, the scheduler's thread wakes on its own for held batches. How
// long each request waits there depends on how the machine runs those threads (a loaded 2-core
// machine under a sanitizer runs some late), so this checks only what must hold whatever the
// timing: every request is answered, its sequence run exactly once. Run by the TSan stage for its
// races.
TEST(EmbedSchedulerLateStage, RealClockClosedLoopAnswersEveryRequest) {
  SlowWorker w(20ms, 5ms);
  EmbedScheduler s(w, SchedulerOptions{});
  w.setOnChange([&] { s.poke(); });
  for (int n = 1; n <= 3; ++n) {  // teach the cost model
    Outcome out;
    std::vector<std::vector<int32_t>> in(n, seq(8, 1));
    ASSERT_TRUE(s.submit(makeJob(std::move(in), out)).isOk());
    ASSERT_TRUE(out.f.get().isOk());
  }
  std::atomic<int> answered{0};
  std::vector<std::thread> ts;
  for (int c = 0; c < 16; ++c) {
    ts.emplace_back([&, c] {
      for (int r = 0; r < 8; ++r) {
        Outcome out;
        auto j = makeJob({seq(8, 1000 + c * 100 + r)}, out);
        ASSERT_TRUE(s.submit(j).isOk());
        ASSERT_EQ(out.f.wait_for(60s), std::future_status::ready);
        ASSERT_TRUE(out.f.get().isOk());
        ++answered;
        std::this_thread::sleep_for(1ms);
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(answered.load(), 16 * 8);
  // Every request's sequence ran exactly once.
  const auto ran = w.ran();
  std::map<int32_t, int> times;
  size_t seqs = 0;
  for (size_t b = 3; b < ran.size(); ++b) {
    for (int32_t m : ran[b].markers) ++times[m];
    seqs += ran[b].markers.size();
  }
  EXPECT_EQ(times.size(), 16u * 8u);
  for (const auto& [m, n] : times) EXPECT_EQ(n, 1) << "marker " << m;
  std::printf("real clock: %zu batches for %zu requests (%.2f sequences per batch)\n",
              ran.size() - 3, seqs, double(seqs) / double(ran.size() - 3));
}

// --- fair batching across flows [TAG_EMBED_FAIR] ------------------------------------------------
// Exact: the fake worker runs nothing until the test completes a batch, and dispatch happens inline,
// so which batch each sequence lands in is fixed by the order of submissions and completions.

// Index of the first submitted batch holding a sequence that starts with `marker`, or -1.
int batchHolding(const std::vector<WorkBatch>& bs, int32_t marker) {
  for (size_t i = 0; i < bs.size(); ++i) {
    size_t off = 0;
    for (int32_t len : bs[i].seq_lens) {
      if (bs[i].tokens[off] == marker) return static_cast<int>(i);
      off += static_cast<size_t>(len);
    }
  }
  return -1;
}

// A worker shaped like the default deployment: 512-token sequences, channel sized for the budget.
FakeWorker& bigModelWorker(FakeWorker& w) {
  w.facts_.max_seq_len = 512;
  w.facts_.vocab_size = 1000;
  return w;
}

// `chunks` jobs that together are a 2048 x 512-token request (1,048,576 tokens: ivy's old default
// --max-request-tokens) under one request id, the way ivy sends a split request (chunks = 1: one
// job, the way a direct gRPC caller sends it). Token id 5 everywhere, so every row is 2560 + k.
std::vector<std::shared_ptr<EmbedJob>> maxSizeRequest(int chunks, std::vector<Outcome>& outs) {
  std::vector<std::shared_ptr<EmbedJob>> jobs;
  const int per = 2048 / chunks;
  for (int c = 0; c < chunks; ++c) {
    std::vector<std::vector<int32_t>> inputs(per, std::vector<int32_t>(512, 5));
    auto j = makeJob(std::move(inputs), outs[c]);
    j->request_id = "big";
    jobs.push_back(std::move(j));
  }
  return jobs;
}

// A max-size request is queued first; small requests (one 3-token sequence each, their own request
// ids) arrive one by one while it is being served, some alone and some together. Each must be in
// one of the next two batches formed after it arrived (in fact the next one), never behind the big
// request's 128 batches; the big request still completes with every row right.
void smallRequestsOvertakeAMaxSizeRequest(int chunks) {
  FakeWorker w(4, 2);
  bigModelWorker(w);
  SchedulerOptions o;  // the defaults: 8192-token batches, 256 sequences, 2 in flight, 1 Mi queue
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  std::vector<Outcome> big_out(chunks);
  auto big = maxSizeRequest(chunks, big_out);
  for (auto& j : big) ASSERT_TRUE(s.submit(j).isOk());
  // The cap: one running, one staged (16 x 512 tokens; a chunk of 8 when the first chunk went out
  // alone at once).
  ASSERT_EQ(w.submitted().size(), 2u);
  EXPECT_EQ(w.submitted()[0].seq_lens.size(), std::min<size_t>(16, 2048 / chunks));

  struct Small {
    Outcome out;
    std::shared_ptr<EmbedJob> job;
    int arrived_after = 0;  // batches formed before it arrived
  };
  std::vector<std::unique_ptr<Small>> smalls;
  auto arrive = [&](int n) {
    for (int k = 0; k < n; ++k) {
      auto sm = std::make_unique<Small>();
      const int32_t marker = 900 + static_cast<int32_t>(smalls.size());
      sm->job = makeJob({{marker, 1, 2}}, sm->out);
      sm->job->request_id = "small-" + std::to_string(smalls.size());
      sm->arrived_after = static_cast<int>(w.submitted().size());
      ASSERT_TRUE(s.submit(sm->job).isOk());
      smalls.push_back(std::move(sm));
    }
  };
  // Arrivals interleaved with completions: 1, 3 at once, none, 1, 10 at once, ... over the first
  // 40 batches of the big request's 128.
  const int pattern[] = {1, 3, 0, 1, 10, 0, 0, 2, 1, 5};
  for (int round = 0; round < 40; ++round) {
    arrive(pattern[round % 10]);
    ASSERT_TRUE(w.completeNext());
  }
  while (w.completeNext()) {
  }
  const auto bs = w.submitted();
  // Before: 2048 sequences of 512 tokens at 16 per batch = 128 batches, plus the smalls' seats.
  EXPECT_GE(bs.size(), 128u);
  ASSERT_EQ(smalls.size(), 92u);
  for (size_t i = 0; i < smalls.size(); ++i) {
    Small& sm = *smalls[i];
    ASSERT_EQ(sm.out.f.wait_for(30s), std::future_status::ready);
    EXPECT_TRUE(sm.out.f.get().isOk()) << i;
    const int at = batchHolding(bs, 900 + static_cast<int32_t>(i));
    ASSERT_GE(at, 0) << i;
    EXPECT_LT(at, sm.arrived_after + 2) << "small request " << i << " arrived after batch "
                                        << sm.arrived_after << " and went out in batch " << at;
    EXPECT_LE(sm.job->queue_batches, 1u) << i;
    EXPECT_EQ(sm.job->values[0], 900.0f + i + 3.0f);  // row = sum(ids) + k
  }
  for (int c = 0; c < chunks; ++c) {
    ASSERT_EQ(big_out[c].f.wait_for(30s), std::future_status::ready);
    EXPECT_TRUE(big_out[c].f.get().isOk());
    const auto& v = big[c]->values;
    ASSERT_EQ(v.size(), (2048u / chunks) * 2);
    for (size_t r = 0; r < v.size(); r += 2) ASSERT_EQ(v[r], 2560.0f) << c << " " << r;
  }
  for (const auto& b : bs) EXPECT_LE(b.tokens.size(), o.max_batch_tokens);
  EXPECT_EQ(s.stats().queued_requests, 0u);
  EXPECT_EQ(s.stats().queued_tokens, 0u);
}

TEST(EmbedSchedulerFairness, SmallRequestsOvertakeAMaxSizeRequestOfOneJob) {
  smallRequestsOvertakeAMaxSizeRequest(1);
}

TEST(EmbedSchedulerFairness, SmallRequestsOvertakeAMaxSizeRequestSplitIntoChunksByIvy) {
  // ivy's default split: chunks of at most 4096 tokens = 8 sequences of 512, 256 chunks sharing the
  // request id. Were each chunk a flow of its own, a small request would wait a whole rotation.
  smallRequestsOvertakeAMaxSizeRequest(256);
}

TEST(EmbedSchedulerFairness, RequestsOfOneIdShareOneTurn) {
  FakeWorker w(4, 2);
  SchedulerOptions o;
  o.max_inflight_batches = 1;
  o.max_batch_seqs = 4;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  Outcome x, a1, a2, b, c1, c2;
  ASSERT_TRUE(s.submit(makeJob({seq(1)}, x)).isOk());  // running: the rest queues
  auto ja1 = makeJob({seq(1, 10), seq(1, 11), seq(1, 12)}, a1);
  auto ja2 = makeJob({seq(1, 13), seq(1, 14)}, a2);
  auto jb = makeJob({seq(2, 20), seq(2, 21), seq(2, 22)}, b);
  ja1->request_id = ja2->request_id = "a";  // one flow of two requests (two chunks of one call)
  jb->request_id = "b";
  for (auto& j : {ja1, ja2, jb}) ASSERT_TRUE(s.submit(j).isOk());
  EXPECT_EQ(s.stats().queued_requests, 3u);
  // Then two flows of their own (no id): c1 and c2.
  auto jc1 = makeJob({seq(3, 30), seq(3, 31)}, c1);
  auto jc2 = makeJob({seq(3, 40)}, c2);
  for (auto& j : {jc1, jc2}) ASSERT_TRUE(s.submit(j).isOk());
  // Four flows, four seats: one sequence each, flow "a" from its first request. (Were a1 and a2
  // two flows, they would take two seats and c2 would wait.)
  ASSERT_TRUE(w.completeNext());
  ASSERT_EQ(w.submitted().size(), 2u);
  EXPECT_EQ(w.submitted()[1].tokens, (std::vector<int32_t>{10, 20, 21, 30, 31, 32, 40, 41, 42}));
  // c2 is done with; a, b, c1 took part and keep their order: a goes on into its second request.
  ASSERT_TRUE(w.completeNext());
  ASSERT_EQ(w.submitted().size(), 3u);
  EXPECT_EQ(w.submitted()[2].tokens, (std::vector<int32_t>{11, 12, 21, 22, 31, 32, 33}));
  // a's second request, then b's last sequence; a goes on with its last one (b is done).
  ASSERT_TRUE(w.completeNext());
  ASSERT_EQ(w.submitted().size(), 4u);
  EXPECT_EQ(w.submitted()[3].tokens, (std::vector<int32_t>{13, 14, 22, 23}));
  ASSERT_TRUE(w.completeNext());
  EXPECT_EQ(w.submitted().size(), 4u);
  for (auto* out : {&x, &a1, &a2, &b, &c1, &c2}) EXPECT_TRUE(out->f.get().isOk());
  EXPECT_EQ(ja2->values[1 * 2], 14.0f);
  EXPECT_EQ(jb->values[2 * 2], 22.0f + 23.0f);
  EXPECT_EQ(jc1->values[1 * 2], 31.0f + 32.0f + 33.0f);
  EXPECT_EQ(s.stats().queued_requests, 0u);
}

TEST(EmbedSchedulerFairness, AFlowLeftOutOfABatchOpensTheNextOne) {
  FakeWorker w(4, 2);
  SchedulerOptions o;
  o.max_inflight_batches = 1;
  o.max_batch_tokens = 10;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  Outcome x, a, b, c;
  ASSERT_TRUE(s.submit(makeJob({seq(1)}, x)).isOk());
  auto ja = makeJob({seq(4, 10), seq(4, 20)}, a);  // 8 tokens
  auto jb = makeJob({seq(3, 30), seq(3, 40)}, b);
  auto jc = makeJob({seq(9, 50)}, c);               // never fits beside anything
  for (auto& j : {ja, jb, jc}) ASSERT_TRUE(s.submit(j).isOk());
  // a0 (4) + b0 (3) = 7: c0 (9) does not fit and sits out; a1 (4) does not fit either, b1 does.
  ASSERT_TRUE(w.completeNext());
  EXPECT_EQ(lensOf(w.submitted()).back(), (std::vector<int32_t>{4, 3, 3}));
  // c got nothing, so it goes first now, alone (a1 would cross the budget).
  ASSERT_TRUE(w.completeNext());
  EXPECT_EQ(lensOf(w.submitted()).back(), (std::vector<int32_t>{9}));
  ASSERT_TRUE(w.completeNext());
  EXPECT_EQ(lensOf(w.submitted()).back(), (std::vector<int32_t>{4}));
  ASSERT_TRUE(w.completeNext());
  EXPECT_EQ(w.submitted().size(), 4u);
  for (auto* out : {&x, &a, &b, &c}) EXPECT_TRUE(out->f.get().isOk());
  EXPECT_EQ(jc->queue_batches, 1u);  // one batch (a0 b0 b1) was formed ahead of it
  EXPECT_EQ(ja->queue_batches, 0u);
}

TEST(EmbedSchedulerFairness, IncompatibleFlowSitsOutAndOpensTheNextBatch) {
  FakeWorker w(4, 2);
  SchedulerOptions o;
  o.max_inflight_batches = 1;
  EmbedScheduler s(w, o);
  w.setOnChange([&] { s.poke(); });
  Outcome x, a, b, c;
  ASSERT_TRUE(s.submit(makeJob({seq(1)}, x)).isOk());
  auto ja = makeJob({seq(2, 10)}, a);
  auto jb = makeJob({seq(3, 20)}, b);
  jb->kind = shm::BatchKind::kScore;  // classification head
  auto jc = makeJob({seq(4, 30)}, c);
  for (auto& j : {ja, jb, jc}) ASSERT_TRUE(s.submit(j).isOk());
  ASSERT_TRUE(w.completeNext());
  EXPECT_EQ(w.submitted()[1].kind, shm::BatchKind::kEmbed);
  EXPECT_EQ(w.submitted()[1].seq_lens, (std::vector<int32_t>{2, 4}));  // a and c; b sits out
  ASSERT_TRUE(w.completeNext());
  EXPECT_EQ(w.submitted()[2].kind, shm::BatchKind::kScore);
  EXPECT_EQ(w.submitted()[2].seq_lens, (std::vector<int32_t>{3}));
  ASSERT_TRUE(w.completeNext());
  for (auto* out : {&x, &a, &b, &c}) EXPECT_TRUE(out->f.get().isOk());
  EXPECT_EQ(jb->values, (std::vector<float>{3.0f}));
}

}  // namespace
}  // namespace garden::tulip
