#include "common/model_config.h"

#include <simdjson.h>

#include <algorithm>
#include <fstream>
#include <iterator>

namespace garden {

bool ModelConfig::hasArchitecture(std::string_view a) const {
  return std::find(architectures.begin(), architectures.end(), a) != architectures.end();
}

namespace {

using simdjson::dom::element;
using simdjson::dom::object;

class Reader {
 public:
  Reader(object o, std::string label) : o_(o), label_(std::move(label)) {}

  Status err(std::string_view key, std::string_view what) const {
    return invalidArgument(label_ + ": " + std::string(key) + ": " + std::string(what));
  }
  bool has(std::string_view key) const {
    element e;
    return !o_[key].get(e) && !e.is_null();
  }
  // Integer field; absent or null keeps `out`.
  Status optInt(std::string_view key, int64_t* out) const {
    element e;
    if (o_[key].get(e) || e.is_null()) return okStatus();
    int64_t v;
    if (e.get_int64().get(v)) {
      double d;  // tolerate 12.0
      if (!e.get_double().get(d) && d == static_cast<double>(static_cast<int64_t>(d))) {
        *out = static_cast<int64_t>(d);
        return okStatus();
      }
      return err(key, "must be an integer");
    }
    *out = v;
    return okStatus();
  }
  Status reqPositive(std::string_view key, int64_t* out) const {
    if (!has(key)) return err(key, "missing (required)");
    RETURN_IF_ERROR(optInt(key, out));
    if (*out <= 0) return err(key, "must be a positive integer");
    return okStatus();
  }
  Status optDouble(std::string_view key, double* out) const {
    element e;
    if (o_[key].get(e) || e.is_null()) return okStatus();
    double d;
    if (e.get_double().get(d)) return err(key, "must be a number");
    *out = d;
    return okStatus();
  }
  Status optBool(std::string_view key, bool* out) const {
    element e;
    if (o_[key].get(e) || e.is_null()) return okStatus();
    bool b;
    if (e.get_bool().get(b)) return err(key, "must be true or false");
    *out = b;
    return okStatus();
  }
  Status optString(std::string_view key, std::string* out) const {
    element e;
    if (o_[key].get(e) || e.is_null()) return okStatus();
    std::string_view s;
    if (e.get_string().get(s)) return err(key, "must be a string");
    *out = std::string(s);
    return okStatus();
  }
  Status optStringList(std::string_view key, std::vector<std::string>* out) const {
    element e;
    if (o_[key].get(e) || e.is_null()) return okStatus();
    simdjson::dom::array a;
    if (e.get_array().get(a)) return err(key, "must be an array of strings");
    out->clear();
    for (auto x : a) {
      std::string_view s;
      if (x.get_string().get(s)) return err(key, "must be an array of strings");
      out->emplace_back(s);
    }
    return okStatus();
  }
  // Integer or a list of integers (eos_token_id); takes the first.
  Status optIntOrFirst(std::string_view key, int64_t* out) const {
    element e;
    if (o_[key].get(e) || e.is_null()) return okStatus();
    simdjson::dom::array a;
    if (!e.get_array().get(a)) {
      for (auto x : a) {
        int64_t v;
        if (x.get_int64().get(v)) return err(key, "must be an integer or a list of integers");
        *out = v;
        return okStatus();
      }
      return okStatus();
    }
    return optInt(key, out);
  }
  Result<object> optObject(std::string_view key) const {
    element e;
    if (o_[key].get(e) || e.is_null()) return notFound(std::string(key));
    object o;
    if (e.get_object().get(o)) return err(key, "must be an object");
    return o;
  }

