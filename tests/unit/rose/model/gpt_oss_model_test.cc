// GptOssModel on the tiny fixture checkpoint (tests/conformance/gpt_oss/fixtures, where its
// outputs are checked against transformers): step validation errors name the problem,
// checkpoint/config errors are clear, seeded sampling is independent of the batch it runs in,
// and config parsing (YaRN keys in both transformers spellings, layer types, quantization).

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "services/rose/model/gpt_oss.h"

namespace garden::rose {
namespace {

namespace fs = std::filesystem;

fs::path fixtureDir(const char* variant) {
  const char* src = std::getenv("GARDEN_SOURCE_DIR");
  fs::path root = src ? fs::path(src)
                      : fs::path(__FILE__)
                            .parent_path()
                            .parent_path()
                            .parent_path()
                            .parent_path()
                            .parent_path();
  return root / "tests/conformance/gpt_oss/fixtures" / variant;
}

class GptOssModelTest : public ::testing::Test {
 protected:
  // The fixture model's options (small budgets; the caches below use blocks of 4).
  static GptOssOptions smallOptions() {
    GptOssOptions o;
    o.max_batch_tokens = 40;
    o.max_seqs = 4;
    o.max_logits_rows = 30;
    o.max_model_len = 48;
    o.min_block_size = 4;
    return o;
  }
  void SetUp() override {
    backend_ = makeBackend("cpu", BackendOptions{1, 0, 64}).value();
    ops_ = makeLlmOps(*backend_, 1).value();
    auto m = GptOssModel::load(fixtureDir("bf16").string(), *backend_, *ops_, smallOptions());
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    model_ = std::move(m).value();
    kv_ = PagedKvCache::create(*backend_, model_->kvShape(16, 4), model_->kvDType()).value();
  }
  Status check(std::vector<LlmStepSeq> seqs, std::vector<int32_t> tokens,
               std::vector<int32_t> blocks) {
    return model_->validate(LlmStep{seqs, tokens, blocks}, *kv_);
  }
  static LlmStepSeq seq(int32_t tok_off, int32_t n, int32_t pos, int32_t blk_off, int32_t nblk) {
    LlmStepSeq s;
    s.token_offset = tok_off;
    s.num_tokens = n;
    s.position = pos;
    s.block_offset = blk_off;
    s.num_blocks = nblk;
    return s;
  }
  // Runs one step through launch() and returns the sampled ids.
  std::vector<int32_t> sampleStep(std::vector<LlmStepSeq> seqs, std::vector<int32_t> tokens,
                                  std::vector<int32_t> blocks) {
    LlmStep step{seqs, tokens, blocks};
    EXPECT_TRUE(model_->validate(step, *kv_).isOk());
    std::vector<int32_t> out;
    for (const auto& s : seqs) {
      if (s.sample) out.push_back(-1);
    }
    std::vector<float> logits(static_cast<size_t>(logitsRows(step) * model_->vocabSize()));
    backend_->launch([&] { model_->enqueueStep(step, *kv_, logits.data(), out.data()); });
    EXPECT_TRUE(backend_->synchronize().isOk());
    return out;
  }

