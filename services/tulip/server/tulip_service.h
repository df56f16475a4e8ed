#pragma once
// TulipService: the garden.v1.Tulip gRPC service (callback API). Embed/Score requests are
// validated and handed to the EmbedScheduler; the reactor finishes when the scheduler calls back,
// or cancels the job when the caller goes away. Generate streams tokens from the LlmScheduler:
// one write in flight per stream, tokens that arrive meanwhile are coalesced into the next chunk
// (so a slow reader costs at most its own max_tokens ids), and a caller that goes away cancels
// the sequence, which frees its KV blocks. Which methods are served follows the worker's
// ModelFacts kind ("embedding": Embed/Score, "llm": Generate). A Generate call with n > 1 names
// itself in its first chunk (GenerateChunk.call_id); StopChoice ends one of its choices while the
// others go on [TAG_STOP_CHOICE].
// With ServiceOptions::auth set, every method of garden.v1.Tulip first checks the call's
// `authorization: Bearer <token>` metadata against it and answers UNAUTHENTICATED without doing
// anything else when it is missing or wrong [TAG_TULIP_TOKEN]. grpc.health.v1 (gRPC's own health
// service) stays open: Kubernetes' gRPC probes cannot send metadata, and it tells only SERVING or
// NOT_SERVING.
// Includes gRPC headers: include it only from the server's .cc files.

#include <memory>
#include <string>

#include "common/grammar/cache.h"
#include "common/grammar/matcher.h"
#include "common/token_file.h"
#include "garden/v1/garden.grpc.pb.h"
#include "services/tulip/llm/llm_scheduler.h"
#include "services/tulip/sched/embed_scheduler.h"
#include "services/tulip/worker/worker.h"

namespace garden::tulip {

struct ServiceOptions {
  std::string served_model_name;  // empty: the name rose reports
  const TokenFile* auth = nullptr;  // --auth-token-file; null: no token required
  // The served vocabulary as bytes (--tokenizer): needed for structured outputs; null: requests
  // with a constraint get FAILED_PRECONDITION.
  std::shared_ptr<const grammar::Vocabulary> vocab;
};

class TulipService final : public garden::v1::Tulip::CallbackService {
 public:
  TulipService(EmbedScheduler& scheduler, LlmFrontend& llm, Worker& worker, ServiceOptions opts);

  grpc::ServerUnaryReactor* Embed(grpc::CallbackServerContext* ctx,
                                  const garden::v1::EmbedRequest* req,
                                  garden::v1::EmbedResponse* resp) override;
  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* ctx,
                                  const garden::v1::ScoreRequest* req,
                                  garden::v1::ScoreResponse* resp) override;
  grpc::ServerWriteReactor<garden::v1::GenerateChunk>* Generate(
      grpc::CallbackServerContext* ctx, const garden::v1::GenerateRequest* req) override;
  grpc::ServerUnaryReactor* Load(grpc::CallbackServerContext* ctx,
                                 const garden::v1::LoadRequest* req,
                                 garden::v1::LoadResponse* resp) override;
  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* ctx,
                                      const garden::v1::ModelInfoRequest* req,
                                      garden::v1::ModelInfoResponse* resp) override;
  // Ends one choice of a running Generate call with n > 1 (LlmScheduler::stopChoice)
  // [TAG_STOP_CHOICE].
  grpc::ServerUnaryReactor* StopChoice(grpc::CallbackServerContext* ctx,
                                       const garden::v1::StopChoiceRequest* req,
                                       garden::v1::StopChoiceResponse* resp) override;

  std::string modelName() const;

 private:
  bool servesLlm() const;
  // OK, or UNAUTHENTICATED when opts_.auth is set and the call lacks a valid token.
  grpc::Status authorize(const grpc::CallbackServerContext* ctx) const;

  EmbedScheduler& scheduler_;
  LlmFrontend& llm_;
  Worker& worker_;
  const ServiceOptions opts_;
  // Compiled grammars by grammar hash [TAG_TOKEN_MASK].
  grammar::LruCache<std::shared_ptr<const grammar::CompiledGrammar>> grammars_{64};
};

}  // namespace garden::tulip
