#include "services/rose/parallel/cuda/device_rank_comm.h"

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "common/logging.h"
#include "services/rose/ops/cuda/cuda_backend.h"
#include "services/rose/parallel/cuda/ipc_comm.h"
#include "services/rose/parallel/staged_comm.h"
#if defined(GARDEN_HAVE_NCCL) && GARDEN_HAVE_NCCL
#include "services/rose/parallel/cuda/nccl_comm.h"
#endif

namespace garden::rose {
namespace {

#if defined(GARDEN_HAVE_NCCL) && GARDEN_HAVE_NCCL
using NcclPtr = std::unique_ptr<cuda::NcclComm>;
#else
struct NoNccl {};
using NcclPtr = std::unique_ptr<NoNccl>;
#endif

void check(const Status& st) { CHECK_MSG(st.isOk(), st.toString().c_str()); }

class DeviceRankComm final : public Communicator {
 public:
  DeviceRankComm(std::unique_ptr<Communicator> host, cuda::CudaBackend& b,
                 std::unique_ptr<cuda::IpcAllReduce> ipc, std::unique_ptr<cuda::IpcAllToAll> a2a,
                 NcclPtr nccl)
      : staged_(std::move(host), b),
        backend_(b),
        ipc_(std::move(ipc)),
        a2a_(std::move(a2a)),
        nccl_(std::move(nccl)) {}

  int32_t rank() const override { return staged_.rank(); }
  int32_t size() const override { return staged_.size(); }

  void allReduceSum(const Tensor& inout) override {
    const bool f32 = inout.dtype == DType::kF32, bf16 = inout.dtype == DType::kBF16;
    const cuda::IpcDType dt = f32 ? cuda::IpcDType::kF32 : cuda::IpcDType::kBF16;
    if ((f32 || bf16) && ipc_ != nullptr && inout.bytes() <= ipc_->capacity()) {
      return check(ipc_->allReduceSum(inout.data, inout.data, inout.numel(), dt, stream()));
    }
#if defined(GARDEN_HAVE_NCCL) && GARDEN_HAVE_NCCL
    if ((f32 || bf16) && nccl_ != nullptr) {
      return check(nccl_->allReduceSum(inout.data, inout.data, inout.numel(), dt, stream()));
    }
#endif
    staged_.allReduceSum(inout);
  }

  void allGatherRows(const Tensor& in, std::span<const int64_t> rows_per_rank,
                     const Tensor& out) override {
#if defined(GARDEN_HAVE_NCCL) && GARDEN_HAVE_NCCL
    bool equal = true;
    for (int64_t r : rows_per_rank) equal = equal && r == rows_per_rank[0];
    if (nccl_ != nullptr && equal) {
      return check(nccl_->allGatherBytes(in.data, out.data, in.bytes(), stream()));
    }
#endif
    staged_.allGatherRows(in, rows_per_rank, out);
  }

  void allToAllRows(const Tensor& send, std::span<const int64_t> send_rows, const Tensor& recv,
                    std::span<const int64_t> recv_rows) override {
    const size_t rb = recv.ndim > 0 ? collectiveRowBytes(recv) : collectiveRowBytes(send);
    if (a2a_ != nullptr && a2a_->fitsRows(rb)) {  // [TAG_IPC_ALLTOALL]
      return check(a2a_->allToAllRows(send.data, send_rows, recv.data, recv_rows, rb, stream()));
    }
#if defined(GARDEN_HAVE_NCCL) && GARDEN_HAVE_NCCL
    if (nccl_ != nullptr) {
      const size_t n = send_rows.size();
      std::vector<size_t> so(n), sb(n), ro(n), rbytes(n);
      size_t s_at = 0, r_at = 0;
      for (size_t q = 0; q < n; ++q) {
        so[q] = s_at;
        sb[q] = static_cast<size_t>(send_rows[q]) * rb;
        s_at += sb[q];
        ro[q] = r_at;
        rbytes[q] = static_cast<size_t>(recv_rows[q]) * rb;
        r_at += rbytes[q];
      }
      return check(nccl_->allToAllBytes(static_cast<const char*>(send.data), so, sb,
                                        static_cast<char*>(recv.data), ro, rbytes, stream()));
    }
#endif
    staged_.allToAllRows(send, send_rows, recv, recv_rows);
  }

