#pragma once
// TulipClient: how ivy talks to one tulip replica. An abstract interface so HTTP code and tests
// never depend on gRPC (tests use tests/fakes/ivy/fake_tulip_client.h), and so the replica pool
// (balance/replica_pool.h) implements the same interface over many of them.
//
// Contract: every method returns at once and never blocks the caller (HTTP io threads call it);
// `done` runs exactly once, on a client-owned thread (gRPC's callback threads for the real client),
// and must itself not block. The client must outlive all calls in flight.
//
// makeGrpcTulipClient() is the real implementation (garden.v1.Tulip + grpc.health.v1.Health,
// gRPC callback API). gRPC headers stay in the .cc (pimpl) so including this header is cheap.
// gRPC failures map to Status codes in fromGrpcCode(), which api/errors.h then maps to HTTP:
// UNAVAILABLE → 503, RESOURCE_EXHAUSTED → 429, DEADLINE_EXCEEDED → 504, INVALID_ARGUMENT → 400;
// tulip refusing ivy's token (UNAUTHENTICATED / PERMISSION_DENIED) is a deployment fault, not the
// caller's: UNAVAILABLE (503) naming --tulip-token-file [TAG_TULIP_TOKEN].

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/llm/step.h"
#include "common/status.h"
#include "services/ivy/api/model_spec.h"
#include "services/ivy/balance/call_canceller.h"

namespace garden {
class TokenFile;
}  // namespace garden

namespace garden::ivy {

struct EmbedCall {
  std::string request_id;  // sent as gRPC metadata `x-request-id`
  std::string model;       // tulip's model name
  std::vector<std::vector<int32_t>> inputs;
  std::chrono::milliseconds timeout{0};   // 0 = no deadline
  std::shared_ptr<CallCanceller> cancel;  // optional: cancel() ends the call with CANCELLED
};

struct EmbedReply {
  uint32_t dim = 0;
  std::vector<float> values;  // inputs.size() × dim, L2-normalized rows, in input order
  uint64_t prompt_tokens = 0;
  uint64_t queue_us = 0;
  uint64_t inference_us = 0;
  uint64_t total_us = 0;
};

struct ScoreCall {
  std::string request_id;
  std::string model;
  std::vector<std::vector<int32_t>> inputs;
  int32_t yes_token = -1;  // -1/-1: the checkpoint's classification head
  int32_t no_token = -1;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<CallCanceller> cancel;  // optional, as in EmbedCall
};

struct ScoreReply {
  std::vector<float> scores;  // one per input, in input order
  uint64_t prompt_tokens = 0;
  uint64_t queue_us = 0;
  uint64_t inference_us = 0;
  uint64_t total_us = 0;
};

struct GenerateCall {
  std::string request_id;
  std::string model;
  std::vector<int32_t> prompt_ids;
  uint32_t max_tokens = 0;
  float temperature = 0.f;  // 0 = greedy
  float top_p = 1.f;
  int32_t top_k = 0;
  bool has_seed = false;
  uint64_t seed = 0;
  float min_p = 0.f;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  float repetition_penalty = 1.f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias)
  bool logprobs = false;      // each generated token's logprob
  uint32_t top_logprobs = 0;  // and this many alternatives (needs logprobs)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // Sequences of this prompt (GenerateRequest.n): chunks carry their choice's index, and each
  // choice has its own last chunk (finish != kNone); choice i samples with seed + i.
  uint32_t n = 1;
  std::chrono::milliseconds timeout{0};
  // Structured outputs [TAG_TOKEN_MASK] (garden.v1.Constraint): grammar empty = none.
  struct Constraint {
    std::string grammar;
    int32_t channel_token = -1;
    std::vector<int32_t> channel_prefix;
    int32_t message_token = -1;
    std::vector<int32_t> end_tokens;
    // Strict function tools [TAG_STRICT_TOOLS] (garden.v1.ToolConstraint): grammar may then be
    // empty. Sent when either is set.
    struct Tool {
      std::string name;     // function name
      std::string grammar;  // serialized byte grammar of its parameters
    };
    std::vector<Tool> tools;
    struct HarmonyIds {
      int32_t start = -1, channel = -1, constrain = -1, message = -1, end = -1, call = -1,
              ret = -1, end_of_text = -1;
    } harmony;
    std::vector<int32_t> turn_prefix;  // the assistant turn's ids already in the prompt
  } constraint;
};

enum class FinishReason { kNone = 0, kStop = 1, kLength = 2, kCancelled = 3 };

