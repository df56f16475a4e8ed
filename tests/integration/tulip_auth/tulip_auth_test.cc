// No back door through tulip (issue 14, part 4) [TAG_TULIP_TOKEN]. The real tulip binary, with
// fake-rose behind it and --auth-token-file, is called raw over gRPC:
//   * every method of garden.v1.Tulip (taken from the service descriptor, so a method added later
//     is covered too) without a token, with a malformed one and with a wrong one: UNAUTHENTICATED,
//     and nothing reaches the worker; grpc.health.v1 answers without a token;
//   * with the token: served; a token added to the file is accepted after SIGHUP, one removed is
//     refused;
// and ivy in front of it: with the right --tulip-token-file it serves; with a wrong one /ready and
// the API answer 503 (never a 200 and never a 500), and ivy's log names the token flags. And the
// safe default: tulip (gRPC and metrics) and ivy (API and admin ports) started without --host
// listen on 127.0.0.1 only, as the kernel's socket table shows.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>

#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "garden/v1/garden.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/support/harness.h"

namespace garden {
namespace {

// The local addresses, as /proc/net/tcp and /proc/net/tcp6 print them (hex), of the sockets in
// this network namespace that listen on TCP `port`.
std::vector<std::string> listeningAddresses(int port) {
  char want[8];
  std::snprintf(want, sizeof want, "%04X", port);
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const size_t colon = local.rfind(':');
      if (state == "0A" && colon != std::string::npos && local.substr(colon + 1) == want)
        out.push_back(local.substr(0, colon));  // 0A: TCP_LISTEN
    }
  }
  return out;
}

using namespace std::chrono_literals;
namespace v1 = garden::v1;

class TulipAuth : public ::testing::Test {
 protected:
  void SetUp() override {
    token_file_ = dir_.path() + "/tulip-tokens";
    std::ofstream(token_file_) << "# tulip's tokens\ntok-right\n";
    port_ = testing::freePort();
    metrics_port_ = testing::freePort();
    std::vector<std::string> argv = testing::tulipArgv(port_, metrics_port_, dir_.path(),
                                                       "tests/fakes/fake-rose", "auth");
    argv.insert(argv.end(), {"--auth-token-file", token_file_, "--served-model-name", "tiny"});
    tulip_ = std::make_unique<testing::Process>(argv, dir_.path() + "/tulip.log");
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Tulip::NewStub(channel_);
    ASSERT_TRUE(testing::eventually(30s, [&] { return healthServing(); }))
        << "tulip never became healthy\n"
        << tulip_->log();
  }

  // grpc.health.v1 without any token.
  bool healthServing() {
    auto health = grpc::health::v1::Health::NewStub(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 2s);
    grpc::health::v1::HealthCheckRequest req;
    req.set_service("garden.v1.Tulip");
    grpc::health::v1::HealthCheckResponse resp;
    return health->Check(&ctx, req, &resp).ok() &&
           resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  }

  // A raw unary call of `method` ("/garden.v1.Tulip/Embed") with an empty request message and,
  // unless empty, `authorization` as metadata.
  grpc::Status rawCall(const std::string& method, const std::string& authorization) {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    grpc::Slice empty_message(std::string{});  // an empty protobuf message: zero bytes
    grpc::ByteBuffer request(&empty_message, 1), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                      [&done](grpc::Status s) { done.set_value(std::move(s)); });
    return done.get_future().get();
  }

  grpc::Status embed(const std::string& authorization, v1::EmbedResponse* resp = nullptr) {
    v1::EmbedRequest req;
    auto* ids = req.add_inputs();
    for (int32_t k = 1; k <= 3; ++k) ids->add_ids(k);
    v1::EmbedResponse local;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    return stub_->Embed(&ctx, req, resp != nullptr ? resp : &local);
  }

  std::string tulipMetrics() { return testing::http(metrics_port_, "GET", "/metrics").body; }

  std::unique_ptr<testing::Process> startIvy(const std::string& token, int* port) {
    const std::string file = dir_.path() + "/ivy-token-" + std::to_string(++ivys_);
    std::ofstream(file) << token << "\n";
    *port = testing::freePort();
    return std::make_unique<testing::Process>(
        std::vector<std::string>{testing::binary("services/ivy/ivy"), "--host", "127.0.0.1",
                                 "--port", std::to_string(*port), "--tulip",
                                 "127.0.0.1:" + std::to_string(port_), "--threads", "1",
                                 "--tulip-token-file", file},
        dir_.path() + "/ivy" + std::to_string(ivys_) + ".log");
  }

  testing::TempDir dir_;
  std::string token_file_;
  int port_ = 0, metrics_port_ = 0, ivys_ = 0;
  std::unique_ptr<testing::Process> tulip_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Tulip::Stub> stub_;
};

