#include "services/tulip/server/tulip_service.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>

#include "common/logging.h"
#include "common/metrics/registry.h"
#include "common/mutex.h"
#include "common/tsan_handoff.h"
#include "services/tulip/server/status_map.h"

namespace garden::tulip {
namespace {

namespace v1 = garden::v1;

struct Metrics {
  metrics::CounterFamily& requests;
  metrics::HistogramFamily& latency;
  metrics::HistogramFamily& queue;
  metrics::CounterFamily& tokens;
  metrics::HistogramFamily& queue_batches;
  static Metrics& get() {
    auto& r = metrics::Registry::global();
    static Metrics m{
        r.counter("tulip_requests_total", "gRPC requests by method and status code",
                  {"method", "code"}),
        r.histogram("tulip_request_duration_seconds", "Request handling time in tulip",
                    {"method"}),
        r.histogram("tulip_queue_wait_seconds", "Time a request waited before batching",
                    {"method"}),
        r.counter("tulip_prompt_tokens_total", "Tokens accepted for embedding or scoring",
                  {"method"}),
        // The fairness signal [TAG_EMBED_FAIR]: batches formed ahead of a request while it waited.
        r.histogram("tulip_queue_wait_batches",
                    "Batches formed ahead of an embed/score request while it waited", {"method"},
                    {0, 1, 2, 4, 8, 16, 64, 256}),
    };
    return m;
  }
};

std::string requestId(const grpc::CallbackServerContext* ctx) {
  auto it = ctx->client_metadata().find("x-request-id");
  if (it != ctx->client_metadata().end()) return std::string(it->second.data(), it->second.size());
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[24];
  std::snprintf(buf, sizeof(buf), "tulip-%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

// The remaining time of the call's gRPC deadline as a CLOCK_MONOTONIC deadline (0 = none).
int64_t monotonicDeadline(const grpc::CallbackServerContext* ctx) {
  auto dl = ctx->deadline();
  if (dl == std::chrono::system_clock::time_point::max()) return 0;
  auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  dl - std::chrono::system_clock::now())
                  .count();
  if (left > int64_t{365} * 24 * 3600 * 1000000000LL) return 0;
  return shm::monotonicNowNs() + std::max<int64_t>(left, 0);
}

shm::PoolingMode toPooling(v1::Pooling p) {
  switch (p) {
    case v1::POOLING_LAST: return shm::PoolingMode::kLast;
    case v1::POOLING_MEAN: return shm::PoolingMode::kMean;
    case v1::POOLING_CLS: return shm::PoolingMode::kCls;
    default: return shm::PoolingMode::kDefault;
  }
}

template <typename Seqs>
std::vector<std::vector<int32_t>> copyInputs(const Seqs& seqs, uint64_t* tokens) {
  std::vector<std::vector<int32_t>> out;
  out.reserve(seqs.size());
  *tokens = 0;
  for (const auto& s : seqs) {
    out.emplace_back(s.ids().begin(), s.ids().end());
    *tokens += s.ids_size();
  }
  return out;
}

// A unary call whose answer comes from the scheduler. Cancellation by the caller cancels the job.
// The reactor is deleted by the last of gRPC (OnDone) and done() (once Finish has returned): gRPC
// may run OnDone on another thread while Finish is still running on the scheduler's, and
// ServerUnaryReactor::Finish reads the reactor after handing the call over. The shared count
// makes that order explicit, also for ThreadSanitizer, which cannot see gRPC's own hand-off.
class JobReactor final : public grpc::ServerUnaryReactor {
 public:
  JobReactor(EmbedScheduler& sched, const char* method)
      : sched_(sched), method_(method), t0_(std::chrono::steady_clock::now()) {}

  void start(std::shared_ptr<EmbedJob> job, uint64_t tokens,
             std::function<void(const EmbedJob&, uint64_t total_us)> fill) {
    job_ = job;
    tokens_ = tokens;
    job->on_done = [this, fill = std::move(fill)](const Status& st) {
      if (st.isOk()) fill(*job_, totalUs());
      done(st);
    };
    Status st = sched_.submit(job);
    if (!st.isOk()) {
      job->on_done = nullptr;
      done(st);
    }
    // gRPC may run OnCancel on another thread once the handler returns [TAG_TSAN_HANDOFF].
    tsanRelease(this);
  }

  void done(const Status& st) {
    const uint64_t total_us = totalUs();
    // Answer first: the request line and the metrics must not delay the reply. Once Finish is
    // called gRPC may run OnDone on another thread, and after our unref() the reactor may be
    // gone, so only locals are used after.
    const std::shared_ptr<EmbedJob> job = job_;
    const char* method = method_;
    const uint64_t tokens = tokens_;
    const int64_t reply_ns = shm::monotonicNowNs();
    tsanRelease(this);  // OnDone runs on a gRPC thread after Finish [TAG_TSAN_HANDOFF]
    Finish(toGrpcStatus(st));
    unref();  // `this` may be gone from here on
    const int64_t finish_ns = shm::monotonicNowNs();
    auto& m = Metrics::get();
    m.requests.labels({method, std::string(statusCodeName(st.code()))}).inc();
    m.latency.labels({method}).observe(total_us / 1e6);
    if (st.isOk()) {
      m.tokens.labels({method}).inc(static_cast<double>(tokens));
      m.queue.labels({method}).observe(job->queue_us / 1e6);
      m.queue_batches.labels({method}).observe(job->queue_batches);
    }
    log::info("request", {{"request_id", job->request_id},
                          {"method", method},
                          {"sequences", job->inputs.size()},
                          {"tokens", tokens},
                          {"status", st},
                          {"queue_us", job->queue_us},
                          {"queue_batches", job->queue_batches},
                          {"inference_us", job->inference_us},
                          {"total_us", total_us}});
    if (log::enabled(log::Level::kDebug) && st.isOk()) logTrace(*job, reply_ns, finish_ns);
  }

  void OnCancel() override {
    tsanAcquire(this);
    if (job_) sched_.cancel(job_);
  }
  void OnDone() override {
    tsanAcquire(this);
    unref();
  }

 private:
  void unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // One line per request with where its time went, hop by hop (microseconds; the last batch's
  // stamps for a multi-batch request). Between the hops: arrived -> dispatched (gRPC handler,
  // validation, scheduler), -> rose took it (shm doorbell, rose's step thread), -> launched (rose
  // host work), -> ready (forward pass; on the cpu backend also the completion thread's wake-up),
  // -> published (rose completion thread), -> seen (shm doorbell, tulip's worker thread),
  // -> done (results copied), -> reply (response filled), -> finish (gRPC's Finish returned).
  static void logTrace(const EmbedJob& j, int64_t reply_ns, int64_t finish_ns) {
    const EmbedTrace& t = j.trace;
    auto us = [](int64_t a, int64_t b) { return a > 0 && b > 0 ? (b - a) / 1000.0 : -1.0; };
    log::debug("request trace", {{"request_id", j.request_id},
                                 {"ingress_us", us(t.arrived_ns, t.dispatched_ns)},
                                 {"to_rose_us", us(t.dispatched_ns, t.rose_taken_ns)},
                                 {"rose_launch_us", us(t.rose_taken_ns, t.rose_launched_ns)},
                                 {"rose_forward_us", us(t.rose_launched_ns, t.rose_ready_ns)},
                                 {"rose_publish_us", us(t.rose_ready_ns, t.rose_published_ns)},
                                 {"to_tulip_us", us(t.rose_published_ns, t.seen_ns)},
                                 {"results_us", us(t.seen_ns, t.done_ns)},
                                 {"fill_us", us(t.done_ns, reply_ns)},
                                 {"finish_call_us", us(reply_ns, finish_ns)},
                                 {"tulip_total_us", us(t.arrived_ns, finish_ns)},
                                 {"step_us", j.step_us}});
  }

  uint64_t totalUs() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                                  t0_)
        .count();
  }

