// The CPU LlmOps against naive float64 formulas written from the gpt-oss spec: paged KV writes
// and attention through scattered block tables vs contiguous attention (and vs the base
// backend's ragged attention when there is no sink and no window), per-head sinks and sliding
// windows, MoE routing (top-k, softmax over the selected) and clamped SwiGLU experts with biases,
// row gathering; single- and multi-threaded.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "services/rose/ops/backend.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/ops/paged_kv_cache.h"

namespace garden::rose {
namespace {

std::vector<float> randomVec(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

class LlmCpuOps : public ::testing::TestWithParam<int> {
 public:  // runPagedCase() drives the fixture
  void SetUp() override {
    BackendOptions o;
    o.threads = GetParam();
    auto b = makeBackend("cpu", o);
    ASSERT_TRUE(b.isOk()) << b.status().toString();
    backend_ = std::move(b).value();
    auto ops = makeLlmOps(*backend_, GetParam());
    ASSERT_TRUE(ops.isOk()) << ops.status().toString();
    ops_ = std::move(ops).value();
  }
  OwnedTensor put(const std::vector<float>& data, std::initializer_list<int64_t> dims) {
    auto t = backend_->allocateTensor(DType::kF32, dims);
    EXPECT_TRUE(t.isOk());
    EXPECT_TRUE(
        backend_
            ->uploadConvert(t->view, {data.data(), DType::kF32, static_cast<int64_t>(data.size())})
            .isOk());
    return std::move(t).value();
  }
  OwnedTensor putI32(const std::vector<int32_t>& data, std::initializer_list<int64_t> dims) {
    auto t = backend_->allocateTensor(DType::kI32, dims);
    EXPECT_TRUE(t.isOk());
    backend_->copyToDevice(t->view, data.data(), data.size() * 4);
    return std::move(t).value();
  }
  OwnedTensor zeros(DType dt, std::initializer_list<int64_t> dims) {
    auto t = backend_->allocateTensor(dt, dims);
    EXPECT_TRUE(t.isOk());
    std::vector<std::byte> z(t->view.bytes());
    backend_->copyToDevice(t->view, z.data(), z.size());
    return std::move(t).value();
  }
  template <typename T>
  std::vector<T> get(const Tensor& t) {
    std::vector<T> out(static_cast<size_t>(t.numel()));
    backend_->copyToHost(out.data(), t, out.size() * sizeof(T));
    EXPECT_TRUE(backend_->synchronize().isOk());
    return out;
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlmOps> ops_;
};

// Naive attention over contiguous per-sequence keys (float64): q [T, Hq, D] rows of qkv, keys
// of sequence s = all its rows (positions pos0[s] + r); causal, optional window and sinks.
struct NaiveSeq {
  int32_t start_row, rows, position;  // new rows of this step; keys from 0..position+rows-1
};

std::vector<float> naiveAttention(
    const std::vector<float>& q,                  // [T, Hq*D]
    const std::vector<std::vector<float>>& keys,  // per seq [ctx, Hkv*D]
    const std::vector<std::vector<float>>& vals, const std::vector<NaiveSeq>& seqs, int hq, int hkv,
    int d, int window, const std::vector<float>& sinks, float scale) {
  const int64_t t_rows = static_cast<int64_t>(q.size()) / (hq * d);
  std::vector<float> out(static_cast<size_t>(t_rows * hq * d), 0.f);
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int r = 0; r < seqs[s].rows; ++r) {
      const int64_t t = seqs[s].start_row + r;
      const int64_t i = seqs[s].position + r;
      for (int h = 0; h < hq; ++h) {
        const int g = h / (hq / hkv);
        std::vector<double> sc;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
        double mx = sinks.empty() ? -INFINITY : sinks[static_cast<size_t>(h)];
        for (int64_t j = lo; j <= i; ++j) {
          double dot = 0;
          for (int c = 0; c < d; ++c) {
            dot += static_cast<double>(q[static_cast<size_t>(t * hq * d + h * d + c)]) *
                   keys[s][static_cast<size_t>(j * hkv * d + g * d + c)];
          }
          sc.push_back(dot * scale);
          mx = std::max(mx, sc.back());
        }
        double z = sinks.empty() ? 0.0 : std::exp(sinks[static_cast<size_t>(h)] - mx);
        for (double& x : sc) {
          x = std::exp(x - mx);
          z += x;
        }
        for (int c = 0; c < d; ++c) {
          double o = 0;
          for (int64_t j = lo; j <= i; ++j) {
            o += sc[static_cast<size_t>(j - lo)] / z *
                 vals[s][static_cast<size_t>(j * hkv * d + g * d + c)];
          }
          out[static_cast<size_t>(t * hq * d + h * d + c)] = static_cast<float>(o);
        }
      }
    }
  }
  return out;
}

struct AttnCase {
  int window;
  bool sinks;
};

// Two sequences with histories in the cache (written in an earlier "step" through shuffled
// block tables), then a step with new rows; paged attention vs the naive contiguous one.
void runPagedCase(LlmCpuOps& f, const AttnCase& c, int block_size) {
  std::mt19937 rng(7 + c.window + 13 * block_size + (c.sinks ? 1 : 0));
  const int hq = 4, hkv = 2, d = 8, width = (hq + 2 * hkv) * d;
  const std::vector<int> history = {13, 0};  // tokens already cached
  const std::vector<int> fresh = {5, 17};    // new tokens this step
  const int num_blocks = 40;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  // Per sequence: its block table (disjoint slices of the permutation).
  std::vector<std::vector<int32_t>> tables(2);
  int next = 0;
  for (int s = 0; s < 2; ++s) {
    const int64_t need = kvBlocksFor(history[s] + fresh[s], block_size);
    for (int64_t b = 0; b < need; ++b) tables[s].push_back(perm[static_cast<size_t>(next++)]);
  }
  ASSERT_LE(next, num_blocks);
  KvCacheShape shape{1, num_blocks, block_size, hkv, d};
  auto kv = PagedKvCache::create(*f.backend_, shape, DType::kF32);
  ASSERT_TRUE(kv.isOk());
  // Full per-sequence K/V (contiguous truth) and the qkv rows of both phases.
  std::vector<std::vector<float>> keys(2), vals(2);
  auto writeRows = [&](const std::vector<int>& counts, const std::vector<int>& offsets) {
    int total = counts[0] + counts[1];
    std::vector<float> qkv = randomVec(static_cast<size_t>(total * width), rng);
    std::vector<int32_t> slots;
    for (int s = 0, row = 0; s < 2; ++s) {
      for (int r = 0; r < counts[s]; ++r, ++row) {
        slots.push_back(static_cast<int32_t>(kvSlot(tables[s], offsets[s] + r, block_size)));
        const float* src = qkv.data() + row * width;
        keys[s].insert(keys[s].end(), src + hq * d, src + (hq + hkv) * d);
        vals[s].insert(vals[s].end(), src + (hq + hkv) * d, src + width);
      }
    }
    auto qkv_t = f.put(qkv, {total, width});
    auto slot_t = f.putI32(slots, {total});
    f.ops_->ropeKvWrite(qkv_t.view, Tensor(), Tensor(), Tensor(), slot_t.view, (*kv)->keys(0),
                        (*kv)->values(0), RopeKvParams{hq, hkv, d, 0});
    return std::make_pair(std::move(qkv), std::move(qkv_t));
  };
  if (history[0] + history[1] > 0) writeRows(history, {0, 0});
  auto [qkv, qkv_t] = writeRows(fresh, history);
  const int total = fresh[0] + fresh[1];
  const int maxb = static_cast<int>(std::max(tables[0].size(), tables[1].size()));
  std::vector<int32_t> bt(static_cast<size_t>(2 * maxb), -1);
  for (int s = 0; s < 2; ++s) std::copy(tables[s].begin(), tables[s].end(), bt.begin() + s * maxb);
  std::vector<int32_t> positions;
  for (int s = 0; s < 2; ++s) {
    for (int r = 0; r < fresh[s]; ++r) positions.push_back(history[s] + r);
  }
  auto bt_t = f.putI32(bt, {2, maxb});
  auto pos_t = f.putI32(positions, {total});
  auto cu_t = f.putI32({0, fresh[0], total}, {3});
  std::vector<float> sinks = c.sinks ? randomVec(hq, rng, 2.f) : std::vector<float>{};
  OwnedTensor sinks_t;
  if (c.sinks) sinks_t = f.put(sinks, {hq});
  auto out_t = f.zeros(DType::kF32, {total, hq * d});
  PagedAttentionParams p;
  p.num_seqs = 2;
  p.num_q_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim = d;
  p.block_size = block_size;
  p.max_blocks_per_seq = maxb;
  p.max_context = 22;
  p.sliding_window = c.window;
  p.scale = 0.35f;
  f.ops_->pagedAttention(qkv_t.view, (*kv)->keys(0), (*kv)->values(0), cu_t.view, pos_t.view,
                         bt_t.view, sinks_t.view, out_t.view, p);
  auto got = f.get<float>(out_t.view);
  std::vector<float> q;
  for (int r = 0; r < total; ++r)
    q.insert(q.end(), qkv.begin() + r * width, qkv.begin() + r * width + hq * d);
  auto want =
      naiveAttention(q, keys, vals, {{0, fresh[0], history[0]}, {fresh[0], fresh[1], history[1]}},
                     hq, hkv, d, c.window, sinks, p.scale);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i])))
        << "window " << c.window << " sinks " << c.sinks << " block " << block_size << " at " << i;
  }
}

