// The load generator as a process against a real tulip (fake-rose behind it: hidden 4, max 64
// tokens, a score head): bounded runs report exactly the requests made, plausible percentiles,
// errors by status; the suite scripts write their JSON; the renderer turns it into markdown and
// well-formed SVG. When ivy, rose and rose-mkmodel are built, the HTTP text path (calibrated word
// counts, tokenization in ivy) runs through a real mesh as well.
#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/integration/support/harness.h"

namespace garden {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string readFile(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class Loadgen : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    port_ = testing::freePort();
    tulip_ = new testing::Process(
        {testing::binary("services/tulip/tulip"), "--host", "127.0.0.1", "--port",
         std::to_string(port_), "--metrics-port", "0", "--model", dir_->path(), "--rose-bin",
         testing::binary("tests/fakes/fake-rose"), "--shm-name",
         "/garden-lg-" + std::to_string(getpid()) + "-" + std::to_string(port_)},
        dir_->path() + "/tulip.log");
  }
  static void TearDownTestSuite() {
    delete tulip_;
    delete dir_;
  }

  static std::string endpoint() { return "127.0.0.1:" + std::to_string(port_); }

  // Runs loadgen with `args`; returns its exit status. Output goes to dir/<log>.
  static int loadgen(std::vector<std::string> args, const std::string& log = "loadgen.log") {
    args.insert(args.begin(), testing::binary("bench/loadgen/loadgen"));
    return testing::run(args, dir_->path() + "/" + log);
  }

  // The report of the bounded embed run: exact counts, ordered percentiles, server timings.
  static void expectPlausibleEmbedReport(const std::string& out, const std::string& api);

  static simdjson::dom::element parse(simdjson::dom::parser& p, const std::string& path) {
    simdjson::dom::element doc;
    auto err = p.load(path).get(doc);
    EXPECT_FALSE(err) << path << ": " << simdjson::error_message(err) << "\n" << readFile(path);
    return doc;
  }

  static testing::TempDir* dir_;
  static int port_;
  static testing::Process* tulip_;
};
testing::TempDir* Loadgen::dir_ = nullptr;
int Loadgen::port_ = 0;
testing::Process* Loadgen::tulip_ = nullptr;

// Both client APIs (sync: a thread per client; callback: calls chained on gRPC's threads).
TEST_F(Loadgen, GrpcEmbedBoundedCountReportsExactlyAndPlausibly) {
  for (const std::string api : {"sync", "callback"}) {
    SCOPED_TRACE("--grpc-api " + api);
    std::string out = dir_->path() + "/embed_" + api + ".json";
    // ModelInfo waits for tulip to come up (wait_for_ready), so no separate readiness poll.
    ASSERT_EQ(loadgen({"--endpoint", endpoint(), "--grpc-api", api, "--seq-len", "32", "--batch",
                       "2", "--concurrency", "4", "--warmup", "10", "--count", "300", "--out", out,
                       "--require-ok", "--commit", "testcommit", "--suite", "itest"}),
              0)
        << readFile(dir_->path() + "/loadgen.log") << tulip_->log();
    expectPlausibleEmbedReport(out, api);
  }
}

void Loadgen::expectPlausibleEmbedReport(const std::string& out, const std::string& api) {
  simdjson::dom::parser p;
  auto doc = parse(p, out);
  EXPECT_EQ(std::string_view(doc["flags"]["grpc_api"]), api);
  EXPECT_EQ(std::string_view(doc["schema"]), "garden.bench.result.v1");
  EXPECT_EQ(std::string_view(doc["workload"]), "embed_tok32_b2_c4");
  EXPECT_EQ(std::string_view(doc["suite"]), "itest");
  EXPECT_EQ(std::string_view(doc["git_commit"]), "testcommit");
  EXPECT_EQ(std::string_view(doc["model"]["name"]), "fake");
  EXPECT_EQ(uint64_t(doc["requests"]["ok"]), 300u);
  EXPECT_EQ(uint64_t(doc["requests"]["errors"]), 0u);
  EXPECT_EQ(uint64_t(doc["requests"]["by_status"]["OK"]), 300u);
  auto lat = doc["latency_ms"];
  EXPECT_EQ(uint64_t(lat["count"]), 300u);
  double p50 = lat["p50"], p90 = lat["p90"], p99 = lat["p99"], mx = lat["max"], mn = lat["min"];
  EXPECT_GT(mn, 0.0);
  EXPECT_LE(mn, p50);
  EXPECT_LE(p50, p90);
  EXPECT_LE(p90, p99);
  EXPECT_LE(p99, mx);
  EXPECT_LT(p50, 5000.0);
  double wall = doc["duration_s"];
  double eps = doc["throughput"]["embeddings_per_s"];
  double tps = doc["throughput"]["tokens_per_s"];
  EXPECT_NEAR(eps * wall, 600.0, 1e-6);       // 300 requests x batch 2
  EXPECT_NEAR(tps * wall, 600.0 * 32, 1e-3);  // tulip's prompt_tokens
  // tulip's own timings come back and fit inside the client's latency.
  double server_p50_ms = double(doc["server_us"]["total"]["p50"]) / 1000.0;
  EXPECT_GT(server_p50_ms, 0.0);
  EXPECT_LE(server_p50_ms, mx);
}

