#include <cmath>
#include <cstdint>
#include <string>

#include "services/rose/ops/cuda/attention.cuh"
#include "services/rose/ops/cuda/attention_sm90.cuh"
#include "services/rose/ops/cuda/attention_sm90_layout.h"
#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"

namespace garden::rose::cuda {
namespace {

constexpr int kKeysPerTile = 64;  // kN: keys per K/V shared-memory tile

template <int kD>
constexpr size_t attentionSmemBytes() {
  // [2 stages][K, V][kN rows][kD + 8 padded] bf16
  return size_t{2} * 2 * kKeysPerTile * (kD + 8) * sizeof(__nv_bfloat16);
}

// The narrow-warp kernel (AttentionVariant kNarrow16 / kNarrow64). kWarps warps x 16 query rows
// each = kM rows per block and q head. Per warp: S (16 x 64) = Q K^T with Q fragments held in
// registers; P = exp2(S - m) in registers reused as the A operand of P V. The schedule:
//   - kHeads q heads of one GQA group per block share each K/V tile in shared memory (kHeads x
//     kWarps warps; half the K/V loads per FLOP for Qwen3's 2 q heads per kv head);
//   - the causal/length mask is applied only to the tiles that need it (the last one, and the
//     diagonal ones of a causal warp): a fully valid tile takes the unmasked path, whose
//     arithmetic per valid key is the masked path's;
//   - causal query tiles run longest-first within a sequence (fewer stragglers in the last wave).
template <int kD, int kWarps, bool kCausal, int kHeads>
__global__ void __launch_bounds__(32 * kWarps * kHeads) attentionKernel(AttentionArgs a) {
  pdlWait();                             // [TAG_PDL]
  constexpr int kM = 16 * kWarps;        // query rows per block and head
  constexpr int kN = kKeysPerTile;       // keys per tile
  constexpr int kRow = kD + 8;           // padded smem row (elements): conflict-free ldmatrix
  constexpr int kKSteps = kD / 16;       // k-steps of Q K^T over head_dim
  constexpr int kDTiles = kD / 8;        // 8-wide output column tiles
  constexpr int kChunksPerRow = kD / 8;  // 16-byte chunks per K/V row
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* s_k = reinterpret_cast<__nv_bfloat16*>(smem);  // [2][kN][kRow]
  __nv_bfloat16* s_v = s_k + 2 * kN * kRow;                     // [2][kN][kRow]

  int seq = 0, q0 = 0;
  if (!findAttentionTile(a.cu_seqlens, a.num_seqs, blockIdx.x, kM, seq, q0)) return;
  const int start = a.cu_seqlens[seq];
  const int len = a.cu_seqlens[seq + 1] - start;
  if (kCausal) q0 = ((len + kM - 1) / kM - 1) * kM - q0;  // longest tiles first
  const int qh = blockIdx.y * kHeads + static_cast<int>(threadIdx.x / (32 * kWarps));
  const int kvh = qh / (a.num_q_heads / a.num_kv_heads);
  const int warp = (threadIdx.x / 32) % kWarps;  // row group within the head
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;  // row within the 8-row half of a fragment
  const int t = lane & 3;   // column pair within a fragment
  const int64_t stride = static_cast<int64_t>(a.num_q_heads + 2 * a.num_kv_heads) * kD;
  const __nv_bfloat16* q_base = a.qkv + static_cast<int64_t>(start) * stride + qh * kD;
  const __nv_bfloat16* k_base =
      a.qkv + static_cast<int64_t>(start) * stride + (a.num_q_heads + kvh) * kD;
  const __nv_bfloat16* v_base =
      a.qkv + static_cast<int64_t>(start) * stride + (a.num_q_heads + a.num_kv_heads + kvh) * kD;

  const int r0 = q0 + warp * 16 + g;  // this thread's two query rows (relative to the sequence)
  const int r1 = r0 + 8;
  uint32_t qf[kKSteps][4];
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    const int c = kk * 16 + 2 * t;
    const uint32_t* p0 =
        reinterpret_cast<const uint32_t*>(q_base + static_cast<int64_t>(r0) * stride + c);
    const uint32_t* p1 =
        reinterpret_cast<const uint32_t*>(q_base + static_cast<int64_t>(r1) * stride + c);
    qf[kk][0] = r0 < len ? p0[0] : 0u;
    qf[kk][1] = r1 < len ? p1[0] : 0u;
    qf[kk][2] = r0 < len ? p0[4] : 0u;
    qf[kk][3] = r1 < len ? p1[4] : 0u;
  }

