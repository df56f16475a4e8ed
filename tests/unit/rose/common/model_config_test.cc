// common/model_config: real config.json shapes (transformers 4 and 5 spellings), defaults, and
// errors that name the field.

#include "common/model_config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace garden {
namespace {

// Qwen3-Embedding-0.6B's config.json (transformers 4.51 spelling).
constexpr const char* kQwen3Embedding = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 32768,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.3",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151669
})";

TEST(ModelConfig, ParsesQwen3Embedding) {
  auto c = parseModelConfig(kQwen3Embedding);
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->model_type, "qwen3");
  EXPECT_TRUE(c->hasArchitecture("Qwen3ForCausalLM"));
  EXPECT_FALSE(c->hasArchitecture("Qwen3Model"));
  EXPECT_EQ(c->hidden_size, 1024);
  EXPECT_EQ(c->intermediate_size, 3072);
  EXPECT_EQ(c->num_hidden_layers, 28);
  EXPECT_EQ(c->num_attention_heads, 16);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->vocab_size, 151669);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);  // an integer in the JSON
  EXPECT_EQ(c->rope_type, "default");
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_TRUE(c->is_causal);
  EXPECT_EQ(c->dtype, "bfloat16");
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_EQ(c->eos_token_id, 151643);
  EXPECT_EQ(c->num_labels, 0);
}

TEST(ModelConfig, TransformersFiveSpelling) {
  auto c = parseModelConfig(R"({
    "architectures": ["Qwen3ForSequenceClassification"], "model_type": "qwen3",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
    "dtype": "float32", "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}, "eos_token_id": [7, 8],
    "bos_token_id": null, "pad_token_id": null, "is_causal": false,
    "layer_types": ["full_attention", "full_attention"]})");
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->dtype, "float32");
  EXPECT_EQ(c->num_labels, 1);
  EXPECT_EQ(c->eos_token_id, 7);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_FALSE(c->is_causal);
  EXPECT_EQ(c->layer_types.size(), 2u);
  EXPECT_EQ(c->max_position_embeddings, 32768);  // Qwen3Config default when absent
}

TEST(ModelConfig, Defaults) {
  auto c = parseModelConfig(
      R"({"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
          "intermediate_size": 8})");
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
}

TEST(ModelConfig, ErrorsNameTheField) {
  const std::string base =
      R"("hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10, "intermediate_size": 8)";
  struct Case {
    std::string json;
    const char* field;
  };
  for (
      const Case& c : std::vector<Case>{
          {"not json", "not valid JSON"},
          {"[1]", "not a JSON object"},
          {R"({"num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10})",
           "hidden_size"},
          {R"({"hidden_size": 0, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10})",
           "hidden_size"},
          {R"({"hidden_size": "64", "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10})",
           "hidden_size"},
          {"{" + base + R"(, "num_key_value_heads": 3})", "num_key_value_heads"},
          {"{" + base + R"(, "head_dim": -1})", "head_dim"},
          {"{" + base + R"(, "rms_norm_eps": "x"})", "rms_norm_eps"},
          {"{" + base + R"(, "rope_theta": 0})", "rope_theta"},
          {"{" + base + R"(, "tie_word_embeddings": 1})", "tie_word_embeddings"},
          {"{" + base + R"(, "rope_parameters": 5})", "rope_parameters"},
          {"{" + base + R"(, "layer_types": ["full_attention", "full_attention"]})", "layer_types"},
          {"{" + base + R"(, "architectures": "Qwen3"})", "architectures"},
          {R"({"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10})",
           "intermediate_size"},
      }) {
    auto r = parseModelConfig(c.json, "cfg.json");
    ASSERT_FALSE(r.isOk()) << c.json;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(r.status().message().find(c.field), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().rfind("cfg.json", 0), 0u) << r.status().message();
  }
}

TEST(ModelConfig, LoadFromDirectory) {
  const char* src = std::getenv("GARDEN_SOURCE_DIR");
  auto c = loadModelConfig(std::string(src ? src : ".") + "/tests/conformance/qwen3/fixtures");
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(loadModelConfig("/nonexistent").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace garden
