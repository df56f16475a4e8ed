// ReplicaPool over FakeTulipClients with an injected clock and resolver: probing, least-loaded
// picking, splitting and reassembly, retries, ejection and re-probe backoff, DNS add/remove,
// deadline budget, model mismatch, Generate retry rules, metrics.

#include "services/ivy/balance/replica_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <random>
#include <thread>

#include "common/tsan_handoff.h"
#include "tests/fakes/ivy/fake_tulip_client.h"

namespace garden::ivy {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Method = FakeTulipClient::Method;

class FakeClock {
 public:
  std::chrono::steady_clock::time_point now() const {
    return base_ + std::chrono::milliseconds(offset_ms_.load());
  }
  void advance(std::chrono::milliseconds d) { offset_ms_ += d.count(); }

 private:
  const std::chrono::steady_clock::time_point base_ = std::chrono::steady_clock::now();
  std::atomic<int64_t> offset_ms_{0};
};

// A TulipClient that forwards to a fake it shares (PoolTest::keep_fakes_).
class ForwardingClient final : public TulipClient {
 public:
  explicit ForwardingClient(std::shared_ptr<FakeTulipClient> to) : to_(std::move(to)) {}
  void embed(EmbedCall call, EmbedDone done) override { to_->embed(std::move(call), std::move(done)); }
  void score(ScoreCall call, ScoreDone done) override { to_->score(std::move(call), std::move(done)); }
  std::shared_ptr<GenerateStream> generate(GenerateCall call, ChunkFn on_chunk,
                                           StreamDone on_done) override {
    return to_->generate(std::move(call), std::move(on_chunk), std::move(on_done));
  }
  void modelInfo(std::chrono::milliseconds t, ModelInfoDone done) override {
    to_->modelInfo(t, std::move(done));
  }
  void health(std::chrono::milliseconds t, HealthDone done) override {
    to_->health(t, std::move(done));
  }
  void load(std::chrono::milliseconds t, LoadDone done) override { to_->load(t, std::move(done)); }
  std::string endpoint() const override { return to_->endpoint(); }

 private:
  std::shared_ptr<FakeTulipClient> to_;
};

class PoolTest : public ::testing::Test {
 protected:
  ReplicaPoolOptions defaults() {
    ReplicaPoolOptions o;
    o.now = [this] { return clock_.now(); };
    o.split_max_tokens = 0;
    o.split_max_inputs = 0;
    o.probe_backoff_initial = 100ms;
    o.probe_backoff_max = 800ms;
    o.health_interval = 1000ms;
    o.load_interval = 200ms;
    return o;
  }

  // Static replicas "ipv4:10.0.0.<i>:1" for i in 1..n, or DNS names served by dns_.
  void make(std::vector<std::string> entries, ReplicaPoolOptions o) {
    auto eps = parseTulipEndpoints(entries);
    ASSERT_TRUE(eps.isOk()) << eps.status().toString();
    auto factory = [this](const std::string& address) -> std::unique_ptr<TulipClient> {
      auto f = std::make_unique<FakeTulipClient>(address);
      std::lock_guard<std::mutex> lock(mu_);
      fakes_[address] = f.get();
      ++created_;
      if (configure_) configure_(address, f.get());
      if (!keep_fakes_) return f;
      // The pool owns a forwarder; the fake outlives the replica the pool drops (kept_).
      std::shared_ptr<FakeTulipClient> shared = std::move(f);
      kept_.push_back(shared);
      return std::make_unique<ForwardingClient>(std::move(shared));
    };
    auto resolver = [this](const std::string& host, uint16_t) -> Result<std::vector<std::string>> {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = dns_.find(host);
      if (it == dns_.end()) return unavailable("no such name " + host);
      return it->second;
    };
    auto p = ReplicaPool::create(std::move(*eps), std::move(o), factory, resolver, &registry_);
    ASSERT_TRUE(p.isOk()) << p.status().toString();
    pool_ = std::move(p).value();
  }

  void makeStatic(int n, ReplicaPoolOptions o) {
    std::vector<std::string> entries;
    for (int i = 1; i <= n; ++i) entries.push_back(addr(i));
    make(entries, std::move(o));
  }

  static std::string addr(int i) { return "ipv4:10.0.0." + std::to_string(i) + ":1"; }

  FakeTulipClient* fake(int i) { return fake(addr(i)); }
  FakeTulipClient* fake(const std::string& a) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fakes_.find(a);
    return it == fakes_.end() ? nullptr : it->second;
  }

  // One maintenance pass and its probes / polls answered.
  void settle(int passes = 2) {
    for (int i = 0; i < passes; ++i) {
      pool_->maintainOnce();
      ASSERT_TRUE(pool_->waitIdle(30s));
    }
  }

  ReplicaState stateOf(const std::string& a) {
    for (const auto& v : pool_->replicas()) {
      if (v.address == a) return v.state;
    }
    ADD_FAILURE() << "no replica " << a;
    return ReplicaState::kDraining;
  }
  ReplicaPool::ReplicaView viewOf(const std::string& a) {
    for (const auto& v : pool_->replicas()) {
      if (v.address == a) return v;
    }
    ADD_FAILURE() << "no replica " << a;
    return {};
  }

  Result<EmbedReply> embedSync(EmbedCall call) {
    std::promise<Result<EmbedReply>> p;
    auto f = p.get_future();
    pool_->embed(std::move(call), [&p](Result<EmbedReply> r) { p.set_value(std::move(r)); });
    if (f.wait_for(60s) != std::future_status::ready) {
      ADD_FAILURE() << "embed did not finish";
      return internalError("hung");
    }
    return f.get();
  }

  std::future<Result<EmbedReply>> embedAsync(EmbedCall call) {
    auto p = std::make_shared<std::promise<Result<EmbedReply>>>();
    auto f = p->get_future();
    pool_->embed(std::move(call), [p](Result<EmbedReply> r) { p->set_value(std::move(r)); });
    return f;
  }

  static EmbedCall call(std::vector<std::vector<int32_t>> inputs,
                        std::chrono::milliseconds timeout = 0ms) {
    EmbedCall c;
    c.request_id = "rid";
    c.model = "fake-model";
    c.inputs = std::move(inputs);
    c.timeout = timeout;
    return c;
  }

