#pragma once
// Drivers: N closed-loop clients against one endpoint. Each client keeps exactly one request in
// flight and issues the next one as soon as the previous completes (no think time), so offered load
// follows the server (closed loop) and latency is what one caller sees.
//
//   gRPC (tulip): one channel (HTTP/2 connection) per client by default. GrpcApi::kSync (the
//   default): one thread per client making blocking calls, what a sequential caller does; with
//   one client it measured ~50 µs less per call than kCallback on the same server, the same at 4
//   (bench/results/grpc-client-api-2026-11-30.md). GrpcApi::kCallback: the next call is issued
//   from the completion callback on gRPC's threads, so no loadgen thread sits between calls.
//   HTTP (ivy): one thread and one keep-alive socket per client (http_client.h).
//
// Requests are built before a phase starts (a pool of payloads, cycled), so generating inputs is
// never timed. Latency is taken from just before the call is issued to its completion and includes
// serialization. Each client records into its own Recorder; they are merged when the phase ends.
// A Driver is used from one thread; run() blocks until the phase ends.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/loadgen/stats.h"
#include "bench/loadgen/workload.h"
#include "common/status.h"

namespace garden::bench {

// One request's inputs: token sequences (InputKind::kTokens) or texts (kText; chat: one prompt).
struct Payload {
  std::vector<std::vector<int32_t>> token_inputs;
  std::vector<std::string> text_inputs;
  uint64_t tokens = 0;  // input tokens (known for token inputs; calibrated for text)
  size_t size() const { return token_inputs.empty() ? text_inputs.size() : token_inputs.size(); }
};

enum class GrpcApi { kSync, kCallback };

struct DriverConfig {
  Mode mode = Mode::kEmbed;
  InputKind input = InputKind::kTokens;
  std::string endpoint;  // HOST:PORT
  std::string model;     // request "model" field (gRPC: may be empty)
  int32_t concurrency = 1;
  int32_t channels = 0;  // gRPC channels; 0 = one per client
  GrpcApi grpc_api = GrpcApi::kSync;
  std::chrono::milliseconds timeout{60000};
  int32_t yes_token = -1, no_token = -1;  // score mode (-1,-1: classification head)
  std::string encoding_format = "float";  // HTTP embeddings
  uint32_t max_tokens = 128;              // chat
  bool ignore_eos = true;                 // chat: ask for exactly max_tokens
  std::string response_format;            // chat: "", "json_object" or "json_schema"
  std::string response_schema;            // chat, json_schema: the JSON Schema text
  bool skip_reasoning = false;            // chat: "skip_reasoning": true
  double temperature = -1;                // chat: sent when >= 0 (0: greedy, repeatable)
};

// Ends after `count` requests in total (count > 0) or after `duration_s` seconds: no request is
// issued after the deadline; those in flight complete and are recorded.
struct PhaseSpec {
  uint64_t count = 0;
  double duration_s = 0;
};

struct PhaseResult {
  Recorder rec;
  double wall_s = 0;  // first issue to last completion
};

class Driver {
 public:
  virtual ~Driver() = default;
  virtual Result<PhaseResult> run(const PhaseSpec& phase) = 0;
};

// Facts about the served model, from tulip's ModelInfo or ivy's /v1/models (fields ivy does not
// expose stay 0).
struct ServedModel {
  std::string name;
  std::string kind;
  uint32_t hidden_size = 0, max_seq_len = 0, vocab_size = 0;
  bool has_score_head = false;
};

Result<std::unique_ptr<Driver>> makeGrpcDriver(const DriverConfig& config,
                                               std::vector<Payload> pool);
Result<ServedModel> grpcModelInfo(const std::string& endpoint, std::chrono::milliseconds timeout);

Result<std::unique_ptr<Driver>> makeHttpDriver(const DriverConfig& config,
                                               std::vector<Payload> pool);
Result<ServedModel> httpModelInfo(const std::string& endpoint, std::chrono::milliseconds timeout);
// POSTs one /v1/embeddings request with `text` and returns usage.prompt_tokens.
Result<uint64_t> httpCountTokens(const std::string& endpoint, const std::string& model,
                                 const std::string& text, std::chrono::milliseconds timeout);
// POSTs one /tokenize request with a chat of one user message `text` and returns the Harmony
// prompt's token count (what the chat endpoint reports as usage.prompt_tokens for that chat).
Result<uint64_t> httpCountChatTokens(const std::string& endpoint, const std::string& model,
                                     const std::string& text, std::chrono::milliseconds timeout);

// The request bodies the HTTP driver sends (exposed for tests).
std::string embeddingsBody(const std::string& model, const Payload& p,
                           const std::string& encoding_format);
// response_format: "" (none), "json_object" or "json_schema" (structured outputs; the schema
// is `response_schema`, JSON text, sent as json_schema {"name": "bench", "schema": ...});
// skip_reasoning: Garden's extension that starts the answer on the final channel (gpt-oss: the
// constraint then applies from the first token).
// temperature < 0: not sent (the server's default).
std::string chatBody(const std::string& model, const std::string& prompt, uint32_t max_tokens,
                     bool ignore_eos, const std::string& response_format = "",
                     bool skip_reasoning = false, double temperature = -1,
                     const std::string& response_schema = "");

// Shared phase bookkeeping: whether a client may issue another request.
class PhaseGate {
 public:
  explicit PhaseGate(const PhaseSpec& spec);
  bool claim();

 private:
  bool by_count_;
  std::atomic<int64_t> left_;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace garden::bench
