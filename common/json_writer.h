#pragma once
// JsonWriter: a small, fast, streaming JSON writer that appends to a std::string. Used by ivy for
// every response body and by common/logging for every log line, so it does no allocation beyond
// growing the output string and never validates structure at run time beyond a debug depth count.
//
// Output contract:
//   * Strings are fully escaped: `"` `\` and every control character U+0000..U+001F (as \b \f \n
//     \r \t or \u00XX). Valid UTF-8 passes through byte for byte (including U+007F, U+2028/9).
//     Invalid UTF-8 (stray continuation bytes, truncated or overlong sequences, surrogates, code
//     points above U+10FFFF) is replaced by U+FFFD per maximal invalid subpart, so the output is
//     always valid UTF-8 JSON.
//   * double / float use std::to_chars shortest round-trip form for *that* type (floats through
//     common/float_chars.h: the same characters, faster) (a float 0.1f
//     writes "0.1", not "0.10000000149011612"), so parsing the text back as the same type gives
//     the identical value. Integral-valued finite numbers are written without exponent or
//     fraction when to_chars chooses so ("3", "-0", "1e+21"). A double of magnitude >= 2^53 is
//     always written with an exponent ("3.3935263963869905e+19", never a 20-digit integer), so
//     parsers that read exponent-free numbers as int64/uint64 accept it. (Floats never need this.)
//   * NaN, +Inf and -Inf are not representable in JSON: they are written as `null`.
//   * Integers are written exactly (int64 / uint64 range).
// The writer tracks only whether a comma is needed; calling methods in an order that does not
// form JSON (e.g. key() inside an array) produces invalid output, which is a caller bug.
//
// Thread-compatible: one writer per thread. Not copyable or movable (it may point at a caller's
// string).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "common/status.h"

namespace garden {

class JsonWriter {
 public:
  // Writes into an internal string; take it with take() or view it with view().
  JsonWriter();
  // Appends to *out (which must outlive the writer). Existing content is kept.
  explicit JsonWriter(std::string* out);
  JsonWriter(const JsonWriter&) = delete;
  JsonWriter& operator=(const JsonWriter&) = delete;

  JsonWriter& beginObject();
  JsonWriter& endObject();
  JsonWriter& beginArray();
  JsonWriter& endArray();
  // Object member name; the next call must write its value.
  JsonWriter& key(std::string_view k);

  JsonWriter& value(std::string_view s);
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(bool b);
  JsonWriter& value(double d);
  JsonWriter& value(float f);
  template <typename T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool> &&
           !std::is_same_v<T, char>) JsonWriter& value(T i) {
    if constexpr (std::is_signed_v<T>) {
      return valueInt(static_cast<int64_t>(i));
    } else {
      return valueUint(static_cast<uint64_t>(i));
    }
  }
  JsonWriter& null();
  // Appends `json` verbatim as one value (caller guarantees it is valid JSON).
  JsonWriter& raw(std::string_view json);

  // key(k) followed by value(v) / null().
  template <typename T>
  JsonWriter& field(std::string_view k, const T& v) {
    key(k);
    return value(v);
  }
  JsonWriter& nullField(std::string_view k) {
    key(k);
    return null();
  }

  // Arrays of numbers in one call (the embeddings hot path).
  JsonWriter& floatArray(std::span<const float> values);
  JsonWriter& doubleArray(std::span<const double> values);
  JsonWriter& intArray(std::span<const int32_t> values);

  // Reserves room for `n` more bytes of output.
  void reserve(size_t n) { out_->reserve(out_->size() + n); }
  // Depth of open containers; 0 once the document is complete.
  int depth() const { return depth_; }
  std::string_view view() const { return *out_; }
  // Moves the output out (internal-string mode) or copies it (external mode); resets the writer.
  std::string take();
  void clear();

  // Building blocks, usable without a writer.
  // Appends `"` + escaped s + `"`.
  static void appendQuoted(std::string& out, std::string_view s);
  // Appends escaped s without quotes.
  static void appendEscaped(std::string& out, std::string_view s);
  // Appends the shortest round-trip form, or `null` for NaN/Inf.
  static void appendDouble(std::string& out, double d);
  static void appendFloat(std::string& out, float f);

 private:
  JsonWriter& valueInt(int64_t i);
  JsonWriter& valueUint(uint64_t u);
  void comma() {
    if (need_comma_) out_->push_back(',');
  }

  std::string own_;
  std::string* out_;
  bool need_comma_ = false;
  int depth_ = 0;
};

// Base64 (RFC 4648 §4: standard alphabet A-Z a-z 0-9 + /, '=' padding, no line breaks).
// Used for `encoding_format: "base64"` (little-endian float32 bytes).
std::string base64Encode(std::string_view bytes);
void appendBase64(std::string& out, const void* data, size_t size);
// Strict decoder: requires padding to a multiple of 4 and rejects any character outside the
// alphabet (no whitespace) with INVALID_ARGUMENT naming the offset.
Result<std::string> base64Decode(std::string_view text);

}  // namespace garden
