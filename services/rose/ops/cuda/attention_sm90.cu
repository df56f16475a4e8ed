// The Hopper attention kernel (attention_sm90.cuh): warp-specialized, bulk tensor copies (TMA)
// into a shared-memory ring guarded by mbarriers, wgmma for both products. Index arithmetic in
// attention_sm90_layout.h (tested on the CPU).
//
// One block = 3 warpgroups (384 threads) on query rows q0 .. q0 + 127 of one (sequence, q head):
//   warpgroup 0, the producer: one thread issues every copy (Q once; then per K/V tile the K
//     box pair and the V box pair, each on its own "full" mbarrier with the byte count), waiting
//     on the "empty" mbarriers the consumers release; it gives its registers back (setmaxnreg).
//   warpgroups 1 and 2, the consumers: 64 query rows each (wgmma M = 64). Per key tile:
//     S (64 x 128 f32) = Q K^T  (8 wgmma m64n128k16, Q and K from shared memory, K-major);
//     online softmax on S in registers (f32, running max and sum per row, exp2);
//     O (64 x 128 f32) += P V  (8 wgmma m64n128k16, P from registers as bf16, V from shared
//     memory, MN-major).
//   Pipelined variant (kSm90): each step issues S of tile i together with P V of tile i - 1,
//   then does the softmax of tile i while P V runs (FlashAttention-3's intra-warpgroup
//   overlap); the two consumers take turns issuing their wgmmas (named barriers, "ping-pong"),
//   so one's softmax overlaps the other's matrix products.
//   Basic variant (kSm90Basic): the same copies and products, one after the other (no overlap,
//   no turns): fewer moving parts, for A/B and as the fallback if the pipelined one misbehaves.
// Key tiles run from the last to the first; only the first one processed (the last tile: the
// diagonal one when causal, the partial one when len % 128 != 0) needs the mask.
//
// Varlen: the copies read the packed qkv tensor; a tile that runs past its sequence reads the
// next sequence's rows (or zeros past the tensor): those keys are masked (select, not
// arithmetic), those query rows are not stored, and the V rows past the sequence are zeroed in
// shared memory before use (P is 0 there, but 0 * a non-finite value is not).

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include "services/rose/ops/cuda/attention_sm90.cuh"
#include "services/rose/ops/cuda/attention_sm90_layout.h"
#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/fp8_dense.cuh"
#include "services/rose/ops/cuda/sm90_ptx.cuh"
#include "services/rose/ops/cuda/sm90_softmax.cuh"

namespace garden::rose::cuda {
namespace {

using namespace sm90;   // NOLINT(build/namespaces): the layout constants and index functions
using namespace ptx90;  // NOLINT(build/namespaces): the PTX wrappers

constexpr int kThreads = 384;        // producer + 2 consumer warpgroups
constexpr int kStages = 2;           // K/V ring depth (2 x 64 KB + Q 32 KB)
// setmaxnreg: 128 x producer + 256 x consumer <= 64 K registers. The cp.async loader computes
// addresses per 16-byte chunk and needs more than the TMA thread.
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
constexpr int kProducerRegsCpAsync = 40;
constexpr int kConsumerRegsCpAsync = 232;
constexpr int kSchedBarrier = 1;     // named barriers 1, 2: the consumers' turns (0: __syncthreads)
constexpr int kVZeroBarrier = 3;     // both consumers, after zeroing V rows past the sequence

// PTX wrappers (mbarrier, bulk tensor copy, named barriers, wgmma): sm90_ptx.cuh.

// Set by a wait that gave up (attentionSm90WatchdogFired()).
__device__ unsigned int g_watchdog = 0;
__device__ __forceinline__ void mbarWait(uint32_t bar, uint32_t parity) {
  mbarWaitOrGiveUp(bar, parity, &g_watchdog);
}

// S = Q K^T over head_dim (8 k-steps); the descriptors address k-step 0. The first k-step
// overwrites S.
__device__ __forceinline__ void gemmQK(float (&s)[64], uint64_t q_desc, uint64_t k_desc) {
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    const uint64_t step = kMajorStepOffset(kk) >> 4;
    wgmmaSS(s, q_desc + step, k_desc + step, kk > 0 ? 1 : 0);
  }
}

// O += P V over the tile's 128 keys (8 k-steps of 16 keys).
__device__ __forceinline__ void gemmPV(float (&o)[64], const uint32_t (&p)[32], uint64_t v_desc) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    wgmmaRS(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
            v_desc + (mnMajorStepOffset(kk) >> 4));
  }
}

