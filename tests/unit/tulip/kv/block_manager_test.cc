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
    struct Live {
      std::vector<int32_t> tokens;
      uint64_t computed;
    };
    std::map<SeqId, Live> live;
    SeqId next = 1;
    uint64_t hits = 0;
    for (int op = 0; op < 3000; ++op) {
      const uint32_t r = rng() % 10;
      if (r < 4) {
        Live l{prompts[rng() % prompts.size()], 0};
        auto hit = m.findCachedPrefix(l.tokens);
        if (m.allocate(next, l.tokens.size(), hit)) {
          l.computed = hit.size() * m.blockSize();
          hits += hit.size();
          live.emplace(next, l);
        } else {
          ASSERT_FALSE(m.hasSeq(next));
        }
        ++next;
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

}  // namespace
}  // namespace garden::tulip
