// The sharded gpt-oss (services/rose/parallel/gpt_oss_shard.h) against the unsharded CPU
// reference (GptOssModel) on tiny random checkpoints (rose-mkmodel's writer, MXFP4 experts),
// every layout of 1, 2, 4 and 8 ranks: tp x dp x ep with ep | tp·dp (tp where heads divide).
// Ranks are threads, each with its own CPU backend and cache, talking through LocalCommGroup.
//
// What must hold:
//   - one rank (tp = dp = ep = 1) computes the same bits as GptOssModel (same ops, same order);
//   - every layout: per-layer outputs (attention block after its all-reduce, MoE block after its
//     combine) of a prefill within kLayerTol of the one-rank run, the logits of every step
//     within kLogitTol of GptOssModel's, and the greedy tokens identical over 40 decode steps of
//     three sequences (prompts of 5, 17 and 11 tokens, decode batched, sliding window 8 crossed).
// Shape A (gpt-oss's 64 q / 8 kv heads) runs all 30 layouts; shape B (16 q / 2 kv, 16 experts)
// the 6 where its differences matter (kv heads replicated at tp 4 and 8, ep 8 with 2 experts per
// group, dispatch across dp groups) — the whole sweep of both costs minutes on a loaded CPU.
// Tolerance: the reference is fp32. Sharding changes only the order of fp32 additions: the
// O projection and the expert down projection are summed as per-rank partial sums (all-reduce
// in rank order), expert outputs are combined per pair and then across ranks, the embedding
// arrives as a sum with zeros. Each reordered sum of m terms of size ≤ A moves by at most
// ~m·2⁻²⁴·A; here m ≤ 1024 (Hq·D), activations are O(1), and the error compounds through 4
// layers and the RMSNorms — measured worst differences are ~1e-6 relative (printed), the bound
// asserted is 5e-5 relative to the tensor's largest magnitude (1e-4 absolute on logits of
// magnitude ~1-5), far below any real discrepancy (a wrong head, expert or bias moves outputs by
// O(0.1)).

#include "services/rose/parallel/gpt_oss_shard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <span>
#include <thread>

#include "services/rose/model/gpt_oss.h"
#include "services/rose/parallel/staged_comm.h"
#include "services/rose/tools/mkmodel_gpt_oss.h"
#include "tests/support/gpt_oss_steps.h"