  // n distinct single-or-more-token inputs: input i is {i + 1, ...} of length len(i).
  static std::vector<std::vector<int32_t>> inputs(int n, int len = 1) {
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < n; ++i) out.push_back(std::vector<int32_t>(len, i + 1));
    return out;
  }

  static void expectRowsInOrder(const EmbedReply& r, const std::vector<std::vector<int32_t>>& in) {
    ASSERT_EQ(r.values.size(), in.size() * r.dim);
    for (size_t i = 0; i < in.size(); ++i) {
      std::vector<float> want = fakeEmbedding(in[i], r.dim);
      std::vector<float> got(r.values.begin() + i * r.dim, r.values.begin() + (i + 1) * r.dim);
      ASSERT_EQ(got, want) << "row " << i;
    }
  }

  // Replica 1 becomes the first pick: every other healthy replica reports 1 queued token.
  void preferReplica1(int n) {
    TulipLoad one;
    one.queued_tokens = 1;
    for (int i = 2; i <= n; ++i) fake(i)->setLoad(one);
    clock_.advance(300ms);
    settle(1);
    for (int i = 2; i <= n; ++i) ASSERT_EQ(viewOf(addr(i)).polled_load_tokens, 1u);
  }

  double metric(const std::string& series) {
    std::string text = registry_.expose();
    size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + series.size() + 2));
  }

  FakeClock clock_;
  metrics::Registry registry_;
  std::mutex mu_;
  std::map<std::string, FakeTulipClient*> fakes_;
  std::map<std::string, std::vector<std::string>> dns_;
  std::function<void(const std::string&, FakeTulipClient*)> configure_;
  int created_ = 0;
  // Set before make(): every fake stays alive until the fixture ends, even after the pool dropped
  // its replica, so a test may keep poking fake(i) while DNS changes remove replicas.
  bool keep_fakes_ = false;
  std::vector<std::shared_ptr<FakeTulipClient>> kept_;  // guarded by mu_
  std::unique_ptr<ReplicaPool> pool_;
};

TEST_F(PoolTest, ProbesBeforeUseThenReady) {
  makeStatic(2, defaults());
  EXPECT_FALSE(pool_->ready());
  EXPECT_EQ(pool_->spec(), nullptr);
  auto early = embedSync(call({{1}}));
  ASSERT_FALSE(early.isOk());
  EXPECT_EQ(early.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(early.status().message(), HasSubstr("no healthy tulip replica"));
  EXPECT_EQ(fake(1)->embedCalls().size() + fake(2)->embedCalls().size(), 0u);

  settle();
  EXPECT_TRUE(pool_->ready());
  ASSERT_NE(pool_->spec(), nullptr);
  EXPECT_EQ(pool_->spec()->upstream_name, "fake-model");
  EXPECT_EQ(pool_->spec()->hidden_size, 8u);
  EXPECT_EQ(stateOf(addr(1)), ReplicaState::kHealthy);
  EXPECT_EQ(stateOf(addr(2)), ReplicaState::kHealthy);
  EXPECT_GE(fake(1)->healthCalls(), 1);
  EXPECT_GE(fake(1)->modelInfoCalls(), 1);
  EXPECT_GE(fake(1)->loadCalls(), 1);  // polled once healthy
  EXPECT_EQ(pool_->spec()->served_name, "fake-model");
  EXPECT_EQ(metric(R"(ivy_replicas{state="healthy"})"), 2);
}

TEST_F(PoolTest, ServedModelNameAndPoolAnswersModelInfoAndHealth) {
  auto o = defaults();
  o.served_model_name = "public-name";
  makeStatic(1, o);
  settle();
  EXPECT_EQ(pool_->spec()->served_name, "public-name");
  EXPECT_EQ(pool_->spec()->upstream_name, "fake-model");
  std::promise<Result<TulipModelInfo>> p;
  pool_->modelInfo(1s, [&p](Result<TulipModelInfo> r) { p.set_value(std::move(r)); });
  auto info = p.get_future().get();
  ASSERT_TRUE(info.isOk());
  EXPECT_EQ(info->model, "fake-model");
  std::promise<Status> h;
  pool_->health(1s, [&h](Status s) { h.set_value(s); });
  EXPECT_TRUE(h.get_future().get().isOk());
}

TEST_F(PoolTest, TiesGoRoundRobin) {
  makeStatic(3, defaults());
  settle();
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(embedSync(call({{1, 2}})).isOk());
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(fake(i)->embedCalls().size(), 10u) << i;
}

TEST_F(PoolTest, PicksLeastOutstandingTokens) {
  makeStatic(2, defaults());
  settle();
  fake(1)->setHold(true);
  fake(2)->setHold(true);
  // The first call (10 tokens) lands somewhere; the next three small ones all go to the other
  // replica, whose outstanding load stays below 10.
  auto big = embedAsync(call({std::vector<int32_t>(10, 3)}));
  std::vector<std::future<Result<EmbedReply>>> small;
  for (int i = 0; i < 3; ++i) small.push_back(embedAsync(call({{1, 2}})));
  FakeTulipClient* busy = fake(1)->embedCalls().size() == 1 ? fake(1) : fake(2);
  FakeTulipClient* idle = busy == fake(1) ? fake(2) : fake(1);
  EXPECT_EQ(busy->embedCalls().size(), 1u);
  EXPECT_EQ(busy->embedCalls()[0].inputs[0].size(), 10u);
  EXPECT_EQ(idle->embedCalls().size(), 3u);
  auto views = pool_->replicas();
  int64_t total = 0;
  for (auto& v : views) total += v.outstanding_tokens;
  EXPECT_EQ(total, 16);
  fake(1)->releaseHeld();
  fake(2)->releaseHeld();
  EXPECT_TRUE(big.get().isOk());
  for (auto& f : small) EXPECT_TRUE(f.get().isOk());
  for (auto& v : pool_->replicas()) EXPECT_EQ(v.outstanding_tokens, 0) << v.address;
}

TEST_F(PoolTest, PolledLoadSteersAwayFromABusyReplica) {
  makeStatic(2, defaults());
  TulipLoad busy;
  busy.queued_tokens = 5000;
  busy.inflight_tokens = 1000;
  settle(1);  // probed healthy
  fake(1)->setLoad(busy);
  clock_.advance(300ms);
  settle(1);  // Load polled
  EXPECT_EQ(viewOf(addr(1)).polled_load_tokens, 6000u);
  EXPECT_EQ(metric(R"(ivy_replica_load_tokens{replica="10.0.0.1:1"})"), 6000);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(embedSync(call({{1, 2, 3}})).isOk());
  EXPECT_EQ(fake(1)->embedCalls().size(), 0u);
  EXPECT_EQ(fake(2)->embedCalls().size(), 10u);
}

// [TAG_POOL_OTHERS_LOAD] tulip's Load counts this ivy's own calls, which `outstanding` has
// already: a poll answered while one of our calls was in flight must not keep the replica looking
// busy once the call is back (integration_spread, sequential requests: 3 vs 37).
TEST_F(PoolTest, PolledLoadLessOurOwnCallsIsWhatSteers) {
  makeStatic(2, defaults());
  settle();
  fake(1)->setHold(true);
  fake(2)->setHold(true);
  auto held = embedAsync(call({{1, 2, 3}}));
  const int x = fake(1)->embedCalls().size() == 1 ? 1 : 2;
  ASSERT_EQ(fake(x)->embedCalls().size(), 1u);
  TulipLoad ours;  // tulip counts our held call
  ours.inflight_tokens = 3;
  fake(x)->setLoad(ours);
  clock_.advance(300ms);
  settle(1);
  EXPECT_EQ(viewOf(addr(x)).polled_load_tokens, 3u);
  EXPECT_EQ(viewOf(addr(x)).others_load_tokens, 0u);
  fake(1)->releaseHeld();
  fake(2)->releaseHeld();
  ASSERT_TRUE(held.get().isOk());
  fake(1)->setHold(false);
  fake(2)->setHold(false);
  // The poll's 3 tokens are still the last word on x, but they were ours and are back: ties.
  const size_t before = fake(x)->embedCalls().size();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(embedSync(call({{1, 2, 3}})).isOk());
  EXPECT_EQ(fake(x)->embedCalls().size() - before, 5u);
  EXPECT_EQ(fake(3 - x)->embedCalls().size(), 5u);
  // Another gateway's work on top of ours still counts: 7 polled while we had 3 out.
  fake(1)->setHold(true);
  fake(2)->setHold(true);
  const size_t n1 = fake(1)->embedCalls().size();
  auto held2 = embedAsync(call({{1, 2, 3}}));
  const int y = fake(1)->embedCalls().size() > n1 ? 1 : 2;
  TulipLoad more;
  more.queued_tokens = 4;
  more.inflight_tokens = 3;
  fake(y)->setLoad(more);
  clock_.advance(300ms);
  settle(1);
  EXPECT_EQ(viewOf(addr(y)).others_load_tokens, 4u);
  fake(1)->releaseHeld();
  fake(2)->releaseHeld();
  ASSERT_TRUE(held2.get().isOk());
}

TEST_F(PoolTest, SplitsByInputsAndReassemblesInOrder) {
  auto o = defaults();
  o.split_max_inputs = 3;
  makeStatic(2, o);
  settle();
  auto in = inputs(10, 2);
  auto r = embedSync(call(in));
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  expectRowsInOrder(*r, in);
  EXPECT_EQ(r->prompt_tokens, 20u);
  // Chunks are contiguous slices of 3, 3, 3, 1 inputs, spread over both replicas.
  std::vector<std::vector<std::vector<int32_t>>> chunks;
  for (int i = 1; i <= 2; ++i) {
    for (auto& c : fake(i)->embedCalls()) chunks.push_back(c.inputs);
    EXPECT_GE(fake(i)->embedCalls().size(), 1u);
  }
  std::sort(chunks.begin(), chunks.end(),
            [](const auto& a, const auto& b) { return a[0][0] < b[0][0]; });
  ASSERT_EQ(chunks.size(), 4u);
  std::vector<size_t> sizes;
  std::vector<std::vector<int32_t>> joined;
  for (auto& c : chunks) {
    sizes.push_back(c.size());
    joined.insert(joined.end(), c.begin(), c.end());
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{3, 3, 3, 1}));
  EXPECT_EQ(joined, in);
  // Timings: the max over chunks (the fake reports queue 10/input, inference 100 + inputs).
  EXPECT_EQ(r->queue_us, 30u);
  EXPECT_EQ(r->inference_us, 103u);
  EXPECT_EQ(metric(R"(ivy_pool_splits_total{method="Embed"})"), 1);
  EXPECT_EQ(metric(R"(ivy_pool_chunks_total{method="Embed"})"), 4);
}

