#include "services/ivy/api/json_body.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <utility>
#include <vector>

#include "services/ivy/api/errors.h"
#include "services/ivy/tokenizer/utf8.h"

namespace garden::ivy {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

constexpr size_t kMaxKeyShown = 64;   // bytes of a key quoted in a message or path
constexpr size_t kMaxWalkDepth = 1024;  // simdjson's default maximum depth
constexpr size_t kFewKeys = 16;        // objects up to this size are checked pairwise

bool isIdentifier(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      return false;
  }
  return true;
}

// At most kMaxKeyShown bytes of `s`, not cutting a UTF-8 sequence.
std::string_view shown(std::string_view s) {
  if (s.size() <= kMaxKeyShown) return s;
  size_t n = kMaxKeyShown;
  while (n > 0 && utf8::isTrail(static_cast<unsigned char>(s[n]))) --n;
  return s.substr(0, n);
}

// Appends the path segment of object key `key`: "name" / ".name", or ["odd key"].
void appendKey(std::string& out, std::string_view key) {
  if (isIdentifier(key)) {
    if (!out.empty()) out += '.';
    out += key;
  } else {
    out += "[\"";
    out += shown(key);
    out += "\"]";
  }
}

void appendIndex(std::string& out, size_t i) {
  out += '[';
  out += std::to_string(i);
  out += ']';
}

std::string hexByte(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", c);
  return buf;
}

// --- where a text problem is: a scan of the raw body that tracks the path ----------------------

enum class Token { kString, kScalar, kTooDeep };

