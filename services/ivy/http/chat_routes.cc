#include "services/ivy/http/chat_routes.h"

#include <algorithm>
#include <mutex>

#include "common/logging.h"
#include "services/ivy/api/chat.h"
#include "services/ivy/api/choices.h"
#include "services/ivy/api/completions.h"
#include "services/ivy/api/errors.h"
#include "services/ivy/harmony/tokens.h"
#include "services/ivy/http/response_stream.h"

namespace garden::ivy {

struct GenerateRoutes::Metrics {
  explicit Metrics(metrics::Registry* r)
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

namespace {

using Metrics = GenerateRoutes::Metrics;

int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One request's generations (one per choice) and its response. Callbacks of the TulipClient
// (one thread per stream at a time, streams concurrent) and the server's cancel hook meet here;
// `mu_` guards everything below it. GenerateStream::cancel() is only called without `mu_` held
// (a client may complete the call inline). Every way the request ends goes through the
// AdmittedRequest exactly once: answer() (a whole response or an error before any output), or
// answerStream() and later finishStream().
class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  GenerationJob(std::unique_ptr<GenerationOutput> out, bool stream,
                std::shared_ptr<Metrics> metrics, std::string endpoint)
      : metrics_(std::move(metrics)),
        endpoint_(std::move(endpoint)),
        out_(std::move(out)),
        stream_(stream),
        choices_(out_->choices()),
        remaining_(choices_.size()) {}

  // Starts one stream per call, each with the request's deadline; call k carries calls[k].n
  // choices, the output's choices from the sum of the earlier calls' n on [TAG_LLM_CHOICES]. The
  // request's canceller (may be null) fires when the client goes away before the response: every
  // stream of the request is cancelled [TAG_CLIENT_DISCONNECT].
  void start(std::shared_ptr<AdmittedRequest> req, TulipClient* client,
             std::vector<GenerateCall> calls) {
    req_ = std::move(req);  // before any callback can run
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t first = 0;
      for (const GenerateCall& c : calls) {
        const size_t count = std::max<uint32_t>(c.n, 1);
        streams_.push_back(StreamState{nullptr, first, count});
        first += count;
      }
      CHECK(first == choices_.size());
    }
    if (const auto& cancel = req_->cancel()) {
      std::weak_ptr<GenerationJob> weak = weak_from_this();
      cancel->add([weak] {
        if (auto job = weak.lock()) job->cancelAll();
      });  // the canceller dies with the request; the hook holds no strong reference
    }
    for (size_t k = 0; k < calls.size(); ++k) {
      auto self = shared_from_this();
      calls[k].timeout = req_->timeout();
      std::shared_ptr<GenerateStream> h = client->generate(
          std::move(calls[k]), [self, k](GenerateChunkMsg m) { self->onChunk(k, std::move(m)); },
          [self, k](Status s) { self->onDone(k, std::move(s)); });
      bool cancel_now = false;
      std::vector<uint32_t> stops;
      {
        std::lock_guard<std::mutex> lock(mu_);
        StreamState& st = streams_[k];
        st.handle = h;
        cancel_now = closed_ || streamDoneLocked(st);
        stops.swap(st.pending_stops);
      }
      if (cancel_now && h) {
        h->cancel();
      } else if (h) {
        for (uint32_t i : stops) h->stopChoice(i);
      }
    }
  }

 private:
  struct ChoiceState {
    bool done = false;
    ChoiceEnd end;
    uint64_t queue_us = 0;  // tulip's timings, on the last chunk
    uint64_t total_us = 0;
  };
  // One Generate call: choices [first, first + count).
  struct StreamState {
    std::shared_ptr<GenerateStream> handle;
    size_t first = 0;
    size_t count = 1;
    // Choices a stop string ended before `handle` was set [TAG_STOP_CHOICE].
    std::vector<uint32_t> pending_stops;
  };