TEST_P(LlmCpuOps, PagedAttentionMatchesNaiveContiguous) {
  for (int block_size : {1, 4, 16}) {
    for (AttnCase c : {AttnCase{0, false}, AttnCase{0, true}, AttnCase{4, false}, AttnCase{4, true},
                       AttnCase{1, true}, AttnCase{64, true}}) {
      runPagedCase(*this, c, block_size);
    }
  }
}

// The sink and the window must change the result (the naive reference could otherwise agree
// with an implementation that ignores them).
TEST_P(LlmCpuOps, SinkAndWindowMatter) {
  std::mt19937 rng(3);
  const int hq = 2, hkv = 1, d = 4, width = (hq + 2 * hkv) * d, t = 9, bs = 4;
  auto kv = PagedKvCache::create(*backend_, KvCacheShape{1, 3, bs, hkv, d}, DType::kF32);
  ASSERT_TRUE(kv.isOk());
  auto qkv = put(randomVec(t * width, rng), {t, width});
  std::vector<int32_t> slots(t), positions(t);
  std::iota(slots.begin(), slots.end(), 0);
  std::iota(positions.begin(), positions.end(), 0);
  auto slot_t = putI32(slots, {t});
  auto pos_t = putI32(positions, {t});
  auto bt = putI32({0, 1, 2}, {1, 3});
  auto cu = putI32({0, t}, {2});
  ops_->ropeKvWrite(qkv.view, Tensor(), Tensor(), Tensor(), slot_t.view,
                     (*kv)->keys(0), (*kv)->values(0), RopeKvParams{hq, hkv, d, 0});
  auto run = [&](int window, const Tensor& sinks) {
    auto out = zeros(DType::kF32, {t, hq * d});
    PagedAttentionParams p{1, hq, hkv, d, bs, 3, t, window, 0.5f};
    ops_->pagedAttention(qkv.view, (*kv)->keys(0), (*kv)->values(0), cu.view, pos_t.view, bt.view,
                         sinks, out.view, p);
    return get<float>(out.view);
  };
  auto sinks = put({3.f, -1.f}, {2});
  auto base = run(0, Tensor());
  auto with_sink = run(0, sinks.view);
  auto windowed = run(3, Tensor());
  // Row 0 attends only to itself: the window cannot matter there, the sink does.
  EXPECT_FLOAT_EQ(base[0], windowed[0]);
  EXPECT_NE(base[0], with_sink[0]);
  // The last row sees 9 keys in full attention, 3 in the window.
  const size_t last = static_cast<size_t>((t - 1) * hq * d);
  EXPECT_GT(std::fabs(base[last] - windowed[last]), 1e-4f);
}

