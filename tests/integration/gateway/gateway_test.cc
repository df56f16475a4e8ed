// ivy's gateway API on the real mesh: rose (spawned by tulip) serving the tiny rose-mkmodel model,
// tulip, and ivy started with API keys, an admin port, limits, a prompt file and the yes/no score
// tokens. Scores are checked against tulip's Score RPC called directly with ids rendered here from
// the model card's template strings (restated below, not taken from ivy) through the tokenizer
// library (services/ivy/tokenizer, conformance-tested token for token against libsentencepiece;
// libsentencepiece itself cannot share a process with gRPC's libprotobuf, see api/spm_shim.cc).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <thread>

#include "common/json_writer.h"
#include "garden/v1/garden.grpc.pb.h"
#include "services/ivy/tokenizer/tokenizer.h"
#include "tests/integration/support/harness.h"

namespace garden {
namespace {

using namespace std::chrono_literals;
using testing::http;
using testing::HttpResponse;

// The Qwen3-Reranker template (services/ivy/api/score.h [TAG_RERANK_TEMPLATE]), restated here so
// the test checks ivy against the model card's strings rather than against ivy's own constants.
constexpr const char* kPrefix =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
    "the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n";
constexpr const char* kSuffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
constexpr const char* kDefaultInstruction =
    "Given a web search query, retrieve relevant passages that answer the query";

const std::map<std::string, std::string> kAuth = {{"Authorization", "Bearer sk-gateway-test"}};

struct Mesh {
  testing::TempDir dir;
  std::string model;
  int ivy_port = 0, admin_port = 0, tulip_port = 0, metrics_port = 0;
  int yes_id = 0, no_id = 0;
  std::unique_ptr<ivy::Tokenizer> tok;
  std::unique_ptr<testing::Process> tulip, ivy;

  void start() {
    model = dir.path() + "/model";
    ASSERT_EQ(testing::run({testing::binary("services/rose/rose-mkmodel"), "--out", model, "--repo",
                            testing::sourceDir()},
                           dir.path() + "/mkmodel.log"),
              0)
        << "rose-mkmodel failed";
    auto t = ivy::loadTokenizer(model + "/tokenizer.model");
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    tok = std::move(t).value();
    // Two ordinary pieces stand in for "yes"/"no" (the tiny vocabulary has no such pieces).
    yes_id = 100;
    no_id = 101;
    {
      std::ofstream(model + "/config_sentence_transformers.json")
          << R"({"prompts":{"query":"Instruct: find the garden\nQuery: ","document":""},)"
          << R"("default_prompt_name":null})";
      std::ofstream(dir.path() + "/keys") << "# test keys\nsk-other\nsk-gateway-test\n";
    }
    tulip_port = testing::freePort();
    metrics_port = testing::freePort();
    ivy_port = testing::freePort();
    admin_port = testing::freePort();
    tulip = std::make_unique<testing::Process>(
        std::vector<std::string>{testing::binary("services/tulip/tulip"), "--host", "127.0.0.1",
                                 "--port", std::to_string(tulip_port), "--metrics-port",
                                 std::to_string(metrics_port), "--model", model, "--rose-bin",
                                 testing::binary("services/rose/rose"), "--shm-name",
                                 "/garden-gw-" + std::to_string(getpid()) + "-" +
                                     std::to_string(tulip_port),
                                 "--served-model-name", "tiny", "--rose-threads", "2",
                                 "--heartbeat-timeout-ms", "5000", "--rose-arg", "--log-level",
                                 "--rose-arg", "debug"},
        dir.path() + "/tulip.log");
    ivy = std::make_unique<testing::Process>(
        std::vector<std::string>{
            testing::binary("services/ivy/ivy"), "--host", "127.0.0.1", "--port",
            std::to_string(ivy_port), "--admin-port", std::to_string(admin_port), "--tulip",
            "127.0.0.1:" + std::to_string(tulip_port), "--model-dir", model, "--threads", "2",
            "--max-body-bytes", std::to_string(32 << 20), "--max-inputs", "8",
            "--max-input-chars", "20000", "--max-request-tokens", "2000", "--api-keys-file",
            dir.path() + "/keys", "--score-yes-token", std::string(*tok->idToPiece(yes_id)),
            "--score-no-token", std::string(*tok->idToPiece(no_id))},
        dir.path() + "/ivy.log");
    ASSERT_TRUE(testing::waitForHttp(admin_port, "/ready", 200, 90s))
        << "mesh not ready\n--- tulip ---\n"
        << tulip->log() << "\n--- ivy ---\n"
        << ivy->log();
  }

