// Harmony conformance on the reference vectors (openai/harmony test-data, copied into vectors/)
// and on the worked examples of shared/spec/harmony.md §1.12. Rendering is compared at the string
// level (the vectors are strings); parsing runs on ids made by the fake tokenizer from the vector
// text (specials allowed), which exercises the same header/content logic the real ids do.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "services/ivy/harmony/chat_output.h"
#include "services/ivy/harmony/openai_request.h"
#include "services/ivy/harmony/parser.h"
#include "services/ivy/harmony/render.h"
#include "services/ivy/harmony/schema_ts.h"
#include "tests/conformance/harmony/vector_conversations.h"
#include "tests/fakes/ivy/harmony_fake_tokenizer.h"

namespace garden::ivy::harmony {
namespace {

using conformance::readVector;

TEST(HarmonyRenderVectors, AllReferenceRenderVectors) {
  auto vectors = conformance::renderVectors();
  ASSERT_EQ(vectors.size(), 19u);
  for (const auto& v : vectors) {
    RenderConfig config{v.drop_analysis};
    auto segments = v.for_completion
                        ? renderConversationForCompletion(v.messages, Role::kAssistant, config)
                        : renderConversation(v.messages, config);
    ASSERT_TRUE(segments.isOk()) << v.file << ": " << segments.status().toString();
    EXPECT_EQ(segmentsToString(*segments), readVector(v.file)) << v.file;
  }
}

// Dropping is what makes the CoT vectors differ: with the opposite setting they must not match.
TEST(HarmonyRenderVectors, CotSettingMatters) {
  for (const auto& v : conformance::renderVectors()) {
    if (v.file != "test_dropping_cot_by_default.txt" && v.file != "test_preserve_cot.txt") continue;
    auto segments = renderConversationForCompletion(v.messages, Role::kAssistant,
                                                    RenderConfig{!v.drop_analysis});
    ASSERT_TRUE(segments.isOk());
    EXPECT_NE(segmentsToString(*segments), readVector(v.file)) << v.file;
  }
}

std::string renderCompletion(const std::vector<Message>& messages, bool drop = false) {
  auto segments = renderConversationForCompletion(messages, Role::kAssistant, RenderConfig{drop});
  EXPECT_TRUE(segments.isOk()) << segments.status().toString();
  return segments.isOk() ? segmentsToString(*segments) : "";
}

// --- parser vectors -------------------------------------------------------------------------

std::vector<ParsedMessage> parseText(const std::string& text, std::optional<Role> role) {
  testing::HarmonyFakeTokenizer tok;
  std::vector<TokenId> ids;
  tok.encodeAllowingSpecial(text, &ids);
  ParserOptions options;
  options.role = role;
  options.strict = true;  // the vectors are well-formed: the reference's strict mode accepts them
  auto messages = parseCompletion(tok, ids, options);
  EXPECT_TRUE(messages.isOk()) << messages.status().toString();
  return messages.isOk() ? *messages : std::vector<ParsedMessage>{};
}

MessageHeader header(Role role, std::optional<std::string> channel,
                     std::optional<std::string> recipient = std::nullopt,
                     std::optional<std::string> content_type = std::nullopt,
                     std::optional<std::string> name = std::nullopt) {
  return MessageHeader{role, std::move(name), std::move(channel), std::move(recipient),
                       std::move(content_type)};
}

TEST(HarmonyParserVectors, StreamableParser) {
  std::string text = readVector("test_streamable_parser.txt");
  auto messages = parseText(text, Role::kAssistant);
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_EQ(messages[0].header, header(Role::kAssistant, "analysis"));
  EXPECT_EQ(
      messages[0].content,
      "User asks \"Who is the current US president?\" It's 2025, presumably current president "
      "is Joe Biden? Actually as of 2025-07-28, there was a 2024 election. In 2024, President "
      "is probably President Biden still? But w\ne need up to date info. Let's browse to "
      "confirm.");
  EXPECT_EQ(messages[0].stop_token, kEnd);
  EXPECT_EQ(messages[1].header, header(Role::kAssistant, "commentary", "browser.search", "code"));
  EXPECT_EQ(messages[1].content,
            R"({"query": "current US president July 2025", "topn": 10, "source": "news"})");
  EXPECT_EQ(messages[1].stop_token, kCall);
  EXPECT_EQ(messages[2].header,
            header(Role::kTool, "commentary", "assistant", std::nullopt, "browser.search"));
  EXPECT_EQ(messages[2].content, R"({"result": "https://openai.com/"})");
}

TEST(HarmonyParserVectors, ToolResponseParsing) {
  auto messages = parseText(readVector("test_tool_response_parsing.txt"), std::nullopt);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].header,
            header(Role::kTool, "commentary", "assistant", std::nullopt, "browser.search"));
  EXPECT_EQ(messages[0].content, R"({"result": "https://openai.com/"})");
  EXPECT_EQ(messages[0].end, EndReason::kEndOfStream);
}

// E7: the decoded form of test_simple_tool_call.txt.
TEST(HarmonyParserVectors, SpecE7SimpleToolCallDecoded) {
  auto messages = parseText(readVector("spec_e7_tool_call_decoded.txt"), Role::kAssistant);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0].header, header(Role::kAssistant, "analysis"));
  EXPECT_EQ(messages[0].content,
            "User asks: \"What is the weather in Tokyo?\" We need to use lookup_weather tool.");
  EXPECT_EQ(messages[0].stop_token, kReturn);
  EXPECT_EQ(messages[1].header, header(Role::kAssistant, "analysis", "lookup_weather", "code"));
  EXPECT_EQ(messages[1].content, "{\"location\": \"Tokyo\"}");
}

