#pragma once
// Rotary-embedding frequencies and tables for LLM decoders, including YaRN as Hugging Face
// transformers computes it (`_compute_yarn_parameters`; gpt-oss: truncate = false). The float32
// steps mirror the reference (exponent, power, reciprocal, ramp and blend in float32; the
// correction range in float64), so the tables match it to the last bit or so.
//
// YaRN (d = rotary dim, half = d/2, θ, factor s, original context L0, β_fast, β_slow):
//   corr(β) = d·ln(L0 / (β·2π)) / (2·ln θ); low = max(corr(β_fast), 0), high = min(corr(β_slow),
//   d−1) (floor/ceil when truncate); ramp[i] = clamp((i − low)/(high − low), 0, 1); m = 1 − ramp;
//   ω[i] = θ^(−2i/d)/s · (1 − m) + θ^(−2i/d) · m; attention scaling C = 0.1·ln(s) + 1 (s > 1)
//   unless the config gives attention_factor. Tables hold C·cos(p·ω) and C·sin(p·ω).
//
// Threads: pure functions.

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace garden::rose {

struct RopeScaling {
  std::string type = "default";  // "default" | "yarn"
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0: max_position_embeddings
  bool truncate = true;                          // transformers' default when the key is absent
  double attention_factor = 0.0;                 // 0: derived from factor
};

struct RopeFrequencies {
  std::vector<float> inv_freq;  // [rotary_dim / 2]
  float attention_scaling = 1.f;
};

// INVALID_ARGUMENT / UNIMPLEMENTED naming the field for bad or unsupported settings.
Result<RopeFrequencies> computeRopeFrequencies(int64_t rotary_dim, double theta,
                                               const RopeScaling& scaling,
                                               int64_t max_position_embeddings);

// cos, sin [num_positions, half]: C·cos(float(p)·ω[i]), C·sin(...), the angle rounded to float32.
void buildRopeTables(const RopeFrequencies& f, int64_t num_positions, float* cos, float* sin);

}  // namespace garden::rose
