#pragma once
// The cuBLASLt expert GEMMs: one matmul per expert over its range of expert-sorted rows,
//   y[r0 .. r0+cnt)[N] = X[r0 .. r0+cnt)[K'] · W_e[N][K']^T      (f32 accumulation, bf16 out)
// in one of two element types:
//   * kFp8Block [TAG_FP8_EXPERTS]: e4m3 x e4m3 with Hopper block scaling (weights
//     BLK128x128_32F as the A operand, activations VEC128_32F as B; layouts in fp8_block.h),
//     K' = fp8PaddedK(K);
//   * kBf16 [TAG_MOE_LT_BF16]: bf16 x bf16, K' = K (a multiple of 8): the MXFP4 experts
//     dequantized per step (moe_lt_bf16.cuh), exact weights.
// The ranges come from the host (the align step's tiles copied back once per layer, so this runs
// only in eager, non-captured steps: prefill). bf16 calls may carry the per-expert bias as
// cuBLASLt's bias epilogue (added in f32 before the one rounding) [TAG_MOE_LT_EPILOGUE]; FP8 calls
// have none (the callers add it: fp8_act_quant.cuh, moe_row_bias.cuh).
//
// Streams [TAG_MOE_LT_STREAMS]: with run(..., streams > 1) the experts' matmuls are spread over
// that many helper streams (the least-loaded by rows first, in expert order: a fixed assignment for
// given ranges), forked from the caller's stream by an event and joined back into it, each with a
// workspace of its own: a per-expert GEMM of ~1,000 rows fills 1-2 waves of the GPU, and
// concurrent ones fill each other's tails. A matmul's algorithm depends on its shape only, so the
// bits do not depend on the stream count.
//
// Plans: one matmul descriptor per (type, N, K'); matrix layouts per exact row count; the
// algorithm is cuBLASLt's first heuristic choice for the row count rounded up to a power of two
// (>= 16), checked with cublasLtMatmulAlgoCheck for each new exact count (its own heuristic query
// if the check fails), so a new count costs host work once.
//
// Threads: one launching thread (the backend's). Move-only owner of the handle, the workspace and
// the cached descriptors.

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "common/status.h"
#include "services/rose/ops/backend.h"

namespace garden::rose::cuda {

enum class MoeLtType : int32_t { kFp8Block = 0, kBf16 = 1 };

struct MoeLtGemmArgs {
  MoeLtType type = MoeLtType::kFp8Block;
  const void* w = nullptr;              // fp8: [E][n][fp8PaddedK(k)] e4m3; bf16: [E][n][k]
  const float* w_scales = nullptr;      // fp8: [E][fp8WeightScalesPerExpert(n, k)]
  const void* x = nullptr;              // fp8: [rows][fp8PaddedK(k)] e4m3; bf16: [rows][k]
  const float* x_scales = nullptr;      // fp8: fp8ActScaleIndex layout over the expert ranges
  __nv_bfloat16* y = nullptr;           // [rows][n]
  const int64_t* expert_off = nullptr;  // HOST [num_experts + 1], multiples of 4
  int32_t num_experts = 0;
  int32_t n = 0;  // output features, a multiple of 4
  int32_t k = 0;  // inputs (before padding; bf16: a multiple of 8)
  const __nv_bfloat16* bias = nullptr;  // bf16 only, optional: [E][n], the bias epilogue
};

class MoeLtGemm {
 public:
  static Result<std::unique_ptr<MoeLtGemm>> create(size_t workspace_bytes = size_t{32} << 20);
  ~MoeLtGemm();
  MoeLtGemm(const MoeLtGemm&) = delete;
  MoeLtGemm& operator=(const MoeLtGemm&) = delete;

  // Enqueues one matmul per expert with rows: on `stream`, or (streams > 1) on that many helper
  // streams that start after the work already on `stream` and that `stream` waits for.
  Status run(const MoeLtGemmArgs& a, cudaStream_t stream, int streams = 1);
  // Creates the helper streams, events and workspaces for up to `streams` (at most kMaxStreams).
  Status reserveStreams(int streams);
  static constexpr int kMaxStreams = 8;

  size_t heuristicQueries() const { return heuristic_queries_; }

