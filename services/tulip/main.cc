// tulip: the scheduler. Serves garden.v1.Tulip + grpc.health.v1 on --host:--port (127.0.0.1
// unless an address is given; /metrics and /health on --host:--metrics-port), batches embedding
// and scoring requests (or, when the worker reports ModelFacts kind "llm", runs continuous batching
// of Generate streams) onto one rose worker over shared memory, and supervises that worker. With
// --auth-token-file every garden.v1.Tulip call needs `authorization: Bearer <token>`
// [TAG_TULIP_TOKEN]; the file is re-read on SIGHUP and when it changes.

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/flags.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/matcher.h"
#include "common/logging.h"
#include "common/metrics/registry.h"
#include "common/metrics_http.h"
#include "common/shm/llm_batch.h"
#include "common/token_file.h"
#include "services/tulip/llm/disagg.h"
#include "services/tulip/llm/llm_scheduler.h"
#include "services/tulip/sched/embed_scheduler.h"
#include "services/tulip/server/tulip_service.h"
#include "services/tulip/worker/shm_worker.h"

namespace fs = std::filesystem;
using namespace garden;
using namespace garden::tulip;

namespace {

// The rose binary next to tulip: the build tree (services/tulip/tulip → services/rose/rose) or a
// bundle (bin/tulip → bin/rose).
std::string defaultRoseBin() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "rose";
  buf[n] = '\0';
  fs::path self(buf);
  for (auto cand : {self.parent_path() / "rose", self.parent_path().parent_path() / "rose" / "rose"}) {
    if (fs::exists(cand)) return cand.string();
  }
  return "rose";
}

// hidden_size from the model's config.json, to size the output arena (rose reports the
// authoritative facts once loaded).
uint64_t hiddenSizeOf(const std::string& model_dir) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.load((fs::path(model_dir) / "config.json").string()).get(doc)) return 0;
  int64_t h = 0;
  if (doc["hidden_size"].get_int64().get(h)) return 0;
  return h > 0 ? static_cast<uint64_t>(h) : 0;
}

// vocab_size from config.json (0 when unknown): the width of token bitmasks.
uint64_t vocabSizeOf(const std::string& model_dir) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.load((fs::path(model_dir) / "config.json").string()).get(doc)) return 0;
  int64_t n = 0;
  if (doc["vocab_size"].get_int64().get(n)) return 0;
  return n > 0 ? static_cast<uint64_t>(n) : 0;
}

