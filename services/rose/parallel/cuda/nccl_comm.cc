#include "services/rose/parallel/cuda/nccl_comm.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace garden::rose::cuda {
namespace {

Status ncclStatus(ncclResult_t r, const char* what) {
  return internalError(std::string("nccl: ") + what + ": " + ncclGetErrorString(r));
}

ncclDataType_t ncclType(IpcDType d) { return d == IpcDType::kF32 ? ncclFloat32 : ncclBfloat16; }

}  // namespace

bool disableNvls() {
  const char* cur = std::getenv("NCCL_NVLS_ENABLE");
  const bool overridden = cur != nullptr && std::strcmp(cur, "0") != 0;
  if (overridden) {
    std::fprintf(stderr, "rose: NCCL_NVLS_ENABLE=%s overridden to 0 (NVLink multicast is off)\n",
                 cur);
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  return overridden;
}

Result<NcclId> NcclComm::newId() {
  disableNvls();
  NcclId id;
  const ncclResult_t r = ncclGetUniqueId(&id.id);
  if (r != ncclSuccess) return ncclStatus(r, "ncclGetUniqueId");
  return id;
}

Result<std::unique_ptr<NcclComm>> NcclComm::create(int rank, int world, const NcclId& id) {
  disableNvls();  // before NCCL initializes in this process
  ncclComm_t c = nullptr;
  const ncclResult_t r = ncclCommInitRank(&c, world, id.id, rank);
  if (r != ncclSuccess) return ncclStatus(r, "ncclCommInitRank");
  return std::unique_ptr<NcclComm>(new NcclComm(c));
}

NcclComm::~NcclComm() {
  if (comm_ != nullptr) (void)ncclCommDestroy(comm_);
}

Status NcclComm::allReduceSum(const void* in, void* out, int64_t n, IpcDType dtype,
                              cudaStream_t stream) {
  const ncclResult_t r =
      ncclAllReduce(in, out, static_cast<size_t>(n), ncclType(dtype), ncclSum, comm_, stream);
  if (r != ncclSuccess) return ncclStatus(r, "ncclAllReduce");
  return okStatus();
}

Status NcclComm::allGather(const void* in, void* out, int64_t n, IpcDType dtype,
                           cudaStream_t stream) {
  const ncclResult_t r =
      ncclAllGather(in, out, static_cast<size_t>(n), ncclType(dtype), comm_, stream);
  if (r != ncclSuccess) return ncclStatus(r, "ncclAllGather");
  return okStatus();
}

Status NcclComm::broadcastBytes(void* buf, size_t bytes, int root, cudaStream_t stream) {
  const ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream);
  if (r != ncclSuccess) return ncclStatus(r, "ncclBroadcast");
  return okStatus();
}

Status NcclComm::allGatherBytes(const void* in, void* out, size_t bytes, cudaStream_t stream) {
  const ncclResult_t r = ncclAllGather(in, out, bytes, ncclUint8, comm_, stream);
  if (r != ncclSuccess) return ncclStatus(r, "ncclAllGather");
  return okStatus();
}

Status NcclComm::allToAllBytes(const char* send, std::span<const size_t> send_off,
                               std::span<const size_t> send_bytes, char* recv,
                               std::span<const size_t> recv_off,
                               std::span<const size_t> recv_bytes, cudaStream_t stream) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return ncclStatus(r, "ncclGroupStart");
  for (size_t q = 0; q < send_bytes.size() && r == ncclSuccess; ++q) {
    if (send_bytes[q] > 0) {
      r = ncclSend(send + send_off[q], send_bytes[q], ncclUint8, static_cast<int>(q), comm_,
                   stream);
    }
    if (r == ncclSuccess && recv_bytes[q] > 0) {
      r = ncclRecv(recv + recv_off[q], recv_bytes[q], ncclUint8, static_cast<int>(q), comm_,
                   stream);
    }
  }
  const ncclResult_t end = ncclGroupEnd();
  if (r != ncclSuccess) return ncclStatus(r, "ncclSend/ncclRecv");
  if (end != ncclSuccess) return ncclStatus(end, "ncclGroupEnd");
  return okStatus();
}

Status NodeAllReduce::allReduceSum(const void* in, void* out, int64_t n, IpcDType dtype,
                                   cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(n) * (dtype == IpcDType::kF32 ? 4 : 2);
  if (usesIpc(bytes)) return ipc_->allReduceSum(in, out, n, dtype, stream);
  if (nccl_ != nullptr) return nccl_->allReduceSum(in, out, n, dtype, stream);
  return failedPrecondition("all-reduce of " + std::to_string(bytes) +
                            " bytes: larger than the IPC buffer and no NCCL communicator");
}

}  // namespace garden::rose::cuda
