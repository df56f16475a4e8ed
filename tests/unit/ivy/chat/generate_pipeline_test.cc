// /v1/chat/completions, /v1/completions and /v1/responses under ivy's request pipeline (http/pipeline.h): the
// deadline (--generate-timeout-ms, shortened by x-request-timeout; 504 before output, an SSE
// timeout event after), admission (429 + Retry-After over --max-inflight-requests; prompt +
// max_tokens of every choice counted against --max-inflight-tokens, released when the answer or
// stream ends or the client leaves) and the x-garden-* timing headers. Scripted generate client,
// no sockets (chat_harness.h).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/unit/ivy/chat/chat_harness.h"

namespace garden::ivy::testing {
namespace {

using ::testing::HasSubstr;
using Headers = std::vector<std::pair<std::string, std::string>>;

const std::string kChat =
    R"({"model":"gpt-test","messages":[{"role":"user","content":"Hi"}],"max_tokens":10})";
const std::string kChatStream =
    R"({"model":"gpt-test","messages":[{"role":"user","content":"Hi"}],"max_tokens":10,)"
    R"("stream":true})";
const std::string kCompletion = R"({"model":"gpt-test","prompt":[1,2,3],"max_tokens":5})";
const std::string kResponses = R"({"model":"gpt-test","input":"Hi","max_output_tokens":10})";

double gauge(ChatHarness& h, const std::string& name) {
  const std::string page = h.registry().expose();
  const std::string key = "\n" + name + " ";
  size_t at = page.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(page.substr(at + key.size()));
}

// Polls `pred` (observable state, never a fixed sleep) for up to 30 s.
bool waitFor(const std::function<bool()>& pred) {
  for (int i = 0; i < 3000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// A chat request whose client can be made to leave: fire its `cancel` (what the server does when
// the connection closes).
HttpRequest leavingChat(const std::string& body) {
  HttpRequest r;
  r.method = "POST";
  r.path = "/v1/chat/completions";
  r.body = body;
  r.request_id = "gone";
  r.received = std::chrono::steady_clock::now();
  r.cancel = std::make_shared<CallCanceller>();
  return r;
}

// A request answered on its own thread while the scripted client holds its streams: the
// constructor returns once the client holds `held` streams (held() says whether it did);
// join() waits for the answer, which must be a 200.
class HeldRequest {
 public:
  HeldRequest(ChatHarness& h, std::string path, std::string body, size_t held)
      : thread_([&h, path = std::move(path), body = std::move(body)] {
          Captured r = h.post(path, body);
          EXPECT_EQ(r.status, 200) << path << ": " << r.body;
        }) {
    held_ = waitFor([&h, held] { return h.client().heldCount() == held; });
  }
  ~HeldRequest() { join(); }
  bool held() const { return held_; }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::thread thread_;
  bool held_ = false;
};

TEST(GeneratePipeline, DeadlineIsTheGenerateTimeoutShortenedByTheHeader) {
  IvyServiceOptions o;
  o.request_timeout = std::chrono::milliseconds(1000);    // embeddings' bound: not used here
  o.generate_timeout = std::chrono::milliseconds(20000);  // --generate-timeout-ms
  ChatHarness h("llm", o);
  h.client().setScript(h.ids("<|channel|>final<|message|>ok<|return|>"));
  ASSERT_EQ(h.post("/v1/chat/completions", kChat).status, 200);
  ASSERT_EQ(h.post("/v1/chat/completions", kChat, {{"x-request-timeout", "0.5"}}).status, 200);
  ASSERT_EQ(h.post("/v1/chat/completions", kChat, {{"x-request-timeout", "60"}}).status, 200);
  ASSERT_EQ(h.post("/v1/completions", kCompletion, {{"x-request-timeout", "2"}}).status, 200);
  ASSERT_EQ(h.post("/v1/responses", kResponses, {{"x-request-timeout", "3"}}).status, 200);
  auto calls = h.client().calls();
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_GT(calls[0].timeout.count(), 1000);  // not --request-timeout-ms
  EXPECT_LE(calls[0].timeout.count(), 20000);
  EXPECT_GT(calls[1].timeout.count(), 0);
  EXPECT_LE(calls[1].timeout.count(), 500);
  EXPECT_LE(calls[2].timeout.count(), 20000);  // the header cannot extend it
  EXPECT_GT(calls[3].timeout.count(), 0);
  EXPECT_LE(calls[3].timeout.count(), 2000);
  EXPECT_GT(calls[4].timeout.count(), 0);
  EXPECT_LE(calls[4].timeout.count(), 3000);
  Captured bad = h.post("/v1/chat/completions", kChat, {{"x-request-timeout", "soon"}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr(R"("param":"x-request-timeout")"));
  EXPECT_EQ(h.client().calls().size(), 5u);
}

TEST(GeneratePipeline, NoServerDeadlineLeavesTheHeaders) {
  IvyServiceOptions o;
  o.generate_timeout = std::chrono::milliseconds(0);  // none
  ChatHarness h("llm", o);
  h.client().setScript(h.ids("<|channel|>final<|message|>ok<|return|>"));
  ASSERT_EQ(h.post("/v1/chat/completions", kChat).status, 200);
  ASSERT_EQ(h.post("/v1/chat/completions", kChat, {{"x-request-timeout", "3"}}).status, 200);
  auto calls = h.client().calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].timeout.count(), 0);
  EXPECT_GT(calls[1].timeout.count(), 0);
  EXPECT_LE(calls[1].timeout.count(), 3000);
}

TEST(GeneratePipeline, DeadlinePassedBeforeSendingIs504WithoutCallingTulip) {
  ChatHarness h;
  for (const std::string& body : {kChat, kChatStream}) {
    Captured r = h.post("/v1/chat/completions", body, {{"x-request-timeout", "0.05"}},
                        std::chrono::milliseconds(1000));
    EXPECT_EQ(r.status, 504) << r.body;
    EXPECT_FALSE(r.streamed);
    EXPECT_THAT(r.body, HasSubstr(R"("code":"timeout")"));
  }
  Captured c = h.post("/v1/completions", kCompletion, {{"x-request-timeout", "0.05"}},
                      std::chrono::milliseconds(1000));
  EXPECT_EQ(c.status, 504) << c.body;
  EXPECT_TRUE(h.client().calls().empty());
}

TEST(GeneratePipeline, UpstreamDeadlineIs504BeforeOutputAndATimeoutEventAfter) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>Hello there, a long answer<|return|>"));
  h.client().setError(deadlineExceeded("tulip: deadline exceeded"), 0);
  for (const std::string& body : {kChat, kChatStream}) {
    Captured r = h.post("/v1/chat/completions", body, {{"x-request-timeout", "1"}});
    EXPECT_EQ(r.status, 504) << r.body;
    EXPECT_FALSE(r.streamed);
  }
  EXPECT_EQ(h.post("/v1/completions", kCompletion).status, 504);
  // Past the first chunk the stream has begun: the deadline is an in-band error event.
  h.client().setError(deadlineExceeded("tulip: deadline exceeded"), 5);
  Captured st = h.post("/v1/chat/completions", kChatStream, {{"x-request-timeout", "1"}});
  ASSERT_EQ(st.status, 200);
  ASSERT_TRUE(st.streamed);
  bool done = false;
  auto events = sseEvents(st.body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  EXPECT_THAT(events.back(), HasSubstr(R"("type":"timeout_error")"));
  EXPECT_THAT(events.back(), HasSubstr(R"("code":"timeout")"));
}

TEST(GeneratePipeline, OverloadIs429WithRetryAfterAndReleasedWhenTheAnswerLeaves) {
  IvyServiceOptions o;
  o.max_inflight_requests = 1;
  ChatHarness h("llm", o);
  h.client().setScript(h.ids("<|channel|>final<|message|>ok<|return|>"));
  h.client().setHold(true);
  HeldRequest first(h, "/v1/chat/completions", kChat, 1);
  ASSERT_TRUE(first.held());
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/chat/completions", kChat},
           {"/v1/chat/completions", kChatStream},
           {"/v1/completions", kCompletion},
           {"/v1/responses", kResponses}}) {
    Captured r = h.post(path, body);
    EXPECT_EQ(r.status, 429) << path << ": " << r.body;
    EXPECT_EQ(r.header("Retry-After"), "1") << path;
    EXPECT_THAT(r.body, HasSubstr("--max-inflight-requests"));
  }
  EXPECT_EQ(h.client().calls().size(), 1u);  // the refused ones never reached tulip
  h.client().setHold(false);
  h.client().releaseHeld();
  first.join();
  // Each answer gives its slot back before it leaves: back-to-back requests are all admitted.
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(h.post("/v1/chat/completions", i % 2 ? kChat : kChatStream).status, 200);
    EXPECT_EQ(h.post("/v1/completions", kCompletion).status, 200);
    EXPECT_EQ(h.post("/v1/responses", kResponses).status, 200);
  }
  EXPECT_THAT(h.registry().expose(),
              HasSubstr("ivy_admission_rejected_total{limit=\"requests\"} 4"));
}

