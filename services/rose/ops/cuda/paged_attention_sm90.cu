// The Hopper paged prefill attention (paged_attention_sm90.cuh): warp-specialized, bulk tensor
// copies (TMA) from the paged KV cache into a shared-memory ring guarded by mbarriers, wgmma for
// both products. The structure is attention_sm90.cu's (the embedding path's head_dim-128 kernel);
// what differs is where keys come from and which ones a row sees.
//
// One block = 1 + kC warpgroups on 64 kC query rows of one (work item, q head): rows tok0 ..
// tok0 + 64 kC - 1 of one sequence's chunk, at positions P .. (the chunk's positions are
// contiguous: the planner sends no other sequence here). kC = 3 (192 rows) by default: with two
// consumers one's softmax did not hide behind the other's matrix products (head_dim 64 makes the
// exponentials as costly as the wgmmas: 410 TFLOP/s), with three 490-500 TFLOP/s (H200,
// 2026-12-04, rose_llm_bench --attn-bench); the 3-consumer kernel has 128 registers per thread.
//   warpgroup 0, the producer (its first warp): Q once (one {64, 64 kC} box of the packed qkv
//     tensor); then per 128-key tile the K and V pages — one {64, 1, rows} box of the cache's
//     3-D tensor map [slots][Hkv][64] per page (128 / block_size pages), lane j copying page j,
//     its slot read from the block table one tile ahead; pages wholly outside the item's key
//     range get a coordinate past the tensor (the copy engine writes zeros for them). (The first
//     version issued every copy from one thread, reading the table entries one after another:
//     ~6,000 cycles per tile, slower than the mma.sync kernel; H200, 2026-12-04.)
//   warpgroups 1 .. kC, the consumers: 64 query rows each. Per key tile:
//     S (64 x 128 f32) = Q K^T      (4 wgmma m64n128k16, Q and K from shared memory, K-major);
//     online softmax on S in registers (f32, exp2, running max and sum per row);
//     O (64 x 64 f32) += P V        (8 wgmma m64n64k16, P from registers, V MN-major).
//   kPipelined: each step issues S of tile i with P V of tile i - 1 and runs tile i's softmax
//   while P V does; the consumers take turns issuing (named barriers, round robin), as in
//   attention_sm90.cu. Otherwise the same steps one after the other.
// Key tiles run from the last to the first. Row r (position p = P + r) sees keys
// [max(key_begin, p - window + 1), min(p, last)], last = the chunk's last position; a tile is
// masked (select to -inf, not arithmetic) only where some row of the block can miss one of its
// keys: at the top (the diagonal) and, with a window, at the bottom. The first tile processed
// may hold cache slots past `last` that nothing has written: its V rows from there on are zeroed
// in shared memory before use (P is 0 there, but 0 * a non-finite value is not).
// The sink joins each row's softmax denominator only: out = O / (l + exp(sink - max)).

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>

#include "services/rose/ops/paged_attention_fit.h"
#include "services/rose/ops/cuda/attention_sm90.cuh"
#include "services/rose/ops/cuda/attention_sm90_layout.h"
#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/paged_attention_sm90.cuh"
#include "services/rose/ops/cuda/sm90_ptx.cuh"
#include "services/rose/ops/cuda/sm90_softmax.cuh"

