#include "services/ivy/api/responses.h"

#include <algorithm>
#include <utility>

#include "common/json_writer.h"
#include "services/ivy/api/errors.h"
#include "services/ivy/api/response_format.h"

namespace garden::ivy {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

std::optional<element> present(const element& obj, std::string_view key) {
  element v;
  if (obj.type() != element_type::OBJECT || obj[key].get(v) != simdjson::SUCCESS)
    return std::nullopt;
  if (v.type() == element_type::NULL_VALUE) return std::nullopt;
  return v;
}

Result<std::optional<std::string>> optionalString(const element& obj, std::string_view key,
                                                  const std::string& path) {
  auto v = present(obj, key);
  if (!v) return std::optional<std::string>();
  std::string_view s;
  if (v->get_string().get(s) != simdjson::SUCCESS) return invalidField(path, "must be a string");
  return std::optional<std::string>(std::string(s));
}

Result<std::string> requiredString(const element& obj, std::string_view key,
                                   const std::string& path) {
  ASSIGN_OR_RETURN(auto s, optionalString(obj, key, path));
  if (!s) return invalidField(path, "missing");
  return std::move(*s);
}

// Text of message content: a string or an array of text parts of the allowed types.
Result<std::string> partsText(const element& v, const std::string& path,
                              std::initializer_list<std::string_view> types) {
  std::string_view s;
  if (v.get_string().get(s) == simdjson::SUCCESS) return std::string(s);
  simdjson::dom::array parts;
  if (v.get_array().get(parts) != simdjson::SUCCESS)
    return invalidField(path, "must be a string or an array of parts");
  std::string text;
  size_t j = 0;
  for (element part : parts) {
    std::string pp = path + "[" + std::to_string(j++) + "]";
    ASSIGN_OR_RETURN(std::string type, requiredString(part, "type", pp + ".type"));
    if (std::find(types.begin(), types.end(), type) == types.end()) {
      std::string allowed;
      for (std::string_view t : types)
        allowed += (allowed.empty() ? "\"" : ", \"") + std::string(t) + "\"";
      return invalidField(pp + ".type",
                          "only " + allowed + " parts are supported (got \"" + type + "\")");
    }
    ASSIGN_OR_RETURN(std::string t, requiredString(part, "text", pp + ".text"));
    text += t;
  }
  return text;
}

std::string chatMessage(std::string_view role, std::string_view content) {
  JsonWriter w;
  w.beginObject().field("role", role).field("content", content).endObject();
  return w.take();
}

std::string chatToolCall(const std::string& call_id, const std::string& name,
                         const std::string& arguments) {
  JsonWriter w;
  w.beginObject().field("role", "assistant").key("tool_calls").beginArray().beginObject();
  w.field("id", call_id).field("type", "function").key("function").beginObject();
  w.field("name", name).field("arguments", arguments).endObject();
  w.endObject().endArray().endObject();
  return w.take();
}

// One input item -> chat messages appended to `conv`.
Status appendInputItem(const element& item, const std::string& p, StoredConversation* conv) {
  if (item.type() != element_type::OBJECT) return invalidField(p, "must be an object");
  ASSIGN_OR_RETURN(auto type, optionalString(item, "type", p + ".type"));
  if (!type) type = "message";
  if (*type == "message") {
    ASSIGN_OR_RETURN(std::string role, requiredString(item, "role", p + ".role"));
    if (role != "user" && role != "system" && role != "developer" && role != "assistant")
      return invalidField(p + ".role", "must be user, system, developer or assistant");
    auto content = present(item, "content");
    if (!content) return invalidField(p + ".content", "missing");
    ASSIGN_OR_RETURN(std::string text,
                     partsText(*content, p + ".content", {"input_text", "output_text"}));
    conv->messages.push_back(chatMessage(role, text));
  } else if (*type == "function_call") {
    ASSIGN_OR_RETURN(std::string call_id, requiredString(item, "call_id", p + ".call_id"));
    ASSIGN_OR_RETURN(std::string name, requiredString(item, "name", p + ".name"));
    ASSIGN_OR_RETURN(auto args, optionalString(item, "arguments", p + ".arguments"));
    if (name.empty()) return invalidField(p + ".name", "must not be empty");
    conv->messages.push_back(chatToolCall(call_id, name, args.value_or("")));
    conv->call_ids.push_back(call_id);
  } else if (*type == "function_call_output") {
    ASSIGN_OR_RETURN(std::string call_id, requiredString(item, "call_id", p + ".call_id"));
    if (std::find(conv->call_ids.begin(), conv->call_ids.end(), call_id) == conv->call_ids.end())
      return invalidField(p + ".call_id", "no earlier function_call has call_id " + call_id);
    auto output = present(item, "output");
    if (!output) return invalidField(p + ".output", "missing");
    ASSIGN_OR_RETURN(std::string text, partsText(*output, p + ".output", {"input_text"}));
    JsonWriter w;
    w.beginObject().field("role", "tool").field("tool_call_id", call_id).field("content", text);
    conv->messages.push_back(w.endObject().take());
  } else if (*type == "reasoning") {
    std::string text;
    if (auto content = present(item, "content")) {
      ASSIGN_OR_RETURN(text, partsText(*content, p + ".content", {"reasoning_text"}));
    }
    if (!text.empty()) {
      JsonWriter w;
      w.beginObject().field("role", "assistant").field("reasoning_content", text).endObject();
      conv->messages.push_back(w.take());
    }
  } else {
    return invalidField(p + ".type",
                        "must be message, function_call, function_call_output or reasoning (got "
                        "\"" +
                            *type + "\")");
  }
  return okStatus();
}

// A Responses tool -> chat's nested shape (values copied as they are: chat validates them).
Result<std::string> chatTools(const element& tools) {
  simdjson::dom::array arr;
  if (tools.get_array().get(arr) != simdjson::SUCCESS)
    return invalidField("tools", "must be an array");
  JsonWriter w;
  w.beginArray();
  size_t i = 0;
  for (element t : arr) {
    std::string p = "tools[" + std::to_string(i++) + "]";
    ASSIGN_OR_RETURN(std::string type, requiredString(t, "type", p + ".type"));
    if (type != "function")
      return invalidField(p + ".type",
                          "only \"function\" tools are supported (got \"" + type + "\")");
    w.beginObject().field("type", "function").key("function").beginObject();
    for (std::string_view k : {"name", "description", "parameters", "strict"}) {
      if (auto v = present(t, k)) w.key(k).raw(simdjson::minify(*v));
    }
    w.endObject().endObject();
  }
  w.endArray();
  return w.take();
}

Result<std::string> chatToolChoice(const element& v) {
  std::string_view s;
  if (v.get_string().get(s) == simdjson::SUCCESS) return simdjson::minify(v);
  ASSIGN_OR_RETURN(auto type, optionalString(v, "type", "tool_choice.type"));
  if (type != "function")
    return invalidField("tool_choice",
                        "must be \"none\", \"auto\", \"required\" or {\"type\":\"function\",...}");
  ASSIGN_OR_RETURN(std::string name, requiredString(v, "name", "tool_choice.name"));
  JsonWriter w;
  w.beginObject().field("type", "function").key("function").beginObject().field("name", name);
  return w.endObject().endObject().take();
}

// Chat's field names in an error -> the Responses request's.
Status renamed(const Status& s) {
  if (s.code() != StatusCode::kInvalidArgument && s.code() != StatusCode::kFailedPrecondition)
    return s;
  std::string m = s.message();
  static const std::pair<std::string_view, std::string_view> kNames[] = {
      {"max_tokens", "max_output_tokens"},
      {"messages", "input"},
      {"reasoning_effort", "reasoning.effort"},
      {"tool_choice.function.", "tool_choice."}};
  for (const auto& [from, to] : kNames) {
    if (m.rfind(from, 0) == 0) {
      m = std::string(to) + m.substr(from.size());
      return Status(s.code(), m);
    }
  }
  if (m.rfind("tools[", 0) == 0) {
    size_t colon = m.find(':');
    size_t f = m.find(".function", 0);
    if (f != std::string::npos && f < colon) m.erase(f, 9);
    return Status(s.code(), m);
  }
  return s;
}

Status rejectIfSet(const element& root, std::string_view key, std::string_view why) {
  auto v = present(root, key);
  if (!v) return okStatus();
  bool b = false;
  if (v->get_bool().get(b) == simdjson::SUCCESS && !b) return okStatus();
  int64_t i = 1;
  if (v->get_int64().get(i) == simdjson::SUCCESS && i == 0) return okStatus();
  return invalidField(key, why);
}

}  // namespace

