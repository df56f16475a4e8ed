#pragma once
// What a model route and ivy's request pipeline hand each other [TAG_PIPELINE]. The pipeline
// itself (auth → admission → deadline → model kind → the route's parse and tokenize → admission of
// its tokens → pool call → one answer) is IvyService::serveModel (http/service.h); a route supplies
// only its own steps:
//   * prepare: parse the body within the limits and tokenize or render it, returning a
//     PreparedCall: the tokens the request holds against --max-inflight-tokens while it runs, and
//     `send`, which starts the upstream call once the pipeline has admitted those tokens;
//   * send gets the AdmittedRequest and answers through it, exactly once: answer() (a response, or
//     a Status that is mapped to HTTP there and nowhere else) or, for a streamed response,
//     answerStream() then finishStream() when the body has ended.
//
// AdmittedRequest owns the request's admission ticket (released by answer() / finishStream(), so
// a generation holds its tokens until its stream ends) and its stage times, from which it writes
// the x-garden-* timing headers [TAG_TIMING_HEADERS] (microseconds):
//   x-garden-tokenize-us   handler start → ids ready (parse, validate, template, tokenize)
//   x-garden-queue-us      tulip: waiting for a batch / to be first scheduled   } from tulip
//   x-garden-inference-us  tulip: batch submitted → result / generation time    }
//   x-garden-upstream-us   ivy: gRPC call sent → reply (queue + inference + transport)
//   x-garden-total-us      ivy: request head received → response rendered
// so tokenize + upstream <= total and queue + inference <= upstream (up to clock rounding). A
// streamed response's head carries x-garden-tokenize-us only: nothing else is known when it is
// sent (tulip reports its timings with the last chunk).
//
// Thread-safe: answer(), answerStream() and finishStream() may run on any thread (the client's
// callback threads); the route guarantees the exactly-once order above.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "services/ivy/api/model_spec.h"
#include "services/ivy/balance/call_canceller.h"
#include "services/ivy/http/admission.h"
#include "services/ivy/http/message.h"

namespace garden::ivy {

// tulip's stage timings of one answer (max over chunks or choices when there are several).
struct UpstreamTimes {
  uint64_t queue_us = 0;
  uint64_t inference_us = 0;
};

class AdmittedRequest {
 public:
  using Clock = std::chrono::steady_clock;
  struct Times {
    Clock::time_point received;   // request head received (HttpRequest::received)
    Clock::time_point start;      // handler started
    Clock::time_point tokenized;  // the route's prepare step finished
    Clock::time_point sent;       // the upstream call started
  };

  AdmittedRequest(std::string request_id, std::shared_ptr<const ModelSpec> spec,
                  std::shared_ptr<CallCanceller> cancel, std::shared_ptr<Admission::Ticket> ticket,
                  std::chrono::milliseconds timeout, Times times, Responder respond);
  AdmittedRequest(const AdmittedRequest&) = delete;
  AdmittedRequest& operator=(const AdmittedRequest&) = delete;

  const std::string& requestId() const { return request_id_; }
  const ModelSpec& spec() const { return *spec_; }
  // The deadline of the upstream call: the time the request had left when it was sent (0 = none).
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Fired when the client goes away before the response (null in tests that leave it out).
  const std::shared_ptr<CallCanceller>& cancel() const { return cancel_; }

  // The answer: `response`, or errorResponse(status) for an error (the one Status → HTTP
  // mapping), with every timing header; releases the admission first.
  void answer(Result<HttpResponse> response, UpstreamTimes upstream = {});
  // A streamed answer's head (its `stream` set): sent with x-garden-tokenize-us; the admission is
  // held until finishStream().
  void answerStream(HttpResponse head);
  // The streamed body ended, or its client went away: releases the admission. Idempotent.
  void finishStream();

 private:
  void release();

  const std::string request_id_;
  const std::shared_ptr<const ModelSpec> spec_;
  const std::shared_ptr<CallCanceller> cancel_;
  const std::chrono::milliseconds timeout_;
  const Times times_;
  std::mutex mu_;
  std::shared_ptr<Admission::Ticket> ticket_;  // guarded by mu_; null once released
  Responder respond_;                          // guarded by mu_; null once used
};

// A prepared model request (see above).
struct PreparedCall {
  uint64_t tokens = 0;  // held against --max-inflight-tokens until the answer
  std::function<void(std::shared_ptr<AdmittedRequest>)> send;
};

}  // namespace garden::ivy
