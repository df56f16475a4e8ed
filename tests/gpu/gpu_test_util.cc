#include "tests/gpu/gpu_test_util.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/safetensors.h"

namespace garden::rose::gputest {

Backends makeBackends() {
  Backends b;
  BackendOptions opts;
  opts.threads = 4;
  // The GARDEN_* kernel variables apply as in rose (e.g. GARDEN_PDL_GRAPH=1 runs every op test
  // with programmatic launches); a bad value fails the test run.
  const Status env = cudaKernelOptionsFromEnv(opts.cuda);
  EXPECT_TRUE(env.isOk()) << env.toString();
  auto cpu = makeBackend("cpu", opts);
  EXPECT_TRUE(cpu.isOk()) << cpu.status().toString();
  auto gpu = makeBackend("cuda", opts);
  EXPECT_TRUE(gpu.isOk()) << "no CUDA backend: " << gpu.status().toString();
  if (cpu.isOk()) b.cpu = std::move(cpu).value();
  if (gpu.isOk()) b.gpu = std::move(gpu).value();
  return b;
}

std::vector<float> randomBf16(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16ToF32(f32ToBf16(d(rng)));
  return v;
}

OwnedTensor allocate(Backend& b, DType dtype, std::initializer_list<int64_t> dims) {
  auto t = b.allocateTensor(dtype, dims);
  if (!t.isOk()) {
    ADD_FAILURE() << t.status().toString();
    return {};
  }
  return std::move(t).value();
}

OwnedTensor upload(Backend& b, DType dtype, std::initializer_list<int64_t> dims,
                   const std::vector<float>& data) {
  OwnedTensor t = allocate(b, dtype, dims);
  EXPECT_EQ(t.view.numel(), static_cast<int64_t>(data.size()));
  HostView hv{data.data(), DType::kF32, static_cast<int64_t>(data.size())};
  Status s = b.uploadConvert(t.view, hv);
  EXPECT_TRUE(s.isOk()) << s.toString();
  return t;
}

OwnedTensor uploadI32(Backend& b, std::initializer_list<int64_t> dims,
                      const std::vector<int32_t>& data) {
  OwnedTensor t = allocate(b, DType::kI32, dims);
  EXPECT_EQ(t.view.numel(), static_cast<int64_t>(data.size()));
  HostView hv{data.data(), DType::kI32, static_cast<int64_t>(data.size())};
  Status s = b.uploadConvert(t.view, hv);
  EXPECT_TRUE(s.isOk()) << s.toString();
  return t;
}

void poison(Backend& b, const Tensor& t) {
  std::vector<unsigned char> ff(t.bytes(), 0xFF);
  b.copyToDevice(t, ff.data(), ff.size());
  Status s = b.synchronize();
  EXPECT_TRUE(s.isOk()) << s.toString();
}

std::vector<float> download(Backend& b, const Tensor& t) {
  std::vector<unsigned char> raw(t.bytes());
  b.copyToHost(raw.data(), t, raw.size());
  Status s = b.synchronize();
  EXPECT_TRUE(s.isOk()) << s.toString();
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kI32) {
    for (size_t i = 0; i < out.size(); ++i) {
      int32_t v;
      std::memcpy(&v, raw.data() + 4 * i, 4);
      out[i] = static_cast<float>(v);
    }
    return out;
  }
  Status c = convertToF32(raw.data(), t.dtype, out.size(), out.data());
  EXPECT_TRUE(c.isOk()) << c.toString();
  return out;
}

CloseStats compare(const std::vector<float>& got, const std::vector<float>& ref, double atol,
                   double rtol) {
  CloseStats s;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    const double g = got[i], r = ref[i];
    s.max_ref = std::max(s.max_ref, std::fabs(r));
    if (!std::isfinite(g)) {
      ++s.nonfinite;
      ++s.bad;
      if (worst_excess < 1e30) {
        worst_excess = 1e30;
        s.worst = static_cast<int64_t>(i);
      }
      continue;
    }
    const double d = std::fabs(g - r);
    s.max_abs = std::max(s.max_abs, d);
    const double excess = d - (atol + rtol * std::fabs(r));
    if (excess > 0) {
      ++s.bad;
      if (excess > worst_excess) {
        worst_excess = excess;
        s.worst = static_cast<int64_t>(i);
      }
    }
  }
  return s;
}

double topTwoMargin(const float* v, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    if (v[j] > a) {
      b = a;
      a = v[j];
    } else if (v[j] > b) {
      b = v[j];
    }
  }
  return static_cast<double>(a) - b;
}

