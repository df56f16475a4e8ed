// The gateway API's pure parts: request limits, the x-request-timeout header, embedding prompts,
// and the /v1/score and /v1/rerank request parsing, reranker template and response rendering.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <simdjson.h>

#include <cstdlib>

#include "services/ivy/api/embeddings.h"
#include "services/ivy/api/errors.h"
#include "services/ivy/api/limits.h"
#include "services/ivy/api/prompts.h"
#include "services/ivy/api/score.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string testdata(const std::string& name) {
  const char* src = std::getenv("GARDEN_SOURCE_DIR");
  std::string root = src ? src : ".";
  return root + "/tests/unit/ivy/api/testdata/" + name;
}

ModelSpec spec() {
  ModelSpec s;
  s.served_name = "m";
  s.upstream_name = "m-up";
  s.hidden_size = 8;
  s.max_seq_len = 512;
  s.vocab_size = 400;
  return s;
}

// Counts encode() calls: limits checked before tokenization must leave it at zero.
class CountingEncoder : public TextEncoder {
 public:
  Result<std::vector<int32_t>> encode(std::string_view text) const override {
    ++calls;
    seen.emplace_back(text);
    return std::vector<int32_t>(text.size(), 7);  // one token per byte
  }
  uint32_t vocabSize() const override { return 400; }
  mutable int calls = 0;
  mutable std::vector<std::string> seen;
};

void expectField(const Status& st, std::string_view param, std::string_view part) {
  ASSERT_FALSE(st.isOk());
  HttpError e = toHttpError(st);
  EXPECT_EQ(e.status, 400) << st.message();
  EXPECT_EQ(e.param, param) << st.message();
  EXPECT_THAT(st.message(), HasSubstr(std::string(part)));
}

TEST(Limits, CountCharsCountsCodePoints) {
  EXPECT_EQ(countChars(""), 0u);
  EXPECT_EQ(countChars("abc"), 3u);
  EXPECT_EQ(countChars("h\xC3\xA9llo"), 5u);     // é is 2 bytes
  EXPECT_EQ(countChars("\xF0\x9F\x8C\xB1"), 1u);  // one 4-byte emoji
  EXPECT_EQ(countChars("\x80\x80"), 0u);          // stray continuation bytes
}

TEST(Limits, InputCharsAreCheckedBeforeParsingAndTokenization) {
  RequestLimits l;
  l.max_input_chars = 10;
  CountingEncoder enc;
  auto ok = parseEmbeddingsRequest(R"({"model":"m","input":["0123456789"]})", spec(), l);
  ASSERT_TRUE(ok.isOk()) << ok.status().toString();
  // 10 two-byte characters: 20 bytes but 10 characters, accepted.
  std::string ten_e;
  for (int i = 0; i < 10; ++i) ten_e += "\xC3\xA9";
  EXPECT_TRUE(parseEmbeddingsRequest("{\"model\":\"m\",\"input\":\"" + ten_e + "\"}", spec(), l)
                  .isOk());
  auto bad = parseEmbeddingsRequest(R"({"model":"m","input":["ok","0123456789X"]})", spec(), l);
  expectField(bad.status(), "input",
              "input[1]: is longer than the limit of 10 characters (--max-input-chars)");
  EXPECT_EQ(enc.calls, 0);
  // The per-element check behind the raw pre-scan names the element.
  expectField(checkInputChars("0123456789X", "input[1]", l), "input",
              "input[1]: has 11 characters, more than the limit of 10 (--max-input-chars)");
}

