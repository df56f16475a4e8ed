#pragma once
// n > 1 choices of /v1/chat/completions [TAG_LLM_CHOICES]: one ChatCompletionOutput per choice
// (each with its choices[].index), assembled into one response. Streamed, every choice's chunks
// go out as they come (the role chunk of each first, then its deltas and its finish chunk, choices
// interleaved as tulip's tokens arrive: the OpenAI shape, each chunk naming its index); after the
// last choice finished, one usage chunk (when stream_options.include_usage) and [DONE].
// Not streamed: {"choices":[...n...], "usage"}. Usage counts the prompt once (it is prefilled once
// and shared) and sums the completion tokens of every choice.
//
// Used by one thread at a time (the request's GenerationJob).

#include <memory>
#include <string>
#include <vector>

#include "services/ivy/api/chat.h"

namespace garden::ivy {

class ChatChoicesOutput final : public GenerationOutput {
 public:
  // `n` >= 1 choices of `request`; `tokenizer` must outlive this object.
  ChatChoicesOutput(const Tokenizer& tokenizer, const ChatRequest& request,
                    ResponseIdentity identity, uint32_t n);

  size_t choices() const override { return parts_.size(); }
  bool onTokens(size_t choice, std::span<const int32_t> ids,
                std::span<const llm::LlmTokenLogprobs> logprobs = {}) override;
  void finishChoice(size_t choice, const ChoiceEnd& end) override;
  std::string takeSse() override;
  std::string responseJson() const override;

  const ChatCompletionOutput& choice(size_t i) const { return *parts_[i]; }

 private:
  Usage usage() const;

  ResponseIdentity identity_;
  bool stream_;
  bool include_usage_;
  std::vector<std::unique_ptr<ChatCompletionOutput>> parts_;
  bool ended_ = false;  // the usage chunk and [DONE] were queued
};

}  // namespace garden::ivy
