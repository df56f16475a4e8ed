#pragma once
// All-reduce (sum) over CUDA IPC peer memory for small messages, between the rose processes of
// one node (one process per GPU; docs/multi-gpu.md). Every rank owns one IPC buffer (cudaMalloc,
// exported with cudaIpcGetMemHandle, opened by every peer with cudaIpcOpenMemHandle) and reads
// its peers' buffers directly over NVLink.
//
// Buffer of one rank (kIpcFlagBytes of flags, then two parity halves of 2·capacity data bytes):
//   flags[phase 0..1][block 0..kIpcMaxBlocks-1][rank 0..kIpcMaxRanks-1]   uint32 epochs
//   data[parity][0, capacity)          this rank's input of the call
//   data[parity][capacity, 2·capacity) two-shot: the chunk this rank reduced
// Call k uses parity k & 1. Barrier of a phase: block b of rank r, after its writes, stores epoch
// k into flags[phase][b][r] of EVERY rank's buffer (st.release.sys after __threadfence_system),
// then waits until its own flags[phase][b'][r'] == k for every block b' and rank r'
// (ld.acquire.sys), then __syncthreads. Peer data is read with L1-bypassing loads.
// Why two parity halves suffice: a rank passes call k's first barrier only when every peer has
// started call k, i.e. finished call k − 1 (stream order), so nobody still reads the half call
// k + 1 will overwrite.
// The epoch lives in device memory (one counter, advanced by the kernel), so the launch has no
// per-call host value and can be captured in a CUDA graph.
//
// Algorithms (pickIpcAlgo): one-shot — every rank copies its input to its buffer, one barrier,
// every rank sums all ranks' inputs (reads (N−1)·bytes over the links); two-shot — copy, barrier,
// rank r reduces its 1/N of the elements from every rank into its result chunk, barrier, every
// rank gathers the N result chunks (reads 2·(N−1)/N·bytes). Both add in rank order 0..N−1 with f32
// accumulation, so every rank gets the same bits [TAG_REPLICATED_BITWISE] and the result equals a
// CPU sum in that order. Larger messages go to NCCL (nccl_comm.h) when the build has it.
//
// A barrier that waits longer than kIpcTimeoutNs (a peer died or never launched) sets the error
// word and the kernel returns; IpcAllReduce reports it (the supervisor restarts the ranks).
//
// Threads: launchers on the stream's thread; the kernels own nothing.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace garden::rose::cuda {

constexpr int kIpcMaxRanks = 8;
constexpr int kIpcMaxBlocks = 32;
constexpr size_t kIpcFlagBytes = 2 * kIpcMaxBlocks * kIpcMaxRanks * sizeof(uint32_t);  // 2 KiB
constexpr uint64_t kIpcTimeoutNs = 10ull * 1000 * 1000 * 1000;                         // 10 s

inline size_t ipcBufferBytes(size_t capacity) { return kIpcFlagBytes + 4 * capacity; }

enum class IpcAlgo : uint8_t { kOneShot = 0, kTwoShot = 1 };
enum class IpcDType : uint8_t { kF32 = 0, kBF16 = 1 };

// One-shot while each rank reads at most 1 MiB from its peers, else two-shot (to be tuned on the
// NVLink host; the split point is a guess until measured).
inline IpcAlgo pickIpcAlgo(size_t bytes, int world) {
  return bytes * static_cast<size_t>(world - 1) <= (size_t{1} << 20) ? IpcAlgo::kOneShot
                                                                     : IpcAlgo::kTwoShot;
}

struct IpcAllReduceArgs {
  int rank = 0;
  int world = 0;
  char* bufs[kIpcMaxRanks] = {};  // each rank's buffer, mapped in this process (own: local)
  uint32_t* epochs = nullptr;     // this rank's call counter (one word, local device memory)
  uint32_t* error = nullptr;      // this rank's error word (0 = fine, 1 = barrier timeout)
  size_t capacity = 0;            // bytes of one input (≥ the message)
};

// out[i] = Σ_r in_r[i], n elements of `dtype` (n·size ≤ capacity, 16-byte aligned pointers).
// `blocks` ≤ kIpcMaxBlocks (the same on every rank).
cudaError_t launchIpcAllReduce(const IpcAllReduceArgs& a, const void* in, void* out, int64_t n,
                               IpcDType dtype, IpcAlgo algo, int blocks, cudaStream_t stream);

}  // namespace garden::rose::cuda
