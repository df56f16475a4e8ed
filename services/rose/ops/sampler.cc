#include "services/rose/ops/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace garden::rose {

Status validateSamplingParams(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.f) {
    return invalidArgument("temperature: must be a finite number >= 0 (got " +
                           std::to_string(p.temperature) + ")");
  }
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) {
    return invalidArgument("top_p: must be in (0, 1] (got " + std::to_string(p.top_p) + ")");
  }
  if (p.top_k < 0) {
    return invalidArgument("top_k: must be >= 0 (got " + std::to_string(p.top_k) + ")");
  }
  return okStatus();
}

namespace {
uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

uint64_t mixCounter(uint64_t seed, uint64_t counter) {
  return splitmix(splitmix(seed) ^ (counter * 0xd1342543de82ef95ULL + 0x2545f4914f6cdd1dULL));
}

double uniformFromCounter(uint64_t seed, uint64_t counter) {
  return static_cast<double>(mixCounter(seed, counter) >> 11) * 0x1.0p-53;
}

int32_t argmaxToken(std::span<const float> logits) {
  int32_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  bool found = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v)) continue;
    if (!found || v > best_v) {
      best_v = v;
      best = static_cast<int32_t>(i);
      found = true;
    }
  }
  return best;
}

int32_t applyTokenBitmask(std::span<float> logits, const uint32_t* mask) {
  int32_t first = -1;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (tokenAllowed(mask, static_cast<int32_t>(i))) {
      if (first < 0) first = static_cast<int32_t>(i);
    } else {
      logits[i] = ninf;
    }
  }
  return first;
}

const std::vector<std::pair<int32_t, double>>& Sampler::distribution(std::span<const float> logits,
                                                                     const SamplingParams& p) {
  const size_t v = logits.size();
  const float inv_t = 1.f / p.temperature;
  cand_.resize(v);
  for (size_t i = 0; i < v; ++i) {
    const float z =
        std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i] * inv_t;
    cand_[i] = {z, static_cast<int32_t>(i)};
  }
  auto order = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t keep = v;
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < v) {
    keep = static_cast<size_t>(p.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(keep), cand_.end(),
                      order);
  } else {
    std::sort(cand_.begin(), cand_.end(), order);
  }
  dist_.clear();
  const double mx = cand_[0].first;
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    const double z = cand_[i].first;
    double e;
    if (std::isinf(mx)) {  // +inf logits share the mass; all −inf: the first candidate
      e = mx > 0 ? (z == mx ? 1.0 : 0.0) : (i == 0 ? 1.0 : 0.0);
    } else {
      e = std::exp(z - mx);  // exp(−inf) = 0
    }
    dist_.emplace_back(cand_[i].second, e);
    sum += e;
  }
  for (auto& d : dist_) d.second /= sum;
  if (p.top_p < 1.f) {
    double mass = 0.0;
    size_t n = 0;
    while (n < dist_.size()) {
      mass += dist_[n].second;
      ++n;
      if (mass >= static_cast<double>(p.top_p)) break;
    }
    dist_.resize(n);
    for (auto& d : dist_) d.second /= mass;
  }
  return dist_;
}

int32_t Sampler::sample(std::span<const float> logits, const SamplingParams& p, uint64_t counter) {
  if (logits.empty()) return 0;
  if (p.temperature <= 0.f) return argmaxToken(logits);
  const auto& d = distribution(logits, p);
  const double u = uniformFromCounter(p.seed, counter);
  double cum = 0.0;
  for (const auto& [id, prob] : d) {
    cum += prob;
    if (u < cum) return id;
  }
  return d.back().first;  // rounding: u ≥ the final cumulative sum
}

}  // namespace garden::rose
