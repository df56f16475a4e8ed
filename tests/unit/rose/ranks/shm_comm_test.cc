// ShmCommArea (services/rose/parallel/shm_comm.h): collectives between forked processes over a
// shared mapping, checked against what each must produce, computed independently in every
// process: all-reduce (bitwise the rank-order sum, several sizes including messages of many
// capacity rounds), uneven all-gather, all-to-all with per-pair counts (some zero) and as a
// gather to rank 0 (senders that receive nothing: a zero-row view), broadcast
// from every root, count exchange; groups of 1, 2, 3 and 4 processes, and two groups used
// alternately. Failure: a peer that never arrives ends the waiting ranks with
// kCollectiveExitCode after the timeout; abort() ends them at once.

#include "services/rose/parallel/shm_comm.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace garden::rose {
namespace {

using namespace std::chrono_literals;

// A deterministic value for (rank, index, call): every process can compute every rank's input.
float value(int32_t rank, int64_t i, int call) {
  const uint32_t h = static_cast<uint32_t>(rank * 7919 + i * 104729 + call * 15485863) * 2654435761u;
  return static_cast<float>(h % 20001) / 1000.f - 10.f;
}

struct Shared {
  void* mem = nullptr;
  uint64_t len = 0;
  Shared(const std::vector<int32_t>& groups, uint64_t capacity, uint32_t timeout_ms) {
    len = ShmCommArea::bytes(groups, capacity);
    mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(mem, MAP_FAILED);
    auto a = ShmCommArea::format(mem, len, groups, capacity, timeout_ms);
    EXPECT_TRUE(a.isOk()) << a.status().toString();
  }
  ~Shared() { munmap(mem, len); }
};

// Runs body(rank) in n forked processes; returns their exit codes (body returning false → 1).
std::vector<int> runRanks(int32_t n, const std::function<bool(int32_t)>& body) {
  std::vector<pid_t> pids;
  for (int32_t r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      const bool ok = body(r);
      std::fflush(nullptr);
      _exit(ok ? 0 : 1);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int st = 0;
    waitpid(pid, &st, 0);
    codes.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  return codes;
}

#define RANK_EXPECT(cond)                                                            \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "rank %d: %s failed (line %d)\n", rank, #cond, __LINE__); \
      return false;                                                                  \
    }                                                                                \
  } while (0)

class ShmCommSizes : public ::testing::TestWithParam<int32_t> {};

