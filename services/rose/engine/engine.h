#pragma once
// rose's step loop on the shared-memory channel [TAG_ROSE_LAZY]. step() takes one batch
// descriptor from the submission ring, validates it against the arena and the model (a bad
// descriptor is answered INVALID_ARGUMENT with a message, an expired deadline DEADLINE_EXCEEDED,
// both without running), copies its token ids and lengths into the slot's private staging,
// launches the forward pass on the backend and records the slot's event — and returns without
// waiting. A completion thread waits on the events in submission order and publishes each
// Completion (result rows float32 at offset 0 of the slot's output arena) once its result is in
// memory. Heartbeats: every step() beats, and run() never blocks longer than ~20 ms between steps.
// With CUDA graphs (EngineOptions::cuda_graphs and a backend whose graphs() is set), step() runs
// the batch padded to its (sequences, tokens) bucket through the backend's graph cache on the step
// thread (Qwen3Model::enqueueEmbedGraphed): same results, bit for bit, without ~300 launches.
//
// Threads: step()/run() on one thread (the step thread; it also owns the backend's launching
// side); the completion thread is owned by the Engine and joined by drain()/the destructor. The
// Channel, Backend and model must outlive the Engine.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/shm/channel.h"
#include "common/status.h"
#include "services/rose/engine/completion_queue.h"
#include "services/rose/model/qwen3.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {

struct EngineOptions {
  PoolMode default_pooling = PoolMode::kLast;  // for BatchDesc.pooling == kDefault
  std::string model_name;                      // ModelFacts.name (truncated to 63 bytes)
  std::chrono::microseconds poll = std::chrono::milliseconds(20);  // run(): longest wait per step
  // CUDA graphs [TAG_GRAPH_EXEC]: when on and the backend has graphs() (cuda), every batch runs
  // padded to its (sequences, tokens) bucket through the graph cache (eager the first time a
  // bucket is seen, captured the second, replayed after). Off, or on a backend without graphs
  // (cpu): batches run eagerly, unpadded.
  bool cuda_graphs = true;
  // Embed buckets captured by create() (sequences, tokens per batch), with the default pooling
  // and normalization on. Needs graphs; create() fails on a bad entry.
  std::vector<std::pair<int32_t, int64_t>> precapture;
};

struct EngineStats {
  uint64_t batches_run = 0;       // launched forward passes
  uint64_t batches_rejected = 0;  // answered with an error without running
  uint64_t completions = 0;       // published completions (run + rejected)
  bool graphs = false;            // batches run through CUDA graphs
  GraphExecStats graph;           // eager / captures / replays (zero without graphs)
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(shm::Channel& channel, Backend& backend,
                                                Qwen3Model& model, const EngineOptions& opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Writes ModelFacts and sets the worker state to kReady (and the worker pid).
  void announceReady();

  // Takes at most one batch (waiting up to `wait`), beats the heartbeat. Returns true when a
  // batch was taken (run or rejected). Never waits for a forward pass.
  bool step(std::chrono::microseconds wait);

  // Steps until should_stop() returns true (checked every step), then sets kStopping and drains.
  void run(const std::function<bool()>& should_stop);

  // Waits (up to `timeout`) until every taken batch has been published, then stops the
  // completion thread. Returns false on timeout. Called by run() and the destructor.
  bool drain(std::chrono::milliseconds timeout);

  // The graph counters are the step thread's: read them there, or after run() returned.
  EngineStats stats() const;
  uint32_t inFlight() const { return queue_.inFlight(); }

 private:
  struct Slot {
    std::unique_ptr<Event> event;
    std::vector<int32_t> tokens;   // staging, max_batch_tokens
    std::vector<int32_t> seqlens;  // staging, max_batch_tokens
    std::atomic<bool> busy{false};
  };
  Engine(shm::Channel& c, Backend& b, Qwen3Model& m, const EngineOptions& o)
      : channel_(c), backend_(b), model_(m), opts_(o), queue_(c, b) {}
  // Validates `d`, fills the slot staging, returns the output shape.
  Status admit(const shm::BatchDesc& d, uint32_t* rows, uint32_t* cols);
  void reject(const shm::BatchDesc& d, const Status& st, std::chrono::steady_clock::time_point t);

  shm::Channel& channel_;
  Backend& backend_;
  Qwen3Model& model_;
  EngineOptions opts_;
  GraphExecutor* graphs_ = nullptr;  // backend_.graphs() when opts_.cuda_graphs
  bool registered_ = false;          // the output arena is registered with the backend
  std::vector<std::unique_ptr<Slot>> slots_;

  CompletionQueue queue_;  // answers taken batches in order on its own thread
  std::atomic<uint64_t> run_{0}, rejected_{0};
};

}  // namespace garden::rose
