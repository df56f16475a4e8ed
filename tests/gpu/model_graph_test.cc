// The Qwen3 forward pass through CUDA graphs, as the embedding runner runs it ([TAG_GRAPH_EXEC]): a random
// Qwen3 checkpoint (head_dim 128, GQA 2:1, written here) on the CUDA backend, every batch padded to
// its (sequences, tokens) bucket and run eager -> capture -> replay by the graph cache. Checks:
//   - every graphed run (eager, capture, replay, on fresh random batches of many shapes and all
//     three pooling modes) is bit-identical to the unpadded eager pass, output poisoned first;
//   - a sequence's embedding is the same whatever else is in its batch (alone, or among others in
//     other buckets): bit-identical within one GEMM M bucket, to within bf16 rounding across
//     buckets (the tuned cuBLASLt algorithm, split-K included, is chosen per M bucket; gemm.h);
//   - yes/no scoring through graphs equals eager scoring;
//   - precapture makes the first batch of a bucket a replay;
//   - the graphed CUDA result agrees with the CPU fp32 reference (cosine);
//   - the step loop running the EmbeddingRunner on the shm channel with --cuda-graphs on
//     publishes exactly the eager results (and counts eager / capture / replay), with graphs off
//     too; precapture through the runner;
//   - [TAG_EMBED_FP8] with --weights fp8 / fp8-mlp: embeddings against the bf16 model's (lengths
//     1 to 4089, batches; guards at cosine 0.995 / 0.9975, below issue 17's 0.999 which neither
//     meets), graphed == eager bit for bit, batch
//     independence.
// Label `gpu`.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "common/shm/channel.h"
#include "services/rose/engine/embedding_runner.h"
#include "services/rose/engine/step_loop.h"
#include "services/rose/model/qwen3.h"
#include "services/rose/ops/cuda/cuda_backend.h"
#include "tests/gpu/gpu_test_util.h"

namespace garden::rose::gputest {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 1000, kHidden = 256, kInter = 512, kLayers = 2, kHq = 4, kHkv = 2,
                  kD = 128, kMaxPos = 4096;

struct TempDir {
  fs::path path;
  TempDir() {
    char t[] = "/tmp/gpu_model_graph_XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TensorToWrite f32Tensor(const std::string& name, std::vector<int64_t> shape,
                        const std::vector<float>& v) {
  TensorToWrite t;
  t.name = name;
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  t.data.resize(v.size() * sizeof(float));
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

// A Qwen3 checkpoint with bf16-representable random weights (f32 on disk: both backends see the
// same values), tied embeddings (the LM head serves yes/no scoring).
void writeCheckpoint(const fs::path& dir, std::mt19937& rng) {
  std::ofstream(dir / "config.json") << R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": false,
  "head_dim": 128, "hidden_act": "silu", "hidden_size": 256, "intermediate_size": 512,
  "max_position_embeddings": 4096, "num_attention_heads": 4, "num_hidden_layers": 2,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "tie_word_embeddings": true, "vocab_size": 1000, "dtype": "float32"
})";
  std::vector<TensorToWrite> ts;
  ts.push_back(f32Tensor("model.embed_tokens.weight", {kVocab, kHidden},
                         randomBf16(kVocab * kHidden, rng, -1.f, 1.f)));
  ts.push_back(f32Tensor("model.norm.weight", {kHidden}, randomBf16(kHidden, rng, 0.8f, 1.2f)));
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ts.push_back(
        f32Tensor(p + "input_layernorm.weight", {kHidden}, randomBf16(kHidden, rng, 0.8f, 1.2f)));
    ts.push_back(f32Tensor(p + "post_attention_layernorm.weight", {kHidden},
                           randomBf16(kHidden, rng, 0.8f, 1.2f)));
    ts.push_back(f32Tensor(p + "self_attn.q_norm.weight", {kD}, randomBf16(kD, rng, 0.8f, 1.2f)));
    ts.push_back(f32Tensor(p + "self_attn.k_norm.weight", {kD}, randomBf16(kD, rng, 0.8f, 1.2f)));
    ts.push_back(f32Tensor(p + "self_attn.q_proj.weight", {kHq * kD, kHidden},
                           randomBf16(kHq * kD * kHidden, rng, -0.1f, 0.1f)));
    ts.push_back(f32Tensor(p + "self_attn.k_proj.weight", {kHkv * kD, kHidden},
                           randomBf16(kHkv * kD * kHidden, rng, -0.1f, 0.1f)));
    ts.push_back(f32Tensor(p + "self_attn.v_proj.weight", {kHkv * kD, kHidden},
                           randomBf16(kHkv * kD * kHidden, rng, -0.1f, 0.1f)));
    ts.push_back(f32Tensor(p + "self_attn.o_proj.weight", {kHidden, kHq * kD},
                           randomBf16(kHidden * kHq * kD, rng, -0.05f, 0.05f)));
    ts.push_back(f32Tensor(p + "mlp.gate_proj.weight", {kInter, kHidden},
                           randomBf16(kInter * kHidden, rng, -0.1f, 0.1f)));
    ts.push_back(f32Tensor(p + "mlp.up_proj.weight", {kInter, kHidden},
                           randomBf16(kInter * kHidden, rng, -0.1f, 0.1f)));
    ts.push_back(f32Tensor(p + "mlp.down_proj.weight", {kHidden, kInter},
                           randomBf16(kHidden * kInter, rng, -0.05f, 0.05f)));
  }
  ASSERT_TRUE(writeSafetensors((dir / "model.safetensors").string(), ts).isOk());
}

