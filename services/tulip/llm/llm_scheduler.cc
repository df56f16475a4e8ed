#include "services/tulip/llm/llm_scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "common/logging.h"
#include "common/metrics/registry.h"
#include "common/shm/llm_batch.h"

namespace garden::tulip {
namespace {

using namespace std::chrono_literals;

uint64_t usBetween(int64_t t0_ns, int64_t t1_ns) {
  return t1_ns > t0_ns && t0_ns > 0 ? static_cast<uint64_t>((t1_ns - t0_ns) / 1000) : 0;
}

struct LlmMetrics {
  metrics::Gauge& running;
  metrics::Gauge& waiting;
  metrics::Gauge& kv_used;
  metrics::Gauge& kv_free;
  metrics::Counter& cache_hit_tokens;
  metrics::Counter& cache_query_tokens;
  metrics::Counter& preemptions;
  metrics::Counter& generated;
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
        r.counter("tulip_prefix_cache_hit_tokens_total",
                  "Prompt tokens served from the prefix cache")
            .get(),
        r.counter("tulip_prefix_cache_query_tokens_total",
                  "Prompt tokens looked up in the prefix cache")
            .get(),
        r.counter("tulip_llm_preemptions_total",
                  "Sequences preempted (blocks freed, recomputed later) for lack of KV blocks")
            .get(),
        r.counter("tulip_generated_tokens_total", "Tokens generated").get(),
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

bool contains(const std::vector<int32_t>& v, int32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

struct LlmScheduler::Seq {
  SeqId id = 0;
  std::shared_ptr<LlmRequest> req;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  uint32_t prompt_len = 0;
  uint32_t max_new = 0;  // generated tokens allowed (max_tokens; 0 = no limit but the context)
  uint32_t num_computed = 0;
  uint32_t generated = 0;
  uint32_t cached_prompt = 0;
  bool admitted_once = false;
  bool running = false;
  bool done = false;
  int64_t arrival_ns = 0;
  int64_t first_sched_ns = 0;
  int64_t last_token_ns = 0;
};

LlmScheduler::LlmScheduler(Worker& worker, LlmSchedulerOptions opts)
    : worker_(worker), opts_(opts) {
  thread_ = std::thread([this] { loop(); });
}

LlmScheduler::~LlmScheduler() { stop(); }

void LlmScheduler::poke() {
  { std::lock_guard<std::mutex> l(mu_); }
  cv_.notify_all();
}

Status LlmScheduler::submit(std::shared_ptr<LlmRequest> req) {
  if (!worker_.ready()) return workerDown(worker_);
  const shm::ModelFacts f = worker_.facts();
  if (std::string(f.kind, strnlen(f.kind, sizeof(f.kind))) != "llm")
    return failedPrecondition("the worker does not serve an LLM");
  if (f.kv_num_blocks == 0 || f.kv_block_size == 0)
    return failedPrecondition("the worker reported no KV cache");
  GenerateParams& p = req->params;
  uint64_t max_len = uint64_t{f.kv_num_blocks} * f.kv_block_size;
  if (f.max_seq_len > 0) max_len = std::min<uint64_t>(max_len, f.max_seq_len);
  if (p.prompt.empty()) return invalidArgument("prompt_ids: at least one token is required");
  if (p.prompt.size() >= max_len) {
    return invalidArgument("prompt_ids: " + std::to_string(p.prompt.size()) +
                           " tokens, but the model's context is " + std::to_string(max_len) +
                           " tokens and the prompt must leave room for one generated token");
  }
  for (size_t i = 0; i < p.prompt.size(); ++i) {
    const int32_t id = p.prompt[i];
    if (id < 0 || (f.vocab_size > 0 && static_cast<uint32_t>(id) >= f.vocab_size)) {
      return invalidArgument("prompt_ids[" + std::to_string(i) + "]: token id " +
                             std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(f.vocab_size) + ")");
    }
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    const int32_t id = p.stop_token_ids[i];
    if (id < 0 || (f.vocab_size > 0 && static_cast<uint32_t>(id) >= f.vocab_size)) {
      return invalidArgument("stop_token_ids[" + std::to_string(i) + "]: token id " +
                             std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(f.vocab_size) + ")");
    }
  }
  llm::SamplingParams& s = p.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    return invalidArgument("sampling.temperature: must be a finite number >= 0 (0 = greedy)");
  if (s.top_p == 0) s.top_p = 1.f;  // proto3 default: off
  if (!(s.top_p > 0 && s.top_p <= 1))
    return invalidArgument("sampling.top_p: must be in (0, 1] (0 or 1 = off)");
  if (s.top_k < 0) return invalidArgument("sampling.top_k: must be >= 0 (0 = off)");
  if (!p.has_seed) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    s.seed = rng();
  }
  auto seq = std::make_shared<Seq>();
  seq->req = req;
  seq->tokens = p.prompt;
  seq->prompt_len = static_cast<uint32_t>(p.prompt.size());
  seq->max_new = p.max_tokens;
  seq->arrival_ns = shm::monotonicNowNs();
  const uint64_t n = seq->tokens.size();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return unavailable("tulip is shutting down");
    if (waiting_tokens_ + n > opts_.max_waiting_tokens) {
      return resourceExhausted("waiting queue full: " + std::to_string(waiting_tokens_) +
                               " prompt tokens waiting, this request adds " + std::to_string(n) +
                               ", limit " + std::to_string(opts_.max_waiting_tokens) +
                               "; retry later");
    }
    seq->id = next_id_++;
    waiting_tokens_ += n;
    waiting_.push_back(std::move(seq));
    updateGauges();
  }
  cv_.notify_all();
  return okStatus();
}

void LlmScheduler::cancel(const std::shared_ptr<LlmRequest>& req) {
  req->cancelled = true;
  poke();
}

LlmStats LlmScheduler::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  LlmStats s;
  s.running = static_cast<uint32_t>(running_.size());
  s.waiting = static_cast<uint32_t>(waiting_.size());
  s.waiting_tokens = waiting_tokens_;
  s.inflight_tokens = inflight_tokens_;
  s.max_waiting_tokens = opts_.max_waiting_tokens;
  if (kv_) {
    s.kv_free_blocks = kv_->blocksFree();
    s.kv_total_blocks = kv_->blocksTotal();
  }
  s.preemptions = preemptions_;
  s.cached_prompt_tokens = cached_tokens_;
  s.steps = steps_;
  return s;
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
  {
    std::lock_guard<std::mutex> l(mu_);
    auto all = running_;
    all.insert(all.end(), waiting_.begin(), waiting_.end());
    for (auto& s : all) {
      finishSeq(s, cancelledError("tulip is shutting down"), FinishReason::kCancelled, -1, out);
    }
  }
  for (auto& [req, ev] : out)
    if (req->on_event) req->on_event(ev);
}

void LlmScheduler::updateGauges() {
  auto& m = LlmMetrics::get();
  m.running.set(static_cast<double>(running_.size()));
  m.waiting.set(static_cast<double>(waiting_.size()));
  if (kv_) {
    m.kv_used.set(kv_->blocksUsed());
    m.kv_free.set(kv_->blocksFree());
  }
}

bool LlmScheduler::ensureKv() {
  if (!kv_stale_) return kv_ != nullptr;
  // Rebuild only when no sequence holds blocks of the old cache.
  if (!running_.empty() || step_busy_) return false;
  const shm::ModelFacts f = worker_.facts();
  if (std::string(f.kind, strnlen(f.kind, sizeof(f.kind))) != "llm" || f.kv_num_blocks == 0 ||
      f.kv_block_size == 0) {
    return false;
  }
  kv_ = std::make_unique<KvBlockManager>(
      KvOptions{f.kv_num_blocks, f.kv_block_size, opts_.enable_prefix_caching});
  // rose refuses steps with more sequences than its max_seqs; the running set is what a step
  // carries, so it is capped the same way.
  max_running_ = opts_.max_num_seqs;
  if (f.max_seqs > 0) max_running_ = std::min(max_running_, f.max_seqs);
  max_len_ = f.kv_num_blocks * f.kv_block_size;
  if (f.max_seq_len > 0) max_len_ = std::min(max_len_, f.max_seq_len);
  eos_.clear();
  for (int32_t e : f.eos_ids)
    if (e >= 0) eos_.push_back(e);
  kv_stale_ = false;
  log::info("kv cache ready", {{"blocks", f.kv_num_blocks},
                               {"block_size", f.kv_block_size},
                               {"max_len", max_len_},
                               {"prefix_caching", opts_.enable_prefix_caching}});
  updateGauges();
  return true;
}

void LlmScheduler::finishSeq(const std::shared_ptr<Seq>& s, Status st, FinishReason why,
                             int32_t token, Outbox& out) {
  if (s->done) return;
  s->done = true;
  if (s->running) {
    running_.erase(std::find(running_.begin(), running_.end(), s));
    s->running = false;
  } else {
    auto it = std::find(waiting_.begin(), waiting_.end(), s);
    if (it != waiting_.end()) {
      waiting_tokens_ -= s->tokens.size();
      waiting_.erase(it);
    }
  }
  if (kv_) kv_->free(s->id);
  GenerateEvent ev;
  ev.token = token;
  ev.last = true;
  ev.status = std::move(st);
  ev.finish = ev.status.isOk() || why == FinishReason::kCancelled ? why : FinishReason::kNone;
  ev.prompt_tokens = s->prompt_len;
  ev.cached_prompt_tokens = s->cached_prompt;
  ev.completion_tokens = s->generated;
  const int64_t now = shm::monotonicNowNs();
  ev.queue_us = s->first_sched_ns ? usBetween(s->arrival_ns, s->first_sched_ns)
                                  : usBetween(s->arrival_ns, now);
  ev.inference_us = usBetween(s->first_sched_ns, now);
  ev.total_us = usBetween(s->arrival_ns, now);
  out.emplace_back(s->req, std::move(ev));
  updateGauges();
}

void LlmScheduler::failRunning(const Status& st, Outbox& out) {
  auto all = running_;
  for (auto& s : all) finishSeq(s, st, FinishReason::kNone, -1, out);
}

void LlmScheduler::reap(Outbox& out) {
  const int64_t now = shm::monotonicNowNs();
  const bool down = !worker_.ready();
  std::vector<std::shared_ptr<Seq>> all(running_.begin(), running_.end());
  all.insert(all.end(), waiting_.begin(), waiting_.end());
  bool lost_kv = false;
  for (auto& s : all) {
    if (s->req->cancelled.load()) {
      finishSeq(s, cancelledError("request cancelled by the caller"), FinishReason::kCancelled, -1,
                out);
    } else if (s->req->params.deadline_ns > 0 && now >= s->req->params.deadline_ns) {
      finishSeq(s,
                deadlineExceeded("deadline expired after " + std::to_string(s->generated) +
                                 " generated tokens"),
                FinishReason::kNone, -1, out);
    } else if (down) {
      lost_kv |= s->running;
      finishSeq(s,
                s->running ? workerDown(worker_, "generation stopped, its KV cache is lost")
                           : workerDown(worker_),
                FinishReason::kNone, -1, out);
    }
  }
  if (lost_kv || (down && kv_)) kv_stale_ = true;
}

void LlmScheduler::preempt(const std::shared_ptr<Seq>& victim) {
  kv_->free(victim->id);
  victim->num_computed = 0;
  victim->running = false;
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  waiting_.push_front(victim);
  waiting_tokens_ += victim->tokens.size();
  ++preemptions_;
  LlmMetrics::get().preemptions.inc();
  log::debug("preempted", {{"request_id", victim->req->params.request_id},
                           {"tokens", victim->tokens.size()},
                           {"free_blocks", kv_->blocksFree()}});
}

std::vector<LlmScheduler::Entry> LlmScheduler::schedule(WorkBatch& batch) {
  std::vector<Entry> entries;
  const shm::ModelFacts f = worker_.facts();
  uint32_t budget = opts_.max_batch_tokens;
  if (f.max_batch_tokens > 0) budget = std::min(budget, f.max_batch_tokens);
  const uint64_t cap_bytes = worker_.inputBytes();
  const int64_t now = shm::monotonicNowNs();
  uint64_t n_tokens = 0, n_blocks = 0;
  auto fits = [&](uint32_t num_new, size_t table) {
    return shm::llmStepBytes(entries.size() + 1, n_tokens + num_new, n_blocks + table) <= cap_bytes;
  };
  bool preempted = false;
  // Running sequences, in admission order; victims come from the tail.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    auto s = running_[i];
    const uint32_t remaining = static_cast<uint32_t>(s->tokens.size()) - s->num_computed;
    const uint32_t num_new = std::min(remaining, budget);
    auto table = kv_->allocate(s->id, uint64_t{s->num_computed} + num_new);
    bool self = false;
    while (!table) {
      auto victim = running_.back();
      preempt(victim);
      preempted = true;
      if (victim == s) {
        self = true;
        break;
      }
      table = kv_->allocate(s->id, uint64_t{s->num_computed} + num_new);
    }
    if (self) break;  // s was the last running sequence
    if (!fits(num_new, table->size())) {
      ++i;
      continue;
    }
    entries.push_back(
        Entry{s, num_new, s->num_computed, s->num_computed + num_new == s->tokens.size()});
    n_tokens += num_new;
    n_blocks += table->size();
    budget -= num_new;
    ++i;
  }
  // Waiting sequences, first come first served, unless this step had to preempt.
  while (!preempted && !waiting_.empty() && running_.size() < max_running_ && budget > 0) {
    auto s = waiting_.front();
    if (s->tokens.size() >= max_len_) {
      // Only after a restart with a smaller cache: it can never run.
      // (Fresh requests cannot get here: submit() checks the context.)
      finishSeq(s, outOfRange("sequence no longer fits the worker's context"), FinishReason::kNone,
                -1, pending_out_);
      continue;
    }
    std::vector<int32_t> prefix = kv_->findCachedPrefix(s->tokens);
    const uint32_t computed = static_cast<uint32_t>(prefix.size()) * kv_->blockSize();
    const uint32_t num_new = std::min(static_cast<uint32_t>(s->tokens.size()) - computed, budget);
    auto table = kv_->allocate(s->id, uint64_t{computed} + num_new, prefix);
    if (!table) break;
    if (!fits(num_new, table->size())) {
      kv_->free(s->id);
      break;
    }
    waiting_.pop_front();
    waiting_tokens_ -= s->tokens.size();
    s->running = true;
    s->num_computed = computed;
    running_.push_back(s);
    if (!s->admitted_once) {
      s->admitted_once = true;
      s->cached_prompt = computed;
      s->first_sched_ns = now;
      cached_tokens_ += computed;
      auto& m = LlmMetrics::get();
      m.cache_hit_tokens.inc(computed);
      m.cache_query_tokens.inc(s->prompt_len);
    }
    entries.push_back(Entry{s, num_new, computed, computed + num_new == s->tokens.size()});
    n_tokens += num_new;
    n_blocks += table->size();
    budget -= num_new;
  }
  if (entries.empty()) return entries;
  // The step, in the shm layout's three arrays [TAG_LLM_STEP_FORMAT].
  batch.kind = shm::BatchKind::kGenerate;
  batch.tokens.reserve(n_tokens);
  batch.block_ids.reserve(n_blocks);
  batch.llm_seqs.reserve(entries.size());
  batch.request_id = entries.front().seq->req->params.request_id;
  for (const Entry& e : entries) {
    const Seq& s = *e.seq;
    auto table = kv_->blockTable(s.id);
    llm::LlmStepSeq d;
    d.token_offset = static_cast<int32_t>(batch.tokens.size());
    d.num_tokens = static_cast<int32_t>(e.num_new);
    d.position = static_cast<int32_t>(e.position);
    d.block_offset = static_cast<int32_t>(batch.block_ids.size());
    d.num_blocks = static_cast<int32_t>(table.size());
    d.logits = llm::LogitsMode::kNone;
    d.sample = e.sample ? 1 : 0;
    d.sampling = s.req->params.sampling;
    batch.tokens.insert(batch.tokens.end(), s.tokens.begin() + e.position,
                        s.tokens.begin() + e.position + e.num_new);
    batch.block_ids.insert(batch.block_ids.end(), table.begin(), table.end());
    batch.llm_seqs.push_back(d);
  }
  updateGauges();
  return entries;
}

