#pragma once
// MetricsHttpServer: a minimal HTTP/1.1 endpoint for tiers that speak no HTTP otherwise (tulip):
// GET /metrics answers the global registry's Prometheus exposition, GET /health a plain 200 (or
// 503 when the health callback says so). One thread; each connection serves one request.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "common/status.h"

namespace garden {

class MetricsHttpServer {
 public:
  MetricsHttpServer() = default;
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds host:port (port 0 picks one) and starts serving.
  Status start(const std::string& host, uint16_t port, std::function<bool()> healthy = nullptr);
  uint16_t port() const { return port_; }
  void stop();

 private:
  void serve();
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::function<bool()> healthy_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace garden
