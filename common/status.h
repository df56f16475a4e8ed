#pragma once
// Status and Result<T>: errors as values. Codes are the gRPC canonical set so that a Status maps
// to a gRPC status and an HTTP response in exactly one place each (see [TAG_STATUS_MAPPING]).
// Thread-compatible value types; no exception ever crosses a module boundary.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace garden {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

std::string_view statusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool isOk() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message"
  std::string toString() const;

  // Returns a copy whose message is "prefix: message".
  Status withContext(std::string_view prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status okStatus() { return Status(); }
inline Status invalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status notFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status internalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status resourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status failedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status deadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status cancelledError(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status outOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status dataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status unauthenticated(std::string m) { return {StatusCode::kUnauthenticated, std::move(m)}; }
// errno-based: "what: strerror(errno)" as kInternal (or kNotFound for ENOENT).
Status errnoStatus(std::string_view what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).isOk()) v_ = Status(StatusCode::kInternal, "Result built from OK status");
  }

  bool isOk() const { return v_.index() == 0; }
  explicit operator bool() const { return isOk(); }
  const Status& status() const {
    static const Status kOk;
    return isOk() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace garden

#define GARDEN_CONCAT_INNER(a, b) a##b
#define GARDEN_CONCAT(a, b) GARDEN_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::garden::Status garden_status_ = (expr);        \
    if (!garden_status_.isOk()) return garden_status_; \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.isOk()) return tmp.status();       \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(GARDEN_CONCAT(garden_result_, __LINE__), lhs, expr)

// Broken invariants: log and abort (continuing would corrupt state).
#define CHECK(cond)                                                         \
  do {                                                                      \
    if (!(cond)) ::garden::checkFailed(#cond, __FILE__, __LINE__, nullptr); \
  } while (0)
#define CHECK_MSG(cond, msg)                                             \
  do {                                                                   \
    if (!(cond)) ::garden::checkFailed(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)

namespace garden {
[[noreturn]] void checkFailed(const char* cond, const char* file, int line, const char* msg);
}  // namespace garden
