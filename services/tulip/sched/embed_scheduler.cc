#include "services/tulip/sched/embed_scheduler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "common/logging.h"
#include "common/metrics/registry.h"

namespace garden::tulip {
namespace {

using namespace std::chrono_literals;

uint64_t usSince(int64_t t0_ns) {
  int64_t d = shm::monotonicNowNs() - t0_ns;
  return d > 0 ? static_cast<uint64_t>(d / 1000) : 0;
}

struct BatchMetrics {
  metrics::Histogram& tokens;
  metrics::Histogram& fill;
  metrics::Histogram& step;
  metrics::Histogram& roundtrip;
  metrics::CounterFamily& batches;
  static BatchMetrics& get() {
    auto& r = metrics::Registry::global();
    static BatchMetrics m{
        r.histogram("tulip_batch_tokens", "Tokens per batch sent to rose", {},
                    {16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536})
            .get(),
        r.histogram("tulip_batch_fill_ratio", "Batch tokens / token budget", {},
                    {0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0})
            .get(),
        r.histogram("tulip_worker_step_seconds", "rose's own time for one batch").get(),
        r.histogram("tulip_batch_roundtrip_seconds", "Batch submitted until its result").get(),
        r.counter("tulip_batches_total", "Batches completed by rose, by outcome", {"outcome"}),
    };
    return m;
  }
};

bool compatible(const EmbedJob& a, const EmbedJob& b) {
  return a.kind == b.kind && a.pooling == b.pooling && a.normalize == b.normalize &&
         a.score_yes == b.score_yes && a.score_no == b.score_no;
}

}  // namespace

EmbedScheduler::EmbedScheduler(Worker& worker, SchedulerOptions opts)
    : worker_(worker), opts_(opts) {
  thread_ = std::thread([this] { loop(); });
}

EmbedScheduler::~EmbedScheduler() { stop(); }

void EmbedScheduler::poke() {
  { std::lock_guard<std::mutex> l(mu_); }
  cv_.notify_all();
}

Status EmbedScheduler::submit(std::shared_ptr<EmbedJob> job) {
  if (!worker_.ready()) return unavailable("rose worker is not ready (starting or restarting)");
  const shm::ModelFacts facts = worker_.facts();
  if (job->inputs.empty()) return invalidArgument("inputs: at least one sequence is required");
  const bool scoring = job->kind == shm::BatchKind::kScore;
  if (job->kind != shm::BatchKind::kEmbed && !scoring)
    return invalidArgument("unsupported batch kind for the embedding scheduler");
  if (scoring) {
    const bool head = job->score_yes < 0 && job->score_no < 0;
    if (head && !facts.has_score_head) {
      return invalidArgument(
          "yes_token/no_token: the model has no classification head, so both token ids are "
          "required");
    }
    if (!head && (job->score_yes < 0 || job->score_no < 0 ||
                  static_cast<uint32_t>(job->score_yes) >= facts.vocab_size ||
                  static_cast<uint32_t>(job->score_no) >= facts.vocab_size)) {
      return invalidArgument("yes_token/no_token: must both be valid token ids (vocab size " +
                             std::to_string(facts.vocab_size) + ")");
    }
  }
  if (!scoring && job->dimensions > facts.hidden_size) {
    return invalidArgument("dimensions: " + std::to_string(job->dimensions) +
                           " is larger than the model's " + std::to_string(facts.hidden_size));
  }
  const uint32_t cols = scoring ? 1 : facts.hidden_size;
  const uint64_t seq_cap = std::min<uint64_t>(opts_.max_batch_seqs,
                                              worker_.maxBatchFloats() / std::max(cols, 1u));
  const uint64_t budget = std::min<uint64_t>(opts_.max_batch_tokens,
                                             worker_.maxBatchInts() - std::max<uint64_t>(seq_cap, 1));
  if (seq_cap == 0) return internalError("channel output slot too small for one embedding");
  uint64_t tokens = 0;
  for (size_t i = 0; i < job->inputs.size(); ++i) {
    const auto& seq = job->inputs[i];
    if (seq.empty()) return invalidArgument("inputs[" + std::to_string(i) + "]: empty sequence");
    if (facts.max_seq_len > 0 && seq.size() > facts.max_seq_len) {
      return invalidArgument("inputs[" + std::to_string(i) + "]: " + std::to_string(seq.size()) +
                             " tokens, more than the model's maximum of " +
                             std::to_string(facts.max_seq_len));
    }
    if (seq.size() > budget) {
      return invalidArgument("inputs[" + std::to_string(i) + "]: " + std::to_string(seq.size()) +
                             " tokens, more than the batch budget of " + std::to_string(budget));
    }
    for (int32_t id : seq) {
      if (id < 0 || (facts.vocab_size > 0 && static_cast<uint32_t>(id) >= facts.vocab_size)) {
        return invalidArgument("inputs[" + std::to_string(i) + "]: token id " +
                               std::to_string(id) + " is outside the vocabulary [0, " +
                               std::to_string(facts.vocab_size) + ")");
      }
    }
    tokens += seq.size();
  }
  job->dim = scoring ? 1 : (job->dimensions ? job->dimensions : facts.hidden_size);
  job->values.assign(job->inputs.size() * job->dim, 0.0f);

  auto p = std::make_shared<Pending>();
  p->job = std::move(job);
  p->remaining = p->job->inputs.size();
  p->queued_tokens = tokens;
  p->enqueued_ns = shm::monotonicNowNs();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return unavailable("tulip is shutting down");
    if (queued_tokens_ + tokens > opts_.queue_limit_tokens) {
      return resourceExhausted("queue full: " + std::to_string(queued_tokens_) +
                               " tokens queued, this request adds " + std::to_string(tokens) +
                               ", limit " + std::to_string(opts_.queue_limit_tokens) +
                               "; retry later");
    }
    queued_tokens_ += tokens;
    queue_.push_back(std::move(p));
  }
  cv_.notify_all();
  return okStatus();
}

