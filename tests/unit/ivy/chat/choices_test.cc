// n and best_of [TAG_LLM_CHOICES] through the real routes with a scripted generate client (one
// Generate call per prompt carrying n, its chunks naming their choice, as tulip sends them):
// response and stream shapes of /v1/chat/completions and /v1/completions, usage (the prompt once,
// completion tokens summed), best_of's ranking by cumulative logprob, and the 400s.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "tests/unit/ivy/chat/chat_harness.h"

namespace garden::ivy::testing {
namespace {

using ::testing::HasSubstr;

constexpr const char* kMessages = R"("messages":[{"role":"user","content":"Hi"}])";

struct Out {
  std::map<int64_t, std::string> text;    // chat: content; completions: text
  std::map<int64_t, std::string> finish;  // finish_reason per index
  std::map<int64_t, int> role_chunks;     // streamed chat: role chunks per index
  int64_t prompt_tokens = -1, completion_tokens = -1, cached = -1;
  int usage_chunks = 0;
};

void readUsage(simdjson::dom::element u, Out* o) {
  EXPECT_FALSE(u["prompt_tokens"].get(o->prompt_tokens));
  EXPECT_FALSE(u["completion_tokens"].get(o->completion_tokens));
  int64_t total = -1;
  EXPECT_FALSE(u["total_tokens"].get(total));
  EXPECT_EQ(total, o->prompt_tokens + o->completion_tokens);
  EXPECT_FALSE(u["prompt_tokens_details"]["cached_tokens"].get(o->cached));
}

Out parseFull(const std::string& body, bool chat) {
  Json j(body);
  Out o;
  simdjson::dom::array choices;
  EXPECT_FALSE(j.root["choices"].get(choices)) << body;
  for (auto c : choices) {
    int64_t i = -1;
    EXPECT_FALSE(c["index"].get(i));
    EXPECT_EQ(o.text.count(i), 0u) << "index " << i << " twice";
    o.text[i] = chat ? str(c["message"]["content"]) : str(c["text"]);
    o.finish[i] = str(c["finish_reason"]);
  }
  readUsage(j.root["usage"], &o);
  return o;
}

Out parseStream(const std::string& body, bool chat) {
  bool done = false;
  Out o;
  for (const std::string& ev : sseEvents(body, &done)) {
    Json j(ev);
    simdjson::dom::array choices;
    EXPECT_FALSE(j.root["choices"].get(choices)) << ev;
    if (choices.size() == 0) {
      ++o.usage_chunks;
      readUsage(j.root["usage"], &o);
      continue;
    }
    EXPECT_EQ(choices.size(), 1u) << ev;
    auto c = choices.at(0).value_unsafe();
    int64_t i = -1;
    EXPECT_FALSE(c["index"].get(i)) << ev;
    std::string_view s;
    if (chat) {
      if (!c["delta"]["role"].get_string().get(s)) ++o.role_chunks[i];
      if (!c["delta"]["content"].get_string().get(s)) o.text[i] += std::string(s);
    } else {
      o.text[i] += str(c["text"]);
    }
    simdjson::dom::element fr = c["finish_reason"];
    if (!fr.is_null()) {
      EXPECT_EQ(o.finish.count(i), 0u) << "two finish chunks for index " << i;
      o.finish[i] = str(fr);
    }
  }
  EXPECT_TRUE(done) << "no [DONE]";
  return o;
}

std::string finalText(const std::string& text) {
  return "<|channel|>final<|message|>" + text + "<|return|>";
}

TEST(ChoicesTest, ChatNChoicesStreamedAndNot) {
  ChatHarness h;
  std::map<uint32_t, std::vector<int32_t>> scripts;
  for (uint32_t c = 0; c < 3; ++c) scripts[c] = h.ids(finalText("answer " + std::string(c + 1, 'x')));
  h.client().setChoiceScript([&](const GenerateCall&, uint32_t c) { return scripts.at(c); });
  h.client().setCachedTokens(5);
  const int64_t generated = static_cast<int64_t>(scripts[0].size() + scripts[1].size() +
                                                 scripts[2].size());

  Captured full = h.post("/v1/chat/completions", std::string("{") + kMessages + R"(,"n":3})");
  ASSERT_EQ(full.status, 200) << full.body;
  Out a = parseFull(full.body, /*chat=*/true);
  ASSERT_EQ(a.text.size(), 3u);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(a.text[i], "answer " + std::string(i + 1, 'x'));
    EXPECT_EQ(a.finish[i], "stop");
  }
  const auto calls = h.client().calls();
  ASSERT_EQ(calls.size(), 1u);  // one Generate call: tulip prefills the prompt once
  EXPECT_EQ(calls[0].n, 3u);
  EXPECT_FALSE(calls[0].logprobs);
  EXPECT_EQ(a.prompt_tokens, static_cast<int64_t>(calls[0].prompt_ids.size()));  // once
  EXPECT_EQ(a.completion_tokens, generated);
  EXPECT_EQ(a.cached, 5);

