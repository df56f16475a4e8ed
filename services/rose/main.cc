// rose: the model worker. Loads a Hugging Face Qwen3 directory onto a backend (cpu or cuda),
// attaches to (or, with --create-shm, creates) the shared-memory channel, announces its model
// facts and serves batches until SIGTERM/SIGINT, or until its owner (tulip) is gone.
//
//   rose --model DIR --shm-name NAME [--device cpu|cuda] [--pooling default|last|mean|cls]
//        [--max-batch-tokens 8192] [--threads N] [--attention default|causal|bidirectional]
//        [--create-shm --depth 4 --input-bytes N --output-bytes N]
//        [--cuda-graphs on|off] [--precapture SEQSxTOKENS,...]   (embedding engine, cuda backend:
//        batches padded to (sequences, tokens) buckets and replayed as CUDA graphs; see engine.h)
//
// A gpt-oss checkpoint (config.json model_type "gpt_oss" / GptOssForCausalLM) is served by the
// LLM path instead (cpu backend only for now): one LlmEngine step per kGenerate batch, with a
// paged KV cache allocated at start:
//        [--kv-block-size 16] [--kv-blocks N | --kv-cache-mb 256] [--max-model-len N]
//        [--max-seqs 256]   (plus --max-batch-tokens, --threads, --create-shm ... as above)
//
// Exit codes: 0 clean stop, 1 startup failure (the channel's state is kFailed when it was
// reachable), 2 bad flags.

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
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
#include "common/shm/llm_batch.h"
#include "services/rose/engine/engine.h"
#include "services/rose/engine/llm_engine.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/model/qwen3.h"
#include "services/rose/ops/backend.h"

