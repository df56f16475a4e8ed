#pragma once
// The tiny random gpt-oss that exercises the GPU path (rose-mkmodel's writer): head_dim 64, 16 q /
// 2 kv heads (GQA group 8), hidden 288 (K not a multiple of 128), intermediate 160 (five 32-column
// MXFP4 units), 4 layers, top-4 routing. Shared by the GPU model tests and the rank tests.

#include <cstdint>
#include <string>

#include "services/rose/tools/mkmodel_gpt_oss.h"

namespace garden::rose::testsupport {

inline MkGptOssOptions gpuTinyGptOss(const std::string& dir, int64_t experts, int64_t window) {
  MkGptOssOptions o;
  o.out_dir = dir;
  o.seed = 7;
  o.hidden_size = 288;
  o.num_layers = 4;
  o.num_heads = 16;
  o.num_kv_heads = 2;
  o.head_dim = 64;
  o.intermediate_size = 160;
  o.num_experts = experts;
  o.experts_per_token = 4;
  o.sliding_window = window;
  return o;
}

}  // namespace garden::rose::testsupport
