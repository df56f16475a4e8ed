// KvBlockManager: exact block ids, reference counts, LRU eviction order and a randomized
// invariant check, on tiny pools (block size 4).
#include "services/tulip/kv/block_manager.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>

namespace garden::tulip {
namespace {

std::vector<int32_t> iota(int32_t n, int32_t start = 100) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::vector<int32_t> table(const KvBlockManager& m, SeqId s) {
  auto t = m.blockTable(s);
  return {t.begin(), t.end()};
}

// The randomized runs' shared pieces: four prompts of 3..14 tokens over a 5-token alphabet (so
// prefixes repeat), and freeing one live sequence picked at random.
std::vector<std::vector<int32_t>> randomPrompts(std::mt19937& rng) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p(3 + rng() % 12);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 5);
    prompts.push_back(p);
  }
  return prompts;
}

template <class Live>
void freeOneAtRandom(KvBlockManager& m, Live& live, std::mt19937& rng) {
  auto it = std::next(live.begin(), rng() % live.size());
  m.free(it->first);
  live.erase(it);
}

// A live sequence of the randomized runs: its tokens and how many of them are computed.
struct LiveSeq {
  std::vector<int32_t> tokens;
  uint64_t computed;
};

// Admits sequence `next` with a random one of `prompts` on the prefix `find` returns for it,
// when the blocks suffice (its computed tokens: the prefix; `hits` counts the prefix's blocks).
template <class Find>
void admitAtRandom(KvBlockManager& m, std::map<SeqId, LiveSeq>& live, SeqId& next,
                   uint64_t& hits, const std::vector<std::vector<int32_t>>& prompts,
                   std::mt19937& rng, Find&& find) {
  LiveSeq l{prompts[rng() % prompts.size()], 0};
  const std::vector<int32_t> hit = find(l.tokens);
  if (m.allocate(next, l.tokens.size(), hit)) {
    l.computed = hit.size() * m.blockSize();
    hits += hit.size();
    live.emplace(next, l);
  } else {
    EXPECT_FALSE(m.hasSeq(next));
  }
  ++next;
}

TEST(KvBlockManager, AllocateAndFreeAccounting) {
  KvBlockManager m({8, 4, true});
  EXPECT_EQ(m.blocksFree(), 8u);
  auto t = m.allocate(1, 5);  // 2 blocks
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(m.blocksFree(), 6u);
  EXPECT_EQ(m.blocksUsed(), 2u);
  // Growing within the last block takes nothing; crossing into a new one takes one.
  ASSERT_TRUE(m.allocate(1, 8).has_value());
  EXPECT_EQ(m.blocksFree(), 6u);
  ASSERT_TRUE(m.allocate(1, 9).has_value());
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{0, 1, 2}));
  ASSERT_TRUE(m.allocate(2, 20).has_value());  // 5 blocks: 3..7
  EXPECT_EQ(table(m, 2), (std::vector<int32_t>{3, 4, 5, 6, 7}));
  EXPECT_EQ(m.blocksFree(), 0u);
  // Out of blocks: nullopt and nothing changes.
  EXPECT_FALSE(m.allocate(1, 13).has_value());
  EXPECT_FALSE(m.allocate(3, 1).has_value());
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(m.hasSeq(3));
  EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
  m.free(2);
  EXPECT_EQ(m.blocksFree(), 5u);
  m.free(1);
  m.free(1);  // unknown now: no-op
  EXPECT_EQ(m.blocksFree(), 8u);
  EXPECT_EQ(m.numSeqs(), 0u);
  EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
}

