#pragma once
// A CUDA rank's Communicator with device collectives beside the staged host path
// (docs/multi-gpu.md, "CUDA ranks"):
//   - the CUDA IPC all-reduce (ipc_bytes > 0): an all-reduce of F32 or BF16 that fits ipc_bytes
//     runs as the IPC kernel on the rank's stream (no host synchronization, graph-capturable; the
//     peers' buffers over NVLink, or the same GPU's memory when ranks share one);
//   - NCCL (nccl, builds with NCCL only; every rank on its own GPU — NCCL refuses two ranks of one
//     communicator on one device): all-reduces above the IPC size, broadcasts, all-gathers of
//     equal row counts and all-to-alls (one group of ncclSend/ncclRecv);
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
};

// Whether this build has NCCL.
bool deviceCommHasNccl();

// `backend` must be the cuda backend.
Result<std::unique_ptr<Communicator>> makeDeviceRankCommunicator(std::unique_ptr<Communicator> host,
                                                                 Backend& backend,
                                                                 const DeviceCommOptions& opts);

}  // namespace garden::rose
