// Chat, completions and responses through the three real binaries on CPU: ivy (Harmony render +
// parse, SSE) -> tulip (continuous batching, Generate stream) -> rose (a tiny random gpt-oss). The
// weights are random, so assertions are about the protocol: response shapes, finish reasons
// against token counts, streaming == non-streaming under greedy sampling, forced tool calls and
// their round trip, concurrency, and that a client leaving mid-stream frees its sequence in tulip.

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <simdjson.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include "common/json_writer.h"
#include "garden/v1/garden.grpc.pb.h"
#include "tests/integration/support/harness.h"

namespace garden {
namespace {

using namespace std::chrono_literals;

struct Mesh {
  testing::TempDir dir;
  std::unique_ptr<testing::Process> tulip, ivy;
  int tulip_port = 0, ivy_port = 0, tulip_metrics_port = 0;
  std::string error;  // set when the mesh could not start
};
Mesh* g_mesh = nullptr;

const std::string kTool =
    R"({"type":"function","function":{"name":"get_weather","description":"Weather in a city",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},)"
    R"("required":["city"]}}})";

// Request fields for a stream that only max_tokens (or the client) ends: ignore_eos drops the
// model's EOS ids from the stop set, and the chat route always stops at Harmony's <|return|> and
// <|call|> (200002, 200012), which a random model samples now and then — so those are banned.
// (A stream that ended by itself before the client left failed CI once: tulipSeqs 0 vs >= 1.)
const std::string kUntilMaxTokens =
    R"("ignore_eos":true,"logit_bias":{"200002":-100,"200012":-100})";

class ChatMesh : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_mesh = new Mesh;
    Mesh& m = *g_mesh;
    const std::string tok = testing::sourceDir() + "/tests/assets/tokenizers/gptoss/tokenizer.json";
    if (!std::ifstream(tok).good()) {
      m.error = "missing " + tok + " (tokenizer_assets fixture)";
      return;
    }
    const std::string model = m.dir.path() + "/gptoss";
    int rc = testing::run({testing::binary("services/rose/rose-mkmodel"), "--kind", "gpt-oss",
                           "--out", model, "--tokenizer-json", tok},
                          m.dir.path() + "/mkmodel.log");
    if (rc != 0) {
      m.error = "rose-mkmodel failed, see " + m.dir.path() + "/mkmodel.log";
      return;
    }
    m.tulip_port = testing::freePort();
    m.ivy_port = testing::freePort();
    m.tulip_metrics_port = testing::freePort();
    m.tulip = std::make_unique<testing::Process>(
        std::vector<std::string>{
            testing::binary("services/tulip/tulip"),
            "--host",
            "127.0.0.1",
            "--port",
            std::to_string(m.tulip_port),
            "--metrics-port",
            std::to_string(m.tulip_metrics_port),
            "--model",
            model,
            "--device",
            "cpu",
            "--rose-bin",
            testing::binary("services/rose/rose"),
            "--rose-threads",
            "2",
            "--shm-name",
            "/garden-chat-" + std::to_string(getpid()) + "-" + std::to_string(m.tulip_port),
            "--served-model-name",
            "gpt-oss-tiny",
            // Long: tests pause rose (testing::Paused) to hold generations at a known point,
            // which the liveness checks would otherwise (rightly) take for a stuck worker.
            "--heartbeat-timeout-ms",
            "60000",
            "--progress-timeout-ms",
            "60000"},
        m.dir.path() + "/tulip.log");
    m.ivy = std::make_unique<testing::Process>(
        std::vector<std::string>{testing::binary("services/ivy/ivy"), "--host", "127.0.0.1",
                                 "--port", std::to_string(m.ivy_port), "--tulip",
                                 "127.0.0.1:" + std::to_string(m.tulip_port), "--tokenizer", tok,
                                 "--threads", "2"},
        m.dir.path() + "/ivy.log");
    if (!testing::waitForHttp(m.ivy_port, "/ready", 200, 240s)) {
      m.error = "mesh not ready in 240 s.\n--- tulip ---\n" + m.tulip->log() + "\n--- ivy ---\n" +
                m.ivy->log();
    }
  }
  static void TearDownTestSuite() {
    delete g_mesh;
    g_mesh = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(g_mesh->error.empty()) << g_mesh->error; }

  static testing::HttpResponse post(const std::string& path, const std::string& body,
                                    const std::map<std::string, std::string>& headers = {}) {
    return testing::http(g_mesh->ivy_port, "POST", path, body, headers, 120s);
  }

  // The mesh's rose (tulip's one child).
  static pid_t rosePid() {
    std::vector<pid_t> kids = testing::childrenOf(g_mesh->tulip->pid());
    return kids.size() == 1 ? kids.front() : -1;
  }

  // Waits until tulip has no sequence running or waiting (after a cancelled or timed-out one).
  static bool tulipIdle() {
    return testing::eventually(60s, [] { return tulipSeqs() == 0; }, 100ms);
  }

  // tulip's Load: sequences still running or waiting.
  static int64_t tulipSeqs() {
    auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(g_mesh->tulip_port),
                                  grpc::InsecureChannelCredentials());
    auto stub = v1::Tulip::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    v1::LoadRequest req;
    v1::LoadResponse resp;
    if (!stub->Load(&ctx, req, &resp).ok()) return -1;
    return int64_t(resp.running_seqs()) + resp.waiting_seqs();
  }
};

struct Chat {
  std::string content, reasoning, finish_reason;
  bool content_null = false;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  std::vector<std::string> call_ids;
  int64_t prompt_tokens = -1, completion_tokens = -1, total_tokens = -1;
};

