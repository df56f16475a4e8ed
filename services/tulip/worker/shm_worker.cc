#include "services/tulip/worker/shm_worker.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "common/shm/llm_batch.h"

namespace garden::tulip {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kSeqLensAlign = 64;

uint64_t alignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string describeExit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "stopped (status " + std::to_string(status) + ")";
}

}  // namespace

ShmWorker::ShmWorker(ShmWorkerOptions opts) : opts_(std::move(opts)) {
  slots_.resize(opts_.layout.slots);
}

Result<std::unique_ptr<ShmWorker>> ShmWorker::start(ShmWorkerOptions opts) {
  if (opts.shm_name.empty()) return invalidArgument("shm_name is empty");
  if (!opts.attach) {
    if (opts.rose_bin.empty()) return invalidArgument("rose_bin is empty (or use attach mode)");
    if (access(opts.rose_bin.c_str(), X_OK) != 0)
      return failedPrecondition("rose binary not executable: " + opts.rose_bin);
  }
  std::unique_ptr<ShmWorker> w(new ShmWorker(std::move(opts)));
  w->thread_ = std::thread([p = w.get()] { p->run(); });
  return w;
}

ShmWorker::~ShmWorker() { stop(); }

void ShmWorker::stop() {
  if (stop_.exchange(true)) {
    if (thread_.joinable()) thread_.join();
    return;
  }
  { MutexLock l(sleep_mu_); }
  sleep_cv_.notifyAll();
  {
    MutexLock l(mu_);
    if (channel_) channel_->wakeAll();
  }
  if (thread_.joinable()) thread_.join();
}

shm::ModelFacts ShmWorker::facts() const {
  MutexLock l(mu_);
  return facts_;
}

uint32_t ShmWorker::inflight() const {
  MutexLock l(mu_);
  uint32_t n = 0;
  for (const auto& s : slots_) n += s.busy ? 1 : 0;
  return n;
}

uint64_t ShmWorker::inputBytes() const {
  MutexLock l(mu_);
  // Attach mode: rose sized the channel.
  return channel_ ? channel_->layout().input_bytes : opts_.layout.input_bytes;
}

uint64_t ShmWorker::maxBatchInts() const {
  // tokens + alignment padding + seq_lens must fit the input arena.
  return (opts_.layout.input_bytes - kSeqLensAlign) / sizeof(int32_t);
}

std::string ShmWorker::lastFailure() const {
  MutexLock l(mu_);
  return last_failure_;
}

