#pragma once
// ApiKeys: bearer-token authentication for ivy's API routes [TAG_AUTH].
//
// The key file (--api-keys-file) is a TokenFile (common/token_file.h): one key per line; blank
// lines and lines starting with '#' are ignored, surrounding blanks are trimmed. A request is let
// in when its `Authorization: Bearer <key>` matches one of the keys. Keys are compared in constant
// time with respect to their content (every key is compared, in full, whatever matched), so
// response timing does not reveal how much of a guess was right. Anything else is
// UNAUTHENTICATED, which errorResponse() turns into 401 with `WWW-Authenticate: Bearer
// realm="garden"`.
//
// Reloading: reload() re-reads the file (main.cc calls it on SIGHUP); check() also re-reads it
// when its modification time or size changed, looked at no more than once a second. A reload that
// fails (file gone, unreadable, no keys) keeps the previous keys and logs a warning, so a bad edit
// never locks everyone out nor lets everyone in.
//
// Thread-safe: check() runs on every io thread concurrently.

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/token_file.h"
#include "services/ivy/http/message.h"

namespace garden::ivy {

class ApiKeys {
 public:
  // Loads `path`. NOT_FOUND / INVALID_ARGUMENT naming the flag and the file when it cannot be
  // used.
  static Result<std::unique_ptr<ApiKeys>> load(std::string path);
  // For tests: fixed keys, never reloaded.
  explicit ApiKeys(std::vector<std::string> keys);

  // OK when the request carries a valid bearer key; UNAUTHENTICATED otherwise.
  Status check(const HttpRequest& request) const;
  Status reload() { return keys_->reload(); }
  size_t size() const { return keys_->size(); }

 private:
  explicit ApiKeys(std::unique_ptr<TokenFile> keys) : keys_(std::move(keys)) {}

  std::unique_ptr<TokenFile> keys_;
};

}  // namespace garden::ivy
