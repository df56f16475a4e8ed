#include "services/ivy/api/score.h"

#include <simdjson.h>

#include <algorithm>
#include <numeric>

#include "common/json_writer.h"
#include "services/ivy/api/errors.h"
#include "services/ivy/api/json_body.h"

namespace garden::ivy {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

std::string indexPath(std::string_view base, size_t i) {
  return std::string(base) + "[" + std::to_string(i) + "]";
}

Result<std::string_view> requiredString(const simdjson::dom::object& obj, std::string_view field,
                                        const RequestLimits& limits) {
  element e;
  if (obj.at_key(field).get(e)) return invalidField(field, "is required");
  std::string_view s;
  if (e.get(s)) return invalidField(field, "must be a string");
  if (s.empty()) return invalidField(field, "must not be an empty string");
  RETURN_IF_ERROR(checkInputChars(s, std::string(field), limits));
  return s;
}

// A rendered pair over the per-input token limit (`over`, naming documents[i]): when the
// template with the instruction alone, or with the query and no document, is already over it,
// that field is named instead, so a long query is not blamed on a document.
Status pairTooLong(const Tokenizer& tok, const std::vector<int32_t>& prefix,
                   const std::vector<int32_t>& suffix, std::string_view instruction,
                   bool instruction_given, std::string_view query, const ModelSpec& spec,
                   const RequestLimits& limits, Status over) {
  auto rendered = [&](std::string_view q) {
    std::vector<int32_t> ids = prefix;
    tok.encode(formatRerankPair(instruction, q, ""), &ids);
    return ids.size() + suffix.size();
  };
  const char* field = nullptr;
  size_t n = 0;
  if (instruction_given && (n = rendered("")) > inputTokenLimit(limits, spec.max_seq_len)) {
    field = "instruction";
  } else if ((n = rendered(query)) > inputTokenLimit(limits, spec.max_seq_len)) {
    field = "query";
  }
  if (field == nullptr) return over;
  Status st = checkInputTokens(n, field, limits, spec.max_seq_len);
  return Status(st.code(), st.message() + " in the scoring template, before any document");
}

}  // namespace

Result<ScoringRequest> parseScoringRequest(std::string_view body, const ModelSpec& spec,
                                           const RequestLimits& limits, ScoreApi api) {
  RETURN_IF_ERROR(checkBodyTextChars(body, "documents", limits));
  thread_local simdjson::dom::parser parser;
  struct Shrink {  // as in parseEmbeddingsRequest
    ~Shrink() {
      if (parser.capacity() > (size_t{1} << 20)) parser = simdjson::dom::parser();
    }
  } shrink;
  ASSIGN_OR_RETURN(element root, parseJsonBody(body, parser));  // [TAG_JSON_BODY]
  simdjson::dom::object obj = root.get_object().value_unsafe();
  ScoringRequest req;

  element model;
  if (obj.at_key("model").get(model)) return invalidField("model", "is required");
  std::string_view m;
  if (model.get(m)) return invalidField("model", "must be a string");
  if (m != spec.served_name) {
    return notFound("model: The model '" + std::string(m) +
                    "' does not exist (this server serves '" + spec.served_name + "')");
  }
  req.model = std::string(m);

  ASSIGN_OR_RETURN(std::string_view query, requiredString(obj, "query", limits));
  req.query = std::string(query);

  element instr;
  if (!obj.at_key("instruction").get(instr) && !instr.is_null()) {
    std::string_view s;
    if (instr.get(s)) return invalidField("instruction", "must be a string");
    RETURN_IF_ERROR(checkInputChars(s, "instruction", limits));
    req.instruction = std::string(s);
  }

  element docs;
  if (obj.at_key("documents").get(docs)) return invalidField("documents", "is required");
  simdjson::dom::array arr;
  if (docs.get(arr)) return invalidField("documents", "must be an array of strings");
  size_t n = arr.size();
  if (n == 0) return invalidField("documents", "must not be an empty array");
  if (n > limits.max_inputs) {
    return invalidField("documents", "has " + std::to_string(n) +
                                         " documents, more than the limit of " +
                                         std::to_string(limits.max_inputs) + " (--max-inputs)");
  }
  req.documents.reserve(n);
  size_t i = 0;
  for (element d : arr) {
    std::string path = indexPath("documents", i++);
    std::string_view s;
    if (d.get(s)) return invalidField(path, "must be a string");
    if (s.empty()) return invalidField(path, "must not be an empty string");
    RETURN_IF_ERROR(checkInputChars(s, path, limits));
    req.documents.emplace_back(s);
  }

  if (api == ScoreApi::kRerank) {
    element top;
    if (!obj.at_key("top_n").get(top) && !top.is_null()) {
      int64_t t = 0;
      if (top.type() != element_type::INT64 || top.get(t) || t < 1) {
        return invalidField("top_n", "must be an integer >= 1");
      }
      req.top_n = static_cast<size_t>(t);
    }
    element rd;
    if (!obj.at_key("return_documents").get(rd) && !rd.is_null()) {
      bool b = false;
      if (rd.get(b)) return invalidField("return_documents", "must be a boolean");
      req.return_documents = b;
    }
  }
  return req;
}

