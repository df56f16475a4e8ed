#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/moe_gemm.cuh"
#include "services/rose/ops/cuda/mxfp4_tiles.h"

namespace garden::rose::cuda {
namespace {

constexpr int kBK = kMoeGemmTileK;    // 64
constexpr int kPackN = kMoeGemmTileN;  // 128: rows of one packed MXFP4 tile [TAG_MXFP4_TILED]
constexpr int kRowS = kBK + 8;  // padded smem row (bf16 elements): conflict-free ldmatrix

// 2^(s - 127) as a bf16 pair (s = 0: the subnormal 2^-127; 255: +inf, as the reference's ldexp).
__device__ __forceinline__ __nv_bfloat162 e8m0Bf16x2(unsigned s) {
  const uint32_t b = s == 0 ? 0x0040u : (s == 255 ? 0x7F80u : (s << 7));
  const uint32_t two = b | (b << 16);
  return *reinterpret_cast<const __nv_bfloat162*>(&two);
}
__device__ __forceinline__ __nv_bfloat162 bitsBf16x2(uint32_t b) {
  return *reinterpret_cast<const __nv_bfloat162*>(&b);
}
__device__ __forceinline__ uint32_t bf16x2Bits(__nv_bfloat162 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}
// Fragment register j of a packed word [TAG_MXFP4_TILED], as exact bf16 values times 2^-126.
__device__ __forceinline__ uint32_t mxRegBits(uint32_t w, int j) { return mxfp4WordToBf16x2Bits(w, j); }
// 2^126 as a bf16 pair: register bits * this = the E2M1 values (all normal).
constexpr uint32_t kTwo126x2 = (253u << 7) | ((253u << 7) << 16);

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
// order, k16 steps in order), so a row's bits do not depend on the configuration.
template <int kWM, int kWN, int kMT, int kNT, int kStages, bool kMx, MoeGemmEpilogue kEpi,
          bool kFastScales = false>
// Two 256-thread blocks per SM (the register budget that keeps them: <= 128 per thread).
__global__ void __launch_bounds__(kWM * kWN * 32, kWM * kWN == 8 ? 2 : 1) moeGemmKernel(MoeGemmArgs a) {
  constexpr int kThreads = kWM * kWN * 32;
  constexpr int kBM = kWM * kMT * 16;
  constexpr int kBN = kWN * kNT * 8;
  static_assert(kBN == 32 || kBN == kPackN, "block N tile must be 32 or 128");
  static_assert(kNT % 2 == 0, "n8 tiles come in pairs (ldmatrix.x4)");
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* s_a = reinterpret_cast<__nv_bfloat16*>(smem);  // [kStages][kBM][kRowS]
  unsigned char* rest = smem + size_t{kStages} * kBM * kRowS * 2;
  uint8_t* s_codes = rest;                                   // kMx: [kStages][kBN * 32]
  uint8_t* s_scales = rest + kStages * kBN * 32;             // kMx: [kStages][kBN * 2]
  __nv_bfloat16* s_bdq = reinterpret_cast<__nv_bfloat16*>(s_scales + kStages * kBN * 2);  // kMx: [kBN][kRowS]
  __nv_bfloat16* s_b = reinterpret_cast<__nv_bfloat16*>(rest);  // !kMx: [kStages][kBN][kRowS]

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
    __nv_bfloat16* sa = s_a + slot * kBM * kRowS;
    for (int i = tid; i < kBM * (kBK / 8); i += kThreads) {
      const int r = i / (kBK / 8);
      const int c = (i % (kBK / 8)) * 8;
      const int pr = m0 + r;
      const int src = a.a_rows != nullptr ? a.a_rows[pr] : pr;
      const int kk = kt * kBK + c;
      const bool valid = src >= 0 && kk < a.k;
      const __nv_bfloat16* p = a.a + (valid ? static_cast<int64_t>(src) * a.k + kk : 0);
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
      __nv_bfloat16* sb = s_b + slot * kBN * kRowS;
      for (int i = tid; i < kBN * (kBK / 8); i += kThreads) {
        const int r = i / (kBK / 8);
        const int c = (i % (kBK / 8)) * 8;
        const int n = n0 + r;
        const int kk = kt * kBK + c;
        const bool valid = n < a.n && kk < a.k;
        const __nv_bfloat16* p =
            a.w + (valid ? (static_cast<int64_t>(e) * a.n + n) * a.k + kk : 0);
        cpAsync16(sb + r * kRowS + c, p, valid);
      }
    }
  };

