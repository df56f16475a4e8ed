// The real Prometheus server (Debian's `prometheus`) scrapes the three tiers of a running mesh
// (ivy /metrics, tulip --metrics-port, rose --metrics-port); the test asserts through Prometheus'
// query API that each tier's series exist and move when traffic flows.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <fstream>
#include <thread>

#include "tests/integration/support/harness.h"

namespace garden {
namespace {

using namespace std::chrono_literals;
using testing::http;

// URL-encodes a PromQL expression for a GET query.
std::string urlEncode(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    if (isalnum(c) || c == '_' || c == '-' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// Sum of an instant query's values; -1 when the query returns no series.
double query(int prom_port, const std::string& promql) {
  auto r = http(prom_port, "GET", "/api/v1/query?query=" + urlEncode(promql));
  if (r.status != 200) return -2;
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.parse(r.body).get(doc)) return -2;
  simdjson::dom::array result;
  if (doc["data"]["result"].get_array().get(result)) return -2;
  if (result.size() == 0) return -1;
  double sum = 0;
  for (auto series : result) {
    std::string_view v = series["value"].at(1).get_string();
    sum += std::stod(std::string(v));
  }
  return sum;
}

TEST(Prometheus, ScrapesAllThreeTiersAndSeriesMove) {
  testing::TempDir dir;
  const std::string model = dir.path() + "/model";
  ASSERT_EQ(testing::run({testing::binary("services/rose/rose-mkmodel"), "--out", model, "--repo",
                          testing::sourceDir()},
                         dir.path() + "/mkmodel.log"),
            0);
  const int tulip_port = testing::freePort(), tulip_metrics = testing::freePort();
  const int rose_metrics = testing::freePort(), ivy_port = testing::freePort();
  const int prom_port = testing::freePort();
  testing::Process tulip(
      {testing::binary("services/tulip/tulip"), "--host", "127.0.0.1", "--port",
       std::to_string(tulip_port), "--metrics-port", std::to_string(tulip_metrics), "--model",
       model, "--rose-bin", testing::binary("services/rose/rose"), "--shm-name",
       "/garden-prom-" + std::to_string(getpid()), "--rose-threads", "1",
       "--rose-arg=--metrics-port", "--rose-arg=" + std::to_string(rose_metrics)},
      dir.path() + "/tulip.log");
  testing::Process ivy({testing::binary("services/ivy/ivy"), "--host", "127.0.0.1", "--port",
                        std::to_string(ivy_port), "--tulip",
                        "127.0.0.1:" + std::to_string(tulip_port), "--tokenizer",
                        model + "/tokenizer.model", "--threads", "1"},
                       dir.path() + "/ivy.log");
  ASSERT_TRUE(testing::waitForHttp(ivy_port, "/ready", 200, 60s)) << tulip.log() << ivy.log();
  ASSERT_TRUE(testing::waitForHttp(rose_metrics, "/metrics", 200, 30s));

  const std::string cfg = dir.path() + "/prometheus.yml";
  {
    std::ofstream f(cfg);
    f << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "scrape_configs:\n"
      << "  - job_name: ivy\n    static_configs:\n      - targets: ['127.0.0.1:" << ivy_port
      << "']\n"
      << "  - job_name: tulip\n    static_configs:\n      - targets: ['127.0.0.1:"
      << tulip_metrics << "']\n"
      << "  - job_name: rose\n    static_configs:\n      - targets: ['127.0.0.1:" << rose_metrics
      << "']\n";
  }
  testing::Process prom({"/usr/bin/prometheus", "--config.file=" + cfg,
                         "--storage.tsdb.path=" + dir.path() + "/tsdb",
                         "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                        dir.path() + "/prometheus.log");
  ASSERT_TRUE(testing::waitForHttp(prom_port, "/-/ready", 200, 60s)) << prom.log();

  auto send = [&](int n) {
    for (int i = 0; i < n && !::testing::Test::HasFailure(); ++i) {
      auto r = http(ivy_port, "POST", "/v1/embeddings",
                    R"({"model":"model","input":["prometheus scrape test )" +
                        std::to_string(i) + R"(", "second input"]})");
      ASSERT_EQ(r.status, 200) << r.body;
    }
  };
  send(5);
  ASSERT_FALSE(::testing::Test::HasFailure());
  // All three targets up.
  auto t0 = std::chrono::steady_clock::now();
  while (query(prom_port, "sum(up)") < 3 && std::chrono::steady_clock::now() - t0 < 30s)
    std::this_thread::sleep_for(200ms);
  ASSERT_EQ(query(prom_port, "sum(up)"), 3) << prom.log();

  const std::vector<std::string> series = {
      R"(sum(ivy_http_requests_total{job="ivy"}))",
      R"(sum(ivy_embeddings_prompt_tokens_total{job="ivy"}))",
      R"(sum(tulip_requests_total{job="tulip",code="OK"}))",
      R"(sum(tulip_batch_tokens_count{job="tulip"}))",
      R"(sum(rose_batches_total{job="rose",outcome="OK"}))",
      R"(sum(rose_step_seconds_count{job="rose"}))",
  };
  std::vector<double> before;
  for (auto& q : series) {
    double v = -1;
    t0 = std::chrono::steady_clock::now();
    while ((v = query(prom_port, q)) <= 0 && std::chrono::steady_clock::now() - t0 < 20s)
      std::this_thread::sleep_for(200ms);
    EXPECT_GT(v, 0) << q;
    before.push_back(v);
  }
  EXPECT_EQ(query(prom_port, R"(sum(tulip_worker_ready{job="tulip"}))"), 1);
  send(7);
  for (size_t i = 0; i < series.size(); ++i) {
    double v = 0;
    t0 = std::chrono::steady_clock::now();
    while ((v = query(prom_port, series[i])) <= before[i] &&
           std::chrono::steady_clock::now() - t0 < 20s)
      std::this_thread::sleep_for(200ms);
    EXPECT_GT(v, before[i]) << series[i] << " did not move";
  }
  // tulip counted exactly the 12 successful Embed calls (once a scrape taken after the last one
  // is in: a scrape during send(7) already moved the series above).
  const std::string ok_calls = R"(sum(tulip_requests_total{job="tulip",code="OK"}))";
  t0 = std::chrono::steady_clock::now();
  while (query(prom_port, ok_calls) < 12 && std::chrono::steady_clock::now() - t0 < 30s)
    std::this_thread::sleep_for(200ms);
  EXPECT_EQ(query(prom_port, ok_calls), 12);
}

}  // namespace
}  // namespace garden
