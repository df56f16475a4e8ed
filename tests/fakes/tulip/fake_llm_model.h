#pragma once
// A deterministic fake LLM for tulip's tests, shared by fake-rose's LLM mode, the in-process
// FakeLlmWorker and the tests that compute expected streams.
//
// The "model": the next token is a hash of every token so far (prompt and generated), mapped into
// [3, vocab); with temperature > 0 the counter-based draw (seed, position + num_tokens) shifts it,
// as rose's sampler keys its random stream. The "KV cache" stores each position's token id in the
// slot its block table names, and a step reads the earlier tokens back from those slots — so a
// wrong block table, a wrong position, a prefix-cache hit on the wrong blocks or a block reused
// while still needed changes the output, and reading a never-written slot is an error. A step is
// validated as a whole before anything is written (as rose does).
//
// Two steps in flight [TAG_LLM_PREV_TOKEN]: a sequence with prev_row >= 0 takes its first new
// token from row prev_row of the ids the previous step (the one this engine ran just before)
// sampled; its token in `tokens` must be the placeholder -1 (stricter than rose, which ignores
// it, so that a scheduler writing a real token there shows up). As in rose (common/llm/step.h), a
// refused step does not count: prev_row names a row of the last step the engine ran.
//
// Threads: FakeLlmEngine is used by one thread at a time; the free functions are pure.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/llm/step.h"
#include "common/status.h"

namespace garden::tulip::testing {

inline uint64_t fakeMix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// The next token after `tokens` (all of them, from position 0).
inline int32_t fakeNextToken(std::span<const int32_t> tokens, const llm::SamplingParams& p,
                             uint32_t vocab) {
  uint64_t h = 1469598103934665603ULL;
  for (int32_t t : tokens) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ULL;
  h = fakeMix(h);
  if (p.temperature > 0) h += fakeMix(p.seed ^ fakeMix(tokens.size())) % 17;
  return static_cast<int32_t>(3 + h % (vocab - 3));
}

// The stream the fake produces for `prompt`: up to `n` tokens, stopping after the first token in
// `stops` (which is included).
inline std::vector<int32_t> fakeReference(std::vector<int32_t> prompt, uint32_t n,
                                          const llm::SamplingParams& p, uint32_t vocab,
                                          const std::vector<int32_t>& stops = {}) {
  std::vector<int32_t> out;
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t t = fakeNextToken(prompt, p, vocab);
    out.push_back(t);
    prompt.push_back(t);
    bool stop = false;
    for (int32_t s : stops) stop |= s == t;
    if (stop) break;
  }
  return out;
}

class FakeLlmEngine {
 public:
  FakeLlmEngine(uint32_t num_blocks, uint32_t block_size, uint32_t vocab)
      : num_blocks_(num_blocks),
        block_size_(block_size),
        vocab_(vocab),
        slots_(uint64_t{num_blocks} * block_size, -1) {}

  // One step in the kGenerate layout; the sampled ids in sequence order.
  // `pick` (optional) may replace sampled id k (a token mask's choice) before the next step's
  // prev_row reads it.
  Result<std::vector<int32_t>> step(std::span<const llm::LlmStepSeq> seqs,
                                    std::span<const int32_t> tokens,
                                    std::span<const int32_t> blocks,
                                    const std::function<int32_t(size_t, int32_t)>& pick = {}) {
    auto out = run(seqs, tokens, blocks);
    if (out.isOk() && pick) {
      for (size_t k = 0; k < out->size(); ++k) (*out)[k] = pick(k, (*out)[k]);
    }
    if (out.isOk()) previous_ = *out;  // a refused step leaves the last run step's ids
    return out;
  }

  void reset() {
    slots_.assign(slots_.size(), -1);
    previous_.clear();
  }

