#include "services/ivy/harmony/parser.h"

#include <utility>

namespace garden::ivy::harmony {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
constexpr std::string_view kChannelText = "<|channel|>";
constexpr std::string_view kConstrainText = "<|constrain|>";

bool isAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && isAsciiSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && isAsciiSpace(s.back())) s.remove_suffix(1);
  return s;
}

std::vector<std::string> splitWhitespace(std::string_view s) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && isAsciiSpace(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !isAsciiSpace(s[j])) ++j;
    if (j > i) parts.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return parts;
}

struct HeaderParseResult {
  ParsedHeaderText parsed;
  std::vector<std::string> problems;  // what a strict parse would have rejected
};

HeaderParseResult parseHeaderLenient(std::string_view text, std::optional<Role> role,
                                     bool parse_recipient_and_type) {
  HeaderParseResult r;
  MessageHeader& h = r.parsed.header;
  std::string s(text);
  if (size_t idx = s.find(kChannelText); idx != std::string::npos) {
    size_t start = idx + kChannelText.size();
    size_t end = start;
    while (end < s.size() && !isAsciiSpace(s[end]) && s[end] != '<') ++end;
    if (end == start) {
      r.problems.push_back("channel marker present but no channel value found in header");
    } else {
      h.channel = s.substr(start, end - start);
    }
    s = s.substr(0, idx) + s.substr(end);
  }
  s = std::string(trim(s));
  if (s.find(kConstrainText) != std::string::npos) {
    std::string spaced;
    for (size_t i = 0; i < s.size();) {
      if (s.compare(i, kConstrainText.size(), kConstrainText) == 0) {
        spaced += " ";
        spaced += kConstrainText;
        i += kConstrainText.size();
      } else {
        spaced += s[i++];
      }
    }
    s = std::string(trim(spaced));
  }
  std::vector<std::string> parts = splitWhitespace(s);
  std::optional<std::string> first_word;
  if (role) {
    h.role = *role;
  } else if (parts.empty()) {
    r.problems.push_back("message header did not contain a role");
    h.role = Role::kAssistant;
  } else {
    first_word = parts[0];
    if (auto parsed = roleFromName(parts[0])) {
      h.role = *parsed;
    } else if (parts.size() > 1 || parts[0].starts_with("to=")) {
      h.role = Role::kTool;
      parts.erase(parts.begin());
    } else {
      r.problems.push_back("Unknown role: " + parts[0]);
      h.role = Role::kAssistant;
      first_word.reset();
      parts.clear();
    }
  }
  if (!parts.empty() && parts[0] == roleName(h.role)) parts.erase(parts.begin());

  if (parse_recipient_and_type && !parts.empty()) {
    size_t num_parts = parts.size();
    std::string last = parts.back();
    parts.pop_back();
    if (last.starts_with("to=")) {
      h.recipient = last.substr(3);
    } else if (num_parts == 1 && !last.starts_with(kConstrainText)) {
      h.recipient = last;
    } else {
      h.content_type = last;
      if (!parts.empty()) {
        std::string rec = parts.back();
        parts.pop_back();
        h.recipient = rec.starts_with("to=") ? rec.substr(3) : rec;
      }
    }
  }
  if (!parts.empty()) {
    std::string joined;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i) joined += " ";
      joined += parts[i];
    }
    r.parsed.leftover = std::move(joined);
  }
  if (h.role == Role::kTool) h.author_name = first_word;
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