struct Batch {
  std::vector<int32_t> ids, lens;
  BatchInput in() const { return {ids, lens}; }
};

Batch randomBatch(std::mt19937& rng, const std::vector<int32_t>& lens) {
  Batch b;
  b.lens = lens;
  std::uniform_int_distribution<int32_t> d(0, kVocab - 1);
  for (int32_t l : lens)
    for (int32_t i = 0; i < l; ++i) b.ids.push_back(d(rng));
  return b;
}

std::vector<int32_t> randomLens(std::mt19937& rng, int32_t n, int32_t max_len) {
  std::uniform_int_distribution<int32_t> d(1, max_len);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Inserts `target` (one sequence) at a random sequence position of `mix`; returns the position.
size_t insertSequence(Batch& mix, const Batch& target, std::mt19937& rng) {
  const size_t at = std::uniform_int_distribution<size_t>(0, mix.lens.size())(rng);
  size_t tok_at = 0;
  for (size_t s = 0; s < at; ++s) tok_at += static_cast<size_t>(mix.lens[s]);
  mix.lens.insert(mix.lens.begin() + static_cast<std::ptrdiff_t>(at), target.lens[0]);
  mix.ids.insert(mix.ids.begin() + static_cast<std::ptrdiff_t>(tok_at), target.ids.begin(),
                 target.ids.end());
  return at;
}

class ModelGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rng_.seed(::testing::UnitTest::GetInstance()->random_seed() + 11);
    writeCheckpoint(dir_.path, rng_);
    BackendOptions bo;
    bo.max_batch_tokens = 4096;
    // The GARDEN_* kernel variables apply as in rose (e.g. GARDEN_PDL_GRAPH=1).
    ASSERT_TRUE(cudaKernelOptionsFromEnv(bo.cuda).isOk());
    auto gpu = makeBackend("cuda", bo);
    ASSERT_TRUE(gpu.isOk()) << "no CUDA backend: " << gpu.status().toString();
    gpu_ = std::move(gpu).value();
    ASSERT_NE(gpu_->graphs(), nullptr);
    Qwen3Options mo;
    mo.max_batch_tokens = 4096;
    mo.pooling_override = PoolMode::kLast;
    auto m = Qwen3Model::load(dir_.path.string(), *gpu_, mo);
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    model_ = std::move(m).value();
    ASSERT_TRUE(model_->graphsEnabled());
  }

  // Unpadded eager pass.
  std::vector<float> eager(const Batch& b, PoolMode mode, bool normalize) {
    std::vector<float> out(b.lens.size() * kHidden, std::nanf(""));
    model_->enqueueEmbed(b.in(), mode, normalize, out.data());
    EXPECT_TRUE(gpu_->synchronize().isOk());
    return out;
  }
  std::vector<float> graphed(const Batch& b, PoolMode mode, bool normalize) {
    std::vector<float> out(b.lens.size() * kHidden, std::nanf(""));
    Status st = model_->enqueueEmbedGraphed(*gpu_->graphs(), b.in(), mode, normalize, out.data());
    EXPECT_TRUE(st.isOk()) << st.toString();
    EXPECT_TRUE(gpu_->synchronize().isOk());
    return out;
  }

  TempDir dir_;
  std::mt19937 rng_;
  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Qwen3Model> model_;
};

