// /v1/completions through the real routes with a scripted generate client and the Harmony fake
// tokenizer (ids 0..255 are bytes, so scripts are plain text here).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "tests/unit/ivy/chat/chat_harness.h"

namespace garden::ivy::testing {
namespace {

using ::testing::HasSubstr;

struct Choice {
  std::string text;
  std::string finish_reason;
};
struct Result {
  std::map<int64_t, Choice> choices;
  int64_t prompt_tokens = -1, completion_tokens = -1, total_tokens = -1;
};

void readUsage(simdjson::dom::element u, Result* r) {
  EXPECT_FALSE(u["prompt_tokens"].get(r->prompt_tokens));
  EXPECT_FALSE(u["completion_tokens"].get(r->completion_tokens));
  EXPECT_FALSE(u["total_tokens"].get(r->total_tokens));
}

Result fromResponse(const std::string& body) {
  Json j(body);
  Result r;
  EXPECT_EQ(str(j.root["object"]), "text_completion");
  simdjson::dom::array choices;
  EXPECT_FALSE(j.root["choices"].get(choices));
  for (auto c : choices) {
    int64_t index = -1;
    EXPECT_FALSE(c["index"].get(index));
    r.choices[index] = {str(c["text"]), str(c["finish_reason"])};
  }
  readUsage(j.root["usage"], &r);
  return r;
}

Result fromStream(const std::string& body) {
  bool done = false;
  auto events = sseEvents(body, &done);
  EXPECT_TRUE(done);
  Result r;
  for (const auto& ev : events) {
    Json j(ev);
    EXPECT_EQ(str(j.root["object"]), "text_completion");
    simdjson::dom::array choices;
    EXPECT_FALSE(j.root["choices"].get(choices));
    if (choices.size() == 0) {
      readUsage(j.root["usage"], &r);
      continue;
    }
    for (auto c : choices) {
      int64_t index = -1;
      EXPECT_FALSE(c["index"].get(index));
      r.choices[index].text += str(c["text"]);
      simdjson::dom::element fr = c["finish_reason"];
      if (!fr.is_null()) r.choices[index].finish_reason = str(fr);
    }
  }
  return r;
}

std::vector<int32_t> bytes(std::string_view s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

void expectSame(const Result& a, const Result& b) {
  ASSERT_EQ(a.choices.size(), b.choices.size());
  for (const auto& [i, c] : a.choices) {
    EXPECT_EQ(c.text, b.choices.at(i).text) << "choice " << i;
    EXPECT_EQ(c.finish_reason, b.choices.at(i).finish_reason) << "choice " << i;
  }
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens);
  EXPECT_EQ(a.completion_tokens, b.completion_tokens);
  EXPECT_EQ(a.total_tokens, b.total_tokens);
}

Result both(ChatHarness& h, const std::string& fields) {
  Captured full = h.post("/v1/completions", "{" + fields + "}");
  EXPECT_EQ(full.status, 200) << full.body;
  Result a = fromResponse(full.body);
  Captured st = h.post("/v1/completions",
                       "{" + fields + R"(,"stream":true,"stream_options":{"include_usage":true}})");
  EXPECT_EQ(st.status, 200) << st.body;
  EXPECT_TRUE(st.streamed);
  Result b = fromStream(st.body);
  expectSame(a, b);
  return a;
}

TEST(CompletionsTest, StringPromptStreamingEqualsFull) {
  ChatHarness h;
  h.client().setScript(bytes(" there, friend"));
  Result r = both(h, R"("model":"gpt-test","prompt":"Hello","max_tokens":50)");
  ASSERT_EQ(r.choices.size(), 1u);
  EXPECT_EQ(r.choices[0].text, " there, friend");
  EXPECT_EQ(r.choices[0].finish_reason, "stop");
  EXPECT_EQ(r.prompt_tokens, 1);  // "Hello" is one token in the fake tokenizer
  EXPECT_EQ(r.completion_tokens, 14);
  auto c = h.client().calls().at(0);
  EXPECT_EQ(c.prompt_ids, (std::vector<int32_t>{13225}));
  EXPECT_EQ(c.max_tokens, 50u);
  // The model's eos ids stop generation.
  EXPECT_EQ(c.stop_token_ids, (std::vector<int32_t>{200002, 199999, 200012}));
  EXPECT_FALSE(c.ignore_eos);
}

TEST(CompletionsTest, IgnoreEosDropsTheEosStops) {
  ChatHarness h;
  h.client().setScript(bytes("ab"));
  Captured r = h.post("/v1/completions", R"({"prompt":"x","ignore_eos":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto c = h.client().calls().at(0);
  EXPECT_TRUE(c.ignore_eos);
  EXPECT_TRUE(c.stop_token_ids.empty());
  EXPECT_EQ(c.max_tokens, 16u);  // OpenAI's default
}

TEST(CompletionsTest, SeveralPromptsGiveIndexedChoices) {
  ChatHarness h;
  h.client().setScript([](const GenerateCall& call) {
    return bytes("<" + std::to_string(call.prompt_ids.size()) + ">");
  });
  Result r = both(h, R"("prompt":["a","bb","ccc"],"max_tokens":10)");
  ASSERT_EQ(r.choices.size(), 3u);
  EXPECT_EQ(r.choices[0].text, "<1>");
  EXPECT_EQ(r.choices[1].text, "<2>");
  EXPECT_EQ(r.choices[2].text, "<3>");
  EXPECT_EQ(r.prompt_tokens, 6);
  EXPECT_EQ(r.completion_tokens, 9);
}

TEST(CompletionsTest, TokenPromptsAndEcho) {
  ChatHarness h;
  h.client().setScript(bytes("!"));
  Result one = both(h, R"("prompt":[72,105],"echo":true)");
  EXPECT_EQ(one.choices[0].text, "Hi!");
  Result two = both(h, R"("prompt":[[72],[105,105]],"echo":true)");
  EXPECT_EQ(two.choices[0].text, "H!");
  EXPECT_EQ(two.choices[1].text, "ii!");
  Result text = both(h, R"("prompt":"Hello","echo":true)");
  EXPECT_EQ(text.choices[0].text, "Hello!");
}

TEST(CompletionsTest, LengthAndStop) {
  ChatHarness h;
  h.client().setScript(bytes("one two three four"));
  Result len = both(h, R"("prompt":"x","max_tokens":5)");
  EXPECT_EQ(len.choices[0].text, "one t");
  EXPECT_EQ(len.choices[0].finish_reason, "length");
  Result stop = both(h, R"("prompt":"x","max_tokens":50,"stop":["thr","zz"])");
  EXPECT_EQ(stop.choices[0].text, "one two ");
  EXPECT_EQ(stop.choices[0].finish_reason, "stop");
}

TEST(CompletionsTest, Utf8SplitAcrossTokensIsWhole) {
  ChatHarness h;
  h.client().setScript(std::vector<int32_t>{9552, 0x98, 0x80});  // " " + U+1F600 over 3 ids
  Captured st = h.post("/v1/completions", R"({"prompt":"x","stream":true})");
  bool done = false;
  std::string all;
  for (const auto& ev : sseEvents(st.body, &done)) {
    Json j(ev);
    std::string t = str(j.root["choices"].at(0)["text"]);
    EXPECT_EQ(t.find("\xEF\xBF\xBD"), std::string::npos);
    all += t;
  }
  EXPECT_EQ(all, " \xF0\x9F\x98\x80");
}

TEST(CompletionsTest, BadFieldsAre400NamingTheField) {
  ChatHarness h;
  struct Case {
    std::string body, param;
  };
  std::vector<Case> cases = {
      {R"({})", "prompt"},
      {R"({"prompt":null})", "prompt"},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":""})", "prompt"},
      {R"({"prompt":[]})", "prompt"},
      {R"({"prompt":[[]]})", "prompt"},
      {R"({"prompt":[1,-1]})", "prompt"},
      {R"({"prompt":[1,300000]})", "prompt"},
      {R"({"prompt":["a",3]})", "prompt"},
      {R"({"prompt":"a","echo":"y"})", "echo"},
      {R"({"prompt":"a","suffix":"s"})", "suffix"},
      {R"({"prompt":"a","n":2,"best_of":1})", "best_of"},
      {R"({"prompt":"a","logprobs":6})", "logprobs"},
      {R"({"prompt":"a","logprobs":true})", "logprobs"},
      {R"({"prompt":"a","logprobs":1,"echo":true})", "logprobs"},
      {R"({"prompt":"a","frequency_penalty":-2.5})", "frequency_penalty"},
      {R"({"prompt":"a","repetition_penalty":0})", "repetition_penalty"},
      {R"({"prompt":"a","min_p":1.5})", "min_p"},
      {R"({"prompt":"a","logit_bias":{"x":1}})", "logit_bias"},
      {R"({"prompt":"a","logit_bias":{"1":101}})", "logit_bias"},
      {R"({"prompt":"a","logit_bias":{"99999999":1}})", "logit_bias"},
      {R"({"prompt":"a","logit_bias":[1]})", "logit_bias"},
      {R"({"prompt":"a","n":0})", "n"},
      {R"({"prompt":"a","presence_penalty":3})", "presence_penalty"},
      {R"({"prompt":"a","response_format":{"type":"xml"}})", "response_format"},
      {R"({"prompt":"a","max_tokens":5000})", "max_tokens"},
      {R"({"prompt":"a","temperature":-1})", "temperature"},
      {R"({"prompt":"a","stop":{}})", "stop"},
      {R"({"prompt":"a","stream":1})", "stream"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    Captured r = h.post("/v1/completions", c.body);
    EXPECT_EQ(r.status, 400) << r.body;
    Json j(r.body);
    EXPECT_EQ(str(j.root["error"]["param"]), c.param) << r.body;
  }
  EXPECT_TRUE(h.client().calls().empty());
  EXPECT_EQ(h.post("/v1/completions", R"({"model":"nope","prompt":"a"})").status, 404);
}

TEST(CompletionsTest, SamplingParametersReachTheCall) {
  ChatHarness h;
  Captured r = h.post("/v1/completions",
                      R"({"prompt":"a","max_tokens":2,"logprobs":3,"presence_penalty":0.5,)"
                      R"("frequency_penalty":-1,"repetition_penalty":1.25,"min_p":0.1,)"
                      R"("logit_bias":{"5":-100,"7":2.5},"seed":9})");
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(h.client().calls().size(), 1u);
  const GenerateCall c = h.client().calls()[0];
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(c.top_logprobs, 3u);
  EXPECT_FLOAT_EQ(c.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(c.frequency_penalty, -1.f);
  EXPECT_FLOAT_EQ(c.repetition_penalty, 1.25f);
  EXPECT_FLOAT_EQ(c.min_p, 0.1f);
  ASSERT_EQ(c.logit_bias.size(), 2u);
  EXPECT_EQ(c.logit_bias[0], (std::pair<int32_t, float>{5, -100.f}));
  EXPECT_EQ(c.logit_bias[1], (std::pair<int32_t, float>{7, 2.5f}));
  EXPECT_TRUE(c.has_seed);
  EXPECT_EQ(c.seed, 9u);
  // The legacy logprobs object is present, one entry per generated token (the fake sends none:
  // its entries read as unknown, -9999).
  Json j(r.body);
  simdjson::dom::array toks;
  ASSERT_FALSE(j.root["choices"].at(0)["logprobs"]["tokens"].get(toks)) << r.body;
  simdjson::dom::array offs;
  ASSERT_FALSE(j.root["choices"].at(0)["logprobs"]["text_offset"].get(offs)) << r.body;
  EXPECT_EQ(toks.size(), offs.size());
}

TEST(CompletionsTest, PromptFillingTheContextIs400) {
  ChatHarness h;
  h.spec().max_seq_len = 8;
  Captured r = h.post("/v1/completions", R"({"prompt":[1,2,3,4,5,6,7,8]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("leaving none to generate"));
  // The default max_tokens (16) is clamped to what is left.
  h.client().setScript(bytes("abcdefgh"));
  Captured ok = h.post("/v1/completions", R"({"prompt":[1,2,3]})");
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(h.client().calls().at(0).max_tokens, 5u);
}

}  // namespace
}  // namespace garden::ivy::testing
