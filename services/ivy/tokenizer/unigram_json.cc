#include "services/ivy/tokenizer/unigram_json.h"

#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "services/ivy/tokenizer/double_array.h"
#include "services/ivy/tokenizer/unicode_tables.h"
#include "services/ivy/tokenizer/utf8.h"

namespace garden::ivy {

namespace grapheme {
struct Range {
  uint32_t first;
  uint32_t last;
  uint8_t prop;
};
extern const Range kRanges[];
extern const size_t kRangeCount;
}  // namespace grapheme

namespace {

constexpr std::string_view kMeta = "\xE2\x96\x81";  // U+2581, the Metaspace replacement default

// Grapheme_Cluster_Break values, as numbered by gen_grapheme_table.py.
enum Gcb : uint8_t {
  kOther, kCR, kLF, kControl, kExtend, kZWJ, kRI, kPrepend, kSpacingMark, kL, kV, kT, kLV, kLVT,
  kPict
};

Gcb gcbOf(uint32_t cp) {
  size_t lo = 0, hi = grapheme::kRangeCount;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (grapheme::kRanges[mid].last < cp) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo < grapheme::kRangeCount && grapheme::kRanges[lo].first <= cp) {
    return static_cast<Gcb>(grapheme::kRanges[lo].prop);
  }
  return kOther;
}

}  // namespace

void splitGraphemes(std::string_view s, std::vector<std::string_view>* out) {
  out->clear();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t start = 0, i = 0;
  Gcb prev = kOther;
  bool pict_seq = false;   // inside ExtPict Extend* (ZWJ)?
  int ri_count = 0;        // RIs in the current run
  bool first = true;
  while (i < s.size()) {
    uint32_t cp = 0;
    int len = utf8::decode(p + i, s.size() - i, &cp);
    if (len <= 0) len = 1;
    const Gcb cur = gcbOf(cp);
    bool brk = true;
    if (first) {
      brk = false;
    } else if (prev == kCR && cur == kLF) {
      brk = false;
    } else if (prev == kControl || prev == kCR || prev == kLF) {
      brk = true;
    } else if (cur == kControl || cur == kCR || cur == kLF) {
      brk = true;
    } else if (prev == kL && (cur == kL || cur == kV || cur == kLV || cur == kLVT)) {
      brk = false;
    } else if ((prev == kLV || prev == kV) && (cur == kV || cur == kT)) {
      brk = false;
    } else if ((prev == kLVT || prev == kT) && cur == kT) {
      brk = false;
    } else if (cur == kExtend || cur == kZWJ || cur == kSpacingMark) {
      brk = false;
    } else if (prev == kPrepend) {
      brk = false;
    } else if (prev == kZWJ && cur == kPict && pict_seq) {
      brk = false;
    } else if (prev == kRI && cur == kRI && ri_count % 2 == 1) {
      brk = false;
    }
    if (brk) {
      out->push_back(s.substr(start, i - start));
      start = i;
    }
    // State for GB11 and GB12/13.
    if (cur == kPict) {
      pict_seq = true;
    } else if (cur == kExtend && pict_seq && prev != kZWJ) {
      pict_seq = true;
    } else if (cur == kZWJ && pict_seq) {
      pict_seq = true;
    } else {
      pict_seq = false;
    }
    ri_count = cur == kRI ? ri_count + 1 : 0;
    prev = cur;
    first = false;
    i += static_cast<size_t>(len);
  }
  if (start < s.size()) out->push_back(s.substr(start));
}

