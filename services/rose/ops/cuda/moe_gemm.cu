#include <cooperative_groups.h>

#include <algorithm>
#include <type_traits>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/moe_gemm.cuh"
#include "services/rose/ops/cuda/mxfp4_tiles.h"
#include "services/rose/ops/cuda/mxfp4_unit.cuh"

namespace garden::rose::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kBK = kMoeGemmTileK;    // 64
constexpr int kPackN = kMoeGemmTileN;  // 128: rows of one packed MXFP4 tile [TAG_MXFP4_TILED]
constexpr int kRowS = kBK + 8;  // padded smem row (bf16 elements): conflict-free ldmatrix

template <int kBM, int kBN, int kStages, bool kMx>
constexpr size_t moeGemmSmemBytes() {
  size_t bytes = size_t{kStages} * kBM * kRowS * 2;  // A stages
  if (kMx) {
    bytes += size_t{kStages} * (kBN * 32 + kBN * 2);  // raw codes + scales per stage
    bytes += size_t{kBN} * kRowS * 2;                 // dequantized B tile
  } else {
    bytes += size_t{kStages} * kBN * kRowS * 2;  // B stages
  }
  return bytes;
}

// Block: kWM x kWN warps, each kMT m16 tiles x kNT n8 tiles; block tile kBM x kBN (32 or 128;
// a 32-row tile reads a quarter of a packed 128-row MXFP4 tile), K tiles of 64, kStages-deep
// cp.async pipeline. Every configuration runs the same mma chain per output element (K tiles in
// order, k16 steps in order), so a row's bits do not depend on the configuration. kSliced (the
// block_m 16 instance): the chain restarts from zero at each fixed K slice boundary and the
// slices are summed in order [TAG_MOE_K_SLICES], as the decode kernel does.
template <typename T, int kWM, int kWN, int kMT, int kNT, int kStages, bool kMx, MoeGemmEpilogue kEpi,
          bool kSliced, bool kFastScales = false>
// Two 256-thread blocks per SM (the register budget that keeps them: <= 128 per thread).
__global__ void __launch_bounds__(kWM * kWN * 32, kWM * kWN == 8 ? 2 : 1) moeGemmKernel(MoeGemmArgs a) {
  constexpr int kThreads = kWM * kWN * 32;
  constexpr int kBM = kWM * kMT * 16;
  constexpr int kBN = kWN * kNT * 8;
  static_assert(kBN == 32 || kBN == kPackN, "block N tile must be 32 or 128");
  static_assert(kNT % 2 == 0, "n8 tiles come in pairs (ldmatrix.x4)");
  extern __shared__ __align__(16) unsigned char smem[];
  T* s_a = reinterpret_cast<T*>(smem);  // [kStages][kBM][kRowS]
  unsigned char* rest = smem + size_t{kStages} * kBM * kRowS * 2;
  uint8_t* s_codes = rest;                                   // kMx: [kStages][kBN * 32]
  uint8_t* s_scales = rest + kStages * kBN * 32;             // kMx: [kStages][kBN * 2]
  T* s_bdq = reinterpret_cast<T*>(s_scales + kStages * kBN * 2);  // kMx: [kBN][kRowS]
  T* s_b = reinterpret_cast<T*>(rest);  // !kMx: [kStages][kBN][kRowS]

  pdlWait();  // [TAG_PDL_GRAPH] the tiles (align) and A are the previous kernels' outputs
  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) return;
  const int e = a.tile_expert[tile];
  if (e < 0 || e >= a.num_experts) return;
  const int nt_blk = blockIdx.y;
  const int n0 = nt_blk * kBN;
  const int m0 = tile * kBM;
  const int kt_count = (a.k + kBK - 1) / kBK;
  const int pack_tiles = (a.n + kPackN - 1) / kPackN;  // 128-row tiles of the packed layout
  const int pack_row0 = n0 % kPackN;                    // this block's first row in its pack tile
  const int tid = threadIdx.x;
  constexpr bool fast_scales = kFastScales;  // every scale <= 128 (the launcher checked)

  auto load_stage = [&](int kt, int slot) {
    T* sa = s_a + slot * kBM * kRowS;
    for (int i = tid; i < kBM * (kBK / 8); i += kThreads) {
      const int r = i / (kBK / 8);
      const int c = (i % (kBK / 8)) * 8;
      const int pr = m0 + r;
      const int src = a.a_rows != nullptr ? a.a_rows[pr] : pr;
      const int kk = kt * kBK + c;
      const bool valid = src >= 0 && kk < a.k;
      const T* p = reinterpret_cast<const T*>(a.a) + (valid ? static_cast<int64_t>(src) * a.k + kk : 0);
      cpAsync16(sa + r * kRowS + c, p, valid);
    }
    if constexpr (kMx) {
      const int64_t tb = (static_cast<int64_t>(e) * pack_tiles + n0 / kPackN) * kt_count + kt;
      const uint8_t* cs = a.codes + tb * (kPackN * 32) + pack_row0 * 32;
      const uint8_t* ss = a.scales + tb * (kPackN * 2) + pack_row0 * 2;
      for (int i = tid; i < kBN * 32 / 16; i += kThreads)
        cpAsync16(s_codes + slot * kBN * 32 + i * 16, cs + i * 16, true);
      for (int i = tid; i < kBN * 2 / 16; i += kThreads)
        cpAsync16(s_scales + slot * kBN * 2 + i * 16, ss + i * 16, true);
    } else {
      T* sb = s_b + slot * kBN * kRowS;
      for (int i = tid; i < kBN * (kBK / 8); i += kThreads) {
        const int r = i / (kBK / 8);
        const int c = (i % (kBK / 8)) * 8;
        const int n = n0 + r;
        const int kk = kt * kBK + c;
        const bool valid = n < a.n && kk < a.k;
        const T* p =
            reinterpret_cast<const T*>(a.w) + (valid ? (static_cast<int64_t>(e) * a.n + n) * a.k + kk : 0);
        cpAsync16(sb + r * kRowS + c, p, valid);
      }
    }
  };

  float acc[kMT][kNT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
  // kSliced: the slices' sum (acc then holds the current slice's chain).
  const MoeKSlicing sl = kSliced ? moeKSlicing(kt_count, a.k_slices) : MoeKSlicing{kt_count, 1};
  float tot[kSliced ? kMT : 1][kSliced ? kNT : 1][4];
  if constexpr (kSliced) {
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int j = 0; j < kNT; ++j) tot[i][j][0] = tot[i][j][1] = tot[i][j][2] = tot[i][j][3] = 0.f;
  }

  const int warp = tid / 32;
  const int lane = tid & 31;
  const int wm = warp / kWN;
  const int wn = warp % kWN;
  const int row_base = wm * kMT * 16;
  const int col_base = wn * kNT * 8;
  const int mi = lane >> 3;
  const int mr = lane & 7;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kt_count) load_stage(s, s);
    cpAsyncCommit();
  }
  for (int kt = 0; kt < kt_count; ++kt) {
    cpAsyncWait<kStages - 2>();
    __syncthreads();
    {
      const int nk = kt + kStages - 1;
      if (nk < kt_count) load_stage(nk, nk % kStages);
      cpAsyncCommit();
    }
    const int slot = kt % kStages;
    const T* sb;
    if constexpr (kMx) {
      const uint8_t* codes = s_codes + slot * kBN * 32;
      const uint8_t* scales = s_scales + slot * kBN * 2;
      // One unit = one lane's 16 bytes of a 16-row group (mxfp4_tiles.h): four words (k16 steps),
      // four fragment registers each, scattered back to [row][k] for the ldmatrix B loads.
      for (int u = tid; u < kBN * 2; u += kThreads) {
        mxfp4DequantUnit<fast_scales, T>(u, codes, scales, [&](int row, int k, uint32_t bits) {
          *reinterpret_cast<uint32_t*>(s_bdq + row * kRowS + k) = bits;
        });
      }
      __syncthreads();
      sb = s_bdq;
    } else {
      sb = s_b + slot * kBN * kRowS;
    }
    const T* sa = s_a + slot * kBM * kRowS;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        ldmatrixX4(af[mt], sa + (row_base + mt * 16 + (lane & 15)) * kRowS + ks * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int nt2 = 0; nt2 < kNT / 2; ++nt2) {
        uint32_t b[4];
        ldmatrixX4(b, sb + (col_base + nt2 * 16 + (mi >> 1) * 8 + mr) * kRowS + ks * 16 + (mi & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma16<T>(acc[mt][2 * nt2], af[mt], b[0], b[1]);
          mma16<T>(acc[mt][2 * nt2 + 1], af[mt], b[2], b[3]);
        }
      }
    }
    if constexpr (kSliced) {
      if (sl.count > 1 && ((kt + 1) % sl.len == 0 || kt + 1 == kt_count)) {  // a slice ends
#pragma unroll
        for (int i = 0; i < kMT; ++i)
#pragma unroll
          for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              tot[i][j][q] += acc[i][j][q];
              acc[i][j][q] = 0.f;
            }
      }
    }
  }
  cpAsyncWait<0>();
  pdlTrigger();  // [TAG_PDL_GRAPH] the products are done: the next kernel may be scheduled

  const int g8 = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const int64_t ra = m0 + row_base + mt * 16 + g8;
    const int64_t rb = ra + 8;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int col = n0 + col_base + nt * 8 + 2 * t4;
      if (col >= a.n) continue;
      float b0 = 0.f, b1 = 0.f;
      if (a.bias != nullptr) {
        b0 = toF32(reinterpret_cast<const T*>(a.bias)[static_cast<int64_t>(e) * a.n + col]);
        b1 = toF32(reinterpret_cast<const T*>(a.bias)[static_cast<int64_t>(e) * a.n + col + 1]);
      }
      const float* c = acc[mt][nt];
      if constexpr (kSliced) {
        if (sl.count > 1) c = tot[mt][nt];
      }
      if constexpr (kEpi == MoeGemmEpilogue::kSwiglu) {
        const float lim = a.swiglu_limit, alpha = a.swiglu_alpha;
        const int half_n = a.n / 2;
        reinterpret_cast<T*>(a.out)[ra * half_n + col / 2] =
            fromF32<T>(clampedSwiglu(c[0] + b0, c[1] + b1, lim, alpha));
        reinterpret_cast<T*>(a.out)[rb * half_n + col / 2] =
            fromF32<T>(clampedSwiglu(c[2] + b0, c[3] + b1, lim, alpha));
      } else {
        const float os = a.out_scale;  // [TAG_MOE_F16_OUT_SCALE]
        *reinterpret_cast<uint32_t*>(reinterpret_cast<T*>(a.out) + ra * a.n + col) =
            pack16x2<T>((c[0] + b0) * os, (c[1] + b1) * os);
        *reinterpret_cast<uint32_t*>(reinterpret_cast<T*>(a.out) + rb * a.n + col) =
            pack16x2<T>((c[2] + b0) * os, (c[3] + b1) * os);
      }
    }
  }
}

