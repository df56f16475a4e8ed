#pragma once
// FakeRunner: a Runner (services/rose/engine/runner.h) for step-loop tests, with no model. A
// batch carries num_tokens int32 values at tokens_offset of its input arena; its result is one
// int32 row per value, 2 * value + 1, written by work launched on the backend (so it lands when
// the slot's event fires, as a model's would). Refusals and failures are chosen by the values:
//   - a negative value: admit() answers INVALID_ARGUMENT ("value -3 at 1 is negative");
//   - the value kFailLaunch: launch() returns INTERNAL without enqueueing anything;
//   - any other value: runs.
// Only kEmbed batches are admitted (others INVALID_ARGUMENT naming the kind).
//
// Threads: as the Runner contract (everything on the step thread); the counters are atomics so a
// test may read them from any thread.

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "services/rose/engine/runner.h"
#include "services/rose/ops/backend.h"

namespace garden::rose::testing {

class FakeRunner final : public Runner {
 public:
  static constexpr int32_t kFailLaunch = 999;
  static constexpr uint32_t kMaxValues = 64;

  explicit FakeRunner(Backend& backend) : backend_(backend) {}

  RunnerTraits traits() const override {
    return {"fake", "batch", "rose_fake_batches_total", "Fake-runner batches by outcome",
            "rose_fake_step_seconds", "Fake-runner batches, taken until published"};
  }

  Status bind(const shm::Layout& layout) override {
    if (layout.output_bytes < kMaxValues * sizeof(int32_t)) {
      return invalidArgument("fake runner: output arena too small");
    }
    staging_.assign(layout.slots, std::vector<int32_t>(kMaxValues));
    bound_slots_ = layout.slots;
    return okStatus();
  }

  shm::Layout layoutFor(uint32_t slots) const override {
    return shm::Layout{slots, kMaxValues * sizeof(int32_t), kMaxValues * sizeof(int32_t)};
  }

  shm::ModelFacts facts() const override {
    shm::ModelFacts f;
    f.hidden_size = 7;
    f.vocab_size = 11;
    f.max_batch_tokens = kMaxValues;
    return f;
  }

  Result<OutputShape> admit(const shm::BatchDesc& d, std::span<const std::byte> input) override {
    admitted_.fetch_add(1);
    if (d.kind != shm::BatchKind::kEmbed) {
      return invalidArgument("fake runner: batch kind " +
                             std::to_string(static_cast<uint32_t>(d.kind)) + " is not served");
    }
    if (d.num_tokens == 0 || d.num_tokens > kMaxValues) {
      return invalidArgument("fake runner: num_tokens " + std::to_string(d.num_tokens));
    }
    const uint64_t bytes = uint64_t{d.num_tokens} * sizeof(int32_t);
    if (!arenaFits(d.tokens_offset, bytes, input.size())) {
      return invalidArgument("fake runner: values run past the input arena");
    }
    std::vector<int32_t>& s = staging_[d.slot];
    std::memcpy(s.data(), input.data() + d.tokens_offset, bytes);
    for (uint32_t i = 0; i < d.num_tokens; ++i) {
      if (s[i] < 0) {
        return invalidArgument("value " + std::to_string(s[i]) + " at " + std::to_string(i) +
                               " is negative");
      }
    }
    return OutputShape{d.num_tokens, 1, sizeof(int32_t)};
  }

  Status launch(const shm::BatchDesc& d, std::span<std::byte> output) override {
    launched_.fetch_add(1);
    const int32_t* in = staging_[d.slot].data();
    for (uint32_t i = 0; i < d.num_tokens; ++i) {
      if (in[i] == kFailLaunch) return internalError("fake runner: launch failed on purpose");
    }
    auto* out = reinterpret_cast<int32_t*>(output.data());
    const uint32_t n = d.num_tokens;
    backend_.launch([in, out, n] {
      for (uint32_t i = 0; i < n; ++i) out[i] = 2 * in[i] + 1;
    });
    return okStatus();
  }

  uint64_t admitted() const { return admitted_.load(); }
  uint64_t launched() const { return launched_.load(); }
  uint32_t boundSlots() const { return bound_slots_; }

 private:
  Backend& backend_;
  std::vector<std::vector<int32_t>> staging_;  // per slot
  uint32_t bound_slots_ = 0;
  std::atomic<uint64_t> admitted_{0}, launched_{0};
};

}  // namespace garden::rose::testing
