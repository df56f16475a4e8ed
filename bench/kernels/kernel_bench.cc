// Kernel microbenchmarks for rose's CUDA backend.
//
// Workloads (Qwen3-Embedding-0.6B shapes, 8192-token batches unless noted):
//   embedding      T=8192 H=1024 gather                         (TB/s)
//   rms_norm_add   T=8192 H=1024, residual add fused            (TB/s)
//   qk_norm_rope   T=8192 Hq=16 Hkv=8 D=128                     (TB/s)
//   qk_rows_copy2d the same bytes (q and k of each row) copied by cudaMemcpy2DAsync (TB/s)
//   swiglu         T=8192 I=3072                                (TB/s)
//                  `rose_kernel_bench elementwise` runs only these
//   pool_mean      block and cluster per sequence, H=1024, L2: 16x512, 1x4096, 100x512 (TB/s)
//   pool_last      same shapes, L2                              (TB/s of the rows read)
//   attention      the size policy (auto), the narrow-only policy, the sm90 policy, and each
//                  variant forced (narrow16, narrow64, wide64, wide128, sm90, sm90basic,
//                  sm90cpasync; attention.cuh); the mma.sync ones checked bit-equal to narrow16,
//                  the sm90 ones within bf16 rounding of it:
//                  causal 16x512, 4x2048, 64x128, 1x128, 1x512, 1x1024, 1x2048, 1x4096, 4x1024,
//                  100x512; bidir 8x1024, 1x512, 1x1024, 1x4096, 4x4096 (TFLOP/s).
//                  `rose_kernel_bench attention` runs only these
//   gemm           M=8192: qkv 4096x1024, o 1024x2048, gate_up 6144x1024, down 1024x3072,
//                  and 8192^3 (TFLOP/s)
//   gemm_fp8       M=512,2048,8192,16384 on the four layer shapes: the bf16 runner (tuned) beside
//                  FP8 e4m3 through cuBLASLt with block (128x128 / 1x128), outer-vector (per
//                  channel / per token) and per-tensor scales; `rose_kernel_bench gemm_fp8` runs
//                  only these
//   gemm_smallm    M=1,64,128,256,512 on the same four shapes, weights cold (L2 flushed before each
//                  timed launch, as GemmRunner's tuner times): the tuned runner with cuBLASLt only,
//                  with the custom small-M kernel among its candidates, and the kernel directly in
//                  each (N tile, split count) the tuner times (us, GB/s of weight bytes)
// Method: inputs are random (never zeros); each workload rotates over enough input/output sets
// to exceed 4x the 60 MB L2; a sampled correctness check against a host f32 computation runs
// before timing; warm-up, then the median of per-launch CUDA-event times. Rooflines: this card's
// device copy rate (read+write, measured at start; 4.2 TB/s on the H200) and 805 TFLOP/s (bf16
// dense GEMM, measured on the H200)
// (GPU_HOST.md).

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "services/rose/ops/cuda/attention.cuh"
#include "services/rose/ops/cuda/attention_sm90.cuh"
#include "services/rose/ops/cuda/embedding.cuh"
#include "services/rose/ops/cuda/fp8_block.h"
#include "services/rose/ops/cuda/gemm.h"
#include "services/rose/ops/cuda/gemm_smallm.cuh"
#include "services/rose/ops/cuda/gemm_wg.cuh"
#include "services/rose/ops/cuda/pool.cuh"
#include "services/rose/ops/cuda/qk_norm_rope.cuh"
#include "services/rose/ops/cuda/rms_norm.cuh"
#include "services/rose/ops/cuda/swiglu.cuh"

namespace garden::rose::cuda {
namespace {

constexpr double kPeakBw = 4.2e12;     // bytes/s
constexpr double kPeakFlops = 805e12;  // bf16 dense
constexpr size_t kRotateBytes = 256ull << 20;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define OK(x)                                                      \
  do {                                                             \
    Status s_ = (x);                                               \
    if (!s_.isOk()) {                                              \
      std::fprintf(stderr, "%s: %s\n", #x, s_.toString().c_str()); \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

std::mt19937 g_rng(42);
int g_failures = 0;

float bf(float x) { return __bfloat162float(__float2bfloat16(x)); }

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t b) : bytes(b) { CK(cudaMalloc(&p, b)); }
  ~Dev() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Random bf16 on the device (host-generated), returns host copy as float.
std::vector<float> fillBf16(const Dev& d, float lo, float hi) {
  size_t n = d.bytes / 2;
  std::vector<__nv_bfloat16> h(n);
  std::vector<float> f(n);
  std::uniform_real_distribution<float> u(lo, hi);
  for (size_t i = 0; i < n; ++i) {
    h[i] = __float2bfloat16(u(g_rng));
    f[i] = __bfloat162float(h[i]);
  }
  CK(cudaMemcpy(d.p, h.data(), n * 2, cudaMemcpyHostToDevice));
  return f;
}
// Host values (bf16-representable, as fillBf16 returns them) back as bf16, to re-upload.
std::vector<__nv_bfloat16> toBf16(const std::vector<float>& f) {
  std::vector<__nv_bfloat16> h(f.size());
  for (size_t i = 0; i < f.size(); ++i) h[i] = __float2bfloat16(f[i]);
  return h;
}
std::vector<float> readBf16(const void* p, size_t n) {
  std::vector<__nv_bfloat16> h(n);
  CK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}
void poison(const Dev& d) { CK(cudaMemset(d.p, 0xFF, d.bytes)); }

void check(const char* name, double got, double ref, double atol, double rtol) {
  if (!(std::fabs(got - ref) <= atol + rtol * std::fabs(ref))) {
    if (g_failures < 20) std::printf("  CHECK FAILED %s: got %g ref %g\n", name, got, ref);
    ++g_failures;
  }
}

int setsFor(size_t bytes_per_set) {
  return static_cast<int>(
      std::clamp<size_t>(kRotateBytes / std::max<size_t>(bytes_per_set, 1) + 1, 2, 32));
}

// Median per-launch time (seconds) of run(set) rotating over `sets`.
double timeIt(const std::function<void(int)>& run, int sets, int iters = 60) {
  for (int i = 0; i < 5; ++i) run(i % sets);
  CK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(ev[2 * i]));
    run(i % sets);
    CK(cudaEventRecord(ev[2 * i + 1]));
  }
  CK(cudaDeviceSynchronize());
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) CK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2] * 1e-3;
}

// This card's device-to-device copy rate (bytes read + written per second), measured by
// measureCopyBw() at start; kPeakBw (the H200's) until then.
double g_copy_bw = kPeakBw;

