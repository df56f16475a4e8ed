#include "services/tulip/llm/step_scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/shm/llm_batch.h"

namespace garden::tulip {
namespace {

uint64_t usBetween(int64_t t0_ns, int64_t t1_ns) {
  return t1_ns > t0_ns && t0_ns > 0 ? static_cast<uint64_t>((t1_ns - t0_ns) / 1000) : 0;
}

bool contains(const std::vector<int32_t>& v, int32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// A stream's last event: `st` with `why` (kept for OK and cancellations), its counts and times.
GenerateEvent lastEvent(uint32_t index, int32_t token, Status st, FinishReason why,
                        uint32_t prompt_len, uint32_t cached_prompt, uint32_t generated,
                        int64_t arrival_ns, int64_t first_sched_ns, int64_t now_ns) {
  GenerateEvent ev;
  ev.index = index;
  ev.token = token;
  ev.last = true;
  ev.status = std::move(st);
  ev.finish = ev.status.isOk() || why == FinishReason::kCancelled ? why : FinishReason::kNone;
  ev.prompt_tokens = prompt_len;
  ev.cached_prompt_tokens = cached_prompt;
  ev.completion_tokens = generated;
  ev.queue_us = first_sched_ns ? usBetween(arrival_ns, first_sched_ns)
                               : usBetween(arrival_ns, now_ns);
  ev.inference_us = usBetween(first_sched_ns, now_ns);
  ev.total_us = usBetween(arrival_ns, now_ns);
  return ev;
}

}  // namespace

GenerateEvent handoffLastEvent(const SeqHandoff& h, Status st, FinishReason why, int64_t now_ns) {
  return lastEvent(h.index, -1, std::move(st), why, h.prompt_len, h.cached_prompt, h.generated,
                   h.arrival_ns, h.first_sched_ns, now_ns);
}

LlmWorkerLimits llmWorkerLimits(const shm::ModelFacts& f, uint64_t input_bytes) {
  LlmWorkerLimits l;
  l.kv_num_blocks = f.kv_num_blocks;
  l.kv_block_size = f.kv_block_size;
  l.kv_block_groups = std::max<uint32_t>(1, f.kv_block_groups);
  l.kv_num_blocks_window = f.kv_num_blocks_window;  // [TAG_KV_WINDOW_GROUP]
  l.kv_window = f.kv_window;
  l.context_len = llmContextLength(f);
  l.max_seqs = f.max_seqs;
  l.max_batch_tokens = f.max_batch_tokens;
  l.input_bytes = input_bytes;
  l.vocab = f.vocab_size;
  l.late_masks = (f.llm_caps & shm::kLlmCapLateMask) != 0;
  for (int32_t e : f.eos_ids)
    if (e >= 0) l.eos_ids.push_back(e);
  return l;
}

LlmStepScheduler::LlmStepScheduler(LlmSchedulerOptions opts) : opts_(opts) {
  if (opts_.mask_threads > 0) {
    mask_pool_ = std::make_unique<ThreadPool>(static_cast<int>(opts_.mask_threads) + 1);
  }
}

LlmStepScheduler::~LlmStepScheduler() = default;

bool LlmStepScheduler::configure(const LlmWorkerLimits& limits) {
  // [TAG_DISAGG] Nor while a copy may still write into blocks of the old bookkeeping.
  if (!running_.empty() || !in_flight_.empty() || adopting_ > 0) return false;
  if (limits.kv_num_blocks == 0 || limits.kv_block_size == 0) return false;
  const uint32_t groups = std::max<uint32_t>(1, limits.kv_block_groups);
  if (limits.kv_num_blocks % groups != 0) return false;
  limits_ = limits;
  kv_ = std::make_unique<KvBlockManager>(KvOptions{limits.kv_num_blocks, limits.kv_block_size,
                                                   opts_.enable_prefix_caching, groups});
  kvw_.reset();
  if (limits.kv_num_blocks_window > 0 && limits.kv_window > 0) {  // [TAG_KV_WINDOW_GROUP]
    if (limits.kv_num_blocks_window % groups != 0) return false;
    KvOptions wo{limits.kv_num_blocks_window, limits.kv_block_size, opts_.enable_prefix_caching,
                 groups};
    wo.window = limits.kv_window;
    kvw_ = std::make_unique<KvBlockManager>(wo);
  }
  kv_lost_ = false;
  budget_ = opts_.max_batch_tokens;
  if (limits.max_batch_tokens > 0) budget_ = std::min(budget_, limits.max_batch_tokens);
  // rose refuses steps with more sequences than its max_seqs; the running set is what a step
  // carries, so it is capped the same way.
  max_running_ = opts_.max_num_seqs;
  if (limits.max_seqs > 0) max_running_ = std::min(max_running_, limits.max_seqs);
  // [TAG_LLM_SAMPLER_STATE] One slot per running sequence (rose has max_seqs >= max_running_).
  free_state_slots_.clear();
  for (uint32_t i = max_running_; i-- > 0;) free_state_slots_.push_back(static_cast<int32_t>(i));
  return true;
}

Result<SeqId> LlmStepScheduler::add(GenerateParams params, int64_t now_ns) {
  const uint64_t n = params.prompt.size();
  if (waiting_tokens_ + n > opts_.max_waiting_tokens) {
    return resourceExhausted("waiting queue full: " + std::to_string(waiting_tokens_) +
                             " prompt tokens waiting, this request adds " + std::to_string(n) +
                             ", limit " + std::to_string(opts_.max_waiting_tokens) +
                             "; retry later");
  }
  const uint32_t choices = std::max<uint32_t>(params.n, 1);
  const SeqId first = next_id_;
  next_id_ += choices;
  for (uint32_t i = 0; i < choices; ++i) {
    const SeqId id = first + i;
    Seq& s = seqs_[id];
    s.id = id;
    s.index = i;
    if (i + 1 < choices) {
      s.tokens = params.prompt;
      s.params = params;
      s.params.prompt.clear();
    } else {
      s.tokens = std::move(params.prompt);
      params.prompt.clear();
      s.params = std::move(params);
    }
    s.params.sampling.seed += i;  // [TAG_LLM_CHOICES] choice i: seed + i
    if (s.params.constrained()) {  // [TAG_TOKEN_MASK] each choice walks the grammar on its own
      s.decoder = std::make_shared<grammar::ConstrainedDecoder>(s.params.grammar,
                                                                s.params.constraint);
    }
    s.prompt_len = static_cast<uint32_t>(s.tokens.size());
    s.arrival_ns = now_ns;
    s.leader = i > 0 ? first : 0;
    s.wait_cost = i == 0 ? static_cast<uint32_t>(n) : 0;
    waiting_tokens_ += s.wait_cost;
    waiting_.push_back(id);
  }
  return first;
}

uint32_t LlmStepScheduler::sharedTokens(const Seq& leader) const {
  const uint32_t bs = kv_->blockSize();
  return leader.prompt_len > 0 ? (leader.prompt_len - 1) / bs * bs : 0;
}

void LlmStepScheduler::releaseStateSlot(Seq& s) {
  if (s.state_slot >= 0) free_state_slots_.push_back(s.state_slot);
  s.state_slot = -1;
  s.state_sent = false;
}

uint64_t LlmStepScheduler::stateWords(const Seq& s, bool admitting) const {
  if (!needsSamplerState(s.params)) return 0;
  if (!admitting && (s.state_slot < 0 || s.state_sent)) return 0;
  return s.tokens.size() + 2 * s.params.logit_bias.size();
}

LlmStepScheduler::Seq* LlmStepScheduler::live(const StepSeqRef& ref) {
  auto it = seqs_.find(ref.id);
  if (it == seqs_.end() || it->second.admission != ref.admission) return nullptr;
  return &it->second;
}

const LlmStepScheduler::Seq& LlmStepScheduler::seq(SeqId id) const {
  auto it = seqs_.find(id);
  CHECK(it != seqs_.end());
  return it->second;
}

void LlmStepScheduler::finish(Seq& s, Status st, FinishReason why, int32_t token, int64_t now_ns) {
  if (s.running) {
    running_.erase(std::find(running_.begin(), running_.end(), s.id));
    releaseStateSlot(s);
  } else {
    auto it = std::find(waiting_.begin(), waiting_.end(), s.id);
    if (it != waiting_.end()) {
      waiting_tokens_ -= s.wait_cost;
      waiting_.erase(it);
    }
  }
  releaseKv(s.id);
  SeqEvent out;
  out.id = s.id;
  out.event = lastEvent(s.index, token, std::move(st), why, s.prompt_len, s.cached_prompt,
                        s.generated, s.arrival_ns, s.first_sched_ns, now_ns);
  events_.push_back(std::move(out));
  seqs_.erase(s.id);  // s dangles from here
}

// [TAG_DISAGG] A parked sequence's stream belongs to the decode side now; an adopting one ends
// once its copy is done (its blocks may still be written).
bool LlmStepScheduler::deferEnd(Seq& s, const Status& st, FinishReason why) {
  if (s.parked) return true;
  if (!s.adopting) return false;
  if (s.end_reason == FinishReason::kNone && s.end_status.isOk()) {
    s.end_status = st;
    s.end_reason = why;
  }
  return true;
}

void LlmStepScheduler::cancel(SeqId id, int64_t now_ns) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  const Status st = cancelledError("request cancelled by the caller");
  if (deferEnd(it->second, st, FinishReason::kCancelled)) return;
  finish(it->second, st, FinishReason::kCancelled, -1, now_ns);
}

void LlmStepScheduler::stop(SeqId id, int64_t now_ns) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  if (deferEnd(it->second, okStatus(), FinishReason::kStop)) return;
  finish(it->second, okStatus(), FinishReason::kStop, -1, now_ns);
}