  bool streamDoneLocked(const StreamState& st) const {
    for (size_t j = 0; j < st.count; ++j)
      if (!choices_[st.first + j].done) return false;
    return true;
  }

  // Choice `i` ended normally (its last chunk, or its stream's end).
  void finishChoiceLocked(size_t i) {
    ChoiceState& c = choices_[i];
    c.done = true;
    --remaining_;
    out_->finishChoice(i, c.end);
  }

  void onChunk(size_t k, GenerateChunkMsg m) {
    std::shared_ptr<GenerateStream> to_cancel;
    std::shared_ptr<GenerateStream> to_stop;  // stop choice m.index of this stream
    std::vector<std::shared_ptr<GenerateStream>> to_cancel_all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      StreamState& st = streams_[k];
      if (m.index >= st.count) {
        for (auto& other : streams_)
          if (other.handle) to_cancel_all.push_back(other.handle);
        failLocked(internalError("tulip sent a chunk for choice " + std::to_string(m.index) +
                                 " of a call with " + std::to_string(st.count)));
      } else {
        const size_t i = st.first + m.index;
        ChoiceState& c = choices_[i];
        if (c.done) return;
        if (m.prompt_tokens != 0) c.end.prompt_tokens = m.prompt_tokens;
        if (m.cached_prompt_tokens != 0) c.end.cached_prompt_tokens = m.cached_prompt_tokens;
        if (m.completion_tokens != 0) c.end.completion_tokens = m.completion_tokens;
        if (m.queue_us != 0) c.queue_us = m.queue_us;
        if (m.total_us != 0) c.total_us = m.total_us;
        if (!m.token_ids.empty() && !out_->onTokens(i, m.token_ids, m.logprobs)) {
          // A stop string matched: this choice is complete; stop generating it. A call with
          // several choices goes on for the others: tulip stops only this one (StopChoice
          // [TAG_STOP_CHOICE]), and its later chunks (tokens, its FINISH_STOP last chunk and
          // tulip's counts) are dropped here (c.done), so its finish and usage are ivy's.
          c.done = true;
          --remaining_;
          if (st.count == 1 || streamDoneLocked(st)) {
            to_cancel = st.handle;
          } else if (st.handle) {
            to_stop = st.handle;
          } else {
            st.pending_stops.push_back(m.index);  // start() passes it on with the handle
          }
        } else if (m.finish == FinishReason::kStop || m.finish == FinishReason::kLength) {
          c.end.hit_length = m.finish == FinishReason::kLength;
          finishChoiceLocked(i);
        }
        if (stream_) flushLocked();
        if (remaining_ == 0) completeLocked();
      }
    }
    if (to_cancel) to_cancel->cancel();
    if (to_stop) to_stop->stopChoice(m.index);
    for (auto& h : to_cancel_all) h->cancel();
  }

  void onDone(size_t k, Status s) {
    std::vector<std::shared_ptr<GenerateStream>> to_cancel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      StreamState& st = streams_[k];
      if (closed_ || streamDoneLocked(st)) return;
      if (!s.isOk()) {
        if (s.code() == StatusCode::kUnimplemented) {
          // ivy maps UNIMPLEMENTED to 405 (its own route condition); a client without generate
          // is a server fault.
          s = internalError("the tulip client does not implement generation: " + s.message());
        }
        for (auto& other : streams_) {
          if (other.handle && !streamDoneLocked(other)) to_cancel.push_back(other.handle);
        }
        failLocked(s);
      } else {
        // A stream that ended without a last chunk for some choice: those end here.
        for (size_t j = 0; j < st.count; ++j)
          if (!choices_[st.first + j].done) finishChoiceLocked(st.first + j);
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
      for (auto& st : streams_) {
        if (st.handle && !streamDoneLocked(st)) to_cancel.push_back(st.handle);
      }
      metrics_->requests.labels({endpoint_, "client_gone"}).inc();
      if (body_) {
        req_->finishStream();
      } else {
        // Nothing was sent yet: answer anyway so the server lets go of the request at once (it
        // drops this response: the client is gone).
        req_->answer(cancelledError("the client closed the connection"));
      }
    }
    log::info("client went away; generation cancelled",
              {{"request_id", req_->requestId()},
               {"streams", static_cast<uint64_t>(to_cancel.size())}});
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
    req_->answerStream(std::move(r));
  }

