#include "services/rose/parallel/cuda/ipc_comm.h"

#include <cstring>
#include <string>

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

namespace {

// Maps every peer's buffer (all but `rank`'s: CUDA cannot open a process's own handle) into
// bufs[], keeping the mappings in `peers`.
Status openPeers(const char* what, int rank, int world, std::span<const IpcHandle> handles,
                 char* (&bufs)[kIpcMaxRanks], std::vector<std::unique_ptr<IpcMapping>>& peers) {
  if (static_cast<int>(handles.size()) != world) {
    return invalidArgument(std::string(what) + ": connect needs one handle per rank");
  }
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    ASSIGN_OR_RETURN(auto m, IpcMapping::open(handles[static_cast<size_t>(r)]));
    bufs[r] = static_cast<char*>(m->data());
    peers.push_back(std::move(m));
  }
  return okStatus();
}

}  // namespace

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
  return openPeers("ipc all-reduce", args_.rank, args_.world, handles, args_.bufs, peers_);
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

Result<std::unique_ptr<IpcAllToAll>> IpcAllToAll::create(int rank, int world, int64_t max_rows,
                                                         size_t slot_bytes, int blocks) {
  if (world < 1 || world > kIpcMaxRanks || rank < 0 || rank >= world) {
    return invalidArgument("ipc all-to-all: rank " + std::to_string(rank) + " of " +
                           std::to_string(world) + " (at most " + std::to_string(kIpcMaxRanks) +
                           " ranks)");
  }
  if (blocks < 1 || blocks > kIpcMaxBlocks || max_rows < 1 || slot_bytes == 0 ||
      slot_bytes % 16 != 0) {
    return invalidArgument(
        "ipc all-to-all: blocks in [1, 32], max_rows >= 1, slot bytes a positive multiple of 16");
  }
  std::unique_ptr<IpcAllToAll> c(new IpcAllToAll());
  c->blocks_ = blocks;
  c->args_.rank = rank;
  c->args_.world = world;
  c->args_.max_rows = max_rows;
  c->args_.slot_bytes = slot_bytes;
  // One allocation: the buffer peers write into, then this rank's own words (epoch, error, done
  // blocks) past it — peers never touch those.
  const size_t bytes = a2aBufferBytes(world, max_rows, slot_bytes);
  CUDA_RETURN_IF_ERROR(cudaMalloc(&c->own_, bytes + 16));
  // acks and flags start at 0 (epochs count from 1); the data needs no clearing
  CUDA_RETURN_IF_ERROR(cudaMemset(c->own_, 0, kA2aAckBytes + a2aFlagBytes(max_rows)));
  c->args_.words = reinterpret_cast<uint32_t*>(static_cast<char*>(c->own_) + bytes);
  CUDA_RETURN_IF_ERROR(cudaMemset(c->args_.words, 0, 16));
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // zeroed before any peer may write into it
  c->args_.bufs[rank] = static_cast<char*>(c->own_);
  ASSIGN_OR_RETURN(c->handle_, exportIpcHandle(c->own_));
  return c;
}

IpcAllToAll::~IpcAllToAll() {
  peers_.clear();
  if (own_ != nullptr) (void)cudaFree(own_);
}

Status IpcAllToAll::connect(std::span<const IpcHandle> handles) {
  return openPeers("ipc all-to-all", args_.rank, args_.world, handles, args_.bufs, peers_);
}

Status IpcAllToAll::allToAllRows(const void* send, std::span<const int64_t> send_rows, void* recv,
                                 std::span<const int64_t> recv_rows, size_t row_bytes,
                                 cudaStream_t stream) {
  const int world = args_.world;
  if (static_cast<int>(send_rows.size()) != world || static_cast<int>(recv_rows.size()) != world) {
    return invalidArgument("ipc all-to-all: one send and one receive count per rank");
  }
  if (row_bytes == 0 || row_bytes % 16 != 0) {
    return invalidArgument("ipc all-to-all: rows must be a positive multiple of 16 bytes");
  }
  A2aCounts counts;
  for (int q = 0; q < world; ++q) {
    if (args_.bufs[q] == nullptr) return failedPrecondition("ipc all-to-all: connect() first");
    for (const int64_t n : {send_rows[static_cast<size_t>(q)], recv_rows[static_cast<size_t>(q)]}) {
      if (n < 0 || n > args_.max_rows || static_cast<size_t>(n) * row_bytes > args_.slot_bytes) {
        return invalidArgument("ipc all-to-all: " + std::to_string(n) + " rows of " +
                               std::to_string(row_bytes) + " bytes exceed a slot of " +
                               std::to_string(args_.max_rows) + " rows / " +
                               std::to_string(args_.slot_bytes) + " bytes");
      }
    }
    counts.send_rows[q] = send_rows[static_cast<size_t>(q)];
    counts.recv_rows[q] = recv_rows[static_cast<size_t>(q)];
  }
  CUDA_RETURN_IF_ERROR(
      launchIpcAllToAll(args_, send, recv, row_bytes, counts, blocks_, stream));
  return okStatus();
}

Status IpcAllToAll::checkError() {
  uint32_t err = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpy(&err, args_.words + 1, sizeof(err), cudaMemcpyDeviceToHost));
  if (err != 0) return internalError("ipc all-to-all: a wait timed out (a peer rank is gone)");
  return okStatus();
}

}  // namespace garden::rose::cuda