namespace garden::rose::cuda {
namespace {

using namespace ptx90;  // NOLINT(build/namespaces): the PTX wrappers
using sm90::accCol;
using sm90::accRow;
using sm90::kBlockN;     // keys per tile (128)
using sm90::kRowBytes;   // one row of 64 bf16: the 128-byte swizzle span
constexpr int kWgRows = sm90::kWarpgroupRows;  // rows per consumer warpgroup (wgmma M)
using sm90::makeDescriptor;

constexpr int kD = 64;                                 // head_dim
constexpr uint32_t kTileBytes = sm90::kHalfBytes;      // [128][64] bf16: one column half, 16 KB
constexpr uint32_t kAtomBytes = sm90::kSwizzleAtomBytes;  // 8 rows: the swizzle repeat
// kC consumer warpgroups of 64 query rows each (2 or 3), one producer warpgroup.
template <int kC>
struct Shape {
  static constexpr int kThreads = (kC + 1) * 128;
  static constexpr int kBlockM = kC * kWgRows;  // query rows per block
  // setmaxnreg: 128 x producer + 128 kC x consumer <= 64 K registers (the producer reads the
  // block table and computes page coordinates).
  static constexpr int kProducerRegs = kC == 2 ? 40 : 32;
  static constexpr int kConsumerRegs = kC == 2 ? 232 : 160;
  static_assert(128 * kProducerRegs + 128 * kC * kConsumerRegs <= 65536, "register file");
};
constexpr int kSchedBarrier = 1;  // named barriers 1 .. kC: the consumers' turns (0: syncthreads)
constexpr int kVZeroBarrier = 4;  // every consumer, after zeroing V rows past the last key
constexpr float kLog2e = 1.4426950408889634f;

// Shared memory, byte offsets from a 1024-aligned base: Q, K[kStages], V[kStages], mbarriers.
template <int kStages, int kC>
struct Smem {
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kK = kC * kWgRows * kRowBytes;  // Q: kC x 64 rows
  static constexpr uint32_t kV = kK + kStages * kTileBytes;
  static constexpr uint32_t kBars = kV + kStages * kTileBytes;
  static constexpr uint32_t kBytes = kBars + 8 * (1 + 4 * kStages) + kAtomBytes;  // + align slack
};

// Descriptor strides (attention_sm90_layout.h): 8-row groups 1024 B apart; K-major LBO unused;
// MN-major (V) has one 64-column atom here, so its LBO (the next atom) is never used either.
using sm90::kKMajorLbo;
using sm90::kMnMajorLbo;
constexpr uint32_t kSbo = kAtomBytes;

// Set by a wait that gave up (pagedAttnSm90WatchdogFired()).
__device__ unsigned int g_paged_watchdog = 0;
__device__ __forceinline__ void mbarWait(uint32_t bar, uint32_t parity) {
  mbarWaitOrGiveUp(bar, parity, &g_paged_watchdog);
}

// S = Q K^T over head_dim (4 k-steps); the first overwrites S. T: the element type of Q, K, V
// and P (bf16, or fp16 [TAG_ATTN_F16]).
template <typename T>
__device__ __forceinline__ void gemmQK(float (&s)[64], uint64_t q_desc, uint64_t k_desc) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint64_t step = sm90::kMajorStepOffset(kk) >> 4;  // half 0: head_dim 64 is one half
    wgmmaSS<std::is_same_v<T, f16>>(s, q_desc + step, k_desc + step, kk > 0 ? 1 : 0);
  }
}

// O += P V over the tile's 128 keys (8 k-steps of 16 keys).
template <typename T>
__device__ __forceinline__ void gemmPV(float (&o)[32], const uint32_t (&p)[32], uint64_t v_desc) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    wgmmaRS64<std::is_same_v<T, f16>>(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
              v_desc + (sm90::mnMajorStepOffset(kk) >> 4));
  }
}

// Which keys this thread's two rows see: row r (0, 1) is at position pos + 8 r and sees keys
// [max(0, p - window + 1), min(p, last)] (window 0: no lower bound). Kept as three values, not
// the four bounds: the 3-consumer pipelined kernel has registers for no more.
struct RowKeys {
  int pos;
  int last;
  int window;
};

// Online softmax on this thread's S elements of the tile starting at key0 (two rows, 32 keys
// each). kMask: keys a row does not see become -inf first. Updates the running max m (raw
// scores) and this thread's part of the running sum l, turns S into P = exp2(S * scale_log2 -
// m * scale_log2) and sets alpha, the factor for O.
template <bool kMask>
__device__ __forceinline__ void softmaxStep(float (&s)[64], float (&m)[2], float (&l)[2],
                                            float (&alpha)[2], float scale_log2, int key0,
                                            const RowKeys& rk, int tid) {
  if (kMask) {
    int hi[2], lo[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int p = rk.pos + 8 * r;
      hi[r] = min(p, rk.last) - key0;
      lo[r] = rk.window > 0 ? p - rk.window + 1 - key0 : INT_MIN;
    }
#pragma unroll
    for (int e = 0; e < 64; ++e) {
      const int r = (e / 2) % 2;
      const int col = accCol(tid, e);
      if (col > hi[r] || col < lo[r]) s[e] = -INFINITY;
    }
  }
  onlineSoftmax(s, m, l, alpha, scale_log2);
}

