// libFuzzer target for the Harmony parser and renderer. The first input byte picks a mode:
//   0: the rest is a stream of token ids (3 bytes each, mapped onto ordinary byte ids, the
//      Harmony specials, reserved ids and out-of-range ids);
//   1: the rest is text with special tokens spelled out ("<|start|>..."), encoded with specials
//      allowed, so headers are plausible;
//   2: the rest is an OpenAI chat request body: mapped, rendered and encoded.
// Invariants checked (a violation aborts): lenient parsing never fails; strict parsing never
// crashes; every streamed delta is valid UTF-8; the concatenated deltas equal the accumulated
// output; caller text never yields a special id (special ids == special segments).
// Uses the fake tokenizer, so it needs no asset and runs in CI for a bounded time.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "services/ivy/harmony/chat_output.h"
#include "services/ivy/harmony/encode.h"
#include "services/ivy/harmony/openai_request.h"
#include "services/ivy/harmony/parser.h"
#include "services/ivy/harmony/render.h"
#include "tests/fakes/ivy/harmony_fake_tokenizer.h"

namespace {

using namespace garden::ivy;
using namespace garden::ivy::harmony;

const testing::HarmonyFakeTokenizer& tokenizer() {
  static const testing::HarmonyFakeTokenizer tok;
  return tok;
}

void require(bool ok) {
  if (!ok) std::abort();
}

bool validUtf8(const std::string& s) {
  std::string pending = s;
  std::string out;
  testing::HarmonyFakeTokenizer::drain(&pending, false, &out);
  return pending.empty() && out == s;
}

TokenId mapId(uint32_t v) {
  static constexpr TokenId kInteresting[] = {
      kStart,       kEnd,   kMessage, kChannel, kConstrain, kReturn, kCall, kEndOfText,
      kStartOfText, 200013, 201087,   201088,   -1,         173781,  35644, 17196,
      9552,         316,    30000,    12606,    815,        4108,    44580};
  uint32_t kind = v % 4;
  v /= 4;
  if (kind <= 1) return static_cast<TokenId>(v % 256);  // bytes, half the time
  if (kind == 2) return kInteresting[v % (sizeof(kInteresting) / sizeof(kInteresting[0]))];
  return static_cast<TokenId>(v % 202000);  // anything, incl. unknown ids
}

void checkParse(const std::vector<TokenId>& ids, std::optional<Role> role) {
  // Lenient, through the chat decoder.
  ChatOutputOptions options;
  options.function_names = {"get_weather"};
  HarmonyOutputDecoder decoder(tokenizer(), ParserOptions{role, false, 64}, options);
  ChatDelta all;
  for (TokenId id : ids) {
    ChatDelta d = decoder.push(id);
    require(validUtf8(d.content) && validUtf8(d.reasoning_content));
    for (const auto& t : d.tool_calls) require(validUtf8(t.arguments));
    all.append(d);
  }
  all.append(decoder.finish());
  const ChatOutput& out = decoder.output();
  require(all.content == out.content);
  require(all.reasoning_content == out.reasoning_content);
  require(all.tool_calls.size() == out.tool_calls.size());
  for (size_t i = 0; i < out.tool_calls.size(); ++i) {
    require(all.tool_calls[i].arguments == out.tool_calls[i].arguments);
    require(all.tool_calls[i].name == out.tool_calls[i].name);
  }
  require(decoder.parser().state() == StreamParser::State::kExpectStart);

  // Strict: may fail, must not crash.
  (void)parseCompletion(tokenizer(), ids, ParserOptions{role, true, 64});
}

void checkRender(std::string_view body) {
  ChatRenderOptions options;
  auto req = harmonyRequestFromOpenAiJson(body, options);
  if (!req.isOk()) return;
  auto segments = renderConversationForCompletion(req->messages, Role::kAssistant, options.render);
  if (!segments.isOk()) return;
  std::vector<TokenId> ids = encodeSegments(*segments, tokenizer());
  size_t special_segments = 0;
  for (const Segment& s : *segments) special_segments += s.kind == Segment::Kind::kSpecial;
  size_t special_ids = 0;
  for (TokenId id : ids) special_ids += id >= kFirstSpecialId;
  require(special_ids == special_segments);
  require(tokenizer().decodeForTest(ids, false) == segmentsToString(*segments));
  // And what we rendered (without the open "<|start|>assistant") parses back strictly.
  require(ids.size() >= 2);
  ids.resize(ids.size() - 2);
  require(parseCompletion(tokenizer(), ids, ParserOptions{std::nullopt, true, 1 << 20}).isOk());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 3;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (mode) {
    case 0: {
      std::vector<TokenId> ids;
      for (size_t i = 0; i + 3 <= rest.size(); i += 3) {
        uint32_t v = static_cast<uint8_t>(rest[i]) | (static_cast<uint8_t>(rest[i + 1]) << 8) |
                     (static_cast<uint32_t>(static_cast<uint8_t>(rest[i + 2])) << 16);
        ids.push_back(mapId(v));
      }
      checkParse(ids, Role::kAssistant);
      checkParse(ids, std::nullopt);
      break;
    }
    case 1: {
      std::vector<TokenId> ids;
      tokenizer().encodeAllowingSpecial(rest, &ids);
      checkParse(ids, Role::kAssistant);
      checkParse(ids, std::nullopt);
      break;
    }
    case 2:
      checkRender(rest);
      break;
  }
  return 0;
}
