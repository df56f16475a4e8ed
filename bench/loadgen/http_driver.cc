// The HTTP driver (ivy): one thread and one keep-alive connection per closed-loop client.
// Embeddings: POST /v1/embeddings. Chat: POST /v1/chat/completions with stream=true, timed per
// server-sent event (time to first token, inter-token latency). See driver.h.
#include <simdjson.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <thread>

#include "bench/loadgen/driver.h"
#include "bench/loadgen/http_client.h"
#include "common/json_writer.h"

namespace garden::bench {

using Clock = std::chrono::steady_clock;

std::string embeddingsBody(const std::string& model, const Payload& p,
                           const std::string& encoding_format) {
  JsonWriter w;
  w.beginObject().field("model", model).key("input").beginArray();
  for (auto& s : p.token_inputs) w.intArray(s);
  for (auto& t : p.text_inputs) w.value(t);
  w.endArray().field("encoding_format", encoding_format).endObject();
  return w.take();
}

std::string chatBody(const std::string& model, const std::string& prompt, uint32_t max_tokens,
                     bool ignore_eos, const std::string& response_format, bool skip_reasoning,
                     double temperature, const std::string& response_schema) {
  JsonWriter w;
  w.beginObject().field("model", model).key("messages").beginArray();
  w.beginObject().field("role", "user").field("content", prompt).endObject();
  w.endArray().field("stream", true).field("max_tokens", max_tokens);
  if (ignore_eos) w.field("ignore_eos", true);
  if (temperature >= 0) w.field("temperature", temperature);
  if (skip_reasoning) w.field("skip_reasoning", true);
  if (!response_format.empty()) {
    w.key("response_format").beginObject().field("type", response_format);
    if (response_format == "json_schema") {
      w.key("json_schema").beginObject().field("name", "bench").key("schema").raw(response_schema);
      w.endObject();
    }
    w.endObject();
  }
  w.key("stream_options").beginObject().field("include_usage", true).endObject();
  w.endObject();
  return w.take();
}

namespace {

// Checks a /v1/embeddings reply: data has `expect` entries; returns usage.prompt_tokens.
Result<uint64_t> checkEmbeddings(simdjson::dom::parser& parser, const std::string& body,
                                 size_t expect) {
  simdjson::dom::element doc;
  if (parser.parse(body).get(doc)) return dataLoss("response is not JSON");
  simdjson::dom::array data;
  if (doc["data"].get_array().get(data)) return dataLoss("response has no data array");
  if (data.size() != expect)
    return dataLoss("expected " + std::to_string(expect) + " embeddings, got " +
                    std::to_string(data.size()));
  uint64_t tokens = 0;
  if (doc["usage"]["prompt_tokens"].get_uint64().get(tokens)) tokens = 0;
  return tokens;
}

// What one chat SSE event carries: generated text (content, reasoning or tool calls), a
// finish_reason, and the usage counts (the include_usage chunk).
struct ChatChunk {
  bool has_token = false;
  std::string finish_reason;  // empty: none in this event
  uint64_t prompt_tokens = 0, completion_tokens = 0;
};
ChatChunk parseChatChunk(simdjson::dom::parser& parser, std::string_view data) {
  ChatChunk c;
  simdjson::dom::element doc;
  if (parser.parse(data.data(), data.size()).get(doc)) return c;
  simdjson::dom::array choices;
  if (!doc["choices"].get_array().get(choices)) {
    for (auto ch : choices) {
      std::string_view finish;
      if (!ch["finish_reason"].get_string().get(finish)) c.finish_reason = std::string(finish);
      simdjson::dom::object delta;
      if (ch["delta"].get_object().get(delta)) continue;
      for (const char* k : {"content", "reasoning_content", "tool_calls"}) {
        simdjson::dom::element v;
        if (delta[k].get(v)) continue;
        if (v.is_string() ? !std::string_view(v.get_string().value_unsafe()).empty() : !v.is_null())
          c.has_token = true;
      }
    }
  }
  uint64_t n = 0;
  if (!doc["usage"]["completion_tokens"].get_uint64().get(n)) c.completion_tokens = n;
  if (!doc["usage"]["prompt_tokens"].get_uint64().get(n)) c.prompt_tokens = n;
  return c;
}

class HttpDriver : public Driver {
 public:
  explicit HttpDriver(const DriverConfig& cfg) : cfg_(cfg) {}

