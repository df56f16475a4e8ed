// Streaming parser: the spec's trace (E6), header parsing table (§1.11), UTF-8 streaming, strict
// errors where the reference errors, and every lenient recovery documented in parser.h.

#include "services/ivy/harmony/parser.h"

#include <gtest/gtest.h>

#include "tests/fakes/ivy/harmony_fake_tokenizer.h"

namespace garden::ivy::harmony {
namespace {

using garden::ivy::testing::HarmonyFakeTokenizer;

std::vector<TokenId> ids(const HarmonyFakeTokenizer& tok, std::string_view text) {
  std::vector<TokenId> out;
  tok.encodeAllowingSpecial(text, &out);
  return out;
}

struct ParseRun {
  std::vector<ParserEvent> events;
  std::vector<ParsedMessage> messages;
  std::vector<std::string> recoveries;
  Status status;
};

ParseRun run(std::span<const TokenId> input, ParserOptions options, bool finish = true) {
  HarmonyFakeTokenizer tok;
  StreamParser parser(tok, options);
  ParseRun r;
  for (TokenId id : input) {
    r.status = parser.push(id, &r.events);
    if (!r.status.isOk()) break;
  }
  if (finish && r.status.isOk()) r.status = parser.finish(&r.events);
  r.messages = parser.messages();
  r.recoveries = parser.recoveries();
  return r;
}

ParseRun runText(std::string_view text, ParserOptions options = {}) {
  HarmonyFakeTokenizer tok;
  return run(ids(tok, text), options);
}

bool validUtf8(std::string_view s) {
  std::string pending(s);
  std::string out;
  HarmonyFakeTokenizer::drain(&pending, false, &out);
  return pending.empty() && out == s;
}

TEST(HarmonyParser, SpecE6Trace) {
  const std::string analysis = "User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.";
  ParseRun r = runText("<|channel|>analysis<|message|>" + analysis +
                       "<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>");
  ASSERT_TRUE(r.status.isOk());
  ASSERT_EQ(r.messages.size(), 2u);
  // Events: start, deltas..., end, start, deltas..., end.
  ASSERT_TRUE(std::holds_alternative<MessageStart>(r.events.front()));
  EXPECT_EQ(std::get<MessageStart>(r.events.front()).header.channel, "analysis");
  std::string text[2];
  int message = -1;
  std::vector<MessageEnd> ends;
  for (const auto& e : r.events) {
    if (std::holds_alternative<MessageStart>(e)) ++message;
    if (const auto* d = std::get_if<ContentDelta>(&e)) text[message] += d->text;
    if (const auto* end = std::get_if<MessageEnd>(&e)) ends.push_back(*end);
  }
  EXPECT_EQ(message, 1);
  EXPECT_EQ(text[0], analysis);
  EXPECT_EQ(text[1], "2 + 2 = 4.");
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_EQ(ends[0].stop_token, kEnd);
  EXPECT_EQ(ends[1].stop_token, kReturn);
  EXPECT_EQ(r.messages[1].header.role, Role::kAssistant);
  EXPECT_EQ(r.messages[1].header.channel, "final");
  EXPECT_TRUE(r.recoveries.empty());
}

TEST(HarmonyParser, HeaderTable) {
  struct Row {
    const char* text;
    std::optional<Role> role;
    MessageHeader want;
  };
  const Row rows[] = {
      {"<|channel|>analysis", Role::kAssistant, {Role::kAssistant, {}, "analysis", {}, {}}},
      {"assistant<|channel|>final", std::nullopt, {Role::kAssistant, {}, "final", {}, {}}},
      {"assistant to=functions.get_weather<|channel|>commentary <|constrain|>json",
       std::nullopt,
       {Role::kAssistant, {}, "commentary", "functions.get_weather", "<|constrain|>json"}},
      {"assistant to=functions.get_weather<|channel|>commentary<|constrain|>json",
       std::nullopt,
       {Role::kAssistant, {}, "commentary", "functions.get_weather", "<|constrain|>json"}},
      {"assistant<|channel|>commentary to=functions.get_weather<|constrain|>json",
       std::nullopt,
       {Role::kAssistant, {}, "commentary", "functions.get_weather", "<|constrain|>json"}},
      {"assistant to=functions.get_weather<|channel|>commentary json",
       std::nullopt,
       {Role::kAssistant, {}, "commentary", "functions.get_weather", "json"}},
      {"assistant to=lookup_weather<|channel|>analysis code",
       std::nullopt,
       {Role::kAssistant, {}, "analysis", "lookup_weather", "code"}},
      {"assistant<|channel|>commentary to=browser.search code",
       std::nullopt,
       {Role::kAssistant, {}, "commentary", "browser.search", "code"}},
      {"functions.lookup_weather to=assistant<|channel|>commentary",
       std::nullopt,
       {Role::kTool, "functions.lookup_weather", "commentary", "assistant", {}}},
      {"browser.search to=assistant<|channel|>commentary",
       std::nullopt,
       {Role::kTool, "browser.search", "commentary", "assistant", {}}},
  };
  for (const Row& row : rows) {
    auto r = parseHeaderText(row.text, row.role, true);
    ASSERT_TRUE(r.isOk()) << row.text << ": " << r.status().toString();
    EXPECT_EQ(r->header, row.want) << row.text;
    EXPECT_FALSE(r->leftover.has_value()) << row.text;
  }
  EXPECT_FALSE(parseHeaderText("bogus", std::nullopt, true).isOk());  // unknown role
  EXPECT_FALSE(parseHeaderText("assistant<|channel|> x", std::nullopt, true).isOk());
  auto leftover = parseHeaderText("assistant a b c", std::nullopt, true);
  ASSERT_TRUE(leftover.isOk());
  EXPECT_EQ(leftover->leftover, "a");
}

TEST(HarmonyParser, Utf8SplitAcrossTokensIsHeldBack) {
  HarmonyFakeTokenizer tok;
  std::vector<TokenId> input = ids(tok, "<|start|>assistant<|message|>");
  for (unsigned char b : std::string("\xF0\x9F\x92\x96")) input.push_back(b);  // 💖, one byte each
  input.push_back(kEnd);
  ParserOptions options;
  options.role.reset();
  ParseRun r = run(input, options);
  ASSERT_TRUE(r.status.isOk());
  std::vector<std::string> deltas;
  for (const auto& e : r.events) {
    if (const auto* d = std::get_if<ContentDelta>(&e)) deltas.push_back(d->text);
  }
  EXPECT_EQ(deltas, std::vector<std::string>{"\xF0\x9F\x92\x96"});
  EXPECT_EQ(r.messages.at(0).content, "\xF0\x9F\x92\x96");
}

TEST(HarmonyParser, InvalidUtf8BecomesReplacementAndDeltasStayValid) {
  HarmonyFakeTokenizer tok;
  ParserOptions options;
  options.role.reset();
  // 9552 = " \xF0\x9F": twice, then "worked" (reference: " \uFFFD \uFFFDworked").
  std::vector<TokenId> input = ids(tok, "<|start|>assistant<|message|>");
  input.push_back(9552);
  input.push_back(9552);
  for (TokenId id : ids(tok, "worked<|end|>")) input.push_back(id);
  ParseRun r = run(input, options);
  ASSERT_TRUE(r.status.isOk());
  EXPECT_EQ(r.messages.at(0).content, " \xEF\xBF\xBD \xEF\xBF\xBDworked");
  for (const auto& e : r.events) {
    if (const auto* d = std::get_if<ContentDelta>(&e)) {
      EXPECT_TRUE(validUtf8(d->text));
    }
  }
  // 9552 then "Hi" then end of stream: " \uFFFDHi".
  input = ids(tok, "<|start|>assistant<|message|>");
  input.push_back(9552);
  for (TokenId id : ids(tok, "Hi")) input.push_back(id);
  r = run(input, options);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, " \xEF\xBF\xBDHi");
  EXPECT_EQ(r.messages[0].end, EndReason::kEndOfStream);
}

TEST(HarmonyParser, PendingBytesDoNotLeakIntoNextMessage) {
  HarmonyFakeTokenizer tok;
  std::vector<TokenId> input = ids(tok, "<|start|>assistant<|message|>");
  input.push_back(9552);
  input.push_back(9552);
  for (TokenId id : ids(tok, "<|end|><|start|>assistant<|message|>Hi<|end|>")) input.push_back(id);
  ParserOptions options;
  options.role.reset();
  ParseRun r = run(input, options);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "Hi");
}

