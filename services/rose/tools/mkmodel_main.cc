// rose-mkmodel: writes the built-in default model (see services/rose/tools/mkmodel.h), or with
// --kind gpt-oss a tiny random gpt-oss checkpoint (services/rose/tools/mkmodel_gpt_oss.h).
//
//   rose-mkmodel --out DIR [--seed N] [--repo DIR] [--vocab-size 2000] [--dtype bf16|f32]
//                [--spm-train spm_train] [--shape tiny|qwen3-0.6b]
//   rose-mkmodel --kind gpt-oss --out DIR [--seed N] [--tokenizer-json PATH] [--layers 2]
//                [--experts 4] [--top-k 2] [--sliding-window 8] [--intermediate-size 32]

#include <cstdio>
#include <filesystem>
#include <string>

#include "common/flags.h"
#include "services/rose/tools/mkmodel.h"
#include "services/rose/tools/mkmodel_gpt_oss.h"

namespace {

// The repository root: the nearest ancestor of the working directory holding services/rose.
std::string defaultRepo() {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::path p = fs::current_path(ec); !p.empty(); p = p.parent_path()) {
    if (fs::is_directory(p / "services" / "rose", ec)) return p.string();
    if (p == p.parent_path()) break;
  }
  return fs::current_path(ec).string();
}

}  // namespace

int main(int argc, char** argv) {
  garden::rose::MkModelOptions o;
  o.repo_root = defaultRepo();
  std::string dtype = "bf16";
  std::string kind = "qwen3";
  std::string shape = "tiny";
  garden::rose::MkGptOssOptions g;
  garden::Flags flags(
      "rose-mkmodel",
      "Writes a tiny random Qwen3 checkpoint + sentencepiece tokenizer (the default "
      "model; its embeddings are meaningless), or with --kind gpt-oss a tiny random gpt-oss "
      "checkpoint with the real o200k_harmony vocabulary size");
  flags.add("out", &o.out_dir, "output directory (created)")
      .add("seed", &o.seed, "weight PRNG seed")
      .add("repo", &o.repo_root, "repository root whose text trains the tokenizer")
      .add("vocab-size", &o.vocab_size, "tokenizer vocabulary size (soft limit)")
      .add("dtype", &dtype, "weight dtype: bf16 or f32")
      .add("spm-train", &o.spm_train, "the sentencepiece trainer binary")
      .add("kind", &kind, "qwen3 (the default embedding model) or gpt-oss")
      .add("shape", &shape,
           "qwen3: tiny (the default model) or qwen3-0.6b (Qwen3-Embedding-0.6B's layer shapes: "
           "hidden 1024, 28 layers, 16/8 heads of 128, intermediate 3072; the vocabulary stays "
           "the trained tokenizer's; ~0.9 GB in bf16; for CPU benchmarks)")
      .add("tokenizer-json", &g.tokenizer_json,
           "gpt-oss: tokenizer.json to copy into the model dir (the real o200k_harmony one)")
      .add("layers", &g.num_layers, "gpt-oss: layers (even = sliding, odd = full attention)")
      .add("experts", &g.num_experts, "gpt-oss: experts per layer")
      .add("top-k", &g.experts_per_token, "gpt-oss: experts per token")
      .add("sliding-window", &g.sliding_window, "gpt-oss: sliding window of even layers")
      .add("intermediate-size", &g.intermediate_size,
           "gpt-oss: experts' intermediate size, a multiple of 32 (64 lets rose --tp 2 split it)");
  flags.parseOrExit(argc, argv);
  if (kind == "gpt-oss") {
    g.out_dir = o.out_dir;
    g.seed = o.seed;
    garden::Status st = garden::rose::makeGptOssModel(g);
    if (!st.isOk()) {
      std::fprintf(stderr, "rose-mkmodel: %s\n", st.toString().c_str());
      return st.code() == garden::StatusCode::kInvalidArgument ? 2 : 1;
    }
    std::printf("rose-mkmodel: wrote %s (tiny gpt-oss, random weights; outputs are meaningless)\n",
                g.out_dir.c_str());
    return 0;
  }
  if (kind != "qwen3") {
    std::fprintf(stderr, "rose-mkmodel: --kind must be qwen3 or gpt-oss\n");
    return 2;
  }
  if (dtype != "bf16" && dtype != "f32") {
    std::fprintf(stderr, "rose-mkmodel: --dtype must be bf16 or f32\n");
    return 2;
  }
  o.bf16 = dtype == "bf16";
  if (shape == "qwen3-0.6b") {
    o.hidden_size = 1024;
    o.num_layers = 28;
    o.num_heads = 16;
    o.num_kv_heads = 8;
    o.head_dim = 128;
    o.intermediate_size = 3072;
    o.max_position = 32768;
  } else if (shape != "tiny") {
    std::fprintf(stderr, "rose-mkmodel: --shape must be tiny or qwen3-0.6b\n");
    return 2;
  }
  if (o.out_dir.empty()) {
    std::fprintf(stderr, "rose-mkmodel: --out is required\n");
    return 2;
  }
  garden::Status st = garden::rose::makeDefaultModel(o);
  if (!st.isOk()) {
    std::fprintf(stderr, "rose-mkmodel: %s\n", st.toString().c_str());
    return 1;
  }
  std::printf("rose-mkmodel: wrote %s (random weights; embeddings are meaningless)\n",
              o.out_dir.c_str());
  return 0;
}
