#include "services/ivy/balance/tulip_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <utility>

#include "common/logging.h"
#include "common/shm/channel.h"
#include "common/token_file.h"
#include "common/tsan_handoff.h"
#include "garden/v1/garden.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace garden::ivy {

Status fromGrpcCode(int grpc_code, std::string_view message) {
  std::string m = "tulip: ";
  m += message.empty() ? std::string_view("(no message)") : message;
  switch (static_cast<StatusCode>(grpc_code)) {
    case StatusCode::kOk:
      return okStatus();
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return invalidArgument(std::move(m));
    case StatusCode::kResourceExhausted:
      return resourceExhausted(std::move(m));
    case StatusCode::kUnavailable:
    case StatusCode::kAborted:
    case StatusCode::kFailedPrecondition:
      return unavailable(std::move(m));
    case StatusCode::kDeadlineExceeded:
      return deadlineExceeded(std::move(m));
    case StatusCode::kCancelled:
      return cancelledError(std::move(m));
    case StatusCode::kUnauthenticated:
    case StatusCode::kPermissionDenied:
      // [TAG_TULIP_TOKEN] Not the caller's fault and nothing it can fix: ivy and tulip disagree on
      // the token. 503, naming both flags.
      return unavailable("tulip refused ivy's credentials (" +
                         std::string(statusCodeName(static_cast<StatusCode>(grpc_code))) + ": " +
                         std::string(message) +
                         "): ivy's --tulip-token-file must hold a token listed in tulip's "
                         "--auth-token-file");
    default:
      return internalError(std::move(m));
  }
}

ModelSpec makeModelSpec(const TulipModelInfo& info, const std::string& served_model_name) {
  ModelSpec spec;
  spec.upstream_name = info.model;
  spec.served_name = served_model_name.empty() ? info.model : served_model_name;
  spec.kind = info.kind;
  spec.hidden_size = info.hidden_size;
  spec.max_seq_len = info.max_seq_len;
  spec.vocab_size = info.vocab_size;
  spec.has_score_head = info.has_score_head;
  spec.eos_token_ids = info.eos_token_ids;
  spec.created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  return spec;
}

void TulipClient::load(std::chrono::milliseconds, LoadDone done) {
  done(Status(StatusCode::kUnimplemented, "load is not implemented by this client"));
}

void TulipClient::score(ScoreCall, ScoreDone done) {
  done(Status(StatusCode::kUnimplemented, "scoring is not implemented by this client"));
}

std::shared_ptr<GenerateStream> TulipClient::generate(GenerateCall, ChunkFn, StreamDone on_done) {
  on_done(Status(StatusCode::kUnimplemented, "generation is not implemented by this client"));
  return nullptr;
}

namespace {

Status fromGrpc(const grpc::Status& s) {
  return fromGrpcCode(static_cast<int>(s.error_code()), s.error_message());
}

void setDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) ctx->set_deadline(std::chrono::system_clock::now() + timeout);
}

// What every unary call takes besides its request.
struct UnaryOptions {
  std::chrono::milliseconds timeout{0};   // 0 = no deadline
  std::string_view request_id;            // sent as `x-request-id` when not empty
  std::shared_ptr<CallCanceller> cancel;  // optional: cancel() TryCancels the call
  const TokenFile* token = nullptr;       // sent as `authorization: Bearer` when set
  std::string_view target;                // for the log line of a refused token
  std::shared_ptr<grpc::Channel> channel;  // the stub's: the call holds it (see ChannelRef)
};

// A call's own reference to its channel, held by the call's state and released only after the
// call's grpc::ClientContext is destroyed [TAG_TSAN_HANDOFF]. The context holds the channel too,
// but its destructor runs inside libgrpc++, which is not instrumented: when that reference was the
// last one (the client destroyed while the call finished), libgrpc++ decremented the count where
// ThreadSanitizer cannot see the atomic, then freed the count's block by a tail call to operator
// delete, whose return address is in our code, so TSan recorded the free as ours and reported it
// against the client's destructor decrementing the same count on another thread (the intermittent
// ~GenerateReactor report of unit_ivy_chat). With this reference the last decrement is always in
// our instrumented code, which orders it (gRPC allows destroying a channel while calls are in
// flight: every call keeps it alive).
using ChannelRef = std::shared_ptr<grpc::Channel>;

