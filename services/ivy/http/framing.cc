#include "services/ivy/http/framing.h"

#include <vector>

#include "services/ivy/http/header_text.h"

namespace garden::ivy {
namespace {

constexpr size_t kMaxShown = 64;  // bytes of a coding quoted back

bool isChunked(std::string_view coding) { return equalsIgnoreCase(coding, "chunked"); }

FramingCheck bad(std::string message) {
  return {FramingCheck::Verdict::kBadRequest, std::move(message)};
}

std::string quoted(std::string_view s) { return "\"" + std::string(s.substr(0, kMaxShown)) + "\""; }

}  // namespace

FramingCheck checkRequestFraming(unsigned version,
                                 std::span<const std::string_view> transfer_encodings,
                                 bool has_content_length, bool parser_chunked) {
  if (transfer_encodings.empty()) {
    if (parser_chunked) return bad("the request's framing could not be determined");
    return {};
  }
  if (version < 11) {
    return bad("Transfer-Encoding is not allowed in an HTTP/1.0 request (RFC 9112 section 6.1)");
  }
  if (has_content_length) {
    return bad(
        "a request may not carry both Content-Length and Transfer-Encoding (RFC 9112 section "
        "6.3)");
  }
  std::vector<std::string_view> codings;  // in order, empty list elements skipped
  for (std::string_view value : transfer_encodings) appendListElements(value, &codings);
  if (codings.empty()) return bad("Transfer-Encoding names no transfer coding");
  size_t chunked = 0;
  for (std::string_view c : codings) chunked += isChunked(c);
  if (!isChunked(codings.back())) {
    return bad("the last transfer coding must be chunked (RFC 9112 section 6.3), got " +
               quoted(codings.back()));
  }
  if (chunked > 1) return bad("the chunked transfer coding may be applied only once");
  if (codings.size() > 1) {
    const std::string_view other = codings.front();
    return {FramingCheck::Verdict::kUnsupportedCoding,
            "transfer coding " + quoted(other) +
                " is not supported: send the body with Transfer-Encoding: chunked alone (or "
                "Content-Length)"};
  }
  if (!parser_chunked) return bad("Transfer-Encoding was not understood");
  return {};
}

}  // namespace garden::ivy
