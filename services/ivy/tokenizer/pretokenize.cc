#include "services/ivy/tokenizer/pretokenize.h"

#include "services/ivy/tokenizer/unicode_tables.h"
#include "services/ivy/tokenizer/utf8.h"

namespace garden::ivy {
namespace {

constexpr std::string_view kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kO200kRegex =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|"
    "'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{"
    "Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/"
    "]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Per code point class bits.
enum : uint8_t {
  kL = 1,       // \p{L}
  kN = 2,       // \p{N}
  kS = 4,       // \s
  kRN = 8,      // \r or \n
  kU = 16,      // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
  kW = 32,      // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
  kSp = 64,     // U+0020
  kSlash = 128  // '/'
};

uint8_t classOf(uint32_t cp) {
  using namespace unicode;
  const uint32_t m = 1u << category(cp);
  uint8_t c = 0;
  if (m & kLetterMask) c |= kL;
  if (m & kNumberMask) c |= kN;
  if (m & (bit(kLu) | bit(kLt) | bit(kLm) | bit(kLo) | kMarkMask)) c |= kU;
  if (m & (bit(kLl) | bit(kLm) | bit(kLo) | kMarkMask)) c |= kW;
  if (isWhiteSpace(cp)) c |= kS;
  if (cp == '\r' || cp == '\n') c |= kRN;
  if (cp == ' ') c |= kSp;
  if (cp == '/') c |= kSlash;
  return c;
}

struct AsciiTable {
  uint8_t cls[128];
  AsciiTable() {
    for (uint32_t i = 0; i < 128; ++i) cls[i] = classOf(i);
  }
};
const AsciiTable kAscii;

struct Cps {
  std::vector<uint32_t> off;  // byte offset of each code point; off[count] = size
  std::vector<uint32_t> cp;
  std::vector<uint8_t> cls;
  size_t count = 0;
};

void decodeAll(std::string_view text, Cps* c) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  c->off.resize(n + 1);
  c->cp.resize(n);
  c->cls.resize(n);
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    c->off[k] = static_cast<uint32_t>(i);
    if (p[i] < 0x80) {
      c->cp[k] = p[i];
      c->cls[k] = kAscii.cls[p[i]];
      ++i;
    } else {
      uint32_t cp;
      int len = utf8::decode(p + i, n - i, &cp);
      if (len == 0) {
        c->cp[k] = 0xFFFFFFFFu;  // invalid byte: no class
        c->cls[k] = 0;
        ++i;
      } else {
        c->cp[k] = cp;
        c->cls[k] = classOf(cp);
        i += static_cast<size_t>(len);
      }
    }
    ++k;
  }
  c->off[k] = static_cast<uint32_t>(n);
  c->count = k;
}

inline uint32_t foldAscii(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp == 0x17F) return 's';  // LATIN SMALL LETTER LONG S case-folds to 's'
  return cp;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at k: end index, or k when no match.
