// Unigram conformance against sentencepiece 0.2.x (what users compare against): the models and
// reference ids in fixtures/spm02/ were made by the sentencepiece Python package (VERSION says
// which) with gen_spm02_fixtures.py: corpus.jsonl, the Apache-2.0 text whole and per paragraph,
// runs of one character or pattern and random strings over a few letters (dense with Viterbi
// ties). Each model is loaded with our tokenizer and every line's ids must match: the bar is
// zero mismatches. For every mismatch the test also prints the path scores of both
// segmentations (sum of piece scores, from the model) and what the local libsentencepiece
// (Debian's 0.1.97) gives, so a tie-break difference can be told from a wrong best path.

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <simdjson.h>

#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {
namespace {

std::string fixtureDir() {
  const char* s = std::getenv("GARDEN_SOURCE_DIR");
  return std::string(s ? s : GARDEN_SOURCE_DIR_DEFAULT) +
         "/tests/conformance/tokenizer/fixtures/spm02";
}

// The ids from `from` on (at most 24 of them), with "..." where some are left out.
std::string show(const std::vector<int>& v, size_t from) {
  from = std::min(from, v.size());
  const size_t to = std::min(v.size(), from + 24);
  std::string s = from ? "[... " : "[";
  for (size_t i = from; i < to; ++i) s += (i > from ? "," : "") + std::to_string(v[i]);
  return s + (to < v.size() ? " ...]" : "]");
}

struct Case {
  std::string text;
  std::vector<int> ids;
};

// model name -> its lines, in file order.
std::map<std::string, std::vector<Case>> loadExpected() {
  std::map<std::string, std::vector<Case>> out;
  const std::string path = fixtureDir() + "/expected.jsonl";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  simdjson::dom::parser parser;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    simdjson::dom::element e;
    std::string_view model, text;
    simdjson::dom::array ids;
    if (parser.parse(line).get(e) != simdjson::SUCCESS ||
        e["model"].get(model) != simdjson::SUCCESS ||
        e["text"].get(text) != simdjson::SUCCESS || e["ids"].get(ids) != simdjson::SUCCESS) {
      ADD_FAILURE() << path << ":" << lineno << ": malformed line";
      continue;
    }
    Case c;
    c.text.assign(text);
    for (auto v : ids) {
      int64_t id;
      if (v.get(id) != simdjson::SUCCESS) {
        ADD_FAILURE() << path << ":" << lineno << ": non-integer id";
        break;
      }
      c.ids.push_back(static_cast<int>(id));
    }
    out[std::string(model)].push_back(std::move(c));
  }
  return out;
}

double pathScore(const sentencepiece::SentencePieceProcessor& spm, const std::vector<int>& ids) {
  double s = 0;
  for (int id : ids) s += spm.GetScore(id);
  return s;
}

TEST(UnigramSpm02, EncodeMatchesSentencePiece02Fixtures) {
  std::ifstream version_file(fixtureDir() + "/VERSION");
  std::string version;
  std::getline(version_file, version);
  ASSERT_EQ(version.rfind("0.2.", 0), 0u) << "fixtures are not from sentencepiece 0.2.x: "
                                          << version;
  const auto expected = loadExpected();
  ASSERT_EQ(expected.size(), 4u) << "expected.jsonl should cover the four fixture models";
  size_t total_lines = 0, total_mismatch = 0;
  for (const auto& [name, cases] : expected) {
    SCOPED_TRACE(name);
    const std::string path = fixtureDir() + "/" + name + ".model";
    auto loaded = loadTokenizer(path);
    ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
    const Tokenizer& ours = **loaded;
    sentencepiece::SentencePieceProcessor spm;  // local libsentencepiece, for diagnostics
    ASSERT_TRUE(spm.Load(path).ok()) << path;
    ASSERT_EQ(ours.vocabSize(), spm.GetPieceSize());
    EXPECT_GT(cases.size(), 1000u);
    size_t mismatch = 0, local_spm_mismatch = 0, tokens = 0, ours_lower = 0, ours_higher = 0;
    for (const Case& c : cases) {
      tokens += c.ids.size();
      const std::vector<TokenId> got_t = ours.encode(c.text);
      const std::vector<int> got(got_t.begin(), got_t.end());
      std::vector<int> local;
      ASSERT_TRUE(spm.Encode(c.text, &local).ok());
      if (local != c.ids) ++local_spm_mismatch;
      if (got == c.ids) continue;
      ++mismatch;
      const double want_score = pathScore(spm, c.ids), got_score = pathScore(spm, got);
      if (got_score < want_score) ++ours_lower;
      if (got_score > want_score) ++ours_higher;
      if (mismatch <= 3) {
        std::string text = c.text.size() > 160 ? c.text.substr(0, 160) + "..." : c.text;
        size_t first = 0;
        while (first < got.size() && first < c.ids.size() && got[first] == c.ids[first]) ++first;
        const size_t from = first > 4 ? first - 4 : 0;
        ADD_FAILURE() << name << " encode mismatch for \"" << text << "\" (" << c.text.size()
                      << " bytes), first difference at id " << first << "\n  want "
                      << show(c.ids, from) << " path score " << want_score << "\n  got  "
                      << show(got, from) << " path score " << got_score
                      << "\n  local libsentencepiece " << (local == c.ids ? "== want" : "!= want");
      }
    }
    total_lines += cases.size();
    total_mismatch += mismatch;
    std::printf("[%s] %zu lines, %zu tokens: %zu mismatches (our path scores lower on %zu, higher "
                "on %zu, equal on %zu); local libsentencepiece: %zu mismatches\n",
                name.c_str(), cases.size(), tokens, mismatch, ours_lower, ours_higher,
                mismatch - ours_lower - ours_higher, local_spm_mismatch);
    EXPECT_EQ(mismatch, 0u) << "of " << cases.size() << " lines";
  }
  std::printf("spm02 fixtures (sentencepiece %s): %zu lines, %zu mismatches\n", version.c_str(),
              total_lines, total_mismatch);
}

}  // namespace
}  // namespace garden::ivy
