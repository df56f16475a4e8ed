// The MXFP4 expert GEMM on Hopper wgmma [TAG_MOE_WGMMA] (moe_wgmma.cuh, docs/gpt-oss-cuda.md).
//
// One block = one work item (packed 128-row weight tile nt, token tile t): 3 warpgroups.
//   warpgroup 0, the producer (one thread): per 64-wide K tile kt, into a kStages ring guarded by
//     mbarriers, the tile's token rows (ceil(tiles[t].n / 64) bulk tensor copies of {64 columns,
//     64 rows} of x, 128-byte swizzle: the K-major B operand) and the weight tile's packed codes
//     (4 KiB) and scales (256 B), both contiguous in the tiled layout (one bulk copy each).
//   warpgroups 1, 2, the consumers: 64 weight rows each (packed 16-row groups 4c .. 4c + 3; warp
//     w owns group 4c + w). Per kt a lane reads its 16 code bytes and its rows' 4 scale bytes,
//     dequantizes them into 16 registers — exactly the four k16 steps' A fragments of its warp's
//     16 rows (the packed layout is the mma A fragment layout, mxfp4_tiles.h; wgmma's register A
//     is the same per warp) — and issues 4 wgmma m64nNk16 (A registers, B the token tile),
//     N = tiles[t].n (16, 32, ..., 256: one instance each), accumulating in f32. The two consumers' wgmmas share the
//     tensor cores, so one's dequantization runs while the other's products do.
//   Epilogue per consumer: bias (+ clamped SwiGLU on (gate, up) pairs, a shuffle apart) on the
//   f32 sums, bf16 into a swizzled shared-memory tile [tokens][channels], then 16-byte stores of
//   the tile's real rows and channels.
// Registers: the producer gives its share up (setmaxnreg) to the consumers' accumulators (N / 2
// per thread, 128 at N = 256).

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

#include "services/rose/ops/cuda/attention_sm90.cuh"
#include "services/rose/ops/cuda/attention_sm90_layout.h"
#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/moe_wgmma.cuh"
#include "services/rose/ops/cuda/mxfp4_tiles.h"
#include "services/rose/ops/cuda/mxfp4_unit.cuh"
#include "services/rose/ops/cuda/sm90_ptx.cuh"
#include "services/rose/ops/cuda/sm90_wgmma_rs.cuh"
#include "services/rose/ops/cuda/sm90_wgmma_ss.cuh"

