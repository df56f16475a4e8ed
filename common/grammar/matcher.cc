#include "common/grammar/matcher.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <list>
#include <string>
#include <system_error>
#include <thread>

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

// ---------------------------------------------------------------------------------------------
// Table sharing [TAG_TABLE_SHARING]

// Breadth-first from `state` over byte edges, call edges (the callee's start and the return
// state) in their stored order, numbering states as first met: isomorphic reachable automata give
// equal strings. Per state: final?, in the bottom rule?, its byte edges (lo, hi, target) and calls
// (callee start, return). buildTable() reads nothing else but the bottom rule's FOLLOW set.
std::string tableSignature(const Grammar& g, int32_t state) {
  std::unordered_map<int32_t, int32_t> number;
  std::vector<int32_t> order;
  auto id = [&](int32_t s) {
    auto [it, fresh] = number.emplace(s, static_cast<int32_t>(order.size()));
    if (fresh) order.push_back(s);
    return it->second;
  };
  auto put = [](std::string* out, int32_t x) {
    out->append(reinterpret_cast<const char*>(&x), sizeof(x));
  };
  std::string out;
  const std::bitset<256>& follow = g.follow(g.ruleOf(state));
  for (size_t w = 0; w < 256; w += 64) {
    const uint64_t bits = ((follow >> w) & std::bitset<256>(~uint64_t{0})).to_ullong();
    out.append(reinterpret_cast<const char*>(&bits), sizeof(bits));
  }
  id(state);
  for (size_t i = 0; i < order.size(); ++i) {
    const int32_t s = order[i];
    out.push_back(
        static_cast<char>((g.isFinal(s) ? 1 : 0) | (g.ruleOf(s) == g.ruleOf(state) ? 2 : 0)));
    const auto bytes = g.byteEdges(s);
    put(&out, static_cast<int32_t>(bytes.size()));
    for (const ByteEdge& e : bytes) {
      out.push_back(static_cast<char>(e.lo));
      out.push_back(static_cast<char>(e.hi));
      put(&out, id(e.target));
    }
    const auto calls = g.callEdges(s);
    put(&out, static_cast<int32_t>(calls.size()));
    for (const CallEdge& c : calls) {
      put(&out, id(g.ruleStart(c.rule)));
      put(&out, id(c.target));
    }
  }
  return out;
}

namespace {

size_t tableBytes(const TokenTable& t) {
  return sizeof(TokenTable) + (t.ids.size() + t.uncertain.size() + t.bits.size()) * 4;
}

// Process-wide: signature + vocabulary -> table, least recently used dropped beyond kMaxBytes.
// The signature is kept and compared, so a hash collision is a miss, never a wrong table.
class SharedTables {
 public:
  static SharedTables& get() {
    static SharedTables* t = new SharedTables;  // never destroyed: usable during exit
    return *t;
  }
  std::shared_ptr<const TokenTable> find(const std::string& sig,
                                         const std::shared_ptr<const Vocabulary>& vocab) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key(sig, vocab.get()));
    if (it == map_.end() || it->second.sig != sig || it->second.vocab.lock() != vocab) {
      return nullptr;
    }
    lru_.splice(lru_.begin(), lru_, it->second.pos);
    return it->second.table;
  }
  void put(const std::string& sig, const std::shared_ptr<const Vocabulary>& vocab,
           std::shared_ptr<const TokenTable> t) {
    const size_t bytes = tableBytes(*t) + sig.size();
    if (bytes > kMaxBytes / 4) return;
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t k = key(sig, vocab.get());
    if (auto it = map_.find(k); it != map_.end()) erase(it);
    lru_.push_front(k);
    map_.emplace(k, Entry{sig, vocab, std::move(t), bytes, lru_.begin()});
    bytes_ += bytes;
    while (bytes_ > kMaxBytes) erase(map_.find(lru_.back()));
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    map_.clear();
    lru_.clear();
    bytes_ = 0;
  }

 private:
  static constexpr size_t kMaxBytes = size_t{256} << 20;
  struct Entry {
    std::string sig;
    // Held weakly: an entry of a vocabulary that is gone never matches a new one that happens
    // to be allocated at the same address.
    std::weak_ptr<const Vocabulary> vocab;
    std::shared_ptr<const TokenTable> table;
    size_t bytes;
    std::list<uint64_t>::iterator pos;
  };
  static uint64_t key(const std::string& sig, const Vocabulary* vocab) {
    uint64_t h = 1469598103934665603ULL ^ reinterpret_cast<uintptr_t>(vocab);
    for (char c : sig) {
      h ^= static_cast<uint8_t>(c);
      h *= 1099511628211ULL;
    }
    return h;
  }
  void erase(std::unordered_map<uint64_t, Entry>::iterator it) {
    bytes_ -= it->second.bytes;
    lru_.erase(it->second.pos);
    map_.erase(it);
  }
  std::mutex mu_;
  std::unordered_map<uint64_t, Entry> map_;
  std::list<uint64_t> lru_;
  size_t bytes_ = 0;
};

}  // namespace

