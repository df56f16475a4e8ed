// Client disconnect on the real mesh [TAG_CLIENT_DISCONNECT]: rose (spawned by tulip, cpu backend,
// the tiny rose-mkmodel model), tulip batching one sequence per batch with one batch in flight (so
// a large request is many queued batches), and ivy splitting large requests into chunks.
//   * A client sends a slow non-streaming embedding request (400 inputs of 500 tokens: 50 chunks,
//     400 batches, tens of seconds on this machine) and closes the socket once tulip is working on
//     it. ivy counts the disconnect; every chunk's gRPC call ends in tulip as CANCELLED or (the
//     ones already done) OK; tulip's queue empties without running the rest (batches stop
//     growing); a new request on a new connection is then served.
//   * The same for a non-streaming /v1/completions on the tiny gpt-oss: the Generate stream ends
//     CANCELLED in tulip and its sequence stops generating.
//   * Pipelining on one keep-alive connection: a second request written while the first waits
//     for tulip, and a third written with it, are all answered in order (the disconnect watch must
//     not eat them).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "tests/integration/support/harness.h"

namespace garden {
namespace {

using namespace std::chrono_literals;

// A blocking HTTP/1.1 client on one keep-alive connection (Content-Length framed responses).
class Conn {
 public:
  explicit Conn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{60, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Conn() { closeNow(); }
  bool connected() const { return connected_; }
  void closeNow() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send(std::string_view d) {
    while (!d.empty()) {
      ssize_t n = ::send(fd_, d.data(), d.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      d.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  // One response: {status, body}; status 0 when the connection ended first.
  std::pair<int, std::string> read() {
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill()) return {0, ""};
    }
    std::string head = buf_.substr(0, end);
    buf_.erase(0, end + 4);
    int status = std::atoi(head.substr(9, 3).c_str());
    std::string lower = head;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    size_t p = lower.find("content-length: ");
    size_t len = p == std::string::npos ? 0 : std::strtoull(lower.c_str() + p + 16, nullptr, 10);
    while (buf_.size() < len) {
      if (!fill()) return {0, ""};
    }
    std::string body = buf_.substr(0, len);
    buf_.erase(0, len);
    return {status, body};
  }

 private:
  bool fill() {
    char tmp[65536];
    ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  bool connected_ = false;
  std::string buf_;
};

std::string post(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// `inputs` token-id inputs of `len` ids each (ids in the tiny model's vocabulary).
std::string embeddingBody(int inputs, int len) {
  std::string b = R"({"model":"tiny","input":[)";
  for (int i = 0; i < inputs; ++i) {
    if (i) b += ',';
    b += '[';
    for (int j = 0; j < len; ++j) {
      if (j) b += ',';
      b += std::to_string(50 + (i * 7 + j) % 1900);
    }
    b += ']';
  }
  return b + "]}";
}

// Sum of the series of a Prometheus page whose line starts with `prefix` (0 when none).
double metric(const std::string& page, const std::string& prefix) {
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

template <typename Pred>
bool eventually(std::chrono::milliseconds limit, Pred pred) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return pred();
}

constexpr int kInputs = 400;  // 400 batches of one 500-token sequence
constexpr int kChunks = 50;   // ivy's split: 4096 tokens per chunk = 8 inputs

class DisconnectTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    model_ = dir_->path() + "/model";
    ASSERT_EQ(testing::run({testing::binary("services/rose/rose-mkmodel"), "--out", model_,
                            "--repo", testing::sourceDir()},
                           dir_->path() + "/mkmodel.log"),
              0);
    tulip_port_ = testing::freePort();
    tulip_metrics_ = testing::freePort();
    ivy_port_ = testing::freePort();
    tulip_ = new testing::Process(
        {testing::binary("services/tulip/tulip"),
         "--host",
         "127.0.0.1",
         "--port",
         std::to_string(tulip_port_),
         "--metrics-port",
         std::to_string(tulip_metrics_),
         "--model",
         model_,
         "--rose-bin",
         testing::binary("services/rose/rose"),
         "--shm-name",
         "/garden-disc-" + std::to_string(getpid()) + "-" + std::to_string(tulip_port_),
         "--served-model-name",
         "tiny",
         "--rose-threads",
         "1",
         "--depth",
         "1",
         "--max-batch-seqs",
         "1",
         "--heartbeat-timeout-ms",
         "10000"},
        dir_->path() + "/tulip.log");
    ivy_ = new testing::Process(
        {testing::binary("services/ivy/ivy"), "--host", "127.0.0.1", "--port",
         std::to_string(ivy_port_), "--tulip", "127.0.0.1:" + std::to_string(tulip_port_),
         "--model-dir", model_, "--threads", "2", "--request-timeout-ms", "120000",
         "--split-max-tokens", "4096"},
        dir_->path() + "/ivy.log");
    ASSERT_TRUE(testing::waitForHttp(ivy_port_, "/ready", 200, 90s))
        << "mesh not ready\n--- tulip ---\n"
        << tulip_->log() << "\n--- ivy ---\n"
        << ivy_->log();
  }
  static void TearDownTestSuite() {
    delete ivy_;
    delete tulip_;
    delete dir_;
  }
  void SetUp() override {
    if (ivy_ == nullptr || !ivy_->alive()) GTEST_FAIL() << "the mesh did not start";
  }

  static std::string ivyMetrics() { return testing::http(ivy_port_, "GET", "/metrics").body; }
  static std::string tulipMetrics() {
    return testing::http(tulip_metrics_, "GET", "/metrics").body;
  }
  static std::string logs() {
    return "--- tulip ---\n" + tulip_->log() + "\n--- ivy ---\n" + ivy_->log();
  }

  static testing::TempDir* dir_;
  static std::string model_;
  static int tulip_port_, tulip_metrics_, ivy_port_;
  static testing::Process* tulip_;
  static testing::Process* ivy_;
};

testing::TempDir* DisconnectTest::dir_ = nullptr;
std::string DisconnectTest::model_;
int DisconnectTest::tulip_port_ = 0;
int DisconnectTest::tulip_metrics_ = 0;
int DisconnectTest::ivy_port_ = 0;
testing::Process* DisconnectTest::tulip_ = nullptr;
testing::Process* DisconnectTest::ivy_ = nullptr;

TEST_F(DisconnectTest, ClosedConnectionCancelsEveryChunkInTulip) {
  const std::string tulip_before = tulipMetrics();
  const double batches0 = metric(tulip_before, "tulip_batches_total{");
  const double ok0 = metric(tulip_before, R"(tulip_requests_total{method="Embed",code="OK"})");
  {
    Conn c(ivy_port_);
    ASSERT_TRUE(c.connected());
    ASSERT_TRUE(c.send(post("/v1/embeddings", embeddingBody(kInputs, 500))));
    // tulip is working on it: its first batches ran.
    ASSERT_TRUE(eventually(60s, [&] {
      return metric(tulipMetrics(), "tulip_batches_total{") >= batches0 + 2;
    })) << logs();
    c.closeNow();
  }
  // ivy noticed and counted the disconnect.
  ASSERT_TRUE(eventually(
      30s,
      [&] {
        return metric(ivyMetrics(),
                      R"(ivy_http_client_disconnects_total{route="/v1/embeddings"})") == 1;
      }))
      << ivyMetrics() << logs();
  // Every chunk's call ended in tulip: CANCELLED (at least the queued ones) or OK (done before).
  std::string t;
  ASSERT_TRUE(eventually(
      30s,
      [&] {
        t = tulipMetrics();
        const double ok = metric(t, R"(tulip_requests_total{method="Embed",code="OK"})") - ok0;
        const double cancelled =
            metric(t, R"(tulip_requests_total{method="Embed",code="CANCELLED"})");
        return ok + cancelled == kChunks && metric(t, "tulip_queue_tokens ") == 0;
      }))
      << t << logs();
  const double cancelled = metric(t, R"(tulip_requests_total{method="Embed",code="CANCELLED"})");
  EXPECT_GE(cancelled, kChunks / 2) << t;
  // The dropped sequences never ran: the batch count stops well short of the request's 400.
  const double batches1 = metric(t, "tulip_batches_total{");
  std::this_thread::sleep_for(1s);
  const double batches2 = metric(tulipMetrics(), "tulip_batches_total{");
  EXPECT_EQ(batches2, batches1);
  EXPECT_LT(batches2 - batches0, kInputs / 2) << t;
  // ivy logged the request as 499 and wrote nothing for it; a new connection is served.
  EXPECT_NE(ivy_->log().find("\"status\":499"), std::string::npos) << ivy_->log();
  Conn next(ivy_port_);
  ASSERT_TRUE(next.connected());
  ASSERT_TRUE(next.send(post("/v1/embeddings", embeddingBody(2, 16))));
  auto [status, body] = next.read();
  EXPECT_EQ(status, 200) << body;
  EXPECT_NE(body.find("\"embedding\""), std::string::npos) << body;
  EXPECT_EQ(metric(ivyMetrics(), R"(ivy_http_client_disconnects_total{)"), 1);
}

TEST_F(DisconnectTest, PipelinedKeepAliveRequestsAreAllAnswered) {
  const double gone0 = metric(ivyMetrics(), "ivy_http_client_disconnects_total{");
  Conn c(ivy_port_);
  ASSERT_TRUE(c.connected());
  // The first takes a while in tulip (16 batches); the next two arrive while it waits.
  ASSERT_TRUE(c.send(post("/v1/embeddings", embeddingBody(16, 400))));
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(c.send(post("/v1/embeddings", embeddingBody(1, 8)) +
                     "GET /health HTTP/1.1\r\nHost: t\r\n\r\n"));
  auto [s1, b1] = c.read();
  auto [s2, b2] = c.read();
  auto [s3, b3] = c.read();
  EXPECT_EQ(s1, 200) << b1;
  EXPECT_EQ(s2, 200) << b2;
  EXPECT_EQ(s3, 200) << b3;
  EXPECT_NE(b1.find("\"index\":15"), std::string::npos);  // all 16 embeddings of the first
  EXPECT_EQ(b2.find("\"index\":1"), std::string::npos);   // the second has one
  EXPECT_NE(b2.find("\"index\":0"), std::string::npos) << b2;
  EXPECT_NE(b3.find("ok"), std::string::npos) << b3;
  // Two requests written back to back in one send, on the same connection.
  ASSERT_TRUE(c.send(post("/v1/embeddings", embeddingBody(4, 300)) +
                     post("/v1/embeddings", embeddingBody(2, 8))));
  auto [s4, b4] = c.read();
  auto [s5, b5] = c.read();
  EXPECT_EQ(s4, 200) << b4;
  EXPECT_EQ(s5, 200) << b5;
  EXPECT_NE(b4.find("\"index\":3"), std::string::npos);
  EXPECT_NE(b5.find("\"index\":1"), std::string::npos);
  EXPECT_EQ(metric(ivyMetrics(), "ivy_http_client_disconnects_total{"), gone0);
}

// The same for generation: a non-streaming /v1/completions of 2000 tokens on the tiny random
// gpt-oss (ignore_eos, so only max_tokens ends it) is cancelled in tulip when its client leaves.
class GenerateDisconnectTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const std::string tok = testing::sourceDir() + "/tests/assets/tokenizers/gptoss/tokenizer.json";
    const std::string model = dir_->path() + "/gptoss";
    ASSERT_EQ(testing::run({testing::binary("services/rose/rose-mkmodel"), "--kind", "gpt-oss",
                            "--out", model, "--tokenizer-json", tok},
                           dir_->path() + "/mkmodel.log"),
              0)
        << "rose-mkmodel --kind gpt-oss failed (is " << tok << " there?)";
    tulip_port_ = testing::freePort();
    tulip_metrics_ = testing::freePort();
    ivy_port_ = testing::freePort();
    tulip_ = new testing::Process(
        {testing::binary("services/tulip/tulip"),
         "--host",
         "127.0.0.1",
         "--port",
         std::to_string(tulip_port_),
         "--metrics-port",
         std::to_string(tulip_metrics_),
         "--model",
         model,
         "--device",
         "cpu",
         "--rose-bin",
         testing::binary("services/rose/rose"),
         "--rose-threads",
         "1",
         "--shm-name",
         "/garden-discg-" + std::to_string(getpid()) + "-" + std::to_string(tulip_port_),
         "--served-model-name",
         "gpt-oss-tiny",
         "--heartbeat-timeout-ms",
         "10000"},
        dir_->path() + "/tulip.log");
    ivy_ = new testing::Process(
        {testing::binary("services/ivy/ivy"), "--host", "127.0.0.1", "--port",
         std::to_string(ivy_port_), "--tulip", "127.0.0.1:" + std::to_string(tulip_port_),
         "--tokenizer", tok, "--threads", "2"},
        dir_->path() + "/ivy.log");
    ASSERT_TRUE(testing::waitForHttp(ivy_port_, "/ready", 200, 240s))
        << "chat mesh not ready\n--- tulip ---\n"
        << tulip_->log() << "\n--- ivy ---\n"
        << ivy_->log();
  }
  static void TearDownTestSuite() {
    delete ivy_;
    delete tulip_;
    delete dir_;
  }
  void SetUp() override {
    if (ivy_ == nullptr || !ivy_->alive()) GTEST_FAIL() << "the chat mesh did not start";
  }
  static std::string logs() {
    return "--- tulip ---\n" + tulip_->log() + "\n--- ivy ---\n" + ivy_->log();
  }

