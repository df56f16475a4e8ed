// ivy: the HTTP gateway binary. Parses flags, loads the tokenizer, connects to tulip (learning the
// model through ModelInfo in the background; /ready stays 503 until then), serves HTTP, and on
// SIGTERM/SIGINT stops accepting, drains requests in flight and exits 0.

#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics/registry.h"
#include "common/token_file.h"
#include "services/ivy/api/garden_encoder.h"
#include "services/ivy/api/text_encoder.h"
#include "services/ivy/harmony/cli.h"
#include "services/ivy/http/tokenize_routes.h"
#include "services/ivy/tokenizer/cli.h"
#include "services/ivy/balance/replica_pool.h"
#include "services/ivy/balance/tulip_client.h"
#include "services/ivy/api/prompts.h"
#include "services/ivy/http/auth.h"
#include "services/ivy/http/router.h"
#include "services/ivy/http/server.h"
#include "services/ivy/http/service.h"

namespace {

int run(int argc, char** argv) {
  using namespace garden;
  using namespace garden::ivy;

  std::string host = "127.0.0.1";
  uint32_t port = 8080;
  std::vector<std::string> tulip = {"127.0.0.1:50051"};
  std::string tulip_token_file;
  ReplicaPoolOptions pool_options;
  int64_t tulip_resolve_interval_ms = pool_options.resolve_interval.count();
  int64_t tulip_health_interval_ms = pool_options.health_interval.count();
  int64_t tulip_load_interval_ms = pool_options.load_interval.count();
  uint32_t tulip_max_retries = pool_options.max_retries;
  uint64_t split_max_tokens = pool_options.split_max_tokens;
  uint64_t split_max_inputs = pool_options.split_max_inputs;
  std::string tokenizer;
  std::string tokenizer_impl = "garden";
  std::string model_dir;
  std::string served_model_name;
  int32_t threads = 0;
  uint64_t max_body_bytes = 8ull << 20;
  int64_t request_timeout_ms = 30000;
  int64_t generate_timeout_ms = 600000;
  // Gateway API: limits, admission, auth, admin port, prompts, scoring (see http/service.h).
  IvyServiceOptions service_options;
  uint64_t max_inputs = service_options.limits.max_inputs;
  uint64_t max_input_chars = service_options.limits.max_input_chars;
  uint64_t max_input_tokens = service_options.limits.max_input_tokens;
  // 256 Ki tokens, not the library's 1 Mi: a maximum request then takes at most a quarter of one
  // tulip's default queue (--queue-limit-tokens 1 Mi), so it cannot fill a replica alone; OpenAI
  // caps an embeddings request at 300k tokens. tulip batches fairly either way [TAG_EMBED_FAIR].
  uint64_t max_request_tokens = 256u << 10;
  uint64_t max_inflight_requests = service_options.max_inflight_requests;
  uint64_t max_inflight_tokens = service_options.max_inflight_tokens;
  uint64_t responses_store_max = service_options.responses_store_max;
  std::string api_keys_file;
  uint32_t admin_port = 0;
  std::string query_prompt, document_prompt;
  std::string score_yes_token = service_options.score_yes_token;
  std::string score_no_token = service_options.score_no_token;
  std::string log_level = "info";

  Flags flags("ivy", "Garden HTTP gateway: OpenAI-style API in front of a tulip scheduler");
  flags.add("host", &host,
            "address to listen on, for --port and --admin-port (0.0.0.0: every interface)")
      .add("port", &port, "HTTP port (0: an ephemeral port, logged at start)")
      .add("tulip", &tulip,
           "tulip replicas, host:port (repeat or comma-separate); a DNS name (e.g. a Kubernetes "
           "headless Service) is re-resolved and each of its addresses is one replica")
      .add("tulip-token-file", &tulip_token_file,
           "file whose first line is the token sent to tulip as `authorization: Bearer <token>` "
           "(tulip's --auth-token-file); re-read on SIGHUP or when the file changes")
      .add("tulip-resolve-interval-ms", &tulip_resolve_interval_ms,
           "how often DNS names in --tulip are resolved again (0: once at start)")
      .add("tulip-health-interval-ms", &tulip_health_interval_ms,
           "health check period of each healthy tulip replica")
      .add("tulip-load-interval-ms", &tulip_load_interval_ms,
           "Load poll period of each healthy tulip replica (what balancing weighs)")
      .add("tulip-max-retries", &tulip_max_retries,
           "other replicas an embed/score chunk, or a generate stream before its first token, is "
           "sent to after failing UNAVAILABLE")
      .add("split-max-tokens", &split_max_tokens,
           "embed/score requests with more tokens are split into chunks of at most this many, "
           "sent to replicas concurrently (0: no token budget)")
      .add("split-max-inputs", &split_max_inputs,
           "embed/score requests with more inputs are split into chunks of at most this many "
           "(0: no input budget)")
      .add("tokenizer", &tokenizer,
           "tokenizer for text inputs: sentencepiece .model or tokenizer.json (default: "
           "<model-dir>/tokenizer.model, then tokenizer.json; without one only token-id inputs "
           "are accepted)")
      .add("tokenizer-impl", &tokenizer_impl,
           "garden (ours: .model or tokenizer.json) | sentencepiece (libsentencepiece, .model)")
      .add("model-dir", &model_dir, "model directory (for the default --tokenizer)")
      .add("served-model-name", &served_model_name,
           "the model name callers send (default: tulip's model name)")
      .add("threads", &threads, "io threads (0: one per core)")
      .add("max-body-bytes", &max_body_bytes, "largest accepted request body; larger gets 413")
      .add("request-timeout-ms", &request_timeout_ms,
           "deadline of each embeddings / score / rerank request, from its arrival (0: none); a "
           "caller's x-request-timeout header (seconds) can only shorten it")
      .add("generate-timeout-ms", &generate_timeout_ms,
           "deadline of each chat / completions / responses request, streamed or not, from its "
           "arrival (0: none; default 10 minutes, an OpenAI client's own default); "
           "x-request-timeout can only shorten it")
      .add("max-inputs", &max_inputs, "most inputs (or documents) per request; more gets 400")
      .add("max-input-chars", &max_input_chars,
           "most characters per text input, checked before tokenization (0: no limit)")
      .add("max-input-tokens", &max_input_tokens,
           "most tokens per input (0: the model's maximum, which also caps this)")
      .add("max-request-tokens", &max_request_tokens,
           "most tokens of all inputs of one request together (0: no limit)")
      .add("max-inflight-requests", &max_inflight_requests,
           "model requests in flight in this ivy; more get 429 + Retry-After (0: no limit)")
      .add("max-inflight-tokens", &max_inflight_tokens,
           "tokens of model requests in flight in this ivy (a chat / completions choice counts "
           "its prompt + max_tokens); more get 429 (0: no limit)")
      .add("responses-store-max", &responses_store_max,
           "responses kept in memory for /v1/responses' previous_response_id (least recently "
           "used evicted first; 0: none are kept)")
      .add("api-keys-file", &api_keys_file,
           "file of API keys, one per line (# comments); when set every API route needs "
           "`Authorization: Bearer <key>` (re-read on SIGHUP or when the file changes)")
      .add("admin-port", &admin_port,
           "serve /health, /ready and /metrics on this port (no auth) instead of --port (0: on "
           "--port, also without auth)")
      .add("query-prompt", &query_prompt,
           "prompt prefix for input_type \"query\" (default: the model dir's "
           "config_sentence_transformers.json)")
      .add("document-prompt", &document_prompt,
           "prompt prefix for input_type \"document\" (default: as --query-prompt)")
      .add("score-yes-token", &score_yes_token,
           "the token whose logit means relevant in /v1/score and /v1/rerank")
      .add("score-no-token", &score_no_token, "the token whose logit means not relevant")
      .add("log-level", &log_level, "debug | info | warn | error")
      .useEnv("IVY_");
  flags.parseOrExit(argc, argv);

  log::setService("ivy");
  Result<log::Level> level = log::parseLevel(log_level);
  if (!level.isOk()) {
    std::fprintf(stderr, "ivy: --log-level: %s\n", level.status().toString().c_str());
    return 2;
  }
  log::setLevel(*level);
  if (port > 65535) {
    std::fprintf(stderr, "ivy: --port %u is out of range\n", port);
    return 2;
  }
  if (request_timeout_ms < 0) {
    std::fprintf(stderr, "ivy: --request-timeout-ms must be >= 0\n");
    return 2;
  }
  if (generate_timeout_ms < 0) {
    std::fprintf(stderr, "ivy: --generate-timeout-ms must be >= 0\n");
    return 2;
  }
  if (admin_port > 65535 || (admin_port != 0 && admin_port == port)) {
    std::fprintf(stderr, "ivy: --admin-port %u is out of range or equal to --port\n", admin_port);
    return 2;
  }
  if (max_inputs == 0) {
    std::fprintf(stderr, "ivy: --max-inputs must be >= 1\n");
    return 2;
  }
  std::unique_ptr<ApiKeys> api_keys;
  if (!api_keys_file.empty()) {
    auto k = ApiKeys::load(api_keys_file);
    if (!k.isOk()) {
      log::error("cannot load API keys", {{"status", k.status()}});
      return 1;
    }
    api_keys = std::move(k).value();
    log::info("api keys loaded", {{"path", api_keys_file}, {"keys", api_keys->size()}});
  }
  std::shared_ptr<TokenFile> tulip_token;
  if (!tulip_token_file.empty()) {
    auto t = TokenFile::load(tulip_token_file, "--tulip-token-file");
    if (!t.isOk()) {
      log::error("cannot load the tulip token", {{"status", t.status()}});
      return 1;
    }
    tulip_token = std::move(t).value();
  }
  PromptSet prompts;
  if (!model_dir.empty()) {
    auto p = PromptSet::fromModelDir(model_dir);
    if (!p.isOk()) {
      log::error("cannot load prompts", {{"status", p.status()}});
      return 1;
    }
    prompts = std::move(p).value();
  }
  if (!query_prompt.empty()) prompts.set("query", query_prompt);
  if (!document_prompt.empty()) prompts.set("document", document_prompt);
  if (!prompts.prompts().empty()) {
    std::string names;
    for (const auto& [k, v] : prompts.prompts()) names += (names.empty() ? "" : ",") + k;
    log::info("embedding prompts", {{"names", names}, {"default", prompts.defaultName()}});
  }

  if (tokenizer.empty() && !model_dir.empty()) {
    for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
      std::filesystem::path p = std::filesystem::path(model_dir) / name;
      if (std::filesystem::exists(p)) {
        tokenizer = p.string();
        break;
      }
    }
  }
  if (tokenizer_impl != "garden" && tokenizer_impl != "sentencepiece") {
    std::fprintf(stderr, "ivy: --tokenizer-impl must be garden or sentencepiece\n");
    return 2;
  }
  std::unique_ptr<TextEncoder> encoder;
  const Tokenizer* own_tokenizer = nullptr;  // for /tokenize and /detokenize
  if (!tokenizer.empty()) {
    Result<std::unique_ptr<TextEncoder>> e = invalidArgument("unreachable");
    if (tokenizer_impl == "garden") {
      auto g = loadGardenEncoder(tokenizer);
      if (g.isOk()) {
        own_tokenizer = &(*g)->tokenizer();
        e = std::unique_ptr<TextEncoder>(std::move(g).value());
      } else {
        e = g.status();
      }
    } else {
      e = loadSentencePieceEncoder(tokenizer);
    }
    if (!e.isOk()) {
      log::error("cannot load tokenizer", {{"path", tokenizer}, {"status", e.status()}});
      return 1;
    }
    encoder = std::move(e).value();
    log::info("tokenizer loaded", {{"path", tokenizer},
                                   {"impl", tokenizer_impl},
                                   {"vocab_size", encoder->vocabSize()}});
  } else {
    log::warn("no tokenizer: only token-id inputs are accepted", {});
  }

