#include "common/grammar/constrained.h"

#include <algorithm>
#include <string_view>

#include "common/harmony_header.h"
#include "common/status.h"

namespace garden::grammar {

ConstrainedDecoder::ConstrainedDecoder(std::shared_ptr<const CompiledGrammar> grammar,
                                       ConstraintSpec spec)
    : grammar_(std::move(grammar)), spec_(std::move(spec)) {
  if (grammar_) {
    vocab_ = &grammar_->vocab();
  } else if (!spec_.tools.empty()) {
    vocab_ = &spec_.tools.front().grammar->vocab();
  }
  CHECK_MSG(vocab_ != nullptr, "a ConstrainedDecoder needs a grammar or a strict tool");
  for (const ToolGrammar& t : spec_.tools) CHECK(t.grammar->vocab().size() == vocab_->size());
  mask_words_ = (static_cast<size_t>(vocab_->size()) + 31) / 32;
  if (!spec_.tools.empty()) {  // [TAG_STRICT_TOOLS] the turn starts inside an assistant header
    beginHeader("assistant");
    for (int32_t t : spec_.turn_prefix) (void)acceptRouted(t);
    return;
  }
  if (spec_.channel_token < 0) {
    matcher_ = std::make_unique<GrammarMatcher>(grammar_, spec_.end_tokens);
  }
}

bool ConstrainedDecoder::accept(int32_t token) {
  if (!spec_.tools.empty()) return acceptRouted(token);
  if (matcher_) {
    const bool ok = matcher_->acceptToken(token);
    if (!ok || matcher_->terminated()) {
      if (ok) ++completed_;
      matcher_.reset();
      header_ = Header::kNone;
    }
    return ok;
  }
  if (spec_.channel_token < 0) return true;  // a plain grammar already ended
  if (token == spec_.channel_token) {
    header_ = spec_.channel_prefix.empty() ? Header::kRest : Header::kPrefix;
    prefix_pos_ = 0;
    return true;
  }
  switch (header_) {
    case Header::kNone:
      break;
    case Header::kPrefix:
      if (token == spec_.channel_prefix[prefix_pos_]) {
        if (++prefix_pos_ == spec_.channel_prefix.size()) header_ = Header::kRest;
      } else {
        header_ = Header::kNone;
      }
      break;
    case Header::kRest:
      if (token == spec_.message_token) {
        header_ = Header::kNone;
        matcher_ = std::make_unique<GrammarMatcher>(grammar_, spec_.end_tokens);
      } else if (std::find(spec_.end_tokens.begin(), spec_.end_tokens.end(), token) !=
                 spec_.end_tokens.end()) {
        header_ = Header::kNone;
      }
      break;
  }
  return true;
}

bool ConstrainedDecoder::isMessageStop(int32_t token) const {
  const HarmonyIds& h = spec_.harmony;
  return token == h.end || token == h.call || token == h.ret;
}

void ConstrainedDecoder::beginHeader(std::string_view role) {
  msg_ = Msg::kHeader;
  role_ = role;
  header_tokens_ = 0;
  header_text_.clear();
}

void ConstrainedDecoder::completeHeader() {
  msg_ = Msg::kBody;
  const HarmonyHeaderFields route = parseHarmonyHeaderFields(header_text_, role_);
  role_ = route.role;
  if (route.role != "assistant") return;  // ivy drops other roles' messages: free
  if (route.recipient) {
    const std::string_view name = harmonyFunctionName(*route.recipient);
    for (size_t i = 0; i < spec_.tools.size(); ++i) {
      if (spec_.tools[i].name != name) continue;
      matcher_ = std::make_unique<GrammarMatcher>(spec_.tools[i].grammar,
                                                  std::vector<int32_t>{spec_.harmony.call});
      active_tool_ = static_cast<int32_t>(i);
      return;
    }
  }
  // response_format: the final channel's answer (a final message sent to a recipient is not the
  // answer: ivy's output side routes it to a call or to reasoning).
  if (grammar_ && route.channel == "final" && (!route.recipient || *route.recipient == "all")) {
    matcher_ = std::make_unique<GrammarMatcher>(grammar_, spec_.end_tokens);
  }
}

// Follows ivy's StreamParser::pushImpl (lenient) state for state [TAG_STRICT_TOOLS].
bool ConstrainedDecoder::acceptRouted(int32_t token) {
  const HarmonyIds& h = spec_.harmony;
  bool ok = true;
  if (matcher_) {
    ok = matcher_->acceptToken(token);
    if (ok && !matcher_->terminated()) return true;
    matcher_.reset();
    active_tool_ = -1;
    if (ok) {  // an end token: the message is over
      ++completed_;
      msg_ = Msg::kBetween;
      return true;
    }
    msg_ = Msg::kBody;  // the token broke the grammar: the rest of this body is free
  }
  const bool special = token < 0 || token >= vocab_->size() || !vocab_->eligible(token);
  switch (msg_) {
    case Msg::kBetween:
      if (token == h.start) {
        beginHeader("");
      } else if (token == h.channel) {
        beginHeader("assistant");  // "<|channel|> without <|start|>": an assistant header
        header_text_ += "<|channel|>";
        ++header_tokens_;
      } else if (!special) {
        msg_ = Msg::kBody;  // text without a header: an assistant message without channel
        role_ = "assistant";
      }
      break;
    case Msg::kHeader:
      if (token == h.message) {
        completeHeader();
      } else if (isMessageStop(token)) {
        msg_ = Msg::kBetween;
      } else if (token == h.start) {
        beginHeader("");
      } else if (++header_tokens_ > kMaxHeaderTokens) {
        msg_ = Msg::kBody;  // ivy: the header's words become free content
        if (role_.empty()) role_ = "assistant";
      } else if (token == h.channel) {
        header_text_ += "<|channel|>";
      } else if (token == h.constrain) {
        header_text_ += "<|constrain|>";
      } else if (token == h.end_of_text) {
        header_text_ += "<|endoftext|>";
      } else if (!special) {
        header_text_ += vocab_->bytes(token);
      }  // reserved ids have no text in a header
      break;
    case Msg::kBody:
      if (isMessageStop(token) || token == h.end_of_text) {
        msg_ = Msg::kBetween;
      } else if (token == h.start) {
        beginHeader("");
      } else if (token == h.channel) {
        beginHeader(std::string(role_));  // a new message of the same role
        header_text_ += "<|channel|>";
        ++header_tokens_;
      }
      break;
  }
  return ok;
}

}  // namespace garden::grammar
