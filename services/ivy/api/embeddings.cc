#include "services/ivy/api/embeddings.h"

#include <simdjson.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "common/json_writer.h"
#include "services/ivy/api/errors.h"
#include "services/ivy/api/json_body.h"

namespace garden::ivy {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

static_assert(std::endian::native == std::endian::little,
              "base64 embeddings are little-endian float32; add a byte swap for big-endian hosts");

std::string indexPath(std::string_view base, size_t i) {
  std::string p(base);
  p += '[';
  p += std::to_string(i);
  p += ']';
  return p;
}

bool isInteger(const element& e) {
  auto t = e.type();
  return t == element_type::INT64 || t == element_type::UINT64;
}

// One token id at `path`, range-checked against the vocabulary.
Result<int32_t> tokenId(const element& e, const std::string& path, const ModelSpec& spec) {
  if (!isInteger(e)) {
    return invalidField(
        path, std::string("must be an integer token id, got ") + std::string(jsonTypeName(e)));
  }
  bool in_range = false;
  int64_t v = 0;
  if (e.type() == element_type::INT64) {
    v = int64_t(e);
    in_range = v >= 0 && v < int64_t(spec.vocab_size);
  }
  if (!in_range) {
    std::string shown =
        e.type() == element_type::INT64 ? std::to_string(v) : std::to_string(uint64_t(e));
    return invalidField(path, "token id " + shown + " is outside the vocabulary [0, " +
                                  std::to_string(spec.vocab_size) + ")");
  }
  return static_cast<int32_t>(v);
}

// An array of token ids (the whole `input`, or one element of an array of arrays).
Result<std::vector<int32_t>> tokenArray(simdjson::dom::array arr, const std::string& path,
                                        const ModelSpec& spec, const RequestLimits& limits,
                                        size_t* total) {
  size_t n = arr.size();
  if (n == 0) return invalidField(path, "must not be an empty array of token ids");
  RETURN_IF_ERROR(checkInputTokens(n, path, limits, spec.max_seq_len));
  *total += n;
  RETURN_IF_ERROR(checkRequestTokens(*total, "input", limits));
  std::vector<int32_t> ids;
  ids.reserve(n);
  size_t i = 0;
  for (element e : arr) {
    ASSIGN_OR_RETURN(int32_t id, tokenId(e, indexPath(path, i), spec));
    ids.push_back(id);
    ++i;
  }
  return ids;
}

Status parseInput(const element& input, const ModelSpec& spec, const EmbeddingsLimits& limits,
                  EmbeddingsRequest* req) {
  std::vector<EmbeddingInput>* out = &req->inputs;
  if (input.type() == element_type::STRING) {
    std::string_view s = input.get_string().value_unsafe();
    if (s.empty()) return invalidField("input", "must not be an empty string");
    RETURN_IF_ERROR(checkInputChars(s, "input", limits));
    out->push_back(EmbeddingInput{true, std::string(s), {}});
    return okStatus();
  }
  if (input.type() != element_type::ARRAY) {
    return invalidField("input", std::string("must be a string, an array of strings, an array "
                                             "of token ids or an array of arrays of token ids, "
                                             "got ") +
                                     std::string(jsonTypeName(input)));
  }
  simdjson::dom::array arr = input.get_array().value_unsafe();
  size_t n = arr.size();
  size_t total_tokens = 0;
  if (n == 0) return invalidField("input", "must not be an empty array");
  element first = arr.at(0).value_unsafe();
  if (isInteger(first)) {  // one sequence of token ids
    ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                     tokenArray(arr, "input", spec, limits, &total_tokens));
    out->push_back(EmbeddingInput{false, {}, std::move(ids)});
    return okStatus();
  }
  if (n > limits.max_inputs) {
    return invalidField("input", "has " + std::to_string(n) + " inputs, more than the limit of " +
                                     std::to_string(limits.max_inputs) + " (--max-inputs)");
  }
  const element_type kind = first.type();
  if (kind != element_type::STRING && kind != element_type::ARRAY) {
    return invalidField("input[0]", std::string("must be a string, a token id or an array of "
                                                "token ids, got ") +
                                        std::string(jsonTypeName(first)));
  }
  req->batched = true;
  out->reserve(n);
  size_t i = 0;
  for (element e : arr) {
    std::string path = indexPath("input", i);
    if (e.type() != kind) {
      return invalidField(path, std::string("must be ") +
                                    (kind == element_type::STRING ? "a string" : "an array") +
                                    " like input[0], got " + std::string(jsonTypeName(e)));
    }
    if (kind == element_type::STRING) {
      std::string_view s = e.get_string().value_unsafe();
      if (s.empty()) return invalidField(path, "must not be an empty string");
      RETURN_IF_ERROR(checkInputChars(s, path, limits));
      out->push_back(EmbeddingInput{true, std::string(s), {}});
    } else {
      ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenArray(e.get_array().value_unsafe(), path,
                                                            spec, limits, &total_tokens));
      out->push_back(EmbeddingInput{false, {}, std::move(ids)});
    }
    ++i;
  }
  return okStatus();
}

}  // namespace

