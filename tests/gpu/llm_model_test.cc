// gpt-oss end to end on the CUDA backend against the CPU fp32 reference, on a tiny random
// checkpoint shaped to exercise the GPU path (rose-mkmodel's gpt-oss writer: head_dim 64, GQA
// group 8 as published, hidden 288 and intermediate 160 — not multiples of 128, odd MXFP4 group
// counts —, 8 experts top-4, 4 layers alternating sliding (window 16) / full, the real vocabulary):
//   * teacher-forced logits (decode steps and one prefill pass) on the CPU's greedy tokens for
//     prompts of 5..1000 tokens, and free-running generation, without a routing choice (tight
//     bounds) and with it (the bf16 bar; tests/gpu/hf_llm_bar.py measures Hugging Face there);
//   * chunked prefill + decode equals one full pass; a prefix-cache hit (blocks shared with
//     another sequence) equals a miss; a sequence's tokens do not depend on the batch;
//   * the MXFP4-resident experts and the bf16 (dequantized) experts give the same logits bits;
//   * --moe-weights fp8 (the FP8 expert copy) tracks the MXFP4 path (agreement reported).
//   * --moe-prefill cublas (the bf16 cuBLASLt MoE path) tracks the tiled kernels.
// Label `gpu`.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "services/rose/model/gpt_oss.h"
#include "services/rose/ops/cuda/cuda_backend.h"
#include "services/rose/ops/cuda/gemm.h"
#include "services/rose/ops/cuda/llm_ops_cuda.h"
#include "services/rose/ops/cuda/moe_lt_gemm.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/ops/paged_kv_cache.h"
#include "services/rose/tools/mkmodel_gpt_oss.h"
#include "tests/support/gpt_oss_tiny.h"
#include "tests/gpu/gpu_test_util.h"

namespace garden::rose::gputest {
namespace {

namespace fs = std::filesystem;

constexpr int32_t kBlock = 16;
constexpr int32_t kBlocks = 1024;  // 16k tokens of cache

// One model on one backend with its own KV cache and a trivial block allocator.
struct Runner {
  std::shared_ptr<Backend> backend;
  std::shared_ptr<LlmOps> ops;
  std::unique_ptr<GptOssModel> model;
  std::unique_ptr<PagedKvCache> kv;
  int32_t next_block = 0;

  std::vector<int32_t> allocBlocks(int32_t n) {
    std::vector<int32_t> b(static_cast<size_t>(n));
    std::iota(b.begin(), b.end(), next_block);
    next_block += n;
    EXPECT_LE(next_block, kBlocks);
    return b;
  }
};

// The 16-bit activation choices the fp16 tests compare [TAG_ATTN_F16]: bf16 (the default), the
// attention block in fp16, every part in fp16 with 16-bit projection / MoE outputs, and rose's
// --dtype float16 (the same with the QKV / O-proj / MoE outputs kept in f32 [TAG_PROJ_F32]).
// kNone follows GARDEN_TEST_GPTOSS_DTYPE; kBf16 stays bf16 under it (the bf16 baseline, and the
// tests of paths that run on bf16 activations only: the FP8 and bf16 cuBLASLt experts).
enum class F16 { kNone, kAttn, kAll16, kDtype, kBf16 };

// GARDEN_TEST_GPTOSS_DTYPE=float16 [TAG_ATTN_F16].
bool fp16Everywhere() {
  const char* v = std::getenv("GARDEN_TEST_GPTOSS_DTYPE");
  return v != nullptr && std::string(v) == "float16";
}

// [TAG_PDL_GEMV] CudaKernelOptions::pdl_gemv of the backends load() makes.
bool g_pdl_gemv = CudaKernelOptions{}.pdl_gemv;
// The kernel options as the environment sets them (the defaults where it sets nothing, or where
// a value is refused).
CudaKernelOptions envKernelOptions() {
  CudaKernelOptions o;
  return cudaKernelOptionsFromEnv(o).isOk() ? o : CudaKernelOptions{};
}
// [TAG_PDL_GRAPH] The default, or GARDEN_PDL_GRAPH when set (the whole suite with it on or off).
bool g_pdl_graph = envKernelOptions().pdl_graph;
// [TAG_GEMM_ROW_INVARIANT] The default, or GARDEN_GEMM_ROW_INVARIANT when set (the whole suite with
// the dense GEMMs held to one reference algorithm's bits).
const bool g_row_invariant = envKernelOptions().gemm_row_invariant;

// `share`: load onto another runner's backend and ops (so both use the same GEMM algorithms).
Runner load(const std::string& dir, const char* device, MoeWeightsMode moe,
            const Runner* share = nullptr, bool cuda_graphs = true,
            bool fuse_combine_norm = GptOssOptions{}.fuse_combine_norm,
            CudaKernelOptions::MoePrefill moe_prefill = CudaKernelOptions::MoePrefill::kTiled,
            bool moe_lt_wgmma = CudaKernelOptions{}.moe_lt_wgmma, F16 f16 = F16::kNone) {
  Runner r;
  if (share != nullptr) {
    r.backend = share->backend;
    r.ops = share->ops;
  } else {
    BackendOptions bo;
    bo.threads = 8;
    // The kernel choices the environment sets (GARDEN_CHAIN_PDL, GARDEN_PDL_GEMV, ...: the whole
    // suite with one of them changed), then the ones these tests pin.
    bo.cuda = envKernelOptions();
    // [TAG_MOE_LT_BF16] The tests of the tiled kernels' properties pin them; the bf16 cuBLASLt
    // path (rose's default, per chunk) has its own tests below. A runner sharing a backend keeps
    // the process-global choice the first one set.
    bo.cuda.moe_prefill = moe_prefill;
    bo.cuda.moe_lt_wgmma = moe_lt_wgmma;  // [TAG_MOE_WGMMA]
    bo.cuda.pdl_gemv = g_pdl_gemv;
    bo.cuda.pdl_graph = g_pdl_graph;
    bo.cuda.gemm_row_invariant = g_row_invariant;
    auto b = makeBackend(device, bo);
    EXPECT_TRUE(b.isOk()) << b.status().toString();
    r.backend = std::move(b).value();
    auto o = makeLlmOps(*r.backend, 8);
    EXPECT_TRUE(o.isOk()) << o.status().toString();
    r.ops = std::move(o).value();
  }
  GptOssOptions go;
  go.max_batch_tokens = 2048;
  go.max_seqs = 16;
  go.max_logits_rows = 64;
  go.max_model_len = 8192;
  go.moe_weights = moe;
  go.cuda_graphs = cuda_graphs;
  // [TAG_COMBINE_NORM] GARDEN_TEST_GPTOSS_FUSE_CN=off runs every other model test without the
  // fusion (the default has it).
  go.fuse_combine_norm = fuse_combine_norm;
  if (const char* v = std::getenv("GARDEN_TEST_GPTOSS_FUSE_CN"); v && std::string(v) == "off")
    go.fuse_combine_norm = false;
  // A/B knobs for the accuracy measurement (tests/gpu/hf_llm_bar.py, gpu_llm.sh hfbar_ab):
  // the router on the bf16 normalized row instead of the f32 stream [TAG_ROUTER_F32], and the
  // norm rounded twice (the Qwen3 convention) instead of once.
  if (const char* v = std::getenv("GARDEN_TEST_GPTOSS_ROUTER"); v && std::string(v) == "bf16")
    go.f32_router = false;
  if (const char* v = std::getenv("GARDEN_TEST_GPTOSS_NORM_ROUND"); v && std::string(v) == "twice")
    go.norm_round_once = false;
  // [TAG_ATTN_F16] GARDEN_TEST_GPTOSS_ATTN=float16 runs every CUDA model test with the attention
  // block in fp16 (gpu_llm.sh runs the suite both ways); GARDEN_TEST_GPTOSS_DTYPE=float16 with
  // everything rose's --dtype float16 sets (applyGptOssDtype), GARDEN_TEST_GPTOSS_MOE_OUT=f32 /
  // GARDEN_TEST_GPTOSS_PROJ=f32 add those f32 outputs alone.
  const bool cuda = std::string(device) == "cuda";
  if (cuda && (f16 == F16::kDtype || (f16 == F16::kNone && fp16Everywhere()))) {
    EXPECT_TRUE(applyGptOssDtype("float16", go));
  }
  if (cuda && f16 == F16::kAll16) go.attn_f16 = go.moe_f16 = go.head_f16 = true;
  if (cuda && f16 == F16::kAttn) go.attn_f16 = true;
  if (const char* v = std::getenv("GARDEN_TEST_GPTOSS_ATTN");
      v && std::string(v) == "float16" && cuda)
    go.attn_f16 = true;
  if (const char* v = std::getenv("GARDEN_TEST_GPTOSS_MOE_OUT");
      v && std::string(v) == "f32" && cuda)
    go.moe_out_f32 = true;
  if (const char* v = std::getenv("GARDEN_TEST_GPTOSS_PROJ");
      v && std::string(v) == "f32" && cuda) {
    go.attn_f16 = true;  // the f32 projections come with the fp16 attention block
    go.proj_f32 = true;
  }
  auto m = GptOssModel::load(dir, *r.backend, *r.ops, go);
  EXPECT_TRUE(m.isOk()) << m.status().toString();
  r.model = std::move(m).value();
  auto kv = PagedKvCache::create(*r.backend, r.model->kvShape(kBlocks, kBlock), r.model->kvDType());
  EXPECT_TRUE(kv.isOk());
  r.kv = std::move(kv).value();
  return r;
}

// One sequence being generated.
struct Seq {
  std::vector<int32_t> tokens;  // prompt + generated
  int32_t cached = 0;           // tokens whose KV is written
  std::vector<int32_t> blocks;
};

// Two copies of one batch (the same prompts), for stepping two runners side by side and comparing.
struct TwinBatch {
  std::vector<Seq> a, b;
  std::vector<Seq*> pa, pb;
  TwinBatch(int n, const std::function<std::vector<int32_t>(int)>& prompt_of)
      : a(static_cast<size_t>(n)), b(static_cast<size_t>(n)) {
    for (size_t i = 0; i < a.size(); ++i) {
      a[i].tokens = prompt_of(static_cast<int>(i));
      b[i].tokens = a[i].tokens;
      pa.push_back(&a[i]);
      pb.push_back(&b[i]);
    }
  }
  TwinBatch(const TwinBatch&) = delete;  // pa / pb point into a / b
  TwinBatch& operator=(const TwinBatch&) = delete;
  // Appends the ids each side sampled (one per sequence, in order; none after a step that
  // sampled nothing).
  void append(const std::vector<int32_t>& ta, const std::vector<int32_t>& tb) {
    for (size_t i = 0; i < ta.size(); ++i) a[i].tokens.push_back(ta[i]);
    for (size_t i = 0; i < tb.size(); ++i) b[i].tokens.push_back(tb[i]);
  }
};

// Runs one step over `seqs`: every sequence computes tokens [cached, cached + n_i) (n_i = its
// pending count, capped by `chunk`), and those that reach their end sample greedily (their
// last-position logits are returned in `logits`, one row per sampling sequence, in order).
// want_logits = false: sampling sequences return no logits (a pure decode step then qualifies
// for the CUDA-graph path).
std::vector<int32_t> step(Runner& r, std::vector<Seq*> seqs, int32_t chunk,
                          std::vector<std::vector<float>>* logits, bool want_logits = true) {
  std::vector<LlmStepSeq> desc;
  std::vector<int32_t> toks, blocks;
  for (Seq* s : seqs) {
    const int32_t pending = static_cast<int32_t>(s->tokens.size()) - s->cached;
    const int32_t n = std::min(pending, chunk);
    const int32_t need = (s->cached + n + kBlock - 1) / kBlock;
    if (static_cast<int32_t>(s->blocks.size()) < need) {
      auto more = r.allocBlocks(need - static_cast<int32_t>(s->blocks.size()));
      s->blocks.insert(s->blocks.end(), more.begin(), more.end());
    }
    LlmStepSeq d;
    d.token_offset = static_cast<int32_t>(toks.size());
    d.num_tokens = n;
    d.position = s->cached;
    d.block_offset = static_cast<int32_t>(blocks.size());
    d.num_blocks = static_cast<int32_t>(s->blocks.size());
    const bool last = n == pending;
    d.sample = last ? 1 : 0;
    d.logits = last && want_logits ? LogitsMode::kLast : LogitsMode::kNone;
    desc.push_back(d);
    toks.insert(toks.end(), s->tokens.begin() + s->cached, s->tokens.begin() + s->cached + n);
    blocks.insert(blocks.end(), s->blocks.begin(), s->blocks.end());
  }
  LlmStep st{desc, toks, blocks};
  Status v = r.model->validate(st, *r.kv);
  EXPECT_TRUE(v.isOk()) << v.toString();
  int64_t samples = 0;
  for (const auto& d : desc) samples += d.sample;
  std::vector<int32_t> sampled(static_cast<size_t>(samples), -1);
  const int64_t vocab = r.model->vocabSize();
  std::vector<float> lg(static_cast<size_t>(logitsRows(st) * vocab));
  r.backend->launch([&] { r.model->enqueueStep(st, *r.kv, lg.data(), sampled.data()); });
  EXPECT_TRUE(r.backend->synchronize().isOk());
  size_t si = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i]->cached += desc[i].num_tokens;
    if (desc[i].sample) {
      if (logits && want_logits)
        logits->emplace_back(lg.begin() + static_cast<int64_t>(si) * vocab,
                             lg.begin() + static_cast<int64_t>(si + 1) * vocab);
      ++si;
    }
  }
  return sampled;
}

