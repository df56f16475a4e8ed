#include "services/rose/ops/cuda/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/logging.h"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/gemm_chain.cuh"
#include "services/rose/ops/cuda/gemm_smallm.cuh"
#include "services/rose/ops/cuda/gemm_wg.cuh"
#include "services/rose/ops/cuda/gemv.cuh"
#include "services/rose/ops/cuda/l2_flush.cuh"

namespace garden::rose::cuda {

Status cublasLtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return okStatus();
  return internalError(std::string("cuBLASLt ") + what + " failed: status " +
                       std::to_string(static_cast<int>(s)));
}

namespace {

bool g_read_flush = false;  // [TAG_GEMM_READ_FLUSH]
constexpr int kCandidates = 16;
constexpr int kWarmups = 2;
constexpr int kChainLaunches = 8;  // timed launches per rep in the chain view [TAG_GEMM_TUNE_CHAIN]
// Larger than the H200's 50 MB L2, so a timed GEMM reads its weights from HBM as in a forward.
constexpr size_t kFlushBytes = size_t{80} << 20;
// The M-independence check of a winner compares at most this many outputs (on the host).
constexpr int64_t kMaxCheckElems = int64_t{4} << 20;
}  // namespace


void GemmRunner::setReadFlush(bool on) { g_read_flush = on; }

int64_t GemmRunner::algoBucket(int64_t m) {
  const int64_t step = m <= 1024 ? 64 : m <= 4096 ? 256 : 1024;
  return (m + step - 1) / step * step;
}

int64_t GemmRunner::bucketOf(int64_t m) const {
  if (small_buckets_ && m <= 8) {
    int64_t b = 1;
    while (b < m) b <<= 1;
    return b;
  }
  return algoBucket(m);
}

Result<std::unique_ptr<GemmRunner>> GemmRunner::create(size_t workspace_bytes, bool tune,
                                                       bool smallm) {
  std::unique_ptr<GemmRunner> r(new GemmRunner());
  r->tune_ = tune;
  r->smallm_ = tune && smallm;
  if (r->smallm_) {
    RETURN_IF_ERROR(prepareSmallMGemm());  // outside any capture: sets the kernels' smem limits
    r->num_sms_ = smCount();
  }
  LT_RETURN_IF_ERROR(cublasLtCreate(&r->handle_));
  if (workspace_bytes > 0) CUDA_RETURN_IF_ERROR(cudaMalloc(&r->workspace_, workspace_bytes));
  r->workspace_bytes_ = workspace_bytes;
  return r;
}

GemmRunner::Plan::~Plan() {
  if (desc) cublasLtMatmulDescDestroy(desc);
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (c) cublasLtMatrixLayoutDestroy(c);
}

GemmRunner::~GemmRunner() {
  plans_.clear();
  for (cudaEvent_t e : events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (flush_ != nullptr) cudaFree(flush_);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

// Column-major view: y^T [N, M] = w [K, N]^T-as-stored . x^T [K, M]; i.e. op(A) = A^T with
// A = w stored [K, N] (ld K), B = x stored [K, M] (ld K), C = y stored [N, M] (ld N).
Status GemmRunner::makeLayouts(Plan& p, int64_t m, int64_t n, int64_t k, bool bias, int io) {
  const bool f32_out = io == kIoF32Out || io == kIoF16F32Out;
  const cudaDataType_t t16 = io == kIoF16 || io == kIoF16F32Out ? CUDA_R_16F : CUDA_R_16BF;
  LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LT_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LT_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    // The bias has D's type (cuBLASLt's rule outside FP8): 16-bit, or f32 with an f32 output.
    const cudaDataType_t bt = f32_out ? CUDA_R_32F : t16;
    LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                      &bt, sizeof(bt)));
  }
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.a, t16, static_cast<uint64_t>(k),
                                                static_cast<uint64_t>(n), k));
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.b, t16, static_cast<uint64_t>(k),
                                                static_cast<uint64_t>(m), k));
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.c, f32_out ? CUDA_R_32F : t16,
                                                static_cast<uint64_t>(n), static_cast<uint64_t>(m),
                                                n));
  return okStatus();
}