// Without sinks and window, paged attention equals the base backend's ragged causal attention.
TEST_P(LlmCpuOps, PagedEqualsBackendRaggedAttention) {
  std::mt19937 rng(11);
  const int hq = 4, hkv = 2, d = 16, width = (hq + 2 * hkv) * d, bs = 4;
  const std::vector<int> lens = {7, 1, 12};
  const int t = 20;
  auto qkv = put(randomVec(t * width, rng), {t, width});
  auto kv = PagedKvCache::create(*backend_, KvCacheShape{1, 12, bs, hkv, d}, DType::kF32);
  ASSERT_TRUE(kv.isOk());
  std::vector<int32_t> blocks = {5, 2, 9, 0, 11, 7, 3};  // seq0: 5,2  seq1: 9  seq2: 0,11,7
  std::vector<std::vector<int32_t>> tables = {{5, 2}, {9}, {0, 11, 7}};
  std::vector<int32_t> slots, positions, bt(9, -1);
  for (int s = 0; s < 3; ++s) {
    for (int r = 0; r < lens[s]; ++r) {
      slots.push_back(static_cast<int32_t>(kvSlot(tables[s], r, bs)));
      positions.push_back(r);
    }
    std::copy(tables[s].begin(), tables[s].end(), bt.begin() + s * 3);
  }
  auto slot_t = putI32(slots, {t});
  auto pos_t = putI32(positions, {t});
  auto bt_t = putI32(bt, {3, 3});
  auto cu = putI32({0, 7, 8, 20}, {4});
  ops_->ropeKvWrite(qkv.view, Tensor(), Tensor(), Tensor(), slot_t.view,
                     (*kv)->keys(0), (*kv)->values(0), RopeKvParams{hq, hkv, d, 0});
  auto paged = zeros(DType::kF32, {t, hq * d});
  PagedAttentionParams p{3, hq, hkv, d, bs, 3, 12, 0, 0.25f};
  ops_->pagedAttention(qkv.view, (*kv)->keys(0), (*kv)->values(0), cu.view, pos_t.view, bt_t.view,
                       Tensor(), paged.view, p);
  auto ragged = zeros(DType::kF32, {t, hq * d});
  AttentionParams ap;
  ap.num_seqs = 3;
  ap.num_q_heads = hq;
  ap.num_kv_heads = hkv;
  ap.head_dim = d;
  ap.max_seqlen = 12;
  ap.scale = 0.25f;
  ap.causal = true;
  backend_->attention(qkv.view, cu.view, ragged.view, ap);
  auto a = get<float>(paged.view), b = get<float>(ragged.view);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5f * (1 + std::fabs(b[i]))) << i;
}

