#include "services/tulip/llm/llm_scheduler.h"

#include <algorithm>
#include <random>

#include "common/logging.h"
#include "common/metrics/registry.h"
#include "common/shm/llm_batch.h"

namespace garden::tulip {
namespace {

using namespace std::chrono_literals;

struct LlmMetrics {
  metrics::Gauge& running;
  metrics::Gauge& waiting;
  metrics::Gauge& kv_used;
  metrics::Gauge& kv_free;
  metrics::Gauge& kv_window_used;
  metrics::Gauge& kv_window_free;
  metrics::Counter& cache_hit_tokens;
  metrics::Counter& cache_query_tokens;
  metrics::Counter& shared_prompt_tokens;
  metrics::Counter& computed_prompt_tokens;
  metrics::Counter& preemptions;
  metrics::Counter& generated;
  metrics::Counter& masked_steps;
  metrics::Counter& masks;
  metrics::Counter& mask_fill_seconds;
  metrics::Counter& late_mask_steps;
  metrics::Histogram& ttft;
  metrics::Histogram& itl;
  metrics::Histogram& step_tokens;
  metrics::Histogram& step_seconds;
  static LlmMetrics& get() {
    auto& r = metrics::Registry::global();
    static LlmMetrics m{
        r.gauge("tulip_llm_running_sequences", "Sequences being generated").get(),
        r.gauge("tulip_llm_waiting_sequences", "Sequences waiting for KV blocks or a slot").get(),
        r.gauge("tulip_kv_blocks_used", "KV cache blocks referenced by sequences").get(),
        r.gauge("tulip_kv_blocks_free", "KV cache blocks free (including unreferenced cached)")
            .get(),
        r.gauge("tulip_kv_window_blocks_used",
                "Blocks of the sliding-window layers' own KV pool referenced by sequences (0 "
                "without one)")
            .get(),
        r.gauge("tulip_kv_window_blocks_free",
                "Blocks of the sliding-window layers' own KV pool free (including unreferenced "
                "cached; 0 without one)")
            .get(),
        r.counter("tulip_prefix_cache_hit_tokens_total",
                  "Prompt tokens served from the prefix cache")
            .get(),
        r.counter("tulip_prefix_cache_query_tokens_total",
                  "Prompt tokens looked up in the prefix cache")
            .get(),
        r.counter("tulip_prompt_tokens_shared_total",
                  "Prompt tokens a request's choice (n > 1) took from its first choice's KV "
                  "blocks instead of computing them")
            .get(),
        r.counter("tulip_prompt_tokens_computed_total",
                  "Prompt tokens whose KV a step rose ran computed (prefix-cache hits and "
                  "shared prompts of n > 1 excluded; recomputes after preemption included)")
            .get(),
        r.counter("tulip_llm_preemptions_total",
                  "Sequences preempted (blocks freed, recomputed later) for lack of KV blocks")
            .get(),
        r.counter("tulip_generated_tokens_total", "Tokens generated").get(),
        r.counter("tulip_llm_masked_steps_total",
                  "LLM steps planned with structured-output token masks")
            .get(),
        r.counter("tulip_llm_masks_total",
                  "Structured-output token masks filled (one per constrained sampled token)")
            .get(),
        r.counter("tulip_llm_mask_fill_seconds_total",
                  "Scheduler wall time spent filling structured-output token masks")
            .get(),
        r.counter("tulip_llm_late_mask_steps_total",
                  "LLM steps whose structured-output token masks went to rose after the step "
                  "(planned ahead of a constrained sequence's last token)")
            .get(),
        r.histogram("tulip_time_to_first_token_seconds",
                    "Arrival of a Generate request until its first token")
            .get(),
        r.histogram("tulip_inter_token_latency_seconds", "Time between consecutive tokens", {},
                    metrics::exponentialBuckets(0.001, 2, 14))
            .get(),
        r.histogram("tulip_llm_step_tokens", "Tokens per LLM step sent to rose", {},
                    {1, 4, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384})
            .get(),
        r.histogram("tulip_llm_step_seconds", "rose's own time for one LLM step").get(),
    };
    return m;
  }
};

// The worker's view of a plan: the shm step's three arrays [TAG_LLM_STEP_FORMAT]. The arrays
// move out of the plan (update() needs only its descriptors and refs).
WorkBatch toWorkBatch(StepPlan& plan) {
  WorkBatch batch;
  batch.kind = shm::BatchKind::kGenerate;
  batch.llm_seqs = plan.seqs;
  batch.tokens = std::move(plan.tokens);
  batch.block_ids = std::move(plan.block_ids);
  batch.llm_state = std::move(plan.state);
  if (plan.late.empty()) {
    batch.masks = std::move(plan.masks);
    plan.masks.clear();
  } else {  // [TAG_LATE_MASKS] the plan keeps them: filled and delivered later
    batch.late_mask_words = plan.masks.size();
    batch.late_masks = std::make_shared<LateMasks>();
  }
  batch.request_id = plan.request_id;
  plan.tokens.clear();
  plan.block_ids.clear();
  plan.state.clear();
  return batch;
}

}  // namespace

LlmScheduler::LlmScheduler(Worker& worker, LlmSchedulerOptions opts)
    : worker_(worker),
      core_([&] {
        opts.async_steps = opts.async_steps && worker.depth() >= 2;
        return opts;
      }()),
      next_call_id_(std::random_device{}() | (uint64_t{std::random_device{}()} << 32)) {
  thread_ = std::thread([this] { loop(); });
}

LlmScheduler::~LlmScheduler() { stop(); }

void LlmScheduler::poke() {
  { std::lock_guard<std::mutex> l(mu_); }
  cv_.notify_all();
}

Status LlmScheduler::submit(std::shared_ptr<LlmRequest> req) {
  if (!worker_.ready()) return workerDown(worker_);
  GenerateParams& p = req->params;
  if (Status st = validateGenerate(p, worker_.facts()); !st.isOk()) return st;
  if (!p.has_seed) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    p.sampling.seed = rng();
  }
  const int64_t now = shm::monotonicNowNs();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return unavailable("tulip is shutting down");
    Result<SeqId> id = core_.add(p, now);
    if (!id.isOk()) return id.status();
    // [TAG_LLM_CHOICES] One stream per choice, ids id .. id + n - 1, all delivered to `req`.
    for (uint32_t i = 0; i < std::max<uint32_t>(p.n, 1); ++i)
      active_.emplace(*id + i, Active{req, now, 0, i, p.n > 1});
    if (p.n > 1) {  // [TAG_STOP_CHOICE]
      if (++next_call_id_ == 0) ++next_call_id_;
      req->call_id = next_call_id_;
      calls_.emplace(req->call_id, Call{*id, p.n, p.n});
    }
    publishMetrics();
  }
  cv_.notify_all();
  return okStatus();
}