void measureCopyBw() {
  const size_t bytes = size_t{1} << 30;
  Dev a(bytes), b(bytes);
  CK(cudaMemset(a.p, 1, bytes));
  const double sec = timeIt([&](int) { CK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice)); },
                            1, 20);
  g_copy_bw = 2.0 * bytes / sec;
  std::printf("# device copy on this card (1 GiB, read + write): %.3f TB/s — the %% column's line\n",
              g_copy_bw / 1e12);
}

void reportBw(const std::string& name, const std::string& shape, double sec, double bytes) {
  const double bw = bytes / sec;
  std::printf("%-14s %-34s %9.1f us %8.3f TB/s  %5.1f%% of %.2f TB/s\n", name.c_str(),
              shape.c_str(), sec * 1e6, bw / 1e12, 100 * bw / g_copy_bw, g_copy_bw / 1e12);
}
void reportFlops(const std::string& name, const std::string& shape, double sec, double flops) {
  const double f = flops / sec;
  std::printf("%-14s %-34s %9.1f us %8.1f TFLOP/s %5.1f%% of 805\n", name.c_str(), shape.c_str(),
              sec * 1e6, f / 1e12, 100 * f / kPeakFlops);
}

void benchEmbedding() {
  const int64_t t = 8192, h = 1024, vocab = 151669;
  Dev table(vocab * h * 2);
  auto tf = fillBf16(table, -1, 1);
  const size_t per = t * h * 2 * 2 + t * 4;
  const int sets = setsFor(per);
  std::vector<std::unique_ptr<Dev>> ids, out;
  std::vector<std::vector<int32_t>> hid(sets);
  std::uniform_int_distribution<int32_t> u(0, vocab - 1);
  for (int s = 0; s < sets; ++s) {
    hid[s].resize(t);
    for (auto& x : hid[s]) x = u(g_rng);
    ids.push_back(std::make_unique<Dev>(t * 4));
    out.push_back(std::make_unique<Dev>(t * h * 2));
    CK(cudaMemcpy(ids[s]->p, hid[s].data(), t * 4, cudaMemcpyHostToDevice));
  }
  auto run = [&](int s) {
    EmbeddingArgs a{
        table.as<__nv_bfloat16>(), ids[s]->as<int32_t>(), out[s]->as<__nv_bfloat16>(), t, h, vocab};
    OK(launchEmbedding(a, nullptr));
  };
  poison(*out[0]);
  run(0);
  auto o = readBf16(out[0]->p, t * h);
  for (int64_t r : {int64_t{0}, t / 2, t - 1})
    for (int64_t c = 0; c < h; c += 97)
      check("embedding", o[r * h + c], tf[hid[0][r] * h + c], 0, 0);
  reportBw("embedding", "T=8192 H=1024", timeIt(run, sets), 2.0 * t * h * 2 + t * 4);
}

