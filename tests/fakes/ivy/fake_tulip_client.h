#pragma once
// FakeTulipClient: an in-memory TulipClient for ivy tests. Callbacks run on the fake's own worker
// thread (like gRPC's callback threads), never inline in the caller. Thread-safe.
//
// Embeddings are deterministic functions of the token ids: row i of an input with ids t is
//   v[j] = (1 + j) * (1 + sum(t) % 7), then L2-normalized,
// so a test can recompute the expected vector with fakeEmbedding(). Errors, health and model info
// are configurable; calls are recorded.

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
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

class FakeTulipClient final : public TulipClient {
 public:
  FakeTulipClient() : worker_([this] { run(); }) {
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
  void setEmbedDelay(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> lock(mu_);
    embed_delay_ = d;
  }

  // --- observation ---
  std::vector<EmbedCall> embedCalls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  int modelInfoCalls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return model_info_calls_;
  }

  // --- TulipClient ---
  void embed(EmbedCall call, EmbedDone done) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(call);
    Status err = embed_error_;
    uint32_t dim = info_.hidden_size;
    auto delay = embed_delay_;
    enqueue(delay, [call = std::move(call), done = std::move(done), err, dim]() {
      if (!err.isOk()) return done(err);
      EmbedReply r;
      r.dim = dim;
      for (const auto& ids : call.inputs) {
        std::vector<float> v = fakeEmbedding(ids, dim);
        r.values.insert(r.values.end(), v.begin(), v.end());
        r.prompt_tokens += ids.size();
      }
      done(std::move(r));
    });
  }

  void modelInfo(std::chrono::milliseconds, ModelInfoDone done) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++model_info_calls_;
    Status err = model_info_error_;
    TulipModelInfo info = info_;
    enqueue({}, [done = std::move(done), err, info]() {
      if (!err.isOk()) return done(err);
      done(info);
    });
  }

  void health(std::chrono::milliseconds, HealthDone done) override {
    std::lock_guard<std::mutex> lock(mu_);
    Status h = health_;
    enqueue({}, [done = std::move(done), h]() { done(h); });
  }

  std::string endpoint() const override { return "fake:0"; }

 private:
  struct Task {
    std::chrono::steady_clock::time_point at;
    std::function<void()> fn;
  };

  void enqueue(std::chrono::milliseconds delay, std::function<void()> fn) {  // mu_ held
    queue_.push_back(Task{std::chrono::steady_clock::now() + delay, std::move(fn)});
    cv_.notify_all();
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty() && stop_) return;
      if (queue_.empty()) continue;
      Task t = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::this_thread::sleep_until(t.at);
      t.fn();
      lock.lock();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Task> queue_;
  TulipModelInfo info_;
  Status model_info_error_;
  Status health_;
  Status embed_error_;
  std::chrono::milliseconds embed_delay_{0};
  std::vector<EmbedCall> calls_;
  int model_info_calls_ = 0;
  std::thread worker_;  // last: starts after every other member is constructed
};

}  // namespace garden::ivy
