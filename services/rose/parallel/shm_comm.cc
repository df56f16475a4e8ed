// ShmCommArea: collectives between processes over shared host memory (see shm_comm.h).
//
// Layout (offsets from the area's base, every piece 64-byte aligned):
//   AreaHeader
//   GroupCtl[groups]
//   per group g: Post[size_g], then size_g slots of `capacity` bytes
// A Post is written only by its rank, between barriers; peers read it after the next barrier.

#include "services/rose/parallel/shm_comm.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>

#include "common/logging.h"

namespace garden::rose {
namespace {

constexpr uint64_t kMagic = 0x4741524452414E4Bull;  // "GARDRANK"
constexpr uint32_t kVersion = 1;

uint64_t align64(uint64_t v) { return (v + 63) / 64 * 64; }

struct alignas(64) AreaHeader {
  uint64_t magic;
  uint32_t version;
  int32_t groups;
  uint64_t capacity;
  uint32_t timeout_ms;
  std::atomic<uint32_t> aborted;
  uint64_t bytes;
};

struct alignas(64) GroupCtl {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;  // futex word: +1 per completed barrier
  int32_t size;
  uint64_t posts_offset;  // Post[size]
  uint64_t slots_offset;  // size slots of capacity bytes
};

struct alignas(64) Post {
  uint64_t bytes;                       // payload bytes of this collective
  int64_t counts[kShmCommMaxRanks];     // per-peer counts (allToAllRows, exchangeCounts)
};

static_assert(std::atomic<uint32_t>::is_always_lock_free);

long futexWait(std::atomic<uint32_t>* addr, uint32_t expected, const timespec* timeout) {
  // Shared (not FUTEX_PRIVATE): the word lives in memory mapped by several processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, timeout,
                 nullptr, 0);
}
void futexWake(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

AreaHeader* header(std::byte* base) { return reinterpret_cast<AreaHeader*>(base); }
GroupCtl* groupCtl(std::byte* base, int32_t g) {
  return reinterpret_cast<GroupCtl*>(base + align64(sizeof(AreaHeader))) + g;
}

class ShmComm final : public Communicator {
 public:
  ShmComm(std::byte* base, int32_t group, int32_t rank, Backend* backend)
      : base_(base),
        hdr_(header(base)),
        ctl_(groupCtl(base, group)),
        group_(group),
        rank_(rank),
        n_(ctl_->size),
        backend_(backend) {}

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return n_; }

  void allReduceSum(const Tensor& inout) override {
    sync();
    CHECK_MSG(inout.dtype == DType::kF32, "shm all-reduce wants F32");
    const uint64_t bytes = inout.bytes();
    auto* out = static_cast<std::byte*>(inout.data);
    // Every rank posts the same number of bytes, so each round covers the same elements on every
    // rank; the round's sum is formed in rank order 0..n-1 [TAG_REPLICATED_BITWISE] and written
    // over this rank's input only after that part of it was posted.
    exchange(inout.data, bytes, nullptr, [&](uint64_t at, uint64_t len) {
      const size_t n = static_cast<size_t>(len / sizeof(float));
      acc_.assign(n, 0.f);
      for (int32_t q = 0; q < n_; ++q) {
        const auto* src = reinterpret_cast<const float*>(slot(q));
        for (size_t i = 0; i < n; ++i) acc_[i] += src[i];
      }
      if (n > 0) std::memcpy(out + at, acc_.data(), len);
    });
  }

  void allGatherRows(const Tensor& in, std::span<const int64_t> rows_per_rank,
                     const Tensor& out) override {
    sync();
    CHECK(static_cast<int32_t>(rows_per_rank.size()) == n_);
    CHECK(in.rows() == rows_per_rank[static_cast<size_t>(rank_)] || in.numel() == 0);
    const uint64_t row_bytes = collectiveRowBytes(out);
    std::vector<uint64_t> base(static_cast<size_t>(n_) + 1, 0);
    for (int32_t q = 0; q < n_; ++q) {
      base[static_cast<size_t>(q) + 1] =
          base[static_cast<size_t>(q)] + row_bytes * static_cast<uint64_t>(rows_per_rank[static_cast<size_t>(q)]);
    }
    CHECK(static_cast<uint64_t>(out.rows()) * row_bytes == base.back());
    auto* dst = static_cast<std::byte*>(out.data);
    const uint64_t mine = base[static_cast<size_t>(rank_) + 1] - base[static_cast<size_t>(rank_)];
    exchange(in.data, mine, nullptr, [&](uint64_t at, uint64_t) {
      for (int32_t q = 0; q < n_; ++q) {
        const uint64_t total = base[static_cast<size_t>(q) + 1] - base[static_cast<size_t>(q)];
        if (at >= total) continue;
        const uint64_t len = std::min<uint64_t>(hdr_->capacity, total - at);
        std::memcpy(dst + base[static_cast<size_t>(q)] + at, slot(q), len);
      }
    });
  }

  void allToAllRows(const Tensor& send, std::span<const int64_t> send_rows, const Tensor& recv,
                    std::span<const int64_t> recv_rows) override {
    sync();
    CHECK(static_cast<int32_t>(send_rows.size()) == n_ &&
          static_cast<int32_t>(recv_rows.size()) == n_);
    const uint64_t row_bytes = recv.ndim > 0 ? collectiveRowBytes(recv) : collectiveRowBytes(send);
    uint64_t mine = 0;
    for (int64_t r : send_rows) mine += static_cast<uint64_t>(r) * row_bytes;
    // Where rank q's rows for me lie in q's payload, and where they land in recv.
    std::vector<uint64_t> from(static_cast<size_t>(n_)), len(from.size()), to(from.size());
    bool first = true;
    auto* dst = static_cast<std::byte*>(recv.data);
    exchange(send.data, mine, send_rows.data(), [&](uint64_t at, uint64_t) {
      if (first) {
        first = false;
        uint64_t landed = 0;
        for (int32_t q = 0; q < n_; ++q) {
          const Post& p = post(q);
          uint64_t off = 0;
          for (int32_t r = 0; r < rank_; ++r) off += static_cast<uint64_t>(p.counts[r]) * row_bytes;
          CHECK_MSG(p.counts[rank_] == recv_rows[static_cast<size_t>(q)],
                    "allToAllRows: counts disagree");
          from[static_cast<size_t>(q)] = off;
          len[static_cast<size_t>(q)] = static_cast<uint64_t>(p.counts[rank_]) * row_bytes;
          to[static_cast<size_t>(q)] = landed;
          landed += len[static_cast<size_t>(q)];
        }
      }
      const uint64_t end = at + hdr_->capacity;
      for (int32_t q = 0; q < n_; ++q) {
        const size_t i = static_cast<size_t>(q);
        const uint64_t lo = std::max(at, from[i]), hi = std::min(end, from[i] + len[i]);
        if (lo >= hi) continue;
        std::memcpy(dst + to[i] + (lo - from[i]), slot(q) + (lo - at), hi - lo);
      }
    });
  }

  void broadcast(const Tensor& inout, int32_t root) override {
    sync();
    CHECK(root >= 0 && root < n_);
    const uint64_t bytes = inout.bytes();
    auto* dst = static_cast<std::byte*>(inout.data);
    exchange(inout.data, rank_ == root ? bytes : 0, nullptr, [&](uint64_t at, uint64_t) {
      if (rank_ == root || at >= bytes) return;
      std::memcpy(dst + at, slot(root), std::min<uint64_t>(hdr_->capacity, bytes - at));
    });
  }

  void exchangeCounts(std::span<const int64_t> send, std::span<int64_t> recv) override {
    sync();
    CHECK(static_cast<int32_t>(send.size()) == n_ && static_cast<int32_t>(recv.size()) == n_);
    exchange(nullptr, 0, send.data(), [&](uint64_t, uint64_t) {
      for (int32_t q = 0; q < n_; ++q) recv[static_cast<size_t>(q)] = post(q).counts[rank_];
    });
  }

 private:
  Post& post(int32_t q) const {
    return reinterpret_cast<Post*>(base_ + ctl_->posts_offset)[q];
  }
  std::byte* slot(int32_t q) const {
    return base_ + ctl_->slots_offset + static_cast<uint64_t>(q) * hdr_->capacity;
  }

  // Posts `bytes` of `payload` (and counts) in rounds of the capacity; after each round's first
  // barrier calls read(offset, my chunk length) while every rank's chunk at that offset is in its
  // slot. At least one round, so counts alone travel too.
  void exchange(const void* payload, uint64_t bytes, const int64_t* counts,
                const std::function<void(uint64_t, uint64_t)>& read) {
    const uint64_t cap = hdr_->capacity;
    Post& me = post(rank_);
    me.bytes = bytes;
    if (counts != nullptr) std::memcpy(me.counts, counts, sizeof(int64_t) * static_cast<size_t>(n_));
    uint64_t rounds = 1;
    for (uint64_t at = 0, r = 0; r < rounds; ++r, at += cap) {
      const uint64_t len = at < bytes ? std::min(cap, bytes - at) : 0;
      if (len > 0) std::memcpy(slot(rank_), static_cast<const std::byte*>(payload) + at, len);
      barrier();
      if (r == 0) {
        uint64_t most = 0;
        for (int32_t q = 0; q < n_; ++q) most = std::max(most, post(q).bytes);
        rounds = std::max<uint64_t>(1, (most + cap - 1) / cap);
      }
      read(at, len);
      barrier();
    }
  }

  void barrier() {
    const uint32_t gen = ctl_->generation.load(std::memory_order_acquire);
    if (ctl_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(n_)) {
      ctl_->arrived.store(0, std::memory_order_relaxed);
      ctl_->generation.fetch_add(1, std::memory_order_acq_rel);
      futexWake(&ctl_->generation);
      return;
    }
    for (int i = 0; i < 256; ++i) {
      if (ctl_->generation.load(std::memory_order_acquire) != gen) return;
    }
    const auto start = std::chrono::steady_clock::now();
    const timespec slice{0, 50 * 1000 * 1000};
    while (ctl_->generation.load(std::memory_order_acquire) == gen) {
      if (hdr_->aborted.load(std::memory_order_acquire) != 0) fail("another rank aborted the world");
      if (hdr_->timeout_ms != 0 &&
          std::chrono::steady_clock::now() - start > std::chrono::milliseconds(hdr_->timeout_ms)) {
        fail("a peer did not reach the barrier within " + std::to_string(hdr_->timeout_ms) + " ms");
      }
      futexWait(&ctl_->generation, gen, &slice);
    }
  }

  [[noreturn]] void fail(const std::string& why) {
    hdr_->aborted.store(1, std::memory_order_release);
    log::error("collective failed", {{"group", group_}, {"rank", rank_}, {"reason", why}});
    std::fflush(nullptr);
    _exit(kCollectiveExitCode);
  }

  // [TAG_ROSE_LAZY]: on the backend's compute thread this returns at once; from another thread
  // it waits for launched work, so the buffers hold their values.
  void sync() {
    if (backend_ != nullptr) (void)backend_->synchronize();
  }

  std::byte* base_;
  AreaHeader* hdr_;
  GroupCtl* ctl_;
  const int32_t group_, rank_, n_;
  Backend* backend_;
  std::vector<float> acc_;
};

}  // namespace