TEST(KvBlockManager, RepeatedPrefixSharesBlocks) {
  KvBlockManager m({10, 4, true});
  const auto prompt = iota(10);  // two full blocks + 2 tokens
  EXPECT_TRUE(m.findCachedPrefix(prompt).empty());
  ASSERT_TRUE(m.allocate(1, prompt.size()).has_value());
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{0, 1, 2}));
  // Not computed yet: nothing to hit.
  EXPECT_TRUE(m.findCachedPrefix(prompt).empty());
  m.commit(1, prompt, prompt.size());
  EXPECT_EQ(m.blocksCached(), 2u);  // the partial third block is not cached
  EXPECT_TRUE(m.isCached(0) && m.isCached(1) && !m.isCached(2));

  // Same prompt: both full blocks hit.
  auto hit = m.findCachedPrefix(prompt);
  EXPECT_EQ(hit, (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(m.allocate(2, prompt.size(), hit).has_value());
  EXPECT_EQ(table(m, 2), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(m.refCount(0), 2);
  EXPECT_EQ(m.refCount(1), 2);
  EXPECT_EQ(m.refCount(3), 1);
  EXPECT_EQ(m.blocksUsed(), 4u);

  // A prompt that shares only the first block hits only that one; a different first block
  // hits nothing (the chain hash includes the parent).
  auto other = prompt;
  other[5] = 7;
  EXPECT_EQ(m.findCachedPrefix(other), (std::vector<int32_t>{0}));
  auto shifted = prompt;
  shifted[0] = 7;
  EXPECT_TRUE(m.findCachedPrefix(shifted).empty());

  // An exact multiple of the block size leaves its last block to compute.
  std::vector<int32_t> eight(prompt.begin(), prompt.begin() + 8);
  EXPECT_EQ(m.findCachedPrefix(eight), (std::vector<int32_t>{0}));

  m.free(1);
  EXPECT_EQ(m.refCount(0), 1);
  m.free(2);
  EXPECT_EQ(m.refCount(0), 0);
  EXPECT_EQ(m.blocksFree(), 10u);
  // Cached blocks survive their sequences and can be revived from the free queue.
  hit = m.findCachedPrefix(prompt);
  EXPECT_EQ(hit, (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(m.allocate(3, 12, hit).has_value());
  EXPECT_EQ(m.refCount(0), 1);
  EXPECT_EQ(m.blocksFree(), 7u);
  EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
}

TEST(KvBlockManager, LruOrderAndEvictionUnderPressure) {
  KvBlockManager m({6, 2, true});
  const std::vector<int32_t> a = {1, 2, 3, 4, 5};  // blocks [1,2] [3,4] + 1 token
  const std::vector<int32_t> b = {9, 8, 7, 6, 5};
  ASSERT_TRUE(m.allocate(1, a.size()).has_value());  // 0 1 2
  ASSERT_TRUE(m.allocate(2, b.size()).has_value());  // 3 4 5
  m.commit(1, a, a.size());
  m.commit(2, b, b.size());
  m.free(1);  // uncached 2 to the front; cached 1, then 0 to the back
  EXPECT_EQ(m.freeQueue(), (std::vector<int32_t>{2, 1, 0}));
  m.free(2);
  EXPECT_EQ(m.freeQueue(), (std::vector<int32_t>{5, 2, 1, 0, 4, 3}));
  EXPECT_EQ(m.blocksCached(), 4u);
  // A 3-block request takes the two plain blocks, then evicts the least recently freed cached
  // block: a's tail block 1.
  ASSERT_TRUE(m.allocate(3, 6).has_value());
  EXPECT_EQ(table(m, 3), (std::vector<int32_t>{5, 2, 1}));
  EXPECT_EQ(m.evictions(), 1u);
  EXPECT_FALSE(m.isCached(1));
  EXPECT_EQ(m.findCachedPrefix(a), (std::vector<int32_t>{0}));  // a's head block still there
  EXPECT_EQ(m.findCachedPrefix(b), (std::vector<int32_t>{3, 4}));
  // Reviving b's blocks moves them out of the queue; the next eviction takes a's head.
  auto hit = m.findCachedPrefix(b);
  ASSERT_TRUE(m.allocate(4, b.size(), hit).has_value());
  EXPECT_EQ(table(m, 4), (std::vector<int32_t>{3, 4, 0}));
  EXPECT_EQ(m.evictions(), 2u);
  EXPECT_TRUE(m.findCachedPrefix(a).empty());
  EXPECT_EQ(m.blocksFree(), 0u);
  // Full: nothing more, and a prefix hit on referenced blocks needs no free block.
  EXPECT_FALSE(m.allocate(5, 1).has_value());
  ASSERT_TRUE(m.allocate(5, 4, hit).has_value());
  EXPECT_EQ(m.refCount(3), 2);
  EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
}

TEST(KvBlockManager, AllOrNothingWithRevivedPrefix) {
  KvBlockManager m({4, 2, true});
  const std::vector<int32_t> a = {1, 2, 3, 4, 5};
  ASSERT_TRUE(m.allocate(1, a.size()).has_value());
  m.commit(1, a, a.size());
  m.free(1);
  ASSERT_TRUE(m.allocate(2, 2).has_value());  // takes the plain block 2 (queue front)
  EXPECT_EQ(table(m, 2), (std::vector<int32_t>{2}));
  // 3 free blocks: 2 cached (a's) + 1 plain. a's prefix (2 blocks, unreferenced) + 2 more
  // blocks needs 4: refused, and the cached blocks stay in the queue untouched.
  auto hit = m.findCachedPrefix(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8});
  ASSERT_EQ(hit.size(), 2u);
  EXPECT_FALSE(m.allocate(3, 8, hit).has_value());
  EXPECT_FALSE(m.hasSeq(3));
  EXPECT_EQ(m.blocksFree(), 3u);
  EXPECT_EQ(m.refCount(hit[0]), 0);
  ASSERT_TRUE(m.allocate(3, 6, hit).has_value());
  EXPECT_EQ(m.blocksFree(), 0u);
  EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
}

TEST(KvBlockManager, DuplicateComputationStaysPrivate) {
  KvBlockManager m({8, 2, true});
  const std::vector<int32_t> p = {1, 2, 3, 4, 5};
  ASSERT_TRUE(m.allocate(1, p.size()).has_value());
  ASSERT_TRUE(m.allocate(2, p.size()).has_value());  // both missed at once
  m.commit(1, p, p.size());
  m.commit(2, p, p.size());
  EXPECT_EQ(m.blocksCached(), 2u);
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(table(m, 2), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(m.findCachedPrefix(p), (std::vector<int32_t>{0, 1}));
  EXPECT_FALSE(m.isCached(3));
  m.free(2);
  EXPECT_EQ(m.blocksCached(), 2u);
  EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
}

TEST(KvBlockManager, CachingOffAndReset) {
  KvBlockManager m({4, 2, false});
  const std::vector<int32_t> p = {1, 2, 3, 4, 5};
  ASSERT_TRUE(m.allocate(1, p.size()).has_value());
  m.commit(1, p, p.size());
  EXPECT_EQ(m.blocksCached(), 0u);
  EXPECT_TRUE(m.findCachedPrefix(p).empty());
  m.reset();
  EXPECT_EQ(m.blocksFree(), 4u);
  EXPECT_FALSE(m.hasSeq(1));
  EXPECT_TRUE(m.checkInvariants().isOk());
}

// Random allocate / grow / commit / free with prefix reuse from a small pool of prompts; the
// invariants hold after every operation and everything returns to the free queue at the end.
TEST(KvBlockManager, RandomOperationsKeepInvariantsAndLeakNothing) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    std::mt19937 rng(seed);
    KvBlockManager m({24, 3, true});
    const std::vector<std::vector<int32_t>> prompts = randomPrompts(rng);
    std::map<SeqId, LiveSeq> live;
    SeqId next = 1;
    uint64_t hits = 0;
    for (int op = 0; op < 3000; ++op) {
      const uint32_t r = rng() % 10;
      if (r < 4) {
        admitAtRandom(m, live, next, hits, prompts, rng,
                      [&](const std::vector<int32_t>& t) { return m.findCachedPrefix(t); });
      } else if (r < 7 && !live.empty()) {
        auto it = std::next(live.begin(), rng() % live.size());
        it->second.computed = it->second.tokens.size();
        m.commit(it->first, it->second.tokens, it->second.computed);
        // decode one more token
        it->second.tokens.push_back(static_cast<int32_t>(rng() % 5));
        if (!m.allocate(it->first, it->second.tokens.size())) {
          m.free(it->first);
          live.erase(it);
        }
      } else if (!live.empty()) {
        freeOneAtRandom(m, live, rng);
      }
      Status st = m.checkInvariants();
      ASSERT_TRUE(st.isOk()) << "seed " << seed << " op " << op << ": " << st.toString();
      for (auto& [id, l] : live) {
        ASSERT_EQ(m.blockTable(id).size(), m.blocksFor(l.tokens.size()));
      }
    }
    EXPECT_GT(hits, 0u) << "seed " << seed;
    for (auto& [id, l] : live) m.free(id);
    EXPECT_EQ(m.blocksFree(), m.blocksTotal());
    EXPECT_EQ(m.numSeqs(), 0u);
    EXPECT_TRUE(m.checkInvariants().isOk());
  }
}


// [TAG_LLM_CHOICES] A choice shares its leader's full prompt blocks by reference and gets fresh
// blocks for the rest; references return to zero when both have gone, in either order.
TEST(KvBlockManager, ForkSharesFullBlocksByReference) {
  for (bool leader_first : {true, false}) {
    SCOPED_TRACE(leader_first ? "leader freed first" : "choice freed first");
    KvBlockManager m({8, 4, true});
    ASSERT_TRUE(m.allocate(1, 10).has_value());  // blocks 0 1 2: 10 tokens
    auto t = m.fork(2, 1, 2, 10);                // shares 0 1, a fresh block for tokens 8..9
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(table(m, 2), (std::vector<int32_t>{0, 1, 3}));
    EXPECT_EQ(m.refCount(0), 2);
    EXPECT_EQ(m.refCount(1), 2);
    EXPECT_EQ(m.refCount(2), 1);
    EXPECT_EQ(m.refCount(3), 1);
    EXPECT_EQ(m.blocksFree(), 4u);
    ASSERT_TRUE(m.fork(3, 1, 2, 13).has_value());  // grows past the shared blocks: 2 fresh
    EXPECT_EQ(table(m, 3), (std::vector<int32_t>{0, 1, 4, 5}));
    EXPECT_EQ(m.refCount(0), 3);
    EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
    // Both choices commit the same prompt: the shared blocks are cached once.
    const auto prompt = iota(10);
    m.commit(1, prompt, 10);
    m.commit(2, prompt, 10);
    EXPECT_TRUE(m.isCached(0));
    EXPECT_TRUE(m.isCached(1));
    EXPECT_EQ(m.blocksCached(), 2u);
    if (leader_first) {
      m.free(1);
      EXPECT_EQ(m.refCount(0), 2);
      m.free(2);
      m.free(3);
    } else {
      m.free(3);
      m.free(2);
      EXPECT_EQ(m.refCount(0), 1);
      m.free(1);
    }
    for (int32_t b = 0; b < 8; ++b) EXPECT_EQ(m.refCount(b), 0) << "block " << b;
    EXPECT_EQ(m.blocksFree(), 8u);
    EXPECT_EQ(m.numSeqs(), 0u);
    EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
  }
}

TEST(KvBlockManager, ForkIsAllOrNothing) {
  KvBlockManager m({4, 4, true});
  ASSERT_TRUE(m.allocate(1, 12).has_value());  // 3 of 4 blocks
  EXPECT_FALSE(m.fork(2, 1, 2, 16).has_value());  // needs 2 fresh, 1 free
  EXPECT_FALSE(m.hasSeq(2));
  EXPECT_EQ(m.refCount(0), 1);
  EXPECT_EQ(m.blocksFree(), 1u);
  auto t = m.fork(2, 1, 2, 12);  // 1 fresh
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(table(m, 2), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
}

// Block groups (rose --dp, ModelFacts kv_block_groups): group g owns ids [g * B, (g + 1) * B).
// A new sequence goes to the group with the most free blocks, grows and forks inside its group,
// and never holds a block of another one; a group that runs out refuses even when another has
// room.
TEST(KvBlockManager, GroupsKeepEverySequenceInOneGroup) {
  KvBlockManager m({16, 4, true, 2});  // groups 0: ids 0..7, 1: ids 8..15
  EXPECT_EQ(m.groups(), 2u);
  EXPECT_EQ(m.blocksPerGroup(), 8u);
  ASSERT_TRUE(m.allocate(1, 12).has_value());  // 3 blocks, both groups equally free: group 0
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{0, 1, 2}));
  ASSERT_TRUE(m.allocate(2, 4).has_value());  // group 1 has more free blocks now
  EXPECT_EQ(table(m, 2), (std::vector<int32_t>{8}));
  ASSERT_TRUE(m.allocate(3, 8).has_value());  // 5 vs 7 free: group 1
  EXPECT_EQ(table(m, 3), (std::vector<int32_t>{9, 10}));
  EXPECT_EQ(m.groupOf(1), 0);
  EXPECT_EQ(m.groupOf(2), 1);
  EXPECT_EQ(m.groupOf(4), -1);
  // Growing stays in the group, whatever the other group has free.
  ASSERT_TRUE(m.allocate(1, 32).has_value());  // 8 blocks: all of group 0
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(m.blocksFreeInGroup(0), 0u);
  EXPECT_EQ(m.blocksFreeInGroup(1), 5u);
  EXPECT_FALSE(m.allocate(1, 33).has_value()) << "group 0 is full; group 1's blocks are not its";
  EXPECT_EQ(table(m, 1).size(), 8u);
  // A fork shares its source's blocks, so it takes the rest from the source's group.
  ASSERT_TRUE(m.fork(4, 3, 1, 9).has_value());  // shares 9, grows to 3 blocks
  EXPECT_EQ(m.groupOf(4), 1);
  for (int32_t b : table(m, 4)) EXPECT_GE(b, 8);
  EXPECT_EQ(table(m, 4)[0], 9);
  EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
  m.free(1);
  m.free(2);
  m.free(3);
  m.free(4);
  EXPECT_EQ(m.blocksFree(), 16u);
  EXPECT_EQ(m.blocksFreeInGroup(0), 8u);
  EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
}

// The prefix cache matches inside a group only, and a new sequence goes to the group holding
// the longest cached prefix of its prompt (its blocks are reused there, not recomputed).
TEST(KvBlockManager, GroupsCacheAndFindPrefixesPerGroup) {
  KvBlockManager m({16, 4, true, 2});
  const auto prompt = iota(10);  // two full blocks + 2 tokens
  ASSERT_TRUE(m.allocate(9, 4).has_value());  // group 0 holds one block: group 1 is freer
  ASSERT_TRUE(m.allocate(1, prompt.size()).has_value());
  EXPECT_EQ(m.groupOf(1), 1);
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{8, 9, 10}));
  m.commit(1, prompt, prompt.size());
  m.free(1);
  // Group 1 is now the freer one and holds the prefix; take group 1's blocks down so group 0
  // is freer: the prefix still decides.
  ASSERT_TRUE(m.allocate(5, 16).has_value());
  EXPECT_EQ(m.groupOf(5), 1);
  EXPECT_GT(m.blocksFreeInGroup(0), m.blocksFreeInGroup(1));
  const auto hit = m.findCachedPrefix(prompt);
  EXPECT_EQ(hit, (std::vector<int32_t>{8, 9}));
  ASSERT_TRUE(m.allocate(2, prompt.size(), hit).has_value());
  EXPECT_EQ(m.groupOf(2), 1);
  EXPECT_EQ(table(m, 2)[0], 8);
  EXPECT_EQ(table(m, 2)[1], 9);
  // The same prompt computed in group 0 is cached there too, under group 0's own chain: both
  // groups now hit, each on its own blocks.
  m.free(2);
  m.free(5);
  ASSERT_TRUE(m.allocate(6, 32).has_value());  // all of group 1 (the freer by its 8 vs 7)
  EXPECT_EQ(m.groupOf(6), 1);
  EXPECT_TRUE(m.findCachedPrefix(prompt).empty()) << "group 1's cached blocks were evicted";
  ASSERT_TRUE(m.allocate(3, prompt.size()).has_value());
  EXPECT_EQ(m.groupOf(3), 0);
  m.commit(3, prompt, prompt.size());
  m.free(3);
  const auto hit0 = m.findCachedPrefix(prompt);
  ASSERT_EQ(hit0.size(), 2u);
  for (int32_t b : hit0) EXPECT_LT(b, 8);
  EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
}

