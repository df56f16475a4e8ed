#include <cooperative_groups.h>

#include <cstdint>
#include <string>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/gemm_smallm.cuh"

namespace garden::rose::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kBK = kSmallMTileK;
constexpr int kRow = kBK + 8;  // padded smem row (bf16): conflict-free ldmatrix (144 B)
constexpr int kWarpsN = 4;     // kBN / 4 columns each
constexpr int kWarpsM = 2;     // kMT 16-row tiles each
constexpr int kThreads = 32 * kWarpsN * kWarpsM;
constexpr size_t kMaxSmem = 227 * 1024;  // sm_90 per-block dynamic shared memory limit

// kMT: 16-row m tiles per warp (the instantiation covers up to 32 * kMT rows); kBN: the N tile
// (64: 16 columns per warp, 128: 32).
template <int kMT, int kBN>
struct Cfg {
  static constexpr int kMPad = kWarpsM * 16 * kMT;
  static constexpr int kWarpCols = kBN / kWarpsN;
  static constexpr int kNT = kWarpCols / 8;  // n8 tiles per warp
  static constexpr int kStages = (kMT <= 2 && kBN == 64) ? 6 : 4;
  static constexpr int kStageElems = (kBN + kMPad) * kRow;  // w tile, then x tile
  static constexpr size_t kSmem = size_t{kStages} * kStageElems * sizeof(bf16);
  static constexpr int kRedRow = kBN + 8;  // padded f32 row of the partial tile
  static_assert(kBN == 64 || kBN == 128, "N tile");
  static_assert(kNT % 2 == 0, "B fragments load two n8 tiles at a time");
  static_assert(kSmem <= kMaxSmem, "shared memory");
  static_assert(size_t{kMPad} * kRedRow * sizeof(float) <= kSmem, "partials reuse the pipeline");
  static_assert(kMPad * 8 % kThreads == 0 && kBN * 8 % kThreads == 0, "chunks per thread");
};

