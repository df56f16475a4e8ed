#include "services/ivy/http/pipeline.h"

#include "services/ivy/http/router.h"

namespace garden::ivy {
namespace {

uint64_t usBetween(AdmittedRequest::Clock::time_point a, AdmittedRequest::Clock::time_point b) {
  return b > a ? static_cast<uint64_t>(
                     std::chrono::duration_cast<std::chrono::microseconds>(b - a).count())
               : 0;
}

}  // namespace

AdmittedRequest::AdmittedRequest(std::string request_id, std::shared_ptr<const ModelSpec> spec,
                                 std::shared_ptr<CallCanceller> cancel,
                                 std::shared_ptr<Admission::Ticket> ticket,
                                 std::chrono::milliseconds timeout, Times times, Responder respond)
    : request_id_(std::move(request_id)),
      spec_(std::move(spec)),
      cancel_(std::move(cancel)),
      timeout_(timeout),
      times_(times),
      ticket_(std::move(ticket)),
      respond_(std::move(respond)) {}

void AdmittedRequest::release() {
  std::shared_ptr<Admission::Ticket> ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket.swap(ticket_);
  }
  // `ticket` gives its requests and tokens back here [TAG_ADMISSION].
}

void AdmittedRequest::answer(Result<HttpResponse> response, UpstreamTimes upstream) {
  HttpResponse r = response.isOk() ? std::move(response).value() : errorResponse(response.status());
  // [TAG_TIMING_HEADERS]
  const Clock::time_point now = Clock::now();
  r.headers.emplace_back("x-garden-tokenize-us",
                         std::to_string(usBetween(times_.start, times_.tokenized)));
  r.headers.emplace_back("x-garden-queue-us", std::to_string(upstream.queue_us));
  r.headers.emplace_back("x-garden-inference-us", std::to_string(upstream.inference_us));
  r.headers.emplace_back("x-garden-upstream-us", std::to_string(usBetween(times_.sent, now)));
  r.headers.emplace_back("x-garden-total-us", std::to_string(usBetween(times_.received, now)));
  Responder respond;
  std::shared_ptr<Admission::Ticket> ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CHECK_MSG(respond_ != nullptr, "a model request was answered twice");
    respond.swap(respond_);
    ticket.swap(ticket_);
  }
  ticket.reset();  // in-flight bounds released before the response leaves
  respond(std::move(r));
}

void AdmittedRequest::answerStream(HttpResponse head) {
  CHECK(head.stream != nullptr);
  head.headers.emplace_back("x-garden-tokenize-us",
                            std::to_string(usBetween(times_.start, times_.tokenized)));
  Responder respond;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CHECK_MSG(respond_ != nullptr, "a model request was answered twice");
    respond.swap(respond_);
  }
  respond(std::move(head));
}

void AdmittedRequest::finishStream() { release(); }

}  // namespace garden::ivy
