// StagedCommunicator (services/rose/parallel/staged_comm.h): collectives on backend tensors
// staged through host copies over a host-only Communicator. Ranks are threads, each with its own
// CPU backend (its "device" memory) and LocalCommGroup end without a backend. Every collective is
// checked against its definition on fresh random data, the 16-bit all-reduce against the f32 sum in
// rank order rounded once (bitwise, on every rank).

#include "services/rose/parallel/staged_comm.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/safetensors.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {
namespace {

struct Ranks {
  explicit Ranks(int32_t n) {
    for (int32_t r = 0; r < n; ++r) {
      backends.push_back(makeBackend("cpu", BackendOptions{1, 0, 64}).value());
    }
    const std::vector<Backend*> none(static_cast<size_t>(n), nullptr);
    auto host = LocalCommGroup::create(n, none);
    for (int32_t r = 0; r < n; ++r) {
      comms.push_back(std::make_unique<StagedCommunicator>(std::move(host[static_cast<size_t>(r)]),
                                                           *backends[static_cast<size_t>(r)]));
    }
  }
  // Runs fn(rank) on one thread per rank.
  template <typename Fn>
  void run(Fn fn) {
    std::vector<std::thread> t;
    for (int32_t r = 0; r < static_cast<int32_t>(comms.size()); ++r) t.emplace_back(fn, r);
    for (auto& x : t) x.join();
  }
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Communicator>> comms;
};

class StagedCommSizes : public ::testing::TestWithParam<int32_t> {};

TEST_P(StagedCommSizes, SixteenBitAllReduceIsTheF32SumInRankOrderRoundedOnce) {
  const int32_t n = GetParam();
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(std::string(dtypeName(dt)));
    Ranks ranks(n);
    constexpr int64_t kElems = 1000;
    std::mt19937 rng(static_cast<uint32_t>(17 + n));
    std::normal_distribution<float> nd(0.f, 3.f);
    // in[r][i] as the dtype's bits (16-bit: the rounded value), and as floats.
    std::vector<std::vector<uint16_t>> in16(static_cast<size_t>(n));
    std::vector<std::vector<float>> in32(static_cast<size_t>(n));
    for (int32_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < kElems; ++i) {
        float v = nd(rng);
        if (dt == DType::kBF16) {
          in16[static_cast<size_t>(r)].push_back(f32ToBf16(v));
          v = bf16ToF32(in16[static_cast<size_t>(r)].back());
        } else if (dt == DType::kF16) {
          in16[static_cast<size_t>(r)].push_back(f32ToF16(v));
          v = f16ToF32(in16[static_cast<size_t>(r)].back());
        }
        in32[static_cast<size_t>(r)].push_back(v);
      }
    }
    std::vector<float> want(static_cast<size_t>(kElems), 0.f);
    for (int32_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < kElems; ++i) {
        want[static_cast<size_t>(i)] += in32[static_cast<size_t>(r)][static_cast<size_t>(i)];
      }
    }
    std::vector<std::vector<std::byte>> got(static_cast<size_t>(n));
    ranks.run([&](int32_t r) {
      Backend& b = *ranks.backends[static_cast<size_t>(r)];
      OwnedTensor t = b.allocateTensor(dt, {kElems}).value();
      const void* src = dt == DType::kF32 ? static_cast<const void*>(in32[r].data())
                                          : static_cast<const void*>(in16[r].data());
      b.copyToDevice(t.view, src, t.view.bytes());
      ranks.comms[static_cast<size_t>(r)]->allReduceSum(t.view);
      got[static_cast<size_t>(r)].resize(t.view.bytes());
      b.copyToHost(got[static_cast<size_t>(r)].data(), t.view, t.view.bytes());
      ASSERT_TRUE(b.synchronize().isOk());
    });
    for (int32_t r = 0; r < n; ++r) {
      ASSERT_EQ(got[static_cast<size_t>(r)], got[0]) << "rank " << r << " differs from rank 0";
    }
    for (int64_t i = 0; i < kElems; ++i) {
      const float w = want[static_cast<size_t>(i)];
      if (dt == DType::kF32) {
        float g;
        std::memcpy(&g, got[0].data() + 4 * i, 4);
        ASSERT_EQ(g, w) << i;
      } else {
        uint16_t g;
        std::memcpy(&g, got[0].data() + 2 * i, 2);
        ASSERT_EQ(g, dt == DType::kBF16 ? f32ToBf16(w) : f32ToF16(w)) << i;
      }
    }
  }
}

