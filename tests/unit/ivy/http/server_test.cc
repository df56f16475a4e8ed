// HTTP-level tests: the real Beast server, router and ivy routes in-process on an ephemeral port,
// with a FakeTulipClient behind them, driven by raw sockets (so the wire format itself is tested).

#include "services/ivy/http/server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <simdjson.h>

#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "common/json_writer.h"
#include "common/logging.h"
#include "services/ivy/http/service.h"
#include "tests/fakes/ivy/fake_tulip_client.h"
#include "tests/support/raw_http_conn.h"

namespace garden::ivy {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using Response = garden::testing::RawHttpResponse;  // status 0: closed before a response

// A blocking HTTP/1.1 client on one TCP connection (5 s receive timeout so nothing hangs).
class Conn : public garden::testing::RawHttpConn {
 public:
  explicit Conn(int port) : RawHttpConn(port, 5) {}
};

std::string post(std::string_view path, std::string_view body, std::string_view extra = "") {
  std::string s =
      "POST " + std::string(path) + " HTTP/1.1\r\nHost: t\r\n" +
      "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
      std::string(extra) + "\r\n";
  return s + std::string(body);
}

std::string get(std::string_view path, std::string_view extra = "") {
  return "GET " + std::string(path) + " HTTP/1.1\r\nHost: t\r\n" + std::string(extra) + "\r\n";
}

// One id per byte. The sentencepiece encoder is tested against the reference in unit_ivy_api;
// here a trivial encoder keeps this binary free of libsentencepiece (which cannot be isolated
// from libprotobuf under ASan, see api/spm_shim.cc [TAG_SPM_ISOLATION]).
class ByteEncoder : public TextEncoder {
 public:
  Result<std::vector<int32_t>> encode(std::string_view text) const override {
    return std::vector<int32_t>(text.begin(), text.end());
  }
  uint32_t vocabSize() const override { return 256; }
};

class IvyServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log::setSinkForTesting([this](std::string_view line) {
      std::lock_guard<std::mutex> lock(log_mu_);
      log_lines_.emplace_back(line);
    });
    encoder_ = std::make_unique<ByteEncoder>();
    TulipModelInfo info;
    info.model = "fake-upstream";
    info.kind = "embedding";
    info.hidden_size = 8;
    info.max_seq_len = 64;
    info.vocab_size = 1000;
    fake_.setModelInfo(info);
  }

  void TearDown() override {
    if (server_) server_->stop();
    server_.reset();
    log::setSinkForTesting({});
  }

  // The served model (what the replica pool learns from ModelInfo) and readiness, as the test
  // sets them. wait_ready: the fake's ModelInfo is the model and ivy is ready from the start.
  void setModel(bool known, bool ready) {
    std::shared_ptr<const ModelSpec> spec;
    if (known) {
      std::promise<Result<TulipModelInfo>> p;
      fake_.modelInfo(std::chrono::milliseconds(5000),
                      [&p](Result<TulipModelInfo> r) { p.set_value(std::move(r)); });
      Result<TulipModelInfo> info = p.get_future().get();
      ASSERT_TRUE(info.isOk()) << info.status().toString();
      spec = std::make_shared<const ModelSpec>(makeModelSpec(*info, "garden-embed"));
    }
    std::lock_guard<std::mutex> lock(model_mu_);
    spec_ = std::move(spec);
    ready_ = ready;
  }

  void startServer(bool wait_ready = true) {
    if (wait_ready) setModel(/*known=*/true, /*ready=*/true);
    ModelSource model{[this] {
                        std::lock_guard<std::mutex> lock(model_mu_);
                        return spec_;
                      },
                      [this] {
                        std::lock_guard<std::mutex> lock(model_mu_);
                        return ready_;
                      }};
    IvyServiceOptions so;
    so.request_timeout = std::chrono::milliseconds(10000);
    service_ = std::make_unique<IvyService>(so, &fake_, model, encoder_.get(), &registry_);
    service_->registerRoutes(&router_);
    HttpServerOptions ho;
    ho.host = "127.0.0.1";
    ho.port = 0;
    ho.threads = 2;
    ho.max_body_bytes = 4096;
    ho.drain_timeout = std::chrono::milliseconds(3000);
    server_ = std::make_unique<HttpServer>(
        ho, &router_, [this](const AccessRecord& r) { service_->onRequestDone(r); });
    ASSERT_TRUE(server_->start().isOk());
    ASSERT_NE(server_->port(), 0);
  }

  Response roundTrip(const std::string& request) {
    Conn c(server_->port());
    EXPECT_TRUE(c.connected());
    c.send(request);
    return c.read();
  }

  // Parses an OpenAI error body and checks its fields.
  void expectError(const Response& r, int status, std::string_view param,
                   std::string_view message_part) {
    EXPECT_EQ(r.status, status) << r.body;
    EXPECT_EQ(r.header("content-type"), "application/json");
    simdjson::dom::parser p;
    simdjson::dom::element root;
    ASSERT_FALSE(p.parse(r.body).get(root)) << r.body;
    simdjson::dom::element err = root["error"];
    std::string_view msg = err["message"];
    EXPECT_THAT(std::string(msg), HasSubstr(std::string(message_part)));
    EXPECT_TRUE(err["type"].is_string());
    if (param.empty()) {
      EXPECT_TRUE(err["param"].is_null()) << r.body;
    } else {
      EXPECT_EQ(std::string_view(err["param"]), param) << r.body;
    }
  }

  std::vector<std::string> logLines() {
    std::lock_guard<std::mutex> lock(log_mu_);
    return log_lines_;
  }

  FakeTulipClient fake_;
  metrics::Registry registry_;
  std::unique_ptr<TextEncoder> encoder_;
  std::mutex model_mu_;
  std::shared_ptr<const ModelSpec> spec_;  // guarded by model_mu_
  bool ready_ = false;                     // guarded by model_mu_
  std::unique_ptr<IvyService> service_;
  Router router_;
  std::unique_ptr<HttpServer> server_;
  std::mutex log_mu_;
  std::vector<std::string> log_lines_;
};

