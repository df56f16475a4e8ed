// The Tokenizer interface on small hand-built models: a sentencepiece ModelProto written
// byte by byte, and a byte-level BPE tokenizer.json built in the test. Checks the contracts
// the header promises (no special ids from caller text, explicit lookups, streaming never
// emits a broken character, errors name the file) and load-time validation.
#include "services/ivy/tokenizer/tokenizer.h"

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/json_writer.h"
#include "services/ivy/tokenizer/cli.h"

namespace garden::ivy {
namespace {

// ---- a minimal sentencepiece ModelProto, hand-encoded ----
std::string varint(uint64_t v) {
  std::string s;
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
  return s;
}
std::string lenField(int field, const std::string& body) {
  return varint(static_cast<uint64_t>(field) << 3 | 2) + varint(body.size()) + body;
}
std::string piece(const std::string& p, float score, int type) {
  std::string b = lenField(1, p);
  uint32_t bits;
  std::memcpy(&bits, &score, 4);
  b += varint(2 << 3 | 5);
  b.append(reinterpret_cast<const char*>(&bits), 4);
  b += varint(3 << 3 | 0) + varint(static_cast<uint64_t>(type));
  return lenField(1, b);
}
std::string spmModel(bool with_unk = true) {
  std::string m;
  if (with_unk) m += piece("<unk>", 0, 2);
  m += piece("<s>", 0, 3);
  m += piece("</s>", 0, 3);
  m += piece("\xE2\x96\x81", -2, 1);         // ▁
  m += piece("\xE2\x96\x81" "ab", -1, 1);    // ▁ab
  m += piece("a", -3, 1);
  m += piece("b", -3, 1);
  m += piece("c", -3, 1);
  // trainer_spec: model_type=UNIGRAM; normalizer_spec: identity (no charsmap), defaults.
  m += lenField(2, varint(3 << 3) + varint(1));
  m += lenField(3, lenField(1, "identity"));
  return m;
}

TEST(Unigram, HandBuiltModel) {
  auto r = loadTokenizerFromBytes(spmModel(), "tiny.model");
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  const Tokenizer& t = **r;
  EXPECT_EQ(t.kind(), TokenizerKind::kUnigram);
  EXPECT_EQ(t.vocabSize(), 8);
  EXPECT_EQ(t.encode("ab  c"), (std::vector<TokenId>{4, 3, 7}));  // ▁ab ▁ c
  EXPECT_EQ(t.encode("abx"), (std::vector<TokenId>{4, 0}));       // x is unknown
  EXPECT_EQ(t.encode("xyz"), (std::vector<TokenId>{3, 0}));       // one <unk> for the run
  EXPECT_EQ(t.encode("<s>"), (std::vector<TokenId>{3, 0}));       // never the control id
  EXPECT_TRUE(t.isSpecial(1));
  EXPECT_EQ(t.specialIds(), (std::vector<TokenId>{1, 2}));
  EXPECT_EQ(t.tokenId("</s>"), 2);
  EXPECT_EQ(t.idToPiece(4), "\xE2\x96\x81" "ab");
  auto d = t.decode(std::vector<TokenId>{1, 4, 3, 7, 0, 2}, false);
  ASSERT_TRUE(d.isOk());
  EXPECT_EQ(*d, "ab c \xE2\x81\x87 ");
  auto bad = t.decode(std::vector<TokenId>{4, 99}, false);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("99"), std::string::npos);
}

// Scores that could overflow a float path sum (or are not numbers) send the encoder to its plain
// reference walk (see unigram.cc viterbi()); the ids must be the same.
TEST(Unigram, ExtremeScoresUseTheReferenceWalkWithTheSameIds) {
  for (const float odd : {-3e37f, std::numeric_limits<float>::quiet_NaN()}) {
    auto r = loadTokenizerFromBytes(spmModel() + piece("zz", odd, 1), "odd.model");
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    const Tokenizer& t = **r;
    EXPECT_EQ(t.encode("ab  c"), (std::vector<TokenId>{4, 3, 7}));
    EXPECT_EQ(t.encode("abx"), (std::vector<TokenId>{4, 0}));
    EXPECT_EQ(t.encode("xyz"), (std::vector<TokenId>{3, 0}));
  }
}

TEST(Unigram, LoadErrorsNameTheFile) {
  auto r = loadTokenizerFromBytes(spmModel(false), "nounk.model");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("nounk.model"), std::string::npos);
  EXPECT_NE(r.status().message().find("unk"), std::string::npos);
  auto trunc = loadTokenizerFromBytes(spmModel().substr(0, 20), "cut.model");
  ASSERT_FALSE(trunc.isOk());
  EXPECT_EQ(trunc.status().code(), StatusCode::kInvalidArgument);
}

