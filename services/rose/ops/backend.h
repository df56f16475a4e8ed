#pragma once
// The op interface rose's model code is written against. A Backend owns device memory and an
// ordered execution queue (a CUDA stream; on the CPU a compute thread); model code (e.g.
// services/rose/model/qwen3.*) is written once against it. Two implementations:
//   - "cpu"  (services/rose/ops/cpu/): the fp32 reference CI runs; weights and activations f32.
//   - "cuda" (services/rose/ops/cuda/): bf16 weights and activations; built only with CUDA.
//
// Memory. allocate() returns a move-only Buffer (frees on destruction); Tensor is a non-owning,
// contiguous, row-major view (pointer + dtype + shape). Weights are uploaded once at load with
// uploadConvert(), which converts host f32/bf16/f16 into the destination tensor's dtype. The
// model allocates its per-batch activation workspace once, sized from max_batch_tokens, so the
// hot path never allocates.
//
// Execution [TAG_ROSE_LAZY]. Every op and copy is *enqueued* in order on the backend's queue:
//   - the engine calls launch(work): CUDA runs `work` inline on the calling thread (it only
//     enqueues kernels); CPU hands `work` to its compute thread and returns at once. Inside
//     `work` the op methods execute (CPU) or enqueue (CUDA) in program order;
//   - recordEvent(e) marks "everything launched so far"; e.query() / e.wait() tell when it has
//     finished. The engine's completion thread waits on the event, then publishes the result.
//   - Called outside launch(), the ops run (CPU) or enqueue (CUDA) on the calling thread, in
//     order with what was launched before; synchronize() waits for all of it. Tests do this.
// Contracts every op shares: shapes and dtypes are validated by the caller (the model); an op
// given inconsistent views CHECK-fails (a broken invariant, not a request error). Views must not
// overlap unless the op says so. Counts come from the params (host values), never read back
// from device memory.
//
// Threads: one thread (the engine's step thread, or the loader before serving) calls launch()
// and the op/copy/upload methods; event query()/wait() may be called from any thread.
//
// Step progress [TAG_STEP_PROGRESS]. A forward pass may legitimately take minutes (a 2,049-token
// input through 28 layers on two CPU cores), while a wedged compute queue must be caught in
// seconds; the step thread's heartbeat cannot tell the two apart, because it beats while the
// queue is stuck. So the backend advances a progress counter *as its queue executes*, and tulip
// declares the worker stuck when a batch is in flight and the counter stops moving
// (services/tulip/worker/shm_worker.h). Model code calls markProgress() once per layer; a
// backend may advance the counter more often on its own (the CPU backend also does inside long
// ops, so no single stretch of work without an advance is longer than a small fraction of a
// second). The counter is a word in the shm channel's header (shm::Channel::progressCounter()).

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "common/safetensors.h"  // garden::DType
#include "common/status.h"

namespace garden::rose {

class Backend;

// A non-owning, contiguous, row-major view of device (or, for the CPU backend, host) memory.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int32_t ndim = 0;
  std::array<int64_t, 4> shape{};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims) : data(d), dtype(t) {
    for (int64_t s : dims) shape[static_cast<size_t>(ndim++)] = s;
  }

  bool empty() const { return data == nullptr; }
  int64_t numel() const {
    int64_t n = 1;
    for (int32_t i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
    return ndim == 0 ? 0 : n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype); }
  int64_t dim(int32_t i) const { return shape[static_cast<size_t>(i)]; }
  // 2-D helpers: rows = dim 0, cols = product of the others.
  int64_t rows() const { return ndim == 0 ? 0 : shape[0]; }
  int64_t cols() const { return rows() == 0 ? 0 : numel() / rows(); }
  // Rows [first, first+count) of a view whose first dim is rows; same trailing dims.
  Tensor rowSlice(int64_t first, int64_t count) const {
    Tensor t = *this;
    t.data = static_cast<std::byte*>(data) + static_cast<size_t>(first * cols()) * dtypeSize(dtype);
    t.shape[0] = count;
    return t;
  }
  // The same memory seen with another shape of equal numel (CHECKed by callers).
  Tensor reshaped(std::initializer_list<int64_t> dims) const {
    Tensor t(data, dtype, dims);
    return t;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// Host data to upload (weights, tables). F32, F16 or BF16 for float destinations; I32 → I32.
struct HostView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t numel = 0;
};

// Move-only owner of one device allocation; frees through its backend on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* owner, void* data, size_t bytes) : owner_(owner), data_(data), bytes_(bytes) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      owner_ = std::exchange(o.owner_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // The backend that allocated it (nullptr: memory the caller owns, e.g. a wrapped mapping).
  Backend* owner() const { return owner_; }
  inline void reset();

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A tensor together with the buffer that holds it (weights, workspace blocks).
struct OwnedTensor {
  Buffer buffer;
  Tensor view;
};

