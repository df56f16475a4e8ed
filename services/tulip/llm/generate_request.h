#pragma once
// A Generate request as tulip's LLM scheduler sees it (token ids in, token events out), and the
// check of its parameters against the worker's facts. Validation is apart from scheduling: a
// request that passes validateGenerate() can always be scheduled on a worker with these facts
// (its prompt leaves room for one generated token, every id is in the vocabulary), so the
// scheduler (step_scheduler.h) never has to reject one for its content.
//
// Threads: plain value types and a pure function.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/grammar/constrained.h"
#include "common/llm/step.h"
#include "common/shm/channel.h"
#include "common/status.h"

namespace garden::tulip {

// Values match garden.v1.FinishReason.
enum class FinishReason : int { kNone = 0, kStop = 1, kLength = 2, kCancelled = 3 };

struct LogitBiasEntry {
  int32_t token_id = 0;
  float bias = 0.f;
};

// Choices one request may ask for (GenerateParams::n; OpenAI's n and best_of go up to 16 here).
inline constexpr uint32_t kMaxChoices = 16;

struct GenerateParams {
  std::vector<int32_t> prompt;
  // Sequences generated from this prompt (choices 0 .. n-1): the prompt is prefilled once and its
  // full KV blocks are shared (step_scheduler.h, "Choices"); choice i samples with seed + i.
  uint32_t n = 1;
  uint32_t max_tokens = 0;  // 0: until the context is full
  // sampling.logprobs >= 0 asks for logprobs; sampling.state_slot is the scheduler's to set.
  llm::SamplingParams sampling;
  std::vector<LogitBiasEntry> logit_bias;  // at most llm::kMaxLogitBias, ids distinct
  bool has_seed = false;  // false: the scheduler draws a seed
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int64_t deadline_ns = 0;  // CLOCK_MONOTONIC, 0 = none
  std::string request_id;
  // Structured outputs [TAG_TOKEN_MASK]: the compiled grammar (over the served vocabulary) and
  // where in the stream it applies. nullptr: unconstrained.
  // Strict function tools [TAG_STRICT_TOOLS] are in constraint.tools (grammar may be null then).
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  grammar::ConstraintSpec constraint;
  bool constrained() const { return grammar != nullptr || !constraint.tools.empty(); }
};

// One event of a request's stream. A request gets zero or more token events, then exactly one
// last event (last = true), which may also carry a token.
// With n > 1 every choice has its own stream of events (`index`), each ending with its own last
// event.
struct GenerateEvent {
  uint32_t index = 0;  // the choice (0 .. GenerateParams::n - 1)
  int32_t token = -1;  // >= 0: the next generated token
  bool has_logprobs = false;  // token >= 0 and the request asked (sampling.logprobs >= 0)
  llm::LlmTokenLogprobs logprobs;
  bool last = false;
  // Last event only: status OK with finish set, or the error that ended the stream.
  Status status;
  FinishReason finish = FinishReason::kNone;
  uint32_t prompt_tokens = 0;
  uint32_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  uint32_t completion_tokens = 0;
  uint64_t queue_us = 0;      // arrival until first scheduled
  uint64_t inference_us = 0;  // first scheduled until the end
  uint64_t total_us = 0;
};

// The longest sequence (prompt + generated) a worker with these facts can hold: its KV capacity,
// capped by the model's max_seq_len.
uint32_t llmContextLength(const shm::ModelFacts& facts);

// OK when `p` can be generated on a worker with `facts`; otherwise INVALID_ARGUMENT naming the
// field (n, prompt_ids, prompt_ids[i], stop_token_ids[i], sampling.temperature / top_p / top_k /
// min_p / presence_penalty / frequency_penalty / repetition_penalty / top_logprobs,
// sampling.logit_bias[i]), or FAILED_PRECONDITION when the worker serves no LLM or has no KV
// cache. Normalizes what proto3 leaves unset: top_p 0 and repetition_penalty 0 become 1 (off).
// A request asking for logprobs, min_p, a penalty or logit_bias from a worker whose facts lack
// shm::kLlmCapSamplerState is INVALID_ARGUMENT "<logprobs|min_p|presence_penalty|
// frequency_penalty|repetition_penalty|logit_bias>: not supported by this worker's sampler
// (<facts.sampler>)…" (OpenAI field names, so ivy's 400 names the param); a constrained request
// (grammar set) from a worker lacking shm::kLlmCapTokenMask "response_format: …".
// Draws no seed (the caller does: this is a pure function).
Status validateGenerate(GenerateParams& p, const shm::ModelFacts& facts);

// Whether the request needs a worker-side sampler-state slot [TAG_LLM_SAMPLER_STATE]:
// a penalty is on or it has a logit_bias.
inline bool needsSamplerState(const GenerateParams& p) {
  return llm::needsPenaltyState(p.sampling) || !p.logit_bias.empty();
}

}  // namespace garden::tulip
