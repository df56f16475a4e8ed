#pragma once
// A bounded LRU of compiled things, keyed by 64-bit hashes: ivy keeps schema text -> serialized
// grammar, tulip keeps grammar hash -> CompiledGrammar (token tables are the costly part). A
// value is built outside the lock by the caller on a miss; concurrent misses of one key may both
// build (the later put wins; both results are equal).
//
// Threads: all methods are thread-safe.

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace garden::grammar {

template <typename V>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  std::optional<V> get(uint64_t key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++misses_;
      return std::nullopt;
    }
    order_.splice(order_.begin(), order_, it->second);
    ++hits_;
    return it->second->second;
  }

  void put(uint64_t key, V value) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      it->second->second = std::move(value);
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    while (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return order_.size();
  }
  uint64_t hits() const {
    std::lock_guard<std::mutex> lock(mu_);
    return hits_;
  }
  uint64_t misses() const {
    std::lock_guard<std::mutex> lock(mu_);
    return misses_;
  }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::pair<uint64_t, V>> order_;
  std::unordered_map<uint64_t, typename std::list<std::pair<uint64_t, V>>::iterator> index_;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

// 64-bit FNV-1a.
inline uint64_t fnv1a64(std::string_view s, uint64_t h = 1469598103934665603ULL) {
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace garden::grammar
