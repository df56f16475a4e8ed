// /v1/chat/completions through the real routes, Harmony parser and output mapping, with a
// scripted generate client and the Harmony fake tokenizer (no sockets: see chat_harness.h).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "services/ivy/harmony/tokens.h"
#include "tests/unit/ivy/chat/chat_harness.h"

namespace garden::ivy::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kWeatherTool =
    R"({"type":"function","function":{"name":"get_weather","description":"Weather in a city",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}})";

std::string chatBody(const std::string& extra = "") {
  std::string b = R"({"model":"gpt-test","messages":[{"role":"user","content":"Hi"}])";
  if (!extra.empty()) b += "," + extra;
  return b + "}";
}

// What a client assembles from the stream (or reads from the full response).
struct Message {
  std::string reasoning;
  std::string content;
  bool content_null = false;
  struct Call {
    std::string id, type, name, arguments;
    bool operator==(const Call&) const = default;
  };
  std::vector<Call> calls;
  std::string finish_reason;
  int64_t prompt_tokens = -1, completion_tokens = -1, total_tokens = -1, cached = -1;
};

void readUsage(simdjson::dom::element u, Message* m) {
  EXPECT_FALSE(u["prompt_tokens"].get(m->prompt_tokens));
  EXPECT_FALSE(u["completion_tokens"].get(m->completion_tokens));
  EXPECT_FALSE(u["total_tokens"].get(m->total_tokens));
  EXPECT_FALSE(u["prompt_tokens_details"]["cached_tokens"].get(m->cached));
}

Message fromResponse(const std::string& body) {
  Json j(body);
  Message m;
  EXPECT_EQ(str(j.root["object"]), "chat.completion");
  simdjson::dom::element msg = j.root["choices"].at(0)["message"];
  EXPECT_EQ(str(msg["role"]), "assistant");
  simdjson::dom::element c;
  if (!msg["content"].get(c)) {
    if (c.is_null())
      m.content_null = true;
    else
      m.content = str(c);
  }
  simdjson::dom::element r;
  if (!msg["reasoning_content"].get(r)) m.reasoning = str(r);
  simdjson::dom::array calls;
  if (!msg["tool_calls"].get(calls)) {
    for (auto call : calls) {
      m.calls.push_back({str(call["id"]), str(call["type"]), str(call["function"]["name"]),
                         str(call["function"]["arguments"])});
    }
  }
  m.finish_reason = str(j.root["choices"].at(0)["finish_reason"]);
  readUsage(j.root["usage"], &m);
  return m;
}

Message fromStream(const std::string& body, bool expect_usage_chunk) {
  bool done = false;
  std::vector<std::string> events = sseEvents(body, &done);
  EXPECT_TRUE(done) << "no [DONE]";
  Message m;
  std::map<int64_t, Message::Call> calls;
  bool saw_role = false, saw_usage = false;
  for (size_t i = 0; i < events.size(); ++i) {
    Json j(events[i]);
    EXPECT_EQ(str(j.root["object"]), "chat.completion.chunk");
    simdjson::dom::array choices;
    EXPECT_FALSE(j.root["choices"].get(choices));
    if (choices.size() == 0) {  // the usage chunk: last before [DONE]
      EXPECT_EQ(i + 1, events.size());
      readUsage(j.root["usage"], &m);
      saw_usage = true;
      continue;
    }
    simdjson::dom::element ch = choices.at(0);
    simdjson::dom::element delta = ch["delta"];
    std::string_view role;
    if (!delta["role"].get(role)) {
      EXPECT_EQ(i, 0u) << "role delta must come first";
      EXPECT_EQ(role, "assistant");
      saw_role = true;
    } else {
      EXPECT_TRUE(saw_role);
    }
    simdjson::dom::element v;
    if (!delta["reasoning_content"].get(v)) m.reasoning += str(v);
    if (!delta["content"].get(v)) m.content += str(v);
    simdjson::dom::array tcs;
    if (!delta["tool_calls"].get(tcs)) {
      for (auto tc : tcs) {
        int64_t index = -1;
        EXPECT_FALSE(tc["index"].get(index));
        auto& call = calls[index];
        std::string_view s;
        if (!tc["id"].get(s)) {
          EXPECT_TRUE(call.id.empty()) << "id sent twice";
          call.id = std::string(s);
          EXPECT_FALSE(tc["function"]["name"].get(s)) << "name must come with the id";
        }
        if (!tc["type"].get(s)) call.type = std::string(s);
        if (!tc["function"]["name"].get(s)) call.name = std::string(s);
        if (!tc["function"]["arguments"].get(s)) call.arguments += std::string(s);
      }
    }
    simdjson::dom::element fr = ch["finish_reason"];
    if (!fr.is_null()) {
      EXPECT_TRUE(m.finish_reason.empty()) << "two finish chunks";
      m.finish_reason = str(fr);
    }
  }
  EXPECT_EQ(saw_usage, expect_usage_chunk);
  for (auto& [i, c] : calls) m.calls.push_back(c);
  return m;
}

