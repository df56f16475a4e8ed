#include "services/rose/engine/step_loop.h"

#include <unistd.h>

#include <cstring>
#include <string_view>

#include "common/logging.h"
#include "common/metrics/registry.h"

namespace garden::rose {
namespace {

const char* batchKindName(shm::BatchKind k) {
  switch (k) {
    case shm::BatchKind::kEmbed:
      return "embed";
    case shm::BatchKind::kScore:
      return "score";
    case shm::BatchKind::kGenerate:
      return "generate";
    case shm::BatchKind::kKvPull:
      return "kv_pull";
  }
  return "unknown";
}

}  // namespace

StepLoop::StepLoop(shm::Channel& c, Backend& b, Runner& r, const StepLoopOptions& o)
    : channel_(c),
      backend_(b),
      runner_(r),
      opts_(o),
      traits_(r.traits()),
      reject_log_(std::string(traits_.kind) + " " + traits_.unit + " rejected"),
      failure_log_(std::string(traits_.kind) + " " + traits_.unit + " failed"),
      queue_(c, b) {}

Result<std::unique_ptr<StepLoop>> StepLoop::create(shm::Channel& channel, Backend& backend,
                                                   Runner& runner, const StepLoopOptions& opts) {
  const uint32_t n = channel.layout().slots;
  if (n == 0) return invalidArgument("channel has no slots");
  RETURN_IF_ERROR(runner.bind(channel.layout()));
  std::unique_ptr<StepLoop> loop(new StepLoop(channel, backend, runner, opts));
  for (uint32_t i = 0; i < n; ++i) {
    auto s = std::make_unique<Slot>();
    ASSIGN_OR_RETURN(s->event, backend.createEvent());
    loop->slots_.push_back(std::move(s));
  }
  // Results are copied straight into the output arena: let the backend pin it.
  auto all = channel.outputArenaAll();
  RETURN_IF_ERROR(backend.registerHostMemory(all.data(), all.size()));
  loop->registered_ = true;
  const RunnerTraits& t = loop->traits_;
  auto& outcomes = metrics::Registry::global().counter(t.outcomes_metric, t.outcomes_help,
                                                       {"outcome"});
  auto& seconds = metrics::Registry::global().histogram(t.seconds_metric, t.seconds_help).get();
  StepLoop* self = loop.get();
  loop->queue_.start({[self](uint32_t slot) { return self->slots_[slot]->event->wait(); },
                      [self](uint32_t slot) { self->slots_[slot]->busy.store(false); }, &outcomes,
                      &seconds, self->failure_log_.c_str()});
  return loop;
}

StepLoop::~StepLoop() {
  drain(std::chrono::seconds(30));
  if (registered_) backend_.unregisterHostMemory(channel_.outputArenaAll().data());
}

void StepLoop::announceReady() {
  shm::ModelFacts f = runner_.facts();
  std::memset(f.name, 0, sizeof(f.name));
  std::memset(f.kind, 0, sizeof(f.kind));
  std::strncpy(f.name, opts_.model_name.c_str(), sizeof(f.name) - 1);
  std::strncpy(f.kind, traits_.kind, sizeof(f.kind) - 1);
  channel_.setWorkerPid(static_cast<int32_t>(getpid()));
  channel_.setModelFacts(f);
  channel_.beat();
  channel_.setState(shm::WorkerState::kReady);
}

Status StepLoop::checkTaken(const shm::BatchDesc& d) const {
  if (d.slot >= slots_.size()) {
    return invalidArgument("slot " + std::to_string(d.slot) + " out of range (" +
                           std::to_string(slots_.size()) + " slots)");
  }
  if (slots_[d.slot]->busy.load()) {
    // Protocol violation: the slot's previous batch is still running. Answer without touching
    // the slot's staging or output.
    return invalidArgument("slot " + std::to_string(d.slot) + " is still in use");
  }
  if (d.deadline_ns != 0 && d.deadline_ns < shm::monotonicNowNs()) {
    return deadlineExceeded(std::string("deadline passed before the ") + traits_.unit + " ran");
  }
  return okStatus();
}

void StepLoop::reject(const shm::BatchDesc& d, const Status& st,
                      std::chrono::steady_clock::time_point t) {
  rejected_.fetch_add(1);
  queue_.reject(d, st, t, reject_log_.c_str());
}

bool StepLoop::step(std::chrono::microseconds wait) {
  channel_.beat();
  std::optional<shm::BatchDesc> got = channel_.waitSubmission(wait);
  channel_.beat();
  if (!got) return false;
  const shm::BatchDesc d = *got;
  const auto taken = std::chrono::steady_clock::now();
  const int64_t taken_ns = shm::monotonicNowNs();

  if (Status st = checkTaken(d); !st.isOk()) {
    reject(d, st, taken);
    return true;
  }
  Result<OutputShape> shape = runner_.admit(d, channel_.inputArena(d.slot));
  if (!shape.isOk()) {
    reject(d, shape.status(), taken);
    return true;
  }

  Slot& slot = *slots_[d.slot];
  slot.busy.store(true);
  PendingCompletion p;
  p.launched = true;
  p.taken = taken;
  p.completion.taken_ns = taken_ns;
  p.completion.batch_id = d.batch_id;
  p.completion.slot = d.slot;
  p.completion.status_code = 0;
  p.completion.rows = shape->rows;
  p.completion.cols = shape->cols;
  p.completion.output_bytes = shape->bytes();
  Status failed = runner_.launch(d, channel_.outputArena(d.slot));
  if (failed.isOk()) {
    failed = backend_.recordEvent(*slot.event);  // cannot track the batch: a backend failure
  }
  if (!failed.isOk()) {
    // Let what was enqueued finish (rare: a backend failure), then report the error.
    (void)backend_.synchronize();
    p.completion.status_code = static_cast<int32_t>(failed.code());
    p.completion.rows = p.completion.cols = 0;
    p.completion.output_bytes = 0;
    copyCompletionMessage(p.completion.message, failed.message());
    log::error(failure_log_, {{"batch_id", d.batch_id}, {"error", failed}});
  }
  p.completion.launched_ns = shm::monotonicNowNs();
  // One line per batch with the id of its first request [TAG_REQUEST_ID_LOGS], the id ivy and
  // tulip log for that request. Debug level: a busy GPU runs thousands of batches a second.
  log::debug(
      "batch",
      {{"batch_id", d.batch_id},
       {"request_id", std::string_view(d.request_id, strnlen(d.request_id, sizeof(d.request_id)))},
       {"kind", batchKindName(d.kind)},
       {"seqs", d.num_seqs},
       {"tokens", d.num_tokens}});
  run_.fetch_add(1);
  queue_.push(std::move(p));
  return true;
}

bool StepLoop::drain(std::chrono::milliseconds timeout) { return queue_.drain(timeout); }

void StepLoop::run(const std::function<bool()>& should_stop) {
  while (!should_stop()) step(opts_.poll);
  channel_.setState(shm::WorkerState::kStopping);
  channel_.wakeAll();
  if (!drain(std::chrono::seconds(30))) log::warn("stopping with batches still in flight");
}

StepLoopStats StepLoop::stats() const {
  return {run_.load(), rejected_.load(), queue_.published()};
}

}  // namespace garden::rose
