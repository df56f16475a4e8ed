#include "services/ivy/harmony/schema_ts.h"

#include <simdjson.h>

#include <charconv>
#include <optional>
#include <string>
#include <vector>

#include "common/json_writer.h"
#include "services/ivy/harmony/json_access.h"

namespace garden::ivy::harmony {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;
using json::asArray;
using json::asObject;
using json::asString;
using json::field;


template <typename T>
T scalar(const element& e) {
  T v{};
  if (e.get(v) != simdjson::SUCCESS) return T{};
  return v;
}
bool asBool(const element& e) {
  bool b = false;
  if (e.get(b) != simdjson::SUCCESS) return false;
  return b;
}
element firstOf(const simdjson::dom::array& a) {
  element e;
  for (element x : a) return x;
  return e;
}


std::optional<std::string_view> stringField(const element& e, std::string_view key) {
  auto f = field(e, key);
  if (!f || f->type() != element_type::STRING) return std::nullopt;
  return asString(*f);
}

bool isTrue(const element& e, std::string_view key) {
  auto f = field(e, key);
  return f && f->type() == element_type::BOOL && asBool(*f);
}

// `enum` present and a non-empty array.
bool isEnum(const element& e) {
  auto f = field(e, "enum");
  return f && f->type() == element_type::ARRAY && asArray(*f).size() > 0;
}

// ryu's f64 formatting (what serde_json writes): shortest round-trip digits, then
// plain notation for decimal exponents in [-5, 16), scientific ("1e20", "1.5e-7") outside.
void appendSerdeDouble(std::string& out, double d) {
  if (d != d || d == std::numeric_limits<double>::infinity() ||
      d == -std::numeric_limits<double>::infinity()) {
    out += "null";  // serde_json writes non-finite floats as null
    return;
  }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  bool negative = false;
  if (!sci.empty() && sci[0] == '-') {
    negative = true;
    sci.remove_prefix(1);
  }
  size_t e_pos = sci.find('e');
  std::string mantissa(sci.substr(0, e_pos));
  int exp10 = 0;
  std::from_chars(sci.data() + e_pos + 1 + (sci[e_pos + 1] == '+' ? 1 : 0), sci.data() + sci.size(),
                  exp10);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  // value = 0.digits * 10^(kk) where kk = exp10 + 1
  int length = static_cast<int>(digits.size());
  int kk = exp10 + 1;
  int k = kk - length;  // value = digits * 10^k
  if (negative) out.push_back('-');
  if (digits == "0") {
    out += "0.0";
    return;
  }
  if (k >= 0 && kk <= 16) {
    out += digits;
    out.append(static_cast<size_t>(k), '0');
    out += ".0";
  } else if (kk > 0 && kk <= 16) {
    out += digits.substr(0, static_cast<size_t>(kk));
    out.push_back('.');
    out += digits.substr(static_cast<size_t>(kk));
  } else if (kk > -5 && kk <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-kk), '0');
    out += digits;
  } else {
    out.push_back(digits[0]);
    if (length > 1) {
      out.push_back('.');
      out += digits.substr(1);
    }
    out.push_back('e');
    out += std::to_string(kk - 1);
  }
}

void appendSerde(std::string& out, const element& e) {
  switch (e.type()) {
    case element_type::ARRAY: {
      out.push_back('[');
      bool first = true;
      simdjson::dom::array list1 = asArray(e);
      for (element child : list1) {
        if (!first) out.push_back(',');
        first = false;
        appendSerde(out, child);
      }
      out.push_back(']');
      break;
    }
    case element_type::OBJECT: {
      out.push_back('{');
      bool first = true;
      simdjson::dom::object list2 = asObject(e);
      for (auto kv : list2) {
        if (!first) out.push_back(',');
        first = false;
        JsonWriter::appendQuoted(out, kv.key);
        out.push_back(':');
        appendSerde(out, kv.value);
      }
      out.push_back('}');
      break;
    }
    case element_type::INT64:
      out += std::to_string(scalar<int64_t>(e));
      break;
    case element_type::UINT64:
      out += std::to_string(scalar<uint64_t>(e));
      break;
    case element_type::DOUBLE:
      appendSerdeDouble(out, scalar<double>(e));
      break;
    case element_type::STRING:
      // serde_json escapes strings as JsonWriter does for valid UTF-8 (all simdjson hands out):
      // quote, backslash, \b \f \n \r \t, other controls as lower-case \u00xx; nothing else.
      JsonWriter::appendQuoted(out, asString(e));
      break;
    case element_type::BOOL:
      out += asBool(e) ? "true" : "false";
      break;
    case element_type::NULL_VALUE:
      out += "null";
      break;
  }
}