  // One 6-token step with every row's logits through model_ and `other` (a cache of its own):
  // the same bits, and real logits (not an untouched buffer).
  void expectSameLogits(GptOssModel& other) {
    auto kv2 = PagedKvCache::create(*backend_, other.kvShape(16, 4), other.kvDType()).value();
    LlmStepSeq s = seq(0, 6, 0, 0, 2);
    s.logits = LogitsMode::kAll;
    const std::vector<LlmStepSeq> seqs = {s};
    const std::vector<int32_t> tokens = {3, 1, 4, 1, 5, 9}, blocks = {2, 0};
    const LlmStep step{seqs, tokens, blocks};
    std::vector<float> a(6 * 512), b(6 * 512);
    model_->enqueueStep(step, *kv_, a.data(), nullptr);
    other.enqueueStep(step, *kv2, b.data(), nullptr);
    ASSERT_TRUE(backend_->synchronize().isOk());
    EXPECT_EQ(a, b);
    EXPECT_NE(a[0], a[512]);
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlmOps> ops_;
  std::unique_ptr<GptOssModel> model_;
  std::unique_ptr<PagedKvCache> kv_;
};

void expectError(const Status& s, const std::string& needle) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "'" << s.message() << "' lacks '" << needle << "'";
}

TEST_F(GptOssModelTest, ValidStepPasses) {
  EXPECT_TRUE(check({seq(0, 5, 0, 0, 2)}, {1, 2, 3, 4, 5}, {3, 7}).isOk());
  EXPECT_TRUE(check({seq(0, 1, 7, 0, 2), seq(1, 2, 0, 2, 1)}, {1, 2, 3}, {3, 7, 9}).isOk());
}

TEST_F(GptOssModelTest, StepErrorsNameTheProblem) {
  expectError(check({}, {}, {}), "no sequences");
  expectError(check({seq(0, 0, 0, 0, 1)}, {1}, {0}), "num_tokens");
  expectError(check({seq(0, 3, 0, 0, 1)}, {1, 2}, {0}), "token array");
  expectError(check({seq(0, 2, 0, 0, 1)}, {1, 512}, {0}), "outside the vocabulary");
  expectError(check({seq(0, 2, 0, 0, 1)}, {1, -3}, {0}), "outside the vocabulary");
  expectError(check({seq(0, 5, 0, 0, 1)}, {1, 2, 3, 4, 5}, {0}), "needed for 5 tokens");
  expectError(check({seq(0, 1, 0, 0, 1)}, {1}, {16}), "outside the cache");
  expectError(check({seq(0, 1, 0, 0, 2)}, {1}, {0}), "block id array");
  expectError(check({seq(0, 1, -1, 0, 1)}, {1}, {0}), "position");
  expectError(check({seq(0, 1, 48, 0, 13)}, {1}, std::vector<int32_t>(13, 0)), "max_model_len");
  // Two sequences sharing a block write the same slots.
  expectError(check({seq(0, 1, 0, 0, 1), seq(1, 1, 0, 1, 1)}, {1, 2}, {5, 5}), "KV slot");
  LlmStepSeq bad_sampling = seq(0, 1, 0, 0, 1);
  bad_sampling.sample = 1;
  bad_sampling.sampling.top_p = 0.f;
  expectError(check({bad_sampling}, {1}, {0}), "top_p");
  std::vector<int32_t> many(41, 1);
  expectError(
      check({seq(0, 41, 0, 0, 11)}, many, std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}),
      "max_batch_tokens");
  std::vector<LlmStepSeq> five;
  for (int i = 0; i < 5; ++i) five.push_back(seq(i, 1, 0, i, 1));
  expectError(check(five, {1, 1, 1, 1, 1}, {0, 1, 2, 3, 4}), "max_seqs");
  LlmStepSeq all = seq(0, 40, 0, 0, 10);
  std::vector<int32_t> blocks(10);
  std::iota(blocks.begin(), blocks.end(), 0);
  EXPECT_TRUE(check({all}, std::vector<int32_t>(40, 1), blocks).isOk());
  all.logits = LogitsMode::kAll;  // 40 rows > max_logits_rows 30
  expectError(check({all}, std::vector<int32_t>(40, 1), blocks), "max_logits_rows");
  all.logits = LogitsMode::kLast;
  EXPECT_TRUE(check({all}, std::vector<int32_t>(40, 1), blocks).isOk());
  // A cache of another shape.
  auto other = PagedKvCache::create(*backend_, KvCacheShape{2, 16, 4, 2, 16}, DType::kF32).value();
  expectError(model_->validate(LlmStep{std::vector<LlmStepSeq>{seq(0, 1, 0, 0, 1)},
                                       std::vector<int32_t>{1}, std::vector<int32_t>{0}},
                               *other),
              "kv cache");
}

// Seeded sampling draws from (seed, position): the same sequence gets the same token alone or
// batched with another, in any order, and greedy equals argmax.
TEST_F(GptOssModelTest, SeededSamplingIndependentOfTheBatch) {
  const std::vector<int32_t> prompt = {5, 17, 300, 42, 99, 7, 260};
  SamplingParams sp;
  sp.temperature = 1.3f;
  sp.top_p = 0.95f;
  sp.top_k = 50;
  sp.seed = 777;
  LlmStepSeq a = seq(0, 7, 0, 0, 2);
  a.sample = 1;
  a.sampling = sp;
  const auto alone = sampleStep({a}, prompt, {0, 1});
  // Batched after another sequence (different blocks, offsets): same draw.
  LlmStepSeq other = seq(0, 3, 0, 0, 1);
  other.sample = 1;
  other.sampling.temperature = 0.7f;
  other.sampling.seed = 1;
  LlmStepSeq a2 = seq(3, 7, 0, 1, 2);
  a2.sample = 1;
  a2.sampling = sp;
  std::vector<int32_t> toks = {9, 8, 7};
  toks.insert(toks.end(), prompt.begin(), prompt.end());
  const auto batched = sampleStep({other, a2}, toks, {4, 6, 9});
  ASSERT_EQ(alone.size(), 1u);
  ASSERT_EQ(batched.size(), 2u);
  EXPECT_EQ(alone[0], batched[1]);
  // Over many seeds the draws vary (the stream is random), and stay within the vocabulary.
  std::vector<int32_t> draws;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    a.sampling.seed = seed;
    draws.push_back(sampleStep({a}, prompt, {0, 1})[0]);
  }
  std::sort(draws.begin(), draws.end());
  EXPECT_GT(std::unique(draws.begin(), draws.end()) - draws.begin(), 2);
  for (int32_t d : draws) EXPECT_TRUE(d >= 0 && d < 512);
}