 private:
  struct Desc {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr;
    ~Desc();
  };
  struct Shape {  // layouts and algorithm of one (n, kp, rows)
    cublasLtMatrixLayout_t b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    ~Shape();
  };
  MoeLtGemm() = default;
  Result<Desc*> desc(MoeLtType type, int64_t n, int64_t kp, bool bias);
  Result<Shape*> shape(Desc& d, int32_t key, MoeLtType type, int64_t n, int64_t kp, int64_t rows);
  Status enqueue(const MoeLtGemmArgs& a, Desc* d, int32_t key, int64_t kp, cudaStream_t stream,
                 int streams);
  Result<bool> heuristic(Desc& d, Shape& s, cublasLtMatmulAlgo_t* out);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  size_t heuristic_queries_ = 0;
  // [TAG_MOE_LT_STREAMS] helper streams, their workspaces and join events; the fork event.
  cudaStream_t helpers_[kMaxStreams] = {};
  void* helper_ws_[kMaxStreams] = {};
  cudaEvent_t joins_[kMaxStreams] = {};
  cudaEvent_t fork_ = nullptr;
  int helper_count_ = 0;
  std::map<std::tuple<int32_t, int64_t, int64_t>, std::unique_ptr<Desc>> descs_;
  std::map<std::tuple<int32_t, int64_t, int64_t, int64_t>, std::unique_ptr<Shape>> shapes_;
  std::map<std::tuple<int32_t, int64_t, int64_t, int64_t>, cublasLtMatmulAlgo_t> bucket_algos_;
};

// Which MoE steps take the FP8 experts (when the weights carry an FP8 copy): steps of at least
// this many tokens that are not being captured into a CUDA graph. Default 1024: where the FP8
// path starts to win (the MoE op alone at 20b shapes on the H200, MXFP4 tiled vs FP8 µs per call:
// 256 tokens 627 vs 853, 512 868 vs 886, 1024 1293 vs 954, 2048 2191 vs 1205; bench/results/
// gpu-llm-2026-12-02-h200-s4), and above the largest graph-captured decode batch
// (GptOssModel::kMaxGraphSeqs), so decode keeps the MXFP4 kernels and eager and graph steps of one
// batch size take the same path. Process-global (tests, benches).
inline constexpr int64_t kMoeFp8DefaultMinTokens = 1024;
void setMoeFp8MinTokens(int64_t tokens);
int64_t moeFp8MinTokens();
// MoE steps that ran on the FP8 experts so far (process-global; tests check the path ran).
uint64_t moeFp8Steps();
void countMoeFp8Step();

// [TAG_MOE_LT_BF16] Which MoE calls over MXFP4 experts take the bf16 cuBLASLt path (the experts
// dequantized per call into a bf16 scratch, per-expert bf16 cuBLASLt GEMMs) instead of the tiled
// MXFP4 kernels. Never a call being captured or one that takes the FP8 copy. Process-global; set
// before the experts are uploaded (the scratch, one projection's E x N x K bf16 values, is
// allocated then when MinTokens > 0).
//   MinTokens: > 0 switches the path on; a call of MoeLtChoice::kBySize takes it with at least
//     this many tokens and MinRowsPerExpert rows per expert on average (tokens x top_k >=
//     rows x experts). INT64_MAX: on for kTake calls only.
//   PerChunk: the model splits its steps by sequence chunk (LlmOps::moeChunkMinRowsPerExpert):
//     chunks of MinRowsPerExpert rows per expert come as kTake calls, the rest as kSkip.
// Why not every step by size: cuBLASLt picks its algorithm (and so its K order) by row count,
// so a row's bits would depend on the other rows of its call; the tiled kernels keep them
// independent (one K chain in every tile shape). Per chunk, a row shares its call with its own
// chunk only. applyMoePrefill sets all three from rose's option (backend.h).
void setMoeLtBf16MinTokens(int64_t tokens);
int64_t moeLtBf16MinTokens();
void setMoeLtBf16MinRowsPerExpert(int64_t rows);
int64_t moeLtBf16MinRowsPerExpert();
void setMoeLtBf16PerChunk(bool per_chunk);
bool moeLtBf16PerChunk();
// [TAG_MOE_PREFILL_AUTO] CudaKernelOptions::MoePrefill::kAuto in force (per chunk is then on too).
bool moeLtBf16Auto();
void applyMoePrefill(CudaKernelOptions::MoePrefill mode, int64_t min_rows_per_expert);
// The bf16 path's execution choices (CudaKernelOptions::moe_lt_*; process-global, read per call):
// helper streams for the per-expert matmuls [TAG_MOE_LT_STREAMS] (1: the caller's stream), the
// biases as the matmuls' epilogue [TAG_MOE_LT_EPILOGUE], and the down projection's dequantization
// on a stream of its own, concurrent with the gate_up matmuls, into a second scratch
// [TAG_MOE_LT_OVERLAP] (allocated at upload when on).
void applyMoeLt(const CudaKernelOptions& opts);
int moeLtStreams();
bool moeLtBiasEpilogue();
bool moeLtOverlapDequant();
// [TAG_MOE_WGMMA] the path's GEMMs as one wgmma launch per projection (moe_wgmma.cuh).
bool moeLtWgmma();
// [TAG_MOE_WGMMA_DEVICE_PLAN] CudaKernelOptions::moe_wgmma_device_plan in force.
bool moeWgmmaDevicePlan();
// [TAG_MOE_WGMMA_SMEM_A] CudaKernelOptions::moe_wgmma_smem_a in force.
bool moeWgmmaSmemA();
int64_t moeWgmmaMinRowsPerExpert();
// The rows-per-expert floor of the path's calls (chunks or steps): the cuBLASLt GEMMs'
// (moeLtBf16MinRowsPerExpert), or with the wgmma kernel running them the smaller of that and
// moeWgmmaMinRowsPerExpert.
int64_t moeLtMinRowsPerExpert(bool wgmma);
// MoE steps that ran on the bf16 cuBLASLt path so far (process-global; tests check it ran).
uint64_t moeLtBf16Steps();
void countMoeLtBf16Step();
// ... of which on the wgmma kernel [TAG_MOE_WGMMA].
uint64_t moeWgmmaSteps();
void countMoeWgmmaStep();

}  // namespace garden::rose::cuda