// E3: the model's tool-call output, and what the chat API makes of it.
TEST(HarmonyParserVectors, SpecE3ToolCallOutput) {
  std::string text = readVector("spec_e3_tool_call_output.txt");
  auto messages = parseText(text, Role::kAssistant);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0].header, header(Role::kAssistant, "analysis"));
  EXPECT_EQ(messages[0].content, "Need to use function get_current_weather.");
  EXPECT_EQ(messages[1].header, header(Role::kAssistant, "commentary",
                                       "functions.get_current_weather", "<|constrain|>json"));
  EXPECT_EQ(messages[1].content, "{\"location\":\"San Francisco, CA\"}");

  testing::HarmonyFakeTokenizer tok;
  std::vector<TokenId> ids;
  tok.encodeAllowingSpecial(text, &ids);
  HarmonyOutputDecoder decoder(tok, ParserOptions{}, ChatOutputOptions{});
  for (TokenId id : ids) (void)decoder.push(id);
  (void)decoder.finish();
  EXPECT_EQ(decoder.output().reasoning_content, "Need to use function get_current_weather.");
  EXPECT_EQ(decoder.output().content, "");
  ASSERT_EQ(decoder.output().tool_calls.size(), 1u);
  EXPECT_EQ(decoder.output().tool_calls[0].name, "get_current_weather");
  EXPECT_EQ(decoder.output().tool_calls[0].arguments, "{\"location\":\"San Francisco, CA\"}");
  EXPECT_EQ(decoder.finishReason(false), FinishReason::kToolCalls);
}

// --- worked examples through the OpenAI request mapping ---------------------------------------

constexpr const char* kE2Tools = R"("tools":[{"type":"function","function":{
  "name":"get_current_weather","description":"Gets the current weather in the provided location.",
  "parameters":{"type":"object","properties":{
    "location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},
    "format":{"type":"string","enum":["celsius","fahrenheit"],"default":"celsius"}},
  "required":["location"]}}}])";

