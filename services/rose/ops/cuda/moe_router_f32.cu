#include <atomic>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/moe_router_f32.cuh"
#include "services/rose/ops/cuda/moe_route_device.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kTok = 16;    // tokens per block
constexpr int kExp = 32;    // experts per block (one per lane)
constexpr int kChunk = 64;  // K columns staged per step
constexpr int kChunks = kRouterF32SliceK / kChunk;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kXStride = kTok + 4;  // row stride of the staged x tile (16-byte aligned rows)
static_assert(kTok == 16, "routerF32TileCounters counts 16-token tiles");
static_assert(kChunk == kWarps * 8, "each warp takes 8 consecutive columns of a chunk");
static_assert(kTok * kChunk / 4 == kThreads, "one float4 of x per thread and chunk");
static_assert(kChunk * kExp / 4 == 2 * kThreads, "two float4 of wt per thread and chunk");

// Block (token tile, expert tile, slice). Thread (tok = i / 16, q = i % 16) stages x[tok][q*4..+3]
// of each chunk (and sums its squares); warp w accumulates columns w*8..w*8+7 of every chunk for
// all 16 tokens with lane = expert; the 8 warps' sums are added in warp order at the end. Every
// sum's order depends on the hidden size alone.
__global__ void __launch_bounds__(kThreads) routerF32Kernel(RouterF32Args a) {
  __shared__ __align__(16) float xs[2][kChunk][kXStride];
  __shared__ __align__(16) float ws[2 * kChunk * kExp];  // [2][kChunk][kExp]; then [8][16][32]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTok;
  const int e0 = static_cast<int>(blockIdx.y) * kExp;
  const int slice = static_cast<int>(blockIdx.z);
  const int kbase = slice * kRouterF32SliceK;
  const int x_tok = tid >> 4, x_q = tid & 15;
  const bool x_row = t0 + x_tok < a.num_tokens;

  // Every chunk of the slice is loaded into registers first (one memory latency per block, not
  // one per chunk: at decode the kernel is latency-bound), then staged and used chunk by chunk.
  // The weights (constant) first: under a programmatic launch [TAG_PDL_GRAPH] their loads are in
  // flight while the previous kernel finishes; the residual only after pdlWait().
  float4 xr[kChunks], wr[kChunks][2];
  int nc = (a.hidden - kbase + kChunk - 1) / kChunk;
  if (nc > kChunks) nc = kChunks;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int idx = tid + r * kThreads;
      const int kk = kbase + c * kChunk + idx / (kExp / 4);
      const int e = e0 + (idx % (kExp / 4)) * 4;
      wr[c][r] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (c < nc && kk < a.hidden && e < a.num_experts)
        wr[c][r] = *reinterpret_cast<const float4*>(
            a.wt + static_cast<int64_t>(kk) * a.num_experts + e);
    }
  }
  pdlWait();
  pdlTrigger();
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int k = kbase + c * kChunk + x_q * 4;
    xr[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c < nc && x_row && k < a.hidden)
      xr[c] = *reinterpret_cast<const float4*>(a.residual + (t0 + x_tok) * a.hidden + k);
  }

  float acc[kTok];