void expectBitEqual(const std::vector<float>& a, const std::vector<float>& b,
                    const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t diff = 0, first = a.size();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      if (first == a.size()) first = i;
      ++diff;
      worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
  }
  EXPECT_EQ(diff, 0u) << what << ": " << diff << " of " << a.size() << " values differ (first at "
                      << first << ", worst |diff| " << worst << ")";
}

TEST_F(ModelGraphTest, GraphedRunsEqualEagerOnRandomBatchesOfManyShapes) {
  // (sequences, longest) shapes; each shape is run 4 times with fresh inputs whose lengths keep
  // the same bucket, so the bucket goes eager -> capture -> replay -> replay.
  const std::vector<std::pair<int32_t, int32_t>> shapes = {
      {1, 1}, {1, 100}, {1, 700}, {1, 2000}, {3, 50}, {7, 300}, {16, 64}, {40, 90}, {2, 1500}};
  const PoolMode modes[] = {PoolMode::kLast, PoolMode::kMean, PoolMode::kCls};
  int case_no = 0;
  for (const auto& [n, max_len] : shapes) {
    const PoolMode mode = modes[case_no % 3];
    const bool normalize = case_no % 2 == 0;
    ++case_no;
    // First batch fixes the bucket; later ones are drawn until they land in the same one.
    Batch first = randomBatch(rng_, randomLens(rng_, n, max_len));
    auto bucketOf = [](const Batch& b) {
      int64_t t = 0;
      for (int32_t l : b.lens) t += l;
      return std::make_pair(graphSeqsBucket(static_cast<uint32_t>(b.lens.size()) + 1),
                            graphTokensBucket(static_cast<uint32_t>(t)));
    };
    const auto bucket = bucketOf(first);
    const GraphExecStats before = gpu_->graphs()->graphStats();
    for (int rep = 0; rep < 4; ++rep) {
      Batch b = first;
      if (rep > 0) {
        for (int tries = 0; tries < 200; ++tries) {
          b = randomBatch(rng_, randomLens(rng_, n, max_len));
          if (bucketOf(b) == bucket) break;
        }
        if (bucketOf(b) != bucket) b = randomBatch(rng_, first.lens);  // same lengths, new ids
      }
      const std::string what = "shape " + std::to_string(n) + "x<=" + std::to_string(max_len) +
                               " mode " + std::to_string(static_cast<int>(mode)) + " rep " +
                               std::to_string(rep);
      auto want = eager(b, mode, normalize);
      auto got = graphed(b, mode, normalize);
      expectBitEqual(got, want, what);
    }
    const GraphExecStats after = gpu_->graphs()->graphStats();
    EXPECT_EQ(after.eager - before.eager, 1u) << "shape " << n << "x" << max_len;
    EXPECT_EQ(after.captures - before.captures, 1u) << "shape " << n << "x" << max_len;
    EXPECT_EQ(after.replays - before.replays, 2u) << "shape " << n << "x" << max_len;
    EXPECT_EQ(after.capture_failures, 0u);
  }
}

