// rose's gpt-oss forward pass (CPU backend, paged KV cache) against Hugging Face transformers.
//
// fixtures/ was written by gen_fixtures.py (transformers 5.17, torch 2.11, float32 eager
// attention on the CPU; see fixtures/log.txt): a tiny random GptOssForCausalLM (4 layers
// alternating sliding window 8 / full, 4 experts top-2, 4 q heads / 2 kv heads of 16, hidden 32,
// YaRN as published, non-zero sinks and biases, clamps hit), saved both as a bf16 re-export
// (dense experts) and as the published MXFP4 layout, plus the logits transformers computed for
// two sequences (24 + 8 and 11 + 8 tokens: prompt + greedy continuation). Checked here, for both
// checkpoints and several KV block sizes:
//   - full-pass logits match transformers to 1e-4 relative (max |diff| / max |logit| per row);
//   - prefill + one-token decode steps with greedy sampling reproduce the greedy tokens;
//   - chunked prefill + decode give the same logits as one full pass;
//   - two sequences batched in one step (scattered block tables, mixed prefill/decode) give
//     the same logits as each alone;
//   - the MXFP4 experts dequantize to exactly the bf16 checkpoint's expert weights;
//   - YaRN frequencies / cos / sin match transformers' rotary embedding;
//   - bad steps and bad checkpoints are rejected with INVALID_ARGUMENT naming the problem.

#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/model/mxfp4.h"
#include "services/rose/model/rope.h"

namespace garden::rose {
namespace {

namespace fs = std::filesystem;

constexpr double kRelTol = 1e-4;

fs::path fixtures() {
  const char* src = std::getenv("GARDEN_SOURCE_DIR");
  fs::path root = src ? fs::path(src)
                      : fs::path(__FILE__).parent_path().parent_path().parent_path().parent_path();
  return root / "tests/conformance/gpt_oss/fixtures";
}

std::string readText(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct RefSeq {
  std::vector<int32_t> prompt, generated, all;
  std::vector<float> logits;  // [all.size(), vocab]
};

struct Expected {
  int64_t vocab = 0;
  std::vector<RefSeq> seqs;
  std::vector<float> inv_freq, cos, sin;
  std::vector<int32_t> rope_positions;
  double attention_scaling = 0;
  int64_t cos_width = 0;
};

const Expected& expected() {
  static const Expected e = [] {
    Expected x;
    simdjson::dom::parser parser;
    const std::string text = readText(fixtures() / "expected.json");
    simdjson::dom::element root = parser.parse(text).value();
    x.vocab = root["vocab_size"].get_int64().value();
    auto ints = [](simdjson::dom::element a) {
      std::vector<int32_t> v;
      for (auto i : a.get_array()) v.push_back(static_cast<int32_t>(i.get_int64().value()));
      return v;
    };
    auto floats = [](simdjson::dom::element a) {
      std::vector<float> v;
      for (auto i : a.get_array()) v.push_back(static_cast<float>(i.get_double().value()));
      return v;
    };
    auto st = SafetensorsFile::open((fixtures() / "expected.safetensors").string());
    if (!st.isOk()) {
      ADD_FAILURE() << st.status().toString();
      return x;
    }
    size_t i = 0;
    for (auto s : root["sequences"].get_array()) {
      RefSeq r;
      r.prompt = ints(s["prompt"].value());
      r.generated = ints(s["generated"].value());
      r.all = r.prompt;
      r.all.insert(r.all.end(), r.generated.begin(), r.generated.end());
      const TensorView* t = (*st)->find("seq" + std::to_string(i++) + ".logits");
      if (t == nullptr ||
          t->shape != std::vector<int64_t>{static_cast<int64_t>(r.all.size()), x.vocab}) {
        ADD_FAILURE() << "expected.safetensors lacks logits for sequence " << i - 1;
        return x;
      }
      r.logits = t->toF32().value();
      x.seqs.push_back(std::move(r));
    }
    auto rope = root["rope"];
    x.inv_freq = floats(rope["inv_freq"].value());
    x.attention_scaling = rope["attention_scaling"].get_double().value();
    x.rope_positions = ints(rope["positions"].value());
    x.cos = floats(rope["cos"].value());
    x.sin = floats(rope["sin"].value());
    x.cos_width = rope["cos_width"].get_int64().value();
    return x;
  }();
  return e;
}

// Max over rows of max|got − want| / max|want| of the row; rows [row0, row0 + n) of `want`.
double maxRowRelErr(const std::vector<float>& got, const std::vector<float>& want, int64_t row0,
                    int64_t n, int64_t vocab) {
  double worst = 0;
  for (int64_t r = 0; r < n; ++r) {
    double mx = 0, diff = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const double w = want[static_cast<size_t>((row0 + r) * vocab + v)];
      mx = std::max(mx, std::fabs(w));
      diff = std::max(diff, std::fabs(got[static_cast<size_t>(r * vocab + v)] - w));
    }
    worst = std::max(worst, diff / std::max(mx, 1e-30));
  }
  return worst;
}

// A model, its ops and a KV cache; sequences get blocks from a shuffled free list.
struct Harness {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LlmOps> ops;
  std::unique_ptr<GptOssModel> model;
  std::unique_ptr<PagedKvCache> kv;
  int32_t block_size = 0;
  std::vector<int32_t> free_blocks;

