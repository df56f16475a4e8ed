#pragma once
// A double-array trie over byte strings (keys -> int32 values), built once at tokenizer load
// and then read-only (safe from any number of threads). One transition is two array reads,
// which is what makes the unigram lattice walk and longest-prefix matching fast.
// Also: a read-only view of sentencepiece's darts-clone arrays (the precompiled normalizer).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace garden::ivy {

class DoubleArray {
 public:
  // Keys must be non-empty and unique; values >= 0. Order does not matter.
  Status build(std::vector<std::pair<std::string_view, int32_t>> keys);

  static constexpr int32_t kRoot = 0;
  // The node reached from `s` by byte `c`, or -1.
  int32_t next(int32_t s, unsigned char c) const {
    // build() pads the array so base + 255 is always inside it ([TAG_DA_PADDING]).
    const uint32_t t = static_cast<uint32_t>(units_[s].base) + c;
    return units_[t].check == s ? static_cast<int32_t>(t) : -1;
  }
  // The value stored at node `s` (a key ends there), or -1.
  int32_t value(int32_t s) const { return units_[s].value; }
  // Exact lookup; -1 when absent.
  int32_t find(std::string_view key) const;
  bool empty() const { return units_.size() <= 1; }
  // Raw arrays, for callers that pack their own node layout (the unigram lattice walk):
  // index i has base(i), check(i) (parent, or < 0 when free / the root) and value(i).
  size_t unitCount() const { return units_.size(); }
  int32_t base(size_t i) const { return units_[i].base; }
  int32_t check(size_t i) const { return units_[i].check; }

 private:
  struct Unit {
    int32_t base = 0;
    int32_t check = -1;  // parent node; -1 = free
    int32_t value = -1;
  };
  std::vector<Unit> units_ = std::vector<Unit>(257);  // an unbuilt trie matches nothing
};

// Read-only view of a darts-clone double array (sentencepiece's format): 32-bit units. Every
// lookup is one walk ([TAG_DARTS_WALK] in the .cc).
class DartsView {
 public:
  DartsView() = default;
  explicit DartsView(std::span<const uint32_t> units) : units_(units) {}
  bool empty() const { return units_.empty(); }
  // Longest key that is a prefix of `key`: returns its length (0 when none) and its value.
  size_t longestPrefix(std::string_view key, uint32_t* value) const;
  // Shortest such key (what HF's spm_precompiled takes: the first common-prefix result).
  size_t shortestPrefix(std::string_view key, uint32_t* value) const;
  // Whether some key starts with byte c.
  bool hasPrefixByte(unsigned char c) const;
  // Whether the walk over all of `key` stays inside the trie (some key starts with it).
  bool hasPath(std::string_view key) const;

 private:
  std::span<const uint32_t> units_;
};

// A precompiled normalizer blob (sentencepiece's normalizer_spec.precompiled_charsmap, HF's
// Precompiled normalizer): a little-endian uint32 trie size in bytes, the darts-clone units, then
// the replacement strings, each ending in a NUL. A value in the trie is an offset into
// `normalized`. A trie size of 0 gives an empty trie (no replacements).
struct PrecompiledCharsmap {
  std::vector<uint32_t> units;
  std::string normalized;
};
// INVALID_ARGUMENT when the blob is shorter than its header or the trie size does not fit it.
Result<PrecompiledCharsmap> parsePrecompiledCharsmap(std::string_view blob);

}  // namespace garden::ivy
