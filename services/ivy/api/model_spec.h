#pragma once
// ModelSpec: what ivy knows about the model it serves, learned from tulip's ModelInfo RPC at start
// (see balance/tulip_monitor.h). Request validation checks against it. Plain immutable value;
// shared between threads as std::shared_ptr<const ModelSpec>.

#include <cstdint>
#include <string>
#include <vector>

namespace garden::ivy {

struct ModelSpec {
  std::string served_name;    // the name callers must send as `model` (--served-model-name)
  std::string upstream_name;  // tulip's model name (sent to tulip in requests)
  std::string kind;           // "embedding" or "llm"
  uint32_t hidden_size = 0;   // embedding width
  uint32_t max_seq_len = 0;   // longest accepted input, in tokens
  uint32_t vocab_size = 0;    // token ids must be in [0, vocab_size)
  bool has_score_head = false;  // scoring uses the classification head, not yes/no logits
  int64_t created = 0;        // unix seconds, for /v1/models
  std::vector<int32_t> eos_token_ids;  // kind "llm": end-of-sequence ids (ModelInfo)
};

}  // namespace garden::ivy
