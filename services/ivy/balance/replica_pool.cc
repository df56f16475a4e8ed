#include "services/ivy/balance/replica_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/logging.h"

namespace garden::ivy {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string_view replicaStateName(ReplicaState s) {
  switch (s) {
    case ReplicaState::kProbing:
      return "probing";
    case ReplicaState::kHealthy:
      return "healthy";
    case ReplicaState::kEjected:
      return "ejected";
    case ReplicaState::kMismatch:
      return "mismatch";
    case ReplicaState::kDraining:
      return "draining";
  }
  return "unknown";
}

namespace {

constexpr ReplicaState kAllStates[] = {ReplicaState::kProbing, ReplicaState::kHealthy,
                                       ReplicaState::kEjected, ReplicaState::kMismatch,
                                       ReplicaState::kDraining};
enum MethodIndex { kEmbedMethod = 0, kScoreMethod = 1, kGenerateMethod = 2, kMethods = 3 };
constexpr const char* kMethodNames[kMethods] = {"Embed", "Score", "Generate"};

}  // namespace

struct ReplicaPool::Metrics {
  explicit Metrics(metrics::Registry& r)
      : registry(r),
        replicas(r.gauge("ivy_replicas", "tulip replicas known to ivy by state", {"state"})),
        outstanding(r.gauge("ivy_replica_outstanding_tokens",
                            "Tokens ivy sent to a tulip replica and has not had back",
                            {"replica"})),
        load(r.gauge("ivy_replica_load_tokens",
                     "Queued + in-flight tokens a tulip replica reported in its last Load poll",
                     {"replica"})),
        calls(r.counter("ivy_replica_calls_total", "Calls and chunks ivy sent to a tulip replica",
                        {"replica", "method"})),
        failures(r.counter("ivy_replica_failures_total",
                           "Calls to a tulip replica that failed, by status code",
                           {"replica", "code"})),
        retries(r.counter("ivy_pool_retries_total",
                          "Calls or chunks sent again to another replica after a failure",
                          {"method"})),
        ejections(r.counter("ivy_pool_ejections_total",
                            "Times a tulip replica was ejected after a failure", {"replica"})),
        splits(
            r.counter("ivy_pool_splits_total", "Requests split into several chunks", {"method"})),
        chunks(r.counter("ivy_pool_chunks_total", "Chunks of split requests", {"method"})),
        mismatches(r.counter("ivy_pool_model_mismatch_total",
                             "Probes of a tulip replica serving another model than the pool",
                             {"replica"})),
        no_replica(r.counter("ivy_pool_no_replica_total",
                             "Calls or chunks that found no replica able to serve them",
                             {"method"})) {
    for (ReplicaState s : kAllStates) {
      state_gauges[static_cast<int>(s)] = &replicas.labels({replicaStateName(s)});
    }
    for (int m = 0; m < kMethods; ++m) {
      retry_by_method[m] = &retries.labels({kMethodNames[m]});
      splits_by_method[m] = &splits.labels({kMethodNames[m]});
      chunks_by_method[m] = &chunks.labels({kMethodNames[m]});
      no_replica_by_method[m] = &no_replica.labels({kMethodNames[m]});
    }
  }
  metrics::Registry& registry;
  metrics::GaugeFamily& replicas;
  metrics::GaugeFamily& outstanding;
  metrics::GaugeFamily& load;
  metrics::CounterFamily& calls;
  metrics::CounterFamily& failures;
  metrics::CounterFamily& retries;
  metrics::CounterFamily& ejections;
  metrics::CounterFamily& splits;
  metrics::CounterFamily& chunks;
  metrics::CounterFamily& mismatches;
  metrics::CounterFamily& no_replica;
  metrics::Gauge* state_gauges[5] = {};
  metrics::Counter* retry_by_method[kMethods] = {};
  metrics::Counter* splits_by_method[kMethods] = {};
  metrics::Counter* chunks_by_method[kMethods] = {};
  metrics::Counter* no_replica_by_method[kMethods] = {};
};

// One replica. Fields marked "mu_" are guarded by the pool's mu_; the atomics are touched by calls
// in flight without it. A replica is destroyed only by the maintenance pass, once it is draining
// and nothing (call, probe, poll) is in flight on it: release() decrementing calls_in_flight is
// the last touch of a call.
struct ReplicaPool::Replica {
  std::string address;               // gRPC target
  std::string name;                  // host:port (logs, metric label)
  std::vector<std::string> sources;  // mu_: the --tulip entries listing it
  std::unique_ptr<TulipClient> client;

  ReplicaState state = ReplicaState::kProbing;  // mu_
  bool probe_in_flight = false;                 // mu_
  bool health_in_flight = false;                // mu_
  bool load_in_flight = false;                  // mu_
  Clock::time_point next_probe{};               // mu_
  Clock::time_point next_health{};              // mu_
  Clock::time_point next_load{};                // mu_
  milliseconds backoff{0};                      // mu_: the last probe wait; 0 after success

  std::atomic<int64_t> outstanding{0};  // tokens sent, not had back
  std::atomic<uint64_t> polled{0};      // queued + in-flight tokens of the last Load
  // [TAG_POOL_OTHERS_LOAD] The part of `polled` that is not this ivy's own: tulip counts our calls
  // too, and `outstanding` already has them. Adding both counted a call twice, and a poll that
  // landed while one of our calls was in flight made the replica look busy until the next poll
  // long after the call had finished (sequential requests all went to the other replica).
  std::atomic<uint64_t> others{0};
  int64_t own_since_poll = 0;  // mu_: the most tokens we had outstanding here while a Load was out
  std::atomic<int64_t> calls_in_flight{0};
  std::atomic<uint64_t> calls{0};

