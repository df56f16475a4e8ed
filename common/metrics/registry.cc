#include "common/metrics/registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <type_traits>

#include "common/status.h"

namespace garden::metrics {
namespace {

bool validMetricName(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool validLabelName(std::string_view n) {
  if (n.empty() || n.starts_with("__")) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// Sample values: shortest round-trip, with the exposition format's spellings of non-finite values.
void appendValue(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else {
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    out.append(buf, r.ptr);
  }
}

void appendUint(std::string& out, uint64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

// HELP text escaping: backslash and newline.
void appendHelp(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

// Label value escaping: backslash, double quote and newline.
void appendLabelValue(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

// Writes `{a="x",b="y"` (or `{` when there are no labels, or nothing when `open_only` is false and
// there are no labels). The caller closes the brace.
void appendLabels(std::string& out, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, std::string_view extra_name = {},
                  std::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return;
  out += '{';
  for (size_t i = 0; i < names.size(); ++i) {
    if (i != 0) out += ',';
    out += names[i];
    out += "=\"";
    appendLabelValue(out, values[i]);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
}

void appendHeader(std::string& out, const FamilyBase& f) {
  out += "# HELP ";
  out += f.name();
  out += ' ';
  appendHelp(out, f.help());
  out += "\n# TYPE ";
  out += f.name();
  out += ' ';
  out += f.typeName();
  out += '\n';
}

void validateBuckets(const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    CHECK_MSG(std::isfinite(bounds[i]),
              "histogram bucket bounds must be finite (+Inf is implicit)");
    if (i > 0) CHECK_MSG(bounds[i - 1] < bounds[i], "histogram buckets must strictly increase");
  }
}

}  // namespace

// ---- children ----------------------------------------------------------------------------------

void Counter::inc(double amount) {
  CHECK_MSG(amount >= 0, "Counter::inc with a negative or NaN amount");
  value_.fetch_add(amount, std::memory_order_relaxed);
}

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds.size() + 1]) {
  validateBuckets(bounds_);
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  size_t i = std::isnan(v)
                 ? bounds_.size()
                 : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                                       bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

const std::vector<double>& defaultLatencyBuckets() {
  static const auto* buckets = new std::vector<double>{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return *buckets;
}

std::vector<double> linearBuckets(double start, double width, int count) {
  CHECK_MSG(count >= 1 && width > 0, "linearBuckets needs count >= 1 and width > 0");
  std::vector<double> b;
  for (int i = 0; i < count; ++i) b.push_back(start + width * i);
  return b;
}

std::vector<double> exponentialBuckets(double start, double factor, int count) {
  CHECK_MSG(count >= 1 && start > 0 && factor > 1,
            "exponentialBuckets needs count >= 1, start > 0 and factor > 1");
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i) {
    b.push_back(v);
    v *= factor;
  }
  return b;
}

// ---- families ----------------------------------------------------------------------------------

template <typename T>
Family<T>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> buckets)
    : FamilyBase(std::is_same_v<T, Counter> ? "counter"
                 : std::is_same_v<T, Gauge> ? "gauge"
                                            : "histogram",
                 std::move(name), std::move(help), std::move(label_names)),
      buckets_(std::move(buckets)) {
  if (label_names_.empty()) labelsImpl({});
}

template <typename T>
T& Family<T>::labels(std::initializer_list<std::string_view> values) {
  CHECK_MSG(values.size() == label_names_.size(), "labels(): wrong number of label values");
  std::vector<std::string> key;
  key.reserve(values.size());
  for (std::string_view v : values) key.emplace_back(v);
  return labelsImpl(std::move(key));
}

template <typename T>
T& Family<T>::labels(const std::vector<std::string>& values) {
  CHECK_MSG(values.size() == label_names_.size(), "labels(): wrong number of label values");
  return labelsImpl(values);
}

template <typename T>
T& Family<T>::labelsImpl(std::vector<std::string> key) {
  MutexLock lock(mu_);
  auto it = children_.find(key);
  if (it != children_.end()) return *it->second;
  std::unique_ptr<T> child;
  if constexpr (std::is_same_v<T, Histogram>) {
    child = std::make_unique<Histogram>(buckets_);
  } else {
    child = std::make_unique<T>();
  }
  T& ref = *child;
  children_.emplace(std::move(key), std::move(child));
  return ref;
}

template <typename T>
void Family<T>::expose(std::string& out) const {
  MutexLock lock(mu_);
  if (children_.empty()) return;
  appendHeader(out, *this);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      Histogram::Snapshot s = child->snapshot();
      std::string le;
      for (size_t i = 0; i <= s.bounds.size(); ++i) {
        le.clear();
        if (i < s.bounds.size()) {
          appendValue(le, s.bounds[i]);
        } else {
          le = "+Inf";
        }
        out += name_;
        out += "_bucket";
        appendLabels(out, label_names_, values, "le", le);
        out += ' ';
        appendUint(out, s.cumulative[i]);
        out += '\n';
      }
      out += name_;
      out += "_sum";
      appendLabels(out, label_names_, values);
      out += ' ';
      appendValue(out, s.sum);
      out += '\n';
      out += name_;
      out += "_count";
      appendLabels(out, label_names_, values);
      out += ' ';
      appendUint(out, s.count);
      out += '\n';
    } else {
      out += name_;
      appendLabels(out, label_names_, values);
      out += ' ';
      appendValue(out, child->value());
      out += '\n';
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- registry ----------------------------------------------------------------------------------

Registry::Registry() = default;
Registry::~Registry() = default;

Registry& Registry::global() {
  static auto* registry = new Registry();
  return *registry;
}

namespace {
// The sample names a family of this type writes (besides its own name in HELP/TYPE).
std::vector<std::string> seriesNames(std::string_view type, const std::string& name) {
  if (type == "histogram") return {name, name + "_bucket", name + "_sum", name + "_count"};
  return {name};
}
}  // namespace

template <typename T>
Family<T>& Registry::registerFamily(std::string_view name, std::string_view help,
                                    std::initializer_list<std::string_view> label_names,
                                    std::vector<double> buckets) {
  CHECK_MSG(validMetricName(name), "invalid metric name (want [a-zA-Z_:][a-zA-Z0-9_:]*)");
  std::vector<std::string> labels;
  for (std::string_view l : label_names) {
    CHECK_MSG(validLabelName(l), "invalid label name (want [a-zA-Z_][a-zA-Z0-9_]*, no __ prefix)");
    if constexpr (std::is_same_v<T, Histogram>) {
      CHECK_MSG(l != "le", "histogram label name 'le' is reserved");
    }
    for (const std::string& prev : labels) CHECK_MSG(prev != l, "duplicate label name");
    labels.emplace_back(l);
  }
  if constexpr (std::is_same_v<T, Histogram>) validateBuckets(buckets);

  MutexLock lock(mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    auto* existing = dynamic_cast<Family<T>*>(it->second.get());
    CHECK_MSG(existing != nullptr, "metric registered twice with different types");
    CHECK_MSG(existing->help() == help && existing->labelNames() == labels &&
                  existing->buckets_ == buckets,
              "metric registered twice with different help, labels or buckets");
    return *existing;
  }
  // Collisions between the series names of different families (e.g. gauge "x_count" and
  // histogram "x").
  std::string name_str(name);
  std::string_view type = std::is_same_v<T, Histogram> ? "histogram" : "scalar";
  std::set<std::string> mine;
  for (auto& s : seriesNames(type, name_str)) mine.insert(std::move(s));
  for (const auto& [other_name, other] : families_) {
    for (const std::string& s : seriesNames(other->typeName(), other_name)) {
      CHECK_MSG(mine.count(s) == 0, "metric name collides with the series of another metric");
    }
  }
  auto* family = new Family<T>(name_str, std::string(help), std::move(labels), std::move(buckets));
  families_.emplace(name_str, std::unique_ptr<FamilyBase>(family));
  return *family;
}

CounterFamily& Registry::counter(std::string_view name, std::string_view help,
                                 std::initializer_list<std::string_view> label_names) {
  return registerFamily<Counter>(name, help, label_names, {});
}

GaugeFamily& Registry::gauge(std::string_view name, std::string_view help,
                             std::initializer_list<std::string_view> label_names) {
  return registerFamily<Gauge>(name, help, label_names, {});
}

HistogramFamily& Registry::histogram(std::string_view name, std::string_view help,
                                     std::initializer_list<std::string_view> label_names,
                                     const std::vector<double>& buckets) {
  return registerFamily<Histogram>(name, help, label_names, buckets);
}

std::string Registry::expose() const {
  std::string out;
  MutexLock lock(mu_);
  for (const auto& [name, family] : families_) family->expose(out);
  return out;
}

}  // namespace garden::metrics