std::string formatRerankPair(std::string_view instruction, std::string_view query,
                             std::string_view doc) {
  std::string s;
  s.reserve(40 + instruction.size() + query.size() + doc.size());
  s += "<Instruct>: ";
  s += instruction;
  s += "\n<Query>: ";
  s += query;
  s += "\n<Document>: ";
  s += doc;
  return s;
}

RerankTemplate::RerankTemplate(const Tokenizer& tok) : tok_(tok) {
  // Server-written template text: special tokens recognized, as the reference does.
  tok.encodeAllowingSpecial(kRerankPrefix, &prefix_);
  tok.encodeAllowingSpecial(kRerankSuffix, &suffix_);
}

Result<std::vector<std::vector<int32_t>>> RerankTemplate::render(
    const ScoringRequest& req, const ModelSpec& spec, const RequestLimits& limits) const {
  std::string_view instruction =
      req.instruction ? std::string_view(*req.instruction) : kRerankDefaultInstruction;
  std::vector<std::vector<int32_t>> out;
  out.reserve(req.documents.size());
  size_t total = 0;
  for (size_t i = 0; i < req.documents.size(); ++i) {
    std::vector<int32_t> ids = prefix_;
    tok_.encode(formatRerankPair(instruction, req.query, req.documents[i]), &ids);
    ids.insert(ids.end(), suffix_.begin(), suffix_.end());
    if (Status st = checkInputTokens(ids.size(), indexPath("documents", i), limits,
                                     spec.max_seq_len);
        !st.isOk()) {
      return pairTooLong(tok_, prefix_, suffix_, instruction, req.instruction.has_value(),
                         req.query, spec, limits, std::move(st));
    }
    for (int32_t id : ids) {
      if (id < 0 || uint32_t(id) >= spec.vocab_size) {
        return internalError("tokenizer produced id " + std::to_string(id) +
                             " outside the model's vocabulary of " +
                             std::to_string(spec.vocab_size) + " (tokenizer/model mismatch)");
      }
    }
    total += ids.size();
    RETURN_IF_ERROR(checkRequestTokens(total, "documents", limits));
    out.push_back(std::move(ids));
  }
  return out;
}

Result<YesNoTokens> resolveYesNoTokens(const Tokenizer& tok, std::string_view yes,
                                       std::string_view no) {
  auto one = [&tok](std::string_view word, const char* flag) -> Result<int32_t> {
    if (auto id = tok.tokenId(word); id && !tok.isSpecial(*id)) return *id;
    std::vector<TokenId> ids = tok.encode(word);
    if (ids.size() == 1) return ids[0];
    return failedPrecondition("scoring needs a single token for \"" + std::string(word) +
                              "\" and this tokenizer has none (it encodes to " +
                              std::to_string(ids.size()) + " tokens); set " + flag);
  };
  YesNoTokens t;
  ASSIGN_OR_RETURN(t.yes, one(yes, "--score-yes-token"));
  ASSIGN_OR_RETURN(t.no, one(no, "--score-no-token"));
  if (t.yes == t.no) {
    return failedPrecondition("--score-yes-token and --score-no-token give the same token id " +
                              std::to_string(t.yes));
  }
  return t;
}

namespace {

void usage(JsonWriter& w, uint64_t prompt_tokens) {
  w.key("usage").beginObject();
  w.field("prompt_tokens", prompt_tokens).field("total_tokens", prompt_tokens);
  w.endObject();
}

}  // namespace

std::string renderScoreResponse(std::string_view id, std::string_view model,
                                std::span<const float> scores, uint64_t prompt_tokens) {
  JsonWriter w;
  w.beginObject().field("id", id).field("object", "list").field("model", model);
  w.key("data").beginArray();
  for (size_t i = 0; i < scores.size(); ++i) {
    w.beginObject().field("object", "score").field("index", i).field("score", scores[i]);
    w.endObject();
  }
  w.endArray();
  usage(w, prompt_tokens);
  w.endObject();
  return w.take();
}

std::string renderRerankResponse(std::string_view id, std::string_view model,
                                 const ScoringRequest& req, std::span<const float> scores,
                                 uint64_t prompt_tokens) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&scores](size_t a, size_t b) { return scores[a] > scores[b]; });
  size_t n = order.size();
  if (req.top_n > 0 && req.top_n < n) n = req.top_n;
  JsonWriter w;
  w.beginObject().field("id", id).field("model", model);
  w.key("results").beginArray();
  for (size_t k = 0; k < n; ++k) {
    size_t i = order[k];
    w.beginObject().field("index", i).field("relevance_score", scores[i]);
    if (req.return_documents && i < req.documents.size()) {
      w.key("document").beginObject().field("text", req.documents[i]).endObject();
    }
    w.endObject();
  }
  w.endArray();
  usage(w, prompt_tokens);
  w.endObject();
  return w.take();
}

}  // namespace garden::ivy
