#include "services/ivy/http/auth.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "common/logging.h"

namespace garden::ivy {
namespace {

struct FileFacts {
  int64_t mtime_ns = 0;
  int64_t size = 0;
};

bool statFile(const std::string& path, FileFacts* f) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  f->mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  f->size = st.st_size;
  return true;
}

Result<std::vector<std::string>> readKeys(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return notFound("--api-keys-file " + path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  auto keys = parseApiKeys(ss.str());
  if (!keys.isOk()) return invalidArgument("--api-keys-file " + path + ": " + keys.status().message());
  return keys;
}

}  // namespace

bool constantTimeEquals(std::string_view presented, std::string_view expected) {
  // Compare every byte of `presented` against the key (cycled), so a length mismatch costs as long
  // as a content mismatch; the volatile accumulator keeps the compiler from exiting early.
  volatile unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  if (expected.empty()) return false;
  for (size_t i = 0; i < presented.size(); ++i) {
    diff = diff | static_cast<unsigned char>(presented[i] ^ expected[i % expected.size()]);
  }
  return diff == 0;
}

Result<std::vector<std::string>> parseApiKeys(std::string_view text) {
  std::vector<std::string> keys;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    while (!line.empty() &&
           (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) {
      line.remove_suffix(1);
    }
    if (line.empty() || line.front() == '#') continue;
    keys.emplace_back(line);
  }
  if (keys.empty()) return invalidArgument("holds no key (one key per line, # for comments)");
  return keys;
}

ApiKeys::ApiKeys(std::vector<std::string> keys)
    : keys_(std::make_shared<const std::vector<std::string>>(std::move(keys))) {}

ApiKeys::ApiKeys(std::string path, std::vector<std::string> keys, int64_t mtime, int64_t size)
    : path_(std::move(path)),
      keys_(std::make_shared<const std::vector<std::string>>(std::move(keys))),
      mtime_ns_(mtime),
      file_size_(size),
      last_stat_(std::chrono::steady_clock::now()) {}

Result<std::unique_ptr<ApiKeys>> ApiKeys::load(std::string path) {
  FileFacts f;
  statFile(path, &f);
  ASSIGN_OR_RETURN(std::vector<std::string> keys, readKeys(path));
  return std::unique_ptr<ApiKeys>(new ApiKeys(std::move(path), std::move(keys), f.mtime_ns, f.size));
}

Status ApiKeys::reload() {
  if (path_.empty()) return okStatus();
  FileFacts f;
  statFile(path_, &f);
  Result<std::vector<std::string>> keys = readKeys(path_);
  MutexLock lock(mu_);
  mtime_ns_ = f.mtime_ns;
  file_size_ = f.size;
  if (!keys.isOk()) {
    log::warn("api keys not reloaded; keeping the previous keys", {{"status", keys.status()}});
    return keys.status();
  }
  keys_ = std::make_shared<const std::vector<std::string>>(std::move(keys).value());
  log::info("api keys loaded", {{"path", path_}, {"keys", keys_->size()}});
  return okStatus();
}

void ApiKeys::maybeReload() const {
  if (path_.empty()) return;
  {
    MutexLock lock(mu_);
    auto now = std::chrono::steady_clock::now();
    if (now - last_stat_ < std::chrono::seconds(1)) return;
    last_stat_ = now;
    FileFacts f;
    if (!statFile(path_, &f) || (f.mtime_ns == mtime_ns_ && f.size == file_size_)) return;
  }
  (void)const_cast<ApiKeys*>(this)->reload();
}

size_t ApiKeys::size() const {
  MutexLock lock(mu_);
  return keys_->size();
}

Status ApiKeys::check(const HttpRequest& request) const {
  maybeReload();
  std::string_view auth = request.header("authorization");
  constexpr std::string_view kBearer = "bearer ";
  if (auth.empty()) return unauthenticated("missing API key: send `Authorization: Bearer <key>`");
  bool scheme_ok = auth.size() > kBearer.size();
  for (size_t i = 0; scheme_ok && i < kBearer.size(); ++i) {
    char c = auth[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    scheme_ok = c == kBearer[i];
  }
  if (!scheme_ok) return unauthenticated("the Authorization header must be `Bearer <key>`");
  std::string_view presented = auth.substr(kBearer.size());
  while (!presented.empty() && presented.front() == ' ') presented.remove_prefix(1);
  std::shared_ptr<const std::vector<std::string>> keys;
  {
    MutexLock lock(mu_);
    keys = keys_;
  }
  bool ok = false;
  for (const std::string& k : *keys) ok |= constantTimeEquals(presented, k);  // no early exit
  if (!ok) return unauthenticated("invalid API key");
  return okStatus();
}

}  // namespace garden::ivy
