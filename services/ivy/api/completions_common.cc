#include "services/ivy/api/completions_common.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "services/ivy/api/errors.h"
#include "services/ivy/api/json_body.h"

namespace garden::ivy {
namespace {

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
  if (n && *n != 1) return invalidField("n", "only n = 1 is supported");
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
    if (p && *p != 0) return invalidField(penalty, "is not supported (only 0)");
  }
  // Refused rather than ignored: a caller relying on them would get output that silently
  // ignores its bias or its schema.
  if (auto b = present(root, "logit_bias")) {
    simdjson::dom::object o;
    if (b->get_object().get(o) != simdjson::SUCCESS || o.size() != 0)
      return invalidField("logit_bias", "is not supported (only {} or null)");
  }
  if (auto f = present(root, "response_format")) {  // [TAG_TOKEN_MASK]
    ASSIGN_OR_RETURN(out->structured, parseResponseFormat(*f, "response_format"));
  }
  if (api == ApiKind::kChat) {
    ASSIGN_OR_RETURN(auto logprobs, boolean(root, "logprobs", "logprobs"));
    if (logprobs.value_or(false)) return invalidField("logprobs", "is not supported");
    if (present(root, "top_logprobs")) return invalidField("top_logprobs", "is not supported");
  } else {
    if (present(root, "logprobs")) return invalidField("logprobs", "is not supported");
    if (auto s = present(root, "suffix")) {
      std::string_view sv;
      if (s->get_string().get(sv) != simdjson::SUCCESS || !sv.empty())
        return invalidField("suffix", "is not supported");
    }
    ASSIGN_OR_RETURN(auto best_of, integer(root, "best_of"));
    if (best_of && *best_of != 1) return invalidField("best_of", "only 1 is supported");
  }
  return okStatus();
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