TEST_F(Loadgen, GrpcScoreAndErrorsByStatus) {
  std::string out = dir_->path() + "/score.json";
  ASSERT_EQ(loadgen({"--endpoint", endpoint(), "--mode", "score", "--batch", "5", "--seq-len", "20",
                     "--warmup", "2", "--count", "40", "--out", out, "--require-ok"}),
            0);
  simdjson::dom::parser p;
  auto doc = parse(p, out);
  EXPECT_EQ(std::string_view(doc["workload"]), "score_tok20_b5_c1");
  EXPECT_EQ(uint64_t(doc["requests"]["ok"]), 40u);
  EXPECT_NEAR(double(doc["throughput"]["items_per_s"]) * double(doc["duration_s"]), 200.0, 1e-6);
  EXPECT_EQ(std::string_view(doc["flags"]["yes_token"]), "-1");  // fake-rose has a score head

  // 100 tokens is over fake-rose's 64: every request fails, counted by gRPC status.
  std::string bad = dir_->path() + "/bad.json";
  ASSERT_EQ(loadgen({"--endpoint", endpoint(), "--seq-len", "100", "--warmup", "0", "--count", "12",
                     "--concurrency", "3", "--grpc-api", "callback", "--out", bad}),
            0);
  auto bdoc = parse(p, bad);
  EXPECT_EQ(uint64_t(bdoc["requests"]["ok"]), 0u);
  EXPECT_EQ(uint64_t(bdoc["requests"]["errors"]), 12u);
  EXPECT_EQ(uint64_t(bdoc["requests"]["by_status"]["INVALID_ARGUMENT"]), 12u);
  EXPECT_NE(std::string_view(bdoc["requests"]["error_samples"].at(0)).find("64"),
            std::string_view::npos);
  EXPECT_EQ(loadgen({"--endpoint", endpoint(), "--seq-len", "100", "--warmup", "0", "--count", "2",
                     "--out", bad, "--require-ok"}),
            3);
}

TEST_F(Loadgen, BadFlagsAndUnreachableEndpoint) {
  EXPECT_EQ(loadgen({"--endpoint", endpoint(), "--count", "1", "--mode", "embedding"}), 2);
  EXPECT_EQ(loadgen({"--endpoint", endpoint(), "--count", "1", "--batch", "0"}), 2);
  EXPECT_EQ(loadgen({"--endpoint", endpoint()}), 2);  // neither --count nor --duration
  EXPECT_EQ(loadgen({"--endpoint", endpoint(), "--count", "1", "--input", "text"}), 2);
  EXPECT_EQ(loadgen({"--endpoint", endpoint(), "--count", "1", "--grpc-api", "async"}, "api.log"),
            2);
  EXPECT_NE(readFile(dir_->path() + "/api.log").find("--grpc-api"), std::string::npos);
  EXPECT_EQ(
      loadgen({"--protocol", "http", "--endpoint", endpoint(), "--count", "1", "--mode", "score"}),
      2);
  // Nothing listens on this port: ModelInfo fails within the timeout, exit 1.
  EXPECT_EQ(loadgen({"--endpoint", "127.0.0.1:" + std::to_string(testing::freePort()), "--count",
                     "1", "--timeout-ms", "500"},
                    "unreachable.log"),
            1);
  EXPECT_NE(readFile(dir_->path() + "/unreachable.log").find("ModelInfo"), std::string::npos);
}