ResponsesStore::ResponsesStore(size_t max_entries) : max_entries_(max_entries) {}

void ResponsesStore::put(const std::string& id,
                         std::shared_ptr<const StoredConversation> conversation) {
  if (max_entries_ == 0) return;
  MutexLock lock(mu_);
  auto it = entries_.find(id);
  if (it != entries_.end()) {
    lru_.erase(it->second.lru);
    entries_.erase(it);
  }
  lru_.push_front(id);
  entries_.emplace(id, Entry{std::move(conversation), lru_.begin()});
  while (entries_.size() > max_entries_) {
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
}

std::shared_ptr<const StoredConversation> ResponsesStore::get(const std::string& id) {
  MutexLock lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.conversation;
}

size_t ResponsesStore::size() const {
  MutexLock lock(mu_);
  return entries_.size();
}

Result<ResponsesRequest> parseResponsesRequest(std::string_view body, const ModelSpec& spec,
                                               const Tokenizer* tokenizer, ResponsesStore* store,
                                               const RequestLimits& limits,
                                               const harmony::ChatRenderOptions& render) {
  thread_local simdjson::dom::parser parser;
  ASSIGN_OR_RETURN(element root, parseGenerativeRequestBody(body, spec, "input", limits, parser));
  ResponsesRequest req;
  RETURN_IF_ERROR(rejectIfSet(root, "background", "background responses are not supported"));
  RETURN_IF_ERROR(rejectIfSet(root, "top_logprobs", "logprobs are not supported"));
  if (present(root, "conversation"))
    return invalidField("conversation",
                        "conversations are not supported (use previous_response_id)");
  if (present(root, "prompt")) return invalidField("prompt", "prompt templates are not supported");
  // Structured outputs [TAG_TOKEN_MASK]: text.format is chat's response_format with the
  // json_schema fields at its top level. Checked (and compiled) here so errors name text.format;
  // the chat request below carries the same format (its compile is a cache hit).
  std::string chat_format;  // chat's response_format JSON; empty: plain text
  if (auto text = present(root, "text")) {
    if (text->type() != element_type::OBJECT) return invalidField("text", "must be an object");
    if (auto format = present(*text, "format")) {
      ASSIGN_OR_RETURN(std::optional<StructuredOutput> so,
                       parseResponseFormat(*format, "text.format", /*responses_shape=*/true));
      if (so) {
        req.text_format_json = simdjson::minify(*format);
        chat_format = so->schema.empty()
                          ? std::string(R"({"type":"json_object"})")
                          : R"({"type":"json_schema","json_schema":)" + req.text_format_json + "}";
      }
    }
  }
  if (auto st = present(root, "store")) {
    if (st->get_bool().get(req.store) != simdjson::SUCCESS)
      return invalidField("store", "must be a boolean");
  }
  ASSIGN_OR_RETURN(auto previous,
                   optionalString(root, "previous_response_id", "previous_response_id"));
  if (previous) {
    std::shared_ptr<const StoredConversation> prior = store ? store->get(*previous) : nullptr;
    if (!prior) {
      return notFound("previous_response_id: no stored response has id '" + *previous +
                      "' (unknown, stored with store: false, or evicted)");
    }
    req.previous_response_id = *previous;
    req.conversation = *prior;
  }
  auto input = present(root, "input");
  if (!input) return invalidField("input", "missing");
  std::string_view input_text;
  simdjson::dom::array items;
  if (input->get_string().get(input_text) == simdjson::SUCCESS) {
    req.conversation.messages.push_back(chatMessage("user", input_text));
  } else if (input->get_array().get(items) == simdjson::SUCCESS) {
    if (items.size() == 0) return invalidField("input", "must not be empty");
    size_t i = 0;
    for (element item : items) {
      RETURN_IF_ERROR(
          appendInputItem(item, "input[" + std::to_string(i++) + "]", &req.conversation));
    }
  } else {
    return invalidField("input", "must be a string or an array of items");
  }

  // The chat request this is.
  JsonWriter w;
  w.beginObject().key("messages").beginArray();
  ASSIGN_OR_RETURN(auto instructions, optionalString(root, "instructions", "instructions"));
  if (instructions) {
    w.raw(chatMessage("developer", *instructions));
    req.instructions_json.clear();
    JsonWriter::appendQuoted(req.instructions_json, *instructions);
  }
  for (const std::string& m : req.conversation.messages) w.raw(m);
  w.endArray();
  if (auto reasoning = present(root, "reasoning")) {
    if (reasoning->type() != element_type::OBJECT)
      return invalidField("reasoning", "must be an object");
    if (auto effort = present(*reasoning, "effort"))
      w.key("reasoning_effort").raw(simdjson::minify(*effort));
  }
  if (auto tools = present(root, "tools")) {
    ASSIGN_OR_RETURN(std::string chat_tools, chatTools(*tools));
    w.key("tools").raw(chat_tools);
    req.tools_json = simdjson::minify(*tools);
  }
  if (auto choice = present(root, "tool_choice")) {
    ASSIGN_OR_RETURN(std::string chat_choice, chatToolChoice(*choice));
    w.key("tool_choice").raw(chat_choice);
    req.tool_choice_json = simdjson::minify(*choice);
  }
  for (auto [from, to] :
       {std::pair<std::string_view, std::string_view>{"max_output_tokens", "max_tokens"},
        {"temperature", "temperature"},
        {"top_p", "top_p"},
        {"stream", "stream"},
        {"skip_reasoning", "skip_reasoning"}}) {
    if (auto v = present(root, from)) w.key(to).raw(simdjson::minify(*v));
  }
  if (!chat_format.empty()) w.key("response_format").raw(chat_format);
  w.endObject();
  RequestLimits chat_limits = limits;
  chat_limits.max_input_chars = 0;  // checked on the request body above
  Result<ChatRequest> chat = parseChatRequest(w.view(), spec, tokenizer, chat_limits, render);
  if (!chat.isOk()) return renamed(chat.status());
  req.chat = std::move(chat).value();
  req.max_output_tokens = req.chat.sampling.max_tokens;
  return req;
}

ResponsesOutput::ResponsesOutput(const Tokenizer& tokenizer, const ResponsesRequest& request,
                                 ResponseIdentity identity, std::shared_ptr<ResponsesStore> store)
    : identity_(std::move(identity)),
      stream_(request.chat.sampling.stream),
      store_(request.store && store != nullptr),
      previous_response_id_(request.previous_response_id),
      instructions_json_(request.instructions_json),
      tools_json_(request.tools_json),
      tool_choice_json_(request.tool_choice_json),
      text_format_json_(request.text_format_json),
      max_output_tokens_(request.max_output_tokens),
      effort_(request.chat.harmony.reasoning_effort),
      temperature_(request.chat.sampling.temperature),
      top_p_(request.chat.sampling.top_p),
      conversation_(std::make_shared<StoredConversation>(request.conversation)),
      store_ptr_(std::move(store)),
      prompt_len_(request.chat.prompt_ids.size()),
      decoder_(tokenizer, harmony::ParserOptions{},
               chatOutputOptions(request.chat, identity_.make_tool_call_id)) {
  if (stream_) {
    for (std::string_view type : {"response.created", "response.in_progress"}) {
      event(type, [&](JsonWriter& w) {
        w.key("response");
        writeResponse(w, "in_progress", nullptr);
      });
    }
  }
  for (TokenId id : request.chat.forced_prefix_ids) emit(decoder_.push(id));
}

void ResponsesOutput::event(std::string_view type, const std::function<void(JsonWriter&)>& body) {
  if (!stream_) return;
  sse_.append("event: ").append(type).append("\n");
  std::string json;
  JsonWriter w(&json);
  w.beginObject().field("type", type).field("sequence_number", sequence_++);
  body(w);
  w.endObject();
  sse_.append("data: ").append(json).append("\n\n");
}

void ResponsesOutput::writeItem(JsonWriter& w, const Item& item) const {
  const char* status = item.done ? "completed" : "in_progress";
  w.beginObject().field("id", item.id);
  switch (item.kind) {
    case ItemKind::kReasoning:
      w.field("type", "reasoning").key("summary").beginArray().endArray();
      w.key("content").beginArray();
      if (item.done) {
        w.beginObject().field("type", "reasoning_text").field("text", item.text).endObject();
      }
      w.endArray();
      break;
    case ItemKind::kMessage:
      w.field("type", "message").field("status", status).field("role", "assistant");
      w.key("content").beginArray();
      if (item.done) {
        w.beginObject().field("type", "output_text").field("text", item.text);
        w.key("annotations").beginArray().endArray().endObject();
      }
      w.endArray();
      break;
    case ItemKind::kFunctionCall:
      w.field("type", "function_call").field("status", status).field("call_id", item.call_id);
      w.field("name", item.name).field("arguments", item.done ? item.text : std::string());
      break;
  }
  w.endObject();
}

void ResponsesOutput::writeResponse(JsonWriter& w, std::string_view status,
                                    const Status* error) const {
  w.beginObject()
      .field("id", identity_.id)
      .field("object", "response")
      .field("created_at", identity_.created)
      .field("status", status)
      .field("model", identity_.model);
  if (error != nullptr) {
    HttpError e = toHttpError(*error);
    w.key("error").beginObject().field("code", e.code.empty() ? "server_error" : e.code);
    w.field("message", e.message).endObject();
  } else {
    w.nullField("error");
  }
  if (status == "incomplete") {
    w.key("incomplete_details").beginObject().field("reason", "max_output_tokens").endObject();
  } else {
    w.nullField("incomplete_details");
  }
  w.key("instructions").raw(instructions_json_);
  if (max_output_tokens_) {
    w.field("max_output_tokens", *max_output_tokens_);
  } else {
    w.nullField("max_output_tokens");
  }
  w.key("output").beginArray();
  for (const Item& item : items_) writeItem(w, item);
  w.endArray();
  w.field("parallel_tool_calls", true);
  if (previous_response_id_.empty()) {
    w.nullField("previous_response_id");
  } else {
    w.field("previous_response_id", previous_response_id_);
  }
  w.key("reasoning").beginObject().field("effort", harmony::reasoningEffortName(effort_));
  w.nullField("summary").endObject();
  w.field("store", store_).field("temperature", temperature_);
  w.key("text").beginObject().key("format").raw(text_format_json_).endObject();
  w.key("tool_choice").raw(tool_choice_json_).key("tools").raw(tools_json_);
  w.field("top_p", top_p_).field("truncation", "disabled");
  w.key("metadata").beginObject().endObject();
  if (finished_) {
    w.key("usage").beginObject();
    w.field("input_tokens", usage_.prompt_tokens);
    w.key("input_tokens_details").beginObject().field("cached_tokens", usage_.cached_tokens);
    w.endObject().field("output_tokens", usage_.completion_tokens);
    w.key("output_tokens_details").beginObject().field("reasoning_tokens", reasoning_tokens_);
    w.endObject().field("total_tokens", usage_.prompt_tokens + usage_.completion_tokens);
    w.endObject();
  } else {
    w.nullField("usage");
  }
  w.endObject();
}

void ResponsesOutput::openItem(Item item) {
  closeItem();
  items_.push_back(std::move(item));
  const size_t index = items_.size() - 1;
  const Item& it = items_.back();
  event("response.output_item.added", [&](JsonWriter& w) {
    w.field("output_index", index).key("item");
    writeItem(w, it);
  });
  if (it.kind != ItemKind::kFunctionCall) {
    event("response.content_part.added", [&](JsonWriter& w) {
      w.field("item_id", it.id).field("output_index", index).field("content_index", 0);
      w.key("part").beginObject();
      if (it.kind == ItemKind::kMessage) {
        w.field("type", "output_text").field("text", "").key("annotations").beginArray().endArray();
      } else {
        w.field("type", "reasoning_text").field("text", "");
      }
      w.endObject();
    });
  }
}

void ResponsesOutput::closeItem() {
  if (items_.empty() || items_.back().done) return;
  Item& it = items_.back();
  it.done = true;
  const size_t index = items_.size() - 1;
  auto head = [&](JsonWriter& w) { w.field("item_id", it.id).field("output_index", index); };
  switch (it.kind) {
    case ItemKind::kReasoning:
    case ItemKind::kMessage: {
      const bool message = it.kind == ItemKind::kMessage;
      event(message ? "response.output_text.done" : "response.reasoning_text.done",
            [&](JsonWriter& w) {
              head(w);
              w.field("content_index", 0).field("text", it.text);
              if (message) w.key("logprobs").beginArray().endArray();
            });
      event("response.content_part.done", [&](JsonWriter& w) {
        head(w);
        w.field("content_index", 0).key("part").beginObject();
        w.field("type", message ? "output_text" : "reasoning_text").field("text", it.text);
        if (message) w.key("annotations").beginArray().endArray();
        w.endObject();
      });
      break;
    }
    case ItemKind::kFunctionCall:
      event("response.function_call_arguments.done", [&](JsonWriter& w) {
        head(w);
        w.field("name", it.name).field("arguments", it.text);
      });
      break;
  }
  event("response.output_item.done", [&](JsonWriter& w) {
    w.field("output_index", index).key("item");
    writeItem(w, it);
  });
}

void ResponsesOutput::appendText(ItemKind kind, const std::string& text) {
  if (text.empty()) return;
  if (items_.empty() || items_.back().done || items_.back().kind != kind) {
    Item item;
    item.kind = kind;
    item.id = randomId(kind == ItemKind::kMessage ? "msg_" : "rs_");
    openItem(std::move(item));
  }
  Item& it = items_.back();
  it.text += text;
  const size_t index = items_.size() - 1;
  event(kind == ItemKind::kMessage ? "response.output_text.delta" : "response.reasoning_text.delta",
        [&](JsonWriter& w) {
          w.field("item_id", it.id).field("output_index", index).field("content_index", 0);
          w.field("delta", text);
          if (kind == ItemKind::kMessage) w.key("logprobs").beginArray().endArray();
        });
}

void ResponsesOutput::emit(const harmony::ChatDelta& delta) {
  appendText(ItemKind::kReasoning, delta.reasoning_content);
  appendText(ItemKind::kMessage, delta.content);
  for (const harmony::ToolCallDelta& call : delta.tool_calls) {
    if (call.id) {
      Item item;
      item.kind = ItemKind::kFunctionCall;
      item.id = randomId("fc_");
      item.call_id = *call.id;
      item.name = call.name.value_or("");
      item.tool_index = call.index;
      openItem(std::move(item));
    }
    if (call.arguments.empty() || items_.empty()) continue;
    Item& it = items_.back();
    if (it.done || it.kind != ItemKind::kFunctionCall || it.tool_index != call.index) continue;
    it.text += call.arguments;
    const size_t index = items_.size() - 1;
    event("response.function_call_arguments.delta", [&](JsonWriter& w) {
      w.field("item_id", it.id).field("output_index", index).field("delta", call.arguments);
    });
  }
}

bool ResponsesOutput::onTokens(size_t, std::span<const int32_t> ids,
                               std::span<const llm::LlmTokenLogprobs>) {
  if (finished_) return false;
  for (int32_t id : ids) {
    ++generated_;
    harmony::ChatDelta delta = decoder_.push(id);
    if (!delta.reasoning_content.empty()) ++reasoning_tokens_;
    emit(delta);
  }
  return true;
}

void ResponsesOutput::finishChoice(size_t, const ChoiceEnd& end) {
  if (finished_) return;
  emit(decoder_.finish());
  closeItem();
  finished_ = true;
  hit_length_ = end.hit_length;
  usage_.prompt_tokens = end.prompt_tokens != 0 ? end.prompt_tokens : prompt_len_;
  usage_.completion_tokens = end.completion_tokens != 0 ? end.completion_tokens : generated_;
  usage_.cached_tokens = end.cached_prompt_tokens;
  const char* status = hit_length_ ? "incomplete" : "completed";
  event(hit_length_ ? "response.incomplete" : "response.completed", [&](JsonWriter& w) {
    w.key("response");
    writeResponse(w, status, nullptr);
  });
  if (store_) storeConversation();
}

void ResponsesOutput::storeConversation() const {
  auto stored = std::make_shared<StoredConversation>(*conversation_);
  // The output as one assistant chat message (what chat renders back into Harmony).
  JsonWriter w;
  w.beginObject().field("role", "assistant");
  std::string reasoning, content;
  for (const Item& it : items_) {
    if (it.kind == ItemKind::kReasoning) reasoning += it.text;
    if (it.kind == ItemKind::kMessage) content += it.text;
  }
  if (!reasoning.empty()) w.field("reasoning_content", reasoning);
  w.field("content", content);
  w.key("tool_calls").beginArray();
  for (const Item& it : items_) {
    if (it.kind != ItemKind::kFunctionCall) continue;
    w.beginObject().field("id", it.call_id).field("type", "function").key("function");
    w.beginObject().field("name", it.name).field("arguments", it.text).endObject().endObject();
    stored->call_ids.push_back(it.call_id);
  }
  w.endArray().endObject();
  stored->messages.push_back(w.take());
  store_ptr_->put(identity_.id, std::move(stored));
}

std::string ResponsesOutput::takeSse() { return std::exchange(sse_, std::string()); }

std::string ResponsesOutput::responseJson() const {
  JsonWriter w;
  writeResponse(w, hit_length_ ? "incomplete" : "completed", nullptr);
  return w.take();
}

std::string ResponsesOutput::sseError(const Status& status) {
  std::string out = takeSse();
  event("response.failed", [&](JsonWriter& w) {
    w.key("response");
    writeResponse(w, "failed", &status);
  });
  out += takeSse();
  return out;
}

}  // namespace garden::ivy
