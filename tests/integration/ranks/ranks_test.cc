// tulip with the REAL rose spanning two rank processes (--tp 2 --ep 2 passed through --rose-arg,
// cpu backend, a tiny random gpt-oss from rose-mkmodel's writer): tulip sees one worker.
//   - two concurrent greedy streams equal the unsharded model's own continuation, computed in
//     this process (one sequence, whole context per token);
//   - kill -9 of rank 1 (rose's child, tulip's grandchild): the stream in flight fails
//     UNAVAILABLE or the next one is served by a restarted worker; tulip restarts rose (a new
//     rank 0 with a new rank 1), serves the same tokens again, and neither old process runs;
//   - rank 1 wedged inside its compute (the cpu backend's hang knob, kept for rank 1 only by
//     GARDEN_TEST_HANG_RANK): rank 0 waits in the next collective, its step progress stops, and
//     tulip's stuck-step rule fails the worker; the restart kills every old rank.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "garden/v1/garden.grpc.pb.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/model/llm_step.h"
#include "services/rose/ops/backend.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/ops/paged_kv_cache.h"
#include "services/rose/tools/mkmodel_gpt_oss.h"
#include "tests/integration/support/harness.h"
#include "tests/integration/support/tulip_load.h"

namespace garden {
namespace {

using namespace std::chrono_literals;
namespace v1 = garden::v1;

constexpr int32_t kBlock = 8;

std::vector<int32_t> prompt(int32_t n, int32_t start) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = start + 37 * i;
  return v;
}

bool running(pid_t pid) { return testing::processRunning(pid); }

class Ranks : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    rose::MkGptOssOptions mk;
    mk.out_dir = dir_->path() + "/gpt-oss";
    mk.seed = 23;
    mk.intermediate_size = 64;  // two 32-column units: the 2 ranks of --tp 2 can split them
    Status st = rose::makeGptOssModel(mk);
    ASSERT_TRUE(st.isOk()) << st.toString();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void TearDown() override {
    tulip_.reset();
    unsetenv("GARDEN_CPU_TEST_HANG_AT_MARK");
    unsetenv("GARDEN_TEST_HANG_RANK");
  }
  static std::string modelDir() { return dir_->path() + "/gpt-oss"; }

