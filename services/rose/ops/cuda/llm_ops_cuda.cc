#include "services/rose/ops/cuda/llm_ops_cuda.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "services/rose/ops/cuda/cuda_backend.h"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/fp8_act_quant.cuh"
#include "services/rose/ops/cuda/fp8_block.h"
#include "services/rose/ops/cuda/fp8_requant.cuh"
#include "services/rose/ops/cuda/gather.cuh"
#include "services/rose/ops/cuda/moe_gemm.cuh"
#include "services/rose/ops/cuda/moe_lt_bf16.cuh"
#include "services/rose/ops/cuda/moe_lt_gemm.h"
#include "services/rose/ops/cuda/moe_permute.cuh"
#include "services/rose/ops/cuda/moe_route.cuh"
#include "services/rose/ops/cuda/moe_router_f32.cuh"
#include "services/rose/ops/cuda/moe_row_bias.cuh"
#include "services/rose/ops/cuda/moe_wgmma.cuh"
#include "services/rose/ops/cuda/mxfp4_tiles.h"
#include "services/rose/ops/cuda/paged_attention.cuh"
#include "services/rose/ops/cuda/paged_attention_sm90.cuh"
#include "services/rose/ops/cuda/rms_norm.cuh"
#include "services/rose/ops/cuda/rope_kv.cuh"
#include "services/rose/ops/cuda/sample.cuh"
#include "services/rose/ops/cuda/sample_state.cuh"
#include "services/rose/ops/router_split.h"

namespace garden::rose::cuda {
namespace {

using bf16 = __nv_bfloat16;

// Op contract violations are broken invariants (llm_ops.h): abort with the reason.
// [TAG_ROUTE_ALIGN] cuda::setLlmRouteAlign's switch (measured without a gain: llm_ops_cuda.h) and
// the count of aligns a route already did (cuda::llmRouteAlignUses).
bool g_llm_route_align = false;
std::atomic<uint64_t> g_llm_route_align_uses{0};

void checkOk(const Status& s, const char* op) {
  if (s.isOk()) return;
  std::string m = std::string("cuda llm ops: ") + op + ": " + s.toString() + "\n";
  std::fwrite(m.data(), 1, m.size(), stderr);
  std::abort();
}
void require(bool cond, const char* op, const char* what) {
  if (!cond) checkOk(internalError(what), op);
}
bool is(const Tensor& t, DType d) { return !t.empty() && t.dtype == d; }

class CudaLlmOps final : public LlmOps {
 public:
  explicit CudaLlmOps(CudaBackend& b) : b_(b) {}
  ~CudaLlmOps() override {
    if (host_tiles_ != nullptr) cudaFreeHost(host_tiles_);
    if (host_wg_tiles_ != nullptr) cudaFreeHost(host_wg_tiles_);
    if (dq_stream_ != nullptr) {
      cudaStreamSynchronize(dq_stream_);
      cudaStreamDestroy(dq_stream_);
    }
    if (dq_start_ != nullptr) cudaEventDestroy(dq_start_);
    if (dq_done_ != nullptr) cudaEventDestroy(dq_done_);
  }

  Status reserve(const LlmOpsLimits& l) override {
    if (l.max_tokens <= 0 || l.max_seqs <= 0 || l.num_kv_heads <= 0 || l.num_experts <= 0 ||
        l.top_k <= 0 || l.max_logits_rows <= 0)
      return invalidArgument("cuda llm ops: reserve: limits must be positive");
    lim_ = l;
    RETURN_IF_ERROR(preparePagedAttention());  // [TAG_ATTN_DECODE_WARPS] before any capture
    // Attention plans: per window value, work items and combine entries (two windows).
    const int32_t group = l.num_q_heads / l.num_kv_heads;
    const int64_t per_block = pagedAttnTokensPerBlock(group);
    max_work_ = (l.max_tokens + per_block - 1) / per_block + l.max_seqs +
                static_cast<int64_t>(l.max_seqs) * kPagedAttnMaxSplits;
    max_combine_ = l.max_seqs;
    max_parts_ = static_cast<int64_t>(l.max_seqs) * kPagedAttnMaxSplits;
    ASSIGN_OR_RETURN(work_, b_.allocate(sizeof(PagedAttnWork) * kMaxWindows * max_work_));
    ASSIGN_OR_RETURN(combine_,
                     b_.allocate(sizeof(PagedAttnCombine) * kMaxWindows * max_combine_));
    ASSIGN_OR_RETURN(part_o_, b_.allocate(sizeof(float) * max_parts_ * l.num_q_heads * l.head_dim));
    ASSIGN_OR_RETURN(part_ml_, b_.allocate(sizeof(float) * max_parts_ * l.num_q_heads * 2));
    ASSIGN_OR_RETURN(counts_, b_.allocate(sizeof(int32_t) * 2 * kMaxWindows));
    // MoE: the largest tile count and row count over the tile shapes the launcher may pick.
    const int64_t assignments = l.max_tokens * l.top_k;
    max_tiles_ = 0;
    max_rows_ = 0;
    for (int32_t bm : {16, 64, 128}) {
      const int64_t tiles = moeAlignMaxTiles(assignments, l.num_experts, bm);
      max_tiles_ = std::max(max_tiles_, tiles);
      max_rows_ = std::max(max_rows_, tiles * bm);
    }
    // The f32 router's slice partials and sums of squares [TAG_ROUTER_F32].
    const int64_t splits = routerF32Splits(std::max<int32_t>(l.hidden, 1));
    ASSIGN_OR_RETURN(router_part_,
                     b_.allocate(sizeof(float) * splits * l.max_tokens * l.num_experts));
    ASSIGN_OR_RETURN(router_ss_, b_.allocate(sizeof(float) * splits * l.max_tokens));
    {  // [TAG_ROUTER_FUSED_ROUTE] tile counters, zero (the kernel leaves them zero)
      const std::vector<uint32_t> zeros(
          static_cast<size_t>(routerF32TileCounters(std::max<int64_t>(l.max_tokens, 1))), 0u);
      ASSIGN_OR_RETURN(router_counters_, b_.allocate(sizeof(uint32_t) * zeros.size()));
      b_.copyToDevice(bytesOf(router_counters_, zeros.size() * sizeof(uint32_t)), zeros.data(),
                      zeros.size() * sizeof(uint32_t));
    }
    ASSIGN_OR_RETURN(row_token_, b_.allocate(sizeof(int32_t) * max_rows_));
    ASSIGN_OR_RETURN(row_of_, b_.allocate(sizeof(int32_t) * assignments));
    ASSIGN_OR_RETURN(tile_expert_, b_.allocate(sizeof(int32_t) * max_tiles_));
    ASSIGN_OR_RETURN(num_tiles_, b_.allocate(sizeof(int32_t)));
    // [TAG_MOE_ALIGN_MULTIBLOCK] the multi-block align's per-block expert counts.
    ASSIGN_OR_RETURN(align_counts_, b_.allocate(sizeof(int32_t) * kMoeAlignMaxBlocks *
                                                kMoeAlignMaxExperts));
    ASSIGN_OR_RETURN(act_, b_.allocate(sizeof(bf16) * max_rows_ * l.intermediate));
    ASSIGN_OR_RETURN(y_, b_.allocate(sizeof(bf16) * max_rows_ * l.hidden));
    ASSIGN_OR_RETURN(sample_rows_, b_.allocate(sizeof(SampleRowDev) * l.max_logits_rows));
    ASSIGN_OR_RETURN(sample_ws_, b_.allocate(sampleWorkspaceBytes(l.max_logits_rows)));
    // Sampler-state slots [TAG_LLM_SAMPLER_STATE]: max_seqs slots of distinct ids — at most the
    // vocabulary, and at most a sequence's tokens plus its logit_bias entries.
    state_capacity_ = std::max<int64_t>(
        1, std::min<int64_t>(l.vocab > 0 ? l.vocab : INT64_MAX,
                             std::max<int64_t>(l.max_model_len, 1) + llm::kMaxLogitBias));
    ASSIGN_OR_RETURN(state_entries_, b_.allocate(sizeof(SamplerEntryDev) *
                                                 static_cast<size_t>(l.max_seqs) *
                                                 static_cast<size_t>(state_capacity_)));
    ASSIGN_OR_RETURN(state_sizes_, b_.allocate(sizeof(int32_t) * static_cast<size_t>(l.max_seqs)));
    ASSIGN_OR_RETURN(state_rows_, b_.allocate(sizeof(StateRowDev) * l.max_logits_rows));
    {
      const std::vector<int32_t> zeros(static_cast<size_t>(l.max_seqs), 0);
      b_.copyToDevice(bytesOf(state_sizes_, zeros.size() * sizeof(int32_t)), zeros.data(),
                      zeros.size() * sizeof(int32_t));
    }
    mask_words_ = (l.vocab + 31) / 32;  // [TAG_TOKEN_MASK]: one bitmask per sampled row at most
    ASSIGN_OR_RETURN(sample_masks_,
                     b_.allocate(sizeof(uint32_t) * static_cast<size_t>(mask_words_) *
                                 static_cast<size_t>(std::max<int64_t>(l.max_logits_rows, 1))));
    reserved_ = true;
    ranges_ready_ = false;
    if (fp8_ready_) {  // FP8 copies exist: their workspaces follow the new limits
      fp8_ready_ = false;
      RETURN_IF_ERROR(ensureFp8Workspace());
    }
    if (lt_ready_) {  // the bf16 cuBLASLt path's workspaces too [TAG_MOE_LT_BF16]
      lt_ready_ = false;
      RETURN_IF_ERROR(ensureLtBf16Workspace(0, false));
    }
    return okStatus();
  }

  bool supportsExpertFormat(ExpertFormat f) const override {
    return f == ExpertFormat::kDense || f == ExpertFormat::kMxfp4;
  }

  bool supportsFp8Experts() const override { return true; }
  bool supportsBf16ExpertCopy() const override { return true; }
  bool routerF32Split() const override { return routerMma(); }  // [TAG_ROUTER_MMA]

