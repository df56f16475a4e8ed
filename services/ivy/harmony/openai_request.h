#pragma once
// OpenAI chat-completions request (JSON) -> a Harmony conversation ready to render, plus what the
// output side needs (declared function names, tool_choice). This is the mapping that both the
// chat API and `ivy harmony-render` use:
//   * a Harmony system message is always written: model identity, knowledge cutoff, optional
//     current date (ChatRenderOptions), `reasoning_effort` (low|medium|high, default medium);
//   * leading `system`/`developer` messages become the developer message's "# Instructions"
//     (joined by a blank line); `tools` become its `functions` namespace; later system/developer
//     messages become developer messages in place;
//   * `user` content (a string or text parts) is rendered verbatim;
//   * `assistant`: `reasoning_content` (or `reasoning`) -> an `analysis` message; `content` (even
//     empty, when the message has nothing else) ->
//     `final`, or a `commentary` preamble when the message has `tool_calls`; each tool call ->
//     `to=functions.NAME` on `commentary` with content type `<|constrain|>json`;
//   * `tool` messages -> `functions.NAME to=assistant` on `commentary` (NAME from the matching
//     earlier tool call's id, or from `name`);
//   * tool_choice "none" leaves the tools out of the prompt (and the output side must not expose
//     calls); "required" and a named function are validated and returned for the caller to
//     enforce on the output;
//   * `tools[].function.strict` must be a boolean (or null); the strict tools are listed in
//     `strict_functions` for the caller to constrain [TAG_STRICT_TOOLS].
// Errors are InvalidArgument naming the field ("messages[2].content: ..."). Any thread.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "services/ivy/harmony/chat.h"
#include "services/ivy/harmony/render.h"

namespace garden::ivy::harmony {

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

struct ChatRenderOptions {
  std::optional<std::string> current_date;  // "YYYY-MM-DD"; absent: no "Current date:" line
  std::string knowledge_cutoff = "2024-06";
  std::string model_identity = "You are ChatGPT, a large language model trained by OpenAI.";
  RenderConfig render;
};

// A tool given with "strict": true [TAG_STRICT_TOOLS]: its call arguments are generated under
// the grammar of `parameters_json` (the caller compiles it; errors name
// tools[index].function.parameters).
struct StrictFunction {
  size_t index = 0;             // position in `tools`
  std::string name;
  std::string parameters_json;  // minified; "" when the tool has no parameters
};

struct HarmonyChatRequest {
  std::vector<Message> messages;  // system, developer?, then the converted history
  ReasoningEffort reasoning_effort = ReasoningEffort::kMedium;
  std::vector<std::string> function_names;  // declared tools, in request order
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::optional<std::string> tool_choice_name;  // kNamed only
  std::vector<StrictFunction> strict_functions;  // the tools with "strict": true, in order
};

Result<HarmonyChatRequest> harmonyRequestFromOpenAiJson(std::string_view json,
                                                        const ChatRenderOptions& options);

// Segments to append after the completion prompt ("<|start|>assistant") so that the model's
// turn begins inside a function call, enforcing tool_choice:
//   kNamed:    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
//   kRequired: <|channel|>commentary to=functions.     (the model writes the name)
//   kAuto, kNone: nothing.
// The chat API feeds the ids of these segments through its HarmonyOutputDecoder before the
// generated ids, so the call appears in the output exactly as if the model had written it.
std::vector<Segment> toolChoicePrefix(const HarmonyChatRequest& request);

}  // namespace garden::ivy::harmony
