#include "services/ivy/api/embeddings.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <simdjson.h>

#include <cmath>
#include <cstring>

#include "common/json_writer.h"
#include "services/ivy/api/errors.h"

namespace garden::ivy {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelSpec testSpec() {
  ModelSpec s;
  s.served_name = "test-embed";
  s.upstream_name = "upstream-embed";
  s.hidden_size = 8;
  s.max_seq_len = 16;
  s.vocab_size = 400;
  return s;
}

// Splits on spaces; every character becomes one token id (its byte value), so lengths are easy
// to reason about. Empty text gives no tokens.
class ByteEncoder : public TextEncoder {
 public:
  Result<std::vector<int32_t>> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  uint32_t vocabSize() const override { return 256; }
};

Result<EmbeddingsRequest> parse(std::string_view body) {
  return parseEmbeddingsRequest(body, testSpec());
}

// Expects a 400 whose param (via the one mapping function) is `param` and whose message contains
// `needle`.
void expectRejected(std::string_view body, std::string_view param, std::string_view needle,
                    int http = 400) {
  SCOPED_TRACE(std::string(body));
  Result<EmbeddingsRequest> r = parse(body);
  ASSERT_FALSE(r.isOk());
  HttpError e = toHttpError(r.status());
  EXPECT_EQ(e.status, http);
  EXPECT_EQ(e.param, param);
  EXPECT_THAT(e.message, HasSubstr(std::string(needle)));
}

TEST(ParseEmbeddings, SingleString) {
  auto r = parse(R"({"model":"test-embed","input":"hello world"})");
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->model, "test-embed");
  ASSERT_EQ(r->inputs.size(), 1u);
  EXPECT_TRUE(r->inputs[0].is_text);
  EXPECT_EQ(r->inputs[0].text, "hello world");
  EXPECT_FALSE(r->batched);
  EXPECT_EQ(r->encoding_format, EncodingFormat::kFloat);
  EXPECT_EQ(r->dimensions, 0u);
}

TEST(ParseEmbeddings, ArrayOfStringsWithEscapes) {
  auto r = parse(R"({"model":"test-embed","input":["a","b\n\u00fc\"", "c"],"user":42})");
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  ASSERT_EQ(r->inputs.size(), 3u);
  EXPECT_TRUE(r->batched);
  EXPECT_EQ(r->inputs[1].text, "b\n\xc3\xbc\"");
}

TEST(ParseEmbeddings, TokenIds) {
  auto r = parse(R"({"model":"test-embed","input":[1,2,399]})");
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  ASSERT_EQ(r->inputs.size(), 1u);
  EXPECT_FALSE(r->inputs[0].is_text);
  EXPECT_THAT(r->inputs[0].ids, ElementsAre(1, 2, 399));
  EXPECT_FALSE(r->batched);
}

TEST(ParseEmbeddings, ArrayOfTokenArrays) {
  auto r = parse(R"({"model":"test-embed","input":[[1],[0,5,6]]})");
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  ASSERT_EQ(r->inputs.size(), 2u);
  EXPECT_TRUE(r->batched);
  EXPECT_THAT(r->inputs[0].ids, ElementsAre(1));
  EXPECT_THAT(r->inputs[1].ids, ElementsAre(0, 5, 6));
}

TEST(ParseEmbeddings, FormatAndDimensions) {
  auto r = parse(R"({"model":"test-embed","input":"x","encoding_format":"base64","dimensions":3})");
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->encoding_format, EncodingFormat::kBase64);
  EXPECT_EQ(r->dimensions, 3u);
  auto n = parse(R"({"model":"test-embed","input":"x","encoding_format":null,"dimensions":null})");
  ASSERT_TRUE(n.isOk()) << n.status().toString();
  EXPECT_EQ(n->encoding_format, EncodingFormat::kFloat);
  EXPECT_EQ(n->dimensions, 0u);
  auto full = parse(R"({"model":"test-embed","input":"x","dimensions":8})");
  ASSERT_TRUE(full.isOk());
  EXPECT_EQ(full->dimensions, 8u);
}

TEST(ParseEmbeddings, MalformedJson) {
  for (std::string_view body : {"", "{", "{\"model\":", "not json", "{\"model\":\"test-embed\",}",
                                "{\"model\":\"test-embed\",\"input\":\"x\"} trailing"}) {
    expectRejected(body, "", "could not parse the JSON body");
  }
  // Text that is not UTF-8 names the field holding it (api/json_body.h).
  expectRejected("{\"model\":\"test-embed\",\"input\":\"\xff\"}", "input",
                 "input: is not valid UTF-8 (byte 0xFF");
}