namespace {

volatile sig_atomic_t g_stop = 0;

void onSignal(int) { g_stop = 1; }

bool processAlive(int32_t pid) {
  if (pid <= 0) return true;  // unknown: do not guess
  return kill(pid, 0) == 0 || errno == EPERM;
}

// ---- LLM path (gpt-oss) [llm-rose] -------------------------------------------------------------

struct LlmFlags {
  int32_t kv_block_size = 16;
  int64_t kv_blocks = 0;      // 0: from kv_cache_mb
  int64_t kv_cache_mb = 256;  // KV cache budget when kv_blocks is 0
  int64_t max_model_len = 0;  // 0: the model's (max_position_embeddings, at most 131072)
  int32_t max_seqs = 256;     // sequences per step
};

struct LlmServeArgs {
  std::string model_dir, shm_name, device;
  int32_t threads = 0;
  int64_t max_batch_tokens = 0;
  bool create_shm = false;
  uint32_t depth = 4;
  uint64_t input_bytes = 0, output_bytes = 0;
  uint32_t metrics_port = 0;
  std::string metrics_host;
  pid_t parent = 0;
  LlmFlags llm;
};

// Serves a gpt-oss checkpoint: the same lifecycle as the embedding path in main() (attach or
// create the channel, heartbeat while loading, announce, serve until a signal or the owner is
// gone), with an LlmEngine. Returns the process exit code.
int serveLlm(const LlmServeArgs& a) {
  using namespace garden;
  const LlmFlags& f = a.llm;
  if (f.kv_block_size <= 0 || f.kv_block_size > 1024) {
    std::fprintf(stderr, "rose: --kv-block-size must be in [1, 1024]\n");
    return 2;
  }
  if (f.kv_blocks < 0 || f.kv_blocks > INT32_MAX) {
    std::fprintf(stderr, "rose: --kv-blocks must be in [0, 2147483647]\n");
    return 2;
  }
  if (f.kv_blocks == 0 && f.kv_cache_mb <= 0) {
    std::fprintf(stderr, "rose: --kv-cache-mb must be positive when --kv-blocks is 0\n");
    return 2;
  }
  if (f.max_model_len < 0 || f.max_seqs <= 0 || f.max_seqs > 65536) {
    std::fprintf(stderr, "rose: --max-model-len must be >= 0 and --max-seqs in [1, 65536]\n");
    return 2;
  }
  if (a.create_shm && (a.depth == 0 || a.depth > 64)) {
    std::fprintf(stderr, "rose: --depth must be in [1, 64]\n");
    return 2;
  }
  std::optional<shm::Channel> channel;
  auto fail = [&](const Status& st, const char* what) {
    log::error(what, {{"error", st}});
    if (channel) channel->setState(shm::WorkerState::kFailed);
    return 1;
  };
  if (!a.create_shm) {
    auto ch = shm::Channel::attach(a.shm_name);
    if (!ch.isOk()) return fail(ch.status(), "cannot attach to the shm channel");
    channel.emplace(std::move(ch).value());
    channel->setWorkerPid(static_cast<int32_t>(getpid()));
    channel->setState(shm::WorkerState::kStarting);
  }
  if (a.device != "cpu") {
    return fail(unimplemented("--device " + a.device +
                              ": the gpt-oss (llm) path has no CUDA ops yet; run it with "
                              "--device cpu"),
                "cannot serve this checkpoint on this device");
  }
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
  bo.threads = a.threads;
  bo.max_batch_tokens = a.max_batch_tokens;
  auto backend = rose::makeBackend(a.device, bo);
  if (!backend.isOk()) {
    stopBeater();
    return fail(backend.status(), "cannot create the backend");
  }
  auto ops = rose::makeLlmOps(**backend, a.threads);
  if (!ops.isOk()) {
    stopBeater();
    return fail(ops.status(), "cannot create the llm ops");
  }
  rose::GptOssOptions go;
  go.max_batch_tokens = a.max_batch_tokens;
  go.max_seqs = f.max_seqs;
  go.max_logits_rows = f.max_seqs;  // logits never leave rose: one sampled row per sequence
  go.max_model_len = f.max_model_len;
  go.min_block_size = f.kv_block_size;
  const auto t0 = std::chrono::steady_clock::now();
  auto model = rose::GptOssModel::load(a.model_dir, **backend, **ops, go);
  stopBeater();
  if (!model.isOk()) return fail(model.status(), "cannot load the model");
  auto eos = rose::loadEosIds(a.model_dir);
  if (!eos.isOk()) return fail(eos.status(), "cannot read the model's eos ids");
  const auto load_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  int64_t kv_blocks = f.kv_blocks;
  const rose::KvCacheShape one = (*model)->kvShape(1, f.kv_block_size);
  const int64_t block_bytes = 2 * one.elementsPerLayer() * one.num_layers *
                              static_cast<int64_t>(dtypeSize((*model)->kvDType()));
  if (kv_blocks == 0) {
    kv_blocks = std::min<int64_t>((f.kv_cache_mb << 20) / block_bytes, INT32_MAX);
    if (kv_blocks == 0) {
      return fail(
          invalidArgument("--kv-cache-mb " + std::to_string(f.kv_cache_mb) +
                          " holds no KV block (" + std::to_string(block_bytes) + " bytes each)"),
          "cannot size the kv cache");
    }
  }

  if (a.create_shm) {
    const int64_t max_len = (*model)->maxModelLen();
    shm::Layout layout;
    layout.slots = a.depth;
    layout.input_bytes =
        a.input_bytes
            ? a.input_bytes
            : shm::llmStepBytes(
                  static_cast<uint64_t>(f.max_seqs), static_cast<uint64_t>(a.max_batch_tokens),
                  static_cast<uint64_t>(f.max_seqs) *
                      static_cast<uint64_t>(rose::kvBlocksFor(max_len, f.kv_block_size)));
    layout.output_bytes =
        a.output_bytes ? a.output_bytes : std::max<uint64_t>(4096, 4ull * f.max_seqs);
    auto ch = shm::Channel::create(a.shm_name, layout);
    if (!ch.isOk()) return fail(ch.status(), "cannot create the shm channel");
    channel.emplace(std::move(ch).value());
  }

  std::string name = std::filesystem::path(a.model_dir).lexically_normal().filename().string();
  if (name.empty()) {
    name = std::filesystem::path(a.model_dir).lexically_normal().parent_path().filename().string();
  }
  rose::LlmEngineOptions eo;
  eo.model_name = name;
  eo.kv_num_blocks = static_cast<int32_t>(kv_blocks);
  eo.kv_block_size = f.kv_block_size;
  eo.max_seqs = f.max_seqs;
  eo.max_batch_tokens = a.max_batch_tokens;
  eo.eos_ids = *eos;
  auto engine = rose::LlmEngine::create(*channel, **backend, **model, eo);
  if (!engine.isOk()) return fail(engine.status(), "cannot start the llm engine");
  (*engine)->announceReady();
  const ModelConfig& c = (*model)->config().base;
  log::info("ready", {{"model", a.model_dir},
                      {"kind", "llm"},
                      {"device", a.device},
                      {"shm", a.shm_name},
                      {"hidden", c.hidden_size},
                      {"layers", c.num_hidden_layers},
                      {"experts", c.num_local_experts},
                      {"max_model_len", (*model)->maxModelLen()},
                      {"kv_blocks", kv_blocks},
                      {"kv_block_size", f.kv_block_size},
                      {"kv_mb", static_cast<int64_t>((*engine)->kvCache().bytes() >> 20)},
                      {"max_batch_tokens", a.max_batch_tokens},
                      {"load_ms", static_cast<int64_t>(load_ms)}});

  garden::MetricsHttpServer metrics_http;
  if (a.metrics_port != 0) {
    Status mst = metrics_http.start(a.metrics_host, static_cast<uint16_t>(a.metrics_port));
    if (!mst.isOk()) return fail(mst, "cannot serve metrics");
  }
  const int32_t owner = a.create_shm ? 0 : channel->ownerPid();
  auto last_check = std::chrono::steady_clock::now();
  bool owner_gone = false;
  (*engine)->run([&] {
    if (g_stop) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check >= std::chrono::milliseconds(500)) {
      last_check = now;
      if (!processAlive(owner) || (!a.create_shm && getppid() != a.parent)) {
        owner_gone = true;
        return true;
      }
    }
    return false;
  });
  const auto st = (*engine)->stats();
  log::info("stopped", {{"reason", owner_gone ? "owner gone" : "signal"},
                        {"steps_run", st.steps_run},
                        {"steps_rejected", st.steps_rejected}});
  engine->reset();
  return 0;
}

