#include "services/ivy/http/service.h"

#include "common/json_writer.h"
#include "common/logging.h"
#include "services/ivy/api/errors.h"
#include "services/ivy/http/chat_routes.h"

namespace garden::ivy {
namespace {

using Clock = std::chrono::steady_clock;

HttpResponse jsonResponse(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

// The time `timeout` leaves of a request received at `received`: 0 when there is no deadline,
// DEADLINE_EXCEEDED when it has passed.
Result<std::chrono::milliseconds> remaining(Clock::time_point received,
                                            std::chrono::microseconds timeout) {
  if (timeout.count() <= 0) return std::chrono::milliseconds(0);
  auto left =
      std::chrono::duration_cast<std::chrono::microseconds>(received + timeout - Clock::now());
  if (left.count() <= 0) {
    return deadlineExceeded("the request's deadline (" + std::to_string(timeout.count() / 1000) +
                            " ms) passed before it was sent to the model");
  }
  return std::chrono::ceil<std::chrono::milliseconds>(left);
}

uint64_t totalTokens(const std::vector<std::vector<int32_t>>& inputs) {
  uint64_t n = 0;
  for (const auto& t : inputs) n += t.size();
  return n;
}

}  // namespace

IvyService::IvyService(IvyServiceOptions options, TulipClient* client, ModelSource model,
                       const TextEncoder* encoder, metrics::Registry* registry)
    : options_(std::move(options)),
      client_(client),
      model_(std::move(model)),
      encoder_(encoder),
      registry_(registry),
      admission_(options_.max_inflight_requests, options_.max_inflight_tokens),
      yes_no_(failedPrecondition(
          "scoring needs a tokenizer: start ivy with --tokenizer (tokenizer-impl garden)")),
      generate_(std::make_unique<GenerateRoutes>(client, options_.tokenizer, registry,
                                                 options_.make_tool_call_id,
                                                 options_.responses_store_max)),
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
  CHECK(model_.spec != nullptr && model_.ready != nullptr);
  if (options_.tokenizer != nullptr) {
    rerank_template_ = std::make_unique<RerankTemplate>(*options_.tokenizer);
    yes_no_ = resolveYesNoTokens(*options_.tokenizer, options_.score_yes_token,
                                 options_.score_no_token);
  }
}

IvyService::~IvyService() = default;

void IvyService::registerRoutes(Router* router, Router* admin) {
  if (options_.api_keys != nullptr) {
    const ApiKeys* keys = options_.api_keys;
    router->setGate([keys](const HttpRequest& r) { return keys->check(r); });
  }
  // Every model route is one ModelRoute through serveModel [TAG_PIPELINE].
  const RequestLimits* limits = &options_.limits;
  GenerateRoutes* gen = generate_.get();
  const ModelRoute model_routes[] = {
      {"/v1/embeddings", ModelUse::kEmbed,
       [this](const HttpRequest& r, const std::shared_ptr<const ModelSpec>& s) {
         return prepareEmbeddings(r, s);
       }},
      {"/v1/score", ModelUse::kScore,
       [this](const HttpRequest& r, const std::shared_ptr<const ModelSpec>& s) {
         return prepareScoring(r, s, ScoreApi::kScore);
       }},
      {"/v1/rerank", ModelUse::kScore,
       [this](const HttpRequest& r, const std::shared_ptr<const ModelSpec>& s) {
         return prepareScoring(r, s, ScoreApi::kRerank);
       }},
      {"/v1/chat/completions", ModelUse::kGenerate,
       [gen, limits](const HttpRequest& r, const std::shared_ptr<const ModelSpec>& s) {
         return gen->prepareChat(r, s, *limits);
       }},
      {"/v1/completions", ModelUse::kGenerate,
       [gen, limits](const HttpRequest& r, const std::shared_ptr<const ModelSpec>& s) {
         return gen->prepareCompletions(r, s, *limits);
       }},
      {"/v1/responses", ModelUse::kGenerate,
       [gen, limits](const HttpRequest& r, const std::shared_ptr<const ModelSpec>& s) {
         return gen->prepareResponses(r, s, *limits);
       }},
  };
  for (const ModelRoute& route : model_routes) {
    router->add("POST", route.path, [this, route](HttpRequest r, Responder d) {
      serveModel(route, std::move(r), std::move(d));
    });
  }
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

void IvyService::serveModel(const ModelRoute& route, HttpRequest request, Responder respond) {
  AdmittedRequest::Times times;
  times.received = request.received;
  times.start = Clock::now();
  // Every refusal before the upstream call is answered here, mapped by errorResponse().
  auto refuse = [&respond](const Status& st) { respond(errorResponse(st)); };

  Result<std::shared_ptr<Admission::Ticket>> ticket = admission_.admit();
  if (!ticket.isOk()) {
    rejected_.labels({"requests"}).inc();
    return refuse(ticket.status());
  }
  auto header = parseRequestTimeout(request.header("x-request-timeout"));
  if (!header.isOk()) return refuse(header.status());
  const std::chrono::microseconds timeout = effectiveTimeout(
      route.use == ModelUse::kGenerate ? options_.generate_timeout : options_.request_timeout,
      *header);
  std::shared_ptr<const ModelSpec> spec = model_.spec();
  if (spec == nullptr) {
    return refuse(modelNotLoaded());
  }
  if (Status st = checkModelKind(*spec, route.use, route.path); !st.isOk()) return refuse(st);

  Result<PreparedCall> prepared = route.prepare(request, spec);
  if (!prepared.isOk()) return refuse(prepared.status());
  times.tokenized = Clock::now();
  if (Status st = admission_.addTokens(**ticket, prepared->tokens); !st.isOk()) {
    rejected_.labels({"tokens"}).inc();
    return refuse(st);
  }
  Result<std::chrono::milliseconds> left = remaining(request.received, timeout);
  if (!left.isOk()) return refuse(left.status());

  inflight_requests_.set(static_cast<double>(admission_.requestsInFlight()));
  inflight_tokens_.set(static_cast<double>(admission_.tokensInFlight()));
  times.sent = Clock::now();
  auto admitted = std::make_shared<AdmittedRequest>(
      std::move(request.request_id), std::move(spec), std::move(request.cancel),
      std::move(ticket).value(), *left, times, std::move(respond));
  prepared->send(std::move(admitted));
}

Result<PreparedCall> IvyService::prepareEmbeddings(const HttpRequest& request,
                                                   const std::shared_ptr<const ModelSpec>& spec) {
  const RequestLimits& limits = options_.limits;
  ASSIGN_OR_RETURN(EmbeddingsRequest parsed, parseEmbeddingsRequest(request.body, *spec, limits));
  std::string_view prompt;
  if (options_.prompts != nullptr) {
    ASSIGN_OR_RETURN(prompt, options_.prompts->select(parsed.prompt_name, parsed.prompt_field));
  } else if (!parsed.prompt_name.empty()) {
    return invalidField(parsed.prompt_field, "unknown prompt name \"" +
                                                 parsed.prompt_name.substr(0, 64) +
                                                 "\" (this model has no prompts)");
  }
  auto call = std::make_shared<EmbedCall>();
  ASSIGN_OR_RETURN(call->inputs, resolveTokens(parsed, encoder_, *spec, limits, prompt));
  const uint64_t prompt_tokens = totalTokens(call->inputs);
  const size_t n = call->inputs.size();
  const EncodingFormat format = parsed.encoding_format;
  const uint32_t dims = parsed.dimensions;
  PreparedCall p;
  p.tokens = prompt_tokens;
  p.send = [this, call, n, prompt_tokens, format, dims](std::shared_ptr<AdmittedRequest> req) {
    call->request_id = req->requestId();
    call->model = req->spec().upstream_name;
    call->timeout = req->timeout();
    call->cancel = req->cancel();  // the client leaving cancels every chunk
    client_->embed(std::move(*call), [this, req, n, prompt_tokens, format,
                                      dims](Result<EmbedReply> reply) {
      if (!reply.isOk()) return req->answer(reply.status());
      if (reply->dim == 0 || reply->values.size() != n * size_t(reply->dim)) {
        return req->answer(internalError("tulip returned a malformed embedding reply"));
      }
      if (dims > reply->dim) {
        return req->answer(internalError("tulip returned " + std::to_string(reply->dim) +
                                         " dimensions, fewer than requested"));
      }
      inputs_.inc(static_cast<double>(n));
      prompt_tokens_.inc(static_cast<double>(prompt_tokens));
      const std::string& model = req->spec().served_name;
      std::string body =
          dims != 0 && dims < reply->dim
              ? renderEmbeddingsResponse(model, truncateAndNormalize(reply->values, reply->dim, dims),
                                         dims, format, prompt_tokens)
              : renderEmbeddingsResponse(model, reply->values, reply->dim, format, prompt_tokens);
      req->answer(jsonResponse(200, std::move(body)),
                  UpstreamTimes{reply->queue_us, reply->inference_us});
    });
  };
  return p;
}

Result<PreparedCall> IvyService::prepareScoring(const HttpRequest& request,
                                                const std::shared_ptr<const ModelSpec>& spec,
                                                ScoreApi api) {
  const RequestLimits& limits = options_.limits;
  ASSIGN_OR_RETURN(ScoringRequest parsed, parseScoringRequest(request.body, *spec, limits, api));
  if (rerank_template_ == nullptr) {
    return invalidField("documents",
                        "scoring is not available: this server has no tokenizer of its own "
                        "configured (start ivy with --tokenizer and --tokenizer-impl garden)");
  }
  auto call = std::make_shared<ScoreCall>();
  if (!spec->has_score_head) {
    if (!yes_no_.isOk()) return internalError(yes_no_.status().message());
    call->yes_token = yes_no_->yes;
    call->no_token = yes_no_->no;
  }
  ASSIGN_OR_RETURN(call->inputs, rerank_template_->render(parsed, *spec, limits));
  const uint64_t prompt_tokens = totalTokens(call->inputs);
  const size_t n = call->inputs.size();
  auto req_doc = std::make_shared<const ScoringRequest>(std::move(parsed));
  std::string id = (api == ScoreApi::kScore ? "score-" : "rerank-") + request.request_id;
  PreparedCall p;
  p.tokens = prompt_tokens;
  p.send = [this, call, n, prompt_tokens, req_doc, api,
            id = std::move(id)](std::shared_ptr<AdmittedRequest> req) {
    call->request_id = req->requestId();
    call->model = req->spec().upstream_name;
    call->timeout = req->timeout();
    call->cancel = req->cancel();  // the client leaving cancels every chunk
    client_->score(std::move(*call), [this, req, n, prompt_tokens, req_doc, api,
                                      id](Result<ScoreReply> reply) {
      if (!reply.isOk()) return req->answer(reply.status());
      if (reply->scores.size() != n) {
        return req->answer(internalError("tulip returned " +
                                         std::to_string(reply->scores.size()) + " scores for " +
                                         std::to_string(n) + " documents"));
      }
      score_documents_.inc(static_cast<double>(n));
      const std::string& model = req->spec().served_name;
      req->answer(jsonResponse(200, api == ScoreApi::kScore
                                        ? renderScoreResponse(id, model, reply->scores,
                                                              prompt_tokens)
                                        : renderRerankResponse(id, model, *req_doc,
                                                               reply->scores, prompt_tokens)),
                  UpstreamTimes{reply->queue_us, reply->inference_us});
    });
  };
  return p;
}

void IvyService::models(HttpRequest, Responder respond) {
  std::shared_ptr<const ModelSpec> spec = model_.spec();
  if (spec == nullptr) {
    return respond(errorResponse(modelNotLoaded()));
  }
  respond(jsonResponse(200, renderModelsResponse(*spec)));
}

void IvyService::ready(HttpRequest, Responder respond) {
  if (!model_.ready()) {
    return respond(errorResponse(unavailable("not ready: no healthy tulip with a known model")));
  }
  std::shared_ptr<const ModelSpec> spec = model_.spec();
  JsonWriter w;
  w.beginObject().field("status", "ready");
  if (spec) w.field("model", spec->served_name);
  w.endObject();
  respond(jsonResponse(200, w.take()));
}

void IvyService::metricsPage(HttpRequest, Responder respond) {
  ready_gauge_.set(model_.ready() ? 1.0 : 0.0);
  inflight_requests_.set(static_cast<double>(admission_.requestsInFlight()));
  inflight_tokens_.set(static_cast<double>(admission_.tokensInFlight()));
  HttpResponse r;
  r.status = 200;
  r.content_type = std::string(metrics::kExpositionContentType);
  r.body = registry_->expose();
  respond(std::move(r));
}

Status IvyService::modelNotLoaded() const {
  const std::string why = model_.waiting_reason ? model_.waiting_reason() : std::string();
  return unavailable("the model is not loaded yet (waiting for tulip" +
                     (why.empty() ? std::string() : "; last probe of " + why) + ")");
}

}  // namespace garden::ivy