void benchRmsNorm() {
  const int64_t t = 8192, h = 1024;
  Dev w(h * 2);
  auto wf = fillBf16(w, 0.5, 1.5);
  const int sets = setsFor(t * h * 2 * 3);
  std::vector<std::unique_ptr<Dev>> x, r, o;
  std::vector<float> x0, r0;
  for (int s = 0; s < sets; ++s) {
    x.push_back(std::make_unique<Dev>(t * h * 2));
    r.push_back(std::make_unique<Dev>(t * h * 2));
    o.push_back(std::make_unique<Dev>(t * h * 2));
    auto xf = fillBf16(*x[s], -2, 2);
    auto rf = fillBf16(*r[s], -2, 2);
    if (s == 0) {
      x0 = xf;
      r0 = rf;
    }
  }
  auto run = [&](int s) {
    RmsNormArgs a{x[s]->as<__nv_bfloat16>(),
                  r[s]->as<__nv_bfloat16>(),
                  w.as<__nv_bfloat16>(),
                  o[s]->as<__nv_bfloat16>(),
                  t,
                  h,
                  1e-6f};
    OK(launchRmsNorm(a, nullptr));
  };
  // out's rows against the host's norm of x0 + r0, every step-th value.
  auto checkRows = [&](const char* name, const std::vector<float>& of,
                       std::initializer_list<int64_t> rows, int64_t step) {
    for (int64_t row : rows) {
      double ss = 0;
      std::vector<float> v(h);
      for (int64_t i = 0; i < h; ++i) {
        v[i] = bf(x0[row * h + i] + r0[row * h + i]);
        ss += v[i] * v[i];
      }
      const double inv = 1 / std::sqrt(ss / h + 1e-6);
      for (int64_t i = 0; i < h; i += step)
        check(name, of[row * h + i], v[i] * inv * wf[i], 2e-2, 2e-2);
    }
  };
  poison(*o[0]);
  run(0);
  checkRows("rms_norm", readBf16(o[0]->p, t * h), {0, 4097, t - 1}, 31);
  reportBw("rms_norm_add", "T=8192 H=1024", timeIt(run, sets), 4.0 * t * h * 2);
  // Few rows (one L2-resident launch each, the 1x128 / 1x512 forward's norms: the split
  // kernel), each checked on fresh inputs first. (A second few-row kernel, one warp-wide row per
  // block with the weight loaded early, lost: 1x128 forward 10 % slower on an H100, s31.)
  const std::vector<__nv_bfloat16> xb = toBf16(x0), rb = toBf16(r0);
  for (int64_t rows : {int64_t{128}, int64_t{512}}) {
    auto few = [&] {
      RmsNormArgs a{x[0]->as<__nv_bfloat16>(), r[0]->as<__nv_bfloat16>(), w.as<__nv_bfloat16>(),
                    o[0]->as<__nv_bfloat16>(), rows, h, 1e-6f};
      OK(launchRmsNorm(a, nullptr));
    };
    CK(cudaMemcpy(x[0]->p, xb.data(), rows * h * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(r[0]->p, rb.data(), rows * h * 2, cudaMemcpyHostToDevice));
    poison(*o[0]);
    few();
    checkRows("rms_norm few", readBf16(o[0]->p, rows * h), {0, rows / 3, rows - 1}, 13);
    reportBw("rms_norm_add", "T=" + std::to_string(rows) + " H=1024", timeIt([&](int) { few(); }, 1),
             4.0 * rows * h * 2);
  }
}

void benchQkNormRope() {
  const int64_t t = 8192, maxpos = 8192;
  const int hq = 16, hkv = 8, d = 128;
  const int64_t width = (hq + 2 * hkv) * d;
  Dev qw(d * 2), kw(d * 2);
  auto qwf = fillBf16(qw, 0.5, 1.5);
  auto kwf = fillBf16(kw, 0.5, 1.5);
  std::vector<float> cs(maxpos * 64), sn(maxpos * 64);
  for (int64_t p = 0; p < maxpos; ++p)
    for (int i = 0; i < 64; ++i) {
      double inv = std::pow(1e6, -2.0 * i / 128);
      cs[p * 64 + i] = std::cos(p * inv);
      sn[p * 64 + i] = std::sin(p * inv);
    }
  Dev dc(cs.size() * 4), ds(sn.size() * 4), pos(t * 4);
  CK(cudaMemcpy(dc.p, cs.data(), dc.bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ds.p, sn.data(), ds.bytes, cudaMemcpyHostToDevice));
  std::vector<int32_t> hp(t);
  for (int64_t i = 0; i < t; ++i) hp[i] = static_cast<int32_t>(i % 512);
  CK(cudaMemcpy(pos.p, hp.data(), t * 4, cudaMemcpyHostToDevice));
  const int sets = setsFor(t * width * 2);
  std::vector<std::unique_ptr<Dev>> q;
  std::vector<float> q0;
  for (int s = 0; s < sets; ++s) {
    q.push_back(std::make_unique<Dev>(t * width * 2));
    auto f = fillBf16(*q[s], -2, 2);
    if (s == 0) q0 = f;
  }
  // The kernels the launcher can pick [TAG_QK_ROPE_PAIR]: -1 legacy, 0 by size, 1/2/4/8 the pair
  // kernel with that many heads per warp; each checked on fresh inputs, then timed.
  const std::vector<__nv_bfloat16> fresh = toBf16(q0);
  auto launch = [&](void* qkv, int64_t tokens, int32_t variant) {
    QkNormRopeArgs a;
    a.qkv = static_cast<__nv_bfloat16*>(qkv);
    a.q_weight = qw.as<__nv_bfloat16>();
    a.k_weight = kw.as<__nv_bfloat16>();
    a.positions = pos.as<int32_t>();
    a.cos = dc.as<float>();
    a.sin = ds.as<float>();
    a.num_tokens = tokens;
    a.num_q_heads = hq;
    a.num_kv_heads = hkv;
    a.head_dim = d;
    a.rotary_dim = d;
    a.max_pos = static_cast<int32_t>(maxpos);
    a.variant = variant;
    OK(launchQkNormRope(a, nullptr));
  };
  const std::string names[] = {"legacy", "auto", "pair1", "pair2", "pair4", "pair8"};
  const int32_t variants[] = {-1, 0, 1, 2, 4, 8};
  for (int vi = 0; vi < 6; ++vi) {
    const int32_t variant = variants[vi];
    CK(cudaMemcpy(q[0]->p, fresh.data(), fresh.size() * 2, cudaMemcpyHostToDevice));
    launch(q[0]->p, t, variant);
    auto of = readBf16(q[0]->p, t * width);
    for (int64_t tok : {int64_t{3}, int64_t{700}, t - 1}) {
      for (int h : {0, 5, 15, 16, 17, 23}) {  // q heads and k heads, the group edges
        const float* x = &q0[tok * width + h * d];
        const std::vector<float>& wf = h < hq ? qwf : kwf;
        double ss = 0;
        for (int i = 0; i < d; ++i) ss += x[i] * x[i];
        const double inv = 1 / std::sqrt(ss / d + 1e-6);
        std::vector<double> n(d);
        for (int i = 0; i < d; ++i) n[i] = x[i] * inv * wf[i];
        const int p = hp[tok];
        for (int i = 0; i < 64; i += 7) {
          check("qk_norm_rope", of[tok * width + h * d + i],
                n[i] * cs[p * 64 + i] - n[i + 64] * sn[p * 64 + i], 3e-2, 3e-2);
          check("qk_norm_rope", of[tok * width + h * d + i + 64],
                n[i + 64] * cs[p * 64 + i] + n[i] * sn[p * 64 + i], 3e-2, 3e-2);
        }
      }
    }
    // in place: read + write the q and k heads
    reportBw("qk_norm_rope", "T=8192 Hq=16 Hkv=8 D=128 " + names[vi],
             timeIt([&](int s) { launch(q[s]->p, t, variant); }, sets),
             2.0 * t * (hq + hkv) * d * 2);
  }
  // Few tokens (the 1x128 forward's shape; L2-resident, as after the QKV GEMM): per-launch time.
  for (int64_t tokens : {int64_t{128}, int64_t{512}}) {
    for (int vi = 0; vi < 6; ++vi) {
      reportBw("qk_norm_rope",
               "T=" + std::to_string(tokens) + " Hq=16 Hkv=8 D=128 " + names[vi],
               timeIt([&](int) { launch(q[0]->p, tokens, variants[vi]); }, 1),
               2.0 * tokens * (hq + hkv) * d * 2);
    }
  }
  // The same bytes moved by the copy engine: the q and k part of every row (6 of its 8 KB) into
  // another buffer of the same layout (cudaMemcpy2DAsync) - what this access pattern costs
  // without any kernel of ours.
  Dev other(t * width * 2);
  auto copy = [&](int s) {
    CK(cudaMemcpy2DAsync(other.p, width * 2, q[s]->p, width * 2, (hq + hkv) * d * 2, t,
                         cudaMemcpyDeviceToDevice));
  };
  reportBw("qk_rows_copy2d", "T=8192 (Hq+Hkv)*D of each row", timeIt(copy, sets),
           2.0 * t * (hq + hkv) * d * 2);
}

void benchSwiglu() {
  const int64_t t = 8192, inter = 3072;
  const int sets = setsFor(t * inter * 2 * 3);
  std::vector<std::unique_ptr<Dev>> gu, o;
  std::vector<float> g0;
  for (int s = 0; s < sets; ++s) {
    gu.push_back(std::make_unique<Dev>(t * 2 * inter * 2));
    o.push_back(std::make_unique<Dev>(t * inter * 2));
    auto f = fillBf16(*gu[s], -4, 4);
    if (s == 0) g0 = f;
  }
  auto run = [&](int s) {
    SwigluArgs a{gu[s]->as<__nv_bfloat16>(), o[s]->as<__nv_bfloat16>(), t, inter};
    OK(launchSwiglu(a, nullptr));
  };
  poison(*o[0]);
  run(0);
  auto of = readBf16(o[0]->p, t * inter);
  for (int64_t i = 0; i < t * inter; i += 100003) {
    const int64_t r = i / inter, c = i % inter;
    const double gv = g0[r * 2 * inter + c], uv = g0[r * 2 * inter + inter + c];
    check("swiglu", of[i], gv / (1 + std::exp(-gv)) * uv, 2e-2, 2e-2);
  }
  reportBw("swiglu", "T=8192 I=3072", timeIt(run, sets), 3.0 * t * inter * 2);
}

void benchPool(int ns, int64_t t) {
  const int64_t h = 1024;
  std::vector<int32_t> cu(ns + 1);
  for (int i = 0; i <= ns; ++i) cu[i] = static_cast<int32_t>(i * t / ns);
  Dev dcu(cu.size() * 4);
  CK(cudaMemcpy(dcu.p, cu.data(), dcu.bytes, cudaMemcpyHostToDevice));
  const int sets = setsFor(t * h * 2);
  std::vector<std::unique_ptr<Dev>> hid, o;
  std::vector<float> h0;
  for (int s = 0; s < sets; ++s) {
    hid.push_back(std::make_unique<Dev>(t * h * 2));
    o.push_back(std::make_unique<Dev>(ns * h * 4));
    auto f = fillBf16(*hid[s], -3, 3);
    if (s == 0) h0 = f;
  }
  const std::pair<PoolKind, PoolVariant> cases[] = {
      {PoolKind::kMean, PoolVariant::kBlockPerSequence},
      {PoolKind::kMean, PoolVariant::kClusterPerSequence},
      {PoolKind::kLast, PoolVariant::kBlockPerSequence}};
  for (auto [kind, variant] : cases) {
    auto run = [&](int s) {
      PoolArgs a{
          hid[s]->as<__nv_bfloat16>(), dcu.as<int32_t>(), o[s]->as<float>(), ns, h, kind, true};
      OK(launchPoolVariant(a, nullptr, variant));
    };
    poison(*o[0]);
    run(0);
    std::vector<float> of(ns * h);
    CK(cudaMemcpy(of.data(), o[0]->p, of.size() * 4, cudaMemcpyDeviceToHost));
    for (int sq : {0, ns - 1}) {
      std::vector<double> v(h, 0);
      double ss = 0;
      for (int64_t i = 0; i < h; ++i) {
        if (kind == PoolKind::kMean) {
          for (int64_t r = cu[sq]; r < cu[sq + 1]; ++r) v[i] += h0[r * h + i];
          v[i] /= (cu[sq + 1] - cu[sq]);
        } else {
          v[i] = h0[(cu[sq + 1] - 1) * h + i];
        }
        ss += v[i] * v[i];
      }
      for (int64_t i = 0; i < h; i += 13)
        check("pool", of[sq * h + i], v[i] / std::sqrt(ss), 1e-5, 1e-3);
    }
    const double bytes = kind == PoolKind::kMean ? t * h * 2.0 : ns * h * 2.0;
    char shape[64];
    std::snprintf(shape, sizeof(shape), "T=%ld H=1024 %d seqs", static_cast<long>(t), ns);
    const char* name = kind == PoolKind::kLast                     ? "pool_last"
                       : variant == PoolVariant::kBlockPerSequence ? "pool_mean_block"
                                                                   : "pool_mean_cluster";
    reportBw(name, shape, timeIt(run, sets), bytes + ns * h * 4.0);
  }
}

// Times the two policies and each forced variant on the same inputs; every one after narrow16 is
// also checked bit-equal to narrow16.
void benchAttention(int nseq, int len, bool causal) {
  const int hq = 16, hkv = 8, d = 128;
  const int64_t t = static_cast<int64_t>(nseq) * len, width = (hq + 2 * hkv) * d;
  std::vector<int32_t> cu(nseq + 1);
  for (int i = 0; i <= nseq; ++i) cu[i] = i * len;
  Dev dcu(cu.size() * 4);
  CK(cudaMemcpy(dcu.p, cu.data(), dcu.bytes, cudaMemcpyHostToDevice));
  const int sets = setsFor(t * width * 2 + t * hq * d * 2);
  std::vector<std::unique_ptr<Dev>> q, o;
  std::vector<float> q0;
  for (int s = 0; s < sets; ++s) {
    q.push_back(std::make_unique<Dev>(t * width * 2));
    o.push_back(std::make_unique<Dev>(t * hq * d * 2));
    auto f = fillBf16(*q[s], -2, 2);
    if (s == 0) q0 = f;
  }
  const float scale = 1.f / std::sqrt(128.f);
  struct Variant {
    const char* name;
    bool forced;  // run `variant`, else the size policy `policy`
    AttentionVariant variant;
    AttentionPolicy policy;
  };
  const Variant variants[] = {
      {"attn_narrow16", true, AttentionVariant::kNarrow16, AttentionPolicy::kAuto},
      {"attn_narrow64", true, AttentionVariant::kNarrow64, AttentionPolicy::kAuto},
      {"attn_wide64", true, AttentionVariant::kWide64, AttentionPolicy::kAuto},
      {"attn_wide128", true, AttentionVariant::kWide128, AttentionPolicy::kAuto},
      {"attention_auto", false, AttentionVariant::kNarrow16, AttentionPolicy::kAuto},
      {"attention_narrow", false, AttentionVariant::kNarrow16, AttentionPolicy::kNarrow},
      // The Hopper kernel (attention_sm90.cuh): not bit-identical, checked within bf16 rounding.
      {"attn_sm90", true, AttentionVariant::kSm90, AttentionPolicy::kAuto},
      {"attn_sm90basic", true, AttentionVariant::kSm90Basic, AttentionPolicy::kAuto},
      {"attn_sm90cpasync", true, AttentionVariant::kSm90CpAsync, AttentionPolicy::kAuto},
      {"attention_sm90", false, AttentionVariant::kNarrow16, AttentionPolicy::kSm90},
  };
  for (const Variant& variant : variants) {
    auto run = [&](int s) {
      AttentionArgs a;
      a.qkv = q[s]->as<__nv_bfloat16>();
      a.cu_seqlens = dcu.as<int32_t>();
      a.out = o[s]->as<__nv_bfloat16>();
      a.num_tokens = t;
      a.num_seqs = nseq;
      a.num_q_heads = hq;
      a.num_kv_heads = hkv;
      a.head_dim = d;
      a.scale = scale;
      a.causal = causal;
      if (variant.forced) {
        OK(launchAttentionVariant(a, nullptr, variant.variant));
      } else {
        OK(launchAttention(a, nullptr, variant.policy));
      }
    };
    poison(*o[0]);
    run(0);
    auto of = readBf16(o[0]->p, t * hq * d);
    const bool sm90 = variant.policy == AttentionPolicy::kSm90 ||
                      (variant.forced && (variant.variant == AttentionVariant::kSm90 ||
                                          variant.variant == AttentionVariant::kSm90Basic ||
                                          variant.variant == AttentionVariant::kSm90CpAsync));
    if (sm90) {
      auto fired = attentionSm90WatchdogFired();
      if (!fired.isOk() || *fired) {
        std::printf("  CHECK FAILED %s: mbarrier watchdog fired (pipeline hang)\n", variant.name);
        ++g_failures;
      }
    }
    if (!variant.forced || variant.variant != AttentionVariant::kNarrow16) {
      // The mma.sync variants differ in schedule only: each must equal narrow16 bit for bit
      // everywhere; the sm90 ones within bf16 rounding.
      std::vector<__nv_bfloat16> got(static_cast<size_t>(t * hq * d)), ref(got.size());
      CK(cudaMemcpy(got.data(), o[0]->p, got.size() * 2, cudaMemcpyDeviceToHost));
      poison(*o[0]);
      AttentionArgs a;
      a.qkv = q[0]->as<__nv_bfloat16>();
      a.cu_seqlens = dcu.as<int32_t>();
      a.out = o[0]->as<__nv_bfloat16>();
      a.num_tokens = t;
      a.num_seqs = nseq;
      a.num_q_heads = hq;
      a.num_kv_heads = hkv;
      a.head_dim = d;
      a.scale = scale;
      a.causal = causal;
      OK(launchAttentionVariant(a, nullptr, AttentionVariant::kNarrow16));
      CK(cudaMemcpy(ref.data(), o[0]->p, ref.size() * 2, cudaMemcpyDeviceToHost));
      size_t diff = 0;
      double max_diff = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        if (!sm90) {
          diff += std::memcmp(&ref[i], &got[i], 2) != 0 ? 1 : 0;
          continue;
        }
        const double r = __bfloat162float(ref[i]), g = __bfloat162float(got[i]);
        const double e = std::fabs(g - r);
        max_diff = std::isfinite(e) ? std::max(max_diff, e) : INFINITY;
        diff += e <= 2e-2 + 4e-2 * std::fabs(r) ? 0 : 1;  // NaN counts
      }
      if (diff != 0) {
        std::printf("  CHECK FAILED %s != narrow16 on %zu of %zu outputs (max diff %g)\n",
                    variant.name, diff, ref.size(), max_diff);
        ++g_failures;
      }
    }
    // Sampled rows: (sequence 0, query len-1, head 3) and (last sequence, query len/2, head 14).
    for (auto [sq, qi, h] :
         std::vector<std::tuple<int, int, int>>{{0, len - 1, 3}, {nseq - 1, len / 2, 14}}) {
      const int64_t row = cu[sq] + qi;
      const int kvh = h / 2;
      const int end = causal ? qi + 1 : len;
      std::vector<double> sc(end);
      double mx = -1e30;
      for (int j = 0; j < end; ++j) {
        double dot = 0;
        for (int i = 0; i < d; ++i)
          dot += q0[row * width + h * d + i] * q0[(cu[sq] + j) * width + (hq + kvh) * d + i];
        sc[j] = dot * scale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0;
      for (auto& v : sc) {
        v = std::exp(v - mx);
        sum += v;
      }
      for (int i = 0; i < d; i += 9) {
        double acc = 0;
        for (int j = 0; j < end; ++j)
          acc += sc[j] * q0[(cu[sq] + j) * width + (hq + hkv + kvh) * d + i];
        check("attention", of[row * hq * d + h * d + i], acc / sum, 1e-2, 2e-2);
      }
    }
    const double pairs = causal ? nseq * (static_cast<double>(len) * (len + 1) / 2)
                                : nseq * static_cast<double>(len) * len;
    const double flops = 4.0 * pairs * hq * d;
    char shape[64];
    std::snprintf(shape, sizeof(shape), "%s %dx%d Hq16 Hkv8 D128", causal ? "causal" : "bidir",
                  nseq, len);
    reportFlops(variant.name, shape, timeIt(run, sets, 40), flops);
  }
}

void benchGemm(GemmRunner& g, int64_t m, int64_t n, int64_t k, const char* name,
               const char* tag = "") {
  Dev w(n * k * 2);
  auto wf = fillBf16(w, -0.05f, 0.05f);
  const int sets = setsFor(m * k * 2 + m * n * 2 + n * k * 2);
  std::vector<std::unique_ptr<Dev>> x, y;
  std::vector<float> x0;
  for (int s = 0; s < sets && s < 8; ++s) {
    x.push_back(std::make_unique<Dev>(m * k * 2));
    y.push_back(std::make_unique<Dev>(m * n * 2));
    auto f = fillBf16(*x[s], -1, 1);
    if (s == 0) x0 = f;
  }
  const int used = static_cast<int>(x.size());
  auto run = [&](int s) {
    OK(g.run(x[s]->as<__nv_bfloat16>(), w.as<__nv_bfloat16>(), nullptr, y[s]->as<__nv_bfloat16>(),
             m, n, k, nullptr));
  };
  poison(*y[0]);
  run(0);
  auto yf = readBf16(y[0]->p, m * n);
  for (auto [i, j] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 0}, {m - 1, n - 1}, {m / 3, n / 2}, {7, n - 5}}) {
    double acc = 0;
    for (int64_t kk = 0; kk < k; ++kk) acc += static_cast<double>(x0[i * k + kk]) * wf[j * k + kk];
    check("gemm", yf[i * n + j], acc, 2e-3 + 1e-2 * std::fabs(acc), 1e-2);
  }
  char shape[64];
  std::snprintf(shape, sizeof(shape), "M=%ld N=%ld K=%ld%s", static_cast<long>(m),
                static_cast<long>(n), static_cast<long>(k), tag);
  reportFlops(name, shape, timeIt(run, used, 30), 2.0 * m * n * k);
}