TEST(GeneratePipeline, PromptPlusMaxTokensOfEveryChoiceCountAgainstTheTokenBound) {
  // The prompt length of kChat as rendered (the Harmony prompt), from a first, unbounded run.
  size_t prompt = 0;
  {
    ChatHarness probe;
    probe.client().setScript(probe.ids("<|channel|>final<|message|>ok<|return|>"));
    ASSERT_EQ(probe.post("/v1/chat/completions", kChat).status, 200);
    prompt = probe.client().calls().at(0).prompt_ids.size();
  }
  ASSERT_GT(prompt, 0u);
  IvyServiceOptions o;
  // Room for the chat (prompt + 10) and 7 more tokens.
  o.max_inflight_tokens = prompt + 10 + 7;
  ChatHarness h("llm", o);
  h.client().setScript(h.ids("<|channel|>final<|message|>ok<|return|>"));
  h.client().setHold(true);
  {
    HeldRequest chat(h, "/v1/chat/completions", kChat, 1);
    ASSERT_TRUE(chat.held());
    EXPECT_EQ(gauge(h, "ivy_inflight_tokens"), double(prompt + 10));
    // 3 prompt tokens + 5 = 8 > 7 left: refused; 3 + 4 = 7 fits.
    Captured over = h.post("/v1/completions", kCompletion);
    EXPECT_EQ(over.status, 429) << over.body;
    EXPECT_EQ(over.header("Retry-After"), "1");
    EXPECT_THAT(over.body, HasSubstr("--max-inflight-tokens"));
    HeldRequest fits(h, "/v1/completions",
                     R"({"model":"gpt-test","prompt":[1,2,3],"max_tokens":4})", 2);
    ASSERT_TRUE(fits.held());
    EXPECT_EQ(gauge(h, "ivy_inflight_tokens"), double(prompt + 10 + 7));
    h.client().releaseHeld();
  }
  // Several prompts: every choice's prompt + max_tokens. With the chat in flight, 7 tokens are
  // left: two prompts of (2 + 4) are 12, refused; one of (1 + 2) is 3, admitted.
  {
    HeldRequest chat(h, "/v1/chat/completions", kChat, 1);
    ASSERT_TRUE(chat.held());
    Captured two =
        h.post("/v1/completions", R"({"model":"gpt-test","prompt":[[1,2],[3,4]],"max_tokens":4})");
    EXPECT_EQ(two.status, 429) << two.body;
    HeldRequest one(h, "/v1/completions", R"({"model":"gpt-test","prompt":[[1]],"max_tokens":2})",
                    2);
    ASSERT_TRUE(one.held());
    EXPECT_EQ(gauge(h, "ivy_inflight_tokens"), double(prompt + 10 + 3));
    h.client().releaseHeld();
  }
  EXPECT_THAT(h.registry().expose(), HasSubstr("ivy_admission_rejected_total{limit=\"tokens\"} 2"));
}

