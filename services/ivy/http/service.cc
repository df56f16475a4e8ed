#include "services/ivy/http/service.h"

#include "common/json_writer.h"
#include "common/logging.h"
#include "services/ivy/api/errors.h"

namespace garden::ivy {
namespace {

HttpResponse jsonResponse(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

}  // namespace

IvyService::IvyService(IvyServiceOptions options, TulipClient* client, TulipMonitor* monitor,
                       const TextEncoder* encoder, metrics::Registry* registry)
    : options_(std::move(options)),
      client_(client),
      monitor_(monitor),
      encoder_(encoder),
      registry_(registry),
      requests_(registry->counter("ivy_http_requests_total", "HTTP requests by route and status",
                                  {"route", "status"})),
      latency_(registry->histogram("ivy_http_request_duration_seconds",
                                   "HTTP request latency from header received to response",
                                   {"route"})),
      inputs_(registry->counter("ivy_embeddings_inputs_total", "Embedding inputs served").get()),
      prompt_tokens_(registry
                         ->counter("ivy_embeddings_prompt_tokens_total",
                                   "Prompt tokens of embedding inputs served")
                         .get()),
      ready_gauge_(
          registry->gauge("ivy_ready", "1 when a healthy tulip with a known model exists").get()) {}

void IvyService::registerRoutes(Router* router) {
  router->add("POST", "/v1/embeddings",
              [this](HttpRequest r, Responder d) { embeddings(std::move(r), std::move(d)); });
  router->add("GET", "/v1/models",
              [this](HttpRequest r, Responder d) { models(std::move(r), std::move(d)); });
  router->add("GET", "/health",
              [](HttpRequest, Responder d) { d(jsonResponse(200, "{\"status\":\"ok\"}")); });
  router->add("GET", "/ready",
              [this](HttpRequest r, Responder d) { ready(std::move(r), std::move(d)); });
  router->add("GET", "/metrics",
              [this](HttpRequest r, Responder d) { metricsPage(std::move(r), std::move(d)); });
}

void IvyService::onRequestDone(const AccessRecord& rec) {
  requests_.labels({rec.route, std::to_string(rec.status)}).inc();
  latency_.labels({rec.route}).observe(std::chrono::duration<double>(rec.latency).count());
  log::info("request", {{"request_id", rec.request_id},
                        {"method", rec.method},
                        {"route", rec.route},
                        {"status", rec.status},
                        {"latency_us", static_cast<int64_t>(rec.latency.count())},
                        {"request_bytes", rec.request_bytes},
                        {"response_bytes", rec.response_bytes}});
}

void IvyService::embeddings(HttpRequest request, Responder respond) {
  std::shared_ptr<const ModelSpec> spec = monitor_->spec();
  if (spec == nullptr) {
    return respond(errorResponse(unavailable("the model is not loaded yet (waiting for tulip)")));
  }
  Result<EmbeddingsRequest> parsed =
      parseEmbeddingsRequest(request.body, *spec, options_.embeddings_limits);
  if (!parsed.isOk()) return respond(errorResponse(parsed.status()));
  Result<std::vector<std::vector<int32_t>>> tokens = resolveTokens(*parsed, encoder_, *spec);
  if (!tokens.isOk()) return respond(errorResponse(tokens.status()));

  uint64_t prompt_tokens = 0;
  for (const auto& t : *tokens) prompt_tokens += t.size();
  const size_t n = tokens->size();
  EmbedCall call;
  call.request_id = request.request_id;
  call.model = spec->upstream_name;
  call.inputs = std::move(tokens).value();
  call.timeout = options_.request_timeout;
  client_->embed(std::move(call), [this, respond = std::move(respond), spec, n, prompt_tokens,
                                   format = parsed->encoding_format,
                                   dims = parsed->dimensions](Result<EmbedReply> reply) {
    if (!reply.isOk()) return respond(errorResponse(reply.status()));
    if (reply->dim == 0 || reply->values.size() != n * size_t(reply->dim)) {
      return respond(errorResponse(internalError("tulip returned a malformed embedding reply")));
    }
    if (dims > reply->dim) {
      return respond(errorResponse(internalError("tulip returned " + std::to_string(reply->dim) +
                                                 " dimensions, fewer than requested")));
    }
    inputs_.inc(static_cast<double>(n));
    prompt_tokens_.inc(static_cast<double>(prompt_tokens));
    std::string body;
    if (dims != 0 && dims < reply->dim) {
      std::vector<float> cut = truncateAndNormalize(reply->values, reply->dim, dims);
      body = renderEmbeddingsResponse(spec->served_name, cut, dims, format, prompt_tokens);
    } else {
      body = renderEmbeddingsResponse(spec->served_name, reply->values, reply->dim, format,
                                      prompt_tokens);
    }
    respond(jsonResponse(200, std::move(body)));
  });
}

void IvyService::models(HttpRequest, Responder respond) {
  std::shared_ptr<const ModelSpec> spec = monitor_->spec();
  if (spec == nullptr) {
    return respond(errorResponse(unavailable("the model is not loaded yet (waiting for tulip)")));
  }
  respond(jsonResponse(200, renderModelsResponse(*spec)));
}

void IvyService::ready(HttpRequest, Responder respond) {
  if (!monitor_->ready()) {
    return respond(errorResponse(unavailable("not ready: no healthy tulip with a known model")));
  }
  std::shared_ptr<const ModelSpec> spec = monitor_->spec();
  JsonWriter w;
  w.beginObject().field("status", "ready");
  if (spec) w.field("model", spec->served_name);
  w.endObject();
  respond(jsonResponse(200, w.take()));
}

void IvyService::metricsPage(HttpRequest, Responder respond) {
  ready_gauge_.set(monitor_->ready() ? 1.0 : 0.0);
  HttpResponse r;
  r.status = 200;
  r.content_type = std::string(metrics::kExpositionContentType);
  r.body = registry_->expose();
  respond(std::move(r));
}

}  // namespace garden::ivy