// Fits `algo` to this plan with split-K off; false if cuBLASLt rejects it.
static bool fitNoSplitK(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                        cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                        cublasLtMatmulAlgo_t* algo, size_t ws) {
  int32_t one = 1;
  uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
  cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one));
  cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none,
                                       sizeof(none));
  cublasLtMatmulHeuristicResult_t chk{};
  if (cublasLtMatmulAlgoCheck(h, desc, a, b, c, c, algo, &chk) != CUBLAS_STATUS_SUCCESS)
    return false;
  return chk.workspaceSize <= ws;
}

// `algo` as is (split-K allowed) runs this plan within the workspace.
bool GemmRunner::fits(const Plan& p, const cublasLtMatmulAlgo_t& algo) const {
  cublasLtMatmulHeuristicResult_t chk{};
  if (cublasLtMatmulAlgoCheck(handle_, p.desc, p.a, p.b, p.c, p.c, &algo, &chk) !=
      CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  return chk.state == CUBLAS_STATUS_SUCCESS && chk.workspaceSize <= workspace_bytes_;
}

Result<bool> GemmRunner::pickAlgo(Plan& p, cublasLtMatmulAlgo_t* out) {
  cublasLtMatmulPreference_t pref = nullptr;
  LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = workspace_bytes_;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref,
                                                     kCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  LT_RETURN_IF_ERROR(hs);
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    cublasLtMatmulAlgo_t algo = results[i].algo;
    if (fitNoSplitK(handle_, p.desc, p.a, p.b, p.c, &algo, workspace_bytes_)) {
      *out = algo;
      return true;
    }
  }
  return false;
}

Status GemmRunner::enqueue(const Plan& p, const cublasLtMatmulAlgo_t& algo, const Operands& ops) {
  if (ops.bias != nullptr) {
    LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &ops.bias, sizeof(ops.bias)));
  }
  const float alpha = 1.f, beta = 0.f;
  LT_RETURN_IF_ERROR(cublasLtMatmul(handle_, p.desc, &alpha, ops.w, p.a, ops.x, p.b, &beta, ops.y,
                                    p.c, ops.y, p.c, &algo, workspace_, workspace_bytes_,
                                    ops.stream));
  return okStatus();
}

namespace {
// The operand fields the custom kernels' argument structs share (SmallMGemmArgs, GemvArgs).
template <typename Args>
Args customArgs(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                void* y, int64_t m, int64_t n, int64_t k) {
  Args a;
  a.x = x;
  a.w = w;
  a.bias = bias;
  a.y = static_cast<__nv_bfloat16*>(y);
  a.m = m;
  a.n = n;
  a.k = k;
  return a;
}
}  // namespace

Status GemmRunner::enqueueChoice(const Plan& p, const Choice& choice, int64_t m, int64_t n,
                                 int64_t k, const Operands& ops) {
  if (choice.gemv_rows > 0) {
    auto a = customArgs<GemvArgs>(ops.x, ops.w, ops.bias, ops.y, m, n, k);
    a.rows = choice.gemv_rows;
    a.unroll = choice.gemv_unroll;
    a.pdl = gemv_pdl_;
    return launchGemv(a, ops.stream);
  }
  if (choice.chain_stages > 0) {  // [TAG_GEMM_CHAIN]
    auto a = customArgs<ChainGemmArgs>(ops.x, ops.w, ops.bias, ops.y, m, n, k);
    a.stages = choice.chain_stages;
    a.pdl = chain_pdl_;  // [TAG_CHAIN_PDL]
    return launchChainGemm(a, ops.stream);
  }
  if (choice.wg_splits > 0) {  // [TAG_GEMM_WG]
    auto a = customArgs<WgGemmArgs>(ops.x, ops.w, ops.bias, ops.y, m, n, k);
    a.splits = choice.wg_splits;
    a.warpgroups = choice.wg_warpgroups;
    a.tok_tile = choice.wg_tok_tile;
    a.pdl = wg_pdl_;
    return launchWgGemm(a, ops.stream);
  }
  if (choice.smallm_splits > 0) {
    auto a = customArgs<SmallMGemmArgs>(ops.x, ops.w, ops.bias, ops.y, m, n, k);
    a.splits = choice.smallm_splits;
    a.tile_n = choice.smallm_tile_n;
    return launchSmallMGemm(a, ops.stream);
  }
  return enqueue(p, choice.algo, ops);
}

