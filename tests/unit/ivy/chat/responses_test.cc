// POST /v1/responses (api/responses.h): the request's translation into chat (the same Harmony
// prompt as the equivalent chat request), field errors naming the Responses field, the
// ResponsesStore (LRU by count), the response object and its typed stream events, the
// previous_response_id round trip, and the route under ivy's pipeline (the deadline, the
// model-kind check, a failure mid-stream; 429 admission with the other generation routes in
// generate_pipeline_test.cc). Scripted generate client, no sockets.

#include "services/ivy/api/responses.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/ivy/chat/chat_harness.h"

namespace garden::ivy::testing {
namespace {

using ::testing::HasSubstr;

ModelSpec llmSpec() {
  ModelSpec s;
  s.served_name = "gpt-test";
  s.upstream_name = "fake-llm";
  s.kind = "llm";
  s.max_seq_len = 4096;
  s.eos_token_ids = {200002, 199999, 200012};
  return s;
}

// A Responses request renders exactly the prompt of its chat equivalent.
TEST(ResponsesParse, RendersAsTheEquivalentChatRequest) {
  HarmonyFakeTokenizer tok;
  ModelSpec spec = llmSpec();
  ResponsesStore store(4);
  const std::string tools =
      R"({"type":"function","name":"get_weather","description":"Weather","parameters":)"
      R"({"type":"object","properties":{"city":{"type":"string"}}}})";
  auto r = parseResponsesRequest(
      R"({"model":"gpt-test","instructions":"Be brief.","reasoning":{"effort":"high"},)"
      R"("tools":[)" +
          tools +
          R"(],"tool_choice":{"type":"function","name":"get_weather"},)"
          R"("max_output_tokens":50,"temperature":0,"metadata":{"k":"v"},"user":"u",)"
          R"("input":[{"role":"user","content":[{"type":"input_text","text":"Paris?"}]},)"
          R"({"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{}"},)"
          R"({"type":"function_call_output","call_id":"c1","output":"sunny"}]})",
      spec, &tok, &store);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  auto chat = parseChatRequest(
      R"({"model":"gpt-test","messages":[{"role":"developer","content":"Be brief."},)"
      R"({"role":"user","content":"Paris?"},{"role":"assistant","tool_calls":[{"id":"c1",)"
      R"("type":"function","function":{"name":"get_weather","arguments":"{}"}}]},)"
      R"({"role":"tool","tool_call_id":"c1","content":"sunny"}],"reasoning_effort":"high",)"
      R"("tools":[{"type":"function","function":{"name":"get_weather","description":"Weather",)"
      R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],)"
      R"("tool_choice":{"type":"function","function":{"name":"get_weather"}},)"
      R"("max_tokens":50,"temperature":0})",
      spec, &tok);
  ASSERT_TRUE(chat.isOk()) << chat.status().message();
  EXPECT_EQ(r->chat.prompt_ids, chat->prompt_ids);
  EXPECT_EQ(r->chat.forced_prefix_ids, chat->forced_prefix_ids);
  EXPECT_EQ(r->chat.max_tokens, 50u);
  EXPECT_EQ(r->chat.sampling.temperature, 0.f);
  EXPECT_TRUE(r->store);
  EXPECT_EQ(r->conversation.messages.size(), 3u);  // instructions are not carried over
  EXPECT_EQ(r->conversation.call_ids, std::vector<std::string>{"c1"});

  auto s = parseResponsesRequest(R"({"input":"Hi","store":false})", spec, &tok, &store);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  auto c = parseChatRequest(R"({"messages":[{"role":"user","content":"Hi"}]})", spec, &tok);
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(s->chat.prompt_ids, c->prompt_ids);
  EXPECT_FALSE(s->store);
}

