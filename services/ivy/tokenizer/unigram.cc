#include "services/ivy/tokenizer/unigram.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "services/ivy/tokenizer/double_array.h"
#include "services/ivy/tokenizer/utf8.h"

namespace garden::ivy {
namespace {

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";  // U+2581
constexpr std::string_view kDefaultUnkSurface = " \xE2\x81\x87 ";

// sentencepiece ModelProto.SentencePiece.Type
enum PieceType : uint8_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct SpmSpec {
  struct Piece {
    std::string piece;
    float score = 0;
    uint8_t type = kNormal;
  };
  std::vector<Piece> pieces;
  int model_type = 1;
  bool treat_whitespace_as_suffix = false;
  bool byte_fallback = false;
  std::string unk_surface = std::string(kDefaultUnkSurface);
  std::string charsmap;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
  std::string denorm_charsmap;
};

// ---- protobuf wire format, by hand (only what ModelProto needs) ----
class Wire {
 public:
  explicit Wire(std::string_view b) : p_(b.data()), end_(b.data() + b.size()) {}
  bool done() const { return p_ >= end_; }
  bool varint(uint64_t* v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) return false;
      const uint8_t b = static_cast<uint8_t>(*p_++);
      r |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) {
        *v = r;
        return true;
      }
    }
    return false;
  }
  // Reads a tag; *field, *wire_type.
  bool tag(uint32_t* field, uint32_t* wt) {
    uint64_t t;
    if (!varint(&t)) return false;
    *field = static_cast<uint32_t>(t >> 3);
    *wt = static_cast<uint32_t>(t & 7);
    return *field != 0;
  }
  bool bytes(std::string_view* out) {
    uint64_t n;
    if (!varint(&n) || n > static_cast<uint64_t>(end_ - p_)) return false;
    *out = std::string_view(p_, n);
    p_ += n;
    return true;
  }
  bool fixed32(uint32_t* v) {
    if (end_ - p_ < 4) return false;
    std::memcpy(v, p_, 4);
    p_ += 4;
    return true;
  }
  bool skip(uint32_t wt) {
    uint64_t v;
    std::string_view s;
    uint32_t f;
    switch (wt) {
      case 0: return varint(&v);
      case 1:
        if (end_ - p_ < 8) return false;
        p_ += 8;
        return true;
      case 2: return bytes(&s);
      case 5: return fixed32(&f);
      default: return false;
    }
  }

 private:
  const char* p_;
  const char* end_;
};

#define WIRE_OK(expr) \
  if (!(expr)) return invalidArgument(std::string(name) + ": malformed sentencepiece model (protobuf)")

Status parsePiece(std::string_view msg, std::string_view name, SpmSpec::Piece* piece) {
  Wire w(msg);
  while (!w.done()) {
    uint32_t f, wt;
    WIRE_OK(w.tag(&f, &wt));
    if (f == 1 && wt == 2) {
      std::string_view s;
      WIRE_OK(w.bytes(&s));
      piece->piece.assign(s);
    } else if (f == 2 && wt == 5) {
      uint32_t bits;
      WIRE_OK(w.fixed32(&bits));
      std::memcpy(&piece->score, &bits, 4);
    } else if (f == 3 && wt == 0) {
      uint64_t v;
      WIRE_OK(w.varint(&v));
      if (v < 1 || v > 6) return invalidArgument(std::string(name) + ": unknown piece type");
      piece->type = static_cast<uint8_t>(v);
    } else {
      WIRE_OK(w.skip(wt));
    }
  }
  return okStatus();
}

Status parseTrainerSpec(std::string_view msg, std::string_view name, SpmSpec* spec) {
  Wire w(msg);
  while (!w.done()) {
    uint32_t f, wt;
    WIRE_OK(w.tag(&f, &wt));
    uint64_t v;
    std::string_view s;
    if (wt == 0 && (f == 3 || f == 24 || f == 35)) {
      WIRE_OK(w.varint(&v));
      if (f == 3) spec->model_type = static_cast<int>(v);
      if (f == 24) spec->treat_whitespace_as_suffix = v != 0;
      if (f == 35) spec->byte_fallback = v != 0;
    } else if (wt == 2 && f == 44) {
      WIRE_OK(w.bytes(&s));
      spec->unk_surface.assign(s);
    } else {
      WIRE_OK(w.skip(wt));
    }
  }
  return okStatus();
}