struct Both {
  Message full, streamed;
};

// The same request (same script) non-streaming and streaming.
Both runBoth(ChatHarness& h, const std::string& extra_fields) {
  Both b;
  std::string sep = extra_fields.empty() ? "" : ",";
  Captured full = h.post("/v1/chat/completions", chatBody(extra_fields));
  EXPECT_EQ(full.status, 200) << full.body;
  EXPECT_FALSE(full.streamed);
  b.full = fromResponse(full.body);
  Captured st = h.post(
      "/v1/chat/completions",
      chatBody(extra_fields + sep + R"("stream":true,"stream_options":{"include_usage":true})"));
  EXPECT_EQ(st.status, 200) << st.body;
  EXPECT_TRUE(st.streamed);
  EXPECT_EQ(st.content_type, "text/event-stream");
  b.streamed = fromStream(st.body, true);
  return b;
}

void expectSame(const Both& b) {
  EXPECT_EQ(b.full.reasoning, b.streamed.reasoning);
  EXPECT_EQ(b.full.content, b.streamed.content);
  EXPECT_EQ(b.full.calls, b.streamed.calls);
  EXPECT_EQ(b.full.finish_reason, b.streamed.finish_reason);
  EXPECT_EQ(b.full.prompt_tokens, b.streamed.prompt_tokens);
  EXPECT_EQ(b.full.completion_tokens, b.streamed.completion_tokens);
  EXPECT_EQ(b.full.total_tokens, b.streamed.total_tokens);
  EXPECT_EQ(b.full.cached, b.streamed.cached);
}

TEST(ChatTest, ReasoningAndContentIdenticalStreamingAndNot) {
  ChatHarness h;
  auto script = h.ids(
      "<|channel|>analysis<|message|>User says hi. Reply.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>Hello world!<|return|>");
  h.client().setScript(script);
  h.client().setCachedTokens(7);
  Both b = runBoth(h, "");
  EXPECT_EQ(b.full.reasoning, "User says hi. Reply.");
  EXPECT_EQ(b.full.content, "Hello world!");
  EXPECT_TRUE(b.full.calls.empty());
  EXPECT_EQ(b.full.finish_reason, "stop");
  EXPECT_EQ(b.full.completion_tokens, static_cast<int64_t>(script.size()));
  EXPECT_EQ(b.full.cached, 7);
  EXPECT_GT(b.full.prompt_tokens, 10);
  EXPECT_EQ(b.full.total_tokens, b.full.prompt_tokens + b.full.completion_tokens);
  expectSame(b);

  // What ivy asked tulip for: the Harmony prompt, the Harmony stop ids plus eos, the sampling.
  auto calls = h.client().calls();
  ASSERT_EQ(calls.size(), 2u);
  const GenerateCall& c = calls[0];
  EXPECT_EQ(c.model, "fake-llm");
  std::string prompt = h.decode(c.prompt_ids);
  EXPECT_THAT(prompt, HasSubstr("<|start|>user<|message|>Hi<|end|>"));
  EXPECT_TRUE(prompt.ends_with("<|start|>assistant")) << prompt;
  EXPECT_EQ(c.stop_token_ids, (std::vector<int32_t>{200002, 200012, 199999}));
  EXPECT_EQ(c.max_tokens, 4096u - c.prompt_ids.size());
  EXPECT_EQ(b.full.prompt_tokens, static_cast<int64_t>(c.prompt_ids.size()));
}

// Structured outputs [TAG_TOKEN_MASK]: the grammar and its Harmony trigger reach tulip, and the
// developer message carries the "# Response Formats" section.
TEST(ChatTest, ResponseFormatReachesTulipAsAConstraint) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>{\"a\":1}<|return|>"));
  Captured r = h.post(
      "/v1/chat/completions",
      chatBody(R"("response_format":{"type":"json_schema","json_schema":{"name":"thing",)"
               R"("description":"A thing.","schema":{"type":"object","properties":{"a":)"
               R"({"type":"integer"}},"required":["a"],"additionalProperties":false}}})"));
  ASSERT_EQ(r.status, 200) << r.body;
  auto c = h.client().calls().at(0);
  EXPECT_FALSE(c.constraint.grammar.empty());
  EXPECT_EQ(c.constraint.channel_token, 200005);  // <|channel|>
  EXPECT_EQ(h.decode(c.constraint.channel_prefix), "final");
  EXPECT_EQ(c.constraint.message_token, 200008);  // <|message|>
  EXPECT_EQ(c.constraint.end_tokens, (std::vector<int32_t>{200002}));
  const std::string prompt = h.decode(c.prompt_ids);
  EXPECT_THAT(prompt, HasSubstr("<|start|>developer<|message|># Response Formats\n\n## thing\n\n"
                                "// A thing.\n{\"type\":\"object\""))
      << prompt;
  EXPECT_TRUE(prompt.ends_with("<|start|>assistant")) << prompt;
  // json_object: a grammar, no schema section; skip_reasoning: the prompt opens the final
  // message and the grammar applies from the first token.
  Captured r2 = h.post("/v1/chat/completions",
                       chatBody(R"("response_format":{"type":"json_object"},"skip_reasoning":true)"));
  ASSERT_EQ(r2.status, 200) << r2.body;
  auto c2 = h.client().calls().at(1);
  EXPECT_FALSE(c2.constraint.grammar.empty());
  EXPECT_NE(c2.constraint.grammar, c.constraint.grammar);
  EXPECT_EQ(c2.constraint.channel_token, -1);
  const std::string prompt2 = h.decode(c2.prompt_ids);
  EXPECT_THAT(prompt2, Not(HasSubstr("# Response Formats")));
  EXPECT_TRUE(prompt2.ends_with("<|start|>assistant<|channel|>final<|message|>")) << prompt2;
  // No response_format: no constraint.
  Captured r3 = h.post("/v1/chat/completions", chatBody(""));
  ASSERT_EQ(r3.status, 200) << r3.body;
  EXPECT_TRUE(h.client().calls().at(2).constraint.grammar.empty());
}

