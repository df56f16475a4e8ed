#include "common/grammar/grammar.h"

#include <algorithm>
#include <cstring>
#include <functional>

namespace garden::grammar {

// ---------------------------------------------------------------------------------------------
// GrammarBuilder

int32_t GrammarBuilder::addRule(std::string name) {
  const auto r = static_cast<int32_t>(rules_.size());
  rules_.push_back({std::move(name), 0});
  rules_.back().start = addState(r);
  return r;
}

int32_t GrammarBuilder::addState(int32_t rule) {
  states_.push_back({});
  states_.back().rule = rule;
  return static_cast<int32_t>(states_.size() - 1);
}

void GrammarBuilder::addBytes(int32_t from, uint8_t lo, uint8_t hi, int32_t to) {
  CHECK(lo <= hi);
  states_[static_cast<size_t>(from)].bytes.push_back({lo, hi, to});
}

void GrammarBuilder::addEpsilon(int32_t from, int32_t to) {
  CHECK(states_[static_cast<size_t>(from)].rule == states_[static_cast<size_t>(to)].rule);
  states_[static_cast<size_t>(from)].eps.push_back(to);
}

void GrammarBuilder::addCall(int32_t from, int32_t rule, int32_t to) {
  states_[static_cast<size_t>(from)].calls.push_back({rule, to});
}

void GrammarBuilder::setFinal(int32_t state) { states_[static_cast<size_t>(state)].final = true; }

int32_t GrammarBuilder::literal(int32_t from, std::string_view bytes) {
  const int32_t rule = states_[static_cast<size_t>(from)].rule;
  int32_t cur = from;
  for (char c : bytes) {
    const int32_t next = addState(rule);
    const auto b = static_cast<uint8_t>(c);
    addBytes(cur, b, b, next);
    cur = next;
  }
  return cur;
}

Result<Grammar> GrammarBuilder::build(int32_t root_rule) const {
  if (root_rule < 0 || root_rule >= numRules()) return invalidArgument("grammar: bad root rule");
  const size_t n = states_.size();
  // 1. Epsilon elimination: every state takes the edges and finality of its epsilon closure.
  std::vector<BState> flat(n);
  std::vector<int32_t> stack;
  std::vector<uint32_t> mark(n, 0);
  uint32_t epoch = 0;
  for (size_t s = 0; s < n; ++s) {
    ++epoch;
    BState& out = flat[s];
    out.rule = states_[s].rule;
    stack.assign(1, static_cast<int32_t>(s));
    mark[s] = epoch;
    while (!stack.empty()) {
      const auto& st = states_[static_cast<size_t>(stack.back())];
      stack.pop_back();
      out.final = out.final || st.final;
      out.bytes.insert(out.bytes.end(), st.bytes.begin(), st.bytes.end());
      out.calls.insert(out.calls.end(), st.calls.begin(), st.calls.end());
      for (int32_t e : st.eps) {
        if (mark[static_cast<size_t>(e)] != epoch) {
          mark[static_cast<size_t>(e)] = epoch;
          stack.push_back(e);
        }
      }
    }
    std::sort(out.bytes.begin(), out.bytes.end(), [](const ByteEdge& a, const ByteEdge& b) {
      return std::tie(a.lo, a.hi, a.target) < std::tie(b.lo, b.hi, b.target);
    });
    out.bytes.erase(std::unique(out.bytes.begin(), out.bytes.end(),
                                [](const ByteEdge& a, const ByteEdge& b) {
                                  return a.lo == b.lo && a.hi == b.hi && a.target == b.target;
                                }),
                    out.bytes.end());
    std::sort(out.calls.begin(), out.calls.end(), [](const CallEdge& a, const CallEdge& b) {
      return std::tie(a.rule, a.target) < std::tie(b.rule, b.target);
    });
    out.calls.erase(std::unique(out.calls.begin(), out.calls.end(),
                                [](const CallEdge& a, const CallEdge& b) {
                                  return a.rule == b.rule && a.target == b.target;
                                }),
                    out.calls.end());
  }
  // 2. Reachability from the root's start state (callees' start states included).
  std::vector<int32_t> rule_new(rules_.size(), -1);
  std::vector<int32_t> state_new(n, -1);
  std::vector<int32_t> order;
  std::vector<int32_t> rule_order;
  auto visitRule = [&](int32_t r) {
    if (rule_new[static_cast<size_t>(r)] >= 0) return;
    rule_new[static_cast<size_t>(r)] = static_cast<int32_t>(rule_order.size());
    rule_order.push_back(r);
    const int32_t s = rules_[static_cast<size_t>(r)].start;
    if (state_new[static_cast<size_t>(s)] < 0) {
      state_new[static_cast<size_t>(s)] = static_cast<int32_t>(order.size());
      order.push_back(s);
    }
  };
  visitRule(root_rule);
  for (size_t i = 0; i < order.size(); ++i) {
    const BState& st = flat[static_cast<size_t>(order[i])];
    auto visitState = [&](int32_t t) {
      if (state_new[static_cast<size_t>(t)] < 0) {
        state_new[static_cast<size_t>(t)] = static_cast<int32_t>(order.size());
        order.push_back(t);
      }
    };
    for (const auto& e : st.bytes) visitState(e.target);
    for (const auto& c : st.calls) {
      if (c.rule < 0 || c.rule >= numRules()) return invalidArgument("grammar: call to bad rule");
      visitRule(c.rule);
      visitState(c.target);
    }
  }
  // 3. Renumber into the flat arrays.
  Grammar g;
  g.root_ = 0;
  for (int32_t r : rule_order) {
    g.rule_start_.push_back(state_new[static_cast<size_t>(rules_[static_cast<size_t>(r)].start)]);
    g.rule_name_.push_back(rules_[static_cast<size_t>(r)].name);
  }
  g.byte_begin_.push_back(0);
  g.call_begin_.push_back(0);
  for (int32_t old : order) {
    const BState& st = flat[static_cast<size_t>(old)];
    g.state_rule_.push_back(rule_new[static_cast<size_t>(st.rule)]);
    g.final_.push_back(st.final ? 1 : 0);
    for (const auto& e : st.bytes) {
      g.byte_edges_.push_back({e.lo, e.hi, state_new[static_cast<size_t>(e.target)]});
    }
    for (const auto& c : st.calls) {
      g.call_edges_.push_back(
          {rule_new[static_cast<size_t>(c.rule)], state_new[static_cast<size_t>(c.target)]});
    }
    g.byte_begin_.push_back(static_cast<uint32_t>(g.byte_edges_.size()));
    g.call_begin_.push_back(static_cast<uint32_t>(g.call_edges_.size()));
  }
  RETURN_IF_ERROR(g.finish());
  return g;
}

// ---------------------------------------------------------------------------------------------
// Grammar

Status Grammar::finish() {
  const auto ns = static_cast<size_t>(numStates());
  const auto nr = static_cast<size_t>(numRules());
  // Nullable states: final, or a call of a nullable rule into a nullable state.
  std::vector<uint8_t> snull(ns, 0);
  nullable_.assign(nr, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < ns; ++s) {
      if (snull[s]) continue;
      bool v = final_[s] != 0;
      for (const auto& c : callEdges(static_cast<int32_t>(s))) {
        if (nullable_[static_cast<size_t>(c.rule)] && snull[static_cast<size_t>(c.target)]) v = true;
      }
      if (v) {
        snull[s] = 1;
        changed = true;
      }
    }
    for (size_t r = 0; r < nr; ++r) {
      if (!nullable_[r] && snull[static_cast<size_t>(rule_start_[r])]) {
        nullable_[r] = 1;
        changed = true;
      }
    }
  }
  // FIRST per state.
  std::vector<std::bitset<256>> first(ns);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < ns; ++s) {
      std::bitset<256> f = first[s];
      for (const auto& e : byteEdges(static_cast<int32_t>(s))) {
        for (int b = e.lo; b <= e.hi; ++b) f.set(static_cast<size_t>(b));
      }
      for (const auto& c : callEdges(static_cast<int32_t>(s))) {
        f |= first[static_cast<size_t>(rule_start_[static_cast<size_t>(c.rule)])];
        if (nullable_[static_cast<size_t>(c.rule)]) f |= first[static_cast<size_t>(c.target)];
      }
      if (f != first[s]) {
        first[s] = f;
        changed = true;
      }
    }
  }
  // FOLLOW per rule.
  follow_.assign(nr, {});
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < ns; ++s) {
      for (const auto& c : callEdges(static_cast<int32_t>(s))) {
        std::bitset<256> f = follow_[static_cast<size_t>(c.rule)];
        f |= first[static_cast<size_t>(c.target)];
        if (snull[static_cast<size_t>(c.target)]) f |= follow_[static_cast<size_t>(state_rule_[s])];
        if (f != follow_[static_cast<size_t>(c.rule)]) {
          follow_[static_cast<size_t>(c.rule)] = f;
          changed = true;
        }
      }
    }
  }
  // Left recursion: rule R enters rule C without consuming a byte when C is called from a state
  // reachable from R's start through calls of nullable rules only. A cycle of such entries would
  // make closures push forever.
  std::vector<std::vector<int32_t>> enters(nr);
  for (size_t r = 0; r < nr; ++r) {
    std::vector<int32_t> todo{rule_start_[r]};
    std::vector<uint8_t> seen(ns, 0);
    seen[static_cast<size_t>(rule_start_[r])] = 1;
    while (!todo.empty()) {
      const int32_t s = todo.back();
      todo.pop_back();
      for (const auto& c : callEdges(s)) {
        enters[r].push_back(c.rule);
        if (nullable_[static_cast<size_t>(c.rule)] && !seen[static_cast<size_t>(c.target)]) {
          seen[static_cast<size_t>(c.target)] = 1;
          todo.push_back(c.target);
        }
      }
    }
  }
  std::vector<uint8_t> color(nr, 0);  // 0 new, 1 on the path, 2 done
  std::function<bool(size_t)> cyclic = [&](size_t r) {
    color[r] = 1;
    for (int32_t c : enters[r]) {
      const auto cr = static_cast<size_t>(c);
      if (color[cr] == 1) return true;
      if (color[cr] == 0 && cyclic(cr)) return true;
    }
    color[r] = 2;
    return false;
  };
  for (size_t r = 0; r < nr; ++r) {
    if (color[r] == 0 && cyclic(r)) {
      return invalidArgument("grammar: rule '" + rule_name_[r] +
                             "' is left-recursive (it can re-enter itself without consuming input)");
    }
  }
  return okStatus();
}