Status parseNormalizerSpec(std::string_view msg, std::string_view name, SpmSpec* spec,
                           bool denormalizer) {
  Wire w(msg);
  while (!w.done()) {
    uint32_t f, wt;
    WIRE_OK(w.tag(&f, &wt));
    uint64_t v;
    std::string_view s;
    if (wt == 2 && f == 2) {
      WIRE_OK(w.bytes(&s));
      (denormalizer ? spec->denorm_charsmap : spec->charsmap).assign(s);
    } else if (wt == 0 && f >= 3 && f <= 5 && !denormalizer) {
      WIRE_OK(w.varint(&v));
      if (f == 3) spec->add_dummy_prefix = v != 0;
      if (f == 4) spec->remove_extra_whitespaces = v != 0;
      if (f == 5) spec->escape_whitespaces = v != 0;
    } else {
      WIRE_OK(w.skip(wt));
    }
  }
  return okStatus();
}

Result<SpmSpec> parseModelProto(std::string_view bytes, std::string_view name) {
  SpmSpec spec;
  Wire w(bytes);
  while (!w.done()) {
    uint32_t f, wt;
    WIRE_OK(w.tag(&f, &wt));
    if (wt == 2 && (f == 1 || f == 2 || f == 3 || f == 5)) {
      std::string_view msg;
      WIRE_OK(w.bytes(&msg));
      if (f == 1) {
        spec.pieces.emplace_back();
        RETURN_IF_ERROR(parsePiece(msg, name, &spec.pieces.back()));
      } else if (f == 2) {
        RETURN_IF_ERROR(parseTrainerSpec(msg, name, &spec));
      } else {
        RETURN_IF_ERROR(parseNormalizerSpec(msg, name, &spec, f == 5));
      }
    } else {
      WIRE_OK(w.skip(wt));
    }
  }
  if (spec.pieces.empty()) {
    return invalidArgument(std::string(name) +
                           ": not a sentencepiece model (no pieces) nor a tokenizer.json");
  }
  return spec;
}
#undef WIRE_OK

// ---- the tokenizer ----
class UnigramTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> create(SpmSpec spec, std::string_view name);

  TokenizerKind kind() const override { return TokenizerKind::kUnigram; }
  void encode(std::string_view text, std::vector<TokenId>* out) const override;
  void encodeAllowingSpecial(std::string_view text, std::vector<TokenId>* out) const override {
    // sentencepiece never matches control symbols in text; there is nothing more to allow.
    encode(text, out);
  }
  int32_t vocabSize() const override { return static_cast<int32_t>(pieces_.size()); }
  std::optional<std::string_view> idToPiece(TokenId id) const override {
    if (id < 0 || id >= vocabSize()) return std::nullopt;
    return std::string_view(pieces_[id]);
  }
  std::optional<TokenId> tokenId(std::string_view piece) const override {
    auto it = piece_ids_.find(std::string(piece));
    if (it == piece_ids_.end()) return std::nullopt;
    return it->second;
  }
  bool isSpecial(TokenId id) const override {
    return id >= 0 && id < vocabSize() && types_[id] == kControl;
  }
  std::vector<TokenId> specialIds() const override {
    std::vector<TokenId> ids;
    for (TokenId i = 0; i < vocabSize(); ++i) {
      if (types_[i] == kControl) ids.push_back(i);
    }
    return ids;
  }
  bool decodeStep(TokenId id, bool skip_special, DecodeState* state,
                  std::string* out) const override;
  void decodeFinish(DecodeState* state, std::string* out) const override;

 private:
  // sentencepiece Normalizer::NormalizePrefix: returns the normalized form of the longest
  // prefix rule (or the char itself) and how many input bytes it consumed.
  std::string_view normalizePrefix(std::string_view input, size_t* consumed) const;
  void normalize(std::string_view input, std::string* normalized) const;
  void viterbi(std::string_view normalized, std::vector<TokenId>* out) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<uint8_t> types_;
  struct PieceInfo {
    float score;
    uint8_t type;
  };
  std::vector<PieceInfo> info_;  // scores_ and types_ side by side for the lattice walk
  std::unordered_map<std::string, TokenId> piece_ids_;
  DoubleArray trie_;          // NORMAL, USER_DEFINED, UNUSED pieces -> id
  DoubleArray user_defined_;  // user-defined symbols (kept raw by the normalizer)
  bool has_user_defined_ = false;
  TokenId unk_id_ = -1;
  TokenId byte_ids_[256];
  std::vector<uint8_t> byte_value_;  // id -> byte, for BYTE pieces
  float min_score_ = FLT_MAX;
  float max_score_ = FLT_MIN;
  bool byte_fallback_ = false;
  std::string unk_surface_;
  bool add_dummy_prefix_ = true;
  bool remove_extra_whitespaces_ = true;
  bool escape_whitespaces_ = true;
  // Normalizer charsmap: darts units + NUL-separated normalized strings.
  std::vector<uint32_t> charsmap_units_;
  std::string charsmap_normalized_;
  DartsView charsmap_;
  // Per leading byte: 0 = copy this byte/char as-is (no rule, no user symbol starts with it),
  // 1 = needs the full prefix lookup.
  uint8_t lead_needs_lookup_[256];
  // For 2- and 3-byte characters whose lead byte needs a lookup: bit set = no charsmap key and
  // no user-defined symbol starts with this character, so it is copied as-is.
  std::vector<uint64_t> bmp_plain_;
  bool bmpPlain(uint32_t cp) const { return (bmp_plain_[cp >> 6] >> (cp & 63)) & 1; }
};