// [TAG_EMBED_FP8] FP8 e4m3 GEMMs on the Qwen3 layer shapes through cuBLASLt, three scalings side by
// side with the bf16 runner: "block" (weights one f32 scale per 128x128 block, activations one per
// row and 128 inputs: BLK128x128_32F / VEC128_32F, the recipe), "outer" (one scale per
// output channel and one per token: OUTER_VEC_32F on both) and "tensor" (one scale each: SCALAR_32F,
// the speed-of-light of FP8 on this cuBLASLt). Operands quantized on the host; a sampled check
// against the f64 product of the dequantized operands before timing. Each of cuBLASLt's heuristic
// candidates (up to 8) is timed; the best and the first are reported.
enum class Fp8Scaling { kBlock, kOuter, kTensor };

void benchGemmFp8(cublasLtHandle_t lt, int64_t m, int64_t n, int64_t k, const char* name,
                  Fp8Scaling mode) {
  const int64_t kb = fp8KBlocks(k), kb4 = fp8KBlocks4(k), nb = fp8RowBlocks(n);
  std::normal_distribution<float> nd(0.f, 1.f);
  // Host operands: w ~ N(0, 0.03) (a trained projection's scale), x ~ N(0, 1) (a normed row).
  std::vector<float> wf(static_cast<size_t>(n * k)), xf(static_cast<size_t>(m * k));
  for (auto& v : wf) v = bf(0.03f * nd(g_rng));
  for (auto& v : xf) v = bf(nd(g_rng));
  // Scales and codes.
  std::vector<float> ws, xs;
  std::vector<uint8_t> wq(wf.size()), xq(xf.size());
  auto wScale = [&](int64_t r, int64_t c) -> float& {
    if (mode == Fp8Scaling::kBlock) return ws[static_cast<size_t>(fp8WeightScaleIndex(k, r / 128, c / 128))];
    if (mode == Fp8Scaling::kOuter) return ws[static_cast<size_t>(r)];
    return ws[0];
  };
  auto xScale = [&](int64_t r, int64_t c) -> float& {
    if (mode == Fp8Scaling::kBlock) return xs[static_cast<size_t>(fp8ActScaleIndex(k, 0, m, r, c / 128))];
    if (mode == Fp8Scaling::kOuter) return xs[static_cast<size_t>(r)];
    return xs[0];
  };
  ws.assign(mode == Fp8Scaling::kBlock ? nb * kb4 : mode == Fp8Scaling::kOuter ? n : 1, 0.f);
  xs.assign(mode == Fp8Scaling::kBlock ? m * kb : mode == Fp8Scaling::kOuter ? m : 1, 0.f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) wScale(r, c) = std::max(wScale(r, c), std::fabs(wf[r * k + c]));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c) xScale(r, c) = std::max(xScale(r, c), std::fabs(xf[r * k + c]));
  for (auto& s : ws) s = s > 0 ? s / kFp8E4m3Max : 1.f;
  for (auto& s : xs) s = s > 0 ? s / kFp8E4m3Max : 1.f;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) wq[r * k + c] = fp8E4m3FromFloat(wf[r * k + c] / wScale(r, c));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c) xq[r * k + c] = fp8E4m3FromFloat(xf[r * k + c] / xScale(r, c));
  const int sets = std::min(8, setsFor(m * k + m * n * 2 + n * k));
  Dev w(wq.size()), wsd(ws.size() * 4 + 16);
  CK(cudaMemcpy(w.p, wq.data(), wq.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(wsd.p, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
  std::vector<std::unique_ptr<Dev>> x, xsd, y;
  for (int s = 0; s < sets; ++s) {
    x.push_back(std::make_unique<Dev>(xq.size()));
    xsd.push_back(std::make_unique<Dev>(xs.size() * 4 + 16));
    y.push_back(std::make_unique<Dev>(m * n * 2));
    CK(cudaMemcpy(x[s]->p, xq.data(), xq.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(xsd[s]->p, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
  }
  Dev work(size_t{32} << 20);
  // cuBLASLt "TN": D [n x m] = op(A) W [n x k] . B X [k x m], column-major = row-major y[m][n].
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  auto LT = [](cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "%s: cublas status %d\n", what, static_cast<int>(s));
      std::exit(1);
    }
  };
  LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "ta");
  LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "tb");
  const int32_t mode_a = mode == Fp8Scaling::kBlock   ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                         : mode == Fp8Scaling::kOuter ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                                      : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  const int32_t mode_b = mode == Fp8Scaling::kBlock   ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                         : mode == Fp8Scaling::kOuter ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                                      : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a),
     "amode");
  LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b),
     "bmode");
  auto setScales = [&](int s) {
    const void* sa = wsd.p;
    const void* sb = xsd[s]->p;
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa),
       "sa");
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb),
       "sb");
  };
  LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, k), "la");
  LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, m, k), "lb");
  LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, m, n), "ld");
  setScales(0);
  cublasLtMatmulPreference_t pref = nullptr;
  LT(cublasLtMatmulPreferenceCreate(&pref), "pref");
  uint64_t wsb = work.bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                       sizeof wsb);
  cublasLtMatmulHeuristicResult_t res[8] = {};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  const char* mname = mode == Fp8Scaling::kBlock   ? "fp8 block"
                      : mode == Fp8Scaling::kOuter ? "fp8 outer"
                                                   : "fp8 tensor";
  char shape[64];
  std::snprintf(shape, sizeof(shape), "M=%ld N=%ld K=%ld %s", static_cast<long>(m),
                static_cast<long>(n), static_cast<long>(k), mname);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    std::printf("%-14s %-34s no algorithm (status %d)\n", name, shape, static_cast<int>(hs));
  } else {
    const float alpha = 1.f, beta = 0.f;
    double best = 1e9, first = 0;
    int best_i = -1, checked = 0;
    for (int i = 0; i < found; ++i) {
      if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
      auto run = [&](int s) {
        setScales(s);
        LT(cublasLtMatmul(lt, desc, &alpha, w.p, la, x[s]->p, lb, &beta, y[s]->p, ld, y[s]->p, ld,
                          &res[i].algo, work.p, work.bytes, nullptr),
           "matmul");
      };
      if (checked++ == 0) {  // the first candidate's numbers against the dequantized product
        poison(*y[0]);
        run(0);
        CK(cudaDeviceSynchronize());
        auto yf = readBf16(y[0]->p, m * n);
        double err2 = 0, ref2 = 0, qerr2 = 0;
        for (int t = 0; t < 64; ++t) {
          const int64_t r = (t * 7919) % m, c = (t * 104729) % n;
          double acc = 0, exact = 0;
          for (int64_t kk = 0; kk < k; ++kk) {
            acc += static_cast<double>(fp8E4m3ToFloat(wq[c * k + kk])) * wScale(c, kk) *
                   fp8E4m3ToFloat(xq[r * k + kk]) * xScale(r, kk);
            exact += static_cast<double>(wf[c * k + kk]) * xf[r * k + kk];
          }
          check("gemm_fp8", yf[r * n + c], acc, 1e-3, 1e-2);
          err2 += (yf[r * n + c] - acc) * (yf[r * n + c] - acc);
          qerr2 += (acc - exact) * (acc - exact);
          ref2 += exact * exact;
        }
        std::printf("  %s %s: rel. L2 vs dequantized %.2e, quantized vs bf16 product %.2e\n", name,
                    shape, std::sqrt(err2 / ref2), std::sqrt(qerr2 / ref2));
      }
      const double t = timeIt(run, sets, 30);
      if (i == 0) first = t;
      if (t < best) best = t, best_i = i;
    }
    reportFlops(name, shape, best, 2.0 * m * n * k);
    std::printf("  (candidate %d of %d; the first %.1f us)\n", best_i, found, first * 1e6);
  }
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
}