// Adds ivy's token to a call [TAG_TULIP_TOKEN] (read per call: the file may have changed).
void addToken(grpc::ClientContext* ctx, const TokenFile* token) {
  if (token != nullptr) ctx->AddMetadata("authorization", "Bearer " + token->first());
}

// A call tulip refused for the token: logged (at most every 10 s per process), since the caller
// only sees a 503 and the replica pool may only see a failed probe.
void noteRefused(const grpc::Status& s, std::string_view target) {
  if (s.error_code() != grpc::StatusCode::UNAUTHENTICATED &&
      s.error_code() != grpc::StatusCode::PERMISSION_DENIED) {
    return;
  }
  static std::atomic<int64_t> last_ns{0};
  const int64_t now = shm::monotonicNowNs();
  int64_t last = last_ns.load(std::memory_order_relaxed);
  if (last != 0 && now - last < 10'000'000'000) return;
  if (!last_ns.compare_exchange_strong(last, now)) return;
  log::warn("tulip refused ivy's token: check --tulip-token-file against tulip's --auth-token-file",
            {{"tulip", target}, {"message", s.error_message()}});
}

// One unary call on gRPC's callback API [TAG_UNARY_CALL]. The context, request and response live
// in one State shared with the cancel hook (a weak reference: the hook may run while the call
// completes). `fill(Req*)` writes the request; `invoke(ctx, req, resp, on_done)` starts the stub
// method; `decode(const Resp&)` makes what `done` gets on success (a Result<T>, or a Status),
// a failed call gets fromGrpc(status). The State owns itself (`self`) until gRPC's completion
// runs (the callback API always runs it once) and is released before `done` runs.
template <typename Req, typename Resp, typename Invoke, typename Fill, typename Decode,
          typename Done>
void unaryCall(Invoke invoke, UnaryOptions options, Fill fill, Decode decode, Done done) {
  using Out = decltype(decode(std::declval<const Resp&>()));
  struct State {
    ChannelRef channel;  // first member: destroyed after ctx
    grpc::ClientContext ctx;
    Req req;
    Resp resp;
    std::shared_ptr<CallCanceller> cancel;
    uint64_t cancel_hook = 0;
    std::function<void(grpc::Status)> finish;  // the completion, run once
    std::shared_ptr<State> self;               // set from the call's start to its completion
  };
  auto st = std::make_shared<State>();
  st->channel = std::move(options.channel);
  if (!options.request_id.empty()) {
    st->ctx.AddMetadata("x-request-id", std::string(options.request_id));
  }
  addToken(&st->ctx, options.token);
  setDeadline(&st->ctx, options.timeout);
  fill(&st->req);
  if (options.cancel) {
    st->cancel = std::move(options.cancel);
    std::weak_ptr<State> weak = st;
    st->cancel_hook = st->cancel->add([weak] {
      if (auto s = weak.lock()) s->ctx.TryCancel();
    });
  }
  State* raw = st.get();
  raw->finish = [raw, target = options.target, decode = std::move(decode),
                 done = std::move(done)](grpc::Status s) mutable {
    std::shared_ptr<State> st = std::move(raw->self);
    if (st->cancel) st->cancel->remove(st->cancel_hook);
    if (!s.ok()) noteRefused(s, target);
    Out out = s.ok() ? decode(std::as_const(st->resp)) : Out(fromGrpc(s));
    st.reset();
    done(std::move(out));
  };
  // Two owners until the stub call returns: the completion may run (and drop `self`) on gRPC's
  // thread before the stub call is done serializing the request, so the State is destroyed by
  // whichever lets go last (the shared count orders that, also for ThreadSanitizer).
  raw->self = st;
  // Everything above happens-before the completion on gRPC's thread [TAG_TSAN_HANDOFF]. gRPC
  // copies the callback it is given inside the stub call, after this release: a closure of one
  // pointer is stored inside the std::function itself, so that copy touches only gRPC's memory.
  tsanRelease(raw);
  invoke(&raw->ctx, &raw->req, &raw->resp, [raw](grpc::Status s) {
    tsanAcquire(raw);
    auto finish = std::move(raw->finish);  // `finish` releases the State
    finish(std::move(s));
  });
}

// One Generate stream [TAG_GENERATE_STREAM]: a gRPC client read reactor that is also the caller's
// GenerateStream handle. It keeps itself alive (self_) until OnDone, so the caller may drop the
// handle at any time; cancel() after the end is a no-op (TryCancel on a finished call).
class GenerateReactor final : public grpc::ClientReadReactor<v1::GenerateChunk>,
                              public GenerateStream,
                              public std::enable_shared_from_this<GenerateReactor> {
 public:
  GenerateReactor(TulipClient::ChunkFn on_chunk, TulipClient::StreamDone on_done)
      : on_chunk_(std::move(on_chunk)), on_done_(std::move(on_done)) {}

  void start(v1::Tulip::Stub* stub, ChannelRef channel, const GenerateCall& call,
             const TokenFile* token, std::string_view target) {
    channel_ = std::move(channel);
    target_ = target;
    stub_ = stub;
    token_ = token;
    request_id_ = call.request_id;
    if (!call.request_id.empty()) ctx_.AddMetadata("x-request-id", call.request_id);
    addToken(&ctx_, token);
    setDeadline(&ctx_, call.timeout);
    req_.set_model(call.model);
    req_.mutable_prompt_ids()->Add(call.prompt_ids.begin(), call.prompt_ids.end());
    req_.set_max_tokens(call.max_tokens);
    auto* sp = req_.mutable_sampling();
    sp->set_temperature(call.temperature);
    sp->set_top_p(call.top_p);
    sp->set_top_k(call.top_k);
    sp->set_seed(call.seed);
    sp->set_has_seed(call.has_seed);
    sp->set_min_p(call.min_p);
    sp->set_presence_penalty(call.presence_penalty);
    sp->set_frequency_penalty(call.frequency_penalty);
    sp->set_repetition_penalty(call.repetition_penalty);
    for (const auto& [id, bias] : call.logit_bias) {
      v1::LogitBias* b = sp->add_logit_bias();
      b->set_token_id(id);
      b->set_bias(bias);
    }
    sp->set_logprobs(call.logprobs);
    sp->set_top_logprobs(call.top_logprobs);
    req_.mutable_stop_token_ids()->Add(call.stop_token_ids.begin(), call.stop_token_ids.end());
    req_.set_ignore_eos(call.ignore_eos);
    if (call.n > 1) req_.set_n(call.n);
    if (!call.constraint.grammar.empty() || !call.constraint.tools.empty()) {  // [TAG_TOKEN_MASK]
      auto* c = req_.mutable_constraint();
      c->set_grammar(call.constraint.grammar);
      c->set_channel_token(call.constraint.channel_token);
      c->mutable_channel_prefix()->Add(call.constraint.channel_prefix.begin(),
                                       call.constraint.channel_prefix.end());
      c->set_message_token(call.constraint.message_token);
      c->mutable_end_tokens()->Add(call.constraint.end_tokens.begin(),
                                   call.constraint.end_tokens.end());
      for (const auto& t : call.constraint.tools) {  // [TAG_STRICT_TOOLS]
        v1::ToolConstraint* tc = c->add_tools();
        tc->set_name(t.name);
        tc->set_grammar(t.grammar);
      }
      if (!call.constraint.tools.empty()) {
        const auto& h = call.constraint.harmony;
        v1::HarmonyTokenIds* hp = c->mutable_harmony();
        hp->set_start(h.start);
        hp->set_channel(h.channel);
        hp->set_constrain(h.constrain);
        hp->set_message(h.message);
        hp->set_end(h.end);
        hp->set_call(h.call);
        hp->set_ret(h.ret);
        hp->set_end_of_text(h.end_of_text);
        c->mutable_turn_prefix()->Add(call.constraint.turn_prefix.begin(),
                                      call.constraint.turn_prefix.end());
      }
    }
    self_ = shared_from_this();
    stub->async()->Generate(&ctx_, &req_, this);  // binds this reactor to the call
    StartRead(&chunk_);
    // gRPC runs OnReadDone/OnDone on its own threads once the call starts [TAG_TSAN_HANDOFF].
    tsanRelease(this);
    StartCall();
  }

  void cancel() override { ctx_.TryCancel(); }

  // [TAG_STOP_CHOICE] A unary StopChoice on the same channel (so the same tulip), naming the call
  // by the id of its first chunk; before that chunk there is nothing to stop by name (and no
  // output for a stop string to match).
  void stopChoice(uint32_t index) override {
    const uint64_t call_id = call_id_.load(std::memory_order_acquire);
    if (call_id == 0) return;
    unaryCall<v1::StopChoiceRequest, v1::StopChoiceResponse>(
        [stub = stub_](auto* ctx, auto* req, auto* resp, auto on_done) {
          stub->async()->StopChoice(ctx, req, resp, std::move(on_done));
        },
        UnaryOptions{std::chrono::milliseconds(5000), request_id_, nullptr, token_, target_,
                     channel_},
        [call_id, index](v1::StopChoiceRequest* req) {
          req->set_call_id(call_id);
          req->set_index(index);
        },
        [](const v1::StopChoiceResponse&) { return okStatus(); },
        [index, rid = request_id_](Status st) {
          // Not the request's failure: the choice is complete in ivy either way, and NOT_FOUND
          // just means the call ended meanwhile.
          if (!st.isOk())
            log::debug(
                "StopChoice failed",
                {{"request_id", rid}, {"index", static_cast<uint64_t>(index)}, {"status", st}});
        });
  }

  void OnReadDone(bool ok) override {
    tsanAcquire(this);
    if (!ok) return;  // end of stream or failure: OnDone follows
    GenerateChunkMsg m;
    m.index = chunk_.index();
    m.token_ids.assign(chunk_.token_ids().begin(), chunk_.token_ids().end());
    m.logprobs.reserve(static_cast<size_t>(chunk_.logprobs_size()));
    for (const v1::TokenLogprobs& t : chunk_.logprobs()) {
      llm::LlmTokenLogprobs lp;
      lp.logprob = t.logprob();
      const int n = std::min({t.top_ids_size(), t.top_logprobs_size(), llm::kMaxTopLogprobs});
      lp.num_top = n;
      for (int j = 0; j < n; ++j) {
        lp.top_ids[j] = t.top_ids(j);
        lp.top_logprobs[j] = t.top_logprobs(j);
      }
      m.logprobs.push_back(lp);
    }
    switch (chunk_.finish_reason()) {
      case v1::FINISH_STOP:
        m.finish = FinishReason::kStop;
        break;
      case v1::FINISH_LENGTH:
        m.finish = FinishReason::kLength;
        break;
      case v1::FINISH_CANCELLED:
        m.finish = FinishReason::kCancelled;
        break;
      default:
        m.finish = FinishReason::kNone;
        break;
    }
    m.prompt_tokens = chunk_.prompt_tokens();
    m.cached_prompt_tokens = chunk_.cached_prompt_tokens();
    m.completion_tokens = chunk_.completion_tokens();
    m.queue_us = chunk_.timings().queue_us();
    m.total_us = chunk_.timings().total_us();
    if (chunk_.call_id() != 0) call_id_.store(chunk_.call_id(), std::memory_order_release);
    on_chunk_(std::move(m));
    tsanRelease(this);
    StartRead(&chunk_);
  }

  void OnDone(const grpc::Status& s) override {
    tsanAcquire(this);
    if (!s.ok()) noteRefused(s, target_);
    on_done_(s.ok() ? okStatus() : fromGrpc(s));
    on_chunk_ = nullptr;
    on_done_ = nullptr;
    auto keep = std::move(self_);  // may destroy *this when it goes out of scope
  }

 private:
  ChannelRef channel_;  // declared before ctx_: released after it
  grpc::ClientContext ctx_;
  v1::GenerateRequest req_;
  v1::GenerateChunk chunk_;
  TulipClient::ChunkFn on_chunk_;
  TulipClient::StreamDone on_done_;
  std::shared_ptr<GenerateReactor> self_;
  std::string_view target_;  // the client's (it outlives its calls)
  v1::Tulip::Stub* stub_ = nullptr;   // the client's (it outlives its calls)
  const TokenFile* token_ = nullptr;  // the client's
  std::string request_id_;
  std::atomic<uint64_t> call_id_{0};  // GenerateChunk.call_id of the first chunk [TAG_STOP_CHOICE]
};

class GrpcTulipClient final : public TulipClient {
 public:
  GrpcTulipClient(std::string target, std::shared_ptr<const TokenFile> token)
      : target_(std::move(target)), token_(std::move(token)) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);  // a full batch of wide embeddings exceeds the 4 MiB default
    args.SetMaxSendMessageSize(-1);
    // gRPC's default reconnect backoff grows to 120 s; tulip restarting (or starting after ivy)
    // must be noticed within about a second so /ready and requests recover quickly: retries
    // start 100 ms apart and grow to 1 s. GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is, in gRPC's
    // subchannel, the least time one connection attempt is given (TCP connect and the HTTP/2
    // SETTINGS exchange), not a retry interval: at 100 ms a loaded host failed its calls with
    // "connection attempt timed out before receiving SETTINGS frame"
    // (TulipClientTest.SlowHandshakeStillConnects). A refused connection still fails at once.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 3000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // ivy's ReplicaPool gives each client one address (it resolves DNS names itself and balances
    // by load); a target with several addresses still spreads round-robin over the ready ones.
    args.SetLoadBalancingPolicyName("round_robin");
    channel_ = grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(), args);
    tulip_ = v1::Tulip::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
  }

  void embed(EmbedCall call, EmbedDone done) override {
    const size_t n = call.inputs.size();
    unaryCall<v1::EmbedRequest, v1::EmbedResponse>(
        [this](auto* ctx, auto* req, auto* resp, auto on_done) {
          tulip_->async()->Embed(ctx, req, resp, std::move(on_done));
        },
        options(call.timeout, call.request_id, std::move(call.cancel)),
        [&call](v1::EmbedRequest* req) {
          req->set_model(call.model);
          req->set_normalize(true);
          for (const auto& seq : call.inputs) {
            req->add_inputs()->mutable_ids()->Add(seq.begin(), seq.end());
          }
        },
        [n](const v1::EmbedResponse& resp) { return decode(resp, n); }, std::move(done));
  }

  // Score: the same shape as embed(), with the yes/no ids (or -1/-1 for the classification head)
  // and one float per input back.
  void score(ScoreCall call, ScoreDone done) override {
    const size_t n = call.inputs.size();
    unaryCall<v1::ScoreRequest, v1::ScoreResponse>(
        [this](auto* ctx, auto* req, auto* resp, auto on_done) {
          tulip_->async()->Score(ctx, req, resp, std::move(on_done));
        },
        options(call.timeout, call.request_id, std::move(call.cancel)),
        [&call](v1::ScoreRequest* req) {
          req->set_model(call.model);
          req->set_yes_token(call.yes_token);
          req->set_no_token(call.no_token);
          for (const auto& seq : call.inputs) {
            req->add_inputs()->mutable_ids()->Add(seq.begin(), seq.end());
          }
        },
        [n](const v1::ScoreResponse& resp) { return decodeScore(resp, n); }, std::move(done));
  }

  void load(std::chrono::milliseconds timeout, LoadDone done) override {
    unaryCall<v1::LoadRequest, v1::LoadResponse>(
        [this](auto* ctx, auto* req, auto* resp, auto on_done) {
          tulip_->async()->Load(ctx, req, resp, std::move(on_done));
        },
        options(timeout), [](v1::LoadRequest*) {},
        [](const v1::LoadResponse& resp) -> Result<TulipLoad> {
          TulipLoad l;
          l.queued_requests = resp.queued_requests();
          l.queued_tokens = resp.queued_tokens();
          l.inflight_tokens = resp.inflight_tokens();
          l.queue_limit_tokens = resp.queue_limit_tokens();
          l.worker_ready = resp.worker_ready();
          return l;
        },
        std::move(done));
  }

  std::shared_ptr<GenerateStream> generate(GenerateCall call, ChunkFn on_chunk,
                                           StreamDone on_done) override {
    auto r = std::make_shared<GenerateReactor>(std::move(on_chunk), std::move(on_done));
    r->start(tulip_.get(), channel_, call, token_.get(), target_);
    return r;
  }

  void modelInfo(std::chrono::milliseconds timeout, ModelInfoDone done) override {
    unaryCall<v1::ModelInfoRequest, v1::ModelInfoResponse>(
        [this](auto* ctx, auto* req, auto* resp, auto on_done) {
          tulip_->async()->ModelInfo(ctx, req, resp, std::move(on_done));
        },
        options(timeout), [](v1::ModelInfoRequest*) {},
        [](const v1::ModelInfoResponse& resp) -> Result<TulipModelInfo> {
          TulipModelInfo info;
          info.model = resp.model();
          info.kind = resp.kind();
          info.hidden_size = resp.hidden_size();
          info.max_seq_len = resp.max_seq_len();
          info.vocab_size = resp.vocab_size();
          info.has_score_head = resp.has_score_head();
          info.eos_token_ids.assign(resp.eos_token_ids().begin(), resp.eos_token_ids().end());
          return info;
        },
        std::move(done));
  }

  void health(std::chrono::milliseconds timeout, HealthDone done) override {
    using grpc::health::v1::HealthCheckResponse;
    unaryCall<grpc::health::v1::HealthCheckRequest, HealthCheckResponse>(
        [this](auto* ctx, auto* req, auto* resp, auto on_done) {
          health_->async()->Check(ctx, req, resp, std::move(on_done));
        },
        options(timeout),
        [](grpc::health::v1::HealthCheckRequest* req) { req->set_service(""); },  // the server
        [](const HealthCheckResponse& resp) -> Status {
          if (resp.status() != HealthCheckResponse::SERVING) {
            return unavailable("tulip: health status " +
                               HealthCheckResponse::ServingStatus_Name(resp.status()));
          }
          return okStatus();
        },
        std::move(done));
  }

  std::string endpoint() const override { return target_; }

 private:
  UnaryOptions options(std::chrono::milliseconds timeout, std::string_view request_id = {},
                       std::shared_ptr<CallCanceller> cancel = nullptr) const {
    return UnaryOptions{timeout, request_id, std::move(cancel), token_.get(), target_, channel_};
  }

  static Result<ScoreReply> decodeScore(const v1::ScoreResponse& resp, size_t n) {
    if (static_cast<size_t>(resp.scores_size()) != n) {
      return internalError("tulip: returned " + std::to_string(resp.scores_size()) +
                           " scores for " + std::to_string(n) + " inputs");
    }
    ScoreReply r;
    r.scores.assign(resp.scores().begin(), resp.scores().end());
    r.prompt_tokens = resp.prompt_tokens();
    r.queue_us = resp.timings().queue_us();
    r.inference_us = resp.timings().inference_us();
    r.total_us = resp.timings().total_us();
    return r;
  }

  static Result<EmbedReply> decode(const v1::EmbedResponse& resp, size_t n) {
    if (static_cast<size_t>(resp.embeddings_size()) != n) {
      return internalError("tulip: returned " + std::to_string(resp.embeddings_size()) +
                           " embeddings for " + std::to_string(n) + " inputs");
    }
    if (resp.dim() == 0) return internalError("tulip: returned dim 0");
    EmbedReply r;
    r.dim = resp.dim();
    r.prompt_tokens = resp.prompt_tokens();
    r.queue_us = resp.timings().queue_us();
    r.inference_us = resp.timings().inference_us();
    r.total_us = resp.timings().total_us();
    const size_t row_bytes = size_t(r.dim) * sizeof(float);
    r.values.resize(n * r.dim);
    for (size_t i = 0; i < n; ++i) {
      const std::string& b = resp.embeddings(static_cast<int>(i));
      if (b.size() != row_bytes) {
        return internalError("tulip: embedding " + std::to_string(i) + " has " +
                             std::to_string(b.size()) + " bytes, expected " +
                             std::to_string(row_bytes));
      }
      // Little-endian float32 on the wire; hosts are little-endian (checked in api/embeddings).
      std::memcpy(r.values.data() + i * r.dim, b.data(), row_bytes);
    }
    return r;
  }

  std::string target_;
  std::shared_ptr<const TokenFile> token_;  // ivy's --tulip-token-file; null: no token sent
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Tulip::Stub> tulip_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace

std::unique_ptr<TulipClient> makeGrpcTulipClient(const std::string& target,
                                                 std::shared_ptr<const TokenFile> token) {
  return std::make_unique<GrpcTulipClient>(target, std::move(token));
}

}  // namespace garden::ivy
