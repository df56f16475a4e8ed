#pragma once
// POST /v1/embeddings, following the OpenAI API: request parsing and validation into a plain
// struct, token resolution (text → ids through a TextEncoder, token arrays pass through), and
// response rendering. Pure functions with no server or network dependency; callable from any
// thread (parsing uses a thread-local simdjson parser).
//
// Request: {"model": str (required, must equal ModelSpec::served_name, else 404 model_not_found),
//           "input": str | [str] | [int] | [[int]],
//           "encoding_format": "float" | "base64" (default float),
//           "dimensions": int in [1, hidden_size] (truncate then L2-renormalize),
//           "input_type": "query" | "document" | another prompt name (see api/prompts.h),
//           "prompt_name": a prompt name (sentence-transformers' name for the same; give one of
//                          the two), "user": ignored}. Unknown fields are ignored.
// Limits (api/limits.h): input count and characters per text input while parsing, before any
// tokenization; tokens per input and per request as inputs are tokenized.
// Every rejection is a Status following [TAG_FIELD_ERRORS] (the message starts with the field's
// path), so api/errors.h turns it into a 400 naming the field.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "services/ivy/api/limits.h"
#include "services/ivy/api/model_spec.h"
#include "services/ivy/api/text_encoder.h"

namespace garden::ivy {

enum class EncodingFormat { kFloat, kBase64 };

struct EmbeddingInput {
  bool is_text = false;
  std::string text;          // is_text
  std::vector<int32_t> ids;  // !is_text
};

struct EmbeddingsRequest {
  std::string model;
  std::vector<EmbeddingInput> inputs;  // never empty after a successful parse
  bool batched = false;  // `input` was an array of strings or of arrays (errors name input[i])
  EncodingFormat encoding_format = EncodingFormat::kFloat;
  uint32_t dimensions = 0;  // 0 = the model's full width
  std::string prompt_name;   // "" = none named (a configured default may still apply)
  std::string prompt_field;  // the field that named it: "input_type" or "prompt_name"
};

// Parses and validates `body` against `spec`: JSON syntax, types, empty inputs, model name,
// dimensions range, and for token-id inputs the vocabulary range and max_seq_len.
Result<EmbeddingsRequest> parseEmbeddingsRequest(std::string_view body, const ModelSpec& spec,
                                                 const EmbeddingsLimits& limits = {});

// Token ids for every input, in order: text inputs are encoded with `encoder` (nullptr: text is
// rejected with 400 because no tokenizer is configured), `prompt` (a prompt prefix, see
// api/prompts.h) prepended to the text; each result is checked against the per-input token limit
// (400 naming "input[i]") and the vocabulary, and must not be empty; the running total against
// --max-request-tokens (stops tokenizing at the first input over it). A non-empty `prompt` with
// token-id inputs is a 400 naming `request.prompt_field` (a prompt cannot be applied to ids).
Result<std::vector<std::vector<int32_t>>> resolveTokens(const EmbeddingsRequest& request,
                                                        const TextEncoder* encoder,
                                                        const ModelSpec& spec,
                                                        const RequestLimits& limits = {},
                                                        std::string_view prompt = {});

// Truncates each `dim`-wide row of `values` (rows × dim floats) to `dims` and L2-renormalizes it
// (a zero row stays zero). Returns rows × dims floats. dims must be in [1, dim].
std::vector<float> truncateAndNormalize(std::span<const float> values, size_t dim, size_t dims);

// The OpenAI response: {"object":"list","data":[{"object":"embedding","index":i,"embedding":...}],
// "model":...,"usage":{"prompt_tokens":n,"total_tokens":n}}. `values` holds rows × dim floats
// (already truncated); base64 is the little-endian float32 bytes of each row.
std::string renderEmbeddingsResponse(std::string_view model, std::span<const float> values,
                                     size_t dim, EncodingFormat format, uint64_t prompt_tokens);

// GET /v1/models: {"object":"list","data":[{"id":...,"object":"model","created":...,
// "owned_by":"garden"}]}.
std::string renderModelsResponse(const ModelSpec& spec);

}  // namespace garden::ivy