TEST_F(IvyServerTest, EmbeddingsFloatSuccess) {
  startServer();
  const std::string text = "Hello world, the quick fox.";  // 27 bytes: under the fake max of 32
  Response r =
      roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":")" + text + R"("})",
                     "x-request-id: req-123\r\n"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("x-request-id"), "req-123");
  EXPECT_EQ(r.header("content-type"), "application/json");

  // Tulip got the encoder's ids of the text, the request id and its own model name.
  auto want_ids = encoder_->encode(text);
  ASSERT_TRUE(want_ids.isOk());
  auto calls = fake_.embedCalls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].request_id, "req-123");
  EXPECT_EQ(calls[0].model, "fake-upstream");
  ASSERT_EQ(calls[0].inputs.size(), 1u);
  EXPECT_EQ(calls[0].inputs[0], *want_ids);
  // The deadline is what is left of the 10 s request timeout when ivy sends the call (the lower
  // bound leaves room for a loaded machine between reading the request and sending the call).
  EXPECT_LE(calls[0].timeout, std::chrono::milliseconds(10000));
  EXPECT_GT(calls[0].timeout, std::chrono::milliseconds(5000));

  simdjson::dom::parser p;
  simdjson::dom::element root;
  ASSERT_FALSE(p.parse(r.body).get(root)) << r.body;
  EXPECT_EQ(std::string_view(root["model"]), "garden-embed");
  EXPECT_EQ(uint64_t(root["usage"]["prompt_tokens"]), want_ids->size());
  simdjson::dom::array emb = root["data"].at(0)["embedding"];
  std::vector<float> expect = fakeEmbedding(*want_ids, 8);
  ASSERT_EQ(emb.size(), 8u);
  size_t j = 0;
  for (simdjson::dom::element x : emb) EXPECT_EQ(static_cast<float>(double(x)), expect[j++]);
}

TEST_F(IvyServerTest, EmbeddingsTokenArraysBase64AndDimensions) {
  startServer();
  Response r = roundTrip(post(
      "/v1/embeddings",
      R"({"model":"garden-embed","input":[[1,2,3],[999]],"encoding_format":"base64","dimensions":3})"));
  ASSERT_EQ(r.status, 200) << r.body;
  auto calls = fake_.embedCalls();
  ASSERT_EQ(calls.size(), 1u);
  ASSERT_EQ(calls[0].inputs.size(), 2u);
  EXPECT_EQ(calls[0].inputs[0], (std::vector<int32_t>{1, 2, 3}));  // passed through untouched
  EXPECT_EQ(calls[0].inputs[1], (std::vector<int32_t>{999}));
  EXPECT_FALSE(r.header("x-request-id").empty());  // generated
  EXPECT_EQ(calls[0].request_id, r.header("x-request-id"));

  simdjson::dom::parser p;
  simdjson::dom::element root;
  ASSERT_FALSE(p.parse(r.body).get(root)) << r.body;
  EXPECT_EQ(uint64_t(root["usage"]["prompt_tokens"]), 4u);
  int i = 0;
  for (simdjson::dom::element d : simdjson::dom::array(root["data"])) {
    EXPECT_EQ(int64_t(d["index"]), i);
    auto bytes = base64Decode(std::string_view(d["embedding"]));
    ASSERT_TRUE(bytes.isOk());
    ASSERT_EQ(bytes->size(), 3 * sizeof(float));
    float got[3];
    std::memcpy(got, bytes->data(), sizeof got);
    std::vector<float> full = fakeEmbedding(calls[0].inputs[i], 8);
    double n = std::sqrt(double(full[0]) * full[0] + double(full[1]) * full[1] +
                         double(full[2]) * full[2]);
    double norm = 0;
    for (int k = 0; k < 3; ++k) {
      EXPECT_NEAR(got[k], full[k] / n, 1e-6);
      norm += double(got[k]) * got[k];
    }
    EXPECT_NEAR(norm, 1.0, 1e-6);
    ++i;
  }
  EXPECT_EQ(i, 2);
}

TEST_F(IvyServerTest, RequestValidationErrors) {
  startServer();
  expectError(roundTrip(post("/v1/embeddings", "{not json")), 400, "",
              "could not parse the JSON body");
  expectError(roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":5})")), 400,
              "input", "input: must be a string");
  expectError(roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":""})")), 400,
              "input", "must not be an empty string");
  expectError(roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":[]})")), 400,
              "input", "must not be an empty array");
  expectError(roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":[[1],[]]})")),
              400, "input", "input[1]: must not be an empty array");
  expectError(roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":[1000]})")), 400,
              "input", "outside the vocabulary");
  expectError(
      roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":"x","dimensions":9})")),
      400, "dimensions", "between 1 and the model's width 8");
  std::string long_text(200, 'Q');  // 200 tokens > max_seq_len 64
  expectError(roundTrip(post("/v1/embeddings",
                             R"({"model":"garden-embed","input":["ok",")" + long_text + R"("]})")),
              400, "input", "input[1]: has");
  Response nf = roundTrip(post("/v1/embeddings", R"({"model":"gpt-4","input":"x"})"));
  expectError(nf, 404, "model", "'gpt-4' does not exist");
  EXPECT_THAT(nf.body, HasSubstr("\"code\":\"model_not_found\""));
  EXPECT_TRUE(fake_.embedCalls().empty());  // nothing invalid reached tulip
}

