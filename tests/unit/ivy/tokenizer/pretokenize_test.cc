// The hand-written Split matchers on cases whose regex result is known (tiktoken/HF
// behaviour). The full check against Hugging Face is tests/conformance/tokenizer.
#include "services/ivy/tokenizer/pretokenize.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace garden::ivy {
namespace {

std::vector<std::string> split(SplitPattern p, std::string_view text) {
  std::vector<uint32_t> ends;
  splitPieces(p, text, &ends);
  std::vector<std::string> out;
  uint32_t b = 0;
  for (uint32_t e : ends) {
    out.emplace_back(text.substr(b, e - b));
    b = e;
  }
  return out;
}

using V = std::vector<std::string>;

TEST(Pretokenize, O200k) {
  const auto p = SplitPattern::kO200k;
  EXPECT_EQ(split(p, "Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split(p, "  hello"), (V{" ", " hello"}));
  EXPECT_EQ(split(p, "don't"), (V{"don't"}));
  EXPECT_EQ(split(p, "HELLO'S camelCase"), (V{"HELLO'S", " camel", "Case"}));
  EXPECT_EQ(split(p, "12345"), (V{"123", "45"}));
  EXPECT_EQ(split(p, "a\n\nb"), (V{"a", "\n\n", "b"}));
  EXPECT_EQ(split(p, "x  "), (V{"x", "  "}));
  EXPECT_EQ(split(p, "a/b//\nc"), (V{"a", "/b", "//\n", "c"}));
  EXPECT_EQ(split(p, ""), V{});
}

TEST(Pretokenize, Qwen2) {
  const auto p = SplitPattern::kQwen2;
  EXPECT_EQ(split(p, "Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split(p, "I'M fine"), (V{"I", "'M", " fine"}));
  EXPECT_EQ(split(p, "123"), (V{"1", "2", "3"}));
  EXPECT_EQ(split(p, "!!!\n\nx"), (V{"!!!\n\n", "x"}));
  EXPECT_EQ(split(p, " \t x"), (V{" \t", " x"}));
}

TEST(Pretokenize, RecognizesOnlyKnownRegexes) {
  EXPECT_FALSE(recognizeSplitRegex("\\s+").has_value());
}

TEST(Pretokenize, InvalidUtf8NeverCrashesAndCoversInput) {
  const std::string bad = "a\xFF\xC3 b\xE2\x82";
  for (auto p : {SplitPattern::kO200k, SplitPattern::kQwen2}) {
    std::string joined;
    for (const auto& s : split(p, bad)) joined += s;
    EXPECT_EQ(joined, bad);
  }
}

}  // namespace
}  // namespace garden::ivy