TEST_F(ModelGraphTest, SequenceEmbeddingDoesNotDependOnItsBatch) {
  const bool tuned = static_cast<cuda::CudaBackend&>(*gpu_).gemm().tuning();
  for (PoolMode mode : {PoolMode::kLast, PoolMode::kMean}) {
    Batch target = randomBatch(rng_, {237});
    Batch alone_b = target;
    // Alone (graphed twice: eager then captured), then among others at several positions.
    auto alone = graphed(alone_b, mode, true);
    auto alone2 = graphed(alone_b, mode, true);
    expectBitEqual(alone2, alone, "alone, captured vs eager");
    for (int32_t others : {1, 5, 30}) {
      for (int rep = 0; rep < 2; ++rep) {
        // At most 237 + 3000 tokens: inside the model's 4096-token budget.
        Batch mix = randomBatch(rng_, randomLens(rng_, others, others > 5 ? 100 : 400));
        const size_t at = insertSequence(mix, target, rng_);
        auto out = graphed(mix, mode, true);
        std::vector<float> row(out.begin() + static_cast<std::ptrdiff_t>(at * kHidden),
                               out.begin() + static_cast<std::ptrdiff_t>((at + 1) * kHidden));
        const std::string what = "mode " + std::to_string(static_cast<int>(mode)) + ", among " +
                                 std::to_string(others) + " others at position " +
                                 std::to_string(at);
        int64_t mix_tokens = 0;
        for (int32_t l : mix.lens) mix_tokens += l;
        if (cuda::GemmRunner::algoBucket(mix_tokens) == cuda::GemmRunner::algoBucket(237) ||
            !tuned) {
          expectBitEqual(row, alone, what);
        } else {
          // Another M bucket may run other GEMM algorithms (split-K changes the f32 summation
          // order), so the row equals the lone run only to within bf16 rounding (gemm.h).
          expectSameWithinBf16(row.data(), alone.data(), kHidden, 0.99999, 4, what);
        }
        auto ref = eager(mix, mode, true);
        expectBitEqual(out, ref, "mixed batch graphed vs eager");
      }
    }
  }
}

TEST_F(ModelGraphTest, ScoresThroughGraphsEqualEager) {
  const ScoreRequest req{5, 7};
  ASSERT_TRUE(model_->validateScore(req).isOk());
  for (int rep = 0; rep < 4; ++rep) {
    Batch b = randomBatch(rng_, {120, 33, 300});
    std::vector<float> want(3, std::nanf("")), got(3, std::nanf(""));
    model_->enqueueScore(b.in(), req, want.data());
    ASSERT_TRUE(gpu_->synchronize().isOk());
    ASSERT_TRUE(model_->enqueueScoreGraphed(*gpu_->graphs(), b.in(), req, got.data()).isOk());
    ASSERT_TRUE(gpu_->synchronize().isOk());
    expectBitEqual(got, want, "scores rep " + std::to_string(rep));
    for (float v : got) EXPECT_TRUE(v >= 0.f && v <= 1.f) << v;  // a sigmoid, never NaN
  }
}

TEST_F(ModelGraphTest, PrecaptureMakesTheFirstBatchAReplay) {
  ASSERT_TRUE(model_->precaptureEmbed(*gpu_->graphs(), 4, 1000, PoolMode::kLast, true).isOk());
  const GraphExecStats before = gpu_->graphs()->graphStats();
  Batch b = randomBatch(rng_, {250, 250, 250, 230});  // 980 tokens: bucket (8, 1024) as 4x1000
  auto want = eager(b, PoolMode::kLast, true);
  auto got = graphed(b, PoolMode::kLast, true);
  expectBitEqual(got, want, "after precapture");
  const GraphExecStats after = gpu_->graphs()->graphStats();
  EXPECT_EQ(after.replays - before.replays, 1u);
  EXPECT_EQ(after.eager - before.eager, 0u);
  EXPECT_EQ(after.captures - before.captures, 0u);
  // Bad precapture requests are refused with a reason.
  EXPECT_FALSE(model_->precaptureEmbed(*gpu_->graphs(), 5, 4, PoolMode::kLast, true).isOk());
  EXPECT_FALSE(model_->precaptureEmbed(*gpu_->graphs(), 1, 5000, PoolMode::kLast, true).isOk());
}

TEST_F(ModelGraphTest, GraphedCudaAgreesWithCpuReference) {
  BackendOptions bo;
  bo.threads = 4;
  bo.max_batch_tokens = 4096;
  auto cpu = makeBackend("cpu", bo);
  ASSERT_TRUE(cpu.isOk());
  ASSERT_EQ((*cpu)->graphs(), nullptr);
  Qwen3Options mo;
  mo.max_batch_tokens = 4096;
  mo.pooling_override = PoolMode::kLast;
  auto cm = Qwen3Model::load(dir_.path.string(), **cpu, mo);
  ASSERT_TRUE(cm.isOk()) << cm.status().toString();
  EXPECT_FALSE((*cm)->graphsEnabled());
  Batch b = randomBatch(rng_, {5, 130, 77, 400});
  for (PoolMode mode : {PoolMode::kLast, PoolMode::kMean, PoolMode::kCls}) {
    graphed(b, mode, true);  // eager, then the capture below
    auto got = graphed(b, mode, true);
    std::vector<float> ref(b.lens.size() * kHidden, std::nanf(""));
    (*cm)->enqueueEmbed(b.in(), mode, true, ref.data());
    ASSERT_TRUE((*cpu)->synchronize().isOk());
    for (size_t s = 0; s < b.lens.size(); ++s) {
      const double cs = rowCosine(got, ref, static_cast<int64_t>(s), kHidden);
      EXPECT_GE(cs, 0.999) << "mode " << static_cast<int>(mode) << " sequence " << s;
    }
  }
}

