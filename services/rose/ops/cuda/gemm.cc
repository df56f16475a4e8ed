#include "services/rose/ops/cuda/gemm.h"

#include <string>

#include "services/rose/ops/cuda/cuda_utils.h"

namespace garden::rose::cuda {

namespace {
Status lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return okStatus();
  return internalError(std::string("cuBLASLt ") + what + " failed: status " +
                       std::to_string(static_cast<int>(s)));
}
}  // namespace

#define LT_RETURN_IF_ERROR(expr) RETURN_IF_ERROR(lt((expr), #expr))

Result<std::unique_ptr<GemmRunner>> GemmRunner::create(size_t workspace_bytes) {
  std::unique_ptr<GemmRunner> r(new GemmRunner());
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
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

// Column-major view: y^T [N, M] = w [K, N]^T-as-stored . x^T [K, M]; i.e. op(A) = A^T with
// A = w stored [K, N] (ld K), B = x stored [K, M] (ld K), C = y stored [N, M] (ld N).
Status GemmRunner::makeLayouts(Plan& p, int64_t m, int64_t n, int64_t k, bool bias) {
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
    const cudaDataType_t bt = CUDA_R_16BF;
    LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                      &bt, sizeof(bt)));
  }
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, static_cast<uint64_t>(k),
                                                static_cast<uint64_t>(n), k));
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, static_cast<uint64_t>(k),
                                                static_cast<uint64_t>(m), k));
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, static_cast<uint64_t>(n),
                                                static_cast<uint64_t>(m), n));
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

Result<bool> GemmRunner::pickAlgo(Plan& p, cublasLtMatmulAlgo_t* out) {
  cublasLtMatmulPreference_t pref = nullptr;
  LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = workspace_bytes_;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  constexpr int kWanted = 16;
  cublasLtMatmulHeuristicResult_t results[kWanted] = {};
  int found = 0;
  cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref,
                                                     kWanted, results, &found);
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

Result<GemmRunner::Plan*> GemmRunner::plan(int64_t m, int64_t n, int64_t k, bool bias) {
  auto key = std::make_tuple(m, n, k, bias);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  // The (N, K) algorithm, chosen at the reference M.
  auto akey = std::make_tuple(n, k, bias);
  auto ait = algos_.find(akey);
  if (ait == algos_.end()) {
    constexpr int64_t kReferenceM = 2048;
    Plan ref;
    Status st = makeLayouts(ref, kReferenceM, n, k, bias);
    cublasLtMatmulAlgo_t algo{};
    Result<bool> ok = st.isOk() ? pickAlgo(ref, &algo) : Result<bool>(st);
    if (!ok.isOk()) return ok.status();
    if (!*ok) {
      return internalError("cuBLASLt: no bf16 algorithm without split-K for n=" +
                           std::to_string(n) + " k=" + std::to_string(k));
    }
    ait = algos_.emplace(akey, algo).first;
  }
  auto p = std::make_unique<Plan>();
  Status st = makeLayouts(*p, m, n, k, bias);
  if (st.isOk()) {
    p->algo = ait->second;
    if (!fitNoSplitK(handle_, p->desc, p->a, p->b, p->c, &p->algo, workspace_bytes_)) {
      ++fallbacks_;
      Result<bool> ok = pickAlgo(*p, &p->algo);
      if (!ok.isOk()) {
        st = ok.status();
      } else if (!*ok) {
        st =
            internalError("cuBLASLt: no bf16 algorithm without split-K for m=" + std::to_string(m) +
                          " n=" + std::to_string(n) + " k=" + std::to_string(k));
      }
    }
  }
  if (!st.isOk()) return st;
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
}

Status GemmRunner::run(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                       __nv_bfloat16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (m == 0) return okStatus();
  if (m < 0 || n <= 0 || k <= 0) return invalidArgument("gemm: bad shape");
  ASSIGN_OR_RETURN(Plan * p, plan(m, n, k, bias != nullptr));
  if (bias != nullptr) {
    LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof(bias)));
  }
  const float alpha = 1.f, beta = 0.f;
  LT_RETURN_IF_ERROR(cublasLtMatmul(handle_, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y,
                                    p->c, &p->algo, workspace_, workspace_bytes_, stream));
  return okStatus();
}

}  // namespace garden::rose::cuda
