#include <algorithm>
#include <atomic>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/moe_permute.cuh"
#include "services/rose/ops/cuda/moe_route_device.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kAlignThreads = 1024;
constexpr int kAlignWarps = kAlignThreads / 32;

// The expert of assignment i of a warp range ending at hi: -1 past the range and for ids outside
// [0, num_experts) (both passes of moeAlignKernel read it the same way).
__device__ __forceinline__ int alignExpertOf(const MoeAlignArgs& a, int i, int hi) {
  const int e = i < hi ? a.topk_ids[i] : -1;
  return e >= 0 && e < a.num_experts ? e : -1;
}

// One block. [TAG_MOE_ALIGN_RANGES] Warp w owns the contiguous assignments [w * per, (w + 1) *
// per): it counts its experts (pass 1), the counts are scanned over the warps once, and it ranks
// its assignments in (token, k) order from its range's offset (pass 2) — three block barriers in
// all. (The form this replaced ranked 1,024 assignments per round with four barriers and a serial
// scan each: 91 us for an 8k-token step of gpt-oss-20b, ncu 2026-12-04.) A row's place is the
// same: the expert's first row + the assignments of that expert before it.
__global__ void __launch_bounds__(kAlignThreads) moeAlignKernel(MoeAlignArgs a) {
  pdlWait();  // [TAG_PDL_GRAPH]
  pdlTrigger();
  __shared__ int32_t counts[kMoeAlignMaxExperts];
  __shared__ int32_t offset[kMoeAlignMaxExperts];      // first permuted row of each expert
  __shared__ int32_t tile_first[kMoeAlignMaxExperts];  // first tile of each expert
  __shared__ int32_t wc[kAlignWarps][kMoeAlignMaxExperts];  // per warp: count, then running rank
  __shared__ int32_t total_rows, used_tiles;
  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid & 31;
  const unsigned lanes_before = (1u << lane) - 1u;
  const int n = static_cast<int>(a.num_tokens * a.top_k);  // < 2^31 (launchMoeAlign)
  const int ne = a.num_experts;
  const int per = (n + kAlignWarps - 1) / kAlignWarps;
  const int lo = min(n, warp * per), hi = min(n, lo + per);
  for (int i = tid; i < kAlignWarps * ne; i += kAlignThreads) wc[i / ne][i % ne] = 0;
  __syncthreads();
  for (int s0 = lo; s0 < hi; s0 += 32) {  // pass 1 (the bounds are warp-uniform)
    const int i = s0 + lane;
    const int e = alignExpertOf(a, i, hi);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && (peers & lanes_before) == 0) wc[warp][e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  for (int x = tid; x < ne; x += kAlignThreads) {
    int32_t run = 0;
    for (int w = 0; w < kAlignWarps; ++w) {
      const int32_t c = wc[w][x];
      wc[w][x] = run;
      run += c;
    }
    counts[x] = run;
  }
  __syncthreads();
  if (tid == 0) {
    int32_t row = 0, tile = 0;
    for (int e = 0; e < ne; ++e) {
      offset[e] = row;
      tile_first[e] = tile;
      const int32_t tiles = (counts[e] + a.block_m - 1) / a.block_m;
      tile += tiles;
      row += tiles * a.block_m;
    }
    used_tiles = min(tile, a.max_tiles);
    *a.num_tiles = used_tiles;
    total_rows = row;
  }
  __syncthreads();
  for (int e = tid; e < ne; e += kAlignThreads) {
    const int32_t end = min(tile_first[e] + (counts[e] + a.block_m - 1) / a.block_m, a.max_tiles);
    for (int32_t x = tile_first[e]; x < end; ++x) a.tile_expert[x] = e;
  }
  for (int32_t x = used_tiles + tid; x < a.max_tiles; x += kAlignThreads) a.tile_expert[x] = -1;
  for (int32_t r = tid; r < total_rows; r += kAlignThreads) a.row_token[r] = -1;
  __syncthreads();
  for (int s0 = lo; s0 < hi; s0 += 32) {  // pass 2
    const int i = s0 + lane;
    const int e = alignExpertOf(a, i, hi);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & lanes_before);
    if (e >= 0) {
      const int32_t row = offset[e] + wc[warp][e] + rank;
      a.row_of[i] = row;
      a.row_token[row] = i / a.top_k;
    } else if (i < hi) {
      a.row_of[i] = -1;
    }
    __syncwarp();  // every lane of the expert read its base before the leader moves it
    if (e >= 0 && rank == 0) wc[warp][e] += __popc(peers);
    __syncwarp();
  }
}

