#include "common/json_writer.h"

#include "common/float_chars.h"

#include <charconv>
#include <cmath>
#include <cstring>

namespace garden {
namespace {

constexpr char kHex[] = "0123456789abcdef";

// 1 for bytes that need escaping in a JSON string or start a non-ASCII sequence (checked by the
// UTF-8 validator); 0 for ASCII that is copied verbatim.
struct SpecialTable {
  bool special[256];
  constexpr SpecialTable() : special() {
    for (int c = 0; c < 256; ++c) special[c] = c < 0x20 || c == '"' || c == '\\' || c >= 0x80;
  }
};
constexpr SpecialTable kSpecial;

// Length of the valid UTF-8 sequence starting at p (lead byte >= 0x80), or 0 if invalid. On 0,
// *skip is the length of the maximal invalid subpart to replace with one U+FFFD (Unicode §3.9,
// "U+FFFD substitution of maximal subparts").
size_t utf8Sequence(const unsigned char* p, const unsigned char* end, size_t* skip) {
  unsigned char c = p[0];
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // no overlong
    if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    *skip = 1;  // continuation byte without lead, C0/C1, F5..FF
    return 0;
  }
  size_t avail = static_cast<size_t>(end - p);
  size_t i = 1;
  if (i >= avail || p[1] < lo || p[1] > hi) {
    *skip = 1;
    return 0;
  }
  for (i = 2; i < n; ++i) {
    if (i >= avail || (p[i] & 0xC0) != 0x80) {
      *skip = i;
      return 0;
    }
  }
  return n;
}

}  // namespace

JsonWriter::JsonWriter() : out_(&own_) {}
JsonWriter::JsonWriter(std::string* out) : out_(out) {}

JsonWriter& JsonWriter::beginObject() {
  comma();
  out_->push_back('{');
  need_comma_ = false;
  ++depth_;
  return *this;
}

JsonWriter& JsonWriter::endObject() {
  out_->push_back('}');
  need_comma_ = true;
  --depth_;
  return *this;
}

JsonWriter& JsonWriter::beginArray() {
  comma();
  out_->push_back('[');
  need_comma_ = false;
  ++depth_;
  return *this;
}

JsonWriter& JsonWriter::endArray() {
  out_->push_back(']');
  need_comma_ = true;
  --depth_;
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view k) {
  comma();
  appendQuoted(*out_, k);
  out_->push_back(':');
  need_comma_ = false;
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view s) {
  comma();
  appendQuoted(*out_, s);
  need_comma_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(bool b) {
  comma();
  out_->append(b ? "true" : "false");
  need_comma_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(double d) {
  comma();
  appendDouble(*out_, d);
  need_comma_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(float f) {
  comma();
  appendFloat(*out_, f);
  need_comma_ = true;
  return *this;
}

JsonWriter& JsonWriter::valueInt(int64_t i) {
  comma();
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), i);
  out_->append(buf, r.ptr);
  need_comma_ = true;
  return *this;
}

JsonWriter& JsonWriter::valueUint(uint64_t u) {
  comma();
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), u);
  out_->append(buf, r.ptr);
  need_comma_ = true;
  return *this;
}

JsonWriter& JsonWriter::null() {
  comma();
  out_->append("null");
  need_comma_ = true;
  return *this;
}

JsonWriter& JsonWriter::raw(std::string_view json) {
  comma();
  out_->append(json);
  need_comma_ = true;
  return *this;
}

JsonWriter& JsonWriter::floatArray(std::span<const float> values) {
  beginArray();
  // Written in place: a shortest float32 is at most 15 characters ("-1.1754944e-38"), "null" 4,
  // so 16 per value with its comma; the string is cut to what was written.
  const size_t start = out_->size();
  out_->resize(start + values.size() * 16);
  char* const base = out_->data();
  char* p = base + start;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i != 0) *p++ = ',';
    const float f = values[i];
    if (!std::isfinite(f)) {
      std::memcpy(p, "null", 4);
      p += 4;
      continue;
    }
    p = writeShortestFloat(p, f);
  }
  out_->resize(static_cast<size_t>(p - base));
  return endArray();
}

JsonWriter& JsonWriter::doubleArray(std::span<const double> values) {
  beginArray();
  for (size_t i = 0; i < values.size(); ++i) {
    if (i != 0) out_->push_back(',');
    appendDouble(*out_, values[i]);
  }
  return endArray();
}

JsonWriter& JsonWriter::intArray(std::span<const int32_t> values) {
  beginArray();
  out_->reserve(out_->size() + values.size() * 7 + 2);
  char buf[16];
  for (size_t i = 0; i < values.size(); ++i) {
    if (i != 0) out_->push_back(',');
    auto r = std::to_chars(buf, buf + sizeof(buf), values[i]);
    out_->append(buf, r.ptr);
  }
  return endArray();
}

