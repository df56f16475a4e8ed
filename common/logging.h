#pragma once
// Structured logging: one JSON object per event, one line, written to stderr (fd 2) with a single
// write(2) so concurrent lines never interleave. Example line:
//   {"ts":"2026-11-30T02:51:11.123Z","level":"info","svc":"tulip","msg":"request",
//    "request_id":"abc","latency_us":812}
// Key order is fixed: ts, level, svc, msg, then the caller's fields in the order given. Fields
// named like the fixed keys are written as given (duplicates are the caller's problem).
//
// Usage:
//   garden::log::setService("tulip");                       // once, at startup
//   garden::log::info("request", {{"request_id", id}, {"tokens", 12}, {"ok", true}});
//   if (garden::log::enabled(garden::log::Level::kDebug)) { ...expensive... }
//
// Threads: every function may be called from any thread. setService/setLevel may be called at any
// time (the level is an atomic; the service name is swapped atomically and old names are kept
// alive). setSinkForTesting is for tests only and must not race with logging threads.
// A disabled level costs one relaxed atomic load (the fields are still constructed by the caller,
// which is cheap: they are views).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "common/status.h"

namespace garden::log {

enum class Level : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// "debug" | "info" | "warn" (or "warning") | "error" | "off", case-insensitive.
Result<Level> parseLevel(std::string_view name);
std::string_view levelName(Level level);  // "debug", "info", "warn", "error", "off"

void setService(std::string_view service);  // default "garden"
std::string service();
void setLevel(Level level);  // default kInfo
Level level();

namespace internal {
extern std::atomic<int> g_level;
}  // namespace internal

inline bool enabled(Level l) {
  return static_cast<int>(l) >= internal::g_level.load(std::memory_order_relaxed);
}

// One key → value pair. Holds views: it must not outlive the expression it is built in.
// Values: strings (string_view / const char* / std::string), integers, floating point, bool,
// nullptr (JSON null) and Status (written as its toString()). Numbers are written by JsonWriter
// (floats in shortest float form, NaN/Inf become null).
class Field {
 public:
  enum class Kind : uint8_t { kString, kInt, kUint, kDouble, kFloat, kBool, kNull, kStatus };

  Field(std::string_view k, std::string_view v) : key_(k), kind_(Kind::kString), s_(v) {}
  Field(std::string_view k, const char* v) : key_(k), kind_(Kind::kString), s_(v) {}
  Field(std::string_view k, const std::string& v) : key_(k), kind_(Kind::kString), s_(v) {}
  Field(std::string_view k, bool v) : key_(k), kind_(Kind::kBool), b_(v) {}
  Field(std::string_view k, double v) : key_(k), kind_(Kind::kDouble), d_(v) {}
  Field(std::string_view k, float v) : key_(k), kind_(Kind::kFloat), f_(v) {}
  Field(std::string_view k, std::nullptr_t) : key_(k), kind_(Kind::kNull) {}
  // Status: written as st.toString() ("OK" or "CODE: message"). Holds a pointer, so the Status
  // must outlive the field (true for named variables and temporaries in the same expression).
  Field(std::string_view k, const Status& st) : key_(k), kind_(Kind::kStatus), st_(&st) {}
  template <typename T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool>) Field(std::string_view k, T v)
      : key_(k) {
    if constexpr (std::is_signed_v<T>) {
      kind_ = Kind::kInt;
      i_ = static_cast<int64_t>(v);
    } else {
      kind_ = Kind::kUint;
      u_ = static_cast<uint64_t>(v);
    }
  }

  std::string_view key() const { return key_; }
  Kind kind() const { return kind_; }
  std::string_view str() const { return s_; }
  int64_t i() const { return i_; }
  uint64_t u() const { return u_; }
  double d() const { return d_; }
  float f() const { return f_; }
  bool b() const { return b_; }
  const Status& status() const { return *st_; }

 private:
  std::string_view key_;
  Kind kind_ = Kind::kNull;
  std::string_view s_;
  union {
    int64_t i_;
    uint64_t u_;
    double d_;
    float f_;
    bool b_;
    const Status* st_ = nullptr;
  };
};

using Fields = std::initializer_list<Field>;

// Formats and writes one line if `l` is enabled.
void write(Level l, std::string_view msg, Fields fields);
// Same, for a field list built at run time (e.g. a std::vector<Field>).
void writeFields(Level l, std::string_view msg, std::span<const Field> fields);

inline void debug(std::string_view msg, Fields fields = {}) {
  if (enabled(Level::kDebug)) write(Level::kDebug, msg, fields);
}
inline void info(std::string_view msg, Fields fields = {}) {
  if (enabled(Level::kInfo)) write(Level::kInfo, msg, fields);
}
inline void warn(std::string_view msg, Fields fields = {}) {
  if (enabled(Level::kWarn)) write(Level::kWarn, msg, fields);
}
inline void error(std::string_view msg, Fields fields = {}) {
  if (enabled(Level::kError)) write(Level::kError, msg, fields);
}

// Formats one line (with trailing '\n') exactly as write() would; for tests and for callers that
// want to ship lines elsewhere. `ts` is rendered as UTC with millisecond precision.
std::string formatLine(Level l, std::string_view service, std::string_view msg, Fields fields,
                       std::chrono::system_clock::time_point ts);
// "2026-11-30T02:51:11.123Z"
std::string formatTimestamp(std::chrono::system_clock::time_point ts);

// Redirects lines (each with its trailing '\n') to `sink` instead of fd 2; an empty function
// restores stderr. Tests only: not synchronized with concurrent write().
void setSinkForTesting(std::function<void(std::string_view line)> sink);

}  // namespace garden::log
