#include "common/grammar/json_schema.h"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "common/grammar/regex.h"

namespace garden::grammar {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

constexpr int64_t kMaxItemsExpanded = 256;
constexpr int64_t kMaxLengthExpanded = 1024;
// Number digits: the integer part stays below 10^18 (exact in int64 and double parsers), the
// exponent within +-99; a model cannot loop on digits either.
constexpr int kMaxIntDigits = 18;
constexpr int kMaxFracDigits = 20;
constexpr int kMaxExpDigits = 2;

// JSON-encode s as string content (no quotes).
std::string jsonEscape(std::string_view s) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out;
}

const std::set<std::string_view>& annotations() {
  static const std::set<std::string_view> k = {
      "title",   "description", "default",   "examples",   "$schema", "$id",
      "$comment", "deprecated", "readOnly",  "writeOnly",  "$defs",   "definitions"};
  return k;
}

const std::set<std::string_view>& supported() {
  static const std::set<std::string_view> k = {
      "type",      "enum",      "const",    "properties", "required",  "additionalProperties",
      "items",     "minItems",  "maxItems", "anyOf",      "oneOf",     "allOf",
      "$ref",      "pattern",   "format",   "minLength",  "maxLength", "nullable",
      "minimum",   "maximum",   "exclusiveMinimum", "exclusiveMaximum"};
  return k;
}

std::string formatPattern(std::string_view format) {
  static const std::string date = "\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])";
  static const std::string time =
      "([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d+)?(Z|z|[+-]([01]\\d|2[0-3]):[0-5]\\d)";
  if (format == "date") return "^" + date + "$";
  if (format == "time") return "^" + time + "$";
  if (format == "date-time") return "^" + date + "[Tt]" + time + "$";
  if (format == "uuid") {
    return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
  }
  if (format == "email") {
    return "^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)*\\.[A-Za-z]{2,}$";
  }
  if (format == "ipv4") {
    static const std::string o = "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
    return "^" + o + "\\." + o + "\\." + o + "\\." + o + "$";
  }
  return {};
}

class SchemaCompiler {
 public:
  SchemaCompiler(const JsonSchemaOptions& o, element root) : opt_(o), root_(root) {}

  Result<int32_t> value(element s, const std::string& path);
  Result<int32_t> objectAny();
  GrammarBuilder& builder() { return b_; }

 private:
  Status err(const std::string& path, const std::string& what) const {
    return invalidArgument("schema " + (path.empty() ? std::string("#") : "#" + path) + ": " +
                           what);
  }
  int32_t ws(int32_t from) {
    const int32_t r = b_.ruleOfState(from);
    const int32_t to = b_.addState(r);
    b_.addEpsilon(from, to);
    int32_t cur = from;
    for (int32_t i = 0; i < opt_.max_whitespace; ++i) {
      const int32_t next = b_.addState(r);
      for (char c : opt_.whitespace) {
        b_.addBytes(cur, static_cast<uint8_t>(c), static_cast<uint8_t>(c), next);
      }
      b_.addEpsilon(next, to);
      cur = next;
    }
    return to;
  }
  int32_t call(int32_t from, int32_t rule) {
    const int32_t to = b_.addState(b_.ruleOfState(from));
    b_.addCall(from, rule, to);
    return to;
  }
  int32_t lit(int32_t from, std::string_view s) { return b_.literal(from, s); }
  int32_t finalState(int32_t rule) {
    const int32_t s = b_.addState(rule);
    b_.setFinal(s);
    return s;
  }
  // A rule made of alternatives of literals (enum, const, true/false/null).
  int32_t literalsRule(const std::string& name, const std::vector<std::string>& texts) {
    const int32_t r = b_.addRule(name);
    const int32_t end = finalState(r);
    for (const auto& t : texts) b_.addEpsilon(lit(b_.start(r), t), end);
    return r;
  }

  int32_t stringRule();
  int32_t numberRule(bool integer);
  // Numbers with minimum / maximum / exclusiveMinimum / exclusiveMaximum [TAG_NUMBER_RANGE].
  Result<int32_t> numberTyped(element s, bool integer, const std::string& path);
  int32_t anyRule();
  int32_t arrayAny();
  Result<int32_t> stringTyped(element s, const std::string& path);
  Result<int32_t> objectTyped(element s, const std::string& path);
  Result<int32_t> arrayTyped(element s, const std::string& path);
  Result<int32_t> typed(element s, std::string_view type, const std::string& path);
  Result<int32_t> extraKeyRule(const std::vector<std::string>& declared);
  Result<int32_t> ref(std::string_view ref, const std::string& path);

  const JsonSchemaOptions& opt_;
  element root_;
  GrammarBuilder b_;
  std::map<std::string, int32_t> cache_;      // minified schema -> rule
  std::map<std::string, int32_t> ref_rules_;  // $ref -> rule
  std::vector<std::unique_ptr<simdjson::dom::parser>> parsers_;  // keep derived schemas alive
  int32_t string_ = -1, number_ = -1, integer_ = -1, any_ = -1, object_any_ = -1,
          array_any_ = -1;
};

