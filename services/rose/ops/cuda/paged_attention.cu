#include <algorithm>
#include <cmath>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/paged_attention.cuh"
#include "services/rose/ops/cuda/paged_attention_sm90.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kKeys = 64;            // keys per K/V tile
constexpr int kWarps = 4;            // 16 rows each
constexpr int kRows = 16 * kWarps;   // rows (query token x q head of the group) per block
constexpr int kHeadDim = 64;         // gpt-oss
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kRow = kHeadDim + 8;          // padded smem row: conflict-free ldmatrix
constexpr int kTileElems = kKeys * kRow;    // one K or V tile in shared memory
// Dynamic shared memory: the multi-token items use 4 tile buffers (K and V, two stages), the
// single-token items 8 (K and V of each warp's own tile) [TAG_ATTN_DECODE_WARPS].
constexpr size_t kSmemItem = 4 * kTileElems * 2;
constexpr size_t kSmemSingle = 8 * kTileElems * 2;

// The online-softmax step of one warp over one 64-key tile (sk / sv: [kKeys][kRow] in shared
// memory, keys key0..key0 + 63): scores of its 16 rows (q fragments qf), masked to [lo, hi] per
// row half (r0: lo0/hi0, r1: lo1/hi1), running max m (log2 units) and sum l, o += P V. The
// same operations in the same order whichever path calls it.
template <int kD, typename T>
__device__ __forceinline__ void attnTileStep(const T* sk, const T* sv, const int key0, const int lo0,
                                             const int hi0, const int lo1, const int hi1,
                                             const uint32_t (&qf)[kD / 16][4],
                                             float (&o)[kD / 8][4], float& m0, float& m1,
                                             float& l0, float& l1, const float scale_log2,
                                             const int lane) {
  constexpr int kKSteps = kD / 16;
  constexpr int kDTiles = kD / 8;
  const int t4 = lane & 3;
  const int mi = lane >> 3;  // which 8x8 matrix this lane addresses in ldmatrix.x4
  const int mr = lane & 7;   // which row of it
  float s[kKeys / 8][4];
#pragma unroll
  for (int i = 0; i < kKeys / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
  for (int nt2 = 0; nt2 < kKeys / 16; ++nt2) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t b[4];
      ldmatrixX4(b, sk + (nt2 * 16 + (mi >> 1) * 8 + mr) * kRow + kk * 16 + (mi & 1) * 8);
      mma16<T>(s[2 * nt2], qf[kk], b[0], b[1]);
      mma16<T>(s[2 * nt2 + 1], qf[kk], b[2], b[3]);
    }
  }
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = key0 + nt * 8 + 2 * t4 + e;
      const bool ok0 = key >= lo0 && key <= hi0;
      const bool ok1 = key >= lo1 && key <= hi1;
      s[nt][e] = ok0 ? __fmul_rn(s[nt][e], scale_log2) : -INFINITY;
      s[nt][2 + e] = ok1 ? __fmul_rn(s[nt][2 + e], scale_log2) : -INFINITY;
      mx0 = fmaxf(mx0, s[nt][e]);
      mx1 = fmaxf(mx1, s[nt][2 + e]);
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
  for (int nt = 0; nt < kKeys / 8; ++nt) {
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
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint32_t pa[4] = {pack16x2<T>(s[2 * kk][0], s[2 * kk][1]),
                            pack16x2<T>(s[2 * kk][2], s[2 * kk][3]),
                            pack16x2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                            pack16x2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int dt2 = 0; dt2 < kDTiles / 2; ++dt2) {
      uint32_t b[4];
      ldmatrixX4Trans(b, sv + (kk * 16 + (mi & 1) * 8 + mr) * kRow + dt2 * 16 + (mi >> 1) * 8);
      mma16<T>(o[2 * dt2], pa, b[0], b[1]);
      mma16<T>(o[2 * dt2 + 1], pa, b[2], b[3]);
    }
  }
}

// One row half's result (half 0: row r0, 1: r1 of the lane's fragment): a split item's
// un-normalized partial (o, m, l) into its part slot, or the finished row (the sink joins the
// denominator) into out. l is the row's whole sum (reduced over the quad).
template <int kD, typename T>
__device__ __forceinline__ void attnStoreRow(const PagedAttentionArgs& a, const PagedAttnWork& w,
                                             const int row, const int qh, const int half,
                                             const float (&o)[kD / 8][4], const float m,
                                             const float l, const int t4) {
  constexpr int kDTiles = kD / 8;
  if (w.part >= 0) {  // split-KV partial (single-token sequence): un-normalized o, m, l
    float* po = a.part_o + (static_cast<int64_t>(w.part) * a.num_q_heads + qh) * kD + 2 * t4;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      po[dt * 8] = o[dt][2 * half];
      po[dt * 8 + 1] = o[dt][2 * half + 1];
    }
    if (t4 == 0) {
      float* ml = a.part_ml + (static_cast<int64_t>(w.part) * a.num_q_heads + qh) * 2;
      ml[0] = m;
      ml[1] = l;
    }
    return;
  }
  float inv = 0.f;
  if (m != -INFINITY) {
    const float sink = a.sinks != nullptr ? exp2f(a.sinks[qh] * kLog2e - m) : 0.f;
    inv = 1.f / (l + sink);
  }
  const int64_t out_stride = static_cast<int64_t>(a.num_q_heads) * kD;
  uint32_t* p = reinterpret_cast<uint32_t*>(reinterpret_cast<T*>(a.out) + row * out_stride +
                                            static_cast<int64_t>(qh) * kD + 2 * t4);
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt)
    p[dt * 4] = pack16x2<T>(o[dt][2 * half] * inv, o[dt][2 * half + 1] * inv);
}