// Completion marker on the backend's queue (CUDA: a cudaEvent_t; CPU: a task sequence number).
// Create once (per pipeline slot), record per batch.
class Event {
 public:
  virtual ~Event() = default;
  // True when all work enqueued before the last recordEvent(*this) has finished (true if never
  // recorded). Never blocks.
  virtual bool query() = 0;
  // Blocks until then. Returns an error only when the device failed (a sticky CUDA error).
  virtual Status wait() = 0;
};

enum class PoolMode : uint8_t { kLast = 1, kMean = 2, kCls = 3 };

// The bf16 cuBLASLt MoE path's thresholds (CudaKernelOptions::moe_prefill below): kStep's floor
// in tokens (above the largest graph-captured decode batch), and the average rows per expert at
// which a chunk or a step takes the path — where it starts to win, measured on the H200
// (docs/gpt-oss-cuda.md): gpt-oss-20b (32 experts) from 2,048-token chunks, gpt-oss-120b (128
// experts) from 8,192.
inline constexpr int64_t kMoePrefillCublasMinTokens = 1024;
inline constexpr int64_t kMoePrefillMinRowsPerExpert = 256;
// ... with the wgmma kernel [TAG_MOE_WGMMA] (CudaKernelOptions::moe_wgmma_min_rows_per_expert).
inline constexpr int64_t kMoeWgmmaMinRowsPerExpert = 64;

