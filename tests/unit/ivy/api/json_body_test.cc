// parseJsonBody and jsonPathAt (api/json_body.h) [TAG_JSON_BODY]: syntax errors, the root type,
// duplicate keys at any depth (named by path, escapes decoded, many-key objects), text that is not
// Unicode and numbers or literals that are not JSON named by the field that holds them, and the
// path of an offset.

#include "services/ivy/api/json_body.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/ivy/api/errors.h"

namespace garden::ivy {
namespace {

using ::testing::HasSubstr;

Status parse(std::string_view body) {
  simdjson::dom::parser parser;
  Result<simdjson::dom::element> r = parseJsonBody(body, parser);
  return r.isOk() ? okStatus() : r.status();
}

void expectRefused(std::string_view body, std::string_view prefix, std::string_view part,
                   std::string_view param) {
  Status st = parse(body);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << body;
  EXPECT_THAT(st.message(), ::testing::StartsWith(std::string(prefix))) << body;
  EXPECT_THAT(st.message(), HasSubstr(std::string(part))) << body;
  EXPECT_EQ(toHttpError(st).status, 400);
  EXPECT_EQ(toHttpError(st).param, param) << st.message();
}

TEST(JsonBody, AcceptsObjectsAndGivesTheRoot) {
  simdjson::dom::parser parser;
  auto r = parseJsonBody(R"({"model":"m","input":[1,2,{"a":1,"b":[{"a":2}]}]})", parser);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(std::string_view((*r)["model"]), "m");
  // The same key in sibling or nested objects is not a repeat.
  EXPECT_TRUE(parse(R"({"a":{"a":1},"b":[{"a":1},{"a":2}],"c":{"b":{"a":0}}})").isOk());
  EXPECT_TRUE(parse(R"({"text":"\ud83c\udf31 ok \u00e9"})").isOk());
  EXPECT_TRUE(parse("{}").isOk());
}

TEST(JsonBody, SyntaxAndRootType) {
  expectRefused("{\"a\":", "We could not parse the JSON body", "", "");
  expectRefused("", "We could not parse the JSON body", "", "");
  expectRefused("[1,2]", "body: ", "must be a JSON object, got an array", "body");
  expectRefused("\"s\"", "body: ", "got a string", "body");
  expectRefused("null", "body: ", "got null", "body");
}

TEST(JsonBody, DuplicateKeysAreRefusedNamingTheKey) {
  expectRefused(R"({"model":"tiny","model":"bad"})", "model: ",
                "the key \"model\" appears more than once in the request body", "model");
  // Compared decoded: an escape does not make a different key.
  expectRefused(R"({"model":"tiny","mod\u0065l":"bad"})", "model: ", "appears more than once",
                "model");
  expectRefused(R"({"model":"m","messages":[{"role":"user"},{"role":"user","role":"system"}]})",
                "messages[1].role: ",
                "the key \"role\" appears more than once in messages[1]", "messages");
  expectRefused(R"({"input":[[1],{"x":{"k":1,"k":2}}]})", "input[1].x.k: ", "in input[1].x",
                "input");
  // A key that is not an identifier is shown in brackets.
  expectRefused(R"({"a b":1,"a b":2})", "[\"a b\"]: ", "appears more than once", "");
  // The first repeat in document order is named.
  expectRefused(R"({"a":1,"b":2,"b":3,"a":4})", "b: ", "\"b\"", "");
}

TEST(JsonBody, DuplicateAmongManyKeys) {
  std::string body = "{";
  for (int i = 0; i < 5000; ++i) body += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  body += "\"k4321\":0,\"k17\":1}";
  expectRefused(body, "k4321: ", "the key \"k4321\" appears more than once", "");
  std::string unique = "{";
  for (int i = 0; i < 5000; ++i) unique += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":1";
  unique += "}";
  EXPECT_TRUE(parse(unique).isOk());
}

TEST(JsonBody, TextThatIsNotUnicodeNamesItsField) {
  expectRefused(R"({"text":"\ud800"})", "text: ", "contains \\ud800, a lone UTF-16 surrogate",
                "text");
  expectRefused(R"({"text":"ok \udc00 tail"})", "text: ", "\\udc00, a lone UTF-16 surrogate",
                "text");
  expectRefused(R"({"input":["a","b\ud83cx"]})", "input[1]: ", "\\ud83c, a lone UTF-16 surrogate",
                "input");
  const std::string bad_byte = "{\"model\":\"m\",\"input\":[\"ok\",\"\xff\"]}";
  expectRefused(bad_byte, "input[1]: ",
                "is not valid UTF-8 (byte 0xFF at offset " +
                    std::to_string(bad_byte.find('\xff')) + " of the body)",
                "input");
  expectRefused("{\"messages\":[{\"content\":\"a\xc3(\"}]}", "messages[0].content: ",
                "not valid UTF-8 (byte 0xC3", "messages");
  expectRefused("{\"query\":\"line\nbreak\"}", "query: ",
                "unescaped control character (byte 0x0A", "query");
  expectRefused(R"({"query":"\q"})", "query: ", "contains an invalid escape \\q", "query");
  expectRefused(R"({"query":"\u12"})", "query: ", "invalid \\u escape", "query");
  expectRefused(R"({"q\ud800":1})", "body: ", "an object key contains \\ud800", "body");
  expectRefused(R"({"a":{"\ud800":1}})", "a: ", "an object key contains", "");
  // Outside any string.
  expectRefused("{\"a\":1}\xff", "body: ", "is not valid UTF-8 (byte 0xFF at offset 7)", "body");
}

TEST(JsonBody, NumbersAndLiteralsThatAreNotJsonNameTheirField) {
  expectRefused(R"({"dimensions":NaN})", "dimensions: ", "is not a JSON value: NaN",
                "dimensions");
  expectRefused(R"({"input":[1,-]})", "input[1]: ", "is not a JSON value: -", "input");
  expectRefused(R"({"input":[[1],[2,18446744073709551616]]})", "input[1][1]: ",
                "is an integer outside the range", "input");
  expectRefused(R"({"input":[-9223372036854775809]})", "input[0]: ", "outside the range",
                "input");
  expectRefused(R"({"temperature":1e999})", "temperature: ", "is a number too large",
                "temperature");
  expectRefused(R"({"stream":tru})", "stream: ", "is not a JSON value: tru", "stream");
  expectRefused(R"({"top_n":01})", "top_n: ", "is not a JSON value: 01", "top_n");
  expectRefused(R"({"top_n":.5})", "top_n: ", "is not a JSON value: .5", "top_n");
  expectRefused(R"({"seed":Infinity})", "seed: ", "NaN and Infinity are not JSON", "seed");
  expectRefused("{\"model\":\"m\",\"input\":" + std::string(3000, '[') + std::string(3000, ']') + "}",
                "input: ", "nested too deeply (more than 1024 levels", "input");
  // Structure errors keep the parser's message.
  expectRefused(R"({"a":1,})", "We could not parse the JSON body", "", "");
  EXPECT_TRUE(
      parse(R"({"a":18446744073709551615,"b":-9223372036854775808,"c":1e308,"d":-0.0})").isOk());
}

TEST(JsonBody, PathAtOffset) {
  std::string_view j = R"({"model":"m","input":["a", "bb"],"x":{"y":[0,{"z":"t"}]}})";
  EXPECT_EQ(jsonPathAt(j, j.find("\"m\"")), "model");
  EXPECT_EQ(jsonPathAt(j, j.find("\"bb\"")), "input[1]");
  EXPECT_EQ(jsonPathAt(j, j.find("\"t\"")), "x.y[1].z");
  EXPECT_EQ(jsonPathAt(j, j.find("\"input\"")), "");  // a key, not a value
  EXPECT_EQ(jsonPathAt(j, 3), "");                     // not where a string starts
  EXPECT_EQ(jsonPathAt("\"top\"", 0), "");
  // Any bytes are walked without failing.
  EXPECT_EQ(jsonPathAt("{\"a\":[[[[\"\\", 7), "");
  std::string deep(5000, '[');
  EXPECT_EQ(jsonPathAt(deep + "\"s\"", 5000), "");
}

}  // namespace
}  // namespace garden::ivy
