#pragma once
// Collectives among the ranks of one node (docs/multi-gpu.md). A Communicator is one rank's end
// of a group, bound to that rank's Backend: every call is enqueued on the backend's queue in
// program order with its ops ([TAG_ROSE_LAZY]), so the model calls it exactly where it would call
// an op. Every rank of the group must make the same sequence of calls with consistent counts
// (counts are host values; a rank that has no rows still calls, with zero rows).
//
// Results are bitwise identical on every rank [TAG_REPLICATED_BITWISE]: allReduceSum adds the
// ranks' contributions in rank order 0..N-1 on every rank (the local and IPC implementations; NCCL
// ring/tree all-reduce also hands every rank the same bytes). The sharded model relies on it: the
// ranks of a tp group route tokens to experts from their own copy of the hidden state, and the
// choice must agree.
//
// Implementations: LocalCommGroup below (N ranks as threads of one process, host memory; the
// CPU backend and the tests), and on CUDA the IPC one-shot/two-shot all-reduce for small messages
// beside NCCL (services/rose/parallel/cuda/, see ipc_allreduce.cuh).
//
// Threads: one Communicator per rank, used from that rank's launching thread.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "services/rose/ops/backend.h"

namespace garden::rose {

// Bytes of one row of a collective's operand, from its trailing dims (Tensor::cols() is 0 for a
// view of zero rows, and a rank with nothing to send or receive still exchanges rows of the true
// size).
inline size_t collectiveRowBytes(const Tensor& t) {
  size_t n = dtypeSize(t.dtype);
  for (int32_t i = 1; i < t.ndim; ++i) n *= static_cast<size_t>(t.shape[static_cast<size_t>(i)]);
  return n;
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;

  // inout = Σ over ranks of inout (elementwise; F32 on the CPU, F32/BF16 on CUDA). Same shape on
  // every rank.
  virtual void allReduceSum(const Tensor& inout) = 0;
  // out = rows of rank 0, then rank 1, ... (rows_per_rank[r] rows from rank r; in.rows() ==
  // rows_per_rank[rank()]; all ranks pass the same rows_per_rank and column count).
  virtual void allGatherRows(const Tensor& in, std::span<const int64_t> rows_per_rank,
                             const Tensor& out) = 0;
  // send holds send_rows[0] rows for rank 0, then send_rows[1] for rank 1, ...; recv receives
  // recv_rows[q] rows from rank q, in rank order. recv_rows must equal what each peer sends
  // (exchangeCounts gives it). Dtype-agnostic: whole rows of bytes.
  virtual void allToAllRows(const Tensor& send, std::span<const int64_t> send_rows,
                            const Tensor& recv, std::span<const int64_t> recv_rows) = 0;
  // Every rank's inout = root's inout.
  virtual void broadcast(const Tensor& inout, int32_t root) = 0;
  // Host values: recv[q] = what rank q passed as send[rank()]. Waits for the queue to reach this
  // point (the counts of an expert dispatch depend on routing computed on the queue).
  virtual void exchangeCounts(std::span<const int64_t> send, std::span<int64_t> recv) = 0;
};

// N ranks as threads of one process, each with its own (CPU) backend. create(n) returns the n
// ends; hand end r to the thread of rank r. Collectives are two barriers around reads of the
// peers' posted host buffers.
class LocalCommGroup {
 public:
  static std::vector<std::unique_ptr<Communicator>> create(int32_t n,
                                                           std::span<Backend* const> backends);
};

}  // namespace garden::rose