std::optional<SeqHandoff> LlmStepScheduler::takeHandoff(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || !it->second.parked) return std::nullopt;
  Seq& s = it->second;
  SeqHandoff h;
  h.params = std::move(s.params);
  h.tokens = std::move(s.tokens);
  h.prompt_len = s.prompt_len;
  h.generated = s.generated;
  h.cached_prompt = s.cached_prompt;
  h.index = s.index;
  h.decoder = std::move(s.decoder);
  h.arrival_ns = s.arrival_ns;
  h.first_sched_ns = s.first_sched_ns;
  const auto t = kv_->blockTable(id);
  h.table.assign(t.begin(), t.end());
  if (kvw_) {
    const auto w = kvw_->blockTable(id);
    h.window.assign(w.begin(), w.end());
  }
  return h;
}

void LlmStepScheduler::releaseHandoff(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || !it->second.parked) return;
  releaseKv(id);
  parked_.erase(std::find(parked_.begin(), parked_.end(), id));
  seqs_.erase(it);
}

Result<SeqId> LlmStepScheduler::adopt(SeqHandoff& h, std::vector<int32_t>* pairs,
                                      std::vector<int32_t>* window_pairs) {
  pairs->clear();
  window_pairs->clear();
  if (needsConfigure()) return unavailable("the decode worker's KV cache is not ready");
  if (running_.size() + adopting_ >= max_running_) {
    return resourceExhausted("the decode side's running set is full");
  }
  const uint64_t n = kv_->blocksFor(h.prompt_len);
  if (h.prompt_len == 0 || h.tokens.size() <= h.prompt_len || h.table.size() < n ||
      (kvw_ != nullptr) != !h.window.empty() || (kvw_ && h.window.size() < n) ||
      h.tokens.size() >= limits_.context_len) {
    return internalError("handoff: the prefill side's state does not fit this worker (tables "
                         "of " + std::to_string(h.table.size()) + " and " +
                         std::to_string(h.window.size()) + " blocks for " +
                         std::to_string(h.prompt_len) + " prompt tokens)");
  }
  const SeqId id = next_id_++;
  auto table = kv_->allocate(id, h.prompt_len, {}, -1);
  if (!table) return resourceExhausted("the decode side has no free KV blocks");
  for (uint64_t i = 0; i < n; ++i) {
    pairs->push_back(h.table[i]);
    pairs->push_back((*table)[i]);
  }
  if (kvw_) {  // [TAG_KV_WINDOW_GROUP] only the blocks the next query reads
    if (!kvw_->allocate(id, h.prompt_len, {}, kv_->groupOf(id))) {
      releaseKv(id);
      pairs->clear();
      return resourceExhausted("the decode side has no free window blocks");
    }
    kvw_->trim(id, h.prompt_len);
    const auto wt = kvw_->blockTable(id);
    for (uint64_t i = 0; i < n; ++i) {
      if (wt[i] < 0) continue;
      if (h.window[i] < 0) {
        releaseKv(id);
        pairs->clear();
        window_pairs->clear();
        return internalError("handoff: the prefill side dropped window block " +
                             std::to_string(i) + " that the next query reads");
      }
      window_pairs->push_back(h.window[i]);
      window_pairs->push_back(wt[i]);
    }
  }
  Seq& s = seqs_[id];
  s.id = id;
  s.index = h.index;
  s.params = std::move(h.params);
  s.tokens = std::move(h.tokens);
  s.prompt_len = h.prompt_len;
  s.generated = h.generated;
  s.cached_prompt = h.cached_prompt;
  s.decoder = std::move(h.decoder);
  s.arrival_ns = h.arrival_ns;
  s.first_sched_ns = h.first_sched_ns;
  s.admitted_once = true;
  s.num_computed = h.prompt_len;
  s.num_scheduled = h.prompt_len;
  s.adopting = true;
  ++adopting_;
  return id;
}

