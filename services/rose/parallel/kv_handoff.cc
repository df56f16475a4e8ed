#include "services/rose/parallel/kv_handoff.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace garden::rose {
namespace {

int64_t blockBytesOf(const KvCacheShape& s, DType dtype) {
  return static_cast<int64_t>(s.block_size) * s.num_kv_heads * s.head_dim *
         static_cast<int64_t>(dtypeSize(dtype));
}

// One pool's pairs: ids inside [0, src_blocks) and [0, dst_blocks), no destination twice.
Status checkPairs(std::span<const int32_t> pairs, int32_t src_blocks, int32_t dst_blocks,
                  const char* what) {
  if (pairs.size() % 2 != 0) {
    return invalidArgument(std::string("kv handoff: ") + what + "s must be (src, dst) pairs");
  }
  std::vector<bool> used(static_cast<size_t>(dst_blocks), false);
  for (size_t i = 0; i < pairs.size() / 2; ++i) {
    const int32_t s = pairs[2 * i], d = pairs[2 * i + 1];
    const std::string at = std::string("kv handoff: ") + what + " " + std::to_string(i) + ": ";
    if (s < 0 || s >= src_blocks) {
      return invalidArgument(at + "source block " + std::to_string(s) + " outside [0, " +
                             std::to_string(src_blocks) + ")");
    }
    if (d < 0 || d >= dst_blocks) {
      return invalidArgument(at + "destination block " + std::to_string(d) + " outside [0, " +
                             std::to_string(dst_blocks) + ")");
    }
    if (used[static_cast<size_t>(d)]) {
      return invalidArgument(at + "destination block " + std::to_string(d) + " written twice");
    }
    used[static_cast<size_t>(d)] = true;
  }
  return okStatus();
}

// The header of a named export [TAG_KV_PULL]; the pools start at kDataOffset.
constexpr uint64_t kExportMagic = 0x31584B4E44524747ULL;  // "GGRDNKX1" little-endian
// Version 2: the location and the device pools' handles [TAG_KV_PULL_CUDA].
constexpr uint32_t kExportVersion = 2;
constexpr size_t kDataOffset = 4096;
constexpr uint32_t kLocationHost = 0, kLocationDevice = 1;
struct ExportHeader {
  uint64_t magic = 0;  // written last (release): a reader that sees it sees the rest
  uint32_t version = 0;
  int32_t pid = 0;
  int32_t num_layers = 0, num_blocks = 0, block_size = 0, num_kv_heads = 0, head_dim = 0;
  int32_t num_blocks_window = 0;
  uint64_t window_layers = 0;
  uint32_t dtype = 0;
  uint32_t reserved = 0;
  uint64_t pool_bytes = 0;
  // kLocationHost: the pools follow the header in the segment; kLocationDevice: they are device
  // allocations of the exporter, mapped through the handles (the segment is the header only).
  uint32_t location = kLocationHost;
  uint32_t reserved2 = 0;
  PeerMemoryHandle k_handle, v_handle;
};
static_assert(sizeof(ExportHeader) <= kDataOffset);

bool validExportName(const std::string& n) {
  if (n.empty() || n.size() > 63 || n[0] == '.') return false;
  for (char c : n) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

Status checkExportName(const std::string& name) {
  if (validExportName(name)) return okStatus();
  return invalidArgument("kv export name '" + name +
                         "': 1-63 characters of [A-Za-z0-9._-], not starting with '.'");
}

// Sizes `fd` to `bytes` (grow) and maps it, writable or read-only. On failure closes `fd` and
// returns the errno status naming `what`.
Result<std::byte*> mapOrClose(int fd, size_t bytes, bool grow, bool writable,
                              const std::string& what) {
  const char* step = "ftruncate";
  void* mem = MAP_FAILED;
  if (!grow || ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    step = "mmap";
    mem = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  }
  if (mem != MAP_FAILED) return static_cast<std::byte*>(mem);
  const int err = errno;
  close(fd);
  return errnoStatus(std::string(step) + " (" + what + ")", err);
}

bool pidAlive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

// Reads a named export's header through `fd` (FAILED_PRECONDITION when it is not complete).
Result<ExportHeader> readHeader(int fd, const std::string& name) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return errnoStatus("fstat (kv export " + name + ")", errno);
  if (static_cast<size_t>(st.st_size) < kDataOffset) {
    return failedPrecondition("kv export " + name + " is not complete (" +
                              std::to_string(st.st_size) + " bytes)");
  }
  void* m = mmap(nullptr, kDataOffset, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return errnoStatus("mmap (kv export " + name + " header)", errno);
  const auto* h = static_cast<const ExportHeader*>(m);
  ExportHeader out;
  const uint64_t magic = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE);
  if (magic == kExportMagic) std::memcpy(&out, h, sizeof(out));
  munmap(m, kDataOffset);
  if (magic != kExportMagic) {
    return failedPrecondition("kv export " + name + " is not complete or not a garden KV export");
  }
  if (out.version != kExportVersion) {
    return invalidArgument("kv export " + name + ": version " + std::to_string(out.version) +
                           ", expected " + std::to_string(kExportVersion));
  }
  return out;
}

}  // namespace