// The randomized invariant run with four groups: no table ever straddles groups (checkInvariants
// checks it), nothing leaks, prefixes still hit.
TEST(KvBlockManager, GroupsRandomOperationsKeepInvariants) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    std::mt19937 rng(seed);
    KvBlockManager m({32, 3, true, 4});
    const std::vector<std::vector<int32_t>> prompts = randomPrompts(rng);
    std::map<SeqId, std::vector<int32_t>> live;
    SeqId next = 1;
    uint64_t hits = 0;
    for (int op = 0; op < 3000; ++op) {
      const uint32_t r = rng() % 10;
      if (r < 4) {
        std::vector<int32_t> tokens = prompts[rng() % prompts.size()];
        auto hit = m.findCachedPrefix(tokens);
        if (m.allocate(next, tokens.size(), hit)) {
          hits += hit.size();
          live.emplace(next, tokens);
        } else {
          ASSERT_FALSE(m.hasSeq(next));
        }
        ++next;
      } else if (r < 7 && !live.empty()) {
        auto it = std::next(live.begin(), rng() % live.size());
        m.commit(it->first, it->second, it->second.size());
        const int32_t g = m.groupOf(it->first);
        it->second.push_back(static_cast<int32_t>(rng() % 5));
        if (!m.allocate(it->first, it->second.size())) {
          ASSERT_EQ(m.blocksFreeInGroup(static_cast<uint32_t>(g)), 0u);
          m.free(it->first);
          live.erase(it);
        } else {
          ASSERT_EQ(m.groupOf(it->first), g);
        }
      } else if (!live.empty()) {
        freeOneAtRandom(m, live, rng);
      }
      Status st = m.checkInvariants();
      ASSERT_TRUE(st.isOk()) << "seed " << seed << " op " << op << ": " << st.toString();
    }
    EXPECT_GT(hits, 0u) << "seed " << seed;
    for (auto& [id, l] : live) m.free(id);
    EXPECT_EQ(m.blocksFree(), m.blocksTotal());
    for (uint32_t g = 0; g < 4; ++g) EXPECT_EQ(m.blocksFreeInGroup(g), 8u);
    EXPECT_TRUE(m.checkInvariants().isOk());
  }
}