// The q fragments of rows r0 / r1 (zero for an invalid row).
template <int kD, typename T>
__device__ __forceinline__ void attnLoadQ(const T* q0, const T* q1, const bool v0, const bool v1,
                                          const int t4, uint32_t (&qf)[kD / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const int c = kk * 16 + 2 * t4;
    const uint32_t* p0 = reinterpret_cast<const uint32_t*>(q0 + c);
    const uint32_t* p1 = reinterpret_cast<const uint32_t*>(q1 + c);
    qf[kk][0] = v0 ? p0[0] : 0u;
    qf[kk][1] = v1 ? p1[0] : 0u;
    qf[kk][2] = v0 ? p0[4] : 0u;
    qf[kk][3] = v1 ? p1[4] : 0u;
  }
}

// Cache offset (elements) of 16-byte chunk c of key `key`'s row for kv head kvh, or -1 when the
// key is outside [key_begin, key_end) or its block id is not a cache block.
template <int kD>
__device__ __forceinline__ int64_t attnCacheOffset(const PagedAttentionArgs& a,
                                                   const int32_t* table, const PagedAttnWork& w,
                                                   const int key, const int kvh, const int c) {
  if (key < w.key_begin || key >= w.key_end) return -1;
  const int blk = table[key / a.block_size];
  if (blk < 0 || blk >= a.num_blocks) return -1;
  return ((static_cast<int64_t>(blk) * a.block_size + key % a.block_size) * a.num_kv_heads + kvh) *
             kD + c;
}