int64_t KvPoolView::blockBytes() const { return blockBytesOf(shape, dtype); }

KvPoolView kvPoolView(const PagedKvCache& cache) {
  KvPoolView v;
  v.k = static_cast<const std::byte*>(cache.keys(0).data);
  v.v = static_cast<const std::byte*>(cache.values(0).data);
  v.shape = cache.shape();
  v.dtype = cache.dtype();
  v.device = cache.onDevice();
  return v;
}

Status checkKvBlockPairs(const KvPoolView& src, const PagedKvCache& dst,
                         std::span<const int32_t> pairs, std::span<const int32_t> window_pairs) {
  const KvCacheShape& ss = src.shape;
  const KvCacheShape& ds = dst.shape();
  if (ss.num_layers != ds.num_layers) {
    return invalidArgument("kv handoff: layers " + std::to_string(ss.num_layers) +
                           " (source) != " + std::to_string(ds.num_layers) + " (destination)");
  }
  const int64_t dst_bytes = blockBytesOf(ds, dst.dtype());
  if (src.blockBytes() != dst_bytes) {
    return invalidArgument("kv handoff: block_bytes " + std::to_string(src.blockBytes()) +
                           " (source) != " + std::to_string(dst_bytes) +
                           " (destination): block size, kv heads, head dim and dtype must match");
  }
  if (src.dtype != dst.dtype()) {
    return invalidArgument("kv handoff: dtype " + std::string(dtypeName(src.dtype)) +
                           " (source) != " + std::string(dtypeName(dst.dtype())) +
                           " (destination): both roses need the same --attn-dtype");
  }
  const bool sw = ss.num_blocks_window > 0, dw = ds.num_blocks_window > 0;
  if (sw != dw || (sw && ss.window_layers != ds.window_layers)) {
    return invalidArgument(std::string("kv handoff: window pool: ") +
                           (sw ? "the source has one" : "the source has none") + ", " +
                           (dw ? "the destination has one" : "the destination has none") +
                           (sw && dw ? " over other layers" : "") +
                           ": both roses need the same --kv-window-blocks setting");
  }
  RETURN_IF_ERROR(checkPairs(pairs, ss.num_blocks, ds.num_blocks, "pair"));
  if (!window_pairs.empty() && !sw) {
    return invalidArgument("kv handoff: window pairs without a window pool");
  }
  if (sw) {
    RETURN_IF_ERROR(checkPairs(window_pairs, ss.num_blocks_window, ds.num_blocks_window,
                               "window pair"));
  }
  return okStatus();
}

Status checkKvPoolLocation(bool src_device, const Backend& dst_backend) {
  const bool dst_device = dst_backend.name() != "cpu";
  if (src_device == dst_device) return okStatus();
  return failedPrecondition(std::string("kv handoff: the source cache is in ") +
                            (src_device ? "device" : "host") + " memory, this worker's " +
                            (dst_device ? "on the " + std::string(dst_backend.name()) + " device"
                                        : "in host memory") +
                            ": both workers need the same --device");
}