// Runs `choice` at M = m into y and at M = m / 2 into the flush buffer and compares the common
// rows bit for bit (true also when the check does not apply: m < 2 or too large to compare).
Result<bool> GemmRunner::rowsIndependentOfM(const Plan& exact, const Choice& choice, int64_t m,
                                            int64_t n, int64_t k, const Operands& ops) {
  const int64_t half = m / 2;
  const size_t elem = ops.f32_out ? sizeof(float) : sizeof(__nv_bfloat16);
  const size_t bytes = static_cast<size_t>(half * n) * elem;
  if (half < 1 || half * n > kMaxCheckElems || bytes > flush_bytes_) return true;
  Plan p;  // the M / 2 shape (cuBLASLt only; the custom kernels take M as an argument)
  if (!choice.custom()) {
    RETURN_IF_ERROR(makeLayouts(p, half, n, k, ops.bias != nullptr, ioOf(ops)));
    if (!fits(p, choice.algo)) return false;
  }
  RETURN_IF_ERROR(enqueueChoice(exact, choice, m, n, k, ops));
  Operands part = ops;
  part.y = flush_;
  RETURN_IF_ERROR(enqueueChoice(p, choice, half, n, k, part));
  return yMatchesFlush(ops, bytes);
}

Result<bool> GemmRunner::yMatchesFlush(const Operands& ops, size_t bytes) {
  std::vector<uint8_t> a(bytes), b(bytes);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(a.data(), ops.y, bytes, cudaMemcpyDeviceToHost, ops.stream));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(b.data(), flush_, bytes, cudaMemcpyDeviceToHost, ops.stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ops.stream));
  return std::memcmp(a.data(), b.data(), bytes) == 0;
}

Result<bool> GemmRunner::referenceAlgo(int64_t n, int64_t k, bool bias, int io,
                                       cublasLtMatmulAlgo_t* out) {
  const auto key = std::make_tuple(n, k, bias, io);
  auto it = refs_.find(key);
  if (it == refs_.end()) {
    // The (N, K) algorithm of the untuned policy: the heuristic's pick at a reference M, split-K off.
    constexpr int64_t kReferenceM = 2048;
    Plan ref;
    RETURN_IF_ERROR(makeLayouts(ref, kReferenceM, n, k, bias, io));
    cublasLtMatmulAlgo_t algo{};
    ASSIGN_OR_RETURN(const bool ok, pickAlgo(ref, &algo));
    it = refs_.emplace(key, std::make_pair(ok, algo)).first;
  }
  if (it->second.first) *out = it->second.second;
  return it->second.first;
}

// [TAG_GEMM_ROW_INVARIANT] The reference, then `choice`, both at M = m into y (the caller's output,
// scratch while tuning: it holds all M rows, which the flush buffer need not); the first rows (at
// most kMaxCheckElems outputs) of each copied out and compared on the host.
Result<bool> GemmRunner::matchesReference(const Plan& exact, const Choice& choice,
                                          const cublasLtMatmulAlgo_t& ref, int64_t m, int64_t n,
                                          int64_t k, const Operands& ops) {
  const size_t elem = ops.f32_out ? sizeof(float) : sizeof(__nv_bfloat16);
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(m, kMaxCheckElems / n));
  const size_t bytes = static_cast<size_t>(rows * n) * elem;
  std::vector<uint8_t> want(bytes), got(bytes);
  RETURN_IF_ERROR(enqueue(exact, ref, ops));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(want.data(), ops.y, bytes, cudaMemcpyDeviceToHost, ops.stream));
  RETURN_IF_ERROR(enqueueChoice(exact, choice, m, n, k, ops));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(got.data(), ops.y, bytes, cudaMemcpyDeviceToHost, ops.stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ops.stream));
  return std::memcmp(want.data(), got.data(), bytes) == 0;
}

