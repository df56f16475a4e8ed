#include <cmath>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/sample.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// Order-preserving image of a float (NaN maps to -inf's image).
__device__ __forceinline__ uint32_t orderKey(float x) {
  if (isnan(x)) x = -INFINITY;
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The CPU sampler's SplitMix64-based mix (services/rose/ops/sampler.cc), bit for bit.
__device__ __forceinline__ uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
__device__ __forceinline__ uint64_t mixCounter(uint64_t seed, uint64_t counter) {
  return splitmix(splitmix(seed) ^ (counter * 0xd1342543de82ef95ULL + 0x2545f4914f6cdd1dULL));
}

__device__ __forceinline__ float blockSum(float v, float* red) {
  v = warpSum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < kWarps ? red[lane] : 0.f;
  t = warpSum(t);
  return __shfl_sync(0xffffffffu, t, 0);
}

__device__ __forceinline__ float blockMax(float v, float* red) {
  v = warpMax(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < kWarps ? red[lane] : -INFINITY;
  t = warpMax(t);
  return __shfl_sync(0xffffffffu, t, 0);
}

__device__ __forceinline__ int64_t blockCount(int64_t v, int64_t* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  int64_t t = lane < kWarps ? red[lane] : 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

// (score, id) maximum, lowest id among equal scores; `valid` false never wins.
struct Best {
  float v;
  int32_t id;
};
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.id < 0) return a;
  if (a.id < 0) return b;
  if (b.v > a.v || (b.v == a.v && b.id < a.id)) return b;
  return a;
}
__device__ __forceinline__ Best blockBest(Best b, float* rv, int32_t* ri) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best x{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.id, o)};
    b = better(b, x);
  }
  __syncthreads();
  if (lane == 0) {
    rv[warp] = b.v;
    ri[warp] = b.id;
  }
  __syncthreads();
  Best t{-INFINITY, -1};
  if (lane < kWarps) t = Best{rv[lane], ri[lane]};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best x{__shfl_xor_sync(0xffffffffu, t.v, o), __shfl_xor_sync(0xffffffffu, t.id, o)};
    t = better(t, x);
  }
  return Best{__shfl_sync(0xffffffffu, t.v, 0), __shfl_sync(0xffffffffu, t.id, 0)};
}

// The row's bitmask, nullptr when unmasked [TAG_TOKEN_MASK].
__device__ __forceinline__ const uint32_t* rowMask(const SampleArgs& a, const SampleRowDev& r) {
  return r.mask >= 0 && a.masks != nullptr ? a.masks + static_cast<int64_t>(r.mask) * a.mask_words
                                           : nullptr;
}
__device__ __forceinline__ bool allowed(const uint32_t* m, int64_t i) {
  return m == nullptr || ((m[i >> 5] >> (i & 31)) & 1u) != 0;
}

