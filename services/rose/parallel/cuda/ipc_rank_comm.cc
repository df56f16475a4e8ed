#include "services/rose/parallel/cuda/ipc_rank_comm.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/logging.h"
#include "services/rose/ops/cuda/cuda_backend.h"
#include "services/rose/parallel/cuda/ipc_comm.h"
#include "services/rose/parallel/staged_comm.h"

namespace garden::rose {
namespace {

class IpcRankComm final : public Communicator {
 public:
  IpcRankComm(std::unique_ptr<Communicator> host, cuda::CudaBackend& b,
              std::unique_ptr<cuda::IpcAllReduce> ipc)
      : staged_(std::move(host), b), backend_(b), ipc_(std::move(ipc)) {}

  int32_t rank() const override { return staged_.rank(); }
  int32_t size() const override { return staged_.size(); }

  void allReduceSum(const Tensor& inout) override {
    const bool f32 = inout.dtype == DType::kF32, bf16 = inout.dtype == DType::kBF16;
    if ((f32 || bf16) && inout.bytes() <= ipc_->capacity()) {
      const Status st =
          ipc_->allReduceSum(inout.data, inout.data, inout.numel(),
                             f32 ? cuda::IpcDType::kF32 : cuda::IpcDType::kBF16, backend_.stream());
      CHECK_MSG(st.isOk(), st.toString().c_str());
      return;
    }
    staged_.allReduceSum(inout);
  }
  void allGatherRows(const Tensor& in, std::span<const int64_t> rows_per_rank,
                     const Tensor& out) override {
    staged_.allGatherRows(in, rows_per_rank, out);
  }
  void allToAllRows(const Tensor& send, std::span<const int64_t> send_rows, const Tensor& recv,
                    std::span<const int64_t> recv_rows) override {
    staged_.allToAllRows(send, send_rows, recv, recv_rows);
  }
  void broadcast(const Tensor& inout, int32_t root) override { staged_.broadcast(inout, root); }
  void exchangeCounts(std::span<const int64_t> send, std::span<int64_t> recv) override {
    staged_.exchangeCounts(send, recv);
  }

 private:
  StagedCommunicator staged_;
  cuda::CudaBackend& backend_;
  std::unique_ptr<cuda::IpcAllReduce> ipc_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> makeIpcRankCommunicator(std::unique_ptr<Communicator> host,
                                                              Backend& backend, size_t ipc_bytes) {
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&backend);
  if (cb == nullptr) return invalidArgument("the IPC all-reduce needs the cuda backend");
  if (ipc_bytes == 0 || ipc_bytes % 16 != 0) {
    return invalidArgument("the IPC all-reduce's capacity must be a positive multiple of 16");
  }
  if (cudaSetDevice(cb->device()) != cudaSuccess) return internalError("cudaSetDevice failed");
  const int32_t n = host->size(), r = host->rank();
  ASSIGN_OR_RETURN(auto ipc, cuda::IpcAllReduce::create(r, n, ipc_bytes));
  // Every member's handle, through the host collective (bytes).
  constexpr int64_t kHandle = sizeof(cuda::IpcHandle);
  std::vector<cuda::IpcHandle> all(static_cast<size_t>(n));
  cuda::IpcHandle mine = ipc->handle();
  std::vector<int64_t> ones(static_cast<size_t>(n), 1);
  host->allGatherRows(Tensor(&mine, DType::kU8, {1, kHandle}), ones,
                      Tensor(all.data(), DType::kU8, {n, kHandle}));
  RETURN_IF_ERROR(ipc->connect(all));
  return std::unique_ptr<Communicator>(
      std::make_unique<IpcRankComm>(std::move(host), *cb, std::move(ipc)));
}

}  // namespace garden::rose