Result<GemmRunner::Choice> GemmRunner::chooseAlgo(Plan& exact, int64_t m, int64_t n, int64_t k,
                                                  const Operands& ops) {
  const bool bias = ops.bias != nullptr;
  const int64_t bucket = bucketOf(m);
  // Candidates from the heuristic at the bucket's largest M, so that each fits (workspace
  // included: split-K needs more of it as M grows) every M of the bucket.
  Plan top;
  Plan* ref = &exact;
  if (bucket != m) {
    RETURN_IF_ERROR(makeLayouts(top, bucket, n, k, bias, ioOf(ops)));
    ref = &top;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = workspace_bytes_;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  // Split-K only with f32 partial sums reduced in a second step: the in-place and output-type
  // schemes round each partial to bf16 (more error than the one final rounding).
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  cublasStatus_t hs = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes));
  if (hs == CUBLAS_STATUS_SUCCESS) {
    hs = cublasLtMatmulAlgoGetHeuristic(handle_, ref->desc, ref->a, ref->b, ref->c, ref->c, pref,
                                        kCandidates, results, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  LT_RETURN_IF_ERROR(hs);
  std::vector<Choice> cands;
  cands.reserve(static_cast<size_t>(found) + 4);
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    if (results[i].workspaceSize > workspace_bytes_) continue;
    if (!fits(exact, results[i].algo)) continue;
    cands.push_back(Choice{results[i].algo, 0, 0});
  }
  // [TAG_GEMM_ROW_INVARIANT] The reference algorithm, a candidate itself (after cuBLASLt's).
  cublasLtMatmulAlgo_t ref_algo{};
  bool have_ref = false;
  size_t ref_idx = SIZE_MAX;
  if (row_invariant_) {
    ASSIGN_OR_RETURN(const bool ok, referenceAlgo(n, k, bias, ioOf(ops), &ref_algo));
    have_ref = ok && fits(exact, ref_algo);
    if (have_ref) {
      ref_idx = cands.size();
      cands.push_back(Choice{ref_algo, 0, 0});
    } else {
      ++invariant_misses_;
      log::warn("gemm: no reference algorithm for this M; rows may depend on the bucket",
                {{"m", m}, {"n", n}, {"k", k}});
    }
  }
  if (cands.empty()) {
    return internalError("cuBLASLt: no bf16 algorithm for m=" + std::to_string(m) + " (bucket " +
                         std::to_string(bucket) + ") n=" + std::to_string(n) +
                         " k=" + std::to_string(k));
  }
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(ops.stream, &cs));
  if (cs != cudaStreamCaptureStatusNone) {
    ++untimed_;  // never enqueue timing work (events, syncs) into a capture
    return have_ref ? cands[ref_idx] : cands[0];
  }
  // The custom kernel (gemm_smallm.cuh), one candidate per (N tile, split count), after
  // cuBLASLt's.
  size_t num_lt = cands.size();
  if (smallm_ && ioOf(ops) == kIoBf16 && bucket <= kSmallMMaxRows) {
    SmallMConfig cfgs[8] = {};
    const int nc = smallMGemmCandidates(n, k, num_sms_, cfgs);
    for (int i = 0; i < nc; ++i) {
      if (smallMGemmSupported(bucket, n, k, cfgs[i].splits, cfgs[i].tile_n)) {
        cands.push_back(Choice{{}, cfgs[i].splits, cfgs[i].tile_n});
      }
    }
  }
  // [TAG_GEMM_CHAIN] The K-chain kernel under row invariance (the reference check decides).
  if (chain_ && have_ref && ioOf(ops) == kIoBf16 && bucket <= kChainMaxRows) {
    RETURN_IF_ERROR(prepareChainGemm());  // not capturing here: the attribute is set outside
    for (int stages : {8, 16}) {
      if (chainGemmSupported(bucket, n, k, stages)) {
        Choice c;
        c.chain_stages = stages;
        cands.push_back(c);
      }
    }
  }
  // [TAG_GEMM_WG] The Hopper weight-streaming kernel, one candidate per (split count, consumer
  // warpgroups) wgGemmCandidates offers for the bucket.
  if (wg_ && ioOf(ops) == kIoBf16 && bucket <= kWgGemmMaxRows) {
    WgGemmConfig cfgs[8] = {};
    const int nc = wgGemmCandidates(bucket, n, k, num_sms_, cfgs);
    for (int i = 0; i < nc; ++i) {
      Choice c;
      c.wg_splits = cfgs[i].splits;
      c.wg_warpgroups = cfgs[i].warpgroups;
      c.wg_tok_tile = cfgs[i].tok_tile;
      cands.push_back(c);
    }
  }
  // The GEMV (gemv.cuh) for the small buckets [TAG_GEMV], after those.
  // [TAG_PDL_GEMV] With gemv_only_, the M = 1 bucket times the GEMV shapes alone.
  const bool gemv_alone = gemv_only_ && bucket == 1;
  if ((gemv_ || gemv_alone) && small_buckets_ && ioOf(ops) == kIoBf16 && bucket <= kGemvMaxRows) {
    const size_t before = cands.size();
    GemvShape shapes[4];
    const int ns = gemvShapes(bucket, shapes);
    for (int i = 0; i < ns; ++i) {
      if (gemvSupported(bucket, n, k, shapes[i].rows, shapes[i].unroll)) {
        Choice c;
        c.gemv_rows = shapes[i].rows;
        c.gemv_unroll = shapes[i].unroll;
        cands.push_back(c);
      }
    }
    // The programmatic GEMV's gain is the overlap with the previous kernel, which this timing (no
    // previous kernel) cannot see.
    if (gemv_alone && cands.size() > before && !have_ref) {
      cands.erase(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(before));
      num_lt = 0;
    }
  }
  if (cands.size() == 1) return cands[0];

  if (flush_ == nullptr) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&flush_, kFlushBytes));
    flush_bytes_ = kFlushBytes;
  }
  for (cudaEvent_t& e : events_) {
    if (e == nullptr) CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  }
  std::vector<float> avg_ms(cands.size(), -1.f);  // < 0: the candidate failed to launch
  const int launches = tune_chain_ ? kChainLaunches : 1;  // per timed rep [TAG_GEMM_TUNE_CHAIN]
  for (size_t c = 0; c < cands.size(); ++c) {
    bool ok = true;
    for (int r = 0; r < kWarmups && ok; ++r) {
      ok = enqueueChoice(exact, cands[c], m, n, k, ops).isOk();
    }
    for (int r = 0; r < kTimedReps && ok; ++r) {
      if (g_read_flush) {
        RETURN_IF_ERROR(launchL2FlushRead(flush_, flush_bytes_, ops.stream));
      } else {
        CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flush_, r & 0xff, flush_bytes_, ops.stream));
      }
      CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[2 * r], ops.stream));
      for (int l = 0; l < launches && ok; ++l) {
        ok = enqueueChoice(exact, cands[c], m, n, k, ops).isOk();
      }
      CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[2 * r + 1], ops.stream));
    }
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ops.stream));
    if (!ok) continue;  // cuBLASLt refused this candidate at launch: skip it
    float total = 0.f;
    for (int r = 0; r < kTimedReps; ++r) {
      float ms = 0.f;
      CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events_[2 * r], events_[2 * r + 1]));
      total += ms;
    }
    avg_ms[c] = total / (kTimedReps * launches);
  }
  // Fastest first; the winner must give a row the same bits at another M (half of this one), so
  // that graphed (padded M) and eager runs of a bucket agree bit for bit.
  std::vector<size_t> order;
  for (size_t c = 0; c < cands.size(); ++c) {
    if (avg_ms[c] >= 0.f) order.push_back(c);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return avg_ms[x] < avg_ms[y]; });
  size_t best = cands.size();
  for (size_t c : order) {
    ASSIGN_OR_RETURN(const bool same, rowsIndependentOfM(exact, cands[c], m, n, k, ops));
    if (same && have_ref && c != ref_idx) {  // [TAG_GEMM_ROW_INVARIANT]
      ASSIGN_OR_RETURN(const bool as_ref, matchesReference(exact, cands[c], ref_algo, m, n, k, ops));
      if (!as_ref) {
        ++invariant_rejects_;
        continue;
      }
    }
    if (same) {
      best = c;
      break;
    }
    ++m_dependent_;
    log::warn("gemm candidate gives M-dependent rows; skipped",
              {{"m", m}, {"n", n}, {"k", k}, {"candidate", c}});
  }
  if (best == cands.size() && have_ref) {
    // [TAG_GEMM_ROW_INVARIANT] The reference itself failed the M / 2 check: nothing can hold the
    // rows to one algorithm's bits here; keep the reference (the other buckets' bits) and count it.
    ++invariant_misses_;
    best = ref_idx;
  }
  if (best == cands.size()) {
    return internalError("cuBLASLt: no usable candidate for m=" + std::to_string(m) +
                         " n=" + std::to_string(n) + " k=" + std::to_string(k));
  }
  const float best_ms = avg_ms[best], first_ms = avg_ms[0];
  // The fastest launched candidate among those `pick` selects (-1: none), for the log.
  auto fastest = [&](auto pick) {
    float best_ms = -1.f;
    for (size_t c = 0; c < cands.size(); ++c) {
      if (pick(c) && avg_ms[c] >= 0.f && (best_ms < 0.f || avg_ms[c] < best_ms)) best_ms = avg_ms[c];
    }
    return best_ms;
  };
  const float best_lt_ms = fastest([&](size_t c) { return c < num_lt; });
  const float best_wg_ms = fastest([&](size_t c) { return cands[c].wg_splits > 0; });  // [TAG_GEMM_WG]
  const float best_gemv_ms = fastest([&](size_t c) { return cands[c].gemv_rows > 0; });  // [TAG_GEMV]
  ++tuned_;
  const bool smallm_won = cands[best].smallm_splits > 0;
  const bool gemv_won = cands[best].gemv_rows > 0;
  const bool chain_won = cands[best].chain_stages > 0;  // [TAG_GEMM_CHAIN]
  const bool wg_won = cands[best].wg_splits > 0;        // [TAG_GEMM_WG]
  if (chain_won) ++chain_wins_;
  if (wg_won) ++wg_wins_;
  if (smallm_won) ++smallm_wins_;
  if (gemv_won) ++gemv_wins_;
  int32_t splitk = 1, tile = 0;
  uint32_t scheme = 0;
  size_t written = 0;
  if (!cands[best].custom()) {
    const cublasLtMatmulAlgo_t& a = cands[best].algo;
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                         sizeof(scheme), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                         sizeof(splitk), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                         &written);
  }
  log::info("gemm tuned", {{"m", m},
                           {"bucket", bucket},
                           {"n", n},
                           {"k", k},
                           {"bias", bias},
                           {"candidates", cands.size()},
                           {"best", best},
                           {"best_us", static_cast<double>(best_ms) * 1e3},
                           {"first_us", static_cast<double>(first_ms) * 1e3},
                           {"best_cublaslt_us", static_cast<double>(best_lt_ms) * 1e3},
                           {"best_gemv_us", static_cast<double>(best_gemv_ms) * 1e3},
                           {"best_wg_us", static_cast<double>(best_wg_ms) * 1e3},
                           {"kernel", smallm_won ? "smallm"
                                      : gemv_won ? "gemv"
                                      : chain_won ? "chain"
                                      : wg_won    ? "wg"
                                                  : "cublaslt"},
                           {"wg_splits", cands[best].wg_splits},
                           {"wg_warpgroups", cands[best].wg_warpgroups},
                           {"chain_stages", cands[best].chain_stages},
                           {"smallm_candidates", cands.size() - num_lt},
                           {"gemv_rows", cands[best].gemv_rows},
                           {"gemv_unroll", cands[best].gemv_unroll},
                           {"smallm_splits", cands[best].smallm_splits},
                           {"smallm_tile_n", cands[best].smallm_tile_n},
                           {"splitk", splitk},
                           {"reduction", scheme},
                           {"tile_id", tile},
                           {"row_invariant", row_invariant_ ? (best == ref_idx ? "reference" : "matches reference")
                                                            : "off"}});
  return cands[best];
}

