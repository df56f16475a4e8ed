// The step loop running the EmbeddingRunner in-process on a real shm Channel, with the CPU
// backend and the tiny Qwen3 checkpoint from tests/conformance/qwen3/fixtures: results equal a
// direct forward pass of an independent model instance; step() returns before the result exists
// (LazyTensor); bad descriptors and expired deadlines are answered without running and without
// disturbing later batches.

#include "services/rose/engine/embedding_runner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "common/shm/channel.h"
#include "services/rose/engine/step_loop.h"
#include "services/rose/model/qwen3.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {
namespace {

using namespace std::chrono_literals;

std::string fixtureDir() {
  const char* src = std::getenv("GARDEN_SOURCE_DIR");
  return std::string(src ? src : ".") + "/tests/conformance/qwen3/fixtures";
}

constexpr int64_t kMaxTokens = 160;  // > the fixture's max_position_embeddings (128)
constexpr int32_t kYes = 17, kNo = 42;

class EmbeddingRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    name_ = "/rose-engine-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    auto ch = shm::Channel::create(name_, shm::Layout{3, 8192, 64 * 64 * 4});
    ASSERT_TRUE(ch.isOk()) << ch.status().toString();
    channel_.emplace(std::move(ch).value());
    BackendOptions bo;
    bo.threads = 2;
    bo.max_batch_tokens = kMaxTokens;
    backend_ = std::move(makeBackend("cpu", bo)).value();
    ref_backend_ = std::move(makeBackend("cpu", bo)).value();
    Qwen3Options mo;
    mo.max_batch_tokens = kMaxTokens;
    auto m = Qwen3Model::load(fixtureDir(), *backend_, mo);
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    model_ = std::move(m).value();
    ref_model_ = std::move(Qwen3Model::load(fixtureDir(), *ref_backend_, mo)).value();
    EmbeddingRunnerOptions ro;
    ro.default_pooling = PoolMode::kMean;
    auto r = EmbeddingRunner::create(*backend_, *model_, ro);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    runner_ = std::move(r).value();
    StepLoopOptions lo;
    lo.model_name = "tiny";
    auto e = StepLoop::create(*channel_, *backend_, *runner_, lo);
    ASSERT_TRUE(e.isOk()) << e.status().toString();
    loop_ = std::move(e).value();
    loop_->announceReady();
  }

  void TearDown() override {
    loop_.reset();
    runner_.reset();
    model_.reset();
    backend_.reset();
  }

  // Writes tokens + seqlens into `slot`'s input arena and returns a descriptor for them.
  shm::BatchDesc put(uint32_t slot, const std::vector<int32_t>& tokens,
                     const std::vector<int32_t>& lens,
                     shm::BatchKind kind = shm::BatchKind::kEmbed) {
    auto in = channel_->inputArena(slot);
    std::memcpy(in.data(), tokens.data(), tokens.size() * 4);
    const uint64_t lens_off = (tokens.size() * 4 + 63) / 64 * 64;
    std::memcpy(in.data() + lens_off, lens.data(), lens.size() * 4);
    shm::BatchDesc d;
    d.batch_id = ++next_id_;
    d.slot = slot;
    d.kind = kind;
    d.num_seqs = static_cast<uint32_t>(lens.size());
    d.num_tokens = static_cast<uint32_t>(tokens.size());
    d.tokens_offset = 0;
    d.seqlens_offset = lens_off;
    std::strcpy(d.request_id, "req-test");
    return d;
  }

  shm::Completion submitAndWait(const shm::BatchDesc& d) {
    EXPECT_TRUE(channel_->trySubmit(d));
    EXPECT_TRUE(loop_->step(1s));
    auto c = channel_->waitCompletion(10s);
    EXPECT_TRUE(c.has_value());
    return c.value_or(shm::Completion{});
  }

  std::vector<float> directEmbed(const std::vector<int32_t>& tokens,
                                 const std::vector<int32_t>& lens, PoolMode mode, bool normalize) {
    std::vector<float> out(lens.size() * 64);
    ref_model_->enqueueEmbed({tokens, lens}, mode, normalize, out.data());
    EXPECT_TRUE(ref_backend_->synchronize().isOk());
    return out;
  }

  std::vector<float> outputRows(uint32_t slot, size_t n) {
    std::vector<float> v(n);
    std::memcpy(v.data(), channel_->outputArena(slot).data(), n * 4);
    return v;
  }

  std::string name_;
  std::optional<shm::Channel> channel_;
  std::unique_ptr<Backend> backend_, ref_backend_;
  std::unique_ptr<Qwen3Model> model_, ref_model_;
  std::unique_ptr<EmbeddingRunner> runner_;
  std::unique_ptr<StepLoop> loop_;
  uint64_t next_id_ = 100;
};