  float o[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  const int kv_len = kCausal ? min(len, q0 + kM) : len;
  const int n_tiles = (kv_len + kN - 1) / kN;
  auto load_tile = [&](int j, int stage) {
    const int key0 = j * kN;
    for (int i = threadIdx.x; i < kN * kChunksPerRow; i += kWarps * kHeads * 32) {
      const int r = i / kChunksPerRow;
      const int c = (i % kChunksPerRow) * 8;
      const int key = key0 + r;
      const bool valid = key < len;
      const int64_t src = static_cast<int64_t>(valid ? key : 0) * stride + c;
      cpAsync16(s_k + (stage * kN + r) * kRow + c, k_base + src, valid);
      cpAsync16(s_v + (stage * kN + r) * kRow + c, v_base + src, valid);
    }
  };
  load_tile(0, 0);
  cpAsyncCommit();
  // __fmul_rn / __fmaf_rn below: explicit roundings, so that ptxas cannot contract differently
  // in different kernels (the wide kernel must stay bit-identical to this one).
  const float scale_log2 = a.scale * 1.4426950408889634f;
  const int mi = lane >> 3;  // which 8x8 matrix this lane addresses in ldmatrix.x4
  const int mr = lane & 7;   // which row of it

  for (int j = 0; j < n_tiles; ++j) {
    const int stage = j & 1;
    if (j + 1 < n_tiles) {
      load_tile(j + 1, stage ^ 1);
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* k_s = s_k + stage * kN * kRow;
    const __nv_bfloat16* v_s = s_v + stage * kN * kRow;

    float s[kN / 8][4];
#pragma unroll
    for (int i = 0; i < kN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int nt2 = 0; nt2 < kN / 16; ++nt2) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t b[4];
        ldmatrixX4(b, k_s + (nt2 * 16 + (mi >> 1) * 8 + mr) * kRow + kk * 16 + (mi & 1) * 8);
        mmaBf16(s[2 * nt2], qf[kk], b[0], b[1]);
        mmaBf16(s[2 * nt2 + 1], qf[kk], b[2], b[3]);
      }
    }

    const int key0 = j * kN;
    float mx0 = -INFINITY, mx1 = -INFINITY;
    // Warp-uniform: every key of the tile is valid for every row of this warp.
    const bool full = key0 + kN <= len && (!kCausal || key0 + kN - 1 <= q0 + warp * 16);
    if (full) {
#pragma unroll
      for (int nt = 0; nt < kN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          s[nt][e] = __fmul_rn(s[nt][e], scale_log2);
          s[nt][2 + e] = __fmul_rn(s[nt][2 + e], scale_log2);
          mx0 = fmaxf(mx0, s[nt][e]);
          mx1 = fmaxf(mx1, s[nt][2 + e]);
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < kN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + nt * 8 + 2 * t + e;
          const bool ok0 = key < len && (!kCausal || key <= r0);
          const bool ok1 = key < len && (!kCausal || key <= r1);
          s[nt][e] = ok0 ? __fmul_rn(s[nt][e], scale_log2) : -INFINITY;
          s[nt][2 + e] = ok1 ? __fmul_rn(s[nt][2 + e], scale_log2) : -INFINITY;
          mx0 = fmaxf(mx0, s[nt][e]);
          mx1 = fmaxf(mx1, s[nt][2 + e]);
        }
      }
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0);
    const float mn1 = fmaxf(m1, mx1);
    const float base0 = mn0 == -INFINITY ? 0.f : mn0;  // a row with no valid key yet
    const float base1 = mn1 == -INFINITY ? 0.f : mn1;
    const float alpha0 = exp2f(m0 - base0);
    const float alpha1 = exp2f(m1 - base1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < kN / 8; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - base0);
      s[nt][1] = exp2f(s[nt][1] - base0);
      s[nt][2] = exp2f(s[nt][2] - base1);
      s[nt][3] = exp2f(s[nt][3] - base1);
      rs0 += s[nt][0] + s[nt][1];
      rs1 += s[nt][2] + s[nt][3];
    }
    l0 = __fmaf_rn(l0, alpha0, rs0);
    l1 = __fmaf_rn(l1, alpha1, rs1);
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      o[dt][0] *= alpha0;
      o[dt][1] *= alpha0;
      o[dt][2] *= alpha1;
      o[dt][3] *= alpha1;
    }