TEST_F(IvyServerTest, RoutingErrors) {
  startServer();
  expectError(roundTrip(get("/v1/nothing")), 404, "", "Unknown route");
  Response m = roundTrip(get("/v1/embeddings"));
  expectError(m, 405, "", "not allowed");
  EXPECT_EQ(m.header("allow"), "POST");
}

TEST_F(IvyServerTest, UpstreamErrorsMapToStatuses) {
  startServer();
  struct Case {
    Status st;
    int http;
    bool retry_after;
  };
  const Case cases[] = {
      {resourceExhausted("tulip: queue full"), 429, true},
      {unavailable("tulip: worker restarting"), 503, true},
      {deadlineExceeded("tulip: deadline"), 504, false},
      {invalidArgument("tulip: bad ids"), 400, false},
      {internalError("tulip: boom"), 500, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.st.toString());
    fake_.setEmbedError(c.st);
    Response r = roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":[5]})"));
    expectError(r, c.http, "", c.st.message());
    EXPECT_EQ(r.header("retry-after"), c.retry_after ? "1" : "");
  }
}

TEST_F(IvyServerTest, BodyTooLargeIs413BeforeTheBodyIsRead) {
  startServer();
  {
    // Only the header is sent: the 413 must come without waiting for the 100000-byte body.
    Conn c(server_->port());
    c.send("POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n");
    Response r = c.read();
    expectError(r, 413, "", "larger than the limit of 4096 bytes");
    EXPECT_EQ(r.header("connection"), "close");
    EXPECT_TRUE(c.closedByPeer());
  }
  {
    // Chunked bodies are cut off once they pass the limit.
    Conn c(server_->port());
    std::string chunk(5000, 'a');
    char size_hex[16];
    std::snprintf(size_hex, sizeof size_hex, "%zx", chunk.size());
    c.send("POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" +
           std::string(size_hex) + "\r\n" + chunk + "\r\n0\r\n\r\n");
    expectError(c.read(), 413, "", "larger than the limit");
  }
  // A body right at the limit is accepted (and then judged on its content).
  std::string body = R"({"model":"garden-embed","input":"x","user":")";
  body += std::string(4096 - body.size() - 2, 'u') + "\"}";
  ASSERT_EQ(body.size(), 4096u);
  EXPECT_EQ(roundTrip(post("/v1/embeddings", body)).status, 200);
}

TEST_F(IvyServerTest, KeepAliveServesManyRequestsOnOneConnection) {
  startServer();
  Conn c(server_->port());
  ASSERT_TRUE(c.connected());
  for (int i = 0; i < 5; ++i) {
    c.send(post("/v1/embeddings",
                R"({"model":"garden-embed","input":[)" + std::to_string(i + 1) + "]}"));
    Response r = c.read();
    ASSERT_EQ(r.status, 200) << r.body;
    c.send(post("/v1/embeddings", R"({"model":"garden-embed","input":""})"));  // a 400 keeps it
    EXPECT_EQ(c.read().status, 400);
    c.send(get("/health"));
    EXPECT_EQ(c.read().status, 200);
  }
  // Pipelined: two requests in one write, answered in order.
  c.send(get("/v1/models") + post("/v1/embeddings", R"({"model":"garden-embed","input":[7]})"));
  Response a = c.read();
  Response b = c.read();
  EXPECT_EQ(a.status, 200);
  EXPECT_THAT(a.body, HasSubstr("\"object\":\"list\""));
  EXPECT_EQ(b.status, 200);
  EXPECT_THAT(b.body, HasSubstr("\"embedding\""));
  EXPECT_EQ(fake_.embedCalls().size(), 6u);
  // Connection: close is honoured.
  c.send(get("/health", "Connection: close\r\n"));
  Response last = c.read();
  EXPECT_EQ(last.status, 200);
  EXPECT_EQ(last.header("connection"), "close");
  EXPECT_TRUE(c.closedByPeer());
}

TEST_F(IvyServerTest, ExpectContinue) {
  startServer();
  Conn c(server_->port());
  std::string body = R"({"model":"garden-embed","input":[3]})";
  c.send("POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n");
  Response cont = c.read();
  EXPECT_EQ(cont.status, 100);
  c.send(body);
  EXPECT_EQ(c.read().status, 200);
}

