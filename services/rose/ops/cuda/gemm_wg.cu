// [TAG_GEMM_WG] The Hopper weight-streaming GEMM (gemm_wg.cuh says what and why).
#include <cooperative_groups.h>

#include <cstdint>
#include <string>

#include "services/rose/ops/cuda/attention_sm90.cuh"
#include "services/rose/ops/cuda/attention_sm90_layout.h"
#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/gemm_wg.cuh"
#include "services/rose/ops/cuda/sm90_ptx.cuh"
#include "services/rose/ops/cuda/sm90_wgmma_ss.cuh"

namespace garden::rose::cuda {
namespace {

namespace cg = cooperative_groups;
using namespace ptx90;  // NOLINT(build/namespaces): the PTX wrappers

constexpr uint32_t kRowBytes = 128;  // 64 bf16 of K: one 128-byte swizzled row
constexpr size_t kPipeBudget = 200 * 1024;

// kWG consumer warpgroups (64 weight rows each), kT tokens per CTA.
template <int kWG, int kT>
struct Cfg {
  static constexpr int kThreads = 128 * (kWG + 1);  // warpgroup 0 produces
  static constexpr int kRowsW = 64 * kWG;
  static constexpr uint32_t kWBytes = kRowsW * kRowBytes;
  static constexpr uint32_t kXBytes = kT * kRowBytes;
  static constexpr uint32_t kStageBytes = kWBytes + kXBytes;
  static constexpr int kStages = kPipeBudget / kStageBytes > 8 ? 8 : kPipeBudget / kStageBytes;
  static constexpr uint32_t kPipeBytes = kStages * kStageBytes;
  // The f32 partial tile [kT tokens][kRowsW + 4] over the ring (the pad: conflict-free stores).
  static constexpr int kRedRow = kRowsW + 4;
  static constexpr uint32_t kRedBytes = kT * kRedRow * 4;
  static constexpr uint32_t kBars = kPipeBytes > kRedBytes ? kPipeBytes : kRedBytes;
  static constexpr size_t kSmem = kBars + 16 * kStages + 1024;  // + 1024-byte alignment slack
  static_assert(kStages >= 2, "pipeline");
  static_assert(kWBytes % 1024 == 0 && kXBytes % 1024 == 0, "swizzle atoms");
  static_assert(kSmem <= 227 * 1024, "one block per SM");
  static_assert((kRedRow * 4) % 16 == 0, "float4 rows");
};

__device__ unsigned int g_wg_gemm_watchdog = 0;
__device__ __forceinline__ void mbarWait(uint32_t bar, uint32_t parity) {
  mbarWaitOrGiveUp(bar, parity, &g_wg_gemm_watchdog);
}

template <int kWG, int kT>
__global__ void __launch_bounds__(Cfg<kWG, kT>::kThreads, 1)
    wgGemmKernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                 const bf16* __restrict__ bias, bf16* __restrict__ y, int m, int n, int k,
                 int splits, int pdl) {
  using C = Cfg<kWG, kT>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smemAddr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* gbase = smem_raw + (base - raw);
  const uint32_t bars = base + C::kBars;  // full[kStages], then empty[kStages]
  auto full = [&](int s) { return bars + 8u * static_cast<uint32_t>(s); };
  auto empty = [&](int s) { return bars + 8u * static_cast<uint32_t>(C::kStages + s); };
  auto stageW = [&](int s) { return base + static_cast<uint32_t>(s) * C::kStageBytes; };
  auto stageX = [&](int s) { return stageW(s) + C::kWBytes; };

  cg::cluster_group cluster = cg::this_cluster();
  const int split = static_cast<int>(blockIdx.x);
  const int n0 = static_cast<int>(blockIdx.y) * C::kRowsW;
  const int t0 = static_cast<int>(blockIdx.z) * kT;
  const int k_len = k / splits;
  const int k0 = split * k_len;
  const int nk = k_len / kWgGemmTileK;
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid / 128;

  if (tid == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbarInit(full(s), 1);
      mbarInit(empty(s), 4 * kWG);  // lane 0 of each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  float acc[kT / 2];
#pragma unroll
  for (int i = 0; i < kT / 2; ++i) acc[i] = 0.f;

  if (wg == 0) {
    if (tid == 0) {
      // The first stages' weight tiles before the wait (they do not depend on the previous
      // kernel), their x tiles after it.
      const int pre = nk < C::kStages ? nk : C::kStages;
      for (int s = 0; s < pre; ++s) {
        mbarArriveExpectTx(full(s), C::kStageBytes);
        tmaLoad2d(stageW(s), &w_map, k0 + s * kWgGemmTileK, n0, full(s));
      }
      if (pdl) pdlWait();
      for (int s = 0; s < pre; ++s) {
        tmaLoad2d(stageX(s), &x_map, k0 + s * kWgGemmTileK, t0, full(s));
      }
      for (int kt = pre; kt < nk; ++kt) {
        const int s = kt % C::kStages;
        mbarWait(empty(s), ((kt / C::kStages) & 1) ^ 1);
        mbarArriveExpectTx(full(s), C::kStageBytes);
        tmaLoad2d(stageW(s), &w_map, k0 + kt * kWgGemmTileK, n0, full(s));
        tmaLoad2d(stageX(s), &x_map, k0 + kt * kWgGemmTileK, t0, full(s));
      }
    }
  } else {
    const int c = wg - 1;
    const int lane = tid & 31;
    const uint64_t a0 = sm90::makeDescriptor(stageW(0) + static_cast<uint32_t>(c) * 64 * kRowBytes,
                                             sm90::kKMajorLbo, sm90::kSwizzleAtomBytes);
    const uint64_t b0 = sm90::makeDescriptor(stageX(0), sm90::kKMajorLbo, sm90::kSwizzleAtomBytes);
    constexpr uint64_t kStep = C::kStageBytes >> 4;  // descriptor start address per stage
    for (int kt = 0; kt < nk; ++kt) {
      const int s = kt % C::kStages;
      mbarWait(full(s), (kt / C::kStages) & 1);
      wgmmaFence();
      fenceRegs(acc);
#pragma unroll
      for (int kk = 0; kk < kWgGemmTileK / 16; ++kk) {
        // k-step kk: 16 columns = 32 bytes into each swizzled 128-byte row.
        const uint64_t off = static_cast<uint64_t>(s) * kStep + static_cast<uint64_t>(kk * 2);
        wgmmaSSK<kT>(acc, a0 + off, b0 + off);
      }
      wgmmaCommit();
      wgmmaWait<1>();  // the previous stage's wgmmas are done reading it
      fenceRegs(acc);
      // Predicated, not branched: the warp stays converged for the next .aligned wgmma.
      mbarArriveIf(empty((kt + C::kStages - 1) % C::kStages), kt > 0 && lane == 0);
    }
    wgmmaWait<0>();
    fenceRegs(acc);
  }
  // Every consumer is done reading the ring and every copy has landed (each stage was waited
  // on): the ring becomes this CTA's partial tile.
  __syncthreads();
  pdlTrigger();
  if (pdl) pdlWait();  // before any global write (a no-op by now: the producer waited)
  float* red = reinterpret_cast<float*>(gbase);
  if (wg > 0) {
    const int c = wg - 1, t = tid % 128;
#pragma unroll
    for (int e = 0; e < kT / 2; ++e) {
      // Accumulator e: weight row accRow of this consumer's 64, token accCol.
      red[sm90::accCol(t, e) * C::kRedRow + c * 64 + sm90::accRow(t, e)] = acc[e];
    }
  }
  cluster.sync();  // every rank's partial tile is complete and visible

  // This rank's share of the tile: groups of 4 weight rows (output columns), rank-strided; the
  // sum in rank order 0..splits-1.
  constexpr int kGroupsPerTok = C::kRowsW / 4;
  const int tm = m - t0 < kT ? m - t0 : kT;
  const int groups = tm * kGroupsPerTok;
  for (int gi = split * C::kThreads + tid; gi < groups; gi += splits * C::kThreads) {
    const int r = gi / kGroupsPerTok;
    const int col = (gi % kGroupsPerTok) * 4;
    const int off = r * C::kRedRow + col;
    float4 sum = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, 0) + off);
    for (int q = 1; q < splits; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, q) + off);
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    if (bias != nullptr) {
      sum.x += __bfloat162float(bias[n0 + col]);
      sum.y += __bfloat162float(bias[n0 + col + 1]);
      sum.z += __bfloat162float(bias[n0 + col + 2]);
      sum.w += __bfloat162float(bias[n0 + col + 3]);
    }
    uint2 out;
    out.x = packBf16x2(sum.x, sum.y);
    out.y = packBf16x2(sum.z, sum.w);
    *reinterpret_cast<uint2*>(y + static_cast<int64_t>(t0 + r) * n + n0 + col) = out;
  }
  cluster.sync();  // no rank exits while another still reads its shared memory
}