TEST(HarmonyParser, OutOfVocabularyIdIsReplacementCharacter) {
  HarmonyFakeTokenizer tok;
  for (bool strict : {true, false}) {
    std::vector<TokenId> input = ids(
        tok, "<|start|>assistant<|channel|>analysis<|message|>Practice invalid token handling.");
    input.push_back(2147483647);
    ParserOptions options;
    options.role.reset();
    options.strict = strict;
    ParseRun r = run(input, options);
    ASSERT_TRUE(r.status.isOk());
    ASSERT_EQ(r.messages.size(), 1u);
    EXPECT_EQ(r.messages[0].content, "Practice invalid token handling.\xEF\xBF\xBD");
  }
}

TEST(HarmonyParser, StrictErrorsWhereReferenceErrors) {
  ParserOptions strict;
  strict.strict = true;
  strict.role.reset();
  ParseRun r = runText("Hello", strict);  // text while expecting <|start|>
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);

  r = runText("<|start|>assistant<|channel|>final", strict);  // EOS inside a header
  EXPECT_FALSE(r.status.isOk());

  strict.role = Role::kAssistant;
  r = runText("<|channel|>commentary Hello<|end|>", strict);  // header without <|message|>
  EXPECT_FALSE(r.status.isOk());

  // A failed strict parser stays failed.
  HarmonyFakeTokenizer tok;
  StreamParser parser(tok, strict);
  std::vector<ParserEvent> events;
  for (TokenId id : ids(tok, "bogus words here<|message|>")) (void)parser.push(id, &events);
  EXPECT_FALSE(parser.push(kStart, &events).isOk());
  EXPECT_FALSE(parser.finish(&events).isOk());
}