Status copyKvBlocks(Backend& dst_backend, const KvPoolView& src, PagedKvCache& dst,
                    std::span<const int32_t> pairs, std::span<const int32_t> window_pairs) {
  RETURN_IF_ERROR(checkKvPoolLocation(src.device, dst_backend));
  if (src.k == nullptr || src.v == nullptr) {
    return failedPrecondition("kv handoff: the source pools are not mapped");
  }
  RETURN_IF_ERROR(checkKvBlockPairs(src, dst, pairs, window_pairs));
  const KvPoolView d = kvPoolView(dst);
  KvBlockCopy c;
  c.src_k = src.k;
  c.src_v = src.v;
  c.dst_k = const_cast<std::byte*>(d.k);
  c.dst_v = const_cast<std::byte*>(d.v);
  c.layers = src.shape.num_layers;
  c.window_layers = src.shape.num_blocks_window > 0 ? src.shape.window_layers : 0;
  c.src_blocks = src.shape.num_blocks;
  c.src_blocks_window = src.shape.num_blocks_window;
  c.dst_blocks = d.shape.num_blocks;
  c.dst_blocks_window = d.shape.num_blocks_window;
  c.block_bytes = src.blockBytes();
  c.pairs = pairs;
  c.window_pairs = window_pairs;
  return dst_backend.copyKvBlocks(c);
}

Result<std::unique_ptr<SharedKvPools>> SharedKvPools::create(const KvCacheShape& shape,
                                                             DType dtype) {
  RETURN_IF_ERROR(checkKvCacheShape(shape));
  const size_t pool = PagedKvCache::poolBytes(shape, dtype);
  const int fd = memfd_create("garden-kv-pools", MFD_CLOEXEC);
  if (fd < 0) return errnoStatus("memfd_create (kv pools)", errno);
  ASSIGN_OR_RETURN(std::byte* base, mapOrClose(fd, 2 * pool, true, true, "kv pools"));
  return std::unique_ptr<SharedKvPools>(
      new SharedKvPools(fd, base, 2 * pool, base, pool, shape, dtype, true));
}

Result<std::unique_ptr<SharedKvPools>> SharedKvPools::map(int fd, const KvCacheShape& shape,
                                                          DType dtype) {
  RETURN_IF_ERROR(checkKvCacheShape(shape));
  const size_t pool = PagedKvCache::poolBytes(shape, dtype);
  struct stat st {};
  if (fstat(fd, &st) != 0) return errnoStatus("fstat (kv pools)", errno);
  if (static_cast<size_t>(st.st_size) != 2 * pool) {
    return invalidArgument("kv pools: the exported pools are " + std::to_string(st.st_size) +
                           " bytes, this shape needs " + std::to_string(2 * pool));
  }
  const int own = dup(fd);
  if (own < 0) return errnoStatus("dup (kv pools)", errno);
  ASSIGN_OR_RETURN(std::byte* base, mapOrClose(own, 2 * pool, false, false, "kv pools"));
  return std::unique_ptr<SharedKvPools>(
      new SharedKvPools(own, base, 2 * pool, base, pool, shape, dtype, false));
}

namespace {

// A new /dev/shm/<name> (0600, close-on-exec) for an export, replacing a crashed exporter's.
Result<int> createExportSegment(const std::string& name, const std::string& path) {
  int fd = shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    // A crashed exporter's segment is replaced; anything else under the name is left alone.
    const int old = shm_open(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (old < 0) return errnoStatus("shm_open (kv export " + name + ")", errno);
    struct stat st {};
    const bool mine = fstat(old, &st) == 0 && st.st_uid == geteuid();
    auto h = readHeader(old, name);
    close(old);
    if (!mine) return failedPrecondition("kv export " + name + " exists and is another user's");
    if (!h.isOk()) {
      return failedPrecondition("kv export " + name + " exists and is not a garden KV export (" +
                                h.status().message() + "); remove /dev/shm/" + name);
    }
    if (pidAlive(h->pid)) {
      return failedPrecondition("kv export " + name + " is in use by pid " +
                                std::to_string(h->pid));
    }
    shm_unlink(path.c_str());
    fd = shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  }
  if (fd < 0) return errnoStatus("shm_open (kv export " + name + ")", errno);
  return fd;
}

}  // namespace

