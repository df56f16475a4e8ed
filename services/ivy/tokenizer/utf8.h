#pragma once
// Small UTF-8 helpers shared by the tokenizers. Header-only, pure functions, any thread.
// Decoding is strict (no overlongs, no surrogates, nothing above U+10FFFF), which is what
// sentencepiece's IsValidDecodeUTF8 and Rust's str::from_utf8 both accept.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace garden::ivy::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

inline bool isTrail(unsigned char c) { return (c & 0xC0) == 0x80; }

// Decodes one code point at p[0..n). Returns the length (1..4) of a valid sequence and sets
// *cp, or 0 when the sequence starting at p is invalid or truncated.
inline int decode(const unsigned char* p, size_t n, uint32_t* cp) {
  if (n == 0) return 0;
  const unsigned char c = p[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if ((c & 0xE0) == 0xC0) {
    if (n < 2 || !isTrail(p[1])) return 0;
    uint32_t v = ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    if (v < 0x80) return 0;
    *cp = v;
    return 2;
  }
  if ((c & 0xF0) == 0xE0) {
    if (n < 3 || !isTrail(p[1]) || !isTrail(p[2])) return 0;
    uint32_t v = ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    if (v < 0x800 || (v >= 0xD800 && v < 0xE000)) return 0;
    *cp = v;
    return 3;
  }
  if ((c & 0xF8) == 0xF0) {
    if (n < 4 || !isTrail(p[1]) || !isTrail(p[2]) || !isTrail(p[3])) return 0;
    uint32_t v = ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) |
                 (p[3] & 0x3Fu);
    if (v < 0x10000 || v > 0x10FFFF) return 0;
    *cp = v;
    return 4;
  }
  return 0;
}

inline void append(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Length of the longest prefix of [p, p+n) that is a *possible start* of a valid sequence
// (Unicode "maximal subpart"): 0 if p[0] can start no sequence. Used for lossy decoding the
// way Rust's String::from_utf8_lossy does it (one U+FFFD per maximal invalid subpart).
inline int maximalSubpart(const unsigned char* p, size_t n) {
  if (n == 0) return 0;
  const unsigned char c = p[0];
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  int len = 1;
  if (len < need && static_cast<size_t>(len) < n && p[len] >= lo && p[len] <= hi) {
    ++len;
    while (len < need && static_cast<size_t>(len) < n && isTrail(p[len])) ++len;
  }
  return len;
}

// Appends bytes to *out replacing invalid data like Rust's from_utf8_lossy. When `final` is
// false, a trailing incomplete-but-possible sequence is not emitted; its length is returned
// (the caller keeps those bytes). Returns 0 when everything was consumed.
inline size_t appendLossy(std::string_view bytes, bool final, std::string* out) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    // Fast ASCII run.
    size_t j = i;
    while (j < n && p[j] < 0x80) ++j;
    if (j > i) {
      out->append(bytes.data() + i, j - i);
      i = j;
      if (i == n) break;
    }
    uint32_t cp;
    int len = decode(p + i, n - i, &cp);
    if (len > 0) {
      out->append(bytes.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
      continue;
    }
    int sub = maximalSubpart(p + i, n - i);
    if (!final && sub > 0 && i + static_cast<size_t>(sub) == n) return n - i;  // maybe completes later
    out->append(kReplacement);
    i += static_cast<size_t>(sub > 0 ? sub : 1);
  }
  return 0;
}

// sentencepiece's rule: each byte that does not start a valid sequence becomes U+FFFD on its
// own. With `final` false, a trailing sequence that could still become valid is kept (its
// length is returned).
inline size_t appendPerByteLossy(std::string_view bytes, bool final, std::string* out) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    uint32_t cp;
    int len = decode(p + i, n - i, &cp);
    if (len > 0) {
      out->append(bytes.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
      continue;
    }
    int sub = maximalSubpart(p + i, n - i);
    if (!final && sub > 0 && i + static_cast<size_t>(sub) == n) return n - i;
    out->append(kReplacement);
    ++i;
  }
  return 0;
}

}  // namespace garden::ivy::utf8
