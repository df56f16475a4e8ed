#include "tests/gpu/gpu_test_util.h"

#include <cmath>
#include <cstring>

#include "common/safetensors.h"

namespace garden::rose::gputest {

Backends makeBackends() {
  Backends b;
  BackendOptions opts;
  opts.threads = 4;
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

}  // namespace garden::rose::gputest
