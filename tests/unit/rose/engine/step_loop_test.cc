// The step loop on a real shm Channel with the CPU backend and a FakeRunner
// (tests/fakes/rose/fake_runner.h): what the loop itself owns, apart from any model — facts and
// state, slots, deadlines, refusals, launch failures, accounting — and the loop running on its own
// thread against a producer that keeps every slot busy, as tulip does, while a third thread reads
// the counters.

#include "services/rose/engine/step_loop.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/shm/channel.h"
#include "services/rose/ops/backend.h"
#include "tests/fakes/rose/fake_runner.h"

namespace garden::rose {
namespace {

using namespace std::chrono_literals;
using testing::FakeRunner;

constexpr uint32_t kSlots = 4;

class StepLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const std::string name =
        "/rose-step-loop-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    auto ch = shm::Channel::create(name, shm::Layout{kSlots, 4096, 4096});
    ASSERT_TRUE(ch.isOk()) << ch.status().toString();
    channel_.emplace(std::move(ch).value());
    BackendOptions bo;
    bo.threads = 1;
    backend_ = std::move(makeBackend("cpu", bo)).value();
    runner_ = std::make_unique<FakeRunner>(*backend_);
    StepLoopOptions lo;
    lo.model_name = "fake-model";
    lo.poll = 5ms;
    auto l = StepLoop::create(*channel_, *backend_, *runner_, lo);
    ASSERT_TRUE(l.isOk()) << l.status().toString();
    loop_ = std::move(l).value();
    loop_->announceReady();
  }

  void TearDown() override {
    loop_.reset();
    runner_.reset();
  }

  // Writes `values` into `slot`'s input arena and returns a descriptor for them.
  shm::BatchDesc put(uint32_t slot, const std::vector<int32_t>& values) {
    std::memcpy(channel_->inputArena(slot).data(), values.data(), values.size() * 4);
    shm::BatchDesc d;
    d.batch_id = ++next_id_;
    d.slot = slot;
    d.kind = shm::BatchKind::kEmbed;
    d.num_seqs = 1;
    d.num_tokens = static_cast<uint32_t>(values.size());
    return d;
  }

  std::vector<int32_t> outputOf(uint32_t slot, size_t n) {
    std::vector<int32_t> v(n);
    std::memcpy(v.data(), channel_->outputArena(slot).data(), n * 4);
    return v;
  }

  shm::Completion submitAndWait(const shm::BatchDesc& d) {
    EXPECT_TRUE(channel_->trySubmit(d));
    EXPECT_TRUE(loop_->step(1s));
    auto c = channel_->waitCompletion(10s);
    EXPECT_TRUE(c.has_value());
    return c.value_or(shm::Completion{});
  }

  std::optional<shm::Channel> channel_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<FakeRunner> runner_;
  std::unique_ptr<StepLoop> loop_;
  uint64_t next_id_ = 0;
};

TEST_F(StepLoopTest, AnnouncesTheRunnersFactsUnderItsKind) {
  EXPECT_EQ(runner_->boundSlots(), kSlots);
  EXPECT_EQ(channel_->state(), shm::WorkerState::kReady);
  EXPECT_EQ(channel_->workerPid(), getpid());
  const shm::ModelFacts f = channel_->modelFacts();
  EXPECT_STREQ(f.kind, "fake");
  EXPECT_STREQ(f.name, "fake-model");
  EXPECT_EQ(f.hidden_size, 7u);
  EXPECT_EQ(f.vocab_size, 11u);
}