Chat parseChat(const std::string& body) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  Chat c;
  if (p.parse(body).get(doc)) {
    ADD_FAILURE() << "invalid JSON: " << body;
    return c;
  }
  simdjson::dom::element msg = doc["choices"].at(0)["message"];
  simdjson::dom::element v;
  std::string_view s;
  if (!msg["content"].get(v)) {
    if (v.is_null())
      c.content_null = true;
    else if (!v.get_string().get(s))
      c.content = std::string(s);
  }
  if (!msg["reasoning_content"].get_string().get(s)) c.reasoning = std::string(s);
  simdjson::dom::array calls;
  if (!msg["tool_calls"].get_array().get(calls)) {
    for (auto call : calls) {
      std::string_view name, args, id;
      EXPECT_FALSE(call["function"]["name"].get_string().get(name));
      EXPECT_FALSE(call["function"]["arguments"].get_string().get(args));
      EXPECT_FALSE(call["id"].get_string().get(id));
      c.calls.emplace_back(std::string(name), std::string(args));
      c.call_ids.emplace_back(id);
    }
  }
  if (!doc["choices"].at(0)["finish_reason"].get_string().get(s)) c.finish_reason = std::string(s);
  EXPECT_FALSE(doc["usage"]["prompt_tokens"].get(c.prompt_tokens));
  EXPECT_FALSE(doc["usage"]["completion_tokens"].get(c.completion_tokens));
  EXPECT_FALSE(doc["usage"]["total_tokens"].get(c.total_tokens));
  return c;
}

// The events of an SSE body, each without its blank line; fails on an unterminated one.
std::vector<std::string> sseBlocks(const std::string& body) {
  std::vector<std::string> blocks;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) {
      ADD_FAILURE() << "unterminated event: " << body.substr(pos);
      break;
    }
    blocks.push_back(body.substr(pos, end - pos));
    pos = end + 2;
  }
  return blocks;
}

Chat parseChatStream(const std::string& body) {
  Chat c;
  bool done = false;
  std::map<int64_t, std::pair<std::string, std::string>> calls;
  for (const std::string& ev : sseBlocks(body)) {
    EXPECT_FALSE(done) << "an event after [DONE]: " << ev;
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    std::string payload = ev.substr(6);
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (p.parse(payload).get(doc)) {
      ADD_FAILURE() << "invalid JSON event: " << payload;
      continue;
    }
    simdjson::dom::array choices;
    if (doc["choices"].get_array().get(choices)) {  // e.g. an error event: no array to read
      ADD_FAILURE() << "event without choices: " << payload;
      continue;
    }
    if (choices.size() == 0) {
      EXPECT_FALSE(doc["usage"]["prompt_tokens"].get(c.prompt_tokens));
      EXPECT_FALSE(doc["usage"]["completion_tokens"].get(c.completion_tokens));
      EXPECT_FALSE(doc["usage"]["total_tokens"].get(c.total_tokens));
      continue;
    }
    simdjson::dom::element delta = choices.at(0)["delta"];
    std::string_view s;
    if (!delta["content"].get_string().get(s)) c.content += s;
    if (!delta["reasoning_content"].get_string().get(s)) c.reasoning += s;
    simdjson::dom::array tcs;
    if (!delta["tool_calls"].get_array().get(tcs)) {
      for (auto tc : tcs) {
        int64_t index = -1;
        EXPECT_FALSE(tc["index"].get(index));
        if (!tc["function"]["name"].get_string().get(s)) calls[index].first += s;
        if (!tc["function"]["arguments"].get_string().get(s)) calls[index].second += s;
      }
    }
    if (!choices.at(0)["finish_reason"].get_string().get(s)) c.finish_reason = std::string(s);
  }
  EXPECT_TRUE(done) << "no [DONE]";
  for (auto& [i, call] : calls) c.calls.push_back(call);
  return c;
}

// Usage of one generation of at most `max_tokens`; `at_limit`: the limit stopped it.
void expectTokenCounts(int64_t prompt, int64_t completion, int64_t total, int64_t max_tokens,
                       bool at_limit) {
  EXPECT_GT(prompt, 0);
  EXPECT_GE(completion, 1);
  EXPECT_LE(completion, max_tokens);
  EXPECT_EQ(total, prompt + completion);
  if (at_limit) {
    EXPECT_EQ(completion, max_tokens);
  }
}

void expectConsistent(const Chat& c, int64_t max_tokens) {
  expectTokenCounts(c.prompt_tokens, c.completion_tokens, c.total_tokens, max_tokens,
                    c.finish_reason == "length");
  if (c.finish_reason != "length") {
    EXPECT_TRUE(c.finish_reason == "stop" || c.finish_reason == "tool_calls") << c.finish_reason;
  }
}

std::string userChat(const std::string& text, const std::string& extra) {
  return R"({"model":"gpt-oss-tiny","messages":[{"role":"user","content":")" + text + R"("}])" +
         (extra.empty() ? "" : "," + extra) + "}";
}

// A streamed chat request on its own connection, read as it arrives (testing::http() returns
// whole answers). `headers`: extra header lines, each ending in \r\n. 60 s receive timeout.
class RawStream {
 public:
  RawStream(int port, const std::string& body, const std::string& headers = "") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{60, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      "application/json\r\n" +
                      headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
                      body;
    sent_ = ::send(fd_, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size());
  }
  ~RawStream() { close(); }
  bool sent() const { return sent_; }
  // Reads until `what` has arrived; false when the connection ends (or times out) first.
  bool readUntil(std::string_view what) {
    char buf[4096];
    while (got_.find(what) == std::string::npos) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return false;
      got_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  const std::string& got() const { return got_; }
  // Whatever else arrives within `wait` (for failure messages: how the stream went on).
  const std::string& drain(std::chrono::milliseconds wait = std::chrono::milliseconds(300)) {
    char buf[4096];
    const auto end = std::chrono::steady_clock::now() + wait;
    while (fd_ >= 0 && std::chrono::steady_clock::now() < end) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        got_.append(buf, static_cast<size_t>(n));
      } else if (n == 0) {
        break;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return got_;
  }

 private:
  int fd_ = -1;
  bool sent_ = false;
  std::string got_;
};

TEST_F(ChatMesh, NonStreamingAndStreamingAgreeUnderGreedy) {
  const std::string fields = R"("max_tokens":12,"temperature":0)";
  auto full = post("/v1/chat/completions", userChat("What is 2 + 2?", fields));
  ASSERT_EQ(full.status, 200) << full.body;
  Chat a = parseChat(full.body);
  expectConsistent(a, 12);

  auto st = post("/v1/chat/completions",
                 userChat("What is 2 + 2?",
                          fields + R"(,"stream":true,"stream_options":{"include_usage":true})"));
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_EQ(st.headers["content-type"], "text/event-stream");
  Chat b = parseChatStream(st.body);
  expectConsistent(b, 12);
  // Same prompt, greedy: the same tokens, so the same assembled message.
  EXPECT_EQ(a.content, b.content);
  EXPECT_EQ(a.reasoning, b.reasoning);
  EXPECT_EQ(a.calls, b.calls);
  EXPECT_EQ(a.finish_reason, b.finish_reason);
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens);
  EXPECT_EQ(a.completion_tokens, b.completion_tokens);
}

