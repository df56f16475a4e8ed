#pragma once
// tulip's Load RPC for integration tests that poll it (queued / in-flight tokens, LLM sequences).
// Header-only so that the harness itself stays free of gRPC.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <optional>

#include "garden/v1/garden.grpc.pb.h"
#include "tests/integration/support/harness.h"

namespace garden::testing {

// tulip's Load answer (10 s deadline), or nullopt when the call fails.
inline std::optional<v1::LoadResponse> tulipLoad(v1::Tulip::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::LoadResponse load;
  if (!stub.Load(&ctx, v1::LoadRequest(), &load).ok()) return std::nullopt;
  return load;
}

// Polls Load (500 ms deadline each) until tulip's worker is ready; false when `limit` passed
// first.
inline bool waitWorkerReady(v1::Tulip::Stub& stub, std::chrono::milliseconds limit) {
  return eventually(limit, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    v1::LoadResponse load;
    return stub.Load(&ctx, v1::LoadRequest(), &load).ok() && load.worker_ready();
  });
}

}  // namespace garden::testing