#pragma unroll
  for (int i = 0; i < kTok; ++i) acc[i] = 0.f;
  float ssq = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (c < nc) {
      const int b = c & 1;
      xs[b][x_q * 4 + 0][x_tok] = xr[c].x;
      xs[b][x_q * 4 + 1][x_tok] = xr[c].y;
      xs[b][x_q * 4 + 2][x_tok] = xr[c].z;
      xs[b][x_q * 4 + 3][x_tok] = xr[c].w;
      // Explicit fused multiply-adds (what contraction made of `+= a * b`): routerF32TiledKernel
      // repeats these chains and must give their bits.
      ssq = __fmaf_rn(xr[c].x, xr[c].x, ssq);
      ssq = __fmaf_rn(xr[c].y, xr[c].y, ssq);
      ssq = __fmaf_rn(xr[c].z, xr[c].z, ssq);
      ssq = __fmaf_rn(xr[c].w, xr[c].w, ssq);
#pragma unroll
      for (int r = 0; r < 2; ++r)
        reinterpret_cast<float4*>(ws + b * kChunk * kExp)[tid + r * kThreads] = wr[c][r];
      __syncthreads();
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int k = warp * 8 + j;
        const float wv = ws[(b * kChunk + k) * kExp + lane];
        const float4* xv = reinterpret_cast<const float4*>(&xs[b][k][0]);
#pragma unroll
        for (int q = 0; q < kTok / 4; ++q) {
          const float4 v = xv[q];
          acc[q * 4 + 0] = __fmaf_rn(v.x, wv, acc[q * 4 + 0]);
          acc[q * 4 + 1] = __fmaf_rn(v.y, wv, acc[q * 4 + 1]);
          acc[q * 4 + 2] = __fmaf_rn(v.z, wv, acc[q * 4 + 2]);
          acc[q * 4 + 3] = __fmaf_rn(v.w, wv, acc[q * 4 + 3]);
        }
      }
    }
  }
  // Sum of squares of this slice per token: the 16 threads of a token, in xor order.
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) ssq += __shfl_xor_sync(0xffffffffu, ssq, o);
  if (blockIdx.y == 0 && x_q == 0 && x_row) a.ss[slice * a.num_tokens + t0 + x_tok] = ssq;

  __syncthreads();  // every warp is done with ws: it becomes red[warp][tok][lane]
  float* red = ws;
#pragma unroll
  for (int i = 0; i < kTok; ++i) red[(warp * kTok + i) * kExp + lane] = acc[i];
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int o = tid + r * kThreads;
    const int tok = o / kExp, e = o % kExp;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += red[(w * kTok + tok) * kExp + e];
    if (t0 + tok < a.num_tokens && e0 + e < a.num_experts)
      a.part[(slice * a.num_tokens + t0 + tok) * a.num_experts + e0 + e] = v;
  }
  if (a.route_counters == nullptr) return;
  // [TAG_ROUTER_FUSED_ROUTE] The token tile's last block routes its tokens.
  __shared__ bool s_last;
  __threadfence();  // this block's partials and sums of squares, before its count
  __syncthreads();
  if (tid == 0) {
    const unsigned int blocks = gridDim.y * gridDim.z;
    const unsigned int done = atomicAdd(a.route_counters + blockIdx.x, 1u);
    s_last = done == blocks - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // every other block's writes are visible to the loads below (through L2)
#pragma unroll
  for (int i = 0; i < kTok / kWarps; ++i) {
    const int64_t t = t0 + warp + i * kWarps;
    if (t < a.num_tokens) moeRouteToken(a.route, t, lane);
  }
  if (tid == 0) a.route_counters[blockIdx.x] = 0u;  // ready for the next launch
}

// [TAG_ROUTER_F32_TILED] routerF32Kernel's sums, register-tiled for large steps: the same chains
// in the same order, so the same bits. In routerF32Kernel, the partial of (token, expert) in a
// slice is: for each column group w = 0..7 (warp w), a chain of fused multiply-adds over the
// columns c * 64 + w * 8 + j (chunk c < nc outer, j = 0..7 inner; columns past the hidden size
// staged as zeros), then 0 + g0 + g1 + ... + g7 in order; a token's sum of squares is, for each
// quarter q = 0..15 (4 columns c * 64 + q * 4 + m per chunk), a chain over c then m, combined by
// the xor butterfly over q (offsets 8, 4, 2, 1) as lane 0 of it sees it. Here a block takes 64
// tokens x kTE experts x one slice with 16 warps: warp = (column group w, half of the tokens),
// lane = (8 tokens, kTE / 8 experts) — 8 x (kTE / 8) chains per thread instead of 16 x 1 — with
// the whole slice staged in shared memory once (128 KiB at kTE 64), then reused for the
// column-group sums.
// kTok [TAG_ROUTER_F32_TILED_TOK]: 64 tokens per block (16 warps, one block per SM) or 32 (8
// warps, 2-3 blocks per SM, so one block's staging overlaps another's sums). The chains are per
// (token, expert, column group) and do not depend on the tile: both give the same bits.
template <int kTok>
constexpr int tiledThreads() { return kTok * 8; }
static_assert(kRouterF32SliceK == 256, "the tiled router stages 4 chunks of 64 columns");