// Greedy generation of `n` tokens after `prompt` (prefill in chunks of `chunk`).
std::vector<int32_t> generate(Runner& r, const std::vector<int32_t>& prompt, int n, int32_t chunk,
                              std::vector<std::vector<float>>* logits) {
  Seq s;
  s.tokens = prompt;
  std::vector<int32_t> out;
  while (static_cast<int>(out.size()) < n) {
    const bool finishes = static_cast<int32_t>(s.tokens.size()) - s.cached <= chunk;
    auto got = step(r, {&s}, chunk, finishes ? logits : nullptr);
    if (!got.empty()) {
      out.push_back(got[0]);
      s.tokens.push_back(got[0]);
    }
  }
  return out;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

// (top-1 − top-2) of a logits row.
double margin(const std::vector<float>& l) {
  return topTwoMargin(l.data(), static_cast<int64_t>(l.size()));
}

class GpuGptOss : public ::testing::Test {
 protected:
  // The GPU-path tiny shape; `experts` / `window` vary it for the diagnosis below.
  static std::string makeModel(const std::string& name, int64_t experts, int64_t window) {
    const std::string dir = (fs::temp_directory_path() /
                             ("garden_gpu_gptoss_" + name + "_" + std::to_string(getpid())))
                                .string();
    Status s = makeGptOssModel(testsupport::gpuTinyGptOss(dir, experts, window));
    EXPECT_TRUE(s.isOk()) << s.toString();
    dirs_->push_back(dir);
    return dir;
  }
  static void SetUpTestSuite() {
    dirs_ = new std::vector<std::string>();
    dir_ = new std::string(makeModel("main", 8, 16));
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    for (const auto& d : *dirs_) fs::remove_all(d, ec);
    delete dir_;
    delete dirs_;
  }
  static std::vector<int32_t> prompt(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> d(0, 199997);
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (auto& x : p) x = d(rng);
    return p;
  }
  // Three twin sequences (prompts of 700, 741 and 782 tokens) through runners `a` and `b` step by
  // step: a prefill step of 600 tokens each (1,800 rows, no sample), the rest of the prompts (which
  // samples each sequence's first token), then 24 decode steps — logits back on even steps
  // (eager), ids only on odd ones (the graph path when the runners have graphs). Every step's ids
  // and logits must be equal bit for bit.
  // `before(second)`, when given, runs before each step of `a` (false) and of `b` (true): a
  // process-global switch set per side.
  static void expectTwinStepsBitEqual(Runner& a, Runner& b, uint32_t seed, int batch = 3,
                                      const std::function<void(bool)>& before = {}) {
    TwinBatch tw(batch, [seed](int i) { return prompt(700 + 41 * i, seed + i); });
    auto side = [&](bool second) {
      if (before) before(second);
    };
    for (int it = 0; it < 2; ++it) {
      std::vector<std::vector<float>> la, lb;
      side(false);
      auto ta = step(a, tw.pa, 600, &la, true);
      side(true);
      auto tb = step(b, tw.pb, 600, &lb, true);
      ASSERT_EQ(ta, tb) << "prefill step " << it;
      ASSERT_EQ(la, lb) << "prefill step " << it;
      ASSERT_EQ(ta.size(), it == 0 ? 0u : static_cast<size_t>(batch));
      tw.append(ta, tb);
    }
    for (int it = 0; it < 24; ++it) {
      SCOPED_TRACE("decode " + std::to_string(it));
      const bool want = it % 2 == 0;
      std::vector<std::vector<float>> la, lb;
      side(false);
      auto ta = step(a, tw.pa, 2048, want ? &la : nullptr, want);
      side(true);
      auto tb = step(b, tw.pb, 2048, want ? &lb : nullptr, want);
      ASSERT_EQ(ta, tb);
      if (want) {
        ASSERT_EQ(la, lb);
      }
      tw.append(ta, tb);
    }
  }
  static std::string* dir_;
  static std::vector<std::string>* dirs_;
};
std::string* GpuGptOss::dir_ = nullptr;
std::vector<std::string>* GpuGptOss::dirs_ = nullptr;

TEST_F(GpuGptOss, ChunkedPrefillEqualsOnePass) {
  Runner gpu = load(*dir_, "cuda", MoeWeightsMode::kAuto);
  auto p = prompt(700, 11);
  std::vector<std::vector<float>> one, chunked;
  auto a = generate(gpu, p, 16, 2048, &one);
  auto b = generate(gpu, p, 16, 64, &chunked);  // 11 chunks of 64, then decode
  EXPECT_EQ(a, b);
  EXPECT_GE(cosine(one[0], chunked[0]), 0.9999);
}

TEST_F(GpuGptOss, PrefixCacheHitEqualsMiss) {
  Runner gpu = load(*dir_, "cuda", MoeWeightsMode::kAuto);
  auto shared = prompt(256, 21);  // 16 full blocks
  auto tail = prompt(40, 22);
  std::vector<int32_t> full = shared;
  full.insert(full.end(), tail.begin(), tail.end());
  // Miss: the whole prompt from scratch.
  std::vector<std::vector<float>> miss_logits, hit_logits;
  auto miss = generate(gpu, full, 8, 2048, &miss_logits);
  // Hit: a first sequence fills the shared blocks; the second reuses them and computes the tail.
  Seq first;
  first.tokens = shared;
  step(gpu, {&first}, 2048, nullptr);
  Seq second;
  second.tokens = full;
  second.blocks.assign(first.blocks.begin(), first.blocks.begin() + 16);
  second.cached = 256;
  std::vector<int32_t> hit;
  while (hit.size() < 8) {
    auto got = step(gpu, {&second}, 2048, hit.empty() ? &hit_logits : nullptr);
    hit.push_back(got[0]);
    second.tokens.push_back(got[0]);
  }
  EXPECT_EQ(hit, miss);
  EXPECT_GE(cosine(hit_logits[0], miss_logits[0]), 0.9999);
}

TEST_F(GpuGptOss, TokensDoNotDependOnTheBatch) {
  Runner gpu = load(*dir_, "cuda", MoeWeightsMode::kAuto);
  auto p = prompt(300, 31);
  auto alone = generate(gpu, p, 24, 2048, nullptr);
  // The same prompt batched with 5 others of different lengths, prefilled and decoded together.
  std::vector<Seq> seqs(6);
  seqs[0].tokens = p;
  for (int i = 1; i < 6; ++i) seqs[i].tokens = prompt(37 * i + 3, 40 + i);
  std::vector<int32_t> batched;
  while (batched.size() < alone.size()) {
    std::vector<Seq*> ptrs;
    for (auto& s : seqs) ptrs.push_back(&s);
    auto got = step(gpu, ptrs, 2048, nullptr);
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i].tokens.push_back(got[i]);
    batched.push_back(got[0]);
  }
  EXPECT_EQ(batched, alone);
}