  // The unsharded model's greedy continuation: one sequence, its whole context as one step.
  static std::vector<int32_t> reference(std::vector<int32_t> tokens, int n) {
    auto backend = rose::makeBackend("cpu", rose::BackendOptions{1, 0, 256}).value();
    auto ops = rose::makeLlmOps(*backend, 1).value();
    rose::GptOssOptions o;
    o.max_batch_tokens = 256;
    o.max_seqs = 1;
    o.max_logits_rows = 1;
    o.max_model_len = 128;
    o.min_block_size = kBlock;
    auto model = rose::GptOssModel::load(modelDir(), *backend, *ops, o);
    EXPECT_TRUE(model.isOk()) << model.status().toString();
    if (!model.isOk()) return {};
    auto kv =
        rose::PagedKvCache::create(*backend, (*model)->kvShape(16, kBlock), (*model)->kvDType())
            .value();
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      const int32_t len = static_cast<int32_t>(tokens.size());
      rose::LlmStepSeq s;
      s.num_tokens = len;
      s.num_blocks = (len + kBlock - 1) / kBlock;
      s.sample = 1;
      std::vector<rose::LlmStepSeq> seqs = {s};
      std::vector<int32_t> blocks(static_cast<size_t>(s.num_blocks));
      for (int32_t b = 0; b < s.num_blocks; ++b) blocks[static_cast<size_t>(b)] = b;
      rose::LlmStep step{seqs, tokens, blocks};
      EXPECT_TRUE((*model)->validate(step, *kv).isOk());
      int32_t id = -1;
      backend->launch([&] { (*model)->enqueueStep(step, *kv, nullptr, &id); });
      EXPECT_TRUE(backend->synchronize().isOk());
      out.push_back(id);
      tokens.push_back(id);
    }
    return out;
  }

  // `par`: rose's layout and cache flags (each passed as --rose-arg).
  void startTulip(const std::vector<std::string>& par = {"--tp", "2", "--ep", "2", "--kv-blocks",
                                                         "64"}) {
    port_ = testing::freePort();
    std::vector<std::string> argv =
        testing::tulipArgv(port_, 0, modelDir(), "services/rose/rose", "ranks");
    argv.insert(argv.end(), {"--max-batch-tokens", "16", "--max-num-seqs", "4", "--rose-threads",
                             "1", "--rose-arg=--kv-block-size",
                             "--rose-arg=" + std::to_string(kBlock), "--rose-arg=--max-model-len",
                             "--rose-arg=128", "--rose-arg=--max-seqs", "--rose-arg=4"});
    for (const std::string& a : par) argv.push_back("--rose-arg=" + a);
    tulip_ = std::make_unique<testing::Process>(
        argv, dir_->path() + "/tulip-" + std::to_string(port_) + ".log");
    stub_ = v1::Tulip::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                   grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(waitReady(120s)) << tulip_->log();
  }

  bool waitReady(std::chrono::milliseconds limit) {
    return testing::waitWorkerReady(*stub_, limit);
  }

  // rose (rank 0, tulip's child) and its ranks (rose's children).
  pid_t rosePid() {
    const std::vector<pid_t> c = testing::runningChildrenOf(tulip_->pid());
    return c.empty() ? -1 : c[0];
  }
  std::vector<pid_t> rankPids(pid_t rose) { return testing::runningChildrenOf(rose); }

  struct Out {
    grpc::Status status;
    std::vector<int32_t> tokens;
  };
  Out generate(const std::vector<int32_t>& p, uint32_t n) {
    v1::GenerateRequest r;
    for (int32_t t : p) r.add_prompt_ids(t);
    r.set_max_tokens(n);
    r.set_ignore_eos(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 120s);
    auto reader = stub_->Generate(&ctx, r);
    Out out;
    v1::GenerateChunk c;
    while (reader->Read(&c)) {
      out.tokens.insert(out.tokens.end(), c.token_ids().begin(), c.token_ids().end());
    }
    out.status = reader->Finish();
    return out;
  }

  static testing::TempDir* dir_;
  int port_ = 0;
  std::unique_ptr<testing::Process> tulip_;
  std::unique_ptr<v1::Tulip::Stub> stub_;
};
testing::TempDir* Ranks::dir_ = nullptr;

TEST_F(Ranks, StreamsEqualTheUnshardedModelAndAKilledRankRestartsEveryRank) {
  const auto a = prompt(20, 1000), b = prompt(27, 5000);
  const auto want_a = reference(a, 8), want_b = reference(b, 8);
  ASSERT_EQ(want_a.size(), 8u);
  ASSERT_NE(want_a, want_b);
  startTulip();
  {
    grpc::ClientContext ctx;
    v1::ModelInfoResponse info;
    ASSERT_TRUE(stub_->ModelInfo(&ctx, v1::ModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.kind(), "llm");
    EXPECT_EQ(info.kv_blocks(), 64u);
  }
  const pid_t rose0 = rosePid();
  ASSERT_GT(rose0, 0);
  const std::vector<pid_t> ranks0 = rankPids(rose0);
  ASSERT_EQ(ranks0.size(), 1u) << "--tp 2: rank 0 and one more process";

  // Two concurrent streams, prefilled in chunks of at most 16 tokens, batched decode.
  auto fa = std::async(std::launch::async, [&] { return generate(a, 8); });
  auto fb = std::async(std::launch::async, [&] { return generate(b, 8); });
  auto oa = fa.get(), ob = fb.get();
  ASSERT_TRUE(oa.status.ok()) << oa.status.error_message() << tulip_->log();
  ASSERT_TRUE(ob.status.ok()) << ob.status.error_message();
  EXPECT_EQ(oa.tokens, want_a);
  EXPECT_EQ(ob.tokens, want_b);

  // kill -9 rank 1: the worker fails, tulip restarts it (every rank), and serves again.
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(ranks0[0], SIGKILL), 0);
  ASSERT_TRUE(testing::eventually(60s, [&] {
    const pid_t r = rosePid();
    return r > 0 && r != rose0;
  })) << "tulip did not restart rose\n"
      << tulip_->log();
  ASSERT_TRUE(waitReady(60s)) << tulip_->log();
  std::printf("rank 1 killed: rose restarted and ready in %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - t0)
                                         .count()));
  EXPECT_FALSE(running(rose0)) << "the old rank 0 still runs";
  EXPECT_FALSE(running(ranks0[0])) << "the old rank 1 still runs";
  const pid_t rose1 = rosePid();
  ASSERT_EQ(testing::childrenOf(tulip_->pid()).size(), 1u) << "one rose under tulip";
  EXPECT_EQ(rankPids(rose1).size(), 1u) << "the restarted rose runs its own rank 1";
  auto again = generate(b, 8);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message() << tulip_->log();
  EXPECT_EQ(again.tokens, want_b);
  EXPECT_NE(tulip_->log().find("rank 1"), std::string::npos) << "the failure names the rank";
}