  // [TAG_KV_PULL] Copies blocks (src, dst) of `src`'s cache into this one, as rose's kv pull
  // does: INVALID_ARGUMENT for ids out of range (nothing copied).
  Status copyBlocks(const FakeLlmEngine& src, std::span<const int32_t> pairs) {
    if (src.block_size_ != block_size_ || pairs.size() % 2 != 0)
      return invalidArgument("kv pull: block sizes differ or pairs are odd");
    for (size_t i = 0; i < pairs.size(); i += 2) {
      if (pairs[i] < 0 || uint32_t(pairs[i]) >= src.num_blocks_ || pairs[i + 1] < 0 ||
          uint32_t(pairs[i + 1]) >= num_blocks_)
        return invalidArgument("kv pull: pair " + std::to_string(i / 2) + " out of range");
    }
    for (size_t i = 0; i < pairs.size(); i += 2) {
      for (uint32_t k = 0; k < block_size_; ++k) {
        slots_[uint64_t(pairs[i + 1]) * block_size_ + k] =
            src.slots_[uint64_t(pairs[i]) * block_size_ + k];
      }
    }
    return okStatus();
  }

 private:
  Result<std::vector<int32_t>> run(std::span<const llm::LlmStepSeq> seqs,
                                   std::span<const int32_t> tokens,
                                   std::span<const int32_t> blocks) {
    std::vector<uint8_t> touched(slots_.size(), 0);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto& s = seqs[i];
      const std::string at = "seq " + std::to_string(i) + ": ";
      if (s.num_tokens <= 0 || s.position < 0 || s.token_offset < 0 || s.block_offset < 0 ||
          s.num_blocks < 0 || uint64_t(s.token_offset) + s.num_tokens > tokens.size() ||
          uint64_t(s.block_offset) + s.num_blocks > blocks.size())
        return invalidArgument(at + "offsets out of range");
      const uint64_t end = uint64_t(s.position) + s.num_tokens;
      if (uint64_t(s.num_blocks) * block_size_ < end)
        return invalidArgument(at + "block table does not cover position + num_tokens");
      auto table = blocks.subspan(s.block_offset, s.num_blocks);
      for (int32_t b : table)
        if (b < 0 || uint32_t(b) >= num_blocks_)
          return invalidArgument(at + "block id " + std::to_string(b) + " out of range");
      for (uint64_t p = 0; p < uint64_t(s.position); ++p) {
        if (slots_[slot(table, p)] < 0)
          return invalidArgument(at + "reads unwritten KV at position " + std::to_string(p));
      }
      for (uint64_t p = s.position; p < end; ++p) {
        auto& t = touched[slot(table, p)];
        if (t) return invalidArgument(at + "two writes to one KV slot in a step");
        t = 1;
      }
      if (s.prev_row >= 0) {
        if (uint64_t(s.prev_row) >= previous_.size())
          return invalidArgument(at + "prev_row " + std::to_string(s.prev_row) +
                                 " but the previous step sampled " +
                                 std::to_string(previous_.size()) + " ids");
        if (tokens[s.token_offset] != -1)
          return invalidArgument(at + "prev_row set but the token is not the placeholder -1");
      } else if (s.prev_row != -1) {
        return invalidArgument(at + "prev_row " + std::to_string(s.prev_row));
      }
      for (int32_t k = s.prev_row >= 0 ? 1 : 0; k < s.num_tokens; ++k) {
        const int32_t id = tokens[s.token_offset + k];
        if (id < 0 || uint32_t(id) >= vocab_) return invalidArgument(at + "token out of range");
      }
    }
    std::vector<int32_t> out;
    std::vector<int32_t> ctx;
    for (const auto& s : seqs) {
      auto table = blocks.subspan(s.block_offset, s.num_blocks);
      ctx.clear();
      for (int32_t p = 0; p < s.position; ++p) ctx.push_back(slots_[slot(table, p)]);
      for (int32_t k = 0; k < s.num_tokens; ++k) {
        const int32_t id =
            k == 0 && s.prev_row >= 0 ? previous_[s.prev_row] : tokens[s.token_offset + k];
        slots_[slot(table, uint64_t(s.position) + k)] = id;
        ctx.push_back(id);
      }
      if (s.sample) out.push_back(fakeNextToken(ctx, s.sampling, vocab_));
    }
    return out;
  }

  uint64_t slot(std::span<const int32_t> table, uint64_t pos) const {
    return uint64_t(table[pos / block_size_]) * block_size_ + pos % block_size_;
  }

  uint32_t num_blocks_, block_size_, vocab_;
  std::vector<int32_t> slots_;
  std::vector<int32_t> previous_;  // the ids the last step sampled [TAG_LLM_PREV_TOKEN]
};

}  // namespace garden::tulip::testing
