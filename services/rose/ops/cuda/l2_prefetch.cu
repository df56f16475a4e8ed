#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/l2_prefetch.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kThreads = 128;
constexpr size_t kLine = 128;

template <bool kEvictLast>
__global__ void __launch_bounds__(kThreads)
    l2PrefetchKernel(const char* base, const char* begin, size_t lines) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  for (size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; i < lines;
       i += stride) {
    // Every address named lies in [begin, begin + bytes): the first line's from `begin` itself.
    const char* p = i == 0 ? begin : base + i * kLine;
    if constexpr (kEvictLast) {
      asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p));
    } else {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
  }
}

}  // namespace

Status launchL2Prefetch(const void* p, size_t bytes, bool evict_last, int ctas,
                        cudaStream_t stream) {
  if (bytes == 0) return okStatus();
  if (p == nullptr || ctas < 1) return invalidArgument("l2 prefetch: null range or ctas < 1");
  // The first line holding p, through the line holding its last byte.
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{kLine - 1};
  const uintptr_t last = (reinterpret_cast<uintptr_t>(p) + bytes - 1) & ~uintptr_t{kLine - 1};
  const size_t lines = (last - first) / kLine + 1;
  const char* base = reinterpret_cast<const char*>(first);
  if (evict_last) {
    l2PrefetchKernel<true><<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(
        base, static_cast<const char*>(p), lines);
  } else {
    l2PrefetchKernel<false><<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(
        base, static_cast<const char*>(p), lines);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