TEST_F(Loadgen, SuiteScriptsWriteResultsAndTheRendererDrawsThem) {
  std::string res = dir_->path() + "/suite";
  std::string lg = testing::binary("bench/loadgen/loadgen");
  std::string suites = testing::sourceDir() + "/bench/suites/";
  ASSERT_EQ(
      testing::run({"/bin/bash", suites + "low_latency_embed.sh", "--tulip", endpoint(), "--out",
                    res, "--quick", "--lengths", "16 32 128", "--max-len", "64", "--loadgen", lg},
                   dir_->path() + "/suite.log"),
      0)
      << readFile(dir_->path() + "/suite.log");
  ASSERT_EQ(testing::run({"/bin/bash", suites + "low_latency_score.sh", "--tulip", endpoint(),
                          "--out", res, "--quick", "--lengths", "24", "--loadgen", lg},
                         dir_->path() + "/suite.log"),
            0)
      << readFile(dir_->path() + "/suite.log");
  // The throughput suite at several concurrencies is what the latency plot needs; run the
  // loadgen directly at 1 and 2 clients for one family.
  for (int c : {1, 2}) {
    ASSERT_EQ(
        loadgen({"--endpoint", endpoint(), "--seq-len", "8", "--concurrency", std::to_string(c),
                 "--count", "10", "--warmup", "0", "--suite", "high_concurrency", "--out",
                 res + "/embed_tok8_b1_c" + std::to_string(c) + ".json"}),
        0);
  }
  for (const char* f :
       {"embed_tok16_b1_c1.json", "embed_tok32_b1_c1.json", "score_tok24_b5_c1.json",
        "score_tok24_b25_c1.json", "score_tok24_b50_c1.json"})
    EXPECT_TRUE(fs::exists(res + "/" + f)) << f;
  EXPECT_FALSE(fs::exists(res + "/embed_tok128_b1_c1.json"));  // over --max-len
  simdjson::dom::parser p;
  auto q = parse(p, res + "/embed_tok16_b1_c1.json");
  EXPECT_EQ(uint64_t(q["requests"]["ok"]), 8u);  // --quick: 8 measured requests
  EXPECT_EQ(std::string_view(q["suite"]), "low_latency_embedding");

  std::string rep = dir_->path() + "/report";
  ASSERT_EQ(testing::run({"/usr/bin/env", "python3",
                          testing::sourceDir() + "/bench/render/render.py", "--out", rep, res},
                         dir_->path() + "/render.log"),
            0)
      << readFile(dir_->path() + "/render.log");
  std::string md = readFile(rep + "/report.md");
  for (const char* w : {"embed_tok16_b1_c1", "embed_tok32_b1_c1", "score_tok24_b50_c1",
                        "embed_tok8_b1_c2", "CPU harness check", "| workload | system |"})
    EXPECT_NE(md.find(w), std::string::npos) << w << "\n" << md;
  // Every table row has the header's number of cells.
  std::istringstream lines(md);
  std::string line;
  size_t cells = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("| workload | system | ok", 0) == 0)
      cells = std::count(line.begin(), line.end(), '|');
    if (line.empty()) cells = 0;
    if (cells && line.rfind("| ", 0) == 0) {
      EXPECT_EQ(static_cast<size_t>(std::count(line.begin(), line.end(), '|')), cells) << line;
    }
  }
  // The SVGs are well-formed XML with an <svg> root and real content.
  for (const char* svg : {"latency_vs_concurrency.svg", "cost_per_million_tokens.svg"}) {
    std::string path = rep + "/" + svg;
    ASSERT_EQ(testing::run({"/usr/bin/env", "python3", "-c",
                            "import sys, xml.etree.ElementTree as E\n"
                            "r = E.parse(sys.argv[1]).getroot()\n"
                            "assert r.tag == '{http://www.w3.org/2000/svg}svg', r.tag\n"
                            "n = sum(1 for e in r.iter() if e.tag.endswith(('polyline', 'rect')))\n"
                            "assert n >= 2, n\n",
                            path},
                           dir_->path() + "/svg.log"),
              0)
        << svg << "\n"
        << readFile(dir_->path() + "/svg.log");
  }
  EXPECT_NE(readFile(rep + "/latency_vs_concurrency.svg").find("polyline"), std::string::npos);
}

