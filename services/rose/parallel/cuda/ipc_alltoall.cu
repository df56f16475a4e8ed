// IPC all-to-all kernel [TAG_IPC_ALLTOALL] (contract and memory protocol in ipc_alltoall.cuh).

#include "services/rose/parallel/cuda/ipc_alltoall.cuh"
#include "services/rose/parallel/cuda/ipc_sync.cuh"

namespace garden::rose::cuda {
namespace {

using ipc_sync::globalTimer;
using ipc_sync::ldAcquireSys;
using ipc_sync::stReleaseSys;

constexpr int kThreads = 512;

__device__ __forceinline__ uint32_t* acksOf(char* buf) { return reinterpret_cast<uint32_t*>(buf); }
__device__ __forceinline__ uint32_t* flagOf(char* buf, int64_t max_rows, uint32_t parity, int src,
                                            int64_t row) {
  return reinterpret_cast<uint32_t*>(buf + kA2aAckBytes) +
         (static_cast<int64_t>(parity) * kIpcMaxRanks + src) * max_rows + row;
}
// data_offset: kA2aAckBytes + a2aFlagBytes(max_rows), where the slots start (from the launcher).
__device__ __forceinline__ char* slotOf(char* buf, const IpcAllToAllArgs& a, size_t data_offset,
                                        uint32_t parity, int src) {
  return buf + data_offset + (static_cast<size_t>(parity) * a.world + src) * a.slot_bytes;
}

// Row w of a rank-ordered list with rows[q] rows for rank q: its rank and index within that rank's
// rows, and the rows before the rank's first.
__device__ __forceinline__ int locate(const int64_t* rows, int world, int64_t w, int64_t* index,
                                      int64_t* before) {
  int q = 0;
  int64_t at = 0;
  while (q < world - 1 && w - at >= rows[q]) at += rows[q++];
  *index = w - at;
  *before = at;
  return q;
}

// Waits until *flag has reached `epoch` (wrapping compare); false (error word set) on timeout.
__device__ bool waitFlag(const uint32_t* flag, uint32_t epoch, uint32_t* error) {
  const uint64_t start = globalTimer();
  while (static_cast<int32_t>(ldAcquireSys(flag) - epoch) < 0) {
    if (globalTimer() - start > kIpcTimeoutNs) {
      atomicExch(error, 1u);
      return false;
    }
  }
  return true;
}

__global__ void __launch_bounds__(kThreads)
    ipcAllToAllKernel(IpcAllToAllArgs a, const char* __restrict__ send, char* __restrict__ recv,
                      size_t row_bytes, size_t data_offset, A2aCounts c) {
  __shared__ uint32_t s_epoch;
  __shared__ int64_t s_send[kIpcMaxRanks], s_recv[kIpcMaxRanks];  // indexed by rank (no spills)
  if (threadIdx.x == 0) s_epoch = a.words[0] + 1;
  if (threadIdx.x < kIpcMaxRanks) {
    s_send[threadIdx.x] = c.send_rows[threadIdx.x];
    s_recv[threadIdx.x] = c.recv_rows[threadIdx.x];
  }
  __syncthreads();
  const uint32_t epoch = s_epoch;
  const uint32_t parity = epoch & 1u;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t warps = kThreads / 32;
  const int64_t gwarp = static_cast<int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5);
  const int64_t gwarps = static_cast<int64_t>(gridDim.x) * warps;
  const int64_t chunks = static_cast<int64_t>(row_bytes / 16);
  char* own = a.bufs[a.rank];

  // Sender: the half this call writes in rank q was last used by call epoch - 2; wait until q has
  // acknowledged reading it (acks start at 0, so the first two calls pass at once).
  bool ok = true;
  if (static_cast<int>(threadIdx.x) < a.world && s_send[threadIdx.x] > 0) {
    ok = waitFlag(acksOf(own) + threadIdx.x, epoch - 2u, a.words + 1);
  }
  if (!__syncthreads_and(ok)) return;