template <int kWG, int kT>
Status setSmem() {
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(wgGemmKernel<kWG, kT>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(Cfg<kWG, kT>::kSmem)));
  return okStatus();
}

template <int kWG, int kT>
Status launch(const WgGemmArgs& a, cudaStream_t stream) {
  using C = Cfg<kWG, kT>;
  CUtensorMap w_map, x_map;
  const uint64_t w_dims[2] = {static_cast<uint64_t>(a.k), static_cast<uint64_t>(a.n)};
  const uint64_t x_dims[2] = {static_cast<uint64_t>(a.k), static_cast<uint64_t>(a.m)};
  const uint64_t strides[1] = {static_cast<uint64_t>(a.k) * sizeof(bf16)};
  const uint32_t w_box[2] = {static_cast<uint32_t>(kWgGemmTileK), static_cast<uint32_t>(C::kRowsW)};
  const uint32_t x_box[2] = {static_cast<uint32_t>(kWgGemmTileK), static_cast<uint32_t>(kT)};
  RETURN_IF_ERROR(encodeBf16TensorMap(&w_map, a.w, 2, w_dims, strides, w_box, "gemm_wg: w"));
  RETURN_IF_ERROR(encodeBf16TensorMap(&x_map, a.x, 2, x_dims, strides, x_box, "gemm_wg: x"));
  const dim3 grid(static_cast<unsigned>(a.splits), static_cast<unsigned>(a.n / C::kRowsW),
                  static_cast<unsigned>((a.m + kT - 1) / kT));
  const cudaError_t err =
      launchClustered(wgGemmKernel<kWG, kT>, grid, dim3(C::kThreads, 1, 1), C::kSmem, stream,
                      static_cast<unsigned>(a.splits), a.pdl, w_map, x_map, a.bias, a.y,
                      static_cast<int>(a.m), static_cast<int>(a.n), static_cast<int>(a.k), a.splits,
                      a.pdl ? 1 : 0);
  if (err != cudaSuccess) return cudaStatus(err, "cudaLaunchKernelEx(wgGemmKernel)", __FILE__, __LINE__);
  return okStatus();
}

