// ivy's request pipeline (http/pipeline.h, IvyService::serveModel) across routes and model kinds:
// every route × every kind of served model (an embedding model, a reranker with a classification
// head, a generative LLM) answers either its success or a 400 naming `model` and the model's kind
// before anything reaches tulip, never a 5xx; and the order of the pipeline's refusals
// (admission, then the deadline header, then the model) is the same on every model route.
// Driven at the router level (no sockets) against a FakeTulipClient.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <simdjson.h>

#include <cstdlib>
#include <future>
#include <map>
#include <string>

#include "services/ivy/http/service.h"
#include "services/ivy/http/tokenize_routes.h"
#include "tests/fakes/ivy/fake_tulip_client.h"
#include "tests/fakes/ivy/harmony_fake_tokenizer.h"

namespace garden::ivy {
namespace {

using ::testing::HasSubstr;
using Method = FakeTulipClient::Method;

enum class Kind { kEmbedding, kReranker, kLlm };

std::string kindName(Kind k) {
  return k == Kind::kEmbedding ? "embedding" : k == Kind::kReranker ? "reranker" : "llm";
}

// How a refusal names the served model's kind (api/model_spec.h).
std::string kindPhrase(Kind k) {
  switch (k) {
    case Kind::kEmbedding:
      return "an embedding model";
    case Kind::kReranker:
      return "a reranker (classification-head) model";
    case Kind::kLlm:
      return "a generative (llm) model";
  }
  return "";
}

struct Answer {
  int status = 0;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string header(std::string_view k) const {
    for (const auto& [n, v] : headers) {
      if (n == k) return v;
    }
    return "";
  }
};

// One served model behind IvyService + the tokenize routes, as ivy's main() wires them. The
// embedding and reranker meshes use the tiny unigram tokenizer (its pieces 20/21 as yes/no), the
// LLM mesh the Harmony stand-in, as a real deployment pairs them.
class Mesh {
 public:
  explicit Mesh(Kind kind, IvyServiceOptions so = {}) {
    TulipModelInfo info;
    info.model = "up";
    info.kind = kind == Kind::kLlm ? "llm" : "embedding";
    info.hidden_size = 8;
    info.max_seq_len = 4096;
    info.vocab_size = kind == Kind::kLlm ? 201088 : 1000;
    info.has_score_head = kind == Kind::kReranker;
    if (kind == Kind::kLlm) info.eos_token_ids = {200002};
    client_.setModelInfo(info);
    spec_ = std::make_shared<const ModelSpec>(makeModelSpec(info, "m"));
    const Tokenizer* tok = &harmony_;
    if (kind != Kind::kLlm) {
      const char* src = std::getenv("GARDEN_SOURCE_DIR");
      auto t = loadTokenizer(std::string(src ? src : ".") +
                             "/tests/unit/ivy/api/testdata/tiny_unigram.model");
      EXPECT_TRUE(t.isOk()) << t.status().toString();
      unigram_ = std::move(t).value();
      tok = unigram_.get();
      so.score_yes_token = std::string(*unigram_->idToPiece(20));
      so.score_no_token = std::string(*unigram_->idToPiece(21));
    }
    so.tokenizer = tok;
    ModelSource model{[this] { return spec_; }, [] { return true; }};
    service_ = std::make_unique<IvyService>(so, &client_, model, nullptr, &registry_);
    service_->registerRoutes(&router_);
    registerTokenizeRoutes(&router_, tok, model.spec);
  }

  Answer call(const std::string& method, const std::string& path, const std::string& body,
              std::vector<std::pair<std::string, std::string>> headers = {}) {
    HttpRequest r;
    r.method = method;
    r.path = path;
    r.body = body;
    r.headers = std::move(headers);
    r.request_id = "rid";
    r.received = std::chrono::steady_clock::now();
    auto p = std::make_shared<std::promise<HttpResponse>>();
    auto f = p->get_future();
    router_.dispatch(std::move(r), [p](HttpResponse x) { p->set_value(std::move(x)); });
    Answer a;
    if (f.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      ADD_FAILURE() << path << ": no answer within 30 s";
      return a;
    }
    HttpResponse x = f.get();
    a.status = x.status;
    a.body = x.body;
    a.headers = x.headers;
    return a;
  }

  FakeTulipClient& client() { return client_; }
  metrics::Registry& registry() { return registry_; }

 private:
  FakeTulipClient client_;
  metrics::Registry registry_;
  testing::HarmonyFakeTokenizer harmony_;
  std::unique_ptr<Tokenizer> unigram_;
  std::shared_ptr<const ModelSpec> spec_;
  std::unique_ptr<IvyService> service_;
  Router router_;
};

struct RouteCase {
  std::string method, path, body;
  Method upstream;  // the tulip call it makes when served
  bool model_call;  // goes through the pipeline (else: tokenize, detokenize, models)
};

const RouteCase kRoutes[] = {
    {"POST", "/v1/embeddings", R"({"model":"m","input":[[1,2,3]]})", Method::kEmbed, true},
    {"POST", "/v1/score", R"({"model":"m","query":"q","documents":["d1","d2"]})", Method::kScore,
     true},
    {"POST", "/v1/rerank", R"({"model":"m","query":"q","documents":["d1","d2"],"top_n":1})",
     Method::kScore, true},
    {"POST", "/v1/chat/completions",
     R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2})",
     Method::kGenerate, true},
    {"POST", "/v1/completions", R"({"model":"m","prompt":[1,2],"max_tokens":2})",
     Method::kGenerate, true},
    {"POST", "/v1/responses", R"({"model":"m","input":"hi","max_output_tokens":2})",
     Method::kGenerate, true},
    {"POST", "/tokenize", R"({"model":"m","text":"hi"})", Method::kHealth, false},
    {"POST", "/detokenize", R"({"model":"m","tokens":[20,21]})", Method::kHealth, false},
    {"GET", "/v1/models", "", Method::kHealth, false},
};

