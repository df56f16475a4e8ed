#pragma once
// CUDA graphs for rose's forward passes, one per shape bucket (batch kind, sequences bucket, tokens
// bucket, variant). Capture is lazy: the first time a key is seen its work runs eagerly (warm-up:
// module loading, cuBLASLt plans), the second time it is captured and the graph launched, later
// times the graph is replayed. precapture() does warm-up + capture at start for a given list of
// shapes.
//
// Contract for the enqueue callback [TAG_GRAPH_BODY]: it must enqueue device work only on the
// cache's stream, read every per-batch value (token ids, positions, cu_seqlens) from device
// buffers at fixed addresses, and use host values (counts, pointers) that depend on the key alone
// (pad the batch to the bucket first). No host<->device copies from pageable or staging memory
// and no allocation inside it.
//
// Threads: one thread (the one that owns the stream) uses a GraphCache. It owns the graph execs.

#include <cuda_runtime_api.h>

#include <compare>
#include <cstdint>
#include <functional>
#include <map>

#include "common/status.h"
#include "services/rose/ops/backend.h"  // graphTokensBucket, graphSeqsBucket

namespace garden::rose {

struct GraphKey {
  uint32_t kind = 0;     // batch kind (e.g. shm::BatchKind)
  uint32_t seqs = 0;     // sequences bucket (seqsBucket)
  uint32_t tokens = 0;   // tokens bucket (tokensBucket)
  uint64_t variant = 0;  // what else the captured work bakes in (pooling mode, head rows, ...)
  auto operator<=>(const GraphKey&) const = default;
};

// Tokens pad to a multiple of 64 up to 1024, of 256 above. 0 stays 0.
uint32_t tokensBucket(uint32_t tokens);
// Sequences pad to the next power of two.
uint32_t seqsBucket(uint32_t seqs);

class GraphCache {
 public:
  struct Stats {
    uint64_t eager = 0;
    uint64_t captures = 0;
    uint64_t replays = 0;
    uint64_t capture_failures = 0;
  };

  explicit GraphCache(cudaStream_t stream) : stream_(stream) {}
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // Runs the work for `key` (eager, capture + launch, or replay; see above). A capture that
  // fails leaves the key eager-only (counted in capture_failures) and runs the work eagerly.
  Status run(const GraphKey& key, const std::function<Status()>& enqueue);
  // Warm-up run plus capture now, so the first real batch of this shape replays.
  Status precapture(const GraphKey& key, const std::function<Status()>& enqueue);

  const Stats& stats() const { return stats_; }
  bool captured(const GraphKey& key) const;

 private:
  struct Entry {
    uint32_t seen = 0;
    bool eager_only = false;
    cudaGraphExec_t exec = nullptr;
  };
  Status capture(Entry& e, const std::function<Status()>& enqueue);

  cudaStream_t stream_;
  std::map<GraphKey, Entry> entries_;
  Stats stats_;
};

}  // namespace garden::rose