int32_t SchemaCompiler::stringRule() {
  if (string_ >= 0) return string_;
  string_ = b_.addRule("string");
  const int32_t open = lit(b_.start(string_), "\"");
  addJsonChar(b_, open, open);
  b_.addEpsilon(lit(open, "\""), finalState(string_));
  return string_;
}

// `count` copies of [lo-hi] after `from`, each optional after the first `min` (a bounded run).
int32_t boundedDigits(GrammarBuilder& b, int32_t from, int min, int count, uint8_t lo = '0',
                      uint8_t hi = '9') {
  const int32_t r = b.ruleOfState(from);
  const int32_t to = b.addState(r);
  int32_t cur = from;
  for (int i = 0; i < count; ++i) {
    if (i >= min) b.addEpsilon(cur, to);
    const int32_t next = b.addState(r);
    b.addBytes(cur, lo, hi, next);
    cur = next;
  }
  b.addEpsilon(cur, to);
  return to;
}

int32_t SchemaCompiler::numberRule(bool integer) {
  int32_t& slot = integer ? integer_ : number_;
  if (slot >= 0) return slot;
  const int32_t r = b_.addRule(integer ? "integer" : "number");
  slot = r;
  const int32_t s0 = b_.start(r);
  const int32_t sign = b_.addState(r);
  b_.addBytes(s0, '-', '-', sign);
  b_.addEpsilon(s0, sign);
  const int32_t intp = b_.addState(r);
  b_.addBytes(sign, '0', '0', intp);
  const int32_t lead = b_.addState(r);
  b_.addBytes(sign, '1', '9', lead);
  b_.addEpsilon(boundedDigits(b_, lead, 0, kMaxIntDigits - 1), intp);
  const int32_t end = finalState(r);
  if (integer) {
    b_.addEpsilon(intp, end);
    return r;
  }
  const int32_t frac_dot = b_.addState(r), after_frac = b_.addState(r);
  b_.addBytes(intp, '.', '.', frac_dot);
  b_.addEpsilon(boundedDigits(b_, frac_dot, 1, kMaxFracDigits), after_frac);
  b_.addEpsilon(intp, after_frac);
  const int32_t e = b_.addState(r), esign = b_.addState(r);
  b_.addBytes(after_frac, 'e', 'e', e);
  b_.addBytes(after_frac, 'E', 'E', e);
  b_.addBytes(e, '+', '+', esign);
  b_.addBytes(e, '-', '-', esign);
  b_.addEpsilon(e, esign);
  b_.addEpsilon(boundedDigits(b_, esign, 1, kMaxExpDigits), end);
  b_.addEpsilon(after_frac, end);
  return r;
}

// [TAG_NUMBER_RANGE] Decimal texts (no sign, no leading zeros) of the integers in [a, b], from
// `from` to `to`; the classic split of a range into prefix + one digit class + any digits.
namespace {

int32_t stepBytes(GrammarBuilder& b, int32_t from, char lo, char hi) {
  const int32_t to = b.addState(b.ruleOfState(from));
  b.addBytes(from, static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), to);
  return to;
}

// x <= y, digit strings of one length (inner positions may be '0').
void sameLengthRange(GrammarBuilder& b, int32_t from, const std::string& x, const std::string& y,
                     int32_t to) {
  size_t i = 0;
  int32_t cur = from;
  while (i < x.size() && x[i] == y[i]) cur = stepBytes(b, cur, x[i], x[i]), ++i;
  if (i == x.size()) {
    b.addEpsilon(cur, to);
    return;
  }
  const size_t rest = x.size() - i - 1;
  const std::string xr = x.substr(i + 1), yr = y.substr(i + 1);
  char lo = x[i], hi = y[i];
  if (xr != std::string(rest, '0')) {  // x[i] followed by xr .. 99..9
    sameLengthRange(b, stepBytes(b, cur, x[i], x[i]), xr, std::string(rest, '9'), to);
    ++lo;
  }
  if (yr != std::string(rest, '9')) {  // y[i] followed by 00..0 .. yr
    sameLengthRange(b, stepBytes(b, cur, y[i], y[i]), std::string(rest, '0'), yr, to);
    --hi;
  }
  if (lo > hi) return;
  int32_t s = stepBytes(b, cur, lo, hi);
  for (size_t k = 0; k < rest; ++k) s = stepBytes(b, s, '0', '9');
  b.addEpsilon(s, to);
}