TEST_P(LlmCpuOps, RouterTopKSoftmaxOverSelected) {
  // Row 0: logits 1, 4, 2, 4 → top-2 = experts 1 and 3 (tie: lower id first), weights 1/2, 1/2.
  // Row 1: 0, -1, 3, 1 → experts 2, 3 with softmax(3, 1).
  auto logits = put({1, 4, 2, 4, 0, -1, 3, 1}, {2, 4});
  auto ids = zeros(DType::kI32, {2, 2});
  auto w = zeros(DType::kF32, {2, 2});
  ops_->moeRoute(logits.view, Tensor(), ids.view, w.view, MoeRouteParams{2});
  auto gi = get<int32_t>(ids.view);
  auto gw = get<float>(w.view);
  EXPECT_EQ(gi, (std::vector<int32_t>{1, 3, 2, 3}));
  EXPECT_FLOAT_EQ(gw[0], 0.5f);
  EXPECT_FLOAT_EQ(gw[1], 0.5f);
  const double e = std::exp(-2.0);
  EXPECT_NEAR(gw[2], 1.0 / (1.0 + e), 1e-7);
  EXPECT_NEAR(gw[3], e / (1.0 + e), 1e-7);
  // k = all experts: softmax over the whole row, sorted.
  auto ids4 = zeros(DType::kI32, {2, 4});
  auto w4 = zeros(DType::kF32, {2, 4});
  ops_->moeRoute(logits.view, Tensor(), ids4.view, w4.view, MoeRouteParams{4});
  EXPECT_EQ(get<int32_t>(ids4.view), (std::vector<int32_t>{1, 3, 2, 0, 2, 3, 0, 1}));
}

