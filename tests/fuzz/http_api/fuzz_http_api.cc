// libFuzzer target over ivy's JSON API layer: an arbitrary body goes through
// parseEmbeddingsRequest → resolveTokens (the real sentencepiece encoder on a tiny model) →
// truncateAndNormalize → renderEmbeddingsResponse, or, when rejected, through toHttpError →
// renderErrorBody. Invariants checked (a violation aborts, which libFuzzer reports):
//   * every rendered body is valid JSON (re-parsed with simdjson);
//   * a success has one `data` entry per input and usage.prompt_tokens = the sum of lengths;
//   * every token id handed on is in [0, vocab) and every input within max_seq_len;
//   * rejections are 400 (with param null or a request field), 404 model_not_found, or the one
//     500 for a tokenizer/model vocabulary mismatch, which this setup can never produce.
// The same body also goes through the gateway parsers (api/limits.h, api/score.h): /v1/score and
// /v1/rerank parsing → the Qwen3-Reranker template on our own tokenizer (the same tiny model) →
// score/rerank rendering, with
//   * every accepted text within --max-input-chars, every rendered pair within the token limits;
//   * the raw pre-scan agreeing with the parsed texts (no accepted text is over the limit);
//   * rerank results sorted by score, at most top_n, indices valid and distinct;
//   * the x-request-timeout parser answering a value in (0, 3600 s] or a 400 naming the header.

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <set>

#include "services/ivy/api/embeddings.h"
#include "services/ivy/api/errors.h"
#include "services/ivy/api/limits.h"
#include "services/ivy/api/score.h"
#include "services/ivy/api/text_encoder.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace {

using namespace garden;
using namespace garden::ivy;

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_http_api invariant failed: %s\n", what);
    std::abort();
  }
}

void requireJson(const std::string& body) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root;
  require(!parser.parse(body).get(root), "rendered body is not valid JSON");
}

const TextEncoder& encoder() {
  static std::unique_ptr<TextEncoder> enc = [] {
    auto r = loadSentencePieceEncoder(GARDEN_FUZZ_SPM_MODEL);
    require(r.isOk(), "cannot load the fuzz tokenizer model");
    return std::move(r).value();
  }();
  return *enc;
}

ModelSpec spec() {
  ModelSpec s;
  s.served_name = "m";
  s.upstream_name = "m-up";
  s.hidden_size = 8;
  s.max_seq_len = 64;
  s.vocab_size = 400;  // the tiny model's vocabulary
  return s;
}

void checkRejection(const Status& st) {
  HttpError e = toHttpError(st);
  require(e.status == 400 || e.status == 404, "rejection is not 400/404");
  if (e.status == 404) require(e.code == "model_not_found", "404 without model_not_found");
  requireJson(renderErrorBody(e));
}

const Tokenizer& tokenizer() {
  static std::unique_ptr<Tokenizer> tok = [] {
    auto r = loadTokenizer(GARDEN_FUZZ_SPM_MODEL);
    require(r.isOk(), "cannot load the fuzz tokenizer model (garden)");
    return std::move(r).value();
  }();
  return *tok;
}

