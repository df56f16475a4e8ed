#pragma once
// The load generator's HTTP/1.1 client: one blocking keep-alive TCP connection per closed-loop
// client (a client has at most one request in flight, so a thread per client costs nothing that
// matters and keeps the timing path short: one send, recv until the response is complete).
//
// ResponseReader is the incremental parser (status line, headers, Content-Length or chunked body)
// and SseParser splits a text/event-stream body into events; both take bytes in arbitrary pieces
// and are unit-tested on their own. Connection owns one socket; one thread uses it at a time.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace garden::bench {

// "host:port" → (host, port). Rejects a missing or out-of-range port.
Result<std::pair<std::string, int>> parseHostPort(std::string_view endpoint);

// Incremental HTTP/1.1 response parser. feed() consumes bytes; body bytes are delivered to the
// sink (already de-chunked) as they arrive. Bytes after the end of the response are not consumed
// (feed() returns how many were used).
class ResponseReader {
 public:
  using BodySink = std::function<void(std::string_view)>;
  explicit ResponseReader(BodySink sink = nullptr) : sink_(std::move(sink)) {}

  // Consumes a prefix of `data`; returns the number of bytes consumed, or an error for a malformed
  // response (bad status line, bad chunk size, header section over 64 KiB).
  Result<size_t> feed(std::string_view data);
  bool done() const { return state_ == State::kDone; }
  bool headersDone() const { return state_ != State::kHeaders; }
  int status() const { return status_; }
  // Lower-cased header names.
  const std::map<std::string, std::string>& headers() const { return headers_; }
  // The whole body, when no sink was given.
  const std::string& body() const { return body_; }
  // The server asked to close the connection after this response (Connection: close or HTTP/1.0).
  bool closeAfter() const { return close_after_; }
  // True when the body is delimited by connection close (no length, not chunked).
  bool untilClose() const { return until_close_; }
  // Marks an until-close body complete (the peer closed).
  void finishAtClose();

 private:
  enum class State { kHeaders, kBody, kChunkSize, kChunkData, kChunkCrlf, kTrailers, kDone };
  Status parseHeaders(std::string_view head);
  void emit(std::string_view piece);

  BodySink sink_;
  State state_ = State::kHeaders;
  std::string pending_;  // partial header section / chunk-size line
  int status_ = 0;
  std::map<std::string, std::string> headers_;
  std::string body_;
  uint64_t remaining_ = 0;
  bool close_after_ = false;
  bool until_close_ = false;
};

// text/event-stream parser: feed() body bytes; each complete event's data (the `data:` lines
// joined with '\n', one optional leading space stripped) goes to the callback. Comment lines
// (':' first) and other fields are ignored. CRLF, LF and CR line ends are accepted.
class SseParser {
 public:
  using EventSink = std::function<void(std::string_view data)>;
  explicit SseParser(EventSink sink) : sink_(std::move(sink)) {}
  void feed(std::string_view bytes);

 private:
  void line(std::string_view l);
  EventSink sink_;
  std::string buf_;
  std::string data_;
  bool has_data_ = false;
  bool last_cr_ = false;
};

// One blocking keep-alive connection. Reconnects on the next request after a failure or a
// server-requested close.
class Connection {
 public:
  Connection(std::string host, int port, std::chrono::milliseconds timeout);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends `request` (a complete HTTP/1.1 request) and reads one response into `reader`.
  // `on_bytes` (optional) is called after every recv with the time it returned (for streaming
  // measurements the reader's sink does the real work). Errors: UNAVAILABLE (connect, reset,
  // premature close), DEADLINE_EXCEEDED (socket timeout), or the reader's parse error.
  Status roundTrip(std::string_view request, ResponseReader& reader);

 private:
  Status ensureConnected();
  void closeSocket();

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
  std::string leftover_;
};

// A POST request with a JSON body and keep-alive.
std::string buildPost(std::string_view host, std::string_view path, std::string_view body,
                      bool accept_sse = false);

}  // namespace garden::bench
