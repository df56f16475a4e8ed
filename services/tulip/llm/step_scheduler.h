#pragma once
// LlmStepScheduler: the decision part of tulip's continuous batching of text generation, as a
// plain synchronous state machine (vLLM v1's scheduler is the model):
//
//   StepPlan plan = sched.schedule(now);        // what the next forward step computes
//   ... the worker runs plan (its arrays are the shm step verbatim) ...
//   sched.update(plan, sampled_ids, now);       // what it sampled
//   for (SeqEvent& e : sched.takeEvents()) ...  // tokens and ends of streams, in order
//
// It owns the waiting and running sequences and the KV block bookkeeping (KvBlockManager); it
// has no threads, reads no clock (every call that stamps time takes `now`) and never blocks, so
// tests drive it step by step as tables of expected states. The threaded driver (LlmScheduler,
// llm_scheduler.h) feeds it requests and worker results and hands its plans to the worker.
//
// Each request is a sequence whose scheduled tokens (KV written or being written) catch up with
// its tokens (prompt + generated): no prefill or decode modes. A step takes, under a token budget
// (max_batch_tokens) and a sequence cap (max_num_seqs), first the running sequences in admission
// order (a decode is 1 token, an unfinished prompt a chunk), then waiting ones first come first
// served (a cached prefix of full blocks skips recompute; the rest of the prompt is prefilled in
// chunks). A sequence whose last token is in the step samples one new token. When KV blocks run
// out, the most recently admitted running sequence is preempted by recompute: its blocks are
// freed and it goes back to the front of the waiting queue with its generated tokens appended to
// its prompt (rose's sampling counter is position + num_tokens, so the recomputed draw is the
// same one); a step that had to preempt admits no waiting sequence.
//
// Generation stops on an eos id (unless ignore_eos) or a stop_token_id (FINISH_STOP, the stop
// token is the last one streamed), after max_tokens or at the context length (FINISH_LENGTH), on
// cancel() (FINISH_CANCELLED), on stop() (FINISH_STOP: the caller's own stop condition) or at
// its deadline (DEADLINE_EXCEEDED, expire()); a finished sequence frees its blocks at once. A
// step the worker refused (INVALID_ARGUMENT, INTERNAL: nothing was written) ends the sequences it
// carried; any other failure means the worker lost its KV cache: every running sequence ends
// UNAVAILABLE and configure() must rebuild the bookkeeping before the next step (once no step is
// in flight).
//
// Two steps in flight [TAG_LLM_PREV_TOKEN] (options.async_steps): schedule() may plan step N+1
// while step N is still on the worker. A sequence that step N samples continues in N+1 from a
// placeholder: its KV position is allocated, its token is written -1 and LlmStepSeq.prev_row
// names its row in step N's sampled ids, which the worker resolves. update(N) fills in the real
// token before any block holding it is hashed into the prefix cache (commit happens in step
// order, and only over known tokens). A sequence that step N finishes (eos, stop) or that is
// cancelled, expires or is preempted meanwhile has its later work dropped: its entry in N+1 is
// stale (plan entries carry the sequence's admission number) and N+1's token for it is never
// streamed. A sequence is planned ahead only when its length limits still allow another token,
// so only eos/stop tokens waste a speculative step. Blocks freed while a step is in flight are
// safe to hand out in the next plan: the worker runs steps in order, and an in-flight step never
// writes a block that is full and cached.
//
// Sampler state [TAG_LLM_SAMPLER_STATE]: a request with penalties or a logit_bias holds one of
// the worker's state slots (0 .. max running - 1; rose has max_seqs of them) while it is running.
// The first plan that carries it after each admission reloads the slot with its prompt, its
// generated tokens so far and its logit_bias (StepPlan.state); from then on rose counts the
// tokens it samples itself, so nothing more crosses per step, and a token sampled by the step
// in flight is already counted when the next step samples [TAG_LLM_PREV_TOKEN]. The slot is
// released when the sequence finishes or is preempted (its re-admission reloads a fresh one);
// a retracted plan's reload is sent again by the next plan.
//
// Choices (GenerateParams::n > 1) [TAG_LLM_CHOICES]: add() queues n sequences, ids id .. id+n-1,
// choice i sampling with seed + i. Choice 0 (the leader) is scheduled like any request. The others
// (followers) wait, keeping their place in the queue but skipped by it, until a plan *before* the
// one being formed has scheduled the leader's shareable prefix: the full blocks of its prompt
// minus the last token. A follower is then admitted on those blocks (KvBlockManager::fork: shared
// by reference, never written again, so nothing is copied) and computes only the rest of the
// prompt (1 .. block_size tokens, into its own fresh block) before sampling its first token. The
// steps run in order on the worker, so the shared KV is written before a follower reads it. The
// prompt is thus prefilled once; LlmStats::computed_prompt_tokens counts what steps computed. A
// follower whose leader is gone (finished, or cancelled) before it could fork falls back to the
// prefix cache like any request; one forked off a step the worker refused ends with it. After it
// is admitted a follower is an ordinary sequence (preempted, recomputed, finished on its own). A
// waiting follower counts no prompt tokens against max_waiting_tokens (its prompt is the
// leader's); every choice counts as a sequence against max_num_seqs.
//
// Prefill/decode disaggregation [TAG_DISAGG] (docs/multi-gpu.md): a scheduler with
// options.handoff (the prefill side) hands every sequence off once its first token is sampled —
// unless that token ends it (eos, a stop token, max_tokens 1, the context) — instead of planning
// its second one: update() streams the first token as usual, then parks the sequence (out of the
// running set, its KV blocks kept) and emits a SeqEvent with handoff set; the driver takes the
// sequence's state with takeHandoff() and frees the parked blocks with releaseHandoff() once
// the decode side has copied them. The decode side adopt()s the state: blocks for the prompt's
// KV are allocated (the window pool's trimmed to what the next query reads), the sequence waits
// outside the queues while the driver copies the blocks (a kKvPull batch), and adopted() makes
// it a running sequence whose next step computes the first token's KV and samples the second —
// or ends it with the copy's error, or with a cancel / stop / deadline that came meanwhile
// (blocks a copy is still writing are never handed out again before adopted()). From there it
// is an ordinary sequence (a preemption recomputes its tokens on the decode side).
//
// Threads: not thread-safe; one owner (the driver calls it under its mutex).

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/llm/step.h"
#include "common/shm/channel.h"
#include "common/status.h"
#include "services/tulip/kv/block_manager.h"
#include "services/tulip/llm/generate_request.h"
#include "common/thread_pool.h"