// Decode steps replayed as CUDA graphs (padded to a power of two sequences, tables to a
// power-of-two stride, attention counts read on the device) give the eager steps' tokens, for
// batches that need padding and contexts that cross split-KV chunks and the sliding window.
TEST_F(GpuGptOss, DecodeGraphsEqualEagerSteps) {
  Runner eager = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, /*cuda_graphs=*/false);
  Runner graphed = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, /*cuda_graphs=*/true);
  for (int batch : {1, 3, 6}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    TwinBatch tw(batch, [](int i) { return prompt(500 + 97 * i, 900 + i); });
    std::vector<Seq>&a = tw.a, &g = tw.b;
    std::vector<Seq*>&pa = tw.pa, &pg = tw.pb;
    // Prefill one sequence per step (the step budget is 2048 tokens), then decode them together.
    for (int i = 0; i < batch; ++i) {
      auto ta = step(eager, {pa[static_cast<size_t>(i)]}, 2048, nullptr, true);
      auto tg = step(graphed, {pg[static_cast<size_t>(i)]}, 2048, nullptr, false);
      ASSERT_EQ(ta, tg) << "prefill of sequence " << i;
      a[static_cast<size_t>(i)].tokens.push_back(ta[0]);
      g[static_cast<size_t>(i)].tokens.push_back(tg[0]);
    }
    const uint64_t graph_steps0 = graphed.model->graphSteps();
    for (int it = 0; it < 40; ++it) {
      // Eager: logits requested (never the graph path). Graphed: ids only.
      auto ta = step(eager, pa, 2048, nullptr, /*want_logits=*/true);
      auto tg = step(graphed, pg, 2048, nullptr, /*want_logits=*/false);
      ASSERT_EQ(ta, tg) << "step " << it;
      tw.append(ta, tg);
    }
    EXPECT_EQ(graphed.model->graphSteps() - graph_steps0, 40u);  // every decode step
  }
  const GraphExecStats st = graphed.backend->graphs()->graphStats();
  EXPECT_GT(st.replays, 0u);
  EXPECT_EQ(st.capture_failures, 0u);
  EXPECT_EQ(eager.model->graphSteps(), 0u);
}

// [TAG_KV_WINDOW_GROUP] The sliding layers (window 16, blocks of 16) from a window pool of their
// own: four sequences (prompts of 40..1000 tokens, prefilled in chunks of 128 — the sm90 prefill
// kernel — then 40 decode steps: CUDA graphs on the pooled side) give the same sampled ids and
// the same logits bits as every layer in one pool. Before each step the window tables drop
// (-1) every block no query reads any more and hand it to the next sequence that needs one
// (LIFO), so the kernels meet holes and reused blocks; a hole they read would differ (or fault:
// the run is also a memcheck target).
TEST_F(GpuGptOss, WindowPoolGivesTheSameBitsAsOnePool) {
  Runner one = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, /*cuda_graphs=*/false);
  Runner two = load(*dir_, "cuda", MoeWeightsMode::kAuto, &one, /*cuda_graphs=*/true);
  constexpr int32_t kWindow = 16, kWin = 64;
  ASSERT_EQ(two.model->slidingWindow(), kWindow);
  auto kvw = PagedKvCache::create(*two.backend, two.model->kvShape(kBlocks, kBlock, kWin),
                                  two.model->kvDType());
  ASSERT_TRUE(kvw.isOk()) << kvw.status().toString();
  two.kv = std::move(kvw).value();
  struct S {
    std::vector<int32_t> tokens;
    int32_t cached = 0;
    std::vector<int32_t> ta, tb, tw;
  };
  std::vector<S> seqs(4);
  const int lens[4] = {300, 150, 40, 1000};
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i].tokens = prompt(lens[i], 4000 + i);
  std::vector<int32_t> free_w(kWin);
  std::iota(free_w.rbegin(), free_w.rend(), 0);
  int32_t next_a = 0, next_b = kBlocks - 1;  // different full-pool ids on the two sides
  size_t holes = 0, decode_steps = 0;
  const uint64_t graphs0 = two.model->graphSteps();
  for (int it = 0; it < 200; ++it) {
    std::vector<LlmStepSeq> da, db;
    std::vector<int32_t> toks, ba, bb;
    std::vector<size_t> who;
    bool all_decode = true;
    for (size_t j = 0; j < seqs.size(); ++j) {
      S& s = seqs[j];
      if (s.tokens.size() >= static_cast<size_t>(lens[j] + 40)) continue;
      who.push_back(j);
      const int32_t n = std::min<int32_t>(128, static_cast<int32_t>(s.tokens.size()) - s.cached);
      const int32_t end = s.cached + n;
      for (size_t bi = 0; bi < s.tw.size(); ++bi) {
        if (s.tw[bi] >= 0 && static_cast<int32_t>(bi + 1) * kBlock <= s.cached - kWindow + 1) {
          free_w.push_back(s.tw[bi]);
          s.tw[bi] = -1;
        }
      }
      while (static_cast<int32_t>(s.ta.size()) * kBlock < end) {
        s.ta.push_back(next_a++);
        s.tb.push_back(next_b--);
        ASSERT_FALSE(free_w.empty());
        s.tw.push_back(free_w.back());
        free_w.pop_back();
      }
      holes += s.tw[0] < 0 ? 1 : 0;
      LlmStepSeq d;
      d.token_offset = static_cast<int32_t>(toks.size());
      d.num_tokens = n;
      d.position = s.cached;
      d.num_blocks = static_cast<int32_t>(s.ta.size());
      d.sample = end == static_cast<int32_t>(s.tokens.size()) ? 1 : 0;
      all_decode = all_decode && n == 1;
      d.block_offset = static_cast<int32_t>(ba.size());
      // The one-pool side returns the sampling rows' logits (never a graph); the pooled side
      // too, except on pure decode steps, which it runs as graphs.
      d.logits = d.sample ? LogitsMode::kLast : LogitsMode::kNone;
      da.push_back(d);
      d.block_offset = static_cast<int32_t>(bb.size());
      d.window_table = 1;
      db.push_back(d);
      toks.insert(toks.end(), s.tokens.begin() + s.cached, s.tokens.begin() + end);
      ba.insert(ba.end(), s.ta.begin(), s.ta.end());
      bb.insert(bb.end(), s.tb.begin(), s.tb.end());
      bb.insert(bb.end(), s.tw.begin(), s.tw.end());
    }
    if (da.empty()) break;
    if (all_decode) {
      for (LlmStepSeq& d : db) d.logits = LogitsMode::kNone;
      ++decode_steps;
    }
    const LlmStep sa{da, toks, ba}, sb{db, toks, bb};
    ASSERT_TRUE(one.model->validate(sa, *one.kv).isOk());
    const Status vb = two.model->validate(sb, *two.kv);
    ASSERT_TRUE(vb.isOk()) << vb.toString();
    const int64_t vocab = one.model->vocabSize();
    std::vector<float> la(static_cast<size_t>(logitsRows(sa) * vocab)),
        lb(static_cast<size_t>(logitsRows(sb) * vocab));
    int64_t samples = 0;
    for (const auto& d : da) samples += d.sample;
    std::vector<int32_t> ida(static_cast<size_t>(samples), -1), idb(ida.size(), -1);
    one.backend->launch([&] { one.model->enqueueStep(sa, *one.kv, la.data(), ida.data()); });
    ASSERT_TRUE(one.backend->synchronize().isOk());
    two.backend->launch([&] { two.model->enqueueStep(sb, *two.kv, lb.data(), idb.data()); });
    ASSERT_TRUE(two.backend->synchronize().isOk());
    ASSERT_EQ(ida, idb) << "step " << it;
    if (!all_decode) {
      ASSERT_EQ(la.size(), lb.size());
      ASSERT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << "step " << it;
    }
    size_t k = 0;
    for (size_t si = 0; si < da.size(); ++si) {
      S& s = seqs[who[si]];
      s.cached += da[si].num_tokens;
      if (da[si].sample) s.tokens.push_back(ida[k++]);
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(seqs[i].tokens.size(), static_cast<size_t>(lens[i] + 40)) << "sequence " << i;
  }
  EXPECT_GT(holes, 100u) << "the windows dropped blocks";
  EXPECT_GE(decode_steps, 30u);
  EXPECT_EQ(two.model->graphSteps() - graphs0, decode_steps);
}

// GptOssModel::prewarmGemms: the dense GEMMs of every M bucket up to the step budget (and the
// lm_head up to max_logits_rows) are tuned at load, so prefill chunks, mixed steps and decode
// batches of any size afterwards tune nothing more; the tokens equal those of a runner that
// tuned lazily on the same backend and ops (the choices are shared: same algorithms).
TEST_F(GpuGptOss, PrewarmTunesEveryStepSizeUpFront) {
  Runner warm = load(*dir_, "cuda", MoeWeightsMode::kAuto);
  auto& gemm = static_cast<cuda::CudaBackend&>(*warm.backend).gemm();
  ASSERT_TRUE(gemm.tuning());
  const size_t before = gemm.tunedShapes();
  auto runs = warm.model->prewarmGemms();
  ASSERT_TRUE(runs.isOk()) << runs.status().toString();
  // QKV and O-proj: 1, 2, 4, 8, then 64..1024 by 64 and 1280..2048 by 256 (max 2048 tokens);
  // lm_head: 1, 2, 4, 8, 64 (max 64 rows).
  EXPECT_EQ(*runs, 2 * (4 + 16 + 4) + 5);
  const size_t tuned = gemm.tunedShapes();
  EXPECT_GT(tuned, before);
  // Prefill in chunks of several sizes, then decode batches of 1..6 sequences.
  for (int32_t chunk : {2048, 700, 64, 33}) {
    auto got = generate(warm, prompt(900, 60 + chunk), 3, chunk, nullptr);
    EXPECT_EQ(got.size(), 3u);
  }
  for (int batch : {1, 2, 3, 6}) {
    std::vector<Seq> seqs(static_cast<size_t>(batch));
    std::vector<Seq*> ptrs;
    for (int i = 0; i < batch; ++i) {
      seqs[static_cast<size_t>(i)].tokens = prompt(40 + 13 * i, 70 + i);
      ptrs.push_back(&seqs[static_cast<size_t>(i)]);
    }
    for (int it = 0; it < 4; ++it) {
      auto got = step(warm, ptrs, 2048, nullptr);
      for (size_t i = 0; i < seqs.size(); ++i) seqs[i].tokens.push_back(got[i]);
    }
  }
  EXPECT_EQ(gemm.tunedShapes(), tuned) << "a step tuned a GEMM bucket the prewarm missed";
  // Same tokens as a model on the same backend that did not prewarm (it reuses the choices).
  Runner lazy = load(*dir_, "cuda", MoeWeightsMode::kAuto, &warm);
  auto p = prompt(333, 99);
  EXPECT_EQ(generate(warm, p, 12, 2048, nullptr), generate(lazy, p, 12, 2048, nullptr));
}

