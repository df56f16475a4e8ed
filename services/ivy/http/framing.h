#pragma once
// Request framing rules the Beast parser leaves to us [TAG_HTTP_FRAMING] (RFC 9112 §6). Beast
// frames a body by Content-Length, or as chunked when the last coding of Transfer-Encoding is
// `chunked`; with any other Transfer-Encoding (`gzip`, `identity`, `xchunked`,
// `chunked, identity`, `chunked, chunked`, an empty value) it takes the body as empty, and the
// body's bytes would then be parsed as the next request on the connection: a smuggled request
// that a proxy in front of ivy never saw. checkRequestFraming decides, from the header alone,
// whether the body can be read as the client meant it:
//   * no Transfer-Encoding: OK (Content-Length or no body, as Beast read it);
//   * Transfer-Encoding in an HTTP/1.0 request, or together with Content-Length: 400;
//   * the last coding not exactly `chunked` (no parameters), or `chunked` more than once, or no
//     coding at all: 400;
//   * other codings before the final `chunked` (`gzip, chunked`): 415, since ivy decodes none;
//   * and Beast must agree that the body is chunked, else 400.
// The server answers every refusal and closes the connection without reading further (a refused
// request's remaining bytes are drained, never parsed). Pure function, any thread.

#include <span>
#include <string>
#include <string_view>

namespace garden::ivy {

struct FramingCheck {
  enum class Verdict { kOk, kBadRequest, kUnsupportedCoding };
  Verdict verdict = Verdict::kOk;
  std::string message;  // why, for the error response (empty when kOk)
};

// `version`: 10 or 11; `transfer_encodings`: the value of every Transfer-Encoding field, in order;
// `has_content_length`: a Content-Length field is present; `parser_chunked`: Beast will read the
// body as chunked.
FramingCheck checkRequestFraming(unsigned version,
                                 std::span<const std::string_view> transfer_encodings,
                                 bool has_content_length, bool parser_chunked);

}  // namespace garden::ivy
