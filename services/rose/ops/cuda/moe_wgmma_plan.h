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

inline constexpr int32_t kMoeWgmmaMaxN = 256;
inline constexpr int32_t moeWgmmaTileN(int64_t rows) {
  return static_cast<int32_t>((rows + 15) / 16 * 16);
}

// Writes the tiles of experts 0 .. experts - 1 (off: [experts + 1], non-decreasing) into out
// (capacity cap) and returns their count, or -1 when more than cap would be needed or an offset
// does not fit int32.
inline int64_t moeWgmmaPlanTiles(const int64_t* off, int32_t experts, MoeWgmmaTile* out, int64_t cap) {
  int64_t count = 0;
  for (int32_t e = 0; e < experts; ++e) {
    int64_t r0 = off[e];
    int64_t left = off[e + 1] - off[e];
    if (left < 0 || off[e + 1] > INT32_MAX) return -1;
    while (left > 0) {
      if (count >= cap) return -1;
      const int64_t rows = left < kMoeWgmmaMaxN ? left : kMoeWgmmaMaxN;
      out[count++] = MoeWgmmaTile{e, static_cast<int32_t>(r0), static_cast<int32_t>(rows),
                                  moeWgmmaTileN(rows)};
      r0 += rows;
      left -= rows;
    }
  }
  return count;
}

}  // namespace garden::rose::cuda