  EmbedScheduler& sched_;
  const char* method_;
  std::chrono::steady_clock::time_point t0_;
  std::shared_ptr<EmbedJob> job_;
  uint64_t tokens_ = 0;
  std::atomic<int> refs_{2};  // gRPC (OnDone) and done() (after Finish returned)
};

grpc::ServerUnaryReactor* finishNow(grpc::CallbackServerContext* ctx, const grpc::Status& st) {
  auto* r = ctx->DefaultReactor();
  r->Finish(st);
  return r;
}

void fillTimings(const EmbedJob& job, uint64_t total_us, v1::Timings* t) {
  t->set_queue_us(job.queue_us);
  t->set_inference_us(job.inference_us);
  t->set_total_us(total_us);
}


// One Generate stream. Events come from the LLM scheduler's thread; writes complete on gRPC's.
// At most one write is in flight: tokens arriving meanwhile wait in their choice's `pending`
// (bounded by the request's max_tokens) and go out together in that choice's next chunk. With
// n > 1 choices [TAG_LLM_CHOICES] chunks carry one choice each (GenerateChunk.index), taken in
// turn; each choice's last chunk carries its finish_reason and counts, and the stream finishes
// with the last of them. A choice that ends in error (or cancelled) cancels the others and the
// stream fails once all have ended. The reactor is deleted once both gRPC (OnDone) and the
// scheduler (the last event of every choice) are done with it.
class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateChunk> {
 public:
  GenerateReactor(LlmFrontend& sched, std::string request_id, uint32_t n)
      : sched_(sched),
        request_id_(std::move(request_id)),
        t0_(std::chrono::steady_clock::now()),
        n_(n),
        refs_(1 + static_cast<int>(n)),
        choices_(n) {}

