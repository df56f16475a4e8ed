#pragma once
// Request size limits and request-scoped options shared by ivy's model endpoints (/v1/embeddings,
// /v1/score, /v1/rerank, /v1/chat/completions, /v1/completions). Pure functions, callable from
// any thread.
//
// Every limit is a flag of ivy (main.cc) and every violation is a 400 whose message names both the
// offending field (following [TAG_FIELD_ERRORS]) and the limit's flag, e.g.
//   "input[3]: has 300000 characters, more than the limit of 262144 (--max-input-chars)".
// The checks are ordered so that the cheap ones run before the expensive ones [TAG_ADMISSION]:
// input count and characters per input are checked while parsing, before any tokenization; the
// token limits are checked as each input is tokenized, stopping at the first input that breaks
// one (a request over --max-request-tokens is not tokenized to its end).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace garden::ivy {

struct RequestLimits {
  size_t max_inputs = 2048;           // inputs (or documents) per request (--max-inputs)
  size_t max_input_chars = 262144;    // Unicode characters per text input (--max-input-chars)
  size_t max_input_tokens = 0;        // tokens per input; 0 or above the model's max: the model's
  size_t max_request_tokens = 1u << 20;  // tokens of all inputs together (--max-request-tokens)
  // --max-inflight-tokens (0 = none): chat / completions with n or best_of > 1 whose prompts +
  // sequences x max_tokens exceed it are a 400 (checkChoiceTokens, api/completions_common.h).
  uint64_t max_inflight_tokens = 0;
};
using EmbeddingsLimits = RequestLimits;

// Number of Unicode characters in UTF-8 text (bytes that do not continue a sequence). Invalid
// UTF-8 counts each stray byte as one character.
size_t countChars(std::string_view utf8);

// OK when `text` has at most limits.max_input_chars characters; otherwise INVALID_ARGUMENT
// naming `path` and the flag.
Status checkInputChars(std::string_view text, const std::string& path,
                       const RequestLimits& limits);

// The cheap guard that runs before a body is parsed [TAG_ADMISSION]: one pass over the raw JSON
// text counting the characters of each string literal (an escape counts as the one character it
// stands for; a \u surrogate pair as one; object keys are skipped). Returns a count above
// `max_chars` for the first literal longer than it (counting stops there), or 0 when none is (or
// max_chars is 0, or the body is too short to hold one, or a literal is unterminated: the parser
// reports that). `at`, when given, receives the offset of that literal's opening quote, so the
// caller can name its field (jsonPathAt in api/json_body.h): parsing a 10 MB body into a DOM
// costs far more than this scan, so an oversized text is refused before that.
size_t longestStringOver(std::string_view json, size_t max_chars, size_t* at = nullptr);

// The 400 for a text found by longestStringOver at offset `at` of `json`: it names the field
// holding it ("input[3]", "query", "documents[1]"; `fallback` when that cannot be told).
Status textTooLong(std::string_view json, size_t at, size_t max_chars, std::string_view fallback);

// longestStringOver() as the 400 every model route gives before parsing [TAG_ADMISSION]:
// textTooLong's INVALID_ARGUMENT "<path>: is longer than the limit of N characters
// (--max-input-chars)", the path found by jsonPathAt ("input[1]", "messages[0].content"), `field`
// ("input", "documents", "messages", "prompt") when it cannot be told.
Status checkBodyTextChars(std::string_view body, std::string_view field,
                          const RequestLimits& limits);

// The effective per-input token limit: the smaller of the flag (when set) and the model's maximum.
size_t inputTokenLimit(const RequestLimits& limits, uint32_t model_max_seq_len);

// OK when an input of `tokens` tokens fits the per-input limit; names `path` and either the model
// maximum or the flag, whichever is smaller.
Status checkInputTokens(size_t tokens, const std::string& path, const RequestLimits& limits,
                        uint32_t model_max_seq_len);

// OK when `total` tokens fit --max-request-tokens; otherwise names `field` ("input", "documents").
Status checkRequestTokens(size_t total, std::string_view field, const RequestLimits& limits);

// The `x-request-timeout` header [TAG_REQUEST_TIMEOUT]: a positive number of SECONDS, decimal
// fractions allowed ("30", "2.5", "0.05"), at most 3600; leading/trailing blanks are ignored.
// Empty: nullopt (no header). Anything else: INVALID_ARGUMENT naming the header.
Result<std::optional<std::chrono::microseconds>> parseRequestTimeout(std::string_view value);

// The deadline of an upstream call: the smaller of the server's --request-timeout-ms (0 = none)
// and the caller's header (nullopt = none); zero duration means no deadline at all.
std::chrono::microseconds effectiveTimeout(std::chrono::milliseconds server,
                                           std::optional<std::chrono::microseconds> header);

}  // namespace garden::ivy