size_t contraction(const Cps& c, size_t k) {
  if (k >= c.count || c.cp[k] != '\'' || k + 1 >= c.count) return k;
  const uint32_t a = foldAscii(c.cp[k + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return k + 2;
  if (k + 2 >= c.count) return k;
  const uint32_t b = foldAscii(c.cp[k + 2]);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return k + 3;
  return k;
}

inline bool isP(uint8_t cls) { return (cls & (kL | kN | kRN)) == 0; }  // [^\r\n\p{L}\p{N}]
inline bool isQ(uint8_t cls) { return (cls & (kS | kL | kN)) == 0; }   // [^\s\p{L}\p{N}]

// \s*[\r\n]+ | \s+(?!\S) | \s+  at k; k when none.
size_t whitespaceAlts(const Cps& c, size_t k) {
  size_t e = k;
  while (e < c.count && (c.cls[e] & kS)) ++e;
  if (e == k) return k;
  for (size_t t = e; t-- > k;) {
    if (c.cls[t] & kRN) return t + 1;
  }
  if (e == c.count) return e;
  if (e - 1 > k) return e - 1;
  return e;
}

//  ?[^\s\p{L}\p{N}]+ followed by [\r\n]* (Qwen2) or [\r\n/]* (o200k).
size_t punctuationAlt(const Cps& c, size_t k, uint8_t trail_mask) {
  size_t j;
  if ((c.cls[k] & kSp) && k + 1 < c.count && isQ(c.cls[k + 1])) {
    j = k + 1;
  } else if (isQ(c.cls[k])) {
    j = k;
  } else {
    return k;
  }
  size_t e = j;
  while (e < c.count && isQ(c.cls[e])) ++e;
  while (e < c.count && (c.cls[e] & trail_mask)) ++e;
  return e;
}

size_t matchQwen2(const Cps& c, size_t k) {
  size_t e = contraction(c, k);
  if (e > k) return e;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t j = k;
  if (isP(c.cls[k]) && k + 1 < c.count && (c.cls[k + 1] & kL)) j = k + 1;
  if (c.cls[j] & kL) {
    e = j;
    while (e < c.count && (c.cls[e] & kL)) ++e;
    return e;
  }
  if (c.cls[k] & kN) return k + 1;
  e = punctuationAlt(c, k, kRN);
  if (e > k) return e;
  return whitespaceAlts(c, k);
}

size_t matchO200k(const Cps& c, size_t k) {
  // [^\r\n\p{L}\p{N}]?[U]*[W]+(contraction)?
  for (int pre = 1; pre >= 0; --pre) {
    if (pre && !isP(c.cls[k])) continue;
    const size_t j = k + static_cast<size_t>(pre);
    size_t e = j;
    while (e < c.count && (c.cls[e] & kU)) ++e;
    size_t p = SIZE_MAX;
    if (e < c.count && (c.cls[e] & kW)) {
      p = e;
    } else {
      for (size_t t = e; t-- > j;) {
        if (c.cls[t] & kW) {
          p = t;
          break;
        }
      }
    }
    if (p == SIZE_MAX) continue;
    size_t q = p;
    while (q < c.count && (c.cls[q] & kW)) ++q;
    return contraction(c, q);
  }
  // [^\r\n\p{L}\p{N}]?[U]+[W]*(contraction)?
  for (int pre = 1; pre >= 0; --pre) {
    if (pre && !isP(c.cls[k])) continue;
    const size_t j = k + static_cast<size_t>(pre);
    size_t e = j;
    while (e < c.count && (c.cls[e] & kU)) ++e;
    if (e == j) continue;
    while (e < c.count && (c.cls[e] & kW)) ++e;
    return contraction(c, e);
  }
  // \p{N}{1,3}
  if (c.cls[k] & kN) {
    size_t e = k + 1;
    while (e < c.count && e < k + 3 && (c.cls[e] & kN)) ++e;
    return e;
  }
  size_t e = punctuationAlt(c, k, kRN | kSlash);
  if (e > k) return e;
  return whitespaceAlts(c, k);
}

}  // namespace

std::optional<SplitPattern> recognizeSplitRegex(std::string_view regex) {
  if (regex == kQwen2Regex) return SplitPattern::kQwen2;
  if (regex == kO200kRegex) return SplitPattern::kO200k;
  return std::nullopt;
}

void splitPieces(SplitPattern pattern, std::string_view text, std::vector<uint32_t>* ends) {
  thread_local Cps c;
  decodeAll(text, &c);
  size_t k = 0;
  size_t gap_start = SIZE_MAX;
  while (k < c.count) {
    const size_t e = pattern == SplitPattern::kQwen2 ? matchQwen2(c, k) : matchO200k(c, k);
    if (e > k) {
      if (gap_start != SIZE_MAX) {
        ends->push_back(c.off[k]);
        gap_start = SIZE_MAX;
      }
      ends->push_back(c.off[e]);
      k = e;
    } else {
      if (gap_start == SIZE_MAX) gap_start = k;
      ++k;
    }
  }
  if (gap_start != SIZE_MAX) ends->push_back(c.off[c.count]);
}

}  // namespace garden::ivy
