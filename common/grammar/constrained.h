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
// Threads: one decoder per sequence, used by one thread (tulip's scheduler).

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/grammar/matcher.h"

namespace garden::grammar {

struct ConstraintSpec {
  int32_t channel_token = -1;
  std::vector<int32_t> channel_prefix;
  int32_t message_token = -1;
  std::vector<int32_t> end_tokens;
};

class ConstrainedDecoder {
 public:
  ConstrainedDecoder(std::shared_ptr<const CompiledGrammar> grammar, ConstraintSpec spec);

  // The next token is under the grammar: the caller must mask with fillMask().
  bool active() const { return matcher_ != nullptr; }
  void fillMask(std::span<uint32_t> words) { matcher_->fillNextTokenBitmask(words); }
  size_t maskWords() const { return (static_cast<size_t>(grammar_->vocab().size()) + 31) / 32; }
  // Advances by a sampled token. false: the token broke the grammar while active (the mask was
  // not applied): the decoder stops constraining this message.
  bool accept(int32_t token);
  // Constrained messages completed so far.
  int32_t completed() const { return completed_; }

 private:
  enum class Header { kNone, kPrefix, kRest };
  std::shared_ptr<const CompiledGrammar> grammar_;
  ConstraintSpec spec_;
  std::unique_ptr<GrammarMatcher> matcher_;
  Header header_ = Header::kNone;
  size_t prefix_pos_ = 0;
  int32_t completed_ = 0;
};

}  // namespace garden::grammar
