#include "services/ivy/tokenizer/unigram.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
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
  // Returns a view of a per-thread buffer, valid until this thread's next normalize().
  std::string_view normalize(std::string_view input) const;
  void viterbi(std::string_view normalized, std::vector<TokenId>* out) const;
  // sentencepiece's lattice walk written plainly (node structs with a "not reached" marker).
  // Used when the fast walk's preconditions do not hold (non-finite scores, or a text so long
  // that a path score could overflow a float).
  void viterbiReference(std::string_view normalized, std::vector<TokenId>* out) const;

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
  // The same trie packed for the lattice walk ([TAG_LATTICE_NODES]): unit i of trie_ with the
  // piece that ends there and its edge score, so one step reads one node. UNUSED pieces are
  // left out (the lattice skips them); a USER_DEFINED piece's score depends only on its length,
  // i.e. on the node, so it is precomputed too.
  // 16 bytes, four to a cache line: long documents in many scripts touch much of the trie, so
  // its footprint decides how much of the walk hits L1/L2.
  struct LatticeNode {
    int32_t base;
    int32_t check;
    int32_t piece;  // the piece id, or kNoPiece
    // The edge score as the walk adds it (widened to double): a NORMAL piece's float score,
    // -infinity without a piece, NaN for a USER_DEFINED piece, whose double edge (not a
    // float) is user_edge_[piece]. Normal scores are never NaN here (scores_finite_).
    float edge;
  };
  std::vector<double> user_edge_;  // id -> edge of a USER_DEFINED piece (others unused)
  static constexpr int32_t kNoPiece = -1;
  std::vector<LatticeNode> lattice_;
  // The fast walk starts every position at -infinity instead of "not reached"; equal to
  // sentencepiece's rule while every candidate is finite: all scores finite and
  // text_bytes * max_abs_edge_score_ far below FLT_MAX.
  bool scores_finite_ = true;
  double max_abs_edge_score_ = 0;
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
  // Length of the NUL-terminated string at each offset of charsmap_normalized_ (capped at
  // 0xFFFF, beyond which strlen decides), so a rule's output needs no strlen.
  std::vector<uint16_t> charsmap_len_;
  std::string_view charsmapValue(uint32_t value) const {
    if (value >= charsmap_normalized_.size()) return {};  // broken model: normalize to nothing
    const char* p = charsmap_normalized_.data() + value;
    const uint16_t len = charsmap_len_[value];
    return len == 0xFFFF ? std::string_view(p) : std::string_view(p, len);
  }
  DartsView charsmap_;
  // Per leading byte: 0 = copy this byte/char as-is (no rule, no user symbol starts with it),
  // 1 = needs the full prefix lookup.
  uint8_t lead_needs_lookup_[256];
  // For 2- and 3-byte characters whose lead byte needs a lookup: bit set = no charsmap key and
  // no user-defined symbol starts with this character, so it is copied as-is.
  std::vector<uint64_t> bmp_plain_;
  bool bmpPlain(uint32_t cp) const { return (bmp_plain_[cp >> 6] >> (cp & 63)) & 1; }
  // ASCII bytes whose charsmap lookup is decided by the next byte alone ([TAG_ASCII_CLASS]):
  // no user-defined symbol starts with them and no charsmap key continues them with an ASCII
  // byte, so before an ASCII byte (or at the end) the rule is the byte's own: none
  // (kAsciiPlainBeforeAscii, copied) or ascii_value_ (kAsciiMappedBeforeAscii).
  enum AsciiClass : uint8_t {
    kAsciiPlain,  // no lookup ever (lead_needs_lookup_ == 0); not ' '
    kAsciiSpace,  // ' ' with no lookup
    kAsciiPlainBeforeAscii,
    kAsciiMappedBeforeAscii,
    kAsciiLookup,  // always the full prefix lookup
  };
  uint8_t ascii_class_[128];
  std::string_view ascii_value_[128];
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
    Result<PrecompiledCharsmap> charsmap = parsePrecompiledCharsmap(spec.charsmap);
    if (!charsmap.isOk()) return invalidArgument(n + ": " + charsmap.status().message());
    t->charsmap_units_ = std::move(charsmap->units);
    t->charsmap_normalized_ = std::move(charsmap->normalized);
    t->charsmap_normalized_.push_back('\0');  // every value must end in a NUL
    t->charsmap_ = DartsView(t->charsmap_units_);
    const std::string& norm = t->charsmap_normalized_;  // ends in a NUL
    t->charsmap_len_.assign(norm.size(), 0);
    for (size_t i = norm.size() - 1; i-- > 0;) {
      if (norm[i] != '\0') {
        const int len = std::min(t->charsmap_len_[i + 1] + 1, 0xFFFF);
        t->charsmap_len_[i] = static_cast<uint16_t>(len);
      }
    }
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
  // [TAG_ASCII_CLASS]
  for (int c = 0; c < 128; ++c) {
    const auto b = static_cast<unsigned char>(c);
    t->ascii_value_[c] = {};
    if (!t->lead_needs_lookup_[c]) {
      t->ascii_class_[c] = c == ' ' ? kAsciiSpace : kAsciiPlain;
      continue;
    }
    t->ascii_class_[c] = kAsciiLookup;
    if (t->has_user_defined_ && t->user_defined_.next(DoubleArray::kRoot, b) >= 0) continue;
    bool ascii_continuation = false;
    for (int d = 0; d < 128 && !ascii_continuation; ++d) {
      const char key[2] = {static_cast<char>(c), static_cast<char>(d)};
      ascii_continuation = t->charsmap_.hasPath(std::string_view(key, 2));
    }
    if (ascii_continuation) continue;
    uint32_t value = 0;
    const std::string_view one(reinterpret_cast<const char*>(&b), 1);
    if (t->charsmap_.longestPrefix(one, &value) == 1) {
      t->ascii_class_[c] = kAsciiMappedBeforeAscii;
      t->ascii_value_[c] = t->charsmapValue(value);
    } else {
      t->ascii_class_[c] = kAsciiPlainBeforeAscii;
    }
  }
  // [TAG_LATTICE_NODES]
  size_t max_piece_len = 0;
  for (size_t i = 0; i < count; ++i) max_piece_len = std::max(max_piece_len, t->pieces_[i].size());
  t->lattice_.resize(t->trie_.unitCount());
  for (size_t i = 0; i < t->lattice_.size(); ++i) {
    LatticeNode& node = t->lattice_[i];
    node.base = t->trie_.base(i);
    node.check = t->trie_.check(i);
    node.piece = kNoPiece;
    node.edge = -std::numeric_limits<float>::infinity();
    const int32_t id = t->trie_.value(static_cast<int32_t>(i));
    if (id < 0) continue;
    if (t->types_[id] == kNormal) {
      node.piece = id;
      node.edge = t->scores_[id];
    } else if (t->types_[id] == kUserDefined) {
      node.piece = id;
      // sentencepiece: length (bytes, the node's depth) * max_score in float, then - 0.1 in
      // double.
      const size_t len = t->pieces_[id].size();
      if (t->user_edge_.empty()) t->user_edge_.assign(count, 0.0);
      t->user_edge_[static_cast<size_t>(id)] =
          static_cast<double>(static_cast<float>(len) * t->max_score_) - 0.1;
      node.edge = std::numeric_limits<float>::quiet_NaN();
    }
  }
  // std::max would drop a NaN, so finiteness is checked on every edge score separately.
  double max_abs = 0;
  bool finite = true;
  auto note = [&](double edge) {
    if (!std::isfinite(edge)) finite = false;
    max_abs = std::max(max_abs, std::fabs(edge));
  };
  note(static_cast<double>(t->min_score_ - 10.0f));  // <unk>
  for (size_t i = 0; i < count; ++i) {
    if (t->types_[i] == kNormal) note(double{t->scores_[i]});
  }
  if (!user_keys.empty()) {
    for (size_t len = 1; len <= max_piece_len; ++len) {
      note(static_cast<double>(static_cast<float>(len) * t->max_score_) - 0.1);
    }
  }
  t->scores_finite_ = finite;
  t->max_abs_edge_score_ = max_abs;
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
      return charsmapValue(value);
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