  static std::unique_ptr<Harness> make(const std::string& variant, int32_t block_size,
                                       int threads = 2) {
    auto h = std::make_unique<Harness>();
    BackendOptions bo;
    bo.threads = threads;
    h->backend = makeBackend("cpu", bo).value();
    h->ops = makeLlmOps(*h->backend, threads).value();
    GptOssOptions o;
    o.max_batch_tokens = 128;
    o.max_seqs = 8;
    o.max_logits_rows = 128;
    o.max_model_len = 64;
    o.min_block_size = 1;
    auto m = GptOssModel::load((fixtures() / variant).string(), *h->backend, *h->ops, o);
    EXPECT_TRUE(m.isOk()) << m.status().toString();
    if (!m.isOk()) return nullptr;
    h->model = std::move(m).value();
    const int32_t blocks = 2 * static_cast<int32_t>(kvBlocksFor(64, block_size)) + 3;
    h->kv = PagedKvCache::create(*h->backend, h->model->kvShape(blocks, block_size),
                                 h->model->kvDType())
                .value();
    h->block_size = block_size;
    h->free_blocks.resize(static_cast<size_t>(blocks));
    std::iota(h->free_blocks.begin(), h->free_blocks.end(), 0);
    std::mt19937 rng(static_cast<uint32_t>(block_size));
    std::shuffle(h->free_blocks.begin(), h->free_blocks.end(), rng);
    return h;
  }
};

struct Seq {
  std::vector<int32_t> table;
  int32_t pos = 0;
};

struct Req {
  Seq* seq;
  std::vector<int32_t> tokens;
  LogitsMode mode = LogitsMode::kAll;
  bool sample = false;
  SamplingParams sp;
};

struct StepOut {
  std::vector<float> logits;
  std::vector<int32_t> sampled;
};

// Builds the flat step, validates it, runs it through Backend::launch() like the engine, waits.
StepOut runStep(Harness& h, std::vector<Req> reqs) {
  std::vector<LlmStepSeq> seqs;
  std::vector<int32_t> tokens, blocks;
  for (Req& r : reqs) {
    const int64_t need =
        kvBlocksFor(r.seq->pos + static_cast<int64_t>(r.tokens.size()), h.block_size);
    while (static_cast<int64_t>(r.seq->table.size()) < need) {
      r.seq->table.push_back(h.free_blocks.back());
      h.free_blocks.pop_back();
    }
    LlmStepSeq s;
    s.token_offset = static_cast<int32_t>(tokens.size());
    s.num_tokens = static_cast<int32_t>(r.tokens.size());
    s.position = r.seq->pos;
    s.block_offset = static_cast<int32_t>(blocks.size());
    s.num_blocks = static_cast<int32_t>(r.seq->table.size());
    s.logits = r.mode;
    s.sample = r.sample ? 1 : 0;
    s.sampling = r.sp;
    tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
    blocks.insert(blocks.end(), r.seq->table.begin(), r.seq->table.end());
    seqs.push_back(s);
  }
  LlmStep step{seqs, tokens, blocks};
  Status st = h.model->validate(step, *h.kv);
  EXPECT_TRUE(st.isOk()) << st.toString();
  StepOut out;
  out.logits.resize(static_cast<size_t>(logitsRows(step) * h.model->vocabSize()));
  size_t n_sample = 0;
  for (const Req& r : reqs) n_sample += r.sample;
  out.sampled.assign(n_sample, -7);
  if (!st.isOk()) return out;
  h.backend->launch(
      [&] { h.model->enqueueStep(step, *h.kv, out.logits.data(), out.sampled.data()); });
  EXPECT_TRUE(h.backend->synchronize().isOk());
  for (Req& r : reqs) r.seq->pos += static_cast<int32_t>(r.tokens.size());
  return out;
}

class GptOssConformance : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    ASSERT_EQ(expected().seqs.size(), 2u);
    h_ = Harness::make(std::get<0>(GetParam()), std::get<1>(GetParam()));
    ASSERT_NE(h_, nullptr);
  }
  std::unique_ptr<Harness> h_;
};

