// Generate through tulip with the REAL rose on a tiny random gpt-oss checkpoint (rose-mkmodel's
// generator, cpu backend): every greedy stream — batched with others, prefilled in chunks under
// a small token budget, served from the prefix cache, preempted on a tiny KV cache — equals rose's
// own greedy continuation computed directly in this process (the same model, one sequence,
// whole context recomputed per token, no paging tricks). The same with prefill/decode
// disaggregation (tulip --disaggregate, [TAG_DISAGG]): a prefill rose runs the prompts and
// samples the first token, the decode rose copies each sequence's KV blocks from the prefill
// rose's export and generates the rest — the streams must not change.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <thread>

#include "garden/v1/garden.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/ops/paged_kv_cache.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/model/llm_step.h"
#include "services/rose/ops/backend.h"
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

class GenerateRose : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    rose::MkGptOssOptions mk;
    mk.out_dir = dir_->path() + "/gpt-oss";
    mk.seed = 11;
    Status st = rose::makeGptOssModel(mk);
    ASSERT_TRUE(st.isOk()) << st.toString();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string modelDir() { return dir_->path() + "/gpt-oss"; }

  // rose's greedy continuation, the plain way: one sequence, its whole context as one step.
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
      std::vector<int32_t> blocks(s.num_blocks);
      for (int32_t b = 0; b < s.num_blocks; ++b) blocks[b] = b;
      rose::LlmStep step{seqs, tokens, blocks};
      Status v = (*model)->validate(step, *kv);
      EXPECT_TRUE(v.isOk()) << v.toString();
      int32_t id = -1;
      backend->launch([&] { (*model)->enqueueStep(step, *kv, nullptr, &id); });
      EXPECT_TRUE(backend->synchronize().isOk());
      out.push_back(id);
      tokens.push_back(id);
    }
    return out;
  }

  // window_blocks: rose's --kv-window-blocks (-1: its default, auto on the cpu); disaggregate:
  // tulip --disaggregate (two roses).
  void startTulip(int kv_blocks, int window_blocks = -1, bool disaggregate = false,
                  std::vector<std::string> extra = {}) {
    port_ = testing::freePort();
    metrics_port_ = testing::freePort();
    std::vector<std::string> argv =
        testing::tulipArgv(port_, metrics_port_, modelDir(), "services/rose/rose", "genrose");
    argv.insert(
        argv.end(),
        {"--max-batch-tokens", "16", "--max-num-seqs", "4", "--rose-threads", "1",
         // the preemption test pauses rose for a moment, steps in flight
         "--heartbeat-timeout-ms", "120000", "--progress-timeout-ms", "120000",
         "--rose-arg=--kv-block-size", "--rose-arg=" + std::to_string(kBlock),
         "--rose-arg=--max-model-len", "--rose-arg=128", "--rose-arg=--max-seqs", "--rose-arg=4"});
    if (kv_blocks > 0) {  // else the extra arguments size each rose
      argv.insert(argv.end(),
                  {"--rose-arg=--kv-blocks", "--rose-arg=" + std::to_string(kv_blocks)});
    }
    if (window_blocks >= 0) {
      argv.insert(argv.end(),
                  {"--rose-arg=--kv-window-blocks", "--rose-arg=" + std::to_string(window_blocks)});
    }
    if (disaggregate) argv.push_back("--disaggregate");
    argv.insert(argv.end(), extra.begin(), extra.end());
    tulip_ = std::make_unique<testing::Process>(
        argv, dir_->path() + "/tulip-" + std::to_string(port_) + ".log");
    auto t0 = std::chrono::steady_clock::now();
    bool listening = false;
    while (!listening && std::chrono::steady_clock::now() - t0 < 60s) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port_));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      listening = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      close(fd);
      if (!listening) std::this_thread::sleep_for(20ms);
    }
    ASSERT_TRUE(listening) << tulip_->log();
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                       grpc::InsecureChannelCredentials());
    stub_ = v1::Tulip::NewStub(channel);
    auto health = grpc::health::v1::Health::NewStub(channel);
    while (std::chrono::steady_clock::now() - t0 < 120s) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 500ms);
      grpc::health::v1::HealthCheckResponse resp;
      if (health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok() &&
          resp.status() == grpc::health::v1::HealthCheckResponse::SERVING)
        return;
      std::this_thread::sleep_for(50ms);
    }
    FAIL() << "tulip + rose never became healthy\n" << tulip_->log();
  }

  struct Out {
    grpc::Status status;
    std::vector<int32_t> tokens;
    v1::GenerateChunk last;
  };
  // choices > 1: every choice's tokens appended in arrival order (greedy choices are equal, so
  // the test compares per-choice streams through `per_choice`).
  Out generate(const std::vector<int32_t>& p, uint32_t n, uint32_t choices = 1,
               std::vector<std::vector<int32_t>>* per_choice = nullptr) {
    v1::GenerateRequest r;
    for (int32_t t : p) r.add_prompt_ids(t);
    r.set_max_tokens(n);
    r.set_ignore_eos(true);  // a random model may emit an eos id; the reference does not stop
    if (choices > 1) r.set_n(choices);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 120s);
    auto reader = stub_->Generate(&ctx, r);
    Out out;
    v1::GenerateChunk c;
    if (per_choice) per_choice->assign(choices, {});
    while (reader->Read(&c)) {
      out.tokens.insert(out.tokens.end(), c.token_ids().begin(), c.token_ids().end());
      if (per_choice && c.index() < choices) {
        auto& v = (*per_choice)[c.index()];
        v.insert(v.end(), c.token_ids().begin(), c.token_ids().end());
      }
      // With several choices: the last chunk of any choice (their counts are per choice).
      if (!per_choice || c.finish_reason() != v1::FINISH_NONE) out.last = c;
    }
    out.status = reader->Finish();
    return out;
  }

  double metric(const std::string& name) {
    auto r = testing::http(metrics_port_, "GET", "/metrics");
    auto at = r.body.find("\n" + name + " ");
    if (at == std::string::npos) return -1;
    return std::stod(r.body.substr(at + name.size() + 2));
  }

  // Three streams (prompts of 20, 27 and 22 tokens starting at 300, 7000 and 90000 + `shift`,
  // 8 tokens each)
  // held by tulip while rose is paused, so they compete for the cache however late a loaded
  // machine starts their threads; each must equal rose's own continuation and tulip must have
  // preempted.
  void threeCompetingStreams(int32_t shift) {
    const auto a = prompt(20, 300 + shift), b = prompt(27, 7000 + shift),
               c = prompt(22, 90000 + shift);
    const auto want_a = reference(a, 8), want_b = reference(b, 8), want_c = reference(c, 8);
    const std::vector<pid_t> kids = testing::childrenOf(tulip_->pid());
    ASSERT_EQ(kids.size(), disaggregated_ ? 2u : 1u);
    // Every rose paused (with --disaggregate the prefill one too).
    std::vector<std::unique_ptr<testing::Paused>> pauses;
    for (pid_t k : kids) {
      pauses.push_back(std::make_unique<testing::Paused>(k));
      ASSERT_TRUE(pauses.back()->stopped());
    }
    auto fa = std::async(std::launch::async, [&] { return generate(a, 8); });
    auto fb = std::async(std::launch::async, [&] { return generate(b, 8); });
    auto fc = std::async(std::launch::async, [&] { return generate(c, 8); });
    const bool all_held = testing::eventually(60s, [&] {
      auto l = testing::tulipLoad(*stub_);
      return l && l->running_seqs() + l->waiting_seqs() == 3;
    });
    for (auto& p : pauses) p->resume();
    ASSERT_TRUE(all_held) << "tulip never held the three streams";
    auto oa = fa.get(), ob = fb.get(), oc = fc.get();
    ASSERT_TRUE(oa.status.ok()) << oa.status.error_message() << tulip_->log();
    ASSERT_TRUE(ob.status.ok()) << ob.status.error_message();
    ASSERT_TRUE(oc.status.ok()) << oc.status.error_message();
    EXPECT_EQ(oa.tokens, want_a);
    EXPECT_EQ(ob.tokens, want_b);
    EXPECT_EQ(oc.tokens, want_c);
    EXPECT_GT(metric("tulip_llm_preemptions_total"), 0.0);
  }

  // The labelled counter tulip_kv_handoffs_total{outcome="..."} (-1 when absent).
  double handoffs(const std::string& outcome) {
    return metric("tulip_kv_handoffs_total{outcome=\"" + outcome + "\"}");
  }

  static testing::TempDir* dir_;
  bool disaggregated_ = false;
  int port_ = 0, metrics_port_ = 0;
  std::unique_ptr<testing::Process> tulip_;
  std::unique_ptr<v1::Tulip::Stub> stub_;
};