namespace garden::rose {
namespace {

namespace fs = std::filesystem;

constexpr double kLayerTol = 5e-5;  // relative to the tensor's max |value|
constexpr double kLogitTol = 1e-4;  // relative to the step's max |logit|, at least 1
constexpr int kDecodeSteps = 32;
constexpr int32_t kBlock = 4;
constexpr int32_t kBlocksPerGroup = 48;

struct ModelShape {
  const char* name;
  int64_t heads, kv_heads, head_dim, hidden, inter, experts;
};
// A: gpt-oss's head layout (64 q / 8 kv, GQA group 8). B: 16 q / 2 kv (kv heads replicated at
// tp 4 and 8), 16 experts.
const ModelShape kShapes[] = {{"a", 64, 8, 16, 64, 256, 8}, {"b", 16, 2, 32, 96, 256, 16}};

std::string makeModel(const ModelShape& s) {
  const std::string dir = (fs::temp_directory_path() /
                           ("garden_shard_" + std::string(s.name) + "_" + std::to_string(getpid())))
                              .string();
  MkGptOssOptions o;
  o.out_dir = dir;
  o.seed = 11;
  o.vocab_size = 201091;  // > the Harmony ids mkmodel writes; splits unevenly over 2, 4, 8 ranks
  o.hidden_size = s.hidden;
  o.num_layers = 4;
  o.num_heads = s.heads;
  o.num_kv_heads = s.kv_heads;
  o.head_dim = s.head_dim;
  o.intermediate_size = s.inter;
  o.num_experts = s.experts;
  o.experts_per_token = 4;
  o.sliding_window = 8;
  const Status st = makeGptOssModel(o);
  EXPECT_TRUE(st.isOk()) << st.toString();
  return dir;
}

GptOssOptions options() {
  GptOssOptions o;
  o.max_batch_tokens = 64;
  o.max_seqs = 4;
  o.max_logits_rows = 4;
  o.max_model_len = 96;
  o.min_block_size = kBlock;
  return o;
}

using testsupport::makeStep;
using testsupport::Seq;
using testsupport::StepData;

// [TAG_KV_WINDOW_GROUP] The same step with window tables (the models' window is 8 keys): each
// sequence's window table follows its table, a hole (-1) for every block whose positions the
// step's first query no longer reads, else the window pool's id of its dp group (B window blocks
// per group, ids rotated by 7 inside the group so they differ from the full ids).
StepData withWindowTables(const StepData& d, const std::vector<Seq>& seqs) {
  constexpr int32_t kWindow = 8;
  StepData w;
  w.seqs = d.seqs;
  w.tokens = d.tokens;
  for (size_t i = 0; i < seqs.size(); ++i) {
    LlmStepSeq& q = w.seqs[i];
    q.block_offset = static_cast<int32_t>(w.blocks.size());
    q.window_table = 1;
    const std::vector<int32_t>& b = seqs[i].blocks;
    w.blocks.insert(w.blocks.end(), b.begin(), b.end());
    for (size_t bi = 0; bi < b.size(); ++bi) {
      const int32_t g = b[bi] / kBlocksPerGroup, local = b[bi] % kBlocksPerGroup;
      const bool dropped = static_cast<int32_t>(bi + 1) * kBlock <= q.position - kWindow + 1;
      w.blocks.push_back(dropped ? -1 : g * kBlocksPerGroup + (local + 7) % kBlocksPerGroup);
    }
  }
  return w;
}

// Sequence i's blocks lie in dp group i % dp: ids [g·B, (g+1)·B).
std::vector<Seq> prompts(int32_t dp) {
  return testsupport::groupedPrompts({5, 17, 11}, 1002, 5, dp, kBlock, kBlocksPerGroup,
                                     kDecodeSteps + 1);
}

struct Trace {
  std::vector<std::vector<float>> logits;  // per step [seqs, vocab]
  std::vector<std::vector<int32_t>> tokens;
  LayerTap prefill_tap;  // (sharded runs) merged over the dp groups, in step token order
};

double maxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}
double maxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return m;
}

// The unsharded reference: prefill then greedy decode, every sequence every step.
Trace runReference(const std::string& dir, int32_t dp) {
  auto backend = makeBackend("cpu", BackendOptions{1, 0, 64}).value();
  auto ops = makeLlmOps(*backend, 1).value();
  auto model = GptOssModel::load(dir, *backend, *ops, options()).value();
  auto kv =
      PagedKvCache::create(*backend, model->kvShape(kBlocksPerGroup * dp, kBlock), model->kvDType())
          .value();
  std::vector<Seq> seqs = prompts(dp);
  Trace tr;
  for (int step = 0; step <= kDecodeSteps; ++step) {
    const StepData d = makeStep(seqs);
    const Status st = model->validate(d.view(), *kv);
    EXPECT_TRUE(st.isOk()) << st.toString();
    std::vector<float> logits(seqs.size() * static_cast<size_t>(model->vocabSize()));
    std::vector<int32_t> sampled(seqs.size());
    model->enqueueStep(d.view(), *kv, logits.data(), sampled.data());
    EXPECT_TRUE(backend->synchronize().isOk());
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].computed = static_cast<int32_t>(seqs[i].tokens.size());
      seqs[i].tokens.push_back(sampled[i]);
    }
    tr.logits.push_back(std::move(logits));
    tr.tokens.push_back(std::move(sampled));
  }
  return tr;
}