void EmbedScheduler::cancel(const std::shared_ptr<EmbedJob>& job) {
  job->cancelled = true;
  poke();
}

SchedulerStats EmbedScheduler::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return SchedulerStats{queue_.size(), queued_tokens_, inflight_tokens_, opts_.queue_limit_tokens};
}

void EmbedScheduler::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<std::shared_ptr<Pending>> fin;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& p : queue_) {
      p->remaining -= p->job->inputs.size() - p->next_seq;
      p->next_seq = p->job->inputs.size();
      if (p->error.isOk()) p->error = cancelledError("tulip is shutting down");
      // Sequences still in flight finish the job through onResult.
      if (p->remaining == 0 && !p->finished) {
        p->finished = true;
        fin.push_back(p);
      }
    }
    queue_.clear();
    queued_tokens_ = 0;
  }
  for (auto& p : fin) finish(p, p->error);
}

void EmbedScheduler::finish(const std::shared_ptr<Pending>& p, Status st) {
  if (p->job->on_done) p->job->on_done(st);
}

void EmbedScheduler::dropDead() {
  const int64_t now = shm::monotonicNowNs();
  const bool worker_down = !worker_.ready();
  for (auto it = queue_.begin(); it != queue_.end();) {
    auto& p = *it;
    Status why;
    if (p->job->cancelled.load()) {
      why = cancelledError("request cancelled by the caller");
    } else if (p->job->deadline_ns > 0 && now >= p->job->deadline_ns) {
      why = deadlineExceeded("deadline expired while queued in tulip");
    } else if (worker_down) {
      why = unavailable("rose worker is restarting; " + std::string("retry shortly"));
    }
    if (why.isOk()) {
      ++it;
      continue;
    }
    const size_t dropped = p->job->inputs.size() - p->next_seq;
    queued_tokens_ -= p->queued_tokens;
    p->queued_tokens = 0;
    p->next_seq = p->job->inputs.size();
    p->remaining -= dropped;
    if (p->error.isOk()) p->error = why;
    if (p->remaining == 0 && !p->finished) {
      p->finished = true;
      to_finish_.emplace_back(p, p->error);
    }
    it = queue_.erase(it);
  }
}

std::vector<EmbedScheduler::Part> EmbedScheduler::formBatch(WorkBatch& batch) {
  std::vector<Part> parts;
  if (queue_.empty()) return parts;
  const EmbedJob& head = *queue_.front()->job;
  const shm::ModelFacts facts = worker_.facts();
  const uint32_t cols = head.kind == shm::BatchKind::kScore ? 1 : std::max(facts.hidden_size, 1u);
  const uint64_t seq_cap =
      std::max<uint64_t>(1, std::min<uint64_t>(opts_.max_batch_seqs, worker_.maxBatchFloats() / cols));
  const uint64_t budget =
      std::min<uint64_t>(opts_.max_batch_tokens, worker_.maxBatchInts() - seq_cap);
  batch.kind = head.kind;
  batch.pooling = head.pooling;
  batch.normalize = head.normalize;
  batch.score_yes = head.score_yes;
  batch.score_no = head.score_no;
  batch.request_id = head.request_id;
  const int64_t now = shm::monotonicNowNs();
  uint64_t tokens = 0;
  bool full = false;
  for (auto& p : queue_) {
    if (full || !compatible(head, *p->job)) break;
    auto& job = *p->job;
    while (p->next_seq < job.inputs.size()) {
      const auto& seq = job.inputs[p->next_seq];
      if (tokens + seq.size() > budget || parts.size() + 1 > seq_cap) {
        full = true;
        break;
      }
      batch.tokens.insert(batch.tokens.end(), seq.begin(), seq.end());
      batch.seq_lens.push_back(static_cast<int32_t>(seq.size()));
      parts.push_back(Part{p, p->next_seq});
      tokens += seq.size();
      p->queued_tokens -= seq.size();
      queued_tokens_ -= seq.size();
      ++p->next_seq;
      if (!p->started) {
        p->started = true;
        job.queue_us = usSince(p->enqueued_ns);
        job.first_submit_ns = shm::monotonicNowNs();
      }
    }
    if (job.deadline_ns > 0 && (batch.deadline_ns == 0 || job.deadline_ns < batch.deadline_ns))
      batch.deadline_ns = job.deadline_ns;
  }
  (void)now;
  while (!queue_.empty() && queue_.front()->next_seq == queue_.front()->job->inputs.size())
    queue_.pop_front();
  return parts;
}

