#include "services/rose/parallel/kv_handoff.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace garden::rose {
namespace {

int64_t blockBytes(const KvCacheShape& s, DType dtype) {
  return static_cast<int64_t>(s.block_size) * s.num_kv_heads * s.head_dim *
         static_cast<int64_t>(dtypeSize(dtype));
}

}  // namespace

KvPoolView kvPoolView(const PagedKvCache& cache) {
  const KvCacheShape& s = cache.shape();
  CHECK(s.num_blocks_window == 0);  // [TAG_KV_WINDOW_GROUP] one pool layout only
  KvPoolView v;
  v.k = static_cast<const std::byte*>(cache.keys(0).data);
  v.v = static_cast<const std::byte*>(cache.values(0).data);
  v.layers = s.num_layers;
  v.num_blocks = s.num_blocks;
  v.block_bytes = blockBytes(s, cache.dtype());
  v.dtype = cache.dtype();
  return v;
}

Status checkKvBlockPairs(const KvPoolView& src, const PagedKvCache& dst,
                         std::span<const int32_t> pairs) {
  const KvCacheShape& ds = dst.shape();
  if (ds.num_blocks_window != 0) {  // [TAG_KV_WINDOW_GROUP] not handed off yet
    return invalidArgument("kv handoff: the destination cache has a window pool");
  }
  if (src.layers != ds.num_layers) {
    return invalidArgument("kv handoff: layers " + std::to_string(src.layers) +
                           " (source) != " + std::to_string(ds.num_layers) + " (destination)");
  }
  if (src.block_bytes != blockBytes(ds, dst.dtype())) {
    return invalidArgument("kv handoff: block_bytes " + std::to_string(src.block_bytes) +
                           " (source) != " + std::to_string(blockBytes(ds, dst.dtype())) +
                           " (destination): block size, kv heads, head dim and dtype must match");
  }
  if (src.dtype != dst.dtype()) {
    return invalidArgument("kv handoff: dtype " + std::string(dtypeName(src.dtype)) +
                           " (source) != " + std::string(dtypeName(dst.dtype())) +
                           " (destination): both roses need the same --attn-dtype");
  }
  if (pairs.size() % 2 != 0) return invalidArgument("kv handoff: pairs must be (src, dst) pairs");
  std::vector<bool> used(static_cast<size_t>(ds.num_blocks), false);
  for (size_t i = 0; i < pairs.size() / 2; ++i) {
    const int32_t s = pairs[2 * i], d = pairs[2 * i + 1];
    if (s < 0 || s >= src.num_blocks) {
      return invalidArgument("kv handoff: pair " + std::to_string(i) + ": source block " +
                             std::to_string(s) + " outside [0, " + std::to_string(src.num_blocks) +
                             ")");
    }
    if (d < 0 || d >= ds.num_blocks) {
      return invalidArgument("kv handoff: pair " + std::to_string(i) + ": destination block " +
                             std::to_string(d) + " outside [0, " + std::to_string(ds.num_blocks) +
                             ")");
    }
    if (used[static_cast<size_t>(d)]) {
      return invalidArgument("kv handoff: pair " + std::to_string(i) + ": destination block " +
                             std::to_string(d) + " written twice");
    }
    used[static_cast<size_t>(d)] = true;
  }
  return okStatus();
}

