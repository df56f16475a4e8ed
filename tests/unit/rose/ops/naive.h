#pragma once
// Naive reference formulas for the rose ops (double accumulation, straight from the definitions
// in services/rose/ops/backend.h), shared by the CPU op tests and usable by GPU kernel tests.
// Everything is row-major std::vector<float>.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace garden::rose::naive {

inline std::vector<float> linear(const std::vector<float>& x, const std::vector<float>& w,
                                 const std::vector<float>& bias, int64_t t, int64_t n, int64_t k) {
  std::vector<float> y(static_cast<size_t>(t * n));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = bias.empty() ? 0.0 : bias[static_cast<size_t>(j)];
      for (int64_t q = 0; q < k; ++q)
        s += static_cast<double>(x[static_cast<size_t>(i * k + q)]) *
             w[static_cast<size_t>(j * k + q)];
      y[static_cast<size_t>(i * n + j)] = static_cast<float>(s);
    }
  return y;
}

inline void rmsNormRow(const float* x, const float* w, float* out, int64_t h, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < h; ++i) ss += static_cast<double>(x[i]) * x[i];
  double inv = 1.0 / std::sqrt(ss / static_cast<double>(h) + eps);
  for (int64_t i = 0; i < h; ++i) out[i] = static_cast<float>(w[i] * (x[i] * inv));
}

// qkv [t, (hq+2hkv)*d]: per-head RMSNorm of q and k heads, then NeoX RoPE at positions.
inline void qkNormRope(std::vector<float>& qkv, const std::vector<float>& qw,
                       const std::vector<float>& kw, const std::vector<int32_t>& pos, int64_t t,
                       int64_t hq, int64_t hkv, int64_t d, int64_t rot, double theta, double eps,
                       bool norm) {
  const int64_t width = (hq + 2 * hkv) * d, half = rot / 2;
  std::vector<float> tmp(static_cast<size_t>(d));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t h = 0; h < hq + hkv; ++h) {
      float* v = qkv.data() + i * width + h * d;
      if (norm) {
        rmsNormRow(v, (h < hq ? qw : kw).data(), tmp.data(), d, eps);
        std::copy(tmp.begin(), tmp.end(), v);
      }
      for (int64_t j = 0; j < half; ++j) {
        double inv_freq =
            1.0 / std::pow(theta, static_cast<double>(2 * j) / static_cast<double>(rot));
        double a = pos[static_cast<size_t>(i)] * inv_freq;
        double x1 = v[j], x2 = v[j + half];
        v[j] = static_cast<float>(x1 * std::cos(a) - x2 * std::sin(a));
        v[j + half] = static_cast<float>(x2 * std::cos(a) + x1 * std::sin(a));
      }
    }
}

inline std::vector<float> attention(const std::vector<float>& qkv, const std::vector<int32_t>& cu,
                                    int64_t hq, int64_t hkv, int64_t d, double scale, bool causal) {
  const int64_t width = (hq + 2 * hkv) * d;
  const int64_t t = cu.back();
  std::vector<float> out(static_cast<size_t>(t * hq * d), 0.f);
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    for (int64_t i = cu[s]; i < cu[s + 1]; ++i)
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t kvh = h / (hq / hkv);
        const int64_t end = causal ? i + 1 : cu[s + 1];
        std::vector<double> sc;
        double mx = -1e300;
        for (int64_t j = cu[s]; j < end; ++j) {
          double dot = 0;
          for (int64_t q = 0; q < d; ++q)
            dot += static_cast<double>(qkv[static_cast<size_t>(i * width + h * d + q)]) *
                   qkv[static_cast<size_t>(j * width + (hq + kvh) * d + q)];
          sc.push_back(dot * scale);
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        for (int64_t q = 0; q < d; ++q) {
          double acc = 0;
          for (int64_t j = cu[s]; j < end; ++j)
            acc += sc[static_cast<size_t>(j - cu[s])] *
                   qkv[static_cast<size_t>(j * width + (hq + hkv + kvh) * d + q)];
          out[static_cast<size_t>(i * hq * d + h * d + q)] = static_cast<float>(acc / sum);
        }
      }
  return out;
}

}  // namespace garden::rose::naive
