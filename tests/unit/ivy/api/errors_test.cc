#include "services/ivy/api/errors.h"

#include <gtest/gtest.h>
#include <simdjson.h>

namespace garden::ivy {
namespace {

TEST(ParamOf, RecognizesKnownFieldPaths) {
  EXPECT_EQ(paramOf("input: must not be empty"), "input");
  EXPECT_EQ(paramOf("input[3]: has 9 tokens"), "input");
  EXPECT_EQ(paramOf("input[3][17]: token id 5 is outside"), "input");
  EXPECT_EQ(paramOf("dimensions: must be between"), "dimensions");
  EXPECT_EQ(paramOf("encoding_format: must be"), "encoding_format");
  EXPECT_EQ(paramOf("model: The model 'x' does not exist"), "model");
}

TEST(ParamOf, RejectsEverythingElse) {
  EXPECT_EQ(paramOf("no colon here"), "");
  EXPECT_EQ(paramOf("tulip: worker died"), "");  // not a request field
  EXPECT_EQ(paramOf("input [3]: spaced"), "");   // not a path
  EXPECT_EQ(paramOf("input[]: empty index"), "");
  EXPECT_EQ(paramOf("input[3: unterminated"), "");
  EXPECT_EQ(paramOf(": leading colon"), "");
  EXPECT_EQ(paramOf("We could not parse the JSON body: x"), "");
}

TEST(InvalidField, FormatsPathAndMessage) {
  Status s = invalidField("input[2]", "must not be an empty string");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "input[2]: must not be an empty string");
}

struct MappingCase {
  StatusCode code;
  int http;
  const char* type;
  const char* code_str;  // "" = null
  int retry_after;
};

TEST(ToHttpError, MapsEveryCodeOnce) {
  const MappingCase cases[] = {
      {StatusCode::kInvalidArgument, 400, "invalid_request_error", "", 0},
      {StatusCode::kFailedPrecondition, 400, "invalid_request_error", "", 0},
      {StatusCode::kNotFound, 404, "invalid_request_error", "not_found", 0},
      {StatusCode::kOutOfRange, 413, "invalid_request_error", "request_too_large", 0},
      {StatusCode::kUnimplemented, 405, "invalid_request_error", "method_not_allowed", 0},
      {StatusCode::kResourceExhausted, 429, "rate_limit_error", "rate_limit_exceeded", 1},
      {StatusCode::kUnavailable, 503, "service_unavailable_error", "service_unavailable", 1},
      {StatusCode::kDeadlineExceeded, 504, "timeout_error", "timeout", 0},
      {StatusCode::kUnauthenticated, 401, "authentication_error", "", 0},
      {StatusCode::kPermissionDenied, 403, "permission_error", "", 0},
      {StatusCode::kInternal, 500, "server_error", "internal_error", 0},
      {StatusCode::kUnknown, 500, "server_error", "internal_error", 0},
      {StatusCode::kDataLoss, 500, "server_error", "internal_error", 0},
      {StatusCode::kCancelled, 500, "server_error", "internal_error", 0},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(statusCodeName(c.code)));
    HttpError e = toHttpError(Status(c.code, "something happened"));
    EXPECT_EQ(e.status, c.http);
    EXPECT_EQ(e.type, c.type);
    EXPECT_EQ(e.code, c.code_str);
    EXPECT_EQ(e.retry_after_s, c.retry_after);
    EXPECT_EQ(e.message, "something happened");
    EXPECT_EQ(e.param, "");
  }
}

TEST(ToHttpError, ModelNotFoundGetsItsCode) {
  HttpError e = toHttpError(notFound("model: The model 'gpt-9' does not exist"));
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.param, "model");
  EXPECT_EQ(e.code, "model_not_found");
}

TEST(ToHttpError, InvalidArgumentNamesTheField) {
  HttpError e = toHttpError(invalidField("input[4]", "has 10 tokens, more than 8"));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "input");
  EXPECT_EQ(e.message, "input[4]: has 10 tokens, more than 8");
}

TEST(RenderErrorBody, IsOpenAiShapedJson) {
  HttpError e = toHttpError(invalidField("input", "must not be \"empty\""));
  std::string body = renderErrorBody(e);
  simdjson::dom::parser p;
  simdjson::dom::element root;
  ASSERT_FALSE(p.parse(body).get(root)) << body;
  auto err = root["error"];
  EXPECT_EQ(std::string_view(err["message"]), "input: must not be \"empty\"");
  EXPECT_EQ(std::string_view(err["type"]), "invalid_request_error");
  EXPECT_EQ(std::string_view(err["param"]), "input");
  EXPECT_TRUE(err["code"].is_null());

  std::string body2 = renderErrorBody(toHttpError(unavailable("busy")));
  ASSERT_FALSE(p.parse(body2).get(root)) << body2;
  EXPECT_TRUE(root["error"]["param"].is_null());
  EXPECT_EQ(std::string_view(root["error"]["code"]), "service_unavailable");
}

}  // namespace
}  // namespace garden::ivy