// Two steps in flight [TAG_LLM_PREV_TOKEN]: a decode whose token comes from the previous step's
// sampled ids (prev_row) computes exactly what the same decode with the token written out does;
// a prev_row the previous step did not sample is refused.
TEST_F(GptOssModelTest, PrevRowTakesThePreviousStepsToken) {
  const std::vector<int32_t> prompt = {5, 17, 300, 42};
  auto runTwoSteps = [&](bool use_prev) {
    auto kv = PagedKvCache::create(*backend_, model_->kvShape(16, 4), model_->kvDType()).value();
    std::swap(kv_, kv);
    LlmStepSeq a = seq(0, 4, 0, 0, 2);
    a.sample = 1;  // greedy
    const auto first = sampleStep({a}, prompt, {3, 7});
    LlmStepSeq b = seq(0, 1, 4, 0, 2);
    b.sample = 1;
    std::vector<int32_t> tok = {first[0]};
    if (use_prev) {
      b.prev_row = 0;
      tok[0] = -1;  // ignored
    }
    const auto second = sampleStep({b}, tok, {3, 7});
    std::swap(kv_, kv);
    return std::make_pair(first[0], second[0]);
  };
  const auto plain = runTwoSteps(false);
  const auto prev = runTwoSteps(true);
  EXPECT_EQ(prev, plain);
  // After a step that sampled one id, prev_row 1 does not exist.
  LlmStepSeq bad = seq(0, 1, 4, 0, 2);
  bad.prev_row = 1;
  expectError(check({bad}, {-1}, {3, 7}), "prev_row");
}

