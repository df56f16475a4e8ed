#include "common/grammar/vocabulary.h"

#include <algorithm>
#include <numeric>

#include <simdjson.h>

namespace garden::grammar {

Vocabulary::Vocabulary(std::vector<std::string> tokens, const std::vector<uint8_t>& excluded)
    : tokens_(std::move(tokens)) {
  const size_t n = tokens_.size();
  eligible_.assign(n, 0);
  eligible_mask_.assign((n + 31) / 32, 0);
  for (size_t i = 0; i < n; ++i) {
    const bool ex = i < excluded.size() && excluded[i] != 0;
    if (ex || tokens_[i].empty()) continue;
    eligible_[i] = 1;
    eligible_mask_[i / 32] |= 1u << (i % 32);
    sorted_.push_back(static_cast<int32_t>(i));
    max_len_ = std::max(max_len_, tokens_[i].size());
  }
  std::sort(sorted_.begin(), sorted_.end(), [this](int32_t a, int32_t b) {
    const auto& x = tokens_[static_cast<size_t>(a)];
    const auto& y = tokens_[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  sorted_off_.push_back(0);
  for (int32_t id : sorted_) {
    sorted_bytes_ += tokens_[static_cast<size_t>(id)];
    sorted_off_.push_back(static_cast<uint32_t>(sorted_bytes_.size()));
  }
  lcp_.assign(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i) {
    const auto& x = tokens_[static_cast<size_t>(sorted_[i - 1])];
    const auto& y = tokens_[static_cast<size_t>(sorted_[i])];
    size_t k = 0;
    while (k < x.size() && k < y.size() && x[k] == y[k]) ++k;
    lcp_[i] = static_cast<int32_t>(k);
  }
  // Trie nodes in sorted order: token i opens the nodes of depths lcp(i)+1 .. its length; a node
  // of depth d closes at the first later token whose lcp is < d.
  group_off_.resize(sorted_.size() + 1);
  size_t total = 0;
  for (size_t i = 0; i < sorted_.size(); ++i) {
    group_off_[i] = static_cast<uint32_t>(total);
    total += tokens_[static_cast<size_t>(sorted_[i])].size() - static_cast<size_t>(lcp_[i]);
  }
  group_off_[sorted_.size()] = static_cast<uint32_t>(total);
  group_end_.assign(total, static_cast<int32_t>(sorted_.size()));
  std::vector<std::pair<size_t, size_t>> open;  // (slot in group_end_, depth)
  for (size_t i = 0; i < sorted_.size(); ++i) {
    while (!open.empty() && open.back().second > static_cast<size_t>(lcp_[i])) {
      group_end_[open.back().first] = static_cast<int32_t>(i);
      open.pop_back();
    }
    const size_t len = tokens_[static_cast<size_t>(sorted_[i])].size();
    for (size_t d = static_cast<size_t>(lcp_[i]) + 1; d <= len; ++d) {
      open.emplace_back(group_off_[i] + (d - static_cast<size_t>(lcp_[i]) - 1), d);
    }
  }
}

namespace {

// Inverse of GPT-2's bytes_to_unicode: code point -> byte (-1: not a byte-level code point).
std::vector<int> byteLevelDecodeTable() {
  std::vector<int> table(324, -1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    const int cp = printable ? b : 256 + extra++;
    table[static_cast<size_t>(cp)] = b;
  }
  return table;
}

// UTF-8 piece -> bytes through the table; false when a code point is not byte-level.
bool decodePiece(std::string_view piece, const std::vector<int>& table, std::string* out) {
  out->clear();
  size_t i = 0;
  while (i < piece.size()) {
    const auto c = static_cast<uint8_t>(piece[i]);
    uint32_t cp;
    size_t len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c & 0xe0) == 0xc0 && i + 1 < piece.size()) {
      cp = ((c & 0x1fu) << 6) | (static_cast<uint8_t>(piece[i + 1]) & 0x3fu);
      len = 2;
    } else {
      return false;  // byte-level code points are all < 0x800
    }
    if (cp >= table.size() || table[cp] < 0) return false;
    out->push_back(static_cast<char>(table[cp]));
    i += len;
  }
  return true;
}

}  // namespace

Result<std::shared_ptr<const Vocabulary>> loadByteLevelVocabulary(const std::string& path,
                                                                  int32_t model_vocab_size) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto err = parser.load(path).get(doc)) {
    return invalidArgument(path + ": cannot read tokenizer.json (" +
                           std::string(simdjson::error_message(err)) + ")");
  }
  simdjson::dom::object vocab;
  if (doc["model"]["vocab"].get(vocab)) return invalidArgument(path + ": no model.vocab object");
  std::string_view type;
  if (doc["model"]["type"].get(type) || type != "BPE") {
    return invalidArgument(path + ": model.type is not BPE");
  }
  const auto table = byteLevelDecodeTable();
  std::vector<std::string> tokens;
  std::vector<uint8_t> excluded;
  auto place = [&](int64_t id) -> bool {
    if (id < 0 || id > (1 << 24)) return false;
    if (static_cast<size_t>(id) >= tokens.size()) {
      tokens.resize(static_cast<size_t>(id) + 1);
      excluded.resize(static_cast<size_t>(id) + 1, 0);
    }
    return true;
  };
  std::string bytes;
  for (auto [key, value] : vocab) {
    int64_t id;
    if (value.get(id) || !place(id)) return invalidArgument(path + ": bad id in model.vocab");
    if (!decodePiece(key, table, &bytes)) {
      return invalidArgument(path + ": piece is not byte-level: " + std::string(key));
    }
    tokens[static_cast<size_t>(id)] = bytes;
  }
  simdjson::dom::array added;
  if (!doc["added_tokens"].get(added)) {
    for (auto t : added) {
      int64_t id;
      std::string_view content;
      if (t["id"].get(id) || t["content"].get(content) || !place(id)) {
        return invalidArgument(path + ": bad added_tokens entry");
      }
      tokens[static_cast<size_t>(id)] = std::string(content);
      excluded[static_cast<size_t>(id)] = 1;
    }
  }
  if (model_vocab_size > 0) {
    if (static_cast<size_t>(model_vocab_size) < tokens.size()) {
      return invalidArgument(path + ": tokenizer has more ids than the model's vocabulary");
    }
    tokens.resize(static_cast<size_t>(model_vocab_size));
    excluded.resize(static_cast<size_t>(model_vocab_size), 1);
  }
  return std::shared_ptr<const Vocabulary>(
      std::make_shared<Vocabulary>(std::move(tokens), excluded));
}

Result<int32_t> addedTokenId(const std::string& path, std::string_view content) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.load(path).get(doc)) return invalidArgument(path + ": cannot read tokenizer.json");
  simdjson::dom::array added;
  if (doc["added_tokens"].get(added)) return notFound(path + ": no added_tokens");
  for (auto t : added) {
    int64_t id;
    std::string_view c;
    if (!t["id"].get(id) && !t["content"].get(c) && c == content) return static_cast<int32_t>(id);
  }
  return notFound(path + ": no added token " + std::string(content));
}

}  // namespace garden::grammar