TEST(ResponsesParse, ErrorsNameTheResponsesField) {
  HarmonyFakeTokenizer tok;
  ModelSpec spec = llmSpec();
  ResponsesStore store(4);
  struct Case {
    std::string body, prefix;
    StatusCode code = StatusCode::kInvalidArgument;
  };
  const std::vector<Case> cases = {
      {R"({})", "input: missing"},
      {R"({"input":[]})", "input: must not be empty"},
      {R"({"input":5})", "input: must be a string"},
      {R"({"input":[{"role":"tool","content":"x"}]})", "input[0].role"},
      {R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]})",
       "input[0].content[0].type"},
      {R"({"input":[{"type":"item_reference","id":"x"}]})", "input[0].type"},
      {R"({"input":[{"type":"function_call_output","call_id":"nope","output":"x"}]})",
       "input[0].call_id"},
      {R"({"input":[{"type":"function_call","name":"f","arguments":"{}"}]})", "input[0].call_id"},
      {R"({"input":"x","tools":[{"type":"web_search"}]})", "tools[0].type"},
      {R"({"input":"x","tools":[{"type":"function","name":"bad name"}]})", "tools[0].name"},
      {R"({"input":"x","tool_choice":{"type":"web_search_preview"}})", "tool_choice"},
      {R"({"input":"x","tools":[{"type":"function","name":"f","strict":"yes"}]})",
       "tools[0].strict: must be a boolean"},
      {R"({"input":"x","tools":[{"type":"function","name":"f","strict":true,)"
       R"("parameters":{"type":"object","not":{}}}]})",
       "tools[0].parameters: schema #: unsupported keyword 'not'"},
      {R"({"input":"x","tools":[{"type":"function","name":"f"}],)"
       R"("tool_choice":{"type":"function","name":"g"}})",
       "tool_choice.name"},
      {R"({"input":"x","tool_choice":"sometimes"})", "tool_choice"},
      {R"({"input":"x","reasoning":{"effort":"extreme"}})", "reasoning.effort"},
      {R"({"input":"x","reasoning":"high"})", "reasoning"},
      {R"({"input":"x","max_output_tokens":0})", "max_output_tokens"},
      {R"({"input":"x","max_output_tokens":5000})", "max_output_tokens"},
      {R"({"input":"x","temperature":3})", "temperature"},
      {R"({"input":"x","top_p":0})", "top_p"},
      {R"({"input":"x","stream":"yes"})", "stream"},
      {R"({"input":"x","store":"yes"})", "store"},
      {R"({"input":"x","text":{"format":{"type":"json_schema"}}})", "text.format.name"},
      {R"({"input":"x","text":{"format":{"type":"yaml"}}})", "text.format.type"},
      {R"({"input":"x","text":"json"})", "text"},
      {R"({"input":"x","text":{"format":{"type":"json_schema","name":"a","schema":)"
       R"({"type":"integer","multipleOf":3}}}})",
       "text.format.schema"},
      {R"({"input":"x","background":true})", "background"},
      {R"({"input":"x","conversation":"conv_1"})", "conversation"},
      {R"({"input":"x","instructions":7})", "instructions"},
      {R"({"input":"x","previous_response_id":"resp_unknown"})", "previous_response_id",
       StatusCode::kNotFound},
      {R"({"input":"x","model":"other"})", "model", StatusCode::kNotFound},
  };
  for (const Case& c : cases) {
    auto r = parseResponsesRequest(c.body, spec, &tok, &store);
    ASSERT_FALSE(r.isOk()) << c.body;
    EXPECT_EQ(r.status().code(), c.code) << c.body << ": " << r.status().message();
    EXPECT_EQ(r.status().message().rfind(c.prefix, 0), 0u)
        << c.body << ": " << r.status().message();
  }
  // Harmless fields are ignored; background false / text format "text" are fine.
  auto ok = parseResponsesRequest(
      R"({"input":"x","metadata":{"a":"b"},"user":"u","parallel_tool_calls":true,)"
      R"("truncation":"disabled","include":[],"background":false,"text":{"format":{"type":"text"}}})",
      spec, &tok, &store);
  EXPECT_TRUE(ok.isOk()) << ok.status().message();
  // A strict function tool [TAG_STRICT_TOOLS] becomes chat's strict tool (its grammar compiled).
  auto strict = parseResponsesRequest(
      R"({"input":"x","tools":[{"type":"function","name":"f","strict":true,"parameters":)"
      R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}},)"
      R"({"type":"function","name":"g","strict":false}]})",
      spec, &tok, &store);
  ASSERT_TRUE(strict.isOk()) << strict.status().message();
  ASSERT_EQ(strict->chat.strict_tools.size(), 1u);
  EXPECT_EQ(strict->chat.strict_tools[0].name, "f");
  EXPECT_FALSE(strict->chat.strict_tools[0].grammar.empty());
}

