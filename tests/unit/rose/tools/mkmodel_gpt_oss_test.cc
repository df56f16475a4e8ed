// rose-mkmodel's gpt-oss mode: byte-for-byte deterministic from the seed, small, in the published
// layout (MXFP4 experts, YaRN, alternating sliding/full layers, real vocabulary and eos ids),
// loads into GptOssModel and runs a step; the tokenizer is copied when given; bad options are
// clear errors.

#include "services/rose/tools/mkmodel_gpt_oss.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char t[] = "/tmp/mkmodel_gpt_oss_test_XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string readAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(MkGptOss, DeterministicPublishedLayoutThatServes) {
  TempDir t;
  const fs::path tok = t.path / "some-tokenizer.json";
  std::ofstream(tok) << R"({"version": "1.0", "model": {"type": "BPE"}})";
  MkGptOssOptions o;
  o.out_dir = (t.path / "a").string();
  o.tokenizer_json = tok.string();
  ASSERT_TRUE(makeGptOssModel(o).isOk());
  o.out_dir = (t.path / "b").string();
  ASSERT_TRUE(makeGptOssModel(o).isOk());
  o.out_dir = (t.path / "c").string();
  o.seed = 9;
  o.tokenizer_json.clear();
  ASSERT_TRUE(makeGptOssModel(o).isOk());

  for (const char* f :
       {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_EQ(readAll(t.path / "a" / f), readAll(t.path / "b" / f)) << f;
  }
  EXPECT_EQ(readAll(t.path / "a/tokenizer.json"), readAll(tok));
  EXPECT_FALSE(fs::exists(t.path / "c/tokenizer.json"));
  EXPECT_NE(readAll(t.path / "a/model.safetensors"), readAll(t.path / "c/model.safetensors"));
  EXPECT_LT(fs::file_size(t.path / "a/model.safetensors"), 40u << 20);

  // The published generation_config eos ids.
  const std::string gen = readAll(t.path / "a/generation_config.json");
  for (const char* id : {"200002", "199999", "200012"}) {
    EXPECT_NE(gen.find(id), std::string::npos) << id;
  }

  // Config as the published one is shaped.
  auto cfg = loadGptOssConfig((t.path / "a").string());
  ASSERT_TRUE(cfg.isOk()) << cfg.status().toString();
  EXPECT_EQ(cfg->base.vocab_size, 201088);
  EXPECT_EQ(cfg->base.model_type, "gpt_oss");
  EXPECT_EQ(cfg->base.num_hidden_layers, 2);
  EXPECT_EQ(cfg->sliding, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(cfg->base.num_local_experts, 4);
  EXPECT_EQ(cfg->base.num_experts_per_tok, 2);
  EXPECT_EQ(cfg->base.head_dim, 64);
  EXPECT_EQ(cfg->base.max_position_embeddings, 131072);
  EXPECT_EQ(cfg->base.eos_token_id, 200002);
  EXPECT_EQ(cfg->rope.type, "yarn");
  EXPECT_DOUBLE_EQ(cfg->rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(cfg->rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(cfg->rope.beta_slow, 1.0);
  EXPECT_EQ(cfg->rope.original_max_position_embeddings, 4096);
  EXPECT_FALSE(cfg->rope.truncate);
  EXPECT_EQ(cfg->quant_method, "mxfp4");
  EXPECT_FLOAT_EQ(cfg->swiglu_limit, 7.f);

  // Experts as published: MXFP4 blocks/scales (uint8), everything else bf16.
  auto ck = SafetensorsCheckpoint::openDir((t.path / "a").string()).value();
  const TensorView* blocks = ck->find("model.layers.1.mlp.experts.gate_up_proj_blocks");
  ASSERT_NE(blocks, nullptr);
  EXPECT_EQ(blocks->dtype, DType::kU8);
  EXPECT_EQ(blocks->shape, (std::vector<int64_t>{4, 64, 1, 16}));
  const TensorView* scales = ck->find("model.layers.1.mlp.experts.down_proj_scales");
  ASSERT_NE(scales, nullptr);
  EXPECT_EQ(scales->shape, (std::vector<int64_t>{4, 32, 1}));
  const TensorView* head = ck->find("lm_head.weight");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->dtype, DType::kBF16);
  EXPECT_EQ(head->shape, (std::vector<int64_t>{201088, 32}));

  // It loads and samples ids in the vocabulary; the Harmony special ids are valid tokens.
  auto backend = std::move(makeBackend("cpu", BackendOptions{1, 0, 16})).value();
  auto ops = std::move(makeLlmOps(*backend, 1)).value();
  GptOssOptions go;
  go.max_batch_tokens = 16;
  go.max_seqs = 2;
  go.max_logits_rows = 2;
  go.max_model_len = 64;
  auto m = GptOssModel::load((t.path / "a").string(), *backend, *ops, go);
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  auto kv =
      std::move(PagedKvCache::create(*backend, (*m)->kvShape(8, 16), (*m)->kvDType())).value();
  const std::vector<int32_t> tokens = {200006, 1428, 200008, 12194, 200007, 200012};
  LlmStepSeq s;
  s.num_tokens = 6;
  s.num_blocks = 1;
  s.sample = 1;
  s.logits = LogitsMode::kLast;
  const std::vector<LlmStepSeq> seqs = {s};
  const std::vector<int32_t> blocks_ids = {3};
  LlmStep step{seqs, tokens, blocks_ids};
  ASSERT_TRUE((*m)->validate(step, *kv).isOk());
  int32_t out = -1;
  std::vector<float> logits(201088);
  (*m)->enqueueStep(step, *kv, logits.data(), &out);
  ASSERT_TRUE(backend->synchronize().isOk());
  ASSERT_GE(out, 0);
  ASSERT_LT(out, 201088);
  // Finite, spread-out logits (the random weights are scaled sensibly); greedy = argmax.
  float lo = logits[0], hi = logits[0];
  for (float x : logits) {
    ASSERT_TRUE(std::isfinite(x));
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_GT(hi - lo, 0.1f);
  EXPECT_EQ(logits[static_cast<size_t>(out)], hi);
}

TEST(MkGptOss, ClearErrors) {
  TempDir t;
  MkGptOssOptions o;
  EXPECT_EQ(makeGptOssModel(o).code(), StatusCode::kInvalidArgument);  // no out dir
  o.out_dir = (t.path / "m").string();
  o.tokenizer_json = (t.path / "missing.json").string();
  EXPECT_EQ(makeGptOssModel(o).code(), StatusCode::kNotFound);
  o.tokenizer_json.clear();
  o.hidden_size = 48;  // not a multiple of 32
  Status st = makeGptOssModel(o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("multiples of 32"), std::string::npos) << st.toString();
  o.hidden_size = 32;
  o.vocab_size = 1000;  // the Harmony ids would be outside it
  st = makeGptOssModel(o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("vocab_size"), std::string::npos) << st.toString();
  o.vocab_size = 201088;
  o.experts_per_token = 5;
  EXPECT_EQ(makeGptOssModel(o).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace garden::rose