Status ShmWorker::trySubmit(WorkBatch batch, WorkDone done) {
  // lastFailure() is called as ShmWorker's own (EXCLUDES(mu_)), not through the Worker interface,
  // so the analysis sees where it may be called; below the lock it reads last_failure_.
  if (!ready()) return workerDown(lastFailure());
  if (opts_.test_before_submit_lock) opts_.test_before_submit_lock();
  if (batch.kind == shm::BatchKind::kKvPull) return submitPull(std::move(batch), std::move(done));
  const bool generate = batch.kind == shm::BatchKind::kGenerate;
  if (generate ? batch.llm_seqs.empty() : batch.seq_lens.empty())
    return invalidArgument("empty batch");
  const uint64_t token_bytes = batch.tokens.size() * sizeof(int32_t);
  // kEmbed/kScore: tokens, then seq_lens. kGenerate: seqs, tokens, block ids
  // (common/shm/llm_batch.h) [TAG_LLM_STEP_FORMAT].
  const uint64_t seqs_bytes = batch.llm_seqs.size() * sizeof(llm::LlmStepSeq);
  const uint64_t tokens_off = generate ? shm::llmAlignUp(seqs_bytes) : 0;
  const uint64_t second_off = generate ? tokens_off + shm::llmAlignUp(token_bytes)
                                       : alignUp(token_bytes, kSeqLensAlign);
  const uint64_t second_bytes = generate ? batch.block_ids.size() * sizeof(int32_t)
                                         : batch.seq_lens.size() * sizeof(int32_t);
  // kGenerate: the sampler-state words after the block ids [TAG_LLM_SAMPLER_STATE].
  const uint64_t state_off = generate ? shm::llmAlignUp(second_off + second_bytes) : 0;
  const uint64_t state_bytes = generate ? batch.llm_state.size() * sizeof(int32_t) : 0;
  // [TAG_TOKEN_MASK] token bitmasks after the state words (BatchDesc.seqlens_offset).
  const uint64_t masks_off = generate ? shm::llmAlignUp(state_off + state_bytes) : 0;
  // [TAG_LATE_MASKS] Late masks: a ready word, padding, then room for them (written later).
  const bool late = generate && batch.late_mask_words > 0;
  if (late && (!batch.masks.empty() || !batch.late_masks)) {
    return invalidArgument("a step with late masks carries no early ones and a LateMasks");
  }
  const uint64_t masks_bytes =
      !generate ? 0
      : late    ? shm::kLateMaskHeaderBytes + batch.late_mask_words * sizeof(uint32_t)
                : batch.masks.size() * sizeof(uint32_t);
  const uint64_t need = !generate         ? second_off + second_bytes
                        : masks_bytes > 0 ? masks_off + masks_bytes
                                          : state_off + state_bytes;
  if (need > opts_.layout.input_bytes) {
    return invalidArgument("batch of " + std::to_string(batch.tokens.size()) +
                           " tokens does not fit the channel's input arena");
  }
  MutexLock l(mu_);
  if (!channel_ || !ready()) return workerDown(last_failure_);  // not lastFailure(): takes mu_
  if (need > channel_->layout().input_bytes) {
    return invalidArgument("batch of " + std::to_string(batch.tokens.size()) +
                           " tokens does not fit the channel's input arena");
  }
  uint32_t slot = 0;
  while (slot < slots_.size() && slots_[slot].busy) ++slot;
  if (slot == slots_.size()) return failedPrecondition("no free slot");
  auto arena = channel_->inputArena(slot);
  if (generate) std::memcpy(arena.data(), batch.llm_seqs.data(), seqs_bytes);
  std::memcpy(arena.data() + tokens_off, batch.tokens.data(), token_bytes);
  std::memcpy(arena.data() + second_off,
              generate ? batch.block_ids.data() : batch.seq_lens.data(), second_bytes);
  if (state_bytes > 0) std::memcpy(arena.data() + state_off, batch.llm_state.data(), state_bytes);
  if (late) {
    shm::initLateMasks(arena.data() + masks_off);
  } else if (masks_bytes > 0) {
    std::memcpy(arena.data() + masks_off, batch.masks.data(), masks_bytes);
  }
  shm::BatchDesc d;
  d.batch_id = next_batch_id_++;
  d.slot = slot;
  d.kind = batch.kind;
  d.num_seqs = static_cast<uint32_t>(generate ? batch.llm_seqs.size() : batch.seq_lens.size());
  d.num_tokens = static_cast<uint32_t>(batch.tokens.size());
  d.pooling = batch.pooling;
  d.normalize = batch.normalize ? 1 : 0;
  d.score_yes = batch.score_yes;
  d.score_no = batch.score_no;
  d.tokens_offset = tokens_off;
  if (generate) {
    d.seqs_offset = 0;
    d.blocks_offset = second_off;
    d.num_blocks = static_cast<uint32_t>(batch.block_ids.size());
    d.state_offset = state_off;
    d.num_state = static_cast<uint32_t>(batch.llm_state.size());
    d.seqlens_offset = masks_bytes > 0 ? masks_off : 0;
    d.flags = late ? shm::kBatchLateMasks : 0;
  } else {
    d.seqlens_offset = second_off;
  }
  RETURN_IF_ERROR(pushLocked(d, batch, std::move(done)));
  slots_[slot].tokens = batch.tokens.size();
  if (late) {
    batch.late_masks->deliver = [this, slot, id = d.batch_id, off = masks_off,
                                 words = batch.late_mask_words](std::span<const uint32_t> masks) {
      return deliverLateMasks(slot, id, off, words, masks);
    };
  }
  return okStatus();
}