// Structured outputs [TAG_TOKEN_MASK]: text.format is chat's response_format — the same prompt
// (its "# Response Formats" hint) and the same compiled grammar as the chat request; json_object
// too; "text" and no format leave the request unconstrained.
TEST(ResponsesParse, TextFormatIsChatsResponseFormat) {
  HarmonyFakeTokenizer tok;
  ModelSpec spec = llmSpec();
  ResponsesStore store(4);
  const std::string schema =
      R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"],)"
      R"("additionalProperties":false})";
  auto r = parseResponsesRequest(
      R"({"input":"Where?","text":{"format":{"type":"json_schema","name":"place",)"
      R"("description":"A city","strict":true,"schema":)" +
          schema + "}}}",
      spec, &tok, &store);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  auto chat = parseChatRequest(
      R"({"model":"gpt-test","messages":[{"role":"user","content":"Where?"}],)"
      R"("response_format":{"type":"json_schema","json_schema":{"name":"place",)"
      R"("description":"A city","strict":true,"schema":)" +
          schema + "}}}",
      spec, &tok);
  ASSERT_TRUE(chat.isOk()) << chat.status().message();
  ASSERT_TRUE(r->chat.sampling.structured.has_value());
  ASSERT_TRUE(chat->sampling.structured.has_value());
  EXPECT_EQ(r->chat.sampling.structured->grammar, chat->sampling.structured->grammar);
  EXPECT_FALSE(r->chat.sampling.structured->grammar.empty());
  EXPECT_EQ(r->chat.prompt_ids, chat->prompt_ids);  // the same format hint in the prompt
  EXPECT_THAT(r->text_format_json, HasSubstr(R"("name":"place")"));
  auto obj = parseResponsesRequest(R"({"input":"x","text":{"format":{"type":"json_object"}}})",
                                   spec, &tok, &store);
  ASSERT_TRUE(obj.isOk()) << obj.status().message();
  ASSERT_TRUE(obj->chat.sampling.structured.has_value());
  EXPECT_TRUE(obj->chat.sampling.structured->schema.empty());
  EXPECT_EQ(obj->text_format_json, R"({"type":"json_object"})");
  for (const char* body : {R"({"input":"x","text":{"format":{"type":"text"}}})",
                           R"({"input":"x"})"}) {
    auto plain = parseResponsesRequest(body, spec, &tok, &store);
    ASSERT_TRUE(plain.isOk()) << plain.status().message();
    EXPECT_FALSE(plain->chat.sampling.structured.has_value()) << body;
    EXPECT_EQ(plain->text_format_json, R"({"type":"text"})");
  }
}

