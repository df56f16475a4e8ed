// UTF-8 helpers: strict decoding and the two lossy-repair rules the reference libraries use.
#include "services/ivy/tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace garden::ivy::utf8 {
namespace {

std::string lossy(std::string_view s) {
  std::string out;
  EXPECT_EQ(appendLossy(s, true, &out), 0u);
  return out;
}
std::string perByte(std::string_view s) {
  std::string out;
  EXPECT_EQ(appendPerByteLossy(s, true, &out), 0u);
  return out;
}
const std::string R(kReplacement);

TEST(Utf8, DecodeIsStrict) {
  uint32_t cp = 0;
  EXPECT_EQ(decode(reinterpret_cast<const unsigned char*>("\xC3\xA9"), 2, &cp), 2);
  EXPECT_EQ(cp, 0xE9u);
  EXPECT_EQ(decode(reinterpret_cast<const unsigned char*>("\xC0\xAF"), 2, &cp), 0);  // overlong
  EXPECT_EQ(decode(reinterpret_cast<const unsigned char*>("\xED\xA0\x80"), 3, &cp), 0);  // surrogate
  EXPECT_EQ(decode(reinterpret_cast<const unsigned char*>("\xF4\x90\x80\x80"), 4, &cp), 0);
  EXPECT_EQ(decode(reinterpret_cast<const unsigned char*>("\xF0\x9F\x98\x80"), 4, &cp), 4);
  EXPECT_EQ(cp, 0x1F600u);
  EXPECT_EQ(decode(reinterpret_cast<const unsigned char*>("\xE2\x82"), 2, &cp), 0);  // truncated
}

// Rust's String::from_utf8_lossy: one U+FFFD per maximal invalid subpart.
TEST(Utf8, LossyMatchesMaximalSubpartRule) {
  EXPECT_EQ(lossy("abc"), "abc");
  EXPECT_EQ(lossy("\xE3\x81" "A"), R + "A");
  EXPECT_EQ(lossy("\xF0\x90\x80"), R);
  EXPECT_EQ(lossy("\xC0\xAF"), R + R);
  EXPECT_EQ(lossy("\xED\xA0\x80"), R + R + R);
  EXPECT_EQ(lossy("\x80\x80"), R + R);
  EXPECT_EQ(lossy("a\xF1\x80\x80\xE1\x80\xC2z"), "a" + R + R + R + "z");
}

// sentencepiece: every byte that does not start a valid sequence is its own U+FFFD.
TEST(Utf8, PerByteRule) {
  EXPECT_EQ(perByte("\xE3\x81" "A"), R + R + "A");
  EXPECT_EQ(perByte("\xE3\x81\x82"), "\xE3\x81\x82");
}

TEST(Utf8, IncompleteTailIsHeldUntilFinal) {
  std::string out;
  EXPECT_EQ(appendLossy("ab\xE3\x81", false, &out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(appendLossy("\xE3\x81\x82", false, &out), 0u);
  EXPECT_EQ(out, "\xE3\x81\x82");
  out.clear();
  EXPECT_EQ(appendLossy("\xE3\x41", false, &out), 0u);  // cannot complete: replaced now
  EXPECT_EQ(out, R + "A");
}

}  // namespace
}  // namespace garden::ivy::utf8