  metrics::Gauge* outstanding_gauge = nullptr;
  metrics::Gauge* load_gauge = nullptr;
  metrics::Counter* calls_by_method[kMethods] = {};
};

// ---------------------------------------------------------------------------------------------
// Embed / Score: split into chunks, each sent to the least-loaded replica, retried on another on
// UNAVAILABLE (or RESOURCE_EXHAUSTED), reassembled in input order.

struct EmbedTraits {
  using Call = EmbedCall;
  using Reply = EmbedReply;
  using Done = TulipClient::EmbedDone;
  static constexpr int kMethod = kEmbedMethod;
  static void send(TulipClient* c, Call call, std::function<void(Result<Reply>)> cb) {
    c->embed(std::move(call), std::move(cb));
  }
  // Copies the rows of `part` (inputs [begin, begin + count)) into `out` (n inputs in all).
  static Status merge(Reply& out, bool first, size_t n, size_t begin, size_t count, Reply& part) {
    if (part.dim == 0 || part.values.size() != count * size_t(part.dim)) {
      return internalError("tulip returned " + std::to_string(part.values.size()) + " values for " +
                           std::to_string(count) + " inputs of dim " + std::to_string(part.dim));
    }
    if (first) {
      out.dim = part.dim;
      if (count == n) {
        out.values = std::move(part.values);
      } else {
        out.values.resize(n * size_t(part.dim));
      }
    } else if (part.dim != out.dim) {
      return internalError("tulip replicas returned different embedding widths (" +
                           std::to_string(out.dim) + " and " + std::to_string(part.dim) + ")");
    }
    if (!part.values.empty()) {
      std::memcpy(out.values.data() + begin * out.dim, part.values.data(),
                  part.values.size() * sizeof(float));
    }
    out.prompt_tokens += part.prompt_tokens;
    out.queue_us = std::max(out.queue_us, part.queue_us);
    out.inference_us = std::max(out.inference_us, part.inference_us);
    out.total_us = std::max(out.total_us, part.total_us);
    return okStatus();
  }
};

struct ScoreTraits {
  using Call = ScoreCall;
  using Reply = ScoreReply;
  using Done = TulipClient::ScoreDone;
  static constexpr int kMethod = kScoreMethod;
  static void send(TulipClient* c, Call call, std::function<void(Result<Reply>)> cb) {
    c->score(std::move(call), std::move(cb));
  }
  static Status merge(Reply& out, bool first, size_t n, size_t begin, size_t count, Reply& part) {
    if (part.scores.size() != count) {
      return internalError("tulip returned " + std::to_string(part.scores.size()) + " scores for " +
                           std::to_string(count) + " inputs");
    }
    if (first) {
      if (count == n) {
        out.scores = std::move(part.scores);
      } else {
        out.scores.resize(n);
      }
    }
    if (!part.scores.empty()) {
      std::copy(part.scores.begin(), part.scores.end(), out.scores.begin() + begin);
    }
    out.prompt_tokens += part.prompt_tokens;
    out.queue_us = std::max(out.queue_us, part.queue_us);
    out.inference_us = std::max(out.inference_us, part.inference_us);
    out.total_us = std::max(out.total_us, part.total_us);
    return okStatus();
  }
};

template <typename Traits>
class ReplicaPool::SplitOp : public std::enable_shared_from_this<SplitOp<Traits>> {
 public:
  using Call = typename Traits::Call;
  using Reply = typename Traits::Reply;
  using Done = typename Traits::Done;

  SplitOp(ReplicaPool* pool, Call call, Done done)
      : pool_(pool), done_(std::move(done)), cancel_(std::make_shared<CallCanceller>()) {
    inputs_ = std::move(call.inputs);
    call.inputs.clear();
    caller_cancel_ = std::move(call.cancel);
    call.cancel = nullptr;
    has_deadline_ = call.timeout.count() > 0;
    if (has_deadline_) deadline_ = pool_->now() + call.timeout;
    template_ = std::move(call);
    plan();
  }

  void start() {
    if (caller_cancel_) {
      std::weak_ptr<CallCanceller> c = cancel_;
      caller_hook_ = caller_cancel_->add([c] {
        if (auto p = c.lock()) p->cancel();
      });
    }
    if (chunks_.size() > 1) {
      pool_->metrics_->splits_by_method[Traits::kMethod]->inc();
      pool_->metrics_->chunks_by_method[Traits::kMethod]->inc(static_cast<double>(chunks_.size()));
    }
    remaining_ = chunks_.size();
    for (size_t i = 0; i < chunks_.size(); ++i) send(i);
  }

 private:
  struct Chunk {
    size_t begin = 0, end = 0;
    uint64_t tokens = 0;
    uint32_t unavailable_retries = 0;
    std::vector<const Replica*> tried;  // guarded by mu_ (one attempt at a time per chunk)
    Status last_error;                  // guarded by mu_
  };

  // Contiguous chunks under both budgets; an input larger than the token budget is a chunk alone.
  void plan() {
    const uint64_t max_tokens = pool_->options_.split_max_tokens;
    const uint64_t max_inputs = pool_->options_.split_max_inputs;
    const size_t n = inputs_.size();
    if (n == 0) {
      chunks_.push_back(Chunk{});
      return;
    }
    Chunk cur;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t t = inputs_[i].size();
      const size_t count = i - cur.begin;
      const bool over_tokens = max_tokens != 0 && count > 0 && cur.tokens + t > max_tokens;
      const bool over_inputs = max_inputs != 0 && count >= max_inputs;
      if (over_tokens || over_inputs) {
        cur.end = i;
        chunks_.push_back(std::move(cur));
        cur = Chunk{};
        cur.begin = i;
      }
      cur.tokens += t;
    }
    cur.end = n;
    chunks_.push_back(std::move(cur));
  }

