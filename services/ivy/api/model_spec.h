#pragma once
// ModelSpec: what ivy knows about the model it serves, learned from tulip's ModelInfo RPC by the
// replica pool (balance/replica_pool.h; makeModelSpec in balance/tulip_client.h). Request
// validation checks against it. Plain immutable value; shared between threads as
// std::shared_ptr<const ModelSpec>.
//
// ModelSource is how the HTTP layer reads it: the current spec (null until a replica answered
// ModelInfo) and readiness (the model known and a replica healthy); both callable from any thread.
// checkModelKind() is the one place a route's need is matched against the model's kind
// [TAG_MODEL_KIND]: embeddings, score and rerank need an embedding model (with or without a
// classification head: a reranker); chat and completions need a generative (llm) one.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

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

struct ModelSource {
  std::function<std::shared_ptr<const ModelSpec>()> spec;
  std::function<bool()> ready;
  // Optional: while spec() is null, why ("" when nothing failed yet): the last failed probe of
  // a replica, e.g. tulip refusing ivy's token. It goes into the 503's message.
  std::function<std::string()> waiting_reason;
};

// What a route asks of the model.
enum class ModelUse { kEmbed, kScore, kGenerate };

// OK when the served model can serve `use`; otherwise INVALID_ARGUMENT naming `model`, the
// model's kind and what `route` needs, e.g. "model: 'gpt-oss' is a generative (llm) model;
// /v1/score needs an embedding or reranker model".
Status checkModelKind(const ModelSpec& spec, ModelUse use, std::string_view route);

}  // namespace garden::ivy
