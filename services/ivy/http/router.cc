#include "services/ivy/http/router.h"

#include "services/ivy/api/errors.h"
#include "services/ivy/http/header_text.h"

namespace garden::ivy {
namespace {

constexpr size_t kMaxShownHeader = 100;  // bytes of a refused header value quoted back

std::string quoted(std::string_view v) {
  return "\"" + std::string(v.substr(0, kMaxShownHeader)) + "\"";
}

// The first content coding of a Content-Encoding value other than identity, or "".
std::string_view unsupportedCoding(std::string_view value) {
  std::vector<std::string_view> codings;
  appendListElements(value, &codings);
  for (std::string_view c : codings) {
    if (!equalsIgnoreCase(c, "identity")) return c;
  }
  return {};
}

}  // namespace

HttpResponse errorResponse(const Status& status) {
  HttpError e = toHttpError(status);
  HttpResponse r;
  r.status = e.status;
  r.body = renderErrorBody(e);
  if (e.retry_after_s > 0) r.headers.emplace_back("Retry-After", std::to_string(e.retry_after_s));
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"garden\"");
  return r;
}

HttpResponse unsupportedMediaType(std::string message) {
  HttpError e;
  e.status = 415;
  e.type = "invalid_request_error";
  e.code = "unsupported_media_type";
  e.message = std::move(message);
  HttpResponse r;
  r.status = e.status;
  r.body = renderErrorBody(e);
  return r;
}

std::optional<HttpResponse> checkJsonBodyHeaders(const HttpRequest& request) {
  int content_types = 0;
  std::string_view content_type;
  for (const auto& [name, value] : request.headers) {
    if (name == "content-type") {
      ++content_types;
      content_type = value;
    } else if (name == "content-encoding") {
      if (std::string_view c = unsupportedCoding(value); !c.empty()) {
        return unsupportedMediaType("Content-Encoding " + quoted(c) +
                                    " is not supported: ivy decodes no content coding; send the "
                                    "JSON body as it is (Content-Encoding: identity or none)");
      }
    }
  }
  if (content_types > 1) {
    return errorResponse(invalidArgument("Content-Type is given more than once"));
  }
  if (content_types == 0) return std::nullopt;  // taken as JSON [TAG_JSON_BODY]
  const size_t semi = content_type.find(';');
  const std::string_view media = trimBlanks(content_type.substr(0, semi));
  if (!equalsIgnoreCase(media, "application/json")) {
    return unsupportedMediaType("Content-Type must be application/json, got " +
                                quoted(content_type));
  }
  std::string_view params =
      semi == std::string_view::npos ? std::string_view() : content_type.substr(semi + 1);
  while (!params.empty()) {
    size_t next = params.find(';');
    std::string_view param = trimBlanks(params.substr(0, next));
    size_t eq = param.find('=');
    if (eq != std::string_view::npos && equalsIgnoreCase(trimBlanks(param.substr(0, eq)), "charset")) {
      std::string_view cs = trimBlanks(param.substr(eq + 1));
      if (cs.size() >= 2 && cs.front() == '"' && cs.back() == '"') cs = cs.substr(1, cs.size() - 2);
      if (!equalsIgnoreCase(cs, "utf-8") && !equalsIgnoreCase(cs, "utf8")) {
        return unsupportedMediaType("Content-Type charset must be utf-8 (JSON is UTF-8), got " +
                                    quoted(cs));
      }
    }
    if (next == std::string_view::npos) break;
    params.remove_prefix(next + 1);
  }
  return std::nullopt;
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

std::vector<std::pair<std::string, std::string>> Router::routes() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [path, methods] : routes_) {
    for (const auto& [method, route] : methods) out.emplace_back(method, path);
  }
  return out;
}

std::string_view Router::dispatch(HttpRequest request, Responder respond) const {
  auto it = routes_.find(std::string_view(request.path));
  const std::string_view label = it == routes_.end() ? std::string_view("other")
                                                     : std::string_view(it->first);
  const Route* route = nullptr;
  if (it != routes_.end()) {
    auto m = it->second.find(request.method);
    if (m != it->second.end()) route = &m->second;
  }
  // [TAG_AUTH] The gate first: for an unknown path, a protected route, and a wrong method on a
  // path that has a protected route.
  bool needs_gate = true;
  if (it != routes_.end()) {
    if (route != nullptr) {
      needs_gate = route->access == Access::kProtected;
    } else {
      needs_gate = false;
      for (const auto& [name, r] : it->second) {
        needs_gate = needs_gate || r.access == Access::kProtected;
      }
    }
  }
  if (gate_ && needs_gate) {
    if (Status st = gate_(request); !st.isOk()) {
      respond(errorResponse(st));
      return label;
    }
  }
  if (it == routes_.end()) {
    respond(errorResponse(notFound("Unknown route " + request.method + " " + request.path)));
    return label;
  }
  if (route == nullptr) {
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
  if (request.method == "POST") {  // [TAG_JSON_BODY]
    if (std::optional<HttpResponse> refused = checkJsonBodyHeaders(request)) {
      respond(std::move(*refused));
      return label;
    }
  }
  route->handler(std::move(request), std::move(respond));
  return label;
}

}  // namespace garden::ivy