Result<EmbeddingsRequest> parseEmbeddingsRequest(std::string_view body, const ModelSpec& spec,
                                                 const EmbeddingsLimits& limits) {
  RETURN_IF_ERROR(checkBodyTextChars(body, "input", limits));
  thread_local simdjson::dom::parser parser;
  // The parser keeps buffers sized for the largest document it has seen (about 13 bytes per
  // body byte); a thread that parsed one huge body gives them back afterwards.
  struct Shrink {
    ~Shrink() {
      if (parser.capacity() > (size_t{1} << 20)) parser = simdjson::dom::parser();
    }
  } shrink;
  ASSIGN_OR_RETURN(element root, parseJsonBody(body, parser));  // [TAG_JSON_BODY]
  simdjson::dom::object obj = root.get_object().value_unsafe();
  EmbeddingsRequest req;

  element model;
  if (obj.at_key("model").get(model)) return invalidField("model", "is required");
  if (model.type() != element_type::STRING) {
    return invalidField("model",
                        std::string("must be a string, got ") + std::string(jsonTypeName(model)));
  }
  req.model = std::string(model.get_string().value_unsafe());
  if (req.model != spec.served_name) {
    return notFound("model: The model '" + req.model + "' does not exist (this server serves '" +
                    spec.served_name + "')");
  }

  element format;
  if (!obj.at_key("encoding_format").get(format) && !format.is_null()) {
    std::string_view f;
    if (format.get(f) || (f != "float" && f != "base64")) {
      return invalidField("encoding_format", "must be \"float\" or \"base64\"");
    }
    req.encoding_format = f == "base64" ? EncodingFormat::kBase64 : EncodingFormat::kFloat;
  }

  element dims;
  if (!obj.at_key("dimensions").get(dims) && !dims.is_null()) {
    if (!isInteger(dims)) {
      return invalidField("dimensions",
                          std::string("must be an integer, got ") + std::string(jsonTypeName(dims)));
    }
    bool ok = dims.type() == element_type::INT64 && int64_t(dims) >= 1 &&
              int64_t(dims) <= int64_t(spec.hidden_size);
    if (!ok) {
      return invalidField("dimensions", "must be between 1 and the model's width " +
                                            std::to_string(spec.hidden_size));
    }
    req.dimensions = static_cast<uint32_t>(int64_t(dims));
  }

  for (std::string_view field : {"input_type", "prompt_name"}) {
    element e;
    if (obj.at_key(field).get(e) || e.is_null()) continue;
    std::string_view name;
    if (e.get(name)) {
      return invalidField(field, std::string("must be a string, got ") + std::string(jsonTypeName(e)));
    }
    if (!req.prompt_field.empty()) {
      return invalidField(field, "give only one of `input_type` and `prompt_name`");
    }
    req.prompt_name = std::string(name);
    req.prompt_field = std::string(field);
  }

  element input;
  if (obj.at_key("input").get(input)) return invalidField("input", "is required");
  RETURN_IF_ERROR(parseInput(input, spec, limits, &req));
  return req;
}