// max_position_embeddings from config.json (0 when unknown), to size an LLM step's block tables.
uint64_t maxPositionsOf(const std::string& model_dir) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.load((fs::path(model_dir) / "config.json").string()).get(doc)) return 0;
  int64_t n = 0;
  if (doc["max_position_embeddings"].get_int64().get(n)) return 0;
  return n > 0 ? static_cast<uint64_t>(n) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1";
  std::string auth_token_file;
  uint32_t port = 50051;
  uint32_t metrics_port = 9091;
  std::string model, device = "cpu", pooling = "default", shm_name, rose_bin, served_name;
  std::string log_level = "info";
  std::string tokenizer;
  bool attach = false;
  uint32_t depth = 4, max_batch_tokens = 8192, max_batch_seqs = 256, rose_threads = 0;
  uint32_t max_inflight_batches = 2, stage_lead_us = 1000;
  int32_t completion_spin_us = -1;
  uint64_t queue_limit_tokens = 1u << 20, max_waiting_tokens = 0;
  uint32_t max_num_seqs = 256;
  bool prefix_caching = true;
  bool llm_async_steps = true;
  int32_t mask_threads = -1;
  bool constrained_overlap = false;
  bool late_masks = true;
  uint32_t heartbeat_timeout_ms = 3000, drain_timeout_ms = 10000, step_timeout_ms = 60000;
  uint32_t progress_timeout_ms = 2500;
  std::vector<std::string> rose_extra;
  bool disaggregate = false;  // [TAG_DISAGG]
  std::vector<std::string> prefill_extra, decode_extra;

  Flags flags("tulip", "Garden scheduler: gRPC in, batches to a rose worker over shared memory");
  flags.add("host", &host,
            "address the gRPC server and the metrics endpoint bind to (0.0.0.0: every interface; "
            "then set --auth-token-file, or keep the port reachable by ivy only)")
      .add("auth-token-file", &auth_token_file,
           "file of tokens (one per line, # comments); when set every garden.v1.Tulip call needs "
           "`authorization: Bearer <token>` (grpc.health.v1 stays open); re-read on SIGHUP or "
           "when the file changes")
      .add("port", &port, "gRPC port (garden.v1.Tulip and grpc.health.v1)")
      .add("metrics-port", &metrics_port, "HTTP port for /metrics and /health (0 = off)")
      .add("model", &model, "model directory (Hugging Face layout) rose loads")
      .add("device", &device, "rose device: cpu or cuda")
      .add("pooling", &pooling, "pooling override passed to rose: default|last|mean|cls")
      .add("served-model-name", &served_name, "model name callers use (default: rose's)")
      .add("shm-name", &shm_name, "shared-memory segment name (default /garden-tulip-<port>)")
      .add("rose-bin", &rose_bin, "rose executable to spawn (default: next to tulip)")
      .add("rose-threads", &rose_threads, "CPU threads for rose's cpu backend (0 = rose's default)")
      .add("rose-arg", &rose_extra, "extra argument for rose (repeatable)")
      .add("attach", &attach, "attach to a rose started beside tulip (it creates --shm-name)")
      .add("disaggregate", &disaggregate,
           "LLM prefill/decode disaggregation: a second rose (the prefill worker, channel "
           "<shm-name>-prefill, its KV cache exported with --kv-export) runs the prompts and "
           "samples each first token; the main rose (decode) copies each sequence's KV blocks "
           "from it and generates the rest (cpu: through shared memory; cuda: CUDA IPC, one "
           "kernel per handoff; size each side's KV cache with --prefill-rose-arg / "
           "--decode-rose-arg, e.g. --kv-cache-mb, and put the prefill rose on another GPU with "
           "--prefill-rose-arg=--cuda-device --prefill-rose-arg=1). Not with --attach")
      .add("prefill-rose-arg", &prefill_extra,
           "with --disaggregate: extra argument for the prefill rose only (repeatable; after "
           "the --rose-arg ones; rose refuses a flag given twice)")
      .add("decode-rose-arg", &decode_extra,
           "with --disaggregate: extra argument for the decode (main) rose only (repeatable)")
      .add("depth", &depth, "batches in flight (pipeline depth = channel slots)")
      .add("max-batch-tokens", &max_batch_tokens, "token budget of one batch")
      .add("max-batch-seqs", &max_batch_seqs, "sequence cap of one batch")
      .add("max-inflight-batches", &max_inflight_batches,
           "embeddings/scores: batches on rose at once (<= --depth; 0 = --depth). 2 = one "
           "running + one staged: requests arriving meanwhile coalesce into the next batch, a "
           "lone request is still sent at once")
      .add("stage-lead-us", &stage_lead_us,
           "embeddings/scores: with a batch running, form the staged one only when the running "
           "work is predicted (from recent batch times) to end within this many µs, so requests "
           "arriving meanwhile join it (0 = stage at once)")
      .add("completion-spin-us", &completion_spin_us,
           "while a batch is in flight, spin up to this long around its expected completion "
           "instead of sleeping on the doorbell (0 = always sleep; never spins while idle; "
           "-1 = 200 with --device cuda, 0 on cpu, where a spinning thread would take a core "
           "from the forward pass)")
      .add("queue-limit-tokens", &queue_limit_tokens,
           "queued tokens beyond which requests get RESOURCE_EXHAUSTED")
      .add("max-num-seqs", &max_num_seqs, "LLM: sequences generated at once (running set)")
      .add("max-waiting-tokens", &max_waiting_tokens,
           "LLM: prompt tokens waiting beyond which Generate gets RESOURCE_EXHAUSTED "
           "(0 = --queue-limit-tokens)")
      .add("enable-prefix-caching", &prefix_caching,
           "LLM: share the KV of repeated prompt prefixes (full blocks)")
      .add("llm-async-steps", &llm_async_steps,
           "LLM: plan step N+1 while step N runs on rose (two steps in flight; rose takes a "
           "continuing sequence's token from step N's sampled ids). Default: on when --depth "
           ">= 2; on with --depth 1 is refused")
      .add("llm-late-masks", &late_masks,
           "LLM structured outputs with --llm-async-steps: plan constrained sequences ahead like "
           "the others and hand their token masks to rose while it runs the step's forward pass "
           "(needs a rose that announces it; else as --llm-constrained-overlap says). Default on")
      .add("llm-constrained-overlap", &constrained_overlap,
           "LLM structured outputs with --llm-async-steps, without late masks: keep planning "
           "unconstrained sequences ahead while constrained ones wait for their last token (they "
           "then advance every other step). Default off: while a constrained sequence waits, one "
           "step is in flight")
      .add("mask-threads", &mask_threads,
           "LLM structured outputs: helper threads that fill a step's token masks beside the "
           "scheduler's thread (0 = none; -1, the default: min(8, cores / 2))")
      .add("heartbeat-timeout-ms", &heartbeat_timeout_ms,
           "a worker silent this long is declared stuck and restarted")
      .add("progress-timeout-ms", &progress_timeout_ms,
           "a worker that reports step progress (rose's cpu backend) with a batch in flight and "
           "no progress for this long is stuck: it is restarted. A long step that keeps making "
           "progress is never cut short")
      .add("step-timeout-ms", &step_timeout_ms,
           "a worker that does not report step progress (rose's cuda backend for now) is stuck "
           "when a batch has been in flight longer than max(this, 8 x its tokens x the slowest "
           "per-token time measured on it): it is restarted")
      .add("drain-timeout-ms", &drain_timeout_ms, "on SIGTERM, time allowed for in-flight work")
      .add("log-level", &log_level, "debug|info|warn|error")
      .add("tokenizer", &tokenizer,
           "LLM: the served model's byte-level BPE tokenizer.json, for structured outputs (token "
           "masks need each id's bytes). Default: <model>/tokenizer.json when it exists; without "
           "one, requests with a constraint get FAILED_PRECONDITION")
      .useEnv("TULIP_");
  flags.parseOrExit(argc, argv);
  log::setService("tulip");
  if (auto lv = log::parseLevel(log_level); lv.isOk()) log::setLevel(*lv);

  if (!attach && model.empty()) {
    std::fprintf(stderr, "tulip: --model is required (or --attach to a running rose)\n");
    return 2;
  }
  if (depth == 0 || depth > 64) {
    std::fprintf(stderr, "tulip: --depth must be 1..64\n");
    return 2;
  }
  // The default (2) is capped by a smaller --depth; an explicit value above it is a mistake.
  if (flags.wasSet("max-inflight-batches") && max_inflight_batches > depth) {
    std::fprintf(stderr, "tulip: --max-inflight-batches must be 0..--depth (%u)\n", depth);
    return 2;
  }
  if (completion_spin_us < -1 || completion_spin_us > 100000) {
    std::fprintf(stderr, "tulip: --completion-spin-us must be -1 (auto) or 0..100000\n");
    return 2;
  }
  if (progress_timeout_ms == 0 || step_timeout_ms == 0 || heartbeat_timeout_ms == 0) {
    std::fprintf(stderr,
                 "tulip: --progress-timeout-ms, --step-timeout-ms and --heartbeat-timeout-ms must "
                 "be >= 1\n");
    return 2;
  }
  if (max_num_seqs == 0) {
    std::fprintf(stderr, "tulip: --max-num-seqs must be >= 1\n");
    return 2;
  }
  if (mask_threads < -1 || mask_threads > 64) {
    std::fprintf(stderr, "tulip: --mask-threads must be -1 (auto) or 0..64\n");
    return 2;
  }
  // Two LLM steps in flight need two channel slots [TAG_LLM_PREV_TOKEN].
  if (flags.wasSet("llm-async-steps") && llm_async_steps && depth < 2) {
    std::fprintf(stderr, "tulip: --llm-async-steps on needs --depth >= 2 (two steps in flight)\n");
    return 2;
  }
  if (!flags.wasSet("llm-async-steps")) llm_async_steps = depth >= 2;
  if (disaggregate && attach) {  // [TAG_DISAGG]
    std::fprintf(stderr, "tulip: --disaggregate starts both roses itself: not with --attach\n");
    return 2;
  }
  if ((!prefill_extra.empty() || !decode_extra.empty()) && !disaggregate) {
    std::fprintf(stderr, "tulip: --prefill-rose-arg and --decode-rose-arg need --disaggregate\n");
    return 2;
  }
  if (max_waiting_tokens == 0) max_waiting_tokens = queue_limit_tokens;
  std::unique_ptr<TokenFile> auth;
  if (!auth_token_file.empty()) {
    auto t = TokenFile::load(auth_token_file, "--auth-token-file");
    if (!t.isOk()) {
      std::fprintf(stderr, "tulip: %s\n", t.status().message().c_str());
      return 2;
    }
    auth = std::move(t).value();
  }
  if (shm_name.empty()) shm_name = "/garden-tulip-" + std::to_string(port);
  if (rose_bin.empty()) rose_bin = defaultRoseBin();

  // Take SIGTERM/SIGINT synchronously on the main thread (blocked before any thread starts).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGHUP);  // re-read --auth-token-file
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  uint64_t hidden = model.empty() ? 0 : hiddenSizeOf(model);
  if (hidden == 0) hidden = 8192;  // unknown: size for the widest model we serve
  ShmWorkerOptions wopts;
  wopts.shm_name = shm_name;
  wopts.attach = attach;
  wopts.rose_bin = rose_bin;
  wopts.layout.slots = depth;
  wopts.layout.input_bytes =
      (uint64_t{max_batch_tokens} + max_batch_seqs) * sizeof(int32_t) + 4096;
  {
    // An LLM step: descriptors, tokens and every sequence's block table, twice over for a
    // worker with a sliding-window pool (each window table follows its table,
    // [TAG_KV_WINDOW_GROUP]) (blocks of >= 16 tokens assumed; a step that would not fit carries
    // fewer sequences). Pages of the segment are only backed once touched, so generous sizing
    // costs nothing until used.
    uint64_t positions = model.empty() ? 0 : maxPositionsOf(model);
    if (positions == 0) positions = 8192;
    const uint64_t blocks = std::min<uint64_t>(
        2 * uint64_t{max_num_seqs} * ((positions + 15) / 16), uint64_t{32} << 20);
    wopts.layout.input_bytes = std::max<uint64_t>(
        wopts.layout.input_bytes, shm::llmStepBytes(max_num_seqs, max_batch_tokens, blocks));
  }
  // Structured outputs [TAG_TOKEN_MASK]: room for one token bitmask per sequence of a step.
  const uint64_t vocab_size = model.empty() ? 0 : vocabSizeOf(model);
  if (vocab_size > 0) {
    wopts.layout.input_bytes += shm::llmMaskBytes(max_num_seqs, vocab_size);
  }
  std::shared_ptr<const grammar::Vocabulary> vocab;
  if (tokenizer.empty() && !model.empty() && fs::exists(fs::path(model) / "tokenizer.json")) {
    tokenizer = (fs::path(model) / "tokenizer.json").string();
  }
  if (!tokenizer.empty() && vocab_size > 0) {
    auto v = grammar::loadByteLevelVocabulary(tokenizer, static_cast<int32_t>(vocab_size));
    if (!v.isOk()) {
      // Embedding models may ship other tokenizers: structured outputs are then off.
      log::warn("no vocabulary for structured outputs", {{"error", v.status()}});
    } else {
      vocab = *v;
    }
  }
  // [TAG_TABLE_SHARING] The generic JSON grammar's token tables, walked once in the background at
  // start: a schema's free parts (any value, additionalProperties, {}) then find theirs in the
  // process-wide cache, and json_object requests compile in ~0.6 ms instead of ~3.
  std::thread prewarm;
  // Joined on every return from main (a joinable std::thread's destructor would terminate).
  struct JoinOnReturn {
    std::thread& t;
    ~JoinOnReturn() {
      if (t.joinable()) t.join();
    }
  } join_prewarm{prewarm};
  if (vocab) {
    prewarm = std::thread([v = vocab] {
      const auto t0 = std::chrono::steady_clock::now();
      auto g = grammar::jsonObjectGrammar();
      auto c = g.isOk() ? grammar::CompiledGrammar::compile(std::move(g).value(), v)
                        : Result<std::shared_ptr<const grammar::CompiledGrammar>>(g.status());
      if (!c.isOk()) {
        log::warn("structured outputs: JSON tables not prepared", {{"error", c.status()}});
        return;
      }
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
      log::info("structured outputs: JSON tables ready",
                {{"tables", (*c)->stats().built}, {"us", static_cast<int64_t>(us)}});
    });
  }
  wopts.layout.output_bytes = uint64_t{max_batch_seqs} * hidden * sizeof(float);
  wopts.heartbeat_timeout = std::chrono::milliseconds(heartbeat_timeout_ms);
  wopts.step_timeout = std::chrono::milliseconds(step_timeout_ms);
  wopts.progress_timeout = std::chrono::milliseconds(progress_timeout_ms);
  if (completion_spin_us < 0) completion_spin_us = device == "cuda" ? 200 : 0;
  wopts.completion_spin = std::chrono::microseconds(completion_spin_us);
  wopts.rose_args = {"--model", model, "--device", device, "--pooling", pooling,
                     "--max-batch-tokens", std::to_string(max_batch_tokens)};
  if (rose_threads > 0) {
    wopts.rose_args.push_back("--threads");
    wopts.rose_args.push_back(std::to_string(rose_threads));
  }
  wopts.rose_args.insert(wopts.rose_args.end(), rose_extra.begin(), rose_extra.end());
  // [TAG_DISAGG] The prefill worker: the same rose, its own channel, its KV cache exported.
  ShmWorkerOptions popts = wopts;
  if (disaggregate) {
    popts.shm_name = shm_name + "-prefill";
    const std::string export_name = shm_name.substr(shm_name[0] == '/' ? 1 : 0) + "-kv";
    popts.rose_args.push_back("--kv-export");
    popts.rose_args.push_back(export_name);
    popts.rose_args.insert(popts.rose_args.end(), prefill_extra.begin(), prefill_extra.end());
  }
  wopts.rose_args.insert(wopts.rose_args.end(), decode_extra.begin(), decode_extra.end());
  auto worker = ShmWorker::start(wopts);
  if (!worker.isOk()) {
    log::error("cannot start the rose worker", {{"error", worker.status()}});
    return 1;
  }
  Result<std::unique_ptr<ShmWorker>> pworker = std::unique_ptr<ShmWorker>();
  if (disaggregate) {
    pworker = ShmWorker::start(popts);
    if (!pworker.isOk()) {
      log::error("cannot start the prefill rose worker", {{"error", pworker.status()}});
      return 1;
    }
  }

  SchedulerOptions sopts;
  sopts.max_batch_tokens = max_batch_tokens;
  sopts.max_batch_seqs = max_batch_seqs;
  sopts.queue_limit_tokens = queue_limit_tokens;
  sopts.max_inflight_batches = max_inflight_batches;
  sopts.stage_lead_us = stage_lead_us;
  EmbedScheduler scheduler(**worker, sopts);
  LlmSchedulerOptions lopts;
  lopts.max_batch_tokens = max_batch_tokens;
  lopts.max_num_seqs = max_num_seqs;
  lopts.max_waiting_tokens = max_waiting_tokens;
  lopts.enable_prefix_caching = prefix_caching;
  lopts.async_steps = llm_async_steps;
  if (mask_threads < 0) {  // [TAG_MASK_POOL]
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    mask_threads = static_cast<int32_t>(std::min(8u, cores / 2));
  }
  lopts.mask_threads = static_cast<uint32_t>(mask_threads);
  lopts.constrained_overlap = constrained_overlap;
  lopts.late_masks = late_masks;
  LlmScheduler llm_scheduler(**worker, lopts);
  (*worker)->setOnChange([&scheduler, &llm_scheduler] {
    scheduler.poke();
    llm_scheduler.poke();
  });
  // [TAG_DISAGG] The prefill side hands its sequences to llm_scheduler after their first token.
  std::unique_ptr<LlmScheduler> prefill_scheduler;
  std::unique_ptr<DisaggLlm> disagg;
  if (disaggregate) {
    LlmSchedulerOptions po = lopts;
    po.handoff = true;
    prefill_scheduler = std::make_unique<LlmScheduler>(**pworker, po);
    (*pworker)->setOnChange([p = prefill_scheduler.get(), &llm_scheduler] {
      p->poke();
      llm_scheduler.poke();  // a restarted prefill worker: pulls from it fail, streams end
    });
    disagg = std::make_unique<DisaggLlm>(*prefill_scheduler, **pworker, llm_scheduler, **worker);
  }
  LlmFrontend& llm_frontend =
      disagg ? static_cast<LlmFrontend&>(*disagg) : static_cast<LlmFrontend&>(llm_scheduler);
  // Whichever way main returns from here (a port it cannot listen on included), the schedulers
  // and then the worker stop — the normal shutdown's order — before the schedulers are destroyed:
  // the worker's thread calls back into both (ThreadSanitizer saw ~LlmScheduler race its poke()
  // after "cannot listen"). Every stop() is idempotent.
  struct StopOnReturn {
    EmbedScheduler& embed;
    LlmScheduler& llm;
    ShmWorker& worker;
    LlmScheduler* prefill;
    ShmWorker* prefill_worker;
    ~StopOnReturn() {
      embed.stop();
      if (prefill != nullptr) prefill->stop();
      llm.stop();
      if (prefill_worker != nullptr) prefill_worker->stop();
      worker.stop();
    }
  } stop_on_return{scheduler, llm_scheduler, **worker, prefill_scheduler.get(),
                   disaggregate ? pworker->get() : nullptr};

  auto& reg = metrics::Registry::global();
  auto& g_ready = reg.gauge("tulip_worker_ready", "1 when the rose worker is ready").get();
  auto& g_restarts = reg.gauge("tulip_worker_restarts", "rose worker restarts so far").get();
  auto& g_qtokens = reg.gauge("tulip_queue_tokens", "tokens waiting to be batched").get();
  auto& g_qreqs = reg.gauge("tulip_queue_requests", "requests waiting to be batched").get();
  auto& g_inflight = reg.gauge("tulip_inflight_tokens", "tokens in batches on the worker").get();

  TulipService service(scheduler, llm_frontend, **worker,
                      ServiceOptions{served_name, auth.get(), vocab});
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // No SO_REUSEPORT (gRPC sets it by default on Linux): a second server started on this port —
  // another tulip, a misconfigured replica — must fail to listen, not silently take half of the
  // new connections (seen in tests: a Load RPC answered by another process's tulip).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int bound_port = 0;
  builder.AddListeningPort(host + ":" + std::to_string(port), grpc::InsecureServerCredentials(),
                           &bound_port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    log::error("cannot listen", {{"address", host + ":" + std::to_string(port)}});
    return 1;
  }
  auto* health = server->GetHealthCheckService();
  health->SetServingStatus(false);

  MetricsHttpServer metrics_http;
  if (metrics_port != 0) {
    Status st = metrics_http.start(host, static_cast<uint16_t>(metrics_port),
                                   [&] {
                                     return (*worker)->ready() &&
                                            (!disaggregate || (*pworker)->ready());
                                   });
    if (!st.isOk()) {
      log::error("cannot serve metrics", {{"error", st}});
      return 1;
    }
  }
  log::info("listening", {{"host", host},
                          {"port", bound_port},
                          {"auth", auth ? "token" : "none"},
                          {"metrics_port", metrics_port},
                          {"shm", shm_name},
                          {"mode", attach ? "attach" : "spawn"},
                          {"rose", rose_bin}});

  // Health follows the worker; gauges follow the scheduler.
  std::atomic<bool> stopping{false};
  std::thread watcher([&] {
    bool last = false;
    while (!stopping) {
      bool ready = (*worker)->ready() && (!disaggregate || (*pworker)->ready());
      if (ready != last) {
        health->SetServingStatus(ready);
        health->SetServingStatus("garden.v1.Tulip", ready);
        last = ready;
      }
      g_ready.set(ready ? 1 : 0);
      g_restarts.set(static_cast<double>((*worker)->restarts()));
      const auto f = (*worker)->facts();
      if (std::string(f.kind, strnlen(f.kind, sizeof(f.kind))) == "llm") {
        auto s = llm_frontend.stats();
        if (disagg) disagg->publishGauges();  // [TAG_DISAGG] the two sides' sums
        g_qtokens.set(static_cast<double>(s.waiting_tokens));
        g_qreqs.set(static_cast<double>(s.waiting));
        g_inflight.set(static_cast<double>(s.inflight_tokens));
      } else {
        auto s = scheduler.stats();
        g_qtokens.set(static_cast<double>(s.queued_tokens));
        g_qreqs.set(static_cast<double>(s.queued_requests));
        g_inflight.set(static_cast<double>(s.inflight_tokens));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });

  int sig = 0;
  while (sigwait(&sigs, &sig) == 0 && sig == SIGHUP) {
    if (auth) (void)auth->reload();
  }
  log::info("shutting down", {{"signal", sig}, {"drain_ms", drain_timeout_ms}});
  stopping = true;
  watcher.join();
  health->SetServingStatus(false);
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(drain_timeout_ms));
  scheduler.stop();
  if (prefill_scheduler) prefill_scheduler->stop();
  llm_scheduler.stop();
  if (disaggregate) (*pworker)->stop();
  (*worker)->stop();
  metrics_http.stop();
  if (prewarm.joinable()) prewarm.join();
  log::info("stopped");
  return 0;
}
