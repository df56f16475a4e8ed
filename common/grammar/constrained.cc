#include "common/grammar/constrained.h"

#include <algorithm>

namespace garden::grammar {

ConstrainedDecoder::ConstrainedDecoder(std::shared_ptr<const CompiledGrammar> grammar,
                                       ConstraintSpec spec)
    : grammar_(std::move(grammar)), spec_(std::move(spec)) {
  if (spec_.channel_token < 0) {
    matcher_ = std::make_unique<GrammarMatcher>(grammar_, spec_.end_tokens);
  }
}

bool ConstrainedDecoder::accept(int32_t token) {
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

}  // namespace garden::grammar