// [TAG_LATE_MASKS] Late masks on CUDA: a decode step whose masks come through
// LlmStep::await_masks (the graph then ends at the logits and the staged draw runs after it,
// eagerly) draws the same ids as the same step with its masks given up front (the draw inside
// the graph), for greedy and sampled rows, over 24 decode steps at batch 3, graphs on and off.
// The masks are fresh random ones every step (about 1 % of the vocabulary allowed) and every
// drawn id must be allowed. The await sleeps 2 ms first, as tulip would still be filling them
// while the forward pass runs. Passing this is what kLateMaskVerified in
// ops/cuda/llm_ops_cuda.cc waits for.
TEST_F(GpuGptOss, LateMasksDrawTheSameTokensAsEarlyMasks) {
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    Runner early = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, graphs);
    Runner late = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, graphs);
    constexpr int kBatch = 3;
    std::vector<Seq> a(kBatch), b(kBatch);
    for (int i = 0; i < kBatch; ++i) {
      a[static_cast<size_t>(i)].tokens = prompt(300 + 61 * i, 4000 + i);
      b[static_cast<size_t>(i)].tokens = a[static_cast<size_t>(i)].tokens;
      auto ta = step(early, {&a[static_cast<size_t>(i)]}, 2048, nullptr, false);
      auto tb = step(late, {&b[static_cast<size_t>(i)]}, 2048, nullptr, false);
      ASSERT_EQ(ta, tb);
      a[static_cast<size_t>(i)].tokens.push_back(ta[0]);
      b[static_cast<size_t>(i)].tokens.push_back(tb[0]);
    }
    const int64_t vocab = early.model->vocabSize();
    const int64_t words = (vocab + 31) / 32;
    std::mt19937 rng(99);
    const uint64_t graph0 = late.model->graphSteps();
    for (int it = 0; it < 24; ++it) {
      SCOPED_TRACE("step " + std::to_string(it));
      std::vector<uint32_t> masks(static_cast<size_t>(kBatch * words), 0);
      for (int k = 0; k < kBatch; ++k) {
        for (int j = 0; j < static_cast<int>(vocab / 100); ++j) {
          const auto id = static_cast<int64_t>(rng() % static_cast<uint32_t>(vocab));
          masks[static_cast<size_t>(k * words + id / 32)] |= 1u << (id % 32);
        }
      }
      auto run = [&](Runner& r, std::vector<Seq>& seqs, bool is_late) {
        std::vector<LlmStepSeq> desc;
        std::vector<int32_t> toks, blocks;
        for (int i = 0; i < kBatch; ++i) {
          Seq& q = seqs[static_cast<size_t>(i)];
          const int32_t need = (q.cached + 1 + kBlock - 1) / kBlock;
          if (static_cast<int32_t>(q.blocks.size()) < need) {
            auto more = r.allocBlocks(need - static_cast<int32_t>(q.blocks.size()));
            q.blocks.insert(q.blocks.end(), more.begin(), more.end());
          }
          LlmStepSeq d;
          d.token_offset = i;
          d.num_tokens = 1;
          d.position = q.cached;
          d.block_offset = static_cast<int32_t>(blocks.size());
          d.num_blocks = static_cast<int32_t>(q.blocks.size());
          d.sample = 1;
          d.logits = LogitsMode::kNone;
          if (i != 1) {  // rows 0 and 2 draw at temperature, row 1 is greedy
            d.sampling.temperature = 0.8f;
            d.sampling.seed = 31 + static_cast<uint64_t>(i);
          }
          d.mask_index = kBatch - i;  // masks named out of order
          desc.push_back(d);
          toks.push_back(q.tokens.back());
          blocks.insert(blocks.end(), q.blocks.begin(), q.blocks.end());
        }
        std::vector<uint32_t> staged = is_late ? std::vector<uint32_t>(masks.size(), 0) : masks;
        LlmStep st{desc, toks, blocks, {}, staged, words};
        if (is_late) {
          st.await_masks = [&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            staged = masks;
            return true;
          };
        }
        Status v = r.model->validate(st, *r.kv);
        EXPECT_TRUE(v.isOk()) << v.toString();
        std::vector<int32_t> out(kBatch, -1);
        r.backend->launch([&] { r.model->enqueueStep(st, *r.kv, nullptr, out.data()); });
        EXPECT_TRUE(r.backend->synchronize().isOk());
        for (int i = 0; i < kBatch; ++i) {
          Seq& q = seqs[static_cast<size_t>(i)];
          q.cached += 1;
          q.tokens.push_back(out[static_cast<size_t>(i)]);
        }
        return out;
      };
      auto ta = run(early, a, false);
      auto tb = run(late, b, true);
      ASSERT_EQ(ta, tb);
      for (int i = 0; i < kBatch; ++i) {
        const int64_t id = tb[static_cast<size_t>(i)];
        const int64_t k = kBatch - i - 1;
        ASSERT_TRUE(id >= 0 && id < vocab);
        EXPECT_TRUE((masks[static_cast<size_t>(k * words + id / 32)] >> (id % 32)) & 1u)
            << "row " << i << " drew " << id;
      }
    }
    EXPECT_EQ(late.model->graphSteps() - graph0, graphs ? 24u : 0u);
  }
}

// [TAG_COMBINE_NORM] The MoE combine fused into the next RMSNorm gives the same bits as the two
// kernels: logits of chunked prefill (many rows: the multi-row norm kernel) and of eager decode
// steps (few rows: the split kernel) are equal, and so are the ids of graph decode steps.
TEST_F(GpuGptOss, CombineNormFusionIsBitExact) {
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    Runner plain = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, graphs, false);
    Runner fused = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, graphs, true);
    ASSERT_TRUE(fused.ops->supportsCombineNorm());
    expectTwinStepsBitEqual(plain, fused, 7100);
    if (graphs) {
      EXPECT_GT(fused.model->graphSteps(), 0u);
    }
  }
}

// [TAG_PDL_GEMV] The one-token decode GEMV launched programmatically (scheduled while the norm or
// the attention before it finishes, in graphs too) gives the bits of the same GEMV launched
// plainly: prefill, eager decode steps (logits) and graphed ones (ids) of one sequence. Both sides
// run the GEMV at M = 1 (setLlmGemvOnly), so only the launch differs; both must have run it.
TEST_F(GpuGptOss, PdlGemvGivesTheSameBits) {
  cuda::setLlmGemvOnly(true);
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    g_pdl_gemv = false;
    Runner plain = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, graphs);
    g_pdl_gemv = true;
    Runner pdl = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, graphs);
    g_pdl_gemv = CudaKernelOptions{}.pdl_gemv;
    ASSERT_FALSE(dynamic_cast<cuda::CudaBackend&>(*plain.backend).pdlGemv());
    ASSERT_TRUE(dynamic_cast<cuda::CudaBackend&>(*pdl.backend).pdlGemv());
    expectTwinStepsBitEqual(plain, pdl, 7300, /*batch=*/1);
    if (fp16Everywhere()) {
      // The GEMV takes bf16 operands only (gemm.cc): with fp16 activations and f32 projection
      // outputs both sides stay on cuBLASLt, and must still agree.
      EXPECT_EQ(dynamic_cast<cuda::CudaBackend&>(*plain.backend).gemm().gemvWins(), 0u);
      EXPECT_EQ(dynamic_cast<cuda::CudaBackend&>(*pdl.backend).gemm().gemvWins(), 0u);
    } else {
      EXPECT_GT(dynamic_cast<cuda::CudaBackend&>(*plain.backend).gemm().gemvWins(), 0u);
      EXPECT_GT(dynamic_cast<cuda::CudaBackend&>(*pdl.backend).gemm().gemvWins(), 0u);
    }
    if (graphs) {
      EXPECT_GT(pdl.model->graphSteps(), 0u);
    }
  }
  cuda::setLlmGemvOnly(false);
}

// [TAG_PDL_GRAPH] rose's own kernels launched programmatically (each waits for the previous one in
// its first statement; in graphs too) give the bits of plain launches: prefill, eager decode
// steps (logits) and graphed ones (ids), one sequence and three.
TEST_F(GpuGptOss, PdlGraphGivesTheSameBits) {
  for (bool graphs : {false, true}) {
    for (int batch : {1, 3}) {
      SCOPED_TRACE(std::string(graphs ? "graphs" : "eager") + " batch " + std::to_string(batch));
      g_pdl_graph = false;
      Runner plain = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, graphs);
      g_pdl_graph = true;
      Runner pdl = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, graphs);
      g_pdl_graph = envKernelOptions().pdl_graph;
      ASSERT_FALSE(dynamic_cast<cuda::CudaBackend&>(*plain.backend).pdlGraph());
      ASSERT_TRUE(dynamic_cast<cuda::CudaBackend&>(*pdl.backend).pdlGraph());
      expectTwinStepsBitEqual(plain, pdl, 7400 + static_cast<uint32_t>(batch), batch);
      if (graphs) {
        EXPECT_GT(pdl.model->graphSteps(), 0u);
      }
    }
  }
}

// [TAG_ROUTE_ALIGN] The route and the MoE align in one kernel (decode-sized steps) give the bits
// of the two kernels: prefill, eager decode steps (logits) and graphed ones (ids), one sequence
// and three; the fused side must have skipped its aligns.
TEST_F(GpuGptOss, RouteAlignFusionGivesTheSameBits) {
  for (bool graphs : {false, true}) {
    for (int batch : {1, 3}) {
      SCOPED_TRACE(std::string(graphs ? "graphs" : "eager") + " batch " + std::to_string(batch));
      Runner plain = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, graphs);
      Runner fused = load(*dir_, "cuda", MoeWeightsMode::kAuto, nullptr, graphs);
      // Skipped aligns counted per side: the counter's growth is the side's that just ran.
      uint64_t last = cuda::llmRouteAlignUses(), plain_uses = 0, fused_uses = 0;
      bool fused_ran = false;
      auto account = [&] {
        const uint64_t now = cuda::llmRouteAlignUses();
        (fused_ran ? fused_uses : plain_uses) += now - last;
        last = now;
      };
      expectTwinStepsBitEqual(plain, fused, 7500 + static_cast<uint32_t>(batch), batch,
                              [&](bool second) {
                                account();
                                fused_ran = second;
                                cuda::setLlmRouteAlign(second);
                              });
      account();
      cuda::setLlmRouteAlign(false);  // the default
      EXPECT_EQ(plain_uses, 0u);
      EXPECT_GT(fused_uses, 0u);
      if (graphs) {
        EXPECT_GT(fused.model->graphSteps(), 0u);
      }
    }
  }
}

