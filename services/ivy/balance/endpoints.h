#pragma once
// Where ivy finds its tulip replicas: the --tulip entries, parsed, and the DNS lookup that turns a
// name into one address per replica (a Kubernetes headless Service resolves to one address per
// ready pod). Pure functions plus one blocking lookup (resolveSystem, getaddrinfo); the replica
// pool calls the resolver from its own resolver thread, tests inject a fake Resolver.
//
// Accepted entries (ports are required):
//   host:port          a DNS name, re-resolved periodically; or an IP literal (static)
//   dns:///host:port   (gRPC target syntax) the same as host:port
//   ipv4:1.2.3.4:port  an IPv4 literal (static)
//   [::1]:port, ipv6:[::1]:port   an IPv6 literal (static)
// A replica's address is a gRPC target naming exactly one address: "ipv4:1.2.3.4:50051" or
// "ipv6:[::1]:50051".

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace garden::ivy {

struct TulipEndpoint {
  std::string entry;  // as given (for logs)
  std::string host;   // DNS name or IP literal without brackets
  uint16_t port = 0;
  bool literal = false;  // an IP literal: one static replica, never resolved
  std::string address;   // literal only: the replica's gRPC target
};

// One --tulip entry. INVALID_ARGUMENT naming `flag` and the entry on a malformed one.
Result<TulipEndpoint> parseTulipEndpoint(std::string_view entry, std::string_view flag = "--tulip");

// Every entry (already split on commas by the flag parser; commas inside an entry are split here
// too, so "ipv4:a:1,b:2" from gRPC's multi-address syntax works). Empty list → INVALID_ARGUMENT.
Result<std::vector<TulipEndpoint>> parseTulipEndpoints(const std::vector<std::string>& entries,
                                                       std::string_view flag = "--tulip");

// host + port → the replica addresses (gRPC targets), deduplicated and sorted. A failed lookup is
// UNAVAILABLE with the resolver's message (the pool then keeps the replicas it has).
using Resolver =
    std::function<Result<std::vector<std::string>>(const std::string& host, uint16_t port)>;

// getaddrinfo (AF_UNSPEC, AI_ADDRCONFIG, TCP). Blocks for as long as the system resolver takes.
Result<std::vector<std::string>> resolveSystem(const std::string& host, uint16_t port);

// "ipv4:1.2.3.4:50051" → "1.2.3.4:50051"; "ipv6:[::1]:50051" → "[::1]:50051" (metric labels, logs).
std::string displayAddress(std::string_view address);

}  // namespace garden::ivy