  Captured st = h.post("/v1/chat/completions",
                       std::string("{") + kMessages +
                           R"(,"n":3,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(st.status, 200) << st.body;
  Out b = parseStream(st.body, /*chat=*/true);
  EXPECT_EQ(b.text, a.text);
  EXPECT_EQ(b.finish, a.finish);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(b.role_chunks[i], 1) << "index " << i;
  EXPECT_EQ(b.usage_chunks, 1);
  EXPECT_EQ(b.prompt_tokens, a.prompt_tokens);
  EXPECT_EQ(b.completion_tokens, a.completion_tokens);
  // Chunks of the choices interleave (the OpenAI shape: each names its index).
  const size_t second_delta = st.body.find(R"("index":1,"delta":{"content")");
  const size_t first_finish = st.body.find(R"("finish_reason":"stop")");
  ASSERT_NE(second_delta, std::string::npos);
  EXPECT_LT(second_delta, first_finish);
}

TEST(ChoicesTest, ChatStopStringEndsOneChoiceOnly) {
  ChatHarness h;
  h.client().setChoiceScript([&](const GenerateCall&, uint32_t c) {
    return h.ids(finalText(c == 0 ? "abc STOP def" : "ghi jkl"));
  });
  Captured r = h.post("/v1/chat/completions",
                      std::string("{") + kMessages + R"(,"n":2,"stop":"STOP"})");
  ASSERT_EQ(r.status, 200) << r.body;
  Out o = parseFull(r.body, true);
  EXPECT_EQ(o.text[0], "abc ");
  EXPECT_EQ(o.text[1], "ghi jkl");
  EXPECT_EQ(o.finish[0], "stop");
  EXPECT_EQ(o.finish[1], "stop");
}

// [TAG_STOP_CHOICE] The stopped choice is stopped upstream too (StopChoice), while the other
// runs to its end; what ivy reports for it (text, finish_reason, usage) is what it reports when
// the stream cannot stop one choice: ivy's own count, never the upstream's last chunk.
TEST(ChoicesTest, StopStringStopsThatChoiceUpstreamAndKeepsItsUsage) {
  auto run = [](bool honour, int* stop_calls, int* sent) {
    ChatHarness h;
    h.client().setHonourStopChoice(honour);
    // ivy stores the stream's handle just after generate() returns; a stop string matched before
    // that is passed on by start() — unless every choice had ended by then, when there is nothing
    // to stop (a cancel). With chunks back to back, a slow thread (CI's ASan stage) saw all ~130
    // chunks first and sent no StopChoice. 2 ms a chunk: the stream takes ~1 s.
    h.client().setChunkDelay(std::chrono::milliseconds(2));
    h.client().setChoiceScript([&](const GenerateCall&, uint32_t c) {
      std::string long_tail;
      for (int i = 0; i < 60; ++i) long_tail += " more";
      return h.ids(finalText(c == 0 ? "abc STOP def" + long_tail : "ghi jkl" + long_tail));
    });
    Captured r =
        h.post("/v1/chat/completions", std::string("{") + kMessages + R"(,"n":2,"stop":"STOP"})");
    EXPECT_EQ(r.status, 200) << r.body;
    *stop_calls = h.client().stopChoiceCalls();
    *sent = h.client().tokensSent();
    return parseFull(r.body, true);
  };
  int calls_on = 0, sent_on = 0, calls_off = 0, sent_off = 0;
  const Out on = run(true, &calls_on, &sent_on);
  const Out off = run(false, &calls_off, &sent_off);
  EXPECT_EQ(calls_on, 1);
  EXPECT_EQ(calls_off, 1);
  EXPECT_LT(sent_on, sent_off);  // choice 0's tail was never generated
  EXPECT_EQ(on.text, off.text);
  EXPECT_EQ(on.finish, off.finish);
  EXPECT_EQ(on.finish.at(0), "stop");
  EXPECT_EQ(on.completion_tokens, off.completion_tokens);
  EXPECT_LT(on.completion_tokens, int64_t{ScriptedGenerateClient::kStoppedCount});
  EXPECT_EQ(on.text.at(0).find("STOP"), std::string::npos);
}

TEST(ChoicesTest, CompletionsNPerPromptIndexesPromptMajor) {
  ChatHarness h;
  h.client().setChoiceScript([](const GenerateCall& call, uint32_t c) {
    std::vector<int32_t> ids;
    for (char ch : "p" + std::to_string(call.prompt_ids.size()) + "c" + std::to_string(c))
      ids.push_back(static_cast<unsigned char>(ch));
    return ids;
  });
  const std::string fields = R"("prompt":[[1,2],[3,4,5]],"n":2,"max_tokens":8)";
  Captured full = h.post("/v1/completions", "{" + fields + "}");
  ASSERT_EQ(full.status, 200) << full.body;
  Out a = parseFull(full.body, false);
  ASSERT_EQ(a.text.size(), 4u);
  EXPECT_EQ(a.text[0], "p2c0");
  EXPECT_EQ(a.text[1], "p2c1");
  EXPECT_EQ(a.text[2], "p3c0");
  EXPECT_EQ(a.text[3], "p3c1");
  EXPECT_EQ(a.prompt_tokens, 5);       // each prompt once
  EXPECT_EQ(a.completion_tokens, 16);  // 4 choices x 4 tokens
  auto calls = h.client().calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].n, 2u);
  EXPECT_EQ(calls[1].n, 2u);

