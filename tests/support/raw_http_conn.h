#pragma once
// A blocking HTTP/1.1 client on one raw TCP connection to 127.0.0.1, for tests that check the wire
// itself: keep-alive and pipelining, Expect: 100-continue, chunked bodies, the server closing, and
// the client hanging up mid-request. Header-only, so unit and integration tests share it without a
// library. One thread uses a connection; the destructor closes the socket.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

namespace garden::testing {

struct RawHttpResponse {
  int status = 0;                              // 0: the connection ended before a whole response
  std::map<std::string, std::string> headers;  // lower-cased names
  std::string body;
  std::string header(const std::string& k) const {
    auto it = headers.find(k);
    return it == headers.end() ? "" : it->second;
  }
};

// Status and headers of a response head (status line and header lines; the blank line that ends
// the head may be there or not). The body is left empty.
inline RawHttpResponse parseRawHttpHead(std::string_view head) {
  RawHttpResponse r;
  size_t line_end = head.find("\r\n");
  std::string_view status_line = head.substr(0, line_end);
  if (status_line.size() >= 12) r.status = std::atoi(std::string(status_line.substr(9, 3)).c_str());
  size_t pos = line_end == std::string_view::npos ? head.size() : line_end + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string_view::npos) e = head.size();
    std::string_view line = head.substr(pos, e - pos);
    pos = e + 2;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;  // the blank line ending the head
    std::string k(line.substr(0, colon));
    for (char& c : k) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string_view v = line.substr(colon + 1);
    while (!v.empty() && v[0] == ' ') v.remove_prefix(1);
    r.headers[k] = std::string(v);
  }
  return r;
}

class RawHttpConn {
 public:
  // Connects to 127.0.0.1:`port`; every receive gives up after `receive_timeout_s` seconds, so a
  // missing response fails the test instead of hanging it.
  RawHttpConn(int port, int receive_timeout_s) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{receive_timeout_s, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawHttpConn() { closeNow(); }
  RawHttpConn(const RawHttpConn&) = delete;
  RawHttpConn& operator=(const RawHttpConn&) = delete;

  bool connected() const { return connected_; }
  // Closes the socket at once (the client hanging up).
  void closeNow() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Writes all of `data`; false when the connection failed first.
  bool send(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Appends what one receive returns to buffer(); false on EOF, error or timeout.
  bool fill() {
    char tmp[65536];
    ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }

  // Receives until `s` is in buffer(); false when the connection ended first.
  bool readUntil(std::string_view s) {
    while (buf_.find(s) == std::string::npos) {
      if (!fill()) return false;
    }
    return true;
  }

  // The next response head as sent (status line, headers and the blank line), taken out of
  // buffer(); "" when the connection ended first.
  std::string readHead() {
    if (!readUntil("\r\n\r\n")) return "";
    size_t end = buf_.find("\r\n\r\n") + 4;
    std::string head = buf_.substr(0, end);
    buf_.erase(0, end);
    return head;
  }

  // The next `n` bytes, taken out of buffer(); false (and `out` untouched) when the connection
  // ended first.
  bool readBytes(size_t n, std::string* out) {
    while (buf_.size() < n) {
      if (!fill()) return false;
    }
    out->assign(buf_, 0, n);
    buf_.erase(0, n);
    return true;
  }

  // One Content-Length framed response (no Content-Length: empty body). An interim 1xx response
  // is returned like any other. Status 0 when the connection ended first.
  RawHttpResponse read() {
    std::string head = readHead();
    if (head.empty()) return {};
    RawHttpResponse r = parseRawHttpHead(head);
    size_t len = std::strtoull(r.header("content-length").c_str(), nullptr, 10);
    if (!readBytes(len, &r.body)) return {};
    return r;
  }

  // True when the server closed the connection (EOF) with nothing more to read.
  bool closedByPeer() {
    if (!buf_.empty()) return false;
    char c;
    return ::recv(fd_, &c, 1, 0) == 0;
  }

  // Received bytes not yet taken by a read: for framings this class does not parse.
  std::string& buffer() { return buf_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string buf_;
};

}  // namespace garden::testing
