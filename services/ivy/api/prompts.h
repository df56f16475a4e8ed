#pragma once
// PromptSet: the named prompt prefixes of an embedding model [TAG_PROMPTS], as sentence-transformers
// defines them in the checkpoint's config_sentence_transformers.json:
//   {"prompts": {"query": "Instruct: ...\nQuery:", "document": ""}, "default_prompt_name": null}
// A request selects one by name (`input_type` or `prompt_name` on /v1/embeddings); its text is
// prepended to every text input before tokenization, exactly as sentence-transformers'
// encode(prompt_name=...) does. `--query-prompt` / `--document-prompt` add or replace the
// "query" / "document" entries. Immutable after loading; safe to share between threads.

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace garden::ivy {

class PromptSet {
 public:
  // Parses the JSON text of a config_sentence_transformers.json (`name` for error messages).
  // A file without "prompts" gives an empty set. INVALID_ARGUMENT naming the file on bad JSON or
  // a prompt that is not a string.
  static Result<PromptSet> fromSentenceTransformersJson(std::string_view json,
                                                        std::string_view name);
  // Reads `<model_dir>/config_sentence_transformers.json`; a missing file gives an empty set.
  static Result<PromptSet> fromModelDir(const std::string& model_dir);

  void set(std::string name, std::string text) { prompts_[std::move(name)] = std::move(text); }

  // The prefix for a request. `name` empty: the default prompt (or "" without one). Otherwise the
  // named prompt; an unknown name is INVALID_ARGUMENT naming `field` and listing the known names.
  Result<std::string_view> select(std::string_view name, std::string_view field) const;

  const std::map<std::string, std::string, std::less<>>& prompts() const { return prompts_; }
  const std::string& defaultName() const { return default_name_; }

 private:
  std::map<std::string, std::string, std::less<>> prompts_;
  std::string default_name_;  // "" = none
};

}  // namespace garden::ivy
