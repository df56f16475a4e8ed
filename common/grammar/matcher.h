#pragma once
// Token masks from a Grammar over a Vocabulary, after XGrammar's design:
//
//  * CompiledGrammar precomputes, once per grammar (the cache in cache.h keeps them per grammar
//    hash), a token table for every automaton state that consumes bytes. A table splits the
//    vocabulary by what the state alone decides: ACCEPTED (some path consumes the whole token
//    without leaving the state's rule: valid whatever the stack below), REJECTED (every path dies
//    inside the rule, and none left the rule on a byte the rule's FOLLOW set allows) and
//    UNCERTAIN (context-dependent: a path left the rule mid-token). Tables are built by walking
//    the byte-sorted vocabulary once, sharing each common prefix (the flattened token trie).
//  * GrammarMatcher is one sequence's state: a set of stacks (the automaton is
//    nondeterministic). Its mask is the union over the stacks' top states of ACCEPTED, plus the
//    UNCERTAIN tokens checked byte by byte against the full stack. End tokens are allowed once
//    the root rule can end (the JSON value is complete), and then only they and tokens that
//    continue the value are.
//
// Masks are packed bitmasks: bit (id % 32) of word (id / 32), 1 = allowed (XGrammar's layout).
//
// Threads: a CompiledGrammar is immutable and shared; a GrammarMatcher is used by one thread.

#include <atomic>
#include <bitset>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/grammar/grammar.h"
#include "common/grammar/vocabulary.h"

namespace garden::grammar {

// A stack is a top frame (state, parent) where parent is a node of a StackPool holding the rest
// of the stack (the return states), -1 = the bottom.
struct Frame {
  int32_t state;
  int32_t parent;
  bool operator==(const Frame& o) const { return state == o.state && parent == o.parent; }
};

// Interned, persistent stack nodes (hash-consed, so equal stacks have equal ids). mark() and
// truncate() drop nodes made speculatively (mask computation) again.
class StackPool {
 public:
  // Deeper stacks are dropped (a guard, far above real nesting: a drop could let the mask allow a
  // token the matcher then refuses, which callers handle as a broken constraint).
  static constexpr int32_t kMaxDepth = 1 << 16;
  int32_t intern(int32_t state, int32_t parent);  // -1 when kMaxDepth would be exceeded
  const Frame& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  size_t mark() const { return nodes_.size(); }
  void truncate(size_t mark);
  void clear() {
    nodes_.clear();
    depth_.clear();
    index_.clear();
  }

 private:
  std::vector<Frame> nodes_;
  std::vector<int32_t> depth_;
  std::unordered_map<uint64_t, int32_t> index_;
};

// A set of stacks after closure: every frame's state consumes bytes. `ended`: some path reached
// a final state of the bottom frame's rule (at the true bottom: the whole value is complete).
// `escape`: the FOLLOW bytes of rules that ended at the bottom (for precomputation, where the
// bottom stands for an unknown caller).
struct Config {
  std::vector<Frame> frames;
  std::bitset<256> escape;
  bool ended = false;
  void clear() {
    frames.clear();
    escape.reset();
    ended = false;
  }
  bool alive() const { return ended || !frames.empty(); }
};

// Runs a Grammar on Configs.
class Runner {
 public:
  Runner(const Grammar& g, StackPool* pool) : g_(g), pool_(pool) {}
  // out = closure of {f}.
  void start(Frame f, Config* out);
  // out = closure of the frames `in` reaches by consuming b.
  void step(const Config& in, uint8_t b, Config* out);

 private:
  void close(Frame f, Config* out);
  const Grammar& g_;
  StackPool* pool_;
  std::vector<Frame> seen_;
  std::vector<Frame> todo_;
};

// Per-state token table.
struct TokenTable {
  bool complement = false;        // ids_ lists REJECTED ids (else ACCEPTED ids)
  std::vector<int32_t> ids;       // token ids, ascending
  std::vector<int32_t> uncertain; // indices into Vocabulary::sorted, ascending
  // [TAG_TABLE_BITS] The ACCEPTED ids as a bitmask over the vocabulary (32 ids a word), kept when
  // OR-ing it into a mask is cheaper than setting the ids one by one: complement tables, and
  // tables listing more ids than the mask has words. Empty otherwise.
  std::vector<uint32_t> bits;
};

struct CompileStats {
  int32_t states = 0;     // states with a token table
  int32_t built = 0;      // tables walked over the vocabulary; the other states shared one
  int32_t shared = 0;     // states given the table of an identical state (here or cached)
  int64_t accepted = 0;   // summed over states
  int64_t rejected = 0;
  int64_t uncertain = 0;
  double seconds = 0;  // wall time spent getting tables
};

struct CompileOptions {
  // Build every state's table in compile() (the default). false: a state's table is built the
  // first time a matcher reaches the state (compile() is then only the grammar; large grammars,
  // e.g. long bounded strings, pay only for the states generation visits).
  bool eager = true;
  // Threads walking the vocabulary in an eager compile; 0: min(hardware threads, 8).
  int threads = 0;
  // [TAG_TABLE_SHARING] A state's table depends only on what the state can reach (its byte and
  // call edges, the rules it calls, final states) and its rule's FOLLOW set: tableSignature().
  // States with equal signatures share one table, within the grammar and, through a process-wide
  // cache bounded in bytes, across grammars over the same vocabulary (every JSON grammar's string
  // rule is the same automaton).
  bool share = true;
};

// The canonical form of what `state`'s token table depends on (see CompileOptions::share):
// equal signatures give equal tables over any vocabulary.
std::string tableSignature(const Grammar& g, int32_t state);

class CompiledGrammar {
 public:
  static Result<std::shared_ptr<const CompiledGrammar>> compile(
      Grammar grammar, std::shared_ptr<const Vocabulary> vocab, CompileOptions options = {});
  ~CompiledGrammar();

