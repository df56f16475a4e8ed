#include "services/ivy/http/tokenize_routes.h"

#include <simdjson.h>

#include <algorithm>

#include "common/json_writer.h"
#include "services/ivy/api/errors.h"
#include "services/ivy/api/json_body.h"
#include "services/ivy/harmony/encode.h"
#include "services/ivy/harmony/openai_request.h"
#include "services/ivy/harmony/render.h"
#include "services/ivy/harmony/tokens.h"

namespace garden::ivy {
namespace {

HttpResponse json(std::string body) {
  HttpResponse r;
  r.status = 200;
  r.body = std::move(body);
  return r;
}

// Checks `model` when given. OK when absent or equal to the served name.
Status checkModel(simdjson::dom::element doc, const std::shared_ptr<const ModelSpec>& spec) {
  simdjson::dom::element m;
  if (doc["model"].get(m)) return okStatus();
  std::string_view name;
  if (m.get_string().get(name)) return invalidField("model", "must be a string");
  if (spec && name != spec->served_name) {
    return notFound("model: '" + std::string(name) + "' does not exist (serving '" +
                    spec->served_name + "')");
  }
  return okStatus();
}

Result<std::vector<TokenId>> chatIds(std::string_view body, const Tokenizer& tok) {
  if (Status st = harmony::checkHarmonyTokenizer(tok); !st.isOk()) {
    return invalidField("messages", "chat messages need a Harmony (o200k_harmony) tokenizer; this "
                                    "model's tokenizer is not one: " +
                                        st.message());
  }
  ASSIGN_OR_RETURN(harmony::HarmonyChatRequest req,
                   harmony::harmonyRequestFromOpenAiJson(body, harmony::ChatRenderOptions{}));
  ASSIGN_OR_RETURN(std::vector<harmony::Segment> segs,
                   harmony::renderConversationForCompletion(req.messages, harmony::Role::kAssistant,
                                                            harmony::RenderConfig{}));
  auto prefix = harmony::toolChoicePrefix(req);
  segs.insert(segs.end(), prefix.begin(), prefix.end());
  return harmony::encodeSegments(segs, tok);
}

// The ids /detokenize accepts: [0, this). The model's vocabulary when a replica has told it,
// and for an o200k_harmony tokenizer at least that encoding's 201088 ids (its tokenizer.json names
// only 0..200018); never less than the tokenizer's own.
int32_t detokenizeIdLimit(const Tokenizer& tok, const std::shared_ptr<const ModelSpec>& spec) {
  int32_t limit = tok.vocabSize();
  if (harmony::checkHarmonyTokenizer(tok).isOk()) limit = std::max(limit, harmony::kModelVocabSize);
  if (spec) limit = std::max(limit, static_cast<int32_t>(spec->vocab_size));
  return limit;
}

}  // namespace

void registerTokenizeRoutes(Router* router, const Tokenizer* tokenizer,
                            std::function<std::shared_ptr<const ModelSpec>()> spec_fn) {
  router->add("POST", "/tokenize", [tokenizer, spec_fn](HttpRequest req, Responder respond) {
    if (tokenizer == nullptr)
      return respond(errorResponse(invalidField(
          "text", "this server has no tokenizer configured (start ivy with --tokenizer)")));
    simdjson::dom::parser parser;
    Result<simdjson::dom::element> parsed = parseJsonBody(req.body, parser);  // [TAG_JSON_BODY]
    if (!parsed.isOk()) return respond(errorResponse(parsed.status()));
    simdjson::dom::element doc = *parsed;
    auto spec = spec_fn();
    if (Status st = checkModel(doc, spec); !st.isOk()) return respond(errorResponse(st));
    std::vector<TokenId> ids;
    simdjson::dom::element text, messages;
    const bool has_text = !doc["text"].get(text);
    const bool has_messages = !doc["messages"].get(messages);
    if (has_text == has_messages)
      return respond(errorResponse(
          invalidField("text", "give exactly one of `text` (a string) or `messages` (a chat)")));
    if (has_text) {
      std::string_view t;
      if (text.get_string().get(t)) return respond(errorResponse(invalidField("text", "must be a string")));
      tokenizer->encode(t, &ids);
    } else {
      auto r = chatIds(req.body, *tokenizer);
      if (!r.isOk()) return respond(errorResponse(r.status()));
      ids = std::move(r).value();
    }
    JsonWriter w;
    w.beginObject().field("count", static_cast<uint64_t>(ids.size()));
    w.key("max_model_len");
    if (spec) {
      w.value(static_cast<uint64_t>(spec->max_seq_len));
    } else {
      w.null();
    }
    w.key("tokens").intArray(ids);
    w.endObject();
    respond(json(w.take()));
  });

  router->add("POST", "/detokenize", [tokenizer, spec_fn](HttpRequest req, Responder respond) {
    if (tokenizer == nullptr)
      return respond(errorResponse(invalidField(
          "tokens", "this server has no tokenizer configured (start ivy with --tokenizer)")));
    simdjson::dom::parser parser;
    Result<simdjson::dom::element> parsed = parseJsonBody(req.body, parser);  // [TAG_JSON_BODY]
    if (!parsed.isOk()) return respond(errorResponse(parsed.status()));
    simdjson::dom::element doc = *parsed;
    auto spec = spec_fn();
    if (Status st = checkModel(doc, spec); !st.isOk()) return respond(errorResponse(st));
    const int32_t limit = detokenizeIdLimit(*tokenizer, spec);
    simdjson::dom::array arr;
    if (doc["tokens"].get_array().get(arr))
      return respond(errorResponse(invalidField("tokens", "must be an array of token ids")));
    std::vector<TokenId> ids;
    size_t i = 0;
    for (auto v : arr) {
      int64_t id;
      if (v.get_int64().get(id) || id < 0 || id >= limit) {
        return respond(errorResponse(invalidField(
            "tokens[" + std::to_string(i) + "]",
            "must be a token id in [0, " + std::to_string(limit) + ")")));
      }
      ids.push_back(static_cast<TokenId>(id));
      ++i;
    }
    // As Hugging Face's decode(skip_special_tokens=False): special tokens are their text
    // ("<|reserved_200013|>"), an id the tokenizer does not name is left out.
    auto text = tokenizer->decode(ids, /*skip_special=*/false, limit);
    if (!text.isOk()) return respond(errorResponse(text.status()));
    JsonWriter w;
    w.beginObject().field("prompt", *text).endObject();
    respond(json(w.take()));
  });
}

}  // namespace garden::ivy