// 300 tokens: more than one round of the op (256 tokens), so it runs in chunks.
TEST_P(LlmCpuOps, ExpertsMatchNaiveClampedSwiGlu) {
  for (const int t : {7, 300}) {
    std::mt19937 rng(5);
    const int h = 12, inter = 10, e = 3, k = 2;
    const float limit = 7.f, alpha = 1.702f;
    auto x = randomVec(t * h, rng);
    auto w1 = randomVec(e * 2 * inter * h, rng, 1.5f);  // large: clamps are hit
    auto b1 = randomVec(e * 2 * inter, rng);
    auto w2 = randomVec(e * h * inter, rng, 0.3f);
    auto b2 = randomVec(e * h, rng);
    std::vector<int32_t> ids;
    std::vector<float> wts;
    for (int i = 0; i < t; ++i) {
      ids.push_back(i % e);
      ids.push_back((i + 1 + i / 4) % e == i % e ? (i + 2) % e : (i + 1 + i / 4) % e);
      wts.push_back(0.3f + 0.05f * i);
      wts.push_back(0.7f - 0.05f * i);
    }
    auto xt = put(x, {t, h});
    auto w1t = put(w1, {e, 2 * inter, h});
    auto b1t = put(b1, {e, 2 * inter});
    auto w2t = put(w2, {e, h, inter});
    auto b2t = put(b2, {e, h});
    auto idt = putI32(ids, {t, k});
    auto wtt = put(wts, {t, k});
    auto out = zeros(DType::kF32, {t, h});
    MoeExpertsParams p{e, k, h, inter, limit, alpha};
    ExpertWeights ew1, ew2;
    ew1.dense = w1t.view;
    ew2.dense = w2t.view;
    ops_->moeExperts(xt.view, idt.view, wtt.view, ew1, b1t.view, ew2, b2t.view, out.view, p);
    auto got = get<float>(out.view);
    int gate_clamped = 0, up_clamped = 0;
    for (int i = 0; i < t; ++i) {
      std::vector<double> y(h, 0.0);
      for (int s = 0; s < k; ++s) {
        const int ex = ids[static_cast<size_t>(i * k + s)];
        std::vector<double> a(inter);
        for (int c = 0; c < inter; ++c) {
          double g = b1[static_cast<size_t>(ex * 2 * inter + 2 * c)],
                 u = b1[static_cast<size_t>(ex * 2 * inter + 2 * c + 1)];
          for (int j = 0; j < h; ++j) {
            g += static_cast<double>(w1[static_cast<size_t>((ex * 2 * inter + 2 * c) * h + j)]) *
                 x[static_cast<size_t>(i * h + j)];
            u +=
                static_cast<double>(w1[static_cast<size_t>((ex * 2 * inter + 2 * c + 1) * h + j)]) *
                x[static_cast<size_t>(i * h + j)];
          }
          gate_clamped += g > limit;
          up_clamped += std::fabs(u) > limit;
          g = std::min<double>(g, limit);
          u = std::clamp<double>(u, -limit, limit);
          a[static_cast<size_t>(c)] = g / (1 + std::exp(-alpha * g)) * (u + 1);
        }
        for (int r = 0; r < h; ++r) {
          double acc = b2[static_cast<size_t>(ex * h + r)];
          for (int c = 0; c < inter; ++c)
            acc += static_cast<double>(w2[static_cast<size_t>((ex * h + r) * inter + c)]) *
                   a[static_cast<size_t>(c)];
          y[static_cast<size_t>(r)] += wts[static_cast<size_t>(i * k + s)] * acc;
        }
      }
      for (int r = 0; r < h; ++r) {
        ASSERT_NEAR(got[static_cast<size_t>(i * h + r)], y[static_cast<size_t>(r)],
                    1e-4 * (1 + std::fabs(y[static_cast<size_t>(r)])))
            << "token " << i << " dim " << r;
      }
    }
    EXPECT_GT(gate_clamped, 0);  // the case exercises both clamps
    EXPECT_GT(up_clamped, 0);
  }
}