TEST_F(GpuGptOss, Mxfp4AndBf16ExpertsGiveTheSameLogits) {
  Runner mx = load(*dir_, "cuda", MoeWeightsMode::kMxfp4);
  Runner bf = load(*dir_, "cuda", MoeWeightsMode::kDense, &mx);
  ASSERT_EQ(mx.model->expertFormat(), ExpertFormat::kMxfp4);
  ASSERT_EQ(bf.model->expertFormat(), ExpertFormat::kDense);
  auto p = prompt(150, 51);
  std::vector<std::vector<float>> a, b;
  auto ta = generate(mx, p, 4, 2048, &a);
  auto tb = generate(bf, p, 4, 2048, &b);
  EXPECT_EQ(ta, tb);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0) << "step " << i;
}

// Logits of `tokens` at positions [from, size) computed in one prefill pass (kAll rows).
std::vector<std::vector<float>> prefillLogits(Runner& r, const std::vector<int32_t>& tokens,
                                              int32_t from) {
  Seq s;
  s.tokens = tokens;
  std::vector<std::vector<float>> out;
  // First the part before `from` (no logits), then the rest with every row's logits.
  if (from > 0) {
    Seq* p = &s;
    const int32_t keep = static_cast<int32_t>(s.tokens.size());
    s.tokens.resize(static_cast<size_t>(from));
    step(r, {p}, 4096, nullptr);
    s.tokens.assign(tokens.begin(), tokens.begin() + keep);
  }
  std::vector<LlmStepSeq> desc(1);
  LlmStepSeq& d = desc[0];
  const int32_t n = static_cast<int32_t>(tokens.size()) - s.cached;
  const int32_t need = (s.cached + n + kBlock - 1) / kBlock;
  if (static_cast<int32_t>(s.blocks.size()) < need) {
    auto more = r.allocBlocks(need - static_cast<int32_t>(s.blocks.size()));
    s.blocks.insert(s.blocks.end(), more.begin(), more.end());
  }
  d.num_tokens = n;
  d.position = s.cached;
  d.num_blocks = static_cast<int32_t>(s.blocks.size());
  d.logits = LogitsMode::kAll;
  std::vector<int32_t> toks(tokens.begin() + s.cached, tokens.end());
  LlmStep st{desc, toks, s.blocks};
  Status v = r.model->validate(st, *r.kv);
  EXPECT_TRUE(v.isOk()) << v.toString();
  const int64_t vocab = r.model->vocabSize();
  std::vector<float> lg(static_cast<size_t>(n * vocab));
  r.backend->launch([&] { r.model->enqueueStep(st, *r.kv, lg.data(), nullptr); });
  EXPECT_TRUE(r.backend->synchronize().isOk());
  for (int32_t i = 0; i < n; ++i)
    out.emplace_back(lg.begin() + i * vocab, lg.begin() + (i + 1) * vocab);
  return out;
}

struct Diff {
  double cos = 1, max_abs = 0;
  bool top1 = true;
  double margin = 0;
  double rel = 0;  // ‖got − ref‖ / ‖ref‖
};
Diff diff(const std::vector<float>& ref, const std::vector<float>& got) {
  Diff d;
  d.cos = cosine(ref, got);
  size_t ar = 0, ag = 0;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    d.max_abs = std::max(d.max_abs, static_cast<double>(std::abs(ref[i] - got[i])));
    num += static_cast<double>(ref[i] - got[i]) * (ref[i] - got[i]);
    den += static_cast<double>(ref[i]) * ref[i];
    if (ref[i] > ref[ar]) ar = i;
    if (got[i] > got[ag]) ag = i;
  }
  d.rel = std::sqrt(num / std::max(den, 1e-30));
  d.top1 = ar == ag;
  d.margin = margin(ref);
  return d;
}

// Teacher-forced comparison with the CPU reference: for each prompt the CPU generates 32 greedy
// tokens; the GPU then computes the logits of the same positions twice — step by step (decode,
// fed the CPU's tokens) and in one prefill pass — and generates freely. Returns per-position
// statistics; with `dump` set, writes the sequences and both backends' logits there (the input of
// tests/gpu/hf_llm_bar.py, which measures Hugging Face transformers on the same positions).
struct TfStats {
  int positions = 0, flips = 0, decisive_flips = 0, free_identical = 0, free_until_near_tie = 0;
  double worst_cos = 1, max_abs = 0;
  double rel_sum = 0;  // sum over positions of the relative L2 logit error
  std::vector<double> cosines;
};
TfStats teacherForced(const std::string& dir, const std::vector<int>& lengths, double near_tie,
                      const std::string& dump, F16 f16 = F16::kNone) {
  Runner cpu = load(dir, "cpu", MoeWeightsMode::kDense);
  Runner gpu =
      load(dir, "cuda", MoeWeightsMode::kAuto, nullptr, true, GptOssOptions{}.fuse_combine_norm,
           CudaKernelOptions::MoePrefill::kTiled, CudaKernelOptions{}.moe_lt_wgmma, f16);
  TfStats st;
  std::string seqs_json = "[";
  for (size_t pi = 0; pi < lengths.size(); ++pi) {
    const int len = lengths[pi];
    std::mt19937 rng(static_cast<uint32_t>(len));
    std::uniform_int_distribution<int32_t> d(0, 199997);
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (auto& x : p) x = d(rng);
    std::vector<std::vector<float>> lc;
    auto tc = generate(cpu, p, 32, 2048, &lc);
    // Step by step, fed the CPU's tokens.
    gpu.next_block = 0;
    std::vector<std::vector<float>> lg;
    Seq s;
    s.tokens = p;
    step(gpu, {&s}, 2048, &lg);
    for (size_t i = 0; i + 1 < tc.size(); ++i) {
      s.tokens.push_back(tc[i]);
      step(gpu, {&s}, 2048, &lg);
    }
    // One prefill pass over prompt + the CPU's tokens.
    std::vector<int32_t> all = p;
    all.insert(all.end(), tc.begin(), tc.end() - 1);
    gpu.next_block = 0;
    auto lp = prefillLogits(gpu, all, static_cast<int32_t>(p.size()) - 1);
    for (size_t i = 0; i < lc.size(); ++i) {
      for (const auto* got : {&lg[i], &lp[i]}) {
        const Diff df = diff(lc[i], *got);
        st.worst_cos = std::min(st.worst_cos, df.cos);
        st.max_abs = std::max(st.max_abs, df.max_abs);
        st.rel_sum += df.rel;
        st.cosines.push_back(df.cos);
        if (!df.top1) {
          ++st.flips;
          if (df.margin >= near_tie) ++st.decisive_flips;
        }
        ++st.positions;
      }
    }
    gpu.next_block = 0;
    auto tg = generate(gpu, p, 32, 2048, nullptr);
    size_t agree = 0;
    while (agree < tc.size() && tc[agree] == tg[agree]) ++agree;
    size_t first_tie = 0;
    while (first_tie < lc.size() && margin(lc[first_tie]) >= near_tie) ++first_tie;
    st.free_identical += agree == tc.size();
    st.free_until_near_tie += agree >= std::min(first_tie, tc.size());
    std::cout << "[ teacher-forced ] prompt " << len << ": free-running " << agree
              << "/32 identical, first CPU near-tie (margin < " << near_tie << ") at step "
              << first_tie << "\n";
    if (!dump.empty()) {
      seqs_json += std::string(pi ? "," : "") + "{\"prompt_len\":" + std::to_string(len) +
                   ",\"tokens\":[";
      for (size_t i = 0; i < all.size(); ++i) {
        if (i) seqs_json += ',';
        seqs_json += std::to_string(all[i]);
      }
      seqs_json += "]}";
      for (const char* which : {"cpu", "gpu"}) {
        const auto& rows = std::string(which) == "cpu" ? lc : lp;
        std::ofstream f(dump + "/" + which + "_logits_" + std::to_string(pi) + ".f32",
                        std::ios::binary);
        for (const auto& r : rows)
          f.write(reinterpret_cast<const char*>(r.data()), static_cast<std::streamsize>(r.size() * 4));
      }
    }
  }
  if (!dump.empty()) {
    std::ofstream(dump + "/seqs.json") << seqs_json << "]\n";
  }
  std::sort(st.cosines.begin(), st.cosines.end());
  return st;
}

const std::vector<int> kPromptLengths = {5, 17, 33, 64, 100, 129, 200, 300, 513, 1000};

// Without a routing choice (every token uses all 4 of 4 experts) the model is a continuous
// function, so the GPU must track the CPU closely everywhere: cosine >= 0.999 at every teacher-
// forced position, top-1 equal wherever the CPU's top-2 margin is >= 0.05 (the largest logit
// difference measured on the H200 was 0.11, flips only at margins <= 0.015), and free-running
// generations identical at least until the first such near-tie.
TEST_F(GpuGptOss, TeacherForcedWithoutRoutingChoiceTracksTheCpu) {
  const std::string dir = makeModel("E4k4", 4, 16);
  const TfStats st = teacherForced(dir, kPromptLengths, 0.05, "");
  std::cout << "[ teacher-forced ] E4k4: " << st.positions << " positions, worst cosine "
            << st.worst_cos << ", median " << st.cosines[st.cosines.size() / 2]
            << ", max |dlogit| " << st.max_abs << ", top-1 flips " << st.flips
            << " (decisive " << st.decisive_flips << "), free-running identical "
            << st.free_identical << "/10, identical until the first near-tie "
            << st.free_until_near_tie << "/10\n";
  EXPECT_GE(st.worst_cos, 0.999);
  EXPECT_EQ(st.decisive_flips, 0);
  EXPECT_EQ(st.free_until_near_tie, 10);
}

