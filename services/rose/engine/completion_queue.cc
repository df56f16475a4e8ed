#include "services/rose/engine/completion_queue.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"

namespace garden::rose {

void copyCompletionMessage(char (&dst)[160], const std::string& msg) {
  const size_t n = std::min(msg.size(), sizeof(dst) - 1);
  std::memcpy(dst, msg.data(), n);
  dst[n] = '\0';
}

namespace {

// The answer to a batch refused before launch: `st` as its status and message.
PendingCompletion rejectedCompletion(const shm::BatchDesc& d, const Status& st,
                                     std::chrono::steady_clock::time_point taken) {
  PendingCompletion p;
  p.completion.batch_id = d.batch_id;
  p.completion.slot = d.slot;
  p.completion.status_code = static_cast<int32_t>(st.code());
  copyCompletionMessage(p.completion.message, st.message());
  p.taken = taken;
  p.completion.taken_ns = shm::monotonicNowNs();
  return p;
}

}  // namespace

void CompletionQueue::reject(const shm::BatchDesc& d, const Status& st,
                             std::chrono::steady_clock::time_point taken, const char* log_line) {
  log::warn(
      log_line,
      {{"batch_id", d.batch_id},
       {"slot", d.slot},
       {"request_id", std::string_view(d.request_id, strnlen(d.request_id, sizeof(d.request_id)))},
       {"error", st}});
  push(rejectedCompletion(d, st, taken));
}

void CompletionQueue::start(Hooks hooks) {
  backend_.setProgressCounter(channel_.progressCounter());  // [TAG_STEP_PROGRESS]
  channel_.setProgressReported(backend_.reportsProgress());
  hooks_ = std::move(hooks);
  ok_ = &hooks_.outcomes->labels({"OK"});
  thread_ = std::thread([this] { loop(); });
}

void CompletionQueue::push(PendingCompletion p) {
  in_flight_.fetch_add(1);
  {
    MutexLock lock(mu_);
    pending_.push_back(std::move(p));
  }
  cv_.notifyAll();
}

void CompletionQueue::loop() {
  for (;;) {
    PendingCompletion p;
    {
      MutexLock lock(mu_);
      cv_.wait(lock, [&]() REQUIRES(mu_) { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping and drained
      p = pending_.front();
    }
    if (p.launched && p.completion.status_code == 0) {
      Status st = hooks_.wait(p.completion.slot);
      if (!st.isOk()) {
        p.completion.status_code = static_cast<int32_t>(st.code());
        p.completion.rows = p.completion.cols = 0;
        p.completion.output_bytes = 0;
        copyCompletionMessage(p.completion.message, st.message());
        log::error(hooks_.failure_log, {{"batch_id", p.completion.batch_id}, {"error", st}});
      }
    }
    p.completion.ready_ns = shm::monotonicNowNs();
    p.completion.step_us =
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                  std::chrono::steady_clock::now() - p.taken)
                                  .count());
    if (p.launched) hooks_.release(p.completion.slot);
    // Publish first, count after: the caller is waiting on this entry.
    // The ring has a slot per pipeline slot, so it has room unless tulip stopped consuming;
    // retry then (until stopping) rather than drop an answer.
    p.completion.published_ns = shm::monotonicNowNs();
    while (!channel_.tryComplete(p.completion)) {
      {
        MutexLock lock(mu_);
        if (stop_) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (p.completion.status_code == 0) {
      ok_->inc();
    } else {
      hooks_.outcomes->labels({statusCodeName(static_cast<StatusCode>(p.completion.status_code))})
          .inc();
    }
    if (p.launched) hooks_.step_seconds->observe(p.completion.step_us / 1e6);
    published_.fetch_add(1);
    in_flight_.fetch_sub(1);  // before the pop, so waitIdle() returns with both counters settled
    {
      MutexLock lock(mu_);
      pending_.pop_front();
    }
    cv_.notifyAll();
  }
}

bool CompletionQueue::waitIdle(std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  return cv_.waitFor(lock, timeout, [&]() REQUIRES(mu_) { return pending_.empty(); });
}

bool CompletionQueue::drain(std::chrono::milliseconds timeout) {
  bool ok;
  {
    MutexLock lock(mu_);
    ok = cv_.waitFor(lock, timeout, [&]() REQUIRES(mu_) { return pending_.empty(); });
    stop_ = true;
  }
  cv_.notifyAll();
  if (thread_.joinable()) {
    if (!ok) (void)backend_.synchronize();  // let the completion thread finish its wait
    thread_.join();
  }
  return ok;
}

}  // namespace garden::rose