  void start(std::shared_ptr<LlmRequest> req) EXCLUDES(mu_) {
    req_ = req;
    req->on_event = [this](const GenerateEvent& ev) { onEvent(ev); };
    Status st = sched_.submit(req);
    if (!st.isOk()) {
      req->on_event = nullptr;
      {
        MutexLock l(mu_);
        GenerateEvent ev;
        ev.last = true;
        ev.status = st;
        failed_ = ev;
        finals_ = n_;
        pumpLocked();
      }
      refs_.fetch_sub(static_cast<int>(n_) - 1);
      unref();  // the scheduler will never call
    }
    // gRPC runs OnCancel/OnWriteDone/OnDone on its threads once the handler returns
    // [TAG_TSAN_HANDOFF].
    tsanRelease(this);
  }

  void OnWriteDone(bool ok) override EXCLUDES(mu_) {
    tsanAcquire(this);
    MutexLock l(mu_);
    writing_ = false;
    if (!ok && !broken_) {
      // The caller is gone (the call was cancelled): stop generating for it.
      broken_ = true;
      sched_.cancel(req_);
    }
    pumpLocked();
  }

  void OnCancel() override {
    tsanAcquire(this);
    if (req_) sched_.cancel(req_);
  }

  void OnDone() override EXCLUDES(mu_) {
    tsanAcquire(this);
    GenerateEvent fin;
    uint64_t completion = 0;
    {
      MutexLock l(mu_);
      if (failed_) {
        fin = *failed_;
      } else if (!choices_.empty() && choices_[0].final) {
        fin = *choices_[0].final;
      }
      for (const Choice& c : choices_)
        if (c.final) completion += c.final->completion_tokens;
    }
    const uint64_t total_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                  std::chrono::steady_clock::now() - t0_)
                                  .count();
    Status st = fin.status;
    if (st.isOk() && fin.finish == FinishReason::kCancelled)
      st = cancelledError("request cancelled by the caller");
    auto& m = Metrics::get();
    m.requests.labels({"Generate", std::string(statusCodeName(st.code()))}).inc();
    m.latency.labels({"Generate"}).observe(total_us / 1e6);
    if (fin.prompt_tokens > 0) {
      m.tokens.labels({"Generate"}).inc(static_cast<double>(fin.prompt_tokens));
      m.queue.labels({"Generate"}).observe(fin.queue_us / 1e6);
    }
    log::info("request", {{"request_id", request_id_},
                          {"method", "Generate"},
                          {"n", static_cast<uint64_t>(n_)},
                          {"prompt_tokens", fin.prompt_tokens},
                          {"cached_prompt_tokens", fin.cached_prompt_tokens},
                          {"completion_tokens", completion},
                          {"finish", static_cast<int64_t>(fin.finish)},
                          {"status", st},
                          {"queue_us", fin.queue_us},
                          {"total_us", total_us}});
    unref();
  }

 private:
  struct Choice {
    std::vector<int32_t> pending;
    std::vector<llm::LlmTokenLogprobs> pending_lp;  // one per pending token when asked
    std::optional<GenerateEvent> final;
    bool final_sent = false;
  };

