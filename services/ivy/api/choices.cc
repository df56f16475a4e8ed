#include "services/ivy/api/choices.h"

#include <algorithm>

#include "common/json_writer.h"

namespace garden::ivy {

ChatChoicesOutput::ChatChoicesOutput(const Tokenizer& tokenizer, const ChatRequest& request,
                                     ResponseIdentity identity, uint32_t n)
    : identity_(identity),
      stream_(request.sampling.stream),
      include_usage_(request.sampling.include_usage) {
  parts_.reserve(std::max<uint32_t>(n, 1));
  for (uint32_t i = 0; i < std::max<uint32_t>(n, 1); ++i) {
    parts_.push_back(std::make_unique<ChatCompletionOutput>(tokenizer, request, identity, i,
                                                            /*ends_stream=*/false));
  }
}

bool ChatChoicesOutput::onTokens(size_t choice, std::span<const int32_t> ids,
                                 std::span<const llm::LlmTokenLogprobs> logprobs) {
  return parts_[choice]->onTokens(0, ids, logprobs);
}

void ChatChoicesOutput::finishChoice(size_t choice, const ChoiceEnd& end) {
  parts_[choice]->finishChoice(0, end);
}

Usage ChatChoicesOutput::usage() const {
  // The prompt was prefilled once for every choice: count it (and its cache hits) once.
  Usage u;
  u.prompt_tokens = parts_[0]->usage().prompt_tokens;
  u.cached_tokens = parts_[0]->usage().cached_tokens;
  for (const auto& p : parts_) u.completion_tokens += p->usage().completion_tokens;
  return u;
}

std::string ChatChoicesOutput::takeSse() {
  std::string out;
  for (auto& p : parts_) out += p->takeSse();
  if (!stream_ || ended_) return out;
  for (const auto& p : parts_)
    if (!p->finished()) return out;
  ended_ = true;
  if (include_usage_) {
    JsonWriter u;
    u.beginObject()
        .field("id", identity_.id)
        .field("object", "chat.completion.chunk")
        .field("created", identity_.created)
        .field("model", identity_.model);
    u.key("choices").beginArray().endArray();
    writeUsage(u, usage());
    u.endObject();
    appendSseEvent(&out, u.take());
  }
  out.append(kSseDone);
  return out;
}

std::string ChatChoicesOutput::responseJson() const {
  JsonWriter w;
  w.beginObject()
      .field("id", identity_.id)
      .field("object", "chat.completion")
      .field("created", identity_.created)
      .field("model", identity_.model);
  w.key("choices").beginArray();
  for (const auto& p : parts_) p->writeChoice(w);
  w.endArray();
  writeUsage(w, usage());
  w.endObject();
  return w.take();
}

}  // namespace garden::ivy
