#pragma once
// KV-block handoff between rose processes of one host (prefill/decode disaggregation,
// docs/multi-gpu.md): a prefill worker's paged KV cache is exported once, a decode worker maps it
// once and copies a request's blocks (src block → dst block, every layer, K and V) into its own
// cache, then acks; only then may the prefill side reuse those blocks. Host memory (cpu backend)
// and device memory (cuda backend, [TAG_KV_PULL_CUDA]) alike:
//   export  host: SharedKvPools::create / createNamed: the K and V pools in a memfd or a shm
//           segment (a cache built over them, PagedKvCache::wrap, is what the prefill side runs);
//           device: createNamedDevice: the cache stays the backend's own allocation, the segment
//           carries its two CUDA IPC handles (Backend::exportPeerMemory);
//   map     host: SharedKvPools::map / openNamed (read-only mapping); device: openNamed then
//           mapDevice (Backend::openPeerMemory);
//   copy    copyKvBlocks: pairs checked on the host (INVALID_ARGUMENT naming the pair), then
//           Backend::copyKvBlocks in order with the destination backend's queue (cpu: memcpy per
//           block and layer; cuda: one kernel, ops/cuda/kv_block_copy.cuh, reading the peer's
//           memory within one GPU or over NVLink).
// Layout of a pool (paged_kv_cache.h): per layer [layerBlocks][block_size][kv_heads][head_dim];
// one block of one layer is block_bytes contiguous bytes. With a window pool
// [TAG_KV_WINDOW_GROUP] the window layers have num_blocks_window blocks and their own ids, so a
// handoff carries two pair lists: the full pool's and the window pool's. Source and destination
// must agree on layers, block bytes (block size, kv heads, head dim), dtype and which layers are
// window layers; block counts and ids differ.
//
// Named exports [TAG_KV_PULL] (SharedKvPools::createNamed / openNamed): the pools in a POSIX
// shm segment /dev/shm/<name> behind a header (magic, version, exporter pid, shape, dtype,
// location; a device export's segment is the header with the pools' IPC handles), so a worker
// started separately (rose --kv-export NAME) can be pulled from by name and pid — the form
// rose's kKvPull batches use (common/shm/llm_batch.h).
//
// Threads: SharedKvPools is immutable after create/map; copyKvBlocks on the destination
// backend's launching thread. The source blocks must not change until the copy completed.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "services/rose/ops/backend.h"
#include "services/rose/ops/paged_kv_cache.h"