TEST(ParseEmbeddings, BodyMustBeAnObject) {
  expectRejected("[1,2]", "body", "must be a JSON object");
  expectRejected("\"str\"", "body", "must be a JSON object");
  expectRejected("null", "body", "must be a JSON object");
}

TEST(ParseEmbeddings, Model) {
  expectRejected(R"({"input":"x"})", "model", "model: is required");
  expectRejected(R"({"model":7,"input":"x"})", "model", "must be a string, got an integer");
  expectRejected(R"({"model":null,"input":"x"})", "model", "must be a string, got null");
  Result<EmbeddingsRequest> r = parse(R"({"model":"other","input":"x"})");
  ASSERT_FALSE(r.isOk());
  HttpError e = toHttpError(r.status());
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  EXPECT_EQ(e.param, "model");
  EXPECT_THAT(e.message, HasSubstr("'other' does not exist"));
  // The upstream name is not accepted: callers use the served name.
  EXPECT_FALSE(parse(R"({"model":"upstream-embed","input":"x"})").isOk());
}

TEST(ParseEmbeddings, InputTypes) {
  expectRejected(R"({"model":"test-embed"})", "input", "input: is required");
  expectRejected(R"({"model":"test-embed","input":null})", "input", "got null");
  expectRejected(R"({"model":"test-embed","input":5})", "input", "got an integer");
  expectRejected(R"({"model":"test-embed","input":{"a":1}})", "input", "got an object");
  expectRejected(R"({"model":"test-embed","input":true})", "input", "got a boolean");
  expectRejected(R"({"model":"test-embed","input":[1.5]})", "input", "input[0]: must be");
  expectRejected(R"({"model":"test-embed","input":[null]})", "input", "input[0]: must be");
  expectRejected(R"({"model":"test-embed","input":[{"x":1}]})", "input", "input[0]: must be");
  // Mixed arrays.
  expectRejected(R"({"model":"test-embed","input":["a",1]})", "input",
                 "input[1]: must be a string like input[0], got an integer");
  expectRejected(R"({"model":"test-embed","input":[1,"a"]})", "input",
                 "input[1]: must be an integer token id, got a string");
  expectRejected(R"({"model":"test-embed","input":[1,2.0]})", "input",
                 "input[1]: must be an integer token id, got a non-integer number");
  expectRejected(R"({"model":"test-embed","input":[[1],"a"]})", "input",
                 "input[1]: must be an array like input[0]");
  expectRejected(R"({"model":"test-embed","input":[[1],[2,"x"]]})", "input",
                 "input[1][1]: must be an integer token id");
  expectRejected(R"({"model":"test-embed","input":[[[1]]]})", "input",
                 "input[0][0]: must be an integer token id, got an array");
}

TEST(ParseEmbeddings, EmptyInputs) {
  expectRejected(R"({"model":"test-embed","input":""})", "input", "must not be an empty string");
  expectRejected(R"({"model":"test-embed","input":[]})", "input", "must not be an empty array");
  expectRejected(R"({"model":"test-embed","input":["a",""]})", "input",
                 "input[1]: must not be an empty string");
  expectRejected(R"({"model":"test-embed","input":[[1],[]]})", "input",
                 "input[1]: must not be an empty array of token ids");
}

TEST(ParseEmbeddings, TokenIdRange) {
  expectRejected(R"({"model":"test-embed","input":[400]})", "input",
                 "input[0]: token id 400 is outside the vocabulary [0, 400)");
  expectRejected(R"({"model":"test-embed","input":[-1]})", "input", "token id -1 is outside");
  expectRejected(R"({"model":"test-embed","input":[[1],[2,18446744073709551615]]})", "input",
                 "input[1][1]: token id 18446744073709551615 is outside");
  expectRejected(R"({"model":"test-embed","input":[2147483648]})", "input",
                 "token id 2147483648 is outside");
}

TEST(ParseEmbeddings, TooManyTokens) {
  std::string ids17 = "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]";
  std::string ids16 = "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]";
  EXPECT_TRUE(parse(R"({"model":"test-embed","input":)" + ids16 + "}").isOk());
  expectRejected(R"({"model":"test-embed","input":)" + ids17 + "}", "input",
                 "input: has 17 tokens, more than the model's maximum of 16");
  expectRejected(R"({"model":"test-embed","input":[[1],)" + ids17 + "]}", "input",
                 "input[1]: has 17 tokens");
}

