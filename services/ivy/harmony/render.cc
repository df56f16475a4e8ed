#include "services/ivy/harmony/render.h"

#include <optional>

#include "services/ivy/harmony/schema_ts.h"

namespace garden::ivy::harmony {

std::string_view roleName(Role role) {
  switch (role) {
    case Role::kUser:
      return "user";
    case Role::kAssistant:
      return "assistant";
    case Role::kSystem:
      return "system";
    case Role::kDeveloper:
      return "developer";
    case Role::kTool:
      return "tool";
  }
  return "user";
}

std::optional<Role> roleFromName(std::string_view name) {
  if (name == "user") return Role::kUser;
  if (name == "assistant") return Role::kAssistant;
  if (name == "system") return Role::kSystem;
  if (name == "developer") return Role::kDeveloper;
  if (name == "tool") return Role::kTool;
  return std::nullopt;
}

std::string_view reasoningEffortName(ReasoningEffort effort) {
  switch (effort) {
    case ReasoningEffort::kLow:
      return "low";
    case ReasoningEffort::kMedium:
      return "medium";
    case ReasoningEffort::kHigh:
      return "high";
  }
  return "medium";
}

std::optional<ReasoningEffort> reasoningEffortFromName(std::string_view name) {
  if (name == "low") return ReasoningEffort::kLow;
  if (name == "medium") return ReasoningEffort::kMedium;
  if (name == "high") return ReasoningEffort::kHigh;
  return std::nullopt;
}

void SegmentSink::text(std::string_view t) {
  if (t.empty()) return;
  segments_.push_back(Segment{Segment::Kind::kText, std::string(t), 0});
}

void SegmentSink::special(HarmonyTokenId id) {
  auto text = formattingTokenText(id);
  CHECK_MSG(text.has_value(), "renderer asked for a non-formatting special token");
  segments_.push_back(Segment{Segment::Kind::kSpecial, std::string(*text), id});
}

std::string segmentsToString(std::span<const Segment> segments) {
  std::string out;
  for (const Segment& s : segments) out += s.text;
  return out;
}

namespace {

std::string joinSections(const std::vector<std::string>& sections) {
  std::string out;
  for (size_t i = 0; i < sections.size(); ++i) {
    if (i) out += "\n\n";
    out += sections[i];
  }
  return out;
}

bool hasFunctionTools(std::span<const Message> messages) {
  for (const Message& m : messages) {
    for (const Content& c : m.content) {
      if (c.kind != Content::Kind::kDeveloper) continue;
      auto it = c.developer.tools.find("functions");
      if (it != c.developer.tools.end() && !it->second.tools.empty()) return true;
    }
  }
  return false;
}

}  // namespace

Result<std::string> renderSystemContent(const SystemContent& sys,
                                        bool conversation_has_function_tools) {
  std::vector<std::string> sections;
  std::vector<std::string> top;
  if (sys.model_identity) top.push_back(*sys.model_identity);
  if (sys.knowledge_cutoff) top.push_back("Knowledge cutoff: " + *sys.knowledge_cutoff);
  if (sys.conversation_start_date) top.push_back("Current date: " + *sys.conversation_start_date);
  if (!top.empty()) {
    std::string joined;
    for (size_t i = 0; i < top.size(); ++i) {
      if (i) joined += "\n";
      joined += top[i];
    }
    sections.push_back(std::move(joined));
  }
  if (sys.reasoning_effort) {
    sections.push_back("Reasoning: " + std::string(reasoningEffortName(*sys.reasoning_effort)));
  }
  if (!sys.tools.empty()) {
    ASSIGN_OR_RETURN(std::string tools, renderToolsSection(sys.tools));
    sections.push_back(std::move(tools));
  }
  if (sys.channel_config && !sys.channel_config->valid_channels.empty()) {
    std::string header = "# Valid channels: ";
    const auto& channels = sys.channel_config->valid_channels;
    for (size_t i = 0; i < channels.size(); ++i) {
      if (i) header += ", ";
      header += channels[i];
    }
    header += ".";
    if (sys.channel_config->channel_required) {
      header += " Channel must be included for every message.";
    }
    if (conversation_has_function_tools) {
      header += "\nCalls to these tools must go to the commentary channel: 'functions'.";
    }
    sections.push_back(std::move(header));
  }
  return joinSections(sections);
}

Result<std::string> renderDeveloperContent(const DeveloperContent& dev) {
  std::vector<std::string> sections;
  if (dev.instructions) {
    sections.push_back("# Instructions");
    sections.push_back(*dev.instructions);
  }
  if (!dev.tools.empty()) {
    ASSIGN_OR_RETURN(std::string tools, renderToolsSection(dev.tools));
    sections.push_back(std::move(tools));
  }
  if (dev.response_formats) {
    sections.push_back("# Response Formats");
    sections.push_back(*dev.response_formats);
  }
  return joinSections(sections);
}

Status renderMessage(const Message& message, bool conversation_has_function_tools,
                     SegmentSink* sink) {
  sink->special(kStart);
  if (message.author.role == Role::kTool) {
    if (!message.author.name || message.author.name->empty()) {
      return invalidArgument("a tool message needs the tool's name as its author");
    }
    sink->text(*message.author.name);
  } else {
    sink->text(roleName(message.author.role));
    if (message.author.name) sink->text(":" + *message.author.name);
  }
  if (message.recipient && *message.recipient != "all") sink->text(" to=" + *message.recipient);
  if (message.channel) {
    sink->special(kChannel);
    sink->text(*message.channel);
  }
  if (message.content_type) {
    constexpr std::string_view kConstrainText = "<|constrain|>";
    std::string_view ct = *message.content_type;
    if (ct.starts_with(kConstrainText)) {
      sink->text(" ");
      sink->special(kConstrain);
      sink->text(ct.substr(kConstrainText.size()));
    } else {
      sink->text(" " + std::string(ct));
    }
  }
  sink->special(kMessage);
  for (const Content& c : message.content) {
    switch (c.kind) {
      case Content::Kind::kText:
        sink->text(c.text);
        break;
      case Content::Kind::kSystem: {
        if (message.author.role != Role::kSystem) {
          return invalidArgument("system content may only appear in a system message");
        }
        ASSIGN_OR_RETURN(std::string body,
                         renderSystemContent(c.system, conversation_has_function_tools));
        sink->text(body);
        break;
      }
      case Content::Kind::kDeveloper: {
        if (message.author.role != Role::kDeveloper) {
          return invalidArgument("developer content may only appear in a developer message");
        }
        ASSIGN_OR_RETURN(std::string body, renderDeveloperContent(c.developer));
        sink->text(body);
        break;
      }
    }
  }
  if (message.author.role == Role::kAssistant && message.recipient) {
    sink->special(kCall);
  } else {
    sink->special(kEnd);
  }
  return okStatus();
}

Result<std::vector<Segment>> renderConversation(std::span<const Message> messages,
                                                const RenderConfig& config) {
  const bool function_tools = hasFunctionTools(messages);
  bool last_assistant_is_final = false;
  for (size_t i = messages.size(); i-- > 0;) {
    if (messages[i].author.role == Role::kAssistant) {
      last_assistant_is_final = messages[i].channel == "final";
      break;
    }
  }
  const bool drop = config.auto_drop_analysis && last_assistant_is_final;
  std::optional<size_t> first_final;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].channel == "final") {
      first_final = i;
      break;
    }
  }
  SegmentSink sink;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (drop && first_final && i < *first_final && messages[i].channel == "analysis") continue;
    RETURN_IF_ERROR(renderMessage(messages[i], function_tools, &sink)
                        .withContext("message " + std::to_string(i)));
  }
  return sink.take();
}

Result<std::vector<Segment>> renderConversationForCompletion(std::span<const Message> messages,
                                                             Role next_role,
                                                             const RenderConfig& config) {
  ASSIGN_OR_RETURN(std::vector<Segment> segments, renderConversation(messages, config));
  segments.push_back(Segment{Segment::Kind::kSpecial, "<|start|>", kStart});
  segments.push_back(Segment{Segment::Kind::kText, std::string(roleName(next_role)), 0});
  return segments;
}

Result<std::vector<Segment>> renderConversationForTraining(std::span<const Message> messages,
                                                           const RenderConfig& config) {
  ASSIGN_OR_RETURN(std::vector<Segment> segments, renderConversation(messages, config));
  if (!messages.empty() && messages.back().author.role == Role::kAssistant &&
      messages.back().channel == "final" && !segments.empty() &&
      segments.back().kind == Segment::Kind::kSpecial) {
    segments.back() = Segment{Segment::Kind::kSpecial, "<|return|>", kReturn};
  }
  return segments;
}

}  // namespace garden::ivy::harmony