TEST(HarmonyParser, LenientHeaderWithoutMessageToken) {
  ParseRun r = runText("<|channel|>commentary Hello<|end|>");
  ASSERT_TRUE(r.status.isOk());
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].header.channel, "commentary");
  EXPECT_EQ(r.messages[0].content, "Hello");
  EXPECT_EQ(r.messages[0].stop_token, kEnd);
  EXPECT_EQ(r.recoveries.size(), 1u);
}

TEST(HarmonyParser, LenientTruncatedContentAndHeader) {
  ParseRun r = runText("<|channel|>final<|message|>The answer is");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "The answer is");
  EXPECT_EQ(r.messages[0].end, EndReason::kEndOfStream);
  EXPECT_FALSE(r.messages[0].stop_token.has_value());

  r = runText("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|chan");
  ASSERT_TRUE(r.status.isOk());
  // A header cut off at end of stream whose role is not known yet is dropped (the reference's
  // non-strict rule), and the drop is recorded.
  EXPECT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.recoveries.size(), 1u);

  r = runText(
      "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>");
  ASSERT_EQ(r.messages.size(), 2u);  // header complete, content empty
  EXPECT_EQ(r.messages[1].header.channel, "final");
  EXPECT_EQ(r.messages[1].content, "");
  EXPECT_EQ(r.messages[1].end, EndReason::kEndOfStream);

  r = runText("<|channel|>fin");  // role known from the prompt: the words become content
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].header.channel, "fin");
  EXPECT_EQ(r.messages[0].end, EndReason::kEndOfStream);

  r = runText("<|channel|>analysis<|message|>x<|end|><|start|>");  // empty header at EOS
  ASSERT_TRUE(r.status.isOk());
  EXPECT_EQ(r.messages.size(), 1u);
}

