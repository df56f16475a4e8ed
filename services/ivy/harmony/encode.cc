#include "services/ivy/harmony/encode.h"

#include <string>

namespace garden::ivy::harmony {

Status checkHarmonyTokenizer(const Tokenizer& tokenizer) {
  for (HarmonyTokenId id : {kReturn, kConstrain, kChannel, kStart, kEnd, kMessage, kCall}) {
    std::string_view text = *formattingTokenText(id);
    auto found = tokenizer.tokenId(text);
    if (!found || *found != id) {
      return failedPrecondition("tokenizer is not Harmony-compatible: " + std::string(text) +
                                " should be id " + std::to_string(id) + ", is " +
                                (found ? std::to_string(*found) : std::string("missing")));
    }
  }
  return okStatus();
}

void encodeSegments(std::span<const Segment> segments, const Tokenizer& tokenizer,
                    std::vector<TokenId>* out) {
  for (const Segment& s : segments) {
    if (s.kind == Segment::Kind::kSpecial) {
      out->push_back(s.special);
    } else {
      tokenizer.encode(s.text, out);
    }
  }
}

std::vector<TokenId> encodeSegments(std::span<const Segment> segments, const Tokenizer& tokenizer) {
  std::vector<TokenId> ids;
  encodeSegments(segments, tokenizer, &ids);
  return ids;
}

}  // namespace garden::ivy::harmony
