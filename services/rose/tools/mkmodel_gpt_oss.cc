#include "services/rose/tools/mkmodel_gpt_oss.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/safetensors.h"
#include "services/rose/tools/mkmodel_common.h"

namespace garden::rose {
namespace {

namespace fs = std::filesystem;

using mkmodel::numel;
using mkmodel::Prng;
using mkmodel::writeFile;

}  // namespace

Status makeGptOssModel(const MkGptOssOptions& o) {
  if (o.out_dir.empty()) return invalidArgument("--out is required");
  auto positive = [](int64_t v) { return v > 0 && v <= (1 << 20); };
  if (!positive(o.vocab_size) || !positive(o.hidden_size) || !positive(o.num_layers) ||
      !positive(o.num_heads) || !positive(o.num_kv_heads) || !positive(o.head_dim) ||
      !positive(o.intermediate_size) || !positive(o.num_experts) ||
      !positive(o.experts_per_token) || !positive(o.sliding_window) || !positive(o.max_position)) {
    return invalidArgument("gpt-oss sizes must be positive");
  }
  if (o.vocab_size <= 200012) {
    return invalidArgument(
        "vocab_size must exceed 200012 (the Harmony special ids, e.g. <|call|>)");
  }
  if (o.hidden_size % 32 != 0 || o.intermediate_size % 32 != 0) {
    return invalidArgument("hidden_size and intermediate_size must be multiples of 32 (MXFP4)");
  }
  if (o.num_heads % o.num_kv_heads != 0)
    return invalidArgument("num_heads must be a multiple of num_kv_heads");
  if (o.head_dim % 2 != 0) return invalidArgument("head_dim must be even (RoPE)");
  if (o.experts_per_token > o.num_experts)
    return invalidArgument("experts_per_token must be <= num_experts");
  if (o.max_position < 4096) {
    return invalidArgument("max_position must be >= 4096 (YaRN's original context)");
  }
  std::error_code ec;
  if (!o.tokenizer_json.empty() && !fs::is_regular_file(o.tokenizer_json, ec)) {
    return notFound("--tokenizer-json " + o.tokenizer_json + ": no such file");
  }
  fs::create_directories(o.out_dir, ec);
  if (ec) return internalError("cannot create " + o.out_dir + ": " + ec.message());

  const int64_t h = o.hidden_size, d = o.head_dim, hq = o.num_heads, hkv = o.num_kv_heads,
                inter = o.intermediate_size, e = o.num_experts, v = o.vocab_size;
  Prng rng(0x6770742d6f737300ULL ^ o.seed);  // "gpt-oss"
  std::vector<TensorToWrite> ts;
  auto bf16 = [&](std::string name, std::vector<int64_t> shape, float scale, float offset) {
    std::vector<std::byte> bytes = mkmodel::randomWeights(rng, numel(shape), scale, offset, true);
    ts.push_back({std::move(name), DType::kBF16, std::move(shape), std::move(bytes)});
  };
  // MXFP4 weight [E, out, in]: random E2M1 codes, E8M0 scales around 2^k with k chosen so the
  // dequantized weights have std ~ 1/sqrt(in) (a uniform code has rms ~2.93).
  auto mxfp4 = [&](const std::string& prefix, int64_t out, int64_t in) {
    const int64_t groups = in / 32;
    std::vector<std::byte> blocks(numel({e, out, groups, 16}));
    for (auto& b : blocks) b = static_cast<std::byte>(rng.next() >> 56);
    const int base =
        127 + static_cast<int>(std::lround(std::log2(1.0 / (std::sqrt(double(in)) * 2.93))));
    std::vector<std::byte> scales(numel({e, out, groups}));
    for (auto& s : scales) s = static_cast<std::byte>(base - 1 + static_cast<int>(rng.next() % 3));
    ts.push_back({prefix + "_blocks", DType::kU8, {e, out, groups, 16}, std::move(blocks)});
    ts.push_back({prefix + "_scales", DType::kU8, {e, out, groups}, std::move(scales)});
  };
  auto lin = [](int64_t fan_in) { return 1.7320508f / std::sqrt(static_cast<float>(fan_in)); };

  bf16("model.embed_tokens.weight", {v, h}, 1.0f, 0.f);
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    bf16(p + "input_layernorm.weight", {h}, 0.1f, 1.f);
    bf16(p + "self_attn.q_proj.weight", {hq * d, h}, lin(h), 0.f);
    bf16(p + "self_attn.q_proj.bias", {hq * d}, 0.05f, 0.f);
    bf16(p + "self_attn.k_proj.weight", {hkv * d, h}, lin(h), 0.f);
    bf16(p + "self_attn.k_proj.bias", {hkv * d}, 0.05f, 0.f);
    bf16(p + "self_attn.v_proj.weight", {hkv * d, h}, lin(h), 0.f);
    bf16(p + "self_attn.v_proj.bias", {hkv * d}, 0.05f, 0.f);
    bf16(p + "self_attn.o_proj.weight", {h, hq * d}, lin(hq * d), 0.f);
    bf16(p + "self_attn.o_proj.bias", {h}, 0.05f, 0.f);
    bf16(p + "self_attn.sinks", {hq}, 1.0f, 0.f);
    bf16(p + "post_attention_layernorm.weight", {h}, 0.1f, 1.f);
    bf16(p + "mlp.router.weight", {e, h}, lin(h), 0.f);
    bf16(p + "mlp.router.bias", {e}, 0.1f, 0.f);
    mxfp4(p + "mlp.experts.gate_up_proj", 2 * inter, h);
    bf16(p + "mlp.experts.gate_up_proj_bias", {e, 2 * inter}, 0.05f, 0.f);
    mxfp4(p + "mlp.experts.down_proj", h, inter);
    bf16(p + "mlp.experts.down_proj_bias", {e, h}, 0.05f, 0.f);
  }
  bf16("model.norm.weight", {h}, 0.1f, 1.f);
  bf16("lm_head.weight", {v, h}, lin(h), 0.f);
  RETURN_IF_ERROR(writeSafetensors((fs::path(o.out_dir) / "model.safetensors").string(), ts,
                                   {{"format", "pt"}}));