// Strict function tools [TAG_STRICT_TOOLS]: each strict tool's parameters grammar reaches tulip
// with the Harmony ids the decoder follows messages by; a forced tool_choice's header is the
// decoder's turn prefix. Non-strict tools add nothing; tool_choice "none" constrains nothing.
TEST(ChatTest, StrictToolsReachTulipAsToolGrammars) {
  ChatHarness h;
  h.client().setScript(h.ids("{\"city\":\"Oslo\"}<|call|>"));
  const std::string strict_weather =
      R"({"type":"function","function":{"name":"get_weather","strict":true,"parameters":)"
      R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"],)"
      R"("additionalProperties":false}}})";
  const std::string loose =
      R"({"type":"function","function":{"name":"lookup","strict":false,"parameters":)"
      R"({"type":"object","properties":{"q":{"type":"string","minLength":2,"maximum":3}}}}})";
  const std::string no_params =
      R"({"type":"function","function":{"name":"ping","strict":true}})";
  Captured r = h.post(
      "/v1/chat/completions",
      chatBody(R"("tools":[)" + loose + "," + strict_weather + "," + no_params +
               R"(],"tool_choice":{"type":"function","function":{"name":"get_weather"}})"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.body, HasSubstr(R"(\"city\":\"Oslo\")"));
  auto c = h.client().calls().at(0);
  EXPECT_TRUE(c.constraint.grammar.empty());  // no response_format
  ASSERT_EQ(c.constraint.tools.size(), 2u);
  EXPECT_EQ(c.constraint.tools[0].name, "get_weather");
  EXPECT_EQ(c.constraint.tools[1].name, "ping");
  EXPECT_FALSE(c.constraint.tools[0].grammar.empty());
  EXPECT_NE(c.constraint.tools[0].grammar, c.constraint.tools[1].grammar);
  EXPECT_EQ(c.constraint.harmony.start, 200006);
  EXPECT_EQ(c.constraint.harmony.channel, 200005);
  EXPECT_EQ(c.constraint.harmony.constrain, 200003);
  EXPECT_EQ(c.constraint.harmony.message, 200008);
  EXPECT_EQ(c.constraint.harmony.end, 200007);
  EXPECT_EQ(c.constraint.harmony.call, 200012);
  EXPECT_EQ(c.constraint.harmony.ret, 200002);
  EXPECT_EQ(c.constraint.harmony.end_of_text, 199999);
  EXPECT_EQ(h.decode(c.constraint.turn_prefix),
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
  // The same grammar as the same schema in response_format (one compiler, one cache).
  Captured rf = h.post(
      "/v1/chat/completions",
      chatBody(R"("response_format":{"type":"json_schema","json_schema":{"name":"w","schema":)"
               R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"],)"
               R"("additionalProperties":false}}})"));
  ASSERT_EQ(rf.status, 200) << rf.body;
  auto c_rf = h.client().calls().at(1);
  EXPECT_EQ(c_rf.constraint.grammar, c.constraint.tools[0].grammar);
  EXPECT_TRUE(c_rf.constraint.tools.empty());
  // auto: no prefix; strict and response_format together.
  Captured both = h.post(
      "/v1/chat/completions",
      chatBody(R"("tools":[)" + strict_weather +
               R"(],"response_format":{"type":"json_object"})"));
  ASSERT_EQ(both.status, 200) << both.body;
  auto c_both = h.client().calls().at(2);
  EXPECT_FALSE(c_both.constraint.grammar.empty());
  ASSERT_EQ(c_both.constraint.tools.size(), 1u);
  EXPECT_TRUE(c_both.constraint.turn_prefix.empty());
  // Only non-strict tools, or tool_choice "none": no constraint at all.
  Captured plain = h.post("/v1/chat/completions", chatBody(R"("tools":[)" + loose + "]"));
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_TRUE(h.client().calls().at(3).constraint.tools.empty());
  EXPECT_TRUE(h.client().calls().at(3).constraint.grammar.empty());
  Captured none = h.post("/v1/chat/completions",
                         chatBody(R"("tools":[)" + strict_weather + R"(],"tool_choice":"none")"));
  ASSERT_EQ(none.status, 200) << none.body;
  EXPECT_TRUE(h.client().calls().at(4).constraint.tools.empty());
}

// [TAG_STRICT_TOOLS] validation: strict must be a boolean; a strict tool's schema must compile
// (the reason is the compiler's); a non-strict tool's schema is not compiled.
TEST(ChatTest, StrictToolErrorsNameTheField) {
  ChatHarness h;
  struct Case {
    std::string tools, message_prefix;
  };
  const std::vector<Case> cases = {
      {R"([{"type":"function","function":{"name":"f","strict":"yes"}}])",
       "tools[0].function.strict: must be a boolean"},
      {R"([{"type":"function","function":{"name":"f","strict":1}}])",
       "tools[0].function.strict: must be a boolean"},
      {R"([{"type":"function","function":{"name":"f"}},{"type":"function","function":)"
       R"({"name":"g","strict":true,"parameters":{"type":"object","properties":)"
       R"({"n":{"type":"integer","multipleOf":2}}}}}])",
       "tools[1].function.parameters: schema #/properties/n: unsupported keyword 'multipleOf'"},
      {R"([{"type":"function","function":{"name":"f","strict":true,"parameters":)"
       R"({"$ref":"#/$defs/missing"}}}])",
       "tools[0].function.parameters: "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tools);
    Captured r = h.post("/v1/chat/completions", chatBody(R"("tools":)" + c.tools));
    ASSERT_EQ(r.status, 400) << r.body;
    Json j(r.body);
    EXPECT_EQ(str(j.root["error"]["param"]), "tools") << r.body;
    EXPECT_EQ(str(j.root["error"]["message"]).rfind(c.message_prefix, 0), 0u) << r.body;
  }
  EXPECT_TRUE(h.client().calls().empty());
  // strict: false / null with the same schema: accepted, nothing constrained.
  for (const char* strict : {"false", "null"}) {
    h.client().setScript(h.ids("<|channel|>final<|message|>ok<|return|>"));
    Captured r = h.post(
        "/v1/chat/completions",
        chatBody(std::string(R"("tools":[{"type":"function","function":{"name":"g","strict":)") +
                 strict +
                 R"(,"parameters":{"type":"object","properties":{"n":{"type":"integer",)"
                 R"("multipleOf":2}}}}}])"));
    EXPECT_EQ(r.status, 200) << r.body;
  }
  ASSERT_EQ(h.client().calls().size(), 2u);
  EXPECT_TRUE(h.client().calls()[0].constraint.tools.empty());
}

// response_format together with every sampler-state field [TAG_TOKEN_MASK]
// [TAG_LLM_SAMPLER_STATE]: both reach tulip on the same call (the grammar as the constraint, the
// rest as sampling parameters), neither displaces the other.
TEST(ChatTest, ResponseFormatCombinesWithSamplerFields) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>{\"a\":1}<|return|>"));
  Captured r = h.post(
      "/v1/chat/completions",
      chatBody(R"("response_format":{"type":"json_schema","json_schema":{"name":"t","strict":true,)"
               R"("schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],)"
               R"("additionalProperties":false}}},"logit_bias":{"42":5,"7":-100},)"
               R"("presence_penalty":0.25,"frequency_penalty":0.5,"repetition_penalty":1.1,)"
               R"("min_p":0.05,"logprobs":true,"top_logprobs":2,"temperature":0.7,"seed":3)"));
  ASSERT_EQ(r.status, 200) << r.body;
  auto c = h.client().calls().at(0);
  EXPECT_FALSE(c.constraint.grammar.empty());
  EXPECT_EQ(c.constraint.end_tokens, (std::vector<int32_t>{200002}));
  EXPECT_EQ(c.logit_bias, (std::vector<std::pair<int32_t, float>>{{42, 5.f}, {7, -100.f}}));
  EXPECT_FLOAT_EQ(c.presence_penalty, 0.25f);
  EXPECT_FLOAT_EQ(c.frequency_penalty, 0.5f);
  EXPECT_FLOAT_EQ(c.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(c.min_p, 0.05f);
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(c.top_logprobs, 2u);
  EXPECT_FLOAT_EQ(c.temperature, 0.7f);
}