namespace garden::rose::cuda {
namespace {

using namespace ptx90;  // NOLINT(build/namespaces): the PTX wrappers

constexpr int kStages = 4;
constexpr int kThreads = 384;
constexpr int kMaxN = 256;                          // token rows per tile, at most
constexpr uint32_t kRowBytes = 128;                 // 64 bf16: one swizzled row
constexpr uint32_t kBoxRows = 64;                   // rows per bulk tensor copy
constexpr uint32_t kTokStage = kMaxN * kRowBytes;   // 32 KB
constexpr uint32_t kCodesStage = kMxTileBytes;      // 4 KiB
constexpr uint32_t kScalesStage = kMxTileRows * 2;  // 256 B
constexpr uint32_t kEpiBytes = kMaxN * kRowBytes;   // per consumer: [256 tokens][64 channels] bf16
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "register file");

// Shared memory, byte offsets from a 1024-aligned base.
struct Smem {
  static constexpr uint32_t kTok = 0;
  static constexpr uint32_t kCodes = kTok + kStages * kTokStage;
  static constexpr uint32_t kScales = kCodes + kStages * kCodesStage;
  static constexpr uint32_t kEpi = kScales + kStages * kScalesStage;
  static constexpr uint32_t kBars = kEpi + 2 * kEpiBytes;       // full[kStages], empty[kStages]
  static constexpr uint32_t kBytes = kBars + 16 * kStages + 1024;  // + alignment slack
};
static_assert(Smem::kTok % 1024 == 0 && kTokStage % 1024 == 0, "swizzle atoms");

// [TAG_MOE_WGMMA_SMEM_A] The shared-memory-A form: each consumer stores its dequantized 64 x 64
// weight K tile into a ring of kAStages A tiles ([64 rows][64 k] bf16, 128-byte rows, 16-byte
// chunk q at q ^ (row % 8): the token tile's K-major 128B-swizzle layout) and issues shared-memory
// wgmmas, keeping one K tile's wgmmas in flight while it dequantizes the next. The epilogue tiles
// lie over the token ring (both consumers pass kConsumersBarrier first: their last wgmmas are done
// and every bulk copy has landed, since they waited on every stage).
constexpr int kAStages = 3;
constexpr uint32_t kAStageBytes = 64 * kRowBytes;  // 8 KB
struct SmemSsA {
  static constexpr uint32_t kTok = 0;
  static constexpr uint32_t kCodes = kTok + kStages * kTokStage;
  static constexpr uint32_t kScales = kCodes + kStages * kCodesStage;
  static constexpr uint32_t kA = kScales + kStages * kScalesStage;  // [2 consumers][kAStages]
  static constexpr uint32_t kEpi = kTok;
  static constexpr uint32_t kBars = kA + 2 * kAStages * kAStageBytes;
  static constexpr uint32_t kBytes = kBars + 16 * kStages + 1024;
};
static_assert(SmemSsA::kA % 1024 == 0, "A tiles on swizzle atoms");
static_assert(2 * kEpiBytes <= kStages * kTokStage, "the epilogue tiles fit over the token ring");
static_assert(SmemSsA::kBytes <= 227 * 1024, "one block per SM");
constexpr int kConsumersBarrier = 3;  // named barrier of both consumers (1, 2: each its own)

__device__ unsigned int g_moe_wgmma_watchdog = 0;
__device__ __forceinline__ void mbarWait(uint32_t bar, uint32_t parity) {
  mbarWaitOrGiveUp(bar, parity, &g_moe_wgmma_watchdog);
}

// `bytes` (a multiple of 16) global -> shared, completing on mbarrier `bar`.
__device__ __forceinline__ void bulkLoad(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

__device__ __forceinline__ uint4 ldShared16(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t ldShared16b(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void stShared32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
template <typename T>
__device__ __forceinline__ void stShared16b(uint32_t addr, T v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(*reinterpret_cast<uint16_t*>(&v))
               : "memory");
}

// The lane's 16 A registers of one 64-wide K tile: word s of its code unit is k16 step s; the
// scale of (row g or g + 8, group 2kt + s / 2) as 2^(s - 1) (every scale <= 128).
// T = fp16 [TAG_ATTN_F16]: the fp16 fragments and factors of mxfp4_tiles.h.
template <typename T>
__device__ __forceinline__ void dequantKt(uint32_t (&a)[16], uint4 raw, uint32_t s_lo,
                                          uint32_t s_hi) {
  constexpr bool kHalf = std::is_same_v<T, __half>;
  uint32_t sf[2][2];
#pragma unroll
  for (int hg = 0; hg < 2; ++hg) {
    if constexpr (kHalf) {
      sf[0][hg] = mxScalePairF16(s_lo, hg);
      sf[1][hg] = mxScalePairF16(s_hi, hg);
    } else {
      const uint32_t b0 = mxfp4DecodeScaleBits((s_lo >> (8 * hg)) & 0xFFu);
      const uint32_t b1 = mxfp4DecodeScaleBits((s_hi >> (8 * hg)) & 0xFFu);
      sf[0][hg] = b0 | (b0 << 16);
      sf[1][hg] = b1 | (b1 << 16);
    }
  }
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint32_t word = s == 0 ? raw.x : s == 1 ? raw.y : s == 2 ? raw.z : raw.w;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[4 * s + j] = mul16x2Bits<T>(mxRegBits16<T>(word, j), sf[j & 1][s >> 1]);
    }
  }
}

struct Block {
  uint32_t base;  // 1024-aligned shared base
  uint32_t bars;  // the mbarriers: full[kStages], empty[kStages]
  int nt;         // weight tile
  int kt_count;
  MoeWgmmaTile tile;
};
__device__ __forceinline__ uint32_t fullBar(const Block& b, int st) { return b.bars + 8 * st; }
__device__ __forceinline__ uint32_t emptyBar(const Block& b, int st) {
  return b.bars + 8 * (kStages + st);
}

// Consumer c's epilogue from its accumulators (kN / 2 per thread) through the shared-memory tile
// at epi (kEpiBytes).
template <int kN, typename T>
__device__ __forceinline__ void storeTile(const MoeWgmmaArgs& a, const Block& b, int c, int tid,
                                          const float (&acc)[kN / 2], uint32_t epi) {
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  // Epilogue. Accumulator e: weight row (warp 16 + g + 8 hr) of this consumer, token column
  // 8 (e / 4) + 2 t4 + (e % 2), hr = (e / 2) % 2 (sm90::accRow / accCol).
  const int n_base = b.nt * kMxTileRows + 64 * c;  // this consumer's first weight row
  float bias[2] = {0.f, 0.f};
  if (a.bias != nullptr) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int ch = n_base + warp * 16 + g + 8 * hr;
      if (ch < a.n)
        bias[hr] = toF32(reinterpret_cast<const T*>(a.bias)[static_cast<int64_t>(b.tile.expert) * a.n + ch]);
    }
  }
  const int64_t row0 = b.tile.row0;
  if (!a.swiglu) {
    // [tokens][64 channels], 16-byte chunk q of token row r at chunk q ^ (r % 8).
#pragma unroll
    for (int e = 0; e < kN / 2; ++e) {
      const int hr = (e >> 1) & 1;
      const int tok = (e >> 2) * 8 + 2 * t4 + (e & 1);
      const int row = warp * 16 + g + 8 * hr;
      stShared16b(epi + tok * kRowBytes + ((((row >> 3) ^ (tok & 7))) << 4) + (row & 7) * 2,
                  fromF32<T>((acc[e] + bias[hr]) * a.out_scale));
    }
    namedBarrierSync(1 + c, 128);
    for (int i = tid; i < kN * 8; i += 128) {
      const int tok = i >> 3, q = i & 7;
      const int ch = n_base + q * 8;
      if (tok < b.tile.rows && ch < a.n) {
        const uint4 v = ldShared16(epi + tok * kRowBytes + ((q ^ (tok & 7)) << 4));
        *reinterpret_cast<uint4*>(a.out + (row0 + tok) * a.n + ch) = v;
      }
    }
  } else {
    // (gate, up) = weight rows (2i, 2i + 1): rows g and g + 1, lanes 4 apart. Output channel
    // i = n_base / 2 + warp 8 + g / 2 + 4 hr. [tokens][32 channels], chunk q at q ^ (r % 4).
    const float lim = a.limit, alpha = a.alpha;
#pragma unroll
    for (int e = 0; e < kN / 2; ++e) {
      const int hr = (e >> 1) & 1;
      const float v = acc[e] + bias[hr];
      const float up = __shfl_xor_sync(0xffffffffu, v, 4);
      if ((g & 1) == 0) {
        const int tok = (e >> 2) * 8 + 2 * t4 + (e & 1);
        const int och = warp * 8 + (g >> 1) + 4 * hr;
        stShared16b(epi + tok * 64 + ((((och >> 3) ^ (tok & 3))) << 4) + (och & 7) * 2,
                    fromF32<T>(clampedSwiglu(v, up, lim, alpha)));
      }
    }
    namedBarrierSync(1 + c, 128);
    const int n_out = a.n / 2;
    for (int i = tid; i < kN * 4; i += 128) {
      const int tok = i >> 2, q = i & 3;
      const int och = n_base / 2 + q * 8;
      if (tok < b.tile.rows && och < n_out) {
        const int64_t row = row0 + tok;
        uint4 v = ldShared16(epi + tok * 64 + ((q ^ (tok & 3)) << 4));
        if (a.row_token != nullptr && a.row_token[row] < 0) v = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(a.out + row * n_out + och) = v;
      }
    }
  }
}