void LlmStepScheduler::unadopt(SeqId id, SeqHandoff* back) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || !it->second.adopting) return;
  if (back != nullptr) {
    back->params = std::move(it->second.params);
    back->tokens = std::move(it->second.tokens);
    back->decoder = std::move(it->second.decoder);
  }
  releaseKv(id);
  --adopting_;
  seqs_.erase(it);
}

void LlmStepScheduler::adopted(SeqId id, const Status& copy, int64_t now_ns) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || !it->second.adopting) return;
  Seq& s = it->second;
  s.adopting = false;
  --adopting_;
  if (!copy.isOk()) {
    finish(s, copy.code() == StatusCode::kUnavailable
                  ? copy
                  : internalError("handoff to the decode worker failed: " + copy.message()),
           FinishReason::kNone, -1, now_ns);
    return;
  }
  if (s.end_reason != FinishReason::kNone || !s.end_status.isOk()) {
    finish(s, s.end_status, s.end_reason, -1, now_ns);
    return;
  }
  if (s.params.deadline_ns > 0 && now_ns >= s.params.deadline_ns) {
    finish(s, deadlineExceeded("deadline expired after " + std::to_string(s.generated) +
                               " generated tokens"),
           FinishReason::kNone, -1, now_ns);
    return;
  }
  if (kv_lost_) {  // the decode worker went down meanwhile: the copy is gone with its cache
    finish(s, unavailable("rose worker failed during the handoff"), FinishReason::kNone, -1,
           now_ns);
    return;
  }
  s.running = true;
  if (needsSamplerState(s.params)) {
    CHECK(!free_state_slots_.empty());  // one per running sequence
    s.state_slot = free_state_slots_.back();
    free_state_slots_.pop_back();
    s.state_sent = false;
  }
  running_.push_back(id);
}

void LlmStepScheduler::expire(int64_t now_ns) {
  std::vector<SeqId> due;
  for (SeqId id : running_)
    if (const auto& p = seqs_.at(id).params; p.deadline_ns > 0 && now_ns >= p.deadline_ns)
      due.push_back(id);
  for (SeqId id : waiting_)
    if (const auto& p = seqs_.at(id).params; p.deadline_ns > 0 && now_ns >= p.deadline_ns)
      due.push_back(id);
  for (SeqId id : due) {
    Seq& s = seqs_.at(id);
    finish(s,
           deadlineExceeded("deadline expired after " + std::to_string(s.generated) +
                            " generated tokens"),
           FinishReason::kNone, -1, now_ns);
  }
}

void LlmStepScheduler::failRunning(const Status& st, int64_t now_ns) {
  const std::vector<SeqId> ids = running_;
  for (SeqId id : ids) finish(seqs_.at(id), st, FinishReason::kNone, -1, now_ns);
}

void LlmStepScheduler::failAll(const Status& running_error, const Status& waiting_error,
                               int64_t now_ns) {
  failRunning(running_error, now_ns);
  const std::deque<SeqId> ids = waiting_;
  for (SeqId id : ids) finish(seqs_.at(id), waiting_error, FinishReason::kNone, -1, now_ns);
  kv_lost_ = true;
}