template <int kWG>
Status launchForTile(const WgGemmArgs& a, cudaStream_t stream) {
  switch (a.tok_tile) {
    case 64: return launch<kWG, 64>(a, stream);
    case 128: return launch<kWG, 128>(a, stream);
    default: return launch<kWG, 256>(a, stream);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool wgGemmSupported(int64_t m, int64_t n, int64_t k, const WgGemmConfig& c) {
  if (c.warpgroups != 1 && c.warpgroups != 2) return false;
  if (c.tok_tile != 64 && c.tok_tile != 128 && c.tok_tile != 256) return false;
  if (c.splits != 1 && c.splits != 2 && c.splits != 4 && c.splits != 8) return false;
  const int64_t rows = 64 * c.warpgroups;
  if (m < 1 || n < rows || n % rows != 0 || k < kWgGemmTileK) return false;
  if (m >= (int64_t{1} << 31) || n >= (int64_t{1} << 31) || k >= (int64_t{1} << 30)) return false;
  if (n / rows > 65535 || (m + c.tok_tile - 1) / c.tok_tile > 65535) return false;
  return k % (int64_t{kWgGemmTileK} * c.splits) == 0;
}

int wgGemmTokTile(int64_t bucket_m) { return bucket_m <= 64 ? 64 : bucket_m <= 128 ? 128 : 256; }

int wgGemmCandidates(int64_t bucket_m, int64_t n, int64_t k, int num_sms, WgGemmConfig (&out)[8]) {
  int count = 0;
  const int tile = wgGemmTokTile(bucket_m);
  const int64_t tok_tiles = (bucket_m + tile - 1) / tile;
  for (int wgs : {2, 1}) {
    for (int s = 1; s <= kWgGemmMaxSplits && count < 8; s *= 2) {
      const WgGemmConfig c{s, wgs, tile};
      if (!wgGemmSupported(bucket_m, n, k, c)) continue;
      const int64_t ctas = n / (64 * wgs) * s * tok_tiles;
      if (k / s < 2 * kWgGemmTileK || 4 * ctas < num_sms || ctas > 2 * int64_t{num_sms}) continue;
      out[count++] = c;
    }
  }
  return count;
}

bool wgGemmAvailable() { return deviceCapability() == 90 && tensorMapEncoder() != nullptr; }

Status prepareWgGemm() {
  static const Status once = [] {
    if (!wgGemmAvailable()) {
      return unimplemented("gemm_wg: needs an sm_90 device and the tensor-map encoder");
    }
    RETURN_IF_ERROR((setSmem<1, 64>()));
    RETURN_IF_ERROR((setSmem<1, 128>()));
    RETURN_IF_ERROR((setSmem<1, 256>()));
    RETURN_IF_ERROR((setSmem<2, 64>()));
    RETURN_IF_ERROR((setSmem<2, 128>()));
    return setSmem<2, 256>();
  }();
  return once;
}

Status launchWgGemm(const WgGemmArgs& a, cudaStream_t stream) {
  const WgGemmConfig c{a.splits, a.warpgroups, a.tok_tile};
  if (!wgGemmSupported(a.m, a.n, a.k, c)) {
    return invalidArgument("gemm_wg: unsupported shape m=" + std::to_string(a.m) + " n=" +
                           std::to_string(a.n) + " k=" + std::to_string(a.k) + " splits=" +
                           std::to_string(a.splits) + " warpgroups=" + std::to_string(a.warpgroups) +
                           " tok_tile=" + std::to_string(a.tok_tile));
  }
  if (!aligned16(a.x) || !aligned16(a.w) || !aligned16(a.y)) {
    return invalidArgument("gemm_wg: x, w and y must be 16-byte aligned");
  }
  RETURN_IF_ERROR(prepareWgGemm());
  return a.warpgroups == 1 ? launchForTile<1>(a, stream) : launchForTile<2>(a, stream);
}

Result<bool> wgGemmWatchdogFired() {
  unsigned int fired = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(&fired, g_wg_gemm_watchdog, sizeof(fired)));
  return fired != 0;
}

}  // namespace garden::rose::cuda