template <typename T, int kWM, int kWN, int kMT, int kNT, int kStages, bool kMx, MoeGemmEpilogue kEpi,
          bool kSliced, bool kFastScales = false>
Status launchInstance(const MoeGemmArgs& a, cudaStream_t stream) {
  constexpr int kBM = kWM * kMT * 16;
  constexpr int kBN = kWN * kNT * 8;
  constexpr size_t smem = moeGemmSmemBytes<kBM, kBN, kStages, kMx>();
  if constexpr (kMx && !kFastScales && std::is_same_v<T, f16>) {  // [TAG_ATTN_F16]
    if (a.mx_max_scale <= kMxfp4MaxDecodeScale)
      return launchInstance<T, kWM, kWN, kMT, kNT, kStages, kMx, kEpi, kSliced, true>(a, stream);
    return invalidArgument("moe_gemm: fp16 activations need every MXFP4 scale byte <= 128");
  } else {
  if constexpr (kMx && !kFastScales) {
    if (a.mx_max_scale <= kMxfp4MaxDecodeScale)
      return launchInstance<T, kWM, kWN, kMT, kNT, kStages, kMx, kEpi, kSliced, true>(a, stream);
  }
  auto kernel = moeGemmKernel<T, kWM, kWN, kMT, kNT, kStages, kMx, kEpi, kSliced, kFastScales>;
  static bool configured = false;  // one attribute call per instance (load time, not captured)
  if (!configured) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
    configured = true;
  }
  const dim3 grid(static_cast<unsigned>(a.max_tiles),
                  static_cast<unsigned>((a.n + kBN - 1) / kBN));
  CUDA_RETURN_IF_ERROR(launchPdlAlways(a.pdl, kernel, grid, dim3(kWM * kWN * 32), smem, stream, a));
  return okStatus();
  }
}


