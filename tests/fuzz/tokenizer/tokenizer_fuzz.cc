// libFuzzer target for ivy's tokenizers: arbitrary bytes must never crash encode, decode or the
// streaming detokenizer, and decode(encode(text)) must give valid UTF-8. The tokenizer file
// comes from GARDEN_FUZZ_TOKENIZER (a sentencepiece .model or a tokenizer.json); the target
// is built once per tokenizer kind by CMake (see CMakeLists.txt).
//
// Input layout: byte 0 picks the mode; the rest is text (encode modes) or little-endian
// 32-bit ids (decode modes, ids taken modulo vocabSize()+8 so invalid ids occur too).

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <simdjson.h>

#include "services/ivy/tokenizer/tokenizer.h"

namespace {

const garden::ivy::Tokenizer* tokenizer() {
  static std::unique_ptr<garden::ivy::Tokenizer> tok = [] {
    const char* path = std::getenv("GARDEN_FUZZ_TOKENIZER");
    if (path == nullptr) {
      std::fprintf(stderr, "set GARDEN_FUZZ_TOKENIZER to a tokenizer file\n");
      std::abort();
    }
    auto r = garden::ivy::loadTokenizer(path);
    if (!r.isOk()) {
      std::fprintf(stderr, "%s\n", r.status().toString().c_str());
      std::abort();
    }
    return std::move(r).value();
  }();
  return tok.get();
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz check failed: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const garden::ivy::Tokenizer& tok = *tokenizer();
  const uint8_t mode = data[0] % 4;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode <= 1) {
    std::vector<garden::ivy::TokenId> ids;
    if (mode == 0) {
      tok.encode(body, &ids);
      for (auto id : ids) check(!tok.isSpecial(id), "encode produced a special id");
    } else {
      tok.encodeAllowingSpecial(body, &ids);
    }
    for (auto id : ids) check(id >= 0 && id < tok.vocabSize(), "id out of range");
    auto text = tok.decode(ids, false);
    check(text.isOk(), "decode of encoded ids failed");
    check(simdjson::validate_utf8(text->data(), text->size()), "decode gave invalid UTF-8");
    return 0;
  }
  std::vector<garden::ivy::TokenId> ids;
  const uint32_t mod = static_cast<uint32_t>(tok.vocabSize()) + 8;
  for (size_t i = 0; i + 4 <= body.size(); i += 4) {
    uint32_t v;
    std::memcpy(&v, body.data() + i, 4);
    ids.push_back(static_cast<garden::ivy::TokenId>(v % mod) - (mode == 3 ? 4 : 0));
  }
  const bool skip = mode == 3;
  auto whole = tok.decode(ids, skip);
  garden::ivy::StreamingDetokenizer stream(tok, skip);
  std::string streamed;
  bool all_valid = true;
  for (auto id : ids) {
    auto piece = stream.push(id);
    if (!piece.isOk()) {
      all_valid = false;
      continue;
    }
    check(simdjson::validate_utf8(piece->data(), piece->size()), "stream emitted broken UTF-8");
    streamed += *piece;
  }
  streamed += stream.finish();
  check(whole.isOk() == all_valid, "decode and stream disagree on validity");
  if (whole.isOk()) {
    check(*whole == streamed, "stream != decode");
    check(simdjson::validate_utf8(whole->data(), whole->size()), "decode gave invalid UTF-8");
  }
  return 0;
}