Result<std::unique_ptr<Tokenizer>> UnigramTokenizer::create(SpmSpec spec, std::string_view name) {
  const std::string n(name);
  if (spec.model_type != 1) {
    return invalidArgument(n + ": sentencepiece model_type " + std::to_string(spec.model_type) +
                           " is not supported (only UNIGRAM)");
  }
  if (spec.treat_whitespace_as_suffix) {
    return invalidArgument(n + ": treat_whitespace_as_suffix is not supported");
  }
  if (!spec.denorm_charsmap.empty()) {
    return invalidArgument(n + ": a denormalizer charsmap is not supported");
  }
  auto t = std::make_unique<UnigramTokenizer>();
  const size_t count = spec.pieces.size();
  if (count > static_cast<size_t>(INT32_MAX / 2)) return invalidArgument(n + ": too many pieces");
  t->pieces_.reserve(count);
  t->scores_.reserve(count);
  t->types_.reserve(count);
  std::fill(std::begin(t->byte_ids_), std::end(t->byte_ids_), -1);
  t->byte_value_.assign(count, 0);
  std::vector<std::pair<std::string_view, int32_t>> trie_keys, user_keys;
  for (size_t i = 0; i < count; ++i) {
    auto& p = spec.pieces[i];
    if (p.piece.empty()) return invalidArgument(n + ": piece " + std::to_string(i) + " is empty");
    t->pieces_.push_back(std::move(p.piece));
    t->scores_.push_back(p.score);
    t->types_.push_back(p.type);
  }
  for (size_t i = 0; i < count; ++i) {
    const TokenId id = static_cast<TokenId>(i);
    const std::string& piece = t->pieces_[i];
    if (!t->piece_ids_.emplace(piece, id).second) {
      return invalidArgument(n + ": piece \"" + piece + "\" is defined twice");
    }
    const uint8_t type = t->types_[i];
    if (type == kNormal || type == kUserDefined || type == kUnused) {
      trie_keys.push_back({piece, id});
    }
    if (type == kUserDefined) user_keys.push_back({piece, id});
    if (type == kNormal) {
      t->min_score_ = std::min(t->min_score_, t->scores_[i]);
      t->max_score_ = std::max(t->max_score_, t->scores_[i]);
    }
    if (type == kUnknown) {
      if (t->unk_id_ >= 0) return invalidArgument(n + ": <unk> is defined twice");
      t->unk_id_ = id;
    }
    if (type == kByte) {
      if (!spec.byte_fallback) {
        return invalidArgument(n + ": byte piece " + piece + " without byte_fallback");
      }
      // "<0xXX>"
      unsigned v = 0;
      if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>' ||
          std::sscanf(piece.c_str() + 3, "%2X", &v) != 1) {
        return invalidArgument(n + ": malformed byte piece \"" + piece + "\"");
      }
      t->byte_ids_[v] = id;
      t->byte_value_[i] = static_cast<uint8_t>(v);
    }
  }
  if (t->unk_id_ < 0) return invalidArgument(n + ": no <unk> piece");
  t->info_.resize(count);
  for (size_t i = 0; i < count; ++i) t->info_[i] = {t->scores_[i], t->types_[i]};
  if (spec.byte_fallback) {
    // A missing byte piece falls back to <unk> (sentencepiece's PieceToId does the same).
    for (auto& b : t->byte_ids_) {
      if (b < 0) b = t->unk_id_;
    }
  }
  if (trie_keys.empty()) return invalidArgument(n + ": no normal pieces");
  RETURN_IF_ERROR(t->trie_.build(std::move(trie_keys)).withContext(n));
  if (!user_keys.empty()) {
    RETURN_IF_ERROR(t->user_defined_.build(user_keys).withContext(n));
    t->has_user_defined_ = true;
  }
  t->byte_fallback_ = spec.byte_fallback;
  t->unk_surface_ = spec.unk_surface;
  t->add_dummy_prefix_ = spec.add_dummy_prefix;
  t->remove_extra_whitespaces_ = spec.remove_extra_whitespaces;
  t->escape_whitespaces_ = spec.escape_whitespaces;
  if (!spec.charsmap.empty()) {
    const std::string& blob = spec.charsmap;
    uint32_t trie_size = 0;
    if (blob.size() <= 4) return invalidArgument(n + ": precompiled charsmap is broken");
    std::memcpy(&trie_size, blob.data(), 4);
    if (trie_size >= blob.size() - 4 || trie_size % 4 != 0) {
      return invalidArgument(n + ": precompiled charsmap trie size exceeds the blob");
    }
    t->charsmap_units_.resize(trie_size / 4);
    std::memcpy(t->charsmap_units_.data(), blob.data() + 4, trie_size);
    t->charsmap_normalized_ = blob.substr(4 + trie_size);
    t->charsmap_normalized_.push_back('\0');  // every value must end in a NUL
    t->charsmap_ = DartsView(t->charsmap_units_);
  }
  for (int c = 0; c < 256; ++c) {
    const auto b = static_cast<unsigned char>(c);
    bool lookup = t->charsmap_.hasPrefixByte(b);
    if (t->has_user_defined_ && t->user_defined_.next(DoubleArray::kRoot, b) >= 0) lookup = true;
    t->lead_needs_lookup_[c] = lookup ? 1 : 0;
  }
  t->bmp_plain_.assign(65536 / 64, 0);
  for (uint32_t cp = 0x80; cp < 0x10000; ++cp) {
    if (cp >= 0xD800 && cp < 0xE000) continue;
    std::string enc;
    utf8::append(cp, &enc);
    bool plain = true;
    uint32_t value = 0;
    // A key that starts with this character would be reached by walking its bytes; a walk
    // that dies inside the character proves there is none (the longest match would be 0).
    if (t->charsmap_.longestPrefix(enc, &value) > 0 || t->charsmap_.hasPath(enc)) plain = false;
    if (plain && t->has_user_defined_) {
      int32_t st = DoubleArray::kRoot;
      for (char ch : enc) {
        st = t->user_defined_.next(st, static_cast<unsigned char>(ch));
        if (st < 0) break;
      }
      if (st >= 0) plain = false;
    }
    if (plain) t->bmp_plain_[cp >> 6] |= 1ull << (cp & 63);
  }
  return std::unique_ptr<Tokenizer>(std::move(t));
}