TEST_F(IvyServerTest, ModelsHealthReadyAndMetrics) {
  startServer();
  Response models = roundTrip(get("/v1/models"));
  ASSERT_EQ(models.status, 200);
  simdjson::dom::parser p;
  simdjson::dom::element root;
  ASSERT_FALSE(p.parse(models.body).get(root)) << models.body;
  EXPECT_EQ(std::string_view(root["object"]), "list");
  EXPECT_EQ(std::string_view(root["data"].at(0)["id"]), "garden-embed");
  EXPECT_EQ(std::string_view(root["data"].at(0)["object"]), "model");

  EXPECT_EQ(roundTrip(get("/health")).status, 200);
  Response ready = roundTrip(get("/ready"));
  EXPECT_EQ(ready.status, 200);
  EXPECT_THAT(ready.body, HasSubstr("garden-embed"));

  EXPECT_EQ(roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":[1]})")).status,
            200);
  EXPECT_EQ(roundTrip(post("/v1/embeddings", R"({"model":"x","input":[1]})")).status, 404);
  Response m = roundTrip(get("/metrics"));
  ASSERT_EQ(m.status, 200);
  EXPECT_THAT(m.header("content-type"), StartsWith("text/plain; version=0.0.4"));
  EXPECT_THAT(m.body,
              HasSubstr(R"(ivy_http_requests_total{route="/v1/embeddings",status="200"} 1)"));
  EXPECT_THAT(m.body,
              HasSubstr(R"(ivy_http_requests_total{route="/v1/embeddings",status="404"} 1)"));
  EXPECT_THAT(m.body, HasSubstr(R"(ivy_http_requests_total{route="/ready",status="200"} 1)"));
  EXPECT_THAT(m.body,
              HasSubstr(R"(ivy_http_request_duration_seconds_count{route="/v1/embeddings"} 2)"));
  EXPECT_THAT(m.body, HasSubstr("ivy_embeddings_inputs_total 1"));
  EXPECT_THAT(m.body, HasSubstr("ivy_ready 1"));
}

TEST_F(IvyServerTest, NotReadyUntilTheModelIsKnownAndWhileUnhealthy) {
  // What the replica pool reports (its probing is tested in replica_pool_test): no model yet.
  startServer(/*wait_ready=*/false);
  EXPECT_EQ(roundTrip(get("/health")).status, 200);
  Response r = roundTrip(get("/ready"));
  expectError(r, 503, "", "not ready");
  EXPECT_EQ(r.header("retry-after"), "1");
  Response e = roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":[1]})"));
  expectError(e, 503, "", "not loaded yet");
  expectError(roundTrip(get("/v1/models")), 503, "", "not loaded yet");
  EXPECT_TRUE(fake_.embedCalls().empty());
  // The model becomes known and a replica healthy: ready.
  setModel(/*known=*/true, /*ready=*/true);
  EXPECT_EQ(roundTrip(get("/ready")).status, 200);
  EXPECT_THAT(roundTrip(get("/metrics")).body, HasSubstr("ivy_ready 1"));
  // No healthy replica left (the model stays known): not ready, requests still try the pool.
  setModel(/*known=*/true, /*ready=*/false);
  EXPECT_EQ(roundTrip(get("/ready")).status, 503);
  EXPECT_THAT(roundTrip(get("/metrics")).body, HasSubstr("ivy_ready 0"));
  setModel(/*known=*/true, /*ready=*/true);
  EXPECT_EQ(roundTrip(get("/ready")).status, 200);
}

TEST_F(IvyServerTest, OneStructuredLogLinePerRequest) {
  startServer();
  EXPECT_EQ(roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":[1]})",
                           "X-Request-Id: trace-42\r\n"))
                .status,
            200);
  std::vector<std::string> request_lines;
  for (const auto& l : logLines()) {
    if (l.find("\"msg\":\"request\"") != std::string::npos) request_lines.push_back(l);
  }
  ASSERT_EQ(request_lines.size(), 1u);
  simdjson::dom::parser p;
  simdjson::dom::element root;
  ASSERT_FALSE(p.parse(request_lines[0]).get(root)) << request_lines[0];
  EXPECT_EQ(std::string_view(root["request_id"]), "trace-42");
  EXPECT_EQ(std::string_view(root["route"]), "/v1/embeddings");
  EXPECT_EQ(std::string_view(root["method"]), "POST");
  EXPECT_EQ(int64_t(root["status"]), 200);
  EXPECT_GE(int64_t(root["latency_us"]), 0);
}

TEST_F(IvyServerTest, BadRequestIdIsReplaced) {
  startServer();
  Response r = roundTrip(get("/health", "x-request-id: has spaces and ü\r\n"));
  EXPECT_EQ(r.status, 200);
  std::string id = r.header("x-request-id");
  EXPECT_EQ(id.size(), 32u);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  EXPECT_EQ(requestIdFor("ok-id_1.2:3"), "ok-id_1.2:3");
  EXPECT_EQ(requestIdFor(std::string(129, 'a')).size(), 32u);
  EXPECT_NE(requestIdFor(""), requestIdFor(""));
}

