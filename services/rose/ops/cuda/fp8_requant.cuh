#pragma once
// MXFP4 expert weights -> FP8 e4m3 with one f32 scale per 128 x 128 block [TAG_FP8_EXPERTS]
// (fp8_block.h: layouts). Input: experts [first, first + count) of a checkpoint MXFP4 weight in
// the checkpoint's layout (codes [count, N, K/32, 16], element 2i in the low nibble of byte i;
// E8M0 scales [count, N, K/32]), in device memory (the upload's staging copy). Output: e4m3
// W [E][N][KP] (K padded with zeros to 128) and scales [E][ceil(N/128)][L4].
//
// Each block's scale is the power of two 2^fp8BlockExponent(x), x the largest floor(log2 |w|) of
// its non-zero weights: an MXFP4 weight c * 2^(s-127) (c in {0.5 .. 6}, two significant bits)
// then becomes c * 2^(s-127-E), which e4m3 holds exactly unless it is more than ~17 binades below
// the block's largest weight. Those are rounded to nearest even (most to zero) and counted:
// *inexact counts the non-zero weights whose e4m3 value times the scale differs from the MXFP4
// value, *nonzero the non-zero weights (both atomically added, u64).
// One 256-thread block per (128 x 128 block, expert); pointers are device memory owned by the
// caller.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/status.h"

namespace garden::rose::cuda {

struct Fp8RequantArgs {
  const uint8_t* src_codes = nullptr;   // [count, n, k/32, 16]
  const uint8_t* src_scales = nullptr;  // [count, n, k/32]
  int64_t first = 0;                    // first expert of this batch
  int64_t count = 0;                    // experts in this batch
  int64_t experts = 0;                  // experts of the whole weight (bounds check)
  int64_t n = 0;                        // rows (output features)
  int64_t k = 0;                        // inputs, a multiple of 32
  uint8_t* q = nullptr;                 // [experts, n, fp8PaddedK(k)] e4m3
  float* scales = nullptr;              // [experts, fp8WeightScalesPerExpert(n, k)]
  unsigned long long* inexact = nullptr;  // [1], added to
  unsigned long long* nonzero = nullptr;  // [1], added to
};

Status launchFp8Requant(const Fp8RequantArgs& a, cudaStream_t stream);

}  // namespace garden::rose::cuda
