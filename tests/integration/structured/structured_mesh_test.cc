// Structured outputs through the three real binaries on CPU: ivy -> tulip -> rose with a tiny
// random gpt-oss (rose-mkmodel) and the real o200k_harmony tokenizer. The weights are random, so
// without the grammar the answers would be garbage: every finished answer must parse and validate
// against its schema. `skip_reasoning` opens the final channel in the prompt, so the JSON starts
// at the first generated token (a random model would never write <|channel|>final itself; the
// channel trigger is covered by tests/unit/common/grammar).

#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

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
  int tulip_port = 0, ivy_port = 0, tulip_metrics_port = 0;
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
    m.tulip_metrics_port = testing::freePort();
    m.tulip = std::make_unique<testing::Process>(
        std::vector<std::string>{
            testing::binary("services/tulip/tulip"), "--host", "127.0.0.1", "--port",
            std::to_string(m.tulip_port), "--metrics-port", std::to_string(m.tulip_metrics_port),
            "--model", model, "--device",
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

// [TAG_TABLE_SHARING] tulip walks the generic JSON grammar's tables once at start, in the
// background, so schemas' free parts and json_object requests find them in the table cache.
TEST_F(StructuredMesh, TulipPreparesTheJsonTablesAtStart) {
  EXPECT_TRUE(testing::eventually(60s, [] {
    return g_mesh->tulip->log().find("structured outputs: JSON tables ready") != std::string::npos;
  })) << g_mesh->tulip->log();
}

// Every schema of the unit suite, one seed each: finished answers validate; a random model
// finishes most of them within 400 tokens. How many finish depends on the machine's floating
// point (the CPU backend's BLAS picks its kernels per CPU, so near-tied draws go either way): it
// met a 3/4 bound on earlier machines and gave 23 of 32 on an AMD EPYC dev box (2026-12-02, the
// same count before and after the strict-tools change). The bound guards against a grammar whose
// end cannot be reached (then almost none finish), not a rate: half.
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
  EXPECT_GE(finished * 2, total) << "too few answers finished within max_tokens";
}

// [TAG_MASK_POOL] tulip counts the masks it fills and the time it spends on them: a json_object
// answer of n tokens adds n masks (every sampled token of the final message is masked; the
// prompt's assistant header skips analysis, skip_reasoning), in at least one step, with a
// positive fill time.
TEST_F(StructuredMesh, TulipCountsItsMasks) {
  auto metric = [](const std::string& name) {
    auto r = testing::http(g_mesh->tulip_metrics_port, "GET", "/metrics", "", {}, 10s);
    EXPECT_EQ(r.status, 200);
    return testing::metricValue(r.body, name);
  };
  const double masks0 = metric("tulip_llm_masks_total");
  const double steps0 = metric("tulip_llm_masked_steps_total");
  const double secs0 = metric("tulip_llm_mask_fill_seconds_total");
  const double late0 = metric("tulip_llm_late_mask_steps_total");
  auto r = post(chatBody(R"({"type":"json_object"})", 3));
  ASSERT_EQ(r.status, 200) << r.body;
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  ASSERT_FALSE(p.parse(r.body).get(doc)) << r.body;
  uint64_t completion = 0;
  ASSERT_FALSE(doc["usage"]["completion_tokens"].get(completion)) << r.body;
  ASSERT_GT(completion, 0u);
  // The counters are published as steps complete; the answer is back, its steps are counted.
  EXPECT_TRUE(testing::eventually(10s, [&] {
    return metric("tulip_llm_masks_total") - masks0 >= static_cast<double>(completion);
  })) << "masks " << metric("tulip_llm_masks_total") - masks0 << " for " << completion
      << " tokens";
  EXPECT_GE(metric("tulip_llm_masked_steps_total") - steps0, 1.0);
  EXPECT_GT(metric("tulip_llm_mask_fill_seconds_total") - secs0, 0.0);
  // [TAG_LATE_MASKS] The CPU rose takes masks late and tulip plans steps ahead by default: the
  // constrained sequence went on from its placeholder with its masks handed over late.
  if (completion >= 2) {
    EXPECT_GE(metric("tulip_llm_late_mask_steps_total") - late0, 1.0);
  }
}

TEST_F(StructuredMesh, StreamedContentValidates) {
  const std::string schema = grammar::testing::schemaCases()[8].schema;  // person_strict
  const std::string rf =
      R"({"type":"json_schema","json_schema":{"name":"person","schema":)" + schema + "}}";
  // Whether one seed's answer ends within max_tokens depends on the machine's floating point (the
  // CPU BLAS's kernels, see EveryAnswerValidatesAgainstItsSchema): seeds in turn until one
  // finishes (on 2026-12-05's Intel VM seed 7 ran to the limit); every streamed answer must
  // parse, and the finished one's content must validate.
  std::string content, finish;
  for (int seed = 7; seed < 7 + 8 && finish != "stop"; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto r = post(chatBody(rf, seed, /*stream=*/true));
    ASSERT_EQ(r.status, 200) << r.body;
    content.clear();
    finish.clear();
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
    ASSERT_TRUE(finish == "stop" || finish == "length") << r.body;
  }
  ASSERT_EQ(finish, "stop") << "no streamed answer finished within max_tokens in 8 seeds";
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
      R"({"type":"json_schema","json_schema":{"name":"x","schema":{"type":"integer","multipleOf":3}}})";
  auto r = post(chatBody(rf, 1));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("response_format"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("multipleOf"), std::string::npos) << r.body;
  auto r2 = post(chatBody(R"({"type":"yaml"})", 1));
  EXPECT_EQ(r2.status, 400) << r2.body;
  EXPECT_NE(r2.body.find("response_format.type"), std::string::npos) << r2.body;
}

// Strict function tools [TAG_STRICT_TOOLS]: tool_choice names a strict tool, so the prompt ends
// in its call header and tulip's decoder constrains the arguments from the first generated token
// to <|call|>. Every finished call's arguments validate against the tool's parameters, over
// several object schemas of the unit suite and several seeds, on /v1/chat/completions and on
// /v1/responses. The same requests with strict: false give garbage (the random model).
struct ToolCallAnswer {
  std::string name, arguments, finish;
};

ToolCallAnswer parseToolCall(const std::string& body) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  ToolCallAnswer a;
  if (p.parse(body).get(doc)) {
    ADD_FAILURE() << "invalid JSON: " << body;
    return a;
  }
  std::string_view s;
  simdjson::dom::element choice = doc["choices"].at(0);
  if (!choice["finish_reason"].get_string().get(s)) a.finish = std::string(s);
  simdjson::dom::element call = choice["message"]["tool_calls"].at(0)["function"];
  if (!call["name"].get_string().get(s)) a.name = std::string(s);
  if (!call["arguments"].get_string().get(s)) a.arguments = std::string(s);
  return a;
}

