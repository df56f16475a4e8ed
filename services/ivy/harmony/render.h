#pragma once
// Harmony renderer, layer 1: a conversation -> a sequence of segments (text pieces and special
// tokens) and the rendered string (specials written as their literal text, which is what the
// reference vectors compare). Layer 2 (encode.h) turns segments into ids: specials by their fixed
// ids, text through Tokenizer::encode(), so caller text can never become a special id.
// Rules follow shared/spec/harmony.md §1.2-§1.9 (openai_harmony's encoding.rs).
// Pure functions over value types; any thread.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/ivy/harmony/chat.h"
#include "services/ivy/harmony/tokens.h"

namespace garden::ivy::harmony {

struct Segment {
  enum class Kind { kText, kSpecial };
  Kind kind = Kind::kText;
  std::string text;            // kText: the text; kSpecial: the token's literal text
  HarmonyTokenId special = 0;  // kSpecial only

  bool operator==(const Segment&) const = default;
};

// Appends segments. Adjacent text pieces are NOT merged: the reference encodes each piece
// (role, " to=recipient", channel name, body) on its own, and BPE across a piece boundary could
// differ from BPE of each piece, so the id-level encoding keeps the boundaries.
class SegmentSink {
 public:
  void text(std::string_view t);
  void special(HarmonyTokenId id);
  const std::vector<Segment>& segments() const { return segments_; }
  std::vector<Segment> take() { return std::move(segments_); }

 private:
  std::vector<Segment> segments_;
};

// Concatenated text of the segments ("<|start|>user<|message|>...").
std::string segmentsToString(std::span<const Segment> segments);

// One message (spec §1.2). `conversation_has_function_tools` adds the "Calls to these tools must
// go to the commentary channel" line to a system message. Errors: a tool message without a name,
// system content outside a system message, developer content outside a developer message,
// invalid tool parameter JSON.
Status renderMessage(const Message& message, bool conversation_has_function_tools,
                     SegmentSink* sink);

// A whole conversation with the history rules of §1.9 (CoT dropping per `config`).
Result<std::vector<Segment>> renderConversation(std::span<const Message> messages,
                                                const RenderConfig& config);

// The completion prompt: renderConversation + <|start|> + role name ("assistant").
Result<std::vector<Segment>> renderConversationForCompletion(std::span<const Message> messages,
                                                             Role next_role,
                                                             const RenderConfig& config);

// renderConversation, with the final <|end|> replaced by <|return|> when the last message is an
// assistant `final` message (openai_harmony's render_conversation_for_training).
Result<std::vector<Segment>> renderConversationForTraining(std::span<const Message> messages,
                                                           const RenderConfig& config);

// Message bodies, exposed for tests.
Result<std::string> renderSystemContent(const SystemContent& system,
                                        bool conversation_has_function_tools);
Result<std::string> renderDeveloperContent(const DeveloperContent& developer);

}  // namespace garden::ivy::harmony