// The consumers' turns at issuing wgmmas (pipelined): consumer w waits on barrier
// kSchedBarrier + w, then, after issuing, lets the next one (w + 1 mod kC) go. The last consumer
// opens consumer 0's first turn and skips its own last hand-over, so every barrier phase has 256
// arrivals (128 waiting, 128 arriving).
template <int kC>
__device__ __forceinline__ void turnBegin(int w) { namedBarrierSync(kSchedBarrier + w, 256); }
template <int kC>
__device__ __forceinline__ void turnEnd(int w) {
  namedBarrierArrive(kSchedBarrier + (w + 1) % kC, 256);
}

// Whether some row of a block whose row 0 is at position p0 can miss a key of the tile at key0:
// the top (keys past a row's position or past the chunk) or, with a window, the bottom.
template <int kBlockM>
__device__ __forceinline__ bool tileNeedsMask(int key0, int p0, int window) {
  return key0 + kBlockN - 1 > p0 || (window > 0 && key0 < p0 + kBlockM - window);
}

struct Pipe {
  uint32_t bar_k_full, bar_v_full, bar_k_empty, bar_v_empty;
  uint64_t q_desc, k_desc0, v_desc0;
};
constexpr uint64_t kStageStep = kTileBytes >> 4;  // descriptor start address per stage

// Pipelined step it >= 1: S of tile it with P V of tile it - 1, then tile it's softmax.
template <int kStages, int kC, bool kMask, typename T>
__device__ __forceinline__ void pipelinedStep(const Pipe& pp, int it, int w, bool warp_leader,
                                              float (&s)[64], float (&o)[32], uint32_t (&p)[32],
                                              float (&m)[2], float (&l)[2], float (&alpha)[2],
                                              float scale_log2, int key0, const RowKeys& rk,
                                              int tid) {
  const int st = it % kStages;
  const uint32_t ph = (it / kStages) & 1;
  const int sp = (it - 1) % kStages;
  const uint32_t php = ((it - 1) / kStages) & 1;
  mbarWait(pp.bar_k_full + 8 * st, ph);
  mbarWait(pp.bar_v_full + 8 * sp, php);
  turnBegin<kC>(w);
  wgmmaFence();
  gemmQK<T>(s, pp.q_desc, pp.k_desc0 + st * kStageStep);
  wgmmaCommit();
  gemmPV<T>(o, p, pp.v_desc0 + sp * kStageStep);
  wgmmaCommit();
  turnEnd<kC>(w);
  wgmmaWait<1>();  // S done
  fenceRegs(s);
  mbarArriveIf(pp.bar_k_empty + 8 * st, warp_leader);
  softmaxStep<kMask>(s, m, l, alpha, scale_log2, key0, rk, tid);
  wgmmaWait<0>();  // P V done
  fenceRegs(o);
  fenceRegs(p);
  mbarArriveIf(pp.bar_v_empty + 8 * sp, warp_leader);
  toP<T>(s, p);
  rescaleO(o, alpha);
}

// Basic step: S, softmax, P V of tile it, one after the other.
template <int kStages, bool kMask, typename T>
__device__ __forceinline__ void basicStep(const Pipe& pp, int it, bool warp_leader,
                                          float (&s)[64], float (&o)[32], uint32_t (&p)[32],
                                          float (&m)[2], float (&l)[2], float (&alpha)[2],
                                          float scale_log2, int key0, const RowKeys& rk, int tid) {
  const int st = it % kStages;
  const uint32_t ph = (it / kStages) & 1;
  mbarWait(pp.bar_k_full + 8 * st, ph);
  wgmmaFence();
  gemmQK<T>(s, pp.q_desc, pp.k_desc0 + st * kStageStep);
  wgmmaCommit();
  wgmmaWait<0>();
  fenceRegs(s);
  mbarArriveIf(pp.bar_k_empty + 8 * st, warp_leader);
  softmaxStep<kMask>(s, m, l, alpha, scale_log2, key0, rk, tid);
  toP<T>(s, p);
  rescaleO(o, alpha);
  mbarWait(pp.bar_v_full + 8 * st, ph);
  wgmmaFence();
  gemmPV<T>(o, p, pp.v_desc0 + st * kStageStep);
  wgmmaCommit();
  wgmmaWait<0>();
  fenceRegs(o);
  fenceRegs(p);
  mbarArriveIf(pp.bar_v_empty + 8 * st, warp_leader);
}