TEST_P(LlmCpuOps, GatherRows) {
  auto in = put({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2});
  auto rows = putI32({3, 0, 3}, {3});
  auto out = zeros(DType::kF32, {3, 2});
  ops_->gatherRows(in.view, rows.view, out.view);
  EXPECT_EQ(get<float>(out.view), (std::vector<float>{30, 31, 0, 1, 30, 31}));
}

TEST_P(LlmCpuOps, KvWriteLandsInTheSlot) {
  const int hq = 1, hkv = 1, d = 2, bs = 2;
  auto kv = PagedKvCache::create(*backend_, KvCacheShape{2, 3, bs, hkv, d}, DType::kF32);
  ASSERT_TRUE(kv.isOk());
  // Two tokens: q(2) k(2) v(2) each; written to slots 5 (block 2, offset 1) and 0, layer 1.
  auto qkv = put({0, 0, 1, 2, 3, 4, 0, 0, 5, 6, 7, 8}, {2, 6});
  auto slots = putI32({5, 0}, {2});
  ops_->ropeKvWrite(qkv.view, Tensor(), Tensor(), Tensor(), slots.view,
                     (*kv)->keys(1), (*kv)->values(1), RopeKvParams{hq, hkv, d, 0});
  auto k = get<float>((*kv)->keys(1));
  auto v = get<float>((*kv)->values(1));
  EXPECT_EQ(k[10], 1);
  EXPECT_EQ(k[11], 2);
  EXPECT_EQ(v[10], 3);
  EXPECT_EQ(v[11], 4);
  EXPECT_EQ(k[0], 5);
  EXPECT_EQ(v[1], 8);
  EXPECT_EQ(kvSlot(std::vector<int32_t>{4, 2}, 3, 2), 5);
  EXPECT_EQ(kvBlocksFor(5, 2), 3);
}

// The rotation of ropeKvWrite is the backend's NeoX RoPE (pairs (i, i + half)) applied to q and k
// heads, and the cache receives the rotated k and the untouched v.
TEST_P(LlmCpuOps, RopeKvWriteRotatesQAndKAndWritesTheCache) {
  const int hq = 2, hkv = 1, d = 4, bs = 2, half = 2;
  auto kv = PagedKvCache::create(*backend_, KvCacheShape{1, 2, bs, hkv, d}, DType::kF32);
  ASSERT_TRUE(kv.isOk());
  // One token at position 1: q0, q1, k, v heads of 4 values.
  std::vector<float> row = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  auto qkv = put(row, {1, 16});
  auto pos = putI32({1}, {1});
  // cos/sin tables for positions 0..1, half = 2 frequencies.
  const float c0 = 0.5f, c1 = 0.25f, s0 = 0.75f, s1 = -0.5f;
  auto cosv = put({1, 1, c0, c1}, {2, half});
  auto sinv = put({0, 0, s0, s1}, {2, half});
  auto slots = putI32({3}, {1});
  ops_->ropeKvWrite(qkv.view, pos.view, cosv.view, sinv.view, slots.view, (*kv)->keys(0),
                    (*kv)->values(0), RopeKvParams{hq, hkv, d, d});
  auto rot = [&](const float* x, float* y) {  // NeoX: (x_i, x_{i+2})
    y[0] = x[0] * c0 - x[2] * s0;
    y[1] = x[1] * c1 - x[3] * s1;
    y[2] = x[2] * c0 + x[0] * s0;
    y[3] = x[3] * c1 + x[1] * s1;
  };
  std::vector<float> want = row;
  for (int h = 0; h < 3; ++h) rot(row.data() + 4 * h, want.data() + 4 * h);
  auto got = get<float>(qkv.view);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << i;
  auto k = get<float>((*kv)->keys(0));
  auto v = get<float>((*kv)->values(0));
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(k[12 + i], want[8 + i]);  // slot 3
    EXPECT_FLOAT_EQ(v[12 + i], row[12 + i]);
  }
}