TEST_F(PoolTest, SplitsByTokenBudget) {
  auto o = defaults();
  o.split_max_tokens = 5;
  makeStatic(1, o);
  settle();
  // Token counts 2 2 2 4 7 1 1 3 under a budget of 5: [2 2] [2] [4] [7: alone, over budget]
  // [1 1 3].
  std::vector<std::vector<int32_t>> in = {
      {1, 1}, {2, 2}, {3, 3}, {4, 4, 4, 4}, std::vector<int32_t>(7, 5), {6}, {7}, {8, 8, 8}};
  auto r = embedSync(call(in));
  ASSERT_TRUE(r.isOk());
  expectRowsInOrder(*r, in);
  std::vector<std::vector<std::vector<int32_t>>> chunks;
  for (auto& c : fake(1)->embedCalls()) chunks.push_back(c.inputs);
  std::sort(chunks.begin(), chunks.end(),
            [](const auto& a, const auto& b) { return a[0][0] < b[0][0]; });
  using Chunk = std::vector<std::vector<int32_t>>;
  EXPECT_EQ(chunks, (std::vector<Chunk>{Chunk{in[0], in[1]}, Chunk{in[2]}, Chunk{in[3]},
                                        Chunk{in[4]}, Chunk{in[5], in[6], in[7]}}));
  EXPECT_EQ(r->prompt_tokens, 22u);
}

TEST_F(PoolTest, UnsplitWhenWithinBudget) {
  auto o = defaults();
  o.split_max_inputs = 16;
  o.split_max_tokens = 100;
  makeStatic(2, o);
  settle();
  auto in = inputs(16, 6);
  auto r = embedSync(call(in));
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(fake(1)->embedCalls().size() + fake(2)->embedCalls().size(), 1u);
  EXPECT_EQ(metric(R"(ivy_pool_splits_total{method="Embed"})"), 0);
}

