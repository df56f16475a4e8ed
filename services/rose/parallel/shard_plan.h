#pragma once
// Index arithmetic of gpt-oss across the GPUs of one node (docs/multi-gpu.md): which heads,
// experts, intermediate columns and vocabulary rows a rank holds, which dp group a sequence
// belongs to, and the expert-parallel dispatch plan (which token rows go to which rank, with
// which local expert ids and router weights). Pure functions of host values, shared by the
// sharded model (gpt_oss_shard.cc) and its tests; nothing here touches a device.
//
// Rank layout for `--tp T --dp D --ep E` (world N = T·D, E divides N):
//   rank r = d·T + t      (d = dp group: its own sequences and KV cache; t = tp rank in it)
//   MoE: ep group g = r / (N/E) holds experts split(num_experts, E)[g]; etp = N/E ranks of one ep
//        group split each of those experts' intermediate columns in units of 32 (MXFP4 blocks).
//
// Threads: plain functions.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace garden::rose {

struct ParallelConfig {
  int32_t tp = 1;  // attention heads, vocabulary (embedding, lm_head) split over T ranks
  int32_t dp = 1;  // D groups of T ranks, each with its own sequences and KV cache
  int32_t ep = 1;  // experts split over E groups; the N/E ranks of a group split the columns
  int32_t world() const { return tp * dp; }
  int32_t etp() const { return world() / ep; }
};

// [begin, begin + count)
struct IndexRange {
  int64_t begin = 0;
  int64_t count = 0;
  int64_t end() const { return begin + count; }
  bool operator==(const IndexRange&) const = default;
};

// Part i of n split into `parts` contiguous pieces; the first n % parts pieces get one more.
IndexRange evenSplit(int64_t n, int64_t parts, int64_t i);
// The part that holds index x under evenSplit(n, parts, ·).
int64_t evenSplitOwner(int64_t n, int64_t parts, int64_t x);
// Part i of n split in whole units of `unit` (n a multiple of unit): evenSplit of the units.
IndexRange unitSplit(int64_t n, int64_t unit, int64_t parts, int64_t i);

struct RankCoords {
  int32_t rank = 0;
  int32_t dp_rank = 0;   // d
  int32_t tp_rank = 0;   // t
  int32_t ep_rank = 0;   // g
  int32_t etp_rank = 0;  // index inside the ep group
};
RankCoords rankCoords(const ParallelConfig& p, int32_t rank);

// Heads of tp rank t. tp <= Hkv: Hkv/tp kv heads and the Hq/tp q heads of their GQA groups.
// tp > Hkv (tp a multiple of Hkv, the group size a multiple of tp/Hkv): one kv head, held by
// tp/Hkv ranks (kv_replicas), each with a share of its q heads. gpt-oss (64 q / 8 kv):
// tp 2 → 32 q + 4 kv, tp 4 → 16 + 2, tp 8 → 8 + 1 (one whole GQA group per rank, no replica).
struct AttentionShard {
  IndexRange q_heads;
  IndexRange kv_heads;
  int32_t kv_replicas = 1;
};

// INVALID_ARGUMENT naming the flag when the layout cannot hold this model shape.
Status checkParallelConfig(const ParallelConfig& p, int64_t num_q_heads, int64_t num_kv_heads,
                           int64_t num_experts, int64_t intermediate, int64_t vocab);
AttentionShard attentionShard(int64_t num_q_heads, int64_t num_kv_heads, int32_t tp,
                              int32_t tp_rank);

// MoE shard of a rank: its experts (global ids) and its columns of the intermediate dimension
// (gate/up rows 2·i and 2·i+1 of W1 for i in `inter`, columns `inter` of W2). Rank etp_rank 0 of
// the group adds the down-projection bias.
struct MoeShard {
  IndexRange experts;
  IndexRange inter;
  bool adds_bias = false;
};
MoeShard moeShard(const ParallelConfig& p, int64_t num_experts, int64_t intermediate, int32_t rank);
// The ep group that holds expert e.
int32_t expertGroup(const ParallelConfig& p, int64_t num_experts, int64_t e);

// The dp group of a sequence: blocks [g·B, (g+1)·B) of tulip's block id space live in group g
// (B = blocks per group); a sequence's blocks must all be in one group.
inline int32_t dpGroupOfBlock(int32_t block_id, int32_t blocks_per_group) {
  return block_id / blocks_per_group;
}

// ---- Expert-parallel dispatch [TAG_EP_DISPATCH] ----
//
// Source side: rows[i] of one source rank (its share of its dp group's tokens) with topk
// ids/weights [n, k]. For every destination rank q whose ep group holds at least one of row i's
// k experts, row i is sent ONCE (all etp ranks of that group get it), carrying k local expert
// ids (−1 where slot s's expert lives elsewhere) and the k router weights. Send order: by
// destination rank, then by row. So a destination receives at most one row per source token:
// rows received ≤ Σ tokens of the step, which is what buffers are sized by — overflow is
// impossible by construction, no capacity factor and no dropped tokens.
struct DispatchSend {
  std::vector<int64_t> rows_to;   // [world] rows sent to each rank
  std::vector<int32_t> src_row;   // [S] source row (index into the sender's rows) of each sent row
  std::vector<int32_t> local_id;  // [S·k] expert id local to the destination, or −1
  std::vector<float> weight;      // [S·k] router weight (0 where local_id is −1)
};
DispatchSend planDispatch(const ParallelConfig& p, int64_t num_experts, int32_t top_k,
                          std::span<const int32_t> topk_ids, std::span<const float> topk_w);

// Destination side: the received rows' local ids → expert pairs: one pair per (received row,
// slot with a local expert), in (row, slot) order. pair_row[j] is the received row of pair j.
struct DispatchPairs {
  std::vector<int32_t> pair_row;
  std::vector<int32_t> expert;  // local expert id
  std::vector<float> weight;
};
DispatchPairs expandPairs(std::span<const int32_t> local_id, std::span<const float> weight,
                          int32_t top_k);

// Replicated tokens (dp == 1: every rank has every token after the attention all-reduce): the
// (row, slot) pairs whose expert this rank's group holds, in (row, slot) order, with local ids.
DispatchPairs localPairs(const ParallelConfig& p, int64_t num_experts, int32_t rank, int32_t top_k,
                         std::span<const int32_t> topk_ids, std::span<const float> topk_w);

}  // namespace garden::rose
