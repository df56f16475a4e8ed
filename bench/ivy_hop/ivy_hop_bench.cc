// ivy_hop_bench: what ivy itself spends on one /v1/embeddings request of one ~512-token text, piece
// by piece, with the real code paths:
//   parse        parseEmbeddingsRequest on the HTTP body
//   tokenize     resolveTokens with the real tokenizer.json (GardenEncoder)
//   render_float renderEmbeddingsResponse of one 1024-float embedding, encoding_format "float"
//   render_b64   the same, encoding_format "base64"
//   grpc_hop_tcp GrpcTulipClient::embed (ivy's real client) to an in-process garden.v1.Tulip that
//                answers at once with one 1024-float row: both ends of the hop, minus the model,
//                over TCP loopback (how ivy reaches tulip); grpc_hop_unix the same over a
//                Unix-domain socket (--unix PATH)
//   ivy_e2e      (--ivy PATH) the real ivy binary in front of the instant tulip: one HTTP/1.1
//                keep-alive connection posting the 512-token /v1/embeddings request; wall time per
//                request, and CPU per request of the ivy process (/proc utime + stime over all
//                requests) and of this process (client + the instant tulip); --e2e-conns N: N
//                such connections at once, one thread each, --e2e-iters requests each (adds
//                requests_per_s)
// For each: p50/p99 of per-call thread CPU time (the pieces on one thread) or of wall time and
// process CPU time per call (the gRPC hop runs on gRPC's threads: client, server, completion),
// after warm-up. CPU time is what the host pays and is robust to a shared machine; wall time is
// what a caller waits and is not. Output: one JSON object per line on stdout.
//
// usage: ivy_hop_bench --tokenizer tokenizer.json [--iters N] [--grpc-iters N] [--unix PATH]
//                      [--ivy build/services/ivy/ivy] [--e2e-iters N] [--e2e-conns N]
//                      [--ivy-arg ARG]...
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/loadgen/http_client.h"
#include "common/json_writer.h"
#include "garden/v1/garden.grpc.pb.h"
#include "services/ivy/api/embeddings.h"
#include "services/ivy/api/garden_encoder.h"
#include "services/ivy/balance/tulip_client.h"

