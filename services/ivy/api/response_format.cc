#include "services/ivy/api/response_format.h"

#include <memory>

#include "common/grammar/cache.h"
#include "common/grammar/json_schema.h"
#include "services/ivy/api/errors.h"

namespace garden::ivy {

namespace {

using simdjson::dom::element;

// Serialized grammars by hash of (kind, schema text).
grammar::LruCache<std::shared_ptr<const std::string>>& grammarCache() {
  static grammar::LruCache<std::shared_ptr<const std::string>> cache(256);
  return cache;
}

Result<std::string> compiledGrammar(std::string_view kind, const std::string& schema) {
  const uint64_t key = grammar::fnv1a64(schema, grammar::fnv1a64(kind));
  if (auto hit = grammarCache().get(key)) return **hit;
  Result<grammar::Grammar> g =
      kind == "json_object" ? grammar::jsonObjectGrammar() : grammar::jsonSchemaGrammar(schema);
  if (!g.isOk()) return g.status();
  auto bytes = std::make_shared<const std::string>(g->serialize());
  grammarCache().put(key, bytes);
  return *bytes;
}

}  // namespace

Result<std::optional<StructuredOutput>> parseResponseFormat(const element& format,
                                                            std::string_view field,
                                                            bool responses_shape) {
  const std::string f(field);
  if (format.is_null()) return std::optional<StructuredOutput>();
  if (format.type() != simdjson::dom::element_type::OBJECT) {
    return invalidField(f, "must be an object");
  }
  std::string_view type;
  if (format["type"].get_string().get(type) != simdjson::SUCCESS) {
    return invalidField(f + ".type", "must be one of \"text\", \"json_object\", \"json_schema\"");
  }
  if (type == "text") return std::optional<StructuredOutput>();
  StructuredOutput out;
  if (type == "json_object") {
    ASSIGN_OR_RETURN(out.grammar, compiledGrammar("json_object", ""));
    return std::optional<StructuredOutput>(std::move(out));
  }
  if (type != "json_schema") {
    return invalidField(f + ".type", "must be one of \"text\", \"json_object\", \"json_schema\" (got \"" +
                                         std::string(type) + "\")");
  }
  element js = format;
  std::string base = f;
  if (!responses_shape) {
    if (format["json_schema"].get(js) != simdjson::SUCCESS ||
        js.type() != simdjson::dom::element_type::OBJECT) {
      return invalidField(f + ".json_schema", "must be an object with name and schema");
    }
    base = f + ".json_schema";
  }
  std::string_view name;
  if (js["name"].get_string().get(name) != simdjson::SUCCESS || name.empty() ||
      name.size() > 64) {
    return invalidField(base + ".name", "must be a non-empty string of at most 64 characters");
  }
  out.name = std::string(name);
  std::string_view desc;
  if (js["description"].get_string().get(desc) == simdjson::SUCCESS) out.description = desc;
  element schema;
  if (js["schema"].get(schema) != simdjson::SUCCESS) {
    // OpenAI: a missing schema means any JSON (an empty schema).
    out.schema = "{}";
  } else {
    out.schema = simdjson::minify(schema);
  }
  if (auto st = js["strict"]; st.error() == simdjson::SUCCESS && !st.is_bool() && !st.is_null()) {
    return invalidField(base + ".strict", "must be a boolean");
  }
  auto g = compiledGrammar("json_schema", out.schema);
  if (!g.isOk()) return invalidField(base + ".schema", g.status().message());
  out.grammar = std::move(g).value();
  return std::optional<StructuredOutput>(std::move(out));
}

Result<std::string> toolParametersGrammar(const std::string& parameters_json) {
  static const std::string kNoParameters =
      R"({"type":"object","properties":{},"additionalProperties":false})";
  return compiledGrammar("json_schema",
                         parameters_json.empty() ? kNoParameters : parameters_json);
}

std::string responseFormatInstructions(const StructuredOutput& s) {
  if (s.name.empty()) return {};
  std::string out = "## " + s.name + "\n\n";
  if (!s.description.empty()) out += "// " + s.description + "\n";
  out += s.schema;
  return out;
}

}  // namespace garden::ivy