TEST(ChatTest, SamplingFieldsReachTulip) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>ok<|return|>"));
  Captured r = h.post("/v1/chat/completions",
                      chatBody(R"("temperature":0.5,"top_p":0.9,"top_k":40,"seed":42,)"
                               R"("max_completion_tokens":100,"max_tokens":7,"user":"u1","n":1,)"
                               R"("presence_penalty":0,"frequency_penalty":0,"logit_bias":{},)"
                               R"("response_format":{"type":"text"},"logprobs":false)"));
  ASSERT_EQ(r.status, 200) << r.body;
  auto c = h.client().calls().at(0);
  EXPECT_FLOAT_EQ(c.temperature, 0.5f);
  EXPECT_FLOAT_EQ(c.top_p, 0.9f);
  EXPECT_EQ(c.top_k, 40);
  EXPECT_TRUE(c.has_seed);
  EXPECT_EQ(c.seed, 42u);
  EXPECT_EQ(c.max_tokens, 100u);  // max_completion_tokens wins over max_tokens
  EXPECT_EQ(c.request_id, "req-1");
}

TEST(ChatTest, ToolCallIdenticalStreamingAndNot) {
  ChatHarness h;
  h.client().setScript(
      h.ids("<|channel|>analysis<|message|>Need weather.<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
            "<|message|>{\"city\":\"Paris\"}<|call|>"));
  Both b = runBoth(h, std::string(R"("tools":[)") + kWeatherTool + "]");
  ASSERT_EQ(b.full.calls.size(), 1u);
  EXPECT_EQ(b.full.calls[0],
            (Message::Call{"call_test_0", "function", "get_weather", "{\"city\":\"Paris\"}"}));
  EXPECT_TRUE(b.full.content_null);
  EXPECT_EQ(b.full.reasoning, "Need weather.");
  EXPECT_EQ(b.full.finish_reason, "tool_calls");
  expectSame(b);
  // The tools were offered in the prompt.
  EXPECT_THAT(h.decode(h.client().calls()[0].prompt_ids), HasSubstr("get_weather"));
}