// The request limits every model route shares hold for messages and prompts too, each a 400
// naming the field and the flag, before anything reaches tulip.
TEST(GeneratePipeline, RequestLimitsApplyToMessagesAndPrompts) {
  struct Case {
    std::string path, body, param, flag;
  };
  auto run = [](RequestLimits limits, const std::vector<Case>& cases) {
    IvyServiceOptions o;
    o.limits = limits;
    ChatHarness h("llm", o);
    for (const Case& c : cases) {
      Captured r = h.post(c.path, c.body);
      EXPECT_EQ(r.status, 400) << c.body << ": " << r.body;
      EXPECT_THAT(r.body, HasSubstr(R"("param":")" + c.param + "\"")) << r.body;
      EXPECT_THAT(r.body, HasSubstr("(" + c.flag + ")")) << r.body;
    }
    EXPECT_TRUE(h.client().calls().empty());
  };
  RequestLimits chars;
  chars.max_input_chars = 10;
  run(chars, {{"/v1/chat/completions",
               R"({"model":"gpt-test","messages":[{"role":"user","content":"0123456789X"}]})",
               "messages", "--max-input-chars"},
              {"/v1/completions", R"({"model":"gpt-test","prompt":"0123456789X"})", "prompt",
               "--max-input-chars"}});
  RequestLimits per_prompt;
  per_prompt.max_input_tokens = 3;
  run(per_prompt, {{"/v1/chat/completions", kChat, "messages", "--max-input-tokens"},
                   {"/v1/completions", R"({"model":"gpt-test","prompt":[[1],[1,2,3,4]]})",
                    "prompt", "--max-input-tokens"}});
  RequestLimits total;
  total.max_request_tokens = 5;
  run(total, {{"/v1/chat/completions", kChat, "messages", "--max-request-tokens"},
              {"/v1/completions", R"({"model":"gpt-test","prompt":[[1,2,3],[4,5,6]]})", "prompt",
               "--max-request-tokens"}});
}

