#pragma once
// The f32 router's weights split for bf16 tensor cores [TAG_ROUTER_MMA].
//
// The f32 router (llm_ops.h moeRouteF32 [TAG_ROUTER_F32]) multiplies the f32 residual stream by
// wt = (router ⊙ norm weight)ᵀ in f32. Each wt element is the product of two bf16 values, so its
// significand has at most 16 bits and it is exactly hi + lo with hi = bf16(wt) (round to nearest)
// and lo = wt − hi, both bf16. The tensor-core router (ops/cuda/moe_router_f32.cu) reads the two
// halves in this layout — BF16 [2, Ep, Hp]: plane 0 the hi parts, plane 1 the lo parts, each
// expert's row of K contiguous (the router weight's own [E, H] orientation), E padded to a
// multiple of kRouterSplitPadE and H to a multiple of kRouterSplitPadK with zeros — and splits
// each residual value into three bf16 parts in registers (exact as well), so every product it sums
// is exact in f32 and only the order of the f32 sums differs from the SIMT kernel's.

#include <cstdint>
#include <vector>

#include "common/safetensors.h"

namespace garden::rose {

inline constexpr int64_t kRouterSplitPadE = 8;   // one mma n-tile
inline constexpr int64_t kRouterSplitPadK = 32;  // one k32 step of the kernel

inline int64_t routerSplitPaddedE(int64_t e) {
  return (e + kRouterSplitPadE - 1) / kRouterSplitPadE * kRouterSplitPadE;
}
inline int64_t routerSplitPaddedH(int64_t h) {
  return (h + kRouterSplitPadK - 1) / kRouterSplitPadK * kRouterSplitPadK;
}

// wt F32 [h, e] (row k, column expert) → the BF16 [2, Ep, Hp] layout above, as raw bf16 bits.
// An element whose value is not hi + lo exactly (more than 16 significant bits: not a product
// of two bf16 values) keeps the rounding of its lo part; `exact` (optional) says whether every
// element was split exactly.
inline std::vector<uint16_t> routerSplitWeights(const float* wt, int64_t h, int64_t e,
                                                bool* exact = nullptr) {
  const int64_t ep = routerSplitPaddedE(e), hp = routerSplitPaddedH(h);
  std::vector<uint16_t> out(static_cast<size_t>(2 * ep * hp), 0);
  bool all = true;
  for (int64_t x = 0; x < e; ++x)
    for (int64_t k = 0; k < h; ++k) {
      const float w = wt[k * e + x];
      const uint16_t hi = f32ToBf16(w);
      const float rest = w - bf16ToF32(hi);
      const uint16_t lo = f32ToBf16(rest);
      if (bf16ToF32(hi) + bf16ToF32(lo) != w) all = false;
      out[static_cast<size_t>(x * hp + k)] = hi;
      out[static_cast<size_t>(ep * hp + x * hp + k)] = lo;
    }
  if (exact != nullptr) *exact = all;
  return out;
}

}  // namespace garden::rose