// [TAG_HTTP_FRAMING] Request smuggling: a POST whose Transfer-Encoding does not end in `chunked`
// (or that also has Content-Length, or is HTTP/1.0) has a body Beast would take as empty; its
// bytes, here a second request, would then be answered as the next request on the connection.
// Each is refused 400 (415 for a coding before `chunked`), the connection closes, and the hidden
// request is never answered (nothing follows the refusal on the wire, and no access line names
// its route).
TEST_F(IvyServerTest, TransferEncodingSmugglingIsRefusedAndTheHiddenRequestNeverAnswered) {
  startServer();
  const std::string hidden = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  struct Case {
    std::string version, headers, body;
    int status;
    std::string message;
  };
  const std::string chunked_body = "5\r\nhello\r\n0\r\n\r\n";
  const std::vector<Case> cases = {
      {"1.1", "Transfer-Encoding: gzip\r\n", "", 400, "last transfer coding must be chunked"},
      {"1.1", "Transfer-Encoding: identity\r\n", "", 400, "got \"identity\""},
      {"1.1", "Transfer-Encoding: xchunked\r\n", "", 400, "got \"xchunked\""},
      {"1.1", "Transfer-Encoding: chunked, identity\r\n", "", 400, "must be chunked"},
      {"1.1", "Transfer-Encoding: chunked, chunked\r\n", "", 400, "only once"},
      {"1.1", "Transfer-Encoding: chunked;ext=1\r\n", "", 400, "must be chunked"},
      {"1.1", "Transfer-Encoding: ,\r\n", "", 400, "names no transfer coding"},
      {"1.1", "Transfer-Encoding: gzip\r\nContent-Length: 0\r\n", "", 400,
       "both Content-Length and Transfer-Encoding"},
      {"1.1", "Content-Length: 0\r\nTransfer-Encoding: gzip\r\n", "", 400, "malformed"},
      {"1.1", "Content-Length: 16\r\nTransfer-Encoding: chunked\r\n", chunked_body, 400, ""},
      {"1.1", "Transfer-Encoding: chunked\r\nContent-Length: 16\r\n", chunked_body, 400, ""},
      {"1.1", "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", "", 400, ""},
      {"1.0", "Transfer-Encoding: chunked\r\n", chunked_body, 400, "HTTP/1.0"},
      {"1.1", "Transfer-Encoding: gzip, chunked\r\n", chunked_body, 415,
       "transfer coding \"gzip\" is not supported"},
      {"1.1", "Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n", chunked_body, 415,
       "\"identity\" is not supported"},
  };
  for (const Case& k : cases) {
    Conn c(server_->port());
    ASSERT_TRUE(c.connected());
    c.send("POST /v1/embeddings HTTP/" + k.version +
           "\r\nHost: t\r\nContent-Type: application/json\r\n" + k.headers + "\r\n" + k.body +
           hidden);
    Response r = c.read();
    EXPECT_EQ(r.status, k.status) << k.headers << r.body;
    if (r.status == 415) {
      EXPECT_THAT(r.body, HasSubstr("\"code\":\"unsupported_media_type\"")) << k.headers;
    }
    simdjson::dom::parser p;
    simdjson::dom::element root;
    ASSERT_FALSE(p.parse(r.body).get(root)) << r.body;
    EXPECT_THAT(std::string(std::string_view(root["error"]["message"])), HasSubstr(k.message))
        << k.headers;
    EXPECT_EQ(r.header("connection"), "close") << k.headers;
    EXPECT_TRUE(c.closedByPeer()) << k.headers << " then: " << c.buffer();
  }
  for (const auto& l : logLines()) {
    EXPECT_EQ(l.find("\"route\":\"/v1/models\""), std::string::npos) << l;
  }
  EXPECT_TRUE(fake_.embedCalls().empty());
  // Chunked alone (any case) is served, and the connection stays usable.
  Conn c(server_->port());
  const std::string json = R"({"model":"garden-embed","input":[1,2]})";
  char size_hex[16];
  std::snprintf(size_hex, sizeof size_hex, "%zx", json.size());
  c.send("POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: Chunked\r\n\r\n" +
         std::string(size_hex) + "\r\n" + json + "\r\n0\r\n\r\n" + hidden);
  EXPECT_EQ(c.read().status, 200);
  EXPECT_EQ(c.read().status, 200);  // the pipelined GET, framed by itself, is answered
  EXPECT_EQ(fake_.embedCalls().size(), 1u);
}

// A request refused while its header is read (a Content-Length over the limit) is logged with
// its method and route, not an empty method and "other".
TEST_F(IvyServerTest, RefusedHeaderIsLoggedWithItsMethodAndRoute) {
  startServer();
  Conn c(server_->port());
  c.send("POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n");
  EXPECT_EQ(c.read().status, 413);
  std::vector<std::string> lines;
  for (const auto& l : logLines()) {
    if (l.find("\"msg\":\"request\"") != std::string::npos) lines.push_back(l);
  }
  ASSERT_EQ(lines.size(), 1u);
  simdjson::dom::parser p;
  simdjson::dom::element root;
  ASSERT_FALSE(p.parse(lines[0]).get(root)) << lines[0];
  EXPECT_EQ(std::string_view(root["method"]), "POST") << lines[0];
  EXPECT_EQ(std::string_view(root["route"]), "/v1/embeddings") << lines[0];
  EXPECT_EQ(int64_t(root["status"]), 413);
  EXPECT_NE(registry_.expose().find(
                R"(ivy_http_requests_total{route="/v1/embeddings",status="413"} 1)"),
            std::string::npos);
}

// curl -d without -H sends application/x-www-form-urlencoded: refused 415 over the wire too.
TEST_F(IvyServerTest, FormEncodedBodyIs415) {
  startServer();
  Response r = roundTrip(
      "POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: "
      "application/x-www-form-urlencoded\r\nContent-Length: 2\r\n\r\n{}");
  EXPECT_EQ(r.status, 415);
  EXPECT_THAT(r.body, HasSubstr("Content-Type must be application/json"));
  EXPECT_TRUE(fake_.embedCalls().empty());
}

TEST_F(IvyServerTest, MalformedHttpGets400AndClose) {
  startServer();
  Conn c(server_->port());
  c.send("THIS IS NOT HTTP\r\n\r\n");
  Response r = c.read();
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(c.closedByPeer());
}

TEST_F(IvyServerTest, StopDrainsRequestsInFlight) {
  startServer();
  // 1 s in tulip: stop() below must begin while it is still in flight, on a loaded machine too.
  fake_.setEmbedDelay(std::chrono::milliseconds(1000));
  Conn busy(server_->port());
  busy.send(post("/v1/embeddings", R"({"model":"garden-embed","input":[1]})"));
  Conn idle(server_->port());
  idle.send(get("/health"));
  EXPECT_EQ(idle.read().status, 200);
  // Wait until the slow request reached tulip, then stop while it is in flight.
  for (int i = 0; i < 6000 && fake_.embedCalls().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(fake_.embedCalls().size(), 1u);
  std::thread stopper([this] { server_->stop(); });
  Response r = busy.read();
  stopper.join();
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("connection"), "close");
  EXPECT_TRUE(idle.closedByPeer());
  // No longer accepting.
  Conn after(server_->port());
  EXPECT_FALSE(after.connected());
}