  void flushLocked() {
    startStreamLocked();
    std::string sse = out_->takeSse();
    if (!sse.empty()) body_->write(sse);
  }

  // tulip's stage times over the choices: the longest wait and the longest generation.
  UpstreamTimes upstreamTimesLocked() const {
    UpstreamTimes t;
    for (const auto& c : choices_) {
      t.queue_us = std::max(t.queue_us, c.queue_us);
      t.inference_us = std::max(t.inference_us, c.total_us > c.queue_us ? c.total_us - c.queue_us
                                                                         : uint64_t{0});
    }
    return t;
  }

  void completeLocked() {
    closed_ = true;
    uint64_t prompt = 0, completion = 0;
    for (const auto& st : streams_) {
      prompt += choices_[st.first].end.prompt_tokens;  // once per prompt
      for (size_t j = 0; j < st.count; ++j) completion += choices_[st.first + j].end.completion_tokens;
    }
    metrics_->prompt_tokens.inc(static_cast<double>(prompt));
    metrics_->completion_tokens.inc(static_cast<double>(completion));
    metrics_->requests.labels({endpoint_, "ok"}).inc();
    if (stream_) {
      flushLocked();
      req_->finishStream();  // admission released before the client can see the end
      body_->end();
      return;
    }
    HttpResponse r;
    r.status = 200;
    r.body = out_->responseJson();
    req_->answer(std::move(r), upstreamTimesLocked());
  }

  void failLocked(const Status& s) {
    closed_ = true;
    metrics_->requests.labels({endpoint_, "error"}).inc();
    log::warn("generation failed", {{"request_id", req_->requestId()}, {"status", s}});
    if (stream_ && body_) {
      // Output already went out: report the error in-band and end the stream.
      std::string sse = out_->takeSse();
      sse += out_->sseError(s);
      body_->write(sse);
      req_->finishStream();
      body_->end();
      return;
    }
    req_->answer(s, upstreamTimesLocked());
  }

  const std::shared_ptr<Metrics> metrics_;
  const std::string endpoint_;
  std::shared_ptr<AdmittedRequest> req_;  // set by start()
  std::mutex mu_;
  std::unique_ptr<GenerationOutput> out_;
  const bool stream_;
  std::shared_ptr<ResponseStream> body_;
  std::vector<ChoiceState> choices_;
  std::vector<StreamState> streams_;
  size_t remaining_;
  bool closed_ = false;  // the response is complete (or the client left): ignore the rest
};

GenerateCall baseCall(const HttpRequest& http, const ModelSpec& spec,
                      const SamplingRequest& sampling) {
  GenerateCall call;
  call.request_id = http.request_id;
  call.model = spec.upstream_name;
  call.temperature = sampling.temperature;
  call.top_p = sampling.top_p;
  call.top_k = sampling.top_k;
  call.has_seed = sampling.has_seed;
  call.seed = sampling.seed;
  call.ignore_eos = sampling.ignore_eos;
  call.min_p = sampling.min_p;
  call.presence_penalty = sampling.presence_penalty;
  call.frequency_penalty = sampling.frequency_penalty;
  call.repetition_penalty = sampling.repetition_penalty;
  call.logit_bias = sampling.logit_bias;
  call.logprobs = sampling.logprobs;
  call.top_logprobs = sampling.top_logprobs;
  call.n = sampling.sequences();
  // best_of ranks candidates by their generated tokens' logprobs [TAG_LLM_CHOICES].
  if (sampling.best_of > sampling.n) call.logprobs = true;
  return call;  // the deadline is set when the pipeline sends it (GenerationJob::start)
}

