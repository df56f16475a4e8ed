#pragma once
// POST /v1/chat/completions, POST /v1/completions and POST /v1/responses: the generation routes'
// steps of ivy's request pipeline (http/pipeline.h; IvyService registers the routes and runs the
// pipeline, so auth, admission, deadlines, the model-kind check, limits and the timing headers are
// the same as for every model route).
//   prepare (io thread): parse within the limits and render / tokenize the prompt (api/chat.h,
//     api/completions.h, api/responses.h: a Responses request is rendered as chat; its
//     previous_response_id is looked up in the routes' ResponsesStore); the request holds prompt
//     tokens + max_tokens of every choice against --max-inflight-tokens while it runs.
//   send: one TulipClient::generate per choice, each with the request's deadline (the remaining
//     --generate-timeout-ms, or less with x-request-timeout); the response is built as chunks
//     arrive on the client's threads:
//   * stream: the SSE response (text/event-stream, chunked; http/response_stream.h) starts with
//     the first generated chunk, so an upstream failure before any output (a deadline included:
//     504) is still a plain HTTP error (503/429/504...). A failure after that is an SSE error
//     event then [DONE] (a deadline: code "timeout"). The client closing the connection cancels
//     every GenerateStream of the request. The head carries x-garden-tokenize-us only.
//   * not stream: one JSON body once every choice has finished, with every timing header
//     (x-garden-queue-us: tulip's arrival → first scheduled; x-garden-inference-us: first
//     scheduled → finished; the largest over the choices).
// A stop string matched in the text cancels that choice's generation at once. The admission is
// released when the last choice ends, the stream ends or the client goes away.
//
// Metrics: ivy_generate_requests_total{endpoint,outcome}, ivy_generate_completion_tokens_total,
// ivy_generate_prompt_tokens_total.
//
// Thread-safe. The client, tokenizer and registry must outlive the object.

#include <functional>
#include <memory>
#include <string>

#include "common/metrics/registry.h"
#include "common/status.h"
#include "services/ivy/api/limits.h"
#include "services/ivy/api/model_spec.h"
#include "services/ivy/api/responses.h"
#include "services/ivy/balance/tulip_client.h"
#include "services/ivy/http/message.h"
#include "services/ivy/http/pipeline.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

class GenerateRoutes {
 public:
  // `tokenizer` may be null (then both routes answer 400: no tokenizer configured).
  // `make_tool_call_id` null: random "call_..." ids. `responses_store_max`: stored responses
  // (previous_response_id) kept, least recently used evicted first.
  GenerateRoutes(TulipClient* client, const Tokenizer* tokenizer, metrics::Registry* registry,
                 std::function<std::string(size_t index)> make_tool_call_id,
                 size_t responses_store_max = 1024);
  ~GenerateRoutes();

  Result<PreparedCall> prepareChat(const HttpRequest& request,
                                   const std::shared_ptr<const ModelSpec>& spec,
                                   const RequestLimits& limits) const;
  Result<PreparedCall> prepareCompletions(const HttpRequest& request,
                                          const std::shared_ptr<const ModelSpec>& spec,
                                          const RequestLimits& limits) const;

  Result<PreparedCall> prepareResponses(const HttpRequest& request,
                                        const std::shared_ptr<const ModelSpec>& spec,
                                        const RequestLimits& limits) const;
  ResponsesStore& responsesStore() const { return *responses_store_; }

  struct Metrics;

 private:
  TulipClient* client_;
  const Tokenizer* tokenizer_;
  std::function<std::string(size_t index)> make_tool_call_id_;
  // Both shared with the jobs in flight.
  std::shared_ptr<Metrics> metrics_;
  std::shared_ptr<ResponsesStore> responses_store_;
};

}  // namespace garden::ivy