// Online softmax on this thread's S elements of one tile (rows accRow(tid, e): two rows, 32 keys
// each). kMask: keys invisible to a row (past len; causal, past the row) become -inf first.
// Updates the running max m (of raw scores) and this thread's part of the running sum l, turns
// S into P = exp2(S * scale_log2 - m * scale_log2) and sets alpha, the factor for O.
template <bool kMask, bool kCausal>
__device__ __forceinline__ void softmaxStep(float (&s)[64], float (&m)[2], float (&l)[2],
                                            float (&alpha)[2], float scale_log2, int key0,
                                            int row0, int len, int tid) {
  if (kMask) {
#pragma unroll
    for (int e = 0; e < 64; ++e) {
      if (!keyVisible(key0 + accCol(tid, e), row0 + accRow(tid, e), len, kCausal)) {
        s[e] = -INFINITY;
      }
    }
  }
  onlineSoftmax(s, m, l, alpha, scale_log2);
}

// The consumers' turns at issuing wgmmas (kPipelined): consumer w waits on barrier
// kSchedBarrier + w, then, after issuing, lets the other one go. Consumer 1 opens consumer 0's
// first turn and skips its own last hand-over, so every barrier phase has 256 arrivals.
__device__ __forceinline__ void turnBegin(int w) { namedBarrierSync(kSchedBarrier + w, 256); }
__device__ __forceinline__ void turnEnd(int w) { namedBarrierArrive(kSchedBarrier + 1 - w, 256); }

// The cp.async loader (kTma = false, variant kSm90CpAsync, for bisecting a failure between the
// tensor map and the rest): the 128 producer threads copy a [128 rows][128 columns] tile from
// token row `row` and column `col`, zero-filling rows past the tensor as TMA does, into the same
// swizzled layout; then make the writes visible to wgmma (async proxy).
__device__ __forceinline__ void cpAsyncTile(const AttentionArgs& a, uint32_t dst, int col, int row,
                                            int ptid) {
  const int64_t width = static_cast<int64_t>(a.num_q_heads + 2 * a.num_kv_heads) * kHeadDim;
  for (int i = ptid; i < 128 * (kHeadDim / 8); i += 128) {
    const int r = i / (kHeadDim / 8), c = (i % (kHeadDim / 8)) * 8;
    const int64_t tok = static_cast<int64_t>(row) + r;
    const bool valid = tok < a.num_tokens;
    cpAsync16(dst + tileOffset(r, c), a.qkv + (valid ? tok : 0) * width + col + c, valid);
  }
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
  fenceProxyAsyncShared();
}

