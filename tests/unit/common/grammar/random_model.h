#pragma once
// A random "model" for grammar tests and the bench: per run, each token gets a random logit
// bias N(0, 2), plus `structure_bonus` for tokens holding a JSON structural byte ("{}[],:) so
// that strings and containers close in a few hundred steps even over a 200k vocabulary (with
// flat random logits a string over o200k would run ~600 tokens). Each step samples from the
// masked softmax (Gumbel-max over the allowed tokens). Unconstrained, it emits garbage.

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <vector>

namespace garden::grammar::testing {

class RandomModel {
 public:
  RandomModel(const std::vector<std::string_view>& token_bytes, uint64_t seed,
              float structure_bonus)
      : rng_(seed) {
    std::normal_distribution<float> normal(0.f, 2.f);
    bias_.resize(token_bytes.size());
    for (size_t i = 0; i < token_bytes.size(); ++i) {
      float b = normal(rng_);
      if (token_bytes[i].find_first_of("\"{}[],:") != std::string_view::npos) b += structure_bonus;
      bias_[i] = b;
    }
  }
  // The logits of one step: bias + fresh N(0, 1) noise, -inf where the mask bit is clear;
  // returns the argmax of logits + Gumbel noise (= a draw from the masked softmax). -1: empty mask.
  int32_t sample(std::span<const uint32_t> mask) {
    std::uniform_real_distribution<double> uni(1e-12, 1.0);
    int32_t best = -1;
    double best_v = -INFINITY;
    for (size_t w = 0; w < mask.size(); ++w) {
      for (uint32_t x = mask[w]; x != 0; x &= x - 1) {
        const size_t id = w * 32 + static_cast<size_t>(__builtin_ctz(x));
        if (id >= bias_.size()) continue;
        const double g = -std::log(-std::log(uni(rng_)));
        const double v = bias_[id] + g;
        if (v > best_v) {
          best_v = v;
          best = static_cast<int32_t>(id);
        }
      }
    }
    return best;
  }
  // Logits for the whole vocabulary (for tests that run a real sampler): bias + N(0, 1).
  void logits(std::vector<float>* out) {
    std::normal_distribution<float> normal(0.f, 1.f);
    out->resize(bias_.size());
    for (size_t i = 0; i < bias_.size(); ++i) (*out)[i] = bias_[i] + normal(rng_);
  }

 private:
  std::mt19937_64 rng_;
  std::vector<float> bias_;
};

}  // namespace garden::grammar::testing