namespace garden::rose {

// A cache's two pools as the copy reads them (host pointers; the CUDA twin holds device ones).
struct KvPoolView {
  const std::byte* k = nullptr;
  const std::byte* v = nullptr;
  KvCacheShape shape;  // layers, blocks of each pool, block geometry, window layers
  // The element type; checkKvBlockPairs refuses a destination of another one (bf16 and fp16
  // blocks have the same bytes [TAG_ATTN_F16]).
  DType dtype = DType::kF32;
  // Device memory (a cuda cache, or a peer's mapped through CUDA IPC) rather than host memory;
  // copyKvBlocks refuses a destination backend of the other kind.
  bool device = false;
  int64_t blockBytes() const;
};
KvPoolView kvPoolView(const PagedKvCache& cache);

// pairs: [n, 2] flat (src block, dst block) of the full pool; window_pairs: the same for the
// window pool (both sides must have one, with the same window layers; empty otherwise).
// INVALID_ARGUMENT naming the pair ("pair 3: ..." / "window pair 1: ...") when an id is out of
// range or a destination block repeats, or naming the field when layers, block bytes, dtype or
// the window layers differ.
Status checkKvBlockPairs(const KvPoolView& src, const PagedKvCache& dst,
                         std::span<const int32_t> pairs,
                         std::span<const int32_t> window_pairs = {});

// FAILED_PRECONDITION when a source cache in device memory (`src_device`) meets a destination
// backend whose memory is host memory, or the other way round.
Status checkKvPoolLocation(bool src_device, const Backend& dst_backend);

// Checks, then copies every pair's block of every layer of its pool, K and V, into `dst`, in
// order with what `dst_backend` was asked to do before (Backend::copyKvBlocks: complete when
// an event recorded after it fires / synchronize() returns). FAILED_PRECONDITION when `src` is
// host memory and `dst_backend` a device one or the other way round, or when it is not mapped.
Status copyKvBlocks(Backend& dst_backend, const KvPoolView& src, PagedKvCache& dst,
                    std::span<const int32_t> pairs, std::span<const int32_t> window_pairs = {});

class SharedKvPools {
 public:
  // Exporter: zeroed K and V pools for `shape`/`dtype` in a new memfd (close-on-exec; pass fd()
  // to the importer, e.g. across fork/exec or SCM_RIGHTS).
  static Result<std::unique_ptr<SharedKvPools>> create(const KvCacheShape& shape, DType dtype);
  // Importer: maps an exported pair read-only. The shape must be the exporter's (checked
  // against the descriptor's size; INVALID_ARGUMENT otherwise).
  static Result<std::unique_ptr<SharedKvPools>> map(int fd, const KvCacheShape& shape,
                                                    DType dtype);
  // [TAG_KV_PULL] Exporter: the pools in /dev/shm/<name> (name: 1-63 characters of [A-Za-z0-9._-]),
  // created mode 0600 with this process's pid in the header; unlinked on destruction. A segment
  // already under the name is replaced only when it is an export whose pid is no longer alive
  // (a crashed exporter's); otherwise FAILED_PRECONDITION naming the pid or what it is.
  static Result<std::unique_ptr<SharedKvPools>> createNamed(const std::string& name,
                                                            const KvCacheShape& shape,
                                                            DType dtype);
  // [TAG_KV_PULL_CUDA] Exporter of a cache in device memory: /dev/shm/<name> holds the header
  // only, with `k` and `v`, the IPC handles of the cache's two pools (Backend::exportPeerMemory
  // of its keys(0) / values(0)); the cache stays the caller's and must outlive this object.
  // Names and replacement as createNamed.
  static Result<std::unique_ptr<SharedKvPools>> createNamedDevice(const std::string& name,
                                                                  const KvCacheShape& shape,
                                                                  DType dtype,
                                                                  const PeerMemoryHandle& k,
                                                                  const PeerMemoryHandle& v);
  // Importer: maps /dev/shm/<name> read-only, shape and dtype from its header (a device export:
  // its handles; view() has no pools until mapDevice).
  // FAILED_PRECONDITION when there is none, when it is not complete yet, or when its pid is not
  // `expected_pid` (> 0; the export was re-created by another process: what the pull named is
  // gone); INVALID_ARGUMENT for a malformed segment.
  static Result<std::unique_ptr<SharedKvPools>> openNamed(const std::string& name,
                                                          int32_t expected_pid);
  ~SharedKvPools();
  SharedKvPools(const SharedKvPools&) = delete;
  SharedKvPools& operator=(const SharedKvPools&) = delete;

  // Importer of a device export: maps the two pools through `backend` (once; unmapped on
  // destruction, through the same backend, which must outlive this object).
  // FAILED_PRECONDITION for a host export or on the exporter's side.
  Status mapDevice(Backend& backend);
  bool onDevice() const { return device_; }
  const PeerMemoryHandle& kHandle() const { return k_handle_; }
  const PeerMemoryHandle& vHandle() const { return v_handle_; }

  int fd() const { return fd_; }
  const KvCacheShape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  // Named exports: the exporter's pid (the importer reads it from the header); 0 otherwise.
  int32_t pid() const { return pid_; }
  // Exporter only: a cache over the pools (the prefill side runs its model on it). The pools
  // must outlive it.
  Result<std::unique_ptr<PagedKvCache>> cache() const;
  KvPoolView view() const;

 private:
  // createNamed (k, v null) and createNamedDevice.
  static Result<std::unique_ptr<SharedKvPools>> createNamedAt(const std::string& name,
                                                              const KvCacheShape& shape,
                                                              DType dtype,
                                                              const PeerMemoryHandle* k,
                                                              const PeerMemoryHandle* v);
  SharedKvPools(int fd, std::byte* map_base, size_t map_bytes, std::byte* pools, size_t pool_bytes,
                const KvCacheShape& s, DType d, bool writable)
      : fd_(fd),
        map_base_(map_base),
        map_bytes_(map_bytes),
        base_(pools),
        pool_bytes_(pool_bytes),
        shape_(s),
        dtype_(d),
        writable_(writable) {}
  int fd_ = -1;
  std::byte* map_base_ = nullptr;  // the whole mapping (a named export's header first)
  size_t map_bytes_ = 0;
  std::byte* base_ = nullptr;  // K pool, then V pool
  size_t pool_bytes_ = 0;
  KvCacheShape shape_;
  DType dtype_ = DType::kF32;
  bool writable_ = false;
  int32_t pid_ = 0;
  std::string unlink_name_;  // a named export's exporter: removed on destruction
  // [TAG_KV_PULL_CUDA] A device export: the handles; the importer's mapping of them (base_ is
  // the K pool, v_base_ the V pool) and the backend that mapped them.
  bool device_ = false;
  PeerMemoryHandle k_handle_, v_handle_;
  std::byte* v_base_ = nullptr;
  Backend* mapped_by_ = nullptr;
};

}  // namespace garden::rose
