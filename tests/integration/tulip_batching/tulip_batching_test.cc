// Batch formation under concurrency, end to end [TAG_EMBED_INFLIGHT]: tulip (a real process)
// drives fake-rose, whose every batch sleeps 400 ms. Seven requests are sent while fake-rose is
// paused (SIGSTOP) and it resumes only once tulip holds all seven, so they are certainly
// concurrent with the first batch however slow the machine (a fixed window raced a loaded CI).
// With the default cap (2 batches in flight) they take three batches: the first runs, the
// second is staged alone, the other five coalesce into one. With --max-inflight-batches 0 (every
// free slot, the old behaviour) the first four go out one by one. Batches are counted from
// tulip's own metrics. (The staged batch is formed at once here: the replica has run fewer than 3
// batches, so its cost model does not predict yet, and a paused fake-rose would overrun any
// prediction anyway. Forming it late [TAG_EMBED_LATE_STAGE] is tested in
// tests/unit/tulip/sched/embed_scheduler_test.cc, EmbedSchedulerLateStage.)
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "garden/v1/garden.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/support/harness.h"
#include "tests/integration/support/tulip_load.h"

namespace garden {
namespace {

using namespace std::chrono_literals;
namespace v1 = garden::v1;

class TulipBatching : public ::testing::Test {
 protected:
  void startTulip(const std::string& max_inflight) {
    port_ = testing::freePort();
    metrics_port_ = testing::freePort();
    std::vector<std::string> argv =
        testing::tulipArgv(port_, metrics_port_, dir_.path(), "tests/fakes/fake-rose", "tb");
    argv.insert(argv.end(), {"--rose-arg=--step-us",
                             "--rose-arg=400000",  // 400 ms per batch, whatever its size
                             "--max-inflight-batches", max_inflight, "--log-level", "warn",
                             // fake-rose is paused while requests pile up (sevenRequests)
                             "--heartbeat-timeout-ms", "120000"});
    tulip_ = std::make_unique<testing::Process>(argv, dir_.path() + "/tulip.log");
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Tulip::NewStub(channel_);
    auto health = grpc::health::v1::Health::NewStub(channel_);
    auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < 30s) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 500ms);
      grpc::health::v1::HealthCheckRequest req;
      grpc::health::v1::HealthCheckResponse resp;
      if (health->Check(&ctx, req, &resp).ok() &&
          resp.status() == grpc::health::v1::HealthCheckResponse::SERVING)
        return;
      std::this_thread::sleep_for(50ms);
    }
    FAIL() << "tulip never became healthy\n" << tulip_->log();
  }

  // One Embed of a single sequence {base, base+1, base+2}; checks fake-rose's row
  // [sum(ids), len, 0, 1].
  bool embedOne(int32_t base) {
    v1::EmbedRequest req;
    auto* t = req.add_inputs();
    for (int32_t k = 0; k < 3; ++k) t->add_ids(base + k);
    req.set_normalize(false);
    v1::EmbedResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 30s);
    grpc::Status st = stub_->Embed(&ctx, req, &resp);
    if (!st.ok() || resp.embeddings_size() != 1 || resp.dim() != 4) {
      ADD_FAILURE() << "Embed(" << base << "): " << st.error_message();
      return false;
    }
    float row[4];
    std::memcpy(row, resp.embeddings(0).data(), sizeof(row));
    EXPECT_EQ(row[0], 3.0f * base + 3.0f) << base;
    EXPECT_EQ(row[1], 3.0f) << base;
    return true;
  }

  // tulip_batches_total{outcome="ok"} from /metrics.
  int okBatches() {
    auto r = testing::http(metrics_port_, "GET", "/metrics");
    EXPECT_EQ(r.status, 200);
    return static_cast<int>(testing::metricValue(r.body, R"(tulip_batches_total{outcome="ok"})"));
  }

  // tulip's queued + in-flight tokens (its Load RPC), -1 when Load fails.
  int64_t heldTokens() {
    auto l = testing::tulipLoad(*stub_);
    return l ? static_cast<int64_t>(l->queued_tokens() + l->inflight_tokens()) : -1;
  }

  // One request, then six more, all sent while fake-rose is paused; it resumes once tulip holds
  // all seven (3 tokens each), so the first batch is still running when the other six arrive.
  // Returns the batches they took.
  int sevenRequests() {
    const std::vector<pid_t> kids = testing::childrenOf(tulip_->pid());
    EXPECT_EQ(kids.size(), 1u) << "tulip should have one child, fake-rose";
    if (kids.size() != 1) return -1;
    const int before = okBatches();
    testing::Paused paused(kids.front());
    EXPECT_TRUE(paused.stopped());
    auto first = std::async(std::launch::async, [&] { return embedOne(10); });
    // The first request is on the worker before the others are sent (it is dispatched at once).
    EXPECT_TRUE(testing::eventually(30s, [&] { return heldTokens() == 3; })) << heldTokens();
    std::vector<std::future<bool>> rest;
    for (int i = 0; i < 6; ++i)
      rest.push_back(std::async(std::launch::async, [&, i] { return embedOne(100 * (i + 1)); }));
    EXPECT_TRUE(testing::eventually(30s, [&] { return heldTokens() == 21; })) << heldTokens();
    EXPECT_EQ(okBatches(), before);  // nothing ran while paused
    paused.resume();
    EXPECT_TRUE(first.get());
    for (auto& f : rest) EXPECT_TRUE(f.get());
    return okBatches();
  }

  testing::TempDir dir_;
  int port_ = 0, metrics_port_ = 0;
  std::unique_ptr<testing::Process> tulip_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Tulip::Stub> stub_;
};

TEST_F(TulipBatching, OutOfRangeBatchingFlagsAreRefusedByName) {
  const std::string log = dir_.path() + "/flags.log";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--max-inflight-batches=5", "--max-inflight-batches must be 0..--depth (4)"},
      {"--completion-spin-us=-2", "--completion-spin-us must be -1 (auto) or 0..100000"},
      {"--completion-spin-us=100001", "--completion-spin-us must be -1 (auto) or 0..100000"}};
  for (const auto& [flag, message] : cases) {
    std::vector<std::string> argv = testing::tulipArgv(testing::freePort(), testing::freePort(),
                                                       dir_.path(), "tests/fakes/fake-rose", "tbf");
    argv.push_back("--depth");
    argv.push_back("4");
    argv.push_back(flag);
    EXPECT_EQ(testing::run(argv, log), 2) << flag;
  }
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& [flag, message] : cases)
    EXPECT_NE(text.find(message), std::string::npos) << flag;
}

TEST_F(TulipBatching, ConcurrentArrivalsCoalesceBehindTheRunningBatch) {
  startTulip("2");
  ASSERT_EQ(okBatches(), 0);
  // Lone request on an idle worker: one batch of its own.
  ASSERT_TRUE(embedOne(1));
  EXPECT_EQ(okBatches(), 1);
  // Seven (arriving within one 400 ms batch): one running, one staged, five coalesced.
  EXPECT_EQ(sevenRequests() - 1, 3) << tulip_->log();
}

TEST_F(TulipBatching, CapZeroFillsEverySlotOneRequestAtATime) {
  startTulip("0");
  // Depth 4: the first four requests go out as four batches; the three left wait and coalesce.
  EXPECT_EQ(sevenRequests(), 5) << tulip_->log();
}

}  // namespace
}  // namespace garden
