#include "services/ivy/harmony/openai_request.h"

#include <simdjson.h>

#include <map>

#include "services/ivy/harmony/json_access.h"

namespace garden::ivy::harmony {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;
using json::asArray;
using json::asObject;
using json::asString;
using json::field;



Status fieldError(const std::string& path, std::string_view what) {
  return invalidArgument(path + ": " + std::string(what));
}

// An optional string field; null counts as absent.
Result<std::optional<std::string>> optionalString(const element& e, std::string_view key,
                                                  const std::string& path) {
  auto f = field(e, key);
  if (!f || f->type() == element_type::NULL_VALUE) return std::optional<std::string>();
  if (f->type() != element_type::STRING)
    return fieldError(path + "." + std::string(key), "must be a string");
  return std::optional<std::string>(std::string(asString(*f)));
}

// Message content: a string, null, or an array of {"type":"text","text":...} parts.
Result<std::optional<std::string>> contentText(const element& msg, const std::string& path) {
  auto f = field(msg, "content");
  std::string p = path + ".content";
  if (!f || f->type() == element_type::NULL_VALUE) return std::optional<std::string>();
  if (f->type() == element_type::STRING) {
    return std::optional<std::string>(std::string(asString(*f)));
  }
  if (f->type() != element_type::ARRAY)
    return fieldError(p, "must be a string or an array of parts");
  std::string text;
  size_t j = 0;
  simdjson::dom::array list1 = asArray(*f);
  for (element part : list1) {
    std::string pp = p + "[" + std::to_string(j++) + "]";
    auto type = field(part, "type");
    if (!type || type->type() != element_type::STRING) return fieldError(pp + ".type", "missing");
    std::string_view t = asString(*type);
    if (t != "text") return fieldError(pp + ".type", "only \"text\" parts are supported");
    auto tx = field(part, "text");
    if (!tx || tx->type() != element_type::STRING)
      return fieldError(pp + ".text", "must be a string");
    text += asString(*tx);
  }
  return std::optional<std::string>(std::move(text));
}

bool validFunctionName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Result<std::vector<ToolDescription>> parseTools(const element& root,
                                                std::vector<std::string>* names,
                                                std::vector<StrictFunction>* strict) {
  std::vector<ToolDescription> tools;
  auto f = field(root, "tools");
  if (!f || f->type() == element_type::NULL_VALUE) return tools;
  if (f->type() != element_type::ARRAY) return fieldError("tools", "must be an array");
  size_t i = 0;
  simdjson::dom::array list2 = asArray(*f);
  for (element t : list2) {
    std::string p = "tools[" + std::to_string(i++) + "]";
    auto type = field(t, "type");
    if (!type || type->type() != element_type::STRING || asString(*type) != "function") {
      return fieldError(p + ".type", "must be \"function\"");
    }
    auto fn = field(t, "function");
    if (!fn || fn->type() != element_type::OBJECT)
      return fieldError(p + ".function", "must be an object");
    ToolDescription tool;
    ASSIGN_OR_RETURN(auto name, optionalString(*fn, "name", p + ".function"));
    if (!name || !validFunctionName(*name)) {
      return fieldError(p + ".function.name", "must match ^[a-zA-Z0-9_-]{1,64}$");
    }
    for (const auto& n : *names) {
      if (n == *name) return fieldError(p + ".function.name", "duplicate function name " + *name);
    }
    tool.name = *name;
    ASSIGN_OR_RETURN(auto desc, optionalString(*fn, "description", p + ".function"));
    if (desc) tool.description = *desc;
    if (auto params = field(*fn, "parameters");
        params && params->type() != element_type::NULL_VALUE) {
      if (params->type() != element_type::OBJECT) {
        return fieldError(p + ".function.parameters", "must be a JSON Schema object");
      }
      tool.parameters_json = simdjson::minify(*params);
    }
    if (auto st = field(*fn, "strict"); st && st->type() != element_type::NULL_VALUE) {
      if (st->type() != element_type::BOOL) {
        return fieldError(p + ".function.strict", "must be a boolean");
      }
      if (st->get_bool().value()) {  // [TAG_STRICT_TOOLS]
        strict->push_back(StrictFunction{i - 1, tool.name, tool.parameters_json.value_or("")});
      }
    }
    names->push_back(tool.name);
    tools.push_back(std::move(tool));
  }
  return tools;
}

Status parseToolChoice(const element& root, HarmonyChatRequest* req) {
  auto f = field(root, "tool_choice");
  if (!f || f->type() == element_type::NULL_VALUE) return okStatus();
  if (f->type() == element_type::STRING) {
    std::string_view v = asString(*f);
    if (v == "auto") {
      req->tool_choice = ToolChoice::kAuto;
    } else if (v == "none") {
      req->tool_choice = ToolChoice::kNone;
    } else if (v == "required") {
      if (req->function_names.empty()) return fieldError("tool_choice", "\"required\" needs tools");
      req->tool_choice = ToolChoice::kRequired;
    } else {
      return fieldError("tool_choice", "must be \"none\", \"auto\", \"required\" or a function");
    }
    return okStatus();
  }
  auto fn = field(*f, "function");
  if (!fn)
    return fieldError("tool_choice", "must be \"none\", \"auto\", \"required\" or a function");
  ASSIGN_OR_RETURN(auto name, optionalString(*fn, "name", "tool_choice.function"));
  if (!name) return fieldError("tool_choice.function.name", "missing");
  bool found = false;
  for (const auto& n : req->function_names) found = found || n == *name;
  if (!found) return fieldError("tool_choice.function.name", "no tool named " + *name);
  req->tool_choice = ToolChoice::kNamed;
  req->tool_choice_name = *name;
  return okStatus();
}

}  // namespace

