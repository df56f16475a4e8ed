#pragma once
// GardenEncoder: the TextEncoder over ivy's own tokenizers (services/ivy/tokenizer: unigram from a
// sentencepiece .model, byte-level BPE from a tokenizer.json). This is what /v1/embeddings uses for
// text; libsentencepiece remains only as the reference in tests and benchmarks. Caller text never
// yields special-token ids. Thread-safe: encode() is const and may run on many threads.

#include <memory>
#include <string>

#include "services/ivy/api/text_encoder.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

class GardenEncoder final : public TextEncoder {
 public:
  explicit GardenEncoder(std::unique_ptr<Tokenizer> tok) : tok_(std::move(tok)) {}
  Result<std::vector<int32_t>> encode(std::string_view text) const override;
  uint32_t vocabSize() const override;
  const Tokenizer& tokenizer() const { return *tok_; }

 private:
  std::unique_ptr<Tokenizer> tok_;
};

// Loads a .model or tokenizer.json (detected by content). NOT_FOUND / INVALID_ARGUMENT naming
// the path on failure.
Result<std::unique_ptr<GardenEncoder>> loadGardenEncoder(const std::string& path);

}  // namespace garden::ivy
