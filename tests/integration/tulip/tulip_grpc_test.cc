// tulip as a real process on a real port, driving fake-rose (the real shm protocol, a trivial
// model), exercised through its gRPC surface: Embed, Score, Load, ModelInfo, grpc.health.v1,
// deadlines, admission limits, cancellation, Generate refusal, and SIGTERM drain.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstring>
#include <future>
#include <thread>

#include "garden/v1/garden.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/support/harness.h"
#include "tests/integration/support/tulip_load.h"

namespace garden {
namespace {

using namespace std::chrono_literals;
namespace v1 = garden::v1;

class TulipGrpc : public ::testing::Test {
 protected:
  void startTulip(std::vector<std::string> extra = {}) {
    port_ = testing::freePort();
    std::vector<std::string> argv = {testing::binary("services/tulip/tulip"),
                                     "--host", "127.0.0.1", "--port", std::to_string(port_),
                                     "--metrics-port", "0", "--model", dir_.path(),
                                     "--rose-bin", testing::binary("tests/fakes/fake-rose"),
                                     "--shm-name",
                                     "/garden-tg-" + std::to_string(getpid()) + "-" +
                                         std::to_string(port_)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    tulip_ = std::make_unique<testing::Process>(argv, dir_.path() + "/tulip.log");
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Tulip::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
    auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < 60s) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 500ms);
      grpc::health::v1::HealthCheckRequest req;
      grpc::health::v1::HealthCheckResponse resp;
      if (health_->Check(&ctx, req, &resp).ok() &&
          resp.status() == grpc::health::v1::HealthCheckResponse::SERVING)
        return;
      std::this_thread::sleep_for(50ms);
    }
    FAIL() << "tulip never became healthy\n" << tulip_->log();
  }

  // Tokens tulip has on the worker / in its queue (its Load RPC), -1 when Load fails.
  int64_t inflightTokens() {
    auto l = testing::tulipLoad(*stub_);
    return l ? static_cast<int64_t>(l->inflight_tokens()) : -1;
  }
  int64_t queuedTokens() {
    auto l = testing::tulipLoad(*stub_);
    return l ? static_cast<int64_t>(l->queued_tokens()) : -1;
  }

  static v1::EmbedRequest embedReq(std::vector<std::vector<int32_t>> seqs) {
    v1::EmbedRequest r;
    for (auto& s : seqs) {
      auto* t = r.add_inputs();
      for (int32_t id : s) t->add_ids(id);
    }
    r.set_normalize(false);
    return r;
  }

  static std::vector<float> row(const v1::EmbedResponse& r, int i) {
    std::vector<float> v(r.dim());
    std::memcpy(v.data(), r.embeddings(i).data(), r.dim() * sizeof(float));
    return v;
  }

