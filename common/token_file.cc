#include "common/token_file.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "common/logging.h"

namespace garden {
namespace {

struct FileFacts {
  int64_t mtime_ns = 0;
  int64_t bytes = 0;
};

// stat() follows symlinks: a Kubernetes Secret volume swaps the target of its ..data link.
bool statFile(const std::string& path, FileFacts* f) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  f->mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  f->bytes = st.st_size;
  return true;
}

Result<std::vector<std::string>> readTokens(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return notFound(flag + " " + path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  auto tokens = parseTokenLines(ss.str());
  if (!tokens.isOk()) return invalidArgument(flag + " " + path + ": " + tokens.status().message());
  return tokens;
}

}  // namespace

bool constantTimeEquals(std::string_view presented, std::string_view expected) {
  // Compare every byte of `presented` against the token (cycled), so a length mismatch costs as
  // long as a content mismatch; the volatile accumulator keeps the compiler from exiting early.
  volatile unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  if (expected.empty()) return false;
  for (size_t i = 0; i < presented.size(); ++i) {
    diff = diff | static_cast<unsigned char>(presented[i] ^ expected[i % expected.size()]);
  }
  return diff == 0;
}

Result<std::vector<std::string>> parseTokenLines(std::string_view text) {
  std::vector<std::string> tokens;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    const size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string_view::npos || line[b] == '#') continue;
    line = line.substr(b, line.find_last_not_of(" \t\r") - b + 1);
    tokens.emplace_back(line);
  }
  if (tokens.empty()) return invalidArgument("holds no token (one per line, # for comments)");
  return tokens;
}

TokenFile::TokenFile(std::vector<std::string> tokens)
    : tokens_(std::make_shared<const std::vector<std::string>>(std::move(tokens))) {}

TokenFile::TokenFile(std::string path, std::string flag, std::vector<std::string> tokens,
                     int64_t mtime_ns, int64_t bytes)
    : path_(std::move(path)),
      flag_(std::move(flag)),
      tokens_(std::make_shared<const std::vector<std::string>>(std::move(tokens))),
      mtime_ns_(mtime_ns),
      bytes_(bytes),
      last_stat_(std::chrono::steady_clock::now()) {}

Result<std::unique_ptr<TokenFile>> TokenFile::load(std::string path, std::string flag) {
  FileFacts f;
  statFile(path, &f);
  ASSIGN_OR_RETURN(std::vector<std::string> tokens, readTokens(path, flag));
  return std::unique_ptr<TokenFile>(
      new TokenFile(std::move(path), std::move(flag), std::move(tokens), f.mtime_ns, f.bytes));
}

Status TokenFile::reload() const {
  if (path_.empty()) return okStatus();
  FileFacts f;
  statFile(path_, &f);
  Result<std::vector<std::string>> tokens = readTokens(path_, flag_);
  std::lock_guard<std::mutex> lock(mu_);
  mtime_ns_ = f.mtime_ns;
  bytes_ = f.bytes;
  if (!tokens.isOk()) {
    log::warn("token file not reloaded; keeping the previous tokens", {{"status", tokens.status()}});
    return tokens.status();
  }
  tokens_ = std::make_shared<const std::vector<std::string>>(std::move(tokens).value());
  log::info("token file loaded", {{"flag", flag_}, {"path", path_}, {"tokens", tokens_->size()}});
  return okStatus();
}

void TokenFile::maybeReload() const {
  if (path_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (now - last_stat_ < std::chrono::seconds(1)) return;
    last_stat_ = now;
    FileFacts f;
    if (!statFile(path_, &f) || (f.mtime_ns == mtime_ns_ && f.bytes == bytes_)) return;
  }
  (void)reload();
}

std::shared_ptr<const std::vector<std::string>> TokenFile::current() const {
  maybeReload();
  std::lock_guard<std::mutex> lock(mu_);
  return tokens_;
}

bool TokenFile::matches(std::string_view presented) const {
  const auto tokens = current();
  bool ok = false;
  for (const std::string& t : *tokens) ok |= constantTimeEquals(presented, t);  // no early exit
  return ok;
}

std::string TokenFile::first() const { return current()->front(); }

size_t TokenFile::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tokens_->size();
}

Status checkBearer(std::string_view authorization, const TokenFile& tokens,
                   const BearerNames& names) {
  constexpr std::string_view kBearer = "bearer ";
  const std::string usage = "`Bearer <" + std::string(names.placeholder) + ">`";
  if (authorization.empty()) {
    return unauthenticated("missing " + std::string(names.what) + ": send `" +
                           std::string(names.header) + ": " + usage.substr(1));
  }
  bool scheme_ok = authorization.size() > kBearer.size();
  for (size_t i = 0; scheme_ok && i < kBearer.size(); ++i) {
    char c = authorization[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    scheme_ok = c == kBearer[i];
  }
  if (!scheme_ok) {
    return unauthenticated("the " + std::string(names.header) + " value must be " + usage);
  }
  std::string_view presented = authorization.substr(kBearer.size());
  while (!presented.empty() && presented.front() == ' ') presented.remove_prefix(1);
  if (!tokens.matches(presented)) return unauthenticated("invalid " + std::string(names.what));
  return okStatus();
}

}  // namespace garden
