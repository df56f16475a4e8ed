#pragma once
// The "cuda" Backend (services/rose/ops/backend.h): bf16 weights, activations and residual stream,
// f32 accumulation, one non-blocking CUDA stream per backend on which every op and copy is
// enqueued in program order. Ops map one to one onto the kernel launchers in this folder (GEMMs
// through cuBLASLt, see gemm.h); none of them allocates or synchronizes, so a forward pass built
// from them can be captured into a CUDA graph (runGraph).
//
// copyToDevice stages the caller's bytes in a pinned ring buffer so the caller may reuse them at
// once; copyToHost writes into memory registered with registerHostMemory (the shm output arena)
// when the stream reaches it. Threads: one thread drives the backend (launch/ops/copies); events
// may be queried or waited on from any thread.

#include <cuda_runtime_api.h>

#include <deque>
#include <memory>
#include <vector>

#include "services/rose/graph/graph_cache.h"
#include "services/rose/ops/backend.h"
#include "services/rose/ops/cuda/attention.cuh"
#include "services/rose/ops/cuda/fp8_gemm.h"
#include "services/rose/ops/cuda/gemm.h"

namespace garden::rose::cuda {

class CudaBackend final : public Backend, public GraphExecutor {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(const BackendOptions& opts);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  DType weightDType() const override { return DType::kBF16; }
  DType activationDType() const override { return DType::kBF16; }
  DType residualDType() const override { return DType::kBF16; }

  Result<Buffer> allocate(size_t bytes) override;
  Status uploadConvert(const Tensor& dst, const HostView& src) override;
  Result<uint64_t> deviceMemoryFree() override;
  Status registerHostMemory(void* ptr, size_t bytes) override;
  void unregisterHostMemory(void* ptr) override;

  void launch(std::function<void()> work) override;
  // [TAG_KV_PULL_CUDA] CUDA IPC handles of this backend's allocations; the KV block copy kernel.
  Result<PeerMemoryHandle> exportPeerMemory(const void* base) override;
  Result<void*> openPeerMemory(const PeerMemoryHandle& handle) override;
  void closePeerMemory(void* mapped) override;
  Status copyKvBlocks(const KvBlockCopy& copy) override;
  Result<std::unique_ptr<Event>> createEvent() override;
  Status recordEvent(Event& event) override;
  Status synchronize() override;

