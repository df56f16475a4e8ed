#pragma once
// Router: exact-path routing from (method, path) to a handler. Unknown paths get 404, a known path
// with another method gets 405 (with an Allow header), both as OpenAI-shaped errors produced by
// api/errors.h. Routes are added before the server starts; dispatch() is then const and may run on
// any thread concurrently. The route label (the matched pattern, or "other" for unmatched paths so
// metrics stay bounded) is returned for logs and metrics.
//
// Authentication [TAG_AUTH]: when a gate is set, it runs before every handler of a route added as
// kProtected (the default, so a route added later is protected unless it says otherwise); a
// non-OK Status from it is answered (401 via errorResponse) without calling the handler. Public
// routes (/health, /ready, /metrics: probes and scrapers carry no key) skip it. Unknown paths get
// 404 without authentication (nothing to reveal).

#include <map>
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
