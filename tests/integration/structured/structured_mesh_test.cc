// Structured outputs through the three real binaries on CPU: ivy -> tulip -> rose with a tiny
// random gpt-oss (rose-mkmodel) and the real o200k_harmony tokenizer. The weights are random, so
// without the grammar the answers would be garbage: every finished answer must parse and validate
// against its schema. `skip_reasoning` opens the final channel in the prompt, so the JSON starts
// at the first generated token (a random model would never write <|channel|>final itself; the
// channel trigger is covered by tests/unit/common/grammar).

#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>

#include "common/json_writer.h"
#include "tests/integration/support/harness.h"
#include "tests/unit/common/grammar/schema_validator.h"
#include "tests/unit/common/grammar/test_schemas.h"

namespace garden {
namespace {

using namespace std::chrono_literals;

struct Mesh {
  testing::TempDir dir;
  std::unique_ptr<testing::Process> tulip, ivy;
  int tulip_port = 0, ivy_port = 0;
  std::string error;
};
Mesh* g_mesh = nullptr;

class StructuredMesh : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_mesh = new Mesh;
    Mesh& m = *g_mesh;
    const std::string tok = testing::sourceDir() + "/tests/assets/tokenizers/gptoss/tokenizer.json";
    if (!std::ifstream(tok).good()) {
      m.error = "missing " + tok + " (tokenizer_assets fixture)";
      return;
    }
    const std::string model = m.dir.path() + "/gptoss";
    int rc = testing::run({testing::binary("services/rose/rose-mkmodel"), "--kind", "gpt-oss",
                           "--out", model, "--tokenizer-json", tok},
                          m.dir.path() + "/mkmodel.log");
    if (rc != 0) {
      m.error = "rose-mkmodel failed, see " + m.dir.path() + "/mkmodel.log";
      return;
    }
    m.tulip_port = testing::freePort();
    m.ivy_port = testing::freePort();
    m.tulip = std::make_unique<testing::Process>(
        std::vector<std::string>{
            testing::binary("services/tulip/tulip"), "--host", "127.0.0.1", "--port",
            std::to_string(m.tulip_port), "--metrics-port", "0", "--model", model, "--device",
            "cpu", "--rose-bin", testing::binary("services/rose/rose"), "--rose-threads", "2",
            "--shm-name",
            "/garden-structured-" + std::to_string(getpid()) + "-" + std::to_string(m.tulip_port),
            "--served-model-name", "gpt-oss-tiny",
            // A loaded CI host can stall a CPU step for seconds: not a stuck worker here.
            "--heartbeat-timeout-ms", "60000", "--progress-timeout-ms", "60000"},
        m.dir.path() + "/tulip.log");
    m.ivy = std::make_unique<testing::Process>(
        std::vector<std::string>{testing::binary("services/ivy/ivy"), "--host", "127.0.0.1",
                                 "--port", std::to_string(m.ivy_port), "--tulip",
                                 "127.0.0.1:" + std::to_string(m.tulip_port), "--tokenizer", tok,
                                 "--threads", "2"},
        m.dir.path() + "/ivy.log");
    if (!testing::waitForHttp(m.ivy_port, "/ready", 200, 240s)) {
      m.error = "mesh not ready in 240 s.\n--- tulip ---\n" + m.tulip->log() + "\n--- ivy ---\n" +
                m.ivy->log();
    }
  }
  static void TearDownTestSuite() {
    delete g_mesh;
    g_mesh = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(g_mesh->error.empty()) << g_mesh->error; }

  static testing::HttpResponse post(const std::string& body) {
    return testing::http(g_mesh->ivy_port, "POST", "/v1/chat/completions", body, {}, 300s);
  }

  static std::string chatBody(const std::string& response_format, int seed, bool stream = false) {
    return R"({"model":"gpt-oss-tiny","messages":[{"role":"user","content":"Answer in JSON."}],)"
           R"("temperature":1.0,"seed":)" +
           std::to_string(seed) + R"(,"max_tokens":400,"skip_reasoning":true,"stream":)" +
           (stream ? "true" : "false") + R"(,"response_format":)" + response_format + "}";
  }
};

struct Answer {
  std::string content, finish;
};

Answer parseAnswer(const std::string& body) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  Answer a;
  if (p.parse(body).get(doc)) {
    ADD_FAILURE() << "invalid JSON: " << body;
    return a;
  }
  std::string_view s;
  if (!doc["choices"].at(0)["message"]["content"].get_string().get(s)) a.content = std::string(s);
  if (!doc["choices"].at(0)["finish_reason"].get_string().get(s)) a.finish = std::string(s);
  return a;
}

