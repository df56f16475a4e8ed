#pragma once
// A grammar applied to one part of a generated token stream. For gpt-oss (Harmony) only the
// final channel's message is JSON; analysis text, tool calls and headers stay free:
//
//   ... <|channel|> final [more header tokens] <|message|>  {JSON under the grammar}  <|return|>
//
// The decoder watches sampled ids: after `channel_token` followed by exactly `channel_prefix`
// (the ids of "final"), then any header ids up to `message_token`, the grammar is active; every
// next token must then be allowed by it (the mask) until an end token (<|return|>, <|end|>),
// which it allows only once the value is complete. A later final message is constrained again
// with a fresh matcher. channel_token < 0: the grammar is active from the first token (plain
// completions, models without channels).
//
// Strict function tools [TAG_STRICT_TOOLS]: with `tools` non-empty the decoder follows the Harmony
// messages themselves (the states of ivy's lenient output parser, services/ivy/harmony/parser.cc:
// between messages, header, body) and reads each header's text when its <|message|> comes
// (common/harmony_header.h, the function ivy's output side reads them with). A header whose
// recipient is a strict tool (to=functions.NAME) switches the body to NAME's grammar, which ends
// with `harmony.call` (<|call|>) once the arguments are complete; a header on the final channel
// switches to `grammar` (response_format; may be null) as above; every other message is free.
// The turn starts inside an assistant header ("<|start|>assistant" ends the prompt); the
// `turn_prefix` ids (a forced tool_choice's header, already in the prompt) are replayed first,
// so a prompt that ends in a strict tool's "<|message|>" is constrained from the first token.
// Per sampled token outside a constrained body: a few compares and, inside a header, an append
// of the token's bytes (headers are capped at kMaxHeaderTokens, as ivy caps them).
//
// Threads: one decoder per sequence, used by one thread (tulip's scheduler).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/grammar/matcher.h"

namespace garden::grammar {

// A strict function tool: the grammar of its parameters schema.
struct ToolGrammar {
  std::string name;  // "get_weather": the header names it as to=functions.get_weather
  std::shared_ptr<const CompiledGrammar> grammar;
};

// The Harmony formatting ids the decoder follows messages by (o200k_harmony: 200006, ...).
struct HarmonyIds {
  int32_t start = -1;        // <|start|>
  int32_t channel = -1;      // <|channel|>
  int32_t constrain = -1;    // <|constrain|>
  int32_t message = -1;      // <|message|>
  int32_t end = -1;          // <|end|>
  int32_t call = -1;         // <|call|>: a tool call's end, the only end of a strict body
  int32_t ret = -1;          // <|return|>
  int32_t end_of_text = -1;  // <|endoftext|>
};

struct ConstraintSpec {
  int32_t channel_token = -1;
  std::vector<int32_t> channel_prefix;
  int32_t message_token = -1;
  std::vector<int32_t> end_tokens;
  // Strict tools [TAG_STRICT_TOOLS]; empty: the channel trigger above alone.
  std::vector<ToolGrammar> tools;
  HarmonyIds harmony;
  std::vector<int32_t> turn_prefix;  // the assistant turn's ids already in the prompt
};

class ConstrainedDecoder {
 public:
  // As ivy's parser (ParserOptions::max_header_tokens): a longer header is no header.
  static constexpr int32_t kMaxHeaderTokens = 256;

  // `grammar` may be null when `spec.tools` is not empty (tools only, no response_format).
  ConstrainedDecoder(std::shared_ptr<const CompiledGrammar> grammar, ConstraintSpec spec);

  // The next token is under a grammar: the caller must mask with fillMask().
  bool active() const { return matcher_ != nullptr; }
  void fillMask(std::span<uint32_t> words) { matcher_->fillNextTokenBitmask(words); }
  size_t maskWords() const { return mask_words_; }
  // Advances by a sampled token. false: the token broke the grammar while active (the mask was
  // not applied): the decoder stops constraining this message.
  bool accept(int32_t token);
  // Constrained messages completed so far.
  int32_t completed() const { return completed_; }
  // The strict tool whose call body is being constrained; -1 when none (tests, diagnostics).
  int32_t activeTool() const { return active_tool_; }

 private:
  enum class Header { kNone, kPrefix, kRest };
  // Harmony message states (routed mode: tools non-empty).
  enum class Msg { kBetween, kHeader, kBody };
  bool acceptRouted(int32_t token);
  // `role`: the role already known ("" = read from the header's text).
  void beginHeader(std::string_view role);
  void completeHeader();
  bool isMessageStop(int32_t token) const;

  std::shared_ptr<const CompiledGrammar> grammar_;
  ConstraintSpec spec_;
  std::unique_ptr<GrammarMatcher> matcher_;
  const Vocabulary* vocab_ = nullptr;
  size_t mask_words_ = 0;
  Header header_ = Header::kNone;
  size_t prefix_pos_ = 0;
  int32_t completed_ = 0;
  // Routed mode.
  Msg msg_ = Msg::kHeader;
  std::string role_ = "assistant";  // of the header being read or the message whose body runs
  int32_t header_tokens_ = 0;
  std::string header_text_;
  int32_t active_tool_ = -1;
};

}  // namespace garden::grammar
