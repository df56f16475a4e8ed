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
// [TAG_MOE_WGMMA_SMEM_A] The other form (MoeWgmmaArgs::smem_a): warpgroup 0 dequantizes into
// shared-memory A tiles and issues the bulk copies, the consumers run shared-memory wgmmas only
// (SmemSsA, dequantWarp, consumeSmemA below).

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

// [TAG_MOE_WGMMA_SMEM_A] The dequantization-warpgroup form (3 warpgroups, no register moves):
// warpgroup 0 dequantizes every K tile's 128 weight rows into a ring of kAStages A tiles per
// consumer in shared memory ([64 rows][64 k] bf16, 128-byte rows, 16-byte chunk q at q ^ (row %
// 8): the token tile's K-major 128B-swizzle layout), its warp 0 also issuing the bulk copies, and
// the consumers (warpgroups 1, 2) issue only shared-memory wgmmas and waits. ptxas compiles every
// warp under the launch bound's 65536 / threads registers whatever setmaxnreg says, so a fourth
// warpgroup would leave the consumers 128 registers, too few for N = 256 (C7602). The epilogue
// tiles lie over the token ring (both consumers pass kConsumersBarrier first: their last wgmmas
// are done and every bulk copy has landed, since they waited on every stage).
constexpr int kAStages = 4;
constexpr uint32_t kAStageBytes = 64 * kRowBytes;  // 8 KB
struct SmemSsA {
  static constexpr uint32_t kTok = 0;
  static constexpr uint32_t kCodes = kTok + kStages * kTokStage;
  static constexpr uint32_t kScales = kCodes + kStages * kCodesStage;
  static constexpr uint32_t kA = (kScales + kStages * kScalesStage + 1023u) & ~1023u;
  static constexpr uint32_t kEpi = kTok;
  // full[kStages], empty[kStages], aFull[2][kAStages], aEmpty[2][kAStages]
  static constexpr uint32_t kBars = kA + 2 * kAStages * kAStageBytes;
  static constexpr uint32_t kBytes = kBars + 16 * kStages + 32 * kAStages + 1024;
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

// The bulk copies of one K tile into stage kt % kStages of layout L's ring, once the stage's
// readers released it: the token tile's rows (whole 64-row boxes: a tile of n rows loads
// ceil(n / 64) of them; the rows past n are not read by its wgmmas) and the weight tile's codes
// and scales. One thread.
template <typename L>
struct Producer {
  const CUtensorMap* map;
  const uint8_t* codes;
  const uint8_t* scales;
  int boxes;
  uint32_t bytes;
  __device__ __forceinline__ Producer(const MoeWgmmaArgs& a, const Block& b, const CUtensorMap& m,
                                      int ntw)
      : map(&m) {
    boxes = (b.tile.n + static_cast<int>(kBoxRows) - 1) / static_cast<int>(kBoxRows);
    bytes = static_cast<uint32_t>(boxes) * kBoxRows * kRowBytes + kCodesStage + kScalesStage;
    const int64_t first = (static_cast<int64_t>(b.tile.expert) * ntw + b.nt) * b.kt_count;
    codes = a.codes + first * kCodesStage;
    scales = a.scales + first * kScalesStage;
  }
  __device__ __forceinline__ void load(const Block& b, int kt) const {
    const int st = kt % kStages;
    mbarWait(emptyBar(b, st), ((kt / kStages) & 1) ^ 1);  // first round: at once
    const uint32_t full = fullBar(b, st);
    mbarArriveExpectTx(full, bytes);
    for (int bx = 0; bx < boxes; ++bx) {
      tmaLoad2d(b.base + L::kTok + st * kTokStage + bx * kBoxRows * kRowBytes, map,
                kt * kMxTileK, b.tile.row0 + bx * static_cast<int>(kBoxRows), full);
    }
    bulkLoad(b.base + L::kCodes + st * kCodesStage, codes + static_cast<int64_t>(kt) * kCodesStage,
             kCodesStage, full);
    bulkLoad(b.base + L::kScales + st * kScalesStage,
             scales + static_cast<int64_t>(kt) * kScalesStage, kScalesStage, full);
  }
};

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

// A lane's share of packed 16-row group grp in each K tile's stage: its 16-byte code unit and
// the scale pairs of its rows g and g + 8 (both layouts keep codes and scales at the same offsets).
static_assert(Smem::kCodes == SmemSsA::kCodes && Smem::kScales == SmemSsA::kScales, "one layout");
struct GroupLane {
  uint32_t codes0, scales0;
  __device__ __forceinline__ GroupLane(uint32_t base, int grp, int lane)
      : codes0(base + Smem::kCodes + grp * 512 + lane * 16),
        scales0(base + Smem::kScales + (grp * 16 + (lane >> 2)) * 2) {}
  // This lane's 16 A registers of the K tile in stage st (dequantKt).
  template <typename T>
  __device__ __forceinline__ void dequant(int st, uint32_t (&ra)[16]) const {
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
  const GroupLane ln(b.base, 4 * c + (tid >> 5), tid & 31);  // warp w: group 4 c + w
  const bool leader = (tid & 31) == 0;  // arrives on the stages' empty barriers for its warp
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.f;
  uint32_t ra[16];
  const uint64_t desc0 =
      sm90::makeDescriptor(b.base + Smem::kTok, sm90::kKMajorLbo, sm90::kSwizzleAtomBytes);
#pragma unroll 1
  for (int kt = 0; kt < b.kt_count; ++kt) {
    const int st = kt % kStages;
    mbarWait(fullBar(b, st), (kt / kStages) & 1);
    ln.dequant<T>(st, ra);
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
    mbarArriveIf(emptyBar(b, st), leader);
  }
  storeTile<kN, T>(a, b, c, tid, acc, b.base + Smem::kEpi + c * kEpiBytes);
}

// [TAG_MOE_WGMMA_SMEM_A] The A ring's barriers (SmemSsA): consumer c's A stage `as` is full
// (the 64 lanes of its two dequantization warps arrive) and empty (its 4 warps' lane 0).
__device__ __forceinline__ uint32_t aFullBar(const Block& b, int c, int as) {
  return b.bars + 8 * (2 * kStages + c * kAStages + as);
}
__device__ __forceinline__ uint32_t aEmptyBar(const Block& b, int c, int as) {
  return b.bars + 8 * (2 * kStages + 2 * kAStages + c * kAStages + as);
}

// Four 8 x 8 b16 matrices to shared memory: lane 8 m + r gives the address of row r of matrix m,
// register m holds matrix m's mma fragment (row lane / 4, columns 2 (lane % 4), + 1).
__device__ __forceinline__ void stMatrix4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                          uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// [TAG_MOE_WGMMA_SMEM_A] Dequantization warp dw (0..3) of the 3-warpgroup form: packed 16-row
// groups 2 dw and 2 dw + 1, i.e. rows 32 (dw % 2) .. + 31 of consumer dw / 2's A tiles. Per K
// tile: the same 16 registers per group as the register form (dequantKt), then one stmatrix.x4
// per k16 step and group: register 4 s + j of lane (g, t4) is row 16 u + g + 8 (j & 1), k =
// 16 s + 8 (j >> 1) + 2 t4, so matrix j of step s is rows 16 u + 8 (j & 1) + 0..7 at chunk
// 2 s + (j >> 1) (each 16-byte row one swizzled chunk: bank-conflict free). The codes' stage is
// released once both groups are in registers; the A stage is filled after its previous reader's
// wgmmas are done (aEmpty) and published with a proxy fence and an arrive per lane (aFull).
// Lane 0 of warp 0 is also the producer: K tiles 0 .. kStages - 2 up front, then K tile
// kt + kStages - 1 after A tile kt is published. That load waits for K tile kt - 1's stage, which
// the consumers release once they have A tile kt and K tile kt - 1's wgmmas are done — never
// waiting on this warp's own later work.
template <typename T>
__device__ __forceinline__ void dequantWarp(const Block& b, const Producer<SmemSsA>& pr, int dw,
                                            int lane) {
  const bool producer = dw == 0 && lane == 0;
  if (producer) {
    for (int kt = 0; kt < min(b.kt_count, kStages - 1); ++kt) pr.load(b, kt);
  }
  const int c = dw >> 1;
  const GroupLane grp[2] = {GroupLane(b.base, 2 * dw, lane), GroupLane(b.base, 2 * dw + 1, lane)};
  // This lane's stmatrix row: matrix m = lane / 8, row r = lane % 8 of group u: tile row
  // 32 (dw % 2) + 16 u + 8 (m & 1) + r, chunk (2 s + (m >> 1)) ^ r.
  const int m = lane >> 3, r = lane & 7;
  const uint32_t a_ring = b.base + SmemSsA::kA + c * kAStages * kAStageBytes;
  const uint32_t row_off = static_cast<uint32_t>(32 * (dw & 1) + 8 * (m & 1) + r) * kRowBytes;
#pragma unroll 1
  for (int kt = 0; kt < b.kt_count; ++kt) {
    const int st = kt % kStages, as = kt % kAStages;
    mbarWait(fullBar(b, st), (kt / kStages) & 1);
    uint32_t ra[2][16];
#pragma unroll
    for (int u = 0; u < 2; ++u) grp[u].dequant<T>(st, ra[u]);
    __syncwarp();
    mbarArriveIf(emptyBar(b, st), lane == 0);
    mbarWait(aEmptyBar(b, c, as), ((kt / kAStages) & 1) ^ 1);  // first round: at once
    const uint32_t abuf = a_ring + as * kAStageBytes + row_off;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t chunk = static_cast<uint32_t>(2 * s + (m >> 1)) ^ static_cast<uint32_t>(r);
        stMatrix4(abuf + u * 16u * kRowBytes + (chunk << 4), ra[u][4 * s], ra[u][4 * s + 1],
                  ra[u][4 * s + 2], ra[u][4 * s + 3]);
      }
    }
    fenceProxyAsyncShared();
    mbarArrive(aFullBar(b, c, as));
    if (producer && kt + kStages - 1 < b.kt_count) pr.load(b, kt + kStages - 1);
    __syncwarp();
  }
}

