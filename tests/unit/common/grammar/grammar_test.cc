// common/grammar: the JSON Schema compiler, the byte automaton, token tables and masks.
//
// A synthetic vocabulary (every single byte, JSON fragments, random multi-byte pieces, two
// excluded "special" end ids) keeps these fast; tests/conformance/grammar repeats the random
// generation over the real o200k_harmony vocabulary.

#include "common/grammar/grammar.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/grammar/constrained.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/matcher.h"
#include "common/grammar/regex.h"
#include "common/grammar/vocabulary.h"
#include "common/harmony_header.h"
#include "tests/unit/common/grammar/random_model.h"
#include "tests/unit/common/grammar/schema_validator.h"
#include "tests/unit/common/grammar/test_schemas.h"

namespace garden::grammar {
namespace {

using testing::SchemaCase;
using testing::schemaCases;
using testing::SchemaValidator;

struct SynthVocab {
  std::shared_ptr<const Vocabulary> vocab;
  int32_t end_return = 0;
  int32_t end_end = 0;
};

const SynthVocab& synthVocab() {
  static const SynthVocab k = [] {
    std::vector<std::string> toks;
    for (int b = 0; b < 256; ++b) toks.emplace_back(1, static_cast<char>(b));
    const char* frags[] = {
        "{",    "}",     "[",     "]",      "{\"",    "\":",     "\",",   "\"}",   "},",
        "\":\"", " \"",  ", \"",  "\": ",   "true",   "false",   "null",  "12",    "345",
        "-1",   ".5",    "e3",    "E-",     "name",   "age",     "id",    "note",  "tags",
        "red",  "green", "blue",  "ish",    "2024",   "-02-",    "29",    "T13",   ":45:",
        "00Z",  "abc",   "ABC",   "-123",   "@",      "example", ".com",  ".co",   "\\n",
        "\\u00", "e9",   "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "  ", "\n", " {",
        "\"]",  "\"],",  "]}",    "}]",     "},{\"",  "\":[",    "\":{\"", "\":null", "w1",
        "_1",   "w0_",   "kids",  "\":[]}", "l1",     "l2",      "l3",    "l4",    "zip",
        "city", "home",  "work",  "123e4567", "-e89b", "-12d3",  "-a456", "-426614174000",
        "cat",  "dogs",  " cat",  "\"\"",   "x\"",    "\"x",     ",\"",   "\"v\":", "\"k\":"};
    for (const char* f : frags) toks.emplace_back(f);
    std::mt19937 rng(7);
    const std::string alpha = "abcxyzAZ0129_-.:,{}[]\" \\@eEnult";
    for (int i = 0; i < 400; ++i) {
      std::string t;
      const int len = 2 + static_cast<int>(rng() % 5);
      for (int j = 0; j < len; ++j) t += alpha[rng() % alpha.size()];
      toks.push_back(t);
    }
    std::vector<uint8_t> excluded(toks.size(), 0);
    SynthVocab v;
    toks.emplace_back("<|return|>");
    excluded.push_back(1);
    v.end_return = static_cast<int32_t>(toks.size() - 1);
    toks.emplace_back("<|end|>");
    excluded.push_back(1);
    v.end_end = static_cast<int32_t>(toks.size() - 1);
    v.vocab = std::make_shared<Vocabulary>(std::move(toks), excluded);
    return v;
  }();
  return k;
}

Result<Grammar> grammarFor(const std::string& schema, const JsonSchemaOptions& o = {}) {
  if (schema == "json_object") return jsonObjectGrammar(o);
  return jsonSchemaGrammar(schema, o);
}

std::shared_ptr<const CompiledGrammar> compiled(const std::string& schema, bool eager = true) {
  auto g = grammarFor(schema);
  EXPECT_TRUE(g.isOk()) << schema << ": " << g.status().message();
  if (!g.isOk()) return nullptr;
  auto c = CompiledGrammar::compile(std::move(g).value(), synthVocab().vocab,
                                    CompileOptions{eager});
  EXPECT_TRUE(c.isOk());
  return c.isOk() ? *c : nullptr;
}

bool matchesWhole(const std::shared_ptr<const CompiledGrammar>& c, const std::string& text) {
  GrammarMatcher m(c, {synthVocab().end_return});
  return m.acceptBytes(text) && m.canEnd();
}

TEST(GrammarSchemas, AtLeastTwentySchemas) { EXPECT_GE(schemaCases().size(), 20u); }

TEST(GrammarSchemas, AcceptsAndRejectsByteStrings) {
  for (const SchemaCase& sc : schemaCases()) {
    SCOPED_TRACE(sc.name);
    auto c = compiled(sc.schema, /*eager=*/false);
    ASSERT_NE(c, nullptr);
    for (const auto& t : sc.accept) EXPECT_TRUE(matchesWhole(c, t)) << "should accept: " << t;
    for (const auto& t : sc.reject) EXPECT_FALSE(matchesWhole(c, t)) << "should reject: " << t;
    if (sc.schema != "json_object") {
      SchemaValidator val(sc.schema);
      for (const auto& t : sc.accept) EXPECT_EQ(val.validate(t), "") << t;
    }
  }
}

TEST(GrammarSchemas, PrefixesAreNotComplete) {
  auto c = compiled(schemaCases()[8].schema, false);  // person_strict
  GrammarMatcher m(c, {});
  ASSERT_TRUE(m.acceptBytes(R"({"name":"Ann","age":3)"));
  EXPECT_FALSE(m.canEnd());
  ASSERT_TRUE(m.acceptBytes("1"));  // numbers may continue
  EXPECT_FALSE(m.canEnd());
  ASSERT_TRUE(m.acceptBytes("}"));
  EXPECT_TRUE(m.canEnd());
  EXPECT_FALSE(m.acceptBytes(" "));  // nothing after the value
}

TEST(GrammarSchemas, WhitespaceIsBounded) {
  const std::string s = R"({"type":"array","items":{"type":"integer"}})";
  auto g1 = jsonSchemaGrammar(s);
  ASSERT_TRUE(g1.isOk());
  auto c1 = CompiledGrammar::compile(*g1, synthVocab().vocab, CompileOptions{false});
  ASSERT_TRUE(c1.isOk());
  EXPECT_TRUE(matchesWhole(*c1, "[1, 2]"));
  EXPECT_FALSE(matchesWhole(*c1, "[1,  2]"));
  EXPECT_FALSE(matchesWhole(*c1, "[1,\n2]"));
  JsonSchemaOptions pretty;
  pretty.max_whitespace = 5;
  pretty.whitespace = " \n";
  auto g2 = jsonSchemaGrammar(s, pretty);
  ASSERT_TRUE(g2.isOk());
  auto c2 = CompiledGrammar::compile(*g2, synthVocab().vocab, CompileOptions{false});
  ASSERT_TRUE(c2.isOk());
  EXPECT_TRUE(matchesWhole(*c2, "[\n  1,\n  2\n]"));
  EXPECT_FALSE(matchesWhole(*c2, "[\n      1]"));  // 7 bytes > 5
  GrammarMatcher m(*c2, {});
  ASSERT_TRUE(m.acceptBytes("[1,"));
  EXPECT_FALSE(m.acceptBytes("      "));  // a model cannot loop on whitespace
}

// [TAG_NUMBER_RANGE] Integer bounds are exact: over every integer of a window around the bounds
// (and far from them), the grammar accepts exactly the JSON texts of the integers in range.
TEST(GrammarSchemas, IntegerRangesAreExact) {
  struct Case {
    const char* bounds;
    int64_t lo, hi;  // the integers in range (inclusive; INT64_MIN/MAX: unbounded)
  };
  constexpr int64_t kNo = std::numeric_limits<int64_t>::max();
  const Case cases[] = {
      {R"("minimum":0)", 0, kNo},
      {R"("minimum":-37,"maximum":1250)", -37, 1250},
      {R"("exclusiveMinimum":-5.5,"exclusiveMaximum":99)", -5, 98},
      {R"("minimum":7,"maximum":7)", 7, 7},
      {R"("maximum":-10)", -kNo, -10},
      {R"("minimum":0.5,"maximum":1099.9)", 1, 1099},
      {R"("minimum":-1000,"exclusiveMaximum":0)", -1000, -1},
      {R"("minimum":100,"maximum":199)", 100, 199},
      {R"("minimum":19,"maximum":2001)", 19, 2001},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.bounds);
    auto c = compiled(std::string(R"({"type":"integer",)") + k.bounds + "}");
    ASSERT_NE(c, nullptr);
    auto test = [&](int64_t v) {
      const bool want = v >= k.lo && v <= k.hi;
      EXPECT_EQ(matchesWhole(c, std::to_string(v)), want) << v;
    };
    for (int64_t v = -2100; v <= 2100; ++v) test(v);
    for (int64_t v : {int64_t{99999}, int64_t{-99999}, int64_t{123456789012345678},
                      int64_t{-123456789012345678}})
      test(v);
    EXPECT_FALSE(matchesWhole(c, "-0"));
    EXPECT_FALSE(matchesWhole(c, "07"));
    EXPECT_FALSE(matchesWhole(c, "7.0"));
    EXPECT_FALSE(matchesWhole(c, "7e0"));
  }
}

// [TAG_NUMBER_RANGE] Number bounds: every text the grammar takes is in range (integers exactly,
// and I.F / -I.F whose whole span [I, I + 1) fits), no exponent; what lies outside is refused.
TEST(GrammarSchemas, NumberRangesAcceptOnlyValuesInRange) {
  struct Case {
    const char* bounds;
    double lo, hi;
    bool lo_ex, hi_ex;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const Case cases[] = {
      {R"("minimum":0)", 0, inf, false, false},
      {R"("minimum":-2.5,"maximum":3.25)", -2.5, 3.25, false, false},
      {R"("exclusiveMinimum":0,"exclusiveMaximum":1)", 0, 1, true, true},
      {R"("minimum":-100,"exclusiveMaximum":-1)", -100, -1, false, true},
      {R"("maximum":10)", -inf, 10, false, false},
      {R"("exclusiveMinimum":-3,"exclusiveMaximum":0)", -3, 0, true, true},
  };
  std::mt19937 rng(3);
  for (const Case& k : cases) {
    SCOPED_TRACE(k.bounds);
    auto c = compiled(std::string(R"({"type":"number",)") + k.bounds + "}");
    ASSERT_NE(c, nullptr);
    auto inRange = [&](double v) {
      return (k.lo_ex ? v > k.lo : v >= k.lo) && (k.hi_ex ? v < k.hi : v <= k.hi);
    };
    int accepted = 0;
    for (int i = 0; i < 20000; ++i) {
      // Texts with 0-3 fraction digits between -150 and 150.
      const int64_t whole = static_cast<int64_t>(rng() % 301) - 150;
      const int digits = static_cast<int>(rng() % 4);
      std::string text = std::to_string(whole);
      if (digits > 0) {
        if (whole == 0 && rng() % 2) text = "-0";
        text += ".";
        for (int d = 0; d < digits; ++d) text += static_cast<char>('0' + rng() % 10);
      }
      const double v = std::strtod(text.c_str(), nullptr);
      const bool got = matchesWhole(c, text);
      if (got) {
        ++accepted;
        EXPECT_TRUE(inRange(v)) << text;
      }
      // What the grammar promises: integers in range, and fractions whose unit span fits.
      const double span_lo = text[0] == '-' ? -std::floor(-v) - 1 : std::floor(v);
      // Next to an exclusive integral bound the open span counts (its end is the bound).
      const bool lo_ok = inRange(span_lo) || (k.lo_ex && span_lo == k.lo && v != k.lo);
      const bool hi_ok = inRange(span_lo + 1) || (k.hi_ex && span_lo + 1 == k.hi && v != k.hi);
      const bool span_fits = lo_ok && hi_ok;
      if ((digits == 0 && inRange(v)) || (digits > 0 && span_fits)) {
        EXPECT_TRUE(got) << text;
      }
    }
    EXPECT_GT(accepted, 10);  // (0, 1): only the 0.F texts
    EXPECT_FALSE(matchesWhole(c, "1e1"));
  }
  // Too narrow for what the grammar writes, contradictory, or malformed bounds: 400s naming them.
  for (const char* bad :
       {R"({"type":"number","minimum":0.2,"maximum":0.8})",
        R"({"type":"integer","minimum":5,"maximum":4})",
        R"({"type":"integer","exclusiveMinimum":true,"minimum":1})",
        R"({"type":"number","minimum":"3"})"}) {
    auto e = jsonSchemaGrammar(bad);
    EXPECT_FALSE(e.isOk()) << bad;
    if (!e.isOk()) {
      EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
  // Bounds without a type make it a number.
  auto c = compiled(R"({"minimum":3})");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(matchesWhole(c, "3"));
  EXPECT_TRUE(matchesWhole(c, "4.5"));
  EXPECT_FALSE(matchesWhole(c, "2"));
  EXPECT_FALSE(matchesWhole(c, "\"3\""));
}

TEST(GrammarSchemas, UnsupportedKeywordsAreNamed) {
  auto e = jsonSchemaGrammar(R"({"type":"object","properties":{"age":{"type":"integer","multipleOf":2}}})");
  ASSERT_FALSE(e.isOk());
  EXPECT_NE(e.status().message().find("'multipleOf'"), std::string::npos) << e.status().message();
  EXPECT_NE(e.status().message().find("#/properties/age"), std::string::npos);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  const char* bad[] = {
      R"j({"$ref":"#/$defs/missing"})j",
      R"j({"anyOf":[{"$ref":"#"}]})j",                 // left recursion
      R"j({"type":"string","pattern":"(a"})j",
      R"j({"type":"string","pattern":"a(?=b)"})j",
      R"j({"type":"string","pattern":"(a)\\1"})j",
      R"j({"type":"strin"})j",
      R"j({"type":"array","maxItems":100000})j",
      R"j({"type":"string","maxLength":5000})j",
      R"j({"allOf":[{"type":"string"},{"type":"string"}]})j",
      R"j({"not":{"type":"string"}})j",
      R"j(false)j",
      R"j({"type":"object","properties":{"a":{"type":"string"}},"required":["b"],"additionalProperties":false})j",
      R"j({"type":)j",
      R"j({"$ref":"http://example.com/s.json"})j",
  };
  for (const char* s : bad) {
    auto g = jsonSchemaGrammar(s);
    EXPECT_FALSE(g.isOk()) << s;
    if (!g.isOk()) {
      EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << s;
    }
  }
}

TEST(GrammarSerialize, RoundTripsAndRejectsCorruption) {
  auto g = jsonSchemaGrammar(schemaCases()[16].schema);  // defs_ref
  ASSERT_TRUE(g.isOk());
  const std::string bytes = g->serialize();
  auto back = Grammar::deserialize(bytes);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->hash(), g->hash());
  EXPECT_EQ(back->serialize(), bytes);
  std::mt19937 rng(1);
  for (int i = 0; i < 300; ++i) {
    std::string bad = bytes;
    if (i % 3 == 0) {
      bad.resize(rng() % bad.size());
    } else {
      bad[rng() % bad.size()] = static_cast<char>(rng());
    }
    auto r = Grammar::deserialize(bad);  // must not crash; may happen to stay valid
    if (r.isOk()) {
      EXPECT_GT(r->numStates(), 0);
    }
  }
  EXPECT_FALSE(Grammar::deserialize("").isOk());
}

// The mask from token tables + context checks equals trying every token on the automaton.
TEST(GrammarMask, EqualsBruteForceAlongRandomPaths) {
  const SynthVocab& sv = synthVocab();
  std::mt19937 rng(11);
  for (const SchemaCase& sc : schemaCases()) {
    SCOPED_TRACE(sc.name);
    auto c = compiled(sc.schema);
    ASSERT_NE(c, nullptr);
    for (int run = 0; run < 3; ++run) {
      GrammarMatcher m(c, {sv.end_return, sv.end_end});
      for (int step = 0; step < 60 && !m.terminated(); ++step) {
        const auto allowed = m.allowedTokens();
        std::vector<int32_t> brute;
        for (int32_t id = 0; id < sv.vocab->size(); ++id) {
          if (m.canAcceptToken(id)) brute.push_back(id);
        }
        ASSERT_EQ(allowed, brute) << "step " << step;
        ASSERT_FALSE(allowed.empty()) << "dead end at step " << step;
        ASSERT_TRUE(m.acceptToken(allowed[rng() % allowed.size()]));
      }
    }
  }
}

// [TAG_TABLE_SHARING] Shared tables (states with one signature, within a grammar and across
// grammars through the process-wide cache) and tables built by several threads are exactly the
// tables each state gets alone.
TEST(GrammarTables, SharedAndThreadedTablesEqualPerStateOnes) {
  CompiledGrammar::clearSharedTables();
  int64_t shared_within = 0, shared_across = 0;
  for (const SchemaCase& sc : schemaCases()) {
    SCOPED_TRACE(sc.name);
    auto g = grammarFor(sc.schema);
    ASSERT_TRUE(g.isOk());
    CompileOptions alone;
    alone.share = false;
    alone.threads = 1;
    auto a = CompiledGrammar::compile(*g, synthVocab().vocab, alone);
    CompileOptions shared;  // defaults: share, several threads
    shared.threads = 3;
    auto b = CompiledGrammar::compile(*g, synthVocab().vocab, shared);
    CompileOptions lazy;
    lazy.eager = false;
    auto c = CompiledGrammar::compile(*g, synthVocab().vocab, lazy);
    ASSERT_TRUE(a.isOk() && b.isOk() && c.isOk());
    EXPECT_EQ((*a)->stats().shared, 0);
    for (int32_t s = 0; s < g->numStates(); ++s) {
      const TokenTable* ta = (*a)->table(s);
      for (const TokenTable* tb : {(*b)->table(s), (*c)->table(s)}) {
        ASSERT_EQ(ta == nullptr, tb == nullptr) << "state " << s;
        if (ta == nullptr) continue;
        EXPECT_EQ(ta->complement, tb->complement) << "state " << s;
        EXPECT_EQ(ta->ids, tb->ids) << "state " << s;
        EXPECT_EQ(ta->uncertain, tb->uncertain) << "state " << s;
        EXPECT_EQ(ta->bits, tb->bits) << "state " << s;
      }
    }
    const CompileStats sa = (*a)->stats(), sb = (*b)->stats();
    EXPECT_EQ(sb.states, sa.states);
    EXPECT_EQ(sb.built + sb.shared, sb.states);
    EXPECT_EQ(sb.accepted, sa.accepted);
    EXPECT_EQ(sb.rejected, sa.rejected);
    EXPECT_EQ(sb.uncertain, sa.uncertain);
    // b found every table of its own grammar in the cache only if an identical grammar came
    // before; the lazy compile c, after b, finds all of them there.
    EXPECT_EQ((*c)->stats().built, 0);
    shared_across += sb.shared;
    if (sc.name == "enum_heavy") shared_within = sb.shared;
  }
  EXPECT_GT(shared_within, 100);  // 200 enum values end alike
  EXPECT_GT(shared_across, 100);  // the string rule, numbers, ... of the earlier schemas
}

// The process-wide table cache under concurrent callers (tulip compiles each request's grammar on
// its own thread): four threads compile every schema at once, eagerly with helper threads and
// lazily (tables built on first use, from two threads per grammar), while a fifth empties the
// cache; every table equals the one built alone. Run by the ThreadSanitizer stage.
TEST(GrammarTables, ConcurrentCompilesAndCacheClearsAgree) {
  struct Ref {
    Grammar g;
    std::vector<TokenTable> tables;
    std::vector<bool> has;
  };
  std::vector<Ref> refs;
  for (const SchemaCase& sc : schemaCases()) {
    auto g = grammarFor(sc.schema);
    ASSERT_TRUE(g.isOk()) << sc.name;
    CompileOptions alone;
    alone.share = false;
    alone.threads = 1;
    auto a = CompiledGrammar::compile(*g, synthVocab().vocab, alone);
    ASSERT_TRUE(a.isOk()) << sc.name;
    Ref r{*g, std::vector<TokenTable>(g->numStates()), std::vector<bool>(g->numStates())};
    for (int32_t st = 0; st < g->numStates(); ++st) {
      if (const TokenTable* t = (*a)->table(st)) {
        r.tables[st] = *t;
        r.has[st] = true;
      }
    }
    refs.push_back(std::move(r));
  }
  std::atomic<int> mismatches{0}, failures{0};
  std::atomic<bool> done{false};
  auto check = [&](const Ref& r, const CompiledGrammar& cg, int32_t st) {
    const TokenTable* t = cg.table(st);
    if ((t != nullptr) != r.has[st]) {
      ++mismatches;
      return;
    }
    if (t != nullptr && (t->complement != r.tables[st].complement || t->ids != r.tables[st].ids ||
                         t->uncertain != r.tables[st].uncertain)) {
      ++mismatches;
    }
  };
  std::vector<std::thread> ts;
  for (int c = 0; c < 4; ++c) {
    ts.emplace_back([&, c] {
      for (size_t k = 0; k < refs.size(); ++k) {
        const Ref& r = refs[(k + 7 * c) % refs.size()];  // different orders
        CompileOptions o;
        o.eager = c % 2 == 0;
        o.threads = 2;
        auto cg = CompiledGrammar::compile(r.g, synthVocab().vocab, o);
        if (!cg.isOk()) {
          ++failures;
          continue;
        }
        if (o.eager) {
          for (int32_t st = 0; st < r.g.numStates(); ++st) check(r, **cg, st);
        } else {
          // Lazy: two threads ask for the same states from opposite ends.
          const int32_t n = r.g.numStates();
          std::thread other([&] {
            for (int32_t st = n - 1; st >= 0; --st) check(r, **cg, st);
          });
          for (int32_t st = 0; st < n; ++st) check(r, **cg, st);
          other.join();
        }
      }
    });
  }
  std::thread clearer([&] {
    while (!done.load()) {
      CompiledGrammar::clearSharedTables();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  for (auto& t : ts) t.join();
  done = true;
  clearer.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
}

// Equal signatures exactly for isomorphic reachable automata with the same FOLLOW bytes: the
// string rule of two objects with differently named string properties is equal; a top-level
// string (nothing may follow it) or a length-bounded one is not.
TEST(GrammarTables, SignaturesNameWhatTheTableDependsOn) {
  auto sigsOf = [](const std::string& schema) {
    std::set<std::string> out;
    auto g = grammarFor(schema);
    EXPECT_TRUE(g.isOk());
    for (int32_t s = 0; s < g->numStates(); ++s) {
      if (!g->byteEdges(s).empty()) out.insert(tableSignature(*g, s));
    }
    return out;
  };
  auto object = [](const std::string& key, const std::string& value) {
    return R"({"type":"object","properties":{")" + key + R"(":)" + value + R"(},"required":[")" +
           key + R"("],"additionalProperties":false})";
  };
  const auto a = sigsOf(object("a", R"({"type":"string"})"));
  const auto other_key = sigsOf(object("xyz", R"({"type":"string"})"));
  const auto top = sigsOf(R"({"type":"string"})");
  const auto bounded = sigsOf(object("a", R"({"type":"string","maxLength":3})"));
  auto common = [&](const std::set<std::string>& x) {
    int n = 0;
    for (const auto& s : a) n += x.count(s) ? 1 : 0;
    return n;
  };
  EXPECT_GE(common(other_key), static_cast<int>(top.size()));  // the whole string rule at least
  EXPECT_EQ(common(top), 0);                                   // FOLLOW differs
  EXPECT_LT(common(bounded), common(other_key));               // the bounded string differs
}

TEST(GrammarMask, EndTokensOnlyWhenComplete) {
  const SynthVocab& sv = synthVocab();
  auto c = compiled(R"({"type":"boolean"})");
  GrammarMatcher m(c, {sv.end_return});
  EXPECT_FALSE(m.acceptToken(sv.end_return));
  EXPECT_FALSE(m.acceptToken(sv.end_end));
  ASSERT_TRUE(m.acceptBytes("tru"));
  auto allowed = m.allowedTokens();
  ASSERT_EQ(allowed.size(), 1u);
  EXPECT_EQ(allowed[0], static_cast<int32_t>('e'));
  ASSERT_TRUE(m.acceptToken('e'));
  allowed = m.allowedTokens();
  ASSERT_EQ(allowed, std::vector<int32_t>{sv.end_return});
  EXPECT_TRUE(m.acceptToken(sv.end_return));
  EXPECT_TRUE(m.terminated());
  EXPECT_TRUE(m.allowedTokens().empty());
}

// Random logits through mask-and-sample: every finished output must validate.
std::string generate(const std::shared_ptr<const CompiledGrammar>& c, std::mt19937& rng,
                     const std::vector<int32_t>& ends, int max_steps, bool* finished) {
  GrammarMatcher m(c, ends);
  const Vocabulary& v = c->vocab();
  std::vector<uint32_t> mask(m.maskWords());
  std::normal_distribution<float> normal(0.f, 2.f);
  std::string out;
  for (int step = 0; step < max_steps; ++step) {
    m.fillNextTokenBitmask(mask);
    double total = 0;
    std::vector<std::pair<int32_t, double>> p;
    for (int32_t id = 0; id < v.size(); ++id) {
      const float logit = normal(rng);  // a random "model"
      if (!((mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u)) continue;
      const double e = std::exp(static_cast<double>(logit));
      p.emplace_back(id, e);
      total += e;
    }
    if (p.empty()) break;  // dead end: reported by the caller as unfinished
    double u = std::uniform_real_distribution<double>(0, total)(rng);
    int32_t pick = p.back().first;
    for (const auto& [id, e] : p) {
      if ((u -= e) <= 0) {
        pick = id;
        break;
      }
    }
    if (!m.acceptToken(pick)) break;
    if (m.terminated()) {
      *finished = true;
      return out;
    }
    out += v.bytes(pick);
  }
  *finished = false;
  return out;
}

TEST(GrammarRandom, EveryOutputValidatesSynthetic) {
  const SynthVocab& sv = synthVocab();
  std::mt19937 rng(2024);
  int total = 0, valid = 0;
  for (const SchemaCase& sc : schemaCases()) {
    SCOPED_TRACE(sc.name);
    auto c = compiled(sc.schema);
    ASSERT_NE(c, nullptr);
    SchemaValidator val(sc.schema == "json_object" ? R"({"type":"object"})" : sc.schema);
    ASSERT_TRUE(val.schemaOk());
    int finished_runs = 0;
    for (int run = 0; run < 25; ++run) {
      bool finished = false;
      const std::string out = generate(c, rng, {sv.end_return, sv.end_end}, 4000, &finished);
      if (!finished) continue;
      ++finished_runs;
      const std::string err = val.validate(out);
      valid += err.empty();
      EXPECT_EQ(err, "") << out;
    }
    // Random logits must still reach the end most of the time (only the length cap stops them).
    EXPECT_GE(finished_runs, 20) << "too few outputs finished";
    total += finished_runs;
  }
  std::printf("%d random outputs finished over %zu schemas, %d validated\n", total,
              schemaCases().size(), valid);
}

// Harmony: free until <|channel|> final ... <|message|>, then the grammar until <|return|>; the
// analysis channel and a commentary header stay free; a second final message is constrained
// again.
TEST(ConstrainedDecoder, FinalChannelTrigger) {
  const SynthVocab& sv = synthVocab();
  auto c = compiled(R"({"type":"boolean"})");
  // Stand-ins for the special ids: any excluded ids work; the synthetic vocabulary has two.
  const int32_t kChannel = sv.end_end, kReturn = sv.end_return;
  const int32_t kMessage = 'M', kFinal = 'F', kAnalysis = 'A';  // single-byte ids as header text
  ConstraintSpec spec{kChannel, {kFinal}, kMessage, {kReturn}};
  ConstrainedDecoder d(c, spec);
  EXPECT_FALSE(d.active());
  for (int32_t t : {kChannel, kAnalysis, kMessage, static_cast<int32_t>('z'), kReturn}) {
    EXPECT_TRUE(d.accept(t));
    EXPECT_FALSE(d.active()) << t;  // analysis is free text
  }
  // <|channel|> final <|message|>: constrained from here.
  ASSERT_TRUE(d.accept(kChannel));
  ASSERT_TRUE(d.accept(kFinal));
  EXPECT_FALSE(d.active());
  ASSERT_TRUE(d.accept(' '));  // more header ids ("final <|constrain|>json") are fine
  ASSERT_TRUE(d.accept(kMessage));
  ASSERT_TRUE(d.active());
  std::vector<uint32_t> mask(d.maskWords());
  d.fillMask(mask);
  auto allowedIn = [&](int32_t id) { return (mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u; };
  EXPECT_TRUE(allowedIn('t'));
  EXPECT_FALSE(allowedIn('x'));
  EXPECT_FALSE(allowedIn(kReturn));
  EXPECT_FALSE(d.accept('x'));  // a token outside the mask stops the constraint
  EXPECT_FALSE(d.active());
  // A later final message is constrained again, and completes.
  for (int32_t t : {kChannel, kFinal, kMessage}) ASSERT_TRUE(d.accept(t));
  ASSERT_TRUE(d.active());
  for (char ch : std::string("false")) ASSERT_TRUE(d.accept(ch));
  d.fillMask(mask);
  EXPECT_TRUE(allowedIn(kReturn));
  ASSERT_TRUE(d.accept(kReturn));
  EXPECT_FALSE(d.active());
  EXPECT_EQ(d.completed(), 1);
  // "finalize" is not "final": the prefix must match exactly, id by id.
  ConstrainedDecoder e(c, spec);
  for (int32_t t : {kChannel, static_cast<int32_t>('G'), kMessage}) ASSERT_TRUE(e.accept(t));
  EXPECT_FALSE(e.active());
  // No channel token: constrained from the first token.
  ConstrainedDecoder plain(c, ConstraintSpec{-1, {}, -1, {kReturn}});
  EXPECT_TRUE(plain.active());
}

// ---- Strict function tools [TAG_STRICT_TOOLS] ----
// A vocabulary with Harmony's formatting tokens (excluded, as o200k_harmony's added tokens) and
// header words split the way BPE might split them, on top of the synthetic JSON vocabulary.
struct HarmonyVocab {
  std::shared_ptr<const Vocabulary> vocab;
  HarmonyIds ids;
  std::map<std::string, int32_t> words;  // multi-byte header pieces
};

const HarmonyVocab& harmonyVocab() {
  static const HarmonyVocab k = [] {
    const SynthVocab& sv = synthVocab();
    std::vector<std::string> toks;
    std::vector<uint8_t> excluded;
    for (int32_t id = 0; id < sv.vocab->size(); ++id) {
      toks.emplace_back(sv.vocab->bytes(id));
      excluded.push_back(sv.vocab->eligible(id) ? 0 : 1);
    }
    HarmonyVocab v;
    auto special = [&](const char* text) {
      toks.emplace_back(text);
      excluded.push_back(1);
      return static_cast<int32_t>(toks.size() - 1);
    };
    v.ids.start = special("<|start|>");
    v.ids.channel = special("<|channel|>");
    v.ids.constrain = special("<|constrain|>");
    v.ids.message = special("<|message|>");
    v.ids.end = special("<|end|>");
    v.ids.call = special("<|call|>");
    v.ids.ret = special("<|return|>");
    v.ids.end_of_text = special("<|endoftext|>");
    special("<|reserved_200013|>");
    for (const char* w : {"assistant", "commentary", "analysis", "final", " to", "=", "functions",
                          ".get", "_weather", " json", "json", "=functions.get_weather"}) {
      toks.emplace_back(w);
      excluded.push_back(0);
      v.words[w] = static_cast<int32_t>(toks.size() - 1);
    }
    v.vocab = std::make_shared<Vocabulary>(std::move(toks), excluded);
    return v;
  }();
  return k;
}

std::shared_ptr<const CompiledGrammar> harmonyCompiled(const std::string& schema) {
  auto g = grammarFor(schema);
  EXPECT_TRUE(g.isOk()) << schema << ": " << g.status().message();
  if (!g.isOk()) return nullptr;
  auto c = CompiledGrammar::compile(std::move(g).value(), harmonyVocab().vocab);
  EXPECT_TRUE(c.isOk());
  return c.isOk() ? *c : nullptr;
}

bool maskHas(const std::vector<uint32_t>& mask, int32_t id) {
  return (mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u;
}

// Feeds text one byte-token at a time (header or free text); every token must be accepted.
void feedBytes(ConstrainedDecoder& d, std::string_view text) {
  for (unsigned char c : text) ASSERT_TRUE(d.accept(static_cast<int32_t>(c))) << c;
}

const char kWeatherSchema[] =
    R"({"type":"object","properties":{"city":{"type":"string","enum":["Paris","Oslo"]},)"
    R"("days":{"type":"integer"}},"required":["city","days"],"additionalProperties":false})";
const char kCountSchema[] =
    R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],)"
    R"("additionalProperties":false})";

ConstraintSpec toolSpec(std::vector<int32_t> turn_prefix = {}) {
  const HarmonyVocab& hv = harmonyVocab();
  ConstraintSpec spec;
  spec.end_tokens = {hv.ids.ret};
  spec.tools = {{"get_weather", harmonyCompiled(kWeatherSchema)},
                {"count", harmonyCompiled(kCountSchema)}};
  spec.harmony = hv.ids;
  spec.turn_prefix = std::move(turn_prefix);
  return spec;
}

// Token by token: free text before the call, only schema-valid tokens inside a strict call's
// body (and <|call|> only once the arguments are complete), free again after <|call|>.
TEST(StrictTools, SwitchesIntoTheToolGrammarAndOutAtCall) {
  const HarmonyVocab& hv = harmonyVocab();
  const HarmonyIds& h = hv.ids;
  ConstrainedDecoder d(nullptr, toolSpec());
  std::vector<uint32_t> mask(d.maskWords());
  EXPECT_EQ(d.maskWords(), (static_cast<size_t>(hv.vocab->size()) + 31) / 32);
  // The turn starts in the assistant header: analysis, any text, even JSON-breaking bytes.
  EXPECT_FALSE(d.active());
  ASSERT_TRUE(d.accept(h.channel));
  ASSERT_TRUE(d.accept(hv.words.at("analysis")));
  ASSERT_TRUE(d.accept(h.message));
  EXPECT_FALSE(d.active());
  feedBytes(d, "I should call get_weather. }{ x");
  EXPECT_FALSE(d.active());
  ASSERT_TRUE(d.accept(h.end));
  // <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json, with
  // "functions.get_weather" split over three tokens: still free until <|message|>.
  for (int32_t t : {h.start, hv.words.at("assistant"), h.channel, hv.words.at("commentary"),
                    hv.words.at(" to"), hv.words.at("="), hv.words.at("functions"),
                    hv.words.at(".get"), hv.words.at("_weather"), static_cast<int32_t>(' '),
                    h.constrain, hv.words.at("json")}) {
    ASSERT_TRUE(d.accept(t));
    EXPECT_FALSE(d.active()) << t;
  }
  ASSERT_TRUE(d.accept(h.message));
  ASSERT_TRUE(d.active());
  EXPECT_EQ(d.activeTool(), 0);
  const std::string args = R"({"city":"Oslo","days":3})";
  for (size_t i = 0; i < args.size(); ++i) {
    d.fillMask(mask);
    const auto next = static_cast<int32_t>(static_cast<unsigned char>(args[i]));
    EXPECT_TRUE(maskHas(mask, next)) << "at " << i;
    EXPECT_FALSE(maskHas(mask, h.call)) << "<|call|> before the arguments are complete, at " << i;
    for (int32_t special : {h.end, h.ret, h.start, h.channel, h.message, h.constrain}) {
      EXPECT_FALSE(maskHas(mask, special)) << special;
    }
    if (i == 0) {
      EXPECT_FALSE(maskHas(mask, 'x'));
      EXPECT_FALSE(maskHas(mask, '['));
      EXPECT_FALSE(maskHas(mask, ' '));  // JSON whitespace is allowed, but not before the value
    }
    if (i == 9) {  // after {"city":" only the enum's first letters
      EXPECT_TRUE(maskHas(mask, 'P'));
      EXPECT_FALSE(maskHas(mask, 'L'));
    }
    ASSERT_TRUE(d.accept(next));
    ASSERT_TRUE(d.active());
  }
  d.fillMask(mask);
  EXPECT_TRUE(maskHas(mask, h.call));
  EXPECT_FALSE(maskHas(mask, h.end));
  EXPECT_FALSE(maskHas(mask, h.ret));
  EXPECT_FALSE(maskHas(mask, '}'));
  ASSERT_TRUE(d.accept(h.call));
  EXPECT_FALSE(d.active());
  EXPECT_EQ(d.completed(), 1);
  EXPECT_EQ(d.activeTool(), -1);
  // Free again: a final answer (no response_format here) takes anything.
  ASSERT_TRUE(d.accept(h.start));
  feedBytes(d, "assistant");
  ASSERT_TRUE(d.accept(h.channel));
  ASSERT_TRUE(d.accept(hv.words.at("final")));
  ASSERT_TRUE(d.accept(h.message));
  EXPECT_FALSE(d.active());
  feedBytes(d, "not { json");
  EXPECT_FALSE(d.active());
  ASSERT_TRUE(d.accept(h.ret));
  // The recipient in the role part of the header, and the other strict tool.
  ASSERT_TRUE(d.accept(h.start));
  feedBytes(d, "assistant to=functions.count");
  ASSERT_TRUE(d.accept(h.channel));
  feedBytes(d, "commentary json");
  ASSERT_TRUE(d.accept(h.message));
  ASSERT_TRUE(d.active());
  EXPECT_EQ(d.activeTool(), 1);
  d.fillMask(mask);
  EXPECT_TRUE(maskHas(mask, '{'));
  feedBytes(d, R"({"n":12})");
  ASSERT_TRUE(d.accept(h.call));
  EXPECT_EQ(d.completed(), 2);
}

// Which headers switch: exactly the recipients ivy reports as calls to a strict tool.
TEST(StrictTools, OnlyStrictToolsRecipientsSwitch) {
  const HarmonyVocab& hv = harmonyVocab();
  const HarmonyIds& h = hv.ids;
  struct Case {
    std::string header;  // after <|start|>; "|C|" = <|channel|>, "|J|" = <|constrain|>
    int32_t tool;        // expected activeTool(), -1 = free
  };
  const std::vector<Case> cases = {
      {"assistant|C|commentary to=functions.get_weather |J|json", 0},
      {"assistant|C|commentary to=functions.get_weather|J|json", 0},
      {"assistant|C|analysis to=functions.count", 1},  // any channel: ivy reports the call
      {"assistant to=functions.get_weather|C|commentary", 0},
      {"assistant|C|commentary to=get_weather |J|json", 0},  // a bare declared name is a call
      {"assistant|C|commentary functions.count |J|json", 1},  // "to=" is optional before a type
      {"assistant|C|commentary to=functions.lookup |J|json", -1},  // not a strict tool
      {"assistant|C|commentary to=functions.get_weather_v2 |J|json", -1},
      {"assistant|C|commentary to=functions.Count |J|json", -1},  // names are case-sensitive
      {"assistant|C|commentary to=functions.count to=functions.get_weather", 0},  // the last
      {"assistant|C|commentary to=browser.search", -1},
      {"assistant|C|final", -1},
      {"functions.count to=assistant|C|commentary", -1},  // a tool's message to the assistant
      {"user to=functions.count|C|commentary", -1},  // ivy exposes only the assistant's calls
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    ConstrainedDecoder d(nullptr, toolSpec());
    ASSERT_TRUE(d.accept(h.end));  // leave the turn's first header
    ASSERT_TRUE(d.accept(h.start));
    std::string text = c.header;
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, 3, "|C|") == 0) {
        ASSERT_TRUE(d.accept(h.channel));
        i += 3;
      } else if (text.compare(i, 3, "|J|") == 0) {
        ASSERT_TRUE(d.accept(h.constrain));
        i += 3;
      } else {
        ASSERT_TRUE(d.accept(static_cast<unsigned char>(text[i++])));
      }
      EXPECT_FALSE(d.active());
    }
    ASSERT_TRUE(d.accept(h.message));
    EXPECT_EQ(d.active(), c.tool >= 0);
    EXPECT_EQ(d.activeTool(), c.tool);
  }
}

// A forced tool_choice: the prompt ends in the call's header, so the decoder (given it as the
// turn prefix) is constrained from the first generated token; tokens the mask forbade, were they
// sampled anyway, end the constraint of that body only.
TEST(StrictTools, ForcedPrefixConstrainsFromTheFirstToken) {
  const HarmonyVocab& hv = harmonyVocab();
  const HarmonyIds& h = hv.ids;
  std::vector<int32_t> prefix = {h.channel, hv.words.at("commentary"), hv.words.at(" to"),
                                 hv.words.at("=functions.get_weather"), static_cast<int32_t>(' '),
                                 h.constrain, hv.words.at("json"), h.message};
  ConstrainedDecoder d(nullptr, toolSpec(prefix));
  ASSERT_TRUE(d.active());
  EXPECT_EQ(d.activeTool(), 0);
  std::vector<uint32_t> mask(d.maskWords());
  d.fillMask(mask);
  EXPECT_TRUE(maskHas(mask, '{'));
  EXPECT_FALSE(maskHas(mask, 'I'));
  EXPECT_FALSE(maskHas(mask, h.call));
  EXPECT_FALSE(d.accept('I'));  // outside the mask
  EXPECT_FALSE(d.active());
  EXPECT_TRUE(d.accept('x'));  // the rest of that body is free
  EXPECT_FALSE(d.active());
  ASSERT_TRUE(d.accept(h.call));
  EXPECT_EQ(d.completed(), 0);
  // "required" with several tools: the prefix stops after "to=functions.", the model writes
  // the name.
  ConstrainedDecoder r(nullptr, toolSpec({h.channel, hv.words.at("commentary"), hv.words.at(" to"),
                                          hv.words.at("="), hv.words.at("functions"), '.'}));
  EXPECT_FALSE(r.active());
  feedBytes(r, "count ");
  ASSERT_TRUE(r.accept(h.constrain));
  ASSERT_TRUE(r.accept(hv.words.at("json")));
  ASSERT_TRUE(r.accept(h.message));
  EXPECT_EQ(r.activeTool(), 1);
}

// response_format and strict tools together: the final answer under its grammar, calls under
// theirs; a header longer than ivy's cap is no header (free).
TEST(StrictTools, CombinesWithResponseFormatAndCapsHeaders) {
  const HarmonyVocab& hv = harmonyVocab();
  const HarmonyIds& h = hv.ids;
  auto answer = harmonyCompiled(R"({"type":"boolean"})");
  ConstrainedDecoder d(answer, toolSpec());
  std::vector<uint32_t> mask(d.maskWords());
  ASSERT_TRUE(d.accept(h.channel));
  ASSERT_TRUE(d.accept(hv.words.at("final")));
  ASSERT_TRUE(d.accept(h.message));
  ASSERT_TRUE(d.active());
  EXPECT_EQ(d.activeTool(), -1);
  d.fillMask(mask);
  EXPECT_TRUE(maskHas(mask, 't'));
  EXPECT_FALSE(maskHas(mask, '{'));
  feedBytes(d, "true");
  d.fillMask(mask);
  EXPECT_TRUE(maskHas(mask, h.ret));
  EXPECT_FALSE(maskHas(mask, h.call));
  ASSERT_TRUE(d.accept(h.ret));
  EXPECT_FALSE(d.active());
  ASSERT_TRUE(d.accept(h.start));
  feedBytes(d, "assistant");
  ASSERT_TRUE(d.accept(h.channel));
  feedBytes(d, "commentary to=functions.count");
  ASSERT_TRUE(d.accept(h.message));
  EXPECT_EQ(d.activeTool(), 1);
  d.fillMask(mask);
  EXPECT_TRUE(maskHas(mask, '{'));
  EXPECT_FALSE(maskHas(mask, 't'));
  feedBytes(d, R"({"n":1})");
  ASSERT_TRUE(d.accept(h.call));
  EXPECT_EQ(d.completed(), 2);
  // 257 header tokens, then <|message|>: the header is over the cap, its body free.
  ASSERT_TRUE(d.accept(h.start));
  feedBytes(d, "assistant");
  ASSERT_TRUE(d.accept(h.channel));
  feedBytes(d, "commentary to=functions.count");
  for (int i = 0; i < ConstrainedDecoder::kMaxHeaderTokens; ++i) ASSERT_TRUE(d.accept(' '));
  ASSERT_TRUE(d.accept(h.message));
  EXPECT_FALSE(d.active());
}

// Random logits through the decoder's masks over many schemas: each call's body (every schema
// of the suite as a strict tool's parameters) validates, the free text around it is whatever the
// random model draws (unconstrained it emits garbage, as the last check shows).
TEST(StrictTools, RandomCallsValidateAgainstTheirSchemas) {
  const HarmonyVocab& hv = harmonyVocab();
  const HarmonyIds& h = hv.ids;
  std::vector<std::string_view> bytes;
  for (int32_t id = 0; id < hv.vocab->size(); ++id) bytes.push_back(hv.vocab->bytes(id));
  int finished = 0, total = 0, garbage = 0;
  for (const SchemaCase& sc : schemaCases()) {
    if (sc.schema == "json_object") continue;
    SCOPED_TRACE(sc.name);
    SchemaValidator val(sc.schema);
    ConstraintSpec spec;
    spec.tools = {{"other", harmonyCompiled(kCountSchema)}, {"f", harmonyCompiled(sc.schema)}};
    spec.harmony = h;
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      testing::RandomModel model(bytes, seed * 977 + static_cast<uint64_t>(total), 3.f);
      ConstrainedDecoder d(nullptr, spec);
      std::vector<uint32_t> mask(d.maskWords());
      std::vector<uint32_t> all(d.maskWords(), 0);
      for (int32_t id = 0; id < hv.vocab->size(); ++id) {
        if (hv.vocab->eligible(id)) all[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
      }
      // Free analysis text drawn unmasked, then the call header, then the masked body.
      ASSERT_TRUE(d.accept(h.channel));
      ASSERT_TRUE(d.accept(hv.words.at("analysis")));
      ASSERT_TRUE(d.accept(h.message));
      std::string free_text;
      for (int i = 0; i < 20; ++i) {
        const int32_t t = model.sample(all);
        ASSERT_TRUE(d.accept(t));
        ASSERT_FALSE(d.active());
        free_text += hv.vocab->bytes(t);
      }
      garbage += !val.validate(free_text).empty();
      ASSERT_TRUE(d.accept(h.end));
      ASSERT_TRUE(d.accept(h.start));
      feedBytes(d, "assistant");
      ASSERT_TRUE(d.accept(h.channel));
      feedBytes(d, "commentary to=functions.f ");
      ASSERT_TRUE(d.accept(h.constrain));
      ASSERT_TRUE(d.accept(hv.words.at("json")));
      ASSERT_TRUE(d.accept(h.message));
      ASSERT_EQ(d.activeTool(), 1);
      ++total;
      std::string body;
      bool done = false;
      for (int step = 0; step < 3000 && d.active(); ++step) {
        d.fillMask(mask);
        const int32_t t = model.sample(mask);
        ASSERT_GE(t, 0) << "empty mask after " << body;
        ASSERT_TRUE(d.accept(t));
        if (t == h.call) {
          done = true;
          break;
        }
        ASSERT_TRUE(hv.vocab->eligible(t)) << "a special id inside the body";
        body += hv.vocab->bytes(t);
      }
      if (!done) continue;
      ++finished;
      EXPECT_EQ(val.validate(body), "") << body;
      EXPECT_FALSE(d.active());
      ASSERT_TRUE(d.accept('x'));  // free after <|call|>
      EXPECT_FALSE(d.active());
    }
  }
  EXPECT_GE(finished * 10, total * 9) << finished << " of " << total << " calls finished";
  EXPECT_EQ(garbage, total) << "unmasked random text should never validate";
}

// The header reading tulip's decoder uses (common/harmony_header, which ivy's parser uses too;
// its cases are covered in tests/unit/ivy/harmony): the shapes the decoder relies on.
TEST(StrictTools, HeaderRoute) {
  auto r = parseHarmonyHeaderFields("<|channel|>commentary to=functions.f <|constrain|>json",
                                    "assistant");
  EXPECT_EQ(r.channel, "commentary");
  EXPECT_EQ(r.recipient, "functions.f");
  r = parseHarmonyHeaderFields("assistant to=functions.f<|channel|>commentary json", "");
  EXPECT_EQ(r.channel, "commentary");
  EXPECT_EQ(r.recipient, "functions.f");
  r = parseHarmonyHeaderFields("<|channel|>final", "assistant");
  EXPECT_EQ(r.channel, "final");
  EXPECT_FALSE(r.recipient);
  r = parseHarmonyHeaderFields("mystery", "");  // an unknown role: nothing
  EXPECT_FALSE(r.recipient);
  EXPECT_EQ(harmonyFunctionName("functions.get_weather"), "get_weather");
  EXPECT_EQ(harmonyFunctionName("get_weather"), "get_weather");
  EXPECT_EQ(harmonyFunctionName("functions."), "functions.");
}

}  // namespace
}  // namespace garden::grammar
