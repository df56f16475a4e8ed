// The gRPC driver (tulip): closed-loop clients on gRPC's sync or callback API. See driver.h.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "bench/loadgen/driver.h"
#include "garden/v1/garden.grpc.pb.h"

namespace garden::bench {

namespace v1 = garden::v1;
using Clock = std::chrono::steady_clock;

PhaseGate::PhaseGate(const PhaseSpec& spec)
    : by_count_(spec.count > 0),
      left_(static_cast<int64_t>(spec.count)),
      deadline_(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(spec.duration_s))) {}

bool PhaseGate::claim() {
  if (by_count_) return left_.fetch_sub(1, std::memory_order_relaxed) > 0;
  return Clock::now() < deadline_;
}

namespace {

std::string codeName(grpc::StatusCode c) {
  return std::string(statusCodeName(static_cast<StatusCode>(static_cast<int>(c))));
}

std::shared_ptr<grpc::Channel> makeChannel(const std::string& endpoint, int index) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // A distinct channel (own TCP connection) per index: no subchannel sharing.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("garden.loadgen.channel", index);
  return grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args);
}

struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  int active = 0;
  Clock::time_point last_done;
};

// One closed-loop client. Its calls are strictly sequential, so its Recorder needs no lock.
class Client {
 public:
  Client(const DriverConfig& cfg, v1::Tulip::Stub* stub, const std::vector<v1::EmbedRequest>* embed,
         const std::vector<v1::ScoreRequest>* score, size_t first)
      : cfg_(cfg), stub_(stub), embed_(embed), score_(score), next_(first) {}

  ~Client() {
    if (thread_.joinable()) thread_.join();
  }

  void start(PhaseGate* gate, Shared* shared) {
    gate_ = gate;
    shared_ = shared;
    rec_ = Recorder();
    if (thread_.joinable()) thread_.join();  // the previous phase's thread has finished
    if (cfg_.grpc_api == GrpcApi::kSync) {
      thread_ = std::thread([this] { runBlocking(); });
      return;
    }
    if (!gate_->claim()) {
      finish();
      return;
    }
    issue();
  }
  Recorder& recorder() { return rec_; }

 private:
  size_t poolSize() const { return cfg_.mode == Mode::kEmbed ? embed_->size() : score_->size(); }

  // Picks the next payload of this client and a fresh context; returns the pool index.
  size_t prepare() {
    ctx_ = std::make_unique<grpc::ClientContext>();
    ctx_->set_deadline(std::chrono::system_clock::now() + cfg_.timeout);
    size_t i = next_ % poolSize();
    next_ += static_cast<size_t>(cfg_.concurrency);
    expect_ = cfg_.mode == Mode::kEmbed ? (*embed_)[i].inputs_size() : (*score_)[i].inputs_size();
    return i;
  }

  // GrpcApi::kCallback: the next call is issued from the completion callback.
  void issue() {
    const size_t i = prepare();
    t0_ = Clock::now();
    if (cfg_.mode == Mode::kEmbed) {
      stub_->async()->Embed(ctx_.get(), &(*embed_)[i], &embed_resp_,
                            [this](grpc::Status s) { done(s); });
    } else {
      stub_->async()->Score(ctx_.get(), &(*score_)[i], &score_resp_,
                            [this](grpc::Status s) { done(s); });
    }
  }

  void done(const grpc::Status& s) {
    record(s);
    if (gate_->claim()) {
      issue();
    } else {
      finish();
    }
  }

  // GrpcApi::kSync: this client's own thread makes blocking calls back to back.
  void runBlocking() {
    while (gate_->claim()) {
      const size_t i = prepare();
      t0_ = Clock::now();
      grpc::Status s = cfg_.mode == Mode::kEmbed
                           ? stub_->Embed(ctx_.get(), (*embed_)[i], &embed_resp_)
                           : stub_->Score(ctx_.get(), (*score_)[i], &score_resp_);
      record(s);
    }
    finish();
  }

  void record(const grpc::Status& s) {
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
    if (!s.ok()) {
      rec_.failure(codeName(s.error_code()), s.error_message());
    } else {
      const v1::Timings* t = nullptr;
      int got = 0;
      uint64_t tokens = 0;
      if (cfg_.mode == Mode::kEmbed) {
        got = embed_resp_.embeddings_size();
        tokens = embed_resp_.prompt_tokens();
        t = &embed_resp_.timings();
      } else {
        got = score_resp_.scores_size();
        tokens = score_resp_.prompt_tokens();
        t = &score_resp_.timings();
      }
      if (got != expect_) {
        rec_.failure("BAD_RESPONSE", "expected " + std::to_string(expect_) + " results, got " +
                                         std::to_string(got));
      } else {
        rec_.success(ms);
        rec_.items += static_cast<uint64_t>(got);
        rec_.tokens += tokens;
        rec_.server_queue_us.push_back(static_cast<double>(t->queue_us()));
        rec_.server_inference_us.push_back(static_cast<double>(t->inference_us()));
        rec_.server_total_us.push_back(static_cast<double>(t->total_us()));
      }
    }
  }