std::string JsonWriter::take() {
  std::string result = out_ == &own_ ? std::move(own_) : *out_;
  clear();
  return result;
}

void JsonWriter::clear() {
  if (out_ == &own_) own_.clear();
  need_comma_ = false;
  depth_ = 0;
}

void JsonWriter::appendQuoted(std::string& out, std::string_view s) {
  out.reserve(out.size() + s.size() + 2);
  out.push_back('"');
  appendEscaped(out, s);
  out.push_back('"');
}

void JsonWriter::appendEscaped(std::string& out, std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    // Copy the longest run of plain ASCII in one append.
    const auto* run = p;
    while (p < end && !kSpecial.special[*p]) ++p;
    if (p != run) out.append(reinterpret_cast<const char*>(run), static_cast<size_t>(p - run));
    if (p == end) break;
    unsigned char c = *p;
    if (c >= 0x80) {
      size_t skip = 0;
      size_t n = utf8Sequence(p, end, &skip);
      if (n != 0) {
        out.append(reinterpret_cast<const char*>(p), n);
        p += n;
      } else {
        out.append("\xEF\xBF\xBD");  // U+FFFD
        p += skip;
      }
      continue;
    }
    ++p;
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\b':
        out.append("\\b");
        break;
      case '\f':
        out.append("\\f");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\r':
        out.append("\\r");
        break;
      case '\t':
        out.append("\\t");
        break;
      default: {
        char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
        out.append(esc, 6);
      }
    }
  }
}

void JsonWriter::appendDouble(std::string& out, double d) {
  if (!std::isfinite(d)) {
    out.append("null");
    return;
  }
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  // Shortest form may be a long integer ("33935263963869904896") that some parsers (simdjson,
  // int64-based ones) reject as out of range; beyond 2^53 force the exponent form instead.
  if (std::fabs(d) >= 9007199254740992.0 && std::memchr(buf, 'e', r.ptr - buf) == nullptr) {
    r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  }
  out.append(buf, r.ptr);
}

void JsonWriter::appendFloat(std::string& out, float f) {
  if (!std::isfinite(f)) {
    out.append("null");
    return;
  }
  char buf[32];
  out.append(buf, writeShortestFloat(buf, f));
}

// ---- base64 ----------------------------------------------------------------------------------

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

struct B64Decode {
  int8_t v[256];
  constexpr B64Decode() : v() {
    for (int i = 0; i < 256; ++i) v[i] = -1;
    for (int i = 0; i < 64; ++i) v[static_cast<unsigned char>(kB64[i])] = static_cast<int8_t>(i);
  }
};
constexpr B64Decode kB64Decode;
}  // namespace

void appendBase64(std::string& out, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  size_t old = out.size();
  out.resize(old + (size + 2) / 3 * 4);
  char* o = out.data() + old;
  size_t i = 0;
  for (; i + 3 <= size; i += 3) {
    uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8) | p[i + 2];
    o[0] = kB64[v >> 18];
    o[1] = kB64[(v >> 12) & 63];
    o[2] = kB64[(v >> 6) & 63];
    o[3] = kB64[v & 63];
    o += 4;
  }
  size_t rest = size - i;
  if (rest == 1) {
    uint32_t v = uint32_t{p[i]} << 16;
    o[0] = kB64[v >> 18];
    o[1] = kB64[(v >> 12) & 63];
    o[2] = '=';
    o[3] = '=';
  } else if (rest == 2) {
    uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8);
    o[0] = kB64[v >> 18];
    o[1] = kB64[(v >> 12) & 63];
    o[2] = kB64[(v >> 6) & 63];
    o[3] = '=';
  }
}

std::string base64Encode(std::string_view bytes) {
  std::string out;
  appendBase64(out, bytes.data(), bytes.size());
  return out;
}

Result<std::string> base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) {
    return invalidArgument("base64: length " + std::to_string(text.size()) +
                           " is not a multiple of 4");
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    bool last = i + 4 == text.size();
    int v[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      auto c = static_cast<unsigned char>(text[i + j]);
      if (c == '=' && last && j >= 2) {
        v[j] = 0;
        ++pad;
        continue;
      }
      if (pad != 0 || kB64Decode.v[c] < 0) {
        return invalidArgument("base64: invalid character at offset " + std::to_string(i + j));
      }
      v[j] = kB64Decode.v[c];
    }
    uint32_t n =
        (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    // Non-canonical encodings (bits set in the padding) are rejected.
    if ((pad == 1 && (n & 0xFF) != 0) || (pad == 2 && (n & 0xFFFF) != 0)) {
      return invalidArgument("base64: non-zero padding bits at offset " + std::to_string(i));
    }
    out.push_back(static_cast<char>(n >> 16));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xFF));
  }
  return out;
}

}  // namespace garden
