#include "services/ivy/http/service.h"

#include "common/json_writer.h"
#include "common/logging.h"
#include "services/ivy/api/errors.h"

namespace garden::ivy {
namespace {

using Clock = std::chrono::steady_clock;

HttpResponse jsonResponse(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

uint64_t usBetween(Clock::time_point a, Clock::time_point b) {
  return b > a ? static_cast<uint64_t>(
                     std::chrono::duration_cast<std::chrono::microseconds>(b - a).count())
               : 0;
}

// [TAG_TIMING_HEADERS]
struct StageTimes {
  Clock::time_point received, start, tokenized, sent;
  uint64_t queue_us = 0, inference_us = 0;
};

void addTimingHeaders(HttpResponse* r, const StageTimes& t) {
  Clock::time_point now = Clock::now();
  r->headers.emplace_back("x-garden-tokenize-us", std::to_string(usBetween(t.start, t.tokenized)));
  r->headers.emplace_back("x-garden-queue-us", std::to_string(t.queue_us));
  r->headers.emplace_back("x-garden-inference-us", std::to_string(t.inference_us));
  r->headers.emplace_back("x-garden-upstream-us", std::to_string(usBetween(t.sent, now)));
  r->headers.emplace_back("x-garden-total-us", std::to_string(usBetween(t.received, now)));
}

}  // namespace

IvyService::IvyService(IvyServiceOptions options, TulipClient* client, TulipMonitor* monitor,
                       const TextEncoder* encoder, metrics::Registry* registry)
    : options_(std::move(options)),
      client_(client),
      monitor_(monitor),
      encoder_(encoder),
      registry_(registry),
      admission_(options_.max_inflight_requests, options_.max_inflight_tokens),
      yes_no_(failedPrecondition(
          "scoring needs a tokenizer: start ivy with --tokenizer (tokenizer-impl garden)")),
      requests_(registry->counter("ivy_http_requests_total", "HTTP requests by route and status",
                                  {"route", "status"})),
      client_gone_(registry->counter(
          "ivy_http_client_disconnects_total",
          "Requests whose client closed the connection before the response was complete; their "
          "upstream calls were cancelled (logged with status 499)",
          {"route"})),
      latency_(registry->histogram("ivy_http_request_duration_seconds",
                                   "HTTP request latency from header received to response",
                                   {"route"})),
      inputs_(registry->counter("ivy_embeddings_inputs_total", "Embedding inputs served").get()),
      prompt_tokens_(registry
                         ->counter("ivy_embeddings_prompt_tokens_total",
                                   "Prompt tokens of embedding inputs served")
                         .get()),
      score_documents_(
          registry->counter("ivy_score_documents_total", "Documents scored (score and rerank)")
              .get()),
      rejected_(registry->counter("ivy_admission_rejected_total",
                                  "Model requests refused with 429 by ivy's own in-flight bounds",
                                  {"limit"})),
      inflight_requests_(
          registry->gauge("ivy_inflight_requests", "Model requests in flight in ivy").get()),
      inflight_tokens_(
          registry->gauge("ivy_inflight_tokens", "Tokens of model requests in flight in ivy")
              .get()),
      ready_gauge_(
          registry->gauge("ivy_ready", "1 when a healthy tulip with a known model exists").get()) {
  if (options_.tokenizer != nullptr) {
    rerank_template_ = std::make_unique<RerankTemplate>(*options_.tokenizer);
    yes_no_ = resolveYesNoTokens(*options_.tokenizer, options_.score_yes_token,
                                 options_.score_no_token);
  }
}

void IvyService::registerRoutes(Router* router, Router* admin) {
  if (options_.api_keys != nullptr) {
    const ApiKeys* keys = options_.api_keys;
    router->setGate([keys](const HttpRequest& r) { return keys->check(r); });
  }
  router->add("POST", "/v1/embeddings",
              [this](HttpRequest r, Responder d) { embeddings(std::move(r), std::move(d)); });
  router->add("POST", "/v1/score", [this](HttpRequest r, Responder d) {
    scoring(std::move(r), std::move(d), ScoreApi::kScore);
  });
  router->add("POST", "/v1/rerank", [this](HttpRequest r, Responder d) {
    scoring(std::move(r), std::move(d), ScoreApi::kRerank);
  });
  router->add("GET", "/v1/models",
              [this](HttpRequest r, Responder d) { models(std::move(r), std::move(d)); });
  Router* ops = admin != nullptr ? admin : router;
  ops->add(
      "GET", "/health",
      [](HttpRequest, Responder d) { d(jsonResponse(200, "{\"status\":\"ok\"}")); },
      Access::kPublic);
  ops->add(
      "GET", "/ready", [this](HttpRequest r, Responder d) { ready(std::move(r), std::move(d)); },
      Access::kPublic);
  ops->add(
      "GET", "/metrics",
      [this](HttpRequest r, Responder d) { metricsPage(std::move(r), std::move(d)); },
      Access::kPublic);
}

void IvyService::onRequestDone(const AccessRecord& rec) {
  requests_.labels({rec.route, std::to_string(rec.status)}).inc();
  if (rec.client_gone) client_gone_.labels({rec.route}).inc();
  latency_.labels({rec.route}).observe(std::chrono::duration<double>(rec.latency).count());
  log::info("request", {{"request_id", rec.request_id},
                        {"method", rec.method},
                        {"route", rec.route},
                        {"status", rec.status},
                        {"latency_us", static_cast<int64_t>(rec.latency.count())},
                        {"request_bytes", rec.request_bytes},
                        {"response_bytes", rec.response_bytes}});
}

std::optional<IvyService::Start> IvyService::begin(const HttpRequest& request,
                                                   const Responder& respond) {
  Result<std::shared_ptr<Admission::Ticket>> ticket = admission_.admit();
  if (!ticket.isOk()) {
    rejected_.labels({"requests"}).inc();
    respond(errorResponse(ticket.status()));
    return std::nullopt;
  }
  auto header = parseRequestTimeout(request.header("x-request-timeout"));
  if (!header.isOk()) {
    respond(errorResponse(header.status()));
    return std::nullopt;
  }
  return Start{std::move(ticket).value(), effectiveTimeout(options_.request_timeout, *header)};
}

Result<std::chrono::milliseconds> IvyService::admitTokens(const HttpRequest& request,
                                                          const Start& start,
                                                          uint64_t prompt_tokens) {
  if (Status st = admission_.addTokens(*start.ticket, prompt_tokens); !st.isOk()) {
    rejected_.labels({"tokens"}).inc();
    return st;
  }
  return remaining(request, start.timeout);
}

Result<std::chrono::milliseconds> IvyService::remaining(const HttpRequest& request,
                                                        std::chrono::microseconds timeout) const {
  if (timeout.count() <= 0) return std::chrono::milliseconds(0);
  auto left = std::chrono::duration_cast<std::chrono::microseconds>(
      request.received + timeout - Clock::now());
  if (left.count() <= 0) {
    return deadlineExceeded("the request's deadline (" + std::to_string(timeout.count() / 1000) +
                            " ms) passed before it was sent to the model");
  }
  return std::chrono::ceil<std::chrono::milliseconds>(left);
}

void IvyService::embeddings(HttpRequest request, Responder respond) {
  StageTimes times;
  times.received = request.received;
  times.start = Clock::now();
  std::optional<Start> start = begin(request, respond);
  if (!start) return;
  std::shared_ptr<const ModelSpec> spec = monitor_->spec();
  if (spec == nullptr) {
    return respond(errorResponse(unavailable("the model is not loaded yet (waiting for tulip)")));
  }
  if (spec->kind == "llm") {  // chat models are served by /v1/chat/completions (http/chat_routes.h)
    return respond(errorResponse(invalidField(
        "model", "'" + spec->served_name +
                     "' is a generative (llm) model; /v1/embeddings needs an embedding model")));
  }
  const RequestLimits& limits = options_.embeddings_limits;
  Result<EmbeddingsRequest> parsed = parseEmbeddingsRequest(request.body, *spec, limits);
  if (!parsed.isOk()) return respond(errorResponse(parsed.status()));
  std::string_view prompt;
  if (options_.prompts != nullptr) {
    Result<std::string_view> p = options_.prompts->select(parsed->prompt_name, parsed->prompt_field);
    if (!p.isOk()) return respond(errorResponse(p.status()));
    prompt = *p;
  } else if (!parsed->prompt_name.empty()) {
    return respond(errorResponse(invalidField(
        parsed->prompt_field, "unknown prompt name \"" + parsed->prompt_name.substr(0, 64) +
                                  "\" (this model has no prompts)")));
  }
  Result<std::vector<std::vector<int32_t>>> tokens =
      resolveTokens(*parsed, encoder_, *spec, limits, prompt);
  if (!tokens.isOk()) return respond(errorResponse(tokens.status()));

  uint64_t prompt_tokens = 0;
  for (const auto& t : *tokens) prompt_tokens += t.size();
  Result<std::chrono::milliseconds> left = admitTokens(request, *start, prompt_tokens);
  if (!left.isOk()) return respond(errorResponse(left.status()));
  const size_t n = tokens->size();
  EmbedCall call;
  call.request_id = request.request_id;
  call.model = spec->upstream_name;
  call.inputs = std::move(tokens).value();
  call.timeout = *left;
  call.cancel = request.cancel;  // the client leaving cancels every chunk [TAG_CLIENT_DISCONNECT]
  times.tokenized = times.sent = Clock::now();
  inflight_requests_.set(static_cast<double>(admission_.requestsInFlight()));
  inflight_tokens_.set(static_cast<double>(admission_.tokensInFlight()));
  client_->embed(std::move(call), [this, respond = std::move(respond), spec, n, prompt_tokens,
                                   ticket = std::move(start->ticket), times,
                                   format = parsed->encoding_format,
                                   dims = parsed->dimensions](Result<EmbedReply> reply) mutable {
    HttpResponse r;
    if (!reply.isOk()) {
      r = errorResponse(reply.status());
    } else if (reply->dim == 0 || reply->values.size() != n * size_t(reply->dim)) {
      r = errorResponse(internalError("tulip returned a malformed embedding reply"));
    } else if (dims > reply->dim) {
      r = errorResponse(internalError("tulip returned " + std::to_string(reply->dim) +
                                      " dimensions, fewer than requested"));
    } else {
      inputs_.inc(static_cast<double>(n));
      prompt_tokens_.inc(static_cast<double>(prompt_tokens));
      times.queue_us = reply->queue_us;
      times.inference_us = reply->inference_us;
      std::string body;
      if (dims != 0 && dims < reply->dim) {
        std::vector<float> cut = truncateAndNormalize(reply->values, reply->dim, dims);
        body = renderEmbeddingsResponse(spec->served_name, cut, dims, format, prompt_tokens);
      } else {
        body = renderEmbeddingsResponse(spec->served_name, reply->values, reply->dim, format,
                                        prompt_tokens);
      }
      r = jsonResponse(200, std::move(body));
    }
    addTimingHeaders(&r, times);
    ticket.reset();  // in-flight bounds released before the response leaves
    respond(std::move(r));
  });
}

void IvyService::scoring(HttpRequest request, Responder respond, ScoreApi api) {
  StageTimes times;
  times.received = request.received;
  times.start = Clock::now();
  std::optional<Start> start = begin(request, respond);
  if (!start) return;
  std::shared_ptr<const ModelSpec> spec = monitor_->spec();
  if (spec == nullptr) {
    return respond(errorResponse(unavailable("the model is not loaded yet (waiting for tulip)")));
  }
  const RequestLimits& limits = options_.embeddings_limits;
  Result<ScoringRequest> parsed = parseScoringRequest(request.body, *spec, limits, api);
  if (!parsed.isOk()) return respond(errorResponse(parsed.status()));
  if (rerank_template_ == nullptr) {
    return respond(errorResponse(invalidField(
        "documents", "scoring is not available: this server has no tokenizer of its own "
                     "configured (start ivy with --tokenizer and --tokenizer-impl garden)")));
  }
  ScoreCall call;
  if (!spec->has_score_head) {
    if (!yes_no_.isOk()) return respond(errorResponse(internalError(yes_no_.status().message())));
    call.yes_token = yes_no_->yes;
    call.no_token = yes_no_->no;
  }
  Result<std::vector<std::vector<int32_t>>> tokens =
      rerank_template_->render(*parsed, *spec, limits);
  if (!tokens.isOk()) return respond(errorResponse(tokens.status()));
  uint64_t prompt_tokens = 0;
  for (const auto& t : *tokens) prompt_tokens += t.size();
  Result<std::chrono::milliseconds> left = admitTokens(request, *start, prompt_tokens);
  if (!left.isOk()) return respond(errorResponse(left.status()));
  const size_t n = tokens->size();
  call.request_id = request.request_id;
  call.model = spec->upstream_name;
  call.inputs = std::move(tokens).value();
  call.timeout = *left;
  call.cancel = request.cancel;  // the client leaving cancels every chunk [TAG_CLIENT_DISCONNECT]
  times.tokenized = times.sent = Clock::now();
  inflight_requests_.set(static_cast<double>(admission_.requestsInFlight()));
  inflight_tokens_.set(static_cast<double>(admission_.tokensInFlight()));
  auto req = std::make_shared<ScoringRequest>(std::move(parsed).value());
  std::string id = (api == ScoreApi::kScore ? "score-" : "rerank-") + request.request_id;
  client_->score(std::move(call), [this, respond = std::move(respond), spec, n, prompt_tokens,
                                   ticket = std::move(start->ticket), times, req, api,
                                   id = std::move(id)](Result<ScoreReply> reply) mutable {
    HttpResponse r;
    if (!reply.isOk()) {
      r = errorResponse(reply.status());
    } else if (reply->scores.size() != n) {
      r = errorResponse(internalError("tulip returned " + std::to_string(reply->scores.size()) +
                                      " scores for " + std::to_string(n) + " documents"));
    } else {
      score_documents_.inc(static_cast<double>(n));
      times.queue_us = reply->queue_us;
      times.inference_us = reply->inference_us;
      r = jsonResponse(200, api == ScoreApi::kScore
                                ? renderScoreResponse(id, spec->served_name, reply->scores,
                                                      prompt_tokens)
                                : renderRerankResponse(id, spec->served_name, *req, reply->scores,
                                                       prompt_tokens));
    }
    addTimingHeaders(&r, times);
    ticket.reset();
    respond(std::move(r));
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
  inflight_requests_.set(static_cast<double>(admission_.requestsInFlight()));
  inflight_tokens_.set(static_cast<double>(admission_.tokensInFlight()));
  HttpResponse r;
  r.status = 200;
  r.content_type = std::string(metrics::kExpositionContentType);
  r.body = registry_->expose();
  respond(std::move(r));
}

}  // namespace garden::ivy