// Block (work item w, kv head blockIdx.y). Row r of the block is query token w.tok0 + r / kG
// of the sequence and q head kvh * kG + r % kG. Thread (warp, lane) owns rows r0 = warp*16 +
// lane/4 and r1 = r0 + 8 (the two halves of an mma fragment), and columns 2*(lane%4) (+1) of
// every 8-wide tile. smem: kSmemItem bytes (K stages 0-1, V stages 0-1).
template <int kD, int kG, typename T>
__device__ __forceinline__ void pagedAttnItem(const PagedAttentionArgs& a, const PagedAttnWork& w,
                                              const int kvh, T* smem) {
  constexpr int kKSteps = kD / 16;    // k-steps of Q K^T over head_dim
  constexpr int kDTiles = kD / 8;     // 8-wide output column tiles
  constexpr int kChunks = kD / 8;     // 16-byte chunks per K/V row
  static_assert(kD == kHeadDim, "the shared tiles are laid out for head_dim 64");
  const T* qkv = reinterpret_cast<const T*>(a.qkv);
  const T* k_cache = reinterpret_cast<const T*>(a.k_cache);
  const T* v_cache = reinterpret_cast<const T*>(a.v_cache);

  const int seq = w.seq;
  const int start = a.cu_q[seq];
  const int len = a.cu_q[seq + 1] - start;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const int g8 = lane >> 2;
  const int t4 = lane & 3;
  const int r0 = warp * 16 + g8;
  const int r1 = r0 + 8;
  const int tok0 = w.tok0 + r0 / kG;
  const int tok1 = w.tok0 + r1 / kG;
  const int qh0 = kvh * kG + r0 % kG;
  const int qh1 = kvh * kG + r1 % kG;
  const bool v0 = tok0 < len;
  const bool v1 = tok1 < len;
  const int64_t stride = static_cast<int64_t>(a.num_q_heads + 2 * a.num_kv_heads) * kD;
  const int pos0 = v0 ? a.positions[start + tok0] : -1;
  const int pos1 = v1 ? a.positions[start + tok1] : -1;
  const int win = a.sliding_window;
  // Keys row r may see: [lo, hi] (empty for an invalid row).
  const int lo0 = max(w.key_begin, win > 0 ? pos0 - win + 1 : 0);
  const int hi0 = v0 ? min(w.key_end - 1, pos0) : -1;
  const int lo1 = max(w.key_begin, win > 0 ? pos1 - win + 1 : 0);
  const int hi1 = v1 ? min(w.key_end - 1, pos1) : -1;
  const bool warp_active = __any_sync(0xffffffffu, lo0 <= hi0 || lo1 <= hi1);

  uint32_t qf[kKSteps][4];
  attnLoadQ<kD, T>(qkv + static_cast<int64_t>(start + (v0 ? tok0 : 0)) * stride +
                       static_cast<int64_t>(qh0) * kD,
                   qkv + static_cast<int64_t>(start + (v1 ? tok1 : 0)) * stride +
                       static_cast<int64_t>(qh1) * kD,
                   v0, v1, t4, qf);

  float o[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks;
  const int t_begin = w.key_begin / kKeys;
  const int t_end = w.key_end > w.key_begin ? (w.key_end + kKeys - 1) / kKeys : t_begin;
  T* s_k = smem;                    // [2][kKeys][kRow]
  T* s_v = smem + 2 * kTileElems;   // [2][kKeys][kRow]
  auto load_tile = [&](int tile, int stage) {
    const int key0 = tile * kKeys;
    for (int i = threadIdx.x; i < kKeys * kChunks; i += kWarps * 32) {
      const int r = i / kChunks;
      const int c = (i % kChunks) * 8;
      const int64_t off = attnCacheOffset<kD>(a, table, w, key0 + r, kvh, c);
      const int64_t at = stage * kTileElems + r * kRow + c;
      cpAsync16(s_k + at, k_cache + (off < 0 ? 0 : off), off >= 0);
      cpAsync16(s_v + at, v_cache + (off < 0 ? 0 : off), off >= 0);
    }
  };
  if (t_begin < t_end) {
    load_tile(t_begin, 0);
    cpAsyncCommit();
  }
  const float scale_log2 = a.scale * kLog2e;

  for (int tile = t_begin; tile < t_end; ++tile) {
    const int stage = (tile - t_begin) & 1;
    if (tile + 1 < t_end) {
      load_tile(tile + 1, stage ^ 1);
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads();
    if (warp_active) {
      attnTileStep<kD, T>(s_k + stage * kTileElems, s_v + stage * kTileElems, tile * kKeys, lo0,
                          hi0, lo1, hi1, qf, o, m0, m1, l0, l1, scale_log2, lane);
    }
    __syncthreads();  // this stage is refilled two iterations later
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (v0) attnStoreRow<kD, T>(a, w, start + tok0, qh0, 0, o, m0, l0, t4);
  if (v1) attnStoreRow<kD, T>(a, w, start + tok1, qh1, 1, o, m1, l1, t4);
}

// [TAG_ATTN_DECODE_WARPS] A single-token item (a decode token, or one chunk of its keys under
// split-KV) when the GQA group fits one warp's 16 rows (kG <= 16): the row layout of warp 0 of
// pagedAttnItem (rows r < kG are the group's q heads), but each of the 4 warps takes every 4th
// key tile of the item into a K/V buffer pair of its own, so the item's tiles are in flight at
// once instead of one after another (the multi-token path streams them through two shared
// stages while one warp computes). The warps' (m, l, o) merge in warp order 0, 1, 2, 3 (scaled
// to the common max) before the store. The rows' keys, and so the result up to f32 rounding,
// are those of pagedAttnItem; the split into warps depends only on the item's key range.
//
// Before its pdlWait (the first item of a block only: `waited` false) it issues the loads that
// do not depend on the kernels it waits for: the work item, the sequence's position and block
// table (uploaded with the step's plan) and the cached keys below the token's own position
// (written by earlier steps; the RoPE + KV write kernel before this one writes only the row of
// the token's own position, which is loaded after the wait, as is q).
template <int kD, int kG, typename T>
__device__ __forceinline__ void pagedAttnSingleItem(const PagedAttentionArgs& a,
                                                    const PagedAttnWork& w, const int kvh,
                                                    T* smem, bool& waited) {
  constexpr int kKSteps = kD / 16;
  constexpr int kDTiles = kD / 8;
  constexpr int kChunks = kD / 8;
  static_assert(kG <= 16, "one warp's 16 rows hold the group");
  static_assert(kD == kHeadDim, "the shared tiles are laid out for head_dim 64");
  const T* qkv = reinterpret_cast<const T*>(a.qkv);
  const T* k_cache = reinterpret_cast<const T*>(a.k_cache);
  const T* v_cache = reinterpret_cast<const T*>(a.v_cache);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const int g8 = lane >> 2;
  const int t4 = lane & 3;
  const int start = a.cu_q[w.seq];
  const int pos = a.positions[start];
  const int win = a.sliding_window;
  const int lo = max(w.key_begin, win > 0 ? pos - win + 1 : 0);
  const int hi = min(w.key_end - 1, pos);
  const int32_t* table = a.block_tables + static_cast<int64_t>(w.seq) * a.max_blocks;
  const int t_begin = w.key_begin / kKeys;
  const int t_end = w.key_end > w.key_begin ? (w.key_end + kKeys - 1) / kKeys : t_begin;
  T* s_k = smem + (2 * warp) * kTileElems;
  T* s_v = s_k + kTileElems;
  // mode 0: every row of the tile but the token's own; 1: only that row; 2: every row.
  auto load_tile = [&](int tile, int mode) {
    const int key0 = tile * kKeys;
    if (mode == 1) {
      if (lane < kChunks && pos >= key0 && pos < key0 + kKeys) {
        const int64_t off = attnCacheOffset<kD>(a, table, w, pos, kvh, lane * 8);
        const int at = (pos - key0) * kRow + lane * 8;
        cpAsync16(s_k + at, k_cache + (off < 0 ? 0 : off), off >= 0);
        cpAsync16(s_v + at, v_cache + (off < 0 ? 0 : off), off >= 0);
      }
      return;
    }
#pragma unroll
    for (int j = 0; j < kKeys * kChunks / 32; ++j) {  // unrolled: the table reads issue together
      const int i = lane + 32 * j;
      const int r = i / kChunks;
      const int c = (i % kChunks) * 8;
      if (mode == 0 && key0 + r == pos) continue;
      const int64_t off = attnCacheOffset<kD>(a, table, w, key0 + r, kvh, c);
      cpAsync16(s_k + r * kRow + c, k_cache + (off < 0 ? 0 : off), off >= 0);
      cpAsync16(s_v + r * kRow + c, v_cache + (off < 0 ? 0 : off), off >= 0);
    }
  };
  int tile = t_begin + warp;
  if (!waited) {
    if (tile < t_end) load_tile(tile, 0);
    pdlWait();     // [TAG_PDL_GRAPH] q and the token's own K/V row are the previous kernel's
    pdlTrigger();  // [TAG_PDL_GEMV] the combine or the O-proj GEMV may be scheduled
    waited = true;
    if (tile < t_end) load_tile(tile, 1);
  } else if (tile < t_end) {
    load_tile(tile, 2);
  }
  cpAsyncCommit();

  // Rows r0 = g8, r1 = g8 + 8 as in warp 0 of pagedAttnItem: q head kvh * kG + r of the token
  // when r < kG.
  const bool v0 = g8 < kG;
  const bool v1 = g8 + 8 < kG;
  const int qh0 = kvh * kG + (v0 ? g8 : 0);
  const int qh1 = kvh * kG + (v1 ? g8 + 8 : 0);
  const int64_t stride = static_cast<int64_t>(a.num_q_heads + 2 * a.num_kv_heads) * kD;
  uint32_t qf[kKSteps][4];
  attnLoadQ<kD, T>(qkv + start * stride + static_cast<int64_t>(qh0) * kD,
                   qkv + start * stride + static_cast<int64_t>(qh1) * kD, v0, v1, t4, qf);
  float o[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const float scale_log2 = a.scale * kLog2e;
  const int lo1 = v1 ? lo : 1, hi1 = v1 ? hi : 0;  // row r1: empty unless the group has 16 heads
  const int lo0 = v0 ? lo : 1, hi0 = v0 ? hi : 0;
  for (; tile < t_end; tile += kWarps) {
    cpAsyncWait<0>();
    __syncwarp();  // every lane's copies of this tile are visible to the warp
    attnTileStep<kD, T>(s_k, s_v, tile * kKeys, lo0, hi0, lo1, hi1, qf, o, m0, m1, l0, l1,
                        scale_log2, lane);
    if (tile + kWarps < t_end) {
      __syncwarp();  // the tile's last reads are done before the buffer is refilled
      load_tile(tile + kWarps, 2);
      cpAsyncCommit();
    }
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);

  // Merge: warps 1-3 leave (o, m0, m1, l0, l1) per lane in shared memory (the tiles are done),
  // warp 0 folds them into its own in warp order.
  constexpr int kState = kDTiles * 4 + 4;
  float* st = reinterpret_cast<float*>(smem);
  __syncthreads();  // every warp is done with its tiles
  if (warp > 0) {
    float* my = st + ((warp - 1) * 32 + lane) * kState;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
      *reinterpret_cast<float4*>(my + dt * 4) = make_float4(o[dt][0], o[dt][1], o[dt][2], o[dt][3]);
    *reinterpret_cast<float4*>(my + kDTiles * 4) = make_float4(m0, m1, l0, l1);
  }
  __syncthreads();
  if (warp == 0) {
    float mw[kWarps][2];
    mw[0][0] = m0;
    mw[0][1] = m1;
#pragma unroll
    for (int k = 1; k < kWarps; ++k) {
      const float4 ml = *reinterpret_cast<const float4*>(st + ((k - 1) * 32 + lane) * kState + kDTiles * 4);
      mw[k][0] = ml.x;
      mw[k][1] = ml.y;
    }
    float mm[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mm[h] = mw[0][h];
#pragma unroll
      for (int k = 1; k < kWarps; ++k) mm[h] = fmaxf(mm[h], mw[k][h]);
    }
    // Warp 0's own state, scaled to the common max (a row with no key anywhere stays empty).
    float f[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) f[h] = mw[0][h] == -INFINITY ? 0.f : exp2f(mw[0][h] - mm[h]);
    l0 *= f[0];
    l1 *= f[1];
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      o[dt][0] *= f[0];
      o[dt][1] *= f[0];
      o[dt][2] *= f[1];
      o[dt][3] *= f[1];
    }
#pragma unroll
    for (int k = 1; k < kWarps; ++k) {
      const float* src = st + ((k - 1) * 32 + lane) * kState;
      const float4 ml = *reinterpret_cast<const float4*>(src + kDTiles * 4);
      const float fk0 = mw[k][0] == -INFINITY ? 0.f : exp2f(mw[k][0] - mm[0]);
      const float fk1 = mw[k][1] == -INFINITY ? 0.f : exp2f(mw[k][1] - mm[1]);
      l0 = __fmaf_rn(ml.z, fk0, l0);
      l1 = __fmaf_rn(ml.w, fk1, l1);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const float4 ov = *reinterpret_cast<const float4*>(src + dt * 4);
        o[dt][0] = __fmaf_rn(ov.x, fk0, o[dt][0]);
        o[dt][1] = __fmaf_rn(ov.y, fk0, o[dt][1]);
        o[dt][2] = __fmaf_rn(ov.z, fk1, o[dt][2]);
        o[dt][3] = __fmaf_rn(ov.w, fk1, o[dt][3]);
      }
    }
    if (v0) attnStoreRow<kD, T>(a, w, start, qh0, 0, o, mm[0], l0, t4);
    if (v1) attnStoreRow<kD, T>(a, w, start, qh1, 1, o, mm[1], l1, t4);
  }
}

// Block (work items blockIdx.x, + gridDim.x, ..., kv head blockIdx.y): one item per block when
// launched eagerly (grid = the plan's count); a fixed grid looping over the count on the device
// when the launch is captured into a graph (counts != null). Same per-item work either way.
// kSingle: the launch has single-token items and kSmemSingle bytes of shared memory for them
// [TAG_ATTN_DECODE_WARPS]; otherwise every item takes pagedAttnItem (kSmemItem bytes).
template <int kD, int kG, typename T, bool kSingle>
__global__ void __launch_bounds__(kWarps * 32) pagedAttnKernel(PagedAttentionArgs a) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  T* smem = reinterpret_cast<T*>(attn_smem);
  bool waited = false;
  // The counts and the items are uploaded with the step's plan, before the kernels this one
  // waits for (see pagedAttnSingleItem): readable before the wait.
  const int count = a.counts != nullptr ? a.counts[0] : a.num_work;
  for (int item = blockIdx.x; item < count; item += gridDim.x) {
    const PagedAttnWork w = a.work[item];
    if constexpr (kSingle && kG <= 16) {
      if (w.single) {
        pagedAttnSingleItem<kD, kG, T>(a, w, blockIdx.y, smem, waited);
        __syncthreads();  // the next item refills the shared K/V buffers
        continue;
      }
    }
    if (!waited) {
      pdlWait();     // [TAG_PDL_GRAPH] the rotated q and the cache writes are the previous kernel's
      pdlTrigger();  // [TAG_PDL_GEMV] the combine or the O-proj GEMV may be scheduled
      waited = true;
    }
    pagedAttnItem<kD, kG, T>(a, w, blockIdx.y, smem);
    __syncthreads();  // the next item refills the shared K/V stages
  }
}

// One warp per (split token, q head): merges the partials with the sink. Lane p loads part p's
// running max and sum, and the parts' slices of o are loaded 8 at a time before their sums (a
// part at a time, each load waiting on L2, cost ~10 us per 8k-token layer at decode: ncu,
// 2026-12-03); the sums still run over the parts in order with the same operations, so the bits
// are those of the one-part-at-a-time loop (kept for num_parts > 32: the planner can make 33 chunks when a
// sliding window longer than 512 keys starts off a 64-key boundary; never for full-causal layers
// or gpt-oss's 128-key windows).
template <int kD, typename T>
__device__ __forceinline__ void pagedAttnCombineItem(const PagedAttentionArgs& a, const int item) {
  const PagedAttnCombine c = a.combine[item];
  const int qh = blockIdx.y * 4 + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (qh >= a.num_q_heads) return;
  const float sink = a.sinks != nullptr ? a.sinks[qh] * kLog2e : -INFINITY;
  constexpr int kPer = kD / 32;
  static_assert(kPer == 2, "one float2 of o per lane and part");
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.f;
  float den = 0.f;
  float mx = sink;
  if (c.num_parts <= 32) {
    const int n = c.num_parts;
    const int64_t idx_l = static_cast<int64_t>(c.part_begin + lane) * a.num_q_heads + qh;
    const float m_l = lane < n ? a.part_ml[idx_l * 2] : -INFINITY;
    const float l_l = lane < n ? a.part_ml[idx_l * 2 + 1] : 0.f;
    float wm = m_l;  // max over the parts (exact: any order gives the same value)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) wm = fmaxf(wm, __shfl_xor_sync(0xffffffffu, wm, o));
    mx = fmaxf(mx, wm);
    if (mx != -INFINITY) {
      den = a.sinks != nullptr ? exp2f(sink - mx) : 0.f;
      const float f_l = exp2f(m_l - mx);
      // Parts in groups of 8: a group's o slices are loaded together (32 at once cost registers
      // and occupancy where a token has only a few parts: b64@1k, 2 parts, ncu 70 -> 105 us).
      for (int p0 = 0; p0 < n; p0 += 8) {
        float2 po[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (p0 + j < n) {
            const int64_t idx = static_cast<int64_t>(c.part_begin + p0 + j) * a.num_q_heads + qh;
            po[j] = *reinterpret_cast<const float2*>(a.part_o + idx * kD + lane * kPer);
          }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int p = p0 + j;
          if (p >= n) break;
          const float m = __shfl_sync(0xffffffffu, m_l, p);
          const float f = __shfl_sync(0xffffffffu, f_l, p);
          const float l = __shfl_sync(0xffffffffu, l_l, p);
          if (m == -INFINITY) continue;
          den += l * f;
          acc[0] += po[j].x * f;
          acc[1] += po[j].y * f;
        }
      }
    }
  } else {
    for (int p = 0; p < c.num_parts; ++p) {
      mx = fmaxf(mx, a.part_ml[(static_cast<int64_t>(c.part_begin + p) * a.num_q_heads + qh) * 2]);
    }
    if (mx != -INFINITY) {
      den = a.sinks != nullptr ? exp2f(sink - mx) : 0.f;
      for (int p = 0; p < c.num_parts; ++p) {
        const int64_t idx = static_cast<int64_t>(c.part_begin + p) * a.num_q_heads + qh;
        const float m = a.part_ml[idx * 2];
        if (m == -INFINITY) continue;
        const float f = exp2f(m - mx);
        den += a.part_ml[idx * 2 + 1] * f;
        const float* po = a.part_o + idx * kD + lane * kPer;
#pragma unroll
        for (int i = 0; i < kPer; ++i) acc[i] += po[i] * f;
      }
    }
  }
  const float inv = den > 0.f ? 1.f / den : 0.f;
  T* out = reinterpret_cast<T*>(a.out) + static_cast<int64_t>(c.row) * a.num_q_heads * kD +
           static_cast<int64_t>(qh) * kD + lane * kPer;
#pragma unroll
  for (int i = 0; i < kPer; i += 2)
    *reinterpret_cast<uint32_t*>(out + i) = pack16x2<T>(acc[i] * inv, acc[i + 1] * inv);
}

template <int kD, typename T>
__global__ void __launch_bounds__(128) pagedAttnCombineKernel(PagedAttentionArgs a) {
  pdlWait();     // [TAG_PDL_GRAPH]
  pdlTrigger();  // [TAG_PDL_GEMV]
  const int count = a.counts != nullptr ? a.counts[1] : a.num_combine;
  for (int item = blockIdx.x; item < count; item += gridDim.x) pagedAttnCombineItem<kD, T>(a, item);
}

bool isPow2UpTo64(int g) { return g >= 1 && g <= 64 && (g & (g - 1)) == 0; }

bool g_decode_warps = kPagedAttnDecodeWarpsDefault;  // [TAG_ATTN_DECODE_WARPS]

// The single-token kernel's shared memory attribute, set once per instance (preparePagedAttention
// calls it at load time, so that no attribute call happens while a graph is being captured).
constexpr int kSingleGroup = 8;  // the GQA group the single-token kernel is built for

template <int kG, typename T>
cudaError_t singleSmemAttr() {
  static const cudaError_t attr =
      cudaFuncSetAttribute(pagedAttnKernel<kHeadDim, kG, T, true>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemSingle));
  return attr;
}

