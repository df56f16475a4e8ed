#include "common/grammar/matcher.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace garden::grammar {

// ---------------------------------------------------------------------------------------------
// StackPool

namespace {
uint64_t frameKey(int32_t state, int32_t parent) {
  return (uint64_t{static_cast<uint32_t>(state)} << 32) | static_cast<uint32_t>(parent + 1);
}
}  // namespace

int32_t StackPool::intern(int32_t state, int32_t parent) {
  const uint64_t key = frameKey(state, parent);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second;
  const int32_t depth = parent < 0 ? 1 : depth_[static_cast<size_t>(parent)] + 1;
  if (depth > kMaxDepth) return -1;
  const auto id = static_cast<int32_t>(nodes_.size());
  nodes_.push_back({state, parent});
  depth_.push_back(depth);
  index_.emplace(key, id);
  return id;
}

void StackPool::truncate(size_t mark) {
  for (size_t i = mark; i < nodes_.size(); ++i) {
    index_.erase(frameKey(nodes_[i].state, nodes_[i].parent));
  }
  nodes_.resize(mark);
  depth_.resize(mark);
}

// ---------------------------------------------------------------------------------------------
// Runner

void Runner::close(Frame f, Config* out) {
  todo_.push_back(f);
  while (!todo_.empty()) {
    const Frame x = todo_.back();
    todo_.pop_back();
    if (std::find(seen_.begin(), seen_.end(), x) != seen_.end()) continue;
    seen_.push_back(x);
    if (!g_.byteEdges(x.state).empty()) out->frames.push_back(x);
    for (const auto& c : g_.callEdges(x.state)) {
      const int32_t p = pool_->intern(c.target, x.parent);
      if (p >= 0) todo_.push_back({g_.ruleStart(c.rule), p});
    }
    if (g_.isFinal(x.state)) {
      if (x.parent < 0) {
        out->ended = true;
        out->escape |= g_.follow(g_.ruleOf(x.state));
      } else {
        todo_.push_back(pool_->node(x.parent));
      }
    }
  }
}

void Runner::start(Frame f, Config* out) {
  out->clear();
  seen_.clear();
  close(f, out);
}

