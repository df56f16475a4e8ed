#pragma once
// All-to-all of rows over CUDA IPC peer memory with per-row release/acquire flags
// [TAG_IPC_ALLTOALL] — the expert dispatch and its return between the rose processes of one node
// (docs/multi-gpu.md), beside NCCL's grouped send/recv. Every rank owns one IPC buffer (exported
// like the all-reduce's, ipc_comm.h) that its peers write into over NVLink; a rank reads only its
// own buffer.
//
// Buffer of one rank (as a receiver), kMaxRanks = kIpcMaxRanks:
//   acks[src 0..kMaxRanks-1]                      uint32: the last call whose rows `src` (as a
//                                                 receiver) has finished reading (written by src)
//   flags[parity][src][row 0..max_rows-1]         uint32 epochs: row `row` from `src` has landed
//   data[parity][src][0, slot_bytes)              the rows `src` sent to this rank
// Call k (epoch k, a device counter, so launches have no per-call host value) uses parity k & 1.
// Sender side: before writing into rank q's parity-(k & 1) half, a block waits until q's ack of
// call k − 2 (the last call that used that half) is in its own acks[q] (ld.acquire.sys); then one
// warp per row copies the row into q's data slot and, after __syncwarp, lane 0 makes it visible
// (__threadfence_system + st.release.sys of the row's flag = k). Receiver side: one warp per row
// to receive; lane 0 waits for the row's flag to reach k (ld.acquire.sys), the warp copies the
// row out (L1-bypassing loads: an earlier call's lines of the same slot may sit in L1). A row is
// consumed as soon as it lands — no barrier over all ranks. The last block of the grid to finish
// (a done counter) advances the epoch and acks call k into acks[this rank] of every peer's buffer.
// Counts are host values every rank knows (Communicator::exchangeCounts before the dispatch), as
// NCCL's send/recv needs them; a receiver therefore never reads a flag it was not sent.
// A wait longer than kIpcTimeoutNs (a peer died or never launched) sets the error word and the
// kernel returns; IpcAllToAll::checkError reports it (the supervisor restarts the ranks).
//
// Threads: launchers on the stream's thread; the kernels own nothing.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "services/rose/parallel/cuda/ipc_allreduce.cuh"

namespace garden::rose::cuda {

constexpr size_t kA2aAckBytes = 128;  // acks[kIpcMaxRanks], padded

// Bytes of the flags region for `max_rows` rows per (parity, source), 16-byte aligned.
inline size_t a2aFlagBytes(int64_t max_rows) {
  return (2 * kIpcMaxRanks * static_cast<size_t>(max_rows) * sizeof(uint32_t) + 15) / 16 * 16;
}
// One rank's buffer: acks, flags, then 2 parities x `world` source slots of `slot_bytes`.
inline size_t a2aBufferBytes(int world, int64_t max_rows, size_t slot_bytes) {
  return kA2aAckBytes + a2aFlagBytes(max_rows) + 2 * static_cast<size_t>(world) * slot_bytes;
}

struct IpcAllToAllArgs {
  int rank = 0;
  int world = 0;
  char* bufs[kIpcMaxRanks] = {};  // each rank's buffer, mapped in this process (own: local)
  uint32_t* words = nullptr;      // this rank's [0] epoch, [1] error, [2] done blocks
  int64_t max_rows = 0;           // rows per (source, call) the flags hold
  size_t slot_bytes = 0;          // bytes per (source, call) the data slots hold (16-byte multiple)
};

// One call's rows: row_bytes a multiple of 16; send holds send_rows[0] rows for rank 0, then
// send_rows[1] for rank 1, ...; recv receives recv_rows[q] rows from rank q, in rank order.
// Every count <= max_rows and count * row_bytes <= slot_bytes; recv_rows[q] must equal what rank
// q sends to this rank. Pointers 16-byte aligned; send and recv must not overlap.
struct A2aCounts {
  int64_t send_rows[kIpcMaxRanks] = {};
  int64_t recv_rows[kIpcMaxRanks] = {};
};

cudaError_t launchIpcAllToAll(const IpcAllToAllArgs& a, const void* send, void* recv,
                              size_t row_bytes, const A2aCounts& counts, int blocks,
                              cudaStream_t stream);

}  // namespace garden::rose::cuda