Result<GemmRunner::Plan*> GemmRunner::plan(int64_t m, int64_t n, int64_t k, const Operands& ops) {
  const bool bias = ops.bias != nullptr;
  auto key = std::make_tuple(m, n, k, bias, ioOf(ops));
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  auto p = std::make_unique<Plan>();
  RETURN_IF_ERROR(makeLayouts(*p, m, n, k, bias, ioOf(ops)));
  const auto akey =
      std::make_tuple(tune_ ? bucketOf(m) : int64_t{0}, n, k, bias, ioOf(ops));
  auto ait = algos_.find(akey);
  if (ait == algos_.end()) {
    Choice algo;
    if (tune_) {
      ASSIGN_OR_RETURN(algo, chooseAlgo(*p, m, n, k, ops));
    } else {
      // The (N, K) algorithm, chosen at the reference M.
      ASSIGN_OR_RETURN(const bool ok, referenceAlgo(n, k, bias, ioOf(ops), &algo.algo));
      if (!ok) {
        return internalError("cuBLASLt: no bf16 algorithm without split-K for n=" +
                             std::to_string(n) + " k=" + std::to_string(k));
      }
    }
    ait = algos_.emplace(akey, algo).first;
  }
  p->choice = ait->second;
  const Choice& ch = p->choice;
  // A custom kernel takes every M of its bucket for the (N, K) it was timed on.
  bool fit = false;
  if (ch.wg_splits > 0) {
    fit = wgGemmSupported(m, n, k, WgGemmConfig{ch.wg_splits, ch.wg_warpgroups, ch.wg_tok_tile});
  } else if (ch.chain_stages > 0) {
    fit = chainGemmSupported(m, n, k, ch.chain_stages);
  } else if (ch.gemv_rows > 0) {
    fit = gemvSupported(m, n, k, ch.gemv_rows, ch.gemv_unroll);
  } else if (ch.smallm_splits > 0) {
    fit = smallMGemmSupported(m, n, k, ch.smallm_splits, ch.smallm_tile_n);
  } else if (tune_) {
    fit = fits(*p, ch.algo);
  } else {
    fit = fitNoSplitK(handle_, p->desc, p->a, p->b, p->c, &p->choice.algo, workspace_bytes_);
  }
  if (!fit) {
    ++fallbacks_;
    p->choice = Choice{p->choice.algo};  // cuBLASLt, no custom kernel
    cublasLtMatmulAlgo_t& algo = p->choice.algo;
    bool ok = false;
    if (row_invariant_ && tune_) {  // [TAG_GEMM_ROW_INVARIANT] the reference, where it runs
      ASSIGN_OR_RETURN(const bool have, referenceAlgo(n, k, bias, ioOf(ops), &algo));
      ok = have && fits(*p, algo);
      if (!ok) ++invariant_misses_;
    }
    if (!ok) {
      ASSIGN_OR_RETURN(ok, pickAlgo(*p, &algo));
    }
    if (!ok) {
      return internalError(
          "cuBLASLt: no bf16 algorithm without split-K for m=" + std::to_string(m) +
          " n=" + std::to_string(n) + " k=" + std::to_string(k));
    }
  }
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
}

