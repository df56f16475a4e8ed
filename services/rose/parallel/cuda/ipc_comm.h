#pragma once
// Host side of the CUDA IPC pieces (docs/multi-gpu.md): exporting and opening device allocations
// across the rose processes of one node, the IPC all-reduce for small messages
// (ipc_allreduce.cuh) and the IPC all-to-all of rows (ipc_alltoall.cuh) [TAG_IPC_ALLTOALL]. (The KV-block handoff maps its peer through the backend:
// Backend::openPeerMemory / copyKvBlocks, parallel/kv_handoff.h.)
//
// Handles travel as plain bytes (IpcHandle): rank 0's internal shared-memory segment in the
// runtime, files in the GPU test. A process can NOT open its own handle (CUDA refuses), so a
// rank maps only its peers' buffers and uses its own pointer for itself.
//
// Threads: one owner thread (the rank's launching thread); objects own their CUDA resources.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "services/rose/parallel/cuda/ipc_allreduce.cuh"
#include "services/rose/parallel/cuda/ipc_alltoall.cuh"

namespace garden::rose::cuda {

struct IpcHandle {
  unsigned char bytes[sizeof(cudaIpcMemHandle_t)] = {};
};

// The handle of `base`, which must be the start of a cudaMalloc allocation.
Result<IpcHandle> exportIpcHandle(void* base);

// A peer's allocation mapped into this process; unmapped on destruction.
class IpcMapping {
 public:
  static Result<std::unique_ptr<IpcMapping>> open(const IpcHandle& handle);
  ~IpcMapping();
  void* data() const { return ptr_; }

 private:
  explicit IpcMapping(void* p) : ptr_(p) {}
  void* ptr_ = nullptr;
};

// One rank's end of the IPC all-reduce. create() allocates this rank's buffer (capacity bytes
// of input per call); exchange handle() with the peers; connect() with all world handles (own
// entry ignored). Then allReduceSum() may be called, by every rank in the same order.
class IpcAllReduce {
 public:
  static Result<std::unique_ptr<IpcAllReduce>> create(int rank, int world, size_t capacity,
                                                      int blocks = 8);
  ~IpcAllReduce();

  const IpcHandle& handle() const { return handle_; }
  Status connect(std::span<const IpcHandle> handles);
  size_t capacity() const { return args_.capacity; }

  // Enqueued on `stream`: out = Σ over ranks of in (n elements; in may equal out). algo: as
  // pickIpcAlgo unless forced. INVALID_ARGUMENT when n does not fit the capacity.
  Status allReduceSum(const void* in, void* out, int64_t n, IpcDType dtype, cudaStream_t stream,
                      const IpcAlgo* force_algo = nullptr);
  // Reads the error word (synchronizes): INTERNAL after a barrier timeout (a peer is gone).
  Status checkError();

 private:
  IpcAllReduce() = default;
  IpcAllReduceArgs args_;
  int blocks_ = 8;
  void* own_ = nullptr;        // this rank's IPC buffer
  uint32_t* words_ = nullptr;  // [0] epoch, [1] error
  IpcHandle handle_;
  std::vector<std::unique_ptr<IpcMapping>> peers_;
};

// One rank's end of the IPC all-to-all [TAG_IPC_ALLTOALL] (ipc_alltoall.cuh). create() allocates
// this rank's buffer: per source and call up to max_rows rows and slot_bytes bytes; exchange
// handle() with the peers; connect() with all world handles (own entry ignored). Then
// allToAllRows() may be called, by every rank in the same order.
class IpcAllToAll {
 public:
  static Result<std::unique_ptr<IpcAllToAll>> create(int rank, int world, int64_t max_rows,
                                                     size_t slot_bytes, int blocks = 16);
  ~IpcAllToAll();

  const IpcHandle& handle() const { return handle_; }
  Status connect(std::span<const IpcHandle> handles);
  int64_t maxRows() const { return args_.max_rows; }
  size_t slotBytes() const { return args_.slot_bytes; }
  // Whether rows of `row_bytes` with at most max_rows per source always fit.
  bool fitsRows(size_t row_bytes) const {
    return row_bytes > 0 && row_bytes % 16 == 0 &&
           static_cast<size_t>(args_.max_rows) * row_bytes <= args_.slot_bytes;
  }

  // Enqueued on `stream`: send holds send_rows[q] rows of row_bytes for rank q, in rank order;
  // recv gets recv_rows[q] rows from rank q, in rank order (recv_rows[q] = what q sends here).
  // INVALID_ARGUMENT when a count or size does not fit.
  Status allToAllRows(const void* send, std::span<const int64_t> send_rows, void* recv,
                      std::span<const int64_t> recv_rows, size_t row_bytes, cudaStream_t stream);
  // Reads the error word (synchronizes): INTERNAL after a wait timed out (a peer is gone).
  Status checkError();

 private:
  IpcAllToAll() = default;
  IpcAllToAllArgs args_;
  int blocks_ = 16;
  void* own_ = nullptr;
  IpcHandle handle_;
  std::vector<std::unique_ptr<IpcMapping>> peers_;
};

}  // namespace garden::rose::cuda