// [TAG_KV_PULL] A KvPullDesc at offset 0, the pairs after it (common/shm/llm_batch.h).
Status ShmWorker::submitPull(WorkBatch batch, WorkDone done) {
  const uint64_t entries = batch.block_ids.size();
  if (entries == 0 || entries % 2 != 0 || batch.kv_window_pairs * 2ull > entries ||
      batch.kv_source.empty() || batch.kv_source.size() >= sizeof(shm::KvPullDesc::source)) {
    return invalidArgument("kv pull: pairs and a source name are required");
  }
  const uint64_t pairs_off = shm::llmAlignUp(sizeof(shm::KvPullDesc));
  const uint64_t need = pairs_off + entries * sizeof(int32_t);
  MutexLock l(mu_);
  if (!channel_ || !ready()) return workerDown(last_failure_, "rose worker is restarting");
  if (need > channel_->layout().input_bytes) {
    return invalidArgument("kv pull of " + std::to_string(entries / 2) +
                           " blocks does not fit the channel's input arena");
  }
  uint32_t slot = 0;
  while (slot < slots_.size() && slots_[slot].busy) ++slot;
  if (slot == slots_.size()) return failedPrecondition("no free slot");
  auto arena = channel_->inputArena(slot);
  shm::KvPullDesc pd;
  std::memcpy(pd.source, batch.kv_source.data(), batch.kv_source.size());
  pd.source_pid = batch.kv_source_pid;
  pd.num_window_pairs = batch.kv_window_pairs;
  pd.num_pairs = static_cast<uint32_t>(entries / 2) - batch.kv_window_pairs;
  std::memcpy(arena.data(), &pd, sizeof(pd));
  std::memcpy(arena.data() + pairs_off, batch.block_ids.data(), entries * sizeof(int32_t));
  shm::BatchDesc d;
  d.batch_id = next_batch_id_++;
  d.slot = slot;
  d.kind = shm::BatchKind::kKvPull;
  d.seqs_offset = 0;
  d.blocks_offset = pairs_off;
  d.num_blocks = static_cast<uint32_t>(entries);
  return pushLocked(d, batch, std::move(done));
}

Status ShmWorker::pushLocked(shm::BatchDesc& d, const WorkBatch& batch, WorkDone done) {
  d.deadline_ns = batch.deadline_ns;
  std::strncpy(d.request_id, batch.request_id.c_str(), sizeof(d.request_id) - 1);
  // The ring has one entry per slot and this slot is free, so the push fails only when rose
  // completed a batch it never took from the ring: a peer that broke the protocol. That is
  // refused like a worker that is down (the slot stays free), never an abort of tulip.
  if (!channel_->trySubmit(d)) {
    return unavailable("rose's submission ring is full although slot " + std::to_string(d.slot) +
                       " is free: the worker completes batches it has not taken; retry shortly");
  }
  slots_[d.slot] = Inflight{true, d.batch_id, std::move(done), shm::monotonicNowNs(), batch.kind};
  return okStatus();
}

bool ShmWorker::deliverLateMasks(uint32_t slot, uint64_t batch_id, uint64_t offset, uint64_t words,
                                 std::span<const uint32_t> masks) {
  MutexLock l(mu_);
  // The step must still hold its slot: after its completion (or a restart) the arena is not its.
  if (!channel_ || slot >= slots_.size() || !slots_[slot].busy ||
      slots_[slot].batch_id != batch_id || masks.size() != words) {
    return false;
  }
  std::byte* region = channel_->inputArena(slot).data() + offset;
  std::memcpy(region + shm::kLateMaskHeaderBytes, masks.data(), masks.size_bytes());
  return shm::publishLateMasks(region);
}

void ShmWorker::setOnChange(std::function<void()> fn) {
  auto f = std::make_shared<const std::function<void()>>(std::move(fn));
  MutexLock l(on_change_mu_);
  on_change_ = std::move(f);
}

void ShmWorker::notifyChange() {
  std::shared_ptr<const std::function<void()>> f;
  {
    MutexLock l(on_change_mu_);
    f = on_change_;
  }
  if (f && *f) (*f)();
}

bool ShmWorker::sleepUnlessStopped(std::chrono::milliseconds d) {
  MutexLock l(sleep_mu_);
  sleep_cv_.waitFor(l, d, [this] { return stop_.load(); });
  return !stop_.load();
}