void fuzzGateway(std::string_view body) {
  static const RerankTemplate tmpl(tokenizer());
  ModelSpec s = spec();
  s.max_seq_len = 4096;  // the template alone is ~100 tokens of the tiny model
  RequestLimits limits;
  limits.max_inputs = 16;
  limits.max_input_chars = 200;
  limits.max_request_tokens = 8192;

  auto timeout = parseRequestTimeout(body.substr(0, 40));
  if (timeout.isOk()) {
    if (timeout->has_value()) {
      require(timeout->value().count() > 0 && timeout->value().count() <= 3600000000,
              "timeout range");
    }
  } else {
    HttpError e = toHttpError(timeout.status());
    require(e.status == 400 && e.param == "x-request-timeout", "timeout rejection");
  }

  for (ScoreApi api : {ScoreApi::kScore, ScoreApi::kRerank}) {
    Result<ScoringRequest> req = parseScoringRequest(body, s, limits, api);
    if (!req.isOk()) {
      checkRejection(req.status());
      continue;
    }
    require(longestStringOver(body, limits.max_input_chars) == 0, "pre-scan missed a long text");
    require(!req->documents.empty() && req->documents.size() <= limits.max_inputs, "doc count");
    require(countChars(req->query) <= limits.max_input_chars, "query chars");
    for (const auto& d : req->documents) {
      require(!d.empty() && countChars(d) <= limits.max_input_chars, "document chars");
    }
    auto ids = tmpl.render(*req, s, limits);
    if (!ids.isOk()) {
      checkRejection(ids.status());
      continue;
    }
    require(ids->size() == req->documents.size(), "one pair per document");
    uint64_t total = 0;
    std::vector<float> scores;
    for (const auto& seq : *ids) {
      require(seq.size() > tmpl.prefix().size() + tmpl.suffix().size(), "pair has content");
      require(seq.size() <= s.max_seq_len, "pair length");
      for (int32_t id : seq) require(id >= 0 && uint32_t(id) < s.vocab_size, "pair id in vocab");
      total += seq.size();
      scores.push_back(static_cast<float>(seq.size() % 13) / 13.0f);
    }
    require(total <= limits.max_request_tokens, "request tokens");
    std::string out = api == ScoreApi::kScore
                          ? renderScoreResponse("id", s.served_name, scores, total)
                          : renderRerankResponse("id", s.served_name, *req, scores, total);
    thread_local simdjson::dom::parser parser;
    simdjson::dom::element root;
    require(!parser.parse(out).get(root), "score response is not valid JSON");
    simdjson::dom::array arr;
    if (api == ScoreApi::kScore) {
      require(!root["data"].get(arr) && arr.size() == scores.size(), "one score per document");
    } else {
      require(!root["results"].get(arr), "results");
      size_t want = req->top_n > 0 && req->top_n < scores.size() ? req->top_n : scores.size();
      require(arr.size() == want, "top_n");
      double prev = 2.0;
      std::set<int64_t> seen;
      for (auto x : arr) {
        int64_t i = -1;
        double v = -1;
        require(!x["index"].get(i) && i >= 0 && size_t(i) < scores.size(), "rerank index");
        require(seen.insert(i).second, "rerank index repeated");
        require(!x["relevance_score"].get(v) && v <= prev, "rerank order");
        prev = v;
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ModelSpec kSpec = spec();
  std::string_view body(reinterpret_cast<const char*>(data), size);
  fuzzGateway(body);
  EmbeddingsLimits limits;
  limits.max_inputs = 64;
  Result<EmbeddingsRequest> req = parseEmbeddingsRequest(body, kSpec, limits);
  (void)paramOf(body);
  if (!req.isOk()) {
    checkRejection(req.status());
    return 0;
  }
  require(!req->inputs.empty() && req->inputs.size() <= limits.max_inputs, "input count");
  Result<std::vector<std::vector<int32_t>>> tokens = resolveTokens(*req, &encoder(), kSpec);
  if (!tokens.isOk()) {
    checkRejection(tokens.status());
    return 0;
  }
  require(tokens->size() == req->inputs.size(), "one token list per input");
  uint64_t prompt_tokens = 0;
  std::vector<float> values;
  for (const auto& ids : *tokens) {
    require(!ids.empty() && ids.size() <= kSpec.max_seq_len, "input length");
    for (int32_t id : ids) require(id >= 0 && uint32_t(id) < kSpec.vocab_size, "id in vocab");
    prompt_tokens += ids.size();
    for (uint32_t j = 0; j < kSpec.hidden_size; ++j) {
      values.push_back(static_cast<float>((ids[j % ids.size()] % 17) - 8) / 8.0f);
    }
  }
  size_t dim = kSpec.hidden_size;
  if (req->dimensions != 0) {
    require(req->dimensions >= 1 && req->dimensions <= kSpec.hidden_size, "dimensions range");
    values = truncateAndNormalize(values, dim, req->dimensions);
    dim = req->dimensions;
  }
  std::string out =
      renderEmbeddingsResponse(req->model, values, dim, req->encoding_format, prompt_tokens);
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root;
  require(!parser.parse(out).get(root), "response is not valid JSON");
  simdjson::dom::array arr;
  require(!root["data"].get(arr) && arr.size() == tokens->size(), "one data entry per input");
  uint64_t usage = 0;
  require(!root["usage"]["prompt_tokens"].get(usage) && usage == prompt_tokens, "usage");
  return 0;
}
