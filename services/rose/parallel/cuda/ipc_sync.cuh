#pragma once
// System-scope flag operations and the global timer shared by the CUDA IPC kernels
// (ipc_allreduce.cu, ipc_alltoall.cu): a peer process's writes are seen through a flag loaded with
// acquire semantics after they were published by a release store. Include only from .cu files.

#include <cstdint>

namespace garden::rose::cuda::ipc_sync {

__device__ __forceinline__ uint32_t ldAcquireSys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void stReleaseSys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint64_t globalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace garden::rose::cuda::ipc_sync