// A consumer lane's part of each K tile in layout L's rings: its warp's packed 16-row group
// (4 c + warp) code unit and the scale pairs of its rows g and g + 8.
template <typename L>
struct ConsumerLane {
  int warp, lane, g;
  bool leader;  // lane 0: arrives on the stages' empty barriers for its warp
  uint32_t codes0, scales0;
  __device__ __forceinline__ ConsumerLane(const Block& b, int c, int tid)
      : warp(tid >> 5), lane(tid & 31), g(lane >> 2), leader(lane == 0) {
    const int grp = 4 * c + warp;
    codes0 = b.base + L::kCodes + grp * 512 + lane * 16;
    scales0 = b.base + L::kScales + (grp * 16 + g) * 2;
  }
  // Waits for K tile kt's stage and dequantizes this lane's 16 A registers of it.
  template <typename T>
  __device__ __forceinline__ void dequant(const Block& b, int kt, uint32_t (&ra)[16]) const {
    const int st = kt % kStages;
    mbarWait(fullBar(b, st), (kt / kStages) & 1);
    const uint4 raw = ldShared16(codes0 + st * kCodesStage);
    const uint32_t s_lo = ldShared16b(scales0 + st * kScalesStage);       // row g: groups 2kt, 2kt+1
    const uint32_t s_hi = ldShared16b(scales0 + st * kScalesStage + 16);  // row g + 8
    dequantKt<T>(ra, raw, s_lo, s_hi);
  }
};