std::string_view UnigramTokenizer::normalizePrefix(std::string_view input,
                                                   size_t* consumed) const {
  const auto lead = static_cast<unsigned char>(input[0]);
  if (lead_needs_lookup_[lead]) {
    if (has_user_defined_) {
      // Longest user-defined symbol: copied as-is, never normalized.
      int32_t s = DoubleArray::kRoot;
      size_t best = 0;
      for (size_t i = 0; i < input.size(); ++i) {
        s = user_defined_.next(s, static_cast<unsigned char>(input[i]));
        if (s < 0) break;
        if (user_defined_.value(s) >= 0) best = i + 1;
      }
      if (best > 0) {
        *consumed = best;
        return input.substr(0, best);
      }
    }
    uint32_t value = 0;
    const size_t len = charsmap_.longestPrefix(input, &value);
    if (len > 0) {
      *consumed = len;
      if (value >= charsmap_normalized_.size()) return {};  // broken model: normalize to nothing
      return std::string_view(charsmap_normalized_.data() + value);
    }
  }
  if (lead < 0x80) {
    *consumed = 1;
    return input.substr(0, 1);
  }
  uint32_t cp;
  const int len = utf8::decode(reinterpret_cast<const unsigned char*>(input.data()),
                               input.size(), &cp);
  if (len == 0) {
    *consumed = 1;  // malformed: U+FFFD, one byte consumed
    return utf8::kReplacement;
  }
  *consumed = static_cast<size_t>(len);
  return input.substr(0, static_cast<size_t>(len));
}

