#include "services/tulip/kv/block_manager.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace garden::tulip {
namespace {

constexpr uint64_t kRootHash = 0x67617264656e4b56ULL;  // "gardenKV"

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

KvBlockManager::KvBlockManager(KvOptions opts)
    : opts_(opts),
      groups_(std::max<uint32_t>(1, opts.groups)),
      per_group_(std::max<uint32_t>(1, opts.num_blocks / std::max<uint32_t>(1, opts.groups))) {
  CHECK(opts_.block_size > 0);
  CHECK(opts_.num_blocks % groups_ == 0);
  blocks_.resize(opts_.num_blocks);
  block_tokens_.assign(uint64_t{opts_.num_blocks} * opts_.block_size, 0);
  reset();
}

uint64_t KvBlockManager::hashBlock(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ULL);
  for (int32_t t : tokens) h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 1));
  // 0 never names a block (SeqState::last_hash 0 means "root").
  return h == 0 ? 1 : h;
}

uint64_t KvBlockManager::rootHash(uint32_t group) {
  // Group 0 keeps the single-group root; the others start from their own.
  return group == 0 ? kRootHash : mix64(kRootHash ^ (uint64_t{group} * 0x9e3779b97f4a7c15ULL));
}

int32_t KvBlockManager::groupOf(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.table.empty()) return -1;
  return static_cast<int32_t>(it->second.group);
}

void KvBlockManager::reset() {
  seqs_.clear();
  cache_.clear();
  head_.assign(groups_, -1);
  tail_.assign(groups_, -1);
  group_free_.assign(groups_, 0);
  free_count_ = 0;
  for (auto& b : blocks_) b = Block{};
  for (int32_t i = 0; i < static_cast<int32_t>(opts_.num_blocks); ++i) pushBack(i);
}

void KvBlockManager::pushFront(int32_t b) {
  const uint32_t g = groupOfBlock(b);
  Block& blk = blocks_[b];
  blk.prev = -1;
  blk.next = head_[g];
  if (head_[g] >= 0) blocks_[head_[g]].prev = b;
  head_[g] = b;
  if (tail_[g] < 0) tail_[g] = b;
  blk.in_free = true;
  ++group_free_[g];
  ++free_count_;
}

void KvBlockManager::pushBack(int32_t b) {
  const uint32_t g = groupOfBlock(b);
  Block& blk = blocks_[b];
  blk.next = -1;
  blk.prev = tail_[g];
  if (tail_[g] >= 0) blocks_[tail_[g]].next = b;
  tail_[g] = b;
  if (head_[g] < 0) head_[g] = b;
  blk.in_free = true;
  ++group_free_[g];
  ++free_count_;
}

void KvBlockManager::unlink(int32_t b) {
  const uint32_t g = groupOfBlock(b);
  Block& blk = blocks_[b];
  CHECK(blk.in_free);
  if (blk.prev >= 0)
    blocks_[blk.prev].next = blk.next;
  else
    head_[g] = blk.next;
  if (blk.next >= 0)
    blocks_[blk.next].prev = blk.prev;
  else
    tail_[g] = blk.prev;
  blk.prev = blk.next = -1;
  blk.in_free = false;
  --group_free_[g];
  --free_count_;
}

void KvBlockManager::uncache(int32_t b) {
  Block& blk = blocks_[b];
  if (!blk.cached) return;
  auto it = cache_.find(blk.hash);
  if (it != cache_.end() && it->second == b) cache_.erase(it);
  blk.cached = false;
  blk.hash = blk.parent_hash = 0;
}

int32_t KvBlockManager::popFront(uint32_t group) {
  const int32_t b = head_[group];
  CHECK(b >= 0);
  unlink(b);
  if (blocks_[b].cached) {
    uncache(b);
    ++evictions_;
  }
  return b;
}

int32_t KvBlockManager::lookup(uint32_t group, uint64_t parent, uint64_t hash,
                               std::span<const int32_t> tokens) const {
  auto it = cache_.find(hash);
  if (it == cache_.end()) return -1;
  const int32_t b = it->second;
  const Block& blk = blocks_[b];
  if (blk.parent_hash != parent || groupOfBlock(b) != group) return -1;
  const int32_t* stored = block_tokens_.data() + uint64_t(b) * opts_.block_size;
  if (!std::equal(tokens.begin(), tokens.end(), stored)) return -1;
  return b;
}