TEST_F(EmbeddingRunnerTest, AnnouncesModelFactsAndReady) {
  EXPECT_EQ(channel_->state(), shm::WorkerState::kReady);
  EXPECT_EQ(channel_->workerPid(), getpid());
  shm::ModelFacts f = channel_->modelFacts();
  EXPECT_EQ(f.hidden_size, 64u);
  EXPECT_EQ(f.vocab_size, 256u);
  EXPECT_EQ(f.max_seq_len, 128u);
  EXPECT_EQ(f.max_batch_tokens, static_cast<uint32_t>(kMaxTokens));
  EXPECT_EQ(f.pooling, static_cast<uint32_t>(PoolMode::kMean));
  EXPECT_EQ(f.has_score_head, 0u);
  EXPECT_STREQ(f.name, "tiny");
  EXPECT_STREQ(f.kind, "embedding");
}

// [TAG_STEP_PROGRESS] The step loop connects the cpu backend to the channel's progress counter:
// the header says the worker reports progress, and a batch moves the counter (at least once per
// layer; the fixture has two).
TEST_F(EmbeddingRunnerTest, BatchesAdvanceTheChannelsProgressCounter) {
  EXPECT_TRUE(channel_->progressReported());
  const uint64_t before = channel_->progress();
  shm::Completion c = submitAndWait(put(0, {1, 2, 3}, {3}));
  ASSERT_EQ(c.status_code, 0) << c.message;
  EXPECT_GE(channel_->progress(), before + 2);
}

TEST_F(EmbeddingRunnerTest, EmbedAndScoreBatchesEqualDirectForward) {
  const std::vector<int32_t> tokens = {5, 9, 100, 3, 255, 0, 7, 7, 7, 1, 2};
  const std::vector<int32_t> lens = {3, 1, 7};
  // Default pooling (the runner's: mean), normalized.
  shm::BatchDesc d = put(0, tokens, lens);
  shm::Completion c = submitAndWait(d);
  ASSERT_EQ(c.status_code, 0) << c.message;
  EXPECT_EQ(c.batch_id, d.batch_id);
  EXPECT_EQ(c.slot, 0u);
  EXPECT_EQ(c.rows, 3u);
  EXPECT_EQ(c.cols, 64u);
  EXPECT_EQ(c.output_bytes, 3u * 64 * 4);
  EXPECT_EQ(outputRows(0, 3 * 64), directEmbed(tokens, lens, PoolMode::kMean, true));

  // Explicit CLS pooling, unnormalized, in another slot.
  d = put(1, tokens, lens);
  d.pooling = shm::PoolingMode::kCls;
  d.normalize = 0;
  c = submitAndWait(d);
  ASSERT_EQ(c.status_code, 0) << c.message;
  EXPECT_EQ(outputRows(1, 3 * 64), directEmbed(tokens, lens, PoolMode::kCls, false));

  // Score: yes/no through the LM head.
  d = put(2, tokens, lens, shm::BatchKind::kScore);
  d.score_yes = kYes;
  d.score_no = kNo;
  c = submitAndWait(d);
  ASSERT_EQ(c.status_code, 0) << c.message;
  EXPECT_EQ(c.rows, 3u);
  EXPECT_EQ(c.cols, 1u);
  std::vector<float> want(3);
  ref_model_->enqueueScore({tokens, lens}, {kYes, kNo}, want.data());
  ASSERT_TRUE(ref_backend_->synchronize().isOk());
  EXPECT_EQ(outputRows(2, 3), want);
  EXPECT_EQ(loop_->stats().batches_run, 3u);
  EXPECT_EQ(loop_->stats().batches_rejected, 0u);
}

TEST_F(EmbeddingRunnerTest, PipelinedBatchesInAllSlotsCompleteWithTheirOwnResults) {
  std::vector<std::vector<int32_t>> toks = {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}};
  std::vector<shm::BatchDesc> ds;
  for (uint32_t s = 0; s < 3; ++s) {
    ds.push_back(put(s, toks[s], {static_cast<int32_t>(toks[s].size())}));
    ASSERT_TRUE(channel_->trySubmit(ds.back()));
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loop_->step(1s));
  for (uint32_t s = 0; s < 3; ++s) {
    auto c = channel_->waitCompletion(10s);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->status_code, 0);
    EXPECT_EQ(c->batch_id, ds[s].batch_id);  // in submission order
    EXPECT_EQ(outputRows(c->slot, 64),
              directEmbed(toks[c->slot], {static_cast<int32_t>(toks[c->slot].size())},
                          PoolMode::kMean, true));
  }
}