std::string strictToolBody(const std::string& schema, int seed, bool strict) {
  return R"({"model":"gpt-oss-tiny","messages":[{"role":"user","content":"Call f."}],)"
         R"("temperature":1.0,"max_tokens":500,"seed":)" +
         std::to_string(seed) +
         R"(,"tools":[{"type":"function","function":{"name":"other","strict":true,"parameters":)"
         R"({"type":"object","properties":{"x":{"type":"boolean"}},"required":["x"]}}},)"
         R"({"type":"function","function":{"name":"f","description":"A test tool.","strict":)" +
         (strict ? "true" : "false") + R"(,"parameters":)" + schema +
         R"(}}],"tool_choice":{"type":"function","function":{"name":"f"}}})";
}

TEST_F(StructuredMesh, StrictToolCallArgumentsValidate) {
  const std::vector<std::string> names = {"person_strict", "optional_props", "extra_props_allowed",
                                          "deeply_nested", "defs_ref"};
  int finished = 0, total = 0;
  for (const auto& sc : grammar::testing::schemaCases()) {
    if (std::find(names.begin(), names.end(), sc.name) == names.end()) continue;
    SCOPED_TRACE(sc.name);
    grammar::testing::SchemaValidator val(sc.schema);
    for (int seed = 11; seed <= 12; ++seed) {
      auto r = post(strictToolBody(sc.schema, seed, /*strict=*/true));
      ASSERT_EQ(r.status, 200) << r.body;
      ToolCallAnswer a = parseToolCall(r.body);
      ++total;
      EXPECT_EQ(a.name, "f") << r.body;
      if (a.finish != "tool_calls") {
        EXPECT_EQ(a.finish, "length") << r.body;
        std::printf("%s seed %d: length\n", sc.name.c_str(), seed);
        continue;
      }
      ++finished;
      EXPECT_EQ(val.validate(a.arguments), "") << "arguments: " << a.arguments;
    }
  }
  ASSERT_EQ(total, 10) << "a schema of the list is missing from the unit suite";
  std::printf("strict tool calls: %d of %d finished, all finished ones validated\n", finished,
              total);
  // Open-ended schemas (extra keys of any JSON, nested arrays) let a random model run long. How
  // many finish depends on the machine's floating point (as in EveryAnswerValidatesAgainstItsSchema):
  // half or more on the AMD dev boxes, 4 of 10 on 2026-12-05's Intel VM with the gpt-oss CPU
  // GEMMs in 8-row calls [TAG_CPU_ROW_INVARIANT]. The bound guards against arguments whose end
  // cannot be reached (then none finish), not a rate: two.
  EXPECT_GE(finished, 2) << "too few calls finished within max_tokens";
}