TEST_F(PoolTest, ScoreSplitsAndKeepsOrder) {
  auto o = defaults();
  o.split_max_inputs = 4;
  makeStatic(3, o);
  settle();
  ScoreCall c;
  c.model = "fake-model";
  c.inputs = inputs(11, 3);
  c.yes_token = 5;
  c.no_token = 6;
  auto in = c.inputs;
  std::promise<Result<ScoreReply>> p;
  pool_->score(std::move(c), [&p](Result<ScoreReply> r) { p.set_value(std::move(r)); });
  auto r = p.get_future().get();
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  ASSERT_EQ(r->scores.size(), 11u);
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(r->scores[i], fakeScore(in[i])) << i;
  EXPECT_EQ(r->prompt_tokens, 33u);
  size_t calls = 0;
  for (int i = 1; i <= 3; ++i) {
    for (auto& sc : fake(i)->scoreCalls()) {
      ++calls;
      EXPECT_EQ(sc.yes_token, 5);
      EXPECT_EQ(sc.no_token, 6);
    }
  }
  EXPECT_EQ(calls, 3u);
}

TEST_F(PoolTest, UnavailableIsRetriedOnceOnAnotherReplicaAndEjects) {
  makeStatic(2, defaults());
  settle();
  preferReplica1(2);
  fake(1)->failNext(Method::kEmbed, unavailable("tulip: connection refused"));
  auto r = embedSync(call({{4, 5}}));
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(fake(1)->embedCalls().size(), 1u);
  EXPECT_EQ(fake(2)->embedCalls().size(), 1u);
  EXPECT_EQ(metric(R"(ivy_pool_retries_total{method="Embed"})"), 1);
  EXPECT_EQ(metric(R"(ivy_replica_failures_total{replica="10.0.0.1:1",code="UNAVAILABLE"})"), 1);
  EXPECT_EQ(stateOf(addr(1)), ReplicaState::kEjected);
  EXPECT_EQ(stateOf(addr(2)), ReplicaState::kHealthy);
  EXPECT_TRUE(pool_->ready());  // one healthy replica left
  // The ejected replica gets nothing until it is probed again.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(embedSync(call({{1}})).isOk());
  EXPECT_EQ(fake(1)->embedCalls().size(), 1u);
}

TEST_F(PoolTest, FailsWith503WhenRetryFailsToo) {
  makeStatic(3, defaults());
  settle();
  for (int i = 1; i <= 3; ++i) fake(i)->setEmbedError(unavailable("tulip: rose worker restarting"));
  auto r = embedSync(call({{4, 5}}));
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("no tulip replica could serve the request"));
  EXPECT_THAT(r.status().message(), HasSubstr("rose worker restarting"));
  size_t calls = 0;
  for (int i = 1; i <= 3; ++i) calls += fake(i)->embedCalls().size();
  EXPECT_EQ(calls, 2u);  // retried once, not more
  // Two replicas are ejected; the third still serves (when it recovers).
  fake(1)->setEmbedError(okStatus());
  fake(2)->setEmbedError(okStatus());
  fake(3)->setEmbedError(okStatus());
  auto ok = embedSync(call({{4, 5}}));
  ASSERT_TRUE(ok.isOk()) << ok.status().toString();
  // All ejected: nothing left to serve.
  for (int i = 1; i <= 3; ++i) fake(i)->setEmbedError(unavailable("down"));
  (void)embedSync(call({{1}}));
  auto none = embedSync(call({{1}}));
  ASSERT_FALSE(none.isOk());
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(pool_->ready());
}

TEST_F(PoolTest, OtherErrorsAreNotRetriedNorEject) {
  makeStatic(2, defaults());
  settle();
  for (int i = 1; i <= 2; ++i) fake(i)->setEmbedError(invalidArgument("tulip: input[0] too long"));
  auto r = embedSync(call({{1}}));
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fake(1)->embedCalls().size() + fake(2)->embedCalls().size(), 1u);
  EXPECT_EQ(stateOf(addr(1)), ReplicaState::kHealthy);
  EXPECT_EQ(stateOf(addr(2)), ReplicaState::kHealthy);
}

TEST_F(PoolTest, ResourceExhaustedTriesEveryReplicaThen429) {
  makeStatic(3, defaults());
  settle();
  fake(1)->setEmbedError(resourceExhausted("tulip: queue full"));
  fake(2)->setEmbedError(resourceExhausted("tulip: queue full"));
  // One replica with room: the call lands there eventually.
  for (int k = 0; k < 3; ++k) {
    auto r = embedSync(call({{7}}));
    ASSERT_TRUE(r.isOk()) << r.status().toString();
  }
  fake(3)->setEmbedError(resourceExhausted("tulip: queue full"));
  auto r = embedSync(call({{7}}));
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("every tulip replica is at capacity"));
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(stateOf(addr(i)), ReplicaState::kHealthy);
}

