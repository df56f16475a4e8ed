// --tulip entries: DNS names, IP literals in gRPC target syntax, lists; errors name the flag.

#include "services/ivy/balance/endpoints.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace garden::ivy {
namespace {

using ::testing::HasSubstr;

TEST(TulipEndpoint, DnsNamesAreResolved) {
  auto e = parseTulipEndpoint("tulip.garden.svc.cluster.local:50051");
  ASSERT_TRUE(e.isOk()) << e.status().toString();
  EXPECT_FALSE(e->literal);
  EXPECT_EQ(e->host, "tulip.garden.svc.cluster.local");
  EXPECT_EQ(e->port, 50051);
  auto d = parseTulipEndpoint("dns:///tulip-headless:7000");
  ASSERT_TRUE(d.isOk());
  EXPECT_FALSE(d->literal);
  EXPECT_EQ(d->host, "tulip-headless");
  EXPECT_EQ(d->port, 7000);
}

TEST(TulipEndpoint, IpLiteralsAreStatic) {
  auto a = parseTulipEndpoint("127.0.0.1:50051");
  ASSERT_TRUE(a.isOk());
  EXPECT_TRUE(a->literal);
  EXPECT_EQ(a->address, "ipv4:127.0.0.1:50051");
  auto b = parseTulipEndpoint("ipv4:10.1.2.3:9");
  ASSERT_TRUE(b.isOk());
  EXPECT_EQ(b->address, "ipv4:10.1.2.3:9");
  auto c = parseTulipEndpoint("[::1]:50051");
  ASSERT_TRUE(c.isOk());
  EXPECT_TRUE(c->literal);
  EXPECT_EQ(c->address, "ipv6:[::1]:50051");
  auto d = parseTulipEndpoint("ipv6:[fe80::1]:80");
  ASSERT_TRUE(d.isOk());
  EXPECT_EQ(d->address, "ipv6:[fe80::1]:80");
  EXPECT_EQ(displayAddress(c->address), "[::1]:50051");
  EXPECT_EQ(displayAddress(a->address), "127.0.0.1:50051");
}

TEST(TulipEndpoint, BadEntriesNameTheFlag) {
  for (const char* bad : {"", "tulip", "tulip:", "tulip:0", "tulip:70000", "tulip:12x", ":50051",
                          "::1:50051", "[::1]", "[::1:50051", "ipv4:tulip:50051",
                          "ipv6:127.0.0.1:5", "ipv4:[::1]:5", "tu lip:5", "a/b:5"}) {
    auto e = parseTulipEndpoint(bad);
    ASSERT_FALSE(e.isOk()) << bad;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(e.status().message(), HasSubstr("--tulip")) << bad;
  }
}

TEST(TulipEndpoint, ListsAndGrpcMultiAddressSyntax) {
  auto l = parseTulipEndpoints({"ipv4:127.0.0.1:1,127.0.0.1:2", "tulip-headless:3", " b:4 , c:5"});
  ASSERT_TRUE(l.isOk()) << l.status().toString();
  ASSERT_EQ(l->size(), 5u);
  EXPECT_EQ((*l)[0].address, "ipv4:127.0.0.1:1");
  EXPECT_EQ((*l)[1].address, "ipv4:127.0.0.1:2");
  EXPECT_EQ((*l)[2].host, "tulip-headless");
  EXPECT_EQ((*l)[3].host, "b");
  EXPECT_EQ((*l)[4].port, 5);
  auto empty = parseTulipEndpoints({});
  EXPECT_FALSE(empty.isOk());
  auto one_bad = parseTulipEndpoints({"a:1", "b"}, "--other");
  ASSERT_FALSE(one_bad.isOk());
  EXPECT_THAT(one_bad.status().message(), HasSubstr("--other: 'b'"));
}

TEST(TulipEndpoint, SystemResolverFindsLoopback) {
  auto r = resolveSystem("127.0.0.1", 5);  // a literal resolves without any DNS server
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0], "ipv4:127.0.0.1:5");
  auto bad = resolveSystem("no-such-host.invalid", 5);
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(bad.status().message(), HasSubstr("no-such-host.invalid"));
}

}  // namespace
}  // namespace garden::ivy