void LlmScheduler::cancel(const std::shared_ptr<LlmRequest>& req) {
  req->cancelled = true;
  poke();
}

Status LlmScheduler::stopChoice(uint64_t call_id, uint32_t index) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = calls_.find(call_id);
    if (call_id == 0 || it == calls_.end())
      return notFound("call " + std::to_string(call_id) + " is not running here");
    const Call& c = it->second;
    if (index >= c.n) {
      return invalidArgument("index: the call has " + std::to_string(c.n) + " choices, got " +
                             std::to_string(index));
    }
    // The loop ends it (watch()), as it does cancellations, so sequences end only on the loop's
    // turns; one that already ended is unknown to the step scheduler by then: a no-op (sequence
    // ids are never reused).
    stops_.push_back(c.first + index);
  }
  cv_.notify_all();
  return okStatus();
}

LlmStats LlmScheduler::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return core_.stats();
}

void LlmScheduler::setHandoff(std::function<void(LlmHandoff)> fn) {
  std::lock_guard<std::mutex> l(mu_);
  on_handoff_ = std::move(fn);
}

void LlmScheduler::releaseHandoff(SeqId prefill_id) {
  {
    std::lock_guard<std::mutex> l(mu_);
    core_.releaseHandoff(prefill_id);
    publishMetrics();
  }
  cv_.notify_all();  // blocks came free: a waiting sequence may fit now
}

Status LlmScheduler::adopt(LlmHandoff& h) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return unavailable("tulip is shutting down");
    adoptions_.push_back(std::move(h));
  }
  cv_.notify_all();
  return okStatus();
}