#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      const uint32_t pa[4] = {packBf16x2(s[2 * kk][0], s[2 * kk][1]),
                              packBf16x2(s[2 * kk][2], s[2 * kk][3]),
                              packBf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              packBf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dt2 = 0; dt2 < kDTiles / 2; ++dt2) {
        uint32_t b[4];
        ldmatrixX4Trans(b, v_s + (kk * 16 + (mi & 1) * 8 + mr) * kRow + dt2 * 16 + (mi >> 1) * 8);
        mmaBf16(o[2 * dt2], pa, b[0], b[1]);
        mmaBf16(o[2 * dt2 + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // this stage is refilled two iterations later
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f;
  const float inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  const int64_t out_stride = static_cast<int64_t>(a.num_q_heads) * kD;
  __nv_bfloat16* o_base = a.out + static_cast<int64_t>(start) * out_stride + qh * kD;
  if (r0 < len) {
    uint32_t* p =
        reinterpret_cast<uint32_t*>(o_base + static_cast<int64_t>(r0) * out_stride + 2 * t);
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) p[dt * 4] = packBf16x2(o[dt][0] * inv0, o[dt][1] * inv0);
  }
  if (r1 < len) {
    uint32_t* p =
        reinterpret_cast<uint32_t*>(o_base + static_cast<int64_t>(r1) * out_stride + 2 * t);
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) p[dt * 4] = packBf16x2(o[dt][2] * inv1, o[dt][3] * inv1);
  }
}

template <int kD, int kWarps, bool kCausal, int kHeads>
Status launchNarrow(const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  constexpr int kM = 16 * kWarps;
  constexpr size_t smem = attentionSmemBytes<kD>();
  static bool configured = false;  // [TAG_ATTN_SMEM] one attribute call per instance
  if (!configured) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(attentionKernel<kD, kWarps, kCausal, kHeads>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
    configured = true;
  }
  // Upper bound on tiles: sum ceil(len / kM) <= ceil(T / kM) + num_seqs. Extra blocks exit.
  const int64_t tiles = (a.num_tokens + kM - 1) / kM + a.num_seqs;
  dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_q_heads / kHeads));
  CUDA_RETURN_IF_ERROR(launchPdl(pdl, attentionKernel<kD, kWarps, kCausal, kHeads>, grid,
                                 dim3(kWarps * kHeads * 32), smem, stream, a));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

// kNarrow16 / kNarrow64 at head_dim kD: two q heads per block when the GQA group is even.
template <int kD, int kWarps>
Status dispatchNarrow(const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  if ((a.num_q_heads / a.num_kv_heads) % 2 == 0) {
    return a.causal ? launchNarrow<kD, kWarps, true, 2>(a, stream, pdl)
                    : launchNarrow<kD, kWarps, false, 2>(a, stream, pdl);
  }
  return a.causal ? launchNarrow<kD, kWarps, true, 1>(a, stream, pdl)
                  : launchNarrow<kD, kWarps, false, 1>(a, stream, pdl);
}

// ---- Wide warps: 32 query rows per warp, Q in shared memory ------------------------------------
// With 16 rows per warp (the narrow kernel) every K/V B fragment read from shared memory (one
// ldmatrix.x4) feeds only two mma, so shared-memory bandwidth caps the kernel near half of
// mma.sync peak. The wide kernel gives each warp kMTiles = 2 m16 tiles (32 rows) that share every
// K and V fragment; the 32 x 128 f32 O accumulator (128 registers) leaves no room for Q fragments
// in registers, so the Q tile lives in shared memory (loaded once with cp.async) and is re-read
// with ldmatrix per k-step. Per row the arithmetic is exactly the narrow kernel's: the same 64-key
// tiles in the same order, the same k-step order within each mma chain, the same online-softmax
// expressions, and (causal) the same set of key tiles as the narrow kernel with 16-row tiles (a
// warp skips a tile whose first key is past its last row). So the two kernels are bit-identical,
// which keeps the launcher's size-based choice batch invariant.
constexpr int kWideMTiles = 2;  // m16 tiles per warp

