#include "services/rose/ops/cuda/moe_lt_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/fp8_block.h"
#include "services/rose/ops/cuda/fp8_gemm.h"
#include "services/rose/ops/cuda/gemm.h"

namespace garden::rose::cuda {

namespace {

constexpr int kCandidates = 8;

cudaDataType_t elementType(MoeLtType t) {
  return t == MoeLtType::kBf16 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
}

int64_t rowBucket(int64_t rows) {
  int64_t b = 16;
  while (b < rows) b *= 2;
  return b;
}

std::atomic<int64_t> g_min_tokens{kMoeFp8DefaultMinTokens};
std::atomic<uint64_t> g_steps{0};
std::atomic<int64_t> g_lt_bf16_min_tokens{0};
std::atomic<uint64_t> g_lt_bf16_steps{0};
std::atomic<int64_t> g_lt_bf16_min_rows{0};
std::atomic<bool> g_lt_bf16_per_chunk{false};
std::atomic<bool> g_lt_bf16_auto{false};
std::atomic<int> g_lt_streams{CudaKernelOptions{}.moe_lt_streams};
std::atomic<bool> g_lt_epilogue{CudaKernelOptions{}.moe_lt_bias_epilogue};
std::atomic<bool> g_lt_overlap{CudaKernelOptions{}.moe_lt_overlap_dequant};
std::atomic<bool> g_lt_wgmma{CudaKernelOptions{}.moe_lt_wgmma};
std::atomic<int64_t> g_wgmma_min_rows{CudaKernelOptions{}.moe_wgmma_min_rows_per_expert};
std::atomic<uint64_t> g_wgmma_steps{0};
std::atomic<bool> g_wgmma_device_plan{CudaKernelOptions{}.moe_wgmma_device_plan};
std::atomic<bool> g_wgmma_smem_a{CudaKernelOptions{}.moe_wgmma_smem_a};

// The descriptor/shape cache key of a (type, bias epilogue) pair.
int32_t typeKey(MoeLtType type, bool bias) { return static_cast<int32_t>(type) * 2 + (bias ? 1 : 0); }
}  // namespace

void applyMoeLt(const CudaKernelOptions& opts) {
  g_lt_streams.store(std::clamp<int>(opts.moe_lt_streams, 1, MoeLtGemm::kMaxStreams));
  g_lt_epilogue.store(opts.moe_lt_bias_epilogue);
  g_lt_overlap.store(opts.moe_lt_overlap_dequant);
  g_lt_wgmma.store(opts.moe_lt_wgmma);
  g_wgmma_min_rows.store(std::max<int64_t>(1, opts.moe_wgmma_min_rows_per_expert));
  g_wgmma_device_plan.store(opts.moe_wgmma_device_plan);
  g_wgmma_smem_a.store(opts.moe_wgmma_smem_a);
}
bool moeWgmmaDevicePlan() { return g_wgmma_device_plan.load(); }
bool moeWgmmaSmemA() { return g_wgmma_smem_a.load(); }
bool moeLtWgmma() { return g_lt_wgmma.load(); }
int64_t moeWgmmaMinRowsPerExpert() { return g_wgmma_min_rows.load(); }
int64_t moeLtMinRowsPerExpert(bool wgmma) {
  const int64_t lt = moeLtBf16MinRowsPerExpert();
  return wgmma ? std::min(lt, moeWgmmaMinRowsPerExpert()) : lt;
}
uint64_t moeWgmmaSteps() { return g_wgmma_steps.load(); }
void countMoeWgmmaStep() { g_wgmma_steps.fetch_add(1); }
int moeLtStreams() { return g_lt_streams.load(); }
bool moeLtBiasEpilogue() { return g_lt_epilogue.load(); }
bool moeLtOverlapDequant() { return g_lt_overlap.load(); }

void setMoeLtBf16MinTokens(int64_t tokens) { g_lt_bf16_min_tokens.store(tokens); }
int64_t moeLtBf16MinTokens() { return g_lt_bf16_min_tokens.load(); }
void setMoeLtBf16MinRowsPerExpert(int64_t rows) { g_lt_bf16_min_rows.store(rows); }
int64_t moeLtBf16MinRowsPerExpert() { return g_lt_bf16_min_rows.load(); }
void setMoeLtBf16PerChunk(bool per_chunk) { g_lt_bf16_per_chunk.store(per_chunk); }
bool moeLtBf16PerChunk() { return g_lt_bf16_per_chunk.load(); }
bool moeLtBf16Auto() { return g_lt_bf16_auto.load(); }
void applyMoePrefill(CudaKernelOptions::MoePrefill mode, int64_t min_rows_per_expert) {
  using M = CudaKernelOptions::MoePrefill;
  // kAuto is kChunk for the ops; the model makes whole steps its one run where the ops say so
  // (LlmOps::moeWholeStep: the wgmma kernel runs every expert).
  setMoeLtBf16MinTokens(mode == M::kTiled  ? 0
                        : mode == M::kStep ? kMoePrefillCublasMinTokens
                                           : INT64_MAX);
  setMoeLtBf16MinRowsPerExpert(mode == M::kTiled ? 0 : std::max<int64_t>(1, min_rows_per_expert));
  setMoeLtBf16PerChunk(mode == M::kChunk || mode == M::kAuto);
  g_lt_bf16_auto.store(mode == M::kAuto);
}
uint64_t moeLtBf16Steps() { return g_lt_bf16_steps.load(); }
void countMoeLtBf16Step() { g_lt_bf16_steps.fetch_add(1); }

void setMoeFp8MinTokens(int64_t tokens) { g_min_tokens.store(tokens); }
int64_t moeFp8MinTokens() { return g_min_tokens.load(); }
uint64_t moeFp8Steps() { return g_steps.load(); }
void countMoeFp8Step() { g_steps.fetch_add(1); }

MoeLtGemm::Desc::~Desc() {
  if (desc) cublasLtMatmulDescDestroy(desc);
  if (a) cublasLtMatrixLayoutDestroy(a);
}
MoeLtGemm::Shape::~Shape() {
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (d) cublasLtMatrixLayoutDestroy(d);
}

Result<std::unique_ptr<MoeLtGemm>> MoeLtGemm::create(size_t workspace_bytes) {
  std::unique_ptr<MoeLtGemm> g(new MoeLtGemm());
  LT_RETURN_IF_ERROR(cublasLtCreate(&g->handle_));
  if (workspace_bytes > 0) CUDA_RETURN_IF_ERROR(cudaMalloc(&g->workspace_, workspace_bytes));
  g->workspace_bytes_ = workspace_bytes;
  return g;
}

MoeLtGemm::~MoeLtGemm() {
  shapes_.clear();
  descs_.clear();
  for (int i = 0; i < helper_count_; ++i) {
    if (helpers_[i] != nullptr) {
      cudaStreamSynchronize(helpers_[i]);
      cudaStreamDestroy(helpers_[i]);
    }
    if (joins_[i] != nullptr) cudaEventDestroy(joins_[i]);
    if (helper_ws_[i] != nullptr) cudaFree(helper_ws_[i]);
  }
  if (fork_ != nullptr) cudaEventDestroy(fork_);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

Status MoeLtGemm::reserveStreams(int streams) {
  streams = std::min(streams, kMaxStreams);
  if (streams <= 1 || streams <= helper_count_) return okStatus();
  if (fork_ == nullptr) CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  for (int i = helper_count_; i < streams; ++i) {
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&helpers_[i], cudaStreamNonBlocking));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&joins_[i], cudaEventDisableTiming));
    if (workspace_bytes_ > 0) CUDA_RETURN_IF_ERROR(cudaMalloc(&helper_ws_[i], workspace_bytes_));
    helper_count_ = i + 1;
  }
  return okStatus();
}

