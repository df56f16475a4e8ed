#pragma once
// IvyService: ivy's routes and their per-request bookkeeping.
//   POST /v1/embeddings  GET /v1/models  GET /health  GET /ready  GET /metrics
// Handlers run on the connection's io thread: they parse, validate and tokenize there, then hand
// the token ids to the TulipClient and return; the response is rendered in the client's callback
// and handed to the Responder. Nothing here blocks on the network.
//
// onRequestDone() is the server's AccessObserver: one structured log line per request
// (request_id, method, route, status, latency_us) and the Prometheus series
//   ivy_http_requests_total{route,status}, ivy_http_request_duration_seconds{route},
//   ivy_embeddings_inputs_total, ivy_embeddings_prompt_tokens_total, ivy_ready.
//
// Thread-safe after construction. Does not own the client, monitor, encoder or registry; they
// must outlive it.

#include <chrono>
#include <memory>
#include <string>

#include "common/metrics/registry.h"
#include "services/ivy/api/embeddings.h"
#include "services/ivy/api/text_encoder.h"
#include "services/ivy/balance/tulip_client.h"
#include "services/ivy/balance/tulip_monitor.h"
#include "services/ivy/http/router.h"
#include "services/ivy/http/server.h"

namespace garden::ivy {

struct IvyServiceOptions {
  std::chrono::milliseconds request_timeout{30000};  // deadline of the tulip call; 0 = none
  EmbeddingsLimits embeddings_limits;
};

class IvyService {
 public:
  IvyService(IvyServiceOptions options, TulipClient* client, TulipMonitor* monitor,
             const TextEncoder* encoder, metrics::Registry* registry);

  void registerRoutes(Router* router);
  void onRequestDone(const AccessRecord& record);

 private:
  void embeddings(HttpRequest request, Responder respond);
  void models(HttpRequest request, Responder respond);
  void ready(HttpRequest request, Responder respond);
  void metricsPage(HttpRequest request, Responder respond);

  IvyServiceOptions options_;
  TulipClient* client_;
  TulipMonitor* monitor_;
  const TextEncoder* encoder_;
  metrics::Registry* registry_;
  metrics::CounterFamily& requests_;
  metrics::HistogramFamily& latency_;
  metrics::Counter& inputs_;
  metrics::Counter& prompt_tokens_;
  metrics::Gauge& ready_gauge_;
};

}  // namespace garden::ivy