// Kernel choices of the cuda backend, for side-by-side runs (the defaults are the fastest
// measured; the cpu backend ignores them). The backend never reads the environment: rose reads
// GARDEN_* once at start-up (cudaKernelOptionsFromEnv, services/rose/main.cc).
struct CudaKernelOptions {
  // Attention (ops/cuda/attention.cuh AttentionPolicy): true = the size policy may pick the
  // wide-warp variants (kAuto); false = narrow warps only (kNarrow). attention_sm90: the Hopper
  // wgmma + TMA kernel for every head_dim 128 batch (kSm90; other head sizes keep the size
  // policy). GARDEN_ATTENTION_KERNEL=auto|sm90 (both: attention_sm90, the default since its H200
  // run: 4096-token embedding 17.6 -> 11.6 ms, bench/results/gpu-embed-2026-12-02-h200),
  // mma (the mma.sync size policy alone) or narrow (narrow mma.sync warps only).
  bool attention_wide = true;
  bool attention_sm90 = true;
  // GEMMs (ops/cuda/gemm.h): time cuBLASLt's candidates per (M bucket, N, K) (GARDEN_GEMM_TUNE=1)
  // or take the heuristic's pick (0); with tuning, also time the custom small-M kernel
  // (GARDEN_GEMM_SMALLM=1; off: it lost at every M >= 64 bucket on the H200).
  bool gemm_tune = true;
  bool gemm_smallm = false;
  // [TAG_GEMM_WG] With tuning, also time the Hopper weight-streaming GEMM (ops/cuda/gemm_wg.cuh:
  // wgmma + TMA, split-K in a cluster) for M buckets <= 512 on sm_90 devices: 0 off, 1 on, 2 on
  // and launched programmatically. GARDEN_GEMM_WG=0|1|pdl. Off until an A/B on the GPU says.
  int32_t gemm_wg = 0;
  // [TAG_GEMM_TUNE_CHAIN] With tuning, time each candidate as 8 launches back to back (the
  // per-launch mean) instead of one launch after an L2 flush: GARDEN_GEMM_TUNE_VIEW=cold|chain.
  // Off until an A/B on the GPU says (ops/cuda/gemm.h GemmRunner::setTuneChain).
  bool gemm_tune_chain = false;
  // Programmatic dependent launch of eager kernel launches (ops/cuda/common.cuh [TAG_PDL]):
  // GARDEN_PDL=0|1.
  bool pdl = true;
  // gpt-oss prefill attention (ops/cuda/paged_attention_sm90.cuh [TAG_PAGED_ATTN_SM90]): chunks of
  // at least this many query tokens take the Hopper paged kernel, the rest the mma.sync kernel;
  // 0 = the mma.sync kernel for everything. GARDEN_PAGED_ATTENTION=sm90 (128) | mma (0).
  int32_t paged_attention_sm90_min_tokens = 128;
  // gpt-oss MoE work over MXFP4 experts that takes the bf16 cuBLASLt path (ops/cuda/moe_lt_gemm.h
  // [TAG_MOE_LT_BF16]: the experts dequantized per call, per-expert bf16 GEMMs) instead of the
  // tiled MXFP4 kernels, never inside a captured graph:
  //   kAuto (default) [TAG_MOE_PREFILL_AUTO]: where the wgmma kernel [TAG_MOE_WGMMA] runs every
  //     MXFP4 expert the model uploaded, whole steps of at least that kernel's floor of rows per
  //     expert (any token count) are one MoE call on it — its bits are the tiled kernels', so a
  //     row's bits still never depend on the rest of the step; otherwise kChunk. Measured on the
  //     H200 (2026-12-04 s11, 256 streams 1k/1k): 16,704 vs 16,349 output tok/s, TTFT p50 4.14
  //     vs 4.54 s against kChunk;
  //   kChunk: each sequence's prefill chunk of at least
  //     moe_prefill_min_rows_per_expert rows per expert on average (tokens x top_k / experts)
  //     runs as its own MoE call on it, the rest of the step on the tiled kernels — a row's bits
  //     depend on its own chunk only, never on what else is in the step (decode rows always
  //     stay on the tiled kernels);
  //   kStep: whole steps of at least kMoePrefillCublasMinTokens tokens and that many rows per
  //     expert (the other rows of such a step get other bits than alone);
  //   kTiled: never.
  // GARDEN_MOE_PREFILL=auto | chunk | step (or cublas) | tiled.
  enum class MoePrefill : uint8_t { kTiled = 0, kChunk = 1, kStep = 2, kAuto = 3 };
  MoePrefill moe_prefill = MoePrefill::kAuto;
  int64_t moe_prefill_min_rows_per_expert = kMoePrefillMinRowsPerExpert;
  // How that path runs (ops/cuda/moe_lt_gemm.h): its per-expert matmuls spread over this many
  // streams (1..8; GARDEN_MOE_LT_STREAMS) [TAG_MOE_LT_STREAMS]; the expert biases added by the
  // matmuls' epilogue instead of separate kernels (GARDEN_MOE_LT_EPILOGUE=0|1)
  // [TAG_MOE_LT_EPILOGUE]; the down projection dequantized on its own stream while the gate_up
  // matmuls run, into a second scratch (GARDEN_MOE_LT_OVERLAP=0|1) [TAG_MOE_LT_OVERLAP].
  int32_t moe_lt_streams = 4;
  bool moe_lt_bias_epilogue = true;
  bool moe_lt_overlap_dequant = false;
  // Instead of the dequantization + per-expert cuBLASLt matmuls: one wgmma launch per projection
  // over the resident MXFP4 experts, dequantized in registers (ops/cuda/moe_wgmma.cuh; sm_90,
  // scale bytes <= 128; GARDEN_MOE_LT_WGMMA=0|1) [TAG_MOE_WGMMA]. Needs no weight scratch, and
  // gives the tiled kernels' bits (measured on the H200, 2026-12-04 s10).
  bool moe_lt_wgmma = true;
  // With it, chunks (kChunk) / steps (kStep) of at least this many rows per expert take the path
  // (the smaller of this and moe_prefill_min_rows_per_expert, which stays the cuBLASLt GEMMs'
  // floor): the kernel needs no per-call dequantization, so it beats the tiled kernels from
  // ~48-64 rows per expert (measured on the H200, 2026-12-04 s10).
  int64_t moe_wgmma_min_rows_per_expert = kMoeWgmmaMinRowsPerExpert;
  // [TAG_MOE_WGMMA_DEVICE_PLAN] The wgmma path's token tiles planned on the device (no expert
  // ranges to the host: no device-to-host copy and wait per layer), GARDEN_MOE_WGMMA_DEVICE_PLAN=
  // 0|1. On since 2026-12-04 s12: tests, memcheck and the A/B passed on the H200 (20b 8k
  // 0.1208 vs 0.1212 s, 32k 0.6345 vs 0.6372; 120b 8k 0.2177 vs 0.2180), and it drops a
  // per-layer host wait; 0 keeps the host plan for A/B runs (gpu_llm.sh wgplanab).
  bool moe_wgmma_device_plan = true;
  // [TAG_MOE_WGMMA_SMEM_A] The wgmma kernel with its A operand in shared memory: a warpgroup of
  // its own dequantizes each K tile into shared-memory A tiles and the consumers issue only
  // shared-memory wgmmas (moe_wgmma.cu). Same A values and k16 order as the register form (bits
  // equal to the tiled kernels, H200 s26). Off: much slower on the H200 (s26: 20b prefill 8k
  // 0.1704 vs 0.1192 s, 120b 8k 0.3161 vs 0.2142): one dequantizing warp per scheduler is a
  // latency-bound chain the consumers wait for (docs/gpt-oss-cuda.md). The s25 form (consumers
  // storing their own A tiles) was slower too.
  // GARDEN_MOE_WGMMA_SMEM_A=0|1, rose_llm_bench --moe-wgmma-smem-a on|off.
  bool moe_wgmma_smem_a = false;
  // The f32 router [TAG_ROUTER_F32] on bf16 tensor cores [TAG_ROUTER_MMA] (every product exact
  // in f32 through split operands; ops/cuda/moe_router_f32.cuh RouterMmaArgs) instead of the
  // CUDA-core f32 kernel: GARDEN_ROUTER_MMA=0|1. Read when a model uploads its router weights (the
  // layout follows it). Off: measured on the H200 (2026-12-04 s11) it is 3.6 % faster at 120b
  // prefill 8k but slower at decode (b1@8k 3.03 vs 2.58 ms at 20b) and its f32 sums on the tensor
  // cores are ~8x further from f64 than the CUDA-core kernel's.
  bool router_mma = false;
  // [TAG_PDL_GEMV] gpt-oss decode at one token: the QKV and O-proj GEMMs on the CUDA-core GEMV
  // (ops/cuda/gemv.cuh; the only candidate of the M = 1 bucket) launched programmatically, in
  // CUDA graphs too, so that it is scheduled while the norm or the attention before it finishes
  // (ops/cuda/common.cuh). GARDEN_PDL_GEMV=0|1. Measured on an H100 (bench/results/
  // gpu-llm-2026-12-05-s19, call 4): decode b1@8k 2.794 / 2.784 ms against 2.859 / 2.872 (-2.7 %),
  // b8 / b64 unchanged. Off by default: a one-token step's QKV / O-proj then round differently
  // from the same row in a larger step (cuBLASLt), so a sequence's greedy tokens can depend on
  // whether it decodes alone (GpuGptOss.ChunkModeTokensDoNotDependOnTheBatch failed with it on).
  bool pdl_gemv = false;
  // [TAG_GEMM_ROW_INVARIANT] gpt-oss's dense GEMMs (QKV, O-proj, lm_head): every M bucket
  // of a shape takes only algorithms that give a row the bits of one reference algorithm
  // (GemmRunner::setRowInvariant), so a sequence's rows do not depend on how many rows its step
  // has. Per-bucket tuning alone does not hold that at gpt-oss's shapes: the tuner picked split-K 3
  // for the O-proj (2880 x 4096) at M = 1-4 and split-K 2 at M = 8 (H200 log,
  // bench/results/gpu-llm-2026-12-03-h200-s4/call3-gemv-tuned.jsonl; the H100 again on
  // 2026-12-06: split-K 3 at M = 2 and 3, cuBLASLt's candidates within 1 % of each other, so the
  // pick is timing noise). On by default since 2026-12-06 (s24, H100, bench/results/
  // gpu-llm-2026-12-06-s24): with it every bucket of QKV, O-proj and an f32-output shape equals
  // the reference (off: O-proj M = 2-4 differ), the model suite passes, and it costs nothing
  // (b1@8k 2.739 / 2.738 ms against 2.799 / 2.834 off; b8, b64 and prefill 8k / 32k within
  // noise): the K-chain kernel [TAG_GEMM_CHAIN] wins QKV's and O-proj's M = 1 buckets.
  // GARDEN_GEMM_ROW_INVARIANT=0|1.
  bool gemm_row_invariant = true;
  // [TAG_CHAIN_PDL] The K-chain GEMM kernel (gemm_chain.cuh; the M = 1 QKV and O-proj buckets it
  // wins under row invariance) launched programmatically, in CUDA graphs too: it streams its first
  // weight tiles before waiting for the previous kernel (the RMSNorm, the attention combine), so
  // they overlap that kernel's tail and the launch. Same bits. On since measured on an H100
  // (2026-12-06 s25, bench/results/gpu-llm-2026-12-06-s25): its kernel tests, the whole model
  // suite with it on and --batch-check 8,64 (every logits row bit-equal) passed; decode b1@8k
  // 2.702 / 2.708 ms against 2.730 / 2.743 off (-1.1 %), b8@4k and b64@1k within noise.
  // rose_llm_bench --chain-pdl on|off; GARDEN_CHAIN_PDL=0|1.
  bool chain_pdl = true;
  // [TAG_PDL_GRAPH] The gpt-oss kernels of rose's own (RMSNorm, RoPE + KV write, paged attention
  // and its combine, the f32 router, the route, the MoE align, the MoE GEMMs, the combine)
  // launched programmatically, in CUDA graphs too: each waits for the previous kernel in its first
  // statement and lets the next be scheduled early (the small ones at once, the MoE GEMMs when
  // their products are done), so the launch latency of each kernel overlaps the tail of the one
  // before; the router's weight loads are issued before its wait. Same bits. On since measured on
  // an H100 (2026-12-05 s20, bench/results/gpu-llm-2026-12-05-s20; four rounds over two machine
  // starts): decode b1@8k -0.6 to -2.6 %, b8@4k -0.4 to -1.5 %, b64@1k -0.7 to -1.0 %; the whole
  // GPU LLM model / ops / kernel suites and the embedding model-graph test passed with it on.
  // GARDEN_PDL_GRAPH=0|1.
  bool pdl_graph = true;
  // [TAG_ATTN_FP8_OUT] With --weights fp8 (the O-proj in FP8), the Hopper attention writes the
  // O-proj's e4m3 codes and scales from its epilogue instead of a bf16 output quantized by a
  // kernel of its own (same bits). GARDEN_ATTN_FP8_OUT=0|1.
  bool attention_fp8_out = true;
  // [TAG_QK_ROPE_PAIR] The Qwen3 q/k RMSNorm + RoPE kernel (ops/cuda/qk_norm_rope.cuh
  // QkNormRopeArgs::variant): 0 = by size, -1 = the legacy kernel, 1 / 2 / 4 / 8 = the pair
  // kernel with that many heads per warp. GARDEN_QK_ROPE=auto|legacy|pair1|pair2|pair4|pair8.
  int32_t qk_rope_variant = 0;
};