uint64_t ShmCommArea::bytes(std::span<const int32_t> group_sizes, uint64_t capacity) {
  uint64_t total = align64(sizeof(AreaHeader)) + align64(sizeof(GroupCtl) * group_sizes.size());
  const uint64_t cap = align64(capacity);
  for (int32_t n : group_sizes) {
    total += align64(sizeof(Post) * static_cast<uint64_t>(std::max(n, 0)));
    total += cap * static_cast<uint64_t>(std::max(n, 0));
  }
  return total;
}

Result<ShmCommArea> ShmCommArea::format(void* mem, uint64_t len,
                                        std::span<const int32_t> group_sizes, uint64_t capacity,
                                        uint32_t timeout_ms) {
  if (group_sizes.empty()) return invalidArgument("shm comm: no groups");
  for (int32_t n : group_sizes) {
    if (n < 1 || n > kShmCommMaxRanks) {
      return invalidArgument("shm comm: a group has " + std::to_string(n) + " ranks (1..64)");
    }
  }
  if (capacity == 0) return invalidArgument("shm comm: capacity must be > 0");
  const uint64_t need = bytes(group_sizes, capacity);
  if (len < need) {
    return invalidArgument("shm comm: region of " + std::to_string(len) + " bytes, " +
                           std::to_string(need) + " needed");
  }
  auto* base = static_cast<std::byte*>(mem);
  std::memset(base, 0, align64(sizeof(AreaHeader)) + align64(sizeof(GroupCtl) * group_sizes.size()));
  auto* h = new (base) AreaHeader{};
  h->version = kVersion;
  h->groups = static_cast<int32_t>(group_sizes.size());
  h->capacity = align64(capacity);
  h->timeout_ms = timeout_ms;
  h->bytes = need;
  uint64_t at = align64(sizeof(AreaHeader)) + align64(sizeof(GroupCtl) * group_sizes.size());
  for (size_t g = 0; g < group_sizes.size(); ++g) {
    auto* c = new (groupCtl(base, static_cast<int32_t>(g))) GroupCtl{};
    c->size = group_sizes[g];
    c->posts_offset = at;
    at += align64(sizeof(Post) * static_cast<uint64_t>(c->size));
    c->slots_offset = at;
    at += h->capacity * static_cast<uint64_t>(c->size);
  }
  std::atomic_thread_fence(std::memory_order_release);
  __atomic_store_n(&h->magic, kMagic, __ATOMIC_RELEASE);
  return ShmCommArea(base);
}