// kRows [TAG_ROUTER_F32_TILED_ROWS]: x staged as it lies in memory ([tok][k], rows padded to 257
// floats) by warps reading 512 contiguous bytes of a row, instead of transposed by warps that
// read 16 bytes of each of 32 rows; the sums of squares then come from shared memory (the same
// chains). Off: measured on the H200 without a gain, 2026-12-04 s12 (setRouterF32TiledRows).
constexpr int kRowStride = kRouterF32SliceK + 1;  // conflict-free column reads across 4 rows

template <int kTok>
constexpr int tiledMinBlocks() { return kTok == 32 ? 2 : 1; }

template <int kTE, bool kRows, int kTok>
__global__ void __launch_bounds__(tiledThreads<kTok>(), tiledMinBlocks<kTok>())
    routerF32TiledKernel(RouterF32Args a) {
  constexpr int kTiledThreads = tiledThreads<kTok>();
  constexpr int kTiledTok = kTok;
  constexpr int kGroupWarps = kTok / 32;  // warps per column group
  static_assert(kTok == 32 || kTok == 64, "token tile of 32 or 64");
  constexpr int kEPT = kTE / 8;  // experts per thread
  constexpr int kXsFloats = kRows ? kTiledTok * kRowStride : kRouterF32SliceK * kTiledTok;
  extern __shared__ __align__(16) float smem[];
  float* xs = smem;               // [256 k][64 tok], or [64 tok][257] with kRows
  float* ws = smem + kXsFloats;   // [256 k][kTE]
  __shared__ float ssp[16][kTiledTok];          // sums-of-squares chains per (quarter, token)
  pdlWait();  // [TAG_PDL_GRAPH]
  pdlTrigger();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTiledTok;
  const int e0 = static_cast<int>(blockIdx.y) * kTE;
  const int slice = static_cast<int>(blockIdx.z);
  const int kbase = slice * kRouterF32SliceK;
  int nc = (a.hidden - kbase + 63) / 64;
  if (nc > 4) nc = 4;

  if constexpr (kRows) {
    // Thread i stages float4 i % 64 of rows i / 64 + (kTok / 8) r: a warp reads 512 contiguous
    // bytes.
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int tok = (tid >> 6) + (kTok / 8) * r, c4 = tid & 63;
      if ((c4 >> 4) < nc) {
        const int k = kbase + c4 * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t0 + tok < a.num_tokens && k < a.hidden)
          v = __ldg(reinterpret_cast<const float4*>(a.residual + (t0 + tok) * a.hidden + k));
        float* d = xs + tok * kRowStride + c4 * 4;
        d[0] = v.x;
        d[1] = v.y;
        d[2] = v.z;
        d[3] = v.w;
      }
    }
  } else {
  // Stage x (transposed to [k][tok]) and the chains of the sums of squares: thread i takes token
  // i % kTok and quarters b = i / kTok and b + 8 of every chunk (chunk r / 2).
    const int tok = tid % kTok, b = tid / kTok;
    const bool row = t0 + tok < a.num_tokens;
    const float* xrow = a.residual + (row ? t0 + tok : 0) * a.hidden;
    float s_lo = 0.f, s_hi = 0.f;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int c = r >> 1, q = b + 8 * (r & 1);
      if (c < nc) {
        const int k = kbase + c * 64 + q * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row && k < a.hidden) v = __ldg(reinterpret_cast<const float4*>(xrow + k));
        float s = (r & 1) ? s_hi : s_lo;  // r is a constant of the unrolled loop
        s = __fmaf_rn(v.x, v.x, s);
        s = __fmaf_rn(v.y, v.y, s);
        s = __fmaf_rn(v.z, v.z, s);
        s = __fmaf_rn(v.w, v.w, s);
        if (r & 1) {
          s_hi = s;
        } else {
          s_lo = s;
        }
        const int kk = c * 64 + q * 4;
        xs[(kk + 0) * kTiledTok + tok] = v.x;
        xs[(kk + 1) * kTiledTok + tok] = v.y;
        xs[(kk + 2) * kTiledTok + tok] = v.z;
        xs[(kk + 3) * kTiledTok + tok] = v.w;
      }
    }
    ssp[b][tok] = s_lo;
    ssp[b + 8][tok] = s_hi;
  }
  // Stage the weights [k][kTE] (rows past the hidden size or experts past E as zeros).
  {
    constexpr int kVecPerRow = kTE / 4;
    for (int idx = tid; idx < nc * 64 * kVecPerRow; idx += kTiledThreads) {
      const int kk = idx / kVecPerRow, e = e0 + (idx % kVecPerRow) * 4;
      const int k = kbase + kk;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (k < a.hidden && e < a.num_experts)
        v = __ldg(reinterpret_cast<const float4*>(a.wt + static_cast<int64_t>(k) * a.num_experts + e));
      reinterpret_cast<float4*>(ws)[idx] = v;
    }
  }
  __syncthreads();
  if constexpr (kRows) {
    // The chains of the sums of squares from the staged rows (only the first expert tile writes
    // them): thread i takes token i / 8 and quarters b = i % 8 and b + 8 (columns
    // c * 64 + q * 4 + m, chunk outer, m inner).
    const int tok = tid >> 3, b = tid & 7;
    if (blockIdx.y == 0) {
      const float* xr = xs + tok * kRowStride;
      float s_lo = 0.f, s_hi = 0.f;
      for (int c = 0; c < nc; ++c) {
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float lo = xr[c * 64 + b * 4 + m], hi = xr[c * 64 + (b + 8) * 4 + m];
          s_lo = __fmaf_rn(lo, lo, s_lo);
          s_hi = __fmaf_rn(hi, hi, s_hi);
        }
      }
      ssp[b][tok] = s_lo;
      ssp[b + 8][tok] = s_hi;
    }
    __syncthreads();  // outside the branch: every thread of the block reaches it
  }

  // The sums of squares: lane 0's view of the xor butterfly over the 16 quarters.
  if (blockIdx.y == 0 && tid < kTiledTok && t0 + tid < a.num_tokens) {
    float l[8], m[4];
#pragma unroll
    for (int q = 0; q < 8; ++q) l[q] = ssp[q][tid] + ssp[q + 8][tid];
#pragma unroll
    for (int q = 0; q < 4; ++q) m[q] = l[q] + l[q + 4];
    const float n0 = m[0] + m[2], n1 = m[1] + m[3];
    a.ss[slice * a.num_tokens + t0 + tid] = n0 + n1;
  }

  // Column group w = warp / kGroupWarps; tokens (warp % kGroupWarps) * 32 + (lane / 8) * 8 .. + 7;
  // experts (lane % 8) * kEPT .. + kEPT - 1 of the tile.
  const int w = warp / kGroupWarps;
  const int tk0 = (warp % kGroupWarps) * 32 + (lane >> 3) * 8;
  const int ek0 = (lane & 7) * kEPT;
  float acc[8][kEPT];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < kEPT; ++e) acc[i][e] = 0.f;
  for (int c = 0; c < nc; ++c) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int kk = c * 64 + w * 8 + j;
      float xv[8];
      if constexpr (kRows) {
#pragma unroll
        for (int i = 0; i < 8; ++i) xv[i] = xs[(tk0 + i) * kRowStride + kk];
      } else {
        const float4 xa = *reinterpret_cast<const float4*>(xs + kk * kTiledTok + tk0);
        const float4 xb = *reinterpret_cast<const float4*>(xs + kk * kTiledTok + tk0 + 4);
        xv[0] = xa.x;
        xv[1] = xa.y;
        xv[2] = xa.z;
        xv[3] = xa.w;
        xv[4] = xb.x;
        xv[5] = xb.y;
        xv[6] = xb.z;
        xv[7] = xb.w;
      }
      float wv[kEPT];