// Steps of at most 32 assignments (decode up to 8 tokens at top-4): one warp, the same output as
// moeAlignKernel (which spends ~7 µs of barriers and a serial expert loop on a decode step).
// Lane i holds assignment i; lanes of one expert find each other with __match_any_sync (rank = the
// lanes before it, i.e. (token, k) order); each expert's first lane owns its tiles, and an expert's
// first tile is the sum of the tiles of the experts with smaller ids.
__device__ __forceinline__ void alignWarp(const MoeAlignArgs& a) {
  const int lane = threadIdx.x & 31;
  const int n = static_cast<int>(a.num_tokens * a.top_k);
  int e = lane < n ? a.topk_ids[lane] : -1;
  if (e >= a.num_experts) e = -1;
  if (e < 0) e = -1;
  const unsigned peers = __match_any_sync(0xffffffffu, e);
  const int rank = __popc(peers & ((1u << lane) - 1u));
  const int tiles = e >= 0 && rank == 0 ? (__popc(peers) + a.block_m - 1) / a.block_m : 0;
  int before = 0, total = 0;
  for (int l = 0; l < 32; ++l) {
    const int el = __shfl_sync(0xffffffffu, e, l);
    const int tl = __shfl_sync(0xffffffffu, tiles, l);
    total += tl;
    if (tl > 0 && el < e) before += tl;
  }
  for (int x = 0; x < tiles; ++x)
    if (before + x < a.max_tiles) a.tile_expert[before + x] = e;
  const int used = total < a.max_tiles ? total : a.max_tiles;
  if (lane == 0) *a.num_tiles = used;
  for (int x = used + lane; x < a.max_tiles; x += 32) a.tile_expert[x] = -1;
  for (int r = lane; r < total * a.block_m; r += 32) a.row_token[r] = -1;
  __syncwarp();
  if (lane < n) {
    if (e >= 0) {
      const int row = before * a.block_m + rank;
      a.row_of[lane] = row;
      a.row_token[row] = lane / a.top_k;
    } else {
      a.row_of[lane] = -1;
    }
  }
}

__global__ void __launch_bounds__(32) moeAlignWarpKernel(MoeAlignArgs a) {
  pdlWait();  // [TAG_PDL_GRAPH]
  pdlTrigger();
  alignWarp(a);
}

// [TAG_ROUTE_ALIGN] The route of up to kMoeRouteAlignMaxTokens tokens (warp t: token t, as
// moeRouteKernel) and then the one-warp align of its ids (warp 0, as moeAlignWarpKernel) in one
// block: the ids are this block's own global writes, visible after the barrier.
__global__ void __launch_bounds__(kMoeRouteAlignMaxTokens * 32)
    moeRouteAlignKernel(MoeRouteArgs r, MoeAlignArgs a) {
  pdlWait();  // [TAG_PDL_GRAPH]
  pdlTrigger();
  const int warp = threadIdx.x >> 5;
  if (warp < r.num_tokens) moeRouteToken(r, warp, threadIdx.x & 31);
  __syncthreads();
  if (warp == 0) alignWarp(a);
}

// [TAG_MOE_ALIGN_MULTIBLOCK] Large steps on many blocks. Block b owns the contiguous assignments
// [b * per_block, (b + 1) * per_block), its warp w the w-th eighth of them. Kernel 1 counts each
// block's rows per expert into block_counts[b][e]. Kernel 2 (the same grid): every block sums the
// counts over all blocks (the expert totals) and over the blocks before it, scans the experts'
// tiles in one warp, writes its share of tile_expert (tile x found by binary search over the
// experts' first tiles) and the padding rows of the experts e with e % blocks == b, recounts its
// own range per warp and ranks it as moeAlignKernel's pass 2 does from the blocks-before base. An
// assignment's row is its expert's first row + the assignments of that expert before it in
// (token, k) order: the same as the one-block kernel's.
std::atomic<bool> g_align_multiblock{true};
constexpr int kAlignMbThreads = 256;
constexpr int kAlignMbWarps = kAlignMbThreads / 32;

