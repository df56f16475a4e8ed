// rose: the model worker. Loads a Hugging Face Qwen3 directory onto a backend (cpu or cuda),
// attaches to (or, with --create-shm, creates) the shared-memory channel, announces its model
// facts and serves batches until SIGTERM/SIGINT, or until its owner (tulip) is gone.
//
//   rose --model DIR --shm-name NAME [--device cpu|cuda] [--pooling default|last|mean|cls]
//        [--max-batch-tokens 8192] [--threads N] [--attention default|causal|bidirectional]
//        [--create-shm --depth 4 --input-bytes N --output-bytes N]
//
// Exit codes: 0 clean stop, 1 startup failure (the channel's state is kFailed when it was
// reachable), 2 bad flags.

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/shm/channel.h"
#include "services/rose/engine/engine.h"
#include "services/rose/model/qwen3.h"
#include "services/rose/ops/backend.h"

namespace {

volatile sig_atomic_t g_stop = 0;

void onSignal(int) { g_stop = 1; }

bool processAlive(int32_t pid) {
  if (pid <= 0) return true;  // unknown: do not guess
  return kill(pid, 0) == 0 || errno == EPERM;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace garden;
  std::string model_dir, shm_name, device = "cpu", pooling = "default", attention = "default";
  std::string log_level = "info";
  uint32_t metrics_port = 0;
  int64_t max_batch_tokens = 8192;
  int32_t threads = 0;
  bool create_shm = false;
  uint32_t depth = 4;
  uint64_t input_bytes = 0, output_bytes = 0;

  Flags flags("rose", "Garden model worker: runs a Qwen3 checkpoint for tulip over shared memory");
  flags.add("model", &model_dir, "Hugging Face model directory (config.json + *.safetensors)")
      .add("shm-name", &shm_name,
           "shared-memory channel name (tulip creates it unless --create-shm)")
      .add("device", &device, "backend: cpu or cuda")
      .add("pooling", &pooling,
           "default (from modules.json / 1_Pooling, else last), last, mean, cls")
      .add("attention", &attention,
           "default (config.json is_causal, else causal), causal, bidirectional")
      .add("max-batch-tokens", &max_batch_tokens, "largest batch in tokens (sizes the workspace)")
      .add("threads", &threads, "cpu backend compute threads (0 = all cores)")
      .add("create-shm", &create_shm, "create the channel (sidecar mode: tulip attaches)")
      .add("depth", &depth, "with --create-shm: pipeline depth (slots)")
      .add("input-bytes", &input_bytes,
           "with --create-shm: input arena bytes per slot (0 = from --max-batch-tokens)")
      .add("output-bytes", &output_bytes,
           "with --create-shm: output arena bytes per slot (0 = from the model)")
      .add("metrics-port", &metrics_port, "HTTP port for /metrics and /health (0 = off)")
      .add("log-level", &log_level, "debug, info, warn, error");
  flags.useEnv("ROSE_");
  flags.parseOrExit(argc, argv);
  log::setService("rose");
  if (auto lv = log::parseLevel(log_level); lv.isOk()) {
    log::setLevel(*lv);
  } else {
    std::fprintf(stderr, "rose: --log-level: %s\n", lv.status().message().c_str());
    return 2;
  }
  if (model_dir.empty() || shm_name.empty()) {
    std::fprintf(stderr, "rose: --model and --shm-name are required (see --help)\n");
    return 2;
  }
  if (max_batch_tokens <= 0 || max_batch_tokens > (1 << 24)) {
    std::fprintf(stderr, "rose: --max-batch-tokens must be in [1, 16777216]\n");
    return 2;
  }
  std::optional<rose::PoolMode> pool_override;
  if (pooling != "default") {
    auto pm = rose::parsePoolMode(pooling);
    if (!pm.isOk()) {
      std::fprintf(stderr, "rose: --pooling: %s\n", pm.status().message().c_str());
      return 2;
    }
    pool_override = *pm;
  }
  int causal = -1;
  if (attention == "causal") {
    causal = 1;
  } else if (attention == "bidirectional") {
    causal = 0;
  } else if (attention != "default") {
    std::fprintf(stderr, "rose: --attention must be default, causal or bidirectional\n");
    return 2;
  }

  // Die with the parent (tulip) when spawned by it; sidecars watch nothing but signals.
  const pid_t parent = getppid();
  if (!create_shm) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) return 1;  // the parent died before prctl
  }
  struct sigaction sa = {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Load the model first when creating the channel (its size depends on the model); otherwise
  // attach first so tulip sees kStarting / kFailed.
  std::optional<shm::Channel> channel;
  auto fail = [&](const Status& st, const char* what) {
    log::error(what, {{"error", st}});
    if (channel) channel->setState(shm::WorkerState::kFailed);
    return 1;
  };
  if (!create_shm) {
    auto ch = shm::Channel::attach(shm_name);
    if (!ch.isOk()) return fail(ch.status(), "cannot attach to the shm channel");
    channel.emplace(std::move(ch).value());
    channel->setWorkerPid(static_cast<int32_t>(getpid()));
    channel->setState(shm::WorkerState::kStarting);
  }

  // Heartbeat while loading (large checkpoints take a while).
  std::atomic<bool> loading{true};
  std::thread beater;
  if (channel) {
    beater = std::thread([&] {
      while (loading.load()) {
        channel->beat();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  auto stopBeater = [&] {
    loading = false;
    if (beater.joinable()) beater.join();
  };

  rose::BackendOptions bo;
  bo.threads = threads;
  bo.max_batch_tokens = max_batch_tokens;
  auto backend = rose::makeBackend(device, bo);
  if (!backend.isOk()) {
    stopBeater();
    return fail(backend.status(), "cannot create the backend");
  }
  rose::Qwen3Options mo;
  mo.max_batch_tokens = max_batch_tokens;
  mo.causal = causal;
  mo.pooling_override = pool_override;
  const auto t0 = std::chrono::steady_clock::now();
  auto model = rose::Qwen3Model::load(model_dir, **backend, mo);
  stopBeater();
  if (!model.isOk()) return fail(model.status(), "cannot load the model");
  const auto load_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();

  if (create_shm) {
    shm::Layout layout;
    layout.slots = depth;
    layout.input_bytes =
        input_bytes ? input_bytes : static_cast<uint64_t>(2 * max_batch_tokens + 1) * 4 + 4096;
    layout.output_bytes =
        output_bytes ? output_bytes
                     : static_cast<uint64_t>(max_batch_tokens) * (*model)->hiddenSize() * 4;
    if (depth == 0 || depth > 64) {
      std::fprintf(stderr, "rose: --depth must be in [1, 64]\n");
      return 2;
    }
    auto ch = shm::Channel::create(shm_name, layout);
    if (!ch.isOk()) return fail(ch.status(), "cannot create the shm channel");
    channel.emplace(std::move(ch).value());
  }

  std::string name = std::filesystem::path(model_dir).lexically_normal().filename().string();
  if (name.empty())
    name = std::filesystem::path(model_dir).lexically_normal().parent_path().filename().string();
  rose::EngineOptions eo;
  eo.default_pooling = (*model)->pooling().mode;
  eo.model_name = name;
  auto engine = rose::Engine::create(*channel, **backend, **model, eo);
  if (!engine.isOk()) return fail(engine.status(), "cannot start the engine");
  (*engine)->announceReady();
  log::info("ready", {{"model", model_dir},
                      {"device", device},
                      {"shm", shm_name},
                      {"hidden", (*model)->hiddenSize()},
                      {"layers", (*model)->config().num_hidden_layers},
                      {"pooling", rose::poolModeName(eo.default_pooling)},
                      {"causal", (*model)->causal()},
                      {"score_head", (*model)->hasScoreHead()},
                      {"max_batch_tokens", max_batch_tokens},
                      {"load_ms", static_cast<int64_t>(load_ms)}});

  garden::MetricsHttpServer metrics_http;
  if (metrics_port != 0) {
    Status mst = metrics_http.start("0.0.0.0", static_cast<uint16_t>(metrics_port));
    if (!mst.isOk()) return fail(mst, "cannot serve metrics");
  }

  // Owner liveness: when tulip created the channel, its pid is in the header.
  const int32_t owner = create_shm ? 0 : channel->ownerPid();
  auto last_check = std::chrono::steady_clock::now();
  bool owner_gone = false;
  (*engine)->run([&] {
    if (g_stop) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check >= std::chrono::milliseconds(500)) {
      last_check = now;
      if (!processAlive(owner) || (!create_shm && getppid() != parent)) {
        owner_gone = true;
        return true;
      }
    }
    return false;
  });
  const auto st = (*engine)->stats();
  log::info("stopped", {{"reason", owner_gone ? "owner gone" : "signal"},
                        {"batches_run", st.batches_run},
                        {"batches_rejected", st.batches_rejected}});
  engine->reset();
  return 0;
}