void unsignedRange(GrammarBuilder& b, int32_t from, uint64_t a, uint64_t hi, int32_t to) {
  if (a > hi) return;
  uint64_t first = 0, last = 9;  // the integers of `len` digits
  for (int len = 1; len <= kMaxIntDigits; ++len) {
    const uint64_t x = std::max(a, first), y = std::min(hi, last);
    if (x <= y) {
      std::string xs = std::to_string(x), ys = std::to_string(y);
      sameLengthRange(b, from, xs, ys, to);
    }
    first = last + 1;
    last = last * 10 + 9;
  }
}

constexpr int64_t kMaxRangeInt = 999'999'999'999'999'999;  // kMaxIntDigits digits

// Signed integer texts in [lo, hi] (JSON: "-" only before a non-zero magnitude).
void signedRange(GrammarBuilder& b, int32_t from, int64_t lo, int64_t hi, int32_t to) {
  if (lo > hi) return;
  if (hi >= 0) unsignedRange(b, from, static_cast<uint64_t>(std::max<int64_t>(lo, 0)), hi, to);
  if (lo < 0) {
    const int32_t minus = stepBytes(b, from, '-', '-');
    unsignedRange(b, minus, static_cast<uint64_t>(hi < 0 ? -hi : 1), static_cast<uint64_t>(-lo),
                  to);
  }
}

// floor / ceil of a bound, clamped to what the grammar writes anyway.
int64_t clampedFloor(double v) {
  return static_cast<int64_t>(std::clamp(std::floor(v), -1e18, 1e18));
}
int64_t clampedCeil(double v) { return static_cast<int64_t>(std::clamp(std::ceil(v), -1e18, 1e18)); }

}  // namespace

Result<int32_t> SchemaCompiler::numberTyped(element s, bool integer, const std::string& path) {
  // Bounds as doubles; absent = unbounded. Draft 4's boolean exclusive forms are refused.
  std::optional<double> min, max, xmin, xmax;
  for (auto [kw, dst] : {std::pair{"minimum", &min}, std::pair{"maximum", &max},
                         std::pair{"exclusiveMinimum", &xmin}, std::pair{"exclusiveMaximum", &xmax}}) {
    element v;
    if (s[kw].get(v)) continue;
    double d;
    if (v.is_bool()) {
      return err(path, "'" + std::string(kw) +
                           "' must be a number (draft 4's boolean form is not supported)");
    }
    if (v.get_double().get(d) || !std::isfinite(d))
      return err(path, "'" + std::string(kw) + "' must be a number");
    *dst = d;
  }
  if (!min && !max && !xmin && !xmax) return numberRule(integer);
  // The integers in range: [ilo, ihi].
  int64_t ilo = -kMaxRangeInt, ihi = kMaxRangeInt;
  if (min) ilo = std::max(ilo, clampedCeil(*min));
  if (xmin) ilo = std::max(ilo, clampedFloor(*xmin) + 1);
  if (max) ihi = std::min(ihi, clampedFloor(*max));
  if (xmax) ihi = std::min(ihi, clampedCeil(*xmax) - 1);
  // Numbers with a fraction, written as I.F (I >= 0) or -I.F, F one to kMaxFracDigits digits, no
  // exponent. I.F spans [I, I + 1) and -I.F spans (-(I + 1), -I], so a whole span inside the
  // bounds is allowed: a subset of the range (e.g. [0.5, 0.9] has no such span and no integer)
  // that every value of it validates against.
  int64_t plo = std::max<int64_t>(ilo, 0), phi = kMaxRangeInt;  // I.F
  if (max) phi = std::min(phi, clampedFloor(*max) - 1);
  if (xmax) phi = std::min(phi, clampedFloor(*xmax) - 1);
  int64_t nlo = 0, nhi = kMaxRangeInt;  // -I.F
  if (max) nlo = std::max(nlo, clampedCeil(-*max));
  if (xmax) nlo = std::max(nlo, clampedFloor(-*xmax) + 1);
  if (min) nhi = std::min(nhi, clampedFloor(-*min) - 1);
  if (xmin) nhi = std::min(nhi, clampedFloor(-*xmin) - 1);
  const bool ints = ilo <= ihi, pos = !integer && plo <= phi, neg = !integer && nlo <= nhi;
  // Next to an exclusive integral bound the open span (a fraction not all zeros): 0.F for
  // exclusiveMinimum 0, -3.F for exclusiveMaximum -3.
  const int64_t pe = xmin ? clampedFloor(*xmin) : -1, ne = xmax ? -clampedCeil(*xmax) : -1;
  const bool pos_edge = !integer && xmin && *xmin == std::floor(*xmin) && pe >= 0 && pe <= phi &&
                        (!min || *min <= *xmin);
  const bool neg_edge = !integer && xmax && *xmax == std::floor(*xmax) && ne >= 0 && ne <= nhi &&
                        (!max || *max >= *xmax);
  if (!ints && !pos && !neg && !pos_edge && !neg_edge) {
    return err(path, integer ? "the bounds leave no integer"
                             : "the bounds leave no number the grammar can write (it writes "
                               "integers and I.F / -I.F whose whole span [I, I + 1) fits)");
  }
  const int32_t r = b_.addRule((integer ? "integer" : "number") + path);
  const int32_t end = finalState(r);
  const int32_t s0 = b_.start(r);
  if (ints) signedRange(b_, s0, ilo, ihi, end);
  auto fraction = [&](int32_t from, int64_t lo, int64_t hi) {
    const int32_t intp = b_.addState(r);
    unsignedRange(b_, from, static_cast<uint64_t>(lo), static_cast<uint64_t>(hi), intp);
    b_.addEpsilon(boundedDigits(b_, stepBytes(b_, intp, '.', '.'), 1, kMaxFracDigits), end);
  };
  if (pos) fraction(s0, plo, phi);
  if (neg) fraction(stepBytes(b_, s0, '-', '-'), nlo, nhi);
  auto open_span = [&](int32_t from, int64_t whole) {
    const int32_t intp = b_.addState(r);
    unsignedRange(b_, from, static_cast<uint64_t>(whole), static_cast<uint64_t>(whole), intp);
    // Up to 10 zeros, a non-zero digit, up to 9 more digits (within kMaxFracDigits).
    const int32_t zeros = boundedDigits(b_, stepBytes(b_, intp, '.', '.'), 0, 10, '0', '0');
    b_.addEpsilon(boundedDigits(b_, stepBytes(b_, zeros, '1', '9'), 0, 9), end);
  };
  if (pos_edge) open_span(s0, pe);
  if (neg_edge) open_span(stepBytes(b_, s0, '-', '-'), ne);
  return r;
}

