#pragma once
// A CUDA rank's Communicator with device collectives beside the staged host path
// (docs/multi-gpu.md, "CUDA ranks"):
//   - the CUDA IPC all-reduce (ipc_bytes > 0): an all-reduce of F32 or BF16 that fits ipc_bytes
//     runs as the IPC kernel on the rank's stream (no host synchronization, graph-capturable; the
//     peers' buffers over NVLink, or the same GPU's memory when ranks share one);
//   - NCCL (nccl, builds with NCCL only; every rank on its own GPU — NCCL refuses two ranks of one
//     communicator on one device): all-reduces above the IPC size, broadcasts, all-gathers of
//     equal row counts and all-to-alls (one group of ncclSend/ncclRecv);
//   - the CUDA IPC all-to-all (ipc_alltoall_bytes > 0) [TAG_IPC_ALLTOALL]: all-to-alls whose rows
//     fit its slots (the expert dispatch and its return), per-row flags over peer memory;
//   - StagedCommunicator for the rest (and for all of it when neither is on).
// A call's path depends on its size and counts only, which every rank shares, so every rank gets
// the same bits [TAG_REPLICATED_BITWISE] (the IPC and staged sums also equal each other: rank
// order, f32, rounded once; NCCL's order is its own).
// Only between processes (CUDA cannot open a process's own IPC handle): rank processes, not rank
// threads. NVLink multicast stays off (NcclComm sets NCCL_NVLS_ENABLE=0).
//
// Construction is collective: every member of the group calls it, in the same order for each
// group; it exchanges the IPC handles and the NCCL id through `host` (a host-memory
// Communicator without a backend, e.g. the rank segment's ShmComm), which then serves the staged
// path.
//
// Threads: as collective.h (one rank's launching thread).

#include <cstddef>
#include <memory>

#include "common/status.h"
#include "services/rose/ops/backend.h"
#include "services/rose/parallel/collective.h"

namespace garden::rose {

struct DeviceCommOptions {
  size_t ipc_bytes = 0;  // the IPC all-reduce's capacity (a multiple of 16); 0: no IPC
  bool nccl = false;     // NCCL for what the IPC all-reduce does not take (builds with NCCL)
  // [TAG_IPC_ALLTOALL] The IPC all-to-all's slot per source and call (a multiple of 16; 0: none)
  // and the most rows any rank sends another in one call (>= 1 with a slot; the caller's bound,
  // e.g. the step's token budget: a larger count is a contract violation and aborts). An
  // all-to-all takes it when alltoall_rows rows of its row size fit the slot — a choice every
  // rank makes alike, since the row size is shared and the per-rank counts are not consulted.
  size_t ipc_alltoall_bytes = 0;
  int64_t alltoall_rows = 0;
};

// Whether this build has NCCL.
bool deviceCommHasNccl();

// `backend` must be the cuda backend.
Result<std::unique_ptr<Communicator>> makeDeviceRankCommunicator(std::unique_ptr<Communicator> host,
                                                                 Backend& backend,
                                                                 const DeviceCommOptions& opts);

}  // namespace garden::rose