  HttpResponse post(const std::string& path, const std::string& body,
                    std::map<std::string, std::string> h = kAuth) {
    return http(ivy_port, "POST", path, body, h);
  }

  std::vector<int32_t> encode(const std::string& text) {
    return tok->encode(text);
  }
};

class GatewayTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    mesh_ = new Mesh();
    mesh_->start();
  }
  static void TearDownTestSuite() { delete mesh_; }
  void SetUp() override {
    if (mesh_->ivy == nullptr) GTEST_FAIL() << "the mesh did not start";
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
};

Mesh* GatewayTest::mesh_ = nullptr;

TEST_F(GatewayTest, ApiKeysAndAdminPort) {
  auto none = mesh_->post("/v1/embeddings", R"({"model":"tiny","input":"hi"})", {});
  EXPECT_EQ(none.status, 401) << none.body;
  EXPECT_EQ(none.headers["www-authenticate"], "Bearer realm=\"garden\"");
  auto wrong = mesh_->post("/v1/embeddings", R"({"model":"tiny","input":"hi"})",
                           {{"Authorization", "Bearer sk-gateway-tes"}});
  EXPECT_EQ(wrong.status, 401);
  auto ok = mesh_->post("/v1/embeddings", R"({"model":"tiny","input":"hi"})");
  EXPECT_EQ(ok.status, 200) << ok.body;
  auto other = mesh_->post("/v1/embeddings", R"({"model":"tiny","input":"hi"})",
                           {{"Authorization", "Bearer sk-other"}});
  EXPECT_EQ(other.status, 200);
  EXPECT_EQ(http(mesh_->ivy_port, "GET", "/v1/models").status, 401);
  EXPECT_EQ(http(mesh_->ivy_port, "GET", "/v1/models", "", kAuth).status, 200);
  for (const char* p : {"/health", "/ready", "/metrics"}) {
    EXPECT_EQ(http(mesh_->admin_port, "GET", p).status, 200) << p;
    EXPECT_EQ(http(mesh_->ivy_port, "GET", p, "", kAuth).status, 404) << p;
  }
  EXPECT_EQ(http(mesh_->admin_port, "POST", "/v1/embeddings", "{}").status, 404);
  // The key is checked first (issue 14.5): without it an unknown path or a wrong method tells
  // nothing (401), with it they are 404 / 405.
  EXPECT_EQ(http(mesh_->ivy_port, "GET", "/no-such-route").status, 401);
  EXPECT_EQ(http(mesh_->ivy_port, "GET", "/no-such-route", "", kAuth).status, 404);
  EXPECT_EQ(http(mesh_->ivy_port, "GET", "/health").status, 401);
  EXPECT_EQ(http(mesh_->ivy_port, "GET", "/v1/embeddings").status, 401);
  EXPECT_EQ(http(mesh_->ivy_port, "GET", "/v1/embeddings", "", kAuth).status, 405);
}

// Bodies are JSON, and one reading of it (issue 14.5): a repeated key is refused naming it (the
// first copy used to win: 200), a form-encoded body is 415, and a lone surrogate names its field.
TEST_F(GatewayTest, RepeatedKeysNonJsonAndBadTextAreRefused) {
  auto dup = mesh_->post("/v1/embeddings", R"({"model":"tiny","model":"bad","input":"hi"})");
  EXPECT_EQ(dup.status, 400) << dup.body;
  EXPECT_EQ(errorParam(dup.body), "model");
  EXPECT_NE(dup.body.find("appears more than once"), std::string::npos) << dup.body;
  auto form = mesh_->post("/v1/embeddings", R"({"model":"tiny","input":"hi"})",
                          {{"Authorization", "Bearer sk-other"},
                           {"Content-Type", "application/x-www-form-urlencoded"}});
  EXPECT_EQ(form.status, 415) << form.body;
  auto text = mesh_->post("/tokenize", R"({"text":"\ud800"})");
  EXPECT_EQ(text.status, 400) << text.body;
  EXPECT_EQ(errorParam(text.body), "text");
  EXPECT_NE(text.body.find("lone UTF-16 surrogate"), std::string::npos) << text.body;
  auto ok = mesh_->post("/v1/embeddings", R"({"model":"tiny","input":"hi"})",
                        {{"Authorization", "Bearer sk-other"},
                         {"Content-Type", "application/json; charset=utf-8"}});
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_F(GatewayTest, LimitsNameTheirFlag) {
  std::string nine = R"({"model":"tiny","input":["a","b","c","d","e","f","g","h","i"]})";
  auto many = mesh_->post("/v1/embeddings", nine);
  EXPECT_EQ(many.status, 400);
  EXPECT_NE(many.body.find("--max-inputs"), std::string::npos) << many.body;
  EXPECT_EQ(errorParam(many.body), "input");

  // 8 inputs of 450 tokens each (the model's maximum is 512): over --max-request-tokens 2000.
  std::string words;
  for (int i = 0; i < 450; ++i) words += "garden ";
  std::string body = R"({"model":"tiny","input":[)";
  for (int i = 0; i < 8; ++i) body += (i ? ",\"" : "\"") + words + "\"";
  body += "]}";
  auto total = mesh_->post("/v1/embeddings", body);
  EXPECT_EQ(total.status, 400) << total.body;
  EXPECT_NE(total.body.find("--max-request-tokens"), std::string::npos) << total.body;

  auto docs = mesh_->post("/v1/score", R"({"model":"tiny","query":"q","documents":[]})");
  EXPECT_EQ(docs.status, 400);
  EXPECT_EQ(errorParam(docs.body), "documents");
}

TEST_F(GatewayTest, TenMegabyteStringIsRefusedFast) {
  std::string body = R"({"model":"tiny","input":")" + std::string(10u << 20, 'x') + "\"}";
  auto t0 = std::chrono::steady_clock::now();
  auto r = mesh_->post("/v1/embeddings", body);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  EXPECT_NE(r.body.find("--max-input-chars"), std::string::npos);
  std::printf("10 MB string refused in %lld ms (HTTP round trip incl. upload)\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  // Generous (a loaded 2-core CI machine): tokenizing 10 MB would take far longer.
  EXPECT_LT(took, 5s);
  // ivy's own handling time is in its log line for the request.
  auto big = mesh_->post("/v1/embeddings",
                         R"({"model":"tiny","input":")" + std::string(40u << 20, 'x') + "\"}");
  EXPECT_EQ(big.status, 413);
}

TEST_F(GatewayTest, RequestTimeoutHeader) {
  auto bad = mesh_->post("/v1/embeddings", R"({"model":"tiny","input":"hi"})",
                         {{"Authorization", "Bearer sk-gateway-test"},
                          {"x-request-timeout", "soon"}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(errorParam(bad.body), "x-request-timeout");
  // 4 inputs of ~450 tokens on the CPU model take well over a millisecond.
  std::string words;
  for (int i = 0; i < 450; ++i) words += "garden ";
  std::string body = R"({"model":"tiny","input":[)";
  for (int i = 0; i < 4; ++i) body += (i ? ",\"" : "\"") + words + std::to_string(i) + "\"";
  body += "]}";
  auto slow = mesh_->post("/v1/embeddings", body,
                          {{"Authorization", "Bearer sk-gateway-test"},
                           {"x-request-timeout", "0.001"}});
  EXPECT_EQ(slow.status, 504) << slow.body.substr(0, 300);
  auto fine = mesh_->post("/v1/embeddings", body,
                          {{"Authorization", "Bearer sk-gateway-test"},
                           {"x-request-timeout", "60"}});
  EXPECT_EQ(fine.status, 200) << fine.body.substr(0, 300);
}

TEST_F(GatewayTest, TimingHeadersArePresentAndConsistent) {
  auto check = [](HttpResponse& r) {
    ASSERT_EQ(r.status, 200) << r.body;
    auto num = [&](const char* h) -> uint64_t {
      EXPECT_TRUE(r.headers.count(h)) << h;
      return r.headers.count(h) ? std::stoull(r.headers[h]) : 0;
    };
    uint64_t tok = num("x-garden-tokenize-us"), q = num("x-garden-queue-us"),
             inf = num("x-garden-inference-us"), up = num("x-garden-upstream-us"),
             total = num("x-garden-total-us");
    EXPECT_GT(inf, 0u);
    EXPECT_GT(up, 0u);
    EXPECT_LE(q + inf, up + 1000) << "tulip's stages fit in ivy's upstream time";
    EXPECT_LE(tok + up, total + 1) << "tokenize + upstream fit in the total";
  };
  auto e = mesh_->post("/v1/embeddings", R"({"model":"tiny","input":["a b c","d e"]})");
  check(e);
  auto s = mesh_->post("/v1/score", R"({"model":"tiny","query":"q","documents":["a","b"]})");
  check(s);
}

// The generation routes go through the same pipeline: on an embedding model they are a 400 naming
// `model` and the kind (after authentication), not something tulip refuses.
TEST_F(GatewayTest, ChatRoutesRefuseAnEmbeddingModel) {
  auto unauth = mesh_->post("/v1/chat/completions",
                            R"({"model":"tiny","messages":[{"role":"user","content":"x"}]})", {});
  EXPECT_EQ(unauth.status, 401) << unauth.body;
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/chat/completions", R"({"model":"tiny","messages":[{"role":"user","content":"x"}]})"},
           {"/v1/completions", R"({"model":"tiny","prompt":"x"})"}}) {
    auto r = mesh_->post(path, body);
    EXPECT_EQ(r.status, 400) << path << ": " << r.body;
    EXPECT_EQ(errorParam(r.body), "model") << r.body;
    EXPECT_NE(r.body.find("'tiny' is an embedding model; " + path +
                          " needs a generative (llm) model"),
              std::string::npos)
        << r.body;
  }
}

TEST_F(GatewayTest, EmbeddingPromptsFromTheModelDir) {
  auto plain = mesh_->post(
      "/v1/embeddings",
      R"({"model":"tiny","input":"Instruct: find the garden\nQuery: where is the ivy"})");
  auto prompted = mesh_->post(
      "/v1/embeddings", R"({"model":"tiny","input":"where is the ivy","input_type":"query"})");
  ASSERT_EQ(plain.status, 200) << plain.body;
  ASSERT_EQ(prompted.status, 200) << prompted.body;
  simdjson::dom::parser p1, p2;
  simdjson::dom::element a = p1.parse(plain.body), b = p2.parse(prompted.body);
  EXPECT_EQ(uint64_t(a["usage"]["prompt_tokens"]), uint64_t(b["usage"]["prompt_tokens"]));
  auto va = a["data"].at(0)["embedding"].get_array();
  auto vb = b["data"].at(0)["embedding"].get_array();
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) {
    EXPECT_NEAR(double(va.at(i)), double(vb.at(i)), 1e-5) << i;
  }
  auto unknown = mesh_->post(
      "/v1/embeddings", R"({"model":"tiny","input":"x","prompt_name":"passage"})");
  EXPECT_EQ(unknown.status, 400);
  EXPECT_EQ(errorParam(unknown.body), "prompt_name");
}

