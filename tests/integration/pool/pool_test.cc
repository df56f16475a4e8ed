// ivy's replica pool in front of three real tulip + rose pairs on loopback, serving the tiny
// rose-mkmodel model on CPU. The tests share one mesh and run in order; later ones break it:
//   Spread            concurrent requests spread over equal replicas (tulip metrics: no replica
//                     gets more than 60% of the requests or of the tokens);
//   SplitEqualsDirect a 1000-input request is split, fanned out and reassembled in order, equal
//                     to the same inputs sent unsplit straight to one tulip over gRPC;
//   SmallRequestsLoop 4 clients loop small /v1/embeddings (the load under which issue 14.1 saw
//                     ivy abort on `CHECK failed: chosen != nullptr`): every request is 200 and
//                     ivy is still up. A soak, not the reproduction: the race window is
//                     nanoseconds wide, and with the old pick() this did not abort here in
//                     runs of 1,600 and 10,000 requests; unit_ivy_balance's
//                     ConcurrentCallsWhileReplicasChurnCompleteExactlyOnce is what catches it;
//   Overload          small tulip queues: 429 (every replica RESOURCE_EXHAUSTED) with
//                     Retry-After, while the accepted requests finish;
//   KillDuringStream  kill -9 one rose and one tulip under a stream of requests: every request
//                     answers 200 (retried) or a clear 503 within its deadline, none hangs;
//   SigtermDrains     SIGTERM to ivy with requests in flight: they finish, ivy exits 0.
#include <gtest/gtest.h>
#include <signal.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <future>
#include <mutex>
#include <regex>
#include <thread>

#include "services/ivy/balance/tulip_client.h"
#include "tests/integration/support/harness.h"

namespace garden {
namespace {

using namespace std::chrono_literals;
using testing::http;
using testing::HttpResponse;

constexpr int kReplicas = 3;
// Per tulip: a small queue and one 1024-token batch in flight, so Overload can fill them all.
constexpr int kQueueLimitTokens = 4000;
constexpr int kRequestTimeoutMs = 15000;

struct Mesh {
  testing::TempDir dir;
  std::string model;
  std::vector<int> grpc_ports, metrics_ports;
  std::vector<std::unique_ptr<testing::Process>> tulips;
  std::unique_ptr<testing::Process> ivy;
  int ivy_port = 0;

  void start() {
    model = dir.path() + "/model";
    // A small corpus keeps the tokenizer training short; requests here are token ids anyway.
    ASSERT_EQ(testing::run({testing::binary("services/rose/rose-mkmodel"), "--out", model, "--repo",
                            testing::sourceDir() + "/docs", "--vocab-size", "500"},
                           dir.path() + "/mkmodel.log"),
              0)
        << "rose-mkmodel failed";
    for (int i = 0; i < kReplicas; ++i) {
      grpc_ports.push_back(testing::freePort());
      metrics_ports.push_back(testing::freePort());
      tulips.push_back(std::make_unique<testing::Process>(
          std::vector<std::string>{
              testing::binary("services/tulip/tulip"),
              "--host",
              "127.0.0.1",
              "--port",
              std::to_string(grpc_ports[i]),
              "--metrics-port",
              std::to_string(metrics_ports[i]),
              "--model",
              model,
              "--rose-bin",
              testing::binary("services/rose/rose"),
              "--shm-name",
              "/garden-pool-" + std::to_string(getpid()) + "-" + std::to_string(i),
              "--served-model-name",
              "tiny",
              "--rose-threads",
              "1",
              "--queue-limit-tokens",
              std::to_string(kQueueLimitTokens),
              "--depth",
              "1",
              "--max-batch-tokens",
              "1024",
              "--heartbeat-timeout-ms",
              "30000"},  // Overload pauses the roses for a moment
          dir.path() + "/tulip" + std::to_string(i) + ".log"));
    }
    std::string targets;
    for (int p : grpc_ports)
      targets += (targets.empty() ? "" : ",") + ("127.0.0.1:" + std::to_string(p));
    ivy_port = testing::freePort();
    ivy = std::make_unique<testing::Process>(
        std::vector<std::string>{testing::binary("services/ivy/ivy"), "--host", "127.0.0.1",
                                 "--port", std::to_string(ivy_port), "--tulip", targets,
                                 "--threads", "2", "--split-max-inputs", "100",
                                 "--split-max-tokens", "2048", "--request-timeout-ms",
                                 std::to_string(kRequestTimeoutMs), "--tulip-health-interval-ms",
                                 "200", "--tulip-load-interval-ms", "100"},
        dir.path() + "/ivy.log");
    ASSERT_TRUE(testing::waitForHttp(ivy_port, "/ready", 200, 60s)) << "not ready\n" << logs();
    ASSERT_TRUE(waitHealthy(kReplicas, 60s)) << "replicas not healthy\n" << logs();
  }

