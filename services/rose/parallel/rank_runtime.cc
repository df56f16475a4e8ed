// The rank processes of a sharded rose (see rank_runtime.h).
//
// Segment layout (a memfd, every piece 64-byte aligned):
//   SegHeader
//   RankWords[world]
//   the relayed step: step_bytes
//   ShmCommArea (world group, then one tp group per dp group)

#include "services/rose/parallel/rank_runtime.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/logging.h"
#include "common/shm/channel.h"
#include "services/rose/parallel/staged_comm.h"
#if defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA
#include "services/rose/parallel/cuda/device_rank_comm.h"
#endif

namespace garden::rose {
namespace {

constexpr uint64_t kMagic = 0x4741524452534547ull;  // "GARDRSEG"
constexpr uint32_t kVersion = 2;  // 2: kv_window_blocks_per_group
constexpr uint32_t kStepKind = 1, kStopKind = 2;

uint64_t align64(uint64_t v) { return (v + 63) / 64 * 64; }
uint64_t align8(uint64_t v) { return (v + 7) / 8 * 8; }

struct alignas(64) SegHeader {
  uint64_t magic;
  uint32_t version;
  int32_t tp, dp, ep;
  uint64_t step_offset, step_bytes, comm_offset, total;
  int64_t created_ns;
  std::atomic<int32_t> kv_blocks_per_group;
  std::atomic<int32_t> kv_window_blocks_per_group;  // [TAG_KV_WINDOW_GROUP] 0: none
  std::atomic<uint32_t> published;  // futex word: steps (and the stop) published so far
  // The relayed step's counts (written before `published` moves).
  uint32_t kind, num_seqs, num_tokens, num_blocks;
};

struct alignas(64) RankWords {
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> ready;
  std::atomic<uint32_t> consumed;  // steps this rank took (followers)
  std::atomic<int64_t> heartbeat_ns;
};

SegHeader* hdr(std::byte* base) { return reinterpret_cast<SegHeader*>(base); }
RankWords* words(std::byte* base, int32_t rank) {
  return reinterpret_cast<RankWords*>(base + align64(sizeof(SegHeader))) + rank;
}

std::vector<int32_t> groupSizes(const ParallelConfig& p) {
  std::vector<int32_t> g = {p.world()};
  for (int32_t d = 0; d < p.dp; ++d) g.push_back(p.tp);
  return g;
}

void futexWake(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}
void futexWaitFor(std::atomic<uint32_t>* addr, uint32_t expected, std::chrono::milliseconds d) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

std::string describeExit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended";
}

}  // namespace

uint64_t relayedStepBytes(uint64_t seqs, uint64_t tokens, uint64_t blocks) {
  return align8(seqs * sizeof(LlmStepSeq)) + align8(tokens * sizeof(int32_t)) +
         align8(blocks * sizeof(int32_t));
}

// ---- RankSegment ----