TEST_P(ShmCommSizes, EveryCollectiveMatchesItsDefinition) {
  const int32_t n = GetParam();
  constexpr uint64_t kCapacity = 256;  // bytes per round: most messages below take many rounds
  Shared sh({n}, kCapacity, 30000);
  const std::vector<int> codes = runRanks(n, [&](int32_t rank) {
    auto area = ShmCommArea::open(sh.mem, sh.len);
    RANK_EXPECT(area.isOk());
    auto comm = area->communicator(0, rank, nullptr);
    RANK_EXPECT(comm->rank() == rank && comm->size() == n);
    int call = 0;
    // All-reduce: bitwise the sum in rank order.
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, int64_t{1000}}) {
      ++call;
      std::vector<float> buf(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) buf[static_cast<size_t>(i)] = value(rank, i, call);
      comm->allReduceSum(Tensor(buf.data(), DType::kF32, {count}));
      for (int64_t i = 0; i < count; ++i) {
        float want = 0.f;
        for (int32_t q = 0; q < n; ++q) want += value(q, i, call);
        RANK_EXPECT(std::memcmp(&want, &buf[static_cast<size_t>(i)], 4) == 0);
      }
    }
    // All-gather, uneven rows (rank q has q + 2 rows of 37 floats; 0 rows on rank 1).
    ++call;
    constexpr int64_t kCols = 37;
    std::vector<int64_t> rows(static_cast<size_t>(n));
    int64_t total = 0;
    for (int32_t q = 0; q < n; ++q) total += rows[static_cast<size_t>(q)] = q == 1 ? 0 : q + 2;
    std::vector<float> mine(static_cast<size_t>(rows[static_cast<size_t>(rank)] * kCols));
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = value(rank, static_cast<int64_t>(i), call);
    std::vector<float> all(static_cast<size_t>(total * kCols), -1.f);
    comm->allGatherRows(Tensor(mine.data(), DType::kF32, {rows[static_cast<size_t>(rank)], kCols}),
                        rows, Tensor(all.data(), DType::kF32, {total, kCols}));
    size_t at = 0;
    for (int32_t q = 0; q < n; ++q) {
      for (int64_t i = 0; i < rows[static_cast<size_t>(q)] * kCols; ++i) {
        RANK_EXPECT(all[at++] == value(q, i, call));
      }
    }
    // All-to-all: rank q sends (q + 2·r) % 4 rows of 5 ints to rank r, row j of pair (q, r)
    // holding value-derived ints.
    ++call;
    auto pairRows = [&](int32_t q, int32_t r) { return static_cast<int64_t>((q + 2 * r) % 4); };
    auto cell = [&](int32_t q, int32_t r, int64_t j, int64_t c) {
      return static_cast<int32_t>(q * 1000000 + r * 10000 + j * 10 + c);
    };
    std::vector<int64_t> send_rows(static_cast<size_t>(n)), recv_rows(static_cast<size_t>(n));
    std::vector<int32_t> send, recv;
    for (int32_t r = 0; r < n; ++r) {
      send_rows[static_cast<size_t>(r)] = pairRows(rank, r);
      recv_rows[static_cast<size_t>(r)] = pairRows(r, rank);
      for (int64_t j = 0; j < pairRows(rank, r); ++j) {
        for (int64_t c = 0; c < 5; ++c) send.push_back(cell(rank, r, j, c));
      }
    }
    int64_t recv_total = 0;
    for (int64_t v : recv_rows) recv_total += v;
    recv.assign(static_cast<size_t>(recv_total * 5), -1);
    const int64_t send_total = static_cast<int64_t>(send.size() / 5);
    send.resize(send.size() + 5);  // a valid pointer even when nothing is sent
    recv.resize(recv.size() + 5);
    // exchangeCounts first, as the sharded model does.
    std::vector<int64_t> got_counts(static_cast<size_t>(n));
    comm->exchangeCounts(send_rows, got_counts);
    RANK_EXPECT(got_counts == recv_rows);
    comm->allToAllRows(Tensor(send.data(), DType::kI32, {send_total, 5}), send_rows,
                       Tensor(recv.data(), DType::kI32, {recv_total, 5}), recv_rows);
    at = 0;
    for (int32_t q = 0; q < n; ++q) {
      for (int64_t j = 0; j < pairRows(q, rank); ++j) {
        for (int64_t c = 0; c < 5; ++c) RANK_EXPECT(recv[at++] == cell(q, rank, j, c));
      }
    }
    // All-to-all as the dp logits gather: every rank sends 3 rows of 100 floats to rank 0 and
    // receives nothing (a [0, 100] view: its row size must still come from the shape).
    ++call;
    std::vector<float> rows_out(300), gathered(static_cast<size_t>(300 * n) + 1, -1.f);
    for (int64_t i = 0; i < 300; ++i) rows_out[static_cast<size_t>(i)] = value(rank, i, call);
    std::vector<int64_t> to0(static_cast<size_t>(n), 0), from_all(static_cast<size_t>(n), 0);
    to0[0] = 3;
    if (rank == 0) std::fill(from_all.begin(), from_all.end(), 3);
    comm->allToAllRows(Tensor(rows_out.data(), DType::kF32, {3, 100}), to0,
                       Tensor(gathered.data(), DType::kF32, {rank == 0 ? 3 * n : 0, 100}),
                       from_all);
    if (rank == 0) {
      for (int32_t q = 0; q < n; ++q) {
        for (int64_t i = 0; i < 300; ++i) {
          RANK_EXPECT(gathered[static_cast<size_t>(q * 300 + i)] == value(q, i, call));
        }
      }
    }
    // Broadcast from every root (300 floats: two rounds).
    for (int32_t root = 0; root < n; ++root) {
      ++call;
      std::vector<float> b(300);
      for (int64_t i = 0; i < 300; ++i) b[static_cast<size_t>(i)] = value(rank, i, call);
      comm->broadcast(Tensor(b.data(), DType::kF32, {300}), root);
      for (int64_t i = 0; i < 300; ++i) RANK_EXPECT(b[static_cast<size_t>(i)] == value(root, i, call));
    }
    return true;
  });
  for (int32_t r = 0; r < n; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmCommSizes, ::testing::Values(1, 2, 3, 4));