Result<HarmonyChatRequest> harmonyRequestFromOpenAiJson(std::string_view json,
                                                        const ChatRenderOptions& options) {
  simdjson::dom::parser parser;
  element root;
  auto err = parser.parse(json.data(), json.size(), true).get(root);
  if (err != simdjson::SUCCESS) {
    return invalidArgument(std::string("request body is not valid JSON: ") +
                           simdjson::error_message(err));
  }
  if (root.type() != element_type::OBJECT)
    return invalidArgument("request body must be a JSON object");

  HarmonyChatRequest req;
  if (auto effort = field(root, "reasoning_effort");
      effort && effort->type() != element_type::NULL_VALUE) {
    std::optional<ReasoningEffort> e;
    if (effort->type() == element_type::STRING) {
      e = reasoningEffortFromName(asString(*effort));
    }
    if (!e) return fieldError("reasoning_effort", "must be \"low\", \"medium\" or \"high\"");
    req.reasoning_effort = *e;
  }
  ASSIGN_OR_RETURN(std::vector<ToolDescription> tools, parseTools(root, &req.function_names, &req.strict_functions));
  RETURN_IF_ERROR(parseToolChoice(root, &req));

  auto msgs = field(root, "messages");
  if (!msgs || msgs->type() != element_type::ARRAY) {
    return fieldError("messages", "must be an array of messages");
  }
  auto msg_array = asArray(*msgs);
  if (msg_array.size() == 0) return fieldError("messages", "must not be empty");

  SystemContent system;
  system.model_identity = options.model_identity;
  system.knowledge_cutoff = options.knowledge_cutoff;
  system.conversation_start_date = options.current_date;
  system.reasoning_effort = req.reasoning_effort;
  req.messages.push_back(Message{Author{Role::kSystem, std::nullopt},
                                 std::nullopt,
                                 std::nullopt,
                                 std::nullopt,
                                 {Content::fromSystem(std::move(system))}});

  DeveloperContent developer;
  if (!tools.empty() && req.tool_choice != ToolChoice::kNone) {
    developer.tools["functions"] = ToolNamespace{"functions", std::nullopt, std::move(tools)};
  }
  std::vector<Message> history;
  std::map<std::string, std::string> call_names;  // tool_call id -> function name
  bool leading = true;
  size_t i = 0;
  for (element m : msg_array) {
    std::string p = "messages[" + std::to_string(i++) + "]";
    if (m.type() != element_type::OBJECT) return fieldError(p, "must be an object");
    ASSIGN_OR_RETURN(auto role, optionalString(m, "role", p));
    if (!role) return fieldError(p + ".role", "missing");
    if (*role == "system" || *role == "developer") {
      ASSIGN_OR_RETURN(auto text, contentText(m, p));
      std::string t = text.value_or("");
      if (leading) {
        developer.instructions = developer.instructions ? *developer.instructions + "\n\n" + t : t;
      } else {
        DeveloperContent later;
        later.instructions = t;
        history.push_back(Message{Author{Role::kDeveloper, std::nullopt},
                                  std::nullopt,
                                  std::nullopt,
                                  std::nullopt,
                                  {Content::fromDeveloper(later)}});
      }
      continue;
    }
    leading = false;
    if (*role == "user") {
      ASSIGN_OR_RETURN(auto text, contentText(m, p));
      if (!text) return fieldError(p + ".content", "missing");
      history.push_back(Message::text(Role::kUser, std::move(*text)));
    } else if (*role == "assistant") {
      ASSIGN_OR_RETURN(auto reasoning, optionalString(m, "reasoning_content", p));
      if (!reasoning) {
        ASSIGN_OR_RETURN(reasoning, optionalString(m, "reasoning", p));
      }
      ASSIGN_OR_RETURN(auto text, contentText(m, p));
      auto calls = field(m, "tool_calls");
      bool has_calls = calls && calls->type() == element_type::ARRAY && asArray(*calls).size() > 0;
      if (calls && calls->type() != element_type::ARRAY &&
          calls->type() != element_type::NULL_VALUE) {
        return fieldError(p + ".tool_calls", "must be an array");
      }
      if (reasoning && !reasoning->empty()) {
        history.push_back(Message::text(Role::kAssistant, *reasoning).withChannel("analysis"));
      }
      const bool empty_turn =
          !has_calls && (!text || text->empty()) && (!reasoning || reasoning->empty());
      if ((text && !text->empty()) || empty_turn) {  // an empty answer is still a turn
        history.push_back(Message::text(Role::kAssistant, text.value_or(""))
                              .withChannel(has_calls ? "commentary" : "final"));
      }
      if (has_calls) {
        size_t j = 0;
        simdjson::dom::array list3 = asArray(*calls);
        for (element call : list3) {
          std::string cp = p + ".tool_calls[" + std::to_string(j++) + "]";
          auto fn = field(call, "function");
          if (!fn || fn->type() != element_type::OBJECT) {
            return fieldError(cp + ".function", "must be an object");
          }
          ASSIGN_OR_RETURN(auto name, optionalString(*fn, "name", cp + ".function"));
          if (!name || name->empty()) return fieldError(cp + ".function.name", "missing");
          std::string args;
          if (auto a = field(*fn, "arguments"); a && a->type() != element_type::NULL_VALUE) {
            args = a->type() == element_type::STRING ? std::string(asString(*a))
                                                     : simdjson::minify(*a);
          }
          ASSIGN_OR_RETURN(auto id, optionalString(call, "id", cp));
          if (id) call_names[*id] = *name;
          history.push_back(Message::text(Role::kAssistant, std::move(args))
                                .withChannel("commentary")
                                .withRecipient("functions." + *name)
                                .withContentType("<|constrain|>json"));
        }
      }
    } else if (*role == "tool") {
      ASSIGN_OR_RETURN(auto text, contentText(m, p));
      ASSIGN_OR_RETURN(auto call_id, optionalString(m, "tool_call_id", p));
      ASSIGN_OR_RETURN(auto name, optionalString(m, "name", p));
      if (call_id) {
        auto it = call_names.find(*call_id);
        if (it != call_names.end()) {
          name = it->second;
        } else if (!name) {
          return fieldError(p + ".tool_call_id", "no earlier tool call has id " + *call_id);
        }
      }
      if (!name || name->empty()) return fieldError(p + ".tool_call_id", "missing");
      Message tool_msg = Message::text(Role::kTool, text.value_or(""))
                             .withChannel("commentary")
                             .withRecipient("assistant");
      tool_msg.author.name = "functions." + *name;
      history.push_back(std::move(tool_msg));
    } else {
      return fieldError(p + ".role", "must be system, developer, user, assistant or tool");
    }
  }
  if (developer.instructions || !developer.tools.empty()) {
    req.messages.push_back(Message{Author{Role::kDeveloper, std::nullopt},
                                   std::nullopt,
                                   std::nullopt,
                                   std::nullopt,
                                   {Content::fromDeveloper(std::move(developer))}});
  }
  for (auto& m : history) req.messages.push_back(std::move(m));
  return req;
}

std::vector<Segment> toolChoicePrefix(const HarmonyChatRequest& request) {
  SegmentSink sink;
  if (request.tool_choice == ToolChoice::kNamed && request.tool_choice_name) {
    sink.special(kChannel);
    sink.text("commentary");
    sink.text(" to=functions." + *request.tool_choice_name);
    sink.text(" ");
    sink.special(kConstrain);
    sink.text("json");
    sink.special(kMessage);
  } else if (request.tool_choice == ToolChoice::kRequired) {
    sink.special(kChannel);
    sink.text("commentary");
    sink.text(" to=functions.");
  }
  return sink.take();
}

}  // namespace garden::ivy::harmony
