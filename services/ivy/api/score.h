#pragma once
// POST /v1/score and POST /v1/rerank: request parsing, the reranker prompt template, and response
// rendering. Pure functions, no server or network; callable from any thread.
//
// Requests (unknown fields are ignored):
//   /v1/score  {"model", "query": str, "documents": [str], "instruction"?: str}
//              → {"id","object":"list","model","data":[{"object":"score","index":i,"score":s}],
//                 "usage":{"prompt_tokens","total_tokens"}}   scores in input order
//   /v1/rerank {"model", "query", "documents", "instruction"?, "top_n"?: int >= 1,
//               "return_documents"?: bool (default false)}
//              → {"id","model","results":[{"index":i,"relevance_score":s,"document"?:{"text"}}],
//                 "usage":{...}}   sorted by relevance_score, highest first (ties: lower index
//                 first), at most top_n results
// Every score is in [0, 1]: sigmoid(logit["yes"] - logit["no"]) at the last position (the
// Qwen3-Reranker recipe), or the sigmoid of the classification head when the checkpoint has one.
// Limits (api/limits.h): --max-inputs on documents, --max-input-chars on query, instruction and
// each document before tokenization, the token limits on each rendered pair ("documents[i]", or
// "query" / "instruction" when the template with it and no document is already over the limit).

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "services/ivy/api/limits.h"
#include "services/ivy/api/model_spec.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

enum class ScoreApi { kScore, kRerank };

struct ScoringRequest {
  std::string model;
  std::string query;
  std::vector<std::string> documents;  // never empty after a successful parse
  std::optional<std::string> instruction;
  size_t top_n = 0;  // rerank: 0 = all
  bool return_documents = false;
};

Result<ScoringRequest> parseScoringRequest(std::string_view body, const ModelSpec& spec,
                                           const RequestLimits& limits, ScoreApi api);

// The Qwen3-Reranker prompt [TAG_RERANK_TEMPLATE], as in the model card of Qwen/Qwen3-Reranker-0.6B
// (huggingface.co/Qwen/Qwen3-Reranker-0.6B, "Transformers Usage": `prefix`, `suffix`,
// `format_instruction`; the same strings appear in llama.cpp PR #20009 and vLLM's Qwen3-Reranker
// example):
//   prefix = "<|im_start|>system\nJudge whether the Document meets the requirements based on the
//             Query and the Instruct provided. Note that the answer can only be \"yes\" or
//             \"no\".<|im_end|>\n<|im_start|>user\n"
//   pair   = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"
//   suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
// with instruction defaulting to "Given a web search query, retrieve relevant passages that answer
// the query". The reference tokenizes prefix and suffix with special tokens recognized and the
// pair on its own, then concatenates prefix + pair + suffix ids; so do we, except that the pair
// (caller text) is encoded without special tokens (Tokenizer::encode) so that a caller cannot
// inject <|im_end|>. With a tokenizer that has no such special tokens (the tiny test model) the
// markers are ordinary text.
inline constexpr std::string_view kRerankPrefix =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
    "the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n";
inline constexpr std::string_view kRerankSuffix =
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
inline constexpr std::string_view kRerankDefaultInstruction =
    "Given a web search query, retrieve relevant passages that answer the query";

// "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}".
std::string formatRerankPair(std::string_view instruction, std::string_view query,
                             std::string_view doc);

// Prefix and suffix ids of one tokenizer, computed once. Immutable; shareable between threads.
class RerankTemplate {
 public:
  explicit RerankTemplate(const Tokenizer& tok);
  // Token ids of every (query, document) pair, in document order; each checked against the
  // per-input token limit ("documents[i]") and the running total against --max-request-tokens.
  Result<std::vector<std::vector<int32_t>>> render(const ScoringRequest& req,
                                                   const ModelSpec& spec,
                                                   const RequestLimits& limits) const;
  const std::vector<int32_t>& prefix() const { return prefix_; }
  const std::vector<int32_t>& suffix() const { return suffix_; }

 private:
  const Tokenizer& tok_;
  std::vector<int32_t> prefix_, suffix_;
};

// The ids whose logits are compared: Qwen3-Reranker's convert_tokens_to_ids("yes") / ("no"), i.e.
// the vocabulary piece written exactly so; when the tokenizer has no such piece, the single id
// that encoding the word gives (sentencepiece writes "▁yes"). FAILED_PRECONDITION naming the
// flags (--score-yes-token / --score-no-token) when neither works or both give the same id.
struct YesNoTokens {
  int32_t yes = -1;
  int32_t no = -1;
};
Result<YesNoTokens> resolveYesNoTokens(const Tokenizer& tok, std::string_view yes,
                                       std::string_view no);

std::string renderScoreResponse(std::string_view id, std::string_view model,
                                std::span<const float> scores, uint64_t prompt_tokens);
std::string renderRerankResponse(std::string_view id, std::string_view model,
                                 const ScoringRequest& req, std::span<const float> scores,
                                 uint64_t prompt_tokens);

}  // namespace garden::ivy