// [TAG_KV_WINDOW_GROUP] The sliding layers (window 8 keys, blocks of 4) in a window pool of their
// own: three sequences run chunked prefill then greedy decode to 44 tokens, once with every layer
// in one pool and once with the window pool, whose tables drop (-1) every block the window no
// longer reads before each step and hand it at once to another sequence (LIFO free list). Every
// logits row and every sampled id must be equal bit for bit: a sliding layer reads only its
// window, wherever it lives.
TEST_F(GptOssModelTest, WindowPoolGivesTheSameLogitsAsOnePool) {
  constexpr int32_t kBs = 4, kWindow = 8, kFull = 40, kWin = 16, kEnd = 44;
  ASSERT_EQ(model_->slidingWindow(), kWindow);
  auto one = PagedKvCache::create(*backend_, model_->kvShape(kFull, kBs), model_->kvDType()).value();
  auto two =
      PagedKvCache::create(*backend_, model_->kvShape(kFull, kBs, kWin), model_->kvDType()).value();
  ASSERT_EQ(two->shape().numWindowLayers(), 2);
  ASSERT_EQ(two->keys(0).dim(0), kWin);  // layer 0 slides
  ASSERT_EQ(two->keys(1).dim(0), kFull);

  std::mt19937 rng(7);
  auto shuffled = [&](int32_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    std::iota(v.begin(), v.end(), 0);
    std::shuffle(v.begin(), v.end(), rng);
    return v;
  };
  std::vector<int32_t> free_a = shuffled(kFull), free_b = shuffled(kFull), free_w = shuffled(kWin);
  struct Seq {
    std::vector<int32_t> tokens;
    int32_t computed = 0;
    std::vector<int32_t> ta, tb, tw;  // one pool; two pools: full and window tables
  };
  std::vector<Seq> seqs(3);
  const int32_t prompt_len[3] = {20, 14, 9};
  for (int i = 0; i < 3; ++i) {
    for (int32_t k = 0; k < prompt_len[i]; ++k) seqs[i].tokens.push_back(3 + rng() % 500);
  }
  auto take = [](std::vector<int32_t>& list) {
    EXPECT_FALSE(list.empty());
    const int32_t b = list.back();
    list.pop_back();
    return b;
  };
  size_t holes = 0, reused = 0, steps = 0;
  std::vector<bool> window_used(kWin, false);
  while (true) {
    std::vector<LlmStepSeq> d;
    std::vector<int32_t> tokens, blocks_a, blocks_b;
    std::vector<int> who;
    for (int i = 0; i < 3; ++i) {
      Seq& s = seqs[i];
      if (s.computed >= kEnd) continue;
      const int32_t n = std::min<int32_t>(3 + static_cast<int32_t>(rng() % 5),
                                          static_cast<int32_t>(s.tokens.size()) - s.computed);
      const int32_t end = s.computed + n;
      // The window drops what no query from here on reads: blocks ending before
      // computed - window + 1; freed blocks go to the front of the line.
      for (size_t bi = 0; bi < s.tw.size(); ++bi) {
        if (s.tw[bi] >= 0 && int32_t(bi + 1) * kBs <= s.computed - kWindow + 1) {
          free_w.push_back(s.tw[bi]);
          s.tw[bi] = -1;
        }
      }
      while (int32_t(s.ta.size()) * kBs < end) {
        s.ta.push_back(take(free_a));
        s.tb.push_back(take(free_b));
        const int32_t w = take(free_w);
        reused += window_used[static_cast<size_t>(w)] ? 1 : 0;
        window_used[static_cast<size_t>(w)] = true;
        s.tw.push_back(w);
      }
      holes += s.tw[0] < 0 ? 1 : 0;
      LlmStepSeq q = seq(static_cast<int32_t>(tokens.size()), n, s.computed,
                         static_cast<int32_t>(blocks_a.size()), static_cast<int32_t>(s.ta.size()));
      q.logits = LogitsMode::kAll;
      q.sample = end == static_cast<int32_t>(s.tokens.size()) ? 1 : 0;
      d.push_back(q);
      tokens.insert(tokens.end(), s.tokens.begin() + s.computed, s.tokens.begin() + end);
      blocks_a.insert(blocks_a.end(), s.ta.begin(), s.ta.end());
      blocks_b.insert(blocks_b.end(), s.tb.begin(), s.tb.end());
      blocks_b.insert(blocks_b.end(), s.tw.begin(), s.tw.end());
      who.push_back(i);
    }
    if (d.empty()) break;
    std::vector<LlmStepSeq> db = d;
    int32_t off = 0;
    for (LlmStepSeq& q : db) {
      q.block_offset = off;
      q.window_table = 1;
      off += 2 * q.num_blocks;
    }
    const LlmStep sa{d, tokens, blocks_a}, sb{db, tokens, blocks_b};
    const Status va = model_->validate(sa, *one);
    ASSERT_TRUE(va.isOk()) << va.toString();
    const Status vb = model_->validate(sb, *two);
    ASSERT_TRUE(vb.isOk()) << vb.toString();
    // The one-pool cache refuses window tables, the two-pool cache their absence.
    expectError(model_->validate(sb, *one), "no window pool");
    expectError(model_->validate(sa, *two), "window_table 0");
    const size_t rows = static_cast<size_t>(logitsRows(sa));
    std::vector<float> la(rows * 512), lb(rows * 512, 1.f);
    std::vector<int32_t> ida(d.size(), -1), idb(d.size(), -1);
    backend_->launch([&] { model_->enqueueStep(sa, *one, la.data(), ida.data()); });
    ASSERT_TRUE(backend_->synchronize().isOk());
    backend_->launch([&] { model_->enqueueStep(sb, *two, lb.data(), idb.data()); });
    ASSERT_TRUE(backend_->synchronize().isOk());
    ASSERT_EQ(la, lb) << "step " << steps;
    ASSERT_EQ(ida, idb) << "step " << steps;
    size_t k = 0;
    for (size_t j = 0; j < d.size(); ++j) {
      Seq& s = seqs[static_cast<size_t>(who[j])];
      s.computed += d[j].num_tokens;
      if (d[j].sample) s.tokens.push_back(ida[k++]);
    }
    ++steps;
  }
  EXPECT_GT(steps, 30u);
  EXPECT_GT(holes, 20u) << "the windows dropped blocks";
  EXPECT_GT(reused, 10u) << "dropped blocks were handed to other sequences";
}