TEST(ResponsesStoreTest, LeastRecentlyUsedGoesFirst) {
  ResponsesStore store(2);
  auto conv = [](std::string m) {
    auto c = std::make_shared<StoredConversation>();
    c->messages.push_back(std::move(m));
    return c;
  };
  store.put("a", conv("A"));
  store.put("b", conv("B"));
  ASSERT_NE(store.get("a"), nullptr);  // a is now the most recent
  store.put("c", conv("C"));           // evicts b
  EXPECT_EQ(store.get("b"), nullptr);
  ASSERT_NE(store.get("a"), nullptr);
  EXPECT_EQ(store.get("a")->messages[0], "A");
  EXPECT_EQ(store.get("c")->messages[0], "C");
  EXPECT_EQ(store.size(), 2u);
  store.put("c", conv("C2"));  // replacing keeps the count
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.get("c")->messages[0], "C2");
  ResponsesStore none(0);
  none.put("a", conv("A"));
  EXPECT_EQ(none.get("a"), nullptr);
  // Concurrent use (run under TSan in CI).
  ResponsesStore shared(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        std::string id = std::to_string((t * 200 + i) % 13);
        shared.put(id, conv(id));
        if (auto c = shared.get(id)) {
          EXPECT_EQ(c->messages[0].size(), id.size());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(shared.size(), 8u);
}

// --- The route ---

const char* kReasonThenAnswer =
    "<|channel|>analysis<|message|>Think first.<|end|><|start|>assistant<|channel|>final"
    "<|message|>Hello there!<|return|>";
const char* kWeatherCall =
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    "{\"city\":\"Paris\"}<|call|>";
const std::string kWeatherTool =
    R"([{"type":"function","name":"get_weather","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string"}}}}])";

std::string field(simdjson::dom::element e, std::string_view key) { return str(e[key]); }

TEST(ResponsesRoute, NonStreamingResponseObject) {
  ChatHarness h;
  h.client().setScript(h.ids(kReasonThenAnswer));
  Captured r = h.post(
      "/v1/responses",
      R"({"model":"gpt-test","input":"Hi","instructions":"Be kind.",)"
      R"("max_output_tokens":100,"reasoning":{"effort":"low"},"temperature":0.7,"top_p":0.9})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(r.header("x-garden-total-us").empty());
  Json j(r.body);
  EXPECT_EQ(field(j.root, "id").rfind("resp_", 0), 0u);
  EXPECT_EQ(field(j.root, "object"), "response");
  EXPECT_EQ(field(j.root, "status"), "completed");
  EXPECT_EQ(field(j.root, "model"), "gpt-test");
  EXPECT_EQ(field(j.root, "instructions"), "Be kind.");
  EXPECT_EQ(field(j.root["reasoning"], "effort"), "low");
  // Sampling echoed as sent (float values written in their shortest form).
  EXPECT_THAT(r.body, HasSubstr(R"("temperature":0.7,)"));
  EXPECT_THAT(r.body, HasSubstr(R"("top_p":0.9,)"));
  EXPECT_TRUE(j.root["incomplete_details"].is_null());
  int64_t created = 0;
  EXPECT_FALSE(j.root["created_at"].get(created));
  EXPECT_GT(created, 1700000000);
  simdjson::dom::array out = j.root["output"];
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(field(out.at(0), "type"), "reasoning");
  EXPECT_EQ(field(out.at(0)["content"].at(0), "type"), "reasoning_text");
  EXPECT_EQ(field(out.at(0)["content"].at(0), "text"), "Think first.");
  EXPECT_EQ(field(out.at(1), "type"), "message");
  EXPECT_EQ(field(out.at(1), "role"), "assistant");
  EXPECT_EQ(field(out.at(1), "status"), "completed");
  EXPECT_EQ(field(out.at(1)["content"].at(0), "type"), "output_text");
  EXPECT_EQ(field(out.at(1)["content"].at(0), "text"), "Hello there!");
  EXPECT_EQ(out.at(1)["content"].at(0)["annotations"].get_array().size(), 0u);
  const auto calls = h.client().calls();  // a copy: calls() returns by value
  const auto& call = calls.at(0);
  uint64_t in = j.root["usage"]["input_tokens"], outn = j.root["usage"]["output_tokens"],
           total = j.root["usage"]["total_tokens"],
           reasoning = j.root["usage"]["output_tokens_details"]["reasoning_tokens"];
  EXPECT_EQ(in, call.prompt_ids.size());
  EXPECT_EQ(outn, h.ids(kReasonThenAnswer).size());
  EXPECT_EQ(total, in + outn);
  EXPECT_GT(reasoning, 0u);
  EXPECT_LT(reasoning, outn);
  EXPECT_EQ(call.max_tokens, 100u);
  // The prompt carries the instructions and the effort.
  const std::string prompt = h.decode(call.prompt_ids);
  EXPECT_THAT(prompt, HasSubstr("Reasoning: low"));
  EXPECT_THAT(prompt, HasSubstr("Be kind."));

  // The limit stopped it: incomplete, with the reason.
  Captured cut = h.post("/v1/responses", R"({"input":"Hi","max_output_tokens":3})");
  ASSERT_EQ(cut.status, 200) << cut.body;
  Json k(cut.body);
  EXPECT_EQ(field(k.root, "status"), "incomplete");
  EXPECT_EQ(field(k.root["incomplete_details"], "reason"), "max_output_tokens");
}

struct Event {
  std::string type;
  std::string json;
};

// "event: T\ndata: {...}\n\n" framing; every data carries the same type and consecutive
// sequence numbers from 0.
std::vector<Event> typedEvents(const std::string& body) {
  std::vector<Event> events;
  uint64_t seq = 0;
  for (const std::string& ev : sseBlocks(body)) {
    size_t nl = ev.find('\n');
    if (ev.rfind("event: ", 0) != 0 || nl == std::string::npos ||
        ev.compare(nl + 1, 6, "data: ") != 0) {
      ADD_FAILURE() << "bad event framing: " << ev;
      continue;
    }
    Event e{ev.substr(7, nl - 7), ev.substr(nl + 7)};
    Json j(e.json);
    EXPECT_EQ(field(j.root, "type"), e.type);
    uint64_t n = 0;
    EXPECT_FALSE(j.root["sequence_number"].get(n));
    EXPECT_EQ(n, seq++);
    events.push_back(std::move(e));
  }
  return events;
}

TEST(ResponsesRoute, StreamingEventsAssembleToTheFinalResponse) {
  ChatHarness h;
  h.client().setScript(h.ids(kReasonThenAnswer));
  h.client().setChunkSize(1);
  Captured r = h.post("/v1/responses", R"({"input":"Hi","stream":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_TRUE(r.streamed);
  EXPECT_EQ(r.content_type, "text/event-stream");
  EXPECT_EQ(r.body.find("[DONE]"), std::string::npos);
  std::vector<Event> events = typedEvents(r.body);
  std::vector<std::string> types;
  std::string reasoning, text;
  for (const Event& e : events) {
    if (types.empty() || types.back() != e.type) types.push_back(e.type);
    Json j(e.json);
    if (e.type == "response.reasoning_text.delta") reasoning += field(j.root, "delta");
    if (e.type == "response.output_text.delta") text += field(j.root, "delta");
  }
  const std::vector<std::string> expected = {"response.created",
                                             "response.in_progress",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.output_text.delta",
                                             "response.output_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.completed"};
  EXPECT_EQ(types, expected);
  EXPECT_EQ(reasoning, "Think first.");
  EXPECT_EQ(text, "Hello there!");
  // The completed event carries the same response a non-streaming request gets.
  Json done(events.back().json);
  simdjson::dom::element resp = done.root["response"];
  EXPECT_EQ(field(resp, "status"), "completed");
  EXPECT_EQ(field(resp["output"].at(1)["content"].at(0), "text"), text);
  EXPECT_EQ(field(resp["output"].at(0)["content"].at(0), "text"), reasoning);
  Json created(events.front().json);
  EXPECT_EQ(field(created.root["response"], "id"), field(resp, "id"));
  EXPECT_EQ(field(created.root["response"], "status"), "in_progress");
  uint64_t total = resp["usage"]["total_tokens"];
  EXPECT_GT(total, 0u);
}

TEST(ResponsesRoute, FunctionCallRoundTripWithPreviousResponseId) {
  ChatHarness h;
  h.client().setScript(h.ids(kWeatherCall));
  h.client().setChunkSize(2);
  Captured first = h.post("/v1/responses", R"({"input":"Weather in Paris?","tools":)" +
                                               kWeatherTool + R"(,"stream":true})");
  ASSERT_EQ(first.status, 200) << first.body;
  std::vector<Event> events = typedEvents(first.body);
  std::string args;
  std::string call_id, resp_id;
  for (const Event& e : events) {
    Json j(e.json);
    if (e.type == "response.function_call_arguments.delta") args += field(j.root, "delta");
    if (e.type == "response.output_item.added") {
      EXPECT_EQ(field(j.root["item"], "type"), "function_call");
    }
    if (e.type == "response.function_call_arguments.done") {
      EXPECT_EQ(field(j.root, "arguments"), R"({"city":"Paris"})");
    }
    if (e.type == "response.completed") {
      simdjson::dom::element item = j.root["response"]["output"].at(0);
      EXPECT_EQ(field(item, "type"), "function_call");
      EXPECT_EQ(field(item, "name"), "get_weather");
      EXPECT_EQ(field(item, "arguments"), R"({"city":"Paris"})");
      call_id = field(item, "call_id");
      resp_id = field(j.root["response"], "id");
    }
  }
  EXPECT_EQ(args, R"({"city":"Paris"})");
  EXPECT_EQ(call_id, "call_test_0");
  ASSERT_FALSE(resp_id.empty());

  // The follow-up continues the stored conversation with the call's output.
  h.client().setScript(h.ids("<|channel|>final<|message|>It is sunny.<|return|>"));
  Captured second = h.post(
      "/v1/responses", R"({"previous_response_id":")" + resp_id + R"(","tools":)" + kWeatherTool +
                           R"(,"input":[{"type":"function_call_output","call_id":")" + call_id +
                           R"(","output":"sunny, 21C"}]})");
  ASSERT_EQ(second.status, 200) << second.body;
  Json j(second.body);
  EXPECT_EQ(field(j.root, "previous_response_id"), resp_id);
  EXPECT_EQ(field(j.root["output"].at(0)["content"].at(0), "text"), "It is sunny.");
  const std::string prompt = h.decode(h.client().calls().at(1).prompt_ids);
  EXPECT_THAT(prompt, HasSubstr("Weather in Paris?"));
  EXPECT_THAT(
      prompt,
      HasSubstr(
          R"(to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"Paris"}<|call|>)"));
  EXPECT_THAT(prompt, HasSubstr("<|start|>functions.get_weather to=assistant<|channel|>commentary"
                                "<|message|>sunny, 21C<|end|>"));

  // And a third turn continues the second (the whole chain is stored).
  h.client().setScript(h.ids("<|channel|>final<|message|>Bye.<|return|>"));
  Captured third = h.post("/v1/responses", R"({"previous_response_id":")" + field(j.root, "id") +
                                               R"(","input":"Thanks"})");
  ASSERT_EQ(third.status, 200) << third.body;
  const std::string prompt3 = h.decode(h.client().calls().at(2).prompt_ids);
  EXPECT_THAT(prompt3, HasSubstr("sunny, 21C"));
  EXPECT_THAT(prompt3, HasSubstr("It is sunny."));
  EXPECT_THAT(prompt3, HasSubstr("Thanks"));
}

