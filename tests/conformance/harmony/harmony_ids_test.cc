// Id-level Harmony conformance with the real o200k_harmony tokenizer (gpt-oss tokenizer.json,
// fetched by tests/conformance/tokenizer/fetch_assets.sh; the ctest fixture runs it first):
//  * rendering a reference vector's conversation and encoding the segments gives the ids of the
//    vector text encoded with specials allowed (what openai_harmony's tests assert), and the
//    spec's E1 ids;
//  * the reference's token-id parse vectors parse into the reference's messages;
//  * caller text that spells special tokens stays ordinary ids.

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "services/ivy/harmony/chat_output.h"
#include "services/ivy/harmony/cli.h"
#include "services/ivy/harmony/encode.h"
#include "services/ivy/harmony/parser.h"
#include "services/ivy/harmony/render.h"
#include "services/ivy/tokenizer/tokenizer.h"
#include "tests/conformance/harmony/vector_conversations.h"

namespace garden::ivy::harmony {
namespace {

using conformance::readVector;

const Tokenizer& o200k() {
  static std::unique_ptr<Tokenizer> tok = [] {
    const char* src = std::getenv("GARDEN_SOURCE_DIR");
    std::string root = src ? src : GARDEN_SOURCE_DIR_DEFAULT;
    auto r = loadTokenizer(root + "/tests/assets/tokenizers/gptoss/tokenizer.json");
    if (!r.isOk()) {
      ADD_FAILURE() << "cannot load the gpt-oss tokenizer (run "
                       "tests/conformance/tokenizer/fetch_assets.sh): "
                    << r.status().toString();
      std::abort();
    }
    return std::move(r).value();
  }();
  return *tok;
}

std::vector<TokenId> idsOf(const std::string& text) {
  std::vector<TokenId> ids;
  std::istringstream in(text);
  long long v;
  while (in >> v) ids.push_back(static_cast<TokenId>(v));
  return ids;
}

TEST(HarmonyIds, TokenizerIsHarmony) {
  EXPECT_TRUE(checkHarmonyTokenizer(o200k()).isOk());
  EXPECT_EQ(o200k().encode("hello world"), (std::vector<TokenId>{24912, 2375}));
  EXPECT_EQ(o200k().encode("<|start|>"), (std::vector<TokenId>{27, 91, 5236, 91, 29}));
}

TEST(HarmonyIds, RenderVectorsMatchReferenceEncoding) {
  int compared = 0;
  for (const auto& v : conformance::renderVectors()) {
    RenderConfig config{v.drop_analysis};
    auto segments = v.for_completion
                        ? renderConversationForCompletion(v.messages, Role::kAssistant, config)
                        : renderConversation(v.messages, config);
    ASSERT_TRUE(segments.isOk()) << v.file;
    std::vector<TokenId> ours = encodeSegments(*segments, o200k());
    std::string text = readVector(v.file);
    // Always: our ids decode to the vector text.
    auto decoded = o200k().decode(ours, /*skip_special=*/false);
    ASSERT_TRUE(decoded.isOk()) << v.file;
    EXPECT_EQ(*decoded, text) << v.file;
    if (v.reference_compares_ids) {
      std::vector<TokenId> want;
      o200k().encodeAllowingSpecial(text, &want);
      EXPECT_EQ(ours, want) << v.file;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 10);
}

TEST(HarmonyIds, SpecE1TokenIds) {
  SystemContent sys;
  std::vector<Message> convo = {conformance::systemMessage(sys),
                                Message::text(Role::kUser, "What is 2 + 2?")};
  auto segments = renderConversationForCompletion(convo, Role::kAssistant, RenderConfig{});
  ASSERT_TRUE(segments.isOk());
  EXPECT_EQ(encodeSegments(*segments, o200k()), idsOf(readVector("spec_e1_token_ids.txt")));

  std::vector<Message> user_only = {Message::text(Role::kUser, "What is 2 + 2?")};
  segments = renderConversationForCompletion(user_only, Role::kAssistant, RenderConfig{});
  ASSERT_TRUE(segments.isOk());
  EXPECT_EQ(encodeSegments(*segments, o200k()),
            idsOf("200006 1428 200008 4827 382 220 17 659 220 17 30 200007 200006 173781"));
}

TEST(HarmonyIds, SpecE3ToolCallMessageIds) {
  SegmentSink sink;
  ASSERT_TRUE(renderMessage(Message::text(Role::kAssistant, "{\"location\":\"San Francisco, CA\"}")
                                .withChannel("commentary")
                                .withRecipient("functions.get_current_weather")
                                .withContentType("<|constrain|>json"),
                            true, &sink)
                  .isOk());
  EXPECT_EQ(encodeSegments(sink.segments(), o200k()),
            idsOf("200006 173781 316 28 44580 775 23981 170154 200005 12606 815 220 200003 4108 "
                  "200008 10848 7693 7534 28499 18826 11 13180 18583 200012"));
}

std::vector<ParsedMessage> parseIds(const std::vector<TokenId>& ids, std::optional<Role> role) {
  ParserOptions options;
  options.role = role;
  options.strict = true;
  auto r = parseCompletion(o200k(), ids, options);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? *r : std::vector<ParsedMessage>{};
}

TEST(HarmonyIds, SimpleReasoningResponse) {
  auto messages =
      parseIds(idsOf(readVector("test_simple_reasoning_response.txt")), Role::kAssistant);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0].header.channel, "analysis");
  EXPECT_EQ(messages[0].content,
            "User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.");
  EXPECT_EQ(messages[1].header.role, Role::kAssistant);
  EXPECT_EQ(messages[1].header.channel, "final");
  EXPECT_EQ(messages[1].content, "2 + 2 = 4.");
}

TEST(HarmonyIds, SimpleToolCall) {
  auto messages = parseIds(idsOf(readVector("test_simple_tool_call.txt")), Role::kAssistant);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0].header.channel, "analysis");
  EXPECT_EQ(messages[0].content,
            "User asks: \"What is the weather in Tokyo?\" We need to use lookup_weather tool.");
  EXPECT_EQ(messages[1].header.channel, "analysis");
  EXPECT_EQ(messages[1].header.recipient, "lookup_weather");
  EXPECT_EQ(messages[1].header.content_type, "code");
  EXPECT_EQ(messages[1].content, "{\"location\": \"Tokyo\"}");
}

