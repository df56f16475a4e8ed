#pragma once
// POST /tokenize and POST /detokenize (vLLM's shapes):
//   /tokenize   {"model"?, "text"}                       -> {"count", "max_model_len", "tokens"}
//               {"model"?, "messages", "tools"?, "reasoning_effort"?, "tool_choice"?}
//                 -> the Harmony completion prompt's ids (ending in <|start|>assistant); needs a
//                    Harmony (o200k_harmony) tokenizer
//   /detokenize {"model"?, "tokens": [ids]}               -> {"prompt"}
// Text never yields special-token ids; only the chat renderer inserts them. Errors are the
// OpenAI-shaped 4xx of errorResponse() with the field named. Handlers are thread-safe.

#include <functional>
#include <memory>

#include "services/ivy/api/model_spec.h"
#include "services/ivy/http/router.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

// `tokenizer` may be null (then both routes answer 400: no tokenizer configured). `spec` returns
// the served model (null until tulip is known); a request naming another model gets 404.
void registerTokenizeRoutes(Router* router, const Tokenizer* tokenizer,
                            std::function<std::shared_ptr<const ModelSpec>()> spec);

}  // namespace garden::ivy