template <int kG, typename T>
Status launchGroup(const PagedAttentionArgs& a, cudaStream_t stream) {
  const bool fixed = a.counts != nullptr;  // graph launch: fixed grids, counts on the device
  const int32_t work_grid = fixed ? a.grid_work : a.num_work;
  const int32_t combine_grid = fixed ? a.grid_combine : a.num_combine;
  if (work_grid > 0) {
    const dim3 grid(static_cast<unsigned>(work_grid), static_cast<unsigned>(a.num_kv_heads));
    // The single-token kernel is instantiated for gpt-oss's group (8) only: off by default, it
    // is an A/B knob, and each instance costs the CUDA build (ran on groups 4 and 16 too, s21).
    bool launched = false;
    if constexpr (kG == kSingleGroup) {
      if (a.has_single && g_decode_warps) {
        CUDA_RETURN_IF_ERROR((singleSmemAttr<kG, T>()));
        CUDA_RETURN_IF_ERROR(launchPdlAlways(a.pdl, pagedAttnKernel<kHeadDim, kG, T, true>, grid,
                                             dim3(kWarps * 32), kSmemSingle, stream, a));
        launched = true;
      }
    }
    if (!launched) {
      CUDA_RETURN_IF_ERROR(launchPdlAlways(a.pdl, pagedAttnKernel<kHeadDim, kG, T, false>, grid,
                                           dim3(kWarps * 32), kSmemItem, stream, a));
    }
  }
  if (combine_grid > 0) {
    const dim3 grid(static_cast<unsigned>(combine_grid),
                    static_cast<unsigned>((a.num_q_heads + 3) / 4));
    auto* kernel = pagedAttnCombineKernel<kHeadDim, T>;
    CUDA_RETURN_IF_ERROR(launchPdlAlways(a.pdl, kernel, grid,
                                         dim3(128), 0, stream, a));
  }
  return okStatus();
}

}  // namespace

