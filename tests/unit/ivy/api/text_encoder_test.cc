#include "services/ivy/api/text_encoder.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace garden::ivy {
namespace {

std::string fixture(const std::string& name) {
  const char* src = std::getenv("GARDEN_SOURCE_DIR");
  std::string root = src != nullptr ? src : ".";
  return root + "/tests/unit/ivy/api/testdata/" + name;
}

std::vector<std::string> lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// Ids from the reference spm_encode CLI (testdata/README.md) must match exactly.
TEST(SentencePieceEncoder, MatchesReferenceCli) {
  auto enc = loadSentencePieceEncoder(fixture("tiny_unigram.model"));
  ASSERT_TRUE(enc.isOk()) << enc.status().toString();
  EXPECT_EQ((*enc)->vocabSize(), 400u);
  std::vector<std::string> inputs = lines(fixture("spm_inputs.txt"));
  std::vector<std::string> expected = lines(fixture("spm_expected_ids.txt"));
  ASSERT_EQ(inputs.size(), 4u);
  ASSERT_EQ(inputs.size(), expected.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    SCOPED_TRACE(inputs[i]);
    auto ids = (*enc)->encode(inputs[i]);
    ASSERT_TRUE(ids.isOk());
    std::vector<int32_t> want;
    std::istringstream ss(expected[i]);
    int v;
    while (ss >> v) want.push_back(v);
    EXPECT_EQ(*ids, want);
  }
}

TEST(SentencePieceEncoder, NoBosOrEos) {
  auto enc = loadSentencePieceEncoder(fixture("tiny_unigram.model"));
  ASSERT_TRUE(enc.isOk());
  auto ids = (*enc)->encode("the");
  ASSERT_TRUE(ids.isOk());
  ASSERT_FALSE(ids->empty());
  // spm_train's defaults: unk=0, bos=1, eos=2.
  for (int32_t id : *ids) {
    EXPECT_NE(id, 1);
    EXPECT_NE(id, 2);
  }
}

TEST(SentencePieceEncoder, MissingFileIsNotFound) {
  auto enc = loadSentencePieceEncoder("/nonexistent/tokenizer.model");
  ASSERT_FALSE(enc.isOk());
  EXPECT_EQ(enc.status().code(), StatusCode::kNotFound);
  EXPECT_NE(enc.status().message().find("/nonexistent/tokenizer.model"), std::string::npos);
}

TEST(SentencePieceEncoder, GarbageFileIsInvalid) {
  auto enc = loadSentencePieceEncoder(fixture("spm_inputs.txt"));
  ASSERT_FALSE(enc.isOk());
  EXPECT_EQ(enc.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace garden::ivy
