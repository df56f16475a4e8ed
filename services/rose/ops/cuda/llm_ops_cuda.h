#pragma once
// The CUDA implementation of LlmOps (services/rose/ops/llm_ops.h) for gpt-oss: bf16 activations
// and KV cache, f32 router logits, logits and softmax statistics. Each op validates its views and
// launches the kernels of its own file on the CudaBackend's stream:
//   ropeKvWrite    rope_kv.cuh          RoPE of q/k fused with the K/V write into paged blocks
//   pagedAttention paged_attention.cuh  prefill chunks + decode, sinks, sliding window, split-KV
//   moeRoute       moe_route.cuh        top-k + softmax over the selected (+ router bias)
//   moeRouteF32    moe_router_f32.cuh   router logits from the f32 stream (norm folded), then
//                                       moe_route.cuh on the slice partials
//   moeExperts     moe_permute.cuh + moe_gemm.cuh: align rows by expert, grouped GEMM gate_up
//                  (+bias, clamped SwiGLU in the epilogue), grouped GEMM down (+bias), weighted
//                  combine — experts MXFP4-resident (tiled layout) or bf16
//   gatherRows, copyTokens  gather.cuh
//   sample         sample.cuh
// Workspaces are sized once by reserve() (the model calls it at load) and reused by every step,
// so the hot path never allocates. planAttention() builds the step's attention work split on the
// host and copies it to the device (plan, then run [TAG_PLAN_THEN_RUN]).
//
// Threads: as the backend (one launching thread).

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "services/rose/ops/llm_ops.h"

namespace garden::rose::cuda {

// `backend` must be the "cuda" backend (CudaBackend) and outlive the ops. Turns on the backend
// GemmRunner's small M buckets [TAG_GEMM_SMALL_BUCKETS] unless setLlmGemmSmallBuckets(false)
// (gpt-oss's decode graphs pad M to powers of two, so the buckets nest them).
Result<std::unique_ptr<LlmOps>> createCudaLlmOps(Backend& backend);
// Process-global, read by createCudaLlmOps (rose_llm_bench --gemm-small-buckets on|off).
void setLlmGemmSmallBuckets(bool on);
// [TAG_GEMV] Whether createCudaLlmOps lets the GemmRunner time the CUDA-core GEMV for the small
// buckets (GemmRunner::setGemv). Off by default: it won no bucket on the H200 (rose_llm_bench
// --gemm-gemv on).
void setLlmGemv(bool on);
// [TAG_PDL_GEMV] The GEMV as the only candidate of the M = 1 bucket (GemmRunner::setGemvOnly; on
// whenever CudaKernelOptions::pdl_gemv is): tests compare the programmatic GEMV with the same
// GEMV launched plainly.
void setLlmGemvOnly(bool on);
// [TAG_ROUTE_ALIGN] Decode-sized steps (<= 8 tokens, <= 32 assignments) run the route and the MoE
// align in one kernel (launchMoeRouteAlign; same outputs). Off by default: measured on an H100
// (2026-12-05 s20) it saved nothing (decode b1@8k 2.893 / 2.887 ms with it against 2.869 / 2.886
// without; with PDL 2.841 / 2.818 against 2.789 / 2.812) — one launch less is not where a decode
// layer's small kernels spend their time. rose_llm_bench --route-align on for the A/B.
// Process-global, read at each route.
void setLlmRouteAlign(bool on);
// MoE calls so far (every CudaLlmOps of the process) whose align the route had done (tests).
uint64_t llmRouteAlignUses();

}  // namespace garden::rose::cuda
