#include "services/ivy/api/chat.h"

#include <algorithm>
#include <limits>
#include <map>

#include "common/json_writer.h"
#include "services/ivy/api/errors.h"
#include "services/ivy/api/response_format.h"
#include "services/ivy/harmony/encode.h"
#include "services/ivy/harmony/render.h"
#include "services/ivy/harmony/tokens.h"

namespace garden::ivy {
namespace {

using simdjson::dom::element;

struct AssembledCall {
  std::string id;
  std::string name;
  std::string arguments;
};

// Tool-call fragments (in stream order) -> whole calls by index.
std::vector<AssembledCall> assembleCalls(const std::vector<harmony::ToolCallDelta>& deltas) {
  std::vector<AssembledCall> calls;
  std::map<size_t, size_t> slot;  // index -> position in calls
  for (const auto& d : deltas) {
    auto [it, inserted] = slot.emplace(d.index, calls.size());
    if (inserted) calls.emplace_back();
    AssembledCall& c = calls[it->second];
    if (d.id) c.id = *d.id;
    if (d.name) c.name = *d.name;
    c.arguments += d.arguments;
  }
  return calls;
}

}  // namespace

namespace {
// Appends the "# Response Formats" section to the developer message (made if there is none; it
// goes right after the system message).
void addResponseFormatHint(harmony::HarmonyChatRequest* h, const std::string& hint) {
  for (auto& m : h->messages) {
    if (m.author.role != harmony::Role::kDeveloper) continue;
    for (auto& c : m.content) {
      if (c.kind == harmony::Content::Kind::kDeveloper) {
        c.developer.response_formats = hint;
        return;
      }
    }
  }
  harmony::DeveloperContent dev;
  dev.response_formats = hint;
  harmony::Message m;
  m.author.role = harmony::Role::kDeveloper;
  m.content.push_back(harmony::Content::fromDeveloper(std::move(dev)));
  const size_t at = !h->messages.empty() && h->messages[0].author.role == harmony::Role::kSystem;
  h->messages.insert(h->messages.begin() + static_cast<std::ptrdiff_t>(at), std::move(m));
}
}  // namespace

Result<ChatRequest> parseChatRequest(std::string_view body, const ModelSpec& spec,
                                     const Tokenizer* tokenizer, const RequestLimits& limits,
                                     const harmony::ChatRenderOptions& render_options) {
  thread_local simdjson::dom::parser parser;
  ASSIGN_OR_RETURN(element root, parseGenerativeRequestBody(body, spec, "messages", limits, parser));
  if (tokenizer == nullptr) {
    return failedPrecondition(
        "this server has no tokenizer configured; chat needs the model's Harmony tokenizer "
        "(start ivy with --tokenizer)");
  }
  if (Status st = harmony::checkHarmonyTokenizer(*tokenizer); !st.isOk()) {
    return failedPrecondition(
        "chat needs a Harmony (o200k_harmony) tokenizer; this server's is "
        "not one: " +
        st.message());
  }
  ChatRequest req;
  RETURN_IF_ERROR(parseSamplingFields(root, ApiKind::kChat, &req.sampling));
  RETURN_IF_ERROR(checkLogitBias(req.sampling, spec.vocab_size));
  ASSIGN_OR_RETURN(req.harmony, harmony::harmonyRequestFromOpenAiJson(body, render_options));
  if (req.harmony.tool_choice == harmony::ToolChoice::kRequired &&
      req.harmony.function_names.size() == 1) {
    // "required" with one tool is that tool: force the whole header, not just the namespace.
    req.harmony.tool_choice = harmony::ToolChoice::kNamed;
    req.harmony.tool_choice_name = req.harmony.function_names[0];
  }
  // [TAG_STRICT_TOOLS] a strict tool's schema must compile, even under tool_choice "none"
  // (OpenAI validates the tools either way); only then are its calls constrained.
  for (const harmony::StrictFunction& f : req.harmony.strict_functions) {
    Result<std::string> g = toolParametersGrammar(f.parameters_json);
    if (!g.isOk()) {
      return invalidField("tools[" + std::to_string(f.index) + "].function.parameters",
                          g.status().message());
    }
    if (req.harmony.tool_choice != harmony::ToolChoice::kNone) {
      req.strict_tools.push_back(ChatRequest::StrictTool{f.name, std::move(g).value()});
    }
  }
  if (req.sampling.structured) {  // [TAG_TOKEN_MASK] tell the model, as OpenAI's format does
    const std::string hint = responseFormatInstructions(*req.sampling.structured);
    if (!hint.empty()) addResponseFormatHint(&req.harmony, hint);
    tokenizer->encode("final", &req.final_channel_ids);
  }
  ASSIGN_OR_RETURN(std::vector<harmony::Segment> segments,
                   harmony::renderConversationForCompletion(
                       req.harmony.messages, harmony::Role::kAssistant, render_options.render));
  harmony::encodeSegments(segments, *tokenizer, &req.prompt_ids);
  std::vector<harmony::Segment> prefix = harmony::toolChoicePrefix(req.harmony);
  // Garden extension `skip_reasoning` [TAG_TOKEN_MASK]: the assistant turn starts in the final
  // channel (no analysis); with response_format the JSON starts at the first generated token.
  bool skip_reasoning = false;
  if (simdjson::dom::element sr; root["skip_reasoning"].get(sr) == simdjson::SUCCESS &&
                                 !sr.is_null()) {
    if (sr.get_bool().get(skip_reasoning) != simdjson::SUCCESS) {
      return invalidField("skip_reasoning", "must be a boolean");
    }
  }
  if (skip_reasoning) {
    if (!prefix.empty()) {
      return invalidField("skip_reasoning", "cannot be combined with a forced tool_choice");
    }
    harmony::SegmentSink sink;
    sink.special(harmony::kChannel);
    sink.text("final");
    sink.special(harmony::kMessage);
    prefix = sink.take();
    req.final_prefix_forced = true;
  }
  req.forced_prefix_ids = harmony::encodeSegments(prefix, *tokenizer);
  req.prompt_ids.insert(req.prompt_ids.end(), req.forced_prefix_ids.begin(),
                        req.forced_prefix_ids.end());
  RETURN_IF_ERROR(checkPromptTokens(req.prompt_ids.size(), "messages", limits, spec));
  RETURN_IF_ERROR(checkRequestTokens(req.prompt_ids.size(), "messages", limits));
  ASSIGN_OR_RETURN(req.max_tokens, resolveMaxTokens(req.sampling, req.prompt_ids.size(),
                                                    spec.max_seq_len, 0, "messages"));
  for (harmony::HarmonyTokenId id : harmony::kAssistantStopTokens) req.stop_token_ids.push_back(id);
  if (!req.sampling.ignore_eos) {
    for (int32_t id : spec.eos_token_ids) {
      if (std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), id) ==
          req.stop_token_ids.end())
        req.stop_token_ids.push_back(id);
    }
  }
  return req;
}