testing::TempDir* GenerateRose::dir_ = nullptr;

TEST_F(GenerateRose, GreedyStreamsEqualRosesOwnContinuation) {
  const auto a = prompt(20, 1000), b = prompt(27, 5000);
  const auto want_a = reference(a, 8), want_b = reference(b, 8);
  ASSERT_EQ(want_a.size(), 8u);
  ASSERT_NE(want_a, want_b);
  startTulip(64);
  {
    grpc::ClientContext ctx;
    v1::ModelInfoResponse info;
    ASSERT_TRUE(stub_->ModelInfo(&ctx, v1::ModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.kind(), "llm");
    EXPECT_EQ(info.kv_blocks(), 64u);
    EXPECT_EQ(info.kv_block_size(), static_cast<uint32_t>(kBlock));
    EXPECT_EQ(info.kv_window_blocks(), 28u);  // [TAG_KV_WINDOW_GROUP] rose's auto size
    EXPECT_EQ(info.kv_window(), 8u);
    EXPECT_GT(info.eos_token_ids_size(), 0);
  }
  // Two concurrent streams, prefilled in chunks of at most 16 tokens.
  auto fa = std::async(std::launch::async, [&] { return generate(a, 8); });
  auto fb = std::async(std::launch::async, [&] { return generate(b, 8); });
  auto oa = fa.get(), ob = fb.get();
  ASSERT_TRUE(oa.status.ok()) << oa.status.error_message() << tulip_->log();
  ASSERT_TRUE(ob.status.ok()) << ob.status.error_message();
  EXPECT_EQ(oa.tokens, want_a);
  EXPECT_EQ(ob.tokens, want_b);
  EXPECT_EQ(oa.last.finish_reason(), v1::FINISH_LENGTH);
  // The same prompt again: its full blocks come from the prefix cache, the stream is the same.
  auto again = generate(a, 8);
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.tokens, want_a);
  EXPECT_EQ(again.last.cached_prompt_tokens(), 16u);  // 20 tokens: two full blocks of 8
  // [TAG_KV_WINDOW_GROUP] The sliding layer (window 8) ran from rose's own pool, auto-sized on the
  // cpu: 2 x (4 seqs x (ceil(7 / 8) + 2) + ceil(16 / 8)) = 28 blocks, all free again; the
  // streams above crossed the window (20+ tokens), so their window tables had holes.
  EXPECT_TRUE(testing::eventually(10s, [&] {
    return metric("tulip_kv_window_blocks_free") == 28.0 &&
           metric("tulip_kv_window_blocks_used") == 0.0;
  })) << metric("tulip_kv_window_blocks_free") << " " << metric("tulip_kv_window_blocks_used");
}

