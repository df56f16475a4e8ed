#include "services/ivy/harmony/chat_output.h"

#include <algorithm>

namespace garden::ivy::harmony {

std::string_view finishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kToolCalls:
      return "tool_calls";
    case FinishReason::kLength:
      return "length";
  }
  return "stop";
}

void ChatDelta::append(const ChatDelta& other) {
  reasoning_content += other.reasoning_content;
  content += other.content;
  for (const ToolCallDelta& d : other.tool_calls) {
    if (!tool_calls.empty() && tool_calls.back().index == d.index && !d.id && !d.name) {
      tool_calls.back().arguments += d.arguments;
    } else {
      tool_calls.push_back(d);
    }
  }
}

ChatOutputAccumulator::ChatOutputAccumulator(ChatOutputOptions options)
    : options_(std::move(options)) {
  if (!options_.make_tool_call_id) {
    options_.make_tool_call_id = [](size_t index) { return "call_" + std::to_string(index); };
  }
}

ChatOutputAccumulator::Target ChatOutputAccumulator::route(const MessageHeader& h) const {
  if (h.role != Role::kAssistant) return Target::kDrop;
  if (h.recipient && *h.recipient != "all") {
    const std::string& r = *h.recipient;
    bool is_function = r.starts_with("functions.") && r.size() > 10;
    if (!is_function) {
      is_function = std::find(options_.function_names.begin(), options_.function_names.end(), r) !=
                    options_.function_names.end();
    }
    return is_function && options_.allow_tool_calls ? Target::kToolCall : Target::kReasoning;
  }
  if (h.channel == "final" || h.channel == "commentary") return Target::kContent;
  return Target::kReasoning;
}

ChatDelta ChatOutputAccumulator::onEvent(const ParserEvent& event) {
  ChatDelta delta;
  if (const auto* start = std::get_if<MessageStart>(&event)) {
    target_ = route(start->header);
    if (target_ == Target::kToolCall) {
      const std::string& r = *start->header.recipient;
      std::string name = r.starts_with("functions.") ? r.substr(10) : r;
      size_t index = output_.tool_calls.size();
      ToolCall call{options_.make_tool_call_id(index), std::move(name), ""};
      delta.tool_calls.push_back(ToolCallDelta{index, call.id, call.name, ""});
      output_.tool_calls.push_back(std::move(call));
    }
  } else if (const auto* d = std::get_if<ContentDelta>(&event)) {
    switch (target_) {
      case Target::kDrop:
        break;
      case Target::kReasoning:
        output_.reasoning_content += d->text;
        delta.reasoning_content = d->text;
        break;
      case Target::kContent:
        output_.content += d->text;
        delta.content = d->text;
        break;
      case Target::kToolCall:
        output_.tool_calls.back().arguments += d->text;
        delta.tool_calls.push_back(
            ToolCallDelta{output_.tool_calls.size() - 1, std::nullopt, std::nullopt, d->text});
        break;
    }
  } else {
    target_ = Target::kDrop;
  }
  return delta;
}

ChatDelta ChatOutputAccumulator::onEvents(const std::vector<ParserEvent>& events) {
  ChatDelta all;
  for (const ParserEvent& e : events) all.append(onEvent(e));
  return all;
}

FinishReason ChatOutputAccumulator::finishReason(bool hit_length) const {
  if (hit_length) return FinishReason::kLength;
  if (!output_.tool_calls.empty()) return FinishReason::kToolCalls;
  return FinishReason::kStop;
}

HarmonyOutputDecoder::HarmonyOutputDecoder(const Tokenizer& tokenizer, ParserOptions parser_options,
                                           ChatOutputOptions output_options)
    : parser_(tokenizer,
              [&] {
                parser_options.strict = false;
                return parser_options;
              }()),
      accumulator_(std::move(output_options)) {}

ChatDelta HarmonyOutputDecoder::push(TokenId id) {
  events_.clear();
  (void)parser_.push(id, &events_);  // lenient: always OK
  return accumulator_.onEvents(events_);
}

ChatDelta HarmonyOutputDecoder::finish() {
  events_.clear();
  (void)parser_.finish(&events_);
  return accumulator_.onEvents(events_);
}

}  // namespace garden::ivy::harmony
