#pragma once
// tulip's Load RPC for integration tests that poll it (queued / in-flight tokens, LLM sequences).
// Header-only so that the harness itself stays free of gRPC.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <optional>

#include "garden/v1/garden.grpc.pb.h"

namespace garden::testing {

// tulip's Load answer (10 s deadline), or nullopt when the call fails.
inline std::optional<v1::LoadResponse> tulipLoad(v1::Tulip::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::LoadResponse load;
  if (!stub.Load(&ctx, v1::LoadRequest(), &load).ok()) return std::nullopt;
  return load;
}

}  // namespace garden::testing
