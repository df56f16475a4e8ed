#pragma once
// bf16 GEMMs through cuBLASLt for rose's linear layers: y[M, N] = x[M, K] . w[N, K]^T (+ bias[N]),
// row-major bf16 in and out, f32 accumulation. The matmul descriptor and layouts are built once per
// (M, N, K, bias) shape and cached; the workspace is allocated once at creation, so the hot path
// never allocates and the calls are CUDA-graph capturable.
//
// Algorithm choice (tuning on, the default): one algorithm per (M bucket, N, K, bias), where the
// M bucket is algoBucket(M) — 64-row steps up to 1024, 256 up to 4096, 1024 above; the buckets
// nest the graph token buckets (graphTokensBucket), so a batch padded to its graph bucket and the
// same batch run eagerly use the same algorithm and give bit-identical results. The first time a
// bucket is seen (an eager run: the graph cache runs a bucket eagerly before capturing it), up
// to 16 heuristic candidates for the bucket's largest M — split-K included when its partial sums
// stay f32 (REDUCTION_SCHEME_COMPUTE_TYPE) and fit the workspace at that M — are each timed on
// the call's real operands with CUDA events (2 warm-ups, then the mean of 5 runs, L2 flushed
// before each, as in a forward pass whose weights are cold) and the fastest is cached (logged
// as "gemm tuned" with its time and the heuristic first pick's). A winner must also give the
// first M/2 rows the same bits when run at M/2 (checked on the host for M/2 * N <= 4M; a
// candidate that fails, e.g. a work split that depends on the tile count, is skipped). The
// candidates write into the real y; the call itself then recomputes y with the winner, so nothing
// the caller reads is affected. This synchronizes the stream once per new bucket. A bucket first
// seen while the stream is being captured takes the heuristic's first pick untimed (counted in
// untimedInCapture()), never breaking the capture. Consequence: rows of y are bit-identical for any
// M of one bucket, but across buckets (a sequence batched with more or fewer tokens) they agree
// only to within bf16 rounding (split-K changes the f32 summation order).
//
// The custom weight-streaming kernel (gemm_smallm.cuh) is one more candidate in that timing for
// M buckets <= 256 when its shape rules hold (N % 64 == 0, K % (64 * splits) == 0): one candidate
// per (N tile, split count) smallMGemmCandidates(N, K) offers, timed the same way (L2 flushed,
// events) after cuBLASLt's and held to the same M/2 bit check (which it always passes: its bits
// depend on the split count, never on M). Its split-K reduction runs inside a thread-block
// cluster, so it needs no workspace and keeps no state between calls. The "gemm tuned" log line
// says which kind won ("kernel": "smallm" or "cublaslt", "smallm_splits", "smallm_tile_n",
// "best_cublaslt_us"). It is a candidate only with create(..., smallm = true) (rose:
// GARDEN_GEMM_SMALLM=1, CudaKernelOptions::gemm_smallm): off by default, since on the H200 it lost
// to cuBLASLt's tuned choice at every M >= 64 bucket of Qwen3-0.6B (8-27 us vs 7-11 us;
// bench/results/gpu-embed-2026-11-30-h200-s3) and only won at M = 1. It is never used with tuning
// off, nor for a bucket first seen while capturing (both keep cuBLASLt's heuristic pick as before).
//
// Tuning off (create(..., false); rose: GARDEN_GEMM_TUNE=0, CudaKernelOptions::gemm_tune): the
// previous policy —
// one algorithm per (N, K, bias), the heuristic's first choice at a reference M of 2048 with
// split-K turned off, reused for every M, so a row's bits never depend on M. Only if that
// algorithm rejects some M does that M get its own heuristic choice (variantFallbacks()).
//
// Threads: one thread (the backend's owner thread) uses a GemmRunner. Move-only owner of the
// cuBLASLt handle, the cached descriptors, the workspace and (once tuning ran) an L2-flush buffer.

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "common/status.h"

