#pragma once
// IvyService: ivy's routes and the one pipeline every model request goes through.
//   model routes:  POST /v1/embeddings  POST /v1/score  POST /v1/rerank
//                  POST /v1/chat/completions  POST /v1/completions           (API: key-gated)
//                  POST /v1/responses
//   GET /v1/models (key-gated)
//   GET /health  GET /ready  GET /metrics      (public; on the admin router when there is one)
// Handlers run on the connection's io thread: they admit, parse, validate and tokenize there, then
// hand the token ids to the TulipClient (the replica pool) and return; the response is rendered
// in the client's callbacks. Nothing here blocks on the network.
//
// The pipeline, the same for every model route [TAG_PIPELINE] [TAG_ADMISSION] (serveModel):
//   auth (the Router's gate: 401) → admission of one request against --max-inflight-requests
//   (429 + Retry-After, before the body is parsed) → the x-request-timeout header (400) → the
//   served model known (503) and of a kind the route serves (400 naming `model` and the kind;
//   checkModelKind, api/model_spec.h) → the route's parse within the limits and its tokenize or
//   render (400; api/limits.h) → admission of the request's tokens against --max-inflight-tokens
//   (429) → deadline left? (504) → the route's call on the pool with the remaining time as its
//   gRPC deadline, cancelled (every chunk or stream) if the client closes the connection first
//   [TAG_CLIENT_DISCONNECT] → the answer, or its error mapped to HTTP once (errorResponse; an
//   error after a stream's head is an SSE error event), with the timing headers
//   (http/pipeline.h [TAG_TIMING_HEADERS]).
// The route-specific steps are in this file (embeddings, score, rerank) and in
// http/chat_routes.h (chat, completions, responses: GenerateRoutes).
//
// Deadlines: embeddings, score and rerank get --request-timeout-ms (request_timeout); chat,
// completions and responses get --generate-timeout-ms (generate_timeout): generation runs for as
// long as it produces tokens, so its bound is the one an OpenAI client applies by default (10
// minutes). The caller's x-request-timeout applies to both and can only shorten them. A generation
// past its deadline ends with 504 before its first chunk, or an SSE error event (code "timeout")
// after. Tokens counted against --max-inflight-tokens: the prompt tokens of embeddings, score and
// rerank; for chat and completions every choice's prompt tokens + max_tokens (what it may occupy).
//
// onRequestDone() is the server's AccessObserver: one structured log line per request
// (request_id, method, route, status, latency_us) and the Prometheus series
//   ivy_http_requests_total{route,status}, ivy_http_request_duration_seconds{route},
//   ivy_http_client_disconnects_total{route} (client gone before the response; its upstream calls
//   were cancelled [TAG_CLIENT_DISCONNECT]),
//   ivy_embeddings_inputs_total, ivy_embeddings_prompt_tokens_total, ivy_score_documents_total,
//   ivy_admission_rejected_total{limit}, ivy_inflight_requests, ivy_inflight_tokens, ivy_ready
// (and the generation series of http/chat_routes.h).
//
// Thread-safe after construction. Does not own the client, encoder, tokenizer, prompts, keys or
// registry; they, and what `model` reads, must outlive it.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/metrics/registry.h"
#include "services/ivy/api/embeddings.h"
#include "services/ivy/api/limits.h"
#include "services/ivy/api/model_spec.h"
#include "services/ivy/api/prompts.h"
#include "services/ivy/api/score.h"
#include "services/ivy/api/text_encoder.h"
#include "services/ivy/balance/tulip_client.h"
#include "services/ivy/http/admission.h"
#include "services/ivy/http/auth.h"
#include "services/ivy/http/pipeline.h"
#include "services/ivy/http/router.h"
#include "services/ivy/http/server.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

class GenerateRoutes;  // http/chat_routes.h

struct IvyServiceOptions {
  std::chrono::milliseconds request_timeout{30000};    // embeddings, score, rerank; 0 = none
  std::chrono::milliseconds generate_timeout{600000};  // chat, completions; 0 = none
  RequestLimits limits;                                // every model route
  uint64_t max_inflight_requests = 1024;               // 0 = unbounded
  uint64_t max_inflight_tokens = 4u << 20;             // 0 = unbounded
  const PromptSet* prompts = nullptr;                  // embedding prompt prefixes; null = none
  // ivy's own tokenizer: /v1/score and /v1/rerank, and chat (a Harmony one) and completions.
  const Tokenizer* tokenizer = nullptr;
  std::string score_yes_token = "yes";
  std::string score_no_token = "no";
  const ApiKeys* api_keys = nullptr;  // null: no authentication
  // Tool-call ids of chat answers (tests make them deterministic); default: random "call_...".
  std::function<std::string(size_t index)> make_tool_call_id;
  // Responses kept for /v1/responses' previous_response_id (--responses-store-max; 0: none).
  size_t responses_store_max = 1024;
};

class IvyService {
 public:
  // `model`: the served model and readiness (the replica pool's spec() and ready()).
  IvyService(IvyServiceOptions options, TulipClient* client, ModelSource model,
             const TextEncoder* encoder, metrics::Registry* registry);
  ~IvyService();
  IvyService(const IvyService&) = delete;
  IvyService& operator=(const IvyService&) = delete;

  // API routes on `router` (key-gated when api_keys is set); /health, /ready, /metrics on `admin`
  // when given, else on `router` (public either way).
  void registerRoutes(Router* router, Router* admin = nullptr);
  void onRequestDone(const AccessRecord& record);

 private:
  using Prepare = std::function<Result<PreparedCall>(const HttpRequest&,
                                                     const std::shared_ptr<const ModelSpec>&)>;
  struct ModelRoute {
    std::string_view path;
    ModelUse use;
    Prepare prepare;
  };
  // The pipeline (see above); answers every error before the upstream call itself.
  void serveModel(const ModelRoute& route, HttpRequest request, Responder respond);
  // The route steps of embeddings, score and rerank.
  Result<PreparedCall> prepareEmbeddings(const HttpRequest& request,
                                         const std::shared_ptr<const ModelSpec>& spec);
  Result<PreparedCall> prepareScoring(const HttpRequest& request,
                                      const std::shared_ptr<const ModelSpec>& spec, ScoreApi api);
  void models(HttpRequest request, Responder respond);
  void ready(HttpRequest request, Responder respond);
  void metricsPage(HttpRequest request, Responder respond);
  // The 503 while no replica has told ivy its model, with the last probe failure when there is
  // one (a token tulip refuses says so here, not only in the log).
  Status modelNotLoaded() const;

  IvyServiceOptions options_;
  TulipClient* client_;
  ModelSource model_;
  const TextEncoder* encoder_;
  metrics::Registry* registry_;
  Admission admission_;
  std::unique_ptr<RerankTemplate> rerank_template_;  // null without a tokenizer
  Result<YesNoTokens> yes_no_;
  std::unique_ptr<GenerateRoutes> generate_;
  metrics::CounterFamily& requests_;
  metrics::CounterFamily& client_gone_;
  metrics::HistogramFamily& latency_;
  metrics::Counter& inputs_;
  metrics::Counter& prompt_tokens_;
  metrics::Counter& score_documents_;
  metrics::CounterFamily& rejected_;
  metrics::Gauge& inflight_requests_;
  metrics::Gauge& inflight_tokens_;
  metrics::Gauge& ready_gauge_;
};

}  // namespace garden::ivy