// Counts the assignments of [lo, hi) per expert into wc[warp][e] (zeroed by the caller).
__device__ __forceinline__ void alignCountRange(const MoeAlignArgs& a, int lo, int hi,
                                                int32_t* wc_warp) {
  const int lane = threadIdx.x & 31;
  const unsigned lanes_before = (1u << lane) - 1u;
  for (int s0 = lo; s0 < hi; s0 += 32) {
    const int e = alignExpertOf(a, s0 + lane, hi);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && (peers & lanes_before) == 0) wc_warp[e] += __popc(peers);
    __syncwarp();
  }
}

__global__ void __launch_bounds__(kAlignMbThreads) moeAlignCountKernel(MoeAlignArgs a,
                                                                       int per_block) {
  pdlWait();  // [TAG_PDL_GRAPH]
  pdlTrigger();
  __shared__ int32_t wc[kAlignMbWarps][kMoeAlignMaxExperts];
  const int tid = threadIdx.x, warp = tid / 32;
  const int n = static_cast<int>(a.num_tokens * a.top_k), ne = a.num_experts;
  for (int i = tid; i < kAlignMbWarps * ne; i += kAlignMbThreads) wc[i / ne][i % ne] = 0;
  __syncthreads();
  const int per_warp = per_block / kAlignMbWarps;
  const int lo = min(n, static_cast<int>(blockIdx.x) * per_block + warp * per_warp);
  alignCountRange(a, lo, min(n, lo + per_warp), wc[warp]);
  __syncthreads();
  for (int e = tid; e < ne; e += kAlignMbThreads) {
    int32_t c = 0;
    for (int w = 0; w < kAlignMbWarps; ++w) c += wc[w][e];
    a.block_counts[static_cast<int64_t>(blockIdx.x) * ne + e] = c;
  }
}