// Column-major view (cuBLASLt "TN"): D [n x rows] = op(A) [n x kp] . B [kp x rows] with A = W_e
// stored [kp x n] (ld kp, transposed), B = X rows stored [kp x rows] (ld kp), D = y rows stored
// [n x rows] (ld n): row-major y[rows][n].
Result<MoeLtGemm::Desc*> MoeLtGemm::desc(MoeLtType type, int64_t n, int64_t kp, bool bias) {
  auto key = std::make_tuple(typeKey(type, bias), n, kp);
  auto it = descs_.find(key);
  if (it != descs_.end()) return it->second.get();
  auto d = std::make_unique<Desc>();
  LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&d->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  RETURN_IF_ERROR(setTnMatmulDesc(d->desc, type == MoeLtType::kFp8Block));
  if (bias) {  // [TAG_MOE_LT_EPILOGUE] the bias pointer is set per expert
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bt = CUDA_R_16BF;
    LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(d->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        d->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d->a, elementType(type),
                                                    static_cast<uint64_t>(kp),
                                                    static_cast<uint64_t>(n), kp));
  Desc* raw = d.get();
  descs_.emplace(key, std::move(d));
  return raw;
}

Result<bool> MoeLtGemm::heuristic(Desc& d, Shape& s, cublasLtMatmulAlgo_t* out) {
  cublasLtMatmulPreference_t pref = nullptr;
  LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = workspace_bytes_;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  ++heuristic_queries_;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(handle_, d.desc, d.a, s.b, s.d, s.d, pref,
                                                           kCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  LT_RETURN_IF_ERROR(hs);
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= workspace_bytes_) {
      *out = results[i].algo;
      return true;
    }
  }
  return false;
}

