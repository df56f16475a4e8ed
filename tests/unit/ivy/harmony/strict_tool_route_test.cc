// Strict function tools [TAG_STRICT_TOOLS]: tulip's ConstrainedDecoder decides which message
// bodies to constrain by following the Harmony stream itself (common/grammar/constrained.h);
// ivy's output decoder decides which messages are tool calls. They must agree, or a call ivy
// returns could have escaped its grammar. Random Harmony streams (well-formed and broken headers,
// recipients in either place, bare names, other roles, stray and reserved tokens, unfinished
// bodies) go through both; at every token the decoder must be constrained to tool f exactly when
// ivy has just opened a call to strict tool f.

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/grammar/constrained.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/vocabulary.h"
#include "services/ivy/harmony/chat_output.h"
#include "services/ivy/harmony/tokens.h"
#include "tests/fakes/ivy/harmony_fake_tokenizer.h"

namespace garden::ivy::harmony {
namespace {

using garden::ivy::testing::HarmonyFakeTokenizer;

// The fake tokenizer's ids as the grammar sees them: bytes per id, specials excluded.
std::shared_ptr<const grammar::Vocabulary> fakeVocabulary(const HarmonyFakeTokenizer& tok) {
  std::vector<std::string> tokens(kModelVocabSize);
  std::vector<uint8_t> excluded(kModelVocabSize, 0);
  for (TokenId id = 0; id < kModelVocabSize; ++id) {
    if (id >= kFirstSpecialId) {
      excluded[static_cast<size_t>(id)] = 1;
      continue;
    }
    (void)tok.tokenBytes(id, /*skip_special=*/false, &tokens[static_cast<size_t>(id)]);
  }
  return std::make_shared<grammar::Vocabulary>(std::move(tokens), excluded);
}

std::shared_ptr<const grammar::CompiledGrammar> compile(
    const std::string& schema, const std::shared_ptr<const grammar::Vocabulary>& vocab) {
  auto g = grammar::jsonSchemaGrammar(schema);
  EXPECT_TRUE(g.isOk()) << g.status().message();
  auto c = grammar::CompiledGrammar::compile(std::move(g).value(), vocab);
  EXPECT_TRUE(c.isOk());
  return *c;
}

template <size_t N>
const char* pick(std::mt19937& rng, const char* const (&options)[N]) {
  return options[rng() % N];
}

// One random Harmony stream (text with special tokens spelled out).
std::string randomStream(std::mt19937& rng) {
  static const char* const kStart[] = {"<|start|>", "<|start|>", "<|start|>", "", "<|end|>"};
  static const char* const kRole[] = {"assistant", "assistant", "assistant",
                                      "assistant to=functions.f", "assistant to=functions.g",
                                      "assistant to=f", "functions.f to=assistant", "user",
                                      "user to=functions.f", "tool", "", "mystery"};
  static const char* const kChannel[] = {"<|channel|>commentary", "<|channel|>commentary",
                                         "<|channel|>analysis", "<|channel|>final", "",
                                         "<|channel|>"};
  static const char* const kRecipient[] = {" to=functions.f", " to=functions.g",
                                           " to=functions.h", " to=functions.f", " to=f",
                                           " functions.g", " to=browser.search", " to=functions.",
                                           " to=functions.ff", "", ""};
  static const char* const kType[] = {"", " <|constrain|>json", "<|constrain|>json", " json",
                                      " <|constrain|>json", "<|reserved_200013|>",
                                      " <|endoftext|>"};
  static const char* const kMessage[] = {"<|message|>", "<|message|>", "<|message|>", ""};
  static const char* const kBody[] = {R"({"n":1})", R"({"b":true})", "Hello world", R"({"n":)",
                                      "x<|channel|>commentary to=functions.f<|message|>",
                                      "<|start|>assistant", "", R"({"n":12})"};
  static const char* const kStop[] = {"<|call|>", "<|call|>", "<|end|>", "<|return|>", "",
                                      "<|endoftext|>"};
  std::string s;
  const int messages = 1 + static_cast<int>(rng() % 6);
  for (int m = 0; m < messages; ++m) {
    if (m > 0) s += pick(rng, kStart);
    if (m > 0) s += pick(rng, kRole);
    s += pick(rng, kChannel);
    s += pick(rng, kRecipient);
    s += pick(rng, kType);
    s += pick(rng, kMessage);
    s += pick(rng, kBody);
    s += pick(rng, kStop);
  }
  return s;
}

TEST(StrictToolRoute, DecoderSwitchesExactlyWhereIvyOpensAStrictCall) {
  HarmonyFakeTokenizer tok;
  const auto vocab = fakeVocabulary(tok);
  grammar::ConstraintSpec base;
  base.tools = {
      {"f", compile(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],)"
                    R"("additionalProperties":false})",
                    vocab)},
      {"g", compile(R"({"type":"object","properties":{"b":{"type":"boolean"}},"required":["b"],)"
                    R"("additionalProperties":false})",
                    vocab)}};
  base.harmony = {kStart, kChannel, kConstrain, kMessage, kEnd, kCall, kReturn, kEndOfText};
  std::mt19937 rng(18);
  int calls_strict = 0, calls_other = 0, completed = 0;
  for (int run = 0; run < 3000; ++run) {
    // A third of the runs start inside a forced call (tool_choice naming f, or "required").
    std::string prefix;
    switch (run % 3) {
      case 1:
        prefix = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>";
        break;
      case 2:
        prefix = "<|channel|>commentary to=functions.";
        break;
    }
    const std::string text = prefix + (run % 3 == 2 ? std::string(pick(rng, {"f", "g", "h"})) +
                                                          " <|constrain|>json<|message|>"
                                                    : "") +
                             randomStream(rng);
    SCOPED_TRACE(text);
    std::vector<TokenId> prefix_ids, ids;
    tok.encodeAllowingSpecial(prefix, &prefix_ids);
    tok.encodeAllowingSpecial(text.substr(prefix.size()), &ids);
    grammar::ConstraintSpec spec = base;
    spec.turn_prefix = prefix_ids;
    grammar::ConstrainedDecoder decoder(nullptr, spec);
    ChatOutputOptions options;
    options.function_names = {"f", "g", "h"};
    HarmonyOutputDecoder ivy(tok, ParserOptions{}, options);
    auto step = [&](TokenId id, bool generated) {
      const int32_t before = decoder.activeTool();
      const bool was_active = decoder.active();
      if (generated) (void)decoder.accept(id);
      ChatDelta d = ivy.push(id);
      int32_t opened = -1;  // the strict tool whose call ivy opened at this token
      bool opened_call = false;
      for (const ToolCallDelta& c : d.tool_calls) {
        if (!c.name) continue;
        opened_call = true;
        if (*c.name == "f") opened = 0;
        if (*c.name == "g") opened = 1;
      }
      if (!generated) return;
      if (opened >= 0) {
        ++calls_strict;
        ASSERT_EQ(decoder.activeTool(), opened) << "ivy opened a strict call at token " << id;
      } else {
        calls_other += opened_call;
        // Constrained only by staying inside a body that was already constrained.
        if (decoder.active()) {
          ASSERT_TRUE(was_active) << "constrained without a strict call at token " << id;
          ASSERT_EQ(decoder.activeTool(), before);
        }
      }
    };
    // The prefix is in the prompt: the decoder replays it itself, ivy's output replays it.
    for (TokenId id : prefix_ids) step(id, false);
    if (!prefix.empty() && text.find("functions.f <|") != std::string::npos && run % 3 == 1) {
      ASSERT_EQ(decoder.activeTool(), 0) << "forced call to f: constrained from the first token";
    }
    for (TokenId id : ids) step(id, true);
    completed += decoder.completed();
  }
  std::printf("strict calls %d, other calls %d, constrained bodies completed %d\n", calls_strict,
              calls_other, completed);
  EXPECT_GT(calls_strict, 300);
  EXPECT_GT(calls_other, 100);
  EXPECT_GT(completed, 100);
}

}  // namespace
}  // namespace garden::ivy::harmony
