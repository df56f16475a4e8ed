// OpenBLAS vs oneDNN sgemm on the four GEMM shapes of a Qwen3-0.6B layer (y = x·wᵀ; N×K =
// 4096×1024 qkv, 1024×2048 o, 6144×1024 gate_up, 1024×3072 down), the measurement behind the CPU
// backend's choice of OpenBLAS (docs/cpu-backend.md). Single-threaded (OpenBLAS set to one thread;
// run oneDNN with OMP_NUM_THREADS=1), timed in process CPU seconds so a shared machine distorts it
// less than wall time would. Correctness first: both libraries' results must agree to 1e-3
// relative on every shape.
//
//   rose_cpu_gemm_compare [M ...]        (default: 128 512 2048)
// Built only where libdnnl-dev is installed (it is not a dependency of the project).

#include <cblas.h>
#include <dnnl.h>
#include <time.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

double cpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ms;
  for (int i = 1; i < argc; ++i) ms.push_back(std::atoi(argv[i]));
  if (ms.empty()) ms = {128, 512, 2048};
  openblas_set_num_threads(1);
  const int shapes[4][2] = {{4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  int bad = 0;
  std::printf("| M | OpenBLAS GFLOP/cpu-s | oneDNN GFLOP/cpu-s |\n|---:|---:|---:|\n");
  for (int m : ms) {
    double flops = 0, t_blas = 0, t_dnnl = 0;
    for (const auto& s : shapes) {
      const int n = s[0], k = s[1];
      std::vector<float> x(static_cast<size_t>(m) * k), w(static_cast<size_t>(n) * k);
      std::vector<float> y1(static_cast<size_t>(m) * n), y2(y1.size());
      for (auto& v : x) v = u(rng);
      for (auto& v : w) v = u(rng);
      auto blas = [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.f, x.data(), k, w.data(),
                    k, 0.f, y1.data(), n);
      };
      auto dnnl = [&] {
        dnnl_sgemm('N', 'T', m, n, k, 1.f, x.data(), k, w.data(), k, 0.f, y2.data(), n);
      };
      blas();  // warm-up (and the results to compare)
      dnnl();
      for (size_t i = 0; i < y1.size(); ++i) {
        if (std::fabs(y1[i] - y2[i]) > 1e-3f * (1.f + std::fabs(y1[i]))) {
          ++bad;
          break;
        }
      }
      constexpr int kIters = 3;
      double t0 = cpuSeconds();
      for (int i = 0; i < kIters; ++i) blas();
      t_blas += (cpuSeconds() - t0) / kIters;
      t0 = cpuSeconds();
      for (int i = 0; i < kIters; ++i) dnnl();
      t_dnnl += (cpuSeconds() - t0) / kIters;
      flops += 2.0 * m * n * k;
    }
    std::printf("| %d | %.1f | %.1f |\n", m, flops / t_blas / 1e9, flops / t_dnnl / 1e9);
  }
  if (bad != 0) std::printf("MISMATCH on %d shapes\n", bad);
  return bad == 0 ? 0 : 2;
}
