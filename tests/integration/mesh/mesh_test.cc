// The three real binaries as processes on real ports: rose (spawned by tulip), tulip and ivy,
// serving the default model made by rose-mkmodel. HTTP requests go through ivy; results are
// checked against a direct forward pass of the same model in this process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sentencepiece_processor.h>
#include <simdjson.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "common/json_writer.h"
#include "services/rose/model/qwen3.h"
#include "services/rose/ops/backend.h"
#include "tests/integration/support/harness.h"

namespace garden {
namespace {

using namespace std::chrono_literals;
using testing::http;
using testing::HttpResponse;

struct Mesh {
  testing::TempDir dir;
  std::string model;
  int ivy_port = 0, tulip_port = 0, metrics_port = 0;
  std::unique_ptr<testing::Process> tulip, ivy;

  void start() {
    model = dir.path() + "/model";
    ASSERT_EQ(testing::run({testing::binary("services/rose/rose-mkmodel"), "--out", model, "--repo",
                            testing::sourceDir()},
                           dir.path() + "/mkmodel.log"),
              0)
        << "rose-mkmodel failed";
    tulip_port = testing::freePort();
    metrics_port = testing::freePort();
    ivy_port = testing::freePort();
    tulip = std::make_unique<testing::Process>(
        std::vector<std::string>{testing::binary("services/tulip/tulip"), "--host", "127.0.0.1",
                                 "--port", std::to_string(tulip_port), "--metrics-port",
                                 std::to_string(metrics_port), "--model", model, "--rose-bin",
                                 testing::binary("services/rose/rose"), "--shm-name",
                                 "/garden-it-" + std::to_string(getpid()) + "-" +
                                     std::to_string(tulip_port),
                                 "--served-model-name", "tiny", "--rose-threads", "2",
                                 "--heartbeat-timeout-ms", "3000"},
        dir.path() + "/tulip.log");
    ivy = std::make_unique<testing::Process>(
        std::vector<std::string>{testing::binary("services/ivy/ivy"), "--host", "127.0.0.1",
                                 "--port", std::to_string(ivy_port), "--tulip",
                                 "127.0.0.1:" + std::to_string(tulip_port), "--tokenizer",
                                 model + "/tokenizer.model", "--threads", "2",
                                 "--max-body-bytes", "1048576"},
        dir.path() + "/ivy.log");
    ASSERT_TRUE(testing::waitForHttp(ivy_port, "/ready", 200, 60s))
        << "mesh not ready\n--- tulip ---\n"
        << tulip->log() << "\n--- ivy ---\n"
        << ivy->log();
  }

  HttpResponse post(const std::string& body, std::map<std::string, std::string> h = {}) {
    return http(ivy_port, "POST", "/v1/embeddings", body, h);
  }

  pid_t rosePid() {
    auto kids = testing::childrenOf(tulip->pid());
    return kids.empty() ? -1 : kids.front();
  }
};

class MeshTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    mesh_ = new Mesh();
    mesh_->start();
    if (::testing::Test::HasFatalFailure()) return;
    // The reference: the same checkpoint through the CPU backend, in-process.
    auto be = rose::makeBackend("cpu", rose::BackendOptions{});
    ASSERT_TRUE(be.isOk()) << be.status().toString();
    backend_ = std::move(*be).release();
    auto m = rose::Qwen3Model::load(mesh_->model, *backend_, rose::Qwen3Options{});
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    model_ = std::move(*m).release();
    spm_ = new sentencepiece::SentencePieceProcessor();
    ASSERT_TRUE(spm_->Load(mesh_->model + "/tokenizer.model").ok());
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
    delete spm_;
    delete mesh_;
  }