// [TAG_KV_WINDOW_GROUP] A window pool of 5 blocks (one 16-token chunk with its window needs 4) for
// three streams: the window pool preempts, the full pool (64 blocks) never runs short, and every
// stream still equals rose's own continuation computed without a window pool.
TEST_F(GenerateRose, WindowPoolPreemptionStillGivesRosesContinuation) {
  startTulip(64, 5);
  threeCompetingStreams(1);
  {
    grpc::ClientContext ctx;
    v1::LoadResponse load;
    ASSERT_TRUE(stub_->Load(&ctx, v1::LoadRequest(), &load).ok());
    EXPECT_EQ(load.kv_window_total_blocks(), 5u);
    EXPECT_EQ(load.kv_window_free_blocks(), 5u);
    EXPECT_EQ(load.kv_free_blocks(), 64u);
  }
  EXPECT_TRUE(testing::eventually(10s, [&] {
    return metric("tulip_kv_window_blocks_free") == 5.0 && metric("tulip_kv_blocks_free") == 64.0;
  })) << metric("tulip_kv_window_blocks_free") << " " << metric("tulip_kv_blocks_free");
}

TEST_F(GenerateRose, PreemptionOnATinyCacheStillGivesRosesContinuation) {
  // 9 blocks of 8 = 72 token slots for three streams that grow to 28, 35 and 30 tokens.
  startTulip(9);
  threeCompetingStreams(0);
  grpc::ClientContext ctx;
  v1::LoadResponse load;
  ASSERT_TRUE(stub_->Load(&ctx, v1::LoadRequest(), &load).ok());
  EXPECT_EQ(load.kv_free_blocks(), 9u);
}