  void send(size_t ci) {
    Chunk& c = chunks_[ci];
    std::vector<const Replica*> tried;
    Status last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      tried = c.tried;
      last = c.last_error;
    }
    // Cancelled (the caller went away, or another chunk failed): no new attempt is sent.
    if (cancel_->cancelled()) return fail(cancelledError("the request was cancelled"));
    milliseconds timeout{0};
    if (has_deadline_) {
      auto left = std::chrono::ceil<milliseconds>(deadline_ - pool_->now());
      if (left.count() <= 0) {
        return fail(deadlineExceeded(
            last.isOk() ? "the request deadline passed before a tulip replica answered"
                        : "the request deadline passed while retrying after: " + last.message()));
      }
      timeout = left;
    }
    Replica* r = pool_->pick(tried, c.tokens, Traits::kMethod);
    if (r == nullptr) {
      pool_->metrics_->no_replica_by_method[Traits::kMethod]->inc();
      if (last.code() == StatusCode::kResourceExhausted) {
        return fail(
            resourceExhausted("every tulip replica is at capacity; last: " + last.message()));
      }
      if (!last.isOk()) {
        return fail(unavailable("no tulip replica could serve the request after " +
                                std::to_string(tried.size()) +
                                " attempt(s); last error: " + last.message()));
      }
      return fail(unavailable("no healthy tulip replica (" + pool_->endpoint() + ")"));
    }
    Call sub = template_;
    sub.inputs.assign(inputs_.begin() + static_cast<std::ptrdiff_t>(c.begin),
                      inputs_.begin() + static_cast<std::ptrdiff_t>(c.end));
    sub.timeout = timeout;
    sub.cancel = cancel_;
    auto self = this->shared_from_this();
    Traits::send(r->client.get(), std::move(sub),
                 [self, ci, r](Result<Reply> res) { self->onReply(ci, r, std::move(res)); });
  }

  void onReply(size_t ci, Replica* r, Result<Reply> res) {
    Chunk& c = chunks_[ci];
    std::string name;
    // A chunk we cancelled (the caller left, or a sibling failed) is not the replica's failure.
    if (!res.isOk() && !(res.status().code() == StatusCode::kCancelled && cancel_->cancelled())) {
      pool_->onCallFailed(r, res.status());
    }
    if (!res.isOk()) name = r->name;
    pool_->release(r, c.tokens);  // last touch of r
    std::unique_lock<std::mutex> lock(mu_);
    if (finished_) return;
    if (res.isOk()) {
      const bool first = !have_reply_;
      have_reply_ = true;
      Status st = Traits::merge(reply_, first, inputs_.size(), c.begin, c.end - c.begin, *res);
      if (!st.isOk()) {
        lock.unlock();
        return fail(std::move(st));
      }
      if (--remaining_ > 0) return;
      finished_ = true;
      Reply out = std::move(reply_);
      Done done = std::move(done_);
      lock.unlock();
      cleanup();
      done(std::move(out));
      return;
    }
    const Status& st = res.status();
    bool retry = false;
    if (st.code() == StatusCode::kUnavailable &&
        c.unavailable_retries < pool_->options_.max_retries) {
      ++c.unavailable_retries;
      retry = true;
    } else if (st.code() == StatusCode::kResourceExhausted) {
      retry = true;  // every other healthy replica once; pick() runs out of candidates after
    }
    if (!retry) {
      const size_t attempts = c.tried.size() + 1;
      lock.unlock();
      if (st.code() == StatusCode::kUnavailable) {
        return fail(unavailable("no tulip replica could serve the request after " +
                                std::to_string(attempts) + " attempt(s); last error from " + name +
                                ": " + st.message()));
      }
      return fail(st);
    }
    c.tried.push_back(r);
    c.last_error = st;
    lock.unlock();
    pool_->metrics_->retry_by_method[Traits::kMethod]->inc();
    send(ci);
  }

  // Fails the whole call once: the other chunks are cancelled, their replies dropped.
  void fail(Status st) {
    Done done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
      done = std::move(done_);
    }
    cancel_->cancel();
    cleanup();
    done(std::move(st));
  }

  void cleanup() {
    if (caller_cancel_) caller_cancel_->remove(caller_hook_);
  }

  ReplicaPool* pool_;
  Call template_;  // the call without inputs: copied per chunk
  std::vector<std::vector<int32_t>> inputs_;
  std::vector<Chunk> chunks_;  // planned once; per-chunk retry state under mu_
  Done done_;
  std::shared_ptr<CallCanceller> cancel_;         // cancels every chunk of this call
  std::shared_ptr<CallCanceller> caller_cancel_;  // the caller's, chained to cancel_
  uint64_t caller_hook_ = 0;
  bool has_deadline_ = false;
  Clock::time_point deadline_{};

  std::mutex mu_;
  Reply reply_;              // guarded by mu_
  bool have_reply_ = false;  // guarded by mu_
  size_t remaining_ = 0;     // guarded by mu_
  bool finished_ = false;    // guarded by mu_
};

void ReplicaPool::embed(EmbedCall call, EmbedDone done) {
  auto op = std::make_shared<SplitOp<EmbedTraits>>(this, std::move(call), std::move(done));
  op->start();
}

