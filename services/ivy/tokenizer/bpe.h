#pragma once
// Byte-level BPE tokenizer from a Hugging Face `tokenizer.json` (Qwen3, gpt-oss o200k_harmony),
// token for token equal to Hugging Face `tokenizers` (tests/conformance/tokenizer/).
//
// Pipeline: added tokens are split out first (special ones only in encodeAllowingSpecial; the
// non-special ones, e.g. Qwen3's "<think>", always, as HF does); the normalizer (none or NFC);
// the Split pre-tokenizer, whose regex is recognized and run by a hand-written matcher
// (pretokenize.h) with Unicode general categories from a generated table; the byte-level
// mapping; merges by rank (with `ignore_merges` as in HF); a per-thread cache of word -> ids.
// Decoding maps pieces back to bytes and replaces invalid UTF-8 like Rust's from_utf8_lossy.
//
// Immutable after load; safe from any thread (caches and scratch buffers are thread_local).

#include <memory>
#include <string_view>

#include "common/status.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

// See tokenizer_json.h: loadTokenizerJson() parses the file and builds the BPE tokenizer.

}  // namespace garden::ivy
