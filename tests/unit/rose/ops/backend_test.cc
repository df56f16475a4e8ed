// services/rose/ops/backend.cc without a GPU: the GARDEN_* kernel choices read into
// CudaKernelOptions (defaults kept when unset or empty, each accepted value mapped, anything else
// refused naming the variable and the accepted values, leaving the options as they were).
// (makeBackend's answers are in cpu_backend_test.cc.)

#include "services/rose/ops/backend.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace garden::rose {
namespace {

const char* const kVars[] = {"GARDEN_ATTENTION_KERNEL", "GARDEN_GEMM_TUNE", "GARDEN_GEMM_SMALLM",
                             "GARDEN_PDL", "GARDEN_PAGED_ATTENTION", "GARDEN_MOE_PREFILL",
                             "GARDEN_MOE_LT_STREAMS", "GARDEN_MOE_LT_EPILOGUE",
                             "GARDEN_MOE_LT_OVERLAP", "GARDEN_MOE_LT_WGMMA",
                             "GARDEN_ROUTER_MMA", "GARDEN_MOE_WGMMA_DEVICE_PLAN",
                             "GARDEN_PDL_GEMV", "GARDEN_PDL_GRAPH",
                             "GARDEN_GEMM_ROW_INVARIANT", "GARDEN_CHAIN_PDL",
                             "GARDEN_MOE_WGMMA_SMEM_A", "GARDEN_ATTN_FP8_OUT",
                             "GARDEN_QK_ROPE", "GARDEN_GEMM_WG", "GARDEN_GEMM_TUNE_VIEW"};

// Clears the variables for the test and restores what the process had.
class KernelEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      const char* old = std::getenv(v);
      saved_.push_back(old ? std::optional<std::string>(old) : std::nullopt);
      unsetenv(v);
    }
  }
  void TearDown() override {
    for (size_t i = 0; i < saved_.size(); ++i) {
      if (saved_[i]) {
        setenv(kVars[i], saved_[i]->c_str(), 1);
      } else {
        unsetenv(kVars[i]);
      }
    }
  }
  std::vector<std::optional<std::string>> saved_;
};

bool same(const CudaKernelOptions& a, const CudaKernelOptions& b) {
  return a.attention_wide == b.attention_wide && a.attention_sm90 == b.attention_sm90 &&
         a.gemm_tune == b.gemm_tune &&
         a.gemm_smallm == b.gemm_smallm && a.pdl == b.pdl &&
         a.paged_attention_sm90_min_tokens == b.paged_attention_sm90_min_tokens &&
         a.moe_prefill == b.moe_prefill &&
         a.moe_prefill_min_rows_per_expert == b.moe_prefill_min_rows_per_expert &&
         a.moe_lt_streams == b.moe_lt_streams && a.moe_lt_bias_epilogue == b.moe_lt_bias_epilogue &&
         a.moe_lt_overlap_dequant == b.moe_lt_overlap_dequant && a.moe_lt_wgmma == b.moe_lt_wgmma &&
         a.moe_wgmma_min_rows_per_expert == b.moe_wgmma_min_rows_per_expert &&
         a.router_mma == b.router_mma && a.moe_wgmma_device_plan == b.moe_wgmma_device_plan &&
         a.pdl_gemv == b.pdl_gemv && a.gemm_row_invariant == b.gemm_row_invariant &&
         a.chain_pdl == b.chain_pdl && a.moe_wgmma_smem_a == b.moe_wgmma_smem_a &&
         a.attention_fp8_out == b.attention_fp8_out && a.qk_rope_variant == b.qk_rope_variant &&
         a.gemm_wg == b.gemm_wg && a.gemm_tune_chain == b.gemm_tune_chain;
}