// The HTTP text path through a real mesh (ivy -> tulip -> rose with the tiny model), when those
// binaries are part of this build.
TEST_F(Loadgen, IvyTextThroughRealMesh) {
  // Registered (tests/integration/loadgen/CMakeLists.txt) only where these targets exist.
  for (const char* b : {"services/ivy/ivy", "services/rose/rose", "services/rose/rose-mkmodel"})
    ASSERT_TRUE(fs::exists(testing::binary(b))) << b << " is not built";
  std::string model = dir_->path() + "/model";
  ASSERT_EQ(testing::run({testing::binary("services/rose/rose-mkmodel"), "--out", model, "--repo",
                          testing::sourceDir()},
                         dir_->path() + "/mkmodel.log"),
            0);
  int tport = testing::freePort(), iport = testing::freePort();
  testing::Process tulip({testing::binary("services/tulip/tulip"), "--host", "127.0.0.1", "--port",
                          std::to_string(tport), "--metrics-port", "0", "--model", model,
                          "--rose-bin", testing::binary("services/rose/rose"), "--shm-name",
                          "/garden-lgm-" + std::to_string(getpid()) + "-" + std::to_string(tport),
                          "--rose-threads", "1"},
                         dir_->path() + "/mesh-tulip.log");
  testing::Process ivy({testing::binary("services/ivy/ivy"), "--host", "127.0.0.1", "--port",
                        std::to_string(iport), "--tulip", "127.0.0.1:" + std::to_string(tport),
                        "--tokenizer", model + "/tokenizer.model", "--threads", "1"},
                       dir_->path() + "/mesh-ivy.log");
  ASSERT_TRUE(testing::waitForHttp(iport, "/ready", 200, 60s)) << tulip.log() << ivy.log();
  std::string ivy_ep = "127.0.0.1:" + std::to_string(iport);
  std::string out = dir_->path() + "/ivy_text.json";
  ASSERT_EQ(loadgen({"--protocol", "http", "--endpoint", ivy_ep, "--input", "text", "--seq-len",
                     "48", "--pool", "4", "--concurrency", "2", "--warmup", "2", "--count", "16",
                     "--out", out, "--require-ok"},
                    "ivy.log"),
            0)
      << readFile(dir_->path() + "/ivy.log");
  simdjson::dom::parser p;
  auto doc = parse(p, out);
  EXPECT_EQ(std::string_view(doc["workload"]), "embed_text48_b1_c2");
  EXPECT_EQ(uint64_t(doc["requests"]["ok"]), 16u);
  // [TAG_TEXT_LENGTH_CALIBRATION]: every text is within 1 token (1% of 48, at least 1) of 48,
  // as ivy's tokenizer counts them.
  EXPECT_GE(double(doc["input_tokens"]["per_input_min"]), 47.0);
  EXPECT_LE(double(doc["input_tokens"]["per_input_max"]), 49.0);
  // ivy's timing headers, per request: its total within the client's latency, the upstream leg
  // within its total, tulip's queue + inference within the upstream leg.
  const auto gw = doc["gateway_us"];
  EXPECT_EQ(uint64_t(gw["total"]["count"]), 16u);
  EXPECT_GT(double(gw["total"]["min"]), 0.0);
  EXPECT_LE(double(gw["total"]["max"]), double(doc["latency_ms"]["max"]) * 1000.0);
  EXPECT_GE(double(gw["client"]["min"]), 0.0);
  EXPECT_GE(double(gw["own"]["min"]), 0.0);
  EXPECT_GT(double(gw["upstream"]["min"]), 0.0);
  EXPECT_LE(double(gw["tulip_queue"]["p50"]) + double(gw["tulip_inference"]["p50"]),
            double(gw["upstream"]["max"]));
  // A target at the model's maximum length (512): over-long probes are refused with 400 and the
  // calibration must still converge from below.
  std::string max_out = dir_->path() + "/ivy_text_max.json";
  ASSERT_EQ(
      loadgen({"--protocol", "http", "--endpoint", ivy_ep, "--input", "text", "--seq-len", "512",
               "--pool", "2", "--warmup", "0", "--count", "2", "--out", max_out, "--require-ok"},
              "ivy_max.log"),
      0)
      << readFile(dir_->path() + "/ivy_max.log");
  auto mdoc = parse(p, max_out);
  EXPECT_GE(double(mdoc["input_tokens"]["per_input_min"]), 507.0);
  EXPECT_LE(double(mdoc["input_tokens"]["per_input_max"]), 512.0);
  // Pre-tokenized ids through ivy too (vocab from tulip's ModelInfo).
  std::string tok = dir_->path() + "/ivy_tok.json";
  ASSERT_EQ(
      loadgen({"--protocol", "http", "--endpoint", ivy_ep, "--info-endpoint",
               "127.0.0.1:" + std::to_string(tport), "--batch", "3", "--seq-len", "20", "--warmup",
               "0", "--count", "6", "--encoding-format", "base64", "--out", tok, "--require-ok"},
              "ivy_tok.log"),
      0)
      << readFile(dir_->path() + "/ivy_tok.log");
  auto tdoc = parse(p, tok);
  EXPECT_NEAR(double(tdoc["throughput"]["embeddings_per_s"]) * double(tdoc["duration_s"]), 18.0,
              1e-6);
}

}  // namespace
}  // namespace garden