  float acc[kMT][kNT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

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
    const __nv_bfloat16* sb;
    if constexpr (kMx) {
      const uint8_t* codes = s_codes + slot * kBN * 32;
      const uint8_t* scales = s_scales + slot * kBN * 2;
      // One unit = one lane's 16 bytes of a 16-row group (mxfp4_tiles.h): four words (k16 steps),
      // four fragment registers each, scattered back to [row][k] for the ldmatrix B loads.
      for (int u = tid; u < kBN * 2; u += kThreads) {
        const int grp = u >> 5, ln = u & 31, g = ln >> 2, t = ln & 3;
        const uint4 raw = *reinterpret_cast<const uint4*>(codes + u * 16);
        const int r0 = grp * 16 + g;
        const uint8_t* sr = scales + r0 * 2;
        const uint32_t sbytes[2][2] = {{sr[0], sr[1]}, {sr[16], sr[17]}};  // rows r0, r0 + 8
        if constexpr (fast_scales) {
          // Every scale <= 128: one multiply by 2^(s - 1) (mxfp4DecodeScaleBits), as the decode
          // kernel does; the same exact values as the two-multiply path below.
          uint32_t sf[2][2];
#pragma unroll
          for (int hr = 0; hr < 2; ++hr)
#pragma unroll
            for (int hg = 0; hg < 2; ++hg) {
              const uint32_t b = mxfp4DecodeScaleBits(sbytes[hr][hg]);
              sf[hr][hg] = b | (b << 16);
            }
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const uint32_t word = w == 0 ? raw.x : w == 1 ? raw.y : w == 2 ? raw.z : raw.w;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const __nv_bfloat162 v =
                  __hmul2(bitsBf16x2(mxRegBits(word, j)), bitsBf16x2(sf[j & 1][w >> 1]));
              const int row = r0 + 8 * (j & 1), k = 16 * w + 8 * (j >> 1) + 2 * t;
              *reinterpret_cast<uint32_t*>(s_bdq + row * kRowS + k) = bf16x2Bits(v);
            }
          }
        } else {
          const __nv_bfloat162 sc[2][2] = {{e8m0Bf16x2(sbytes[0][0]), e8m0Bf16x2(sbytes[0][1])},
                                           {e8m0Bf16x2(sbytes[1][0]), e8m0Bf16x2(sbytes[1][1])}};
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const uint32_t word = w == 0 ? raw.x : w == 1 ? raw.y : w == 2 ? raw.z : raw.w;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              __nv_bfloat162 v = __hmul2(bitsBf16x2(mxRegBits(word, j)), bitsBf16x2(kTwo126x2));
              v = __hmul2(v, sc[j & 1][w >> 1]);
              const int row = r0 + 8 * (j & 1), k = 16 * w + 8 * (j >> 1) + 2 * t;
              *reinterpret_cast<uint32_t*>(s_bdq + row * kRowS + k) = bf16x2Bits(v);
            }
          }
        }
      }
      __syncthreads();
      sb = s_bdq;
    } else {
      sb = s_b + slot * kBN * kRowS;
    }
    const __nv_bfloat16* sa = s_a + slot * kBM * kRowS;
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
          mmaBf16(acc[mt][2 * nt2], af[mt], b[0], b[1]);
          mmaBf16(acc[mt][2 * nt2 + 1], af[mt], b[2], b[3]);
        }
      }
    }
  }
  cpAsyncWait<0>();

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
        b0 = __bfloat162float(a.bias[static_cast<int64_t>(e) * a.n + col]);
        b1 = __bfloat162float(a.bias[static_cast<int64_t>(e) * a.n + col + 1]);
      }
      const float* c = acc[mt][nt];
      if constexpr (kEpi == MoeGemmEpilogue::kSwiglu) {
        const float lim = a.swiglu_limit, alpha = a.swiglu_alpha;
        auto act = [&](float gate, float up) {
          const float g = fminf(gate, lim);
          const float u = fminf(fmaxf(up, -lim), lim);
          return g / (1.f + expf(-alpha * g)) * (u + 1.f);
        };
        const int half_n = a.n / 2;
        a.out[ra * half_n + col / 2] = __float2bfloat16(act(c[0] + b0, c[1] + b1));
        a.out[rb * half_n + col / 2] = __float2bfloat16(act(c[2] + b0, c[3] + b1));
      } else {
        *reinterpret_cast<uint32_t*>(a.out + ra * a.n + col) = packBf16x2(c[0] + b0, c[1] + b1);
        *reinterpret_cast<uint32_t*>(a.out + rb * a.n + col) = packBf16x2(c[2] + b0, c[3] + b1);
      }
    }
  }
}