TEST_F(TulipAuth, EveryTulipMethodRefusesACallWithoutTheToken) {
  const double ok_batches_before =
      testing::metricValue(tulipMetrics(), R"(tulip_batches_total{outcome="ok"})");
  const auto* service = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      v1::Tulip::service_full_name());
  ASSERT_NE(service, nullptr);
  ASSERT_GE(service->method_count(), 5);
  int refused = 0;
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string method = "/garden.v1.Tulip/" + service->method(i)->name();
    for (const std::string& auth :
         {std::string(), std::string("Basic dG9rLXJpZ2h0"), std::string("Bearer tok-wrong"),
          std::string("Bearer tok-righ"), std::string("Bearer tok-right-and-more")}) {
      const grpc::Status st = rawCall(method, auth);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method << " with '" << auth << "': " << st.error_message();
      ++refused;
    }
  }
  EXPECT_EQ(embed("").error_message(), "missing token: send `authorization: Bearer <token>`");
  EXPECT_EQ(embed("Bearer nope").error_message(), "invalid token");
  refused += 2;
  // Nothing reached the worker, and the refusals are counted.
  const std::string m = tulipMetrics();
  EXPECT_EQ(testing::metricValue(m, R"(tulip_batches_total{outcome="ok"})"), ok_batches_before);
  EXPECT_EQ(testing::metricValue(m, "tulip_unauthenticated_total"), refused);
  // The health service is open (Kubernetes probes send no metadata) and says only SERVING.
  EXPECT_TRUE(healthServing());
}

