// The bounded mesh soak (issue 14): one ivy in front of three tulip + rose replicas on loopback
// (the tiny rose-mkmodel model on CPU), driven by 32 closed-loop clients for 60 s — half keep one
// keep-alive connection for the whole run, half open a new connection for every request
// (`Connection: close`). ivy's in-flight cap and tulip's queues are small, so the run also spends
// time overloaded. The request mix covers the model routes (token and text embeddings, a request
// large enough to be split over replicas, /tokenize, /v1/models) and an invalid one.
//
// Passes only when, counted over every request sent:
//   * every request got a complete HTTP response (none reset, cut short or timed out);
//   * every status is one its request may get: 200 for valid requests (with as many embeddings,
//     in order, as inputs were sent), 400 for the invalid one, and 429/503 — with Retry-After —
//     for any of them under overload; nothing else (no 500, no 504);
//   * every process is still alive at the end: ivy, the tulips and the roses they started (same
//     pids as at the start, tulip_worker_restarts 0), and the mesh still answers.
// No assertion depends on timing: the run lasts as long as it lasts, the counts are what is
// judged. GARDEN_SOAK_SECONDS and GARDEN_SOAK_CLIENTS override 60 and 32 (scripts/test.sh runs a
// shorter soak in its ThreadSanitizer stage).
#include <gtest/gtest.h>
#include <signal.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/loadgen/http_client.h"
#include "tests/integration/support/harness.h"

namespace garden {
namespace {

using namespace std::chrono_literals;

constexpr int kReplicas = 3;
constexpr int kVocab = 500;

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : fallback;
}

// One kind of request in the mix and what its answers may be.
struct Kind {
  std::string name;
  std::string method;  // GET or POST
  std::string path;
  std::string body;
  int ok_status = 200;    // what it gets when admitted (200, or 400 for the invalid one)
  size_t embeddings = 0;  // for embeddings: the data entries a 200 must carry
};

std::string tokenInputs(int count, int len, int seed) {
  std::string s = "[";
  for (int i = 0; i < count; ++i) {
    s += i ? ",[" : "[";
    for (int j = 0; j < len; ++j)
      s += (j ? "," : "") + std::to_string(1 + (seed + i * 7 + j) % (kVocab - 1));
    s += "]";
  }
  return s + "]";
}

std::vector<Kind> mix() {
  std::vector<Kind> k;
  k.push_back({"embed_one", "POST", "/v1/embeddings",
               R"({"model":"tiny","input":)" + tokenInputs(1, 8, 1) + "}", 200, 1});
  k.push_back({"embed_batch", "POST", "/v1/embeddings",
               R"({"model":"tiny","input":)" + tokenInputs(4, 32, 2) + "}", 200, 4});
  k.push_back({"embed_text", "POST", "/v1/embeddings",
               R"({"model":"tiny","input":["hello garden","ivy climbs walls","tulips bloom"]})",
               200, 3});
  // More inputs than --split-max-inputs: split into chunks over the replicas and reassembled.
  k.push_back({"embed_split", "POST", "/v1/embeddings",
               R"({"model":"tiny","input":)" + tokenInputs(150, 4, 3) + "}", 200, 150});
  k.push_back({"tokenize", "POST", "/tokenize", R"({"model":"tiny","text":"hello garden"})", 200});
  k.push_back({"models", "GET", "/v1/models", "", 200});
  // A token id outside the vocabulary: 400 naming the field, whatever the load.
  k.push_back({"invalid", "POST", "/v1/embeddings",
               R"({"model":"tiny","input":[[1,2,)" + std::to_string(kVocab + 1000) + "]]}", 400});
  return k;
}

std::string requestText(const Kind& k, bool keep_alive) {
  std::string r = k.method + " " + k.path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  if (!keep_alive) r += "Connection: close\r\n";
  if (k.method == "POST") {
    r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(k.body.size()) +
         "\r\n";
  }
  return r + "\r\n" + k.body;
}

// A 200 embeddings body: `want` entries, each at its own index, all of one non-zero width.
bool embeddingsOk(const std::string& body, size_t want) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(body).get(doc)) return false;
  simdjson::dom::array data;
  if (doc["data"].get_array().get(data)) return false;
  size_t i = 0, width = 0;
  for (simdjson::dom::element e : data) {
    int64_t index = -1;
    simdjson::dom::array emb;
    if (e["index"].get_int64().get(index) || index != static_cast<int64_t>(i)) return false;
    if (e["embedding"].get_array().get(emb)) return false;
    if (i == 0) width = emb.size();
    if (emb.size() == 0 || emb.size() != width) return false;
    ++i;
  }
  return i == want;
}

// One client's counts (each thread has its own; merged at the end).
struct Tally {
  uint64_t sent = 0, unanswered = 0, unexpected = 0, missing_retry_after = 0, bad_body = 0;
  std::map<int, uint64_t> by_status;
  std::map<std::string, uint64_t> ok_by_kind;
  std::vector<std::string> samples;  // first few problems, for the failure message