harmony::ChatOutputOptions chatOutputOptions(
    const ChatRequest& request, const std::function<std::string(size_t)>& make_tool_call_id) {
  harmony::ChatOutputOptions o;
  o.function_names = request.harmony.function_names;
  o.allow_tool_calls = request.harmony.tool_choice != harmony::ToolChoice::kNone;
  o.make_tool_call_id =
      make_tool_call_id ? make_tool_call_id : [](size_t) { return randomId("call_"); };
  return o;
}

ChatCompletionOutput::ChatCompletionOutput(const Tokenizer& tokenizer, const ChatRequest& request,
                                           ResponseIdentity identity, size_t choice_index,
                                           bool ends_stream)
    : identity_(std::move(identity)),
      tokenizer_(tokenizer),
      index_(choice_index),
      ends_stream_(ends_stream),
      logprobs_(request.sampling.logprobs),
      stream_(request.sampling.stream),
      include_usage_(request.sampling.include_usage),
      prompt_len_(request.prompt_ids.size()),
      decoder_(tokenizer, harmony::ParserOptions{},
               chatOutputOptions(request, identity_.make_tool_call_id)),
      stop_(request.sampling.stop) {
  if (stream_) {
    std::string json;
    JsonWriter j(&json);
    j.beginObject();
    writeChunkHead(j);
    j.key("choices").beginArray().beginObject().field("index", index_);
    j.key("delta").beginObject().field("role", "assistant").field("content", "").endObject();
    j.nullField("logprobs").nullField("finish_reason").endObject().endArray();
    if (include_usage_) j.nullField("usage");
    j.endObject();
    appendSseEvent(&sse_, json);
  }
  // The forced tool_choice prefix is part of the assistant turn: replay it so the call it opens
  // is in the output exactly as if the model had written it.
  for (TokenId id : request.forced_prefix_ids) emit(decoder_.push(id));
}