TEST(GeneratePipeline, TimingHeaders) {
  ChatHarness h;
  h.client().setScript(h.ids("<|channel|>final<|message|>ok<|return|>"));
  h.client().setTimings(/*queue_us=*/3, /*total_us=*/13);
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/chat/completions", kChat},
           {"/v1/completions", R"({"model":"gpt-test","prompt":[[1,2],[3]],"max_tokens":2})"}}) {
    SCOPED_TRACE(path);
    Captured r = h.post(path, body);
    ASSERT_EQ(r.status, 200) << r.body;
    auto num = [&](const char* name) {
      std::string v = r.header(name);
      EXPECT_FALSE(v.empty()) << name;
      return v.empty() ? uint64_t(0) : std::stoull(v);
    };
    EXPECT_EQ(num("x-garden-queue-us"), 3u);       // tulip: arrival → first scheduled
    EXPECT_EQ(num("x-garden-inference-us"), 10u);  // tulip: first scheduled → finished
    EXPECT_LE(num("x-garden-tokenize-us") + num("x-garden-upstream-us"),
              num("x-garden-total-us") + 1);
  }
  // A stream's head carries what is known when it is sent: the tokenize time.
  Captured st = h.post("/v1/chat/completions", kChatStream);
  ASSERT_EQ(st.status, 200);
  ASSERT_TRUE(st.streamed);
  EXPECT_FALSE(st.header("x-garden-tokenize-us").empty());
  EXPECT_TRUE(st.header("x-garden-total-us").empty());
  EXPECT_TRUE(st.header("x-garden-queue-us").empty());
}