void ReplicaPool::score(ScoreCall call, ScoreDone done) {
  auto op = std::make_shared<SplitOp<ScoreTraits>>(this, std::move(call), std::move(done));
  op->start();
}

// ---------------------------------------------------------------------------------------------
// Generate: one replica; another one only while nothing has reached the caller.

class ReplicaPool::PoolStream : public GenerateStream,
                                public std::enable_shared_from_this<PoolStream> {
 public:
  PoolStream(ReplicaPool* pool, GenerateCall call, ChunkFn on_chunk, StreamDone on_done)
      : pool_(pool),
        call_(std::move(call)),
        on_chunk_(std::move(on_chunk)),
        on_done_(std::move(on_done)) {
    tokens_ = call_.prompt_ids.size() + call_.max_tokens;
    has_deadline_ = call_.timeout.count() > 0;
    if (has_deadline_) deadline_ = pool_->now() + call_.timeout;
  }

  void attempt() {
    std::vector<const Replica*> tried;
    Status last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      tried = tried_;
      last = last_error_;
    }
    if (isCancelled()) return finish(cancelledError("generation cancelled"));
    GenerateCall sub = call_;
    if (has_deadline_) {
      auto left = std::chrono::ceil<milliseconds>(deadline_ - pool_->now());
      if (left.count() <= 0) {
        return finish(deadlineExceeded(
            last.isOk() ? "the request deadline passed before a tulip replica answered"
                        : "the request deadline passed while retrying after: " + last.message()));
      }
      sub.timeout = left;
    }
    Replica* r = pool_->pick(tried, tokens_, kGenerateMethod);
    if (r == nullptr) {
      pool_->metrics_->no_replica_by_method[kGenerateMethod]->inc();
      if (last.code() == StatusCode::kResourceExhausted) {
        return finish(
            resourceExhausted("every tulip replica is at capacity; last: " + last.message()));
      }
      if (!last.isOk()) {
        return finish(unavailable("no tulip replica could serve the request after " +
                                  std::to_string(tried.size()) +
                                  " attempt(s); last error: " + last.message()));
      }
      return finish(unavailable("no healthy tulip replica (" + pool_->endpoint() + ")"));
    }
    uint64_t my_attempt;
    {
      std::lock_guard<std::mutex> lock(mu_);
      my_attempt = ++attempts_;
    }
    auto self = shared_from_this();
    std::shared_ptr<GenerateStream> inner = r->client->generate(
        std::move(sub),
        [self](GenerateChunkMsg m) {
          self->delivered_.store(true, std::memory_order_release);
          self->on_chunk_(std::move(m));
        },
        [self, r](Status s) { self->onInnerDone(r, std::move(s)); });
    bool cancel_now = false;
    std::vector<uint32_t> stops;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (attempts_ == my_attempt && !finished_) {
        inner_ = inner;
        cancel_now = cancelled_;
        stops.swap(pending_stops_);
      }
    }
    if (cancel_now && inner) inner->cancel();
    if (inner)
      for (uint32_t i : stops) inner->stopChoice(i);
  }

  // [TAG_STOP_CHOICE] To the stream whose chunks reached the caller; one asked for before the
  // stream's handle is known (its first chunk may come first) is passed on once it is.
  void stopChoice(uint32_t index) override {
    std::shared_ptr<GenerateStream> inner;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_ || finished_) return;
      inner = inner_;
      if (!inner) pending_stops_.push_back(index);
    }
    if (inner) inner->stopChoice(index);
  }

  void cancel() override {
    std::shared_ptr<GenerateStream> inner;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_ || finished_) return;
      cancelled_ = true;
      inner = inner_;
    }
    if (inner) inner->cancel();
  }

 private:
  bool isCancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }

  void onInnerDone(Replica* r, Status s) {
    std::string name;
    if (!s.isOk()) {
      pool_->onCallFailed(r, s);
      name = r->name;
    }
    pool_->release(r, tokens_);  // last touch of r
    if (s.isOk()) return finish(std::move(s));
    bool retry = false;
    size_t attempts = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      const bool nothing_sent = !delivered_.load(std::memory_order_acquire) && !cancelled_;
      if (nothing_sent && s.code() == StatusCode::kUnavailable &&
          unavailable_retries_ < pool_->options_.max_retries) {
        ++unavailable_retries_;
        retry = true;
      } else if (nothing_sent && s.code() == StatusCode::kResourceExhausted) {
        retry = true;
      }
      if (retry) {
        tried_.push_back(r);
        last_error_ = s;
        inner_.reset();
      }
      attempts = tried_.size() + (retry ? 0 : 1);
    }
    if (!retry && s.code() == StatusCode::kUnavailable &&
        !delivered_.load(std::memory_order_acquire)) {
      return finish(unavailable("no tulip replica could serve the request after " +
                                std::to_string(attempts) + " attempt(s); last error from " + name +
                                ": " + s.message()));
    }
    if (!retry) return finish(std::move(s));
    pool_->metrics_->retry_by_method[kGenerateMethod]->inc();
    attempt();
  }

  void finish(Status s) {
    StreamDone done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
      inner_.reset();
      done = std::move(on_done_);
    }
    done(std::move(s));
  }

  ReplicaPool* pool_;
  const GenerateCall call_;
  ChunkFn on_chunk_;  // called by one inner stream at a time
  StreamDone on_done_;
  uint64_t tokens_ = 0;
  bool has_deadline_ = false;
  Clock::time_point deadline_{};
  std::atomic<bool> delivered_{false};

  std::mutex mu_;
  std::shared_ptr<GenerateStream> inner_;  // guarded by mu_
  std::vector<uint32_t> pending_stops_;    // guarded by mu_: stopChoice() before inner_ was set
  uint64_t attempts_ = 0;                  // guarded by mu_
  bool cancelled_ = false;                 // guarded by mu_
  bool finished_ = false;                  // guarded by mu_
  uint32_t unavailable_retries_ = 0;       // guarded by mu_
  std::vector<const Replica*> tried_;      // guarded by mu_
  Status last_error_;                      // guarded by mu_
};