bool LlmScheduler::ensureConfigured() {
  if (!core_.needsConfigure()) return true;
  // Rebuilt only once no sequence holds blocks of the old cache and no step is out.
  if (!worker_.ready() || !inflight_.empty()) return false;
  const shm::ModelFacts f = worker_.facts();
  if (!core_.configure(llmWorkerLimits(f, worker_.inputBytes()))) return false;
  log::info("kv cache ready", {{"blocks", f.kv_num_blocks},
                               {"window_blocks", f.kv_num_blocks_window},
                               {"window", f.kv_window},
                               {"block_size", f.kv_block_size},
                               {"block_groups", std::max<uint32_t>(1, f.kv_block_groups)},
                               {"max_len", llmContextLength(f)},
                               {"prefix_caching", core_.options().enable_prefix_caching},
                               {"async_steps", core_.options().async_steps},
                               {"handoff", core_.options().handoff}});
  return true;
}

void LlmScheduler::endQueued(LlmHandoff& h, Status st, FinishReason why) {
  direct_.emplace_back(h.req,
                       handoffLastEvent(h.seq, std::move(st), why, shm::monotonicNowNs()));
  if (h.release) releases_.push_back(std::move(h.release));
}

bool LlmScheduler::startAdoption(std::unique_lock<std::mutex>& l) {
  if (adoptions_.empty()) return false;
  LlmHandoff& h = adoptions_.front();
  const uint32_t bit = 1u << h.seq.index;
  if (h.req->cancelled.load()) {
    endQueued(h, cancelledError("request cancelled by the caller"), FinishReason::kCancelled);
  } else if (h.req->stopped_choices.load() & bit) {
    endQueued(h, okStatus(), FinishReason::kStop);
  } else if (h.seq.params.deadline_ns > 0 && shm::monotonicNowNs() >= h.seq.params.deadline_ns) {
    endQueued(h, deadlineExceeded("deadline expired after " +
                                  std::to_string(h.seq.generated) + " generated tokens"),
              FinishReason::kNone);
  } else if (!worker_.ready()) {
    endQueued(h, workerDown(worker_, "the decode worker is restarting"), FinishReason::kNone);
  } else {
    if (!ensureConfigured()) return false;
    std::vector<int32_t> pairs, wpairs;
    Result<SeqId> id = core_.adopt(h.seq, &pairs, &wpairs);
    if (!id.isOk()) {
      if (id.status().code() == StatusCode::kResourceExhausted) return false;  // after a step
      endQueued(h, id.status(), FinishReason::kNone);
      adoptions_.pop_front();
      return true;
    }
    WorkBatch batch;
    batch.kind = shm::BatchKind::kKvPull;
    batch.kv_source = h.source;
    batch.kv_source_pid = h.source_pid;
    batch.kv_window_pairs = static_cast<uint32_t>(wpairs.size() / 2);
    batch.block_ids = std::move(pairs);
    batch.block_ids.insert(batch.block_ids.end(), wpairs.begin(), wpairs.end());
    batch.request_id = core_.seq(*id).params.request_id;  // h.seq's moved into the sequence
    const SeqId sid = *id;
    // Registered before the handover: the worker may complete the copy before trySubmit returns.
    pulls_.emplace(sid, Pull{});
    l.unlock();
    Status st = worker_.trySubmit(std::move(batch), [this, sid](const WorkResult& r) {
      {
        std::lock_guard<std::mutex> g(mu_);
        auto it = pulls_.find(sid);
        if (it != pulls_.end()) {
          it->second.done = true;
          it->second.status = r.status;
        }
      }
      cv_.notify_all();
    });
    l.lock();
    if (!st.isOk() && st.code() == StatusCode::kFailedPrecondition) {
      pulls_.erase(sid);
      core_.unadopt(sid, &h.seq);  // no free slot: the same handoff again after a completion
      return false;
    }
    Pull& p = pulls_.at(sid);
    p.release = std::move(h.release);
    if (!st.isOk()) {
      p.done = true;
      p.status = st;
    }
    Active a{h.req, h.arrival_ns, h.last_token_ns, h.seq.index, false};
    active_.emplace(sid, std::move(a));
  }
  adoptions_.pop_front();
  return true;
}