TEST_P(LlmCpuOps, RouterBiasJoinsBeforeTheTopK) {
  // Logits 1, 4, 2, 4 with bias 0, -3, 0, 1 → 1, 1, 2, 5: top-2 = experts 3, 2.
  auto logits = put({1, 4, 2, 4}, {1, 4});
  auto bias = put({0, -3, 0, 1}, {4});
  auto ids = zeros(DType::kI32, {1, 2});
  auto w = zeros(DType::kF32, {1, 2});
  ops_->moeRoute(logits.view, bias.view, ids.view, w.view, MoeRouteParams{2});
  EXPECT_EQ(get<int32_t>(ids.view), (std::vector<int32_t>{3, 2}));
  auto gw = get<float>(w.view);
  const double e = std::exp(-3.0);
  EXPECT_NEAR(gw[0], 1.0 / (1.0 + e), 1e-7);
  EXPECT_NEAR(gw[1], e / (1.0 + e), 1e-7);
}

// [TAG_ROUTER_F32] The folded router (norm weight inside the router weights, the row's rsqrt
// applied to the dot products) equals the unfolded one: rmsNorm, then the router GEMM, then
// moeRoute — same experts (no near-ties in this data), weights to f32 rounding.
TEST_P(LlmCpuOps, MoeRouteF32EqualsNormThenRouterGemm) {
  std::mt19937 rng(11);
  const int t = 37, h = 96, e = 8, k = 4;
  const float eps = 1e-5f;
  auto res = randomVec(t * h, rng, 3.f);
  auto router = randomVec(e * h, rng, 0.1f);
  auto gamma = randomVec(h, rng, 0.2f);
  for (auto& g : gamma) g += 1.f;
  auto bias = randomVec(e, rng, 0.3f);
  std::vector<float> wt(static_cast<size_t>(h * e));
  for (int x = 0; x < e; ++x)
    for (int c = 0; c < h; ++c) wt[static_cast<size_t>(c * e + x)] = router[static_cast<size_t>(x * h + c)] * gamma[static_cast<size_t>(c)];
  auto rt = put(res, {t, h});
  auto wtt = put(wt, {h, e});
  auto bt = put(bias, {e});
  auto ids = zeros(DType::kI32, {t, k});
  auto w = zeros(DType::kF32, {t, k});
  ops_->moeRouteF32(rt.view, wtt.view, bt.view, ids.view, w.view, MoeRouteParams{k, eps});
  // Unfolded: the backend's own rmsNorm and linear, then moeRoute.
  auto normed = zeros(DType::kF32, {t, h});
  auto gt = put(gamma, {h});
  auto rw = put(router, {e, h});
  auto logits = zeros(DType::kF32, {t, e});
  backend_->rmsNorm(rt.view, Tensor(), gt.view, normed.view, RmsNormParams{eps});
  backend_->linear(normed.view, rw.view, Tensor(), logits.view);
  auto ids2 = zeros(DType::kI32, {t, k});
  auto w2 = zeros(DType::kF32, {t, k});
  ops_->moeRoute(logits.view, bt.view, ids2.view, w2.view, MoeRouteParams{k});
  EXPECT_EQ(get<int32_t>(ids.view), get<int32_t>(ids2.view));
  const auto a = get<float>(w.view), b = get<float>(w2.view);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-6) << i;
}