bool isDelimiter(char c) {
  return c == '{' || c == '}' || c == '[' || c == ']' || c == ',' || c == ':' || c == '"' ||
         c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// Walks raw JSON text (valid or not) keeping the path of the value being read. Only structure is
// followed; anything else is skipped, so any input is walked to its end without failing.
class PathWalker {
 public:
  // Calls on_token(kind, begin, end, is_key) for each string literal (json[begin] is its opening
  // quote and json[end - 1] its closing one; end == json.size() when it is unterminated) and for
  // each other token (a number, a literal, or junk: a run of bytes that are neither structure nor
  // blanks). Stops when on_token returns false, or at a nesting deeper than kMaxWalkDepth.
  template <typename Fn>
  void walk(std::string_view json, Fn&& on_token) {
    stack_.clear();
    const size_t n = json.size();
    size_t i = 0;
    while (i < n) {
      switch (json[i]) {
        case '{':
        case '[':
          if (stack_.size() >= kMaxWalkDepth) {
            on_token(Token::kTooDeep, i, i + 1, false);
            return;
          }
          stack_.push_back(Level{json[i] == '{', json[i] == '{', 0, {}});
          ++i;
          break;
        case '}':
        case ']':
          if (!stack_.empty()) stack_.pop_back();
          ++i;
          break;
        case ',':
          if (!stack_.empty()) {
            Level& top = stack_.back();
            if (top.object) {
              top.expect_key = true;
            } else {
              ++top.index;
            }
          }
          ++i;
          break;
        case ':':
          if (!stack_.empty() && stack_.back().object) stack_.back().expect_key = false;
          ++i;
          break;
        case '"': {
          size_t j = i + 1;
          while (j < n && json[j] != '"') j += json[j] == '\\' ? 2 : 1;
          const size_t close = std::min(j, n);
          const size_t end = std::min(close + 1, n);
          const bool is_key = !stack_.empty() && stack_.back().object && stack_.back().expect_key;
          if (!on_token(Token::kString, i, end, is_key)) return;
          if (is_key) stack_.back().key.assign(shown(json.substr(i + 1, close - i - 1)));
          i = end;
          break;
        }
        case ' ':
        case '\t':
        case '\n':
        case '\r':
          ++i;
          break;
        default: {
          size_t j = i + 1;
          while (j < n && !isDelimiter(json[j])) ++j;
          const bool is_key = !stack_.empty() && stack_.back().object && stack_.back().expect_key;
          if (!on_token(Token::kScalar, i, j, is_key)) return;
          i = j;
        }
      }
    }
  }

  // The path of the value being read; `of_key`: of the object whose key is being read. At most
  // `max_levels` segments.
  std::string path(bool of_key, size_t max_levels = kMaxWalkDepth) const {
    std::string out;
    const size_t levels =
        std::min(stack_.size() - (of_key && !stack_.empty() ? 1 : 0), max_levels);
    for (size_t k = 0; k < levels; ++k) {
      if (stack_[k].object) {
        appendKey(out, stack_[k].key);
      } else {
        appendIndex(out, stack_[k].index);
      }
    }
    return out;
  }

 private:
  struct Level {
    bool object = false;
    bool expect_key = false;  // object: the next string is a key
    size_t index = 0;         // array: the element being read
    std::string key;          // object: the last key read (raw, at most kMaxKeyShown bytes)
  };
  std::vector<Level> stack_;
};

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The code unit of the \uXXXX escape at raw[i] (raw[i] == '\\'), or -1 when it is not one.
int32_t unicodeEscape(std::string_view raw, size_t i) {
  if (i + 6 > raw.size() || raw[i] != '\\' || raw[i + 1] != 'u') return -1;
  int32_t v = 0;
  for (size_t k = 2; k < 6; ++k) {
    int h = hexValue(raw[i + k]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

// What is wrong with the contents of one string literal (`raw`, between its quotes, starting at
// byte `at` of the body), or "" when nothing is.
std::string stringProblem(std::string_view raw, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(raw.data());
  const size_t n = raw.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c == '\\') {
      if (i + 1 >= n) return "";  // unterminated: a syntax error, not a text problem
      const char e = raw[i + 1];
      if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
          e == 't') {
        i += 2;
        continue;
      }
      if (e != 'u') {
        const auto ue = static_cast<unsigned char>(e);
        return "contains an invalid escape \\" +
               (ue >= 0x21 && ue < 0x7F ? std::string(1, e) : "(byte " + hexByte(ue) + ")") +
               " (JSON escapes are \\\" \\\\ \\/ \\b \\f \\n \\r \\t and \\uXXXX)";
      }
      const int32_t u = unicodeEscape(raw, i);
      if (u < 0) return "contains an invalid \\u escape (\\u must be followed by 4 hex digits)";
      if (u >= 0xD800 && u <= 0xDBFF) {
        const int32_t low = unicodeEscape(raw, i + 6);
        if (low >= 0xDC00 && low <= 0xDFFF) {
          i += 12;
          continue;
        }
      }
      if (u >= 0xD800 && u <= 0xDFFF) {
        return "contains " + std::string(raw.substr(i, 6)) +
               ", a lone UTF-16 surrogate, which is not a Unicode character (a character above "
               "U+FFFF is escaped as a high and a low surrogate together, e.g. \\ud83c\\udf31)";
      }
      i += 6;
      continue;
    }
    if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      return "contains an unescaped control character (byte " + hexByte(c) + " at offset " +
             std::to_string(at + i) + " of the body); escape it as " + esc;
    }
    if (c >= 0x80) {
      uint32_t cp = 0;
      const int len = utf8::decode(p + i, n - i, &cp);
      if (len == 0) {
        return "is not valid UTF-8 (byte " + hexByte(c) + " at offset " + std::to_string(at + i) +
               " of the body)";
      }
      i += static_cast<size_t>(len);
      continue;
    }
    ++i;
  }
  return "";
}

// What is wrong with a token that is not a string (a number or a literal), or "" when nothing
// is: JSON's number grammar, and the range simdjson parses (64-bit integers, finite doubles).
std::string scalarProblem(std::string_view t) {
  if (t == "true" || t == "false" || t == "null") return "";
  size_t i = 0;
  const size_t n = t.size();
  auto digits = [&] {
    const size_t start = i;
    while (i < n && t[i] >= '0' && t[i] <= '9') ++i;
    return i - start;
  };
  bool valid = true, integer = true;
  if (i < n && t[i] == '-') ++i;
  const size_t int_start = i;
  const size_t int_digits = digits();
  if (int_digits == 0 || (int_digits > 1 && t[int_start] == '0')) valid = false;
  if (valid && i < n && t[i] == '.') {
    ++i;
    integer = false;
    if (digits() == 0) valid = false;
  }
  if (valid && i < n && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    integer = false;
    if (i < n && (t[i] == '+' || t[i] == '-')) ++i;
    if (digits() == 0) valid = false;
  }
  if (!valid || i != n) {
    return "is not a JSON value: " + std::string(shown(t.substr(0, 32))) +
           " (numbers are written like 12, -3.5 or 1e-3; the literals are true, false and null; "
           "NaN and Infinity are not JSON)";
  }
  if (integer) {
    // simdjson reads integers in [-2^63, 2^64 - 1].
    const bool negative = t[0] == '-';
    std::string_view mag = t.substr(negative ? 1 : 0);
    std::string_view limit = negative ? "9223372036854775808" : "18446744073709551615";
    if (mag.size() > limit.size() || (mag.size() == limit.size() && mag > limit)) {
      return "is an integer outside the range -9223372036854775808 .. 18446744073709551615";
    }
    return "";
  }
  if (std::isinf(std::strtod(std::string(t).c_str(), nullptr))) {
    return "is a number too large to represent (" + std::string(shown(t.substr(0, 32))) + ")";
  }
  return "";
}