TEST(ParseEmbeddings, TooManyInputs) {
  EmbeddingsLimits limits;
  limits.max_inputs = 2;
  EXPECT_TRUE(
      parseEmbeddingsRequest(R"({"model":"test-embed","input":["a","b"]})", testSpec(), limits)
          .isOk());
  auto r =
      parseEmbeddingsRequest(R"({"model":"test-embed","input":["a","b","c"]})", testSpec(), limits);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().message(), "input: has 3 inputs, more than the limit of 2 (--max-inputs)");
}

TEST(ParseEmbeddings, EncodingFormatAndDimensionsValidation) {
  expectRejected(R"({"model":"test-embed","input":"x","encoding_format":"int8"})",
                 "encoding_format", "must be \"float\" or \"base64\"");
  expectRejected(R"({"model":"test-embed","input":"x","encoding_format":1})", "encoding_format",
                 "must be");
  expectRejected(R"({"model":"test-embed","input":"x","dimensions":0})", "dimensions",
                 "must be between 1 and the model's width 8");
  expectRejected(R"({"model":"test-embed","input":"x","dimensions":-3})", "dimensions",
                 "must be between");
  expectRejected(R"({"model":"test-embed","input":"x","dimensions":9})", "dimensions",
                 "must be between");
  expectRejected(R"({"model":"test-embed","input":"x","dimensions":4.5})", "dimensions",
                 "must be an integer, got a non-integer number");
  expectRejected(R"({"model":"test-embed","input":"x","dimensions":"4"})", "dimensions",
                 "must be an integer, got a string");
}

TEST(ResolveTokens, TextAndIds) {
  ByteEncoder enc;
  auto r = parse(R"({"model":"test-embed","input":["ab","c"]})");
  ASSERT_TRUE(r.isOk());
  auto t = resolveTokens(*r, &enc, testSpec());
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_THAT((*t)[0], ElementsAre('a', 'b'));
  EXPECT_THAT((*t)[1], ElementsAre('c'));

  auto ids = parse(R"({"model":"test-embed","input":[[7,8],[9]]})");
  ASSERT_TRUE(ids.isOk());
  auto t2 = resolveTokens(*ids, nullptr, testSpec());  // no encoder needed for ids
  ASSERT_TRUE(t2.isOk());
  EXPECT_THAT((*t2)[0], ElementsAre(7, 8));
}

TEST(ResolveTokens, TextTooLongNamesTheIndex) {
  ByteEncoder enc;
  auto r = parse(R"({"model":"test-embed","input":["short","this text is longer than 16"]})");
  ASSERT_TRUE(r.isOk());
  auto t = resolveTokens(*r, &enc, testSpec());
  ASSERT_FALSE(t.isOk());
  HttpError e = toHttpError(t.status());
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "input");
  EXPECT_EQ(e.message, "input[1]: has 27 tokens, more than the model's maximum of 16");

  auto single = parse(R"({"model":"test-embed","input":"this text is longer than 16"})");
  ASSERT_TRUE(single.isOk());
  auto t1 = resolveTokens(*single, &enc, testSpec());
  ASSERT_FALSE(t1.isOk());
  EXPECT_EQ(t1.status().message(), "input: has 27 tokens, more than the model's maximum of 16");
}

TEST(ResolveTokens, TextWithoutTokenizerIsRejected) {
  auto r = parse(R"({"model":"test-embed","input":"hello"})");
  ASSERT_TRUE(r.isOk());
  auto t = resolveTokens(*r, nullptr, testSpec());
  ASSERT_FALSE(t.isOk());
  EXPECT_EQ(toHttpError(t.status()).status, 400);
  EXPECT_THAT(t.status().message(), HasSubstr("no tokenizer"));
}

TEST(ResolveTokens, EncoderOutsideModelVocabIsAServerError) {
  ByteEncoder enc;
  ModelSpec spec = testSpec();
  spec.vocab_size = 100;  // 'z' = 122 is outside
  auto r = parseEmbeddingsRequest(R"({"model":"test-embed","input":"z"})", spec);
  ASSERT_TRUE(r.isOk());
  auto t = resolveTokens(*r, &enc, spec);
  ASSERT_FALSE(t.isOk());
  EXPECT_EQ(toHttpError(t.status()).status, 500);
}

