#include "services/ivy/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>

#include "services/ivy/tokenizer/tokenizer_json.h"
#include "services/ivy/tokenizer/unigram.h"

namespace garden::ivy {

namespace {

// One id of a decoded sequence: decodeStep(), except that an id the tokenizer has no token for
// but the model has a row for adds nothing (Hugging Face's decode drops it).
Status decodeModelId(const Tokenizer& tok, TokenId id, bool skip_special, int32_t model_vocab_size,
                     Tokenizer::DecodeState* state, std::string* out) {
  if (tok.decodeStep(id, skip_special, state, out)) return okStatus();
  const int32_t limit = std::max(tok.vocabSize(), model_vocab_size);
  if (id >= 0 && id < limit) return okStatus();
  return invalidArgument("token id " + std::to_string(id) + " is out of range [0, " +
                         std::to_string(limit) + ")");
}

}  // namespace

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids, bool skip_special,
                                      int32_t model_vocab_size) const {
  std::string out;
  DecodeState state;
  for (TokenId id : ids) {
    RETURN_IF_ERROR(decodeModelId(*this, id, skip_special, model_vocab_size, &state, &out));
  }
  decodeFinish(&state, &out);
  return out;
}

Result<std::string> StreamingDetokenizer::push(TokenId id) {
  std::string out;
  RETURN_IF_ERROR(decodeModelId(tokenizer_, id, skip_special_, model_vocab_size_, &state_, &out));
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