#pragma unroll
      for (int e = 0; e < kEPT; e += 4) {
        const float4 v = *reinterpret_cast<const float4*>(ws + kk * kTE + ek0 + e);
        wv[e] = v.x;
        wv[e + 1] = v.y;
        wv[e + 2] = v.z;
        wv[e + 3] = v.w;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < kEPT; ++e) acc[i][e] = __fmaf_rn(xv[i], wv[e], acc[i][e]);
    }
  }
  __syncthreads();  // every warp is done with the staged slice: it becomes red[w][tok][kTE]
  float* red = smem;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < kEPT; e += 4)
      *reinterpret_cast<float4*>(red + (w * kTiledTok + tk0 + i) * kTE + ek0 + e) =
          make_float4(acc[i][e], acc[i][e + 1], acc[i][e + 2], acc[i][e + 3]);
  __syncthreads();
  for (int o = tid; o < kTiledTok * kTE; o += kTiledThreads) {
    const int tok = o / kTE, e = o % kTE;
    float v = 0.f;
#pragma unroll
    for (int g = 0; g < 8; ++g) v += red[(g * kTiledTok + tok) * kTE + e];
    if (t0 + tok < a.num_tokens && e0 + e < a.num_experts)
      a.part[(slice * a.num_tokens + t0 + tok) * a.num_experts + e0 + e] = v;
  }
}

