#pragma once
// MXFP4 (OCP microscaling FP4) dequantization exactly as the gpt-oss reference does it
// (transformers `convert_moe_packed_tensors`, openai/gpt-oss `torch/weights.py`); see the
// project's gpt-oss specification (gpt-oss.md) §2.5.
//
// Layout: a logical weight W[..., r, k] with K inputs is stored as `blocks` uint8
// [..., r, K/32, 16] and `scales` uint8 [..., r, K/32]. Element k = 32·g + j lives in byte
// blocks[..., r, g, j/2]: even j in the low nibble, odd j in the high nibble. The nibble is an
// E2M1 code (bit 3 sign; values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}); the scale byte s is E8M0:
// W = FP4[code] · 2^(s − 127). Every result with at most 2 significant bits is exact in float32
// and bf16 (s = 255 with a non-zero code gives ±inf, as in the reference).
//
// Threads: pure functions.

#include <cstdint>
#include <vector>

#include "common/safetensors.h"
#include "common/status.h"

namespace garden::rose {

// The value of a 4-bit E2M1 code (only the low 4 bits are read).
float fp4Value(uint8_t code);

// rows × groups blocks of 32 values: blocks [rows, groups, 16], scales [rows, groups] →
// out [rows, groups·32] (float32, or bf16 bit patterns).
void dequantizeMxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t groups,
                     float* out);
void dequantizeMxfp4Bf16(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t groups,
                         uint16_t* out);

// Shape facts of a checkpoint pair, validated: both U8, blocks [P..., G, 16], scales [P..., G]
// with the same prefix P. INVALID_ARGUMENT naming the tensors otherwise.
struct Mxfp4Shape {
  std::vector<int64_t> prefix;  // P (e.g. [E, rows])
  int64_t groups = 0;           // G; logical last dim = 32·G
  int64_t rows() const;         // product of P
};
Result<Mxfp4Shape> checkMxfp4(const TensorView& blocks, const TensorView& scales);

}  // namespace garden::rose