// Shared-memory operands as 32-bit shared-window addresses (the wide kernel runs at the
// 255-register limit: no 64-bit generic pointers kept live for them).
__device__ __forceinline__ void cpAsync16To(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void ldsmX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsmX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <int kD, int kWarps, int kHeads, int kStages>
constexpr size_t attentionWideSmemBytes() {
  // K, V: [kStages][kN][kD + 8]; Q: [kHeads][kM][kD + 8] (bf16); softmax state:
  // [kWideMTiles][threads] float4 (m0, m1, l0, l1).
  return (size_t{2} * kStages * kKeysPerTile + size_t{kHeads} * 16 * kWideMTiles * kWarps) *
             (kD + 8) * sizeof(__nv_bfloat16) +
         size_t{kWideMTiles} * 32 * kWarps * kHeads * 16;
}

// The running softmax state lives in shared memory, not registers (volatile: loaded where used).
__device__ __forceinline__ void ldsF32x4(uint32_t addr, float& x, float& y, float& z, float& w) {
  asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n"
               : "=f"(x), "=f"(y), "=f"(z), "=f"(w)
               : "r"(addr));
}
__device__ __forceinline__ void stsF32x4(uint32_t addr, float x, float y, float z, float w) {
  asm volatile("st.shared.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "f"(x), "f"(y), "f"(z),
               "f"(w));
}

template <int kD, int kWarps, bool kCausal, int kHeads, int kStages>
__global__ void __launch_bounds__(32 * kWarps * kHeads, 1) attentionKernelWide(AttentionArgs a) {
  pdlWait();  // [TAG_PDL]
  static_assert(kStages == 2 || kStages == 3, "K/V pipeline depth");
  constexpr int kMT = kWideMTiles;
  constexpr int kWarpRows = 16 * kMT;     // query rows per warp
  constexpr int kM = kWarpRows * kWarps;  // query rows per block and head
  constexpr int kN = kKeysPerTile;
  constexpr int kRow = kD + 8;  // padded smem row (elements): conflict-free ldmatrix
  constexpr int kKSteps = kD / 16;
  constexpr int kDTiles = kD / 8;
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kThreads = 32 * kWarps * kHeads;
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr uint32_t kEl = sizeof(__nv_bfloat16);
  const uint32_t s_k = smemAddr(smem);                   // [kStages][kN][kRow]
  const uint32_t s_v = s_k + kStages * kN * kRow * kEl;  // [kStages][kN][kRow]
  const uint32_t s_q = s_v + kStages * kN * kRow * kEl;  // [kHeads][kM][kRow]
  // This thread's softmax state of m16 tile mt: s_ml + mt * kThreads * 16.
  const uint32_t s_ml = s_q + kHeads * kM * kRow * kEl + threadIdx.x * 16;

  int seq = 0, q0 = 0;
  if (!findAttentionTile(a.cu_seqlens, a.num_seqs, blockIdx.x, kM, seq, q0)) return;
  const int start = a.cu_seqlens[seq];
  const int len = a.cu_seqlens[seq + 1] - start;
  if (kCausal) q0 = ((len + kM - 1) / kM - 1) * kM - q0;  // longest tiles first
  const int head = static_cast<int>(threadIdx.x / (32 * kWarps));
  const int qh0 = blockIdx.y * kHeads;  // first q head of the block
  const int qh = qh0 + head;
  const int kvh = qh0 / (a.num_q_heads / a.num_kv_heads);  // kHeads divides the group
  const int warp = (threadIdx.x / 32) % kWarps;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t stride = static_cast<int64_t>(a.num_q_heads + 2 * a.num_kv_heads) * kD;
  const __nv_bfloat16* row_base = a.qkv + static_cast<int64_t>(start) * stride;
  const __nv_bfloat16* q_base = row_base + qh0 * kD;
  // K/V copy: this thread copies 16-byte column ld_c of rows ld_r + p * kRowsPerPass.
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0 && kN % kRowsPerPass == 0, "K/V copy shape");
  const int ld_r = static_cast<int>(threadIdx.x) / kChunksPerRow;
  const int ld_c = (static_cast<int>(threadIdx.x) % kChunksPerRow) * 8;
  const __nv_bfloat16* k_src = row_base + (a.num_q_heads + kvh) * kD + ld_c;  // V: + Hkv * kD

  // Q tiles of every head of the block (rows past len zero-filled), in the first cp.async group.