int32_t pagedAttnTokensPerBlock(int32_t group) { return std::max(1, kRows / group); }

namespace {
int32_t g_split_keys = 0;  // 0: pagedAttnSplitKeysFor's rule
}  // namespace
void setPagedAttnDecodeWarps(bool on) { g_decode_warps = on; }
void setPagedAttnSplitKeys(int32_t keys) {
  g_split_keys = keys <= 0 ? 0 : std::max<int32_t>(64, keys / 64 * 64);
}
int32_t pagedAttnSplitKeysFor(int32_t keys) {
  if (g_split_keys > 0) return g_split_keys;
  return keys >= kPagedAttnLongContext ? kPagedAttnSplitKeysLong : kPagedAttnSplitKeys;
}

static_assert(kPagedAttnSplitKeysLong <= kPagedAttnSplitKeys &&
                  kPagedAttnSplitKeys < kPagedAttnLongContext,
              "pagedAttnWindowCanSplit: below the long-context threshold the chunk is the larger");
bool pagedAttnWindowCanSplit(int32_t sliding_window) {
  if (sliding_window <= 0) return true;
  // A token splits when its keys (<= the window) exceed the chunk for that many keys; the chunk
  // is g_split_keys when set, else kPagedAttnSplitKeys below kPagedAttnLongContext keys (and
  // smaller above, where keys > kPagedAttnSplitKeys anyway).
  return sliding_window > (g_split_keys > 0 ? g_split_keys : kPagedAttnSplitKeys);
}