__global__ void __launch_bounds__(kThreads) sampleKernel(SampleArgs a) {
  __shared__ float red_f[kWarps];
  __shared__ int32_t red_i[kWarps];
  __shared__ int64_t red_c[kWarps];
  const SampleRowDev r = a.rows[blockIdx.x];
  const float* x = a.logits + static_cast<int64_t>(r.row) * a.vocab;
  const int64_t v = a.vocab;
  const int tid = threadIdx.x;

  if (!(r.temperature > 0.f)) return;  // greedy rows: greedyPartialKernel / greedyFinishKernel

  const float inv_t = 1.f / r.temperature;
  const uint32_t* m = rowMask(a, r);
  auto zAt = [&](int64_t i) {
    const float z = x[i] * inv_t;
    return isnan(z) || !allowed(m, i) ? -INFINITY : z;
  };
  // ---- top-k: the k-th largest key tau_k, and the id cut among ties ----
  uint32_t tau_k = 0;
  int64_t id_cut = v - 1;
  if (r.top_k > 0 && r.top_k < v) {
    uint64_t lo = 0, hi = 0xffffffffu;  // invariant: count(key >= lo) >= k
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo + 1) / 2;
      int64_t c = 0;
      for (int64_t i = tid; i < v; i += kThreads) c += orderKey(zAt(i)) >= mid;
      if (blockCount(c, red_c) >= r.top_k) lo = mid; else hi = mid - 1;
    }
    tau_k = static_cast<uint32_t>(lo);
    int64_t gt = 0, eq = 0;
    for (int64_t i = tid; i < v; i += kThreads) {
      const uint32_t k = orderKey(zAt(i));
      gt += k > tau_k;
      eq += k == tau_k;
    }
    gt = blockCount(gt, red_c);
    eq = blockCount(eq, red_c);
    const int64_t need = r.top_k - gt;
    if (eq > need) {  // keep the `need` lowest ids of the tie group
      int64_t clo = 0, chi = v - 1;  // smallest c with count(key == tau && id <= c) >= need
      while (clo < chi) {
        const int64_t mid = (clo + chi) / 2;
        int64_t c = 0;
        for (int64_t i = tid; i <= mid; i += kThreads) c += orderKey(zAt(i)) == tau_k;
        if (blockCount(c, red_c) >= need) chi = mid; else clo = mid + 1;
      }
      id_cut = clo;
    }
  }
  auto keptK = [&](int64_t i, uint32_t key) {
    return key > tau_k || (key == tau_k && i <= id_cut);
  };
  // ---- the maximum (the softmax shift) ----
  float mx = -INFINITY;
  for (int64_t i = tid; i < v; i += kThreads) {
    const float z = zAt(i);
    if (keptK(i, orderKey(z))) mx = fmaxf(mx, z);
  }
  mx = blockMax(mx, red_f);
  // All -inf: the lowest kept id. +inf present: those share the mass (z - mx would be NaN).
  const bool all_neg_inf = mx == -INFINITY;
  const bool pos_inf = mx == INFINITY;
  // min_p (the max is kept by top-k, so mx is the CPU's z_max): z >= mx + log(min_p).
  const bool use_min_p = r.min_p > 0.f && isfinite(mx);
  const double min_cut =
      use_min_p ? static_cast<double>(mx) + log(static_cast<double>(r.min_p)) : 0.0;
  auto kept = [&](int64_t i, uint32_t key, float z) {
    return keptK(i, key) && (!use_min_p || static_cast<double>(z) >= min_cut);
  };
  // ---- top-p: the largest key tau_p whose kept mass reaches top_p ----
  uint32_t tau_p = 0;
  if (r.top_p < 1.f && !all_neg_inf && !pos_inf) {
    float total = 0.f;
    for (int64_t i = tid; i < v; i += kThreads) {
      const float z = zAt(i);
      if (kept(i, orderKey(z), z)) total += expf(z - mx);
    }
    total = blockSum(total, red_f);
    const float target = r.top_p * total;
    uint64_t lo = 0, hi = orderKey(mx);  // invariant: mass(key >= lo) >= target
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo + 1) / 2;
      float m = 0.f;
      for (int64_t i = tid; i < v; i += kThreads) {
        const float z = zAt(i);
        const uint32_t k = orderKey(z);
        if (k >= mid && kept(i, k, z)) m += expf(z - mx);
      }
      if (blockSum(m, red_f) >= target) lo = mid; else hi = mid - 1;
    }
    tau_p = static_cast<uint32_t>(lo);
  }
  // ---- Gumbel-max draw over the kept set ----
  const uint64_t base = mixCounter(r.seed, r.counter);
  Best b{-INFINITY, -1};
  for (int64_t i = tid; i < v; i += kThreads) {
    const float z = zAt(i);
    const uint32_t k = orderKey(z);
    if (!kept(i, k, z) || k < tau_p || !allowed(m, i)) continue;
    float score;
    if (all_neg_inf) {
      score = 0.f;  // lowest id wins
    } else if (pos_inf) {
      if (z != INFINITY) continue;
      score = 0.f;
    } else {
      score = z;
    }
    if (!all_neg_inf) {
      const uint64_t h = splitmix(base ^ (static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL));
      const float u = (static_cast<float>(h >> 40) + 0.5f) * 0x1.0p-24f;  // (0, 1)
      score += -logf(-logf(u));
    }
    b = better(b, Best{score, static_cast<int32_t>(i)});
  }
  b = blockBest(b, red_f, red_i);
  if (b.id < 0 && m != nullptr) {
    // Every allowed logit -inf/NaN and top-k kept only masked ids: the lowest allowed id, as
    // the CPU sampler falls back to (b is block-uniform, so the reduction is too).
    Best f{0.f, -1};
    for (int64_t i = tid; i < v && f.id < 0; i += kThreads) {
      if (allowed(m, i)) f = Best{0.f, static_cast<int32_t>(i)};
    }
    b = blockBest(f, red_f, red_i);
  }
  if (tid == 0) a.out[blockIdx.x] = b.id < 0 ? 0 : b.id;
}

