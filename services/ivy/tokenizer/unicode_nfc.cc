// NFC normalization (UAX #15) over the generated tables. Used by tokenizers whose
// tokenizer.json asks for an NFC normalizer (Qwen3). The common case, text with no code point
// that NFC could touch, is a copy; only the segments around "unsafe" code points go through
// decomposition, canonical ordering and composition.

#include <algorithm>
#include <vector>

#include "services/ivy/tokenizer/unicode_tables.h"
#include "services/ivy/tokenizer/utf8.h"

namespace garden::ivy::unicode {
namespace {

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t ccc(uint32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::lower_bound(kCcc, kCcc + kCccCount, cp,
                             [](const CccEntry& e, uint32_t v) { return e.cp < v; });
  return (it != kCcc + kCccCount && it->cp == cp) ? it->ccc : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  auto it = std::lower_bound(kDecomp, kDecomp + kDecompCount, cp,
                             [](const DecompEntry& e, uint32_t v) { return e.cp < v; });
  if (it != kDecomp + kDecompCount && it->cp == cp) {
    out->insert(out->end(), kDecompPool + it->offset, kDecompPool + it->offset + it->length);
  } else {
    out->push_back(cp);
  }
}

// 0 when the pair does not compose.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const uint64_t key = (static_cast<uint64_t>(a) << 21) | b;
  auto it = std::lower_bound(kComp, kComp + kCompCount, key,
                             [](const CompEntry& e, uint64_t v) { return e.pair < v; });
  return (it != kComp + kCompCount && it->pair == key) ? it->composite : 0;
}

void nfcSegment(std::string_view seg, std::string* out) {
  thread_local std::vector<uint32_t> buf;
  buf.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(seg.data());
  for (size_t i = 0; i < seg.size();) {
    uint32_t cp;
    int len = utf8::decode(p + i, seg.size() - i, &cp);
    if (len == 0) {  // not reached for valid input; keep the byte's value as a pseudo cp
      cp = 0xFFFD;
      len = 1;
    }
    decompose(cp, &buf);
    i += static_cast<size_t>(len);
  }
  // Canonical ordering: stable sort of each run of non-starters by ccc.
  for (size_t i = 0; i < buf.size();) {
    if (ccc(buf[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < buf.size() && ccc(buf[j]) != 0) ++j;
    std::stable_sort(buf.begin() + static_cast<long>(i), buf.begin() + static_cast<long>(j),
                     [](uint32_t a, uint32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  // Composition.
  thread_local std::vector<uint32_t> res;
  res.clear();
  long starter = -1;
  int last_class = 256;
  for (size_t i = 0; i < buf.size(); ++i) {
    const uint32_t c = buf[i];
    const int cls = ccc(c);
    if (starter >= 0 && (last_class < cls || last_class == 0)) {
      const uint32_t comp = compose(res[static_cast<size_t>(starter)], c);
      if (comp != 0) {
        res[static_cast<size_t>(starter)] = comp;
        continue;
      }
    }
    if (cls == 0) {
      starter = static_cast<long>(res.size());
    }
    last_class = cls;
    res.push_back(c);
  }
  for (uint32_t c : res) utf8::append(c, out);
}

}  // namespace

bool isNfcQuick(std::string_view in) {
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  for (size_t i = 0; i < in.size();) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp;
    int len = utf8::decode(p + i, in.size() - i, &cp);
    if (len == 0) {
      ++i;
      continue;
    }
    if (nfcUnsafe(cp)) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

void appendNfc(std::string_view in, std::string* out) {
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = in.size();
  size_t copied = 0;     // in[0, copied) is already in *out
  size_t last_safe = 0;  // start of the last safe code point (a possible composition starter)
  bool have_safe = false;
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      last_safe = i;
      have_safe = true;
      ++i;
      continue;
    }
    uint32_t cp;
    int len = utf8::decode(p + i, n - i, &cp);
    if (len == 0) {  // invalid byte: passes through, acts as a boundary
      have_safe = false;
      ++i;
      continue;
    }
    if (!nfcUnsafe(cp)) {
      last_safe = i;
      have_safe = true;
      i += static_cast<size_t>(len);
      continue;
    }
    // Unsafe: the segment runs from the preceding safe starter to the next safe code point.
    const size_t seg_begin = have_safe ? last_safe : i;
    size_t j = i + static_cast<size_t>(len);
    while (j < n) {
      uint32_t c2;
      int l2 = p[j] < 0x80 ? 1 : utf8::decode(p + j, n - j, &c2);
      if (p[j] < 0x80) c2 = p[j];
      if (l2 == 0 || !nfcUnsafe(c2)) break;
      j += static_cast<size_t>(l2);
    }
    out->append(in.data() + copied, seg_begin - copied);
    nfcSegment(in.substr(seg_begin, j - seg_begin), out);
    copied = j;
    have_safe = false;
    i = j;
  }
  out->append(in.data() + copied, n - copied);
}

}  // namespace garden::ivy::unicode
