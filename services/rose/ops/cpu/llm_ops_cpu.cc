#include "services/rose/ops/cpu/llm_ops_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "services/rose/ops/cpu/cpu_backend.h"
#include "services/rose/ops/cpu/gemm.h"
#include "common/thread_pool.h"
#include "services/rose/ops/sampler.h"

namespace garden::rose::cpu {
namespace {

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void checkF32(const Tensor& t) { CHECK_MSG(t.dtype == DType::kF32, "cpu llm op wants F32"); }
void checkI32(const Tensor& t) { CHECK_MSG(t.dtype == DType::kI32, "cpu llm op wants I32"); }

class CpuLlmOps final : public LlmOps {
 public:
  CpuLlmOps(Backend& backend, int threads) : backend_(backend), pool_(threads) {
    initBlas();
    scratch_.resize(static_cast<size_t>(pool_.size()));
  }

  void ropeKvWrite(const Tensor& qkv, const Tensor& positions, const Tensor& cos,
                   const Tensor& sin, const Tensor& slot_mapping, const Tensor& k_cache,
                   const Tensor& v_cache, const RopeKvParams& p) override {
    sync();
    checkF32(qkv);
    checkF32(k_cache);
    checkF32(v_cache);
    checkI32(slot_mapping);
    QkNormRopeParams rp;
    rp.num_q_heads = p.num_q_heads;
    rp.num_kv_heads = p.num_kv_heads;
    rp.head_dim = p.head_dim;
    rp.rotary_dim = p.rotary_dim;
    rp.apply_norm = false;
    if (p.rotary_dim > 0) backend_.qkNormRope(qkv, Tensor(), Tensor(), positions, cos, sin, rp);
    const int64_t d = p.head_dim, hq = p.num_q_heads, hkv = p.num_kv_heads;
    const int64_t width = (hq + 2 * hkv) * d;
    const int64_t t_rows = qkv.rows();
    CHECK(qkv.cols() == width && slot_mapping.numel() == t_rows);
    CHECK(k_cache.ndim == 4 && k_cache.dim(2) == hkv && k_cache.dim(3) == d);
    CHECK(v_cache.numel() == k_cache.numel());
    const int64_t slots = k_cache.dim(0) * k_cache.dim(1);
    const int32_t* sm = slot_mapping.as<int32_t>();
    const float* src = qkv.as<float>();
    float* kc = k_cache.as<float>();
    float* vc = v_cache.as<float>();
    const size_t row_bytes = sizeof(float) * static_cast<size_t>(hkv * d);
    for (int64_t t = 0; t < t_rows; ++t) {
      const int64_t slot = sm[t];
      CHECK(slot >= 0 && slot < slots);
      std::memcpy(kc + slot * hkv * d, src + t * width + hq * d, row_bytes);
      std::memcpy(vc + slot * hkv * d, src + t * width + (hq + hkv) * d, row_bytes);
    }
  }