Result<std::unique_ptr<RankSegment>> RankSegment::create(const RankSegmentOptions& o) {
  const ParallelConfig& p = o.parallel;
  if (p.tp < 1 || p.dp < 1 || p.ep < 1 || p.world() > kShmCommMaxRanks) {
    return invalidArgument("rank segment: tp, dp, ep >= 1 and tp x dp <= 64");
  }
  const std::vector<int32_t> groups = groupSizes(p);
  const uint64_t step_offset =
      align64(sizeof(SegHeader)) + align64(sizeof(RankWords) * static_cast<uint64_t>(p.world()));
  const uint64_t comm_offset = step_offset + align64(std::max<uint64_t>(o.step_bytes, 64));
  const uint64_t total = comm_offset + ShmCommArea::bytes(groups, o.comm_capacity);
  const int fd = memfd_create("garden-rose-ranks", MFD_CLOEXEC);
  if (fd < 0) return errnoStatus("memfd_create", errno);
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
    const int err = errno;
    close(fd);
    return errnoStatus("ftruncate (rank segment)", err);
  }
  void* mem = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return errnoStatus("mmap (rank segment)", err);
  }
  auto* base = static_cast<std::byte*>(mem);  // a fresh memfd reads as zeros
  Result<ShmCommArea> comm = ShmCommArea::format(base + comm_offset, total - comm_offset, groups,
                                                 o.comm_capacity, o.comm_timeout_ms);
  if (!comm.isOk()) {
    munmap(mem, total);
    close(fd);
    return comm.status();
  }
  auto* h = new (base) SegHeader{};
  h->version = kVersion;
  h->tp = p.tp;
  h->dp = p.dp;
  h->ep = p.ep;
  h->step_offset = step_offset;
  h->step_bytes = o.step_bytes;
  h->comm_offset = comm_offset;
  h->total = total;
  h->created_ns = shm::monotonicNowNs();
  for (int32_t r = 0; r < p.world(); ++r) new (words(base, r)) RankWords{};
  __atomic_store_n(&h->magic, kMagic, __ATOMIC_RELEASE);
  return std::unique_ptr<RankSegment>(new RankSegment(fd, base, total, *comm));
}

Result<std::unique_ptr<RankSegment>> RankSegment::open(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return errnoStatus("--rank-fd " + std::to_string(fd), errno);
  const auto len = static_cast<uint64_t>(st.st_size);
  if (len < sizeof(SegHeader)) return invalidArgument("--rank-fd: not a rank segment (too small)");
  void* mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return errnoStatus("mmap --rank-fd", errno);
  auto* base = static_cast<std::byte*>(mem);
  const SegHeader* h = hdr(base);
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kMagic || h->version != kVersion ||
      h->total != len) {
    munmap(mem, len);
    return invalidArgument("--rank-fd: not a rank segment of this version");
  }
  Result<ShmCommArea> comm = ShmCommArea::open(base + h->comm_offset, len - h->comm_offset);
  if (!comm.isOk()) {
    munmap(mem, len);
    return comm.status();
  }
  fcntl(fd, F_SETFD, FD_CLOEXEC);  // not into anything this rank might start
  return std::unique_ptr<RankSegment>(new RankSegment(fd, base, len, *comm));
}

RankSegment::~RankSegment() {
  munmap(base_, bytes_);
  close(fd_);
}

ParallelConfig RankSegment::parallel() const {
  const SegHeader* h = hdr(base_);
  return ParallelConfig{h->tp, h->dp, h->ep};
}

RankSegment::Comms RankSegment::communicators(int32_t rank, Backend* backend,
                                              RankDeviceComm dev) const {
  const ParallelConfig p = parallel();
  const RankCoords c = rankCoords(p, rank);
  // Device tensors: the shared-memory collectives on host copies [TAG_STAGED_COMM], with the
  // device collectives `dev` asks for beside them on cuda. Test knob: GARDEN_TEST_STAGED_COMM=1
  // stages on the cpu backend too (the CUDA ranks' path, checkable without a GPU:
  // tests/integration/ranks/device_ranks_test.cc).
  const char* force = std::getenv("GARDEN_TEST_STAGED_COMM");
  const bool staged = backend != nullptr &&
                      (backend->name() != "cpu" || (force != nullptr && force[0] == '1'));
  // Member `member` of group `group` (0: the world, 1 + d: dp group d's tp ranks).
  auto make = [&](int32_t group, int32_t member) -> std::unique_ptr<Communicator> {
    if (!staged) return comm_.communicator(group, member, backend);
    std::unique_ptr<Communicator> host = comm_.communicator(group, member, nullptr);
#if defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA
    // [TAG_IPC_ALLTOALL] Only the world runs all-to-alls (the expert dispatch): no slots for the
    // tp groups.
    const size_t a2a_bytes = group == 0 ? dev.ipc_alltoall_bytes : 0;
    if ((dev.ipc_bytes > 0 || dev.nccl || a2a_bytes > 0) && backend->name() == "cuda") {
      auto d = makeDeviceRankCommunicator(
          std::move(host), *backend,
          DeviceCommOptions{dev.ipc_bytes, dev.nccl, a2a_bytes, dev.alltoall_rows});
      CHECK_MSG(d.isOk(), d.status().toString().c_str());
      return std::move(d).value();
    }
#endif
    return std::make_unique<StagedCommunicator>(std::move(host), *backend);
  };
  Comms out;
  out.world = make(0, rank);
  out.tp = make(1 + c.dp_rank, c.tp_rank);
  return out;
}