std::shared_ptr<GenerateStream> ReplicaPool::generate(GenerateCall call, ChunkFn on_chunk,
                                                      StreamDone on_done) {
  auto s =
      std::make_shared<PoolStream>(this, std::move(call), std::move(on_chunk), std::move(on_done));
  s->attempt();
  return s;
}

// ---------------------------------------------------------------------------------------------
// The pool.

Result<std::unique_ptr<ReplicaPool>> ReplicaPool::create(std::vector<TulipEndpoint> endpoints,
                                                         ReplicaPoolOptions options,
                                                         ReplicaClientFactory factory,
                                                         Resolver resolver,
                                                         metrics::Registry* registry) {
  if (endpoints.empty()) return invalidArgument("--tulip: no tulip endpoint given");
  if (options.health_interval.count() <= 0) {
    return invalidArgument("--tulip-health-interval-ms must be > 0");
  }
  if (options.load_interval.count() <= 0) {
    return invalidArgument("--tulip-load-interval-ms must be > 0");
  }
  if (options.resolve_interval.count() < 0) {
    return invalidArgument("--tulip-resolve-interval-ms must be >= 0");
  }
  if (options.rpc_timeout.count() <= 0) return invalidArgument("rpc_timeout must be > 0");
  if (options.probe_backoff_initial.count() <= 0 ||
      options.probe_backoff_max < options.probe_backoff_initial) {
    return invalidArgument("probe backoff: need 0 < initial <= max");
  }
  if (options.tick.count() <= 0) return invalidArgument("tick must be > 0");
  if (!options.now) options.now = [] { return Clock::now(); };
  if (!factory) factory = grpcReplicaFactory();
  if (!resolver) resolver = resolveSystem;
  if (registry == nullptr) registry = &metrics::Registry::global();
  return std::unique_ptr<ReplicaPool>(new ReplicaPool(
      std::move(endpoints), std::move(options), std::move(factory), std::move(resolver), registry));
}

ReplicaPool::ReplicaPool(std::vector<TulipEndpoint> endpoints, ReplicaPoolOptions options,
                         ReplicaClientFactory factory, Resolver resolver,
                         metrics::Registry* registry)
    : endpoints_(std::move(endpoints)),
      options_(std::move(options)),
      factory_(std::move(factory)),
      resolver_(std::move(resolver)),
      metrics_(std::make_unique<Metrics>(*registry)) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const TulipEndpoint& ep : endpoints_) {
    if (ep.literal) addReplica(ep.address, ep.entry);
  }
}

ReplicaPool::~ReplicaPool() { stop(); }

void ReplicaPool::start() {
  bool dns = false;
  for (const TulipEndpoint& ep : endpoints_) dns = dns || !ep.literal;
  std::lock_guard<std::mutex> lock(run_mu_);
  CHECK(!started_);
  started_ = true;
  thread_ = std::thread([this] { run(); });
  if (dns) resolver_thread_ = std::thread([this] { runResolver(); });
}

void ReplicaPool::stop() {
  {
    std::lock_guard<std::mutex> lock(run_mu_);
    stopping_ = true;
  }
  run_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (resolver_thread_.joinable()) resolver_thread_.join();
  // Probes and polls in flight call back into the pool: they end within rpc_timeout.
  std::unique_lock<std::mutex> lock(idle_mu_);
  idle_cv_.wait(lock, [this] { return internal_inflight_ == 0; });
}

void ReplicaPool::run() {
  std::unique_lock<std::mutex> lock(run_mu_);
  while (!stopping_) {
    lock.unlock();
    maintainOnce();
    lock.lock();
    run_cv_.wait_for(lock, options_.tick, [this] { return stopping_; });
  }
}

void ReplicaPool::runResolver() {
  std::unique_lock<std::mutex> lock(run_mu_);
  while (!stopping_) {
    lock.unlock();
    resolveOnce();
    lock.lock();
    if (options_.resolve_interval.count() == 0) break;
    run_cv_.wait_for(lock, options_.resolve_interval, [this] { return stopping_; });
  }
}

void ReplicaPool::resolveOnce() {
  for (const TulipEndpoint& ep : endpoints_) {
    if (ep.literal) continue;
    Result<std::vector<std::string>> addrs = resolver_(ep.host, ep.port);
    if (!addrs.isOk() || addrs->empty()) {
      // Keep what we have: a DNS hiccup must not drain healthy replicas.
      log::warn("tulip DNS lookup failed; keeping the known replicas",
                {{"tulip", ep.entry},
                 {"status", addrs.isOk() ? unavailable("no addresses") : addrs.status()}});
      continue;
    }
    applyResolved(ep, *addrs);
  }
}