// Every schema of the unit suite, one seed each: finished answers validate; a random model
// finishes most of them within 400 tokens.
TEST_F(StructuredMesh, EveryAnswerValidatesAgainstItsSchema) {
  int finished = 0, total = 0;
  for (const auto& sc : grammar::testing::schemaCases()) {
    SCOPED_TRACE(sc.name);
    std::string rf;
    if (sc.schema == "json_object") {
      rf = R"({"type":"json_object"})";
    } else {
      rf = R"({"type":"json_schema","json_schema":{"name":"answer","strict":true,"schema":)" +
           sc.schema + "}}";
    }
    grammar::testing::SchemaValidator val(sc.schema == "json_object" ? R"({"type":"object"})"
                                                                     : sc.schema);
    for (int seed = 1; seed <= 1; ++seed) {
      auto r = post(chatBody(rf, seed));
      ASSERT_EQ(r.status, 200) << r.body;
      Answer a = parseAnswer(r.body);
      ++total;
      if (a.finish != "stop") {
        EXPECT_EQ(a.finish, "length") << r.body;
        continue;
      }
      ++finished;
      EXPECT_EQ(val.validate(a.content), "") << "answer: " << a.content;
    }
  }
  std::printf("structured answers: %d of %d finished, all finished ones validated\n", finished,
              total);
  EXPECT_GE(finished * 4, total * 3) << "too few answers finished within max_tokens";
}

TEST_F(StructuredMesh, StreamedContentValidates) {
  const std::string schema = grammar::testing::schemaCases()[8].schema;  // person_strict
  const std::string rf =
      R"({"type":"json_schema","json_schema":{"name":"person","schema":)" + schema + "}}";
  auto r = post(chatBody(rf, 7, /*stream=*/true));
  ASSERT_EQ(r.status, 200) << r.body;
  std::string content, finish;
  size_t pos = 0;
  simdjson::dom::parser p;
  while ((pos = r.body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r.body.find("\n\n", pos);
    const std::string data = r.body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") break;
    simdjson::dom::element ev;
    ASSERT_FALSE(p.parse(data).get(ev)) << data;
    std::string_view s;
    if (!ev["choices"].at(0)["delta"]["content"].get_string().get(s)) content += s;
    if (!ev["choices"].at(0)["finish_reason"].get_string().get(s)) finish = std::string(s);
  }
  ASSERT_EQ(finish, "stop") << r.body;
  grammar::testing::SchemaValidator val(schema);
  EXPECT_EQ(val.validate(content), "") << content;
}

// response_format together with the sampler state [TAG_TOKEN_MASK] [TAG_LLM_SAMPLER_STATE]:
// logit_bias (+100 on a token the grammar mostly forbids), the three penalties, min_p and
// logprobs on one request. The mask applies after bias and penalties, so finished answers still
// validate; logprobs come back for every content token with 3 alternatives each.
TEST_F(StructuredMesh, CombinesWithBiasPenaltiesAndLogprobs) {
  const std::string schema = grammar::testing::schemaCases()[8].schema;  // person_strict
  const std::string rf =
      R"({"type":"json_schema","json_schema":{"name":"person","strict":true,"schema":)" + schema +
      "}}";
  grammar::testing::SchemaValidator val(schema);
  int finished = 0;
  for (int seed = 3; seed <= 5; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::string body = chatBody(rf, seed);
    body.pop_back();  // the closing brace
    body += R"(,"logit_bias":{"12345":100,"400":-50},"frequency_penalty":0.5,)"
            R"("presence_penalty":0.3,"repetition_penalty":1.1,"min_p":0.02,"logprobs":true,)"
            R"("top_logprobs":3})";
    auto r = post(body);
    ASSERT_EQ(r.status, 200) << r.body;
    Answer a = parseAnswer(r.body);
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    ASSERT_FALSE(p.parse(r.body).get(doc)) << r.body;
    simdjson::dom::array content;
    ASSERT_FALSE(doc["choices"].at(0)["logprobs"]["content"].get_array().get(content)) << r.body;
    size_t n = 0;
    for (simdjson::dom::element e : content) {
      double lp = 1;
      ASSERT_FALSE(e["logprob"].get_double().get(lp)) << r.body;
      EXPECT_LE(lp, 0.0);
      simdjson::dom::array top;
      ASSERT_FALSE(e["top_logprobs"].get_array().get(top)) << r.body;
      EXPECT_EQ(top.size(), 3u);
      ++n;
    }
    EXPECT_GT(n, 0u) << r.body;
    if (a.finish != "stop") {
      EXPECT_EQ(a.finish, "length") << r.body;
      continue;
    }
    ++finished;
    EXPECT_EQ(val.validate(a.content), "") << "answer: " << a.content;
  }
  EXPECT_GE(finished, 1) << "no answer finished within max_tokens";
}

TEST_F(StructuredMesh, UnsupportedSchemaIs400NamingResponseFormat) {
  const std::string rf =
      R"({"type":"json_schema","json_schema":{"name":"x","schema":{"type":"integer","minimum":3}}})";
  auto r = post(chatBody(rf, 1));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("response_format"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("minimum"), std::string::npos) << r.body;
  auto r2 = post(chatBody(R"({"type":"yaml"})", 1));
  EXPECT_EQ(r2.status, 400) << r2.body;
  EXPECT_NE(r2.body.find("response_format.type"), std::string::npos) << r2.body;
}

}  // namespace
}  // namespace garden
