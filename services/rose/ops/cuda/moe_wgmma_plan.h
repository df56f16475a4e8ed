#pragma once
// How the wgmma MXFP4 expert GEMM (moe_wgmma.cuh) [TAG_MOE_WGMMA] cuts a step's expert-sorted rows
// into token tiles, as a plain function (no CUDA) so a CPU test checks it.
//
// Each expert's rows [off[e], off[e + 1]) are cut, in order, into tiles of 256 rows while at
// least 256 are left, then one tile of the rest. A tile's n (the wgmma N of the kernel instance it
// runs, a multiple of 16 up to 256) is its row count rounded up to 16 — the align pads every
// expert to 16 rows, so no tile computes rows that are not the expert's. Tiles never span two
// experts, and every row of every expert is in exactly one tile; experts without rows get none.
// (Measured on the H200, 2026-12-04 s10, against sharing an expert's rows evenly — R = 1,040 as
// 5 x 208 instead of 4 x 256 + 16: the even split was slower, 20b 8k prefill 0.1250 vs
// 0.1213 s, 120b 0.2266 vs 0.2220: full 256-row tiles make fewer passes over the weights, and a
// small remainder tile is cheap. Tiles of 64 / 128 / 256 only: 0.1216 / 0.2182 s.)

#include <cstdint>

namespace garden::rose::cuda {

struct MoeWgmmaTile {
  int32_t expert = 0;
  int32_t row0 = 0;  // first row (in the expert-sorted matrix)
  int32_t rows = 0;  // real rows: 1 .. n
  int32_t n = 0;     // 16, 32, ..., 256: rows rounded up to 16
};

#ifdef __CUDACC__
#define GARDEN_WGMMA_PLAN_HD __host__ __device__
#else
#define GARDEN_WGMMA_PLAN_HD
#endif

inline constexpr int32_t kMoeWgmmaMaxN = 256;
GARDEN_WGMMA_PLAN_HD inline constexpr int32_t moeWgmmaTileN(int64_t rows) {
  return static_cast<int32_t>((rows + 15) / 16 * 16);
}

// The number of tiles of an expert with `rows` rows.
GARDEN_WGMMA_PLAN_HD inline constexpr int32_t moeWgmmaExpertTiles(int32_t rows) {
  return (rows + kMoeWgmmaMaxN - 1) / kMoeWgmmaMaxN;
}

// Tile j of expert e whose rows start at r0 (rows in all): the host plan below and the device
// plan (moe_wgmma.cuh launchMoeWgmmaDevicePlan [TAG_MOE_WGMMA_DEVICE_PLAN]) both cut with it.
GARDEN_WGMMA_PLAN_HD inline MoeWgmmaTile moeWgmmaExpertTile(int32_t e, int32_t r0, int32_t rows,
                                                            int32_t j) {
  const int32_t first = j * kMoeWgmmaMaxN, left = rows - first;
  const int32_t n = left < kMoeWgmmaMaxN ? left : kMoeWgmmaMaxN;
  return MoeWgmmaTile{e, r0 + first, n, moeWgmmaTileN(n)};
}

// Upper bound on the tiles of a step whose expert-sorted matrix has at most `max_rows` rows over
// at most `busy` experts with rows: ceil(r / 256) <= floor(r / 256) + 1 per expert, and the floors
// add up to at most floor(max_rows / 256). (The device plan's launches use it as their grid.)
inline constexpr int64_t moeWgmmaMaxTiles(int64_t max_rows, int64_t busy) {
  return max_rows / kMoeWgmmaMaxN + busy;
}

// Writes the tiles of experts 0 .. experts - 1 (off: [experts + 1], non-decreasing) into out
// (capacity cap) and returns their count, or -1 when more than cap would be needed or an offset
// does not fit int32.
inline int64_t moeWgmmaPlanTiles(const int64_t* off, int32_t experts, MoeWgmmaTile* out, int64_t cap) {
  int64_t count = 0;
  for (int32_t e = 0; e < experts; ++e) {
    const int64_t rows = off[e + 1] - off[e];
    if (rows < 0 || off[e + 1] > INT32_MAX) return -1;
    const int32_t tiles = moeWgmmaExpertTiles(static_cast<int32_t>(rows));
    for (int32_t j = 0; j < tiles; ++j) {
      if (count >= cap) return -1;
      out[count++] =
          moeWgmmaExpertTile(e, static_cast<int32_t>(off[e]), static_cast<int32_t>(rows), j);
    }
  }
  return count;
}

}  // namespace garden::rose::cuda
