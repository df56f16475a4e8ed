// The HTTP driver against an in-process fake server on loopback: closed-loop counts, errors by
// status, keep-alive reuse and reconnects, request bodies, and the chat SSE client (TTFT, ITL,
// output tokens). The gRPC driver runs against a real tulip in tests/integration/loadgen.
#include "bench/loadgen/driver.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <simdjson.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "bench/loadgen/report.h"

namespace garden::bench {
namespace {

using namespace std::chrono_literals;

// A loopback HTTP/1.1 server: a thread per connection, requests read by Content-Length, each
// answered by `handler(request_number, body, fd)`, which writes the whole response itself and
// returns false to close the connection.
class FakeServer {
 public:
  using Handler =
      std::function<bool(int n, const std::string& path, const std::string& body, int fd)>;
  explicit FakeServer(Handler h) : handler_(std::move(h)) {
    lfd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(lfd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    listen(lfd_, 64);
    acceptor_ = std::thread([this] {
      while (true) {
        int fd = accept(lfd_, nullptr, nullptr);
        if (fd < 0) return;
        int nodelay = 1;  // stream events must leave when sent (no Nagle batching)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof(nodelay));
        ++connections_;
        std::lock_guard<std::mutex> l(mu_);
        conns_.emplace_back([this, fd] { serve(fd); });
      }
    });
  }
  ~FakeServer() {
    shutdown(lfd_, SHUT_RDWR);
    close(lfd_);
    acceptor_.join();
    std::lock_guard<std::mutex> l(mu_);
    for (auto& t : conns_) t.join();
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  int connections() const { return connections_; }
  static void send(int fd, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }
  static std::string response(int status, const std::string& body, bool close = false) {
    return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\n" +
           (close ? "Connection: close\r\n" : "") +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  }

 private:
  void serve(int fd) {
    std::string buf;
    char tmp[65536];
    while (true) {
      size_t he;
      while ((he = buf.find("\r\n\r\n")) == std::string::npos) {
        ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
        if (n <= 0) {
          close(fd);
          return;
        }
        buf.append(tmp, static_cast<size_t>(n));
      }
      std::string head = buf.substr(0, he);
      size_t cl = 0;
      auto p = head.find("Content-Length: ");
      if (p != std::string::npos) cl = std::stoul(head.substr(p + 16));
      while (buf.size() < he + 4 + cl) {
        ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
        if (n <= 0) {
          close(fd);
          return;
        }
        buf.append(tmp, static_cast<size_t>(n));
      }
      std::string path = head.substr(head.find(' ') + 1);
      path = path.substr(0, path.find(' '));
      std::string body = buf.substr(he + 4, cl);
      buf.erase(0, he + 4 + cl);
      if (!handler_(requests_++, path, body, fd)) {
        close(fd);
        return;
      }
    }
  }

  Handler handler_;
  int lfd_ = -1;
  int port_ = 0;
  std::atomic<int> requests_{0};
  std::atomic<int> connections_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> conns_;
};

// Number of inputs in an embeddings request body.
size_t inputsOf(const std::string& body) {
  simdjson::dom::parser p;
  return p.parse(body)["input"].get_array().size();
}

std::string embeddingsReply(size_t n, size_t tokens) {
  std::string data;
  for (size_t i = 0; i < n; ++i)
    data += std::string(i ? "," : "") + "{\"object\":\"embedding\",\"index\":" + std::to_string(i) +
            ",\"embedding\":[0.5,0.5]}";
  return "{\"object\":\"list\",\"data\":[" + data + "],\"model\":\"m\",\"usage\":{" +
         "\"prompt_tokens\":" + std::to_string(tokens) +
         ",\"total_tokens\":" + std::to_string(tokens) + "}}";
}

std::vector<Payload> tokenPool(int n, int batch, int len) {
  Rng rng(1);
  std::vector<Payload> pool(static_cast<size_t>(n));
  for (auto& p : pool) {
    for (int b = 0; b < batch; ++b) p.token_inputs.push_back(randomTokens(rng, len, 10, 100));
    p.tokens = static_cast<uint64_t>(batch * len);
  }
  return pool;
}

TEST(HttpDriver, ClosedLoopCountsErrorsAndKeepAlive) {
  std::atomic<int> max_inflight{0}, inflight{0};
  FakeServer server([&](int n, const std::string& path, const std::string& body, int fd) {
    int now = ++inflight;
    int seen = max_inflight.load();
    while (now > seen && !max_inflight.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(1ms);
    --inflight;
    if (path != "/v1/embeddings") {
      FakeServer::send(fd, FakeServer::response(404, "{}"));
    } else if (n % 10 == 3) {
      FakeServer::send(fd, FakeServer::response(429, "{\"error\":{\"message\":\"busy\"}}"));
    } else if (n % 10 == 7) {
      FakeServer::send(fd, FakeServer::response(200, embeddingsReply(1, 5)));  // wrong count
    } else {
      size_t k = inputsOf(body);
      FakeServer::send(fd, FakeServer::response(200, embeddingsReply(k, k * 16)));
    }
    return true;
  });
  DriverConfig cfg;
  cfg.endpoint = server.endpoint();
  cfg.model = "m";
  cfg.concurrency = 3;
  auto d = makeHttpDriver(cfg, tokenPool(4, 2, 16));
  ASSERT_TRUE(d.isOk()) << d.status().toString();
  auto r = (*d)->run(PhaseSpec{100, 0});
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r->rec.ok + r->rec.errors, 100u);
  EXPECT_EQ(r->rec.by_status["HTTP_429"], 10u);
  EXPECT_EQ(r->rec.by_status["BAD_RESPONSE"], 10u);
  EXPECT_EQ(r->rec.ok, 80u);
  EXPECT_EQ(r->rec.items, 160u);
  EXPECT_EQ(r->rec.tokens, 80u * 32u);  // the server's usage.prompt_tokens
  EXPECT_EQ(r->rec.latency_ms.size(), 80u);
  EXPECT_LE(max_inflight.load(), 3);   // closed loop: never more than one per client
  EXPECT_EQ(server.connections(), 3);  // keep-alive: one connection per client
  EXPECT_GT(r->wall_s, 0);
  // A second phase reuses the connections.
  auto r2 = (*d)->run(PhaseSpec{9, 0});
  ASSERT_TRUE(r2.isOk());
  EXPECT_EQ(r2->rec.ok + r2->rec.errors, 9u);
  EXPECT_EQ(server.connections(), 3);
}

TEST(HttpDriver, ReconnectsAfterServerCloseAndCountsRefusals) {
  FakeServer server([&](int n, const std::string&, const std::string& body, int fd) {
    FakeServer::send(fd, FakeServer::response(200, embeddingsReply(inputsOf(body), 4),
                                              /*close=*/n % 2 == 0));
    return n % 2 != 0;
  });
  DriverConfig cfg;
  cfg.endpoint = server.endpoint();
  cfg.concurrency = 1;
  auto d = makeHttpDriver(cfg, tokenPool(2, 1, 4));
  ASSERT_TRUE(d.isOk());
  auto r = (*d)->run(PhaseSpec{10, 0});
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r->rec.ok, 10u) << (r->rec.error_samples.empty() ? "" : r->rec.error_samples[0]);
  // Requests 0, 2, 4, 6, 8 end their connection: 0 | 1 2 | 3 4 | 5 6 | 7 8 | 9.
  EXPECT_EQ(server.connections(), 6);

  DriverConfig nobody;
  int closed_port;
  {
    FakeServer gone([](int, const std::string&, const std::string&, int) { return false; });
    closed_port = std::stoi(gone.endpoint().substr(10));
  }
  nobody.endpoint = "127.0.0.1:" + std::to_string(closed_port);
  auto d2 = makeHttpDriver(nobody, tokenPool(1, 1, 4));
  ASSERT_TRUE(d2.isOk());
  auto r2 = (*d2)->run(PhaseSpec{3, 0});
  ASSERT_TRUE(r2.isOk());
  EXPECT_EQ(r2->rec.ok, 0u);
  EXPECT_EQ(r2->rec.by_status["UNAVAILABLE"], 3u);
}

TEST(HttpDriver, DurationPhaseStopsIssuing) {
  FakeServer server([&](int, const std::string&, const std::string& body, int fd) {
    std::this_thread::sleep_for(5ms);
    FakeServer::send(fd, FakeServer::response(200, embeddingsReply(inputsOf(body), 4)));
    return true;
  });
  DriverConfig cfg;
  cfg.endpoint = server.endpoint();
  cfg.concurrency = 2;
  auto d = makeHttpDriver(cfg, tokenPool(2, 1, 4));
  ASSERT_TRUE(d.isOk());
  auto r = (*d)->run(PhaseSpec{0, 0.3});
  ASSERT_TRUE(r.isOk());
  EXPECT_GT(r->rec.ok, 4u);
  EXPECT_LT(r->rec.ok, 2u * 300u / 5u + 4u);
  EXPECT_GE(r->wall_s, 0.3);
  EXPECT_LT(r->wall_s, 10.0);  // it stops (a phase that kept issuing would never end); the
                               // margin is for a loaded machine, not a latency bound
}

TEST(HttpDriver, ChatStreamsGiveTtftItlAndOutputTokens) {
  FakeServer server([&](int n, const std::string& path, const std::string& body, int fd) {
    EXPECT_EQ(path, "/v1/chat/completions");
    simdjson::dom::parser p;
    auto doc = p.parse(body);
    EXPECT_TRUE(doc["stream"].get_bool().value());
    EXPECT_EQ(doc["max_tokens"].get_uint64().value(), 4u);
    if (n == 2) {  // one stream that never finishes properly
      FakeServer::send(fd,
                       "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n");
      FakeServer::send(fd, "0\r\n\r\n");
      return true;
    }
    FakeServer::send(fd,
                     "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n");
    auto chunk = [&](const std::string& s) {
      char len[16];
      std::snprintf(len, sizeof(len), "%zx\r\n", s.size());
      FakeServer::send(fd, len + s + "\r\n");
    };
    chunk("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n");
    std::this_thread::sleep_for(20ms);  // time to first token
    for (int t = 0; t < 4; ++t) {
      chunk("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"}}]}\n\n");
      std::this_thread::sleep_for(5ms);
    }
    chunk(
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\n");
    chunk("data: [DONE]\n\n");
    FakeServer::send(fd, "0\r\n\r\n");
    return true;
  });
  DriverConfig cfg;
  cfg.mode = Mode::kChat;
  cfg.input = InputKind::kText;
  cfg.endpoint = server.endpoint();
  cfg.model = "m";
  cfg.max_tokens = 4;
  std::vector<Payload> pool(1);
  pool[0].text_inputs = {"hello there"};
  pool[0].tokens = 5;  // the calibrated estimate; the stream's usage.prompt_tokens (9) wins
  auto d = makeHttpDriver(cfg, pool);
  ASSERT_TRUE(d.isOk()) << d.status().toString();
  auto r = (*d)->run(PhaseSpec{4, 0});
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r->rec.ok, 3u);
  EXPECT_EQ(r->rec.by_status["BAD_RESPONSE"], 1u);
  ASSERT_EQ(r->rec.ttft_ms.size(), 3u);
  for (double t : r->rec.ttft_ms) {
    EXPECT_GE(t, 19.0);
    EXPECT_LT(t, 1000.0);
  }
  ASSERT_EQ(r->rec.itl_ms.size(), 9u);  // 3 gaps per 4-token stream
  // Tokens leave the server 5 ms apart; the median gap must show it (a loaded machine may
  // deliver an odd pair in one recv, so not every gap is asserted).
  auto itl = r->rec.itl_ms;
  std::sort(itl.begin(), itl.end());
  EXPECT_GE(itl[4], 4.0);
  EXPECT_EQ(r->rec.output_tokens, 12u);
  EXPECT_EQ(r->rec.items, 3u);
  EXPECT_EQ(r->rec.tokens, 27u);
  EXPECT_EQ(r->rec.finish_reasons, (std::map<std::string, uint64_t>{{"length", 3}}));
  // Time per output token: (latency - TTFT) / 3 covers the three 5 ms gaps and the tail.
  ASSERT_EQ(r->rec.tpot_ms.size(), 3u);
  for (double t : r->rec.tpot_ms) {
    EXPECT_GE(t, 4.0);
    EXPECT_LT(t, 1000.0);
  }
}

