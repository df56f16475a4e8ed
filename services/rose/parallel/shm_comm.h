#pragma once
// Collectives between rank PROCESSES of one host over shared host memory (docs/multi-gpu.md): the
// CPU implementation of Communicator (collective.h) that the rank runtime (rank_runtime.h) uses
// when rose runs with --tp/--dp/--ep on the cpu backend, and the stand-in for the CUDA IPC / NCCL
// implementation on GPUs (same interface, same results: sums in rank order on every rank
// [TAG_REPLICATED_BITWISE]).
//
// An ShmCommArea is a region of memory shared by the ranks (a memfd mapped by every rank process,
// or an anonymous MAP_SHARED mapping inherited through fork in tests) holding G groups; group g
// has group_sizes[g] members, each with a staging slot of `capacity` bytes. Every collective is the
// same exchange: each rank posts a payload (its input) and per-peer counts, and reads the parts of
// its peers' payloads it needs; payloads larger than the capacity go in rounds of `capacity` bytes
// (so any message size works with a bounded segment). Per round: copy in, barrier, read, barrier.
//
// Barriers are a counter and a generation word (futex, shared between processes). A barrier that
// waits longer than the area's timeout, or finds the area aborted (abort(): a rank that fails
// sets it), ends the process: the collective interface has no error path, and a rank whose peer
// is gone cannot continue; the supervisor (rank 0, then tulip) restarts every rank. Exit code
// kCollectiveExitCode, after one error log line naming the group and the reason.
//
// Threads: one Communicator per (rank, group), used from that rank's launching thread (as
// collective.h). abort()/aborted() from any thread or process.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/rose/parallel/collective.h"

namespace garden::rose {

inline constexpr int kCollectiveExitCode = 3;
inline constexpr int32_t kShmCommMaxRanks = 64;  // checkParallelConfig's world limit

class ShmCommArea {
 public:
  // Bytes an area of these groups needs (capacity rounded up to 64).
  static uint64_t bytes(std::span<const int32_t> group_sizes, uint64_t capacity);
  // Lays the area out in `mem` (`len` >= bytes(...), shared, zero or not). timeout_ms: the
  // longest a rank waits in one barrier (0: forever; the supervisor's liveness checks then end a
  // wedged world). INVALID_ARGUMENT on a bad group size (1..64), capacity 0, or a short region.
  static Result<ShmCommArea> format(void* mem, uint64_t len, std::span<const int32_t> group_sizes,
                                    uint64_t capacity, uint32_t timeout_ms);
  // An area another process formatted (checks the header).
  static Result<ShmCommArea> open(void* mem, uint64_t len);

  int32_t groups() const;
  int32_t groupSize(int32_t group) const;
  // Member `rank` of `group`. `backend`: the rank's backend (synchronized before each
  // collective when called off its compute thread, like LocalCommGroup), or null.
  std::unique_ptr<Communicator> communicator(int32_t group, int32_t rank, Backend* backend) const;

  // Makes every barrier of every group (now and later) fail: the ranks blocked in collectives
  // exit instead of waiting for a peer that will not come.
  void abort() const;
  bool aborted() const;

 private:
  explicit ShmCommArea(std::byte* base) : base_(base) {}
  std::byte* base_ = nullptr;
};

}  // namespace garden::rose
