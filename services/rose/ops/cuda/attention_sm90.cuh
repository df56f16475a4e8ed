#pragma once
// The Hopper (sm_90a) varlen attention kernel behind AttentionVariant::kSm90 / kSm90Basic
// (attention.cuh): head_dim 128, bf16 in and out, f32 accumulation and softmax, causal or
// bidirectional, GQA. Warp-specialized: a producer warpgroup streams Q and 128-key K/V tiles
// with bulk tensor copies (TMA) into a 2-stage shared-memory ring guarded by mbarriers; two
// consumer warpgroups (64 query rows each, 128 rows per block) run S = Q K^T and O += P V on
// wgmma with the online softmax in registers. kSm90 overlaps each softmax with the matrix
// products (FlashAttention-3's intra-warpgroup pipelining and the two consumers' ping-pong);
// kSm90Basic runs the same steps one after the other; kSm90CpAsync is kSm90Basic with the K/V/Q
// tiles copied by the producer threads with cp.async instead of TMA (same shared layout), to
// tell a tensor-map problem from a wgmma one should a variant fail. Design notes in
// attention_sm90.cu; index arithmetic in attention_sm90_layout.h.
//
// Results are not bit-identical to the mma.sync variants (other tile shapes and accumulation
// order); they agree within bf16 rounding. A row does not depend on the rest of the batch.

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "common/status.h"
#include "services/rose/ops/cuda/attention.cuh"

namespace garden::rose::cuda {

// OK when the Hopper kernel can run `a` on the current device: head_dim 128, a positive scale,
// a compute capability 9.0 device and the driver's tensor-map encoder. `variant` names the
// variant in the error message.
Status checkAttentionSm90(const AttentionArgs& a, const char* variant);
// Launches it (the caller has checked `a`).
enum class Sm90Schedule {
  kPipelined,    // kSm90
  kBasic,        // kSm90Basic
  kBasicCpAsync  // kSm90CpAsync: kBasic with cp.async loads instead of TMA (bisection aid)
};
Status launchAttentionSm90(const AttentionArgs& a, cudaStream_t stream, Sm90Schedule schedule,
                          bool pdl);
// Whether a launch since the last call gave up waiting on an mbarrier (the kernel's watchdog: a
// pipeline protocol bug, reported instead of a hang; that launch's output is wrong). Synchronous
// (reads device memory after the device's preceding work); resets the flag. Tests call it.
Result<bool> attentionSm90WatchdogFired();

// cuTensorMapEncodeTiled from the driver, through the runtime (no link against libcuda); null
// when the driver has none. Shared with paged_attention_sm90.cu.
PFN_cuTensorMapEncodeTiled_v12000 tensorMapEncoder();
// A bf16 tensor map (rank 1..3; dims innermost first, strides in bytes of dims 1.., the box in
// elements) with the 128-byte swizzle, 256-byte L2 promotion and zero fill out of bounds, as
// both Hopper attention kernels copy their tiles; INTERNAL naming `what` if the driver refuses.
// The caller has checked tensorMapEncoder() != nullptr.
Status encodeBf16TensorMap(CUtensorMap* map, const void* ptr, uint32_t rank, const uint64_t* dims,
                           const uint64_t* strides, const uint32_t* box, const char* what);
// The same for either 16-bit type (f16: IEEE fp16 elements [TAG_ATTN_F16], else bf16).
Status encode16TensorMap(CUtensorMap* map, const void* ptr, uint32_t rank, const uint64_t* dims,
                         const uint64_t* strides, const uint32_t* box, const char* what, bool f16);
// Compute capability of the current device as major * 10 + minor (0 when unknown).
int deviceCapability();

}  // namespace garden::rose::cuda