  // Direct forward of one sequence: last-token pooling + L2 norm (the default model's pooling).
  static std::vector<float> direct(const std::vector<int32_t>& ids) {
    // The model's workspace is single-threaded: one direct forward at a time.
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    std::vector<float> out(model_->hiddenSize());
    int32_t len = static_cast<int32_t>(ids.size());
    rose::BatchInput in{ids, std::span<const int32_t>(&len, 1)};
    EXPECT_TRUE(model_->validate(in).isOk());
    model_->enqueueEmbed(in, model_->pooling().mode, true, out.data());
    EXPECT_TRUE(backend_->synchronize().isOk());
    return out;
  }

  static std::vector<int32_t> tokenize(const std::string& text) {
    std::vector<int> ids;
    EXPECT_TRUE(spm_->Encode(text, &ids).ok());
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  // data[i].embedding as floats.
  static std::vector<std::vector<float>> embeddings(const std::string& body) {
    simdjson::dom::parser p;
    simdjson::dom::element doc = p.parse(body);
    std::vector<std::vector<float>> out;
    for (auto item : doc["data"].get_array()) {
      std::vector<float> v;
      for (auto x : item["embedding"].get_array()) v.push_back(static_cast<float>(double(x)));
      out.push_back(std::move(v));
    }
    return out;
  }

  static void expectClose(const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    double dot = 0, ng = 0, nw = 0, maxerr = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      dot += double(got[i]) * want[i];
      ng += double(got[i]) * got[i];
      nw += double(want[i]) * want[i];
      maxerr = std::max(maxerr, std::abs(double(got[i]) - want[i]));
    }
    EXPECT_GE(dot / std::sqrt(ng * nw), 0.99999);
    EXPECT_LT(maxerr, 1e-4);
  }

  static std::string errorParam(const std::string& body) {
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (p.parse(body).get(doc)) return "<not json>";
    std::string_view param;
    if (doc["error"]["param"].get_string().get(param)) return "";
    return std::string(param);
  }

  static Mesh* mesh_;
  static rose::Backend* backend_;
  static rose::Qwen3Model* model_;
  static sentencepiece::SentencePieceProcessor* spm_;
};

Mesh* MeshTest::mesh_ = nullptr;
rose::Backend* MeshTest::backend_ = nullptr;
rose::Qwen3Model* MeshTest::model_ = nullptr;
sentencepiece::SentencePieceProcessor* MeshTest::spm_ = nullptr;

