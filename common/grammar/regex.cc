#include "common/grammar/regex.h"

#include <string>
#include <vector>

namespace garden::grammar {

CharClass CharClass::any() {
  CharClass c;
  c.ascii.set();
  c.non_ascii = true;
  return c;
}

void addUtf8NonAscii(GrammarBuilder& b, int32_t from, int32_t to) {
  const int32_t r = b.ruleOfState(from);
  const int32_t c1 = b.addState(r), c2 = b.addState(r), c3 = b.addState(r);
  b.addBytes(c1, 0x80, 0xBF, to);
  b.addBytes(c2, 0x80, 0xBF, c1);
  b.addBytes(c3, 0x80, 0xBF, c2);
  const int32_t e0 = b.addState(r), ed = b.addState(r), f0 = b.addState(r), f4 = b.addState(r);
  b.addBytes(from, 0xC2, 0xDF, c1);
  b.addBytes(from, 0xE0, 0xE0, e0);
  b.addBytes(e0, 0xA0, 0xBF, c1);
  b.addBytes(from, 0xE1, 0xEC, c2);
  b.addBytes(from, 0xED, 0xED, ed);
  b.addBytes(ed, 0x80, 0x9F, c1);
  b.addBytes(from, 0xEE, 0xEF, c2);
  b.addBytes(from, 0xF0, 0xF0, f0);
  b.addBytes(f0, 0x90, 0xBF, c2);
  b.addBytes(from, 0xF1, 0xF3, c3);
  b.addBytes(from, 0xF4, 0xF4, f4);
  b.addBytes(f4, 0x80, 0x8F, c2);
}

namespace {
void addHex(GrammarBuilder& b, int32_t from, int32_t to) {
  b.addBytes(from, '0', '9', to);
  b.addBytes(from, 'A', 'F', to);
  b.addBytes(from, 'a', 'f', to);
}
}  // namespace

void addJsonChar(GrammarBuilder& b, int32_t from, int32_t to) {
  const int32_t r = b.ruleOfState(from);
  b.addBytes(from, 0x20, 0x21, to);  // '"' (0x22) and '\' (0x5C) need escapes
  b.addBytes(from, 0x23, 0x5B, to);
  b.addBytes(from, 0x5D, 0x7F, to);
  addUtf8NonAscii(b, from, to);
  const int32_t esc = b.addState(r);
  b.addBytes(from, '\\', '\\', esc);
  for (char c : std::string_view("\"\\/bfnrt")) {
    b.addBytes(esc, static_cast<uint8_t>(c), static_cast<uint8_t>(c), to);
  }
  const int32_t u1 = b.addState(r), u2 = b.addState(r), u3 = b.addState(r), u4 = b.addState(r);
  b.addBytes(esc, 'u', 'u', u1);
  addHex(b, u1, u2);
  addHex(b, u2, u3);
  addHex(b, u3, u4);
  addHex(b, u4, to);
}

void addCharClass(GrammarBuilder& b, int32_t from, int32_t to, const CharClass& cls) {
  const int32_t r = b.ruleOfState(from);
  int32_t esc = -1;
  auto escState = [&] {
    if (esc < 0) {
      esc = b.addState(r);
      b.addBytes(from, '\\', '\\', esc);
    }
    return esc;
  };
  // Raw printable ASCII (runs become one edge), escapes for the rest.
  int run = -1;
  for (int c = 0; c <= 128; ++c) {
    const bool raw = c < 128 && c >= 0x20 && c != '"' && c != '\\' && cls.ascii.test(static_cast<size_t>(c));
    if (raw && run < 0) run = c;
    if (!raw && run >= 0) {
      b.addBytes(from, static_cast<uint8_t>(run), static_cast<uint8_t>(c - 1), to);
      run = -1;
    }
  }
  if (cls.ascii.test('"')) b.addBytes(escState(), '"', '"', to);
  if (cls.ascii.test('\\')) b.addBytes(escState(), '\\', '\\', to);
  const struct {
    char c;
    char e;
  } named[] = {{'\n', 'n'}, {'\t', 't'}, {'\r', 'r'}, {'\b', 'b'}, {'\f', 'f'}};
  for (const auto& n : named) {
    if (cls.ascii.test(static_cast<size_t>(n.c))) {
      b.addBytes(escState(), static_cast<uint8_t>(n.e), static_cast<uint8_t>(n.e), to);
    }
  }
  // Other control characters: \u00XX.
  bool other_ctl = false;
  for (int c = 0; c < 0x20; ++c) {
    if (c != '\n' && c != '\t' && c != '\r' && c != '\b' && c != '\f' &&
        cls.ascii.test(static_cast<size_t>(c))) {
      other_ctl = true;
    }
  }
  if (other_ctl) {
    const int32_t u1 = b.addState(r), u2 = b.addState(r), u3 = b.addState(r), u4 = b.addState(r);
    b.addBytes(escState(), 'u', 'u', u1);
    b.addBytes(u1, '0', '0', u2);
    b.addBytes(u2, '0', '0', u3);
    b.addBytes(u3, '0', '1', u4);
    addHex(b, u4, to);
  }
  if (cls.non_ascii) addUtf8NonAscii(b, from, to);
}

// ---------------------------------------------------------------------------------------------
// Regex

namespace {

struct Node {
  enum Kind { kEmpty, kClass, kBytes, kConcat, kAlt, kRepeat } kind = kEmpty;
  CharClass cls;
  std::string bytes;  // kBytes: one non-ASCII character's UTF-8
  std::vector<int> kids;
  int min = 0;
  int max = -1;  // -1: unbounded
};

class RegexParser {
 public:
  explicit RegexParser(std::string_view p) : p_(p) {}

