#pragma once
// The FP8 expert format of the CUDA MoE path [TAG_FP8_EXPERTS], as plain functions (no CUDA
// runtime; host and device): the padding and scale-index arithmetic that the requant kernel
// (fp8_requant.cu), the activation quantization (fp8_act_quant.cu), the cuBLASLt calls
// (moe_lt_gemm.cc) and the CPU tests (tests/unit/rose/ops/fp8_block_test.cc) share.
//
// Values are FP8 e4m3 (CUDA's __nv_fp8_e4m3: bias 7, no infinities, 0x7F/0xFF NaN, largest
// finite 448, subnormals k * 2^-9) with f32 dequantization scales (value = code * scale), in
// cuBLASLt's Hopper block-scaling layouts (cuBLAS docs 3.1.4.5, "128-element 1D and 128x128 2D
// block scaling"):
//   weights W [E][N][KP] e4m3, K padded with zeros to KP = K rounded up to 128; one scale per
//     128 x 128 block (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F on the A operand): per expert
//     [ceil(N/128)][L4] floats, K-block index fastest, L = KP/128 blocks padded to L4 = L
//     rounded up to 4 (the column stride must be a multiple of 4; the padding holds 0).
//   activations X [rows][KP] e4m3, one scale per (row, 128 inputs)
//     (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F on the B operand): "N-major", i.e. for the matmul
//     of one expert over its permuted rows [r0, r0 + cnt) the scales are [L][cnt] with the row
//     fastest, stored at r0 * L (the experts' ranges are contiguous, so the blocks tile [0, R*L)).
// The GEMM per expert is cuBLASLt "TN": D[N x cnt] (column-major = row-major [cnt][N]) =
// op(A) W_e [N x KP] · X rows [KP x cnt]; cuBLASLt needs N and cnt multiples of 4 (cnt is a
// multiple of the align step's block_m, 16) and 16-byte aligned operands and scale pointers.

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GARDEN_FP8_HD __host__ __device__
#else
#define GARDEN_FP8_HD
#endif

namespace garden::rose::cuda {

inline constexpr int kFp8Block = 128;
inline constexpr float kFp8E4m3Max = 448.f;

// KP: K rounded up to a multiple of 128.
GARDEN_FP8_HD constexpr int64_t fp8PaddedK(int64_t k) { return (k + kFp8Block - 1) / kFp8Block * kFp8Block; }
// L: 128-blocks along K.
GARDEN_FP8_HD constexpr int64_t fp8KBlocks(int64_t k) { return (k + kFp8Block - 1) / kFp8Block; }
// L4: L rounded up to 4 (the weight scales' column stride).
GARDEN_FP8_HD constexpr int64_t fp8KBlocks4(int64_t k) { return (fp8KBlocks(k) + 3) / 4 * 4; }
// 128-row blocks of N.
GARDEN_FP8_HD constexpr int64_t fp8RowBlocks(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }
// Floats of one expert's weight scales.
GARDEN_FP8_HD constexpr int64_t fp8WeightScalesPerExpert(int64_t n, int64_t k) {
  return fp8RowBlocks(n) * fp8KBlocks4(k);
}
// Index of the scale of (row block p, K block b) inside one expert's weight scales.
GARDEN_FP8_HD constexpr int64_t fp8WeightScaleIndex(int64_t k, int64_t p, int64_t b) {
  return p * fp8KBlocks4(k) + b;
}
// Index of the scale of permuted row r, K block b, for a row of the expert range [r0, r0 + cnt).
GARDEN_FP8_HD constexpr int64_t fp8ActScaleIndex(int64_t k, int64_t r0, int64_t cnt, int64_t r,
                                                 int64_t b) {
  return r0 * fp8KBlocks(k) + b * cnt + (r - r0);
}

// The block-scaling rule's dequantization scale (returned) and quantization multiplier (*inv) for
// a block whose largest |value| is amax: amax / 448 and 448 / amax, each a correctly rounded f32
// quotient; 1 and 0 for an all-zero block. Shared by the MoE activations (fp8_act_quant.cu) and the
// dense FP8 operands (fp8_dense.cuh).
GARDEN_FP8_HD inline float fp8BlockScale(float amax, float* inv) {
  if (!(amax > 0.f)) {
    *inv = 0.f;
    return 1.f;
  }
#if defined(__CUDA_ARCH__)
  *inv = __fdiv_rn(kFp8E4m3Max, amax);
  return __fdiv_rn(amax, kFp8E4m3Max);
#else
  *inv = kFp8E4m3Max / amax;
  return amax / kFp8E4m3Max;
#endif
}

// e4m3 bits -> float (exact).
GARDEN_FP8_HD inline float fp8E4m3ToFloat(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) {
    v = NAN;
  } else if (e == 0) {
    v = ldexpf(static_cast<float>(m), -9);
  } else {
    v = ldexpf(static_cast<float>(8 + m), e - 10);
  }
  return (b & 0x80) ? -v : v;
}