// ---- end of the LLM path ------------------------------------------------------------------------

}  // namespace

int main(int argc, char** argv) {
  using namespace garden;
  std::string model_dir, shm_name, device = "cpu", pooling = "default", attention = "default";
  std::string log_level = "info";
  uint32_t metrics_port = 0;
  std::string metrics_host = "127.0.0.1";
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
      .add("metrics-host", &metrics_host, "address --metrics-port binds (0.0.0.0: every interface)")
      .add("log-level", &log_level, "debug, info, warn, error");
  // LLM path (gpt-oss) flags [llm-rose].
  LlmFlags llm_flags;
  flags.add("kv-block-size", &llm_flags.kv_block_size, "gpt-oss: tokens per KV cache block")
      .add("kv-blocks", &llm_flags.kv_blocks, "gpt-oss: KV cache blocks (0 = from --kv-cache-mb)")
      .add("kv-cache-mb", &llm_flags.kv_cache_mb, "gpt-oss: KV cache MiB when --kv-blocks is 0")
      .add("max-model-len", &llm_flags.max_model_len,
           "gpt-oss: longest sequence (0 = the model's, at most 131072)")
      .add("max-seqs", &llm_flags.max_seqs, "gpt-oss: sequences per step");
  // CUDA graphs for the embedding engine [gpu].
  std::string cuda_graphs = "on", precapture;
  flags
      .add("cuda-graphs", &cuda_graphs,
           "on|off: run embedding batches through CUDA graphs (cuda backend only)")
      .add("precapture", &precapture,
           "SEQSxTOKENS,...: embedding graph buckets to capture at start (e.g. 1x512,64x8192)");
  flags.useEnv("ROSE_");
  flags.parseOrExit(argc, argv);
  log::setService("rose");
  if (cuda_graphs != "on" && cuda_graphs != "off") {
    std::fprintf(stderr, "rose: --cuda-graphs must be on or off\n");
    return 2;
  }
  std::vector<std::pair<int32_t, int64_t>> precapture_list;
  for (size_t at = 0; at < precapture.size();) {
    size_t end = precapture.find(',', at);
    if (end == std::string::npos) end = precapture.size();
    const std::string item = precapture.substr(at, end - at);
    long long seqs = 0, toks = 0;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%lldx%lld%c", &seqs, &toks, &tail) != 2 || seqs <= 0 ||
        toks < seqs || toks > (1 << 24)) {
      std::fprintf(stderr, "rose: --precapture: '%s' is not SEQSxTOKENS (1 <= SEQS <= TOKENS)\n",
                   item.c_str());
      return 2;
    }
    precapture_list.emplace_back(static_cast<int32_t>(seqs), static_cast<int64_t>(toks));
    at = end + 1;
  }
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

  // LLM path (gpt-oss) [llm-rose]: config.json decides; anything else is the embedding path below.
  if (auto is_llm = rose::isGptOssCheckpoint(model_dir); is_llm.isOk() && *is_llm) {
    LlmServeArgs la;
    la.model_dir = model_dir;
    la.shm_name = shm_name;
    la.device = device;
    la.threads = threads;
    la.max_batch_tokens = max_batch_tokens;
    la.create_shm = create_shm;
    la.depth = depth;
    la.input_bytes = input_bytes;
    la.output_bytes = output_bytes;
    la.metrics_port = metrics_port;
    la.metrics_host = metrics_host;
    la.parent = parent;
    la.llm = llm_flags;
    return serveLlm(la);
  }

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
  eo.cuda_graphs = cuda_graphs == "on";
  eo.precapture = precapture_list;
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
                      {"cuda_graphs", (*engine)->stats().graphs},
                      {"load_ms", static_cast<int64_t>(load_ms)}});

  garden::MetricsHttpServer metrics_http;
  if (metrics_port != 0) {
    Status mst = metrics_http.start(metrics_host, static_cast<uint16_t>(metrics_port));
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
                        {"batches_rejected", st.batches_rejected},
                        {"cuda_graphs", st.graphs},
                        {"graph_eager", st.graph.eager},
                        {"graph_captures", st.graph.captures},
                        {"graph_replays", st.graph.replays},
                        {"graph_capture_failures", st.graph.capture_failures}});
  engine->reset();
  return 0;
}