TEST(ChatTest, ToolChoiceNamedForcesTheCall) {
  ChatHarness h;
  // The model's turn starts inside the call: it only writes the arguments.
  h.client().setScript(h.ids("{\"city\":\"Oslo\"}<|call|>"));
  Both b =
      runBoth(h, std::string(R"("tools":[)") + kWeatherTool +
                     R"(],"tool_choice":{"type":"function","function":{"name":"get_weather"}})");
  ASSERT_EQ(b.full.calls.size(), 1u);
  EXPECT_EQ(b.full.calls[0].name, "get_weather");
  EXPECT_EQ(b.full.calls[0].arguments, "{\"city\":\"Oslo\"}");
  EXPECT_EQ(b.full.finish_reason, "tool_calls");
  EXPECT_EQ(b.full.reasoning, "");
  expectSame(b);
  std::string prompt = h.decode(h.client().calls()[0].prompt_ids);
  EXPECT_TRUE(prompt.ends_with(
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
      "<|message|>"))
      << prompt;
}

TEST(ChatTest, ToolChoiceRequiredWithOneToolForcesThatTool) {
  ChatHarness h;
  h.client().setScript(h.ids("{\"city\":\"Lima\"}<|call|>"));
  Both b = runBoth(h, std::string(R"("tools":[)") + kWeatherTool + R"(],"tool_choice":"required")");
  ASSERT_EQ(b.full.calls.size(), 1u);
  EXPECT_EQ(b.full.calls[0].name, "get_weather");
  EXPECT_EQ(b.full.calls[0].arguments, "{\"city\":\"Lima\"}");
  expectSame(b);
  EXPECT_TRUE(h.decode(h.client().calls()[0].prompt_ids)
                  .ends_with("to=functions.get_weather <|constrain|>json<|message|>"));
}

TEST(ChatTest, ToolChoiceRequiredLetsTheModelNameTheFunction) {
  ChatHarness h;
  h.client().setScript(h.ids("get_weather <|constrain|>json<|message|>{}<|call|>"));
  const std::string other =
      R"({"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}})";
  Both b = runBoth(h, std::string(R"("tools":[)") + kWeatherTool + "," + other +
                          R"(],"tool_choice":"required")");
  ASSERT_EQ(b.full.calls.size(), 1u);
  EXPECT_EQ(b.full.calls[0].name, "get_weather");
  EXPECT_EQ(b.full.calls[0].arguments, "{}");
  EXPECT_EQ(b.full.finish_reason, "tool_calls");
  expectSame(b);
  EXPECT_TRUE(h.decode(h.client().calls()[0].prompt_ids)
                  .ends_with("<|start|>assistant<|channel|>commentary to=functions."));
}

TEST(ChatTest, ToolChoiceNoneHidesToolsAndSuppressesCalls) {
  ChatHarness h;
  // The model calls anyway: the call is not exposed; its text lands in reasoning.
  h.client().setScript(
      h.ids("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":"
            "\"Rome\"}<|call|>"));
  Both b = runBoth(h, std::string(R"("tools":[)") + kWeatherTool + R"(],"tool_choice":"none")");
  EXPECT_TRUE(b.full.calls.empty());
  EXPECT_EQ(b.full.finish_reason, "stop");
  EXPECT_EQ(b.full.content, "");
  EXPECT_FALSE(b.full.content_null);
  EXPECT_EQ(b.full.reasoning, "{\"city\":\"Rome\"}");
  expectSame(b);
  EXPECT_THAT(h.decode(h.client().calls()[0].prompt_ids), Not(HasSubstr("get_weather")));
}

