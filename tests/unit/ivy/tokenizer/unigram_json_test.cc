// tokenizer.json Unigram: the ByteFallback decoder chain and added tokens with lstrip / rstrip /
// single_word / normalized, on a tiny hand-written file whose expected ids and texts follow Hugging
// Face `tokenizers` (added_vocabulary.rs find_matches, decoders byte_fallback/fuse/strip) by hand.
// The HF-generated fixtures (tests/conformance/tokenizer, *_bytefb_added) check the same at scale.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {
namespace {

// ids: 0 <unk>, 1 ▁, 2 a, 3 b, 4 ▁a, 5 ▁b, 6 <0xC3>, 7 <0xA9>, 8 x; added: 9 <mask> (lstrip),
// 10 [SEP] (rstrip), 11 ab (single_word), 12 Qa (normalized: "ba" after the Q->b Replace),
// 13 <s> (special).
constexpr const char* kJson = R"({
  "normalizer": {"type": "Replace", "pattern": {"String": "Q"}, "content": "b"},
  "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                    "split": true},
  "decoder": {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": true, "vocab": [
    ["<unk>", 0], ["\u2581", -2], ["a", -3], ["b", -3], ["\u2581a", -1], ["\u2581b", -1],
    ["<0xC3>", -5], ["<0xA9>", -5], ["x", -3]]},
  "added_tokens": [
    {"id": 9, "content": "<mask>", "single_word": false, "lstrip": true, "rstrip": false,
     "normalized": false, "special": false},
    {"id": 10, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": true,
     "normalized": false, "special": false},
    {"id": 11, "content": "ab", "single_word": true, "lstrip": false, "rstrip": false,
     "normalized": false, "special": false},
    {"id": 12, "content": "Qa", "single_word": false, "lstrip": false, "rstrip": false,
     "normalized": true, "special": false},
    {"id": 13, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
     "normalized": false, "special": true}]
})";

class UnigramJsonChain : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = loadTokenizerFromBytes(kJson, "chain.json");
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    tok_ = std::move(*t);
  }
  std::vector<TokenId> enc(const std::string& s) const { return tok_->encode(s); }
  std::string dec(const std::vector<TokenId>& ids) const {
    auto r = tok_->decode(ids, false);
    EXPECT_TRUE(r.isOk());
    // The streaming detokenizer must give the same text.
    StreamingDetokenizer stream(*tok_, false);
    std::string streamed;
    for (TokenId id : ids) streamed += *stream.push(id);
    streamed += stream.finish();
    EXPECT_EQ(streamed, r.isOk() ? *r : "");
    return r.isOk() ? *r : "";
  }
  std::unique_ptr<Tokenizer> tok_;
};

using Ids = std::vector<TokenId>;

TEST_F(UnigramJsonChain, LstripTakesTheSpacesBeforeTheToken) {
  // "x" then <mask> with the two spaces before it; without lstrip they would be "▁▁" pieces.
  EXPECT_EQ(enc("x  <mask>"), (Ids{1, 8, 9}));
}

TEST_F(UnigramJsonChain, RstripTakesTheSpacesAfterTheToken) {
  // The gap after [SEP] is "a" (not at the text start: prepend_scheme always still adds ▁).
  EXPECT_EQ(enc("[SEP]  a"), (Ids{10, 4}));
}

TEST_F(UnigramJsonChain, SingleWordMatchesOnlyWholeWords) {
  // The "ab" inside "xab" is a match that is dropped (its text stays ordinary text).
  EXPECT_EQ(enc("ab xab ab"), (Ids{11, 1, 8, 2, 3, 1, 11}));
}

TEST_F(UnigramJsonChain, NormalizedTokensMatchTheNormalizedText) {
  // "Qa" is matched as "ba"; the text "ba Qa" normalizes to "ba ba".
  EXPECT_EQ(enc("ba Qa"), (Ids{12, 1, 12}));
}

TEST_F(UnigramJsonChain, SpecialTokensOnlyFromTrustedText) {
  // "<s>" from a caller is text: unknown characters without byte pieces for all bytes -> <unk>.
  EXPECT_EQ(enc("a<s>"), (Ids{4, 0}));
  std::vector<TokenId> trusted;
  tok_->encodeAllowingSpecial("a<s>", &trusted);
  EXPECT_EQ(trusted, (Ids{4, 13}));
}

TEST_F(UnigramJsonChain, ByteFallbackEncodesUnknownCharacters) {
  EXPECT_EQ(enc("a \xC3\xA9"), (Ids{4, 1, 6, 7}));
}

TEST_F(UnigramJsonChain, DecoderChainJoinsByteRunsAndStripsOneLeadingSpace) {
  EXPECT_EQ(dec({4, 1, 6, 7, 5}), "a \xC3\xA9 b");
  // Only one leading space goes.
  EXPECT_EQ(dec({1, 4}), " a");
  // A broken run: one U+FFFD per byte, and the FFFD is not stripped.
  EXPECT_EQ(dec({6, 4}), "\xEF\xBF\xBD a");
  EXPECT_EQ(dec({6, 6, 7}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(dec({6, 7}), "\xC3\xA9");
  // Added tokens decode to their content, through the chain.
  EXPECT_EQ(dec({9, 5}), "<mask> b");
}

TEST_F(UnigramJsonChain, StreamingHoldsAByteRunUntilItEnds) {
  StreamingDetokenizer stream(*tok_, false);
  EXPECT_EQ(*stream.push(4), "a");
  EXPECT_EQ(*stream.push(6), "");
  EXPECT_EQ(*stream.push(7), "");
  EXPECT_EQ(*stream.push(5), "\xC3\xA9 b");
  EXPECT_EQ(stream.finish(), "");
}

TEST_F(UnigramJsonChain, RandomInputNeverBreaksIt) {
  std::mt19937 rng(5);
  const std::vector<std::string> parts = {"a", "b", "x", " ", "  ", "<mask>", "[SEP]", "ab", "Qa",
                                          "<s>", "\xC3\xA9", "\xC3", "\xFF", "\t", "\xE2\x96\x81"};
  for (int i = 0; i < 500; ++i) {
    std::string text;
    for (int k = static_cast<int>(rng() % 12); k > 0; --k) text += parts[rng() % parts.size()];
    for (TokenId id : enc(text)) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 13) << "caller text gave a special id for \"" << text << "\"";
    }
    std::vector<TokenId> ids;
    for (int k = static_cast<int>(rng() % 10); k > 0; --k) {
      ids.push_back(static_cast<TokenId>(rng() % 14));
    }
    dec(ids);  // decode == streaming is checked inside
  }
}

TEST(UnigramJsonDecoder, UnsupportedStepsAreRejectedByName) {
  std::string json = kJson;
  const std::string strip = R"({"type": "Strip", "content": " ", "start": 1, "stop": 0})";
  json.replace(json.find(strip), strip.size(),
               R"({"type": "Strip", "content": " ", "start": 1, "stop": 2})");
  auto t = loadTokenizerFromBytes(json, "bad.json");
  ASSERT_FALSE(t.isOk());
  EXPECT_NE(t.status().message().find("decoders[3]"), std::string::npos)
      << t.status().message();
}

}  // namespace
}  // namespace garden::ivy