void LlmStepScheduler::cancelAll(const Status& why, int64_t now_ns) {
  std::vector<SeqId> ids(running_.begin(), running_.end());
  ids.insert(ids.end(), waiting_.begin(), waiting_.end());
  // [TAG_DISAGG] Adopting ones too (shutting down: no plan reuses their blocks).
  for (const auto& [id, s] : seqs_)
    if (s.adopting) ids.push_back(id);
  for (SeqId id : ids) {
    Seq& s = seqs_.at(id);
    if (s.adopting) {
      s.adopting = false;
      --adopting_;
    }
    finish(s, why, FinishReason::kCancelled, -1, now_ns);
  }
}

void LlmStepScheduler::releaseKv(SeqId id) {
  if (kv_) kv_->free(id);
  if (kvw_) kvw_->free(id);
}

bool LlmStepScheduler::windowBlocksHeld(SeqId id, uint32_t position) const {
  const auto t = kvw_->blockTable(id);
  const uint64_t end = position / kvw_->blockSize();
  if (t.size() < end) return false;
  for (uint64_t i = kvw_->firstWindowBlock(position); i < end; ++i)
    if (t[i] < 0) return false;
  return true;
}

SeqId LlmStepScheduler::preemptionVictim(const Seq& s) const {
  const int32_t g = kv_->groupOf(s.id);
  if (g < 0 || kv_->groups() == 1) return running_.back();
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (kv_->groupOf(*it) == g) return *it;
  }
  return running_.back();
}

int32_t LlmStepScheduler::leastLoadedGroup(const std::vector<uint32_t>& load,
                                           uint64_t tokens) const {
  int32_t best = -1;
  const uint32_t need = kv_->blocksFor(tokens);
  for (uint32_t g = 0; g < load.size(); ++g) {
    const uint32_t free = kv_->blocksFreeInGroup(g);
    if (free < need) continue;
    if (best < 0 || load[g] < load[static_cast<size_t>(best)] ||
        (load[g] == load[static_cast<size_t>(best)] &&
         free > kv_->blocksFreeInGroup(static_cast<uint32_t>(best)))) {
      best = static_cast<int32_t>(g);
    }
  }
  return best;
}

void LlmStepScheduler::preempt(Seq& victim) {
  releaseKv(victim.id);
  victim.num_computed = 0;
  victim.num_scheduled = 0;
  // Tokens sampled by steps in flight are dropped with the KV: the recompute samples the same
  // ones again (the draw depends on the position only).
  victim.pending = 0;
  victim.last_sample_step = 0;
  victim.last_sample_row = -1;
  ++victim.admission;
  victim.running = false;
  victim.shared_step = 0;  // its followers wait for it to schedule its prefix again
  releaseStateSlot(victim);
  running_.erase(std::find(running_.begin(), running_.end(), victim.id));
  waiting_.push_front(victim.id);
  victim.wait_cost = static_cast<uint32_t>(victim.tokens.size());
  waiting_tokens_ += victim.wait_cost;
  ++totals_.preemptions;
}

bool LlmStepScheduler::lengthReached(const Seq& s) const {
  const uint32_t generated = s.generated + s.pending;
  return (s.params.max_tokens > 0 && generated >= s.params.max_tokens) ||
         s.length() >= limits_.context_len;
}

// Whether running sequence `s` can go into the step planned after step `prev_step` (0: none in
// flight), and if its first new token is a placeholder, that token's row in prev_step's ids.
bool LlmStepScheduler::canContinue(const Seq& s, uint64_t prev_step, int32_t* prev_row) const {
  *prev_row = -1;
  // [TAG_DISAGG] The prefill side plans nothing after a sequence's first token.
  if (opts_.handoff && s.generated + s.pending >= 1) return false;
  if (s.pending == 0) return s.num_scheduled < s.length();
  // [TAG_TOKEN_MASK] Its next mask needs the pending token: only with late masks.
  if (s.decoder && !lateMasks()) return false;
  // A pending token is always the newest one: its step planned every position before it.
  CHECK(s.num_scheduled + 1 == s.length());
  // Only the token of the step right before can be a placeholder [TAG_LLM_PREV_TOKEN], and a
  // sequence whose limits are reached with its pending tokens is ending: plan nothing more.
  if (s.pending > 1 || s.last_sample_step != prev_step || lengthReached(s)) return false;
  *prev_row = s.last_sample_row;
  return true;
}