  void finish() {
    std::lock_guard<std::mutex> l(shared_->mu);
    shared_->last_done = Clock::now();
    if (--shared_->active == 0) shared_->cv.notify_all();
  }

  const DriverConfig& cfg_;
  v1::Tulip::Stub* stub_;
  const std::vector<v1::EmbedRequest>* embed_;
  const std::vector<v1::ScoreRequest>* score_;
  size_t next_;
  int expect_ = 0;
  PhaseGate* gate_ = nullptr;
  Shared* shared_ = nullptr;
  Recorder rec_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  v1::EmbedResponse embed_resp_;
  v1::ScoreResponse score_resp_;
  Clock::time_point t0_;
  std::thread thread_;  // GrpcApi::kSync
};

class GrpcDriver : public Driver {
 public:
  explicit GrpcDriver(const DriverConfig& cfg) : cfg_(cfg) {}

  Status init(std::vector<Payload> pool) {
    if (cfg_.mode == Mode::kChat) return unimplemented("chat over gRPC is not supported; use http");
    if (cfg_.input != InputKind::kTokens) return invalidArgument("gRPC takes token inputs only");
    for (auto& p : pool) {
      if (cfg_.mode == Mode::kEmbed) {
        v1::EmbedRequest r;
        r.set_model(cfg_.model);
        r.set_normalize(true);
        for (auto& s : p.token_inputs) r.add_inputs()->mutable_ids()->Add(s.begin(), s.end());
        embed_.push_back(std::move(r));
      } else {
        v1::ScoreRequest r;
        r.set_model(cfg_.model);
        r.set_yes_token(cfg_.yes_token);
        r.set_no_token(cfg_.no_token);
        for (auto& s : p.token_inputs) r.add_inputs()->mutable_ids()->Add(s.begin(), s.end());
        score_.push_back(std::move(r));
      }
    }
    if (embed_.empty() && score_.empty()) return invalidArgument("empty request pool");
    int nch = cfg_.channels > 0 ? cfg_.channels : cfg_.concurrency;
    for (int i = 0; i < nch; ++i) {
      channels_.push_back(makeChannel(cfg_.endpoint, i));
      stubs_.push_back(v1::Tulip::NewStub(channels_.back()));
    }
    for (int i = 0; i < cfg_.concurrency; ++i) {
      clients_.push_back(
          std::make_unique<Client>(cfg_, stubs_[static_cast<size_t>(i) % stubs_.size()].get(),
                                   &embed_, &score_, static_cast<size_t>(i)));
    }
    return okStatus();
  }

  Result<PhaseResult> run(const PhaseSpec& phase) override {
    PhaseGate gate(phase);
    Shared shared;
    shared.active = cfg_.concurrency;
    auto t0 = Clock::now();
    for (auto& c : clients_) c->start(&gate, &shared);
    {
      std::unique_lock<std::mutex> l(shared.mu);
      shared.cv.wait(l, [&] { return shared.active == 0; });
    }
    PhaseResult r;
    r.wall_s = std::chrono::duration<double>(shared.last_done - t0).count();
    for (auto& c : clients_) r.rec.merge(c->recorder());
    return r;
  }

 private:
  DriverConfig cfg_;
  std::vector<v1::EmbedRequest> embed_;
  std::vector<v1::ScoreRequest> score_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Tulip::Stub>> stubs_;
  std::vector<std::unique_ptr<Client>> clients_;
};

}  // namespace

Result<std::unique_ptr<Driver>> makeGrpcDriver(const DriverConfig& config,
                                               std::vector<Payload> pool) {
  auto d = std::make_unique<GrpcDriver>(config);
  RETURN_IF_ERROR(d->init(std::move(pool)));
  return std::unique_ptr<Driver>(std::move(d));
}

Result<ServedModel> grpcModelInfo(const std::string& endpoint, std::chrono::milliseconds timeout) {
  auto stub = v1::Tulip::NewStub(makeChannel(endpoint, -1));
  // Waits for the server within `timeout`: wait_for_ready covers a tulip that is not listening
  // yet, the retry a tulip that listens but answers UNAVAILABLE while its worker starts.
  const auto deadline = std::chrono::system_clock::now() + timeout;
  v1::ModelInfoResponse resp;
  grpc::Status s;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    ctx.set_wait_for_ready(true);
    s = stub->ModelInfo(&ctx, v1::ModelInfoRequest(), &resp);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE ||
        std::chrono::system_clock::now() + std::chrono::milliseconds(50) >= deadline) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!s.ok())
    return Status(static_cast<StatusCode>(static_cast<int>(s.error_code())),
                  "ModelInfo from " + endpoint + ": " + s.error_message());
  ServedModel m;
  m.name = resp.model();
  m.kind = resp.kind();
  m.hidden_size = resp.hidden_size();
  m.max_seq_len = resp.max_seq_len();
  m.vocab_size = resp.vocab_size();
  m.has_score_head = resp.has_score_head();
  return m;
}

}  // namespace garden::bench