std::vector<int32_t> KvBlockManager::cachedPrefixIn(uint32_t group,
                                                    std::span<const int32_t> tokens) const {
  std::vector<int32_t> out;
  if (!opts_.prefix_caching || tokens.empty()) return out;
  const uint64_t bs = opts_.block_size;
  const uint64_t limit = tokens.size() - 1;  // at least one token left to compute
  uint64_t parent = rootHash(group);
  for (uint64_t i = 0; (i + 1) * bs <= limit; ++i) {
    auto blk = tokens.subspan(i * bs, bs);
    const uint64_t h = hashBlock(parent, blk);
    const int32_t b = lookup(group, parent, h, blk);
    if (b < 0) break;
    out.push_back(b);
    parent = h;
  }
  return out;
}

template <class PrefixIn>
std::vector<int32_t> KvBlockManager::bestOverGroups(PrefixIn&& prefix_in) const {
  std::vector<int32_t> best = prefix_in(0u);
  uint32_t best_group = 0;
  for (uint32_t g = 1; g < groups_; ++g) {
    std::vector<int32_t> p = prefix_in(g);
    if (p.size() > best.size() ||
        (p.size() == best.size() && group_free_[g] > group_free_[best_group])) {
      best = std::move(p);
      best_group = g;
    }
  }
  return best;
}

std::vector<int32_t> KvBlockManager::findCachedPrefix(std::span<const int32_t> tokens) const {
  return bestOverGroups([&](uint32_t g) { return cachedPrefixIn(g, tokens); });
}

uint64_t KvBlockManager::firstWindowBlock(uint64_t position) const {
  const uint64_t w = opts_.window;
  const uint64_t keep_from = position + 1 > w ? position + 1 - w : 0;  // the first key it reads
  return keep_from / opts_.block_size;
}

std::vector<int32_t> KvBlockManager::cachedWindowPrefixIn(uint32_t group,
                                                          std::span<const int32_t> tokens,
                                                          uint64_t max_blocks) const {
  std::vector<int32_t> out;
  if (!opts_.prefix_caching || tokens.empty()) return out;
  const uint64_t bs = opts_.block_size;
  const uint64_t limit = tokens.size() - 1;  // at least one token left to compute
  const uint64_t lmax = std::min<uint64_t>(max_blocks, limit / bs);
  // Every full block's cached copy (-1: none), following the chain hashes through the misses.
  std::vector<int32_t> found(lmax, -1);
  uint64_t parent = rootHash(group);
  for (uint64_t i = 0; i < lmax; ++i) {
    auto blk = tokens.subspan(i * bs, bs);
    const uint64_t h = hashBlock(parent, blk);
    found[i] = lookup(group, parent, h, blk);
    parent = h;
  }
  // The longest L whose window blocks [firstWindowBlock(L * bs), L) are all found.
  for (uint64_t l = lmax; l > 0; --l) {
    const uint64_t first = firstWindowBlock(l * bs);
    bool all = true;
    for (uint64_t i = first; i < l && all; ++i) all = found[i] >= 0;
    if (!all) continue;
    out.assign(l, -1);
    for (uint64_t i = first; i < l; ++i) out[i] = found[i];
    return out;
  }
  return out;
}

std::vector<int32_t> KvBlockManager::findCachedWindowPrefix(std::span<const int32_t> tokens,
                                                            uint64_t max_blocks,
                                                            int32_t group) const {
  CHECK(opts_.window > 0);
  if (group >= 0) {
    CHECK(static_cast<uint32_t>(group) < groups_);
    return cachedWindowPrefixIn(static_cast<uint32_t>(group), tokens, max_blocks);
  }
  return bestOverGroups(
      [&](uint32_t g) { return cachedWindowPrefixIn(g, tokens, max_blocks); });
}

void KvBlockManager::release(int32_t b) {
  Block& blk = blocks_[b];
  CHECK(blk.ref > 0);
  if (--blk.ref == 0) {
    if (blk.cached)
      pushBack(b);
    else
      pushFront(b);
  }
}

void KvBlockManager::trim(SeqId seq, uint64_t next_position) {
  CHECK(opts_.window > 0);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  auto& table = it->second.table;
  const uint64_t end = std::min<uint64_t>(firstWindowBlock(next_position), table.size());
  // Later blocks first, as free() does: a cached prefix's head is evicted last.
  for (uint64_t i = end; i > 0; --i) {
    int32_t& b = table[i - 1];
    if (b < 0) break;  // holes are a prefix: everything before is gone already
    release(b);
    b = -1;
  }
}