// The --moe-prefill / GARDEN_MOE_PREFILL names: auto, chunk, step (or its old name cublas), tiled.
// False for any other name (`out` untouched).
bool moePrefillFromName(std::string_view name, CudaKernelOptions::MoePrefill* out);

// Sets the fields of `opts` whose GARDEN_* variable (above) is set and not empty; INVALID_ARGUMENT
// naming the variable, its value and the accepted ones otherwise. For start-up code (rose's main,
// benchmarks).
Status cudaKernelOptionsFromEnv(CudaKernelOptions& opts);

struct BackendOptions {
  int32_t threads = 0;              // CPU: compute threads (0 = hardware concurrency)
  int32_t device_index = 0;         // CUDA: which GPU
  int64_t max_batch_tokens = 8192;  // upper bound on tokens of one launched batch
  CudaKernelOptions cuda;           // CUDA: kernel choices
};

// ---- op params (POD) ----

struct RmsNormParams {
  float eps = 1e-6f;
  // residual = x instead of residual += x (the first layer starting the stream from the
  // embedding in x, when the stream is wider than the activations).
  bool residual_init = false;
  // Backends that round (bf16 activations): true rounds the normalized row before the weight
  // multiply (Hugging Face's Qwen3RMSNorm); false multiplies in f32 and rounds once (gpt-oss:
  // GptOssRMSNorm and the spec's "compute in float32, then cast").
  bool round_normalized = true;
  // [TAG_PDL_GRAPH] Backends that launch kernels programmatically inside CUDA graphs
  // (CudaKernelOptions::pdl_graph) do so for this norm: gpt-oss, whose other kernels wait
  // programmatically too. The Qwen3 embedding graphs keep plain launches (their programmatic
  // norms measured no gain, 1-3 % slower at one sequence: bench/results/gpu-llm-2026-12-06-s21).
  bool programmatic_in_graphs = false;
};