  Result<ExpertWeights> uploadMxfp4Experts(const uint8_t* codes, const uint8_t* scales,
                                           int64_t experts, int64_t rows, int64_t cols,
                                           ExpertCopy copy) override {
    const bool fp8_copy = copy == ExpertCopy::kFp8, bf16_copy = copy == ExpertCopy::kBf16;
    if (experts <= 0 || rows <= 0 || cols <= 0 || cols % 32 != 0)
      return invalidArgument("MXFP4 experts: bad shape (cols must be a multiple of 32)");
    if (fp8_copy && rows % 8 != 0)
      return invalidArgument("MXFP4 experts: the FP8 copy needs rows (" + std::to_string(rows) +
                             ") to be a multiple of 8");
    if (fp8_copy) RETURN_IF_ERROR(ensureFp8Workspace());
    Mxfp4PackedShape shape{experts, rows, cols};
    ExpertWeights w;
    w.format = ExpertFormat::kMxfp4;
    w.experts = experts;
    w.rows = rows;
    w.cols = cols;
    ASSIGN_OR_RETURN(Buffer cb, b_.allocate(shape.codeBytes()));
    ASSIGN_OR_RETURN(Buffer sb, b_.allocate(shape.scaleBytes()));
    w.codes = Tensor(cb.data(), DType::kU8, {static_cast<int64_t>(shape.codeBytes())});
    w.scales = Tensor(sb.data(), DType::kU8, {static_cast<int64_t>(shape.scaleBytes())});
    // Staged a few experts at a time: checkpoint bytes (mmap) → staging → tiled layout.
    const int64_t groups = cols / 32;
    const size_t per_expert_codes = static_cast<size_t>(rows * groups * 16);
    const size_t per_expert_scales = static_cast<size_t>(rows * groups);
    const int64_t chunk = std::max<int64_t>(
        1, std::min<int64_t>(experts, (size_t{64} << 20) / (per_expert_codes + per_expert_scales)));
    ASSIGN_OR_RETURN(Buffer stage,
                     b_.allocate(chunk * (per_expert_codes + per_expert_scales) + 512));
    uint8_t* sc = static_cast<uint8_t*>(stage.data());
    uint8_t* ss = sc + chunk * per_expert_codes;
    const size_t flag_at = (chunk * (per_expert_codes + per_expert_scales) + 255) & ~size_t{255};
    unsigned* max_scale = reinterpret_cast<unsigned*>(sc + flag_at);  // the largest scale byte
    // FP8 copy [TAG_FP8_EXPERTS]: e4m3 [E][rows][KP] + block scales, requantized from the same
    // staging bytes; two u64 counters (inexact, non-zero) after the max-scale word.
    unsigned long long* fp8_counts = reinterpret_cast<unsigned long long*>(sc + flag_at + 8);
    Buffer qb, qsb;
    if (fp8_copy) {
      const size_t qbytes = static_cast<size_t>(experts * rows * fp8PaddedK(cols));
      const size_t sbytes =
          static_cast<size_t>(experts * fp8WeightScalesPerExpert(rows, cols)) * sizeof(float);
      ASSIGN_OR_RETURN(qb, b_.allocate(qbytes));
      ASSIGN_OR_RETURN(qsb, b_.allocate(sbytes));
      w.fp8 = Tensor(qb.data(), DType::kU8, {static_cast<int64_t>(qbytes)});
      w.fp8_scales = Tensor(qsb.data(), DType::kU8, {static_cast<int64_t>(sbytes)});
    }
    cudaStream_t st = b_.stream();
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(max_scale, 0, 24, st));
    for (int64_t e0 = 0; e0 < experts; e0 += chunk) {
      const int64_t n = std::min(chunk, experts - e0);
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sc, codes + e0 * per_expert_codes, n * per_expert_codes,
                                           cudaMemcpyHostToDevice, st));
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ss, scales + e0 * per_expert_scales,
                                           n * per_expert_scales, cudaMemcpyHostToDevice, st));
      RETURN_IF_ERROR(launchMxfp4Pack(sc, ss, e0, n, shape, static_cast<uint8_t*>(cb.data()),
                                      static_cast<uint8_t*>(sb.data()), max_scale, st));
      if (fp8_copy) {
        Fp8RequantArgs rq;
        rq.src_codes = sc;
        rq.src_scales = ss;
        rq.first = e0;
        rq.count = n;
        rq.experts = experts;
        rq.n = rows;
        rq.k = cols;
        rq.q = static_cast<uint8_t*>(qb.data());
        rq.scales = static_cast<float*>(qsb.data());
        rq.inexact = fp8_counts;
        rq.nonzero = fp8_counts + 1;
        RETURN_IF_ERROR(launchFp8Requant(rq, st));
      }
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));  // the staging buffer is reused
    }
    unsigned largest = 255;
    CUDA_RETURN_IF_ERROR(cudaMemcpy(&largest, max_scale, sizeof largest, cudaMemcpyDeviceToHost));
    w.mx_max_scale = largest;
    // [TAG_MOE_LT_BF16] prefill steps may dequantize these experts into the bf16 scratch (a
    // down projection, [E][hidden][intermediate], into its own with [TAG_MOE_LT_OVERLAP]).
    // With a bf16 copy [TAG_MOE_BF16_COPY] no scratch is needed for these experts (only the path's
    // row workspaces), nor when the wgmma kernel will read them as they are [TAG_MOE_WGMMA] (on,
    // and every scale byte within its one-multiply dequantization).
    const bool wgmma_reads = wgmmaOn() && !bf16_copy && largest <= kMxfp4MaxDecodeScale;
    // [TAG_MOE_PREFILL_AUTO] Whole steps go to the kernel only while it runs every MXFP4 expert.
    if (!wgmma_reads || rows % 16 != 0) mx_beyond_wgmma_ = true;
    if (moeLtBf16MinTokens() > 0)
      RETURN_IF_ERROR(ensureLtBf16Workspace(
          bf16_copy || wgmma_reads ? 0 : experts * rows * cols,
          moeLtOverlapDequant() && !bf16_copy && rows == lim_.hidden && cols == lim_.intermediate));
    if (bf16_copy) {  // [TAG_MOE_BF16_COPY] every expert, by the path's own dequantization kernel
      const size_t bytes = sizeof(bf16) * static_cast<size_t>(experts * rows * cols);
      ASSIGN_OR_RETURN(Buffer copy_buf, b_.allocate(bytes));
      Mxfp4DequantArgs d;
      d.codes = static_cast<const uint8_t*>(cb.data());
      d.scales = static_cast<const uint8_t*>(sb.data());
      d.out = static_cast<bf16*>(copy_buf.data());
      d.experts = static_cast<int32_t>(experts);
      d.n = static_cast<int32_t>(rows);
      d.k = static_cast<int32_t>(cols);
      d.max_scale = largest;
      RETURN_IF_ERROR(launchMxfp4Dequant(d, st));
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
      w.bf16_copy = Tensor(copy_buf.data(), DType::kBF16, {experts, rows, cols});
      w.storage.push_back(std::move(copy_buf));
    }
    if (fp8_copy) {
      unsigned long long counts[2] = {0, 0};
      CUDA_RETURN_IF_ERROR(cudaMemcpy(counts, fp8_counts, sizeof counts, cudaMemcpyDeviceToHost));
      w.fp8_inexact = counts[0];
      w.fp8_nonzero = counts[1];
      w.storage.push_back(std::move(qb));
      w.storage.push_back(std::move(qsb));
    }
    w.storage.push_back(std::move(cb));
    w.storage.push_back(std::move(sb));
    return w;
  }

  void ropeKvWrite(const Tensor& qkv, const Tensor& positions, const Tensor& cos,
                   const Tensor& sin, const Tensor& slot_mapping, const Tensor& k_cache,
                   const Tensor& v_cache, const RopeKvParams& p) override {
    ropeKv(nullptr, qkv, positions, cos, sin, slot_mapping, k_cache, v_cache, p);
  }

  void ropeKvWriteF32In(const Tensor& qkv_in, const Tensor& qkv, const Tensor& positions,
                        const Tensor& cos, const Tensor& sin, const Tensor& slot_mapping,
                        const Tensor& k_cache, const Tensor& v_cache,
                        const RopeKvParams& p) override {
    require(is(qkv_in, DType::kF32) && qkv_in.ndim == 2 && qkv_in.rows() == qkv.rows() &&
                qkv_in.cols() == qkv.cols(),
            "ropeKvWriteF32In", "qkv_in must be F32 of qkv's shape");
    ropeKv(&qkv_in, qkv, positions, cos, sin, slot_mapping, k_cache, v_cache, p);
  }

  void planAttention(const AttentionPlanInput& in) override {
    require(reserved_, "planAttention", "reserve() was not called");
    require(in.windows.size() <= kMaxWindows, "planAttention", "more than 2 window values");
    require(in.num_kv_heads > 0 && in.num_q_heads % in.num_kv_heads == 0, "planAttention",
            "bad head counts");
    const int32_t group = in.num_q_heads / in.num_kv_heads;
    plans_.clear();
    for (size_t i = 0; i < in.windows.size(); ++i) {
      // [TAG_PAGED_ATTN_SM90] long chunks to the Hopper kernel (eager steps only: a graph step's
      // sequences are single tokens, below any threshold).
      const int32_t sm90_min = in.head_dim == 64 ? pagedAttnSm90MinTokens(in.windows[i]) : 0;
      PagedAttnPlan plan =
          planPagedAttention(in.cu_q.data(), static_cast<int32_t>(in.cu_q.size()) - 1,
                             in.positions.data(), group, in.windows[i], sm90_min,
                             pagedAttnSm90Rows());
      require(static_cast<int64_t>(plan.work.size() + plan.sm90.size()) <= max_work_ &&
                  static_cast<int64_t>(plan.combine.size()) <= max_combine_ &&
                  plan.num_parts <= max_parts_,
              "planAttention", "the step's attention plan exceeds the reserved workspace");
      PlanSlot slot;
      slot.window = in.windows[i];
      slot.num_work = static_cast<int32_t>(plan.work.size());
      slot.num_combine = static_cast<int32_t>(plan.combine.size());
      slot.num_sm90 = static_cast<int32_t>(plan.sm90.size());
      for (const PagedAttnWork& w : plan.work) slot.has_single = slot.has_single || w.single != 0;
      plan.work.insert(plan.work.end(), plan.sm90.begin(), plan.sm90.end());  // one upload
      slot.work = static_cast<PagedAttnWork*>(work_.data()) + i * max_work_;
      slot.combine = static_cast<PagedAttnCombine*>(combine_.data()) + i * max_combine_;
      slot.counts = static_cast<int32_t*>(counts_.data()) + 2 * i;
      const int32_t counts[2] = {slot.num_work, slot.num_combine};
      b_.copyToDevice(Tensor(slot.counts, DType::kI32, {2}), counts, sizeof counts);
      if (!plan.work.empty()) {
        b_.copyToDevice(Tensor(slot.work, DType::kU8,
                               {static_cast<int64_t>(plan.work.size() * sizeof(PagedAttnWork))}),
                        plan.work.data(), plan.work.size() * sizeof(PagedAttnWork));
      }
      if (!plan.combine.empty()) {
        b_.copyToDevice(
            Tensor(slot.combine, DType::kU8,
                   {static_cast<int64_t>(plan.combine.size() * sizeof(PagedAttnCombine))}),
            plan.combine.data(), plan.combine.size() * sizeof(PagedAttnCombine));
      }
      plans_.push_back(slot);
    }
  }

  void pagedAttention(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                      const Tensor& cu_q, const Tensor& positions, const Tensor& block_tables,
                      const Tensor& sinks, const Tensor& out,
                      const PagedAttentionParams& p) override {
    // [TAG_ATTN_F16] qkv, caches and out all BF16 or all F16.
    const bool f16 = is(qkv, DType::kF16);
    const DType t16 = f16 ? DType::kF16 : DType::kBF16;
    require(is(qkv, t16) && is(k_cache, t16) && is(v_cache, t16) && is(out, t16) &&
                is(cu_q, DType::kI32) && is(positions, DType::kI32) &&
                is(block_tables, DType::kI32),
            "pagedAttention", "dtypes: qkv/caches/out BF16 (or all F16), indices I32");
    require(sinks.empty() || (sinks.dtype == DType::kF32 && sinks.numel() == p.num_q_heads),
            "pagedAttention", "sinks must be F32 [Hq]");
    require(k_cache.ndim == 4 && k_cache.dim(1) == p.block_size &&
                k_cache.dim(2) == p.num_kv_heads && k_cache.dim(3) == p.head_dim,
            "pagedAttention", "cache shape mismatch");
    const PlanSlot* plan = nullptr;
    for (const PlanSlot& s : plans_) {
      if (s.window == p.sliding_window) plan = &s;
    }
    require(plan != nullptr, "pagedAttention", "no plan for this sliding_window (planAttention)");
    PagedAttentionArgs a;
    a.pdl = b_.pdlGraph();  // [TAG_PDL_GRAPH]
    a.f16 = f16;
    a.qkv = static_cast<const bf16*>(qkv.data);
    a.k_cache = static_cast<const bf16*>(k_cache.data);
    a.v_cache = static_cast<const bf16*>(v_cache.data);
    a.cu_q = cu_q.as<int32_t>();
    a.positions = positions.as<int32_t>();
    a.block_tables = block_tables.as<int32_t>();
    a.sinks = sinks.empty() ? nullptr : sinks.as<float>();
    a.work = plan->work;
    a.combine = plan->combine;
    a.out = static_cast<bf16*>(out.data);
    a.part_o = static_cast<float*>(part_o_.data());
    a.part_ml = static_cast<float*>(part_ml_.data());
    a.num_work = plan->num_work;
    a.num_combine = plan->num_combine;
    a.has_single = plan->has_single;
    a.sm90_work = plan->work + plan->num_work;
    a.num_sm90_work = plan->num_sm90;
    a.num_tokens = qkv.rows();  // the launcher checks the Hopper kernel can run (KV block size, GPU)
    if (p.graph_seqs > 0) {  // any plan of up to graph_seqs single-token sequences
      // A layer whose window never splits a token (gpt-oss's sliding layers) launches one work
      // block per sequence and no combine kernel.
      const bool can_split = pagedAttnWindowCanSplit(p.sliding_window);
      const int32_t per_seq = can_split ? kPagedAttnMaxSplits : 1;
      require(plan->num_work <= static_cast<int64_t>(p.graph_seqs) * per_seq &&
                  plan->num_combine <= (can_split ? p.graph_seqs : 0),
              "pagedAttention", "the plan exceeds what graph_seqs allows");
      a.counts = plan->counts;
      a.has_single = true;  // captured once, replayed with any decode plan
      a.grid_work = std::min<int32_t>(p.graph_seqs * per_seq, kGraphGridCap);
      a.grid_combine = can_split ? std::min<int32_t>(p.graph_seqs, kGraphGridCap) : 0;
    }
    a.num_q_heads = p.num_q_heads;
    a.num_kv_heads = p.num_kv_heads;
    a.head_dim = p.head_dim;
    a.block_size = p.block_size;
    a.max_blocks = p.max_blocks_per_seq;
    a.num_blocks = static_cast<int32_t>(k_cache.dim(0));
    a.sliding_window = p.sliding_window;
    a.scale = p.scale;
    checkOk(launchPagedAttention(a, b_.stream()), "pagedAttention");
  }

  void moeRoute(const Tensor& router_logits, const Tensor& bias, const Tensor& topk_ids,
                const Tensor& topk_weights, const MoeRouteParams& p) override {
    require(is(router_logits, DType::kF32) && is(topk_ids, DType::kI32) &&
                is(topk_weights, DType::kF32),
            "moeRoute", "logits F32, ids I32, weights F32");
    require(bias.empty() || (bias.dtype == DType::kBF16 && bias.numel() == router_logits.cols()),
            "moeRoute", "bias must be BF16 [E]");
    require(topk_ids.numel() == router_logits.rows() * p.top_k &&
                topk_weights.numel() == topk_ids.numel(),
            "moeRoute", "top-k shape mismatch");
    MoeRouteArgs a;
    a.pdl = b_.pdlGraph();  // [TAG_PDL_GRAPH]
    a.logits = router_logits.as<float>();
    a.bias = bias.empty() ? nullptr : bias.as<bf16>();
    a.topk_ids = topk_ids.as<int32_t>();
    a.topk_weights = topk_weights.as<float>();
    a.num_tokens = router_logits.rows();
    a.num_experts = static_cast<int32_t>(router_logits.cols());
    a.top_k = p.top_k;
    routeMaybeAligned(a, "moeRoute");
  }

  // [TAG_ROUTE_ALIGN] The route, and for a decode-sized step the MoE align of its ids in the same
  // kernel (recorded in pre_aligned_ for the moeExperts call that reads these ids).
  void routeMaybeAligned(const MoeRouteArgs& a, const char* op) {
    pre_aligned_.valid = false;
    const int64_t n = a.num_tokens * a.top_k;
    if (g_llm_route_align && reserved_ && a.num_tokens >= 1 &&
        a.num_tokens <= kMoeRouteAlignMaxTokens && n <= 32 && a.num_experts == lim_.num_experts) {
      PreAligned pa;
      pa.ids = a.topk_ids;
      pa.tokens = a.num_tokens;
      pa.top_k = a.top_k;
      pa.experts = a.num_experts;
      // moeExperts recomputes its tile from the weights' format; at <= 32 assignments every
      // format takes the same one (an override that differs makes it align again).
      pa.block_m = moeGemmBlockM(n, a.num_experts, true);
      pa.tiles = moeAlignMaxTiles(n, a.num_experts, pa.block_m);
      const MoeAlignArgs al = alignArgs(a.topk_ids, a.num_tokens, a.top_k, a.num_experts,
                                        pa.block_m, pa.tiles);
      checkOk(launchMoeRouteAlign(a, al, b_.stream()), op);
      pa.valid = true;
      pre_aligned_ = pa;
      return;
    }
    checkOk(launchMoeRoute(a, b_.stream()), op);
  }

  void moeRouteF32(const Tensor& residual, const Tensor& wt, const Tensor& bias,
                   const Tensor& topk_ids, const Tensor& topk_weights,
                   const MoeRouteParams& p) override {
    require(reserved_, "moeRouteF32", "reserve() was not called");
    // [TAG_ROUTER_MMA] The split weights (BF16 [2, Ep, Hp]) run the tensor-core kernel.
    const bool split = is(wt, DType::kBF16);
    require(is(residual, DType::kF32) && (split || is(wt, DType::kF32)) &&
                is(topk_ids, DType::kI32) && is(topk_weights, DType::kF32),
            "moeRouteF32", "residual F32, wt F32 (or the BF16 split), ids I32, weights F32");
    const int64_t t = residual.rows();
    require(residual.cols() == lim_.hidden && t <= lim_.max_tokens &&
                (split ? wt.ndim == 3 && wt.shape[0] == 2 &&
                             wt.shape[1] == routerSplitPaddedE(lim_.num_experts) &&
                             wt.shape[2] == routerSplitPaddedH(lim_.hidden)
                       : wt.rows() == lim_.hidden && wt.cols() == lim_.num_experts),
            "moeRouteF32", "shapes exceed what reserve() allowed");
    require(bias.empty() || (bias.dtype == DType::kBF16 && bias.numel() == lim_.num_experts),
            "moeRouteF32", "bias must be BF16 [E]");
    require(topk_ids.numel() == t * p.top_k && topk_weights.numel() == topk_ids.numel(),
            "moeRouteF32", "top-k shape mismatch");
    RouterF32Args r;
    r.pdl = b_.pdlGraph();  // [TAG_PDL_GRAPH]
    r.residual = residual.as<float>();
    r.wt = split ? nullptr : wt.as<float>();
    r.part = static_cast<float*>(router_part_.data());
    r.ss = static_cast<float*>(router_ss_.data());
    r.num_tokens = t;
    r.hidden = lim_.hidden;
    r.num_experts = lim_.num_experts;
    MoeRouteArgs a;
    a.pdl = b_.pdlGraph();  // [TAG_PDL_GRAPH]
    a.logits = r.part;
    a.bias = bias.empty() ? nullptr : bias.as<bf16>();
    a.topk_ids = topk_ids.as<int32_t>();
    a.topk_weights = topk_weights.as<float>();
    a.num_tokens = t;
    a.num_experts = lim_.num_experts;
    a.top_k = p.top_k;
    a.splits = routerF32Splits(lim_.hidden);
    a.ss = r.ss;
    a.hidden = lim_.hidden;
    a.eps = p.norm_eps;
    if (split) {
      RouterMmaArgs m;
      m.residual = r.residual;
      m.w = wt.as<uint16_t>();
      m.part = r.part;
      m.ss = r.ss;
      m.num_tokens = t;
      m.hidden = lim_.hidden;
      m.num_experts = lim_.num_experts;
      checkOk(launchRouterMmaPartials(m, b_.stream()), "moeRouteF32");
      routeMaybeAligned(a, "moeRouteF32");
      return;
    }
    if (routerFusedRoute()) {  // [TAG_ROUTER_FUSED_ROUTE]: one kernel
      pre_aligned_.valid = false;
      r.route_counters = static_cast<unsigned int*>(router_counters_.data());
      r.route = a;
      checkOk(launchRouterF32Partials(r, b_.stream()), "moeRouteF32");
      return;
    }
    checkOk(launchRouterF32Partials(r, b_.stream()), "moeRouteF32");
    routeMaybeAligned(a, "moeRouteF32");
  }

  void moeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                  const ExpertWeights& w1, const Tensor& b1, const ExpertWeights& w2,
                  const Tensor& b2, const Tensor& out, const MoeExpertsParams& p) override {
    require(reserved_, "moeExperts", "reserve() was not called");
    // [TAG_ATTN_F16] x, out, biases and dense experts all BF16 or all F16.
    const bool f16 = is(x, DType::kF16);
    const DType t16 = f16 ? DType::kF16 : DType::kBF16;
    require(is(x, t16) && (is(out, t16) || is(out, DType::kF32)) && is(topk_ids, DType::kI32) &&
                is(topk_weights, DType::kF32),
            "moeExperts", "x BF16 or F16, out x's dtype or F32, ids I32, weights F32");
    require(x.data != out.data, "moeExperts", "out must not alias x");
    const int64_t t = x.rows();
    require(x.cols() == p.hidden && out.rows() == t && out.cols() == p.hidden, "moeExperts",
            "x/out shape mismatch");
    require(topk_ids.numel() == t * p.top_k && topk_weights.numel() == t * p.top_k, "moeExperts",
            "top-k shape mismatch");
    require(w1.experts == p.num_experts && w1.rows == 2 * p.intermediate && w1.cols == p.hidden &&
                w2.experts == p.num_experts && w2.rows == p.hidden && w2.cols == p.intermediate,
            "moeExperts", "expert weight shapes mismatch the params");
    require(b1.empty() || (b1.dtype == t16 && b1.numel() == p.num_experts * 2 * p.intermediate),
            "moeExperts", "b1 must be [E, 2I] in x's dtype");
    require(b2.empty() || (b2.dtype == t16 && b2.numel() == p.num_experts * p.hidden),
            "moeExperts", "b2 must be [E, H] in x's dtype");
    // top_k and num_experts below the reserved ones: the sharded model's one-slot expert pairs
    // over the experts of its rank, reserved with every expert for its router (the workspaces are
    // sized by max_tokens x top_k assignments over lim_.num_experts, which a smaller call stays
    // within).
    require(t <= lim_.max_tokens && p.num_experts >= 1 && p.num_experts <= lim_.num_experts &&
                p.top_k >= 1 &&
                p.top_k <= lim_.top_k && p.hidden == lim_.hidden &&
                p.intermediate == lim_.intermediate,
            "moeExperts", "step larger than reserve() allowed");
    if (t == 0) return;
    cudaStream_t st = b_.stream();
    if (useFp8(t, w1, w2, st, f16)) {
      moeExpertsFp8(x, topk_ids, topk_weights, w1, b1, w2, b2, out, p);
      return;
    }
    if (useLtBf16(t, w1, w2, st, p, f16)) {
      moeExpertsLtBf16(x, topk_ids, topk_weights, w1, b1, w2, b2, out, p);
      return;
    }
    const int64_t assignments = t * p.top_k;
    const bool mx_wide = w1.format == ExpertFormat::kMxfp4 && w2.format == ExpertFormat::kMxfp4 &&
                         w1.mx_max_scale <= kMxfp4MaxDecodeScale &&
                         w2.mx_max_scale <= kMxfp4MaxDecodeScale;
    const int32_t bm = moeGemmBlockM(assignments, p.num_experts, mx_wide);
    const int64_t tiles = moeAlignMaxTiles(assignments, p.num_experts, bm);
    alignExperts(topk_ids, t, p, bm, tiles, st);

    auto fillWeights = [&](MoeGemmArgs& g, const ExpertWeights& w) {
      if (w.format == ExpertFormat::kMxfp4) {
        g.codes = static_cast<const uint8_t*>(w.codes.data);
        g.scales = static_cast<const uint8_t*>(w.scales.data);
      } else {
        require(is(w.dense, t16), "moeExperts", "dense experts must be in x's dtype");
        g.w = static_cast<const bf16*>(w.dense.data);
      }
    };
    MoeGemmArgs g1;
    g1.pdl = b_.pdlGraph();  // [TAG_PDL_GRAPH]
    g1.f16 = f16;
    g1.a = static_cast<const bf16*>(x.data);
    g1.a_rows = static_cast<const int32_t*>(row_token_.data());
    g1.tile_expert = static_cast<const int32_t*>(tile_expert_.data());
    g1.num_tiles = static_cast<const int32_t*>(num_tiles_.data());
    fillWeights(g1, w1);
    g1.bias = b1.empty() ? nullptr : static_cast<const bf16*>(b1.data);
    g1.out = static_cast<bf16*>(act_.data());
    g1.max_tiles = static_cast<int32_t>(tiles);
    g1.block_m = bm;
    g1.num_experts = p.num_experts;
    g1.n = 2 * p.intermediate;
    g1.k = p.hidden;
    g1.epilogue = MoeGemmEpilogue::kSwiglu;
    g1.max_rows_per_expert = static_cast<int32_t>(std::min<int64_t>(t, 1 << 30));
    g1.k_slices = moeKSlices();  // [TAG_MOE_K_SLICES]
    g1.l2_prefetch = moeL2Prefetch();  // [TAG_MOE_L2_PREFETCH]
    g1.mx_max_scale = w1.format == ExpertFormat::kMxfp4 ? w1.mx_max_scale : 255;
    g1.swiglu_limit = p.swiglu_limit;
    g1.swiglu_alpha = p.swiglu_alpha;
    checkOk(launchMoeGemm(g1, st), "moeExperts/gate_up");

    MoeGemmArgs g2 = g1;
    g2.a = static_cast<const bf16*>(act_.data());
    g2.a_rows = nullptr;
    g2.w = nullptr;
    g2.codes = nullptr;
    g2.scales = nullptr;
    fillWeights(g2, w2);
    g2.bias = b2.empty() ? nullptr : static_cast<const bf16*>(b2.data);
    g2.out = static_cast<bf16*>(y_.data());
    g2.n = p.hidden;
    g2.k = p.intermediate;
    g2.epilogue = MoeGemmEpilogue::kBias;
    g2.out_scale = f16 ? kMoeF16OutScale : 1.f;  // [TAG_MOE_F16_OUT_SCALE]
    g2.row_valid = static_cast<const int32_t*>(row_token_.data());
    g2.mx_max_scale = w2.format == ExpertFormat::kMxfp4 ? w2.mx_max_scale : 255;
    checkOk(launchMoeGemm(g2, st), "moeExperts/down");

    MoeCombineArgs c;
    c.pdl = b_.pdlGraph();  // [TAG_PDL_GRAPH]
    c.f16 = f16;
    c.out_f32 = out.dtype == DType::kF32;  // the combine kept in f32
    c.y_scale = f16 ? kMoeF16OutUnscale : 1.f;  // [TAG_MOE_F16_OUT_SCALE]
    c.y = static_cast<const bf16*>(y_.data());
    c.row_of = static_cast<const int32_t*>(row_of_.data());
    c.weights = topk_weights.as<float>();
    c.out = static_cast<bf16*>(out.data);
    c.num_tokens = t;
    c.top_k = p.top_k;
    c.hidden = p.hidden;
    combineOrDefer(c, p, st);
  }

  // [TAG_COMBINE_NORM] The combine now, or kept for the next combineRmsNorm().
  void combineOrDefer(const MoeCombineArgs& c, const MoeExpertsParams& p, cudaStream_t st) {
    if (p.defer_combine) {
      deferred_ = c;
      deferred_valid_ = true;
      return;
    }
    checkOk(launchMoeCombine(c, st), "moeExperts/combine");
  }

  bool supportsCombineNorm() const override { return true; }
  void combineRmsNorm(const Tensor& residual, const Tensor& weight, const Tensor& out,
                      const RmsNormParams& p) override {
    require(deferred_valid_, "combineRmsNorm", "no deferred combine (moeExperts defer_combine)");
    const MoeCombineArgs& c = deferred_;
    require(is(weight, DType::kBF16) && (is(out, DType::kBF16) || is(out, DType::kF16)) &&
                (residual.dtype == DType::kBF16 || residual.dtype == DType::kF32) &&
                (!c.out_f32 || residual.dtype == DType::kF32),
            "combineRmsNorm", "weight BF16, out BF16 or F16, residual BF16 or F32 (an f32 combine: F32)");
    require(out.rows() == c.num_tokens && out.cols() == c.hidden &&
                residual.rows() == c.num_tokens && residual.cols() == c.hidden &&
                weight.numel() == c.hidden && !p.residual_init,
            "combineRmsNorm", "shape mismatch (or residual_init)");
    RmsNormArgs a;
    a.combine_y = c.y;
    a.combine_row_of = c.row_of;
    a.combine_weights = c.weights;
    a.combine_top_k = c.top_k;
    a.combine_f16 = c.f16;  // [TAG_ATTN_F16]
    a.combine_scale = c.y_scale;  // [TAG_MOE_F16_OUT_SCALE]
    a.combine_f32 = c.out_f32;
    const bool f32_res = residual.dtype == DType::kF32;
    a.residual = f32_res ? nullptr : residual.as<bf16>();
    a.residual_f32 = f32_res ? residual.as<float>() : nullptr;
    a.round_normalized = p.round_normalized;
    a.weight = weight.as<bf16>();
    a.out = static_cast<bf16*>(out.data);
    a.out_f16 = out.dtype == DType::kF16;  // [TAG_ATTN_F16] the next layer's attention input
    a.rows = c.num_tokens;
    a.hidden = c.hidden;
    a.eps = p.eps;
    a.pdl_graph = b_.pdlGraph();  // [TAG_PDL_GRAPH]
    checkOk(launchRmsNorm(a, b_.stream(), b_.pdl()), "combineRmsNorm");
    deferred_valid_ = false;
  }

  // Eager (not captured) steps only: the expert ranges of the cuBLASLt paths go through the host.
  static bool notCapturing(cudaStream_t st) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(st, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone;
  }

  // FP8 experts [TAG_FP8_EXPERTS] when both projections carry the copy, the step is large
  // enough (moeFp8MinTokens) and not being captured (the expert ranges go through the host).
  // Never for fp16 activations (f16 [TAG_ATTN_F16]: the copy's activations are quantized from bf16).
  bool useFp8(int64_t t, const ExpertWeights& w1, const ExpertWeights& w2, cudaStream_t st,
              bool f16) const {
    if (f16 || w1.fp8.empty() || w2.fp8.empty() || t < moeFp8MinTokens()) return false;
    return notCapturing(st);
  }

  // [TAG_MOE_LT_BF16] MXFP4 experts dequantized per call + bf16 cuBLASLt GEMMs: switched on
  // (moeLtBf16MinTokens > 0, set before the experts were uploaded so the scratch exists), the
  // call marked kTake or (kBySize) large enough, not being captured. With fp16 activations (f16
  // [TAG_ATTN_F16]) the wgmma kernel's only: the cuBLASLt GEMMs are bf16.
  bool useLtBf16(int64_t t, const ExpertWeights& w1, const ExpertWeights& w2, cudaStream_t st,
                 const MoeExpertsParams& p, bool f16) const {
    if (p.lt == MoeLtChoice::kSkip) return false;
    const int64_t min_tokens = moeLtBf16MinTokens();
    if (min_tokens <= 0 || !lt_ready_) return false;
    // The rows-per-expert floor: the cuBLASLt GEMMs' (moeLtBf16MinRowsPerExpert), or the lower
    // one of the wgmma kernel [TAG_MOE_WGMMA] when it runs these experts. A chunk the model cut at
    // the wgmma floor (kTake) that the kernel cannot run is held to the cuBLASLt floor here.
    const bool wgmma = useWgmma(w1, w2);
    if (f16 && !wgmma) return false;
    const bool enough_rows =
        t * p.top_k >= moeLtMinRowsPerExpert(wgmma) * static_cast<int64_t>(p.num_experts);
    if (p.lt == MoeLtChoice::kBySize && (t < min_tokens || !enough_rows)) return false;
    if (p.lt == MoeLtChoice::kTake && !enough_rows) return false;
    if (w1.format != ExpertFormat::kMxfp4 || w2.format != ExpertFormat::kMxfp4) return false;
    // Each projection: its bf16 copy [TAG_MOE_BF16_COPY], or a scratch it fits, or neither with
    // the wgmma kernel [TAG_MOE_WGMMA].
    if (wgmma) return notCapturing(st);
    const int64_t w2_elems = w2.experts * w2.rows * w2.cols;
    if ((w1.bf16_copy.empty() && w1.experts * w1.rows * w1.cols > lt_w_elems_) ||
        (w2.bf16_copy.empty() && w2_elems > lt_w_elems_ &&
         !(overlapDequant() && w2_elems <= lt_w2_elems_)))
      return false;
    return notCapturing(st);
  }

  // [TAG_MOE_WGMMA] switched on (moeLtWgmma()) on a device that runs it.
  static bool wgmmaOn() {
    static const bool supported = moeWgmmaSupported();
    return moeLtWgmma() && supported;
  }
  // ... and both projections' scales fit its one-multiply dequantization. Experts with a bf16
  // copy [TAG_MOE_BF16_COPY] (asked for by --moe-weights mxfp4-bf16) keep the cuBLASLt GEMMs on
  // the copy.
  static bool useWgmma(const ExpertWeights& w1, const ExpertWeights& w2) {
    return wgmmaOn() && w1.bf16_copy.empty() && w2.bf16_copy.empty() &&
           w1.format == ExpertFormat::kMxfp4 && w2.format == ExpertFormat::kMxfp4 &&
           w1.mx_max_scale <= kMxfp4MaxDecodeScale && w2.mx_max_scale <= kMxfp4MaxDecodeScale &&
           w1.rows % 16 == 0 && w2.rows % 8 == 0;
  }

  // [TAG_MOE_LT_OVERLAP] on, and its stream made at upload.
  bool overlapDequant() const { return moeLtOverlapDequant() && dq_stream_ != nullptr; }

  int64_t moeChunkMinRowsPerExpert() const override {
    if (!moeLtBf16PerChunk() || moeLtBf16MinTokens() <= 0 || !lt_ready_) return 0;
    return std::max<int64_t>(1, moeLtMinRowsPerExpert(wgmmaOn()));
  }

  // [TAG_MOE_PREFILL_AUTO] The wgmma kernel runs every MXFP4 expert uploaded so far (its bits are
  // the tiled kernels'): the model, which asks only when there is a chunk floor, may make the
  // whole step one call at that floor.
  bool moeWholeStep() const override {
    return moeLtBf16Auto() && wgmmaOn() && !mx_beyond_wgmma_;
  }

  // The expert ranges of the cuBLASLt paths (block_m kLtBlockM): the pinned tile copy, its
  // offsets on the device and the shared cuBLASLt runner; sized for reserve()'s limits, once.
  Status ensureRangeWorkspace() {
    if (ranges_ready_) return okStatus();
    if (!reserved_) return failedPrecondition("cuda llm ops: cuBLASLt experts need reserve() first");
    const int64_t assignments = lim_.max_tokens * lim_.top_k;
    range_max_tiles_ = moeAlignMaxTiles(assignments, lim_.num_experts, kLtBlockM);
    ASSIGN_OR_RETURN(range_off_, b_.allocate(sizeof(int32_t) * static_cast<size_t>(lim_.num_experts + 1)));
    if (host_tiles_ != nullptr) {
      cudaFreeHost(host_tiles_);
      host_tiles_ = nullptr;
    }
    void* pinned = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMallocHost(
        &pinned, sizeof(int32_t) * static_cast<size_t>(range_max_tiles_ + lim_.num_experts + 1)));
    host_tiles_ = static_cast<int32_t*>(pinned);
    // [TAG_MOE_WGMMA] its token tiles: at most one per 16-row tile.
    if (host_wg_tiles_ != nullptr) {
      cudaFreeHost(host_wg_tiles_);
      host_wg_tiles_ = nullptr;
    }
    CUDA_RETURN_IF_ERROR(
        cudaMallocHost(&pinned, sizeof(MoeWgmmaTile) * static_cast<size_t>(range_max_tiles_)));
    host_wg_tiles_ = static_cast<MoeWgmmaTile*>(pinned);
    // [TAG_MOE_WGMMA_DEVICE_PLAN] ... or the device plan's bound, whichever is larger.
    const int64_t wg_cap = std::max<int64_t>(
        range_max_tiles_,
        moeWgmmaMaxTiles(range_max_tiles_ * kLtBlockM, std::min<int64_t>(assignments, lim_.num_experts)));
    ASSIGN_OR_RETURN(wg_tiles_, b_.allocate(sizeof(MoeWgmmaTile) * static_cast<size_t>(wg_cap)));
    ASSIGN_OR_RETURN(wg_count_, b_.allocate(sizeof(int32_t)));
    if (lt_gemm_ == nullptr) {
      ASSIGN_OR_RETURN(lt_gemm_, MoeLtGemm::create());
    }
    RETURN_IF_ERROR(lt_gemm_->reserveStreams(moeLtStreams()));
    host_off_.assign(static_cast<size_t>(lim_.num_experts + 1), 0);
    ranges_ready_ = true;
    return okStatus();
  }

  // Workspaces of the FP8 path, sized for reserve()'s limits at block_m kLtBlockM; once.
  Status ensureFp8Workspace() {
    if (fp8_ready_) return okStatus();
    RETURN_IF_ERROR(ensureRangeWorkspace());
    const int64_t rows = range_max_tiles_ * kLtBlockM;
    const int64_t h = lim_.hidden, in = lim_.intermediate;
    ASSIGN_OR_RETURN(fp8_x_, b_.allocate(static_cast<size_t>(rows * fp8PaddedK(h))));
    ASSIGN_OR_RETURN(fp8_xs_, b_.allocate(sizeof(float) * static_cast<size_t>(rows * fp8KBlocks(h))));
    ASSIGN_OR_RETURN(fp8_a_, b_.allocate(static_cast<size_t>(rows * fp8PaddedK(in))));
    ASSIGN_OR_RETURN(fp8_as_, b_.allocate(sizeof(float) * static_cast<size_t>(rows * fp8KBlocks(in))));
    ASSIGN_OR_RETURN(fp8_h_, b_.allocate(sizeof(bf16) * static_cast<size_t>(rows * 2 * in)));
    fp8_ready_ = true;
    return okStatus();
  }

  // [TAG_MOE_LT_BF16] Workspaces of the bf16 cuBLASLt path: the gathered rows, the gate_up output
  // and the SwiGLU output at block_m kLtBlockM (once per reserve()), and the dequantized weight
  // scratch, grown to `weight_elems` (one projection's E x N x K; the projections take turns),
  // or with `second` the down projection's own scratch, its stream and events
  // [TAG_MOE_LT_OVERLAP].
  Status ensureLtBf16Workspace(int64_t weight_elems, bool second) {
    if (second) {
      if (dq_stream_ == nullptr) {
        CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&dq_stream_, cudaStreamNonBlocking));
        CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&dq_start_, cudaEventDisableTiming));
        CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&dq_done_, cudaEventDisableTiming));
      }
      if (weight_elems > lt_w2_elems_) {
        lt_w2_ = Buffer();
        ASSIGN_OR_RETURN(lt_w2_, b_.allocate(sizeof(bf16) * static_cast<size_t>(weight_elems)));
        lt_w2_elems_ = weight_elems;
      }
      weight_elems = 0;  // the shared workspaces below still exist once
    }
    if (!lt_ready_) {
      RETURN_IF_ERROR(ensureRangeWorkspace());
      const int64_t rows = range_max_tiles_ * kLtBlockM;
      const int64_t h = lim_.hidden, in = lim_.intermediate;
      ASSIGN_OR_RETURN(lt_x_, b_.allocate(sizeof(bf16) * static_cast<size_t>(rows * h)));
      ASSIGN_OR_RETURN(lt_h_, b_.allocate(sizeof(bf16) * static_cast<size_t>(rows * 2 * in)));
      ASSIGN_OR_RETURN(lt_a_, b_.allocate(sizeof(bf16) * static_cast<size_t>(rows * in)));
      lt_ready_ = true;
    }
    if (weight_elems > lt_w_elems_) {
      lt_w_ = Buffer();  // the old scratch first: both would not always fit
      ASSIGN_OR_RETURN(lt_w_, b_.allocate(sizeof(bf16) * static_cast<size_t>(weight_elems)));
      lt_w_elems_ = weight_elems;
    }
    return okStatus();
  }

  // align (block_m 16) -> expert ranges to the host -> X quantized -> per-expert gate_up GEMMs ->
  // bias + SwiGLU + quantized -> per-expert down GEMMs -> down bias -> weighted combine.
  // The tokens' (expert, row) assignment in tiles of block_m rows (row_token_, row_of_,
  // tile_expert_, num_tiles_), shared by the MXFP4/bf16 and the FP8 expert paths.
  // Skipped when the route already aligned these ids with this tile [TAG_ROUTE_ALIGN].
  void alignExperts(const Tensor& topk_ids, int64_t t, const MoeExpertsParams& p, int32_t bm,
                    int64_t tiles, cudaStream_t st) {
    const PreAligned pa = pre_aligned_;
    pre_aligned_.valid = false;  // one MoE call per route
    if (pa.valid && pa.ids == topk_ids.as<int32_t>() && pa.tokens == t && pa.top_k == p.top_k &&
        pa.experts == p.num_experts && pa.block_m == bm && pa.tiles == tiles) {
      g_llm_route_align_uses.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    checkOk(launchMoeAlign(alignArgs(topk_ids.as<int32_t>(), t, p.top_k, p.num_experts, bm, tiles),
                           st),
            "moeExperts/align");
  }
  MoeAlignArgs alignArgs(const int32_t* ids, int64_t t, int32_t top_k, int32_t experts, int32_t bm,
                         int64_t tiles) {
    MoeAlignArgs al;
    al.pdl = b_.pdlGraph();  // [TAG_PDL_GRAPH]
    al.topk_ids = ids;
    al.row_token = static_cast<int32_t*>(row_token_.data());
    al.row_of = static_cast<int32_t*>(row_of_.data());
    al.tile_expert = static_cast<int32_t*>(tile_expert_.data());
    al.num_tiles = static_cast<int32_t*>(num_tiles_.data());
    al.num_tokens = t;
    al.top_k = top_k;
    al.num_experts = experts;
    al.block_m = bm;
    al.max_tiles = static_cast<int32_t>(tiles);
    al.block_counts = static_cast<int32_t*>(align_counts_.data());  // [TAG_MOE_ALIGN_MULTIBLOCK]
    return al;
  }

  // The expert-sorted matrix of a cuBLASLt path's step: its rows (host), and on the device each
  // row's source token (-1: padding), each tile's expert and the experts' row offsets (int32).
  struct ExpertRanges {
    int64_t rows = 0;
    const int32_t* row_token = nullptr;
    const int32_t* tile_expert = nullptr;
    const int32_t* off = nullptr;
  };

  // Aligns the step's assignments at block_m kLtBlockM and brings the expert ranges to the host
  // (host_off_; one device-to-host copy and a wait per layer) and back to the device as int32
  // (range_off_).
  ExpertRanges hostExpertRanges(const Tensor& topk_ids, int64_t t, const MoeExpertsParams& p,
                                cudaStream_t st) {
    require(ranges_ready_, "moeExperts", "expert range workspace missing");
    const int64_t tiles = moeAlignMaxTiles(t * p.top_k, p.num_experts, kLtBlockM);
    require(tiles <= range_max_tiles_, "moeExperts", "cuBLASLt MoE step larger than reserve() allowed");
    alignExperts(topk_ids, t, p, kLtBlockM, tiles, st);
    CUDA_CHECK(cudaMemcpyAsync(host_tiles_, tile_expert_.data(),
                               sizeof(int32_t) * static_cast<size_t>(tiles), cudaMemcpyDeviceToHost,
                               st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    require(moeExpertOffsetsFromTiles(host_tiles_, tiles, kLtBlockM, p.num_experts, host_off_.data()),
            "moeExperts", "align produced an unsorted tile list");
    int32_t* off32 = host_tiles_ + range_max_tiles_;  // pinned; rewritten only after the next wait
    for (int32_t e = 0; e <= p.num_experts; ++e) off32[e] = static_cast<int32_t>(host_off_[static_cast<size_t>(e)]);
    CUDA_CHECK(cudaMemcpyAsync(range_off_.data(), off32,
                               sizeof(int32_t) * static_cast<size_t>(p.num_experts + 1),
                               cudaMemcpyHostToDevice, st));
    return ExpertRanges{host_off_[static_cast<size_t>(p.num_experts)],
                        static_cast<const int32_t*>(row_token_.data()),
                        static_cast<const int32_t*>(tile_expert_.data()),
                        static_cast<const int32_t*>(range_off_.data())};
  }

  void moeExpertsFp8(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                     const ExpertWeights& w1, const Tensor& b1, const ExpertWeights& w2,
                     const Tensor& b2, const Tensor& out, const MoeExpertsParams& p) {
    require(fp8_ready_, "moeExperts", "FP8 workspace missing");
    require(p.hidden % 8 == 0 && p.intermediate % 4 == 0, "moeExperts",
            "FP8 experts need hidden % 8 == 0 and intermediate % 4 == 0");
    cudaStream_t st = b_.stream();
    const int64_t t = x.rows();
    const ExpertRanges r = hostExpertRanges(topk_ids, t, p, st);

    Fp8ActQuantArgs q1;
    q1.in = x.as<bf16>();
    q1.row_token = r.row_token;
    q1.tile_expert = r.tile_expert;
    q1.expert_off = r.off;
    q1.q = static_cast<uint8_t*>(fp8_x_.data());
    q1.scales = static_cast<float*>(fp8_xs_.data());
    q1.rows = r.rows;
    q1.k = p.hidden;
    q1.block_m = kLtBlockM;
    q1.num_experts = p.num_experts;
    checkOk(launchFp8ActQuant(q1, st), "moeExperts/quant_x");

    MoeLtGemmArgs g1;
    g1.w = static_cast<const uint8_t*>(w1.fp8.data);
    g1.w_scales = static_cast<const float*>(w1.fp8_scales.data);
    g1.x = q1.q;
    g1.x_scales = q1.scales;
    g1.y = static_cast<bf16*>(fp8_h_.data());
    g1.expert_off = host_off_.data();
    g1.num_experts = p.num_experts;
    g1.n = 2 * p.intermediate;
    g1.k = p.hidden;
    checkOk(lt_gemm_->run(g1, st), "moeExperts/gate_up_fp8");

    Fp8ActQuantArgs q2 = q1;
    q2.in = g1.y;
    q2.bias = b1.empty() ? nullptr : b1.as<bf16>();
    q2.q = static_cast<uint8_t*>(fp8_a_.data());
    q2.scales = static_cast<float*>(fp8_as_.data());
    q2.k = p.intermediate;
    q2.swiglu = true;
    q2.swiglu_limit = p.swiglu_limit;
    q2.swiglu_alpha = p.swiglu_alpha;
    checkOk(launchFp8ActQuant(q2, st), "moeExperts/swiglu_quant");

    MoeLtGemmArgs g2 = g1;
    g2.w = static_cast<const uint8_t*>(w2.fp8.data);
    g2.w_scales = static_cast<const float*>(w2.fp8_scales.data);
    g2.x = q2.q;
    g2.x_scales = q2.scales;
    g2.y = static_cast<bf16*>(y_.data());
    g2.n = p.hidden;
    g2.k = p.intermediate;
    checkOk(lt_gemm_->run(g2, st), "moeExperts/down_fp8");
    downBiasAndCombine(b2, r, t, topk_weights, out, p, st, /*f16=*/false);
    countMoeFp8Step();
  }

  // The cuBLASLt paths' end: the down bias over the expert-sorted rows of y_ (their GEMMs run
  // without an epilogue), then the weighted combine (or its deferral into the next norm). f16: y_
  // holds fp16 rows (the wgmma path's, which brings no row bias) [TAG_ATTN_F16].
  void downBiasAndCombine(const Tensor& b2, const ExpertRanges& r, int64_t t,
                          const Tensor& topk_weights, const Tensor& out,
                          const MoeExpertsParams& p, cudaStream_t st, bool f16) {
    // [TAG_MOE_F16_OUT_SCALE] fp16 rows come from the wgmma kernel, bias added and scaled there;
    // an unscaled bias added here would not match them.
    require(!f16 || b2.empty(), "moeExperts", "fp16 expert rows take their bias in the GEMM");
    MoeRowBiasArgs rb;
    rb.y = static_cast<bf16*>(y_.data());
    rb.bias = b2.empty() ? nullptr : b2.as<bf16>();
    rb.row_token = r.row_token;
    rb.tile_expert = r.tile_expert;
    rb.rows = r.rows;
    rb.n = p.hidden;
    rb.block_m = kLtBlockM;
    rb.num_experts = p.num_experts;
    checkOk(launchMoeRowBias(rb, st), "moeExperts/down_bias");

    MoeCombineArgs c;
    c.pdl = b_.pdlGraph();  // [TAG_PDL_GRAPH]
    c.f16 = f16;
    c.out_f32 = out.dtype == DType::kF32;
    c.y_scale = f16 ? kMoeF16OutUnscale : 1.f;  // [TAG_MOE_F16_OUT_SCALE]
    c.y = rb.y;
    c.row_of = static_cast<const int32_t*>(row_of_.data());
    c.weights = topk_weights.as<float>();
    c.out = static_cast<bf16*>(out.data);
    c.num_tokens = t;
    c.top_k = p.top_k;
    c.hidden = p.hidden;
    combineOrDefer(c, p, st);
  }

  // [TAG_MOE_LT_BF16] align (block_m 16) -> expert ranges to the host -> rows gathered (bf16) ->
  // gate_up experts dequantized -> per-expert bf16 cuBLASLt GEMMs -> bias + SwiGLU -> down experts
  // dequantized (into the same scratch) -> per-expert GEMMs -> down bias -> weighted combine.
  void moeExpertsLtBf16(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                        const ExpertWeights& w1, const Tensor& b1, const ExpertWeights& w2,
                        const Tensor& b2, const Tensor& out, const MoeExpertsParams& p) {
    require(lt_ready_, "moeExperts", "bf16 cuBLASLt workspace missing");
    require(p.hidden % 8 == 0 && p.intermediate % 8 == 0, "moeExperts",
            "bf16 cuBLASLt experts need hidden and intermediate multiples of 8");
    cudaStream_t st = b_.stream();
    const int64_t t = x.rows();
    const bool f16 = x.dtype == DType::kF16;  // [TAG_ATTN_F16] useLtBf16: with wgmma only
    require(!f16 || useWgmma(w1, w2), "moeExperts",
            "fp16 experts take the wgmma kernel only (no bf16 cuBLASLt path)");
    if (useWgmma(w1, w2) && moeWgmmaDevicePlan()) {  // [TAG_MOE_WGMMA_DEVICE_PLAN]
      moeExpertsWgmmaDevicePlan(x, topk_ids, topk_weights, w1, b1, w2, b2, out, p);
      return;
    }
    const ExpertRanges r = hostExpertRanges(topk_ids, t, p, st);
    checkOk(launchGatherRows(x.data, t, r.row_token, r.rows,
                             static_cast<int64_t>(sizeof(bf16)) * p.hidden, lt_x_.data(), st),
            "moeExperts/gather_bf16");
    if (useWgmma(w1, w2)) {
      moeExpertsWgmma(r, t, topk_weights, w1, b1, w2, b2, out, p, f16);
      return;
    }
    bf16* wq = static_cast<bf16*>(lt_w_.data());
    const int streams = moeLtStreams();
    const bool epi = moeLtBiasEpilogue();
    // [TAG_MOE_LT_OVERLAP] the down experts into their own scratch on dq_stream_, started after
    // the gate_up dequantization (both are bandwidth-bound; the gate_up matmuls are not).
    const bool overlap = w2.bf16_copy.empty() && overlapDequant() &&
                         w2.experts * w2.rows * w2.cols <= lt_w2_elems_;
    auto dequant = [&](const ExpertWeights& w, bf16* to, cudaStream_t on, const char* what) {
      Mxfp4DequantArgs d;
      d.codes = static_cast<const uint8_t*>(w.codes.data);
      d.scales = static_cast<const uint8_t*>(w.scales.data);
      d.expert_off = r.off;
      d.out = to;
      d.experts = static_cast<int32_t>(w.experts);
      d.n = static_cast<int32_t>(w.rows);
      d.k = static_cast<int32_t>(w.cols);
      d.max_scale = w.mx_max_scale;
      checkOk(launchMxfp4Dequant(d, on), what);
    };
    // [TAG_MOE_BF16_COPY] a projection with a bf16 copy is read as it is.
    const bf16* wq1 = w1.bf16_copy.empty() ? wq : w1.bf16_copy.as<bf16>();
    if (w1.bf16_copy.empty()) dequant(w1, wq, st, "moeExperts/dequant_gate_up");
    const bf16* wq2 = w2.bf16_copy.empty() ? wq : w2.bf16_copy.as<bf16>();
    if (overlap) {
      // The scratch's last readers (the previous call's down matmuls) joined `st` before this
      // call began, and the expert offsets it reads were copied on `st` above.
      bf16* to = static_cast<bf16*>(lt_w2_.data());
      wq2 = to;
      CUDA_CHECK(cudaEventRecord(dq_start_, st));
      CUDA_CHECK(cudaStreamWaitEvent(dq_stream_, dq_start_, 0));
      dequant(w2, to, dq_stream_, "moeExperts/dequant_down");
      CUDA_CHECK(cudaEventRecord(dq_done_, dq_stream_));
    }
    MoeLtGemmArgs g1;
    g1.type = MoeLtType::kBf16;
    g1.w = wq1;
    g1.x = lt_x_.data();
    g1.y = static_cast<bf16*>(lt_h_.data());
    g1.expert_off = host_off_.data();
    g1.num_experts = p.num_experts;
    g1.n = 2 * p.intermediate;
    g1.k = p.hidden;
    g1.bias = epi && !b1.empty() ? b1.as<bf16>() : nullptr;  // [TAG_MOE_LT_EPILOGUE]
    checkOk(lt_gemm_->run(g1, st, streams), "moeExperts/gate_up_bf16");

    MoeBiasSwigluArgs sw;
    sw.h = g1.y;
    sw.bias = b1.empty() || g1.bias != nullptr ? nullptr : b1.as<bf16>();
    sw.row_token = r.row_token;
    sw.tile_expert = r.tile_expert;
    sw.out = static_cast<bf16*>(lt_a_.data());
    sw.rows = r.rows;
    sw.inter = p.intermediate;
    sw.block_m = kLtBlockM;
    sw.num_experts = p.num_experts;
    sw.limit = p.swiglu_limit;
    sw.alpha = p.swiglu_alpha;
    checkOk(launchMoeBiasSwiglu(sw, st), "moeExperts/bias_swiglu");

    if (overlap) {
      CUDA_CHECK(cudaStreamWaitEvent(st, dq_done_, 0));
    } else if (w2.bf16_copy.empty()) {
      // The down experts overwrite the scratch after the gate_up GEMMs (same stream).
      dequant(w2, wq, st, "moeExperts/dequant_down");
    }
    MoeLtGemmArgs g2 = g1;
    g2.w = wq2;
    g2.x = sw.out;
    g2.y = static_cast<bf16*>(y_.data());
    g2.n = p.hidden;
    g2.k = p.intermediate;
    g2.bias = epi && !b2.empty() ? b2.as<bf16>() : nullptr;
    checkOk(lt_gemm_->run(g2, st, streams), "moeExperts/down_bf16");
    downBiasAndCombine(g2.bias != nullptr ? Tensor() : b2, r, t, topk_weights, out, p, st,
                       /*f16=*/false);
    countMoeLtBf16Step();
  }

  // [TAG_MOE_WGMMA_DEVICE_PLAN] The wgmma path without the host: align, gather over the align's
  // row bound (rows past the real ones copy stale or no rows that no tile reads), the tiles
  // planned on the device, both launches sized by the plan's bound (items past the count leave),
  // then the combine. Nothing waits for the device, so the host runs ahead through the layers.
  void moeExpertsWgmmaDevicePlan(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                                 const ExpertWeights& w1, const Tensor& b1, const ExpertWeights& w2,
                                 const Tensor& b2, const Tensor& out, const MoeExpertsParams& p) {
    require(ranges_ready_, "moeExperts", "expert range workspace missing");
    cudaStream_t st = b_.stream();
    const int64_t t = x.rows();
    const int64_t align_tiles = moeAlignMaxTiles(t * p.top_k, p.num_experts, kLtBlockM);
    require(align_tiles <= range_max_tiles_, "moeExperts", "MoE step larger than reserve() allowed");
    alignExperts(topk_ids, t, p, kLtBlockM, align_tiles, st);
    const int64_t max_rows = align_tiles * kLtBlockM;
    const int64_t cap = moeWgmmaMaxTiles(max_rows, std::min<int64_t>(t * p.top_k, p.num_experts));
    checkOk(launchGatherRows(x.data, t, static_cast<const int32_t*>(row_token_.data()), max_rows,
                             static_cast<int64_t>(sizeof(bf16)) * p.hidden, lt_x_.data(), st),
            "moeExperts/gather_bf16");
    MoeWgmmaDevicePlanArgs pl;
    pl.tile_expert = static_cast<const int32_t*>(tile_expert_.data());
    pl.num_align_tiles = static_cast<const int32_t*>(num_tiles_.data());
    pl.max_align_tiles = static_cast<int32_t>(align_tiles);
    pl.block_m = kLtBlockM;
    pl.experts = p.num_experts;
    pl.tiles = static_cast<MoeWgmmaTile*>(wg_tiles_.data());
    pl.num_tiles = static_cast<int32_t*>(wg_count_.data());
    pl.cap = static_cast<int32_t>(cap);
    checkOk(launchMoeWgmmaDevicePlan(pl, st), "moeExperts/wgmma_plan");
    const ExpertRanges r{max_rows, static_cast<const int32_t*>(row_token_.data()),
                         static_cast<const int32_t*>(tile_expert_.data()), nullptr};
    const bool f16 = x.dtype == DType::kF16;  // [TAG_ATTN_F16]
    wgmmaProjections(r, cap, static_cast<const int32_t*>(wg_count_.data()), w1, b1, w2, b2, p, st,
                     f16);
    downBiasAndCombine(Tensor(), r, t, topk_weights, out, p, st, f16);
    countMoeLtBf16Step();
    countMoeWgmmaStep();
  }

  // [TAG_MOE_WGMMA] over the rows moeExpertsLtBf16 gathered into lt_x_: one wgmma launch per
  // projection over the resident MXFP4 experts (gate_up with bias and SwiGLU in its epilogue,
  // down with bias), then the combine.
  void moeExpertsWgmma(const ExpertRanges& r, int64_t t, const Tensor& topk_weights,
                       const ExpertWeights& w1, const Tensor& b1, const ExpertWeights& w2,
                       const Tensor& b2, const Tensor& out, const MoeExpertsParams& p, bool f16) {
    cudaStream_t st = b_.stream();
    const int64_t tiles = moeWgmmaPlanTiles(host_off_.data(), p.num_experts, host_wg_tiles_, range_max_tiles_);
    require(tiles >= 0, "moeExperts", "wgmma token tiles exceed the workspace");
    // Pinned and rewritten only after the next layer's range wait, which follows this copy.
    CUDA_CHECK(cudaMemcpyAsync(wg_tiles_.data(), host_wg_tiles_, sizeof(MoeWgmmaTile) * static_cast<size_t>(tiles),
                               cudaMemcpyHostToDevice, st));
    wgmmaProjections(r, tiles, nullptr, w1, b1, w2, b2, p, st, f16);
    downBiasAndCombine(Tensor(), r, t, topk_weights, out, p, st, f16);
    countMoeLtBf16Step();
    countMoeWgmmaStep();
  }

  // The two wgmma launches over wg_tiles_ (tiles of them, or a bound with the count on the device
  // when tiles_dev is set): gate_up (+bias, SwiGLU) into lt_a_, down (+bias) into y_. f16: the
  // gathered rows, biases and outputs are fp16 [TAG_ATTN_F16].
  void wgmmaProjections(const ExpertRanges& r, int64_t tiles, const int32_t* tiles_dev,
                        const ExpertWeights& w1, const Tensor& b1, const ExpertWeights& w2,
                        const Tensor& b2, const MoeExpertsParams& p, cudaStream_t st, bool f16) {
    MoeWgmmaArgs g1;
    g1.smem_a = moeWgmmaSmemA();  // [TAG_MOE_WGMMA_SMEM_A]
    g1.f16 = f16;
    g1.x = static_cast<const bf16*>(lt_x_.data());
    g1.x_rows = r.rows;
    g1.codes = static_cast<const uint8_t*>(w1.codes.data);
    g1.scales = static_cast<const uint8_t*>(w1.scales.data);
    g1.bias = b1.empty() ? nullptr : static_cast<const bf16*>(b1.data);
    g1.tiles = static_cast<const MoeWgmmaTile*>(wg_tiles_.data());
    g1.num_tiles = static_cast<int32_t>(tiles);
    g1.num_tiles_dev = tiles_dev;
    g1.row_token = r.row_token;
    g1.out = static_cast<bf16*>(lt_a_.data());
    g1.experts = p.num_experts;
    g1.n = 2 * p.intermediate;
    g1.k = p.hidden;
    g1.swiglu = true;
    g1.limit = p.swiglu_limit;
    g1.alpha = p.swiglu_alpha;
    g1.max_scale = w1.mx_max_scale;
    checkOk(launchMoeWgmma(g1, st), "moeExperts/gate_up_wgmma");
    MoeWgmmaArgs g2 = g1;
    g2.x = g1.out;
    g2.codes = static_cast<const uint8_t*>(w2.codes.data);
    g2.scales = static_cast<const uint8_t*>(w2.scales.data);
    g2.bias = b2.empty() ? nullptr : static_cast<const bf16*>(b2.data);
    g2.row_token = nullptr;
    g2.out = static_cast<bf16*>(y_.data());
    g2.n = p.hidden;
    g2.k = p.intermediate;
    g2.swiglu = false;
    g2.out_scale = f16 ? kMoeF16OutScale : 1.f;  // [TAG_MOE_F16_OUT_SCALE]
    g2.max_scale = w2.mx_max_scale;
    checkOk(launchMoeWgmma(g2, st), "moeExperts/down_wgmma");
  }

  void gatherRows(const Tensor& in, const Tensor& rows, const Tensor& out) override {
    require(is(rows, DType::kI32) && in.dtype == out.dtype && in.cols() == out.cols() &&
                out.rows() == rows.numel(),
            "gatherRows", "shape/dtype mismatch");
    checkOk(launchGatherRows(in.data, in.rows(), rows.as<int32_t>(), rows.numel(),
                             in.cols() * static_cast<int64_t>(dtypeSize(in.dtype)), out.data,
                             b_.stream()),
            "gatherRows");
  }

  void copyTokens(const Tensor& src, const Tensor& pairs, const Tensor& ids) override {
    require(is(src, DType::kI32) && is(pairs, DType::kI32) && is(ids, DType::kI32) &&
                pairs.numel() % 2 == 0,
            "copyTokens", "I32 views, pairs [P, 2]");
    checkOk(launchCopyTokens(src.as<int32_t>(), src.numel(), pairs.as<int32_t>(),
                             pairs.numel() / 2, ids.as<int32_t>(), ids.numel(), b_.stream()),
            "copyTokens");
  }

  // Plain rows: stageSample + sampleStaged (what graph decode captures). With a state slot or
  // logprobs (eager steps only, sample_state.cuh): apply the slots' bias and penalties to the
  // logits in place, draw, restore the raw logits and count the drawn tokens, then logprobs.
  void sample(const Tensor& logits, std::span<const SampleRow> rows, const Tensor& out_ids,
              const Tensor& out_logprobs) override {
    if (rows.empty()) return;
    bool any_slot = false, any_lp = false;
    for (const SampleRow& r : rows) {
      any_slot = any_slot || r.params.state_slot >= 0;
      any_lp = any_lp || r.params.logprobs >= 0;
    }
    require(out_logprobs.empty()
                ? !any_lp
                : out_logprobs.bytes() >= rows.size() * sizeof(llm::LlmTokenLogprobs),
            "sample", "out_logprobs must hold one record per row (needed when a row asks)");
    stageSample(rows);
    SamplerStateArgs sa;
    if (any_slot || !out_logprobs.empty()) {
      require(is(logits, DType::kF32), "sample", "logits F32 [R, V]");
      host_state_rows_.resize(rows.size());
      std::vector<bool> row_used(static_cast<size_t>(logits.rows()), false);
      std::vector<bool> slot_used(static_cast<size_t>(lim_.max_seqs), false);
      for (size_t i = 0; i < rows.size(); ++i) {
        const SampleRow& r = rows[i];
        const SamplingParams& p = r.params;
        require(r.row >= 0 && r.row < logits.rows(), "sample", "row outside logits");
        require(p.logprobs <= llm::kMaxTopLogprobs, "sample", "logprobs above kMaxTopLogprobs");
        StateRowDev& d = host_state_rows_[i];
        d.row = r.row;
        d.slot = p.state_slot;
        d.repetition_penalty = p.repetition_penalty;
        d.frequency_penalty = p.frequency_penalty;
        d.presence_penalty = p.presence_penalty;
        d.logprobs = p.logprobs;
        if (p.state_slot >= 0) {
          require(p.state_slot < lim_.max_seqs, "sample", "state_slot outside [0, max_seqs)");
          require(!slot_used[static_cast<size_t>(p.state_slot)] &&
                      !row_used[static_cast<size_t>(r.row)],
                  "sample", "rows with a state slot need distinct slots and logits rows");
          slot_used[static_cast<size_t>(p.state_slot)] = true;
          row_used[static_cast<size_t>(r.row)] = true;
        }
      }
      const size_t bytes = rows.size() * sizeof(StateRowDev);
      b_.copyToDevice(bytesOf(state_rows_, bytes), host_state_rows_.data(), bytes);
      sa.logits = logits.as<float>();
      sa.rows = static_cast<const StateRowDev*>(state_rows_.data());
      sa.num_rows = static_cast<int32_t>(rows.size());
      sa.vocab = logits.cols();
      sa.entries = static_cast<SamplerEntryDev*>(state_entries_.data());
      sa.sizes = static_cast<int32_t*>(state_sizes_.data());
      sa.capacity = state_capacity_;
      sa.sampled = out_ids.as<int32_t>();
      if (!out_logprobs.empty()) sa.logprobs = static_cast<llm::LlmTokenLogprobs*>(out_logprobs.data);
    }
    if (any_slot) checkOk(launchApplySamplerState(sa, b_.stream()), "sample (sampler state)");
    sampleStaged(logits, static_cast<int32_t>(rows.size()), out_ids);
    if (any_slot) checkOk(launchRestoreAndCount(sa, b_.stream()), "sample (sampler state)");
    if (!out_logprobs.empty()) checkOk(launchLogprobs(sa, b_.stream()), "sample (logprobs)");
  }

  // Implemented (slots, bias, penalties, min_p, logprobs: sample() above), but announced only
  // once tests/gpu/llm_ops_test.cc GpuLlmOps.SamplerState* has passed on a GPU; until then rose
  // refuses such steps and tulip such requests ([TAG_LLM_SAMPLER_STATE], ModelFacts.llm_caps).
  bool supportsSamplerState() const override { return kSamplerStateVerified; }
  // Token masks (stageSample() uploads them, the sample kernels honour them): announced once
  // tests/gpu/llm_ops_test.cc GpuLlmOps.*Masked* has passed on a GPU [TAG_TOKEN_MASK].
  bool supportsTokenMask() const override { return kTokenMaskVerified; }
  // Late masks: the model samples after the decode graph, outside it. Announced once
  // tests/gpu/llm_model_test.cc GpuLlmModel.LateMasks* has passed on a GPU [TAG_LATE_MASKS].
  bool supportsLateMask() const override { return kLateMaskVerified; }

  // Builds each slot's entries on the host (deduplicated: prompt membership, generated counts,
  // the last bias per id) and uploads them in stream order.
  void resetSamplerState(std::span<const SamplerStateReset> resets) override {
    require(reserved_, "resetSamplerState", "reserve() was not called");
    for (const SamplerStateReset& r : resets) {
      require(r.slot >= 0 && r.slot < lim_.max_seqs, "resetSamplerState",
              "slot outside [0, max_seqs)");
      host_entries_.clear();
      entry_of_.clear();
      auto entry = [&](int32_t id) -> SamplerEntryDev& {
        auto [it, fresh] = entry_of_.emplace(id, host_entries_.size());
        if (fresh) host_entries_.push_back(SamplerEntryDev{id, 0u, 0.f, 0.f});
        return host_entries_[it->second];
      };
      for (int32_t t : r.prompt) entry(t).count |= kSamplerPromptBit;
      for (int32_t t : r.output) ++entry(t).count;
      for (const LogitBias& b : r.bias) entry(b.id).bias = b.bias;
      require(static_cast<int64_t>(host_entries_.size()) <= state_capacity_, "resetSamplerState",
              "more distinct tokens than a slot holds (max_model_len + kMaxLogitBias)");
      const size_t off = static_cast<size_t>(r.slot) * static_cast<size_t>(state_capacity_) *
                         sizeof(SamplerEntryDev);
      const size_t bytes = host_entries_.size() * sizeof(SamplerEntryDev);
      if (bytes > 0) {
        b_.copyToDevice(bytesAt(state_entries_, off, bytes), host_entries_.data(), bytes);
      }
      const int32_t n = static_cast<int32_t>(host_entries_.size());
      b_.copyToDevice(bytesAt(state_sizes_, static_cast<size_t>(r.slot) * sizeof(int32_t),
                              sizeof(int32_t)),
                      &n, sizeof(int32_t));
    }
  }

  void stageSample(std::span<const SampleRow> rows) override {
    require(reserved_, "sample", "reserve() was not called");
    require(static_cast<int64_t>(rows.size()) <= lim_.max_logits_rows, "sample",
            "more rows than reserve() allowed");
    host_rows_.resize(rows.size());
    int32_t num_masks = 0;
    const size_t mask_bytes = sizeof(uint32_t) * static_cast<size_t>(mask_words_);
    const uint32_t* run_src = nullptr;
    int64_t run_first = 0, run_len = 0;
    auto flush = [&] {
      if (run_len == 0) return;
      b_.copyToDevice(bytesAt(sample_masks_, static_cast<size_t>(run_first) * mask_bytes,
                              static_cast<size_t>(run_len) * mask_bytes),
                      run_src, static_cast<size_t>(run_len) * mask_bytes);
      run_len = 0;
    };
    for (size_t i = 0; i < rows.size(); ++i) {
      SampleRowDev& d = host_rows_[i];
      d.row = rows[i].row;
      d.temperature = rows[i].params.temperature;
      d.top_p = rows[i].params.top_p;
      d.top_k = rows[i].params.top_k;
      d.seed = rows[i].params.seed;
      d.counter = rows[i].counter;
      d.min_p = rows[i].params.min_p;
      d.mask = -1;
      if (rows[i].mask != nullptr) {  // [TAG_TOKEN_MASK]
        d.mask = num_masks++;
        // Masks that lie back to back on the host (the runner's staging does) go in one copy.
        if (run_src != nullptr && rows[i].mask == run_src + run_len * mask_words_) {
          ++run_len;
        } else {
          flush();
          run_src = rows[i].mask;
          run_first = d.mask;
          run_len = 1;
        }
      }
    }
    flush();
    staged_masks_ = num_masks > 0;
    staged_rows_ = static_cast<int32_t>(rows.size());
    if (rows.empty()) return;
    const size_t bytes = host_rows_.size() * sizeof(SampleRowDev);
    b_.copyToDevice(Tensor(sample_rows_.data(), DType::kU8, {static_cast<int64_t>(bytes)}),
                    host_rows_.data(), bytes);
  }

  void sampleStaged(const Tensor& logits, int32_t num_rows, const Tensor& out_ids) override {
    require(is(logits, DType::kF32) && is(out_ids, DType::kI32) && out_ids.numel() >= num_rows,
            "sample", "logits F32 [R, V], out I32");
    require(num_rows <= staged_rows_, "sample", "more rows than stageSample() staged");
    require(!staged_masks_ || logits.cols() <= mask_words_ * 32, "sample",
            "token mask narrower than the vocabulary");
    for (int32_t i = 0; i < num_rows; ++i) {
      require(host_rows_[static_cast<size_t>(i)].row >= 0 &&
                  host_rows_[static_cast<size_t>(i)].row < logits.rows(),
              "sample", "row outside logits");
    }
    if (num_rows == 0) return;
    SampleArgs a;
    a.logits = logits.as<float>();
    a.rows = static_cast<const SampleRowDev*>(sample_rows_.data());
    a.out = out_ids.as<int32_t>();
    a.partial = sample_ws_.data();
    a.num_rows = num_rows;
    a.vocab = logits.cols();
    a.masks = static_cast<const uint32_t*>(sample_masks_.data());
    a.mask_words = mask_words_;
    checkOk(launchSample(a, b_.stream()), "sample");
  }

 private:
  // ropeKvWrite / ropeKvWriteF32In: qkv_in null for the in-place form.
  void ropeKv(const Tensor* qkv_in, const Tensor& qkv, const Tensor& positions, const Tensor& cos,
              const Tensor& sin, const Tensor& slot_mapping, const Tensor& k_cache,
              const Tensor& v_cache, const RopeKvParams& p) {
    // [TAG_ATTN_F16] qkv and caches all BF16 or all F16.
    const bool f16 = is(qkv, DType::kF16);
    const DType t16 = f16 ? DType::kF16 : DType::kBF16;
    require(is(qkv, t16) && is(k_cache, t16) && is(v_cache, t16) && is(slot_mapping, DType::kI32),
            "ropeKvWrite", "qkv and caches must be BF16 (or all F16), slots I32");
    const int64_t width = static_cast<int64_t>(p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim;
    require(qkv.cols() == width && slot_mapping.numel() == qkv.rows(), "ropeKvWrite",
            "qkv columns / slot count mismatch");
    require(k_cache.ndim == 4 && k_cache.dim(2) == p.num_kv_heads && k_cache.dim(3) == p.head_dim &&
                v_cache.numel() == k_cache.numel(),
            "ropeKvWrite", "cache shape mismatch");
    RopeKvArgs a;
    a.pdl = b_.pdlGraph();  // [TAG_PDL_GRAPH]
    a.f16 = f16;
    a.qkv = static_cast<bf16*>(qkv.data);
    a.qkv_in = qkv_in == nullptr ? nullptr : qkv_in->as<float>();
    a.slots = slot_mapping.as<int32_t>();
    a.k_cache = static_cast<bf16*>(k_cache.data);
    a.v_cache = static_cast<bf16*>(v_cache.data);
    a.num_tokens = qkv.rows();
    a.num_slots = k_cache.dim(0) * k_cache.dim(1);
    a.num_q_heads = p.num_q_heads;
    a.num_kv_heads = p.num_kv_heads;
    a.head_dim = p.head_dim;
    a.rotary_dim = p.rotary_dim;
    if (p.rotary_dim > 0) {
      require(is(positions, DType::kI32) && positions.numel() == qkv.rows() &&
                  is(cos, DType::kF32) && is(sin, DType::kF32) && cos.cols() == p.rotary_dim / 2,
              "ropeKvWrite", "positions I32 [T], cos/sin F32 [max_pos, rotary_dim/2]");
      a.positions = positions.as<int32_t>();
      a.cos = cos.as<float>();
      a.sin = sin.as<float>();
      a.max_pos = static_cast<int32_t>(cos.rows());
    }
    checkOk(launchRopeKv(a, b_.stream()), "ropeKvWrite");
  }

  static constexpr size_t kMaxWindows = 2;
  struct PlanSlot {
    int32_t window = 0;
    int32_t num_work = 0;
    int32_t num_combine = 0;
    int32_t num_sm90 = 0;       // Hopper items, stored after the num_work mma.sync items
    bool has_single = false;    // some mma.sync item is single-token [TAG_ATTN_DECODE_WARPS]
    PagedAttnWork* work = nullptr;
    PagedAttnCombine* combine = nullptr;
    int32_t* counts = nullptr;  // device {num_work, num_combine}
  };
  static constexpr int32_t kGraphGridCap = 256;  // blocks per kv head a graph launch loops with

  CudaBackend& b_;
  MoeCombineArgs deferred_;      // [TAG_COMBINE_NORM] the combine moeExperts left to the norm
  bool deferred_valid_ = false;
  // [TAG_ROUTE_ALIGN] What the last route aligned in its own kernel (the next alignExperts with
  // the same ids and tile skips its launch).
  struct PreAligned {
    bool valid = false;
    const int32_t* ids = nullptr;
    int64_t tokens = 0, tiles = 0;
    int32_t top_k = 0, experts = 0, block_m = 0;
  };
  PreAligned pre_aligned_;
  LlmOpsLimits lim_;
  bool reserved_ = false;
  int64_t max_work_ = 0, max_combine_ = 0, max_parts_ = 0, max_tiles_ = 0, max_rows_ = 0;
  Buffer work_, combine_, part_o_, part_ml_, counts_;
  Buffer router_part_, router_ss_;  // [TAG_ROUTER_F32]
  // [TAG_MOE_PREFILL_AUTO] An uploaded MXFP4 expert set the wgmma kernel does not run.
  bool mx_beyond_wgmma_ = false;
  Buffer router_counters_;          // [TAG_ROUTER_FUSED_ROUTE]
  Buffer row_token_, row_of_, tile_expert_, num_tiles_, align_counts_, act_, y_, sample_rows_, sample_ws_;
  Buffer sample_masks_;
  int64_t mask_words_ = 0;
  std::vector<PlanSlot> plans_;
  // The cuBLASLt expert paths: the expert ranges (device range_off_; host_off_ and the pinned
  // tile copy on the host) at block_m kLtBlockM, and the cuBLASLt runner both paths share.
  static constexpr int32_t kLtBlockM = 16;
  bool ranges_ready_ = false;
  int64_t range_max_tiles_ = 0;
  Buffer range_off_;
  int32_t* host_tiles_ = nullptr;  // pinned: [range_max_tiles_] tiles + [E + 1] offsets
  MoeWgmmaTile* host_wg_tiles_ = nullptr;  // [TAG_MOE_WGMMA] pinned [range_max_tiles_]
  Buffer wg_tiles_;                        // ... and on the device
  Buffer wg_count_;  // [TAG_MOE_WGMMA_DEVICE_PLAN] the device plan's tile count
  std::vector<int64_t> host_off_;
  std::unique_ptr<MoeLtGemm> lt_gemm_;
  // FP8 experts [TAG_FP8_EXPERTS]: activations / scales (x and the down input), the gate_up
  // output.
  bool fp8_ready_ = false;
  Buffer fp8_x_, fp8_xs_, fp8_a_, fp8_as_, fp8_h_;
  // [TAG_MOE_LT_BF16]: the gathered rows, the gate_up output, the SwiGLU output, and the
  // dequantized weights of one projection (lt_w_elems_ bf16 values).
  bool lt_ready_ = false;
  Buffer lt_x_, lt_h_, lt_a_, lt_w_;
  int64_t lt_w_elems_ = 0;
  // [TAG_MOE_LT_OVERLAP] the down projection's scratch, the stream that dequantizes into it and
  // the events that order it between the gate_up dequantization and the down matmuls.
  Buffer lt_w2_;
  int64_t lt_w2_elems_ = 0;
  cudaStream_t dq_stream_ = nullptr;
  cudaEvent_t dq_start_ = nullptr, dq_done_ = nullptr;
  std::vector<SampleRowDev> host_rows_;
  int32_t staged_rows_ = 0;
  bool staged_masks_ = false;  // a staged row has a token mask [TAG_TOKEN_MASK]
  // [TAG_LLM_SAMPLER_STATE]: the GPU tests named above passed on the H200 (2026-12-02,
  // bench/results/gpu-llm-2026-12-02-h200-s2/llm_sel-call4.log).
  static constexpr bool kSamplerStateVerified = true;
  // [TAG_TOKEN_MASK]: GpuLlmOps.*Masked* (5 tests, with the sampler state) passed on the H200
  // (2026-12-02, bench/results/gpu-llm-2026-12-02-h200-s3/masked_fp8_call5.txt).
  static constexpr bool kTokenMaskVerified = true;
  // [TAG_LATE_MASKS]: GpuGptOss.LateMasksDrawTheSameTokensAsEarlyMasks passed on the H200
  // (2026-12-03, bench/results/gpu-llm-2026-12-03-h200-s3/call1-latemask.txt).
  static constexpr bool kLateMaskVerified = true;
  static Tensor bytesOf(Buffer& b, size_t bytes) { return bytesAt(b, 0, bytes); }
  static Tensor bytesAt(Buffer& b, size_t off, size_t bytes) {
    return Tensor(static_cast<char*>(b.data()) + off, DType::kU8, {static_cast<int64_t>(bytes)});
  }
  Buffer state_entries_, state_sizes_, state_rows_;
  int64_t state_capacity_ = 0;
  std::vector<StateRowDev> host_state_rows_;
  std::vector<SamplerEntryDev> host_entries_;
  std::unordered_map<int32_t, size_t> entry_of_;
};

}  // namespace

namespace {
bool g_llm_small_buckets = true;
// [TAG_GEMV] Off: it won no bucket on the H200 (docs/gpt-oss-cuda.md).
bool g_llm_gemv = false;
bool g_llm_gemv_only = false;
}  // namespace

void setLlmGemmSmallBuckets(bool on) { g_llm_small_buckets = on; }
void setLlmGemv(bool on) { g_llm_gemv = on; }
void setLlmRouteAlign(bool on) { g_llm_route_align = on; }
uint64_t llmRouteAlignUses() { return g_llm_route_align_uses.load(std::memory_order_relaxed); }
void setLlmGemvOnly(bool on) { g_llm_gemv_only = on; }

Result<std::unique_ptr<LlmOps>> createCudaLlmOps(Backend& backend) {
  auto* cb = dynamic_cast<CudaBackend*>(&backend);
  if (cb == nullptr) {
    return invalidArgument("cuda llm ops need the cuda backend (got '" +
                           std::string(backend.name()) + "')");
  }
  cb->gemm().setSmallBuckets(g_llm_small_buckets);
  cb->gemm().setGemv(g_llm_gemv);
  cb->gemm().setGemvOnly(g_llm_gemv_only || cb->pdlGemv());  // [TAG_PDL_GEMV]
  cb->gemm().setGemvPdl(cb->pdlGemv());
  cb->gemm().setRowInvariant(cb->gemmRowInvariant());  // [TAG_GEMM_ROW_INVARIANT]
  cb->gemm().setChainGemm(cb->gemmRowInvariant());     // [TAG_GEMM_CHAIN]: refused unless equal
  cb->gemm().setChainPdl(cb->chainPdl());                // [TAG_CHAIN_PDL]
  return std::unique_ptr<LlmOps>(std::make_unique<CudaLlmOps>(*cb));
}

}  // namespace garden::rose::cuda

namespace garden::rose {
Result<std::unique_ptr<LlmOps>> makeCudaLlmOps(Backend& backend) {
  return cuda::createCudaLlmOps(backend);
}
}  // namespace garden::rose
