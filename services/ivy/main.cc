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
#include "services/ivy/api/garden_encoder.h"
#include "services/ivy/api/text_encoder.h"
#include "services/ivy/harmony/cli.h"
#include "services/ivy/http/tokenize_routes.h"
#include "services/ivy/tokenizer/cli.h"
#include "services/ivy/balance/tulip_client.h"
#include "services/ivy/balance/tulip_monitor.h"
#include "services/ivy/http/router.h"
#include "services/ivy/http/server.h"
#include "services/ivy/http/service.h"

namespace {

int run(int argc, char** argv) {
  using namespace garden;
  using namespace garden::ivy;

  std::string host = "0.0.0.0";
  uint32_t port = 8080;
  std::string tulip = "127.0.0.1:50051";
  std::string tokenizer;
  std::string tokenizer_impl = "garden";
  std::string model_dir;
  std::string served_model_name;
  int32_t threads = 0;
  uint64_t max_body_bytes = 8ull << 20;
  int64_t request_timeout_ms = 30000;
  std::string log_level = "info";

  Flags flags("ivy", "Garden HTTP gateway: OpenAI-style API in front of a tulip scheduler");
  flags.add("host", &host, "address to listen on")
      .add("port", &port, "HTTP port (0: an ephemeral port, logged at start)")
      .add("tulip", &tulip, "tulip gRPC endpoint host:port")
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
      .add("request-timeout-ms", &request_timeout_ms, "deadline of each tulip call (0: none)")
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
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  std::unique_ptr<TulipClient> client = makeGrpcTulipClient(tulip);
  TulipMonitorOptions monitor_options;
  monitor_options.served_model_name = served_model_name;
  TulipMonitor monitor(client.get(), monitor_options);

  IvyServiceOptions service_options;
  service_options.request_timeout = std::chrono::milliseconds(request_timeout_ms);
  IvyService service(service_options, client.get(), &monitor, encoder.get(),
                     &metrics::Registry::global());
  Router router;
  service.registerRoutes(&router);
  registerTokenizeRoutes(&router, own_tokenizer, [&monitor] { return monitor.spec(); });

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
  monitor.start();
  log::info("listening", {{"host", host},
                          {"port", static_cast<uint32_t>(server.port())},
                          {"tulip", tulip},
                          {"threads", threads},
                          {"max_body_bytes", max_body_bytes}});

  int sig = 0;
  sigwait(&sigs, &sig);
  log::info("stopping", {{"signal", sig}});
  server.stop();
  monitor.stop();
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