template <int kWM, int kWN, int kMT, int kNT, int kStages, bool kMx, MoeGemmEpilogue kEpi,
          bool kFastScales = false>
Status launchInstance(const MoeGemmArgs& a, cudaStream_t stream) {
  constexpr int kBM = kWM * kMT * 16;
  constexpr int kBN = kWN * kNT * 8;
  constexpr size_t smem = moeGemmSmemBytes<kBM, kBN, kStages, kMx>();
  if constexpr (kMx && !kFastScales) {
    if (a.mx_max_scale <= kMxfp4MaxDecodeScale)
      return launchInstance<kWM, kWN, kMT, kNT, kStages, kMx, kEpi, true>(a, stream);
  }
  auto kernel = moeGemmKernel<kWM, kWN, kMT, kNT, kStages, kMx, kEpi, kFastScales>;
  static bool configured = false;  // one attribute call per instance (load time, not captured)
  if (!configured) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
    configured = true;
  }
  const dim3 grid(static_cast<unsigned>(a.max_tiles),
                  static_cast<unsigned>((a.n + kBN - 1) / kBN));
  kernel<<<grid, kWM * kWN * 32, smem, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}


// Decode-shaped MXFP4 GEMM (block_m 16: few rows per expert). The weights are the mma A operand
// (one warp = 16 weight rows, read straight from the packed layout: one 16-byte load per lane
// per K tile, kDepth tiles in flight in registers, dequantized by shifts and one bf16 multiply),
// the tile's kTok (8 or 16) token rows are B (n8 tiles, staged once in shared memory for all of
// K; kTok = 8 when no expert can have more than 8 rows, i.e. at most 8 tokens). Each
// output element runs the same chain as moeGemmKernel — zero accumulator, K tiles in order, k16
// steps in order, one mma each, bias and epilogue in f32 — on the same exact bf16 weight values,
// so the bits equal the large-tile kernel's (the tests compare them). Needs every scale <= 128
// (2^(s-1) representable); the launcher falls back to moeGemmKernel otherwise.
template <int kWarps, int kTok, int kDepth, int kGroups, MoeGemmEpilogue kEpi>
__global__ void __launch_bounds__(kWarps * 32) moeGemmMxDecodeKernel(MoeGemmArgs a) {
  static_assert(kTok == 8 || kTok == 16, "token tile is one or two n8 tiles");
  extern __shared__ __align__(16) unsigned char smem[];
  const int tile = blockIdx.y;
  if (tile >= *a.num_tiles) return;
  const int e = a.tile_expert[tile];
  if (e < 0 || e >= a.num_experts) return;
  const int kt_count = (a.k + kBK - 1) / kBK;
  const int kp = kt_count * kBK;      // K padded to whole tiles
  const int row_s = kp + 8;           // smem row stride (bf16): odd multiple of 16 bytes
  __nv_bfloat16* s_x = reinterpret_cast<__nv_bfloat16*>(smem);  // [kTok][row_s]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m0 = tile * 16;  // block_m rows per tile; the first kTok may be real
  const int pack_tiles = (a.n + kPackN - 1) / kPackN;
  const int q0 = (blockIdx.x * kWarps + warp) * kGroups;  // this warp's first 16-row group
  const int g = lane >> 2, t = lane & 3;

  // Weight stream first (independent of the token rows), then the token rows into smem.
  const uint8_t* cbase[kGroups];
  const uint8_t* sbase[kGroups];
  bool act[kGroups];
#pragma unroll
  for (int gq = 0; gq < kGroups; ++gq) {
    const int q = q0 + gq, p = q / 8, gi = q % 8;
    act[gq] = q * 16 < a.n;
    const int64_t blk = (static_cast<int64_t>(e) * pack_tiles + p) * kt_count;
    cbase[gq] = a.codes + blk * kMxTileBytes + gi * 512 + lane * 16;
    sbase[gq] = a.scales + blk * 256 + (gi * 16 + g) * 2;
  }
  // The ring holds raw loads only (codes; the scale pairs of rows g and g + 8 in separate
  // registers): anything computed from a load here would stall the warp on it at issue time.
  uint4 wq[kGroups][kDepth];
  uint32_t sqa[kGroups][kDepth], sqb[kGroups][kDepth];
  auto fetch = [&](int gq, int kt, uint4& w, uint32_t& sa, uint32_t& sb) {
    w = __ldg(reinterpret_cast<const uint4*>(cbase[gq] + static_cast<int64_t>(kt) * kMxTileBytes));
    const uint16_t* sp = reinterpret_cast<const uint16_t*>(sbase[gq] + static_cast<int64_t>(kt) * 256);
    sa = __ldg(sp);
    sb = __ldg(sp + 8);
  };
#pragma unroll
  for (int d = 0; d < kDepth; ++d)
#pragma unroll
    for (int gq = 0; gq < kGroups; ++gq)
      if (act[gq] && d < kt_count) fetch(gq, d, wq[gq][d], sqa[gq][d], sqb[gq][d]);
  // Token rows: each row's source once (a_rows, or in place where row_valid marks it real),
  // then only the real rows are copied (K padding zero-filled). Rows that are padding keep
  // whatever shared memory held: they only reach their own output columns, which are not written.
  __shared__ int32_t s_src[kTok];
  const int32_t* rmap = a.a_rows != nullptr ? a.a_rows : a.row_valid;
  if (tid < kTok) {
    const int pr = m0 + tid;
    s_src[tid] = a.a_rows != nullptr ? a.a_rows[pr] : (rmap == nullptr || rmap[pr] >= 0 ? pr : -1);
  }
  __syncthreads();
  int valid = 0;
#pragma unroll
  for (int r = 0; r < kTok; ++r) {
    const int src = s_src[r];
    if (src < 0) continue;
    ++valid;
    for (int c = tid * 8; c < kp; c += kWarps * 32 * 8) {
      const bool ok = c < a.k;
      cpAsync16(s_x + r * row_s + c, a.a + (ok ? static_cast<int64_t>(src) * a.k + c : 0), ok);
    }
  }
  cpAsyncCommit();
  cpAsyncWait<0>();
  __syncthreads();
  if (!act[0]) return;
  const bool two = kTok == 16 && valid > 8;  // uniform: the second n8 tile only with real rows

  float acc[kGroups][2][4];
#pragma unroll
  for (int gq = 0; gq < kGroups; ++gq)
#pragma unroll
    for (int i = 0; i < 2; ++i) acc[gq][i][0] = acc[gq][i][1] = acc[gq][i][2] = acc[gq][i][3] = 0.f;
  const int mi = lane >> 3, mr = lane & 7;
  // ldmatrix.x4 rows: matrices (tokens 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15)
  // (kTok 8: matrices 2 and 3 repeat 0 and 1, unused).
  const __nv_bfloat16* xrow = s_x + ((kTok == 16 ? (mi >> 1) * 8 : 0) + mr) * row_s + (mi & 1) * 8;

  for (int kt0 = 0; kt0 < kt_count; kt0 += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int kt = kt0 + d;
      if (kt >= kt_count) break;
      uint4 w[kGroups];
      uint32_t sf[kGroups][2][2];  // bf16x2 2^(s-1): [row g / g + 8][group 0 / 1]
#pragma unroll
      for (int gq = 0; gq < kGroups; ++gq) {
        w[gq] = wq[gq][d];
        const uint32_t sa = sqa[gq][d], sb = sqb[gq][d];
        if (act[gq] && kt + kDepth < kt_count)
          fetch(gq, kt + kDepth, wq[gq][d], sqa[gq][d], sqb[gq][d]);
        // Byte b of the pair into both halves' exponent: (s << 7 | s << 23) + (126 << 7) twice.
#pragma unroll
        for (int hg = 0; hg < 2; ++hg) {
          sf[gq][0][hg] = (__byte_perm(sa, 0u, hg ? 0x1414u : 0x0404u) >> 1) + 0x3F003F00u;
          sf[gq][1][hg] = (__byte_perm(sb, 0u, hg ? 0x1414u : 0x0404u) >> 1) + 0x3F003F00u;
        }
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t b[4];
        ldmatrixX4(b, xrow + kt * kBK + s * 16);
#pragma unroll
        for (int gq = 0; gq < kGroups; ++gq) {
          const uint32_t word = s == 0 ? w[gq].x : s == 1 ? w[gq].y : s == 2 ? w[gq].z : w[gq].w;
          uint32_t af[4];
#pragma unroll
          for (int j = 0; j < 4; ++j)
            af[j] = bf16x2Bits(
                __hmul2(bitsBf16x2(mxRegBits(word, j)), bitsBf16x2(sf[gq][j & 1][s >> 1])));
          mmaBf16(acc[gq][0], af, b[0], b[1]);
          if (two) mmaBf16(acc[gq][1], af, b[2], b[3]);
        }
      }
    }
  }

  // acc[gq][nt]: c0 (row g, token 2t), c1 (row g, token 2t+1), c2/c3 the same for row g + 8.