Status GemmRunner::run(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                       __nv_bfloat16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (m == 0) return okStatus();
  if (m < 0 || n <= 0 || k <= 0) return invalidArgument("gemm: bad shape");
  const Operands ops{x, w, bias, y, false, stream};
  ASSIGN_OR_RETURN(Plan * p, plan(m, n, k, ops));
  return enqueueChoice(*p, p->choice, m, n, k, ops);
}

Status GemmRunner::setWgGemm(bool on, bool pdl) {
  if (on) {
    RETURN_IF_ERROR(prepareWgGemm());  // outside any capture: the kernels' smem limits
    if (num_sms_ == 0) num_sms_ = smCount();
  }
  wg_ = on && tune_;
  wg_pdl_ = pdl;
  return okStatus();
}

Status GemmRunner::runCublasLt(const Operands& ops, int64_t m, int64_t n, int64_t k) {
  if (m == 0) return okStatus();
  if (m < 0 || n <= 0 || k <= 0) return invalidArgument("gemm: bad shape");
  ASSIGN_OR_RETURN(Plan * p, plan(m, n, k, ops));
  return enqueueChoice(*p, Choice{p->choice.algo}, m, n, k, ops);
}

// The fp16 operand pointers carry fp16 bits; only cuBLASLt reads them (ioOf: no custom kernel).
Status GemmRunner::runF16(const void* x, const void* w, const void* bias, void* y, int64_t m,
                          int64_t n, int64_t k, cudaStream_t stream) {
  return runCublasLt({static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w),
                      static_cast<const __nv_bfloat16*>(bias), y, false, stream, true},
                     m, n, k);
}

Status GemmRunner::runF16F32(const void* x, const void* w, const float* bias, float* y, int64_t m,
                             int64_t n, int64_t k, cudaStream_t stream) {
  return runCublasLt({static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w),
                      reinterpret_cast<const __nv_bfloat16*>(bias), y, true, stream, true},
                     m, n, k);
}

Status GemmRunner::runF32(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int64_t m,
                          int64_t n, int64_t k, cudaStream_t stream) {
  return runCublasLt({x, w, nullptr, y, true, stream}, m, n, k);
}

}  // namespace garden::rose::cuda
