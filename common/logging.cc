#include "common/logging.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <memory>
#include <vector>

#include "common/json_writer.h"
#include "common/mutex.h"

namespace garden::log {

namespace internal {
std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
}  // namespace internal

namespace {

// The service name is replaced by publishing a new heap string. Old ones stay alive (owned by
// serviceNames(), never destroyed, so they stay reachable for LeakSanitizer) so that a concurrent
// reader never sees a freed name; setService is called a handful of times at most.
// nullptr means "garden" (constant-initialized, so logging works during static initialization).
std::atomic<const std::string*> g_service{nullptr};
Mutex g_service_mu;
std::vector<std::unique_ptr<std::string>>& serviceNames() REQUIRES(g_service_mu) {
  static auto* names = new std::vector<std::unique_ptr<std::string>>();
  return *names;
}

std::string_view currentService() {
  const std::string* s = g_service.load(std::memory_order_acquire);
  return s != nullptr ? std::string_view(*s) : std::string_view("garden");
}

std::function<void(std::string_view)>& sinkForTesting() {
  static auto* sink = new std::function<void(std::string_view)>();
  return *sink;
}

void appendTimestamp(std::string& out, std::chrono::system_clock::time_point ts) {
  using namespace std::chrono;
  auto ms_total = duration_cast<milliseconds>(ts.time_since_epoch()).count();
  auto secs = static_cast<time_t>(ms_total / 1000);
  int ms = static_cast<int>(ms_total % 1000);
  if (ms < 0) {  // before 1970: floor division
    ms += 1000;
    secs -= 1;
  }
  // gmtime_r is the expensive part; each thread caches the formatting of its last second.
  thread_local time_t cached_secs = -1;
  thread_local char cached[80];
  if (secs != cached_secs) {
    struct tm tm;
    gmtime_r(&secs, &tm);
    std::snprintf(cached, sizeof(cached), "%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    cached_secs = secs;
  }
  out.append(cached);
  char frac[6] = {'.',
                  static_cast<char>('0' + ms / 100),
                  static_cast<char>('0' + ms / 10 % 10),
                  static_cast<char>('0' + ms % 10),
                  'Z',
                  0};
  out.append(frac, 5);
}

template <typename T>
void appendInt(std::string& out, T v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

void formatInto(std::string& out, Level l, std::string_view svc, std::string_view msg,
                std::span<const Field> fields, std::chrono::system_clock::time_point ts) {
  out.append("{\"ts\":\"");
  appendTimestamp(out, ts);
  out.append("\",\"level\":\"");
  out.append(levelName(l));
  out.append("\",\"svc\":");
  JsonWriter::appendQuoted(out, svc);
  out.append(",\"msg\":");
  JsonWriter::appendQuoted(out, msg);
  for (const Field& f : fields) {
    out.push_back(',');
    JsonWriter::appendQuoted(out, f.key());
    out.push_back(':');
    switch (f.kind()) {
      case Field::Kind::kString:
        JsonWriter::appendQuoted(out, f.str());
        break;
      case Field::Kind::kInt:
        appendInt(out, f.i());
        break;
      case Field::Kind::kUint:
        appendInt(out, f.u());
        break;
      case Field::Kind::kDouble:
        JsonWriter::appendDouble(out, f.d());
        break;
      case Field::Kind::kFloat:
        JsonWriter::appendFloat(out, f.f());
        break;
      case Field::Kind::kBool:
        out.append(f.b() ? "true" : "false");
        break;
      case Field::Kind::kNull:
        out.append("null");
        break;
      case Field::Kind::kStatus:
        JsonWriter::appendQuoted(out, f.status().toString());
        break;
    }
  }
  out.append("}\n");
}

void writeAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere to report a failure to log
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool equalsLower(std::string_view a, std::string_view lower_b) {
  if (a.size() != lower_b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower_b[i]) return false;
  }
  return true;
}

}  // namespace

Result<Level> parseLevel(std::string_view name) {
  if (equalsLower(name, "debug")) return Level::kDebug;
  if (equalsLower(name, "info")) return Level::kInfo;
  if (equalsLower(name, "warn") || equalsLower(name, "warning")) return Level::kWarn;
  if (equalsLower(name, "error")) return Level::kError;
  if (equalsLower(name, "off")) return Level::kOff;
  return invalidArgument("unknown log level '" + std::string(name) +
                         "' (expected debug, info, warn, error or off)");
}

std::string_view levelName(Level level) {
  switch (level) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
    case Level::kOff:
      return "off";
  }
  return "unknown";
}

void setService(std::string_view service) {
  MutexLock lock(g_service_mu);
  auto& names = serviceNames();
  names.push_back(std::make_unique<std::string>(service));
  g_service.store(names.back().get(), std::memory_order_release);
}

std::string service() { return std::string(currentService()); }

void setLevel(Level level) {
  internal::g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

Level level() { return static_cast<Level>(internal::g_level.load(std::memory_order_relaxed)); }

void write(Level l, std::string_view msg, Fields fields) {
  writeFields(l, msg, std::span<const Field>(fields.begin(), fields.size()));
}

void writeFields(Level l, std::string_view msg, std::span<const Field> fields) {
  if (!enabled(l) || l == Level::kOff) return;
  thread_local std::string buf;
  buf.clear();
  formatInto(buf, l, currentService(), msg, fields, std::chrono::system_clock::now());
  auto& sink = sinkForTesting();
  if (sink) {
    sink(buf);
  } else {
    writeAll(2, buf.data(), buf.size());
  }
  // Don't keep a huge buffer alive per thread after an unusually long line.
  if (buf.capacity() > (64u << 10)) std::string().swap(buf);
}

std::string formatLine(Level l, std::string_view service, std::string_view msg, Fields fields,
                       std::chrono::system_clock::time_point ts) {
  std::string out;
  formatInto(out, l, service, msg, std::span<const Field>(fields.begin(), fields.size()), ts);
  return out;
}

std::string formatTimestamp(std::chrono::system_clock::time_point ts) {
  std::string out;
  appendTimestamp(out, ts);
  return out;
}

void setSinkForTesting(std::function<void(std::string_view line)> sink) {
  sinkForTesting() = std::move(sink);
}

}  // namespace garden::log