#pragma unroll
  for (int gq = 0; gq < kGroups; ++gq) {
    const int n_base = (q0 + gq) * 16;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      if (nt == 1 && !two) break;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int n = n_base + g + 8 * hr;
        const float v0 = acc[gq][nt][2 * hr], v1 = acc[gq][nt][2 * hr + 1];
        const int64_t tok0 = m0 + nt * 8 + 2 * t;
        if constexpr (kEpi == MoeGemmEpilogue::kSwiglu) {
          // (gate, up) = rows (n, n + 1): the up value lives in the lane of row g + 1.
          const float u0 = __shfl_down_sync(0xffffffffu, v0, 4);
          const float u1 = __shfl_down_sync(0xffffffffu, v1, 4);
          if ((g & 1) == 0 && n + 1 < a.n) {
            float bg = 0.f, bu = 0.f;
            if (a.bias != nullptr) {
              bg = __bfloat162float(a.bias[static_cast<int64_t>(e) * a.n + n]);
              bu = __bfloat162float(a.bias[static_cast<int64_t>(e) * a.n + n + 1]);
            }
            const float lim = a.swiglu_limit, alpha = a.swiglu_alpha;
            auto actf = [&](float gate, float up) {
              const float gg = fminf(gate, lim);
              const float uu = fminf(fmaxf(up, -lim), lim);
              return gg / (1.f + expf(-alpha * gg)) * (uu + 1.f);
            };
            const int half_n = a.n / 2;
            a.out[tok0 * half_n + n / 2] = __float2bfloat16(actf(v0 + bg, u0 + bu));
            a.out[(tok0 + 1) * half_n + n / 2] = __float2bfloat16(actf(v1 + bg, u1 + bu));
          }
        } else {
          if (n < a.n) {
            const float bn =
                a.bias != nullptr ? __bfloat162float(a.bias[static_cast<int64_t>(e) * a.n + n]) : 0.f;
            a.out[tok0 * a.n + n] = __float2bfloat16(v0 + bn);
            a.out[(tok0 + 1) * a.n + n] = __float2bfloat16(v1 + bn);
          }
        }
      }
    }
  }
}