void ReplicaPool::applyResolved(const TulipEndpoint& ep, const std::vector<std::string>& addrs) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto t = now();
  for (auto& r : replicas_) {
    auto it = std::find(r->sources.begin(), r->sources.end(), ep.entry);
    const bool listed = std::find(addrs.begin(), addrs.end(), r->address) != addrs.end();
    if (it != r->sources.end() && !listed) {
      r->sources.erase(it);
      if (r->sources.empty() && r->state != ReplicaState::kDraining) {
        log::info("tulip replica left DNS; draining", {{"tulip", ep.entry}, {"replica", r->name}});
        r->state = ReplicaState::kDraining;
      }
    } else if (listed && it == r->sources.end()) {
      r->sources.push_back(ep.entry);
      if (r->state == ReplicaState::kDraining) {
        log::info("tulip replica back in DNS; probing",
                  {{"tulip", ep.entry}, {"replica", r->name}});
        r->state = ReplicaState::kProbing;
        r->backoff = milliseconds(0);
        r->next_probe = t;
      }
    }
  }
  for (const std::string& a : addrs) {
    bool known = false;
    for (auto& r : replicas_) known = known || r->address == a;
    if (!known) addReplica(a, ep.entry);
  }
  updateReady();
}

void ReplicaPool::addReplica(const std::string& address, const std::string& source) {
  for (auto& r : replicas_) {
    if (r->address == address) {
      if (std::find(r->sources.begin(), r->sources.end(), source) == r->sources.end()) {
        r->sources.push_back(source);
      }
      return;
    }
  }
  auto r = std::make_unique<Replica>();
  r->address = address;
  r->name = displayAddress(address);
  r->sources.push_back(source);
  r->client = factory_(address);
  CHECK(r->client != nullptr);
  r->next_probe = now();
  r->outstanding_gauge = &metrics_->outstanding.labels({r->name});
  r->load_gauge = &metrics_->load.labels({r->name});
  for (int m = 0; m < kMethods; ++m) {
    r->calls_by_method[m] = &metrics_->calls.labels({r->name, kMethodNames[m]});
  }
  log::info("tulip replica added; probing", {{"tulip", source}, {"replica", r->name}});
  replicas_.push_back(std::move(r));
}

void ReplicaPool::maintainOnce() {
  enum class Action { kProbe, kHealth, kLoad };
  std::vector<std::pair<Replica*, Action>> actions;
  std::vector<std::unique_ptr<Replica>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto t = now();
    int counts[5] = {};
    for (size_t i = 0; i < replicas_.size();) {
      Replica* r = replicas_[i].get();
      const bool busy = r->probe_in_flight || r->health_in_flight || r->load_in_flight ||
                        r->calls_in_flight.load(std::memory_order_acquire) != 0;
      // The last replica stays (a gRPC channel must outlive the next one's creation; see
      // grpcReplicaFactory), draining but never picked.
      if (r->state == ReplicaState::kDraining && !busy && replicas_.size() > 1) {
        log::info("tulip replica removed", {{"replica", r->name}});
        r->outstanding_gauge->set(0);
        r->load_gauge->set(0);
        dropped.push_back(std::move(replicas_[i]));
        replicas_.erase(replicas_.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      ++counts[static_cast<int>(r->state)];
      switch (r->state) {
        case ReplicaState::kProbing:
        case ReplicaState::kEjected:
        case ReplicaState::kMismatch:
          if (!r->probe_in_flight && t >= r->next_probe) {
            r->probe_in_flight = true;
            actions.emplace_back(r, Action::kProbe);
          }
          break;
        case ReplicaState::kHealthy:
          if (!r->health_in_flight && !r->probe_in_flight && t >= r->next_health) {
            r->health_in_flight = true;
            actions.emplace_back(r, Action::kHealth);
          }
          if (!r->load_in_flight && t >= r->next_load) {
            r->load_in_flight = true;
            r->own_since_poll =
                std::max<int64_t>(r->outstanding.load(std::memory_order_relaxed), 0);
            actions.emplace_back(r, Action::kLoad);
          }
          break;
        case ReplicaState::kDraining:
          break;
      }
      ++i;
    }
    for (ReplicaState s : kAllStates) {
      metrics_->state_gauges[static_cast<int>(s)]->set(counts[static_cast<int>(s)]);
    }
    updateReady();
  }
  if (!actions.empty()) {
    std::lock_guard<std::mutex> lock(idle_mu_);
    internal_inflight_ += static_cast<int>(actions.size());
  }
  for (auto& [replica, action] : actions) {
    Replica* r = replica;  // a plain variable: clang 14 cannot capture a structured binding
    switch (action) {
      case Action::kProbe:
        startProbe(r);
        break;
      case Action::kHealth:
        r->client->health(options_.rpc_timeout, [this, r](Status s) {
          onHealthDone(r, std::move(s));
          internalDone();
        });
        break;
      case Action::kLoad:
        r->client->load(options_.rpc_timeout, [this, r](Result<TulipLoad> l) {
          onLoadDone(r, std::move(l));
          internalDone();
        });
        break;
    }
  }
  dropped.clear();  // clients destroyed here, on the maintenance thread, never in a callback
}

void ReplicaPool::startProbe(Replica* r) {
  r->client->health(options_.rpc_timeout, [this, r](Status s) {
    if (!s.isOk()) {
      onProbeDone(r, std::move(s), {});
      return internalDone();
    }
    r->client->modelInfo(options_.rpc_timeout, [this, r](Result<TulipModelInfo> m) {
      if (m.isOk()) {
        onProbeDone(r, okStatus(), std::move(m).value());
      } else {
        onProbeDone(r, m.status(), {});
      }
      internalDone();
    });
  });
}

namespace {

bool sameModel(const TulipModelInfo& a, const TulipModelInfo& b) {
  return a.model == b.model && a.kind == b.kind && a.hidden_size == b.hidden_size;
}

}  // namespace

void ReplicaPool::onProbeDone(Replica* r, Status st, TulipModelInfo info) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto t = now();
  r->probe_in_flight = false;
  if (r->state == ReplicaState::kDraining) return;
  if (st.isOk() && (info.model.empty() || info.hidden_size == 0 || info.max_seq_len == 0 ||
                    info.vocab_size == 0)) {
    st = unavailable("tulip: model info incomplete (model '" + info.model + "', hidden_size " +
                     std::to_string(info.hidden_size) + ", max_seq_len " +
                     std::to_string(info.max_seq_len) + ", vocab_size " +
                     std::to_string(info.vocab_size) + ")");
  }
  if (!st.isOk()) {
    // A replica never seen healthy is usually still starting (tulip waits for rose): it is
    // probed again at most every 5 initial backoffs, so it joins soon after it is up.
    const milliseconds cap =
        r->state == ReplicaState::kProbing
            ? std::min(options_.probe_backoff_max, options_.probe_backoff_initial * 5)
            : options_.probe_backoff_max;
    r->backoff =
        r->backoff.count() == 0 ? options_.probe_backoff_initial : std::min(r->backoff * 2, cap);
    r->next_probe = t + r->backoff;
    log::debug("tulip replica probe failed",
               {{"replica", r->name}, {"status", st}, {"retry_ms", r->backoff.count()}});
    last_probe_error_ = r->name + ": " + st.message();
    return;
  }
  if (spec_ != nullptr && !sameModel(info, model_info_)) {
    bool others = false;
    for (auto& o : replicas_) {
      others = others || (o.get() != r && o->state == ReplicaState::kHealthy);
    }
    if (others) {
      if (r->state != ReplicaState::kMismatch) {
        log::error("tulip replica serves another model; not used",
                   {{"replica", r->name},
                    {"model", info.model},
                    {"kind", info.kind},
                    {"hidden_size", info.hidden_size},
                    {"pool_model", model_info_.model},
                    {"pool_kind", model_info_.kind},
                    {"pool_hidden_size", model_info_.hidden_size}});
      }
      metrics_->mismatches.labels({r->name}).inc();
      r->state = ReplicaState::kMismatch;
      r->backoff = options_.probe_backoff_max;
      r->next_probe = t + r->backoff;
      return;
    }
    log::warn("tulip model changed (no healthy replica serves the previous one)",
              {{"replica", r->name}, {"model", info.model}, {"previous", model_info_.model}});
    spec_ = nullptr;
  }
  if (spec_ == nullptr) {
    auto spec = std::make_shared<ModelSpec>(makeModelSpec(info, options_.served_model_name));
    log::info("tulip model", {{"replica", r->name},
                              {"model", spec->upstream_name},
                              {"served_name", spec->served_name},
                              {"kind", spec->kind},
                              {"hidden_size", spec->hidden_size},
                              {"max_seq_len", spec->max_seq_len},
                              {"vocab_size", spec->vocab_size}});
    spec_ = std::move(spec);
    last_probe_error_.clear();
    model_info_ = info;
  }
  if (r->state != ReplicaState::kHealthy) {
    log::info("tulip replica healthy", {{"replica", r->name}});
  }
  r->state = ReplicaState::kHealthy;
  r->backoff = milliseconds(0);
  r->next_health = t + options_.health_interval;
  r->next_load = t;
  updateReady();
}