  void note(std::string what) {
    if (samples.size() < 5) samples.push_back(std::move(what));
  }
  void merge(const Tally& o) {
    sent += o.sent;
    unanswered += o.unanswered;
    unexpected += o.unexpected;
    missing_retry_after += o.missing_retry_after;
    bad_body += o.bad_body;
    for (auto& [s, n] : o.by_status) by_status[s] += n;
    for (auto& [k, n] : o.ok_by_kind) ok_by_kind[k] += n;
    for (auto& s : o.samples) note(s);
  }
};

void client(int port, int index, bool keep_alive, std::chrono::steady_clock::time_point end,
            const std::vector<Kind>& kinds, Tally& t) {
  std::unique_ptr<bench::Connection> conn;
  for (size_t i = 0; std::chrono::steady_clock::now() < end; ++i) {
    const Kind& k = kinds[(static_cast<size_t>(index) + i) % kinds.size()];
    // New-connection clients get a fresh socket for every request.
    if (!conn || !keep_alive) conn = std::make_unique<bench::Connection>("127.0.0.1", port, 120s);
    bench::ResponseReader reader;
    Status st = conn->roundTrip(requestText(k, keep_alive), reader);
    ++t.sent;
    if (!st.isOk() || !reader.done()) {
      ++t.unanswered;
      t.note(k.name + (keep_alive ? " (keep-alive)" : " (new connection)") +
             ": no complete response: " + st.toString());
      continue;
    }
    const int status = reader.status();
    ++t.by_status[status];
    if (status == 429 || status == 503) {
      if (reader.headers().count("retry-after") == 0) {
        ++t.missing_retry_after;
        t.note(k.name + ": " + std::to_string(status) + " without Retry-After");
      }
      std::this_thread::sleep_for(20ms);  // a polite client backs off a little
      continue;
    }
    if (status != k.ok_status) {
      ++t.unexpected;
      t.note(k.name + ": status " + std::to_string(status) + ": " + reader.body().substr(0, 300));
      continue;
    }
    if (k.embeddings > 0 && !embeddingsOk(reader.body(), k.embeddings)) {
      ++t.bad_body;
      t.note(k.name + ": 200 without " + std::to_string(k.embeddings) +
             " ordered embeddings: " + reader.body().substr(0, 300));
      continue;
    }
    if (k.ok_status == 400 && reader.body().find("\"error\"") == std::string::npos) {
      ++t.bad_body;
      t.note(k.name + ": 400 without an error object: " + reader.body().substr(0, 300));
      continue;
    }
    ++t.ok_by_kind[k.name];
  }
}