namespace {
void putU32(std::string* out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out->append(b, 4);
}
struct Reader {
  std::string_view in;
  size_t pos = 0;
  bool ok = true;
  uint32_t u32() {
    if (pos + 4 > in.size()) {
      ok = false;
      return 0;
    }
    uint32_t v;
    std::memcpy(&v, in.data() + pos, 4);
    pos += 4;
    return v;
  }
  std::string str(uint32_t n) {
    if (pos + n > in.size()) {
      ok = false;
      return {};
    }
    std::string s(in.substr(pos, n));
    pos += n;
    return s;
  }
};
constexpr uint32_t kMagic = 0x31524747;  // "GGR1"
}  // namespace

std::string Grammar::serialize() const {
  std::string out;
  putU32(&out, kMagic);
  putU32(&out, static_cast<uint32_t>(root_));
  putU32(&out, static_cast<uint32_t>(numRules()));
  for (int32_t r = 0; r < numRules(); ++r) {
    putU32(&out, static_cast<uint32_t>(rule_start_[static_cast<size_t>(r)]));
    putU32(&out, static_cast<uint32_t>(rule_name_[static_cast<size_t>(r)].size()));
    out += rule_name_[static_cast<size_t>(r)];
  }
  putU32(&out, static_cast<uint32_t>(numStates()));
  for (int32_t s = 0; s < numStates(); ++s) {
    const auto i = static_cast<size_t>(s);
    putU32(&out, static_cast<uint32_t>(state_rule_[i]) | (final_[i] ? 0x80000000u : 0u));
    putU32(&out, byte_begin_[i + 1] - byte_begin_[i]);
    putU32(&out, call_begin_[i + 1] - call_begin_[i]);
  }
  for (const auto& e : byte_edges_) {
    putU32(&out, uint32_t{e.lo} | (uint32_t{e.hi} << 8));
    putU32(&out, static_cast<uint32_t>(e.target));
  }
  for (const auto& c : call_edges_) {
    putU32(&out, static_cast<uint32_t>(c.rule));
    putU32(&out, static_cast<uint32_t>(c.target));
  }
  return out;
}

