#pragma once
// A tiny gpt-oss checkpoint with deterministic random weights, in the layout the published
// gpt-oss-20b / -120b repositories use (the project's gpt-oss specification, gpt-oss.md §2.1,
// §2.4, §2.5), so rose's LLM path, tulip and ivy can run end to end on a CPU without a download.
// Its outputs are
// meaningless; its vocabulary is the REAL o200k_harmony size (201088), so the real gpt-oss
// tokenizer.json and the Harmony special ids (<|return|> 200002, <|call|> 200012, ...) work.
//
// Output directory:
//   config.json             GptOssForCausalLM, model_type gpt_oss, alternating sliding/full
//                           layer_types, YaRN rope_scaling as published (factor 32, beta 32/1,
//                           original 4096, truncate false), quantization_config mxfp4
//   generation_config.json  the published eos ids [200002, 199999, 200012], bos 199998, pad 199999
//   model.safetensors       HF names; attention, router, norms, embeddings and biases bf16;
//                           experts MXFP4 (`*_blocks` uint8 [E, out, in/32, 16], `*_scales` uint8
//                           E8M0 [E, out, in/32])
//   tokenizer.json          a copy of `tokenizer_json` when given
//
// Size: the two [vocab, hidden] bf16 matrices dominate (hidden 32: ~26 MB in all).
// Deterministic: the same options give the same bytes.
// Threads: plain function.

#include <cstdint>
#include <string>

#include "common/status.h"

namespace garden::rose {

struct MkGptOssOptions {
  std::string out_dir;
  uint64_t seed = 0;
  std::string tokenizer_json;   // copied to out_dir/tokenizer.json when non-empty
  int64_t vocab_size = 201088;  // o200k_harmony
  int64_t hidden_size = 32;     // a multiple of 32 (MXFP4 blocks along the input dim)
  int64_t num_layers = 2;       // layer l is sliding_attention when l is even (as published)
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 64;           // as published
  int64_t intermediate_size = 32;  // a multiple of 32
  int64_t num_experts = 4;
  int64_t experts_per_token = 2;
  int64_t sliding_window = 8;  // published: 128; small so short tests cross it
  int64_t max_position = 131072;
};

Status makeGptOssModel(const MkGptOssOptions& opts);

}  // namespace garden::rose
