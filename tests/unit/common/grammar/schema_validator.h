#pragma once
// A small JSON Schema validator for tests, written independently of common/grammar: documents
// are parsed by simdjson, `pattern` and `format` are checked with std::regex (ECMAScript), string
// lengths count code points. It covers the keywords common/grammar supports; oneOf is checked
// with its real meaning (exactly one alternative), so test schemas using it keep alternatives
// disjoint. A repeated key is an error only when the schema declares it. validate() returns ""
// when valid, else what failed and where.
//
// Threads: one validator per thread.

#include <regex>
#include <set>
#include <string>
#include <string_view>

#include <simdjson.h>

namespace garden::grammar::testing {

class SchemaValidator {
 public:
  explicit SchemaValidator(std::string schema) : schema_text_(std::move(schema)) {
    if (schema_parser_.parse(schema_text_).get(schema_)) ok_ = false;
  }
  bool schemaOk() const { return ok_; }

  std::string validate(std::string_view doc_text) {
    simdjson::dom::element doc;
    doc_padded_ = simdjson::padded_string(doc_text);
    if (auto e = doc_parser_.parse(doc_padded_).get(doc)) {
      return std::string("not JSON: ") + simdjson::error_message(e);
    }
    return check(schema_, doc, "$");
  }

 private:
  using El = simdjson::dom::element;
  using T = simdjson::dom::element_type;

  static bool jsonEqual(El a, El b) {
    if (a.is_number() && b.is_number()) return a.get_double().value_unsafe() == b.get_double().value_unsafe();
    if (a.type() != b.type()) return false;
    switch (a.type()) {
      case T::ARRAY: {
        auto x = arr(a), y = arr(b);
        if (x.size() != y.size()) return false;
        auto it = y.begin();
        for (auto v : x) {
          if (!jsonEqual(v, *it)) return false;
          ++it;
        }
        return true;
      }
      case T::OBJECT: {
        auto x = a.get_object().value_unsafe(), y = b.get_object().value_unsafe();
        if (x.size() != y.size()) return false;
        for (auto [k, v] : x) {
          El w;
          if (y[k].get(w) || !jsonEqual(v, w)) return false;
        }
        return true;
      }
      case T::STRING: return a.get_string().value_unsafe() == b.get_string().value_unsafe();
      case T::BOOL: return a.get_bool().value_unsafe() == b.get_bool().value_unsafe();
      default: return true;  // null
    }
  }

  static simdjson::dom::array arr(El e) {
    simdjson::dom::array a;
    if (e.get(a)) return {};
    return a;
  }

  static size_t codePoints(std::string_view s) {
    size_t n = 0;
    for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    return n;
  }

  static bool typeIs(El d, std::string_view t) {
    if (t == "object") return d.type() == T::OBJECT;
    if (t == "array") return d.type() == T::ARRAY;
    if (t == "string") return d.type() == T::STRING;
    if (t == "boolean") return d.type() == T::BOOL;
    if (t == "null") return d.type() == T::NULL_VALUE;
    if (t == "number") return d.is_number();
    if (t == "integer") {
      if (d.type() == T::INT64 || d.type() == T::UINT64) return true;
      if (d.type() == T::DOUBLE) {
        const double v = d.get_double().value_unsafe();
        return v == static_cast<double>(static_cast<long long>(v));
      }
      return false;
    }
    return false;
  }