TEST_F(GatewayTest, ScoreAndRerankEqualTulipScore) {
  const std::string query = "where does the ivy grow";
  const std::vector<std::string> docs = {"The ivy climbs the garden wall.",
                                         "Tulips bloom in spring.", "Roses need sun",
                                         "A scheduler batches tokens"};
  JsonWriter w;
  w.beginObject().field("model", "tiny").field("query", query).key("documents").beginArray();
  for (const auto& d : docs) w.value(d);
  w.endArray().endObject();
  std::string body = w.take();
  auto r = mesh_->post("/v1/score", body, {{"Authorization", "Bearer sk-gateway-test"},
                                          {"x-request-id", "gw-score-1"}});
  ASSERT_EQ(r.status, 200) << r.body;
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(r.body);
  std::vector<float> got;
  for (auto d : doc["data"].get_array()) got.push_back(float(double(d["score"])));
  ASSERT_EQ(got.size(), docs.size());

  // The same request straight to tulip, ids rendered by the reference tokenizer.
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(mesh_->tulip_port),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Tulip::NewStub(channel);
  v1::ScoreRequest req;
  req.set_model("tiny");
  req.set_yes_token(mesh_->yes_id);
  req.set_no_token(mesh_->no_id);
  uint64_t tokens = 0;
  for (const auto& d : docs) {
    std::vector<int32_t> ids = mesh_->encode(kPrefix);
    auto pair = mesh_->encode(std::string("<Instruct>: ") + kDefaultInstruction +
                              "\n<Query>: " + query + "\n<Document>: " + d);
    auto suffix = mesh_->encode(kSuffix);
    ids.insert(ids.end(), pair.begin(), pair.end());
    ids.insert(ids.end(), suffix.begin(), suffix.end());
    tokens += ids.size();
    req.add_inputs()->mutable_ids()->Add(ids.begin(), ids.end());
  }
  v1::ScoreResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  grpc::Status st = stub->Score(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(resp.scores_size(), int(docs.size()));
  EXPECT_EQ(uint64_t(doc["usage"]["prompt_tokens"]), tokens);
  for (size_t i = 0; i < docs.size(); ++i) {
    EXPECT_NEAR(got[i], resp.scores(int(i)), 1e-5) << i;
    EXPECT_GT(got[i], 0.f);
    EXPECT_LT(got[i], 1.f);
  }

  // Rerank: the same scores, sorted, cut to top_n, with the documents.
  JsonWriter w2;
  w2.beginObject().field("model", "tiny").field("query", query).key("documents").beginArray();
  for (const auto& d : docs) w2.value(d);
  w2.endArray().field("top_n", 3).field("return_documents", true).endObject();
  auto rr = mesh_->post("/v1/rerank", w2.take());
  ASSERT_EQ(rr.status, 200) << rr.body;
  simdjson::dom::parser p2;
  simdjson::dom::element rdoc = p2.parse(rr.body);
  float prev = 2.f;
  size_t n = 0;
  for (auto x : rdoc["results"].get_array()) {
    size_t i = size_t(int64_t(x["index"]));
    float s = float(double(x["relevance_score"]));
    ASSERT_LT(i, docs.size());
    EXPECT_NEAR(s, resp.scores(int(i)), 1e-5);
    EXPECT_LE(s, prev);
    EXPECT_EQ(std::string_view(x["document"]["text"]), docs[i]);
    prev = s;
    ++n;
  }
  EXPECT_EQ(n, 3u);
}

// One id through all three tiers: ivy's access line, tulip's request line, rose's batch line.
TEST_F(GatewayTest, RequestIdInAllThreeTiersLogs) {
  const std::string id = "gw-trace-" + std::to_string(getpid());
  auto r = mesh_->post("/v1/embeddings", R"({"model":"tiny","input":"trace me"})",
                       {{"Authorization", "Bearer sk-gateway-test"}, {"x-request-id", id}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["x-request-id"], id);
  auto lineWith = [&](const std::string& log, const std::string& svc) {
    size_t pos = 0;
    while ((pos = log.find(id, pos)) != std::string::npos) {
      size_t b = log.rfind('\n', pos);
      size_t e = log.find('\n', pos);
      std::string line = log.substr(b == std::string::npos ? 0 : b + 1,
                                    (e == std::string::npos ? log.size() : e) -
                                        (b == std::string::npos ? 0 : b + 1));
      if (line.find("\"svc\":\"" + svc + "\"") != std::string::npos) return true;
      pos += id.size();
    }
    return false;
  };
  bool ivy = false, tulip = false, rose = false;
  for (int i = 0; i < 300 && !(ivy && tulip && rose); ++i) {
    std::string ilog = mesh_->ivy->log(), tlog = mesh_->tulip->log();
    ivy = lineWith(ilog, "ivy");
    tulip = lineWith(tlog, "tulip");
    rose = lineWith(tlog, "rose");  // rose writes to tulip's output (its parent)
    if (!(ivy && tulip && rose)) std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(ivy) << mesh_->ivy->log();
  EXPECT_TRUE(tulip) << mesh_->tulip->log();
  EXPECT_TRUE(rose) << mesh_->tulip->log();

  // A bad id is replaced by a generated one, which is then what the tiers log.
  auto bad = mesh_->post("/v1/embeddings", R"({"model":"tiny","input":"x"})",
                         {{"Authorization", "Bearer sk-gateway-test"},
                          {"x-request-id", "bad id with spaces"}});
  ASSERT_EQ(bad.status, 200);
  EXPECT_EQ(bad.headers["x-request-id"].size(), 32u);
}

}  // namespace
}  // namespace garden