void Runner::step(const Config& in, uint8_t b, Config* out) {
  out->clear();
  seen_.clear();
  for (const Frame& f : in.frames) {
    for (const auto& e : g_.byteEdges(f.state)) {
      if (e.lo > b) break;  // edges are sorted by lo
      if (b <= e.hi) close({e.target, f.parent}, out);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// CompiledGrammar

CompiledGrammar::CompiledGrammar(Grammar g, std::shared_ptr<const Vocabulary> v)
    : grammar_(std::move(g)),
      vocab_(std::move(v)),
      tables_(new std::atomic<const TokenTable*>[static_cast<size_t>(grammar_.numStates())]) {
  for (int32_t s = 0; s < grammar_.numStates(); ++s) tables_[static_cast<size_t>(s)] = nullptr;
}

CompiledGrammar::~CompiledGrammar() {
  for (int32_t s = 0; s < grammar_.numStates(); ++s) delete tables_[static_cast<size_t>(s)].load();
}

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::compile(
    Grammar grammar, std::shared_ptr<const Vocabulary> vocab, CompileOptions options) {
  if (!vocab) return invalidArgument("grammar: no vocabulary");
  std::shared_ptr<CompiledGrammar> c(new CompiledGrammar(std::move(grammar), std::move(vocab)));
  if (options.eager) {
    for (int32_t s = 0; s < c->grammar_.numStates(); ++s) (void)c->table(s);
  }
  return std::shared_ptr<const CompiledGrammar>(std::move(c));
}

const TokenTable* CompiledGrammar::table(int32_t state) const {
  auto& slot = tables_[static_cast<size_t>(state)];
  const TokenTable* t = slot.load(std::memory_order_acquire);
  if (t != nullptr || grammar_.byteEdges(state).empty()) return t;
  std::lock_guard<std::mutex> lock(mu_);
  t = slot.load(std::memory_order_acquire);
  if (t == nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    auto* built = new TokenTable(buildTable(state));
    stats_.seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    slot.store(built, std::memory_order_release);
    t = built;
  }
  return t;
}

CompileStats CompiledGrammar::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

namespace {

// Configs met while building one table, interned, with their transitions filled in lazily (a
// DFA built on the fly): the walk over ~10^6 trie edges then costs an array lookup per edge.
class ConfigDfa {
 public:
  explicit ConfigDfa(Runner* runner) : runner_(runner) {}
  int32_t intern(const Config& c) {
    key_.clear();
    for (const Frame& f : c.frames) {
      key_.append(reinterpret_cast<const char*>(&f), sizeof(f));
    }
    key_.push_back(c.ended ? 1 : 0);
    if (c.ended) {
      for (size_t w = 0; w < 256; w += 64) {
        const uint64_t bits = ((c.escape >> w) & std::bitset<256>(~uint64_t{0})).to_ullong();
        key_.append(reinterpret_cast<const char*>(&bits), sizeof(bits));
      }
    }
    auto it = index_.find(key_);
    if (it != index_.end()) return it->second;
    const auto id = static_cast<int32_t>(configs_.size());
    configs_.push_back(c);
    next_.resize(next_.size() + 256, kUnknown);
    index_.emplace(key_, id);
    return id;
  }
  // -1: dead.
  int32_t step(int32_t from, uint8_t b) {
    int32_t& slot = next_[static_cast<size_t>(from) * 256 + b];
    if (slot == kUnknown) {
      runner_->step(configs_[static_cast<size_t>(from)], b, &tmp_);
      const int32_t to = tmp_.alive() ? intern(tmp_) : -1;
      next_[static_cast<size_t>(from) * 256 + b] = to;  // intern() may have moved next_
      return to;
    }
    return slot;
  }
  bool escapes(int32_t c, uint8_t b) const { return configs_[static_cast<size_t>(c)].escape.test(b); }

 private:
  static constexpr int32_t kUnknown = -2;
  Runner* runner_;
  std::vector<Config> configs_;
  std::vector<int32_t> next_;
  std::unordered_map<std::string, int32_t> index_;
  std::string key_;
  Config tmp_;
};

}  // namespace

// One walk over the byte-sorted vocabulary from `state` with an unknown stack below it
// [TAG_TOKEN_TABLE]. A token whose prefix dies skips every token with that prefix (a binary
// search), so structural states cost O(distinct live prefixes), not O(vocabulary).
// Runs under mu_ (stats_).
TokenTable CompiledGrammar::buildTable(int32_t state) const {
  const Vocabulary& v = *vocab_;
  const int32_t n = v.numSorted();
  StackPool pool;
  Runner runner(grammar_, &pool);
  ConfigDfa dfa(&runner);
  const size_t depth = v.maxTokenBytes() + 1;
  std::vector<int32_t> cfg(depth, -1);
  std::vector<uint8_t> esc(depth, 0);
  enum : uint8_t { kAcc = 0, kRej = 1, kUnc = 2 };
  std::vector<std::pair<int32_t, int32_t>> ranges[3];  // [begin, end) of sorted indices
  auto addRange = [&](uint8_t f, int32_t b, int32_t e) {
    auto& r = ranges[f];
    if (!r.empty() && r.back().second == b) {
      r.back().second = e;
    } else {
      r.emplace_back(b, e);
    }
  };
  {
    Config c0;
    c0.frames.push_back({state, -1});
    cfg[0] = dfa.intern(c0);
  }
  size_t valid = 0;
  for (int32_t i = 0; i < n;) {
    const std::string_view tok = v.sortedBytes(i);
    size_t k = std::min(static_cast<size_t>(v.lcp(i)), valid);
    bool dead = false;
    for (; k < tok.size(); ++k) {
      const auto b = static_cast<uint8_t>(tok[k]);
      esc[k + 1] = (esc[k] || dfa.escapes(cfg[k], b)) ? 1 : 0;
      cfg[k + 1] = dfa.step(cfg[k], b);
      if (cfg[k + 1] < 0) {
        dead = true;
        break;
      }
    }
    if (!dead) {
      addRange(kAcc, i, i + 1);
      valid = tok.size();
      ++i;
      continue;
    }
    // Every token sharing tok[0 .. k] (k + 1 bytes) dies at byte k the same way.
    // i is the first of them: a token before it sharing k + 1 bytes would have died here too.
    CHECK(static_cast<size_t>(v.lcp(i)) <= k);
    const int32_t lo = v.prefixEnd(i, k + 1);
    addRange(esc[k + 1] ? kUnc : kRej, i, lo);
    valid = k;
    i = lo;
  }
  int64_t counts[3] = {0, 0, 0};
  for (int f = 0; f < 3; ++f) {
    for (const auto& [b, e] : ranges[f]) counts[f] += e - b;
  }
  TokenTable t;
  t.complement = counts[kRej] < counts[kAcc];
  const uint8_t listed = t.complement ? kRej : kAcc;
  t.ids.reserve(static_cast<size_t>(counts[listed]));
  for (const auto& [b, e] : ranges[listed]) {
    for (int32_t x = b; x < e; ++x) t.ids.push_back(v.sorted(x));
  }
  std::sort(t.ids.begin(), t.ids.end());
  t.uncertain.reserve(static_cast<size_t>(counts[kUnc]));
  for (const auto& [b, e] : ranges[kUnc]) {
    for (int32_t x = b; x < e; ++x) t.uncertain.push_back(x);
  }
  stats_.accepted += counts[kAcc];
  stats_.rejected += counts[kRej];
  stats_.uncertain += counts[kUnc];
  ++stats_.states;
  return t;
}

size_t CompiledGrammar::memoryBytes() const {
  size_t b = static_cast<size_t>(grammar_.numStates()) * sizeof(void*);
  for (int32_t s = 0; s < grammar_.numStates(); ++s) {
    const TokenTable* t = tables_[static_cast<size_t>(s)].load();
    if (t != nullptr) b += (t->ids.size() + t->uncertain.size()) * sizeof(int32_t);
  }
  return b;
}

// ---------------------------------------------------------------------------------------------
// GrammarMatcher

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> compiled,
                               std::vector<int32_t> end_tokens)
    : compiled_(std::move(compiled)),
      end_tokens_(std::move(end_tokens)),
      runner_(compiled_->grammar(), &pool_),
      depth_(compiled_->vocab().maxTokenBytes() + 1) {
  const Grammar& g = compiled_->grammar();
  runner_.start({g.ruleStart(g.rootRule()), -1}, &cur_);
}

bool GrammarMatcher::acceptBytes(std::string_view bytes) { return run(bytes, true); }

bool GrammarMatcher::canAcceptToken(int32_t id) {
  if (terminated_) return false;
  if (std::find(end_tokens_.begin(), end_tokens_.end(), id) != end_tokens_.end()) {
    return cur_.ended;
  }
  const Vocabulary& v = compiled_->vocab();
  if (id < 0 || id >= v.size() || !v.eligible(id)) return false;
  return run(v.bytes(id), false);
}

bool GrammarMatcher::run(std::string_view bytes, bool commit) {
  if (terminated_) return false;
  const size_t mark = pool_.mark();
  const Config* in = &cur_;
  Config* out = &tmp_a_;
  for (char c : bytes) {
    runner_.step(*in, static_cast<uint8_t>(c), out);
    if (!out->alive()) {
      pool_.truncate(mark);
      return false;
    }
    in = out;
    out = (out == &tmp_a_) ? &tmp_b_ : &tmp_a_;
  }
  if (!commit) {
    pool_.truncate(mark);
    return true;
  }
  if (in != &cur_) cur_ = *in;
  return true;
}

bool GrammarMatcher::acceptToken(int32_t id) {
  if (terminated_) return false;
  if (std::find(end_tokens_.begin(), end_tokens_.end(), id) != end_tokens_.end()) {
    if (!cur_.ended) return false;
    terminated_ = true;
    return true;
  }
  const Vocabulary& v = compiled_->vocab();
  if (id < 0 || id >= v.size() || !v.eligible(id)) return false;
  return acceptBytes(v.bytes(id));
}

void GrammarMatcher::fillNextTokenBitmask(std::span<uint32_t> words) {
  const Vocabulary& v = compiled_->vocab();
  const size_t nw = maskWords();
  CHECK(words.size() >= nw);
  std::fill(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(nw), 0u);
  if (terminated_) return;
  const auto set = [&](int32_t id) { words[static_cast<size_t>(id) / 32] |= 1u << (id % 32); };
  const auto test = [&](int32_t id) {
    return (words[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u;
  };
  const size_t mark = pool_.mark();
  for (const Frame& f : cur_.frames) {
    const TokenTable* t = compiled_->table(f.state);
    if (t == nullptr) continue;
    if (t->complement) {
      scratch_ = v.eligibleMask();
      for (int32_t id : t->ids) scratch_[static_cast<size_t>(id) / 32] &= ~(1u << (id % 32));
      for (int32_t u : t->uncertain) {
        const int32_t id = v.sorted(u);
        scratch_[static_cast<size_t>(id) / 32] &= ~(1u << (id % 32));
      }
      for (size_t w = 0; w < nw; ++w) words[w] |= scratch_[w];
    } else {
      for (int32_t id : t->ids) set(id);
    }
    // Context-dependent tokens: run each against this stack, sharing prefixes with the
    // previous one checked.
    depth_[0].clear();
    depth_[0].frames.push_back(f);
    std::string_view prev;
    size_t valid = 0;
    for (int32_t u : t->uncertain) {
      const int32_t id = v.sorted(u);
      const std::string_view tok = v.sortedBytes(u);
      size_t l = 0;
      while (l < prev.size() && l < tok.size() && prev[l] == tok[l]) ++l;
      prev = tok;
      if (test(id)) {
        valid = std::min(valid, l);
        continue;
      }
      size_t k = std::min(l, valid);
      bool dead = false;
      for (; k < tok.size(); ++k) {
        runner_.step(depth_[k], static_cast<uint8_t>(tok[k]), &depth_[k + 1]);
        if (!depth_[k + 1].alive()) {
          dead = true;
          break;
        }
      }
      valid = k;
      if (!dead) set(id);
    }
  }
  pool_.truncate(mark);
  if (cur_.ended) {
    for (int32_t id : end_tokens_) {
      if (id >= 0 && static_cast<size_t>(id) < nw * 32) set(id);
    }
  }
}

std::vector<int32_t> GrammarMatcher::allowedTokens() {
  std::vector<uint32_t> words(maskWords());
  fillNextTokenBitmask(words);
  std::vector<int32_t> ids;
  for (size_t w = 0; w < words.size(); ++w) {
    for (uint32_t x = words[w]; x != 0; x &= x - 1) {
      ids.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(x))));
    }
  }
  return ids;
}

}  // namespace garden::grammar