void ChatCompletionOutput::writeChunkHead(JsonWriter& w) const {
  w.field("id", identity_.id)
      .field("object", "chat.completion.chunk")
      .field("created", identity_.created)
      .field("model", identity_.model);
}

void ChatCompletionOutput::writeLogprobs(JsonWriter& w, bool all) {
  if (!logprobs_) {
    w.nullField("logprobs");
    return;
  }
  w.key("logprobs").beginObject().key("content").beginArray();
  for (size_t i = all ? 0 : lp_streamed_; i < lp_all_.size(); ++i) w.raw(lp_all_[i]);
  w.endArray().endObject();
  if (!all) lp_streamed_ = lp_all_.size();
}

void ChatCompletionOutput::emit(harmony::ChatDelta delta) {
  if (stop_.active() && !delta.content.empty()) {
    bool matched = false;
    delta.content = stop_.push(delta.content, &matched);
  }
  if (delta.empty()) return;
  total_.append(delta);
  if (!stream_) return;
  std::string json;
  JsonWriter w(&json);
  w.beginObject();
  writeChunkHead(w);
  w.key("choices").beginArray().beginObject().field("index", index_);
  w.key("delta").beginObject();
  if (!delta.reasoning_content.empty()) w.field("reasoning_content", delta.reasoning_content);
  if (!delta.content.empty()) w.field("content", delta.content);
  if (!delta.tool_calls.empty()) {
    w.key("tool_calls").beginArray();
    for (const auto& c : delta.tool_calls) {
      w.beginObject().field("index", static_cast<uint64_t>(c.index));
      if (c.id) w.field("id", *c.id).field("type", "function");
      w.key("function").beginObject();
      if (c.name) w.field("name", *c.name);
      w.field("arguments", c.arguments).endObject();
      w.endObject();
    }
    w.endArray();
  }
  w.endObject();
  writeLogprobs(w, false);
  w.nullField("finish_reason").endObject().endArray();
  if (include_usage_) w.nullField("usage");
  w.endObject();
  appendSseEvent(&sse_, json);
}

bool ChatCompletionOutput::onTokens(size_t, std::span<const int32_t> ids,
                                    std::span<const llm::LlmTokenLogprobs> logprobs) {
  if (finished_) return false;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    ++generated_;
    if (logprobs_) {
      // tulip sends one entry per token when asked; a missing one reads as unknown (-9999).
      llm::LlmTokenLogprobs none;
      none.logprob = -std::numeric_limits<float>::infinity();
      none.num_top = 0;
      lp_all_.push_back(
          chatLogprobEntry(tokenizer_, id, i < logprobs.size() ? logprobs[i] : none));
    }
    emit(decoder_.push(id));
    if (stop_.matched()) {
      finish(harmony::FinishReason::kStop, ChoiceEnd{});
      return false;
    }
  }
  return true;
}