namespace garden::rose::cuda {

// cuBLASLt's status as ours (INTERNAL naming the call), and the early return on it; shared by
// the GEMM runner and the MoE expert GEMMs (moe_lt_gemm.cc).
Status cublasLtStatus(cublasStatus_t s, const char* what);
#define LT_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::garden::rose::cuda::cublasLtStatus((expr), #expr))

class GemmRunner {
 public:
  // smallm: also time the custom small-M kernel as a candidate (only with tune).
  static Result<std::unique_ptr<GemmRunner>> create(size_t workspace_bytes = size_t{32} << 20,
                                                    bool tune = true, bool smallm = false);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Enqueues y = x . w^T (+ bias) on `stream`. Pointers 16-byte aligned, K and N multiples of 8;
  // y must not overlap x, w or bias. The first call of a new (M bucket, N, K, bias) with tuning
  // on and the stream not capturing times candidates (see above) and synchronizes `stream`.
  Status run(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
             __nv_bfloat16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
  // The same with float32 output and no bias (logits: the gpt-oss router and lm_head), tuned and
  // cached separately (cuBLASLt candidates only). Same alignment rules.
  Status runF32(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int64_t m, int64_t n,
                int64_t k, cudaStream_t stream);
  // [TAG_ATTN_F16] run() with every operand IEEE fp16 (x, w, bias, y), tuned and cached
  // separately (cuBLASLt candidates only). Same alignment rules.
  Status runF16(const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                int64_t k, cudaStream_t stream);
  // fp16 x and w, float32 y and bias (may be null): gpt-oss's lm_head with --dtype float16 (no
  // bias), its QKV and O-proj with their outputs kept in f32 [TAG_PROJ_F32].
  Status runF16F32(const void* x, const void* w, const float* bias, float* y, int64_t m, int64_t n,
                   int64_t k, cudaStream_t stream);

  // The M bucket sharing one algorithm: 64-row steps up to 1024, 256 up to 4096, 1024 above.
  // algoBucket(graphTokensBucket(m)) == algoBucket(m) for every m.
  static int64_t algoBucket(int64_t m);
  // [TAG_GEMM_SMALL_BUCKETS] With small buckets on, M <= 8 is tuned in power-of-two buckets
  // (1, 2, 4, 8) instead of sharing the first 64-row bucket, whose algorithm is timed at M = 64:
  // a one-token decode step then runs what is fastest at one row. Only for callers whose graphs
  // pad M to a power of two (gpt-oss decode: graphSeqsBucket), so that padded and eager runs of a
  // bucket still share an algorithm; Qwen3's graphs pad to 64 rows and keep it off. Rows of M <= 8
  // and M > 8 steps then agree to bf16 rounding, as across any two buckets. Set before the first
  // call of a shape (a bucket already tuned keeps its choice).
  void setSmallBuckets(bool on) { small_buckets_ = on; }
  // [TAG_GEMV] Also time the CUDA-core GEMV (gemv.cuh) as candidates for the small buckets (with
  // small buckets and tuning on; bf16 output only). Off by default: on the H200 it won no bucket
  // (docs/gpt-oss-cuda.md [TAG_GEMV]).
  void setGemv(bool on) { gemv_ = on; }
  // [TAG_PDL_GEMV] The GEMV shapes as the only candidates of the M = 1 bucket (the fastest shape by
  // the same timing; cuBLASLt not timed): eager timing cannot see the overlap with the previous
  // kernel that the programmatic GEMV buys. Only M = 1: at M = 8 the GEMV took 58 us against
  // cuBLASLt's 20 (QKV, H100) and made decode b8 20 % slower. Set before the first call of a shape.
  void setGemvOnly(bool on) { gemv_only_ = on; }
  // [TAG_GEMM_ROW_INVARIANT] Rows independent of the bucket too: for each (N, K, bias, operand
  // types) a reference algorithm — the untuned policy's, cuBLASLt's heuristic pick at M = 2048
  // with split-K off — and every tuned bucket takes the fastest candidate (the reference among
  // them) whose rows at the bucket's M equal the reference's bit for bit at that M; a bucket first
  // seen while capturing takes the reference. So a row's bits depend on N, K and the operand
  // types only, never on how many rows the call has (unless the reference cannot run some M:
  // counted in invariantMisses()). Set before the first call of a shape.
  void setRowInvariant(bool on) { row_invariant_ = on; }
  // [TAG_GEMM_CHAIN] Under row invariance, also time the K-chain tensor-core kernel
  // (gemm_chain.cuh, bf16 in and out, M buckets <= 16) — kept only where its rows equal the
  // reference's. Set before the first call of a shape.
  void setChainGemm(bool on) { chain_ = on; }
  // [TAG_CHAIN_PDL] The K-chain kernel launched programmatically (ChainGemmArgs::pdl): its first
  // weight tiles stream before it waits for the previous kernel. Same bits.
  void setChainPdl(bool on) { chain_pdl_ = on; }
  size_t chainWins() const { return chain_wins_; }
  // [TAG_GEMM_WG] Also time the Hopper weight-streaming kernel (gemm_wg.cuh: wgmma + TMA, split-K
  // in a cluster) as candidates for the M buckets <= kWgGemmMaxRows (bf16 in and out; an sm_90
  // device), held to the same M / 2 bit check; `pdl`: launched programmatically (its first weight
  // tiles stream before it waits for the previous kernel; same bits). Set before the first call
  // of a shape. Off by default until measured (rose: GARDEN_GEMM_WG=0|1|pdl).
  Status setWgGemm(bool on, bool pdl);
  size_t wgWins() const { return wg_wins_; }
  size_t invariantRejects() const { return invariant_rejects_; }  // candidates refused for it
  size_t invariantMisses() const { return invariant_misses_; }    // buckets it could not hold
  // [TAG_PDL_GEMV] The GEMV launched programmatically (GemvArgs::pdl). Same bits.
  void setGemvPdl(bool on) { gemv_pdl_ = on; }
  size_t gemvWins() const { return gemv_wins_; }
  // [TAG_GEMM_READ_FLUSH] How the timing flushes L2 before each timed run: false (the default
  // until measured) a memset of the flush buffer, which leaves L2 full of dirty lines the timed
  // GEMM then writes back; true a read of it (l2_flush.cuh): clean lines, as in a forward pass.
  // Process-global, read when a bucket is tuned (rose_llm_bench --gemm-flush read|write).
  static void setReadFlush(bool on);
  // [TAG_GEMM_TUNE_CHAIN] How a candidate is timed: false (the default) one launch after the L2
  // flush ("cold", the tuner's view until now); true 8 launches (gemm.cc kChainLaunches) back to
  // back after one flush, the per-launch mean ("chain": a launch's fixed cost and its overlap
  // with the kernel before it, programmatic launches included, count as in a graphed forward;
  // the weights come from HBM for the first launch and from L2 after). rose_kernel_bench
  // gemm_smallm's graphed chain had the programmatic Hopper GEMM ahead of cuBLASLt on the
  // N = 1024 linears at 64-128 rows, which the cold view never picks
  // (bench/results/gpu-embed-2026-12-07-s33).
  void setTuneChain(bool on) { tune_chain_ = on; }
  int64_t bucketOf(int64_t m) const;

  bool tuning() const { return tune_; }
  size_t variantFallbacks() const { return fallbacks_; }
  size_t tunedShapes() const { return tuned_; }         // algorithms chosen by timing
  size_t untimedInCapture() const { return untimed_; }  // first seen while capturing
  bool smallMEnabled() const { return smallm_; }
  size_t smallMWins() const { return smallm_wins_; }  // tuned buckets won by the custom kernel

 private:
  // One tuning choice: a cuBLASLt algorithm, or one of the custom kernels (the first field of
  // its group > 0).
  struct Choice {
    cublasLtMatmulAlgo_t algo{};
    int smallm_splits = 0;  // > 0: the small-M kernel (gemm_smallm.cuh), this split count
    int smallm_tile_n = 0;  // ... and this N tile
    int gemv_rows = 0;      // > 0: the GEMV (gemv.cuh), these rows per warp
    int gemv_unroll = 0;    // ... and this unroll
    int chain_stages = 0;   // > 0: the K-chain kernel (gemm_chain.cuh) [TAG_GEMM_CHAIN]
    int wg_splits = 0;      // > 0: the Hopper kernel (gemm_wg.cuh) [TAG_GEMM_WG], this split count
    int wg_warpgroups = 0;  // ... consumer warpgroups
    int wg_tok_tile = 0;    // ... and token tile
    // Any of the custom kernels (not a cuBLASLt algorithm).
    bool custom() const {
      return smallm_splits > 0 || gemv_rows > 0 || chain_stages > 0 || wg_splits > 0;
    }
  };
  struct Plan {  // owns its descriptors
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    Choice choice;  // what runs this shape (its bucket's tuned choice, or a fallback)
    Plan() = default;
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;
    ~Plan();
  };
  struct Operands {
    const __nv_bfloat16 *x, *w, *bias;
    void* y;       // bf16, or float when f32_out
    bool f32_out;  // y (and bias, if any) float32 (cuBLASLt only)
    cudaStream_t stream;
    bool f16 = false;  // x, w, bias, y hold fp16 bits (cuBLASLt only) [TAG_ATTN_F16]
  };
  // The operand types of a call, part of the plan and tuning keys.
  static constexpr int kIoBf16 = 0, kIoF32Out = 1, kIoF16 = 2, kIoF16F32Out = 3;
  static int ioOf(const Operands& o) {
    return o.f32_out ? (o.f16 ? kIoF16F32Out : kIoF32Out) : o.f16 ? kIoF16 : kIoBf16;
  }
  GemmRunner() = default;
  Result<Plan*> plan(int64_t m, int64_t n, int64_t k, const Operands& ops);
  // Shape checks, plan, cuBLASLt's choice only (runF32, runF16, runF16F32).
  Status runCublasLt(const Operands& ops, int64_t m, int64_t n, int64_t k);
  Status makeLayouts(Plan& p, int64_t m, int64_t n, int64_t k, bool bias, int io);
  // Heuristic choice for this plan's shape with split-K disabled; false when none qualifies.
  Result<bool> pickAlgo(Plan& p, cublasLtMatmulAlgo_t* out);
  // Tuning: the fastest (or, while capturing, the first) heuristic candidate for the bucket of
  // `exact` (whose shape is m x n x k), measured on `ops`.
  Result<Choice> chooseAlgo(Plan& exact, int64_t m, int64_t n, int64_t k, const Operands& ops);
  bool fits(const Plan& p, const cublasLtMatmulAlgo_t& algo) const;
  // [TAG_GEMM_ROW_INVARIANT] The reference algorithm of a (N, K, bias, io) shape (cached); false
  // when cuBLASLt has none without split-K.
  Result<bool> referenceAlgo(int64_t n, int64_t k, bool bias, int io, cublasLtMatmulAlgo_t* out);
  // Whether the first `bytes` of ops.y equal those of the flush buffer (copied to the host after
  // the stream's work): the comparison of both checks below.
  Result<bool> yMatchesFlush(const Operands& ops, size_t bytes);
  // Whether `choice` and the reference algorithm give the first rows of y the same bits at M = m.
  Result<bool> matchesReference(const Plan& exact, const Choice& choice,
                                const cublasLtMatmulAlgo_t& ref, int64_t m, int64_t n, int64_t k,
                                const Operands& ops);
  // Whether `algo` computes the first rows of y with the same bits at M = m and M = m / 2.
  Result<bool> rowsIndependentOfM(const Plan& exact, const Choice& choice, int64_t m, int64_t n,
                                  int64_t k, const Operands& ops);
  Status enqueue(const Plan& p, const cublasLtMatmulAlgo_t& algo, const Operands& ops);
  // `choice` at M = m (p is the plan of shape m x n x k).
  Status enqueueChoice(const Plan& p, const Choice& choice, int64_t m, int64_t n, int64_t k,
                       const Operands& ops);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  bool tune_ = true;
  bool smallm_ = true;
  bool small_buckets_ = false;
  bool gemv_ = false;
  bool gemv_only_ = false;
  bool gemv_pdl_ = false;
  size_t gemv_wins_ = 0;
  int num_sms_ = 0;
  void* flush_ = nullptr;  // L2 flush buffer for timing (allocated on the first tuning)
  size_t flush_bytes_ = 0;
  static constexpr int kTimedReps = 5;
  cudaEvent_t events_[2 * kTimedReps] = {};
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, int>, std::unique_ptr<Plan>> plans_;
  // Per (M bucket, N, K, bias, f32 out); the bucket is 0 for every M with tuning off.
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, int>, Choice> algos_;
  size_t fallbacks_ = 0;
  size_t tuned_ = 0;
  size_t untimed_ = 0;
  size_t m_dependent_ = 0;
  size_t smallm_wins_ = 0;
  bool row_invariant_ = false;  // [TAG_GEMM_ROW_INVARIANT]
  bool chain_ = false;          // [TAG_GEMM_CHAIN]
  bool chain_pdl_ = false;      // [TAG_CHAIN_PDL]
  size_t chain_wins_ = 0;
  bool wg_ = false;      // [TAG_GEMM_WG]
  bool wg_pdl_ = false;
  bool tune_chain_ = false;  // [TAG_GEMM_TUNE_CHAIN]
  size_t wg_wins_ = 0;
  std::map<std::tuple<int64_t, int64_t, bool, int>, std::pair<bool, cublasLtMatmulAlgo_t>> refs_;
  size_t invariant_rejects_ = 0;
  size_t invariant_misses_ = 0;
};

}  // namespace garden::rose::cuda
