#pragma once
// Pieces shared by the random-checkpoint writers (mkmodel.cc: tiny Qwen3; mkmodel_gpt_oss.cc:
// tiny gpt-oss): a platform-independent PRNG, random weight bytes, a file writer, element counts.
// Internal to services/rose/tools.
//
// Threads: plain values and functions.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <vector>

#include "common/safetensors.h"
#include "common/status.h"

namespace garden::rose::mkmodel {

// splitmix64: fully specified, identical on every platform and compiler.
class Prng {
 public:
  explicit Prng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1) from the top 24 bits: exact in float, no libm involved.
  float uniform() { return static_cast<float>(next() >> 40) / 8388608.0f - 1.0f; }

 private:
  uint64_t s_;
};

// n values offset + scale · uniform, as bf16 (bf16 = true) or f32 little-endian bytes.
inline std::vector<std::byte> randomWeights(Prng& rng, size_t n, float scale, float offset,
                                            bool bf16) {
  std::vector<std::byte> out(n * (bf16 ? 2 : 4));
  for (size_t i = 0; i < n; ++i) {
    const float v = offset + scale * rng.uniform();
    if (bf16) {
      const uint16_t b = f32ToBf16(v);
      std::memcpy(out.data() + 2 * i, &b, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
  }
  return out;
}

inline Status writeFile(const std::filesystem::path& p, std::string_view text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  if (!out) return internalError("cannot write " + p.string());
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out) return internalError("cannot write " + p.string());
  return okStatus();
}

inline size_t numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  return n;
}

}  // namespace garden::rose::mkmodel
