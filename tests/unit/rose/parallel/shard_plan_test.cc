// Index arithmetic of the gpt-oss sharding (services/rose/parallel/shard_plan.h) and the
// in-process collectives (collective.h): splits cover their range exactly once; heads map to
// the GQA groups they read; every (token, slot) reaches its expert exactly once through the
// expert-parallel dispatch, on every layout up to 8 ranks and exhaustively over small routings;
// the combine weights of a token sum to its router weights; the collectives move the right rows.

#include "services/rose/parallel/shard_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "services/rose/parallel/collective.h"

namespace garden::rose {
namespace {

std::vector<ParallelConfig> layouts(int32_t max_world) {
  std::vector<ParallelConfig> out;
  for (int32_t n = 1; n <= max_world; n *= 2) {
    for (int32_t tp = 1; tp <= n; tp *= 2) {
      for (int32_t ep = 1; ep <= n; ep *= 2) out.push_back(ParallelConfig{tp, n / tp, ep});
    }
  }
  return out;
}

TEST(ShardPlan, SplitsCoverEachIndexOnce) {
  for (int64_t n : {0, 1, 7, 8, 31, 1003, 201088}) {
    for (int64_t parts : {1, 2, 3, 4, 8}) {
      int64_t next = 0;
      for (int64_t i = 0; i < parts; ++i) {
        const IndexRange r = evenSplit(n, parts, i);
        EXPECT_EQ(r.begin, next);
        EXPECT_LE(r.count, n / parts + 1);
        EXPECT_GE(r.count, n / parts);
        for (int64_t x = r.begin; x < r.end(); ++x) {
          if (n < 5000) {
            ASSERT_EQ(evenSplitOwner(n, parts, x), i) << n << " " << parts << " " << x;
          }
        }
        next = r.end();
      }
      EXPECT_EQ(next, n);
    }
  }
  // Intermediate columns in whole MXFP4 blocks: gpt-oss's 2880 = 90 blocks of 32.
  for (int64_t parts : {1, 2, 4, 8}) {
    int64_t next = 0;
    for (int64_t i = 0; i < parts; ++i) {
      const IndexRange r = unitSplit(2880, 32, parts, i);
      EXPECT_EQ(r.begin, next);
      EXPECT_EQ(r.begin % 32, 0);
      EXPECT_EQ(r.count % 32, 0);
      next = r.end();
    }
    EXPECT_EQ(next, 2880);
  }
  EXPECT_EQ(unitSplit(2880, 32, 4, 0), (IndexRange{0, 736}));     // 23 blocks
  EXPECT_EQ(unitSplit(2880, 32, 4, 3), (IndexRange{2176, 704}));  // 22 blocks
}

// Every q head is held by exactly one rank, and the kv head it reads (h / group) is one that rank
// holds. gpt-oss's 64/8 at tp 2/4/8, and a 16/2 shape where tp 4/8 replicate kv heads.
TEST(ShardPlan, HeadsStayWithTheirGqaGroup) {
  for (auto [hq, hkv] : std::vector<std::pair<int64_t, int64_t>>{{64, 8}, {16, 2}, {8, 8}}) {
    const int64_t group = hq / hkv;
    for (int32_t tp : {1, 2, 4, 8}) {
      if (!checkParallelConfig({tp, 1, 1}, hq, hkv, 8, 256, 1000).isOk()) continue;
      std::vector<int> q_owner(static_cast<size_t>(hq), 0);
      std::vector<int> kv_holders(static_cast<size_t>(hkv), 0);
      for (int32_t t = 0; t < tp; ++t) {
        const AttentionShard s = attentionShard(hq, hkv, tp, t);
        for (int64_t kv = s.kv_heads.begin; kv < s.kv_heads.end(); ++kv) ++kv_holders[kv];
        for (int64_t h = s.q_heads.begin; h < s.q_heads.end(); ++h) {
          ++q_owner[static_cast<size_t>(h)];
          const int64_t kv = h / group;
          EXPECT_TRUE(kv >= s.kv_heads.begin && kv < s.kv_heads.end())
              << hq << "/" << hkv << " tp " << tp << " rank " << t << " head " << h;
          // The local q head index maps to the local kv head the attention op computes.
          const int64_t local_group = s.q_heads.count / s.kv_heads.count;
          EXPECT_EQ((h - s.q_heads.begin) / local_group, kv - s.kv_heads.begin);
        }
      }
      for (int c : q_owner) EXPECT_EQ(c, 1);
      for (int c : kv_holders) EXPECT_EQ(c, tp <= hkv ? 1 : tp / hkv);
    }
  }
  // gpt-oss at tp 8: one whole GQA group (8 q heads, 1 kv head) per rank, nothing replicated.
  const AttentionShard s = attentionShard(64, 8, 8, 5);
  EXPECT_EQ(s.q_heads, (IndexRange{40, 8}));
  EXPECT_EQ(s.kv_heads, (IndexRange{5, 1}));
  EXPECT_EQ(s.kv_replicas, 1);
}

TEST(ShardPlan, LayoutErrorsNameTheFlag) {
  auto msg = [](ParallelConfig p, int64_t hq = 64, int64_t hkv = 8) {
    return checkParallelConfig(p, hq, hkv, 32, 2880, 201088).message();
  };
  EXPECT_NE(msg({3, 1, 1}).find("--tp 3"), std::string::npos);
  EXPECT_NE(msg({2, 2, 3}).find("--ep 3"), std::string::npos);
  EXPECT_NE(msg({0, 1, 1}).find("--tp"), std::string::npos);
  EXPECT_NE(msg({8, 1, 1}, 48, 12).find("--tp 8"), std::string::npos);  // 8 ∤ 12, 12 ∤ 8
  EXPECT_TRUE(checkParallelConfig({16, 1, 1}, 64, 8, 32, 2880, 201088).isOk());  // kv replicas 2
  EXPECT_NE(msg({1, 1, 64}).find("--ep 64"), std::string::npos);                 // > 32 experts
  EXPECT_TRUE(checkParallelConfig({8, 1, 8}, 64, 8, 32, 2880, 201088).isOk());
  EXPECT_TRUE(checkParallelConfig({2, 4, 8}, 64, 8, 128, 2880, 201088).isOk());
}

// Simulates the whole dispatch/combine of one MoE layer for a layout: each source rank plans its
// rows; each destination expands what it receives; counts per (token, slot) and the weights each
// token gets back are checked.
void checkDispatch(const ParallelConfig& p, int64_t experts, int32_t k,
                   const std::vector<std::vector<int32_t>>& ids_per_src) {
  const int32_t world = p.world(), etp = p.etp();
  // [src][row][slot] → times computed, per etp column share.
  std::map<std::tuple<int, int, int>, std::vector<int>> computed;
  std::map<std::pair<int, int>, double> weight_back;  // (src, row) → Σ weights of its pairs
  std::vector<std::vector<int64_t>> sent_to(static_cast<size_t>(world));
  std::vector<DispatchSend> plans;
  for (int32_t src = 0; src < world; ++src) {
    const auto& ids = ids_per_src[static_cast<size_t>(src)];
    std::vector<float> w(ids.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = 1.f / static_cast<float>(1 + i % k);
    plans.push_back(planDispatch(p, experts, k, ids, w));
    const DispatchSend& d = plans.back();
    ASSERT_EQ(static_cast<int32_t>(d.rows_to.size()), world);
    ASSERT_EQ(std::accumulate(d.rows_to.begin(), d.rows_to.end(), int64_t{0}),
              static_cast<int64_t>(d.src_row.size()));
    // Walk the send buffer dest by dest, as the all-to-all delivers it.
    size_t at = 0;
    const int64_t n = static_cast<int64_t>(ids.size()) / k;
    std::vector<int> per_dest_rows(static_cast<size_t>(n), 0);
    for (int32_t q = 0; q < world; ++q) {
      const RankCoords qc = rankCoords(p, q);
      const IndexRange mine = evenSplit(experts, p.ep, qc.ep_rank);
      std::fill(per_dest_rows.begin(), per_dest_rows.end(), 0);
      const int64_t rows = d.rows_to[static_cast<size_t>(q)];
      std::vector<int32_t> lid(d.local_id.begin() + static_cast<int64_t>(at) * k,
                               d.local_id.begin() + static_cast<int64_t>(at + rows) * k);
      std::vector<float> lw(d.weight.begin() + static_cast<int64_t>(at) * k,
                            d.weight.begin() + static_cast<int64_t>(at + rows) * k);
      const DispatchPairs pairs = expandPairs(lid, lw, k);
      for (size_t j = 0; j < pairs.pair_row.size(); ++j) {
        const int32_t row = d.src_row[at + static_cast<size_t>(pairs.pair_row[j])];
        const int32_t global_e = pairs.expert[j] + static_cast<int32_t>(mine.begin);
        ASSERT_GE(pairs.expert[j], 0);
        ASSERT_LT(pairs.expert[j], mine.count);
        // Which slot: the one holding this expert (slots of a row have distinct experts).
        int slot = -1;
        for (int s = 0; s < k; ++s) {
          if (ids[static_cast<size_t>(row * k + s)] == global_e) slot = s;
        }
        ASSERT_GE(slot, 0) << "pair names an expert the token did not choose";
        auto& v = computed[{src, row, slot}];
        v.resize(static_cast<size_t>(etp), 0);
        ++v[static_cast<size_t>(qc.etp_rank)];
        if (qc.etp_rank == 0) weight_back[{src, row}] += pairs.weight[j];
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int32_t row = d.src_row[at + static_cast<size_t>(r)];
        ASSERT_GE(row, 0);
        ASSERT_LT(row, n);
        // A row carries at least one local expert, and reaches a destination at most once.
        bool any = false;
        for (int s = 0; s < k; ++s) any |= lid[static_cast<size_t>(r * k + s)] >= 0;
        EXPECT_TRUE(any);
        EXPECT_EQ(++per_dest_rows[static_cast<size_t>(row)], 1);
      }
      at += static_cast<size_t>(rows);
    }
    EXPECT_EQ(at, d.src_row.size());
  }
  // Every (src, row, slot): computed exactly once by each column share of its expert's group.
  int64_t total_rows_received = 0, tokens = 0;
  for (int32_t src = 0; src < world; ++src) {
    const auto& ids = ids_per_src[static_cast<size_t>(src)];
    const int64_t n = static_cast<int64_t>(ids.size()) / k;
    tokens += n;
    for (int64_t row = 0; row < n; ++row) {
      double want = 0;
      for (int s = 0; s < k; ++s) {
        want += 1.0 / (1 + s);
        auto it = computed.find({src, static_cast<int>(row), s});
        ASSERT_NE(it, computed.end()) << "token never reached its expert";
        for (int c : it->second) EXPECT_EQ(c, 1);
      }
      const double got = weight_back[std::make_pair(src, static_cast<int>(row))];
      EXPECT_NEAR(got, want, 1e-6);
    }
  }
  for (int32_t q = 0; q < world; ++q) {
    int64_t received = 0;
    for (const DispatchSend& d : plans) received += d.rows_to[static_cast<size_t>(q)];
    EXPECT_LE(received, tokens) << "capacity bound: one row per token per destination";
    total_rows_received += received;
  }
  (void)total_rows_received;
}

// Exhaustive over small cases: every ordered choice of k distinct experts out of E (E = 8 with
// k = 1, 2, 4; E = 12, not divisible by ep 8, with k = 1, 2) as a token, on every layout up to 8
// ranks (tp x dp x ep, ep | tp·dp).
TEST(ShardPlan, DispatchReachesEveryExpertOnceExhaustive) {
  for (const ParallelConfig& p : layouts(8)) {
    for (int64_t experts : {8, 12}) {
      if (p.ep > experts) continue;
      for (int32_t k : {1, 2, 4}) {
        if (experts == 12 && k == 4) continue;  // 11,880 tuples: E = 8 covers k = 4
        // All ordered k-tuples of distinct experts for one token (E=8,k=4: 1680), paired with a
        // fixed second token, spread over the source ranks.
        std::vector<int32_t> tuple(static_cast<size_t>(k));
        std::vector<std::vector<int32_t>> all;
        std::function<void(int, uint32_t)> rec = [&](int depth, uint32_t used) {
          if (depth == k) {
            all.push_back(tuple);
            return;
          }
          for (int32_t e = 0; e < experts; ++e) {
            if (used & (1u << e)) continue;
            tuple[static_cast<size_t>(depth)] = e;
            rec(depth + 1, used | (1u << e));
          }
        };
        rec(0, 0);
        // Every tuple as a token of some source rank, each beside another routing.
        std::vector<std::vector<int32_t>> per_src(static_cast<size_t>(p.world()));
        for (size_t i = 0; i < all.size(); ++i) {
          auto& dst = per_src[i % per_src.size()];
          dst.insert(dst.end(), all[i].begin(), all[i].end());
          const auto& other = all[(i * 31 + 5) % all.size()];
          dst.insert(dst.end(), other.begin(), other.end());
        }
        SCOPED_TRACE("tp " + std::to_string(p.tp) + " dp " + std::to_string(p.dp) + " ep " +
                     std::to_string(p.ep) + " E " + std::to_string(experts) + " k " +
                     std::to_string(k));
        checkDispatch(p, experts, k, per_src);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(ShardPlan, DispatchWithEmptyRanksAndLocalPairs) {
  const ParallelConfig p{2, 4, 8};
  std::vector<std::vector<int32_t>> per_src(8);
  per_src[3] = {0, 1, 2, 3, 7, 6, 5, 4};  // only rank 3 has tokens
  checkDispatch(p, 8, 4, per_src);
  // dp == 1: every rank sees all tokens; the union over ranks of localPairs is every slot once.
  const ParallelConfig q{4, 1, 2};
  const std::vector<int32_t> ids = {0, 5, 2, 7, 1, 3, 4, 6};
  const std::vector<float> w = {.4f, .3f, .2f, .1f, .25f, .25f, .25f, .25f};
  std::vector<int> seen(ids.size(), 0);
  for (int32_t r = 0; r < q.world(); ++r) {
    const DispatchPairs d = localPairs(q, 8, r, 4, ids, w);
    const IndexRange mine = moeShard(q, 8, 256, r).experts;
    for (size_t j = 0; j < d.pair_row.size(); ++j) {
      const int32_t e = d.expert[j] + static_cast<int32_t>(mine.begin);
      for (int s = 0; s < 4; ++s) {
        if (ids[static_cast<size_t>(d.pair_row[j] * 4 + s)] == e) {
          seen[static_cast<size_t>(d.pair_row[j] * 4 + s)] +=
              rankCoords(q, r).etp_rank == 0 ? 1 : 0;
          EXPECT_EQ(d.weight[j], w[static_cast<size_t>(d.pair_row[j] * 4 + s)]);
        }
      }
    }
  }
  for (int c : seen) EXPECT_EQ(c, 1);
}

// The in-process collectives: N threads, random data, results against a direct computation.
TEST(LocalComm, CollectivesMoveTheRightRows) {
  for (int32_t n : {1, 2, 3, 8}) {
    auto comms = LocalCommGroup::create(n, {});
    std::vector<std::vector<float>> reduce(static_cast<size_t>(n)), gathered(reduce.size()),
        a2a(reduce.size()), bcast(reduce.size());
    std::vector<std::vector<int64_t>> counts_recv(reduce.size());
    auto rowsFor = [](int r) { return static_cast<int64_t>(r % 3); };  // 0, 1, 2 rows
    auto sendRows = [](int s, int q) { return static_cast<int64_t>((s + 2 * q) % 3); };
    const int64_t cols = 5;
    auto value = [](int s, int q, int64_t i, int64_t c) {
      return static_cast<float>(s * 1000 + q * 100 + i * 10 + c);
    };
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        Communicator& c = *comms[static_cast<size_t>(r)];
        auto& red = reduce[static_cast<size_t>(r)];
        red.resize(7);
        for (int i = 0; i < 7; ++i) red[static_cast<size_t>(i)] = static_cast<float>(r * 7 + i);
        c.allReduceSum(Tensor(red.data(), DType::kF32, {7}));
        std::vector<int64_t> rpr;
        int64_t total = 0;
        for (int q = 0; q < n; ++q) {
          rpr.push_back(rowsFor(q));
          total += rowsFor(q);
        }
        std::vector<float> mine(static_cast<size_t>(rowsFor(r) * cols));
        for (int64_t i = 0; i < rowsFor(r); ++i) {
          for (int64_t cc = 0; cc < cols; ++cc) mine[i * cols + cc] = value(r, 0, i, cc);
        }
        auto& g = gathered[static_cast<size_t>(r)];
        g.assign(static_cast<size_t>(total * cols), -1.f);
        c.allGatherRows(Tensor(mine.data(), DType::kF32, {rowsFor(r), cols}), rpr,
                        Tensor(g.data(), DType::kF32, {total, cols}));
        std::vector<int64_t> send, recv(static_cast<size_t>(n));
        std::vector<float> sbuf;
        for (int q = 0; q < n; ++q) {
          send.push_back(sendRows(r, q));
          for (int64_t i = 0; i < sendRows(r, q); ++i) {
            for (int64_t cc = 0; cc < cols; ++cc) sbuf.push_back(value(r, q, i, cc));
          }
        }
        c.exchangeCounts(send, recv);
        counts_recv[static_cast<size_t>(r)] = recv;
        const int64_t rtotal = std::accumulate(recv.begin(), recv.end(), int64_t{0});
        auto& rb = a2a[static_cast<size_t>(r)];
        rb.assign(static_cast<size_t>(rtotal * cols), -1.f);
        c.allToAllRows(
            Tensor(sbuf.data(), DType::kF32, {static_cast<int64_t>(sbuf.size()) / cols, cols}),
            send, Tensor(rb.data(), DType::kF32, {rtotal, cols}), recv);
        auto& bc = bcast[static_cast<size_t>(r)];
        bc.assign(3, static_cast<float>(r));
        c.broadcast(Tensor(bc.data(), DType::kF32, {3}), n - 1);
      });
    }
    for (auto& t : threads) t.join();
    for (int32_t r = 0; r < n; ++r) {
      for (int i = 0; i < 7; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += static_cast<float>(q * 7 + i);
        EXPECT_EQ(reduce[static_cast<size_t>(r)][static_cast<size_t>(i)], want);
      }
      size_t at = 0;
      for (int q = 0; q < n; ++q) {
        for (int64_t i = 0; i < rowsFor(q); ++i) {
          for (int64_t cc = 0; cc < cols; ++cc) {
            EXPECT_EQ(gathered[static_cast<size_t>(r)][at++], value(q, 0, i, cc));
          }
        }
      }
      EXPECT_EQ(at, gathered[static_cast<size_t>(r)].size());
      at = 0;
      for (int q = 0; q < n; ++q) {
        EXPECT_EQ(counts_recv[static_cast<size_t>(r)][static_cast<size_t>(q)], sendRows(q, r));
        for (int64_t i = 0; i < sendRows(q, r); ++i) {
          for (int64_t cc = 0; cc < cols; ++cc) {
            EXPECT_EQ(a2a[static_cast<size_t>(r)][at++], value(q, r, i, cc));
          }
        }
      }
      EXPECT_EQ(at, a2a[static_cast<size_t>(r)].size());
      for (float f : bcast[static_cast<size_t>(r)]) EXPECT_EQ(f, static_cast<float>(n - 1));
    }
  }
}

}  // namespace
}  // namespace garden::rose