// Consumer c (0, 1) of a block whose tile has N = kN token rows. Each K tile's wgmmas are
// waited for before the next tile's dequantization writes the A registers again: the other
// consumer's wgmmas keep the tensor cores busy meanwhile. (Two register sets with one tile's
// wgmmas left in flight were built and dropped: ptxas serializes such wgmmas, C7513, "non wgmma
// instructions defining input registers of a wgmma between start and end of the pipeline
// stage".)
template <int kN, typename T>
__device__ __forceinline__ void consume(const MoeWgmmaArgs& a, const Block& b, int c, int tid) {
  const ConsumerLane<Smem> ln(b, c, tid);
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.f;
  uint32_t ra[16];
  const uint64_t desc0 =
      sm90::makeDescriptor(b.base + Smem::kTok, sm90::kKMajorLbo, sm90::kSwizzleAtomBytes);
#pragma unroll 1
  for (int kt = 0; kt < b.kt_count; ++kt) {
    const int st = kt % kStages;
    ln.dequant<T>(b, kt, ra);
    fenceRegs(acc);
    wgmmaFence();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      wgmmaRSK<kN, std::is_same_v<T, __half>>(acc, ra[4 * s], ra[4 * s + 1], ra[4 * s + 2],
                                               ra[4 * s + 3],
                                               desc0 + ((st * kTokStage + 32u * s) >> 4));
    }
    wgmmaCommit();
    wgmmaWait<0>();
    fenceRegs(acc);
    fenceRegs(ra);
    mbarArriveIf(emptyBar(b, st), ln.leader);
  }
  storeTile<kN, T>(a, b, c, tid, acc, b.base + Smem::kEpi + c * kEpiBytes);
}

// [TAG_MOE_WGMMA_SMEM_A] Consumer c with its A operand in shared memory (SmemSsA). Per K tile: the
// same dequantization as consume() into 16 registers, stored to A stage kt % kAStages (lane
// (g, t4) of warp w holds rows w 16 + g + 8 (j & 1), k = 16 s + 8 (j >> 1) + 2 t4 of register
// 4 s + j: 16 conflict-free 32-bit stores), the consumer's named barrier, then the four k16
// steps' shared-memory wgmmas; wgmmaWait<1> leaves them in flight while the next K tile is
// dequantized, and the token stage of K tile kt - 1 is released once its wgmmas are done. A stage
// is rewritten three K tiles after it was read: every warp passed the barrier of the K tile in
// between after its wait for those wgmmas. Same A values and k16 order as the register form.
template <int kN, typename T>
__device__ __forceinline__ void consumeSmemA(const MoeWgmmaArgs& a, const Block& b, int c,
                                             int tid) {
  constexpr bool kHalf = std::is_same_v<T, __half>;
  const ConsumerLane<SmemSsA> ln(b, c, tid);
  const int g = ln.g;
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.f;
  uint32_t ra[16];
  const uint64_t desc_b0 =
      sm90::makeDescriptor(b.base + SmemSsA::kTok, sm90::kKMajorLbo, sm90::kSwizzleAtomBytes);
  const uint32_t a_ring = b.base + SmemSsA::kA + c * kAStages * kAStageBytes;
  const uint64_t desc_a0 = sm90::makeDescriptor(a_ring, sm90::kKMajorLbo, sm90::kSwizzleAtomBytes);
  // This lane's byte offset of register j's pair in a stage, for k16 step 0 (chunk (j >> 1));
  // step s adds 2 chunks: chunk (2 s + (j >> 1)) ^ g. Row r = warp 16 + g + 8 (j & 1): r % 8 = g.
  const uint32_t row_lo = static_cast<uint32_t>(ln.warp * 16 + g) * kRowBytes + 4u * (ln.lane & 3);
#pragma unroll 1
  for (int kt = 0; kt < b.kt_count; ++kt) {
    const int st = kt % kStages;
    const int as = kt % kAStages;
    ln.dequant<T>(b, kt, ra);
    const uint32_t abuf = a_ring + as * kAStageBytes + row_lo;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t chunk = static_cast<uint32_t>(2 * s + (j >> 1)) ^ static_cast<uint32_t>(g);
        stShared32(abuf + (j & 1) * 8u * kRowBytes + (chunk << 4), ra[4 * s + j]);
      }
    }
    fenceProxyAsyncShared();
    namedBarrierSync(1 + c, 128);  // the whole 64-row A tile is stored
    fenceRegs(acc);
    wgmmaFence();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      wgmmaSSK<kN, kHalf>(acc, desc_a0 + ((as * kAStageBytes + 32u * s) >> 4),
                          desc_b0 + ((st * kTokStage + 32u * s) >> 4));
    }
    wgmmaCommit();
    wgmmaWait<1>();  // K tile kt - 1's wgmmas are done; kt's stay in flight
    fenceRegs(acc);
    if (kt > 0) mbarArriveIf(emptyBar(b, (kt - 1) % kStages), ln.leader);
  }
  wgmmaWait<0>();
  fenceRegs(acc);
  if (b.kt_count > 0) mbarArriveIf(emptyBar(b, (b.kt_count - 1) % kStages), ln.leader);
  // The epilogue tiles lie over the token ring: both consumers' wgmmas must be done reading it.
  namedBarrierSync(kConsumersBarrier, 256);
  storeTile<kN, T>(a, b, c, tid, acc, b.base + SmemSsA::kEpi + c * kEpiBytes);
}

