#pragma once
// Device helpers of the resident MXFP4 expert layout [TAG_MXFP4_TILED] (mxfp4_tiles.h): bf16 pair
// bit casts, E8M0 scales as bf16 pairs, and the dequantization of one 16-byte "unit" of a packed
// tile — what one lane of a 16-row group holds — into exact bf16 values at their (row, k) places.
// Shared by the tiled MoE GEMM (moe_gemm.cu, into its shared-memory B tile) and the per-step
// dequantization of the bf16 cuBLASLt prefill path (moe_lt_bf16.cu) [TAG_MOE_LT_BF16], so both
// see the same weight values. Include only from .cu files.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "services/rose/ops/cuda/mxfp4_tiles.h"

namespace garden::rose::cuda {

// 2^(s - 127) as a bf16 pair (s = 0: the subnormal 2^-127; 255: +inf, as the reference's ldexp).
__device__ __forceinline__ __nv_bfloat162 e8m0Bf16x2(unsigned s) {
  const uint32_t b = s == 0 ? 0x0040u : (s == 255 ? 0x7F80u : (s << 7));
  const uint32_t two = b | (b << 16);
  return *reinterpret_cast<const __nv_bfloat162*>(&two);
}
__device__ __forceinline__ __nv_bfloat162 bitsBf16x2(uint32_t b) {
  return *reinterpret_cast<const __nv_bfloat162*>(&b);
}
__device__ __forceinline__ uint32_t bf16x2Bits(__nv_bfloat162 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}
// Fragment register j of a packed word [TAG_MXFP4_TILED], as exact bf16 values times 2^-126.
__device__ __forceinline__ uint32_t mxRegBits(uint32_t w, int j) { return mxfp4WordToBf16x2Bits(w, j); }
// 2^126 as a bf16 pair: register bits * this = the E2M1 values (all normal).
constexpr uint32_t kTwo126x2 = (253u << 7) | ((253u << 7) << 16);

// [TAG_ATTN_F16] The same for either 16-bit type T (bf16, or fp16: mxfp4_tiles.h's fp16 forms):
// a packed word's fragment register j, the factor of a scale byte (<= 128), and the pairwise
// product of two 16-bit pairs given as bits.
template <typename T>
__device__ __forceinline__ uint32_t mxRegBits16(uint32_t w, int j) {
  if constexpr (std::is_same_v<T, __half>) {
    return mxfp4WordToF16x2Bits(w, j);
  } else {
    return mxfp4WordToBf16x2Bits(w, j);
  }
}
template <typename T>
__device__ __forceinline__ uint32_t mxScaleBits16(uint32_t s) {
  if constexpr (std::is_same_v<T, __half>) {
    return mxfp4DecodeScaleF16Bits(s);
  } else {
    return mxfp4DecodeScaleBits(s);
  }
}
template <typename T>
__device__ __forceinline__ uint32_t mul16x2Bits(uint32_t a, uint32_t b) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    return bf16x2Bits(__hmul2(bitsBf16x2(a), bitsBf16x2(b)));
  }
}

// The fp16 factor pair (mxfp4DecodeScaleF16Bits in both halves) of byte hg (0, 1) of two scale
// bytes: the byte into both halves' low byte, max(s - 98, 0) per half (saturating), into the
// exponent — three operations, as the bf16 form.
__device__ __forceinline__ uint32_t mxScalePairF16(uint32_t two_bytes, int hg) {
  return __vsubus2(__byte_perm(two_bytes, 0u, hg ? 0x4141u : 0x4040u), 0x00620062u) << 10;
}

// Dequantizes unit u (0 .. 255) of one packed (128-row, 64-wide K) tile: `codes` the tile's 4 KiB
// of codes (unit u: codes + u * 16), `scales` its 256 scale bytes (both in shared memory). Unit u is 16-row group u / 32, lane
// l = u % 32 = 4g + t: rows r0 = 16 (u / 32) + g and r0 + 8, k = 16w + 8 (j / 2) + 2t for word w
// and fragment register j (mxfp4_tiles.h). Calls store(row, k, bits) with the T (bf16, or fp16
// [TAG_ATTN_F16]) pair of (row, k) and (row, k + 1) as one 32-bit pattern. kFast: every scale <=
// 128 (one multiply by the scale's factor); otherwise two multiplies (by 2^126, then
// 2^(s - 127); bf16 only). Both give the same exact values.
template <bool kFast, typename T = __nv_bfloat16, typename Store>
__device__ __forceinline__ void mxfp4DequantUnit(int u, const uint8_t* codes, const uint8_t* scales,
                                                 Store&& store) {
  const int grp = u >> 5, ln = u & 31, g = ln >> 2, t = ln & 3;
  const uint4 raw = *reinterpret_cast<const uint4*>(codes + u * 16);
  const int r0 = grp * 16 + g;
  const uint8_t* sr = scales + r0 * 2;
  const uint32_t sbytes[2][2] = {{sr[0], sr[1]}, {sr[16], sr[17]}};  // rows r0, r0 + 8
  if constexpr (!std::is_same_v<T, __nv_bfloat16>) {
    static_assert(kFast, "fp16 MXFP4 dequantization needs every scale <= 128");  // [TAG_ATTN_F16]
    uint32_t sf[2][2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
#pragma unroll
      for (int hg = 0; hg < 2; ++hg) {
        const uint32_t b = mxScaleBits16<T>(sbytes[hr][hg]);
        sf[hr][hg] = b | (b << 16);
      }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t word = w == 0 ? raw.x : w == 1 ? raw.y : w == 2 ? raw.z : raw.w;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        store(r0 + 8 * (j & 1), 16 * w + 8 * (j >> 1) + 2 * t,
              mul16x2Bits<T>(mxRegBits16<T>(word, j), sf[j & 1][w >> 1]));
      }
    }
  } else if constexpr (kFast) {  // bf16 (kept as first written: its SASS is the one measured)
    uint32_t sf[2][2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
#pragma unroll
      for (int hg = 0; hg < 2; ++hg) {
        const uint32_t b = mxfp4DecodeScaleBits(sbytes[hr][hg]);
        sf[hr][hg] = b | (b << 16);
      }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t word = w == 0 ? raw.x : w == 1 ? raw.y : w == 2 ? raw.z : raw.w;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 v =
            __hmul2(bitsBf16x2(mxRegBits(word, j)), bitsBf16x2(sf[j & 1][w >> 1]));
        store(r0 + 8 * (j & 1), 16 * w + 8 * (j >> 1) + 2 * t, bf16x2Bits(v));
      }
    }
  } else {
    const __nv_bfloat162 sc[2][2] = {{e8m0Bf16x2(sbytes[0][0]), e8m0Bf16x2(sbytes[0][1])},
                                     {e8m0Bf16x2(sbytes[1][0]), e8m0Bf16x2(sbytes[1][1])}};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t word = w == 0 ? raw.x : w == 1 ? raw.y : w == 2 ? raw.z : raw.w;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        __nv_bfloat162 v = __hmul2(bitsBf16x2(mxRegBits(word, j)), bitsBf16x2(kTwo126x2));
        v = __hmul2(v, sc[j & 1][w >> 1]);
        store(r0 + 8 * (j & 1), 16 * w + 8 * (j >> 1) + 2 * t, bf16x2Bits(v));
      }
    }
  }
}

}  // namespace garden::rose::cuda