namespace {

Result<std::string> base64Decode(std::string_view in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const int v = val(c);
    if (v < 0) return invalidArgument("invalid base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

// HF's Precompiled normalizer (spm_precompiled): darts-clone trie + NUL-terminated strings.
// Not copyable: trie_ views units_.
class Precompiled {
 public:
  Precompiled() = default;
  Precompiled(const Precompiled&) = delete;
  Precompiled& operator=(const Precompiled&) = delete;
  Status init(const std::string& blob) {
    ASSIGN_OR_RETURN(PrecompiledCharsmap charsmap, parsePrecompiledCharsmap(blob));
    if (charsmap.units.empty()) return invalidArgument("precompiled charsmap has an empty trie");
    units_ = std::move(charsmap.units);
    normalized_ = std::move(charsmap.normalized);
    trie_ = DartsView(units_);
    return okStatus();
  }
  // The replacement of the SHORTEST key that is a prefix of `chunk` (spm_precompiled's
  // `results[0]`), or false.
  bool transform(std::string_view chunk, std::string_view* norm) const {
    uint32_t index = 0;
    if (trie_.shortestPrefix(chunk, &index) == 0 || index >= normalized_.size()) return false;
    const size_t end = normalized_.find('\0', index);
    *norm = std::string_view(normalized_).substr(
        index, (end == std::string::npos ? normalized_.size() : end) - index);
    return true;
  }

  void apply(std::string_view in, std::string* out) const {
    thread_local std::vector<std::string_view> clusters;
    splitGraphemes(in, &clusters);
    std::string_view norm;
    for (std::string_view g : clusters) {
      if (g.size() < 6 && transform(g, &norm)) {
        out->append(norm);
        continue;
      }
      const auto* p = reinterpret_cast<const unsigned char*>(g.data());
      size_t i = 0;
      while (i < g.size()) {
        uint32_t cp;
        int len = utf8::decode(p + i, g.size() - i, &cp);
        if (len <= 0) len = 1;
        const std::string_view part = g.substr(i, static_cast<size_t>(len));
        if (transform(part, &norm)) {
          out->append(norm);
        } else {
          out->append(part);
        }
        i += static_cast<size_t>(len);
      }
    }
  }

 private:
  std::vector<uint32_t> units_;
  std::string normalized_;
  DartsView trie_;  // over units_
};

struct NormStep {
  enum Kind { kPrecompiled, kStrip, kReplaceString, kReplaceSpaces } kind;
  bool strip_left = false, strip_right = false;
  std::string pattern, content;
  size_t min_run = 0;  // kReplaceSpaces: runs of >= min_run ASCII spaces
  std::shared_ptr<Precompiled> precompiled;
};

enum class Prepend { kAlways, kFirst, kNever };

struct AddedToken {
  std::string content;
  TokenId id;
  bool special;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false;
  std::string pattern;  // what is matched: content, or its normalized form when `normalized`
};

// Rust regex's Unicode \w (HF's single_word test): Alphabetic, marks, decimal digits, connector
// punctuation, join controls. Alphabetic is approximated by the letter categories, Nl and the
// Other_Alphabetic symbols of the enclosed-letter blocks (its other members are marks).
bool isWordChar(uint32_t cp) {
  const uint32_t bit = 1u << unicode::category(cp);
  if (bit & (unicode::kLetterMask | unicode::kMarkMask | unicode::bit(unicode::kNd) |
             unicode::bit(unicode::kNl) | unicode::bit(unicode::kPc))) {
    return true;
  }
  return cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9) ||
         (cp >= 0x1F130 && cp <= 0x1F149) || (cp >= 0x1F150 && cp <= 0x1F169) ||
         (cp >= 0x1F170 && cp <= 0x1F189);
}

size_t utf8Length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

// The code point that ends s[0..end) (valid UTF-8), or -1 at the start.
int64_t lastCodePoint(std::string_view s, size_t end) {
  if (end == 0) return -1;
  size_t k = end - 1;
  while (k > 0 && utf8::isTrail(static_cast<unsigned char>(s[k]))) --k;
  uint32_t cp;
  if (utf8::decode(reinterpret_cast<const unsigned char*>(s.data()) + k, end - k, &cp) <= 0) {
    return -1;
  }
  return cp;
}

int64_t firstCodePoint(std::string_view s, size_t begin) {
  uint32_t cp;
  if (utf8::decode(reinterpret_cast<const unsigned char*>(s.data()) + begin, s.size() - begin,
                   &cp) <= 0) {
    return -1;
  }
  return cp;
}

// One decoder step of a tokenizer.json decoder Sequence (the ByteFallback chain).
struct DecodeStepSpec {
  enum Kind { kReplace, kByteFallback, kFuse, kStrip } kind;
  std::string pattern, content;  // kReplace
  uint32_t strip_char = ' ';     // kStrip
  size_t strip_start = 0;        // kStrip: leading strip_char removed, at most this many
  size_t strip_stop = 0;         // kStrip: trailing ones
};

class HfUnigramTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> create(const simdjson::dom::element& doc,
                                                   std::string_view name);
  // decoder: a Sequence of Replace (String pattern), ByteFallback, Fuse and Strip (what
  // transformers writes for Llama-style sentencepiece models), or one of them alone.
  static Status parseDecoderChain(const simdjson::dom::element& e, std::string_view name,
                                  HfUnigramTokenizer* t);

  TokenizerKind kind() const override { return TokenizerKind::kUnigram; }
  void encode(std::string_view text, std::vector<TokenId>* out) const override {
    encodeImpl(text, false, out);
  }
  void encodeAllowingSpecial(std::string_view text, std::vector<TokenId>* out) const override {
    encodeImpl(text, true, out);
  }
  int32_t vocabSize() const override { return vocab_size_; }
  std::optional<std::string_view> idToPiece(TokenId id) const override {
    const std::string* s = tokenString(id);
    if (s == nullptr) return std::nullopt;
    return std::string_view(*s);
  }
  std::optional<TokenId> tokenId(std::string_view piece) const override {
    for (const auto& a : added_) {
      if (a.content == piece) return a.id;
    }
    auto it = piece_to_id_.find(std::string(piece));
    if (it == piece_to_id_.end()) return std::nullopt;
    return it->second;
  }
  bool isSpecial(TokenId id) const override {
    return id >= 0 && static_cast<size_t>(id) < added_index_.size() &&
           added_index_[static_cast<size_t>(id)] >= 0 &&
           added_[static_cast<size_t>(added_index_[static_cast<size_t>(id)])].special;
  }
  std::vector<TokenId> specialIds() const override {
    std::vector<TokenId> ids;
    for (const auto& a : added_) {
      if (a.special) ids.push_back(a.id);
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
  }
  bool decodeStep(TokenId id, bool skip_special, DecodeState* state,
                  std::string* out) const override;
  // Metaspace: pieces are whole UTF-8 strings, nothing is held back. ByteFallback chain: a run
  // of <0xXX> pieces is held until it ends (HF decodes the run as a whole).
  void decodeFinish(DecodeState* state, std::string* out) const override {
    if (!decoder_chain_.empty()) flushBytes(state, out);
  }

 private:
  // An added token's string is its pattern: HF tokenizers (>= 0.23) keeps a `normalized: true`
  // token (special or not) in its normalized form and gives that back for id_to_token and
  // decode; a `normalized: false` one as its content.
  const std::string* tokenString(TokenId id) const {
    if (id < 0 || id >= vocab_size_) return nullptr;
    const int32_t ai = added_index_[static_cast<size_t>(id)];
    if (ai >= 0) return &added_[static_cast<size_t>(ai)].pattern;
    if (static_cast<size_t>(id) < pieces_.size()) return &pieces_[static_cast<size_t>(id)];
    return nullptr;
  }
  void encodeImpl(std::string_view text, bool allow_special, std::vector<TokenId>* out) const;
  // The normalizer chain (norm_) over `in`, into *out (a per-thread buffer is used inside).
  void normalizeText(std::string_view in, std::string* out) const;
  // Metaspace pre-tokenizer + model over already normalized text.
  void tokenizeNormalized(std::string_view normalized, bool at_start, bool allow_special,
                          std::vector<TokenId>* out) const;
  // HF AddedVocabulary::find_matches over `text` with the tokens `set` (indices into added_):
  // leftmost-longest matches; specials skipped unless allowed; single_word, lstrip, rstrip
  // applied. Calls gap(begin, end) for text between tokens and token(id) in order.
  template <typename Gap, typename Token>
  void splitAdded(std::string_view text, const std::vector<uint32_t>& set,
                  const bool (&first_byte)[256], bool allow_special, Gap gap,
                  Token token) const;
  // The ByteFallback decoder chain (decoder Sequence of Replace, ByteFallback, Fuse, Strip).
  bool decodeStepChain(const std::string& piece, DecodeState* state, std::string* out) const;
  void flushBytes(DecodeState* state, std::string* out) const;
  void emitDecoded(std::string_view text, DecodeState* state, std::string* out) const;
  // `trie`: trie_ (all pieces, as HF) or plain_trie_ (special pieces left out: caller text).
  void viterbi(const DoubleArray& trie, std::string_view s, std::vector<TokenId>* out) const;

  std::vector<std::string> pieces_;
  std::vector<double> scores_;
  std::unordered_map<std::string, TokenId> piece_to_id_;
  DoubleArray trie_;
  DoubleArray plain_trie_;
  double min_score_ = 0;
  TokenId unk_id_ = 0;
  bool byte_fallback_ = false;
  TokenId byte_ids_[256];  // id of "<0xXX>", or -1
  std::vector<NormStep> norm_;
  bool metaspace_ = false;
  std::string replacement_ = std::string(kMeta);
  Prepend prepend_ = Prepend::kAlways;
  bool split_ = true;
  bool decoder_metaspace_ = false;
  std::string dec_replacement_ = std::string(kMeta);
  Prepend dec_prepend_ = Prepend::kAlways;
  std::vector<DecodeStepSpec> decoder_chain_;  // empty: Metaspace or no decoder
  bool decoder_byte_fallback_ = false;
  size_t decoder_bf_index_ = 0;                  // ByteFallback's place in decoder_chain_
  const DecodeStepSpec* fused_strip_ = nullptr;  // a Strip after Fuse (start <= 1, stop 0)
  std::vector<AddedToken> added_;
  std::vector<int32_t> added_index_;  // id -> index into added_ (the last entry wins), or -1
  std::vector<uint32_t> raw_added_;   // matched on the raw text (normalized == false)
  std::vector<uint32_t> norm_added_;  // matched on the normalized text
  bool raw_first_byte_[256] = {};
  bool norm_first_byte_[256] = {};
  int32_t vocab_size_ = 0;
};

void HfUnigramTokenizer::viterbi(const DoubleArray& trie, std::string_view s,
                                 std::vector<TokenId>* out) const {
  struct Node {
    int32_t id = -1;
    double score = 0;
    int64_t starts_at = -1;
  };
  thread_local std::vector<Node> best;
  const size_t size = s.size();
  best.assign(size + 1, Node());
  const double unk_score = min_score_ - 10.0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t start = 0;
  while (start < size) {
    const double till_here = best[start].score;
    bool has_single = false;
    uint32_t cp;
    int mb = utf8::decode(p + start, size - start, &cp);
    const size_t mblen = mb > 0 ? static_cast<size_t>(mb) : 1;
    int32_t node = DoubleArray::kRoot;
    for (size_t k = start; k < size; ++k) {
      node = trie.next(node, p[k]);
      if (node < 0) break;
      const int32_t id = trie.value(node);
      if (id < 0) continue;
      const size_t key_pos = k + 1;
      const double cand = scores_[static_cast<size_t>(id)] + till_here;
      Node& t = best[key_pos];
      if (t.starts_at < 0 || cand > t.score) {
        t.score = cand;
        t.starts_at = static_cast<int64_t>(start);
        t.id = id;
      }
      if (key_pos - start == mblen) has_single = true;
    }
    if (!has_single) {
      Node& t = best[start + mblen];
      const double cand = unk_score + till_here;
      if (t.starts_at < 0 || cand > t.score) {
        t.score = cand;
        t.starts_at = static_cast<int64_t>(start);
        t.id = unk_id_;
      }
    }
    start += mblen;
  }
  // Backtrack; runs of unk are fused into one string (HF fuse_unk), then looked up again.
  struct Piece {
    size_t begin, end;
    int32_t id;  // -1: fused unk run
  };
  thread_local std::vector<Piece> pieces;
  pieces.clear();
  size_t ends_at = size;
  while (ends_at > 0) {
    const Node& n = best[ends_at];
    const auto st = static_cast<size_t>(n.starts_at);
    if (n.id == unk_id_) {
      if (!pieces.empty() && pieces.back().id == -1) {
        pieces.back().begin = st;
      } else {
        pieces.push_back({st, ends_at, -1});
      }
    } else {
      pieces.push_back({st, ends_at, n.id});
    }
    ends_at = st;
  }
  for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
    if (it->id >= 0) {
      out->push_back(it->id);
      continue;
    }
    const std::string str(s.substr(it->begin, it->end - it->begin));
    auto f = piece_to_id_.find(str);
    if (f != piece_to_id_.end() && (&trie == &trie_ || !isSpecial(f->second))) {
      out->push_back(f->second);
      continue;
    }
    if (byte_fallback_) {  // only when every byte has its <0xXX> piece (as HF)
      bool all = true;
      for (char c : str) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : str) out->push_back(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    out->push_back(unk_id_);
  }
}

void HfUnigramTokenizer::normalizeText(std::string_view in, std::string* out) const {
  thread_local std::string a, b;
  a.assign(in);
  for (const NormStep& st : norm_) {
    b.clear();
    switch (st.kind) {
      case NormStep::kPrecompiled:
        st.precompiled->apply(a, &b);
        break;
      case NormStep::kStrip: {
        size_t lo = 0, hi = a.size();
        const auto* p = reinterpret_cast<const unsigned char*>(a.data());
        if (st.strip_left) {
          while (lo < hi) {
            uint32_t cp;
            const int len = utf8::decode(p + lo, hi - lo, &cp);
            if (len <= 0 || !unicode::isWhiteSpace(cp)) break;
            lo += static_cast<size_t>(len);
          }
        }
        if (st.strip_right) {
          while (hi > lo) {
            size_t k = hi - 1;
            while (k > lo && utf8::isTrail(p[k])) --k;
            uint32_t cp;
            const int len = utf8::decode(p + k, hi - k, &cp);
            if (len <= 0 || !unicode::isWhiteSpace(cp)) break;
            hi = k;
          }
        }
        b.assign(a, lo, hi - lo);
        break;
      }
      case NormStep::kReplaceString: {
        size_t i = 0;
        while (true) {
          const size_t f = a.find(st.pattern, i);
          if (f == std::string::npos) break;
          b.append(a, i, f - i);
          b.append(st.content);
          i = f + st.pattern.size();
        }
        b.append(a, i, std::string::npos);
        break;
      }
      case NormStep::kReplaceSpaces: {
        size_t i = 0;
        while (i < a.size()) {
          if (a[i] != ' ') {
            b.push_back(a[i++]);
            continue;
          }
          size_t j = i;
          while (j < a.size() && a[j] == ' ') ++j;
          if (j - i >= st.min_run) {
            b.append(st.content);
          } else {
            b.append(a, i, j - i);
          }
          i = j;
        }
        break;
      }
    }
    a.swap(b);
  }
  out->swap(a);
}

void HfUnigramTokenizer::tokenizeNormalized(std::string_view a, bool at_start, bool allow_special,
                                            std::vector<TokenId>* out) const {
  const DoubleArray& trie = allow_special ? trie_ : plain_trie_;
  thread_local std::string b;
  if (a.empty()) return;
  if (!metaspace_) {
    viterbi(trie, a, out);
    return;
  }
  b.clear();
  for (char c : a) {
    if (c == ' ') {
      b.append(replacement_);
    } else {
      b.push_back(c);
    }
  }
  const bool starts_rep = b.compare(0, replacement_.size(), replacement_) == 0;
  if ((prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && at_start)) &&
      !starts_rep) {
    b.insert(0, replacement_);
  }
  if (!split_) {
    viterbi(trie, b, out);
    return;
  }
  // Split MergedWithNext: every replacement starts a new piece.
  size_t piece_start = 0;
  size_t pos = b.find(replacement_, 1);
  while (pos != std::string::npos) {
    if (pos > piece_start) {
      viterbi(trie, std::string_view(b).substr(piece_start, pos - piece_start), out);
    }
    piece_start = pos;
    pos = b.find(replacement_, pos + replacement_.size());
  }
  if (piece_start < b.size()) viterbi(trie, std::string_view(b).substr(piece_start), out);
}

template <typename Gap, typename Token>
void HfUnigramTokenizer::splitAdded(std::string_view t, const std::vector<uint32_t>& set,
                                    const bool (&first_byte)[256], bool allow_special, Gap gap,
                                    Token token) const {
  size_t start_offset = 0;  // end of the last token taken (HF's start_offset)
  size_t i = 0;
  while (i < t.size()) {
    if (!first_byte[static_cast<unsigned char>(t[i])]) {
      ++i;
      continue;
    }
    // Leftmost-longest match at i (Aho-Corasick LeftmostLongest; the first listed wins a tie).
    const AddedToken* best = nullptr;
    for (uint32_t k : set) {
      const AddedToken& a = added_[k];
      if (t.compare(i, a.pattern.size(), a.pattern) == 0 &&
          (best == nullptr || a.pattern.size() > best->pattern.size())) {
        best = &a;
      }
    }
    if (best == nullptr) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + best->pattern.size();
    i = stop;  // matches never overlap, whether or not this one is taken
    // Caller text never yields a special token: HF's encode_special_tokens skips the match
    // (its text stays ordinary text).
    if (best->special && !allow_special) continue;
    if (best->single_word) {
      const int64_t before = lastCodePoint(t, start);
      const int64_t after = stop < t.size() ? firstCodePoint(t, stop) : -1;
      const bool start_space = before < 0 || !isWordChar(static_cast<uint32_t>(before));
      const bool stop_space = after < 0 || !isWordChar(static_cast<uint32_t>(after));
      if (!start_space || !stop_space) continue;
    }
    if (best->lstrip) {
      size_t new_start = start;
      for (int64_t cp; (cp = lastCodePoint(t, new_start)) >= 0 &&
                       unicode::isWhiteSpace(static_cast<uint32_t>(cp));) {
        new_start -= utf8Length(static_cast<uint32_t>(cp));
      }
      start = std::max(new_start, start_offset);
    }
    if (best->rstrip) {
      for (int64_t cp; stop < t.size() && (cp = firstCodePoint(t, stop)) >= 0 &&
                       unicode::isWhiteSpace(static_cast<uint32_t>(cp));) {
        stop += utf8Length(static_cast<uint32_t>(cp));
      }
    }
    if (start_offset < start) gap(start_offset, start);
    token(best->id);
    start_offset = stop;
  }
  if (start_offset < t.size()) gap(start_offset, t.size());
}

void HfUnigramTokenizer::encodeImpl(std::string_view raw, bool allow_special,
                                    std::vector<TokenId>* out) const {
  // HF input is a Rust String: invalid UTF-8 becomes U+FFFD first (from_utf8_lossy).
  thread_local std::string text;
  text.clear();
  utf8::appendLossy(raw, true, &text);
  const std::string_view t(text);
  auto emit = [out](TokenId id) { out->push_back(id); };
  // 1. Tokens with normalized == false, on the raw text; 2. per gap: the normalizer, then the
  // tokens with normalized == true on the normalized gap; 3. Metaspace + model on what is left.
  // A piece counts as the text's start for prepend_scheme "first" when it begins at byte 0 of
  // the input (HF: offsets_original().0 == 0).
  splitAdded(
      t, raw_added_, raw_first_byte_, allow_special,
      [&](size_t begin, size_t end) {
        thread_local std::string normalized;
        normalizeText(t.substr(begin, end - begin), &normalized);
        if (norm_added_.empty()) {
          tokenizeNormalized(normalized, begin == 0, allow_special, out);
          return;
        }
        const std::string_view n(normalized);
        splitAdded(
            n, norm_added_, norm_first_byte_, allow_special,
            [&](size_t b2, size_t e2) {
              tokenizeNormalized(n.substr(b2, e2 - b2), begin == 0 && b2 == 0, allow_special,
                                 out);
            },
            emit);
      },
      emit);
}

bool HfUnigramTokenizer::decodeStep(TokenId id, bool skip_special, DecodeState* state,
                                    std::string* out) const {
  const std::string* s = tokenString(id);
  if (s == nullptr) return false;
  if (skip_special && isSpecial(id)) return true;
  if (!decoder_chain_.empty()) return decodeStepChain(*s, state, out);
  const size_t i = state->tokens++;
  if (!decoder_metaspace_) {
    out->append(*s);
    return true;
  }
  size_t k = 0;
  while (k < s->size()) {
    if (s->compare(k, dec_replacement_.size(), dec_replacement_) == 0) {
      if (!(i == 0 && dec_prepend_ != Prepend::kNever)) out->push_back(' ');
      k += dec_replacement_.size();
    } else {
      out->push_back((*s)[k++]);
    }
  }
  return true;
}

// Per-token steps of decoder_chain_ in [from, to), stopping at Fuse (ByteFallback is handled by
// the caller).
void applyTokenSteps(const std::vector<DecodeStepSpec>& chain, size_t from, size_t to,
                     std::string* tok) {
  thread_local std::string tmp;
  for (size_t k = from; k < to && k < chain.size(); ++k) {
    const DecodeStepSpec& st = chain[k];
    if (st.kind == DecodeStepSpec::kFuse) return;
    if (st.kind == DecodeStepSpec::kReplace) {
      tmp.clear();
      size_t i = 0;
      for (size_t f; (f = tok->find(st.pattern, i)) != std::string::npos;
           i = f + st.pattern.size()) {
        tmp.append(*tok, i, f - i);
        tmp.append(st.content);
      }
      tmp.append(*tok, i, std::string::npos);
      tok->swap(tmp);
    } else if (st.kind == DecodeStepSpec::kStrip) {
      // HF Strip on one token: at most strip_start leading and strip_stop trailing strip_char.
      const auto* p = reinterpret_cast<const unsigned char*>(tok->data());
      size_t lo = 0, hi = tok->size();
      for (size_t n = 0; n < st.strip_start && lo < hi; ++n) {
        uint32_t cp;
        const int len = utf8::decode(p + lo, hi - lo, &cp);
        if (len <= 0 || cp != st.strip_char) break;
        lo += static_cast<size_t>(len);
      }
      for (size_t n = 0; n < st.strip_stop && hi > lo; ++n) {
        size_t k2 = hi - 1;
        while (k2 > lo && utf8::isTrail(p[k2])) --k2;
        uint32_t cp;
        const int len = utf8::decode(p + k2, hi - k2, &cp);
        if (len <= 0 || cp != st.strip_char) break;
        hi = k2;
      }
      *tok = tok->substr(lo, hi - lo);
    }
  }
}

// "<0xXX>" as HF's ByteFallback reads it (u8::from_str_radix over the two characters, which
// takes a leading '+').
bool byteToken(std::string_view tok, uint8_t* byte) {
  if (tok.size() != 6 || tok.substr(0, 3) != "<0x" || tok[5] != '>') return false;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = tok[3] == '+' ? 0 : hex(tok[3]);
  const int lo = hex(tok[4]);
  if (hi < 0 || lo < 0) return false;
  *byte = static_cast<uint8_t>(hi * 16 + lo);
  return true;
}

void HfUnigramTokenizer::emitDecoded(std::string_view text, DecodeState* state,
                                     std::string* out) const {
  // A Strip after Fuse sees the whole text: it removes (at most one) leading strip_char of
  // the first non-empty output. flag0: that point has passed.
  if (!state->flag0 && !text.empty()) {
    state->flag0 = true;
    if (fused_strip_ != nullptr && fused_strip_->strip_start > 0) {
      uint32_t cp;
      const int len = utf8::decode(reinterpret_cast<const unsigned char*>(text.data()),
                                   text.size(), &cp);
      if (len > 0 && cp == fused_strip_->strip_char) text.remove_prefix(static_cast<size_t>(len));
    }
  }
  out->append(text);
  state->emitted += text.size();
}

void HfUnigramTokenizer::flushBytes(DecodeState* state, std::string* out) const {
  if (state->pending.empty()) return;
  // HF: the run is one token when it is valid UTF-8, else one U+FFFD token per byte.
  const auto* p = reinterpret_cast<const unsigned char*>(state->pending.data());
  bool valid = true;
  for (size_t i = 0; i < state->pending.size();) {
    uint32_t cp;
    const int len = utf8::decode(p + i, state->pending.size() - i, &cp);
    if (len <= 0) {
      valid = false;
      break;
    }
    i += static_cast<size_t>(len);
  }
  thread_local std::string tok;
  const size_t count = valid ? 1 : state->pending.size();
  for (size_t i = 0; i < count; ++i) {
    if (valid) {
      tok = state->pending;
    } else {
      tok.assign(utf8::kReplacement);
    }
    applyTokenSteps(decoder_chain_, decoder_bf_index_ + 1, decoder_chain_.size(), &tok);
    emitDecoded(tok, state, out);
  }
  state->pending.clear();
}

bool HfUnigramTokenizer::decodeStepChain(const std::string& piece, DecodeState* state,
                                         std::string* out) const {
  ++state->tokens;
  thread_local std::string tok;
  tok = piece;
  if (!decoder_byte_fallback_) {
    applyTokenSteps(decoder_chain_, 0, decoder_chain_.size(), &tok);
    emitDecoded(tok, state, out);
    return true;
  }
  applyTokenSteps(decoder_chain_, 0, decoder_bf_index_, &tok);
  uint8_t byte;
  if (byteToken(tok, &byte)) {
    state->pending.push_back(static_cast<char>(byte));  // held until the run ends
    return true;
  }
  flushBytes(state, out);
  applyTokenSteps(decoder_chain_, decoder_bf_index_ + 1, decoder_chain_.size(), &tok);
  emitDecoded(tok, state, out);
  return true;
}

#define UJ_REQUIRE(expr, what)                                                      \
  if ((expr) != simdjson::SUCCESS)                                                   \
  return invalidArgument(std::string(name) + ": tokenizer.json: " + (what))

Result<Prepend> parsePrepend(const simdjson::dom::element& e, std::string_view name,
                             const char* where) {
  std::string_view scheme;
  if (e["prepend_scheme"].get(scheme) == simdjson::SUCCESS) {
    if (scheme == "always") return Prepend::kAlways;
    if (scheme == "first") return Prepend::kFirst;
    if (scheme == "never") return Prepend::kNever;
    return invalidArgument(std::string(name) + ": tokenizer.json: " + where +
                           ".prepend_scheme \"" + std::string(scheme) + "\" is not supported");
  }
  bool add_prefix_space = true;
  if (e["add_prefix_space"].get(add_prefix_space) == simdjson::SUCCESS && !add_prefix_space) {
    return Prepend::kNever;
  }
  return Prepend::kAlways;
}

Status parseNormalizer(const simdjson::dom::element& e, std::string_view name,
                       std::vector<NormStep>* steps) {
  std::string_view type;
  UJ_REQUIRE(e["type"].get(type), "normalizer without a type");
  if (type == "Sequence") {
    simdjson::dom::array seq;
    UJ_REQUIRE(e["normalizers"].get(seq), "normalizer Sequence without normalizers");
    for (simdjson::dom::element sub : seq) RETURN_IF_ERROR(parseNormalizer(sub, name, steps));
    return okStatus();
  }
  NormStep st{};
  if (type == "Precompiled") {
    st.kind = NormStep::kPrecompiled;
    std::string_view b64;
    UJ_REQUIRE(e["precompiled_charsmap"].get(b64), "Precompiled without precompiled_charsmap");
    auto blob = base64Decode(b64);
    if (!blob.isOk()) {
      return invalidArgument(std::string(name) +
                             ": tokenizer.json: normalizer.precompiled_charsmap is not base64");
    }
    if (blob->empty()) return okStatus();
    st.precompiled = std::make_shared<Precompiled>();
    const Status s = st.precompiled->init(*blob);
    if (!s.isOk()) {
      return invalidArgument(std::string(name) + ": tokenizer.json: normalizer: " + s.message());
    }
  } else if (type == "Strip") {
    st.kind = NormStep::kStrip;
    UJ_REQUIRE(e["strip_left"].get(st.strip_left), "Strip without strip_left");
    UJ_REQUIRE(e["strip_right"].get(st.strip_right), "Strip without strip_right");
  } else if (type == "Replace") {
    std::string_view content, pat;
    UJ_REQUIRE(e["content"].get(content), "Replace without content");
    st.content.assign(content);
    if (e["pattern"]["String"].get(pat) == simdjson::SUCCESS) {
      if (pat.empty()) {
        return invalidArgument(std::string(name) + ": tokenizer.json: empty Replace pattern");
      }
      st.kind = NormStep::kReplaceString;
      st.pattern.assign(pat);
    } else if (e["pattern"]["Regex"].get(pat) == simdjson::SUCCESS) {
      // Only the regex that SpmConverter writes: " {n,}".
      if (pat.size() < 5 || pat[0] != ' ' || pat[1] != '{' || pat.substr(pat.size() - 2) != ",}" ||
          pat.find_first_not_of("0123456789", 2) != pat.size() - 2) {
        return invalidArgument(std::string(name) + ": tokenizer.json: normalizer Replace regex \"" +
                               std::string(pat) + "\" is not supported (only \" {n,}\")");
      }
      st.kind = NormStep::kReplaceSpaces;
      st.min_run = std::stoul(std::string(pat.substr(2, pat.size() - 4)));
      if (st.min_run == 0) st.min_run = 1;
    } else {
      return invalidArgument(std::string(name) + ": tokenizer.json: Replace without pattern");
    }
  } else {
    return invalidArgument(std::string(name) + ": tokenizer.json: normalizer type \"" +
                           std::string(type) +
                           "\" is not supported for Unigram (Precompiled, Strip, Replace)");
  }
  steps->push_back(std::move(st));
  return okStatus();
}

Status HfUnigramTokenizer::parseDecoderChain(const simdjson::dom::element& e,
                                             std::string_view name, HfUnigramTokenizer* t) {
  const std::string where = std::string(name) + ": tokenizer.json: decoder";
  std::vector<simdjson::dom::element> steps;
  std::string_view type;
  UJ_REQUIRE(e["type"].get(type), "decoder without a type");
  if (type == "Sequence") {
    simdjson::dom::array seq;
    UJ_REQUIRE(e["decoders"].get(seq), "decoder Sequence without decoders");
    for (simdjson::dom::element d : seq) steps.push_back(d);
  } else {
    steps.push_back(e);
  }
  bool fused = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string at = where + "s[" + std::to_string(i) + "]";
    std::string_view st_type;
    if (steps[i]["type"].get(st_type) != simdjson::SUCCESS) {
      return invalidArgument(at + " has no type");
    }
    DecodeStepSpec st{};
    if (st_type == "Replace") {
      std::string_view pat, content;
      if (steps[i]["pattern"]["String"].get(pat) != simdjson::SUCCESS || pat.empty()) {
        return invalidArgument(at + ": Replace needs a non-empty String pattern (Regex is not "
                                    "supported)");
      }
      if (steps[i]["content"].get(content) != simdjson::SUCCESS) {
        return invalidArgument(at + ": Replace without content");
      }
      if (fused) return invalidArgument(at + ": Replace after Fuse is not supported");
      st.kind = DecodeStepSpec::kReplace;
      st.pattern.assign(pat);
      st.content.assign(content);
    } else if (st_type == "ByteFallback") {
      if (fused || t->decoder_byte_fallback_) {
        return invalidArgument(at + ": ByteFallback after Fuse or twice is not supported");
      }
      st.kind = DecodeStepSpec::kByteFallback;
      t->decoder_byte_fallback_ = true;
      t->decoder_bf_index_ = t->decoder_chain_.size();
    } else if (st_type == "Fuse") {
      st.kind = DecodeStepSpec::kFuse;
      fused = true;
    } else if (st_type == "Strip") {
      std::string_view content;
      uint64_t start = 0, stop = 0;
      if (steps[i]["content"].get(content) != simdjson::SUCCESS ||
          steps[i]["start"].get(start) != simdjson::SUCCESS ||
          steps[i]["stop"].get(stop) != simdjson::SUCCESS) {
        return invalidArgument(at + ": Strip needs content, start and stop");
      }
      uint32_t cp = 0;
      if (utf8::decode(reinterpret_cast<const unsigned char*>(content.data()), content.size(),
                       &cp) != static_cast<int>(content.size()) ||
          content.empty()) {
        return invalidArgument(at + ": Strip content must be one character");
      }
      if (fused && (start > 1 || stop != 0 || t->fused_strip_ != nullptr)) {
        return invalidArgument(at + ": after Fuse only one Strip with start <= 1 and stop 0 is "
                                    "supported (a streamed decode cannot take text back)");
      }
      st.kind = DecodeStepSpec::kStrip;
      st.strip_char = cp;
      st.strip_start = static_cast<size_t>(start);
      st.strip_stop = static_cast<size_t>(stop);
    } else {
      return invalidArgument(at + ": decoder type \"" + std::string(st_type) +
                             "\" is not supported for Unigram (Metaspace, or a Sequence of "
                             "Replace, ByteFallback, Fuse, Strip)");
    }
    t->decoder_chain_.push_back(std::move(st));
  }
  if (t->decoder_chain_.empty()) return invalidArgument(where + ": empty decoder Sequence");
  // Pointers into decoder_chain_ only once it no longer grows.
  bool after = false;
  for (const DecodeStepSpec& st : t->decoder_chain_) {
    if (st.kind == DecodeStepSpec::kFuse) after = true;
    if (after && st.kind == DecodeStepSpec::kStrip) t->fused_strip_ = &st;
  }
  return okStatus();
}

