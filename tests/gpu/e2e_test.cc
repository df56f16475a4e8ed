// End to end on the GPU: rose's Qwen3Model on the CUDA backend, at Qwen3-Embedding-0.6B shapes with
// random weights, against Hugging Face transformers (bf16) run on the same checkpoint by
// make_e2e_reference.py (the ctest fixture gpu_e2e_reference). Checks cosine >= 0.999 per
// sequence, and that a sequence's embedding does not depend on what else is in its batch:
// bit-identical when the batch's token count falls in the same GEMM M bucket (and always with
// GARDEN_GEMM_TUNE=0), to within bf16 rounding otherwise (the tuned cuBLASLt algorithm, split-K
// included, is chosen per M bucket: services/rose/ops/cuda/gemm.h). Label `gpu`.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "services/rose/model/qwen3.h"
#include "services/rose/ops/cuda/cuda_backend.h"
#include "tests/gpu/gpu_test_util.h"

namespace garden::rose::gputest {
namespace {

template <typename T>
std::vector<T> readAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path
                        << " (generate it with tests/gpu/make_e2e_reference.py)";
  std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<T> v(raw.size() / sizeof(T));
  std::memcpy(v.data(), raw.data(), v.size() * sizeof(T));
  return v;
}

std::string refDir() {
  if (const char* d = std::getenv("GARDEN_E2E_DIR")) return d;
  const char* b = std::getenv("GARDEN_BUILD_DIR");
  return std::string(b ? b : ".") + "/gpu_e2e";
}

TEST(GpuEndToEnd, Qwen3EmbeddingMatchesTransformersAndIsBatchInvariant) {
  const std::string dir = refDir();
  const auto lens = readAll<int32_t>(dir + "/seqlens.i32");
  const auto tokens = readAll<int32_t>(dir + "/tokens.i32");
  const auto hf = readAll<float>(dir + "/hf_embeddings.f32");
  const auto hf32 = readAll<float>(dir + "/hf_embeddings_fp32.f32");
  ASSERT_FALSE(lens.empty());
  ASSERT_EQ(static_cast<size_t>(std::accumulate(lens.begin(), lens.end(), 0)), tokens.size());

  BackendOptions bo;
  auto backend = makeBackend("cuda", bo);
  ASSERT_TRUE(backend.isOk()) << backend.status().toString();
  Backend& b = **backend;
  Qwen3Options opts;
  opts.max_batch_tokens = 8192;
  auto model = Qwen3Model::load(dir + "/model", b, opts);
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  const int64_t h = (*model)->hiddenSize();
  ASSERT_EQ(hf.size(), lens.size() * static_cast<size_t>(h));

  std::vector<int32_t> starts(lens.size(), 0);
  for (size_t i = 1; i < lens.size(); ++i) starts[i] = starts[i - 1] + lens[i - 1];
  auto embed = [&](const std::vector<size_t>& which) {
    std::vector<int32_t> tok, sl;
    for (size_t i : which) {
      tok.insert(tok.end(), tokens.begin() + starts[i], tokens.begin() + starts[i] + lens[i]);
      sl.push_back(lens[i]);
    }
    BatchInput in{tok, sl};
    Status v = (*model)->validate(in);
    EXPECT_TRUE(v.isOk()) << v.toString();
    std::vector<float> out(which.size() * static_cast<size_t>(h), std::nanf(""));
    (*model)->enqueueEmbed(in, PoolMode::kLast, true, out.data());
    Status s = b.synchronize();
    EXPECT_TRUE(s.isOk()) << s.toString();
    return out;
  };

  // All sequences in one batch, against transformers.
  std::vector<size_t> all(lens.size());
  std::iota(all.begin(), all.end(), 0);
  const auto batched = embed(all);
  double min_cos = 1.0;
  for (size_t i = 0; i < lens.size(); ++i) {
    const double c = rowCosine(batched, hf, static_cast<int64_t>(i), h);
    const double c32 =
        hf32.size() == hf.size() ? rowCosine(batched, hf32, static_cast<int64_t>(i), h) : 0;
    const double hf_vs_32 =
        hf32.size() == hf.size() ? rowCosine(hf, hf32, static_cast<int64_t>(i), h) : 0;
    std::printf(
        "e2e: len %5d cosine vs HF bf16 %.6f | vs HF fp32 %.6f | (HF bf16 vs HF fp32 %.6f)\n",
        lens[i], c, c32, hf_vs_32);
    min_cos = std::min(min_cos, c);
    EXPECT_GE(c, 0.999) << "sequence " << i << " (length " << lens[i] << ") cosine vs HF " << c;
  }
  std::printf("e2e: %zu sequences, min cosine vs transformers %.6f\n", lens.size(), min_cos);

  // The same sequence alone, and in a different batch: the same bits when both batches' GEMMs
  // use the same algorithms (same M bucket, or tuning off); otherwise equal to within bf16
  // rounding, 28 layers deep (cosine >= 0.9999, every value within 8 bf16 ulps of the row's
  // largest |value|).
  const bool tuned = static_cast<cuda::CudaBackend&>(b).gemm().tuning();
  const int64_t all_tokens = static_cast<int64_t>(tokens.size());
  size_t mismatches = 0, cross_bucket = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    const auto alone = embed({i});
    const float* in_batch = batched.data() + i * static_cast<size_t>(h);
    if (!tuned ||
        cuda::GemmRunner::algoBucket(lens[i]) == cuda::GemmRunner::algoBucket(all_tokens)) {
      if (std::memcmp(alone.data(), in_batch, alone.size() * 4) != 0) {
        ++mismatches;
        const double c = rowCosine(alone, batched, 0, h);
        ADD_FAILURE() << "sequence " << i << " (length " << lens[i]
                      << ") differs alone vs batched in the same GEMM bucket (cosine " << c << ")";
      }
    } else {
      ++cross_bucket;
      expectSameWithinBf16(alone.data(), in_batch, h, 0.9999, 8,
                           "e2e: sequence " + std::to_string(i) + " (length " +
                               std::to_string(lens[i]) + ") alone vs batched");
    }
  }
  std::vector<size_t> rev(all.rbegin(), all.rend());
  const auto reversed = embed(rev);
  for (size_t j = 0; j < rev.size(); ++j) {
    EXPECT_EQ(0, std::memcmp(reversed.data() + j * h, batched.data() + rev[j] * h, h * 4))
        << "sequence " << rev[j] << " differs when the batch order is reversed";
  }
  std::printf(
      "e2e: batch invariance: %zu bit mismatches within a bucket, %zu of %zu compared "
      "across GEMM buckets (tolerance)\n",
      mismatches, cross_bucket, lens.size());
}