Status copyKvBlocks(Backend& dst_backend, const KvPoolView& src, PagedKvCache& dst,
                    std::span<const int32_t> pairs) {
  if (dst_backend.name() != "cpu") {
    return unimplemented("kv handoff: host copy on the " + std::string(dst_backend.name()) +
                         " backend (CUDA: parallel/cuda copyKvBlocks)");
  }
  RETURN_IF_ERROR(checkKvBlockPairs(src, dst, pairs));
  const KvPoolView d = kvPoolView(dst);
  auto* dk = const_cast<std::byte*>(d.k);
  auto* dv = const_cast<std::byte*>(d.v);
  std::vector<int32_t> p(pairs.begin(), pairs.end());  // the caller's span may not live that long
  const size_t bb = static_cast<size_t>(src.block_bytes);
  dst_backend.launch([src, d, dk, dv, p = std::move(p), bb] {
    for (int32_t l = 0; l < src.layers; ++l) {
      const size_t src_layer = static_cast<size_t>(l) * static_cast<size_t>(src.num_blocks) * bb;
      const size_t dst_layer = static_cast<size_t>(l) * static_cast<size_t>(d.num_blocks) * bb;
      for (size_t i = 0; i + 1 < p.size(); i += 2) {
        const size_t so = src_layer + static_cast<size_t>(p[i]) * bb;
        const size_t dof = dst_layer + static_cast<size_t>(p[i + 1]) * bb;
        std::memcpy(dk + dof, src.k + so, bb);
        std::memcpy(dv + dof, src.v + so, bb);
      }
    }
  });
  return okStatus();
}

Result<std::unique_ptr<SharedKvPools>> SharedKvPools::create(const KvCacheShape& shape,
                                                             DType dtype) {
  if (shape.num_layers <= 0 || shape.num_blocks <= 0 || shape.block_size <= 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return invalidArgument("kv pools: every dimension must be positive");
  }
  if (shape.num_blocks_window != 0) {  // [TAG_KV_WINDOW_GROUP] not handed off yet
    return invalidArgument("kv pools: the KV handoff does not carry a window pool");
  }
  const size_t pool = PagedKvCache::poolBytes(shape, dtype);
  const int fd = memfd_create("garden-kv-pools", MFD_CLOEXEC);
  if (fd < 0) return errnoStatus("memfd_create (kv pools)", errno);
  if (ftruncate(fd, static_cast<off_t>(2 * pool)) != 0) {
    const int err = errno;
    close(fd);
    return errnoStatus("ftruncate (kv pools)", err);
  }
  void* mem = mmap(nullptr, 2 * pool, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return errnoStatus("mmap (kv pools)", err);
  }
  return std::unique_ptr<SharedKvPools>(
      new SharedKvPools(fd, static_cast<std::byte*>(mem), pool, shape, dtype, true));
}

Result<std::unique_ptr<SharedKvPools>> SharedKvPools::map(int fd, const KvCacheShape& shape,
                                                          DType dtype) {
  const size_t pool = PagedKvCache::poolBytes(shape, dtype);
  struct stat st {};
  if (fstat(fd, &st) != 0) return errnoStatus("fstat (kv pools)", errno);
  if (static_cast<size_t>(st.st_size) != 2 * pool) {
    return invalidArgument("kv pools: the exported pools are " + std::to_string(st.st_size) +
                           " bytes, this shape needs " + std::to_string(2 * pool));
  }
  const int own = dup(fd);
  if (own < 0) return errnoStatus("dup (kv pools)", errno);
  void* mem = mmap(nullptr, 2 * pool, PROT_READ, MAP_SHARED, own, 0);
  if (mem == MAP_FAILED) {
    const int err = errno;
    close(own);
    return errnoStatus("mmap (kv pools)", err);
  }
  return std::unique_ptr<SharedKvPools>(
      new SharedKvPools(own, static_cast<std::byte*>(mem), pool, shape, dtype, false));
}

SharedKvPools::~SharedKvPools() {
  munmap(base_, 2 * pool_bytes_);
  close(fd_);
}

Result<std::unique_ptr<PagedKvCache>> SharedKvPools::cache() const {
  if (!writable_) return failedPrecondition("kv pools: a mapped (imported) pair is read-only");
  return PagedKvCache::wrap(shape_, dtype_, base_, base_ + pool_bytes_);
}

KvPoolView SharedKvPools::view() const {
  KvPoolView v;
  v.k = base_;
  v.v = base_ + pool_bytes_;
  v.layers = shape_.num_layers;
  v.num_blocks = shape_.num_blocks;
  v.block_bytes = blockBytes(shape_, dtype_);
  v.dtype = dtype_;
  return v;
}

}  // namespace garden::rose