// ---- sliding-window mode [TAG_KV_WINDOW_GROUP] -------------------------------------------

// trim() drops exactly the blocks no later query reads (window 8, blocks of 4: a query at position
// p reads p - 7 .. p), leaving holes at the front; committed blocks it drops stay cached and go to
// the back of the free queue, uncommitted ones to the front; free() then releases the rest.
TEST(KvBlockManager, WindowTrimLeavesHolesAndFreesBlocks) {
  KvOptions o{16, 4, true};
  o.window = 8;
  KvBlockManager m(o);
  const std::vector<int32_t> toks = iota(22);
  ASSERT_TRUE(m.allocate(1, 22).has_value());  // blocks 0..5
  m.commit(1, toks, 16);                       // blocks 0..3 cached
  m.trim(1, 8);  // a query at 8 reads 1 .. 8: block 0 (0..3) is still read
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  m.trim(1, 12);  // reads 5 .. 12: block 0 goes
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{-1, 1, 2, 3, 4, 5}));
  EXPECT_EQ(m.blocksFree(), 11u);
  m.trim(1, 22);  // reads 15 .. 22: blocks 1, 2 go (3 holds 12..15)
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{-1, -1, -1, 3, 4, 5}));
  EXPECT_EQ(m.blocksFree(), 13u);
  EXPECT_TRUE(m.isCached(0) && m.isCached(1) && m.isCached(2));
  EXPECT_EQ(m.refCount(1), 0);
  m.trim(1, 12);  // an earlier position changes nothing (the holes stay)
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{-1, -1, -1, 3, 4, 5}));
  ASSERT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
  // The free queue: never-used blocks first, then the dropped cached ones (later blocks first).
  std::vector<int32_t> q = m.freeQueue();
  EXPECT_EQ(std::vector<int32_t>(q.end() - 3, q.end()), (std::vector<int32_t>{0, 2, 1}));
  // Commit continues the chain through the holes: block 4 (16..19) is registered.
  m.commit(1, toks, 20);
  EXPECT_TRUE(m.isCached(4));
  // Growing appends after the holes.
  ASSERT_TRUE(m.allocate(1, 30).has_value());
  EXPECT_EQ(m.blockTable(1).size(), 8u);
  m.free(1);
  EXPECT_EQ(m.blocksFree(), 16u);
  EXPECT_EQ(m.numSeqs(), 0u);
  EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
}

