#include "services/rose/graph/graph_cache.h"

#include "services/rose/ops/cuda/cuda_utils.h"

namespace garden::rose {

uint32_t tokensBucket(uint32_t tokens) { return graphTokensBucket(tokens); }

uint32_t seqsBucket(uint32_t seqs) { return graphSeqsBucket(seqs); }

GraphCache::~GraphCache() {
  for (auto& [key, e] : entries_) {
    if (e.exec != nullptr) cudaGraphExecDestroy(e.exec);
  }
}

bool GraphCache::captured(const GraphKey& key) const {
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.exec != nullptr;
}

Status GraphCache::capture(Entry& e, const std::function<Status()>& enqueue) {
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  Status body = enqueue();
  cudaGraph_t graph = nullptr;
  cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  if (!body.isOk() || end != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // capture errors are not sticky; clear them
    ++stats_.capture_failures;
    e.eager_only = true;
    if (!body.isOk()) return body;
    return okStatus();  // caller runs eagerly
  }
  cudaGraphExec_t exec = nullptr;
  cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {
    (void)cudaGetLastError();
    ++stats_.capture_failures;
    e.eager_only = true;
    return okStatus();
  }
  e.exec = exec;
  ++stats_.captures;
  return okStatus();
}

Status GraphCache::run(const GraphKey& key, const std::function<Status()>& enqueue) {
  Entry& e = entries_[key];
  ++e.seen;
  if (e.exec != nullptr) {
    ++stats_.replays;
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(e.exec, stream_));
    return okStatus();
  }
  if (e.seen >= 2 && !e.eager_only) {
    RETURN_IF_ERROR(capture(e, enqueue));
    if (e.exec != nullptr) {
      CUDA_RETURN_IF_ERROR(cudaGraphLaunch(e.exec, stream_));
      return okStatus();
    }
  }
  ++stats_.eager;
  return enqueue();
}

Status GraphCache::precapture(const GraphKey& key, const std::function<Status()>& enqueue) {
  Entry& e = entries_[key];
  if (e.exec != nullptr) return okStatus();
  ++stats_.eager;
  RETURN_IF_ERROR(enqueue());
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  e.seen = 1;
  RETURN_IF_ERROR(capture(e, enqueue));
  if (e.exec == nullptr) return internalError("graph capture failed for a precaptured shape");
  return okStatus();
}

}  // namespace garden::rose
