#pragma once
// Hand-made LLM steps for model tests that drive GptOssModel / GptOssShard directly (no runner):
// a list of live sequences, each step either their whole unprocessed prompt (prefill) or one
// decode token each, greedy sampling of every sequence's last position. Header-only (unit and
// GPU tests share it).

#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "services/rose/model/llm_step.h"
#include "services/rose/ops/paged_kv_cache.h"

namespace garden::rose::testsupport {

struct Seq {
  std::vector<int32_t> tokens;  // everything so far (prompt, then what was sampled)
  int32_t computed = 0;         // tokens already in the cache
  std::vector<int32_t> blocks;  // the sequence's block table
};

struct StepData {
  std::vector<LlmStepSeq> seqs;
  std::vector<int32_t> tokens, blocks;
  LlmStep view() const { return LlmStep{seqs, tokens, blocks}; }
};

// The step that computes every sequence's tokens past `computed`, logits of the last one.
inline StepData makeStep(const std::vector<Seq>& seqs) {
  StepData d;
  for (const Seq& s : seqs) {
    LlmStepSeq q;
    q.token_offset = static_cast<int32_t>(d.tokens.size());
    q.num_tokens = static_cast<int32_t>(s.tokens.size()) - s.computed;
    q.position = s.computed;
    q.block_offset = static_cast<int32_t>(d.blocks.size());
    q.num_blocks = static_cast<int32_t>(s.blocks.size());
    q.logits = LogitsMode::kLast;
    q.sample = 1;  // greedy
    for (size_t i = static_cast<size_t>(s.computed); i < s.tokens.size(); ++i) {
      d.tokens.push_back(s.tokens[i]);
    }
    d.blocks.insert(d.blocks.end(), s.blocks.begin(), s.blocks.end());
    d.seqs.push_back(q);
  }
  return d;
}

// Prompts of `lengths` tokens (uniform ids in [0, max_id], from `seed`); sequence i's blocks lie in
// dp group i % dp (tulip's ids [g·B, (g+1)·B), B = blocks_per_group, taken in order), enough for
// its prompt plus `extra_tokens` more (dp <= 8).
inline std::vector<Seq> groupedPrompts(std::initializer_list<int> lengths, int32_t max_id,
                                       uint32_t seed, int32_t dp, int32_t block_size,
                                       int32_t blocks_per_group, int32_t extra_tokens) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, max_id);
  std::vector<Seq> out;
  int32_t next_in_group[8] = {0};
  for (int len : lengths) {
    Seq s;
    for (int i = 0; i < len; ++i) s.tokens.push_back(tok(rng));
    const int32_t g = static_cast<int32_t>(out.size()) % dp;
    const int32_t need = static_cast<int32_t>(kvBlocksFor(len + extra_tokens, block_size));
    for (int32_t b = 0; b < need; ++b) s.blocks.push_back(g * blocks_per_group + next_in_group[g]++);
    out.push_back(s);
  }
  return out;
}

}  // namespace garden::rose::testsupport
