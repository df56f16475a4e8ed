#include "services/rose/ops/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "services/rose/ops/cpu/gemm.h"
#include "common/thread_pool.h"

namespace garden::rose::cpu {
namespace {

// ---------------------------------------------------------------------------------------------
// Vector helpers (GCC vector extensions; 8 floats per vector). They are always inlined into
// their callers, so the 32-byte-vector ABI note (-Wpsabi) does not apply to any real call.
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float V8 __attribute__((vector_size(32)));

__attribute__((always_inline)) inline V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
__attribute__((always_inline)) inline void store8(float* p, const V8& v) {
  std::memcpy(p, &v, sizeof(v));
}
__attribute__((always_inline)) inline float hsum(const V8& v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// Not under ASan or TSan: the clones' ifunc resolver runs while the dynamic loader relocates rose,
// before the sanitizer runtime is initialized, and an instrumented resolver crashes there (under
// TSan every rose died with SIGSEGV in axpy's resolver before main).
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define GARDEN_CPU_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define GARDEN_CPU_CLONES
#endif

GARDEN_CPU_CLONES
float dot(const float* a, const float* b, int64_t n) {
  V8 acc0 = {}, acc1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 += load8(a + i) * load8(b + i);
    acc1 += load8(a + i + 8) * load8(b + i + 8);
  }
  for (; i + 8 <= n; i += 8) acc0 += load8(a + i) * load8(b + i);
  float s = hsum(acc0 + acc1);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += alpha * x
GARDEN_CPU_CLONES
void axpy(float alpha, const float* x, float* y, int64_t n) {
  V8 va = {alpha, alpha, alpha, alpha, alpha, alpha, alpha, alpha};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8(y + i, load8(y + i) + va * load8(x + i));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

float silu(float x) { return x / (1.f + std::exp(-x)); }

// ---------------------------------------------------------------------------------------------

class CpuEvent final : public Event {
 public:
  explicit CpuEvent(class CpuBackend* b) : backend_(b) {}
  bool query() override;
  Status wait() override;
  uint64_t target = 0;

 private:
  class CpuBackend* backend_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& opts)
      : pool_(opts.threads > 0
                  ? opts.threads
                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {
    initBlas();
    // Test-only knobs [TAG_STEP_PROGRESS], read once here (integration tests of tulip's stuck
    // detection set them in the environment of the rose they spawn): every markProgress() first
    // sleeps GARDEN_CPU_TEST_MARK_DELAY_MS (a slow step that keeps progressing), and the
    // GARDEN_CPU_TEST_HANG_AT_MARK-th markProgress() never returns (a compute that hangs).
    if (const char* e = std::getenv("GARDEN_CPU_TEST_MARK_DELAY_MS"); e != nullptr && *e != 0) {
      test_mark_delay_ms_ = std::max(0L, std::strtol(e, nullptr, 10));
    }
    if (const char* e = std::getenv("GARDEN_CPU_TEST_HANG_AT_MARK"); e != nullptr && *e != 0) {
      test_hang_at_mark_ = std::max(0L, std::strtol(e, nullptr, 10));
    }
    // Attention scores: one [kAttnQueryBlock, longest sequence] tile per pool worker, grown on
    // first use (sized by the longest sequence a batch actually has, not max_batch_tokens).
    scratch_.resize(static_cast<size_t>(pool_.size()));
    compute_ = std::thread([this] { computeLoop(); });
  }

  ~CpuBackend() override {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    cv_work_.notifyAll();
    compute_.join();
  }

  std::string_view name() const override { return "cpu"; }
  DType weightDType() const override { return DType::kF32; }
  DType activationDType() const override { return DType::kF32; }
  DType residualDType() const override { return DType::kF32; }

  Result<Buffer> allocate(size_t bytes) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded);
    if (p == nullptr) {
      return resourceExhausted("cpu backend: cannot allocate " + std::to_string(bytes) + " bytes");
    }
    return Buffer(this, p, bytes);
  }

  Status uploadConvert(const Tensor& dst, const HostView& src) override {
    if (dst.numel() != src.numel) {
      return invalidArgument("uploadConvert: element count mismatch (" +
                             std::to_string(dst.numel()) + " vs " + std::to_string(src.numel) +
                             ")");
    }
    syncIfForeign();
    if (dst.dtype == DType::kF32) {
      return convertToF32(src.data, src.dtype, static_cast<size_t>(src.numel), dst.as<float>());
    }
    if (dst.dtype == src.dtype) {
      std::memcpy(dst.data, src.data, dst.bytes());
      return okStatus();
    }
    return invalidArgument("uploadConvert: cannot convert " + std::string(dtypeName(src.dtype)) +
                           " to " + std::string(dtypeName(dst.dtype)) + " on cpu");
  }

  void launch(std::function<void()> work) override EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      queue_.push_back(std::move(work));
      ++enqueued_;
    }
    cv_work_.notifyOne();
  }

