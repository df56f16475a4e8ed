#include "services/ivy/api/model_spec.h"

#include "services/ivy/api/errors.h"

namespace garden::ivy {
namespace {

std::string kindPhrase(const ModelSpec& spec) {
  if (spec.kind == "llm") return "a generative (llm) model";
  if (spec.kind == "embedding") {
    return spec.has_score_head ? "a reranker (classification-head) model" : "an embedding model";
  }
  return "a model of unknown kind '" + spec.kind + "'";
}

}  // namespace

Status checkModelKind(const ModelSpec& spec, ModelUse use, std::string_view route) {
  const bool ok = use == ModelUse::kGenerate ? spec.kind == "llm" : spec.kind == "embedding";
  if (ok) return okStatus();
  std::string_view need = use == ModelUse::kGenerate ? "a generative (llm) model"
                          : use == ModelUse::kEmbed  ? "an embedding model"
                                                     : "an embedding or reranker model";
  return invalidField("model", "'" + spec.served_name + "' is " + kindPhrase(spec) + "; " +
                                   std::string(route) + " needs " + std::string(need));
}

}  // namespace garden::ivy