TEST(Limits, PreScanCountsDecodedCharacters) {
  EXPECT_EQ(longestStringOver(R"({"a":"0123456789"})", 10), 0u);
  EXPECT_EQ(longestStringOver(R"({"a":"0123456789X"})", 10), 11u);
  size_t at = 0;
  EXPECT_EQ(longestStringOver(R"({"a":"x","b":"0123456789X"})", 10, &at), 11u);
  EXPECT_EQ(at, 13u);  // the opening quote of the over-long literal
  // Escapes count as the character they stand for; a surrogate pair as one.
  EXPECT_EQ(longestStringOver(R"({"a":"\n\n\n\n\n\"\\\u00e9\ud83c\udf31"})", 10), 0u);
  EXPECT_EQ(longestStringOver(R"({"a":"\n\n\n\n\n\"\\\u00e9\ud83c\udf31xy"})", 10), 11u);
  // Multi-byte UTF-8 counts once.
  std::string e;
  for (int i = 0; i < 10; ++i) e += "\xC3\xA9";
  EXPECT_EQ(longestStringOver("{\"a\":\"" + e + "\"}", 10), 0u);
  EXPECT_EQ(longestStringOver(R"({"a":"01234567890"})", 0), 0u);  // no limit
  EXPECT_EQ(longestStringOver(R"("unterminated 0123456789)", 10), 0u);
  // Keys are not texts.
  EXPECT_EQ(longestStringOver(R"({"a_very_long_key_name" : "x"})", 10), 0u);
}

TEST(Limits, InputCountNamesTheFlag) {
  RequestLimits l;
  l.max_inputs = 2;
  auto bad = parseEmbeddingsRequest(R"({"model":"m","input":["a","b","c"]})", spec(), l);
  expectField(bad.status(), "input", "(--max-inputs)");
  EXPECT_TRUE(parseEmbeddingsRequest(R"({"model":"m","input":["a","b"]})", spec(), l).isOk());
}

TEST(Limits, TokensPerInputAndPerRequest) {
  RequestLimits l;
  l.max_input_tokens = 5;
  l.max_request_tokens = 8;
  // Token ids: the per-input flag, then the total, checked while parsing.
  expectField(parseEmbeddingsRequest(R"({"model":"m","input":[[1,2,3,4,5,6]]})", spec(), l)
                  .status(),
              "input", "input[0]: has 6 tokens, more than the limit of 5 (--max-input-tokens)");
  expectField(
      parseEmbeddingsRequest(R"({"model":"m","input":[[1,2,3,4],[1,2,3,4],[1]]})", spec(), l)
          .status(),
      "input", "(--max-request-tokens)");
  // The model's maximum wins when it is smaller than the flag.
  RequestLimits big;
  big.max_input_tokens = 100000;
  ModelSpec s = spec();
  s.max_seq_len = 3;
  expectField(parseEmbeddingsRequest(R"({"model":"m","input":[1,2,3,4]})", s, big).status(),
              "input", "more than the model's maximum of 3");

  // Text: tokenization stops at the first input that takes the total past the limit.
  CountingEncoder enc;
  auto req = parseEmbeddingsRequest(R"({"model":"m","input":["abcd","efgh","ij","kl"]})", spec(),
                                    l);
  ASSERT_TRUE(req.isOk());
  auto toks = resolveTokens(*req, &enc, spec(), l);
  expectField(toks.status(), "input", "(--max-request-tokens)");
  EXPECT_EQ(enc.calls, 3);  // "kl" was never tokenized
  auto one = parseEmbeddingsRequest(R"({"model":"m","input":"abcdef"})", spec(), l);
  expectField(resolveTokens(*one, &enc, spec(), l).status(), "input",
              "input: has 6 tokens, more than the limit of 5 (--max-input-tokens)");
}

TEST(Limits, RequestTimeoutHeader) {
  using std::chrono::microseconds;
  EXPECT_FALSE(parseRequestTimeout("")->has_value());
  EXPECT_EQ(parseRequestTimeout("2")->value(), microseconds(2000000));
  EXPECT_EQ(parseRequestTimeout(" 0.25 ")->value(), microseconds(250000));
  EXPECT_EQ(parseRequestTimeout("0.001")->value(), microseconds(1000));
  for (std::string_view bad : {"0", "-1", "abc", "1e3", "inf", "nan", "1.2.3", ".", "3601",
                               "10ms", "0.0000001", "99999999999999999"}) {
    auto r = parseRequestTimeout(bad);
    ASSERT_FALSE(r.isOk()) << bad;
    HttpError e = toHttpError(r.status());
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "x-request-timeout") << bad;
  }
  using std::chrono::milliseconds;
  EXPECT_EQ(effectiveTimeout(milliseconds(1000), std::nullopt), microseconds(1000000));
  EXPECT_EQ(effectiveTimeout(milliseconds(1000), microseconds(5000000)), microseconds(1000000));
  EXPECT_EQ(effectiveTimeout(milliseconds(1000), microseconds(2000)), microseconds(2000));
  EXPECT_EQ(effectiveTimeout(milliseconds(0), microseconds(2000)), microseconds(2000));
  EXPECT_EQ(effectiveTimeout(milliseconds(0), std::nullopt), microseconds(0));
}