// The main shape routes each token to 4 of 8 experts: where the CPU's 4th and 5th router logits
// are within rounding, bf16 activations pick another expert and that position's logits move
// (measured: cosine down to 0.88 at a few positions; no such drop without routing, above). So
// here the GPU is held to what a bf16 model does: most positions track the CPU (median cosine >=
// 0.999, top-1 agreement >= 85%; measured on the H200 2026-12-02: median 0.99970, 91.6%, where
// Hugging Face transformers in bf16 reached 0.99921 and 85.3% and in fp32+TF32 0.9999992 and
// 98.4%), and tests/gpu/hf_llm_bar.py compares the same positions against transformers
// (GARDEN_LLM_BAR_DIR set: this test writes its inputs there).
TEST_F(GpuGptOss, RoutedModelTeacherForcedAgainstTheCpu) {
  const char* dump_env = std::getenv("GARDEN_LLM_BAR_DIR");
  std::string dump = dump_env != nullptr ? dump_env : "";
  std::string dir = *dir_;
  if (!dump.empty()) {
    fs::create_directories(dump + "/model");
    for (const auto& e : fs::directory_iterator(dir))
      fs::copy_file(e.path(), fs::path(dump) / "model" / e.path().filename(),
                    fs::copy_options::overwrite_existing);
  }
  const TfStats st = teacherForced(dir, kPromptLengths, 0.05, dump);
  const double agree = 1.0 - static_cast<double>(st.flips) / st.positions;
  std::cout << "[ teacher-forced ] E8k4: " << st.positions << " positions, worst cosine "
            << st.worst_cos << ", median " << st.cosines[st.cosines.size() / 2]
            << ", max |dlogit| " << st.max_abs << ", top-1 agreement " << agree
            << ", free-running identical " << st.free_identical << "/10\n";
  EXPECT_GE(st.cosines[st.cosines.size() / 2], 0.999);
  EXPECT_GE(agree, 0.85);
}

// [TAG_ATTN_F16] The attention block in fp16 (3 more significand bits on its norm output, q/k/v,
// KV cache, attention and O-proj outputs) against the same positions in bf16: the CPU emulation of
// rose's rounding sites (bench/results/bf16-sites-2026-12-05-cpu.md) predicts the routed model's
// agreement from ~91 % to ~97 % and its mean relative logit error ~3x smaller. Held: the error is
// smaller than bf16's by at least a third and the agreement is no lower (a bf16 rounding left in
// the block, or a wrong conversion, fails the first); both are reported.
TEST_F(GpuGptOss, Fp16AttentionTracksTheCpuCloserThanBf16) {
  const std::string dir = *dir_;
  const TfStats b = teacherForced(dir, kPromptLengths, 0.05, "", F16::kBf16);
  const TfStats h = teacherForced(dir, kPromptLengths, 0.05, "", F16::kAttn);
  const TfStats a = teacherForced(dir, kPromptLengths, 0.05, "", F16::kAll16);
  const TfStats f = teacherForced(dir, kPromptLengths, 0.05, "", F16::kDtype);
  auto agree = [](const TfStats& s) { return 1.0 - static_cast<double>(s.flips) / s.positions; };
  auto rel = [](const TfStats& s) { return s.rel_sum / s.positions; };
  auto line = [&](const char* name, const TfStats& s) {
    std::cout << "[ attn dtype ] E8k4 " << s.positions << " positions, " << name << ": agreement "
              << agree(s) << " mean rel err " << rel(s) << " median cos "
              << s.cosines[s.cosines.size() / 2] << " worst cos " << s.worst_cos << "\n";
  };
  line("bf16", b);
  line("fp16 attention", h);
  line("fp16 everywhere, 16-bit outputs", a);
  line("--dtype float16 (QKV / O-proj / MoE outputs in f32)", f);
  EXPECT_LT(rel(h), rel(b) * (2.0 / 3.0));
  EXPECT_GE(agree(h), agree(b));
  EXPECT_GE(h.cosines[h.cosines.size() / 2], 0.999);
  // [TAG_ATTN_F16] The MoE side and lm_head in fp16 too: the emulation predicts the error ~2.4x
  // below fp16 attention alone; held to 0.8x, and an agreement no lower than bf16's (measured on
  // the H200: 0.0107 vs 0.0203, 97.5 % vs 94.4 % and 88.8 % for bf16).
  EXPECT_LT(rel(a), rel(h) * 0.8);
  EXPECT_GE(agree(a), agree(b));
  // [TAG_PROJ_F32] Three roundings fewer per layer (q/k before RoPE, the O-proj output, the MoE
  // output): the error must drop, not merely stay.
  EXPECT_LT(rel(f), rel(a));
  EXPECT_GE(agree(f), agree(b));
}

// --moe-weights fp8 [TAG_FP8_EXPERTS]: MXFP4 experts plus the FP8 copy, forced onto every MoE step
// here (graphs off), against the MXFP4 experts of the same checkpoint, teacher-forced on the
// MXFP4 path's greedy tokens (one prefill pass per prompt, every position's logits) and free-
// running. e4m3 rounds both expert activations (x and the SwiGLU output) to 3 mantissa bits (~2.5 %
// RMS each, tests/gpu/fp8_moe_test.cc), far more than bf16's rounding, so top-1 flips where the
// logits are close and free-running generations part at the first flip: the agreement is reported,
// and only what a correct path must reach is held (median cosine >= 0.99, top-1 agreement >= 0.5;
// a wrong layout, scale or range gives unrelated logits, cosine ~0). With the default threshold
// only a prefill step of >= 1024 tokens takes the FP8 experts, the decode steps the MXFP4 kernels.
TEST_F(GpuGptOss, Fp8ExpertsTrackTheMxfp4Path) {
  // bf16 activations (the FP8 experts' only input), under GARDEN_TEST_GPTOSS_DTYPE too.
  Runner mx = load(*dir_, "cuda", MoeWeightsMode::kMxfp4, nullptr, /*cuda_graphs=*/false, GptOssOptions{}.fuse_combine_norm,
                   CudaKernelOptions::MoePrefill::kTiled, CudaKernelOptions{}.moe_lt_wgmma, F16::kBf16);
  Runner f8 = load(*dir_, "cuda", MoeWeightsMode::kFp8, &mx, /*cuda_graphs=*/false, GptOssOptions{}.fuse_combine_norm,
                   CudaKernelOptions::MoePrefill::kTiled, CudaKernelOptions{}.moe_lt_wgmma, F16::kBf16);
  ASSERT_TRUE(f8.model->fp8Experts());
  ASSERT_FALSE(mx.model->fp8Experts());
  std::cout << "[ fp8 model ] " << f8.model->fp8InexactWeights() << " of "
            << f8.model->fp8NonzeroWeights() << " non-zero expert weights inexact in e4m3\n";
  std::vector<double> cosines;
  int positions = 0, agree = 0, free_total = 0;
  {
    cuda::setMoeFp8MinTokens(1);
    for (int len : {5, 33, 129, 300, 1000}) {
      auto p = prompt(len, static_cast<uint32_t>(len) + 91);
      mx.next_block = 0;
      auto tm = generate(mx, p, 32, 2048, nullptr);
      std::vector<int32_t> all = p;
      all.insert(all.end(), tm.begin(), tm.end() - 1);
      mx.next_block = 0;
      f8.next_block = 0;
      const uint64_t steps0 = cuda::moeFp8Steps();
      auto lm = prefillLogits(mx, all, len - 1);
      EXPECT_EQ(cuda::moeFp8Steps(), steps0) << "the MXFP4 model took the FP8 path";
      auto lf = prefillLogits(f8, all, len - 1);
      EXPECT_GT(cuda::moeFp8Steps(), steps0) << "the FP8 model did not take the FP8 path";
      ASSERT_EQ(lm.size(), lf.size());
      for (size_t i = 0; i < lm.size(); ++i) {
        const Diff df = diff(lm[i], lf[i]);
        cosines.push_back(df.cos);
        agree += df.top1;
        ++positions;
      }
      f8.next_block = 0;
      auto tf = generate(f8, p, 32, 2048, nullptr);
      size_t same = 0;
      while (same < tm.size() && tm[same] == tf[same]) ++same;
      free_total += static_cast<int>(same);
      std::cout << "[ fp8 model ] prompt " << len << ": free-running " << same
                << "/32 tokens identical to MXFP4\n";
    }
    cuda::setMoeFp8MinTokens(cuda::kMoeFp8DefaultMinTokens);
  }
  std::sort(cosines.begin(), cosines.end());
  const double agreement = static_cast<double>(agree) / positions;
  std::cout << "[ fp8 model ] teacher-forced " << positions << " positions: top-1 agreement "
            << agreement << ", cosine worst " << cosines.front() << " median "
            << cosines[cosines.size() / 2] << "; free-running " << free_total
            << "/160 tokens before the first difference\n";
  EXPECT_GE(cosines[cosines.size() / 2], 0.99);
  EXPECT_GE(agreement, 0.5);
  // Default threshold: a 1100-token prefill step on FP8 (one MoE call per layer), decode not; a
  // 300-token one (below the threshold) not either.
  f8.next_block = 0;
  const uint64_t steps0 = cuda::moeFp8Steps();
  generate(f8, prompt(300, 5), 4, 2048, nullptr);
  EXPECT_EQ(cuda::moeFp8Steps(), steps0) << "a 300-token step took FP8 below the threshold";
  f8.next_block = 0;
  generate(f8, prompt(1100, 5), 4, 2048, nullptr);
  EXPECT_EQ(cuda::moeFp8Steps() - steps0,
            static_cast<uint64_t>(f8.model->config().base.num_hidden_layers));
}