TEST(HarmonyIds, StreamableParserAndToolResponse) {
  std::vector<TokenId> ids;
  o200k().encodeAllowingSpecial(readVector("test_streamable_parser.txt"), &ids);
  auto messages = parseIds(ids, Role::kAssistant);
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_EQ(messages[1].header.recipient, "browser.search");
  EXPECT_EQ(messages[1].header.content_type, "code");
  EXPECT_EQ(messages[2].header.author_name, "browser.search");

  ids.clear();
  o200k().encodeAllowingSpecial(readVector("test_tool_response_parsing.txt"), &ids);
  messages = parseIds(ids, std::nullopt);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].header.role, Role::kTool);
  EXPECT_EQ(messages[0].header.author_name, "browser.search");
  EXPECT_EQ(messages[0].header.recipient, "assistant");
  EXPECT_EQ(messages[0].content, "{\"result\": \"https://openai.com/\"}");
}

TEST(HarmonyIds, StreamedDeltasNeverSplitUtf8AndMatchWhole) {
  // Multi-byte text (CJK, emoji) streamed id by id through the real byte-level decoder.
  std::string text = "<|channel|>final<|message|>\u4f60\u597d\U0001F496 caf\u00e9<|return|>";
  std::vector<TokenId> ids;
  o200k().encodeAllowingSpecial(text, &ids);
  HarmonyOutputDecoder decoder(o200k(), ParserOptions{}, ChatOutputOptions{});
  std::string streamed;
  for (TokenId id : ids) {
    ChatDelta d = decoder.push(id);
    // Every delta is whole UTF-8: decoding it again as text changes nothing.
    std::vector<TokenId> re = o200k().encode(d.content);
    auto back = o200k().decode(re, false);
    ASSERT_TRUE(back.isOk());
    EXPECT_EQ(*back, d.content);
    streamed += d.content;
  }
  streamed += decoder.finish().content;
  EXPECT_EQ(streamed, "\u4f60\u597d\U0001F496 caf\u00e9");
  EXPECT_EQ(decoder.output().content, streamed);
}