template <int kTE, bool kRows, int kTok>
constexpr size_t routerTiledSmem() {
  return sizeof(float) * ((kRows ? kTok * kRowStride : kRouterF32SliceK * kTok) +
                          kRouterF32SliceK * kTE);
}
static_assert(routerTiledSmem<64, false, 64>() >= sizeof(float) * 8 * 64 * 64, "red fits");
static_assert(routerTiledSmem<32, false, 64>() >= sizeof(float) * 8 * 64 * 32, "red fits");
static_assert(routerTiledSmem<64, true, 64>() >= sizeof(float) * 8 * 64 * 64, "red fits");
static_assert(routerTiledSmem<32, true, 64>() >= sizeof(float) * 8 * 64 * 32, "red fits");
static_assert(routerTiledSmem<64, false, 32>() >= sizeof(float) * 8 * 32 * 64, "red fits");
static_assert(routerTiledSmem<32, false, 32>() >= sizeof(float) * 8 * 32 * 32, "red fits");
static_assert(64 * kRowStride % 4 == 0, "ws stays 16-byte aligned after padded rows");

std::atomic<int64_t> g_tiled_min_tokens{kRouterF32TiledMinTokens};
std::atomic<bool> g_tiled_rows{false};  // [TAG_ROUTER_F32_TILED_ROWS]
std::atomic<int> g_tiled_tok{kRouterF32TiledTok};  // [TAG_ROUTER_F32_TILED_TOK]

