// The gRPC TulipClient::generate against an in-process garden.v1.Tulip server that streams
// GenerateChunks: the request on the wire, chunks in order with finish reasons and counts, error
// mapping, and cancel() reaching the server.

#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>

#include "garden/v1/garden.grpc.pb.h"
#include "services/ivy/balance/tulip_client.h"

namespace garden::ivy {
namespace {

// gRPC 1.51's shared callback completion queue must outlive every channel of the process (see
// tests/unit/ivy/balance/tulip_client_test.cc): one client that made a callback call is kept.
class GrpcOnce : public ::testing::Environment {
 public:
  void SetUp() override {
    grpc_init();
    static TulipClient* keep = makeGrpcTulipClient("127.0.0.1:1").release();
    std::promise<Status> p;
    keep->health(std::chrono::milliseconds(200), [&p](Status s) { p.set_value(std::move(s)); });
    p.get_future().wait();
  }
};
const auto* const kGrpcOnce = ::testing::AddGlobalTestEnvironment(new GrpcOnce);

class StreamingTulip final : public v1::Tulip::Service {
 public:
  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateChunk>* writer) override {
    grpc::Status scripted;
    bool stream_forever;
    {
      std::lock_guard<std::mutex> lock(mu);
      scripted = status;
      stream_forever = endless;
      last = *req;
      auto md = ctx->client_metadata().find("x-request-id");
      request_id = md == ctx->client_metadata().end()
                       ? ""
                       : std::string(md->second.data(), md->second.size());
    }
    if (!scripted.ok()) return scripted;
    if (stream_forever) {
      for (int i = 0; i < 2000 && !ctx->IsCancelled(); ++i) {
        v1::GenerateChunk c;
        c.add_token_ids(i);
        if (!writer->Write(c)) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      saw_cancel = ctx->IsCancelled();
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
    v1::GenerateChunk a;
    a.add_token_ids(5);
    a.add_token_ids(6);
    writer->Write(a);
    v1::GenerateChunk b;
    b.add_token_ids(7);
    b.set_finish_reason(v1::FINISH_LENGTH);
    b.set_prompt_tokens(3);
    b.set_cached_prompt_tokens(2);
    b.set_completion_tokens(3);
    b.mutable_timings()->set_queue_us(10);
    b.mutable_timings()->set_total_us(99);
    writer->Write(b);
    return grpc::Status::OK;
  }

  // Written by the test thread, read on gRPC's handler threads: gRPC orders a call after the test
  // set these up, but through synchronization ThreadSanitizer cannot see, so they take `mu`.
  std::mutex mu;
  v1::GenerateRequest last;
  std::string request_id;
  grpc::Status status = grpc::Status::OK;  // guarded by mu
  bool endless = false;                    // guarded by mu
  std::atomic<bool> saw_cancel{false};
};

class GenerateGrpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&tulip_);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    client_ = makeGrpcTulipClient("127.0.0.1:" + std::to_string(port_));
  }
  void TearDown() override {
    client_.reset();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  struct Outcome {
    std::vector<GenerateChunkMsg> chunks;
    Status status;
  };
  // Starts a stream; `on_first` runs (with the handle) after the first chunk.
  Outcome run(GenerateCall call, std::function<void(GenerateStream*)> on_first = nullptr) {
    auto out = std::make_shared<Outcome>();
    auto done = std::make_shared<std::promise<void>>();
    auto handle = std::make_shared<std::shared_ptr<GenerateStream>>();
    auto mu = std::make_shared<std::mutex>();
    auto h = client_->generate(
        std::move(call),
        [out, on_first, handle, mu](GenerateChunkMsg m) {
          out->chunks.push_back(std::move(m));
          if (out->chunks.size() == 1 && on_first) {
            std::shared_ptr<GenerateStream> s;
            while (!s) {
              std::lock_guard<std::mutex> lock(*mu);
              s = *handle;
            }
            on_first(s.get());
          }
        },
        [out, done](Status s) {
          out->status = std::move(s);
          done->set_value();
        });
    {
      std::lock_guard<std::mutex> lock(*mu);
      *handle = h;
    }
    EXPECT_NE(h, nullptr);
    EXPECT_EQ(done->get_future().wait_for(std::chrono::seconds(15)), std::future_status::ready);
    return *out;
  }

  int port_ = 0;
  StreamingTulip tulip_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<TulipClient> client_;
};

GenerateCall sampleCall() {
  GenerateCall c;
  c.request_id = "rid-gen";
  c.model = "gpt-oss-tiny";
  c.prompt_ids = {1, 2, 3};
  c.max_tokens = 3;
  c.temperature = 0.7f;
  c.top_p = 0.9f;
  c.top_k = 50;
  c.has_seed = true;
  c.seed = 1234;
  c.stop_token_ids = {200002, 200012};
  c.ignore_eos = true;
  c.timeout = std::chrono::milliseconds(10000);
  return c;
}

TEST_F(GenerateGrpcTest, RequestAndChunksRoundTrip) {
  Outcome o = run(sampleCall());
  ASSERT_TRUE(o.status.isOk()) << o.status.toString();
  ASSERT_EQ(o.chunks.size(), 2u);
  EXPECT_EQ(o.chunks[0].token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(o.chunks[0].finish, FinishReason::kNone);
  EXPECT_EQ(o.chunks[1].token_ids, (std::vector<int32_t>{7}));
  EXPECT_EQ(o.chunks[1].finish, FinishReason::kLength);
  EXPECT_EQ(o.chunks[1].prompt_tokens, 3u);
  EXPECT_EQ(o.chunks[1].cached_prompt_tokens, 2u);
  EXPECT_EQ(o.chunks[1].completion_tokens, 3u);
  EXPECT_EQ(o.chunks[1].queue_us, 10u);
  EXPECT_EQ(o.chunks[1].total_us, 99u);

  std::lock_guard<std::mutex> lock(tulip_.mu);
  const v1::GenerateRequest& r = tulip_.last;
  EXPECT_EQ(tulip_.request_id, "rid-gen");
  EXPECT_EQ(r.model(), "gpt-oss-tiny");
  EXPECT_EQ(std::vector<int32_t>(r.prompt_ids().begin(), r.prompt_ids().end()),
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens(), 3u);
  EXPECT_FLOAT_EQ(r.sampling().temperature(), 0.7f);
  EXPECT_FLOAT_EQ(r.sampling().top_p(), 0.9f);
  EXPECT_EQ(r.sampling().top_k(), 50);
  EXPECT_TRUE(r.sampling().has_seed());
  EXPECT_EQ(r.sampling().seed(), 1234u);
  EXPECT_EQ(std::vector<int32_t>(r.stop_token_ids().begin(), r.stop_token_ids().end()),
            (std::vector<int32_t>{200002, 200012}));
  EXPECT_TRUE(r.ignore_eos());
}

TEST_F(GenerateGrpcTest, ErrorsMapToStatus) {
  {
    std::lock_guard<std::mutex> lock(tulip_.mu);
    tulip_.status = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full");
  }
  Outcome o = run(sampleCall());
  EXPECT_TRUE(o.chunks.empty());
  EXPECT_EQ(o.status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(o.status.message().find("queue full"), std::string::npos);
}

TEST_F(GenerateGrpcTest, CancelMidStreamReachesTheServer) {
  {
    std::lock_guard<std::mutex> lock(tulip_.mu);
    tulip_.endless = true;
  }
  Outcome o = run(sampleCall(), [](GenerateStream* s) {
    s->cancel();
    s->cancel();  // idempotent
  });
  EXPECT_EQ(o.status.code(), StatusCode::kCancelled) << o.status.toString();
  EXPECT_LT(o.chunks.size(), 2000u);
  // The server handler notices the cancellation (it polls IsCancelled between writes).
  for (int i = 0; i < 500 && !tulip_.saw_cancel.load(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(tulip_.saw_cancel.load());
}

TEST_F(GenerateGrpcTest, UnreachableIsUnavailable) {
  auto client = makeGrpcTulipClient("127.0.0.1:1");
  std::promise<Status> p;
  auto h = client->generate(
      sampleCall(), [](GenerateChunkMsg) {}, [&p](Status s) { p.set_value(std::move(s)); });
  auto f = p.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(15)), std::future_status::ready);
  EXPECT_EQ(f.get().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace garden::ivy
