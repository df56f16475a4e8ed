#pragma once
// The resident MXFP4 expert layout of the CUDA MoE GEMMs [TAG_MXFP4_TILED], as plain integer
// functions (no CUDA): the pack kernel, both GEMM kernels (moe_gemm.cu) and a CPU test
// (tests/unit/rose/ops/mxfp4_tiles_test.cc) share them, so the index arithmetic is checked on
// the CPU.
//
// For W [E, N, K] (MXFP4: K/32 groups of 32 values, 16 code bytes per group, element 2i in the
// low nibble of byte i, one E8M0 scale byte per group), with NP = N rounded up to 128, GP = K/32
// rounded up to 2, KT = GP/2 tiles of 64 values along K:
//   codes  [E][NP/128][KT][8 row groups][32 lanes][16 bytes]   (4 KiB per (expert, 128 rows, kt))
//   scales [E][NP/128][KT][128 rows][2]                         (256 B: row-major, group 2kt, 2kt+1)
// The 512 bytes of one (16-row group, kt) are exactly what the 32 lanes of a warp need as the A
// operand fragments of four mma.m16n8k16 steps (the weights as A, 16 rows x 16 k per step), so
// the decode GEMM loads them with one 16-byte load per lane and no shuffles. Lane l = 4g + t holds
// rows g and g + 8 of its group; its word s (k16 step s of the tile) packs 16 nibbles: nibble
// position p (bits 4p..4p+3) of the low half is element (row, k) of fragment register j = 3 - p,
// the same position of the high half is its neighbour k + 1, with
//   j = 0: row g,     k = 16s + 2t        j = 1: row g + 8, k = 16s + 2t
//   j = 2: row g,     k = 16s + 8 + 2t    j = 3: row g + 8, k = 16s + 8 + 2t
// (the m16n8k16 A fragment: a0a1, a2a3, a4a5, a6a7). Moving nibble position 3 - j of both
// halves into bf16 bits (sign 15, magnitude 8..6) gives register j times 2^-126
// (mxfp4WordToBf16x2Bits); one bf16 multiply by 2^(scale - 1) makes it exact.
// Padding rows and groups hold code 0 (value 0) and scale 127.

#include <cstdint>

