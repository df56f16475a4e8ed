#include "services/rose/parallel/staged_comm.h"

#include <cstring>

#include "common/logging.h"
#include "common/safetensors.h"

namespace garden::rose {
namespace {

// A host tensor with `t`'s dtype and shape over `mem`.
Tensor hostLike(const Tensor& t, void* mem) {
  Tensor h = t;
  h.data = mem;
  return h;
}

}  // namespace

void StagedCommunicator::download(std::vector<std::byte>& host, const Tensor& t) {
  host.resize(t.bytes());
  if (!host.empty()) backend_.copyToHost(host.data(), t, host.size());
  CHECK(backend_.synchronize().isOk());
}

void StagedCommunicator::upload(const Tensor& t, const std::vector<std::byte>& host) {
  if (t.bytes() > 0) backend_.copyToDevice(t, host.data(), t.bytes());
}

void StagedCommunicator::allReduceSum(const Tensor& inout) {
  CHECK_MSG(inout.dtype == DType::kF32 || inout.dtype == DType::kBF16 || inout.dtype == DType::kF16,
            "staged all-reduce wants F32, BF16 or F16");
  download(a_, inout);
  const size_t n = static_cast<size_t>(inout.numel());
  if (inout.dtype == DType::kF32) {
    host_->allReduceSum(hostLike(inout, a_.data()));
  } else {
    f32_.resize(n);
    CHECK(convertToF32(a_.data(), inout.dtype, n, f32_.data()).isOk());
    host_->allReduceSum(Tensor(f32_.data(), DType::kF32, {static_cast<int64_t>(n)}));
    auto* h = reinterpret_cast<uint16_t*>(a_.data());
    const bool bf = inout.dtype == DType::kBF16;
    for (size_t i = 0; i < n; ++i) h[i] = bf ? f32ToBf16(f32_[i]) : f32ToF16(f32_[i]);
  }
  upload(inout, a_);
}

void StagedCommunicator::allGatherRows(const Tensor& in, std::span<const int64_t> rows_per_rank,
                                       const Tensor& out) {
  download(a_, in);
  b_.resize(out.bytes());
  host_->allGatherRows(hostLike(in, a_.data()), rows_per_rank, hostLike(out, b_.data()));
  upload(out, b_);
}

void StagedCommunicator::allToAllRows(const Tensor& send, std::span<const int64_t> send_rows,
                                      const Tensor& recv, std::span<const int64_t> recv_rows) {
  download(a_, send);
  b_.resize(recv.bytes());
  host_->allToAllRows(hostLike(send, a_.data()), send_rows, hostLike(recv, b_.data()), recv_rows);
  upload(recv, b_);
}

void StagedCommunicator::broadcast(const Tensor& inout, int32_t root) {
  download(a_, inout);
  host_->broadcast(hostLike(inout, a_.data()), root);
  upload(inout, a_);
}

void StagedCommunicator::exchangeCounts(std::span<const int64_t> send, std::span<int64_t> recv) {
  CHECK(backend_.synchronize().isOk());
  host_->exchangeCounts(send, recv);
}

}  // namespace garden::rose