constexpr int kGreedyThreads = 256;

// Block (row, slice): the argmax (lowest id among equals, NaN never wins) of one slice of a
// greedy row's logits.
__global__ void __launch_bounds__(kGreedyThreads) greedyPartialKernel(SampleArgs a) {
  __shared__ float rv[kGreedyThreads / 32];
  __shared__ int32_t ri[kGreedyThreads / 32];
  const SampleRowDev r = a.rows[blockIdx.x];
  if (r.temperature > 0.f) return;
  const float* x = a.logits + static_cast<int64_t>(r.row) * a.vocab;
  const uint32_t* m = rowMask(a, r);
  const int64_t per = (a.vocab + kSampleGreedySlices - 1) / kSampleGreedySlices;
  const int64_t lo = blockIdx.y * per, hi = min(a.vocab, lo + per);
  Best b{-INFINITY, -1};
  for (int64_t i = lo + threadIdx.x; i < hi; i += kGreedyThreads) {
    if (!allowed(m, i)) continue;
    const float z = x[i];
    // NaN never wins; under a mask an allowed NaN/-inf still beats nothing (the lowest allowed id)
    b = better(b, Best{isnan(z) ? -INFINITY : z, isnan(z) && m == nullptr ? -1 : static_cast<int32_t>(i)});
  }
  // Block reduction (kGreedyThreads / 32 warps).
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best y{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.id, o)};
    b = better(b, y);
  }
  if (lane == 0) {
    rv[warp] = b.v;
    ri[warp] = b.id;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    Best t{-INFINITY, -1};
    for (int w = 0; w < kGreedyThreads / 32; ++w) t = better(t, Best{rv[w], ri[w]});
    static_cast<Best*>(a.partial)[blockIdx.x * kSampleGreedySlices + blockIdx.y] = t;
  }
}

// One warp per greedy row: the best of its slices.
__global__ void greedyFinishKernel(SampleArgs a) {
  const SampleRowDev r = a.rows[blockIdx.x];
  if (r.temperature > 0.f) return;
  const int lane = threadIdx.x;
  Best b = lane < kSampleGreedySlices
               ? static_cast<const Best*>(a.partial)[blockIdx.x * kSampleGreedySlices + lane]
               : Best{-INFINITY, -1};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best y{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.id, o)};
    b = better(b, y);
  }
  if (lane == 0) a.out[blockIdx.x] = b.id < 0 ? 0 : b.id;
}

}  // namespace

size_t sampleWorkspaceBytes(int64_t num_rows) {
  return static_cast<size_t>(num_rows) * kSampleGreedySlices * sizeof(Best);
}

Status launchSample(const SampleArgs& a, cudaStream_t stream) {
  if (a.vocab <= 0 || a.vocab > INT32_MAX) return invalidArgument("sample: bad vocabulary size");
  if (a.num_rows == 0) return okStatus();
  if (a.partial == nullptr) return invalidArgument("sample: no workspace");
  static_assert(kSampleGreedySlices <= 32, "one warp finishes a row");
  greedyPartialKernel<<<dim3(static_cast<unsigned>(a.num_rows), kSampleGreedySlices),
                        kGreedyThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  greedyFinishKernel<<<static_cast<unsigned>(a.num_rows), 32, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  sampleKernel<<<static_cast<unsigned>(a.num_rows), kThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