  Captured st = h.post("/v1/completions", "{" + fields +
                                              R"(,"stream":true,"stream_options":)"
                                              R"({"include_usage":true}})");
  ASSERT_EQ(st.status, 200) << st.body;
  Out b = parseStream(st.body, false);
  EXPECT_EQ(b.text, a.text);
  EXPECT_EQ(b.finish, a.finish);
  EXPECT_EQ(b.usage_chunks, 1);
  EXPECT_EQ(b.prompt_tokens, 5);
  EXPECT_EQ(b.completion_tokens, 16);
}

TEST(ChoicesTest, BestOfReturnsTheHighestCumulativeLogprobs) {
  ChatHarness h;
  h.client().setChoiceScript([](const GenerateCall&, uint32_t c) {
    std::vector<int32_t> ids;
    for (char ch : std::string("cand") + std::to_string(c)) ids.push_back(ch);
    if (c == 2) ids.pop_back();  // 4 tokens: a higher per-token logprob can lose on the sum
    return ids;
  });
  // Per token: candidate 0 -2, 1 -0.5, 2 -0.6 (sum over 5, 5, 4 tokens: -10, -2.5, -2.4).
  h.client().setChoiceLogprob([](uint32_t c) { return c == 0 ? -2.f : c == 1 ? -0.5f : -0.6f; });
  Captured one = h.post("/v1/completions", R"({"prompt":[1,2],"best_of":3,"max_tokens":8})");
  ASSERT_EQ(one.status, 200) << one.body;
  Out a = parseFull(one.body, false);
  ASSERT_EQ(a.text.size(), 1u);
  EXPECT_EQ(a.text[0], "cand");  // candidate 2
  EXPECT_EQ(a.completion_tokens, 14);  // every candidate generated counts
  EXPECT_EQ(a.prompt_tokens, 2);
  EXPECT_THAT(one.body, HasSubstr(R"("logprobs":null)"));  // not asked for
  auto calls = h.client().calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].n, 3u);
  EXPECT_TRUE(calls[0].logprobs);  // ivy needs them to rank

  Captured two = h.post("/v1/completions",
                        R"({"prompt":[1,2],"n":2,"best_of":3,"max_tokens":8,"logprobs":0})");
  ASSERT_EQ(two.status, 200) << two.body;
  Out b = parseFull(two.body, false);
  ASSERT_EQ(b.text.size(), 2u);
  EXPECT_EQ(b.text[0], "cand");
  EXPECT_EQ(b.text[1], "cand1");
  Json j(two.body);
  double lp = 0;
  ASSERT_FALSE(j.root["choices"].at(1)["logprobs"]["token_logprobs"].at(0).get(lp)) << two.body;
  EXPECT_FLOAT_EQ(lp, -0.5);

  // best_of == n: no ranking, and streaming is fine.
  Captured same = h.post("/v1/completions",
                         R"({"prompt":[1,2],"n":2,"best_of":2,"max_tokens":8,"stream":true})");
  ASSERT_EQ(same.status, 200) << same.body;
  Out c = parseStream(same.body, false);
  EXPECT_EQ(c.text[0], "cand0");
  EXPECT_EQ(c.text[1], "cand1");
}

