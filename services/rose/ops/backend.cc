#include "services/rose/ops/backend.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "services/rose/ops/cpu/llm_ops_cpu.h"
#include "services/rose/ops/llm_ops.h"

namespace garden::rose {

namespace {

// A set, non-empty GARDEN_* variable: *out = the index of its value in `accepted`.
Status envChoice(const char* name, std::initializer_list<const char*> accepted, int* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return okStatus();
  std::string list;
  int i = 0;
  for (const char* a : accepted) {
    if (std::strcmp(v, a) == 0) {
      *out = i;
      return okStatus();
    }
    list += (i++ == 0 ? "" : "|");
    list += a;
  }
  return invalidArgument(std::string(name) + "='" + v + "': expected " + list);
}

// envChoice over named integer values: *value becomes values[i] for the accepted name i (kept
// when the variable is unset; a value not in the table reads as the first name's).
template <size_t N>
Status envChoiceValue(const char* name, std::initializer_list<const char*> accepted,
                      const int32_t (&values)[N], int32_t* value) {
  int i = 0;
  for (size_t k = 0; k < N; ++k)
    if (values[k] == *value) i = static_cast<int>(k);
  RETURN_IF_ERROR(envChoice(name, accepted, &i));
  *value = values[i];
  return okStatus();
}

}  // namespace

bool moePrefillFromName(std::string_view name, CudaKernelOptions::MoePrefill* out) {
  using M = CudaKernelOptions::MoePrefill;
  if (name == "auto") *out = M::kAuto;
  else if (name == "chunk") *out = M::kChunk;
  else if (name == "step" || name == "cublas") *out = M::kStep;
  else if (name == "tiled") *out = M::kTiled;
  else return false;
  return true;
}

Status cudaKernelOptionsFromEnv(CudaKernelOptions& opts) {
  // auto and sm90 are one policy (the Hopper kernel for head_dim 128, the size policy for the
  // rest); mma is the mma.sync size policy alone (the default before the Hopper kernel's run).
  int attention = opts.attention_sm90 ? 0 : opts.attention_wide ? 3 : 1;
  int tune = opts.gemm_tune ? 1 : 0, smallm = opts.gemm_smallm ? 1 : 0, pdl = opts.pdl ? 1 : 0;
  RETURN_IF_ERROR(envChoice("GARDEN_ATTENTION_KERNEL", {"auto", "narrow", "sm90", "mma"}, &attention));
  RETURN_IF_ERROR(envChoice("GARDEN_GEMM_TUNE", {"0", "1"}, &tune));
  RETURN_IF_ERROR(envChoice("GARDEN_GEMM_SMALLM", {"0", "1"}, &smallm));
  RETURN_IF_ERROR(envChoice("GARDEN_PDL", {"0", "1"}, &pdl));
  int paged = opts.paged_attention_sm90_min_tokens > 0 ? 0 : 1;
  RETURN_IF_ERROR(envChoice("GARDEN_PAGED_ATTENTION", {"sm90", "mma"}, &paged));
  // tiled 0, chunk 1, step 2, cublas 3 (= step), auto 4
  using MP = CudaKernelOptions::MoePrefill;
  int moe = opts.moe_prefill == MP::kAuto ? 4 : static_cast<int>(opts.moe_prefill);
  RETURN_IF_ERROR(
      envChoice("GARDEN_MOE_PREFILL", {"tiled", "chunk", "step", "cublas", "auto"}, &moe));
  int lt_streams = opts.moe_lt_streams - 1;  // "1".."8"
  int lt_epi = opts.moe_lt_bias_epilogue ? 1 : 0, lt_overlap = opts.moe_lt_overlap_dequant ? 1 : 0;
  RETURN_IF_ERROR(envChoice("GARDEN_MOE_LT_STREAMS", {"1", "2", "3", "4", "5", "6", "7", "8"},
                            &lt_streams));
  RETURN_IF_ERROR(envChoice("GARDEN_MOE_LT_EPILOGUE", {"0", "1"}, &lt_epi));
  RETURN_IF_ERROR(envChoice("GARDEN_MOE_LT_OVERLAP", {"0", "1"}, &lt_overlap));
  int lt_wgmma = opts.moe_lt_wgmma ? 1 : 0;
  RETURN_IF_ERROR(envChoice("GARDEN_MOE_LT_WGMMA", {"0", "1"}, &lt_wgmma));
  opts.moe_lt_wgmma = lt_wgmma == 1;
  int wg_plan = opts.moe_wgmma_device_plan ? 1 : 0;
  RETURN_IF_ERROR(envChoice("GARDEN_MOE_WGMMA_DEVICE_PLAN", {"0", "1"}, &wg_plan));
  opts.moe_wgmma_device_plan = wg_plan == 1;
  int wg_smem_a = opts.moe_wgmma_smem_a ? 1 : 0;  // [TAG_MOE_WGMMA_SMEM_A]
  RETURN_IF_ERROR(envChoice("GARDEN_MOE_WGMMA_SMEM_A", {"0", "1"}, &wg_smem_a));
  opts.moe_wgmma_smem_a = wg_smem_a == 1;
  int router_mma = opts.router_mma ? 1 : 0;
  RETURN_IF_ERROR(envChoice("GARDEN_ROUTER_MMA", {"0", "1"}, &router_mma));
  opts.router_mma = router_mma == 1;
  int pdl_gemv = opts.pdl_gemv ? 1 : 0;
  RETURN_IF_ERROR(envChoice("GARDEN_PDL_GEMV", {"0", "1"}, &pdl_gemv));
  opts.pdl_gemv = pdl_gemv == 1;
  int row_inv = opts.gemm_row_invariant ? 1 : 0;
  RETURN_IF_ERROR(envChoice("GARDEN_GEMM_ROW_INVARIANT", {"0", "1"}, &row_inv));
  opts.gemm_row_invariant = row_inv == 1;
  int chain_pdl = opts.chain_pdl ? 1 : 0;  // [TAG_CHAIN_PDL]
  RETURN_IF_ERROR(envChoice("GARDEN_CHAIN_PDL", {"0", "1"}, &chain_pdl));
  opts.chain_pdl = chain_pdl == 1;
  int pdl_graph = opts.pdl_graph ? 1 : 0;
  RETURN_IF_ERROR(envChoice("GARDEN_PDL_GRAPH", {"0", "1"}, &pdl_graph));
  opts.pdl_graph = pdl_graph == 1;
  int attn_fp8 = opts.attention_fp8_out ? 1 : 0;  // [TAG_ATTN_FP8_OUT]
  RETURN_IF_ERROR(envChoice("GARDEN_ATTN_FP8_OUT", {"0", "1"}, &attn_fp8));
  opts.attention_fp8_out = attn_fp8 == 1;
  static constexpr int32_t kQkRope[] = {0, -1, 1, 2, 4, 8};  // [TAG_QK_ROPE_PAIR]
  RETURN_IF_ERROR(envChoiceValue("GARDEN_QK_ROPE",
                                 {"auto", "legacy", "pair1", "pair2", "pair4", "pair8"}, kQkRope,
                                 &opts.qk_rope_variant));
  static constexpr int32_t kGemmWg[] = {0, 1, 2};  // [TAG_GEMM_WG]
  RETURN_IF_ERROR(envChoiceValue("GARDEN_GEMM_WG", {"0", "1", "pdl"}, kGemmWg, &opts.gemm_wg));
  int tune_chain = opts.gemm_tune_chain ? 1 : 0;  // [TAG_GEMM_TUNE_CHAIN]
  RETURN_IF_ERROR(envChoice("GARDEN_GEMM_TUNE_VIEW", {"cold", "chain"}, &tune_chain));
  opts.gemm_tune_chain = tune_chain == 1;
  opts.moe_lt_streams = lt_streams + 1;
  opts.moe_lt_bias_epilogue = lt_epi == 1;
  opts.moe_lt_overlap_dequant = lt_overlap == 1;
  if (paged == 1) {
    opts.paged_attention_sm90_min_tokens = 0;
  } else if (opts.paged_attention_sm90_min_tokens <= 0) {
    opts.paged_attention_sm90_min_tokens = 128;
  }
  opts.moe_prefill = moe == 4 ? MP::kAuto : static_cast<MP>(moe == 3 ? 2 : moe);
  opts.attention_wide = attention != 1;
  opts.attention_sm90 = attention == 0 || attention == 2;
  opts.gemm_tune = tune == 1;
  opts.gemm_smallm = smallm == 1;
  opts.pdl = pdl == 1;
  return okStatus();
}

Result<std::unique_ptr<Backend>> makeBackend(std::string_view device, const BackendOptions& opts) {
  if (device == "cpu") return makeCpuBackend(opts);
  if (device == "cuda") {
#if defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA
    return makeCudaBackend(opts);
#else
    return failedPrecondition(
        "--device cuda: this rose was built without CUDA (GARDEN_HAVE_CUDA is off); rebuild on a "
        "machine with nvcc or use --device cpu");
#endif
  }
  return invalidArgument("--device: unknown device '" + std::string(device) +
                         "' (expected cpu or cuda)");
}

namespace {
[[noreturn]] void fp8Unsupported(const char* op) {
  std::fprintf(stderr, "Backend::%s: FP8 linear layers are not supported by this backend\n", op);
  std::abort();
}
}  // namespace

// [TAG_EMBED_FP8] Callers check supportsFp8Linear() first (Qwen3Model::load refuses otherwise).
void Backend::quantizeFp8Weight(const Tensor&, const Fp8Matrix&) { fp8Unsupported("quantizeFp8Weight"); }
void Backend::quantizeFp8(const Tensor&, const Fp8Matrix&) { fp8Unsupported("quantizeFp8"); }
void Backend::rmsNormFp8(const Tensor&, const Tensor&, const Tensor&, const Fp8Matrix&,
                         const RmsNormParams&) {
  fp8Unsupported("rmsNormFp8");
}
void Backend::swigluFp8(const Tensor&, const Fp8Matrix&) { fp8Unsupported("swigluFp8"); }
void Backend::attentionFp8(const Tensor& qkv, const Tensor& cu_seqlens, const Tensor& scratch,
                           const Fp8Matrix& out, const AttentionParams& p) {
  attention(qkv, cu_seqlens, scratch, p);
  quantizeFp8(scratch, out);
}
void Backend::linearFp8(const Fp8Matrix&, const Fp8Matrix&, const Tensor&) {
  fp8Unsupported("linearFp8");
}

void LlmOps::stageSample(std::span<const SampleRow>) {
  std::fputs("LlmOps::stageSample: not supported by this backend's ops\n", stderr);
  std::abort();
}
void LlmOps::sampleStaged(const Tensor&, int32_t, const Tensor&) {
  std::fputs("LlmOps::sampleStaged: not supported by this backend's ops\n", stderr);
  std::abort();
}

void LlmOps::moeRouteF32(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const MoeRouteParams&) {
  std::fputs("LlmOps::moeRouteF32: not supported by this backend's ops\n", stderr);
  std::abort();
}

void LlmOps::combineRmsNorm(const Tensor&, const Tensor&, const Tensor&, const RmsNormParams&) {
  std::fputs("LlmOps::combineRmsNorm: not supported by this backend's ops\n", stderr);
  std::abort();
}

void LlmOps::ropeKvWriteF32In(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const RopeKvParams&) {
  std::fputs("LlmOps::ropeKvWriteF32In: not supported by this backend's ops\n", stderr);
  std::abort();
}

Result<std::unique_ptr<LlmOps>> makeLlmOps(Backend& backend, int32_t threads) {
  if (backend.name() == "cpu") return cpu::createLlmOps(backend, threads);
#if defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA
  if (backend.name() == "cuda") return makeCudaLlmOps(backend);
#endif
  return unimplemented("no LLM ops for backend '" + std::string(backend.name()) + "'");
}

}  // namespace garden::rose