__global__ void __launch_bounds__(kAlignMbThreads) moeAlignRankKernel(MoeAlignArgs a,
                                                                      int per_block) {
  pdlWait();  // [TAG_PDL_GRAPH]
  pdlTrigger();
  __shared__ int32_t wc[kAlignMbWarps][kMoeAlignMaxExperts];
  __shared__ int32_t counts[kMoeAlignMaxExperts];      // the expert's rows in the whole step
  __shared__ int32_t before[kMoeAlignMaxExperts];      // ... in the blocks before this one
  __shared__ int32_t tile_first[kMoeAlignMaxExperts];  // first tile of each expert
  __shared__ int32_t s_total_tiles;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
  const unsigned lanes_before = (1u << lane) - 1u;
  const int n = static_cast<int>(a.num_tokens * a.top_k), ne = a.num_experts;
  const int nb = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int bm = a.block_m;
  for (int i = tid; i < kAlignMbWarps * ne; i += kAlignMbThreads) wc[i / ne][i % ne] = 0;
  for (int e = tid; e < ne; e += kAlignMbThreads) {
    int32_t bef = 0, tot = 0;
    for (int j = 0; j < nb; ++j) {
      const int32_t c = a.block_counts[static_cast<int64_t>(j) * ne + e];
      bef += j < b ? c : 0;
      tot += c;
    }
    before[e] = bef;
    counts[e] = tot;
  }
  __syncthreads();
  const int per_warp = per_block / kAlignMbWarps;
  const int lo = min(n, b * per_block + warp * per_warp), hi = min(n, lo + per_warp);
  alignCountRange(a, lo, hi, wc[warp]);
  if (warp == 0) {  // the experts' first tiles: lane l scans experts [l * epl, (l + 1) * epl)
    const int epl = (ne + 31) / 32;
    int32_t local = 0;
    for (int j = 0; j < epl; ++j) {
      const int e = lane * epl + j;
      if (e < ne) local += (counts[e] + bm - 1) / bm;
    }
    int32_t incl = local;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    int32_t run = incl - local;
    for (int j = 0; j < epl; ++j) {
      const int e = lane * epl + j;
      if (e < ne) {
        tile_first[e] = run;
        run += (counts[e] + bm - 1) / bm;
      }
    }
    if (lane == 31) s_total_tiles = incl;
  }
  __syncthreads();
  const int32_t used = min(s_total_tiles, a.max_tiles);
  if (b == 0 && tid == 0) *a.num_tiles = used;
  for (int32_t x = b * kAlignMbThreads + tid; x < a.max_tiles; x += nb * kAlignMbThreads) {
    int32_t e = -1;
    if (x < used) {  // the last expert whose first tile is <= x (it has tiles: see below)
      int lo_e = 0, hi_e = ne - 1;
      while (lo_e < hi_e) {
        const int mid = (lo_e + hi_e + 1) / 2;
        if (tile_first[mid] <= x) {
          lo_e = mid;
        } else {
          hi_e = mid - 1;
        }
      }
      e = lo_e;  // an expert without tiles shares its first tile with the next one, so the last
                 // such expert <= x has tiles whenever x < the total
    }
    a.tile_expert[x] = e;
  }
  for (int e = tid; e < ne; e += kAlignMbThreads) {
    if (e % nb != b) continue;
    const int32_t first_row = tile_first[e] * bm;
    const int32_t end = first_row + (counts[e] + bm - 1) / bm * bm;
    for (int32_t r = first_row + counts[e]; r < end; ++r) a.row_token[r] = -1;
  }
  __syncthreads();  // wc holds every warp's counts
  for (int e = tid; e < ne; e += kAlignMbThreads) {
    int32_t run = before[e];
    for (int w = 0; w < kAlignMbWarps; ++w) {
      const int32_t c = wc[w][e];
      wc[w][e] = run;
      run += c;
    }
  }
  __syncthreads();
  for (int s0 = lo; s0 < hi; s0 += 32) {  // moeAlignKernel's pass 2
    const int i = s0 + lane;
    const int e = alignExpertOf(a, i, hi);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & lanes_before);
    if (e >= 0) {
      const int32_t row = tile_first[e] * bm + wc[warp][e] + rank;
      a.row_of[i] = row;
      a.row_token[row] = i / a.top_k;
    } else if (i < hi) {
      a.row_of[i] = -1;
    }
    __syncwarp();
    if (e >= 0 && rank == 0) wc[warp][e] += __popc(peers);
    __syncwarp();
  }
}

constexpr int kCombineThreads = 128;