void LlmScheduler::handleResult(StepResult r, Outbox& out) {
  std::vector<Entry> entries = std::move(inflight_);
  inflight_.clear();
  step_busy_ = false;
  inflight_tokens_ = 0;
  ++steps_;
  auto& m = LlmMetrics::get();
  size_t sampled = 0;
  for (const Entry& e : entries) sampled += e.sample ? 1 : 0;
  Status st = r.status;
  if (st.isOk() && r.ids.size() != sampled) {
    st = internalError("rose returned " + std::to_string(r.ids.size()) +
                       " token ids for a step that sampled " + std::to_string(sampled));
  }
  if (!st.isOk()) {
    log::warn("llm step failed", {{"error", st}, {"sequences", entries.size()}});
    if (st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kInternal) {
      // The step was refused as a whole (nothing written): end the sequences it carried.
      for (const Entry& e : entries)
        finishSeq(e.seq, internalError("generation step failed: " + st.message()),
                  FinishReason::kNone, -1, out);
    } else {
      // The worker died or went away: every running sequence's KV is gone.
      failRunning(unavailable("rose worker failed during generation: " + st.message()), out);
      kv_stale_ = true;
    }
    return;
  }
  m.step_seconds.observe(r.step_us / 1e6);
  const int64_t now = shm::monotonicNowNs();
  size_t k = 0;
  for (const Entry& e : entries) {
    const int32_t tok = e.sample ? r.ids[k++] : -1;
    Seq& s = *e.seq;
    if (s.done) continue;  // cancelled while the step ran; its blocks are already free
    s.num_computed = e.position + e.num_new;
    kv_->commit(s.id, s.tokens, s.num_computed);
    if (!e.sample) continue;
    s.tokens.push_back(tok);
    ++s.generated;
    m.generated.inc();
    if (s.last_token_ns == 0)
      m.ttft.observe((now - s.arrival_ns) / 1e9);
    else
      m.itl.observe((now - s.last_token_ns) / 1e9);
    s.last_token_ns = now;
    const GenerateParams& p = s.req->params;
    if ((!p.ignore_eos && contains(eos_, tok)) || contains(p.stop_token_ids, tok)) {
      finishSeq(e.seq, okStatus(), FinishReason::kStop, tok, out);
    } else if ((s.max_new > 0 && s.generated >= s.max_new) || s.tokens.size() >= max_len_) {
      finishSeq(e.seq, okStatus(), FinishReason::kLength, tok, out);
    } else {
      GenerateEvent ev;
      ev.token = tok;
      out.emplace_back(s.req, std::move(ev));
    }
  }
  updateGauges();
}

