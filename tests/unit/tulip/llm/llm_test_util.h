#pragma once
// Small helpers shared by the LLM scheduler tests (step_scheduler_test.cc, llm_scheduler_test.cc).
//
// Threads: pure functions.

#include <cstdint>
#include <vector>

#include "services/tulip/llm/generate_request.h"

namespace garden::tulip::testing {

// A request for `max_tokens` tokens after `prompt`, greedy, with its (zero) seed given.
inline GenerateParams params(std::vector<int32_t> prompt, uint32_t max_tokens) {
  GenerateParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.has_seed = true;
  return p;
}

// start, start + 1, ..., start + n - 1.
inline std::vector<int32_t> range(int32_t n, int32_t start = 10) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

}  // namespace garden::tulip::testing