template <int kTE, bool kRows, int kTok>
Status launchRouterTiled(const RouterF32Args& a, cudaStream_t stream) {
  constexpr size_t smem = routerTiledSmem<kTE, kRows, kTok>();
  static const cudaError_t attr =
      cudaFuncSetAttribute(routerF32TiledKernel<kTE, kRows, kTok>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  CUDA_RETURN_IF_ERROR(attr);
  const dim3 grid(static_cast<unsigned>((a.num_tokens + kTok - 1) / kTok),
                  static_cast<unsigned>((a.num_experts + kTE - 1) / kTE),
                  static_cast<unsigned>(routerF32Splits(a.hidden)));
  auto* kernel = routerF32TiledKernel<kTE, kRows, kTok>;
  CUDA_RETURN_IF_ERROR(launchPdlAlways(a.pdl, kernel, grid,
                                       dim3(tiledThreads<kTok>()), smem, stream, a));
  return okStatus();
}

// [TAG_ROUTER_MMA] The tensor-core router (moe_router_f32.cuh RouterMmaArgs).
constexpr int kMmaWarps = 4;
constexpr int kMmaTok = 16 * kMmaWarps;  // tokens per block (16 per warp: the mma's M)
constexpr int kMmaNTiles = 8;            // n-tiles of 8 experts per warp
constexpr int kMmaExp = 8 * kMmaNTiles;  // experts per block
constexpr int kMmaGroup = 4;             // n-tiles whose weights are loaded together
constexpr int kMmaSteps = kRouterF32SliceK / 32;
static_assert(kRouterF32SliceK % 32 == 0, "a slice is whole k32 steps");

// x == hi + mid + lo exactly (each difference is exact in f32; 3 x 8 significand bits plus the
// rounding signs cover f32's 24). Packed in pairs as the mma fragments want them.
__device__ __forceinline__ void splitPair(float x0, float x1, uint32_t& hi, uint32_t& mid,
                                          uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float r0 = x0 - __low2float(h), r1 = x1 - __high2float(h);
  const __nv_bfloat162 m = __floats2bfloat162_rn(r0, r1);
  const __nv_bfloat162 l = __floats2bfloat162_rn(r0 - __low2float(m), r1 - __high2float(m));
  hi = *reinterpret_cast<const uint32_t*>(&h);
  mid = *reinterpret_cast<const uint32_t*>(&m);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// Warp w of block (expert tile, token tile, slice) owns tokens t0 + 16w .. + 15 and the block's
// 64 experts over the slice's k32 steps. The K order inside a k32 step is permuted (the same
// permutation for A and B, so the dot products are unchanged): thread (g = lane / 4, t = lane % 4)
// holds, for k16 half h, physical columns k0 + 8t + 4h + {0, 1} in fragment slots {2t, 2t + 1}
// and + {2, 3} in slots {2t + 8, 2t + 9}. So a thread reads 8 consecutive floats of each of its
// two rows (two float4) and 8 consecutive bf16 of each expert row of either weight plane (one
// 16-byte load each): no shared memory, the four warps' weight loads meet in L1.
__global__ void __launch_bounds__(kMmaWarps * 32, 4) routerMmaKernel(RouterMmaArgs a) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t tw = static_cast<int64_t>(blockIdx.y) * kMmaTok + warp * 16;
  if (tw >= a.num_tokens) return;  // no block-wide synchronization below
  const int e0 = static_cast<int>(blockIdx.x) * kMmaExp;
  const int slice = static_cast<int>(blockIdx.z);
  const int kbase = slice * kRouterF32SliceK;
  const int ksteps = min(kMmaSteps, (a.hidden - kbase + 31) / 32);
  const int64_t hp = (a.hidden + 31) / 32 * 32;
  const int64_t ep = (a.num_experts + 7) / 8 * 8;
  const int ntiles = min(kMmaNTiles, static_cast<int>((ep - e0) / 8));
  const int64_t r0 = tw + g, r1 = r0 + 8;
  const bool v0 = r0 < a.num_tokens, v1 = r1 < a.num_tokens;
  const float* x0 = a.residual + (v0 ? r0 : 0) * a.hidden;
  const float* x1 = a.residual + (v1 ? r1 : 0) * a.hidden;
  const uint16_t* whi = a.w + static_cast<int64_t>(e0 + g) * hp + kbase + 8 * t;
  const int64_t lo_plane = ep * hp;

  float acc[kMmaNTiles][4];
#pragma unroll
  for (int j = 0; j < kMmaNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float ss0 = 0.f, ss1 = 0.f;
#pragma unroll 1
  for (int s = 0; s < ksteps; ++s) {
    const int k = kbase + 32 * s + 8 * t;
    float4 xa[2][2];  // [row][half]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int kk = k + 4 * h;
      const bool in = kk < a.hidden;  // hidden % 4 == 0: a float4 is all in or all out
      xa[0][h] = v0 && in ? __ldg(reinterpret_cast<const float4*>(x0 + kk)) : make_float4(0, 0, 0, 0);
      xa[1][h] = v1 && in ? __ldg(reinterpret_cast<const float4*>(x1 + kk)) : make_float4(0, 0, 0, 0);
    }
    // A fragments of both k16 halves: a0 (row g, slots 2t..), a1 (row g + 8, 2t..), a2 (row g,
    // 2t + 8..), a3 (row g + 8, 2t + 8..), one set per part.
    uint32_t ah[2][4], am[2][4], al[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 p0 = xa[0][h], p1 = xa[1][h];
      ss0 += p0.x * p0.x;
      ss0 += p0.y * p0.y;
      ss0 += p0.z * p0.z;
      ss0 += p0.w * p0.w;
      ss1 += p1.x * p1.x;
      ss1 += p1.y * p1.y;
      ss1 += p1.z * p1.z;
      ss1 += p1.w * p1.w;
      splitPair(p0.x, p0.y, ah[h][0], am[h][0], al[h][0]);
      splitPair(p1.x, p1.y, ah[h][1], am[h][1], al[h][1]);
      splitPair(p0.z, p0.w, ah[h][2], am[h][2], al[h][2]);
      splitPair(p1.z, p1.w, ah[h][3], am[h][3], al[h][3]);
    }
    // The n-tiles in groups (fewer live weight registers; the group's loads issue together).
#pragma unroll
    for (int jg = 0; jg < kMmaNTiles; jg += kMmaGroup) {
      uint4 bh[kMmaGroup], bl[kMmaGroup];
#pragma unroll
      for (int jj = 0; jj < kMmaGroup; ++jj) {
        if (jg + jj < ntiles) {
          const uint16_t* p = whi + static_cast<int64_t>(8 * (jg + jj)) * hp + 32 * s;
          bh[jj] = __ldg(reinterpret_cast<const uint4*>(p));
          bl[jj] = __ldg(reinterpret_cast<const uint4*>(p + lo_plane));
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int jj = 0; jj < kMmaGroup; ++jj) {
          if (jg + jj < ntiles) {
            const uint32_t h0 = h ? bh[jj].z : bh[jj].x, h1 = h ? bh[jj].w : bh[jj].y;
            const uint32_t l0 = h ? bl[jj].z : bl[jj].x, l1 = h ? bl[jj].w : bl[jj].y;
            float(&c)[4] = acc[jg + jj];
            // Smallest products first.
            mmaBf16(c, al[h], h0, h1);
            mmaBf16(c, am[h], l0, l1);
            mmaBf16(c, am[h], h0, h1);
            mmaBf16(c, ah[h], l0, l1);
            mmaBf16(c, ah[h], h0, h1);
          }
        }
      }
    }
  }
  // Sums of squares of the two rows over the slice: the 4 threads of a row, in xor order.
  ss0 += __shfl_xor_sync(0xffffffffu, ss0, 1);
  ss0 += __shfl_xor_sync(0xffffffffu, ss0, 2);
  ss1 += __shfl_xor_sync(0xffffffffu, ss1, 1);
  ss1 += __shfl_xor_sync(0xffffffffu, ss1, 2);
  if (blockIdx.x == 0 && t == 0) {
    if (v0) a.ss[slice * a.num_tokens + r0] = ss0;
    if (v1) a.ss[slice * a.num_tokens + r1] = ss1;
  }
  // c0, c1: row g, experts 2t, 2t + 1 of the n-tile; c2, c3: row g + 8.
#pragma unroll
  for (int j = 0; j < kMmaNTiles; ++j) {
    const int e = e0 + 8 * j + 2 * t;
    if (j < ntiles && e < a.num_experts) {  // num_experts % 4 == 0: e + 1 < num_experts too
      if (v0)
        *reinterpret_cast<float2*>(a.part + (slice * a.num_tokens + r0) * a.num_experts + e) =
            make_float2(acc[j][0], acc[j][1]);
      if (v1)
        *reinterpret_cast<float2*>(a.part + (slice * a.num_tokens + r1) * a.num_experts + e) =
            make_float2(acc[j][2], acc[j][3]);
    }
  }
}

bool g_fused_route = false;
std::atomic<bool> g_router_mma{false};  // CudaKernelOptions::router_mma  // measured slower in the graphed step (see the header)

}  // namespace

