#pragma once
// The index arithmetic of the Hopper attention kernel (attention_sm90.cu), kept apart from it so
// that the CPU unit tests (tests/unit/rose/attention_sm90) check the very functions the kernel
// runs: where the bulk tensor copy (TMA, 128-byte swizzle) puts each element of a tile in shared
// memory, the wgmma shared-memory descriptors that read it back, the accumulator and A-register
// fragment layouts of wgmma m64nNk16, the tensor-map shape, and which (query row, key) pairs a
// block computes and masks. Plain C++ (host and device); nothing here touches a GPU.
//
// Tiles. A K/V tile is 128 keys x 128 head-dim columns of bf16, a Q tile 128 query rows x 128.
// The copy engine's 128-byte swizzle spans 64 bf16 columns, so a tile is stored as two column
// halves ("boxes"), each [128 rows][128 bytes] = 16 KB, one TMA copy each; inside a half, row r
// is at r * 128 bytes and its 16-byte chunk c (columns 8c .. 8c+7) at chunk position c ^ (r % 8).
// The swizzle is a function of address bits (bits 4-6 ^= bits 7-9), so every half starts on a
// 1024-byte boundary.

#include <cstdint>

#if defined(__CUDACC__)
#define GARDEN_HD __host__ __device__ __forceinline__
#else
#define GARDEN_HD inline
#endif

namespace garden::rose::cuda::sm90 {

constexpr int kHeadDim = 128;
constexpr int kBlockM = 128;         // query rows per block: two consumer warpgroups x 64
constexpr int kWarpgroupRows = 64;   // wgmma M
constexpr int kBlockN = 128;         // keys per K/V tile (wgmma N of S = Q K^T)
constexpr int kHalfCols = 64;        // bf16 columns of one 128-byte swizzled row
constexpr uint32_t kRowBytes = 128;  // one swizzled row of a half
constexpr uint32_t kHalfBytes = 128 * kRowBytes;  // [128 rows][128 B] = 16 KB (one TMA box)
constexpr uint32_t kTileBytes = 2 * kHalfBytes;   // a [128][128] bf16 tile = 32 KB
constexpr uint32_t kSwizzleAtomBytes = 1024;      // 8 rows x 128 B: the swizzle repeat

// Byte offset of element (row, col) of a [128][128] bf16 tile written by two SWIZZLE_128B TMA
// boxes of {64 columns, 128 rows}, relative to the tile's 1024-aligned base.
GARDEN_HD uint32_t tileOffset(int row, int col) {
  const uint32_t half = static_cast<uint32_t>(col) / kHalfCols;
  const uint32_t c = static_cast<uint32_t>(col) % kHalfCols;
  const uint32_t chunk = (c / 8) ^ (static_cast<uint32_t>(row) & 7u);
  return half * kHalfBytes + static_cast<uint32_t>(row) * kRowBytes + chunk * 16 + (c % 8) * 2;
}

// The 128-byte swizzle as the hardware applies it to a linear shared-memory byte address: the
// 16-byte chunk index (bits 4-6) XOR the row within the 1024-byte atom (bits 7-9).
GARDEN_HD uint32_t swizzle128(uint32_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }

// wgmma shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address,
// leading- and stride-dimension byte offsets (each >> 4, 14 bits), base offset 0 (every operand
// starts on a 1024-byte swizzle atom, or 32/64/96 bytes into one for the K-major k-steps, which
// the hardware resolves through the address bits as above), layout type 1 = 128-byte swizzle.
GARDEN_HD uint64_t makeDescriptor(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32) | (uint64_t{1} << 62);
}

