#pragma once
// JSON Schema (a subset) -> byte Grammar of the JSON texts the schema accepts, as OpenAI's
// `response_format: {"type": "json_schema", ...}` and strict tool parameters need.
//
// Supported: `type` (object, array, string, number, integer, boolean, null, and lists of them),
// `enum`, `const`, `properties`, `required`, `additionalProperties` (false; true/absent = any
// JSON value under any other key, after the declared ones; or a schema for the extra values),
// `items`, `minItems`, `maxItems` (<= 256 expanded), `anyOf`, `oneOf` (as anyOf), `allOf` with one
// member, `$ref` to `#`, `#/$defs/...`, `#/definitions/...` or any local JSON pointer (recursive
// refs allowed when they pass through an object or array), string `pattern` (regex.h subset),
// `format` (date, time, date-time, uuid, email, ipv4; others are annotations), `minLength` /
// `maxLength` (<= 1024), `nullable` (OpenAPI). Annotations are ignored (title, description,
// default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly, $defs,
// definitions). Any other keyword is an INVALID_ARGUMENT error naming it and where it is.
//
// Shape of the generated text:
//  * properties come in the schema's order (optional ones may be left out), extra keys after;
//  * at each place JSON allows whitespace, at most `max_whitespace` bytes from `whitespace`
//    (default: at most one space) — the bound keeps a model from looping on whitespace;
//  * numbers: JSON number syntax, no leading zeros, at most 18 integer digits, 20 fraction digits
//    and 2 exponent digits; strings: valid UTF-8, any JSON escape.
//  * extra keys (additionalProperties true) may not spell a declared key with plain ASCII bytes;
//    a key written with escapes that decodes to a declared one is not caught, and extra keys may
//    repeat each other (so may keys in json_object mode).
//
// Threads: pure functions.

#include <cstdint>
#include <string>
#include <string_view>

#include "common/grammar/grammar.h"

namespace garden::grammar {

struct JsonSchemaOptions {
  int32_t max_whitespace = 1;    // 0..64
  std::string whitespace = " ";  // subset of " \t\n\r"
};

// `schema_json`: the schema document (its root is the schema; refs resolve against it).
Result<Grammar> jsonSchemaGrammar(std::string_view schema_json,
                                  const JsonSchemaOptions& options = {});
// `{"type": "json_object"}`: any JSON object.
Result<Grammar> jsonObjectGrammar(const JsonSchemaOptions& options = {});

}  // namespace garden::grammar