// The step loop on a real shm channel running the EmbeddingRunner, CUDA backend: what it
// publishes equals the eager model pass.
// [TAG_EMBED_FP8] The same checkpoint with --weights fp8 (all four projections in FP8 e4m3,
// 128x128 block scales; inputs quantized per token and 128 inputs) and fp8-mlp (gate_up and down
// only) beside the bf16 model on one backend (each model's graphs are its own).
class ModelFp8Test : public ModelGraphTest {
 protected:
  void SetUp() override {
    ModelGraphTest::SetUp();
    if (HasFatalFailure()) return;
    for (uint32_t mask : {kFp8All, kFp8Mlp}) {
      Qwen3Options mo;
      mo.max_batch_tokens = 4096;
      mo.pooling_override = PoolMode::kLast;
      mo.fp8_projections = mask;
      auto m = Qwen3Model::load(dir_.path.string(), *gpu_, mo);
      ASSERT_TRUE(m.isOk()) << m.status().toString();
      (mask == kFp8All ? all_ : mlp_) = std::move(m).value();
    }
  }
  std::vector<float> run(Qwen3Model& m, const Batch& b, PoolMode mode, bool graphed) {
    std::vector<float> out(b.lens.size() * kHidden, std::nanf(""));
    if (graphed) {
      Status st = m.enqueueEmbedGraphed(*gpu_->graphs(), b.in(), mode, true, out.data());
      EXPECT_TRUE(st.isOk()) << st.toString();
    } else {
      m.enqueueEmbed(b.in(), mode, true, out.data());
    }
    EXPECT_TRUE(gpu_->synchronize().isOk());
    return out;
  }
  std::unique_ptr<Qwen3Model> all_, mlp_;
};

// The accuracy of each choice against bf16 on this random two-layer model. Neither meets issue 17's
// 0.999 (measured on an H100: all four projections worst 0.99728 on 2026-12-06 and 0.99753 on
// 2026-12-07; the MLP alone 0.99868 on 2026-12-07; on the 0.6B shape, rose_forward_bench
// --weights-ab, 0.984 and 0.996), so both stay opt-in. The bars below are regression guards set
// under those measurements (a wrong scale or layout gives cosines far below them), and the MLP
// alone must stay closer to bf16 than all four.
TEST_F(ModelFp8Test, EmbeddingsAgainstBf16) {
  const std::vector<std::vector<int32_t>> shapes = {
      {1}, {2, 3, 5}, {4000}, randomLens(rng_, 30, 100), {237, 1024, 2000}, {7, 4089}};
  double worst[2] = {1.0, 1.0}, max_diff[2] = {0.0, 0.0};
  for (PoolMode mode : {PoolMode::kLast, PoolMode::kMean}) {
    for (const auto& lens : shapes) {
      Batch b = randomBatch(rng_, lens);
      auto want = eager(b, mode, true);
      for (int v = 0; v < 2; ++v) {
        auto got = run(v == 0 ? *all_ : *mlp_, b, mode, false);
        for (size_t s = 0; s < lens.size(); ++s) {
          const double cos = rowCosine(got, want, static_cast<int64_t>(s), kHidden);
          worst[v] = std::min(worst[v], cos);
          EXPECT_GE(cos, v == 0 ? 0.995 : 0.9975)
              << (v == 0 ? "fp8" : "fp8-mlp") << ": sequence " << s << " of " << lens.size()
              << " (length " << lens[s] << "), mode " << static_cast<int>(mode);
        }
        for (size_t i = 0; i < got.size(); ++i)
          max_diff[v] = std::max(max_diff[v], std::fabs(static_cast<double>(got[i]) - want[i]));
      }
    }
  }
  EXPECT_GT(worst[1], worst[0]) << "the MLP alone in FP8 is further from bf16 than all four";
  for (int v = 0; v < 2; ++v) {
    EXPECT_GT(max_diff[v], 0.0) << "an fp8 model gave the bf16 model's bits: FP8 path not taken?";
    std::printf("  %s vs bf16: worst cosine %.6f, max |diff| %.3g\n", v == 0 ? "fp8" : "fp8-mlp",
                worst[v], max_diff[v]);
  }
}