#pragma unroll 1
  for (int i = threadIdx.x; i < kHeads * kM * kChunksPerRow; i += kThreads) {
    const int hr = i / kChunksPerRow;  // head * kM + row
    const int c = (i % kChunksPerRow) * 8;
    const int row = q0 + hr % kM;
    const bool valid = row < len;
    cpAsync16To(s_q + (hr * kRow + c) * kEl,
                q_base + static_cast<int64_t>(valid ? row : 0) * stride + (hr / kM) * kD + c,
                valid);
  }

  const int kv_len = kCausal ? min(len, q0 + kM) : len;
  const int n_tiles = (kv_len + kN - 1) / kN;
  auto load_tile = [&](int j, int stage) {
#pragma unroll
    for (int p = 0; p < kN / kRowsPerPass; ++p) {
      const int r = ld_r + p * kRowsPerPass;
      const int key = j * kN + r;
      const bool valid = key < len;
      const __nv_bfloat16* src = k_src + static_cast<int64_t>(valid ? key : 0) * stride;
      const uint32_t dst = ((stage * kN + r) * kRow + ld_c) * kEl;
      cpAsync16To(s_k + dst, src, valid);
      cpAsync16To(s_v + dst, src + a.num_kv_heads * kD, valid);
    }
  };
  // Prologue: tiles 0 .. kStages - 2, one cp.async group each (the Q tiles join group 0);
  // iteration j then commits one group (tile j + kStages - 1, or empty), so group j holds tile j.
#pragma unroll
  for (int p = 0; p < kStages - 1; ++p) {
    if (p < n_tiles) load_tile(p, p);
    cpAsyncCommit();
  }

  const int w0 = q0 + warp * kWarpRows;  // first query row of this warp (sequence-relative)
  float o[kMT][kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  }
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
    stsF32x4(s_ml + mt * kThreads * 16, -INFINITY, -INFINITY, 0.f, 0.f);
  const float scale_log2 = a.scale * 1.4426950408889634f;
  // This lane's ldmatrix.x4 row addresses (matrix lane / 8, row lane % 8) for the A fragments of
  // Q (matrices: rows 0-7 / 8-15 x k 0-7, then k 8-15), the B fragments of K (keys 0-7 x k 0-7,
  // k 8-15, then keys 8-15) and the transposed B fragments of V (keys 0-7, keys 8-15, then the
  // next 8 columns); the loops below add compile-time offsets.
  const int mi = lane >> 3;
  const int mr = lane & 7;
  const uint32_t q_lane =
      s_q + ((head * kM + warp * kWarpRows + (mi & 1) * 8 + mr) * kRow + (mi >> 1) * 8) * kEl;
  const uint32_t k_lane = s_k + (((mi >> 1) * 8 + mr) * kRow + (mi & 1) * 8) * kEl;
  const uint32_t v_lane = s_v + (((mi & 1) * 8 + mr) * kRow + (mi >> 1) * 8) * kEl;

  for (int j = 0; j < n_tiles; ++j) {
    const int stage = j % kStages;
    // Refills the stage computed in iteration j - 1 (released by its trailing barrier).
    if (j + kStages - 1 < n_tiles) load_tile(j + kStages - 1, (j + kStages - 1) % kStages);
    cpAsyncCommit();
    cpAsyncWait<kStages - 1>();  // groups 0 .. j are complete: tile j has landed
    __syncthreads();
    const int key0 = j * kN;
    // Warp-uniform. Causal: a tile whose first key is past the warp's last row is skipped (its
    // keys are masked for every row of the warp); key0 and w0 are multiples of 32, so a tile that
    // is not skipped has a valid key for every row of both m16 tiles, exactly as in the narrow
    // kernel's 16-row tiles.
    if (!kCausal || key0 <= w0 + kWarpRows - 1) {
      const uint32_t k_s = k_lane + stage * (kN * kRow * kEl);
      const uint32_t v_s = v_lane + stage * (kN * kRow * kEl);

      float s[kMT][kN / 8][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int i = 0; i < kN / 8; ++i)
          s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
      }
      // S = Q K^T: per k-step, the Q A fragments of both m16 tiles, then every K B fragment once
      // for both (each S element still accumulates over k-steps in order 0, 1, ...). Unrolled by
      // 2 only: a full unroll spills (ptxas hoists the next k-steps' fragments).
#pragma unroll 2
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t qa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          ldsmX4(qa[mt], q_lane + (mt * 16 * kRow + kk * 16) * kEl);
        }
