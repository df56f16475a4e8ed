#include "services/ivy/tokenizer/double_array.h"

#include <algorithm>
#include <cstring>

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

// The one darts-clone walk [TAG_DARTS_WALK]: follows `key` byte by byte from the root and calls
// on_leaf(length, value) at every key that is a prefix of it, shortest first, until on_leaf
// returns false. Returns the number of bytes walked (key.size() when the whole key is a path).
template <typename OnLeaf>
size_t dartsWalk(std::span<const uint32_t> units, std::string_view key, OnLeaf on_leaf) {
  if (units.empty()) return 0;
  size_t node = dartsOffset(units[0]);
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    node ^= c;
    if (node >= units.size()) return i;
    const uint32_t unit = units[node];
    if (dartsLabel(unit) != c) return i;
    node ^= dartsOffset(unit);
    if (node >= units.size()) return i;
    if (dartsHasLeaf(unit) && !on_leaf(i + 1, dartsValue(units[node]))) return i + 1;
  }
  return key.size();
}

// The last (longest) or first (shortest) key on the walk that is a prefix of `key`.
size_t dartsPrefix(std::span<const uint32_t> units, std::string_view key, uint32_t* value,
                   bool shortest) {
  size_t found = 0;
  dartsWalk(units, key, [&](size_t len, uint32_t v) {
    found = len;
    *value = v;
    return !shortest;
  });
  return found;
}

}  // namespace

size_t DartsView::longestPrefix(std::string_view key, uint32_t* value) const {
  return dartsPrefix(units_, key, value, /*shortest=*/false);
}

size_t DartsView::shortestPrefix(std::string_view key, uint32_t* value) const {
  return dartsPrefix(units_, key, value, /*shortest=*/true);
}

bool DartsView::hasPath(std::string_view key) const {
  return !units_.empty() && dartsWalk(units_, key, [](size_t, uint32_t) { return true; }) ==
                                key.size();
}

bool DartsView::hasPrefixByte(unsigned char c) const {
  return hasPath(std::string_view(reinterpret_cast<const char*>(&c), 1));
}

Result<PrecompiledCharsmap> parsePrecompiledCharsmap(std::string_view blob) {
  if (blob.size() <= 4) return invalidArgument("precompiled charsmap is too short");
  uint32_t trie_size = 0;
  std::memcpy(&trie_size, blob.data(), 4);
  if (trie_size >= blob.size() - 4 || trie_size % 4 != 0) {
    return invalidArgument("precompiled charsmap trie size exceeds the blob");
  }
  PrecompiledCharsmap out;
  out.units.resize(trie_size / 4);
  std::memcpy(out.units.data(), blob.data() + 4, trie_size);
  out.normalized = std::string(blob.substr(4 + trie_size));
  return out;
}

}  // namespace garden::ivy