// What a call holds against --max-inflight-tokens: its prompt (prefilled once) and max_tokens for
// each of its choices.
uint64_t admissionTokens(const GenerateCall& c) {
  return c.prompt_ids.size() + uint64_t{std::max<uint32_t>(c.n, 1)} * c.max_tokens;
}

// The pipeline's PreparedCall of a generation: its tokens and a send that starts the job.
PreparedCall preparedGeneration(std::shared_ptr<GenerationJob> job, std::vector<GenerateCall> calls,
                                TulipClient* client) {
  PreparedCall p;
  for (const GenerateCall& c : calls) p.tokens += admissionTokens(c);
  auto shared_calls = std::make_shared<std::vector<GenerateCall>>(std::move(calls));
  p.send = [job = std::move(job), shared_calls, client](std::shared_ptr<AdmittedRequest> req) {
    job->start(std::move(req), client, std::move(*shared_calls));
  };
  return p;
}

// The chat constraint: response_format on the final channel [TAG_TOKEN_MASK] and the strict
// tools' call arguments [TAG_STRICT_TOOLS] (common/grammar/constrained.h).
void setChatConstraint(const ChatRequest& chat, GenerateCall::Constraint* c) {
  if (chat.sampling.structured) {  // only the final channel is JSON
    c->grammar = chat.sampling.structured->grammar;
    // skip_reasoning: the prompt already opened the final message.
    c->channel_token = chat.final_prefix_forced ? -1 : harmony::kChannel;
    c->channel_prefix = chat.final_channel_ids;
    c->message_token = harmony::kMessage;
    c->end_tokens = {harmony::kReturn};
  }
  if (chat.strict_tools.empty()) return;
  for (const ChatRequest::StrictTool& t : chat.strict_tools) c->tools.push_back({t.name, t.grammar});
  c->harmony = {harmony::kStart, harmony::kChannel, harmony::kConstrain, harmony::kMessage,
                harmony::kEnd,   harmony::kCall,    harmony::kReturn,    harmony::kEndOfText};
  // The decoder replays the forced tool_choice (or skip_reasoning) prefix itself.
  c->turn_prefix = chat.forced_prefix_ids;
}

}  // namespace

GenerateRoutes::GenerateRoutes(TulipClient* client, const Tokenizer* tokenizer,
                               metrics::Registry* registry,
                               std::function<std::string(size_t index)> make_tool_call_id,
                               size_t responses_store_max)
    : client_(client),
      tokenizer_(tokenizer),
      make_tool_call_id_(std::move(make_tool_call_id)),
      metrics_(std::make_shared<Metrics>(registry)),
      responses_store_(std::make_shared<ResponsesStore>(responses_store_max)) {}

GenerateRoutes::~GenerateRoutes() = default;

Result<PreparedCall> GenerateRoutes::prepareChat(const HttpRequest& req,
                                                 const std::shared_ptr<const ModelSpec>& spec,
                                                 const RequestLimits& limits) const {
  Result<ChatRequest> parsed = parseChatRequest(req.body, *spec, tokenizer_, limits);
  if (!parsed.isOk()) {
    metrics_->requests.labels({"chat", "invalid"}).inc();
    return parsed.status();
  }
  ResponseIdentity identity{randomId("chatcmpl-"), unixNow(), spec->served_name,
                            make_tool_call_id_};
  GenerateCall call = baseCall(req, *spec, parsed->sampling);
  call.max_tokens = parsed->max_tokens;
  call.prompt_ids = parsed->prompt_ids;
  if (Status st = checkChoiceTokens(parsed->sampling, admissionTokens(call),
                                    limits.max_inflight_tokens);
      !st.isOk()) {
    metrics_->requests.labels({"chat", "invalid"}).inc();
    return st;
  }
  std::unique_ptr<GenerationOutput> out;
  if (call.n > 1) {
    out = std::make_unique<ChatChoicesOutput>(*tokenizer_, *parsed, std::move(identity), call.n);
  } else {
    out = std::make_unique<ChatCompletionOutput>(*tokenizer_, *parsed, std::move(identity));
  }
  call.stop_token_ids = parsed->stop_token_ids;
  setChatConstraint(*parsed, &call.constraint);
  auto job = std::make_shared<GenerationJob>(std::move(out), parsed->sampling.stream, metrics_,
                                             "chat");
  std::vector<GenerateCall> calls;
  calls.push_back(std::move(call));
  return preparedGeneration(std::move(job), std::move(calls), client_);
}