// One streamed GenerateChunk. The last chunk has finish != kNone and the usage counts.
struct GenerateChunkMsg {
  uint32_t index = 0;  // the choice (0 .. GenerateCall::n - 1)
  std::vector<int32_t> token_ids;
  // One per token_ids entry when the call asked for logprobs (num_top = its top_logprobs).
  std::vector<llm::LlmTokenLogprobs> logprobs;
  FinishReason finish = FinishReason::kNone;
  uint32_t prompt_tokens = 0;
  uint32_t cached_prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  uint64_t queue_us = 0;
  uint64_t total_us = 0;
};

// Handle of a Generate stream in flight. cancel() is idempotent and thread-safe; after it the
// stream ends (on_done runs with CANCELLED unless it already finished).
// stopChoice(i) (a call with n > 1) asks tulip to stop generating choice i while the others go on
// (garden.v1.Tulip/StopChoice) [TAG_STOP_CHOICE]: best effort, thread-safe, never blocks,
// idempotent; the choice's chunks already on their way still arrive (with its last chunk,
// FINISH_STOP), so the caller drops them itself. A no-op for a stream that cannot (default).
class GenerateStream {
 public:
  virtual ~GenerateStream() = default;
  virtual void cancel() = 0;
  virtual void stopChoice(uint32_t /*index*/) {}
};

struct TulipModelInfo {
  std::string model;
  std::string kind;
  uint32_t hidden_size = 0;
  uint32_t max_seq_len = 0;
  uint32_t vocab_size = 0;
  bool has_score_head = false;
  std::vector<int32_t> eos_token_ids;  // kind "llm"
};

// [TAG_MODEL_SPEC] The one place ModelInfo becomes the ModelSpec requests are checked against
// (the replica pool calls it when a replica defines the model). served_name:
// --served-model-name, empty = the model's own name; `created` is now.
ModelSpec makeModelSpec(const TulipModelInfo& info, const std::string& served_model_name);

// tulip's Load RPC: its scheduler's queue, what the pool balances on.
struct TulipLoad {
  uint64_t queued_requests = 0;
  uint64_t queued_tokens = 0;
  uint64_t inflight_tokens = 0;
  uint64_t queue_limit_tokens = 0;
  bool worker_ready = false;
};

class TulipClient {
 public:
  using EmbedDone = std::function<void(Result<EmbedReply>)>;
  using ModelInfoDone = std::function<void(Result<TulipModelInfo>)>;
  using HealthDone = std::function<void(Status)>;
  using ScoreDone = std::function<void(Result<ScoreReply>)>;
  // Chunks arrive in order, one call at a time; on_done runs exactly once, after the last chunk.
  using ChunkFn = std::function<void(GenerateChunkMsg)>;
  using StreamDone = std::function<void(Status)>;
  using LoadDone = std::function<void(Result<TulipLoad>)>;

  virtual ~TulipClient() = default;

  virtual void embed(EmbedCall call, EmbedDone done) = 0;
  // Default implementations answer UNIMPLEMENTED (so fakes need only what they test).
  virtual void score(ScoreCall call, ScoreDone done);
  virtual std::shared_ptr<GenerateStream> generate(GenerateCall call, ChunkFn on_chunk,
                                                   StreamDone on_done);
  virtual void modelInfo(std::chrono::milliseconds timeout, ModelInfoDone done) = 0;
  // OK when the replica reports SERVING, UNAVAILABLE otherwise.
  virtual void health(std::chrono::milliseconds timeout, HealthDone done) = 0;
  // Default: UNIMPLEMENTED.
  virtual void load(std::chrono::milliseconds timeout, LoadDone done);
  // "host:port", for logs.
  virtual std::string endpoint() const = 0;
};

// A client for one tulip at `target`, a gRPC target ("host:port", or "ipv4:10.0.0.7:50051" as the
// replica pool passes one resolved address). Connects lazily; never fails to construct. With
// `token` (ivy's --tulip-token-file) every call carries `authorization: Bearer <its first token>`,
// read per call, so a changed file takes effect without a restart [TAG_TULIP_TOKEN].
std::unique_ptr<TulipClient> makeGrpcTulipClient(const std::string& target,
                                                 std::shared_ptr<const TokenFile> token = nullptr);

// gRPC status code (numeric, canonical) + message → the Status ivy maps to HTTP. Upstream codes
// ivy reserves for its own HTTP conditions (OUT_OF_RANGE, UNIMPLEMENTED, NOT_FOUND) and codes that
// mean a misconfigured deployment are remapped; see the .cc for the table.
Status fromGrpcCode(int grpc_code, std::string_view message);

}  // namespace garden::ivy