// Block b runs work item b = tile * ntw + nt (the weight tiles of one token tile next to each
// other). (A persistent version — one block per SM looping over items, the ring running on
// across them so the next item's loads overlap the last one's epilogue — measured 1-3 % faster
// on the H200 but made ptxas spill ~60 registers inside the main loops, which cost more: 20b 8k
// prefill 0.1271 s against 0.1213 without the loop; 2026-12-04 s10.)
// kSmemA: the shared-memory-A consumers and layout [TAG_MOE_WGMMA_SMEM_A].
template <typename T, bool kSmemA>
__global__ void __launch_bounds__(kThreads, 1)
    moeWgmmaKernel(const __grid_constant__ CUtensorMap x_map, MoeWgmmaArgs a) {
  using L = std::conditional_t<kSmemA, SmemSsA, Smem>;
  extern __shared__ unsigned char smem_raw[];
  Block b;
  b.base = (smemAddr(smem_raw) + 1023u) & ~1023u;
  b.bars = b.base + L::kBars;
  b.kt_count = (a.k + kMxTileK - 1) / kMxTileK;
  const int ntw = (a.n + kMxTileRows - 1) / kMxTileRows;
  // [TAG_MOE_WGMMA_DEVICE_PLAN] A grid sized by the bound: items past the plan's count leave.
  if (a.num_tiles_dev != nullptr && static_cast<int>(blockIdx.x) / ntw >= *a.num_tiles_dev) return;
  b.tile = a.tiles[blockIdx.x / ntw];
  b.nt = static_cast<int>(blockIdx.x) % ntw;
  const int wg = static_cast<int>(threadIdx.x) / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarInit(fullBar(b, s), 1);
      mbarInit(emptyBar(b, s), 8);  // lane 0 of each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (threadIdx.x == 0) {
      // Whole 64-row boxes: a tile of n rows loads ceil(n / 64) of them (the rows past n are
      // not read by its wgmmas).
      const int boxes = (b.tile.n + static_cast<int>(kBoxRows) - 1) / static_cast<int>(kBoxRows);
      const uint32_t bytes =
          static_cast<uint32_t>(boxes) * kBoxRows * kRowBytes + kCodesStage + kScalesStage;
      const int64_t first = (static_cast<int64_t>(b.tile.expert) * ntw + b.nt) * b.kt_count;
      const uint8_t* codes = a.codes + first * kCodesStage;
      const uint8_t* scales = a.scales + first * kScalesStage;
      for (int kt = 0; kt < b.kt_count; ++kt) {
        const int st = kt % kStages;
        mbarWait(emptyBar(b, st), ((kt / kStages) & 1) ^ 1);  // first round: at once
        const uint32_t full = fullBar(b, st);
        mbarArriveExpectTx(full, bytes);
        for (int bx = 0; bx < boxes; ++bx) {
          tmaLoad2d(b.base + L::kTok + st * kTokStage + bx * kBoxRows * kRowBytes, &x_map,
                    kt * kMxTileK, b.tile.row0 + bx * static_cast<int>(kBoxRows), full);
        }
        bulkLoad(b.base + L::kCodes + st * kCodesStage,
                 codes + static_cast<int64_t>(kt) * kCodesStage, kCodesStage, full);
        bulkLoad(b.base + L::kScales + st * kScalesStage,
                 scales + static_cast<int64_t>(kt) * kScalesStage, kScalesStage, full);
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  const int c = wg - 1, tid = static_cast<int>(threadIdx.x) % 128;
  switch (b.tile.n >> 4) {
#define GARDEN_MOE_WGMMA_CASE(i)              \
  case i:                                     \
    if constexpr (kSmemA) {                   \
      consumeSmemA<16 * i, T>(a, b, c, tid);  \
    } else {                                  \
      consume<16 * i, T>(a, b, c, tid);       \
    }                                         \
    break;
    GARDEN_MOE_WGMMA_CASE(1)
    GARDEN_MOE_WGMMA_CASE(2)
    GARDEN_MOE_WGMMA_CASE(3)
    GARDEN_MOE_WGMMA_CASE(4)
    GARDEN_MOE_WGMMA_CASE(5)
    GARDEN_MOE_WGMMA_CASE(6)
    GARDEN_MOE_WGMMA_CASE(7)
    GARDEN_MOE_WGMMA_CASE(8)
    GARDEN_MOE_WGMMA_CASE(9)
    GARDEN_MOE_WGMMA_CASE(10)
    GARDEN_MOE_WGMMA_CASE(11)
    GARDEN_MOE_WGMMA_CASE(12)
    GARDEN_MOE_WGMMA_CASE(13)
    GARDEN_MOE_WGMMA_CASE(14)
    GARDEN_MOE_WGMMA_CASE(15)
    GARDEN_MOE_WGMMA_CASE(16)
#undef GARDEN_MOE_WGMMA_CASE
    default:
      break;
  }
}

}  // namespace