// The sharded model, one thread per rank; rank 0's outputs drive the next step.
// window: the sliding layers in a window pool of B blocks per dp group (withWindowTables).
// staged: every collective through StagedCommunicator over host-only LocalCommGroup ends (what
// CUDA ranks use [TAG_STAGED_COMM]) instead of the ends bound to the backends.
Trace runSharded(const std::string& dir, const ParallelConfig& par, bool use_prev_row,
                 bool window = false, bool staged = false) {
  const int32_t n = par.world();
  struct Rank {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<LlmOps> ops;
    std::unique_ptr<ShardOps> shard_ops;
    std::unique_ptr<GptOssShard> model;
    std::unique_ptr<PagedKvCache> kv;
    LayerTap tap;
  };
  std::vector<Rank> ranks(static_cast<size_t>(n));
  std::vector<Backend*> backends;
  for (Rank& r : ranks) {
    r.backend = makeBackend("cpu", BackendOptions{1, 0, 64}).value();
    r.ops = makeLlmOps(*r.backend, 1).value();
    r.shard_ops = makeShardOps(*r.backend).value();
    backends.push_back(r.backend.get());
  }
  // Staged: the host ends get no backend (the wrapper synchronizes and copies).
  const std::vector<Backend*> none(static_cast<size_t>(n), nullptr);
  const std::vector<Backend*>& bound = staged ? none : backends;
  auto world = LocalCommGroup::create(n, bound);
  std::vector<std::vector<std::unique_ptr<Communicator>>> tp_groups;
  for (int32_t g = 0; g < par.dp; ++g) {
    tp_groups.push_back(LocalCommGroup::create(
        par.tp, std::span<Backend* const>(bound.data() + g * par.tp, par.tp)));
  }
  if (staged) {
    for (int32_t r = 0; r < n; ++r) {
      Backend& b = *backends[static_cast<size_t>(r)];
      auto& w = world[static_cast<size_t>(r)];
      w = std::make_unique<StagedCommunicator>(std::move(w), b);
      auto& t = tp_groups[static_cast<size_t>(r / par.tp)][static_cast<size_t>(r % par.tp)];
      t = std::make_unique<StagedCommunicator>(std::move(t), b);
    }
  }
  for (int32_t r = 0; r < n; ++r) {
    Rank& k = ranks[static_cast<size_t>(r)];
    ShardComms comms{
        world[static_cast<size_t>(r)].get(),
        tp_groups[static_cast<size_t>(r / par.tp)][static_cast<size_t>(r % par.tp)].get()};
    auto m = GptOssShard::load(dir, *k.backend, *k.ops, *k.shard_ops, options(), par, r, comms);
    EXPECT_TRUE(m.isOk()) << m.status().toString();
    if (!m.isOk()) return {};
    k.model = std::move(m).value();
    k.kv = PagedKvCache::create(*k.backend,
                                k.model->kvShape(kBlocksPerGroup, kBlock,
                                                 window ? kBlocksPerGroup : 0),
                                k.model->kvDType())
               .value();
  }
  std::vector<Seq> seqs = prompts(par.dp);
  Trace tr;
  const int64_t vocab = ranks[0].model->vocabSize();
  for (int step = 0; step <= kDecodeSteps; ++step) {
    StepData d = makeStep(seqs);
    if (window) d = withWindowTables(d, seqs);
    if (use_prev_row && step > 0) {
      for (size_t i = 0; i < d.seqs.size(); ++i) {
        d.seqs[i].prev_row = static_cast<int32_t>(i);  // the token comes from last step's ids
        d.tokens[static_cast<size_t>(d.seqs[i].token_offset)] = -1;
      }
    }
    std::vector<float> logits(seqs.size() * static_cast<size_t>(vocab));
    std::vector<int32_t> sampled(seqs.size(), -1);
    std::vector<std::thread> threads;
    std::vector<Status> status(static_cast<size_t>(n), okStatus());
    for (int32_t r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        Rank& k = ranks[static_cast<size_t>(r)];
        status[static_cast<size_t>(r)] = k.model->validate(d.view(), *k.kv);
        if (!status[static_cast<size_t>(r)].isOk()) return;  // every rank agrees (same step)
        k.model->setLayerTap(step == 0 ? &k.tap : nullptr);
        k.model->enqueueStep(d.view(), *k.kv, r == 0 ? logits.data() : nullptr,
                             r == 0 ? sampled.data() : nullptr);
        status[static_cast<size_t>(r)] = k.backend->synchronize();
      });
    }
    for (auto& t : threads) t.join();
    for (const Status& s : status) EXPECT_TRUE(s.isOk()) << s.toString();
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].computed = static_cast<int32_t>(seqs[i].tokens.size());
      seqs[i].tokens.push_back(sampled[i]);
    }
    tr.logits.push_back(std::move(logits));
    tr.tokens.push_back(std::move(sampled));
  }
  // Prefill taps: tp rank 0 of each dp group holds its group's tokens.
  int64_t total_tokens = 0;
  for (const Seq& s : prompts(par.dp)) total_tokens += static_cast<int64_t>(s.tokens.size());
  const int64_t h = ranks[0].model->config().base.hidden_size;
  const size_t layers = ranks[0].tap.attn.size();
  tr.prefill_tap.attn.assign(layers, std::vector<float>(static_cast<size_t>(total_tokens * h)));
  tr.prefill_tap.moe = tr.prefill_tap.attn;
  for (int32_t g = 0; g < par.dp; ++g) {
    const LayerTap& tap = ranks[static_cast<size_t>(g * par.tp)].tap;
    for (size_t l = 0; l < layers; ++l) {
      for (size_t i = 0; i < tap.token.size(); ++i) {
        for (int64_t c = 0; c < h; ++c) {
          const size_t dst = static_cast<size_t>(tap.token[i] * h + c);
          tr.prefill_tap.attn[l][dst] = tap.attn[l][i * static_cast<size_t>(h) + c];
          tr.prefill_tap.moe[l][dst] = tap.moe[l][i * static_cast<size_t>(h) + c];
        }
      }
    }
  }
  return tr;
}

