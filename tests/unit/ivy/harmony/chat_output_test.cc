// Parser events -> reasoning_content / content / tool_calls: routing, streamed deltas equal to the
// accumulated result, and finish reasons.

#include "services/ivy/harmony/chat_output.h"

#include <gtest/gtest.h>

#include "tests/fakes/ivy/harmony_fake_tokenizer.h"

namespace garden::ivy::harmony {
namespace {

using garden::ivy::testing::HarmonyFakeTokenizer;

struct Decoded {
  ChatOutput output;
  ChatDelta streamed;  // all deltas appended
  std::vector<ChatDelta> deltas;
  FinishReason finish = FinishReason::kStop;
};

Decoded decode(std::string_view text, ChatOutputOptions options = {}, bool hit_length = false) {
  HarmonyFakeTokenizer tok;
  std::vector<TokenId> ids;
  tok.encodeAllowingSpecial(text, &ids);
  HarmonyOutputDecoder decoder(tok, ParserOptions{}, std::move(options));
  Decoded d;
  for (TokenId id : ids) {
    ChatDelta delta = decoder.push(id);
    if (!delta.empty()) d.deltas.push_back(delta);
    d.streamed.append(delta);
  }
  ChatDelta last = decoder.finish();
  if (!last.empty()) d.deltas.push_back(last);
  d.streamed.append(last);
  d.output = decoder.output();
  d.finish = decoder.finishReason(hit_length);
  return d;
}

void expectStreamedEqualsAccumulated(const Decoded& d) {
  EXPECT_EQ(d.streamed.reasoning_content, d.output.reasoning_content);
  EXPECT_EQ(d.streamed.content, d.output.content);
  ASSERT_EQ(d.streamed.tool_calls.size(), d.output.tool_calls.size());
  for (size_t i = 0; i < d.output.tool_calls.size(); ++i) {
    EXPECT_EQ(d.streamed.tool_calls[i].index, i);
    EXPECT_EQ(d.streamed.tool_calls[i].id, d.output.tool_calls[i].id);
    EXPECT_EQ(d.streamed.tool_calls[i].name, d.output.tool_calls[i].name);
    EXPECT_EQ(d.streamed.tool_calls[i].arguments, d.output.tool_calls[i].arguments);
  }
}

TEST(HarmonyChatOutput, ReasoningAndFinal) {
  Decoded d = decode(
      "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final"
      "<|message|>Answer.<|return|>");
  EXPECT_EQ(d.output.reasoning_content, "Think.");
  EXPECT_EQ(d.output.content, "Answer.");
  EXPECT_TRUE(d.output.tool_calls.empty());
  EXPECT_EQ(d.finish, FinishReason::kStop);
  expectStreamedEqualsAccumulated(d);
  // Byte-level fake: one delta per character, reasoning before content.
  EXPECT_EQ(d.deltas.front().reasoning_content, "T");
  EXPECT_EQ(d.deltas.back().content, ".");
}

TEST(HarmonyChatOutput, ToolCallStreamsNameThenArguments) {
  Decoded d = decode(
      "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>");
  ASSERT_EQ(d.output.tool_calls.size(), 1u);
  EXPECT_EQ(d.output.tool_calls[0], (ToolCall{"call_0", "get_weather", "{\"city\":\"Paris\"}"}));
  EXPECT_EQ(d.output.content, "");
  EXPECT_EQ(d.output.reasoning_content, "Need weather.");
  EXPECT_EQ(d.finish, FinishReason::kToolCalls);
  expectStreamedEqualsAccumulated(d);
  // The first tool-call delta carries id and name with empty arguments; later ones only text.
  const ChatDelta* first = nullptr;
  size_t fragments = 0;
  for (const auto& delta : d.deltas) {
    for (const auto& t : delta.tool_calls) {
      if (!first) first = &delta;
      if (!t.id) {
        EXPECT_FALSE(t.name.has_value());
        ++fragments;
      }
    }
  }
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->tool_calls[0].id, "call_0");
  EXPECT_EQ(first->tool_calls[0].name, "get_weather");
  EXPECT_EQ(first->tool_calls[0].arguments, "");
  EXPECT_GT(fragments, 1u);
}

TEST(HarmonyChatOutput, Routing) {
  // Preamble on commentary is user-visible content; built-in tool calls are hidden reasoning.
  Decoded d = decode(
      "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=browser.search"
      "<|channel|>analysis<|message|>{\"q\":1}<|call|>");
  EXPECT_EQ(d.output.content, "Checking.");
  EXPECT_EQ(d.output.reasoning_content, "{\"q\":1}");
  EXPECT_TRUE(d.output.tool_calls.empty());

  // Messages from other authors (a hallucinated tool result) are dropped entirely.
  d = decode(
      "<|channel|>final<|message|>a<|end|><|start|>functions.f to=assistant"
      "<|channel|>commentary<|message|>secret<|end|>");
  EXPECT_EQ(d.output.content, "a");
  EXPECT_EQ(d.output.reasoning_content, "");

  // Unknown and missing channels never reach content.
  d = decode("<|channel|>weird<|message|>x<|end|><|start|>assistant<|message|>y<|end|>");
  EXPECT_EQ(d.output.content, "");
  EXPECT_EQ(d.output.reasoning_content, "xy");

  // A bare recipient that is a declared function is a call; an undeclared one is not.
  ChatOutputOptions declared;
  declared.function_names = {"get_weather"};
  d = decode("<|channel|>commentary to=get_weather json<|message|>{}<|call|>", declared);
  ASSERT_EQ(d.output.tool_calls.size(), 1u);
  EXPECT_EQ(d.output.tool_calls[0].name, "get_weather");
  d = decode("<|channel|>commentary to=other json<|message|>{}<|call|>", declared);
  EXPECT_TRUE(d.output.tool_calls.empty());
  EXPECT_EQ(d.output.reasoning_content, "{}");
}

TEST(HarmonyChatOutput, ToolChoiceNoneHidesCalls) {
  ChatOutputOptions none;
  none.allow_tool_calls = false;
  Decoded d =
      decode("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>", none);
  EXPECT_TRUE(d.output.tool_calls.empty());
  EXPECT_EQ(d.output.content, "");
  EXPECT_EQ(d.finish, FinishReason::kStop);
}

TEST(HarmonyChatOutput, MultipleCallsCustomIdsAndLength) {
  ChatOutputOptions options;
  options.make_tool_call_id = [](size_t i) { return "call_req7_" + std::to_string(i); };
  Decoded d = decode(
      "<|channel|>commentary to=functions.a <|constrain|>json<|message|>{\"x\":1}<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{\"y\":",
      options, /*hit_length=*/true);
  ASSERT_EQ(d.output.tool_calls.size(), 2u);
  EXPECT_EQ(d.output.tool_calls[0], (ToolCall{"call_req7_0", "a", "{\"x\":1}"}));
  EXPECT_EQ(d.output.tool_calls[1], (ToolCall{"call_req7_1", "b", "{\"y\":"}));
  EXPECT_EQ(d.finish, FinishReason::kLength);
  expectStreamedEqualsAccumulated(d);
  EXPECT_EQ(finishReasonName(d.finish), "length");
}

TEST(HarmonyChatOutput, DeltaAppendMergesFragments) {
  ChatDelta a;
  a.tool_calls.push_back({0, "id0", "f", ""});
  ChatDelta b;
  b.tool_calls.push_back({0, std::nullopt, std::nullopt, "{\"a\""});
  ChatDelta c;
  c.tool_calls.push_back({0, std::nullopt, std::nullopt, ":1}"});
  c.tool_calls.push_back({1, "id1", "g", ""});
  a.append(b);
  a.append(c);
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0], (ToolCallDelta{0, "id0", "f", "{\"a\":1}"}));
  EXPECT_EQ(a.tool_calls[1], (ToolCallDelta{1, "id1", "g", ""}));
}

}  // namespace
}  // namespace garden::ivy::harmony
