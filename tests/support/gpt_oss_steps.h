#pragma once
// Hand-made LLM steps for model tests that drive GptOssModel / GptOssShard directly (no runner):
// a list of live sequences, each step either their whole unprocessed prompt (prefill) or one
// decode token each, greedy sampling of every sequence's last position. Header-only (unit and
// GPU tests share it).

#include <cstdint>
#include <vector>

#include "services/rose/model/llm_step.h"

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

}  // namespace garden::rose::testsupport
