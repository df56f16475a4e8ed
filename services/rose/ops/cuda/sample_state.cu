#include <cmath>

#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/sample_state.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// SamplerSlot::apply on one token's logit: rounded float operations in the CPU's order (no
// contraction into FMAs, so the adjusted logits are the CPU's bits).
__device__ __forceinline__ float adjust(float x, const SamplerEntryDev& e, const StateRowDev& r) {
  x = __fadd_rn(x, e.bias);
  const uint32_t out = e.count & ~kSamplerPromptBit;
  if ((e.count & kSamplerPromptBit) != 0 || out > 0) {
    const float rp = r.repetition_penalty;
    if (rp != 1.f) x = x > 0.f ? __fdiv_rn(x, rp) : __fmul_rn(x, rp);
    const float pen = __fadd_rn(__fmul_rn(r.frequency_penalty, static_cast<float>(out)),
                                out > 0 ? r.presence_penalty : 0.f);
    x = __fsub_rn(x, pen);
  }
  return x;
}

__global__ void __launch_bounds__(kThreads) applyKernel(SamplerStateArgs a) {
  const StateRowDev r = a.rows[blockIdx.x];
  if (r.slot < 0) return;
  SamplerEntryDev* e = a.entries + static_cast<int64_t>(r.slot) * a.capacity;
  float* x = a.logits + static_cast<int64_t>(r.row) * a.vocab;
  const int32_t n = a.sizes[r.slot];
  for (int32_t j = threadIdx.x; j < n; j += kThreads) {
    const int32_t id = e[j].id;
    if (id < 0 || id >= a.vocab) continue;
    const float raw = x[id];
    e[j].saved = raw;
    x[id] = adjust(raw, e[j], r);
  }
}

__global__ void __launch_bounds__(kThreads) restoreKernel(SamplerStateArgs a) {
  __shared__ int32_t found;
  const StateRowDev r = a.rows[blockIdx.x];
  if (r.slot < 0) return;
  SamplerEntryDev* e = a.entries + static_cast<int64_t>(r.slot) * a.capacity;
  float* x = a.logits + static_cast<int64_t>(r.row) * a.vocab;
  const int32_t n = a.sizes[r.slot];
  const int32_t tok = a.sampled[blockIdx.x];
  if (threadIdx.x == 0) found = n;
  __syncthreads();
  for (int32_t j = threadIdx.x; j < n; j += kThreads) {
    const int32_t id = e[j].id;
    if (id < 0 || id >= a.vocab) continue;
    x[id] = e[j].saved;
    if (id == tok) atomicMin(&found, j);  // ids are distinct: at most one j
  }
  __syncthreads();
  if (threadIdx.x != 0 || tok < 0 || tok >= a.vocab) return;
  if (found < n) {
    ++e[found].count;
  } else if (n < a.capacity) {
    e[n] = SamplerEntryDev{tok, 1u, 0.f, 0.f};
    a.sizes[r.slot] = n + 1;
  }
}