int32_t SchemaCompiler::anyRule() {
  if (any_ >= 0) return any_;
  any_ = b_.addRule("any");
  const int32_t s = b_.start(any_);
  const int32_t end = finalState(any_);
  const int32_t obj = objectAny().value();
  b_.addEpsilon(call(s, obj), end);
  b_.addEpsilon(call(s, arrayAny()), end);
  b_.addEpsilon(call(s, stringRule()), end);
  b_.addEpsilon(call(s, numberRule(false)), end);
  b_.addEpsilon(lit(s, "true"), end);
  b_.addEpsilon(lit(s, "false"), end);
  b_.addEpsilon(lit(s, "null"), end);
  return any_;
}

Result<int32_t> SchemaCompiler::objectAny() {
  if (object_any_ >= 0) return object_any_;
  const int32_t r = b_.addRule("object");
  object_any_ = r;
  const int32_t end = finalState(r);
  const int32_t open = ws(lit(b_.start(r), "{"));
  b_.addEpsilon(lit(open, "}"), end);
  // member: key ws ':' ws value ws
  auto member = [&](int32_t from) {
    int32_t s = ws(call(from, stringRule()));
    s = ws(lit(s, ":"));
    return ws(call(s, anyRule()));
  };
  const int32_t after = member(open);
  b_.addEpsilon(lit(after, "}"), end);
  const int32_t again = member(ws(lit(after, ",")));
  b_.addEpsilon(again, after);
  return r;
}

int32_t SchemaCompiler::arrayAny() {
  if (array_any_ >= 0) return array_any_;
  const int32_t r = b_.addRule("array");
  array_any_ = r;
  const int32_t end = finalState(r);
  const int32_t open = ws(lit(b_.start(r), "["));
  b_.addEpsilon(lit(open, "]"), end);
  const int32_t after = ws(call(open, anyRule()));
  b_.addEpsilon(lit(after, "]"), end);
  b_.addEpsilon(ws(call(ws(lit(after, ",")), anyRule())), after);
  return r;
}