// --- client gone while the response is awaited [TAG_CLIENT_DISCONNECT] ---

// Polls `pred` every 5 ms for up to `limit`.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::milliseconds(30000)) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// The value of one Prometheus series line `name{labels}` in `page`, or -1 when absent.
double seriesValue(const std::string& page, const std::string& series) {
  size_t pos = 0;
  while ((pos = page.find(series + " ", pos)) != std::string::npos) {
    if (pos == 0 || page[pos - 1] == '\n')
      return std::strtod(page.c_str() + pos + series.size(), nullptr);
    pos += series.size();
  }
  return -1;
}

// The sum of every series of `page` whose line starts with `prefix`.
double seriesSum(const std::string& page, const std::string& prefix) {
  double sum = 0;
  size_t pos = 0;
  while ((pos = page.find(prefix, pos)) != std::string::npos) {
    if (pos == 0 || page[pos - 1] == '\n') {
      size_t sp = page.find(' ', pos);
      sum += std::strtod(page.c_str() + sp, nullptr);
    }
    pos += prefix.size();
  }
  return sum;
}

TEST_F(IvyServerTest, ClientDisconnectCancelsTheUpstreamCallAndDropsTheResponse) {
  startServer();
  fake_.setHold(true);  // tulip "works" until released or cancelled
  {
    Conn c(server_->port());
    ASSERT_TRUE(c.connected());
    c.send(post("/v1/embeddings", R"({"model":"garden-embed","input":[1,2,3]})",
                "X-Request-Id: gone-1\r\n"));
    ASSERT_TRUE(eventually([&] { return fake_.heldCount() == 1; }));
    ASSERT_EQ(fake_.embedCalls().size(), 1u);
    EXPECT_NE(fake_.embedCalls()[0].cancel, nullptr);
    EXPECT_EQ(fake_.cancelledCalls(), 0);
    c.closeNow();
  }
  // The held call ends CANCELLED because the client left (not because it was released).
  ASSERT_TRUE(eventually([&] { return fake_.cancelledCalls() == 1; }));
  EXPECT_EQ(fake_.heldCount(), 0u);
  const std::string series = R"(ivy_http_client_disconnects_total{route="/v1/embeddings"})";
  ASSERT_TRUE(eventually([&] { return seriesValue(registry_.expose(), series) == 1; }))
      << registry_.expose();
  std::string page = registry_.expose();
  EXPECT_EQ(seriesValue(page, R"(ivy_http_requests_total{route="/v1/embeddings",status="499"})"),
            1);
  // The response the handler produced afterwards (CANCELLED) was dropped, not counted.
  EXPECT_EQ(seriesSum(page, R"(ivy_http_requests_total{route="/v1/embeddings",)"), 1) << page;
  // Exactly one access line for it, with status 499.
  int lines = 0;
  for (const auto& l : logLines()) {
    if (l.find("\"msg\":\"request\"") == std::string::npos) continue;
    if (l.find("gone-1") == std::string::npos) continue;
    ++lines;
    EXPECT_THAT(l, HasSubstr("\"status\":499")) << l;
  }
  EXPECT_EQ(lines, 1);
  // The in-flight bound was released and the next request (new connection) is served.
  fake_.setHold(false);
  Response r = roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":[4]})"));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(eventually([&] {
    return roundTrip(get("/metrics")).body.find("\nivy_inflight_requests 0\n") != std::string::npos;
  }));
}

TEST_F(IvyServerTest, KeepAliveRequestAbandonedAfterAnAnswerIsCancelled) {
  startServer();
  fake_.setHold(true);
  {
    Conn c(server_->port());
    ASSERT_TRUE(c.connected());
    // Scoring needs a tokenizer (none here): answered at once with 400 (no watch is armed).
    c.send(post("/v1/score", R"({"model":"garden-embed","query":"q","documents":["d"]})"));
    Response r = c.read();
    EXPECT_EQ(r.status, 400) << r.body;
    // Keep-alive after an answer: the next request on the same connection is then abandoned.
    c.send(post("/v1/embeddings", R"({"model":"garden-embed","input":[5]})"));
    ASSERT_TRUE(eventually([&] { return fake_.heldCount() == 1; }));
  }
  ASSERT_TRUE(eventually([&] { return fake_.cancelledCalls() == 1; }));
  ASSERT_TRUE(eventually([&] {
    return seriesValue(registry_.expose(),
                       R"(ivy_http_client_disconnects_total{route="/v1/embeddings"})") == 1;
  }));
  EXPECT_EQ(
      seriesValue(registry_.expose(), R"(ivy_http_client_disconnects_total{route="/v1/score"})"),
      -1);
}