  void pagedAttention(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                      const Tensor& cu_q, const Tensor& positions, const Tensor& block_tables,
                      const Tensor& sinks, const Tensor& out,
                      const PagedAttentionParams& p) override {
    sync();
    checkF32(qkv);
    checkF32(k_cache);
    checkF32(v_cache);
    checkF32(out);
    checkI32(cu_q);
    checkI32(positions);
    checkI32(block_tables);
    const int64_t d = p.head_dim, hq = p.num_q_heads, hkv = p.num_kv_heads, bs = p.block_size;
    CHECK(hkv > 0 && hq % hkv == 0 && bs > 0);
    const int64_t group = hq / hkv;
    const int64_t width = (hq + 2 * hkv) * d;
    const int64_t t_rows = qkv.rows();
    CHECK(qkv.cols() == width && out.rows() == t_rows && out.cols() == hq * d);
    CHECK(positions.numel() == t_rows && cu_q.numel() == p.num_seqs + 1);
    CHECK(block_tables.numel() >= static_cast<int64_t>(p.num_seqs) * p.max_blocks_per_seq);
    CHECK(k_cache.ndim == 4 && k_cache.dim(1) == bs && k_cache.dim(2) == hkv &&
          k_cache.dim(3) == d);
    const bool has_sinks = !sinks.empty();
    if (has_sinks) {
      checkF32(sinks);
      CHECK(sinks.numel() == hq);
    }
    const int64_t num_blocks = k_cache.dim(0);
    const int32_t* cu = cu_q.as<int32_t>();
    CHECK(cu[0] == 0 && cu[p.num_seqs] == t_rows);
    const int32_t* pos = positions.as<int32_t>();
    const int32_t* bt = block_tables.as<int32_t>();
    const float* base = qkv.as<float>();
    const float* kc = k_cache.as<float>();
    const float* vc = v_cache.as<float>();
    const float* sk = has_sinks ? sinks.as<float>() : nullptr;
    float* op = out.as<float>();
    int64_t longest = p.max_context;
    for (int64_t t = 0; t < t_rows; ++t) longest = std::max<int64_t>(longest, pos[t] + 1);
    for (auto& sc : scratch_) {
      if (static_cast<int64_t>(sc.size()) < longest) sc.resize(static_cast<size_t>(longest));
    }
    const float scale = p.scale;
    const int64_t window = p.sliding_window;
    std::atomic<uint64_t>* prog = progressCounter(backend_);  // [TAG_STEP_PROGRESS]
    pool_.parallelFor(t_rows * hq, 4, [&](int64_t b, int64_t e, int worker) {
      float* scores = scratch_[static_cast<size_t>(worker)].data();
      for (int64_t item = b; item < e; ++item) {
        if ((item - b) % 64 == 63) tick(prog);
        const int64_t t = item / hq, h = item % hq, g = h / group;
        const int64_t seq =
            std::upper_bound(cu, cu + p.num_seqs + 1, static_cast<int32_t>(t)) - cu - 1;
        const int32_t* table = bt + seq * p.max_blocks_per_seq;
        const int64_t i = pos[t];
        CHECK(i >= 0 && i / bs < p.max_blocks_per_seq);
        const int64_t lo = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
        const float* q = base + t * width + h * d;
        float mx = has_sinks ? sk[h] : -INFINITY;
        for (int64_t j = lo; j <= i; ++j) {
          const int64_t block = table[j / bs];
          CHECK(block >= 0 && block < num_blocks);
          const float* k = kc + ((block * bs + j % bs) * hkv + g) * d;
          const float s = dot(q, k, d) * scale;
          scores[j - lo] = s;
          mx = std::max(mx, s);
        }
        float sum = has_sinks ? std::exp(sk[h] - mx) : 0.f;
        for (int64_t j = lo; j <= i; ++j) {
          scores[j - lo] = std::exp(scores[j - lo] - mx);
          sum += scores[j - lo];
        }
        const float inv = 1.f / sum;
        float* o = op + t * hq * d + h * d;
        std::fill(o, o + d, 0.f);
        for (int64_t j = lo; j <= i; ++j) {
          const int64_t block = table[j / bs];
          const float* v = vc + ((block * bs + j % bs) * hkv + g) * d;
          const float a = scores[j - lo] * inv;
          for (int64_t c = 0; c < d; ++c) o[c] += a * v[c];
        }
      }
    });
  }

  void moeRoute(const Tensor& router_logits, const Tensor& bias, const Tensor& topk_ids,
                const Tensor& topk_weights, const MoeRouteParams& p) override {
    sync();
    checkF32(router_logits);
    route(router_logits.as<float>(), router_logits.rows(), router_logits.cols(), bias, topk_ids,
          topk_weights, p);
  }

  // [TAG_ROUTER_F32] in f32 with double sums (the CPU model never needs it: its stream and
  // activations are both f32; the GPU tests compare the CUDA op against this one).
  void moeRouteF32(const Tensor& residual, const Tensor& wt, const Tensor& bias,
                   const Tensor& topk_ids, const Tensor& topk_weights,
                   const MoeRouteParams& p) override {
    sync();
    checkF32(residual);
    checkF32(wt);
    const int64_t t_rows = residual.rows(), h = residual.cols(), e = wt.cols();
    CHECK(wt.rows() == h);
    const float* res = residual.as<float>();
    const float* w = wt.as<float>();
    std::vector<float> logits(static_cast<size_t>(t_rows * e));
    std::vector<double> acc(static_cast<size_t>(e));
    for (int64_t t = 0; t < t_rows; ++t) {
      const float* row = res + t * h;
      double ss = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = 0; k < h; ++k) {
        const double x = row[k];
        ss += x * x;
        const float* wk = w + k * e;
        for (int64_t x2 = 0; x2 < e; ++x2) acc[static_cast<size_t>(x2)] += x * wk[x2];
      }
      const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(h) + p.norm_eps);
      for (int64_t x2 = 0; x2 < e; ++x2)
        logits[static_cast<size_t>(t * e + x2)] =
            static_cast<float>(acc[static_cast<size_t>(x2)] * rstd);
    }
    route(logits.data(), t_rows, e, bias, topk_ids, topk_weights, p);
  }