namespace garden::tulip {

struct LlmSchedulerOptions {
  uint32_t max_batch_tokens = 8192;        // tokens per step
  uint32_t max_num_seqs = 256;             // running sequences (and so sequences per step)
  uint64_t max_waiting_tokens = 1u << 20;  // prompt tokens waiting; beyond: RESOURCE_EXHAUSTED
  bool enable_prefix_caching = true;
  // Plan step N+1 while step N runs (two steps in flight, [TAG_LLM_PREV_TOKEN]). Needs a worker
  // that resolves LlmStepSeq.prev_row and a pipeline depth >= 2.
  bool async_steps = false;
  // Helper threads that fill a step's structured-output token masks beside the scheduler's
  // thread when it has several constrained sequences ([TAG_MASK_POOL], a common/thread_pool.h of
  // mask_threads + 1, each mask from its own sequence's decoder); 0: the scheduler's thread fills
  // them one after the other.
  uint32_t mask_threads = 0;
  // With async_steps, a constrained sequence cannot be planned ahead of its pending token (its
  // next mask depends on it). false (the default): while one is waiting for its token, no step is
  // planned ahead — the next plan waits for the step in flight and takes every sequence, one step
  // in flight. true: the others are planned ahead without it, and constrained sequences advance
  // every other step (measured on the H200 at 64 constrained streams: the batch splits into two
  // alternating halves, inter-token latency 16.8 vs 9.4 ms unconstrained; [TAG_CONSTRAINED_SYNC]).
  bool constrained_overlap = false;
  // [TAG_DISAGG] The prefill side of disaggregation: hand sequences off after their first
  // token (see the header comment).
  bool handoff = false;
  // Late masks [TAG_LATE_MASKS]: with async_steps and a worker that announces
  // shm::kLlmCapLateMask, constrained sequences are planned ahead like the others; the masks of
  // such a step are filled (fillLateMasks()) once the step before has returned and handed to the
  // worker while it runs the forward pass. Takes precedence over constrained_overlap.
  bool late_masks = true;
};

// What the scheduler needs to know about the worker: its KV cache and its step limits.
struct LlmWorkerLimits {
  uint32_t kv_num_blocks = 0;
  uint32_t kv_block_size = 0;
  uint32_t kv_block_groups = 1;   // dp groups: a sequence's blocks lie in one (KvOptions::groups)
  // [TAG_KV_WINDOW_GROUP] A second pool for sliding-window layers of `kv_window` keys:
  // kv_num_blocks_window blocks (0: none, every layer reads the one table); ModelFacts
  // kv_num_blocks_window / kv_window.
  uint32_t kv_num_blocks_window = 0;
  uint32_t kv_window = 0;
  uint32_t context_len = 0;       // tokens one sequence may reach (prompt + generated)
  uint32_t max_seqs = 0;          // sequences per step (0 = no limit of the worker's)
  uint32_t max_batch_tokens = 0;  // new tokens per step (0 = no limit of the worker's)
  uint64_t input_bytes = 0;       // bytes of one step's input arena (0 = no limit)
  std::vector<int32_t> eos_ids;
  uint32_t vocab = 0;  // token bitmask width (structured outputs, [TAG_TOKEN_MASK])
  bool late_masks = false;  // the worker takes masks after the step [TAG_LATE_MASKS]
};

// The limits of a worker that reported `facts` and has `input_bytes` of input arena per slot.
LlmWorkerLimits llmWorkerLimits(const shm::ModelFacts& facts, uint64_t input_bytes);

// A planned sequence's identity: plan entries of an earlier admission (before a preemption) or
// of a finished sequence are stale and ignored by update().
struct StepSeqRef {
  SeqId id = 0;
  uint32_t admission = 0;
};

// One step, in the shm layout's three arrays (common/shm/llm_batch.h, [TAG_LLM_STEP_FORMAT]):
// `seqs`, `tokens` and `block_ids` go to the worker verbatim. A placeholder token is -1 with
// seqs[i].prev_row >= 0 ([TAG_LLM_PREV_TOKEN]). update() and retract() read only `step`,
// `seqs`, `refs` and `num_sampled`, so the driver may move `tokens` and `block_ids` out.
struct StepPlan {
  uint64_t step = 0;  // 1, 2, ... in the order schedule() formed them; 0: no step
  std::vector<llm::LlmStepSeq> seqs;
  std::vector<int32_t> tokens;
  // [TAG_KV_WINDOW_GROUP] With a window pool, seqs[i].window_table = 1 and its window table
  // follows its block table: block_ids[block_offset + num_blocks, + num_blocks) (-1 where its
  // window dropped a block).
  std::vector<int32_t> block_ids;
  std::vector<int32_t> state;    // sampler-state reloads [TAG_LLM_SAMPLER_STATE]
  std::vector<StepSeqRef> refs;  // refs[i]: the sequence seqs[i] belongs to
  // Token bitmasks of constrained sequences [TAG_TOKEN_MASK]: seqs[i].mask_index k > 0 names
  // masks[(k - 1) * W, k * W), W = shm::llmMaskWords(vocab).
  std::vector<uint32_t> masks;
  // Late masks [TAG_LATE_MASKS]: constrained sequences planned ahead of their pending token.
  // Their masks are left unfilled by schedule() and filled by fillLateMasks(); the driver then
  // hands the whole `masks` array to the worker after the step was submitted. Empty: `masks` is
  // complete when planned and goes with the step.
  struct LateMask {
    uint32_t seq = 0;  // index into seqs / refs
    size_t at = 0;     // first word in masks
  };
  std::vector<LateMask> late;
  uint32_t num_sampled = 0;      // sequences with sample != 0: the ids the worker returns
  uint64_t num_tokens = 0;       // tokens.size(), kept when the arrays are moved out
  uint64_t prompt_tokens = 0;    // prompt positions among them (LlmStats::computed_prompt_tokens)
  std::string request_id;        // the first sequence's, for the worker's log line
  bool empty() const { return seqs.empty(); }
};

// An event of sequence `id`'s stream (see GenerateEvent: zero or more tokens, then one last).
// handoff [TAG_DISAGG]: not a stream event — the sequence was parked for takeHandoff().
struct SeqEvent {
  SeqId id = 0;
  GenerateEvent event;
  bool handoff = false;
};

// A sequence leaving a prefill scheduler for a decode one [TAG_DISAGG].
struct SeqHandoff {
  GenerateParams params;        // the prompt moved into `tokens`
  std::vector<int32_t> tokens;  // the prompt, then the generated token(s)
  uint32_t prompt_len = 0;
  uint32_t generated = 0;
  uint32_t cached_prompt = 0;
  uint32_t index = 0;  // the choice
  std::shared_ptr<grammar::ConstrainedDecoder> decoder;  // advanced past the generated tokens
  int64_t arrival_ns = 0;
  int64_t first_sched_ns = 0;
  // Its blocks on the prefill worker: KV of positions [0, prompt_len) (plus, with a window pool,
  // the window table, -1 where dropped; empty without one).
  std::vector<int32_t> table;
  std::vector<int32_t> window;
};

// The last event of a handed-off sequence that ends before a decode scheduler took it (a copy
// never started: cancelled while queued, no decode side, shutting down): `st` (OK with `why`, or
// the error), the counts and timing it had, up to `now_ns`.
GenerateEvent handoffLastEvent(const SeqHandoff& h, Status st, FinishReason why, int64_t now_ns);

struct LlmStats {
  uint32_t running = 0;
  uint32_t waiting = 0;
  uint64_t waiting_tokens = 0;
  uint64_t inflight_tokens = 0;  // tokens of the steps in flight
  uint32_t inflight_steps = 0;
  uint64_t max_waiting_tokens = 0;
  uint32_t kv_free_blocks = 0;
  uint32_t kv_used_blocks = 0;
  uint32_t kv_total_blocks = 0;
  // [TAG_KV_WINDOW_GROUP] The sliding layers' pool (all 0 without one).
  uint32_t kv_window_free_blocks = 0;
  uint32_t kv_window_used_blocks = 0;
  uint32_t kv_window_total_blocks = 0;
  uint64_t preemptions = 0;
  uint64_t cached_prompt_tokens = 0;   // prompt tokens served from the prefix cache
  uint64_t shared_prompt_tokens = 0;   // prompt tokens a choice took from its leader's blocks
  uint64_t computed_prompt_tokens = 0; // prompt positions of the steps the worker ran
  uint64_t queried_prompt_tokens = 0;  // prompt tokens looked up in the prefix cache
  // [TAG_DP_ADMIT] sequences started in another block group than their cached prefix's (that
  // group had no room; the prefix was computed again)
  uint64_t dp_prefix_forgone = 0;
  uint64_t generated_tokens = 0;
  uint64_t steps = 0;  // steps whose result (or failure) came back
  // Structured outputs [TAG_MASK_POOL]: planned steps with masks, the masks in them, and the
  // scheduler's wall time filling them.
  uint64_t masked_steps = 0;
  uint64_t masks = 0;
  uint64_t mask_fill_ns = 0;
  uint64_t late_mask_steps = 0;  // steps whose masks were filled late [TAG_LATE_MASKS]
};

class LlmStepScheduler {
 public:
  explicit LlmStepScheduler(LlmSchedulerOptions opts);
  ~LlmStepScheduler();
  LlmStepScheduler(const LlmStepScheduler&) = delete;
  LlmStepScheduler& operator=(const LlmStepScheduler&) = delete;