std::string_view UnigramTokenizer::normalize(std::string_view input) const {
  if (input.empty()) return {};
  size_t consumed = 0;
  if (remove_extra_whitespaces_) {
    while (!input.empty()) {
      std::string_view sp = normalizePrefix(input, &consumed);
      if (sp != " ") break;
      input.remove_prefix(consumed);
    }
  }
  if (input.empty()) return {};
  // Output goes to a raw per-thread buffer. The fast paths write at most 3 bytes per input
  // byte (a space becomes U+2581), so a buffer of 3 * input + 3 only needs checking where a
  // charsmap rule may expand more than that (the general path below).
  struct Buffer {
    std::unique_ptr<char[]> data;
    size_t capacity = 0;
  };
  thread_local Buffer buf;
  auto ensure = [](size_t need, size_t used) {
    if (buf.capacity >= need) return;
    const size_t cap = std::max(need, buf.capacity * 2);
    std::unique_ptr<char[]> grown(new char[cap]);
    if (used > 0) std::memcpy(grown.get(), buf.data.get(), used);
    buf.data = std::move(grown);
    buf.capacity = cap;
  };
  ensure(input.size() * 3 + 3, 0);
  char* w = buf.data.get();
  const std::string_view space = escape_whitespaces_ ? kSpaceSymbol : std::string_view(" ");
  auto putSpace = [&]() {
    std::memcpy(w, space.data(), space.size());
    w += space.size();
  };
  if (add_dummy_prefix_) putSpace();
  bool is_prev_space = remove_extra_whitespaces_;
  const char* in = input.data();
  const char* const end = in + input.size();
  while (in < end) {
    const auto lead = static_cast<unsigned char>(*in);
    std::string_view sp;
    consumed = 0;
    if (lead < 0x80) {
      // Fast paths ([TAG_ASCII_CLASS]): a run of ASCII bytes that map to themselves is copied
      // at once; a space becomes the space symbol (dropped after another space when extra
      // whitespace is removed).
      const uint8_t cls = ascii_class_[lead];
      if (cls <= kAsciiPlainBeforeAscii && cls != kAsciiSpace) {
        // Inside a run every byte is followed by an ASCII byte; only the last one may stand
        // before a non-ASCII byte, where a kAsciiPlainBeforeAscii byte needs the lookup.
        // Copied while scanned (runs are short: a call to memcpy would cost more).
        const char* q = in;
        *w++ = *q++;
        while (q < end) {
          const auto c = static_cast<unsigned char>(*q);
          if (c >= 0x80) break;
          const uint8_t k = ascii_class_[c];
          if (k != kAsciiPlain && k != kAsciiPlainBeforeAscii) break;
          *w++ = static_cast<char>(c);
          ++q;
        }
        if (q < end && static_cast<unsigned char>(*q) >= 0x80 &&
            ascii_class_[static_cast<unsigned char>(q[-1])] == kAsciiPlainBeforeAscii) {
          --q;
          --w;
        }
        if (q > in) {
          is_prev_space = false;
          in = q;
          continue;
        }
        // A lone kAsciiPlainBeforeAscii byte before a non-ASCII byte: full lookup below.
      } else if (cls == kAsciiSpace) {
        if (!is_prev_space) putSpace();
        is_prev_space = remove_extra_whitespaces_;
        ++in;
        continue;
      } else if (cls == kAsciiMappedBeforeAscii &&
                 (in + 1 == end || static_cast<unsigned char>(in[1]) < 0x80)) {
        sp = ascii_value_[lead];
        consumed = 1;
      }
    } else if (lead >= 0xC2 && lead < 0xF0) {
      uint32_t cp;
      const int len = utf8::decode(reinterpret_cast<const unsigned char*>(in),
                                   static_cast<size_t>(end - in), &cp);
      if (len > 0 && bmpPlain(cp)) {
        for (int k = 0; k < len; ++k) *w++ = in[k];
        is_prev_space = false;
        in += len;
        continue;
      }
    }
    if (consumed == 0) {
      sp = normalizePrefix(std::string_view(in, static_cast<size_t>(end - in)), &consumed);
    }
    while (is_prev_space && !sp.empty() && sp[0] == ' ') sp.remove_prefix(1);
    if (!sp.empty()) {
      // Keep room for this rule's output plus 3 bytes per input byte still to come.
      const size_t used = static_cast<size_t>(w - buf.data.get());
      ensure(used + sp.size() * 3 + static_cast<size_t>(end - in) * 3 + 3, used);
      w = buf.data.get() + used;
      for (char ch : sp) {
        if (ch == ' ') {
          putSpace();
        } else {
          *w++ = ch;
        }
      }
      is_prev_space = sp.back() == ' ';
    }
    in += consumed;
    if (!remove_extra_whitespaces_) is_prev_space = false;
  }
  const char* const begin = buf.data.get();
  if (remove_extra_whitespaces_) {
    while (static_cast<size_t>(w - begin) >= space.size() &&
           std::memcmp(w - space.size(), space.data(), space.size()) == 0) {
      w -= space.size();
    }
  }
  return std::string_view(begin, static_cast<size_t>(w - begin));
}

