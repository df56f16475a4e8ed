#pragma once
// [TAG_STATUS_MAPPING] The one place a garden::Status becomes a gRPC status (codes are the same
// canonical set). ivy maps gRPC statuses to HTTP in services/ivy/api.

#include <grpcpp/support/status.h>

#include "common/status.h"

namespace garden::tulip {

inline grpc::Status toGrpcStatus(const Status& st) {
  if (st.isOk()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), st.message());
}

}  // namespace garden::tulip
