#pragma once
// Structured outputs on the OpenAI APIs [TAG_TOKEN_MASK]: `response_format` of
// /v1/chat/completions (and /v1/completions, a vLLM extension) and `text.format` of
// /v1/responses, turned into the byte grammar tulip masks tokens with (docs/structured-outputs.md):
//   {"type": "text"}                                   -> nothing
//   {"type": "json_object"}                            -> any JSON object
//   {"type": "json_schema", "json_schema": {"name": .., "schema": {..}, "description": ..,
//    "strict": bool}}                                  -> the JSON Schema subset of
//                                                         common/grammar/json_schema.h
// (Responses' text.format carries name/schema/strict at its top level: pass it as `format` with
// responses_shape = true.) A schema the grammar compiler does not support is a 400 naming the
// field and the keyword ("response_format.json_schema.schema: schema #/properties/a:
// unsupported keyword 'minimum'"). Compiled grammars are cached by schema text (bounded LRU).
//
// Threads: any; the cache is thread-safe.

#include <simdjson.h>

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace garden::ivy {

struct StructuredOutput {
  std::string grammar;      // common/grammar serialized byte grammar
  std::string name;         // json_schema.name ("" for json_object)
  std::string description;  // json_schema.description
  std::string schema;       // the schema as minified JSON ("" for json_object)
};

// nullopt: plain text. `field`: the name errors start with ("response_format", "text.format").
Result<std::optional<StructuredOutput>> parseResponseFormat(const simdjson::dom::element& format,
                                                            std::string_view field,
                                                            bool responses_shape = false);

// A strict function tool's `parameters` schema [TAG_STRICT_TOOLS] -> the serialized byte grammar
// of its call arguments (same compiler and cache as json_schema). "" (no parameters): an empty
// object. Errors are the compiler's reason ("schema #/properties/a: unsupported keyword
// 'minimum'"); the caller names the field.
Result<std::string> toolParametersGrammar(const std::string& parameters_json);

// The Harmony developer-message section that tells the model about the format (OpenAI's
// "# Response Formats" convention): "## name\n\n// description\n{schema}". Empty for json_object.
std::string responseFormatInstructions(const StructuredOutput& s);

}  // namespace garden::ivy