Result<MoeLtGemm::Shape*> MoeLtGemm::shape(Desc& d, int32_t ty, MoeLtType type, int64_t n,
                                           int64_t kp, int64_t rows) {
  auto key = std::make_tuple(ty, n, kp, rows);
  auto it = shapes_.find(key);
  if (it != shapes_.end()) return it->second.get();
  auto s = std::make_unique<Shape>();
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&s->b, elementType(type),
                                                    static_cast<uint64_t>(kp),
                                                    static_cast<uint64_t>(rows), kp));
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&s->d, CUDA_R_16BF, static_cast<uint64_t>(n),
                                                    static_cast<uint64_t>(rows), n));
  const auto bkey = std::make_tuple(ty, n, kp, rowBucket(rows));
  auto bit = bucket_algos_.find(bkey);
  bool have = false;
  if (bit != bucket_algos_.end()) {
    cublasLtMatmulHeuristicResult_t chk{};
    if (cublasLtMatmulAlgoCheck(handle_, d.desc, d.a, s->b, s->d, s->d, &bit->second, &chk) ==
            CUBLAS_STATUS_SUCCESS &&
        chk.state == CUBLAS_STATUS_SUCCESS && chk.workspaceSize <= workspace_bytes_) {
      s->algo = bit->second;
      have = true;
    }
  }
  if (!have) {
    ASSIGN_OR_RETURN(bool ok, heuristic(d, *s, &s->algo));
    if (!ok) {
      return internalError(std::string("cuBLASLt has no ") +
                           (type == MoeLtType::kBf16 ? "bf16" : "FP8 block-scaled") +
                           " algorithm for N=" + std::to_string(n) +
                           " K=" + std::to_string(kp) + " rows=" + std::to_string(rows));
    }
    if (bit == bucket_algos_.end()) bucket_algos_.emplace(bkey, s->algo);
  }
  Shape* raw = s.get();
  shapes_.emplace(key, std::move(s));
  return raw;
}

