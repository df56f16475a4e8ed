#pragma once
// Prometheus metrics: Counter, Gauge and Histogram, each registered as a *family* with label
// names; a child per label-value tuple. Registry::expose() writes the text exposition format
// 0.0.4 (what GET /metrics serves, with kExpositionContentType).
//
//   auto& requests = garden::metrics::Registry::global().counter(
//       "garden_requests_total", "HTTP requests by route and status", {"route", "status"});
//   requests.labels({"/v1/embeddings", "200"}).inc();
//   auto& latency = registry.histogram("garden_request_seconds", "Request latency", {"route"});
//   { garden::metrics::ScopedTimer t(latency.labels({"/v1/embeddings"})); ... }
//
// Threads: everything is thread-safe. The hot path (inc/set/observe on a child) is lock-free
// (relaxed atomics; doubles via CAS). Registering a family and looking up a child by labels take a
// mutex, so hot code should look a child up once and keep the reference: families and children
// have stable addresses and live as long as their registry (the global one is never destroyed).
//
// Registration rules (violations are programming errors and CHECK-fail):
//   * metric names match [a-zA-Z_:][a-zA-Z0-9_:]*; label names match [a-zA-Z_][a-zA-Z0-9_]*, do
//     not start with "__", are unique within a family, and a histogram may not use "le";
//   * registering an existing name again returns the same family when type, help, label names
//     (and buckets) are identical, and CHECK-fails otherwise;
//   * a name may not collide with the series another family writes (a histogram "x" owns x_bucket,
//     x_sum and x_count);
//   * histogram buckets are finite and strictly increasing (+Inf is implicit);
//   * labels(...) must be given exactly as many values as the family has label names.
// Label values may be any bytes; they are escaped (\\ \" \n) on exposition.
// Naming conventions (not enforced here, but `promtool check metrics` rejects violations, so a
// scrape-and-lint test of a binary's /metrics fails on them): counters end in `_total`; names use
// base units (`_seconds`, `_bytes`, never `_milliseconds`); help text is non-empty; prefix
// with the service (`tulip_`, `ivy_`, `rose_`) or `garden_`.
// Counter::inc with a negative or NaN amount CHECK-fails (counters only go up).
//
// Exposition: families sorted by name, children sorted by label values; a family with label names
// but no children yet is omitted; a family without label names always has its one child (value 0
// until touched). Values use the shortest round-trip double form, "+Inf", "-Inf", "NaN".
// Histogram _count equals the +Inf bucket in every exposition (both come from the same counts).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/mutex.h"

namespace garden::metrics {

inline constexpr std::string_view kExpositionContentType =
    "text/plain; version=0.0.4; charset=utf-8";

class Counter {
 public:
  void inc(double amount = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void inc(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void dec(double amount = 1.0) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // `bounds`: finite, strictly increasing upper bounds (le, inclusive); +Inf is added implicitly.
  explicit Histogram(const std::vector<double>& bounds);

  // NaN counts in the +Inf bucket (and makes the sum NaN), as in the Go client.
  void observe(double v);

  struct Snapshot {
    std::vector<double> bounds;        // without +Inf
    std::vector<uint64_t> cumulative;  // size bounds.size() + 1; last is the +Inf bucket == count
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1, not cumulative
  std::atomic<double> sum_{0.0};
};

// Default latency buckets in seconds: 0.0005 … 60.
const std::vector<double>& defaultLatencyBuckets();
// start, start+width, …, count bounds.
std::vector<double> linearBuckets(double start, double width, int count);
// start, start*factor, …, count bounds (start > 0, factor > 1).
std::vector<double> exponentialBuckets(double start, double factor, int count);

class Registry;

// Type-erased family base, used by the registry for exposition.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& labelNames() const { return label_names_; }
  // "counter", "gauge" or "histogram".
  std::string_view typeName() const { return type_; }
  // Appends HELP, TYPE and the samples (nothing when there are no children).
  virtual void expose(std::string& out) const = 0;

 protected:
  FamilyBase(std::string_view type, std::string name, std::string help,
             std::vector<std::string> label_names)
      : type_(type),
        name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)) {}
  std::string_view type_;
  std::string name_;
  std::string help_;
  std::vector<std::string> label_names_;
};

// A family of T (Counter, Gauge or Histogram) children keyed by label values.
template <typename T>
class Family final : public FamilyBase {
 public:
  // The child for these label values (created on first use). Takes a lock; cache the result.
  T& labels(std::initializer_list<std::string_view> values) EXCLUDES(mu_);
  T& labels(const std::vector<std::string>& values) EXCLUDES(mu_);
  // The only child of a family declared without label names.
  T& get() EXCLUDES(mu_) { return labels({}); }

  void expose(std::string& out) const override EXCLUDES(mu_);

 private:
  friend class Registry;
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> buckets);
  T& labelsImpl(std::vector<std::string> key) EXCLUDES(mu_);

  std::vector<double> buckets_;  // histograms only
  mutable Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ GUARDED_BY(mu_);
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The process-wide registry (never destroyed; safe to use from static destructors).
  static Registry& global();

  CounterFamily& counter(std::string_view name, std::string_view help,
                         std::initializer_list<std::string_view> label_names = {}) EXCLUDES(mu_);
  GaugeFamily& gauge(std::string_view name, std::string_view help,
                     std::initializer_list<std::string_view> label_names = {}) EXCLUDES(mu_);
  HistogramFamily& histogram(std::string_view name, std::string_view help,
                             std::initializer_list<std::string_view> label_names = {},
                             const std::vector<double>& buckets = defaultLatencyBuckets())
      EXCLUDES(mu_);

  // Text exposition format 0.0.4. Takes mu_, then each family's lock (in that order).
  std::string expose() const EXCLUDES(mu_);

 private:
  template <typename T>
  Family<T>& registerFamily(std::string_view name, std::string_view help,
                            std::initializer_list<std::string_view> label_names,
                            std::vector<double> buckets) EXCLUDES(mu_);

  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>, std::less<>> families_ GUARDED_BY(mu_);
};

// Observes the elapsed wall time (steady clock, seconds) into a histogram child when it goes out
// of scope, unless stop() or cancel() was called first.
class ScopedTimer {
 public:
  explicit ScopedTimer(Histogram& h) : h_(&h), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    if (h_ != nullptr) h_->observe(elapsedSeconds());
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

  double elapsedSeconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  // Observes now and returns the seconds observed; the destructor then does nothing.
  double stop() {
    double s = elapsedSeconds();
    if (h_ != nullptr) h_->observe(s);
    h_ = nullptr;
    return s;
  }
  void cancel() { h_ = nullptr; }

 private:
  Histogram* h_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace garden::metrics