// ---- a minimal byte-level BPE tokenizer.json ----
std::string byteLevelChar(int b) {
  int n = 0;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
    const uint32_t cp = printable ? x : 256 + n++;
    if (x == b) {
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      return s;
    }
  }
  return "";
}
std::string jsonStr(const std::string& s) {
  std::string o;
  JsonWriter::appendQuoted(o, s);
  return o;
}
std::string bpeJson(const std::string& regex_override = "") {
  const std::string regex = regex_override.empty()
      ? "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
        "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+"
      : regex_override;
  std::string vocab;
  for (int b = 0; b < 256; ++b) vocab += jsonStr(byteLevelChar(b)) + ":" + std::to_string(b) + ",";
  vocab += "\"he\":256,\"ll\":257,\"hell\":258,\"hello\":259,\"\xC4\xA0h\":260";
  const std::string merges =
      "[[\"h\",\"e\"],[\"l\",\"l\"],[\"he\",\"ll\"],[\"hell\",\"o\"],[\"\xC4\xA0\",\"h\"]]";
  return std::string("{\"version\":\"1.0\",\"added_tokens\":[") +
         "{\"id\":261,\"content\":\"<|start|>\",\"single_word\":false,\"lstrip\":false,"
         "\"rstrip\":false,\"normalized\":false,\"special\":true},"
         "{\"id\":262,\"content\":\"<think>\",\"single_word\":false,\"lstrip\":false,"
         "\"rstrip\":false,\"normalized\":false,\"special\":false}],"
         "\"normalizer\":{\"type\":\"NFC\"},"
         "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
         "\"pattern\":{\"Regex\":\"" + regex + "\"},\"behavior\":\"Isolated\",\"invert\":false},"
         "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,"
         "\"use_regex\":false}]},"
         "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
         "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
         "\"continuing_subword_prefix\":\"\",\"end_of_word_suffix\":\"\",\"fuse_unk\":false,"
         "\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{" + vocab + "},"
         "\"merges\":" + merges + "}}";
}

}  // namespace

std::string bpeJsonForCliTest() { return bpeJson(); }

namespace {

TEST(Bpe, HandBuiltTokenizerJson) {
  auto r = loadTokenizerFromBytes(bpeJson(), "tiny.json");
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  const Tokenizer& t = **r;
  EXPECT_EQ(t.kind(), TokenizerKind::kByteLevelBpe);
  EXPECT_EQ(t.vocabSize(), 263);
  EXPECT_EQ(t.encode("hello"), (std::vector<TokenId>{259}));
  // Lowest rank first: "he" and "ll" merge before "Ġh" (rank 4) could, so " hello" is Ġ + hello.
  EXPECT_EQ(t.encode("hell hello"), (std::vector<TokenId>{258, 32, 259}));
  EXPECT_EQ(t.encode(" h"), (std::vector<TokenId>{260}));
  // Caller text never yields the special id; the renderer looks it up explicitly.
  const auto ids = t.encode("<|start|>");
  for (TokenId id : ids) EXPECT_FALSE(t.isSpecial(id));
  EXPECT_EQ(ids.size(), 9u);
  std::vector<TokenId> with;
  t.encodeAllowingSpecial("<|start|>hello", &with);
  EXPECT_EQ(with, (std::vector<TokenId>{261, 259}));
  EXPECT_EQ(t.tokenId("<|start|>"), 261);
  EXPECT_EQ(t.specialIds(), (std::vector<TokenId>{261}));
  // Non-special added tokens are matched in text, as HF does.
  EXPECT_EQ(t.encode("<think>"), (std::vector<TokenId>{262}));
  auto d = t.decode(std::vector<TokenId>{261, 259, 262}, true);
  ASSERT_TRUE(d.isOk());
  EXPECT_EQ(*d, "hello<think>");
  // NFC: a decomposed e + U+0301 is encoded like the precomposed character.
  EXPECT_EQ(t.encode("e\xCC\x81"), t.encode("\xC3\xA9"));
}

TEST(Bpe, StreamingNeverEmitsABrokenCharacter) {
  auto r = loadTokenizerFromBytes(bpeJson(), "tiny.json");
  ASSERT_TRUE(r.isOk());
  const Tokenizer& t = **r;
  const std::vector<TokenId> ids = t.encode("h\xE2\x82\xAC!");  // h € !
  ASSERT_EQ(ids.size(), 5u);
  StreamingDetokenizer s(t, false);
  std::vector<std::string> pieces;
  for (TokenId id : ids) pieces.push_back(*s.push(id));
  EXPECT_EQ(pieces, (std::vector<std::string>{"h", "", "", "\xE2\x82\xAC", "!"}));
  EXPECT_EQ(s.finish(), "");
  // A dangling lead byte becomes U+FFFD at the end, as decode() does it.
  StreamingDetokenizer s2(t, false);
  EXPECT_EQ(*s2.push(ids[1]), "");
  EXPECT_EQ(s2.finish(), "\xEF\xBF\xBD");
  EXPECT_FALSE(s2.push(100000).isOk());
}

TEST(Bpe, UnsupportedFilesGetClearErrors) {
  auto r = loadTokenizerFromBytes(bpeJson("\\\\s+"), "odd.json");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("odd.json"), std::string::npos);
  EXPECT_NE(r.status().message().find("Split regex"), std::string::npos);
  auto bad = loadTokenizerFromBytes("{\"model\": ", "broken.json");
  ASSERT_FALSE(bad.isOk());
}

TEST(Cli, FlagErrors) {
  char a0[] = "tokenize";
  char a1[] = "--bogus";
  char* argv1[] = {a0, a1};
  EXPECT_EQ(runTokenizeCli(2, argv1), 2);
  char* argv2[] = {a0};
  EXPECT_EQ(runTokenizeCli(1, argv2), 2);
  char b1[] = "--tokenizer";
  char b2[] = "/nonexistent/tokenizer.json";
  char* argv3[] = {a0, b1, b2};
  EXPECT_EQ(runTokenizeCli(3, argv3), 2);
}

}  // namespace
}  // namespace garden::ivy