#pragma unroll
        for (int nt2 = 0; nt2 < kN / 16; ++nt2) {
          uint32_t b[4];
          ldsmX4(b, k_s + (nt2 * 16 * kRow + kk * 16) * kEl);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mmaBf16(s[mt][2 * nt2], qa[mt], b[0], b[1]);
            mmaBf16(s[mt][2 * nt2 + 1], qa[mt], b[2], b[3]);
          }
        }
      }

      // Every key of the tile is valid for every row of the warp (w0 is its first row).
      const bool full = key0 + kN <= len && (!kCausal || key0 + kN - 1 <= w0);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const int r0 = w0 + mt * 16 + g;
        const int r1 = r0 + 8;
        float mx0 = -INFINITY, mx1 = -INFINITY;
        if (full) {
#pragma unroll
          for (int nt = 0; nt < kN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              s[mt][nt][e] = __fmul_rn(s[mt][nt][e], scale_log2);
              s[mt][nt][2 + e] = __fmul_rn(s[mt][nt][2 + e], scale_log2);
              mx0 = fmaxf(mx0, s[mt][nt][e]);
              mx1 = fmaxf(mx1, s[mt][nt][2 + e]);
            }
          }
        } else {
          // Key key0 + 2t + c (c = 8 nt + e) is valid for row r iff c <= lim (key < len and,
          // causal, key <= r): one compare with a constant per element.
          const int lim0 = (kCausal ? min(r0, len - 1) : len - 1) - key0 - 2 * t;
          const int lim1 = (kCausal ? min(r1, len - 1) : len - 1) - key0 - 2 * t;
#pragma unroll
          for (int nt = 0; nt < kN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const bool ok0 = nt * 8 + e <= lim0;
              const bool ok1 = nt * 8 + e <= lim1;
              s[mt][nt][e] = ok0 ? __fmul_rn(s[mt][nt][e], scale_log2) : -INFINITY;
              s[mt][nt][2 + e] = ok1 ? __fmul_rn(s[mt][nt][2 + e], scale_log2) : -INFINITY;
              mx0 = fmaxf(mx0, s[mt][nt][e]);
              mx1 = fmaxf(mx1, s[mt][nt][2 + e]);
            }
          }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        float m0, m1, l0, l1;
        ldsF32x4(s_ml + mt * kThreads * 16, m0, m1, l0, l1);
        const float mn0 = fmaxf(m0, mx0);
        const float mn1 = fmaxf(m1, mx1);
        const float base0 = mn0 == -INFINITY ? 0.f : mn0;  // a row with no valid key yet
        const float base1 = mn1 == -INFINITY ? 0.f : mn1;
        const float alpha0 = exp2f(m0 - base0);
        const float alpha1 = exp2f(m1 - base1);
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < kN / 8; ++nt) {
          s[mt][nt][0] = exp2f(s[mt][nt][0] - base0);
          s[mt][nt][1] = exp2f(s[mt][nt][1] - base0);
          s[mt][nt][2] = exp2f(s[mt][nt][2] - base1);
          s[mt][nt][3] = exp2f(s[mt][nt][3] - base1);
          rs0 += s[mt][nt][0] + s[mt][nt][1];
          rs1 += s[mt][nt][2] + s[mt][nt][3];
        }
        stsF32x4(s_ml + mt * kThreads * 16, mn0, mn1, __fmaf_rn(l0, alpha0, rs0),
                 __fmaf_rn(l1, alpha1, rs1));
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[mt][dt][0] *= alpha0;
          o[mt][dt][1] *= alpha0;
          o[mt][dt][2] *= alpha1;
          o[mt][dt][3] *= alpha1;
        }
      }

      // O += P V: every V B fragment once for both m16 tiles.
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        uint32_t pa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          pa[mt][0] = packBf16x2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = packBf16x2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = packBf16x2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = packBf16x2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dt2 = 0; dt2 < kDTiles / 2; ++dt2) {
          uint32_t b[4];
          ldsmX4Trans(b, v_s + (kk * 16 * kRow + dt2 * 16) * kEl);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mmaBf16(o[mt][2 * dt2], pa[mt], b[0], b[1]);
            mmaBf16(o[mt][2 * dt2 + 1], pa[mt], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // this stage is refilled in the next iteration
  }

  const int64_t out_stride = static_cast<int64_t>(a.num_q_heads) * kD;
  __nv_bfloat16* o_base = a.out + static_cast<int64_t>(start) * out_stride + qh * kD;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    float m0, m1, l0, l1;
    ldsF32x4(s_ml + mt * kThreads * 16, m0, m1, l0, l1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f;
    const float inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    const int r0 = w0 + mt * 16 + g;
    const int r1 = r0 + 8;
    if (r0 < len) {
      uint32_t* p =
          reinterpret_cast<uint32_t*>(o_base + static_cast<int64_t>(r0) * out_stride + 2 * t);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        p[dt * 4] = packBf16x2(o[mt][dt][0] * inv0, o[mt][dt][1] * inv0);
      }
    }
    if (r1 < len) {
      uint32_t* p =
          reinterpret_cast<uint32_t*>(o_base + static_cast<int64_t>(r1) * out_stride + 2 * t);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        p[dt * 4] = packBf16x2(o[mt][dt][2] * inv1, o[mt][dt][3] * inv1);
      }
    }
  }
}