void RankSegment::setPid(int32_t rank, pid_t pid) { words(base_, rank)->pid.store(pid); }
pid_t RankSegment::pid(int32_t rank) const { return words(base_, rank)->pid.load(); }
void RankSegment::beat(int32_t rank) {
  words(base_, rank)->heartbeat_ns.store(shm::monotonicNowNs(), std::memory_order_release);
}
int64_t RankSegment::heartbeatAgeMs(int32_t rank) const {
  int64_t last = words(base_, rank)->heartbeat_ns.load(std::memory_order_acquire);
  if (last == 0) last = hdr(base_)->created_ns;
  return (shm::monotonicNowNs() - last) / 1000000;
}
void RankSegment::setReady(int32_t rank) { words(base_, rank)->ready.store(1); }
bool RankSegment::ready(int32_t rank) const { return words(base_, rank)->ready.load() != 0; }
void RankSegment::setKvBlocksPerGroup(int32_t blocks, int32_t window_blocks) {
  // The window count first: a follower reads it after it sees `blocks` (release/acquire).
  hdr(base_)->kv_window_blocks_per_group.store(window_blocks, std::memory_order_relaxed);
  hdr(base_)->kv_blocks_per_group.store(blocks, std::memory_order_release);
}
int32_t RankSegment::kvWindowBlocksPerGroup() const {
  return hdr(base_)->kv_window_blocks_per_group.load(std::memory_order_relaxed);
}
int32_t RankSegment::kvBlocksPerGroup() const {
  return hdr(base_)->kv_blocks_per_group.load(std::memory_order_acquire);
}

Status RankSegment::wait(const std::function<bool()>& done) const {
  while (!done()) {
    if (aborted()) return unavailable("the rank world aborted");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return okStatus();
}

Status RankSegment::publish(const LlmStep& step) {
  SegHeader* h = hdr(base_);
  const uint32_t n = h->published.load(std::memory_order_relaxed);
  const int32_t world = parallel().world();
  RETURN_IF_ERROR(wait([&] {
    for (int32_t r = 1; r < world; ++r) {
      if (words(base_, r)->consumed.load(std::memory_order_acquire) != n) return false;
    }
    return true;
  }));
  const uint64_t need =
      relayedStepBytes(step.seqs.size(), step.tokens.size(), step.block_ids.size());
  if (need > h->step_bytes) {
    return internalError("relayed step of " + std::to_string(need) + " bytes exceeds the " +
                         std::to_string(h->step_bytes) + " the rank segment holds");
  }
  std::byte* at = base_ + h->step_offset;
  std::memcpy(at, step.seqs.data(), step.seqs.size_bytes());
  at += align8(step.seqs.size_bytes());
  std::memcpy(at, step.tokens.data(), step.tokens.size_bytes());
  at += align8(step.tokens.size_bytes());
  if (!step.block_ids.empty()) std::memcpy(at, step.block_ids.data(), step.block_ids.size_bytes());
  h->kind = kStepKind;
  h->num_seqs = static_cast<uint32_t>(step.seqs.size());
  h->num_tokens = static_cast<uint32_t>(step.tokens.size());
  h->num_blocks = static_cast<uint32_t>(step.block_ids.size());
  h->published.store(n + 1, std::memory_order_release);
  futexWake(&h->published);
  return okStatus();
}

void RankSegment::publishStop() {
  SegHeader* h = hdr(base_);
  const uint32_t n = h->published.load(std::memory_order_relaxed);
  const int32_t world = parallel().world();
  // Best effort: a follower that never took the last step is being killed anyway.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  (void)wait([&] {
    if (std::chrono::steady_clock::now() > end) return true;
    for (int32_t r = 1; r < world; ++r) {
      if (words(base_, r)->consumed.load(std::memory_order_acquire) != n) return false;
    }
    return true;
  });
  h->kind = kStopKind;
  h->num_seqs = h->num_tokens = h->num_blocks = 0;
  h->published.store(n + 1, std::memory_order_release);
  futexWake(&h->published);
}