TEST(ResponsesRoute, UnknownOrUnstoredPreviousResponseIs404) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>ok<|return|>"));
  Captured r = h.post("/v1/responses", R"({"input":"x","previous_response_id":"resp_nope"})");
  EXPECT_EQ(r.status, 404) << r.body;
  EXPECT_THAT(r.body, HasSubstr(R"("param":"previous_response_id")"));
  EXPECT_THAT(r.body, HasSubstr(R"("type":"invalid_request_error")"));
  Captured unstored = h.post("/v1/responses", R"({"input":"x","store":false})");
  ASSERT_EQ(unstored.status, 200);
  Json j(unstored.body);
  EXPECT_EQ(h.post("/v1/responses",
                   R"({"input":"y","previous_response_id":")" + field(j.root, "id") + "\"}")
                .status,
            404);
  EXPECT_EQ(h.client().calls().size(), 1u);
}

TEST(ResponsesRoute, StoreIsBoundedByTheOption) {
  IvyServiceOptions o;
  o.responses_store_max = 1;
  ChatHarness h("llm", o);
  h.client().setScript(h.ids("<|channel|>final<|message|>ok<|return|>"));
  Json a(h.post("/v1/responses", R"({"input":"a"})").body);
  Json b(h.post("/v1/responses", R"({"input":"b"})").body);
  EXPECT_EQ(h.post("/v1/responses",
                   R"({"input":"x","previous_response_id":")" + field(a.root, "id") + "\"}")
                .status,
            404);  // evicted by b
  EXPECT_EQ(h.post("/v1/responses",
                   R"({"input":"x","previous_response_id":")" + field(b.root, "id") + "\"}")
                .status,
            200);
}

