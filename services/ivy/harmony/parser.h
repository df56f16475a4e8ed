#pragma once
// Streaming Harmony parser: generated token ids -> message events (spec §1.11).
//
//   MessageStart{header}  once a header is complete (after <|message|>)
//   ContentDelta{text}    content text, only ever whole UTF-8 characters
//   MessageEnd{stop}      at <|end|>/<|return|>/<|call|>, at end of stream, or implicitly
//
// Two modes. Strict (openai_harmony's default): malformed sequences are InvalidArgument errors,
// exactly where the reference errors. Lenient (what the server uses): never fails; every
// malformed input has the defined result listed below, and each recovery is counted in
// `recoveries()` with a short reason:
//   * a token other than <|start|> between messages: <|channel|> starts an assistant header (the
//     model skipped "<|start|>assistant"); a text token starts an assistant message with no
//     header (no channel); stop tokens and other specials are dropped;
//   * a header that ends in a stop token or end of stream without <|message|>: the words after
//     role/channel become the content of a message (openai_harmony's non-strict rule); when the
//     role is not known (the header began with an explicit <|start|>), it is dropped;
//   * <|start|> inside a header: the partial header is dropped and a new one begins;
//   * a header longer than `max_header_tokens`: it is parsed as in the stop-token case and the
//     parser continues in content (memory stays bounded);
//   * unparseable header parts (unknown role, leftover words, empty channel): role falls back to
//     assistant, leftovers are ignored, an empty channel is absent;
//   * <|start|> or <|channel|> inside content: the current message ends (MessageEnd without stop
//     token) and a new header begins; <|endoftext|> ends the message like a stop token; other
//     special ids in content are dropped; ids outside the vocabulary become U+FFFD;
//   * reserved ids (isReservedId) in a header are dropped too, so none becomes part of a channel
//     or recipient.
// An id of the model's vocabulary that the tokenizer does not name (200019..201087: the gpt-oss
// tokenizer.json stops at 200018) has no text in either mode, as Hugging Face decodes it; only an
// id past the model's vocabulary (>= 201088) becomes U+FFFD.
// Content is decoded with the tokenizer's incremental decoder (Tokenizer::decodeStep), so a
// delta never splits a UTF-8 character; invalid bytes become U+FFFD as the tokenizer decides.
//
// One parser per generation, used by one thread. The Tokenizer must outlive it.

#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"
#include "services/ivy/harmony/chat.h"
#include "services/ivy/harmony/tokens.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy::harmony {

struct MessageHeader {
  Role role = Role::kAssistant;
  std::optional<std::string> author_name;  // tool-authored messages: "browser.search"
  std::optional<std::string> channel;
  std::optional<std::string> recipient;
  std::optional<std::string> content_type;

  bool operator==(const MessageHeader&) const = default;
};

// "role=assistant name=- channel=analysis recipient=- content_type=-", for logs and tests.
std::string describeHeader(const MessageHeader& header);
inline void PrintTo(const MessageHeader& header, std::ostream* os) {
  *os << describeHeader(header);
}

struct MessageStart {
  MessageHeader header;
};
struct ContentDelta {
  std::string text;
};
enum class EndReason {
  kStopToken,    // <|end|>, <|return|>, <|call|> (or <|endoftext|> in lenient mode)
  kEndOfStream,  // finish() with the message still open (truncation, max tokens)
  kImplicit,     // lenient: a new message began without the old one ending
};
struct MessageEnd {
  EndReason reason = EndReason::kStopToken;
  std::optional<TokenId> stop_token;  // set iff reason == kStopToken
};
using ParserEvent = std::variant<MessageStart, ContentDelta, MessageEnd>;

// A finished message (the non-streaming view).
struct ParsedMessage {
  MessageHeader header;
  std::string content;
  EndReason end = EndReason::kStopToken;
  std::optional<TokenId> stop_token;
};

struct ParserOptions {
  // Role of the message the prompt opened ("<|start|>assistant"): the parser starts inside its
  // header. nullopt: the input starts between messages (expects <|start|>).
  std::optional<Role> role = Role::kAssistant;
  bool strict = false;
  size_t max_header_tokens = 256;
};

class StreamParser {
 public:
  StreamParser(const Tokenizer& tokenizer, ParserOptions options);

  // Consumes one id and appends the events it produced. Lenient mode always returns OK. In
  // strict mode an error leaves the parser failed: every later call returns the same error.
  Status push(TokenId id, std::vector<ParserEvent>* events);
  // End of stream. Closes an open message (MessageEnd kEndOfStream).
  Status finish(std::vector<ParserEvent>* events);

  const std::vector<ParsedMessage>& messages() const { return messages_; }
  // Lenient-mode recoveries, in order (empty for well-formed input).
  const std::vector<std::string>& recoveries() const { return recoveries_; }

  enum class State { kExpectStart, kHeader, kContent };
  State state() const { return state_; }
  // Header of the message whose content is being parsed (state kContent).
  const std::optional<MessageHeader>& currentHeader() const { return current_header_; }

 private:
  Status pushImpl(TokenId id, std::vector<ParserEvent>* events);
  void beginHeader(std::optional<Role> role);
  // Header complete at <|message|>: parse and enter content.
  Status completeHeader(std::vector<ParserEvent>* events);
  // Header ended without <|message|> (stop token, EOS, overflow). `keep_open`: continue in
  // content (overflow) instead of ending the message.
  void malformedHeader(std::vector<ParserEvent>* events, EndReason reason,
                       std::optional<TokenId> stop, bool keep_open);
  void startContent(MessageHeader header, std::vector<ParserEvent>* events);
  void appendContent(TokenId id, std::vector<ParserEvent>* events);
  void flushDecoder(std::string* out);
  // Appends the text of content/header id `id` (see the file comment for ids without a token).
  void decodeId(TokenId id, Tokenizer::DecodeState* state, std::string* out) const;
  void emitText(std::string text, std::vector<ParserEvent>* events);
  void endMessage(EndReason reason, std::optional<TokenId> stop, std::vector<ParserEvent>* events);
  std::string decodeHeader() const;
  void recover(std::string what);

  const Tokenizer& tokenizer_;
  ParserOptions options_;
  State state_;
  std::optional<Role> next_role_;
  std::vector<TokenId> header_tokens_;
  std::optional<MessageHeader> current_header_;
  std::string current_content_;
  Tokenizer::DecodeState decode_state_;  // holds an incomplete UTF-8 sequence of the content
  std::vector<ParsedMessage> messages_;
  std::vector<std::string> recoveries_;
  Status failed_;
};

// Header string parsing (spec §1.11, "Header string parsing"). `role`: the known role, if any.
// `parse_recipient_and_type` false: leftover words are returned as content (malformed messages).
// Strict errors: empty channel, unknown role, leftover words when parsing recipient/type.
struct ParsedHeaderText {
  MessageHeader header;
  std::optional<std::string> leftover;  // words not used by the header, joined by ' '
};
Result<ParsedHeaderText> parseHeaderText(std::string_view text, std::optional<Role> role,
                                         bool parse_recipient_and_type);

// Whole-sequence convenience: pushes every id then finishes.
Result<std::vector<ParsedMessage>> parseCompletion(const Tokenizer& tokenizer,
                                                   std::span<const TokenId> ids,
                                                   ParserOptions options);

}  // namespace garden::ivy::harmony