TEST_F(MeshTest, StringInputsEqualDirectForward) {
  std::vector<std::string> texts = {"hello garden", "The scheduler batches by tokens.", "x",
                                    "ünïcödé text — with dashes, digits 12345 and emoji 🌷"};
  std::string body = R"({"model":"tiny","input":[)";
  for (size_t i = 0; i < texts.size(); ++i) {
    if (i) body += ",";
    JsonWriter w;
    w.value(texts[i]);
    body += w.view();
  }
  body += "]}";
  auto r = mesh_->post(body, {{"x-request-id", "it-strings-1"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["x-request-id"], "it-strings-1");
  auto embs = embeddings(r.body);
  ASSERT_EQ(embs.size(), texts.size());
  size_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = tokenize(texts[i]);
    tokens += ids.size();
    expectClose(embs[i], direct(ids));
  }
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(r.body);
  EXPECT_EQ(uint64_t(doc["usage"]["prompt_tokens"]), tokens);
  EXPECT_EQ(std::string_view(doc["model"]), "tiny");
  EXPECT_EQ(std::string_view(doc["object"]), "list");
}

TEST_F(MeshTest, SingleStringAndTokenArraysPassThrough) {
  auto r = mesh_->post(R"({"model":"tiny","input":"one string"})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto e = embeddings(r.body);
  ASSERT_EQ(e.size(), 1u);
  expectClose(e[0], direct(tokenize("one string")));

  r = mesh_->post(R"({"model":"tiny","input":[5,17,300,42]})");
  ASSERT_EQ(r.status, 200) << r.body;
  e = embeddings(r.body);
  ASSERT_EQ(e.size(), 1u);
  expectClose(e[0], direct({5, 17, 300, 42}));

  r = mesh_->post(R"({"model":"tiny","input":[[1,2,3],[9],[400,401,402,403,404]]})");
  ASSERT_EQ(r.status, 200) << r.body;
  e = embeddings(r.body);
  ASSERT_EQ(e.size(), 3u);
  expectClose(e[0], direct({1, 2, 3}));
  expectClose(e[1], direct({9}));
  expectClose(e[2], direct({400, 401, 402, 403, 404}));
}

TEST_F(MeshTest, Base64AndDimensions) {
  auto r = mesh_->post(R"({"model":"tiny","input":[[7,8,9]],"encoding_format":"base64"})");
  ASSERT_EQ(r.status, 200) << r.body;
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(r.body);
  std::string_view b64 = doc["data"].at(0)["embedding"];
  // Decode standard base64 into little-endian float32.
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : b64) {
    int v = val(c);
    if (v < 0) break;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  ASSERT_EQ(bytes.size(), model_->hiddenSize() * 4);
  std::vector<float> f(model_->hiddenSize());
  std::memcpy(f.data(), bytes.data(), bytes.size());
  expectClose(f, direct({7, 8, 9}));

  r = mesh_->post(R"({"model":"tiny","input":[[7,8,9]],"dimensions":8})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto e = embeddings(r.body);
  ASSERT_EQ(e[0].size(), 8u);
  auto full = direct({7, 8, 9});
  std::vector<float> want(full.begin(), full.begin() + 8);
  double n = 0;
  for (float x : want) n += double(x) * x;
  for (float& x : want) x = static_cast<float>(x / std::sqrt(n));
  expectClose(e[0], want);
}

TEST_F(MeshTest, ErrorsAreOpenAIShapedWithTheFieldNamed) {
  struct Case {
    std::string body;
    int status;
    std::string param;
  };
  std::string too_long = R"({"model":"tiny","input":[[)";
  for (int i = 0; i < model_->maxSeqLen() + 1; ++i) too_long += (i ? ",1" : "1");
  too_long += "]]}";
  std::vector<Case> cases = {
      {R"({"model":"tiny","input":)", 400, ""},                     // malformed JSON
      {R"({"model":"tiny","input":42})", 400, "input"},              // wrong type
      {R"({"model":"tiny","input":[1.5]})", 400, "input"},           // wrong element type
      {R"({"model":"tiny","input":""})", 400, "input"},              // empty string
      {R"({"model":"tiny","input":[]})", 400, "input"},              // empty array
      {R"({"model":"tiny","input":[[]]})", 400, "input"},            // empty inner array
      {R"({"model":"tiny","input":[[1, 99999999]]})", 400, "input"},  // id outside vocab
      {R"({"input":"x"})", 400, "model"},                            // model missing
      {R"({"model":"tiny","input":"x","encoding_format":"hex"})", 400, "encoding_format"},
      {R"({"model":"tiny","input":"x","dimensions":0})", 400, "dimensions"},
      {too_long, 400, "input"},
      {R"({"model":"nope","input":"x"})", 404, "model"},
  };
  for (auto& c : cases) {
    auto r = mesh_->post(c.body);
    EXPECT_EQ(r.status, c.status) << c.body.substr(0, 80) << " -> " << r.body;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    ASSERT_FALSE(p.parse(r.body).get(doc)) << "error body is not JSON: " << r.body;
    std::string_view msg;
    EXPECT_FALSE(doc["error"]["message"].get_string().get(msg)) << r.body;
    EXPECT_FALSE(msg.empty());
    if (!c.param.empty()) {
      EXPECT_EQ(errorParam(r.body), c.param) << r.body;
    }
  }
  // Body over the size limit (1 MiB here).
  std::string big = R"({"model":"tiny","input":")" + std::string(2 << 20, 'a') + "\"}";
  auto r = mesh_->post(big);
  EXPECT_EQ(r.status, 413) << r.body.substr(0, 200);
}

TEST_F(MeshTest, ModelsHealthAndMetrics) {
  auto r = http(mesh_->ivy_port, "GET", "/v1/models");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"tiny\""), std::string::npos) << r.body;
  EXPECT_EQ(http(mesh_->ivy_port, "GET", "/health").status, 200);
  EXPECT_EQ(http(mesh_->ivy_port, "GET", "/ready").status, 200);
  ASSERT_EQ(mesh_->post(R"({"model":"tiny","input":"count me"})").status, 200);
  auto m = http(mesh_->ivy_port, "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("/v1/embeddings"), std::string::npos) << m.body.substr(0, 2000);
  auto tm = http(mesh_->metrics_port, "GET", "/metrics");
  ASSERT_EQ(tm.status, 200);
  EXPECT_NE(tm.body.find("tulip_requests_total{method=\"Embed\",code=\"OK\"}"), std::string::npos)
      << tm.body.substr(0, 2000);
  EXPECT_NE(tm.body.find("tulip_worker_ready 1"), std::string::npos);
}

TEST_F(MeshTest, ConcurrentRequestsAllAnsweredCorrectly) {
  std::vector<std::future<bool>> fs;
  for (int c = 0; c < 8; ++c) {
    fs.push_back(std::async(std::launch::async, [c] {
      bool ok = true;
      for (int i = 0; i < 5; ++i) {
        std::vector<int32_t> ids = {c + 1, i + 2, 3 * c + i + 7};
        std::string body = "{\"model\":\"tiny\",\"input\":[[" + std::to_string(ids[0]) + "," +
                           std::to_string(ids[1]) + "," + std::to_string(ids[2]) + "]]}";
        auto r = http(mesh_->ivy_port, "POST", "/v1/embeddings", body);
        if (r.status != 200) return false;
        auto e = embeddings(r.body);
        auto want = direct(ids);
        double dot = 0;
        for (size_t k = 0; k < want.size(); ++k) dot += double(e[0][k]) * want[k];
        ok = ok && dot > 0.99999;
      }
      return ok;
    }));
  }
  for (auto& f : fs) EXPECT_TRUE(f.get());
}

TEST_F(MeshTest, TokenizeAndDetokenizeMatchSentencepiece) {
  const std::string text = "Tokenize me: ünïcödé, 12345 and <|start|> typed by a user.";
  JsonWriter w;
  w.beginObject().field("model", "tiny").field("text", text).endObject();
  auto r = http(mesh_->ivy_port, "POST", "/tokenize", w.take());
  ASSERT_EQ(r.status, 200) << r.body;
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(r.body);
  std::vector<int32_t> ids;
  for (auto v : doc["tokens"].get_array()) ids.push_back(static_cast<int32_t>(int64_t(v)));
  EXPECT_EQ(ids, tokenize(text)) << "ivy's own tokenizer must equal libsentencepiece";
  EXPECT_EQ(uint64_t(doc["count"]), ids.size());
  EXPECT_EQ(uint64_t(doc["max_model_len"]), static_cast<uint64_t>(model_->maxSeqLen()));

  std::string body = R"({"tokens":[)";
  for (size_t i = 0; i < ids.size(); ++i) body += (i ? "," : "") + std::to_string(ids[i]);
  body += "]}";
  r = http(mesh_->ivy_port, "POST", "/detokenize", body);
  ASSERT_EQ(r.status, 200) << r.body;
  std::string want;
  spm_->Decode(std::vector<int>(ids.begin(), ids.end()), &want);
  simdjson::dom::parser p2;
  EXPECT_EQ(std::string_view(p2.parse(r.body)["prompt"]), want);

  struct Case {
    std::string path, body;
    int status;
    std::string param;
  };
  std::vector<Case> cases = {
      {"/tokenize", R"({"text":5})", 400, "text"},
      {"/tokenize", R"({"model":"tiny"})", 400, "text"},
      {"/tokenize", R"({"text":"a","messages":[]})", 400, "text"},
      {"/tokenize", R"({"messages":[{"role":"user","content":"hi"}]})", 400, "messages"},
      {"/tokenize", R"({"model":"other","text":"a"})", 404, "model"},
      {"/tokenize", "not json", 400, ""},
      {"/detokenize", R"({"tokens":"abc"})", 400, "tokens"},
      {"/detokenize", R"({"tokens":[1,-2]})", 400, "tokens"},
      {"/detokenize", R"({"tokens":[99999999]})", 400, "tokens"},
  };
  for (auto& c : cases) {
    auto e = http(mesh_->ivy_port, "POST", c.path, c.body);
    EXPECT_EQ(e.status, c.status) << c.path << " " << c.body << " -> " << e.body;
    if (!c.param.empty()) {
      EXPECT_EQ(errorParam(e.body), c.param) << e.body;
    }
  }
}

TEST_F(MeshTest, IvyTokenizeCliMatchesSentencepiece) {
  const std::string out = mesh_->dir.path() + "/tokenize.out";
  const std::string cmd = "printf '%s\\n%s\\n' '\"hello garden\"' '\"second line, ünïcödé\"' | " +
                          testing::binary("services/ivy/ivy") + " tokenize --tokenizer " +
                          mesh_->model + "/tokenizer.model > " + out;
  ASSERT_EQ(testing::run({"/bin/sh", "-c", cmd}), 0);
  std::ifstream f(out);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(f, line)) lines.push_back(line);
  ASSERT_EQ(lines.size(), 2u);
  auto asJson = [](const std::vector<int32_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
  };
  EXPECT_EQ(lines[0], asJson(tokenize("hello garden")));
  EXPECT_EQ(lines[1], asJson(tokenize("second line, ünïcödé")));
}