TEST_F(ModelFp8Test, GraphedRunsEqualEagerBitForBit) {
  for (int rep = 0; rep < 6; ++rep) {
    const int32_t n = std::uniform_int_distribution<int32_t>(1, 12)(rng_);
    Batch b = randomBatch(rng_, randomLens(rng_, n, rep % 2 ? 300 : 40));
    for (Qwen3Model* m : {all_.get(), mlp_.get()}) {
      for (PoolMode mode : {PoolMode::kLast, PoolMode::kMean}) {
        auto ref = run(*m, b, mode, false);
        for (int r = 0; r < 3; ++r)  // eager, capture, replay
          expectBitEqual(run(*m, b, mode, true), ref,
                         "batch " + std::to_string(rep) + " run " + std::to_string(r) +
                             (m == all_.get() ? " fp8" : " fp8-mlp"));
      }
    }
  }
}

TEST_F(ModelFp8Test, SequenceEmbeddingDoesNotDependOnItsBatch) {
  Batch target = randomBatch(rng_, {237});
  auto alone = run(*all_, target, PoolMode::kLast, true);
  for (int32_t others : {1, 5, 30}) {
    Batch mix = randomBatch(rng_, randomLens(rng_, others, others > 5 ? 100 : 400));
    const size_t at = insertSequence(mix, target, rng_);
    auto out = run(*all_, mix, PoolMode::kLast, true);
    std::vector<float> row(out.begin() + static_cast<std::ptrdiff_t>(at * kHidden),
                           out.begin() + static_cast<std::ptrdiff_t>((at + 1) * kHidden));
    int64_t mix_tokens = 0;
    for (int32_t l : mix.lens) mix_tokens += l;
    const std::string what = "among " + std::to_string(others) + " others";
    if (cuda::GemmRunner::algoBucket(graphTokensBucket(static_cast<uint32_t>(mix_tokens))) ==
        cuda::GemmRunner::algoBucket(graphTokensBucket(237))) {
      expectBitEqual(row, alone, what);
    } else {
      // Another bucket may run another cuBLASLt algorithm (f32 summation order), and a changed
      // bf16 rounding can move an FP8 code of the next layer's input.
      const double cos = rowCosine(row, alone, 0, kHidden);
      EXPECT_GE(cos, 0.9999) << what;
    }
  }
}

class EngineGraphTest : public ModelGraphTest {
 protected:
  // The loop runs runner_ (replaced by each call: destroy the previous loop first).
  std::unique_ptr<StepLoop> makeEngine(bool graphs,
                                       std::vector<std::pair<int32_t, int64_t>> precapture = {}) {
    static std::atomic<int> counter{0};
    name_ = "/rose-gpu-engine-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    channel_.reset();
    auto ch = shm::Channel::create(name_, shm::Layout{3, 64 * 1024, 64 * kHidden * 4});
    EXPECT_TRUE(ch.isOk()) << ch.status().toString();
    if (!ch.isOk()) return nullptr;
    channel_.emplace(std::move(ch).value());
    EmbeddingRunnerOptions ro;
    ro.default_pooling = PoolMode::kLast;
    ro.cuda_graphs = graphs;
    ro.precapture = std::move(precapture);
    auto r = EmbeddingRunner::create(*gpu_, *model_, ro);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    if (!r.isOk()) return nullptr;
    runner_ = std::move(r).value();
    StepLoopOptions lo;
    lo.model_name = "random";
    auto e = StepLoop::create(*channel_, *gpu_, *runner_, lo);
    EXPECT_TRUE(e.isOk()) << e.status().toString();
    if (!e.isOk()) return nullptr;
    (*e)->announceReady();
    return std::move(e).value();
  }