TEST(HttpDriver, ChatWithoutFinishReasonOrUsageFallsBackToEvents) {
  // A server that streams two reasoning deltas in ONE event batch and no usage chunk: output
  // tokens are the events with text, the finish reason is recorded as "none".
  FakeServer server([&](int, const std::string&, const std::string& body, int fd) {
    simdjson::dom::parser p;
    EXPECT_EQ(p.parse(body)["ignore_eos"].error(), simdjson::NO_SUCH_FIELD);  // not asked
    FakeServer::send(fd,
                     "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     "Connection: close\r\n\r\n"
                     "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"a\"}}]}\n\n"
                     "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"\"}}]}\n\n"
                     "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n"
                     "data: [DONE]\n\n");
    return false;
  });
  DriverConfig cfg;
  cfg.mode = Mode::kChat;
  cfg.input = InputKind::kText;
  cfg.endpoint = server.endpoint();
  cfg.model = "m";
  cfg.ignore_eos = false;
  std::vector<Payload> pool(1);
  pool[0].text_inputs = {"x"};
  pool[0].tokens = 7;
  auto d = makeHttpDriver(cfg, pool);
  ASSERT_TRUE(d.isOk()) << d.status().toString();
  auto r = (*d)->run(PhaseSpec{2, 0});
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(r->rec.ok, 2u);
  EXPECT_EQ(r->rec.output_tokens, 4u);  // two events with text per stream (the empty one is not)
  EXPECT_EQ(r->rec.tokens, 14u);        // no usage: the pool's count
  EXPECT_EQ(r->rec.finish_reasons, (std::map<std::string, uint64_t>{{"none", 2}}));
  EXPECT_EQ(r->rec.tpot_ms.size(), 2u);
  EXPECT_EQ(r->rec.itl_ms.size(), 2u);
}

