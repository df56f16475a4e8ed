#include "services/rose/ops/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "common/status.h"

namespace garden::rose::cpu {

void initBlas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

void sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, bool b_transposed, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // BLAS leaves c untouched when k == 0 only if beta == 1: define it
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    }
    return;
  }
  CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && lda <= INT32_MAX &&
        ldb <= INT32_MAX && ldc <= INT32_MAX);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

void sgemmRowInvariant(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                       int64_t ldb, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  const int64_t full = m / kInvariantRows * kInvariantRows;
  for (int64_t r0 = 0; r0 < full; r0 += kInvariantRows) {
    sgemm(kInvariantRows, n, k, 1.f, a + r0 * lda, lda, b, ldb, /*b_transposed=*/true, 0.f,
          c + r0 * ldc, ldc);
  }
  const int64_t rest = m - full;
  if (rest == 0) return;
  // The last rows among zero rows (per thread: callers run this on pool workers).
  thread_local std::vector<float> sa, sc;
  sa.assign(static_cast<size_t>(kInvariantRows * k), 0.f);
  if (sc.size() < static_cast<size_t>(kInvariantRows * n)) sc.resize(static_cast<size_t>(kInvariantRows * n));
  for (int64_t r = 0; r < rest; ++r) {
    std::copy(a + (full + r) * lda, a + (full + r) * lda + k, sa.begin() + r * k);
  }
  sgemm(kInvariantRows, n, k, 1.f, sa.data(), k, b, ldb, /*b_transposed=*/true, 0.f, sc.data(), n);
  for (int64_t r = 0; r < rest; ++r) {
    std::copy(sc.begin() + r * n, sc.begin() + (r + 1) * n, c + (full + r) * ldc);
  }
}

void parallelLinear(ThreadPool& pool, std::atomic<uint64_t>* progress, const float* x, int64_t ldx,
                    const float* w, const float* bias, float* y, int64_t ldy, int64_t t, int64_t n,
                    int64_t k, bool row_invariant) {
  if (t <= 0 || n <= 0) return;
  // Fixed block sizes, never the pool's size: every task's sgemm shape (and so every result bit)
  // depends only on the problem's shape, whatever --threads is.
  const int64_t row_blocks = (t + kLinearRowBlock - 1) / kLinearRowBlock;
  const int64_t col_blocks = (n + kLinearColBlock - 1) / kLinearColBlock;
  const int64_t col_width = kLinearColBlock;
  pool.parallelTasks(row_blocks * col_blocks, [&](int64_t task, int) {
    const int64_t r0 = (task / col_blocks) * kLinearRowBlock;
    const int64_t rows = std::min(kLinearRowBlock, t - r0);
    const int64_t c0 = (task % col_blocks) * col_width;
    if (c0 >= n) return;
    const int64_t cols = std::min(col_width, n - c0);
    float* yt = y + r0 * ldy + c0;
    if (row_invariant) {
      sgemmRowInvariant(rows, cols, k, x + r0 * ldx, ldx, w + c0 * k, k, yt, ldy);
    } else {
      sgemm(rows, cols, k, 1.f, x + r0 * ldx, ldx, w + c0 * k, k, /*b_transposed=*/true, 0.f, yt,
            ldy);
    }
    if (bias != nullptr) {
      for (int64_t r = 0; r < rows; ++r) {
        float* row = yt + r * ldy;
        for (int64_t c = 0; c < cols; ++c) row[c] += bias[c0 + c];
      }
    }
    tick(progress);
  });
}

}  // namespace garden::rose::cpu