// The weight stream of one warp in the decode-shaped MXFP4 kernels: its 16-row group q of expert
// e, one 16-byte code load per lane per K tile and the E8M0 scale pairs of rows g and g + 8.
struct MxWarpStream {
  const uint8_t* cbase;
  const uint8_t* sbase;
  __device__ __forceinline__ MxWarpStream(const MoeGemmArgs& a, int e, int q, int lane, int kt_count) {
    const int pack_tiles = (a.n + kPackN - 1) / kPackN;
    const int64_t blk = (static_cast<int64_t>(e) * pack_tiles + q / 8) * kt_count;
    cbase = a.codes + blk * kMxTileBytes + (q % 8) * 512 + lane * 16;
    sbase = a.scales + blk * 256 + ((q % 8) * 16 + (lane >> 2)) * 2;
  }
  __device__ __forceinline__ void fetch(int kt, uint4& w, uint32_t& sa, uint32_t& sb) const {
    w = __ldg(reinterpret_cast<const uint4*>(cbase + static_cast<int64_t>(kt) * kMxTileBytes));
    const uint16_t* sp = reinterpret_cast<const uint16_t*>(sbase + static_cast<int64_t>(kt) * 256);
    sa = __ldg(sp);
    sb = __ldg(sp + 8);
  }
  // [TAG_MOE_L2_PREFETCH] Asks L2 for K tile kt of this warp's 16 rows: lanes 0-3 the four
  // 128-byte lines of its 512 code bytes, lane 4 the line holding its 32 scale bytes.
  __device__ __forceinline__ void prefetchL2(int kt, int lane) const {
    const uint8_t* p = nullptr;
    if (lane < 4) p = cbase - lane * 16 + lane * 128 + static_cast<int64_t>(kt) * kMxTileBytes;
    else if (lane == 4) p = sbase - 2 + static_cast<int64_t>(kt) * 256;  // lane 4: row g = 1
    if (p != nullptr) asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
  }
  // Fills a kDepth-deep register ring with K tiles kt0, kt0 + 1, ... (those below kt1).
  template <int kDepth>
  __device__ __forceinline__ void prime(int kt0, int kt1, uint4 (&wq)[kDepth],
                                        uint32_t (&sqa)[kDepth], uint32_t (&sqb)[kDepth]) const {
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
      if (kt0 + d < kt1) fetch(kt0 + d, wq[d], sqa[d], sqb[d]);
  }
};

// bf16x2 2^(s-1) of each scale byte of the pairs: sf[row g / g + 8][group 0 / 1]. Byte b of the
// pair into both halves' exponent: (s << 7 | s << 23) + (126 << 7) twice. T = fp16
// [TAG_ATTN_F16]: the fp16 pairs of 2^(s - 113) (mxfp4DecodeScaleF16Bits).
template <typename T>
__device__ __forceinline__ void mxScaleFactors(uint32_t sa, uint32_t sb, uint32_t (&sf)[2][2]) {
  if constexpr (std::is_same_v<T, f16>) {
#pragma unroll
    for (int hg = 0; hg < 2; ++hg) {
      sf[0][hg] = mxScalePairF16(sa, hg);
      sf[1][hg] = mxScalePairF16(sb, hg);
    }
  } else {
#pragma unroll
    for (int hg = 0; hg < 2; ++hg) {
      sf[0][hg] = (__byte_perm(sa, 0u, hg ? 0x1414u : 0x0404u) >> 1) + 0x3F003F00u;
      sf[1][hg] = (__byte_perm(sb, 0u, hg ? 0x1414u : 0x0404u) >> 1) + 0x3F003F00u;
    }
  }
}

// The mma A fragment of k16 step s of a tile from its packed word: exact bf16 weight values (T =
// fp16: the weights rounded once to fp16, mxfp4_tiles.h).
template <typename T>
__device__ __forceinline__ void mxFragment(const uint4& w, int s, const uint32_t (&sf)[2][2],
                                           uint32_t (&af)[4]) {
  const uint32_t word = s == 0 ? w.x : s == 1 ? w.y : s == 2 ? w.z : w.w;
#pragma unroll
  for (int j = 0; j < 4; ++j) af[j] = mul16x2Bits<T>(mxRegBits16<T>(word, j), sf[j & 1][s >> 1]);
}

// Stores one n8 token tile of a decode-shaped kernel's accumulators c (c0: row g, token 2t; c1:
// row g, token 2t + 1; c2/c3 the same for row g + 8) for weight rows n_base + g (+ 8), tokens
// tok0 and tok0 + 1: bias and the epilogue in f32, rounded once. Every lane of the warp calls it
// (the SwiGLU pairs row n with the up row n + 1 held by the lane of row g + 1).
template <typename T, MoeGemmEpilogue kEpi>
__device__ __forceinline__ void storeMoeTile(const MoeGemmArgs& a, int e, int n_base, int g,
                                             int64_t tok0, const float (&c)[4]) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int n = n_base + g + 8 * hr;
    const float v0 = c[2 * hr], v1 = c[2 * hr + 1];
    if constexpr (kEpi == MoeGemmEpilogue::kSwiglu) {
      // (gate, up) = rows (n, n + 1): the up value lives in the lane of row g + 1.
      const float u0 = __shfl_down_sync(0xffffffffu, v0, 4);
      const float u1 = __shfl_down_sync(0xffffffffu, v1, 4);
      if ((g & 1) == 0 && n + 1 < a.n) {
        float bg = 0.f, bu = 0.f;
        if (a.bias != nullptr) {
          bg = toF32(reinterpret_cast<const T*>(a.bias)[static_cast<int64_t>(e) * a.n + n]);
          bu = toF32(reinterpret_cast<const T*>(a.bias)[static_cast<int64_t>(e) * a.n + n + 1]);
        }
        const float lim = a.swiglu_limit, alpha = a.swiglu_alpha;
        const int half_n = a.n / 2;
        reinterpret_cast<T*>(a.out)[tok0 * half_n + n / 2] = fromF32<T>(clampedSwiglu(v0 + bg, u0 + bu, lim, alpha));
        reinterpret_cast<T*>(a.out)[(tok0 + 1) * half_n + n / 2] =
            fromF32<T>(clampedSwiglu(v1 + bg, u1 + bu, lim, alpha));
      }
    } else {
      if (n < a.n) {
        const float bn =
            a.bias != nullptr ? toF32(reinterpret_cast<const T*>(a.bias)[static_cast<int64_t>(e) * a.n + n]) : 0.f;
        reinterpret_cast<T*>(a.out)[tok0 * a.n + n] = fromF32<T>((v0 + bn) * a.out_scale);
        reinterpret_cast<T*>(a.out)[(tok0 + 1) * a.n + n] = fromF32<T>((v1 + bn) * a.out_scale);
      }
    }
  }
}