StepPlan LlmStepScheduler::schedule(int64_t now_ns) {
  StepPlan plan;
  if (needsConfigure() || in_flight_.size() >= maxStepsInFlight()) return plan;
  const uint64_t prev_step = in_flight_.empty() ? 0 : in_flight_.back().step;
  if (!in_flight_.empty() && !opts_.constrained_overlap && !lateMasks()) {
    // [TAG_CONSTRAINED_SYNC] A constrained sequence waits for its token: plan nothing ahead, so
    // the next step takes it with everyone else once the step in flight is back.
    for (SeqId id : running_) {
      const Seq& s = seqs_.at(id);
      if (s.decoder && s.pending > 0) return plan;
    }
  }
  struct Pick {
    SeqId id;
    uint32_t position;
    uint32_t num_new;
    int32_t prev_row;
  };
  std::vector<Pick> picks;
  uint32_t budget = budget_;
  uint64_t n_tokens = 0, n_blocks = 0, n_state = 0, n_masks = 0;
  // A constrained sequence brings a token bitmask [TAG_TOKEN_MASK]. With a window pool each
  // table travels twice: the window table follows it [TAG_KV_WINDOW_GROUP].
  const uint64_t tables_per_seq = kvw_ ? 2 : 1;
  auto fits = [&](uint32_t num_new, size_t table_len, uint64_t state, bool masked) {
    const uint64_t table = table_len * tables_per_seq;
    return limits_.input_bytes == 0 ||
           shm::llmStepBytes(picks.size() + 1, n_tokens + num_new, n_blocks + table,
                             n_state + state) +
                   shm::llmMaskBytes(n_masks + (masked ? 1 : 0), limits_.vocab) +
                   (lateMasks() && n_masks + (masked ? 1 : 0) > 0 ? shm::kLateMaskHeaderBytes
                                                                  : 0) <=
               limits_.input_bytes;
  };
  bool preempted = false;
  // Grows s's table in pool `m` to cover `want` tokens, preempting while it cannot the latest
  // admitted sequence of s's block group (only its blocks can help s; one group without dp);
  // false when that was s itself.
  auto growOrPreempt = [&](KvBlockManager& m, Seq& s, uint64_t want) {
    while (!m.allocate(s.id, want, {}, kv_->groupOf(s.id))) {
      Seq& victim = seqs_.at(preemptionVictim(s));
      preempt(victim);
      preempted = true;
      if (&victim == &s) return false;
    }
    return true;
  };
  // Running sequences, in admission order; victims come from the tail (never one already
  // picked: those are ahead of i).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Seq& s = seqs_.at(running_[i]);
    int32_t prev_row = -1;
    if (!canContinue(s, prev_step, &prev_row)) {
      ++i;
      continue;
    }
    const uint32_t num_new = std::min(s.length() - s.num_scheduled, budget);
    const uint64_t want = uint64_t{s.num_scheduled} + num_new;
    bool self = !growOrPreempt(*kv_, s, want);
    // [TAG_KV_WINDOW_GROUP] The window pool: drop what no query from here on reads, then grow
    // the same way.
    if (!self && kvw_) {
      kvw_->trim(s.id, s.num_scheduled);
      self = !growOrPreempt(*kvw_, s, want);
    }
    // s preempted itself: with one block group every later sequence went before it (victims
    // come from the tail); with several, later ones of other groups go on (running_[i] is the
    // next one now).
    if (self) continue;
    const auto table = kv_->blockTable(s.id);
    const uint64_t state = stateWords(s, false);
    if (!fits(num_new, table.size(), state, s.decoder != nullptr)) {
      ++i;
      continue;
    }
    picks.push_back(Pick{s.id, s.num_scheduled, num_new, prev_row});
    n_masks += s.decoder ? 1 : 0;
    n_tokens += num_new;
    n_blocks += table.size() * tables_per_seq;
    n_state += state;
    budget -= num_new;
    ++i;
  }
  // [TAG_DP_ADMIT] With several block groups (rose --dp): the running sequences per group, the
  // load a new sequence is placed by (each running sequence adds a token to every step of its
  // group, and the step is as slow as its busiest group).
  std::vector<uint32_t> group_load;
  if (kv_->groups() > 1 && !preempted && !waiting_.empty()) {  // only when admitting
    group_load.assign(kv_->groups(), 0);
    for (SeqId id : running_) {
      const int32_t g = kv_->groupOf(id);
      if (g >= 0) ++group_load[static_cast<size_t>(g)];
    }
  }
  // Waiting sequences, first come first served, unless this step had to preempt. A follower that
  // cannot fork yet keeps its place and is passed over [TAG_LLM_CHOICES].
  size_t w = 0;
  while (!preempted && w < waiting_.size() && running_.size() < max_running_ && budget > 0) {
    Seq& s = seqs_.at(waiting_[w]);
    if (s.tokens.size() >= limits_.context_len) {
      // Only after a restart with a smaller cache: it can never run (validateGenerate keeps
      // fresh requests out).
      finish(s, outOfRange("sequence no longer fits the worker's context"), FinishReason::kNone, -1,
             now_ns);
      continue;
    }
    const Seq* lead = nullptr;
    uint32_t shared = 0;
    if (s.leader != 0) {
      auto it = seqs_.find(s.leader);
      if (it != seqs_.end()) {
        lead = &it->second;
        shared = sharedTokens(*lead);
      }
      if (lead == nullptr || shared == 0) {
        // The leader is gone, or there is no full block to share: an ordinary request now.
        s.leader = 0;
        lead = nullptr;
      } else if (!lead->running || lead->shared_step == 0) {
        ++w;  // its prefix is not scheduled by an earlier plan yet
        continue;
      } else if (kvw_ && !windowBlocksHeld(lead->id, shared)) {
        // [TAG_KV_WINDOW_GROUP] The leader's window has moved past the blocks the follower's
        // first query reads: nothing to fork, an ordinary request now.
        s.leader = 0;
        lead = nullptr;
      }
    }
    std::vector<int32_t> prefix, wprefix;
    if (lead == nullptr) prefix = kv_->findCachedPrefix(s.tokens);
    if (kvw_ && !prefix.empty()) {
      // [TAG_KV_WINDOW_GROUP] The joint hit: the longest prefix of the full-attention hit whose
      // window blocks are cached too, in the same dp group.
      wprefix = kvw_->findCachedWindowPrefix(
          s.tokens, prefix.size(), static_cast<int32_t>(kv_->groupOfBlock(prefix.back())));
      prefix.resize(wprefix.size());
    }
    uint32_t computed = lead ? shared : static_cast<uint32_t>(prefix.size()) * kv_->blockSize();
    uint32_t num_new = std::min(static_cast<uint32_t>(s.tokens.size()) - computed, budget);
    std::optional<std::span<const int32_t>> table;
    bool forgone = false;  // [TAG_DP_ADMIT] the cached prefix given up for another group
    if (lead) {
      table = kv_->fork(s.id, lead->id, shared / kv_->blockSize(), uint64_t{computed} + num_new);
    } else {
      // [TAG_DP_ADMIT] A new sequence without a cached prefix goes to the least loaded group
      // with room; one whose prefix lies in a group without room starts over there instead of
      // waiting while another group has room (its prefix is computed again).
      auto group = [&] {
        return prefix.empty() ? leastLoadedGroup(group_load, computed + num_new) : -1;
      };
      table = kv_->allocate(s.id, uint64_t{computed} + num_new, prefix, group());
      if (!table && !group_load.empty() && !prefix.empty()) {
        prefix.clear();
        wprefix.clear();
        computed = 0;
        num_new = std::min(static_cast<uint32_t>(s.tokens.size()), budget);
        table = kv_->allocate(s.id, num_new, prefix, group());
        forgone = table.has_value();
      }
    }
    if (!table) break;
    if (kvw_) {  // [TAG_KV_WINDOW_GROUP]
      auto wt = lead ? kvw_->fork(s.id, lead->id, shared / kv_->blockSize(),
                                  uint64_t{computed} + num_new)
                     : kvw_->allocate(s.id, uint64_t{computed} + num_new, wprefix,
                                      kv_->groupOf(s.id));
      if (!wt) {
        releaseKv(s.id);
        break;
      }
    }
    const uint64_t state = stateWords(s, true);
    if (!fits(num_new, table->size(), state, s.decoder != nullptr)) {
      releaseKv(s.id);
      break;
    }
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
    waiting_tokens_ -= s.wait_cost;
    s.wait_cost = 0;
    if (lead) {
      s.fork_step = lead->shared_step;
      s.leader = 0;
    }
    n_masks += s.decoder ? 1 : 0;
    s.running = true;
    if (needsSamplerState(s.params)) {
      CHECK(!free_state_slots_.empty());  // one per running sequence
      s.state_slot = free_state_slots_.back();
      free_state_slots_.pop_back();
      s.state_sent = false;
    }
    s.num_computed = computed;
    s.num_scheduled = computed;
    running_.push_back(s.id);
    if (!group_load.empty()) ++group_load[static_cast<size_t>(kv_->groupOf(s.id))];
    totals_.dp_prefix_forgone += forgone ? 1 : 0;
    if (!s.admitted_once) {
      s.admitted_once = true;
      s.cached_prompt = computed;
      s.first_sched_ns = now_ns;
      if (s.fork_step != 0) {
        totals_.shared_prompt_tokens += computed;
      } else {
        totals_.cached_prompt_tokens += computed;
        totals_.queried_prompt_tokens += s.prompt_len;
      }
    }
    picks.push_back(Pick{s.id, computed, num_new, -1});
    n_tokens += num_new;
    n_blocks += table->size() * tables_per_seq;
    n_state += state;
    budget -= num_new;
  }
  if (picks.empty()) return plan;
  plan.step = ++last_step_;
  plan.seqs.reserve(picks.size());
  plan.refs.reserve(picks.size());
  plan.tokens.reserve(n_tokens);
  plan.block_ids.reserve(n_blocks);
  std::vector<MaskFill> fills;
  for (const Pick& p : picks) {
    Seq& s = seqs_.at(p.id);
    auto table = kv_->blockTable(s.id);
    llm::LlmStepSeq d;
    d.token_offset = static_cast<int32_t>(plan.tokens.size());
    d.num_tokens = static_cast<int32_t>(p.num_new);
    d.position = static_cast<int32_t>(p.position);
    d.block_offset = static_cast<int32_t>(plan.block_ids.size());
    d.num_blocks = static_cast<int32_t>(table.size());
    d.logits = llm::LogitsMode::kNone;
    d.sample = p.position + p.num_new == s.length() ? 1 : 0;
    d.sampling = s.params.sampling;
    d.sampling.state_slot = s.state_slot;
    d.prev_row = p.prev_row;
    if (s.state_slot >= 0 && !s.state_sent) {
      // [TAG_LLM_SAMPLER_STATE] The reload: prompt, generated tokens known, logit_bias.
      d.state_offset = static_cast<int32_t>(plan.state.size());
      d.state_prompt = static_cast<int32_t>(s.prompt_len);
      d.state_output = static_cast<int32_t>(s.tokens.size() - s.prompt_len);
      d.state_bias = static_cast<int32_t>(s.params.logit_bias.size());
      plan.state.insert(plan.state.end(), s.tokens.begin(), s.tokens.end());
      for (const LogitBiasEntry& b : s.params.logit_bias) {
        int32_t bits;
        std::memcpy(&bits, &b.bias, sizeof(bits));
        plan.state.push_back(b.token_id);
        plan.state.push_back(bits);
      }
      s.state_sent = true;
    }
    if (p.prev_row >= 0) {
      CHECK(p.num_new == 1 && p.position == s.tokens.size());
      plan.tokens.push_back(-1);  // the worker takes it from the previous step's ids
    } else {
      plan.tokens.insert(plan.tokens.end(), s.tokens.begin() + p.position,
                         s.tokens.begin() + p.position + p.num_new);
    }
    plan.block_ids.insert(plan.block_ids.end(), table.begin(), table.end());
    if (kvw_) {  // [TAG_KV_WINDOW_GROUP] the window table right after it, the same length
      auto wt = kvw_->blockTable(s.id);
      CHECK(wt.size() == table.size());
      plan.block_ids.insert(plan.block_ids.end(), wt.begin(), wt.end());
      d.window_table = 1;
    }
    plan.refs.push_back(StepSeqRef{s.id, s.admission});
    if (p.position < s.prompt_len)
      plan.prompt_tokens += std::min(p.position + p.num_new, s.prompt_len) - p.position;
    s.num_scheduled = p.position + p.num_new;
    if (s.index == 0 && s.params.n > 1 && s.shared_step == 0 && s.num_scheduled >= sharedTokens(s))
      s.shared_step = plan.step;  // [TAG_LLM_CHOICES] its followers may fork from the next plan
    // [TAG_TOKEN_MASK] A mask when its grammar is active; planned ahead of its pending token
    // ([TAG_LATE_MASKS]) whether that token leaves it active is not known yet: always one.
    const bool late_mask = p.prev_row >= 0 && s.decoder != nullptr;
    if (d.sample && s.decoder && (late_mask || s.decoder->active())) {
      const size_t words = shm::llmMaskWords(limits_.vocab);
      CHECK(s.decoder->maskWords() == words);
      const size_t at = plan.masks.size();
      plan.masks.resize(at + words);
      if (late_mask) {
        plan.late.push_back(StepPlan::LateMask{static_cast<uint32_t>(plan.seqs.size()), at});
      } else {
        fills.push_back(MaskFill{s.decoder.get(), at});  // filled below, once every slot exists
      }
      d.mask_index = static_cast<int32_t>(at / words) + 1;
    }
    if (d.sample) {
      ++s.pending;
      s.last_sample_step = plan.step;
      s.last_sample_row = static_cast<int32_t>(plan.num_sampled++);
    }
    plan.seqs.push_back(d);
  }
  fillMasks(fills, plan.masks);
  if (!plan.masks.empty()) ++totals_.masked_steps;
  plan.num_tokens = plan.tokens.size();
  plan.request_id = seqs_.at(picks.front().id).params.request_id;
  in_flight_.push_back(InFlight{plan.step, plan.num_tokens});
  return plan;
}

