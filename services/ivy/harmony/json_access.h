#pragma once
// Small lenient accessors over simdjson DOM elements shared by the Harmony code that reads JSON
// (openai_request.cc, schema_ts.cc): a wrong type reads as empty / absent, and callers check types
// themselves where the difference matters. Header-only, internal to services/ivy/harmony.

#include <simdjson.h>

#include <optional>
#include <string_view>

namespace garden::ivy::harmony::json {

using simdjson::dom::element;
using simdjson::dom::element_type;

inline simdjson::dom::array asArray(const element& e) {
  simdjson::dom::array a;
  if (e.get(a) != simdjson::SUCCESS) return {};
  return a;
}

inline simdjson::dom::object asObject(const element& e) {
  simdjson::dom::object o;
  if (e.get(o) != simdjson::SUCCESS) return {};
  return o;
}

inline std::string_view asString(const element& e) {
  std::string_view s;
  if (e.get(s) != simdjson::SUCCESS) return {};
  return s;
}

// The value of `key` when `e` is an object that has it.
inline std::optional<element> field(const element& e, std::string_view key) {
  if (e.type() != element_type::OBJECT) return std::nullopt;
  element v;
  if (asObject(e).at_key(key).get(v) != simdjson::SUCCESS) return std::nullopt;
  return v;
}

}  // namespace garden::ivy::harmony::json
