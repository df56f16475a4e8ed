#pragma once
// The fixed special-token ids of the o200k_harmony encoding (shared/spec/harmony.md §1.1) and
// their literal texts. The renderer emits these ids directly; the parser recognises them by id.
// Caller text never becomes one of these ids: it is always encoded with Tokenizer::encode().
// Plain constants; usable from any thread.

#include <cstdint>
#include <optional>
#include <string_view>

namespace garden::ivy::harmony {

using HarmonyTokenId = int32_t;

inline constexpr HarmonyTokenId kStartOfText = 199998;  // <|startoftext|>, never rendered
inline constexpr HarmonyTokenId kEndOfText = 199999;    // <|endoftext|>
inline constexpr HarmonyTokenId kReturn = 200002;       // <|return|>: end of final answer, stop
inline constexpr HarmonyTokenId kConstrain = 200003;    // <|constrain|>
inline constexpr HarmonyTokenId kChannel = 200005;      // <|channel|>
inline constexpr HarmonyTokenId kStart = 200006;        // <|start|>
inline constexpr HarmonyTokenId kEnd = 200007;          // <|end|>
inline constexpr HarmonyTokenId kMessage = 200008;      // <|message|>
inline constexpr HarmonyTokenId kCall = 200012;         // <|call|>: end of a tool call, stop
// First id past the model's vocabulary (embedding rows 0..201087).
inline constexpr HarmonyTokenId kModelVocabSize = 201088;
// First id of the special range (ordinary BPE ids are below it).
inline constexpr HarmonyTokenId kFirstSpecialId = 199998;

// The literal text of a Harmony formatting token ("<|start|>"), or nullopt for any other id.
// Reserved ids are not named here (they are not formatting tokens).
constexpr std::optional<std::string_view> formattingTokenText(HarmonyTokenId id) {
  switch (id) {
    case kStartOfText:
      return "<|startoftext|>";
    case kEndOfText:
      return "<|endoftext|>";
    case kReturn:
      return "<|return|>";
    case kConstrain:
      return "<|constrain|>";
    case kChannel:
      return "<|channel|>";
    case kStart:
      return "<|start|>";
    case kEnd:
      return "<|end|>";
    case kMessage:
      return "<|message|>";
    case kCall:
      return "<|call|>";
    default:
      return std::nullopt;
  }
}

// A Harmony-reserved id: in the special range of the model's vocabulary but not a formatting
// token (<|reserved_200013|>, <|endofprompt|>, and 200019..201087, which the gpt-oss
// tokenizer.json does not name at all). Never visible text in chat output (as Hugging Face's
// decode with skip_special_tokens=True, which vLLM uses for outputs).
constexpr bool isReservedId(HarmonyTokenId id) {
  return id >= kFirstSpecialId && id < kModelVocabSize && !formattingTokenText(id);
}

// Tokens that end a message in the parser: <|return|>, <|call|>, <|end|>.
constexpr bool isMessageStop(HarmonyTokenId id) {
  return id == kReturn || id == kCall || id == kEnd;
}

// Tokens at which sampling stops for an assistant turn (spec §1.10): <|return|> and <|call|>.
// Do not stop on <|end|>: the model continues with the next message after it.
inline constexpr HarmonyTokenId kAssistantStopTokens[] = {kReturn, kCall};

}  // namespace garden::ivy::harmony