Result<ShmCommArea> ShmCommArea::open(void* mem, uint64_t len) {
  auto* base = static_cast<std::byte*>(mem);
  if (len < sizeof(AreaHeader)) return invalidArgument("shm comm: region too small");
  const AreaHeader* h = header(base);
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kMagic || h->version != kVersion) {
    return invalidArgument("shm comm: not a formatted area of this version");
  }
  if (h->bytes > len) return invalidArgument("shm comm: region shorter than the area");
  return ShmCommArea(base);
}

int32_t ShmCommArea::groups() const { return header(base_)->groups; }

int32_t ShmCommArea::groupSize(int32_t group) const {
  CHECK(group >= 0 && group < groups());
  return groupCtl(base_, group)->size;
}

std::unique_ptr<Communicator> ShmCommArea::communicator(int32_t group, int32_t rank,
                                                        Backend* backend) const {
  CHECK(rank >= 0 && rank < groupSize(group));
  return std::make_unique<ShmComm>(base_, group, rank, backend);
}

void ShmCommArea::abort() const {
  AreaHeader* h = header(base_);
  h->aborted.store(1, std::memory_order_release);
  for (int32_t g = 0; g < h->groups; ++g) futexWake(&groupCtl(base_, g)->generation);
}

bool ShmCommArea::aborted() const {
  return header(base_)->aborted.load(std::memory_order_acquire) != 0;
}

}  // namespace garden::rose
