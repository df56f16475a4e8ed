#include "services/ivy/http/router.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace garden::ivy {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Pair;

HttpRequest req(std::string method, std::string path) {
  HttpRequest r;
  r.method = std::move(method);
  r.path = std::move(path);
  return r;
}

struct Captured {
  int calls = 0;
  HttpResponse response;
  Responder responder() {
    return [this](HttpResponse r) {
      ++calls;
      response = std::move(r);
    };
  }
};

TEST(Router, DispatchesByMethodAndExactPath) {
  Router router;
  std::string seen;
  router.add("GET", "/a", [&](HttpRequest r, Responder d) {
    seen = "GET /a " + r.body;
    d(HttpResponse{200, "text/plain", {}, "A"});
  });
  router.add("POST", "/a", [&](HttpRequest, Responder d) {
    seen = "POST /a";
    d(HttpResponse{201, "text/plain", {}, "B"});
  });
  Captured c;
  HttpRequest r = req("GET", "/a");
  r.body = "x";
  EXPECT_EQ(router.dispatch(std::move(r), c.responder()), "/a");
  EXPECT_EQ(seen, "GET /a x");
  EXPECT_EQ(c.response.status, 200);
  Captured c2;
  EXPECT_EQ(router.dispatch(req("POST", "/a"), c2.responder()), "/a");
  EXPECT_EQ(seen, "POST /a");
  EXPECT_EQ(c2.response.status, 201);
}

TEST(Router, UnknownPathIs404WithBoundedLabel) {
  Router router;
  router.add("GET", "/a", [](HttpRequest, Responder d) { d(HttpResponse{}); });
  for (std::string path : {"/b", "/a/", "/A", "", "/a?x"}) {
    Captured c;
    EXPECT_EQ(router.dispatch(req("GET", path), c.responder()), "other") << path;
    EXPECT_EQ(c.calls, 1);
    EXPECT_EQ(c.response.status, 404);
    EXPECT_THAT(c.response.body, HasSubstr("\"type\":\"invalid_request_error\""));
    EXPECT_THAT(c.response.body, HasSubstr("Unknown route"));
  }
  EXPECT_EQ(router.routeLabel("/a"), "/a");
  EXPECT_EQ(router.routeLabel("/zzz"), "other");
}

TEST(Router, WrongMethodIs405WithAllow) {
  Router router;
  router.add("GET", "/m", [](HttpRequest, Responder d) { d(HttpResponse{}); });
  router.add("POST", "/m", [](HttpRequest, Responder d) { d(HttpResponse{}); });
  Captured c;
  EXPECT_EQ(router.dispatch(req("DELETE", "/m"), c.responder()), "/m");
  EXPECT_EQ(c.response.status, 405);
  EXPECT_THAT(c.response.headers, Contains(Pair("Allow", "GET, POST")));
  EXPECT_THAT(c.response.body, HasSubstr("method_not_allowed"));
}

// [TAG_AUTH] With a gate, nothing about the routes is told to a caller that does not pass it:
// an unknown path and a wrong method are 401 like a known route; with the key they are 404/405.
// A path whose routes are all public skips the gate, wrong method included.
TEST(Router, AuthenticatesBeforeRevealingRoutes) {
  Router router;
  int handled = 0;
  router.add("POST", "/v1/x", [&](HttpRequest, Responder d) {
    ++handled;
    d(HttpResponse{});
  });
  router.add(
      "GET", "/health", [&](HttpRequest, Responder d) { d(HttpResponse{}); }, Access::kPublic);
  router.setGate([](const HttpRequest& r) {
    return r.header("authorization") == "Bearer k" ? okStatus() : unauthenticated("no key");
  });
  auto status = [&](std::string method, std::string path, bool key) {
    HttpRequest r = req(std::move(method), std::move(path));
    if (key) r.headers.emplace_back("authorization", "Bearer k");
    Captured c;
    router.dispatch(std::move(r), c.responder());
    EXPECT_EQ(c.calls, 1);
    return c.response.status;
  };
  EXPECT_EQ(status("GET", "/nope", false), 401);
  EXPECT_EQ(status("GET", "/nope", true), 404);
  EXPECT_EQ(status("GET", "/v1/x", false), 401);
  EXPECT_EQ(status("GET", "/v1/x", true), 405);
  EXPECT_EQ(status("POST", "/v1/x", false), 401);
  EXPECT_EQ(handled, 0);
  EXPECT_EQ(status("POST", "/v1/x", true), 200);
  EXPECT_EQ(handled, 1);
  EXPECT_EQ(status("GET", "/health", false), 200);
  EXPECT_EQ(status("POST", "/health", false), 405);
  // The 401 goes out before a body check too.
  HttpRequest form = req("POST", "/v1/x");
  form.headers.emplace_back("content-type", "text/plain");
  Captured c;
  router.dispatch(std::move(form), c.responder());
  EXPECT_EQ(c.response.status, 401);
}