// A window prefix hit needs only the blocks the next query reads: the blocks before them may be
// gone. It comes back with holes in front, allocate() takes it (the holes unreferenced), and a
// window block that was evicted shortens the hit to the longest L whose window is still cached.
TEST(KvBlockManager, WindowPrefixNeedsOnlyTheWindow) {
  KvOptions o{12, 4, true};
  o.window = 8;
  KvBlockManager m(o);
  std::vector<int32_t> toks = iota(26);  // 6 full blocks + 2 tokens
  ASSERT_TRUE(m.allocate(1, 26).has_value());
  m.commit(1, toks, 26);
  m.trim(1, 26);  // reads 19 .. : blocks 0..3 dropped (block 4 holds 16..19)
  EXPECT_EQ(table(m, 1), (std::vector<int32_t>{-1, -1, -1, -1, 4, 5, 6}));
  m.free(1);
  // L = 6 blocks (24 tokens, the 25th left to compute): the next query at 24 reads 17 .. 24, i.e.
  // blocks 4 and 5 — both cached.
  auto hit = m.findCachedWindowPrefix(toks, 100);
  EXPECT_EQ(hit, (std::vector<int32_t>{-1, -1, -1, -1, 4, 5}));
  // max_blocks caps L (the full-attention group's own hit): L = 3 needs blocks 1, 2 (reads 5..12)
  // — block 1 is cached still (dropped, not evicted).
  EXPECT_EQ(m.findCachedWindowPrefix(toks, 3), (std::vector<int32_t>{-1, 1, 2}));
  ASSERT_TRUE(m.allocate(2, 26, hit).has_value());
  // + one fresh block: 6, the uncached block free() put at the front of the queue.
  EXPECT_EQ(table(m, 2), (std::vector<int32_t>{-1, -1, -1, -1, 4, 5, 6}));
  EXPECT_EQ(m.refCount(4), 1);
  ASSERT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
  m.free(2);
  // The queue is now 6, the never-used 7..11, then the cached blocks as released: 3, 2, 1, 0 (the
  // trim, later blocks first), 5, 4. Seven blocks for another sequence evict block 3 only.
  EXPECT_EQ(m.freeQueue(), (std::vector<int32_t>{6, 7, 8, 9, 10, 11, 3, 2, 1, 0, 5, 4}));
  ASSERT_TRUE(m.allocate(3, 28).has_value());
  EXPECT_FALSE(m.isCached(3));
  // L = 6 still hits (its window is blocks 4, 5); capped at 5, L = 5 and 4 need block 3, so the
  // hit is L = 3 (blocks 1, 2).
  EXPECT_EQ(m.findCachedWindowPrefix(toks, 100), (std::vector<int32_t>{-1, -1, -1, -1, 4, 5}));
  EXPECT_EQ(m.findCachedWindowPrefix(toks, 5), (std::vector<int32_t>{-1, 1, 2}));
  m.free(3);
  EXPECT_EQ(m.blocksFree(), 12u);
  EXPECT_TRUE(m.checkInvariants().isOk()) << m.checkInvariants().toString();
}

