#pragma once
// TulipMonitor: learns the served model from tulip and tracks whether tulip is healthy, which is
// what ivy's /ready reports. One background thread: until ModelInfo succeeds it retries every
// `retry_interval`; after that it runs a health check every `health_interval` and re-fetches
// ModelInfo whenever health recovers (tulip may have restarted). ready() is true only while a
// ModelSpec is known and the last health check passed.
//
// spec() and ready() may be called from any thread (HTTP io threads call them per request). The
// monitor does not own the client; the client must outlive the monitor.
//
// With a ReplicaPool (balance/replica_pool.h, what the ivy binary uses) the monitor is a view of
// the pool: spec() and ready() are the pool's (ready while any replica is healthy), start() and
// stop() do nothing; the pool probes every replica itself.

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "services/ivy/api/model_spec.h"
#include "services/ivy/balance/tulip_client.h"

namespace garden::ivy {

class ReplicaPool;

// ModelInfo → ModelSpec (served_name: --served-model-name, empty = the model's own name).
ModelSpec makeModelSpec(const TulipModelInfo& info, const std::string& served_model_name);

struct TulipMonitorOptions {
  std::string served_model_name;  // empty: use tulip's model name
  std::chrono::milliseconds retry_interval{500};
  std::chrono::milliseconds health_interval{1000};
  std::chrono::milliseconds rpc_timeout{2000};
};

class TulipMonitor {
 public:
  TulipMonitor(TulipClient* client, TulipMonitorOptions options);
  // A view of `pool`, which must outlive the monitor.
  explicit TulipMonitor(const ReplicaPool* pool);
  ~TulipMonitor();  // stops and joins
  TulipMonitor(const TulipMonitor&) = delete;
  TulipMonitor& operator=(const TulipMonitor&) = delete;

  void start();
  void stop() EXCLUDES(mu_);

  // The model, or nullptr before ModelInfo first succeeded.
  std::shared_ptr<const ModelSpec> spec() const EXCLUDES(mu_);
  bool ready() const;
  // Blocks until ready or the timeout passes; returns ready(). For tests and startup logs.
  bool waitReady(std::chrono::milliseconds timeout);

 private:
  void run() EXCLUDES(mu_);
  bool fetchModelInfo() EXCLUDES(mu_);  // true on success
  Status checkHealth();

  TulipClient* client_;
  const ReplicaPool* pool_ = nullptr;
  TulipMonitorOptions options_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::shared_ptr<const ModelSpec> spec_ GUARDED_BY(mu_);
  std::atomic<bool> ready_{false};
  uint64_t model_info_failures_ = 0;  // monitor thread only
  std::thread thread_;
};

}  // namespace garden::ivy