  std::string check(El s, El d, const std::string& at) {
    bool b;
    if (!s.get(b)) return b ? "" : at + ": schema false";
    simdjson::dom::object so;
    if (s.get(so)) return at + ": bad schema";
    El x;
    if (!so["nullable"].get(x) && x.get_bool().value_unsafe() && d.type() == T::NULL_VALUE) {
      return "";
    }
    if (!so["$ref"].get(x)) {
      std::string_view ref = x.get_string().value_unsafe();
      El target;
      if (ref == "#") {
        target = schema_;
      } else if (schema_.at_pointer(ref.substr(1)).get(target)) {
        return at + ": unresolved ref";
      }
      return check(target, d, at);
    }
    if (!so["anyOf"].get(x)) {
      for (auto alt : arr(x)) {
        if (check(alt, d, at).empty()) return "";
      }
      return at + ": no anyOf alternative matches";
    }
    if (!so["oneOf"].get(x)) {
      int n = 0;
      for (auto alt : arr(x)) n += check(alt, d, at).empty();
      return n == 1 ? "" : at + ": " + std::to_string(n) + " oneOf alternatives match";
    }
    if (!so["allOf"].get(x)) {
      for (auto alt : arr(x)) {
        if (auto e = check(alt, d, at); !e.empty()) return e;
      }
    }
    if (!so["const"].get(x) && !jsonEqual(x, d)) return at + ": not the const";
    if (!so["enum"].get(x)) {
      bool found = false;
      for (auto v : arr(x)) found = found || jsonEqual(v, d);
      if (!found) return at + ": not in enum";
    }
    if (!so["type"].get(x)) {
      bool ok = false;
      if (x.type() == T::STRING) {
        ok = typeIs(d, x.get_string().value_unsafe());
      } else {
        for (auto t : arr(x)) ok = ok || typeIs(d, t.get_string().value_unsafe());
      }
      if (!ok) return at + ": wrong type";
    }
    if (d.type() == T::STRING) {
      std::string_view str = d.get_string().value_unsafe();
      const size_t n = codePoints(str);
      if (!so["minLength"].get(x) && n < x.get_uint64().value_unsafe()) return at + ": too short";
      if (!so["maxLength"].get(x) && n > x.get_uint64().value_unsafe()) return at + ": too long";
      if (!so["pattern"].get(x)) {
        std::regex re(std::string(x.get_string().value_unsafe()), std::regex::ECMAScript);
        if (!std::regex_search(std::string(str), re)) return at + ": pattern mismatch: " + std::string(str);
      }
      if (!so["format"].get(x)) {
        if (auto e = checkFormat(x.get_string().value_unsafe(), str); !e.empty()) return at + ": " + e;
      }
    }
    if (d.is_number()) {  // [TAG_NUMBER_RANGE]
      const double v = d.get_double().value_unsafe();
      if (!so["minimum"].get(x) && v < x.get_double().value_unsafe()) return at + ": below minimum";
      if (!so["maximum"].get(x) && v > x.get_double().value_unsafe()) return at + ": above maximum";
      if (!so["exclusiveMinimum"].get(x) && v <= x.get_double().value_unsafe()) {
        return at + ": not above exclusiveMinimum";
      }
      if (!so["exclusiveMaximum"].get(x) && v >= x.get_double().value_unsafe()) {
        return at + ": not below exclusiveMaximum";
      }
    }
    if (d.type() == T::ARRAY) {
      auto items = arr(d);
      if (!so["minItems"].get(x) && items.size() < x.get_uint64().value_unsafe()) return at + ": too few items";
      if (!so["maxItems"].get(x) && items.size() > x.get_uint64().value_unsafe()) return at + ": too many items";
      if (!so["items"].get(x)) {
        size_t i = 0;
        for (auto v : items) {
          if (auto e = check(x, v, at + "[" + std::to_string(i++) + "]"); !e.empty()) return e;
        }
      }
    }
    if (d.type() == T::OBJECT) {
      auto obj = d.get_object().value_unsafe();
      // A repeated key is an error when the schema declares it (properties), and tolerated
      // otherwise: each copy is validated below. (RFC 8259 only says names SHOULD be unique; a
      // grammar cannot keep arbitrary extra keys apart, docs/structured-outputs.md.)
      std::set<std::string> keys;
      simdjson::dom::object declared;
      const bool has_declared = !so["properties"].get(declared);
      for (auto [k, v] : obj) {
        (void)v;
        El unused;
        if (!keys.insert(std::string(k)).second && has_declared && !declared[k].get(unused)) {
          return at + ": duplicate declared key " + std::string(k);
        }
      }
      if (!so["required"].get(x)) {
        for (auto r : arr(x)) {
          if (!keys.count(std::string(r.get_string().value_unsafe()))) {
            return at + ": missing required " + std::string(r.get_string().value_unsafe());
          }
        }
      }
      simdjson::dom::object props;
      const bool has_props = !so["properties"].get(props);
      El ap;
      const bool has_ap = !so["additionalProperties"].get(ap);
      for (auto [k, v] : obj) {
        El ps;
        if (has_props && !props[k].get(ps)) {
          if (auto e = check(ps, v, at + "." + std::string(k)); !e.empty()) return e;
        } else if (has_ap) {
          if (auto e = check(ap, v, at + "." + std::string(k)); !e.empty()) return e;
        }
      }
    }
    return "";
  }

  static std::string checkFormat(std::string_view f, std::string_view s) {
    static const std::regex date(R"(^\d{4}-(\d{2})-(\d{2})$)");
    static const std::regex time(R"(^(\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$)");
    static const std::regex uuid(R"(^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$)");
    static const std::regex email(R"(^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$)");
    const std::string str(s);
    std::smatch m;
    auto dateOk = [](const std::string& d) {
      std::smatch mm;
      if (!std::regex_match(d, mm, date)) return false;
      const int mo = std::stoi(mm[1]), dd = std::stoi(mm[2]);
      return mo >= 1 && mo <= 12 && dd >= 1 && dd <= 31;
    };
    auto timeOk = [](const std::string& t) {
      std::smatch mm;
      if (!std::regex_match(t, mm, time)) return false;
      return std::stoi(mm[1]) < 24 && std::stoi(mm[2]) < 60 && std::stoi(mm[3]) <= 60;
    };
    if (f == "date") return dateOk(str) ? "" : "bad date " + str;
    if (f == "time") return timeOk(str) ? "" : "bad time " + str;
    if (f == "date-time") {
      const size_t t = str.find_first_of("Tt");
      if (t == std::string::npos || !dateOk(str.substr(0, t)) || !timeOk(str.substr(t + 1))) {
        return "bad date-time " + str;
      }
      return "";
    }
    if (f == "uuid") return std::regex_match(str, uuid) ? "" : "bad uuid " + str;
    if (f == "email") return std::regex_match(str, email) ? "" : "bad email " + str;
    return "";
  }

  std::string schema_text_;
  simdjson::dom::parser schema_parser_;
  simdjson::dom::parser doc_parser_;
  simdjson::padded_string doc_padded_;
  El schema_;
  bool ok_ = true;
};

}  // namespace garden::grammar::testing
