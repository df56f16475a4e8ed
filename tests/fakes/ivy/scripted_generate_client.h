#pragma once
// ScriptedGenerateClient: a TulipClient whose generate() streams scripted token ids, for the chat
// and completions tests. Like tulip it honours max_tokens (finish length), stop_token_ids (finish
// stop; the stop id is included in the output, as tulip does) and cancel() (on_done CANCELLED);
// a script that runs out ends with finish stop. The last chunk carries the usage counts
// (prompt_tokens = prompt length, cached_prompt_tokens = setCachedTokens()) and tulip's timings
// (setTimings()). While held (setHold), new streams wait without sending anything until
// releaseHeld(), so a test can keep requests in flight from a known state.
// A call with n > 1 choices streams each choice's script (setChoiceScript; default: the call's
// script for every choice) as tulip does: chunks name their choice (index), taken in turn, each
// choice with its own last chunk; with call.logprobs and setChoiceLogprob, every token of choice c
// carries logprob setChoiceLogprob(c) (otherwise no logprobs are sent).
// stopChoice(c) on a stream [TAG_STOP_CHOICE] is counted (stopChoiceCalls()) and, as tulip does,
// ends choice c at its next turn with a last chunk (FINISH_STOP) whose completion_tokens is
// kStoppedCount + the tokens sent: a count ivy must not report (it counts the stopped choice
// itself); setHonourStopChoice(false) makes it a no-op, as a stream that cannot stop one choice.
// Callbacks run on the fake's own worker thread, never inline in generate(). Thread-safe.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "services/ivy/balance/tulip_client.h"

namespace garden::ivy::testing {

class ScriptedGenerateClient final : public TulipClient {
 public:
  using Script = std::function<std::vector<int32_t>(const GenerateCall&)>;

