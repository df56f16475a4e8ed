#include "services/ivy/balance/tulip_monitor.h"

#include <future>

#include "common/logging.h"
#include "services/ivy/balance/replica_pool.h"

namespace garden::ivy {

// [TAG_MODEL_SPEC] The one place ModelInfo becomes a ModelSpec (TulipMonitor and ReplicaPool).
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

TulipMonitor::TulipMonitor(TulipClient* client, TulipMonitorOptions options)
    : client_(client), options_(std::move(options)) {}

TulipMonitor::TulipMonitor(const ReplicaPool* pool) : client_(nullptr), pool_(pool) {}

TulipMonitor::~TulipMonitor() { stop(); }

bool TulipMonitor::ready() const {
  if (pool_ != nullptr) return pool_->ready();
  return ready_.load(std::memory_order_acquire);
}

void TulipMonitor::start() {
  if (pool_ != nullptr) return;  // the pool runs its own probes
  CHECK(!thread_.joinable());
  thread_ = std::thread([this] { run(); });
}

void TulipMonitor::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notifyAll();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<const ModelSpec> TulipMonitor::spec() const {
  if (pool_ != nullptr) return pool_->spec();
  MutexLock lock(mu_);
  return spec_;
}

bool TulipMonitor::waitReady(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

bool TulipMonitor::fetchModelInfo() {
  auto p = std::make_shared<std::promise<Result<TulipModelInfo>>>();
  auto f = p->get_future();
  client_->modelInfo(options_.rpc_timeout,
                     [p](Result<TulipModelInfo> r) { p->set_value(std::move(r)); });
  Result<TulipModelInfo> r = f.get();  // bounded by rpc_timeout
  if (!r.isOk()) {
    // While tulip starts this fails every retry_interval: log the first and every 20th.
    if (model_info_failures_++ % 20 == 0) {
      log::warn("tulip model info failed", {{"tulip", client_->endpoint()},
                                            {"status", r.status()},
                                            {"attempts", model_info_failures_}});
    }
    return false;
  }
  model_info_failures_ = 0;
  if (r->hidden_size == 0 || r->max_seq_len == 0 || r->vocab_size == 0 || r->model.empty()) {
    log::error("tulip model info incomplete", {{"tulip", client_->endpoint()},
                                               {"model", r->model},
                                               {"hidden_size", r->hidden_size},
                                               {"max_seq_len", r->max_seq_len},
                                               {"vocab_size", r->vocab_size}});
    return false;
  }
  auto spec = std::make_shared<ModelSpec>(makeModelSpec(*r, options_.served_model_name));
  log::info("tulip model", {{"tulip", client_->endpoint()},
                            {"model", spec->upstream_name},
                            {"served_name", spec->served_name},
                            {"kind", spec->kind},
                            {"hidden_size", spec->hidden_size},
                            {"max_seq_len", spec->max_seq_len},
                            {"vocab_size", spec->vocab_size}});
  MutexLock lock(mu_);
  spec_ = std::move(spec);
  return true;
}

Status TulipMonitor::checkHealth() {
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  client_->health(options_.rpc_timeout, [p](Status s) { p->set_value(std::move(s)); });
  return f.get();
}

void TulipMonitor::run() {
  bool have_spec = false;
  bool was_healthy = false;
  while (true) {
    std::chrono::milliseconds wait = options_.health_interval;
    bool fetched_now = false;
    if (!have_spec) {
      have_spec = fetched_now = fetchModelInfo();
      if (!have_spec) wait = options_.retry_interval;
    }
    if (have_spec) {
      Status h = checkHealth();
      // Recovered after a failure: refresh the model in case tulip restarted with another one.
      if (h.isOk() && !was_healthy && !fetched_now && !fetchModelInfo()) {
        h = unavailable("tulip: model info failed after recovery");
      }
      bool healthy = h.isOk();
      if (healthy != was_healthy) {
        if (healthy) {
          log::info("tulip healthy", {{"tulip", client_->endpoint()}});
        } else {
          log::warn("tulip unhealthy", {{"tulip", client_->endpoint()}, {"status", h}});
        }
      }
      was_healthy = healthy;
      ready_.store(healthy, std::memory_order_release);
      if (!healthy) wait = options_.retry_interval;
    }
    MutexLock lock(mu_);
    if (cv_.waitFor(lock, wait, [this]() REQUIRES(mu_) { return stopping_; })) break;
  }
  ready_.store(false, std::memory_order_release);
}

}  // namespace garden::ivy
