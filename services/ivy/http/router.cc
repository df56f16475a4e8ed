#include "services/ivy/http/router.h"

#include "services/ivy/api/errors.h"

namespace garden::ivy {

HttpResponse errorResponse(const Status& status) {
  HttpError e = toHttpError(status);
  HttpResponse r;
  r.status = e.status;
  r.body = renderErrorBody(e);
  if (e.retry_after_s > 0) r.headers.emplace_back("Retry-After", std::to_string(e.retry_after_s));
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"garden\"");
  return r;
}

void Router::add(std::string_view method, std::string_view path, Handler handler,
                 Access access) {
  auto& methods = routes_[std::string(path)];
  CHECK_MSG(methods.find(std::string(method)) == methods.end(), "duplicate route");
  methods.emplace(std::string(method), Route{std::move(handler), access});
}

std::string_view Router::routeLabel(std::string_view path) const {
  auto it = routes_.find(path);
  return it == routes_.end() ? std::string_view("other") : std::string_view(it->first);
}

std::string_view Router::dispatch(HttpRequest request, Responder respond) const {
  auto it = routes_.find(std::string_view(request.path));
  if (it == routes_.end()) {
    respond(errorResponse(notFound("Unknown route " + request.method + " " + request.path)));
    return "other";
  }
  std::string_view label = it->first;
  auto m = it->second.find(request.method);
  if (m == it->second.end()) {
    // HEAD is not served; clients use GET.
    HttpResponse r = errorResponse(
        unimplemented("Method " + request.method + " is not allowed on " + request.path));
    std::string allow;
    for (const auto& [name, h] : it->second) {
      if (!allow.empty()) allow += ", ";
      allow += name;
    }
    r.headers.emplace_back("Allow", std::move(allow));
    respond(std::move(r));
    return label;
  }
  if (gate_ && m->second.access == Access::kProtected) {
    if (Status st = gate_(request); !st.isOk()) {
      respond(errorResponse(st));
      return label;
    }
  }
  m->second.handler(std::move(request), std::move(respond));
  return label;
}

}  // namespace garden::ivy