Result<Grammar> Grammar::deserialize(std::string_view bytes) {
  Reader rd{bytes};
  auto bad = [](const char* what) {
    return invalidArgument(std::string("grammar: corrupt serialized grammar (") + what + ")");
  };
  if (rd.u32() != kMagic) return bad("magic");
  Grammar g;
  const uint32_t root = rd.u32();
  const uint32_t nr = rd.u32();
  if (!rd.ok || nr == 0 || nr > (1u << 20) || root >= nr) return bad("rules");
  for (uint32_t r = 0; r < nr; ++r) {
    g.rule_start_.push_back(static_cast<int32_t>(rd.u32()));
    const uint32_t len = rd.u32();
    if (len > 4096) return bad("rule name");
    g.rule_name_.push_back(rd.str(len));
  }
  const uint32_t ns = rd.u32();
  if (!rd.ok || ns == 0 || ns > (1u << 24)) return bad("states");
  g.root_ = static_cast<int32_t>(root);
  g.byte_begin_.push_back(0);
  g.call_begin_.push_back(0);
  for (uint32_t s = 0; s < ns; ++s) {
    const uint32_t rf = rd.u32();
    const uint32_t nb = rd.u32();
    const uint32_t nc = rd.u32();
    if (!rd.ok || (rf & 0x7fffffffu) >= nr || nb > 65536 || nc > 65536) return bad("state");
    g.state_rule_.push_back(static_cast<int32_t>(rf & 0x7fffffffu));
    g.final_.push_back((rf & 0x80000000u) ? 1 : 0);
    g.byte_begin_.push_back(g.byte_begin_.back() + nb);
    g.call_begin_.push_back(g.call_begin_.back() + nc);
  }
  if (uint64_t{g.byte_begin_.back()} * 8 + uint64_t{g.call_begin_.back()} * 8 >
      bytes.size() - rd.pos) {
    return bad("edges");
  }
  for (uint32_t i = 0; i < g.byte_begin_.back(); ++i) {
    const uint32_t lh = rd.u32();
    const uint32_t t = rd.u32();
    const auto lo = static_cast<uint8_t>(lh & 0xff);
    const auto hi = static_cast<uint8_t>((lh >> 8) & 0xff);
    if (lo > hi || t >= ns) return bad("byte edge");
    g.byte_edges_.push_back({lo, hi, static_cast<int32_t>(t)});
  }
  for (uint32_t i = 0; i < g.call_begin_.back(); ++i) {
    const uint32_t r = rd.u32();
    const uint32_t t = rd.u32();
    if (r >= nr || t >= ns) return bad("call edge");
    g.call_edges_.push_back({static_cast<int32_t>(r), static_cast<int32_t>(t)});
  }
  for (int32_t st : g.rule_start_) {
    if (st < 0 || static_cast<uint32_t>(st) >= ns) return bad("rule start");
  }
  if (!rd.ok || rd.pos != bytes.size()) return bad("length");
  RETURN_IF_ERROR(g.finish());
  return g;
}