Result<std::unique_ptr<SharedKvPools>> SharedKvPools::createNamed(const std::string& name,
                                                                  const KvCacheShape& shape,
                                                                  DType dtype) {
  return createNamedAt(name, shape, dtype, nullptr, nullptr);
}

Result<std::unique_ptr<SharedKvPools>> SharedKvPools::createNamedDevice(
    const std::string& name, const KvCacheShape& shape, DType dtype, const PeerMemoryHandle& k,
    const PeerMemoryHandle& v) {
  return createNamedAt(name, shape, dtype, &k, &v);
}

Result<std::unique_ptr<SharedKvPools>> SharedKvPools::createNamedAt(const std::string& name,
                                                                    const KvCacheShape& shape,
                                                                    DType dtype,
                                                                    const PeerMemoryHandle* k,
                                                                    const PeerMemoryHandle* v) {
  RETURN_IF_ERROR(checkExportName(name));
  RETURN_IF_ERROR(checkKvCacheShape(shape));
  const bool device = k != nullptr;
  const std::string path = "/" + name;
  ASSIGN_OR_RETURN(const int fd, createExportSegment(name, path));
  const size_t pool = PagedKvCache::poolBytes(shape, dtype);
  // A device export's segment is the header only; a host export's holds the pools after it.
  const size_t total = device ? kDataOffset : kDataOffset + 2 * pool;
  Result<std::byte*> mapped = mapOrClose(fd, total, true, true, "kv export " + name);
  if (!mapped.isOk()) {
    shm_unlink(path.c_str());
    return mapped.status();
  }
  std::byte* base = *mapped;
  auto* h = reinterpret_cast<ExportHeader*>(base);
  h->version = kExportVersion;
  h->pid = static_cast<int32_t>(getpid());
  h->num_layers = shape.num_layers;
  h->num_blocks = shape.num_blocks;
  h->block_size = shape.block_size;
  h->num_kv_heads = shape.num_kv_heads;
  h->head_dim = shape.head_dim;
  h->num_blocks_window = shape.num_blocks_window;
  h->window_layers = shape.window_layers;
  h->dtype = static_cast<uint32_t>(dtype);
  h->pool_bytes = pool;
  h->location = device ? kLocationDevice : kLocationHost;
  if (device) {
    h->k_handle = *k;
    h->v_handle = *v;
  }
  __atomic_store_n(&h->magic, kExportMagic, __ATOMIC_RELEASE);
  std::unique_ptr<SharedKvPools> p(new SharedKvPools(
      fd, base, total, device ? nullptr : base + kDataOffset, pool, shape, dtype, true));
  p->pid_ = h->pid;
  p->unlink_name_ = path;
  if (device) {
    p->device_ = true;
    p->k_handle_ = *k;
    p->v_handle_ = *v;
  }
  return p;
}