std::optional<std::span<const int32_t>> KvBlockManager::allocate(SeqId seq, uint64_t num_tokens,
                                                                 std::span<const int32_t> prefix,
                                                                 int32_t want_group) {
  auto it = seqs_.find(seq);
  const bool fresh = it == seqs_.end() || it->second.table.empty();
  if (!fresh) prefix = {};
  // The sequence's group: its table's, its prefix's, or the one with the most free blocks.
  uint32_t group = 0;
  if (!fresh) {
    group = it->second.group;
  } else if (want_group >= 0) {
    CHECK(static_cast<uint32_t>(want_group) < groups_);
    group = static_cast<uint32_t>(want_group);
  } else if (!prefix.empty()) {
    group = groupOfBlock(prefix.back());  // (window mode: the front may be holes)
  } else {
    for (uint32_t g = 1; g < groups_; ++g)
      if (group_free_[g] > group_free_[group]) group = g;
  }
  const uint64_t have = fresh ? prefix.size() : it->second.table.size();
  const uint64_t want = blocksFor(num_tokens);
  const uint64_t add = want > have ? want - have : 0;
  // Prefix blocks without references leave the free queue too.
  uint64_t revive = 0;
  bool seen_block = false;
  for (int32_t b : prefix) {
    if (b < 0) {  // [TAG_KV_WINDOW_GROUP] a hole: window mode, before every block of the prefix
      CHECK(opts_.window > 0 && !seen_block);
      continue;
    }
    seen_block = true;
    CHECK(static_cast<uint32_t>(b) < opts_.num_blocks && blocks_[b].cached &&
          groupOfBlock(b) == group);
    if (blocks_[b].ref == 0) ++revive;
  }
  if (add + revive > group_free_[group]) return std::nullopt;
  if (it == seqs_.end()) it = seqs_.emplace(seq, SeqState{}).first;
  SeqState& s = it->second;
  s.group = group;
  if (fresh && !prefix.empty()) {
    for (int32_t b : prefix) {
      if (b >= 0) {
        if (blocks_[b].ref == 0) unlink(b);
        ++blocks_[b].ref;
      }
      s.table.push_back(b);
    }
    s.hashed_blocks = static_cast<uint32_t>(prefix.size());
    s.last_hash = blocks_[prefix.back()].hash;
  }
  for (uint64_t i = 0; i < add; ++i) {
    const int32_t b = popFront(group);
    blocks_[b].ref = 1;
    s.table.push_back(b);
  }
  return std::span<const int32_t>(s.table);
}

std::optional<std::span<const int32_t>> KvBlockManager::fork(SeqId seq, SeqId from,
                                                             uint32_t num_blocks,
                                                             uint64_t num_tokens) {
  auto src = seqs_.find(from);
  CHECK(src != seqs_.end() && src->second.table.size() >= num_blocks);
  auto dst = seqs_.find(seq);
  CHECK(dst == seqs_.end() || dst->second.table.empty());
  const uint64_t want = std::max<uint64_t>(blocksFor(num_tokens), num_blocks);
  const uint32_t group = src->second.group;  // the shared blocks' group
  // The shared blocks are referenced by `from`: none of them is in the free queue.
  if (want - num_blocks > group_free_[group]) return std::nullopt;
  std::vector<int32_t> shared(src->second.table.begin(),
                              src->second.table.begin() + num_blocks);  // before seqs_ grows
  if (dst == seqs_.end()) dst = seqs_.emplace(seq, SeqState{}).first;
  SeqState& s = dst->second;
  s.group = group;
  for (int32_t b : shared) {
    if (b >= 0) {  // window mode: holes stay holes
      CHECK(blocks_[b].ref > 0);
      ++blocks_[b].ref;
    }
    s.table.push_back(b);
  }
  // Hashes are recomputed from `seq`'s own tokens by commit() (the shared blocks may not be
  // committed yet); a block already cached keeps its entry.
  s.hashed_blocks = 0;
  s.last_hash = 0;
  for (uint64_t i = num_blocks; i < want; ++i) {
    const int32_t b = popFront(group);
    blocks_[b].ref = 1;
    s.table.push_back(b);
  }
  return std::span<const int32_t>(s.table);
}

void KvBlockManager::commit(SeqId seq, std::span<const int32_t> tokens, uint64_t num_computed) {
  if (!opts_.prefix_caching) return;
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  SeqState& s = it->second;
  const uint64_t bs = opts_.block_size;
  num_computed = std::min<uint64_t>(num_computed, tokens.size());
  const uint64_t full = std::min<uint64_t>(num_computed / bs, s.table.size());
  while (s.hashed_blocks < full) {
    const uint64_t i = s.hashed_blocks;
    const uint64_t parent = s.hashed_blocks == 0 ? rootHash(s.group) : s.last_hash;
    auto blk = tokens.subspan(i * bs, bs);
    const uint64_t h = hashBlock(parent, blk);
    const int32_t b = s.table[i];
    // A hole (window mode: dropped before its step was committed) has nothing to register; the
    // chain continues.
    if (b >= 0 && !blocks_[b].cached && cache_.find(h) == cache_.end()) {
      Block& block = blocks_[b];
      block.cached = true;
      block.hash = h;
      block.parent_hash = parent;
      std::copy(blk.begin(), blk.end(), block_tokens_.begin() + uint64_t(b) * bs);
      cache_.emplace(h, b);
    }
    // A block computed twice (two sequences missed at once) stays private: the first copy is
    // the cached one. The chain hash continues either way (it depends on contents only).
    s.last_hash = h;
    ++s.hashed_blocks;
  }
}