// [TAG_KV_WINDOW_GROUP] A window table's errors name the problem.
TEST_F(GptOssModelTest, WindowTableErrorsNameTheProblem) {
  auto two = PagedKvCache::create(*backend_, model_->kvShape(16, 4, 6), model_->kvDType()).value();
  auto checkTwo = [&](std::vector<LlmStepSeq> seqs, std::vector<int32_t> tokens,
                      std::vector<int32_t> blocks) {
    for (LlmStepSeq& q : seqs) q.window_table = 1;
    return model_->validate(LlmStep{seqs, tokens, blocks}, *two);
  };
  std::vector<int32_t> five = {1, 2, 3, 4, 5};
  // Positions 12..16 read keys 5..16 in the window: blocks 1..4 needed, block 0 may be a hole.
  EXPECT_TRUE(checkTwo({seq(0, 5, 12, 0, 5)}, five, {0, 1, 2, 3, 4, -1, 5, 4, 3, 2}).isOk());
  expectError(checkTwo({seq(0, 5, 12, 0, 5)}, five, {0, 1, 2, 3, 4, -1, -1, 4, 3, 2}),
              "hole at block 1");
  expectError(checkTwo({seq(0, 5, 12, 0, 5)}, five, {0, 1, 2, 3, 4, -1, 5, 4, 3, 6}),
              "outside the window pool");
  expectError(checkTwo({seq(0, 5, 12, 0, 5)}, five, {0, 1, 2, 3, 4, -1, 5, 4, 3}),
              "window table outside");
  expectError(checkTwo({seq(0, 1, 0, 0, 1), seq(1, 1, 0, 2, 1)}, {1, 2}, {5, 2, 6, 2}),
              "window-pool KV slot");
  const std::vector<LlmStepSeq> two_flag = {[] {
    LlmStepSeq q = seq(0, 1, 0, 0, 1);
    q.window_table = 2;
    return q;
  }()};
  const std::vector<int32_t> one_token = {1}, table = {0, 0};
  expectError(model_->validate(LlmStep{two_flag, one_token, table}, *two), "window_table 2");
}