bool isShapeBLayout(const ParallelConfig& p) {
  const ParallelConfig picks[] = {{1, 1, 1}, {4, 1, 4}, {8, 1, 1}, {8, 1, 8},
                                  {4, 2, 8}, {2, 4, 8}, {1, 8, 8}};
  for (const ParallelConfig& q : picks) {
    if (q.tp == p.tp && q.dp == p.dp && q.ep == p.ep) return true;
  }
  return false;
}

class GptOssShardTest : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    for (const ModelShape& s : kShapes) dirs_.push_back(makeModel(s));
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    for (const auto& d : dirs_) fs::remove_all(d, ec);
    dirs_.clear();
  }
  static std::vector<std::string> dirs_;
};
std::vector<std::string> GptOssShardTest::dirs_;

TEST_P(GptOssShardTest, EveryLayoutMatchesTheUnshardedModel) {
  const ModelShape& shape = kShapes[GetParam()];
  const std::string& dir = dirs_[static_cast<size_t>(GetParam())];
  // One rank is the unsharded model, bit for bit (the sharded code path at world 1).
  const Trace ref1 = runReference(dir, 1);
  const Trace one = runSharded(dir, ParallelConfig{1, 1, 1}, false);
  ASSERT_EQ(one.logits.size(), ref1.logits.size());
  for (size_t s = 0; s < ref1.logits.size(); ++s) {
    ASSERT_EQ(one.logits[s], ref1.logits[s]) << "step " << s;
    ASSERT_EQ(one.tokens[s], ref1.tokens[s]) << "step " << s;
  }
  // The reference's own margins: the greedy comparison means something only where the top two
  // logits are apart by more than the tolerance.
  double min_margin = 1e9;
  for (const auto& l : ref1.logits) {
    const int64_t v = static_cast<int64_t>(l.size() / 3);
    for (int i = 0; i < 3; ++i) {
      float a = -1e30f, b = -1e30f;
      for (int64_t j = 0; j < v; ++j) {
        const float x = l[static_cast<size_t>(i * v + j)];
        if (x > a) {
          b = a;
          a = x;
        } else if (x > b) {
          b = x;
        }
      }
      min_margin = std::min(min_margin, static_cast<double>(a - b));
    }
  }
  std::printf("[%s] reference: smallest top-2 logit margin over %d steps x 3 seqs: %.3g\n",
              shape.name, kDecodeSteps + 1, min_margin);

  int tested = 0;
  for (int32_t world : {1, 2, 4, 8}) {
    for (int32_t tp = 1; tp <= world; tp *= 2) {
      for (int32_t ep = 1; ep <= world; ep *= 2) {
        const ParallelConfig par{tp, world / tp, ep};
        if (GetParam() == 1 && !isShapeBLayout(par)) continue;
        if (!checkParallelConfig(par, shape.heads, shape.kv_heads, shape.experts, shape.inter,
                                 201091)
                 .isOk()) {
          continue;
        }
        SCOPED_TRACE(std::string(shape.name) + " tp " + std::to_string(tp) + " dp " +
                     std::to_string(par.dp) + " ep " + std::to_string(ep));
        // Block ids (which differ with dp) do not enter the math: the one-rank runs serve all.
        const Trace& ref = ref1;
        const Trace& base = one;
        // prev_row on the layouts with dp > 1 and tp > 1 (the broadcast of sampled ids).
        const Trace got = runSharded(dir, par, par.dp > 1 && tp > 1);
        ASSERT_EQ(got.tokens.size(), ref.tokens.size());
        double worst_layer = 0, worst_logit = 0;
        for (size_t l = 0; l < base.prefill_tap.attn.size(); ++l) {
          const double sa = maxAbs(base.prefill_tap.attn[l]), sm = maxAbs(base.prefill_tap.moe[l]);
          const double da = maxDiff(got.prefill_tap.attn[l], base.prefill_tap.attn[l]) / sa;
          const double dm = maxDiff(got.prefill_tap.moe[l], base.prefill_tap.moe[l]) / sm;
          EXPECT_LE(da, kLayerTol) << "layer " << l << " attention";
          EXPECT_LE(dm, kLayerTol) << "layer " << l << " moe";
          worst_layer = std::max({worst_layer, da, dm});
        }
        for (size_t s = 0; s < ref.tokens.size(); ++s) {
          ASSERT_EQ(got.tokens[s], ref.tokens[s]) << "greedy tokens differ at step " << s;
          const double scale = std::max(1.0, maxAbs(ref.logits[s]));
          const double d = maxDiff(got.logits[s], ref.logits[s]) / scale;
          EXPECT_LE(d, kLogitTol) << "step " << s;
          worst_logit = std::max(worst_logit, d);
        }
        std::printf(
            "[%s] tp %d dp %d ep %d: worst per-layer rel diff %.2e, worst logit rel diff "
            "%.2e, %zu steps of greedy tokens identical\n",
            shape.name, tp, par.dp, ep, worst_layer, worst_logit, ref.tokens.size());
        ++tested;
      }
    }
  }
  // 1 + 4 + 9 + 16 layouts exist up to 8 ranks; every tp divides both shapes' heads.
  EXPECT_EQ(tested, GetParam() == 0 ? 30 : 7);
}