template <bool kPipelined, int kStages, int kC, typename T>
__global__ void __launch_bounds__(Shape<kC>::kThreads, 1)
    pagedAttnSm90Kernel(const __grid_constant__ CUtensorMap q_map,
                        const __grid_constant__ CUtensorMap k_map,
                        const __grid_constant__ CUtensorMap v_map, PagedAttentionArgs a) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smemAddr(smem_raw) + kAtomBytes - 1) & ~(kAtomBytes - 1);
  using L = Smem<kStages, kC>;
  using S = Shape<kC>;
  constexpr int kBlockM = S::kBlockM;
  const uint32_t s_q = base + L::kQ;
  const uint32_t s_k = base + L::kK;
  const uint32_t s_v = base + L::kV;
  const uint32_t bar_q = base + L::kBars;
  Pipe pp;
  pp.bar_k_full = bar_q + 8;
  pp.bar_v_full = pp.bar_k_full + 8 * kStages;
  pp.bar_k_empty = pp.bar_v_full + 8 * kStages;
  pp.bar_v_empty = pp.bar_k_empty + 8 * kStages;

  const int qh = static_cast<int>(blockIdx.x % static_cast<unsigned>(a.num_q_heads));
  const PagedAttnWork wk = a.sm90_work[blockIdx.x / static_cast<unsigned>(a.num_q_heads)];
  const int kvh = qh / (a.num_q_heads / a.num_kv_heads);
  const int start = a.cu_q[wk.seq];
  const int len = a.cu_q[wk.seq + 1] - start;
  const int pos_first = a.positions[start];
  const int p0 = pos_first + wk.tok0;  // position of the block's row 0
  const int last = pos_first + len - 1;
  const int kt_first = wk.key_begin / kBlockN;
  const int kt_last = (wk.key_end - 1) / kBlockN;
  const int n_tiles = kt_last - kt_first + 1;
  const int wg = static_cast<int>(threadIdx.x) / 128;

  if (threadIdx.x == 0) {
    mbarInit(bar_q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarInit(pp.bar_k_full + 8 * s, 1);
      mbarInit(pp.bar_v_full + 8 * s, 1);
      mbarInit(pp.bar_k_empty + 8 * s, 4 * kC);  // lane 0 of each consumer warp
      mbarInit(pp.bar_v_empty + 8 * s, 4 * kC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // Producer: warp 0. Lane j copies page j of each tile (pages <= 16); each lane reads its
    // page's block-table entry one tile ahead, so no copy waits on a table read.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(S::kProducerRegs));
    if (threadIdx.x < 32) {
      const int lane = static_cast<int>(threadIdx.x);
      if (lane == 0) {
        mbarArriveExpectTx(bar_q, kBlockM * kRowBytes);
        tmaLoad2d(s_q, &q_map, qh * kD, start + wk.tok0, bar_q);
      }
      const int32_t* table = a.block_tables + static_cast<int64_t>(wk.seq) * a.max_blocks;
      const int bs = a.block_size;
      const int rows = bs < kBlockN ? bs : kBlockN;  // rows per page copy
      const int pages = kBlockN / rows;
      const int oob = a.num_blocks * bs;  // a slot past the tensor: the copy writes zeros
      const bool copies = lane < pages;
      // Slot of this lane's page in tile `it` (oob: outside the item's keys, or no such page).
      auto slotOf = [&](int it) {
        const int key = (kt_last - it) * kBlockN + lane * rows;
        const bool used = copies && it < n_tiles && key + rows > wk.key_begin && key < wk.key_end;
        return used ? table[key / bs] * bs + key % bs : oob;
      };
      int slot = slotOf(0);
      const uint32_t dst_row = static_cast<uint32_t>(lane * rows) * kRowBytes;
      for (int it = 0; it < n_tiles; ++it) {
        const int next = slotOf(it + 1);  // used next iteration: its latency overlaps this one
        const int st = it % kStages;
        const uint32_t free_parity = ((it / kStages) & 1) ^ 1;  // first round: at once
        mbarWait(pp.bar_k_empty + 8 * st, free_parity);
        if (lane == 0) mbarArriveExpectTx(pp.bar_k_full + 8 * st, kTileBytes);
        __syncwarp();
        if (copies) {
          tmaLoad3d(s_k + st * kTileBytes + dst_row, &k_map, 0, kvh, slot, pp.bar_k_full + 8 * st);
        }
        mbarWait(pp.bar_v_empty + 8 * st, free_parity);
        if (lane == 0) mbarArriveExpectTx(pp.bar_v_full + 8 * st, kTileBytes);
        __syncwarp();
        if (copies) {
          tmaLoad3d(s_v + st * kTileBytes + dst_row, &v_map, 0, kvh, slot, pp.bar_v_full + 8 * st);
        }
        slot = next;
      }
    }
    return;
  }

  // Consumers.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(S::kConsumerRegs));
  const int w = wg - 1;
  const int tid = static_cast<int>(threadIdx.x) % 128;
  const bool warp_leader = (threadIdx.x % 32) == 0;
  const int row0 = w * kWgRows;  // this warpgroup's first row in the block
  const float scale_log2 = a.scale * kLog2e;
  const int win = a.sliding_window;
  const RowKeys rk{p0 + row0 + accRow(tid, 0), last, win};
  pp.q_desc = makeDescriptor(s_q + w * kWgRows * kRowBytes, kKMajorLbo, kSbo);
  pp.k_desc0 = makeDescriptor(s_k, kKMajorLbo, kSbo);
  pp.v_desc0 = makeDescriptor(s_v, kMnMajorLbo, kSbo);

  // The first tile processed (stage 0) may hold slots past the last key: zero those V rows.
  const int first_key0 = kt_last * kBlockN;
  const int good = wk.key_end - first_key0;  // rows [0, good) are keys some row may see
  if (good < kBlockN) {  // block-uniform
    mbarWait(pp.bar_v_full, 0);
    constexpr int kChunks = kD / 8;  // 16-byte chunks per row
    for (int i = static_cast<int>(threadIdx.x) - 128; i < (kBlockN - good) * kChunks;
         i += 128 * kC) {
      // A [128][64] tile is the first column half of the layout header's [128][128] one.
      const uint32_t dst = s_v + sm90::tileOffset(good + i / kChunks, (i % kChunks) * 8);
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0) : "memory");
    }
    fenceProxyAsyncShared();  // visible to wgmma
    namedBarrierSync(kVZeroBarrier, 128 * kC);
  }

  float o[32], s[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
  uint32_t p[32];
#pragma unroll
  for (int i = 0; i < 64; ++i) s[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.f;
  mbarWait(bar_q, 0);

  if constexpr (kPipelined) {
    if (w == kC - 1) namedBarrierArrive(kSchedBarrier, 256);  // consumer 0 takes the first turn
    // Step 0: S of the first tile processed, its softmax.
    mbarWait(pp.bar_k_full, 0);
    turnBegin<kC>(w);
    wgmmaFence();
    gemmQK<T>(s, pp.q_desc, pp.k_desc0);
    wgmmaCommit();
    turnEnd<kC>(w);
    wgmmaWait<0>();
    fenceRegs(s);
    mbarArriveIf(pp.bar_k_empty, warp_leader);
    if (tileNeedsMask<kBlockM>(first_key0, p0, win)) {
      softmaxStep<true>(s, m, l, alpha, scale_log2, first_key0, rk, tid);
    } else {
      softmaxStep<false>(s, m, l, alpha, scale_log2, first_key0, rk, tid);
    }
    toP<T>(s, p);
#pragma unroll 1
    for (int it = 1; it < n_tiles; ++it) {
      const int key0 = (kt_last - it) * kBlockN;
      if (tileNeedsMask<kBlockM>(key0, p0, win)) {
        pipelinedStep<kStages, kC, true, T>(pp, it, w, warp_leader, s, o, p, m, l, alpha, scale_log2, key0, rk,
                            tid);
      } else {
        pipelinedStep<kStages, kC, false, T>(pp, it, w, warp_leader, s, o, p, m, l, alpha, scale_log2, key0, rk,
                             tid);
      }
    }
    // Last: P V of the last tile processed.
    const int sl = (n_tiles - 1) % kStages;
    mbarWait(pp.bar_v_full + 8 * sl, ((n_tiles - 1) / kStages) & 1);
    turnBegin<kC>(w);
    wgmmaFence();
    gemmPV<T>(o, p, pp.v_desc0 + sl * kStageStep);
    wgmmaCommit();
    if (w != kC - 1) turnEnd<kC>(w);
    wgmmaWait<0>();
    fenceRegs(o);
    mbarArriveIf(pp.bar_v_empty + 8 * sl, warp_leader);
  } else {
#pragma unroll 1
    for (int it = 0; it < n_tiles; ++it) {
      const int key0 = (kt_last - it) * kBlockN;
      if (tileNeedsMask<kBlockM>(key0, p0, win)) {
        basicStep<kStages, true, T>(pp, it, warp_leader, s, o, p, m, l, alpha, scale_log2, key0, rk, tid);
      } else {
        basicStep<kStages, false, T>(pp, it, warp_leader, s, o, p, m, l, alpha, scale_log2, key0, rk, tid);
      }
    }
  }

  // Epilogue: O / (l + sink), rows of the chunk only.
  float inv[2];
  const float sink = a.sinks != nullptr ? a.sinks[qh] * kLog2e : 0.f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const float ms = m[r] == -INFINITY ? 0.f : m[r] * scale_log2;
    const float den = l[r] + (a.sinks != nullptr ? exp2f(sink - ms) : 0.f);
    inv[r] = den > 0.f ? 1.f / den : 0.f;
  }
  const int64_t out_stride = static_cast<int64_t>(a.num_q_heads) * kD;
  T* o_base = reinterpret_cast<T*>(a.out) + static_cast<int64_t>(start) * out_stride + qh * kD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wk.tok0 + row0 + accRow(tid, 2 * r);
    if (row < len) {
      uint32_t* dst = reinterpret_cast<uint32_t*>(o_base + static_cast<int64_t>(row) * out_stride +
                                                  accCol(tid, 0));
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        dst[4 * i] = pack16x2<T>(o[4 * i + 2 * r] * inv[r], o[4 * i + 2 * r + 1] * inv[r]);
      }
    }
  }
}