  Result<std::unique_ptr<Event>> createEvent() override {
    return std::unique_ptr<Event>(std::make_unique<CpuEvent>(this));
  }

  Status recordEvent(Event& event) override EXCLUDES(mu_) {
    auto* e = dynamic_cast<CpuEvent*>(&event);
    if (e == nullptr) return invalidArgument("recordEvent: not a cpu event");
    MutexLock lock(mu_);
    e->target = enqueued_;
    return okStatus();
  }

  Status synchronize() override EXCLUDES(mu_) {
    if (std::this_thread::get_id() == compute_.get_id()) return okStatus();
    MutexLock lock(mu_);
    uint64_t target = enqueued_;
    cv_done_.wait(lock, [&]() REQUIRES(mu_) { return done_ >= target; });
    return okStatus();
  }

  bool reached(uint64_t target) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return done_ >= target;
  }
  void waitFor(uint64_t target) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    cv_done_.wait(lock, [&]() REQUIRES(mu_) { return done_ >= target; });
  }

  void copyToDevice(const Tensor& dst, const void* src, size_t bytes) override {
    syncIfForeign();
    CHECK(bytes <= dst.bytes());
    std::memcpy(dst.data, src, bytes);
  }
  void copyToHost(void* dst, const Tensor& src, size_t bytes) override {
    syncIfForeign();
    CHECK(bytes <= src.bytes());
    std::memcpy(dst, src.data, bytes);
  }

  // [TAG_KV_PULL_CUDA] On the queue, after what was launched before; the pairs are copied (the
  // caller's spans may not live that long).
  Status copyKvBlocks(const KvBlockCopy& c) override {
    if (c.block_bytes <= 0 || c.layers <= 0) return invalidArgument("kv block copy: empty geometry");
    KvBlockCopy own = c;
    own.pairs = own.window_pairs = {};  // the caller's; the copies below are used instead
    auto p = std::make_shared<std::vector<int32_t>>(c.pairs.begin(), c.pairs.end());
    auto w = std::make_shared<std::vector<int32_t>>(c.window_pairs.begin(), c.window_pairs.end());
    launch([own, p, w] {
      const auto bb = static_cast<size_t>(own.block_bytes);
      const auto* sk = static_cast<const std::byte*>(own.src_k);
      const auto* sv = static_cast<const std::byte*>(own.src_v);
      auto* dk = static_cast<std::byte*>(own.dst_k);
      auto* dv = static_cast<std::byte*>(own.dst_v);
      for (int32_t l = 0; l < own.layers; ++l) {
        const std::vector<int32_t>& lp = own.windowLayer(l) ? *w : *p;
        const size_t src_layer = static_cast<size_t>(own.layerBlockOffset(l, true)) * bb;
        const size_t dst_layer = static_cast<size_t>(own.layerBlockOffset(l, false)) * bb;
        for (size_t i = 0; i + 1 < lp.size(); i += 2) {
          const size_t so = src_layer + static_cast<size_t>(lp[i]) * bb;
          const size_t dof = dst_layer + static_cast<size_t>(lp[i + 1]) * bb;
          std::memcpy(dk + dof, sk + so, bb);
          std::memcpy(dv + dof, sv + so, bb);
        }
      }
    });
    return okStatus();
  }

  // ---- step progress [TAG_STEP_PROGRESS] ----
  void setProgressCounter(std::atomic<uint64_t>* counter) override {
    progress_.store(counter, std::memory_order_release);
  }
  bool reportsProgress() const override { return true; }
  void markProgress() override {
    syncIfForeign();
    if (test_mark_delay_ms_ > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(test_mark_delay_ms_));
    }
    if (test_hang_at_mark_ > 0 && ++marks_ == test_hang_at_mark_) {
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
    tick(progress());
  }
  // The counter, for the CPU LLM ops (which tick from their own pool's threads).
  std::atomic<uint64_t>* progress() const { return progress_.load(std::memory_order_acquire); }

  // ---- ops ----

  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    syncIfForeign();
    checkF32(table);
    checkF32(out);
    CHECK(ids.dtype == DType::kI32);
    const int64_t t_rows = ids.numel(), h = table.cols(), v = table.rows();
    CHECK(out.rows() == t_rows && out.cols() == h);
    const int32_t* id = ids.as<int32_t>();
    const float* tab = table.as<float>();
    float* o = out.as<float>();
    for (int64_t t = 0; t < t_rows; ++t) {
      CHECK(id[t] >= 0 && id[t] < v);
      std::memcpy(o + t * h, tab + static_cast<int64_t>(id[t]) * h, sizeof(float) * h);
    }
  }

  void rmsNorm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& out,
               const RmsNormParams& p) override {
    syncIfForeign();
    checkF32(x);
    checkF32(out);
    checkF32(weight);
    const int64_t t_rows = x.rows(), h = x.cols();
    CHECK(out.rows() == t_rows && out.cols() == h && weight.numel() == h);
    const bool has_res = !residual.empty();
    if (has_res) {
      checkF32(residual);
      CHECK(residual.rows() == t_rows && residual.cols() == h);
    }
    const float* xp = x.as<float>();
    float* rp = has_res ? residual.as<float>() : nullptr;
    const float* wp = weight.as<float>();
    float* op = out.as<float>();
    const float eps = p.eps;
    pool_.parallelFor(t_rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, h)),
                      [&](int64_t b, int64_t e, int) {
                        for (int64_t t = b; t < e; ++t) {
                          const float* src = xp + t * h;
                          if (has_res) {
                            float* r = rp + t * h;
                            if (p.residual_init) {
                              std::memcpy(r, src, sizeof(float) * static_cast<size_t>(h));
                            } else {
                              for (int64_t i = 0; i < h; ++i) r[i] += src[i];
                            }
                            src = r;
                          }
                          float ss = dot(src, src, h);
                          float inv = 1.f / std::sqrt(ss / static_cast<float>(h) + eps);
                          float* o = op + t * h;
                          for (int64_t i = 0; i < h; ++i) o[i] = wp[i] * (src[i] * inv);
                        }
                      });
  }

  void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) override {
    syncIfForeign();
    checkF32(x);
    checkF32(w);
    checkF32(y);
    const int64_t t_rows = x.rows(), k = x.cols(), n = w.rows();
    CHECK(w.cols() == k);
    CHECK(y.rows() == t_rows && y.cols() == n);
    const float* bp = nullptr;
    if (!bias.empty()) {
      checkF32(bias);
      CHECK(bias.numel() == n);
      bp = bias.as<float>();
    }
    parallelLinear(pool_, progress(), x.as<float>(), k, w.as<float>(), bp, y.as<float>(), n, t_rows,
                   n, k, row_invariant_.load(std::memory_order_relaxed));
  }
  void setRowInvariantLinear(bool on) override {  // [TAG_CPU_ROW_INVARIANT]
    row_invariant_.store(on, std::memory_order_relaxed);
  }

  void qkNormRope(const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                  const Tensor& positions, const Tensor& cos, const Tensor& sin,
                  const QkNormRopeParams& p) override {
    syncIfForeign();
    checkF32(qkv);
    checkF32(cos);
    checkF32(sin);
    CHECK(positions.dtype == DType::kI32);
    const int64_t d = p.head_dim, hq = p.num_q_heads, hkv = p.num_kv_heads;
    const int64_t width = (hq + 2 * hkv) * d;
    const int64_t t_rows = qkv.rows();
    CHECK(qkv.cols() == width && positions.numel() == t_rows);
    CHECK(p.rotary_dim % 2 == 0 && p.rotary_dim <= d);
    const int64_t half = p.rotary_dim / 2;
    CHECK(cos.cols() == half && sin.cols() == half);
    const int64_t max_pos = cos.rows();
    if (p.apply_norm) {
      checkF32(q_weight);
      checkF32(k_weight);
      CHECK(q_weight.numel() == d && k_weight.numel() == d);
    }
    float* base = qkv.as<float>();
    const int32_t* pos = positions.as<int32_t>();
    const float* cp = cos.as<float>();
    const float* sp = sin.as<float>();
    const float* qw = p.apply_norm ? q_weight.as<float>() : nullptr;
    const float* kw = p.apply_norm ? k_weight.as<float>() : nullptr;
    const float eps = p.eps;
    pool_.parallelFor(t_rows, 8, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) {
        CHECK(pos[t] >= 0 && pos[t] < max_pos);
        const float* c = cp + static_cast<int64_t>(pos[t]) * half;
        const float* s = sp + static_cast<int64_t>(pos[t]) * half;
        for (int64_t head = 0; head < hq + hkv; ++head) {
          float* v = base + t * width + head * d;
          if (qw != nullptr) {
            const float* wgt = head < hq ? qw : kw;
            float inv = 1.f / std::sqrt(dot(v, v, d) / static_cast<float>(d) + eps);
            for (int64_t i = 0; i < d; ++i) v[i] = wgt[i] * (v[i] * inv);
          }
          for (int64_t i = 0; i < half; ++i) {
            float x1 = v[i], x2 = v[i + half];
            v[i] = x1 * c[i] - x2 * s[i];
            v[i + half] = x2 * c[i] + x1 * s[i];
          }
        }
      }
    });
  }

  void attention(const Tensor& qkv, const Tensor& cu_seqlens, const Tensor& out,
                 const AttentionParams& p) override {
    syncIfForeign();
    checkF32(qkv);
    checkF32(out);
    CHECK(cu_seqlens.dtype == DType::kI32 && cu_seqlens.numel() == p.num_seqs + 1);
    const int64_t d = p.head_dim, hq = p.num_q_heads, hkv = p.num_kv_heads;
    CHECK(hkv > 0 && hq % hkv == 0);
    const int64_t group = hq / hkv;
    const int64_t width = (hq + 2 * hkv) * d;
    const int64_t t_rows = qkv.rows();
    CHECK(qkv.cols() == width && out.rows() == t_rows && out.cols() == hq * d);
    const int32_t* cu = cu_seqlens.as<int32_t>();
    CHECK(cu[0] == 0 && cu[p.num_seqs] == t_rows);
    const float* base = qkv.as<float>();
    float* op = out.as<float>();
    const float scale = p.scale;
    const bool causal = p.causal;
    // Tasks: (sequence, q head, block of kAttnQueryBlock queries). Each computes the block's
    // scores against the keys it may see (causal: up to its last query) with one GEMM, the
    // masked softmax in place, and its output rows with a second GEMM.
    attn_tasks_.clear();
    int64_t longest = 0;
    for (int32_t s = 0; s < p.num_seqs; ++s) {
      const int64_t len = cu[s + 1] - cu[s];
      CHECK(len >= 0);
      longest = std::max(longest, len);
      // Last (causal: costliest) blocks first, so the tasks handed out last are the cheap ones.
      for (int64_t q0 = (len - 1) / kAttnQueryBlock * kAttnQueryBlock; q0 >= 0 && len > 0;
           q0 -= kAttnQueryBlock) {
        for (int64_t h = 0; h < hq; ++h) attn_tasks_.push_back({s, static_cast<int32_t>(h), q0});
      }
    }
    const size_t tile = static_cast<size_t>(kAttnQueryBlock * longest);
    for (auto& sc : scratch_) {
      if (sc.size() < tile) sc.resize(tile);
    }
    std::atomic<uint64_t>* prog = progress();
    pool_.parallelTasks(static_cast<int64_t>(attn_tasks_.size()), [&](int64_t i, int worker) {
      float* scores = scratch_[static_cast<size_t>(worker)].data();
      const AttnTask& task = attn_tasks_[static_cast<size_t>(i)];
      const int64_t start = cu[task.seq], len = cu[task.seq + 1] - start;
      const int64_t h = task.head, kvh = h / group;
      const int64_t q0 = task.q0, rows = std::min(kAttnQueryBlock, len - q0);
      const int64_t keys = causal ? q0 + rows : len;  // columns of the score tile
      const float* q = base + (start + q0) * width + h * d;
      const float* k0 = base + start * width + (hq + kvh) * d;
      const float* v0 = base + start * width + (hq + hkv + kvh) * d;
      sgemm(rows, keys, d, scale, q, width, k0, width, /*b_transposed=*/true, 0.f, scores, keys);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = scores + r * keys;
        const int64_t visible = causal ? q0 + r + 1 : len;
        float mx = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, row[j]);
        float sum = 0.f;
        for (int64_t j = 0; j < visible; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.f / sum;
        for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
        std::fill(row + visible, row + keys, 0.f);  // masked: weight 0 in the second GEMM
      }
      sgemm(rows, d, keys, 1.f, scores, keys, v0, width, /*b_transposed=*/false, 0.f,
            op + (start + q0) * hq * d + h * d, hq * d);
      tick(prog);
    });
  }

  void swiglu(const Tensor& gate_up, const Tensor& out) override {
    syncIfForeign();
    checkF32(gate_up);
    checkF32(out);
    const int64_t t_rows = gate_up.rows(), inter = out.cols();
    CHECK(gate_up.cols() == 2 * inter && out.rows() == t_rows);
    const float* g = gate_up.as<float>();
    float* o = out.as<float>();
    pool_.parallelFor(t_rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, inter)),
                      [&](int64_t b, int64_t e, int) {
                        for (int64_t t = b; t < e; ++t) {
                          const float* gr = g + t * 2 * inter;
                          const float* ur = gr + inter;
                          float* orow = o + t * inter;
                          for (int64_t i = 0; i < inter; ++i) orow[i] = silu(gr[i]) * ur[i];
                        }
                      });
  }

  void pool(const Tensor& hidden, const Tensor& cu_seqlens, const Tensor& out,
            const PoolParams& p) override {
    syncIfForeign();
    checkF32(hidden);
    checkF32(out);
    CHECK(cu_seqlens.dtype == DType::kI32 && cu_seqlens.numel() == p.num_seqs + 1);
    const int64_t h = hidden.cols();
    CHECK(out.rows() == p.num_seqs && out.cols() == h);
    const int32_t* cu = cu_seqlens.as<int32_t>();
    const float* hp = hidden.as<float>();
    float* op = out.as<float>();
    for (int32_t s = 0; s < p.num_seqs; ++s) {
      const int64_t start = cu[s], end = cu[s + 1];
      CHECK(end > start && end <= hidden.rows());
      float* o = op + s * h;
      switch (p.mode) {
        case PoolMode::kLast:
          std::memcpy(o, hp + (end - 1) * h, sizeof(float) * h);
          break;
        case PoolMode::kCls:
          std::memcpy(o, hp + start * h, sizeof(float) * h);
          break;
        case PoolMode::kMean: {
          std::fill(o, o + h, 0.f);
          for (int64_t t = start; t < end; ++t) axpy(1.f, hp + t * h, o, h);
          const float inv = 1.f / static_cast<float>(end - start);
          for (int64_t i = 0; i < h; ++i) o[i] *= inv;
          break;
        }
      }
      if (p.normalize) {
        const float norm = std::sqrt(dot(o, o, h));
        const float inv = 1.f / std::max(norm, 1e-12f);
        for (int64_t i = 0; i < h; ++i) o[i] *= inv;
      }
    }
  }

  void score(const Tensor& hidden, const Tensor& cu_seqlens, const Tensor& head, const Tensor& out,
             const ScoreParams& p) override {
    syncIfForeign();
    checkF32(hidden);
    checkF32(head);
    checkF32(out);
    CHECK(cu_seqlens.dtype == DType::kI32 && cu_seqlens.numel() == p.num_seqs + 1);
    const int64_t h = hidden.cols();
    CHECK(head.cols() == h && out.numel() == p.num_seqs);
    CHECK(p.pos_row >= 0 && p.pos_row < head.rows() && p.neg_row < head.rows());
    const int32_t* cu = cu_seqlens.as<int32_t>();
    const float* hp = hidden.as<float>();
    const float* wp = head.as<float>();
    float* op = out.as<float>();
    for (int32_t s = 0; s < p.num_seqs; ++s) {
      CHECK(cu[s + 1] > cu[s] && cu[s + 1] <= hidden.rows());
      const float* last = hp + static_cast<int64_t>(cu[s + 1] - 1) * h;
      float z = dot(last, wp + static_cast<int64_t>(p.pos_row) * h, h);
      if (p.neg_row >= 0) z -= dot(last, wp + static_cast<int64_t>(p.neg_row) * h, h);
      op[s] = p.apply_sigmoid ? 1.f / (1.f + std::exp(-z)) : z;
    }
  }

 protected:
  void release(void* data, size_t bytes) override { std::free(data); }

 private:
  static void checkF32(const Tensor& t) { CHECK_MSG(t.dtype == DType::kF32, "cpu op wants F32"); }

  // Ops called from a thread other than the compute thread first wait for launched work, so
  // they run in order with it (see [TAG_ROSE_LAZY]).
  void syncIfForeign() {
    if (std::this_thread::get_id() != compute_.get_id()) (void)synchronize();
  }

  void computeLoop() EXCLUDES(mu_) {
    for (;;) {
      std::function<void()> work;
      {
        MutexLock lock(mu_);
        cv_work_.wait(lock, [&]() REQUIRES(mu_) { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      work();
      {
        MutexLock lock(mu_);
        ++done_;
      }
      cv_done_.notifyAll();
    }
  }

  // Attention work item (see attention()).
  struct AttnTask {
    int32_t seq;
    int32_t head;
    int64_t q0;
  };
  static constexpr int64_t kAttnQueryBlock = 128;

  ThreadPool pool_;
  std::vector<std::vector<float>> scratch_;  // per pool worker (attention score tiles)
  std::vector<AttnTask> attn_tasks_;         // compute thread only
  std::atomic<bool> row_invariant_{false};  // [TAG_CPU_ROW_INVARIANT] setRowInvariantLinear
  std::atomic<std::atomic<uint64_t>*> progress_{nullptr};  // [TAG_STEP_PROGRESS]
  long test_mark_delay_ms_ = 0;  // test-only knobs, see the constructor
  long test_hang_at_mark_ = 0;
  long marks_ = 0;  // markProgress() calls so far (compute thread)

  Mutex mu_;
  CondVar cv_work_;
  CondVar cv_done_;
  std::deque<std::function<void()>> queue_ GUARDED_BY(mu_);
  uint64_t enqueued_ GUARDED_BY(mu_) = 0;
  uint64_t done_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread compute_;
};

bool CpuEvent::query() { return backend_->reached(target); }
Status CpuEvent::wait() {
  backend_->waitFor(target);
  return okStatus();
}

}  // namespace

Result<std::unique_ptr<Backend>> create(const BackendOptions& opts) {
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(opts));
}

std::atomic<uint64_t>* progressCounter(Backend& backend) {
  auto* cpu = dynamic_cast<CpuBackend*>(&backend);
  return cpu != nullptr ? cpu->progress() : nullptr;
}

}  // namespace garden::rose::cpu

namespace garden::rose {
Result<std::unique_ptr<Backend>> makeCpuBackend(const BackendOptions& opts) {
  return cpu::create(opts);
}
}  // namespace garden::rose
