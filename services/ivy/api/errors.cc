#include "services/ivy/api/errors.h"

#include <array>

#include "common/json_writer.h"

namespace garden::ivy {
namespace {

// Top-level request fields of every ivy endpoint; extend when an endpoint is added.
constexpr std::array<std::string_view, 50> kRequestFields = {
    "model",    "input",       "encoding_format", "dimensions",  "user",       "body",
    "messages", "prompt",      "text",            "tokens",      "tools",      "tool_choice",
    "reasoning_effort", "max_tokens", "temperature", "stream",
    // chat / completions sampling fields (api/completions_common.h)
    "max_completion_tokens", "top_p", "top_k", "seed", "stop", "n", "stream_options", "echo",
    "ignore_eos", "logprobs", "suffix", "best_of", "top_logprobs", "presence_penalty",
    "frequency_penalty", "logit_bias", "response_format", "repetition_penalty", "min_p",
    "skip_reasoning",
    // embeddings prompts, score and rerank (api/embeddings.h, api/score.h)
    "input_type", "prompt_name", "query", "documents", "instruction", "top_n", "return_documents",
    // responses (api/responses.h)
    "instructions", "reasoning", "max_output_tokens", "previous_response_id", "store",
    "background", "conversation"};

// A request header named as the culprit ("x-request-timeout: ..."): lower-case, starts "x-".
bool isHeaderName(std::string_view s) {
  if (s.size() < 3 || s.substr(0, 2) != "x-") return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

constexpr int kRetryAfterSeconds = 1;

bool isIdentChar(char c) { return (c >= 'a' && c <= 'z') || c == '_' || (c >= '0' && c <= '9'); }

}  // namespace

Status invalidField(std::string_view path, std::string_view message) {
  std::string m(path);
  m += ": ";
  m += message;
  return invalidArgument(std::move(m));
}

std::string_view paramOf(std::string_view message) {
  size_t colon = message.find(": ");
  if (colon == std::string_view::npos || colon == 0) return {};
  std::string_view path = message.substr(0, colon);
  if (isHeaderName(path)) return path;
  size_t root_end = 0;
  while (root_end < path.size() && isIdentChar(path[root_end])) ++root_end;
  std::string_view root = path.substr(0, root_end);
  // The rest of the path may only be [digits] or .ident segments.
  for (size_t i = root_end; i < path.size();) {
    if (path[i] == '[') {
      size_t j = i + 1;
      while (j < path.size() && path[j] >= '0' && path[j] <= '9') ++j;
      if (j == i + 1 || j >= path.size() || path[j] != ']') return {};
      i = j + 1;
    } else if (path[i] == '.') {
      size_t j = i + 1;
      while (j < path.size() && isIdentChar(path[j])) ++j;
      if (j == i + 1) return {};
      i = j;
    } else {
      return {};
    }
  }
  for (std::string_view f : kRequestFields) {
    if (root == f) return root;
  }
  return {};
}

HttpError toHttpError(const Status& status) {
  HttpError e;
  e.message = status.message();
  if (e.message.empty()) e.message = std::string(statusCodeName(status.code()));
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
      e.status = 400;
      e.type = "invalid_request_error";
      e.param = paramOf(e.message);
      break;
    case StatusCode::kNotFound:
      e.status = 404;
      e.type = "invalid_request_error";
      e.param = paramOf(e.message);
      e.code = e.param == "model" ? "model_not_found" : "not_found";
      break;
    case StatusCode::kOutOfRange:
      e.status = 413;
      e.type = "invalid_request_error";
      e.code = "request_too_large";
      break;
    case StatusCode::kUnimplemented:
      e.status = 405;
      e.type = "invalid_request_error";
      e.code = "method_not_allowed";
      break;
    case StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      e.retry_after_s = kRetryAfterSeconds;
      break;
    case StatusCode::kUnavailable:
      e.status = 503;
      e.type = "service_unavailable_error";
      e.code = "service_unavailable";
      e.retry_after_s = kRetryAfterSeconds;
      break;
    case StatusCode::kDeadlineExceeded:
      e.status = 504;
      e.type = "timeout_error";
      e.code = "timeout";
      break;
    case StatusCode::kUnauthenticated:
      e.status = 401;
      e.type = "authentication_error";
      break;
    case StatusCode::kPermissionDenied:
      e.status = 403;
      e.type = "permission_error";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
      e.code = "internal_error";
      break;
  }
  return e;
}

std::string renderErrorBody(const HttpError& error) {
  JsonWriter w;
  w.beginObject().key("error").beginObject();
  w.field("message", error.message);
  w.field("type", error.type);
  if (error.param.empty()) {
    w.nullField("param");
  } else {
    w.field("param", error.param);
  }
  if (error.code.empty()) {
    w.nullField("code");
  } else {
    w.field("code", error.code);
  }
  w.endObject().endObject();
  return w.take();
}

}  // namespace garden::ivy