  void moeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                  const ExpertWeights& ew1, const Tensor& b1, const ExpertWeights& ew2,
                  const Tensor& b2, const Tensor& out, const MoeExpertsParams& p) override {
    sync();
    CHECK_MSG(ew1.format == ExpertFormat::kDense && ew2.format == ExpertFormat::kDense,
              "cpu llm ops keep experts dense");
    const Tensor& w1 = ew1.dense;
    const Tensor& w2 = ew2.dense;
    checkF32(x);
    checkF32(w1);
    checkF32(w2);
    checkF32(out);
    checkI32(topk_ids);
    checkF32(topk_weights);
    const int64_t t_rows = x.rows(), hdim = p.hidden, inter = p.intermediate, k = p.top_k,
                  ne = p.num_experts;
    CHECK(x.cols() == hdim && out.rows() == t_rows && out.cols() == hdim);
    CHECK(x.data != out.data);
    CHECK(w1.numel() == ne * 2 * inter * hdim && w2.numel() == ne * hdim * inter);
    CHECK(topk_ids.numel() == t_rows * k && topk_weights.numel() == t_rows * k);
    const float* b1p = nullptr;
    const float* b2p = nullptr;
    if (!b1.empty()) {
      checkF32(b1);
      CHECK(b1.numel() == ne * 2 * inter);
      b1p = b1.as<float>();
    }
    if (!b2.empty()) {
      checkF32(b2);
      CHECK(b2.numel() == ne * hdim);
      b2p = b2.as<float>();
    }
    const float* xp = x.as<float>();
    const float* w1p = w1.as<float>();
    const float* w2p = w2.as<float>();
    const int32_t* ids = topk_ids.as<int32_t>();
    const float* wts = topk_weights.as<float>();
    float* op = out.as<float>();
    const float limit = p.swiglu_limit, alpha = p.swiglu_alpha;
    std::atomic<uint64_t>* prog = progressCounter(backend_);  // [TAG_STEP_PROGRESS]
    // Tokens in chunks of kMoeChunk. A chunk's (token, slot) pairs are grouped by expert; one
    // task per expert that has pairs gathers their rows and runs both projections as GEMMs
    // (h = x·W1ᵀ + b1, the clamped SwiGLU, y = a·W2ᵀ + b2), writing y to the pair's row of
    // moe_y_. Then out[t] = Σ_s w[t,s] · y[t,s] in slot order, as the op's definition reads.
    for (int64_t c0 = 0; c0 < t_rows; c0 += kMoeChunk) {
      const int64_t rows = std::min(kMoeChunk, t_rows - c0);
      moe_count_.assign(static_cast<size_t>(ne) + 1, 0);
      for (int64_t i = c0 * k; i < (c0 + rows) * k; ++i) {
        CHECK(ids[i] >= 0 && ids[i] < ne);
        ++moe_count_[static_cast<size_t>(ids[i]) + 1];
      }
      for (int64_t x = 0; x < ne; ++x) moe_count_[x + 1] += moe_count_[x];  // now offsets
      moe_pairs_.resize(static_cast<size_t>(rows * k));
      moe_fill_.assign(moe_count_.begin(), moe_count_.end() - 1);
      for (int64_t i = c0 * k; i < (c0 + rows) * k; ++i) {
        moe_pairs_[static_cast<size_t>(moe_fill_[static_cast<size_t>(ids[i])]++)] =
            static_cast<int32_t>(i - c0 * k);
      }
      moe_experts_.clear();
      for (int64_t x = 0; x < ne; ++x) {
        if (moe_count_[x + 1] > moe_count_[x]) moe_experts_.push_back(static_cast<int32_t>(x));
      }
      moe_y_.resize(static_cast<size_t>(rows * k * hdim));
      const size_t per_worker = static_cast<size_t>(rows * (2 * hdim + 3 * inter));
      for (auto& sc : scratch_) {
        if (sc.size() < per_worker) sc.resize(per_worker);
      }
      pool_.parallelTasks(static_cast<int64_t>(moe_experts_.size()), [&](int64_t task, int worker) {
        const int64_t ex = moe_experts_[static_cast<size_t>(task)];
        const int64_t first = moe_count_[static_cast<size_t>(ex)];
        const int64_t n = moe_count_[static_cast<size_t>(ex) + 1] - first;
        const int32_t* pairs = moe_pairs_.data() + first;
        float* xg = scratch_[static_cast<size_t>(worker)].data();  // [n, H]
        float* h = xg + n * hdim;                                  // [n, 2I]
        float* a = h + n * 2 * inter;                              // [n, I]
        float* y = a + n * inter;                                  // [n, H]
        for (int64_t r = 0; r < n; ++r) {
          const int64_t t = c0 + pairs[r] / k;
          std::memcpy(xg + r * hdim, xp + t * hdim, sizeof(float) * static_cast<size_t>(hdim));
        }
        // [TAG_CPU_ROW_INVARIANT] An expert's rows in fixed 8-row groups: a token's bits do not
        // depend on how many others chose the same expert.
        sgemmRowInvariant(n, 2 * inter, hdim, xg, hdim, w1p + ex * 2 * inter * hdim, hdim, h,
                          2 * inter);
        for (int64_t r = 0; r < n; ++r) {
          float* hr = h + r * 2 * inter;
          float* ar = a + r * inter;
          if (b1p != nullptr) {
            for (int64_t c = 0; c < 2 * inter; ++c) hr[c] += b1p[ex * 2 * inter + c];
          }
          for (int64_t c = 0; c < inter; ++c) {
            const float gate = std::min(hr[2 * c], limit);
            const float up = std::clamp(hr[2 * c + 1], -limit, limit);
            ar[c] = gate / (1.f + std::exp(-alpha * gate)) * (up + 1.f);
          }
        }
        sgemmRowInvariant(n, hdim, inter, a, inter, w2p + ex * hdim * inter, inter, y, hdim);
        for (int64_t r = 0; r < n; ++r) {
          float* dst = moe_y_.data() + static_cast<int64_t>(pairs[r]) * hdim;
          const float* src = y + r * hdim;
          if (b2p != nullptr) {
            for (int64_t c = 0; c < hdim; ++c) dst[c] = src[c] + b2p[ex * hdim + c];
          } else {
            std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(hdim));
          }
        }
        tick(prog);
      });
      pool_.parallelFor(rows, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) {
          float* o = op + (c0 + r) * hdim;
          std::fill(o, o + hdim, 0.f);
          for (int64_t sl = 0; sl < k; ++sl) {
            const float wt = wts[(c0 + r) * k + sl];
            const float* yr = moe_y_.data() + (r * k + sl) * hdim;
            for (int64_t c = 0; c < hdim; ++c) o[c] += wt * yr[c];
          }
        }
      });
    }
  }

  void gatherRows(const Tensor& in, const Tensor& rows, const Tensor& out) override {
    sync();
    checkI32(rows);
    CHECK(in.dtype == out.dtype && in.cols() == out.cols() && out.rows() == rows.numel());
    const size_t row_bytes = static_cast<size_t>(in.cols()) * dtypeSize(in.dtype);
    const int32_t* r = rows.as<int32_t>();
    for (int64_t i = 0; i < rows.numel(); ++i) {
      CHECK(r[i] >= 0 && r[i] < in.rows());
      std::memcpy(static_cast<std::byte*>(out.data) + i * row_bytes,
                  static_cast<const std::byte*>(in.data) + r[i] * row_bytes, row_bytes);
    }
  }

  void copyTokens(const Tensor& src, const Tensor& pairs, const Tensor& ids) override {
    sync();
    checkI32(src);
    checkI32(pairs);
    checkI32(ids);
    CHECK(pairs.numel() % 2 == 0);
    const int32_t* pr = pairs.as<int32_t>();
    const int32_t* sp = src.as<int32_t>();
    int32_t* ip = ids.as<int32_t>();
    for (int64_t i = 0; i < pairs.numel() / 2; ++i) {
      const int32_t dst = pr[2 * i], row = pr[2 * i + 1];
      CHECK(dst >= 0 && dst < ids.numel() && row >= 0 && row < src.numel());
      ip[dst] = sp[row];
    }
  }

  void sample(const Tensor& logits, std::span<const SampleRow> rows, const Tensor& out_ids,
              const Tensor& out_logprobs) override {
    sync();
    checkF32(logits);
    checkI32(out_ids);
    CHECK(out_ids.numel() >= static_cast<int64_t>(rows.size()));
    auto* lps = out_logprobs.empty() ? nullptr : static_cast<llm::LlmTokenLogprobs*>(out_logprobs.data);
    CHECK(lps == nullptr || out_logprobs.bytes() >= rows.size() * sizeof(llm::LlmTokenLogprobs));
    const int64_t v = logits.cols();
    int32_t* o = out_ids.as<int32_t>();
    for (size_t i = 0; i < rows.size(); ++i) {
      const SampleRow& r = rows[i];
      CHECK(r.row >= 0 && r.row < logits.rows());
      CHECK(lps != nullptr || r.params.logprobs < 0);
      std::span<const float> row(logits.as<float>() + r.row * v, static_cast<size_t>(v));
      SamplerSlot* slot = nullptr;
      if (r.params.state_slot >= 0) {
        CHECK(static_cast<size_t>(r.params.state_slot) < slots_.size());
        slot = &slots_[static_cast<size_t>(r.params.state_slot)];
      }
      o[i] = sampler_.sample(row, r.params, r.counter, slot, lps ? &lps[i] : nullptr, r.mask);
    }
  }

  Status reserve(const LlmOpsLimits& limits) override {
    slots_.assign(static_cast<size_t>(std::max(0, limits.max_seqs)), SamplerSlot{});
    return okStatus();
  }

  bool supportsSamplerState() const override { return true; }
  bool supportsTokenMask() const override { return true; }

  void resetSamplerState(std::span<const SamplerStateReset> resets) override {
    sync();
    for (const SamplerStateReset& r : resets) {
      CHECK(r.slot >= 0 && static_cast<size_t>(r.slot) < slots_.size());
      slots_[static_cast<size_t>(r.slot)].reset(r.prompt, r.output, r.bias);
    }
  }

 private:
  // moeRoute's selection on f32 logits [T, E] (host memory).
  void route(const float* lg, int64_t t_rows, int64_t e, const Tensor& bias,
             const Tensor& topk_ids, const Tensor& topk_weights, const MoeRouteParams& p) {
    checkI32(topk_ids);
    checkF32(topk_weights);
    const int64_t k = p.top_k;
    CHECK(k > 0 && k <= e);
    CHECK(topk_ids.numel() == t_rows * k && topk_weights.numel() == t_rows * k);
    const float* bp = nullptr;
    if (!bias.empty()) {
      checkF32(bias);
      CHECK(bias.numel() == e);
      bp = bias.as<float>();
    }
    int32_t* ids = topk_ids.as<int32_t>();
    float* w = topk_weights.as<float>();
    std::vector<int32_t> order(static_cast<size_t>(e));
    std::vector<float> biased(static_cast<size_t>(e));
    for (int64_t t = 0; t < t_rows; ++t) {
      const float* row = lg + t * e;
      if (bp != nullptr) {
        for (int64_t x = 0; x < e; ++x) biased[static_cast<size_t>(x)] = row[x] + bp[x];
        row = biased.data();
      }
      for (int64_t x = 0; x < e; ++x) order[static_cast<size_t>(x)] = static_cast<int32_t>(x);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [row](int32_t a, int32_t b) {
        return row[a] != row[b] ? row[a] > row[b] : a < b;
      });
      const float mx = row[order[0]];
      float sum = 0.f;
      for (int64_t x = 0; x < k; ++x) {
        const int32_t id = order[static_cast<size_t>(x)];
        ids[t * k + x] = id;
        w[t * k + x] = std::exp(row[id] - mx);
        sum += w[t * k + x];
      }
      for (int64_t x = 0; x < k; ++x) w[t * k + x] /= sum;
    }
  }

  // Called from the compute thread this returns at once; from another thread it waits for the
  // launched work first ([TAG_ROSE_LAZY]).
  void sync() { (void)backend_.synchronize(); }

  static constexpr int64_t kMoeChunk = 256;  // tokens per moeExperts round

  Backend& backend_;
  ThreadPool pool_;
  std::vector<std::vector<float>> scratch_;  // per pool worker
  // moeExperts, one chunk: pair offsets per expert (E + 1), pairs grouped by expert, the experts
  // with pairs, a fill cursor, and each pair's expert output [rows·k, H]. Compute thread only.
  std::vector<int64_t> moe_count_, moe_fill_;
  std::vector<int32_t> moe_pairs_, moe_experts_;
  std::vector<float> moe_y_;
  Sampler sampler_;
  std::vector<SamplerSlot> slots_;  // [TAG_LLM_SAMPLER_STATE], one per max_seqs
};

}  // namespace

Result<std::unique_ptr<LlmOps>> createLlmOps(Backend& backend, int32_t threads) {
  if (backend.name() != "cpu") {
    return invalidArgument("cpu llm ops need a cpu backend (got '" + std::string(backend.name()) +
                           "')");
  }
  const int n =
      threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::unique_ptr<LlmOps>(std::make_unique<CpuLlmOps>(backend, n));
}

}  // namespace garden::rose::cpu