  std::string logs() const {
    std::string out;
    for (size_t i = 0; i < tulips.size(); ++i) {
      out += "--- tulip" + std::to_string(i) + " ---\n" + tulips[i]->log();
    }
    if (ivy) out += "--- ivy ---\n" + ivy->log();
    return out;
  }

  std::string ivyMetrics() { return http(ivy_port, "GET", "/metrics").body; }
  std::string tulipMetrics(int i) { return http(metrics_ports[i], "GET", "/metrics").body; }

  bool waitHealthy(int n, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (testing::metricValue(ivyMetrics(), R"(ivy_replicas{state="healthy"})") >= n) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  // Per tulip: successful Embed requests and their tokens.
  struct Served {
    double requests = 0, tokens = 0;
  };
  std::vector<Served> served() {
    std::vector<Served> out;
    for (int i = 0; i < kReplicas; ++i) {
      std::string m = tulipMetrics(i);
      out.push_back({testing::metricValue(m, R"(tulip_requests_total{method="Embed",code="OK"})"),
                     testing::metricValue(m, R"(tulip_prompt_tokens_total{method="Embed"})")});
    }
    return out;
  }
};

// {"model":"tiny","input":[[...],...]} for the given token-id inputs.
std::string body(const std::vector<std::vector<int32_t>>& inputs) {
  std::string b = R"({"model":"tiny","input":[)";
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i) b += ",";
    b += "[";
    for (size_t j = 0; j < inputs[i].size(); ++j) {
      if (j) b += ",";
      b += std::to_string(inputs[i][j]);
    }
    b += "]";
  }
  return b + "]}";
}

// n inputs of `len` ids each, distinct per (seed, i), ids in [3, 499).
std::vector<std::vector<int32_t>> makeInputs(int n, int len, int seed) {
  std::vector<std::vector<int32_t>> out(n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < len; ++j) out[i].push_back(3 + (seed * 131 + i * 17 + j * 7 + i * j) % 496);
  }
  return out;
}

std::vector<std::vector<float>> embeddings(const std::string& json) {
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(json);
  std::vector<std::vector<float>> out;
  for (auto item : doc["data"].get_array()) {
    std::vector<float> v;
    for (auto x : item["embedding"].get_array()) v.push_back(static_cast<float>(double(x)));
    out.push_back(std::move(v));
  }
  return out;
}

std::string errorField(const std::string& json, const char* field) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.parse(json).get(doc)) return "<not json>";
  std::string_view v;
  if (doc["error"][field].get_string().get(v)) return "";
  return std::string(v);
}

class PoolTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    mesh_ = new Mesh();
    mesh_->start();
  }
  static void TearDownTestSuite() {
    delete mesh_;
    mesh_ = nullptr;
  }
  void SetUp() override {
    if (mesh_ == nullptr || mesh_->ivy == nullptr) GTEST_FAIL() << "mesh did not start";
  }
  static Mesh* mesh_;
};

Mesh* PoolTest::mesh_ = nullptr;

