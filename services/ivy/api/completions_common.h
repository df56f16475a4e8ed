#pragma once
// What /v1/chat/completions and /v1/completions share: the sampling and streaming fields of the
// request, stop-string matching on generated text, server-sent-event framing, usage, and the
// GenerationOutput interface through which the HTTP layer (http/chat_routes.cc) drives either
// endpoint's response builder with generated token ids.
//
// Request fields (OpenAI names; null counts as absent; unknown fields are ignored):
//   max_tokens | max_completion_tokens (int >= 1; the latter wins), temperature [0, 2],
//   top_p (0, 1], top_k (int >= -1; -1 and 0 = off), min_p [0, 1], seed (int), stop (string or
//   array of up to 16 non-empty strings), n (1..16), stream (bool),
//   stream_options.include_usage (bool), ignore_eos (bool, vLLM), user (ignored),
//   presence_penalty / frequency_penalty [-2, 2], repetition_penalty (> 0, vLLM), logit_bias
//   (object: token id string → [-100, 100], ids checked by checkLogitBias), logprobs (chat: bool,
//   with top_logprobs 0..20; completions: int 0..5). Unsupported features are rejected by name
//   rather than silently ignored: suffix, best_of < n or with stream (completions). response_format
//   is {"type": "text" | "json_object" | "json_schema"} (api/response_format.h,
//   docs/structured-outputs.md). docs/api.md lists every field.
// Every error follows [TAG_FIELD_ERRORS] (the message starts with the field).
//
// Parsing functions are pure and callable from any thread; a GenerationOutput and a
// StopStringMatcher belong to one request and are used by one thread at a time.

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_writer.h"
#include "common/llm/step.h"
#include "common/status.h"
#include "services/ivy/api/limits.h"
#include "services/ivy/api/model_spec.h"
#include "services/ivy/api/response_format.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

struct SamplingRequest {
  std::optional<uint32_t> max_tokens;
  float temperature = 1.f;
  float top_p = 1.f;
  int32_t top_k = 0;
  bool has_seed = false;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool ignore_eos = false;
  float min_p = 0.f;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  float repetition_penalty = 1.f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias), ids distinct
  bool logprobs = false;      // chat: logprobs; completions: logprobs present (an int)
  uint32_t top_logprobs = 0;  // chat: top_logprobs; completions: the logprobs int
  // Choices per prompt [TAG_LLM_CHOICES]: n (1..16); completions' best_of (n..16) generates
  // best_of and returns the n with the highest cumulative logprob (not with stream).
  uint32_t n = 1;
  uint32_t best_of = 1;  // = n unless given
  uint32_t sequences() const { return best_of > n ? best_of : n; }
  // response_format json_object / json_schema (api/response_format.h) [TAG_TOKEN_MASK].
  std::optional<StructuredOutput> structured;
};

// n, best_of and max_tokens against --max-inflight-tokens: a request with more than one sequence
// per prompt whose prompts + sequences × max_tokens (`tokens`) exceed the limit can never be
// admitted, so it is a 400 naming best_of (when it is the larger) or n. 0 = no limit.
Status checkChoiceTokens(const SamplingRequest& sampling, uint64_t tokens, uint64_t limit);

enum class ApiKind { kChat, kCompletions };

// The fields listed above from a parsed request object.
Status parseSamplingFields(const simdjson::dom::element& root, ApiKind api, SamplingRequest* out);

// 400 naming logit_bias when an id is outside [0, vocab) (vocab 0: unknown, not checked).
Status checkLogitBias(const SamplingRequest& sampling, uint32_t vocab);

// A generated token as logprobs show it (OpenAI): its decoded text — "bytes:\xNN..." when its
// bytes are not whole UTF-8 on their own — and its bytes.
struct TokenText {
  std::string token;
  std::vector<uint8_t> bytes;
};
TokenText tokenText(const Tokenizer& tokenizer, int32_t id);
// A logprob as JSON can carry it: -inf (and anything below) becomes -9999.0, as vLLM does.
float jsonLogprob(float lp);
// {"token","logprob","bytes","top_logprobs":[{"token","logprob","bytes"}...]}: one entry of a
// chat completion's choices[].logprobs.content.
std::string chatLogprobEntry(const Tokenizer& tokenizer, int32_t id, const llm::LlmTokenLogprobs& lp);

