#pragma once
// Small helpers shared by the LLM scheduler tests (step_scheduler_test.cc, llm_scheduler_test.cc).
//
// Threads: pure functions.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/grammar/grammar.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/vocabulary.h"
#include "common/status.h"
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

// The toy vocabulary of the structured-output tests: `size` ids, 30 '"', 31 'a', 32 'b', 33 'c',
// 34 '"a', every other id no text.
inline std::vector<std::string> enumTokens(uint32_t size) {
  std::vector<std::string> toks(size);
  toks[30] = "\"";
  toks[31] = "a";
  toks[32] = "b";
  toks[33] = "c";
  toks[34] = "\"a";
  return toks;
}

// A vocabulary over `toks` whose `excluded_ids` (eos) are never text.
inline std::shared_ptr<grammar::Vocabulary> testVocab(const std::vector<std::string>& toks,
                                                      const std::vector<int32_t>& excluded_ids) {
  std::vector<uint8_t> excluded(toks.size(), 0);
  for (int32_t id : excluded_ids) excluded[static_cast<size_t>(id)] = 1;
  return std::make_shared<grammar::Vocabulary>(toks, excluded);
}

inline Result<std::shared_ptr<const grammar::CompiledGrammar>> compileSchema(
    const std::string& schema, const std::shared_ptr<grammar::Vocabulary>& vocab) {
  ASSIGN_OR_RETURN(auto g, grammar::jsonSchemaGrammar(schema));
  return grammar::CompiledGrammar::compile(std::move(g), vocab);
}

}  // namespace garden::tulip::testing
