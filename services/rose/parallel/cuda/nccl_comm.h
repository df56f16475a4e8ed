#pragma once
// NCCL beside the IPC all-reduce (docs/multi-gpu.md): one NcclComm per rank (one process per
// GPU), created from a unique id that rank 0 makes and hands to the others (the runtime's
// internal shared-memory segment). Built only when CMake finds NCCL (GARDEN_HAVE_NCCL).
//
// NVLink multicast (NVLS) is never used: create() sets NCCL_NVLS_ENABLE=0 in the process
// environment before NCCL reads it, overriding any other value (with a warning) — the GPU hosts
// must not have multicast objects created on them.
//
// NodeAllReduce picks per call: the IPC all-reduce while the message fits its buffer and is at
// most ipc_max_bytes, NCCL above (or when there is no IPC end).
//
// Threads: one owner thread (the rank's launching thread).

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "services/rose/parallel/cuda/ipc_comm.h"

namespace garden::rose::cuda {

struct NcclId {
  ncclUniqueId id;
};

// Sets NCCL_NVLS_ENABLE=0 (returns true when another value had to be overridden).
bool disableNvls();

class NcclComm {
 public:
  static Result<NcclId> newId();  // rank 0
  static Result<std::unique_ptr<NcclComm>> create(int rank, int world, const NcclId& id);
  ~NcclComm();

  Status allReduceSum(const void* in, void* out, int64_t n, IpcDType dtype, cudaStream_t stream);
  // out = rank 0's n elements, then rank 1's, ... (equal counts).
  Status allGather(const void* in, void* out, int64_t n, IpcDType dtype, cudaStream_t stream);
  // Byte-wise forms for the rank communicator (parallel/cuda/ipc_rank_comm.h): every rank's
  // `buf` = root's; out = each rank's `bytes`, in rank order; and an all-to-all of byte ranges
  // (send_off/send_bytes[q]: what goes to rank q; recv_off/recv_bytes[q]: what comes from it),
  // one group of ncclSend/ncclRecv.
  Status broadcastBytes(void* buf, size_t bytes, int root, cudaStream_t stream);
  Status allGatherBytes(const void* in, void* out, size_t bytes, cudaStream_t stream);
  Status allToAllBytes(const char* send, std::span<const size_t> send_off,
                       std::span<const size_t> send_bytes, char* recv,
                       std::span<const size_t> recv_off, std::span<const size_t> recv_bytes,
                       cudaStream_t stream);

 private:
  explicit NcclComm(ncclComm_t c) : comm_(c) {}
  ncclComm_t comm_ = nullptr;
};

class NodeAllReduce {
 public:
  NodeAllReduce(IpcAllReduce* ipc, NcclComm* nccl, size_t ipc_max_bytes)
      : ipc_(ipc), nccl_(nccl), ipc_max_bytes_(ipc_max_bytes) {}
  // True when a call of `bytes` goes to the IPC all-reduce.
  bool usesIpc(size_t bytes) const {
    return ipc_ != nullptr && bytes <= ipc_->capacity() && bytes <= ipc_max_bytes_;
  }
  Status allReduceSum(const void* in, void* out, int64_t n, IpcDType dtype, cudaStream_t stream);

 private:
  IpcAllReduce* ipc_;
  NcclComm* nccl_;
  size_t ipc_max_bytes_;
};

}  // namespace garden::rose::cuda
