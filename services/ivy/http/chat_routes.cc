#include "services/ivy/http/chat_routes.h"

#include <mutex>

#include "common/logging.h"
#include "services/ivy/api/chat.h"
#include "services/ivy/api/completions.h"
#include "services/ivy/api/errors.h"
#include "services/ivy/http/response_stream.h"

namespace garden::ivy {
namespace {

struct GenerateMetrics {
  explicit GenerateMetrics(metrics::Registry* r)
      : requests(r->counter("ivy_generate_requests_total",
                            "Chat and completions requests by endpoint and outcome",
                            {"endpoint", "outcome"})),
        completion_tokens(r->counter("ivy_generate_completion_tokens_total",
                                     "Tokens generated for chat and completions requests")
                              .get()),
        prompt_tokens(
            r->counter("ivy_generate_prompt_tokens_total", "Prompt tokens of generation requests")
                .get()) {}
  metrics::CounterFamily& requests;
  metrics::Counter& completion_tokens;
  metrics::Counter& prompt_tokens;
};

int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One request's generations (one per choice) and its response. Callbacks of the TulipClient
// (one thread per stream at a time, streams concurrent) and the server's cancel hook meet here;
// `mu_` guards everything below it. GenerateStream::cancel() is only called without `mu_` held
// (a client may complete the call inline).
class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  GenerationJob(std::unique_ptr<GenerationOutput> out, bool stream, Responder respond,
                GenerateMetrics* metrics, std::string endpoint, std::string request_id)
      : metrics_(metrics),
        endpoint_(std::move(endpoint)),
        request_id_(std::move(request_id)),
        out_(std::move(out)),
        stream_(stream),
        respond_(std::move(respond)),
        choices_(out_->choices()),
        remaining_(choices_.size()) {}

  // `cancel` (the request's, may be null) fires when the client goes away before the response:
  // every stream of the request is cancelled [TAG_CLIENT_DISCONNECT].
  void start(TulipClient* client, std::vector<GenerateCall> calls,
             const std::shared_ptr<CallCanceller>& cancel) {
    if (cancel) {
      std::weak_ptr<GenerationJob> weak = weak_from_this();
      cancel->add([weak] {
        if (auto job = weak.lock()) job->cancelAll();
      });  // the canceller dies with the request; the hook holds no strong reference
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      auto self = shared_from_this();
      std::shared_ptr<GenerateStream> h = client->generate(
          std::move(calls[i]), [self, i](GenerateChunkMsg m) { self->onChunk(i, std::move(m)); },
          [self, i](Status s) { self->onDone(i, std::move(s)); });
      bool cancel_now = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        choices_[i].handle = h;
        cancel_now = closed_ || choices_[i].done;
      }
      if (cancel_now && h) h->cancel();
    }
  }

 private:
  struct ChoiceState {
    std::shared_ptr<GenerateStream> handle;
    bool done = false;
    FinishReason last_finish = FinishReason::kNone;
    ChoiceEnd end;
  };