TEST(ChoicesTest, BadValuesAre400NamingTheField) {
  IvyServiceOptions o;
  o.limits.max_inflight_tokens = 1000;
  ChatHarness h("llm", o);
  h.client().setScript(std::vector<int32_t>{'a'});
  const std::string chat = std::string("{") + kMessages + ",";
  struct Case {
    std::string path, body, param;
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", chat + R"("n":0})", "n"},
      {"/v1/chat/completions", chat + R"("n":17})", "n"},
      {"/v1/chat/completions", chat + R"("n":"2"})", "n"},
      {"/v1/chat/completions", chat + R"("n":2.5})", "n"},
      {"/v1/chat/completions", chat + R"("n":16,"max_tokens":100})", "n"},  // 1600 > 1000
      {"/v1/completions", R"({"prompt":"a","n":0})", "n"},
      {"/v1/completions", R"({"prompt":"a","best_of":0})", "best_of"},
      {"/v1/completions", R"({"prompt":"a","best_of":17})", "best_of"},
      {"/v1/completions", R"({"prompt":"a","n":3,"best_of":2})", "best_of"},
      {"/v1/completions", R"({"prompt":"a","n":2,"best_of":3,"stream":true})", "best_of"},
      {"/v1/completions", R"({"prompt":"a","best_of":16,"max_tokens":100})", "best_of"},
      {"/v1/completions", R"({"prompt":["a","b"],"n":8,"max_tokens":100})", "n"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    Captured r = h.post(c.path, c.body);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_THAT(r.body, HasSubstr("\"param\":\"" + c.param + "\""));
  }
  EXPECT_TRUE(h.client().calls().empty());
  // Within the limit: fine (prompt + 9 x 100).
  EXPECT_EQ(h.post("/v1/completions", R"({"prompt":"a","n":9,"max_tokens":100})").status, 200);
}

TEST(ChoicesTest, ClientGoneCancelsTheCallOfAllChoices) {
  ChatHarness h;
  h.client().setScript(h.ids(finalText(std::string(200, 'z'))));
  h.client().setChunkDelay(std::chrono::milliseconds(5));
  HttpRequest r;
  r.method = "POST";
  r.path = "/v1/chat/completions";
  r.body = std::string("{") + kMessages + R"(,"n":4,"stream":true})";
  r.request_id = "req-gone";
  r.received = std::chrono::steady_clock::now();
  auto promise = std::make_shared<std::promise<HttpResponse>>();
  auto fut = promise->get_future();
  h.router().dispatch(std::move(r), [promise](HttpResponse resp) { promise->set_value(resp); });
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  HttpResponse resp = fut.get();
  ASSERT_TRUE(resp.stream);
  resp.stream->cancel();  // what the server does when the connection closes
  EXPECT_TRUE(h.client().waitIdle(std::chrono::seconds(10)));
  EXPECT_EQ(h.client().cancelledStreams(), 1);  // the one call of the four choices
}

}  // namespace
}  // namespace garden::ivy::testing
