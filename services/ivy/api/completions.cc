#include "services/ivy/api/completions.h"

#include <algorithm>
#include <limits>

#include "common/json_writer.h"
#include "services/ivy/api/errors.h"

namespace garden::ivy {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

constexpr uint32_t kDefaultMaxTokens = 16;  // OpenAI's default for /v1/completions

Result<std::vector<TokenId>> idsOf(const element& arr_el, const ModelSpec& spec,
                                   const std::string& path) {
  simdjson::dom::array arr;
  if (arr_el.get_array().get(arr) != simdjson::SUCCESS)
    return invalidField(path, "must be an array");
  std::vector<TokenId> ids;
  ids.reserve(arr.size());
  size_t i = 0;
  for (element e : arr) {
    int64_t id;
    if (e.get_int64().get(id) != simdjson::SUCCESS || id < 0 ||
        (spec.vocab_size != 0 && id >= spec.vocab_size)) {
      return invalidField(path + "[" + std::to_string(i) + "]",
                          "must be a token id in [0, " + std::to_string(spec.vocab_size) + ")");
    }
    ids.push_back(static_cast<TokenId>(id));
    ++i;
  }
  if (ids.empty()) return invalidField(path, "must not be empty");
  return ids;
}

}  // namespace

Result<CompletionsRequest> parseCompletionsRequest(std::string_view body, const ModelSpec& spec,
                                                   const Tokenizer* tokenizer,
                                                   const RequestLimits& limits,
                                                   const CompletionsLimits& completions_limits) {
  thread_local simdjson::dom::parser parser;
  ASSIGN_OR_RETURN(element root, parseGenerativeRequestBody(body, spec, "prompt", limits, parser));
  if (tokenizer == nullptr) {
    return failedPrecondition(
        "this server has no tokenizer configured; /v1/completions needs one to produce text "
        "(start ivy with --tokenizer)");
  }
  CompletionsRequest req;
  RETURN_IF_ERROR(parseSamplingFields(root, ApiKind::kCompletions, &req.sampling));
  RETURN_IF_ERROR(checkLogitBias(req.sampling, spec.vocab_size));
  element echo;
  if (root["echo"].get(echo) == simdjson::SUCCESS && echo.type() != element_type::NULL_VALUE) {
    if (echo.get_bool().get(req.echo) != simdjson::SUCCESS)
      return invalidField("echo", "must be a boolean");
    // Echo with logprobs would need the prompt's logprobs, which the model does not return.
    if (req.echo && req.sampling.logprobs)
      return invalidField("logprobs", "is not supported together with echo (no prompt logprobs)");
  }

  element prompt;
  if (root["prompt"].get(prompt) != simdjson::SUCCESS ||
      prompt.type() == element_type::NULL_VALUE) {
    return invalidField("prompt", "missing");
  }
  auto addText = [&](std::string_view text, const std::string& path) -> Status {
    std::vector<TokenId> ids;
    tokenizer->encode(text, &ids);
    if (ids.empty()) return invalidField(path, "must not be empty");
    req.prompts.push_back(std::move(ids));
    req.prompt_texts.emplace_back(text);
    req.prompt_is_text.push_back(true);
    return okStatus();
  };
  std::string_view text;
  bool batched = false;  // an array of prompts: errors name prompt[i]
  if (prompt.get_string().get(text) == simdjson::SUCCESS) {
    RETURN_IF_ERROR(addText(text, "prompt"));
  } else if (prompt.type() == element_type::ARRAY) {
    simdjson::dom::array arr;
    if (prompt.get_array().get(arr) != simdjson::SUCCESS)
      return invalidField("prompt", "must be an array");
    if (arr.size() == 0) return invalidField("prompt", "must not be empty");
    element first = arr.at(0).value_unsafe();
    if (first.is_int64() || first.is_uint64()) {
      ASSIGN_OR_RETURN(auto ids, idsOf(prompt, spec, "prompt"));
      req.prompts.push_back(std::move(ids));
      req.prompt_texts.emplace_back();
      req.prompt_is_text.push_back(false);
    } else {
      batched = true;
      if (arr.size() > completions_limits.max_prompts)
        return invalidField("prompt", "has more than " +
                                          std::to_string(completions_limits.max_prompts) +
                                          " prompts");
      size_t i = 0;
      for (element e : arr) {
        std::string path = "prompt[" + std::to_string(i++) + "]";
        if (e.get_string().get(text) == simdjson::SUCCESS) {
          RETURN_IF_ERROR(addText(text, path));
        } else if (e.type() == element_type::ARRAY) {
          ASSIGN_OR_RETURN(auto ids, idsOf(e, spec, path));
          req.prompts.push_back(std::move(ids));
          req.prompt_texts.emplace_back();
          req.prompt_is_text.push_back(false);
        } else {
          return invalidField(path, "must be a string or an array of token ids");
        }
      }
    }
  } else {
    return invalidField("prompt",
                        "must be a string, an array of strings, an array of token ids or an "
                        "array of token-id arrays");
  }
  size_t total = 0;
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    std::string field = batched ? "prompt[" + std::to_string(i) + "]" : std::string("prompt");
    RETURN_IF_ERROR(checkPromptTokens(req.prompts[i].size(), field, limits, spec));
    total += req.prompts[i].size();
    RETURN_IF_ERROR(checkRequestTokens(total, "prompt", limits));
    ASSIGN_OR_RETURN(uint32_t m, resolveMaxTokens(req.sampling, req.prompts[i].size(),
                                                  spec.max_seq_len, kDefaultMaxTokens, field));
    req.max_tokens.push_back(m);
  }
  if (!req.sampling.ignore_eos) req.stop_token_ids = spec.eos_token_ids;
  req.model_vocab_size = static_cast<int32_t>(spec.vocab_size);
  return req;
}

