#pragma once
// Shortest round-trip text of a float32, as std::to_chars(first, last, float) writes it (the
// same characters: the shortest digits that parse back to the same float, the closest such when
// several are equally short, ties to even; fixed or scientific notation, whichever is shorter,
// fixed on a tie; "-0" for negative zero), ~15-20 % faster than libstdc++'s to_chars. Used for
// embedding rows in JSON, where formatting 1024 floats per row was ivy's largest own cost.
//
// The digits come from the Schubfach algorithm (R. Giulietti, "The Schubfach way to render
// doubles", 2020), specialised to float32: one 64x64->128-bit multiplication per bound with a
// table of 64-bit approximations of powers of ten, built on first use with exact integer
// arithmetic. Subnormals (never in an embedding) go to std::to_chars. It was compared with
// std::to_chars on every positive float once (bench/results/ivy-hop-2026-12-02.md);
// tests/unit/common/float_chars_test.cc compares every binade's edges, the subnormals near zero
// and ten million random floats; bench/ivy_hop times it.

namespace garden {

// Writes the text of a finite `f` at `out` and returns the end. At most 15 characters
// ("-1.1754944e-38"). NaN and infinities are the caller's business (JSON writes null).
char* writeShortestFloat(char* out, float f);

}  // namespace garden