// The project's rule: the CUDA backend agrees with the CPU fp32 reference backend. Long sequences
// only (where attention and RoPE matter most); prints the cosines against HF as context.
TEST(GpuEndToEnd, Qwen3CudaMatchesCpuReferenceOnLongSequences) {
  const std::string dir = refDir();
  const auto lens = readAll<int32_t>(dir + "/seqlens.i32");
  const auto tokens = readAll<int32_t>(dir + "/tokens.i32");
  const auto hf32 = readAll<float>(dir + "/hf_embeddings_fp32.f32");
  ASSERT_FALSE(lens.empty());
  BackendOptions bo;
  auto gpu = makeBackend("cuda", bo);
  auto cpu = makeBackend("cpu", bo);
  ASSERT_TRUE(gpu.isOk() && cpu.isOk());
  Qwen3Options opts;
  opts.max_batch_tokens = 4096;
  auto gm = Qwen3Model::load(dir + "/model", **gpu, opts);
  auto cm = Qwen3Model::load(dir + "/model", **cpu, opts);
  ASSERT_TRUE(gm.isOk()) << gm.status().toString();
  ASSERT_TRUE(cm.isOk()) << cm.status().toString();
  const int64_t h = (*gm)->hiddenSize();
  int32_t start = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    const int32_t len = lens[i];
    if (len >= 1000) {
      std::vector<int32_t> tok(tokens.begin() + start, tokens.begin() + start + len);
      std::vector<int32_t> sl = {len};
      BatchInput in{tok, sl};
      std::vector<float> g(static_cast<size_t>(h)), c(static_cast<size_t>(h));
      (*gm)->enqueueEmbed(in, PoolMode::kLast, true, g.data());
      ASSERT_TRUE((*gpu)->synchronize().isOk());
      (*cm)->enqueueEmbed(in, PoolMode::kLast, true, c.data());
      ASSERT_TRUE((*cpu)->synchronize().isOk());
      const double gc = rowCosine(g, c, 0, h);
      std::vector<float> ref(hf32.begin() + static_cast<int64_t>(i) * h,
                             hf32.begin() + static_cast<int64_t>(i + 1) * h);
      std::printf(
          "e2e-cpu: len %5d cosine cuda vs cpu %.6f | cpu vs HF fp32 %.6f | cuda vs HF fp32 %.6f\n",
          len, gc, rowCosine(c, ref, 0, h), rowCosine(g, ref, 0, h));
      EXPECT_GE(gc, 0.999) << "length " << len;
    }
    start += len;
  }
}

}  // namespace
}  // namespace garden::rose::gputest
