#pragma once
// IvyService: ivy's routes and their per-request bookkeeping.
//   POST /v1/embeddings  POST /v1/score  POST /v1/rerank  GET /v1/models      (API: key-gated)
//   GET /health  GET /ready  GET /metrics      (public; on the admin router when there is one)
// Handlers run on the connection's io thread: they admit, parse, validate and tokenize there, then
// hand the token ids to the TulipClient and return; the response is rendered in the client's
// callback and handed to the Responder. Nothing here blocks on the network.
//
// Order of work in a model request [TAG_ADMISSION]: admission (in-flight requests; 429) →
// x-request-timeout header (400) → parse with the cheap limits (count, characters; 400) →
// tokenize with the token limits (400) → admission of the tokens (429) → deadline left? (504) →
// upstream call with the remaining time as its gRPC deadline, cancelled (every chunk, retries
// included) if the client closes the connection first (HttpRequest::cancel).
//
// Timing headers on every response that reached tulip [TAG_TIMING_HEADERS] (microseconds):
//   x-garden-tokenize-us   handler start → ids ready (parse, validate, template, tokenize)
//   x-garden-queue-us      tulip: waiting for a batch            } reported by tulip
//   x-garden-inference-us  tulip: batch submitted → result       }
//   x-garden-upstream-us   ivy: gRPC call sent → reply (queue + inference + transport)
//   x-garden-total-us      ivy: request head received → response rendered
// so tokenize + upstream <= total and queue + inference <= upstream (up to clock rounding).
//
// onRequestDone() is the server's AccessObserver: one structured log line per request
// (request_id, method, route, status, latency_us) and the Prometheus series
//   ivy_http_requests_total{route,status}, ivy_http_request_duration_seconds{route},
//   ivy_http_client_disconnects_total{route} (client gone before the response; its upstream calls
//   were cancelled [TAG_CLIENT_DISCONNECT]),
//   ivy_embeddings_inputs_total, ivy_embeddings_prompt_tokens_total, ivy_score_documents_total,
//   ivy_admission_rejected_total{limit}, ivy_inflight_requests, ivy_inflight_tokens, ivy_ready.
//
// Thread-safe after construction. Does not own the client, monitor, encoder, tokenizer, prompts,
// keys or registry; they must outlive it.

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/metrics/registry.h"
#include "services/ivy/api/embeddings.h"
#include "services/ivy/api/limits.h"
#include "services/ivy/api/prompts.h"
#include "services/ivy/api/score.h"
#include "services/ivy/api/text_encoder.h"
#include "services/ivy/balance/tulip_client.h"
#include "services/ivy/balance/tulip_monitor.h"
#include "services/ivy/http/admission.h"
#include "services/ivy/http/auth.h"
#include "services/ivy/http/router.h"
#include "services/ivy/http/server.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

struct IvyServiceOptions {
  std::chrono::milliseconds request_timeout{30000};  // deadline of the tulip call; 0 = none
  RequestLimits embeddings_limits;                   // all model endpoints
  uint64_t max_inflight_requests = 1024;             // 0 = unbounded
  uint64_t max_inflight_tokens = 4u << 20;           // 0 = unbounded
  const PromptSet* prompts = nullptr;                // embedding prompt prefixes; null = none
  const Tokenizer* tokenizer = nullptr;              // needed by /v1/score and /v1/rerank
  std::string score_yes_token = "yes";
  std::string score_no_token = "no";
  const ApiKeys* api_keys = nullptr;  // null: no authentication
};

class IvyService {
 public:
  IvyService(IvyServiceOptions options, TulipClient* client, TulipMonitor* monitor,
             const TextEncoder* encoder, metrics::Registry* registry);

  // API routes on `router` (key-gated when api_keys is set); /health, /ready, /metrics on `admin`
  // when given, else on `router` (public either way).
  void registerRoutes(Router* router, Router* admin = nullptr);
  void onRequestDone(const AccessRecord& record);

 private:
  void embeddings(HttpRequest request, Responder respond);
  void scoring(HttpRequest request, Responder respond, ScoreApi api);
  void models(HttpRequest request, Responder respond);
  void ready(HttpRequest request, Responder respond);
  void metricsPage(HttpRequest request, Responder respond);
  // Admission + x-request-timeout, shared by the model routes. Errors are answered here.
  struct Start {
    std::shared_ptr<Admission::Ticket> ticket;
    std::chrono::microseconds timeout{0};  // 0 = no deadline
  };
  std::optional<Start> begin(const HttpRequest& request, const Responder& respond);
  // After tokenizing: adds the request's `prompt_tokens` to the in-flight limit (a refusal is
  // counted and returned), then returns remaining().
  Result<std::chrono::milliseconds> admitTokens(const HttpRequest& request, const Start& start,
                                                uint64_t prompt_tokens);
  // The remaining time of the request's deadline, or DEADLINE_EXCEEDED when it has passed.
  Result<std::chrono::milliseconds> remaining(const HttpRequest& request,
                                              std::chrono::microseconds timeout) const;

  IvyServiceOptions options_;
  TulipClient* client_;
  TulipMonitor* monitor_;
  const TextEncoder* encoder_;
  metrics::Registry* registry_;
  Admission admission_;
  std::unique_ptr<RerankTemplate> rerank_template_;  // null without a tokenizer
  Result<YesNoTokens> yes_no_;
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