std::string serde(const element& e) {
  std::string s;
  appendSerde(s, e);
  return s;
}

// The text after "default: " for a default value. `quote_plain_strings`: a string default on a
// non-enum schema is written as "S" (raw, not escaped); on an enum schema as S.
std::string defaultText(const element& schema, const element& def) {
  if (def.type() == element_type::STRING) {
    std::string_view s = asString(def);
    if (!isEnum(schema)) return "\"" + std::string(s) + "\"";
    return std::string(s);
  }
  return serde(def);
}

std::string toTs(const element& schema, const std::string& indent);

std::string withNullable(const element& variant, std::string type_str) {
  if (isTrue(variant, "nullable") && type_str.find("null") == std::string::npos) {
    type_str += " | null";
  }
  return type_str;
}

std::string objectToTs(const element& schema, const std::string& indent) {
  std::string out;
  if (auto desc = stringField(schema, "description")) {
    out += indent + "// " + std::string(*desc) + "\n";
  }
  out += "{\n";
  auto props = field(schema, "properties");
  if (props && props->type() == element_type::OBJECT) {
    std::vector<std::string_view> required;
    if (auto req = field(schema, "required"); req && req->type() == element_type::ARRAY) {
      simdjson::dom::array list3 = asArray(*req);
      for (element r : list3) {
        if (r.type() == element_type::STRING) required.push_back(asString(r));
      }
    }
    simdjson::dom::object list4 = asObject(*props);
    for (auto kv : list4) {
      const std::string key(kv.key);
      const element& val = kv.value;
      const char* optional_mark = "?";
      for (auto r : required) {
        if (r == kv.key) optional_mark = "";
      }
      if (auto title = stringField(val, "title")) {
        out += indent + "// " + std::string(*title) + "\n" + indent + "//\n";
      }
      auto one_of = field(val, "oneOf");
      if (!one_of) {
        if (auto desc = stringField(val, "description")) {
          out += indent + "// " + std::string(*desc) + "\n";
        }
      }
      if (auto examples = field(val, "examples");
          examples && examples->type() == element_type::ARRAY) {
        auto arr = asArray(*examples);
        if (arr.size() > 0) {
          out += indent + "// Examples:\n";
          for (element ex : arr) {
            if (ex.type() == element_type::STRING) {
              out += indent + "// - \"" + std::string(asString(ex)) + "\"\n";
            }
          }
        }
      }
      if (one_of && one_of->type() == element_type::ARRAY) {
        auto variants = asArray(*one_of);
        std::optional<std::string_view> property_desc = stringField(val, "description");
        bool skip_property_desc = false;
        if (property_desc && variants.size() > 0) {
          auto first_desc = stringField(firstOf(variants), "description");
          if (first_desc && *first_desc == *property_desc) skip_property_desc = true;
        }
        bool rendered_above = false;
        if (!skip_property_desc && property_desc) {
          out += indent + "// " + std::string(*property_desc) + "\n";
          rendered_above = true;
        }
        if (auto def = field(val, "default")) {
          out += indent + "// default: " + defaultText(val, *def) + "\n";
        }
        out += indent + key + optional_mark + ":\n";
        size_t i = 0;
        for (element variant : variants) {
          out += indent + " | ";
          out += withNullable(variant, toTs(variant, indent + "   "));
          std::vector<std::string> comments;
          if (!(i == 0 && rendered_above)) {
            auto vdesc = stringField(variant, "description");
            if (vdesc && !(property_desc && *vdesc == *property_desc)) {
              comments.emplace_back(*vdesc);
            }
          }
          if (auto def = field(variant, "default")) {
            comments.push_back("default: " + defaultText(variant, *def));
          }
          if (!comments.empty()) {
            out += " //";
            for (const auto& c : comments) out += " " + c;
          }
          out += "\n";
          ++i;
        }
        out += indent + ",\n";
        continue;
      }
      out += indent + key + optional_mark + ": ";
      out += withNullable(val, toTs(val, indent + "    "));
      out += ",";
      if (!one_of) {
        if (auto def = field(val, "default")) out += " // default: " + defaultText(val, *def);
      }
      out += "\n";
    }
  }
  out += indent + "}";
  return out;
}

