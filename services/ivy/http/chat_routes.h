#pragma once
// POST /v1/chat/completions and POST /v1/completions: the HTTP side of generation. A handler
// parses and renders on the io thread (api/chat.h, api/completions.h), starts one
// TulipClient::generate per choice and returns; the response is built as chunks arrive on the
// client's threads:
//   * stream: the SSE response (text/event-stream, chunked; http/response_stream.h) starts with
//     the first generated chunk, so an upstream failure before any output is still a plain HTTP
//     error (503/429/...). A failure after that is an SSE error event then [DONE]. The client
//     closing the connection cancels every GenerateStream of the request.
//   * not stream: one JSON body once every choice has finished.
// A stop string matched in the text cancels that choice's generation at once.
//
// Metrics: ivy_generate_requests_total{endpoint,outcome}, ivy_generate_completion_tokens_total,
// ivy_generate_prompt_tokens_total.
//
// Thread-safe. The client, tokenizer and registry must outlive the router.

#include <chrono>
#include <functional>
#include <memory>

#include "common/metrics/registry.h"
#include "services/ivy/api/model_spec.h"
#include "services/ivy/balance/tulip_client.h"
#include "services/ivy/http/router.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

struct ChatRoutesOptions {
  // Deadline of each Generate call; 0 = none (a streaming client that goes away cancels anyway).
  std::chrono::milliseconds generate_timeout{600000};
  // Tool-call ids (tests make them deterministic); default: random "call_..." ids.
  std::function<std::string(size_t index)> make_tool_call_id;
};

// `tokenizer` may be null (then both routes answer 400: no tokenizer configured). `spec` returns
// the served model (null until tulip is known: 503).
void registerChatRoutes(Router* router, TulipClient* client, const Tokenizer* tokenizer,
                        std::function<std::shared_ptr<const ModelSpec>()> spec,
                        metrics::Registry* registry, ChatRoutesOptions options = {});

}  // namespace garden::ivy