// Operands. K-major (Q as A, K as B of S = Q K^T): rows of the operand (M or N index) are tile
// rows, K runs along a row; 8-row groups are kSwizzleAtomBytes apart (SBO), LBO is unused by
// swizzled K-major layouts (1 by convention). k-step kk (16 columns) of head_dim starts in half
// kk / 4 at byte 32 * (kk % 4) of the row.
constexpr uint32_t kKMajorLbo = 16;
constexpr uint32_t kKMajorSbo = kSwizzleAtomBytes;
GARDEN_HD uint32_t kMajorStepOffset(int kk) {
  return static_cast<uint32_t>(kk / 4) * kHalfBytes + static_cast<uint32_t>(kk % 4) * 32;
}
// MN-major (V as B of O = P V, "transposed" B): K (keys) runs down the tile rows, N (head_dim)
// along them; N atoms of 64 columns are the two halves (LBO = kHalfBytes apart), 8-key groups
// kSwizzleAtomBytes apart (SBO). k-step kk (16 keys) starts at row 16 kk.
constexpr uint32_t kMnMajorLbo = kHalfBytes;
constexpr uint32_t kMnMajorSbo = kSwizzleAtomBytes;
GARDEN_HD uint32_t mnMajorStepOffset(int kk) { return static_cast<uint32_t>(kk) * 16 * kRowBytes; }

// wgmma m64nNk16 f32 accumulator fragments: thread `tid` (0..127 in its warpgroup) holds N / 2
// floats; element e is at (accRow, accCol) of the warpgroup's 64 x N tile.
GARDEN_HD int accRow(int tid, int e) {
  return (tid / 32) * 16 + (tid % 32) / 4 + ((e / 2) % 2) * 8;
}
GARDEN_HD int accCol(int tid, int e) { return (e / 4) * 8 + (tid % 4) * 2 + (e % 2); }
// wgmma A from registers (m64k16 bf16): 4 registers of 2 bf16 each; register r, half h (low 0,
// high 1) is element (aRow, aCol) of the 64 x 16 A tile.
GARDEN_HD int aRow(int tid, int r) { return (tid / 32) * 16 + (tid % 32) / 4 + (r % 2) * 8; }
GARDEN_HD int aCol(int tid, int r, int h) { return (r / 2) * 8 + (tid % 4) * 2 + h; }
// P (the S accumulator after softmax) as the A operand of O += P V: k-step kk (keys 16 kk ..
// 16 kk + 15), register r = (S element 8 kk + 2 r, S element 8 kk + 2 r + 1) packed (low, high).
GARDEN_HD int pSourceElement(int kk, int r) { return 8 * kk + 2 * r; }

// The packed qkv tensor as the copy engine sees it: 2-D, [num_tokens rows][(Hq + 2 Hkv) * 128
// columns] of bf16, one box = {64 columns, 128 rows} (128 bytes wide: the swizzle span).
struct QkvTensorMapShape {
  uint64_t dims[2];  // {columns, rows}, innermost first
  uint64_t row_stride_bytes;
  uint32_t box[2];  // {64, 128}
};
GARDEN_HD QkvTensorMapShape qkvTensorMapShape(int64_t num_tokens, int num_q_heads,
                                              int num_kv_heads) {
  QkvTensorMapShape s{};
  s.dims[0] = static_cast<uint64_t>(num_q_heads + 2 * num_kv_heads) * kHeadDim;
  s.dims[1] = static_cast<uint64_t>(num_tokens);
  s.row_stride_bytes = s.dims[0] * 2;
  s.box[0] = kHalfCols;
  s.box[1] = kBlockN;
  return s;
}
// First column (element) of column half `half` of q head qh, of kv head kvh's K and of its V.
GARDEN_HD int qColumn(int qh, int half) { return qh * kHeadDim + half * kHalfCols; }
GARDEN_HD int kColumn(int num_q_heads, int kvh, int half) {
  return (num_q_heads + kvh) * kHeadDim + half * kHalfCols;
}
GARDEN_HD int vColumn(int num_q_heads, int num_kv_heads, int kvh, int half) {
  return (num_q_heads + num_kv_heads + kvh) * kHeadDim + half * kHalfCols;
}