// Reserved ids sampled by the model, named in the tokenizer.json (200013) or not (200019 and up:
// the file stops at 200018, the model has 201088 rows), never reach chat text: no U+FFFD, no
// "<|reserved_...|>", in content, in reasoning or in a header (they are dropped, as Hugging Face
// decodes outputs with skip_special_tokens=True).
TEST(HarmonyIds, ReservedIdsAreNeverVisibleText) {
  ASSERT_EQ(o200k().vocabSize(), 200019);
  auto enc = [](std::string_view text) {
    std::vector<TokenId> ids;
    o200k().encodeAllowingSpecial(text, &ids);
    return ids;
  };
  const std::vector<TokenId> reserved{200013, 200019, 200500, kModelVocabSize - 1};
  std::vector<TokenId> ids = enc("<|channel|>analysis<|message|>a");
  ids.insert(ids.end(), reserved.begin(), reserved.end());
  auto more = enc("b<|end|><|start|>assistant<|channel|>final");
  ids.insert(ids.end(), more.begin(), more.end());
  ids.insert(ids.end(), reserved.begin(), reserved.end());  // inside the header
  more = enc("<|message|>\u4f60");
  ids.insert(ids.end(), more.begin(), more.end());
  // Between the bytes of one character.
  std::vector<TokenId> bytes;
  o200k().encode("\xE2", &bytes);
  o200k().encode("\x82", &bytes);
  o200k().encode("\xAC", &bytes);
  ASSERT_EQ(bytes.size(), 3u);
  ids.push_back(bytes[0]);
  ids.insert(ids.end(), reserved.begin(), reserved.end());
  ids.push_back(bytes[1]);
  ids.push_back(bytes[2]);
  ids.push_back(kReturn);

  HarmonyOutputDecoder decoder(o200k(), ParserOptions{}, ChatOutputOptions{});
  ChatDelta streamed;
  for (TokenId id : ids) streamed.append(decoder.push(id));
  streamed.append(decoder.finish());
  EXPECT_EQ(decoder.output().reasoning_content, "ab");
  EXPECT_EQ(decoder.output().content, "\u4f60\u20ac");
  EXPECT_EQ(streamed.reasoning_content, "ab");
  EXPECT_EQ(streamed.content, "\u4f60\u20ac");
  ASSERT_EQ(decoder.parser().messages().size(), 2u);
  EXPECT_EQ(decoder.parser().messages()[1].header.channel, "final");
}

// `ivy harmony-render --tokenizer=...` prints the text and ids of E2 (spec §1.12).
TEST(HarmonyIds, CliPrintsIdsOfTheRenderedPrompt) {
  const std::string body = R"({"reasoning_effort":"high","messages":[
      {"role":"system","content":"Use a friendly tone."},
      {"role":"user","content":"What is the weather like in SF?"}],
      "tools":[{"type":"function","function":{"name":"get_current_weather",
      "description":"Gets the current weather in the provided location.",
      "parameters":{"type":"object","properties":{
        "location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},
        "format":{"type":"string","enum":["celsius","fahrenheit"],"default":"celsius"}},
      "required":["location"]}}}]})";
  const char* src = std::getenv("GARDEN_SOURCE_DIR");
  std::string tok_arg = "--tokenizer=" + std::string(src ? src : GARDEN_SOURCE_DIR_DEFAULT) +
                        "/tests/assets/tokenizers/gptoss/tokenizer.json";
  std::string a0 = "harmony-render", a1 = "--date=2025-06-28", a2 = "--format=text";
  char* argv[] = {a0.data(), a1.data(), a2.data(), tok_arg.data()};
  std::istringstream in(body);
  std::ostringstream out;
  auto* old_in = std::cin.rdbuf(in.rdbuf());
  auto* old_out = std::cout.rdbuf(out.rdbuf());
  int rc = runHarmonyRenderCli(4, argv);
  std::cin.rdbuf(old_in);
  std::cout.rdbuf(old_out);
  ASSERT_EQ(rc, 0);
  std::string want_text = readVector("spec_e2_system_developer_user.txt");
  std::string printed = out.str();
  ASSERT_EQ(printed.substr(0, want_text.size() + 1), want_text + "\n");
  std::vector<TokenId> ids = idsOf(printed.substr(want_text.size() + 1));
  ASSERT_FALSE(ids.empty());
  auto decoded = o200k().decode(ids, false);
  ASSERT_TRUE(decoded.isOk());
  EXPECT_EQ(*decoded, want_text);
  EXPECT_EQ(ids.back(), 173781);
  EXPECT_EQ(ids[ids.size() - 2], kStart);
}

}  // namespace
}  // namespace garden::ivy::harmony
