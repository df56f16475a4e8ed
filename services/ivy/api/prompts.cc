#include "services/ivy/api/prompts.h"

#include <simdjson.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "services/ivy/api/errors.h"

namespace garden::ivy {

Result<PromptSet> PromptSet::fromSentenceTransformersJson(std::string_view json,
                                                          std::string_view name) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(json.data(), json.size(), true).get(root) || !root.is_object()) {
    return invalidArgument(std::string(name) + ": not a JSON object");
  }
  PromptSet set;
  simdjson::dom::element prompts;
  if (!root["prompts"].get(prompts) && !prompts.is_null()) {
    simdjson::dom::object obj;
    if (prompts.get(obj)) return invalidArgument(std::string(name) + ": `prompts` is not an object");
    for (auto [k, v] : obj) {
      std::string_view text;
      if (v.get(text)) {
        return invalidArgument(std::string(name) + ": prompt '" + std::string(k) +
                               "' is not a string");
      }
      set.prompts_[std::string(k)] = std::string(text);
    }
  }
  simdjson::dom::element def;
  if (!root["default_prompt_name"].get(def) && !def.is_null()) {
    std::string_view d;
    if (def.get(d)) {
      return invalidArgument(std::string(name) + ": `default_prompt_name` is not a string");
    }
    if (set.prompts_.find(d) == set.prompts_.end()) {
      return invalidArgument(std::string(name) + ": default_prompt_name '" + std::string(d) +
                             "' is not one of the prompts");
    }
    set.default_name_ = std::string(d);
  }
  return set;
}

Result<PromptSet> PromptSet::fromModelDir(const std::string& model_dir) {
  std::filesystem::path p = std::filesystem::path(model_dir) / "config_sentence_transformers.json";
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) return PromptSet{};
  std::ifstream in(p, std::ios::binary);
  if (!in) return notFound(p.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return fromSentenceTransformersJson(ss.str(), p.string());
}

Result<std::string_view> PromptSet::select(std::string_view name, std::string_view field) const {
  if (name.empty()) {
    if (default_name_.empty()) return std::string_view();
    return std::string_view(prompts_.find(default_name_)->second);
  }
  auto it = prompts_.find(name);
  if (it != prompts_.end()) return std::string_view(it->second);
  std::string known;
  for (const auto& [k, v] : prompts_) {
    known += known.empty() ? "" : ", ";
    known += "\"" + k + "\"";
  }
  return invalidField(field, "unknown prompt name \"" + std::string(name.substr(0, 64)) + "\" (" +
                                 (known.empty() ? std::string("this model has no prompts")
                                                : "known: " + known) +
                                 ")");
}

}  // namespace garden::ivy
