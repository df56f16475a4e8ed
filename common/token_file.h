#pragma once
// TokenFile: a shared secret kept in a file, re-read when the file changes [TAG_TULIP_TOKEN].
//
// tulip's --auth-token-file holds the tokens it accepts, ivy's --tulip-token-file the one it
// presents: one token per line, blank lines and lines starting with '#' ignored, surrounding blanks
// trimmed. Several lines make rotation possible without a gap: add the new token to tulip's file,
// switch ivy's file to it, then drop the old one. A client presents the first token.
//
// Reloading: reload() re-reads the file (the binaries call it on SIGHUP); matches() and first()
// also re-read it when its modification time or size changed, looked at no more than once a
// second (so a Kubernetes Secret update, which swaps the file behind a symlink, is picked up). A
// reload that fails (file gone, unreadable, no token) keeps the previous tokens and logs a
// warning, so a bad edit never locks every caller out nor lets every caller in.
//
// Thread-safe: every method may be called from any thread (tulip checks on every RPC handler).
// Comparison is constant time in the tokens' content (constantTimeEquals), so timing does not
// reveal how much of a guess was right.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace garden {

// Equality of two byte strings whose time depends on `presented`'s length only.
bool constantTimeEquals(std::string_view presented, std::string_view expected);

// The tokens in `text` (format above). INVALID_ARGUMENT when it holds none.
Result<std::vector<std::string>> parseTokenLines(std::string_view text);

class TokenFile {
 public:
  // Loads `path`; `flag` names the file in errors and logs ("--auth-token-file"). NOT_FOUND /
  // INVALID_ARGUMENT naming the flag and the file when it cannot be used.
  static Result<std::unique_ptr<TokenFile>> load(std::string path, std::string flag);
  // Fixed tokens, never reloaded (tests).
  explicit TokenFile(std::vector<std::string> tokens);

  // True when `presented` equals one of the tokens. Every token is compared in full.
  bool matches(std::string_view presented) const;
  // The token a client presents: the file's first.
  std::string first() const;
  Status reload() const;  // the file's state is mutable: readers reload it as they go
  size_t size() const;

 private:
  TokenFile(std::string path, std::string flag, std::vector<std::string> tokens, int64_t mtime_ns,
            int64_t bytes);
  std::shared_ptr<const std::vector<std::string>> current() const;  // after maybeReload()
  void maybeReload() const;

  const std::string path_;  // empty: fixed tokens
  const std::string flag_;
  mutable std::mutex mu_;
  mutable std::shared_ptr<const std::vector<std::string>> tokens_;  // guarded by mu_
  mutable int64_t mtime_ns_ = 0;                               // guarded by mu_
  mutable int64_t bytes_ = 0;                                  // guarded by mu_
  mutable std::chrono::steady_clock::time_point last_stat_;    // guarded by mu_
};

// How checkBearer's messages name the secret and the header: tulip's gRPC metadata
// ("missing token: send `authorization: Bearer <token>`") or ivy's HTTP API keys ("missing API
// key: send `Authorization: Bearer <key>`").
struct BearerNames {
  std::string_view what = "token";
  std::string_view header = "authorization";
  std::string_view placeholder = "token";
};

// A presented `Authorization` value checked against `tokens`: OK for "Bearer <token>" (scheme
// case-insensitive) with a matching token, UNAUTHENTICATED naming what is wrong otherwise.
Status checkBearer(std::string_view authorization, const TokenFile& tokens,
                   const BearerNames& names = {});

}  // namespace garden
