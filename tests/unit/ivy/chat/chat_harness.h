#pragma once
// Shared by the chat / completions route tests: IvyService's routes (the whole request pipeline)
// on a Router with a scripted generate client, the Harmony fake tokenizer and a fixed ModelSpec,
// driven without sockets (the Responder is captured; a streamed body is read from its
// ResponseStream), plus SSE and JSON helpers.

#include <gtest/gtest.h>
#include <simdjson.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/metrics/registry.h"
#include "services/ivy/http/service.h"
#include "services/ivy/http/response_stream.h"
#include "services/ivy/http/router.h"
#include "tests/fakes/ivy/harmony_fake_tokenizer.h"
#include "tests/fakes/ivy/scripted_generate_client.h"

namespace garden::ivy::testing {

struct Captured {
  int status = -1;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  bool streamed = false;
  std::string body;  // the whole body (streamed bodies concatenated)
  std::string header(std::string_view name) const {
    for (const auto& [k, v] : headers) {
      if (k == name) return v;
    }
    return "";
  }
};

// Reads a ResponseStream to its end (10 s limit so nothing hangs). The wake-up state is shared
// with the callback: a writer calls the wake callback after releasing the stream's lock, so it
// may still be running it after this reader saw the end and detached (a stack-local mutex would
// be gone by then).
inline std::string readStream(const std::shared_ptr<ResponseStream>& s, bool* ended) {
  struct Wake {
    std::mutex mu;
    std::condition_variable cv;
    bool woken = false;  // guarded by mu
  };
  auto w = std::make_shared<Wake>();
  s->attach([w] {
    std::lock_guard<std::mutex> lock(w->mu);
    w->woken = true;
    w->cv.notify_all();
  });
  std::string out;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  *ended = false;
  while (std::chrono::steady_clock::now() < until) {
    ResponseStream::Taken t = s->take();
    out += t.data;
    if (t.ended) {
      *ended = true;
      break;
    }
    std::unique_lock<std::mutex> lock(w->mu);
    w->cv.wait_for(lock, std::chrono::milliseconds(20), [&] { return w->woken; });
    w->woken = false;
  }
  s->detach();
  return out;
}

class ChatHarness {
 public:
  explicit ChatHarness(std::string kind = "llm", IvyServiceOptions o = {}) {
    spec_ = std::make_shared<ModelSpec>();
    spec_->served_name = "gpt-test";
    spec_->upstream_name = "fake-llm";
    spec_->kind = std::move(kind);
    spec_->max_seq_len = 4096;
    spec_->vocab_size = 201088;
    spec_->eos_token_ids = {200002, 199999, 200012};
    o.tokenizer = &tok_;
    o.make_tool_call_id = [](size_t i) { return "call_test_" + std::to_string(i); };
    auto spec = spec_;
    ModelSource model{[spec] { return std::shared_ptr<const ModelSpec>(spec); },
                      [] { return true; }};
    service_ = std::make_unique<IvyService>(o, &client_, model, nullptr, &registry_);
    service_->registerRoutes(&router_);
  }

  // `age`: how long ago the request head arrived (its deadline counts from then).
  Captured post(const std::string& path, const std::string& body,
                std::vector<std::pair<std::string, std::string>> headers = {},
                std::chrono::milliseconds age = std::chrono::milliseconds(0)) {
    HttpRequest r;
    r.method = "POST";
    r.path = path;
    r.body = body;
    r.headers = std::move(headers);
    r.request_id = "req-1";
    r.received = std::chrono::steady_clock::now() - age;
    auto promise = std::make_shared<std::promise<HttpResponse>>();
    auto fut = promise->get_future();
    router_.dispatch(std::move(r), [promise](HttpResponse resp) { promise->set_value(resp); });
    Captured c;
    if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      ADD_FAILURE() << "no response within 10 s";
      return c;
    }
    HttpResponse resp = fut.get();
    c.status = resp.status;
    c.content_type = resp.content_type;
    c.headers = resp.headers;
    if (resp.stream) {
      c.streamed = true;
      bool ended = false;
      c.body = readStream(resp.stream, &ended);
      EXPECT_TRUE(ended) << "stream did not end";
    } else {
      c.body = resp.body;
    }
    return c;
  }

  // Ids of a Harmony text with special tokens written literally.
  std::vector<int32_t> ids(std::string_view text) const {
    std::vector<int32_t> out;
    tok_.encodeAllowingSpecial(text, &out);
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids) const {
    return tok_.decodeForTest(ids, /*skip_special=*/false);
  }

  ScriptedGenerateClient& client() { return client_; }
  ModelSpec& spec() { return *spec_; }
  Router& router() { return router_; }
  metrics::Registry& registry() { return registry_; }

 private:
  HarmonyFakeTokenizer tok_;
  ScriptedGenerateClient client_;
  metrics::Registry registry_;
  std::shared_ptr<ModelSpec> spec_;
  std::unique_ptr<IvyService> service_;
  Router router_;
};

// The events of an SSE body (each without its terminating blank line). Fails the test on an
// unterminated event.
inline std::vector<std::string> sseBlocks(const std::string& body) {
  std::vector<std::string> blocks;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) {
      ADD_FAILURE() << "unterminated SSE event at " << pos << ": " << body.substr(pos);
      break;
    }
    blocks.push_back(body.substr(pos, end - pos));
    pos = end + 2;
  }
  return blocks;
}

// The JSON payloads of "data: ..." events; `done` is set when the last event is [DONE]. Fails the
// test on any framing error (every event is exactly "data: <payload>\n\n").
inline std::vector<std::string> sseEvents(const std::string& body, bool* done) {
  std::vector<std::string> events;
  *done = false;
  for (const std::string& ev : sseBlocks(body)) {
    if (ev.rfind("data: ", 0) != 0) {
      ADD_FAILURE() << "SSE event without 'data: ': " << ev;
      continue;
    }
    std::string payload = ev.substr(6);
    EXPECT_EQ(payload.find('\n'), std::string::npos) << payload;
    if (*done) ADD_FAILURE() << "events after [DONE]";
    if (payload == "[DONE]") {
      *done = true;
      continue;
    }
    events.push_back(payload);
  }
  return events;
}

// A parsed JSON document kept alive with its parser.
struct Json {
  explicit Json(const std::string& text) {
    auto err = parser.parse(text).get(root);
    if (err) ADD_FAILURE() << "invalid JSON: " << text;
  }
  simdjson::dom::parser parser;
  simdjson::dom::element root;
};

inline std::string str(simdjson::dom::element e) {
  std::string_view s;
  if (e.get_string().get(s)) return "<not a string>";
  return std::string(s);
}

}  // namespace garden::ivy::testing
