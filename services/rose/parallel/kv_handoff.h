#pragma once
// KV-block handoff between rose processes of one host (prefill/decode disaggregation,
// docs/multi-gpu.md): a prefill worker's paged KV cache is exported once, a decode worker maps it
// once and copies a request's blocks (src block → dst block, every layer, K and V) into its own
// cache, then acks; only then may the prefill side reuse those blocks. This file is the
// host-memory implementation of that interface, the twin of the CUDA one in
// parallel/cuda/ipc_comm.h (exportIpcHandle / IpcMapping / copyKvBlocks → launchKvBlockCopy):
//   export  SharedKvPools::create: the K and V pools in a memfd (the cpu backend's cache is host
//           memory; a cache built over the memfd, PagedKvCache::wrap, is what the prefill side
//           runs), handed to the importer as a file descriptor (CUDA: the pools' IPC handles);
//   map     SharedKvPools::map: a read-only mapping of an exported pool pair (CUDA: IpcMapping);
//   copy    copyKvBlocks: pairs checked on the host (INVALID_ARGUMENT naming the pair), then the
//           block copies in order with the destination backend's queue (CUDA: one kernel).
// Layout of a pool (paged_kv_cache.h): [layers][num_blocks][block_size][kv_heads][head_dim];
// one block of one layer is block_bytes contiguous bytes. Source and destination must agree on
// layers and block_bytes (same block size, kv heads, head dim, dtype); block ids differ.
//
// Not here yet (see docs/multi-gpu.md): the protocol around it — a channel batch that asks a
// decode worker to pull, its completion as the ack, and tulip's prefill and decode pools.
//
// Threads: SharedKvPools is immutable after create/map; copyKvBlocks on the destination
// backend's launching thread. The source blocks must not change until the copy completed.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "services/rose/ops/backend.h"
#include "services/rose/ops/paged_kv_cache.h"

namespace garden::rose {

// A cache's two pools as the copy reads them (host pointers; the CUDA twin holds device ones).
struct KvPoolView {
  const std::byte* k = nullptr;
  const std::byte* v = nullptr;
  int32_t layers = 0;
  int32_t num_blocks = 0;
  int64_t block_bytes = 0;
  // The element type; checkKvBlockPairs refuses a destination of another one (bf16 and fp16
  // blocks have the same bytes [TAG_ATTN_F16]). Views built by hand for raw copies may leave it.
  DType dtype = DType::kF32;
};
KvPoolView kvPoolView(const PagedKvCache& cache);

// pairs: [n, 2] flat (src block, dst block). INVALID_ARGUMENT naming the pair when an id is out
// of range or a destination block repeats, or naming the field when layers / block_bytes differ.
Status checkKvBlockPairs(const KvPoolView& src, const PagedKvCache& dst,
                         std::span<const int32_t> pairs);

// Checks, then copies every pair's block of every layer, K and V, into `dst`, in order with
// what `dst_backend` was asked to do before (cpu: on its queue, complete when synchronize()
// returns). UNIMPLEMENTED on other backends (CUDA: parallel/cuda copyKvBlocks).
Status copyKvBlocks(Backend& dst_backend, const KvPoolView& src, PagedKvCache& dst,
                    std::span<const int32_t> pairs);

class SharedKvPools {
 public:
  // Exporter: zeroed K and V pools for `shape`/`dtype` in a new memfd (close-on-exec; pass fd()
  // to the importer, e.g. across fork/exec or SCM_RIGHTS).
  static Result<std::unique_ptr<SharedKvPools>> create(const KvCacheShape& shape, DType dtype);
  // Importer: maps an exported pair read-only. The shape must be the exporter's (checked
  // against the descriptor's size; INVALID_ARGUMENT otherwise).
  static Result<std::unique_ptr<SharedKvPools>> map(int fd, const KvCacheShape& shape,
                                                    DType dtype);
  ~SharedKvPools();
  SharedKvPools(const SharedKvPools&) = delete;
  SharedKvPools& operator=(const SharedKvPools&) = delete;

  int fd() const { return fd_; }
  // Exporter only: a cache over the pools (the prefill side runs its model on it). The pools
  // must outlive it.
  Result<std::unique_ptr<PagedKvCache>> cache() const;
  KvPoolView view() const;

 private:
  SharedKvPools(int fd, std::byte* base, size_t pool_bytes, const KvCacheShape& s, DType d,
                bool writable)
      : fd_(fd), base_(base), pool_bytes_(pool_bytes), shape_(s), dtype_(d), writable_(writable) {}
  int fd_ = -1;
  std::byte* base_ = nullptr;  // K pool, then V pool
  size_t pool_bytes_ = 0;
  KvCacheShape shape_;
  DType dtype_ = DType::kF32;
  bool writable_ = false;
};

}  // namespace garden::rose