TEST_F(ChatMesh, MaxTokensGivesLength) {
  auto r =
      post("/v1/completions",
           R"({"model":"gpt-oss-tiny","prompt":"Once upon","max_tokens":4,"ignore_eos":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(r.body);
  EXPECT_EQ(std::string_view(doc["choices"].at(0)["finish_reason"]), "length");
  EXPECT_EQ(int64_t(doc["usage"]["completion_tokens"]), 4);

  auto c = post("/v1/chat/completions", userChat("hi", R"("max_tokens":3)"));
  ASSERT_EQ(c.status, 200) << c.body;
  Chat chat = parseChat(c.body);
  expectConsistent(chat, 3);
}

TEST_F(ChatMesh, ForcedToolCallRoundTrip) {
  // The random model will not call a tool by itself: force it.
  auto r = post("/v1/chat/completions",
                userChat("Weather in Paris?",
                         R"("tools":[)" + kTool +
                             R"(],"tool_choice":{"type":"function","function":)"
                             R"({"name":"get_weather"}},"max_tokens":8,"temperature":0)"));
  ASSERT_EQ(r.status, 200) << r.body;
  Chat c = parseChat(r.body);
  ASSERT_EQ(c.calls.size(), 1u) << r.body;
  EXPECT_EQ(c.calls[0].first, "get_weather");
  expectConsistent(c, 8);
  // A random model rarely writes <|call|> within 8 tokens: then finish is length, else tool_calls.
  EXPECT_TRUE(c.finish_reason == "length" || c.finish_reason == "tool_calls") << c.finish_reason;

  // The same request streamed gives the same call.
  auto st = post(
      "/v1/chat/completions",
      userChat("Weather in Paris?", R"("tools":[)" + kTool +
                                        R"(],"tool_choice":{"type":"function","function":)"
                                        R"({"name":"get_weather"}},"max_tokens":8,"temperature":0,)"
                                        R"("stream":true)"));
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_EQ(parseChatStream(st.body).calls, c.calls);

  // Send the tool result back; the model continues the conversation.
  std::string args;  // the arguments as a JSON string literal's contents
  JsonWriter::appendEscaped(args, R"({"city":"Paris"})");
  std::string body = R"({"model":"gpt-oss-tiny","tools":[)" + kTool +
                     R"(],"max_tokens":6,"messages":[{"role":"user","content":"Weather?"},)"
                     R"({"role":"assistant","content":null,"tool_calls":[{"id":")" +
                     c.call_ids[0] +
                     R"(","type":"function","function":{"name":"get_weather","arguments":")" +
                     args + R"("}}]},{"role":"tool","tool_call_id":")" + c.call_ids[0] +
                     R"(","content":"sunny, 21C"}]})";
  auto next = post("/v1/chat/completions", body);
  ASSERT_EQ(next.status, 200) << next.body;
  Chat n = parseChat(next.body);
  expectConsistent(n, 6);
  EXPECT_GT(n.prompt_tokens, c.prompt_tokens);

  // tool_choice "required" with one tool forces that tool, so even a random model calls it.
  auto req = post("/v1/chat/completions",
                  userChat("Weather?", R"("tools":[)" + kTool +
                                           R"(],"tool_choice":"required","max_tokens":8)"));
  ASSERT_EQ(req.status, 200) << req.body;
  Chat rq = parseChat(req.body);
  ASSERT_EQ(rq.calls.size(), 1u) << req.body;
}

