#include "services/rose/parallel/cuda/ipc_comm.h"

#include <cstring>

#include "services/rose/ops/cuda/cuda_utils.h"

namespace garden::rose::cuda {

Result<IpcHandle> exportIpcHandle(void* base) {
  cudaIpcMemHandle_t h;
  CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&h, base));
  IpcHandle out;
  std::memcpy(out.bytes, &h, sizeof(h));
  return out;
}

Result<std::unique_ptr<IpcMapping>> IpcMapping::open(const IpcHandle& handle) {
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.bytes, sizeof(h));
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  return std::unique_ptr<IpcMapping>(new IpcMapping(p));
}

IpcMapping::~IpcMapping() {
  if (ptr_ != nullptr) (void)cudaIpcCloseMemHandle(ptr_);
}

Result<std::unique_ptr<IpcAllReduce>> IpcAllReduce::create(int rank, int world, size_t capacity,
                                                           int blocks) {
  if (world < 1 || world > kIpcMaxRanks || rank < 0 || rank >= world) {
    return invalidArgument("ipc all-reduce: rank " + std::to_string(rank) + " of " +
                           std::to_string(world) + " (at most " + std::to_string(kIpcMaxRanks) +
                           " ranks)");
  }
  if (blocks < 1 || blocks > kIpcMaxBlocks || capacity == 0 || capacity % 256 != 0) {
    return invalidArgument(
        "ipc all-reduce: blocks in [1, 32], capacity a positive multiple of 256");
  }
  std::unique_ptr<IpcAllReduce> c(new IpcAllReduce());
  c->blocks_ = blocks;
  c->args_.rank = rank;
  c->args_.world = world;
  c->args_.capacity = capacity;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&c->own_, ipcBufferBytes(capacity)));
  CUDA_RETURN_IF_ERROR(cudaMemset(c->own_, 0, kIpcFlagBytes));  // epochs of flags start at 0
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&c->words_), 2 * sizeof(uint32_t)));
  CUDA_RETURN_IF_ERROR(cudaMemset(c->words_, 0, 2 * sizeof(uint32_t)));
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // zeroed before any peer may signal into it
  c->args_.epochs = c->words_;
  c->args_.error = c->words_ + 1;
  c->args_.bufs[rank] = static_cast<char*>(c->own_);
  ASSIGN_OR_RETURN(c->handle_, exportIpcHandle(c->own_));
  return c;
}

IpcAllReduce::~IpcAllReduce() {
  peers_.clear();
  if (own_ != nullptr) (void)cudaFree(own_);
  if (words_ != nullptr) (void)cudaFree(words_);
}

Status IpcAllReduce::connect(std::span<const IpcHandle> handles) {
  if (static_cast<int>(handles.size()) != args_.world) {
    return invalidArgument("ipc all-reduce: connect needs one handle per rank");
  }
  for (int r = 0; r < args_.world; ++r) {
    if (r == args_.rank) continue;  // CUDA cannot open a process's own handle
    ASSIGN_OR_RETURN(auto m, IpcMapping::open(handles[static_cast<size_t>(r)]));
    args_.bufs[r] = static_cast<char*>(m->data());
    peers_.push_back(std::move(m));
  }
  return okStatus();
}

Status IpcAllReduce::allReduceSum(const void* in, void* out, int64_t n, IpcDType dtype,
                                  cudaStream_t stream, const IpcAlgo* force_algo) {
  const size_t bytes = static_cast<size_t>(n) * (dtype == IpcDType::kF32 ? 4 : 2);
  if (n < 0 || bytes > args_.capacity) {
    return invalidArgument("ipc all-reduce: " + std::to_string(bytes) + " bytes exceed the " +
                           std::to_string(args_.capacity) + "-byte buffer");
  }
  for (int r = 0; r < args_.world; ++r) {
    if (args_.bufs[r] == nullptr) return failedPrecondition("ipc all-reduce: connect() first");
  }
  const IpcAlgo algo = force_algo != nullptr ? *force_algo : pickIpcAlgo(bytes, args_.world);
  CUDA_RETURN_IF_ERROR(launchIpcAllReduce(args_, in, out, n, dtype, algo, blocks_, stream));
  return okStatus();
}

Status IpcAllReduce::checkError() {
  uint32_t err = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpy(&err, args_.error, sizeof(err), cudaMemcpyDeviceToHost));
  if (err != 0) return internalError("ipc all-reduce: a barrier timed out (a peer rank is gone)");
  return okStatus();
}

}  // namespace garden::rose::cuda