  static testing::TempDir* dir_;
  static int tulip_port_, tulip_metrics_, ivy_port_;
  static testing::Process* tulip_;
  static testing::Process* ivy_;
};

testing::TempDir* GenerateDisconnectTest::dir_ = nullptr;
int GenerateDisconnectTest::tulip_port_ = 0;
int GenerateDisconnectTest::tulip_metrics_ = 0;
int GenerateDisconnectTest::ivy_port_ = 0;
testing::Process* GenerateDisconnectTest::tulip_ = nullptr;
testing::Process* GenerateDisconnectTest::ivy_ = nullptr;

TEST_F(GenerateDisconnectTest, ClosedConnectionCancelsNonStreamingGeneration) {
  auto tulipMetrics = [] { return testing::http(tulip_metrics_, "GET", "/metrics").body; };
  auto ivyMetrics = [] { return testing::http(ivy_port_, "GET", "/metrics").body; };
  {
    Conn c(ivy_port_);
    ASSERT_TRUE(c.connected());
    ASSERT_TRUE(c.send(post("/v1/completions", R"({"model":"gpt-oss-tiny","prompt":"Once upon",)"
                                               R"("max_tokens":2000,"ignore_eos":true})")));
    // tulip is generating it.
    ASSERT_TRUE(eventually(60s, [&] {
      return metric(tulipMetrics(), "tulip_generated_tokens_total ") >= 3;
    })) << logs();
    c.closeNow();
  }
  ASSERT_TRUE(eventually(
      30s,
      [&] {
        return metric(ivyMetrics(),
                      R"(ivy_http_client_disconnects_total{route="/v1/completions"})") == 1;
      }))
      << ivyMetrics() << logs();
  std::string t;
  ASSERT_TRUE(eventually(
      30s,
      [&] {
        t = tulipMetrics();
        return metric(t, R"(tulip_requests_total{method="Generate",code="CANCELLED"})") == 1 &&
               metric(t, "tulip_llm_running_sequences ") == 0;
      }))
      << t << logs();
  const double tokens = metric(t, "tulip_generated_tokens_total ");
  EXPECT_LT(tokens, 2000) << t;
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(metric(tulipMetrics(), "tulip_generated_tokens_total "), tokens);
  EXPECT_EQ(metric(ivyMetrics(),
                   R"(ivy_generate_requests_total{endpoint="completions",outcome="client_gone"})"),
            1);
  // A new request on a new connection is served.
  Conn next(ivy_port_);
  ASSERT_TRUE(next.connected());
  ASSERT_TRUE(next.send(post("/v1/completions", R"({"model":"gpt-oss-tiny","prompt":"Hi",)"
                                                R"("max_tokens":3,"ignore_eos":true})")));
  auto [status, body] = next.read();
  EXPECT_EQ(status, 200) << body;
  EXPECT_NE(body.find(R"("completion_tokens":3)"), std::string::npos) << body;
}

}  // namespace
}  // namespace garden