std::string toTs(const element& schema, const std::string& indent) {
  if (auto one_of = field(schema, "oneOf"); one_of && one_of->type() == element_type::ARRAY) {
    std::string out;
    simdjson::dom::array list5 = asArray(*one_of);
    for (element variant : list5) {
      out += "\n" + indent + " | ";
      out += withNullable(variant, toTs(variant, indent + "   "));
      std::vector<std::string> comments;
      if (auto d = stringField(variant, "description")) comments.emplace_back(*d);
      if (auto def = field(variant, "default")) {
        comments.push_back("default: " + defaultText(variant, *def));
      }
      if (!comments.empty()) {
        out += " //";
        for (const auto& c : comments) out += " " + c;
      }
    }
    return out;
  }
  auto type = field(schema, "type");
  if (type && type->type() == element_type::ARRAY) {
    std::string out;
    bool any = false;
    simdjson::dom::array list6 = asArray(*type);
    for (element t : list6) {
      if (t.type() != element_type::STRING) continue;
      std::string_view s = asString(t);
      if (any) out += " | ";
      out += s == "integer" ? std::string_view("number") : s;
      any = true;
    }
    if (any) return out;
  }
  if (type && type->type() == element_type::STRING) {
    std::string_view t = asString(*type);
    if (t == "object") return objectToTs(schema, indent);
    if (t == "string") {
      if (auto e = field(schema, "enum"); e && e->type() == element_type::ARRAY) {
        std::string out;
        bool any = false;
        simdjson::dom::array list7 = asArray(*e);
        for (element v : list7) {
          if (v.type() != element_type::STRING) continue;
          if (any) out += " | ";
          out += "\"" + std::string(asString(v)) + "\"";
          any = true;
        }
        if (any) return out;
      }
      return "string";
    }
    if (t == "number" || t == "integer") return "number";
    if (t == "boolean") return "boolean";
    if (t == "array") {
      if (auto items = field(schema, "items")) return toTs(*items, indent) + "[]";
      return "Array<any>";
    }
    return "any";
  }
  return "any";
}

// Rust's str::lines(): split on '\n', strip one trailing '\r' per line, no final empty line.
std::vector<std::string_view> rustLines(std::string_view s) {
  std::vector<std::string_view> lines;
  while (!s.empty()) {
    size_t nl = s.find('\n');
    std::string_view line = s.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    if (nl == std::string_view::npos) break;
    s.remove_prefix(nl + 1);
  }
  return lines;
}

Result<element> parseJson(simdjson::dom::parser& parser, std::string_view json,
                          std::string_view what) {
  element root;
  auto err = parser.parse(json.data(), json.size(), /*realloc_if_needed=*/true).get(root);
  if (err != simdjson::SUCCESS) {
    return invalidArgument(std::string(what) +
                           " is not valid JSON: " + simdjson::error_message(err));
  }
  return root;
}

}  // namespace

Result<std::string> jsonSchemaToTypeScript(std::string_view schema_json, std::string_view indent) {
  simdjson::dom::parser parser;
  ASSIGN_OR_RETURN(element root, parseJson(parser, schema_json, "schema"));
  return toTs(root, std::string(indent));
}

Result<std::string> serdeCompactJson(std::string_view json) {
  simdjson::dom::parser parser;
  ASSIGN_OR_RETURN(element root, parseJson(parser, json, "value"));
  return serde(root);
}

Result<std::string> renderToolsSection(const std::map<std::string, ToolNamespace>& tools) {
  std::string out = "# Tools";
  simdjson::dom::parser parser;
  for (const auto& [key, ns] : tools) {
    std::vector<std::string> items;
    items.push_back("## " + ns.name + "\n");
    if (ns.description) {
      for (std::string_view line : rustLines(*ns.description)) {
        items.push_back(ns.tools.empty() ? std::string(line) : "// " + std::string(line));
      }
    }
    if (!ns.tools.empty()) {
      items.push_back("namespace " + ns.name + " {\n");
      for (const ToolDescription& tool : ns.tools) {
        for (std::string_view line : rustLines(tool.description)) {
          items.push_back("// " + std::string(line));
        }
        if (tool.parameters_json) {
          ASSIGN_OR_RETURN(element root, parseJson(parser, *tool.parameters_json,
                                                   "parameters of tool " + tool.name));
          items.push_back("type " + tool.name + " = (_: " + toTs(root, "") + ") => any;\n");
        } else {
          items.push_back("type " + tool.name + " = () => any;\n");
        }
      }
      items.push_back("} // namespace " + ns.name);
    }
    out += "\n\n";
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += "\n";
      out += items[i];
    }
  }
  return out;
}

}  // namespace garden::ivy::harmony