TEST(ChatTest, ToolResultRoundTripRendersTheHistory) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>It is sunny.<|return|>"));
  std::string body = std::string(R"({"model":"gpt-test","tools":[)") + kWeatherTool +
                     R"(],"messages":[{"role":"user","content":"Weather in Paris?"},)"
                     R"({"role":"assistant","reasoning_content":"Need weather.","tool_calls":[)"
                     R"({"id":"call_a","type":"function","function":{"name":"get_weather",)"
                     R"("arguments":"{\"city\":\"Paris\"}"}}]},)"
                     R"({"role":"tool","tool_call_id":"call_a","content":"sunny, 21C"}]})";
  Captured r = h.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  Message m = fromResponse(r.body);
  EXPECT_EQ(m.content, "It is sunny.");
  EXPECT_EQ(m.finish_reason, "stop");
  std::string prompt = h.decode(h.client().calls()[0].prompt_ids);
  EXPECT_THAT(prompt, HasSubstr("<|start|>assistant to=functions.get_weather<|channel|>commentary"
                                " <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>"));
  EXPECT_THAT(prompt, HasSubstr("<|start|>functions.get_weather to=assistant<|channel|>commentary"
                                "<|message|>sunny, 21C<|end|>"));
}

TEST(ChatTest, StopStringCutsContentAcrossTokensAndCancels) {
  ChatHarness h;
  h.client().setScript(
      h.ids("<|channel|>analysis<|message|>think, go<|end|><|start|>assistant<|channel|>final"
            "<|message|>Hello world, goodbye and more text here<|return|>"));
  h.client().setChunkDelay(std::chrono::milliseconds(1));
  Both b = runBoth(h, R"("stop":[", go", "zzz"])");
  // Reasoning is not subject to stop strings; content is cut before the match.
  EXPECT_EQ(b.full.reasoning, "think, go");
  EXPECT_EQ(b.full.content, "Hello world");
  EXPECT_EQ(b.full.finish_reason, "stop");
  expectSame(b);
  ASSERT_TRUE(h.client().waitIdle(std::chrono::seconds(5)));
  EXPECT_EQ(h.client().cancelledStreams(), 2);  // both generations stopped early
}

TEST(ChatTest, StopStringHeldBackTextIsReleasedWhenItDoesNotMatch) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>abc, g<|return|>"));
  Both b = runBoth(h, R"("stop":", go")");
  EXPECT_EQ(b.full.content, "abc, g");
  EXPECT_EQ(b.full.finish_reason, "stop");
  expectSame(b);
}

TEST(ChatTest, MaxTokensGivesLengthWithWhatWasProduced) {
  ChatHarness h;
  // "analysis" is one token in the fake tokenizer; the reasoning text is cut mid-way.
  h.client().setScript(h.ids("<|channel|>analysis<|message|>abcdefghij<|end|>"));
  Both b = runBoth(h, R"("max_tokens":7)");
  EXPECT_EQ(b.full.finish_reason, "length");
  EXPECT_EQ(b.full.reasoning, "abcd");  // 3 header tokens + 4 bytes
  EXPECT_EQ(b.full.content, "");
  EXPECT_EQ(b.full.completion_tokens, 7);
  expectSame(b);
}

TEST(ChatTest, MalformedOutputRecoversWithoutLeakingReasoning) {
  ChatHarness h;
  struct Case {
    std::string name, script, content, reasoning;
  };
  std::vector<Case> cases = {
      {"no header at all", "just text<|return|>", "", "just text"},
      {"stray message token", "<|message|><|channel|>final<|message|>ok<|return|>", "ok", ""},
      {"start inside content",
       "<|channel|>analysis<|message|>secret<|start|>assistant<|channel|>final<|message|>pub"
       "<|return|>",
       "pub", "secret"},
      {"channel without start",
       "<|channel|>analysis<|message|>a<|end|><|channel|>final<|message|>b<|return|>", "b", "a"},
      {"header cut by stop", "<|channel|>final<|return|>", "", ""},
      {"reserved ids in content", "<|channel|>final<|message|>x<|reserved_200100|>y<|return|>",
       "xy", ""},
      {"hallucinated tool result",
       "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>fake<|end|>"
       "<|start|>assistant<|channel|>final<|message|>real<|return|>",
       "real", ""},
      {"endoftext mid-content", "<|channel|>final<|message|>done<|endoftext|>", "done", ""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    h.client().setScript(h.ids(c.script));
    Both b = runBoth(h, "");
    EXPECT_EQ(b.full.content, c.content);
    EXPECT_EQ(b.full.reasoning, c.reasoning);
    EXPECT_EQ(b.full.finish_reason, "stop");
    expectSame(b);
  }
}

TEST(ChatTest, Utf8IsNeverSplitAcrossChunks) {
  ChatHarness h;
  // 9552 is " \xF0\x9F" (a space and half an emoji); 0x98 0x80 complete U+1F600.
  std::vector<int32_t> script = h.ids("<|channel|>final<|message|>");
  script.insert(script.end(), {9552, 0x98, 0x80, 'a', 9552, 0x98, 0x80, 200002});
  h.client().setScript(script);
  Both b = runBoth(h, "");
  EXPECT_EQ(b.full.content,
            " \xF0\x9F\x98\x80"
            "a \xF0\x9F\x98\x80");
  expectSame(b);
  Captured st = h.post("/v1/chat/completions", chatBody(R"("stream":true)"));
  bool done = false;
  for (const auto& ev : sseEvents(st.body, &done)) {
    EXPECT_THAT(ev, Not(HasSubstr("\xEF\xBF\xBD")));  // no U+FFFD from a split character
    Json j(ev);                                       // simdjson validates UTF-8
  }
}

TEST(ChatTest, StreamWithoutUsageHasNoUsageChunk) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>Hi<|return|>"));
  Captured st = h.post("/v1/chat/completions", chatBody(R"("stream":true)"));
  ASSERT_EQ(st.status, 200);
  Message m = fromStream(st.body, false);
  EXPECT_EQ(m.content, "Hi");
  EXPECT_THAT(st.body, Not(HasSubstr("\"usage\"")));
}