  Status init(std::vector<Payload> pool) {
    ASSIGN_OR_RETURN(auto hp, parseHostPort(cfg_.endpoint));
    host_ = hp.first;
    port_ = hp.second;
    if (pool.empty()) return invalidArgument("empty request pool");
    for (auto& p : pool) {
      if (cfg_.mode == Mode::kEmbed) {
        requests_.push_back(buildPost(cfg_.endpoint, "/v1/embeddings",
                                      embeddingsBody(cfg_.model, p, cfg_.encoding_format)));
      } else if (cfg_.mode == Mode::kChat) {
        if (p.text_inputs.size() != 1) return invalidArgument("a chat payload is one prompt");
        requests_.push_back(
            buildPost(cfg_.endpoint, "/v1/chat/completions",
                      chatBody(cfg_.model, p.text_inputs[0], cfg_.max_tokens, cfg_.ignore_eos,
                               cfg_.response_format, cfg_.skip_reasoning, cfg_.temperature,
                               cfg_.response_schema),
                      /*accept_sse=*/true));
      } else {
        return unimplemented("scoring over HTTP is not supported; use --protocol grpc");
      }
      sizes_.push_back(p.size());
      tokens_.push_back(p.tokens);
    }
    for (int i = 0; i < cfg_.concurrency; ++i)
      conns_.push_back(std::make_unique<Connection>(host_, port_, cfg_.timeout));
    return okStatus();
  }

  Result<PhaseResult> run(const PhaseSpec& phase) override {
    PhaseGate gate(phase);
    std::vector<Recorder> recs(static_cast<size_t>(cfg_.concurrency));
    std::vector<Clock::time_point> ends(recs.size());
    auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (size_t c = 0; c < recs.size(); ++c) {
      threads.emplace_back([&, c] {
        simdjson::dom::parser parser;
        while (gate.claim()) {
          // One cursor over the pool for all clients and phases: the measured phase does not
          // replay the warm-up's payloads, so a pool at least warm-up + count long never repeats
          // a chat prompt (no prefix-cache hits between requests beyond what prompts share).
          size_t i = cursor_.fetch_add(1, std::memory_order_relaxed) % requests_.size();
          if (cfg_.mode == Mode::kChat) {
            chatOnce(*conns_[c], parser, i, recs[c]);
          } else {
            embedOnce(*conns_[c], parser, i, recs[c]);
          }
        }
        ends[c] = Clock::now();
      });
    }
    for (auto& t : threads) t.join();
    PhaseResult r;
    auto last = t0;
    for (auto& e : ends) last = std::max(last, e);
    r.wall_s = std::chrono::duration<double>(last - t0).count();
    for (auto& rec : recs) r.rec.merge(rec);
    return r;
  }

 private:
  static std::string httpStatusName(int code) { return "HTTP_" + std::to_string(code); }

  void embedOnce(Connection& conn, simdjson::dom::parser& parser, size_t i, Recorder& rec) {
    ResponseReader reader;
    auto t0 = Clock::now();
    Status s = conn.roundTrip(requests_[i], reader);
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!s.isOk()) {
      rec.failure(std::string(statusCodeName(s.code())), s.message());
      return;
    }
    if (reader.status() != 200) {
      rec.failure(httpStatusName(reader.status()), reader.body().substr(0, 300));
      return;
    }
    auto tokens = checkEmbeddings(parser, reader.body(), sizes_[i]);
    if (!tokens.isOk()) {
      rec.failure("BAD_RESPONSE", tokens.status().message());
      return;
    }
    rec.success(ms);
    rec.items += sizes_[i];
    rec.tokens += *tokens ? *tokens : tokens_[i];
    recordGatewayTimes(reader.headers(), ms, rec);
  }

  // ivy's x-garden-*-us headers [TAG_TIMING_HEADERS], when all are there.
  static void recordGatewayTimes(const std::map<std::string, std::string>& h, double ms,
                                 Recorder& rec) {
    double v[5];
    const char* names[5] = {"x-garden-tokenize-us", "x-garden-upstream-us", "x-garden-total-us",
                            "x-garden-queue-us", "x-garden-inference-us"};
    for (int k = 0; k < 5; ++k) {
      auto it = h.find(names[k]);
      if (it == h.end()) return;
      v[k] = std::strtod(it->second.c_str(), nullptr);
    }
    rec.gw_tokenize_us.push_back(v[0]);
    rec.gw_upstream_us.push_back(v[1]);
    rec.gw_total_us.push_back(v[2]);
    rec.gw_own_us.push_back(v[2] - v[1]);
    rec.gw_tulip_queue_us.push_back(v[3]);
    rec.gw_tulip_inference_us.push_back(v[4]);
    rec.gw_client_us.push_back(ms * 1000.0 - v[2]);
  }