namespace {
bool consecutive(const int32_t* positions, int32_t n) {
  for (int32_t i = 1; i < n; ++i) {
    if (positions[i] != positions[0] + i) return false;
  }
  return true;
}
}  // namespace

PagedAttnPlan planPagedAttention(const int32_t* cu_q, int32_t num_seqs, const int32_t* positions,
                                 int32_t group, int32_t sliding_window, int32_t sm90_min_tokens,
                                 int32_t sm90_rows) {
  PagedAttnPlan plan;
  const int32_t per_block = pagedAttnTokensPerBlock(group);
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t begin = cu_q[s], n = cu_q[s + 1] - cu_q[s];
    if (n <= 0) continue;
    if (sm90_min_tokens > 0 && n >= sm90_min_tokens && consecutive(positions + begin, n)) {
      const int32_t last = positions[begin] + n - 1;
      for (int32_t t0 = 0; t0 < n; t0 += sm90_rows) {
        const int32_t p0 = positions[begin] + t0;
        PagedAttnWork w;
        w.seq = s;
        w.tok0 = t0;
        w.key_begin = sliding_window > 0 ? std::max(0, p0 - sliding_window + 1) : 0;
        w.key_end = std::min(p0 + sm90_rows - 1, last) + 1;
        plan.sm90.push_back(w);
      }
      continue;
    }
    if (n == 1) {
      const int32_t p = positions[begin];
      const int32_t lo = sliding_window > 0 ? std::max(0, p - sliding_window + 1) : 0;
      const int32_t hi = p + 1;
      const int32_t split_keys = pagedAttnSplitKeysFor(hi - lo);
      if (hi - lo > split_keys) {  // split-KV over chunks of keys
        const int32_t want = (hi - lo + kPagedAttnMaxSplits - 1) / kPagedAttnMaxSplits;
        const int32_t chunk = (std::max(split_keys, want) + 63) / 64 * 64;
        const int32_t lo64 = lo / 64 * 64;
        PagedAttnCombine c;
        c.row = begin;
        c.part_begin = plan.num_parts;
        for (int32_t k0 = lo64; k0 < hi; k0 += chunk) {
          PagedAttnWork w;
          w.seq = static_cast<int32_t>(s);
          w.tok0 = 0;
          w.key_begin = std::max(lo, k0);
          w.key_end = std::min(hi, k0 + chunk);
          w.part = plan.num_parts++;
          w.single = 1;
          plan.work.push_back(w);
          ++c.num_parts;
        }
        plan.combine.push_back(c);
        continue;
      }
    }
    for (int32_t t0 = 0; t0 < n; t0 += per_block) {
      const int32_t t1 = std::min(n, t0 + per_block);
      const int32_t p_first = positions[begin + t0];
      const int32_t p_last = positions[begin + t1 - 1];
      PagedAttnWork w;
      w.seq = static_cast<int32_t>(s);
      w.tok0 = t0;
      w.key_begin = sliding_window > 0 ? std::max(0, p_first - sliding_window + 1) : 0;
      w.key_end = p_last + 1;
      w.single = n == 1 ? 1 : 0;
      plan.work.push_back(w);
    }
  }
  // Most keys first: the longest blocks start first and the short ones fill in behind them.
  std::stable_sort(plan.sm90.begin(), plan.sm90.end(),
                   [](const PagedAttnWork& x, const PagedAttnWork& y) {
                     return x.key_end - x.key_begin > y.key_end - y.key_begin;
                   });
  return plan;
}

