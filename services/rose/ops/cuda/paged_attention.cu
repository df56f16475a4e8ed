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

// Block (work item w, kv head blockIdx.y). Row r of the block is query token w.tok0 + r / kG
// of the sequence and q head kvh * kG + r % kG. Thread (warp, lane) owns rows r0 = warp*16 +
// lane/4 and r1 = r0 + 8 (the two halves of an mma fragment), and columns 2*(lane%4) (+1) of
// every 8-wide tile.
template <int kD, int kG, typename T>
__device__ __forceinline__ void pagedAttnItem(const PagedAttentionArgs& a, const int item,
                                              const int kvh) {
  constexpr int kRow = kD + 8;        // padded smem row: conflict-free ldmatrix
  constexpr int kKSteps = kD / 16;    // k-steps of Q K^T over head_dim
  constexpr int kDTiles = kD / 8;     // 8-wide output column tiles
  constexpr int kChunks = kD / 8;     // 16-byte chunks per K/V row
  __shared__ __align__(16) T s_k[2][kKeys][kRow];
  __shared__ __align__(16) T s_v[2][kKeys][kRow];
  const T* qkv = reinterpret_cast<const T*>(a.qkv);
  const T* k_cache = reinterpret_cast<const T*>(a.k_cache);
  const T* v_cache = reinterpret_cast<const T*>(a.v_cache);

  const PagedAttnWork w = a.work[item];
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
  {
    const T* q0 = qkv + static_cast<int64_t>(start + (v0 ? tok0 : 0)) * stride +
                  static_cast<int64_t>(qh0) * kD;
    const T* q1 = qkv + static_cast<int64_t>(start + (v1 ? tok1 : 0)) * stride +
                  static_cast<int64_t>(qh1) * kD;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const int c = kk * 16 + 2 * t4;
      const uint32_t* p0 = reinterpret_cast<const uint32_t*>(q0 + c);
      const uint32_t* p1 = reinterpret_cast<const uint32_t*>(q1 + c);
      qf[kk][0] = v0 ? p0[0] : 0u;
      qf[kk][1] = v1 ? p1[0] : 0u;
      qf[kk][2] = v0 ? p0[4] : 0u;
      qf[kk][3] = v1 ? p1[4] : 0u;
    }
  }

  float o[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks;
  const int t_begin = w.key_begin / kKeys;
  const int t_end = w.key_end > w.key_begin ? (w.key_end + kKeys - 1) / kKeys : t_begin;
  auto load_tile = [&](int tile, int stage) {
    const int key0 = tile * kKeys;
    for (int i = threadIdx.x; i < kKeys * kChunks; i += kWarps * 32) {
      const int r = i / kChunks;
      const int c = (i % kChunks) * 8;
      const int key = key0 + r;
      bool valid = key >= w.key_begin && key < w.key_end;
      int64_t off = 0;
      if (valid) {
        const int blk = table[key / a.block_size];
        valid = blk >= 0 && blk < a.num_blocks;
        off = ((static_cast<int64_t>(blk) * a.block_size + key % a.block_size) * a.num_kv_heads +
               kvh) * kD + c;
        if (!valid) off = 0;
      }
      cpAsync16(&s_k[stage][r][c], k_cache + off, valid);
      cpAsync16(&s_v[stage][r][c], v_cache + off, valid);
    }
  };
  if (t_begin < t_end) {
    load_tile(t_begin, 0);
    cpAsyncCommit();
  }
  const float scale_log2 = a.scale * kLog2e;
  const int mi = lane >> 3;  // which 8x8 matrix this lane addresses in ldmatrix.x4
  const int mr = lane & 7;   // which row of it

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
      float s[kKeys / 8][4];
#pragma unroll
      for (int i = 0; i < kKeys / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
      for (int nt2 = 0; nt2 < kKeys / 16; ++nt2) {
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
          uint32_t b[4];
          ldmatrixX4(b, &s_k[stage][nt2 * 16 + (mi >> 1) * 8 + mr][kk * 16 + (mi & 1) * 8]);
          mma16<T>(s[2 * nt2], qf[kk], b[0], b[1]);
          mma16<T>(s[2 * nt2 + 1], qf[kk], b[2], b[3]);
        }
      }
      const int key0 = tile * kKeys;
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
          ldmatrixX4Trans(b, &s_v[stage][kk * 16 + (mi & 1) * 8 + mr][dt2 * 16 + (mi >> 1) * 8]);
          mma16<T>(o[2 * dt2], pa, b[0], b[1]);
          mma16<T>(o[2 * dt2 + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this stage is refilled two iterations later
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (w.part >= 0) {  // split-KV partial (single-token sequence): un-normalized o, m, l
    auto put = [&](int qh, bool valid, const float (&oo)[kDTiles][4], int half, float m, float l) {
      if (!valid) return;
      float* po = a.part_o + (static_cast<int64_t>(w.part) * a.num_q_heads + qh) * kD + 2 * t4;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        po[dt * 8] = oo[dt][2 * half];
        po[dt * 8 + 1] = oo[dt][2 * half + 1];
      }
      if (t4 == 0) {
        float* ml = a.part_ml + (static_cast<int64_t>(w.part) * a.num_q_heads + qh) * 2;
        ml[0] = m;
        ml[1] = l;
      }
    };
    put(qh0, v0, o, 0, m0, l0);
    put(qh1, v1, o, 1, m1, l1);
    return;
  }
  const int64_t out_stride = static_cast<int64_t>(a.num_q_heads) * kD;
  auto finish = [&](int qh, int tok, bool valid, int half, float m, float l) {
    if (!valid) return;
    float inv = 0.f;
    if (m != -INFINITY) {
      const float sink = a.sinks != nullptr ? exp2f(a.sinks[qh] * kLog2e - m) : 0.f;
      inv = 1.f / (l + sink);
    }
    uint32_t* p = reinterpret_cast<uint32_t*>(reinterpret_cast<T*>(a.out) +
                                              static_cast<int64_t>(start + tok) * out_stride +
                                              static_cast<int64_t>(qh) * kD + 2 * t4);
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
      p[dt * 4] = pack16x2<T>(o[dt][2 * half] * inv, o[dt][2 * half + 1] * inv);
  };
  finish(qh0, tok0, v0, 0, m0, l0);
  finish(qh1, tok1, v1, 1, m1, l1);
}

// Block (work items blockIdx.x, + gridDim.x, ..., kv head blockIdx.y): one item per block when
// launched eagerly (grid = the plan's count); a fixed grid looping over the count on the device
// when the launch is captured into a graph (counts != null). Same per-item work either way.
template <int kD, int kG, typename T>
__global__ void __launch_bounds__(kWarps * 32) pagedAttnKernel(PagedAttentionArgs a) {
  pdlWait();     // [TAG_PDL_GRAPH] the rotated q and the cache writes are the previous kernel's
  pdlTrigger();  // [TAG_PDL_GEMV] the combine or the O-proj GEMV may be scheduled
  const int count = a.counts != nullptr ? a.counts[0] : a.num_work;
  for (int item = blockIdx.x; item < count; item += gridDim.x) {
    pagedAttnItem<kD, kG, T>(a, item, blockIdx.y);
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

template <int kG, typename T>
Status launchGroup(const PagedAttentionArgs& a, cudaStream_t stream) {
  const bool fixed = a.counts != nullptr;  // graph launch: fixed grids, counts on the device
  const int32_t work_grid = fixed ? a.grid_work : a.num_work;
  const int32_t combine_grid = fixed ? a.grid_combine : a.num_combine;
  if (work_grid > 0) {
    const dim3 grid(static_cast<unsigned>(work_grid), static_cast<unsigned>(a.num_kv_heads));
    auto* kernel = pagedAttnKernel<kHeadDim, kG, T>;
    CUDA_RETURN_IF_ERROR(launchPdlAlways(a.pdl, kernel, grid,
                                         dim3(kWarps * 32), 0, stream, a));
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