namespace garden::rose::cuda {

inline constexpr int kMxTileRows = 128;    // rows of one packed tile
inline constexpr int kMxTileK = 64;        // values along K per tile (two groups)
inline constexpr int kMxGroupRows = 16;    // rows of one lane group (one warp's A operand)
inline constexpr int kMxTileBytes = kMxTileRows * kMxTileK / 2;  // 4096 code bytes

// Where element (row r, k) of one (expert, 128-row tile, kt) block sits: byte offset inside the
// 4 KiB block and the nibble (0: low) in that byte. r in [0, 128), k in [0, 64).
struct Mxfp4TilePos {
  int32_t byte = 0;
  int32_t nibble = 0;
};
constexpr Mxfp4TilePos mxfp4TilePos(int32_t r, int32_t k) {
  const int32_t grp = r / kMxGroupRows, rr = r % kMxGroupRows;
  const int32_t g = rr % 8, hi_row = rr / 8;  // row g or g + 8
  const int32_t s = k / 16, kk = k % 16;
  const int32_t hi_k = kk / 8, t = (kk % 8) / 2, odd = kk % 2;
  const int32_t j = hi_k * 2 + hi_row;   // fragment register
  const int32_t lane = 4 * g + t;
  const int32_t bit = 16 * odd + 4 * (3 - j);  // inside word s
  return {grp * 512 + lane * 16 + s * 4 + bit / 8, (bit / 4) % 2};
}

// The inverse: element (row inside the 16-row group, k inside the tile) that nibble `odd` (0: low
// half) of fragment register j of word s of lane `lane` holds.
struct Mxfp4Element {
  int32_t row = 0;
  int32_t k = 0;
};
constexpr Mxfp4Element mxfp4WordElement(int32_t lane, int32_t s, int32_t j, int32_t odd) {
  const int32_t g = lane / 4, t = lane % 4;
  return {g + 8 * (j % 2), 16 * s + 8 * (j / 2) + 2 * t + odd};
}

// The bf16x2 bit pattern of fragment register j of a packed word: both halves' nibble 3 - j as
// sign (bit 15) and magnitude (bits 8..6) — the E2M1 value times 2^-126 (0.5 becomes the bf16
// subnormal 2^-127).
constexpr uint32_t mxfp4WordToBf16x2Bits(uint32_t w, int j) {
  const uint32_t sign = 0x80008000u, mag = 0x01C001C0u;
  switch (j) {
    case 0: return (w & sign) | ((w >> 6) & mag);
    case 1: return ((w << 4) & sign) | ((w >> 2) & mag);
    case 2: return ((w << 8) & sign) | ((w << 2) & mag);
    default: return ((w << 12) & sign) | ((w << 6) & mag);
  }
}

// bf16 bits of 2^(s - 1): the factor that turns mxfp4WordToBf16x2Bits into value * 2^(s - 127).
// Representable for s <= 128 (larger scales take the two-multiply path).
constexpr uint16_t mxfp4DecodeScaleBits(uint32_t s) { return static_cast<uint16_t>((s + 126u) << 7); }
inline constexpr uint32_t kMxfp4MaxDecodeScale = 128;

// [TAG_ATTN_F16] The same for IEEE fp16 fragments (the MoE side in fp16): nibble 3 - j as sign
// (bit 15) and magnitude (bits 11..9) of each half — the E2M1 value times 2^-14 (0.5 becomes the
// fp16 subnormal 2^-15) — and the fp16 bits of 2^(s - 113), which makes it value * 2^(s - 127),
// rounded once to fp16 (exact from s = 104 on; below, the fp16 subnormal rounding of the true
// weight). s <= 98: 0 (every value of such a group is below half of fp16's smallest subnormal, so
// fp16 rounds it to 0 too). Needs s <= 128, as the bf16 fast path.
constexpr uint32_t mxfp4WordToF16x2Bits(uint32_t w, int j) {
  const uint32_t sign = 0x80008000u, mag = 0x0E000E00u;
  switch (j) {
    case 0: return (w & sign) | ((w >> 3) & mag);
    case 1: return ((w << 4) & sign) | ((w << 1) & mag);
    case 2: return ((w << 8) & sign) | ((w << 5) & mag);
    default: return ((w << 12) & sign) | ((w << 9) & mag);
  }
}
constexpr uint16_t mxfp4DecodeScaleF16Bits(uint32_t s) {
  return static_cast<uint16_t>(s >= 99u ? (s - 98u) << 10 : 0u);
}

// The fixed K slicing of the decode-regime expert GEMMs [TAG_MOE_K_SLICES] (block_m 16, both the
// decode kernel and the tiled kernel's block_m 16 instance, MXFP4 and bf16 weights): the kt_count
// 64-wide K tiles are cut into `count` contiguous slices of `len` tiles (the last may be shorter),
// each accumulated from zero in K order, and an output element is
//   ((0 + slice 0) + slice 1) + ... + slice count-1          (f32, in slice order)
// so a row's bits depend on K and the requested slice count only — never on how many tokens the
// step has or which kernel ran. requested = 1 is the single chain (count = 1: the accumulator is
// used as is, no leading 0 +). Every slice is non-empty and count <= requested.
struct MoeKSlicing {
  int32_t len = 1;    // K tiles per slice
  int32_t count = 1;  // slices
};
constexpr MoeKSlicing moeKSlicing(int32_t kt_count, int32_t requested) {
  const int32_t s = requested < 1 ? 1 : (requested > kt_count ? (kt_count < 1 ? 1 : kt_count) : requested);
  const int32_t len = kt_count < 1 ? 1 : (kt_count + s - 1) / s;
  return {len, kt_count < 1 ? 1 : (kt_count + len - 1) / len};
}

}  // namespace garden::rose::cuda