Result<std::unique_ptr<SharedKvPools>> SharedKvPools::openNamed(const std::string& name,
                                                                int32_t expected_pid) {
  RETURN_IF_ERROR(checkExportName(name));
  const std::string path = "/" + name;
  const int fd = shm_open(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return failedPrecondition("no kv export named " + name);
    return errnoStatus("shm_open (kv export " + name + ")", errno);
  }
  auto h = readHeader(fd, name);
  if (!h.isOk()) {
    close(fd);
    return h.status();
  }
  if (h->pid != expected_pid) {
    close(fd);
    return failedPrecondition("kv export " + name + " belongs to pid " + std::to_string(h->pid) +
                              ", not " + std::to_string(expected_pid) +
                              ": its worker was restarted and the blocks named are gone");
  }
  KvCacheShape s;
  s.num_layers = h->num_layers;
  s.num_blocks = h->num_blocks;
  s.block_size = h->block_size;
  s.num_kv_heads = h->num_kv_heads;
  s.head_dim = h->head_dim;
  s.num_blocks_window = h->num_blocks_window;
  s.window_layers = h->window_layers;
  const auto dtype = static_cast<DType>(h->dtype);
  Status shape_ok = checkKvCacheShape(s);
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    shape_ok = invalidArgument("dtype " + std::to_string(h->dtype));
  }
  if (h->location != kLocationHost && h->location != kLocationDevice) {
    shape_ok = invalidArgument("location " + std::to_string(h->location));
  }
  const bool device = h->location == kLocationDevice;
  const size_t pool = shape_ok.isOk() ? PagedKvCache::poolBytes(s, dtype) : 0;
  // A device export's segment is the header only; a host export's holds the pools.
  const size_t total = device ? kDataOffset : kDataOffset + 2 * pool;
  struct stat st {};
  if (!shape_ok.isOk() || pool != h->pool_bytes || fstat(fd, &st) != 0 ||
      static_cast<size_t>(st.st_size) != total) {
    close(fd);
    return invalidArgument("kv export " + name + ": header and size disagree (" +
                           std::to_string(st.st_size) + " bytes)");
  }
  if (device) {
    close(fd);  // everything needed is in the header read above
    std::unique_ptr<SharedKvPools> p(
        new SharedKvPools(-1, nullptr, 0, nullptr, pool, s, dtype, false));
    p->pid_ = h->pid;
    p->device_ = true;
    p->k_handle_ = h->k_handle;
    p->v_handle_ = h->v_handle;
    return p;
  }
  ASSIGN_OR_RETURN(std::byte* base, mapOrClose(fd, total, false, false, "kv export " + name));
  std::unique_ptr<SharedKvPools> p(
      new SharedKvPools(fd, base, total, base + kDataOffset, pool, s, dtype, false));
  p->pid_ = h->pid;
  return p;
}

Status SharedKvPools::mapDevice(Backend& backend) {
  if (!device_) return failedPrecondition("kv pools: a host export needs no device mapping");
  if (writable_) return failedPrecondition("kv pools: the exporter uses its own cache");
  if (mapped_by_ != nullptr) return okStatus();
  ASSIGN_OR_RETURN(void* k, backend.openPeerMemory(k_handle_));
  Result<void*> v = backend.openPeerMemory(v_handle_);
  if (!v.isOk()) {
    backend.closePeerMemory(k);
    return v.status();
  }
  base_ = static_cast<std::byte*>(k);
  v_base_ = static_cast<std::byte*>(*v);
  mapped_by_ = &backend;
  return okStatus();
}

SharedKvPools::~SharedKvPools() {
  if (mapped_by_ != nullptr) {
    mapped_by_->closePeerMemory(base_);
    mapped_by_->closePeerMemory(v_base_);
  }
  if (map_base_ != nullptr) munmap(map_base_, map_bytes_);
  if (fd_ >= 0) close(fd_);
  if (!unlink_name_.empty()) shm_unlink(unlink_name_.c_str());
}

Result<std::unique_ptr<PagedKvCache>> SharedKvPools::cache() const {
  if (!writable_) return failedPrecondition("kv pools: a mapped (imported) pair is read-only");
  if (device_) return failedPrecondition("kv pools: a device export's cache is the exporter's own");
  return PagedKvCache::wrap(shape_, dtype_, base_, base_ + pool_bytes_);
}

KvPoolView SharedKvPools::view() const {
  KvPoolView v;
  v.k = base_;
  v.v = device_ ? v_base_ : (base_ == nullptr ? nullptr : base_ + pool_bytes_);
  v.shape = shape_;
  v.dtype = dtype_;
  v.device = device_;
  return v;
}

}  // namespace garden::rose