  testing::TempDir dir_;
  int port_ = 0;
  std::unique_ptr<testing::Process> tulip_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Tulip::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

TEST_F(TulipGrpc, EmbedScoreLoadModelInfo) {
  startTulip();
  {
    grpc::ClientContext ctx;
    v1::ModelInfoResponse info;
    ASSERT_TRUE(stub_->ModelInfo(&ctx, v1::ModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.model(), "fake");
    EXPECT_EQ(info.hidden_size(), 4u);
    EXPECT_EQ(info.max_seq_len(), 64u);
    EXPECT_TRUE(info.has_score_head());
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "grpc-it-1");
    v1::EmbedResponse resp;
    auto st = stub_->Embed(&ctx, embedReq({{1, 2, 3}, {10, 20}}), &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(resp.embeddings_size(), 2);
    EXPECT_EQ(resp.dim(), 4u);
    EXPECT_EQ(row(resp, 0), (std::vector<float>{6, 3, 0, 1}));
    EXPECT_EQ(row(resp, 1), (std::vector<float>{30, 2, 0, 1}));
    EXPECT_EQ(resp.prompt_tokens(), 5u);
    EXPECT_GT(resp.timings().total_us(), 0u);
  }
  {
    grpc::ClientContext ctx;
    v1::ScoreRequest req;
    for (int n : {3, 7}) {
      auto* t = req.add_inputs();
      for (int i = 0; i < n; ++i) t->add_ids(i + 1);
    }
    req.set_yes_token(-1);
    req.set_no_token(-1);
    v1::ScoreResponse resp;
    ASSERT_TRUE(stub_->Score(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.scores_size(), 2);
    EXPECT_EQ(resp.scores(0), 3.0f);
    EXPECT_EQ(resp.scores(1), 7.0f);
  }
  {
    grpc::ClientContext ctx;
    v1::LoadResponse load;
    ASSERT_TRUE(stub_->Load(&ctx, v1::LoadRequest(), &load).ok());
    EXPECT_TRUE(load.worker_ready());
    EXPECT_EQ(load.queued_tokens(), 0u);
    EXPECT_EQ(load.model(), "fake");
  }
  {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, v1::GenerateRequest());
    v1::GenerateChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
}

TEST_F(TulipGrpc, BadInputIsInvalidArgumentAndUnknownModelNotFound) {
  startTulip();
  struct Case {
    v1::EmbedRequest req;
    grpc::StatusCode code;
    std::string needle;
  };
  std::vector<Case> cases;
  cases.push_back({embedReq({}), grpc::StatusCode::INVALID_ARGUMENT, "at least one"});
  cases.push_back({embedReq({{1}, {}}), grpc::StatusCode::INVALID_ARGUMENT, "inputs[1]"});
  cases.push_back({embedReq({std::vector<int32_t>(65, 1)}), grpc::StatusCode::INVALID_ARGUMENT,
                   "65 tokens"});
  cases.push_back({embedReq({{1, 5000}}), grpc::StatusCode::INVALID_ARGUMENT, "token id 5000"});
  auto dims = embedReq({{1}});
  dims.set_dimensions(9);
  cases.push_back({dims, grpc::StatusCode::INVALID_ARGUMENT, "dimensions"});
  auto model = embedReq({{1}});
  model.set_model("other");
  cases.push_back({model, grpc::StatusCode::NOT_FOUND, "other"});
  for (auto& c : cases) {
    grpc::ClientContext ctx;
    v1::EmbedResponse resp;
    auto st = stub_->Embed(&ctx, c.req, &resp);
    EXPECT_EQ(st.error_code(), c.code) << st.error_message();
    EXPECT_NE(st.error_message().find(c.needle), std::string::npos) << st.error_message();
  }
}

TEST_F(TulipGrpc, DeadlineExpiresInQueueAndQueueLimitRejects) {
  // Each batch takes 1 s, one in flight at a time, small queue.
  startTulip({"--rose-arg=--delay-ms", "--rose-arg=1000", "--depth", "1",
              "--queue-limit-tokens", "8"});
  // Occupy the worker.
  auto busy = std::async(std::launch::async, [&] {
    grpc::ClientContext ctx;
    v1::EmbedResponse resp;
    return stub_->Embed(&ctx, embedReq({{1, 2}}), &resp).error_code();
  });
  // It is on the worker before the next one is sent (a fixed 50 ms raced a loaded machine).
  ASSERT_TRUE(testing::eventually(30s, [&] { return inflightTokens() == 2; })) << tulip_->log();
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 100ms);
    v1::EmbedResponse resp;
    auto st = stub_->Embed(&ctx, embedReq({{3, 4}}), &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  {
    grpc::ClientContext ctx;
    v1::EmbedResponse resp;
    auto st = stub_->Embed(&ctx, embedReq({std::vector<int32_t>(9, 1)}), &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
    EXPECT_NE(st.error_message().find("limit 8"), std::string::npos);
  }
  EXPECT_EQ(busy.get(), grpc::StatusCode::OK);
  // The expired request never reached the worker: after the first batch, Load shows nothing left
  // (had it reached the worker, it would hold it for 1 s more).
  std::this_thread::sleep_for(400ms);
  grpc::ClientContext ctx;
  v1::LoadResponse load;
  ASSERT_TRUE(stub_->Load(&ctx, v1::LoadRequest(), &load).ok());
  EXPECT_EQ(load.queued_tokens(), 0u);
  EXPECT_EQ(load.inflight_tokens(), 0u);
}

// A second tulip on a port the first one serves cannot listen (exit 1, "cannot listen"): gRPC's
// default SO_REUSEPORT would let both bind and split the new connections between them.
TEST_F(TulipGrpc, ASecondTulipOnTheSamePortFailsToListen) {
  startTulip();
  testing::TempDir other;
  testing::Process second({testing::binary("services/tulip/tulip"), "--host", "127.0.0.1", "--port",
                           std::to_string(port_), "--metrics-port", "0", "--model", dir_.path(),
                           "--rose-bin", testing::binary("tests/fakes/fake-rose"), "--shm-name",
                           "/garden-tg2-" + std::to_string(getpid()) + "-" + std::to_string(port_)},
                          other.path() + "/tulip2.log");
  ASSERT_TRUE(testing::eventually(30s, [&] { return !second.alive(); }))
      << "the second tulip kept running\n" << second.log();
  const int st = second.signal(SIGTERM);  // reaped already: its exit status
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << st << "\n" << second.log();
  EXPECT_NE(second.log().find("cannot listen"), std::string::npos) << second.log();
  // The first one still answers.
  EXPECT_GE(inflightTokens(), 0) << tulip_->log();
}

TEST_F(TulipGrpc, CancelledCallIsDroppedAndSigtermDrains) {
  startTulip({"--rose-arg=--delay-ms", "--rose-arg=1000", "--depth", "1"});
  auto first = std::async(std::launch::async, [&] {
    grpc::ClientContext ctx;
    v1::EmbedResponse resp;
    return stub_->Embed(&ctx, embedReq({{1}}), &resp).error_code();
  });
  // `first` is on the worker (1 s) before the rest happens: SIGTERM below must find it in
  // flight, not still on its way (fixed 50 ms sleeps raced a loaded machine).
  ASSERT_TRUE(testing::eventually(30s, [&] { return inflightTokens() == 1; })) << tulip_->log();
  grpc::ClientContext cancel_ctx;
  auto cancelled = std::async(std::launch::async, [&] {
    v1::EmbedResponse resp;
    return stub_->Embed(&cancel_ctx, embedReq({{2}}), &resp).error_code();
  });
  // Cancelled while it waits in tulip's queue behind `first`.
  ASSERT_TRUE(testing::eventually(30s, [&] { return queuedTokens() == 1; })) << tulip_->log();
  cancel_ctx.TryCancel();
  EXPECT_EQ(cancelled.get(), grpc::StatusCode::CANCELLED);
  // SIGTERM while `first` is in flight: it still completes, then tulip exits 0.
  std::this_thread::sleep_for(20ms);
  kill(tulip_->pid(), SIGTERM);
  EXPECT_EQ(first.get(), grpc::StatusCode::OK);
  int st = tulip_->signal(SIGTERM, 10s);
  ASSERT_NE(st, -1) << "tulip did not exit";
  EXPECT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 0);
  EXPECT_NE(tulip_->log().find("\"msg\":\"stopped\""), std::string::npos) << tulip_->log();
}

}  // namespace
}  // namespace garden
