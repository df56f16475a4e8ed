#pragma once
// ShmWorker: a rose process driven over the shared-memory channel, and its supervisor.
//
// Spawned mode (default): tulip creates the segment and starts rose as a child that dies with tulip
// (PR_SET_PDEATHSIG). Attach mode: rose runs beside tulip (a sidecar container), created the
// segment itself, and tulip maps it by name. Either way one supervisor thread owns the completion
// ring and watches the worker: process exit, a stale heartbeat (alive but stuck), a stuck step
// or a failed state mark it dead; every batch in flight is answered UNAVAILABLE with the reason,
// and the worker is restarted (spawned mode) or re-attached (attach mode) with exponential
// backoff.
//
// A stuck step [TAG_STEP_PROGRESS]: the heartbeat comes from rose's step thread, which beats
// even while the compute it launched is wedged, so it cannot tell a long step from a stuck one.
// A worker whose backend reports progress (shm::Channel::progressReported(): the CPU backend)
// is stuck when a batch is in flight and the channel's progress counter has not moved for
// progress_timeout (nor has a completion arrived): a live step of any length completes, a wedged
// or SIGSTOPped one is caught within progress_timeout plus one ~50 ms poll. A worker that does
// not report progress (the CUDA backend until its markProgress lands) is stuck when its oldest
// batch has been in flight longer than a limit scaled to the work: max(step_timeout,
// step_timeout_slack x the tokens in flight x the slowest per-token service time measured so far
// on this worker).
//
// Threads: trySubmit from the scheduler thread; callbacks run on the supervisor thread.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/shm/channel.h"
#include "services/tulip/worker/worker.h"

namespace garden::tulip {

struct ShmWorkerOptions {
  std::string shm_name;  // e.g. "/garden-tulip-50051"
  shm::Layout layout;
  bool attach = false;
  std::string rose_bin;                // spawned mode: the rose executable
  std::vector<std::string> rose_args;  // passed after `--shm-name NAME`
  std::chrono::milliseconds heartbeat_timeout{3000};
  // Workers that report progress: a batch in flight with no progress for this long means a stuck
  // worker (see the header comment).
  std::chrono::milliseconds progress_timeout{2500};
  // Workers that do not report progress: the floor of the per-step limit, which grows with the
  // work in flight (step_timeout_slack x tokens x the slowest measured time per token).
  std::chrono::milliseconds step_timeout{60000};
  uint32_t step_timeout_slack = 8;
  std::chrono::milliseconds start_timeout{600000};
  // Completion pacing [TAG_COMPLETION_SPIN]: while a batch is in flight, the supervisor sleeps
  // until shortly before its result is expected (from recent batches' service times), then spins
  // for it for at most this long instead of sleeping on the doorbell, which takes a futex wake-up
  // off every request's critical path. 0 = always sleep on the doorbell. Never spins while idle.
  std::chrono::microseconds completion_spin{200};
  std::chrono::milliseconds backoff_min{250};
  std::chrono::milliseconds backoff_max{30000};
  // Tests only (empty in service): called by trySubmit between its unlocked readiness check and
  // taking the lock, so a test can take the worker down inside that window (the self-deadlock
  // fixed in 392dd01; tests/unit/tulip/worker/shm_worker_test.cc).
  std::function<void()> test_before_submit_lock;
};

class ShmWorker final : public Worker {
 public:
  // Starts the supervisor (which spawns or attaches); returns at once. ready() turns true once
  // rose reports its model loaded.
  static Result<std::unique_ptr<ShmWorker>> start(ShmWorkerOptions opts);
  ~ShmWorker() override;

  bool ready() const override { return ready_.load(std::memory_order_acquire); }
  shm::ModelFacts facts() const override EXCLUDES(mu_);
  uint32_t depth() const override { return opts_.layout.slots; }
  uint32_t inflight() const override EXCLUDES(mu_);
  uint64_t maxBatchInts() const override;
  uint64_t maxBatchFloats() const override { return opts_.layout.output_bytes / sizeof(float); }
  uint64_t inputBytes() const override EXCLUDES(mu_);
  Status trySubmit(WorkBatch batch, WorkDone done) override EXCLUDES(mu_);
  // Thread-safe: the supervisor may already be running (and notifying) when this is called.
  void setOnChange(std::function<void()> fn) override EXCLUDES(on_change_mu_);

