// loadgen: drives tulip (gRPC) or ivy (HTTP) with N closed-loop clients and writes one JSON result
// (schema in bench/README.md). Named workloads come from the suite scripts in bench/suites/; a run
// here is one workload:
//
//   loadgen --protocol grpc --endpoint 127.0.0.1:50051 --mode embed --batch 1 --seq-len 512
//           --concurrency 1 --warmup 50 --count 2000 --out embed_tok512_b1_c1.json
//   loadgen --protocol http --endpoint 127.0.0.1:8080 --input text --seq-len 512
//           --concurrency 8 --duration 20 --out ivy.json
//   loadgen --protocol http --endpoint 127.0.0.1:8080 --mode chat --seq-len 128
//           --max-tokens 256 --concurrency 16 --count 64
//
// Exit status: 0 when the run completed (even with request errors, which the JSON counts by
// status), 1 when it could not run (bad flags exit 2), 3 when --require-ok was given and some
// request failed.
#include <simdjson.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>

#include "bench/loadgen/driver.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/workload.h"
#include "common/flags.h"

using namespace garden;
using namespace garden::bench;

namespace {

struct Options {
  std::string protocol = "grpc", endpoint = "127.0.0.1:50051", mode = "embed", input = "tokens";
  int32_t batch = 1, seq_len = 512, concurrency = 1, channels = 0, pool = 0;  // 0: requestPool()
  uint64_t count = 0, warmup = 20, seed = 1;
  double duration = 0;
  int32_t timeout_ms = 60000;
  std::string model, workload, suite = "adhoc", out, commit, encoding_format = "float";
  int32_t yes_token = -2, no_token = -2, min_token_id = 10, max_token_id = 151643;
  uint32_t max_tokens = 128;
  double text_tolerance = 0.01;
  std::string info_endpoint;
  std::string grpc_api = "sync";
  uint32_t vocab_size = 0;
  bool require_ok = false;
  bool ignore_eos = true;
  std::string response_format = "none";
  std::string response_schema;  // a file
  bool skip_reasoning = false;
  double temperature = -1;
};

// [TAG_TEXT_LENGTH_CALIBRATION] Text inputs for ivy must tokenize to about --seq-len tokens, but
// the loadgen has no tokenizer: each pool text is random common words whose count is corrected by
// probing ivy (one /v1/embeddings request, usage.prompt_tokens) until it is within the tolerance
// (proportional step inside a bracket of known-short and known-long counts, bisection when
// the step leaves it; at most 24 probes; the closest is kept otherwise; a probe refused as too
// long bounds the bracket). The measured per-input
// token counts go into the result's input_tokens. Texts start from the previous text's
// words-per-token ratio, so after the first one a text usually needs one or two probes.
// Chat prompts are calibrated the same way against ivy's /tokenize with a one-message chat, so
// the count is the whole Harmony prompt (system and framing tokens included), i.e. what the chat
// endpoint reports as usage.prompt_tokens.
using TokenCounter = std::function<Result<uint64_t>(const std::string& text)>;

Result<Payload> calibratedText(const Options& o, const TokenCounter& count_tokens, Rng& rng,
                               double& words_per_token) {
  const int32_t target = o.seq_len;
  const int32_t tol = std::max<int32_t>(1, static_cast<int32_t>(target * o.text_tolerance));
  // The first text starts with a short probe (a small vocabulary can split a word into many
  // tokens, and an over-long probe is refused); later texts start from the measured ratio.
  int32_t words =
      words_per_token > 0
          ? std::max<int32_t>(1, static_cast<int32_t>(std::lround(target * words_per_token)))
          : std::min<int32_t>(16, target);
  Rng text_rng = rng;  // the same word sequence for every probe of this text: only the count moves
  std::string best;
  int64_t best_tokens = -1;
  int32_t best_words = 0;
  Status last_error;
  // Bracket the answer: `under` words gave fewer tokens than the target, `over` words gave more
  // (or were refused as too long). The proportional step is used while it stays inside the
  // bracket, bisection otherwise, so this converges even when the target sits at the model's
  // maximum length.
  int32_t under = 0, over = std::numeric_limits<int32_t>::max();
  std::string under_text;  // the longest text measured below the target, and its count
  int64_t under_tokens = -1;
  auto inside = [&](int32_t w) {
    if (w > under && w < over) return w;
    if (over == std::numeric_limits<int32_t>::max()) return std::max(w, under + 1);
    return under + (over - under) / 2;
  };
  for (int probe = 0; probe < 24; ++probe) {
    if (over - under <= 1) break;  // no word count left between the two
    Rng r = text_rng;
    std::string text = randomWords(r, words);
    auto counted = count_tokens(text);
    if (!counted.isOk()) {
      // Too long for the model (HTTP 400): the count is an upper bound; anything else is fatal.
      if (counted.status().message().find("answered 400") == std::string::npos || words == 1)
        return counted.status();
      last_error = counted.status();
      over = words;
      words = inside(words / 2);
      continue;
    }
    int64_t t = static_cast<int64_t>(*counted);
    if (best_tokens < 0 || std::llabs(t - target) < std::llabs(best_tokens - target)) {
      best = text;
      best_tokens = t;
      best_words = words;
    }
    if (std::llabs(t - target) <= tol) break;
    if (t < target) {
      if (words > under) {
        under_text = text;
        under_tokens = t;
      }
      under = std::max(under, words);
    } else {
      over = std::min(over, words);
    }
    words = inside(nextWordCount(words, static_cast<int32_t>(t), target));
  }
  if (best_tokens < 0) return last_error;
  // Fine step: one more word can add several tokens (a small vocabulary splits words), so the
  // bracket may close around the target; pad the longest short text with single letters
  // (about one token each) until it is within the tolerance.
  for (int pad = 0; std::llabs(best_tokens - target) > tol && under_tokens >= 0 &&
                    under_tokens < target - tol && pad < 24;
       ++pad) {
    under_text += " a";
    auto counted = count_tokens(under_text);
    if (!counted.isOk()) break;
    under_tokens = static_cast<int64_t>(*counted);
    if (std::llabs(under_tokens - target) < std::llabs(best_tokens - target)) {
      best = under_text;
      best_tokens = under_tokens;
    }
  }
  rng.discard(1);
  words_per_token = static_cast<double>(best_words) / static_cast<double>(best_tokens);
  Payload p;
  p.text_inputs.push_back(std::move(best));
  p.tokens = static_cast<uint64_t>(best_tokens);
  return p;
}

int runMain(int argc, char** argv) {
  Options o;
  Flags flags("loadgen", "Garden load generator: closed-loop clients against tulip or ivy");
  flags.add("protocol", &o.protocol, "grpc (tulip) or http (ivy)")
      .add("endpoint", &o.endpoint, "HOST:PORT of tulip (grpc) or ivy (http)")
      .add("mode", &o.mode, "embed, score (grpc) or chat (http, SSE streaming)")
      .add("input", &o.input, "tokens (pre-tokenized random ids) or text (random words; http)")
      .add("batch", &o.batch, "inputs per request")
      .add("seq-len", &o.seq_len, "tokens per input (text: the calibration target; chat: prompt)")
      .add("concurrency", &o.concurrency, "closed-loop clients, one request in flight each")
      .add("channels", &o.channels, "gRPC channels (connections); 0 = one per client")
      .add("grpc-api", &o.grpc_api,
           "gRPC client API: sync (a thread per client, blocking calls) or callback (the next "
           "call issued from gRPC's completion callback)")
      .add("count", &o.count, "measured requests in total (0: use --duration)")
      .add("duration", &o.duration, "measured seconds when --count is 0")
      .add("warmup", &o.warmup, "requests before measuring (not recorded)")
      .add("pool", &o.pool,
           "distinct request payloads, cycled (0: chat = one per request, embed/score = 32)")
      .add("seed", &o.seed, "workload PRNG seed")
      .add("timeout-ms", &o.timeout_ms, "per-request deadline")
      .add("model", &o.model, "model name for requests (default: what the server reports)")
      .add("yes-token", &o.yes_token, "score: 'yes' token id (-2 auto, -1 classification head)")
      .add("no-token", &o.no_token, "score: 'no' token id (-2 auto)")
      .add("min-token-id", &o.min_token_id, "smallest random token id")
      .add("max-token-id", &o.max_token_id, "random ids stay below min(this, vocab size)")
      .add("encoding-format", &o.encoding_format, "http embeddings: float or base64")
      .add("max-tokens", &o.max_tokens, "chat: output tokens per request")
      .add("ignore-eos", &o.ignore_eos,
           "chat: ask the server to ignore end-of-sequence ids (every stream --max-tokens long)")
      .add("response-format", &o.response_format,
           "chat: none, json_object or json_schema (structured outputs: every answer constrained "
           "to JSON, or to the schema in --response-schema)")
      .add("response-schema", &o.response_schema,
           "chat, --response-format json_schema: a file holding the JSON Schema")
      .add("skip-reasoning", &o.skip_reasoning,
           "chat: send \"skip_reasoning\": true (gpt-oss answers on the final channel at once, so "
           "--response-format constrains every generated token)")
      .add("temperature", &o.temperature,
           "chat: sampling temperature sent with each request (-1: not sent; 0: greedy, so runs "
           "of the same prompts give the same tokens)")
      .add("text-tolerance", &o.text_tolerance, "text: accepted relative token-count error")
      .add("workload", &o.workload, "workload name (default derived from the shape)")
      .add("suite", &o.suite, "suite name recorded in the result")
      .add("out", &o.out, "result JSON path (default: stdout)")
      .add("commit", &o.commit, "git commit recorded (default $GARDEN_COMMIT)")
      .add("info-endpoint", &o.info_endpoint,
           "http: tulip HOST:PORT to read ModelInfo (vocab, max_seq_len) from")
      .add("vocab-size", &o.vocab_size, "vocabulary size for random ids (0: from ModelInfo)")
      .add("require-ok", &o.require_ok, "exit 3 if any measured request failed");
  flags.parseOrExit(argc, argv);

  auto fail = [](const Status& s) {
    std::fprintf(stderr, "loadgen: %s\n", s.toString().c_str());
    return 1;
  };
  auto usage = [](const std::string& m) {
    std::fprintf(stderr, "loadgen: %s\n", m.c_str());
    return 2;
  };
  auto mode = parseMode(o.mode);
  if (!mode.isOk()) return usage(mode.status().message());
  auto protocol = parseProtocol(o.protocol);
  if (!protocol.isOk()) return usage(protocol.status().message());
  auto input = parseInputKind(o.input);
  if (!input.isOk()) return usage(input.status().message());
  if (*mode == Mode::kChat) *input = InputKind::kText;
  if (o.batch < 1) return usage("--batch must be >= 1");
  if (o.seq_len < 1) return usage("--seq-len must be >= 1");
  if (o.concurrency < 1 || o.concurrency > 4096) return usage("--concurrency must be in [1, 4096]");
  if (o.pool < 0) return usage("--pool must be >= 0");
  o.pool = requestPool(*mode, o.pool, o.count, o.warmup, o.concurrency);
  if (o.count == 0 && !(o.duration > 0)) return usage("give --count N or --duration SECONDS");
  if (o.timeout_ms < 1) return usage("--timeout-ms must be >= 1");
  if (*protocol == Protocol::kGrpc && *input == InputKind::kText)
    return usage("--input text needs --protocol http (tulip takes token ids)");
  if (*protocol == Protocol::kHttp && *mode == Mode::kScore)
    return usage("--mode score needs --protocol grpc");
  if (*mode == Mode::kChat && o.batch != 1) return usage("--mode chat takes --batch 1");
  if (o.response_format != "none" && o.response_format != "json_object" &&
      o.response_format != "json_schema")
    return usage("--response-format must be none, json_object or json_schema");
  std::string schema_text;
  if ((o.response_format == "json_schema") != !o.response_schema.empty())
    return usage("--response-schema goes with --response-format json_schema (and it needs one)");
  if (!o.response_schema.empty()) {
    std::ifstream in(o.response_schema, std::ios::binary);
    if (!in) return usage("--response-schema: cannot read " + o.response_schema);
    schema_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    if (parser.parse(schema_text).get(doc) || !doc.is_object())
      return usage("--response-schema: " + o.response_schema + " is not a JSON object");
    schema_text = simdjson::minify(doc);
  }
  if (o.encoding_format != "float" && o.encoding_format != "base64")
    return usage("--encoding-format must be float or base64");
  if (o.grpc_api != "sync" && o.grpc_api != "callback")
    return usage("--grpc-api must be sync or callback");
  if (o.commit.empty() && std::getenv("GARDEN_COMMIT")) o.commit = std::getenv("GARDEN_COMMIT");
  if (o.commit.empty()) o.commit = "unknown";
  const std::chrono::milliseconds timeout(o.timeout_ms);

  // What is served.
  ServedModel served;
  if (*protocol == Protocol::kGrpc) {
    auto m = grpcModelInfo(o.endpoint, std::chrono::milliseconds(std::max(o.timeout_ms, 10000)));
    if (!m.isOk()) return fail(m.status());
    served = *m;
  } else {
    auto m = httpModelInfo(o.endpoint, timeout);
    if (!m.isOk()) return fail(m.status());
    served = *m;
    if (!o.info_endpoint.empty()) {
      auto info =
          grpcModelInfo(o.info_endpoint, std::chrono::milliseconds(std::max(o.timeout_ms, 10000)));
      if (!info.isOk()) return fail(info.status());
      std::string name = served.name;
      served = *info;
      served.name = name;  // ivy's served name is what HTTP callers send
    }
  }
  if (o.vocab_size) served.vocab_size = o.vocab_size;
  if (*protocol == Protocol::kHttp && *input == InputKind::kTokens && !served.vocab_size)
    return usage("--input tokens over http needs --vocab-size or --info-endpoint (tulip)");
  std::string model = o.model.empty() ? served.name : o.model;
  if (served.max_seq_len && static_cast<uint32_t>(o.seq_len) > served.max_seq_len)
    std::fprintf(stderr,
                 "loadgen: warning: --seq-len %d exceeds the model's max_seq_len %u; "
                 "requests will be rejected\n",
                 o.seq_len, served.max_seq_len);

  int32_t hi = o.max_token_id;
  if (served.vocab_size) hi = std::min<int32_t>(hi, static_cast<int32_t>(served.vocab_size));
  if (*input == InputKind::kTokens && o.min_token_id >= hi)
    return usage("--min-token-id must be below the vocabulary size " + std::to_string(hi));
  int32_t yes = o.yes_token, no = o.no_token;
  if (yes == -2 || no == -2) {
    // A checkpoint with a classification head scores through it; otherwise reranker style with
    // Qwen3-Reranker's "yes"/"no" ids where the vocabulary has them, else two in-range ids.
    if (served.has_score_head) {
      yes = no = -1;
    } else if (hi > 9693) {
      yes = 9693;
      no = 2152;
    } else {
      yes = o.min_token_id;
      no = o.min_token_id + 1;
    }
  }

  // The request pool.
  Rng rng(o.seed);
  std::vector<Payload> pool;
  double words_per_token = 0;  // unknown until the first text is calibrated
  double tmin = 1e300, tmax = 0, tsum = 0;
  uint64_t tn = 0;
  TokenCounter count_tokens = [&](const std::string& text) {
    return httpCountTokens(o.endpoint, model, text, timeout);
  };
  bool calibrate = true;
  if (*mode == Mode::kChat) {
    count_tokens = [&](const std::string& text) {
      return httpCountChatTokens(o.endpoint, model, text, timeout);
    };
    // A server without Harmony /tokenize (another chat format): fall back to the estimate.
    auto probe = count_tokens("hello");
    if (!probe.isOk()) {
      calibrate = false;
      std::fprintf(stderr,
                   "loadgen: warning: cannot count chat prompt tokens through /tokenize (%s); "
                   "prompts are estimated at 0.75 words per token\n",
                   probe.status().toString().c_str());
    }
  }
  for (int32_t i = 0; i < o.pool; ++i) {
    Payload p;
    for (int32_t b = 0; b < o.batch; ++b) {
      if (*input == InputKind::kTokens) {
        p.token_inputs.push_back(randomTokens(rng, o.seq_len, o.min_token_id, hi));
        p.tokens += static_cast<uint64_t>(o.seq_len);
        tmin = std::min<double>(tmin, o.seq_len);
        tmax = std::max<double>(tmax, o.seq_len);
        tsum += o.seq_len;
        ++tn;
      } else if (!calibrate) {
        // The word count is the estimate (0.75 words per token); the server's
        // usage.prompt_tokens is the truth (the driver records it).
        p.text_inputs.push_back(randomWords(rng, std::max(1, static_cast<int>(o.seq_len * 0.75))));
        p.tokens += static_cast<uint64_t>(o.seq_len);
      } else {
        auto t = calibratedText(o, count_tokens, rng, words_per_token);
        if (!t.isOk()) return fail(t.status().withContext("text calibration"));
        double tok = static_cast<double>(t->tokens);
        tmin = std::min(tmin, tok);
        tmax = std::max(tmax, tok);
        tsum += tok;
        ++tn;
        p.text_inputs.push_back(std::move(t->text_inputs[0]));
        p.tokens += t->tokens;
      }
    }
    pool.push_back(std::move(p));
  }

  DriverConfig cfg;
  cfg.mode = *mode;
  cfg.input = *input;
  cfg.endpoint = o.endpoint;
  cfg.model = model;
  cfg.concurrency = o.concurrency;
  cfg.channels = o.channels;
  cfg.grpc_api = o.grpc_api == "callback" ? GrpcApi::kCallback : GrpcApi::kSync;
  cfg.timeout = timeout;
  cfg.yes_token = yes;
  cfg.no_token = no;
  cfg.encoding_format = o.encoding_format;
  cfg.max_tokens = o.max_tokens;
  cfg.ignore_eos = o.ignore_eos;
  cfg.response_format = o.response_format == "none" ? "" : o.response_format;
  cfg.response_schema = schema_text;
  cfg.skip_reasoning = o.skip_reasoning;
  cfg.temperature = o.temperature;
  auto driver = *protocol == Protocol::kGrpc ? makeGrpcDriver(cfg, std::move(pool))
                                             : makeHttpDriver(cfg, std::move(pool));
  if (!driver.isOk()) return fail(driver.status());

  if (o.warmup > 0) {
    auto w = (*driver)->run(PhaseSpec{o.warmup, 0});
    if (!w.isOk()) return fail(w.status());
    if (w->rec.ok == 0)
      std::fprintf(stderr, "loadgen: warning: every warm-up request failed (%s)\n",
                   w->rec.error_samples.empty() ? "?" : w->rec.error_samples[0].c_str());
  }
  auto measured = (*driver)->run(PhaseSpec{o.count, o.count ? 0 : o.duration});
  if (!measured.isOk()) return fail(measured.status());

  RunReport r;
  r.workload = o.workload.empty() ? workloadName(*mode, *input, o.seq_len, o.batch, o.concurrency)
                                  : o.workload;
  r.suite = o.suite;
  r.date = isoNowUtc();
  r.commit = o.commit;
  r.host = describeHost();
  r.flags = {{"protocol", o.protocol},
             {"endpoint", o.endpoint},
             {"mode", o.mode},
             {"input", o.input},
             {"batch", std::to_string(o.batch)},
             {"seq_len", std::to_string(o.seq_len)},
             {"concurrency", std::to_string(o.concurrency)},
             {"channels", std::to_string(o.channels)},
             {"grpc_api", o.grpc_api},
             {"count", std::to_string(o.count)},
             {"duration", std::to_string(o.duration)},
             {"warmup", std::to_string(o.warmup)},
             {"pool", std::to_string(o.pool)},
             {"seed", std::to_string(o.seed)},
             {"timeout_ms", std::to_string(o.timeout_ms)},
             {"model", model},
             {"yes_token", std::to_string(yes)},
             {"no_token", std::to_string(no)},
             {"encoding_format", o.encoding_format},
             {"max_tokens", std::to_string(o.max_tokens)},
             {"ignore_eos", o.ignore_eos ? "true" : "false"},
             {"response_format", o.response_format},
             {"response_schema", o.response_schema},
             {"skip_reasoning", o.skip_reasoning ? "true" : "false"},
             {"temperature", std::to_string(o.temperature)}};
  r.mode = *mode;
  r.protocol = *protocol;
  r.input = *input;
  r.endpoint = o.endpoint;
  r.batch = o.batch;
  r.seq_len = o.seq_len;
  r.concurrency = o.concurrency;
  r.warmup = o.warmup;
  r.count = o.count;
  r.duration_s = o.duration;
  r.model = served;
  r.model.name = model;
  if (tn) {
    r.input_tokens_mean = tsum / static_cast<double>(tn);
    r.input_tokens_min = tmin;
    r.input_tokens_max = tmax;
  } else {
    r.input_tokens_mean = r.input_tokens_min = r.input_tokens_max = o.seq_len;
  }
  r.measured = std::move(*measured);

  std::string json = renderReport(r);
  if (o.out.empty()) {
    std::fwrite(json.data(), 1, json.size(), stdout);
  } else {
    std::ofstream f(o.out);
    f << json;
    if (!f) return fail(internalError("cannot write " + o.out));
  }
  std::fprintf(stderr, "%s\n", summaryLine(r).c_str());
  for (auto& e : r.measured.rec.error_samples) std::fprintf(stderr, "  error: %s\n", e.c_str());
  if (o.require_ok && (r.measured.rec.errors > 0 || r.measured.rec.ok == 0)) return 3;
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return runMain(argc, argv); }