TEST_P(GptOssConformance, FullPassLogitsMatchTransformers) {
  const Expected& e = expected();
  for (size_t i = 0; i < e.seqs.size(); ++i) {
    Seq s;
    StepOut o = runStep(*h_, {{&s, e.seqs[i].all}});
    const double err = maxRowRelErr(o.logits, e.seqs[i].logits, 0,
                                    static_cast<int64_t>(e.seqs[i].all.size()), e.vocab);
    std::cout << "[ gpt-oss ] " << std::get<0>(GetParam()) << " block " << std::get<1>(GetParam())
              << " seq" << i << " full pass: max row rel err " << err << "\n";
    EXPECT_LE(err, kRelTol) << "sequence " << i;
  }
}

TEST_P(GptOssConformance, GreedyDecodeReproducesTransformers) {
  const Expected& e = expected();
  for (size_t i = 0; i < e.seqs.size(); ++i) {
    const RefSeq& r = e.seqs[i];
    Seq s;
    std::vector<int32_t> got;
    StepOut o = runStep(*h_, {{&s, r.prompt, LogitsMode::kLast, true, SamplingParams{}}});
    got.push_back(o.sampled[0]);
    double worst =
        maxRowRelErr(o.logits, r.logits, static_cast<int64_t>(r.prompt.size()) - 1, 1, e.vocab);
    while (got.size() < r.generated.size()) {
      o = runStep(*h_, {{&s, {got.back()}, LogitsMode::kLast, true, SamplingParams{}}});
      worst = std::max(worst, maxRowRelErr(o.logits, r.logits, s.pos - 1, 1, e.vocab));
      got.push_back(o.sampled[0]);
    }
    EXPECT_EQ(got, r.generated) << "sequence " << i;
    EXPECT_LE(worst, kRelTol) << "sequence " << i;
  }
}

TEST_P(GptOssConformance, ChunkedPrefillAndDecodeEqualOneFullPass) {
  const Expected& e = expected();
  const RefSeq& r = e.seqs[0];  // 32 tokens: chunks 5, 1, 9, 3 (prompt: 18 ... ) then decode
  Seq full_seq;
  const StepOut full = runStep(*h_, {{&full_seq, r.all}});
  const std::vector<int> chunks = {5, 1, 9, 3, 6, 1, 1, 1, 1, 1, 1, 1, 1};
  ASSERT_EQ(std::accumulate(chunks.begin(), chunks.end(), 0), static_cast<int>(r.all.size()));
  Seq s;
  std::vector<float> joined;
  int at = 0;
  for (int c : chunks) {
    std::vector<int32_t> toks(r.all.begin() + at, r.all.begin() + at + c);
    StepOut o = runStep(*h_, {{&s, toks}});
    joined.insert(joined.end(), o.logits.begin(), o.logits.end());
    at += c;
  }
  ASSERT_EQ(joined.size(), full.logits.size());
  const double self =
      maxRowRelErr(joined, full.logits, 0, static_cast<int64_t>(r.all.size()), e.vocab);
  const double ref = maxRowRelErr(joined, r.logits, 0, static_cast<int64_t>(r.all.size()), e.vocab);
  std::cout << "[ gpt-oss ] chunked vs one pass: max row rel err " << self << "; vs transformers "
            << ref << "\n";
  EXPECT_LE(self, 1e-5);
  EXPECT_LE(ref, kRelTol);
}

