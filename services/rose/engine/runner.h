#pragma once
// What the step loop (step_loop.h) runs: a Runner turns one batch descriptor taken from the
// shared-memory channel into work on the backend, for one kind of model. Two implementations:
// EmbeddingRunner (embedding_runner.h: Qwen3 embed and score batches, CUDA graphs) and LlmRunner
// (llm_runner.h: gpt-oss generate steps, the paged KV cache). The loop owns everything the two
// share — the slots and their events, the completion queue, deadlines, accounting, heartbeat,
// run/drain and the worker's state — and never looks at the model kind; a runner owns its
// model-side state (per-slot staging of the inputs, the KV cache, graph buckets) and never
// touches the channel: it sees a slot's input arena in admit() and its output arena in launch().
//
// Per taken batch the loop calls, on its step thread: admit() (after checking slot and deadline),
// then launch() only when admit() succeeded; a slot is not admitted again before the loop has
// published the previous batch of that slot (its event fired), so a runner may keep one batch's
// staging per slot.
//
// Threads: every method is called on the step thread (the backend's launching thread), except
// traits(), which any thread may call.

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/shm/channel.h"
#include "common/status.h"

namespace garden::rose {

// The result one admitted batch writes at offset 0 of its slot's output arena: rows × cols
// elements of element_bytes each (float32 rows for embed/score, int32 ids for generate).
struct OutputShape {
  uint32_t rows = 0;
  uint32_t cols = 0;
  uint32_t element_bytes = 4;
  uint64_t bytes() const { return uint64_t{rows} * cols * element_bytes; }
};

// offset + bytes <= limit, without overflow: a region of an arena of `limit` bytes.
inline bool arenaFits(uint64_t offset, uint64_t bytes, uint64_t limit) {
  return offset <= limit && bytes <= limit - offset;
}

// How the loop names a runner's batches and the Prometheus families it counts them in (each
// kind keeps its own names, so dashboards written for either survive).
struct RunnerTraits {
  const char* kind = "";  // ModelFacts.kind: "embedding" | "llm"
  const char* unit = "";  // "batch" | "step", in messages ("deadline passed before the step ran")
  // Counter, label "outcome" (the status code name): +1 per answered batch, run or rejected.
  const char* outcomes_metric = "";
  const char* outcomes_help = "";
  // Histogram: launched batches, taken until published, seconds.
  const char* seconds_metric = "";
  const char* seconds_help = "";
};

class Runner {
 public:
  virtual ~Runner() = default;

  virtual RunnerTraits traits() const = 0;

  // Called once by StepLoop::create, before any admit(): checks that the channel's layout can
  // carry this runner's batches and results (INVALID_ARGUMENT naming the arena when not) and
  // sizes the per-slot staging for layout.slots slots.
  virtual Status bind(const shm::Layout& layout) = 0;

  // The channel layout this runner's largest batch needs, for a channel rose creates itself
  // (sidecar mode, --create-shm) with `slots` slots.
  virtual shm::Layout layoutFor(uint32_t slots) const = 0;

  // The model's facts for tulip (ModelFacts.kind = traits().kind); the loop fills in the name.
  virtual shm::ModelFacts facts() const = 0;

  // Validates `d` against `input` (slot d.slot's input arena, which the other process may still
  // write) and the model, copies what it needs into the slot's private staging (copy first,
  // validate the copy: what is validated is what runs) and returns the result's shape. An error
  // (INVALID_ARGUMENT naming the field, or what the model refuses) is answered without launch()
  // and must leave every model-side state (KV cache, graphs) untouched.
  virtual Result<OutputShape> admit(const shm::BatchDesc& d, std::span<const std::byte> input) = 0;

  // Enqueues the batch admit() staged for d.slot on the backend, its result going into `output`
  // (slot d.slot's output arena, registered with the backend), and returns without waiting for
  // the device. An error means the work may be partly enqueued: the loop then waits for the
  // backend and answers the batch with that error.
  virtual Status launch(const shm::BatchDesc& d, std::span<std::byte> output) = 0;
};

}  // namespace garden::rose
