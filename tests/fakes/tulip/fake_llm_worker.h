#pragma once
// FakeLlmWorker: an in-process LLM Worker for scheduler tests. Steps (kGenerate batches) are held
// until the test completes them, running the FakeLlmEngine (fake_llm_model.h) over the step, so
// tests see every step's exact layout and control ordering and failures. Steps run in the order
// they were submitted, and the engine resolves LlmStepSeq.prev_row from the step it ran before,
// as rose does with two steps in flight [TAG_LLM_PREV_TOKEN].
//
// Structured outputs (setLlmCaps): with kLlmCapTokenMask a sampled id its step's mask forbids
// becomes the lowest allowed id, as a masked draw would; with kLlmCapLateMask a step's late
// masks [TAG_LATE_MASKS] must have been delivered before completeNext() runs it (or refused:
// abandon_late, as a rose that stopped waiting; the step then runs unmasked).
//
// Prefill/decode disaggregation [TAG_KV_PULL]: setKvExport() makes a worker's cache an export
// other fake workers of the process can pull from (by name and pid); a worker with
// kLlmCapKvPull takes kKvPull batches, held and run in order with its steps like rose does.
//
// Threads: trySubmit from the scheduler thread; complete*/accessors from the test thread;
// LateMasks::deliver from the scheduler thread.

#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "services/tulip/worker/worker.h"
#include "tests/fakes/tulip/fake_llm_model.h"
#include "tests/fakes/tulip/last_failure.h"

namespace garden::tulip::testing {

class FakeLlmWorker final : public Worker {
 public:
  FakeLlmWorker(uint32_t kv_blocks, uint32_t block_size, uint32_t max_seq_len = 256,
                uint32_t vocab = 1000, int32_t eos = 999)
      : engine_(kv_blocks, block_size, vocab) {
    facts_.max_seq_len = max_seq_len;
    facts_.vocab_size = vocab;
    facts_.kv_num_blocks = kv_blocks;
    facts_.kv_block_size = block_size;
    facts_.eos_ids[0] = eos;
    std::strcpy(facts_.name, "fake-llm");
    std::strcpy(facts_.kind, "llm");
    // The fake engine samples by a fixed rule and returns no logprobs: no sampler state
    // (llm_caps 0), so tulip refuses requests that need it.
    std::strcpy(facts_.sampler, "fake");
  }

