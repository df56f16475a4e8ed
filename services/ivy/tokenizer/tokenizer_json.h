#pragma once
// Loading a Hugging Face `tokenizer.json`: the file is parsed once (simdjson) and the document
// handed to the builder its "model"."type" names: BPE (bpe.cc) or Unigram (unigram_json.cc).
// Load-time only.

#include <memory>
#include <string_view>

#include "common/status.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

Result<std::unique_ptr<Tokenizer>> loadTokenizerJson(std::string_view json, std::string_view name);

}  // namespace garden::ivy