// ---- Prefill/decode disaggregation [TAG_DISAGG] ------------------------------------------------

// Two concurrent streams and a prefix-cache repeat through a prefill rose and a decode rose
// (sliding layers in window pools on both, rose's cpu default): each stream equals rose's own
// continuation; every sequence was handed over (one copy each), and once done every block of
// both workers is free again.
TEST_F(GenerateRose, DisaggregatedStreamsEqualRosesOwnContinuation) {
  const auto a = prompt(20, 1000), b = prompt(27, 5000), c = prompt(9, 77);
  const auto want_a = reference(a, 8), want_b = reference(b, 8), want_c = reference(c, 1);
  disaggregated_ = true;
  startTulip(64, -1, true);
  EXPECT_EQ(testing::childrenOf(tulip_->pid()).size(), 2u) << "a prefill rose and a decode rose";
  auto fa = std::async(std::launch::async, [&] { return generate(a, 8); });
  auto fb = std::async(std::launch::async, [&] { return generate(b, 8); });
  auto oa = fa.get(), ob = fb.get();
  ASSERT_TRUE(oa.status.ok()) << oa.status.error_message() << tulip_->log();
  ASSERT_TRUE(ob.status.ok()) << ob.status.error_message() << tulip_->log();
  EXPECT_EQ(oa.tokens, want_a);
  EXPECT_EQ(ob.tokens, want_b);
  EXPECT_EQ(oa.last.finish_reason(), v1::FINISH_LENGTH);
  EXPECT_EQ(oa.last.completion_tokens(), 8u);
  EXPECT_EQ(oa.last.prompt_tokens(), 20u);
  // The prefix cache lives on the prefill side: the repeat's full blocks come from it.
  auto again = generate(a, 8);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.tokens, want_a);
  EXPECT_EQ(again.last.cached_prompt_tokens(), 16u);
  // One token: it ends on the prefill side (no handoff).
  auto one = generate(c, 1);
  ASSERT_TRUE(one.status.ok()) << one.status.error_message();
  EXPECT_EQ(one.tokens, want_c);
  EXPECT_EQ(handoffs("ok"), 3.0);
  EXPECT_LE(handoffs("error"), 0.0);
  // Both workers' blocks are free again (Load adds the two sides up: 64 each).
  EXPECT_TRUE(testing::eventually(10s, [&] {
    grpc::ClientContext ctx;
    v1::LoadResponse load;
    return stub_->Load(&ctx, v1::LoadRequest(), &load).ok() && load.kv_free_blocks() == 128u &&
           load.running_seqs() == 0u;
  }));
}

// Several choices (n = 3, greedy: all equal rose's continuation) are each handed over on their
// own; three streams competing for a decode rose of 9 blocks (the prefill rose has 64) preempt
// there (recomputed on the decode rose) and still equal rose's continuation.
TEST_F(GenerateRose, DisaggregatedChoicesAndDecodeSidePreemption) {
  disaggregated_ = true;
  startTulip(0, -1, true,
             {"--prefill-rose-arg=--kv-blocks", "--prefill-rose-arg=64",
              "--decode-rose-arg=--kv-blocks", "--decode-rose-arg=9"});
  const auto p = prompt(21, 4242);
  const auto want = reference(p, 6);
  std::vector<std::vector<int32_t>> per;
  auto o = generate(p, 6, 3, &per);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message() << tulip_->log();
  ASSERT_EQ(per.size(), 3u);
  for (const auto& v : per) EXPECT_EQ(v, want);
  EXPECT_EQ(handoffs("ok"), 3.0);
  threeCompetingStreams(2);
  EXPECT_EQ(handoffs("ok"), 6.0);
}

