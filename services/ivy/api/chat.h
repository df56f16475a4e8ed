#pragma once
// POST /v1/chat/completions over Harmony (gpt-oss): request parsing into the prompt ids and
// generation parameters, and ChatCompletionOutput, which turns generated ids into the OpenAI
// response (stream of chat.completion.chunk events, or one chat.completion).
//
// Request: the OpenAI chat shape. messages / tools / tool_choice / reasoning_effort are mapped by
// harmony/openai_request.h; the sampling and streaming fields by api/completions_common.h.
// The prompt is the Harmony completion prompt (ending in "<|start|>assistant") followed by the
// tool_choice prefix:
//   * a named function: the prefix is the whole call header (harmony::toolChoicePrefix), so the
//     model's turn starts inside the call's arguments; "required" with exactly one tool is treated
//     as that tool named; "required" with several opens "to=functions." and the model writes the
//     name. The prefix ids are replayed through the output decoder first, so the call appears as
//     if the model wrote it.
//   * "none": the tools are left out of the prompt AND calls the model makes anyway are not
//     exposed (they go to reasoning_content); finish_reason is then never tool_calls.
// Generation stops at <|return|> and <|call|> (plus the model's eos ids).
//
// Output (ChatCompletionOutput): generated ids -> lenient Harmony parser -> chat deltas
// (harmony/chat_output.h: analysis -> reasoning_content, final/commentary -> content,
// to=functions.X -> tool_calls). Stop strings apply to `content` only: the content is cut before
// the match and finish_reason is "stop". finish_reason: "length" when tulip stopped at max_tokens
// (with everything produced so far), "tool_calls" when the turn made calls, otherwise "stop".
// Streaming: a role chunk, then one chunk per non-empty delta (reasoning_content, content,
// tool_calls with index/id/type/function.name first, then argument fragments), a chunk with
// finish_reason, a usage chunk (choices: []) when stream_options.include_usage, then [DONE].
// Non-streaming: the same deltas assembled into one message; usage is always present.
// [TAG_STREAM_EQUALS_FULL]
// logprobs: true: choices[0].logprobs.content has one entry per generated token of the whole
// Harmony turn (analysis, headers and final alike: the model sampled them all), tokens after a
// matched stop string excepted; streamed, each chunk carries the entries of the tokens since the
// previous chunk.
//
// Parsing is pure (any thread). A ChatCompletionOutput is used by one thread at a time.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "services/ivy/api/completions_common.h"
#include "services/ivy/api/model_spec.h"
#include "services/ivy/harmony/chat_output.h"
#include "services/ivy/harmony/openai_request.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

struct ChatRequest {
  harmony::HarmonyChatRequest harmony;
  std::vector<TokenId> prompt_ids;         // rendered conversation + tool_choice prefix
  std::vector<TokenId> forced_prefix_ids;  // the tool_choice prefix (the tail of prompt_ids)
  std::vector<TokenId> stop_token_ids;     // <|return|>, <|call|>, then the model's eos ids
  SamplingRequest sampling;
  uint32_t max_tokens = 0;  // resolved against the context length
  // Structured outputs [TAG_TOKEN_MASK]: the grammar applies to the final channel's message.
  std::vector<TokenId> final_channel_ids;  // the ids of "final" (the header after <|channel|>)
  bool final_prefix_forced = false;  // skip_reasoning: the prompt ends in <|channel|>final<|message|>
  // Strict function tools [TAG_STRICT_TOOLS]: each one's arguments grammar (serialized). Empty
  // under tool_choice "none" (no call is exposed then).
  struct StrictTool {
    std::string name;
    std::string grammar;
  };
  std::vector<StrictTool> strict_tools;
};

// `tokenizer` null or not a Harmony tokenizer: 400 (chat needs o200k_harmony). `limits`: the
// raw-body --max-input-chars guard (naming messages) before parsing, and --max-input-tokens /
// --max-request-tokens on the rendered prompt (api/limits.h).
Result<ChatRequest> parseChatRequest(std::string_view body, const ModelSpec& spec,
                                     const Tokenizer* tokenizer, const RequestLimits& limits = {},
                                     const harmony::ChatRenderOptions& render_options = {});

struct ResponseIdentity {
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;    // the served name
  // Tool-call ids, by index within the completion; default randomId("call_").
  std::function<std::string(size_t index)> make_tool_call_id;
};

// The output decoder's options for `request`: its declared functions, calls hidden under
// tool_choice "none", ids from `make_tool_call_id` (null: random "call_...").
harmony::ChatOutputOptions chatOutputOptions(
    const ChatRequest& request, const std::function<std::string(size_t)>& make_tool_call_id);

class ChatCompletionOutput final : public GenerationOutput {
 public:
  // `tokenizer` must outlive this object. One choice of a response with n > 1 (api/choices.h)
  // has its `choice_index` and `ends_stream` false: its stream then stops after its finish chunk
  // (the usage chunk and [DONE] are the whole response's).
  ChatCompletionOutput(const Tokenizer& tokenizer, const ChatRequest& request,
                       ResponseIdentity identity, size_t choice_index = 0,
                       bool ends_stream = true);

  size_t choices() const override { return 1; }
  bool onTokens(size_t choice, std::span<const int32_t> ids,
                std::span<const llm::LlmTokenLogprobs> logprobs = {}) override;
  void finishChoice(size_t choice, const ChoiceEnd& end) override;
  std::string takeSse() override;
  std::string responseJson() const override;

  // The choice object of responseJson() ({"index","message","logprobs","finish_reason"}), its
  // usage and whether it ended.
  void writeChoice(JsonWriter& w) const;
  const Usage& usage() const { return usage_; }
  bool finished() const { return finished_; }

  // The accumulated deltas (what responseJson() renders), for tests.
  const harmony::ChatDelta& assembled() const { return total_; }
  const harmony::HarmonyOutputDecoder& decoder() const { return decoder_; }

 private:
  void emit(harmony::ChatDelta delta);
  void finish(harmony::FinishReason reason, const ChoiceEnd& end);
  void writeChunkHead(JsonWriter& w) const;
  // "logprobs": null, or {"content":[...]} with the entries not yet streamed (a chunk) or all.
  void writeLogprobs(JsonWriter& w, bool all);

  ResponseIdentity identity_;
  const Tokenizer& tokenizer_;
  uint64_t index_ = 0;      // choices[].index
  bool ends_stream_ = true;  // the finish also writes the usage chunk and [DONE]
  bool logprobs_ = false;                // the request asked (logprobs: true)
  std::vector<std::string> lp_all_;      // one rendered content entry per generated token
  size_t lp_streamed_ = 0;               // entries already sent in chunks
  bool stream_;
  bool include_usage_;
  uint64_t prompt_len_;
  harmony::HarmonyOutputDecoder decoder_;
  StopStringMatcher stop_;
  harmony::ChatDelta total_;
  std::string sse_;
  uint64_t generated_ = 0;
  bool finished_ = false;
  harmony::FinishReason finish_reason_ = harmony::FinishReason::kStop;
  Usage usage_;
};

}  // namespace garden::ivy
