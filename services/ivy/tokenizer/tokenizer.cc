#include "services/ivy/tokenizer/tokenizer.h"

#include <fstream>

#include "services/ivy/tokenizer/tokenizer_json.h"
#include "services/ivy/tokenizer/unigram.h"

namespace garden::ivy {

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string out;
  DecodeState state;
  for (TokenId id : ids) {
    if (!decodeStep(id, skip_special, &state, &out)) {
      return invalidArgument("token id " + std::to_string(id) + " is out of range [0, " +
                             std::to_string(vocabSize()) + ")");
    }
  }
  decodeFinish(&state, &out);
  return out;
}

Result<std::string> StreamingDetokenizer::push(TokenId id) {
  std::string out;
  if (!tokenizer_.decodeStep(id, skip_special_, &state_, &out)) {
    return invalidArgument("token id " + std::to_string(id) + " is out of range [0, " +
                           std::to_string(tokenizer_.vocabSize()) + ")");
  }
  return out;
}

std::string StreamingDetokenizer::finish() {
  std::string out;
  tokenizer_.decodeFinish(&state_, &out);
  state_ = Tokenizer::DecodeState();
  return out;
}

Result<std::unique_ptr<Tokenizer>> loadTokenizerFromBytes(std::string_view bytes,
                                                          std::string_view name) {
  size_t i = 0;
  while (i < bytes.size() && (bytes[i] == ' ' || bytes[i] == '\n' || bytes[i] == '\r' ||
                              bytes[i] == '\t')) {
    ++i;
  }
  if (i < bytes.size() && bytes[i] == '{') {
    return loadTokenizerJson(bytes, name);  // parsed once; model.type picks BPE or Unigram
  }
  return loadSentencePieceModel(bytes, name);
}

Result<std::unique_ptr<Tokenizer>> loadTokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return notFound("tokenizer file " + path + " cannot be opened");
  const std::streamoff size = in.tellg();
  if (size < 0) return internalError("reading tokenizer file " + path + " failed");
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), size)) {
    return internalError("reading tokenizer file " + path + " failed");
  }
  return loadTokenizerFromBytes(bytes, path);
}

}  // namespace garden::ivy
