#pragma once
// rose over N rank processes of one host (--tp/--dp/--ep, docs/multi-gpu.md "Processes: one per
// GPU"). tulip spawns one rose, which becomes rank 0: it creates a RankSegment (a memfd: header,
// per-rank liveness words, a step relay and the collectives' ShmCommArea), spawns ranks 1..N-1 as
// `rose <same flags> --rank r --rank-fd FD` (RankSupervisor), and serves tulip's channel as
// before through LlmRunner with a ShardedStepModel: each step it runs is first relayed to the
// other ranks (RankSegment::publish), then run by rank 0's own GptOssShard; the others run the
// same step (runFollower) and meet rank 0 in the collectives. Only rank 0 writes results.
//
// Supervision, all of it in rank 0 (tulip knows one worker):
//   - every follower is rank 0's child, started with PR_SET_PDEATHSIG = SIGKILL: when rank 0
//     dies (tulip's restart kills it with SIGKILL), every rank dies with it;
//   - RankSupervisor::check() (rank 0's step thread, every poll): a follower that exited
//     (waitpid), whose heartbeat is stale (a stopped or wedged process; each rank beats from its
//     own thread), or any rank that aborted the collectives, fails the whole worker: rank 0
//     kills and reaps every follower and exits non-zero, which tulip treats as a dead worker
//     (answers in-flight work UNAVAILABLE, restarts rose, hence every rank);
//   - a rank wedged inside its compute stops every other rank at the next collective (each layer
//     has one over the world), so rank 0's own step progress (the counter tulip's stuck-step
//     rule watches) stops within a layer: no per-rank progress aggregation is needed;
//   - a collective that waits past the comm timeout, or finds the world aborted, ends its rank
//     (shm_comm.h), which the rules above turn into a restart of all ranks.
// The memfd has no name: nothing is left in /dev/shm whatever way the ranks end.
//
// Threads: RankSegment's liveness calls from any thread; publish() from rank 0's backend queue
// (inside the step), take() from a follower's main thread; RankSupervisor from rank 0's step
// thread (and the loading thread before it starts).

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/rose/model/llm_step.h"
#include "services/rose/model/llm_step_model.h"
#include "services/rose/ops/paged_kv_cache.h"
#include "services/rose/parallel/gpt_oss_shard.h"
#include "services/rose/parallel/shard_plan.h"
#include "services/rose/parallel/shm_comm.h"

namespace garden::rose {

struct RankSegmentOptions {
  ParallelConfig parallel;
  // Largest step rank 0 relays: max_seqs descriptors, max_batch_tokens ids and the runner's
  // block-id staging (relayedStepBytes).
  uint64_t step_bytes = 0;
  uint64_t comm_capacity = uint64_t{8} << 20;  // bytes per rank per round of a collective
  uint32_t comm_timeout_ms = 0;                // 0: barriers wait until the supervisor acts
};

// Bytes of one relayed step of these counts (each array 8-byte aligned).
uint64_t relayedStepBytes(uint64_t seqs, uint64_t tokens, uint64_t blocks);

// One step as a follower received it (owned copies). Only rank 0 samples, so the relay drops
// what only the sampler reads: the sampler-state words, each sequence's state_offset (-1) and
// sampling parameters (defaults); `sample` and prev_row stay (every rank counts the sampled ids
// and resolves prev_row from the broadcast ids).
struct RelayedStep {
  std::vector<LlmStepSeq> seqs;
  std::vector<int32_t> tokens, blocks;
  LlmStep view() const { return LlmStep{seqs, tokens, blocks, {}}; }
};

// Device collectives of CUDA ranks (RankSegment::communicators).
struct RankDeviceComm {
  size_t ipc_bytes = 0;  // all-reduces up to this size on the CUDA IPC kernel (0: none)
  bool nccl = false;     // NCCL for the rest (one GPU per rank)
  // [TAG_IPC_ALLTOALL] All-to-alls on the CUDA IPC kernel: slots of this many bytes per source
  // (0: none), for at most alltoall_rows rows per source and call (the step's token budget).
  size_t ipc_alltoall_bytes = 0;
  int64_t alltoall_rows = 0;
};

class RankSegment {
 public:
  // Rank 0: a new memfd holding the segment (close-on-exec; RankSupervisor hands it to the
  // children it spawns).
  static Result<std::unique_ptr<RankSegment>> create(const RankSegmentOptions& opts);
  // A follower: the segment behind an inherited descriptor.
  static Result<std::unique_ptr<RankSegment>> open(int fd);
  ~RankSegment();
  RankSegment(const RankSegment&) = delete;
  RankSegment& operator=(const RankSegment&) = delete;

  int fd() const { return fd_; }
  ParallelConfig parallel() const;
  const ShmCommArea& comm() const { return comm_; }

  // This rank's communicators: group 0 is the world, group 1 + d the tp ranks of dp group d.
  // On a backend other than cpu they stage device tensors through host memory
  // (StagedCommunicator) [TAG_STAGED_COMM]; on cuda, device collectives take what `dev` allows
  // (the CUDA IPC all-reduce up to ipc_bytes, NCCL: parallel/cuda/device_rank_comm.h;
  // collective: every rank must call this with the same options).
  struct Comms {
    std::unique_ptr<Communicator> world, tp;
    ShardComms view() const { return {world.get(), tp.get()}; }
  };
  Comms communicators(int32_t rank, Backend* backend, RankDeviceComm dev = {}) const;

