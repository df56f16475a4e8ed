#pragma once
// Parsing a Hugging Face `config.json` into a plain struct (simdjson). Covers the decoder-only
// transformer families Garden serves (Qwen3 / Qwen3-Embedding / Qwen3-Reranker, and the fields
// gpt-oss needs); unknown keys are ignored. Both the transformers 4 spelling (`rope_theta`,
// `torch_dtype`) and the 5 spelling (`rope_parameters.rope_theta`, `dtype`) are accepted.
//
// Errors name the field: INVALID_ARGUMENT "config.json: num_attention_heads: must be a positive
// integer". Defaults follow transformers' Qwen3Config where a key is absent.
//
// Threads: plain value type.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace garden {

struct ModelConfig {
  std::string model_type;                  // "qwen3", "gpt_oss", ...
  std::vector<std::string> architectures;  // e.g. "Qwen3ForCausalLM", "Qwen3Model"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::string rope_type = "default";  // rope_scaling / rope_parameters rope_type
  double rope_factor = 1.0;
  double partial_rotary_factor = 1.0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool is_causal = true;   // `is_causal` key when present (bidirectional embedding models: false)
  std::string dtype;       // "bfloat16", "float32", ... (informational)
  int64_t num_labels = 0;  // from id2label when present (classification heads)
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;  // first one when a list
  int64_t pad_token_id = -1;
  // Mixture of experts (0 when dense).
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t sliding_window = 0;
  std::vector<std::string> layer_types;  // "full_attention" / "sliding_attention"

  bool hasArchitecture(std::string_view a) const;
};

// Parses the text of a config.json. `label` prefixes error messages (usually the path).
Result<ModelConfig> parseModelConfig(std::string_view json, std::string_view label = "config.json");
// Reads DIR/config.json.
Result<ModelConfig> loadModelConfig(const std::string& dir);

}  // namespace garden