  void chatOnce(Connection& conn, simdjson::dom::parser& parser, size_t i, Recorder& rec) {
    auto t0 = Clock::now();
    Clock::time_point last_token{};
    bool first = true, saw_done = false;
    uint64_t events_with_tokens = 0, usage_tokens = 0, usage_prompt = 0;
    std::string finish;
    std::vector<double> itl;
    double ttft = 0;
    std::string error_body;
    SseParser sse([&](std::string_view data) {
      if (data == "[DONE]") {
        saw_done = true;
        return;
      }
      ChatChunk c = parseChatChunk(parser, data);
      if (c.completion_tokens) usage_tokens = c.completion_tokens;
      if (c.prompt_tokens) usage_prompt = c.prompt_tokens;
      if (!c.finish_reason.empty()) finish = std::move(c.finish_reason);
      if (!c.has_token) return;
      auto now = Clock::now();
      ++events_with_tokens;
      if (first) {
        ttft = std::chrono::duration<double, std::milli>(now - t0).count();
        first = false;
      } else {
        itl.push_back(std::chrono::duration<double, std::milli>(now - last_token).count());
      }
      last_token = now;
    });
    ResponseReader* rp = nullptr;
    ResponseReader reader([&](std::string_view piece) {
      if (rp->status() == 200) {
        sse.feed(piece);
      } else if (error_body.size() < 300) {
        error_body.append(piece.substr(0, 300));
      }
    });
    rp = &reader;
    Status s = conn.roundTrip(requests_[i], reader);
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!s.isOk()) {
      rec.failure(std::string(statusCodeName(s.code())), s.message());
      return;
    }
    if (reader.status() != 200) {
      rec.failure(httpStatusName(reader.status()), error_body);
      return;
    }
    if (!saw_done || events_with_tokens == 0) {
      rec.failure("BAD_RESPONSE",
                  saw_done ? "stream had no tokens" : "stream ended without [DONE]");
      return;
    }
    rec.success(ms);
    rec.items += 1;
    rec.tokens += usage_prompt ? usage_prompt : tokens_[i];
    rec.ttft_ms.push_back(ttft);
    rec.itl_ms.insert(rec.itl_ms.end(), itl.begin(), itl.end());
    const uint64_t out = usage_tokens ? usage_tokens : events_with_tokens;
    rec.output_tokens += out;
    // [TAG_CHAT_TPOT] Time per output token after the first: immune to how many tokens ivy
    // packs into one SSE event (the ITL gaps are per event). Undefined, so not recorded, when
    // the whole answer came in one event.
    if (out >= 2 && events_with_tokens >= 2)
      rec.tpot_ms.push_back((ms - ttft) / static_cast<double>(out - 1));
    ++rec.finish_reasons[finish.empty() ? "none" : finish];
  }

  DriverConfig cfg_;
  std::string host_;
  int port_ = 0;
  std::vector<std::string> requests_;
  std::vector<size_t> sizes_;
  std::vector<uint64_t> tokens_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::atomic<size_t> cursor_{0};
};

}  // namespace

Result<std::unique_ptr<Driver>> makeHttpDriver(const DriverConfig& config,
                                               std::vector<Payload> pool) {
  auto d = std::make_unique<HttpDriver>(config);
  RETURN_IF_ERROR(d->init(std::move(pool)));
  return std::unique_ptr<Driver>(std::move(d));
}

namespace {
Result<std::string> getJson(const std::string& endpoint, const std::string& method,
                            const std::string& path, const std::string& body,
                            std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(auto hp, parseHostPort(endpoint));
  Connection conn(hp.first, hp.second, timeout);
  std::string req = method == "GET" ? "GET " + path + " HTTP/1.1\r\nHost: " + endpoint + "\r\n\r\n"
                                    : buildPost(endpoint, path, body);
  ResponseReader reader;
  RETURN_IF_ERROR(conn.roundTrip(req, reader));
  if (reader.status() != 200)
    return unavailable(method + " " + path + " answered " + std::to_string(reader.status()) + ": " +
                       reader.body().substr(0, 300));
  return reader.body();
}
}  // namespace

Result<ServedModel> httpModelInfo(const std::string& endpoint, std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(std::string body, getJson(endpoint, "GET", "/v1/models", "", timeout));
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(body).get(doc)) return dataLoss("/v1/models is not JSON");
  std::string_view id;
  if (doc["data"].at(0)["id"].get_string().get(id)) return dataLoss("/v1/models has no data[0].id");
  ServedModel m;
  m.name = std::string(id);
  return m;
}

Result<uint64_t> httpCountChatTokens(const std::string& endpoint, const std::string& model,
                                     const std::string& text, std::chrono::milliseconds timeout) {
  JsonWriter w;
  w.beginObject().field("model", model).key("messages").beginArray();
  w.beginObject().field("role", "user").field("content", text).endObject();
  w.endArray().endObject();
  ASSIGN_OR_RETURN(std::string body, getJson(endpoint, "POST", "/tokenize", w.take(), timeout));
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(body).get(doc)) return dataLoss("/tokenize reply is not JSON");
  uint64_t count = 0;
  if (doc["count"].get_uint64().get(count) || count == 0)
    return dataLoss("/tokenize reply has no count");
  return count;
}

Result<uint64_t> httpCountTokens(const std::string& endpoint, const std::string& model,
                                 const std::string& text, std::chrono::milliseconds timeout) {
  Payload p;
  p.text_inputs.push_back(text);
  ASSIGN_OR_RETURN(std::string body, getJson(endpoint, "POST", "/v1/embeddings",
                                             embeddingsBody(model, p, "base64"), timeout));
  simdjson::dom::parser parser;
  ASSIGN_OR_RETURN(uint64_t tokens, checkEmbeddings(parser, body, 1));
  if (tokens == 0) return dataLoss("/v1/embeddings reported no usage.prompt_tokens");
  return tokens;
}

}  // namespace garden::bench