std::string renderOpenAi(const std::string& body) {
  ChatRenderOptions options;
  options.current_date = "2025-06-28";
  auto req = harmonyRequestFromOpenAiJson(body, options);
  EXPECT_TRUE(req.isOk()) << req.status().toString();
  if (!req.isOk()) return "";
  return renderCompletion(req->messages, options.render.auto_drop_analysis);
}

TEST(HarmonySpecExamples, E2SystemDeveloperUser) {
  std::string body = std::string(R"({"reasoning_effort":"high","messages":[
      {"role":"system","content":"Use a friendly tone."},
      {"role":"user","content":"What is the weather like in SF?"}],)") +
                     kE2Tools + "}";
  EXPECT_EQ(renderOpenAi(body), readVector("spec_e2_system_developer_user.txt"));
}

TEST(HarmonySpecExamples, E3ToolRoundTrip) {
  std::string body = std::string(R"({"reasoning_effort":"high","messages":[
      {"role":"system","content":"Use a friendly tone."},
      {"role":"user","content":"What is the weather like in SF?"},
      {"role":"assistant","reasoning_content":"Need to use function get_current_weather.",
       "content":null,"tool_calls":[{"id":"call_1","type":"function","function":{
         "name":"get_current_weather","arguments":"{\"location\":\"San Francisco, CA\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"{\"sunny\": true, \"temperature\": 20}"}
      ],)") + kE2Tools +
                     "}";
  EXPECT_EQ(renderOpenAi(body), readVector("spec_e3_tool_round_trip.txt"));
}

TEST(HarmonySpecExamples, E4NextTurnDropsCot) {
  std::string body = std::string(R"({"reasoning_effort":"high","messages":[
      {"role":"system","content":"Use a friendly tone."},
      {"role":"user","content":"What is the weather like in SF?"},
      {"role":"assistant","reasoning_content":"Need to use function get_current_weather.",
       "tool_calls":[{"id":"call_1","type":"function","function":{
         "name":"get_current_weather","arguments":"{\"location\":\"San Francisco, CA\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"{\"sunny\": true, \"temperature\": 20}"},
      {"role":"assistant","content":"It is sunny and 20 degrees in San Francisco."},
      {"role":"user","content":"And in Tokyo?"}
      ],)") + kE2Tools +
                     "}";
  EXPECT_EQ(renderOpenAi(body), readVector("spec_e4_next_turn_drops_cot.txt"));
}

TEST(HarmonySpecExamples, E5SchemaEdgeCases) {
  ToolNamespace fns{"functions", std::nullopt, {}};
  fns.tools.push_back({"search_docs", "Search the docs.\nReturns matching documents.",
                       R"({"type":"object","properties":{
      "query":{"type":"string","description":"Search text"},
      "limit":{"type":"integer","default":10},
      "exact":{"type":"boolean","default":false},
      "ratio":{"type":"number","default":0.5},
      "tags":{"type":"array","items":{"type":"string"}},
      "ids":{"type":["integer","string"]},
      "mode":{"type":"string","enum":["fast","slow"],"default":"fast","description":"Speed"},
      "note":{"type":"string","nullable":true},
      "filter":{"type":"object","description":"Filter object","properties":{
          "field":{"type":"string"},"value":{"type":"number"}},"required":["field"]},
      "rows":{"type":"array","items":{"type":"object","properties":{"a":{"type":"integer"}},
              "required":["a"]}},
      "anything":{"description":"No type given"},
      "list_any":{"type":"array"}},
    "required":["query"]})"});
  fns.tools.push_back({"ping", "Ping.", std::nullopt});
  fns.tools.push_back({"empty_obj", "Empty object params.", R"({"type":"object"})"});
  fns.tools.push_back({"raw_string", "String params.", R"({"type":"string"})"});
  auto section = renderToolsSection({{"functions", fns}});
  ASSERT_TRUE(section.isOk()) << section.status().toString();
  EXPECT_EQ(*section, readVector("spec_e5_schema_edge_cases.txt"));
}

}  // namespace
}  // namespace garden::ivy::harmony