// The fixture split into two shards with an index (as the published checkpoints are) loads and
// computes exactly what the single file does.
TEST_F(GptOssModelTest, ShardedCheckpointGivesTheSameLogits) {
  const fs::path tmp = fs::temp_directory_path() / ("gptoss_sharded_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  fs::copy_file(fixtureDir("bf16") / "config.json", tmp / "config.json",
                fs::copy_options::overwrite_existing);
  auto ck = SafetensorsCheckpoint::openDir(fixtureDir("bf16").string()).value();
  std::vector<TensorToWrite> shard[2];
  std::string index = R"({"metadata":{},"weight_map":{)";
  int i = 0;
  for (const std::string& name : ck->names()) {
    const TensorView* t = ck->find(name);
    const int which = i++ % 2;
    shard[which].push_back(
        {name, t->dtype, t->shape, std::vector<std::byte>(t->data, t->data + t->bytes)});
    index += (i > 1 ? "," : "") + ("\"" + name + "\":\"model-0000" + std::to_string(which + 1) +
                                   "-of-00002.safetensors\"");
  }
  index += "}}";
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(
        writeSafetensors(
            (tmp / ("model-0000" + std::to_string(k + 1) + "-of-00002.safetensors")).string(),
            shard[k])
            .isOk());
  }
  std::ofstream(tmp / "model.safetensors.index.json") << index;
  auto sharded = GptOssModel::load(tmp.string(), *backend_, *ops_, smallOptions());
  fs::remove_all(tmp);
  ASSERT_TRUE(sharded.isOk()) << sharded.status().toString();
  expectSameLogits(**sharded);
}

TEST(GptOssConfigParse, BothRopeSpellingsAndDefaults) {
  const std::string v4 = R"({"model_type":"gpt_oss","hidden_size":64,"num_hidden_layers":3,
    "num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"vocab_size":10,
    "intermediate_size":64,"num_local_experts":4,"num_experts_per_tok":2,"sliding_window":8,
    "rope_theta":150000,"rope_scaling":{"rope_type":"yarn","factor":32.0,"beta_fast":32.0,
    "beta_slow":1.0,"original_max_position_embeddings":4096,"truncate":false},"swiglu_limit":6.5})";
  auto c = parseGptOssConfig(v4);
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->rope.type, "yarn");
  EXPECT_EQ(c->rope.original_max_position_embeddings, 4096);
  EXPECT_FALSE(c->rope.truncate);
  EXPECT_FLOAT_EQ(c->swiglu_limit, 6.5f);
  EXPECT_EQ(c->sliding, (std::vector<uint8_t>{1, 0, 1}));   // default: even layers slide
  auto f = loadGptOssConfig(fixtureDir("mxfp4").string());  // transformers 5: rope_parameters
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  EXPECT_EQ(f->quant_method, "mxfp4");
  EXPECT_EQ(f->rope.type, "yarn");
  EXPECT_DOUBLE_EQ(f->rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(f->base.rope_theta, 150000.0);
}

TEST(GptOssConfigParse, ErrorsNameTheField) {
  const std::string base = R"("hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,
    "head_dim":16,"vocab_size":10,"intermediate_size":64,"sliding_window":8)";
  auto err = [&](const std::string& extra) {
    return parseGptOssConfig("{" + base + "," + extra + "}").status();
  };
  expectError(err(R"("num_local_experts":0,"num_experts_per_tok":1)"), "num_local_experts");
  expectError(err(R"("num_local_experts":4,"num_experts_per_tok":5)"), "num_experts_per_tok");
  expectError(err(R"("model_type":"llama","num_local_experts":4,"num_experts_per_tok":2)"),
              "model_type");
  expectError(
      err(R"("num_local_experts":4,"num_experts_per_tok":2,"layer_types":["sliding_attention","local"])"),
      "layer_types[1]");
  EXPECT_EQ(
      err(R"("num_local_experts":4,"num_experts_per_tok":2,"quantization_config":{"quant_method":"gptq"})")
          .code(),
      StatusCode::kUnimplemented);
  expectError(
      err(R"("num_local_experts":4,"num_experts_per_tok":2,"rope_scaling":{"factor":"big"})"),
      "factor");
}