TEST(Soak, MeshUnderMixedLoadAnswersEveryRequestAndStaysUp) {
  const int seconds = envInt("GARDEN_SOAK_SECONDS", 60);
  const int clients = envInt("GARDEN_SOAK_CLIENTS", 32);
  testing::TempDir dir;
  const std::string model = dir.path() + "/model";
  ASSERT_EQ(testing::run({testing::binary("services/rose/rose-mkmodel"), "--out", model, "--repo",
                          testing::sourceDir() + "/docs", "--vocab-size", std::to_string(kVocab)},
                         dir.path() + "/mkmodel.log"),
            0)
      << "rose-mkmodel failed";

  std::vector<int> grpc_ports, metrics_ports;
  std::vector<std::unique_ptr<testing::Process>> tulips;
  for (int i = 0; i < kReplicas; ++i) {
    grpc_ports.push_back(testing::freePort());
    metrics_ports.push_back(testing::freePort());
    auto argv = testing::tulipArgv(grpc_ports[i], metrics_ports[i], model, "services/rose/rose",
                                   "soak" + std::to_string(i));
    // Small queues, so that overload (429 + Retry-After) is part of the run; a rose starved of
    // CPU on a loaded 2-core machine is not declared stuck.
    for (const char* a :
         {"--served-model-name", "tiny", "--rose-threads", "1", "--queue-limit-tokens", "4000",
          "--max-batch-tokens", "1024", "--heartbeat-timeout-ms", "60000"})
      argv.emplace_back(a);
    tulips.push_back(std::make_unique<testing::Process>(
        argv, dir.path() + "/tulip" + std::to_string(i) + ".log"));
  }
  std::string targets;
  for (int p : grpc_ports)
    targets += (targets.empty() ? "" : ",") + ("127.0.0.1:" + std::to_string(p));
  const int port = testing::freePort();
  auto ivy = std::make_unique<testing::Process>(
      std::vector<std::string>{testing::binary("services/ivy/ivy"),
                               "--host",
                               "127.0.0.1",
                               "--port",
                               std::to_string(port),
                               "--tulip",
                               targets,
                               "--model-dir",
                               model,
                               "--threads",
                               "2",
                               "--split-max-inputs",
                               "100",
                               "--max-inflight-requests",
                               "16",
                               "--request-timeout-ms",
                               "120000",
                               "--tulip-health-interval-ms",
                               "200",
                               "--tulip-load-interval-ms",
                               "100"},
      dir.path() + "/ivy.log");
  auto logs = [&] {
    std::string out;
    for (size_t i = 0; i < tulips.size(); ++i)
      out += "--- tulip" + std::to_string(i) + " (tail) ---\n" +
             tulips[i]->log().substr(tulips[i]->log().size() > 4000 ? tulips[i]->log().size() - 4000
                                                                    : 0);
    const std::string l = ivy->log();
    return out + "--- ivy (tail) ---\n" + l.substr(l.size() > 4000 ? l.size() - 4000 : 0);
  };
  ASSERT_TRUE(testing::waitForHttp(port, "/ready", 200, 180s)) << "mesh not ready\n" << logs();
  ASSERT_TRUE(testing::eventually(180s,
                                  [&] {
                                    return testing::metricValue(
                                               testing::http(port, "GET", "/metrics").body,
                                               R"(ivy_replicas{state="healthy"})") >= kReplicas;
                                  }))
      << "replicas not healthy\n"
      << logs();
  // The roses each tulip started; the same ones must be there at the end.
  std::vector<std::vector<pid_t>> roses;
  for (auto& t : tulips) {
    roses.push_back(testing::childrenOf(t->pid()));
    ASSERT_EQ(roses.back().size(), 1u) << "a tulip without its rose\n" << logs();
  }

  const std::vector<Kind> kinds = mix();
  std::vector<Tally> tallies(static_cast<size_t>(clients));
  const auto t0 = std::chrono::steady_clock::now();
  const auto end = t0 + std::chrono::seconds(seconds);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back(client, port, c, /*keep_alive=*/c % 2 == 0, end, std::cref(kinds),
                         std::ref(tallies[static_cast<size_t>(c)]));
  }
  for (auto& th : threads) th.join();
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  Tally all, keep, fresh;
  for (int c = 0; c < clients; ++c)
    (c % 2 == 0 ? keep : fresh).merge(tallies[static_cast<size_t>(c)]);
  all.merge(keep);
  all.merge(fresh);
  std::string summary =
      "soak: " + std::to_string(clients) + " clients, " + std::to_string(wall_s) + " s; sent " +
      std::to_string(all.sent) + " (keep-alive " + std::to_string(keep.sent) + ", new connection " +
      std::to_string(fresh.sent) + "); unanswered " + std::to_string(all.unanswered) + "; statuses";
  for (auto& [s, n] : all.by_status) summary += " " + std::to_string(s) + ":" + std::to_string(n);
  summary += "; answered as expected by kind";
  for (auto& [k, n] : all.ok_by_kind) summary += " " + k + ":" + std::to_string(n);
  std::printf("%s\n", summary.c_str());
  std::string problems;
  for (auto& s : all.samples) problems += "  " + s + "\n";

  EXPECT_EQ(all.unanswered, 0u) << summary << "\n" << problems;
  EXPECT_EQ(all.unexpected, 0u) << summary << "\n" << problems;
  EXPECT_EQ(all.missing_retry_after, 0u) << summary << "\n" << problems;
  EXPECT_EQ(all.bad_body, 0u) << summary << "\n" << problems;
  EXPECT_GT(keep.sent, 0u);
  EXPECT_GT(fresh.sent, 0u);
  // Work got done, not only refused: every kind was answered as expected at least once.
  for (const Kind& k : kinds) EXPECT_GT(all.ok_by_kind[k.name], 0u) << k.name << "\n" << summary;

  // Nothing crashed: every process is alive, each tulip still has the rose it started with.
  EXPECT_TRUE(ivy->alive()) << "ivy died\n" << logs();
  for (int i = 0; i < kReplicas; ++i) {
    EXPECT_TRUE(tulips[i]->alive()) << "tulip" << i << " died\n" << logs();
    EXPECT_EQ(testing::childrenOf(tulips[i]->pid()), roses[i]) << "tulip" << i << "'s rose changed";
    const std::string m = testing::http(metrics_ports[i], "GET", "/metrics").body;
    EXPECT_NE(m.find("tulip_worker_restarts "), std::string::npos) << "tulip" << i << " metrics";
    EXPECT_EQ(testing::metricValue(m, "tulip_worker_restarts"), 0) << "tulip" << i;
  }
  // And the mesh still serves.
  auto after = testing::http(port, "POST", "/v1/embeddings", kinds[0].body,
                             {{"Content-Type", "application/json"}});
  EXPECT_EQ(after.status, 200) << after.body;
}

}  // namespace
}  // namespace garden
