#pragma once
// A CUDA rank's Communicator with the CUDA IPC all-reduce beside the staged host path
// (docs/multi-gpu.md, "CUDA ranks"): an all-reduce of F32 or BF16 that fits `ipc_bytes` runs
// as the IPC kernel on the rank's stream (no host synchronization, graph-capturable; the peers'
// buffers over NVLink, or the same GPU's memory when ranks share one), everything else through
// StagedCommunicator. Both add in rank order in f32 and round once, so which path a call takes
// does not change its bits [TAG_REPLICATED_BITWISE]. Only between processes (CUDA cannot open a
// process's own IPC handle): rank processes, not rank threads.
//
// Construction is collective: every member of the group calls it, in the same order for each
// group; it exchanges the IPC handles through `host` (a host-memory Communicator without a
// backend, e.g. the rank segment's ShmComm), which then serves the staged path.
//
// Threads: as collective.h (one rank's launching thread).

#include <cstddef>
#include <memory>

#include "common/status.h"
#include "services/rose/ops/backend.h"
#include "services/rose/parallel/collective.h"

namespace garden::rose {

// `backend` must be the cuda backend. ipc_bytes: the IPC buffer's capacity (> 0).
Result<std::unique_ptr<Communicator>> makeIpcRankCommunicator(std::unique_ptr<Communicator> host,
                                                              Backend& backend, size_t ipc_bytes);

}  // namespace garden::rose