TEST_F(PoolTest, EjectedReplicaIsReprobedWithExponentialBackoff) {
  makeStatic(2, defaults());
  settle();
  fake(1)->setHealth(unavailable("tulip: NOT_SERVING"));
  fake(1)->failNext(Method::kEmbed, unavailable("tulip: connection reset"));
  fake(2)->setHold(true);  // the retry waits on replica 2
  auto pending = embedAsync(call({{1}}));
  // The first attempt goes to replica 1 or 2 (round-robin); make sure replica 1 got ejected.
  for (int i = 0; i < 6000 && stateOf(addr(1)) != ReplicaState::kEjected; ++i) {
    if (fake(1)->embedCalls().empty()) {
      fake(2)->releaseHeld();
      ASSERT_TRUE(pending.get().isOk());
      pending = embedAsync(call({{1}}));
    }
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(stateOf(addr(1)), ReplicaState::kEjected);
  fake(2)->setHold(false);
  fake(2)->releaseHeld();
  ASSERT_TRUE(pending.get().isOk());
  EXPECT_EQ(metric(R"(ivy_pool_ejections_total{replica="10.0.0.1:1"})"), 1);
  EXPECT_EQ(viewOf(addr(1)).backoff, 100ms);

  // Re-probes at +100, then +200, +400, +800, +800 (capped), each failing.
  std::vector<std::chrono::milliseconds> expected = {100ms, 200ms, 400ms, 800ms, 800ms};
  for (auto wait : expected) {
    const int before = fake(1)->healthCalls();
    clock_.advance(wait - 1ms);
    settle(1);
    EXPECT_EQ(fake(1)->healthCalls(), before) << "probed early, wait " << wait.count();
    clock_.advance(1ms);
    settle(1);
    EXPECT_EQ(fake(1)->healthCalls(), before + 1) << "not probed, wait " << wait.count();
    EXPECT_EQ(stateOf(addr(1)), ReplicaState::kEjected);
  }
  EXPECT_EQ(viewOf(addr(1)).backoff, 800ms);
  // Recovers: the next probe (health + ModelInfo) brings it back.
  fake(1)->setHealth(okStatus());
  clock_.advance(800ms);
  settle(1);
  EXPECT_EQ(stateOf(addr(1)), ReplicaState::kHealthy);
  EXPECT_EQ(viewOf(addr(1)).backoff, 0ms);
}

TEST_F(PoolTest, StartingReplicaIsProbedAtLeastEveryFiveInitialBackoffs) {
  configure_ = [](const std::string&, FakeTulipClient* f) {
    f->setHealth(unavailable("tulip: rose worker is not ready yet"));
  };
  makeStatic(1, defaults());
  EXPECT_EQ(pool_->lastProbeError(), "");
  settle(1);
  EXPECT_EQ(fake(1)->healthCalls(), 1);
  EXPECT_EQ(stateOf(addr(1)), ReplicaState::kProbing);
  // Why there is no model yet, for ivy's 503 (cleared once a replica tells its model).
  EXPECT_EQ(pool_->lastProbeError(), "10.0.0.1:1: tulip: rose worker is not ready yet");
  // 100, 200, 400, then capped at 500 (not the 800 ms of an ejected replica).
  for (auto wait : {100ms, 200ms, 400ms, 500ms, 500ms}) {
    const int before = fake(1)->healthCalls();
    clock_.advance(wait - 1ms);
    settle(1);
    EXPECT_EQ(fake(1)->healthCalls(), before) << wait.count();
    clock_.advance(1ms);
    settle(1);
    EXPECT_EQ(fake(1)->healthCalls(), before + 1) << wait.count();
  }
  fake(1)->setHealth(okStatus());
  clock_.advance(500ms);
  settle(1);
  EXPECT_EQ(stateOf(addr(1)), ReplicaState::kHealthy);
  EXPECT_TRUE(pool_->ready());
  EXPECT_EQ(pool_->lastProbeError(), "");
}

TEST_F(PoolTest, FailedHealthCheckEjectsAndReadyFollows) {
  makeStatic(1, defaults());
  settle();
  EXPECT_TRUE(pool_->ready());
  fake(1)->setHealth(unavailable("tulip: NOT_SERVING"));
  clock_.advance(1000ms);
  settle(1);
  EXPECT_EQ(stateOf(addr(1)), ReplicaState::kEjected);
  EXPECT_FALSE(pool_->ready());
  ASSERT_NE(pool_->spec(), nullptr);  // the model stays known
  auto r = embedSync(call({{1}}));
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  fake(1)->setHealth(okStatus());
  clock_.advance(100ms);
  settle(1);
  EXPECT_TRUE(pool_->ready());
}

TEST_F(PoolTest, DnsAddsProbesAndDrainsReplicas) {
  dns_["tulip-headless"] = {addr(1), addr(2)};
  make({"tulip-headless:1"}, defaults());
  EXPECT_TRUE(pool_->replicas().empty());
  pool_->resolveOnce();
  ASSERT_EQ(pool_->replicas().size(), 2u);
  EXPECT_EQ(stateOf(addr(1)), ReplicaState::kProbing);
  settle();
  EXPECT_EQ(stateOf(addr(1)), ReplicaState::kHealthy);
  EXPECT_EQ(stateOf(addr(2)), ReplicaState::kHealthy);

  // A new pod appears: probed before it gets traffic.
  {
    std::lock_guard<std::mutex> lock(mu_);
    dns_["tulip-headless"] = {addr(1), addr(2), addr(3)};
  }
  pool_->resolveOnce();
  EXPECT_EQ(stateOf(addr(3)), ReplicaState::kProbing);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(embedSync(call({{1}})).isOk());
  EXPECT_EQ(fake(3)->embedCalls().size(), 0u);
  settle();
  EXPECT_EQ(stateOf(addr(3)), ReplicaState::kHealthy);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(embedSync(call({{1}})).isOk());
  EXPECT_EQ(fake(3)->embedCalls().size(), 2u);

  // Replica 2 leaves DNS while a call is in flight on it: drained, not cut off.
  fake(2)->setHold(true);
  std::future<Result<EmbedReply>> in_flight;
  for (int i = 0; i < 3; ++i) {
    auto f = embedAsync(call({{9}}));
    if (fake(2)->heldCount() == 1 && !in_flight.valid()) {
      in_flight = std::move(f);
    } else if (f.valid() && fake(2)->heldCount() == 0) {
      ASSERT_TRUE(f.get().isOk());
    }
  }
  ASSERT_TRUE(in_flight.valid());
  {
    std::lock_guard<std::mutex> lock(mu_);
    dns_["tulip-headless"] = {addr(1), addr(3)};
  }
  pool_->resolveOnce();
  EXPECT_EQ(stateOf(addr(2)), ReplicaState::kDraining);
  settle();
  EXPECT_EQ(pool_->replicas().size(), 3u);  // still there: its call is in flight
  const size_t before = fake(2)->embedCalls().size();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(embedSync(call({{1}})).isOk());
  EXPECT_EQ(fake(2)->embedCalls().size(), before);  // no new calls while draining
  fake(2)->releaseHeld();
  ASSERT_TRUE(in_flight.get().isOk());
  settle();
  ASSERT_EQ(pool_->replicas().size(), 2u);
  EXPECT_EQ(pool_->replicas()[0].address, addr(1));
  EXPECT_EQ(pool_->replicas()[1].address, addr(3));

  // A lookup failure keeps the known replicas.
  {
    std::lock_guard<std::mutex> lock(mu_);
    dns_.erase("tulip-headless");
  }
  pool_->resolveOnce();
  EXPECT_EQ(pool_->replicas().size(), 2u);
  EXPECT_TRUE(pool_->ready());
}

TEST_F(PoolTest, RetryGetsTheRemainingDeadline) {
  makeStatic(2, defaults());
  settle();
  preferReplica1(2);
  // Replica 1 takes 300 ms (on the fake clock), then fails UNAVAILABLE.
  fake(1)->failNext(Method::kEmbed, unavailable("tulip: connection reset"));
  fake(1)->setOnReply([this](Method) { clock_.advance(300ms); });
  auto r = embedSync(call({{1}}, 1000ms));
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  ASSERT_EQ(fake(1)->embedCalls().size(), 1u);
  ASSERT_EQ(fake(2)->embedCalls().size(), 1u);
  EXPECT_EQ(fake(1)->embedCalls()[0].timeout, 1000ms);
  EXPECT_EQ(fake(2)->embedCalls()[0].timeout, 700ms);
}

TEST_F(PoolTest, NoRetryWhenTheDeadlineIsSpent) {
  makeStatic(2, defaults());
  settle();
  for (int i = 1; i <= 2; ++i) {
    fake(i)->failNext(Method::kEmbed, unavailable("tulip: connection reset"));
    fake(i)->setOnReply([this](Method) { clock_.advance(1500ms); });
  }
  auto r = embedSync(call({{1}}, 1000ms));
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(), HasSubstr("connection reset"));
  EXPECT_EQ(fake(1)->embedCalls().size() + fake(2)->embedCalls().size(), 1u);
}

