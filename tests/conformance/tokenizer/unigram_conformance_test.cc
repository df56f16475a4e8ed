// Unigram conformance: our sentencepiece-model tokenizer against libsentencepiece, on models
// trained here at test time with the sentencepiece trainer (several vocabulary sizes, with and
// without byte fallback, nmt_nfkc and identity normalization, user-defined and control
// symbols, whitespace options) over the committed corpus plus seeded random text and random
// bytes. The bar is zero mismatches, for encode and for decode; an exact Viterbi tie that 0.1.97
// breaks the other way than sentencepiece 0.2.x (whose rule we follow) is counted, not failed.

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <simdjson.h>

#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {
namespace {

namespace fs = std::filesystem;

std::string sourceDir() {
  const char* s = std::getenv("GARDEN_SOURCE_DIR");
  return s ? s : GARDEN_SOURCE_DIR_DEFAULT;
}

std::vector<std::string> loadCorpus() {
  const std::string path = sourceDir() + "/tests/conformance/tokenizer/corpus.jsonl";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing corpus " << path;
  std::vector<std::string> out;
  simdjson::dom::parser parser;
  std::string line;
  while (std::getline(in, line)) {
    std::string_view s;
    simdjson::dom::element e;
    if (parser.parse(line).get(e) == simdjson::SUCCESS && e.get(s) == simdjson::SUCCESS) {
      out.emplace_back(s);
    } else {
      ADD_FAILURE() << "bad corpus line: " << line;
    }
  }
  return out;
}

struct ModelConfig {
  const char* name;
  const char* args;  // extra spm_train flags
};

// Each model is trained once per test run.
const ModelConfig kModels[] = {
    {"nfkc_v600", "--vocab_size=600 --normalization_rule_name=nmt_nfkc --character_coverage=0.98"},
    {"nfkc_v2000_bytes", "--vocab_size=2000 --normalization_rule_name=nmt_nfkc --byte_fallback=true"},
    {"identity_v1000_bytes_symbols",
     "--vocab_size=1000 --normalization_rule_name=identity --byte_fallback=true "
     "--user_defined_symbols=<sep>,<cls>,<|start|>,ab --control_symbols=<ctl>,<mask>"},
    {"identity_v4000_raw_ws",
     "--vocab_size=4000 --normalization_rule_name=identity --add_dummy_prefix=false "
     "--remove_extra_whitespaces=false --split_digits=true"},
    {"nfkc_v1500_lowcoverage", "--vocab_size=1500 --normalization_rule_name=nmt_nfkc "
                               "--character_coverage=0.99"},
    {"nfkc_cf_v900_bytes_noprefix",
     "--vocab_size=900 --normalization_rule_name=nmt_nfkc_cf --byte_fallback=true "
     "--add_dummy_prefix=false --user_defined_symbols=▁▁,http"},
};

class Models : public ::testing::Environment {
 public:
  static std::string dir() {
    const char* b = std::getenv("GARDEN_BUILD_DIR");
    return std::string(b ? b : ".") + "/conformance_tokenizer_models";
  }
  void SetUp() override {
    fs::create_directories(dir());
    const auto corpus = loadCorpus();
    // Training text: the corpus plus seeded recombinations of its words, so the larger
    // vocabularies have enough material.
    const std::string train = dir() + "/train.txt";
    {
      std::ofstream out(train);
      std::mt19937 rng(7);
      std::vector<std::string> words;
      for (const auto& s : corpus) {
        std::string line = s;
        for (char& c : line) {
          if (c == '\n' || c == '\r') c = ' ';
        }
        out << line << "\n";
        std::istringstream ws(line);
        std::string w;
        while (ws >> w) words.push_back(w);
      }
      for (int i = 0; i < 30000; ++i) {
        const int n = 1 + static_cast<int>(rng() % 12);
        for (int k = 0; k < n; ++k) {
          out << words[rng() % words.size()] << (k + 1 < n ? " " : "\n");
        }
      }
    }
    for (const auto& m : kModels) {
      const std::string prefix = dir() + "/" + m.name;
      if (fs::exists(prefix + ".model")) continue;
      std::string args = "--input=" + train + " --model_prefix=" + prefix +
                         " --model_type=unigram --hard_vocab_limit=false --num_threads=2 "
                         "--minloglevel=2 " + m.args;
      const auto st = sentencepiece::SentencePieceTrainer::Train(args);
      ASSERT_TRUE(st.ok()) << m.name << ": " << st.ToString();
    }
  }
};

std::vector<std::string> testInputs() {
  auto inputs = loadCorpus();
  std::mt19937 rng(42);
  // Random strings over interesting code points, and random bytes (invalid UTF-8 included).
  const std::vector<std::string> alphabet = {
      "a", "b", "Z", "0", "7", " ", "  ", "\t", "\n", "\r\n", "'", "/", ".", "<", ">", "|",
      "é", "e\xcc\x81", "ß", "ſ", "\xe2\x96\x81", "漢", "か", "ｶ", "한", "\xe1\x84\x80",
      "😀", "\xe2\x80\x8d", "\xef\xbb\xbf", "\xc2\xa0", "\xe3\x80\x80", "ﬁ", "Ａ", "①",
      "<sep>", "<cls>", "<|start|>", "<ctl>", "<unk>", "<s>", "ab", "http", "\xe2\x81\x87",
      // ASCII letters before combining marks (the normalizer's ASCII fast path must hand
      // these to the charsmap), kana + combining dakuten, Hangul jamo pairs, "\n" runs.
      "e", "A", "o", "\xcc\x88", "\xcc\x81", "\xe3\x82\x99", "\xe3\x82\xab",
      "\xe1\x85\xa1", "\n\n", "\x0b", "\t ", "\xef\xac\x81"};
  for (int i = 0; i < 1500; ++i) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) s += alphabet[rng() % alphabet.size()];
    inputs.push_back(s);
  }
  for (int i = 0; i < 200; ++i) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) s.push_back(static_cast<char>(rng() % 256));
    inputs.push_back(s);
  }
  return inputs;
}

