// Streamed responses over the real Beast server (chunked transfer + SSE framing on the wire,
// keep-alive after a stream, client disconnect cancelling generation), driven by raw sockets.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "services/ivy/http/server.h"
#include "tests/support/raw_http_conn.h"
#include "tests/unit/ivy/chat/chat_harness.h"

namespace garden::ivy::testing {
namespace {

using ::testing::HasSubstr;

// The shared raw client (10 s receive timeout) plus what these tests add: a POST shorthand and
// readers for a chunked body and for a Content-Length body after readHead().
class Conn : public garden::testing::RawHttpConn {
 public:
  explicit Conn(int port) : RawHttpConn(port, 10) {}
  void post(const std::string& path, const std::string& body) {
    send("POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  }
  // A chunked body, de-chunked; `raw` gets the bytes as sent. Checks the framing strictly.
  std::string readChunked(std::string* raw) {
    std::string& buf = buffer();
    std::string body;
    while (true) {
      if (!readUntil("\r\n")) {
        ADD_FAILURE() << "connection closed inside the chunked body";
        return body;
      }
      size_t eol = buf.find("\r\n");
      std::string size_line = buf.substr(0, eol);
      size_t size = std::strtoul(size_line.c_str(), nullptr, 16);
      while (buf.size() < eol + 2 + size + 2) {
        if (!fill()) {
          ADD_FAILURE() << "truncated chunk";
          return body;
        }
      }
      raw->append(buf, 0, eol + 2 + size + 2);
      EXPECT_EQ(buf.substr(eol + 2 + size, 2), "\r\n");
      body.append(buf, eol + 2, size);
      buf.erase(0, eol + 2 + size + 2);
      if (size == 0) return body;
    }
  }
  // The Content-Length body that follows `head` ("" when the connection ended first).
  std::string readContentLength(const std::string& head) {
    const std::string len = garden::testing::parseRawHttpHead(head).header("content-length");
    std::string body;
    readBytes(std::strtoul(len.c_str(), nullptr, 10), &body);
    return body;
  }
};

class SseServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.threads = 2;
    server_ = std::make_unique<HttpServer>(o, &h_.router(), nullptr);
    ASSERT_TRUE(server_->start().isOk());
  }
  void TearDown() override { server_->stop(); }
  // The fake answers 2000 tokens 'a', 5 ms apart: 10 s unless cancelled.
  void scriptLongAnswer() {
    std::vector<int32_t> script = h_.ids("<|channel|>final<|message|>");
    for (int i = 0; i < 2000; ++i) script.push_back('a');
    h_.client().setScript(script);
    h_.client().setChunkDelay(std::chrono::milliseconds(5));
  }

  ChatHarness h_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(SseServerTest, ChunkedSseOnTheWireThenKeepAlive) {
  h_.client().setScript(h_.ids("<|channel|>final<|message|>Hi<|return|>"));
  Conn c(server_->port());
  ASSERT_TRUE(c.connected());
  c.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":true,)"
                                 R"("stream_options":{"include_usage":true}})");
  std::string head = c.readHead();
  EXPECT_TRUE(head.starts_with("HTTP/1.1 200 OK\r\n")) << head;
  EXPECT_THAT(head, HasSubstr("Content-Type: text/event-stream\r\n"));
  EXPECT_THAT(head, HasSubstr("Transfer-Encoding: chunked\r\n"));
  EXPECT_THAT(head, HasSubstr("cache-control: no-cache\r\n"));
  EXPECT_THAT(head, HasSubstr("x-request-id: "));
  std::string raw;
  std::string body = c.readChunked(&raw);
  EXPECT_TRUE(raw.ends_with("\r\n0\r\n\r\n"));
  bool done = false;
  auto events = sseEvents(body, &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(events.size(), 5u) << body;  // role, H, i, finish, usage
  EXPECT_THAT(events[1], HasSubstr(R"("delta":{"content":"H"})"));
  EXPECT_THAT(events[4], HasSubstr(R"("choices":[],"usage":{"prompt_tokens":)"));

  // The connection stays usable: a non-streaming request on it.
  c.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}]})");
  std::string head2 = c.readHead();
  EXPECT_TRUE(head2.starts_with("HTTP/1.1 200 OK\r\n")) << head2;
  std::string body2 = c.readContentLength(head2);
  EXPECT_THAT(body2, HasSubstr(R"("content":"Hi")"));
}

TEST_F(SseServerTest, ClientDisconnectCancelsGeneration) {
  scriptLongAnswer();
  Conn c(server_->port());
  ASSERT_TRUE(c.connected());
  c.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":true})");
  ASSERT_THAT(c.readHead(), HasSubstr("200 OK"));
  ASSERT_TRUE(c.readUntil(R"("content":"a")"));
  c.closeNow();
  // The stream is cancelled long before its 2000 tokens (10 s) would have finished.
  EXPECT_TRUE(h_.client().waitIdle(std::chrono::seconds(8)));
  EXPECT_EQ(h_.client().cancelledStreams(), 1);
}

// Not streamed: the client leaving while the answer is generated cancels every generation of the
// request [TAG_CLIENT_DISCONNECT] (nothing was written yet, so only the connection tells).
TEST_F(SseServerTest, ClientDisconnectCancelsNonStreamingGeneration) {
  auto waitCalls = [this](size_t n) {
    for (int i = 0; i < 1000 && h_.client().calls().size() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return h_.client().calls().size() >= n;
  };
  scriptLongAnswer();
  {
    Conn c(server_->port());
    ASSERT_TRUE(c.connected());
    c.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}]})");
    ASSERT_TRUE(waitCalls(1));
    c.closeNow();
  }
  EXPECT_TRUE(h_.client().waitIdle(std::chrono::seconds(8)));
  EXPECT_EQ(h_.client().cancelledStreams(), 1);
  // /v1/completions with two prompts: both generations are cancelled.
  {
    Conn c(server_->port());
    ASSERT_TRUE(c.connected());
    c.post("/v1/completions", R"({"prompt":["a","b"],"max_tokens":2000})");
    ASSERT_TRUE(waitCalls(3));
    c.closeNow();
  }
  EXPECT_TRUE(h_.client().waitIdle(std::chrono::seconds(8)));
  EXPECT_EQ(h_.client().cancelledStreams(), 3);
  std::string page = h_.registry().expose();
  EXPECT_THAT(page,
              HasSubstr(R"(ivy_generate_requests_total{endpoint="chat",outcome="client_gone"} 1)"));
  EXPECT_THAT(
      page,
      HasSubstr(R"(ivy_generate_requests_total{endpoint="completions",outcome="client_gone"} 1)"));
  // A new request is served normally.
  h_.client().setScript(h_.ids("<|channel|>final<|message|>Hi<|return|>"));
  h_.client().setChunkDelay(std::chrono::milliseconds(0));
  Conn c(server_->port());
  c.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}]})");
  std::string head = c.readHead();
  EXPECT_TRUE(head.starts_with("HTTP/1.1 200 OK\r\n")) << head;
  EXPECT_THAT(c.readContentLength(head), HasSubstr(R"("content":"Hi")"));
}

TEST_F(SseServerTest, ErrorsBeforeStreamingAreOrdinaryResponses) {
  Conn c(server_->port());
  c.post("/v1/chat/completions", R"({"messages":[],"stream":true})");
  std::string head = c.readHead();
  EXPECT_TRUE(head.starts_with("HTTP/1.1 400")) << head;
  EXPECT_THAT(c.readContentLength(head), HasSubstr(R"("param":"messages")"));
}

}  // namespace
}  // namespace garden::ivy::testing