  void onEvent(const GenerateEvent& ev) EXCLUDES(mu_) {
    bool cancel_rest = false;
    {
      MutexLock l(mu_);
      CHECK(ev.index < choices_.size());
      Choice& c = choices_[ev.index];
      if (ev.token >= 0) {
        c.pending.push_back(ev.token);
        if (ev.has_logprobs) c.pending_lp.push_back(ev.logprobs);
      }
      if (ev.last) {
        c.final = ev;
        ++finals_;
        if ((!ev.status.isOk() || ev.finish == FinishReason::kCancelled) && !failed_) {
          failed_ = ev;  // the stream fails: stop the other choices too
          cancel_rest = finals_ < choices_.size();
        }
      }
      pumpLocked();
    }
    if (cancel_rest) sched_.cancel(req_);
    if (ev.last) unref();  // nothing more comes from the scheduler for this choice
  }

  // Starts the next write or the finish when nothing is in flight.
  void pumpLocked() REQUIRES(mu_) {
    if (writing_ || finished_) return;
    if (broken_ || failed_) {
      // Wait for every choice's last event (the scheduler has freed them all by then).
      if (finals_ < choices_.size()) return;
      finished_ = true;
      Status st = failed_ ? failed_->status : okStatus();
      if (st.isOk()) st = cancelledError("request cancelled by the caller");
      tsanRelease(this);  // [TAG_TSAN_HANDOFF]: OnDone follows on a gRPC thread
      Finish(toGrpcStatus(st));
      return;
    }
    // The next choice in turn with something to send.
    const size_t n = choices_.size();
    size_t pick = n;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (next_ + k) % n;
      const Choice& c = choices_[i];
      if (!c.pending.empty() || (c.final && !c.final_sent)) {
        pick = i;
        break;
      }
    }
    if (pick == n) return;
    next_ = (pick + 1) % n;
    Choice& c = choices_[pick];
    chunk_.Clear();
    if (pick != 0) chunk_.set_index(static_cast<uint32_t>(pick));
    if (!first_sent_) {
      // [TAG_STOP_CHOICE] req_->call_id was set by submit() before any event.
      first_sent_ = true;
      if (req_->call_id != 0) chunk_.set_call_id(req_->call_id);
    }
    chunk_.mutable_token_ids()->Add(c.pending.begin(), c.pending.end());
    c.pending.clear();
    for (const llm::LlmTokenLogprobs& lp : c.pending_lp) {
      v1::TokenLogprobs* t = chunk_.add_logprobs();
      t->set_logprob(lp.logprob);
      for (int32_t j = 0; j < lp.num_top; ++j) {
        t->add_top_ids(lp.top_ids[j]);
        t->add_top_logprobs(lp.top_logprobs[j]);
      }
    }
    c.pending_lp.clear();
    writing_ = true;
    if (c.final) {
      const GenerateEvent& f = *c.final;
      c.final_sent = true;
      ++finals_sent_;
      chunk_.set_finish_reason(static_cast<v1::FinishReason>(f.finish));
      chunk_.set_prompt_tokens(f.prompt_tokens);
      chunk_.set_cached_prompt_tokens(f.cached_prompt_tokens);
      chunk_.set_completion_tokens(f.completion_tokens);
      auto* t = chunk_.mutable_timings();
      t->set_queue_us(f.queue_us);
      t->set_inference_us(f.inference_us);
      t->set_total_us(f.total_us);
    }
    if (finals_sent_ == n) {
      finished_ = true;
      tsanRelease(this);  // [TAG_TSAN_HANDOFF]: OnWriteDone/OnDone follow on gRPC threads
      StartWriteAndFinish(&chunk_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      tsanRelease(this);
      StartWrite(&chunk_);
    }
  }

