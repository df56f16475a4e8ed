#pragma once
// ReplicaPool: ivy's view of every tulip replica, itself a TulipClient so the HTTP layer calls it
// like one tulip. It
//   * finds replicas from static addresses and DNS names (re-resolved every resolve_interval; a
//     Kubernetes headless Service gives one address per pod), one TulipClient (gRPC channel) per
//     address; a new address is probed (grpc.health.v1 + ModelInfo) before it gets traffic, an
//     address gone from DNS is drained (no new calls) and dropped once its calls finish;
//   * balances: load of a replica = tokens ivy sent it and has not had back + the queued and
//     in-flight tokens of its last Load poll less the part of them that were ivy's own calls
//     (tulip counts those too); each call or chunk goes to the least-loaded healthy replica (ties
//     round-robin);
//   * splits an Embed/Score call larger than split_max_tokens / split_max_inputs into contiguous
//     chunks sent concurrently and reassembles them in input order (usage summed, stage timings
//     the max over chunks); Generate is never split;
//   * retries: a chunk failing UNAVAILABLE (tulip down, rose restarting, transport failure) is sent
//     again to another replica, up to max_retries times, with the remaining deadline; a chunk
//     refused RESOURCE_EXHAUSTED tries every other healthy replica once before the call gets
//     RESOURCE_EXHAUSTED (→ 429). Generate retries only while no chunk has reached the caller.
//     One chunk failing for good fails the whole call with its error and cancels the others;
//   * cancels: the caller's EmbedCall/ScoreCall::cancel (ivy fires it when the HTTP client goes
//     away [TAG_CLIENT_DISCONNECT]) cancels every chunk in flight and stops retries and further
//     attempts; the call ends CANCELLED. Chunks cancelled this way are not replica failures;
//   * ejects a replica whose call failed UNAVAILABLE or whose health check failed, and re-probes it
//     with exponential backoff (probe_backoff_initial doubling up to probe_backoff_max; a replica
//     not yet healthy since it appeared doubles only up to 5 × probe_backoff_initial);
//   * keeps every replica on one model: the first ModelInfo defines it (makeModelSpec,
//     tulip_client.h); a replica reporting another model name, kind or width is not used
//     (logged, counted, re-checked at probe_backoff_max). When no healthy replica of that model is
//     left, a healthy replica of another model redefines it (a redeploy).
//   ready() is true while the model is known and at least one replica is healthy.
//
// Metrics (registry given at creation): ivy_replicas{state}, ivy_replica_outstanding_tokens
// {replica}, ivy_replica_load_tokens{replica}, ivy_replica_calls_total{replica,method} (every call
// or chunk sent), ivy_replica_failures_total{replica,code}, ivy_pool_retries_total{method},
// ivy_pool_ejections_total{replica}, ivy_pool_splits_total{method}, ivy_pool_chunks_total{method},
// ivy_pool_model_mismatch_total{replica}, ivy_pool_no_replica_total{method}.
//
// Threads: embed/score/generate/spec/ready may be called from any thread; nothing blocks on the
// network. `done` runs on a replica client's thread, or inline when the call fails at once (no
// healthy replica, deadline already spent). Two background threads after start(): maintenance
// (probes, health checks, Load polls, draining) and, with DNS names, the resolver. Tests may
// instead drive maintainOnce() and resolveOnce() themselves with an injected clock. The pool owns
// its replicas' clients; calls in flight must finish before the pool is destroyed (ivy drains HTTP
// first).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/registry.h"
#include "common/status.h"
#include "services/ivy/api/model_spec.h"
#include "services/ivy/balance/endpoints.h"
#include "services/ivy/balance/tulip_client.h"

namespace garden::ivy {

struct ReplicaPoolOptions {
  std::string served_model_name;                     // empty: the replicas' model name
  std::chrono::milliseconds resolve_interval{5000};  // DNS names; 0: resolve once at start
  std::chrono::milliseconds health_interval{1000};   // health check of a healthy replica
  std::chrono::milliseconds load_interval{200};      // Load poll of a healthy replica
  std::chrono::milliseconds rpc_timeout{2000};       // probes, ModelInfo, Load
  std::chrono::milliseconds probe_backoff_initial{100};
  std::chrono::milliseconds probe_backoff_max{5000};
  std::chrono::milliseconds tick{20};  // maintenance period
  uint64_t split_max_tokens = 4096;    // chunk token budget; 0: no token budget
  uint64_t split_max_inputs = 128;     // chunk input budget; 0: no input budget
  uint32_t max_retries = 1;            // UNAVAILABLE: other replicas tried per chunk / stream
  // Time source for probes, backoff and deadlines (tests inject a manual clock).
  std::function<std::chrono::steady_clock::time_point()> now;
};

// Makes the client of one replica address (a gRPC target naming one address).
using ReplicaClientFactory =
    std::function<std::unique_ptr<TulipClient>(const std::string& address)>;

enum class ReplicaState { kProbing, kHealthy, kEjected, kMismatch, kDraining };
std::string_view replicaStateName(ReplicaState s);  // "probing", "healthy", ...

class ReplicaPool final : public TulipClient {
 public:
  // INVALID_ARGUMENT for bad options (no endpoints, zero intervals). `factory` and `resolver`
  // default to gRPC clients and resolveSystem; `registry` to the global one.
  static Result<std::unique_ptr<ReplicaPool>> create(std::vector<TulipEndpoint> endpoints,
                                                     ReplicaPoolOptions options,
                                                     ReplicaClientFactory factory = nullptr,
                                                     Resolver resolver = nullptr,
                                                     metrics::Registry* registry = nullptr);
  ~ReplicaPool() override;  // stop()
  ReplicaPool(const ReplicaPool&) = delete;
  ReplicaPool& operator=(const ReplicaPool&) = delete;