  bool ready() const override { return ready_; }
  shm::ModelFacts facts() const override {
    std::lock_guard<std::mutex> l(mu_);
    return facts_;
  }
  uint32_t depth() const override { return depth_; }
  uint32_t inflight() const override {
    std::lock_guard<std::mutex> l(mu_);
    return static_cast<uint32_t>(held_.size());
  }
  uint64_t maxBatchInts() const override { return 1 << 20; }
  uint64_t maxBatchFloats() const override { return 1 << 20; }
  uint64_t inputBytes() const override { return input_bytes_; }
  Status trySubmit(WorkBatch batch, WorkDone done) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!ready_) return workerDown(*this);
    if (held_.size() >= depth_) return failedPrecondition("no free slot");
    const bool pull = batch.kind == shm::BatchKind::kKvPull &&
                      (facts_.llm_caps & shm::kLlmCapKvPull) != 0;
    if (batch.kind != shm::BatchKind::kGenerate && !pull)
      return invalidArgument("not a kGenerate batch");
    const uint64_t id = ++next_id_;
    if (batch.late_masks) {
      batch.late_masks->deliver = [this, id](std::span<const uint32_t> masks) {
        std::lock_guard<std::mutex> g(mu_);
        for (Held& h : held_) {
          if (h.id != id) continue;
          if (abandon_late.load()) {
            h.abandoned = true;
            return false;
          }
          h.late.assign(masks.begin(), masks.end());
          h.delivered = true;
          ++late_delivered_;
          return true;
        }
        return false;
      };
    }
    submitted_.push_back(batch);
    held_.push_back({std::move(batch), std::move(done), id});
    return okStatus();
  }
  void setOnChange(std::function<void()> fn) override { on_change_ = std::move(fn); }

  // Runs the oldest held step through the fake model (or fails it with `fail`).
  // Returns false when no step is held, or the oldest one still waits for its late masks.
  bool completeNext(Status fail = Status()) {
    Held h;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (held_.empty()) return false;
      const Held& f = held_.front();
      if (fail.isOk() && f.batch.late_masks && !f.delivered && !f.abandoned) return false;
      h = std::move(held_.front());
      held_.pop_front();
    }
    WorkResult r;
    std::vector<int32_t> ids;
    if (!fail.isOk()) {
      r.status = fail;
    } else if (h.batch.kind == shm::BatchKind::kKvPull) {  // [TAG_KV_PULL]
      r.status = pull(h.batch);
      if (!r.status.isOk()) errors_.push_back(r.status.toString());
    } else {
      // The masks the draws honour: the step's own, or the late ones once delivered.
      const std::vector<uint32_t>& masks = h.batch.late_masks ? h.late : h.batch.masks;
      std::vector<int32_t> mask_of_row;
      for (const auto& q : h.batch.llm_seqs)
        if (q.sample) mask_of_row.push_back(q.mask_index);
      const uint32_t vocab = facts().vocab_size;
      const size_t words = (vocab + 31) / 32;
      auto pick = [&](size_t k, int32_t id) {
        const int32_t mi = k < mask_of_row.size() ? mask_of_row[k] : 0;
        if (mi <= 0 || masks.size() < static_cast<size_t>(mi) * words) return id;
        const uint32_t* m = masks.data() + static_cast<size_t>(mi - 1) * words;
        auto allowed = [&](uint32_t t) { return (m[t / 32] >> (t % 32)) & 1u; };
        if (allowed(static_cast<uint32_t>(id))) return id;
        for (uint32_t t = 0; t < vocab; ++t)
          if (allowed(t)) return static_cast<int32_t>(t);
        return id;
      };
      std::unique_lock<std::mutex> el(engine_mu_);
      auto res = engine_.step(h.batch.llm_seqs, h.batch.tokens, h.batch.block_ids, pick);
      el.unlock();
      if (!res.isOk()) {
        r.status = res.status();
        errors_.push_back(res.status().toString());
      } else {
        ids = *res;
        r.token_ids = ids;
        r.num_rows = static_cast<uint32_t>(ids.size());
        r.cols = 1;
      }
    }
    h.done(r);
    if (on_change_) on_change_();
    return true;
  }

  // Completes steps as they come until `pred` holds (or the limit passes).
  template <typename Pred>
  bool runUntil(Pred pred, std::chrono::milliseconds limit = std::chrono::milliseconds(10000)) {
    auto t0 = std::chrono::steady_clock::now();
    while (!pred()) {
      if (std::chrono::steady_clock::now() - t0 > limit) return false;
      if (!completeNext()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  }

  // Waits until `n` steps are held.
  bool waitHeld(size_t n, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
    auto t0 = std::chrono::steady_clock::now();
    while (inflight() < n) {
      if (std::chrono::steady_clock::now() - t0 > limit) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  }

  // [TAG_KV_PULL] This worker's cache is the export `name` of process `pid`.
  void setKvExport(const std::string& name, int32_t pid) {
    {
      std::lock_guard<std::mutex> l(mu_);
      std::snprintf(facts_.kv_export, sizeof(facts_.kv_export), "%s", name.c_str());
      pid_ = pid;
    }
    std::lock_guard<std::mutex> g(exportsMu());
    exports()[name] = this;
  }
  ~FakeLlmWorker() override {
    std::lock_guard<std::mutex> g(exportsMu());
    for (auto it = exports().begin(); it != exports().end();) {
      it = it->second == this ? exports().erase(it) : std::next(it);
    }
  }
  int32_t pid() const override { return pid_; }
  // Pulls run so far, and the blocks they copied.
  uint64_t pulls() const {
    std::lock_guard<std::mutex> l(mu_);
    return pulls_;
  }

  void setLlmCaps(uint32_t caps) {
    std::lock_guard<std::mutex> l(mu_);
    facts_.llm_caps = caps;
  }
  // Late masks delivered so far.
  uint64_t lateDelivered() const {
    std::lock_guard<std::mutex> l(mu_);
    return late_delivered_;
  }
  std::atomic<bool> abandon_late{false};

  void setReady(bool r) {
    ready_ = r;
    if (!r) {  // a restarted worker has an empty cache
      std::lock_guard<std::mutex> el(engine_mu_);
      engine_.reset();
    }
    if (on_change_) on_change_();
  }
  // The worker went down for `reason` (what lastFailure() reports from now on).
  void fail(std::string reason) {
    last_failure_.set(std::move(reason));
    setReady(false);
  }
  std::string lastFailure() const override { return last_failure_.get(); }
  std::vector<WorkBatch> submitted() const {
    std::lock_guard<std::mutex> l(mu_);
    return submitted_;
  }
  // Steps the fake model refused (a scheduler bug shows up here).
  const std::vector<std::string>& errors() const { return errors_; }

  uint64_t input_bytes_ = 1 << 20;
  uint32_t depth_ = 2;  // slots (set before the scheduler is made)

 private:
  struct Held {
    WorkBatch batch;
    WorkDone done;
    uint64_t id = 0;
    bool delivered = false;  // [TAG_LATE_MASKS]
    bool abandoned = false;
    std::vector<uint32_t> late;
  };
  // [TAG_KV_PULL] The exports of this process, by name.
  static std::mutex& exportsMu() {
    static std::mutex m;
    return m;
  }
  static std::map<std::string, FakeLlmWorker*>& exports() {
    static std::map<std::string, FakeLlmWorker*> m;
    return m;
  }
  Status pull(const WorkBatch& b) {
    FakeLlmWorker* src = nullptr;
    {
      std::lock_guard<std::mutex> g(exportsMu());
      auto it = exports().find(b.kv_source);
      if (it != exports().end()) src = it->second;
    }
    if (src == nullptr) return failedPrecondition("no kv export named " + b.kv_source);
    if (src->pid() != b.kv_source_pid) return failedPrecondition("kv export of another pid");
    if (b.kv_window_pairs != 0) return invalidArgument("the fake has no window pool");
    // The source's cache is read under its lock (its steps may run meanwhile on other blocks).
    std::lock_guard<std::mutex> sl(src->engine_mu_);
    std::lock_guard<std::mutex> dl(engine_mu_);
    Status st = engine_.copyBlocks(src->engine_, b.block_ids);
    if (st.isOk()) {
      std::lock_guard<std::mutex> l(mu_);
      ++pulls_;
    }
    return st;
  }
  int32_t pid_ = 0;
  uint64_t pulls_ = 0;
  // Guards engine_ against a pull reading it while this worker runs a step.
  std::mutex engine_mu_;
  uint64_t next_id_ = 0;
  uint64_t late_delivered_ = 0;
  mutable std::mutex mu_;
  shm::ModelFacts facts_;
  FakeLlmEngine engine_;
  std::atomic<bool> ready_{true};
  std::function<void()> on_change_;
  std::deque<Held> held_;
  std::vector<WorkBatch> submitted_;
  std::vector<std::string> errors_;
  LastFailure last_failure_;
};

}  // namespace garden::tulip::testing
