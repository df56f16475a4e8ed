#pragma once
// tulip's Generate for integration and GPU tests that compare greedy streams of two meshes: the
// tokens with each one's logprob and top-2 margin, and the comparison up to the reference's first
// near-tie. Header-only so that the harness itself stays free of gRPC.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "garden/v1/garden.grpc.pb.h"

namespace garden::testing {

// `n` token ids spread over the o200k_harmony vocabulary (ids below 199,998), from `start`.
inline std::vector<int32_t> o200kPrompt(int32_t n, int32_t start) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (start + 7919 * i) % 199998;
  return v;
}

struct Top2Stream {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // the sampled token's
  std::vector<float> margins;   // top-2 logprob margin per token (= the logits' top-2 margin)
};

// Streams `n` tokens for `prompt` (ignore_eos, logprobs with the top 2; greedy unless the
// server's defaults say otherwise) within `deadline`.
inline Top2Stream generateTop2(v1::Tulip::Stub& stub, const std::vector<int32_t>& prompt,
                               uint32_t n,
                               std::chrono::seconds deadline = std::chrono::seconds(120)) {
  v1::GenerateRequest r;
  for (int32_t t : prompt) r.add_prompt_ids(t);
  r.set_max_tokens(n);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_logprobs(true);
  r.mutable_sampling()->set_top_logprobs(2);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  auto reader = stub.Generate(&ctx, r);
  Top2Stream out;
  v1::GenerateChunk c;
  while (reader->Read(&c)) {
    out.tokens.insert(out.tokens.end(), c.token_ids().begin(), c.token_ids().end());
    for (const v1::TokenLogprobs& lp : c.logprobs()) {
      out.logprobs.push_back(lp.logprob());
      out.margins.push_back(lp.top_logprobs_size() >= 2 ? lp.top_logprobs(0) - lp.top_logprobs(1)
                                                        : 0.f);
    }
  }
  out.status = reader->Finish();
  return out;
}

// EXPECTs `got`'s tokens equal `want`'s before `want`'s first near-tie (top-2 margin below
// `near_tie`: rounding alone may decide there, and a free-running stream parts) and returns how
// many were compared; the near-tie token itself may differ.
inline size_t expectSameUntilNearTie(const Top2Stream& got, const Top2Stream& want,
                                     float near_tie) {
  size_t k = 0;
  while (k < want.tokens.size() && k < want.margins.size() && want.margins[k] >= near_tie) ++k;
  EXPECT_GE(got.tokens.size(), std::min(k + 1, want.tokens.size()));
  for (size_t i = 0; i < k && i < got.tokens.size(); ++i) {
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << "token " << i << " (first near-tie at " << k << ")";
  }
  return k;
}

}  // namespace garden::testing
