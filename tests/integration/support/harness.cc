#include "tests/integration/support/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace garden::testing {

namespace fs = std::filesystem;

std::string sourceDir() {
  const char* s = std::getenv("GARDEN_SOURCE_DIR");
  return s ? s : ".";
}

std::string buildDir() {
  const char* s = std::getenv("GARDEN_BUILD_DIR");
  return s ? s : ".";
}

std::string binary(const std::string& rel) { return buildDir() + "/" + rel; }

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "garden-it-XXXXXX").string();
  char* p = mkdtemp(tmpl.data());
  path_ = p ? p : "/tmp";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty() && path_ != "/tmp") fs::remove_all(path_, ec);
}

std::vector<std::string> tulipArgv(int port, int metrics_port, const std::string& model,
                                   const std::string& worker_rel, const std::string& shm_tag) {
  return {binary("services/tulip/tulip"),
          "--host",
          "127.0.0.1",
          "--port",
          std::to_string(port),
          "--metrics-port",
          std::to_string(metrics_port),
          "--model",
          model,
          "--rose-bin",
          binary(worker_rel),
          "--shm-name",
          "/garden-" + shm_tag + "-" + std::to_string(getpid()) + "-" + std::to_string(port)};
}

namespace {

// Whether 127.0.0.1:port can be bound now (and is released again).
bool bindable(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

}  // namespace

// Below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by default). A
// port that bind(0) picked and released is an ephemeral one: before the child binds it, any
// outgoing connection on the machine may take it as its source port (seen under parallel ctest:
// ivy "cannot listen on 127.0.0.1:36487: Address already in use"). Ports in [20000, 32000) are
// never handed to outgoing connections; a random one that binds now, never twice from this
// process, leaves only two test processes drawing the same port at the same moment.
int freePort() {
  static std::mutex mu;
  static std::set<int> given;
  static std::mt19937 rng(std::random_device{}() ^ static_cast<uint32_t>(getpid()));
  std::lock_guard<std::mutex> l(mu);
  for (int attempt = 0; attempt < 2000; ++attempt) {
    const int port = 20000 + static_cast<int>(rng() % 12000);
    if (given.count(port) != 0 || !bindable(port)) continue;
    given.insert(port);
    return port;
  }
  // Everything tried was taken: fall back to the kernel's choice.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  close(fd);
  given.insert(port);
  return port;
}

Process::Process(std::vector<std::string> argv, std::string log_path)
    : log_path_(std::move(log_path)) {
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s failed: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
}

Process::~Process() {
  if (pid_ > 0 && !reaped_) {
    if (signal(SIGTERM, std::chrono::milliseconds(5000)) == -1) signal(SIGKILL);
  }
}

bool Process::alive() {
  if (reaped_) return false;
  int st = 0;
  if (waitpid(pid_, &st, WNOHANG) == pid_) {
    reaped_ = true;
    status_ = st;
    return false;
  }
  return true;
}

int Process::signal(int sig, std::chrono::milliseconds wait) {
  if (reaped_) return status_;
  ::kill(pid_, sig);
  if (sig != SIGTERM && sig != SIGKILL && sig != SIGINT) return 0;
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < wait) {
    if (!alive()) return status_;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

std::string Process::log() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Paused::Paused(pid_t pid) {
  if (pid > 0 && ::kill(pid, SIGSTOP) == 0) pid_ = pid;
}

void Paused::resume() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);
  pid_ = -1;
}

bool eventually(std::chrono::milliseconds limit, const std::function<bool()>& pred,
                std::chrono::milliseconds every) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(every);
  }
  return pred();
}

double metricSum(const std::string& page, const std::string& prefix) {
  double sum = 0;
  size_t pos = 0;
  while ((pos = page.find(prefix, pos)) != std::string::npos) {
    if (pos == 0 || page[pos - 1] == '\n') {
      size_t sp = page.find(' ', pos + prefix.size() - 1);
      if (sp != std::string::npos) sum += std::strtod(page.c_str() + sp, nullptr);
    }
    pos += prefix.size();
  }
  return sum;
}

std::vector<pid_t> childrenOf(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (auto& t : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream f(t.path() / "children");
    pid_t c;
    while (f >> c) out.push_back(c);
  }
  return out;
}

bool processRunning(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

std::vector<pid_t> runningChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  for (pid_t c : childrenOf(pid)) {
    if (processRunning(c)) out.push_back(c);
  }
  return out;
}

std::pair<pid_t, pid_t> prefillAndDecodeRose(pid_t tulip) {
  pid_t prefill = 0, decode = 0;
  for (pid_t k : runningChildrenOf(tulip)) {
    std::ifstream f("/proc/" + std::to_string(k) + "/cmdline");
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    (cmd.find("--kv-export") != std::string::npos ? prefill : decode) = k;
  }
  return {prefill, decode};
}

HttpResponse http(int port, const std::string& method, const std::string& path,
                  const std::string& body, const std::map<std::string, std::string>& headers,
                  std::chrono::milliseconds timeout) {
  HttpResponse r;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return r;
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  bool has_type = false;
  for (auto& [k, v] : headers) {
    req += k + ": " + v + "\r\n";
    if (strcasecmp(k.c_str(), "content-type") == 0) has_type = true;
  }
  if (!body.empty() || method == "POST") {
    if (!has_type) req += "Content-Type: application/json\r\n";
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n";
  req += body;
  size_t off = 0;
  while (off < req.size()) {
    ssize_t n = send(fd, req.data() + off, req.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer early (e.g. 413) and close
    off += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[65536];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  size_t hdr_end = raw.find("\r\n\r\n");
  if (hdr_end == std::string::npos || raw.compare(0, 5, "HTTP/") != 0) return r;
  std::istringstream hs(raw.substr(0, hdr_end));
  std::string line;
  std::getline(hs, line);
  r.status = std::atoi(line.substr(line.find(' ') + 1).c_str());
  while (std::getline(hs, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    auto c = line.find(':');
    if (c == std::string::npos) continue;
    std::string k = line.substr(0, c), v = line.substr(c + 1);
    std::transform(k.begin(), k.end(), k.begin(), ::tolower);
    v.erase(0, v.find_first_not_of(' '));
    r.headers[k] = v;
  }
  std::string rest = raw.substr(hdr_end + 4);
  if (r.headers["transfer-encoding"] == "chunked") {
    size_t p = 0;
    while (p < rest.size()) {
      size_t e = rest.find("\r\n", p);
      if (e == std::string::npos) break;
      size_t len = std::strtoul(rest.substr(p, e - p).c_str(), nullptr, 16);
      if (len == 0) break;
      r.body += rest.substr(e + 2, len);
      p = e + 2 + len + 2;
    }
  } else {
    r.body = rest;
  }
  return r;
}

bool waitForHttp(int port, const std::string& path, int want, std::chrono::milliseconds limit) {
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < limit) {
    if (http(port, "GET", path, "", {}, std::chrono::milliseconds(2000)).status == want)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

int run(const std::vector<std::string>& argv, const std::string& log_path) {
  Process p(argv, log_path.empty() ? "/dev/null" : log_path);
  auto t0 = std::chrono::steady_clock::now();
  while (p.alive()) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::minutes(5)) {
      p.signal(SIGKILL);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int st = p.signal(0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace garden::testing