  const LlmSchedulerOptions& options() const { return opts_; }
  // Steps that may be planned ahead of their results: 2 with async_steps, else 1.
  uint32_t maxStepsInFlight() const { return opts_.async_steps ? 2 : 1; }

  // (Re)builds the KV bookkeeping for a worker with `limits`: an empty cache. Only while no
  // running sequence holds blocks and no step is in flight; returns false (nothing changed)
  // otherwise. Waiting sequences stay queued.
  bool configure(const LlmWorkerLimits& limits);
  // True until configure() has run, and again after the worker lost its KV cache.
  bool needsConfigure() const { return kv_ == nullptr || kv_lost_; }

  // Queues a validated request (validateGenerate); its seed is final. RESOURCE_EXHAUSTED when
  // the waiting prompts would exceed max_waiting_tokens. Returns the first sequence's id; a
  // request with params.n > 1 is n sequences with consecutive ids (choice i = id + i).
  Result<SeqId> add(GenerateParams params, int64_t now_ns);
  // Ends `id` with FINISH_CANCELLED (no-op for an unknown or finished id).
  void cancel(SeqId id, int64_t now_ns);
  // Ends `id` with status OK and FINISH_STOP: the caller found a stop of its own in the tokens
  // streamed so far (ivy's stop strings, [TAG_STOP_CHOICE]). Like cancel() it frees the blocks at
  // once and drops the work of steps in flight (their tokens are never streamed); the other
  // choices of the request go on. completion_tokens counts the tokens known so far. No-op for an
  // unknown or finished id.
  void stop(SeqId id, int64_t now_ns);
  // Ends every sequence whose deadline is <= now_ns with DEADLINE_EXCEEDED.
  void expire(int64_t now_ns);
  // The worker went down: running sequences end with `running_error` (their KV is gone), waiting
  // ones with `waiting_error`, and the KV bookkeeping needs configure() again.
  void failAll(const Status& running_error, const Status& waiting_error, int64_t now_ns);
  // Ends every sequence with FINISH_CANCELLED and `why` (shutting down).
  void cancelAll(const Status& why, int64_t now_ns);