TEST_F(ChatMesh, ManyConcurrentChats) {
  constexpr int kN = 12;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kN; ++i) {
    threads.emplace_back([&, i] {
      std::string extra = R"("max_tokens":6)";
      if (i % 2) extra += R"(,"stream":true)";
      auto r = post("/v1/chat/completions", userChat("hello " + std::to_string(i), extra));
      if (r.status != 200) {
        ADD_FAILURE() << r.status << " " << r.body;
        return;
      }
      Chat c = i % 2 ? parseChatStream(r.body) : parseChat(r.body);
      if (!c.finish_reason.empty()) ok.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kN);
}

TEST_F(ChatMesh, ClientLeavingMidStreamFreesTheSequence) {
  // Only the client leaving (or 2000 tokens) ends it (kUntilMaxTokens).
  RawStream stream(g_mesh->ivy_port,
                   userChat("Tell me a long story",
                            R"("max_tokens":2000,"stream":true,)" + kUntilMaxTokens));
  ASSERT_TRUE(stream.sent());
  // The role chunk goes out with tulip's first generated chunk: generation is under way. (Later
  // events may take long: a random model rarely completes a Harmony header, and header tokens
  // produce no output until the parser's header limit.)
  ASSERT_TRUE(stream.readUntil("\"role\":\"assistant\"")) << "stream ended early: " << stream.got();
  const int64_t running = tulipSeqs();
  EXPECT_GE(running, 1) << "no sequence in tulip while the stream is open; the stream: "
                        << stream.drain();
  stream.close();
  // tulip's running set empties long before 2000 tokens could have been generated.
  int64_t seqs = -1;
  for (int i = 0; i < 300; ++i) {
    seqs = tulipSeqs();
    if (seqs == 0) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(seqs, 0);
  // And ivy still serves.
  auto r = post("/v1/chat/completions", userChat("hi", R"("max_tokens":2)"));
  EXPECT_EQ(r.status, 200) << r.body;
}

// ---- n and best_of [TAG_LLM_CHOICES] ----------------------------------------------------------

struct Completion {
  std::map<int64_t, std::string> text, finish;
  std::map<int64_t, double> logprob_sum;  // with "logprobs": the sampled tokens' sum
  int64_t prompt_tokens = -1, completion_tokens = -1;
};

Completion parseCompletion(const std::string& body) {
  Completion c;
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.parse(body).get(doc)) {
    ADD_FAILURE() << "invalid JSON: " << body;
    return c;
  }
  simdjson::dom::array choices;
  EXPECT_FALSE(doc["choices"].get(choices)) << body;
  for (auto ch : choices) {
    int64_t i = -1;
    std::string_view s;
    EXPECT_FALSE(ch["index"].get(i));
    if (!ch["text"].get_string().get(s)) c.text[i] = std::string(s);
    if (!ch["finish_reason"].get_string().get(s)) c.finish[i] = std::string(s);
    simdjson::dom::array lps;
    if (!ch["logprobs"]["token_logprobs"].get(lps)) {
      double sum = 0;
      for (auto v : lps) sum += v.get_double().value_unsafe();
      c.logprob_sum[i] = sum;
    }
  }
  EXPECT_FALSE(doc["usage"]["prompt_tokens"].get(c.prompt_tokens));
  EXPECT_FALSE(doc["usage"]["completion_tokens"].get(c.completion_tokens));
  return c;
}

double tulipMetric(const std::string& name) {
  auto r = testing::http(g_mesh->tulip_metrics_port, "GET", "/metrics", "", {}, 10s);
  EXPECT_EQ(r.status, 200);
  return testing::metricValue(r.body, name);
}

uint32_t tulipBlockSize() {
  auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(g_mesh->tulip_port),
                                grpc::InsecureChannelCredentials());
  auto stub = v1::Tulip::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  v1::ModelInfoRequest req;
  v1::ModelInfoResponse resp;
  EXPECT_TRUE(stub->ModelInfo(&ctx, req, &resp).ok());
  return resp.kv_block_size();
}

// A prompt of `len` token ids no earlier test of this mesh sent (the prefix cache would serve it
// otherwise); the same in every run, so a seeded answer is too.
std::string freshPrompt(int len, int salt) {
  std::string ids;
  for (int i = 0; i < len; ++i)
    ids += (i ? "," : "") + std::to_string(1000 + (salt * 7919 + i * 104729) % 150000);
  return "[" + ids + "]";
}

TEST_F(ChatMesh, NChoicesPrefillThePromptOnceAndAreReproducibleWithASeed) {
  const uint32_t bs = tulipBlockSize();
  ASSERT_GT(bs, 0u);
  constexpr int kLen = 50;
  const std::string prompt = freshPrompt(kLen, 1);
  const std::string body = R"({"model":"gpt-oss-tiny","prompt":)" + prompt +
                           R"(,"n":3,"max_tokens":4,"temperature":1,"seed":42,"ignore_eos":true})";
  const double computed0 = tulipMetric("tulip_prompt_tokens_computed_total");
  const double shared0 = tulipMetric("tulip_prompt_tokens_shared_total");
  auto r = post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  Completion a = parseCompletion(r.body);
  ASSERT_EQ(a.text.size(), 3u) << r.body;
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(a.finish[i], "length") << r.body;
  EXPECT_EQ(a.prompt_tokens, kLen);          // counted once
  EXPECT_EQ(a.completion_tokens, 3 * 4);     // summed over the choices
  // The prompt was computed once; choices 1 and 2 computed only the tokens past its last full
  // block (kLen - shared each) on top of the blocks they share.
  const uint32_t shared = (kLen - 1) / bs * bs;
  EXPECT_EQ(tulipMetric("tulip_prompt_tokens_computed_total") - computed0,
            kLen + 2.0 * (kLen - shared));
  EXPECT_EQ(tulipMetric("tulip_prompt_tokens_shared_total") - shared0, 2.0 * shared);
  // Different seeds per choice: a random model's choices differ.
  EXPECT_TRUE(a.text[0] != a.text[1] || a.text[1] != a.text[2]) << r.body;

  // Seeded: the same request gives the same choices, and choice i is what seed + i gives alone.
  auto again = post("/v1/completions", body);
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(parseCompletion(again.body).text, a.text);
  for (int i = 0; i < 3; ++i) {
    auto one = post("/v1/completions", R"({"model":"gpt-oss-tiny","prompt":)" + prompt +
                                           R"(,"max_tokens":4,"temperature":1,"seed":)" +
                                           std::to_string(42 + i) + R"(,"ignore_eos":true})");
    ASSERT_EQ(one.status, 200) << one.body;
    EXPECT_EQ(parseCompletion(one.body).text[0], a.text[i]) << "choice " << i;
  }
}

TEST_F(ChatMesh, BestOfReturnsTheCandidateWithTheHighestCumulativeLogprob) {
  const std::string prompt = freshPrompt(20, 2);
  const std::string common = R"({"model":"gpt-oss-tiny","prompt":)" + prompt +
                             R"(,"max_tokens":5,"temperature":1,"seed":7,"ignore_eos":true)";
  // The three candidates best_of 3 draws (seeds 7, 8, 9) with their logprobs.
  auto all = post("/v1/completions", common + R"(,"n":3,"logprobs":0})");
  ASSERT_EQ(all.status, 200) << all.body;
  Completion c = parseCompletion(all.body);
  ASSERT_EQ(c.logprob_sum.size(), 3u) << all.body;
  int64_t best = 0;
  for (int64_t i = 1; i < 3; ++i)
    if (c.logprob_sum[i] > c.logprob_sum[best]) best = i;
  auto b = post("/v1/completions", common + R"(,"best_of":3})");
  ASSERT_EQ(b.status, 200) << b.body;
  Completion one = parseCompletion(b.body);
  ASSERT_EQ(one.text.size(), 1u) << b.body;
  EXPECT_EQ(one.text[0], c.text[best]) << all.body << "\n" << b.body;
  EXPECT_EQ(one.completion_tokens, 3 * 5);  // every candidate generated
  EXPECT_NE(b.body.find(R"("logprobs":null)"), std::string::npos) << b.body;
  // Streaming cannot rank: refused.
  auto st = post("/v1/completions", common + R"(,"best_of":3,"stream":true})");
  EXPECT_EQ(st.status, 400) << st.body;
  EXPECT_NE(st.body.find(R"("param":"best_of")"), std::string::npos) << st.body;
}