TEST_F(IvyServerTest, PipelinedRequestWhileTheFirstIsPendingIsKeptAndAnswered) {
  startServer();
  fake_.setHold(true);
  Conn c(server_->port());
  ASSERT_TRUE(c.connected());
  c.send(post("/v1/embeddings", R"({"model":"garden-embed","input":[1]})"));
  ASSERT_TRUE(eventually([&] { return fake_.heldCount() == 1; }));
  // The next request arrives while the first waits: the watch sees data, which is not a close.
  c.send(post("/v1/embeddings", R"({"model":"garden-embed","input":[2]})"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  c.send(get("/health"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(fake_.cancelledCalls(), 0);
  EXPECT_EQ(fake_.embedCalls().size(), 1u);  // the second is not read before the first is done
  fake_.setHold(false);
  fake_.releaseHeld();
  Response a = c.read();
  Response b = c.read();
  Response h = c.read();
  EXPECT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(h.status, 200) << h.body;
  EXPECT_THAT(h.body, HasSubstr("ok"));
  ASSERT_EQ(fake_.embedCalls().size(), 2u);
  EXPECT_EQ(fake_.embedCalls()[0].inputs, (std::vector<std::vector<int32_t>>{{1}}));
  EXPECT_EQ(fake_.embedCalls()[1].inputs, (std::vector<std::vector<int32_t>>{{2}}));
  EXPECT_EQ(fake_.cancelledCalls(), 0);
  // Two requests in one write, the first held: both answered in order.
  fake_.setHold(true);
  c.send(post("/v1/embeddings", R"({"model":"garden-embed","input":[3]})") + get("/v1/models"));
  ASSERT_TRUE(eventually([&] { return fake_.heldCount() == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  fake_.setHold(false);
  fake_.releaseHeld();
  Response d = c.read();
  Response m = c.read();
  EXPECT_EQ(d.status, 200) << d.body;
  EXPECT_THAT(d.body, HasSubstr("\"embedding\""));
  EXPECT_EQ(m.status, 200) << m.body;
  EXPECT_THAT(m.body, HasSubstr("\"object\":\"list\""));
  EXPECT_EQ(fake_.cancelledCalls(), 0);
  EXPECT_EQ(seriesValue(registry_.expose(),
                        R"(ivy_http_client_disconnects_total{route="/v1/embeddings"})"),
            -1);
}

// Replies and disconnects at about the same moment: each request is accounted exactly once (a
// response or a 499), nothing crashes, and the server keeps serving.
TEST_F(IvyServerTest, DisconnectRacingTheReplyIsAccountedOnce) {
  startServer();
  constexpr int kRequests = 40;
  for (int i = 0; i < kRequests; ++i) {
    fake_.setEmbedDelay(std::chrono::milliseconds(i % 4));
    const size_t before = fake_.embedCalls().size();
    Conn c(server_->port());
    ASSERT_TRUE(c.connected());
    c.send(post("/v1/embeddings",
                R"({"model":"garden-embed","input":[)" + std::to_string(i + 1) + "]}"));
    ASSERT_TRUE(eventually([&] { return fake_.embedCalls().size() == before + 1; }));
    if (i % 2 == 1) std::this_thread::sleep_for(std::chrono::microseconds(500 * (i % 5)));
    c.closeNow();
  }
  auto accounted = [&] {
    std::string page = registry_.expose();
    double ok = std::max(
        0.0, seriesValue(page, R"(ivy_http_requests_total{route="/v1/embeddings",status="200"})"));
    double gone = std::max(
        0.0, seriesValue(page, R"(ivy_http_requests_total{route="/v1/embeddings",status="499"})"));
    return ok + gone;
  };
  ASSERT_TRUE(eventually([&] { return accounted() == kRequests; })) << registry_.expose();
  std::string page = registry_.expose();
  EXPECT_EQ(
      std::max(0.0, seriesValue(page,
                                R"(ivy_http_requests_total{route="/v1/embeddings",status="499"})")),
      std::max(0.0,
               seriesValue(page, R"(ivy_http_client_disconnects_total{route="/v1/embeddings"})")));
  fake_.setEmbedDelay(std::chrono::milliseconds(0));
  EXPECT_EQ(roundTrip(post("/v1/embeddings", R"({"model":"garden-embed","input":[9]})")).status,
            200);
  EXPECT_TRUE(eventually([&] {
    return roundTrip(get("/metrics")).body.find("\nivy_inflight_requests 0\n") != std::string::npos;
  }));
}


// --- responses written by the thread that produced them [TAG_DIRECT_WRITE] ---
// A bare server (its own router) whose handlers answer from other threads, as ivy's model routes
// answer from gRPC's callback threads.
class DirectWriteTest : public ::testing::Test {
 protected:
  // The body of request `key` of `size` bytes: every byte depends on both, so a response delivered
  // to the wrong connection, out of order, or with a byte lost or repeated does not compare equal.
  static std::string bodyFor(uint64_t key, size_t size) {
    std::string b(size, '\0');
    uint64_t x = key * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < size; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      b[i] = static_cast<char>('a' + x % 26);
    }
    return b;
  }

  void SetUp() override {
    // GET /blob?key=K&size=N[&delay_ms=D]: answered from a new thread after D ms.
    router_.add(
        "GET", "/blob",
        [this](HttpRequest r, Responder respond) {
          uint64_t key = 0, size = 0, delay = 0;
          std::sscanf(r.query.c_str(), "key=%lu&size=%lu&delay_ms=%lu", &key, &size, &delay);
          std::lock_guard<std::mutex> lock(mu_);
          workers_.emplace_back([key, size, delay, respond = std::move(respond)] {
            if (delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
            HttpResponse res;
            res.content_type = "text/plain";
            res.headers.emplace_back("x-key", std::to_string(key));
            res.body = bodyFor(key, size);
            respond(std::move(res));
          });
        },
        Access::kPublic);
    HttpServerOptions ho;
    ho.host = "127.0.0.1";
    ho.port = 0;
    ho.threads = 2;
    server_ = std::make_unique<HttpServer>(ho, &router_, [this](const AccessRecord& r) {
      std::lock_guard<std::mutex> lock(mu_);
      ++records_;
      statuses_ += r.status == 200 ? 0 : 1;
    });
    ASSERT_TRUE(server_->start().isOk());
  }

  void TearDown() override {
    server_->stop();
    std::vector<std::thread> w;
    {
      std::lock_guard<std::mutex> lock(mu_);
      w.swap(workers_);
    }
    for (auto& t : w) t.join();
  }

  static std::string blob(uint64_t key, size_t size, int delay_ms = 0, std::string_view extra = "") {
    return get("/blob?key=" + std::to_string(key) + "&size=" + std::to_string(size) +
                   "&delay_ms=" + std::to_string(delay_ms),
               extra);
  }

  Router router_;
  std::unique_ptr<HttpServer> server_;
  std::mutex mu_;
  std::vector<std::thread> workers_;  // guarded by mu_
  int records_ = 0;                   // guarded by mu_
  int statuses_ = 0;                  // guarded by mu_: records whose status was not 200
};

// A response far larger than the socket's buffers, to a client that does not read for a while:
// the answering thread sends what fits, the connection's strand writes the rest, every byte
// arrives in order, and the keep-alive connection then serves the next request.
TEST_F(DirectWriteTest, ResponseLargerThanTheSocketBufferArrivesWhole) {
  Conn c(server_->port());
  ASSERT_TRUE(c.connected());
  constexpr size_t kBig = 24u << 20;
  ASSERT_TRUE(c.send(blob(7, kBig)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the buffers fill meanwhile
  Response r = c.read();
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("x-key"), "7");
  EXPECT_EQ(r.header("content-type"), "text/plain");
  EXPECT_FALSE(r.header("x-request-id").empty());
  ASSERT_EQ(r.body.size(), kBig);
  EXPECT_TRUE(r.body == bodyFor(7, kBig));
  ASSERT_TRUE(c.send(blob(8, 100)));
  Response r2 = c.read();
  ASSERT_EQ(r2.status, 200);
  EXPECT_EQ(r2.body, bodyFor(8, 100));
}

// `Connection: close` is honoured on this path: the header says so and the server closes.
TEST_F(DirectWriteTest, ConnectionCloseIsHonoured) {
  Conn c(server_->port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send(blob(3, 1000, 0, "Connection: close\r\n")));
  Response r = c.read();
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("connection"), "close");
  EXPECT_EQ(r.body, bodyFor(3, 1000));
  EXPECT_TRUE(c.closedByPeer());
}

// Many connections at once, each many keep-alive requests of sizes from 0 B to 5 MB (some over
// the socket's buffer while the client pauses), answered from other threads after 0-2 ms, some pipelined two at a time:
// every response is whole, on its own connection, in order; each request is accounted once.
TEST_F(DirectWriteTest, ConcurrentConnectionsGetTheirOwnResponsesInOrder) {
  constexpr int kConns = 8, kRequests = 40;
  std::atomic<int> bad{0};
  std::vector<std::thread> clients;
  for (int ci = 0; ci < kConns; ++ci) {
    clients.emplace_back([&, ci] {
      Conn c(server_->port());
      if (!c.connected()) return void(++bad);
      for (int i = 0; i < kRequests; i += 2) {
        uint64_t k1 = ci * 1000 + i, k2 = k1 + 1;
        const bool big = (k1 * 7919) % 5 == 0;
        size_t s1 = big ? (5u << 20) : (k1 * 104729) % 20000;
        size_t s2 = (k2 * 104729) % 3000;
        // Two requests in one write (pipelined) on every other pair.
        if (i % 4 == 0) {
          if (!c.send(blob(k1, s1, static_cast<int>(k1 % 3)) + blob(k2, s2))) return void(++bad);
        } else if (!c.send(blob(k1, s1, static_cast<int>(k1 % 3)))) {
          return void(++bad);
        }
        // Not reading for a moment: the socket's buffer fills, the strand writes the rest.
        if (big) std::this_thread::sleep_for(std::chrono::milliseconds(30));
        Response a = c.read();
        if (a.status != 200 || a.header("x-key") != std::to_string(k1) || a.body != bodyFor(k1, s1))
          ++bad;
        if (i % 4 != 0 && !c.send(blob(k2, s2))) return void(++bad);
        Response b = c.read();
        if (b.status != 200 || b.header("x-key") != std::to_string(k2) || b.body != bodyFor(k2, s2))
          ++bad;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(bad.load(), 0);
  ASSERT_TRUE(eventually([&] {
    std::lock_guard<std::mutex> lock(mu_);
    return records_ == kConns * kRequests;
  }));
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(statuses_, 0);
}

// A client that leaves while its (large) response is being written: accounted once, nothing
// crashes, the server goes on serving.
TEST_F(DirectWriteTest, ClientLeavingDuringALargeResponse) {
  for (int i = 0; i < 20; ++i) {
    Conn c(server_->port());
    ASSERT_TRUE(c.connected());
    ASSERT_TRUE(c.send(blob(i, 8u << 20, i % 3)));
    if (i % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(i % 5));
    c.closeNow();
  }
  ASSERT_TRUE(eventually([&] {
    std::lock_guard<std::mutex> lock(mu_);
    return records_ == 20;
  }));
  Conn c(server_->port());
  ASSERT_TRUE(c.send(blob(99, 10)));
  Response r = c.read();
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body, bodyFor(99, 10));
}

}  // namespace
}  // namespace garden::ivy