TEST_F(PoolTest, FailedChunkFailsTheCallAndCancelsTheOthers) {
  auto o = defaults();
  o.split_max_inputs = 2;
  makeStatic(2, o);
  settle();
  fake(1)->setHold(true);
  fake(2)->setEmbedError(invalidArgument("tulip: token id out of range"));
  auto r = embedSync(call(inputs(8)));
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("token id out of range"));
  // Replica 1's held chunks (the chunks sent before replica 2 failed) were cancelled: they answer
  // CANCELLED without being released.
  const int sent = static_cast<int>(fake(1)->embedCalls().size());
  EXPECT_GE(sent, 1);
  for (int i = 0; i < 6000 && fake(1)->cancelledCalls() < sent; ++i) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(fake(1)->cancelledCalls(), sent);
  EXPECT_EQ(fake(1)->heldCount(), 0u);
  for (int i = 0; i < 6000; ++i) {
    bool zero = true;
    for (auto& v : pool_->replicas()) zero = zero && v.outstanding_tokens == 0;
    if (zero) break;
    std::this_thread::sleep_for(5ms);
  }
  for (auto& v : pool_->replicas()) EXPECT_EQ(v.outstanding_tokens, 0) << v.address;
}

TEST_F(PoolTest, CallerCancellationReachesEveryChunk) {
  auto o = defaults();
  o.split_max_inputs = 1;
  makeStatic(2, o);
  settle();
  fake(1)->setHold(true);
  fake(2)->setHold(true);
  auto c = call(inputs(4));
  c.cancel = std::make_shared<CallCanceller>();
  auto cancel = c.cancel;
  auto f = embedAsync(std::move(c));
  cancel->cancel();
  ASSERT_EQ(f.wait_for(60s), std::future_status::ready);
  auto r = f.get();
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  for (int i = 0; i < 6000 && fake(1)->cancelledCalls() + fake(2)->cancelledCalls() < 4; ++i) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(fake(1)->cancelledCalls() + fake(2)->cancelledCalls(), 4);
  // Cancelled by the caller: not a failure of the replicas (no failure series, no ejection). Every
  // reply was handled once its tokens were released.
  for (int i = 0; i < 6000; ++i) {
    bool zero = true;
    for (auto& v : pool_->replicas()) zero = zero && v.outstanding_tokens == 0;
    if (zero) break;
    std::this_thread::sleep_for(5ms);
  }
  for (auto& v : pool_->replicas()) EXPECT_EQ(v.state, ReplicaState::kHealthy) << v.address;
  EXPECT_EQ(metric(R"(ivy_replica_failures_total{replica="10.0.0.1:1",code="CANCELLED"})"), -1);
  EXPECT_EQ(metric(R"(ivy_replica_failures_total{replica="10.0.0.2:1",code="CANCELLED"})"), -1);
}

// A caller already gone (its client disconnected before the call was made): nothing is sent.
TEST_F(PoolTest, CallCancelledBeforeItStartsSendsNoChunk) {
  auto o = defaults();
  o.split_max_inputs = 1;
  makeStatic(2, o);
  settle();
  auto c = call(inputs(3));
  c.cancel = std::make_shared<CallCanceller>();
  c.cancel->cancel();
  auto f = embedAsync(std::move(c));
  ASSERT_EQ(f.wait_for(60s), std::future_status::ready);
  auto r = f.get();
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(fake(1)->embedCalls().size() + fake(2)->embedCalls().size(), 0u);
  for (auto& v : pool_->replicas()) EXPECT_EQ(v.outstanding_tokens, 0) << v.address;
}

TEST_F(PoolTest, ReplicaWithAnotherModelIsNotUsed) {
  configure_ = [](const std::string& a, FakeTulipClient* f) {
    if (a == addr(2)) {
      TulipModelInfo other;
      other.model = "other-model";
      other.kind = "embedding";
      other.hidden_size = 8;
      other.max_seq_len = 32;
      other.vocab_size = 1000;
      f->setModelInfo(other);
    }
  };
  makeStatic(1, defaults());  // replica 1 defines the model first
  settle();
  pool_.reset();
  fakes_.clear();
  makeStatic(2, defaults());
  pool_->maintainOnce();  // probes both at once; which answers first defines the model
  ASSERT_TRUE(pool_->waitIdle(30s));
  settle();
  const bool one_won = stateOf(addr(1)) == ReplicaState::kHealthy;
  EXPECT_EQ(stateOf(one_won ? addr(2) : addr(1)), ReplicaState::kMismatch);
  EXPECT_EQ(pool_->spec()->upstream_name, one_won ? "fake-model" : "other-model");
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(embedSync(call({{1}})).isOk());
  EXPECT_EQ(fake(one_won ? 2 : 1)->embedCalls().size(), 0u);
  EXPECT_GE(metric(std::string(R"(ivy_pool_model_mismatch_total{replica=")") +
                   (one_won ? "10.0.0.2:1" : "10.0.0.1:1") + "\"}"),
            1);
}

TEST_F(PoolTest, ModelChangesWhenNoReplicaOfTheOldOneIsLeft) {
  makeStatic(1, defaults());
  settle();
  EXPECT_EQ(pool_->spec()->upstream_name, "fake-model");
  // tulip restarts with another model: health fails, then it comes back different.
  fake(1)->setHealth(unavailable("restarting"));
  clock_.advance(1000ms);
  settle(1);
  EXPECT_EQ(stateOf(addr(1)), ReplicaState::kEjected);
  TulipModelInfo other;
  other.model = "qwen3-reranker";
  other.kind = "embedding";
  other.hidden_size = 16;
  other.max_seq_len = 64;
  other.vocab_size = 2000;
  fake(1)->setModelInfo(other);
  fake(1)->setHealth(okStatus());
  clock_.advance(100ms);
  settle(1);
  EXPECT_EQ(stateOf(addr(1)), ReplicaState::kHealthy);
  EXPECT_EQ(pool_->spec()->upstream_name, "qwen3-reranker");
  EXPECT_EQ(pool_->spec()->hidden_size, 16u);
}