template <typename T, typename O>
__global__ void __launch_bounds__(kCombineThreads) moeCombineKernel(MoeCombineArgs a) {
  pdlWait();  // [TAG_PDL_GRAPH]
  pdlTrigger();
  const int64_t t = blockIdx.x;
  const int chunks = a.hidden / 8;
  const T* y = reinterpret_cast<const T*>(a.y);
  O* out = reinterpret_cast<O*>(a.out);
  for (int c = threadIdx.x; c < chunks; c += kCombineThreads) {
    float acc[8];
    moeCombineChunk(y, a.row_of, a.weights, a.top_k, a.hidden, t, c, a.y_scale, acc);
    if constexpr (std::is_same_v<O, float>) {
      float4* p = reinterpret_cast<float4*>(out + t * a.hidden + c * 8);
      p[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      p[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    } else {
      storeF32x8(out + t * a.hidden + c * 8, acc);
    }
  }
}

}  // namespace

Status launchMoeAlign(const MoeAlignArgs& a, cudaStream_t stream) {
  if (a.num_experts <= 0 || a.num_experts > kMoeAlignMaxExperts)
    return invalidArgument("moe_align: num_experts must be in [1, 256]");
  if (a.top_k <= 0 || a.block_m <= 0 || a.max_tiles <= 0)
    return invalidArgument("moe_align: top_k, block_m and max_tiles must be positive");
  if (a.max_tiles < moeAlignMaxTiles(a.num_tokens * a.top_k, a.num_experts, a.block_m))
    return invalidArgument("moe_align: max_tiles below the bound for this step");
  if (a.num_tokens * a.top_k > INT32_MAX - 64)
    return invalidArgument("moe_align: more than 2^31 assignments in one step");
  const int64_t n = a.num_tokens * a.top_k;
  if (n <= 32) {
    CUDA_RETURN_IF_ERROR(launchPdlAlways(a.pdl, moeAlignWarpKernel, dim3(1), dim3(32), 0, stream, a));
  } else if (a.block_counts != nullptr && n >= kMoeAlignMultiBlockMin &&
             g_align_multiblock.load()) {
    // [TAG_MOE_ALIGN_MULTIBLOCK] per_block: a multiple of the block's threads, >= 1024, and at
    // most kMoeAlignMaxBlocks blocks.
    int64_t per = (n + kMoeAlignMaxBlocks - 1) / kMoeAlignMaxBlocks;
    per = std::max<int64_t>(1024, (per + kAlignMbThreads - 1) / kAlignMbThreads * kAlignMbThreads);
    const unsigned blocks = static_cast<unsigned>((n + per - 1) / per);
    CUDA_RETURN_IF_ERROR(launchPdlAlways(a.pdl, moeAlignCountKernel, dim3(blocks),
                                         dim3(kAlignMbThreads), 0, stream, a,
                                         static_cast<int>(per)));
    CUDA_RETURN_IF_ERROR(launchPdlAlways(a.pdl, moeAlignRankKernel, dim3(blocks),
                                         dim3(kAlignMbThreads), 0, stream, a,
                                         static_cast<int>(per)));
  } else {
    CUDA_RETURN_IF_ERROR(
        launchPdlAlways(a.pdl, moeAlignKernel, dim3(1), dim3(kAlignThreads), 0, stream, a));
  }
  return okStatus();
}

void setMoeAlignMultiBlock(bool on) { g_align_multiblock.store(on); }

Status launchMoeRouteAlign(const MoeRouteArgs& r, const MoeAlignArgs& a, cudaStream_t stream) {
  RETURN_IF_ERROR(checkMoeRoute(r));
  if (r.num_tokens < 1 || r.num_tokens > kMoeRouteAlignMaxTokens ||
      r.num_tokens * r.top_k > 32 || a.num_tokens != r.num_tokens || a.top_k != r.top_k ||
      a.topk_ids != r.topk_ids || a.num_experts != r.num_experts)
    return invalidArgument(
        "moe_route_align: 1..8 tokens, at most 32 assignments, the align reading the route's ids");
  if (a.block_m <= 0 || a.max_tiles < moeAlignMaxTiles(r.num_tokens * r.top_k, a.num_experts, a.block_m))
    return invalidArgument("moe_route_align: max_tiles below the bound for this step");
  CUDA_RETURN_IF_ERROR(launchPdlAlways(r.pdl || a.pdl, moeRouteAlignKernel, dim3(1),
                                       dim3(kMoeRouteAlignMaxTokens * 32), 0, stream, r, a));
  return okStatus();
}

Status launchMoeAlignOneBlock(const MoeAlignArgs& a, cudaStream_t stream) {
  if (a.num_experts <= 0 || a.num_experts > kMoeAlignMaxExperts || a.top_k <= 0 ||
      a.block_m <= 0 || a.max_tiles <= 0)
    return invalidArgument("moe_align: bad arguments");
  moeAlignKernel<<<1, kAlignThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

Status launchMoeCombine(const MoeCombineArgs& a, cudaStream_t stream) {
  if (a.hidden <= 0 || a.hidden % 8 != 0)
    return invalidArgument("moe_combine: hidden must be a positive multiple of 8");
  if (a.num_tokens == 0) return okStatus();
  const unsigned grid = static_cast<unsigned>(a.num_tokens);
  auto kernel = a.f16 ? (a.out_f32 ? moeCombineKernel<f16, float> : moeCombineKernel<f16, f16>)
                      : (a.out_f32 ? moeCombineKernel<bf16, float> : moeCombineKernel<bf16, bf16>);
  CUDA_RETURN_IF_ERROR(
      launchPdlAlways(a.pdl, kernel, dim3(grid), dim3(kCombineThreads), 0, stream, a));
  return okStatus();
}

}  // namespace garden::rose::cuda