// Decode-shaped MXFP4 GEMM (block_m 16: few rows per expert). The weights are the mma A operand
// (one warp = 16 weight rows, read straight from the packed layout: one 16-byte load per lane
// per K tile, kDepth tiles in flight in registers, dequantized by shifts and one bf16 multiply),
// the tile's kTok (8 or 16) token rows are B (n8 tiles; kTok = 8 when no expert can have more
// than 8 rows, i.e. at most 8 tokens).
//
// K is cut into the fixed slices of moeKSlicing(kt, a.k_slices) [TAG_MOE_K_SLICES]: one CTA per
// (kRG row groups, slice), the slices of the same row groups forming one thread-block cluster.
// A CTA stages only its slice of the token rows (and only the rows that can be real:
// min(kTok, max_rows_per_expert)), so at decode sizes many CTAs fit on an SM: the weight stream of
// a T = 1 step is spread over k_slices x more warps, each with a k_slices x shorter chain — the
// lever against the latency-bound single chain (one warp over all of K) this kernel had before.
// Each warp accumulates its slice from zero (K tiles in order, k16 steps in order, one mma each);
// the partials go to shared memory, and after a cluster barrier rank 0 sums them in slice order
// ((0 + s0) + s1) + ... through distributed shared memory, then bias and epilogue in f32 — the
// same operations, on the same exact bf16 weight values, as the tiled kernel's block_m 16
// instance, so the bits equal it (the tests compare them). No workspace, no counters:
// graph-replayable as is. Needs every scale <= 128 (2^(s-1) representable); the launcher falls
// back to moeGemmKernel otherwise.
//
// kSteady: the K tiles whose kDepth-slot group and refills are all real run first in a loop with
// no branch inside the unrolled slots (the slot checks, the prefetch test and the second token
// tile's test each split the slots into basic blocks the scheduler could not overlap; at T = 1
// ncu saw 35 % of the stalls as fixed-latency waits at ~2.6 warps per scheduler), the refill
// addresses as immediate offsets from one pointer per group; the rest, and every tile when the
// L2 prefetch is on, in the checked loop. Same mmas in the same order: same bits.
template <typename T, int kRG, int kTok, int kDepth, MoeGemmEpilogue kEpi, bool kSteady = true>
__global__ void __launch_bounds__(kRG * 32) moeGemmMxDecodeKernel(MoeGemmArgs a, int slice_len,
                                                                   int slices, int rows_staged) {
  static_assert(kTok == 8 || kTok == 16, "token tile is one or two n8 tiles");
  extern __shared__ __align__(16) unsigned char smem[];
  pdlWait();  // [TAG_PDL_GRAPH] the tiles (align) and the rows are the previous kernels' outputs
  const int tile = blockIdx.y;
  // Uniform over a cluster (its CTAs share blockIdx.y): a whole cluster leaves together.
  if (tile >= *a.num_tiles) return;
  const int e = a.tile_expert[tile];
  if (e < 0 || e >= a.num_experts) return;
  const int kt_count = (a.k + kBK - 1) / kBK;
  const int rank = blockIdx.x % slices;  // == the cluster rank: clusters are (slices, 1, 1)
  const int kt0 = rank * slice_len;
  const int kt1 = min(kt_count, kt0 + slice_len);
  const int row_s = slice_len * kBK + 8;  // smem row stride (bf16): an odd multiple of 16 bytes
  T* s_x = reinterpret_cast<T*>(smem);  // [rows_staged][row_s]
  const size_t x_bytes = (static_cast<size_t>(rows_staged) * row_s * 2 + 15) / 16 * 16;
  float* s_part = reinterpret_cast<float*>(smem + x_bytes);  // [kRG warps][32 lanes][8]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m0 = tile * 16;  // block_m rows per tile; the first rows_staged may be real
  const int q = (blockIdx.x / slices) * kRG + warp;  // this warp's 16-row group
  const bool act = q * 16 < a.n;                     // warp-uniform
  const int g = lane >> 2, t = lane & 3;

  // Weight stream first (independent of the token rows), then the token rows into smem.
  const MxWarpStream ws(a, e, q, lane, kt_count);
  // The ring holds raw loads only (codes; the scale pairs of rows g and g + 8 in separate
  // registers): anything computed from a load here would stall the warp on it at issue time.
  uint4 wq[kDepth];
  uint32_t sqa[kDepth], sqb[kDepth];
  const int pf = a.l2_prefetch;  // [TAG_MOE_L2_PREFETCH] tiles beyond the ring
  if (act) {
    ws.prime(kt0, kt1, wq, sqa, sqb);
    for (int kt = kt0 + kDepth; kt < min(kt1, kt0 + kDepth + pf); ++kt) ws.prefetchL2(kt, lane);
  }
  // Token rows: each row's source once (a_rows, or in place where row_valid marks it real), then
  // only the real rows' slice is copied (K padding zero-filled). Rows past rows_staged are never
  // real; the ldmatrix lanes of those token columns read row 0 instead, and rows of the tile that
  // are padding hold whatever shared memory held: either only reaches its own output column, which
  // belongs to a padding row of the tile that nothing reads.
  __shared__ int32_t s_src[kTok];
  const int32_t* rmap = a.a_rows != nullptr ? a.a_rows : a.row_valid;
  if (tid < kTok) {
    const int pr = m0 + tid;
    s_src[tid] = a.a_rows != nullptr ? a.a_rows[pr] : (rmap == nullptr || rmap[pr] >= 0 ? pr : -1);
  }
  __syncthreads();
  const int width = (kt1 - kt0) * kBK;
  int valid = 0;
  for (int r = 0; r < rows_staged; ++r) {
    const int src = s_src[r];
    if (src < 0) continue;
    ++valid;
    for (int c = tid * 8; c < width; c += kRG * 32 * 8) {
      const int kk = kt0 * kBK + c;
      const bool ok = kk < a.k;
      cpAsync16(s_x + r * row_s + c, reinterpret_cast<const T*>(a.a) + (ok ? static_cast<int64_t>(src) * a.k + kk : 0), ok);
    }
  }
  cpAsyncCommit();
  cpAsyncWait<0>();
  __syncthreads();
  const bool two = kTok == 16 && valid > 8;  // uniform: the second n8 tile only with real rows

  float acc[2][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  const int mi = lane >> 3, mr = lane & 7;
  // ldmatrix.x4 rows: matrices (tokens 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15)
  // (kTok 8: matrices 2 and 3 repeat 0 and 1, unused).
  const int tok = min((kTok == 16 ? (mi >> 1) * 8 : 0) + mr, rows_staged - 1);
  const T* xrow = s_x + tok * row_s + (mi & 1) * 8;

  if (act) {
    int kb = kt0;
    if constexpr (kSteady) {
      if (pf == 0) {
        auto steady = [&](auto two_c) {
          constexpr bool kTwo = decltype(two_c)::value;
          for (; kb + 2 * kDepth <= kt1; kb += kDepth) {
            const uint8_t* cnext = ws.cbase + static_cast<int64_t>(kb + kDepth) * kMxTileBytes;
            const uint8_t* snext = ws.sbase + static_cast<int64_t>(kb + kDepth) * 256;
            const T* xk = xrow + (kb - kt0) * kBK;
#pragma unroll
            for (int d = 0; d < kDepth; ++d) {
              uint32_t sf[2][2];
              mxScaleFactors<T>(sqa[d], sqb[d], sf);
              uint32_t af[4][4];
#pragma unroll
              for (int s = 0; s < 4; ++s) mxFragment<T>(wq[d], s, sf, af[s]);
              wq[d] = __ldg(reinterpret_cast<const uint4*>(cnext + d * kMxTileBytes));
              const uint16_t* sp = reinterpret_cast<const uint16_t*>(snext + d * 256);
              sqa[d] = __ldg(sp);
              sqb[d] = __ldg(sp + 8);
#pragma unroll
              for (int s = 0; s < 4; ++s) {
                uint32_t b[4];
                ldmatrixX4(b, xk + d * kBK + s * 16);
                mma16<T>(acc[0], af[s], b[0], b[1]);
                if constexpr (kTwo) mma16<T>(acc[1], af[s], b[2], b[3]);
              }
            }
          }
        };
        if (two) {
          steady(std::true_type{});
        } else {
          steady(std::false_type{});
        }
      }
    }
    for (; kb < kt1; kb += kDepth) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int kt = kb + d;
        if (kt >= kt1) break;
        // The slot is dequantized whole, then refilled in place: no register copy of the
        // ring (the copies were ~30 % of the instructions at T = 1, ncu 2026-12-03).
        uint32_t sf[2][2];
        mxScaleFactors<T>(sqa[d], sqb[d], sf);
        uint32_t af[4][4];
#pragma unroll
        for (int s = 0; s < 4; ++s) mxFragment<T>(wq[d], s, sf, af[s]);
        if (kt + kDepth < kt1) ws.fetch(kt + kDepth, wq[d], sqa[d], sqb[d]);
        if (pf > 0 && kt + kDepth + pf < kt1) ws.prefetchL2(kt + kDepth + pf, lane);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          uint32_t b[4];
          ldmatrixX4(b, xrow + (kt - kt0) * kBK + s * 16);
          mma16<T>(acc[0], af[s], b[0], b[1]);
          if (two) mma16<T>(acc[1], af[s], b[2], b[3]);
        }
      }
    }
  }

  pdlTrigger();  // [TAG_PDL_GRAPH] the products are done: the next kernel may be scheduled
  // The slices' sum, in slice order, on rank 0 (every warp of every CTA reaches both barriers).
  if (slices > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    float* mine = s_part + (warp * 32 + lane) * 8;
    *reinterpret_cast<float4*>(mine) = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
    *reinterpret_cast<float4*>(mine + 4) = make_float4(acc[1][0], acc[1][1], acc[1][2], acc[1][3]);
    cluster.sync();  // every slice's partials are complete and visible
    if (rank == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
      for (int r = 0; r < slices; ++r) {
        const float* p = cluster.map_shared_rank(mine, r);
        const float4 v0 = *reinterpret_cast<const float4*>(p);
        const float4 v1 = *reinterpret_cast<const float4*>(p + 4);
        acc[0][0] += v0.x;
        acc[0][1] += v0.y;
        acc[0][2] += v0.z;
        acc[0][3] += v0.w;
        acc[1][0] += v1.x;
        acc[1][1] += v1.y;
        acc[1][2] += v1.z;
        acc[1][3] += v1.w;
      }
    }
    cluster.sync();  // no rank exits while rank 0 still reads its shared memory
    if (rank != 0) return;
  }
  if (!act) return;