TEST_P(LlmCpuOps, CopyTokensTakesThePreviousSampledIds) {
  auto src = putI32({11, 22, 33}, {3});
  auto ids = putI32({1, 2, 3, 4, 5}, {5});
  auto pairs = putI32({4, 0, 0, 2, 2, 1}, {3, 2});
  ops_->copyTokens(src.view, pairs.view, ids.view);
  EXPECT_EQ(get<int32_t>(ids.view), (std::vector<int32_t>{33, 2, 22, 4, 11}));
}

INSTANTIATE_TEST_SUITE_P(Threads, LlmCpuOps, ::testing::Values(1, 3));

TEST(LlmOpsFactory, CpuOnly) {
  auto b = makeBackend("cpu", BackendOptions{});
  ASSERT_TRUE(b.isOk());
  EXPECT_TRUE(makeLlmOps(**b).isOk());
  auto bad = PagedKvCache::create(**b, KvCacheShape{1, 0, 16, 1, 8}, DType::kF32);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

// [TAG_KV_WINDOW_GROUP] A cache with a window pool: the window layers' views have the window
// pool's block count, the layers sit back to back in order (no overlap: a write through one
// view is seen by no other), poolBytes counts both pools; malformed shapes are refused.
TEST(PagedKvCacheWindow, LayersOfBothPoolsTileTheBuffer) {
  auto b = makeBackend("cpu", BackendOptions{});
  ASSERT_TRUE(b.isOk());
  KvCacheShape s{4, 10, 2, 1, 4};  // 4 layers, 10 full blocks of 2 tokens, 1 kv head, dim 4
  s.num_blocks_window = 3;
  s.window_layers = 0b0101;  // layers 0 and 2
  EXPECT_EQ(s.numWindowLayers(), 2);
  EXPECT_EQ(PagedKvCache::poolBytes(s, DType::kF32), size_t{(3 + 10 + 3 + 10) * 2 * 4 * 4});
  auto kv = PagedKvCache::create(**b, s, DType::kF32);
  ASSERT_TRUE(kv.isOk()) << kv.status().toString();
  const int64_t want_blocks[4] = {3, 10, 3, 10};
  const auto* base = static_cast<const std::byte*>((*kv)->keys(0).data);
  int64_t off = 0;
  for (int32_t l = 0; l < 4; ++l) {
    const Tensor k = (*kv)->keys(l);
    EXPECT_EQ(k.dim(0), want_blocks[l]) << "layer " << l;
    EXPECT_EQ(k.dim(1), 2);
    EXPECT_EQ(static_cast<const std::byte*>(k.data) - base, off * 4) << "layer " << l;
    off += want_blocks[l] * 2 * 4;
    // Every element of this layer gets the layer's number; the others keep theirs.
    std::fill(k.as<float>(), k.as<float>() + k.numel(), static_cast<float>(l + 1));
  }
  for (int32_t l = 0; l < 4; ++l) {
    const Tensor k = (*kv)->keys(l);
    for (int64_t i = 0; i < k.numel(); ++i) ASSERT_EQ(k.as<float>()[i], l + 1.f) << l << " " << i;
  }
  KvCacheShape bad = s;
  bad.window_layers = 0;  // a pool without layers
  EXPECT_EQ(PagedKvCache::create(**b, bad, DType::kF32).status().code(),
            StatusCode::kInvalidArgument);
  bad = s;
  bad.window_layers = 0b10000;  // layer 4 of 4
  EXPECT_EQ(PagedKvCache::create(**b, bad, DType::kF32).status().code(),
            StatusCode::kInvalidArgument);
  bad = s;
  bad.num_blocks_window = -1;
  EXPECT_EQ(PagedKvCache::create(**b, bad, DType::kF32).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace garden::rose