  void unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  LlmFrontend& sched_;
  const std::string request_id_;
  const std::chrono::steady_clock::time_point t0_;
  const uint32_t n_;  // choices (GenerateRequest.n)
  std::shared_ptr<LlmRequest> req_;
  std::atomic<int> refs_;  // gRPC (OnDone) and the scheduler (each choice's last event)
  Mutex mu_;
  std::vector<Choice> choices_ GUARDED_BY(mu_);  // one per choice (GenerateRequest.n)
  uint32_t finals_ GUARDED_BY(mu_) = 0;        // choices whose last event came
  uint32_t finals_sent_ GUARDED_BY(mu_) = 0;   // choices whose last chunk went out
  size_t next_ GUARDED_BY(mu_) = 0;            // the choice whose turn it is to be written
  std::optional<GenerateEvent> failed_ GUARDED_BY(mu_);  // the first choice that ended not OK
  v1::GenerateChunk chunk_ GUARDED_BY(mu_);  // owned by the write in flight
  bool writing_ GUARDED_BY(mu_) = false;
  bool finished_ GUARDED_BY(mu_) = false;
  bool broken_ GUARDED_BY(mu_) = false;
  bool first_sent_ GUARDED_BY(mu_) = false;  // the first chunk (it carries the call id) went out
};

}  // namespace

TulipService::TulipService(EmbedScheduler& scheduler, LlmFrontend& llm, Worker& worker,
                           ServiceOptions opts)
    : scheduler_(scheduler), llm_(llm), worker_(worker), opts_(std::move(opts)) {}

grpc::Status TulipService::authorize(const grpc::CallbackServerContext* ctx) const {
  if (opts_.auth == nullptr) return grpc::Status::OK;
  auto it = ctx->client_metadata().find("authorization");
  const std::string_view presented =
      it == ctx->client_metadata().end() ? std::string_view()
                                         : std::string_view(it->second.data(), it->second.size());
  const Status st = checkBearer(presented, *opts_.auth);
  if (st.isOk()) return grpc::Status::OK;
  static auto& refused =
      metrics::Registry::global()
          .counter("tulip_unauthenticated_total", "Calls refused for a missing or wrong token")
          .get();
  refused.inc();
  // At most one line a second: a caller hammering without a token must not flood the log.
  static std::atomic<int64_t> last_log_ns{0};
  const int64_t now = shm::monotonicNowNs();
  int64_t last = last_log_ns.load(std::memory_order_relaxed);
  if (now - last > 1000000000 && last_log_ns.compare_exchange_strong(last, now))
    log::warn("call refused (counted in tulip_unauthenticated_total)",
              {{"peer", ctx->peer()}, {"status", st}});
  return toGrpcStatus(st);
}

bool TulipService::servesLlm() const {
  auto f = worker_.facts();
  return std::string(f.kind, strnlen(f.kind, sizeof(f.kind))) == "llm";
}

std::string TulipService::modelName() const {
  if (!opts_.served_model_name.empty()) return opts_.served_model_name;
  auto f = worker_.facts();
  return std::string(f.name, strnlen(f.name, sizeof(f.name)));
}

grpc::ServerUnaryReactor* TulipService::Embed(grpc::CallbackServerContext* ctx,
                                              const v1::EmbedRequest* req,
                                              v1::EmbedResponse* resp) {
  if (grpc::Status a = authorize(ctx); !a.ok()) return finishNow(ctx, a);
  if (!req->model().empty() && worker_.ready() && req->model() != modelName()) {
    return finishNow(ctx, toGrpcStatus(notFound("model '" + req->model() +
                                                "' is not served here (serving '" +
                                                modelName() + "')")));
  }
  if (worker_.ready() && servesLlm()) {
    return finishNow(ctx, toGrpcStatus(unimplemented(
                              "Embed: this tulip serves an LLM ('" + modelName() +
                              "'); embeddings are served by an embedding worker")));
  }
  auto job = std::make_shared<EmbedJob>();
  job->trace.arrived_ns = shm::monotonicNowNs();
  job->kind = shm::BatchKind::kEmbed;
  uint64_t tokens = 0;
  job->inputs = copyInputs(req->inputs(), &tokens);
  job->pooling = toPooling(req->pooling());
  job->normalize = req->normalize();
  job->dimensions = req->dimensions();
  job->deadline_ns = monotonicDeadline(ctx);
  job->request_id = requestId(ctx);
  auto* reactor = new JobReactor(scheduler_, "Embed");
  reactor->start(job, tokens, [resp](const EmbedJob& j, uint64_t total_us) {
    resp->set_dim(j.dim);
    resp->set_prompt_tokens(0);
    uint64_t n = 0;
    for (size_t i = 0; i < j.inputs.size(); ++i) {
      // Little-endian float32: the host order on every platform we build for.
      resp->add_embeddings(reinterpret_cast<const char*>(j.values.data() + i * j.dim),
                           j.dim * sizeof(float));
      n += j.inputs[i].size();
    }
    resp->set_prompt_tokens(n);
    fillTimings(j, total_us, resp->mutable_timings());
  });
  return reactor;
}