#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    if (nt == 1 && !two) break;
    storeMoeTile<T, kEpi>(a, e, q * 16, g, m0 + nt * 8 + 2 * t, acc[nt]);
  }
}

template <typename T, int kRG, int kTok, int kDepth, MoeGemmEpilogue kEpi, bool kSteady = true>
Status launchDecode(const MoeGemmArgs& a, cudaStream_t stream) {
  const int kt_count = (a.k + kBK - 1) / kBK;
  const MoeKSlicing sl = moeKSlicing(kt_count, a.k_slices);
  const int rows = std::max(1, std::min(kTok, a.max_rows_per_expert));
  const size_t x_bytes = (static_cast<size_t>(rows) * (sl.len * kBK + 8) * 2 + 15) / 16 * 16;
  const size_t smem = x_bytes + (sl.count > 1 ? size_t{kRG} * 32 * 8 * sizeof(float) : 0);
  auto kernel = moeGemmMxDecodeKernel<T, kRG, kTok, kDepth, kEpi, kSteady>;
  static size_t configured = 0;  // largest dynamic smem set so far (load time, not captured)
  if (smem > 48 * 1024 && smem > configured) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
    configured = smem;
  }
  const int groups = (a.n + 15) / 16;
  const int clusters = (groups + kRG - 1) / kRG;
  const cudaError_t err = launchClustered(
      kernel,
      dim3(static_cast<unsigned>(clusters * sl.count), static_cast<unsigned>(a.max_tiles), 1),
      dim3(kRG * 32, 1, 1), smem, stream,
      sl.count > 1 ? static_cast<unsigned>(sl.count) : 0u, a.pdl, a, sl.len, sl.count, rows);
  if (err != cudaSuccess) {
    return cudaStatus(err, "cudaLaunchKernelEx(moeGemmMxDecodeKernel)", __FILE__, __LINE__);
  }
  return okStatus();
}

// The wide kernel's K loop for a tile whose real rows fill kPairs ldmatrix.x4 pairs of n8 token
// tiles (a template argument: the loop over pairs is fully unrolled with no per-mma branch, so
// the compiler interleaves the token fragment loads, the dequantization and the mmas; a runtime
// pair count cost ~24 issued instructions per mma at T = 256, ncu 2026-12-03). Each thread's
// token-row copies are resolved once (source row, smem offset) and only advanced by K tile.
template <typename T, int kRG, int kNT, int kDepth, int kXStages, MoeGemmEpilogue kEpi, int kPairs>
__device__ __forceinline__ void moeWideLoop(const MoeGemmArgs& a, const MxWarpStream& ws,
                                            uint4 (&wq)[kDepth], uint32_t (&sqa)[kDepth],
                                            uint32_t (&sqb)[kDepth], T* s_x,
                                            const int32_t* s_src, int e, int m0, int q, bool act,
                                            int kt_count) {
  constexpr int kM = kNT * 8;
  constexpr int kXRow = kBK + 8;
  constexpr int kThreads = kRG * 32;
  constexpr int kChunks = kPairs * 16 * 8;  // 16-byte token chunks per K tile
  constexpr int kSlots = (kChunks + kThreads - 1) / kThreads;
  const int tid = threadIdx.x, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const T* src[kSlots];
  int dst[kSlots], col[kSlots];
  bool live[kSlots];
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const int i = tid + j * kThreads;
    const int r = i >> 3, c = (i & 7) * 8;
    const int s = i < kChunks ? s_src[r] : -1;
    live[j] = s >= 0;
    src[j] = reinterpret_cast<const T*>(a.a) + (live[j] ? static_cast<int64_t>(s) * a.k + c : 0);
    dst[j] = r * kXRow + c;
    col[j] = c;
  }
  auto loadX = [&](int kt) {
    T* base = s_x + (kt % kXStages) * (kM * kXRow);
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      if (j * kThreads + tid >= kChunks) break;
      const bool ok = live[j] && kt * kBK + col[j] < a.k;
      cpAsync16(base + dst[j], ok ? src[j] + kt * kBK : reinterpret_cast<const T*>(a.a), ok);
    }
  };
#pragma unroll
  for (int st = 0; st < kXStages - 1; ++st) {
    if (st < kt_count) loadX(st);
    cpAsyncCommit();
  }
  float acc[2 * kPairs][4];
