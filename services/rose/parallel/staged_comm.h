#pragma once
// A Communicator for ranks whose tensors live in device memory, over a host Communicator (the
// rank segment's shared-memory ShmComm): every collective synchronizes the rank's backend, copies
// its operands to host buffers, runs the host collective on them and copies the result back
// (docs/multi-gpu.md, "CUDA ranks"). Slow (a host round trip per collective) but exact and
// available on every backend and GPU count — one GPU with several rank processes included —
// which is what the sharded model on CUDA ranks needs first; the IPC all-reduce and NCCL
// (parallel/cuda/) are the fast paths beside it.
//
// allReduceSum takes F32, BF16 or F16: the host sums in f32 in rank order 0..N-1 on every rank
// and rounds once (round to nearest even) into the tensor's dtype, so every rank gets the same
// bits [TAG_REPLICATED_BITWISE]. The other collectives move whole rows of bytes.
//
// Threads: as collective.h (one rank's launching thread). Not for CUDA graph capture (it
// synchronizes the host).

#include <memory>
#include <vector>

#include "services/rose/ops/backend.h"
#include "services/rose/parallel/collective.h"

namespace garden::rose {

class StagedCommunicator final : public Communicator {
 public:
  // `host` works on host memory and must not synchronize a backend itself (made with a null
  // backend); `backend` holds the tensors this communicator is handed.
  StagedCommunicator(std::unique_ptr<Communicator> host, Backend& backend)
      : host_(std::move(host)), backend_(backend) {}

  int32_t rank() const override { return host_->rank(); }
  int32_t size() const override { return host_->size(); }
  void allReduceSum(const Tensor& inout) override;
  void allGatherRows(const Tensor& in, std::span<const int64_t> rows_per_rank,
                     const Tensor& out) override;
  void allToAllRows(const Tensor& send, std::span<const int64_t> send_rows, const Tensor& recv,
                    std::span<const int64_t> recv_rows) override;
  void broadcast(const Tensor& inout, int32_t root) override;
  void exchangeCounts(std::span<const int64_t> send, std::span<int64_t> recv) override;

 private:
  void download(std::vector<std::byte>& host, const Tensor& t);
  void upload(const Tensor& t, const std::vector<std::byte>& host);

  std::unique_ptr<Communicator> host_;
  Backend& backend_;
  std::vector<std::byte> a_, b_;
  std::vector<float> f32_;
};

}  // namespace garden::rose