Result<int32_t> SchemaCompiler::stringTyped(element s, const std::string& path) {
  std::string_view pattern, format;
  const bool has_pattern = !s["pattern"].get(pattern);
  if (s["pattern"].error() == simdjson::SUCCESS && !has_pattern) {
    return err(path, "'pattern' must be a string");
  }
  std::string fpat;
  if (!s["format"].get(format)) fpat = formatPattern(format);
  int64_t min_len = 0, max_len = -1;
  if (s["minLength"].error() == simdjson::SUCCESS) {
    if (s["minLength"].get(min_len) || min_len < 0) {
      return err(path, "'minLength' must be a non-negative integer");
    }
  }
  if (s["maxLength"].error() == simdjson::SUCCESS) {
    if (s["maxLength"].get(max_len) || max_len < 0) {
      return err(path, "'maxLength' must be a non-negative integer");
    }
  }
  const bool lengths = min_len > 0 || max_len >= 0;
  if (!has_pattern && fpat.empty() && !lengths) return stringRule();
  if ((has_pattern || !fpat.empty()) && lengths) {
    return err(path, "'minLength'/'maxLength' together with 'pattern' or 'format' is not supported");
  }
  if (has_pattern && !fpat.empty()) {
    return err(path, "'pattern' together with 'format' is not supported");
  }
  const int32_t r = b_.addRule("string" + path);
  const int32_t open = lit(b_.start(r), "\"");
  int32_t close_from;
  if (lengths) {
    if (max_len >= 0 && max_len < min_len) return err(path, "'maxLength' < 'minLength'");
    const int64_t limit = max_len >= 0 ? max_len : min_len;
    if (limit > kMaxLengthExpanded) {
      return err(path, "'minLength'/'maxLength' above " + std::to_string(kMaxLengthExpanded) +
                           " is not supported");
    }
    close_from = b_.addState(r);
    int32_t cur = open;
    for (int64_t k = 0;; ++k) {
      if (k >= min_len) b_.addEpsilon(cur, close_from);
      if (k == limit) break;
      const int32_t next = b_.addState(r);
      addJsonChar(b_, cur, next);
      cur = next;
    }
    if (max_len < 0) addJsonChar(b_, cur, cur);
  } else {
    auto end = addPattern(b_, open, has_pattern ? pattern : std::string_view(fpat));
    if (!end.isOk()) return err(path, end.status().message());
    close_from = *end;
  }
  b_.addEpsilon(lit(close_from, "\""), finalState(r));
  return r;
}

Result<int32_t> SchemaCompiler::extraKeyRule(const std::vector<std::string>& declared) {
  // Any key except the declared ones: a trie of their plain-ASCII spellings; a byte off the trie
  // (or any non-plain character) leaves it for good.
  const int32_t r = b_.addRule("extra_key");
  const int32_t open = lit(b_.start(r), "\"");
  const int32_t end = finalState(r);
  const int32_t free_state = b_.addState(r);
  addJsonChar(b_, free_state, free_state);
  b_.addEpsilon(lit(free_state, "\""), end);
  struct TrieNode {
    std::map<uint8_t, int> kids;
    bool terminal = false;
    bool cut = false;  // a declared key continues with a byte the trie does not model
  };
  std::vector<TrieNode> trie(1);
  for (const auto& name : declared) {
    int n = 0;
    for (char ch : name) {
      const auto c = static_cast<uint8_t>(ch);
      if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
        trie[static_cast<size_t>(n)].cut = true;
        n = -1;
        break;
      }
      auto it = trie[static_cast<size_t>(n)].kids.find(c);
      if (it == trie[static_cast<size_t>(n)].kids.end()) {
        trie.push_back({});
        const int id = static_cast<int>(trie.size() - 1);
        trie[static_cast<size_t>(n)].kids[c] = id;
        n = id;
      } else {
        n = it->second;
      }
    }
    if (n >= 0) trie[static_cast<size_t>(n)].terminal = true;
  }
  std::vector<int32_t> st(trie.size());
  st[0] = open;
  for (size_t i = 1; i < trie.size(); ++i) st[i] = b_.addState(r);
  for (size_t i = 0; i < trie.size(); ++i) {
    const auto& t = trie[i];
    CharClass other;
    for (int c = 0x20; c < 0x7f; ++c) {
      if (c != '"' && c != '\\' && !t.kids.count(static_cast<uint8_t>(c))) {
        other.ascii.set(static_cast<size_t>(c));
      }
    }
    other.non_ascii = true;
    addCharClass(b_, st[i], free_state, other);
    // escapes leave the trie
    const int32_t esc_to = b_.addState(r);
    CharClass escaped;
    escaped.ascii.set('"');
    escaped.ascii.set('\\');
    addCharClass(b_, st[i], esc_to, escaped);
    b_.addEpsilon(esc_to, free_state);
    for (const auto& [c, kid] : t.kids) b_.addBytes(st[i], c, c, st[static_cast<size_t>(kid)]);
    if (!t.terminal) b_.addEpsilon(lit(st[i], "\""), end);
  }
  return r;
}