  void broadcast(const Tensor& inout, int32_t root) override {
#if defined(GARDEN_HAVE_NCCL) && GARDEN_HAVE_NCCL
    if (nccl_ != nullptr)
      return check(nccl_->broadcastBytes(inout.data, inout.bytes(), root, stream()));
#endif
    staged_.broadcast(inout, root);
  }

  void exchangeCounts(std::span<const int64_t> send, std::span<int64_t> recv) override {
    staged_.exchangeCounts(send, recv);  // host values
  }

 private:
  cudaStream_t stream() const { return backend_.stream(); }

  StagedCommunicator staged_;
  cuda::CudaBackend& backend_;
  std::unique_ptr<cuda::IpcAllReduce> ipc_;
  std::unique_ptr<cuda::IpcAllToAll> a2a_;
  NcclPtr nccl_;
};

}  // namespace

bool deviceCommHasNccl() {
#if defined(GARDEN_HAVE_NCCL) && GARDEN_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

Result<std::unique_ptr<Communicator>> makeDeviceRankCommunicator(std::unique_ptr<Communicator> host,
                                                                 Backend& backend,
                                                                 const DeviceCommOptions& opts) {
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&backend);
  if (cb == nullptr) return invalidArgument("device collectives need the cuda backend");
  if (opts.ipc_bytes % 16 != 0) {
    return invalidArgument("the IPC all-reduce's capacity must be a multiple of 16");
  }
  if (opts.ipc_alltoall_bytes % 16 != 0 || (opts.ipc_alltoall_bytes > 0 && opts.alltoall_rows < 1)) {
    return invalidArgument(
        "the IPC all-to-all's slot must be a multiple of 16 bytes, with a row bound >= 1");
  }
  if (opts.nccl && !deviceCommHasNccl()) {
    return failedPrecondition("NCCL collectives asked for, but this rose was built without NCCL");
  }
  if (cudaSetDevice(cb->device()) != cudaSuccess) return internalError("cudaSetDevice failed");
  const int32_t n = host->size(), r = host->rank();
  std::unique_ptr<cuda::IpcAllReduce> ipc;
  // Every member's IPC handle, through the host collective (bytes).
  auto handles = [&](const cuda::IpcHandle& own) {
    constexpr int64_t kHandle = sizeof(cuda::IpcHandle);
    std::vector<cuda::IpcHandle> all(static_cast<size_t>(n));
    cuda::IpcHandle mine = own;
    const std::vector<int64_t> ones(static_cast<size_t>(n), 1);
    host->allGatherRows(Tensor(&mine, DType::kU8, {1, kHandle}), ones,
                        Tensor(all.data(), DType::kU8, {n, kHandle}));
    return all;
  };
  if (opts.ipc_bytes > 0) {
    ASSIGN_OR_RETURN(ipc, cuda::IpcAllReduce::create(r, n, opts.ipc_bytes));
    RETURN_IF_ERROR(ipc->connect(handles(ipc->handle())));
  }
  std::unique_ptr<cuda::IpcAllToAll> a2a;
  if (opts.ipc_alltoall_bytes > 0) {  // [TAG_IPC_ALLTOALL]
    ASSIGN_OR_RETURN(a2a, cuda::IpcAllToAll::create(r, n, opts.alltoall_rows,
                                                     opts.ipc_alltoall_bytes));
    RETURN_IF_ERROR(a2a->connect(handles(a2a->handle())));
  }
  NcclPtr nccl;
#if defined(GARDEN_HAVE_NCCL) && GARDEN_HAVE_NCCL
  if (opts.nccl) {
    // Member 0 makes the id; the host collective hands it to the others.
    cuda::NcclId id{};
    if (r == 0) {
      ASSIGN_OR_RETURN(id, cuda::NcclComm::newId());
    }
    host->broadcast(Tensor(&id, DType::kU8, {static_cast<int64_t>(sizeof(id))}), 0);
    ASSIGN_OR_RETURN(nccl, cuda::NcclComm::create(r, n, id));
  }
#endif
  return std::unique_ptr<Communicator>(
      std::make_unique<DeviceRankComm>(std::move(host), *cb, std::move(ipc), std::move(a2a),
                                       std::move(nccl)));
}

}  // namespace garden::rose