void CompiledGrammar::clearSharedTables() { SharedTables::get().clear(); }

CompiledGrammar::CompiledGrammar(Grammar g, std::shared_ptr<const Vocabulary> v, CompileOptions o)
    : grammar_(std::move(g)),
      vocab_(std::move(v)),
      options_(o),
      tables_(new std::atomic<const TokenTable*>[static_cast<size_t>(grammar_.numStates())]) {
  for (int32_t s = 0; s < grammar_.numStates(); ++s) tables_[static_cast<size_t>(s)] = nullptr;
}

CompiledGrammar::~CompiledGrammar() = default;

void CompiledGrammar::install(int32_t state, std::shared_ptr<const TokenTable> t, bool shared,
                              bool first_use) const {
  const TokenTable* raw = t.get();
  const int64_t n = vocab_->numSorted();
  const auto listed = static_cast<int64_t>(t->ids.size());
  const auto unc = static_cast<int64_t>(t->uncertain.size());
  stats_.accepted += t->complement ? n - listed - unc : listed;
  stats_.rejected += t->complement ? listed : n - listed - unc;
  stats_.uncertain += unc;
  ++stats_.states;
  if (shared) {
    ++stats_.shared;
  } else {
    ++stats_.built;
  }
  if (first_use) owned_.push_back(std::move(t));
  tables_[static_cast<size_t>(state)].store(raw, std::memory_order_release);
}

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::compile(
    Grammar grammar, std::shared_ptr<const Vocabulary> vocab, CompileOptions options) {
  if (!vocab) return invalidArgument("grammar: no vocabulary");
  std::shared_ptr<CompiledGrammar> c(
      new CompiledGrammar(std::move(grammar), std::move(vocab), options));
  if (!options.eager) return std::shared_ptr<const CompiledGrammar>(std::move(c));
  const auto t0 = std::chrono::steady_clock::now();
  const Grammar& g = c->grammar_;
  // Groups of states with one table: by signature when sharing, else one state each.
  struct Group {
    std::string sig;
    std::vector<int32_t> states;
    std::shared_ptr<const TokenTable> table;
    bool cached = false;
  };
  std::vector<Group> groups;
  {
    std::unordered_map<std::string, size_t> index;
    for (int32_t s = 0; s < g.numStates(); ++s) {
      if (g.byteEdges(s).empty()) continue;
      if (!options.share) {
        groups.push_back(Group{{}, {s}, nullptr});
        continue;
      }
      std::string sig = tableSignature(g, s);
      auto [it, fresh] = index.emplace(sig, groups.size());
      if (fresh) groups.push_back(Group{std::move(sig), {}, nullptr});
      groups[it->second].states.push_back(s);
    }
  }
  std::vector<size_t> todo;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (options.share) groups[i].table = SharedTables::get().find(groups[i].sig, c->vocab_);
    groups[i].cached = groups[i].table != nullptr;
    if (!groups[i].cached) todo.push_back(i);
  }
  // The vocabulary walks, spread over threads (each walk is independent and pure). The caller
  // walks too and waits only for the walks a helper has taken: a helper the scheduler starts
  // late finds nothing left and costs nothing (joining it would wait for its start).
  int threads =
      options.threads > 0
          ? options.threads
          : std::min(8, std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  // A thread for every 4 walks at least: starting one costs more than a small table.
  threads = std::max(1, std::min<int>(threads, static_cast<int>(todo.size() / 4)));
  struct Walks {
    std::shared_ptr<const CompiledGrammar> grammar;
    std::vector<int32_t> states;  // one per walk
    std::vector<std::shared_ptr<const TokenTable>> tables;
    std::atomic<size_t> next{0};
    std::mutex mu;
    std::condition_variable cv;
    size_t done = 0;  // guarded by mu
    void run() {
      size_t finished = 0;
      for (size_t i; (i = next.fetch_add(1)) < states.size(); ++finished) {
        tables[i] = std::make_shared<const TokenTable>(grammar->buildTable(states[i]));
      }
      if (finished == 0) return;
      std::lock_guard<std::mutex> lock(mu);
      done += finished;
      if (done == states.size()) cv.notify_all();
    }
  };
  auto walks = std::make_shared<Walks>();
  walks->grammar = c;
  for (size_t i : todo) walks->states.push_back(groups[i].states[0]);
  walks->tables.resize(todo.size());
  for (int t = 1; t < threads; ++t) {
    try {
      std::thread([walks] { walks->run(); }).detach();
    } catch (const std::system_error&) {
      break;  // no thread to be had (a process at its limit): the caller walks the rest itself
    }
  }
  walks->run();
  {
    std::unique_lock<std::mutex> lock(walks->mu);
    walks->cv.wait(lock, [&] { return walks->done == walks->states.size(); });
  }
  for (size_t k = 0; k < todo.size(); ++k) groups[todo[k]].table = walks->tables[k];
  std::lock_guard<std::mutex> lock(c->mu_);
  for (Group& gr : groups) {
    for (size_t k = 0; k < gr.states.size(); ++k) {
      c->install(gr.states[k], gr.table, gr.cached || k > 0, k == 0);
    }
    if (options.share) {
      c->by_signature_.emplace(gr.sig, c->owned_.size() - 1);  // install() appended it
      if (!gr.cached) SharedTables::get().put(gr.sig, c->vocab_, gr.table);
    }
  }
  c->stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::shared_ptr<const CompiledGrammar>(std::move(c));
}