void UnigramTokenizer::normalize(std::string_view input, std::string* normalized) const {
  normalized->clear();
  if (input.empty()) return;
  size_t consumed = 0;
  if (remove_extra_whitespaces_) {
    while (!input.empty()) {
      std::string_view sp = normalizePrefix(input, &consumed);
      if (sp != " ") break;
      input.remove_prefix(consumed);
    }
  }
  if (input.empty()) return;
  normalized->reserve(input.size() * 3 + 3);
  const std::string_view space = escape_whitespaces_ ? kSpaceSymbol : std::string_view(" ");
  if (add_dummy_prefix_) normalized->append(space);
  bool is_prev_space = remove_extra_whitespaces_;
  while (!input.empty()) {
    const auto lead = static_cast<unsigned char>(input[0]);
    std::string_view sp;
    if (lead < 0x80) {
      if (!lead_needs_lookup_[lead]) {
        // Fast path: a plain ASCII byte maps to itself (a space to the space symbol, dropped
        // after another space when extra whitespace is removed).
        if (lead == ' ') {
          if (!is_prev_space) normalized->append(space);
          is_prev_space = remove_extra_whitespaces_;
        } else {
          normalized->push_back(static_cast<char>(lead));
          is_prev_space = false;
        }
        input.remove_prefix(1);
        continue;
      }
    } else if (lead >= 0xC2 && lead < 0xF0) {
      uint32_t cp;
      const int len = utf8::decode(reinterpret_cast<const unsigned char*>(input.data()),
                                   input.size(), &cp);
      if (len > 0 && bmpPlain(cp)) {
        normalized->append(input.data(), static_cast<size_t>(len));
        is_prev_space = false;
        input.remove_prefix(static_cast<size_t>(len));
        continue;
      }
    }
    sp = normalizePrefix(input, &consumed);
    while (is_prev_space && !sp.empty() && sp[0] == ' ') sp.remove_prefix(1);
    if (!sp.empty()) {
      for (char ch : sp) {
        if (ch == ' ') {
          normalized->append(space);
        } else {
          normalized->push_back(ch);
        }
      }
      is_prev_space = sp.back() == ' ';
    }
    input.remove_prefix(consumed);
    if (!remove_extra_whitespaces_) is_prev_space = false;
  }
  if (remove_extra_whitespaces_) {
    while (normalized->size() >= space.size() &&
           std::string_view(*normalized).substr(normalized->size() - space.size()) == space) {
      normalized->resize(normalized->size() - space.size());
    }
  }
}