// Per-head RMSNorm over head_dim (weight [head_dim]) then rotary embedding (NeoX "rotate half":
// pairs (i, i + rotary_dim/2)), in place on the q and k heads of a packed qkv tensor.
struct QkNormRopeParams {
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t rotary_dim = 0;  // <= head_dim, even; dims beyond it pass through
  float eps = 1e-6f;
  bool apply_norm = true;  // false: RoPE only (models without QK norm)
};

// Ragged (varlen) attention over sequences packed back to back.
struct AttentionParams {
  int32_t num_seqs = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;  // divides num_q_heads (GQA: q head h reads kv head h / group)
  int32_t head_dim = 0;
  int32_t max_seqlen = 0;  // host-known longest sequence (for kernel planning)
  float scale = 0.f;       // usually 1/sqrt(head_dim)
  bool causal = true;      // false: bidirectional within each sequence
};

// [TAG_EMBED_FP8] An FP8 e4m3 matrix: codes and their f32 block scales (Backend::linearFp8).
struct Fp8Matrix {
  Tensor codes;   // U8 [R, C]
  Tensor scales;  // F32, the layout of its role (Backend::supportsFp8Linear)
};

struct PoolParams {
  int32_t num_seqs = 0;
  PoolMode mode = PoolMode::kLast;
  bool normalize = true;  // L2-normalize each pooled row (eps 1e-12 on the norm, like torch)
};

// Scores from the last token of each sequence: z = h·W[pos_row] − (neg_row >= 0 ? h·W[neg_row] :
// 0), score = sigmoid(z) when apply_sigmoid, else z. Reranker yes/no: W = lm_head, pos = yes, neg =
// no. Classification head: W = score.weight, pos = 0, neg = -1.
struct ScoreParams {
  int32_t num_seqs = 0;
  int32_t pos_row = 0;
  int32_t neg_row = -1;
  bool apply_sigmoid = true;
};

// Optional capability [TAG_GRAPH_EXEC]: replaying whole forward passes (CUDA graphs). `body`
// enqueues ops of the owning backend only, reads every per-batch value from device buffers at
// fixed addresses and uses host values (counts, pointers) that depend on the key alone; it runs on
// the calling thread (the backend's launching thread). run(): first sight of a key runs `body`
// eagerly, the second captures and launches it, later ones replay the capture. precapture(): a
// warm-up run plus the capture now. Backends without graphs return nullptr from graphs().
struct GraphShapeKey {
  uint32_t kind = 0;     // what the body computes (e.g. shm::BatchKind)
  uint32_t seqs = 0;     // sequences bucket
  uint32_t tokens = 0;   // tokens bucket
  uint64_t variant = 0;  // anything else the body bakes in (pooling mode, head rows, ...)
};
// Buckets: tokens pad to a multiple of 64 up to 1024, of 256 above; sequences to the next power
// of two. 0 stays 0.
inline uint32_t graphTokensBucket(uint32_t tokens) {
  const uint32_t step = tokens <= 1024 ? 64 : 256;
  return (tokens + step - 1) / step * step;
}
inline uint32_t graphSeqsBucket(uint32_t seqs) {
  if (seqs == 0) return 0;
  uint32_t b = 1;
  while (b < seqs) b <<= 1;
  return b;
}
struct GraphExecStats {
  uint64_t eager = 0;
  uint64_t captures = 0;
  uint64_t replays = 0;
  uint64_t capture_failures = 0;
};
class GraphExecutor {
 public:
  virtual ~GraphExecutor() = default;
  virtual Status run(const GraphShapeKey& key, const std::function<void()>& body) = 0;
  virtual Status precapture(const GraphShapeKey& key, const std::function<void()>& body) = 0;
  virtual GraphExecStats graphStats() const = 0;
};