void KvBlockManager::free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  const auto& table = it->second.table;
  // Later blocks are pushed first, so a prefix's head outlives its tail in the LRU queue.
  for (auto b = table.rbegin(); b != table.rend(); ++b) {
    if (*b < 0) break;  // window mode: the rest are holes
    release(*b);
  }
  seqs_.erase(it);
}

std::span<const int32_t> KvBlockManager::blockTable(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  return it->second.table;
}

std::vector<int32_t> KvBlockManager::freeQueue() const {
  std::vector<int32_t> out;
  for (uint32_t g = 0; g < groups_; ++g)
    for (int32_t b = head_[g]; b >= 0; b = blocks_[b].next) out.push_back(b);
  return out;
}

Status KvBlockManager::checkInvariants() const {
  std::vector<int32_t> refs(opts_.num_blocks, 0);
  for (const auto& [id, s] : seqs_) {
    // [TAG_KV_WINDOW_GROUP] Holes only in window mode, and only as a prefix of the table.
    const auto first_block =
        std::find_if(s.table.begin(), s.table.end(), [](int32_t b) { return b >= 0; });
    if (first_block != s.table.begin() && opts_.window == 0)
      return internalError("seq " + std::to_string(id) + " has holes outside window mode");
    if (std::find(first_block, s.table.end(), -1) != s.table.end())
      return internalError("seq " + std::to_string(id) + " has a hole after a block");
    std::vector<int32_t> sorted(first_block, s.table.end());
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      return internalError("seq " + std::to_string(id) + " holds a block twice");
    for (auto bi = first_block; bi != s.table.end(); ++bi) {
      const int32_t b = *bi;
      if (b < 0 || static_cast<uint32_t>(b) >= opts_.num_blocks)
        return internalError("seq " + std::to_string(id) + " holds block id " + std::to_string(b));
      ++refs[b];
    }
    if (s.hashed_blocks > s.table.size())
      return internalError("seq " + std::to_string(id) + " hashed more blocks than it holds");
    for (auto bi = first_block; bi != s.table.end(); ++bi) {
      const int32_t b = *bi;
      if (groupOfBlock(b) != s.group)
        return internalError("seq " + std::to_string(id) + " holds block " + std::to_string(b) +
                             " outside its group " + std::to_string(s.group));
    }
  }
  uint32_t in_queues = 0;
  for (uint32_t g = 0; g < groups_; ++g) {
    uint32_t in_queue = 0;
    int32_t prev = -1;
    for (int32_t b = head_[g]; b >= 0; b = blocks_[b].next) {
      if (blocks_[b].prev != prev)
        return internalError("free queue links broken at " + std::to_string(b));
      if (!blocks_[b].in_free) return internalError("block in queue not marked free");
      if (groupOfBlock(b) != g)
        return internalError("block " + std::to_string(b) + " in group " + std::to_string(g) +
                             "'s free queue");
      if (++in_queue > opts_.num_blocks) return internalError("free queue has a cycle");
      prev = b;
    }
    if (prev != tail_[g]) return internalError("free queue tail mismatch");
    if (in_queue != group_free_[g]) return internalError("group free count mismatch");
    in_queues += in_queue;
  }
  if (in_queues != free_count_) return internalError("free count mismatch");
  uint32_t cached = 0;
  for (uint32_t b = 0; b < opts_.num_blocks; ++b) {
    const Block& blk = blocks_[b];
    if (blk.ref != refs[b])
      return internalError("block " + std::to_string(b) + " ref " + std::to_string(blk.ref) +
                           " but held by " + std::to_string(refs[b]) + " tables");
    if ((blk.ref == 0) != blk.in_free)
      return internalError("block " + std::to_string(b) + " free flag disagrees with its ref");
    if (blk.cached) {
      ++cached;
      auto it = cache_.find(blk.hash);
      if (it == cache_.end() || it->second != static_cast<int32_t>(b))
        return internalError("cached block " + std::to_string(b) + " missing from the map");
    }
  }
  if (cached != cache_.size()) return internalError("cache map has stale entries");
  return okStatus();
}

}  // namespace garden::tulip