  ScriptedGenerateClient() : worker_([this] { run(); }) {
    info_.model = "fake-llm";
    info_.kind = "llm";
    info_.max_seq_len = 4096;
    info_.vocab_size = 201088;
  }
  ~ScriptedGenerateClient() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& s : held_) enqueueLocked(std::move(s));  // held streams still end
      held_.clear();
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  // --- configuration ---
  void setScript(Script s) {
    std::lock_guard<std::mutex> lock(mu_);
    script_ = std::move(s);
  }
  void setScript(std::vector<int32_t> ids) {
    setScript([ids](const GenerateCall&) { return ids; });
  }
  using ChoiceScript = std::function<std::vector<int32_t>(const GenerateCall&, uint32_t choice)>;
  void setChoiceScript(ChoiceScript s) {
    std::lock_guard<std::mutex> lock(mu_);
    choice_script_ = std::move(s);
  }
  void setChoiceLogprob(std::function<float(uint32_t choice)> f) {
    std::lock_guard<std::mutex> lock(mu_);
    choice_logprob_ = std::move(f);
  }
  void setChunkSize(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    chunk_size_ = n == 0 ? 1 : n;
  }
  void setChunkDelay(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> lock(mu_);
    delay_ = d;
  }
  // The stream fails with `s` once `after_tokens` tokens were sent (OK status: no failure).
  void setError(Status s, size_t after_tokens = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(s);
    error_after_ = after_tokens;
  }
  void setCachedTokens(uint32_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    cached_ = n;
  }
  // queue_us / total_us of every stream's last chunk.
  void setTimings(uint64_t queue_us, uint64_t total_us) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_us_ = queue_us;
    total_us_ = total_us;
  }
  static constexpr uint32_t kStoppedCount = 100000;
  void setHonourStopChoice(bool on) { honour_stop_.store(on); }
  int stopChoiceCalls() const { return stop_calls_.load(); }
  // Tokens sent so far over every stream and choice.
  int tokensSent() const { return tokens_sent_.load(); }
  void setHold(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = on;
  }
  // Starts the held streams (hold stays as set).
  void releaseHeld() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : held_) enqueueLocked(std::move(s));
    held_.clear();
  }
  size_t heldCount() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }

  // --- observation ---
  std::vector<GenerateCall> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  int cancelledStreams() const { return cancelled_.load(); }
  int activeStreams() const { return active_.load(); }
  // Waits until no stream is in flight.
  bool waitIdle(std::chrono::milliseconds timeout) {
    auto until = std::chrono::steady_clock::now() + timeout;
    while (active_.load() != 0) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

  // --- TulipClient ---
  std::shared_ptr<GenerateStream> generate(GenerateCall call, ChunkFn on_chunk,
                                           StreamDone on_done) override {
    auto s = std::make_shared<Stream>();
    s->client = this;
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(call);
    const uint32_t n = std::max<uint32_t>(call.n, 1);
    for (uint32_t c = 0; c < n; ++c) {
      s->scripts.push_back(choice_script_ ? choice_script_(call, c)
                           : script_     ? script_(call)
                                         : std::vector<int32_t>{});
      if (choice_logprob_) s->logprob.push_back(choice_logprob_(c));
    }
    s->positions.assign(n, 0);
    s->ended.assign(n, false);
    s->call = std::move(call);
    s->on_chunk = std::move(on_chunk);
    s->on_done = std::move(on_done);
    ++active_;
    if (hold_) {
      held_.push_back(s);
    } else {
      enqueueLocked(s);
    }
    return s;
  }
  void embed(EmbedCall, EmbedDone done) override {
    done(Status(StatusCode::kUnimplemented, "the scripted client only generates"));
  }
  void modelInfo(std::chrono::milliseconds, ModelInfoDone done) override {
    TulipModelInfo info;
    {
      std::lock_guard<std::mutex> lock(mu_);
      info = info_;
    }
    done(info);
  }
  void health(std::chrono::milliseconds, HealthDone done) override { done(okStatus()); }
  std::string endpoint() const override { return "scripted:0"; }

 private:
  struct Stream : GenerateStream {
    void cancel() override { cancelled.store(true); }
    void stopChoice(uint32_t index) override {
      ++client->stop_calls_;
      if (client->honour_stop_.load()) stop_mask.fetch_or(1u << index);
    }
    ScriptedGenerateClient* client = nullptr;
    std::atomic<uint32_t> stop_mask{0};  // choices stopChoice() ended
    GenerateCall call;
    std::vector<std::vector<int32_t>> scripts;  // per choice
    std::vector<size_t> positions;               // per choice: tokens sent
    std::vector<bool> ended;                     // per choice: its last chunk went out
    std::vector<float> logprob;                  // per choice (empty: none sent)
    uint32_t turn = 0;                           // the next choice to send
    ChunkFn on_chunk;
    StreamDone on_done;
    std::atomic<bool> cancelled{false};
  };

  void enqueueLocked(std::shared_ptr<Stream> s) {
    queue_.push_back({std::chrono::steady_clock::now() + delay_, std::move(s)});
    cv_.notify_all();
  }

  void finishStream(const std::shared_ptr<Stream>& s, Status st) {
    auto done = std::move(s->on_done);
    s->on_chunk = nullptr;
    s->on_done = nullptr;
    done(std::move(st));
    --active_;
  }

  // One step of a stream: a chunk, or its end.
  void step(const std::shared_ptr<Stream>& s) {
    if (s->cancelled.load()) {
      ++cancelled_;
      return finishStream(s, cancelledError("cancelled by the caller"));
    }
    Status err;
    size_t error_after, chunk;
    uint32_t cached;
    uint64_t queue_us, total_us;
    {
      std::lock_guard<std::mutex> lock(mu_);
      err = error_;
      error_after = error_after_;
      chunk = chunk_size_;
      cached = cached_;
      queue_us = queue_us_;
      total_us = total_us_;
    }
    const uint32_t n = static_cast<uint32_t>(s->scripts.size());
    uint32_t c = s->turn;
    while (s->ended[c]) c = (c + 1) % n;
    s->turn = (c + 1) % n;
    size_t& pos = s->positions[c];
    const std::vector<int32_t>& tokens = s->scripts[c];
    if (!err.isOk() && pos >= error_after) return finishStream(s, err);
    GenerateChunkMsg m;
    m.index = c;
    const auto& stops = s->call.stop_token_ids;
    const bool stopped = (s->stop_mask.load() >> c) & 1u;
    if (stopped) m.finish = FinishReason::kStop;
    while (!stopped && m.token_ids.size() < chunk) {
      if (pos >= s->call.max_tokens) {
        m.finish = FinishReason::kLength;
        break;
      }
      if (pos >= tokens.size()) {
        m.finish = FinishReason::kStop;
        break;
      }
      int32_t id = tokens[pos++];
      m.token_ids.push_back(id);
      ++tokens_sent_;
      if (s->call.logprobs && !s->logprob.empty()) {
        llm::LlmTokenLogprobs lp;
        lp.logprob = s->logprob[c];
        lp.num_top = 0;
        m.logprobs.push_back(lp);
      }
      if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
        m.finish = FinishReason::kStop;
        break;
      }
      if (!err.isOk() && pos >= error_after) break;
    }
    if (m.finish == FinishReason::kNone && pos >= s->call.max_tokens)
      m.finish = FinishReason::kLength;
    if (m.finish != FinishReason::kNone) {
      m.prompt_tokens = static_cast<uint32_t>(s->call.prompt_ids.size());
      m.cached_prompt_tokens = cached;
      m.completion_tokens = static_cast<uint32_t>(pos) + (stopped ? kStoppedCount : 0);
      m.queue_us = queue_us;
      m.total_us = total_us;
      s->ended[c] = true;
    }
    s->on_chunk(std::move(m));
    if (std::find(s->ended.begin(), s->ended.end(), false) == s->ended.end())
      return finishStream(s, okStatus());
    std::lock_guard<std::mutex> lock(mu_);
    enqueueLocked(s);
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty() && stop_) return;
      if (queue_.empty()) continue;
      auto [at, s] = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::this_thread::sleep_until(at);
      step(s);
      lock.lock();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Script script_;
  ChoiceScript choice_script_;
  std::function<float(uint32_t)> choice_logprob_;
  size_t chunk_size_ = 1;
  std::chrono::milliseconds delay_{0};
  Status error_;
  size_t error_after_ = 0;
  uint32_t cached_ = 0;
  uint64_t queue_us_ = 0;
  uint64_t total_us_ = 0;
  bool hold_ = false;
  std::atomic<bool> honour_stop_{true};
  std::atomic<int> stop_calls_{0};
  std::atomic<int> tokens_sent_{0};
  std::vector<std::shared_ptr<Stream>> held_;
  TulipModelInfo info_;
  std::vector<GenerateCall> calls_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::shared_ptr<Stream>>> queue_;
  std::atomic<int> cancelled_{0};
  std::atomic<int> active_{0};
  std::thread worker_;  // last: started after everything above exists
};

}  // namespace garden::ivy::testing