Status checkPagedAttention(const PagedAttentionArgs& a) {
  if (a.head_dim != kHeadDim) return invalidArgument("paged_attention: head_dim must be 64");
  if (a.num_kv_heads <= 0 || a.num_q_heads % a.num_kv_heads != 0)
    return invalidArgument("paged_attention: num_q_heads must be a multiple of num_kv_heads");
  if (!isPow2UpTo64(a.num_q_heads / a.num_kv_heads))
    return invalidArgument("paged_attention: the GQA group (q heads per kv head) must be a power "
                           "of two <= 64");
  if (a.block_size <= 0 || a.max_blocks <= 0 || a.num_blocks <= 0)
    return invalidArgument("paged_attention: empty cache or block table");
  if (a.sliding_window < 0) return invalidArgument("paged_attention: negative sliding_window");
  if (reinterpret_cast<uintptr_t>(a.k_cache) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.v_cache) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.qkv) % 16 != 0)
    return invalidArgument("paged_attention: qkv and caches must be 16-byte aligned");
  return okStatus();
}

namespace {
template <typename T>
Status launchMmaT(const PagedAttentionArgs& a, cudaStream_t stream) {
  switch (a.num_q_heads / a.num_kv_heads) {
    case 1: return launchGroup<1, T>(a, stream);
    case 2: return launchGroup<2, T>(a, stream);
    case 4: return launchGroup<4, T>(a, stream);
    case 8: return launchGroup<8, T>(a, stream);
    case 16: return launchGroup<16, T>(a, stream);
    case 32: return launchGroup<32, T>(a, stream);
    case 64: return launchGroup<64, T>(a, stream);
    default: return invalidArgument("paged_attention: unsupported GQA group");
  }
}
Status launchMma(const PagedAttentionArgs& a, cudaStream_t stream) {
  return a.f16 ? launchMmaT<f16>(a, stream) : launchMmaT<bf16>(a, stream);
}
}  // namespace

