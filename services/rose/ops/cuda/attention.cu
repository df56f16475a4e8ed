#include <cmath>

#include "services/rose/ops/cuda/attention.cuh"
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

// Finds the (sequence, first query row) of query tile `tile` when every sequence is cut into
// ceil(len / kM) tiles, in order. Warp-cooperative scan over cu_seqlens (32 sequences a step).
__device__ bool findTile(const int32_t* cu, int num_seqs, int tile, int kM, int& seq, int& q0) {
  const int lane = threadIdx.x & 31;
  int base = 0;
  for (int s0 = 0; s0 < num_seqs; s0 += 32) {
    const int s = s0 + lane;
    int n = 0;
    if (s < num_seqs) n = (cu[s + 1] - cu[s] + kM - 1) / kM;
    int inc = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    const int total = __shfl_sync(0xffffffffu, inc, 31);
    if (tile < base + total) {
      const unsigned hit = __ballot_sync(0xffffffffu, base + inc > tile);
      const int l = __ffs(hit) - 1;
      const int excl = __shfl_sync(0xffffffffu, inc - n, l);
      seq = s0 + l;
      q0 = (tile - base - excl) * kM;
      return true;
    }
    base += total;
  }
  return false;
}

// kWarps warps x 16 query rows each = kM rows per block and q head. Per warp: S (16 x 64) = Q K^T
// with Q fragments held in registers; P = exp2(S - m) in registers reused as the A operand of P V.
// kV2 (the default kernel, AttentionKernel::kV2) changes only the schedule, never a row's
// arithmetic, so both variants give bit-identical results:
//   - kHeads q heads of one GQA group per block share each K/V tile in shared memory (kHeads x
//     kWarps warps; half the K/V loads per FLOP for Qwen3's 2 q heads per kv head);
//   - the causal/length mask is applied only to the tiles that need it (the last one, and the
//     diagonal ones of a causal warp);
//   - causal query tiles run longest-first within a sequence (fewer stragglers in the last wave).
template <int kD, int kWarps, bool kCausal, int kHeads = 1, bool kV2 = false>
__global__ void __launch_bounds__(32 * kWarps * kHeads) attentionKernel(AttentionArgs a) {
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
  if (!findTile(a.cu_seqlens, a.num_seqs, blockIdx.x, kM, seq, q0)) return;
  const int start = a.cu_seqlens[seq];
  const int len = a.cu_seqlens[seq + 1] - start;
  if (kV2 && kCausal) q0 = ((len + kM - 1) / kM - 1) * kM - q0;  // longest tiles first
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
    const bool full = kV2 && key0 + kN <= len && (!kCausal || key0 + kN - 1 <= q0 + warp * 16);
    if (full) {
#pragma unroll
      for (int nt = 0; nt < kN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          s[nt][e] = s[nt][e] * scale_log2;
          s[nt][2 + e] = s[nt][2 + e] * scale_log2;
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
          s[nt][e] = ok0 ? s[nt][e] * scale_log2 : -INFINITY;
          s[nt][2 + e] = ok1 ? s[nt][2 + e] * scale_log2 : -INFINITY;
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
    l0 = l0 * alpha0 + rs0;
    l1 = l1 * alpha1 + rs1;
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

template <int kD, int kWarps, bool kCausal, int kHeads, bool kV2>
Status launchInstance(const AttentionArgs& a, cudaStream_t stream) {
  constexpr int kM = 16 * kWarps;
  constexpr size_t smem = attentionSmemBytes<kD>();
  static bool configured = false;  // [TAG_ATTN_SMEM] one attribute call per instance
  if (!configured) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(attentionKernel<kD, kWarps, kCausal, kHeads, kV2>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
    configured = true;
  }
  // Upper bound on tiles: sum ceil(len / kM) <= ceil(T / kM) + num_seqs. Extra blocks exit.
  const int64_t tiles = (a.num_tokens + kM - 1) / kM + a.num_seqs;
  dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_q_heads / kHeads));
  attentionKernel<kD, kWarps, kCausal, kHeads, kV2>
      <<<grid, kWarps * kHeads * 32, smem, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

template <int kD, int kWarps>
Status dispatchVariant(const AttentionArgs& a, cudaStream_t stream, AttentionKernel variant) {
  const int group = a.num_q_heads / a.num_kv_heads;
  if (variant == AttentionKernel::kV1) {
    return a.causal ? launchInstance<kD, kWarps, true, 1, false>(a, stream)
                    : launchInstance<kD, kWarps, false, 1, false>(a, stream);
  }
  if (group % 2 == 0) {
    return a.causal ? launchInstance<kD, kWarps, true, 2, true>(a, stream)
                    : launchInstance<kD, kWarps, false, 2, true>(a, stream);
  }
  return a.causal ? launchInstance<kD, kWarps, true, 1, true>(a, stream)
                  : launchInstance<kD, kWarps, false, 1, true>(a, stream);
}

template <int kD>
Status dispatchRows(const AttentionArgs& a, cudaStream_t stream, int rows,
                    AttentionKernel variant) {
  if (rows == 16) return dispatchVariant<kD, 1>(a, stream, variant);
  return dispatchVariant<kD, 4>(a, stream, variant);
}

AttentionKernel g_default_kernel = AttentionKernel::kV2;

}  // namespace

void setDefaultAttentionKernel(AttentionKernel k) {
  g_default_kernel = k == AttentionKernel::kDefault ? AttentionKernel::kV2 : k;
}
AttentionKernel defaultAttentionKernel() { return g_default_kernel; }

Status launchAttention(const AttentionArgs& a, cudaStream_t stream, int force_rows,
                       AttentionKernel kernel) {
  if (a.num_tokens == 0 || a.num_seqs == 0) return okStatus();
  if (a.head_dim != 64 && a.head_dim != 128)
    return unimplemented("attention: head_dim must be 64 or 128");
  if (a.num_q_heads <= 0 || a.num_kv_heads <= 0 || a.num_q_heads % a.num_kv_heads != 0)
    return invalidArgument("attention: num_kv_heads must divide num_q_heads");
  if (a.num_tokens > (1LL << 30)) return invalidArgument("attention: too many tokens");
  if ((reinterpret_cast<uintptr_t>(a.qkv) | reinterpret_cast<uintptr_t>(a.out)) % 16 != 0)
    return invalidArgument("attention: qkv and out must be 16-byte aligned");
  if (force_rows != 0 && force_rows != 16 && force_rows != 64)
    return invalidArgument("attention: force_rows must be 0, 16 or 64");
  int rows = force_rows;
  if (rows == 0) {
    // Decode-like (few query tiles): 16-row tiles (one warp) spread the work over more blocks.
    const int64_t tiles64 = (a.num_tokens + 63) / 64 * a.num_q_heads;
    rows = tiles64 < 2 * smCount() ? 16 : 64;
  }
  const AttentionKernel k = kernel == AttentionKernel::kDefault ? g_default_kernel : kernel;
  return a.head_dim == 128 ? dispatchRows<128>(a, stream, rows, k)
                           : dispatchRows<64>(a, stream, rows, k);
}

}  // namespace garden::rose::cuda