TEST(HttpDriver, PhasesDoNotReplayPayloads) {
  // Warm-up and measured phases walk one cursor over the pool: with a pool of warm-up + count
  // payloads every request carries a different prompt (chat prompts must not hit the prefix
  // cache because the warm-up already sent them).
  std::mutex mu;
  std::vector<std::string> prompts;
  FakeServer server([&](int, const std::string&, const std::string& body, int fd) {
    simdjson::dom::parser p;
    std::string_view content = p.parse(body)["messages"].at(0)["content"].get_string().value();
    {
      std::lock_guard<std::mutex> l(mu);
      prompts.emplace_back(content);
    }
    std::string sse =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},"
        "\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n";
    FakeServer::send(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: " +
                             std::to_string(sse.size()) + "\r\n\r\n" + sse);
    return true;
  });
  DriverConfig cfg;
  cfg.mode = Mode::kChat;
  cfg.input = InputKind::kText;
  cfg.endpoint = server.endpoint();
  cfg.model = "m";
  cfg.concurrency = 3;
  std::vector<Payload> pool(9);
  for (size_t i = 0; i < pool.size(); ++i) pool[i].text_inputs = {"prompt " + std::to_string(i)};
  auto d = makeHttpDriver(cfg, pool);
  ASSERT_TRUE(d.isOk()) << d.status().toString();
  ASSERT_EQ((*d)->run(PhaseSpec{3, 0})->rec.ok, 3u);  // warm-up
  auto measured = (*d)->run(PhaseSpec{6, 0});
  ASSERT_TRUE(measured.isOk());
  ASSERT_EQ(measured->rec.ok, 6u);
  // One event per answer: TTFT is measured, TPOT is undefined and not recorded.
  EXPECT_EQ(measured->rec.ttft_ms.size(), 6u);
  EXPECT_TRUE(measured->rec.tpot_ms.empty());
  EXPECT_TRUE(measured->rec.itl_ms.empty());
  std::sort(prompts.begin(), prompts.end());
  EXPECT_EQ(prompts.size(), 9u);
  EXPECT_EQ(std::unique(prompts.begin(), prompts.end()), prompts.end()) << "a prompt repeated";
}