// --dp 2 --ep 2: two data-parallel groups, each caching half of the 16 block ids (8 blocks of 8
// tokens). rose announces the groups (ModelFacts kv_block_groups) and refuses a table that
// straddles them; tulip keeps every sequence in one group. Four concurrent streams need more
// blocks than one group has (so both groups serve, and a group runs out and preempts): every
// stream equals the unsharded model's continuation, and no step is refused.
TEST_F(Ranks, DataParallelGroupsKeepEverySequenceInOneGroup) {
  const std::vector<std::vector<int32_t>> prompts = {prompt(20, 1000), prompt(27, 5000),
                                                     prompt(23, 9000), prompt(21, 3000)};
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(reference(p, 8));
  startTulip({"--dp", "2", "--ep", "2", "--kv-blocks", "16"});
  {
    grpc::ClientContext ctx;
    v1::ModelInfoResponse info;
    ASSERT_TRUE(stub_->ModelInfo(&ctx, v1::ModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.kv_blocks(), 16u);
  }
  std::vector<std::future<Out>> outs;
  for (const auto& p : prompts) {
    outs.push_back(std::async(std::launch::async, [&, p] { return generate(p, 8); }));
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    Out o = outs[i].get();
    ASSERT_TRUE(o.status.ok()) << "stream " << i << ": " << o.status.error_message() << "\n"
                               << tulip_->log();
    EXPECT_EQ(o.tokens, want[i]) << "stream " << i;
  }
  const std::string log = tulip_->log();
  EXPECT_NE(log.find("\"block_groups\":2"), std::string::npos) << log;
  EXPECT_EQ(log.find("another dp group"), std::string::npos) << log;
}

TEST_F(Ranks, AWedgedRankIsCaughtByTulipsStuckStepRule) {
  // Rank 1's third layer mark never returns: the prefill's first step (2 layers) completes, the
  // second step wedges rank 1 inside its compute.
  setenv("GARDEN_CPU_TEST_HANG_AT_MARK", "3", 1);
  setenv("GARDEN_TEST_HANG_RANK", "1", 1);
  startTulip();
  const pid_t rose0 = rosePid();
  ASSERT_GT(rose0, 0);
  const std::vector<pid_t> ranks0 = rankPids(rose0);
  ASSERT_EQ(ranks0.size(), 1u);
  const auto t0 = std::chrono::steady_clock::now();
  auto out = generate(prompt(20, 42), 4);
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(out.status.ok()) << "a wedged rank went unnoticed";
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE) << out.status.error_message();
  EXPECT_NE(out.status.error_message().find("stuck"), std::string::npos)
      << out.status.error_message();
  EXPECT_LT(took, 30s);
  std::printf("wedged rank 1 detected after %lld ms: %s\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(took).count()),
              out.status.error_message().c_str());
  // The restart killed rank 0 (SIGKILL), and rank 1 died with it (PDEATHSIG).
  EXPECT_TRUE(testing::eventually(10s, [&] { return !running(rose0) && !running(ranks0[0]); }))
      << "an old rank still runs";
}

}  // namespace
}  // namespace garden