// Random admissions (with window prefix hits), chunked computation with trims, commits, forks and
// frees over two block groups: the invariants hold after every operation (holes only as a table
// prefix, references = memberships), every live table holds the blocks its window needs, and
// nothing leaks.
TEST(KvBlockManager, WindowRandomOperationsKeepInvariants) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    std::mt19937 rng(seed);
    KvOptions o{48, 3, true, 2};
    o.window = 5;
    KvBlockManager m(o);
    const std::vector<std::vector<int32_t>> prompts = randomPrompts(rng);
    std::map<SeqId, LiveSeq> live;
    SeqId next = 1;
    uint64_t hits = 0, holes_seen = 0;
    for (int op = 0; op < 3000; ++op) {
      const uint32_t r = rng() % 12;
      if (r < 4) {
        admitAtRandom(m, live, next, hits, prompts, rng, [&](const std::vector<int32_t>& t) {
          return m.findCachedWindowPrefix(t, 1000);
        });
      } else if (r < 8 && !live.empty()) {
        // One step: a chunk of up to 4 tokens (or one decode token) computed, then committed;
        // the table is trimmed for the next position and grows for the next token.
        auto it = std::next(live.begin(), rng() % live.size());
        LiveSeq& l = it->second;
        l.computed = std::min<uint64_t>(l.tokens.size(), l.computed + 1 + rng() % 4);
        m.commit(it->first, l.tokens, l.computed);
        m.trim(it->first, l.computed);
        if (l.computed == l.tokens.size()) l.tokens.push_back(static_cast<int32_t>(rng() % 5));
        if (!m.allocate(it->first, l.tokens.size())) {
          m.free(it->first);
          live.erase(it);
        }
      } else if (r < 9 && !live.empty()) {
        // A fork sharing the full blocks the source has computed (holes included), when the
        // source still holds the blocks the fork's next query reads (a scheduler shares fewer
        // blocks or none otherwise).
        auto it = std::next(live.begin(), rng() % live.size());
        const LiveSeq src = it->second;
        const uint32_t shared = static_cast<uint32_t>(src.computed / m.blockSize());
        const uint64_t pos = uint64_t{shared} * m.blockSize();
        const uint64_t need = pos + 1 > 5 ? (pos + 1 - 5) / m.blockSize() : 0;
        auto st = m.blockTable(it->first);
        bool present = true;
        for (uint64_t i = need; i < shared; ++i) present = present && st[i] >= 0;
        if (present && m.fork(next, it->first, shared, src.tokens.size())) {
          live.emplace(next, LiveSeq{src.tokens, uint64_t{shared} * m.blockSize()});
        }
        ++next;
      } else if (!live.empty()) {
        freeOneAtRandom(m, live, rng);
      }
      Status st = m.checkInvariants();
      ASSERT_TRUE(st.isOk()) << "seed " << seed << " op " << op << ": " << st.toString();
      for (auto& [id, l] : live) {
        auto t = m.blockTable(id);
        ASSERT_EQ(t.size(), m.blocksFor(l.tokens.size()));
        // The blocks the next query (at l.computed) reads and everything after are present.
        const uint64_t keep = l.computed + 1 > 5 ? (l.computed + 1 - 5) / m.blockSize() : 0;
        for (uint64_t i = keep; i < t.size(); ++i)
          ASSERT_GE(t[i], 0) << "seq " << id << " block " << i;
        holes_seen += t.empty() || t[0] >= 0 ? 0 : 1;
      }
    }
    EXPECT_GT(hits, 0u) << "seed " << seed;
    EXPECT_GT(holes_seen, 0u) << "seed " << seed;
    for (auto& [id, l] : live) m.free(id);
    EXPECT_EQ(m.blocksFree(), m.blocksTotal());
    EXPECT_EQ(m.numSeqs(), 0u);
    EXPECT_TRUE(m.checkInvariants().isOk());
  }
}
}  // namespace
}  // namespace garden::tulip
