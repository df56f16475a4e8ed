// LocalCommGroup: collectives among threads of one process over host memory (see collective.h).
// Each call: post this rank's buffer pointers, barrier, read the peers' buffers into private
// storage or the output, barrier (nobody overwrites an input a peer may still read), then write.

#include <cstring>

#include "common/mutex.h"
#include "services/rose/parallel/collective.h"

namespace garden::rose {
namespace {

struct Shared {
  explicit Shared(int32_t n) : n(n), posted(static_cast<size_t>(n)) {}

  // A reusable barrier (generation counted).
  void arrive() EXCLUDES(mu) {
    MutexLock lock(mu);
    const uint64_t gen = generation;
    if (++waiting == n) {
      waiting = 0;
      ++generation;
      cv.notifyAll();
      return;
    }
    while (generation == gen) cv.wait(lock);
  }

  struct Post {
    const void* a = nullptr;
    const void* b = nullptr;
    const int64_t* counts = nullptr;
  };
  const int32_t n;
  std::vector<Post> posted;  // written by its rank between barriers, read by all after
  Mutex mu;
  CondVar cv;
  int32_t waiting GUARDED_BY(mu) = 0;
  uint64_t generation GUARDED_BY(mu) = 0;
};

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<Shared> s, int32_t rank, Backend* backend)
      : s_(std::move(s)), rank_(rank), backend_(backend) {}

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return s_->n; }

  void allReduceSum(const Tensor& inout) override {
    sync();
    CHECK_MSG(inout.dtype == DType::kF32, "local all-reduce wants F32");
    const int64_t n = inout.numel();
    tmp_.assign(static_cast<size_t>(n), 0.f);
    post({inout.data, nullptr, nullptr});
    for (int32_t r = 0; r < s_->n; ++r) {  // rank order on every rank [TAG_REPLICATED_BITWISE]
      const float* src = static_cast<const float*>(s_->posted[static_cast<size_t>(r)].a);
      for (int64_t i = 0; i < n; ++i) tmp_[static_cast<size_t>(i)] += src[i];
    }
    s_->arrive();
    if (n > 0) std::memcpy(inout.data, tmp_.data(), sizeof(float) * static_cast<size_t>(n));
  }

  void allGatherRows(const Tensor& in, std::span<const int64_t> rows_per_rank,
                     const Tensor& out) override {
    sync();
    CHECK(static_cast<int32_t>(rows_per_rank.size()) == s_->n);
    CHECK(in.rows() == rows_per_rank[static_cast<size_t>(rank_)] || in.numel() == 0);
    const size_t row_bytes = collectiveRowBytes(out);
    int64_t total = 0;
    for (int64_t r : rows_per_rank) total += r;
    CHECK(out.rows() == total);
    post({in.data, nullptr, nullptr});
    auto* dst = static_cast<std::byte*>(out.data);
    for (int32_t r = 0; r < s_->n; ++r) {
      const size_t bytes = row_bytes * static_cast<size_t>(rows_per_rank[static_cast<size_t>(r)]);
      if (bytes > 0) std::memcpy(dst, s_->posted[static_cast<size_t>(r)].a, bytes);
      dst += bytes;
    }
    s_->arrive();
  }

  void allToAllRows(const Tensor& send, std::span<const int64_t> send_rows, const Tensor& recv,
                    std::span<const int64_t> recv_rows) override {
    sync();
    CHECK(static_cast<int32_t>(send_rows.size()) == s_->n &&
          static_cast<int32_t>(recv_rows.size()) == s_->n);
    const size_t row_bytes = recv.ndim > 0 ? collectiveRowBytes(recv) : collectiveRowBytes(send);
    post({send.data, nullptr, send_rows.data()});
    auto* dst = static_cast<std::byte*>(recv.data);
    for (int32_t q = 0; q < s_->n; ++q) {
      const Shared::Post& p = s_->posted[static_cast<size_t>(q)];
      int64_t offset = 0;  // rows rank q sends to ranks before me
      for (int32_t r = 0; r < rank_; ++r) offset += p.counts[r];
      const int64_t rows = p.counts[rank_];
      CHECK_MSG(rows == recv_rows[static_cast<size_t>(q)], "allToAllRows: counts disagree");
      if (rows > 0) {
        std::memcpy(dst, static_cast<const std::byte*>(p.a) + row_bytes * offset,
                    row_bytes * static_cast<size_t>(rows));
      }
      dst += row_bytes * static_cast<size_t>(rows);
    }
    s_->arrive();
  }

  void broadcast(const Tensor& inout, int32_t root) override {
    sync();
    CHECK(root >= 0 && root < s_->n);
    post({inout.data, nullptr, nullptr});
    if (rank_ != root && inout.bytes() > 0) {
      std::memcpy(inout.data, s_->posted[static_cast<size_t>(root)].a, inout.bytes());
    }
    s_->arrive();
  }

  void exchangeCounts(std::span<const int64_t> send, std::span<int64_t> recv) override {
    sync();
    CHECK(static_cast<int32_t>(send.size()) == s_->n && static_cast<int32_t>(recv.size()) == s_->n);
    post({nullptr, nullptr, send.data()});
    for (int32_t q = 0; q < s_->n; ++q) {
      recv[static_cast<size_t>(q)] = s_->posted[static_cast<size_t>(q)].counts[rank_];
    }
    s_->arrive();
  }

 private:
  // Posts this rank's pointers and waits until every rank has posted.
  void post(const Shared::Post& p) {
    s_->posted[static_cast<size_t>(rank_)] = p;
    s_->arrive();
  }
  // [TAG_ROSE_LAZY]: on the backend's compute thread this returns at once; from another thread
  // it waits for launched work, so the buffers hold their values.
  void sync() {
    if (backend_ != nullptr) (void)backend_->synchronize();
  }

  std::shared_ptr<Shared> s_;
  const int32_t rank_;
  Backend* backend_;
  std::vector<float> tmp_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> LocalCommGroup::create(
    int32_t n, std::span<Backend* const> backends) {
  CHECK(n > 0 && (backends.empty() || static_cast<int32_t>(backends.size()) == n));
  auto shared = std::make_shared<Shared>(n);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int32_t r = 0; r < n; ++r) {
    out.push_back(std::make_unique<LocalComm>(
        shared, r, backends.empty() ? nullptr : backends[static_cast<size_t>(r)]));
  }
  return out;
}

}  // namespace garden::rose
