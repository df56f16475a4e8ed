#pragma once
// Hugging Face `tokenizer.json` files whose model is Unigram (what transformers' SpmConverter
// writes from a sentencepiece model), run exactly as HF `tokenizers` runs them:
// added tokens split first (HF AddedVocabulary: leftmost-longest; `normalized: false` tokens on
// the raw text, `normalized: true` ones on each normalized gap; single_word, lstrip, rstrip as
// HF applies them); per segment the normalizers (Precompiled charsmap applied per extended
// grapheme cluster with HF's shortest-prefix rule, Strip, Replace), the Metaspace pre-tokenizer
// (prepend_scheme always/first/never, split), the Unigram Viterbi (all vocab pieces in the trie,
// unk fusing, byte_fallback) and the decoder: Metaspace, or the ByteFallback chain (Sequence of
// Replace, ByteFallback, Fuse, Strip; a byte run is decoded as a whole, invalid UTF-8 becoming
// one U+FFFD per byte, and the streaming decode holds the run until it ends). Anything else in
// the file is rejected at load with an error naming the field.
// An added token with `normalized: true` (special or not) decodes, and maps back from its id,
// as its content run through the normalizer, as HF tokenizers 0.23 does; others as their
// content.
// Known gap: with prepend_scheme "first", HF decides "start of text" by original offsets; when
// the normalizer deletes the text's leading characters HF does not prepend, we do.
//
// Called by the tokenizer.json loader (tokenizer_json.h), which parses the file once and
// dispatches on model.type. The returned tokenizer is immutable; all methods are safe from any
// thread.

#include <memory>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace simdjson::dom {
class element;
}  // namespace simdjson::dom

namespace garden::ivy {

// Builds the tokenizer from a parsed tokenizer.json whose model.type is "Unigram"; `name` is used
// in error messages.
Result<std::unique_ptr<Tokenizer>> createHfUnigramTokenizer(const simdjson::dom::element& doc,
                                                            std::string_view name);

// Splits valid UTF-8 into extended grapheme clusters (UAX #29 GB3..GB13 and GB999, Unicode
// 15.0 data from grapheme_table.cc; GB9c of 15.1 is not implemented). *out views into `utf8`.
// Exposed for the conformance test against Unicode's GraphemeBreakTest.txt.
void splitGraphemes(std::string_view utf8, std::vector<std::string_view>* out);

}  // namespace garden::ivy
