#pragma once
// KvBlockManager: tulip's bookkeeping of rose's paged KV cache. rose allocates `num_blocks`
// blocks of `block_size` tokens (ModelFacts kv_num_blocks / kv_block_size) and never chooses
// block ids itself; this class hands them out, one block table per sequence, and keeps a prefix
// cache of full blocks.
//
// Prefix cache: a full block whose tokens' KV has been written (commit()) is registered under
// hash(parent block's hash, the block's tokens), so a later sequence whose prompt starts with the
// same full blocks shares them instead of recomputing them. Blocks carry reference counts (one per
// sequence table holding them); a block with no references is *free*: it sits in one LRU queue
// (front = reused first). Never-cached free blocks go to the front, cached ones to the back when
// their last reference drops, so allocation consumes plain free blocks first and evicts cached
// ones least recently released first. A hit on a cached free block takes it out of the queue.
// Hash hits are verified against the stored tokens and parent hash, so a 64-bit collision can
// never hand a sequence another prompt's KV.
//
// Allocation is all or nothing: allocate() returns nullopt and changes nothing when blocks run
// out (the scheduler then preempts or waits).
//
// Block groups (a worker serving --dp D data-parallel groups, ModelFacts kv_block_groups): group
// g owns ids [g * B, (g + 1) * B) with B = num_blocks / D, and every sequence's table lies in one
// group (the group's ranks hold its KV; rose refuses a table that straddles groups). Each group
// has its own free queue; a new sequence goes to the group with the longest cached prefix of its
// prompt (then the most free blocks, then the lowest index), a fork to its source's group, and a
// sequence grows inside its group. The chain hashes of a group start from its own root, so the
// prefix cache matches within a group only. One group (the default) is the single-worker case.
//
// Sliding-window mode (KvOptions::window = W > 0) [TAG_KV_WINDOW_GROUP]: the manager of a block
// pool that only sliding-window layers use (a query at position i reads keys i - W < j <= i). A
// table may then hold holes (-1) where its blocks were dropped: trim(seq, next) releases every
// block that no query at a position >= next can read (its last position < next - W + 1), so the
// holes are always a prefix of the table. A released block that was committed stays in the prefix
// cache's LRU queue like any freed block; commit() continues the chain hashes through holes (they
// depend on the tokens only). findCachedWindowPrefix() finds the longest prefix of L full blocks
// whose window is cached — the blocks covering positions [L * bs - W + 1, L * bs) — and returns it
// with holes before them (their tokens cannot be checked — the blocks are gone — so such a hit
// rests on the window blocks' stored tokens and the 64-bit chain hash of what precedes them);
// allocate() takes such a prefix and fork() shares holes as holes. (docs/llm-scheduler.md: the
// scheduler keeps such a pool when the worker's limits name one; rose does not report one yet.)
//
// Threads: not thread-safe; the LLM scheduler calls it under its own mutex.

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace garden::tulip {

using SeqId = uint64_t;

struct KvOptions {
  uint32_t num_blocks = 0;
  uint32_t block_size = 16;
  bool prefix_caching = true;
  uint32_t groups = 1;  // block groups (dp groups); num_blocks must be a multiple
  uint32_t window = 0;  // > 0: sliding-window mode, W keys per query [TAG_KV_WINDOW_GROUP]
};

class KvBlockManager {
 public:
  explicit KvBlockManager(KvOptions opts);

  uint32_t blocksTotal() const { return opts_.num_blocks; }
  // Blocks allocate() may hand out: never used, or cached without references.
  uint32_t blocksFree() const { return free_count_; }
  uint32_t blocksUsed() const { return opts_.num_blocks - free_count_; }
  uint32_t blocksCached() const { return static_cast<uint32_t>(cache_.size()); }
  uint32_t blockSize() const { return opts_.block_size; }
  uint32_t groups() const { return groups_; }
  uint32_t blocksPerGroup() const { return per_group_; }
  uint32_t blocksFreeInGroup(uint32_t g) const { return group_free_[g]; }
  uint32_t groupOfBlock(int32_t block) const { return static_cast<uint32_t>(block) / per_group_; }
  // The group of `seq`'s table; -1 for a sequence without blocks.
  int32_t groupOf(SeqId seq) const;
  bool prefixCaching() const { return opts_.prefix_caching; }
  uint64_t evictions() const { return evictions_; }

  // Blocks needed to hold `tokens` tokens.
  uint32_t blocksFor(uint64_t tokens) const {
    return static_cast<uint32_t>((tokens + opts_.block_size - 1) / opts_.block_size);
  }

  // The cached full blocks that start `tokens`, in order, leaving at least the last token out
  // (a step must compute one token to sample from). No state change; empty when caching is off.
  // With several groups: the longest such prefix over the groups (ties: the group with the most
  // free blocks, then the lowest); allocate() with it puts the sequence in that group.
  std::vector<int32_t> findCachedPrefix(std::span<const int32_t> tokens) const;

  // [TAG_KV_WINDOW_GROUP] Window mode only. The longest L <= max_blocks (and leaving at least the
  // last token out) whose window blocks — those covering positions [L * bs - window + 1, L * bs)
  // — are all cached in one group, as a table prefix of L entries: -1 before the window blocks.
  // Empty when no L > 0 qualifies or caching is off. Over groups: the longest, then the most free
  // blocks, then the lowest group. The joint hit with a full-attention group is this L when
  // max_blocks is that group's hit.
  // group >= 0: that group only (a window group follows its full-attention group's choice).
  std::vector<int32_t> findCachedWindowPrefix(std::span<const int32_t> tokens, uint64_t max_blocks,
                                              int32_t group = -1) const;
  // The first block index a query at `position` or later may read (window mode).
  uint64_t firstWindowBlock(uint64_t position) const;
  // [TAG_KV_WINDOW_GROUP] Window mode only: releases `seq`'s blocks that no query at a position >=
  // next_position reads (every block whose last position is < next_position - window + 1), leaving
  // holes. No-op for an unknown sequence.
  void trim(SeqId seq, uint64_t next_position);
  uint32_t window() const { return opts_.window; }

  // Grows `seq`'s table so it covers `num_tokens` tokens. A sequence without a table first takes
  // `prefix` (from findCachedPrefix with no state change in between; its blocks gain a
  // reference). Returns the table, or nullopt (nothing changed) when free blocks run out (in
  // the sequence's group: the prefix's, its table's, or for a new sequence without a prefix
  // the group with the most free blocks). In window mode the prefix may start with holes
  // (findCachedWindowPrefix).
  // group >= 0 puts a new sequence in that group (a window group's table follows its
  // full-attention group's); a prefix must then lie in it.
  std::optional<std::span<const int32_t>> allocate(SeqId seq, uint64_t num_tokens,
                                                   std::span<const int32_t> prefix = {},
                                                   int32_t group = -1);

  // Choices of one request (copy-on-write at block granularity): gives `seq`, which has no table
  // yet, the first `num_blocks` blocks of `from`'s table by reference (each gains one), then
  // grows it to cover `num_tokens` tokens with fresh blocks. The shared blocks must be full for
  // both: neither sequence writes them again, so nothing is ever copied; the partly filled block
  // after them is not shared (`seq` computes those tokens into its own fresh block). Returns the
  // table, or nullopt (nothing changed) when free blocks run out. In window mode holes among the
  // first num_blocks stay holes (the caller makes sure the blocks the new sequence's window needs
  // are present).
  std::optional<std::span<const int32_t>> fork(SeqId seq, SeqId from, uint32_t num_blocks,
                                               uint64_t num_tokens);

  // Registers `seq`'s full blocks within tokens[0, num_computed) (KV written) in the prefix
  // cache. `tokens` are the sequence's tokens from position 0.
  void commit(SeqId seq, std::span<const int32_t> tokens, uint64_t num_computed);

  // Drops `seq`'s references (no-op for an unknown sequence). Its blocks become free; cached ones
  // stay reusable until evicted, later blocks of the table evicted first.
  void free(SeqId seq);

  // Forgets every sequence and cached block (the worker restarted: the KV contents are gone).
  void reset();

  std::span<const int32_t> blockTable(SeqId seq) const;
  bool hasSeq(SeqId seq) const { return seqs_.count(seq) != 0; }
  size_t numSeqs() const { return seqs_.size(); }

  // For tests.
  int32_t refCount(int32_t block) const { return blocks_[block].ref; }
  bool isCached(int32_t block) const { return blocks_[block].cached; }
  // Free blocks in reuse order (front first).
  std::vector<int32_t> freeQueue() const;
  // OK, or INTERNAL naming the first broken invariant (references = table memberships, the free
  // queue holds exactly the unreferenced blocks, the cache map and block flags agree).
  Status checkInvariants() const;

 private:
  struct Block {
    int32_t ref = 0;
    int32_t prev = -1;  // free-queue links (-1 = none)
    int32_t next = -1;
    bool in_free = false;
    bool cached = false;
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
  };
  struct SeqState {
    std::vector<int32_t> table;
    uint32_t group = 0;          // every block of the table lies in it
    uint32_t hashed_blocks = 0;  // leading blocks whose chain hash is known
    uint64_t last_hash = 0;      // chain hash of block hashed_blocks - 1 (root when 0)
  };

  static uint64_t hashBlock(uint64_t parent, std::span<const int32_t> tokens);
  static uint64_t rootHash(uint32_t group);
  std::vector<int32_t> cachedPrefixIn(uint32_t group, std::span<const int32_t> tokens) const;
  // The longest of prefix_in(g) over the groups (ties: the most free blocks, then the lowest g).
  template <class PrefixIn>
  std::vector<int32_t> bestOverGroups(PrefixIn&& prefix_in) const;
  std::vector<int32_t> cachedWindowPrefixIn(uint32_t group, std::span<const int32_t> tokens,
                                            uint64_t max_blocks) const;
  void release(int32_t b);  // drops one reference; an unreferenced block joins the free queue
  int32_t lookup(uint32_t group, uint64_t parent, uint64_t hash,
                 std::span<const int32_t> tokens) const;
  void pushFront(int32_t b);
  void pushBack(int32_t b);
  void unlink(int32_t b);
  int32_t popFront(uint32_t group);  // evicts a cached block it takes
  void uncache(int32_t b);

  const KvOptions opts_;
  const uint32_t groups_;
  const uint32_t per_group_;
  std::vector<Block> blocks_;
  std::vector<int32_t> block_tokens_;  // block_size per block: the contents of cached blocks
  std::vector<int32_t> head_, tail_;   // per group: its free queue
  std::vector<uint32_t> group_free_;   // per group: blocks in its free queue
  uint32_t free_count_ = 0;            // over all groups
  std::unordered_map<uint64_t, int32_t> cache_;  // chain hash -> block
  std::unordered_map<SeqId, SeqState> seqs_;
  uint64_t evictions_ = 0;
};

}  // namespace garden::tulip
