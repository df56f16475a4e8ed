#include "services/tulip/sched/embed_scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

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
  metrics::CounterFamily& dropped;
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
        r.counter("tulip_embed_dropped_sequences_total",
                  "Queued embed/score sequences dropped before reaching rose, by reason",
                  {"reason"}),
    };
    return m;
  }
};

bool compatible(const EmbedJob& a, const EmbedJob& b) {
  return a.kind == b.kind && a.pooling == b.pooling && a.normalize == b.normalize &&
         a.score_yes == b.score_yes && a.score_no == b.score_no;
}

// Samples older than ~20 batches weigh less than a third.
constexpr double kCostDecay = 0.95;
// Batches seen before the staging policy trusts the model.
constexpr uint32_t kCostMinSamples = 3;

}  // namespace

void BatchCostModel::add(uint64_t tokens, int64_t service_ns) {
  const double x = static_cast<double>(tokens), y = static_cast<double>(service_ns);
  // The error of the prediction this sample tests; from the third sample on (with two a line can
  // be fitted: a first proportional guess would poison the margin while it decays).
  if (n_ >= 2) {
    const double e = std::abs(y - static_cast<double>(predict(tokens)));
    err_ = n_ == 2 ? e : 0.8 * err_ + 0.2 * e;
  }
  w_ = w_ * kCostDecay + 1;
  sx_ = sx_ * kCostDecay + x;
  sy_ = sy_ * kCostDecay + y;
  sxx_ = sxx_ * kCostDecay + x * x;
  sxy_ = sxy_ * kCostDecay + x * y;
  ++n_;
}

int64_t BatchCostModel::predict(uint64_t tokens) const {
  if (n_ == 0 || w_ <= 0) return 0;
  const double x = static_cast<double>(tokens);
  const double det = w_ * sxx_ - sx_ * sx_;
  double a, b;
  if (det > 1e-6 * w_ * sxx_) {  // the sizes vary enough to separate fixed and per-token cost
    b = (w_ * sxy_ - sx_ * sy_) / det;
    a = (sy_ - b * sx_) / w_;
    if (b < 0) {
      b = 0;
      a = sy_ / w_;
    } else if (a < 0) {
      a = 0;
      b = sxy_ / sxx_;
    }
  } else if (sx_ > 0) {  // (about) one size seen: proportional
    a = 0;
    b = sy_ / sx_;
  } else {
    a = sy_ / w_;
    b = 0;
  }
  const double y = a + b * x;
  return y > 0 ? static_cast<int64_t>(y) : 0;
}

EmbedScheduler::EmbedScheduler(Worker& worker, SchedulerOptions opts)
    : worker_(worker), opts_(opts) {
  thread_ = std::thread([this] { loop(); });
}

EmbedScheduler::~EmbedScheduler() { stop(); }

void EmbedScheduler::poke() {
  // Only queued work needs the scheduler thread (a slot freed, readiness changed, a queued job
  // was cancelled); with an empty queue a completion does not wake it.
  bool work;
  {
    MutexLock l(mu_);
    work = !flows_.empty() || !to_finish_.empty();
  }
  if (work) cv_.notifyAll();
}

int64_t EmbedScheduler::nowNs() const {
  return opts_.clock_ns != nullptr ? opts_.clock_ns() : shm::monotonicNowNs();
}

int64_t EmbedScheduler::stageAtNs(int64_t now) const {
  // Immediate staging: switched off, a cap that leaves no staged batch (1) or no cap (0: every
  // free slot, the old behaviour), nothing running, or too few batches seen to predict.
  if (opts_.stage_lead_us == 0 || opts_.max_inflight_batches < 2 || inflight_.empty() ||
      cost_.samples() < kCostMinSamples) {
    return 0;
  }
  // The worker runs batches one after another: the work on it ends when the last one does.
  int64_t end = last_done_ns_;
  for (const auto& b : inflight_) end = std::max(end, b.submitted_ns) + cost_.predict(b.tokens);
  const int64_t at = end - int64_t{opts_.stage_lead_us} * 1000 - 2 * cost_.error();
  return at > now ? at : 0;
}