Result<std::vector<std::vector<int32_t>>> resolveTokens(const EmbeddingsRequest& request,
                                                        const TextEncoder* encoder,
                                                        const ModelSpec& spec,
                                                        const RequestLimits& limits,
                                                        std::string_view prompt) {
  std::vector<std::vector<int32_t>> out;
  out.reserve(request.inputs.size());
  size_t total = 0;
  std::string prompted;
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    const EmbeddingInput& in = request.inputs[i];
    // A lone string or token array was the whole `input`; otherwise name the element.
    std::string path = request.batched ? indexPath("input", i) : std::string("input");
    if (!in.is_text) {
      if (!prompt.empty()) {
        return invalidField(request.prompt_field.empty() ? "input" : request.prompt_field,
                            "a prompt cannot be applied to token-id inputs; send text, or put the "
                            "prompt's ids in the input yourself");
      }
      RETURN_IF_ERROR(checkInputTokens(in.ids.size(), path, limits, spec.max_seq_len));
      total += in.ids.size();
      RETURN_IF_ERROR(checkRequestTokens(total, "input", limits));
      out.push_back(in.ids);
      continue;
    }
    if (encoder == nullptr) {
      return invalidField(path,
                          "text input is not accepted: this server has no tokenizer "
                          "configured; send token ids instead");
    }
    std::string_view text = in.text;
    if (!prompt.empty()) {
      // sentence-transformers prepends the prompt to the text and tokenizes the whole.
      prompted.assign(prompt);
      prompted += in.text;
      text = prompted;
    }
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, encoder->encode(text));
    if (ids.empty()) return invalidField(path, "produced no tokens");
    RETURN_IF_ERROR(checkInputTokens(ids.size(), path, limits, spec.max_seq_len));
    total += ids.size();
    RETURN_IF_ERROR(checkRequestTokens(total, "input", limits));
    for (int32_t id : ids) {
      if (id < 0 || uint32_t(id) >= spec.vocab_size) {
        return internalError("tokenizer produced id " + std::to_string(id) +
                             " outside the model's vocabulary of " +
                             std::to_string(spec.vocab_size) + " (tokenizer/model mismatch)");
      }
    }
    out.push_back(std::move(ids));
  }
  return out;
}

std::vector<float> truncateAndNormalize(std::span<const float> values, size_t dim, size_t dims) {
  CHECK(dim > 0 && dims >= 1 && dims <= dim && values.size() % dim == 0);
  size_t rows = values.size() / dim;
  std::vector<float> out(rows * dims);
  for (size_t r = 0; r < rows; ++r) {
    const float* src = values.data() + r * dim;
    float* dst = out.data() + r * dims;
    double sum = 0;
    for (size_t j = 0; j < dims; ++j) sum += double(src[j]) * double(src[j]);
    double norm = std::sqrt(sum);
    double scale = norm > 0 ? 1.0 / norm : 0.0;
    for (size_t j = 0; j < dims; ++j) dst[j] = static_cast<float>(double(src[j]) * scale);
  }
  return out;
}

std::string renderEmbeddingsResponse(std::string_view model, std::span<const float> values,
                                     size_t dim, EncodingFormat format, uint64_t prompt_tokens) {
  CHECK(dim > 0 && values.size() % dim == 0);
  size_t rows = values.size() / dim;
  std::string out;
  // ~10 bytes per float as text, 4/3 * 4 as base64.
  out.reserve(128 + rows * (64 + dim * (format == EncodingFormat::kFloat ? 11 : 6)));
  JsonWriter w(&out);
  w.beginObject().field("object", "list").key("data").beginArray();
  std::string b64;  // reused across rows; the base64 alphabet needs no JSON escaping
  for (size_t r = 0; r < rows; ++r) {
    std::span<const float> row = values.subspan(r * dim, dim);
    w.beginObject().field("object", "embedding").field("index", r).key("embedding");
    if (format == EncodingFormat::kFloat) {
      w.floatArray(row);
    } else {
      b64.assign(1, '"');
      appendBase64(b64, row.data(), row.size_bytes());
      b64.push_back('"');
      w.raw(b64);
    }
    w.endObject();
  }
  w.endArray().field("model", model);
  w.key("usage").beginObject().field("prompt_tokens", prompt_tokens);
  w.field("total_tokens", prompt_tokens).endObject();
  w.endObject();
  return out;
}

std::string renderModelsResponse(const ModelSpec& spec) {
  JsonWriter w;
  w.beginObject().field("object", "list").key("data").beginArray();
  w.beginObject().field("id", spec.served_name).field("object", "model");
  w.field("created", spec.created).field("owned_by", "garden").endObject();
  w.endArray().endObject();
  return w.take();
}

}  // namespace garden::ivy