  // SIGINT/SIGTERM are taken by sigwait() below; every thread started from here inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGHUP);  // re-read --api-keys-file and --tulip-token-file
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  // The replica pool is the TulipClient the routes call and the source of the served model.
  auto endpoints = parseTulipEndpoints(tulip);
  if (!endpoints.isOk()) {
    std::fprintf(stderr, "ivy: %s\n", endpoints.status().message().c_str());
    return 2;
  }
  pool_options.served_model_name = served_model_name;
  pool_options.resolve_interval = std::chrono::milliseconds(tulip_resolve_interval_ms);
  pool_options.health_interval = std::chrono::milliseconds(tulip_health_interval_ms);
  pool_options.load_interval = std::chrono::milliseconds(tulip_load_interval_ms);
  pool_options.max_retries = tulip_max_retries;
  pool_options.split_max_tokens = split_max_tokens;
  pool_options.split_max_inputs = split_max_inputs;
  auto pool = ReplicaPool::create(
      std::move(endpoints).value(), pool_options,
      [tulip_token](const std::string& address) { return makeGrpcTulipClient(address, tulip_token); });
  if (!pool.isOk()) {
    std::fprintf(stderr, "ivy: %s\n", pool.status().message().c_str());
    return 2;
  }
  std::unique_ptr<TulipClient> client = std::move(pool).value();
  ReplicaPool* replicas = static_cast<ReplicaPool*>(client.get());
  ModelSource model{[replicas] { return replicas->spec(); },
                    [replicas] { return replicas->ready(); },
                    [replicas] { return replicas->lastProbeError(); }};

