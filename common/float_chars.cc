#include "common/float_chars.h"

#include <bit>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <vector>

namespace garden {
namespace {

// float32: value = c * 2^q, c < 2^24.
constexpr int kP = 24;          // significand bits, with the hidden one
constexpr int kQMin = -149;     // exponent of the smallest subnormal
constexpr uint32_t kCMin = 1u << (kP - 1);
// Decimal exponents k the algorithm needs: flog10pow2 over [kQMin, 104], with margin.
constexpr int kKMin = -48;
constexpr int kKMax = 33;

// floor(q * log10(2)), floor(q * log10(3/4 * 2)), floor(e * log2(10)), exact in these ranges
// (fixed-point constants as in the Schubfach paper).
int flog10pow2(int q) { return static_cast<int>((int64_t{q} * 661'971'961'083) >> 41); }
int flog10threeQuartersPow2(int q) {
  return static_cast<int>((int64_t{q} * 661'971'961'083 - 274'743'187'321) >> 41);
}
int flog2pow10(int e) { return static_cast<int>((int64_t{e} * 913'124'641'741) >> 38); }

// Little-endian base-2^32 unsigned integer, just what building the table needs.
using Big = std::vector<uint32_t>;
void mulSmall(Big& a, uint32_t m) {
  uint64_t carry = 0;
  for (auto& w : a) {
    const uint64_t v = uint64_t{w} * m + carry;
    w = static_cast<uint32_t>(v);
    carry = v >> 32;
  }
  if (carry) a.push_back(static_cast<uint32_t>(carry));
}
void divSmall(Big& a, uint32_t d) {  // floor
  uint64_t rem = 0;
  for (size_t i = a.size(); i-- > 0;) {
    const uint64_t v = (rem << 32) | a[i];
    a[i] = static_cast<uint32_t>(v / d);
    rem = v % d;
  }
  while (!a.empty() && a.back() == 0) a.pop_back();
}
Big shifted(Big a, int n) {  // floor(a * 2^n)
  if (n >= 0) {
    const int words = n / 32, bits = n % 32;
    Big r(static_cast<size_t>(words), 0);
    uint32_t carry = 0;
    for (uint32_t w : a) {
      r.push_back(bits ? (w << bits) | carry : w);
      carry = bits ? w >> (32 - bits) : 0;
    }
    if (carry) r.push_back(carry);
    return r;
  }
  n = -n;
  const size_t words = static_cast<size_t>(n / 32);
  const int bits = n % 32;
  if (words >= a.size()) return {};
  Big r(a.begin() + static_cast<std::ptrdiff_t>(words), a.end());
  if (bits) {
    for (size_t i = 0; i < r.size(); ++i) {
      const uint32_t hi = i + 1 < r.size() ? r[i + 1] : 0;
      r[i] = (r[i] >> bits) | (hi << (32 - bits));
    }
  }
  while (!r.empty() && r.back() == 0) r.pop_back();
  return r;
}
uint64_t bitsFrom(const Big& a, int lo) {  // bits [lo, lo + 64) of a
  uint64_t r = 0;
  for (int b = 0; b < 64; ++b) {
    const size_t word = static_cast<size_t>((lo + b) / 32);
    if (word < a.size() && ((a[word] >> ((lo + b) % 32)) & 1u)) r |= uint64_t{1} << b;
  }
  return r;
}

// g1(k) + 1, where g = floor(10^-k * 2^(125 - flog2pow10(-k))) + 1 (2^125 <= g < 2^126) and
// g1 = floor(g / 2^63): a 63-bit upper approximation of 10^-k, scaled.
struct Table {
  uint64_t g[kKMax - kKMin + 1];
  Table() {
    for (int k = kKMin; k <= kKMax; ++k) {
      const int e = -k;
      const int n = 125 - flog2pow10(e);
      Big v{1};
      if (e >= 0) {
        for (int i = 0; i < e; ++i) mulSmall(v, 10);
        v = shifted(v, n);
      } else {
        v = shifted(v, n);
        for (int i = 0; i < -e; ++i) divSmall(v, 10);  // floor(floor(x/10)/10) = floor(x/100)
      }
      // + 1 (g), then the upper part; v + 1 cannot carry past bit 125.
      Big g = v;
      for (auto& w : g) {
        if (++w != 0) break;
      }
      this->g[k - kKMin] = bitsFrom(g, 63) + 1;
    }
  }
};
// Built on first use (safe from other files' static initializers, e.g. a log line).
const Table& table() {
  static const Table t;
  return t;
}

// Round to odd of the product's high part: floor(g * cp / 2^95), with the lowest bit set when
// anything below was cut.
uint64_t rop(uint64_t g, uint64_t cp) {
  const unsigned __int128 p = static_cast<unsigned __int128>(g) * cp;
  const uint64_t x1 = static_cast<uint64_t>(p >> 64);
  const uint64_t vbp = x1 >> 31;
  return vbp | (((x1 & 0xffff'ffffu) + 0xffff'ffffu) >> 32);
}

struct Decimal {
  uint32_t digits;  // no trailing zeros is NOT guaranteed
  int exp10;        // value = digits * 10^exp10
};

Decimal toDecimal(int q, uint64_t c) {
  const uint64_t out = c & 1;
  const uint64_t cb = c << 2;
  const uint64_t cbr = cb + 2;
  uint64_t cbl;
  int k;
  if (c != kCMin || q == kQMin) {
    cbl = cb - 2;
    k = flog10pow2(q);
  } else {  // the boundary below c * 2^q is closer (the binade changes under it)
    cbl = cb - 1;
    k = flog10threeQuartersPow2(q);
  }
  const int h = q + flog2pow10(-k) + 33;
  const uint64_t g = table().g[k - kKMin];
  const uint64_t vb = rop(g, cb << h);
  const uint64_t vbl = rop(g, cbl << h);
  const uint64_t vbr = rop(g, cbr << h);
  const uint64_t s = vb >> 2;
  if (s >= 100) {
    // One digit fewer, if a multiple of ten is in the rounding interval.
    const uint64_t sp10 = 10 * (s / 10);
    const uint64_t tp10 = sp10 + 10;
    const bool upin = vbl + out <= sp10 << 2;
    const bool wpin = (tp10 << 2) + out <= vbr;
    if (upin != wpin) return {static_cast<uint32_t>(upin ? sp10 : tp10), k};
  }
  const uint64_t t = s + 1;
  const bool uin = vbl + out <= s << 2;
  const bool win = (t << 2) + out <= vbr;
  if (uin != win) return {static_cast<uint32_t>(uin ? s : t), k};
  // Both in: the closer one, ties to even.
  const int64_t cmp = static_cast<int64_t>(vb) - static_cast<int64_t>((s + t) << 1);
  return {static_cast<uint32_t>(cmp < 0 || (cmp == 0 && (s & 1) == 0) ? s : t), k};
}

constexpr char kPairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

int countDigits(uint64_t v) {
  int n = 1;
  for (; v >= 100000000; v /= 100000000) n += 8;
  return n + (v >= 10) + (v >= 100) + (v >= 1000) + (v >= 10000) + (v >= 100000) +
         (v >= 1000000) + (v >= 10000000);
}

// The n decimal digits of v at out[0..n).
void putDigits(char* out, uint64_t v, int n) {
  char* p = out + n;
  while (v >= 100) {
    p -= 2;
    std::memcpy(p, kPairs + 2 * (v % 100), 2);
    v /= 100;
  }
  if (v >= 10) {
    p -= 2;
    std::memcpy(p, kPairs + 2 * v, 2);
  } else {
    *--p = static_cast<char>('0' + v);
  }
}

// to_chars' layout of digits * 10^exp: fixed or scientific, whichever is shorter (fixed on a tie).
// `abs` is the value itself: a fixed integer wider than its shortest digits ("33584488", not
// "33584490") is written exactly, as the closest of the equally long representations.
char* layout(char* out, uint32_t digits, int exp, float abs) {
  if (digits % 10 == 0) {
    do {
      digits /= 10;
      ++exp;
    } while (digits % 10 == 0);
  }
  const int n = countDigits(digits);
  const int point = n + exp;  // digits before the decimal point (<= 0: "0.00ddd")
  const int fixed_len = exp >= 0 ? point : (point > 0 ? n + 1 : 2 - point + n);
  const int sci_exp = point - 1;  // d[.ddd]e±XX, at least two exponent digits
  const int sci_abs = sci_exp < 0 ? -sci_exp : sci_exp;
  const int sci_len = n + (n > 1 ? 1 : 0) + 4;
  if (fixed_len <= sci_len) {
    if (exp > 0) {  // an integer (every float this large is): its exact digits
      const auto v = static_cast<uint64_t>(abs);
      const int m = countDigits(v);
      putDigits(out, v, m);
      return out + m;
    }
    if (exp == 0) {
      putDigits(out, digits, n);
      return out + n;
    }
    if (point > 0) {  // ddd.ddd
      char d[10];
      putDigits(d, digits, n);
      std::memcpy(out, d, static_cast<size_t>(point));
      out[point] = '.';
      std::memcpy(out + point + 1, d + point, static_cast<size_t>(n - point));
      return out + n + 1;
    }
    out[0] = '0';  // 0.000ddd
    out[1] = '.';
    for (int i = 0; i < -point; ++i) out[2 + i] = '0';
    putDigits(out + 2 - point, digits, n);
    return out + 2 - point + n;
  }
  char d[10];
  putDigits(d, digits, n);
  *out++ = d[0];
  if (n > 1) {
    *out++ = '.';
    std::memcpy(out, d + 1, static_cast<size_t>(n - 1));
    out += n - 1;
  }
  *out++ = 'e';
  *out++ = sci_exp < 0 ? '-' : '+';
  std::memcpy(out, kPairs + 2 * sci_abs, 2);  // float exponents are within ±45
  return out + 2;
}

}  // namespace

char* writeShortestFloat(char* out, float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if (bits >> 31) *out++ = '-';
  const uint32_t t = bits & (kCMin - 1);
  const int bq = static_cast<int>((bits >> (kP - 1)) & 0xff);
  if (bq == 0 && t == 0) {
    *out++ = '0';
    return out;
  }
  Decimal d;
  if (bq != 0) {
    const int mq = -kQMin + 1 - bq;  // -q
    const uint32_t c = kCMin | t;
    if (0 < mq && mq < kP && ((c >> mq) << mq) == c) {
      d = {c >> mq, 0};  // an integer below 2^24: its own digits
    } else {
      d = toDecimal(-mq, c);
    }
  } else {
    // Subnormal (below 1.2e-38; never in an embedding): the library, which also gets the shortest
    // of the tiny ones right ("3e-44", where the digit loop above would stop at "2.9e-44").
    char* const end = out + 16;
    return std::to_chars(out, end, f < 0 ? -f : f).ptr;
  }
  return layout(out, d.digits, d.exp10, std::bit_cast<float>(bits & 0x7fff'ffffu));
}

}  // namespace garden