  // Starts the background threads (resolves DNS names, probes every replica). Once.
  void start();
  // Stops the threads and waits for the pool's own probes and polls to finish.
  void stop();

  // --- TulipClient ---
  void embed(EmbedCall call, EmbedDone done) override;
  void score(ScoreCall call, ScoreDone done) override;
  std::shared_ptr<GenerateStream> generate(GenerateCall call, ChunkFn on_chunk,
                                           StreamDone on_done) override;
  // The pool's model (UNAVAILABLE while unknown); health: OK when ready().
  void modelInfo(std::chrono::milliseconds timeout, ModelInfoDone done) override;
  void health(std::chrono::milliseconds timeout, HealthDone done) override;
  // Sum over healthy replicas of their last polled load.
  void load(std::chrono::milliseconds timeout, LoadDone done) override;
  std::string endpoint() const override;

  // --- the served model (IvyService reads it through a ModelSource) ---
  std::shared_ptr<const ModelSpec> spec() const;
  // "<replica>: <message>" of the last failed probe since the pool last had a model; "" if none.
  std::string lastProbeError() const;
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  bool waitReady(std::chrono::milliseconds timeout);  // polls ready() (tests, startup)

  // --- introspection and manual driving (tests) ---
  struct ReplicaView {
    std::string address;
    ReplicaState state = ReplicaState::kProbing;
    int64_t outstanding_tokens = 0;
    uint64_t polled_load_tokens = 0;
    uint64_t others_load_tokens = 0;  // polled less this ivy's own calls: what pick() adds
    uint64_t calls = 0;  // calls and chunks sent
    int64_t calls_in_flight = 0;  // picked, not yet released
    std::chrono::milliseconds backoff{0};
  };
  std::vector<ReplicaView> replicas() const;  // sorted by address
  // One maintenance pass at now(): starts due probes, health checks and Load polls; drops drained
  // replicas; updates gauges.
  void maintainOnce();
  // Resolves every DNS endpoint now (blocking on the resolver) and applies the result.
  void resolveOnce();
  // Waits until none of the pool's own probes / polls is in flight (tests).
  bool waitIdle(std::chrono::milliseconds timeout);

  struct Replica;  // defined in the .cc

 private:
  struct Metrics;
  template <typename Traits>
  class SplitOp;     // one Embed/Score call: chunks, retries, reassembly
  class PoolStream;  // one Generate call: replica choice and retry before the first chunk

  ReplicaPool(std::vector<TulipEndpoint> endpoints, ReplicaPoolOptions options,
              ReplicaClientFactory factory, Resolver resolver, metrics::Registry* registry);

  std::chrono::steady_clock::time_point now() const { return options_.now(); }

  // Least-loaded healthy replica not in `tried` (ties round-robin), with `tokens` added to its
  // outstanding count and one call counted in flight; nullptr when none. Pair with release().
  // Decides on one read of each load ([TAG_POOL_PICK_SNAPSHOT]: release() takes no lock).
  // `method`: 0 Embed, 1 Score, 2 Generate (the per-replica call counters).
  Replica* pick(const std::vector<const Replica*>& tried, uint64_t tokens, int method);
  void release(Replica* r, uint64_t tokens);
  // A call on `r` failed with `st`: UNAVAILABLE ejects it. Counts the failure.
  void onCallFailed(Replica* r, const Status& st);
  void eject(Replica* r, const Status& why);  // mu_ held

  void applyResolved(const TulipEndpoint& ep, const std::vector<std::string>& addresses);
  void addReplica(const std::string& address, const std::string& source);  // mu_ held
  void startProbe(Replica* r);
  void onProbeDone(Replica* r, Status st, TulipModelInfo info);
  void onHealthDone(Replica* r, Status st);
  void onLoadDone(Replica* r, Result<TulipLoad> load);
  void internalDone();
  void updateReady();  // mu_ held
  void run();
  void runResolver();

  const std::vector<TulipEndpoint> endpoints_;
  const ReplicaPoolOptions options_;
  const ReplicaClientFactory factory_;
  const Resolver resolver_;
  std::unique_ptr<Metrics> metrics_;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Replica>> replicas_;  // guarded by mu_
  std::shared_ptr<const ModelSpec> spec_;           // guarded by mu_
  TulipModelInfo model_info_;                       // guarded by mu_ (valid when spec_)
  std::string last_probe_error_;                    // guarded by mu_
  uint64_t rr_ = 0;                                 // guarded by mu_
  std::atomic<bool> ready_{false};

  std::mutex run_mu_;
  std::condition_variable run_cv_;
  bool stopping_ = false;  // guarded by run_mu_
  bool started_ = false;   // guarded by run_mu_
  std::thread thread_;
  std::thread resolver_thread_;

  std::mutex idle_mu_;
  std::condition_variable idle_cv_;
  int internal_inflight_ = 0;  // guarded by idle_mu_: probes, health checks, Load polls
};

// The default factory: makeGrpcTulipClient per address.
ReplicaClientFactory grpcReplicaFactory();

}  // namespace garden::ivy