  // The next step, or an empty plan (nothing to run, configure() needed, or maxStepsInFlight()
  // steps already planned). A non-empty plan is in flight until update(), stepFailed() or
  // retract() is called with it; results are taken in plan order.
  StepPlan schedule(int64_t now_ns);
  // The oldest plan in flight ran: `sampled` holds one id per sequence with sample != 0, in
  // order (a count mismatch fails the step as INTERNAL); `logprobs` is empty or holds one entry
  // per sampled id (events of requests that asked carry theirs).
  void update(const StepPlan& plan, std::span<const int32_t> sampled, int64_t now_ns,
              std::span<const llm::LlmTokenLogprobs> logprobs = {});
  // The oldest plan in flight failed with `error` (see the header comment).
  void stepFailed(const StepPlan& plan, const Status& error, int64_t now_ns);
  // [TAG_LATE_MASKS] Fills the late masks of `plan`, the oldest plan in flight (the step before
  // it has been applied, so its constrained sequences' decoders have seen their pending token).
  // A sequence that ended meanwhile, or whose grammar is not active, gets a mask allowing every
  // token (its draw is dropped, or unconstrained as it would have been).
  void fillLateMasks(StepPlan& plan);
  // The worker sampled `plan` without its late masks (it stopped waiting): every constrained
  // sequence of the step ends with an INTERNAL error, since its token was drawn unconstrained.
  void lateMasksLost(const StepPlan& plan, int64_t now_ns);
  // The newest plan in flight was never given to the worker (no free slot): undo its planning so
  // that the next schedule() forms it again. Blocks it allocated stay with their sequences.
  void retract(const StepPlan& plan);