TEST(GptOssLoad, CheckpointErrorsAreClear) {
  auto backend = makeBackend("cpu", BackendOptions{}).value();
  auto ops = makeLlmOps(*backend).value();
  EXPECT_EQ(
      GptOssModel::load("/nonexistent/gpt-oss", *backend, *ops, GptOssOptions{}).status().code(),
      StatusCode::kNotFound);
  // The fixture checkpoint (bf16 re-export) with one tensor dropped or reshaped.
  const fs::path tmp = fs::temp_directory_path() / ("gptoss_broken_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  fs::copy_file(fixtureDir("bf16") / "config.json", tmp / "config.json",
                fs::copy_options::overwrite_existing);
  auto ck = SafetensorsCheckpoint::openDir(fixtureDir("bf16").string()).value();
  auto loadWith = [&](const std::string& drop, const std::string& reshape) {
    std::vector<TensorToWrite> tensors;
    for (const std::string& name : ck->names()) {
      if (name == drop) continue;
      const TensorView* t = ck->find(name);
      TensorToWrite w{name, t->dtype, t->shape,
                      std::vector<std::byte>(t->data, t->data + t->bytes)};
      if (name == reshape) w.shape = {t->shape[0], t->shape[2], t->shape[1]};
      tensors.push_back(std::move(w));
    }
    EXPECT_TRUE(writeSafetensors((tmp / "model.safetensors").string(), tensors).isOk());
    return GptOssModel::load(tmp.string(), *backend, *ops, GptOssOptions{}).status();
  };
  Status missing = loadWith("model.layers.2.self_attn.sinks", "");
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("model.layers.2.self_attn.sinks"), std::string::npos)
      << missing.toString();
  // gate_up_proj in transformers' layout but down_proj transposed the other way: rejected.
  Status shape = loadWith("", "model.layers.1.mlp.experts.down_proj");
  EXPECT_EQ(shape.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shape.message().find("model.layers.1.mlp.experts.down_proj"), std::string::npos)
      << shape.toString();
  EXPECT_TRUE(loadWith("", "").isOk());  // the rewritten copy itself is fine
  fs::remove_all(tmp);
}