struct GenResult {
  std::vector<int32_t> tokens;
  Status status;
};

GenResult generateSync(ReplicaPool* pool, GenerateCall call) {
  auto res = std::make_shared<GenResult>();
  auto p = std::make_shared<std::promise<void>>();
  auto stream = pool->generate(
      std::move(call),
      [res](GenerateChunkMsg m) {
        res->tokens.insert(res->tokens.end(), m.token_ids.begin(), m.token_ids.end());
      },
      [res, p](Status s) {
        res->status = s;
        p->set_value();
      });
  EXPECT_EQ(p->get_future().wait_for(60s), std::future_status::ready);
  return *res;
}

TEST_F(PoolTest, GenerateIsNeverSplitAndRetriesBeforeTheFirstChunk) {
  auto o = defaults();
  o.split_max_tokens = 2;
  o.split_max_inputs = 1;
  makeStatic(2, o);
  settle();
  GenerateCall g;
  g.model = "fake-model";
  g.prompt_ids = {1, 2, 3, 4, 5};
  g.max_tokens = 4;
  auto ok = generateSync(pool_.get(), g);
  ASSERT_TRUE(ok.status.isOk()) << ok.status.toString();
  EXPECT_EQ(ok.tokens, (std::vector<int32_t>{100, 101, 102, 103}));
  EXPECT_EQ(fake(1)->generateCalls().size() + fake(2)->generateCalls().size(), 1u);

  // UNAVAILABLE before any chunk: retried on the other replica.
  preferReplica1(2);
  const size_t before1 = fake(1)->generateCalls().size(), before2 = fake(2)->generateCalls().size();
  fake(1)->failNext(Method::kGenerate, unavailable("tulip: connection refused"));
  auto retried = generateSync(pool_.get(), g);
  ASSERT_TRUE(retried.status.isOk()) << retried.status.toString();
  EXPECT_EQ(retried.tokens.size(), 4u);
  EXPECT_EQ(fake(1)->generateCalls().size(), before1 + 1);
  EXPECT_EQ(fake(2)->generateCalls().size(), before2 + 1);
  EXPECT_EQ(stateOf(addr(1)), ReplicaState::kEjected);
  EXPECT_EQ(metric(R"(ivy_pool_retries_total{method="Generate"})"), 1);
}

TEST_F(PoolTest, GenerateIsNotRetriedAfterAChunkWasDelivered) {
  makeStatic(2, defaults());
  settle();
  for (int i = 1; i <= 2; ++i) {
    fake(i)->setGenerateFailure(unavailable("tulip: rose worker died"), 2);
  }
  GenerateCall g;
  g.model = "fake-model";
  g.prompt_ids = {1};
  g.max_tokens = 5;
  auto r = generateSync(pool_.get(), g);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{100, 101}));
  EXPECT_EQ(fake(1)->generateCalls().size() + fake(2)->generateCalls().size(), 1u);
}

TEST_F(PoolTest, GenerateCancelReachesTheReplica) {
  makeStatic(1, defaults());
  settle();
  fake(1)->setHold(true);
  GenerateCall g;
  g.model = "fake-model";
  g.max_tokens = 3;
  auto p = std::make_shared<std::promise<Status>>();
  auto stream = pool_->generate(
      g, [](GenerateChunkMsg) {}, [p](Status s) { p->set_value(s); });
  ASSERT_NE(stream, nullptr);
  stream->cancel();
  fake(1)->releaseHeld();
  auto f = p->get_future();
  ASSERT_EQ(f.wait_for(60s), std::future_status::ready);
  EXPECT_EQ(f.get().code(), StatusCode::kCancelled);
}

TEST_F(PoolTest, BadOptionsAreRejected) {
  auto eps = parseTulipEndpoints({"127.0.0.1:1"});
  ASSERT_TRUE(eps.isOk());
  auto o = defaults();
  o.health_interval = 0ms;
  auto p = ReplicaPool::create(*eps, o, nullptr, nullptr, &registry_);
  ASSERT_FALSE(p.isOk());
  EXPECT_THAT(p.status().message(), HasSubstr("--tulip-health-interval-ms"));
  auto none = ReplicaPool::create({}, defaults(), nullptr, nullptr, &registry_);
  EXPECT_FALSE(none.isOk());
}

TEST_F(PoolTest, BackgroundThreadsProbeAndResolve) {
  dns_["tulip-headless"] = {addr(1)};
  auto o = defaults();
  o.now = nullptr;  // real clock
  o.tick = 5ms;
  o.resolve_interval = 20ms;
  make({"tulip-headless:1", "10.0.0.9:1"}, o);
  pool_->start();
  ASSERT_TRUE(pool_->waitReady(30s));
  {
    std::lock_guard<std::mutex> lock(mu_);
    dns_["tulip-headless"] = {addr(1), addr(2)};
  }
  for (int i = 0; i < 6000; ++i) {
    auto v = pool_->replicas();
    if (v.size() == 3 && v[1].state == ReplicaState::kHealthy) break;
    std::this_thread::sleep_for(5ms);
  }
  auto v = pool_->replicas();
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].address, addr(1));
  EXPECT_EQ(v[1].address, addr(2));
  EXPECT_EQ(v[2].address, "ipv4:10.0.0.9:1");
  for (auto& r : v) EXPECT_EQ(r.state, ReplicaState::kHealthy) << r.address;
  pool_->stop();
}