template <bool kPipelined, int kStages, int kC, typename T>
Status launchKernel(const PagedAttentionArgs& a, cudaStream_t stream) {
  using S = Shape<kC>;
  using L = Smem<kStages, kC>;
  CUtensorMap q_map, k_map, v_map;
  const uint64_t width = static_cast<uint64_t>(a.num_q_heads + 2 * a.num_kv_heads) * kD;
  {
    const cuuint64_t dims[2] = {width, static_cast<cuuint64_t>(a.num_tokens)};
    const cuuint64_t strides[1] = {width * 2};
    const cuuint32_t box[2] = {kD, S::kBlockM};
    RETURN_IF_ERROR(encode16TensorMap(&q_map, a.qkv, 2, dims, strides, box, "paged attention sm90: q",
                                      a.f16));
  }
  {
    // The cache [blocks][block_size][Hkv][64] as [slots][Hkv][64]; one box = one page's rows of
    // one kv head.
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kD),
                                static_cast<cuuint64_t>(a.num_kv_heads),
                                static_cast<cuuint64_t>(a.num_blocks) * a.block_size};
    const cuuint64_t strides[2] = {kD * 2, static_cast<cuuint64_t>(a.num_kv_heads) * kD * 2};
    const cuuint32_t box[3] = {kD, 1, static_cast<cuuint32_t>(std::min(a.block_size, kBlockN))};
    RETURN_IF_ERROR(
        encode16TensorMap(&k_map, a.k_cache, 3, dims, strides, box, "paged attention sm90: k", a.f16));
    RETURN_IF_ERROR(
        encode16TensorMap(&v_map, a.v_cache, 3, dims, strides, box, "paged attention sm90: v", a.f16));
  }
  static std::once_flag once;  // [TAG_ATTN_SMEM] one attribute call per instance
  static cudaError_t configured = cudaSuccess;
  std::call_once(once, [] {
    configured = cudaFuncSetAttribute(pagedAttnSm90Kernel<kPipelined, kStages, kC, T>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(L::kBytes));
  });
  CUDA_RETURN_IF_ERROR(configured);
  const int64_t blocks = static_cast<int64_t>(a.num_sm90_work) * a.num_q_heads;
  pagedAttnSm90Kernel<kPipelined, kStages, kC, T><<<dim3(static_cast<unsigned>(blocks)),
                                                 dim3(S::kThreads), L::kBytes, stream>>>(
      q_map, k_map, v_map, a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

int32_t g_min_tokens = kPagedAttnSm90DefaultMinTokens;
bool g_pipelined = true;
int32_t g_stages = 2;
bool g_windows = false;
int32_t g_consumers = 3;

}  // namespace

