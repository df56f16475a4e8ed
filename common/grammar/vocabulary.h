#pragma once
// The token vocabulary as the grammar sees it: the bytes each id stands for, which ids may ever
// appear inside grammar-constrained text (special/reserved ids and ids with no bytes never may),
// and the ids sorted by their bytes with the common-prefix length of each with its predecessor,
// so a walk over the sorted list consumes each shared prefix once (the token trie, flattened).
//
// Threads: immutable after construction; share one per model.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace garden::grammar {

class Vocabulary {
 public:
  // tokens[id] = the id's bytes. `excluded[id]` != 0: never allowed inside a grammar (special,
  // reserved); ids with empty bytes are excluded too. `excluded` may be empty (none).
  Vocabulary(std::vector<std::string> tokens, const std::vector<uint8_t>& excluded);

  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  std::string_view bytes(int32_t id) const { return tokens_[static_cast<size_t>(id)]; }
  bool eligible(int32_t id) const { return eligible_[static_cast<size_t>(id)] != 0; }
  // Eligible ids sorted by bytes; lcp(i) = common prefix length of sorted(i) and sorted(i - 1).
  int32_t numSorted() const { return static_cast<int32_t>(sorted_.size()); }
  int32_t sorted(int32_t i) const { return sorted_[static_cast<size_t>(i)]; }
  int32_t lcp(int32_t i) const { return lcp_[static_cast<size_t>(i)]; }
  // bytes(sorted(i)), from one buffer laid out in sorted order (walks stay sequential in memory).
  std::string_view sortedBytes(int32_t i) const {
    const auto k = static_cast<size_t>(i);
    return {sorted_bytes_.data() + sorted_off_[k], sorted_off_[k + 1] - sorted_off_[k]};
  }
  // The tokens sharing the first `len` bytes of sorted(i), where i is the first of them
  // (lcp(i) < len <= its length), are sorted(i .. prefixEnd(i, len) - 1): the subtree of that
  // trie node.
  int32_t prefixEnd(int32_t i, size_t len) const {
    const auto k = static_cast<size_t>(i);
    return group_end_[group_off_[k] + (len - static_cast<size_t>(lcp_[k]) - 1)];
  }
  size_t maxTokenBytes() const { return max_len_; }
  // Bitmask words (bit id % 32 of word id / 32) with every eligible id set.
  const std::vector<uint32_t>& eligibleMask() const { return eligible_mask_; }
  size_t maskWords() const { return eligible_mask_.size(); }

 private:
  std::vector<std::string> tokens_;
  std::vector<uint8_t> eligible_;
  std::vector<int32_t> sorted_;
  std::vector<int32_t> lcp_;
  std::string sorted_bytes_;
  std::vector<uint32_t> sorted_off_;
  std::vector<uint32_t> group_off_;  // per sorted index: offset into group_end_
  std::vector<int32_t> group_end_;   // per trie node
  std::vector<uint32_t> eligible_mask_;
  size_t max_len_ = 0;
};

// Reads a Hugging Face byte-level BPE tokenizer.json (GPT-2 byte-to-unicode pieces, e.g. gpt-oss
// o200k_harmony, Qwen3): model.vocab and added_tokens. Added tokens are excluded (they are the
// special and reserved ids). `model_vocab_size` > the tokenizer's ids pads with excluded empty ids
// (gpt-oss: 201088 rows; the file names 0..200018). Errors name the file.
Result<std::shared_ptr<const Vocabulary>> loadByteLevelVocabulary(const std::string& path,
                                                                  int32_t model_vocab_size = 0);

// Token ids of added (special) tokens by content, from the same file: e.g. "<|return|>".
Result<int32_t> addedTokenId(const std::string& path, std::string_view content);

}  // namespace garden::grammar
