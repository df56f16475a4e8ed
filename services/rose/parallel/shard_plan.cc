#include "services/rose/parallel/shard_plan.h"

#include <algorithm>

namespace garden::rose {

IndexRange evenSplit(int64_t n, int64_t parts, int64_t i) {
  CHECK(parts > 0 && i >= 0 && i < parts && n >= 0);
  const int64_t base = n / parts, extra = n % parts;
  IndexRange r;
  r.begin = i * base + std::min(i, extra);
  r.count = base + (i < extra ? 1 : 0);
  return r;
}

int64_t evenSplitOwner(int64_t n, int64_t parts, int64_t x) {
  CHECK(parts > 0 && x >= 0 && x < n);
  const int64_t base = n / parts, extra = n % parts;
  const int64_t big = extra * (base + 1);  // indices held by the first `extra` parts
  if (x < big) return x / (base + 1);
  return extra + (x - big) / base;
}

IndexRange unitSplit(int64_t n, int64_t unit, int64_t parts, int64_t i) {
  CHECK(unit > 0 && n % unit == 0);
  const IndexRange u = evenSplit(n / unit, parts, i);
  return IndexRange{u.begin * unit, u.count * unit};
}

RankCoords rankCoords(const ParallelConfig& p, int32_t rank) {
  CHECK(rank >= 0 && rank < p.world());
  RankCoords c;
  c.rank = rank;
  c.dp_rank = rank / p.tp;
  c.tp_rank = rank % p.tp;
  c.ep_rank = rank / p.etp();
  c.etp_rank = rank % p.etp();
  return c;
}

Status checkParallelConfig(const ParallelConfig& p, int64_t hq, int64_t hkv, int64_t experts,
                           int64_t inter, int64_t vocab) {
  if (p.tp < 1 || p.dp < 1 || p.ep < 1) {
    return invalidArgument("--tp, --dp and --ep must be >= 1");
  }
  if (p.world() > 64) return invalidArgument("--tp x --dp must be <= 64 (GPUs of one node)");
  if (p.world() % p.ep != 0) {
    return invalidArgument("--ep " + std::to_string(p.ep) +
                           " must divide --tp x --dp = " + std::to_string(p.world()));
  }
  if (hq % p.tp != 0) {
    return invalidArgument("--tp " + std::to_string(p.tp) + " must divide the " +
                           std::to_string(hq) + " attention heads");
  }
  if (p.tp <= hkv ? hkv % p.tp != 0 : p.tp % hkv != 0) {
    return invalidArgument("--tp " + std::to_string(p.tp) + " and the " + std::to_string(hkv) +
                           " kv heads: one must divide the other");
  }
  if (p.ep > experts) {
    return invalidArgument("--ep " + std::to_string(p.ep) + " exceeds the " +
                           std::to_string(experts) + " experts");
  }
  if (p.etp() > 1 && (inter % 32 != 0 || inter / 32 < p.etp())) {
    return invalidArgument("--tp x --dp / --ep = " + std::to_string(p.etp()) +
                           " ranks per expert group split intermediate_size " +
                           std::to_string(inter) + " in units of 32: too few units");
  }
  if (vocab < p.tp) return invalidArgument("--tp exceeds the vocabulary size");
  return okStatus();
}

AttentionShard attentionShard(int64_t hq, int64_t hkv, int32_t tp, int32_t t) {
  CHECK(tp > 0 && t >= 0 && t < tp && hq % tp == 0);
  AttentionShard s;
  s.q_heads = IndexRange{t * (hq / tp), hq / tp};
  if (tp <= hkv) {
    CHECK(hkv % tp == 0);
    s.kv_heads = IndexRange{t * (hkv / tp), hkv / tp};
  } else {
    CHECK(tp % hkv == 0);
    s.kv_replicas = static_cast<int32_t>(tp / hkv);
    s.kv_heads = IndexRange{t / s.kv_replicas, 1};
  }
  return s;
}

MoeShard moeShard(const ParallelConfig& p, int64_t experts, int64_t inter, int32_t rank) {
  const RankCoords c = rankCoords(p, rank);
  MoeShard m;
  m.experts = evenSplit(experts, p.ep, c.ep_rank);
  m.inter = p.etp() == 1 ? IndexRange{0, inter} : unitSplit(inter, 32, p.etp(), c.etp_rank);
  m.adds_bias = c.etp_rank == 0;
  return m;
}

int32_t expertGroup(const ParallelConfig& p, int64_t experts, int64_t e) {
  return static_cast<int32_t>(evenSplitOwner(experts, p.ep, e));
}

DispatchSend planDispatch(const ParallelConfig& p, int64_t experts, int32_t k,
                          std::span<const int32_t> ids, std::span<const float> w) {
  CHECK(k > 0 && ids.size() % static_cast<size_t>(k) == 0 && w.size() == ids.size());
  const int64_t n = static_cast<int64_t>(ids.size()) / k;
  const int32_t world = p.world(), etp = p.etp();
  DispatchSend d;
  d.rows_to.assign(static_cast<size_t>(world), 0);
  // One pass per destination group; every rank of the group gets the same rows.
  std::vector<int32_t> rows;
  std::vector<int32_t> lid;
  std::vector<float> lw;
  for (int32_t g = 0; g < p.ep; ++g) {
    const IndexRange mine = evenSplit(experts, p.ep, g);
    rows.clear();
    lid.clear();
    lw.clear();
    for (int64_t i = 0; i < n; ++i) {
      bool any = false;
      for (int32_t s = 0; s < k; ++s) {
        const int32_t e = ids[static_cast<size_t>(i * k + s)];
        CHECK(e >= 0 && e < experts);
        any |= e >= mine.begin && e < mine.end();
      }
      if (!any) continue;
      rows.push_back(static_cast<int32_t>(i));
      for (int32_t s = 0; s < k; ++s) {
        const int32_t e = ids[static_cast<size_t>(i * k + s)];
        const bool local = e >= mine.begin && e < mine.end();
        lid.push_back(local ? static_cast<int32_t>(e - mine.begin) : -1);
        lw.push_back(local ? w[static_cast<size_t>(i * k + s)] : 0.f);
      }
    }
    for (int32_t j = 0; j < etp; ++j) {
      d.rows_to[static_cast<size_t>(g * etp + j)] = static_cast<int64_t>(rows.size());
      d.src_row.insert(d.src_row.end(), rows.begin(), rows.end());
      d.local_id.insert(d.local_id.end(), lid.begin(), lid.end());
      d.weight.insert(d.weight.end(), lw.begin(), lw.end());
    }
  }
  return d;
}

DispatchPairs expandPairs(std::span<const int32_t> local_id, std::span<const float> weight,
                          int32_t k) {
  CHECK(k > 0 && local_id.size() % static_cast<size_t>(k) == 0 && weight.size() == local_id.size());
  DispatchPairs p;
  for (size_t i = 0; i < local_id.size(); ++i) {
    if (local_id[i] < 0) continue;
    p.pair_row.push_back(static_cast<int32_t>(i / static_cast<size_t>(k)));
    p.expert.push_back(local_id[i]);
    p.weight.push_back(weight[i]);
  }
  return p;
}

DispatchPairs localPairs(const ParallelConfig& p, int64_t experts, int32_t rank, int32_t k,
                         std::span<const int32_t> ids, std::span<const float> w) {
  CHECK(k > 0 && ids.size() % static_cast<size_t>(k) == 0 && w.size() == ids.size());
  const IndexRange mine = evenSplit(experts, p.ep, rankCoords(p, rank).ep_rank);
  DispatchPairs d;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t e = ids[i];
    CHECK(e >= 0 && e < experts);
    if (e < mine.begin || e >= mine.end()) continue;
    d.pair_row.push_back(static_cast<int32_t>(i / static_cast<size_t>(k)));
    d.expert.push_back(static_cast<int32_t>(e - mine.begin));
    d.weight.push_back(w[i]);
  }
  return d;
}

}  // namespace garden::rose