  Result<int> parse(bool* anchored_start, bool* anchored_end) {
    *anchored_start = !p_.empty() && p_[0] == '^';
    if (*anchored_start) ++pos_;
    *anchored_end = false;
    auto r = alt();
    if (!r.isOk()) return r;
    if (pos_ < p_.size() && p_[pos_] == '$' && pos_ + 1 == p_.size()) {
      *anchored_end = true;
      ++pos_;
    }
    if (pos_ != p_.size()) return err("unexpected '" + std::string(1, p_[pos_]) + "'");
    return r;
  }
  std::vector<Node> nodes;

 private:
  Status err(const std::string& what) const {
    return invalidArgument("pattern: " + what + " at offset " + std::to_string(pos_) +
                           " (supported: literals, ., classes, \\d\\w\\s, groups, |, ?*+{m,n}, "
                           "^ and $ at the ends)");
  }
  int add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<int>(nodes.size() - 1);
  }
  bool more() const { return pos_ < p_.size(); }

  Result<int> alt() {
    Node a;
    a.kind = Node::kAlt;
    while (true) {
      auto c = concat();
      if (!c.isOk()) return c;
      a.kids.push_back(*c);
      if (more() && p_[pos_] == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    if (a.kids.size() == 1) return a.kids[0];
    return add(std::move(a));
  }

  Result<int> concat() {
    Node c;
    c.kind = Node::kConcat;
    while (more() && p_[pos_] != '|' && p_[pos_] != ')') {
      if (p_[pos_] == '$' && pos_ + 1 == p_.size()) break;
      auto a = atom();
      if (!a.isOk()) return a;
      int cur = *a;
      // Quantifiers.
      while (more()) {
        int mn = 0, mx = 0;
        const char q = p_[pos_];
        if (q == '*') {
          mn = 0, mx = -1, ++pos_;
        } else if (q == '+') {
          mn = 1, mx = -1, ++pos_;
        } else if (q == '?') {
          mn = 0, mx = 1, ++pos_;
        } else if (q == '{') {
          auto r = counted(&mn, &mx);
          if (!r.isOk()) return r;
        } else {
          break;
        }
        if (more() && p_[pos_] == '?') ++pos_;  // lazy: same language
        if (more() && p_[pos_] == '+') return err("possessive quantifier");
        Node rep;
        rep.kind = Node::kRepeat;
        rep.kids = {cur};
        rep.min = mn;
        rep.max = mx;
        cur = add(std::move(rep));
      }
      c.kids.push_back(cur);
    }
    if (c.kids.size() == 1) return c.kids[0];
    return add(std::move(c));
  }

  Status counted(int* mn, int* mx) {
    const size_t start = pos_;
    ++pos_;
    auto num = [&](int* out) {
      size_t s = pos_;
      long v = 0;
      while (more() && p_[pos_] >= '0' && p_[pos_] <= '9' && v < 100000) {
        v = v * 10 + (p_[pos_] - '0');
        ++pos_;
      }
      *out = static_cast<int>(v);
      return pos_ > s;
    };
    if (!num(mn)) {
      pos_ = start;
      return err("bad {m,n} quantifier");
    }
    *mx = *mn;
    if (more() && p_[pos_] == ',') {
      ++pos_;
      if (!num(mx)) *mx = -1;
    }
    if (!more() || p_[pos_] != '}') return err("bad {m,n} quantifier");
    ++pos_;
    if (*mx >= 0 && *mx < *mn) return err("{m,n} with n < m");
    if (*mn > 1000 || *mx > 1000) return err("repeat count above 1000");
    return okStatus();
  }

  static CharClass cls(const char* set) {
    CharClass c;
    for (const char* s = set; *s; ++s) c.ascii.set(static_cast<size_t>(*s));
    return c;
  }
  static CharClass range(char lo, char hi) {
    CharClass c;
    for (int x = lo; x <= hi; ++x) c.ascii.set(static_cast<size_t>(x));
    return c;
  }
  static CharClass digit() { return range('0', '9'); }
  static CharClass word() {
    CharClass c = digit();
    c.ascii |= range('a', 'z').ascii;
    c.ascii |= range('A', 'Z').ascii;
    c.ascii.set('_');
    return c;
  }
  static CharClass space() { return cls(" \t\n\r\f\v"); }
  static CharClass negate(CharClass c) {
    c.ascii.flip();
    c.non_ascii = !c.non_ascii;
    return c;
  }

  // An escape after '\': a class or one ASCII character.
  Result<CharClass> escape() {
    if (!more()) return err("trailing backslash");
    const char e = p_[pos_++];
    switch (e) {
      case 'd': return digit();
      case 'D': return negate(digit());
      case 'w': return word();
      case 'W': return negate(word());
      case 's': return space();
      case 'S': return negate(space());
      case 'n': return cls("\n");
      case 't': return cls("\t");
      case 'r': return cls("\r");
      case 'f': return cls("\f");
      case 'v': return cls("\v");
      case 'u': {
        if (pos_ + 4 > p_.size()) return err("bad \\u escape");
        int v = 0;
        for (int i = 0; i < 4; ++i) {
          const char h = p_[pos_++];
          const int d = (h >= '0' && h <= '9')   ? h - '0'
                        : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                 : -1;
          if (d < 0) return err("bad \\u escape");
          v = v * 16 + d;
        }
        if (v >= 128) return err("non-ASCII \\u escape");
        CharClass c;
        c.ascii.set(static_cast<size_t>(v));
        return c;
      }
      default:
        if ((e >= '0' && e <= '9') || e == 'b' || e == 'B' || e == 'k' || e == 'p' || e == 'P') {
          return err(std::string("unsupported escape \\") + e);
        }
        if (static_cast<unsigned char>(e) >= 128) return err("escaped non-ASCII character");
        CharClass c;
        c.ascii.set(static_cast<size_t>(e));
        return c;
    }
  }

  Result<int> bracket() {
    ++pos_;  // '['
    bool neg = false;
    if (more() && p_[pos_] == '^') {
      neg = true;
      ++pos_;
    }
    CharClass c;
    bool first = true;
    while (more() && (p_[pos_] != ']' || first)) {
      first = false;
      int lo;
      if (p_[pos_] == '\\') {
        ++pos_;
        auto e = escape();
        if (!e.isOk()) return e.status();
        if (e->ascii.count() != 1 || e->non_ascii) {  // a class escape inside brackets
          c.ascii |= e->ascii;
          c.non_ascii = c.non_ascii || e->non_ascii;
          continue;
        }
        lo = 0;
        while (!e->ascii.test(static_cast<size_t>(lo))) ++lo;
      } else {
        if (static_cast<unsigned char>(p_[pos_]) >= 128) return err("non-ASCII class member");
        lo = p_[pos_++];
      }
      int hi = lo;
      if (pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        if (p_[pos_] == '\\') {
          ++pos_;
          auto e = escape();
          if (!e.isOk()) return e.status();
          if (e->ascii.count() != 1) return err("class range to a class");
          hi = 0;
          while (!e->ascii.test(static_cast<size_t>(hi))) ++hi;
        } else {
          if (static_cast<unsigned char>(p_[pos_]) >= 128) return err("non-ASCII class member");
          hi = p_[pos_++];
        }
        if (hi < lo) return err("class range out of order");
      }
      for (int x = lo; x <= hi; ++x) c.ascii.set(static_cast<size_t>(x));
    }
    if (!more()) return err("unterminated [");
    ++pos_;  // ']'
    Node n;
    n.kind = Node::kClass;
    n.cls = neg ? negate(c) : c;
    return add(std::move(n));
  }

  Result<int> atom() {
    const char c = p_[pos_];
    Node n;
    if (c == '(') {
      ++pos_;
      if (more() && p_[pos_] == '?') {
        if (pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
          pos_ += 2;
        } else {
          return err("lookaround or named group");
        }
      }
      auto r = alt();
      if (!r.isOk()) return r;
      if (!more() || p_[pos_] != ')') return err("unbalanced (");
      ++pos_;
      return r;
    }
    if (c == '[') return bracket();
    if (c == '^' || c == '$') return err("anchor inside the pattern");
    if (c == '*' || c == '+' || c == '?' || c == '{') return err("quantifier without operand");
    if (c == '.') {
      ++pos_;
      n.kind = Node::kClass;
      n.cls = CharClass::any();
      n.cls.ascii.reset('\n');
      n.cls.ascii.reset('\r');
      return add(std::move(n));
    }
    if (c == '\\') {
      ++pos_;
      auto e = escape();
      if (!e.isOk()) return e.status();
      n.kind = Node::kClass;
      n.cls = *e;
      return add(std::move(n));
    }
    const auto u = static_cast<unsigned char>(c);
    if (u < 128) {
      ++pos_;
      n.kind = Node::kClass;
      n.cls.ascii.set(u);
      return add(std::move(n));
    }
    // One UTF-8 character, kept as its bytes.
    size_t len = u >= 0xF0 ? 4 : u >= 0xE0 ? 3 : u >= 0xC0 ? 2 : 0;
    if (len == 0 || pos_ + len > p_.size()) return err("invalid UTF-8");
    n.kind = Node::kBytes;
    n.bytes = std::string(p_.substr(pos_, len));
    pos_ += len;
    return add(std::move(n));
  }

  std::string_view p_;
  size_t pos_ = 0;
};

class Emitter {
 public:
  Emitter(GrammarBuilder& b, const std::vector<Node>& nodes, size_t max_states)
      : b_(b), nodes_(nodes), limit_(b.numStates() + max_states) {}

  Result<int32_t> emit(int node, int32_t from) {
    if (b_.numStates() > limit_) {
      return invalidArgument("pattern: too large once its counted repeats are expanded");
    }
    const Node& n = nodes_[static_cast<size_t>(node)];
    const int32_t r = b_.ruleOfState(from);
    switch (n.kind) {
      case Node::kEmpty:
        return from;
      case Node::kClass: {
        const int32_t to = b_.addState(r);
        addCharClass(b_, from, to, n.cls);
        return to;
      }
      case Node::kBytes:
        return b_.literal(from, n.bytes);
      case Node::kConcat: {
        int32_t cur = from;
        for (int k : n.kids) {
          auto next = emit(k, cur);
          if (!next.isOk()) return next;
          cur = *next;
        }
        return cur;
      }
      case Node::kAlt: {
        const int32_t to = b_.addState(r);
        for (int k : n.kids) {
          const int32_t s = b_.addState(r);
          b_.addEpsilon(from, s);
          auto e = emit(k, s);
          if (!e.isOk()) return e;
          b_.addEpsilon(*e, to);
        }
        return to;
      }
      case Node::kRepeat: {
        int32_t cur = from;
        for (int i = 0; i < n.min; ++i) {
          auto e = emit(n.kids[0], cur);
          if (!e.isOk()) return e;
          cur = *e;
        }
        const int32_t to = b_.addState(r);
        b_.addEpsilon(cur, to);
        if (n.max < 0) {
          const int32_t loop = b_.addState(r);
          b_.addEpsilon(cur, loop);
          auto e = emit(n.kids[0], loop);
          if (!e.isOk()) return e;
          b_.addEpsilon(*e, loop);
          b_.addEpsilon(*e, to);
        } else {
          for (int i = n.min; i < n.max; ++i) {
            auto e = emit(n.kids[0], cur);
            if (!e.isOk()) return e;
            cur = *e;
            b_.addEpsilon(cur, to);
          }
        }
        return to;
      }
    }
    return from;
  }

 private:
  GrammarBuilder& b_;
  const std::vector<Node>& nodes_;
  size_t limit_;
};

}  // namespace

Result<int32_t> addPattern(GrammarBuilder& b, int32_t from, std::string_view pattern,
                           size_t max_states) {
  RegexParser parser(pattern);
  bool anchored_start, anchored_end;
  auto root = parser.parse(&anchored_start, &anchored_end);
  if (!root.isOk()) return root.status();
  const int32_t r = b.ruleOfState(from);
  int32_t cur = from;
  if (!anchored_start) {  // search semantics: anything may come before
    const int32_t loop = b.addState(r);
    b.addEpsilon(cur, loop);
    addCharClass(b, loop, loop, CharClass::any());
    cur = loop;
  }
  Emitter em(b, parser.nodes, max_states);
  auto end = em.emit(*root, cur);
  if (!end.isOk()) return end;
  cur = *end;
  if (!anchored_end) {
    const int32_t loop = b.addState(r);
    b.addEpsilon(cur, loop);
    addCharClass(b, loop, loop, CharClass::any());
    cur = loop;
  }
  return cur;
}

}  // namespace garden::grammar