template <int kMT, int kBN>
__global__ void __launch_bounds__(kThreads, 1)
    smallMGemmKernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                     const bf16* __restrict__ bias, bf16* __restrict__ y, int m, int n, int k,
                     int splits) {
  using C = Cfg<kMT, kBN>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  cg::cluster_group cluster = cg::this_cluster();
  // Cluster dims (splits, 1, 1) over grid (splits, n / 64): blockIdx.x is the rank and the split.
  const int split = blockIdx.x;
  const int n0 = blockIdx.y * kBN;
  const int k_len = k / splits;
  const int k0 = split * k_len;
  const int nk = k_len / kBK;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wn = warp % kWarpsN;
  const int wm = warp / kWarpsN;
  const int m16 = (m + 15) & ~15;  // rows of the m tiles that are read at all

  auto load = [&](int kt, int stage) {
    bf16* sw = smem + stage * C::kStageElems;
    bf16* sx = sw + kBN * kRow;
    const int kb = k0 + kt * kBK;
#pragma unroll
    for (int j = 0; j < kBN * 8 / kThreads; ++j) {
      const int i = tid + j * kThreads;
      const int r = i >> 3, c = (i & 7) * 8;
      cpAsync16(sw + r * kRow + c, w + static_cast<int64_t>(n0 + r) * k + kb + c, true);
    }
#pragma unroll
    for (int j = 0; j < C::kMPad * 8 / kThreads; ++j) {
      const int i = tid + j * kThreads;
      const int r = i >> 3, c = (i & 7) * 8;
      if (r < m16) {  // rows m..m16-1 zero-filled (read by ldmatrix, never stored)
        const bool valid = r < m;
        cpAsync16(sx + r * kRow + c, x + static_cast<int64_t>(valid ? r : 0) * k + kb + c, valid);
      }
    }
  };

  float acc[kMT][C::kNT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
#pragma unroll
    for (int j = 0; j < C::kNT; ++j) {
      acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
    }
  }

#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < nk) load(s, s);
    cpAsyncCommit();  // one group per stage, empty or not, so the wait count below holds
  }
  const int row_base = wm * kMT * 16;
  for (int kt = 0; kt < nk; ++kt) {
    cpAsyncWait<C::kStages - 2>();  // stage kt has landed (this thread's copies)
    __syncthreads();                // ... everyone's; and stage kt - 1 is no longer read
    const int pf = kt + C::kStages - 1;
    if (pf < nk) load(pf, pf % C::kStages);
    cpAsyncCommit();
    const bf16* sw = smem + (kt % C::kStages) * C::kStageElems;
    const bf16* sx = sw + kBN * kRow;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      // B fragments, 16 of this warp's columns per ldmatrix: matrices (n 0-7, k 0-7),
      // (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) -> b[.][0..3]; w rows are n, so no
      // transpose.
      uint32_t b[C::kNT / 2][4];
#pragma unroll
      for (int nb = 0; nb < C::kNT / 2; ++nb) {
        ldmatrixX4(b[nb], sw + (wn * C::kWarpCols + nb * 16 + (lane >> 4) * 8 + (lane & 7)) * kRow +
                              kk * 16 + ((lane >> 3) & 1) * 8);
      }
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        const int r0 = row_base + i * 16;
        if (r0 < m) {  // warp-uniform: m tiles wholly past M are skipped
          // A fragment: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
          // (rows 8-15, k 8-15) -> a[0..3], as mma.m16n8k16's row-major A expects.
          uint32_t a[4];
          ldmatrixX4(a, sx + (r0 + (lane & 15)) * kRow + kk * 16 + (lane >> 4) * 8);
#pragma unroll
          for (int nb = 0; nb < C::kNT / 2; ++nb) {
            mmaBf16(acc[i][2 * nb], a, b[nb][0], b[nb][1]);
            mmaBf16(acc[i][2 * nb + 1], a, b[nb][2], b[nb][3]);
          }
        }
      }
    }
  }
  cpAsyncWait<0>();
  __syncthreads();  // the pipeline buffers become this CTA's partial tile

  float* red = reinterpret_cast<float*>(smem_raw);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
#pragma unroll
    for (int j = 0; j < C::kNT; ++j) {
      const int r = row_base + i * 16 + g;
      const int c = wn * C::kWarpCols + j * 8 + 2 * t;
      *reinterpret_cast<float2*>(red + r * C::kRedRow + c) =
          make_float2(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<float2*>(red + (r + 8) * C::kRedRow + c) =
          make_float2(acc[i][j][2], acc[i][j][3]);
    }
  }
  cluster.sync();  // every rank's partial tile is complete and visible

  // This rank's share of the tile: groups of 4 columns, rank-strided. Sum in rank order 0..S-1.
  constexpr int kGroupsPerRow = kBN / 4;
  const int groups = m * kGroupsPerRow;
  for (int gi = split * kThreads + tid; gi < groups; gi += splits * kThreads) {
    const int r = gi / kGroupsPerRow;
    const int c = (gi % kGroupsPerRow) * 4;
    const int off = r * C::kRedRow + c;
    float4 s = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, 0) + off);
    for (int q = 1; q < splits; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, q) + off);
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
    if (bias != nullptr) {
      s.x += __bfloat162float(bias[n0 + c]);
      s.y += __bfloat162float(bias[n0 + c + 1]);
      s.z += __bfloat162float(bias[n0 + c + 2]);
      s.w += __bfloat162float(bias[n0 + c + 3]);
    }
    uint2 out;
    out.x = packBf16x2(s.x, s.y);
    out.y = packBf16x2(s.z, s.w);
    *reinterpret_cast<uint2*>(y + static_cast<int64_t>(r) * n + n0 + c) = out;
  }
  cluster.sync();  // no rank exits while another still reads its shared memory
}

template <int kMT, int kBN>
Status setSmem() {
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(smallMGemmKernel<kMT, kBN>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(Cfg<kMT, kBN>::kSmem)));
  return okStatus();
}

