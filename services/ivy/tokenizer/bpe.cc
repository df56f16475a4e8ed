#include "services/ivy/tokenizer/bpe.h"

#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "services/ivy/tokenizer/double_array.h"
#include "services/ivy/tokenizer/pretokenize.h"
#include "services/ivy/tokenizer/tokenizer_json.h"
#include "services/ivy/tokenizer/unicode_tables.h"
#include "services/ivy/tokenizer/unigram.h"
#include "services/ivy/tokenizer/unigram_json.h"
#include "services/ivy/tokenizer/utf8.h"

namespace garden::ivy {
namespace {

inline uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

inline uint64_t hashBytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    h = mix(h ^ v) + 0x9E3779B97F4A7C15ULL;
  }
  if (i < s.size()) {
    uint64_t v = 0;
    std::memcpy(&v, s.data() + i, s.size() - i);
    h = mix(h ^ v ^ (static_cast<uint64_t>(s.size() - i) << 59));
  }
  return h == 0 ? 1 : h;
}

// GPT-2 byte-level mapping: byte -> code point (printable bytes map to themselves).
struct ByteLevelMap {
  uint32_t byte_to_cp[256];
  int16_t cp_to_byte[512];  // every mapped code point is below 512; -1 = not a byte char
  ByteLevelMap() {
    std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), -1);
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      byte_to_cp[b] = printable ? b : 256 + n++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteLevelMap& byteLevel() {
  static const ByteLevelMap m;
  return m;
}