// Many clients at once against a small in-flight bound, some leaving mid-request: every request
// is answered exactly once (its answer, a 429, or — a client that left — nothing it waits for),
// and when all is done the admission is back to zero requests and zero tokens.
TEST(GeneratePipeline, ConcurrentRequestsAreAllAnsweredAndGiveTheirAdmissionBack) {
  IvyServiceOptions o;
  o.max_inflight_requests = 3;
  o.max_inflight_tokens = 4096;
  ChatHarness h("llm", o);
  h.client().setScript(h.ids("<|channel|>final<|message|>Hello there<|return|>"));
  constexpr int kThreads = 6, kEach = 40;
  std::atomic<int> ok{0}, refused{0}, other{0}, gone{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const int k = (t * kEach + i) % 4;
        if (k == 3) {
          // A client that goes away at once: its answer is dropped, its slot must come back.
          HttpRequest r = leavingChat(kChatStream);
          auto cancel = r.cancel;
          auto answer = std::make_shared<std::promise<HttpResponse>>();
          auto answered = answer->get_future();
          h.router().dispatch(std::move(r),
                              [answer](HttpResponse resp) { answer->set_value(std::move(resp)); });
          cancel->cancel();
          if (answered.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
            other.fetch_add(1);
          } else if (auto stream = answered.get().stream) {
            stream->cancel();  // its head went out first: the server cuts the stream off too
          }
          gone.fetch_add(1);
          continue;
        }
        Captured r = k == 0   ? h.post("/v1/chat/completions", kChat)
                     : k == 1 ? h.post("/v1/chat/completions", kChatStream)
                              : h.post("/v1/completions", kCompletion);
        if (r.status == 200) {
          ok.fetch_add(1);
        } else if (r.status == 429 && r.header("Retry-After") == "1") {
          refused.fetch_add(1);
        } else {
          other.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(h.client().waitIdle(std::chrono::seconds(30)));
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(ok.load() + refused.load() + gone.load(), kThreads * kEach);
  EXPECT_GT(ok.load(), 0);
  // /metrics refreshes the in-flight gauges from the admission counters.
  std::promise<HttpResponse> page;
  HttpRequest m;
  m.method = "GET";
  m.path = "/metrics";
  h.router().dispatch(std::move(m), [&page](HttpResponse r) { page.set_value(std::move(r)); });
  const std::string body = page.get_future().get().body;
  EXPECT_THAT(body, HasSubstr("\nivy_inflight_requests 0\n"));
  EXPECT_THAT(body, HasSubstr("\nivy_inflight_tokens 0\n"));
}

TEST(GeneratePipeline, ClientLeavingReleasesTheAdmission) {
  IvyServiceOptions o;
  o.max_inflight_requests = 1;
  ChatHarness h("llm", o);
  h.client().setScript(h.ids("<|channel|>final<|message|>ok<|return|>"));
  h.client().setHold(true);
  HttpRequest r = leavingChat(kChat);
  auto cancel = r.cancel;
  std::atomic<int> answered{0};
  h.router().dispatch(std::move(r), [&](HttpResponse) { answered.fetch_add(1); });
  ASSERT_TRUE(waitFor([&] { return h.client().heldCount() == 1; }));
  EXPECT_EQ(h.post("/v1/chat/completions", kChat).status, 429);
  cancel->cancel();  // the client closes the connection
  ASSERT_TRUE(waitFor([&] { return answered.load() == 1; }));
  h.client().setHold(false);
  EXPECT_EQ(h.post("/v1/chat/completions", kChat).status, 200);
  h.client().releaseHeld();
  ASSERT_TRUE(h.client().waitIdle(std::chrono::seconds(30)));
  EXPECT_EQ(answered.load(), 1);
}

}  // namespace
}  // namespace garden::ivy::testing
