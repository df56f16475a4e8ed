// OpenAI chat request -> Harmony conversation: the mapping rules and field-named errors.

#include "services/ivy/harmony/openai_request.h"

#include <gtest/gtest.h>

#include "services/ivy/harmony/chat_output.h"
#include "services/ivy/harmony/encode.h"
#include "services/ivy/harmony/render.h"
#include "tests/fakes/ivy/harmony_fake_tokenizer.h"

namespace garden::ivy::harmony {
namespace {

std::string renderBody(const std::string& body, ChatRenderOptions options = {}) {
  auto req = harmonyRequestFromOpenAiJson(body, options);
  EXPECT_TRUE(req.isOk()) << req.status().toString();
  if (!req.isOk()) return "";
  auto segs = renderConversationForCompletion(req->messages, Role::kAssistant, options.render);
  EXPECT_TRUE(segs.isOk());
  return segs.isOk() ? segmentsToString(*segs) : "";
}

Status errorOf(const std::string& body) {
  auto req = harmonyRequestFromOpenAiJson(body, ChatRenderOptions{});
  return req.isOk() ? okStatus() : req.status();
}

constexpr const char* kSystemPrefix =
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, "
    "final. Channel must be included for every message.<|end|>";

TEST(HarmonyOpenAiRequest, MinimalRequest) {
  EXPECT_EQ(renderBody(R"({"messages":[{"role":"user","content":"Hi"}]})"),
            std::string(kSystemPrefix) + "<|start|>user<|message|>Hi<|end|><|start|>assistant");
}

TEST(HarmonyOpenAiRequest, InstructionsPartsAndLaterSystemMessages) {
  std::string out = renderBody(R"({"reasoning_effort":"low","messages":[
      {"role":"system","content":"Be brief."},
      {"role":"developer","content":[{"type":"text","text":"Use "},{"type":"text","text":"French."}]},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"system","content":"Later rule."}]})");
  EXPECT_NE(out.find("Reasoning: low"), std::string::npos);
  EXPECT_NE(out.find("<|start|>developer<|message|># Instructions\n\nBe brief.\n\nUse French."
                     "<|end|><|start|>user<|message|>ab<|end|><|start|>developer<|message|>"
                     "# Instructions\n\nLater rule.<|end|><|start|>assistant"),
            std::string::npos)
      << out;
}

TEST(HarmonyOpenAiRequest, AssistantHistory) {
  std::string out = renderBody(R"({"messages":[
      {"role":"user","content":"q"},
      {"role":"assistant","reasoning":"plan","content":"Let me check.","tool_calls":[
        {"id":"c1","type":"function","function":{"name":"f","arguments":{"a":1}}}]},
      {"role":"tool","tool_call_id":"c1","content":"r"}],
      "tools":[{"type":"function","function":{"name":"f"}}]})");
  EXPECT_NE(out.find("<|start|>assistant<|channel|>analysis<|message|>plan<|end|>"
                     "<|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>"
                     "<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json"
                     "<|message|>{\"a\":1}<|call|>"
                     "<|start|>functions.f to=assistant<|channel|>commentary<|message|>r<|end|>"
                     "<|start|>assistant"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("type f = () => any;"), std::string::npos);
  EXPECT_NE(out.find("Calls to these tools must go to the commentary channel"), std::string::npos);
}

TEST(HarmonyOpenAiRequest, EmptyAssistantTurnIsKept) {
  std::string out = renderBody(R"({"messages":[{"role":"user","content":"q"},
      {"role":"assistant","content":null},{"role":"user","content":"again"}]})");
  EXPECT_NE(out.find("<|start|>assistant<|channel|>final<|message|><|end|><|start|>user"),
            std::string::npos)
      << out;
}

