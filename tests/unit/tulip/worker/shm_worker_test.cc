#include "services/tulip/worker/shm_worker.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/shm/llm_batch.h"

namespace garden::tulip {
namespace {

using namespace std::chrono_literals;

std::string fakeRose() {
  const char* b = std::getenv("GARDEN_BUILD_DIR");
  return std::string(b ? b : ".") + "/tests/fakes/fake-rose";
}

std::string uniqueName(const char* tag) {
  static int n = 0;
  return "/garden-wtest-" + std::string(tag) + "-" + std::to_string(getpid()) + "-" +
         std::to_string(n++);
}

template <typename Pred>
bool waitFor(Pred pred, std::chrono::milliseconds limit = 30000ms) {
  auto t0 = std::chrono::steady_clock::now();
  while (!pred()) {
    if (std::chrono::steady_clock::now() - t0 > limit) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

ShmWorkerOptions opts(const char* tag, std::vector<std::string> args = {}) {
  ShmWorkerOptions o;
  o.shm_name = uniqueName(tag);
  o.layout = shm::Layout{2, 1 << 16, 1 << 16};
  o.rose_bin = fakeRose();
  o.rose_args = std::move(args);
  // Generous: a fake-rose starved of CPU for a moment on a loaded machine is not stuck. The test
  // of heartbeat detection sets its own short timeout.
  o.heartbeat_timeout = 10000ms;
  o.backoff_min = 50ms;
  o.backoff_max = 200ms;
  return o;
}

WorkBatch batch(std::vector<std::vector<int32_t>> seqs) {
  WorkBatch b;
  for (auto& s : seqs) {
    b.tokens.insert(b.tokens.end(), s.begin(), s.end());
    b.seq_lens.push_back(static_cast<int32_t>(s.size()));
  }
  return b;
}

struct Result1 {
  std::promise<std::pair<Status, std::vector<float>>> p;
  std::future<std::pair<Status, std::vector<float>>> f = p.get_future();
  WorkDone done() {
    return [this](const WorkResult& r) {
      p.set_value({r.status, std::vector<float>(r.rows.begin(), r.rows.end())});
    };
  }
};

TEST(ShmWorker, ServesBatchesThroughARealProcess) {
  auto w = ShmWorker::start(opts("serve"));
  ASSERT_TRUE(w.isOk()) << w.status().toString();
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  EXPECT_EQ((*w)->facts().hidden_size, 4u);
  EXPECT_STREQ((*w)->facts().name, "fake");
  for (int round = 0; round < 20; ++round) {
    Result1 r;
    ASSERT_TRUE((*w)->trySubmit(batch({{1, 2, 3}, {round}}), r.done()).isOk());
    ASSERT_EQ(r.f.wait_for(30s), std::future_status::ready);
    auto [st, rows] = r.f.get();
    ASSERT_TRUE(st.isOk()) << st.toString();
    ASSERT_EQ(rows.size(), 8u);
    EXPECT_EQ(rows[0], 6.0f);
    EXPECT_EQ(rows[1], 3.0f);
    EXPECT_EQ(rows[4], static_cast<float>(round));
  }
  EXPECT_EQ((*w)->restarts(), 0u);
}

TEST(ShmWorker, PipelinesUpToDepthThenRefuses) {
  auto w = ShmWorker::start(opts("depth", {"--delay-ms", "200"}));
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  Result1 a, b, c;
  ASSERT_TRUE((*w)->trySubmit(batch({{1}}), a.done()).isOk());
  ASSERT_TRUE((*w)->trySubmit(batch({{2}}), b.done()).isOk());
  EXPECT_EQ((*w)->inflight(), 2u);
  EXPECT_EQ((*w)->trySubmit(batch({{3}}), c.done()).code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(a.f.wait_for(30s), std::future_status::ready);
  ASSERT_EQ(b.f.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(b.f.get().second[0], 2.0f);
}

// The embedding scheduler submits the next batch from inside a completion callback, and tulip's
// trace reads rose's stamps from the result; with completion pacing on ([TAG_COMPLETION_SPIN],
// 2 ms batches) every result still arrives, in order, with ordered stamps.
TEST(ShmWorker, CallbackMaySubmitNextBatchAndStampsArePropagated) {
  ShmWorkerOptions o = opts("chain", {"--step-us", "2000"});
  o.completion_spin = 200us;
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  constexpr int kBatches = 20;
  struct Chain {
    std::mutex mu;
    std::vector<float> firsts;
    int bad_stamps = 0;
    Status error;
    std::promise<void> all;
  } chain;
  std::function<void(int)> submit = [&](int i) {
    Status st = (*w)->trySubmit(batch({{i, 1}}), [&, i](const WorkResult& r) {
      {
        std::lock_guard<std::mutex> l(chain.mu);
        if (!r.status.isOk() && chain.error.isOk()) chain.error = r.status;
        if (r.status.isOk()) chain.firsts.push_back(r.rows[0]);
        if (!(r.rose_taken_ns > 0 && r.rose_taken_ns <= r.rose_published_ns &&
              r.rose_published_ns <= r.seen_ns))
          ++chain.bad_stamps;
      }
      if (i + 1 < kBatches)
        submit(i + 1);  // from the worker's own thread
      else
        chain.all.set_value();
    });
    if (!st.isOk()) {
      std::lock_guard<std::mutex> l(chain.mu);
      chain.error = st;
      chain.all.set_value();
    }
  };
  submit(0);
  ASSERT_EQ(chain.all.get_future().wait_for(20s), std::future_status::ready);
  std::lock_guard<std::mutex> l(chain.mu);
  ASSERT_TRUE(chain.error.isOk()) << chain.error.toString();
  ASSERT_EQ(chain.firsts.size(), static_cast<size_t>(kBatches));
  for (int i = 0; i < kBatches; ++i) EXPECT_EQ(chain.firsts[i], static_cast<float>(i + 1));
  EXPECT_EQ(chain.bad_stamps, 0);
  EXPECT_EQ((*w)->restarts(), 0u);
}

TEST(ShmWorker, RejectsBatchLargerThanArena) {
  auto o = opts("big");
  o.layout.input_bytes = 4096;
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  Result1 r;
  EXPECT_EQ((*w)->trySubmit(batch({std::vector<int32_t>(2000, 1)}), r.done()).code(),
            StatusCode::kInvalidArgument);
}

TEST(ShmWorker, KilledWorkerFailsInflightAndRestarts) {
  auto w = ShmWorker::start(opts("kill", {"--delay-ms", "2000"}));
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  pid_t first = (*w)->workerPid();
  Result1 r;
  ASSERT_TRUE((*w)->trySubmit(batch({{5}}), r.done()).isOk());
  std::this_thread::sleep_for(100ms);
  kill(first, SIGKILL);
  ASSERT_EQ(r.f.wait_for(30s), std::future_status::ready);
  auto [st, rows] = r.f.get();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("signal 9"), std::string::npos) << st.message();
  ASSERT_TRUE(waitFor([&] { return (*w)->ready() && (*w)->workerPid() != first; }));
  EXPECT_EQ((*w)->restarts(), 1u);
  Result1 again;
  ASSERT_TRUE((*w)->trySubmit(batch({{7}}), again.done()).isOk());
  ASSERT_EQ(again.f.wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(again.f.get().first.isOk());
}

TEST(ShmWorker, CrashingWorkerReportsExitCode) {
  auto w = ShmWorker::start(opts("crash", {"--crash-after", "0"}));
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  Result1 r;
  ASSERT_TRUE((*w)->trySubmit(batch({{5}}), r.done()).isOk());
  ASSERT_EQ(r.f.wait_for(30s), std::future_status::ready);
  auto [st, rows] = r.f.get();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("exited with code 3"), std::string::npos) << st.message();
}

TEST(ShmWorker, StuckWorkerDetectedByHeartbeat) {
  auto o = opts("hang", {"--hang-after", "0"});
  o.heartbeat_timeout = 400ms;
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  pid_t first = (*w)->workerPid();
  Result1 r;
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE((*w)->trySubmit(batch({{5}}), r.done()).isOk());
  ASSERT_EQ(r.f.wait_for(30s), std::future_status::ready);
  auto [st, rows] = r.f.get();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("no heartbeat"), std::string::npos) << st.message();
  // Found by the heartbeat (400 ms), long before the step timeout (60 s) would have; the bound
  // leaves room for a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s);
  // The stuck process was killed, not left behind.
  EXPECT_TRUE(waitFor([&] { return kill(first, 0) != 0; }));
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
}

TEST(ShmWorker, StepThatNeverCompletesIsDetected) {
  auto o = opts("stall", {"--stall-after", "0"});
  o.step_timeout = 500ms;
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  Result1 r;
  ASSERT_TRUE((*w)->trySubmit(batch({{5}}), r.done()).isOk());
  ASSERT_EQ(r.f.wait_for(30s), std::future_status::ready);
  auto [st, rows] = r.f.get();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("did not complete within 500 ms"), std::string::npos)
      << st.message();
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
}

// [TAG_STEP_PROGRESS] A worker that reports progress is judged by it, not by the step limit: a
// 3 s step whose counter keeps moving completes although the step limit is 100 ms (the old rule
// killed any batch in flight longer than --step-timeout-ms).
TEST(ShmWorker, LongStepThatKeepsProgressingCompletes) {
  auto o = opts("longstep", {"--progress", "--delay-ms", "3000"});
  o.step_timeout = 100ms;
  o.progress_timeout = 1000ms;
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  Result1 r;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE((*w)->trySubmit(batch({{1, 2}}), r.done()).isOk());
  ASSERT_EQ(r.f.wait_for(60s), std::future_status::ready);
  const auto took = std::chrono::steady_clock::now() - t0;
  auto [st, rows] = r.f.get();
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(rows[0], 3.0f);
  EXPECT_GE(took, 3000ms);  // it really was in flight longer than both limits
  EXPECT_EQ((*w)->restarts(), 0u);
}

// A wedged compute: the fake's step thread keeps beating but its progress stops (what a compute
// thread that never returns looks like). Caught by progress (default 2.5 s) with the heartbeat
// and the step limit far away (10 s, 60 s). The bound leaves room for a loaded machine.
TEST(ShmWorker, WedgedComputeDetectedByProgress) {
  auto o = opts("wedged", {"--progress", "--stall-after", "0"});
  ASSERT_EQ(o.progress_timeout, 2500ms);  // the default this test measures
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  Result1 r;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE((*w)->trySubmit(batch({{5}}), r.done()).isOk());
  ASSERT_EQ(r.f.wait_for(60s), std::future_status::ready);
  const auto took = std::chrono::steady_clock::now() - t0;
  auto [st, rows] = r.f.get();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("no step progress for 2500 ms"), std::string::npos) << st.message();
  EXPECT_LT(took, 10s);
  RecordProperty("detection_ms",
                 static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  std::printf("wedged compute detected after %lld ms\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));  // restarted
}

// rose SIGSTOPped in the middle of a live step (its counter had been moving): caught by the
// progress counter going still, before the heartbeat (10 s here) would notice.
TEST(ShmWorker, WorkerStoppedMidStepDetectedByProgress) {
  auto o = opts("stopmid", {"--progress", "--delay-ms", "60000"});
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  auto ch = shm::Channel::attach(o.shm_name);  // to watch the counter as tulip does
  ASSERT_TRUE(ch.isOk()) << ch.status().toString();
  Result1 r;
  ASSERT_TRUE((*w)->trySubmit(batch({{5}}), r.done()).isOk());
  const uint64_t before = ch->progress();
  ASSERT_TRUE(waitFor([&] { return ch->progress() > before + 3; }));  // mid-step, progressing
  const pid_t pid = (*w)->workerPid();
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(r.f.wait_for(60s), std::future_status::ready);
  const auto took = std::chrono::steady_clock::now() - t0;
  auto [st, rows] = r.f.get();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("no step progress"), std::string::npos) << st.message();
  EXPECT_LT(took, 10s);
  std::printf("stopped worker detected after %lld ms\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  EXPECT_TRUE(waitFor([&] { return kill(pid, 0) != 0; }));  // the stopped process was killed
  ASSERT_TRUE(waitFor([&] { return (*w)->ready() && (*w)->workerPid() != pid; }));
}

// A worker that does not report progress keeps a per-step limit, scaled to the work: after a
// 10-token batch measured ~2 ms per token, a 150-token batch (~300 ms) outlives the 200 ms floor
// and still completes (its limit is >= 8 x 150 x 2 ms = 2.4 s).
TEST(ShmWorker, StepLimitScalesWithTheTokensInFlight) {
  auto o = opts("scaled", {"--step-us-per-token", "2000"});
  o.step_timeout = 200ms;
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  Result1 small;
  ASSERT_TRUE((*w)->trySubmit(batch({std::vector<int32_t>(10, 1)}), small.done()).isOk());
  ASSERT_EQ(small.f.wait_for(60s), std::future_status::ready);
  ASSERT_TRUE(small.f.get().first.isOk());
  Result1 big;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE((*w)->trySubmit(batch({std::vector<int32_t>(150, 1)}), big.done()).isOk());
  ASSERT_EQ(big.f.wait_for(60s), std::future_status::ready);
  const auto took = std::chrono::steady_clock::now() - t0;
  auto [st, rows] = big.f.get();
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(rows[1], 150.0f);
  EXPECT_GE(took, 300ms);  // longer than the floor, so only the scaling let it finish
  EXPECT_EQ((*w)->restarts(), 0u);
}

TEST(ShmWorker, StoppedWorkerDetectedAndReplaced) {
  auto o = opts("sigstop");
  o.heartbeat_timeout = 400ms;
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  pid_t first = (*w)->workerPid();
  kill(first, SIGSTOP);
  ASSERT_TRUE(waitFor([&] { return !(*w)->ready(); }));
  ASSERT_TRUE(waitFor([&] { return (*w)->ready() && (*w)->workerPid() != first; }));
  EXPECT_NE((*w)->lastFailure().find("no heartbeat"), std::string::npos);
}

TEST(ShmWorker, FailedStartIsRetriedWithBackoff) {
  auto w = ShmWorker::start(opts("failstart", {"--fail-start"}));
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->restarts() >= 2; }));
  EXPECT_FALSE((*w)->ready());
  EXPECT_NE((*w)->lastFailure().find("failed to start"), std::string::npos)
      << (*w)->lastFailure();
  Result1 r;
  EXPECT_EQ((*w)->trySubmit(batch({{1}}), r.done()).code(), StatusCode::kUnavailable);
}

// Regression for the self-deadlock fixed in 392dd01: trySubmit checks readiness without the lock,
// then again with mu_ held; its locked not-ready answer called lastFailure(), which takes mu_
// again, so a worker going down between the two checks hung the submitting thread (and with it
// the scheduler) for good. The test hook runs in exactly that window: it kills the worker and
// waits until the supervisor has marked it down, so the locked check must answer. The call runs
// on its own thread with a bounded wait: on the old code the wait times out and the test fails
// (the stuck thread and worker are leaked rather than joined, so the suite still ends).
// The compile-time side: tests/thread_safety (clang rejects lastFailure() under mu_).
TEST(ShmWorker, WorkerDownBetweenTheReadinessChecksIsAnsweredNotDeadlocked) {
  auto o = opts("window");
  // Stays down once killed (no restart during the test; stop() interrupts the backoff).
  o.backoff_min = o.backoff_max = 600000ms;
  std::atomic<bool> armed{false}, in_window{false}, went_down{false};
  ShmWorker* self = nullptr;
  o.test_before_submit_lock = [&] {
    if (!armed.exchange(false)) return;
    in_window = true;
    kill(self->workerPid(), SIGKILL);
    went_down = waitFor([&] { return !self->ready() && !self->lastFailure().empty(); });
  };
  auto started = ShmWorker::start(o);
  ASSERT_TRUE(started.isOk());
  std::unique_ptr<ShmWorker> w = std::move(started).value();
  self = w.get();
  ASSERT_TRUE(waitFor([&] { return w->ready(); }));

  armed = true;
  auto answered = std::make_shared<std::promise<Status>>();
  auto answer = answered->get_future();
  auto callbacks = std::make_shared<std::atomic<int>>(0);
  std::thread submitter([&w, answered, callbacks] {
    answered->set_value(
        w->trySubmit(batch({{1, 2}}), [callbacks](const WorkResult&) { ++*callbacks; }));
  });
  if (answer.wait_for(30s) != std::future_status::ready) {
    // Deadlocked: leave the stuck thread and the worker it holds locked behind.
    submitter.detach();
    (void)w.release();
    FAIL() << "trySubmit did not return within 30 s after the worker went down between its "
              "readiness checks (self-deadlock on mu_)";
  }
  submitter.join();
  ASSERT_TRUE(in_window.load()) << "the test hook never ran";
  ASSERT_TRUE(went_down.load()) << "the worker was not marked down within the hook's wait";
  const Status st = answer.get();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.toString();
  // The answer names what took the worker down.
  EXPECT_NE(st.message().find("signal 9"), std::string::npos) << st.message();
  w->stop();
  EXPECT_EQ(callbacks->load(), 0);  // refused, so `done` is never called
}

// The same window reached without a hook, as production reaches it: several threads keep
// submitting (back to back, no yield: the window between the checks is a few instructions wide)
// while the worker crashes at every batch it is given and is restarted, over and over. Every call
// returns (bounded waits; a deadlock fails the test), each refusal is UNAVAILABLE (down) or
// FAILED_PRECONDITION (no free slot), and every accepted batch is answered exactly once. With the
// self-deadlock of 392dd01 put back this failed 5 runs in 5 on a loaded 2-core machine.
TEST(ShmWorker, SubmittersRacingRepeatedCrashesAllGetAnAnswer) {
  auto o = opts("crashloop", {"--crash-after", "0"});  // exits when its first batch arrives
  o.backoff_min = 5ms;
  o.backoff_max = 20ms;
  auto started = ShmWorker::start(o);
  ASSERT_TRUE(started.isOk());
  std::unique_ptr<ShmWorker> w = std::move(started).value();

  struct Tally {
    std::atomic<int> accepted{0}, answered{0}, twice{0}, bad_answer{0};
    std::atomic<int> refused_down{0}, refused_busy{0}, refused_other{0};
  };
  auto tally = std::make_shared<Tally>();
  std::atomic<bool> stop{false};
  constexpr int kThreads = 4;
  constexpr uint64_t kRestarts = 20;
  std::vector<std::thread> threads;
  std::vector<std::future<void>> finished;
  for (int t = 0; t < kThreads; ++t) {
    auto done = std::make_shared<std::promise<void>>();
    finished.push_back(done->get_future());
    threads.emplace_back([&w, &stop, tally, done, t] {
      for (int i = 0; !stop.load(); ++i) {
        auto once = std::make_shared<std::atomic<bool>>(false);
        Status st = w->trySubmit(batch({{t, i}}), [tally, once](const WorkResult& r) {
          if (once->exchange(true)) ++tally->twice;
          if (r.status.code() != StatusCode::kUnavailable &&
              r.status.code() != StatusCode::kCancelled)
            ++tally->bad_answer;
          ++tally->answered;
        });
        if (st.isOk()) {
          ++tally->accepted;
        } else if (st.code() == StatusCode::kUnavailable) {
          ++tally->refused_down;
        } else if (st.code() == StatusCode::kFailedPrecondition) {
          ++tally->refused_busy;
        } else {
          ++tally->refused_other;
        }
      }
      done->set_value();
    });
  }
  const bool restarted = waitFor([&] { return w->restarts() >= kRestarts; }, 60000ms);
  stop = true;
  bool all_returned = true;
  for (auto& f : finished)
    all_returned = all_returned && f.wait_for(30s) == std::future_status::ready;
  if (!all_returned) {
    for (auto& t : threads) t.detach();
    (void)w.release();
    FAIL() << "a submitting thread did not return within 30 s (deadlock in trySubmit)";
  }
  for (auto& t : threads) t.join();
  w->stop();  // answers what is still in flight (CANCELLED)
  EXPECT_TRUE(restarted) << "only " << w->restarts() << " restarts";
  EXPECT_GT(tally->accepted.load(), 0);
  EXPECT_GT(tally->refused_down.load(), 0);
  EXPECT_EQ(tally->refused_other.load(), 0);
  EXPECT_EQ(tally->answered.load(), tally->accepted.load());
  EXPECT_EQ(tally->twice.load(), 0);
  EXPECT_EQ(tally->bad_answer.load(), 0);
}

TEST(ShmWorker, MissingBinaryIsAnError) {
  auto o = opts("nobin");
  o.rose_bin = "/nonexistent/rose";
  auto w = ShmWorker::start(o);
  EXPECT_FALSE(w.isOk());
  EXPECT_NE(w.status().message().find("/nonexistent/rose"), std::string::npos);
}

pid_t spawnSidecar(const std::string& name) {
  pid_t pid = fork();
  if (pid == 0) {
    std::string bin = fakeRose();
    execl(bin.c_str(), bin.c_str(), "--shm-name", name.c_str(), "--create-shm", nullptr);
    _exit(127);
  }
  return pid;
}

TEST(ShmWorker, AttachModeFollowsASidecarAcrossRestarts) {
  auto o = opts("attach");
  o.attach = true;
  pid_t side = spawnSidecar(o.shm_name);
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  EXPECT_EQ((*w)->workerPid(), side);
  Result1 r;
  ASSERT_TRUE((*w)->trySubmit(batch({{4, 4}}), r.done()).isOk());
  ASSERT_EQ(r.f.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(r.f.get().second[0], 8.0f);
  kill(side, SIGKILL);
  waitpid(side, nullptr, 0);
  ASSERT_TRUE(waitFor([&] { return !(*w)->ready(); }));
  pid_t side2 = spawnSidecar(o.shm_name);  // the container restarts
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  EXPECT_EQ((*w)->workerPid(), side2);
  Result1 r2;
  ASSERT_TRUE((*w)->trySubmit(batch({{1, 1}}), r2.done()).isOk());
  ASSERT_EQ(r2.f.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(r2.f.get().second[0], 2.0f);
  (*w)->stop();
  kill(side2, SIGTERM);
  waitpid(side2, nullptr, 0);
}

// A rose that completes a batch it never took from the submission ring (a peer breaking the
// protocol) leaves the ring full while a slot is free. The next submission is refused
// UNAVAILABLE; it used to abort tulip on a CHECK. The test process is that rose (attach mode).
TEST(ShmWorker, RingFullWithAFreeSlotIsRefusedNotAnAbort) {
  auto o = opts("ringfull");
  o.attach = true;
  auto ch = shm::Channel::create(o.shm_name, shm::Layout{2, 1 << 16, 1 << 16});
  ASSERT_TRUE(ch.isOk()) << ch.status().toString();
  ch->setWorkerPid(getpid());
  shm::ModelFacts f;
  f.hidden_size = 4;
  f.max_seq_len = 64;
  f.vocab_size = 1000;
  std::strcpy(f.name, "fake");
  std::strcpy(f.kind, "embedding");
  ch->setModelFacts(f);
  ch->beat();
  ch->setState(shm::WorkerState::kReady);
  std::atomic<bool> done{false};
  std::thread beater([&] {  // alive, however slow the machine is
    while (!done.load()) {
      ch->beat();
      std::this_thread::sleep_for(20ms);
    }
  });
  struct Join {
    std::atomic<bool>& done;
    std::thread& t;
    ~Join() {
      done = true;
      t.join();
    }
  } join{done, beater};
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk()) << w.status().toString();
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  auto complete = [&](uint64_t batch_id, uint32_t slot) {
    shm::Completion c;
    c.batch_id = batch_id;
    c.slot = slot;
    c.rows = 1;
    c.cols = 4;
    c.output_bytes = 4 * sizeof(float);
    ASSERT_TRUE(ch->tryComplete(c));
  };
  Result1 a, b, c;
  ASSERT_TRUE((*w)->trySubmit(batch({{1}}), a.done()).isOk());
  auto da = ch->waitSubmission(std::chrono::seconds(30));  // taken, as a rose does
  ASSERT_TRUE(da.has_value());
  ASSERT_TRUE((*w)->trySubmit(batch({{2}}), b.done()).isOk());  // stays in the ring
  complete(da->batch_id, da->slot);
  ASSERT_EQ(a.f.wait_for(30s), std::future_status::ready);
  ASSERT_TRUE(waitFor([&] { return (*w)->inflight() == 1; }));
  ASSERT_TRUE((*w)->trySubmit(batch({{3}}), c.done()).isOk());  // the ring now holds b and c
  // The misbehaving peer: c is answered without being taken from the ring.
  complete(da->batch_id + 2, da->slot);
  ASSERT_EQ(c.f.wait_for(30s), std::future_status::ready);
  ASSERT_TRUE(waitFor([&] { return (*w)->inflight() == 1; }));
  Result1 d;
  Status st = (*w)->trySubmit(batch({{4}}), d.done());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.toString();
  EXPECT_NE(st.message().find("submission ring is full"), std::string::npos) << st.message();
  EXPECT_EQ((*w)->inflight(), 1u);  // the refused batch took no slot
  (*w)->stop();
}

// [TAG_LATE_MASKS] A kGenerate step with late masks: the worker reserves the region (ready word
// pending) and flags the step; deliver() writes the masks into that step's slot and publishes
// them. It fails when rose has abandoned them, and once the step has completed (its slot is no
// longer the step's).
TEST(ShmWorker, LateMasksGoIntoTheStepsSlotAndArePublished) {
  auto o = opts("latemask");
  o.attach = true;
  auto ch = shm::Channel::create(o.shm_name, shm::Layout{2, 1 << 16, 1 << 16});
  ASSERT_TRUE(ch.isOk()) << ch.status().toString();
  ch->setWorkerPid(getpid());
  shm::ModelFacts f;
  f.hidden_size = 4;
  f.max_seq_len = 64;
  f.vocab_size = 100;
  std::strcpy(f.name, "fake");
  std::strcpy(f.kind, "llm");
  f.llm_caps = shm::kLlmCapTokenMask | shm::kLlmCapLateMask;
  ch->setModelFacts(f);
  ch->beat();
  ch->setState(shm::WorkerState::kReady);
  std::atomic<bool> done{false};
  std::thread beater([&] {
    while (!done.load()) {
      ch->beat();
      std::this_thread::sleep_for(20ms);
    }
  });
  struct Join {
    std::atomic<bool>& done;
    std::thread& t;
    ~Join() {
      done = true;
      t.join();
    }
  } join{done, beater};
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk()) << w.status().toString();
  ASSERT_TRUE(waitFor([&] { return (*w)->ready(); }));
  auto step = [] {
    WorkBatch b;
    b.kind = shm::BatchKind::kGenerate;
    llm::LlmStepSeq d;
    d.num_tokens = 1;
    d.num_blocks = 1;
    d.sample = 1;
    d.mask_index = 1;
    b.llm_seqs = {d};
    b.tokens = {5};
    b.block_ids = {0};
    b.late_mask_words = 4;  // ceil(100 / 32)
    b.late_masks = std::make_shared<LateMasks>();
    return b;
  };
  std::promise<Status> first_done;
  WorkBatch a = step();
  std::shared_ptr<LateMasks> la = a.late_masks;
  ASSERT_TRUE((*w)->trySubmit(std::move(a), [&](const WorkResult& r) {
                    first_done.set_value(r.status);
                  }).isOk());
  ASSERT_TRUE(la->deliver);
  auto da = ch->waitSubmission(std::chrono::seconds(30));
  ASSERT_TRUE(da.has_value());
  EXPECT_EQ(da->flags, shm::kBatchLateMasks);
  std::byte* ra = ch->inputArena(da->slot).data() + da->seqlens_offset;
  EXPECT_EQ(shm::lateMaskState(ra), shm::kLateMasksPending);
  const std::vector<uint32_t> masks = {1, 2, 3, 0xFFFFFFFFu};
  EXPECT_TRUE(la->deliver(masks));
  EXPECT_EQ(shm::lateMaskState(ra), shm::kLateMasksReady);
  std::vector<uint32_t> got(4);
  std::memcpy(got.data(), ra + shm::kLateMaskHeaderBytes, 16);
  EXPECT_EQ(got, masks);

  // A second step whose masks rose gave up on: deliver() reports it.
  WorkBatch b = step();
  std::shared_ptr<LateMasks> lb = b.late_masks;
  std::promise<Status> second_done;
  ASSERT_TRUE((*w)->trySubmit(std::move(b), [&](const WorkResult& r) {
                    second_done.set_value(r.status);
                  }).isOk());
  auto db = ch->waitSubmission(std::chrono::seconds(30));
  ASSERT_TRUE(db.has_value());
  EXPECT_NE(db->slot, da->slot);
  std::byte* rb = ch->inputArena(db->slot).data() + db->seqlens_offset;
  EXPECT_FALSE(shm::awaitLateMasks(rb, std::chrono::milliseconds(0)));
  EXPECT_FALSE(lb->deliver(masks));

  // After its completion the first step's slot is not its own: deliver() refuses.
  for (const auto& d : {*da, *db}) {
    shm::Completion c;
    c.batch_id = d.batch_id;
    c.slot = d.slot;
    c.rows = 1;
    c.cols = 1;
    c.output_bytes = 4;
    ASSERT_TRUE(ch->tryComplete(c));
  }
  auto fa = first_done.get_future();
  auto fb = second_done.get_future();
  ASSERT_EQ(fa.wait_for(30s), std::future_status::ready);
  ASSERT_EQ(fb.wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(fa.get().isOk());
  EXPECT_FALSE(la->deliver(masks));

  // A late step must not also carry early masks.
  WorkBatch bad = step();
  bad.masks = {1, 2, 3, 4};
  EXPECT_EQ((*w)->trySubmit(std::move(bad), [](const WorkResult&) {}).code(),
            StatusCode::kInvalidArgument);
  (*w)->stop();
}

// If tulip dies, its rose must not linger holding the GPU and the segment.
TEST(ShmWorker, WorkerDiesWithItsOwner) {
  auto o = opts("orphan");
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t owner = fork();
  if (owner == 0) {
    close(pipefd[0]);
    auto w = ShmWorker::start(o);
    if (!w.isOk()) _exit(1);
    while (!(*w)->ready()) usleep(1000);
    pid_t child = (*w)->workerPid();
    (void)!write(pipefd[1], &child, sizeof(child));
    pause();
    _exit(0);
  }
  close(pipefd[1]);
  pid_t rose = 0;
  ASSERT_EQ(read(pipefd[0], &rose, sizeof(rose)), static_cast<ssize_t>(sizeof(rose)));
  ASSERT_GT(rose, 0);
  EXPECT_EQ(kill(rose, 0), 0);
  kill(owner, SIGKILL);
  waitpid(owner, nullptr, 0);
  EXPECT_TRUE(waitFor([&] { return kill(rose, 0) != 0; })) << "rose outlived its tulip";
  shm_unlink(o.shm_name.c_str());
}

}  // namespace
}  // namespace garden::tulip