  void copyToDevice(const Tensor& dst, const void* src, size_t bytes) override;
  void copyToHost(void* dst, const Tensor& src, size_t bytes) override;

  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void rmsNorm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& out,
               const RmsNormParams& p) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) override;
  Result<int64_t> prewarmLinear(const Tensor& w, const Tensor& bias, DType y_dtype,
                                int64_t max_rows) override;
  void qkNormRope(const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                  const Tensor& positions, const Tensor& cos, const Tensor& sin,
                  const QkNormRopeParams& p) override;
  void attention(const Tensor& qkv, const Tensor& cu_seqlens, const Tensor& out,
                 const AttentionParams& p) override;
  void swiglu(const Tensor& gate_up, const Tensor& out) override;
  void pool(const Tensor& hidden, const Tensor& cu_seqlens, const Tensor& out,
            const PoolParams& p) override;
  // [TAG_EMBED_FP8] fp8_dense.cuh's quantization, fp8_gemm.h's GEMMs.
  bool supportsFp8Linear() const override { return true; }
  void quantizeFp8Weight(const Tensor& w, const Fp8Matrix& out) override;
  void quantizeFp8(const Tensor& x, const Fp8Matrix& out) override;
  void rmsNormFp8(const Tensor& x, const Tensor& residual, const Tensor& weight,
                  const Fp8Matrix& out, const RmsNormParams& p) override;
  void swigluFp8(const Tensor& gate_up, const Fp8Matrix& out) override;
  void attentionFp8(const Tensor& qkv, const Tensor& cu_seqlens, const Tensor& scratch,
                    const Fp8Matrix& out, const AttentionParams& p) override;
  void linearFp8(const Fp8Matrix& x, const Fp8Matrix& w, const Tensor& y) override;
  void score(const Tensor& hidden, const Tensor& cu_seqlens, const Tensor& head, const Tensor& out,
             const ScoreParams& p) override;

  // ---- step progress [TAG_STEP_PROGRESS]: not implemented yet ----
  // This backend keeps Backend's defaults: setProgressCounter() ignores the counter,
  // markProgress() is a no-op and reportsProgress() is false, so tulip judges a CUDA worker by
  // its work-scaled step limit (--step-timeout-ms) instead of by progress. To implement (see the
  // contract at Backend::markProgress): keep the counter pointer; in markProgress() enqueue on
  // stream_ either cudaLaunchHostFunc(stream_, fn, counter) with fn doing
  // counter->fetch_add(1, std::memory_order_relaxed) (host nodes are captured into graphs), or a
  // one-thread kernel that increments the counter through a device pointer of the header page
  // (cudaHostRegister(..., cudaHostRegisterMapped) + cudaHostGetDevicePointer; a system-scope
  // atomicAdd_system on unsigned long long); then return true from reportsProgress().

  // ---- graphs (GraphExecutor, [TAG_GRAPH_EXEC]) ----
  GraphExecutor* graphs() override { return this; }
  Status run(const GraphShapeKey& key, const std::function<void()>& body) override {
    return runGraph(GraphKey{key.kind, key.seqs, key.tokens, key.variant}, body);
  }
  Status precapture(const GraphShapeKey& key, const std::function<void()>& body) override {
    return precaptureGraph(GraphKey{key.kind, key.seqs, key.tokens, key.variant}, body);
  }
  GraphExecStats graphStats() const override {
    const GraphCache::Stats& s = graphs_->stats();
    return {s.eager, s.captures, s.replays, s.capture_failures};
  }

  // ---- CUDA-only ----
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  // Programmatic dependent launch of eager kernels (common.cuh [TAG_PDL]).
  bool pdl() const { return kernels_.pdl; }
  bool pdlGemv() const { return kernels_.pdl_gemv; }  // [TAG_PDL_GEMV]
  bool gemmRowInvariant() const { return kernels_.gemm_row_invariant; }  // [TAG_GEMM_ROW_INVARIANT]
  bool chainPdl() const { return kernels_.chain_pdl; }  // [TAG_CHAIN_PDL]
  bool pdlGraph() const { return kernels_.pdl_graph; }  // [TAG_PDL_GRAPH]
  // Runs `body` (which enqueues ops of this backend only, see [TAG_GRAPH_BODY]) through the graph
  // cache: eager on first sight of `key`, captured on the second, replayed after.
  Status runGraph(const GraphKey& key, const std::function<void()>& body);
  Status precaptureGraph(const GraphKey& key, const std::function<void()>& body);
  GemmRunner& gemm() { return *gemm_; }

 protected:
  void release(void* data, size_t bytes) override;

 private:
  CudaBackend(int device, const CudaKernelOptions& kernels) : device_(device), kernels_(kernels) {}
  // Reserves `bytes` of the pinned staging ring, waiting for older copies that still read it.
  char* stage(size_t bytes);
  // attention()'s arguments (shapes and dtypes checked) with its bf16 output `out`.
  AttentionArgs attentionArgs(const Tensor& qkv, const Tensor& cu_seqlens, const Tensor& out,
                              const AttentionParams& p);

  struct Staged {
    size_t begin = 0, end = 0;
    cudaEvent_t done = nullptr;
  };
  int device_ = 0;
  CudaKernelOptions kernels_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<GemmRunner> gemm_;
  std::unique_ptr<Fp8Gemm> fp8_gemm_;  // [TAG_EMBED_FP8] created on first use
  std::unique_ptr<GraphCache> graphs_;
  char* staging_ = nullptr;  // pinned host ring
  size_t staging_bytes_ = 0;
  size_t staging_cursor_ = 0;
  std::deque<Staged> staged_;
  std::vector<cudaEvent_t> free_events_;
  int32_t* kv_pairs_ = nullptr;  // [TAG_KV_PULL_CUDA] the last KV copy's pairs on the device
  size_t kv_pairs_bytes_ = 0;
};

}  // namespace garden::rose::cuda