// [TAG_KV_PULL_CUDA] The bytes of a CUDA IPC memory handle (cudaIpcMemHandle_t is 64 bytes).
struct PeerMemoryHandle {
  std::array<unsigned char, 64> bytes{};
};

// [TAG_KV_PULL_CUDA] A copy of KV blocks from one paged cache into another (the layout of
// ops/paged_kv_cache.h: K and V each one allocation, per layer [layer blocks][block bytes]; with
// a window pool its layers hold `*_blocks_window` blocks, the others `*_blocks`). For every layer
// l and pair i of its pool (window_pairs for a window layer, pairs otherwise; (src, dst) flat):
// dst_k[l][dst] = src_k[l][src], the same for V. Both caches have the same layers, block bytes
// and window layers; ids are in range and no destination repeats (the caller checks).
struct KvBlockCopy {
  const void* src_k = nullptr;
  const void* src_v = nullptr;
  void* dst_k = nullptr;
  void* dst_v = nullptr;
  int32_t layers = 0;
  uint64_t window_layers = 0;  // bit l: layer l is in the window pool (0: no window pool)
  int32_t src_blocks = 0, src_blocks_window = 0;
  int32_t dst_blocks = 0, dst_blocks_window = 0;
  int64_t block_bytes = 0;
  std::span<const int32_t> pairs;
  std::span<const int32_t> window_pairs;
  bool windowLayer(int32_t l) const { return l < 64 && ((window_layers >> l) & 1u) != 0; }
  // Offset of layer l in blocks of the source (src = true) or destination pool.
  int64_t layerBlockOffset(int32_t l, bool src) const {
    const int32_t full = src ? src_blocks : dst_blocks;
    const int32_t win = src ? src_blocks_window : dst_blocks_window;
    int64_t off = 0;
    for (int32_t i = 0; i < l; ++i) off += windowLayer(i) ? win : full;
    return off;
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  // The graph capability (see GraphExecutor), or nullptr (the CPU backend).
  virtual GraphExecutor* graphs() { return nullptr; }

  virtual std::string_view name() const = 0;  // "cpu" | "cuda"
  // Storage types this backend wants: the model allocates with these.
  virtual DType weightDType() const = 0;      // cpu: F32, cuda: BF16
  virtual DType activationDType() const = 0;  // cpu: F32, cuda: BF16
  virtual DType residualDType() const = 0;    // the residual stream (may be wider)

  // ---- memory ----
  // Device memory of `bytes` (aligned to 256). RESOURCE_EXHAUSTED when out of memory.
  virtual Result<Buffer> allocate(size_t bytes) = 0;
  // Convenience: a buffer sized for (dtype, dims) and its view.
  Result<OwnedTensor> allocateTensor(DType dtype, std::initializer_list<int64_t> dims);
  // Synchronous (load time): converts `src` into `dst` (dst.numel() == src.numel). Float
  // destinations accept F32/F16/BF16 sources; I32 accepts I32.
  virtual Status uploadConvert(const Tensor& dst, const HostView& src) = 0;
  // Free device memory in bytes now (sizing the KV cache from what the weights left);
  // UNIMPLEMENTED on backends whose memory is host memory (CPU).
  virtual Result<uint64_t> deviceMemoryFree() { return unimplemented("no device memory"); }
  // Pins host memory the queue will copy from/to (the shm arenas); CPU: no-op.
  virtual Status registerHostMemory(void* ptr, size_t bytes) { return okStatus(); }
  virtual void unregisterHostMemory(void* ptr) {}

  // ---- ordered execution ----
  // See [TAG_ROSE_LAZY] above. `work` must not throw; it runs exactly once.
  virtual void launch(std::function<void()> work) = 0;
  virtual Result<std::unique_ptr<Event>> createEvent() = 0;
  virtual Status recordEvent(Event& event) = 0;
  // Waits for everything enqueued so far.
  virtual Status synchronize() = 0;

  // Enqueued copies. copyToDevice: `src` may be reused as soon as the call returns (the
  // backend stages it if it must). copyToHost: `dst` is written when the work completes (after
  // an event recorded later fires).
  virtual void copyToDevice(const Tensor& dst, const void* src, size_t bytes) = 0;
  virtual void copyToHost(void* dst, const Tensor& src, size_t bytes) = 0;

  // ---- memory shared with other processes of this host [TAG_KV_PULL_CUDA] ----
  // A handle another process may map (CUDA IPC); `base` must be the start of an allocation of
  // this backend. UNIMPLEMENTED on backends whose memory is host memory (CPU: shared memory
  // segments do that job, parallel/kv_handoff.h).
  virtual Result<PeerMemoryHandle> exportPeerMemory(const void* base) {
    return unimplemented(std::string("peer memory export on the ") + std::string(name()) +
                         " backend");
  }
  // Maps another process's exported allocation (read and write) and returns its start; undone
  // by closePeerMemory. A process cannot map its own export (CUDA refuses).
  virtual Result<void*> openPeerMemory(const PeerMemoryHandle& handle) {
    return unimplemented(std::string("peer memory on the ") + std::string(name()) + " backend");
  }
  virtual void closePeerMemory(void* mapped) {}
  // Enqueued: copies KV blocks between two paged caches (KvBlockCopy says how). The pairs are
  // the caller's checked ones (parallel/kv_handoff.h checkKvBlockPairs) and are read before the
  // call returns. cpu: memcpy on its queue; cuda: one kernel.
  virtual Status copyKvBlocks(const KvBlockCopy& copy) {
    return unimplemented(std::string("kv block copy on the ") + std::string(name()) + " backend");
  }

  // ---- step progress [TAG_STEP_PROGRESS] ----
  // The word this backend advances while its queue executes (nullptr: none, the default). Set
  // once, before work is launched, from the launching thread; the word must outlive the backend's
  // work (it lives in the shm channel, which outlives the engine and its backend).
  virtual void setProgressCounter(std::atomic<uint64_t>* counter) {}
  // True when this backend advances the counter while computing (markProgress and, for long ops,
  // inside them). tulip judges a worker that reports progress by it, and one that does not by a
  // per-step limit scaled to the step's work. cpu: true. cuda: false until markProgress is
  // implemented there (see cuda_backend.cc).
  virtual bool reportsProgress() const { return false; }
  // Enqueued like an op: the counter advances (by at least 1) when the queue reaches this point,
  // never earlier, and without the calling thread waiting for the device. Model code calls it at
  // every layer boundary. The contract for an implementation: the write must become visible to
  // another process reading the counter with an acquire/relaxed load within a few milliseconds of
  // the queue passing this point; a monotonic increment (values only grow); no allocation, no
  // synchronization with the launching thread; valid inside a captured CUDA graph (it is replayed
  // with the graph). The default is a no-op (a backend that does not report progress).
  virtual void markProgress() {}

  // ---- ops (enqueued) ----
  // out[t, :] = table[ids[t], :]. ids I32 [T] (< rows(table), checked by the caller), table
  // weight dtype [V, H], out residual dtype [T, H].
  virtual void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) = 0;