grpc::ServerUnaryReactor* TulipService::Score(grpc::CallbackServerContext* ctx,
                                              const v1::ScoreRequest* req,
                                              v1::ScoreResponse* resp) {
  if (grpc::Status a = authorize(ctx); !a.ok()) return finishNow(ctx, a);
  if (!req->model().empty() && worker_.ready() && req->model() != modelName()) {
    return finishNow(ctx, toGrpcStatus(notFound("model '" + req->model() +
                                                "' is not served here")));
  }
  if (worker_.ready() && servesLlm()) {
    return finishNow(ctx, toGrpcStatus(unimplemented(
                              "Score: this tulip serves an LLM ('" + modelName() +
                              "'); scoring is served by an embedding worker")));
  }
  auto job = std::make_shared<EmbedJob>();
  job->trace.arrived_ns = shm::monotonicNowNs();
  job->kind = shm::BatchKind::kScore;
  uint64_t tokens = 0;
  job->inputs = copyInputs(req->inputs(), &tokens);
  job->score_yes = req->yes_token();
  job->score_no = req->no_token();
  if (job->score_yes == 0 && job->score_no == 0) {
    // proto3 default (both unset): the classification head.
    job->score_yes = job->score_no = -1;
  }
  job->deadline_ns = monotonicDeadline(ctx);
  job->request_id = requestId(ctx);
  auto* reactor = new JobReactor(scheduler_, "Score");
  reactor->start(job, tokens, [resp](const EmbedJob& j, uint64_t total_us) {
    uint64_t n = 0;
    for (size_t i = 0; i < j.inputs.size(); ++i) {
      resp->add_scores(j.values[i]);
      n += j.inputs[i].size();
    }
    resp->set_prompt_tokens(n);
    fillTimings(j, total_us, resp->mutable_timings());
  });
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateChunk>* TulipService::Generate(
    grpc::CallbackServerContext* ctx, const v1::GenerateRequest* req) {
  class Refuse final : public grpc::ServerWriteReactor<v1::GenerateChunk> {
   public:
    explicit Refuse(const grpc::Status& st) {
      Finish(st);  // before the handler returns: kept in this reactor until gRPC binds it
      tsanRelease(this);  // [TAG_TSAN_HANDOFF]: OnDone runs after the handler returned
    }
    void OnDone() override {
      tsanAcquire(this);
      delete this;
    }
  };
  if (grpc::Status a = authorize(ctx); !a.ok()) return new Refuse(a);
  if (worker_.ready() && !servesLlm()) {
    return new Refuse(toGrpcStatus(unimplemented("Generate: this tulip serves an embedding model; "
                                                 "text generation is served by an LLM worker")));
  }
  if (!req->model().empty() && worker_.ready() && req->model() != modelName()) {
    return new Refuse(toGrpcStatus(notFound("model '" + req->model() +
                                            "' is not served here (serving '" + modelName() +
                                            "')")));
  }
  auto r = std::make_shared<LlmRequest>();
  GenerateParams& p = r->params;
  p.prompt.assign(req->prompt_ids().begin(), req->prompt_ids().end());
  p.max_tokens = req->max_tokens();
  p.sampling.temperature = req->sampling().temperature();
  p.sampling.top_p = req->sampling().top_p();
  p.sampling.top_k = req->sampling().top_k();
  p.sampling.seed = req->sampling().seed();
  p.has_seed = req->sampling().has_seed();
  const v1::SamplingParams& sp = req->sampling();
  p.sampling.min_p = sp.min_p();
  p.sampling.presence_penalty = sp.presence_penalty();
  p.sampling.frequency_penalty = sp.frequency_penalty();
  p.sampling.repetition_penalty = sp.repetition_penalty();
  if (!sp.logprobs() && sp.top_logprobs() > 0) {
    return new Refuse(toGrpcStatus(
        invalidArgument("sampling.top_logprobs: needs sampling.logprobs = true")));
  }
  p.sampling.logprobs = !sp.logprobs() ? -1
                        : sp.top_logprobs() > static_cast<uint32_t>(llm::kMaxTopLogprobs)
                            ? llm::kMaxTopLogprobs + 1  // refused by validateGenerate
                            : static_cast<int32_t>(sp.top_logprobs());
  p.logit_bias.reserve(static_cast<size_t>(sp.logit_bias_size()));
  for (const v1::LogitBias& b : sp.logit_bias()) p.logit_bias.push_back({b.token_id(), b.bias()});
  p.stop_token_ids.assign(req->stop_token_ids().begin(), req->stop_token_ids().end());
  p.ignore_eos = req->ignore_eos();
  p.n = req->n() == 0 ? 1 : req->n();
  if (p.n > kMaxChoices) {
    return new Refuse(toGrpcStatus(invalidArgument(
        "n: must be in [1, " + std::to_string(kMaxChoices) + "], got " + std::to_string(p.n))));
  }
  if (req->has_constraint()) {  // [TAG_TOKEN_MASK]
    const auto& c = req->constraint();
    if (!opts_.vocab) {
      return new Refuse(toGrpcStatus(failedPrecondition(
          "constraint: structured outputs need tulip's --tokenizer (the vocabulary's bytes)")));
    }
    // A serialized grammar -> its token tables over the served vocabulary (LRU by grammar hash).
    auto compiled = [&](const std::string& bytes, const std::string& field)
        -> Result<std::shared_ptr<const grammar::CompiledGrammar>> {
      auto g = grammar::Grammar::deserialize(bytes);
      if (!g.isOk()) return g.status().withContext(field);
      const uint64_t key = g->hash();
      if (auto cached = grammars_.get(key)) return *cached;
      auto cg = grammar::CompiledGrammar::compile(std::move(g).value(), opts_.vocab);
      if (!cg.isOk()) return cg.status().withContext(field);
      grammars_.put(key, *cg);
      return *cg;
    };
    if (c.grammar().empty() && c.tools_size() == 0) {
      return new Refuse(toGrpcStatus(
          invalidArgument("constraint: needs a grammar or at least one tool")));
    }
    if (!c.grammar().empty()) {
      auto g = compiled(c.grammar(), "constraint.grammar");
      if (!g.isOk()) return new Refuse(toGrpcStatus(g.status()));
      p.grammar = *g;
    }
    p.constraint.channel_token = c.channel_token();
    p.constraint.channel_prefix.assign(c.channel_prefix().begin(), c.channel_prefix().end());
    p.constraint.message_token = c.message_token();
    p.constraint.end_tokens.assign(c.end_tokens().begin(), c.end_tokens().end());
    for (int i = 0; i < c.tools_size(); ++i) {  // [TAG_STRICT_TOOLS]
      const std::string field = "constraint.tools[" + std::to_string(i) + "]";
      if (c.tools(i).name().empty()) {
        return new Refuse(toGrpcStatus(invalidArgument(field + ".name: must not be empty")));
      }
      auto g = compiled(c.tools(i).grammar(), field + ".grammar");
      if (!g.isOk()) return new Refuse(toGrpcStatus(g.status()));
      p.constraint.tools.push_back(grammar::ToolGrammar{c.tools(i).name(), *g});
    }
    if (c.tools_size() > 0) {
      const v1::HarmonyTokenIds& h = c.harmony();
      p.constraint.harmony = grammar::HarmonyIds{h.start(), h.channel(), h.constrain(),
                                                 h.message(),  h.end(),     h.call(),
                                                 h.ret(),      h.end_of_text()};
      if (h.message() < 0 || h.message() >= opts_.vocab->size() || h.call() < 0 ||
          h.call() >= opts_.vocab->size()) {
        return new Refuse(toGrpcStatus(invalidArgument(
            "constraint.harmony: message and call must be ids of the vocabulary")));
      }
      p.constraint.turn_prefix.assign(c.turn_prefix().begin(), c.turn_prefix().end());
    }
    const auto vocab = static_cast<int64_t>(worker_.facts().vocab_size);
    if (worker_.ready() && vocab != opts_.vocab->size()) {
      return new Refuse(toGrpcStatus(failedPrecondition(
          "constraint: tulip's --tokenizer has " + std::to_string(opts_.vocab->size()) +
          " ids, the model " + std::to_string(vocab))));
    }
  }
  p.deadline_ns = monotonicDeadline(ctx);
  p.request_id = requestId(ctx);
  auto* reactor = new GenerateReactor(llm_, p.request_id, p.n);
  reactor->start(std::move(r));
  return reactor;
}

grpc::ServerUnaryReactor* TulipService::Load(grpc::CallbackServerContext* ctx,
                                             const v1::LoadRequest* req,
                                             v1::LoadResponse* resp) {
  if (grpc::Status a = authorize(ctx); !a.ok()) return finishNow(ctx, a);
  if (servesLlm()) {
    auto s = llm_.stats();
    resp->set_queued_requests(s.waiting);
    resp->set_queued_tokens(s.waiting_tokens);
    resp->set_inflight_tokens(s.inflight_tokens);
    resp->set_queue_limit_tokens(s.max_waiting_tokens);
    resp->set_running_seqs(s.running);
    resp->set_waiting_seqs(s.waiting);
    resp->set_kv_free_blocks(s.kv_free_blocks);
    resp->set_kv_total_blocks(s.kv_total_blocks);
    resp->set_kv_window_free_blocks(s.kv_window_free_blocks);  // [TAG_KV_WINDOW_GROUP]
    resp->set_kv_window_total_blocks(s.kv_window_total_blocks);
  } else {
    auto s = scheduler_.stats();
    resp->set_queued_requests(s.queued_requests);
    resp->set_queued_tokens(s.queued_tokens);
    resp->set_inflight_tokens(s.inflight_tokens);
    resp->set_queue_limit_tokens(s.queue_limit_tokens);
  }
  resp->set_worker_ready(worker_.ready());
  auto f = worker_.facts();
  resp->set_model(modelName());
  resp->set_max_seq_len(f.max_seq_len);
  resp->set_hidden_size(f.hidden_size);
  return finishNow(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* TulipService::StopChoice(grpc::CallbackServerContext* ctx,
                                                   const v1::StopChoiceRequest* req,
                                                   v1::StopChoiceResponse* /*resp*/) {
  if (grpc::Status a = authorize(ctx); !a.ok()) return finishNow(ctx, a);
  const Status st = llm_.stopChoice(req->call_id(), req->index());
  Metrics::get().requests.labels({"StopChoice", std::string(statusCodeName(st.code()))}).inc();
  log::debug("stop choice", {{"request_id", requestId(ctx)},
                             {"call_id", req->call_id()},
                             {"index", static_cast<uint64_t>(req->index())},
                             {"status", st}});
  return finishNow(ctx, toGrpcStatus(st));
}

grpc::ServerUnaryReactor* TulipService::ModelInfo(grpc::CallbackServerContext* ctx,
                                                  const v1::ModelInfoRequest* req,
                                                  v1::ModelInfoResponse* resp) {
  if (grpc::Status a = authorize(ctx); !a.ok()) return finishNow(ctx, a);
  if (!worker_.ready()) {
    return finishNow(ctx, toGrpcStatus(workerDown(worker_)));
  }
  auto f = worker_.facts();
  resp->set_model(modelName());
  resp->set_kind(std::string(f.kind, strnlen(f.kind, sizeof(f.kind))));
  resp->set_hidden_size(f.hidden_size);
  resp->set_max_seq_len(f.max_seq_len);
  resp->set_vocab_size(f.vocab_size);
  resp->set_pooling(static_cast<v1::Pooling>(f.pooling));
  resp->set_has_score_head(f.has_score_head != 0);
  for (int32_t e : f.eos_ids)
    if (e >= 0) resp->add_eos_token_ids(e);
  resp->set_kv_blocks(f.kv_num_blocks);
  resp->set_kv_block_size(f.kv_block_size);
  resp->set_kv_window_blocks(f.kv_num_blocks_window);  // [TAG_KV_WINDOW_GROUP]
  resp->set_kv_window(f.kv_window);
  return finishNow(ctx, grpc::Status::OK);
}

}  // namespace garden::tulip