void expectClose(const std::vector<float>& got, const std::vector<float>& ref, double atol,
                 double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  CloseStats s = compare(got, ref, atol, rtol);
  EXPECT_EQ(s.bad, 0) << what << ": " << s.bad << " of " << got.size()
                      << " elements out of tolerance (" << s.nonfinite << " non-finite); worst at "
                      << s.worst << ": got "
                      << (s.worst >= 0 ? got[static_cast<size_t>(s.worst)] : 0) << " ref "
                      << (s.worst >= 0 ? ref[static_cast<size_t>(s.worst)] : 0) << "; max |diff| "
                      << s.max_abs << ", max |ref| " << s.max_ref;
}

double rowCosine(const std::vector<float>& a, const std::vector<float>& b, int64_t row,
                 int64_t cols) {
  double dot = 0, na = 0, nb = 0;
  for (int64_t i = row * cols; i < (row + 1) * cols; ++i) {
    dot += static_cast<double>(a[static_cast<size_t>(i)]) * b[static_cast<size_t>(i)];
    na += static_cast<double>(a[static_cast<size_t>(i)]) * a[static_cast<size_t>(i)];
    nb += static_cast<double>(b[static_cast<size_t>(i)]) * b[static_cast<size_t>(i)];
  }
  if (na == 0 || nb == 0) return (na == nb) ? 1.0 : 0.0;
  return dot / std::sqrt(na * nb);
}

double expectSameWithinBf16(const float* got, const float* want, int64_t cols, double min_cos,
                            int max_ulps, const std::string& what) {
  double dot = 0, na = 0, nb = 0, mx = 0, worst = 0;
  int64_t differ = 0;
  for (int64_t i = 0; i < cols; ++i) {
    const double a = got[i], b = want[i];
    dot += a * b;
    na += a * a;
    nb += b * b;
    mx = std::max({mx, std::fabs(a), std::fabs(b)});
    worst = std::max(worst, std::fabs(a - b));
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) ++differ;
  }
  const double cs = (na == 0 || nb == 0) ? (na == nb ? 1.0 : 0.0) : dot / std::sqrt(na * nb);
  int e = 0;
  std::frexp(mx, &e);  // mx = f * 2^e, f in [0.5, 1): the bf16 ulp at mx is 2^(e - 8)
  const double ulp = std::ldexp(1.0, e - 8);
  std::printf(
      "%s: cosine %.8f, max |diff| %.3g (%.2f bf16 ulps of max |value| %.3g), %lld of %lld "
      "differ\n",
      what.c_str(), cs, worst, worst / ulp, mx, static_cast<long long>(differ),
      static_cast<long long>(cols));
  EXPECT_GE(cs, min_cos) << what;
  EXPECT_LE(worst, max_ulps * ulp)
      << what << ": max |diff| " << worst << " = " << worst / ulp << " bf16 ulps of " << mx;
  for (int64_t i = 0; i < cols; ++i) {
    if (!std::isfinite(got[i])) {
      ADD_FAILURE() << what << ": non-finite value at " << i;
      break;
    }
  }
  return cs;
}

std::vector<int32_t> cumulative(const std::vector<int32_t>& lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) cu[i + 1] = cu[i] + lens[i];
  return cu;
}

// Two bf16 results of the same GEMM row computed with different f32 summation orders (another
// algorithm, split-K): each value within 2 bf16 ulps (2 * 2^-7 relative) of the other, plus a
// small absolute floor for values near zero where cancellation makes relative bounds meaningless.
void expectWithinBf16Rounding(const std::vector<float>& got, const std::vector<float>& want,
                              const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double mx = 0;
  for (float v : want) mx = std::max(mx, static_cast<double>(std::fabs(v)));
  size_t bad = 0, differ = 0, worst_at = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = want[i], d = std::fabs(a - b);
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) ++differ;
    const double tol = 2.0 * std::ldexp(std::max(std::fabs(a), std::fabs(b)), -7) + 1e-4 * mx;
    if (!(d <= tol)) {
      if (bad++ == 0 || d > worst) worst_at = i;
      worst = std::max(worst, d);
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " values beyond 2 bf16 ulps (worst |diff| " << worst << " at " << worst_at
                     << ": " << got[worst_at] << " vs " << want[worst_at] << ")";
  std::cout << what << ": " << differ << " of " << got.size() << " values not bit-identical\n";
}

// y[i, j] = sum_k x[i, k] w[j, k] in f32 (8 interleaved partial sums), no bias.
std::vector<float> hostLinear(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                              int64_t n, int64_t k) {
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x.data() + i * k;
    for (int64_t j = 0; j < n; ++j) {
      const float* wr = w.data() + j * k;
      float p[8] = {};
      for (int64_t kk = 0; kk < k; kk += 8) {
        for (int l = 0; l < 8; ++l) p[l] += xr[kk + l] * wr[kk + l];
      }
      y[static_cast<size_t>(i * n + j)] =
          ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    }
  }
  return y;
}

int deviceSms() {
  int sms = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  return sms;
}

}  // namespace garden::rose::gputest