  // ---- liveness and start-up, per rank ----
  void setPid(int32_t rank, pid_t pid);
  pid_t pid(int32_t rank) const;
  void beat(int32_t rank);
  // Milliseconds since the rank last beat (a rank that never beat: since the segment was made).
  int64_t heartbeatAgeMs(int32_t rank) const;
  void setReady(int32_t rank);
  bool ready(int32_t rank) const;
  // KV blocks per dp group; 0 until rank 0 has sized its cache (followers wait for it).
  // `window_blocks`: the sliding layers' window pool per dp group (0: none) [TAG_KV_WINDOW_GROUP],
  // published with it (read kvWindowBlocksPerGroup() after kvBlocksPerGroup() is non-zero).
  void setKvBlocksPerGroup(int32_t blocks, int32_t window_blocks = 0);
  int32_t kvBlocksPerGroup() const;
  int32_t kvWindowBlocksPerGroup() const;
  // Ends every collective now waiting or started later (the world is dead).
  void abort() const { comm_.abort(); }
  bool aborted() const { return comm_.aborted(); }

  // ---- the step relay (a single slot: ranks run steps in lockstep) ----
  // Rank 0: waits until every follower took the previous step (immediate in lockstep; returns
  // ABORTED-style UNAVAILABLE if the world aborts meanwhile), then publishes `step`.
  Status publish(const LlmStep& step);
  // Rank 0: tells the followers to leave their loop.
  void publishStop();
  enum class Took { kNothing, kStep, kStop };
  // A follower: waits up to `wait` for the next step and copies it into `out`.
  Took take(int32_t rank, std::chrono::milliseconds wait, RelayedStep& out);

 private:
  RankSegment(int fd, std::byte* base, uint64_t bytes, ShmCommArea comm)
      : fd_(fd), base_(base), bytes_(bytes), comm_(comm) {}
  Status wait(const std::function<bool()>& done) const;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t bytes_ = 0;
  ShmCommArea comm_;
};

// Rank 0's end of the sharded model, for LlmRunner: validate as the shard (sampler state and
// logprobs as the single-device model: rank 0's sampler); enqueueStep relays the step to the
// followers (without the sampler's part), then runs rank 0's shard. A relay failure (the world
// aborted) ends the process like a failed collective.
class ShardedStepModel final : public LlmStepModel {
 public:
  ShardedStepModel(GptOssShard& shard, RankSegment& segment) : shard_(shard), seg_(segment) {}
  int64_t hiddenSize() const override { return shard_.config().base.hidden_size; }
  int64_t maxModelLen() const override { return shard_.maxModelLen(); }
  int64_t vocabSize() const override { return shard_.vocabSize(); }
  bool supportsSamplerState() const override { return shard_.supportsSamplerState(); }
  // Not yet across ranks: the sharded model refuses masked steps (GptOssShard::validate), so
  // tulip refuses constrained requests for such a worker rather than ignoring the grammar.
  bool supportsTokenMask() const override { return false; }
  // `num_blocks` (and `num_blocks_window`, [TAG_KV_WINDOW_GROUP]) is tulip's block-id space:
  // dp groups of num_blocks / dp blocks each.
  KvCacheShape kvShape(int32_t num_blocks, int32_t block_size,
                       int32_t num_blocks_window) const override {
    const int32_t dp = shard_.parallel().dp;
    return shard_.kvShape(num_blocks / dp, block_size, num_blocks_window / dp);
  }
  int32_t kvWindow() const override { return shard_.slidingWindow(); }
  DType kvDType() const override { return shard_.kvDType(); }
  Status validate(const LlmStep& step, const PagedKvCache& kv,
                  int64_t prev_sampled) const override;
  void enqueueStep(const LlmStep& step, PagedKvCache& kv, int32_t* sampled_out,
                   llm::LlmTokenLogprobs* logprobs_out) override;

 private:
  GptOssShard& shard_;
  RankSegment& seg_;
  std::vector<LlmStepSeq> relay_seqs_;  // the step's descriptors minus the sampler's fields
};

// Rank 0's view of its followers.
class RankSupervisor {
 public:
  RankSupervisor(RankSegment& seg, std::chrono::milliseconds heartbeat_timeout)
      : seg_(seg), heartbeat_timeout_(heartbeat_timeout) {}
  ~RankSupervisor() { killAll(); }

  // Starts rank `rank`: fork, PR_SET_PDEATHSIG = SIGKILL, the segment's descriptor kept open
  // across exec, then execv(argv[0], argv + {"--rank", r, "--rank-fd", fd}).
  Status spawn(int32_t rank, const std::vector<std::string>& argv);
  // OK while every follower runs, beats and nobody aborted; else why (the world is then dead:
  // call killAll()).
  Status check();
  // Until every follower is ready: check() failures, or DEADLINE_EXCEEDED after `timeout`.
  Status waitReady(std::chrono::milliseconds timeout);
  // Clean stop: publishStop, up to `grace` for the followers to exit, then killAll().
  void stop(std::chrono::milliseconds grace);
  // SIGKILL and reap every follower still known (no orphans, no zombies).
  void killAll();
  std::vector<pid_t> pids() const;

 private:
  RankSegment& seg_;
  std::chrono::milliseconds heartbeat_timeout_;
  std::vector<std::pair<int32_t, pid_t>> children_;  // (rank, pid) still to reap
};

// A follower's serve loop: takes relayed steps and runs them on `shard` (validated again: a step
// this rank refuses aborts the world), beating from a thread of its own, until rank 0 says stop,
// `should_stop` returns true (checked between steps), or rank 0 is gone. Returns the process
// exit code.
int runFollower(RankSegment& seg, int32_t rank, GptOssShard& shard, PagedKvCache& kv,
                Backend& backend, const std::function<bool()>& should_stop);

}  // namespace garden::rose