RankSegment::Took RankSegment::take(int32_t rank, std::chrono::milliseconds wait_for,
                                    RelayedStep& out) {
  SegHeader* h = hdr(base_);
  RankWords* w = words(base_, rank);
  const uint32_t seen = w->consumed.load(std::memory_order_relaxed);
  if (h->published.load(std::memory_order_acquire) == seen) {
    futexWaitFor(&h->published, seen, wait_for);
    if (h->published.load(std::memory_order_acquire) == seen) return Took::kNothing;
  }
  const Took took = h->kind == kStopKind ? Took::kStop : Took::kStep;
  if (took == Took::kStep) {
    const std::byte* at = base_ + h->step_offset;
    out.seqs.resize(h->num_seqs);
    out.tokens.resize(h->num_tokens);
    out.blocks.resize(h->num_blocks);
    std::memcpy(out.seqs.data(), at, out.seqs.size() * sizeof(LlmStepSeq));
    at += align8(out.seqs.size() * sizeof(LlmStepSeq));
    std::memcpy(out.tokens.data(), at, out.tokens.size() * sizeof(int32_t));
    at += align8(out.tokens.size() * sizeof(int32_t));
    if (!out.blocks.empty()) std::memcpy(out.blocks.data(), at, out.blocks.size() * sizeof(int32_t));
  }
  w->consumed.store(seen + 1, std::memory_order_release);
  return took;
}

// ---- ShardedStepModel ----

Status ShardedStepModel::validate(const LlmStep& step, const PagedKvCache& kv,
                                  int64_t prev_sampled) const {
  return shard_.validate(step, kv, prev_sampled);
}

void ShardedStepModel::enqueueStep(const LlmStep& step, PagedKvCache& kv, int32_t* sampled_out,
                                   llm::LlmTokenLogprobs* logprobs_out) {
  relay_seqs_.assign(step.seqs.begin(), step.seqs.end());
  for (LlmStepSeq& s : relay_seqs_) {
    s.state_offset = -1;
    s.sampling = llm::SamplingParams{};
  }
  const LlmStep relayed{relay_seqs_, step.tokens, step.block_ids, {}};
  if (Status st = seg_.publish(relayed); !st.isOk()) {
    log::error("cannot relay the step to the other ranks", {{"error", st}});
    seg_.abort();
    std::fflush(nullptr);
    _exit(kCollectiveExitCode);
  }
  shard_.enqueueStep(step, kv, nullptr, sampled_out, logprobs_out);
}

// ---- RankSupervisor ----