void LlmScheduler::applyPulls(int64_t now) {
  static auto& outcomes = metrics::Registry::global().counter(
      "tulip_kv_handoffs_total",
      "Sequences handed from the prefill worker to the decode worker (their KV blocks copied), "
      "by outcome",
      {"outcome"});
  for (auto it = pulls_.begin(); it != pulls_.end();) {
    if (!it->second.done) {
      ++it;
      continue;
    }
    if (!it->second.status.isOk()) {
      log::warn("kv handoff failed", {{"error", it->second.status}});
    }
    outcomes.labels({it->second.status.isOk() ? "ok" : "error"}).inc();
    core_.adopted(it->first, it->second.status, now);
    if (it->second.release) releases_.push_back(std::move(it->second.release));
    it = pulls_.erase(it);
  }
}

void LlmScheduler::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  Outbox out;
  std::vector<std::function<void()>> releases;
  {
    std::lock_guard<std::mutex> l(mu_);
    const int64_t now = shm::monotonicNowNs();
    // A worker waiting for late masks goes on without them [TAG_LATE_MASKS].
    for (InflightStep& f : inflight_) {
      if (!f.late || f.delivered || !f.late->deliver) continue;
      f.delivered = true;
      std::fill(f.plan.masks.begin(), f.plan.masks.end(), ~0u);
      (void)f.late->deliver(f.plan.masks);
    }
    core_.cancelAll(cancelledError("tulip is shutting down"), now);
    // [TAG_DISAGG] Handoffs still queued end too; copies in flight free their source blocks.
    for (LlmHandoff& h : adoptions_)
      endQueued(h, cancelledError("tulip is shutting down"), FinishReason::kCancelled);
    adoptions_.clear();
    for (auto& [id, p] : pulls_)
      if (p.release) releases_.push_back(std::move(p.release));
    pulls_.clear();
    out = collectEvents(now);
    // Handed off but not handed over: end them here.
    for (LlmHandoff& h : handoffs_) {
      endQueued(h, cancelledError("tulip is shutting down"), FinishReason::kCancelled);
    }
    handoffs_.clear();
    Outbox more = collectEvents(now);
    for (auto& e : more) out.push_back(std::move(e));
    releases.swap(releases_);
  }
  for (auto& [req, ev] : out)
    if (req->on_event) req->on_event(ev);
  for (auto& r : releases) r();
}

void publishLlmGauges(const LlmStats& s) {
  auto& m = LlmMetrics::get();
  m.running.set(static_cast<double>(s.running));
  m.waiting.set(static_cast<double>(s.waiting));
  if (s.kv_total_blocks > 0) {
    m.kv_used.set(s.kv_used_blocks);
    m.kv_free.set(s.kv_free_blocks);
  }
  if (s.kv_window_total_blocks > 0) {  // [TAG_KV_WINDOW_GROUP]
    m.kv_window_used.set(s.kv_window_used_blocks);
    m.kv_window_free.set(s.kv_window_free_blocks);
  }
}

void LlmScheduler::setPublishGauges(bool on) {
  std::lock_guard<std::mutex> l(mu_);
  publish_gauges_ = on;
}

void LlmScheduler::publishMetrics() {
  auto& m = LlmMetrics::get();
  const LlmStats s = core_.stats();
  if (publish_gauges_) publishLlmGauges(s);
  // Counters grow by what the step scheduler counted since the last call.
  m.cache_hit_tokens.inc(
      static_cast<double>(s.cached_prompt_tokens - published_.cached_prompt_tokens));
  m.cache_query_tokens.inc(
      static_cast<double>(s.queried_prompt_tokens - published_.queried_prompt_tokens));
  m.shared_prompt_tokens.inc(
      static_cast<double>(s.shared_prompt_tokens - published_.shared_prompt_tokens));
  m.computed_prompt_tokens.inc(
      static_cast<double>(s.computed_prompt_tokens - published_.computed_prompt_tokens));
  m.generated.inc(static_cast<double>(s.generated_tokens - published_.generated_tokens));
  m.masked_steps.inc(static_cast<double>(s.masked_steps - published_.masked_steps));
  m.masks.inc(static_cast<double>(s.masks - published_.masks));
  m.mask_fill_seconds.inc(static_cast<double>(s.mask_fill_ns - published_.mask_fill_ns) * 1e-9);
  m.late_mask_steps.inc(static_cast<double>(s.late_mask_steps - published_.late_mask_steps));
  if (s.preemptions > published_.preemptions) {
    m.preemptions.inc(static_cast<double>(s.preemptions - published_.preemptions));
    log::debug("preempted", {{"sequences", s.preemptions - published_.preemptions},
                             {"free_blocks", s.kv_free_blocks}});
  }
  published_ = s;
}