template <bool kCausal, bool kPipelined, bool kTma>
__global__ void __launch_bounds__(kThreads, 1)
    attentionSm90Kernel(const __grid_constant__ CUtensorMap qkv_map, AttentionArgs a) {
  pdlWait();  // [TAG_PDL]
  using L = SmemLayout<kStages>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smemAddr(smem_raw) + kSwizzleAtomBytes - 1) & ~(kSwizzleAtomBytes - 1);
  const uint32_t s_q = base + L::kQ;
  const uint32_t s_k = base + L::kK;
  const uint32_t s_v = base + L::kV;
  const uint32_t bar_q = base + L::kBarriers;
  const uint32_t bar_k_full = bar_q + 8;
  const uint32_t bar_v_full = bar_k_full + 8 * kStages;
  const uint32_t bar_k_empty = bar_v_full + 8 * kStages;
  const uint32_t bar_v_empty = bar_k_empty + 8 * kStages;

  const int qh = blockHead(blockIdx.x, a.num_q_heads);
  int seq = 0, tile_q0 = 0;
  if (!findAttentionTile(a.cu_seqlens, a.num_seqs,
                         static_cast<int>(blockTile(blockIdx.x, a.num_q_heads)), kBlockM, seq,
                         tile_q0)) {
    return;  // every warp of the block finds the same answer
  }
  const int start = a.cu_seqlens[seq];
  const int len = a.cu_seqlens[seq + 1] - start;
  const int q0 = queryTileStart(len, tile_q0 / kBlockM, kCausal);
  const int kvh = qh / (a.num_q_heads / a.num_kv_heads);
  const int n_tiles = kvTiles(len, q0, kCausal);
  const int wg = static_cast<int>(threadIdx.x) / 128;

  if (threadIdx.x == 0) {
    // TMA: the producer's arrive.expect_tx + the bytes; cp.async: each producer thread.
    constexpr uint32_t kFullCount = kTma ? 1 : 128;
    mbarInit(bar_q, kFullCount);
    for (int s = 0; s < kStages; ++s) {
      mbarInit(bar_k_full + 8 * s, kFullCount);
      mbarInit(bar_v_full + 8 * s, kFullCount);
      mbarInit(bar_k_empty + 8 * s, 8);  // lane 0 of each of the 8 consumer warps
      mbarInit(bar_v_empty + 8 * s, 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // Producer.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kTma ? kProducerRegs
                                                                     : kProducerRegsCpAsync));
    if constexpr (!kTma) {
      const int ptid = static_cast<int>(threadIdx.x);
      cpAsyncTile(a, s_q, qColumn(qh, 0), start + q0, ptid);
      mbarArrive(bar_q);
      for (int it = 0; it < n_tiles; ++it) {
        const int st = it % kStages;
        const uint32_t free_parity = ((it / kStages) & 1) ^ 1;
        const int row = start + (n_tiles - 1 - it) * kBlockN;
        mbarWait(bar_k_empty + 8 * st, free_parity);
        cpAsyncTile(a, s_k + st * kTileBytes, kColumn(a.num_q_heads, kvh, 0), row, ptid);
        mbarArrive(bar_k_full + 8 * st);
        mbarWait(bar_v_empty + 8 * st, free_parity);
        cpAsyncTile(a, s_v + st * kTileBytes, vColumn(a.num_q_heads, a.num_kv_heads, kvh, 0), row,
                    ptid);
        mbarArrive(bar_v_full + 8 * st);
      }
    } else if (threadIdx.x == 0) {
      const CUtensorMap* map = &qkv_map;
      mbarArriveExpectTx(bar_q, kTileBytes);
      tmaLoad2d(s_q, map, qColumn(qh, 0), start + q0, bar_q);
      tmaLoad2d(s_q + kHalfBytes, map, qColumn(qh, 1), start + q0, bar_q);
      for (int it = 0; it < n_tiles; ++it) {
        const int st = it % kStages;
        const uint32_t free_parity = ((it / kStages) & 1) ^ 1;  // first round: at once
        const int row = start + (n_tiles - 1 - it) * kBlockN;
        const uint32_t k_dst = s_k + st * kTileBytes;
        const uint32_t v_dst = s_v + st * kTileBytes;
        mbarWait(bar_k_empty + 8 * st, free_parity);
        mbarArriveExpectTx(bar_k_full + 8 * st, kTileBytes);
        tmaLoad2d(k_dst, map, kColumn(a.num_q_heads, kvh, 0), row, bar_k_full + 8 * st);
        tmaLoad2d(k_dst + kHalfBytes, map, kColumn(a.num_q_heads, kvh, 1), row,
                  bar_k_full + 8 * st);
        mbarWait(bar_v_empty + 8 * st, free_parity);
        mbarArriveExpectTx(bar_v_full + 8 * st, kTileBytes);
        tmaLoad2d(v_dst, map, vColumn(a.num_q_heads, a.num_kv_heads, kvh, 0), row,
                  bar_v_full + 8 * st);
        tmaLoad2d(v_dst + kHalfBytes, map, vColumn(a.num_q_heads, a.num_kv_heads, kvh, 1), row,
                  bar_v_full + 8 * st);
      }
    }
    return;
  }

  // Consumers.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kTma ? kConsumerRegs
                                                                   : kConsumerRegsCpAsync));
  const int w = wg - 1;
  const int tid = static_cast<int>(threadIdx.x) % 128;
  const bool warp_leader = (threadIdx.x % 32) == 0;
  const int row0 = q0 + w * kWarpgroupRows;  // this warpgroup's first query row
  const float scale_log2 = a.scale * 1.4426950408889634f;
  const uint64_t q_desc =
      makeDescriptor(s_q + w * kWarpgroupRows * kRowBytes, kKMajorLbo, kKMajorSbo);
  const uint64_t k_desc0 = makeDescriptor(s_k, kKMajorLbo, kKMajorSbo);
  const uint64_t v_desc0 = makeDescriptor(s_v, kMnMajorLbo, kMnMajorSbo);
  constexpr uint64_t kStageStep = kTileBytes >> 4;  // descriptor start address per stage

  // The first tile processed (stage 0) may run past the sequence: zero its V rows from len on.
  const int first_key0 = (n_tiles - 1) * kBlockN;
  if (first_key0 + kBlockN > len) {  // block-uniform
    mbarWait(bar_v_full, 0);
    const int bad0 = len - first_key0;
    constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
    for (int i = static_cast<int>(threadIdx.x) - 128; i < (kBlockN - bad0) * kChunks; i += 256) {
      const uint32_t dst = s_v + tileOffset(bad0 + i / kChunks, (i % kChunks) * 8);
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0) : "memory");
    }
    fenceProxyAsyncShared();  // visible to wgmma
    namedBarrierSync(kVZeroBarrier, 256);
  }

  float o[64], s[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
  uint32_t p[32];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = s[i] = 0.f;
  mbarWait(bar_q, 0);

  if constexpr (kPipelined) {
    if (w == 1) namedBarrierArrive(kSchedBarrier, 256);  // consumer 0 takes the first turn
    // Step 0: S of the first tile processed, masked softmax.
    mbarWait(bar_k_full, 0);
    turnBegin(w);
    wgmmaFence();
    gemmQK(s, q_desc, k_desc0);
    wgmmaCommit();
    turnEnd(w);
    wgmmaWait<0>();
    fenceRegs(s);
    mbarArriveIf(bar_k_empty, warp_leader);
    softmaxStep<true, kCausal>(s, m, l, alpha, scale_log2, first_key0, row0, len, tid);
    toP(s, p);
    // Step it: S of tile it and P V of tile it - 1 issued together; the softmax of tile it runs
    // while P V does.
#pragma unroll 1
    for (int it = 1; it < n_tiles; ++it) {
      const int st = it % kStages;
      const uint32_t ph = (it / kStages) & 1;
      const int sp = (it - 1) % kStages;
      const uint32_t php = ((it - 1) / kStages) & 1;
      // Both waits before the turn: no branch between the two wgmma batches (ptxas would fence
      // there), and V of tile it - 1 landed a step ago.
      mbarWait(bar_k_full + 8 * st, ph);
      mbarWait(bar_v_full + 8 * sp, php);
      turnBegin(w);
      wgmmaFence();
      gemmQK(s, q_desc, k_desc0 + st * kStageStep);
      wgmmaCommit();
      gemmPV(o, p, v_desc0 + sp * kStageStep);
      wgmmaCommit();
      turnEnd(w);
      wgmmaWait<1>();  // S done
      fenceRegs(s);
      mbarArriveIf(bar_k_empty + 8 * st, warp_leader);
      softmaxStep<false, kCausal>(s, m, l, alpha, scale_log2, 0, row0, len, tid);
      wgmmaWait<0>();  // P V done
      fenceRegs(o);
      fenceRegs(p);
      mbarArriveIf(bar_v_empty + 8 * sp, warp_leader);
      toP(s, p);
      rescaleO(o, alpha);
    }
    // Last: P V of the last tile processed.
    const int sl = (n_tiles - 1) % kStages;
    mbarWait(bar_v_full + 8 * sl, ((n_tiles - 1) / kStages) & 1);
    turnBegin(w);
    wgmmaFence();
    gemmPV(o, p, v_desc0 + sl * kStageStep);
    wgmmaCommit();
    if (w == 0) turnEnd(w);
    wgmmaWait<0>();
    fenceRegs(o);
    mbarArriveIf(bar_v_empty + 8 * sl, warp_leader);
  } else {
#pragma unroll 1
    for (int it = 0; it < n_tiles; ++it) {
      const int st = it % kStages;
      const uint32_t ph = (it / kStages) & 1;
      mbarWait(bar_k_full + 8 * st, ph);
      wgmmaFence();
      gemmQK(s, q_desc, k_desc0 + st * kStageStep);
      wgmmaCommit();
      wgmmaWait<0>();
      fenceRegs(s);
      mbarArriveIf(bar_k_empty + 8 * st, warp_leader);
      if (it == 0) {
        softmaxStep<true, kCausal>(s, m, l, alpha, scale_log2, first_key0, row0, len, tid);
      } else {
        softmaxStep<false, kCausal>(s, m, l, alpha, scale_log2, 0, row0, len, tid);
      }
      toP(s, p);
      rescaleO(o, alpha);
      mbarWait(bar_v_full + 8 * st, ph);
      wgmmaFence();
      gemmPV(o, p, v_desc0 + st * kStageStep);
      wgmmaCommit();
      wgmmaWait<0>();
      fenceRegs(o);
      fenceRegs(p);
      mbarArriveIf(bar_v_empty + 8 * st, warp_leader);
    }
  }

  // Epilogue: O / l, rows of the sequence only.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = l[r] > 0.f ? 1.f / l[r] : 0.f;
  }
  const int64_t out_stride = static_cast<int64_t>(a.num_q_heads) * kHeadDim;
  if (a.out_fp8 != nullptr) {
    // [TAG_ATTN_FP8_OUT] A row's 128 head dims are one e4m3 block of the O-proj input: the 4
    // lanes of a quad hold it (32 values each). The bf16 rounding of the plain store, then
    // fp8_dense.cuh's rule (fp8BlockScale; scale at [qh][token], VEC128), so the bits equal the
    // bf16 output quantized by launchFp8RowQuant. Every lane takes part in the quad shuffles.
    uint8_t* q_base = a.out_fp8 + static_cast<int64_t>(start) * out_stride + qh * kHeadDim;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + accRow(tid, 2 * r);
      float v[32], amax = 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        v[2 * i] = roundBf16(o[4 * i + 2 * r] * inv[r]);
        v[2 * i + 1] = roundBf16(o[4 * i + 2 * r + 1] * inv[r]);
        amax = fmaxf(amax, fmaxf(fabsf(v[2 * i]), fabsf(v[2 * i + 1])));
      }
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      float qinv;
      const float sc = fp8BlockScale(amax, &qinv);
      if (row < len) {
        uint16_t* dst = reinterpret_cast<uint16_t*>(q_base + static_cast<int64_t>(row) * out_stride +
                                                    accCol(tid, 0));
#pragma unroll
        for (int i = 0; i < 16; ++i)
          dst[4 * i] = static_cast<uint16_t>(fp8Code(v[2 * i], qinv) | (fp8Code(v[2 * i + 1], qinv) << 8));
        if ((tid & 3) == 0) a.out_scales[qh * a.out_scale_rows + start + row] = sc;
      }
    }
    return;
  }
  __nv_bfloat16* o_base = a.out + static_cast<int64_t>(start) * out_stride + qh * kHeadDim;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + accRow(tid, 2 * r);
    if (row < len) {
      uint32_t* dst = reinterpret_cast<uint32_t*>(o_base + static_cast<int64_t>(row) * out_stride +
                                                  accCol(tid, 0));
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        dst[4 * i] = packBf16x2(o[4 * i + 2 * r] * inv[r], o[4 * i + 2 * r + 1] * inv[r]);
      }
    }
  }
}

