#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/moe_permute.cuh"

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
__global__ void __launch_bounds__(32) moeAlignWarpKernel(MoeAlignArgs a) {
  const int lane = threadIdx.x;
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

constexpr int kCombineThreads = 128;

__global__ void __launch_bounds__(kCombineThreads) moeCombineKernel(MoeCombineArgs a) {
  const int64_t t = blockIdx.x;
  const int chunks = a.hidden / 8;
  for (int c = threadIdx.x; c < chunks; c += kCombineThreads) {
    float acc[8];
    moeCombineChunk(a.y, a.row_of, a.weights, a.top_k, a.hidden, t, c, acc);
    storeF32x8(a.out + t * a.hidden + c * 8, acc);
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
  if (a.num_tokens * a.top_k <= 32) {
    moeAlignWarpKernel<<<1, 32, 0, stream>>>(a);
  } else {
    moeAlignKernel<<<1, kAlignThreads, 0, stream>>>(a);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
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
  moeCombineKernel<<<static_cast<unsigned>(a.num_tokens), kCombineThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
