#include <string>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/moe_gemm.cuh"
#include "services/rose/ops/cuda/moe_lt_bf16.cuh"
#include "services/rose/ops/cuda/mxfp4_unit.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kDqThreads = 256;  // one unit (16 code bytes) of a packed tile per thread
constexpr int kDqRowS = kMxTileK + 8;  // smem row stride (bf16)
static_assert(kDqThreads == kMxTileRows * 2, "256 units of 16 bytes per packed tile");

// One block per (K tile, 128-row N tile, expert): the packed tile's 4 KiB of codes and 256 bytes
// of scales copied to shared memory (one 16-byte load per thread), dequantized into a
// [128][64] shared tile with the tiled GEMM's own unit function, then written out as rows of up
// to 128 bytes (consecutive threads, consecutive 16-byte chunks).
template <bool kFast>
__global__ void __launch_bounds__(kDqThreads) mxfp4DequantKernel(Mxfp4DequantArgs a) {
  __shared__ __align__(16) __nv_bfloat16 tile[kMxTileRows * kDqRowS];
  __shared__ __align__(16) uint8_t s_codes[kMxTileBytes];
  __shared__ __align__(16) uint8_t s_scales[kMxTileRows * 2];
  const int kt = blockIdx.x, nt = blockIdx.y, e = blockIdx.z;
  if (a.expert_off != nullptr && a.expert_off[e + 1] <= a.expert_off[e]) return;
  const int kt_count = (a.k / 32 + 1) / 2;
  const int n_tiles = (a.n + kMxTileRows - 1) / kMxTileRows;
  const int64_t blk = (static_cast<int64_t>(e) * n_tiles + nt) * kt_count + kt;
  const int tid = threadIdx.x;
  reinterpret_cast<uint4*>(s_codes)[tid] =
      __ldg(reinterpret_cast<const uint4*>(a.codes + blk * kMxTileBytes) + tid);
  if (tid < kMxTileRows * 2 / 16)
    reinterpret_cast<uint4*>(s_scales)[tid] =
        __ldg(reinterpret_cast<const uint4*>(a.scales + blk * (kMxTileRows * 2)) + tid);
  __syncthreads();
  mxfp4DequantUnit<kFast>(tid, s_codes, s_scales, [&](int row, int k, uint32_t bits) {
    *reinterpret_cast<uint32_t*>(tile + row * kDqRowS + k) = bits;
  });
  __syncthreads();
  const int n0 = nt * kMxTileRows, k0 = kt * kMxTileK;
  const int kw = min(kMxTileK, a.k - k0);  // 64 or 32 (K tail)
  constexpr int kChunks = kMxTileK / 8;    // 16-byte chunks per tile row
  for (int i = tid; i < kMxTileRows * kChunks; i += kDqThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    if (n0 + r >= a.n || c >= kw) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(tile + r * kDqRowS + c);
    *reinterpret_cast<uint4*>(a.out + (static_cast<int64_t>(e) * a.n + n0 + r) * a.k + k0 + c) = v;
  }
}

constexpr int kThreads = 256;

// One thread per 8 outputs (16 inputs: (gate, up) pairs; one 16-byte store) [TAG_MOE_SWIGLU_VEC]:
// the 4-wide form this replaced ran at ~2.4 TB/s, 232 us per 8k-token layer of gpt-oss-20b (ncu,
// 2026-12-04). The same f32 expression per output.
__global__ void __launch_bounds__(kThreads) moeBiasSwigluKernel(MoeBiasSwigluArgs a) {
  constexpr int kOut = 8;
  const int64_t chunks = a.inter / kOut;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= a.rows * chunks) return;
  const int64_t r = i / chunks, c = (i % chunks) * kOut;  // output column
  __nv_bfloat16* o = a.out + r * a.inter + c;
  const int e = a.tile_expert[r / a.block_m];
  uint32_t packed[kOut / 2];
  if (a.row_token[r] < 0 || e < 0 || e >= a.num_experts) {
#pragma unroll
    for (int j = 0; j < kOut / 2; ++j) packed[j] = 0u;
  } else {
    const int64_t n2 = 2 * static_cast<int64_t>(a.inter);
    float h[2 * kOut], b[2 * kOut];
#pragma unroll
    for (int j = 0; j < 2 * kOut; ++j) b[j] = 0.f;
#pragma unroll
    for (int q = 0; q < kOut / 4; ++q) {
      loadF32x8(a.h + r * n2 + 2 * c + 8 * q, *reinterpret_cast<float(*)[8]>(h + 8 * q));
      if (a.bias != nullptr)
        loadF32x8(a.bias + e * n2 + 2 * c + 8 * q, *reinterpret_cast<float(*)[8]>(b + 8 * q));
    }
#pragma unroll
    for (int j = 0; j < kOut / 2; ++j)
      packed[j] = packBf16x2(
          clampedSwiglu(h[4 * j] + b[4 * j], h[4 * j + 1] + b[4 * j + 1], a.limit, a.alpha),
          clampedSwiglu(h[4 * j + 2] + b[4 * j + 2], h[4 * j + 3] + b[4 * j + 3], a.limit, a.alpha));
  }
  *reinterpret_cast<uint4*>(o) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

Status gridFor(int64_t items, const char* what, unsigned* blocks) {
  const int64_t b = (items + kThreads - 1) / kThreads;
  if (b > 0x7fffffff) return invalidArgument(std::string(what) + ": too many rows");
  *blocks = static_cast<unsigned>(b);
  return okStatus();
}

}  // namespace

Status launchMxfp4Dequant(const Mxfp4DequantArgs& a, cudaStream_t stream) {
  if (a.codes == nullptr || a.scales == nullptr || a.out == nullptr)
    return invalidArgument("mxfp4_dequant: codes, scales and out are required");
  if (a.experts <= 0 || a.n <= 0 || a.k <= 0 || a.k % 32 != 0)
    return invalidArgument("mxfp4_dequant: experts and n positive, k a positive multiple of 32");
  const Mxfp4PackedShape shape{a.experts, a.n, a.k};
  const dim3 grid(static_cast<unsigned>(shape.k_tiles()), static_cast<unsigned>(shape.n_tiles()),
                  static_cast<unsigned>(a.experts));
  if (a.experts > 65535 || shape.n_tiles() > 65535)
    return invalidArgument("mxfp4_dequant: too many experts or rows");
  if (a.max_scale <= kMxfp4MaxDecodeScale) {
    mxfp4DequantKernel<true><<<grid, kDqThreads, 0, stream>>>(a);
  } else {
    mxfp4DequantKernel<false><<<grid, kDqThreads, 0, stream>>>(a);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

Status launchMoeBiasSwiglu(const MoeBiasSwigluArgs& a, cudaStream_t stream) {
  if (a.inter <= 0 || a.inter % 8 != 0)
    return invalidArgument("moe_bias_swiglu: inter must be a positive multiple of 8");
  if (a.block_m <= 0 || a.num_experts <= 0)
    return invalidArgument("moe_bias_swiglu: block_m and num_experts must be positive");
  if (a.rows == 0) return okStatus();
  unsigned blocks = 0;
  RETURN_IF_ERROR(gridFor(a.rows * (a.inter / 8), "moe_bias_swiglu", &blocks));
  moeBiasSwigluKernel<<<blocks, kThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
