#pragma once
// Admission: ivy's own overload bound [TAG_ADMISSION]. Counts the model requests (embeddings,
// score, rerank) in flight and the tokens they carry; a request over either bound is refused with
// RESOURCE_EXHAUSTED (429 + Retry-After) before it costs anything:
//   1. admit(), first thing in the handler, before the body is parsed: refused when
//      `max_requests` are in flight or the token bound is already reached;
//   2. addTokens(), right after tokenization, before the upstream call: refused when the request's
//      tokens would take the in-flight total past `max_tokens` (unless nothing else is in flight,
//      so a request within the per-request limits is never refused on an idle server).
// The Ticket returns what it took when destroyed (the handler keeps it alive in the upstream
// callback). 0 for a bound disables it. Lock-free; thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace garden::ivy {

class Admission {
 public:
  Admission(uint64_t max_requests, uint64_t max_tokens)
      : max_requests_(max_requests), max_tokens_(max_tokens) {}

  class Ticket {
   public:
    explicit Ticket(Admission* a) : a_(a) {}
    ~Ticket() {
      a_->requests_.fetch_sub(1, std::memory_order_relaxed);
      a_->tokens_.fetch_sub(tokens_, std::memory_order_relaxed);
    }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

   private:
    friend class Admission;
    Admission* a_;
    uint64_t tokens_ = 0;
  };

  Result<std::shared_ptr<Ticket>> admit() {
    uint64_t n = requests_.fetch_add(1, std::memory_order_relaxed) + 1;
    auto ticket = std::make_shared<Ticket>(this);  // gives the count back on every path
    if (max_requests_ > 0 && n > max_requests_) {
      return resourceExhausted("ivy is at its limit of " + std::to_string(max_requests_) +
                               " requests in flight (--max-inflight-requests); retry later");
    }
    if (max_tokens_ > 0 && tokens_.load(std::memory_order_relaxed) >= max_tokens_) {
      return resourceExhausted("ivy is at its limit of " + std::to_string(max_tokens_) +
                               " tokens in flight (--max-inflight-tokens); retry later");
    }
    return ticket;
  }

  Status addTokens(Ticket& t, uint64_t n) {
    uint64_t before = tokens_.fetch_add(n, std::memory_order_relaxed);
    t.tokens_ += n;
    if (max_tokens_ > 0 && before > 0 && before + n > max_tokens_) {
      return resourceExhausted("ivy is at its limit of " + std::to_string(max_tokens_) +
                               " tokens in flight (--max-inflight-tokens); this request's " +
                               std::to_string(n) + " tokens do not fit now; retry later");
    }
    return okStatus();
  }

  uint64_t requestsInFlight() const { return requests_.load(std::memory_order_relaxed); }
  uint64_t tokensInFlight() const { return tokens_.load(std::memory_order_relaxed); }

 private:
  const uint64_t max_requests_;
  const uint64_t max_tokens_;
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> tokens_{0};
};

}  // namespace garden::ivy