// The masks: one per constrained sampled sequence, each from its own decoder, so they can be
// filled on several threads ([TAG_MASK_POOL]).
void LlmStepScheduler::fillMasks(const std::vector<MaskFill>& fills, std::vector<uint32_t>& masks) {
  if (fills.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t words = shm::llmMaskWords(limits_.vocab);
  auto fill = [&](int64_t i, int) {
    const MaskFill& f = fills[static_cast<size_t>(i)];
    f.decoder->fillMask(std::span<uint32_t>(masks.data() + f.at, words));
  };
  if (mask_pool_ != nullptr) {
    mask_pool_->parallelTasks(static_cast<int64_t>(fills.size()), fill);
  } else {
    for (size_t i = 0; i < fills.size(); ++i) fill(static_cast<int64_t>(i), 0);
  }
  totals_.masks += fills.size();
  totals_.mask_fill_ns += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
}

void LlmStepScheduler::fillLateMasks(StepPlan& plan) {
  CHECK(!in_flight_.empty() && in_flight_.front().step == plan.step);
  const size_t words = shm::llmMaskWords(limits_.vocab);
  std::vector<MaskFill> fills;
  for (const StepPlan::LateMask& l : plan.late) {
    CHECK(l.at + words <= plan.masks.size());
    Seq* s = live(plan.refs[l.seq]);
    if (s != nullptr && s->decoder && s->decoder->active()) {
      fills.push_back(MaskFill{s->decoder.get(), l.at});
    } else {
      std::fill_n(plan.masks.begin() + static_cast<std::ptrdiff_t>(l.at), words, ~0u);
    }
  }
  fillMasks(fills, plan.masks);
  ++totals_.late_mask_steps;
}

void LlmStepScheduler::lateMasksLost(const StepPlan& plan, int64_t now_ns) {
  // Every mask of the step went with the late ones: none of its masked draws was constrained.
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (plan.seqs[i].mask_index <= 0) continue;
    if (Seq* s = live(plan.refs[i])) {
      finish(*s,
             internalError("structured output: the token masks did not reach rose in time, so "
                           "its token was drawn unconstrained"),
             FinishReason::kNone, -1, now_ns);
    }
  }
}