TEST(HarmonyOpenAiRequest, ToolChoice) {
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f"}}])";
  auto none = harmonyRequestFromOpenAiJson(
      R"({"messages":[{"role":"user","content":"q"}],"tool_choice":"none",)" + tools + "}", {});
  ASSERT_TRUE(none.isOk());
  EXPECT_EQ(none->tool_choice, ToolChoice::kNone);
  auto segs = renderConversation(none->messages, RenderConfig{});
  ASSERT_TRUE(segs.isOk());
  EXPECT_EQ(segmentsToString(*segs).find("functions"), std::string::npos);  // tools left out

  auto named = harmonyRequestFromOpenAiJson(
      R"({"messages":[{"role":"user","content":"q"}],
          "tool_choice":{"type":"function","function":{"name":"f"}},)" +
          tools + "}",
      {});
  ASSERT_TRUE(named.isOk());
  EXPECT_EQ(named->tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named->tool_choice_name, "f");
  EXPECT_EQ(named->function_names, std::vector<std::string>{"f"});

  auto required = harmonyRequestFromOpenAiJson(
      R"({"messages":[{"role":"user","content":"q"}],"tool_choice":"required",)" + tools + "}", {});
  ASSERT_TRUE(required.isOk());
  EXPECT_EQ(required->tool_choice, ToolChoice::kRequired);
}

// tool_choice enforced by a prompt prefix: the decoder sees prefix + generated ids, and the call
// comes out as if the model had chosen it.
TEST(HarmonyOpenAiRequest, ToolChoicePrefixForcesTheCall) {
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"get_weather"}},
      {"type":"function","function":{"name":"other"}}])";
  garden::ivy::testing::HarmonyFakeTokenizer tok;
  struct Case {
    std::string choice;
    std::string generated;
    std::string prefix_text;
    std::string want_name;
  };
  const Case cases[] = {
      {R"({"type":"function","function":{"name":"get_weather"}})", "{\"city\":\"Oslo\"}<|call|>",
       "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
       "get_weather"},
      {R"("required")", "other <|constrain|>json<|message|>{}<|call|>",
       "<|channel|>commentary to=functions.", "other"},
  };
  for (const Case& c : cases) {
    auto req = harmonyRequestFromOpenAiJson(
        R"({"messages":[{"role":"user","content":"q"}],"tool_choice":)" + c.choice + "," + tools +
            "}",
        {});
    ASSERT_TRUE(req.isOk()) << req.status().toString();
    std::vector<Segment> prefix = toolChoicePrefix(*req);
    EXPECT_EQ(segmentsToString(prefix), c.prefix_text);
    std::vector<TokenId> ids = encodeSegments(prefix, tok);
    tok.encodeAllowingSpecial(c.generated, &ids);
    HarmonyOutputDecoder decoder(tok, ParserOptions{}, ChatOutputOptions{});
    for (TokenId id : ids) (void)decoder.push(id);
    (void)decoder.finish();
    ASSERT_EQ(decoder.output().tool_calls.size(), 1u) << c.choice;
    EXPECT_EQ(decoder.output().tool_calls[0].name, c.want_name);
    EXPECT_EQ(decoder.finishReason(false), FinishReason::kToolCalls);
  }
  auto autod = harmonyRequestFromOpenAiJson(
      R"({"messages":[{"role":"user","content":"q"}],)" + tools + "}", {});
  ASSERT_TRUE(autod.isOk());
  EXPECT_TRUE(toolChoicePrefix(*autod).empty());
}

TEST(HarmonyOpenAiRequest, DateOption) {
  ChatRenderOptions options;
  options.current_date = "2026-11-30";
  EXPECT_NE(renderBody(R"({"messages":[{"role":"user","content":"q"}]})", options)
                .find("Knowledge cutoff: 2024-06\nCurrent date: 2026-11-30\n\n"),
            std::string::npos);
}

TEST(HarmonyOpenAiRequest, ErrorsNameTheField) {
  struct Case {
    const char* body;
    const char* field;
  };
  const Case cases[] = {
      {"{", "request body"},
      {"[]", "request body"},
      {R"({})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       "messages[0].content[0].type"},
      {R"({"messages":[{"role":"tool","tool_call_id":"nope","content":"x"}]})",
       "messages[0].tool_call_id"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{}}]}]})",
       "messages[0].tool_calls[0].function.name"},
      {R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"max"})",
       "reasoning_effort"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":{}})", "tools"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"code"}]})",
       "tools[0].type"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",
          "function":{"name":"bad name"}}]})",
       "tools[0].function.name"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",
          "function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]})",
       "tools[1].function.name"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",
          "function":{"name":"f","parameters":[]}}]})",
       "tools[0].function.parameters"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function",
          "function":{"name":"g"}}})",
       "tool_choice.function.name"},
  };
  for (const Case& c : cases) {
    Status s = errorOf(c.body);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(s.message().rfind(c.field, 0), 0u) << c.body << " -> " << s.message();
  }
}

}  // namespace
}  // namespace garden::ivy::harmony
