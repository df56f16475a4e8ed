#pragma once
// POST /v1/responses (gpt-oss's own API, the OpenAI Responses shape) over the chat machinery:
// the request is translated into a chat-completions body and goes through parseChatRequest
// (api/chat.h), so rendering, tool_choice enforcement, limits and sampling are chat's; the output
// is the same Harmony decoder's deltas, grouped into Responses output items.
//
// Request -> chat:
//   input (string = one user message; or items: messages {role user|system|developer|assistant,
//     content string or [{type input_text|output_text, text}]}, function_call {call_id, name,
//     arguments}, function_call_output {call_id, output}, reasoning {content [{reasoning_text}]}),
//   instructions -> a leading developer message; reasoning.effort -> reasoning_effort;
//   tools [{type function, name, description, parameters}] -> chat's nested tools;
//   tool_choice auto|none|required|{type function, name}; max_output_tokens -> max_tokens;
//   temperature, top_p, stream as chat. text.format {type text | json_object | json_schema with
//   name, schema, description, strict at its top level} -> chat's response_format (structured
//   outputs; echoed in the response object); Garden's skip_reasoning as chat's. store (default
//   true), previous_response_id (the
//   stored response's input and output items come before this input; 404 naming
//   previous_response_id when unknown or evicted). Rejected by name (they would change the
//   answer): tools of another type, background, conversation, prompt, top_logprobs. Other
//   fields (metadata, user, include, parallel_tool_calls, truncation, ...) are ignored.
//   Errors name the Responses field ("input[2].content", "tools[0].name", "max_output_tokens").
//
// Output (ResponsesOutput): analysis -> a "reasoning" item (content [{type reasoning_text}]);
// final / commentary preamble -> a "message" item (content [{type output_text, annotations []}]);
// each tool call -> a "function_call" item {call_id, name, arguments}; in the order the model
// wrote them. status "completed", or "incomplete" with incomplete_details.reason
// "max_output_tokens" when the limit stopped it. usage {input_tokens, output_tokens,
// total_tokens, input_tokens_details.cached_tokens, output_tokens_details.reasoning_tokens}
// (reasoning_tokens: generated ids that produced reasoning text).
// Streaming: typed events "event: <type>\ndata: {type, sequence_number, ...}": response.created,
// response.in_progress, per item output_item.added, (message) content_part.added,
// output_text.delta..., output_text.done, content_part.done, (reasoning) reasoning_text.delta...,
// reasoning_text.done, (call) function_call_arguments.delta..., .done, then output_item.done;
// finally response.completed (or response.incomplete) carrying the whole response. No [DONE].
// A failure after the stream began: response.failed (response.error {code, message}), then end.
// [TAG_STREAM_EQUALS_FULL]: the final response is built from the same items the events carried.
//
// ResponsesStore: thread-safe, bounded (LRU by count) map id -> the conversation (input and
// output, as chat messages) of each stored response. Parsing is pure apart from store lookups
// (any thread); a ResponsesOutput is used by one thread at a time.

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "services/ivy/api/chat.h"

namespace garden::ivy {

// What a stored response continues with: every message of its conversation (previous responses',
// its input, its output) as chat-message JSON objects, and the function call ids in them.
struct StoredConversation {
  std::vector<std::string> messages;
  std::vector<std::string> call_ids;
};

class ResponsesStore {
 public:
  // At most `max_entries` responses (0: nothing is stored); the least recently used goes first.
  explicit ResponsesStore(size_t max_entries);
  void put(const std::string& id, std::shared_ptr<const StoredConversation> conversation)
      EXCLUDES(mu_);
  // Null when unknown or evicted; a hit counts as a use.
  std::shared_ptr<const StoredConversation> get(const std::string& id) EXCLUDES(mu_);
  size_t size() const EXCLUDES(mu_);

 private:
  struct Entry {
    std::shared_ptr<const StoredConversation> conversation;
    std::list<std::string>::iterator lru;
  };
  const size_t max_entries_;
  mutable Mutex mu_;
  std::list<std::string> lru_ GUARDED_BY(mu_);  // front: most recently used
  std::unordered_map<std::string, Entry> entries_ GUARDED_BY(mu_);
};

struct ResponsesRequest {
  ChatRequest chat;
  bool store = true;
  std::string previous_response_id;        // empty: none
  std::string instructions_json = "null";  // echoed in the response object
  std::string tools_json = "[]";
  std::string tool_choice_json = "\"auto\"";
  std::string text_format_json = R"({"type":"text"})";  // text.format as given (echoed)
  std::optional<uint32_t> max_output_tokens;
  // The conversation this response continues plus its input (what is stored with its output).
  StoredConversation conversation;
};

// `store` may be null (then previous_response_id always answers 404). Limits as chat's, the
// --max-input-chars guard naming input fields.
Result<ResponsesRequest> parseResponsesRequest(std::string_view body, const ModelSpec& spec,
                                               const Tokenizer* tokenizer, ResponsesStore* store,
                                               const RequestLimits& limits = {},
                                               const harmony::ChatRenderOptions& render = {});

class ResponsesOutput final : public GenerationOutput {
 public:
  // `identity.id` is the response id ("resp_..."); `store` null or request.store false: the
  // response is not stored. `tokenizer` must outlive this object.
  ResponsesOutput(const Tokenizer& tokenizer, const ResponsesRequest& request,
                  ResponseIdentity identity, std::shared_ptr<ResponsesStore> store);

  size_t choices() const override { return 1; }
  bool onTokens(size_t choice, std::span<const int32_t> ids,
                std::span<const llm::LlmTokenLogprobs> logprobs = {}) override;
  void finishChoice(size_t choice, const ChoiceEnd& end) override;
  std::string takeSse() override;
  std::string responseJson() const override;
  std::string sseError(const Status& status) override;

  enum class ItemKind { kReasoning, kMessage, kFunctionCall };
  struct Item {
    ItemKind kind = ItemKind::kMessage;
    std::string id;
    std::string text;  // reasoning text, message text, or the call's arguments
    std::string call_id, name;
    size_t tool_index = 0;
    bool done = false;
  };
  const std::vector<Item>& items() const { return items_; }

 private:
  void emit(const harmony::ChatDelta& delta);
  void appendText(ItemKind kind, const std::string& text);
  void openItem(Item item);
  void closeItem();
  void event(std::string_view type, const std::function<void(JsonWriter&)>& body);
  void writeItem(JsonWriter& w, const Item& item) const;
  void writeResponse(JsonWriter& w, std::string_view status, const Status* error) const;
  void storeConversation() const;

  ResponseIdentity identity_;
  bool stream_;
  bool store_;
  std::string previous_response_id_, instructions_json_, tools_json_, tool_choice_json_;
  std::string text_format_json_;
  std::optional<uint32_t> max_output_tokens_;
  harmony::ReasoningEffort effort_;
  float temperature_, top_p_;
  std::shared_ptr<const StoredConversation> conversation_;
  std::shared_ptr<ResponsesStore> store_ptr_;
  uint64_t prompt_len_;
  harmony::HarmonyOutputDecoder decoder_;
  std::vector<Item> items_;
  std::string sse_;
  uint64_t sequence_ = 0;
  uint64_t generated_ = 0;
  uint64_t reasoning_tokens_ = 0;
  bool finished_ = false;
  bool hit_length_ = false;
  Usage usage_;
};

}  // namespace garden::ivy
