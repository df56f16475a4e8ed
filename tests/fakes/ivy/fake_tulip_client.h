#pragma once
// FakeTulipClient: an in-memory TulipClient for ivy tests. Callbacks run on the fake's own worker
// thread (like gRPC's callback threads), never inline in the caller. Thread-safe.
//
// Embeddings are deterministic functions of the token ids: row i of an input with ids t is
//   v[j] = (1 + j) * (1 + sum(t) % 7), then L2-normalized,
// so a test can recompute the expected vector with fakeEmbedding(); a score is fakeScore(ids).
// Generate streams max_tokens chunks of one token each (ids 100, 101, …) and finishes kLength;
// with n > 1, choice c's chunks (index c) carry 100 + i + 1000 c, interleaved token by token, and
// (logprobs asked) logprob -0.25 (c + 1) each.
// Errors (persistent or scripted for the next N calls of a method), delays, holding replies until
// released, health, load and model info are configurable; calls are recorded. Calls carrying a
// CallCanceller end with CANCELLED when it fires before their reply was sent.

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "services/ivy/balance/tulip_client.h"

namespace garden::ivy {

inline std::vector<float> fakeEmbedding(const std::vector<int32_t>& ids, uint32_t dim) {
  int64_t sum = 0;
  for (int32_t id : ids) sum += id;
  std::vector<float> v(dim);
  double norm = 0;
  for (uint32_t j = 0; j < dim; ++j) {
    v[j] = static_cast<float>((1 + j) * (1 + sum % 7));
    norm += double(v[j]) * v[j];
  }
  norm = std::sqrt(norm);
  for (float& x : v) x = static_cast<float>(x / norm);
  return v;
}

inline float fakeScore(const std::vector<int32_t>& ids) {
  int64_t sum = 0;
  for (int32_t id : ids) sum += id;
  return static_cast<float>(sum % 1000) / 1000.f;
}

class FakeTulipClient final : public TulipClient {
 public:
  enum class Method { kEmbed, kScore, kGenerate, kHealth, kModelInfo, kLoad };