void LlmScheduler::loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    Outbox out;
    if (result_) {
      StepResult r = std::move(*result_);
      result_.reset();
      handleResult(std::move(r), out);
    }
    reap(out);
    if (!pending_out_.empty()) {
      out.insert(out.end(), std::make_move_iterator(pending_out_.begin()),
                 std::make_move_iterator(pending_out_.end()));
      pending_out_.clear();
    }
    if (!out.empty()) {
      l.unlock();
      for (auto& [req, ev] : out)
        if (req->on_event) req->on_event(ev);
      out.clear();
      l.lock();
      continue;
    }
    if (stop_) break;
    if (step_busy_ || !worker_.ready() || (waiting_.empty() && running_.empty()) || !ensureKv()) {
      cv_.wait_for(l, 20ms);
      continue;
    }
    WorkBatch batch;
    std::vector<Entry> entries = schedule(batch);
    if (entries.empty()) {
      cv_.wait_for(l, 20ms);
      continue;
    }
    inflight_ = std::move(entries);
    step_busy_ = true;
    inflight_tokens_ = batch.tokens.size();
    step_submitted_ns_ = shm::monotonicNowNs();
    LlmMetrics::get().step_tokens.observe(static_cast<double>(batch.tokens.size()));
    l.unlock();
    Status st = worker_.trySubmit(std::move(batch), [this](const WorkResult& r) {
      StepResult sr;
      sr.status = r.status;
      sr.ids.assign(r.token_ids.begin(), r.token_ids.end());
      sr.step_us = r.step_us;
      {
        std::lock_guard<std::mutex> g(mu_);
        result_ = std::move(sr);
      }
      cv_.notify_all();
    });
    l.lock();
    if (!st.isOk()) {
      if (st.code() == StatusCode::kFailedPrecondition) {
        // No free slot (transient): the blocks stay allocated; the step is formed again.
        inflight_.clear();
        step_busy_ = false;
        inflight_tokens_ = 0;
        cv_.wait_for(l, 5ms);
      } else {
        StepResult sr;
        sr.status = st.code() == StatusCode::kInvalidArgument ? st : unavailable(st.message());
        result_ = std::move(sr);
      }
    }
  }
}

}  // namespace garden::tulip
