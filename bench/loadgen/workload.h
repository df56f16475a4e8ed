#pragma once
// Workload generation for the load generator: seeded random token ids of exact lengths
// (pre-tokenized inputs) and seeded random English words for text inputs whose tokenized length is
// brought to a target by probing the server (see [TAG_TEXT_LENGTH_CALIBRATION] in loadgen_main.cc).
// Pure functions; callable from any thread (each caller owns its Rng).

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace garden::bench {

using Rng = std::mt19937_64;

enum class Mode { kEmbed, kScore, kChat };
enum class Protocol { kGrpc, kHttp };
enum class InputKind { kTokens, kText };

Result<Mode> parseMode(std::string_view s);            // "embed" | "score" | "chat"
Result<Protocol> parseProtocol(std::string_view s);    // "grpc" | "http"
Result<InputKind> parseInputKind(std::string_view s);  // "tokens" | "text"
std::string_view modeName(Mode m);
std::string_view protocolName(Protocol p);
std::string_view inputKindName(InputKind k);

// `len` ids drawn uniformly from [lo, hi) (lo < hi, len >= 0). Lo defaults above the ids most
// tokenizers reserve for control tokens so random inputs never contain special tokens by accident.
std::vector<int32_t> randomTokens(Rng& rng, int32_t len, int32_t lo, int32_t hi);

// `words` words from a fixed list of common English words, separated by single spaces.
std::string randomWords(Rng& rng, int32_t words);

// The next word count to try when `words` words tokenized to `tokens` and `target` tokens are
// wanted: proportional correction, always moving by at least one word toward the target, never
// below 1. Returns `words` itself when tokens == target.
int32_t nextWordCount(int32_t words, int32_t tokens, int32_t target);

// "embed_tok128_b1_c1", "score_tok512_b25_c1", "embed_text512_b1_c8", "chat_text128_c4".
// The request pool when --pool is not given (0): chat mode sends every request its own prompt —
// warm-up + count requests, or with --duration warm-up + 4 x concurrency, at least 32 — so a chat
// run is never served from the prefix cache of a repeated prompt (a cycled pool of 32 prompts made
// 7 of 8 requests at 256 streams prefix-cache hits, bench/results/gpu-llm-2026-12-04-h200-s12);
// embed and score keep 32 payloads cycled (no KV cache there). An explicit pool is kept.
int32_t requestPool(Mode mode, int32_t pool, uint64_t count, uint64_t warmup, int32_t concurrency);

std::string workloadName(Mode mode, InputKind input, int32_t seq_len, int32_t batch,
                         int32_t concurrency);

}  // namespace garden::bench