uint32_t EmbedScheduler::inflightCap() const {
  const uint32_t depth = worker_.depth();
  return opts_.max_inflight_batches == 0 ? depth : std::min(opts_.max_inflight_batches, depth);
}

uint32_t EmbedScheduler::inflightBatches() const {
  MutexLock l(mu_);
  return inflight_batches_;
}

uint32_t EmbedScheduler::maxInflightBatchesSeen() const {
  MutexLock l(mu_);
  return inflight_batches_max_;
}

Status EmbedScheduler::submit(std::shared_ptr<EmbedJob> job) {
  if (!worker_.ready()) return workerDown(worker_);
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
  Outbox out;
  {
    MutexLock l(mu_);
    if (stop_) return unavailable("tulip is shutting down");
    if (queued_tokens_ + tokens > opts_.queue_limit_tokens) {
      return resourceExhausted("queue full: " + std::to_string(queued_tokens_) +
                               " tokens queued, this request adds " + std::to_string(tokens) +
                               ", limit " + std::to_string(opts_.queue_limit_tokens) +
                               "; retry later");
    }
    queued_tokens_ += tokens;
    p->formed_at_enqueue = batches_formed_;
    // Its flow [TAG_EMBED_FAIR]: the queued flow of the same request id, else a new one at the back.
    Flow* flow = nullptr;
    const std::string& key = p->job->request_id;
    if (!key.empty()) {
      auto it = flow_by_key_.find(key);
      if (it != flow_by_key_.end()) flow = it->second;
    }
    if (flow == nullptr) {
      flows_.push_back(std::make_unique<Flow>());
      flow = flows_.back().get();
      flow->key = key;
      if (!key.empty()) flow_by_key_.emplace(key, flow);
    }
    flow->reqs.push_back(std::move(p));
    ++queued_requests_;
    // Below the cap this sends the request on from this thread at once [TAG_EMBED_INFLIGHT];
    // otherwise it waits for the completion that frees a place.
    dispatchLocked(out);
  }
  flush(out);
  return okStatus();
}

void EmbedScheduler::cancel(const std::shared_ptr<EmbedJob>& job) {
  job->cancelled = true;
  poke();
}

SchedulerStats EmbedScheduler::stats() const {
  MutexLock l(mu_);
  return SchedulerStats{queued_requests_, queued_tokens_, inflight_tokens_,
                        opts_.queue_limit_tokens, stage_at_ns_};
}