void UnigramTokenizer::viterbi(std::string_view normalized, std::vector<TokenId>* out) const {
  struct BestPathNode {
    TokenId id;
    float best_path_score;
    int32_t starts_at;
  };
  thread_local std::vector<BestPathNode> best;
  thread_local std::vector<std::pair<int32_t, TokenId>> path;  // (starts_at, id), reversed
  const int32_t size = static_cast<int32_t>(normalized.size());
  best.assign(static_cast<size_t>(size) + 1, BestPathNode{-1, 0.0f, -1});
  const float unk_score = min_score_ - 10.0f;  // kUnkPenalty
  const auto* data = reinterpret_cast<const unsigned char*>(normalized.data());
  static constexpr int8_t kOneCharLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  int32_t starts_at = 0;
  while (starts_at < size) {
    const float till_here = best[starts_at].best_path_score;
    bool has_single_node = false;
    const int32_t mblen = std::min<int32_t>(kOneCharLen[data[starts_at] >> 4], size - starts_at);
    int32_t s = DoubleArray::kRoot;
    for (int32_t key_pos = starts_at; key_pos < size;) {
      s = trie_.next(s, data[key_pos]);
      if (s < 0) break;
      ++key_pos;
      const TokenId id = trie_.value(s);
      if (id < 0) continue;
      const PieceInfo info = info_[id];
      const uint8_t type = info.type;
      if (type == kUnused) continue;
      BestPathNode& target = best[key_pos];
      const int32_t length = key_pos - starts_at;
      // sentencepiece computes this in double (the ternary promotes) and compares in double.
      const double score = type == kUserDefined
                               ? (static_cast<double>(static_cast<float>(length) * max_score_) - 0.1)
                               : static_cast<double>(info.score);
      const double candidate = score + static_cast<double>(till_here);
      if (target.starts_at == -1 || candidate > static_cast<double>(target.best_path_score)) {
        target.best_path_score = static_cast<float>(candidate);
        target.starts_at = starts_at;
        target.id = id;
      }
      if (!has_single_node && length == mblen) has_single_node = true;
    }
    if (!has_single_node) {
      BestPathNode& target = best[starts_at + mblen];
      const float candidate = unk_score + till_here;
      if (target.starts_at == -1 || candidate > target.best_path_score) {
        target.best_path_score = candidate;
        target.starts_at = starts_at;
        target.id = unk_id_;
      }
    }
    starts_at += mblen;
  }
  path.clear();
  for (int32_t ends_at = size; ends_at > 0;) {
    const BestPathNode& node = best[ends_at];
    path.push_back({node.starts_at, node.id});
    ends_at = node.starts_at;
  }
  // Emit in order: merge unknown runs, or split them into bytes.
  bool prev_unk = false;
  int32_t end = size;
  // path is reversed; compute piece ends by walking forward.
  for (size_t k = path.size(); k-- > 0;) {
    const int32_t begin = path[k].first;
    const int32_t piece_end = k == 0 ? end : path[k - 1].first;
    const TokenId id = path[k].second;
    const bool is_unk = id == unk_id_;
    if (is_unk && byte_fallback_) {
      for (int32_t i = begin; i < piece_end; ++i) out->push_back(byte_ids_[data[i]]);
    } else if (!(is_unk && prev_unk)) {
      out->push_back(id);
    }
    prev_unk = is_unk;
  }
}

void UnigramTokenizer::encode(std::string_view text, std::vector<TokenId>* out) const {
  thread_local std::string normalized;
  normalize(text, &normalized);
  if (normalized.empty()) return;
  viterbi(normalized, out);
}

// DecodeState use: flag0 = "the leading-space position has passed" (!is_bos_ws),
// flag1 = bos_ws_seen, emitted = bytes of text so far, pending = a run of byte pieces.
bool UnigramTokenizer::decodeStep(TokenId id, bool skip_special, DecodeState* state,
                                  std::string* out) const {
  if (id < 0 || id >= vocabSize()) return false;
  const size_t before = out->size();
  ++state->tokens;
  const uint8_t type = types_[id];
  if (type == kByte) {
    state->pending.push_back(static_cast<char>(byte_value_[id]));
    const size_t keep = utf8::appendPerByteLossy(state->pending, false, out);
    state->pending.erase(0, state->pending.size() - keep);
    state->emitted += out->size() - before;
    return true;
  }
  if (!state->pending.empty()) {
    utf8::appendPerByteLossy(state->pending, true, out);
    state->pending.clear();
  }
  if (state->flag1 || state->emitted + (out->size() - before) > 0) state->flag0 = true;
  bool bos_ws_seen = false;
  if (type == kControl) {
    // invisible
  } else if (type == kUnknown) {
    out->append(unk_surface_);
  } else {
    std::string_view piece = pieces_[id];
    if (!state->flag0 && (add_dummy_prefix_ || remove_extra_whitespaces_)) {
      if (piece.substr(0, kSpaceSymbol.size()) == kSpaceSymbol) {
        piece.remove_prefix(kSpaceSymbol.size());
        bos_ws_seen = true;
      }
      if (remove_extra_whitespaces_) bos_ws_seen = false;
    }
    for (size_t i = 0; i < piece.size();) {
      if (piece.compare(i, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
        out->push_back(' ');
        i += kSpaceSymbol.size();
      } else {
        out->push_back(piece[i]);
        ++i;
      }
    }
  }
  state->flag1 = bos_ws_seen;
  state->emitted += out->size() - before;
  (void)skip_special;  // control symbols are always invisible
  return true;
}

void UnigramTokenizer::decodeFinish(DecodeState* state, std::string* out) const {
  if (!state->pending.empty()) {
    utf8::appendPerByteLossy(state->pending, true, out);
    state->pending.clear();
  }
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> loadSentencePieceModel(std::string_view bytes,
                                                          std::string_view name) {
  ASSIGN_OR_RETURN(SpmSpec spec, parseModelProto(bytes, name));
  return UnigramTokenizer::create(std::move(spec), name);
}

}  // namespace garden::ivy
