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
// The same bytes also go through
//   * parseJsonBody (api/json_body.h) [TAG_JSON_BODY]: an accepted body is an object in which no
//     object repeats a key (checked here by an independent walk with std::set); an object that
//     plain simdjson accepts is refused only when that walk finds a repeated key; jsonPathAt at
//     any offset never fails;
//   * the HTTP framing check (http/framing.h) [TAG_HTTP_FRAMING], as the server uses it: the
//     bytes are parsed as a request head by the Beast parser with the server's limits, and a
//     request with Transfer-Encoding is accepted only when Beast reads its body as chunked, it is
//     HTTP/1.1 and has no Content-Length (so no body can be taken for a second request).

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <boost/beast/http.hpp>
#include <set>
#include <string>
#include <vector>

#include "services/ivy/api/embeddings.h"
#include "services/ivy/api/json_body.h"
#include "services/ivy/api/errors.h"
#include "services/ivy/api/limits.h"
#include "services/ivy/api/score.h"
#include "services/ivy/api/text_encoder.h"
#include "services/ivy/http/framing.h"
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

// True when some object in `e` repeats a key (the oracle for parseJsonBody's check).
bool hasRepeatedKey(simdjson::dom::element e) {
  if (e.type() == simdjson::dom::element_type::OBJECT) {
    std::set<std::string_view> keys;
    simdjson::dom::object obj = e.get_object().value_unsafe();
    for (auto field : obj) {
      if (!keys.insert(field.key).second) return true;
      if (hasRepeatedKey(field.value)) return true;
    }
  } else if (e.type() == simdjson::dom::element_type::ARRAY) {
    simdjson::dom::array arr = e.get_array().value_unsafe();
    for (simdjson::dom::element v : arr) {
      if (hasRepeatedKey(v)) return true;
    }
  }
  return false;
}

void fuzzJsonBody(std::string_view body) {
  thread_local simdjson::dom::parser parser;
  Result<simdjson::dom::element> r = parseJsonBody(body, parser);
  if (r.isOk()) {
    require(r->type() == simdjson::dom::element_type::OBJECT, "accepted body is an object");
    require(!hasRepeatedKey(*r), "accepted body repeats a key");
  } else {
    checkRejection(r.status());
    // An object simdjson parses is refused only for a repeated key (messages may quote the body,
    // so the oracle is the document, not the text of the error).
    thread_local simdjson::dom::parser plain;
    simdjson::dom::element root;
    if (!plain.parse(body.data(), body.size(), true).get(root) &&
        root.type() == simdjson::dom::element_type::OBJECT) {
      require(hasRepeatedKey(root), "a valid object without repeated keys was refused");
    }
  }
  for (size_t off : {size_t{0}, body.size() / 3, body.size() / 2, body.size()}) {
    (void)jsonPathAt(body, off);
  }
}

void fuzzFraming(std::string_view bytes) {
  namespace http = boost::beast::http;
  http::request_parser<http::string_body> p;
  p.header_limit(64u << 10);
  p.body_limit(8u << 20);
  p.eager(false);
  boost::beast::error_code ec;
  std::string_view rest = bytes;
  while (!rest.empty() && !p.is_header_done()) {
    size_t n = p.put(boost::asio::buffer(rest.data(), rest.size()), ec);
    if (ec == http::error::need_more) ec = {};
    if (ec || n == 0) break;
    rest.remove_prefix(n);
  }
  if (ec || !p.is_header_done()) return;  // the server answers these 400 (or waits for more)
  auto& req = p.get();
  std::vector<std::string_view> te;
  for (auto r = req.equal_range(http::field::transfer_encoding); r.first != r.second; ++r.first) {
    te.emplace_back(r.first->value().data(), r.first->value().size());
  }
  const bool has_cl = req.count(http::field::content_length) > 0;
  FramingCheck f = checkRequestFraming(req.version(), te, has_cl, p.chunked());
  if (f.verdict == FramingCheck::Verdict::kOk) {
    require(f.message.empty(), "framing: OK with a message");
    if (!te.empty()) {
      require(p.chunked() && !has_cl && req.version() == 11,
              "framing: Transfer-Encoding accepted without a chunked body");
    } else {
      require(!p.chunked(), "framing: chunked without Transfer-Encoding");
    }
  } else {
    require(!f.message.empty(), "framing: refused without a reason");
    require(!te.empty() || p.chunked(), "framing: refused a request without Transfer-Encoding");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ModelSpec kSpec = spec();
  std::string_view body(reinterpret_cast<const char*>(data), size);
  fuzzFraming(body);
  fuzzJsonBody(body);
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