Status ShmWorker::connect() {
  if (opts_.attach) {
    ASSIGN_OR_RETURN(shm::Channel ch, shm::Channel::attach(opts_.shm_name));
    if (ch.layout().slots == 0) return failedPrecondition("attached channel has no slots");
    MutexLock l(mu_);
    slots_.assign(ch.layout().slots, Inflight{});
    channel_.emplace(std::move(ch));
    worker_pid_ = channel_->workerPid();
    return okStatus();
  }
  ASSIGN_OR_RETURN(shm::Channel ch, shm::Channel::create(opts_.shm_name, opts_.layout));
  std::vector<std::string> args = {opts_.rose_bin, "--shm-name", opts_.shm_name};
  args.insert(args.end(), opts_.rose_args.begin(), opts_.rose_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return errnoStatus("fork", errno);
  if (pid == 0) {
    // The worker must never outlive tulip holding the GPU and the segment.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    // tulip blocks SIGTERM/SIGINT to take them with sigwait; rose must get them normally.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  child_ = pid;
  worker_pid_ = pid;
  MutexLock l(mu_);
  slots_.assign(opts_.layout.slots, Inflight{});
  channel_.emplace(std::move(ch));
  return okStatus();
}

void ShmWorker::reapChild(bool force) {
  pid_t pid = child_.load();
  if (pid <= 0) return;
  if (force) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  child_ = -1;
}

std::string ShmWorker::stuckReason(int64_t now_ns) {
  // [TAG_STEP_PROGRESS] Only this thread replaces channel_, so it reads it without mu_.
  const uint64_t progress = supervisorChannel().progress();
  if (progress != progress_seen_) {
    progress_seen_ = progress;
    progress_changed_ns_ = now_ns;
  }
  int64_t oldest = 0;
  uint64_t tokens = 0;
  {
    MutexLock l(mu_);
    for (const auto& sl : slots_) {
      if (!sl.busy) continue;
      if (oldest == 0 || sl.submitted_ns < oldest) oldest = sl.submitted_ns;
      tokens += sl.tokens;
    }
  }
  if (oldest == 0) return {};
  const std::string who = "rose worker (pid " + std::to_string(worker_pid_.load()) + ")";
  if (progress_reported_) {
    // Quiet since the later of: the counter's last move, the last completion, the oldest batch's
    // submission (an idle worker's counter is still, and that is fine).
    const int64_t since = std::max({progress_changed_ns_, last_seen_ns_, oldest});
    if (now_ns - since > opts_.progress_timeout.count() * 1000000) {
      return who + " is stuck: no step progress for " +
             std::to_string(opts_.progress_timeout.count()) + " ms with a batch in flight";
    }
    return {};
  }
  const int64_t scaled_ms = static_cast<int64_t>(opts_.step_timeout_slack) *
                            static_cast<int64_t>(tokens) * max_ns_per_token_ / 1000000;
  const int64_t limit_ms = std::max<int64_t>(opts_.step_timeout.count(), scaled_ms);
  if (now_ns - oldest > limit_ms * 1000000) {
    return who + " is stuck: a step did not complete within " + std::to_string(limit_ms) + " ms";
  }
  return {};
}

void ShmWorker::markDead(const std::string& reason) {
  ready_ = false;
  std::vector<Inflight> lost;
  {
    MutexLock l(mu_);
    last_failure_ = reason;
    for (auto& s : slots_) {
      if (s.busy) lost.push_back(std::move(s));
      s = Inflight{};
    }
    channel_.reset();
  }
  log::error("rose worker lost", {{"reason", reason}, {"inflight_batches", lost.size()}});
  WorkResult r;
  r.status = unavailable(reason);
  for (auto& s : lost) s.done(r);
  reapChild(/*force=*/true);
  notifyChange();
}

std::optional<shm::Completion> ShmWorker::nextCompletion() {
  // [TAG_COMPLETION_SPIN] Only this thread replaces channel_, so it reads it without mu_.
  shm::Channel& ch = supervisorChannel();
  const int64_t window_ns = static_cast<int64_t>(opts_.completion_spin.count()) * 1000;
  int64_t oldest = 0;
  if (window_ns > 0 && service_ewma_ns_ > 0) {
    MutexLock l(mu_);
    for (const auto& sl : slots_)
      if (sl.busy && sl.done && (oldest == 0 || sl.submitted_ns < oldest)) oldest = sl.submitted_ns;
  }
  if (oldest == 0) return ch.waitCompletion(50ms);  // idle (or no estimate yet): sleep
  const int64_t expected = std::max(oldest, last_seen_ns_) + service_ewma_ns_;
  const int64_t spin_from = expected - std::min(window_ns / 2, service_ewma_ns_ / 2);
  const int64_t spin_until = spin_from + window_ns;
  int64_t now = shm::monotonicNowNs();
  if (now >= spin_until) return ch.waitCompletion(50ms, /*spin=*/false);
  if (now < spin_from) {
    // Asleep until the window opens; an early result still rings the doorbell.
    auto c = ch.waitCompletion(std::chrono::microseconds((spin_from - now) / 1000 + 1),
                               /*spin=*/false);
    if (c) return c;
    now = shm::monotonicNowNs();
    if (now < spin_from) return std::nullopt;  // woken to re-check state (stop, wakeAll)
  }
  while (now < spin_until && !stop_.load(std::memory_order_relaxed)) {
    if (auto c = ch.tryTakeCompletion()) return c;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    now = shm::monotonicNowNs();
  }
  return ch.waitCompletion(50ms, /*spin=*/false);
}

void ShmWorker::run() {
  auto backoff = opts_.backoff_min;
  bool first = true;
  while (!stop_) {
    // --- (re)connect ---
    if (!first) {
      restarts_++;
      if (!sleepUnlessStopped(backoff)) break;
      backoff = std::min(backoff * 2, opts_.backoff_max);
    }
    first = false;
    Status st = connect();
    if (!st.isOk()) {
      {
        MutexLock l(mu_);
        last_failure_ = st.toString();
      }
      if (!opts_.attach || st.code() != StatusCode::kNotFound)
        log::warn("rose worker connect failed", {{"error", st}});
      continue;
    }
    shm::Channel& ch = supervisorChannel();  // this connection's, until markDead() drops it
    // --- wait for the model to load ---
    const int64_t started = shm::monotonicNowNs();
    bool up = false;
    while (!stop_) {
      shm::WorkerState state;
      {
        MutexLock l(mu_);
        state = channel_->state();
      }
      if (state == shm::WorkerState::kReady) {
        // Attach mode: a segment left by a sidecar that was killed still says kReady; wait for
        // the replacement to create a fresh one instead of serving a dead worker.
        const int32_t wpid = ch.workerPid();
        if (opts_.attach && wpid > 0 && kill(wpid, 0) != 0) {
          markDead("rose worker (pid " + std::to_string(wpid) + ") is gone (stale segment)");
          break;
        }
        up = true;
        break;
      }
      if (state == shm::WorkerState::kFailed) {
        markDead("rose worker failed to start (see its log)");
        break;
      }
      pid_t pid = child_.load();
      int status = 0;
      if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid) {
        child_ = -1;
        markDead("rose worker (pid " + std::to_string(pid) + ") " + describeExit(status) +
                 " while starting");
        break;
      }
      if (opts_.attach && ch.workerPid() > 0 && kill(ch.workerPid(), 0) != 0) {
        markDead("rose worker (pid " + std::to_string(ch.workerPid()) + ") is gone while starting");
        break;
      }
      if (shm::monotonicNowNs() - started > opts_.start_timeout.count() * 1000000) {
        markDead("rose worker did not become ready within " +
                 std::to_string(opts_.start_timeout.count()) + " ms");
        break;
      }
      sleepUnlessStopped(20ms);
    }
    if (!up) continue;
    shm::ModelFacts facts;
    {
      MutexLock l(mu_);
      facts_ = facts = channel_->modelFacts();
      worker_pid_ = channel_->workerPid() > 0 ? channel_->workerPid() : child_.load();
    }
    progress_reported_ = supervisorChannel().progressReported();  // [TAG_STEP_PROGRESS]
    progress_seen_ = supervisorChannel().progress();
    progress_changed_ns_ = shm::monotonicNowNs();
    ready_ = true;
    backoff = opts_.backoff_min;
    log::info("rose worker ready", {{"pid", static_cast<int64_t>(worker_pid_.load())},
                                    {"model", std::string(facts.name)},
                                    {"hidden_size", facts.hidden_size},
                                    {"reports_progress", progress_reported_}});
    notifyChange();

    // --- serve: take completions, watch liveness ---
    while (!stop_) {
      // Only this thread replaces channel_, so it reads it (ch) without mu_.
      auto c = nextCompletion();
      if (c) {
        const int64_t seen_ns = shm::monotonicNowNs();
        Inflight entry;
        {
          MutexLock l(mu_);
          if (c->slot < slots_.size() && slots_[c->slot].busy &&
              slots_[c->slot].batch_id == c->batch_id) {
            entry = std::move(slots_[c->slot]);
            slots_[c->slot].done = nullptr;  // stays busy until the callback has read the arena
          }
        }
        if (entry.done) {
          WorkResult r;
          if (c->status_code != 0) {
            c->message[sizeof(c->message) - 1] = '\0';
            r.status = Status(static_cast<StatusCode>(c->status_code), c->message);
          } else if (entry.kind == shm::BatchKind::kGenerate) {
            // One int32 sampled id per sampling sequence, then (cols kLlmLogprobsCols) one
            // LlmTokenLogprobs each (common/shm/llm_batch.h).
            const bool lp = c->cols == shm::kLlmLogprobsCols;
            const uint64_t bytes = uint64_t{c->rows} * (lp ? shm::kLlmLogprobsCols : 1) * 4;
            if ((c->cols != 1 && !lp) || bytes > opts_.layout.output_bytes ||
                c->output_bytes != bytes) {
              r.status = internalError("rose returned a malformed LLM step result (" +
                                       std::to_string(c->rows) + " ids, " +
                                       std::to_string(c->output_bytes) + " bytes)");
            } else {
              auto out = ch.outputArena(c->slot);
              r.token_ids = {reinterpret_cast<const int32_t*>(out.data()), c->rows};
              if (lp) {
                r.logprobs = {reinterpret_cast<const llm::LlmTokenLogprobs*>(
                                  out.data() + sizeof(int32_t) * c->rows),
                              c->rows};
              }
              r.num_rows = c->rows;
              r.cols = 1;
            }
          } else {
            const uint64_t floats = uint64_t{c->rows} * c->cols;
            if (floats * sizeof(float) > opts_.layout.output_bytes ||
                c->output_bytes != floats * sizeof(float)) {
              r.status = internalError("rose returned an output larger than its slot");
            } else {
              auto out = ch.outputArena(c->slot);
              r.rows = {reinterpret_cast<const float*>(out.data()), floats};
              r.num_rows = c->rows;
              r.cols = c->cols;
            }
          }
          r.step_us = c->step_us;
          r.rose_taken_ns = c->taken_ns;
          r.rose_launched_ns = c->launched_ns;
          r.rose_ready_ns = c->ready_ns;
          r.rose_published_ns = c->published_ns;
          r.seen_ns = seen_ns;
          if (c->status_code == 0) {
            const int64_t service = seen_ns - std::max(entry.submitted_ns, last_seen_ns_);
            service_ewma_ns_ =
                service_ewma_ns_ == 0 ? service : (7 * service_ewma_ns_ + service) / 8;
            max_ns_per_token_ = std::max<int64_t>(
                max_ns_per_token_,
                service / static_cast<int64_t>(std::max<uint64_t>(1, entry.tokens)));
          }
          last_seen_ns_ = seen_ns;
          entry.done(r);
          {
            MutexLock l(mu_);
            slots_[c->slot] = Inflight{};
          }
          notifyChange();
        } else {
          log::warn("completion for an unknown batch dropped",
                    {{"batch_id", c->batch_id}, {"slot", c->slot}});
        }
        continue;
      }
      // Liveness.
      pid_t pid = child_.load();
      int status = 0;
      if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid) {
        child_ = -1;
        markDead("rose worker (pid " + std::to_string(pid) + ") " + describeExit(status));
        break;
      }
      if (opts_.attach && ch.workerPid() > 0 && kill(ch.workerPid(), 0) != 0) {
        markDead("rose worker (pid " + std::to_string(ch.workerPid()) + ") is gone");
        break;
      }
      if (ch.heartbeatStale(opts_.heartbeat_timeout)) {
        markDead("rose worker (pid " + std::to_string(worker_pid_.load()) +
                 ") stopped answering: no heartbeat for " +
                 std::to_string(opts_.heartbeat_timeout.count()) + " ms");
        break;
      }
      if (std::string stuck = stuckReason(shm::monotonicNowNs()); !stuck.empty()) {
        markDead(stuck);
        break;
      }
      if (ch.state() == shm::WorkerState::kFailed || ch.state() == shm::WorkerState::kStopping) {
        markDead("rose worker reported it is " +
                 std::string(ch.state() == shm::WorkerState::kFailed ? "failed" : "stopping"));
        break;
      }
    }
  }
  // Shutdown: answer whatever is still in flight, then stop the child politely.
  ready_ = false;
  std::vector<Inflight> lost;
  {
    MutexLock l(mu_);
    for (auto& s : slots_) {
      if (s.busy && s.done) lost.push_back(std::move(s));
      s = Inflight{};
    }
  }
  WorkResult r;
  r.status = cancelledError("tulip is shutting down");
  for (auto& s : lost) s.done(r);
  pid_t pid = child_.load();
  if (pid > 0) {
    kill(pid, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) {
        child_ = -1;
        break;
      }
      usleep(20000);
    }
    if (child_.load() > 0) reapChild(/*force=*/true);
  }
  MutexLock l(mu_);
  channel_.reset();
}

}  // namespace garden::tulip
