#include "services/rose/ops/cuda/l2_flush.cuh"

#include <cstdint>

#include "services/rose/ops/cuda/cuda_utils.h"

namespace garden::rose::cuda {
namespace {

__global__ void l2FlushReadKernel(uint4* p, size_t n) {
  uint32_t acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint4 v = __ldcg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) p[0].x = acc;  // keeps the loads; harmless in a flush buffer
}

}  // namespace

Status launchL2FlushRead(void* buf, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return okStatus();
  if (reinterpret_cast<uintptr_t>(buf) % 16 != 0 || bytes % 16 != 0)
    return invalidArgument("l2 flush: a 16-byte aligned buffer of a multiple of 16 bytes");
  int sms = 0, dev = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  l2FlushReadKernel<<<static_cast<unsigned>(sms * 4), 512, 0, stream>>>(static_cast<uint4*>(buf),
                                                                       bytes / 16);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