// [TAG_STOP_CHOICE] StopChoice is behind the token like every method (the loop above covers it
// by name; here with a real request): refused without it, answered with it (no such call here).
TEST_F(TulipAuth, StopChoiceNeedsTheToken) {
  auto stop = [&](const std::string& authorization) {
    v1::StopChoiceRequest req;
    req.set_call_id(0x1234567890abcdefULL);
    req.set_index(1);
    v1::StopChoiceResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    return stub_->StopChoice(&ctx, req, &resp);
  };
  EXPECT_EQ(stop("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stop("Bearer tok-wrong").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const grpc::Status st = stop("Bearer tok-right");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  EXPECT_TRUE(tulip_->alive());
}

TEST_F(TulipAuth, TheTokenIsServedAndTheFileIsReloadedOnSighup) {
  v1::EmbedResponse resp;
  grpc::Status st = embed("Bearer tok-right", &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.embeddings_size(), 1);
  EXPECT_EQ(resp.dim(), 4u);
  EXPECT_TRUE(embed("bearer tok-right").ok());  // the scheme is case-insensitive
  // Rotation: the new token is added, tulip told (SIGHUP); both work. Then the old one goes.
  std::ofstream(token_file_, std::ios::trunc) << "tok-next\ntok-right\n";
  tulip_->signal(SIGHUP);
  EXPECT_TRUE(testing::eventually(30s, [&] { return embed("Bearer tok-next").ok(); }))
      << tulip_->log();
  EXPECT_TRUE(embed("Bearer tok-right").ok());
  std::ofstream(token_file_, std::ios::trunc) << "tok-next\n";
  tulip_->signal(SIGHUP);
  EXPECT_TRUE(testing::eventually(30s, [&] {
    return embed("Bearer tok-right").error_code() == grpc::StatusCode::UNAUTHENTICATED;
  })) << tulip_->log();
  EXPECT_TRUE(embed("Bearer tok-next").ok());
  // A broken file (no token) keeps the tokens tulip has: no lock-out, no open door.
  std::ofstream(token_file_, std::ios::trunc) << "# emptied by mistake\n";
  tulip_->signal(SIGHUP);
  EXPECT_TRUE(testing::eventually(30s, [&] {
    return tulip_->log().find("token file not reloaded") != std::string::npos;
  })) << tulip_->log();
  EXPECT_TRUE(embed("Bearer tok-next").ok());
  EXPECT_EQ(embed("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(tulip_->alive());
}

TEST_F(TulipAuth, IvyWithTheRightTokenServesAndWithAWrongOneAnswers503) {
  int good_port = 0, bad_port = 0;
  auto good = startIvy("tok-right", &good_port);
  auto bad = startIvy("tok-stale", &bad_port);
  ASSERT_TRUE(testing::waitForHttp(good_port, "/ready", 200, 60s)) << good->log();
  const std::string body = R"({"model":"tiny","input":[[1,2,3],[4,5]]})";
  const std::map<std::string, std::string> json = {{"Content-Type", "application/json"}};
  auto ok = testing::http(good_port, "POST", "/v1/embeddings", body, json);
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_NE(ok.body.find("\"embedding\":["), std::string::npos) << ok.body;

  // The wrong token: ivy's probe of tulip (ModelInfo) is refused, so ivy never becomes ready and
  // answers 503 with Retry-After; its log says why.
  EXPECT_TRUE(testing::eventually(30s, [&] {
    return bad->log().find("tulip refused ivy's token: check --tulip-token-file") !=
           std::string::npos;
  })) << bad->log();
  auto not_ready = testing::http(bad_port, "GET", "/ready");
  EXPECT_EQ(not_ready.status, 503) << not_ready.body;
  auto refused = testing::http(bad_port, "POST", "/v1/embeddings", body, json);
  EXPECT_EQ(refused.status, 503) << refused.body;
  // The answer says why, not only the log: the probe's refusal names both flags.
  EXPECT_NE(refused.body.find("tulip refused ivy's credentials"), std::string::npos)
      << refused.body;
  EXPECT_NE(refused.body.find("--tulip-token-file"), std::string::npos) << refused.body;
  std::printf("ivy with a wrong token: %d %s\n", refused.status, refused.body.c_str());
  EXPECT_FALSE(refused.headers["retry-after"].empty());
  EXPECT_TRUE(bad->alive());

  // tulip learns ivy's token (rotation): the same ivy recovers without a restart.
  std::ofstream(token_file_, std::ios::trunc) << "tok-right\ntok-stale\n";
  tulip_->signal(SIGHUP);
  EXPECT_TRUE(testing::waitForHttp(bad_port, "/ready", 200, 60s)) << bad->log();
  auto recovered = testing::http(bad_port, "POST", "/v1/embeddings", body, json);
  EXPECT_EQ(recovered.status, 200) << recovered.body;
}

// [TAG_TULIP_TOKEN] The safe thing is the default: without --host, tulip's gRPC and metrics ports
// and ivy's API and admin ports listen on 127.0.0.1 only (the manifests pass 0.0.0.0 themselves:
// tests/deploy). Read from the kernel's socket table, so a default that changes to every
// interface (0.0.0.0 or ::) fails here whatever the flags' help says.
TEST_F(TulipAuth, WithoutHostEveryListenerIsOnLoopbackOnly) {
  const int port = testing::freePort(), metrics_port = testing::freePort();
  std::vector<std::string> argv = testing::tulipArgv(port, metrics_port, dir_.path(),
                                                     "tests/fakes/fake-rose", "auth-default");
  const auto host = std::find(argv.begin(), argv.end(), "--host");
  ASSERT_NE(host, argv.end());
  argv.erase(host, host + 2);
  argv.insert(argv.end(), {"--auth-token-file", token_file_});
  testing::Process tulip(argv, dir_.path() + "/tulip-default.log");
  const std::string file = dir_.path() + "/ivy-token-default";
  std::ofstream(file) << "tok-right\n";
  const int ivy_port = testing::freePort(), admin_port = testing::freePort();
  testing::Process ivy({testing::binary("services/ivy/ivy"), "--port", std::to_string(ivy_port),
                        "--admin-port", std::to_string(admin_port), "--tulip",
                        "127.0.0.1:" + std::to_string(port), "--threads", "1",
                        "--tulip-token-file", file},
                       dir_.path() + "/ivy-default.log");
  // 127.0.0.1 as /proc/net/tcp prints it, and as tcp6 prints it v4-mapped (::ffff:127.0.0.1:
  // gRPC listens on an IPv6 socket for an IPv4 address).
  char v4[16];
  std::snprintf(v4, sizeof v4, "%08X", htonl(INADDR_LOOPBACK));
  const std::string loopback = v4, loopback_mapped = "0000000000000000FFFF0000" + loopback;
  for (const auto& [name, p] : std::vector<std::pair<std::string, int>>{
           {"tulip --port", port},
           {"tulip --metrics-port", metrics_port},
           {"ivy --port", ivy_port},
           {"ivy --admin-port", admin_port}}) {
    std::vector<std::string> addrs;
    EXPECT_TRUE(testing::eventually(60s, [&] {
      addrs = listeningAddresses(p);
      return !addrs.empty();
    })) << name << " never listened\n"
        << tulip.log() << ivy.log();
    for (const std::string& a : addrs)
      EXPECT_TRUE(a == loopback || a == loopback_mapped) << name << " listens on " << a;
  }
  // And it serves there: ivy (its probes on the admin port) ready through the default-bound tulip.
  EXPECT_TRUE(testing::waitForHttp(admin_port, "/ready", 200, 60s)) << ivy.log() << tulip.log();
}

}  // namespace
}  // namespace garden