void LlmStepScheduler::update(const StepPlan& plan, std::span<const int32_t> sampled,
                              int64_t now_ns, std::span<const llm::LlmTokenLogprobs> logprobs) {
  CHECK(!in_flight_.empty() && in_flight_.front().step == plan.step);
  if (sampled.size() != plan.num_sampled) {
    stepFailed(
        plan,
        internalError("rose returned " + std::to_string(sampled.size()) +
                      " token ids for a step that sampled " + std::to_string(plan.num_sampled)),
        now_ns);
    return;
  }
  if (!logprobs.empty() && logprobs.size() != sampled.size()) {
    stepFailed(plan,
               internalError("rose returned " + std::to_string(logprobs.size()) +
                             " logprob entries for " + std::to_string(sampled.size()) + " ids"),
               now_ns);
    return;
  }
  in_flight_.pop_front();
  ++totals_.steps;
  totals_.computed_prompt_tokens += plan.prompt_tokens;
  size_t k = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const llm::LlmStepSeq& d = plan.seqs[i];
    const llm::LlmTokenLogprobs* lp = d.sample && !logprobs.empty() ? &logprobs[k] : nullptr;
    const int32_t tok = d.sample ? sampled[k++] : -1;
    Seq* s = live(plan.refs[i]);
    if (!s) continue;  // finished or preempted since: its work here is dropped
    s->num_computed = static_cast<uint32_t>(d.position + d.num_tokens);
    if (d.sample) {
      // The oldest pending token: steps complete in plan order.
      s->tokens.push_back(tok);
      if (s->decoder) (void)s->decoder->accept(tok);  // [TAG_TOKEN_MASK]
      --s->pending;
      ++s->generated;
      ++totals_.generated_tokens;
    }
    // Only known tokens are hashed: num_computed never passes them.
    kv_->commit(s->id, s->tokens, s->num_computed);
    if (kvw_) kvw_->commit(s->id, s->tokens, s->num_computed);
    if (!d.sample) continue;
    const GenerateParams& p = s->params;
    const bool with_lp = p.sampling.logprobs >= 0 && lp != nullptr && lp->num_top >= 0;
    bool ended = true;
    if ((!p.ignore_eos && contains(limits_.eos_ids, tok)) || contains(p.stop_token_ids, tok)) {
      finish(*s, okStatus(), FinishReason::kStop, tok, now_ns);
    } else if ((p.max_tokens > 0 && s->generated >= p.max_tokens) ||
               s->tokens.size() >= limits_.context_len) {
      finish(*s, okStatus(), FinishReason::kLength, tok, now_ns);
    } else {
      SeqEvent ev;
      ev.id = s->id;
      ev.event.index = s->index;
      ev.event.token = tok;
      events_.push_back(std::move(ev));
      ended = false;
    }
    if (with_lp) {  // the event just formed (a token or the last one) carries it
      events_.back().event.has_logprobs = true;
      events_.back().event.logprobs = *lp;
    }
    if (!ended && opts_.handoff) park(*s);  // [TAG_DISAGG]
  }
}