TEST(TruncateAndNormalize, RenormalizesEachRow) {
  std::vector<float> v = {3,  4, 100, 100,  // row 0 → (0.6, 0.8)
                          0,  0, 1,   1,    // row 1: zero prefix stays zero
                          -1, 0, 0,   0};   // row 2 → (-1, 0)
  std::vector<float> out = truncateAndNormalize(v, 4, 2);
  ASSERT_EQ(out.size(), 6u);
  EXPECT_FLOAT_EQ(out[0], 0.6f);
  EXPECT_FLOAT_EQ(out[1], 0.8f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_FLOAT_EQ(out[4], -1.0f);
  EXPECT_EQ(out[5], 0.0f);
  // Full width keeps a normalized row (within float rounding).
  std::vector<float> unit = {0.6f, 0.8f};
  std::vector<float> same = truncateAndNormalize(unit, 2, 2);
  EXPECT_NEAR(same[0], 0.6f, 1e-7);
  EXPECT_NEAR(same[1], 0.8f, 1e-7);
}

struct Rendered {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
};

TEST(RenderEmbeddings, FloatRoundTrip) {
  std::vector<float> v = {0.1f, -0.25f, 1e-8f, 3.4028235e38f, 0.0f, -0.0f};  // 2 rows × 3
  std::string body = renderEmbeddingsResponse("m", v, 3, EncodingFormat::kFloat, 7);
  simdjson::dom::parser p;
  simdjson::dom::element root;
  ASSERT_FALSE(p.parse(body).get(root)) << body;
  EXPECT_EQ(std::string_view(root["object"]), "list");
  EXPECT_EQ(std::string_view(root["model"]), "m");
  EXPECT_EQ(int64_t(root["usage"]["prompt_tokens"]), 7);
  EXPECT_EQ(int64_t(root["usage"]["total_tokens"]), 7);
  simdjson::dom::array data = root["data"];
  ASSERT_EQ(data.size(), 2u);
  size_t row = 0;
  for (simdjson::dom::element d : data) {
    EXPECT_EQ(std::string_view(d["object"]), "embedding");
    EXPECT_EQ(int64_t(d["index"]), int64_t(row));
    simdjson::dom::array emb = d["embedding"];
    ASSERT_EQ(emb.size(), 3u);
    size_t j = 0;
    for (simdjson::dom::element x : emb) {
      // Shortest round-trip float text parses back to the identical float.
      float back = static_cast<float>(double(x));
      EXPECT_EQ(std::memcmp(&back, &v[row * 3 + j], 4) == 0 || back == v[row * 3 + j], true)
          << "row " << row << " col " << j << " got " << back;
      EXPECT_EQ(back, v[row * 3 + j]);
      ++j;
    }
    ++row;
  }
}

TEST(RenderEmbeddings, Base64RoundTrip) {
  std::vector<float> v = {0.1f, -0.25f, 1e-8f, 0.5f, 1.0f, -2.0f};
  std::string body = renderEmbeddingsResponse("m", v, 3, EncodingFormat::kBase64, 2);
  simdjson::dom::parser p;
  simdjson::dom::element root;
  ASSERT_FALSE(p.parse(body).get(root)) << body;
  simdjson::dom::array data = root["data"];
  ASSERT_EQ(data.size(), 2u);
  size_t row = 0;
  for (simdjson::dom::element d : data) {
    std::string_view b64 = d["embedding"];
    Result<std::string> bytes = base64Decode(b64);
    ASSERT_TRUE(bytes.isOk()) << bytes.status().toString();
    ASSERT_EQ(bytes->size(), 12u);
    float back[3];
    std::memcpy(back, bytes->data(), 12);
    for (int j = 0; j < 3; ++j) EXPECT_EQ(back[j], v[row * 3 + j]);
    ++row;
  }
  // Known bytes: 1.0f little-endian is 00 00 80 3f → "AACAPw==".
  std::vector<float> one = {1.0f};
  std::string b = renderEmbeddingsResponse("m", one, 1, EncodingFormat::kBase64, 1);
  EXPECT_THAT(b, HasSubstr("\"embedding\":\"AACAPw==\""));
}

TEST(RenderModels, ListShape) {
  ModelSpec s = testSpec();
  s.created = 1700000000;
  std::string body = renderModelsResponse(s);
  EXPECT_EQ(body, R"({"object":"list","data":[{"id":"test-embed","object":"model",)"
                  R"("created":1700000000,"owned_by":"garden"}]})");
}

}  // namespace
}  // namespace garden::ivy