// What each kind serves: the embedding routes on embedding models (with or without a
// classification head), generation on LLMs; tokenize, detokenize and models on all.
bool serves(Kind kind, const RouteCase& r) {
  if (!r.model_call) return true;
  const bool generate = r.upstream == Method::kGenerate;
  return generate == (kind == Kind::kLlm);
}

size_t upstreamCalls(FakeTulipClient& c, Method m) {
  switch (m) {
    case Method::kEmbed:
      return c.embedCalls().size();
    case Method::kScore:
      return c.scoreCalls().size();
    case Method::kGenerate:
      return c.generateCalls().size();
    default:
      return 0;
  }
}

TEST(PipelineMatrix, EveryRouteOnEveryModelKind) {
  for (Kind kind : {Kind::kEmbedding, Kind::kReranker, Kind::kLlm}) {
    Mesh mesh(kind);
    for (const RouteCase& r : kRoutes) {
      SCOPED_TRACE(kindName(kind) + " model, " + r.method + " " + r.path);
      const size_t before = upstreamCalls(mesh.client(), r.upstream);
      Answer a = mesh.call(r.method, r.path, r.body);
      if (serves(kind, r)) {
        EXPECT_EQ(a.status, 200) << a.body;
        if (r.model_call) {
          EXPECT_EQ(upstreamCalls(mesh.client(), r.upstream), before + 1);
          EXPECT_FALSE(a.header("x-garden-total-us").empty());
        }
        continue;
      }
      // Refused by name before anything is parsed or sent: 400 naming `model` and the kind.
      EXPECT_EQ(a.status, 400) << a.body;
      EXPECT_EQ(upstreamCalls(mesh.client(), r.upstream), before);
      simdjson::dom::parser p;
      simdjson::dom::element doc;
      ASSERT_FALSE(p.parse(a.body).get(doc)) << a.body;
      EXPECT_EQ(std::string_view(doc["error"]["param"]), "model");
      const std::string msg{std::string_view(doc["error"]["message"])};
      EXPECT_THAT(msg, HasSubstr("'m' is " + kindPhrase(kind) + "; "));
      EXPECT_THAT(msg, HasSubstr(r.path + " needs"));
    }
  }
}

TEST(PipelineMatrix, RerankerScoresWithItsHeadAndEmbeddingModelWithYesNo) {
  Mesh head(Kind::kReranker);
  ASSERT_EQ(head.call("POST", "/v1/score", R"({"model":"m","query":"q","documents":["d"]})").status,
            200);
  EXPECT_EQ(head.client().scoreCalls().at(0).yes_token, -1);
  Mesh plain(Kind::kEmbedding);
  ASSERT_EQ(
      plain.call("POST", "/v1/score", R"({"model":"m","query":"q","documents":["d"]})").status,
      200);
  EXPECT_EQ(plain.client().scoreCalls().at(0).yes_token, 20);
  EXPECT_EQ(plain.client().scoreCalls().at(0).no_token, 21);
}

// The same stages refuse in the same order on every model route: admission first (even a body
// that names the wrong kind of model costs nothing), then the deadline header, then the model.
TEST(PipelineOrder, AdmissionThenHeaderThenModelOnEveryRoute) {
  IvyServiceOptions so;
  so.max_inflight_requests = 1;
  Mesh mesh(Kind::kLlm, so);
  mesh.client().setHold(true);
  // One completions request held upstream keeps the single slot taken.
  std::thread first([&] {
    Answer a = mesh.call("POST", "/v1/completions", R"({"model":"m","prompt":[1],"max_tokens":1})");
    EXPECT_EQ(a.status, 200) << a.body;
  });
  for (int i = 0; i < 3000 && mesh.client().heldCount() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(mesh.client().heldCount(), 1u);
  for (const RouteCase& r : kRoutes) {
    if (!r.model_call) continue;
    SCOPED_TRACE(r.path);
    Answer a = mesh.call(r.method, r.path, r.body, {{"x-request-timeout", "bad"}});
    EXPECT_EQ(a.status, 429) << a.body;
    EXPECT_EQ(a.header("Retry-After"), "1");
    EXPECT_THAT(a.body, HasSubstr("--max-inflight-requests"));
  }
  mesh.client().setHold(false);
  mesh.client().releaseHeld();
  first.join();
  for (const RouteCase& r : kRoutes) {
    if (!r.model_call) continue;
    SCOPED_TRACE(r.path);
    Answer a = mesh.call(r.method, r.path, r.body, {{"x-request-timeout", "bad"}});
    EXPECT_EQ(a.status, 400) << a.body;
    EXPECT_THAT(a.body, HasSubstr("\"param\":\"x-request-timeout\""));
  }
  EXPECT_THAT(mesh.registry().expose(),
              HasSubstr("ivy_admission_rejected_total{limit=\"requests\"} 6"));
}

}  // namespace
}  // namespace garden::ivy