Result<int32_t> SchemaCompiler::objectTyped(element s, const std::string& path) {
  simdjson::dom::object props;
  const bool has_props = s["properties"].error() == simdjson::SUCCESS;
  if (has_props && s["properties"].get(props)) return err(path, "'properties' must be an object");
  std::set<std::string> required;
  std::vector<std::string> required_order;
  if (s["required"].error() == simdjson::SUCCESS) {
    simdjson::dom::array req;
    if (s["required"].get(req)) return err(path, "'required' must be an array of strings");
    for (auto x : req) {
      std::string_view k;
      if (x.get(k)) return err(path, "'required' must be an array of strings");
      if (required.insert(std::string(k)).second) required_order.emplace_back(k);
    }
  }
  // additionalProperties: absent/true -> any; false -> none; a schema -> its values.
  int32_t extra_value = -1;
  bool extra = true;
  if (s["additionalProperties"].error() == simdjson::SUCCESS) {
    element ap = s["additionalProperties"].value_unsafe();
    bool b;
    if (!ap.get(b)) {
      extra = b;
    } else if (ap.type() == element_type::OBJECT) {
      ASSIGN_OR_RETURN(extra_value, value(ap, path + "/additionalProperties"));
    } else {
      return err(path, "'additionalProperties' must be a boolean or a schema");
    }
  }
  struct Prop {
    std::string name;
    int32_t rule;
    bool required;
  };
  std::vector<Prop> list;
  std::set<std::string> declared;
  if (has_props) {
    for (auto [key, sub] : props) {
      std::string k(key);
      ASSIGN_OR_RETURN(int32_t rule, value(sub, path + "/properties/" + k));
      declared.insert(k);
      list.push_back({k, rule, required.count(k) > 0});
    }
  }
  for (const auto& k : required_order) {
    if (!declared.count(k)) {
      if (!extra) {
        return err(path, "required property '" + k +
                             "' is not in 'properties' and additionalProperties is false");
      }
      list.push_back({k, extra_value >= 0 ? extra_value : anyRule(), true});
      declared.insert(k);
    }
  }
  if (list.empty() && extra && extra_value < 0) return objectAny();

  const int32_t r = b_.addRule("object" + path);
  const int32_t end = finalState(r);
  const int32_t open = ws(lit(b_.start(r), "{"));
  const size_t n = list.size();
  // first[i]: nothing written yet, next candidate property i; later[i]: something written.
  std::vector<int32_t> first(n + 1), later(n + 1);
  first[0] = open;
  later[0] = b_.addState(r);  // unreachable: nothing can have been written before property 0
  for (size_t i = 1; i <= n; ++i) {
    first[i] = b_.addState(r);
    later[i] = b_.addState(r);
  }
  auto member = [&](int32_t from, const std::string& key, int32_t rule) {
    int32_t x = ws(lit(from, "\"" + jsonEscape(key) + "\""));
    x = ws(lit(x, ":"));
    return ws(call(x, rule));
  };
  for (size_t i = 0; i < n; ++i) {
    b_.addEpsilon(member(first[i], list[i].name, list[i].rule), later[i + 1]);
    b_.addEpsilon(member(ws(lit(later[i], ",")), list[i].name, list[i].rule), later[i + 1]);
    if (!list[i].required) {
      b_.addEpsilon(first[i], first[i + 1]);
      b_.addEpsilon(later[i], later[i + 1]);
    }
  }
  b_.addEpsilon(lit(first[n], "}"), end);
  b_.addEpsilon(lit(later[n], "}"), end);
  if (extra) {
    std::vector<std::string> names;
    for (const auto& p : list) names.push_back(jsonEscape(p.name));
    ASSIGN_OR_RETURN(int32_t key_rule, extraKeyRule(names));
    const int32_t vrule = extra_value >= 0 ? extra_value : anyRule();
    auto extraMember = [&](int32_t from) {
      int32_t x = ws(call(from, key_rule));
      x = ws(lit(x, ":"));
      return ws(call(x, vrule));
    };
    b_.addEpsilon(extraMember(first[n]), later[n]);
    b_.addEpsilon(extraMember(ws(lit(later[n], ","))), later[n]);
  }
  return r;
}

Result<int32_t> SchemaCompiler::arrayTyped(element s, const std::string& path) {
  int64_t lo = 0, hi = -1;
  if (s["minItems"].error() == simdjson::SUCCESS && (s["minItems"].get(lo) || lo < 0)) {
    return err(path, "'minItems' must be a non-negative integer");
  }
  if (s["maxItems"].error() == simdjson::SUCCESS && (s["maxItems"].get(hi) || hi < 0)) {
    return err(path, "'maxItems' must be a non-negative integer");
  }
  if (hi >= 0 && hi < lo) return err(path, "'maxItems' < 'minItems'");
  int32_t item;
  if (s["items"].error() == simdjson::SUCCESS) {
    element it = s["items"].value_unsafe();
    bool b;
    if (!it.get(b)) {
      if (!b) {
        if (lo > 0) return err(path, "'items': false with minItems > 0 accepts nothing");
        hi = 0;
      }
      item = anyRule();
    } else if (it.type() == element_type::OBJECT) {
      ASSIGN_OR_RETURN(item, value(it, path + "/items"));
    } else {
      return err(path, "'items' must be a schema (tuple form is not supported)");
    }
  } else {
    item = anyRule();
  }
  const int64_t limit = hi >= 0 ? hi : std::max<int64_t>(lo, 1);
  if (limit > kMaxItemsExpanded) {
    return err(path, "'minItems'/'maxItems' above " + std::to_string(kMaxItemsExpanded) +
                         " is not supported");
  }
  if (lo == 0 && hi < 0 && item == any_) return arrayAny();
  const int32_t r = b_.addRule("array" + path);
  const int32_t end = finalState(r);
  int32_t cur = ws(lit(b_.start(r), "["));
  for (int64_t k = 0;; ++k) {
    if (k >= lo) b_.addEpsilon(lit(cur, "]"), end);
    if (k == limit) break;
    const int32_t from = k == 0 ? cur : ws(lit(cur, ","));
    cur = ws(call(from, item));
  }
  if (hi < 0) b_.addEpsilon(ws(call(ws(lit(cur, ",")), item)), cur);
  return r;
}