Result<PreparedCall> GenerateRoutes::prepareResponses(const HttpRequest& req,
                                                      const std::shared_ptr<const ModelSpec>& spec,
                                                      const RequestLimits& limits) const {
  Result<ResponsesRequest> parsed =
      parseResponsesRequest(req.body, *spec, tokenizer_, responses_store_.get(), limits);
  if (!parsed.isOk()) {
    metrics_->requests.labels({"responses", "invalid"}).inc();
    return parsed.status();
  }
  ResponseIdentity identity{randomId("resp_"), unixNow(), spec->served_name, make_tool_call_id_};
  auto out = std::make_unique<ResponsesOutput>(*tokenizer_, *parsed, std::move(identity),
                                               responses_store_);
  GenerateCall call = baseCall(req, *spec, parsed->chat.sampling);
  call.prompt_ids = std::move(parsed->chat.prompt_ids);
  call.max_tokens = parsed->chat.max_tokens;
  call.stop_token_ids = parsed->chat.stop_token_ids;
  setChatConstraint(parsed->chat, &call.constraint);
  auto job = std::make_shared<GenerationJob>(std::move(out), parsed->chat.sampling.stream,
                                             metrics_, "responses");
  std::vector<GenerateCall> calls;
  calls.push_back(std::move(call));
  return preparedGeneration(std::move(job), std::move(calls), client_);
}

Result<PreparedCall> GenerateRoutes::prepareCompletions(
    const HttpRequest& req, const std::shared_ptr<const ModelSpec>& spec,
    const RequestLimits& limits) const {
  Result<CompletionsRequest> parsed = parseCompletionsRequest(req.body, *spec, tokenizer_, limits);
  if (!parsed.isOk()) {
    metrics_->requests.labels({"completions", "invalid"}).inc();
    return parsed.status();
  }
  ResponseIdentity identity{randomId("cmpl-"), unixNow(), spec->served_name, nullptr};
  auto out = std::make_unique<CompletionsOutput>(*tokenizer_, *parsed, std::move(identity));
  std::vector<GenerateCall> calls;
  uint64_t tokens = 0;
  for (size_t i = 0; i < parsed->prompts.size(); ++i) {
    GenerateCall call = baseCall(req, *spec, parsed->sampling);
    if (parsed->prompts.size() > 1) call.request_id += "." + std::to_string(i);
    call.prompt_ids = std::move(parsed->prompts[i]);
    call.max_tokens = parsed->max_tokens[i];
    call.stop_token_ids = parsed->stop_token_ids;
    if (parsed->sampling.structured) {  // [TAG_TOKEN_MASK] the whole completion is the value
      call.constraint.grammar = parsed->sampling.structured->grammar;
      call.constraint.end_tokens = spec->eos_token_ids;
    }
    tokens += admissionTokens(call);
    calls.push_back(std::move(call));
  }
  if (Status st = checkChoiceTokens(parsed->sampling, tokens, limits.max_inflight_tokens);
      !st.isOk()) {
    metrics_->requests.labels({"completions", "invalid"}).inc();
    return st;
  }
  auto job = std::make_shared<GenerationJob>(std::move(out), parsed->sampling.stream, metrics_,
                                             "completions");
  return preparedGeneration(std::move(job), std::move(calls), client_);
}

}  // namespace garden::ivy