void benchGemmFp8All() {
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  auto g = GemmRunner::create();
  if (!g.isOk()) std::exit(1);
  for (int64_t m : {512, 2048, 8192, 16384}) {
    for (auto [n, k, name] : {std::tuple<int64_t, int64_t, const char*>{4096, 1024, "gemm_qkv"},
                              {1024, 2048, "gemm_o"},
                              {6144, 1024, "gemm_gate_up"},
                              {1024, 3072, "gemm_down"}}) {
      benchGemm(**g, m, n, k, name, " bf16 tuned");
      for (Fp8Scaling s : {Fp8Scaling::kBlock, Fp8Scaling::kOuter, Fp8Scaling::kTensor})
        benchGemmFp8(lt, m, n, k, name, s);
    }
  }
  cublasLtDestroy(lt);
}

// Few tokens, weights cold: a 128 MB memset (over 2x the L2) before each timed launch.
// The few-token GEMMs side by side on Qwen3-0.6B's linears: GemmRunner with cuBLASLt alone, with
// the small-M kernel and with the Hopper kernel [TAG_GEMM_WG] among the candidates, and each
// custom configuration launched directly; each checked on fresh inputs first. Three times per row:
// "cold", one launch after an L2-clearing memset (the tuner's view), and "chain", the per-GEMM
// time of 32 launches back to back in a CUDA graph over enough copies of the weights that they
// stream from HBM (a forward's view: launch latency hidden, weights cold), and "hot", the same chain
// over one copy that stays in L2 (the ceiling of any prefetch into L2).
void benchSmallM() {
  Dev flush(size_t{128} << 20);
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaStream_t s = nullptr;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // run(copy, stream): one GEMM reading weight copy `copy`.
  using Run = std::function<void(int, cudaStream_t)>;
  auto timeCold = [&](const Run& run) {
    constexpr int kReps = 25;
    for (int i = 0; i < 3; ++i) run(0, s);
    std::vector<float> ms(kReps);
    for (int r = 0; r < kReps; ++r) {
      CK(cudaMemsetAsync(flush.p, r & 0xff, flush.bytes, s));
      CK(cudaEventRecord(e0, s));
      run(0, s);
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    std::sort(ms.begin(), ms.end());
    return ms[kReps / 2] * 1e-3;
  };
  auto timeChain = [&](const Run& run, int copies) {
    constexpr int kChain = 32, kReps = 7;
    for (int c = 0; c < copies; ++c) run(c, s);  // outside the capture: tuning, smem limits
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kChain; ++i) run(i % copies, s);
    cudaGraph_t graph = nullptr;
    CK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec = nullptr;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphDestroy(graph));
    CK(cudaGraphLaunch(exec, s));
    std::vector<float> ms(kReps);
    for (int r = 0; r < kReps; ++r) {
      CK(cudaEventRecord(e0, s));
      CK(cudaGraphLaunch(exec, s));
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    CK(cudaGraphExecDestroy(exec));
    std::sort(ms.begin(), ms.end());
    return ms[kReps / 2] * 1e-3 / kChain;
  };
  auto lt = GemmRunner::create(size_t{32} << 20, true, 0);
  auto sm = GemmRunner::create(size_t{32} << 20, true, 1);
  auto wg = GemmRunner::create(size_t{32} << 20, true, 0);
  if (!lt.isOk() || !sm.isOk() || !wg.isOk()) std::exit(1);
  const bool have_wg = wgGemmAvailable();
  if (have_wg) OK((*wg)->setWgGemm(true, false));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("# hot: the chain over one weight copy, L2-resident (what any prefetch into L2 could reach)\n");
  std::printf("%-28s %-30s %9s %9s %8s %9s\n", "gemm", "shape", "cold us", "chain us", "GB/s",
              "hot us");
  for (int64_t m : {1, 64, 128, 256, 512}) {
    for (auto [n, k, name] : {std::tuple<int64_t, int64_t, const char*>{4096, 1024, "qkv"},
                              {1024, 2048, "o"},
                              {6144, 1024, "gate_up"},
                              {1024, 3072, "down"}}) {
      const size_t wbytes = static_cast<size_t>(n * k * 2);
      const int copies = static_cast<int>(std::min<size_t>(16, (size_t{96} << 20) / wbytes + 1));
      std::vector<std::unique_ptr<Dev>> ws;
      for (int c = 0; c < copies; ++c) ws.push_back(std::make_unique<Dev>(wbytes));
      Dev x(m * k * 2), y(m * n * 2);
      auto wf = fillBf16(*ws[0], -0.05f, 0.05f);
      for (int c = 1; c < copies; ++c) CK(cudaMemcpy(ws[c]->p, ws[0]->p, wbytes, cudaMemcpyDeviceToDevice));
      auto xf = fillBf16(x, -1, 1);
      auto verify = [&](const char* what) {
        auto yf = readBf16(y.p, m * n);
        for (auto [i, j] : std::vector<std::pair<int64_t, int64_t>>{
                 {0, 0}, {m - 1, n - 1}, {m / 3, n / 2}, {m / 2, n - 5}}) {
          double acc = 0;
          for (int64_t kk = 0; kk < k; ++kk) {
            acc += static_cast<double>(xf[i * k + kk]) * wf[j * k + kk];
          }
          check(what, yf[i * n + j], acc, 2e-3 + 1e-2 * std::fabs(acc), 1e-2);
        }
      };
      // Checked (the first copy), then timed both ways.
      auto measure = [&](const char* what, const Run& run) {
        poison(y);
        run(0, nullptr);
        CK(cudaDeviceSynchronize());
        verify(what);
        const double cold = timeCold(run), chain = timeChain(run, copies), hot = timeChain(run, 1);
        char shape[64];
        std::snprintf(shape, sizeof(shape), "%s M=%ld N=%ld K=%ld", name, static_cast<long>(m),
                      static_cast<long>(n), static_cast<long>(k));
        std::printf("%-28s %-30s %9.2f %9.2f %8.1f %9.2f\n", what, shape, cold * 1e6, chain * 1e6,
                    static_cast<double>(wbytes) / chain / 1e9, hot * 1e6);
      };
      for (auto [runner, what] : {std::pair<GemmRunner*, const char*>{lt->get(), "runner cublaslt-only"},
                                  {sm->get(), "runner +smallm"},
                                  {wg->get(), "runner +wg"}}) {
        if (runner == wg->get() && !have_wg) continue;
        measure(what, [&, runner = runner](int c, cudaStream_t st) {
          OK(runner->run(x.as<__nv_bfloat16>(), ws[c]->as<__nv_bfloat16>(), nullptr,
                         y.as<__nv_bfloat16>(), m, n, k, st));
        });
      }
      SmallMConfig cfgs[8] = {};
      const int nc = m <= kSmallMMaxRows ? smallMGemmCandidates(n, k, sms, cfgs) : 0;
      for (int i = 0; i < nc; ++i) {
        char what[40];
        std::snprintf(what, sizeof(what), "smallm tile%d split%d", cfgs[i].tile_n, cfgs[i].splits);
        measure(what, [&, cfg = cfgs[i]](int c, cudaStream_t st) {
          SmallMGemmArgs a;
          a.x = x.as<__nv_bfloat16>();
          a.w = ws[c]->as<__nv_bfloat16>();
          a.y = y.as<__nv_bfloat16>();
          a.m = m;
          a.n = n;
          a.k = k;
          a.splits = cfg.splits;
          a.tile_n = cfg.tile_n;
          OK(launchSmallMGemm(a, st));
        });
      }
      // [TAG_GEMM_WG] every configuration the tuner would time for this M, plain and programmatic.
      WgGemmConfig wcfgs[8] = {};
      const int nw = have_wg && m >= 64 && m <= kWgGemmMaxRows
                         ? wgGemmCandidates(GemmRunner::algoBucket(m), n, k, sms, wcfgs)
                         : 0;
      for (int i = 0; i < nw; ++i) {
        for (bool pdl : {false, true}) {
          char what[48];
          std::snprintf(what, sizeof(what), "wg s%d wg%d t%d%s", wcfgs[i].splits,
                        wcfgs[i].warpgroups, wcfgs[i].tok_tile, pdl ? " pdl" : "");
          measure(what, [&, cfg = wcfgs[i], pdl = pdl](int c, cudaStream_t st) {
            WgGemmArgs a;
            a.x = x.as<__nv_bfloat16>();
            a.w = ws[c]->as<__nv_bfloat16>();
            a.y = y.as<__nv_bfloat16>();
            a.m = m;
            a.n = n;
            a.k = k;
            a.splits = cfg.splits;
            a.warpgroups = cfg.warpgroups;
            a.tok_tile = cfg.tok_tile;
            a.pdl = pdl;
            OK(launchWgGemm(a, st));
          });
        }
      }
    }
  }
  std::printf("# small-M kernel won %zu of %zu tuned buckets; the Hopper kernel %zu of %zu\n",
              (*sm)->smallMWins(), (*sm)->tunedShapes(), (*wg)->wgWins(), (*wg)->tunedShapes());
  if (have_wg) {
    auto fired = wgGemmWatchdogFired();
    if (!fired.isOk() || *fired) {
      std::printf("FAIL gemm_wg watchdog fired\n");
      ++g_failures;
    }
  }
  CK(cudaStreamDestroy(s));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace garden::rose::cuda

int main(int argc, char** argv) {
  using namespace garden::rose::cuda;
  // `rose_kernel_bench gemm_smallm` runs only the few-token GEMM comparison (cuBLASLt, the small-M
  // kernel, the Hopper kernel).
  const bool only_smallm = argc > 1 && std::strcmp(argv[1], "gemm_smallm") == 0;
  // `rose_kernel_bench attention` runs only the attention comparison.
  const bool only_attention = argc > 1 && std::strcmp(argv[1], "attention") == 0;
  // `rose_kernel_bench gemm_fp8` runs only the FP8 scalings against the bf16 runner.
  const bool only_fp8 = argc > 1 && std::strcmp(argv[1], "gemm_fp8") == 0;
  // `rose_kernel_bench elementwise` runs only the embedding gather, RMSNorm, QK-norm + RoPE and
  // SwiGLU.
  const bool only_elementwise = argc > 1 && std::strcmp(argv[1], "elementwise") == 0;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# rose kernel bench on %s (%d SMs, L2 %d MB)\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  measureCopyBw();
  std::printf("%-14s %-34s %12s %16s\n", "kernel", "shape", "median", "rate");
  if (only_fp8) {
    benchGemmFp8All();
    std::printf("# correctness checks failed: %d\n", g_failures);
    return g_failures == 0 ? 0 : 2;
  }
  if (only_smallm) {
    benchSmallM();
    std::printf("# correctness checks failed: %d\n", g_failures);
    return g_failures == 0 ? 0 : 2;
  }
  // Attention: both policies and every variant side by side, each mma.sync one checked bit-equal
  // to narrow16, the sm90 ones within bf16 rounding of it.
  const std::tuple<int, int, bool> shapes[] = {
      {16, 512, true},  {4, 2048, true},  {8, 1024, false}, {64, 128, true},  {1, 128, true},
      {1, 512, true},   {1, 2048, true},  {1, 4096, true},  {4, 1024, true},  {100, 512, true},
      {1, 512, false},  {1, 1024, true},  {1, 1024, false}, {1, 4096, false}, {4, 4096, false}};
  if (only_attention) {
    for (auto [n, len, causal] : shapes) benchAttention(n, len, causal);
    std::printf("# correctness checks failed: %d\n", g_failures);
    return g_failures == 0 ? 0 : 2;
  }
  benchEmbedding();
  benchRmsNorm();
  benchQkNormRope();
  benchSwiglu();
  if (only_elementwise) {
    std::printf("# correctness checks failed: %d\n", g_failures);
    return g_failures == 0 ? 0 : 2;
  }
  benchPool(16, 8192);
  benchPool(1, 4096);
  benchPool(100, 51200);
  for (auto [n, len, causal] : shapes) benchAttention(n, len, causal);
  auto g = GemmRunner::create();
  if (!g.isOk()) {
    std::fprintf(stderr, "%s\n", g.status().toString().c_str());
    return 1;
  }
  benchGemm(**g, 8192, 4096, 1024, "gemm_qkv");
  benchGemm(**g, 8192, 1024, 2048, "gemm_o");
  benchGemm(**g, 8192, 6144, 1024, "gemm_gate_up");
  benchGemm(**g, 8192, 1024, 3072, "gemm_down");
  benchGemm(**g, 8192, 8192, 8192, "gemm_square");
  // Few tokens (weight-bandwidth bound): the heuristic's untimed pick (GARDEN_GEMM_TUNE=0) against
  // the choice timed per M bucket (gemm.h), on the Qwen3-0.6B layer shapes.
  auto heur = GemmRunner::create(size_t{32} << 20, false);
  auto tuned = GemmRunner::create(size_t{32} << 20, true);
  if (!heur.isOk() || !tuned.isOk()) return 1;
  for (int64_t m : {128, 512}) {
    for (auto [n, k, name] : {std::tuple<int64_t, int64_t, const char*>{4096, 1024, "gemm_qkv"},
                              {1024, 2048, "gemm_o"},
                              {6144, 1024, "gemm_gate_up"},
                              {1024, 3072, "gemm_down"}}) {
      benchGemm(**heur, m, n, k, name, " heur");
      benchGemm(**tuned, m, n, k, name, " tuned");
    }
  }
  benchSmallM();
  CK(cudaDeviceSynchronize());
  std::printf("# correctness checks failed: %d\n", g_failures);
  return g_failures == 0 ? 0 : 2;
}