  explicit FakeTulipClient(std::string endpoint = "fake:0")
      : endpoint_(std::move(endpoint)), worker_([this] { run(); }) {
    info_.model = "fake-model";
    info_.kind = "embedding";
    info_.hidden_size = 8;
    info_.max_seq_len = 32;
    info_.vocab_size = 1000;
  }
  ~FakeTulipClient() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      for (auto& t : held_) queue_.push_back(std::move(t));  // held replies still answer
      held_.clear();
    }
    cv_.notify_all();
    worker_.join();
  }

  // --- configuration ---
  void setModelInfo(TulipModelInfo info) {
    std::lock_guard<std::mutex> lock(mu_);
    info_ = std::move(info);
  }
  void setModelInfoError(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    model_info_error_ = std::move(s);
  }
  void setHealth(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    health_ = std::move(s);
  }
  // Every following embed() fails with `s` (OK status: succeed again).
  void setEmbedError(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    embed_error_ = std::move(s);
  }
  // Every following call of `m` fails with `s` (OK: succeed again). kEmbed is setEmbedError.
  void setError(Method m, Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (m == Method::kEmbed) {
      embed_error_ = std::move(s);
    } else if (m == Method::kHealth) {
      health_ = std::move(s);
    } else if (m == Method::kModelInfo) {
      model_info_error_ = std::move(s);
    } else {
      errors_[m] = std::move(s);
    }
  }
  // The next `count` calls of `m` fail with `s` (before any persistent error applies).
  void failNext(Method m, Status s, int count = 1) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < count; ++i) scripted_[m].push_back(s);
  }
  void setEmbedDelay(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> lock(mu_);
    embed_delay_ = d;
  }
  // Runs on the worker thread when an embed/score call is answered, before its callback.
  void setOnReply(std::function<void(Method)> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    on_reply_ = std::move(fn);
  }
  // While on, embed/score/generate replies are parked until releaseHeld() (or cancellation).
  void setHold(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = on;
  }
  void releaseHeld() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : held_) queue_.push_back(std::move(t));
    held_.clear();
    cv_.notify_all();
  }
  size_t heldCount() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  void setLoad(TulipLoad l) {
    std::lock_guard<std::mutex> lock(mu_);
    load_ = l;
  }
  // Generate fails with `s` after sending `after_chunks` chunks (OK: no failure).
  void setGenerateFailure(Status s, uint32_t after_chunks) {
    std::lock_guard<std::mutex> lock(mu_);
    generate_failure_ = std::move(s);
    generate_fail_after_ = after_chunks;
  }

  // --- observation ---
  std::vector<EmbedCall> embedCalls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::vector<ScoreCall> scoreCalls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return score_calls_;
  }
  std::vector<GenerateCall> generateCalls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return generate_calls_;
  }
  int modelInfoCalls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return model_info_calls_;
  }
  int healthCalls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return health_calls_;
  }
  int loadCalls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return load_calls_;
  }
  // Calls that ended CANCELLED because their CallCanceller fired first.
  int cancelledCalls() const { return cancelled_calls_.load(); }

  // --- TulipClient ---
  void embed(EmbedCall call, EmbedDone done) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(call);
    Status err = takeError(Method::kEmbed);
    uint32_t dim = info_.hidden_size;
    auto cancelled = watchCancel(call.cancel);
    auto fn = [this, call = std::move(call), done = std::move(done), err, dim, cancelled]() {
      unwatch(call.cancel, cancelled);
      if (cancelled->fired.load()) {
        ++cancelled_calls_;
        return done(cancelledError("fake: cancelled"));
      }
      notifyReply(Method::kEmbed);
      if (!err.isOk()) return done(err);
      EmbedReply r;
      r.dim = dim;
      for (const auto& ids : call.inputs) {
        std::vector<float> v = fakeEmbedding(ids, dim);
        r.values.insert(r.values.end(), v.begin(), v.end());
        r.prompt_tokens += ids.size();
      }
      r.queue_us = 10 * call.inputs.size();
      r.inference_us = 100 + call.inputs.size();
      r.total_us = r.queue_us + r.inference_us;
      done(std::move(r));
    };
    enqueue(embed_delay_, std::move(fn), /*holdable=*/true, cancelled);
  }

  void score(ScoreCall call, ScoreDone done) override {
    std::lock_guard<std::mutex> lock(mu_);
    score_calls_.push_back(call);
    Status err = takeError(Method::kScore);
    auto cancelled = watchCancel(call.cancel);
    auto fn = [this, call = std::move(call), done = std::move(done), err, cancelled]() {
      unwatch(call.cancel, cancelled);
      if (cancelled->fired.load()) {
        ++cancelled_calls_;
        return done(cancelledError("fake: cancelled"));
      }
      notifyReply(Method::kScore);
      if (!err.isOk()) return done(err);
      ScoreReply r;
      for (const auto& ids : call.inputs) {
        r.scores.push_back(fakeScore(ids));
        r.prompt_tokens += ids.size();
      }
      r.queue_us = 7;
      r.inference_us = 50 + call.inputs.size();
      r.total_us = r.queue_us + r.inference_us;
      done(std::move(r));
    };
    enqueue(embed_delay_, std::move(fn), /*holdable=*/true, cancelled);
  }

  std::shared_ptr<GenerateStream> generate(GenerateCall call, ChunkFn on_chunk,
                                           StreamDone on_done) override {
    struct Stream final : GenerateStream {
      std::atomic<bool> cancelled{false};
      void cancel() override { cancelled.store(true); }
    };
    auto stream = std::make_shared<Stream>();
    std::lock_guard<std::mutex> lock(mu_);
    generate_calls_.push_back(call);
    Status err = takeError(Method::kGenerate);
    Status fail = generate_failure_;
    uint32_t fail_after = generate_fail_after_;
    auto fn = [stream, call = std::move(call), on_chunk = std::move(on_chunk),
               on_done = std::move(on_done), err, fail, fail_after]() {
      if (!err.isOk()) return on_done(err);
      const uint32_t n = std::max<uint32_t>(call.n, 1);
      for (uint32_t i = 0; i < call.max_tokens; ++i) {
        if (stream->cancelled.load()) return on_done(cancelledError("fake: cancelled"));
        if (!fail.isOk() && i == fail_after) return on_done(fail);
        for (uint32_t c = 0; c < n; ++c) {  // choice c's token i: 100 + i + 1000 c
          GenerateChunkMsg m;
          m.index = c;
          m.token_ids = {static_cast<int32_t>(100 + i + 1000 * c)};
          if (call.logprobs) {
            llm::LlmTokenLogprobs lp;
            lp.logprob = -0.25f * static_cast<float>(c + 1);  // choice 0 the most likely
            lp.num_top = 0;
            m.logprobs.push_back(lp);
          }
          if (i + 1 == call.max_tokens) {
            m.finish = FinishReason::kLength;
            m.prompt_tokens = static_cast<uint32_t>(call.prompt_ids.size());
            m.completion_tokens = call.max_tokens;
          }
          on_chunk(std::move(m));
        }
      }
      on_done(okStatus());
    };
    enqueue({}, std::move(fn), /*holdable=*/true, nullptr);
    return stream;
  }

  void modelInfo(std::chrono::milliseconds, ModelInfoDone done) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++model_info_calls_;
    Status err = takeError(Method::kModelInfo);
    TulipModelInfo info = info_;
    enqueue({}, [done = std::move(done), err, info]() {
      if (!err.isOk()) return done(err);
      done(info);
    });
  }

  void health(std::chrono::milliseconds, HealthDone done) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++health_calls_;
    Status h = takeError(Method::kHealth);
    enqueue({}, [done = std::move(done), h]() { done(h); });
  }

  void load(std::chrono::milliseconds, LoadDone done) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++load_calls_;
    Status err = takeError(Method::kLoad);
    TulipLoad l = load_;
    enqueue({}, [done = std::move(done), err, l]() {
      if (!err.isOk()) return done(err);
      done(l);
    });
  }

  std::string endpoint() const override { return endpoint_; }

 private:
  struct CancelWatch {
    std::atomic<bool> fired{false};
    uint64_t hook = 0;
  };
  struct Task {
    std::chrono::steady_clock::time_point at;
    std::function<void()> fn;
    std::shared_ptr<CancelWatch> cancel;
  };

  // mu_ held. Scripted errors first, then the persistent one.
  Status takeError(Method m) {
    auto it = scripted_.find(m);
    if (it != scripted_.end() && !it->second.empty()) {
      Status s = it->second.front();
      it->second.pop_front();
      return s;
    }
    if (m == Method::kEmbed) return embed_error_;
    if (m == Method::kHealth) return health_;
    if (m == Method::kModelInfo) return model_info_error_;
    auto e = errors_.find(m);
    return e == errors_.end() ? okStatus() : e->second;
  }

  // mu_ held. A cancelled call parked by hold is answered at once. The hook may run inline
  // (already cancelled) or on any thread: it takes no lock, the worker notices within 10 ms.
  std::shared_ptr<CancelWatch> watchCancel(const std::shared_ptr<CallCanceller>& c) {
    auto w = std::make_shared<CancelWatch>();
    if (!c) return w;
    std::weak_ptr<CancelWatch> weak = w;
    w->hook = c->add([this, weak] {
      auto s = weak.lock();
      if (!s) return;
      s->fired.store(true);
      poke_.store(true);
      cv_.notify_all();
    });
    return w;
  }
  void unwatch(const std::shared_ptr<CallCanceller>& c, const std::shared_ptr<CancelWatch>& w) {
    if (c) c->remove(w->hook);
  }
  void unparkCancelled() {  // mu_ held
    poke_.store(false);
    for (size_t i = 0; i < held_.size();) {
      if (held_[i].cancel && held_[i].cancel->fired.load()) {
        queue_.push_back(std::move(held_[i]));
        held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  void notifyReply(Method m) {
    std::function<void(Method)> fn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn = on_reply_;
    }
    if (fn) fn(m);
  }

  void enqueue(std::chrono::milliseconds delay, std::function<void()> fn, bool holdable = false,
               std::shared_ptr<CancelWatch> cancel = nullptr) {  // mu_ held
    Task t{std::chrono::steady_clock::now() + delay, std::move(fn), std::move(cancel)};
    if (holdable && hold_ && !(t.cancel && t.cancel->fired.load())) {
      held_.push_back(std::move(t));
      return;
    }
    queue_.push_back(std::move(t));
    cv_.notify_all();
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait_for(lock, std::chrono::milliseconds(10),
                   [this] { return stop_ || !queue_.empty() || poke_.load(); });
      if (poke_.load()) unparkCancelled();
      if (queue_.empty() && stop_) return;
      if (queue_.empty()) continue;
      Task t = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      if (!(t.cancel && t.cancel->fired.load())) std::this_thread::sleep_until(t.at);
      t.fn();
      lock.lock();
    }
  }

  const std::string endpoint_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Task> queue_;
  std::vector<Task> held_;
  bool hold_ = false;
  std::atomic<bool> poke_{false};  // a cancel hook fired: unpark cancelled held calls
  TulipModelInfo info_;
  Status model_info_error_;
  Status health_;
  Status embed_error_;
  std::map<Method, Status> errors_;
  std::map<Method, std::deque<Status>> scripted_;
  Status generate_failure_;
  uint32_t generate_fail_after_ = 0;
  TulipLoad load_;
  std::function<void(Method)> on_reply_;
  std::chrono::milliseconds embed_delay_{0};
  std::vector<EmbedCall> calls_;
  std::vector<ScoreCall> score_calls_;
  std::vector<GenerateCall> generate_calls_;
  int model_info_calls_ = 0;
  int health_calls_ = 0;
  int load_calls_ = 0;
  std::atomic<int> cancelled_calls_{0};
  std::thread worker_;  // last: starts after every other member is constructed
};

}  // namespace garden::ivy