void ChatCompletionOutput::finishChoice(size_t, const ChoiceEnd& end) {
  if (finished_) return;
  emit(decoder_.finish());
  if (stop_.matched()) return finish(harmony::FinishReason::kStop, end);
  if (stop_.active()) {
    harmony::ChatDelta tail;
    tail.content = stop_.flush();
    if (!tail.content.empty()) {
      total_.append(tail);
      if (stream_) {
        // Not through emit(): the matcher already ruled this text out as a stop string.
        std::string json;
        JsonWriter w(&json);
        w.beginObject();
        writeChunkHead(w);
        w.key("choices").beginArray().beginObject().field("index", index_);
        w.key("delta").beginObject().field("content", tail.content).endObject();
        writeLogprobs(w, false);
        w.nullField("finish_reason").endObject().endArray();
        if (include_usage_) w.nullField("usage");
        w.endObject();
        appendSseEvent(&sse_, json);
      }
    }
  }
  finish(decoder_.finishReason(end.hit_length), end);
}

void ChatCompletionOutput::finish(harmony::FinishReason reason, const ChoiceEnd& end) {
  finished_ = true;
  finish_reason_ = reason;
  usage_.prompt_tokens = end.prompt_tokens != 0 ? end.prompt_tokens : prompt_len_;
  usage_.completion_tokens = end.completion_tokens != 0 ? end.completion_tokens : generated_;
  usage_.cached_tokens = end.cached_prompt_tokens;
  if (!stream_) return;
  std::string json;
  JsonWriter w(&json);
  w.beginObject();
  writeChunkHead(w);
  w.key("choices").beginArray().beginObject().field("index", index_);
  w.key("delta").beginObject().endObject();
  writeLogprobs(w, false);
  w.field("finish_reason", harmony::finishReasonName(reason));
  w.endObject().endArray();
  if (include_usage_) w.nullField("usage");
  w.endObject();
  appendSseEvent(&sse_, json);
  if (!ends_stream_) return;
  if (include_usage_) {
    json.clear();
    JsonWriter u(&json);
    u.beginObject();
    writeChunkHead(u);
    u.key("choices").beginArray().endArray();
    writeUsage(u, usage_);
    u.endObject();
    appendSseEvent(&sse_, json);
  }
  sse_.append(kSseDone);
}

std::string ChatCompletionOutput::takeSse() {
  std::string out;
  out.swap(sse_);
  return out;
}

std::string ChatCompletionOutput::responseJson() const {
  JsonWriter w;
  w.beginObject()
      .field("id", identity_.id)
      .field("object", "chat.completion")
      .field("created", identity_.created)
      .field("model", identity_.model);
  w.key("choices").beginArray();
  writeChoice(w);
  w.endArray();
  writeUsage(w, usage_);
  w.endObject();
  return w.take();
}

void ChatCompletionOutput::writeChoice(JsonWriter& w) const {
  w.beginObject().field("index", index_);
  w.key("message").beginObject().field("role", "assistant");
  std::vector<AssembledCall> calls = assembleCalls(total_.tool_calls);
  if (total_.content.empty() && !calls.empty()) {
    w.nullField("content");
  } else {
    w.field("content", total_.content);
  }
  if (!total_.reasoning_content.empty()) w.field("reasoning_content", total_.reasoning_content);
  if (!calls.empty()) {
    w.key("tool_calls").beginArray();
    for (const auto& c : calls) {
      w.beginObject().field("id", c.id).field("type", "function");
      w.key("function").beginObject().field("name", c.name).field("arguments", c.arguments);
      w.endObject().endObject();
    }
    w.endArray();
  }
  w.endObject();
  if (logprobs_) {
    w.key("logprobs").beginObject().key("content").beginArray();
    for (const std::string& e : lp_all_) w.raw(e);
    w.endArray().endObject();
  } else {
    w.nullField("logprobs");
  }
  w.field("finish_reason", harmony::finishReasonName(finish_reason_));
  w.endObject();
}

}  // namespace garden::ivy
