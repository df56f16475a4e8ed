#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/metrics/registry.h"

namespace garden {
namespace {

void writeAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    off += static_cast<size_t>(n);
  }
}

std::string response(int code, const char* reason, const char* type, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

}  // namespace

MetricsHttpServer::~MetricsHttpServer() { stop(); }

Status MetricsHttpServer::start(const std::string& host, uint16_t port,
                                std::function<bool()> healthy) {
  healthy_ = std::move(healthy);
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return errnoStatus("socket", errno);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    return invalidArgument("metrics host must be an IPv4 address: " + host);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return errnoStatus("bind metrics port " + std::to_string(port), errno);
  if (::listen(listen_fd_, 64) != 0) return errnoStatus("listen", errno);
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
  return okStatus();
}

void MetricsHttpServer::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void MetricsHttpServer::serve() {
  while (!stop_) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (::poll(&pfd, 1, 100) <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    timeval tv{2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string req;
    char buf[2048];
    while (req.find("\r\n\r\n") == std::string::npos && req.size() < 16384) {
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    std::string out;
    if (req.starts_with("GET /metrics")) {
      out = response(200, "OK", "text/plain; version=0.0.4; charset=utf-8",
                     metrics::Registry::global().expose());
    } else if (req.starts_with("GET /health")) {
      bool ok = !healthy_ || healthy_();
      out = ok ? response(200, "OK", "text/plain", "ok\n")
               : response(503, "Service Unavailable", "text/plain", "not ready\n");
    } else {
      out = response(404, "Not Found", "text/plain", "not found\n");
    }
    writeAll(fd, out);
    ::close(fd);
  }
}

}  // namespace garden