TEST_F(ChatMesh, ChatNChoicesStreamedAndNot) {
  auto r = post("/v1/chat/completions", userChat("Pick a number", R"("n":2,"max_tokens":5)"));
  ASSERT_EQ(r.status, 200) << r.body;
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  ASSERT_FALSE(p.parse(r.body).get(doc));
  simdjson::dom::array choices;
  ASSERT_FALSE(doc["choices"].get(choices));
  ASSERT_EQ(choices.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    int64_t index = -1;
    EXPECT_FALSE(choices.at(i)["index"].get(index));
    EXPECT_EQ(index, static_cast<int64_t>(i));
    std::string_view fr;
    EXPECT_FALSE(choices.at(i)["finish_reason"].get_string().get(fr));
  }
  int64_t completion = -1;
  EXPECT_FALSE(doc["usage"]["completion_tokens"].get(completion));
  EXPECT_GE(completion, 2);
  EXPECT_LE(completion, 10);

  auto st = post("/v1/chat/completions",
                 userChat("Pick a number", R"("n":2,"max_tokens":5,"stream":true)"));
  ASSERT_EQ(st.status, 200) << st.body;
  for (int i = 0; i < 2; ++i) {
    const std::string role = R"("index":)" + std::to_string(i) +
                             R"(,"delta":{"role":"assistant")";
    EXPECT_NE(st.body.find(role), std::string::npos) << st.body;
  }
  EXPECT_NE(st.body.find("data: [DONE]"), std::string::npos);
}

// [TAG_STOP_CHOICE] A stop string that ends one choice of n = 2 stops that choice in tulip too
// (ivy's StopChoice), while the other runs to max_tokens. Measured on tulip's own counter of
// generated tokens: without the stop it would grow by 2 * max_tokens; with it, by what ivy reports
// (the other choice's max_tokens and the stopped one's tokens up to its stop string) plus the few
// tokens generated while the StopChoice call was on its way.
TEST_F(ChatMesh, StopStringEndingOneChoiceStopsItInTulip) {
  constexpr int kMax = 160;
  const std::string common = R"({"model":"gpt-oss-tiny","prompt":)" + freshPrompt(12, 3) +
                             R"(,"n":2,"max_tokens":)" + std::to_string(kMax) +
                             R"(,"temperature":1,"seed":5,"ignore_eos":true)";
  // The two choices' whole texts (seeded: the same again below).
  auto base = post("/v1/completions", common + "}");
  ASSERT_EQ(base.status, 200) << base.body;
  Completion all = parseCompletion(base.body);
  ASSERT_EQ(all.text.size(), 2u) << base.body;
  const std::string t0 = all.text[0], t1 = all.text[1];
  // A stop string early in choice 0 (first found there, within its first third) that choice 1
  // never produces: 5 ASCII letters or digits (no JSON escaping, no UTF-8 boundary).
  std::string stop;
  size_t at = std::string::npos;
  for (size_t p = 1; p + 5 <= t0.size() / 3 && stop.empty(); ++p) {
    const std::string cand = t0.substr(p, 5);
    if (!std::all_of(cand.begin(), cand.end(), [](unsigned char ch) { return std::isalnum(ch); }))
      continue;
    if (t0.find(cand) == p && t1.find(cand) == std::string::npos) {
      stop = cand;
      at = p;
    }
  }
  ASSERT_FALSE(stop.empty()) << "no usable stop string in choice 0: " << t0;
  ASSERT_TRUE(tulipIdle());
  const double generated0 = tulipMetric("tulip_generated_tokens_total");
  auto r = post("/v1/completions", common + R"(,"stop":")" + stop + R"("})");
  ASSERT_EQ(r.status, 200) << r.body;
  Completion c = parseCompletion(r.body);
  // Choice 0 ends at the stop string, choice 1 is untouched.
  EXPECT_EQ(c.text[0], t0.substr(0, at)) << "stop " << stop;
  EXPECT_EQ(c.finish[0], "stop");
  EXPECT_EQ(c.text[1], t1);
  EXPECT_EQ(c.finish[1], "length");
  // ivy's usage: choice 1's max_tokens and the stopped choice's tokens ivy saw (at least one).
  EXPECT_GT(c.completion_tokens, kMax);
  EXPECT_LT(c.completion_tokens, 2 * kMax);
  // tulip stopped choice 0: it generated what ivy reports plus a few in flight, never both
  // choices' max_tokens.
  ASSERT_TRUE(tulipIdle());
  const double generated = tulipMetric("tulip_generated_tokens_total") - generated0;
  EXPECT_GE(generated, static_cast<double>(c.completion_tokens));
  EXPECT_LE(generated, static_cast<double>(c.completion_tokens + kMax / 4))
      << "tulip kept generating the stopped choice (" << generated << " tokens for "
      << c.completion_tokens << " reported)";
  EXPECT_LT(generated, 2.0 * kMax);
}

TEST_F(ChatMesh, ClientLeavingFreesEveryChoice) {
  RawStream stream(g_mesh->ivy_port,
                   userChat("Tell me a long story",
                            R"("n":3,"max_tokens":2000,"stream":true,)" + kUntilMaxTokens));
  ASSERT_TRUE(stream.sent());
  ASSERT_TRUE(stream.readUntil("\"role\":\"assistant\"")) << "stream ended early: " << stream.got();
  EXPECT_GE(tulipSeqs(), 1);
  stream.close();
  EXPECT_TRUE(tulipIdle()) << "sequences left: " << tulipSeqs();
  // Every block is free again: what the KV cache had free before any request ran.
  auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(g_mesh->tulip_port),
                                grpc::InsecureChannelCredentials());
  auto stub = v1::Tulip::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  v1::LoadRequest req;
  v1::LoadResponse resp;
  ASSERT_TRUE(stub->Load(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.kv_free_blocks(), resp.kv_total_blocks());
}