  int64_t total = 0;
  for (int q = 0; q < a.world; ++q) total += s_send[q];
  for (int64_t w = gwarp; w < total; w += gwarps) {
    int64_t i = 0, before = 0;
    const int q = locate(s_send, a.world, w, &i, &before);
    const uint4* src = reinterpret_cast<const uint4*>(send + (before + i) * row_bytes);
    char* slot = slotOf(a.bufs[q], a, data_offset, parity, a.rank);
    uint4* dst = reinterpret_cast<uint4*>(slot + i * row_bytes);
    for (int64_t ch = lane; ch < chunks; ch += 32) dst[ch] = src[ch];
    __syncwarp();
    if (lane == 0) {
      __threadfence_system();  // the warp's row (ordered before by the warp barrier), then its flag
      stReleaseSys(flagOf(a.bufs[q], a.max_rows, parity, a.rank, i), epoch);
    }
  }

  // Receiver: each row as soon as its flag says it has landed.
  total = 0;
  for (int q = 0; q < a.world; ++q) total += s_recv[q];
  for (int64_t w = gwarp; w < total && ok; w += gwarps) {
    int64_t i = 0, before = 0;
    const int s = locate(s_recv, a.world, w, &i, &before);
    if (lane == 0) ok = waitFlag(flagOf(own, a.max_rows, parity, s, i), epoch, a.words + 1);
    ok = __shfl_sync(0xffffffffu, ok, 0);
    __syncwarp();  // lane 0's acquire orders the other lanes' loads below
    if (!ok) break;
    const char* slot = slotOf(own, a, data_offset, parity, s);
    const uint4* src = reinterpret_cast<const uint4*>(slot + i * row_bytes);
    uint4* dst = reinterpret_cast<uint4*>(recv + (before + i) * row_bytes);
    for (int64_t ch = lane; ch < chunks; ch += 32) dst[ch] = __ldcg(src + ch);
  }
  if (!__syncthreads_and(ok)) return;

  // The grid's last block: every block has read its rows, so the epoch advances (the next launch
  // sees it, stream order) and every peer learns that this rank is done with this call's half.
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(a.words + 2, 1u) == gridDim.x - 1) {
      a.words[2] = 0;
      a.words[0] = epoch;
      __threadfence_system();
      for (int q = 0; q < a.world; ++q) stReleaseSys(acksOf(a.bufs[q]) + a.rank, epoch);
    }
  }
}

}  // namespace

cudaError_t launchIpcAllToAll(const IpcAllToAllArgs& a, const void* send, void* recv,
                              size_t row_bytes, const A2aCounts& counts, int blocks,
                              cudaStream_t stream) {
  if (a.world < 1 || a.world > kIpcMaxRanks || a.rank < 0 || a.rank >= a.world || blocks < 1 ||
      blocks > kIpcMaxBlocks || a.words == nullptr || a.max_rows < 1 || a.slot_bytes % 16 != 0 ||
      row_bytes == 0 || row_bytes % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  for (int r = 0; r < a.world; ++r) {
    if (a.bufs[r] == nullptr) return cudaErrorInvalidValue;
    for (const int64_t n : {counts.send_rows[r], counts.recv_rows[r]}) {
      if (n < 0 || n > a.max_rows || static_cast<size_t>(n) * row_bytes > a.slot_bytes) {
        return cudaErrorInvalidValue;
      }
    }
  }
  // Launched even with no rows: the epoch advances and the acks go out on every rank alike.
  ipcAllToAllKernel<<<blocks, kThreads, 0, stream>>>(
      a, static_cast<const char*>(send), static_cast<char*>(recv), row_bytes,
      kA2aAckBytes + a2aFlagBytes(a.max_rows), counts);
  return cudaGetLastError();
}

}  // namespace garden::rose::cuda
