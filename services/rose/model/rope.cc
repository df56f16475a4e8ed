#include "services/rose/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace garden::rose {

Result<RopeFrequencies> computeRopeFrequencies(int64_t rotary_dim, double theta,
                                               const RopeScaling& s,
                                               int64_t max_position_embeddings) {
  if (rotary_dim <= 0 || rotary_dim % 2 != 0) {
    return invalidArgument("rope: rotary dimension must be positive and even (got " +
                           std::to_string(rotary_dim) + ")");
  }
  if (!(theta > 1.0)) return invalidArgument("rope_theta: must be > 1");
  const int64_t half = rotary_dim / 2;
  const float dim_f = static_cast<float>(rotary_dim);
  RopeFrequencies f;
  f.inv_freq.resize(static_cast<size_t>(half));
  std::vector<float> pos_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / dim_f;
    pos_freq[static_cast<size_t>(i)] = std::pow(static_cast<float>(theta), expo);
  }
  if (s.type == "default" || s.type.empty()) {
    for (int64_t i = 0; i < half; ++i)
      f.inv_freq[static_cast<size_t>(i)] = 1.f / pos_freq[static_cast<size_t>(i)];
    f.attention_scaling = 1.f;
    return f;
  }
  if (s.type != "yarn") {
    return unimplemented("rope_scaling.rope_type: '" + s.type +
                         "' is not supported (default, yarn)");
  }
  if (!(s.factor >= 1.0)) return invalidArgument("rope_scaling.factor: must be >= 1");
  if (!(s.beta_fast > 0 && s.beta_slow > 0)) {
    return invalidArgument("rope_scaling.beta_fast / beta_slow: must be positive");
  }
  const double l0 = static_cast<double>(s.original_max_position_embeddings > 0
                                            ? s.original_max_position_embeddings
                                            : max_position_embeddings);
  if (!(l0 > 0))
    return invalidArgument("rope_scaling.original_max_position_embeddings: must be positive");
  const double d = static_cast<double>(rotary_dim);
  auto corr = [&](double rot) {
    return d * std::log(l0 / (rot * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
  };
  double low = corr(s.beta_fast), high = corr(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, d - 1.0);
  if (low == high) high += 0.001;
  const float factor = static_cast<float>(s.factor);
  const float low_f = static_cast<float>(low);
  const float span_f = static_cast<float>(high - low);
  for (int64_t i = 0; i < half; ++i) {
    const float pf = pos_freq[static_cast<size_t>(i)];
    const float extrap = 1.f / pf;
    const float interp = 1.f / (factor * pf);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / span_f, 0.f, 1.f);
    const float m = 1.f - ramp;
    f.inv_freq[static_cast<size_t>(i)] = interp * (1.f - m) + extrap * m;
  }
  if (s.attention_factor > 0) {
    f.attention_scaling = static_cast<float>(s.attention_factor);
  } else {
    f.attention_scaling =
        s.factor <= 1.0 ? 1.f : static_cast<float>(0.1 * std::log(s.factor) + 1.0);
  }
  return f;
}

void buildRopeTables(const RopeFrequencies& f, int64_t num_positions, float* cos, float* sin) {
  const int64_t half = static_cast<int64_t>(f.inv_freq.size());
  const float c = f.attention_scaling;
  for (int64_t p = 0; p < num_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * f.inv_freq[static_cast<size_t>(i)];
      cos[p * half + i] = static_cast<float>(std::cos(static_cast<double>(angle))) * c;
      sin[p * half + i] = static_cast<float>(std::sin(static_cast<double>(angle))) * c;
    }
  }
}

}  // namespace garden::rose
