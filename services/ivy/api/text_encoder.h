#pragma once
// TextEncoder: turns caller text into token ids. ivy's request paths depend only on this interface
// so the tokenizer implementation can be swapped (libsentencepiece, or our own unigram /
// byte-level BPE tokenizers: garden_encoder.h). encode() is const and may be called from many
// threads at once.
//
// SentencePieceEncoder wraps libsentencepiece with a `.model` file. It encodes plain pieces: no BOS
// and no EOS are added (sentencepiece's EncodeAsIds default). Qwen3-Embedding's Hugging Face
// tokenizer also adds no BOS; an EOS appended by a tokenizer.json post-processor is the job of
// the tokenizer.json-based encoder, not of this one. Callers wanting exact control send token ids.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace garden::ivy {

class TextEncoder {
 public:
  virtual ~TextEncoder() = default;
  virtual Result<std::vector<int32_t>> encode(std::string_view text) const = 0;
  virtual uint32_t vocabSize() const = 0;
};

// Loads a sentencepiece model file. NOT_FOUND / INVALID_ARGUMENT naming the path on failure.
Result<std::unique_ptr<TextEncoder>> loadSentencePieceEncoder(const std::string& path);

}  // namespace garden::ivy