Status setPagedAttnCarveout(int percent) {
  const auto set = [percent](auto* kernel) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent);
  };
  CUDA_RETURN_IF_ERROR(set(pagedAttnKernel<kHeadDim, kSingleGroup, bf16, true>));
  CUDA_RETURN_IF_ERROR(set(pagedAttnKernel<kHeadDim, kSingleGroup, bf16, false>));
  CUDA_RETURN_IF_ERROR(set(pagedAttnKernel<kHeadDim, kSingleGroup, f16, true>));
  CUDA_RETURN_IF_ERROR(set(pagedAttnKernel<kHeadDim, kSingleGroup, f16, false>));
  CUDA_RETURN_IF_ERROR(set(pagedAttnCombineKernel<kHeadDim, bf16>));
  CUDA_RETURN_IF_ERROR(set(pagedAttnCombineKernel<kHeadDim, f16>));
  return okStatus();
}

Status preparePagedAttention() {
  CUDA_RETURN_IF_ERROR((singleSmemAttr<kSingleGroup, bf16>()));
  CUDA_RETURN_IF_ERROR((singleSmemAttr<kSingleGroup, f16>()));
  return okStatus();
}

Status launchPagedAttention(const PagedAttentionArgs& a, cudaStream_t stream) {
  RETURN_IF_ERROR(checkPagedAttention(a));
  RETURN_IF_ERROR(launchMma(a, stream));
  if (a.num_sm90_work > 0) {
    if (a.counts != nullptr) {
      return invalidArgument("paged_attention: the Hopper kernel's items cannot run in a graph");
    }
    RETURN_IF_ERROR(launchPagedAttentionSm90(a, stream));
  }
  return okStatus();
}

}  // namespace garden::rose::cuda