template <int kWarps, int kTok, int kDepth, int kGroups, MoeGemmEpilogue kEpi>
Status launchDecode(const MoeGemmArgs& a, cudaStream_t stream) {
  const int kt_count = (a.k + kBK - 1) / kBK;
  const size_t smem = size_t{kTok} * (kt_count * kBK + 8) * 2;
  auto kernel = moeGemmMxDecodeKernel<kWarps, kTok, kDepth, kGroups, kEpi>;
  static size_t configured = 0;  // largest dynamic smem set so far (load time, not captured)
  if (smem > 48 * 1024 && smem > configured) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
    configured = smem;
  }
  const int groups = (a.n + 15) / 16;
  const int per_block = kWarps * kGroups;
  const dim3 grid(static_cast<unsigned>((groups + per_block - 1) / per_block),
                  static_cast<unsigned>(a.max_tiles));
  kernel<<<grid, kWarps * 32, smem, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

// Decode kernel shape (kWarps, kDepth, kGroups) per token tile; variant 0 is the default, the
// others are measured by rose_llm_bench --moe-gemm (setMoeDecodeVariant).
int g_decode_variant = 0;

template <MoeGemmEpilogue kEpi>
Status launchDecodeVariant(const MoeGemmArgs& a, cudaStream_t stream) {
  const bool small = a.max_rows_per_expert <= 8;
  switch (g_decode_variant) {
    case 1: return small ? launchDecode<4, 8, 16, 1, kEpi>(a, stream) : launchDecode<8, 16, 16, 1, kEpi>(a, stream);
    case 2: return small ? launchDecode<4, 8, 8, 2, kEpi>(a, stream) : launchDecode<4, 16, 8, 2, kEpi>(a, stream);
    case 3: return small ? launchDecode<2, 8, 8, 1, kEpi>(a, stream) : launchDecode<4, 16, 8, 1, kEpi>(a, stream);
    case 4: return small ? launchDecode<8, 8, 8, 1, kEpi>(a, stream) : launchDecode<8, 16, 4, 2, kEpi>(a, stream);
    case 5: return small ? launchDecode<4, 8, 4, 1, kEpi>(a, stream) : launchDecode<8, 16, 4, 1, kEpi>(a, stream);
    default: return small ? launchDecode<4, 8, 8, 1, kEpi>(a, stream) : launchDecode<8, 16, 8, 1, kEpi>(a, stream);
  }
}