  service_options.request_timeout = std::chrono::milliseconds(request_timeout_ms);
  service_options.generate_timeout = std::chrono::milliseconds(generate_timeout_ms);
  service_options.limits.max_inputs = max_inputs;
  service_options.limits.max_input_chars = max_input_chars;
  service_options.limits.max_input_tokens = max_input_tokens;
  service_options.limits.max_request_tokens = max_request_tokens;
  service_options.max_inflight_requests = max_inflight_requests;
  service_options.max_inflight_tokens = max_inflight_tokens;
  service_options.limits.max_inflight_tokens = max_inflight_tokens;
  service_options.responses_store_max = static_cast<size_t>(responses_store_max);
  service_options.prompts = &prompts;
  service_options.tokenizer = own_tokenizer;
  service_options.score_yes_token = score_yes_token;
  service_options.score_no_token = score_no_token;
  service_options.api_keys = api_keys.get();
  IvyService service(service_options, client.get(), model, encoder.get(),
                     &metrics::Registry::global());
  Router router, admin_router;
  service.registerRoutes(&router, admin_port != 0 ? &admin_router : nullptr);
  registerTokenizeRoutes(&router, own_tokenizer, model.spec);

  HttpServerOptions server_options;
  server_options.host = host;
  server_options.port = static_cast<uint16_t>(port);
  server_options.threads = threads;
  server_options.max_body_bytes = max_body_bytes;
  HttpServer server(server_options, &router,
                    [&service](const AccessRecord& r) { service.onRequestDone(r); });
  Status st = server.start();
  if (!st.isOk()) {
    log::error("cannot start http server", {{"status", st}});
    return 1;
  }
  std::unique_ptr<HttpServer> admin_server;
  if (admin_port != 0) {
    HttpServerOptions admin_options;
    admin_options.host = host;
    admin_options.port = static_cast<uint16_t>(admin_port);
    admin_options.threads = 1;
    admin_options.max_body_bytes = 64u << 10;
    admin_server = std::make_unique<HttpServer>(
        admin_options, &admin_router,
        [&service](const AccessRecord& r) { service.onRequestDone(r); });
    st = admin_server->start();
    if (!st.isOk()) {
      log::error("cannot start admin http server", {{"status", st}});
      return 1;
    }
    log::info("admin listening", {{"port", static_cast<uint32_t>(admin_server->port())}});
  }
  replicas->start();
  log::info("listening", {{"host", host},
                          {"port", static_cast<uint32_t>(server.port())},
                          {"tulip", replicas->endpoint()},
                          {"threads", threads},
                          {"max_body_bytes", max_body_bytes}});

  int sig = 0;
  while (sigwait(&sigs, &sig) == 0 && sig == SIGHUP) {
    if (api_keys) (void)api_keys->reload();
    if (tulip_token) (void)tulip_token->reload();
  }
  log::info("stopping", {{"signal", sig}});
  server.stop();
  if (admin_server) admin_server->stop();
  replicas->stop();
  log::info("stopped", {});
  return 0;
}

}  // namespace

// Subcommands: `ivy tokenize --tokenizer PATH` (JSON-lines strings in, id arrays out) and
// `ivy harmony-render` (a chat request in, the rendered ids and text out); otherwise the server.
int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "tokenize")
    return garden::ivy::runTokenizeCli(argc - 1, argv + 1);
  if (argc > 1 && std::string(argv[1]) == "harmony-render")
    return garden::ivy::harmony::runHarmonyRenderCli(argc - 1, argv + 1);
  return run(argc, argv);
}