  // [TAG_DISAGG] Prefill side: the state of a sequence a handoff event named (nullopt for any
  // other id); it stays parked, its blocks held, until releaseHandoff(id) (no-op for an id not
  // parked).
  std::optional<SeqHandoff> takeHandoff(SeqId id);
  void releaseHandoff(SeqId id);
  uint32_t parked() const { return static_cast<uint32_t>(parked_.size()); }
  // [TAG_DISAGG] Decode side: takes `h` (tokens, counts and block tables of the prefill worker)
  // with blocks for its prompt's KV. RESOURCE_EXHAUSTED (nothing changed) while the running set
  // is full or blocks are short — try again after a step; UNAVAILABLE while configure() is
  // needed. The sequence (id returned) waits outside the queues; `pairs` / `window_pairs` get
  // the (prefill block, decode block) pairs to copy, window pairs only where both tables hold a
  // block the next query reads (INTERNAL, nothing changed, when the prefill side dropped one).
  // On success h's params, tokens and decoder move into the sequence; on an error `h` is left
  // as it was (the caller retries with it).
  Result<SeqId> adopt(SeqHandoff& h, std::vector<int32_t>* pairs,
                      std::vector<int32_t>* window_pairs);
  // The copy into an adopted sequence's blocks completed with `copy`: it runs from the next
  // plan; or it ends (the copy's error; a cancel, stop or deadline that came meanwhile).
  void adopted(SeqId id, const Status& copy, int64_t now_ns);
  // Undoes adopt() (the copy never reached the worker): its blocks are free again, `id` unknown,
  // and what adopt() moved out of the handoff goes back into `back` (when not null), so the
  // caller can adopt the same state again later.
  void unadopt(SeqId id, SeqHandoff* back = nullptr);
  uint32_t adopting() const { return adopting_; }