TEST(HttpCount, ChatTokensThroughTokenize) {
  FakeServer server([&](int n, const std::string& path, const std::string& body, int fd) {
    EXPECT_EQ(path, "/tokenize");
    simdjson::dom::parser p;
    auto doc = p.parse(body);
    EXPECT_EQ(std::string_view(doc["model"].get_string().value()), "gpt");
    EXPECT_EQ(std::string_view(doc["messages"].at(0)["role"].get_string().value()), "user");
    EXPECT_EQ(std::string_view(doc["messages"].at(0)["content"].get_string().value()),
              "two \"words\"");
    if (n == 0) {
      FakeServer::send(fd, FakeServer::response(200, "{\"count\":57,\"tokens\":[]}"));
    } else if (n == 1) {
      FakeServer::send(fd, FakeServer::response(400, "{\"error\":{\"param\":\"messages\"}}"));
    } else {
      FakeServer::send(fd, FakeServer::response(200, "{\"tokens\":[]}"));
    }
    return false;
  });
  auto a = httpCountChatTokens(server.endpoint(), "gpt", "two \"words\"", 5000ms);
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  EXPECT_EQ(*a, 57u);
  auto b = httpCountChatTokens(server.endpoint(), "gpt", "two \"words\"", 5000ms);
  ASSERT_FALSE(b.isOk());
  EXPECT_NE(b.status().message().find("answered 400"), std::string::npos);
  auto c = httpCountChatTokens(server.endpoint(), "gpt", "two \"words\"", 5000ms);
  ASSERT_FALSE(c.isOk());
  EXPECT_NE(c.status().message().find("no count"), std::string::npos);
}