// HF ByteLevel decoder on one token: its chars mapped back to bytes, or the token's own UTF-8
// when some char is not a byte-level char.
std::string byteLevelDecodeToken(std::string_view token) {
  const auto& m = byteLevel();
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  for (size_t i = 0; i < token.size();) {
    uint32_t cp;
    int len = utf8::decode(p + i, token.size() - i, &cp);
    if (len == 0) return std::string(token);
    if (cp >= 512 || m.cp_to_byte[cp] < 0) return std::string(token);
    out.push_back(static_cast<char>(m.cp_to_byte[cp]));
    i += static_cast<size_t>(len);
  }
  return out;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
using PieceMap = std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>>;

class BpeTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> create(const simdjson::dom::element& doc,
                                                   std::string_view name);

  TokenizerKind kind() const override { return TokenizerKind::kByteLevelBpe; }
  void encode(std::string_view text, std::vector<TokenId>* out) const override {
    encodeImpl(text, false, out);
  }
  void encodeAllowingSpecial(std::string_view text, std::vector<TokenId>* out) const override {
    encodeImpl(text, true, out);
  }
  int32_t vocabSize() const override { return static_cast<int32_t>(pieces_.size()); }
  std::optional<std::string_view> idToPiece(TokenId id) const override {
    if (id < 0 || id >= vocabSize() || !has_piece_[id]) return std::nullopt;
    return std::string_view(pieces_[id]);
  }
  std::optional<TokenId> tokenId(std::string_view piece) const override {
    auto it = piece_ids_.find(piece);
    if (it == piece_ids_.end()) return std::nullopt;
    return it->second;
  }
  bool isSpecial(TokenId id) const override {
    return id >= 0 && id < vocabSize() && special_[id];
  }
  std::vector<TokenId> specialIds() const override {
    std::vector<TokenId> ids;
    for (TokenId i = 0; i < vocabSize(); ++i) {
      if (special_[i]) ids.push_back(i);
    }
    return ids;
  }
  bool decodeStep(TokenId id, bool skip_special, DecodeState* state,
                  std::string* out) const override {
    if (id < 0 || id >= vocabSize()) return false;
    ++state->tokens;
    if (skip_special && special_[id]) return true;
    const std::string_view bytes = tokenBytes(id);
    if (state->pending.empty()) {
      const size_t before = out->size();
      const size_t keep = utf8::appendLossy(bytes, false, out);
      state->pending.assign(bytes.substr(bytes.size() - keep));
      state->emitted += out->size() - before;
    } else {
      state->pending.append(bytes);
      const size_t before = out->size();
      const size_t keep = utf8::appendLossy(state->pending, false, out);
      state->pending.erase(0, state->pending.size() - keep);
      state->emitted += out->size() - before;
    }
    return true;
  }
  void decodeFinish(DecodeState* state, std::string* out) const override {
    utf8::appendLossy(state->pending, true, out);
    state->pending.clear();
  }

 private:
  struct MergeEntry {
    uint64_t key = 0;  // left << 32 | right; 0 = empty (ids are offset by one in the key)
    uint32_t rank = 0;
    TokenId merged = -1;
  };
  struct BytesEntry {
    uint64_t hash = 0;
    TokenId id = -1;
  };

  std::string_view tokenBytes(TokenId id) const {
    return std::string_view(bytes_pool_).substr(bytes_off_[id], bytes_off_[id + 1] - bytes_off_[id]);
  }
  static uint64_t pairKey(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a) + 1) << 32) |
           (static_cast<uint32_t>(b) + 1);
  }
  const MergeEntry* findMerge(TokenId a, TokenId b) const {
    const uint64_t key = pairKey(a, b);
    size_t i = mix(key) & merge_mask_;
    while (true) {
      const MergeEntry& e = merges_[i];
      if (e.key == key) return &e;
      if (e.key == 0) return nullptr;
      i = (i + 1) & merge_mask_;
    }
  }
  // Model-vocabulary id whose raw bytes are `bytes`, or -1.
  TokenId findBytes(std::string_view bytes) const {
    const uint64_t h = hashBytes(bytes);
    size_t i = h & bytes_mask_;
    while (true) {
      const BytesEntry& e = bytes_index_[i];
      if (e.hash == 0) return -1;
      if (e.hash == h && tokenBytes(e.id) == bytes) return e.id;
      i = (i + 1) & bytes_mask_;
    }
  }

  void encodeImpl(std::string_view text, bool allow_special, std::vector<TokenId>* out) const;
  void encodeSegment(std::string_view seg, std::vector<TokenId>* out) const;
  void encodeWord(std::string_view word, std::vector<TokenId>* out) const;
  void mergeWord(std::string_view word, std::vector<TokenId>* out) const;

  uint64_t instance_ = 0;
  std::vector<std::string> pieces_;
  std::vector<uint8_t> has_piece_;
  std::vector<uint8_t> special_;
  PieceMap piece_ids_;
  std::string bytes_pool_;
  std::vector<uint32_t> bytes_off_;  // size vocabSize()+1
  std::vector<BytesEntry> bytes_index_;
  size_t bytes_mask_ = 0;
  std::vector<MergeEntry> merges_;
  size_t merge_mask_ = 0;
  TokenId byte_ids_[256];
  bool ignore_merges_ = false;
  bool nfc_ = false;
  SplitPattern pattern_ = SplitPattern::kQwen2;
  // Added tokens (leftmost-longest matching, as HF's aho-corasick).
  DoubleArray added_trie_;
  bool has_added_ = false;
  bool added_first_byte_[256] = {};
};

std::atomic<uint64_t> g_instances{1};

#define JSON_OK(expr, what)                                                           \
  if ((expr) != simdjson::SUCCESS)                                                   \
  return invalidArgument(std::string(name) + ": tokenizer.json: " + (what))

