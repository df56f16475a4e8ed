#pragma once
// Whether the Hopper paged attention (ops/cuda/paged_attention_sm90.cuh) can copy a KV cache of
// `block_size` tokens per block: it copies whole pages into 128-key tiles, so the size must divide
// 128 or be a multiple of it (and be >= 8, the 128-byte swizzle's row repeat). Plain C++: rose's
// start-up (built with or without CUDA) and the kernel's launcher share this one rule.

#include <cstdint>

namespace garden::rose {

inline bool pagedAttentionSm90FitsBlockSize(int32_t block_size) {
  return block_size >= 8 && (128 % block_size == 0 || block_size % 128 == 0);
}

}  // namespace garden::rose
