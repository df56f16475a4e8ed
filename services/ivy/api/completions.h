#pragma once
// POST /v1/completions (OpenAI legacy completions, vLLM extensions): raw prompts in, text out.
//
// Request: `prompt` is a string, an array of strings, an array of token ids, or an array of
// token-id arrays; each prompt is one choice (its `index` is the prompt's position). Sampling and
// streaming fields: api/completions_common.h; `echo` (bool) prepends the prompt text to the
// choice's text; `ignore_eos` (vLLM) keeps generating past the model's eos ids. max_tokens
// defaults to 16 (OpenAI), clamped to the context left. Generation stops at the model's eos ids
// (ModelSpec::eos_token_ids, from tulip's ModelInfo) unless ignore_eos. Text is decoded with the
// streaming detokenizer (special tokens skipped, ids the tokenizer does not name dropped, both as
// Hugging Face decodes for vLLM), so a delta never splits a UTF-8 character;
// stop strings cut the text (finish_reason "stop"); tulip stopping at max_tokens gives "length".
//
// Streaming: text_completion chunks {"choices":[{"index","text","logprobs":null,
// "finish_reason":null}]} as text arrives (choices interleave), a finish chunk per choice, a usage
// chunk (choices: []) when stream_options.include_usage, then [DONE]. Non-streaming: the same
// pieces assembled per choice; usage summed over the prompts. [TAG_STREAM_EQUALS_FULL]
//
// n and best_of [TAG_LLM_CHOICES]: each prompt generates sampling.sequences() candidates
// (choices() = prompts × sequences, candidate j of prompt p at p × sequences + j, which is what
// the HTTP layer feeds). Rendered choice indexes are p × n + j (OpenAI / vLLM). With best_of > n
// (never streamed) the n candidates of each prompt with the highest cumulative logprob of their
// generated tokens (the sum of the sampled tokens' raw logprobs that tulip returns; ties: lower
// candidate first) are returned, in that order. Usage counts each prompt once and the completion
// tokens of every candidate generated (best_of included, as OpenAI bills them).
//
// Parsing is pure (any thread). A CompletionsOutput is used by one thread at a time.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "services/ivy/api/chat.h"
#include "services/ivy/api/completions_common.h"
#include "services/ivy/api/model_spec.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

struct CompletionsRequest {
  std::vector<std::vector<TokenId>> prompts;  // one per choice, never empty
  std::vector<std::string> prompt_texts;      // per prompt: the text given (empty for ids)
  std::vector<bool> prompt_is_text;
  bool echo = false;
  SamplingRequest sampling;
  std::vector<uint32_t> max_tokens;     // per prompt, resolved against the context length
  std::vector<TokenId> stop_token_ids;  // the model's eos ids unless ignore_eos
  // The model's vocabulary (ModelSpec::vocab_size): an id below it that the tokenizer does not
  // name (gpt-oss's reserved 200019..201087) decodes to nothing, as in Hugging Face.
  int32_t model_vocab_size = 0;
};

struct CompletionsLimits {
  size_t max_prompts = 128;
};

// `tokenizer` null: 400 (text cannot be produced without one). `limits`: the raw-body
// --max-input-chars guard (naming prompt) before parsing, --max-input-tokens per prompt and
// --max-request-tokens over all of them (api/limits.h).
Result<CompletionsRequest> parseCompletionsRequest(std::string_view body, const ModelSpec& spec,
                                                   const Tokenizer* tokenizer,
                                                   const RequestLimits& limits = {},
                                                   const CompletionsLimits& completions_limits = {});

class CompletionsOutput final : public GenerationOutput {
 public:
  CompletionsOutput(const Tokenizer& tokenizer, const CompletionsRequest& request,
                    ResponseIdentity identity);

  size_t choices() const override { return choices_.size(); }
  bool onTokens(size_t choice, std::span<const int32_t> ids,
                std::span<const llm::LlmTokenLogprobs> logprobs = {}) override;
  void finishChoice(size_t choice, const ChoiceEnd& end) override;
  std::string takeSse() override;
  std::string responseJson() const override;

  const std::string& text(size_t choice) const { return choices_[choice].text; }
  double cumulativeLogprob(size_t choice) const { return choices_[choice].cum_logprob; }

 private:
  struct Choice {
    Choice(const Tokenizer& tok, int32_t model_vocab_size, std::vector<std::string> stops)
        : detok(tok, /*skip_special=*/true, model_vocab_size), stop(std::move(stops)) {}
    StreamingDetokenizer detok;
    StopStringMatcher stop;
    std::string text;  // assembled
    uint64_t prompt_len = 0;
    uint64_t generated = 0;
    double cum_logprob = 0;  // of the generated tokens, when tulip returned logprobs
    bool finished = false;
    std::string_view finish_reason = "stop";
    Usage usage;
    // logprobs (the legacy shape), one entry per generated token.
    std::vector<std::string> lp_tokens;
    std::vector<float> lp_values;
    std::vector<std::string> lp_top;  // rendered {"token": logprob, ...}
    std::vector<uint64_t> lp_offsets;
    size_t lp_streamed = 0;
    uint64_t lp_chars = 0;  // characters of the tokens so far (text_offset)
  };
  // "logprobs": null, or {"tokens","token_logprobs","top_logprobs","text_offset"} over the
  // entries not yet streamed (a chunk) or all of them.
  void writeLogprobs(JsonWriter& w, const Choice& c, bool all) const;
  // Generated text through the stop-string filter, then appendText.
  void emitText(size_t choice, std::string text);
  // Adds `text` to the choice and, when streaming, queues its delta event.
  void appendText(size_t choice, std::string_view text);
  void finish(size_t choice, std::string_view reason, const ChoiceEnd& end);
  void writeHead(JsonWriter& w) const;
  // The rendered index of candidate `c` (streaming, or best_of == n: p × n + j = c).
  uint64_t renderedIndex(size_t c) const { return c; }
  Usage totalUsage() const;

  ResponseIdentity identity_;
  const Tokenizer& tokenizer_;
  bool logprobs_ = false;
  bool stream_;
  bool include_usage_;
  uint32_t n_ = 1;          // choices returned per prompt
  uint32_t sequences_ = 1;  // candidates generated per prompt (best_of, else n)
  std::vector<Choice> choices_;
  size_t unfinished_;
  std::string sse_;
};

}  // namespace garden::ivy