TEST_F(KernelEnvTest, UnsetOrEmptyKeepsTheDefaults) {
  CudaKernelOptions o;
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_TRUE(o.attention_wide);
  EXPECT_TRUE(o.attention_sm90);
  EXPECT_TRUE(o.gemm_tune);
  EXPECT_FALSE(o.gemm_smallm);
  EXPECT_TRUE(o.pdl);
  EXPECT_EQ(o.paged_attention_sm90_min_tokens, 128);
  EXPECT_EQ(o.moe_prefill, CudaKernelOptions::MoePrefill::kAuto);
  EXPECT_EQ(o.moe_prefill_min_rows_per_expert, kMoePrefillMinRowsPerExpert);
  EXPECT_EQ(o.moe_lt_streams, 4);
  EXPECT_TRUE(o.moe_lt_bias_epilogue);
  EXPECT_FALSE(o.moe_lt_overlap_dequant);
  EXPECT_TRUE(o.moe_lt_wgmma);
  EXPECT_FALSE(o.router_mma);
  EXPECT_TRUE(o.moe_wgmma_device_plan);
  EXPECT_FALSE(o.pdl_gemv);
  EXPECT_TRUE(o.gemm_row_invariant);
  EXPECT_TRUE(o.chain_pdl);
  EXPECT_FALSE(o.moe_wgmma_smem_a);
  EXPECT_TRUE(o.attention_fp8_out);
  for (const char* v : kVars) setenv(v, "", 1);
  CudaKernelOptions e;
  ASSERT_TRUE(cudaKernelOptionsFromEnv(e).isOk());
  EXPECT_TRUE(same(e, CudaKernelOptions{}));
}