void setPagedAttnSm90(int32_t min_tokens, bool pipelined, int32_t stages, bool windows,
                      int32_t consumers) {
  g_min_tokens = min_tokens;
  g_pipelined = pipelined;
  g_stages = stages == 4 ? 4 : 2;
  g_windows = windows;
  g_consumers = consumers == 3 ? 3 : 2;
}
int32_t pagedAttnSm90Rows() { return g_consumers * kWgRows; }
int32_t pagedAttnSm90MinTokens(int32_t sliding_window) {
  return sliding_window > 0 && !g_windows ? 0 : g_min_tokens;
}

bool pagedAttnSm90Supports(int32_t block_size, int32_t head_dim) {
  static_assert(kBlockN == 128, "pagedAttentionSm90FitsBlockSize's tile");
  return head_dim == kD && rose::pagedAttentionSm90FitsBlockSize(block_size) &&
         deviceCapability() == 90 && tensorMapEncoder() != nullptr;
}

Status launchPagedAttentionSm90(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.num_sm90_work <= 0) return okStatus();
  if (!pagedAttnSm90Supports(a.block_size, a.head_dim)) {
    return failedPrecondition(
        "paged attention sm90: needs head_dim 64, a KV block size that divides 128 or is a "
        "multiple of it (>= 8), a compute capability 9.0 GPU and cuTensorMapEncodeTiled "
        "(rose --attn-prefill mma runs prefill on the mma.sync kernel)");
  }
  if (a.num_tokens <= 0 || a.sm90_work == nullptr) {
    return invalidArgument("paged attention sm90: num_tokens and the work list are required");
  }
  if (static_cast<int64_t>(a.num_blocks) * a.block_size > INT32_MAX) {
    return invalidArgument("paged attention sm90: more than 2^31 cache slots");
  }
  if (static_cast<int64_t>(a.num_sm90_work) * a.num_q_heads > INT32_MAX) {
    return invalidArgument("paged attention sm90: too many work items x heads");
  }
  if (a.f16) {  // [TAG_ATTN_F16]: the default shape only
    return launchKernel<true, 2, 3, f16>(a, stream);
  }
  if (g_consumers == 3) {  // the default [TAG_PAGED_ATTN_SM90]; the ring depth stays 2
    return g_pipelined ? launchKernel<true, 2, 3, bf16>(a, stream)
                       : launchKernel<false, 2, 3, bf16>(a, stream);
  }
  if (g_stages == 4) {
    return g_pipelined ? launchKernel<true, 4, 2, bf16>(a, stream)
                       : launchKernel<false, 4, 2, bf16>(a, stream);
  }
  return g_pipelined ? launchKernel<true, 2, 2, bf16>(a, stream)
                     : launchKernel<false, 2, 2, bf16>(a, stream);
}

Result<bool> pagedAttnSm90WatchdogFired() {
  unsigned int fired = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpyFromSymbol(&fired, g_paged_watchdog, sizeof(fired)));
  const unsigned int zero = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpyToSymbol(g_paged_watchdog, &zero, sizeof(zero)));
  return fired != 0;
}

}  // namespace garden::rose::cuda