void LlmScheduler::applyResults() {
  auto& m = LlmMetrics::get();
  while (!inflight_.empty()) {
    auto it = results_.find(inflight_.front().plan.step);
    if (it == results_.end()) return;
    StepResult r = std::move(it->second);
    results_.erase(it);
    const StepPlan& plan = inflight_.front().plan;
    const int64_t now = shm::monotonicNowNs();
    if (r.status.isOk()) {
      m.step_seconds.observe(r.step_us / 1e6);
      core_.update(plan, r.ids, now, r.logprobs);
    } else {
      log::warn("llm step failed", {{"error", r.status}, {"sequences", plan.seqs.size()}});
      core_.stepFailed(plan, r.status, now);
    }
    inflight_.pop_front();
    // The next step's late masks depend on the tokens just applied: hand them over at once, the
    // worker is running that step's forward pass [TAG_LATE_MASKS].
    deliverLateMasks(now);
  }
}

void LlmScheduler::deliverLateMasks(int64_t now) {
  if (inflight_.empty()) return;
  InflightStep& f = inflight_.front();
  if (!f.late || f.delivered) return;
  f.delivered = true;
  if (!f.late->deliver) return;  // the worker never took the step
  core_.fillLateMasks(f.plan);
  if (f.late->deliver(f.plan.masks)) return;
  // Not taken. A step that failed (or a worker that went down) is answered by its own error;
  // one that ran without waiting for them drew its constrained tokens unconstrained.
  auto r = results_.find(f.plan.step);
  if (!worker_.ready() || (r != results_.end() && !r->second.status.isOk())) return;
  log::warn("late token masks were not taken by rose",
            {{"step", f.plan.step}, {"sequences", f.plan.seqs.size()}});
  core_.lateMasksLost(f.plan, now);
}

void LlmScheduler::watch(int64_t now) {
  for (SeqId id : stops_) core_.stop(id, now);  // [TAG_STOP_CHOICE]
  stops_.clear();
  for (const auto& [id, a] : active_) {
    if (a.req->cancelled.load()) {
      core_.cancel(id, now);
    } else if (a.req->stopped_choices.load() & (1u << a.index)) {  // [TAG_DISAGG]
      core_.stop(id, now);
    }
  }
  core_.expire(now);
  // A worker that went down lost its KV cache, even with nothing running: its prefix cache
  // entries must not outlive it.
  if (!worker_.ready()) {
    core_.failAll(workerDown(worker_, "generation stopped, its KV cache is lost"),
                  workerDown(worker_), now);
  }
}

LlmScheduler::Outbox LlmScheduler::collectEvents(int64_t now) {
  Outbox out;
  out.swap(direct_);  // [TAG_DISAGG] handoffs that ended before adoption
  auto& m = LlmMetrics::get();
  for (SeqEvent& e : core_.takeEvents()) {
    auto it = active_.find(e.id);
    CHECK(it != active_.end());
    Active& a = it->second;
    if (e.handoff) {  // [TAG_DISAGG] the stream goes on at the decode side
      std::optional<SeqHandoff> seq = core_.takeHandoff(e.id);
      CHECK(seq.has_value());
      LlmHandoff h;
      h.seq = std::move(*seq);
      h.req = a.req;
      h.arrival_ns = a.arrival_ns;
      h.last_token_ns = a.last_token_ns;
      h.source = worker_.facts().kv_export;
      h.source_pid = worker_.pid();
      h.release = [this, id = e.id] { releaseHandoff(id); };
      handoffs_.push_back(std::move(h));
      if (a.in_calls) {
        auto c = calls_.find(a.req->call_id);
        CHECK(c != calls_.end() && c->second.live > 0);
        if (--c->second.live == 0) calls_.erase(c);
      }
      active_.erase(it);
      continue;
    }
    if (e.event.token >= 0) {
      if (a.last_token_ns == 0)
        m.ttft.observe((now - a.arrival_ns) / 1e9);
      else
        m.itl.observe((now - a.last_token_ns) / 1e9);
      a.last_token_ns = now;
    }
    out.emplace_back(a.req, std::move(e.event));
    if (out.back().second.last) {
      if (const uint64_t call = a.req->call_id; call != 0 && a.in_calls) {  // [TAG_STOP_CHOICE]
        auto c = calls_.find(call);
        CHECK(c != calls_.end() && c->second.live > 0);
        if (--c->second.live == 0) calls_.erase(c);
      }
      active_.erase(it);
    }
  }
  return out;
}