TEST(Prompts, SentenceTransformersConfig) {
  auto set = PromptSet::fromSentenceTransformersJson(
      R"({"prompts":{"query":"Instruct: find\nQuery:","document":""},"default_prompt_name":null,
          "similarity_fn_name":"cosine"})",
      "cfg");
  ASSERT_TRUE(set.isOk()) << set.status().toString();
  EXPECT_EQ(*set->select("query", "input_type"), "Instruct: find\nQuery:");
  EXPECT_EQ(*set->select("document", "input_type"), "");
  EXPECT_EQ(*set->select("", "input_type"), "");  // no default
  auto bad = set->select("passage", "prompt_name");
  expectField(bad.status(), "prompt_name", "unknown prompt name \"passage\"");
  EXPECT_THAT(bad.status().message(), HasSubstr("\"document\", \"query\""));

  auto def = PromptSet::fromSentenceTransformersJson(
      R"({"prompts":{"q":"Q: "},"default_prompt_name":"q"})", "cfg");
  ASSERT_TRUE(def.isOk());
  EXPECT_EQ(*def->select("", "input_type"), "Q: ");
  EXPECT_FALSE(PromptSet::fromSentenceTransformersJson(R"({"prompts":{"q":1}})", "cfg").isOk());
  EXPECT_FALSE(PromptSet::fromSentenceTransformersJson(
                   R"({"prompts":{"q":"x"},"default_prompt_name":"z"})", "cfg")
                   .isOk());
  EXPECT_TRUE(PromptSet::fromSentenceTransformersJson("{}", "cfg")->prompts().empty());
  EXPECT_TRUE(PromptSet::fromModelDir("/nonexistent-dir")->prompts().empty());
}

TEST(Prompts, EmbeddingsPromptIsPrependedToTextOnly) {
  auto req = parseEmbeddingsRequest(R"({"model":"m","input":["a","b"],"input_type":"query"})",
                                    spec());
  ASSERT_TRUE(req.isOk());
  EXPECT_EQ(req->prompt_name, "query");
  EXPECT_EQ(req->prompt_field, "input_type");
  CountingEncoder enc;
  auto toks = resolveTokens(*req, &enc, spec(), {}, "Q: ");
  ASSERT_TRUE(toks.isOk());
  EXPECT_THAT(enc.seen, ElementsAre("Q: a", "Q: b"));
  EXPECT_EQ((*toks)[0].size(), 4u);

  auto ids = parseEmbeddingsRequest(R"({"model":"m","input":[1,2],"prompt_name":"query"})",
                                    spec());
  ASSERT_TRUE(ids.isOk());
  expectField(resolveTokens(*ids, &enc, spec(), {}, "Q: ").status(), "prompt_name",
              "cannot be applied to token-id inputs");
  expectField(parseEmbeddingsRequest(
                  R"({"model":"m","input":"a","input_type":"query","prompt_name":"query"})",
                  spec())
                  .status(),
              "prompt_name", "only one of");
  expectField(
      parseEmbeddingsRequest(R"({"model":"m","input":"a","input_type":3})", spec()).status(),
      "input_type", "must be a string");
}