Status RankSupervisor::spawn(int32_t rank, const std::vector<std::string>& argv_in) {
  std::vector<std::string> args = argv_in;
  args.insert(args.end(),
              {"--rank", std::to_string(rank), "--rank-fd", std::to_string(seg_.fd())});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const int fd = seg_.fd();
  const pid_t pid = fork();
  if (pid < 0) return errnoStatus("fork (rank " + std::to_string(rank) + ")", errno);
  if (pid == 0) {
    // A rank never outlives rank 0 (which tulip kills with SIGKILL on a restart).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    fcntl(fd, F_SETFD, 0);  // the segment survives exec; nothing else rank 0 holds does
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  seg_.setPid(rank, pid);
  children_.emplace_back(rank, pid);
  return okStatus();
}

Status RankSupervisor::check() {
  for (auto it = children_.begin(); it != children_.end(); ++it) {
    int status = 0;
    if (waitpid(it->second, &status, WNOHANG) == it->second) {
      const std::string why = "rank " + std::to_string(it->first) + " (pid " +
                              std::to_string(it->second) + ") " + describeExit(status);
      children_.erase(it);
      seg_.abort();
      return unavailable(why);
    }
  }
  for (const auto& [rank, pid] : children_) {
    const int64_t age = seg_.heartbeatAgeMs(rank);
    if (age > heartbeat_timeout_.count()) {
      seg_.abort();
      return unavailable("rank " + std::to_string(rank) + " (pid " + std::to_string(pid) +
                         ") stopped beating: no heartbeat for " + std::to_string(age) + " ms");
    }
  }
  if (seg_.aborted()) return unavailable("a rank aborted the collectives");
  return okStatus();
}

Status RankSupervisor::waitReady(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    RETURN_IF_ERROR(check());
    bool all = true;
    for (const auto& [rank, pid] : children_) all = all && seg_.ready(rank);
    if (all) return okStatus();
    if (std::chrono::steady_clock::now() > end) {
      return deadlineExceeded("the other ranks were not ready within " +
                              std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void RankSupervisor::stop(std::chrono::milliseconds grace) {
  if (children_.empty()) return;
  seg_.publishStop();
  const auto end = std::chrono::steady_clock::now() + grace;
  while (!children_.empty() && std::chrono::steady_clock::now() < end) {
    for (auto it = children_.begin(); it != children_.end();) {
      if (waitpid(it->second, nullptr, WNOHANG) == it->second) {
        it = children_.erase(it);
      } else {
        ++it;
      }
    }
    if (!children_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  killAll();
}

void RankSupervisor::killAll() {
  for (const auto& [rank, pid] : children_) kill(pid, SIGKILL);
  for (const auto& [rank, pid] : children_) waitpid(pid, nullptr, 0);
  children_.clear();
}

std::vector<pid_t> RankSupervisor::pids() const {
  std::vector<pid_t> out;
  for (const auto& [rank, pid] : children_) out.push_back(pid);
  return out;
}

// ---- a follower ----

int runFollower(RankSegment& seg, int32_t rank, GptOssShard& shard, PagedKvCache& kv,
                Backend& backend, const std::function<bool()>& should_stop) {
  const pid_t parent = getppid();
  std::atomic<bool> running{true};
  // Its own thread: proves the process is scheduled (a SIGSTOPped or dead rank stops beating)
  // whatever its compute is doing; a wedged compute is caught by rank 0's step progress.
  std::thread beater([&] {
    while (running.load()) {
      seg.beat(rank);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  seg.setReady(rank);
  int code = 0;
  RelayedStep step;
  for (;;) {
    if (should_stop() || getppid() != parent) break;
    const RankSegment::Took took = seg.take(rank, std::chrono::milliseconds(50), step);
    if (took == RankSegment::Took::kNothing) continue;
    if (took == RankSegment::Took::kStop) break;
    const LlmStep view = step.view();
    if (Status st = shard.validate(view, kv); !st.isOk()) {
      // Rank 0 validated the same step against the same plan: a disagreement is a bug, and
      // this rank cannot take part in the step. End the world.
      log::error("relayed step refused", {{"rank", rank}, {"error", st}});
      seg.abort();
      code = 1;
      break;
    }
    backend.launch([&shard, view, &kv] { shard.enqueueStep(view, kv, nullptr, nullptr); });
    if (Status st = backend.synchronize(); !st.isOk()) {
      log::error("rank step failed", {{"rank", rank}, {"error", st}});
      seg.abort();
      code = 1;
      break;
    }
  }
  running = false;
  beater.join();
  return code;
}

}  // namespace garden::rose
