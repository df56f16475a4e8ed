#pragma once
// parseJsonBody: the one way ivy parses the JSON body of a request [TAG_JSON_BODY]. Every route
// that reads a body (/v1/embeddings, /v1/score, /v1/rerank, /v1/chat/completions,
// /v1/completions, /tokenize, /detokenize) parses it here, so each rule below holds for all of
// them. Pure functions, callable from any thread (the caller owns the parser).
//
// Rules, each a 400 whose message starts with the path of what is wrong ([TAG_FIELD_ERRORS]):
//   * syntax: "We could not parse the JSON body of your request (<simdjson's reason>)";
//   * text that is not Unicode names the field holding it and the problem: invalid UTF-8,
//     a lone UTF-16 surrogate escape ("text: contains \ud800, a lone UTF-16 surrogate ..."), an
//     invalid escape or an unescaped control character (simdjson only says "problem while
//     parsing a string", so the raw body is scanned again to find where; only on this error
//     path);
//   * a number or literal that is not JSON, or out of what simdjson reads (NaN, Infinity, 01,
//     .5, tru, an integer beyond 64 bits, 1e999) names its field too ("dimensions: is not a JSON
//     value: NaN ..."), found the same way; so does nesting deeper than simdjson's 1024 levels
//     (named by its top-level field);
//   * the root must be an object ("body: must be a JSON object, got an array");
//   * no object, at any depth, may repeat a key ("model: the key \"model\" appears more than once
//     in the request body"; "messages[0].role: ..." for a nested object). Parsers disagree on
//     which of two equal keys wins (simdjson: the first; most others: the last), so a body-checking
//     proxy in front of ivy could be shown one value while ivy used the other: such a body is
//     refused. The check walks the parsed document once (keys compared as decoded, so
//     "mod\u0065l" repeats "model"); objects with many keys are sorted, never hashed.
//
// jsonPathAt names the value at a byte offset of a body (the raw pre-scan in api/limits.h finds
// an over-long text before parsing, and this tells which field it is).

#include <simdjson.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace garden::ivy {

// Parses `body` into `parser` and checks it as above. The element (an object) lives in `parser`.
Result<simdjson::dom::element> parseJsonBody(std::string_view body,
                                             simdjson::dom::parser& parser);

// "an array", "a string", "an integer", ... for messages.
std::string_view jsonTypeName(const simdjson::dom::element& e);

// The request-field path ("input[2]", "messages[0].content", "query") of the string value whose
// opening quote is at byte `offset` of `json`; "" when no string value starts there (or it is an
// object key, or the root, or nested too deeply to tell).
std::string jsonPathAt(std::string_view json, size_t offset);

}  // namespace garden::ivy
