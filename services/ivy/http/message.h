#pragma once
// HttpRequest / HttpResponse: plain structs between the Beast server (server.cc, the only file that
// sees Beast) and the router and route handlers, so those are testable without sockets.
// A Responder delivers exactly one response for a request; it may be called from any thread (a
// plain response is sent from that thread without blocking, the rest is the connection strand's:
// server.cc [TAG_DIRECT_WRITE]). Calling it more than once is a bug and CHECK-fails.
//
// Client gone [TAG_CLIENT_DISCONNECT]: the server fires HttpRequest::cancel when the client closes
// (or resets) the connection while the request waits for its response. A handler that starts
// upstream work hands `cancel` on (EmbedCall::cancel, or a hook that cancels its Generate streams)
// so that work stops. Its Responder may still be called (that response is dropped) or simply be
// destroyed.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "services/ivy/balance/call_canceller.h"

namespace garden::ivy {

class ResponseStream;  // http/response_stream.h

struct HttpRequest {
  std::string method;                                        // "GET", "POST", ... as sent
  std::string path;                                          // target without the query string
  std::string query;                                         // after '?', may be empty
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  std::string request_id;  // x-request-id as received (sanitized) or generated
  std::chrono::steady_clock::time_point received;
  // Fired by the server when the client goes away before the response (never null from the
  // server; tests may leave it null).
  std::shared_ptr<CallCanceller> cancel;

  // First header with this (lower-case) name, or "".
  std::string_view header(std::string_view lower_name) const {
    for (const auto& [k, v] : headers) {
      if (k == lower_name) return v;
    }
    return {};
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  std::string body;
  // Set: a streamed body (chunked; `body` is ignored), see http/response_stream.h.
  std::shared_ptr<ResponseStream> stream;
};

using Responder = std::function<void(HttpResponse)>;

}  // namespace garden::ivy