TEST_F(ChatMesh, ErrorsAreOpenAiShaped) {
  auto bad = post("/v1/chat/completions", userChat("hi", R"("n":17)"));
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find(R"("param":"n")"), std::string::npos) << bad.body;
  auto nf = post("/v1/chat/completions",
                 R"({"model":"nope","messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(nf.status, 404) << nf.body;
  // An LLM does not embed or score: 400 naming `model` and its kind (never tulip's UNIMPLEMENTED
  // as a 500).
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/embeddings", R"({"model":"gpt-oss-tiny","input":"x"})"},
           {"/v1/score", R"({"model":"gpt-oss-tiny","query":"q","documents":["d"]})"},
           {"/v1/rerank", R"({"model":"gpt-oss-tiny","query":"q","documents":["d"]})"}}) {
    auto r = post(path, body);
    EXPECT_EQ(r.status, 400) << path << ": " << r.body;
    EXPECT_NE(r.body.find(R"("param":"model")"), std::string::npos) << path << ": " << r.body;
    EXPECT_NE(r.body.find("'gpt-oss-tiny' is a generative (llm) model; " + path + " needs"),
              std::string::npos)
        << path << ": " << r.body;
  }
}

TEST_F(ChatMesh, TimingHeaders) {
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/chat/completions", userChat("hi", R"("max_tokens":3)")},
           {"/v1/completions", R"({"model":"gpt-oss-tiny","prompt":"Once","max_tokens":3})"}}) {
    auto r = post(path, body);
    ASSERT_EQ(r.status, 200) << path << ": " << r.body;
    for (const char* h : {"x-garden-tokenize-us", "x-garden-queue-us", "x-garden-inference-us",
                          "x-garden-upstream-us", "x-garden-total-us"}) {
      EXPECT_FALSE(r.headers[h].empty()) << path << " lacks " << h;
    }
    const uint64_t total = std::stoull(r.headers["x-garden-total-us"]);
    EXPECT_LE(std::stoull(r.headers["x-garden-tokenize-us"]) +
                  std::stoull(r.headers["x-garden-upstream-us"]),
              total + 1)
        << path;
    EXPECT_GT(std::stoull(r.headers["x-garden-inference-us"]), 0u) << path;  // tulip generated
  }
  // A stream's head carries what is known when it goes out.
  auto st = post("/v1/chat/completions", userChat("hi", R"("max_tokens":3,"stream":true)"));
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_EQ(st.headers["transfer-encoding"], "chunked");
  EXPECT_FALSE(st.headers["x-garden-tokenize-us"].empty());
  EXPECT_TRUE(st.headers["x-garden-total-us"].empty());
}

// A /v1/responses object: its output items in order ({type, text}: the reasoning text, the
// message text, or a call's "name(arguments)"), status and usage.
struct ResponseObject {
  std::string id, status, incomplete_reason;
  std::vector<std::pair<std::string, std::string>> items;
  std::vector<std::string> call_ids;
  int64_t input_tokens = -1, output_tokens = -1, total_tokens = -1;
};

ResponseObject parseResponse(simdjson::dom::element doc) {
  ResponseObject r;
  std::string_view s;
  EXPECT_FALSE(doc["id"].get_string().get(s));
  r.id = std::string(s);
  EXPECT_EQ(r.id.rfind("resp_", 0), 0u) << r.id;
  EXPECT_FALSE(doc["object"].get_string().get(s));
  EXPECT_EQ(s, "response");
  EXPECT_FALSE(doc["status"].get_string().get(s));
  r.status = std::string(s);
  if (!doc["incomplete_details"]["reason"].get_string().get(s)) r.incomplete_reason = s;
  simdjson::dom::array out;
  EXPECT_FALSE(doc["output"].get_array().get(out));
  for (auto item : out) {
    std::string_view type, text;
    EXPECT_FALSE(item["type"].get_string().get(type));
    if (type == "reasoning" || type == "message") {
      const char* part = type == "message" ? "output_text" : "reasoning_text";
      EXPECT_EQ(std::string_view(item["content"].at(0)["type"]), part);
      EXPECT_FALSE(item["content"].at(0)["text"].get_string().get(text));
      r.items.emplace_back(std::string(type), std::string(text));
    } else {
      EXPECT_EQ(type, "function_call");
      std::string_view name, args, call_id;
      EXPECT_FALSE(item["name"].get_string().get(name));
      EXPECT_FALSE(item["arguments"].get_string().get(args));
      EXPECT_FALSE(item["call_id"].get_string().get(call_id));
      r.items.emplace_back("function_call", std::string(name) + "(" + std::string(args) + ")");
      r.call_ids.emplace_back(call_id);
    }
  }
  EXPECT_FALSE(doc["usage"]["input_tokens"].get(r.input_tokens));
  EXPECT_FALSE(doc["usage"]["output_tokens"].get(r.output_tokens));
  EXPECT_FALSE(doc["usage"]["total_tokens"].get(r.total_tokens));
  return r;
}

ResponseObject parseResponseBody(const std::string& body) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.parse(body).get(doc)) {
    ADD_FAILURE() << "invalid JSON: " << body;
    return {};
  }
  return parseResponse(doc);
}

void expectConsistent(const ResponseObject& r, int64_t max_tokens) {
  expectTokenCounts(r.input_tokens, r.output_tokens, r.total_tokens, max_tokens,
                    r.status == "incomplete");
  if (r.status == "incomplete") {
    EXPECT_EQ(r.incomplete_reason, "max_output_tokens");
  } else {
    EXPECT_EQ(r.status, "completed");
  }
}