void EmbedScheduler::onResult(std::vector<Part> parts, uint64_t tokens, int64_t submitted_ns,
                              const WorkResult& r) {
  Status st = r.status;
  const bool scoring = !parts.empty() && parts[0].p->job->kind == shm::BatchKind::kScore;
  if (st.isOk()) {
    const uint32_t want_cols = scoring ? 1 : worker_.facts().hidden_size;
    if (r.num_rows != parts.size() || r.cols != want_cols) {
      st = internalError("rose returned " + std::to_string(r.num_rows) + "x" +
                         std::to_string(r.cols) + " for a batch of " +
                         std::to_string(parts.size()) + " sequences");
    }
  }
  const uint64_t batch_us = usSince(submitted_ns);
  auto& bm = BatchMetrics::get();
  bm.batches.labels({st.isOk() ? "ok" : std::string(statusCodeName(st.code()))}).inc();
  if (st.isOk()) {
    bm.step.observe(r.step_us / 1e6);
    bm.roundtrip.observe(batch_us / 1e6);
  }
  std::vector<std::pair<std::shared_ptr<Pending>, Status>> done;
  {
    std::lock_guard<std::mutex> l(mu_);
    inflight_tokens_ -= tokens;
    std::unordered_set<Pending*> seen;
    for (size_t i = 0; i < parts.size(); ++i) {
      auto& p = parts[i].p;
      auto& job = *p->job;
      if (seen.insert(p.get()).second) {
        job.inference_us = usSince(job.first_submit_ns);
        job.step_us += r.step_us;
      }
      if (st.isOk()) {
        const float* row = r.rows.data() + i * r.cols;
        float* dst = job.values.data() + parts[i].seq * job.dim;
        std::copy(row, row + job.dim, dst);
        if (!scoring && job.dim < r.cols && job.normalize) {
          double ss = 0;
          for (uint32_t k = 0; k < job.dim; ++k) ss += double(dst[k]) * dst[k];
          const float inv = ss > 0 ? static_cast<float>(1.0 / std::sqrt(ss)) : 0.0f;
          for (uint32_t k = 0; k < job.dim; ++k) dst[k] *= inv;
        }
      } else if (p->error.isOk()) {
        p->error = st;
      }
      if (--p->remaining == 0 && !p->finished) {
        p->finished = true;
        Status final_st = p->error;
        if (final_st.isOk() && job.cancelled.load())
          final_st = cancelledError("request cancelled by the caller");
        done.emplace_back(p, final_st);
      }
    }
  }
  for (auto& [p, s] : done) finish(p, s);
  cv_.notify_all();
}

void EmbedScheduler::loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    dropDead();
    if (!to_finish_.empty()) {
      auto fin = std::move(to_finish_);
      to_finish_.clear();
      l.unlock();
      for (auto& [p, s] : fin) finish(p, s);
      l.lock();
      continue;
    }
    if (queue_.empty() || !worker_.ready() || worker_.inflight() >= worker_.depth()) {
      cv_.wait_for(l, 20ms);
      continue;
    }
    WorkBatch batch;
    std::vector<Part> parts = formBatch(batch);
    if (parts.empty()) continue;
    const uint64_t tokens = batch.tokens.size();
    inflight_tokens_ += tokens;
    BatchMetrics::get().tokens.observe(static_cast<double>(tokens));
    BatchMetrics::get().fill.observe(static_cast<double>(tokens) / opts_.max_batch_tokens);
    l.unlock();
    const int64_t t0 = shm::monotonicNowNs();
    auto shared_parts = std::make_shared<std::vector<Part>>(parts);
    Status st = worker_.trySubmit(std::move(batch), [this, shared_parts, tokens, t0](
                                                        const WorkResult& r) {
      onResult(std::move(*shared_parts), tokens, t0, r);
    });
    if (!st.isOk()) {
      log::warn("batch submission failed", {{"error", st}});
      WorkResult r;
      r.status = st.code() == StatusCode::kFailedPrecondition
                     ? unavailable("rose worker has no free slot: " + st.message())
                     : st;
      onResult(std::move(parts), tokens, t0, r);
    }
    l.lock();
  }
}

}  // namespace garden::tulip