  std::ostringstream cfg;
  cfg << "{\n"
      << "  \"architectures\": [\"GptOssForCausalLM\"],\n"
      << "  \"model_type\": \"gpt_oss\",\n"
      << "  \"attention_bias\": true,\n"
      << "  \"attention_dropout\": 0.0,\n"
      << "  \"eos_token_id\": 200002,\n"
      << "  \"pad_token_id\": 199999,\n"
      << "  \"head_dim\": " << d << ",\n"
      << "  \"hidden_act\": \"silu\",\n"
      << "  \"hidden_size\": " << h << ",\n"
      << "  \"initial_context_length\": 4096,\n"
      << "  \"initializer_range\": 0.02,\n"
      << "  \"intermediate_size\": " << inter << ",\n"
      << "  \"layer_types\": [";
  for (int64_t l = 0; l < o.num_layers; ++l) {
    cfg << (l ? ", " : "") << (l % 2 == 0 ? "\"sliding_attention\"" : "\"full_attention\"");
  }
  cfg << "],\n"
      << "  \"max_position_embeddings\": " << o.max_position << ",\n"
      << "  \"num_attention_heads\": " << hq << ",\n"
      << "  \"num_experts_per_tok\": " << o.experts_per_token << ",\n"
      << "  \"experts_per_token\": " << o.experts_per_token << ",\n"
      << "  \"num_hidden_layers\": " << o.num_layers << ",\n"
      << "  \"num_key_value_heads\": " << hkv << ",\n"
      << "  \"num_local_experts\": " << e << ",\n"
      << "  \"output_router_logits\": false,\n"
      << "  \"quantization_config\": {\"modules_to_not_convert\": [\"model.layers.*.self_attn\", "
         "\"model.layers.*.mlp.router\", \"model.embed_tokens\", \"lm_head\"], "
         "\"quant_method\": \"mxfp4\"},\n"
      << "  \"rms_norm_eps\": 1e-05,\n"
      << "  \"rope_scaling\": {\"beta_fast\": 32.0, \"beta_slow\": 1.0, \"factor\": 32.0, "
         "\"original_max_position_embeddings\": 4096, \"rope_type\": \"yarn\", "
         "\"truncate\": false},\n"
      << "  \"rope_theta\": 150000,\n"
      << "  \"router_aux_loss_coef\": 0.9,\n"
      << "  \"sliding_window\": " << o.sliding_window << ",\n"
      << "  \"swiglu_limit\": 7.0,\n"
      << "  \"tie_word_embeddings\": false,\n"
      << "  \"torch_dtype\": \"bfloat16\",\n"
      << "  \"use_cache\": true,\n"
      << "  \"vocab_size\": " << v << ",\n"
      << "  \"garden_tiny_model\": \"random weights (seed " << o.seed
      << "): the outputs are meaningless\"\n"
      << "}\n";
  RETURN_IF_ERROR(writeFile(fs::path(o.out_dir) / "config.json", cfg.str()));
  RETURN_IF_ERROR(writeFile(fs::path(o.out_dir) / "generation_config.json",
                            "{\n"
                            "  \"bos_token_id\": 199998,\n"
                            "  \"do_sample\": true,\n"
                            "  \"eos_token_id\": [\n    200002,\n    199999,\n    200012\n  ],\n"
                            "  \"pad_token_id\": 199999\n"
                            "}\n"));
  if (!o.tokenizer_json.empty()) {
    fs::copy_file(o.tokenizer_json, fs::path(o.out_dir) / "tokenizer.json",
                  fs::copy_options::overwrite_existing, ec);
    if (ec) return internalError("cannot copy " + o.tokenizer_json + ": " + ec.message());
  }
  return okStatus();
}

}  // namespace garden::rose
