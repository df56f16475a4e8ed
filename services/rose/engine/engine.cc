#include "services/rose/engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "common/metrics/registry.h"

namespace garden::rose {
namespace {

// a + b <= limit without overflow.
bool fits(uint64_t offset, uint64_t bytes, uint64_t limit) {
  return offset <= limit && bytes <= limit - offset;
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(shm::Channel& channel, Backend& backend,
                                               Qwen3Model& model, const EngineOptions& opts) {
  std::unique_ptr<Engine> e(new Engine(channel, backend, model, opts));
  const uint32_t n = channel.layout().slots;
  if (n == 0) return invalidArgument("channel has no slots");
  const size_t cap = static_cast<size_t>(model.maxBatchTokens());
  for (uint32_t i = 0; i < n; ++i) {
    auto s = std::make_unique<Slot>();
    ASSIGN_OR_RETURN(s->event, backend.createEvent());
    s->tokens.resize(cap);
    s->seqlens.resize(cap);
    e->slots_.push_back(std::move(s));
  }
  if (opts.cuda_graphs && backend.graphs() != nullptr && model.graphsEnabled()) {
    e->graphs_ = backend.graphs();
  }
  if (!opts.precapture.empty() && e->graphs_ == nullptr) {
    return invalidArgument("precapture needs CUDA graphs (backend " + std::string(backend.name()) +
                           ", cuda graphs " + (opts.cuda_graphs ? "on" : "off") + ")");
  }
  for (const auto& [seqs, tokens] : opts.precapture) {
    Status st = model.precaptureEmbed(*e->graphs_, seqs, tokens, opts.default_pooling, true);
    if (!st.isOk()) {
      return Status(st.code(), "precapture " + std::to_string(seqs) + "x" + std::to_string(tokens) +
                                   ": " + st.message());
    }
  }
  if (!opts.precapture.empty()) RETURN_IF_ERROR(backend.synchronize());
  // Results are copied straight into the output arena: let the backend pin it.
  auto all = channel.outputArenaAll();
  RETURN_IF_ERROR(backend.registerHostMemory(all.data(), all.size()));
  e->registered_ = true;
  static auto& batches = metrics::Registry::global().counter(
      "rose_batches_total", "Batches answered by rose, by outcome", {"outcome"});
  static auto& step_seconds =
      metrics::Registry::global()
          .histogram("rose_step_seconds", "Batch taken until its result was published")
          .get();
  Engine* self = e.get();
  e->queue_.start({[self](uint32_t slot) { return self->slots_[slot]->event->wait(); },
                   [self](uint32_t slot) { self->slots_[slot]->busy.store(false); }, &batches,
                   &step_seconds, "forward pass failed"});
  return e;
}

Engine::~Engine() {
  drain(std::chrono::seconds(30));
  if (registered_) backend_.unregisterHostMemory(channel_.outputArenaAll().data());
}

void Engine::announceReady() {
  shm::ModelFacts f;
  f.hidden_size = static_cast<uint32_t>(model_.hiddenSize());
  f.max_seq_len = static_cast<uint32_t>(model_.maxSeqLen());
  f.vocab_size = static_cast<uint32_t>(model_.vocabSize());
  f.pooling = static_cast<uint32_t>(opts_.default_pooling);
  f.has_score_head = model_.hasScoreHead() ? 1 : 0;
  f.max_batch_tokens = static_cast<uint32_t>(model_.maxBatchTokens());
  std::strncpy(f.name, opts_.model_name.c_str(), sizeof(f.name) - 1);
  std::strncpy(f.kind, "embedding", sizeof(f.kind) - 1);
  channel_.setWorkerPid(static_cast<int32_t>(getpid()));
  channel_.setModelFacts(f);
  channel_.beat();
  channel_.setState(shm::WorkerState::kReady);
}

Status Engine::admit(const shm::BatchDesc& d, uint32_t* rows, uint32_t* cols) {
  const shm::Layout& l = channel_.layout();
  if (d.kind != shm::BatchKind::kEmbed && d.kind != shm::BatchKind::kScore) {
    if (d.kind == shm::BatchKind::kGenerate) {
      return unimplemented("batch kind generate is not served by this rose (embedding model)");
    }
    return invalidArgument("batch kind " + std::to_string(static_cast<uint32_t>(d.kind)) +
                           " is unknown");
  }
  if (d.num_seqs == 0) return invalidArgument("num_seqs is 0");
  if (d.num_tokens == 0) return invalidArgument("num_tokens is 0");
  if (d.num_tokens > model_.maxBatchTokens()) {
    return invalidArgument("num_tokens " + std::to_string(d.num_tokens) +
                           " exceeds max_batch_tokens " + std::to_string(model_.maxBatchTokens()));
  }
  if (d.num_seqs > d.num_tokens) {
    return invalidArgument("num_seqs " + std::to_string(d.num_seqs) + " exceeds num_tokens " +
                           std::to_string(d.num_tokens));
  }
  const uint64_t tok_bytes = uint64_t{d.num_tokens} * sizeof(int32_t);
  const uint64_t len_bytes = uint64_t{d.num_seqs} * sizeof(int32_t);
  if (!fits(d.tokens_offset, tok_bytes, l.input_bytes)) {
    return invalidArgument("tokens (offset " + std::to_string(d.tokens_offset) + ", " +
                           std::to_string(tok_bytes) + " bytes) run past the input arena (" +
                           std::to_string(l.input_bytes) + " bytes)");
  }
  if (!fits(d.seqlens_offset, len_bytes, l.input_bytes)) {
    return invalidArgument("seqlens (offset " + std::to_string(d.seqlens_offset) + ", " +
                           std::to_string(len_bytes) + " bytes) run past the input arena (" +
                           std::to_string(l.input_bytes) + " bytes)");
  }
  *rows = d.num_seqs;
  *cols = d.kind == shm::BatchKind::kEmbed ? static_cast<uint32_t>(model_.hiddenSize()) : 1;
  const uint64_t out_bytes = uint64_t{*rows} * *cols * sizeof(float);
  if (out_bytes > l.output_bytes) {
    return invalidArgument("result needs " + std::to_string(out_bytes) +
                           " bytes, more than the output arena's " +
                           std::to_string(l.output_bytes));
  }
  if (d.kind == shm::BatchKind::kEmbed) {
    if (static_cast<uint32_t>(d.pooling) > static_cast<uint32_t>(shm::PoolingMode::kCls)) {
      return invalidArgument("pooling " + std::to_string(static_cast<uint32_t>(d.pooling)) +
                             " is unknown");
    }
  } else {
    RETURN_IF_ERROR(model_.validateScore({d.score_yes, d.score_no}));
  }
  // Copy out of shared memory first: what is validated is what runs, whatever the other side
  // writes afterwards.
  Slot& s = *slots_[d.slot];
  auto in = channel_.inputArena(d.slot);
  std::memcpy(s.tokens.data(), in.data() + d.tokens_offset, tok_bytes);
  std::memcpy(s.seqlens.data(), in.data() + d.seqlens_offset, len_bytes);
  BatchInput bi{std::span<const int32_t>(s.tokens.data(), d.num_tokens),
                std::span<const int32_t>(s.seqlens.data(), d.num_seqs)};
  return model_.validate(bi);
}

void Engine::reject(const shm::BatchDesc& d, const Status& st,
                    std::chrono::steady_clock::time_point t) {
  rejected_.fetch_add(1);
  queue_.reject(d, st, t, "batch rejected");
}

bool Engine::step(std::chrono::microseconds wait) {
  channel_.beat();
  std::optional<shm::BatchDesc> got = channel_.waitSubmission(wait);
  channel_.beat();
  if (!got) return false;
  const shm::BatchDesc d = *got;
  const auto taken = std::chrono::steady_clock::now();
  const int64_t taken_ns = shm::monotonicNowNs();

  if (Status st = checkTaken(
          d, slots_.size(), [this](uint32_t i) { return slots_[i]->busy.load(); }, "batch");
      !st.isOk()) {
    reject(d, st, taken);
    return true;
  }
  Slot& slot = *slots_[d.slot];
  uint32_t rows = 0, cols = 0;
  if (Status st = admit(d, &rows, &cols); !st.isOk()) {
    reject(d, st, taken);
    return true;
  }

  slot.busy.store(true);
  float* out = reinterpret_cast<float*>(channel_.outputArena(d.slot).data());
  BatchInput in{std::span<const int32_t>(slot.tokens.data(), d.num_tokens),
                std::span<const int32_t>(slot.seqlens.data(), d.num_seqs)};
  const PoolMode mode = d.pooling == shm::PoolingMode::kDefault
                            ? opts_.default_pooling
                            : static_cast<PoolMode>(static_cast<uint32_t>(d.pooling));
  const bool normalize = d.normalize != 0;
  const ScoreRequest req{d.score_yes, d.score_no};
  Status graph_status;
  if (graphs_ != nullptr) {
    // Padded to the bucket and replayed (engine.h); runs on this thread, enqueues only.
    const GraphExecStats before = graphs_->graphStats();
    graph_status = d.kind == shm::BatchKind::kEmbed
                       ? model_.enqueueEmbedGraphed(*graphs_, in, mode, normalize, out)
                       : model_.enqueueScoreGraphed(*graphs_, in, req, out);
    const GraphExecStats after = graphs_->graphStats();
    static auto& graph_runs = metrics::Registry::global().counter(
        "rose_cuda_graph_runs_total", "Batches run through the CUDA graph cache, by how", {"how"});
    static auto& replayed = graph_runs.labels({"replay"});
    static auto& captured = graph_runs.labels({"capture"});
    static auto& eager = graph_runs.labels({"eager"});
    if (after.replays > before.replays) replayed.inc();
    if (after.captures > before.captures) captured.inc();
    if (after.eager > before.eager) eager.inc();
  } else if (d.kind == shm::BatchKind::kEmbed) {
    backend_.launch(
        [this, in, mode, normalize, out] { model_.enqueueEmbed(in, mode, normalize, out); });
  } else {
    backend_.launch([this, in, req, out] { model_.enqueueScore(in, req, out); });
  }
  PendingCompletion p;
  p.launched = true;
  p.taken = taken;
  p.completion.taken_ns = taken_ns;
  p.completion.batch_id = d.batch_id;
  p.completion.slot = d.slot;
  p.completion.status_code = 0;
  p.completion.rows = rows;
  p.completion.cols = cols;
  p.completion.output_bytes = uint64_t{rows} * cols * sizeof(float);
  if (!graph_status.isOk()) {
    // The graph run failed part-way: let what was enqueued finish, then report the error.
    (void)backend_.synchronize();
    p.completion.status_code = static_cast<int32_t>(graph_status.code());
    p.completion.rows = p.completion.cols = 0;
    p.completion.output_bytes = 0;
    copyCompletionMessage(p.completion.message, graph_status.message());
    log::error("graph run failed", {{"batch_id", d.batch_id}, {"error", graph_status}});
  } else if (Status st = backend_.recordEvent(*slot.event); !st.isOk()) {
    // Cannot track this batch: wait for it here (rare, backend failure) and report the error.
    (void)backend_.synchronize();
    p.completion.status_code = static_cast<int32_t>(st.code());
    copyCompletionMessage(p.completion.message, st.message());
  }
  p.completion.launched_ns = shm::monotonicNowNs();
  // One line per batch with the id of its first request [TAG_REQUEST_ID_LOGS], the id ivy and
  // tulip log for that request. Debug level: a busy GPU runs thousands of batches a second.
  log::debug(
      "batch",
      {{"batch_id", d.batch_id},
       {"request_id", std::string_view(d.request_id, strnlen(d.request_id, sizeof(d.request_id)))},
       {"kind", d.kind == shm::BatchKind::kEmbed ? "embed" : "score"},
       {"seqs", d.num_seqs},
       {"tokens", d.num_tokens}});
  run_.fetch_add(1);
  queue_.push(std::move(p));
  return true;
}

bool Engine::drain(std::chrono::milliseconds timeout) { return queue_.drain(timeout); }

void Engine::run(const std::function<bool()>& should_stop) {
  while (!should_stop()) step(opts_.poll);
  channel_.setState(shm::WorkerState::kStopping);
  channel_.wakeAll();
  if (!drain(std::chrono::seconds(30))) log::warn("stopping with batches still in flight");
}

EngineStats Engine::stats() const {
  EngineStats st{run_.load(), rejected_.load(), queue_.published()};
  st.graphs = graphs_ != nullptr;
  if (graphs_ != nullptr) st.graph = graphs_->graphStats();
  return st;
}

}  // namespace garden::rose