struct Best {
  float v;
  int32_t id;
};
// Higher value first, lower id among equals; id < 0 never wins.
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.id < 0) return a;
  if (a.id < 0) return b;
  if (b.v > a.v || (b.v == a.v && b.id < a.id)) return b;
  return a;
}
__device__ __forceinline__ Best warpBest(Best b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best y{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.id, o)};
    b = better(b, y);
  }
  return b;
}
// Every thread gets the block's best.
__device__ Best blockBest(Best b, float* rv, int32_t* ri) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  b = warpBest(b);
  __syncthreads();
  if (lane == 0) {
    rv[warp] = b.v;
    ri[warp] = b.id;
  }
  __syncthreads();
  Best t{-INFINITY, -1};
  if (lane < kWarps) t = Best{rv[lane], ri[lane]};
  t = warpBest(t);
  return Best{__shfl_sync(0xffffffffu, t.v, 0), __shfl_sync(0xffffffffu, t.id, 0)};
}
__device__ float blockMax(float v, float* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < kWarps ? red[lane] : -INFINITY;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
  return __shfl_sync(0xffffffffu, t, 0);
}
__device__ double blockSumD(double v, double* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  double t = lane < kWarps ? red[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return __shfl_sync(0xffffffffu, t, 0);
}

__global__ void __launch_bounds__(kThreads) logprobsKernel(SamplerStateArgs a) {
  __shared__ float red_f[kWarps];
  __shared__ int32_t red_i[kWarps];
  __shared__ double red_d[kWarps];
  const StateRowDev r = a.rows[blockIdx.x];
  llm::LlmTokenLogprobs* out = a.logprobs + blockIdx.x;
  if (r.logprobs < 0) {  // what the CPU writes for a row that did not ask
    if (threadIdx.x == 0) {
      out->logprob = 0.f;
      out->num_top = -1;
    }
    for (int j = threadIdx.x; j < llm::kMaxTopLogprobs; j += kThreads) {
      out->top_ids[j] = 0;
      out->top_logprobs[j] = 0.f;
    }
    return;
  }
  const float* x = a.logits + static_cast<int64_t>(r.row) * a.vocab;
  const int64_t v = a.vocab;
  // Pass 1: the maximum over non-NaN values (fmaxf drops NaN).
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < v; i += kThreads) mx = fmaxf(mx, x[i]);
  mx = blockMax(mx, red_f);
  // Pass 2: Σ exp(x − mx) in float64 (+inf maximum: the +inf entries share the mass).
  const bool mx_inf = isinf(mx);
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < v; i += kThreads) {
    const float xi = x[i];
    if (isnan(xi) || xi == -INFINITY) continue;
    s += mx_inf ? (xi == mx ? 1.0 : 0.0) : exp(static_cast<double>(xi) - static_cast<double>(mx));
  }
  const double sum = blockSumD(s, red_d);
  const double log_sum = sum > 0.0 ? log(sum) : 0.0;
  auto lp = [&](float xi) -> float {
    if (isnan(xi) || xi == -INFINITY || sum == 0.0) return -INFINITY;
    if (mx_inf) return xi == mx ? static_cast<float>(-log_sum) : -INFINITY;
    return static_cast<float>((static_cast<double>(xi) - static_cast<double>(mx)) - log_sum);
  };
  const int32_t tok = a.sampled[blockIdx.x];
  if (threadIdx.x == 0) out->logprob = tok >= 0 && tok < v ? lp(x[tok]) : -INFINITY;
  const int64_t n_max = v < llm::kMaxTopLogprobs ? v : llm::kMaxTopLogprobs;
  const int32_t n = r.logprobs < n_max ? r.logprobs : static_cast<int32_t>(n_max);
  if (threadIdx.x == 0) out->num_top = n;
  // Top-n: round j takes the best entry strictly after round j−1's pick in (value desc, id asc)
  // order; NaN counts as −inf, as in computeLogprobs.
  float pv = INFINITY;
  int32_t pid = -1;
  for (int32_t j = 0; j < n; ++j) {
    Best b{-INFINITY, -1};
    for (int64_t i = threadIdx.x; i < v; i += kThreads) {
      float xi = x[i];
      if (isnan(xi)) xi = -INFINITY;
      const int32_t id = static_cast<int32_t>(i);
      if (j > 0 && !(xi < pv || (xi == pv && id > pid))) continue;
      b = better(b, Best{xi, id});
    }
    b = blockBest(b, red_f, red_i);
    if (threadIdx.x == 0) {
      out->top_ids[j] = b.id;
      out->top_logprobs[j] = b.id >= 0 ? lp(x[b.id]) : -INFINITY;
    }
    pv = b.v;
    pid = b.id;
  }
  for (int j = n + threadIdx.x; j < llm::kMaxTopLogprobs; j += kThreads) {
    out->top_ids[j] = 0;
    out->top_logprobs[j] = 0.f;
  }
}

Status check(const SamplerStateArgs& a, bool state) {
  if (a.vocab <= 0 || a.vocab > INT32_MAX) return invalidArgument("sampler state: bad vocabulary");
  if (a.logits == nullptr || a.rows == nullptr) return invalidArgument("sampler state: no rows");
  if (state && (a.entries == nullptr || a.sizes == nullptr || a.capacity <= 0))
    return invalidArgument("sampler state: no slots");
  return okStatus();
}

}  // namespace

Status launchApplySamplerState(const SamplerStateArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0) return okStatus();
  RETURN_IF_ERROR(check(a, true));
  applyKernel<<<static_cast<unsigned>(a.num_rows), kThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

Status launchRestoreAndCount(const SamplerStateArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0) return okStatus();
  RETURN_IF_ERROR(check(a, true));
  if (a.sampled == nullptr) return invalidArgument("sampler state: no sampled ids");
  restoreKernel<<<static_cast<unsigned>(a.num_rows), kThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

Status launchLogprobs(const SamplerStateArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0) return okStatus();
  RETURN_IF_ERROR(check(a, false));
  if (a.sampled == nullptr || a.logprobs == nullptr)
    return invalidArgument("logprobs: no sampled ids or output");
  logprobsKernel<<<static_cast<unsigned>(a.num_rows), kThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