TEST_F(EmbeddingRunnerTest, StepReturnsBeforeTheResultIsReady) {
  // Occupy the backend's queue: the batch's forward pass cannot start until released.
  std::atomic<bool> release{false};
  backend_->launch([&] {
    while (!release.load()) std::this_thread::sleep_for(1ms);
  });
  shm::BatchDesc d = put(0, {1, 2, 3}, {3});
  ASSERT_TRUE(channel_->trySubmit(d));
  // step() returns while the backend is still held (waiting for the forward pass would never
  // return: the release below comes after it), with the batch in flight.
  ASSERT_TRUE(loop_->step(1s));
  EXPECT_EQ(loop_->inFlight(), 1u);
  EXPECT_FALSE(channel_->waitCompletion(100ms).has_value());  // not published yet
  release = true;
  auto c = channel_->waitCompletion(10s);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->status_code, 0);
  EXPECT_EQ(outputRows(0, 64), directEmbed({1, 2, 3}, {3}, PoolMode::kMean, true));
}

struct BadCase {
  const char* what;
  std::function<void(shm::BatchDesc&)> mutate;
  StatusCode code;
};

TEST_F(EmbeddingRunnerTest, BadDescriptorsAreAnsweredWithClearErrors) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  const std::vector<int32_t> lens = {1, 3};
  const auto lens_off = put(0, tokens, lens).seqlens_offset;
  std::vector<BadCase> cases = {
      {"tokens past the arena", [](shm::BatchDesc& d) { d.tokens_offset = 8190; },
       StatusCode::kInvalidArgument},
      {"seqlens offset overflows", [](shm::BatchDesc& d) { d.seqlens_offset = ~uint64_t{0} - 2; },
       StatusCode::kInvalidArgument},
      {"no sequences", [](shm::BatchDesc& d) { d.num_seqs = 0; }, StatusCode::kInvalidArgument},
      {"no tokens", [](shm::BatchDesc& d) { d.num_tokens = 0; }, StatusCode::kInvalidArgument},
      {"over the token budget", [](shm::BatchDesc& d) { d.num_tokens = kMaxTokens + 1; },
       StatusCode::kInvalidArgument},
      {"lengths do not sum to num_tokens", [](shm::BatchDesc& d) { d.num_tokens = 3; },
       StatusCode::kInvalidArgument},
      {"unknown kind", [](shm::BatchDesc& d) { d.kind = static_cast<shm::BatchKind>(9); },
       StatusCode::kInvalidArgument},
      {"generate on an embedding model",
       [](shm::BatchDesc& d) { d.kind = shm::BatchKind::kGenerate; }, StatusCode::kUnimplemented},
      {"unknown pooling", [](shm::BatchDesc& d) { d.pooling = static_cast<shm::PoolingMode>(7); },
       StatusCode::kInvalidArgument},
      {"score without a classification head",
       [](shm::BatchDesc& d) { d.kind = shm::BatchKind::kScore; }, StatusCode::kFailedPrecondition},
      {"score id outside the vocabulary",
       [](shm::BatchDesc& d) {
         d.kind = shm::BatchKind::kScore;
         d.score_yes = 256;
         d.score_no = 3;
       },
       StatusCode::kInvalidArgument},
      {"slot out of range", [](shm::BatchDesc& d) { d.slot = 3; }, StatusCode::kInvalidArgument},
      {"expired deadline", [](shm::BatchDesc& d) { d.deadline_ns = shm::monotonicNowNs() - 1000; },
       StatusCode::kDeadlineExceeded},
  };
  for (const BadCase& bc : cases) {
    shm::BatchDesc d = put(0, tokens, lens);
    d.seqlens_offset = lens_off;
    bc.mutate(d);
    shm::Completion c = submitAndWait(d);
    EXPECT_EQ(c.status_code, static_cast<int32_t>(bc.code)) << bc.what << ": " << c.message;
    EXPECT_EQ(c.batch_id, d.batch_id) << bc.what;
    EXPECT_EQ(c.rows, 0u) << bc.what;
    EXPECT_GT(std::strlen(c.message), 5u) << bc.what;
  }
  EXPECT_EQ(loop_->stats().batches_run, 0u);
  EXPECT_EQ(loop_->stats().batches_rejected, cases.size());

  // Content errors found in the arena data.
  struct ContentCase {
    const char* what;
    std::vector<int32_t> tokens, lens;
  };
  std::vector<int32_t> long_seq(129, 5);
  for (const ContentCase& cc :
       std::vector<ContentCase>{{"token id >= vocab", {1, 256}, {2}},
                                {"negative token id", {1, -1}, {2}},
                                {"zero-length sequence", {1, 2}, {2, 0}},
                                {"negative length", {1, 2}, {3, -1}},
                                {"sequence longer than max_seq_len", long_seq, {129}}}) {
    shm::BatchDesc d = put(1, cc.tokens, cc.lens);
    shm::Completion c = submitAndWait(d);
    EXPECT_EQ(c.status_code, static_cast<int32_t>(StatusCode::kInvalidArgument))
        << cc.what << ": " << c.message;
    EXPECT_GT(std::strlen(c.message), 5u) << cc.what;
  }

  // A good batch still runs afterwards.
  shm::BatchDesc d = put(2, tokens, lens);
  shm::Completion c = submitAndWait(d);
  EXPECT_EQ(c.status_code, 0) << c.message;
  EXPECT_EQ(outputRows(2, 2 * 64), directEmbed(tokens, lens, PoolMode::kMean, true));
}