Result<std::unique_ptr<Tokenizer>> HfUnigramTokenizer::create(const simdjson::dom::element& doc,
                                                               std::string_view name) {
  auto t = std::make_unique<HfUnigramTokenizer>();
  const std::string n(name);
  simdjson::dom::element e;
  if (doc["normalizer"].get(e) == simdjson::SUCCESS && !e.is_null()) {
    RETURN_IF_ERROR(parseNormalizer(e, name, &t->norm_));
  }
  if (doc["pre_tokenizer"].get(e) == simdjson::SUCCESS && !e.is_null()) {
    std::string_view type, rep;
    UJ_REQUIRE(e["type"].get(type), "pre_tokenizer without a type");
    if (type != "Metaspace") {
      return invalidArgument(n + ": tokenizer.json: pre_tokenizer type \"" + std::string(type) +
                             "\" is not supported for Unigram (Metaspace)");
    }
    t->metaspace_ = true;
    UJ_REQUIRE(e["replacement"].get(rep), "Metaspace without replacement");
    if (rep.empty()) return invalidArgument(n + ": tokenizer.json: empty Metaspace replacement");
    t->replacement_.assign(rep);
    ASSIGN_OR_RETURN(t->prepend_, parsePrepend(e, name, "pre_tokenizer"));
    bool split = true;
    if (e["split"].get(split) == simdjson::SUCCESS) t->split_ = split;
  }
  if (doc["decoder"].get(e) == simdjson::SUCCESS && !e.is_null()) {
    std::string_view type;
    UJ_REQUIRE(e["type"].get(type), "decoder without a type");
    if (type != "Metaspace") {
      RETURN_IF_ERROR(parseDecoderChain(e, name, t.get()));
    }
  }
  if (!t->decoder_chain_.empty()) {
    // The chain is set up; nothing Metaspace-specific follows.
  } else if (doc["decoder"].get(e) == simdjson::SUCCESS && !e.is_null()) {
    std::string_view rep;
    t->decoder_metaspace_ = true;
    UJ_REQUIRE(e["replacement"].get(rep), "decoder Metaspace without replacement");
    if (rep.empty()) return invalidArgument(n + ": tokenizer.json: empty decoder replacement");
    t->dec_replacement_.assign(rep);
    ASSIGN_OR_RETURN(t->dec_prepend_, parsePrepend(e, name, "decoder"));
  }
  // Model.
  simdjson::dom::element model;
  UJ_REQUIRE(doc["model"].get(model), "no model");
  simdjson::dom::array vocab;
  UJ_REQUIRE(model["vocab"].get(vocab), "model.vocab missing");
  int64_t unk = 0;
  UJ_REQUIRE(model["unk_id"].get(unk), "model.unk_id missing or null");
  bool bf = false;
  if (model["byte_fallback"].get(bf) == simdjson::SUCCESS) t->byte_fallback_ = bf;
  std::vector<std::pair<std::string_view, int32_t>> keys;
  t->min_score_ = std::numeric_limits<double>::max();
  for (simdjson::dom::element entry : vocab) {
    simdjson::dom::array pair;
    std::string_view piece;
    double score = 0;
    UJ_REQUIRE(entry.get(pair), "model.vocab entry is not [piece, score]");
    if (pair.size() != 2 || pair.at(0).get(piece) != simdjson::SUCCESS ||
        pair.at(1).get(score) != simdjson::SUCCESS) {
      return invalidArgument(n + ": tokenizer.json: model.vocab entry " +
                             std::to_string(t->pieces_.size()) + " is not [piece, score]");
    }
    const auto id = static_cast<TokenId>(t->pieces_.size());
    t->pieces_.emplace_back(piece);
    t->scores_.push_back(score);
    t->piece_to_id_[std::string(piece)] = id;  // a duplicate: the last id wins (as HF)
    t->min_score_ = std::min(t->min_score_, score);
  }
  if (t->pieces_.empty()) return invalidArgument(n + ": tokenizer.json: model.vocab is empty");
  if (unk < 0 || unk >= static_cast<int64_t>(t->pieces_.size())) {
    return invalidArgument(n + ": tokenizer.json: model.unk_id " + std::to_string(unk) +
                           " is out of range");
  }
  t->unk_id_ = static_cast<TokenId>(unk);
  for (const auto& [piece, id] : t->piece_to_id_) {
    if (!piece.empty()) keys.emplace_back(piece, id);
  }
  std::vector<std::pair<std::string_view, int32_t>> plain_keys;
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    auto it = t->piece_to_id_.find(buf);
    t->byte_ids_[b] = it == t->piece_to_id_.end() ? -1 : it->second;
  }
  t->vocab_size_ = static_cast<int32_t>(t->pieces_.size());
  // Added tokens.
  simdjson::dom::array added;
  if (doc["added_tokens"].get(added) == simdjson::SUCCESS) {
    for (simdjson::dom::element a : added) {
      int64_t id = 0;
      std::string_view content;
      bool special = false, normalized = false, lstrip = false, rstrip = false, single = false;
      UJ_REQUIRE(a["id"].get(id), "added_tokens entry without id");
      UJ_REQUIRE(a["content"].get(content), "added_tokens entry without content");
      UJ_REQUIRE(a["special"].get(special), "added_tokens entry without special");
      if (a["normalized"].get(normalized) != simdjson::SUCCESS) normalized = false;
      if (a["lstrip"].get(lstrip) != simdjson::SUCCESS) lstrip = false;
      if (a["rstrip"].get(rstrip) != simdjson::SUCCESS) rstrip = false;
      if (a["single_word"].get(single) != simdjson::SUCCESS) single = false;
      if (id < 0 || id > std::numeric_limits<int32_t>::max() - 1 || content.empty()) {
        return invalidArgument(n + ": tokenizer.json: added_tokens entry \"" +
                               std::string(content) + "\" has a bad id or empty content");
      }
      AddedToken tok{std::string(content), static_cast<TokenId>(id), special};
      tok.lstrip = lstrip;
      tok.rstrip = rstrip;
      tok.single_word = single;
      tok.normalized = normalized;
      // HF matches a normalized token by its content run through the normalizer.
      if (normalized) {
        t->normalizeText(content, &tok.pattern);
      } else {
        tok.pattern.assign(content);
      }
      t->added_.push_back(std::move(tok));
      t->vocab_size_ = std::max(t->vocab_size_, static_cast<int32_t>(id + 1));
    }
  }
  t->added_index_.assign(static_cast<size_t>(t->vocab_size_), -1);
  for (size_t i = 0; i < t->added_.size(); ++i) {
    const AddedToken& a = t->added_[i];
    t->added_index_[static_cast<size_t>(a.id)] = static_cast<int32_t>(i);
    if (a.pattern.empty()) continue;  // normalized to nothing: can never match
    const auto first = static_cast<unsigned char>(a.pattern[0]);
    if (a.normalized) {
      t->norm_added_.push_back(static_cast<uint32_t>(i));
      t->norm_first_byte_[first] = true;
    } else {
      t->raw_added_.push_back(static_cast<uint32_t>(i));
      t->raw_first_byte_[first] = true;
    }
  }
  for (const auto& [piece, id] : keys) {
    if (!t->isSpecial(id)) plain_keys.emplace_back(piece, id);
  }
  RETURN_IF_ERROR(t->trie_.build(std::move(keys)));
  RETURN_IF_ERROR(t->plain_trie_.build(std::move(plain_keys)));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> createHfUnigramTokenizer(const simdjson::dom::element& doc,
                                                            std::string_view name) {
  return HfUnigramTokenizer::create(doc, name);
}

}  // namespace garden::ivy
