// Tests for common/metrics/registry: values, exact exposition text, registration rules, concurrency
// (exact totals), ScopedTimer, and the exposition of every metric kind checked by the reference
// linter `promtool check metrics` (which must be installed: CI installs it, so its absence fails).

#include "common/metrics/registry.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace garden::metrics {
namespace {

TEST(Metrics, CounterGaugeValues) {
  Registry r;
  Counter& c = r.counter("c_total", "a counter").get();
  EXPECT_EQ(c.value(), 0);
  c.inc();
  c.inc(2.5);
  c.inc(0);
  EXPECT_EQ(c.value(), 3.5);
  Gauge& g = r.gauge("g", "a gauge").get();
  g.set(10);
  g.inc();
  g.dec(3);
  g.inc(-0.5);
  EXPECT_EQ(g.value(), 7.5);
  g.set(-2);
  EXPECT_EQ(g.value(), -2);
}

TEST(Metrics, HistogramBucketsAreInclusiveAndCumulative) {
  Histogram h({0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.1000001, 1.0, 5.0, 10.0, 11.0, -3.0}) h.observe(v);
  h.observe(std::numeric_limits<double>::quiet_NaN());
  h.observe(std::numeric_limits<double>::infinity());
  auto s = h.snapshot();
  ASSERT_EQ(s.cumulative.size(), 4u);
  EXPECT_EQ(s.cumulative[0], 3u);   // -3, 0.05, 0.1
  EXPECT_EQ(s.cumulative[1], 5u);   // + 0.1000001, 1
  EXPECT_EQ(s.cumulative[2], 7u);   // + 5, 10
  EXPECT_EQ(s.cumulative[3], 10u);  // + 11, NaN, +Inf
  EXPECT_EQ(s.count, 10u);
  EXPECT_TRUE(std::isnan(s.sum));
}

TEST(Metrics, BucketHelpers) {
  EXPECT_EQ(linearBuckets(1, 2, 3), (std::vector<double>{1, 3, 5}));
  EXPECT_EQ(exponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  const auto& d = defaultLatencyBuckets();
  ASSERT_FALSE(d.empty());
  for (size_t i = 1; i < d.size(); ++i) EXPECT_LT(d[i - 1], d[i]);
}

TEST(Metrics, ExactExposition) {
  Registry r;
  auto& req = r.counter("garden_requests_total", "Requests by route.", {"route", "status"});
  req.labels({"/v1/embeddings", "200"}).inc(3);
  req.labels({"/v1/chat/completions", "429"}).inc();
  r.gauge("garden_queue_depth", "Queued requests.").get().set(2.5);
  auto& lat = r.histogram("garden_request_seconds", "Latency.", {"route"}, {0.01, 0.1, 1});
  lat.labels({"/v1/embeddings"}).observe(0.05);
  lat.labels({"/v1/embeddings"}).observe(2);
  r.counter("garden_unused_total", "Never touched, has labels.", {"x"});  // omitted: no children

  EXPECT_EQ(r.expose(),
            "# HELP garden_queue_depth Queued requests.\n"
            "# TYPE garden_queue_depth gauge\n"
            "garden_queue_depth 2.5\n"
            "# HELP garden_request_seconds Latency.\n"
            "# TYPE garden_request_seconds histogram\n"
            "garden_request_seconds_bucket{route=\"/v1/embeddings\",le=\"0.01\"} 0\n"
            "garden_request_seconds_bucket{route=\"/v1/embeddings\",le=\"0.1\"} 1\n"
            "garden_request_seconds_bucket{route=\"/v1/embeddings\",le=\"1\"} 1\n"
            "garden_request_seconds_bucket{route=\"/v1/embeddings\",le=\"+Inf\"} 2\n"
            "garden_request_seconds_sum{route=\"/v1/embeddings\"} 2.05\n"
            "garden_request_seconds_count{route=\"/v1/embeddings\"} 2\n"
            "# HELP garden_requests_total Requests by route.\n"
            "# TYPE garden_requests_total counter\n"
            "garden_requests_total{route=\"/v1/chat/completions\",status=\"429\"} 1\n"
            "garden_requests_total{route=\"/v1/embeddings\",status=\"200\"} 3\n");
}

TEST(Metrics, UnlabeledHistogramAndSpecialValues) {
  Registry r;
  r.histogram("h_seconds", "h", {}, {0.5}).get();
  Gauge& g = r.gauge("g", "g").get();
  g.set(std::numeric_limits<double>::infinity());
  std::string text = r.expose();
  EXPECT_NE(text.find("g +Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_seconds_bucket{le=\"0.5\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_seconds_bucket{le=\"+Inf\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_seconds_sum 0\nh_seconds_count 0\n"), std::string::npos) << text;
  g.set(-std::numeric_limits<double>::infinity());
  EXPECT_NE(r.expose().find("g -Inf\n"), std::string::npos);
  g.set(std::numeric_limits<double>::quiet_NaN());
  EXPECT_NE(r.expose().find("g NaN\n"), std::string::npos);
  g.set(1e-7);
  EXPECT_NE(r.expose().find("g 1e-07\n"), std::string::npos);
}

TEST(Metrics, EscapesLabelValuesAndHelp) {
  Registry r;
  r.counter("e_total", "help with \\ backslash\nand newline \"quotes\" stay", {"v"})
      .labels({"a\\b\"c\nd"})
      .inc();
  EXPECT_EQ(r.expose(),
            "# HELP e_total help with \\\\ backslash\\nand newline \"quotes\" stay\n"
            "# TYPE e_total counter\n"
            "e_total{v=\"a\\\\b\\\"c\\nd\"} 1\n");
}

TEST(Metrics, ReRegistrationReturnsSameFamilyAndChildrenAreStable) {
  Registry r;
  auto& f1 = r.counter("x_total", "x", {"k"});
  auto& f2 = r.counter("x_total", "x", {"k"});
  EXPECT_EQ(&f1, &f2);
  Counter& c = f1.labels({"a"});
  for (int i = 0; i < 1000; ++i) f1.labels({std::to_string(i)});
  EXPECT_EQ(&c, &f2.labels({"a"}));
  EXPECT_EQ(&c, &f1.labels(std::vector<std::string>{"a"}));
  auto& h1 = r.histogram("y", "y", {}, {1, 2});
  auto& h2 = r.histogram("y", "y", {}, {1, 2});
  EXPECT_EQ(&h1, &h2);
}

using MetricsDeathTest = ::testing::Test;

TEST_F(MetricsDeathTest, RegistrationRulesCheckFail) {
  EXPECT_DEATH(Registry().counter("1bad", "h"), "invalid metric name");
  EXPECT_DEATH(Registry().counter("bad-name", "h"), "invalid metric name");
  EXPECT_DEATH(Registry().counter("", "h"), "invalid metric name");
  EXPECT_DEATH(Registry().counter("ok", "h", {"bad-label"}), "invalid label name");
  EXPECT_DEATH(Registry().counter("ok", "h", {"__reserved"}), "invalid label name");
  EXPECT_DEATH(Registry().counter("ok", "h", {"a", "a"}), "duplicate label");
  EXPECT_DEATH(Registry().histogram("ok", "h", {"le"}), "'le' is reserved");
  EXPECT_DEATH(Registry().histogram("ok", "h", {}, {1, 1}), "strictly increase");
  EXPECT_DEATH(Registry().histogram("ok", "h", {}, {1, std::numeric_limits<double>::infinity()}),
               "finite");
  EXPECT_DEATH(
      {
        Registry r;
        r.counter("m", "h");
        r.gauge("m", "h");
      },
      "different types");
  EXPECT_DEATH(
      {
        Registry r;
        r.counter("m", "h", {"a"});
        r.counter("m", "h", {"b"});
      },
      "different help, labels");
  EXPECT_DEATH(
      {
        Registry r;
        r.histogram("m", "h");
        r.gauge("m_count", "h");
      },
      "collides");
  EXPECT_DEATH(
      {
        Registry r;
        r.gauge("m_sum", "h");
        r.histogram("m", "h");
      },
      "collides");
  EXPECT_DEATH(Registry().counter("c_total", "h", {"a"}).labels({"x", "y"}), "wrong number");
  EXPECT_DEATH(Registry().counter("c_total", "h").get().inc(-1), "negative");
  EXPECT_DEATH(
      Registry().counter("c_total", "h").get().inc(std::numeric_limits<double>::quiet_NaN()),
      "negative or NaN");
}

TEST(Metrics, ConcurrentIncrementsAreExact) {
  Registry r;
  auto& fam = r.counter("hits_total", "h", {"t"});
  Counter& shared = r.counter("shared_total", "h").get();
  Gauge& gauge = r.gauge("level", "h").get();
  Histogram& hist = r.histogram("obs", "h", {}, {0.5, 1.5}).get();
  constexpr int kThreads = 8;
  constexpr int kIters = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& mine = fam.labels({std::to_string(t % 2)});
      for (int i = 0; i < kIters; ++i) {
        shared.inc();
        mine.inc(0.5);
        gauge.inc();
        gauge.dec(0.5);
        hist.observe(1.0);
        if (i % 10000 == 0) (void)r.expose();  // exposition may run concurrently
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(shared.value(), double(kThreads) * kIters);
  EXPECT_EQ(fam.labels({"0"}).value(), kThreads / 2 * kIters * 0.5);
  EXPECT_EQ(fam.labels({"1"}).value(), kThreads / 2 * kIters * 0.5);
  EXPECT_EQ(gauge.value(), double(kThreads) * kIters * 0.5);
  auto s = hist.snapshot();
  EXPECT_EQ(s.count, uint64_t{kThreads} * kIters);
  EXPECT_EQ(s.cumulative[0], 0u);
  EXPECT_EQ(s.cumulative[1], uint64_t{kThreads} * kIters);
  EXPECT_EQ(s.sum, double(kThreads) * kIters);
}

TEST(Metrics, ConcurrentChildCreationGivesOneChildPerLabelSet) {
  Registry r;
  auto& fam = r.gauge("g", "h", {"k"});
  constexpr int kThreads = 8;
  std::vector<std::vector<Gauge*>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) seen[t].push_back(&fam.labels({std::to_string(i)}));
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(seen[t], seen[0]);
}

TEST(Metrics, ScopedTimer) {
  Histogram h({0.001, 10});
  {
    ScopedTimer t(h);
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  auto s = h.snapshot();
  EXPECT_EQ(s.count, 1u);
  EXPECT_EQ(s.cumulative[0], 0u);  // slept 3 ms > 1 ms
  EXPECT_EQ(s.cumulative[1], 1u);
  EXPECT_GE(s.sum, 0.003);
  {
    ScopedTimer t(h);
    double secs = t.stop();
    EXPECT_GE(secs, 0);
    EXPECT_EQ(h.snapshot().count, 2u);
  }
  EXPECT_EQ(h.snapshot().count, 2u);  // stop() means the destructor observes nothing
  {
    ScopedTimer t(h);
    t.cancel();
  }
  EXPECT_EQ(h.snapshot().count, 2u);
}

TEST(Metrics, GlobalRegistryIsOneInstance) {
  EXPECT_EQ(&Registry::global(), &Registry::global());
  auto& c = Registry::global().counter("garden_test_global_total", "h").get();
  c.inc();
  EXPECT_NE(Registry::global().expose().find("garden_test_global_total 1\n"), std::string::npos);
}

// ---- promtool ----

struct PromtoolResult {
  int exit_code = -1;
  std::string output;
};

// Runs `promtool check metrics` with `text` on stdin; output is stdout+stderr.
PromtoolResult runPromtool(const std::string& text) {
  PromtoolResult res;
  char path[] = "/tmp/garden_metrics_XXXXXX";
  int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  if (fd < 0) return res;
  EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  std::string cmd = std::string("/usr/bin/promtool check metrics < ") + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  if (p == nullptr) return res;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) res.output.append(buf, n);
  int status = pclose(p);
  res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::remove(path);
  return res;
}

TEST(Promtool, IsInstalled) {
  // Not a skip: CI installs promtool, so a missing binary is a failure.
  ASSERT_EQ(access("/usr/bin/promtool", X_OK), 0)
      << "/usr/bin/promtool is missing (Debian package 'prometheus')";
}

TEST(Promtool, AcceptsEveryMetricKindWithAwkwardLabels) {
  ASSERT_EQ(access("/usr/bin/promtool", X_OK), 0) << "/usr/bin/promtool is missing";
  Registry r;
  auto& req = r.counter("garden_http_requests_total", "HTTP requests \\ by route\nand status.",
                        {"route", "status"});
  req.labels({"/v1/embeddings", "200"}).inc(12);
  req.labels({"we\"ird\\path\nline2", "500"}).inc();
  req.labels({"", "unicode \xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"}).inc(0.5);
  req.labels({"{}=,", "#"}).inc();
  r.counter("garden_restarts_total", "Worker restarts.").get();
  auto& depth = r.gauge("garden_queue_depth", "Queued requests.", {"model"});
  depth.labels({"qwen3"}).set(-3);
  depth.labels({"gpt\"oss"}).set(std::numeric_limits<double>::infinity());
  depth.labels({"nan"}).set(std::numeric_limits<double>::quiet_NaN());
  depth.labels({"tiny"}).set(1e-300);
  auto& lat = r.histogram("garden_request_duration_seconds", "Request latency.", {"route"});
  ScopedTimer(lat.labels({"/v1/score"})).stop();
  for (double v : {0.0001, 0.003, 0.2, 7.0, 100.0}) lat.labels({"a\\b\"c\nd"}).observe(v);
  auto& toks =
      r.histogram("garden_batch_tokens", "Tokens per batch.", {}, exponentialBuckets(16, 2, 8));
  toks.get().observe(300);
  r.histogram("garden_step_seconds", "Step time.", {"kind"}, linearBuckets(0.001, 0.001, 5))
      .labels({"decode"})
      .observe(0.0025);

  std::string text = r.expose();
  PromtoolResult res = runPromtool(text);
  EXPECT_EQ(res.exit_code, 0) << res.output << "\n--- exposition ---\n" << text;
  EXPECT_EQ(res.output, "") << "\n--- exposition ---\n" << text;
}

// The check above can fail: promtool rejects a malformed exposition.
TEST(Promtool, RejectsBrokenExposition) {
  ASSERT_EQ(access("/usr/bin/promtool", X_OK), 0) << "/usr/bin/promtool is missing";
  PromtoolResult res =
      runPromtool("# HELP x_total h\n# TYPE x_total counter\nx_total{a=\"unterminated} 1\n");
  EXPECT_NE(res.exit_code, 0) << res.output;
}

}  // namespace
}  // namespace garden::metrics