TEST(RequestBodies, EmbeddingsAndChat) {
  Payload p;
  p.token_inputs = {{1, 2, 3}, {4}};
  EXPECT_EQ(embeddingsBody("m", p, "base64"),
            "{\"model\":\"m\",\"input\":[[1,2,3],[4]],\"encoding_format\":\"base64\"}");
  Payload t;
  t.text_inputs = {"a \"b\""};
  EXPECT_EQ(embeddingsBody("m", t, "float"),
            "{\"model\":\"m\",\"input\":[\"a \\\"b\\\"\"],\"encoding_format\":\"float\"}");
  EXPECT_EQ(chatBody("g", "hi", 8, true),
            "{\"model\":\"g\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
            "\"stream\":true,\"max_tokens\":8,\"ignore_eos\":true,"
            "\"stream_options\":{\"include_usage\":true}}");
  EXPECT_EQ(chatBody("g", "hi", 8, false, "json_object", true, 0),
            "{\"model\":\"g\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
            "\"stream\":true,\"max_tokens\":8,\"temperature\":0,\"skip_reasoning\":true,"
            "\"response_format\":{\"type\":\"json_object\"},"
            "\"stream_options\":{\"include_usage\":true}}");
  EXPECT_EQ(chatBody("g", "hi", 8, false, "json_schema", false, -1, R"({"type":"string"})"),
            "{\"model\":\"g\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
            "\"stream\":true,\"max_tokens\":8,"
            "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"bench\","
            "\"schema\":{\"type\":\"string\"}}},"
            "\"stream_options\":{\"include_usage\":true}}");
}