void ReplicaPool::onHealthDone(Replica* r, Status st) {
  std::lock_guard<std::mutex> lock(mu_);
  r->health_in_flight = false;
  r->next_health = now() + options_.health_interval;
  if (!st.isOk() && r->state == ReplicaState::kHealthy) eject(r, st);
}

void ReplicaPool::onLoadDone(Replica* r, Result<TulipLoad> l) {
  std::lock_guard<std::mutex> lock(mu_);
  r->load_in_flight = false;
  r->next_load = now() + options_.load_interval;
  if (!l.isOk()) return;  // the health check decides about the replica
  const uint64_t polled = l->queued_tokens + l->inflight_tokens;
  r->polled.store(polled, std::memory_order_relaxed);
  // tulip counted the calls of ours in flight when it answered, at most the most we had out while
  // the poll was: what remains is other gateways' work (clamped: ours may not have arrived yet).
  const uint64_t own = uint64_t(std::max<int64_t>(
      {r->own_since_poll, r->outstanding.load(std::memory_order_relaxed), int64_t{0}}));
  r->others.store(polled > own ? polled - own : 0, std::memory_order_relaxed);
  r->load_gauge->set(static_cast<double>(polled));
}

void ReplicaPool::internalDone() {
  std::lock_guard<std::mutex> lock(idle_mu_);
  if (--internal_inflight_ == 0) idle_cv_.notify_all();
}

bool ReplicaPool::waitIdle(milliseconds timeout) {
  std::unique_lock<std::mutex> lock(idle_mu_);
  return idle_cv_.wait_for(lock, timeout, [this] { return internal_inflight_ == 0; });
}

void ReplicaPool::eject(Replica* r, const Status& why) {
  if (r->state != ReplicaState::kHealthy) return;
  r->state = ReplicaState::kEjected;
  r->backoff = options_.probe_backoff_initial;
  r->next_probe = now() + r->backoff;
  r->polled.store(0, std::memory_order_relaxed);
  r->others.store(0, std::memory_order_relaxed);
  r->load_gauge->set(0);
  metrics_->ejections.labels({r->name}).inc();
  log::warn("tulip replica ejected",
            {{"replica", r->name}, {"status", why}, {"reprobe_ms", r->backoff.count()}});
  updateReady();
}