void EmbedScheduler::stop() {
  {
    MutexLock l(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notifyAll();
  if (thread_.joinable()) thread_.join();
  std::vector<std::shared_ptr<Pending>> fin;
  {
    MutexLock l(mu_);
    for (auto& f : flows_) {
      for (auto& p : f->reqs) {
        p->remaining -= p->job->inputs.size() - p->next_seq;
        p->next_seq = p->job->inputs.size();
        if (p->error.isOk()) p->error = cancelledError("tulip is shutting down");
        // Sequences still in flight finish the job through onResult.
        if (p->remaining == 0 && !p->finished) {
          p->finished = true;
          fin.push_back(p);
        }
      }
    }
    flows_.clear();
    flow_by_key_.clear();
    queued_requests_ = 0;
    queued_tokens_ = 0;
  }
  for (auto& p : fin) finish(p, p->error);
}

void EmbedScheduler::finish(const std::shared_ptr<Pending>& p, Status st) {
  if (p->job->on_done) p->job->on_done(st);
}

void EmbedScheduler::eraseFlow(size_t i) {
  if (!flows_[i]->key.empty()) flow_by_key_.erase(flows_[i]->key);
  flows_.erase(flows_.begin() + static_cast<std::ptrdiff_t>(i));
}

void EmbedScheduler::dropDead() {
  const int64_t now = shm::monotonicNowNs();
  const bool worker_down = !worker_.ready();
  for (size_t fi = 0; fi < flows_.size();) {
    auto& reqs = flows_[fi]->reqs;
    for (auto it = reqs.begin(); it != reqs.end();) {
      auto& p = *it;
      Status why;
      const char* reason = nullptr;
      if (p->job->cancelled.load()) {
        why = cancelledError("request cancelled by the caller");
        reason = "cancelled";
      } else if (p->job->deadline_ns > 0 && now >= p->job->deadline_ns) {
        why = deadlineExceeded("deadline expired while queued in tulip");
        reason = "deadline";
      } else if (worker_down) {
        why = workerDown(worker_);
        reason = "worker_down";
      }
      if (why.isOk()) {
        ++it;
        continue;
      }
      const size_t dropped = p->job->inputs.size() - p->next_seq;
      BatchMetrics::get().dropped.labels({reason}).inc(static_cast<double>(dropped));
      queued_tokens_ -= p->queued_tokens;
      p->queued_tokens = 0;
      p->next_seq = p->job->inputs.size();
      p->remaining -= dropped;
      if (p->error.isOk()) p->error = why;
      if (p->remaining == 0 && !p->finished) {
        p->finished = true;
        to_finish_.emplace_back(p, p->error);
      }
      it = reqs.erase(it);
      --queued_requests_;
    }
    if (reqs.empty()) {
      eraseFlow(fi);
    } else {
      ++fi;
    }
  }
}

std::vector<EmbedScheduler::Part> EmbedScheduler::formBatch(WorkBatch& batch) {
  std::vector<Part> parts;
  if (flows_.empty()) return parts;
  // The flow with the first turn opens the batch: its head request fixes what the batch is.
  const EmbedJob& head = *flows_.front()->reqs.front()->job;
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

  // Plan [TAG_EMBED_FAIR]: rounds in which every open flow, in turn order, takes its next sequence.
  // A flow closes for this batch when its next sequence does not fit the budget or its next
  // request cannot share the batch; the sequence cap ends the batch.
  struct Turn {
    Flow* flow;
    size_t req;  // index in flow->reqs of the request it takes from
    size_t seq;  // that request's next sequence, as planned
    bool open;
    std::vector<std::pair<size_t, size_t>> takes;  // (request index, sequences), in order
  };
  std::vector<Turn> turns;
  turns.reserve(flows_.size());
  for (auto& f : flows_) {
    const auto& p = f->reqs.front();
    if (compatible(head, *p->job)) turns.push_back(Turn{f.get(), 0, p->next_seq, true, {}});
  }
  uint64_t tokens = 0;
  uint64_t seqs = 0;
  for (bool progress = true; progress && seqs < seq_cap;) {
    progress = false;
    for (auto& t : turns) {
      if (seqs == seq_cap) break;
      if (!t.open) continue;
      auto& reqs = t.flow->reqs;
      if (t.seq == reqs[t.req]->job->inputs.size()) {
        // This request is all planned: the flow goes on with its next one, if it fits the batch.
        if (++t.req == reqs.size() || !compatible(head, *reqs[t.req]->job)) {
          t.open = false;
          continue;
        }
        t.seq = reqs[t.req]->next_seq;
      }
      const size_t len = reqs[t.req]->job->inputs[t.seq].size();
      if (tokens + len > budget) {
        t.open = false;
        continue;
      }
      tokens += len;
      ++seqs;
      ++t.seq;
      progress = true;
      if (t.takes.empty() || t.takes.back().first != t.req) t.takes.emplace_back(t.req, 0);
      ++t.takes.back().second;
    }
  }

  // Lay the batch out flow by flow, each request's sequences contiguous (onResult relies on it).
  const int64_t now = shm::monotonicNowNs();
  for (auto& t : turns) {
    for (const auto& [ri, n] : t.takes) {
      const std::shared_ptr<Pending>& p = t.flow->reqs[ri];
      EmbedJob& job = *p->job;
      if (!p->started) {
        p->started = true;
        job.queue_us = usSince(p->enqueued_ns);
        job.queue_batches = static_cast<uint32_t>(batches_formed_ - p->formed_at_enqueue);
        job.first_submit_ns = now;
      }
      for (size_t k = 0; k < n; ++k) {
        const auto& seq = job.inputs[p->next_seq];
        batch.tokens.insert(batch.tokens.end(), seq.begin(), seq.end());
        batch.seq_lens.push_back(static_cast<int32_t>(seq.size()));
        parts.push_back(Part{p, p->next_seq});
        p->queued_tokens -= seq.size();
        queued_tokens_ -= seq.size();
        ++p->next_seq;
      }
      if (job.deadline_ns > 0 && (batch.deadline_ns == 0 || job.deadline_ns < batch.deadline_ns))
        batch.deadline_ns = job.deadline_ns;
    }
  }
  if (parts.empty()) return parts;
  ++batches_formed_;

  // Requests now wholly in batches leave their flow; empty flows leave the queue; flows that took
  // part move behind those that did not (stable), so the next batch starts with the ones left out.
  for (const auto& t : turns) t.flow->took = !t.takes.empty();
  std::deque<std::unique_ptr<Flow>> waited, served;
  for (auto& f : flows_) {
    auto& reqs = f->reqs;
    while (!reqs.empty() && reqs.front()->next_seq == reqs.front()->job->inputs.size()) {
      reqs.pop_front();
      --queued_requests_;
    }
    if (reqs.empty()) {
      if (!f->key.empty()) flow_by_key_.erase(f->key);
      continue;
    }
    const bool took = std::exchange(f->took, false);
    (took ? served : waited).push_back(std::move(f));
  }
  flows_ = std::move(waited);
  for (auto& f : served) flows_.push_back(std::move(f));
  return parts;
}

void EmbedScheduler::onResult(std::vector<Part>& parts, uint64_t tokens, int64_t submitted_ns,
                              const WorkResult& r, bool dispatch_next, uint64_t batch_id) {
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
  if (st.isOk()) {
    static auto& ok_batches = bm.batches.labels({"ok"});
    ok_batches.inc();
    bm.step.observe(r.step_us / 1e6);
    bm.roundtrip.observe(batch_us / 1e6);
  } else {
    bm.batches.labels({std::string(statusCodeName(st.code()))}).inc();
  }
  std::vector<std::pair<std::shared_ptr<Pending>, Status>> done;
  Outbox out;
  {
    MutexLock l(mu_);
    inflight_tokens_ -= tokens;
    --inflight_batches_;
    // [TAG_EMBED_LATE_STAGE] The batch's service time as tulip sees it: from when it was handed
    // over, or from the previous completion if it was staged behind another batch.
    for (auto it = inflight_.begin(); it != inflight_.end(); ++it) {
      if (it->id != batch_id) continue;
      const int64_t t = nowNs();
      if (st.isOk()) {
        const int64_t start = std::max(it->submitted_ns, last_done_ns_);
        if (t > start) cost_.add(tokens, t - start);
      }
      last_done_ns_ = t;
      inflight_.erase(it);
      break;
    }
    const int64_t now = shm::monotonicNowNs();
    const Pending* last = nullptr;  // a request's sequences are contiguous in a batch
    for (size_t i = 0; i < parts.size(); ++i) {
      auto& p = parts[i].p;
      auto& job = *p->job;
      if (p.get() != last) {
        last = p.get();
        job.inference_us = usSince(job.first_submit_ns);
        job.step_us += r.step_us;
        job.trace.rose_taken_ns = r.rose_taken_ns;
        job.trace.rose_launched_ns = r.rose_launched_ns;
        job.trace.rose_ready_ns = r.rose_ready_ns;
        job.trace.rose_published_ns = r.rose_published_ns;
        job.trace.seen_ns = r.seen_ns;
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
        job.trace.done_ns = now;
        Status final_st = p->error;
        if (final_st.isOk() && job.cancelled.load())
          final_st = cancelledError("request cancelled by the caller");
        done.emplace_back(p, final_st);
      }
    }
    // Refill the freed place before answering [TAG_EMBED_INFLIGHT]: what queued up while this
    // batch ran goes out as one batch now, so the worker is not left idle during the replies.
    // Not after a failed batch: when the worker died, every batch it held is answered with the
    // reason first, and the queue is failed (or dispatched) by the scheduler thread afterwards.
    if (dispatch_next && st.isOk() && !stop_) dispatchLocked(out);
  }
  for (auto& [p, s] : done) finish(p, s);
  flush(out);
}

void EmbedScheduler::dispatchLocked(Outbox& out) {
  dropDead();
  if (!to_finish_.empty()) {
    for (auto& f : to_finish_) out.finished.push_back(std::move(f));
    to_finish_.clear();
  }
  const uint32_t cap = inflightCap();
  stage_at_ns_ = 0;
  while (!stop_ && !flows_.empty() && inflight_batches_ < cap && worker_.ready() &&
         worker_.inflight() < worker_.depth()) {
    // [TAG_EMBED_LATE_STAGE] With a batch running, let arrivals gather until shortly before it
    // ends; the scheduler thread (or the completion, whichever comes first) forms the batch then.
    if (const int64_t at = stageAtNs(nowNs()); at != 0) {
      stage_at_ns_ = at;
      if (loop_wake_ns_ != 0 && at < loop_wake_ns_) cv_.notifyAll();  // it sleeps past `at`
      break;
    }
    WorkBatch batch;
    std::vector<Part> parts = formBatch(batch);
    if (parts.empty()) break;
    const uint64_t tokens = batch.tokens.size();
    inflight_tokens_ += tokens;
    ++inflight_batches_;
    inflight_batches_max_ = std::max(inflight_batches_max_, inflight_batches_);
    auto& bm = BatchMetrics::get();
    bm.tokens.observe(static_cast<double>(tokens));
    bm.fill.observe(static_cast<double>(tokens) / opts_.max_batch_tokens);
    const int64_t t0 = shm::monotonicNowNs();
    // Stamped before the hand-off: once submitted, the result may arrive on the worker's thread
    // (it waits for mu_, held here, before touching the parts).
    for (auto& part : parts) part.p->job->trace.dispatched_ns = t0;
    auto shared_parts = std::make_shared<std::vector<Part>>(std::move(parts));
    const uint64_t id = ++next_batch_id_;
    inflight_.push_back(InflightBatch{id, nowNs(), tokens});
    // mu_ stays held: batches reach the worker in FIFO order whichever thread dispatches them.
    // (Lock order scheduler mu_ -> worker; the worker never calls back holding its own lock.)
    Status st = worker_.trySubmit(
        std::move(batch), [this, shared_parts, tokens, t0, id](const WorkResult& r) {
          onResult(*shared_parts, tokens, t0, r, /*dispatch_next=*/true, id);
        });
    if (!st.isOk()) {
      log::warn("batch submission failed", {{"error", st}});
      out.refused.push_back(
          Refused{std::move(*shared_parts), tokens, t0,
                  st.code() == StatusCode::kFailedPrecondition
                      ? unavailable("rose worker has no free slot: " + st.message())
                      : st,
                  id});
      break;
    }
  }
}

void EmbedScheduler::flush(Outbox& out) {
  for (auto& [p, s] : out.finished) finish(p, s);
  for (auto& r : out.refused) {
    WorkResult wr;
    wr.status = r.status;
    onResult(r.parts, r.tokens, r.submitted_ns, wr, /*dispatch_next=*/false, r.batch_id);
  }
}

void EmbedScheduler::loop() {
  // Dispatch normally happens inline (submit, completions); this thread covers what no request
  // or completion drives: a slot the worker released after its callback, readiness changes,
  // cancellations and deadlines of queued requests (checked at least every 20 ms), and a staged
  // batch held until its time [TAG_EMBED_LATE_STAGE].
  MutexLock l(mu_);
  while (!stop_) {
    Outbox out;
    dispatchLocked(out);
    if (!out.empty()) {
      l.unlock();
      flush(out);
      l.lock();
      continue;
    }
    const int64_t now = nowNs();
    int64_t wait_ns = 20'000'000;
    if (stage_at_ns_ != 0) wait_ns = std::clamp<int64_t>(stage_at_ns_ - now, 0, wait_ns);
    if (wait_ns == 0) continue;
    loop_wake_ns_ = now + wait_ns;
    cv_.waitFor(l, std::chrono::nanoseconds(wait_ns));
    loop_wake_ns_ = 0;
  }
}

}  // namespace garden::tulip