TEST_F(KernelEnvTest, EachAcceptedValueIsRead) {
  setenv("GARDEN_ATTENTION_KERNEL", "narrow", 1);
  setenv("GARDEN_GEMM_TUNE", "0", 1);
  setenv("GARDEN_GEMM_SMALLM", "1", 1);
  setenv("GARDEN_PDL", "0", 1);
  setenv("GARDEN_PAGED_ATTENTION", "mma", 1);
  setenv("GARDEN_MOE_PREFILL", "cublas", 1);
  setenv("GARDEN_MOE_LT_STREAMS", "1", 1);
  setenv("GARDEN_MOE_LT_EPILOGUE", "0", 1);
  setenv("GARDEN_MOE_LT_OVERLAP", "0", 1);
  CudaKernelOptions o;
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_EQ(o.moe_lt_streams, 1);
  EXPECT_FALSE(o.moe_lt_bias_epilogue);
  EXPECT_FALSE(o.moe_lt_overlap_dequant);
  setenv("GARDEN_MOE_LT_STREAMS", "8", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_EQ(o.moe_lt_streams, 8);
  EXPECT_EQ(o.paged_attention_sm90_min_tokens, 0);
  EXPECT_EQ(o.moe_prefill, CudaKernelOptions::MoePrefill::kStep);  // cublas: the old name of step
  setenv("GARDEN_MOE_PREFILL", "tiled", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_EQ(o.moe_prefill, CudaKernelOptions::MoePrefill::kTiled);
  setenv("GARDEN_MOE_PREFILL", "step", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_EQ(o.moe_prefill, CudaKernelOptions::MoePrefill::kStep);
  setenv("GARDEN_MOE_PREFILL", "auto", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_EQ(o.moe_prefill, CudaKernelOptions::MoePrefill::kAuto);
  // An unset variable keeps what the options had (auto is not read as the old "cublas" slot).
  unsetenv("GARDEN_MOE_PREFILL");
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_EQ(o.moe_prefill, CudaKernelOptions::MoePrefill::kAuto);
  setenv("GARDEN_MOE_PREFILL", "step", 1);
  EXPECT_FALSE(o.attention_wide);
  EXPECT_FALSE(o.attention_sm90);
  EXPECT_FALSE(o.gemm_tune);
  EXPECT_TRUE(o.gemm_smallm);
  EXPECT_FALSE(o.pdl);
  setenv("GARDEN_ATTENTION_KERNEL", "sm90", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_TRUE(o.attention_sm90);
  EXPECT_TRUE(o.attention_wide);
  setenv("GARDEN_ATTENTION_KERNEL", "mma", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_FALSE(o.attention_sm90);
  EXPECT_TRUE(o.attention_wide);
  setenv("GARDEN_ATTENTION_KERNEL", "auto", 1);
  setenv("GARDEN_GEMM_TUNE", "1", 1);
  setenv("GARDEN_GEMM_SMALLM", "0", 1);
  setenv("GARDEN_PDL", "1", 1);
  setenv("GARDEN_PAGED_ATTENTION", "sm90", 1);
  setenv("GARDEN_MOE_PREFILL", "auto", 1);
  setenv("GARDEN_MOE_LT_STREAMS", std::to_string(CudaKernelOptions{}.moe_lt_streams).c_str(), 1);
  setenv("GARDEN_MOE_LT_EPILOGUE", "1", 1);
  setenv("GARDEN_MOE_LT_OVERLAP", "0", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_TRUE(same(o, CudaKernelOptions{}));
  setenv("GARDEN_MOE_LT_OVERLAP", "1", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_TRUE(o.moe_lt_overlap_dequant);
  setenv("GARDEN_MOE_LT_WGMMA", "1", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_TRUE(o.moe_lt_wgmma);
  setenv("GARDEN_MOE_LT_WGMMA", "0", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_FALSE(o.moe_lt_wgmma);
  setenv("GARDEN_ROUTER_MMA", "0", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_FALSE(o.router_mma);
  setenv("GARDEN_ROUTER_MMA", "1", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_TRUE(o.router_mma);
  setenv("GARDEN_MOE_WGMMA_DEVICE_PLAN", "0", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_FALSE(o.moe_wgmma_device_plan);
  setenv("GARDEN_PDL_GEMV", "0", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_FALSE(o.pdl_gemv);
  setenv("GARDEN_PDL_GEMV", "1", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_TRUE(o.pdl_gemv);
  const bool pdl_graph_default = CudaKernelOptions{}.pdl_graph;
  setenv("GARDEN_PDL_GRAPH", pdl_graph_default ? "0" : "1", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_EQ(o.pdl_graph, !pdl_graph_default);
  setenv("GARDEN_GEMM_ROW_INVARIANT", "1", 1);  // [TAG_GEMM_ROW_INVARIANT]
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_TRUE(o.gemm_row_invariant);
  setenv("GARDEN_GEMM_ROW_INVARIANT", "0", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_FALSE(o.gemm_row_invariant);
  setenv("GARDEN_CHAIN_PDL", "0", 1);  // [TAG_CHAIN_PDL]
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_FALSE(o.chain_pdl);
  setenv("GARDEN_CHAIN_PDL", "1", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_TRUE(o.chain_pdl);
  setenv("GARDEN_MOE_WGMMA_SMEM_A", "1", 1);  // [TAG_MOE_WGMMA_SMEM_A]
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_TRUE(o.moe_wgmma_smem_a);
  setenv("GARDEN_ATTN_FP8_OUT", "0", 1);  // [TAG_ATTN_FP8_OUT]
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_FALSE(o.attention_fp8_out);
  setenv("GARDEN_ATTN_FP8_OUT", "1", 1);
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_TRUE(o.attention_fp8_out);
  for (auto [name, variant] : {std::pair<const char*, int32_t>{"legacy", -1}, {"pair1", 1},
                               {"pair2", 2}, {"pair4", 4}, {"pair8", 8}, {"auto", 0}}) {
    setenv("GARDEN_QK_ROPE", name, 1);  // [TAG_QK_ROPE_PAIR]
    ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
    EXPECT_EQ(o.qk_rope_variant, variant) << name;
  }
  unsetenv("GARDEN_QK_ROPE");
  EXPECT_EQ(CudaKernelOptions{}.gemm_wg, 0);  // [TAG_GEMM_WG] off until measured
  for (auto [name, wg] : {std::pair<const char*, int32_t>{"1", 1}, {"pdl", 2}, {"0", 0}}) {
    setenv("GARDEN_GEMM_WG", name, 1);
    ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
    EXPECT_EQ(o.gemm_wg, wg) << name;
  }
  unsetenv("GARDEN_GEMM_WG");
  EXPECT_FALSE(CudaKernelOptions{}.gemm_tune_chain);  // [TAG_GEMM_TUNE_CHAIN] off until measured
  for (auto [name, chain] : {std::pair<const char*, bool>{"chain", true}, {"cold", false}}) {
    setenv("GARDEN_GEMM_TUNE_VIEW", name, 1);
    ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
    EXPECT_EQ(o.gemm_tune_chain, chain) << name;
  }
  unsetenv("GARDEN_GEMM_TUNE_VIEW");
  o.qk_rope_variant = 4;  // unset: kept as it was
  ASSERT_TRUE(cudaKernelOptionsFromEnv(o).isOk());
  EXPECT_EQ(o.qk_rope_variant, 4);
}

TEST_F(KernelEnvTest, OtherValuesAreRefusedByName) {
  struct Bad {
    const char* var;
    const char* value;
    const char* accepted;
  };
  // The old attention names are gone (variants are named by strategy now).
  for (const Bad& b :
       {Bad{"GARDEN_ATTENTION_KERNEL", "v3", "auto|narrow|sm90|mma"},
        Bad{"GARDEN_ATTENTION_KERNEL", "v1", "auto|narrow|sm90|mma"}, Bad{"GARDEN_GEMM_TUNE", "yes", "0|1"},
        Bad{"GARDEN_GEMM_SMALLM", "2", "0|1"}, Bad{"GARDEN_PDL", "on", "0|1"},
        Bad{"GARDEN_PAGED_ATTENTION", "wgmma", "sm90|mma"},
        Bad{"GARDEN_MOE_PREFILL", "lt", "tiled|chunk|step|cublas|auto"},
        Bad{"GARDEN_MOE_LT_STREAMS", "0", "1|2|3|4|5|6|7|8"},
        Bad{"GARDEN_MOE_LT_STREAMS", "9", "1|2|3|4|5|6|7|8"},
        Bad{"GARDEN_MOE_LT_EPILOGUE", "on", "0|1"}, Bad{"GARDEN_MOE_LT_OVERLAP", "yes", "0|1"},
        Bad{"GARDEN_MOE_LT_WGMMA", "on", "0|1"}, Bad{"GARDEN_ROUTER_MMA", "mma", "0|1"},
        Bad{"GARDEN_MOE_WGMMA_DEVICE_PLAN", "on", "0|1"}, Bad{"GARDEN_PDL_GRAPH", "yes", "0|1"},
        Bad{"GARDEN_GEMM_ROW_INVARIANT", "on", "0|1"}, Bad{"GARDEN_MOE_WGMMA_SMEM_A", "yes", "0|1"},
        Bad{"GARDEN_ATTN_FP8_OUT", "on", "0|1"},
        Bad{"GARDEN_QK_ROPE", "pair3", "auto|legacy|pair1|pair2|pair4|pair8"},
        Bad{"GARDEN_GEMM_WG", "on", "0|1|pdl"},
        Bad{"GARDEN_GEMM_TUNE_VIEW", "hot", "cold|chain"}}) {
    SCOPED_TRACE(std::string(b.var) + "=" + b.value);
    for (const char* v : kVars) unsetenv(v);
    setenv(b.var, b.value, 1);
    CudaKernelOptions o;
    o.pdl = false;  // not the default: a refusal must leave the options as they were
    const Status st = cudaKernelOptionsFromEnv(o);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(b.var), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(b.value), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(b.accepted), std::string::npos) << st.message();
    CudaKernelOptions before;
    before.pdl = false;
    EXPECT_TRUE(same(o, before));
  }
}

}  // namespace
}  // namespace garden::rose