  // Events formed since the last call, in order.
  std::vector<SeqEvent> takeEvents();
  bool hasEvents() const { return !events_.empty(); }

  bool hasWork() const { return !running_.empty() || !waiting_.empty(); }
  uint32_t stepsInFlight() const { return static_cast<uint32_t>(in_flight_.size()); }
  LlmStats stats() const;

  // Inspection, for tests and debugging.
  const KvBlockManager* kv() const { return kv_.get(); }
  // [TAG_KV_WINDOW_GROUP] The window pool's manager (null without one).
  const KvBlockManager* kvWindow() const { return kvw_.get(); }
  const std::vector<SeqId>& running() const { return running_; }
  const std::deque<SeqId>& waiting() const { return waiting_; }
  bool hasSeq(SeqId id) const { return seqs_.count(id) != 0; }
  // A sequence's state (read-only outside; CHECK-fails for an unknown id).
  struct Seq {
    SeqId id = 0;
    uint32_t index = 0;           // the choice (GenerateParams::n) [TAG_LLM_CHOICES]
    SeqId leader = 0;             // a follower not yet forked: its choice 0 (0: none)
    uint64_t shared_step = 0;     // a leader: the plan that scheduled its shareable prefix
    uint64_t fork_step = 0;       // a forked follower: its leader's shared_step
    uint32_t wait_cost = 0;       // prompt tokens it counts in waiting_tokens while waiting
    GenerateParams params;        // the prompt moved into `tokens`
    std::vector<int32_t> tokens;  // known tokens: the prompt, then generated ones
    uint32_t prompt_len = 0;
    uint32_t generated = 0;         // known generated tokens
    uint32_t pending = 0;           // tokens sampled by steps in flight, ids not known yet
    uint32_t num_computed = 0;      // positions whose KV completed steps wrote
    uint32_t num_scheduled = 0;     // positions whose KV planned steps write (>= num_computed)
    uint32_t admission = 0;         // bumped by preemption: older plan entries are stale
    uint64_t last_sample_step = 0;  // the step that samples the newest pending token
    int32_t last_sample_row = -1;   // its row among that step's sampled ids
    uint32_t cached_prompt = 0;
    bool admitted_once = false;
    bool running = false;
    int32_t state_slot = -1;   // [TAG_LLM_SAMPLER_STATE] while running and needing one
    bool state_sent = false;   // its reload is in a plan of this admission
    // [TAG_DISAGG] parked: handed off (prefill side), blocks held; adopting: its blocks are
    // being copied in (decode side); end: what ends it once adopted() comes (none: OK status).
    bool parked = false;
    bool adopting = false;
    FinishReason end_reason = FinishReason::kNone;
    Status end_status;
    int64_t arrival_ns = 0;
    int64_t first_sched_ns = 0;
    // Structured outputs [TAG_TOKEN_MASK]: a constrained sequence is never planned ahead of its
    // last sampled token (its mask depends on it), and samples under decoder's mask.
    std::shared_ptr<grammar::ConstrainedDecoder> decoder;
    // Tokens including the pending ones: where the next sampled token goes.
    uint32_t length() const { return static_cast<uint32_t>(tokens.size()) + pending; }
  };
  const Seq& seq(SeqId id) const;

