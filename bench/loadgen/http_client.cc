#include "bench/loadgen/http_client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace garden::bench {

Result<std::pair<std::string, int>> parseHostPort(std::string_view endpoint) {
  size_t c = endpoint.rfind(':');
  if (c == std::string_view::npos || c == 0 || c + 1 == endpoint.size())
    return invalidArgument("endpoint '" + std::string(endpoint) + "' must be HOST:PORT");
  int port = 0;
  auto tail = endpoint.substr(c + 1);
  auto [p, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), port);
  if (ec != std::errc() || p != tail.data() + tail.size() || port < 1 || port > 65535)
    return invalidArgument("endpoint '" + std::string(endpoint) + "' has a bad port");
  return std::make_pair(std::string(endpoint.substr(0, c)), port);
}

namespace {
std::string lower(std::string_view s) {
  std::string o(s);
  std::transform(o.begin(), o.end(), o.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return o;
}
std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}
constexpr size_t kMaxHeaderBytes = 64 * 1024;
}  // namespace

Status ResponseReader::parseHeaders(std::string_view head) {
  size_t eol = head.find("\r\n");
  std::string_view status_line = head.substr(0, eol);
  if (status_line.substr(0, 5) != "HTTP/" || status_line.size() < 12)
    return unavailable("malformed status line '" + std::string(status_line.substr(0, 40)) + "'");
  bool http10 = status_line.substr(0, 8) == "HTTP/1.0";
  auto code = status_line.substr(9, 3);
  auto [p, ec] = std::from_chars(code.data(), code.data() + 3, status_);
  if (ec != std::errc() || p != code.data() + 3) return unavailable("malformed status code");
  size_t pos = eol == std::string_view::npos ? head.size() : eol + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string_view::npos) e = head.size();
    std::string_view line = head.substr(pos, e - pos);
    pos = e + 2;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    headers_[lower(trim(line.substr(0, colon)))] = std::string(trim(line.substr(colon + 1)));
  }
  auto conn = headers_.find("connection");
  close_after_ = http10 || (conn != headers_.end() && lower(conn->second) == "close");
  auto te = headers_.find("transfer-encoding");
  auto cl = headers_.find("content-length");
  if (status_ == 204 || status_ == 304 || (status_ >= 100 && status_ < 200)) {
    state_ = State::kDone;
  } else if (te != headers_.end() && lower(te->second).find("chunked") != std::string::npos) {
    state_ = State::kChunkSize;
  } else if (cl != headers_.end()) {
    const std::string& v = cl->second;
    auto [q, ec2] = std::from_chars(v.data(), v.data() + v.size(), remaining_);
    if (ec2 != std::errc() || q != v.data() + v.size()) return unavailable("bad Content-Length");
    state_ = remaining_ == 0 ? State::kDone : State::kBody;
  } else {
    until_close_ = true;
    close_after_ = true;
    state_ = State::kBody;
  }
  return okStatus();
}

void ResponseReader::emit(std::string_view piece) {
  if (piece.empty()) return;
  if (sink_) {
    sink_(piece);
  } else {
    body_.append(piece);
  }
}

void ResponseReader::finishAtClose() {
  if (until_close_ && state_ == State::kBody) state_ = State::kDone;
}

Result<size_t> ResponseReader::feed(std::string_view data) {
  size_t used = 0;
  while (used < data.size() && state_ != State::kDone) {
    std::string_view rest = data.substr(used);
    switch (state_) {
      case State::kHeaders: {
        size_t before = pending_.size();
        pending_.append(rest);
        size_t end = pending_.find("\r\n\r\n");
        if (end == std::string::npos) {
          if (pending_.size() > kMaxHeaderBytes) return unavailable("response headers too large");
          used = data.size();
          break;
        }
        used += end + 4 - before;
        std::string head = pending_.substr(0, end);
        pending_.clear();
        RETURN_IF_ERROR(parseHeaders(head));
        break;
      }
      case State::kBody: {
        if (until_close_) {
          emit(rest);
          used = data.size();
          break;
        }
        size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, rest.size()));
        emit(rest.substr(0, n));
        used += n;
        remaining_ -= n;
        if (remaining_ == 0) state_ = State::kDone;
        break;
      }
      case State::kChunkSize:
      case State::kTrailers: {
        size_t e = rest.find('\n');
        if (e == std::string_view::npos) {
          pending_.append(rest);
          if (pending_.size() > 1024) return unavailable("chunk-size line too long");
          used = data.size();
          break;
        }
        pending_.append(rest.substr(0, e + 1));
        used += e + 1;
        std::string_view line = trim(std::string_view(pending_).substr(0, pending_.size() - 1));
        if (state_ == State::kTrailers) {
          if (line.empty()) state_ = State::kDone;
          pending_.clear();
          break;
        }
        size_t semi = line.find(';');
        if (semi != std::string_view::npos) line = line.substr(0, semi);
        uint64_t size = 0;
        auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), size, 16);
        if (line.empty() || ec != std::errc() || p != line.data() + line.size())
          return unavailable("bad chunk size '" + std::string(line) + "'");
        pending_.clear();
        remaining_ = size;
        state_ = size == 0 ? State::kTrailers : State::kChunkData;
        break;
      }
      case State::kChunkData: {
        size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, rest.size()));
        emit(rest.substr(0, n));
        used += n;
        remaining_ -= n;
        if (remaining_ == 0) state_ = State::kChunkCrlf;
        break;
      }
      case State::kChunkCrlf: {
        // Expect "\r\n" (tolerate a bare "\n").
        if (rest[0] == '\r') {
          ++used;
          break;
        }
        if (rest[0] != '\n') return unavailable("missing CRLF after chunk data");
        ++used;
        state_ = State::kChunkSize;
        break;
      }
      case State::kDone:
        break;
    }
  }
  return used;
}

