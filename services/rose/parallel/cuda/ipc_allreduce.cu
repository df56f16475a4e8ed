// IPC all-reduce kernels (contract and memory protocol in ipc_allreduce.cuh).

#include <cuda_bf16.h>

#include "services/rose/parallel/cuda/ipc_allreduce.cuh"
#include "services/rose/parallel/cuda/ipc_sync.cuh"

namespace garden::rose::cuda {
namespace {

using ipc_sync::globalTimer;
using ipc_sync::ldAcquireSys;
using ipc_sync::stReleaseSys;

__device__ __forceinline__ uint32_t* flagPtr(char* buf, int phase, int block, int rank) {
  return reinterpret_cast<uint32_t*>(buf) + (phase * kIpcMaxBlocks + block) * kIpcMaxRanks + rank;
}
// data[parity][region]: region 0 = input copy, 1 = two-shot result.
__device__ __forceinline__ char* dataPtr(char* buf, size_t capacity, uint32_t parity, int region) {
  return buf + kIpcFlagBytes + (2 * static_cast<size_t>(parity) + region) * capacity;
}

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static __device__ __forceinline__ float load(const float* p) { return __ldcg(p); }
  static __device__ __forceinline__ float toF(float v) { return v; }
  static __device__ __forceinline__ float fromF(float v) { return v; }
};
template <>
struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ float load(const __nv_bfloat16* p) {
    const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(p));
    return __bfloat162float(__ushort_as_bfloat16(bits));
  }
  static __device__ __forceinline__ float toF(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 fromF(float v) { return __float2bfloat16(v); }
};

// Block-level barrier of one phase across every block of every rank (see the header). False on
// timeout (error word set).
__device__ bool ipcBarrier(const IpcAllReduceArgs& a, int phase, uint32_t epoch) {
  __syncthreads();  // this block's writes of the phase are done
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int r = 0; r < a.world; ++r)
      stReleaseSys(flagPtr(a.bufs[r], phase, blockIdx.x, a.rank), epoch);
  }
  bool ok = true;
  const int flags = static_cast<int>(gridDim.x) * a.world;
  for (int t = threadIdx.x; t < flags; t += blockDim.x) {
    const uint32_t* f = flagPtr(a.bufs[a.rank], phase, t / a.world, t % a.world);
    const uint64_t start = globalTimer();
    // Wait while the flag is older than this call (a fast peer may already have written the
    // next epoch).
    while (static_cast<int32_t>(ldAcquireSys(f) - epoch) < 0) {
      if (globalTimer() - start > kIpcTimeoutNs) {
        atomicExch(a.error, 1u);
        ok = false;
        break;
      }
    }
  }
  return __syncthreads_and(ok) != 0;
}

template <typename T>
__global__ void ipcAllReduceKernel(IpcAllReduceArgs a, const T* __restrict__ in, T* out, int64_t n,
                                   bool two_shot) {
  __shared__ uint32_t s_epoch;
  if (threadIdx.x == 0) s_epoch = a.epochs[0] + 1;
  __syncthreads();
  const uint32_t epoch = s_epoch;
  const uint32_t parity = epoch & 1u;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;

  T* mine = reinterpret_cast<T*>(dataPtr(a.bufs[a.rank], a.capacity, parity, 0));
  for (int64_t i = first; i < n; i += stride) mine[i] = in[i];
  if (!ipcBarrier(a, 0, epoch)) return;
  // Every block read the counter before it signalled barrier 0, so block 0 may advance it now;
  // the next launch sees it (stream order).
  if (blockIdx.x == 0 && threadIdx.x == 0) a.epochs[0] = epoch;

  if (!two_shot) {
    for (int64_t i = first; i < n; i += stride) {
      float s = 0.f;
      for (int r = 0; r < a.world; ++r) {  // rank order [TAG_REPLICATED_BITWISE]
        s += Elem<T>::load(reinterpret_cast<const T*>(dataPtr(a.bufs[r], a.capacity, parity, 0)) +
                           i);
      }
      out[i] = Elem<T>::fromF(s);
    }
  } else {
    // Reduce-scatter: this rank's chunk (evenSplit of n over the ranks).
    const int64_t base = n / a.world, extra = n % a.world;
    const int64_t c0 = a.rank * base + (a.rank < extra ? a.rank : extra);
    const int64_t c1 = c0 + base + (a.rank < extra ? 1 : 0);
    T* result = reinterpret_cast<T*>(dataPtr(a.bufs[a.rank], a.capacity, parity, 1));
    for (int64_t i = c0 + first; i < c1; i += stride) {
      float s = 0.f;
      for (int r = 0; r < a.world; ++r) {
        s += Elem<T>::load(reinterpret_cast<const T*>(dataPtr(a.bufs[r], a.capacity, parity, 0)) +
                           i);
      }
      result[i] = Elem<T>::fromF(s);
    }
    if (!ipcBarrier(a, 1, epoch)) return;
    // All-gather: element i from the rank that reduced it.
    const int64_t big = extra * (base + 1);
    for (int64_t i = first; i < n; i += stride) {
      const int q = static_cast<int>(i < big ? i / (base + 1) : extra + (i - big) / base);
      const T* src = reinterpret_cast<const T*>(dataPtr(a.bufs[q], a.capacity, parity, 1));
      out[i] = Elem<T>::fromF(Elem<T>::load(src + i));
    }
  }
}

}  // namespace

cudaError_t launchIpcAllReduce(const IpcAllReduceArgs& a, const void* in, void* out, int64_t n,
                               IpcDType dtype, IpcAlgo algo, int blocks, cudaStream_t stream) {
  const size_t esize = dtype == IpcDType::kF32 ? 4 : 2;
  if (a.world < 1 || a.world > kIpcMaxRanks || a.rank < 0 || a.rank >= a.world || blocks < 1 ||
      blocks > kIpcMaxBlocks || n < 0 || static_cast<size_t>(n) * esize > a.capacity ||
      a.epochs == nullptr || a.error == nullptr) {
    return cudaErrorInvalidValue;
  }
  for (int r = 0; r < a.world; ++r) {
    if (a.bufs[r] == nullptr) return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  const bool two_shot = algo == IpcAlgo::kTwoShot;
  constexpr int kThreads = 512;
  if (dtype == IpcDType::kF32) {
    ipcAllReduceKernel<float><<<blocks, kThreads, 0, stream>>>(
        a, static_cast<const float*>(in), static_cast<float*>(out), n, two_shot);
  } else {
    ipcAllReduceKernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
        a, static_cast<const __nv_bfloat16*>(in), static_cast<__nv_bfloat16*>(out), n, two_shot);
  }
  return cudaGetLastError();
}

}  // namespace garden::rose::cuda