  // With residual: residual = x + residual (p.residual_init: residual = x), then
  // out = rmsnorm(residual) * weight. Without (residual.empty()): out = rmsnorm(x) * weight.
  // residual is residualDType() or F32 (the cuda backend keeps an F32 stream unrounded: gpt-oss).
  // x, out [T, H] (activation dtype; out may alias x; x may alias residual only when residual is
  // empty, i.e. the first norm reads the residual stream directly); weight [H]; the mean of
  // squares is accumulated in f32.
  virtual void rmsNorm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                       const Tensor& out, const RmsNormParams& p) = 0;

  // y[T, N] = x[T, K] · w[N, K]^T (+ bias[N] when non-empty). w weight dtype, x/y activation;
  // y may also be F32 when bias is empty (logits: the gpt-oss router and lm_head), and on the
  // CUDA backend with F16 x and w an F32 y may take an F32 bias (gpt-oss's projections kept in
  // f32 [TAG_PROJ_F32]).
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) = 0;
  // [TAG_CPU_ROW_INVARIANT] From now on linear() gives each row of x the bits it gets alone,
  // whatever the other rows (a model whose sampled tokens must not depend on the batch asks at
  // load: gpt-oss). The cpu backend then multiplies in fixed 8-row groups (ops/cpu/gemm.h; slower
  // for long prompts); the cuda backend's tuned GEMMs already keep a row's bits across row counts.
  virtual void setRowInvariantLinear(bool on) { (void)on; }
  // Load time: makes linear() of this weight (and bias; y of `y_dtype`) ready for every row
  // count up to max_rows, so that no step later stalls on one-time work (the cuda backend times
  // its GEMM candidates once per M bucket: it runs every bucket now, on pseudo-random rows).
  // Returns how many row counts it ran; 0 where linear() has no such work (cpu).
  virtual Result<int64_t> prewarmLinear(const Tensor& w, const Tensor& bias, DType y_dtype,
                                        int64_t max_rows) {
    return int64_t{0};
  }

  // ---- [TAG_EMBED_FP8] FP8 e4m3 linear layers (Qwen3's --weights fp8) ----
  // Only where supportsFp8Linear() (cuda); the defaults abort. An Fp8Matrix is U8 codes [R, C]
  // (C a multiple of 128) with F32 scales in cuBLASLt's Hopper block-scaling layouts
  // (ops/cuda/fp8_dense.cuh): a weight [N, K] one scale per 128x128 block, scales
  // [ceil(N/128), K/128 rounded up to 4]; an activation [M, K] one per row and 128 inputs, scales
  // [K/128, M] (the row fastest). Each block: scale = amax/448, code = e4m3(v * (448/amax)),
  // round to nearest even, saturating; an all-zero block scale 1. Activation producers take the
  // values their bf16 op would write (rounded) and quantize those.
  virtual bool supportsFp8Linear() const { return false; }
  // Load time: out = quantized w (weight dtype [N, K]).
  virtual void quantizeFp8Weight(const Tensor& w, const Fp8Matrix& out);
  // out = quantized x (activation dtype [M, K]).
  virtual void quantizeFp8(const Tensor& x, const Fp8Matrix& out);
  // rmsNorm() with its output quantized into `out` instead of written.
  virtual void rmsNormFp8(const Tensor& x, const Tensor& residual, const Tensor& weight,
                          const Fp8Matrix& out, const RmsNormParams& p);
  // swiglu() with its output quantized into `out`.
  virtual void swigluFp8(const Tensor& gate_up, const Fp8Matrix& out);
  // attention() with its output quantized into `out` (the O-proj's operand, [T, Hq·D]): the same
  // bits as attention() into `scratch` (activation dtype [T, Hq·D]) followed by quantizeFp8(),
  // which is what the default does; cuda writes the codes from its Hopper kernel's epilogue
  // instead [TAG_ATTN_FP8_OUT] and leaves `scratch` alone.
  virtual void attentionFp8(const Tensor& qkv, const Tensor& cu_seqlens, const Tensor& scratch,
                            const Fp8Matrix& out, const AttentionParams& p);
  // y[M, N] (activation dtype) = x · wᵀ with both operands dequantized (f32 accumulation). M a
  // multiple of 4.
  virtual void linearFp8(const Fp8Matrix& x, const Fp8Matrix& w, const Tensor& y);

  // In place on qkv [T, (Hq + 2·Hkv)·D] (q heads, then k heads, then v heads per row):
  // per-head RMSNorm of q (q_weight [D]) and k (k_weight [D]), then RoPE with the position of
  // each token: positions I32 [T]; cos, sin F32 [max_pos, rotary_dim/2].
  virtual void qkNormRope(const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                          const Tensor& positions, const Tensor& cos, const Tensor& sin,
                          const QkNormRopeParams& p) = 0;

  // out [T, Hq·D] = softmax(q·kᵀ·scale [+ causal mask]) · v within each sequence.
  // qkv packed as for qkNormRope; cu_seqlens I32 [num_seqs + 1] (0, len0, len0+len1, ...).
  virtual void attention(const Tensor& qkv, const Tensor& cu_seqlens, const Tensor& out,
                         const AttentionParams& p) = 0;

  // out [T, I] = silu(gate_up[:, :I]) * gate_up[:, I:], gate_up [T, 2I].
  virtual void swiglu(const Tensor& gate_up, const Tensor& out) = 0;

  // out F32 [num_seqs, H]: per-sequence pooling of hidden [T, H] (activation dtype) with
  // cu_seqlens as above; optional L2 normalization.
  virtual void pool(const Tensor& hidden, const Tensor& cu_seqlens, const Tensor& out,
                    const PoolParams& p) = 0;

  // out F32 [num_seqs]: see ScoreParams. head [R, H] weight dtype.
  virtual void score(const Tensor& hidden, const Tensor& cu_seqlens, const Tensor& head,
                     const Tensor& out, const ScoreParams& p) = 0;

 protected:
  friend class Buffer;
  // Frees memory returned by allocate().
  virtual void release(void* data, size_t bytes) = 0;
};