// [TAG_JSON_BODY] POST bodies must be JSON as far as the headers tell.
TEST(Router, PostBodyMustBeJsonByItsHeaders) {
  Router router;
  int handled = 0;
  auto h = [&](HttpRequest, Responder d) {
    ++handled;
    d(HttpResponse{});
  };
  router.add("POST", "/p", h);
  router.add("GET", "/g", h);
  auto status = [&](std::string method, std::string path,
                    std::vector<std::pair<std::string, std::string>> headers) {
    HttpRequest r = req(std::move(method), std::move(path));
    r.headers = std::move(headers);
    Captured c;
    router.dispatch(std::move(r), c.responder());
    EXPECT_EQ(c.calls, 1);
    return c.response;
  };
  for (const char* ok : {"application/json", "Application/JSON", "application/json; charset=utf-8",
                         "application/json;charset=UTF-8", "application/json; charset=\"utf-8\"",
                         " application/json ", "application/json; foo=bar"}) {
    const int before = handled;
    EXPECT_EQ(status("POST", "/p", {{"content-type", ok}}).status, 200) << ok;
    EXPECT_EQ(handled, before + 1) << ok;
  }
  EXPECT_EQ(status("POST", "/p", {}).status, 200);  // no Content-Type: taken as JSON
  EXPECT_EQ(status("POST", "/p", {{"content-encoding", "identity"}}).status, 200);
  const int before = handled;
  for (const char* bad : {"application/x-www-form-urlencoded", "text/plain", "", "application/jsonx",
                          "application/json-seq", "multipart/form-data; boundary=x",
                          "application/json; charset=latin1"}) {
    HttpResponse r = status("POST", "/p", {{"content-type", bad}});
    EXPECT_EQ(r.status, 415) << bad;
    EXPECT_THAT(r.body, HasSubstr("\"code\":\"unsupported_media_type\"")) << bad;
    EXPECT_THAT(r.body, HasSubstr("Content-Type")) << bad;
  }
  HttpResponse gz = status("POST", "/p", {{"content-encoding", "gzip"}});
  EXPECT_EQ(gz.status, 415);
  EXPECT_THAT(gz.body, HasSubstr("Content-Encoding \\\"gzip\\\" is not supported"));
  EXPECT_EQ(status("POST", "/p", {{"content-encoding", "identity, br"}}).status, 415);
  HttpResponse two = status(
      "POST", "/p", {{"content-type", "application/json"}, {"content-type", "text/plain"}});
  EXPECT_EQ(two.status, 400);
  EXPECT_THAT(two.body, HasSubstr("Content-Type is given more than once"));
  EXPECT_EQ(handled, before);
  // Only POST bodies are judged.
  EXPECT_EQ(status("GET", "/g", {{"content-type", "text/plain"}}).status, 200);
}

TEST(ErrorResponse, RetryAfterOnOverload) {
  HttpResponse r = errorResponse(resourceExhausted("queue full"));
  EXPECT_EQ(r.status, 429);
  EXPECT_THAT(r.headers, Contains(Pair("Retry-After", "1")));
  HttpResponse u = errorResponse(unavailable("down"));
  EXPECT_EQ(u.status, 503);
  EXPECT_THAT(u.headers, Contains(Pair("Retry-After", "1")));
  HttpResponse b = errorResponse(invalidArgument("x"));
  EXPECT_EQ(b.status, 400);
  EXPECT_TRUE(b.headers.empty());
}

}  // namespace
}  // namespace garden::ivy
