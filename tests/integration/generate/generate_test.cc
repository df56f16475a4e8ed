// Generate through tulip's gRPC surface with fake-rose in LLM mode behind it: streaming order and
// content against the fake model's reference, many concurrent streams of different lengths,
// FINISH_LENGTH / FINISH_STOP, cancellation freeing KV blocks, prefix-cache hits, preemption on a
// tiny KV cache, admission errors, and rose killed mid-stream (UNAVAILABLE, then recovery).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>
#include <regex>
#include <thread>

#include "garden/v1/garden.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/fakes/tulip/fake_llm_model.h"
#include "tests/integration/support/harness.h"

namespace garden {
namespace {

using namespace std::chrono_literals;
namespace v1 = garden::v1;

constexpr uint32_t kVocab = 1000;

std::vector<int32_t> range(int32_t n, int32_t start = 10) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

std::vector<int32_t> ref(const std::vector<int32_t>& prompt, uint32_t n, float temperature = 0,
                         uint64_t seed = 0) {
  llm::SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return tulip::testing::fakeReference(prompt, n, p, kVocab);
}

v1::GenerateRequest req(const std::vector<int32_t>& prompt, uint32_t max_tokens) {
  v1::GenerateRequest r;
  for (int32_t t : prompt) r.add_prompt_ids(t);
  r.set_max_tokens(max_tokens);
  return r;
}

struct StreamOut {
  grpc::Status status;
  std::vector<int32_t> tokens;
  int chunks = 0;
  bool finish_only_last = true;
  v1::GenerateChunk last;
};

class Generate : public ::testing::Test {
 protected:
  void startTulip(std::vector<std::string> rose = {}, std::vector<std::string> extra = {}) {
    port_ = testing::freePort();
    metrics_port_ = testing::freePort();
    std::vector<std::string> argv =
        testing::tulipArgv(port_, metrics_port_, dir_.path(), "tests/fakes/fake-rose", "gen");
    argv.push_back("--rose-arg=--llm");
    for (auto& a : rose) argv.push_back("--rose-arg=" + a);
    argv.insert(argv.end(), extra.begin(), extra.end());
    tulip_ = std::make_unique<testing::Process>(argv, dir_.path() + "/tulip.log");
    // Connect only once tulip listens: a channel whose first attempts were refused backs off
    // for seconds.
    ASSERT_TRUE(waitListening(30s)) << tulip_->log();
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    // The least time one connection attempt gets (not a retry interval): 100 ms is too short
    // for a loaded machine (see ivy's tulip_client.cc).
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 3000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
    channel_ = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Tulip::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
    ASSERT_TRUE(waitServing(30s)) << "tulip never became healthy\n" << tulip_->log();
  }