TEST_P(StagedCommSizes, RowCollectivesMoveTheRightBytes) {
  const int32_t n = GetParam();
  Ranks ranks(n);
  constexpr int64_t kCols = 5;  // I32 rows; each value names (source rank, destination, index)
  auto val = [](int32_t src, int32_t dst, int64_t i, int64_t c) {
    return static_cast<int32_t>(src * 1000000 + dst * 10000 + i * 10 + c);
  };
  // allToAllRows: rank q sends (q + p) % 3 rows to rank p.
  auto sendCount = [](int32_t q, int32_t p) { return static_cast<int64_t>((q + p) % 3); };
  std::vector<int> failures(static_cast<size_t>(n), 0);
  ranks.run([&](int32_t r) {
    Backend& b = *ranks.backends[static_cast<size_t>(r)];
    Communicator& c = *ranks.comms[static_cast<size_t>(r)];
    int& bad = failures[static_cast<size_t>(r)];
    // exchangeCounts
    std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
    for (int32_t p = 0; p < n; ++p) send[static_cast<size_t>(p)] = sendCount(r, p);
    c.exchangeCounts(send, recv);
    for (int32_t q = 0; q < n; ++q) bad += recv[static_cast<size_t>(q)] != sendCount(q, r);
    // allToAllRows
    int64_t total_send = 0, total_recv = 0;
    for (int32_t p = 0; p < n; ++p) total_send += send[static_cast<size_t>(p)];
    for (int32_t q = 0; q < n; ++q) total_recv += recv[static_cast<size_t>(q)];
    std::vector<int32_t> hs;
    for (int32_t p = 0; p < n; ++p) {
      for (int64_t i = 0; i < send[static_cast<size_t>(p)]; ++i) {
        for (int64_t k = 0; k < kCols; ++k) hs.push_back(val(r, p, i, k));
      }
    }
    OwnedTensor st =
        b.allocateTensor(DType::kI32, {std::max<int64_t>(total_send, 1), kCols}).value();
    OwnedTensor rt =
        b.allocateTensor(DType::kI32, {std::max<int64_t>(total_recv, 1), kCols}).value();
    const Tensor sv = st.view.rowSlice(0, total_send), rv = rt.view.rowSlice(0, total_recv);
    if (!hs.empty()) b.copyToDevice(sv, hs.data(), hs.size() * 4);
    c.allToAllRows(sv, send, rv, recv);
    std::vector<int32_t> hr(static_cast<size_t>(total_recv * kCols));
    if (!hr.empty()) b.copyToHost(hr.data(), rv, hr.size() * 4);
    EXPECT_TRUE(b.synchronize().isOk());
    size_t at = 0;
    for (int32_t q = 0; q < n; ++q) {
      for (int64_t i = 0; i < recv[static_cast<size_t>(q)]; ++i) {
        for (int64_t k = 0; k < kCols; ++k) bad += hr[at++] != val(q, r, i, k);
      }
    }
    // allGatherRows: rank q contributes q + 1 rows.
    std::vector<int64_t> per(static_cast<size_t>(n));
    int64_t all = 0;
    for (int32_t q = 0; q < n; ++q) all += (per[static_cast<size_t>(q)] = q + 1);
    std::vector<int32_t> mine;
    for (int64_t i = 0; i <= r; ++i) {
      for (int64_t k = 0; k < kCols; ++k) mine.push_back(val(r, 99, i, k));
    }
    OwnedTensor in = b.allocateTensor(DType::kI32, {r + 1, kCols}).value();
    OwnedTensor out = b.allocateTensor(DType::kI32, {all, kCols}).value();
    b.copyToDevice(in.view, mine.data(), mine.size() * 4);
    c.allGatherRows(in.view, per, out.view);
    std::vector<int32_t> ho(static_cast<size_t>(all * kCols));
    b.copyToHost(ho.data(), out.view, ho.size() * 4);
    EXPECT_TRUE(b.synchronize().isOk());
    at = 0;
    for (int32_t q = 0; q < n; ++q) {
      for (int64_t i = 0; i <= q; ++i) {
        for (int64_t k = 0; k < kCols; ++k) bad += ho[at++] != val(q, 99, i, k);
      }
    }
    // broadcast from the last rank.
    std::vector<int32_t> hb(7);
    for (int i = 0; i < 7; ++i) hb[static_cast<size_t>(i)] = r == n - 1 ? 500 + i : -1;
    OwnedTensor bt = b.allocateTensor(DType::kI32, {7}).value();
    b.copyToDevice(bt.view, hb.data(), 28);
    c.broadcast(bt.view, n - 1);
    b.copyToHost(hb.data(), bt.view, 28);
    EXPECT_TRUE(b.synchronize().isOk());
    for (int i = 0; i < 7; ++i) bad += hb[static_cast<size_t>(i)] != 500 + i;
  });
  for (int32_t r = 0; r < n; ++r) EXPECT_EQ(failures[static_cast<size_t>(r)], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, StagedCommSizes, ::testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace garden::rose
