#include "services/ivy/tokenizer/double_array.h"

#include <algorithm>

namespace garden::ivy {

Status DoubleArray::build(std::vector<std::pair<std::string_view, int32_t>> keys) {
  std::sort(keys.begin(), keys.end());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].first.empty()) return invalidArgument("empty vocabulary piece");
    if (i > 0 && keys[i].first == keys[i - 1].first) {
      return invalidArgument("duplicate vocabulary piece \"" + std::string(keys[i].first) + "\"");
    }
  }
  units_.assign(256 + 1, Unit());
  units_[0].check = -2;  // the root is used and has no parent
  std::vector<uint8_t> used(units_.size(), 0);
  used[0] = 1;
  size_t first_free = 1;

  struct Task {
    int32_t node;
    size_t lo, hi, depth;
  };
  std::vector<Task> stack;
  stack.push_back({0, 0, keys.size(), 0});
  std::vector<std::pair<unsigned char, std::pair<size_t, size_t>>> children;
  while (!stack.empty()) {
    Task t = stack.back();
    stack.pop_back();
    size_t lo = t.lo;
    if (lo < t.hi && keys[lo].first.size() == t.depth) {
      units_[t.node].value = keys[lo].second;
      ++lo;
    }
    children.clear();
    for (size_t i = lo; i < t.hi;) {
      const unsigned char c = static_cast<unsigned char>(keys[i].first[t.depth]);
      size_t j = i + 1;
      while (j < t.hi && static_cast<unsigned char>(keys[j].first[t.depth]) == c) ++j;
      children.push_back({c, {i, j}});
      i = j;
    }
    if (children.empty()) continue;
    // Find a base where every child slot is free.
    while (first_free < used.size() && used[first_free]) ++first_free;
    const int32_t c0 = children[0].first;
    size_t pos = std::max<size_t>(first_free, static_cast<size_t>(c0) + 1);
    int32_t base = 0;
    for (;; ++pos) {
      if (pos + 256 >= units_.size()) {
        units_.resize(std::max(units_.size() * 2, pos + 512));
        used.resize(units_.size(), 0);
      }
      if (used[pos]) continue;
      base = static_cast<int32_t>(pos) - c0;
      bool ok = true;
      for (size_t k = 1; k < children.size(); ++k) {
        if (used[static_cast<size_t>(base + children[k].first)]) {
          ok = false;
          break;
        }
      }
      if (ok) break;
    }
    units_[t.node].base = base;
    for (auto& ch : children) {
      const size_t slot = static_cast<size_t>(base + ch.first);
      used[slot] = 1;
      units_[slot].check = t.node;
    }
    for (auto it = children.rbegin(); it != children.rend(); ++it) {
      stack.push_back({base + it->first, it->second.first, it->second.second, t.depth + 1});
    }
  }
  // Trim trailing free units but keep base + 255 in range for every node, so next() needs no
  // bounds check ([TAG_DA_PADDING]).
  size_t last = units_.size();
  while (last > 1 && !used[last - 1]) --last;
  int64_t max_base = 0;
  for (size_t i = 0; i < last; ++i) {
    if (used[i]) max_base = std::max<int64_t>(max_base, units_[i].base);
  }
  units_.resize(std::max<size_t>(last, static_cast<size_t>(max_base) + 256));
  units_.shrink_to_fit();
  return okStatus();
}

int32_t DoubleArray::find(std::string_view key) const {
  int32_t s = kRoot;
  for (char ch : key) {
    s = next(s, static_cast<unsigned char>(ch));
    if (s < 0) return -1;
  }
  return key.empty() ? -1 : value(s);
}

// darts-clone unit layout (see third_party/darts_clone/darts.h in sentencepiece).
namespace {
inline bool dartsHasLeaf(uint32_t u) { return ((u >> 8) & 1) == 1; }
inline uint32_t dartsValue(uint32_t u) { return u & ((1U << 31) - 1); }
inline uint32_t dartsLabel(uint32_t u) { return u & ((1U << 31) | 0xFF); }
inline uint32_t dartsOffset(uint32_t u) { return (u >> 10) << ((u & (1U << 9)) >> 6); }
}  // namespace

size_t DartsView::longestPrefix(std::string_view key, uint32_t* value) const {
  if (units_.empty()) return 0;
  size_t best = 0;
  size_t node = 0;
  uint32_t unit = units_[0];
  node ^= dartsOffset(unit);
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    node ^= c;
    if (node >= units_.size()) return best;
    unit = units_[node];
    if (dartsLabel(unit) != c) return best;
    node ^= dartsOffset(unit);
    if (node >= units_.size()) return best;
    if (dartsHasLeaf(unit)) {
      best = i + 1;
      *value = dartsValue(units_[node]);
    }
  }
  return best;
}

bool DartsView::hasPath(std::string_view key) const {
  if (units_.empty()) return false;
  size_t node = dartsOffset(units_[0]);
  for (char ch : key) {
    const unsigned char c = static_cast<unsigned char>(ch);
    node ^= c;
    if (node >= units_.size() || dartsLabel(units_[node]) != c) return false;
    node ^= dartsOffset(units_[node]);
    if (node >= units_.size()) return false;
  }
  return true;
}

bool DartsView::hasPrefixByte(unsigned char c) const {
  if (units_.empty()) return false;
  size_t node = dartsOffset(units_[0]) ^ c;
  if (node >= units_.size()) return false;
  return dartsLabel(units_[node]) == c;
}

}  // namespace garden::ivy