  bool waitListening(std::chrono::seconds limit) {
    auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < limit) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port_));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      close(fd);
      if (ok) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  bool waitServing(std::chrono::seconds limit) {
    auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < limit) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 500ms);
      grpc::health::v1::HealthCheckRequest hreq;
      grpc::health::v1::HealthCheckResponse resp;
      if (health_->Check(&ctx, hreq, &resp).ok() &&
          resp.status() == grpc::health::v1::HealthCheckResponse::SERVING)
        return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  StreamOut run(const v1::GenerateRequest& r, grpc::ClientContext* ctx = nullptr) {
    grpc::ClientContext own;
    if (!ctx) ctx = &own;
    ctx->set_deadline(std::chrono::system_clock::now() + 120s);
    StreamOut out;
    auto reader = stub_->Generate(ctx, r);
    v1::GenerateChunk c;
    while (reader->Read(&c)) {
      if (out.chunks > 0 && out.last.finish_reason() != v1::FINISH_NONE)
        out.finish_only_last = false;
      ++out.chunks;
      out.tokens.insert(out.tokens.end(), c.token_ids().begin(), c.token_ids().end());
      out.last = c;
    }
    out.status = reader->Finish();
    return out;
  }

  v1::LoadResponse load() {
    grpc::ClientContext ctx;
    v1::LoadResponse l;
    EXPECT_TRUE(stub_->Load(&ctx, v1::LoadRequest(), &l).ok());
    return l;
  }

  // Polls Load until every KV block is free and nothing runs or waits.
  bool waitIdle(std::chrono::seconds limit = 30s) {
    auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < limit) {
      auto l = load();
      if (l.kv_total_blocks() > 0 && l.kv_free_blocks() == l.kv_total_blocks() &&
          l.running_seqs() == 0 && l.waiting_seqs() == 0)
        return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  double metric(const std::string& name) {
    auto r = testing::http(metrics_port_, "GET", "/metrics");
    std::smatch m;
    std::regex re("\n" + name + " ([0-9.e+]+)");
    if (!std::regex_search(r.body, m, re)) return -1;
    return std::stod(m[1]);
  }

  testing::TempDir dir_;
  int port_ = 0, metrics_port_ = 0;
  std::unique_ptr<testing::Process> tulip_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Tulip::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

TEST_F(Generate, StreamsInOrderAndReportsTheLlmFields) {
  startTulip({"--kv-blocks", "64", "--kv-block-size", "4"});
  {
    grpc::ClientContext ctx;
    v1::ModelInfoResponse info;
    ASSERT_TRUE(stub_->ModelInfo(&ctx, v1::ModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.kind(), "llm");
    EXPECT_EQ(info.model(), "fake-llm");
    ASSERT_EQ(info.eos_token_ids_size(), 1);
    EXPECT_EQ(info.eos_token_ids(0), 999);
    EXPECT_EQ(info.kv_blocks(), 64u);
    EXPECT_EQ(info.kv_block_size(), 4u);
  }
  auto out = run(req(range(7), 12));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message() << tulip_->log();
  EXPECT_EQ(out.tokens, ref(range(7), 12));
  EXPECT_TRUE(out.finish_only_last);
  EXPECT_EQ(out.last.finish_reason(), v1::FINISH_LENGTH);
  EXPECT_EQ(out.last.prompt_tokens(), 7u);
  EXPECT_EQ(out.last.completion_tokens(), 12u);
  EXPECT_GT(out.last.timings().total_us(), 0u);
  auto l = load();
  EXPECT_TRUE(l.worker_ready());
  EXPECT_EQ(l.kv_total_blocks(), 64u);
  EXPECT_EQ(l.kv_free_blocks(), 64u);
  EXPECT_EQ(l.running_seqs(), 0u);
  // Sampling with a seed is reproducible and follows the fake's counter-based draw.
  auto hot = req(range(5, 300), 8);
  hot.mutable_sampling()->set_temperature(0.7f);
  hot.mutable_sampling()->set_seed(1234);
  hot.mutable_sampling()->set_has_seed(true);
  auto h = run(hot);
  ASSERT_TRUE(h.status.ok());
  EXPECT_EQ(h.tokens, ref(range(5, 300), 8, 0.7f, 1234));
  // Embeddings are not served by an LLM tulip.
  grpc::ClientContext ctx;
  v1::EmbedRequest er;
  er.add_inputs()->add_ids(1);
  v1::EmbedResponse eresp;
  EXPECT_EQ(stub_->Embed(&ctx, er, &eresp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_GE(metric("tulip_generated_tokens_total"), 20.0);
  EXPECT_GE(metric("tulip_time_to_first_token_seconds_count"), 2.0);
}

TEST_F(Generate, ManyConcurrentStreamsOfDifferentLengths) {
  startTulip({"--kv-blocks", "256", "--kv-block-size", "4", "--delay-ms", "2", "--max-seqs", "5"},
             {"--max-batch-tokens", "64", "--max-num-seqs", "8"});
  constexpr int kStreams = 24;
  std::vector<std::future<StreamOut>> futs;
  for (int i = 0; i < kStreams; ++i) {
    futs.push_back(std::async(std::launch::async, [this, i] {
      return run(req(range(3 + i % 11, 20 * i), 1 + (i * 7) % 23));
    }));
  }
  for (int i = 0; i < kStreams; ++i) {
    auto out = futs[i].get();
    ASSERT_TRUE(out.status.ok()) << i << ": " << out.status.error_message();
    EXPECT_EQ(out.tokens, ref(range(3 + i % 11, 20 * i), 1 + (i * 7) % 23)) << "stream " << i;
    EXPECT_TRUE(out.finish_only_last);
    EXPECT_EQ(out.last.finish_reason(), v1::FINISH_LENGTH);
  }
  EXPECT_TRUE(waitIdle());
}

TEST_F(Generate, StopTokenAndMaxTokensAndAdmissionErrors) {
  startTulip({"--kv-blocks", "64", "--kv-block-size", "4", "--max-seq-len", "40"},
             {"--max-waiting-tokens", "30"});
  const auto full = ref(range(6), 10);
  auto r = req(range(6), 10);
  r.add_stop_token_ids(full[4]);
  auto out = run(r);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.tokens, std::vector<int32_t>(full.begin(), full.begin() + 5));
  EXPECT_EQ(out.last.finish_reason(), v1::FINISH_STOP);
  // max_tokens 0: the rest of the context (40 - 6). (The fake's stream for this prompt happens
  // to contain the eos id 999, hence ignore_eos.)
  auto rest_req = req(range(6), 0);
  rest_req.set_ignore_eos(true);
  auto rest = run(rest_req);
  ASSERT_TRUE(rest.status.ok());
  EXPECT_EQ(rest.tokens.size(), 34u);
  EXPECT_EQ(rest.last.finish_reason(), v1::FINISH_LENGTH);
  const auto rest_ref = ref(range(6), 34);
  EXPECT_EQ(rest.tokens, rest_ref);
  // Without ignore_eos the same request stops at the eos id, which is streamed last.
  const auto eos_at = std::find(rest_ref.begin(), rest_ref.end(), 999);
  ASSERT_NE(eos_at, rest_ref.end());
  auto eos = run(req(range(6), 0));
  ASSERT_TRUE(eos.status.ok());
  EXPECT_EQ(eos.tokens, std::vector<int32_t>(rest_ref.begin(), eos_at + 1));
  EXPECT_EQ(eos.last.finish_reason(), v1::FINISH_STOP);

  struct Case {
    v1::GenerateRequest r;
    grpc::StatusCode code;
    std::string needle;
  };
  std::vector<Case> cases;
  cases.push_back({req({}, 1), grpc::StatusCode::INVALID_ARGUMENT, "prompt_ids"});
  cases.push_back({req(range(40), 1), grpc::StatusCode::INVALID_ARGUMENT, "context is 40"});
  cases.push_back({req({1, 1000}, 1), grpc::StatusCode::INVALID_ARGUMENT, "prompt_ids[1]"});
  auto t = req({1}, 1);
  t.mutable_sampling()->set_temperature(-0.5f);
  cases.push_back({t, grpc::StatusCode::INVALID_ARGUMENT, "sampling.temperature"});
  auto tp = req({1}, 1);
  tp.mutable_sampling()->set_top_p(2.f);
  cases.push_back({tp, grpc::StatusCode::INVALID_ARGUMENT, "sampling.top_p"});
  auto tk = req({1}, 1);
  tk.mutable_sampling()->set_top_k(-1);
  cases.push_back({tk, grpc::StatusCode::INVALID_ARGUMENT, "sampling.top_k"});
  cases.push_back({req(range(31), 1), grpc::StatusCode::RESOURCE_EXHAUSTED, "limit 30"});
  auto m = req({1}, 1);
  m.set_model("other");
  cases.push_back({m, grpc::StatusCode::NOT_FOUND, "other"});
  for (auto& c : cases) {
    auto o = run(c.r);
    EXPECT_EQ(o.status.error_code(), c.code) << o.status.error_message();
    EXPECT_NE(o.status.error_message().find(c.needle), std::string::npos)
        << o.status.error_message();
    EXPECT_EQ(o.chunks, 0);
  }
}

TEST_F(Generate, CancellationMidStreamFreesBlocks) {
  // 50 ms a step: 100 tokens take 5 s, room enough to check and cancel mid-stream on a loaded
  // machine.
  startTulip({"--kv-blocks", "32", "--kv-block-size", "4", "--delay-ms", "50"});
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto reader = stub_->Generate(&ctx, req(range(9), 100));
  v1::GenerateChunk c;
  std::vector<int32_t> got;
  while (got.size() < 3 && reader->Read(&c))
    got.insert(got.end(), c.token_ids().begin(), c.token_ids().end());
  ASSERT_GE(got.size(), 3u);
  const auto want = ref(range(9), 100);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin()));
  auto mid = load();
  EXPECT_EQ(mid.running_seqs(), 1u);
  EXPECT_LT(mid.kv_free_blocks(), 32u);
  ctx.TryCancel();
  while (reader->Read(&c)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(waitIdle(30s)) << "blocks not freed after cancel: " << load().kv_free_blocks();
}

// [TAG_STOP_CHOICE] StopChoice over gRPC: the call id comes in the first chunk of an n > 1 call
// only; stopping one choice ends it (FINISH_STOP, fewer tokens, its blocks freed) while the other
// streams every token; stopping it again is OK, a bad index INVALID_ARGUMENT, and once the call
// is over (or for an id never issued) NOT_FOUND; tulip keeps serving.
TEST_F(Generate, StopChoiceEndsOneChoiceWhileTheOtherFinishes) {
  // 30 ms a step: 80 tokens take 2.4 s, room to stop a choice mid-stream on a loaded machine.
  startTulip({"--kv-blocks", "64", "--kv-block-size", "4", "--delay-ms", "30"});
  auto stopChoice = [&](uint64_t call_id, uint32_t index) {
    v1::StopChoiceRequest r;
    r.set_call_id(call_id);
    r.set_index(index);
    v1::StopChoiceResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    return stub_->StopChoice(&ctx, r, &resp);
  };
  EXPECT_EQ(stopChoice(0, 0).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(stopChoice(42, 0).error_code(), grpc::StatusCode::NOT_FOUND);
  // n = 1: no call id.
  {
    auto one = run(req(range(5), 3));
    ASSERT_TRUE(one.status.ok()) << one.status.error_message();
    EXPECT_EQ(one.last.call_id(), 0u);
  }
  constexpr uint32_t kMax = 80;
  v1::GenerateRequest r = req(range(9), kMax);
  r.set_n(2);
  r.set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto reader = stub_->Generate(&ctx, r);
  v1::GenerateChunk c;
  uint64_t call_id = 0;
  int chunks = 0;
  std::vector<int32_t> got[2];
  v1::GenerateChunk last[2];
  bool stopped = false;
  uint32_t free_before_stop = 0;
  while (reader->Read(&c)) {
    if (chunks++ == 0) {
      call_id = c.call_id();
    } else {
      EXPECT_EQ(c.call_id(), 0u) << "only the first chunk names the call";
    }
    ASSERT_LT(c.index(), 2u);
    got[c.index()].insert(got[c.index()].end(), c.token_ids().begin(), c.token_ids().end());
    if (c.finish_reason() != v1::FINISH_NONE) last[c.index()] = c;
    if (!stopped && got[1].size() >= 3) {
      ASSERT_NE(call_id, 0u);
      free_before_stop = load().kv_free_blocks();
      const grpc::Status st = stopChoice(call_id, 1);
      EXPECT_TRUE(st.ok()) << st.error_message();
      stopped = true;
      // Its blocks are freed while choice 0 still runs (choice 0 only takes more).
      EXPECT_TRUE(testing::eventually(10s, [&] {
        auto l = load();
        return l.running_seqs() <= 1u;
      }));
      EXPECT_EQ(stopChoice(call_id, 1).error_code(), grpc::StatusCode::OK);  // idempotent
      EXPECT_EQ(stopChoice(call_id, 2).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    }
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_TRUE(stopped);
  EXPECT_GT(free_before_stop, 0u);
  // Choice 0: every token, greedy, as if alone.
  EXPECT_EQ(got[0], ref(range(9), kMax));
  EXPECT_EQ(last[0].finish_reason(), v1::FINISH_LENGTH);
  EXPECT_EQ(last[0].completion_tokens(), kMax);
  // Choice 1: a prefix of the same stream, ended FINISH_STOP well before max_tokens.
  const auto want = ref(range(9), kMax);
  EXPECT_GE(got[1].size(), 3u);
  EXPECT_LT(got[1].size(), size_t{kMax / 2}) << "choice 1 was not stopped in time";
  EXPECT_TRUE(std::equal(got[1].begin(), got[1].end(), want.begin()));
  EXPECT_EQ(last[1].finish_reason(), v1::FINISH_STOP);
  EXPECT_EQ(last[1].completion_tokens(), got[1].size());
  // The call is over: its id is gone.
  EXPECT_EQ(stopChoice(call_id, 0).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(waitIdle(30s));
  EXPECT_TRUE(tulip_->alive());
}

TEST_F(Generate, RepeatedLongPromptHitsThePrefixCache) {
  startTulip({"--kv-blocks", "64", "--kv-block-size", "4"});
  const auto prompt = range(40, 500);
  auto a = run(req(prompt, 5));
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.last.cached_prompt_tokens(), 0u);
  auto b = run(req(prompt, 5));
  ASSERT_TRUE(b.status.ok());
  EXPECT_EQ(b.tokens, a.tokens);
  EXPECT_EQ(b.tokens, ref(prompt, 5));
  // 40 tokens = 10 full blocks; the last one holds the token the step samples from.
  EXPECT_EQ(b.last.cached_prompt_tokens(), 36u);
  EXPECT_GE(metric("tulip_prefix_cache_hit_tokens_total"), 36.0);
  EXPECT_TRUE(waitIdle());
}

TEST_F(Generate, PreemptionOnATinyCacheKeepsEveryStreamRight) {
  // 16 blocks of 2 tokens; 10 streams that each grow to ~20 tokens. fake-rose is paused until
  // tulip holds all ten, so they compete for the cache however late a loaded machine starts
  // their threads (unpaused, each stream could finish before the next one arrived).
  startTulip({"--kv-blocks", "16", "--kv-block-size", "2", "--max-seq-len", "32"},
             {"--max-num-seqs", "6", "--heartbeat-timeout-ms", "120000"});
  constexpr int kStreams = 10;
  const std::vector<pid_t> kids = testing::childrenOf(tulip_->pid());
  ASSERT_EQ(kids.size(), 1u);
  testing::Paused paused(kids.front());
  ASSERT_TRUE(paused.stopped());
  std::vector<std::future<StreamOut>> futs;
  for (int i = 0; i < kStreams; ++i) {
    futs.push_back(std::async(std::launch::async, [this, i] {
      auto r = req(range(4 + i % 5, 50 * i + 1), 14);
      if (i % 2) {
        r.mutable_sampling()->set_temperature(1.0f);
        r.mutable_sampling()->set_seed(77 + i);
        r.mutable_sampling()->set_has_seed(true);
      }
      return run(r);
    }));
  }
  const bool all_held = testing::eventually(60s, [&] {
    const auto l = load();
    return l.running_seqs() + l.waiting_seqs() == kStreams;
  });
  paused.resume();
  ASSERT_TRUE(all_held) << "tulip never held all " << kStreams << " streams";
  for (int i = 0; i < kStreams; ++i) {
    auto out = futs[i].get();
    ASSERT_TRUE(out.status.ok()) << i << ": " << out.status.error_message();
    EXPECT_EQ(out.tokens, ref(range(4 + i % 5, 50 * i + 1), 14, i % 2 ? 1.0f : 0.f, 77 + i))
        << "stream " << i;
  }
  EXPECT_GT(metric("tulip_llm_preemptions_total"), 0.0);
  EXPECT_TRUE(waitIdle());
}

TEST_F(Generate, RoseKilledMidStreamIsUnavailableThenRecovers) {
  // 50 ms a step: the stream is still running when the worker is killed, on a loaded machine too.
  startTulip({"--kv-blocks", "32", "--kv-block-size", "4", "--delay-ms", "50"});
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto reader = stub_->Generate(&ctx, req(range(5), 200));
  v1::GenerateChunk c;
  ASSERT_TRUE(reader->Read(&c));
  auto kids = testing::childrenOf(tulip_->pid());
  ASSERT_EQ(kids.size(), 1u);
  kill(kids[0], SIGKILL);
  while (reader->Read(&c)) {
  }
  auto st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_NE(st.error_message().find("rose worker"), std::string::npos) << st.error_message();
  // tulip restarts rose and serves again, with a fresh KV cache.
  auto t0 = std::chrono::steady_clock::now();
  StreamOut out;
  while (std::chrono::steady_clock::now() - t0 < 60s) {
    out = run(req(range(6), 4));
    if (out.status.ok()) break;
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE);
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(out.status.ok()) << out.status.error_message() << tulip_->log();
  EXPECT_EQ(out.tokens, ref(range(6), 4));
  EXPECT_TRUE(waitIdle());
  EXPECT_EQ(load().kv_total_blocks(), 32u);
}

}  // namespace
}  // namespace garden
