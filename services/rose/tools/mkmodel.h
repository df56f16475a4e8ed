#pragma once
// The built-in default model: a tiny Qwen3 checkpoint with deterministic random weights in the
// Hugging Face layout, and a unigram sentencepiece tokenizer trained (by Debian's `spm_train`,
// single-threaded, fixed seed) on this repository's own text. Its embeddings are meaningless;
// it exists so the demo and the integration tests need no download.
//
// Output directory:
//   config.json            Qwen3ForCausalLM config (tied embeddings, bf16 or f32)
//   model.safetensors      weights, names with the `model.` prefix
//   tokenizer.model        sentencepiece unigram model (byte fallback)
//   modules.json, 1_Pooling/config.json, 2_Normalize/   sentence-transformers: last token + L2
//
// Deterministic: the same repository text, seed and options give the same bytes.
// Threads: plain function; runs spm_train as a child process.

#include <cstdint>
#include <string>

#include "common/status.h"

namespace garden::rose {

struct MkModelOptions {
  std::string out_dir;
  std::string repo_root;      // text for the tokenizer is gathered from here
  uint64_t seed = 0;          // weight PRNG seed
  int32_t vocab_size = 2000;  // sentencepiece vocab (a soft limit)
  bool bf16 = true;           // weight dtype (else f32)
  std::string spm_train = "spm_train";
  int64_t hidden_size = 64;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 64;  // the CUDA kernels serve head_dim 64 and 128
  int64_t intermediate_size = 128;
  int64_t max_position = 512;
};

// Collects the repository text (sorted *.md, *.h, *.cc, *.py, *.proto, *.sh, *.txt files outside
// build/VCS/model folders) into one corpus; returns the number of files used.
Result<int64_t> writeCorpus(const std::string& repo_root, const std::string& corpus_path);

Status makeDefaultModel(const MkModelOptions& opts);

}  // namespace garden::rose