const TokenTable* CompiledGrammar::table(int32_t state) const {
  auto& slot = tables_[static_cast<size_t>(state)];
  const TokenTable* t = slot.load(std::memory_order_acquire);
  if (t != nullptr || grammar_.byteEdges(state).empty()) return t;
  std::lock_guard<std::mutex> lock(mu_);
  t = slot.load(std::memory_order_acquire);
  if (t != nullptr) return t;
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<const TokenTable> built;
  bool shared = false, first_use = true;
  std::string sig;
  if (options_.share) {
    sig = tableSignature(grammar_, state);
    if (auto it = by_signature_.find(sig); it != by_signature_.end()) {
      built = owned_[it->second];
      first_use = false;
    } else {
      built = SharedTables::get().find(sig, vocab_);
    }
    shared = built != nullptr;
  }
  if (!built) {
    built = std::make_shared<const TokenTable>(buildTable(state));
    if (options_.share) SharedTables::get().put(sig, vocab_, built);
  }
  if (options_.share && first_use) by_signature_.emplace(sig, owned_.size());
  install(state, built, shared, first_use);
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return built.get();
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
    const int32_t to = next_[static_cast<size_t>(from) * 256 + b];
    return to != kUnknown ? to : fill(from, b);
  }
  bool escapes(int32_t c, uint8_t b) const { return configs_[static_cast<size_t>(c)].escape.test(b); }

 private:
  static constexpr int32_t kUnknown = -2;
  int32_t fill(int32_t from, uint8_t b) {
    runner_->step(configs_[static_cast<size_t>(from)], b, &tmp_);
    const int32_t to = tmp_.alive() ? intern(tmp_) : -1;
    next_[static_cast<size_t>(from) * 256 + b] = to;  // intern() may have moved next_
    return to;
  }
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
// Pure (any thread): touches no member but the grammar and the vocabulary.
TokenTable CompiledGrammar::buildTable(int32_t state) const {
  const Vocabulary& v = *vocab_;
  const int32_t n = v.numSorted();
  StackPool pool;
  Runner runner(grammar_, &pool);
  ConfigDfa dfa(&runner);
  const size_t depth = v.maxTokenBytes() + 1;
  std::vector<int32_t> cfg(depth, -1);
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
  // The inner loop is one transition lookup per trie edge; whether a dying prefix escaped the
  // rule on the way (UNCERTAIN rather than REJECTED) is worked out only when it dies.
  size_t valid = 0;
  for (int32_t i = 0; i < n;) {
    const std::string_view tok = v.sortedBytes(i);
    size_t k = std::min(static_cast<size_t>(v.lcp(i)), valid);
    bool dead = false;
    for (; k < tok.size(); ++k) {
      const int32_t to = dfa.step(cfg[k], static_cast<uint8_t>(tok[k]));
      if (to < 0) {
        dead = true;
        break;
      }
      cfg[k + 1] = to;
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
    bool escaped = false;
    for (size_t j = 0; j <= k && !escaped; ++j) {
      escaped = dfa.escapes(cfg[j], static_cast<uint8_t>(tok[j]));
    }
    const int32_t lo = v.prefixEnd(i, k + 1);
    addRange(escaped ? kUnc : kRej, i, lo);
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
  if (counts[listed] < 4096) {
    for (const auto& [b, e] : ranges[listed]) {
      for (int32_t x = b; x < e; ++x) t.ids.push_back(v.sorted(x));
    }
    std::sort(t.ids.begin(), t.ids.end());
  } else {  // ids ascending through a bitmap over the vocabulary: no sort of ~10^5 ids
    std::vector<uint64_t> bits((static_cast<size_t>(v.size()) + 63) / 64, 0);
    for (const auto& [b, e] : ranges[listed]) {
      for (int32_t x = b; x < e; ++x) {
        const auto id = static_cast<uint32_t>(v.sorted(x));
        bits[id / 64] |= uint64_t{1} << (id % 64);
      }
    }
    for (size_t w = 0; w < bits.size(); ++w) {
      for (uint64_t x = bits[w]; x != 0; x &= x - 1) {
        t.ids.push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(x))));
      }
    }
  }
  t.uncertain.reserve(static_cast<size_t>(counts[kUnc]));
  for (const auto& [b, e] : ranges[kUnc]) {
    for (int32_t x = b; x < e; ++x) t.uncertain.push_back(x);
  }
  // [TAG_TABLE_BITS] One OR per mask word instead of a write per id.
  const size_t words = (static_cast<size_t>(v.size()) + 31) / 32;
  if (t.complement) {  // the eligible tokens less the rejected and the uncertain ones
    t.bits = v.eligibleMask();
    CHECK(t.bits.size() == words);
    for (int32_t id : t.ids) t.bits[static_cast<size_t>(id) / 32] &= ~(1u << (id % 32));
    for (int32_t u : t.uncertain) {
      const int32_t id = v.sorted(u);
      t.bits[static_cast<size_t>(id) / 32] &= ~(1u << (id % 32));
    }
  } else if (t.ids.size() > words) {
    t.bits.assign(words, 0u);
    for (int32_t id : t.ids) t.bits[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  }
  return t;
}