// After simdjson refused a body for a number or literal: the first such token that is wrong,
// named by its path; OK when none is found.
Status locateScalarProblem(std::string_view json) {
  PathWalker walker;
  Status found;
  walker.walk(json, [&](Token kind, size_t begin, size_t end, bool is_key) {
    if (kind != Token::kScalar) return true;
    std::string problem = scalarProblem(json.substr(begin, end - begin));
    if (problem.empty()) return true;
    std::string path = walker.path(is_key);
    // Outside any field (a body that is not JSON at all, bytes after the root): the parser's
    // message says it better.
    if (path.empty()) return true;
    found = invalidField(path, is_key ? "a key " + problem : problem);
    return false;
  });
  return found;
}

// After simdjson refused a body for its depth: the top-level field holding the deep part.
Status locateDepthProblem(std::string_view json) {
  PathWalker walker;
  Status found;
  walker.walk(json, [&](Token kind, size_t, size_t, bool) {
    if (kind != Token::kTooDeep) return true;
    const std::string path = walker.path(false, 1);
    found = invalidField(path.empty() ? "body" : path,
                         "is nested too deeply (more than " + std::to_string(kMaxWalkDepth) +
                             " levels of arrays and objects)");
    return false;
  });
  return found;
}

// After simdjson refused a body for its text: the first string literal that is not valid text,
// named by its path; OK when none is found (the caller reports the parser's error).
Status locateTextProblem(std::string_view json) {
  PathWalker walker;
  Status found;
  walker.walk(json, [&](Token kind, size_t begin, size_t end, bool is_key) {
    if (kind != Token::kString) return true;
    const size_t close = end > begin + 1 && json[end - 1] == '"' ? end - 1 : end;
    std::string problem = stringProblem(json.substr(begin + 1, close - begin - 1), begin + 1);
    if (problem.empty()) return true;
    std::string path = walker.path(is_key);
    if (is_key) {
      found = invalidField(path.empty() ? "body" : path, "an object key " + problem);
    } else {
      found = invalidField(path.empty() ? "body" : path, problem);
    }
    return false;
  });
  if (!found.isOk()) return found;
  // Not inside a string: a stray byte between values.
  const auto* p = reinterpret_cast<const unsigned char*>(json.data());
  for (size_t i = 0; i < json.size();) {
    uint32_t cp = 0;
    const int len = utf8::decode(p + i, json.size() - i, &cp);
    if (len == 0) {
      return invalidField("body", "is not valid UTF-8 (byte " + hexByte(p[i]) + " at offset " +
                                      std::to_string(i) + ")");
    }
    i += static_cast<size_t>(len);
  }
  return okStatus();
}

// --- duplicate keys: one walk over the parsed document -----------------------------------------

struct Duplicate {
  std::string key;
  // Path segments from the repeated key up to the root (appended while unwinding).
  std::vector<std::pair<std::string_view, size_t>> segments;  // (key, npos) or ("", index)
};

constexpr size_t kNoIndex = static_cast<size_t>(-1);

// The first key of `obj` (in document order) equal to an earlier one, if any.
bool repeatedKey(simdjson::dom::object obj, std::string_view* key) {
  std::vector<std::string_view> keys;
  for (auto field : obj) keys.push_back(field.key);
  const size_t n = keys.size();
  if (n < 2) return false;
  if (n <= kFewKeys) {
    for (size_t j = 1; j < n; ++j) {
      for (size_t i = 0; i < j; ++i) {
        if (keys[i] == keys[j]) {
          *key = keys[j];
          return true;
        }
      }
    }
    return false;
  }
  // Many keys: sorted (n log n whatever the keys are; a hash set could be flooded).
  std::vector<std::pair<std::string_view, size_t>> order;
  order.reserve(n);
  for (size_t i = 0; i < n; ++i) order.emplace_back(keys[i], i);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t first_repeat = kNoIndex;
  for (size_t i = 1; i < n; ++i) {
    // Stable: within a run of equal keys the second entry is the first repeat in the document.
    if (order[i].first == order[i - 1].first && (i < 2 || order[i - 2].first != order[i].first)) {
      first_repeat = std::min(first_repeat, order[i].second);
    }
  }
  if (first_repeat == kNoIndex) return false;
  *key = keys[first_repeat];
  return true;
}