  void onChunk(size_t i, GenerateChunkMsg m) {
    std::shared_ptr<GenerateStream> to_cancel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ChoiceState& c = choices_[i];
      if (closed_ || c.done) return;
      if (m.prompt_tokens != 0) c.end.prompt_tokens = m.prompt_tokens;
      if (m.cached_prompt_tokens != 0) c.end.cached_prompt_tokens = m.cached_prompt_tokens;
      if (m.completion_tokens != 0) c.end.completion_tokens = m.completion_tokens;
      if (m.finish != FinishReason::kNone) c.last_finish = m.finish;
      if (!m.token_ids.empty() && !out_->onTokens(i, m.token_ids)) {
        // A stop string matched: this choice is complete; stop generating it.
        c.done = true;
        --remaining_;
        to_cancel = c.handle;
      }
      if (stream_) flushLocked();
      if (remaining_ == 0) completeLocked();
    }
    if (to_cancel) to_cancel->cancel();
  }

  void onDone(size_t i, Status s) {
    std::vector<std::shared_ptr<GenerateStream>> to_cancel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ChoiceState& c = choices_[i];
      if (closed_ || c.done) return;
      if (!s.isOk()) {
        if (s.code() == StatusCode::kUnimplemented) {
          s = internalError("the tulip client does not implement generation: " + s.message());
        }
        for (auto& other : choices_) {
          if (!other.done && other.handle) to_cancel.push_back(other.handle);
        }
        failLocked(s);
      } else {
        c.done = true;
        --remaining_;
        c.end.hit_length = c.last_finish == FinishReason::kLength;
        out_->finishChoice(i, c.end);
        if (stream_) flushLocked();
        if (remaining_ == 0) completeLocked();
      }
    }
    for (auto& h : to_cancel) h->cancel();
  }

  // The client went away: before the response (the request's canceller), or during a streamed one
  // (the ResponseStream's cancel).
  void cancelAll() {
    std::vector<std::shared_ptr<GenerateStream>> to_cancel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
      for (auto& c : choices_) {
        if (!c.done && c.handle) to_cancel.push_back(c.handle);
      }
      metrics_->requests.labels({endpoint_, "client_gone"}).inc();
      // Nothing was sent yet: answer anyway so the server lets go of the request at once (it
      // drops this response: the client is gone).
      if (!body_) respond_(errorResponse(cancelledError("the client closed the connection")));
    }
    log::info("client went away; generation cancelled",
              {{"request_id", request_id_}, {"streams", static_cast<uint64_t>(to_cancel.size())}});
    for (auto& h : to_cancel) h->cancel();
  }

  void startStreamLocked() {
    if (body_) return;
    body_ = std::make_shared<ResponseStream>();
    std::weak_ptr<GenerationJob> weak = weak_from_this();
    body_->setOnCancel([weak] {
      if (auto job = weak.lock()) job->cancelAll();
    });
    HttpResponse r;
    r.status = 200;
    r.content_type = "text/event-stream";
    r.headers.emplace_back("cache-control", "no-cache");
    r.headers.emplace_back("x-accel-buffering", "no");
    r.stream = body_;
    respond_(std::move(r));
  }

  void flushLocked() {
    startStreamLocked();
    std::string sse = out_->takeSse();
    if (!sse.empty()) body_->write(sse);
  }

  void completeLocked() {
    closed_ = true;
    uint64_t prompt = 0, completion = 0;
    for (const auto& c : choices_) {
      prompt += c.end.prompt_tokens;
      completion += c.end.completion_tokens;
    }
    metrics_->prompt_tokens.inc(static_cast<double>(prompt));
    metrics_->completion_tokens.inc(static_cast<double>(completion));
    metrics_->requests.labels({endpoint_, "ok"}).inc();
    if (stream_) {
      flushLocked();
      body_->end();
      return;
    }
    HttpResponse r;
    r.status = 200;
    r.body = out_->responseJson();
    respond_(std::move(r));
  }

  void failLocked(const Status& s) {
    closed_ = true;
    metrics_->requests.labels({endpoint_, "error"}).inc();
    log::warn("generation failed", {{"request_id", request_id_}, {"status", s}});
    if (stream_ && body_) {
      // Output already went out: report the error in-band and end the stream.
      std::string sse = out_->takeSse();
      sse += sseErrorEvents(s);
      body_->write(sse);
      body_->end();
      return;
    }
    respond_(errorResponse(s));
  }

  GenerateMetrics* metrics_;
  const std::string endpoint_;
  const std::string request_id_;
  std::mutex mu_;
  std::unique_ptr<GenerationOutput> out_;
  const bool stream_;
  Responder respond_;
  std::shared_ptr<ResponseStream> body_;
  std::vector<ChoiceState> choices_;
  size_t remaining_;
  bool closed_ = false;  // the response is complete (or the client left): ignore the rest
};