std::string show(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

class UnigramConformance : public ::testing::TestWithParam<ModelConfig> {};

// sentencepiece 0.2.x (the reference users compare with: conformance_tokenizer_unigram_spm02) and
// Debian's 0.1.97 break exact Viterbi ties differently ([TAG_SPM_FLOAT_TIE]; we follow 0.2.x): two
// segmentations of the same text whose path scores round to the same float are that tie.
bool isExactTie(const sentencepiece::SentencePieceProcessor& spm, const std::vector<int>& a,
                const std::vector<int>& b) {
  double sa = 0, sb = 0;
  for (int id : a) sa += spm.GetScore(id);
  for (int id : b) sb += spm.GetScore(id);
  std::string ta, tb;
  return spm.Decode(a, &ta).ok() && spm.Decode(b, &tb).ok() && ta == tb &&
         static_cast<float>(sa) == static_cast<float>(sb);
}

TEST_P(UnigramConformance, EncodeAndDecodeMatchSentencePiece) {
  const std::string path = Models::dir() + "/" + GetParam().name + ".model";
  sentencepiece::SentencePieceProcessor spm;
  ASSERT_TRUE(spm.Load(path).ok()) << path;
  auto loaded = loadTokenizer(path);
  ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
  const Tokenizer& ours = **loaded;
  ASSERT_EQ(ours.vocabSize(), spm.GetPieceSize());
  ASSERT_EQ(ours.kind(), TokenizerKind::kUnigram);

  const auto inputs = testInputs();
  size_t encode_mismatch = 0, decode_mismatch = 0, stream_mismatch = 0, tokens = 0;
  size_t encode_ties = 0;  // 0.1.97's tie-break, not 0.2.x's: not mismatches
  for (const auto& text : inputs) {
    std::vector<int> ref;
    ASSERT_TRUE(spm.Encode(text, &ref).ok());
    const std::vector<TokenId> got = ours.encode(text);
    tokens += ref.size();
    const std::vector<int> gotv(got.begin(), got.end());
    if (gotv != ref && isExactTie(spm, ref, gotv)) {
      ++encode_ties;
    } else if (gotv != ref) {
      if (++encode_mismatch <= 5) {
        ADD_FAILURE() << GetParam().name << " encode mismatch for \"" << text << "\"\n  ref "
                      << show(ref) << "\n  got " << show({got.begin(), got.end()});
      }
    }
    for (int id : got) EXPECT_FALSE(ours.isSpecial(id)) << "special id " << id << " from text";
    std::string ref_text;
    ASSERT_TRUE(spm.Decode(ref, &ref_text).ok());
    auto dec = ours.decode(std::vector<TokenId>(ref.begin(), ref.end()), false);
    ASSERT_TRUE(dec.isOk());
    if (*dec != ref_text && ++decode_mismatch <= 5) {
      ADD_FAILURE() << GetParam().name << " decode mismatch for " << show(ref) << "\n  ref \""
                    << ref_text << "\"\n  got \"" << *dec << "\"";
    }
  }
  // Decoding arbitrary id sequences (controls, unk, byte pieces splitting characters).
  std::mt19937 rng(99);
  const int vocab = spm.GetPieceSize();
  for (int i = 0; i < 3000; ++i) {
    std::vector<int> ids;
    const int n = static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) {
      // Bias towards low ids: controls, unk and byte pieces live there.
      const int id = (rng() % 2) ? static_cast<int>(rng() % std::min(vocab, 300))
                                 : static_cast<int>(rng() % vocab);
      ids.push_back(id);
    }
    std::string ref_text;
    ASSERT_TRUE(spm.Decode(ids, &ref_text).ok());
    const std::vector<TokenId> tids(ids.begin(), ids.end());
    auto dec = ours.decode(tids, false);
    ASSERT_TRUE(dec.isOk());
    if (*dec != ref_text && ++decode_mismatch <= 10) {
      ADD_FAILURE() << GetParam().name << " decode mismatch for " << show(ids) << "\n  ref \""
                    << ref_text << "\"\n  got \"" << *dec << "\"";
    }
    StreamingDetokenizer stream(ours, false);
    std::string streamed;
    for (TokenId id : tids) {
      auto piece = stream.push(id);
      ASSERT_TRUE(piece.isOk());
      streamed += *piece;
    }
    streamed += stream.finish();
    if (streamed != *dec) ++stream_mismatch;
  }
  EXPECT_EQ(encode_mismatch, 0u) << "of " << inputs.size() << " inputs";
  EXPECT_EQ(decode_mismatch, 0u);
  EXPECT_EQ(stream_mismatch, 0u);
  EXPECT_GT(tokens, 1000u);
  std::printf("[%s] %zu inputs, %zu tokens, 3000 random id sequences: %zu encode, %zu decode "
              "mismatches; %zu exact ties broken the 0.2.x way\n",
              GetParam().name, inputs.size(), tokens, encode_mismatch, decode_mismatch,
              encode_ties);
}

INSTANTIATE_TEST_SUITE_P(Models, UnigramConformance, ::testing::ValuesIn(kModels),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(UnigramLoad, RejectsGarbageWithAClearError) {
  auto r = loadTokenizerFromBytes(std::string("\x0a\x05hello garbage", 15), "bad.model");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("bad.model"), std::string::npos);
  auto missing = loadTokenizer("/nonexistent/tokenizer.model");
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace garden::ivy

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new garden::ivy::Models);
  return RUN_ALL_TESTS();
}