#pragma unroll
  for (int i = 0; i < 2 * kPairs; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  // ldmatrix.x4 rows of pair p: matrices (tokens 16p + 0-7, k 0-7), (16p + 0-7, k 8-15),
  // (16p + 8-15, k 0-7), (16p + 8-15, k 8-15): b[0], b[1] feed n8 tile 2p, b[2], b[3] tile 2p + 1.
  const int mi = lane >> 3, mr = lane & 7;
  const int xoff = ((mi >> 1) * 8 + mr) * kXRow + (mi & 1) * 8;

  // K tiles in steps of kDepth, the ring slot a compile-time index (no register moves).
  for (int kb = 0; kb < kt_count; kb += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int kt = kb + d;
      if (kt >= kt_count) break;  // uniform
      cpAsyncWait<kXStages - 2>();
      __syncthreads();  // tile kt is in; every warp is done with the slot refilled below
      if (kt + kXStages - 1 < kt_count) loadX(kt + kXStages - 1);
      cpAsyncCommit();
      if (!act) continue;
      uint32_t sf[2][2];
      mxScaleFactors<T>(sqa[d], sqb[d], sf);
      const T* xs = s_x + (kt % kXStages) * (kM * kXRow) + xoff;
      uint32_t bf[2][kPairs][4];
#pragma unroll
      for (int p = 0; p < kPairs; ++p) ldmatrixX4(bf[0][p], xs + p * 16 * kXRow);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if (s + 1 < 4) {  // the next k16 step's token fragments while this step multiplies
#pragma unroll
          for (int p = 0; p < kPairs; ++p)
            ldmatrixX4(bf[(s + 1) & 1][p], xs + p * 16 * kXRow + (s + 1) * 16);
        }
        uint32_t af[4];
        mxFragment<T>(wq[d], s, sf, af);
        // The slot's last words are dequantized: refill it in place (no register copy).
        if (s == 3 && kt + kDepth < kt_count) ws.fetch(kt + kDepth, wq[d], sqa[d], sqb[d]);
#pragma unroll
        for (int p = 0; p < kPairs; ++p) {
          mma16<T>(acc[2 * p], af, bf[s & 1][p][0], bf[s & 1][p][1]);
          mma16<T>(acc[2 * p + 1], af, bf[s & 1][p][2], bf[s & 1][p][3]);
        }
      }
    }
  }
  cpAsyncWait<0>();
  pdlTrigger();  // [TAG_PDL_GRAPH] the products are done: the next kernel may be scheduled
  if (!act) return;
#pragma unroll
  for (int nt = 0; nt < 2 * kPairs; ++nt)
    storeMoeTile<T, kEpi>(a, e, q * 16, g, m0 + nt * 8 + 2 * t, acc[nt]);
}

// The wide decode-shaped MXFP4 GEMM [TAG_MOE_WIDE]: the decode kernel's weight path (weights as
// the mma A operand straight from the packed layout, one 16-byte load per lane per K tile, a
// kDepth register ring, dequantized by shifts and one bf16 multiply) for tiles of kNT * 8 token
// rows (block_m 64 at kNT 8), so each dequantized weight fragment feeds up to kNT mmas instead of
// two. The token rows cannot all sit in shared memory for the whole K (64 x 2880 bf16 = 360 KB), so
// they stream through a kXStages-deep cp.async ring of 64-wide K tiles shared by the CTA's kRG
// warps (one __syncthreads per K tile). Only the n8 token tiles that hold a real row are loaded and
// multiplied (align puts an expert's rows first in its tile; moeWideLoop is instantiated per
// count of ldmatrix pairs). Each output element is the one K chain of the tiled kernel's
// block_m 64 instance (K tiles in order, k16 steps in order, one mma each, from zero; bias and
// epilogue in f32), on the same exact bf16 weight values, so the bits equal it (rose_llm_bench
// --moe-gemm and the GPU tests compare them). Unsliced: only used where the K slicing is one
// chain. Needs every scale <= 128, like the decode kernel.
template <typename T, int kRG, int kNT, int kDepth, int kXStages, MoeGemmEpilogue kEpi>
__global__ void __launch_bounds__(kRG * 32, 16 / kRG) moeGemmMxWideKernel(MoeGemmArgs a) {
  static_assert(kNT == 8 && kXStages >= 2, "four ldmatrix.x4 pairs of n8 token tiles");
  constexpr int kM = kNT * 8;     // token rows per tile (== block_m)
  constexpr int kThreads = kRG * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  T* s_x = reinterpret_cast<T*>(smem);  // [kXStages][kM][kBK + 8]
  __shared__ int32_t s_src[kM];
  __shared__ int s_rows;  // 1 + the last real row of the tile (0: none)
  pdlWait();  // [TAG_PDL_GRAPH] the tiles (align) and the rows are the previous kernels' outputs
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;  // uniform over the CTA
  const int e = a.tile_expert[tile];
  if (e < 0 || e >= a.num_experts) return;
  const int kt_count = (a.k + kBK - 1) / kBK;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m0 = tile * kM;
  const int q = blockIdx.x * kRG + warp;  // this warp's 16-row weight group
  const bool act = q * 16 < a.n;          // warp-uniform

  const MxWarpStream ws(a, e, q, lane, kt_count);
  uint4 wq[kDepth];
  uint32_t sqa[kDepth], sqb[kDepth];
  if (act) ws.prime(0, kt_count, wq, sqa, sqb);

  if (tid == 0) s_rows = 0;
  __syncthreads();
  for (int r = tid; r < kM; r += kThreads) {
    const int pr = m0 + r;
    const int src = a.a_rows != nullptr ? a.a_rows[pr]
                                        : (a.row_valid == nullptr || a.row_valid[pr] >= 0 ? pr : -1);
    s_src[r] = src;
    if (src >= 0) atomicMax(&s_rows, r + 1);
  }
  __syncthreads();
  // ldmatrix.x4 pairs of n8 tiles that hold a real row (uniform over the CTA)
  switch ((s_rows + 15) / 16) {
    case 1: return moeWideLoop<T, kRG, kNT, kDepth, kXStages, kEpi, 1>(a, ws, wq, sqa, sqb, s_x, s_src, e, m0, q, act, kt_count);
    case 2: return moeWideLoop<T, kRG, kNT, kDepth, kXStages, kEpi, 2>(a, ws, wq, sqa, sqb, s_x, s_src, e, m0, q, act, kt_count);
    case 3: return moeWideLoop<T, kRG, kNT, kDepth, kXStages, kEpi, 3>(a, ws, wq, sqa, sqb, s_x, s_src, e, m0, q, act, kt_count);
    case 4: return moeWideLoop<T, kRG, kNT, kDepth, kXStages, kEpi, 4>(a, ws, wq, sqa, sqb, s_x, s_src, e, m0, q, act, kt_count);
    default: return;  // no real row: nothing to store
  }
}
template <typename T, int kRG, int kNT, int kDepth, int kXStages, MoeGemmEpilogue kEpi>
Status launchWide(const MoeGemmArgs& a, cudaStream_t stream) {
  constexpr size_t smem = size_t{kXStages} * kNT * 8 * (kBK + 8) * 2;
  auto kernel = moeGemmMxWideKernel<T, kRG, kNT, kDepth, kXStages, kEpi>;
  static bool configured = false;  // one attribute call per instance (load time, not captured)
  if (!configured) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
    configured = true;
  }
  const int groups = (a.n + 15) / 16;
  const dim3 grid(static_cast<unsigned>((groups + kRG - 1) / kRG), static_cast<unsigned>(a.max_tiles));
  CUDA_RETURN_IF_ERROR(launchPdlAlways(a.pdl, kernel, grid, dim3(kRG * 32), smem, stream, a));
  return okStatus();
}