LlmScheduler::Submitted LlmScheduler::submitStep(std::unique_lock<std::mutex>& l) {
  if (!worker_.ready() || !core_.hasWork()) return Submitted::kNone;
  if (!ensureConfigured()) return Submitted::kNone;
  StepPlan plan = core_.schedule(shm::monotonicNowNs());
  if (plan.empty()) return Submitted::kNone;
  LlmMetrics::get().step_tokens.observe(static_cast<double>(plan.num_tokens));
  WorkBatch batch = toWorkBatch(plan);
  const uint64_t step = plan.step;
  inflight_.push_back(InflightStep{std::move(plan), batch.late_masks});
  publishMetrics();
  l.unlock();
  // Only this thread submits, so nothing reaches the worker between two planned steps: "the
  // step before" of [TAG_LLM_PREV_TOKEN] is the previous plan.
  Status st = worker_.trySubmit(std::move(batch), [this, step](const WorkResult& r) {
    StepResult sr;
    sr.status = r.status;
    sr.ids.assign(r.token_ids.begin(), r.token_ids.end());
    sr.logprobs.assign(r.logprobs.begin(), r.logprobs.end());
    sr.step_us = r.step_us;
    {
      std::lock_guard<std::mutex> g(mu_);
      results_[step] = std::move(sr);
    }
    cv_.notify_all();
  });
  l.lock();
  if (st.isOk()) return Submitted::kStep;
  if (st.code() == StatusCode::kFailedPrecondition) {
    // No free slot (transient): the step is planned again after a completion.
    CHECK(inflight_.back().plan.step == step);
    core_.retract(inflight_.back().plan);
    inflight_.pop_back();
    return Submitted::kNoSlot;
  }
  StepResult sr;
  sr.status = st.code() == StatusCode::kInvalidArgument ? st : unavailable(st.message());
  results_[step] = std::move(sr);
  return Submitted::kStep;
}

bool LlmScheduler::resultReady() const {
  return !inflight_.empty() && results_.count(inflight_.front().plan.step) != 0;
}

void LlmScheduler::loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    applyResults();
    const int64_t now = shm::monotonicNowNs();
    applyPulls(now);  // [TAG_DISAGG]
    watch(now);
    Outbox out = collectEvents(now);
    if (!out.empty() || !handoffs_.empty() || !releases_.empty()) {
      publishMetrics();
      std::vector<LlmHandoff> handoffs;
      handoffs.swap(handoffs_);
      std::vector<std::function<void()>> releases;
      releases.swap(releases_);
      auto handoff = on_handoff_;
      l.unlock();
      // A first token's event before its handoff: the decode side streams after it.
      for (auto& [req, ev] : out)
        if (req->on_event) req->on_event(ev);
      out.clear();
      for (LlmHandoff& h : handoffs) {
        if (handoff) {
          handoff(std::move(h));
        } else {  // nowhere to go (a misconfigured pair): end it, free its blocks
          if (h.req->on_event) {
            h.req->on_event(handoffLastEvent(h.seq,
                                             internalError("no decode worker to hand the "
                                                           "sequence to"),
                                             FinishReason::kNone, shm::monotonicNowNs()));
          }
          h.release();
        }
      }
      for (auto& r : releases) r();
      l.lock();
      continue;
    }
    if (stop_) break;
    const bool adopted = startAdoption(l);  // [TAG_DISAGG]
    const Submitted sub = submitStep(l);
    // Planning may have ended a sequence (events) and a result may have come meanwhile.
    if (adopted || sub == Submitted::kStep || core_.hasEvents() || resultReady() ||
        !stops_.empty() || !direct_.empty())
      continue;
    cv_.wait_for(l, sub == Submitted::kNoSlot ? 5ms : 20ms);
  }
}

}  // namespace garden::tulip
