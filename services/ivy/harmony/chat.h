#pragma once
// The Harmony conversation model: plain value types that the renderer reads and the OpenAI
// request mapping (openai_request.h) builds. They mirror openai_harmony's `chat.rs`
// (Message, Author, SystemContent, DeveloperContent, ToolNamespaceConfig) so that behaviour
// can be compared with the reference vectors field for field.
// Value types; thread-compatible.

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace garden::ivy::harmony {

enum class Role { kUser, kAssistant, kSystem, kDeveloper, kTool };

// "user", "assistant", "system", "developer", "tool".
std::string_view roleName(Role role);
// Inverse of roleName; nullopt for anything else.
std::optional<Role> roleFromName(std::string_view name);

enum class ReasoningEffort { kLow, kMedium, kHigh };
std::string_view reasoningEffortName(ReasoningEffort effort);  // "low" | "medium" | "high"
std::optional<ReasoningEffort> reasoningEffortFromName(std::string_view name);

// One tool of a namespace. `parameters_json` is a JSON Schema as JSON text (object key order is
// significant: it is rendered in input order); absent means the tool takes no arguments.
struct ToolDescription {
  std::string name;
  std::string description;
  std::optional<std::string> parameters_json;
};

// A namespace of tools ("functions", "browser", "python"). A namespace without tools renders its
// description as plain text (the python tool); with tools, as `//` comments plus a TypeScript-like
// `namespace NAME { ... }` block.
struct ToolNamespace {
  std::string name;
  std::optional<std::string> description;
  std::vector<ToolDescription> tools;
};

struct ChannelConfig {
  std::vector<std::string> valid_channels = {"analysis", "commentary", "final"};
  bool channel_required = true;
};

// Body of the system message (spec §1.4). Defaults are openai_harmony's SystemContent::default().
struct SystemContent {
  std::optional<std::string> model_identity =
      std::string("You are ChatGPT, a large language model trained by OpenAI.");
  std::optional<ReasoningEffort> reasoning_effort = ReasoningEffort::kMedium;
  std::optional<std::string> knowledge_cutoff = std::string("2024-06");
  std::optional<std::string> conversation_start_date;  // "YYYY-MM-DD"
  // Built-in tool namespaces (browser, python), keyed and rendered in name order.
  std::map<std::string, ToolNamespace> tools;
  std::optional<ChannelConfig> channel_config = ChannelConfig{};
};

// Body of the developer message (spec §1.5): the caller's instructions and function tools.
struct DeveloperContent {
  std::optional<std::string> instructions;
  std::map<std::string, ToolNamespace> tools;  // usually just "functions"
  // Structured outputs: the body of a "# Response Formats" section ("## name\n\n// desc\n{schema}").
  std::optional<std::string> response_formats;
};

struct Author {
  Role role = Role::kUser;
  // Tool messages: the tool's name ("functions.get_weather"); required for role kTool.
  // Other roles: rendered as "role:name" (rare).
  std::optional<std::string> name;
};

// One content part. Exactly one of the three is meaningful, chosen by `kind`.
struct Content {
  enum class Kind { kText, kSystem, kDeveloper };
  Kind kind = Kind::kText;
  std::string text;
  SystemContent system;
  DeveloperContent developer;

  static Content fromText(std::string t) {
    Content c;
    c.text = std::move(t);
    return c;
  }
  static Content fromSystem(SystemContent s) {
    Content c;
    c.kind = Kind::kSystem;
    c.system = std::move(s);
    return c;
  }
  static Content fromDeveloper(DeveloperContent d) {
    Content c;
    c.kind = Kind::kDeveloper;
    c.developer = std::move(d);
    return c;
  }
};

struct Message {
  Author author;
  std::optional<std::string> recipient;     // "functions.get_weather", "assistant", "all", ...
  std::optional<std::string> channel;       // "analysis" | "commentary" | "final" | ...
  std::optional<std::string> content_type;  // "<|constrain|>json", "json", "code", ...
  std::vector<Content> content;

  static Message text(Role role, std::string t) {
    Message m;
    m.author.role = role;
    m.content.push_back(Content::fromText(std::move(t)));
    return m;
  }
  Message&& withChannel(std::string c) && {
    channel = std::move(c);
    return std::move(*this);
  }
  Message&& withRecipient(std::string r) && {
    recipient = std::move(r);
    return std::move(*this);
  }
  Message&& withContentType(std::string t) && {
    content_type = std::move(t);
    return std::move(*this);
  }
};

struct RenderConfig {
  // openai_harmony's RenderConversationConfig (Python default true): drop analysis messages
  // before the first `final` once the last assistant message is a final answer (spec §1.9).
  bool auto_drop_analysis = true;
};

// Built-in tool namespaces exactly as openai_harmony defines them (spec §1.7).
ToolNamespace browserToolNamespace();
ToolNamespace pythonToolNamespace();

}  // namespace garden::ivy::harmony
