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
  float4 xr[kChunks], wr[kChunks][2];
  int nc = (a.hidden - kbase + kChunk - 1) / kChunk;
  if (nc > kChunks) nc = kChunks;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int k = kbase + c * kChunk + x_q * 4;
    xr[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c < nc && x_row && k < a.hidden)
      xr[c] = *reinterpret_cast<const float4*>(a.residual + (t0 + x_tok) * a.hidden + k);
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
      ssq += xr[c].x * xr[c].x;
      ssq += xr[c].y * xr[c].y;
      ssq += xr[c].z * xr[c].z;
      ssq += xr[c].w * xr[c].w;
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
          acc[q * 4 + 0] += v.x * wv;
          acc[q * 4 + 1] += v.y * wv;
          acc[q * 4 + 2] += v.z * wv;
          acc[q * 4 + 3] += v.w * wv;
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

bool g_fused_route = false;  // measured slower in the graphed step (see the header)

}  // namespace

void setRouterFusedRoute(bool on) { g_fused_route = on; }
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
  const dim3 grid(static_cast<unsigned>((a.num_tokens + kTok - 1) / kTok),
                  static_cast<unsigned>((a.num_experts + kExp - 1) / kExp),
                  static_cast<unsigned>(routerF32Splits(a.hidden)));
  routerF32Kernel<<<grid, kThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