TEST(PhaseGate, CountModeGrantsExactlyN) {
  PhaseGate g(PhaseSpec{37, 0});
  std::atomic<int> granted{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&] {
      while (g.claim()) ++granted;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(granted.load(), 37);
}

TEST(Report, JsonHasTheSchemaFields) {
  RunReport r;
  r.workload = "embed_tok128_b1_c1";
  r.suite = "low_latency_embedding";
  r.date = "2026-11-30T00:00:00Z";
  r.commit = "abc";
  r.host = describeHost();
  r.flags = {{"seq_len", "128"}};
  r.seq_len = 128;
  r.measured.wall_s = 2.0;
  for (int i = 1; i <= 100; ++i) {
    r.measured.rec.success(i * 0.1);
    r.measured.rec.server_total_us.push_back(50);
    r.measured.rec.server_queue_us.push_back(5);
    r.measured.rec.server_inference_us.push_back(40);
  }
  r.measured.rec.items = 100;
  r.measured.rec.tokens = 12800;
  r.measured.rec.failure("UNAVAILABLE", "x");
  std::string json = renderReport(r);
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  ASSERT_FALSE(p.parse(json).get(doc)) << json;
  EXPECT_EQ(std::string_view(doc["schema"]), "garden.bench.result.v1");
  EXPECT_EQ(std::string_view(doc["workload"]), "embed_tok128_b1_c1");
  EXPECT_EQ(std::string_view(doc["system"]), "garden");
  EXPECT_EQ(std::string_view(doc["git_commit"]), "abc");
  EXPECT_EQ(uint64_t(doc["requests"]["ok"]), 100u);
  EXPECT_EQ(uint64_t(doc["requests"]["errors"]), 1u);
  EXPECT_EQ(uint64_t(doc["requests"]["by_status"]["UNAVAILABLE"]), 1u);
  EXPECT_DOUBLE_EQ(double(doc["latency_ms"]["p50"]), 5.0);
  EXPECT_DOUBLE_EQ(double(doc["latency_ms"]["p99"]), 9.9);
  EXPECT_DOUBLE_EQ(double(doc["throughput"]["embeddings_per_s"]), 50.0);
  EXPECT_DOUBLE_EQ(double(doc["throughput"]["tokens_per_s"]), 6400.0);
  EXPECT_DOUBLE_EQ(double(doc["server_us"]["total"]["p50"]), 50.0);
  EXPECT_EQ(int64_t(doc["config"]["seq_len"]), 128);
  EXPECT_EQ(std::string_view(doc["flags"]["seq_len"]), "128");
  EXPECT_FALSE(std::string_view(doc["host"]["cpu"]).empty());
  EXPECT_NE(summaryLine(r).find("100 ok, 1 err"), std::string::npos);
  EXPECT_TRUE(doc["chat"].error() == simdjson::NO_SUCH_FIELD);
}

TEST(Report, ChatSectionHasTtftItlTpotAndFinishReasons) {
  RunReport r;
  r.workload = "chat_text128_c2";
  r.mode = Mode::kChat;
  r.protocol = Protocol::kHttp;
  r.input = InputKind::kText;
  r.measured.wall_s = 4.0;
  auto& rec = r.measured.rec;
  for (int i = 1; i <= 4; ++i) {
    rec.success(100.0 * i);
    rec.ttft_ms.push_back(10.0 * i);
    rec.tpot_ms.push_back(2.0 * i);
  }
  rec.itl_ms = {1, 2, 3};
  rec.output_tokens = 200;
  rec.finish_reasons = {{"length", 3}, {"stop", 1}};
  std::string json = renderReport(r);
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  ASSERT_FALSE(p.parse(json).get(doc)) << json;
  EXPECT_DOUBLE_EQ(double(doc["chat"]["ttft_ms"]["p50"]), 20.0);
  EXPECT_DOUBLE_EQ(double(doc["chat"]["itl_ms"]["max"]), 3.0);
  EXPECT_DOUBLE_EQ(double(doc["chat"]["tpot_ms"]["mean"]), 5.0);
  EXPECT_EQ(uint64_t(doc["chat"]["tpot_ms"]["count"]), 4u);
  EXPECT_EQ(uint64_t(doc["chat"]["output_tokens"]), 200u);
  EXPECT_DOUBLE_EQ(double(doc["chat"]["output_tokens_per_s"]), 50.0);
  EXPECT_EQ(uint64_t(doc["chat"]["finish_reasons"]["length"]), 3u);
  EXPECT_EQ(uint64_t(doc["chat"]["finish_reasons"]["stop"]), 1u);
  EXPECT_EQ(std::string_view(doc["config"]["mode"]), "chat");
}

}  // namespace
}  // namespace garden::bench
