#include "services/ivy/harmony/parser.h"

#include <utility>

#include "common/harmony_header.h"

namespace garden::ivy::harmony {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

struct HeaderParseResult {
  ParsedHeaderText parsed;
  std::vector<std::string> problems;  // what a strict parse would have rejected
};

// The fields as common/harmony_header reads them (tulip's constrained decoder reads the same
// [TAG_STRICT_TOOLS]), with what a strict parse rejects as problems.
HeaderParseResult parseHeaderLenient(std::string_view text, std::optional<Role> role,
                                     bool parse_recipient_and_type) {
  HarmonyHeaderFields f = parseHarmonyHeaderFields(
      text, role ? roleName(*role) : std::string_view(), parse_recipient_and_type);
  HeaderParseResult r;
  MessageHeader& h = r.parsed.header;
  if (f.channel_without_value) {
    r.problems.push_back("channel marker present but no channel value found in header");
  }
  if (f.role_missing) r.problems.push_back("message header did not contain a role");
  if (f.unknown_role) r.problems.push_back("Unknown role: " + *f.unknown_role);
  h.role = roleFromName(f.role).value_or(Role::kAssistant);
  h.author_name = std::move(f.author_name);
  h.channel = std::move(f.channel);
  h.recipient = std::move(f.recipient);
  h.content_type = std::move(f.content_type);
  r.parsed.leftover = std::move(f.leftover);
  return r;
}

}  // namespace

std::string describeHeader(const MessageHeader& h) {
  auto opt = [](const std::optional<std::string>& v) { return v ? *v : std::string("-"); };
  return "role=" + std::string(roleName(h.role)) + " name=" + opt(h.author_name) +
         " channel=" + opt(h.channel) + " recipient=" + opt(h.recipient) +
         " content_type=" + opt(h.content_type);
}

Result<ParsedHeaderText> parseHeaderText(std::string_view text, std::optional<Role> role,
                                         bool parse_recipient_and_type) {
  HeaderParseResult r = parseHeaderLenient(text, role, parse_recipient_and_type);
  if (!r.problems.empty()) return invalidArgument(r.problems.front());
  return std::move(r.parsed);
}

StreamParser::StreamParser(const Tokenizer& tokenizer, ParserOptions options)
    : tokenizer_(tokenizer), options_(options) {
  if (options_.role) {
    state_ = State::kHeader;
    next_role_ = options_.role;
  } else {
    state_ = State::kExpectStart;
  }
}

void StreamParser::recover(std::string what) { recoveries_.push_back(std::move(what)); }

void StreamParser::beginHeader(std::optional<Role> role) {
  state_ = State::kHeader;
  next_role_ = role;
  header_tokens_.clear();
}

std::string StreamParser::decodeHeader() const {
  // Formatting tokens are written as their literal text by us (the parser looks for
  // "<|channel|>" and "<|constrain|>" in the string); everything else through the tokenizer.
  std::string text;
  Tokenizer::DecodeState state;
  for (TokenId id : header_tokens_) {
    if (auto literal = formattingTokenText(id)) {
      tokenizer_.decodeFinish(&state, &text);
      state = Tokenizer::DecodeState();
      text += *literal;
    } else if (!options_.strict && isReservedId(id)) {
      continue;  // no text, as in content (a reserved id must not end up in a recipient)
    } else {
      decodeId(id, &state, &text);
    }
  }
  tokenizer_.decodeFinish(&state, &text);
  return text;
}

void StreamParser::decodeId(TokenId id, Tokenizer::DecodeState* state, std::string* out) const {
  if (tokenizer_.decodeStep(id, /*skip_special=*/false, state, out)) return;
  // An id the tokenizer does not name: inside the model's vocabulary (a reserved id past the
  // tokenizer.json's last one) it has no text, as Hugging Face decodes it; past it, U+FFFD after
  // what was held.
  if (id >= 0 && id < kModelVocabSize) return;
  tokenizer_.decodeFinish(state, out);
  *state = Tokenizer::DecodeState();
  *out += kReplacement;
}

void StreamParser::startContent(MessageHeader header, std::vector<ParserEvent>* events) {
  state_ = State::kContent;
  next_role_.reset();
  header_tokens_.clear();
  current_header_ = header;
  current_content_.clear();
  decode_state_ = Tokenizer::DecodeState();
  events->push_back(MessageStart{std::move(header)});
}

void StreamParser::emitText(std::string text, std::vector<ParserEvent>* events) {
  if (text.empty()) return;
  current_content_ += text;
  events->push_back(ContentDelta{std::move(text)});
}

void StreamParser::endMessage(EndReason reason, std::optional<TokenId> stop,
                              std::vector<ParserEvent>* events) {
  std::string rest;
  flushDecoder(&rest);
  emitText(std::move(rest), events);
  messages_.push_back(
      ParsedMessage{std::move(*current_header_), std::move(current_content_), reason, stop});
  current_header_.reset();
  current_content_.clear();
  state_ = State::kExpectStart;
  events->push_back(MessageEnd{reason, stop});
}

Status StreamParser::completeHeader(std::vector<ParserEvent>* events) {
  std::string text = decodeHeader();
  HeaderParseResult r = parseHeaderLenient(text, next_role_, /*parse_recipient_and_type=*/true);
  if (r.parsed.leftover) {
    r.problems.push_back("unexpected tokens remaining in message header: " + *r.parsed.leftover);
  }
  if (!r.problems.empty()) {
    if (options_.strict) return invalidArgument(r.problems.front());
    for (auto& p : r.problems) recover("header: " + p);
  }
  startContent(std::move(r.parsed.header), events);
  return okStatus();
}