// [TAG_MOE_WGMMA_SMEM_A] Consumer c of the 3-warpgroup form: per K tile it waits for the token
// stage and its A stage, issues the four k16 steps' shared-memory wgmmas and leaves them in
// flight (wgmmaWait<1>) while it waits for the next K tile; K tile kt - 1's token stage and A
// stage are released once its wgmmas are done. Same A values and k16 order as the register form.
template <int kN, typename T>
__device__ __forceinline__ void consumeSmemA(const MoeWgmmaArgs& a, const Block& b, int c,
                                             int tid) {
  constexpr bool kHalf = std::is_same_v<T, __half>;
  const bool leader = (tid & 31) == 0;
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.f;
  const uint64_t desc_b0 =
      sm90::makeDescriptor(b.base + SmemSsA::kTok, sm90::kKMajorLbo, sm90::kSwizzleAtomBytes);
  const uint32_t a_ring = b.base + SmemSsA::kA + c * kAStages * kAStageBytes;
  const uint64_t desc_a0 = sm90::makeDescriptor(a_ring, sm90::kKMajorLbo, sm90::kSwizzleAtomBytes);
#pragma unroll 1
  for (int kt = 0; kt < b.kt_count; ++kt) {
    const int st = kt % kStages;
    const int as = kt % kAStages;
    mbarWait(fullBar(b, st), (kt / kStages) & 1);
    mbarWait(aFullBar(b, c, as), (kt / kAStages) & 1);
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
    if (kt > 0) {
      mbarArriveIf(emptyBar(b, (kt - 1) % kStages), leader);
      mbarArriveIf(aEmptyBar(b, c, (kt - 1) % kAStages), leader);
    }
  }
  wgmmaWait<0>();
  fenceRegs(acc);
  if (b.kt_count > 0) mbarArriveIf(emptyBar(b, (b.kt_count - 1) % kStages), leader);
  // The epilogue tiles lie over the token ring: both consumers' wgmmas must be done reading it.
  namedBarrierSync(kConsumersBarrier, 256);
  storeTile<kN, T>(a, b, c, tid, acc, b.base + SmemSsA::kEpi + c * kEpiBytes);
}