TEST_F(EmbeddingRunnerTest, OutputLargerThanTheArenaIsRejected) {
  // 64 floats per row; the arena holds 64 rows, a 65-sequence batch does not fit.
  std::vector<int32_t> tokens(65, 1), lens(65, 1);
  shm::BatchDesc d = put(0, tokens, lens);
  shm::Completion c = submitAndWait(d);
  EXPECT_EQ(c.status_code, static_cast<int32_t>(StatusCode::kInvalidArgument)) << c.message;
  EXPECT_NE(std::string(c.message).find("output arena"), std::string::npos) << c.message;
}

TEST_F(EmbeddingRunnerTest, StepBeatsAndRunStopsCleanly) {
  const int64_t before = channel_->lastBeatNs();
  std::this_thread::sleep_for(2ms);
  EXPECT_FALSE(loop_->step(1ms));  // nothing submitted
  EXPECT_GT(channel_->lastBeatNs(), before);

  shm::BatchDesc d = put(0, {4, 5, 6}, {3});
  ASSERT_TRUE(channel_->trySubmit(d));
  std::atomic<bool> stop{false};
  std::thread runner([&] { loop_->run([&] { return stop.load(); }); });
  auto c = channel_->waitCompletion(10s);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->status_code, 0);
  // While running (idle), it keeps beating: a beat comes 150 ms after the one seen now. (Polled:
  // a fixed sleep then a 100 ms staleness bound failed when a loaded machine starved the runner.)
  const int64_t seen = channel_->lastBeatNs();
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (channel_->lastBeatNs() < seen + 150'000'000 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);
  EXPECT_GE(channel_->lastBeatNs(), seen + 150'000'000);
  stop = true;
  runner.join();
  EXPECT_EQ(channel_->state(), shm::WorkerState::kStopping);
}

TEST_F(EmbeddingRunnerTest, CpuBackendRunsEagerAndRefusesPrecapture) {
  // CUDA graphs are a capability of the cuda backend: on the cpu backend the default
  // (cuda_graphs on) runs every batch eagerly, and an explicit precapture list is refused.
  EXPECT_EQ(backend_->graphs(), nullptr);
  EXPECT_FALSE(model_->graphsEnabled());
  EXPECT_FALSE(runner_->graphs());
  const std::vector<int32_t> tokens = {3, 4, 5, 6, 7}, lens = {2, 3};
  shm::Completion c = submitAndWait(put(0, tokens, lens));
  ASSERT_EQ(c.status_code, 0) << c.message;
  EXPECT_EQ(outputRows(0, 2 * 64), directEmbed(tokens, lens, PoolMode::kMean, true));
  EXPECT_EQ(runner_->graphStats().replays, 0u);

  EmbeddingRunnerOptions ro;
  ro.precapture = {{1, 64}};
  auto e = EmbeddingRunner::create(*backend_, *model_, ro);
  ASSERT_FALSE(e.isOk());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("precapture needs CUDA graphs"), std::string::npos)
      << e.status().message();
}

}  // namespace
}  // namespace garden::rose