bool findDuplicate(const element& e, Duplicate* d) {
  if (e.type() == element_type::OBJECT) {
    simdjson::dom::object obj = e.get_object().value_unsafe();
    std::string_view key;
    if (repeatedKey(obj, &key)) {
      d->key = std::string(key);
      d->segments.emplace_back(key, kNoIndex);
      return true;
    }
    for (auto field : obj) {
      const element_type t = field.value.type();
      if (t != element_type::OBJECT && t != element_type::ARRAY) continue;
      if (findDuplicate(field.value, d)) {
        d->segments.emplace_back(field.key, kNoIndex);
        return true;
      }
    }
    return false;
  }
  if (e.type() == element_type::ARRAY) {
    simdjson::dom::array arr = e.get_array().value_unsafe();
    size_t i = 0;
    for (element v : arr) {
      const element_type t = v.type();
      if ((t == element_type::OBJECT || t == element_type::ARRAY) && findDuplicate(v, d)) {
        d->segments.emplace_back(std::string_view(), i);
        return true;
      }
      ++i;
    }
  }
  return false;
}

Status duplicateKeyError(const Duplicate& d) {
  std::string path, object;
  for (size_t k = d.segments.size(); k-- > 0;) {
    const auto& [key, index] = d.segments[k];
    if (k == 0) object = path;  // the object holding the repeated key
    if (index == kNoIndex) {
      appendKey(path, key);
    } else {
      appendIndex(path, index);
    }
  }
  return invalidField(path, "the key \"" + std::string(shown(d.key)) +
                                "\" appears more than once in " +
                                (object.empty() ? std::string("the request body") : object) +
                                "; give each key once");
}

}  // namespace

std::string_view jsonTypeName(const element& e) {
  switch (e.type()) {
    case element_type::ARRAY:
      return "an array";
    case element_type::OBJECT:
      return "an object";
    case element_type::INT64:
    case element_type::UINT64:
      return "an integer";
    case element_type::DOUBLE:
      return "a non-integer number";
    case element_type::STRING:
      return "a string";
    case element_type::BOOL:
      return "a boolean";
    case element_type::NULL_VALUE:
      return "null";
  }
  return "an unknown type";
}

Result<element> parseJsonBody(std::string_view body, simdjson::dom::parser& parser) {
  element root;
  auto err = parser.parse(body.data(), body.size(), /*realloc_if_needed=*/true).get(root);
  if (err) {
    if (err == simdjson::UTF8_ERROR || err == simdjson::STRING_ERROR ||
        err == simdjson::UNESCAPED_CHARS) {
      RETURN_IF_ERROR(locateTextProblem(body));
    } else if (err == simdjson::NUMBER_ERROR ||
               err == simdjson::T_ATOM_ERROR || err == simdjson::F_ATOM_ERROR ||
               err == simdjson::N_ATOM_ERROR || err == simdjson::TAPE_ERROR) {
      RETURN_IF_ERROR(locateScalarProblem(body));
    } else if (err == simdjson::DEPTH_ERROR) {
      RETURN_IF_ERROR(locateDepthProblem(body));
    }
    return invalidArgument(std::string("We could not parse the JSON body of your request (") +
                           simdjson::error_message(err) + ")");
  }
  if (root.type() != element_type::OBJECT) {
    return invalidField("body", "must be a JSON object, got " + std::string(jsonTypeName(root)));
  }
  Duplicate d;
  if (findDuplicate(root, &d)) return duplicateKeyError(d);
  return root;
}

std::string jsonPathAt(std::string_view json, size_t offset) {
  PathWalker walker;
  std::string out;
  walker.walk(json, [&](Token kind, size_t begin, size_t, bool is_key) {
    if (begin < offset) return true;
    if (begin == offset && kind == Token::kString && !is_key) out = walker.path(false);
    return false;
  });
  return out;
}

}  // namespace garden::ivy
