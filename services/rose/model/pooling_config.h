#pragma once
// How an embedding model pools, read from a sentence-transformers layout when present:
// `modules.json` names a sentence_transformers.models.Pooling module (usually `1_Pooling`) whose
// `config.json` says the mode (`pooling_mode_lasttoken` / `_mean_tokens` / `_cls_token`, or the
// newer `pooling_mode: "lasttoken"`), and a ...models.Normalize module means L2 normalization.
// Without modules.json the default is last-token pooling with normalization (Qwen3-Embedding).
//
// Threads: plain functions and values.

#include <string>
#include <string_view>

#include "common/status.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {

struct PoolingConfig {
  PoolMode mode = PoolMode::kLast;
  bool normalize = true;
  bool from_files = false;  // true when modules.json named a Pooling module
};

// INVALID_ARGUMENT on malformed files; UNIMPLEMENTED for modes rose does not serve (max,
// weighted mean, mean-sqrt-len), naming the mode.
Result<PoolingConfig> loadPoolingConfig(const std::string& dir);

// "last" | "mean" | "cls" (also "lasttoken", "mean_tokens", "cls_token").
Result<PoolMode> parsePoolMode(std::string_view s);
std::string_view poolModeName(PoolMode m);

}  // namespace garden::rose
