#pragma once
// The one place where a garden::Status becomes an HTTP error response [TAG_STATUS_MAPPING]:
// status code, OpenAI-shaped body {"error":{"message","type","param","code"}} and Retry-After.
// Pure functions, callable from any thread.
//
// Field errors [TAG_FIELD_ERRORS]: request validation reports the offending field by starting the
// Status message with its path, e.g. invalidField("input[2]", "has 9000 tokens ...") gives
// INVALID_ARGUMENT "input[2]: has 9000 tokens ...". toHttpError() recovers `param` ("input") from
// that prefix when its root is a known request field (kRequestFields), so the message a caller sees
// still names the exact element while `param` is the top-level field, as OpenAI does. A request
// header at fault is named the same way ("x-request-timeout: must be ...") and becomes `param`.
//
// Code → HTTP (ivy reserves two codes for HTTP-layer conditions, see the .cc):
//   INVALID_ARGUMENT, FAILED_PRECONDITION → 400 invalid_request_error
//   NOT_FOUND            → 404 (code "model_not_found" when param is "model")
//   OUT_OF_RANGE         → 413 request body over --max-body-bytes (ivy only; upstream OUT_OF_RANGE
//                          is mapped to INVALID_ARGUMENT by the tulip client)
//   UNIMPLEMENTED        → 405 method not allowed on a known route
//   RESOURCE_EXHAUSTED   → 429 + Retry-After
//   UNAVAILABLE          → 503 + Retry-After
//   DEADLINE_EXCEEDED    → 504
//   UNAUTHENTICATED 401 (errorResponse adds WWW-Authenticate), PERMISSION_DENIED 403,
//   everything else 500 server_error.

#include <string>
#include <string_view>

#include "common/status.h"

namespace garden::ivy {

// INVALID_ARGUMENT "<path>: <message>" (see [TAG_FIELD_ERRORS]).
Status invalidField(std::string_view path, std::string_view message);

struct HttpError {
  int status = 500;
  std::string type;       // "invalid_request_error", "rate_limit_error", ...
  std::string code;       // "model_not_found", ... or empty (written as null)
  std::string param;      // root field name or empty (written as null)
  std::string message;    // the Status message
  int retry_after_s = 0;  // > 0: send Retry-After
};

HttpError toHttpError(const Status& status);
// {"error":{"message":...,"type":...,"param":...|null,"code":...|null}}
std::string renderErrorBody(const HttpError& error);

// The root field named by a [TAG_FIELD_ERRORS] message prefix, or "" if there is none.
std::string_view paramOf(std::string_view message);

}  // namespace garden::ivy
