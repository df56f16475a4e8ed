#include "common/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace garden {

std::string_view statusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kUnknown: return "UNKNOWN";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

std::string Status::toString() const {
  if (isOk()) return "OK";
  std::string s(statusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::withContext(std::string_view prefix) const {
  if (isOk()) return *this;
  return Status(code_, std::string(prefix) + ": " + message_);
}

Status errnoStatus(std::string_view what, int err) {
  std::string m(what);
  m += ": ";
  m += std::strerror(err);
  return Status(err == ENOENT ? StatusCode::kNotFound : StatusCode::kInternal, std::move(m));
}

void checkFailed(const char* cond, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "CHECK failed: %s at %s:%d%s%s\n", cond, file, line, msg ? ": " : "",
               msg ? msg : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace garden