TEST_F(StepLoopTest, RunsRefusesAndFailsBatchesWithTheirOwnAnswers) {
  shm::Completion c = submitAndWait(put(0, {1, 2, 3}));
  ASSERT_EQ(c.status_code, 0) << c.message;
  EXPECT_EQ(c.rows, 3u);
  EXPECT_EQ(c.cols, 1u);
  EXPECT_EQ(c.output_bytes, 12u);
  EXPECT_GT(c.taken_ns, 0);
  EXPECT_GE(c.launched_ns, c.taken_ns);
  EXPECT_GE(c.published_ns, c.launched_ns);
  EXPECT_EQ(outputOf(0, 3), (std::vector<int32_t>{3, 5, 7}));

  // The runner refuses: its message, nothing launched.
  c = submitAndWait(put(1, {4, -3}));
  EXPECT_EQ(c.status_code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_EQ(c.rows, 0u);
  EXPECT_NE(std::string(c.message).find("value -3 at 1 is negative"), std::string::npos)
      << c.message;

  // The loop refuses before the runner sees it: slot out of range, expired deadline.
  const uint64_t admitted = runner_->admitted();
  shm::BatchDesc d = put(0, {1});
  d.slot = kSlots;
  c = submitAndWait(d);
  EXPECT_EQ(c.status_code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(c.message).find("out of range"), std::string::npos) << c.message;
  d = put(0, {1});
  d.deadline_ns = shm::monotonicNowNs() - 1;
  c = submitAndWait(d);
  EXPECT_EQ(c.status_code, static_cast<int32_t>(StatusCode::kDeadlineExceeded));
  EXPECT_STREQ(c.message, "deadline passed before the batch ran");
  EXPECT_EQ(runner_->admitted(), admitted);

  // A launch that fails is answered with its error, no rows, and frees its slot.
  const uint64_t launched = runner_->launched();
  c = submitAndWait(put(2, {5, FakeRunner::kFailLaunch}));
  EXPECT_EQ(c.status_code, static_cast<int32_t>(StatusCode::kInternal));
  EXPECT_EQ(c.rows, 0u);
  EXPECT_EQ(c.output_bytes, 0u);
  EXPECT_EQ(runner_->launched(), launched + 1);
  c = submitAndWait(put(2, {10}));
  ASSERT_EQ(c.status_code, 0) << c.message;
  EXPECT_EQ(outputOf(2, 1), (std::vector<int32_t>{21}));

  // The queue publishes an answer before it counts it: wait for the counting, then read.
  ASSERT_TRUE(loop_->waitIdle(10s));
  const StepLoopStats st = loop_->stats();
  EXPECT_EQ(st.batches_run, 3u);       // two ran, one failed at launch
  EXPECT_EQ(st.batches_rejected, 3u);  // runner, slot, deadline
  EXPECT_EQ(st.completions, 6u);
  EXPECT_EQ(loop_->inFlight(), 0u);
}

TEST_F(StepLoopTest, ABusySlotIsRefusedWithoutDisturbingItsRunningBatch) {
  // Hold the backend's queue so slot 0's batch cannot finish until released.
  std::atomic<bool> release{false};
  backend_->launch([&] {
    while (!release.load()) std::this_thread::sleep_for(1ms);
  });
  const shm::BatchDesc a = put(0, {1, 2});
  ASSERT_TRUE(channel_->trySubmit(a));
  ASSERT_TRUE(loop_->step(1s));
  // tulip breaks the protocol: a second batch for the slot still running. Its values must not
  // reach the slot's staging (the running batch reads it).
  const shm::BatchDesc b = put(0, {40, 50});
  ASSERT_TRUE(channel_->trySubmit(b));
  ASSERT_TRUE(loop_->step(1s));
  EXPECT_EQ(loop_->inFlight(), 2u);
  release = true;
  // Answers come in the order the batches were taken.
  auto ca = channel_->waitCompletion(10s);
  auto cb = channel_->waitCompletion(10s);
  ASSERT_TRUE(ca.has_value() && cb.has_value());
  EXPECT_EQ(ca->batch_id, a.batch_id);
  ASSERT_EQ(ca->status_code, 0) << ca->message;
  EXPECT_EQ(outputOf(0, 2), (std::vector<int32_t>{3, 5}));
  EXPECT_EQ(cb->batch_id, b.batch_id);
  EXPECT_EQ(cb->status_code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(cb->message).find("slot 0 is still in use"), std::string::npos)
      << cb->message;
}

// The loop on its own thread (run()), a producer that keeps every slot busy and reads each answer
// before reusing the slot, and a reader of the counters, all at once. Every batch is answered
// once, in submission order, with its own result or its own error.
TEST_F(StepLoopTest, ConcurrentProducerGetsEveryAnswerInOrder) {
  constexpr int kBatches = 3000;
  // Hundreds of refusals and failures follow, each logged: keep the test output readable.
  const log::Level level = log::level();
  log::setLevel(log::Level::kOff);
  struct RestoreLevel {
    log::Level level;
    ~RestoreLevel() { log::setLevel(level); }
  } restore{level};
  std::atomic<bool> stop{false}, reading{true};
  uint64_t last_seen = 0;
  bool counters_monotonic = true;
  std::thread runner([&] { loop_->run([&] { return stop.load(); }); });
  std::thread reader([&] {
    while (reading.load()) {
      const StepLoopStats st = loop_->stats();
      if (st.completions < last_seen) counters_monotonic = false;
      last_seen = st.completions;
      (void)loop_->inFlight();
      std::this_thread::sleep_for(100us);
    }
  });
  // Stops and joins both threads on every way out (a failed ASSERT returns early).
  struct Join {
    std::atomic<bool>& stop;
    std::atomic<bool>& reading;
    std::thread& runner;
    std::thread& reader;
    ~Join() {
      stop = true;
      reading = false;
      if (runner.joinable()) runner.join();
      if (reader.joinable()) reader.join();
    }
  } join{stop, reading, runner, reader};

  enum class Want { kOk, kRefused, kFailed, kExpired };
  struct Sent {
    uint64_t id;
    uint32_t slot;
    Want want;
    std::vector<int32_t> values;
  };
  std::deque<Sent> sent;
  std::deque<uint32_t> free_slots;
  for (uint32_t s = 0; s < kSlots; ++s) free_slots.push_back(s);
  int submitted = 0, answered = 0, ok = 0, refused = 0, failed = 0, expired = 0, wrong = 0;
  while (answered < kBatches) {
    if (submitted < kBatches && !free_slots.empty()) {
      const uint32_t slot = free_slots.front();
      free_slots.pop_front();
      const int i = submitted++;
      std::vector<int32_t> values(1 + i % 5);
      for (size_t k = 0; k < values.size(); ++k) values[k] = i * 7 + static_cast<int32_t>(k);
      Want want = Want::kOk;
      if (i % 11 == 3) {
        values.back() = -1;
        want = Want::kRefused;
      } else if (i % 13 == 5) {
        values.back() = FakeRunner::kFailLaunch;
        want = Want::kFailed;
      }
      shm::BatchDesc d = put(slot, values);
      if (i % 17 == 7) {
        d.deadline_ns = 1;  // long past
        want = Want::kExpired;
      }
      ASSERT_TRUE(channel_->trySubmit(d));
      sent.push_back({d.batch_id, slot, want, values});
      continue;
    }
    auto c = channel_->waitCompletion(30s);
    ASSERT_TRUE(c.has_value()) << "no answer after " << answered << " of " << kBatches;
    ASSERT_FALSE(sent.empty());
    const Sent s = sent.front();
    sent.pop_front();
    ++answered;
    EXPECT_EQ(c->batch_id, s.id);
    EXPECT_EQ(c->slot, s.slot);
    switch (s.want) {
      case Want::kOk: {
        ++ok;
        std::vector<int32_t> want_out;
        for (int32_t v : s.values) want_out.push_back(2 * v + 1);
        if (c->status_code != 0 || c->rows != s.values.size() ||
            outputOf(s.slot, s.values.size()) != want_out) {
          ++wrong;
        }
        break;
      }
      case Want::kRefused:
        ++refused;
        if (c->status_code != static_cast<int32_t>(StatusCode::kInvalidArgument)) ++wrong;
        break;
      case Want::kFailed:
        ++failed;
        if (c->status_code != static_cast<int32_t>(StatusCode::kInternal) || c->rows != 0) ++wrong;
        break;
      case Want::kExpired:
        ++expired;
        if (c->status_code != static_cast<int32_t>(StatusCode::kDeadlineExceeded)) ++wrong;
        break;
    }
    free_slots.push_back(s.slot);
  }
  stop = true;
  runner.join();
  reading = false;
  reader.join();

  EXPECT_EQ(wrong, 0);
  EXPECT_GT(ok, 2000);
  EXPECT_GT(refused, 0);
  EXPECT_GT(failed, 0);
  EXPECT_GT(expired, 0);
  EXPECT_FALSE(channel_->waitCompletion(1ms).has_value()) << "an extra answer";
  const StepLoopStats st = loop_->stats();
  EXPECT_EQ(st.completions, static_cast<uint64_t>(kBatches));
  EXPECT_EQ(st.batches_run, static_cast<uint64_t>(ok + failed));
  EXPECT_EQ(st.batches_rejected, static_cast<uint64_t>(refused + expired));
  EXPECT_TRUE(counters_monotonic);
  EXPECT_EQ(channel_->state(), shm::WorkerState::kStopping);
}

}  // namespace
}  // namespace garden::rose