TEST(ChatTest, SseFramingExact) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>Hi<|return|>"));
  Captured st = h.post("/v1/chat/completions", chatBody(R"("stream":true)"));
  ASSERT_EQ(st.status, 200);
  bool done = false;
  auto events = sseEvents(st.body, &done);
  ASSERT_TRUE(done);
  // role, "H", "i", finish.
  ASSERT_EQ(events.size(), 4u) << st.body;
  Json first(events[0]);
  std::string_view id;
  ASSERT_FALSE(first.root["id"].get(id));
  EXPECT_TRUE(id.starts_with("chatcmpl-"));
  std::string prefix = R"({"id":")" + std::string(id) + R"(","object":"chat.completion.chunk",)";
  EXPECT_TRUE(events[0].starts_with(prefix));
  EXPECT_THAT(events[0], HasSubstr(R"("model":"gpt-test","choices":[{"index":0,"delta":{"role":)"
                                   R"("assistant","content":""},"logprobs":null,)"
                                   R"("finish_reason":null}]})"));
  EXPECT_THAT(events[1], HasSubstr(R"("choices":[{"index":0,"delta":{"content":"H"},)"
                                   R"("logprobs":null,"finish_reason":null}]})"));
  EXPECT_THAT(events[3], HasSubstr(R"("choices":[{"index":0,"delta":{},"logprobs":null,)"
                                   R"("finish_reason":"stop"}]})"));
  EXPECT_TRUE(st.body.ends_with("}\n\ndata: [DONE]\n\n"));
}

TEST(ChatTest, UpstreamErrorBeforeOutputIsAnHttpError) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>Hi<|return|>"));
  h.client().setError(unavailable("tulip: no replica"), 0);
  for (const char* extra : {"", R"("stream":true)"}) {
    Captured r = h.post("/v1/chat/completions", chatBody(extra));
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_FALSE(r.streamed);
    EXPECT_THAT(r.body, HasSubstr("no replica"));
  }
  h.client().setError(resourceExhausted("tulip: queue full"), 0);
  EXPECT_EQ(h.post("/v1/chat/completions", chatBody()).status, 429);
}

TEST(ChatTest, UpstreamErrorMidStreamIsAnErrorEvent) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>Hello there<|return|>"));
  h.client().setError(unavailable("tulip: worker died"), 5);
  Captured st = h.post("/v1/chat/completions", chatBody(R"("stream":true)"));
  ASSERT_EQ(st.status, 200);
  bool done = false;
  auto events = sseEvents(st.body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  EXPECT_THAT(events.back(), HasSubstr(R"({"error":{"message":"tulip: worker died")"));
  // The non-streaming request gets the HTTP error.
  EXPECT_EQ(h.post("/v1/chat/completions", chatBody()).status, 503);
}

TEST(ChatTest, ManyConcurrentChats) {
  ChatHarness h;
  h.client().setScript([&h](const GenerateCall& call) {
    // Echo the prompt length so each answer is tied to its request.
    return h.ids("<|channel|>final<|message|>n=" + std::to_string(call.prompt_ids.size()) +
                 "<|return|>");
  });
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        std::string user(static_cast<size_t>(t * 10 + i + 1), 'x');
        std::string body = R"({"messages":[{"role":"user","content":")" + user + R"("}])" +
                           (i % 2 ? R"(,"stream":true})" : "}");
        Captured r = h.post("/v1/chat/completions", body);
        if (r.status != 200) continue;
        std::string content =
            i % 2 ? fromStream(r.body, false).content : fromResponse(r.body).content;
        if (content.starts_with("n=")) ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 80);
  EXPECT_TRUE(h.client().waitIdle(std::chrono::seconds(5)));
}

