#pragma once
// HttpServer: the Boost.Beast HTTP/1.1 server. Beast and Asio appear only in server.cc.
//
// * `threads` io threads, each running its own io_context [TAG_IO_PER_THREAD]; each connection is
//   placed on one of them (round robin) and lives on its own strand there. Handlers are called on
//   that strand and must not block; they answer through the Responder, from any thread: a plain
//   response is sent by the thread that answers, without blocking, and what the socket's buffer
//   did not take is written by the strand [TAG_DIRECT_WRITE].
// * Keep-alive: requests on one connection are served in order; the connection stays open while
//   the client asks for it and the server is not stopping. An idle or slow connection is closed
//   after `idle_timeout`.
// * Body limit: a Content-Length over `max_body_bytes` is answered 413 right after the header,
//   before any of the body is read (also a chunked body that grows past it); the connection is then
//   closed. `Expect: 100-continue` is honoured (so curl does not wait before sending). The access
//   record of a refused header still names the method and route of its request line.
// * Framing [TAG_HTTP_FRAMING] (http/framing.h): a Transfer-Encoding whose last coding is not
//   `chunked`, one with Content-Length, or one in HTTP/1.0 is answered 400; other codings before
//   a final `chunked` (`gzip, chunked`) 415. Either way the connection is closed and what the
//   client sent after the header is drained unread, so a body can never be parsed as a second
//   (smuggled) request.
// * Request ids: `x-request-id` is taken from the request when it is 1..128 characters of
//   [A-Za-z0-9._:-], otherwise one is generated (32 hex digits); it is always returned.
// * Streamed responses (HttpResponse::stream, http/response_stream.h): the header goes out with
//   Transfer-Encoding: chunked, then whatever the handler writes, chunk by chunk; the client
//   closing the connection cancels the stream (logged with status 499). [TAG_HTTP_STREAMING]
// * Client gone [TAG_CLIENT_DISCONNECT]: while a request waits for its handler's response, one
//   async_wait for readability watches the socket (no read, no thread). When it fires, a
//   non-consuming recv(MSG_PEEK) tells EOF (0 bytes) or an error (reset) from data: data is the
//   client's next, pipelined request, which stays in the kernel for the next read (the watch then
//   ends for this request). On EOF or reset the request's HttpRequest::cancel is fired (the
//   handler's upstream calls are cancelled), the connection is closed, the AccessRecord goes out
//   with status 499 and client_gone set, and the response, whenever the handler delivers it, is
//   dropped. A client that half-closes its sending side and still waits for the answer is treated
//   as gone too (as nginx does for proxied requests). Completion and disconnect are both decided
//   on the connection's strand, so exactly one of them wins.
// * After each response `on_done` gets an AccessRecord (for the per-request log line and metrics).
// * stop(): stops accepting, closes idle connections, lets requests in flight finish (up to
//   `drain_timeout`), then joins the threads. Idempotent; the destructor calls it.
//
// Lifetime: the router and on_done must outlive the server. A Responder called after stop() is
// safe (the connection state it holds keeps the io_context alive) and its response is dropped.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "services/ivy/http/message.h"
#include "services/ivy/http/router.h"

namespace garden::ivy {

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 8080;  // 0: an ephemeral port (see HttpServer::port())
  int threads = 0;       // <= 0: one per hardware thread
  uint64_t max_body_bytes = 8ull << 20;
  uint32_t max_header_bytes = 64u << 10;
  std::chrono::milliseconds idle_timeout{60000};
  std::chrono::milliseconds drain_timeout{10000};
};

struct AccessRecord {
  std::string_view request_id;
  std::string_view method;
  std::string_view path;
  std::string_view route;  // router label ("other" when unmatched)
  int status = 0;
  std::chrono::microseconds latency{0};
  size_t request_bytes = 0;
  size_t response_bytes = 0;
  // The client closed the connection before the response was complete (status 499): the request
  // was cancelled [TAG_CLIENT_DISCONNECT], or a streamed response was cut off.
  bool client_gone = false;
};

using AccessObserver = std::function<void(const AccessRecord&)>;

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, const Router* router, AccessObserver on_done);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the io threads. UNAVAILABLE naming host:port if binding fails.
  Status start();
  // The bound port (useful with port 0). Valid after start().
  uint16_t port() const;
  void stop();

  struct Core;  // implementation (server.cc); public only so connection objects can name it

 private:
  std::shared_ptr<Core> core_;
};

// The x-request-id to use: `incoming` when acceptable (see above), otherwise a fresh random id.
std::string requestIdFor(std::string_view incoming);

}  // namespace garden::ivy
