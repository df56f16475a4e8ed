#pragma once
// The CPU backend's matrix products, on OpenBLAS (Debian's libopenblas0-pthread; why OpenBLAS
// and not oneDNN: docs/cpu-backend.md). fp32 in, fp32 accumulate: the same arithmetic as the
// reference it replaced, in another summation order (well inside every tolerance that compares
// against the CPU backend: 1e-4 relative in the unit and conformance tests, ~1e-2 in tests/gpu).
//
// Threading: OpenBLAS runs single-threaded inside each call (initBlas() sets that once per
// process) and the work is split over the backend's own ThreadPool instead, so the two never
// oversubscribe the cores, and the split (hence every result bit) depends only on the shapes,
// never on the number of threads. Each task advances the step progress counter
// [TAG_STEP_PROGRESS] when it ends, so a long matmul shows progress every few tens of
// milliseconds.
//
// Threads: call from the thread that owns `pool` (the compute thread, or a test thread).

#include <atomic>
#include <cstdint>

#include "common/thread_pool.h"

namespace garden::rose::cpu {

// Makes OpenBLAS single-threaded (openblas_set_num_threads(1)); idempotent, thread-safe.
void initBlas();

// Advances `progress` by one when it is set (any thread).
inline void tick(std::atomic<uint64_t>* progress) {
  if (progress != nullptr) progress->fetch_add(1, std::memory_order_relaxed);
}

// One single-threaded product, row-major: c[m, n] (ldc) = alpha · a[m, k] (lda) · op(b) + beta·c,
// op(b) = b[n, k]ᵀ (ldb) when b_transposed, else b[k, n] (ldb).
void sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, bool b_transposed, float beta, float* c, int64_t ldc);

// y[t, n] (ldy) = x[t, k] (ldx) · w[n, k]ᵀ (+ bias[n] when not null), over `pool`: tasks of up to
// kLinearRowBlock rows by kLinearColBlock columns, one sgemm each, then `progress` advances. The
// blocks are fixed, so the result does not depend on the pool's size (a step gives the same bits
// whatever --threads is; tests compare a rose process with an in-process model bit for bit).
// row_invariant: every sgemm through sgemmRowInvariant (below), so a row's bits also do not
// depend on the other rows of the step.
inline constexpr int64_t kLinearRowBlock = 256;
inline constexpr int64_t kLinearColBlock = 256;
void parallelLinear(ThreadPool& pool, std::atomic<uint64_t>* progress, const float* x, int64_t ldx,
                    const float* w, const float* bias, float* y, int64_t ldy, int64_t t, int64_t n,
                    int64_t k, bool row_invariant = false);

// [TAG_CPU_ROW_INVARIANT] c[m, n] (ldc) = a[m, k] (lda) · b[n, k]ᵀ (ldb), in sgemm calls of
// exactly kInvariantRows rows (a last partial group is copied into zero-padded scratch, computed
// there and copied out), so that every row's bits depend only on its own values and on (n, k):
// never on m, nor on the row's place in the call, nor on the other rows. OpenBLAS does not give
// that by itself: it picks kernels by the call's row count and a row's place in its micro-tile,
// and measured on 2026-12-05 (OpenBLAS 0.3.21, DYNAMIC_ARCH) a row's bits differed between
// m = 1, 2, 4 ... 256 on every core type tried (Prescott — the fallback this project's Intel VMs
// get — Haswell, Zen, SkylakeX, Cooperlake), while every placement of a row in 8-row calls gave
// the same bits on all of them (16-row calls did not on Haswell / Zen). gpt-oss on the CPU uses
// it (Backend::setRowInvariantLinear): a sequence's sampled tokens must not depend on its batch.
// Costs throughput: 8-row calls reach ~1/3 of 256-row calls' GFLOP/s on Haswell kernels.
inline constexpr int64_t kInvariantRows = 8;
void sgemmRowInvariant(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                       int64_t ldb, float* c, int64_t ldc);

}  // namespace garden::rose::cpu