Result<std::unique_ptr<Tokenizer>> BpeTokenizer::create(const simdjson::dom::element& doc,
                                                        std::string_view name) {
  auto t = std::make_unique<BpeTokenizer>();
  t->instance_ = g_instances.fetch_add(1);
  const std::string n(name);

  // normalizer: null or NFC
  simdjson::dom::element normalizer;
  if (doc["normalizer"].get(normalizer) == simdjson::SUCCESS && !normalizer.is_null()) {
    std::string_view type;
    JSON_OK(normalizer["type"].get(type), "normalizer.type missing");
    if (type == "NFC") {
      t->nfc_ = true;
    } else {
      return invalidArgument(n + ": unsupported normalizer \"" + std::string(type) +
                             "\" (supported: none, NFC)");
    }
  }
  // pre_tokenizer: Sequence[Split(regex, Isolated), ByteLevel(add_prefix_space=false,
  // use_regex=false)]
  {
    simdjson::dom::element pre;
    JSON_OK(doc["pre_tokenizer"].get(pre), "pre_tokenizer missing");
    std::string_view type;
    JSON_OK(pre["type"].get(type), "pre_tokenizer.type missing");
    simdjson::dom::array seq;
    if (type != "Sequence" || pre["pretokenizers"].get(seq) != simdjson::SUCCESS ||
        seq.size() != 2) {
      return invalidArgument(n + ": unsupported pre_tokenizer (expected Sequence[Split, "
                                 "ByteLevel])");
    }
    simdjson::dom::element split = seq.at(0), bl = seq.at(1);
    std::string_view st, bt, behavior, regex;
    bool invert = false, add_prefix_space = true, use_regex = true;
    if (split["type"].get(st) != simdjson::SUCCESS || st != "Split" ||
        split["pattern"]["Regex"].get(regex) != simdjson::SUCCESS ||
        split["behavior"].get(behavior) != simdjson::SUCCESS || behavior != "Isolated" ||
        split["invert"].get(invert) != simdjson::SUCCESS || invert) {
      return invalidArgument(n + ": unsupported pre_tokenizer Split (expected a Regex pattern, "
                                 "Isolated, not inverted)");
    }
    if (bl["type"].get(bt) != simdjson::SUCCESS || bt != "ByteLevel" ||
        bl["add_prefix_space"].get(add_prefix_space) != simdjson::SUCCESS || add_prefix_space ||
        bl["use_regex"].get(use_regex) != simdjson::SUCCESS || use_regex) {
      return invalidArgument(n + ": unsupported pre_tokenizer ByteLevel (expected "
                                 "add_prefix_space=false, use_regex=false)");
    }
    auto pattern = recognizeSplitRegex(regex);
    if (!pattern) {
      return invalidArgument(n + ": no matcher for the Split regex \"" + std::string(regex) +
                             "\" (supported: Qwen2/Qwen3, o200k)");
    }
    t->pattern_ = *pattern;
  }
  // decoder: ByteLevel
  {
    std::string_view type;
    JSON_OK(doc["decoder"]["type"].get(type), "decoder.type missing");
    if (type != "ByteLevel") {
      return invalidArgument(n + ": unsupported decoder \"" + std::string(type) +
                             "\" (expected ByteLevel)");
    }
  }
  // model
  simdjson::dom::element model;
  JSON_OK(doc["model"].get(model), "model missing");
  {
    simdjson::dom::element e;
    if (model["dropout"].get(e) == simdjson::SUCCESS && !e.is_null()) {
      return invalidArgument(n + ": BPE dropout is not supported");
    }
    bool b = false;
    if (model["byte_fallback"].get(b) == simdjson::SUCCESS && b) {
      return invalidArgument(n + ": BPE byte_fallback is not supported");
    }
    std::string_view s;
    if (model["continuing_subword_prefix"].get(s) == simdjson::SUCCESS && !s.empty()) {
      return invalidArgument(n + ": continuing_subword_prefix is not supported");
    }
    if (model["end_of_word_suffix"].get(s) == simdjson::SUCCESS && !s.empty()) {
      return invalidArgument(n + ": end_of_word_suffix is not supported");
    }
    if (model["ignore_merges"].get(b) == simdjson::SUCCESS) t->ignore_merges_ = b;
  }
  simdjson::dom::object vocab;
  JSON_OK(model["vocab"].get(vocab), "model.vocab missing");
  std::vector<std::pair<std::string_view, int64_t>> entries;
  entries.reserve(vocab.size());
  int64_t max_id = -1;
  for (auto field : vocab) {
    int64_t id;
    JSON_OK(field.value.get(id), "model.vocab ids must be integers");
    if (id < 0 || id > 10'000'000) return invalidArgument(n + ": vocab id out of range");
    entries.push_back({field.key, id});
    max_id = std::max(max_id, id);
  }
  struct Added {
    std::string content;
    int64_t id;
    bool special;
  };
  std::vector<Added> added;
  simdjson::dom::array added_json;
  if (doc["added_tokens"].get(added_json) == simdjson::SUCCESS) {
    for (auto a : added_json) {
      Added x;
      std::string_view content;
      JSON_OK(a["content"].get(content), "added_tokens[].content missing");
      JSON_OK(a["id"].get(x.id), "added_tokens[].id missing");
      JSON_OK(a["special"].get(x.special), "added_tokens[].special missing");
      bool lstrip = false, rstrip = false, single_word = false;
      if (a["lstrip"].get(lstrip) != simdjson::SUCCESS) lstrip = false;
      if (a["rstrip"].get(rstrip) != simdjson::SUCCESS) rstrip = false;
      if (a["single_word"].get(single_word) != simdjson::SUCCESS) single_word = false;
      if (lstrip || rstrip || single_word) {
        return invalidArgument(n + ": added token \"" + std::string(content) +
                               "\": lstrip/rstrip/single_word are not supported");
      }
      if (content.empty()) return invalidArgument(n + ": empty added token");
      if (x.id < 0 || x.id > 10'000'000) return invalidArgument(n + ": added token id out of range");
      x.content.assign(content);
      max_id = std::max(max_id, x.id);
      added.push_back(std::move(x));
    }
  }
  const size_t size = static_cast<size_t>(max_id + 1);
  t->pieces_.assign(size, std::string());
  t->has_piece_.assign(size, 0);
  t->piece_ids_.reserve(size);
  t->special_.assign(size, 0);
  std::vector<std::string> raw(size);
  for (auto& [piece, id] : entries) {
    t->pieces_[id].assign(piece);
    t->has_piece_[id] = 1;
    raw[id] = byteLevelDecodeToken(piece);
    t->piece_ids_.emplace(std::string(piece), static_cast<TokenId>(id));
  }
  // Raw-bytes index of the model vocabulary (for merges' results and ignore_merges).
  size_t cap = 1;
  while (cap < entries.size() * 2 + 2) cap <<= 1;
  t->bytes_index_.assign(cap, BytesEntry());
  t->bytes_mask_ = cap - 1;
  for (auto& a : added) {
    t->pieces_[a.id] = a.content;
    t->has_piece_[a.id] = 1;
    t->special_[a.id] = a.special ? 1 : 0;
    raw[a.id] = byteLevelDecodeToken(a.content);
    t->piece_ids_[a.content] = static_cast<TokenId>(a.id);
  }
  t->bytes_off_.resize(size + 1);
  for (size_t i = 0; i < size; ++i) {
    t->bytes_off_[i] = static_cast<uint32_t>(t->bytes_pool_.size());
    t->bytes_pool_ += raw[i];
  }
  t->bytes_off_[size] = static_cast<uint32_t>(t->bytes_pool_.size());
  for (auto& [piece, id] : entries) {
    const std::string_view b = t->tokenBytes(static_cast<TokenId>(id));
    if (t->findBytes(b) >= 0) continue;  // two pieces with the same bytes: keep the first
    const uint64_t h = hashBytes(b);
    size_t i = h & t->bytes_mask_;
    while (t->bytes_index_[i].hash != 0) i = (i + 1) & t->bytes_mask_;
    t->bytes_index_[i] = {h, static_cast<TokenId>(id)};
  }
  const auto& bl = byteLevel();
  for (int b = 0; b < 256; ++b) {
    std::string piece;
    utf8::append(bl.byte_to_cp[b], &piece);
    auto it = t->piece_ids_.find(piece);
    if (it == t->piece_ids_.end()) {
      return invalidArgument(n + ": the vocabulary lacks the byte-level piece for byte " +
                             std::to_string(b));
    }
    t->byte_ids_[b] = it->second;
  }
  // merges: [["a","b"], ...] or ["a b", ...]
  simdjson::dom::array merges;
  JSON_OK(model["merges"].get(merges), "model.merges missing");
  cap = 1;
  while (cap < merges.size() * 2 + 2) cap <<= 1;
  t->merges_.assign(cap, MergeEntry());
  t->merge_mask_ = cap - 1;
  uint32_t rank = 0;
  std::string joined;
  for (auto m : merges) {
    std::string_view a, b;
    if (m.is_array()) {
      simdjson::dom::array pair = m.get_array().value_unsafe();
      if (pair.size() != 2 || pair.at(0).get(a) != simdjson::SUCCESS ||
          pair.at(1).get(b) != simdjson::SUCCESS) {
        return invalidArgument(n + ": malformed merge #" + std::to_string(rank));
      }
    } else {
      std::string_view s;
      JSON_OK(m.get(s), "merges must be strings or pairs");
      const size_t sp = s.find(' ');
      if (sp == std::string_view::npos) {
        return invalidArgument(n + ": malformed merge \"" + std::string(s) + "\"");
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    }
    joined.assign(a);
    joined.append(b);
    auto ia = t->piece_ids_.find(a);
    auto ib = t->piece_ids_.find(b);
    auto ij = t->piece_ids_.find(std::string_view(joined));
    if (ia == t->piece_ids_.end() || ib == t->piece_ids_.end() || ij == t->piece_ids_.end()) {
      return invalidArgument(n + ": merge #" + std::to_string(rank) + " (\"" + std::string(a) +
                             "\", \"" + std::string(b) + "\") uses a piece not in the vocabulary");
    }
    const uint64_t key = pairKey(ia->second, ib->second);
    size_t i = mix(key) & t->merge_mask_;
    bool dup = false;
    while (t->merges_[i].key != 0) {
      if (t->merges_[i].key == key) {
        dup = true;  // HF keeps the first (lowest) rank
        break;
      }
      i = (i + 1) & t->merge_mask_;
    }
    if (!dup) t->merges_[i] = {key, rank, ij->second};
    ++rank;
  }
  // Added-token matcher.
  if (!added.empty()) {
    std::vector<std::pair<std::string_view, int32_t>> keys;
    for (auto& a : added) {
      keys.push_back({a.content, static_cast<int32_t>(a.id)});
      t->added_first_byte_[static_cast<unsigned char>(a.content[0])] = true;
    }
    RETURN_IF_ERROR(t->added_trie_.build(std::move(keys)).withContext(n));
    t->has_added_ = true;
  }
  return std::unique_ptr<Tokenizer>(std::move(t));
}
#undef JSON_OK

void BpeTokenizer::encodeImpl(std::string_view text, bool allow_special,
                              std::vector<TokenId>* out) const {
  size_t seg_start = 0;
  if (has_added_) {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    size_t i = 0;
    while (i < text.size()) {
      if (!added_first_byte_[p[i]]) {
        ++i;
        continue;
      }
      int32_t s = DoubleArray::kRoot;
      size_t best_len = 0;
      TokenId best_id = -1;
      for (size_t k = i; k < text.size(); ++k) {
        s = added_trie_.next(s, p[k]);
        if (s < 0) break;
        if (added_trie_.value(s) >= 0) {
          best_len = k - i + 1;
          best_id = added_trie_.value(s);
        }
      }
      if (best_len == 0) {
        ++i;
        continue;
      }
      if (special_[best_id] && !allow_special) {
        i += best_len;  // stays text; matching resumes after it (as HF does)
        continue;
      }
      encodeSegment(text.substr(seg_start, i - seg_start), out);
      out->push_back(best_id);
      i += best_len;
      seg_start = i;
    }
  }
  encodeSegment(text.substr(seg_start), out);
}

void BpeTokenizer::encodeSegment(std::string_view seg, std::vector<TokenId>* out) const {
  if (seg.empty()) return;
  thread_local std::string normalized;
  if (nfc_ && !unicode::isNfcQuick(seg)) {
    normalized.clear();
    unicode::appendNfc(seg, &normalized);
    seg = normalized;
  }
  thread_local std::vector<uint32_t> ends;
  ends.clear();
  splitPieces(pattern_, seg, &ends);
  uint32_t begin = 0;
  for (uint32_t end : ends) {
    encodeWord(seg.substr(begin, end - begin), out);
    begin = end;
  }
}

// Per-thread cache of word -> ids, per tokenizer instance (a few instances per thread).
struct WordCache {
  struct Entry {
    uint64_t hash = 0;
    uint32_t key_off = 0, ids_off = 0;
    uint16_t key_len = 0, ids_len = 0;
  };
  static constexpr size_t kSlots = 1 << 15;
  uint64_t owner = 0;
  size_t used = 0;
  std::vector<Entry> table;
  std::string keys;
  std::vector<TokenId> ids;
  void reset(uint64_t o) {
    owner = o;
    used = 0;
    table.assign(kSlots, Entry());
    keys.clear();
    ids.clear();
  }
};

WordCache& cacheFor(uint64_t instance) {
  thread_local WordCache caches[4];
  thread_local unsigned next_victim = 0;
  for (auto& c : caches) {
    if (c.owner == instance) return c;
  }
  WordCache& c = caches[next_victim++ % 4];
  c.reset(instance);
  return c;
}

void BpeTokenizer::encodeWord(std::string_view word, std::vector<TokenId>* out) const {
  if (word.size() == 1) {
    out->push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    const TokenId id = findBytes(word);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  if (word.size() > 64) {
    mergeWord(word, out);
    return;
  }
  WordCache& cache = cacheFor(instance_);
  const uint64_t h = hashBytes(word);
  size_t i = h & (WordCache::kSlots - 1);
  while (true) {
    const WordCache::Entry& e = cache.table[i];
    if (e.hash == 0) break;
    if (e.hash == h && std::string_view(cache.keys).substr(e.key_off, e.key_len) == word) {
      out->insert(out->end(), cache.ids.begin() + e.ids_off,
                  cache.ids.begin() + e.ids_off + e.ids_len);
      return;
    }
    i = (i + 1) & (WordCache::kSlots - 1);
  }
  const size_t before = out->size();
  mergeWord(word, out);
  if (cache.used * 2 >= WordCache::kSlots) {
    cache.reset(instance_);
    i = h & (WordCache::kSlots - 1);
  }
  WordCache::Entry e;
  e.hash = h;
  e.key_off = static_cast<uint32_t>(cache.keys.size());
  e.key_len = static_cast<uint16_t>(word.size());
  e.ids_off = static_cast<uint32_t>(cache.ids.size());
  e.ids_len = static_cast<uint16_t>(out->size() - before);
  cache.keys.append(word);
  cache.ids.insert(cache.ids.end(), out->begin() + static_cast<long>(before), out->end());
  cache.table[i] = e;
  ++cache.used;
}

// Repeatedly applies the lowest-ranked merge among adjacent symbols (leftmost on ties), which
// is what HF's priority-queue merge computes.
void BpeTokenizer::mergeWord(std::string_view word, std::vector<TokenId>* out) const {
  const size_t n = word.size();
  thread_local std::vector<TokenId> sym;
  thread_local std::vector<uint32_t> rank;  // rank of pair (i, next(i)); UINT32_MAX = none
  thread_local std::vector<TokenId> merged;
  thread_local std::vector<int32_t> next, prev;
  sym.resize(n);
  for (size_t i = 0; i < n; ++i) sym[i] = byte_ids_[static_cast<unsigned char>(word[i])];
  auto pairRank = [&](TokenId a, TokenId b, TokenId* m) -> uint32_t {
    const MergeEntry* e = findMerge(a, b);
    if (e == nullptr) return UINT32_MAX;
    *m = e->merged;
    return e->rank;
  };
  if (n <= 48) {
    // Small words: linear scans over a compact array.
    size_t len = n;
    rank.resize(n);
    merged.resize(n);
    for (size_t i = 0; i + 1 < len; ++i) rank[i] = pairRank(sym[i], sym[i + 1], &merged[i]);
    while (len > 1) {
      uint32_t best = UINT32_MAX;
      size_t bi = 0;
      for (size_t i = 0; i + 1 < len; ++i) {
        if (rank[i] < best) {
          best = rank[i];
          bi = i;
        }
      }
      if (best == UINT32_MAX) break;
      sym[bi] = merged[bi];
      for (size_t i = bi + 1; i + 1 < len; ++i) {
        sym[i] = sym[i + 1];
        rank[i] = rank[i + 1];
        merged[i] = merged[i + 1];
      }
      --len;
      if (bi + 1 < len) rank[bi] = pairRank(sym[bi], sym[bi + 1], &merged[bi]);
      if (bi > 0) rank[bi - 1] = pairRank(sym[bi - 1], sym[bi], &merged[bi - 1]);
    }
    out->insert(out->end(), sym.begin(), sym.begin() + static_cast<long>(len));
    return;
  }
  // Long words: linked list + min-heap of (rank, position), stale entries skipped.
  next.resize(n);
  prev.resize(n);
  rank.assign(n, UINT32_MAX);
  merged.assign(n, -1);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  using Item = std::pair<uint64_t, uint64_t>;  // ((rank << 32) | pos, expected right symbol)
  thread_local std::vector<Item> heap;
  heap.clear();
  auto push = [&](int32_t i) {
    if (i < 0 || next[i] < 0) return;
    TokenId m = -1;
    const uint32_t r = pairRank(sym[i], sym[next[i]], &m);
    rank[i] = r;
    merged[i] = m;
    if (r == UINT32_MAX) return;
    heap.push_back({(static_cast<uint64_t>(r) << 32) | static_cast<uint32_t>(i),
                    (static_cast<uint64_t>(static_cast<uint32_t>(sym[i])) << 32) |
                        static_cast<uint32_t>(sym[next[i]])});
    std::push_heap(heap.begin(), heap.end(), std::greater<Item>());
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Item>());
    const Item it = heap.back();
    heap.pop_back();
    const int32_t i = static_cast<int32_t>(it.first & 0xFFFFFFFFu);
    const uint32_t r = static_cast<uint32_t>(it.first >> 32);
    const int32_t j = next[i];
    if (sym[i] < 0 || j < 0 || rank[i] != r ||
        it.second != ((static_cast<uint64_t>(static_cast<uint32_t>(sym[i])) << 32) |
                      static_cast<uint32_t>(sym[j]))) {
      continue;  // stale
    }
    sym[i] = merged[i];
    sym[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(i);
    if (prev[i] >= 0) push(prev[i]);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out->push_back(sym[i]);
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> loadTokenizerJson(std::string_view json,
                                                     std::string_view name) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::element doc;
  if (parser.parse(padded).get(doc) != simdjson::SUCCESS) {
    return invalidArgument(std::string(name) + ": tokenizer.json is not valid JSON");
  }
  std::string_view type;
  if (doc["model"]["type"].get(type) != simdjson::SUCCESS) {
    return invalidArgument(std::string(name) + ": tokenizer.json has no model.type");
  }
  if (type == "BPE") return BpeTokenizer::create(doc, name);
  if (type == "Unigram") return createHfUnigramTokenizer(doc, name);
  return invalidArgument(std::string(name) + ": unsupported tokenizer.json model type \"" +
                         std::string(type) + "\" (supported: BPE, Unigram)");
}

}  // namespace garden::ivy
