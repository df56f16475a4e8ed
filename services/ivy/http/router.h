#pragma once
// Router: exact-path routing from (method, path) to a handler. Unknown paths get 404, a known path
// with another method gets 405 (with an Allow header), both as OpenAI-shaped errors produced by
// api/errors.h. Routes are added before the server starts; dispatch() is then const and may run on
// any thread concurrently. The route label (the matched pattern, or "other" for unmatched paths so
// metrics stay bounded) is returned for logs and metrics.
//
// Authentication [TAG_AUTH]: when a gate is set, it runs first, before anything about the route
// is answered: a non-OK Status from it is answered (401 via errorResponse) without calling the
// handler, and an unknown path (404) or a method the path does not serve (405) is only told to a
// caller that passed it, so a caller without a key learns nothing of what ivy serves. Routes are
// added kProtected by default (a route added later is protected unless it says otherwise); a path
// whose routes are all kPublic (/health, /ready, /metrics: probes and scrapers carry no key)
// skips the gate, wrong method included.
//
// JSON bodies [TAG_JSON_BODY]: every POST route of ivy takes a JSON body, so for POST the router
// checks, after the gate and before the handler:
//   * Content-Type: `application/json`, any case, parameters allowed (`; charset=utf-8`; a
//     charset other than utf-8 is refused); a request without Content-Type is taken as JSON
//     (clients that send JSON without saying so keep working); anything else, e.g. curl -d's
//     `application/x-www-form-urlencoded` or `text/plain`, is 415. Two Content-Type headers: 400.
//   * Content-Encoding: none or `identity`; ivy decodes no content coding, so anything else
//     (gzip, ...) is 415 rather than bytes handed to the JSON parser.
// The handlers then parse the body with parseJsonBody (api/json_body.h).

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "services/ivy/http/message.h"

namespace garden::ivy {

using Handler = std::function<void(HttpRequest, Responder)>;
using Gate = std::function<Status(const HttpRequest&)>;
enum class Access { kProtected, kPublic };

// A JSON error response for `status` (via toHttpError, incl. Retry-After; a 401 carries
// `WWW-Authenticate: Bearer realm="garden"`).
HttpResponse errorResponse(const Status& status);

// 415 Unsupported Media Type, OpenAI-shaped (type invalid_request_error, code
// unsupported_media_type). HTTP-only (no Status code means it): the router uses it for a body's
// Content-Type or Content-Encoding, the server for a transfer coding it does not decode.
HttpResponse unsupportedMediaType(std::string message);

// The 415/400 response for a POST body with these headers, or nullopt when the body is JSON as
// far as its headers tell (see [TAG_JSON_BODY] above).
std::optional<HttpResponse> checkJsonBodyHeaders(const HttpRequest& request);

class Router {
 public:
  void add(std::string_view method, std::string_view path, Handler handler,
           Access access = Access::kProtected);
  // Set before the server starts.
  void setGate(Gate gate) { gate_ = std::move(gate); }

  // Calls the matching handler (or responds with 404/405 itself). Returns the route label.
  std::string_view dispatch(HttpRequest request, Responder respond) const;

  // The label dispatch() would return, without dispatching.
  std::string_view routeLabel(std::string_view path) const;

  // (method, path) of every route, sorted (tests sweep every route with it).
  std::vector<std::pair<std::string, std::string>> routes() const;

 private:
  struct Route {
    Handler handler;
    Access access = Access::kProtected;
  };
  // path → (method → route)
  std::map<std::string, std::map<std::string, Route>, std::less<>> routes_;
  Gate gate_;
};

}  // namespace garden::ivy