uint64_t Grammar::hash() const {
  const std::string s = serialize();
  uint64_t h = 1469598103934665603ULL;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

std::string Grammar::debugString() const {
  std::string out;
  auto byteText = [](uint8_t b) {
    if (b >= 0x21 && b < 0x7f) return std::string(1, static_cast<char>(b));
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\x%02x", b);
    return std::string(buf);
  };
  for (int32_t r = 0; r < numRules(); ++r) {
    out += "rule " + std::to_string(r) + " " + ruleName(r) + " start=" +
           std::to_string(ruleStart(r)) + (nullable(r) ? " nullable" : "") + "\n";
  }
  for (int32_t s = 0; s < numStates(); ++s) {
    out += "  s" + std::to_string(s) + " (r" + std::to_string(ruleOf(s)) + ")" +
           (isFinal(s) ? " final" : "") + ":";
    for (const auto& e : byteEdges(s)) {
      out += " [" + byteText(e.lo) + (e.hi != e.lo ? "-" + byteText(e.hi) : "") + "]->s" +
             std::to_string(e.target);
    }
    for (const auto& c : callEdges(s)) {
      out += " call(r" + std::to_string(c.rule) + ")->s" + std::to_string(c.target);
    }
    out += "\n";
  }
  return out;
}

}  // namespace garden::grammar