// --moe-prefill cublas [TAG_MOE_LT_BF16]: the same model's MoE steps on the bf16 cuBLASLt path
// (the MXFP4 experts dequantized per step; forced onto every step here, graphs off) against the
// tiled MXFP4 kernels, teacher-forced on the tiled path's greedy tokens. The weights are exact in
// both; what differs is bf16 rounding (the gate_up output before the SwiGLU, the down output before
// its bias) and cuBLASLt's summation order, so the logits stay close (median cosine >= 0.999) and
// top-1 flips only where the logits nearly tie (agreement >= 0.8; a wrong range, expert or layout
// gives unrelated logits). With the default threshold a 1100-token prefill step takes it (one MoE
// call per layer), a 300-token one does not.
TEST_F(GpuGptOss, LtBf16PrefillTracksTheTiledKernels) {
  // The first load creates the backend (which sets the threshold from its options: off); the
  // second shares it and uploads with the path switched on, so the bf16 scratch exists.
  // bf16 activations (the cuBLASLt GEMMs' only input), under GARDEN_TEST_GPTOSS_DTYPE too.
  Runner base = load(*dir_, "cuda", MoeWeightsMode::kMxfp4, nullptr, /*cuda_graphs=*/false, GptOssOptions{}.fuse_combine_norm,
                   CudaKernelOptions::MoePrefill::kTiled, CudaKernelOptions{}.moe_lt_wgmma, F16::kBf16);
  cuda::setMoeLtBf16MinTokens(INT64_MAX);
  cuda::setMoeLtBf16MinRowsPerExpert(0);  // by tokens alone, whole steps (step mode)
  cuda::setMoeLtBf16PerChunk(false);
  CudaKernelOptions lt;
  lt.moe_lt_wgmma = false;  // the cuBLASLt GEMMs [TAG_MOE_WGMMA]: uploaded with their scratch
  cuda::applyMoeLt(lt);
  Runner m = load(*dir_, "cuda", MoeWeightsMode::kMxfp4, &base, /*cuda_graphs=*/false, GptOssOptions{}.fuse_combine_norm,
                   CudaKernelOptions::MoePrefill::kTiled, CudaKernelOptions{}.moe_lt_wgmma, F16::kBf16);
  std::vector<double> cosines;
  int positions = 0, agree = 0;
  for (int len : {5, 33, 129, 300, 1000}) {
    auto p = prompt(len, static_cast<uint32_t>(len) + 17);
    cuda::setMoeLtBf16MinTokens(INT64_MAX);  // off for every step
    m.next_block = 0;
    auto tm = generate(m, p, 32, 2048, nullptr);
    std::vector<int32_t> all = p;
    all.insert(all.end(), tm.begin(), tm.end() - 1);
    const uint64_t steps0 = cuda::moeLtBf16Steps();
    m.next_block = 0;
    auto lt = prefillLogits(m, all, len - 1);
    EXPECT_EQ(cuda::moeLtBf16Steps(), steps0) << "the path ran while off";
    cuda::setMoeLtBf16MinTokens(1);
    m.next_block = 0;
    auto lc = prefillLogits(m, all, len - 1);
    EXPECT_GT(cuda::moeLtBf16Steps(), steps0) << "the path did not run";
    ASSERT_EQ(lt.size(), lc.size());
    for (size_t i = 0; i < lt.size(); ++i) {
      const Diff df = diff(lt[i], lc[i]);
      cosines.push_back(df.cos);
      agree += df.top1;
      ++positions;
    }
  }
  std::sort(cosines.begin(), cosines.end());
  const double agreement = static_cast<double>(agree) / positions;
  std::cout << "[ bf16 cublaslt model ] teacher-forced " << positions
            << " positions: top-1 agreement " << agreement << ", cosine worst " << cosines.front()
            << " median " << cosines[cosines.size() / 2] << "\n";
  EXPECT_GE(cosines[cosines.size() / 2], 0.999);
  EXPECT_GE(agreement, 0.8);
  // Step mode's thresholds: >= 1024 tokens and >= 256 rows per expert (8 experts, top-4: 512
  // tokens): a 1000-token step does not take it, an 1100-token one does (one call per layer).
  cuda::applyMoePrefill(CudaKernelOptions::MoePrefill::kStep, kMoePrefillMinRowsPerExpert);
  m.next_block = 0;
  const uint64_t steps0 = cuda::moeLtBf16Steps();
  generate(m, prompt(1000, 5), 4, 2048, nullptr);
  EXPECT_EQ(cuda::moeLtBf16Steps(), steps0) << "a 1000-token step took the path below the threshold";
  m.next_block = 0;
  generate(m, prompt(1100, 5), 4, 2048, nullptr);
  EXPECT_EQ(cuda::moeLtBf16Steps() - steps0,
            static_cast<uint64_t>(m.model->config().base.num_hidden_layers));
  cuda::applyMoePrefill(CudaKernelOptions::MoePrefill::kTiled, 0);
  cuda::applyMoeLt(CudaKernelOptions{});
}

// A decode stream (prompt `small`) that prompt `large`'s whole prefill joins at its 5th token
// (runs: the decode row | the large chunk), the large prompt then decoded beside it: both give
// the tokens they gave alone.
void decodeThenJoin(Runner& gpu, const std::vector<int32_t>& small, const std::vector<int32_t>& large,
                    int tokens, const std::vector<int32_t>& alone_small,
                    const std::vector<int32_t>& alone_large) {
  Seq a, b;
  a.tokens = small;
  b.tokens = large;
  std::vector<int32_t> got_a, got_b;
  while (static_cast<int>(got_a.size()) < tokens) {
    std::vector<Seq*> batch{&a};
    const bool with_b = got_a.size() >= 4 && static_cast<int>(got_b.size()) < tokens;
    if (with_b) batch.push_back(&b);
    auto ids = step(gpu, batch, 2048, nullptr);
    ASSERT_EQ(ids.size(), batch.size());
    got_a.push_back(ids[0]);
    a.tokens.push_back(ids[0]);
    if (with_b) {
      got_b.push_back(ids[1]);
      b.tokens.push_back(ids[1]);
    }
  }
  EXPECT_EQ(got_a, alone_small);
  EXPECT_EQ(std::vector<int32_t>(alone_large.begin(), alone_large.begin() + got_b.size()), got_b);
}

// Three prompts prefilled in one step, then decoded together for `tokens` steps: each gives the
// tokens it gave alone (`alone`), the joint prefill makes `first_calls` calls of the MoE prefill
// path, and (when `decode_calls` >= 0) each decode step that many.
void prefillTogether(Runner& gpu, const std::vector<std::vector<int32_t>>& prompts, int tokens,
                     const std::vector<std::vector<int32_t>>& alone, uint64_t first_calls,
                     int64_t decode_calls) {
  std::vector<Seq> seqs(prompts.size());
  std::vector<Seq*> batch;
  for (size_t k = 0; k < prompts.size(); ++k) {
    seqs[k].tokens = prompts[k];
    batch.push_back(&seqs[k]);
  }
  std::vector<std::vector<int32_t>> got(prompts.size());
  for (int i = 0; i < tokens; ++i) {
    const uint64_t before = cuda::moeLtBf16Steps();
    auto ids = step(gpu, batch, 2048, nullptr);
    ASSERT_EQ(ids.size(), prompts.size());
    for (size_t k = 0; k < prompts.size(); ++k) {
      got[k].push_back(ids[k]);
      seqs[k].tokens.push_back(ids[k]);
    }
    if (i == 0) {
      EXPECT_EQ(cuda::moeLtBf16Steps() - before, first_calls) << "the joint prefill's path calls";
    } else if (decode_calls >= 0) {
      EXPECT_EQ(cuda::moeLtBf16Steps() - before, static_cast<uint64_t>(decode_calls))
          << "decode step " << i;
    }
  }
  for (size_t k = 0; k < prompts.size(); ++k) EXPECT_EQ(got[k], alone[k]) << "prompt " << k;
}

// rose's default, --moe-prefill chunk [TAG_MOE_LT_BF16]: each prefill chunk of >= 256 rows per
// expert (this model: 8 experts, top-4, so >= 512 tokens) runs its MoE on the bf16 cuBLASLt path
// as a call of its own; every other row (smaller chunks, decode rows) on the tiled kernels. So a
// sequence's tokens do not depend on the batch: two prompts with a large chunk and one without,
// alone and then prefilled in one step, and a decode stream that a large prompt's prefill joins
// mid-way, give the tokens they gave alone (greedy). The path's call count says which chunks
// took it.
TEST_F(GpuGptOss, ChunkModeTokensDoNotDependOnTheBatch) {
  // fp16 MoE steps have no cuBLASLt path (its GEMMs are bf16): the wgmma kernel only.
  for (bool wgmma : fp16Everywhere() ? std::vector<bool>{true} : std::vector<bool>{false, true}) {
    SCOPED_TRACE(wgmma ? "wgmma kernel" : "cuBLASLt GEMMs");
    // [TAG_MOE_WGMMA] set before the upload: the cuBLASLt GEMMs need their weight scratch.
    Runner gpu = load(*dir_, "cuda", MoeWeightsMode::kMxfp4, nullptr, /*cuda_graphs=*/false,
                      GptOssOptions{}.fuse_combine_norm, CudaKernelOptions::MoePrefill::kChunk, wgmma);
    // The floor: 256 rows per expert for the cuBLASLt GEMMs (8 experts, top-4: 512 tokens), 64
    // for the wgmma kernel (128 tokens).
    ASSERT_EQ(gpu.ops->moeChunkMinRowsPerExpert(),
              wgmma ? kMoeWgmmaMinRowsPerExpert : kMoePrefillMinRowsPerExpert);
    const uint64_t layers = static_cast<uint64_t>(gpu.model->config().base.num_hidden_layers);
    const auto small = prompt(wgmma ? 100 : 300, 61), large = prompt(600, 62), large2 = prompt(700, 63);
    constexpr int kTokens = 16;
    uint64_t before = cuda::moeLtBf16Steps();
    const auto alone_small = generate(gpu, small, kTokens, 2048, nullptr);
    EXPECT_EQ(cuda::moeLtBf16Steps(), before) << "a chunk below the floor took the path";
    before = cuda::moeLtBf16Steps();
    const auto alone_large = generate(gpu, large, kTokens, 2048, nullptr);
    EXPECT_EQ(cuda::moeLtBf16Steps() - before, layers) << "a 600-token chunk: one call per layer";
    const auto alone_large2 = generate(gpu, large2, kTokens, 2048, nullptr);

    // All three prefilled in one step (runs: small | large | large2: two large chunks), then
    // decoded together.
    prefillTogether(gpu, {small, large, large2}, kTokens, {alone_small, alone_large, alone_large2},
                    2 * layers, -1);

    // A decode stream that the large prompt's whole prefill joins at its 5th token (runs: the
    // decode row | the 600-token chunk), and the prompt then decoded beside it.
    decodeThenJoin(gpu, small, large, kTokens, alone_small, alone_large);

    // [TAG_MOE_BF16_COPY] The same checkpoint with a bf16 copy of the experts (--moe-weights
    // mxfp4-bf16): the path reads the copy instead of dequantizing per call — the same tokens. (With
    // the wgmma kernel on, a copy keeps the cuBLASLt GEMMs: other bits than the kernel's.)
    if (!wgmma) {
      Runner copy = load(*dir_, "cuda", MoeWeightsMode::kMxfp4Bf16, &gpu, /*cuda_graphs=*/false);
      before = cuda::moeLtBf16Steps();
      EXPECT_EQ(generate(copy, large, kTokens, 2048, nullptr), alone_large);
      EXPECT_EQ(cuda::moeLtBf16Steps() - before, layers) << "the copy's 600-token chunk: one call per layer";
      EXPECT_EQ(generate(copy, large2, kTokens, 2048, nullptr), alone_large2);
      EXPECT_EQ(generate(copy, small, kTokens, 2048, nullptr), alone_small);
    }
    cuda::applyMoePrefill(CudaKernelOptions::MoePrefill::kTiled, 0);
  }
  cuda::applyMoeLt(CudaKernelOptions{});
}