  const Grammar& grammar() const { return grammar_; }
  const Vocabulary& vocab() const { return *vocab_; }
  // The table of a state that consumes bytes (built now if it was not yet: thread-safe);
  // nullptr for states that consume none.
  const TokenTable* table(int32_t state) const;
  // Totals over the tables got so far.
  CompileStats stats() const;
  // Bytes of the tables this grammar holds (a table shared by several states counted once).
  size_t memoryBytes() const;
  // Empties the process-wide cache of shared tables (benchmarks measuring a cold compile).
  static void clearSharedTables();

 private:
  CompiledGrammar(Grammar g, std::shared_ptr<const Vocabulary> v, CompileOptions o);
  TokenTable buildTable(int32_t state) const;  // pure: any thread
  // Under mu_: records `t` as `state`'s table; `first_use`: the grammar holds no state with it yet.
  void install(int32_t state, std::shared_ptr<const TokenTable> t, bool shared,
               bool first_use) const;
  Grammar grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  const CompileOptions options_;
  std::unique_ptr<std::atomic<const TokenTable*>[]> tables_;
  mutable std::mutex mu_;
  mutable CompileStats stats_;  // guarded by mu_
  mutable std::vector<std::shared_ptr<const TokenTable>> owned_;  // guarded by mu_
  mutable std::unordered_map<std::string, size_t> by_signature_;  // mu_: index into owned_
};

class GrammarMatcher {
 public:
  // `end_tokens`: ids allowed (and only then) once the value is complete; accepting one
  // terminates the matcher. They need not be eligible vocabulary entries (special ids).
  GrammarMatcher(std::shared_ptr<const CompiledGrammar> compiled, std::vector<int32_t> end_tokens);
  GrammarMatcher(const GrammarMatcher&) = delete;
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;

  // Advances by one sampled token. false (state unchanged): the grammar does not allow it.
  bool acceptToken(int32_t id);
  // Advances by raw bytes (tests, prefilled text). false (state unchanged): not allowed.
  bool acceptBytes(std::string_view bytes);
  // Whether acceptToken(id) would succeed, without advancing (the brute-force reference).
  bool canAcceptToken(int32_t id);
  // Writes the mask of tokens allowed next into words[0 .. maskWords()).
  void fillNextTokenBitmask(std::span<uint32_t> words);
  size_t maskWords() const { return (static_cast<size_t>(compiled_->vocab().size()) + 31) / 32; }
  // The value is complete (an end token would be accepted now).
  bool canEnd() const { return cur_.ended; }
  // An end token was accepted.
  bool terminated() const { return terminated_; }
  // Ids allowed next, ascending (tests).
  std::vector<int32_t> allowedTokens();
  // Stacks alive now (diagnostics, tests).
  size_t numStacks() const { return cur_.frames.size(); }

 private:
  bool run(std::string_view bytes, bool commit);
  // The UNCERTAIN tokens of `t` (f.state's table) that the stack `f` accepts, ascending by bytes.
  std::vector<int32_t> uncertainAllowed(const Frame& f, const TokenTable& t);
  std::shared_ptr<const CompiledGrammar> compiled_;
  std::vector<int32_t> end_tokens_;
  StackPool pool_;
  Runner runner_;
  Config cur_;
  Config tmp_a_, tmp_b_;
  std::vector<Config> depth_;
  // [TAG_UNCERTAIN_CACHE] uncertainAllowed() by stack: (state, parent node) names the whole stack
  // (the pool hash-conses stacks, and nodes a committed state uses are never truncated). Inside a
  // string or a number the stack top repeats from token to token. Bounded: cleared when full.
  static constexpr size_t kUncertainCacheEntries = 64;
  std::unordered_map<uint64_t, std::vector<int32_t>> uncertain_cache_;
  bool terminated_ = false;
};

}  // namespace garden::grammar