// Decode kernel shape (kRG row groups per CTA, kDepth) per token tile; variant 0 is the default,
// the others are measured by rose_llm_bench --moe-gemm (setMoeDecodeVariant). All give the same
// bits (the slicing, not the shape, decides them). Measured on the H200 (bench/results/
// gpu-llm-2026-12-03-h200): the depth-8 ring costs 132-143 registers and loses to depth 4 from
// T = 2 on (T = 4: 150 vs 103 us for the whole MoE op); at T = 1 depth 8 is ~3 % faster.
int g_decode_variant = 0;
int g_k_slices = kMoeDefaultKSlices;
int g_l2_prefetch = kMoeDefaultL2Prefetch;  // [TAG_MOE_L2_PREFETCH]
int g_wide_variant = 0;                   // [TAG_MOE_WIDE] -1: off (the tiled kernel)
int g_wide_min_avg = kMoeWideDefaultMinAvg;  // block_m 64 + the wide kernel above this average
int g_block_m_override = 0;               // rose_llm_bench only: 0 = moeGemmBlockM's choice

template <typename T, MoeGemmEpilogue kEpi>
Status launchWideVariant(const MoeGemmArgs& a, cudaStream_t stream) {
  // Measured on the H200: with the runtime pair count (bench/results/gpu-llm-2026-12-03-h200-s3,
  // call 2) the depth-2 weight ring (123 registers) beat depth 4 (spilling) by 15-20 %; with the
  // loop specialized per pair count (gpu-llm-2026-12-03-h200-s4, call 1) nothing spills and depth 4
  // is 3-5 % faster at every T (MoE op T = 256: 369.6 vs 384.5 us; T = 512: 561 vs 581).
  switch (g_wide_variant) {
    case 1: return launchWide<T, 8, 8, 2, 6, kEpi>(a, stream);
    case 2: return launchWide<T, 16, 8, 2, 4, kEpi>(a, stream);
    case 3: return launchWide<T, 8, 8, 2, 4, kEpi>(a, stream);
    default: return launchWide<T, 8, 8, 4, 4, kEpi>(a, stream);
  }
}

template <typename T, MoeGemmEpilogue kEpi>
Status launchDecodeVariant(const MoeGemmArgs& a, cudaStream_t stream) {
  const bool small = a.max_rows_per_expert <= 8;
  switch (g_decode_variant) {
    case 1: return small ? launchDecode<T, 4, 8, 4, kEpi>(a, stream) : launchDecode<T, 8, 16, 4, kEpi>(a, stream);
    case 2: return small ? launchDecode<T, 2, 8, 8, kEpi>(a, stream) : launchDecode<T, 4, 16, 8, kEpi>(a, stream);
    case 3: return small ? launchDecode<T, 2, 8, 4, kEpi>(a, stream) : launchDecode<T, 4, 16, 4, kEpi>(a, stream);
    case 4: return small ? launchDecode<T, 4, 8, 8, kEpi>(a, stream) : launchDecode<T, 8, 16, 8, kEpi>(a, stream);
    case 5:  // the default shapes with every slot checked (no steady loop): the A/B of kSteady
      if (a.max_rows_per_expert <= 1) return launchDecode<T, 4, 8, 8, kEpi, false>(a, stream);
      return small ? launchDecode<T, 4, 8, 4, kEpi, false>(a, stream)
                   : launchDecode<T, 8, 16, 4, kEpi, false>(a, stream);
    default:  // depth 8 for one token, depth 4 above
      if (a.max_rows_per_expert <= 1) return launchDecode<T, 4, 8, 8, kEpi>(a, stream);
      return small ? launchDecode<T, 4, 8, 4, kEpi>(a, stream) : launchDecode<T, 8, 16, 4, kEpi>(a, stream);
  }
}

template <typename T, bool kMx, MoeGemmEpilogue kEpi>
Status launchTile(const MoeGemmArgs& a, cudaStream_t stream) {
  if constexpr (kMx) {
    if (a.block_m == 16 && a.mx_max_scale <= kMxfp4MaxDecodeScale && !a.force_tiled &&
        g_decode_variant >= 0)
      return launchDecodeVariant<T, kEpi>(a, stream);
    if (a.block_m == 64 && a.mx_max_scale <= kMxfp4MaxDecodeScale && !a.force_tiled &&
        g_decode_variant >= 0 && g_wide_variant >= 0)
      return launchWideVariant<T, kEpi>(a, stream);
  }
  switch (a.block_m) {
    // Few rows per expert (decode): one warp per 16 x 32 tile, 6 stages in flight, so the
    // weight stream is spread over many blocks with many loads outstanding.
    // Sliced like the decode kernel [TAG_MOE_K_SLICES]: the decode regime gives the same bits
    // whichever kernel runs (bf16 experts, scales > 128, force_tiled).
    case 16: return launchInstance<T, 1, 1, 1, 4, 6, kMx, kEpi, true>(a, stream);
    case 64: return launchInstance<T, 2, 4, 2, 4, 3, kMx, kEpi, false>(a, stream);
    case 128: return launchInstance<T, 4, 2, 2, 8, 3, kMx, kEpi, false>(a, stream);
    default: return invalidArgument("moe_gemm: block_m must be 16, 64 or 128");
  }
}