TEST_F(PoolTest, Spread) {
  auto before = mesh_->served();
  constexpr int kThreads = 6, kPerThread = 10;
  std::atomic<int> ok{0};
  std::atomic<int64_t> sent_tokens{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &ok, &sent_tokens] {
      for (int k = 0; k < kPerThread; ++k) {
        // Sizes vary (10..59 inputs of 4..11 ids): balancing must look at tokens, not calls.
        auto in = makeInputs(10 + (t * 7 + k * 13) % 50, 4 + (t + k) % 8, t * 100 + k);
        for (const auto& seq : in) sent_tokens += static_cast<int64_t>(seq.size());
        auto r = http(mesh_->ivy_port, "POST", "/v1/embeddings", body(in));
        if (r.status == 200 && embeddings(r.body).size() == in.size()) ++ok;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(ok.load(), kThreads * kPerThread) << mesh_->logs();
  // tulip counts a request just after answering it: wait until the counts cover every request
  // and every token sent (a fixed 200 ms raced a loaded machine).
  std::vector<Mesh::Served> after;
  double req_total = 0, tok_total = 0;
  testing::eventually(30s, [&] {
    after = mesh_->served();
    req_total = tok_total = 0;
    for (int i = 0; i < kReplicas; ++i) {
      req_total += after[i].requests - before[i].requests;
      tok_total += after[i].tokens - before[i].tokens;
    }
    return req_total >= kThreads * kPerThread && tok_total >= sent_tokens.load();
  });
  EXPECT_EQ(req_total, kThreads * kPerThread);
  EXPECT_EQ(tok_total, sent_tokens.load());
  for (int i = 0; i < kReplicas; ++i) {
    const double req = after[i].requests - before[i].requests;
    const double tok = after[i].tokens - before[i].tokens;
    std::printf("replica %d: %.0f requests (%.0f%%), %.0f tokens (%.0f%%)\n", i, req,
                100 * req / req_total, tok, 100 * tok / tok_total);
    EXPECT_GT(req, 0) << "replica " << i << " got nothing";
    EXPECT_LE(req, 0.6 * req_total) << "replica " << i;
    EXPECT_LE(tok, 0.6 * tok_total) << "replica " << i;
  }
  std::string m = mesh_->ivyMetrics();
  EXPECT_NE(m.find("ivy_replica_calls_total{replica=\"127.0.0.1:"), std::string::npos);
  EXPECT_NE(m.find("ivy_replica_outstanding_tokens{replica=\"127.0.0.1:"), std::string::npos);
}

TEST_F(PoolTest, SplitEqualsDirect) {
  auto in = makeInputs(1000, 3, 7);
  for (size_t i = 0; i < in.size(); ++i) in[i].push_back(static_cast<int32_t>(3 + i % 496));
  const std::string before = mesh_->ivyMetrics();
  auto before_served = mesh_->served();
  auto r = http(mesh_->ivy_port, "POST", "/v1/embeddings", body(in));
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 500);
  auto split = embeddings(r.body);
  ASSERT_EQ(split.size(), in.size());
  const std::string after = mesh_->ivyMetrics();
  EXPECT_EQ(testing::metricValue(after, R"(ivy_pool_splits_total{method="Embed"})") -
                testing::metricValue(before, R"(ivy_pool_splits_total{method="Embed"})"),
            1);
  EXPECT_EQ(testing::metricValue(after, R"(ivy_pool_chunks_total{method="Embed"})") -
                testing::metricValue(before, R"(ivy_pool_chunks_total{method="Embed"})"),
            10);  // 1000 inputs, 100 per chunk
  // tulip counts a request just after answering it: wait until all ten chunks are counted.
  std::vector<Mesh::Served> after_served;
  double chunks_served = 0;
  testing::eventually(30s, [&] {
    after_served = mesh_->served();
    chunks_served = 0;
    for (int i = 0; i < kReplicas; ++i)
      chunks_served += after_served[i].requests - before_served[i].requests;
    return chunks_served >= 10;
  });
  EXPECT_EQ(chunks_served, 10);
  int replicas_used = 0;
  for (int i = 0; i < kReplicas; ++i) {
    replicas_used += after_served[i].requests > before_served[i].requests;
  }
  EXPECT_GE(replicas_used, 2) << "the chunks were not fanned out";

  // The same inputs unsplit, straight to one tulip.
  static ivy::TulipClient* direct =
      ivy::makeGrpcTulipClient("127.0.0.1:" + std::to_string(mesh_->grpc_ports[0])).release();
  ivy::EmbedCall call;
  call.model = "tiny";
  call.inputs = in;
  call.timeout = 30s;
  std::promise<Result<ivy::EmbedReply>> p;
  direct->embed(std::move(call),
                [&p](Result<ivy::EmbedReply> res) { p.set_value(std::move(res)); });
  auto f = p.get_future();
  ASSERT_EQ(f.wait_for(60s), std::future_status::ready);
  Result<ivy::EmbedReply> d = f.get();
  ASSERT_TRUE(d.isOk()) << d.status().toString();
  ASSERT_EQ(d->values.size(), in.size() * d->dim);
  double max_err = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(split[i].size(), d->dim) << i;
    for (uint32_t j = 0; j < d->dim; ++j) {
      max_err = std::max(max_err, std::abs(double(split[i][j]) - d->values[i * d->dim + j]));
    }
    ASSERT_LT(max_err, 1e-5) << "input " << i << " differs: order or content";
  }
  std::printf("split vs direct: max abs difference %.3g over %zu x %u values\n", max_err, in.size(),
              d->dim);
}