template <int kMT, int kBN>
Status launch(const SmallMGemmArgs& a, cudaStream_t stream) {
  const cudaError_t err = launchClustered(
      smallMGemmKernel<kMT, kBN>,
      dim3(static_cast<unsigned>(a.splits), static_cast<unsigned>(a.n / kBN), 1),
      dim3(kThreads, 1, 1), Cfg<kMT, kBN>::kSmem, stream, static_cast<unsigned>(a.splits), false, a.x,
      a.w, a.bias, a.y, static_cast<int>(a.m), static_cast<int>(a.n), static_cast<int>(a.k),
      a.splits);
  if (err != cudaSuccess) {
    return cudaStatus(err, "cudaLaunchKernelEx(smallMGemmKernel)", __FILE__, __LINE__);
  }
  return okStatus();
}

template <int kBN>
Status launchForM(const SmallMGemmArgs& a, cudaStream_t stream) {
  if (a.m <= 32) return launch<1, kBN>(a, stream);
  if (a.m <= 64) return launch<2, kBN>(a, stream);
  if (a.m <= 128) return launch<4, kBN>(a, stream);
  return launch<8, kBN>(a, stream);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool smallMGemmSupported(int64_t m, int64_t n, int64_t k, int splits, int tile_n) {
  if (tile_n != 64 && tile_n != 128) return false;
  if (m < 1 || m > kSmallMMaxRows || n < tile_n || n % tile_n != 0 || k < kBK) return false;
  if (splits != 1 && splits != 2 && splits != 4 && splits != 8) return false;
  if (n / tile_n > 65535 || k > (int64_t{1} << 30) || n > (int64_t{1} << 30)) return false;
  return k % (int64_t{kBK} * splits) == 0;
}

int smallMGemmCandidates(int64_t n, int64_t k, int num_sms, SmallMConfig (&out)[8]) {
  int count = 0;
  for (int tile_n : {64, 128}) {
    for (int s = 1; s <= kSmallMMaxSplits; s *= 2) {
      if (!smallMGemmSupported(1, n, k, s, tile_n)) continue;
      const int64_t ctas = n / tile_n * s;
      if (k / s < 2 * kBK || 4 * ctas < num_sms || ctas > 4 * int64_t{num_sms}) continue;
      out[count++] = SmallMConfig{tile_n, s};
    }
  }
  return count;
}

Status prepareSmallMGemm() {
  static const Status once = [] {
    RETURN_IF_ERROR((setSmem<1, 64>()));
    RETURN_IF_ERROR((setSmem<2, 64>()));
    RETURN_IF_ERROR((setSmem<4, 64>()));
    RETURN_IF_ERROR((setSmem<8, 64>()));
    RETURN_IF_ERROR((setSmem<1, 128>()));
    RETURN_IF_ERROR((setSmem<2, 128>()));
    RETURN_IF_ERROR((setSmem<4, 128>()));
    return setSmem<8, 128>();
  }();
  return once;
}

Status launchSmallMGemm(const SmallMGemmArgs& a, cudaStream_t stream) {
  if (!smallMGemmSupported(a.m, a.n, a.k, a.splits, a.tile_n)) {
    return invalidArgument("gemm_smallm: unsupported shape m=" + std::to_string(a.m) +
                           " n=" + std::to_string(a.n) + " k=" + std::to_string(a.k) + " splits=" +
                           std::to_string(a.splits) + " tile_n=" + std::to_string(a.tile_n));
  }
  if (!aligned16(a.x) || !aligned16(a.w) || !aligned16(a.y)) {
    return invalidArgument("gemm_smallm: x, w and y must be 16-byte aligned");
  }
  RETURN_IF_ERROR(prepareSmallMGemm());
  return a.tile_n == 64 ? launchForM<64>(a, stream) : launchForM<128>(a, stream);
}

}  // namespace garden::rose::cuda