// --moe-weights: every name maps to its mode and back; the resident-MXFP4 modes (incl. the bf16
// copy [TAG_MOE_BF16_COPY]) are refused by name on the CPU backend, and on a checkpoint whose
// experts are not MXFP4; auto dequantizes on the CPU.
TEST(GptOssLoad, MoeWeightsModesAreNamedAndRefusedWhereTheyCannotRun) {
  for (const char* name : {"auto", "mxfp4", "fp8", "mxfp4-bf16", "bf16"}) {
    MoeWeightsMode m = MoeWeightsMode::kAuto;
    ASSERT_TRUE(moeWeightsFromName(name, &m)) << name;
    EXPECT_STREQ(moeWeightsName(m), name);
  }
  MoeWeightsMode untouched = MoeWeightsMode::kFp8;
  EXPECT_FALSE(moeWeightsFromName("fp4", &untouched));
  EXPECT_FALSE(moeWeightsFromName("", &untouched));
  EXPECT_EQ(untouched, MoeWeightsMode::kFp8);

  auto backend = makeBackend("cpu", BackendOptions{1, 0, 64}).value();
  auto ops = makeLlmOps(*backend, 1).value();
  GptOssOptions o;
  o.max_batch_tokens = 40;
  o.max_seqs = 4;
  o.max_logits_rows = 30;
  o.max_model_len = 48;
  for (MoeWeightsMode m : {MoeWeightsMode::kMxfp4, MoeWeightsMode::kFp8, MoeWeightsMode::kMxfp4Bf16}) {
    const std::string flag = std::string("--moe-weights ") + moeWeightsName(m);
    SCOPED_TRACE(flag);
    o.moe_weights = m;
    const Status cpu = GptOssModel::load(fixtureDir("mxfp4").string(), *backend, *ops, o).status();
    EXPECT_EQ(cpu.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(cpu.message().find(flag + ": the cpu backend runs dense experts only"),
              std::string::npos)
        << cpu.toString();
    const Status dense = GptOssModel::load(fixtureDir("bf16").string(), *backend, *ops, o).status();
    EXPECT_EQ(dense.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(dense.message().find(flag + ": the checkpoint's experts are not MXFP4"),
              std::string::npos)
        << dense.toString();
  }
  o.moe_weights = MoeWeightsMode::kAuto;
  EXPECT_TRUE(GptOssModel::load(fixtureDir("mxfp4").string(), *backend, *ops, o).isOk());
}

// [TAG_ATTN_F16] --dtype float16 needs a bf16 backend (CUDA) and the f32 stream: the fp32
// CPU reference refuses it by name instead of silently computing in fp32.
TEST(GptOssLoad, Fp16IsRefusedOnTheCpuBackend) {
  auto backend = makeBackend("cpu", BackendOptions{1, 0, 64}).value();
  auto ops = makeLlmOps(*backend, 1).value();
  GptOssOptions o;
  o.max_batch_tokens = 40;
  o.max_seqs = 4;
  o.max_logits_rows = 30;
  o.max_model_len = 48;
  o.attn_f16 = true;
  const Status st = GptOssModel::load(fixtureDir("mxfp4").string(), *backend, *ops, o).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--dtype float16 (attention)"), std::string::npos) << st.toString();
  EXPECT_NE(st.message().find("the cpu backend computes in F32"), std::string::npos)
      << st.toString();
  o.attn_f16 = false;
  o.moe_f16 = true;
  const Status moe = GptOssModel::load(fixtureDir("mxfp4").string(), *backend, *ops, o).status();
  EXPECT_EQ(moe.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(moe.message().find("--dtype float16 (MoE)"), std::string::npos) << moe.toString();
  o.moe_f16 = false;
  o.head_f16 = true;
  const Status head = GptOssModel::load(fixtureDir("mxfp4").string(), *backend, *ops, o).status();
  EXPECT_EQ(head.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(head.message().find("--dtype float16 (lm_head)"), std::string::npos) << head.toString();
  o.head_f16 = false;
  // [TAG_PROJ_F32] The f32 projections only come with the fp16 attention block.
  o.proj_f32 = true;
  const Status proj = GptOssModel::load(fixtureDir("mxfp4").string(), *backend, *ops, o).status();
  EXPECT_EQ(proj.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(proj.message().find("proj_f32: needs the fp16 attention block"), std::string::npos)
      << proj.toString();
  o.proj_f32 = false;
  auto m = GptOssModel::load(fixtureDir("mxfp4").string(), *backend, *ops, o);
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  EXPECT_EQ((*m)->kvDType(), DType::kF32);
}

// rose --dtype: the names and what float16 sets [TAG_ATTN_F16] [TAG_PROJ_F32].
TEST(GptOssLoad, DtypeNamesSetTheirOptions) {
  GptOssOptions o;
  EXPECT_TRUE(applyGptOssDtype("bfloat16", o));
  EXPECT_FALSE(o.attn_f16 || o.moe_f16 || o.head_f16 || o.moe_out_f32 || o.proj_f32);
  EXPECT_FALSE(applyGptOssDtype("float32", o));
  EXPECT_FALSE(applyGptOssDtype("", o));
  EXPECT_FALSE(o.attn_f16);
  EXPECT_TRUE(applyGptOssDtype("float16", o));
  EXPECT_TRUE(o.attn_f16 && o.moe_f16 && o.head_f16 && o.moe_out_f32 && o.proj_f32);
}

}  // namespace
}  // namespace garden::rose