Result<int32_t> SchemaCompiler::typed(element s, std::string_view type, const std::string& path) {
  if (type == "string") return stringTyped(s, path);
  if (type == "number") return numberTyped(s, false, path);
  if (type == "integer") return numberTyped(s, true, path);
  if (type == "boolean") return literalsRule("boolean", {"true", "false"});
  if (type == "null") return literalsRule("null", {"null"});
  if (type == "object") return objectTyped(s, path);
  if (type == "array") return arrayTyped(s, path);
  return err(path, "unknown type '" + std::string(type) + "'");
}

Result<int32_t> SchemaCompiler::ref(std::string_view ref, const std::string& path) {
  std::string key(ref);
  auto it = ref_rules_.find(key);
  if (it != ref_rules_.end()) return it->second;
  if (ref.empty() || ref[0] != '#') {
    return err(path, "'$ref' " + key + " is not local (only '#...' refs are supported)");
  }
  element target;
  if (ref.size() == 1) {
    target = root_;
  } else if (root_.at_pointer(ref.substr(1)).get(target)) {
    return err(path, "'$ref' " + key + " does not resolve");
  }
  // The rule exists before its body so recursive refs find it.
  const int32_t r = b_.addRule("ref:" + key);
  ref_rules_[key] = r;
  ASSIGN_OR_RETURN(int32_t body, value(target, std::string(ref.substr(1))));
  b_.addEpsilon(call(b_.start(r), body), finalState(r));
  return r;
}