TEST_F(StructuredMesh, NonStrictToolCallsOfTheRandomModelAreGarbage) {
  const std::string schema = grammar::testing::schemaCases()[8].schema;  // person_strict
  grammar::testing::SchemaValidator val(schema);
  for (int seed = 11; seed <= 13; ++seed) {
    auto r = post(strictToolBody(schema, seed, /*strict=*/false));
    ASSERT_EQ(r.status, 200) << r.body;
    ToolCallAnswer a = parseToolCall(r.body);
    EXPECT_EQ(a.name, "f") << r.body;
    EXPECT_NE(val.validate(a.arguments), "") << "unconstrained, yet valid: " << a.arguments;
  }
}

TEST_F(StructuredMesh, StrictFunctionToolOnResponsesValidates) {
  // /v1/responses has no seed; a bounded schema (no free strings: a boolean and an integer of
  // at most 18 digits) finishes within max_output_tokens whatever the draws.
  const std::string schema =
      R"({"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer"}},)"
      R"("required":["ok","n"],"additionalProperties":false})";
  grammar::testing::SchemaValidator val(schema);
  int finished = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string body =
        R"({"model":"gpt-oss-tiny","input":"Call f.","temperature":1.0,"max_output_tokens":300,)"
        R"("store":false,"tools":[{"type":"function","name":"f","strict":true,"parameters":)" +
        schema + R"(}],"tool_choice":{"type":"function","name":"f"}})";
    auto r = testing::http(g_mesh->ivy_port, "POST", "/v1/responses", body, {}, 300s);
    ASSERT_EQ(r.status, 200) << r.body;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    ASSERT_FALSE(p.parse(r.body).get(doc)) << r.body;
    std::string_view status, type, args;
    ASSERT_FALSE(doc["status"].get_string().get(status)) << r.body;
    ASSERT_FALSE(doc["output"].at(0)["type"].get_string().get(type)) << r.body;
    EXPECT_EQ(type, "function_call") << r.body;
    ASSERT_EQ(status, "completed") << r.body;
    ASSERT_FALSE(doc["output"].at(0)["arguments"].get_string().get(args)) << r.body;
    ++finished;
    EXPECT_EQ(val.validate(args), "") << "arguments: " << args;
  }
  EXPECT_EQ(finished, 2);
}

// /v1/responses text.format (json_schema at its top level) constrains the final message like
// chat's response_format; skip_reasoning (Garden's extension, passed through) opens it at once.
// The same bounded schema as above, so every answer finishes; the format is echoed.
TEST_F(StructuredMesh, ResponsesTextFormatValidates) {
  const std::string schema =
      R"({"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer"}},)"
      R"("required":["ok","n"],"additionalProperties":false})";
  grammar::testing::SchemaValidator val(schema);
  for (int i = 0; i < 2; ++i) {
    const std::string body =
        R"({"model":"gpt-oss-tiny","input":"Answer in JSON.","temperature":1.0,)"
        R"("max_output_tokens":300,"store":false,"skip_reasoning":true,)"
        R"("text":{"format":{"type":"json_schema","name":"answer","strict":true,"schema":)" +
        schema + "}}}";
    auto r = testing::http(g_mesh->ivy_port, "POST", "/v1/responses", body, {}, 300s);
    ASSERT_EQ(r.status, 200) << r.body;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    ASSERT_FALSE(p.parse(r.body).get(doc)) << r.body;
    std::string_view status, type, text, fmt;
    ASSERT_FALSE(doc["status"].get_string().get(status)) << r.body;
    ASSERT_EQ(status, "completed") << r.body;
    ASSERT_FALSE(doc["output"].at(0)["type"].get_string().get(type)) << r.body;
    ASSERT_EQ(type, "message") << r.body;
    ASSERT_FALSE(doc["output"].at(0)["content"].at(0)["text"].get_string().get(text)) << r.body;
    EXPECT_EQ(val.validate(text), "") << "text: " << text;
    ASSERT_FALSE(doc["text"]["format"]["type"].get_string().get(fmt)) << r.body;
    EXPECT_EQ(fmt, "json_schema");
  }
  auto bad = testing::http(g_mesh->ivy_port, "POST", "/v1/responses",
                           R"({"model":"gpt-oss-tiny","input":"x","text":{"format":)"
                           R"({"type":"json_schema","name":"a","schema":{"type":"integer",)"
                           R"("multipleOf":2}}}})",
                           {}, 60s);
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("text.format.schema"), std::string::npos) << bad.body;
}

TEST_F(StructuredMesh, StrictToolWithUnsupportedSchemaIs400) {
  auto r = post(strictToolBody(R"({"type":"object","properties":{"n":{"type":"integer",)"
                               R"("multipleOf":2}}})",
                               1, /*strict=*/true));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("tools[1].function.parameters"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("multipleOf"), std::string::npos) << r.body;
}

}  // namespace
}  // namespace garden