Status MoeLtGemm::run(const MoeLtGemmArgs& a, cudaStream_t stream, int streams) {
  const bool bf16 = a.type == MoeLtType::kBf16;
  if (a.n <= 0 || a.n % 4 != 0 || a.k <= 0 || a.num_experts <= 0 || a.expert_off == nullptr ||
      (bf16 && a.k % 8 != 0))
    return invalidArgument(
        "moe_lt_gemm: N must be a positive multiple of 4, K positive (bf16: a multiple of 8), E "
        "positive");
  if (a.bias != nullptr && !bf16) return invalidArgument("moe_lt_gemm: a bias epilogue needs bf16");
  for (int32_t e = 0; e < a.num_experts; ++e) {
    const int64_t r0 = a.expert_off[e], rows = a.expert_off[e + 1] - r0;
    if (rows > 0 && (rows % 4 != 0 || r0 % 4 != 0))
      return invalidArgument("moe_lt_gemm: expert row ranges must be multiples of 4");
  }
  const int64_t kp = bf16 ? a.k : fp8PaddedK(a.k);
  ASSIGN_OR_RETURN(Desc * d, desc(a.type, a.n, kp, a.bias != nullptr));
  const int32_t key = typeKey(a.type, a.bias != nullptr);
  if (streams > helper_count_) RETURN_IF_ERROR(reserveStreams(streams));  // once per new count
  streams = std::min(streams, helper_count_);
  if (streams <= 1) return enqueue(a, d, key, kp, stream, 1);
  CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, stream));
  for (int i = 0; i < streams; ++i) CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(helpers_[i], fork_, 0));
  const Status st = enqueue(a, d, key, kp, stream, streams);
  // Joined back whatever happened: `stream` never runs ahead of work enqueued on a helper.
  for (int i = 0; i < streams; ++i) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(joins_[i], helpers_[i]));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, joins_[i], 0));
  }
  return st;
}

Status MoeLtGemm::enqueue(const MoeLtGemmArgs& a, Desc* d, int32_t key, int64_t kp,
                          cudaStream_t stream, int streams) {
  const bool bf16 = a.type == MoeLtType::kBf16;
  const int64_t nb = fp8KBlocks(a.k);
  const int64_t spe = fp8WeightScalesPerExpert(a.n, a.k);
  const int64_t esize = bf16 ? 2 : 1;  // bytes per element of W and X
  const float alpha = 1.f, beta = 0.f;
  int64_t load[kMaxStreams] = {};
  for (int32_t e = 0; e < a.num_experts; ++e) {
    const int64_t r0 = a.expert_off[e], rows = a.expert_off[e + 1] - r0;
    if (rows <= 0) continue;
    if (!bf16) {
      // The scale pointers first: the heuristic query of a new shape refuses a block-scaled
      // description without them (CUBLAS_STATUS_INVALID_VALUE, seen on the H200).
      const void* sa = a.w_scales + e * spe;
      const void* sb = a.x_scales + r0 * nb;
      LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          d->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
      LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          d->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
    }
    if (a.bias != nullptr) {
      const void* bp = a.bias + static_cast<int64_t>(e) * a.n;
      LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(d->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bp, sizeof(bp)));
    }
    ASSIGN_OR_RETURN(Shape * s, shape(*d, key, a.type, a.n, kp, rows));
    const auto* w = static_cast<const uint8_t*>(a.w) + static_cast<int64_t>(e) * a.n * kp * esize;
    const auto* x = static_cast<const uint8_t*>(a.x) + r0 * kp * esize;
    __nv_bfloat16* y = a.y + r0 * a.n;
    cudaStream_t s_e = stream;
    void* ws = workspace_;
    if (streams > 1) {  // the least-loaded helper (rows so far), lowest index among equals
      int best = 0;
      for (int i = 1; i < streams; ++i)
        if (load[i] < load[best]) best = i;
      load[best] += rows;
      s_e = helpers_[best];
      ws = helper_ws_[best];
    }
    LT_RETURN_IF_ERROR(cublasLtMatmul(handle_, d->desc, &alpha, w, d->a, x, s->b, &beta, y, s->d,
                                          y, s->d, &s->algo, ws, workspace_bytes_, s_e));
  }
  return okStatus();
}

}  // namespace garden::rose::cuda