Result<int32_t> SchemaCompiler::value(element s, const std::string& path) {
  bool bv;
  if (!s.get(bv)) {
    if (!bv) return err(path, "schema 'false' accepts nothing");
    return anyRule();
  }
  simdjson::dom::object obj;
  if (s.get(obj)) return err(path, "a schema must be an object or a boolean");
  for (auto [key, v] : obj) {
    (void)v;
    if (!supported().count(key) && !annotations().count(key)) {
      return err(path, "unsupported keyword '" + std::string(key) + "'");
    }
  }
  const std::string text = simdjson::minify(s);
  if (auto it = cache_.find(text); it != cache_.end()) return it->second;
  auto remember = [&](Result<int32_t> r) -> Result<int32_t> {
    if (r.isOk()) cache_[text] = *r;
    return r;
  };
  auto onlyWith = [&](std::string_view kw, std::initializer_list<std::string_view> also) -> Status {
    for (auto [key, v] : obj) {
      (void)v;
      if (key == kw || annotations().count(key)) continue;
      bool ok = false;
      for (auto a : also) ok = ok || key == a;
      if (!ok) {
        return err(path, "'" + std::string(key) + "' next to '" + std::string(kw) +
                             "' is not supported");
      }
    }
    return okStatus();
  };
  bool nullable = false;
  if (s["nullable"].error() == simdjson::SUCCESS && (s["nullable"].get(nullable))) {
    return err(path, "'nullable' must be a boolean");
  }
  if (nullable) {
    // anyOf [null, the schema without nullable]
    std::string inner = "{";
    bool firstk = true;
    for (auto [key, v] : obj) {
      if (key == "nullable") continue;
      if (!firstk) inner += ",";
      firstk = false;
      inner += "\"" + jsonEscape(key) + "\":" + simdjson::minify(v);
    }
    inner += "}";
    // Parse the copy with its own parser kept alive for the compile.
    parsers_.push_back(std::make_unique<simdjson::dom::parser>());
    element copy;
    if (parsers_.back()->parse(inner).get(copy)) return err(path, "internal: nullable copy");
    ASSIGN_OR_RETURN(int32_t base, value(copy, path));
    const int32_t r = b_.addRule("nullable" + path);
    const int32_t end = finalState(r);
    b_.addEpsilon(call(b_.start(r), base), end);
    b_.addEpsilon(lit(b_.start(r), "null"), end);
    return remember(r);
  }
  std::string_view ref_text;
  if (s["$ref"].error() == simdjson::SUCCESS) {
    if (s["$ref"].get(ref_text)) return err(path, "'$ref' must be a string");
    RETURN_IF_ERROR(onlyWith("$ref", {}));
    return remember(ref(ref_text, path));
  }
  for (std::string_view kw : {"anyOf", "oneOf"}) {
    if (s[kw].error() != simdjson::SUCCESS) continue;
    simdjson::dom::array alts;
    if (s[kw].get(alts) || alts.size() == 0) {
      return err(path, "'" + std::string(kw) + "' must be a non-empty array");
    }
    RETURN_IF_ERROR(onlyWith(kw, {}));
    const int32_t r = b_.addRule(std::string(kw) + path);
    const int32_t end = finalState(r);
    size_t i = 0;
    for (auto a : alts) {
      ASSIGN_OR_RETURN(int32_t alt, value(a, path + "/" + std::string(kw) + "/" + std::to_string(i++)));
      b_.addEpsilon(call(b_.start(r), alt), end);
    }
    return remember(r);
  }
  if (s["allOf"].error() == simdjson::SUCCESS) {
    simdjson::dom::array all;
    if (s["allOf"].get(all) || all.size() != 1) {
      return err(path, "'allOf' is supported with exactly one member");
    }
    RETURN_IF_ERROR(onlyWith("allOf", {}));
    return remember(value(all.at(0).value_unsafe(), path + "/allOf/0"));
  }
  if (s["enum"].error() == simdjson::SUCCESS || s["const"].error() == simdjson::SUCCESS) {
    std::vector<std::string> texts;
    simdjson::dom::array vals;
    if (s["enum"].error() == simdjson::SUCCESS) {
      if (s["enum"].get(vals) || vals.size() == 0) {
        return err(path, "'enum' must be a non-empty array");
      }
      for (auto v : vals) texts.push_back(simdjson::minify(v));
    }
    if (s["const"].error() == simdjson::SUCCESS) {
      const std::string c = simdjson::minify(s["const"].value_unsafe());
      if (!texts.empty() && std::find(texts.begin(), texts.end(), c) == texts.end()) {
        return err(path, "'const' is not one of 'enum'");
      }
      texts = {c};
    }
    return remember(literalsRule("enum" + path, texts));
  }
  std::vector<std::string_view> types;
  if (s["type"].error() == simdjson::SUCCESS) {
    std::string_view t;
    simdjson::dom::array ts;
    if (!s["type"].get(t)) {
      types.push_back(t);
    } else if (!s["type"].get(ts)) {
      for (auto x : ts) {
        if (x.get(t)) return err(path, "'type' must be a string or an array of strings");
        types.push_back(t);
      }
      if (types.empty()) return err(path, "'type' is an empty array");
    } else {
      return err(path, "'type' must be a string or an array of strings");
    }
  } else {
    // Untyped: infer from the keywords present, else any value.
    auto has = [&](const char* k) { return s[k].error() == simdjson::SUCCESS; };
    if (has("properties") || has("required") || has("additionalProperties")) {
      types.push_back("object");
    } else if (has("items") || has("minItems") || has("maxItems")) {
      types.push_back("array");
    } else if (has("pattern") || has("format") || has("minLength") || has("maxLength")) {
      types.push_back("string");
    } else if (has("minimum") || has("maximum") || has("exclusiveMinimum") ||
               has("exclusiveMaximum")) {
      types.push_back("number");
    } else {
      return remember(anyRule());
    }
  }
  if (types.size() == 1) return remember(typed(s, types[0], path));
  const int32_t r = b_.addRule("types" + path);
  const int32_t end = finalState(r);
  for (auto t : types) {
    ASSIGN_OR_RETURN(int32_t alt, typed(s, t, path));
    b_.addEpsilon(call(b_.start(r), alt), end);
  }
  return remember(r);
}

Status checkOptions(const JsonSchemaOptions& o) {
  if (o.max_whitespace < 0 || o.max_whitespace > 64) {
    return invalidArgument("max_whitespace must be 0..64");
  }
  for (char c : o.whitespace) {
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
      return invalidArgument("whitespace may only hold ' ', '\\t', '\\n', '\\r'");
    }
  }
  return okStatus();
}

}  // namespace

Result<Grammar> jsonSchemaGrammar(std::string_view schema_json, const JsonSchemaOptions& options) {
  RETURN_IF_ERROR(checkOptions(options));
  simdjson::dom::parser parser;
  element root;
  if (auto e = parser.parse(schema_json.data(), schema_json.size()).get(root)) {
    return invalidArgument(std::string("schema is not valid JSON (") +
                           simdjson::error_message(e) + ")");
  }
  SchemaCompiler c(options, root);
  ASSIGN_OR_RETURN(int32_t r, c.value(root, ""));
  return c.builder().build(r);
}

Result<Grammar> jsonObjectGrammar(const JsonSchemaOptions& options) {
  RETURN_IF_ERROR(checkOptions(options));
  simdjson::dom::parser parser;
  element root;
  if (parser.parse(std::string_view("{}")).get(root)) return internalError("grammar: json parser");
  SchemaCompiler c(options, root);
  ASSIGN_OR_RETURN(int32_t r, c.objectAny());
  return c.builder().build(r);
}

}  // namespace garden::grammar
