#pragma once
// A small stand-in for the o200k_harmony tokenizer, for Harmony unit tests that need ids without
// the real tokenizer file. Ordinary ids: 0..255 are single bytes; a few multi-byte pieces carry
// their real o200k ids ("assistant" = 173781, "analysis" = 35644, ...) and one piece, 9552, is the
// real o200k token " \xF0\x9F" (a space and half an emoji) for UTF-8 streaming tests. Pieces
// never use ids below 256 (those are the bytes). Encoding is
// greedy longest match over those pieces, then bytes. Special ids are the Harmony table
// (199998..201087, reserved ones named <|reserved_N|>). encode() never yields a special id.
// Immutable after construction; any thread.

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy::testing {

class HarmonyFakeTokenizer : public Tokenizer {
 public:
  HarmonyFakeTokenizer() {
    pieces_ = {
        {"assistant", 173781}, {"analysis", 35644},         {"final", 17196},
        {"user", 1428},        {"system", 17360},           {"json", 4108},
        {" to", 316},          {"functions", 44580},        {"comment", 12606},
        {"ary", 815},          {" \xF0\x9F", 9552},         {"Hello", 13225},
        {" world", 2375},      {"\xF0\x9F\x98\x80", 30000},
    };
    for (TokenId id = 199998; id < 201088; ++id) special_ids_[specialName(id)] = id;
    // Longest first, so greedy matching prefers "assistant" over its bytes.
    std::sort(pieces_.begin(), pieces_.end(),
              [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }

  TokenizerKind kind() const override { return TokenizerKind::kByteLevelBpe; }

  void encode(std::string_view text, std::vector<TokenId>* out) const override {
    size_t i = 0;
    while (i < text.size()) {
      bool matched = false;
      for (const auto& [piece, id] : pieces_) {
        if (text.substr(i).starts_with(piece)) {
          out->push_back(id);
          i += piece.size();
          matched = true;
          break;
        }
      }
      if (!matched) out->push_back(static_cast<unsigned char>(text[i++]));
    }
  }

  void encodeAllowingSpecial(std::string_view text, std::vector<TokenId>* out) const override {
    size_t i = 0;
    while (i < text.size()) {
      size_t open = text.find("<|", i);
      while (open != std::string_view::npos) {
        size_t close = text.find("|>", open + 2);
        if (close == std::string_view::npos) {
          open = std::string_view::npos;
          break;
        }
        if (tokenId(text.substr(open, close + 2 - open))) break;
        open = text.find("<|", open + 2);
      }
      if (open == std::string_view::npos) {
        encode(text.substr(i), out);
        return;
      }
      size_t close = text.find("|>", open + 2);
      encode(text.substr(i, open - i), out);
      out->push_back(*tokenId(text.substr(open, close + 2 - open)));
      i = close + 2;
    }
  }

  int32_t vocabSize() const override { return 201088; }

  std::optional<std::string_view> idToPiece(TokenId id) const override {
    if (id >= 0 && id < 256) return std::nullopt;  // byte pieces are not needed by the tests
    for (const auto& [piece, pid] : pieces_) {
      if (pid == id) return std::string_view(piece);
    }
    return std::nullopt;
  }

  std::optional<TokenId> tokenId(std::string_view piece) const override {
    if (auto it = special_ids_.find(std::string(piece)); it != special_ids_.end())
      return it->second;
    for (const auto& [p, id] : pieces_) {
      if (p == piece) return id;
    }
    return std::nullopt;
  }

  bool isSpecial(TokenId id) const override { return id >= 199998 && id < 201088; }

  std::vector<TokenId> specialIds() const override {
    std::vector<TokenId> ids;
    for (TokenId id = 199998; id < 201088; ++id) ids.push_back(id);
    return ids;
  }

  // Whole-sequence decode through decodeStep/decodeFinish (Tokenizer::decode lives in the real
  // tokenizer library, which Harmony unit tests do not link). Out-of-range ids are skipped.
  std::string decodeForTest(std::span<const TokenId> ids, bool skip_special) const {
    DecodeState state;
    std::string out;
    for (TokenId id : ids) (void)decodeStep(id, skip_special, &state, &out);
    decodeFinish(&state, &out);
    return out;
  }

  // Raw bytes of one id; false for an id outside the vocabulary.
  bool tokenBytes(TokenId id, bool skip_special, std::string* out) const {
    if (id < 0 || id >= 201088) return false;
    if (id < 256) {
      out->push_back(static_cast<char>(id));
      return true;
    }
    if (isSpecial(id)) {
      if (!skip_special) *out += specialName(id);
      return true;
    }
    for (const auto& [piece, pid] : pieces_) {
      if (pid == id) {
        *out += piece;
        return true;
      }
    }
    // Other ordinary ids decode to a visible marker so tests notice them.
    *out += "[" + std::to_string(id) + "]";
    return true;
  }

  bool decodeStep(TokenId id, bool skip_special, DecodeState* state,
                  std::string* out) const override {
    if (!tokenBytes(id, skip_special, &state->pending)) return false;
    ++state->tokens;
    drain(&state->pending, /*final=*/false, out);
    return true;
  }

  void decodeFinish(DecodeState* state, std::string* out) const override {
    drain(&state->pending, /*final=*/true, out);
  }

  // Moves complete UTF-8 from *pending to *out; each maximal invalid subpart becomes U+FFFD;
  // an incomplete tail stays unless `final`.
  static void drain(std::string* pending, bool final, std::string* out) {
    const std::string& s = *pending;
    size_t i = 0;
    while (i < s.size()) {
      int n = sequence(std::string_view(s).substr(i));
      if (n > 0) {
        out->append(s, i, static_cast<size_t>(n));
        i += static_cast<size_t>(n);
      } else if (n < 0) {
        *out += "\xEF\xBF\xBD";
        i += static_cast<size_t>(-n);
      } else if (final) {
        *out += "\xEF\xBF\xBD";
        i = s.size();
      } else {
        break;
      }
    }
    pending->erase(0, i);
  }

  // >0: length of a complete valid sequence; 0: valid but incomplete; -n: n invalid bytes.
  static int sequence(std::string_view s) {
    auto c = static_cast<unsigned char>(s[0]);
    if (c < 0x80) return 1;
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
      need = 1;
    else if (c == 0xE0)
      need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
      need = 2;
    else if (c == 0xED)
      need = 2, hi = 0x9F;
    else if (c == 0xF0)
      need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
      need = 3;
    else if (c == 0xF4)
      need = 3, hi = 0x8F;
    else
      return -1;
    for (int k = 1; k <= need; ++k) {
      if (static_cast<size_t>(k) >= s.size()) return 0;
      auto x = static_cast<unsigned char>(s[static_cast<size_t>(k)]);
      if (x < (k == 1 ? lo : 0x80) || x > (k == 1 ? hi : 0xBF)) return -k;
    }
    return need + 1;
  }

  static std::string specialName(TokenId id) {
    switch (id) {
      case 199998:
        return "<|startoftext|>";
      case 199999:
        return "<|endoftext|>";
      case 200002:
        return "<|return|>";
      case 200003:
        return "<|constrain|>";
      case 200005:
        return "<|channel|>";
      case 200006:
        return "<|start|>";
      case 200007:
        return "<|end|>";
      case 200008:
        return "<|message|>";
      case 200012:
        return "<|call|>";
      default:
        return "<|reserved_" + std::to_string(id) + "|>";
    }
  }

 private:
  std::vector<std::pair<std::string, TokenId>> pieces_;
  std::unordered_map<std::string, TokenId> special_ids_;
};

}  // namespace garden::ivy::testing
