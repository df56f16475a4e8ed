#pragma once
// Router: exact-path routing from (method, path) to a handler. Unknown paths get 404, a known path
// with another method gets 405 (with an Allow header), both as OpenAI-shaped errors produced by
// api/errors.h. Routes are added before the server starts; dispatch() is then const and may run on
// any thread concurrently. The route label (the matched pattern, or "other" for unmatched paths so
// metrics stay bounded) is returned for logs and metrics.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "services/ivy/http/message.h"

namespace garden::ivy {

using Handler = std::function<void(HttpRequest, Responder)>;

// A JSON error response for `status` (via toHttpError, incl. Retry-After) .
HttpResponse errorResponse(const Status& status);

class Router {
 public:
  void add(std::string_view method, std::string_view path, Handler handler);

  // Calls the matching handler (or responds with 404/405 itself). Returns the route label.
  std::string_view dispatch(HttpRequest request, Responder respond) const;

  // The label dispatch() would return, without dispatching.
  std::string_view routeLabel(std::string_view path) const;

 private:
  // path → (method → handler)
  std::map<std::string, std::map<std::string, Handler>, std::less<>> routes_;
};

}  // namespace garden::ivy