void ReplicaPool::updateReady() {
  bool any = false;
  for (auto& r : replicas_) any = any || r->state == ReplicaState::kHealthy;
  ready_.store(any && spec_ != nullptr, std::memory_order_release);
}

ReplicaPool::Replica* ReplicaPool::pick(const std::vector<const Replica*>& tried, uint64_t tokens,
                                        int method) {
  // [TAG_POOL_PICK_SNAPSHOT] Each candidate's load is read once. release() lowers `outstanding`
  // without mu_ (it runs on reply threads), so reading a load twice, once to find the least and
  // again to choose among the replicas that have it, could find fewer of them the second time,
  // or none (this aborted ivy under ordinary concurrent load). The choice is made on one view of
  // the loads; a load moving right after is a stale view, which balancing tolerates anyway
  // (polled loads are up to load_interval old).
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t best = std::numeric_limits<uint64_t>::max();
  std::vector<Replica*> tied;  // the replicas with load `best`, in pool order
  for (auto& r : replicas_) {
    if (r->state != ReplicaState::kHealthy ||
        std::find(tried.begin(), tried.end(), r.get()) != tried.end()) {
      continue;
    }
    const int64_t o = r->outstanding.load(std::memory_order_relaxed);
    const uint64_t l =
        uint64_t(std::max<int64_t>(o, 0)) + r->others.load(std::memory_order_relaxed);
    if (l < best) {
      best = l;
      tied.clear();
    }
    if (l == best) tied.push_back(r.get());
  }
  if (tied.empty()) return nullptr;
  Replica* chosen = tied[rr_++ % tied.size()];  // ties round-robin
  const int64_t now_out =
      chosen->outstanding.fetch_add(static_cast<int64_t>(tokens), std::memory_order_relaxed) +
      static_cast<int64_t>(tokens);
  if (chosen->load_in_flight) chosen->own_since_poll = std::max(chosen->own_since_poll, now_out);
  chosen->outstanding_gauge->inc(static_cast<double>(tokens));
  chosen->calls_in_flight.fetch_add(1, std::memory_order_acq_rel);
  chosen->calls.fetch_add(1, std::memory_order_relaxed);
  chosen->calls_by_method[method]->inc();
  return chosen;
}

void ReplicaPool::release(Replica* r, uint64_t tokens) {
  r->outstanding.fetch_sub(static_cast<int64_t>(tokens), std::memory_order_relaxed);
  r->outstanding_gauge->dec(static_cast<double>(tokens));
  r->calls_in_flight.fetch_sub(1, std::memory_order_acq_rel);  // last touch
}

void ReplicaPool::onCallFailed(Replica* r, const Status& st) {
  metrics_->failures.labels({r->name, std::string(statusCodeName(st.code()))}).inc();
  if (st.code() != StatusCode::kUnavailable) return;
  std::lock_guard<std::mutex> lock(mu_);
  eject(r, st);
}

std::shared_ptr<const ModelSpec> ReplicaPool::spec() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spec_;
}

std::string ReplicaPool::lastProbeError() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_probe_error_;
}

bool ReplicaPool::waitReady(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!ready()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

void ReplicaPool::modelInfo(milliseconds, ModelInfoDone done) {
  Result<TulipModelInfo> r = unavailable("no tulip replica has reported its model yet");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (spec_ != nullptr) r = model_info_;
  }
  done(std::move(r));
}

void ReplicaPool::health(milliseconds, HealthDone done) {
  done(ready() ? okStatus() : unavailable("no healthy tulip replica (" + endpoint() + ")"));
}

void ReplicaPool::load(milliseconds, LoadDone done) {
  TulipLoad sum;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : replicas_) {
      if (r->state != ReplicaState::kHealthy) continue;
      sum.queued_tokens += r->polled.load(std::memory_order_relaxed);
      sum.worker_ready = true;
    }
  }
  done(sum);
}

std::string ReplicaPool::endpoint() const {
  std::string out;
  for (const TulipEndpoint& ep : endpoints_) {
    if (!out.empty()) out += ",";
    out += ep.entry;
  }
  std::lock_guard<std::mutex> lock(mu_);
  size_t healthy = 0;
  for (auto& r : replicas_) healthy += r->state == ReplicaState::kHealthy;
  return out + ": " + std::to_string(healthy) + "/" + std::to_string(replicas_.size()) +
         " replicas healthy";
}

std::vector<ReplicaPool::ReplicaView> ReplicaPool::replicas() const {
  std::vector<ReplicaView> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : replicas_) {
    ReplicaView v;
    v.address = r->address;
    v.state = r->state;
    v.outstanding_tokens = r->outstanding.load(std::memory_order_relaxed);
    v.polled_load_tokens = r->polled.load(std::memory_order_relaxed);
    v.others_load_tokens = r->others.load(std::memory_order_relaxed);
    v.calls = r->calls.load(std::memory_order_relaxed);
    v.calls_in_flight = r->calls_in_flight.load(std::memory_order_acquire);
    v.backoff = r->backoff;
    out.push_back(std::move(v));
  }
  std::sort(out.begin(), out.end(),
            [](const ReplicaView& a, const ReplicaView& b) { return a.address < b.address; });
  return out;
}

ReplicaClientFactory grpcReplicaFactory() {
  return [](const std::string& address) { return makeGrpcTulipClient(address); };
}

}  // namespace garden::ivy