bool moeWgmmaSupported() { return deviceCapability() == 90 && tensorMapEncoder() != nullptr; }

Status launchMoeWgmma(const MoeWgmmaArgs& a, cudaStream_t stream) {
  if (a.num_tiles == 0) return okStatus();
  if (!moeWgmmaSupported()) return unimplemented("moe_wgmma: needs an sm_90 device and tensor maps");
  if (a.x == nullptr || a.codes == nullptr || a.scales == nullptr || a.tiles == nullptr ||
      a.out == nullptr || a.num_tiles < 0 || a.experts <= 0 || a.x_rows <= 0) {
    return invalidArgument("moe_wgmma: missing pointers or empty shapes");
  }
  if (a.k <= 0 || a.k % 32 != 0 || a.n <= 0 || a.n % (a.swiglu ? 16 : 8) != 0) {
    return invalidArgument("moe_wgmma: k must be a positive multiple of 32, n of 8 (16 with swiglu)");
  }
  if (a.max_scale > kMxfp4MaxDecodeScale) {
    return invalidArgument("moe_wgmma: scale bytes above 128 (" + std::to_string(a.max_scale) +
                           ") need the two-multiply dequantization");
  }
  if (static_cast<int64_t>(a.num_tiles) * ((a.n + kMxTileRows - 1) / kMxTileRows) > INT32_MAX ||
      a.x_rows > INT32_MAX) {
    return invalidArgument("moe_wgmma: too many tiles or rows");
  }
  if ((reinterpret_cast<uintptr_t>(a.x) | reinterpret_cast<uintptr_t>(a.out)) % 16 != 0) {
    return invalidArgument("moe_wgmma: x and out must be 16-byte aligned");
  }
  CUtensorMap map;
  const uint64_t dims[2] = {static_cast<uint64_t>(a.k), static_cast<uint64_t>(a.x_rows)};
  const uint64_t strides[1] = {static_cast<uint64_t>(a.k) * 2};
  const uint32_t box[2] = {static_cast<uint32_t>(kMxTileK), kBoxRows};
  RETURN_IF_ERROR(encode16TensorMap(&map, a.x, 2, dims, strides, box, "moe_wgmma", a.f16));
  static std::once_flag once;
  static cudaError_t configured = cudaSuccess;
  std::call_once(once, [] {
    auto set = [](const void* f, uint32_t bytes) {
      if (configured == cudaSuccess)
        configured = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes));
    };
    set(reinterpret_cast<const void*>(moeWgmmaKernel<__nv_bfloat16, false>), Smem::kBytes);
    set(reinterpret_cast<const void*>(moeWgmmaKernel<__half, false>), Smem::kBytes);
    set(reinterpret_cast<const void*>(moeWgmmaKernel<__nv_bfloat16, true>), SmemSsA::kBytes);
    set(reinterpret_cast<const void*>(moeWgmmaKernel<__half, true>), SmemSsA::kBytes);
  });
  CUDA_RETURN_IF_ERROR(configured);
  const int64_t items = static_cast<int64_t>(a.num_tiles) * ((a.n + kMxTileRows - 1) / kMxTileRows);
  const unsigned grid = static_cast<unsigned>(items);
  if (a.smem_a) {  // [TAG_MOE_WGMMA_SMEM_A]
    if (a.f16) {
      moeWgmmaKernel<__half, true><<<grid, kThreads, SmemSsA::kBytes, stream>>>(map, a);
    } else {
      moeWgmmaKernel<__nv_bfloat16, true><<<grid, kThreads, SmemSsA::kBytes, stream>>>(map, a);
    }
  } else if (a.f16) {  // [TAG_ATTN_F16]
    moeWgmmaKernel<__half, false><<<grid, kThreads, Smem::kBytes, stream>>>(map, a);
  } else {
    moeWgmmaKernel<__nv_bfloat16, false><<<grid, kThreads, Smem::kBytes, stream>>>(map, a);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

// [TAG_MOE_WGMMA_DEVICE_PLAN] One block: count the align's tiles per expert, scan the row and
// tile offsets (one thread; experts <= 1024), then each expert's thread writes its tiles with the
// host plan's own cut (moeWgmmaExpertTile).
__global__ void __launch_bounds__(1024) moeWgmmaPlanKernel(MoeWgmmaDevicePlanArgs a) {
  __shared__ int32_t cnt[kMoeWgmmaPlanMaxExperts];
  __shared__ int32_t roff[kMoeWgmmaPlanMaxExperts + 1];
  __shared__ int32_t toff[kMoeWgmmaPlanMaxExperts + 1];
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = tid; e < a.experts; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int32_t n = min(*a.num_align_tiles, a.max_align_tiles);
  for (int i = tid; i < n; i += blockDim.x) {
    const int32_t e = a.tile_expert[i];
    if (e >= 0 && e < a.experts) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (tid == 0) {
    int32_t r = 0, t = 0;
    for (int e = 0; e < a.experts; ++e) {
      roff[e] = r;
      toff[e] = t;
      const int32_t rows = cnt[e] * a.block_m;
      r += rows;
      t += moeWgmmaExpertTiles(rows);
    }
    roff[a.experts] = r;
    toff[a.experts] = t;
    if (t > a.cap) __trap();  // cannot happen: cap is moeWgmmaMaxTiles of the align's bound
    *a.num_tiles = t;
  }
  __syncthreads();
  for (int e = tid; e < a.experts; e += blockDim.x) {
    const int32_t rows = roff[e + 1] - roff[e];
    const int32_t tiles = toff[e + 1] - toff[e];
    for (int32_t j = 0; j < tiles; ++j) a.tiles[toff[e] + j] = moeWgmmaExpertTile(e, roff[e], rows, j);
  }
}

Status launchMoeWgmmaDevicePlan(const MoeWgmmaDevicePlanArgs& a, cudaStream_t stream) {
  if (a.tile_expert == nullptr || a.num_align_tiles == nullptr || a.tiles == nullptr ||
      a.num_tiles == nullptr || a.experts <= 0 || a.experts > kMoeWgmmaPlanMaxExperts ||
      a.block_m <= 0 || a.max_align_tiles < 0 || a.cap <= 0) {
    return invalidArgument("moe_wgmma plan: missing pointers or bad shape");
  }
  moeWgmmaPlanKernel<<<1, 1024, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

Result<bool> moeWgmmaWatchdogFired() {
  unsigned int fired = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(&fired, g_moe_wgmma_watchdog, sizeof(fired)));
  const unsigned int zero = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpyToSymbol(g_moe_wgmma_watchdog, &zero, sizeof(zero)));
  return fired != 0;
}

}  // namespace garden::rose::cuda