 private:
  struct InFlight {
    uint64_t step = 0;
    uint64_t num_tokens = 0;
  };
  struct MaskFill {
    grammar::ConstrainedDecoder* decoder;
    size_t at;  // first word in the plan's masks
  };
  // Whether constrained sequences are planned ahead with late masks [TAG_LATE_MASKS].
  bool lateMasks() const { return opts_.late_masks && opts_.async_steps && limits_.late_masks; }
  // Fills `fills` into `masks` (on the mask pool when there is one) and counts them.
  void fillMasks(const std::vector<MaskFill>& fills, std::vector<uint32_t>& masks);

  Seq* live(const StepSeqRef& ref);
  // Prompt tokens a leader's followers share: its prompt minus the last token, in full blocks.
  uint32_t sharedTokens(const Seq& leader) const;
  bool canContinue(const Seq& s, uint64_t prev_step, int32_t* prev_row) const;
  bool lengthReached(const Seq& s) const;
  void preempt(Seq& victim);
  // The running sequence to preempt when `s` (running) cannot grow: the latest admitted one in
  // s's KV block group (s itself when it is the latest).
  SeqId preemptionVictim(const Seq& s) const;
  // [TAG_DP_ADMIT] With several block groups: the group with the fewest running sequences
  // (`load`, per group) among those with free blocks for `tokens` tokens (ties: the most free
  // blocks, then the lowest index); -1 with one group (`load` empty) or when none has room
  // (allocate() then takes the group with the most free blocks, and fails).
  int32_t leastLoadedGroup(const std::vector<uint32_t>& load, uint64_t tokens) const;
  // Drops `id`'s blocks in every pool (the full one and the window one [TAG_KV_WINDOW_GROUP]).
  void releaseKv(SeqId id);
  // [TAG_KV_WINDOW_GROUP] Whether `id`'s window table still holds the blocks a query at
  // `position` (a block boundary) reads before it.
  bool windowBlocksHeld(SeqId id, uint32_t position) const;
  void finish(Seq& s, Status st, FinishReason why, int32_t token, int64_t now_ns);
  // [TAG_DISAGG] Parks running `s` for its handoff (update(), after its first token).
  void park(Seq& s);
  // [TAG_DISAGG] True when `s` is parked (nothing to end here) or adopting (recorded, ended by
  // adopted()); false: end it now.
  bool deferEnd(Seq& s, const Status& st, FinishReason why);
  void failRunning(const Status& st, int64_t now_ns);
  void releaseStateSlot(Seq& s);
  // Words of s's sampler-state reload (0 when it needs none or has sent it).
  uint64_t stateWords(const Seq& s, bool admitting) const;

  const LlmSchedulerOptions opts_;
  std::unique_ptr<ThreadPool> mask_pool_;  // opts_.mask_threads > 0
  LlmWorkerLimits limits_;
  uint32_t budget_ = 0;       // tokens per step: options and worker limits together
  uint32_t max_running_ = 0;  // running sequences: options and worker limits together
  std::unique_ptr<KvBlockManager> kv_;
  std::unique_ptr<KvBlockManager> kvw_;  // [TAG_KV_WINDOW_GROUP] the window pool, or null
  bool kv_lost_ = false;
  std::unordered_map<SeqId, Seq> seqs_;  // node-based: Seq references stay valid
  std::vector<int32_t> free_state_slots_;  // [TAG_LLM_SAMPLER_STATE]
  std::deque<SeqId> waiting_;
  std::vector<SeqId> running_;  // admission order
  std::vector<SeqId> parked_;   // [TAG_DISAGG] handed off, blocks held
  uint32_t adopting_ = 0;       // [TAG_DISAGG] adopted, copy in flight
  uint64_t waiting_tokens_ = 0;
  std::deque<InFlight> in_flight_;
  std::vector<SeqEvent> events_;
  SeqId next_id_ = 1;
  uint64_t last_step_ = 0;
  // The counters of stats() (preemptions, prompt tokens cached and queried, generated tokens,
  // steps); stats() adds the current sizes.
  LlmStats totals_;
};

}  // namespace garden::tulip
