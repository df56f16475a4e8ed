#pragma once
// Helpers for the GPU test suite (tests/gpu, ctest label `gpu`): the CPU (fp32 reference) and CUDA
// backends side by side, random inputs rounded to bf16 (so both backends see identical values),
// output poisoning (all-ones bytes: NaN in bf16 and f32) and tolerance checks that report the
// worst element. Single-threaded test use only.

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "services/rose/ops/backend.h"
#include "services/rose/ops/llm_ops.h"

namespace garden::rose::gputest {

// Both backends; the test fails (never skips) when no CUDA device is present.
struct Backends {
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<Backend> gpu;
};
Backends makeBackends();

// n values uniform in [lo, hi), each rounded to a bf16-representable float.
std::vector<float> randomBf16(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f);

// Allocates (dtype, dims) on `b` and uploads `data` (f32 host values) into it.
OwnedTensor upload(Backend& b, DType dtype, std::initializer_list<int64_t> dims,
                   const std::vector<float>& data);
OwnedTensor uploadI32(Backend& b, std::initializer_list<int64_t> dims,
                      const std::vector<int32_t>& data);
OwnedTensor allocate(Backend& b, DType dtype, std::initializer_list<int64_t> dims);
// Fills the tensor with 0xFF bytes (NaN for bf16/f32) so unwritten outputs are caught.
void poison(Backend& b, const Tensor& t);
// Synchronizes and returns the tensor's values as float.
std::vector<float> download(Backend& b, const Tensor& t);
// Sequence lengths -> cu_seqlens: [0, l0, l0 + l1, ...] (size lens + 1).
std::vector<int32_t> cumulative(const std::vector<int32_t>& lens);

// Dense (unquantized) expert weights over borrowed views, as the MoE ops take them: `w1` the
// gate/up projection [experts, 2 * inter, hidden], `w2` the down projection [experts, hidden,
// inter] (f32 on the CPU reference, bf16 on the GPU).
struct DenseExperts {
  ExpertWeights w1, w2;
};
inline DenseExperts denseExperts(const Tensor& w1, const Tensor& w2, int64_t experts,
                                 int64_t inter, int64_t hidden) {
  DenseExperts d;
  d.w1.dense = w1;
  d.w1.experts = d.w2.experts = experts;
  d.w1.rows = 2 * inter;
  d.w1.cols = hidden;
  d.w2.dense = w2;
  d.w2.rows = hidden;
  d.w2.cols = inter;
  return d;
}

struct CloseStats {
  double max_abs = 0;  // worst |got - ref|
  double max_ref = 0;  // max |ref|
  int64_t worst = -1;  // index of the worst violation
  int64_t bad = 0;     // elements outside atol + rtol * |ref|
  int64_t nonfinite = 0;
};
CloseStats compare(const std::vector<float>& got, const std::vector<float>& ref, double atol,
                   double rtol);
// EXPECTs every element within atol + rtol*|ref| and finite; prints the worst one otherwise.
// Host reference of a linear layer: y[i, j] = sum_k x[i, k] w[j, k] in f32 (8 interleaved partial
// sums), no bias; x [m, k], w [n, k] row-major.
std::vector<float> hostLinear(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                              int64_t n, int64_t k);
// Multiprocessors of device 0.
int deviceSms();
// Two bf16 results of the same GEMM row computed with different f32 summation orders (another
// algorithm, split-K): each value within 2 bf16 ulps of the other, plus a small absolute floor.
void expectWithinBf16Rounding(const std::vector<float>& got, const std::vector<float>& want,
                              const std::string& what);
void expectClose(const std::vector<float>& got, const std::vector<float>& ref, double atol,
                 double rtol, const std::string& what);
// The gap between a logits row's two largest values (a greedy choice below some margin is a
// near-tie that rounding alone may decide).
double topTwoMargin(const float* v, int64_t n);
// Cosine similarity of rows [r*cols, (r+1)*cols).
double rowCosine(const std::vector<float>& a, const std::vector<float>& b, int64_t row,
                 int64_t cols);

// One sequence's embedding from two batches whose GEMMs ran in different M buckets: the tuned
// cuBLASLt algorithm (services/rose/ops/cuda/gemm.h; split-K included) may differ per bucket, so
// f32 summation orders, and therefore rare bf16 roundings, differ. EXPECTs the `cols` values at
// `got` / `want` to agree to within bf16 rounding: cosine >= min_cos and every |diff| <= max_ulps
// bf16 ulps of the larger row's largest |value|. Prints and returns the cosine.
double expectSameWithinBf16(const float* got, const float* want, int64_t cols, double min_cos,
                            int max_ulps, const std::string& what);

}  // namespace garden::rose::gputest