 private:
  object o_;
  std::string label_;
};

}  // namespace

Result<ModelConfig> parseModelConfig(std::string_view json, std::string_view label) {
  simdjson::dom::parser parser;
  element root;
  if (auto e = parser.parse(json.data(), json.size(), true).get(root); e) {
    return invalidArgument(std::string(label) + ": not valid JSON: " + simdjson::error_message(e));
  }
  object o;
  if (root.get_object().get(o)) return invalidArgument(std::string(label) + ": not a JSON object");
  Reader r(o, std::string(label));
  ModelConfig c;
  RETURN_IF_ERROR(r.optString("model_type", &c.model_type));
  RETURN_IF_ERROR(r.optStringList("architectures", &c.architectures));
  RETURN_IF_ERROR(r.reqPositive("hidden_size", &c.hidden_size));
  RETURN_IF_ERROR(r.reqPositive("num_hidden_layers", &c.num_hidden_layers));
  RETURN_IF_ERROR(r.reqPositive("num_attention_heads", &c.num_attention_heads));
  RETURN_IF_ERROR(r.reqPositive("vocab_size", &c.vocab_size));
  RETURN_IF_ERROR(r.optInt("intermediate_size", &c.intermediate_size));
  if (c.intermediate_size < 0) return r.err("intermediate_size", "must be >= 0");
  c.num_key_value_heads = c.num_attention_heads;
  RETURN_IF_ERROR(r.optInt("num_key_value_heads", &c.num_key_value_heads));
  if (c.num_key_value_heads <= 0) return r.err("num_key_value_heads", "must be a positive integer");
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return r.err("num_key_value_heads",
                 "must divide num_attention_heads (" + std::to_string(c.num_attention_heads) + ")");
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  RETURN_IF_ERROR(r.optInt("head_dim", &c.head_dim));
  if (c.head_dim <= 0) return r.err("head_dim", "must be a positive integer");
  c.max_position_embeddings = 32768;
  RETURN_IF_ERROR(r.optInt("max_position_embeddings", &c.max_position_embeddings));
  if (c.max_position_embeddings <= 0) return r.err("max_position_embeddings", "must be positive");
  RETURN_IF_ERROR(r.optDouble("rms_norm_eps", &c.rms_norm_eps));
  if (!(c.rms_norm_eps > 0)) return r.err("rms_norm_eps", "must be positive");
  RETURN_IF_ERROR(r.optDouble("rope_theta", &c.rope_theta));
  RETURN_IF_ERROR(r.optDouble("partial_rotary_factor", &c.partial_rotary_factor));
  for (std::string_view key : {"rope_scaling", "rope_parameters"}) {
    auto ro = r.optObject(key);
    if (!ro.isOk()) {
      if (ro.status().code() == StatusCode::kNotFound) continue;
      return ro.status();
    }
    Reader rr(*ro, std::string(label) + "." + std::string(key));
    RETURN_IF_ERROR(rr.optDouble("rope_theta", &c.rope_theta));
    RETURN_IF_ERROR(rr.optString("rope_type", &c.rope_type));
    if (rr.has("type")) RETURN_IF_ERROR(rr.optString("type", &c.rope_type));
    RETURN_IF_ERROR(rr.optDouble("factor", &c.rope_factor));
    RETURN_IF_ERROR(rr.optDouble("partial_rotary_factor", &c.partial_rotary_factor));
  }
  if (!(c.rope_theta > 0)) return r.err("rope_theta", "must be positive");
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1)) {
    return r.err("partial_rotary_factor", "must be in (0, 1]");
  }
  RETURN_IF_ERROR(r.optBool("tie_word_embeddings", &c.tie_word_embeddings));
  RETURN_IF_ERROR(r.optBool("attention_bias", &c.attention_bias));
  RETURN_IF_ERROR(r.optBool("is_causal", &c.is_causal));
  RETURN_IF_ERROR(r.optString("torch_dtype", &c.dtype));
  RETURN_IF_ERROR(r.optString("dtype", &c.dtype));
  RETURN_IF_ERROR(r.optInt("num_labels", &c.num_labels));
  if (auto id2label = r.optObject("id2label"); id2label.isOk()) {
    c.num_labels = static_cast<int64_t>(id2label->size());
  } else if (id2label.status().code() != StatusCode::kNotFound) {
    return id2label.status();
  }
  RETURN_IF_ERROR(r.optIntOrFirst("bos_token_id", &c.bos_token_id));
  RETURN_IF_ERROR(r.optIntOrFirst("eos_token_id", &c.eos_token_id));
  RETURN_IF_ERROR(r.optIntOrFirst("pad_token_id", &c.pad_token_id));
  RETURN_IF_ERROR(r.optInt("num_local_experts", &c.num_local_experts));
  RETURN_IF_ERROR(r.optInt("num_experts_per_tok", &c.num_experts_per_tok));
  RETURN_IF_ERROR(r.optInt("sliding_window", &c.sliding_window));
  RETURN_IF_ERROR(r.optStringList("layer_types", &c.layer_types));
  if (!c.layer_types.empty() && static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers) {
    return r.err("layer_types", "must have num_hidden_layers entries");
  }
  if (c.num_local_experts == 0 && c.intermediate_size <= 0) {
    return r.err("intermediate_size", "missing or not positive");
  }
  return c;
}

Result<ModelConfig> loadModelConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return notFound(path + ": cannot open");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parseModelConfig(text, path);
}

}  // namespace garden