Status encodeQkvMap(const AttentionArgs& a, CUtensorMap* map) {
  const QkvTensorMapShape shape = qkvTensorMapShape(a.num_tokens, a.num_q_heads, a.num_kv_heads);
  const cuuint64_t dims[2] = {shape.dims[0], shape.dims[1]};
  const cuuint64_t strides[1] = {shape.row_stride_bytes};
  const cuuint32_t box[2] = {shape.box[0], shape.box[1]};
  return encodeBf16TensorMap(map, a.qkv, 2, dims, strides, box, "attention sm90: qkv");
}

template <bool kCausal, bool kPipelined, bool kTma>
Status launchKernel(const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  CUtensorMap map;
  if (kTma) {
    RETURN_IF_ERROR(encodeQkvMap(a, &map));
  } else {
    std::memset(&map, 0, sizeof(map));  // unused
  }
  constexpr size_t smem = SmemLayout<kStages>::kDynamicBytes;
  static std::once_flag once;  // [TAG_ATTN_SMEM] one attribute call per instance
  static cudaError_t configured = cudaSuccess;
  std::call_once(once, [] {
    configured = cudaFuncSetAttribute(attentionSm90Kernel<kCausal, kPipelined, kTma>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem));
  });
  CUDA_RETURN_IF_ERROR(configured);
  const int64_t blocks = maxQueryTiles(a.num_tokens, a.num_seqs) * a.num_q_heads;
  CUDA_RETURN_IF_ERROR(launchPdl(pdl, attentionSm90Kernel<kCausal, kPipelined, kTma>,
                                 dim3(static_cast<unsigned>(blocks)), dim3(kThreads), smem, stream,
                                 map, a));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace

// cuTensorMapEncodeTiled from the driver, through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensorMapEncoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    } else {
      (void)cudaGetLastError();  // not sticky; do not leave it for the next check
    }
  });
  return fn;
}

Status encodeBf16TensorMap(CUtensorMap* map, const void* ptr, uint32_t rank, const uint64_t* dims,
                           const uint64_t* strides, const uint32_t* box, const char* what) {
  return encode16TensorMap(map, ptr, rank, dims, strides, box, what, false);
}

Status encode16TensorMap(CUtensorMap* map, const void* ptr, uint32_t rank, const uint64_t* dims,
                         const uint64_t* strides, const uint32_t* box, const char* what,
                         bool f16) {
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  if (rank < 1 || rank > 3) return invalidArgument(std::string(what) + ": tensor map rank 1..3");
  const CUresult r = tensorMapEncoder()(
      map, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(ptr), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return internalError(std::string(what) + ": cuTensorMapEncodeTiled failed (CUresult " +
                         std::to_string(static_cast<int>(r)) + ")");
  }
  return okStatus();
}

// Compute capability of the current device (queried once per device).
int deviceCapability() {
  static int cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  if (cached[dev] == 0) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      return 0;
    }
    cached[dev] = major * 10 + minor;
  }
  return cached[dev];
}

