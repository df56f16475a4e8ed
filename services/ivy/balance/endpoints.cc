#include "services/ivy/balance/endpoints.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>

namespace garden::ivy {
namespace {

bool startsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

Status bad(std::string_view flag, std::string_view entry, std::string_view why) {
  return invalidArgument(std::string(flag) + ": '" + std::string(entry) + "' " + std::string(why));
}

bool isIpv4(const std::string& host) {
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1;
}

bool isIpv6(const std::string& host) {
  in6_addr a{};
  return inet_pton(AF_INET6, host.c_str(), &a) == 1;
}

std::string target(const std::string& host, uint16_t port, bool v6) {
  return v6 ? "ipv6:[" + host + "]:" + std::to_string(port)
            : "ipv4:" + host + ":" + std::to_string(port);
}

}  // namespace

Result<TulipEndpoint> parseTulipEndpoint(std::string_view entry, std::string_view flag) {
  TulipEndpoint ep;
  ep.entry = std::string(entry);
  std::string_view rest = entry;
  enum class Want { kAny, kV4, kV6 } want = Want::kAny;
  if (startsWith(rest, "dns:///")) {
    rest.remove_prefix(7);
  } else if (startsWith(rest, "dns:")) {
    rest.remove_prefix(4);
  } else if (startsWith(rest, "ipv4:")) {
    rest.remove_prefix(5);
    want = Want::kV4;
  } else if (startsWith(rest, "ipv6:")) {
    rest.remove_prefix(5);
    want = Want::kV6;
  }
  if (rest.empty()) return bad(flag, entry, "is empty; expected host:port");
  std::string_view host, port;
  if (rest.front() == '[') {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad(flag, entry, "has '[' without ']'");
    host = rest.substr(1, close - 1);
    std::string_view after = rest.substr(close + 1);
    if (after.size() < 2 || after.front() != ':') {
      return bad(flag, entry, "needs a port after ']' ([addr]:port)");
    }
    port = after.substr(1);
    if (want == Want::kV4) return bad(flag, entry, "is not an IPv4 address");
    want = Want::kV6;
  } else {
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) return bad(flag, entry, "needs a port (host:port)");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return bad(flag, entry, "looks like an IPv6 address: write it as [addr]:port");
    }
  }
  if (host.empty()) return bad(flag, entry, "has an empty host");
  uint32_t p = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc() || ptr != port.data() + port.size() || p == 0 ||
      p > 65535) {
    return bad(flag, entry, "has a bad port (1-65535)");
  }
  ep.host = std::string(host);
  ep.port = static_cast<uint16_t>(p);
  const bool v4 = isIpv4(ep.host), v6 = !v4 && isIpv6(ep.host);
  if (want == Want::kV4 && !v4) return bad(flag, entry, "is not an IPv4 address");
  if (want == Want::kV6 && !v6) return bad(flag, entry, "is not an IPv6 address");
  if (v4 || v6) {
    ep.literal = true;
    ep.address = target(ep.host, ep.port, v6);
    return ep;
  }
  for (char c : ep.host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_';
    if (!ok) return bad(flag, entry, "has a host name with characters DNS does not allow");
  }
  return ep;
}

Result<std::vector<TulipEndpoint>> parseTulipEndpoints(const std::vector<std::string>& entries,
                                                       std::string_view flag) {
  std::vector<TulipEndpoint> out;
  for (const std::string& e : entries) {
    std::string_view rest = e;
    std::string prefix;  // "ipv4:a:1,b:2": the scheme applies to every address of the list
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
      if (item.empty()) continue;
      std::string full(item);
      if (startsWith(item, "ipv4:") || startsWith(item, "ipv6:")) {
        prefix = std::string(item.substr(0, 5));
      } else if (!prefix.empty() && !startsWith(item, "dns:")) {
        full = prefix + full;
      }
      ASSIGN_OR_RETURN(TulipEndpoint ep, parseTulipEndpoint(full, flag));
      out.push_back(std::move(ep));
    }
  }
  if (out.empty()) return invalidArgument(std::string(flag) + ": no tulip endpoint given");
  return out;
}

Result<std::vector<std::string>> resolveSystem(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    return unavailable("resolving '" + host + "': " + std::string(gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      auto* sin = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf)))
        out.push_back(target(buf, port, false));
    } else if (a->ai_family == AF_INET6) {
      auto* sin6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      if (inet_ntop(AF_INET6, &sin6->sin6_addr, buf, sizeof(buf)))
        out.push_back(target(buf, port, true));
    }
  }
  freeaddrinfo(res);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty()) return unavailable("resolving '" + host + "': no addresses");
  return out;
}

std::string displayAddress(std::string_view address) {
  if (startsWith(address, "ipv4:") || startsWith(address, "ipv6:")) address.remove_prefix(5);
  return std::string(address);
}

}  // namespace garden::ivy