// Two groups (a world of 4 and its two halves, as tp groups of dp 2) used alternately.
TEST(ShmComm, GroupsAreIndependent) {
  Shared sh({4, 2, 2}, 64 * 1024, 30000);
  const std::vector<int> codes = runRanks(4, [&](int32_t rank) {
    auto area = ShmCommArea::open(sh.mem, sh.len);
    RANK_EXPECT(area.isOk() && area->groups() == 3 && area->groupSize(1) == 2);
    auto world = area->communicator(0, rank, nullptr);
    auto half = area->communicator(1 + rank / 2, rank % 2, nullptr);
    for (int call = 0; call < 20; ++call) {
      float w = static_cast<float>(rank + 1), h = static_cast<float>(rank + 1);
      world->allReduceSum(Tensor(&w, DType::kF32, {1}));
      half->allReduceSum(Tensor(&h, DType::kF32, {1}));
      RANK_EXPECT(w == 10.f);
      RANK_EXPECT(h == (rank < 2 ? 3.f : 7.f));
    }
    return true;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

// A rank that never calls: the others exit kCollectiveExitCode once the timeout passes.
TEST(ShmComm, AMissingPeerEndsTheWaitingRanksAfterTheTimeout) {
  Shared sh({3}, 64, 300);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> codes = runRanks(3, [&](int32_t rank) {
    auto area = ShmCommArea::open(sh.mem, sh.len);
    if (rank == 2) return true;  // gone
    float x = 1.f;
    area->communicator(0, rank, nullptr)->allReduceSum(Tensor(&x, DType::kF32, {1}));
    return false;  // must not get here
  });
  EXPECT_EQ(codes, (std::vector<int>{kCollectiveExitCode, kCollectiveExitCode, 0}));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

// abort() (a failed rank, or the supervisor) ends ranks blocked in a collective at once, even
// without a timeout, and every later collective.
TEST(ShmComm, AbortEndsBlockedRanks) {
  Shared sh({3}, 64, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> codes = runRanks(3, [&](int32_t rank) {
    auto area = ShmCommArea::open(sh.mem, sh.len);
    if (rank == 2) {
      std::this_thread::sleep_for(200ms);
      area->abort();
      RANK_EXPECT(area->aborted());
      return true;
    }
    float x = 1.f;
    area->communicator(0, rank, nullptr)->allReduceSum(Tensor(&x, DType::kF32, {1}));
    return false;
  });
  EXPECT_EQ(codes, (std::vector<int>{kCollectiveExitCode, kCollectiveExitCode, 0}));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST(ShmComm, FormatRefusesBadLayouts) {
  std::vector<std::byte> mem(1 << 16);
  EXPECT_FALSE(ShmCommArea::format(mem.data(), mem.size(), std::vector<int32_t>{}, 64, 0).isOk());
  EXPECT_FALSE(ShmCommArea::format(mem.data(), mem.size(), std::vector<int32_t>{0}, 64, 0).isOk());
  EXPECT_FALSE(ShmCommArea::format(mem.data(), mem.size(), std::vector<int32_t>{65}, 64, 0).isOk());
  EXPECT_FALSE(ShmCommArea::format(mem.data(), mem.size(), std::vector<int32_t>{2}, 0, 0).isOk());
  EXPECT_FALSE(ShmCommArea::format(mem.data(), 128, std::vector<int32_t>{2}, 64, 0).isOk());
  EXPECT_FALSE(ShmCommArea::open(mem.data() + 4096, 4096).isOk()) << "unformatted";
}

}  // namespace
}  // namespace garden::rose
