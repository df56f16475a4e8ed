#pragma once
// A byte-level grammar for constrained decoding: a set of rules, each a nondeterministic finite
// automaton over bytes whose edges either consume one byte in a range or call another rule
// (push the return state, run the callee from its start, pop back when the callee reaches a
// final state). This is a recursive transition network, i.e. a pushdown automaton over bytes;
// the matcher (matcher.h) runs it on a set of stacks. No epsilon edges survive build(); there is
// no left recursion (build() rejects it), so closures terminate.
//
// Grammars come from the JSON Schema compiler (json_schema.h) but nothing here knows JSON. A
// Grammar is immutable after build(), serializable (ivy compiles, the tier that masks tokens
// deserializes) and safe to share between threads.
//
// Threads: GrammarBuilder is single-threaded; a built Grammar is read-only.

#include <bitset>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace garden::grammar {

struct ByteEdge {
  uint8_t lo = 0;
  uint8_t hi = 0;
  int32_t target = 0;
};

struct CallEdge {
  int32_t rule = 0;    // callee
  int32_t target = 0;  // state of the caller's rule to continue at once the callee returns
};

class Grammar {
 public:
  int32_t numStates() const { return static_cast<int32_t>(state_rule_.size()); }
  int32_t numRules() const { return static_cast<int32_t>(rule_start_.size()); }
  int32_t rootRule() const { return root_; }
  int32_t ruleStart(int32_t rule) const { return rule_start_[static_cast<size_t>(rule)]; }
  const std::string& ruleName(int32_t rule) const { return rule_name_[static_cast<size_t>(rule)]; }
  int32_t ruleOf(int32_t state) const { return state_rule_[static_cast<size_t>(state)]; }
  bool isFinal(int32_t state) const { return final_[static_cast<size_t>(state)] != 0; }
  std::span<const ByteEdge> byteEdges(int32_t state) const {
    const auto s = static_cast<size_t>(state);
    return {byte_edges_.data() + byte_begin_[s], byte_begin_[s + 1] - byte_begin_[s]};
  }
  std::span<const CallEdge> callEdges(int32_t state) const {
    const auto s = static_cast<size_t>(state);
    return {call_edges_.data() + call_begin_[s], call_begin_[s + 1] - call_begin_[s]};
  }
  // Bytes that can come right after `rule` returns, over every call site (FOLLOW set, one byte
  // of lookahead). Empty for a root rule that is called nowhere.
  const std::bitset<256>& follow(int32_t rule) const { return follow_[static_cast<size_t>(rule)]; }
  bool nullable(int32_t rule) const { return nullable_[static_cast<size_t>(rule)] != 0; }

  // Binary form (versioned): what ivy sends to the masking tier. deserialize() checks every index,
  // so a corrupt blob is an INVALID_ARGUMENT, never a crash.
  std::string serialize() const;
  static Result<Grammar> deserialize(std::string_view bytes);
  // 64-bit FNV-1a of serialize(): the cache key of compiled token tables.
  uint64_t hash() const;
  std::string debugString() const;

 private:
  friend class GrammarBuilder;
  Status finish();  // offsets, FOLLOW / nullable, left-recursion check

  int32_t root_ = 0;
  std::vector<int32_t> rule_start_;
  std::vector<std::string> rule_name_;
  std::vector<int32_t> state_rule_;
  std::vector<uint8_t> final_;
  std::vector<uint32_t> byte_begin_;  // numStates + 1
  std::vector<uint32_t> call_begin_;  // numStates + 1
  std::vector<ByteEdge> byte_edges_;
  std::vector<CallEdge> call_edges_;
  std::vector<std::bitset<256>> follow_;
  std::vector<uint8_t> nullable_;
};

// Builds a Grammar with epsilon edges allowed (Thompson-style composition); build() removes
// them, drops unreachable states and rules, and validates.
class GrammarBuilder {
 public:
  // A new rule with a fresh start state; returns the rule id.
  int32_t addRule(std::string name);
  int32_t start(int32_t rule) const { return rules_[static_cast<size_t>(rule)].start; }
  int32_t addState(int32_t rule);
  void addBytes(int32_t from, uint8_t lo, uint8_t hi, int32_t to);
  void addEpsilon(int32_t from, int32_t to);
  void addCall(int32_t from, int32_t rule, int32_t to);
  void setFinal(int32_t state);
  int32_t ruleOfState(int32_t state) const { return states_[static_cast<size_t>(state)].rule; }
  // Appends a chain consuming exactly `bytes` from `from`; returns the state after it.
  int32_t literal(int32_t from, std::string_view bytes);
  int32_t numRules() const { return static_cast<int32_t>(rules_.size()); }
  size_t numStates() const { return states_.size(); }

  Result<Grammar> build(int32_t root_rule) const;

 private:
  struct BState {
    int32_t rule = 0;
    bool final = false;
    std::vector<ByteEdge> bytes;
    std::vector<int32_t> eps;
    std::vector<CallEdge> calls;
  };
  struct BRule {
    std::string name;
    int32_t start = 0;
  };
  std::vector<BState> states_;
  std::vector<BRule> rules_;
};

}  // namespace garden::grammar
