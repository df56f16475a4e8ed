#pragma once
// FakeWorker: an in-process Worker for scheduler tests. Batches are held until the test completes
// them (completeNext), so tests control ordering exactly. Embedding rows are deterministic
// functions of the sequence (row[k] = sum(ids) + k), scores are the sequence length.

#include <deque>
#include <mutex>

#include "services/tulip/worker/worker.h"
#include "tests/fakes/tulip/last_failure.h"

namespace garden::tulip::testing {

class FakeWorker final : public Worker {
 public:
  explicit FakeWorker(uint32_t depth = 2, uint32_t hidden = 4) : depth_(depth) {
    facts_.hidden_size = hidden;
    facts_.max_seq_len = 64;
    facts_.vocab_size = 1000;
    facts_.has_score_head = 1;
  }

  bool ready() const override { return ready_; }
  shm::ModelFacts facts() const override { return facts_; }
  uint32_t depth() const override { return depth_; }
  uint32_t inflight() const override {
    std::lock_guard<std::mutex> l(mu_);
    return static_cast<uint32_t>(held_.size());
  }
  uint64_t maxBatchInts() const override { return max_ints_; }
  uint64_t maxBatchFloats() const override { return max_floats_; }
  Status trySubmit(WorkBatch batch, WorkDone done) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!ready_) return workerDown(*this);
    if (held_.size() >= depth_) return failedPrecondition("no free slot");
    batches_.push_back(batch);
    held_.push_back({std::move(batch), std::move(done)});
    return okStatus();
  }
  void setOnChange(std::function<void()> fn) override { on_change_ = std::move(fn); }

  // Completes the oldest held batch successfully (or with `fail`). Returns false if none held.
  bool completeNext(Status fail = Status()) {
    Held h;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (held_.empty()) return false;
      h = std::move(held_.front());
      held_.pop_front();
    }
    WorkResult r;
    r.status = fail;
    std::vector<float> rows;
    if (fail.isOk()) {
      const bool score = h.batch.kind == shm::BatchKind::kScore;
      const uint32_t cols = score ? 1 : facts_.hidden_size;
      size_t off = 0;
      for (int32_t len : h.batch.seq_lens) {
        float sum = 0;
        for (int32_t i = 0; i < len; ++i) sum += static_cast<float>(h.batch.tokens[off + i]);
        off += len;
        for (uint32_t k = 0; k < cols; ++k) rows.push_back(score ? float(len) : sum + k);
      }
      r.rows = rows;
      r.num_rows = static_cast<uint32_t>(h.batch.seq_lens.size());
      r.cols = cols;
    }
    h.done(r);
    if (on_change_) on_change_();
    return true;
  }
  size_t heldCount() const { return inflight(); }
  void setReady(bool r) {
    ready_ = r;
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
    return batches_;
  }

  shm::ModelFacts facts_;
  uint64_t max_ints_ = 1 << 20;
  uint64_t max_floats_ = 1 << 20;

 private:
  struct Held {
    WorkBatch batch;
    WorkDone done;
  };
  const uint32_t depth_;
  std::atomic<bool> ready_{true};
  std::function<void()> on_change_;
  mutable std::mutex mu_;
  std::deque<Held> held_;
  std::vector<WorkBatch> batches_;
  LastFailure last_failure_;
};

}  // namespace garden::tulip::testing