// A stream cancelled after its first token (the client goes away while the decode side runs it)
// frees its blocks on both workers; the next request is served normally.
TEST_F(GenerateRose, DisaggregatedCancelFreesBothSides) {
  disaggregated_ = true;
  startTulip(64, -1, true);
  const auto p = prompt(12, 321);
  {
    v1::GenerateRequest r;
    for (int32_t t : p) r.add_prompt_ids(t);
    r.set_max_tokens(100);
    r.set_ignore_eos(true);
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, r);
    v1::GenerateChunk c;
    int tokens = 0;
    while (tokens < 2 && reader->Read(&c)) tokens += c.token_ids_size();
    EXPECT_GE(tokens, 2);
    ctx.TryCancel();
    while (reader->Read(&c)) {
    }
    (void)reader->Finish();
  }
  EXPECT_TRUE(testing::eventually(20s, [&] {
    grpc::ClientContext ctx;
    v1::LoadResponse load;
    return stub_->Load(&ctx, v1::LoadRequest(), &load).ok() && load.kv_free_blocks() == 128u &&
           load.running_seqs() == 0u;
  })) << tulip_->log();
  auto o = generate(prompt(10, 55), 4);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.tokens, reference(prompt(10, 55), 4));
}

// Killing the prefill rose leaves the sequences already handed over alone (their KV lives on the
// decode rose now); killing the decode rose ends its streams UNAVAILABLE; after each restart
// tulip serves again, the streams equal to rose's own continuation.
TEST_F(GenerateRose, DisaggregatedWorkerKilledThenRecovers) {
  disaggregated_ = true;
  startTulip(64, -1, true);
  const auto a = prompt(20, 2024);
  const auto want_a = reference(a, 24);
  auto [prefill, decode] = testing::prefillAndDecodeRose(tulip_->pid());
  ASSERT_GT(prefill, 0);
  ASSERT_GT(decode, 0);
  {
    v1::GenerateRequest r;
    for (int32_t t : a) r.add_prompt_ids(t);
    r.set_max_tokens(24);
    r.set_ignore_eos(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 60s);
    auto reader = stub_->Generate(&ctx, r);
    std::vector<int32_t> got;
    v1::GenerateChunk c;
    // The decode rose paused once the stream has its second token: it is on the decode side.
    std::unique_ptr<testing::Paused> paused;
    while (reader->Read(&c)) {
      got.insert(got.end(), c.token_ids().begin(), c.token_ids().end());
      if (!paused && got.size() >= 2) {
        paused = std::make_unique<testing::Paused>(decode);
        ASSERT_TRUE(paused->stopped());
        ASSERT_EQ(kill(prefill, SIGKILL), 0);
        paused->resume();
      }
    }
    const auto st = reader->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message() << tulip_->log();
    EXPECT_EQ(got, want_a);
  }
  // The prefill rose comes back (a new pid, a new export): served again.
  auto t0 = std::chrono::steady_clock::now();
  Out o;
  while (std::chrono::steady_clock::now() - t0 < 60s) {
    o = generate(prompt(9, 31), 5);
    if (o.status.ok()) break;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(o.status.ok()) << o.status.error_message() << tulip_->log();
  EXPECT_EQ(o.tokens, reference(prompt(9, 31), 5));
  std::tie(prefill, decode) = testing::prefillAndDecodeRose(tulip_->pid());
  {
    v1::GenerateRequest r;
    for (int32_t t : a) r.add_prompt_ids(t);
    r.set_max_tokens(100);
    r.set_ignore_eos(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 60s);
    auto reader = stub_->Generate(&ctx, r);
    v1::GenerateChunk c;
    size_t got = 0;
    bool killed = false;
    while (reader->Read(&c)) {
      got += static_cast<size_t>(c.token_ids_size());
      if (!killed && got >= 2) {
        testing::Paused paused(decode);  // it cannot finish the stream before it dies
        ASSERT_TRUE(paused.stopped());
        ASSERT_EQ(kill(decode, SIGKILL), 0);
        killed = true;
      }
    }
    const auto st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
    EXPECT_LT(got, 100u);
  }
  t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < 60s) {
    o = generate(prompt(11, 61), 5);
    if (o.status.ok()) break;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(o.status.ok()) << o.status.error_message() << tulip_->log();
  EXPECT_EQ(o.tokens, reference(prompt(11, 61), 5));
}

}  // namespace
}  // namespace garden