// The start both endpoints share: no text literal in the raw `body` longer than
// --max-input-chars (400 naming the field, e.g. messages[2].content; checked before parsing,
// api/limits.h); `body` parsed with `parser` (which owns the returned element) by parseJsonBody
// (api/json_body.h: a JSON object, no repeated keys; 400 otherwise); its `model` when present
// must be a string equal to spec.served_name (NOT_FOUND otherwise). Whether the served model
// generates at all is the pipeline's check (checkModelKind, api/model_spec.h), made before this.
Result<simdjson::dom::element> parseGenerativeRequestBody(std::string_view body,
                                                          const ModelSpec& spec,
                                                          std::string_view text_field,
                                                          const RequestLimits& limits,
                                                          simdjson::dom::parser& parser);

// --max-input-tokens on one prompt of `tokens` tokens, when the flag is set below the context
// (the context itself is resolveMaxTokens's check, which leaves room to generate).
Status checkPromptTokens(size_t tokens, const std::string& path, const RequestLimits& limits,
                         const ModelSpec& spec);

// The max_tokens to send for a prompt of `prompt_len` tokens: the requested value (400 naming
// max_tokens when prompt + max_tokens exceeds max_seq_len), else `default_tokens` clamped to
// what is left of the context (0 = all of it). 400 naming `prompt_field` when the prompt alone
// fills the context. max_seq_len 0 means unknown (no checks; the default falls back to 4096).
Result<uint32_t> resolveMaxTokens(const SamplingRequest& sampling, size_t prompt_len,
                                  uint32_t max_seq_len, uint32_t default_tokens,
                                  std::string_view prompt_field);

// Stop strings over a text stream (the decoded content). Text that might be the start of a stop
// string is held back until it is known not to be, so a stop string never reaches the caller even
// when it spans deltas. Deltas are whole UTF-8 characters and so is every piece returned.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);
  // Returns the text that is safe to emit now. When a stop string completes, `*matched` becomes
  // true and the returned text ends right before it; everything after is discarded.
  std::string push(std::string_view text, bool* matched);
  // End of the text: what is still held back.
  std::string flush();
  bool matched() const { return matched_; }
  bool active() const { return !stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
};

// "data: <json>\n\n" appended to *out; and the terminating event.
void appendSseEvent(std::string* out, std::string_view json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// prefix + 24 random alphanumerics ("chatcmpl-...", "cmpl-...", "call_...").
std::string randomId(std::string_view prefix);

struct Usage {
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;
  uint64_t cached_tokens = 0;
};
// "usage":{"prompt_tokens","completion_tokens","total_tokens","prompt_tokens_details":{...}}
void writeUsage(JsonWriter& w, const Usage& usage);

// How one generation (one choice) ended, as the HTTP layer saw it from tulip.
struct ChoiceEnd {
  bool hit_length = false;     // tulip stopped at max_tokens
  uint32_t prompt_tokens = 0;  // tulip's count (0: not reported)
  uint32_t cached_prompt_tokens = 0;
  uint32_t completion_tokens = 0;  // tulip's count (0: not reported)
};

// A response under construction, fed with generated ids. Streaming and non-streaming responses
// are produced by the same calls: every delta is both framed as an SSE chunk and accumulated;
// responseJson() renders the accumulated deltas. [TAG_STREAM_EQUALS_FULL]
class GenerationOutput {
 public:
  virtual ~GenerationOutput() = default;
  virtual size_t choices() const = 0;
  // Applies generated ids of `choice`, with their logprobs when the request asked for them
  // (`logprobs` empty or one per id). False once a stop string matched: the choice is complete
  // (the caller cancels its generation and must not call finishChoice for it).
  virtual bool onTokens(size_t choice, std::span<const int32_t> ids,
                        std::span<const llm::LlmTokenLogprobs> logprobs = {}) = 0;
  // Generation of `choice` ended normally.
  virtual void finishChoice(size_t choice, const ChoiceEnd& end) = 0;
  // Streaming: SSE bytes produced since the last call. After every choice finished, this includes
  // the usage chunk (when asked) and [DONE].
  virtual std::string takeSse() = 0;
  // Non-streaming: the whole response (after every choice finished).
  virtual std::string responseJson() const = 0;
  // Streaming: the events that end a stream which failed after it began (sseErrorEvents below
  // for chat and completions).
  virtual std::string sseError(const Status& status);
};

// The SSE event for an error after the stream began: {"error":{...}} then [DONE].
std::string sseErrorEvents(const Status& status);

}  // namespace garden::ivy