// Work of one block: query rows q0 .. q0 + 127 of a sequence of `len` tokens. It computes key
// tiles 0 .. kvTiles - 1 in reverse order (the last one first: the only tile that can need a
// mask, so the mask is applied in the first step only). Keys >= len and, causal, keys > row are
// masked; every row of the block, valid or not, keeps at least one unmasked key in that first
// tile (key q0 for causal, key (kvTiles - 1) * 128 otherwise), so the running max is finite
// from the first step on.
GARDEN_HD int kvTiles(int len, int q0, bool causal) {
  const int kv_len = causal ? (len < q0 + kBlockM ? len : q0 + kBlockM) : len;
  return (kv_len + kBlockN - 1) / kBlockN;
}
GARDEN_HD bool keyVisible(int key, int row, int len, bool causal) {
  return key < len && (!causal || key <= row);
}
// Causal blocks of a sequence run longest-first: block-order tile i of a sequence with `len`
// tokens is query tile (tiles - 1 - i).
GARDEN_HD int queryTileStart(int len, int i, bool causal) {
  const int tiles = (len + kBlockM - 1) / kBlockM;
  return (causal ? tiles - 1 - i : i) * kBlockM;
}
// Block b of the launch -> (q head, sequence-order tile index): q heads vary fastest, so the
// blocks running together share a query tile (and the two q heads of a GQA pair their K/V).
GARDEN_HD int blockHead(int64_t b, int num_q_heads) { return static_cast<int>(b % num_q_heads); }
GARDEN_HD int64_t blockTile(int64_t b, int num_q_heads) { return b / num_q_heads; }
// Upper bound on the query tiles of a batch (the grid depends on sizes only, so that one launch
// shape serves every batch of a CUDA-graph bucket); surplus blocks find no tile and exit.
GARDEN_HD int64_t maxQueryTiles(int64_t num_tokens, int num_seqs) {
  return (num_tokens + kBlockM - 1) / kBlockM + num_seqs;
}

// Shared memory of one block, byte offsets from a 1024-aligned base.
template <int kStages>
struct SmemLayout {
  static constexpr uint32_t kQ = 0;                                 // [128][128] bf16
  static constexpr uint32_t kK = kQ + kTileBytes;                   // [kStages] tiles
  static constexpr uint32_t kV = kK + kStages * kTileBytes;         // [kStages] tiles
  static constexpr uint32_t kBarriers = kV + kStages * kTileBytes;  // mbarriers, 8 B each
  // q_full, then k_full, v_full, k_empty, v_empty [kStages] each
  static constexpr uint32_t kBytes = kBarriers + 8 * (1 + 4 * kStages);
  static constexpr uint32_t kDynamicBytes = kBytes + kSwizzleAtomBytes;  // + alignment slack
};

}  // namespace garden::rose::cuda::sm90

#if defined(__CUDACC__)
namespace garden::rose::cuda {

// Device side, shared by every attention kernel (attention.cu, attention_sm90.cu).
// Finds the (sequence, first query row) of query tile `tile` when every sequence is cut into
// ceil(len / kM) tiles, in order. Warp-cooperative scan over cu_seqlens (32 sequences a step).
__device__ __forceinline__ bool findAttentionTile(const int32_t* cu, int num_seqs, int tile, int kM,
                                                  int& seq, int& q0) {
  const int lane = threadIdx.x & 31;
  int base = 0;
  for (int s0 = 0; s0 < num_seqs; s0 += 32) {
    const int s = s0 + lane;
    int n = 0;
    if (s < num_seqs) n = (cu[s + 1] - cu[s] + kM - 1) / kM;
    int inc = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    const int total = __shfl_sync(0xffffffffu, inc, 31);
    if (tile < base + total) {
      const unsigned hit = __ballot_sync(0xffffffffu, base + inc > tile);
      const int l = __ffs(hit) - 1;
      const int excl = __shfl_sync(0xffffffffu, inc - n, l);
      seq = s0 + l;
      q0 = (tile - base - excl) * kM;
      return true;
    }
    base += total;
  }
  return false;
}

}  // namespace garden::rose::cuda
#endif  // __CUDACC__