// [TAG_POOL_PICK_SNAPSHOT] through real HTTP: a fixed number of small requests from 4 clients.
TEST_F(PoolTest, SmallRequestsLoop) {
  constexpr int kClients = 4, kPerClient = 400;
  std::atomic<int> ok{0};
  std::mutex mu;
  std::string first_failure;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([c, &ok, &mu, &first_failure] {
      for (int k = 0; k < kPerClient; ++k) {
        auto r = http(mesh_->ivy_port, "POST", "/v1/embeddings",
                      body(makeInputs(1, 2 + (c + k) % 3, c * 1000 + k)));
        if (r.status == 200) {
          ++ok;
        } else {
          std::lock_guard<std::mutex> lock(mu);
          if (first_failure.empty()) {
            first_failure = std::to_string(r.status) + " " + r.body.substr(0, 300);
          }
          if (r.status == 0) return;  // ivy is gone: the rest would fail the same way
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), kClients * kPerClient) << first_failure << "\n" << mesh_->logs();
  EXPECT_TRUE(mesh_->ivy->alive()) << mesh_->logs();
  EXPECT_EQ(http(mesh_->ivy_port, "GET", "/ready").status, 200);
}

TEST_F(PoolTest, Overload) {
  const auto before = mesh_->served();
  constexpr int kConcurrent = 30;
  // 2000 tokens each (one chunk): 60000 tokens at once against three 4000-token queues. The roses
  // are paused until every request is either refused or held by a tulip, so the queues fill
  // however fast the machine is (unpaused, a slow client on a loaded machine let the roses keep
  // up and nothing was refused).
  std::vector<std::unique_ptr<testing::Paused>> paused;
  for (auto& tulip : mesh_->tulips) {
    const auto roses = testing::childrenOf(tulip->pid());
    ASSERT_EQ(roses.size(), 1u);
    paused.push_back(std::make_unique<testing::Paused>(roses.front()));
    ASSERT_TRUE(paused.back()->stopped());
  }
  std::vector<HttpResponse> out(kConcurrent);
  std::atomic<int> answered{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kConcurrent; ++t) {
    threads.emplace_back([t, &out, &answered] {
      out[t] = http(mesh_->ivy_port, "POST", "/v1/embeddings", body(makeInputs(100, 20, 500 + t)));
      ++answered;
    });
  }
  // Held: tokens queued or on the (paused) worker in each tulip, 2000 per request.
  auto held = [] {
    double tokens = 0;
    for (int i = 0; i < kReplicas; ++i) {
      const std::string m = mesh_->tulipMetrics(i);
      tokens += testing::metricValue(m, "tulip_queue_tokens") +
                testing::metricValue(m, "tulip_inflight_tokens");
    }
    return tokens;
  };
  const bool settled = testing::eventually(
      60s, [&] { return answered.load() + held() / 2000 >= kConcurrent; }, 50ms);
  paused.clear();  // resume the roses
  for (auto& th : threads) th.join();
  ASSERT_TRUE(settled) << answered.load() << " answered, " << held() << " tokens held";
  int ok = 0, limited = 0;
  for (auto& r : out) {
    if (r.status == 200) {
      ++ok;
      EXPECT_EQ(embeddings(r.body).size(), 100u);
    } else {
      ASSERT_EQ(r.status, 429) << r.body;
      ++limited;
      EXPECT_FALSE(r.headers["retry-after"].empty());
      EXPECT_EQ(errorField(r.body, "type"), "rate_limit_error");
      EXPECT_NE(errorField(r.body, "message").find("every tulip replica is at capacity"),
                std::string::npos)
          << r.body;
    }
  }
  std::printf("overload: %d ok, %d x 429\n", ok, limited);
  EXPECT_GE(ok, 1);
  EXPECT_GE(limited, 1);
  double refused = 0;
  for (int i = 0; i < kReplicas; ++i) {
    refused +=
        testing::metricValue(mesh_->tulipMetrics(i),
                             R"(tulip_requests_total{method="Embed",code="RESOURCE_EXHAUSTED"})");
  }
  EXPECT_GE(refused, kReplicas);  // each 429 was refused by every replica
  // The mesh is fine afterwards.
  auto r = http(mesh_->ivy_port, "POST", "/v1/embeddings", body(makeInputs(5, 5, 1)));
  EXPECT_EQ(r.status, 200) << r.body;
  (void)before;
}

TEST_F(PoolTest, KillDuringStream) {
  struct Outcome {
    int status = 0;
    double seconds = 0;
    std::string body;
    std::string retry_after;
  };
  const double retries_before =
      testing::metricValue(mesh_->ivyMetrics(), R"(ivy_pool_retries_total{method="Embed"})");
  std::mutex mu;
  std::vector<Outcome> outcomes;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &mu, &outcomes, &stop] {
      for (int k = 0; !stop.load(); ++k) {
        // 250 inputs: three chunks, so a failure can hit part of a split request.
        auto in = makeInputs(250, 4, t * 1000 + k);
        const auto t0 = std::chrono::steady_clock::now();
        auto r = http(mesh_->ivy_port, "POST", "/v1/embeddings", body(in), {}, 40s);
        Outcome o;
        o.status = r.status;
        o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r.status == 200 && embeddings(r.body).size() != in.size()) o.status = -1;
        if (r.status != 200) o.body = r.body;
        o.retry_after = r.headers["retry-after"];
        std::lock_guard<std::mutex> lock(mu);
        outcomes.push_back(std::move(o));
      }
    });
  }
  // Kill once the stream runs on the replicas about to fail: ivy has a call outstanding on tulip
  // 1 and tulip 0 has served part of the stream (a fixed 1 s raced a loaded machine).
  const double served0 = mesh_->served()[0].requests;
  const std::string outstanding1 =
      "ivy_replica_outstanding_tokens{replica=\"127.0.0.1:" + std::to_string(mesh_->grpc_ports[1]) +
      "\"}";
  const bool flowing = testing::eventually(60s, [&] {
    return mesh_->served()[0].requests > served0 &&
           testing::metricValue(mesh_->ivyMetrics(), outstanding1) > 0;
  });
  auto roses = testing::childrenOf(mesh_->tulips[0]->pid());
  if (flowing && !roses.empty()) {
    ASSERT_EQ(::kill(roses.front(), SIGKILL), 0);
    mesh_->tulips[1]->signal(SIGKILL);
    // The stream goes on for at least 4 s after the kills, and until 8 requests succeeded in all
    // (a slow machine needs longer; a mesh that stops serving fails below after 60 s).
    const auto killed_at = std::chrono::steady_clock::now();
    testing::eventually(
        60s,
        [&] {
          if (std::chrono::steady_clock::now() - killed_at < 4s) return false;
          std::lock_guard<std::mutex> lock(mu);
          return std::count_if(outcomes.begin(), outcomes.end(),
                               [](const Outcome& o) { return o.status == 200; }) >= 8;
        },
        50ms);
  }
  stop = true;
  for (auto& th : threads) th.join();
  ASSERT_TRUE(flowing) << "the stream never reached tulip 0 and tulip 1\n" << mesh_->logs();
  ASSERT_FALSE(roses.empty()) << "tulip 0 has no rose child";

  int ok = 0, unavailable = 0;
  double slowest = 0;
  for (auto& o : outcomes) {
    slowest = std::max(slowest, o.seconds);
    if (o.status == 200) {
      ++ok;
      continue;
    }
    ASSERT_EQ(o.status, 503) << "lost or wrong answer (0 = no answer): " << o.body;
    ++unavailable;
    EXPECT_EQ(errorField(o.body, "type"), "service_unavailable_error") << o.body;
    EXPECT_NE(errorField(o.body, "message").find("tulip"), std::string::npos) << o.body;
    EXPECT_FALSE(o.retry_after.empty());
  }
  const std::string m = mesh_->ivyMetrics();
  const double retries =
      testing::metricValue(m, R"(ivy_pool_retries_total{method="Embed"})") - retries_before;
  double ejections = 0;
  for (int p : mesh_->grpc_ports) {
    ejections += testing::metricValue(
        m, "ivy_pool_ejections_total{replica=\"127.0.0.1:" + std::to_string(p) + "\"}");
  }
  std::printf(
      "kill during stream: %zu requests, %d ok, %d x 503, %.0f retries, %.0f ejections, "
      "slowest %.2f s\n",
      outcomes.size(), ok, unavailable, retries, ejections, slowest);
  EXPECT_GE(ok, 8);
  EXPECT_LT(slowest, kRequestTimeoutMs / 1000.0 + 5);  // nobody waited past the deadline
  EXPECT_GE(ejections, 1);
  EXPECT_GE(retries, 1);  // chunks in flight on the killed replicas went elsewhere
  // tulip 1 is gone for good; tulip 0 restarts its rose and is probed back in.
  EXPECT_TRUE(mesh_->waitHealthy(2, 60s)) << mesh_->logs();
  auto r = http(mesh_->ivy_port, "POST", "/v1/embeddings", body(makeInputs(300, 3, 9)));
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(PoolTest, SigtermDrains) {
  ASSERT_TRUE(mesh_->waitHealthy(2, 60s));
  auto calls = [] {
    std::string m = mesh_->ivyMetrics();
    double n = 0;
    for (int p : mesh_->grpc_ports) {
      n += testing::metricValue(m, "ivy_replica_calls_total{replica=\"127.0.0.1:" +
                                       std::to_string(p) + "\",method=\"Embed\"}");
    }
    return n;
  };
  const double calls_before = calls();
  constexpr int kInFlight = 2;
  // 400 inputs x 8 ids: four chunks each, about half a second of work on two replicas.
  std::vector<std::future<std::pair<HttpResponse, std::chrono::steady_clock::time_point>>> futures;
  for (int t = 0; t < kInFlight; ++t) {
    futures.push_back(std::async(std::launch::async, [t] {
      auto r = http(mesh_->ivy_port, "POST", "/v1/embeddings", body(makeInputs(400, 8, 900 + t)));
      return std::make_pair(r, std::chrono::steady_clock::now());
    }));
  }
  // Every chunk of both requests sent (the pool fans out on arrival): both are in flight.
  const auto limit = std::chrono::steady_clock::now() + 20s;
  while (calls() - calls_before < 4 * kInFlight && std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_GE(calls() - calls_before, 4 * kInFlight) << "the requests never reached the replicas";
  const auto sigterm_at = std::chrono::steady_clock::now();
  ::kill(mesh_->ivy->pid(), SIGTERM);
  int finished_after = 0;
  for (auto& f : futures) {
    auto [r, at] = f.get();
    EXPECT_EQ(r.status, 200) << r.body.substr(0, 300);
    EXPECT_EQ(embeddings(r.body).size(), 400u);
    finished_after += at > sigterm_at;
  }
  EXPECT_GE(finished_after, 1) << "no request was in flight at SIGTERM; the drain was not tested";
  const int st = mesh_->ivy->signal(SIGTERM, 20s);
  ASSERT_NE(st, -1) << "ivy did not exit";
  EXPECT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 0);
}

}  // namespace
}  // namespace garden
