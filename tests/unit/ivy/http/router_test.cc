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
