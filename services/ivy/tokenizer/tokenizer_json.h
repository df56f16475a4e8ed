#pragma once
// Loading a Hugging Face `tokenizer.json` (parsed once with simdjson): dispatches on
// "model"."type" to the BPE loader (bpe.cc) or the Unigram loader (unigram.cc). Load-time only.

#include <memory>
#include <string_view>

#include "common/status.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

Result<std::unique_ptr<Tokenizer>> loadTokenizerJson(std::string_view json, std::string_view name);

}  // namespace garden::ivy