TEST_P(GptOssConformance, BatchedSequencesEqualEachAlone) {
  const Expected& e = expected();
  const RefSeq& a = e.seqs[0];
  const RefSeq& b = e.seqs[1];
  Seq sa, sb;
  // Step 1: both prompts together (blocks interleave in the free list).
  StepOut o1 = runStep(*h_, {{&sa, a.prompt}, {&sb, b.prompt}});
  const int64_t na = static_cast<int64_t>(a.prompt.size()),
                nb = static_cast<int64_t>(b.prompt.size());
  std::vector<float> la(o1.logits.begin(), o1.logits.begin() + na * e.vocab);
  std::vector<float> lb(o1.logits.begin() + na * e.vocab, o1.logits.end());
  EXPECT_LE(maxRowRelErr(la, a.logits, 0, na, e.vocab), kRelTol);
  EXPECT_LE(maxRowRelErr(lb, b.logits, 0, nb, e.vocab), kRelTol);
  // Step 2: decode one token of a, and b's whole continuation as a chunk, sampling a greedily.
  std::vector<int32_t> b_rest(b.generated.begin(), b.generated.end());
  StepOut o2 = runStep(*h_, {{&sa, {a.generated[0]}, LogitsMode::kLast, true, SamplingParams{}},
                             {&sb, b_rest, LogitsMode::kAll, false, SamplingParams{}}});
  ASSERT_EQ(o2.sampled.size(), 1u);
  EXPECT_EQ(o2.sampled[0], a.generated[1]);
  std::vector<float> l2a(o2.logits.begin(), o2.logits.begin() + e.vocab);
  std::vector<float> l2b(o2.logits.begin() + e.vocab, o2.logits.end());
  EXPECT_LE(maxRowRelErr(l2a, a.logits, na, 1, e.vocab), kRelTol);
  EXPECT_LE(maxRowRelErr(l2b, b.logits, nb, static_cast<int64_t>(b_rest.size()), e.vocab), kRelTol);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, GptOssConformance,
                         ::testing::Combine(::testing::Values(std::string("bf16"),
                                                              std::string("mxfp4")),
                                            ::testing::Values(1, 4, 16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_block" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(GptOssFixtures, Mxfp4ExpertsDequantizeToTheBf16Weights) {
  auto dense = SafetensorsCheckpoint::openDir((fixtures() / "bf16").string());
  auto packed = SafetensorsCheckpoint::openDir((fixtures() / "mxfp4").string());
  ASSERT_TRUE(dense.isOk() && packed.isOk());
  int checked = 0;
  for (int l = 0; l < 4; ++l) {
    for (std::string key : {"gate_up_proj", "down_proj"}) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts." + key;
      const TensorView* b = (*packed)->find(p + "_blocks");
      const TensorView* s = (*packed)->find(p + "_scales");
      const TensorView* d = (*dense)->find(p);
      ASSERT_TRUE(b && s && d) << p;
      auto shape = checkMxfp4(*b, *s);
      ASSERT_TRUE(shape.isOk()) << shape.status().toString();
      const int64_t e = shape->prefix[0], out = shape->prefix[1], in = shape->groups * 32;
      ASSERT_EQ(d->shape, (std::vector<int64_t>{e, in, out})) << p;  // transformers' [E, in, out]
      std::vector<float> deq(static_cast<size_t>(e * out * in));
      dequantizeMxfp4(reinterpret_cast<const uint8_t*>(b->data),
                      reinterpret_cast<const uint8_t*>(s->data), e * out, shape->groups,
                      deq.data());
      const std::vector<float> ref = d->toF32().value();
      for (int64_t x = 0; x < e; ++x) {
        for (int64_t o = 0; o < out; ++o) {
          for (int64_t i = 0; i < in; ++i) {
            ASSERT_EQ(deq[static_cast<size_t>((x * out + o) * in + i)],
                      ref[static_cast<size_t>((x * in + i) * out + o)])
                << p << " [" << x << "," << o << "," << i << "]";
          }
        }
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 8);
}

TEST(GptOssFixtures, YarnMatchesTransformersRotaryEmbedding) {
  const Expected& e = expected();
  auto cfg = loadGptOssConfig((fixtures() / "bf16").string());
  ASSERT_TRUE(cfg.isOk()) << cfg.status().toString();
  EXPECT_EQ(cfg->rope.type, "yarn");
  EXPECT_FALSE(cfg->rope.truncate);
  auto f = computeRopeFrequencies(cfg->base.head_dim, cfg->base.rope_theta, cfg->rope,
                                  cfg->base.max_position_embeddings);
  ASSERT_TRUE(f.isOk());
  ASSERT_EQ(f->inv_freq.size(), e.inv_freq.size());
  for (size_t i = 0; i < e.inv_freq.size(); ++i) {
    EXPECT_NEAR(f->inv_freq[i], e.inv_freq[i], 1e-6 * e.inv_freq[i]) << i;
  }
  EXPECT_NEAR(f->attention_scaling, e.attention_scaling, 1e-7);
  const int64_t half = static_cast<int64_t>(f->inv_freq.size());
  ASSERT_EQ(e.cos_width, half);
  const int64_t n = *std::max_element(e.rope_positions.begin(), e.rope_positions.end()) + 1;
  std::vector<float> c(static_cast<size_t>(n * half)), s(c.size());
  buildRopeTables(*f, n, c.data(), s.data());
  for (size_t k = 0; k < e.rope_positions.size(); ++k) {
    const int64_t p = e.rope_positions[k];
    for (int64_t i = 0; i < half; ++i) {
      const double tol = 1e-6 + 2e-7 * static_cast<double>(p);
      EXPECT_NEAR(c[static_cast<size_t>(p * half + i)],
                  e.cos[k * static_cast<size_t>(half) + static_cast<size_t>(i)], tol)
          << p << "," << i;
      EXPECT_NEAR(s[static_cast<size_t>(p * half + i)],
                  e.sin[k * static_cast<size_t>(half) + static_cast<size_t>(i)], tol)
          << p << "," << i;
    }
  }
  // Layers alternate sliding / full starting with sliding.
  EXPECT_EQ(cfg->sliding, (std::vector<uint8_t>{1, 0, 1, 0}));
  EXPECT_EQ(cfg->base.sliding_window, 8);
}

}  // namespace
}  // namespace garden::rose