void setRouterFusedRoute(bool on) { g_fused_route = on; }
void setRouterMma(bool on) { g_router_mma.store(on); }
void setRouterF32TiledMinTokens(int64_t tokens) { g_tiled_min_tokens.store(tokens); }
void setRouterF32TiledRows(bool on) { g_tiled_rows.store(on); }
void setRouterF32TiledTok(int tokens) { g_tiled_tok.store(tokens == 32 ? 32 : 64); }
bool routerMma() { return g_router_mma.load(); }
bool routerFusedRoute() { return g_fused_route; }

Status launchRouterF32Partials(const RouterF32Args& a, cudaStream_t stream) {
  if (a.hidden <= 0 || a.hidden % 4 != 0)
    return invalidArgument("router_f32: hidden must be a positive multiple of 4");
  if (a.num_experts <= 0 || a.num_experts % 4 != 0)
    return invalidArgument("router_f32: num_experts must be a positive multiple of 4");
  if ((reinterpret_cast<uintptr_t>(a.residual) | reinterpret_cast<uintptr_t>(a.wt)) % 16 != 0)
    return invalidArgument("router_f32: residual and wt must be 16-byte aligned");
  if (a.route_counters != nullptr) {
    RETURN_IF_ERROR(checkMoeRoute(a.route));
    if (a.route.logits != a.part || a.route.ss != a.ss || a.route.splits != routerF32Splits(a.hidden) ||
        a.route.num_tokens != a.num_tokens || a.route.num_experts != a.num_experts ||
        a.route.hidden != a.hidden)
      return invalidArgument("router_f32: the fused route must read this router's partials");
  }
  if (a.num_tokens == 0) return okStatus();
  // [TAG_ROUTER_F32_TILED] Large steps: the register-tiled kernel, the same bits.
  const int64_t tiled_min = g_tiled_min_tokens.load();
  if (a.route_counters == nullptr && tiled_min > 0 && a.num_tokens >= tiled_min) {
    if (a.num_tokens > 65535LL * 32)
      return invalidArgument("router_f32: too many tokens for one launch");
    if (g_tiled_rows.load())
      return a.num_experts <= 32 ? launchRouterTiled<32, true, 64>(a, stream)
                                 : launchRouterTiled<64, true, 64>(a, stream);
    if (g_tiled_tok.load() == 32)
      return a.num_experts <= 32 ? launchRouterTiled<32, false, 32>(a, stream)
                                 : launchRouterTiled<64, false, 32>(a, stream);
    return a.num_experts <= 32 ? launchRouterTiled<32, false, 64>(a, stream)
                               : launchRouterTiled<64, false, 64>(a, stream);
  }
  const dim3 grid(static_cast<unsigned>((a.num_tokens + kTok - 1) / kTok),
                  static_cast<unsigned>((a.num_experts + kExp - 1) / kExp),
                  static_cast<unsigned>(routerF32Splits(a.hidden)));
  CUDA_RETURN_IF_ERROR(launchPdlAlways(a.pdl, routerF32Kernel, grid, dim3(kThreads), 0, stream, a));
  return okStatus();
}

Status launchRouterMmaPartials(const RouterMmaArgs& a, cudaStream_t stream) {
  if (a.hidden <= 0 || a.hidden % 4 != 0)
    return invalidArgument("router_mma: hidden must be a positive multiple of 4");
  if (a.num_experts <= 0 || a.num_experts % 4 != 0)
    return invalidArgument("router_mma: num_experts must be a positive multiple of 4");
  if ((reinterpret_cast<uintptr_t>(a.residual) | reinterpret_cast<uintptr_t>(a.w)) % 16 != 0)
    return invalidArgument("router_mma: residual and w must be 16-byte aligned");
  if (a.num_tokens == 0) return okStatus();
  const dim3 grid(static_cast<unsigned>((a.num_experts + kMmaExp - 1) / kMmaExp),
                  static_cast<unsigned>((a.num_tokens + kMmaTok - 1) / kMmaTok),
                  static_cast<unsigned>(routerF32Splits(a.hidden)));
  if (grid.y > 65535u) return invalidArgument("router_mma: too many tokens for one launch");
  routerMmaKernel<<<grid, kMmaWarps * 32, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