  // Submits `b` in `slot`, steps the engine once and returns the published rows.
  std::vector<float> submit(StepLoop& e, uint32_t slot, const Batch& b, shm::PoolingMode pooling) {
    using namespace std::chrono_literals;
    auto in = channel_->inputArena(slot);
    std::memcpy(in.data(), b.ids.data(), b.ids.size() * 4);
    const uint64_t lens_off = (b.ids.size() * 4 + 63) / 64 * 64;
    std::memcpy(in.data() + lens_off, b.lens.data(), b.lens.size() * 4);
    std::memset(channel_->outputArena(slot).data(), 0xFF, b.lens.size() * kHidden * 4);  // poison
    shm::BatchDesc d;
    d.batch_id = ++next_id_;
    d.slot = slot;
    d.kind = shm::BatchKind::kEmbed;
    d.num_seqs = static_cast<uint32_t>(b.lens.size());
    d.num_tokens = static_cast<uint32_t>(b.ids.size());
    d.tokens_offset = 0;
    d.seqlens_offset = lens_off;
    d.pooling = pooling;
    d.normalize = 1;
    EXPECT_TRUE(channel_->trySubmit(d));
    EXPECT_TRUE(e.step(1s));
    auto c = channel_->waitCompletion(30s);
    EXPECT_TRUE(c.has_value());
    if (!c) return {};
    EXPECT_EQ(c->status_code, 0) << c->message;
    EXPECT_EQ(c->batch_id, d.batch_id);
    EXPECT_EQ(c->rows, b.lens.size());
    std::vector<float> v(b.lens.size() * kHidden);
    std::memcpy(v.data(), channel_->outputArena(slot).data(), v.size() * 4);
    return v;
  }

  void TearDown() override { channel_.reset(); }

  std::unique_ptr<EmbeddingRunner> runner_;
  std::string name_;
  std::optional<shm::Channel> channel_;
  uint64_t next_id_ = 1000;
};

TEST_F(EngineGraphTest, EnginePublishesEagerResultsThroughGraphs) {
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "graphs on" : "graphs off");
    auto e = makeEngine(graphs);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(runner_->graphs(), graphs);
    const std::vector<std::vector<int32_t>> shapes = {
        {100}, {90}, {120}, {77}, {300, 12, 40}, {250, 60, 40}, {5, 5, 5, 5, 5, 5, 5}};
    uint32_t slot = 0;
    for (const auto& lens : shapes) {
      Batch b = randomBatch(rng_, lens);
      for (auto [pm, mode] : {std::pair{shm::PoolingMode::kLast, PoolMode::kLast},
                              std::pair{shm::PoolingMode::kMean, PoolMode::kMean}}) {
        auto got = submit(*e, slot, b, pm);
        auto want = eager(b, mode, true);
        expectBitEqual(got, want, "engine batch of " + std::to_string(lens.size()) + " seqs");
        slot = (slot + 1) % 3;
      }
    }
    EXPECT_EQ(e->stats().batches_run, 2 * shapes.size());
    if (graphs) {
      const GraphExecStats st = runner_->graphStats();
      EXPECT_GT(st.replays, 0u);
      EXPECT_GT(st.captures, 0u);
      EXPECT_EQ(st.capture_failures, 0u);
    }
    ASSERT_TRUE(e->drain(std::chrono::seconds(30)));
  }
}

TEST_F(EngineGraphTest, EnginePrecaptureTurnsFirstBatchIntoReplay) {
  auto e = makeEngine(true, {{1, 512}, {2, 1000}});
  ASSERT_NE(e, nullptr);
  const GraphExecStats before = runner_->graphStats();
  EXPECT_GE(before.captures, 2u);
  Batch b = randomBatch(rng_, {500});  // bucket (2, 512)
  auto got = submit(*e, 0, b, shm::PoolingMode::kDefault);
  expectBitEqual(got, eager(b, PoolMode::kLast, true), "precaptured bucket");
  const GraphExecStats after = runner_->graphStats();
  EXPECT_EQ(after.replays - before.replays, 1u);
  EXPECT_EQ(after.eager, before.eager);
  ASSERT_TRUE(e->drain(std::chrono::seconds(30)));
  // A bucket that does not fit is refused at creation, naming it.
  EmbeddingRunnerOptions ro;
  ro.precapture = {{1, 100000}};
  auto bad = EmbeddingRunner::create(*gpu_, *model_, ro);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("1x100000"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace garden::rose::gputest