// Every bad field gets a 400 whose `param` names it.
TEST(ChatTest, BadFieldsAre400NamingTheField) {
  ChatHarness h;
  struct Case {
    std::string body, param;
  };
  const std::string msgs = R"("messages":[{"role":"user","content":"Hi"}])";
  std::vector<Case> cases = {
      {"{" + msgs + R"(,"n":17})", "n"},
      {"{" + msgs + R"(,"temperature":3})", "temperature"},
      {"{" + msgs + R"(,"temperature":"hot"})", "temperature"},
      {"{" + msgs + R"(,"top_p":0})", "top_p"},
      {"{" + msgs + R"(,"top_k":-2})", "top_k"},
      {"{" + msgs + R"(,"seed":"a"})", "seed"},
      {"{" + msgs + R"(,"max_tokens":0})", "max_tokens"},
      {"{" + msgs + R"(,"max_tokens":1.5})", "max_tokens"},
      {"{" + msgs + R"(,"max_tokens":100000})", "max_tokens"},
      {"{" + msgs + R"(,"max_completion_tokens":-1})", "max_completion_tokens"},
      {"{" + msgs + R"(,"stop":5})", "stop"},
      {"{" + msgs + R"(,"stop":[""]})", "stop"},
      {"{" + msgs + R"(,"stop":["a",1]})", "stop"},
      {"{" + msgs + R"(,"stream":"yes"})", "stream"},
      {"{" + msgs + R"(,"stream_options":1})", "stream_options"},
      {"{" + msgs + R"(,"stream_options":{"include_usage":"y"}})", "stream_options"},
      {"{" + msgs + R"(,"logprobs":1})", "logprobs"},
      {"{" + msgs + R"(,"top_logprobs":2})", "top_logprobs"},  // without logprobs: true
      {"{" + msgs + R"(,"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {"{" + msgs + R"(,"presence_penalty":2.5})", "presence_penalty"},
      {"{" + msgs + R"(,"frequency_penalty":-3})", "frequency_penalty"},
      {"{" + msgs + R"(,"repetition_penalty":-1})", "repetition_penalty"},
      {"{" + msgs + R"(,"min_p":2})", "min_p"},
      {"{" + msgs + R"(,"logit_bias":{"9999999":5}})", "logit_bias"},
      {"{" + msgs + R"(,"logit_bias":{"42":-101}})", "logit_bias"},
      {"{" + msgs + R"(,"logit_bias":[]})", "logit_bias"},
      {"{" + msgs +
           R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"integer","multipleOf":2}}}})",
       "response_format"},
      {"{" + msgs + R"(,"response_format":{"type":"yaml"}})", "response_format"},
      {"{" + msgs + R"(,"skip_reasoning":"yes"})", "skip_reasoning"},
      {"{" + msgs + R"(,"response_format":{"type":"json_schema","json_schema":{}}})",
       "response_format"},
      {"{" + msgs + R"(,"response_format":"text"})", "response_format"},
      {"{" + msgs + R"(,"ignore_eos":1})", "ignore_eos"},
      {"{" + msgs + R"(,"reasoning_effort":"max"})", "reasoning_effort"},
      {"{" + msgs + R"(,"tool_choice":"bogus"})", "tool_choice"},
      {"{" + msgs + R"(,"tool_choice":"required"})", "tool_choice"},
      {"{" + msgs + R"(,"tools":[{"type":"function","function":{"name":"bad name!"}}]})", "tools"},
      {"{" + msgs + R"(,"model":5})", "model"},
      {R"({"model":"gpt-test"})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "messages"},
      {R"({"messages":[{"role":"user"}]})", "messages"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    Captured r = h.post("/v1/chat/completions", c.body);
    EXPECT_EQ(r.status, 400) << r.body;
    Json j(r.body);
    EXPECT_EQ(str(j.root["error"]["param"]), c.param) << r.body;
    EXPECT_EQ(str(j.root["error"]["type"]), "invalid_request_error");
  }
  EXPECT_TRUE(h.client().calls().empty());  // nothing reached tulip

  Captured nf = h.post("/v1/chat/completions", R"({"model":"other",)" + msgs + "}");
  EXPECT_EQ(nf.status, 404) << nf.body;
  EXPECT_THAT(nf.body, HasSubstr("model_not_found"));
  Captured bad = h.post("/v1/chat/completions", "{not json");
  EXPECT_EQ(bad.status, 400);
}

TEST(ChatTest, EmbeddingModelRejectsChat) {
  ChatHarness h("embedding");
  Captured r = h.post("/v1/chat/completions", chatBody());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("is an embedding model"));
  Captured c = h.post("/v1/completions", R"({"model":"gpt-test","prompt":"hi"})");
  EXPECT_EQ(c.status, 400) << c.body;
  EXPECT_TRUE(h.client().calls().empty());
}

}  // namespace
}  // namespace garden::ivy::testing