inline Result<OwnedTensor> Backend::allocateTensor(DType dtype,
                                                   std::initializer_list<int64_t> dims) {
  OwnedTensor t;
  t.view = Tensor(nullptr, dtype, dims);
  for (int64_t d : dims) {
    if (d < 0) return invalidArgument("allocateTensor: negative dimension");
  }
  const size_t bytes = t.view.bytes();
  ASSIGN_OR_RETURN(t.buffer, allocate(bytes == 0 ? 1 : bytes));
  t.view.data = t.buffer.data();
  return t;
}

inline void Buffer::reset() {
  if (owner_ != nullptr && data_ != nullptr) owner_->release(data_, bytes_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

// "cpu" or "cuda". "cuda" needs a build with CUDA (GARDEN_HAVE_CUDA); otherwise
// FAILED_PRECONDITION. Unknown names: INVALID_ARGUMENT.
Result<std::unique_ptr<Backend>> makeBackend(std::string_view device, const BackendOptions& opts);

// Defined by the backend libraries.
Result<std::unique_ptr<Backend>> makeCpuBackend(const BackendOptions& opts);
#if defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA
Result<std::unique_ptr<Backend>> makeCudaBackend(const BackendOptions& opts);
// The GPUs this process sees (CUDA_VISIBLE_DEVICES applies); UNAVAILABLE when none.
Result<int32_t> cudaDeviceCount();
#endif

}  // namespace garden::rose
