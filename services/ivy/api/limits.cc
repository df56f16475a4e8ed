#include "services/ivy/api/limits.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include "services/ivy/api/errors.h"
#include "services/ivy/api/json_body.h"

namespace garden::ivy {

size_t countChars(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

Status checkInputChars(std::string_view text, const std::string& path,
                       const RequestLimits& limits) {
  // Bytes bound characters from above: most inputs are decided without counting.
  if (limits.max_input_chars == 0 || text.size() <= limits.max_input_chars) return okStatus();
  size_t chars = countChars(text);
  if (chars <= limits.max_input_chars) return okStatus();
  return invalidField(path, "has " + std::to_string(chars) +
                                " characters, more than the limit of " +
                                std::to_string(limits.max_input_chars) + " (--max-input-chars)");
}

size_t longestStringOver(std::string_view json, size_t max_chars, size_t* at) {
  if (max_chars == 0 || json.size() <= max_chars + 2) return 0;
  const char* p = json.data();
  const char* end = p + json.size();
  while (p < end) {
    const char* q = static_cast<const char*>(std::memchr(p, '"', size_t(end - p)));
    if (q == nullptr) return 0;
    // Inside a string literal: count characters until the closing quote or past the limit.
    const size_t start = static_cast<size_t>(q - json.data());
    size_t chars = 0;
    p = q + 1;
    while (p < end && *p != '"' && chars <= max_chars) {
      unsigned char c = static_cast<unsigned char>(*p);
      if (c == '\\' && p + 1 < end) {
        if (p[1] == 'u' && end - p >= 6) {
          // A high surrogate is counted with the low one that follows it.
          bool high = (p[2] == 'd' || p[2] == 'D') &&
                      (p[3] == '8' || p[3] == '9' || p[3] == 'a' || p[3] == 'A' ||
                       p[3] == 'b' || p[3] == 'B');
          chars += high ? 0 : 1;
          p += 6;
        } else {
          chars += 1;
          p += 2;
        }
      } else {
        chars += (c & 0xC0) != 0x80;
        ++p;
      }
    }
    if (chars > max_chars) {
      // Over the limit: find the closing quote fast (one not escaped by an odd run of '\').
      while (true) {
        const char* e = static_cast<const char*>(std::memchr(p, '"', size_t(end - p)));
        if (e == nullptr) return 0;  // unterminated: the parser reports the syntax error
        const char* b = e;
        while (b > p && b[-1] == '\\') --b;
        p = e + 1;
        if ((e - b) % 2 == 0) break;
      }
      // An object key (followed by ':') is not a text; keys are still bounded by the body limit.
      const char* k = p;
      while (k < end && (*k == ' ' || *k == '\t' || *k == '\n' || *k == '\r')) ++k;
      if (k >= end || *k != ':') {
        if (at != nullptr) *at = start;
        return chars;
      }
      continue;
    }
    if (p >= end) return 0;  // unterminated
    ++p;                     // past the closing quote
  }
  return 0;
}

Status textTooLong(std::string_view json, size_t at, size_t max_chars,
                   std::string_view fallback) {
  std::string path = jsonPathAt(json, at);
  return invalidField(path.empty() ? fallback : std::string_view(path),
                      "is longer than the limit of " + std::to_string(max_chars) +
                          " characters (--max-input-chars)");
}

Status checkBodyTextChars(std::string_view body, std::string_view field,
                          const RequestLimits& limits) {
  size_t at = 0;
  if (longestStringOver(body, limits.max_input_chars, &at) == 0) return okStatus();
  return textTooLong(body, at, limits.max_input_chars, field);
}

size_t inputTokenLimit(const RequestLimits& limits, uint32_t model_max_seq_len) {
  if (limits.max_input_tokens == 0 || limits.max_input_tokens > model_max_seq_len) {
    return model_max_seq_len;
  }
  return limits.max_input_tokens;
}

Status checkInputTokens(size_t tokens, const std::string& path, const RequestLimits& limits,
                        uint32_t model_max_seq_len) {
  size_t limit = inputTokenLimit(limits, model_max_seq_len);
  if (tokens <= limit) return okStatus();
  if (limit == model_max_seq_len) {
    return invalidField(path, "has " + std::to_string(tokens) +
                                  " tokens, more than the model's maximum of " +
                                  std::to_string(limit));
  }
  return invalidField(path, "has " + std::to_string(tokens) + " tokens, more than the limit of " +
                                std::to_string(limit) + " (--max-input-tokens)");
}

Status checkRequestTokens(size_t total, std::string_view field, const RequestLimits& limits) {
  if (limits.max_request_tokens == 0 || total <= limits.max_request_tokens) return okStatus();
  return invalidField(field, "the request has more than " +
                                 std::to_string(limits.max_request_tokens) +
                                 " tokens in all (--max-request-tokens); got at least " +
                                 std::to_string(total));
}

Result<std::optional<std::chrono::microseconds>> parseRequestTimeout(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (v.empty()) return std::optional<std::chrono::microseconds>();
  auto bad = [&v] {
    return invalidField("x-request-timeout",
                        "must be a positive number of seconds up to 3600 (e.g. \"2.5\"), got \"" +
                            std::string(v.substr(0, 32)) + "\"");
  };
  // Digits and at most one '.', nothing else (from_chars alone would accept "1e3", "inf", "-1").
  int dots = 0;
  for (char c : v) {
    if (c == '.') {
      ++dots;
    } else if (c < '0' || c > '9') {
      return bad();
    }
  }
  if (dots > 1 || v == "." || v.size() > 16) return bad();
  double seconds = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), seconds);
  if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(seconds) ||
      seconds <= 0 || seconds > 3600) {
    return bad();
  }
  auto us = std::chrono::microseconds(static_cast<int64_t>(std::llround(seconds * 1e6)));
  if (us.count() < 1) return bad();
  return std::optional<std::chrono::microseconds>(us);
}

std::chrono::microseconds effectiveTimeout(std::chrono::milliseconds server,
                                           std::optional<std::chrono::microseconds> header) {
  std::chrono::microseconds s = server;
  if (!header) return s;
  if (s.count() <= 0) return *header;
  return std::min(s, *header);
}

}  // namespace garden::ivy