void StreamParser::malformedHeader(std::vector<ParserEvent>* events, EndReason reason,
                                   std::optional<TokenId> stop, bool keep_open) {
  std::optional<Role> role = next_role_;
  if (!role && keep_open) role = Role::kAssistant;
  if (!role || header_tokens_.empty()) {
    // openai_harmony drops a malformed header whose role is unknown; so do we.
    recover(header_tokens_.empty() ? "stop token with an empty header"
                                   : "dropped a header without <|message|> and without a role");
    header_tokens_.clear();
    next_role_.reset();
    state_ = State::kExpectStart;
    return;
  }
  recover("header without <|message|>: its words are the message content");
  HeaderParseResult r =
      parseHeaderLenient(decodeHeader(), role, /*parse_recipient_and_type=*/false);
  startContent(std::move(r.parsed.header), events);
  if (r.parsed.leftover) emitText(std::move(*r.parsed.leftover), events);
  if (!keep_open) endMessage(reason, stop, events);
}

void StreamParser::appendContent(TokenId id, std::vector<ParserEvent>* events) {
  std::string text;
  decodeId(id, &decode_state_, &text);
  emitText(std::move(text), events);
}

void StreamParser::flushDecoder(std::string* out) {
  tokenizer_.decodeFinish(&decode_state_, out);
  decode_state_ = Tokenizer::DecodeState();
}

Status StreamParser::push(TokenId id, std::vector<ParserEvent>* events) {
  if (!failed_.isOk()) return failed_;
  Status s = pushImpl(id, events);
  if (!s.isOk()) failed_ = s;
  return s;
}

Status StreamParser::pushImpl(TokenId id, std::vector<ParserEvent>* events) {
  const bool lenient = !options_.strict;
  switch (state_) {
    case State::kExpectStart: {
      if (id == kStart) {
        beginHeader(std::nullopt);
        return okStatus();
      }
      if (!lenient) {
        return invalidArgument("unexpected token " + std::to_string(id) +
                               " while expecting start token " + std::to_string(kStart));
      }
      if (id == kChannel) {
        recover("<|channel|> without <|start|>: assistant header assumed");
        beginHeader(Role::kAssistant);
        header_tokens_.push_back(id);
      } else if (id >= kFirstSpecialId || id < 0) {
        recover("dropped token " + std::to_string(id) + " between messages");
      } else {
        recover("text without a header: assistant message without channel");
        startContent(MessageHeader{}, events);
        appendContent(id, events);
      }
      return okStatus();
    }
    case State::kHeader: {
      if (id == kMessage) return completeHeader(events);
      if (lenient && isMessageStop(id)) {
        malformedHeader(events, EndReason::kStopToken, id, /*keep_open=*/false);
        return okStatus();
      }
      if (lenient && id == kStart) {
        recover("<|start|> inside a header: the partial header is dropped");
        beginHeader(std::nullopt);
        return okStatus();
      }
      header_tokens_.push_back(id);
      if (header_tokens_.size() > options_.max_header_tokens) {
        if (!lenient) return invalidArgument("message header longer than the limit");
        malformedHeader(events, EndReason::kImplicit, std::nullopt, /*keep_open=*/true);
      }
      return okStatus();
    }
    case State::kContent: {
      if (isMessageStop(id)) {
        endMessage(EndReason::kStopToken, id, events);
        return okStatus();
      }
      if (lenient && id >= kFirstSpecialId) {
        if (id == kEndOfText) {
          recover("<|endoftext|> ended a message");
          endMessage(EndReason::kStopToken, id, events);
        } else if (id == kStart) {
          recover("<|start|> inside content: the message ends there");
          endMessage(EndReason::kImplicit, std::nullopt, events);
          beginHeader(std::nullopt);
        } else if (id == kChannel) {
          recover("<|channel|> inside content: a new message of the same role begins");
          Role role = current_header_->role;
          endMessage(EndReason::kImplicit, std::nullopt, events);
          beginHeader(role);
          header_tokens_.push_back(id);
        } else if (id < kModelVocabSize) {
          recover("dropped special token " + std::to_string(id) + " inside content");
        } else {
          appendContent(id, events);  // out of vocabulary: U+FFFD
        }
        return okStatus();
      }
      if (id == kStart || id == kChannel || id == kMessage || id == kConstrain ||
          id == kStartOfText || id == kEndOfText) {
        // Strict: like the reference, a formatting token inside content is its literal text.
        std::string text;
        flushDecoder(&text);
        emitText(text + std::string(*formattingTokenText(id)), events);
        return okStatus();
      }
      appendContent(id, events);
      return okStatus();
    }
  }
  return okStatus();
}

Status StreamParser::finish(std::vector<ParserEvent>* events) {
  if (!failed_.isOk()) return failed_;
  switch (state_) {
    case State::kExpectStart:
      return okStatus();
    case State::kHeader:
      if (options_.strict) {
        failed_ = invalidArgument("unexpected end of stream while waiting for message header");
        return failed_;
      }
      malformedHeader(events, EndReason::kEndOfStream, std::nullopt, /*keep_open=*/false);
      return okStatus();
    case State::kContent:
      endMessage(EndReason::kEndOfStream, std::nullopt, events);
      return okStatus();
  }
  return okStatus();
}

Result<std::vector<ParsedMessage>> parseCompletion(const Tokenizer& tokenizer,
                                                   std::span<const TokenId> ids,
                                                   ParserOptions options) {
  StreamParser parser(tokenizer, options);
  std::vector<ParserEvent> events;
  for (TokenId id : ids) {
    RETURN_IF_ERROR(parser.push(id, &events));
    events.clear();
  }
  RETURN_IF_ERROR(parser.finish(&events));
  return parser.messages();
}

}  // namespace garden::ivy::harmony