void SseParser::feed(std::string_view bytes) {
  for (char c : bytes) {
    if (last_cr_ && c == '\n') {
      last_cr_ = false;
      continue;  // the LF of a CRLF
    }
    last_cr_ = false;
    if (c == '\r' || c == '\n') {
      last_cr_ = c == '\r';
      line(buf_);
      buf_.clear();
    } else {
      buf_.push_back(c);
    }
  }
}

void SseParser::line(std::string_view l) {
  if (l.empty()) {
    if (has_data_) sink_(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l[0] == ':') return;
  size_t colon = l.find(':');
  std::string_view field = l.substr(0, colon);
  std::string_view value =
      colon == std::string_view::npos ? std::string_view() : l.substr(colon + 1);
  if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  if (field != "data") return;
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
}

Connection::Connection(std::string host, int port, std::chrono::milliseconds timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout) {}

Connection::~Connection() { closeSocket(); }

void Connection::closeSocket() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  leftover_.clear();
}

Status Connection::ensureConnected() {
  if (fd_ >= 0) return okStatus();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
  if (rc != 0) return unavailable("resolve " + host_ + ": " + gai_strerror(rc));
  Status last = unavailable("no address for " + host_);
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      timeval tv{static_cast<time_t>(timeout_.count() / 1000),
                 static_cast<suseconds_t>((timeout_.count() % 1000) * 1000)};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      fd_ = fd;
      freeaddrinfo(res);
      return okStatus();
    }
    last =
        unavailable("connect " + host_ + ":" + std::to_string(port_) + ": " + std::strerror(errno));
    ::close(fd);
  }
  freeaddrinfo(res);
  return last;
}

Status Connection::roundTrip(std::string_view request, ResponseReader& reader) {
  RETURN_IF_ERROR(ensureConnected());
  size_t off = 0;
  while (off < request.size()) {
    ssize_t n = ::send(fd_, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      int err = errno;
      closeSocket();
      if (err == EAGAIN || err == EWOULDBLOCK) return deadlineExceeded("send timed out");
      return unavailable(std::string("send: ") + std::strerror(err));
    }
    off += static_cast<size_t>(n);
  }
  if (!leftover_.empty()) {
    std::string lo = std::move(leftover_);
    leftover_.clear();
    ASSIGN_OR_RETURN(size_t used, reader.feed(lo));
    if (used < lo.size()) leftover_ = lo.substr(used);
  }
  char buf[64 * 1024];
  while (!reader.done()) {
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n == 0) {
      reader.finishAtClose();
      closeSocket();
      if (reader.done()) return okStatus();
      return unavailable("connection closed before the response was complete");
    }
    if (n < 0) {
      int err = errno;
      closeSocket();
      if (err == EAGAIN || err == EWOULDBLOCK) return deadlineExceeded("response timed out");
      return unavailable(std::string("recv: ") + std::strerror(err));
    }
    std::string_view got(buf, static_cast<size_t>(n));
    auto used = reader.feed(got);
    if (!used.isOk()) {
      closeSocket();
      return used.status();
    }
    if (*used < got.size()) leftover_.assign(got.substr(*used));
  }
  if (reader.closeAfter()) closeSocket();
  return okStatus();
}

std::string buildPost(std::string_view host, std::string_view path, std::string_view body,
                      bool accept_sse) {
  std::string r;
  r.reserve(body.size() + 200);
  r.append("POST ").append(path).append(" HTTP/1.1\r\nHost: ").append(host);
  r.append("\r\nContent-Type: application/json\r\n");
  if (accept_sse) r.append("Accept: text/event-stream\r\n");
  r.append("Content-Length: ").append(std::to_string(body.size())).append("\r\n\r\n");
  r.append(body);
  return r;
}

}  // namespace garden::bench