void UnigramTokenizer::viterbiReference(std::string_view normalized,
                                        std::vector<TokenId>* out) const {
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
      // The edge is computed in double (sentencepiece's ternary promotes); the path score is
      // rounded to float BEFORE the comparison, as sentencepiece 0.2.x does ([TAG_SPM_FLOAT_TIE]).
      const double score = type == kUserDefined
                               ? (static_cast<double>(static_cast<float>(length) * max_score_) - 0.1)
                               : static_cast<double>(info.score);
      const float candidate = static_cast<float>(score + static_cast<double>(till_here));
      if (target.starts_at == -1 || candidate > target.best_path_score) {
        target.best_path_score = candidate;
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

// The lattice walk of sentencepiece's optimized encoder without node objects: per position a
// best score and a back-pointer, the trie walked over lattice_ directly, scratch reused per
// thread. Same float/double arithmetic and the same tie-breaking (first best wins) as
// viterbiReference(); only "not reached" is -infinity instead of a marker (see scores_finite_).
// [TAG_SPM_FLOAT_TIE] Ties: a candidate path score is rounded to float and must be strictly
// greater than the float already stored at that position, so among paths whose float scores
// are equal the one found first (the earliest start, i.e. the longest last piece) wins. This is
// what sentencepiece 0.2.x (the Python package, 0.2.2 checked: fixtures/spm02/) does. Debian's
// libsentencepiece 0.1.97 compares the unrounded double sum against the stored float instead,
// so a later candidate that rounds to the same float can still win there. The encoder's C++
// source is the same in v0.1.97 and v0.2.0 (only the precision the builds evaluate the
// comparison in differs; why the 0.2.x wheel's build rounds is not established).
// The existing test conformance_tokenizer_unigram (vs 0.1.97) can therefore differ on such ties.
void UnigramTokenizer::viterbi(std::string_view normalized, std::vector<TokenId>* out) const {
  const size_t size_bytes = normalized.size();
  if (!scores_finite_ || size_bytes >= static_cast<size_t>(INT32_MAX) ||
      static_cast<double>(size_bytes + 1) * max_abs_edge_score_ > 1e37) {
    viterbiReference(normalized, out);
    return;
  }
  struct Back {
    int32_t starts_at;
    TokenId id;
  };
  struct Scratch {
    std::unique_ptr<float[]> score;
    std::unique_ptr<Back[]> back;
    std::unique_ptr<int32_t[]> ends;
    size_t capacity = 0;
  };
  thread_local Scratch scratch;
  if (scratch.capacity < size_bytes + 1) {
    const size_t cap = std::max<size_t>(size_bytes + 1, scratch.capacity * 2);
    scratch.score.reset(new float[cap]);
    scratch.back.reset(new Back[cap]);
    scratch.ends.reset(new int32_t[cap]);
    scratch.capacity = cap;
  }
  const int32_t size = static_cast<int32_t>(size_bytes);
  float* const score = scratch.score.get();
  Back* const back = scratch.back.get();
  std::fill(score + 1, score + size + 1, -std::numeric_limits<float>::infinity());
  score[0] = 0.0f;
  const float unk_score = min_score_ - 10.0f;  // kUnkPenalty
  const auto* data = reinterpret_cast<const unsigned char*>(normalized.data());
  const LatticeNode* const nodes = lattice_.data();
  const auto root_base = static_cast<uint32_t>(nodes[0].base);
  static constexpr int8_t kOneCharLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  int32_t starts_at = 0;
  while (starts_at < size) {
    const float till_here = score[starts_at];
    const double till_here_d = till_here;
    const int32_t single_end =
        starts_at + std::min<int32_t>(kOneCharLen[data[starts_at] >> 4], size - starts_at);
    int32_t s = 0;  // DoubleArray::kRoot
    uint32_t base = root_base;
    int32_t key_pos = starts_at;
    // One step of the walk: the node reached, or nullptr when the trie has no such child. A
    // node without a piece scores -infinity, so its candidate never wins (every reached
    // position is finite, an unreached one is -infinity and needs a strict improvement).
    // sentencepiece adds and compares in double.
    auto step = [&]() {
      // lattice_ keeps trie_'s padding, so base + 255 is inside it ([TAG_DA_PADDING]).
      const uint32_t t = base + data[key_pos];
      const LatticeNode& node = nodes[t];
      if (node.check != s) return static_cast<const LatticeNode*>(nullptr);
      s = static_cast<int32_t>(t);
      base = static_cast<uint32_t>(node.base);
      ++key_pos;
      // Most nodes carry no piece (inside a multi-byte character, or a prefix that is no
      // piece); their -infinity candidate never wins, so they skip the update.
      if (node.piece == kNoPiece) return &node;
      double edge = static_cast<double>(node.edge);
      if (__builtin_expect(node.edge != node.edge, 0)) edge = user_edge_[node.piece];  // NaN
      // Rounded to float before the comparison ([TAG_SPM_FLOAT_TIE]).
      const float candidate = static_cast<float>(edge + till_here_d);
      // Written back either way (selects, not a branch): whether a candidate wins is data
      // dependent and mispredicts often on text with many competing pieces.
      const float current = score[key_pos];
      const bool better = candidate > current;
      score[key_pos] = better ? candidate : current;
      const Back old = back[key_pos];
      back[key_pos] = better ? Back{starts_at, node.piece} : old;
      return &node;
    };
    // The first character's bytes apart: whether a piece covers exactly it decides <unk>.
    bool has_single_node = false;
    const LatticeNode* node = nullptr;
    while (key_pos < single_end && (node = step()) != nullptr) {
    }
    if (key_pos == single_end && node != nullptr) {
      has_single_node = node->piece != kNoPiece;
      while (key_pos < size && step() != nullptr) {
      }
    }
    if (!has_single_node) {
      const float candidate = unk_score + till_here;
      if (candidate > score[single_end]) {
        score[single_end] = candidate;
        back[single_end] = {starts_at, unk_id_};
      }
    }
    starts_at = single_end;
  }
  // Every character boundary is reached (a piece or <unk> covers each character), so the
  // back-pointers from `size` lead to 0.
  int32_t* const ends = scratch.ends.get();
  size_t count = 0;
  for (int32_t e = size; e > 0; e = back[e].starts_at) ends[count++] = e;
  out->reserve(out->size() + count);
  bool prev_unk = false;
  for (size_t k = count; k-- > 0;) {
    const int32_t piece_end = ends[k];
    const Back& b = back[piece_end];
    const bool is_unk = b.id == unk_id_;
    if (is_unk && byte_fallback_) {
      for (int32_t i = b.starts_at; i < piece_end; ++i) out->push_back(byte_ids_[data[i]]);
    } else if (!(is_unk && prev_unk)) {
      out->push_back(b.id);
    }
    prev_unk = is_unk;
  }
}

void UnigramTokenizer::encode(std::string_view text, std::vector<TokenId>* out) const {
  const std::string_view normalized = normalize(text);
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