// [TAG_KV_WINDOW_GROUP] The sliding layers from a window pool per dp group (holes once a
// sequence passes its window, ids of its own group) give the same logits bits and tokens as
// every layer in one pool, on the same layout: the sharded math is the same, only where K/V live
// differs.
TEST(GptOssShardWindow, WindowPoolGivesTheSameBitsAsOnePool) {
  const std::string dir = makeModel(ModelShape{"w", 64, 8, 16, 64, 256, 8});
  for (const ParallelConfig par : {ParallelConfig{1, 1, 1}, ParallelConfig{2, 2, 2},
                                   ParallelConfig{1, 4, 4}, ParallelConfig{4, 2, 1}}) {
    SCOPED_TRACE("tp " + std::to_string(par.tp) + " dp " + std::to_string(par.dp) + " ep " +
                 std::to_string(par.ep));
    const Trace one = runSharded(dir, par, false, false);
    const Trace two = runSharded(dir, par, false, true);
    ASSERT_EQ(one.logits.size(), two.logits.size());
    for (size_t st = 0; st < one.logits.size(); ++st) {
      ASSERT_EQ(one.logits[st], two.logits[st]) << "step " << st;
      ASSERT_EQ(one.tokens[st], two.tokens[st]) << "step " << st;
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// [TAG_STAGED_COMM] Collectives staged through host copies (the path of CUDA ranks) give the
// same logits bits and tokens as the backend-bound ones: the same host sums in the same order,
// only where the operands are copied differs. Layouts with every collective: the tp all-reduce,
// the vocabulary slices (embedding all-reduce, logit all-gather), the expert all-to-all and the
// broadcast of sampled ids (dp > 1 with tp > 1 uses prev_row).
TEST(GptOssShardStaged, StagedCollectivesGiveTheSameBits) {
  const std::string dir = makeModel(ModelShape{"s", 64, 8, 16, 64, 256, 8});
  for (const ParallelConfig par : {ParallelConfig{2, 1, 1}, ParallelConfig{2, 1, 2},
                                   ParallelConfig{2, 2, 4}, ParallelConfig{1, 2, 2}}) {
    SCOPED_TRACE("tp " + std::to_string(par.tp) + " dp " + std::to_string(par.dp) + " ep " +
                 std::to_string(par.ep));
    const bool prev_row = par.dp > 1 && par.tp > 1;
    const Trace direct = runSharded(dir, par, prev_row, false, false);
    const Trace staged = runSharded(dir, par, prev_row, false, true);
    ASSERT_EQ(direct.logits.size(), static_cast<size_t>(kDecodeSteps + 1));
    ASSERT_EQ(direct.logits.size(), staged.logits.size());
    for (size_t st = 0; st < direct.logits.size(); ++st) {
      ASSERT_EQ(direct.logits[st], staged.logits[st]) << "step " << st;
      ASSERT_EQ(direct.tokens[st], staged.tokens[st]) << "step " << st;
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GptOssShardTest, ::testing::Values(0, 1),
                         [](const auto& info) { return std::string(kShapes[info.param].name); });

// Layout errors are INVALID_ARGUMENT naming the flag; a step whose sequence straddles dp groups
// is refused.
TEST(GptOssShardErrors, ClearErrors) {
  const std::string dir = makeModel(kShapes[0]);
  auto backend = makeBackend("cpu", BackendOptions{1, 0, 64}).value();
  auto ops = makeLlmOps(*backend, 1).value();
  auto so = makeShardOps(*backend).value();
  std::vector<Backend*> bs = {backend.get()};
  auto w1 = LocalCommGroup::create(1, bs);
  auto bad = GptOssShard::load(dir, *backend, *ops, *so, options(), ParallelConfig{3, 1, 1}, 0,
                               ShardComms{w1[0].get(), w1[0].get()});
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--tp 3"), std::string::npos);
  auto mismatch = GptOssShard::load(dir, *backend, *ops, *so, options(), ParallelConfig{2, 1, 1}, 0,
                                    ShardComms{w1[0].get(), w1[0].get()});
  ASSERT_FALSE(mismatch.isOk());
  EXPECT_NE(mismatch.status().message().find("communicators"), std::string::npos);
  GptOssOptions f16 = options();  // [TAG_ATTN_F16] not for a sharded model
  f16.attn_f16 = true;
  auto half = GptOssShard::load(dir, *backend, *ops, *so, f16, ParallelConfig{1, 1, 1}, 0,
                                ShardComms{w1[0].get(), w1[0].get()});
  ASSERT_FALSE(half.isOk());
  EXPECT_EQ(half.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(half.status().message().find("--dtype float16"), std::string::npos);
  // A dp 2 layout of 2 ranks; rank 0's view of a straddling sequence.
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<std::unique_ptr<LlmOps>> owned_ops;
  std::vector<std::unique_ptr<ShardOps>> owned_so;
  std::vector<Backend*> two;
  for (int i = 0; i < 2; ++i) {
    owned.push_back(makeBackend("cpu", BackendOptions{1, 0, 64}).value());
    owned_ops.push_back(makeLlmOps(*owned.back(), 1).value());
    owned_so.push_back(makeShardOps(*owned.back()).value());
    two.push_back(owned.back().get());
  }
  auto world = LocalCommGroup::create(2, two);
  auto tp0 = LocalCommGroup::create(1, std::span<Backend* const>(two.data(), 1));
  auto m = GptOssShard::load(dir, *owned[0], *owned_ops[0], *owned_so[0], options(),
                             ParallelConfig{1, 2, 2}, 0, ShardComms{world[0].get(), tp0[0].get()})
               .value();
  auto kv = PagedKvCache::create(*owned[0], m->kvShape(8, kBlock), m->kvDType()).value();
  std::vector<LlmStepSeq> seqs(1);
  seqs[0].num_tokens = 6;
  seqs[0].num_blocks = 2;
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> blocks = {7, 8};  // block 7 in group 0, block 8 in group 1
  const Status st = m->validate(LlmStep{seqs, tokens, blocks}, *kv);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("another dp group"), std::string::npos) << st.toString();
  const std::vector<int32_t> ok_blocks = {9, 15};
  EXPECT_TRUE(m->validate(LlmStep{seqs, tokens, ok_blocks}, *kv).isOk());
  const std::vector<int32_t> outside = {9, 16};  // 2 groups x 8 blocks
  EXPECT_NE(m->validate(LlmStep{seqs, tokens, outside}, *kv).message().find("outside the cache"),
            std::string::npos);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace garden::rose