// rose's default, --moe-prefill auto [TAG_MOE_PREFILL_AUTO]: with the wgmma kernel running every
// expert, a whole step of >= 64 rows per expert (this model: 8 experts, top-4, so >= 128 tokens)
// is ONE MoE call on it — decode rows and small chunks included — because the kernel gives every
// row the tiled kernels' bits. So a sequence's tokens still do not depend on the batch: the
// scenario of the chunk test (three prompts alone, then prefilled in one step and decoded
// together; a decode stream that a large prefill joins), with the call counts saying the joint
// steps were single calls. With the kernel off, auto is chunk (the cuBLASLt GEMMs' bits differ
// from the tiled kernels'): the joint prefill is two chunk calls per layer again.
TEST_F(GpuGptOss, AutoModeTokensDoNotDependOnTheBatch) {
  // fp16 MoE steps have no cuBLASLt path (its GEMMs are bf16): the wgmma kernel only.
  for (bool wgmma : fp16Everywhere() ? std::vector<bool>{true} : std::vector<bool>{true, false}) {
    SCOPED_TRACE(wgmma ? "wgmma kernel" : "cuBLASLt GEMMs");
    Runner gpu = load(*dir_, "cuda", MoeWeightsMode::kMxfp4, nullptr, /*cuda_graphs=*/false,
                      GptOssOptions{}.fuse_combine_norm, CudaKernelOptions::MoePrefill::kAuto, wgmma);
    EXPECT_EQ(gpu.ops->moeWholeStep(), wgmma);
    ASSERT_EQ(gpu.ops->moeChunkMinRowsPerExpert(),
              wgmma ? kMoeWgmmaMinRowsPerExpert : kMoePrefillMinRowsPerExpert);
    const uint64_t layers = static_cast<uint64_t>(gpu.model->config().base.num_hidden_layers);
    // small: 100 tokens = 50 rows per expert (below 64); large, large2 above either floor.
    const auto small = prompt(wgmma ? 100 : 300, 81), large = prompt(600, 82), large2 = prompt(700, 83);
    constexpr int kTokens = 16;
    uint64_t before = cuda::moeLtBf16Steps();
    const auto alone_small = generate(gpu, small, kTokens, 2048, nullptr);
    EXPECT_EQ(cuda::moeLtBf16Steps(), before) << "a step below the floor took the path";
    before = cuda::moeLtBf16Steps();
    const auto alone_large = generate(gpu, large, kTokens, 2048, nullptr);
    EXPECT_EQ(cuda::moeLtBf16Steps() - before, layers) << "a 600-token step: one call per layer";
    const auto alone_large2 = generate(gpu, large2, kTokens, 2048, nullptr);
    // The joint prefill: one whole-step call per layer (wgmma) or two chunk calls; the 3 decode
    // rows of the later steps are below the floor.
    prefillTogether(gpu, {small, large, large2}, kTokens, {alone_small, alone_large, alone_large2},
                    (wgmma ? 1 : 2) * layers, 0);
    decodeThenJoin(gpu, small, large, kTokens, alone_small, alone_large);
    cuda::applyMoePrefill(CudaKernelOptions::MoePrefill::kTiled, 0);
  }
  cuda::applyMoeLt(CudaKernelOptions{});
}

// [TAG_MOE_WGMMA_DEVICE_PLAN] The wgmma path with its tiles planned on the device (no host wait
// per layer) gives the host plan's tokens: three prompts alone and prefilled together (one
// whole-step call per layer, --moe-prefill auto), and a decode stream a large prefill joins.
TEST_F(GpuGptOss, WgmmaDevicePlanGivesTheHostPlansTokens) {
  Runner gpu = load(*dir_, "cuda", MoeWeightsMode::kMxfp4, nullptr, /*cuda_graphs=*/false,
                    GptOssOptions{}.fuse_combine_norm, CudaKernelOptions::MoePrefill::kAuto, true);
  ASSERT_TRUE(gpu.ops->moeWholeStep());
  const uint64_t layers = static_cast<uint64_t>(gpu.model->config().base.num_hidden_layers);
  const auto small = prompt(100, 91), large = prompt(600, 92), large2 = prompt(900, 93);
  constexpr int kTokens = 12;
  // The host plan's tokens.
  CudaKernelOptions hp;
  hp.moe_wgmma_device_plan = false;
  cuda::applyMoeLt(hp);
  const auto alone_small = generate(gpu, small, kTokens, 2048, nullptr);
  const auto alone_large = generate(gpu, large, kTokens, 2048, nullptr);
  const auto alone_large2 = generate(gpu, large2, kTokens, 2048, nullptr);
  CudaKernelOptions dp;
  dp.moe_wgmma_device_plan = true;
  cuda::applyMoeLt(dp);
  const uint64_t before = cuda::moeWgmmaSteps();
  EXPECT_EQ(generate(gpu, large2, kTokens, 2048, nullptr), alone_large2);
  EXPECT_EQ(cuda::moeWgmmaSteps() - before, layers) << "the 900-token prefill: one call per layer";
  EXPECT_EQ(generate(gpu, large, kTokens, 2048, nullptr), alone_large);  // after a larger step
  prefillTogether(gpu, {small, large, large2}, kTokens, {alone_small, alone_large, alone_large2},
                  layers, 0);
  decodeThenJoin(gpu, small, large, kTokens, alone_small, alone_large);
  cuda::applyMoePrefill(CudaKernelOptions::MoePrefill::kTiled, 0);
  cuda::applyMoeLt(CudaKernelOptions{});
}

// [TAG_MOE_WGMMA] The chunk path's GEMMs as the wgmma kernel (CudaKernelOptions::moe_lt_wgmma):
// a 600-token chunk takes it once per layer; a decode stream that the chunk's prefill joins and
// the prompt itself give their tokens of alone (the kernel depends on the chunk's own rows only);
// teacher-forced logits track the tiled kernels (same numerics, another f32 summation order).
TEST_F(GpuGptOss, WgmmaChunkPathKeepsTheBatchAndTracksTheTiledKernels) {
  Runner gpu = load(*dir_, "cuda", MoeWeightsMode::kMxfp4, nullptr, /*cuda_graphs=*/false,
                    GptOssOptions{}.fuse_combine_norm, CudaKernelOptions::MoePrefill::kChunk);
  CudaKernelOptions on;
  on.moe_lt_wgmma = true;
  cuda::applyMoeLt(on);
  const uint64_t layers = static_cast<uint64_t>(gpu.model->config().base.num_hidden_layers);
  const auto small = prompt(300, 71), large = prompt(600, 72);
  constexpr int kTokens = 16;
  const auto alone_small = generate(gpu, small, kTokens, 2048, nullptr);
  uint64_t before = cuda::moeWgmmaSteps();
  const auto alone_large = generate(gpu, large, kTokens, 2048, nullptr);
  EXPECT_EQ(cuda::moeWgmmaSteps() - before, layers) << "a 600-token chunk: one wgmma call per layer";
  EXPECT_EQ(generate(gpu, large, kTokens, 2048, nullptr), alone_large) << "not deterministic";
  decodeThenJoin(gpu, small, large, kTokens, alone_small, alone_large);
  // Teacher-forced: the same tokens through the tiled kernels (the path off) and the wgmma kernel.
  std::vector<double> cosines;
  int positions = 0, agree = 0;
  for (int len : {600, 1000}) {
    auto p = prompt(len, static_cast<uint32_t>(len) + 29);
    std::vector<int32_t> all = p;
    all.insert(all.end(), alone_large.begin(), alone_large.end() - 1);
    cuda::setMoeLtBf16MinTokens(0);  // off: the tiled kernels
    gpu.next_block = 0;
    auto lt = prefillLogits(gpu, all, len - 1);
    cuda::applyMoePrefill(CudaKernelOptions::MoePrefill::kChunk, kMoePrefillMinRowsPerExpert);
    before = cuda::moeWgmmaSteps();
    gpu.next_block = 0;
    auto lw = prefillLogits(gpu, all, len - 1);
    EXPECT_GT(cuda::moeWgmmaSteps(), before) << "the wgmma kernel did not run";
    ASSERT_EQ(lt.size(), lw.size());
    for (size_t i = 0; i < lt.size(); ++i) {
      const Diff df = diff(lt[i], lw[i]);
      cosines.push_back(df.cos);
      agree += df.top1;
      ++positions;
    }
  }
  std::sort(cosines.begin(), cosines.end());
  const double agreement = static_cast<double>(agree) / positions;
  std::cout << "[ wgmma model ] teacher-forced " << positions << " positions vs tiled: top-1 agreement "
            << agreement << ", cosine worst " << cosines.front() << " median "
            << cosines[cosines.size() / 2] << "\n";
  EXPECT_GE(cosines[cosines.size() / 2], 0.9995);
  EXPECT_GE(agreement, 0.9);
  cuda::applyMoeLt(CudaKernelOptions{});
  cuda::applyMoePrefill(CudaKernelOptions::MoePrefill::kTiled, 0);
}

}  // namespace
}  // namespace garden::rose::gputest