// A streamed response: typed events in order (sequence numbers 0, 1, ...), the items assembled
// from the deltas, and the response the last event carries.
struct ResponseStreamed {
  std::vector<std::string> types;
  std::map<int64_t, std::pair<std::string, std::string>> assembled;  // output_index -> item
  ResponseObject final;
};

ResponseStreamed parseResponseStream(const std::string& body) {
  ResponseStreamed st;
  int64_t seq = 0;
  std::map<int64_t, std::string> names;
  for (const std::string& ev : sseBlocks(body)) {
    size_t nl = ev.find('\n');
    if (ev.rfind("event: ", 0) != 0 || nl == std::string::npos) {
      ADD_FAILURE() << "bad event: " << ev;
      continue;
    }
    std::string type = ev.substr(7, nl - 7);
    EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (p.parse(ev.substr(nl + 7)).get(doc)) {
      ADD_FAILURE() << "invalid JSON event: " << ev;
      continue;
    }
    EXPECT_EQ(std::string_view(doc["type"]), type);
    EXPECT_EQ(int64_t(doc["sequence_number"]), seq++);
    st.types.push_back(type);
    int64_t index = -1;
    std::string_view s;
    if (doc["output_index"].get(index)) index = -1;  // events without an item
    if (type == "response.output_item.added") {
      EXPECT_FALSE(doc["item"]["type"].get_string().get(s));
      st.assembled[index].first = std::string(s);
      if (s == "function_call") names[index] = std::string(std::string_view(doc["item"]["name"]));
    } else if (type == "response.reasoning_text.delta" || type == "response.output_text.delta" ||
               type == "response.function_call_arguments.delta") {
      EXPECT_FALSE(doc["delta"].get_string().get(s));
      st.assembled[index].second += s;
    } else if (type == "response.completed" || type == "response.incomplete") {
      st.final = parseResponse(doc["response"]);
    }
  }
  for (auto& [i, item] : st.assembled) {
    if (item.first == "function_call") item.second = names[i] + "(" + item.second + ")";
  }
  return st;
}

TEST_F(ChatMesh, ResponsesNonStreamingAndStreamingAgreeUnderGreedy) {
  const std::string body =
      R"({"model":"gpt-oss-tiny","input":"What is 2 + 2?","instructions":"Answer briefly.",)"
      R"("max_output_tokens":12,"temperature":0,"reasoning":{"effort":"low"})";
  auto full = post("/v1/responses", body + "}");
  ASSERT_EQ(full.status, 200) << full.body;
  EXPECT_FALSE(full.headers["x-garden-total-us"].empty());
  ResponseObject a = parseResponseBody(full.body);
  expectConsistent(a, 12);
  EXPECT_FALSE(a.items.empty()) << full.body;

  auto st = post("/v1/responses", body + R"(,"stream":true})");
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_EQ(st.headers["content-type"], "text/event-stream");
  EXPECT_EQ(st.body.find("[DONE]"), std::string::npos);
  ResponseStreamed s = parseResponseStream(st.body);
  ASSERT_GE(s.types.size(), 3u);
  EXPECT_EQ(s.types[0], "response.created");
  EXPECT_EQ(s.types[1], "response.in_progress");
  EXPECT_EQ(s.types.back(), a.status == "completed" ? "response.completed" : "response.incomplete");
  // The deltas assemble to the final response's items, and greedy gives the same answer.
  std::vector<std::pair<std::string, std::string>> assembled;
  for (auto& [i, item] : s.assembled) assembled.push_back(item);
  EXPECT_EQ(assembled, s.final.items);
  EXPECT_EQ(s.final.items, a.items);
  EXPECT_EQ(s.final.status, a.status);
  EXPECT_EQ(s.final.input_tokens, a.input_tokens);
  EXPECT_EQ(s.final.output_tokens, a.output_tokens);
}

TEST_F(ChatMesh, ResponsesFunctionCallRoundTripWithPreviousResponseId) {
  const std::string tools =
      R"("tools":[{"type":"function","name":"get_weather","description":"Weather in a city",)"
      R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},)"
      R"("required":["city"]}}])";
  // The random model will not call a tool by itself: force it.
  auto first = post("/v1/responses",
                    R"({"model":"gpt-oss-tiny","input":"Weather in Paris?",)" + tools +
                        R"(,"tool_choice":{"type":"function","name":"get_weather"},)"
                        R"("max_output_tokens":8,"temperature":0})");
  ASSERT_EQ(first.status, 200) << first.body;
  ResponseObject a = parseResponseBody(first.body);
  expectConsistent(a, 8);
  ASSERT_EQ(a.call_ids.size(), 1u) << first.body;
  EXPECT_EQ(a.items.back().second.rfind("get_weather(", 0), 0u) << a.items.back().second;

  // Streamed, the same call arrives as function_call_arguments deltas.
  auto st = post("/v1/responses",
                 R"({"model":"gpt-oss-tiny","input":"Weather in Paris?",)" + tools +
                     R"(,"tool_choice":{"type":"function","name":"get_weather"},)"
                     R"("max_output_tokens":8,"temperature":0,"stream":true})");
  ASSERT_EQ(st.status, 200) << st.body;
  ResponseStreamed s = parseResponseStream(st.body);
  EXPECT_EQ(s.final.items, a.items);

  // The call's output continues the stored conversation.
  auto next = post("/v1/responses", R"({"model":"gpt-oss-tiny","previous_response_id":")" + a.id +
                                        R"(",)" + tools +
                                        R"(,"max_output_tokens":6,"input":[{"type":)"
                                        R"("function_call_output","call_id":")" +
                                        a.call_ids[0] + R"(","output":"sunny, 21C"}]})");
  ASSERT_EQ(next.status, 200) << next.body;
  ResponseObject b = parseResponseBody(next.body);
  expectConsistent(b, 6);
  EXPECT_GT(b.input_tokens, a.input_tokens);  // the stored turn plus the tool output
  EXPECT_NE(next.body.find("\"previous_response_id\":\"" + a.id + "\""), std::string::npos);

  // Unknown (or never stored) ids are a 404 naming the field.
  auto nf = post("/v1/responses",
                 R"({"model":"gpt-oss-tiny","previous_response_id":"resp_nope","input":"x"})");
  EXPECT_EQ(nf.status, 404) << nf.body;
  EXPECT_NE(nf.body.find(R"("param":"previous_response_id")"), std::string::npos) << nf.body;
  auto unstored = post(
      "/v1/responses",
      R"({"model":"gpt-oss-tiny","input":"x","store":false,"max_output_tokens":2})");
  ASSERT_EQ(unstored.status, 200) << unstored.body;
  ResponseObject u = parseResponseBody(unstored.body);
  EXPECT_EQ(post("/v1/responses", R"({"model":"gpt-oss-tiny","previous_response_id":")" + u.id +
                                      R"(","input":"x"})")
                .status,
            404);
  // An unsupported tool type is refused by name.
  auto bad = post("/v1/responses",
                  R"({"model":"gpt-oss-tiny","input":"x","tools":[{"type":"web_search"}]})");
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("tools[0].type"), std::string::npos) << bad.body;
}