namespace {

using namespace garden;
using namespace garden::ivy;

int64_t clockNs(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

struct Stat {
  double p50 = 0, p99 = 0, mean = 0;
};
Stat stat(std::vector<double> v) {
  Stat s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.p50 = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  return s;
}

void emit(const std::string& name, const std::string& clock, const Stat& s, size_t n,
          const std::string& extra_key = "", double extra = 0) {
  std::string out;
  JsonWriter w(&out);
  w.beginObject().field("bench", "ivy_hop").field("piece", name).field("clock", clock);
  w.field("n", n).field("p50_us", s.p50).field("p99_us", s.p99).field("mean_us", s.mean);
  if (!extra_key.empty()) w.field(extra_key, extra);
  w.endObject();
  std::printf("%s\n", out.c_str());
  std::fflush(stdout);
}

// Thread CPU time per call of fn, µs.
template <typename Fn>
std::vector<double> timeThreadCpu(int iters, Fn fn) {
  for (int i = 0; i < iters / 10 + 5; ++i) fn();
  std::vector<double> v;
  v.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    const int64_t t0 = clockNs(CLOCK_THREAD_CPUTIME_ID);
    fn();
    v.push_back(double(clockNs(CLOCK_THREAD_CPUTIME_ID) - t0) / 1e3);
  }
  return v;
}

// ~512 tokens of English prose (as bench/loadgen's text workloads: common words), calibrated
// with the encoder.
std::string makeText(const TextEncoder& enc, size_t target) {
  static const char* kWords[] = {"time", "person", "year", "way", "day", "thing", "man", "world",
                                 "life", "hand", "part", "child", "eye", "woman", "place", "work",
                                 "week", "case", "point", "government", "company", "number",
                                 "group", "problem", "fact", "about", "after", "again", "because",
                                 "between", "through", "under", "water", "young", "people"};
  std::string text;
  uint32_t x = 12345;
  while (true) {
    x = x * 1103515245 + 12345;
    if (!text.empty()) text += ' ';
    text += kWords[(x >> 8) % (sizeof(kWords) / sizeof(kWords[0]))];
    if ((x >> 4) % 13 == 0) text += '.';
    auto ids = enc.encode(text);
    if (ids.isOk() && ids->size() >= target) return text;
  }
}

// garden.v1.Tulip that answers Embed at once with `dim` floats per input (and ModelInfo / Load,
// which ivy's replica pool asks before it sends a replica work).
class InstantTulip final : public garden::v1::Tulip::CallbackService {
 public:
  uint32_t vocab = 151669, max_seq_len = 32768;
  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* ctx,
                                      const garden::v1::ModelInfoRequest*,
                                      garden::v1::ModelInfoResponse* resp) override {
    resp->set_model("qwen3-embedding");
    resp->set_kind("embedding");
    resp->set_hidden_size(dim_);
    resp->set_max_seq_len(max_seq_len);
    resp->set_vocab_size(vocab);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  grpc::ServerUnaryReactor* Load(grpc::CallbackServerContext* ctx, const garden::v1::LoadRequest*,
                                 garden::v1::LoadResponse* resp) override {
    resp->set_worker_ready(true);
    resp->set_model("qwen3-embedding");
    resp->set_max_seq_len(max_seq_len);
    resp->set_hidden_size(dim_);
    resp->set_queue_limit_tokens(1u << 30);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  explicit InstantTulip(uint32_t dim) : row_(dim * sizeof(float), '\0') {
    std::vector<float> f(dim);
    for (uint32_t i = 0; i < dim; ++i) f[i] = 0.03125f * float(int(i % 61) - 30) / 7.0f;
    std::memcpy(row_.data(), f.data(), row_.size());
    dim_ = dim;
  }
  grpc::ServerUnaryReactor* Embed(grpc::CallbackServerContext* ctx,
                                  const garden::v1::EmbedRequest* req,
                                  garden::v1::EmbedResponse* resp) override {
    resp->set_dim(dim_);
    uint64_t tokens = 0;
    for (const auto& in : req->inputs()) {
      tokens += static_cast<uint64_t>(in.ids_size());
      resp->add_embeddings(row_);
    }
    resp->set_prompt_tokens(tokens);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

 private:
  std::string row_;
  uint32_t dim_ = 0;
};

// utime + stime of process `pid` in µs (/proc/PID/stat; clock-tick resolution).
double procCpuUs(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  const size_t rp = line.rfind(')');
  if (rp == std::string::npos) return 0;
  std::istringstream in(line.substr(rp + 2));
  std::string tok;
  double ut = 0, st = 0;
  for (int field = 3; in >> tok; ++field) {  // field 3 is the state
    if (field == 14) ut = std::atof(tok.c_str());
    if (field == 15) {
      st = std::atof(tok.c_str());
      break;
    }
  }
  return (ut + st) * 1e6 / double(sysconf(_SC_CLK_TCK));
}

int freePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(a.sin_port);
}

// One request on loadgen's keep-alive connection (bench/loadgen/http_client.h): the status code
// (0: the connection or the response broke) and the body in `out`.
int roundTrip(bench::Connection& c, const std::string& req, std::string* out) {
  bench::ResponseReader reader;
  if (!c.roundTrip(req, reader).isOk()) return 0;
  *out = reader.body();
  return reader.status();
}

// ivy_e2e: the real ivy binary in front of the instant tulip; see the header.
int runE2e(const std::string& ivy_bin, const std::vector<std::string>& ivy_args,
           const std::string& tokenizer, const std::string& body, int iters, uint32_t vocab,
           int conns) {
  constexpr uint32_t kDim = 1024;
  InstantTulip service(kDim);
  service.vocab = vocab;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder b;
  int tport = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &tport);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  const int hport = freePort();
  if (!server || tport == 0 || hport == 0) {
    std::fprintf(stderr, "ivy_hop_bench: cannot start the instant tulip or find a port\n");
    return 1;
  }
  std::vector<std::string> args = {ivy_bin, "--port=" + std::to_string(hport),
                                   "--tulip=127.0.0.1:" + std::to_string(tport),
                                   "--tokenizer=" + tokenizer, "--log-level=warn"};
  args.insert(args.end(), ivy_args.begin(), ivy_args.end());
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> av;
    for (auto& a : args) av.push_back(a.data());
    av.push_back(nullptr);
    execv(av[0], av.data());
    std::_Exit(127);
  }
  auto stop = [&](int rc) {
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    server->Shutdown();
    return rc;
  };
  // Ready when /ready answers 200 (ivy has asked the tulip for its model).
  bool ready = false;
  for (int i = 0; i < 200 && !ready; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    bench::Connection c("127.0.0.1", hport, std::chrono::milliseconds(2000));
    std::string out;
    ready = roundTrip(c, "GET /ready HTTP/1.1\r\nHost: x\r\n\r\n", &out) == 200;
  }
  if (!ready) {
    std::fprintf(stderr, "ivy_hop_bench: ivy did not become ready on port %d\n", hport);
    return stop(1);
  }
  const std::string req = bench::buildPost("127.0.0.1", "/v1/embeddings", body);
  bench::Connection c("127.0.0.1", hport, std::chrono::milliseconds(10000));
  std::string out;
  for (int i = 0; i < 200; ++i) {
    if (roundTrip(c, req, &out) != 200) {
      std::fprintf(stderr, "ivy_hop_bench: ivy answered: %s\n", out.substr(0, 300).c_str());
      return stop(1);
    }
  }
  // `conns` keep-alive connections, each on its own thread, `iters` requests each.
  std::vector<std::vector<double>> per(static_cast<size_t>(conns));
  std::atomic<bool> failed{false};
  const double ivy0 = procCpuUs(pid);
  const int64_t self0 = clockNs(CLOCK_PROCESS_CPUTIME_ID);
  const int64_t t0 = clockNs(CLOCK_MONOTONIC);
  auto client = [&](size_t k, bench::Connection& conn) {
    std::string o;
    per[k].reserve(static_cast<size_t>(iters));
    for (int i = 0; i < iters && !failed.load(); ++i) {
      const int64_t w0 = clockNs(CLOCK_MONOTONIC);
      if (roundTrip(conn, req, &o) != 200) return void(failed = true);
      per[k].push_back(double(clockNs(CLOCK_MONOTONIC) - w0) / 1e3);
    }
  };
  {
    std::vector<std::unique_ptr<bench::Connection>> extra;
    std::vector<std::thread> threads;
    for (int k = 1; k < conns; ++k) {
      extra.push_back(std::make_unique<bench::Connection>("127.0.0.1", hport,
                                                          std::chrono::milliseconds(10000)));
    }
    for (int k = 1; k < conns; ++k) {
      threads.emplace_back(client, static_cast<size_t>(k), std::ref(*extra[k - 1]));
    }
    client(0, c);
    for (auto& t : threads) t.join();
  }
  const double span_s = double(clockNs(CLOCK_MONOTONIC) - t0) / 1e9;
  if (failed.load()) return stop(1);
  std::vector<double> wall;
  for (auto& v : per) wall.insert(wall.end(), v.begin(), v.end());
  const double n = double(wall.size());
  const double ivy_cpu = (procCpuUs(pid) - ivy0) / n;
  const double self_cpu = double(clockNs(CLOCK_PROCESS_CPUTIME_ID) - self0) / 1e3 / n;
  emit("ivy_e2e", "wall", stat(wall), wall.size(), "connections", double(conns));
  std::string line;
  JsonWriter w(&line);
  w.beginObject().field("bench", "ivy_hop").field("piece", "ivy_e2e").field("clock", "process_cpu");
  w.field("n", static_cast<int64_t>(n)).field("connections", conns);
  w.field("requests_per_s", n / span_s);
  w.field("ivy_mean_us", ivy_cpu).field("client_and_tulip_mean_us", self_cpu);
  w.endObject();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return stop(0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer;
  int iters = 3000, grpc_iters = 3000;
  std::string unix_socket;  // also time the hop over this Unix-domain socket (gRPC "unix:" target)
  std::string ivy_bin;      // --ivy: also time the whole request through the real ivy (ivy_e2e)
  int e2e_iters = 3000;
  int e2e_conns = 1;  // --e2e-conns: concurrent keep-alive connections, e2e_iters requests each
  std::vector<std::string> ivy_args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokenizer") {
      tokenizer = next();
    } else if (a == "--iters") {
      iters = std::atoi(next().c_str());
    } else if (a == "--grpc-iters") {
      grpc_iters = std::atoi(next().c_str());
    } else if (a == "--unix") {
      unix_socket = next();
    } else if (a == "--ivy") {
      ivy_bin = next();
    } else if (a == "--e2e-iters") {
      e2e_iters = std::atoi(next().c_str());
    } else if (a == "--e2e-conns") {
      e2e_conns = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--ivy-arg") {
      ivy_args.push_back(next());
    } else {
      std::fprintf(stderr,
                   "usage: ivy_hop_bench --tokenizer tokenizer.json [--iters N] "
                   "[--grpc-iters N] [--unix /tmp/ivy_hop.sock] [--ivy PATH] "
                   "[--e2e-iters N] [--ivy-arg ARG]...\n");
      return 2;
    }
  }
  if (tokenizer.empty() || iters <= 0 || grpc_iters < 0) {
    std::fprintf(stderr, "ivy_hop_bench: --tokenizer is required; counts must be positive\n");
    return 2;
  }
  auto enc = loadGardenEncoder(tokenizer);
  if (!enc.isOk()) {
    std::fprintf(stderr, "ivy_hop_bench: %s\n", enc.status().message().c_str());
    return 1;
  }
  constexpr uint32_t kDim = 1024;
  ModelSpec spec;
  spec.served_name = spec.upstream_name = "qwen3-embedding";
  spec.kind = "embedding";
  spec.hidden_size = kDim;
  spec.max_seq_len = 32768;
  spec.vocab_size = (*enc)->vocabSize();
  RequestLimits limits;

  const std::string text = makeText(**enc, 512);
  std::string body;
  {
    JsonWriter w(&body);
    w.beginObject().field("model", spec.served_name).field("input", text).endObject();
  }
  auto parsed = parseEmbeddingsRequest(body, spec, limits);
  if (!parsed.isOk()) {
    std::fprintf(stderr, "ivy_hop_bench: parse: %s\n", parsed.status().message().c_str());
    return 1;
  }
  auto tokens = resolveTokens(*parsed, enc->get(), spec, limits, "");
  if (!tokens.isOk()) {
    std::fprintf(stderr, "ivy_hop_bench: tokenize: %s\n", tokens.status().message().c_str());
    return 1;
  }
  std::fprintf(stderr, "text: %zu bytes, %zu tokens; body %zu bytes\n", text.size(),
               (*tokens)[0].size(), body.size());

  size_t sink = 0;
  emit("parse", "thread_cpu", stat(timeThreadCpu(iters, [&] {
         auto r = parseEmbeddingsRequest(body, spec, limits);
         sink += r.isOk() ? r->inputs.size() : 0;
       })),
       size_t(iters));
  emit("tokenize", "thread_cpu", stat(timeThreadCpu(iters, [&] {
         auto r = resolveTokens(*parsed, enc->get(), spec, limits, "");
         sink += r.isOk() ? (*r)[0].size() : 0;
       })),
       size_t(iters), "tokens", double((*tokens)[0].size()));
  // A unit-norm row with the spread of a real embedding (mixed signs, ~1e-2..1e-4 magnitudes).
  std::vector<float> row(kDim);
  {
    uint32_t x = 7;
    double ss = 0;
    for (auto& f : row) {
      x = x * 1664525 + 1013904223;
      f = (float(x >> 8) / float(1 << 24) - 0.5f) * (x % 7 == 0 ? 0.01f : 1.0f);
      ss += double(f) * f;
    }
    for (auto& f : row) f = float(f / std::sqrt(ss));
  }
  size_t float_bytes = 0, b64_bytes = 0;
  const Stat float_stat = stat(timeThreadCpu(iters, [&] {
    auto s = renderEmbeddingsResponse(spec.served_name, row, kDim, EncodingFormat::kFloat, 512);
    float_bytes = s.size();
    sink += s.size();
  }));
  emit("render_float", "thread_cpu", float_stat, size_t(iters), "bytes", double(float_bytes));
  const Stat b64_stat = stat(timeThreadCpu(iters, [&] {
    auto s = renderEmbeddingsResponse(spec.served_name, row, kDim, EncodingFormat::kBase64, 512);
    b64_bytes = s.size();
    sink += s.size();
  }));
  emit("render_b64", "thread_cpu", b64_stat, size_t(iters), "bytes", double(b64_bytes));

  // The hop over TCP loopback (how ivy reaches tulip today), and over a Unix socket if asked.
  std::vector<std::pair<std::string, std::string>> transports = {{"tcp", "127.0.0.1:0"}};
  if (!unix_socket.empty()) transports.emplace_back("unix", "unix:" + unix_socket);
  for (const auto& [transport, listen] : transports) {
    if (grpc_iters == 0) break;
    InstantTulip service(kDim);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    auto server = b.BuildAndStart();
    if (!server || (transport == "tcp" && port == 0)) {
      std::fprintf(stderr, "ivy_hop_bench: cannot start the in-process gRPC server on %s\n",
                   listen.c_str());
      return 1;
    }
    auto client =
        makeGrpcTulipClient(transport == "tcp" ? "127.0.0.1:" + std::to_string(port) : listen);
    std::mutex mu;
    std::condition_variable cv;
    auto once = [&]() -> bool {
      EmbedCall call;
      call.model = spec.upstream_name;
      call.inputs = *tokens;
      call.timeout = std::chrono::milliseconds(10000);
      bool done = false, ok = false;
      client->embed(std::move(call), [&](Result<EmbedReply> r) {
        std::lock_guard<std::mutex> l(mu);
        ok = r.isOk() && r->values.size() == kDim;
        done = true;
        cv.notify_all();
      });
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return done; });
      return ok;
    };
    for (int i = 0; i < 200; ++i) {
      if (!once()) {
        std::fprintf(stderr, "ivy_hop_bench: the gRPC hop failed (%s)\n", transport.c_str());
        return 1;
      }
    }
    std::vector<double> wall, cpu;
    for (int i = 0; i < grpc_iters; ++i) {
      const int64_t w0 = clockNs(CLOCK_MONOTONIC), c0 = clockNs(CLOCK_PROCESS_CPUTIME_ID);
      if (!once()) return 1;
      wall.push_back(double(clockNs(CLOCK_MONOTONIC) - w0) / 1e3);
      cpu.push_back(double(clockNs(CLOCK_PROCESS_CPUTIME_ID) - c0) / 1e3);
    }
    emit("grpc_hop_" + transport, "wall", stat(wall), wall.size());
    emit("grpc_hop_" + transport, "process_cpu", stat(cpu), cpu.size());
    client.reset();
    server->Shutdown();
  }
  if (!ivy_bin.empty() && e2e_iters > 0) {
    const int rc = runE2e(ivy_bin, ivy_args, tokenizer, body, e2e_iters, (*enc)->vocabSize(),
                          e2e_conns);
    if (rc != 0) return rc;
  }
  std::fprintf(stderr, "(sink %zu)\n", sink);
  return 0;
}