// float -> e4m3 bits, round to nearest even, saturating to +-448 (what cvt.rn.satfinite.e4m3x2
// does; NaN -> 0x7F). The CPU reference of the kernels' hardware conversion.
GARDEN_FP8_HD inline uint8_t fp8E4m3FromFloat(float f) {
  uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(f);
#else
  std::memcpy(&bits, &f, sizeof bits);
#endif
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const float a = fabsf(f);
  if (a != a) return 0x7F;
  if (a >= kFp8E4m3Max) return static_cast<uint8_t>(sign | 0x7E);
  if (a < 0.015625f) {  // below 2^-6: subnormal steps of 2^-9 (8 steps round up to 2^-6 = 0x08)
    const int m = static_cast<int>(rintf(a * 512.f));
    return static_cast<uint8_t>(sign | m);
  }
  uint32_t abits;
#if defined(__CUDA_ARCH__)
  abits = __float_as_uint(a);
#else
  std::memcpy(&abits, &a, sizeof abits);
#endif
  int e = static_cast<int>((abits >> 23) & 0xFF) - 127;  // in [-6, 8]
  int m8 = static_cast<int>(rintf(ldexpf(a, 3 - e)));    // in [8, 16]
  if (m8 == 16) {
    m8 = 8;
    ++e;
  }
  if (e > 8 || (e == 8 && m8 > 14)) return static_cast<uint8_t>(sign | 0x7E);
  return static_cast<uint8_t>(sign | ((e + 7) << 3) | (m8 - 8));
}

// MXFP4 -> FP8 block exponent: the block's scale is 2^fp8BlockExponent(x) where x is the largest
// floor(log2 |w|) over the block's non-zero weights, so the largest magnitude (<= 1.5 * 2^x)
// lands at <= 384 and every weight of magnitude >= 2^(x-16) stays exact (e4m3's subnormal step
// is 2^-9 of the scale; a weight with one significant bit is exact down to 2^(x-17)). The scale is
// kept a normal f32 (>= 2^-126); an all-zero block takes 2^0.
GARDEN_FP8_HD constexpr int fp8BlockExponent(int max_log2) {
  return max_log2 - 8 < -126 ? -126 : max_log2 - 8;
}
inline constexpr int kFp8NoWeight = -100000;  // max_log2 of an all-zero block
// floor(log2 |E2M1 value|) of a code's magnitude (code & 7, 1..7: 0.5, 1, 1.5, 2, 3, 4, 6);
// kFp8NoWeight for zero.
GARDEN_FP8_HD constexpr int e2m1Log2(uint32_t mag) {
  return mag == 0 ? kFp8NoWeight : mag == 1 ? -1 : mag <= 3 ? 0 : mag <= 5 ? 1 : 2;
}

// Expert ranges of the permuted rows from the align step's tile list (tile_expert: expert of each
// M tile of block_m rows, ascending, -1 past the last): off[e] = first row of expert e, off[E] =
// rows in all. Experts without rows get an empty range. Returns false when the list is not
// ascending or names an expert outside [0, E).
inline bool moeExpertOffsetsFromTiles(const int32_t* tile_expert, int64_t max_tiles,
                                      int32_t block_m, int32_t num_experts, int64_t* off) {
  for (int32_t e = 0; e <= num_experts; ++e) off[e] = 0;
  int32_t prev = -1;
  for (int64_t t = 0; t < max_tiles; ++t) {
    const int32_t e = tile_expert[t];
    if (e < 0) break;
    if (e >= num_experts || e < prev) return false;
    off[e + 1] += block_m;
    prev = e;
  }
  for (int32_t e = 0; e < num_experts; ++e) off[e + 1] += off[e];
  return true;
}

}  // namespace garden::rose::cuda