// Block b runs work item b = tile * ntw + nt (the weight tiles of one token tile next to each
// other). (A persistent version — one block per SM looping over items, the ring running on
// across them so the next item's loads overlap the last one's epilogue — measured 1-3 % faster
// on the H200 but made ptxas spill ~60 registers inside the main loops, which cost more: 20b 8k
// prefill 0.1271 s against 0.1213 without the loop; 2026-12-04 s10.)
// kSmemA: the dequantization warpgroup, the shared-memory-A consumers and their layout
// [TAG_MOE_WGMMA_SMEM_A].
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
      // lane 0 of each consumer warp (and of each dequantization warp)
      mbarInit(emptyBar(b, s), kSmemA ? 12 : 8);
    }
    if constexpr (kSmemA) {
      for (int c = 0; c < 2; ++c) {
        for (int s = 0; s < kAStages; ++s) {
          mbarInit(aFullBar(b, c, s), 64);  // every lane of the consumer's 2 dequantization warps
          mbarInit(aEmptyBar(b, c, s), 4);  // lane 0 of each of its warps
        }
      }
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    const Producer<L> pr(a, b, x_map, ntw);
    if constexpr (kSmemA) {
      dequantWarp<T>(b, pr, static_cast<int>(threadIdx.x) / 32, static_cast<int>(threadIdx.x) & 31);
    } else {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
      if (threadIdx.x == 0) {
        for (int kt = 0; kt < b.kt_count; ++kt) pr.load(b, kt);
      }
    }
    return;
  }
  if constexpr (!kSmemA) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
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
