#pragma once
// The Split pre-tokenizers of byte-level BPE tokenizer.json files, as hand-written matchers
// that give exactly the pieces Hugging Face `tokenizers` gets from the regex (Oniguruma,
// leftmost alternative with backtracking, "Isolated" behaviour). No regex engine at run time.
// Recognized patterns (the exact strings from the tokenizer.json files):
//   kQwen2: Qwen2/Qwen3  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?..."
//   kO200k: gpt-oss o200k_harmony "[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*..."
// Pure functions; scratch buffers are thread_local.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace garden::ivy {

enum class SplitPattern { kQwen2, kO200k };

// The pattern a tokenizer.json regex string denotes, or nullopt if we have no matcher for it.
std::optional<SplitPattern> recognizeSplitRegex(std::string_view regex);

// Appends to *ends the byte offset where each piece of `text` ends (ascending; the last is
// text.size()). Invalid UTF-8 bytes are treated as one-byte symbols of no class.
void splitPieces(SplitPattern pattern, std::string_view text, std::vector<uint32_t>* ends);

}  // namespace garden::ivy