TEST(ResponsesRoute, EmbeddingModelIs400NamingModel) {
  ChatHarness h("embedding");
  Captured r = h.post("/v1/responses", R"({"model":"gpt-test","input":"Hi"})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("is an embedding model"));
  EXPECT_THAT(r.body, HasSubstr(R"("param":"model")"));
  EXPECT_TRUE(h.client().calls().empty());
}

// The deadline itself is generate_pipeline_test's (with the other generation routes); here: how
// a Responses stream reports it.
TEST(ResponsesRoute, DeadlineIs504BeforeOutputAndResponseFailedAfter) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>Hello there, a long answer<|return|>"));
  // Passed before sending: 504, tulip not called.
  Captured late = h.post("/v1/responses", R"({"input":"Hi","stream":true})",
                         {{"x-request-timeout", "0.05"}}, std::chrono::milliseconds(1000));
  EXPECT_EQ(late.status, 504) << late.body;
  EXPECT_TRUE(h.client().calls().empty());
  // Upstream deadline before any output: a plain 504; after output: response.failed, then end.
  h.client().setError(deadlineExceeded("tulip: deadline exceeded"), 0);
  EXPECT_EQ(h.post("/v1/responses", R"({"input":"Hi","stream":true})").status, 504);
  h.client().setError(deadlineExceeded("tulip: deadline exceeded"), 5);
  Captured st = h.post("/v1/responses", R"({"input":"Hi","stream":true})");
  ASSERT_EQ(st.status, 200);
  ASSERT_TRUE(st.streamed);
  std::vector<Event> events = typedEvents(st.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back().type, "response.failed");
  Json j(events.back().json);
  EXPECT_EQ(field(j.root["response"], "status"), "failed");
  EXPECT_EQ(field(j.root["response"]["error"], "code"), "timeout");
  EXPECT_EQ(st.body.find("[DONE]"), std::string::npos);
}

}  // namespace
}  // namespace garden::ivy::testing
