#include "services/ivy/api/completions_common.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "services/ivy/api/errors.h"
#include "services/ivy/api/json_body.h"

namespace garden::ivy {
namespace {

constexpr int64_t kMaxChoices = 16;  // n and best_of (tulip's kMaxChoices)

using simdjson::dom::element;
using simdjson::dom::element_type;

constexpr size_t kMaxStopStrings = 16;
constexpr uint32_t kDefaultMaxTokensUnknownContext = 4096;

// The value of `key`, absent when missing or null.
std::optional<element> present(const element& root, std::string_view key) {
  element v;
  if (root[key].get(v) != simdjson::SUCCESS) return std::nullopt;
  if (v.type() == element_type::NULL_VALUE) return std::nullopt;
  return v;
}

Result<std::optional<double>> number(const element& root, std::string_view key) {
  auto v = present(root, key);
  if (!v) return std::optional<double>();
  double d;
  if (v->get_double().get(d) != simdjson::SUCCESS) return invalidField(key, "must be a number");
  return std::optional<double>(d);
}

Result<std::optional<int64_t>> integer(const element& root, std::string_view key) {
  auto v = present(root, key);
  if (!v) return std::optional<int64_t>();
  int64_t i;
  if (v->get_int64().get(i) != simdjson::SUCCESS) {
    uint64_t u;
    if (v->get_uint64().get(u) == simdjson::SUCCESS) return invalidField(key, "is too large");
    return invalidField(key, "must be an integer");
  }
  return std::optional<int64_t>(i);
}

Result<std::optional<bool>> boolean(const element& root, std::string_view key,
                                    std::string_view path) {
  auto v = present(root, key);
  if (!v) return std::optional<bool>();
  bool b;
  if (v->get_bool().get(b) != simdjson::SUCCESS) return invalidField(path, "must be a boolean");
  return std::optional<bool>(b);
}

Status parseStop(const element& root, std::vector<std::string>* out) {
  auto v = present(root, "stop");
  if (!v) return okStatus();
  std::string_view s;
  if (v->get_string().get(s) == simdjson::SUCCESS) {
    if (s.empty()) return invalidField("stop", "must not be an empty string");
    out->emplace_back(s);
    return okStatus();
  }
  simdjson::dom::array arr;
  if (v->get_array().get(arr) != simdjson::SUCCESS)
    return invalidField("stop", "must be a string or an array of strings");
  if (arr.size() > kMaxStopStrings)
    return invalidField("stop", "has more than " + std::to_string(kMaxStopStrings) + " strings");
  size_t i = 0;
  for (element e : arr) {
    std::string path = "stop[" + std::to_string(i++) + "]";
    if (e.get_string().get(s) != simdjson::SUCCESS) return invalidField(path, "must be a string");
    if (s.empty()) return invalidField(path, "must not be empty");
    out->emplace_back(s);
  }
  return okStatus();
}

// `model`, when present, names the served model.
Status checkServedModel(const element& root, const ModelSpec& spec) {
  if (auto m = present(root, "model")) {
    std::string_view name;
    if (m->get_string().get(name) != simdjson::SUCCESS)
      return invalidField("model", "must be a string");
    if (name != spec.served_name) {
      return notFound("model: '" + std::string(name) + "' does not exist (serving '" +
                      spec.served_name + "')");
    }
  }
  return okStatus();
}

}  // namespace

Status parseSamplingFields(const element& root, ApiKind api, SamplingRequest* out) {
  ASSIGN_OR_RETURN(auto max_tokens, integer(root, "max_tokens"));
  ASSIGN_OR_RETURN(auto max_completion, integer(root, "max_completion_tokens"));
  if (max_tokens && (*max_tokens < 1 || *max_tokens > UINT32_MAX))
    return invalidField("max_tokens", "must be an integer >= 1");
  if (max_completion && (*max_completion < 1 || *max_completion > UINT32_MAX))
    return invalidField("max_completion_tokens", "must be an integer >= 1");
  if (max_completion) {
    out->max_tokens = static_cast<uint32_t>(*max_completion);
  } else if (max_tokens) {
    out->max_tokens = static_cast<uint32_t>(*max_tokens);
  }

  ASSIGN_OR_RETURN(auto temperature, number(root, "temperature"));
  if (temperature) {
    if (!(*temperature >= 0 && *temperature <= 2))
      return invalidField("temperature", "must be in [0, 2]");
    out->temperature = static_cast<float>(*temperature);
  }
  ASSIGN_OR_RETURN(auto top_p, number(root, "top_p"));
  if (top_p) {
    if (!(*top_p > 0 && *top_p <= 1)) return invalidField("top_p", "must be in (0, 1]");
    out->top_p = static_cast<float>(*top_p);
  }
  ASSIGN_OR_RETURN(auto top_k, integer(root, "top_k"));
  if (top_k) {
    if (*top_k < -1 || *top_k > INT32_MAX)
      return invalidField("top_k", "must be -1, 0 (both: off) or a positive integer");
    out->top_k = *top_k == -1 ? 0 : static_cast<int32_t>(*top_k);
  }
  ASSIGN_OR_RETURN(auto seed, integer(root, "seed"));
  if (seed) {
    out->has_seed = true;
    out->seed = static_cast<uint64_t>(*seed);
  }
  RETURN_IF_ERROR(parseStop(root, &out->stop));
  ASSIGN_OR_RETURN(auto n, integer(root, "n"));
  if (n && (*n < 1 || *n > kMaxChoices))
    return invalidField("n", "must be an integer in [1, " + std::to_string(kMaxChoices) + "]");
  out->n = n ? static_cast<uint32_t>(*n) : 1;
  out->best_of = out->n;
  ASSIGN_OR_RETURN(auto stream, boolean(root, "stream", "stream"));
  out->stream = stream.value_or(false);
  if (auto so = present(root, "stream_options")) {
    if (so->type() != element_type::OBJECT)
      return invalidField("stream_options", "must be an object");
    ASSIGN_OR_RETURN(auto usage, boolean(*so, "include_usage", "stream_options.include_usage"));
    out->include_usage = usage.value_or(false);
  }
  ASSIGN_OR_RETURN(auto ignore_eos, boolean(root, "ignore_eos", "ignore_eos"));
  out->ignore_eos = ignore_eos.value_or(false);
  if (auto u = present(root, "user"); u && u->type() != element_type::STRING)
    return invalidField("user", "must be a string");

  for (std::string_view penalty : {"presence_penalty", "frequency_penalty"}) {
    ASSIGN_OR_RETURN(auto p, number(root, penalty));
    if (p && !(*p >= -2 && *p <= 2)) return invalidField(penalty, "must be in [-2, 2]");
    if (p) {
      (penalty == "presence_penalty" ? out->presence_penalty : out->frequency_penalty) =
          static_cast<float>(*p);
    }
  }
  ASSIGN_OR_RETURN(auto rep, number(root, "repetition_penalty"));
  if (rep) {
    if (!(*rep > 0 && *rep <= 1e6)) return invalidField("repetition_penalty", "must be > 0");
    out->repetition_penalty = static_cast<float>(*rep);
  }
  ASSIGN_OR_RETURN(auto min_p, number(root, "min_p"));
  if (min_p) {
    if (!(*min_p >= 0 && *min_p <= 1)) return invalidField("min_p", "must be in [0, 1]");
    out->min_p = static_cast<float>(*min_p);
  }
  if (auto b = present(root, "logit_bias")) {
    simdjson::dom::object o;
    if (b->get_object().get(o) != simdjson::SUCCESS)
      return invalidField("logit_bias", "must be an object mapping token ids to biases");
    if (o.size() > static_cast<size_t>(llm::kMaxLogitBias)) {
      return invalidField("logit_bias", "has more than " + std::to_string(llm::kMaxLogitBias) +
                                            " entries");
    }
    for (auto [k, v] : o) {
      int64_t id = -1;
      bool digits = !k.empty() && k.size() <= 10;
      for (char ch : k) digits = digits && ch >= '0' && ch <= '9';
      if (digits) id = std::stoll(std::string(k));
      if (!digits || id > INT32_MAX) {
        return invalidField("logit_bias", "key '" + std::string(k) +
                                              "' is not a token id (a non-negative integer)");
      }
      double bias;
      if (v.get_double().get(bias) != simdjson::SUCCESS || !(bias >= -100 && bias <= 100))
        return invalidField("logit_bias", "the bias of token " + std::string(k) +
                                              " must be a number in [-100, 100]");
      for (const auto& [seen, _] : out->logit_bias) {
        if (seen == id) return invalidField("logit_bias", "token " + std::string(k) + " appears twice");
      }
      out->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
    }
  }
  if (auto f = present(root, "response_format")) {  // [TAG_TOKEN_MASK]
    ASSIGN_OR_RETURN(out->structured, parseResponseFormat(*f, "response_format"));
  }
  if (api == ApiKind::kChat) {
    ASSIGN_OR_RETURN(auto logprobs, boolean(root, "logprobs", "logprobs"));
    out->logprobs = logprobs.value_or(false);
    ASSIGN_OR_RETURN(auto top, integer(root, "top_logprobs"));
    if (top) {
      if (*top < 0 || *top > llm::kMaxTopLogprobs)
        return invalidField("top_logprobs", "must be an integer in [0, 20]");
      if (!out->logprobs && *top > 0)
        return invalidField("top_logprobs", "needs logprobs: true");
      out->top_logprobs = static_cast<uint32_t>(*top);
    }
  } else {
    ASSIGN_OR_RETURN(auto logprobs, integer(root, "logprobs"));
    if (logprobs) {
      if (*logprobs < 0 || *logprobs > 5) return invalidField("logprobs", "must be an integer in [0, 5]");
      out->logprobs = true;
      out->top_logprobs = static_cast<uint32_t>(*logprobs);
    }
    if (auto s = present(root, "suffix")) {
      std::string_view sv;
      if (s->get_string().get(sv) != simdjson::SUCCESS || !sv.empty())
        return invalidField("suffix", "is not supported");
    }
    ASSIGN_OR_RETURN(auto best_of, integer(root, "best_of"));
    if (best_of) {
      if (*best_of < 1 || *best_of > kMaxChoices)
        return invalidField("best_of",
                            "must be an integer in [1, " + std::to_string(kMaxChoices) + "]");
      if (*best_of < out->n)
        return invalidField("best_of", "must be >= n (" + std::to_string(out->n) + ")");
      out->best_of = static_cast<uint32_t>(*best_of);
      // OpenAI and vLLM: the best can only be told once every candidate has finished.
      if (out->best_of > out->n && out->stream)
        return invalidField("best_of", "cannot be greater than n when streaming");
    }
  }
  return okStatus();
}

Status checkChoiceTokens(const SamplingRequest& sampling, uint64_t tokens, uint64_t limit) {
  if (sampling.sequences() <= 1 || limit == 0 || tokens <= limit) return okStatus();
  const bool by_best_of = sampling.best_of > sampling.n;
  return invalidField(by_best_of ? "best_of" : "n",
                      std::to_string(sampling.sequences()) +
                          " sequences per prompt need " + std::to_string(tokens) +
                          " tokens (prompt + " + (by_best_of ? "best_of" : "n") +
                          " x max_tokens), more than the limit of " + std::to_string(limit) +
                          " tokens in flight (--max-inflight-tokens); lower " +
                          (by_best_of ? "best_of" : "n") + " or max_tokens");
}

Status checkLogitBias(const SamplingRequest& sampling, uint32_t vocab) {
  if (vocab == 0) return okStatus();
  for (const auto& [id, bias] : sampling.logit_bias) {
    if (id < 0 || static_cast<uint32_t>(id) >= vocab) {
      return invalidField("logit_bias", "token id " + std::to_string(id) +
                                            " is outside the vocabulary [0, " +
                                            std::to_string(vocab) + ")");
    }
  }
  return okStatus();
}

TokenText tokenText(const Tokenizer& tokenizer, int32_t id) {
  TokenText t;
  Tokenizer::DecodeState st;
  std::string text;
  if (!tokenizer.decodeStep(id, /*skip_special=*/false, &st, &text)) return t;
  text += st.pending;  // the token's bytes, whole characters or not
  t.bytes.assign(text.begin(), text.end());
  if (st.pending.empty()) {
    t.token = std::move(text);
  } else {
    static constexpr char kHex[] = "0123456789abcdef";
    t.token = "bytes:";
    for (uint8_t b : t.bytes) {
      t.token += "\\x";
      t.token += kHex[b >> 4];
      t.token += kHex[b & 15];
    }
  }
  return t;
}

float jsonLogprob(float lp) { return std::isnan(lp) || lp < -9999.f ? -9999.f : lp; }

namespace {
void writeTokenFields(JsonWriter& w, const TokenText& t, float lp) {
  w.field("token", t.token).field("logprob", jsonLogprob(lp));
  w.key("bytes").beginArray();
  for (uint8_t b : t.bytes) w.value(static_cast<uint64_t>(b));
  w.endArray();
}
}  // namespace

std::string chatLogprobEntry(const Tokenizer& tokenizer, int32_t id,
                             const llm::LlmTokenLogprobs& lp) {
  JsonWriter w;
  w.beginObject();
  writeTokenFields(w, tokenText(tokenizer, id), lp.logprob);
  w.key("top_logprobs").beginArray();
  for (int32_t j = 0; j < lp.num_top; ++j) {
    w.beginObject();
    writeTokenFields(w, tokenText(tokenizer, lp.top_ids[j]), lp.top_logprobs[j]);
    w.endObject();
  }
  w.endArray().endObject();
  return w.take();
}

Result<element> parseGenerativeRequestBody(std::string_view body, const ModelSpec& spec,
                                           std::string_view text_field,
                                           const RequestLimits& limits,
                                           simdjson::dom::parser& parser) {
  RETURN_IF_ERROR(checkBodyTextChars(body, text_field, limits));
  ASSIGN_OR_RETURN(element root, parseJsonBody(body, parser));  // [TAG_JSON_BODY]
  RETURN_IF_ERROR(checkServedModel(root, spec));
  return root;
}

Result<uint32_t> resolveMaxTokens(const SamplingRequest& sampling, size_t prompt_len,
                                  uint32_t max_seq_len, uint32_t default_tokens,
                                  std::string_view prompt_field) {
  if (max_seq_len == 0) {
    if (sampling.max_tokens) return *sampling.max_tokens;
    return default_tokens != 0 ? default_tokens : kDefaultMaxTokensUnknownContext;
  }
  if (prompt_len >= max_seq_len) {
    return invalidField(prompt_field, "the prompt has " + std::to_string(prompt_len) +
                                          " tokens; this model's context is " +
                                          std::to_string(max_seq_len) +
                                          " tokens, leaving none to generate");
  }
  const uint64_t left = max_seq_len - prompt_len;
  if (sampling.max_tokens) {
    if (*sampling.max_tokens > left) {
      return invalidField("max_tokens", std::to_string(*sampling.max_tokens) +
                                            " tokens requested, but the prompt (" +
                                            std::to_string(prompt_len) + " tokens) leaves " +
                                            std::to_string(left) + " of the model's " +
                                            std::to_string(max_seq_len) + "-token context");
    }
    return *sampling.max_tokens;
  }
  if (default_tokens == 0) return static_cast<uint32_t>(left);
  return static_cast<uint32_t>(std::min<uint64_t>(default_tokens, left));
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

std::string StopStringMatcher::push(std::string_view text, bool* matched) {
  *matched = false;
  if (matched_) {
    *matched = true;
    return {};
  }
  if (stops_.empty()) return std::string(text);
  held_.append(text);
  size_t best = std::string::npos;
  for (const std::string& s : stops_) best = std::min(best, held_.find(s));
  if (best != std::string::npos) {
    matched_ = true;
    *matched = true;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold back the longest tail of held_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    size_t max_k = std::min(s.size() - 1, held_.size());
    for (size_t k = max_k; k > keep; --k) {
      if (std::string_view(held_).substr(held_.size() - k) == std::string_view(s).substr(0, k)) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

void appendSseEvent(std::string* out, std::string_view json) {
  out->append("data: ");
  out->append(json);
  out->append("\n\n");
}

std::string randomId(std::string_view prefix) {
  static constexpr char kAlnum[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id.push_back(kAlnum[rng() % 62]);
  return id;
}

void writeUsage(JsonWriter& w, const Usage& u) {
  w.key("usage").beginObject();
  w.field("prompt_tokens", u.prompt_tokens);
  w.field("completion_tokens", u.completion_tokens);
  w.field("total_tokens", u.prompt_tokens + u.completion_tokens);
  w.key("prompt_tokens_details").beginObject().field("cached_tokens", u.cached_tokens).endObject();
  w.endObject();
}

Status checkPromptTokens(size_t tokens, const std::string& path, const RequestLimits& limits,
                         const ModelSpec& spec) {
  if (limits.max_input_tokens != 0 && limits.max_input_tokens < spec.max_seq_len) {
    RETURN_IF_ERROR(checkInputTokens(tokens, path, limits, spec.max_seq_len));
  }
  return okStatus();
}

std::string sseErrorEvents(const Status& status) {
  std::string out;
  appendSseEvent(&out, renderErrorBody(toHttpError(status)));
  out.append(kSseDone);
  return out;
}

std::string GenerationOutput::sseError(const Status& status) { return sseErrorEvents(status); }

}  // namespace garden::ivy
