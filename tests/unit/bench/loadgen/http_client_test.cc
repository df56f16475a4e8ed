#include "bench/loadgen/http_client.h"

#include <gtest/gtest.h>

namespace garden::bench {
namespace {

// Feeds `raw` to a fresh reader in pieces of `step` bytes; returns the reader's final state.
struct Fed {
  bool done = false;
  int status = 0;
  std::string body;
  size_t used = 0;
  bool error = false;
};
Fed feedInPieces(const std::string& raw, size_t step) {
  Fed f;
  std::string sunk;
  ResponseReader r([&](std::string_view p) { sunk.append(p); });
  size_t off = 0;
  while (off < raw.size() && !r.done()) {
    std::string_view piece(raw.data() + off, std::min(step, raw.size() - off));
    auto used = r.feed(piece);
    if (!used.isOk()) {
      f.error = true;
      return f;
    }
    off += *used;
    if (*used < piece.size()) break;  // response complete; the rest belongs to the next one
  }
  f.done = r.done();
  f.status = r.status();
  f.body = sunk;
  f.used = off;
  return f;
}

TEST(ResponseReader, ContentLengthAtEverySplit) {
  const std::string raw =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
      "{\"a\":12345}NEXT";
  for (size_t step = 1; step <= raw.size(); ++step) {
    Fed f = feedInPieces(raw, step);
    ASSERT_FALSE(f.error) << step;
    EXPECT_TRUE(f.done) << step;
    EXPECT_EQ(f.status, 200);
    EXPECT_EQ(f.body, "{\"a\":12345}") << step;
    EXPECT_EQ(f.used, raw.size() - 4) << "bytes of the next response must be left: step " << step;
  }
}

TEST(ResponseReader, ChunkedWithExtensionsAndTrailersAtEverySplit) {
  const std::string raw =
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;ext=1\r\nhello\r\n1A\r\n, abcdefghijklmnopqrstuvwx\r\n0\r\nX-Trailer: y\r\n\r\n";
  for (size_t step = 1; step <= raw.size(); ++step) {
    Fed f = feedInPieces(raw, step);
    ASSERT_FALSE(f.error) << step;
    EXPECT_TRUE(f.done) << step;
    EXPECT_EQ(f.body, "hello, abcdefghijklmnopqrstuvwx") << step;
    EXPECT_EQ(f.used, raw.size());
  }
}

TEST(ResponseReader, HeadersStatusAndClose) {
  ResponseReader r;
  auto used = r.feed(
      "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
      "Content-Length: 4\r\n\r\nbusy");
  ASSERT_TRUE(used.isOk());
  EXPECT_TRUE(r.done());
  EXPECT_EQ(r.status(), 503);
  EXPECT_EQ(r.headers().at("retry-after"), "1");
  EXPECT_TRUE(r.closeAfter());
  EXPECT_EQ(r.body(), "busy");

  ResponseReader until;
  ASSERT_TRUE(until.feed("HTTP/1.0 200 OK\r\n\r\npartial body").isOk());
  EXPECT_FALSE(until.done());
  EXPECT_TRUE(until.untilClose());
  until.finishAtClose();
  EXPECT_TRUE(until.done());
  EXPECT_EQ(until.body(), "partial body");

  ResponseReader empty;
  ASSERT_TRUE(empty.feed("HTTP/1.1 204 No Content\r\n\r\n").isOk());
  EXPECT_TRUE(empty.done());
}

TEST(ResponseReader, MalformedResponsesAreErrors) {
  EXPECT_FALSE(ResponseReader().feed("SMTP ready\r\n\r\n").isOk());
  EXPECT_FALSE(ResponseReader().feed("HTTP/1.1 2x0 OK\r\n\r\n").isOk());
  EXPECT_FALSE(
      ResponseReader().feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").isOk());
  EXPECT_FALSE(ResponseReader().feed("HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n").isOk());
  EXPECT_FALSE(ResponseReader()
                   .feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY")
                   .isOk());
  ResponseReader big;
  EXPECT_FALSE(big.feed("HTTP/1.1 200 OK\r\nX: " + std::string(70000, 'a')).isOk());
}

TEST(SseParser, EventsAcrossSplitsAndLineEndings) {
  const std::string stream =
      ": keep-alive comment\r\n\r\n"
      "data: {\"a\":1}\r\n\r\n"
      "event: message\ndata:{\"b\":2}\n\n"
      "data: line1\rdata: line2\r\r"
      "id: 7\ndata: [DONE]\n\n"
      "data: unterminated";
  for (size_t step = 1; step <= stream.size(); ++step) {
    std::vector<std::string> events;
    SseParser p([&](std::string_view d) { events.emplace_back(d); });
    for (size_t off = 0; off < stream.size(); off += step) p.feed(stream.substr(off, step));
    ASSERT_EQ(events.size(), 4u) << step;
    EXPECT_EQ(events[0], "{\"a\":1}");
    EXPECT_EQ(events[1], "{\"b\":2}");
    EXPECT_EQ(events[2], "line1\nline2");
    EXPECT_EQ(events[3], "[DONE]");
  }
}

TEST(HostPort, ParsesAndRejects) {
  auto hp = parseHostPort("127.0.0.1:8080");
  ASSERT_TRUE(hp.isOk());
  EXPECT_EQ(hp->first, "127.0.0.1");
  EXPECT_EQ(hp->second, 8080);
  EXPECT_EQ(parseHostPort("tulip-0.tulip:50051")->first, "tulip-0.tulip");
  for (const char* bad : {"localhost", ":80", "host:", "host:0", "host:70000", "host:8o"})
    EXPECT_FALSE(parseHostPort(bad).isOk()) << bad;
}

TEST(BuildPost, HasLengthAndAcceptForSse) {
  std::string r = buildPost("h:1", "/v1/embeddings", "{}");
  EXPECT_EQ(r,
            "POST /v1/embeddings HTTP/1.1\r\nHost: h:1\r\nContent-Type: application/json\r\n"
            "Content-Length: 2\r\n\r\n{}");
  EXPECT_NE(buildPost("h:1", "/x", "{}", true).find("Accept: text/event-stream\r\n"),
            std::string::npos);
}

}  // namespace
}  // namespace garden::bench