// One thread per packed 32-bit word (mxfp4_tiles.h): gathers its 16 nibbles from the
// checkpoint layout (codes [count, n, groups, 16], scales [count, n, groups]); the words of lane 0
// also carry the scales of their rows. Records the largest scale byte in *max_scale.
__global__ void mxfp4PackKernel(const uint8_t* src_codes, const uint8_t* src_scales, int64_t first,
                                int64_t count, int64_t n, int64_t groups, int64_t n_tiles,
                                int64_t k_tiles, uint8_t* codes, uint8_t* scales,
                                unsigned* max_scale) {
  constexpr int64_t kWords = kMxTileBytes / 4;  // 1024 per (expert, n tile, k tile)
  const int64_t total = count * n_tiles * k_tiles * kWords;
  unsigned local_max = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t wi = i % kWords;
    const int64_t kt = (i / kWords) % k_tiles;
    const int64_t nt = (i / (kWords * k_tiles)) % n_tiles;
    const int64_t el = i / (kWords * k_tiles * n_tiles);
    const int grp = static_cast<int>(wi / 128), lane = static_cast<int>((wi / 4) % 32),
              s = static_cast<int>(wi % 4);
    const int64_t tb = ((first + el) * n_tiles + nt) * k_tiles + kt;
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int odd = 0; odd < 2; ++odd) {
        const Mxfp4Element e = mxfp4WordElement(lane, s, j, odd);
        const int64_t row = nt * kMxTileRows + grp * kMxGroupRows + e.row;
        const int64_t kk = kt * kMxTileK + e.k;
        const int64_t g = kk / 32;
        uint32_t nib = 0;
        if (row < n && g < groups) {
          const uint8_t b = src_codes[((el * n + row) * groups + g) * 16 + (kk % 32) / 2];
          nib = (kk % 2) ? (b >> 4) : (b & 15u);
        }
        word |= nib << (16 * odd + 4 * (3 - j));
      }
    }
    reinterpret_cast<uint32_t*>(codes + tb * kMxTileBytes)[wi] = word;
    if (wi < kMxTileRows * 2) {  // the 256 scale bytes of this block, one per thread
      const int64_t r = wi / 2, g = 2 * kt + wi % 2, row = nt * kMxTileRows + r;
      uint8_t sc = 127;
      if (row < n && g < groups) {
        sc = src_scales[(el * n + row) * groups + g];
        local_max = max(local_max, static_cast<unsigned>(sc));
      }
      scales[tb * (kMxTileRows * 2) + wi] = sc;
    }
  }
  if (local_max > 0) atomicMax(max_scale, local_max);
}

}  // namespace

void setMoeDecodeVariant(int variant) { g_decode_variant = variant; }
void setMoeKSlices(int slices) { g_k_slices = std::max(1, std::min(slices, 8)); }
int moeKSlices() { return g_k_slices; }
void setMoeL2Prefetch(int kt) { g_l2_prefetch = std::max(0, std::min(kt, 64)); }
int moeL2Prefetch() { return g_l2_prefetch; }

void setMoeWideVariant(int variant) { g_wide_variant = variant; }
void setMoeWideMinAvg(int rows) { g_wide_min_avg = rows; }
void setMoeBlockMOverride(int block_m) { g_block_m_override = block_m; }

int32_t moeGemmBlockM(int64_t assignments, int32_t num_experts, bool mx_wide) {
  if (g_block_m_override > 0) return g_block_m_override;
  const int64_t avg = assignments / (num_experts > 0 ? num_experts : 1);
  // [TAG_MOE_WIDE] MXFP4 experts the decode kernels can read take block_m 64 tiles and the wide
  // kernel above g_wide_min_avg rows per expert — only with one K chain, where block_m 16 and 64
  // give the same bits. No upper bound: the wide kernel beats block_m 128's tiled kernel at every
  // size measured (20b shapes, gpu-llm-2026-12-04-h200-s8 call 2: T = 1024 / 2048 / 4096 / 8192,
  // 128-1024 rows per expert: 873 / 1,661 / 3,191 / 6,289 us vs 1,304 / 2,207 / 3,850 / 7,550),
  // with the same bits.
  if (mx_wide && g_wide_variant >= 0 && g_decode_variant >= 0 && g_k_slices == 1 &&
      avg > g_wide_min_avg)
    return 64;
  if (avg <= 24) return 16;
  if (avg <= 96) return 64;
  return 128;
}

Status checkMoeGemm(const MoeGemmArgs& a) {
  const bool mx = a.codes != nullptr;
  if (mx == (a.w != nullptr))
    return invalidArgument("moe_gemm: exactly one of bf16 weights and MXFP4 codes");
  if (mx && a.scales == nullptr) return invalidArgument("moe_gemm: MXFP4 scales missing");
  if (a.n <= 0 || a.n % 2 != 0) return invalidArgument("moe_gemm: N must be positive and even");
  if (a.k <= 0 || a.k % (mx ? 32 : 8) != 0)
    return invalidArgument(mx ? "moe_gemm: K must be a multiple of 32 (MXFP4 groups)"
                              : "moe_gemm: K must be a multiple of 8");
  if (a.block_m != 16 && a.block_m != 64 && a.block_m != 128)
    return invalidArgument("moe_gemm: block_m must be 16, 64 or 128");
  if (a.max_tiles <= 0 || a.num_experts <= 0)
    return invalidArgument("moe_gemm: empty tile list or no experts");
  if (a.k_slices < 1 || a.k_slices > 8) return invalidArgument("moe_gemm: k_slices must be 1..8");
  if (reinterpret_cast<uintptr_t>(a.a) % 16 != 0 || reinterpret_cast<uintptr_t>(a.w) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.codes) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.scales) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.out) % 4 != 0)
    return invalidArgument("moe_gemm: operands must be 16-byte aligned (out 4-byte)");
  return okStatus();
}

Status launchMoeGemm(const MoeGemmArgs& a, cudaStream_t stream) {
  RETURN_IF_ERROR(checkMoeGemm(a));
  const bool mx = a.codes != nullptr;
  if (a.f16) {  // [TAG_ATTN_F16] activations, biases and dense weights in fp16
    if (a.epilogue == MoeGemmEpilogue::kSwiglu) {
      return mx ? launchTile<f16, true, MoeGemmEpilogue::kSwiglu>(a, stream)
                : launchTile<f16, false, MoeGemmEpilogue::kSwiglu>(a, stream);
    }
    return mx ? launchTile<f16, true, MoeGemmEpilogue::kBias>(a, stream)
              : launchTile<f16, false, MoeGemmEpilogue::kBias>(a, stream);
  }
  if (a.epilogue == MoeGemmEpilogue::kSwiglu) {
    return mx ? launchTile<bf16, true, MoeGemmEpilogue::kSwiglu>(a, stream)
              : launchTile<bf16, false, MoeGemmEpilogue::kSwiglu>(a, stream);
  }
  return mx ? launchTile<bf16, true, MoeGemmEpilogue::kBias>(a, stream)
            : launchTile<bf16, false, MoeGemmEpilogue::kBias>(a, stream);
}

Status launchMxfp4Pack(const uint8_t* src_codes, const uint8_t* src_scales, int64_t first,
                       int64_t count, const Mxfp4PackedShape& shape, uint8_t* codes,
                       uint8_t* scales, unsigned* max_scale, cudaStream_t stream) {
  if (shape.k % 32 != 0 || shape.n <= 0 || first < 0 || first + count > shape.experts)
    return invalidArgument("mxfp4_pack: bad shape");
  const int64_t total = count * shape.n_tiles() * shape.k_tiles() * (kMxTileBytes / 4);
  if (total == 0) return okStatus();
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 65535);
  mxfp4PackKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      src_codes, src_scales, first, count, shape.n, shape.k / 32, shape.n_tiles(),
      shape.k_tiles(), codes, scales, max_scale);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