template <bool kMx, MoeGemmEpilogue kEpi>
Status launchTile(const MoeGemmArgs& a, cudaStream_t stream) {
  if constexpr (kMx) {
    if (a.block_m == 16 && a.mx_max_scale <= kMxfp4MaxDecodeScale && !a.force_tiled &&
        g_decode_variant >= 0)
      return launchDecodeVariant<kEpi>(a, stream);
  }
  switch (a.block_m) {
    // Few rows per expert (decode): one warp per 16 x 32 tile, 6 stages in flight, so the
    // weight stream is spread over many blocks with many loads outstanding.
    case 16: return launchInstance<1, 1, 1, 4, 6, kMx, kEpi>(a, stream);
    case 64: return launchInstance<2, 4, 2, 4, 3, kMx, kEpi>(a, stream);
    case 128: return launchInstance<4, 2, 2, 8, 3, kMx, kEpi>(a, stream);
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

int32_t moeGemmBlockM(int64_t assignments, int32_t num_experts) {
  const int64_t avg = assignments / (num_experts > 0 ? num_experts : 1);
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
  if (a.epilogue == MoeGemmEpilogue::kSwiglu) {
    return mx ? launchTile<true, MoeGemmEpilogue::kSwiglu>(a, stream)
              : launchTile<false, MoeGemmEpilogue::kSwiglu>(a, stream);
  }
  return mx ? launchTile<true, MoeGemmEpilogue::kBias>(a, stream)
            : launchTile<false, MoeGemmEpilogue::kBias>(a, stream);
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
