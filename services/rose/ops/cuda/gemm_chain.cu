#include "services/rose/ops/cuda/gemm_chain.cuh"

#include <algorithm>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"

namespace garden::rose::cuda {
namespace {

constexpr int kBK = 64;          // K tile
constexpr int kWRow = kBK + 8;   // padded weight-tile row (bf16): conflict-free ldmatrix
constexpr int kTileElems = 16 * kWRow;  // one warp's 16 weight rows of one K tile

__host__ __device__ size_t xBytes(int rows_staged, int64_t k) {
  return (static_cast<size_t>(rows_staged) * static_cast<size_t>(k + 8) * 2 + 15) / 16 * 16;
}
size_t chainSmem(int rows_staged, int64_t k, int stages) {
  return xBytes(rows_staged, k) + static_cast<size_t>(stages) * kTileElems * 2;
}
int maxDynamicSmem() {
  static const int v = [] {
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) != cudaSuccess)
      return 48 * 1024;
    return optin - 1024;  // the kernels' static shared memory is none; keep a margin
  }();
  return v;
}

// One warp per block, 16 output columns per warp (grid = N / 16). The block stages its token rows
// [0, rows_staged) whole (cp.async), and its weight rows stream through a kStages-deep cp.async
// ring of 64-wide K tiles; per K tile four k16 steps, each an ldmatrix.x4 of the weights (A), one
// of the token rows (B) and one mma per n8 token tile into the tile's f32 accumulator.
template <int kTok, int kStages>
__global__ void __launch_bounds__(32) chainGemmKernel(ChainGemmArgs a, int rows_staged) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int kt_count = static_cast<int>(a.k / kBK);
  const int row_s = static_cast<int>(a.k) + 8;  // an odd multiple of 16 bytes: k % 64 == 0
  bf16* s_x = reinterpret_cast<bf16*>(smem);
  bf16* s_w = reinterpret_cast<bf16*>(smem + xBytes(rows_staged, a.k));

  auto stage_x = [&] {
    for (int r = 0; r < rows_staged; ++r) {
      for (int64_t c = lane * 8; c < a.k; c += 32 * 8)
        cpAsync16(s_x + r * row_s + c, a.x + static_cast<int64_t>(r) * a.k + c, true);
    }
    cpAsyncCommit();
  };
  // [TAG_CHAIN_PDL] A plain launch stages the token rows first (the oldest cp.async group); a
  // programmatic one streams its first weight tiles before griddepcontrol.wait (weights are never
  // written by the kernel before it) and stages the rows, the previous kernel's output, after it.
  if (!a.pdl) stage_x();
  const bf16* wbase = a.w + n0 * a.k;
  auto load = [&](int kt, int slot) {  // 16 rows x 8 chunks of 16 bytes: 4 per lane
    bf16* dst = s_w + slot * kTileElems;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int chunk = lane + 32 * i;
      const int r = chunk >> 3, c = (chunk & 7) * 8;
      cpAsync16(dst + r * kWRow + c, wbase + static_cast<int64_t>(r) * a.k + static_cast<int64_t>(kt) * kBK + c,
                true);
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kt_count) load(s, s);
    cpAsyncCommit();
  }
  if (a.pdl) {
    pdlWait();
    pdlTrigger();
    stage_x();
    cpAsyncWait<0>();  // the token rows are in (the newest group; the ring's tiles with them)
  } else {
    cpAsyncWait<kStages - 1>();  // the token rows are in (the oldest group)
  }
  __syncwarp();

  float acc[2][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  const int mi = lane >> 3, mr = lane & 7;
  // ldmatrix.x4 of B: (tokens 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15); kTok 8: the
  // last two repeat the first (unused). Token rows past rows_staged read the last staged row and
  // reach only outputs of rows past m, which are not stored.
  const int tok = min((kTok == 16 ? (mi >> 1) * 8 : 0) + mr, rows_staged - 1);
  const bf16* xrow = s_x + tok * row_s + (mi & 1) * 8;
  const int arow = lane & 15, acol = (lane >> 4) * 8;
  for (int kt = 0; kt < kt_count; ++kt) {
    cpAsyncWait<kStages - 2>();
    __syncwarp();  // tile kt is in; every lane is done with the slot refilled below
    {
      const int nk = kt + kStages - 1;
      if (nk < kt_count) load(nk, nk % kStages);
      cpAsyncCommit();
    }
    const bf16* ws = s_w + (kt % kStages) * kTileElems + arow * kWRow + acol;
    const bf16* xs = xrow + kt * kBK;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t af[4], b[4];
      ldmatrixX4(af, ws + s * 16);
      ldmatrixX4(b, xs + s * 16);
      mma16<bf16>(acc[0], af, b[0], b[1]);
      if constexpr (kTok == 16) mma16<bf16>(acc[1], af, b[2], b[3]);
    }
  }
  cpAsyncWait<0>();

  // acc[nt]: c0 (row g, token 8 nt + 2t), c1 (row g, token + 1), c2 / c3 the same for row g + 8.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < kTok / 8; ++nt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int64_t n = n0 + g + 8 * hr;
      const float bn = a.bias != nullptr ? __bfloat162float(a.bias[n]) : 0.f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int64_t m = nt * 8 + 2 * t + j;
        if (m < a.m) a.y[m * a.n + n] = __float2bfloat16_rn(acc[nt][2 * hr + j] + bn);
      }
    }
  }
}

template <int kTok, int kStages>
Status launchTok(const ChainGemmArgs& a, cudaStream_t stream) {
  const int rows = static_cast<int>(std::min<int64_t>(a.m, kTok));
  const size_t smem = chainSmem(rows, a.k, kStages);
  CUDA_RETURN_IF_ERROR(launchPdlAlways(a.pdl, chainGemmKernel<kTok, kStages>,
                                       dim3(static_cast<unsigned>(a.n / 16)), dim3(32), smem,
                                       stream, a, rows));
  return okStatus();
}

}  // namespace

bool chainGemmSupported(int64_t m, int64_t n, int64_t k, int stages) {
  if (m < 1 || m > kChainMaxRows || n < 16 || n % 16 != 0 || k < 64 || k % 64 != 0) return false;
  if (stages != 8 && stages != 16) return false;
  if (n / 16 > 0x7fffffff) return false;
  return chainSmem(static_cast<int>(m), k, stages) <= static_cast<size_t>(maxDynamicSmem());
}

Status prepareChainGemm() {
  const int smem = maxDynamicSmem();
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(chainGemmKernel<8, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(chainGemmKernel<8, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(chainGemmKernel<16, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(chainGemmKernel<16, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  return okStatus();
}

Status launchChainGemm(const ChainGemmArgs& a, cudaStream_t stream) {
  if (!chainGemmSupported(a.m, a.n, a.k, a.stages))
    return invalidArgument("chain gemm: m in [1, 16], n % 16 == 0, k % 64 == 0, stages 8 or 16");
  if (a.m <= 8) return a.stages == 8 ? launchTok<8, 8>(a, stream) : launchTok<8, 16>(a, stream);
  return a.stages == 8 ? launchTok<16, 8>(a, stream) : launchTok<16, 16>(a, stream);
}

}  // namespace garden::rose::cuda