GenerateCall baseCall(const HttpRequest& http, const ModelSpec& spec,
                      const SamplingRequest& sampling, const ChatRoutesOptions& options) {
  GenerateCall call;
  call.request_id = http.request_id;
  call.model = spec.upstream_name;
  call.temperature = sampling.temperature;
  call.top_p = sampling.top_p;
  call.top_k = sampling.top_k;
  call.has_seed = sampling.has_seed;
  call.seed = sampling.seed;
  call.ignore_eos = sampling.ignore_eos;
  call.timeout = options.generate_timeout;
  return call;
}

}  // namespace

void registerChatRoutes(Router* router, TulipClient* client, const Tokenizer* tokenizer,
                        std::function<std::shared_ptr<const ModelSpec>()> spec_fn,
                        metrics::Registry* registry, ChatRoutesOptions options) {
  auto metrics = std::make_shared<GenerateMetrics>(registry);
  auto opts = std::make_shared<const ChatRoutesOptions>(std::move(options));

  router->add("POST", "/v1/chat/completions", [=](HttpRequest req, Responder respond) {
    std::shared_ptr<const ModelSpec> spec = spec_fn();
    if (spec == nullptr) {
      return respond(errorResponse(unavailable("the model is not loaded yet (waiting for tulip)")));
    }
    Result<ChatRequest> parsed = parseChatRequest(req.body, *spec, tokenizer);
    if (!parsed.isOk()) {
      metrics->requests.labels({"chat", "invalid"}).inc();
      return respond(errorResponse(parsed.status()));
    }
    ResponseIdentity identity{randomId("chatcmpl-"), unixNow(), spec->served_name,
                              opts->make_tool_call_id};
    auto out = std::make_unique<ChatCompletionOutput>(*tokenizer, *parsed, std::move(identity));
    GenerateCall call = baseCall(req, *spec, parsed->sampling, *opts);
    call.prompt_ids = std::move(parsed->prompt_ids);
    call.max_tokens = parsed->max_tokens;
    call.stop_token_ids = parsed->stop_token_ids;
    auto job =
        std::make_shared<GenerationJob>(std::move(out), parsed->sampling.stream, std::move(respond),
                                        metrics.get(), "chat", req.request_id);
    std::vector<GenerateCall> calls;
    calls.push_back(std::move(call));
    job->start(client, std::move(calls), req.cancel);
  });

  router->add("POST", "/v1/completions", [=](HttpRequest req, Responder respond) {
    std::shared_ptr<const ModelSpec> spec = spec_fn();
    if (spec == nullptr) {
      return respond(errorResponse(unavailable("the model is not loaded yet (waiting for tulip)")));
    }
    Result<CompletionsRequest> parsed = parseCompletionsRequest(req.body, *spec, tokenizer);
    if (!parsed.isOk()) {
      metrics->requests.labels({"completions", "invalid"}).inc();
      return respond(errorResponse(parsed.status()));
    }
    ResponseIdentity identity{randomId("cmpl-"), unixNow(), spec->served_name, nullptr};
    auto out = std::make_unique<CompletionsOutput>(*tokenizer, *parsed, std::move(identity));
    std::vector<GenerateCall> calls;
    for (size_t i = 0; i < parsed->prompts.size(); ++i) {
      GenerateCall call = baseCall(req, *spec, parsed->sampling, *opts);
      if (parsed->prompts.size() > 1) call.request_id += "." + std::to_string(i);
      call.prompt_ids = std::move(parsed->prompts[i]);
      call.max_tokens = parsed->max_tokens[i];
      call.stop_token_ids = parsed->stop_token_ids;
      calls.push_back(std::move(call));
    }
    auto job =
        std::make_shared<GenerationJob>(std::move(out), parsed->sampling.stream, std::move(respond),
                                        metrics.get(), "completions", req.request_id);
    job->start(client, std::move(calls), req.cancel);
  });
}

}  // namespace garden::ivy