CompletionsOutput::CompletionsOutput(const Tokenizer& tokenizer, const CompletionsRequest& request,
                                     ResponseIdentity identity)
    : identity_(std::move(identity)),
      tokenizer_(tokenizer),
      logprobs_(request.sampling.logprobs),
      stream_(request.sampling.stream),
      include_usage_(request.sampling.include_usage),
      n_(std::max<uint32_t>(request.sampling.n, 1)),
      sequences_(std::max<uint32_t>(request.sampling.sequences(), 1)),
      unfinished_(request.prompts.size() * sequences_) {
  choices_.reserve(unfinished_);
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    for (uint32_t j = 0; j < sequences_; ++j) {
      choices_.emplace_back(tokenizer, request.model_vocab_size, request.sampling.stop);
      choices_.back().prompt_len = request.prompts[i].size();
    }
  }
  if (!request.echo) return;
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    std::string echo;
    if (request.prompt_is_text[i]) {
      echo = request.prompt_texts[i];
    } else {
      auto decoded =
          tokenizer.decode(request.prompts[i], /*skip_special=*/false, request.model_vocab_size);
      if (decoded.isOk()) echo = std::move(decoded).value();
    }
    // The echoed prompt is not generated text: stop strings do not apply to it.
    if (echo.empty()) continue;
    for (uint32_t j = 0; j < sequences_; ++j) appendText(i * sequences_ + j, echo);
  }
}

Usage CompletionsOutput::totalUsage() const {
  // A prompt is prefilled once for all its candidates: its tokens count once.
  Usage total;
  for (size_t c = 0; c < choices_.size(); ++c) {
    const Choice& ch = choices_[c];
    if (c % sequences_ == 0) {
      total.prompt_tokens += ch.usage.prompt_tokens;
      total.cached_tokens += ch.usage.cached_tokens;
    }
    total.completion_tokens += ch.usage.completion_tokens;
  }
  return total;
}

void CompletionsOutput::writeHead(JsonWriter& w) const {
  w.field("id", identity_.id)
      .field("object", "text_completion")
      .field("created", identity_.created)
      .field("model", identity_.model);
}

void CompletionsOutput::writeLogprobs(JsonWriter& w, const Choice& c, bool all) const {
  if (!logprobs_) {
    w.nullField("logprobs");
    return;
  }
  const size_t from = all ? 0 : c.lp_streamed;
  const size_t n = c.lp_tokens.size();
  w.key("logprobs").beginObject();
  w.key("tokens").beginArray();
  for (size_t k = from; k < n; ++k) w.value(c.lp_tokens[k]);
  w.endArray().key("token_logprobs").beginArray();
  for (size_t k = from; k < n; ++k) w.value(c.lp_values[k]);
  w.endArray().key("top_logprobs").beginArray();
  for (size_t k = from; k < n; ++k) w.raw(c.lp_top[k]);
  w.endArray().key("text_offset").beginArray();
  for (size_t k = from; k < n; ++k) w.value(c.lp_offsets[k]);
  w.endArray().endObject();
}

void CompletionsOutput::emitText(size_t i, std::string text) {
  Choice& c = choices_[i];
  if (c.stop.active()) {
    bool matched = false;
    text = c.stop.push(text, &matched);
  }
  if (!text.empty()) appendText(i, text);
}

void CompletionsOutput::appendText(size_t i, std::string_view text) {
  choices_[i].text += text;
  if (!stream_) return;
  std::string json;
  JsonWriter w(&json);
  w.beginObject();
  writeHead(w);
  w.key("choices").beginArray().beginObject().field("index", renderedIndex(i));
  w.field("text", text);
  writeLogprobs(w, choices_[i], false);
  choices_[i].lp_streamed = choices_[i].lp_tokens.size();
  w.nullField("finish_reason");
  w.endObject().endArray();
  if (include_usage_) w.nullField("usage");
  w.endObject();
  appendSseEvent(&sse_, json);
}

