#include "services/ivy/balance/tulip_client.h"

#include <grpcpp/grpcpp.h>

#include <cstring>

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
    default:
      return internalError(std::move(m));
  }
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

class GrpcTulipClient final : public TulipClient {
 public:
  explicit GrpcTulipClient(std::string target) : target_(std::move(target)) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);  // a full batch of wide embeddings exceeds the 4 MiB default
    args.SetMaxSendMessageSize(-1);
    // gRPC's default reconnect backoff grows to 120 s; tulip restarting (or starting after ivy)
    // must be noticed within about a second so /ready and requests recover quickly.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // A DNS name with several addresses (a Kubernetes headless Service: one per tulip pod) gets
    // every pod, requests spread round-robin over the ready ones; the name is re-resolved when
    // connections change. (Least-loaded balancing with splitting and retries is the balance/ pool's
    // job once it exists.)
    args.SetLoadBalancingPolicyName("round_robin");
    channel_ = grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(), args);
    tulip_ = v1::Tulip::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
  }

  void embed(EmbedCall call, EmbedDone done) override {
    struct State {
      grpc::ClientContext ctx;
      v1::EmbedRequest req;
      v1::EmbedResponse resp;
      EmbedDone done;
      size_t n = 0;
    };
    auto* st = new State;
    st->done = std::move(done);
    st->n = call.inputs.size();
    if (!call.request_id.empty()) st->ctx.AddMetadata("x-request-id", call.request_id);
    setDeadline(&st->ctx, call.timeout);
    st->req.set_model(call.model);
    st->req.set_normalize(true);
    for (const auto& seq : call.inputs) {
      auto* ts = st->req.add_inputs();
      ts->mutable_ids()->Add(seq.begin(), seq.end());
    }
    tulip_->async()->Embed(&st->ctx, &st->req, &st->resp, [st](grpc::Status s) {
      std::unique_ptr<State> owned(st);
      if (!s.ok()) return owned->done(fromGrpc(s));
      owned->done(decode(owned->resp, owned->n));
    });
  }

  void modelInfo(std::chrono::milliseconds timeout, ModelInfoDone done) override {
    struct State {
      grpc::ClientContext ctx;
      v1::ModelInfoRequest req;
      v1::ModelInfoResponse resp;
      ModelInfoDone done;
    };
    auto* st = new State;
    st->done = std::move(done);
    setDeadline(&st->ctx, timeout);
    tulip_->async()->ModelInfo(&st->ctx, &st->req, &st->resp, [st](grpc::Status s) {
      std::unique_ptr<State> owned(st);
      if (!s.ok()) return owned->done(fromGrpc(s));
      TulipModelInfo info;
      info.model = owned->resp.model();
      info.kind = owned->resp.kind();
      info.hidden_size = owned->resp.hidden_size();
      info.max_seq_len = owned->resp.max_seq_len();
      info.vocab_size = owned->resp.vocab_size();
      owned->done(std::move(info));
    });
  }

  void health(std::chrono::milliseconds timeout, HealthDone done) override {
    struct State {
      grpc::ClientContext ctx;
      grpc::health::v1::HealthCheckRequest req;
      grpc::health::v1::HealthCheckResponse resp;
      HealthDone done;
    };
    auto* st = new State;
    st->done = std::move(done);
    setDeadline(&st->ctx, timeout);
    st->req.set_service("");  // the server as a whole
    health_->async()->Check(&st->ctx, &st->req, &st->resp, [st](grpc::Status s) {
      std::unique_ptr<State> owned(st);
      if (!s.ok()) return owned->done(fromGrpc(s));
      if (owned->resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
        return owned->done(unavailable(
            "tulip: health status " +
            grpc::health::v1::HealthCheckResponse::ServingStatus_Name(owned->resp.status())));
      }
      owned->done(okStatus());
    });
  }

  std::string endpoint() const override { return target_; }

 private:
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
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Tulip::Stub> tulip_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace

std::unique_ptr<TulipClient> makeGrpcTulipClient(const std::string& target) {
  return std::make_unique<GrpcTulipClient>(target);
}

}  // namespace garden::ivy