// x-request-timeout bounds a generation: with rose held (SIGSTOP) nothing can be generated, so the
// deadline passes first and the answer is a 504 (a stream whose head has not gone out included).
TEST_F(ChatMesh, RequestTimeoutHeaderIs504BeforeTheFirstToken) {
  const pid_t rose = rosePid();
  ASSERT_GT(rose, 0);
  {
    testing::Paused paused(rose);
    ASSERT_TRUE(paused.stopped());
    for (const char* extra : {R"("max_tokens":4)", R"("max_tokens":4,"stream":true)"}) {
      auto r = post("/v1/chat/completions", userChat("hi", extra), {{"x-request-timeout", "1"}});
      EXPECT_EQ(r.status, 504) << extra << ": " << r.body;
      EXPECT_NE(r.body.find(R"("code":"timeout")"), std::string::npos) << r.body;
    }
    auto c = post("/v1/completions", R"({"model":"gpt-oss-tiny","prompt":"a","max_tokens":4})",
                  {{"x-request-timeout", "1"}});
    EXPECT_EQ(c.status, 504) << c.body;
  }
  EXPECT_TRUE(tulipIdle()) << "timed-out generations still hold sequences";
  EXPECT_EQ(post("/v1/chat/completions", userChat("hi", R"("max_tokens":2)")).status, 200);
}

// Past its first token a stream is answered: the deadline ends it with an in-band timeout event.
TEST_F(ChatMesh, RequestTimeoutMidStreamIsATimeoutEvent) {
  const pid_t rose = rosePid();
  ASSERT_GT(rose, 0);
  RawStream stream(g_mesh->ivy_port,
                   userChat("Tell me a long story",
                            R"("max_tokens":2000,"stream":true,)" + kUntilMaxTokens),
                   "x-request-timeout: 10\r\n");
  ASSERT_TRUE(stream.sent());
  ASSERT_TRUE(stream.readUntil("\"role\":\"assistant\""))
      << "no first chunk within the deadline: " << stream.got();
  ASSERT_NE(stream.got().find("200 OK"), std::string::npos) << stream.got();
  {
    // No token can come any more; the rest of the 10 s passes and ivy ends the stream.
    testing::Paused paused(rose);
    ASSERT_TRUE(paused.stopped());
    ASSERT_TRUE(stream.readUntil("\r\n0\r\n\r\n")) << "the stream did not end: " << stream.got();
  }
  const std::string& got = stream.got();
  EXPECT_NE(got.find(R"("type":"timeout_error")"), std::string::npos) << got;
  EXPECT_NE(got.find(R"("code":"timeout")"), std::string::npos) << got;
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos) << got;
  EXPECT_TRUE(tulipIdle());
}

// --max-inflight-requests holds for chat: a second ivy allowing one request in flight answers a
// chat arriving while another is held upstream with 429 + Retry-After.
TEST_F(ChatMesh, OverloadIs429WithRetryAfter) {
  const int port = testing::freePort();
  testing::Process ivy({testing::binary("services/ivy/ivy"), "--host", "127.0.0.1", "--port",
                        std::to_string(port), "--tulip",
                        "127.0.0.1:" + std::to_string(g_mesh->tulip_port), "--tokenizer",
                        testing::sourceDir() + "/tests/assets/tokenizers/gptoss/tokenizer.json",
                        "--threads", "2", "--max-inflight-requests", "1"},
                       g_mesh->dir.path() + "/ivy-overload.log");
  ASSERT_TRUE(testing::waitForHttp(port, "/ready", 200, 120s)) << ivy.log();
  const pid_t rose = rosePid();
  ASSERT_GT(rose, 0);
  testing::HttpResponse held;
  std::thread first;
  {
    testing::Paused paused(rose);
    ASSERT_TRUE(paused.stopped());
    first = std::thread([&] {
      held = testing::http(port, "POST", "/v1/chat/completions",
                           userChat("hi", R"("max_tokens":2)"), {}, 120s);
    });
    ASSERT_TRUE(testing::eventually(60s, [&] {
      auto m = testing::http(port, "GET", "/metrics");
      return testing::metricValue(m.body, "ivy_inflight_requests") == 1;
    })) << "the first chat never went upstream";
    for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
             {"/v1/chat/completions", userChat("hi", R"("max_tokens":2,"stream":true)")},
             {"/v1/completions", R"({"model":"gpt-oss-tiny","prompt":"a","max_tokens":2})"}}) {
      auto r = testing::http(port, "POST", path, body, {}, 60s);
      EXPECT_EQ(r.status, 429) << path << ": " << r.body;
      EXPECT_EQ(r.headers["retry-after"], "1") << path;
      EXPECT_NE(r.body.find("--max-inflight-requests"), std::string::npos) << r.body;
    }
  }
  first.join();
  EXPECT_EQ(held.status, 200) << held.body;
  // The slot is free again.
  auto after = testing::http(port, "POST", "/v1/chat/completions",
                             userChat("hi", R"("max_tokens":2)"), {}, 120s);
  EXPECT_EQ(after.status, 200) << after.body;
}

}  // namespace
}  // namespace garden
