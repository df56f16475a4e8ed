#pragma once
// Unigram tokenizer: sentencepiece's unigram model (the ModelProto of a `.model` file), token
// for token equal to libsentencepiece (tested against it in tests/conformance/tokenizer/).
//
// Encoding: the precompiled normalizer (double-array charsmap: nmt_nfkc, identity, custom),
// whitespace handling (add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces -> U+2581),
// user-defined symbols kept raw and always preferred, Viterbi over the lattice exactly as
// sentencepiece's optimized encoder (same float/double arithmetic and tie-breaking), runs of
// unknown characters merged into one <unk> or, with byte_fallback, split into <0xXX> pieces.
// Control symbols are never produced from text. Decoding follows SentencePieceProcessor::Decode.
//
// Immutable after load; encode/decode are safe from any thread (scratch buffers are
// thread_local).

#include <memory>
#include <string_view>

#include "common/status.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

Result<std::unique_ptr<Tokenizer>> loadSentencePieceModel(std::string_view bytes,
                                                          std::string_view name);

}  // namespace garden::ivy