Status checkAttentionSm90(const AttentionArgs& a, const char* variant) {
  const std::string name(variant);
  if (a.head_dim != kHeadDim) {
    return unimplemented("attention: variant " + name + " needs head_dim 128, got " +
                         std::to_string(a.head_dim));
  }
  if (!(a.scale > 0.f) || !std::isfinite(a.scale)) {
    return unimplemented("attention: variant " + name + " needs a positive finite scale");
  }
  if (maxQueryTiles(a.num_tokens, a.num_seqs) * a.num_q_heads > INT32_MAX) {
    return invalidArgument("attention: variant " + name + ": too many query tiles x heads");
  }
  const int cc = deviceCapability();
  if (cc != 90) {
    return failedPrecondition("attention: variant " + name +
                              " needs a compute capability 9.0 GPU (Hopper), found " +
                              std::to_string(cc / 10) + "." + std::to_string(cc % 10));
  }
  if (tensorMapEncoder() == nullptr) {
    return failedPrecondition("attention: variant " + name +
                              " needs cuTensorMapEncodeTiled (CUDA driver 12.0 or newer)");
  }
  if (a.out_fp8 != nullptr &&
      (a.out_scales == nullptr || a.out_scale_rows < a.num_tokens ||
       (reinterpret_cast<uintptr_t>(a.out_fp8) | reinterpret_cast<uintptr_t>(a.out_scales)) % 16 != 0)) {
    return invalidArgument("attention: variant " + name +
                           ": an fp8 output needs scales for every token and 16-byte aligned "
                           "codes and scales");
  }
  return okStatus();
}

Result<bool> attentionSm90WatchdogFired() {
  unsigned int fired = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(&fired, g_watchdog, sizeof(fired)));
  const unsigned int zero = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpyToSymbol(g_watchdog, &zero, sizeof(zero)));
  return fired != 0;
}

Status launchAttentionSm90(const AttentionArgs& a, cudaStream_t stream, Sm90Schedule schedule,
                          bool pdl) {
  switch (schedule) {
    case Sm90Schedule::kPipelined:
      return a.causal ? launchKernel<true, true, true>(a, stream, pdl)
                      : launchKernel<false, true, true>(a, stream, pdl);
    case Sm90Schedule::kBasic:
      return a.causal ? launchKernel<true, false, true>(a, stream, pdl)
                      : launchKernel<false, false, true>(a, stream, pdl);
    case Sm90Schedule::kBasicCpAsync:
      return a.causal ? launchKernel<true, false, false>(a, stream, pdl)
                      : launchKernel<false, false, false>(a, stream, pdl);
  }
  return invalidArgument("attention sm90: unknown schedule");
}

}  // namespace garden::rose::cuda