TEST(ScoreParse, ScoreAndRerankRequests) {
  RequestLimits l;
  auto r = parseScoringRequest(
      R"({"model":"m","query":"q","documents":["a","b"],"instruction":"judge"})", spec(), l,
      ScoreApi::kScore);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->query, "q");
  EXPECT_THAT(r->documents, ElementsAre("a", "b"));
  EXPECT_EQ(r->instruction.value(), "judge");

  auto rr = parseScoringRequest(
      R"({"model":"m","query":"q","documents":["a","b","c"],"top_n":2,"return_documents":true})",
      spec(), l, ScoreApi::kRerank);
  ASSERT_TRUE(rr.isOk());
  EXPECT_EQ(rr->top_n, 2u);
  EXPECT_TRUE(rr->return_documents);
  EXPECT_FALSE(rr->instruction.has_value());

  struct Case {
    const char* body;
    const char* param;
    const char* part;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"model":"m","documents":["a"]})", "query", "query: is required"},
           {R"({"model":"m","query":"","documents":["a"]})", "query", "empty"},
           {R"({"model":"m","query":"q"})", "documents", "documents: is required"},
           {R"({"model":"m","query":"q","documents":[]})", "documents", "empty array"},
           {R"({"model":"m","query":"q","documents":["a",3]})", "documents",
            "documents[1]: must be a string"},
           {R"({"model":"m","query":"q","documents":["a",""]})", "documents", "documents[1]"},
           {R"({"model":"m","query":"q","documents":["a"],"instruction":5})", "instruction",
            "must be a string"},
           {R"({"model":"m","query":"q","documents":["a"],"top_n":0})", "top_n", ">= 1"},
           {R"({"model":"m","query":"q","documents":["a"],"top_n":1.5})", "top_n", ">= 1"},
           {R"({"model":"m","query":"q","documents":["a"],"return_documents":"yes"})",
            "return_documents", "boolean"},
           {R"([1])", "body", "JSON object"},
       }) {
    expectField(parseScoringRequest(c.body, spec(), l, ScoreApi::kRerank).status(), c.param,
                c.part);
  }
  auto wrong_model = parseScoringRequest(R"({"model":"x","query":"q","documents":["a"]})", spec(),
                                         l, ScoreApi::kScore);
  EXPECT_EQ(toHttpError(wrong_model.status()).status, 404);

  RequestLimits small;
  small.max_inputs = 1;
  small.max_input_chars = 3;
  expectField(parseScoringRequest(R"({"model":"m","query":"q","documents":["a","b"]})", spec(),
                                  small, ScoreApi::kScore)
                  .status(),
              "documents", "(--max-inputs)");
  expectField(parseScoringRequest(R"({"model":"m","query":"q","documents":["abcd"]})", spec(),
                                  small, ScoreApi::kScore)
                  .status(),
              "documents", "longer than the limit of 3 characters (--max-input-chars)");
  // The over-long text is named where it is: the query is not blamed on the documents.
  expectField(parseScoringRequest(R"({"model":"m","query":"abcd","documents":["a"]})", spec(),
                                  small, ScoreApi::kScore)
                  .status(),
              "query", "query: is longer than the limit of 3 characters");
}

class RerankTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = loadTokenizer(testdata("tiny_unigram.model"));
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    tok_ = std::move(t).value();
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(RerankTemplateTest, PairFormatIsQwen3Reranker) {
  EXPECT_EQ(formatRerankPair("I", "Q", "D"), "<Instruct>: I\n<Query>: Q\n<Document>: D");
  EXPECT_EQ(kRerankSuffix, "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_TRUE(kRerankPrefix.starts_with("<|im_start|>system\nJudge whether the Document"));
  EXPECT_TRUE(kRerankPrefix.ends_with("<|im_end|>\n<|im_start|>user\n"));
}

TEST_F(RerankTemplateTest, RenderIsPrefixPairSuffixInDocumentOrder) {
  RerankTemplate tmpl(*tok_);
  ScoringRequest req;
  req.query = "what grows";
  req.documents = {"a rose", "the ivy and the tulip"};
  RequestLimits l;
  auto ids = tmpl.render(req, spec(), l);
  ASSERT_TRUE(ids.isOk()) << ids.status().toString();
  ASSERT_EQ(ids->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    std::vector<int32_t> want;
    tok_->encodeAllowingSpecial(kRerankPrefix, &want);
    tok_->encode(formatRerankPair(kRerankDefaultInstruction, req.query, req.documents[i]), &want);
    tok_->encodeAllowingSpecial(kRerankSuffix, &want);
    EXPECT_EQ((*ids)[i], want) << i;
  }
  EXPECT_LT(tmpl.prefix().size() + tmpl.suffix().size(), (*ids)[0].size());

  req.instruction = "Judge gardens";
  auto with = tmpl.render(req, spec(), l);
  ASSERT_TRUE(with.isOk());
  EXPECT_NE((*with)[0], (*ids)[0]);

  // Per-pair token limit names the document; the total names `documents`.
  RequestLimits tight;
  tight.max_input_tokens = (*with)[0].size() - 1;
  expectField(tmpl.render(req, spec(), tight).status(), "documents", "documents[0]");
  RequestLimits total;
  total.max_request_tokens = (*ids)[0].size() + 1;
  req.instruction.reset();
  expectField(tmpl.render(req, spec(), total).status(), "documents", "(--max-request-tokens)");

  // A query (or instruction) over the limit with no document at all is named itself, not blamed
  // on documents[0] (issue 14.5).
  ScoringRequest long_query = req;
  long_query.query = std::string(400, 'q') + " what grows";
  RequestLimits pair_limit;
  pair_limit.max_input_tokens = (*ids)[0].size() + 10;
  expectField(tmpl.render(long_query, spec(), pair_limit).status(), "query",
              "in the scoring template, before any document");
  ScoringRequest long_instruction = req;
  long_instruction.instruction = std::string(400, 'i');
  expectField(tmpl.render(long_instruction, spec(), pair_limit).status(), "instruction",
              "in the scoring template, before any document");
  ScoringRequest long_doc = req;
  long_doc.documents[0] = std::string(400, 'd');
  expectField(tmpl.render(long_doc, spec(), pair_limit).status(), "documents", "documents[0]: has");
}

TEST_F(RerankTemplateTest, YesNoTokens) {
  // Pieces that exist in this vocabulary resolve to their ids.
  std::string a(*tok_->idToPiece(20)), b(*tok_->idToPiece(21));
  auto t = resolveYesNoTokens(*tok_, a, b);
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  EXPECT_EQ(t->yes, 20);
  EXPECT_EQ(t->no, 21);
  EXPECT_FALSE(resolveYesNoTokens(*tok_, a, a).isOk());
  auto missing = resolveYesNoTokens(*tok_, "zzzzqqqqxxxx", b);
  ASSERT_FALSE(missing.isOk());
  EXPECT_THAT(missing.status().message(), HasSubstr("--score-yes-token"));
}

TEST(ScoreRender, ScoreKeepsInputOrderRerankSortsAndCuts) {
  std::vector<float> scores = {0.2f, 0.9f, 0.5f, 0.9f};
  simdjson::dom::parser p;
  std::string s = renderScoreResponse("score-1", "m", scores, 40);
  simdjson::dom::element doc = p.parse(s);
  EXPECT_EQ(std::string_view(doc["object"]), "list");
  EXPECT_EQ(std::string_view(doc["id"]), "score-1");
  int64_t i = 0;
  for (auto d : doc["data"].get_array()) {
    EXPECT_EQ(int64_t(d["index"]), i);
    EXPECT_EQ(std::string_view(d["object"]), "score");
    EXPECT_FLOAT_EQ(float(double(d["score"])), scores[size_t(i)]);
    ++i;
  }
  EXPECT_EQ(i, 4);
  EXPECT_EQ(uint64_t(doc["usage"]["prompt_tokens"]), 40u);

  ScoringRequest req;
  req.documents = {"d0", "d1", "d2", "d3"};
  req.top_n = 3;
  req.return_documents = true;
  std::string r = renderRerankResponse("rerank-1", "m", req, scores, 40);
  simdjson::dom::parser p2;
  simdjson::dom::element rd = p2.parse(r);
  std::vector<int64_t> order;
  for (auto x : rd["results"].get_array()) {
    order.push_back(int64_t(x["index"]));
    EXPECT_EQ(std::string_view(x["document"]["text"]),
              req.documents[size_t(int64_t(x["index"]))]);
  }
  EXPECT_THAT(order, ElementsAre(1, 3, 2));  // ties keep input order; cut to top_n
  req.return_documents = false;
  req.top_n = 0;
  simdjson::dom::parser p3;
  simdjson::dom::element all = p3.parse(renderRerankResponse("x", "m", req, scores, 1));
  EXPECT_EQ(all["results"].get_array().size(), 4u);
  simdjson::dom::element doc0;
  EXPECT_NE(all["results"].at(0)["document"].get(doc0), simdjson::SUCCESS);
}

}  // namespace
}  // namespace garden::ivy