TEST(HarmonyParser, LenientTextWithoutHeaderAndStrayTokens) {
  ParserOptions options;
  options.role.reset();
  ParseRun r = runText("<|end|>Hello world", options);
  ASSERT_TRUE(r.status.isOk());
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].header.role, Role::kAssistant);
  EXPECT_EQ(r.messages[0].header.channel, std::nullopt);
  EXPECT_EQ(r.messages[0].content, "Hello world");
  EXPECT_EQ(r.recoveries.size(), 2u);  // dropped <|end|>, implicit message

  // <|channel|> right after a message: an assistant header is assumed.
  r = runText("<|channel|>analysis<|message|>a<|end|><|channel|>final<|message|>b<|return|>");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].header.channel, "final");
  EXPECT_EQ(r.messages[1].content, "b");
}

TEST(HarmonyParser, LenientStructureTokensInsideContent) {
  ParseRun r = runText(
      "<|channel|>analysis<|message|>think<|start|>assistant<|channel|>final"
      "<|message|>answer<|return|>");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].content, "think");
  EXPECT_EQ(r.messages[0].end, EndReason::kImplicit);
  EXPECT_EQ(r.messages[1].header.channel, "final");
  EXPECT_EQ(r.messages[1].content, "answer");

  r = runText("<|channel|>analysis<|message|>think<|channel|>final<|message|>answer");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].content, "think");
  EXPECT_EQ(r.messages[1].header.channel, "final");
  EXPECT_EQ(r.messages[1].header.role, Role::kAssistant);

  r = runText(
      "<|channel|>final<|message|>a<|reserved_200013|><|constrain|><|message|>b"
      "<|endoftext|>");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "ab");
  EXPECT_EQ(r.messages[0].stop_token, kEndOfText);

  // Strict mode keeps the reference behaviour: formatting tokens in content are literal text.
  ParserOptions strict;
  strict.strict = true;
  r = runText("<|channel|>final<|message|>a<|start|>b<|end|>", strict);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "a<|start|>b");
}

TEST(HarmonyParser, LenientDropsReservedIdsInHeaders) {
  // A reserved id in a header is no part of the channel or recipient (lenient mode only).
  ParseRun r = runText(
      "<|channel|>commentary to=functions.get<|reserved_200013|>_weather"
      "<|reserved_201087|><|message|>{}<|call|>");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].header.channel, "commentary");
  EXPECT_EQ(r.messages[0].header.recipient, "functions.get_weather");
  EXPECT_EQ(r.messages[0].content, "{}");
}

TEST(HarmonyParser, LenientBadHeaders) {
  ParseRun r = runText("<|start|>x<|start|>assistant<|channel|>final<|message|>ok<|end|>",
                       ParserOptions{std::nullopt, false, 256});
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "ok");
  EXPECT_EQ(r.messages[0].header.channel, "final");

  r = runText("<|channel|> one two three<|message|>ok<|end|>");  // empty channel, leftovers
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].header.channel, std::nullopt);
  EXPECT_EQ(r.messages[0].header.recipient, "two");
  EXPECT_EQ(r.messages[0].header.content_type, "three");
  EXPECT_EQ(r.messages[0].content, "ok");
  EXPECT_EQ(r.recoveries.size(), 2u);  // empty channel; leftover "one"

  r = runText("<|start|>gibberish<|message|>ok<|end|>", ParserOptions{std::nullopt, false, 256});
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].header.role, Role::kAssistant);
}

TEST(HarmonyParser, LenientHeaderOverflowKeepsMemoryBounded) {
  std::string long_header(1000, 'a');
  ParseRun r = runText("<|channel|>analysis " + long_header + " tail<|end|>",
                       ParserOptions{Role::kAssistant, false, 64});
  ASSERT_TRUE(r.status.isOk());
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].header.channel, "analysis");
  // Everything after the channel ends up as content, nothing is lost.
  EXPECT_EQ(r.messages[0].content, long_header + " tail");
}

}  // namespace
}  // namespace garden::ivy::harmony