size_t CompiledGrammar::memoryBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t b = static_cast<size_t>(grammar_.numStates()) * sizeof(void*);
  for (const auto& t : owned_) b += tableBytes(*t);
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

// Runs each UNCERTAIN token of `t` against the stack `f`, sharing prefixes with the previous one
// checked. Nodes it interns are dropped by the caller's truncate.
std::vector<int32_t> GrammarMatcher::uncertainAllowed(const Frame& f, const TokenTable& t) {
  const Vocabulary& v = compiled_->vocab();
  std::vector<int32_t> out;
  depth_[0].clear();
  depth_[0].frames.push_back(f);
  std::string_view prev;
  size_t valid = 0;
  for (int32_t u : t.uncertain) {
    const std::string_view tok = v.sortedBytes(u);
    size_t l = 0;
    while (l < prev.size() && l < tok.size() && prev[l] == tok[l]) ++l;
    prev = tok;
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
    if (!dead) out.push_back(v.sorted(u));
  }
  return out;
}

void GrammarMatcher::fillNextTokenBitmask(std::span<uint32_t> words) {
  const size_t nw = maskWords();
  CHECK(words.size() >= nw);
  std::fill(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(nw), 0u);
  if (terminated_) return;
  const auto set = [&](int32_t id) { words[static_cast<size_t>(id) / 32] |= 1u << (id % 32); };
  const size_t mark = pool_.mark();
  for (const Frame& f : cur_.frames) {
    const TokenTable* t = compiled_->table(f.state);
    if (t == nullptr) continue;
    if (!t->bits.empty()) {  // [TAG_TABLE_BITS]
      CHECK(t->bits.size() == nw);
      const uint32_t* b = t->bits.data();
      for (size_t w = 0; w < nw; ++w) words[w] |= b[w];
    } else {
      CHECK(!t->complement);
      for (int32_t id : t->ids) set(id);
    }
    // Context-dependent tokens: the ones this stack accepts [TAG_UNCERTAIN_CACHE].
    if (t->uncertain.empty()) continue;
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(f.state)) << 32) |
                         static_cast<uint32_t>(f.parent + 1);
    auto it = uncertain_cache_.find(key);
    if (it == uncertain_cache_.end()) {
      if (uncertain_cache_.size() >= kUncertainCacheEntries) uncertain_cache_.clear();
      it = uncertain_cache_.emplace(key, uncertainAllowed(f, *t)).first;
    }
    for (int32_t id : it->second) set(id);
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