// Last: it restarts the worker. A request in flight when rose is killed gets a clean error naming
// the cause (whichever of its chunks answers first: in flight or still queued in tulip); the next
// one succeeds once tulip has restarted it.
TEST_F(MeshTest, ZKillRoseMidRequestThenRecover) {
  pid_t rose = mesh_->rosePid();
  ASSERT_GT(rose, 0);
  // Enough work that the request is still running when rose dies.
  std::string body = R"({"model":"tiny","input":[)";
  for (int i = 0; i < 400; ++i) {
    if (i) body += ",";
    body += "[";
    for (int k = 0; k < 200; ++k) body += (k ? "," : "") + std::to_string((i * 7 + k) % 500 + 1);
    body += "]";
  }
  body += "]}";
  auto fut = std::async(std::launch::async, [&] { return mesh_->post(body); });
  // Kill only once tulip has part of it on the worker (a fixed sleep raced a loaded machine).
  ASSERT_TRUE(testing::eventually(30s, [&] {
    return testing::metricValue(http(mesh_->metrics_port, "GET", "/metrics").body,
                                "tulip_inflight_tokens") > 0;
  })) << "the request never reached the worker";
  ASSERT_EQ(kill(rose, SIGKILL), 0);
  auto r = fut.get();
  EXPECT_EQ(r.status, 503) << r.body.substr(0, 300);
  EXPECT_NE(r.body.find("signal 9"), std::string::npos) << r.body.substr(0, 300);
  EXPECT_FALSE(r.headers["retry-after"].empty());
  // Recovery: ready again, and the next request succeeds with the right answer.
  ASSERT_TRUE(testing::waitForHttp(mesh_->ivy_port, "/ready", 200, 60s));
  HttpResponse ok;
  testing::eventually(
      60s,
      [&] {
        ok = mesh_->post(R"({"model":"tiny","input":[[3,1,4,1,5]]})");
        return ok.status == 200;
      },
      100ms);
  ASSERT_EQ(ok.status, 200) << ok.body;
  expectClose(embeddings(ok.body)[0], direct({3, 1, 4, 1, 5}));
  EXPECT_NE(mesh_->rosePid(), rose);
}

}  // namespace
}  // namespace garden
