#pragma once
// Harmony renderer, layer 2: rendered segments -> token ids. Special segments become their fixed
// ids (tokens.h), checked once against the tokenizer's own table; every text segment goes through
// Tokenizer::encode(), which never yields a special id, so "<|start|>" typed by a caller stays
// text. Any thread (the Tokenizer's const methods are thread-safe).

#include <span>
#include <vector>

#include "common/status.h"
#include "services/ivy/harmony/render.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy::harmony {

// FailedPrecondition if the tokenizer does not map the Harmony formatting tokens to the ids of
// the spec (i.e. it is not o200k_harmony or a compatible fake).
Status checkHarmonyTokenizer(const Tokenizer& tokenizer);

// Appends the ids of `segments` to *out.
void encodeSegments(std::span<const Segment> segments, const Tokenizer& tokenizer,
                    std::vector<TokenId>* out);
std::vector<TokenId> encodeSegments(std::span<const Segment> segments, const Tokenizer& tokenizer);

}  // namespace garden::ivy::harmony
