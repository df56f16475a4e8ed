#pragma once
// Parser events -> the chat API's view of a completion: `reasoning_content`, `content` and
// `tool_calls[{id, name, arguments}]`, both as streaming deltas and accumulated. The accumulated
// output is by construction the concatenation of the deltas, so streaming and non-streaming
// responses carry identical tool calls and text.
//
// Routing of each message, decided at its MessageStart:
//   * role other than assistant (e.g. a hallucinated tool result)     -> dropped
//   * recipient "functions.NAME" (or a bare NAME that is a declared function), and tool calls
//     allowed                                                          -> tool call NAME
//   * any other recipient (built-in tools, unknown targets), or a function call while tool
//     calls are not allowed (tool_choice "none")                       -> reasoning_content
//   * no recipient, channel "final" or "commentary" (a preamble)       -> content
//   * no recipient, channel "analysis", absent or unknown              -> reasoning_content
// So reasoning never reaches `content` unless the model labelled it final/commentary.
//
// One per generation, used by one thread.

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "services/ivy/harmony/parser.h"

namespace garden::ivy::harmony {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // the message content as generated (JSON text for well-behaved models)
  bool operator==(const ToolCall&) const = default;
};

enum class FinishReason { kStop, kToolCalls, kLength };
std::string_view finishReasonName(FinishReason reason);  // "stop" | "tool_calls" | "length"

struct ChatOutput {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;
};

// One streamed tool-call fragment, as OpenAI streams them: the first fragment of a call carries
// id and name; later ones carry argument text only.
struct ToolCallDelta {
  size_t index = 0;
  std::optional<std::string> id;
  std::optional<std::string> name;
  std::string arguments;
  bool operator==(const ToolCallDelta&) const = default;
};

struct ChatDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
  // Appends `other` (merging argument fragments of the same call).
  void append(const ChatDelta& other);
};

struct ChatOutputOptions {
  // Declared function names; a bare recipient equal to one of them is a call to it.
  std::vector<std::string> function_names;
  // False for tool_choice "none": calls are routed to reasoning, never exposed.
  bool allow_tool_calls = true;
  // Id of the index-th tool call of this completion; default "call_<index>". The API layer
  // supplies unique ids (e.g. from the request id).
  std::function<std::string(size_t index)> make_tool_call_id;
};

class ChatOutputAccumulator {
 public:
  explicit ChatOutputAccumulator(ChatOutputOptions options = {});

  // Applies one event and returns the delta it produced (often empty).
  ChatDelta onEvent(const ParserEvent& event);
  ChatDelta onEvents(const std::vector<ParserEvent>& events);

  const ChatOutput& output() const { return output_; }
  // `hit_length`: generation stopped at the token limit rather than a stop token.
  FinishReason finishReason(bool hit_length) const;

 private:
  enum class Target { kDrop, kReasoning, kContent, kToolCall };
  Target route(const MessageHeader& header) const;

  ChatOutputOptions options_;
  ChatOutput output_;
  Target target_ = Target::kDrop;
};

// Parser + accumulator: ids in, chat deltas out. The usual object for one generation.
class HarmonyOutputDecoder {
 public:
  HarmonyOutputDecoder(const Tokenizer& tokenizer, ParserOptions parser_options,
                       ChatOutputOptions output_options);
  // Lenient parsing never fails, so these return plain deltas.
  ChatDelta push(TokenId id);
  ChatDelta finish();

  const ChatOutput& output() const { return accumulator_.output(); }
  FinishReason finishReason(bool hit_length) const { return accumulator_.finishReason(hit_length); }
  const StreamParser& parser() const { return parser_; }

 private:
  StreamParser parser_;
  ChatOutputAccumulator accumulator_;
  std::vector<ParserEvent> events_;
};

}  // namespace garden::ivy::harmony
