#pragma once
// ApiKeys: bearer-token authentication for ivy's API routes [TAG_AUTH].
//
// The key file (--api-keys-file) holds one key per line; blank lines and lines starting with '#'
// are ignored, surrounding blanks are trimmed. A request is let in when its
// `Authorization: Bearer <key>` matches one of the keys. Keys are compared in constant time with
// respect to their content (every key is compared, in full, whatever matched), so response timing
// does not reveal how much of a guess was right. Anything else is UNAUTHENTICATED, which
// errorResponse() turns into 401 with `WWW-Authenticate: Bearer realm="garden"`.
//
// Reloading: reload() re-reads the file (main.cc calls it on SIGHUP); check() also re-reads it
// when its modification time or size changed, looked at no more than once a second. A reload that
// fails (file gone, unreadable, no keys) keeps the previous keys and logs a warning, so a bad edit
// never locks everyone out nor lets everyone in.
//
// Thread-safe: check() runs on every io thread concurrently.

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "services/ivy/http/message.h"

namespace garden::ivy {

// Constant-time equality of two byte strings: the time depends on `presented`'s length only.
bool constantTimeEquals(std::string_view presented, std::string_view expected);

// Parses key-file text into keys. INVALID_ARGUMENT when it holds no key.
Result<std::vector<std::string>> parseApiKeys(std::string_view text);

class ApiKeys {
 public:
  // Loads `path`. NOT_FOUND / INVALID_ARGUMENT naming the file when it cannot be used.
  static Result<std::unique_ptr<ApiKeys>> load(std::string path);
  // For tests: fixed keys, never reloaded.
  explicit ApiKeys(std::vector<std::string> keys);

  // OK when the request carries a valid bearer key; UNAUTHENTICATED otherwise.
  Status check(const HttpRequest& request) const EXCLUDES(mu_);
  Status reload() EXCLUDES(mu_);
  size_t size() const EXCLUDES(mu_);

 private:
  ApiKeys(std::string path, std::vector<std::string> keys, int64_t mtime, int64_t size);
  void maybeReload() const EXCLUDES(mu_);

  std::string path_;  // empty: fixed keys
  mutable Mutex mu_;
  std::shared_ptr<const std::vector<std::string>> keys_ GUARDED_BY(mu_);
  mutable int64_t mtime_ns_ GUARDED_BY(mu_) = 0;
  mutable int64_t file_size_ GUARDED_BY(mu_) = 0;
  mutable std::chrono::steady_clock::time_point last_stat_ GUARDED_BY(mu_);
};

}  // namespace garden::ivy