void LlmStepScheduler::park(Seq& s) {
  CHECK(s.running && s.pending == 0);
  running_.erase(std::find(running_.begin(), running_.end(), s.id));
  releaseStateSlot(s);
  s.running = false;
  s.parked = true;
  parked_.push_back(s.id);
  SeqEvent h;
  h.id = s.id;
  h.handoff = true;
  events_.push_back(std::move(h));
}

void LlmStepScheduler::stepFailed(const StepPlan& plan, const Status& error, int64_t now_ns) {
  CHECK(!in_flight_.empty() && in_flight_.front().step == plan.step);
  in_flight_.pop_front();
  ++totals_.steps;
  if (error.code() == StatusCode::kInvalidArgument || error.code() == StatusCode::kInternal) {
    // The step was refused as a whole (nothing written): end the sequences it carried.
    for (const StepSeqRef& ref : plan.refs) {
      if (Seq* s = live(ref))
        finish(*s, internalError("generation step failed: " + error.message()), FinishReason::kNone,
               -1, now_ns);
    }
    // Choices forked after this step read prompt KV it never wrote [TAG_LLM_CHOICES].
    std::vector<SeqId> forked;
    for (SeqId id : running_)
      if (seqs_.at(id).fork_step == plan.step) forked.push_back(id);
    for (SeqId id : forked)
      finish(seqs_.at(id), internalError("generation step failed: " + error.message()),
             FinishReason::kNone, -1, now_ns);
    return;
  }
  // The worker died or went away: every running sequence's KV is gone.
  failRunning(unavailable("rose worker failed during generation: " + error.message()), now_ns);
  kv_lost_ = true;
}

void LlmStepScheduler::retract(const StepPlan& plan) {
  CHECK(!in_flight_.empty() && in_flight_.back().step == plan.step);
  in_flight_.pop_back();
  const uint64_t prev_step = in_flight_.empty() ? 0 : in_flight_.back().step;
  for (size_t i = plan.seqs.size(); i-- > 0;) {
    const llm::LlmStepSeq& d = plan.seqs[i];
    Seq* s = live(plan.refs[i]);
    if (!s) continue;
    s->num_scheduled = static_cast<uint32_t>(d.position);
    if (s->shared_step == plan.step) s->shared_step = 0;
    if (d.state_offset >= 0) s->state_sent = false;  // the next plan sends the reload again
    if (!d.sample) continue;
    --s->pending;
    // A placeholder continued the token prev_step samples: that one is the newest pending again.
    s->last_sample_step = d.prev_row >= 0 ? prev_step : 0;
    s->last_sample_row = d.prev_row;
  }
  // Sequences this plan admitted stay running with their blocks (a valid state: their prompt
  // is simply not computed yet); preemptions it made stand.
}

std::vector<SeqEvent> LlmStepScheduler::takeEvents() {
  std::vector<SeqEvent> out;
  out.swap(events_);
  return out;
}

LlmStats LlmStepScheduler::stats() const {
  LlmStats s = totals_;
  s.running = static_cast<uint32_t>(running_.size());
  s.waiting = static_cast<uint32_t>(waiting_.size());
  s.waiting_tokens = waiting_tokens_;
  for (const InFlight& f : in_flight_) s.inflight_tokens += f.num_tokens;
  s.inflight_steps = static_cast<uint32_t>(in_flight_.size());
  s.max_waiting_tokens = opts_.max_waiting_tokens;
  if (kv_) {
    s.kv_free_blocks = kv_->blocksFree();
    s.kv_used_blocks = kv_->blocksUsed();
    s.kv_total_blocks = kv_->blocksTotal();
  }
  if (kvw_) {  // [TAG_KV_WINDOW_GROUP]
    s.kv_window_free_blocks = kvw_->blocksFree();
    s.kv_window_used_blocks = kvw_->blocksUsed();
    s.kv_window_total_blocks = kvw_->blocksTotal();
  }
  return s;
}

}  // namespace garden::tulip