bool CompletionsOutput::onTokens(size_t i, std::span<const int32_t> ids,
                                 std::span<const llm::LlmTokenLogprobs> logprobs) {
  Choice& c = choices_[i];
  if (c.finished) return false;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    ++c.generated;
    if (k < logprobs.size()) c.cum_logprob += logprobs[k].logprob;
    if (logprobs_) {
      llm::LlmTokenLogprobs none;
      none.logprob = -std::numeric_limits<float>::infinity();
      none.num_top = 0;
      const llm::LlmTokenLogprobs& lp = k < logprobs.size() ? logprobs[k] : none;
      TokenText t = tokenText(tokenizer_, id);
      c.lp_offsets.push_back(c.lp_chars);
      for (uint8_t b : t.bytes) c.lp_chars += (b & 0xC0) != 0x80 ? 1 : 0;
      c.lp_values.push_back(jsonLogprob(lp.logprob));
      // The legacy top_logprobs: the n most likely tokens and, always, the sampled one.
      JsonWriter top;
      top.beginObject();
      std::vector<std::string> keys;
      auto add = [&](int32_t tid, float v) {
        std::string key = tid == id ? t.token : tokenText(tokenizer_, tid).token;
        if (std::find(keys.begin(), keys.end(), key) != keys.end()) return;
        top.field(key, jsonLogprob(v));
        keys.push_back(std::move(key));
      };
      for (int32_t j = 0; j < lp.num_top; ++j) add(lp.top_ids[j], lp.top_logprobs[j]);
      add(id, lp.logprob);
      top.endObject();
      c.lp_top.push_back(top.take());
      c.lp_tokens.push_back(std::move(t.token));
    }
    Result<std::string> piece = c.detok.push(id);
    // An id past even the model's vocabulary (tulip never sends one) reads as U+FFFD.
    emitText(i, piece.isOk() ? std::move(piece).value() : std::string("\xEF\xBF\xBD"));
    if (c.stop.matched()) {
      finish(i, "stop", ChoiceEnd{});
      return false;
    }
  }
  return true;
}

void CompletionsOutput::finishChoice(size_t i, const ChoiceEnd& end) {
  Choice& c = choices_[i];
  if (c.finished) return;
  emitText(i, c.detok.finish());
  if (c.stop.matched()) return finish(i, "stop", end);
  if (c.stop.active()) {
    std::string tail = c.stop.flush();
    if (!tail.empty()) appendText(i, tail);
  }
  finish(i, end.hit_length ? "length" : "stop", end);
}

void CompletionsOutput::finish(size_t i, std::string_view reason, const ChoiceEnd& end) {
  Choice& c = choices_[i];
  c.finished = true;
  c.finish_reason = reason;
  c.usage.prompt_tokens = end.prompt_tokens != 0 ? end.prompt_tokens : c.prompt_len;
  c.usage.completion_tokens = end.completion_tokens != 0 ? end.completion_tokens : c.generated;
  c.usage.cached_tokens = end.cached_prompt_tokens;
  --unfinished_;
  if (!stream_) return;
  std::string json;
  JsonWriter w(&json);
  w.beginObject();
  writeHead(w);
  w.key("choices").beginArray().beginObject().field("index", renderedIndex(i));
  w.field("text", "");
  writeLogprobs(w, c, false);
  c.lp_streamed = c.lp_tokens.size();
  w.field("finish_reason", reason);
  w.endObject().endArray();
  if (include_usage_) w.nullField("usage");
  w.endObject();
  appendSseEvent(&sse_, json);
  if (unfinished_ != 0) return;
  if (include_usage_) {
    const Usage total = totalUsage();
    json.clear();
    JsonWriter u(&json);
    u.beginObject();
    writeHead(u);
    u.key("choices").beginArray().endArray();
    writeUsage(u, total);
    u.endObject();
    appendSseEvent(&sse_, json);
  }
  sse_.append(kSseDone);
}

std::string CompletionsOutput::takeSse() {
  std::string out;
  out.swap(sse_);
  return out;
}

std::string CompletionsOutput::responseJson() const {
  JsonWriter w;
  w.beginObject();
  writeHead(w);
  w.key("choices").beginArray();
  for (size_t p = 0; p * sequences_ < choices_.size(); ++p) {
    // Candidates of prompt p, best first when best_of > n [TAG_LLM_CHOICES].
    std::vector<size_t> order(sequences_);
    for (uint32_t j = 0; j < sequences_; ++j) order[j] = p * sequences_ + j;
    if (sequences_ > n_) {
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return choices_[a].cum_logprob > choices_[b].cum_logprob;
      });
    }
    for (uint32_t r = 0; r < n_; ++r) {
      const Choice& c = choices_[order[r]];
      w.beginObject().field("index", static_cast<uint64_t>(p * n_ + r)).field("text", c.text);
      writeLogprobs(w, c, true);
      w.field("finish_reason", c.finish_reason).endObject();
    }
  }
  w.endArray();
  writeUsage(w, totalUsage());
  w.endObject();
  return w.take();
}

}  // namespace garden::ivy
