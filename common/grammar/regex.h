#pragma once
// JSON string content as automata in a GrammarBuilder: one character (any, or from a class) in
// its JSON-encoded form, and a small regular-expression subset for `pattern` / `format`.
//
// Regex subset (ECMA-262 syntax, JSON Schema search semantics: unanchored unless the pattern
// starts with ^ / ends with $): literals (any UTF-8), `.`, classes `[a-z_]` `[^"]` with ASCII
// members, escapes `\d \w \s \D \W \S \. \\ \- \/ \n \t \r` and `\uXXXX` (ASCII),
// groups `( )` `(?: )`, alternation `|`, quantifiers `? * + {m} {m,} {m,n}` (lazy `?` suffix
// accepted, treated as greedy), anchors `^` at the start and `$` at the end only. Not supported
// (an error names them): backreferences, lookaround, non-ASCII class members, anchors inside.
// The text is matched as decoded characters, so the automaton emits the JSON encoding: `"` as
// \", `\` as \\, newline as \n and so on; other characters are written raw (never \u escapes).
//
// Threads: free functions on the caller's builder.

#include <bitset>
#include <cstdint>
#include <string_view>

#include "common/grammar/grammar.h"

namespace garden::grammar {

struct CharClass {
  std::bitset<128> ascii;
  bool non_ascii = false;  // every non-ASCII code point
  static CharClass any();  // every character
};

// Any JSON string character from -> to, every escape form included (\uXXXX too).
void addJsonChar(GrammarBuilder& b, int32_t from, int32_t to);
// A character of `cls` from -> to, in the JSON encoding described above.
void addCharClass(GrammarBuilder& b, int32_t from, int32_t to, const CharClass& cls);
// The UTF-8 encoding of any non-ASCII code point from -> to (well-formed: no overlongs, no
// surrogates, <= U+10FFFF).
void addUtf8NonAscii(GrammarBuilder& b, int32_t from, int32_t to);

// Adds the content automaton of `pattern` after `from`; returns its end state. `max_states`
// bounds the expansion of counted repeats (error past it).
Result<int32_t> addPattern(GrammarBuilder& b, int32_t from, std::string_view pattern,
                           size_t max_states = 20000);

}  // namespace garden::grammar