template <int kD, int kWarps, bool kCausal, int kHeads, int kStages>
Status launchWide(const AttentionArgs& a, cudaStream_t stream, bool pdl) {
  constexpr int kM = 16 * kWideMTiles * kWarps;
  constexpr size_t smem = attentionWideSmemBytes<kD, kWarps, kHeads, kStages>();
  static bool configured = false;  // [TAG_ATTN_SMEM] one attribute call per instance
  if (!configured) {
    CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(attentionKernelWide<kD, kWarps, kCausal, kHeads, kStages>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = true;
  }
  const int64_t tiles = (a.num_tokens + kM - 1) / kM + a.num_seqs;
  dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_q_heads / kHeads));
  CUDA_RETURN_IF_ERROR(launchPdl(pdl, attentionKernelWide<kD, kWarps, kCausal, kHeads, kStages>,
                                 grid, dim3(kWarps * kHeads * 32), smem, stream, a));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

// The checks every variant shares.
Status checkArgs(const AttentionArgs& a) {
  if (a.head_dim != 64 && a.head_dim != 128)
    return unimplemented("attention: head_dim must be 64 or 128");
  if (a.num_q_heads <= 0 || a.num_kv_heads <= 0 || a.num_q_heads % a.num_kv_heads != 0)
    return invalidArgument("attention: num_kv_heads must divide num_q_heads");
  if (a.num_tokens > (1LL << 30)) return invalidArgument("attention: too many tokens");
  if ((reinterpret_cast<uintptr_t>(a.qkv) | reinterpret_cast<uintptr_t>(a.out)) % 16 != 0)
    return invalidArgument("attention: qkv and out must be 16-byte aligned");
  return okStatus();
}

}  // namespace

const char* attentionVariantName(AttentionVariant v) {
  static const char* const kNames[] = {"narrow16", "narrow64",  "wide64",     "wide128",
                                       "sm90",     "sm90basic", "sm90cpasync"};  // 1..7
  const int i = static_cast<int>(v) - 1;
  return i >= 0 && i < 7 ? kNames[i] : "unknown";
}

Status checkAttentionVariant(const AttentionArgs& a, AttentionVariant v) {
  RETURN_IF_ERROR(checkArgs(a));
  if (a.out_fp8 != nullptr && !attentionVariantIsSm90(v)) {
    return unimplemented(std::string("attention: variant ") + attentionVariantName(v) +
                         " has no fp8 output (the Hopper variants do)");
  }
  switch (v) {
    case AttentionVariant::kNarrow16:
    case AttentionVariant::kNarrow64:
      return okStatus();
    case AttentionVariant::kWide64:
      if ((a.num_q_heads / a.num_kv_heads) % 2 != 0) {
        return unimplemented(
            "attention: variant wide64 needs an even GQA group (q heads per kv "
            "head), got " +
            std::to_string(a.num_q_heads / a.num_kv_heads));
      }
      [[fallthrough]];
    case AttentionVariant::kWide128:
      if (a.head_dim != 128) {
        return unimplemented(std::string("attention: variant ") + attentionVariantName(v) +
                             " needs head_dim 128, got " + std::to_string(a.head_dim));
      }
      return okStatus();
    case AttentionVariant::kSm90:
    case AttentionVariant::kSm90Basic:
    case AttentionVariant::kSm90CpAsync:
      return checkAttentionSm90(a, attentionVariantName(v));
  }
  return invalidArgument("attention: unknown variant " + std::to_string(static_cast<int>(v)));
}