// [TAG_POOL_PICK_SNAPSHOT] Many threads call embed (split into chunks, some cancelled), score and
// generate while another thread ejects replicas (scripted UNAVAILABLE and failed health checks),
// re-probes them (maintainOnce on an advancing clock), changes their polled loads and re-resolves
// DNS to different address sets (replicas drained, dropped and added). Every call must complete
// exactly once, nothing may abort, and every replica's load must return to zero. Before the fix,
// pick() read each load twice across release() and this test died on `CHECK failed: chosen !=
// nullptr`. No assertion depends on timing: the amount of work is fixed, and waits are bounded
// only to turn a hang into a failure.
TEST_F(PoolTest, ConcurrentCallsWhileReplicasChurnCompleteExactlyOnce) {
  constexpr int kThreads = 6;
  // A tenth under ThreadSanitizer: 60,000 calls took over ten minutes there on a loaded 2-core
  // machine; 6,000 still churn every replica many times over.
  constexpr int kCallsPerThread = kTsanBuild ? 1000 : 10000;
  constexpr int kTotal = kThreads * kCallsPerThread;
  constexpr int kMaxInFlight = 64;
  constexpr int kAddresses = 8;
  auto o = defaults();
  o.split_max_inputs = 2;  // an embed/score call of 3..5 inputs is 2..3 chunks
  keep_fakes_ = true;
  for (int i = 1; i <= kAddresses; ++i) dns_["tulip-headless"].push_back(addr(i));
  make({"tulip-headless:1"}, o);
  pool_->resolveOnce();
  settle();
  ASSERT_TRUE(pool_->ready());

  std::vector<std::atomic<int>> completions(kTotal);
  std::atomic<int> succeeded{0};
  std::mutex m;
  std::condition_variable cv;
  int in_flight = 0;  // guarded by m
  int finished = 0;   // guarded by m
  auto complete = [&](int id, bool ok) {
    if (completions[id].fetch_add(1) != 0) return;  // a second completion: counted, not waited on
    if (ok) ++succeeded;
    std::lock_guard<std::mutex> lock(m);
    --in_flight;
    ++finished;
    cv.notify_all();
  };

  auto worker = [&](int t) {
    std::mt19937 rng(1000 + t);
    for (int i = 0; i < kCallsPerThread; ++i) {
      const int id = t * kCallsPerThread + i;
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return in_flight < kMaxInFlight; });
        ++in_flight;
      }
      const int n = 1 + static_cast<int>(rng() % 5);
      std::vector<std::vector<int32_t>> in;
      for (int k = 0; k < n; ++k) in.push_back(std::vector<int32_t>(1 + rng() % 3, 1 + k));
      switch (id % 3) {
        case 0: {
          EmbedCall c = call(std::move(in));
          std::shared_ptr<CallCanceller> cancel;
          if (rng() % 8 == 0) {
            cancel = std::make_shared<CallCanceller>();
            c.cancel = cancel;
          }
          pool_->embed(std::move(c), [&complete, id](Result<EmbedReply> r) {
            complete(id, r.isOk());
          });
          if (cancel) cancel->cancel();
          break;
        }
        case 1: {
          ScoreCall c;
          c.request_id = "rid";
          c.model = "fake-model";
          c.inputs = std::move(in);
          pool_->score(std::move(c), [&complete, id](Result<ScoreReply> r) {
            complete(id, r.isOk());
          });
          break;
        }
        default: {
          GenerateCall g;
          g.model = "fake-model";
          g.prompt_ids = in[0];
          g.max_tokens = 2;
          pool_->generate(
              std::move(g), [](GenerateChunkMsg) {},
              [&complete, id](Status s) { complete(id, s.isOk()); });
          break;
        }
      }
    }
  };

  std::atomic<bool> stop_chaos{false};
  std::thread chaos([&] {
    std::mt19937 rng(7);
    for (uint64_t round = 0; !stop_chaos.load(); ++round) {
      clock_.advance(std::chrono::milliseconds(20 + rng() % 100));
      pool_->maintainOnce();
      if (round % 3 == 0) {  // DNS now lists all addresses but up to two random ones
        std::vector<std::string> set;
        const unsigned gone1 = rng() % kAddresses, gone2 = rng() % (kAddresses + 2);
        for (unsigned i = 0; i < kAddresses; ++i) {
          if (i != gone1 && i != gone2) set.push_back(addr(static_cast<int>(i) + 1));
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          dns_["tulip-headless"] = set;
        }
        pool_->resolveOnce();
      }
      FakeTulipClient* f = fake(addr(1 + static_cast<int>(rng() % kAddresses)));
      if (f != nullptr) {
        switch (rng() % 6) {
          case 0:
            f->failNext(Method::kEmbed, unavailable("chaos: connection reset"));
            break;
          case 1:
            f->failNext(Method::kScore, resourceExhausted("chaos: queue full"));
            break;
          case 2:
            f->failNext(Method::kGenerate, unavailable("chaos: rose restarting"));
            break;
          case 3:
            f->failNext(Method::kHealth, unavailable("chaos: health check failed"));
            break;
          default: {
            TulipLoad l;
            l.queued_tokens = rng() % 4 == 0 ? 1 : 0;  // replicas keep tying with each other
            f->setLoad(l);
            break;
          }
        }
      }
      std::this_thread::sleep_for(1ms);
    }
  });

  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) workers.emplace_back(worker, t);
  for (auto& w : workers) w.join();
  bool all_done;
  {
    std::unique_lock<std::mutex> lock(m);
    all_done = cv.wait_for(lock, 120s, [&] { return finished == kTotal; });
  }
  stop_chaos = true;
  chaos.join();
  ASSERT_TRUE(all_done) << "calls never completed: " << kTotal - finished << " of " << kTotal;

  // Whatever is still scheduled settles (probes, polls); nothing may complete a call twice.
  {
    std::lock_guard<std::mutex> lock(mu_);
    dns_["tulip-headless"] = {addr(1), addr(2)};
  }
  pool_->resolveOnce();
  for (int i = 0; i < 3; ++i) {
    clock_.advance(1s);
    settle(1);
  }
  int twice = 0;
  for (int i = 0; i < kTotal; ++i) twice += completions[i].load() != 1;
  EXPECT_EQ(twice, 0) << "calls not completed exactly once";
  EXPECT_GT(succeeded.load(), 0);
  for (const auto& v : pool_->replicas()) {
    EXPECT_EQ(v.outstanding_tokens, 0) << v.address;
    EXPECT_EQ(v.calls_in_flight, 0) << v.address;
  }
  // The churn really happened: replicas were ejected, and DNS changes created new clients.
  double ejections = 0;
  for (int i = 1; i <= kAddresses; ++i) {
    ejections += std::max(0.0, metric("ivy_pool_ejections_total{replica=\"10.0.0." +
                                      std::to_string(i) + ":1\"}"));
  }
  EXPECT_GT(ejections, 0);
  EXPECT_GT(created_, kAddresses);
  pool_.reset();
}

}  // namespace
}  // namespace garden::ivy
