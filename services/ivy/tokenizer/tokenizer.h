#pragma once
// The tokenizer interface of ivy: text -> token ids -> text, for the two families we serve:
// unigram (a sentencepiece `.model`, or a `tokenizer.json` with a Unigram model) and byte-level
// BPE (a `tokenizer.json` with a BPE model and a ByteLevel decoder, e.g. Qwen3, gpt-oss
// o200k_harmony). Implementations match the reference libraries (libsentencepiece, Hugging Face
// `tokenizers`) token for token; tests/conformance/tokenizer/ shows it.
//
// Special tokens: caller text NEVER produces special-token ids. `encode()` treats "<|start|>"
// typed by a user as ordinary text. Only the chat renderer inserts special tokens, by looking
// their ids up explicitly with `tokenId("<|start|>")`. (`encodeAllowingSpecial()` exists for
// trusted, server-written templates and for the conformance tests; never pass caller text to it.)
// Added tokens that the tokenizer file marks non-special (e.g. Qwen3's "<think>") are matched
// in text exactly as Hugging Face `tokenizers` does.
//
// Threads: a loaded Tokenizer is immutable apart from internal caches that are safe to use
// concurrently; every const method may be called from any number of threads at once. A
// StreamingDetokenizer is per stream, owned by one caller, and must not outlive its Tokenizer.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace garden::ivy {

using TokenId = int32_t;

enum class TokenizerKind { kUnigram, kByteLevelBpe };

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual TokenizerKind kind() const = 0;

  // Appends the ids of caller text to *out. Never produces a special-token id. Never fails:
  // any byte string is accepted (invalid UTF-8 is handled as the reference library does).
  virtual void encode(std::string_view text, std::vector<TokenId>* out) const = 0;
  std::vector<TokenId> encode(std::string_view text) const {
    std::vector<TokenId> ids;
    encode(text, &ids);
    return ids;
  }

  // Like encode(), but special tokens written in `text` become their ids (the reference
  // libraries' default). Only for trusted server-side templates and tests.
  virtual void encodeAllowingSpecial(std::string_view text, std::vector<TokenId>* out) const = 0;

  // Ids -> text, as the reference library's decode. `skip_special` drops special tokens
  // (sentencepiece control symbols are always invisible). An id outside [0, vocabSize()) is an
  // InvalidArgument error naming it (the reference libraries differ here: HF drops it).
  Result<std::string> decode(std::span<const TokenId> ids, bool skip_special) const {
    return decode(ids, skip_special, vocabSize());
  }
  // Ids of a model whose embedding table has more rows than its tokenizer has ids (gpt-oss:
  // 201088 rows; its tokenizer.json names ids 0..200018, the rest of o200k_harmony's reserved
  // range is absent). Hugging Face `tokenizers` has no token for such an id and leaves it out of
  // decode() with skip_special_tokens false and true alike; so does this: an id in
  // [vocabSize(), model_vocab_size) adds nothing. An id outside [0, max(vocabSize(),
  // model_vocab_size)) is an InvalidArgument error naming it.
  Result<std::string> decode(std::span<const TokenId> ids, bool skip_special,
                             int32_t model_vocab_size) const;

  // Number of ids (the largest id + 1, added tokens included).
  virtual int32_t vocabSize() const = 0;

  // The vocabulary piece of an id as written in the tokenizer file (e.g. "▁the", "Ġthe",
  // "<|start|>", "<0x0A>"); nullopt when the id is out of range or unused.
  virtual std::optional<std::string_view> idToPiece(TokenId id) const = 0;
  // The id of a piece written exactly as in the tokenizer file (special tokens included): the
  // renderer's way to get "<|start|>". nullopt when there is no such piece.
  virtual std::optional<TokenId> tokenId(std::string_view piece) const = 0;

  // Special: sentencepiece control symbols (<s>, </s>, ...) and tokenizer.json added tokens
  // marked "special". Never produced by encode().
  virtual bool isSpecial(TokenId id) const = 0;
  // All special ids, ascending.
  virtual std::vector<TokenId> specialIds() const = 0;

  // --- incremental decoding: decode() and StreamingDetokenizer are both built on these two ---
  // State carried between tokens of one decoded sequence. Opaque to callers.
  struct DecodeState {
    std::string pending;   // bytes held back: an incomplete UTF-8 sequence
    size_t tokens = 0;     // tokens seen so far
    size_t emitted = 0;    // bytes of text produced so far
    bool flag0 = false;    // implementation-defined (e.g. sentencepiece's leading-space state)
    bool flag1 = false;
  };
  // Appends to *out the text that token `id` completes; holds incomplete UTF-8 in state.
  // Returns false (changing nothing) for an id outside [0, vocabSize()).
  virtual bool decodeStep(TokenId id, bool skip_special, DecodeState* state,
                          std::string* out) const = 0;
  // Ends a sequence: appends what is still held (invalid bytes become U+FFFD the way the
  // reference library does it).
  virtual void decodeFinish(DecodeState* state, std::string* out) const = 0;
};

// Turns generated ids into text one id at a time. Each push() returns only complete UTF-8:
// bytes of a character split across tokens are held until the character is complete, so a
// broken sequence is never emitted. The concatenation of all push() results plus finish()
// equals Tokenizer::decode() of the whole id sequence (invalid byte sequences become U+FFFD
// exactly as decode() does).
class StreamingDetokenizer {
 public:
  // `model_vocab_size`: as in Tokenizer::decode(), ids in [tokenizer.vocabSize(),
  // model_vocab_size) have no token and add nothing (0: the tokenizer's own size).
  StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special, int32_t model_vocab_size = 0)
      : tokenizer_(tokenizer), skip_special_(skip_special), model_vocab_size_(model_vocab_size) {}

  // Adds one id; returns the text that became complete (possibly empty). An invalid id is an
  // InvalidArgument error and leaves the state unchanged.
  Result<std::string> push(TokenId id);
  // Ends the stream: returns what is still held (an incomplete sequence becomes U+FFFD).
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  int32_t model_vocab_size_;
  Tokenizer::DecodeState state_;
};

// Loads a tokenizer from a file: a sentencepiece `.model` (protobuf) or a Hugging Face
// `tokenizer.json` (Unigram or byte-level BPE), recognized by content. Errors name the file and
// what was wrong (InvalidArgument for malformed/unsupported content, NotFound for a missing file).
Result<std::unique_ptr<Tokenizer>> loadTokenizer(const std::string& path);
// Same, from bytes already in memory (`name` is used in error messages).
Result<std::unique_ptr<Tokenizer>> loadTokenizerFromBytes(std::string_view bytes,
                                                          std::string_view name);

}  // namespace garden::ivy