  // Observability.
  uint64_t restarts() const { return restarts_.load(); }
  pid_t workerPid() const { return worker_pid_.load(); }
  int32_t pid() const override { return static_cast<int32_t>(worker_pid_.load()); }
  // Takes mu_: never call it with mu_ held (a locked path reads last_failure_ itself).
  std::string lastFailure() const override EXCLUDES(mu_);

  // Stops the supervisor, answers in-flight work CANCELLED and terminates the child.
  void stop() EXCLUDES(mu_, sleep_mu_);

 private:
  explicit ShmWorker(ShmWorkerOptions opts);

  struct Inflight {
    bool busy = false;
    uint64_t batch_id = 0;
    WorkDone done;
    int64_t submitted_ns = 0;
    shm::BatchKind kind = shm::BatchKind::kEmbed;
    uint64_t tokens = 0;
  };

  // trySubmit of a kKvPull batch [TAG_KV_PULL].
  Status submitPull(WorkBatch batch, WorkDone done) EXCLUDES(mu_);
  // Stamps `d` (deadline, request id), pushes it and marks its slot busy with `done`.
  Status pushLocked(shm::BatchDesc& d, const WorkBatch& batch, WorkDone done) REQUIRES(mu_);
  // LateMasks::deliver of the step in `slot` [TAG_LATE_MASKS].
  bool deliverLateMasks(uint32_t slot, uint64_t batch_id, uint64_t offset, uint64_t words,
                        std::span<const uint32_t> masks) EXCLUDES(mu_);
  void run() EXCLUDES(mu_);
  // The next completion, paced as completion_spin says (supervisor thread). nullopt when none
  // came within ~50 ms, or on a wake-up to re-check state.
  std::optional<shm::Completion> nextCompletion() EXCLUDES(mu_);
  Status connect() EXCLUDES(mu_);
  void markDead(const std::string& reason) EXCLUDES(mu_);
  void notifyChange() EXCLUDES(on_change_mu_);
  bool sleepUnlessStopped(std::chrono::milliseconds d) EXCLUDES(sleep_mu_);
  void reapChild(bool force);
  // The reason the worker is stuck (see [TAG_STEP_PROGRESS] above), or empty (supervisor thread).
  std::string stuckReason(int64_t now_ns) EXCLUDES(mu_);
  // The supervisor thread's own view of channel_ (engaged while it serves a connected worker).
  // It is channel_'s only writer, so its reads need no lock; other threads lock mu_.
  shm::Channel& supervisorChannel() NO_THREAD_SAFETY_ANALYSIS { return *channel_; }

  const ShmWorkerOptions opts_;
  Mutex on_change_mu_;
  std::shared_ptr<const std::function<void()>> on_change_ GUARDED_BY(on_change_mu_);

  mutable Mutex mu_;
  std::optional<shm::Channel> channel_ GUARDED_BY(mu_);  // replaced only by the supervisor
  std::vector<Inflight> slots_ GUARDED_BY(mu_);
  uint64_t next_batch_id_ GUARDED_BY(mu_) = 1;
  shm::ModelFacts facts_ GUARDED_BY(mu_);
  std::string last_failure_ GUARDED_BY(mu_);

  // Supervisor thread only: service time of recent batches (EWMA; completion seen minus the later
  // of its submission and the previous completion) and when the previous completion was seen.
  int64_t service_ewma_ns_ = 0;
  int64_t last_seen_ns_ = 0;
  // Supervisor thread only [TAG_STEP_PROGRESS]: whether the current worker reports progress, the
  // last counter value seen and when it changed; the slowest service time per token measured
  // (for the scaled step limit of workers that do not report progress).
  bool progress_reported_ = false;
  uint64_t progress_seen_ = 0;
  int64_t progress_changed_ns_ = 0;
  int64_t max_ns_per_token_ = 0;

  std::atomic<bool> ready_{false};
  std::atomic<bool> stop_{false};
  std::atomic<pid_t> child_{-1};
  std::atomic<pid_t> worker_pid_{-1};
  std::atomic<uint64_t> restarts_{0};
  Mutex sleep_mu_;
  CondVar sleep_cv_;
  std::thread thread_;
};

}  // namespace garden::tulip