Result<AttentionVariant> selectAttentionVariant(const AttentionArgs& a, AttentionPolicy policy,
                                                int sm_count) {
  RETURN_IF_ERROR(checkArgs(a));
  if (policy != AttentionPolicy::kAuto && policy != AttentionPolicy::kNarrow &&
      policy != AttentionPolicy::kSm90)
    return invalidArgument("attention: unknown policy " + std::to_string(static_cast<int>(policy)));
  if (policy == AttentionPolicy::kSm90 && a.head_dim == 128) {
    // Every size, so that a row's result does not depend on its batch; a device or driver that
    // cannot run it is an error here, not a silent fallback.
    RETURN_IF_ERROR(checkAttentionSm90(a, "sm90"));
    return AttentionVariant::kSm90;
  }
  // Decode-like (few query tiles): 16-row tiles (one warp) spread the work over more blocks.
  const int64_t tiles64 = (a.num_tokens + 63) / 64 * a.num_q_heads;
  const bool decode_like = tiles64 < 2 * static_cast<int64_t>(sm_count);
  if (policy == AttentionPolicy::kNarrow || a.head_dim != 128 || decode_like) {
    // Bit-identical to the wide kernel, so the choice stays batch invariant.
    return decode_like ? AttentionVariant::kNarrow16 : AttentionVariant::kNarrow64;
  }
  // Wide 64-row shared tiles (2 warps x 2 heads, two blocks per SM) for every prefill-like size:
  // on the H200 (bench/results/gpu-embed-2026-11-30-h200-s3) they matched or beat the 128-row
  // tiles and the narrow kernel at every Qwen3 shape timed (e.g. causal 100x512: 543 us vs
  // narrow 697; 4x1024: 106 vs 114; 1x4096: 359 vs 358), while 128-row shared tiles (255
  // registers, one block per SM) lost to the narrow kernel at 1x4096 (395 us). An odd group runs
  // one head per block with 128 rows: the 2-warp, one-head instance spilled registers (its K/V
  // copy loop is twice as long) and only odd groups would need it.
  return (a.num_q_heads / a.num_kv_heads) % 2 == 0 ? AttentionVariant::kWide64
                                                   : AttentionVariant::kWide128;
}

Status launchAttentionVariant(const AttentionArgs& a, cudaStream_t stream, AttentionVariant v,
                              bool pdl) {
  if (a.num_tokens == 0 || a.num_seqs == 0) return okStatus();
  RETURN_IF_ERROR(checkAttentionVariant(a, v));
  switch (v) {
    case AttentionVariant::kNarrow16:
      return a.head_dim == 128 ? dispatchNarrow<128, 1>(a, stream, pdl)
                               : dispatchNarrow<64, 1>(a, stream, pdl);
    case AttentionVariant::kNarrow64:
      return a.head_dim == 128 ? dispatchNarrow<128, 4>(a, stream, pdl)
                               : dispatchNarrow<64, 4>(a, stream, pdl);
    case AttentionVariant::kWide64:
      return a.causal ? launchWide<128, 2, true, 2, 2>(a, stream, pdl)
                      : launchWide<128, 2, false, 2, 2>(a, stream, pdl);
    case AttentionVariant::kWide128:
      return a.causal ? launchWide<128, 4, true, 1, 2>(a, stream, pdl)
                      : launchWide<128, 4, false, 1, 2>(a, stream, pdl);
    case AttentionVariant::kSm90:
      return launchAttentionSm90(a, stream, Sm90Schedule::kPipelined, pdl);
    case AttentionVariant::kSm90Basic:
      return launchAttentionSm90(a, stream, Sm90Schedule::kBasic, pdl);
    case AttentionVariant::kSm90CpAsync:
      return launchAttentionSm90(a, stream, Sm90Schedule::kBasicCpAsync, pdl);
  }
  return invalidArgument("attention: unknown variant " + std::to_string(static_cast<int>(v)));
}

Status launchAttention(const AttentionArgs& a, cudaStream_t stream, AttentionPolicy policy,
                       bool pdl) {
  if (a.num_tokens == 0 || a.num_seqs == 0) return okStatus();
  ASSIGN_OR_RETURN(AttentionVariant v, selectAttentionVariant(a, policy, smCount()));
  return launchAttentionVariant(a, stream, v, pdl);
}

}  // namespace garden::rose::cuda
