// ShmWorker with kGenerate steps: the llm_batch.h layout goes through the real channel to
// fake-rose in LLM mode (which validates the arrays and runs the fake model), sampled ids come
// back as WorkResult::token_ids, and a refused step comes back as its status.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <future>
#include <thread>

#include "services/tulip/worker/shm_worker.h"
#include "tests/fakes/tulip/fake_llm_model.h"

namespace garden::tulip {
namespace {

using namespace std::chrono_literals;

std::string fakeRose() {
  const char* b = std::getenv("GARDEN_BUILD_DIR");
  return std::string(b ? b : ".") + "/tests/fakes/fake-rose";
}

struct Got {
  std::promise<std::pair<Status, std::vector<int32_t>>> p;
  std::future<std::pair<Status, std::vector<int32_t>>> f = p.get_future();
  WorkDone done() {
    return [this](const WorkResult& r) {
      p.set_value({r.status, std::vector<int32_t>(r.token_ids.begin(), r.token_ids.end())});
    };
  }
};

llm::LlmStepSeq seq(int32_t tok_off, int32_t n, int32_t pos, int32_t blk_off, int32_t nblk,
                    bool sample) {
  llm::LlmStepSeq s;
  s.token_offset = tok_off;
  s.num_tokens = n;
  s.position = pos;
  s.block_offset = blk_off;
  s.num_blocks = nblk;
  s.sample = sample ? 1 : 0;
  return s;
}

TEST(ShmWorkerLlm, GenerateStepsRoundTrip) {
  ShmWorkerOptions o;
  o.shm_name = "/garden-wtest-llm-" + std::to_string(getpid());
  o.layout = shm::Layout{2, 1 << 16, 1 << 16};
  o.rose_bin = fakeRose();
  o.rose_args = {"--llm", "--kv-blocks", "8", "--kv-block-size", "4"};
  auto w = ShmWorker::start(o);
  ASSERT_TRUE(w.isOk()) << w.status().toString();
  auto t0 = std::chrono::steady_clock::now();
  while (!(*w)->ready() && std::chrono::steady_clock::now() - t0 < 30s)
    std::this_thread::sleep_for(5ms);
  ASSERT_TRUE((*w)->ready());
  auto f = (*w)->facts();
  EXPECT_STREQ(f.kind, "llm");
  EXPECT_EQ(f.kv_num_blocks, 8u);
  EXPECT_EQ(f.kv_block_size, 4u);
  EXPECT_EQ(f.eos_ids[0], 999);
  EXPECT_EQ((*w)->inputBytes(), uint64_t{1} << 16);

  // Two prompts in one step (5 tokens in blocks {3,1}, 2 tokens in block {6}), both sampling.
  const std::vector<int32_t> a = {5, 6, 7, 8, 9}, b = {40, 41};
  WorkBatch s1;
  s1.kind = shm::BatchKind::kGenerate;
  s1.tokens = {5, 6, 7, 8, 9, 40, 41};
  s1.block_ids = {3, 1, 6};
  s1.llm_seqs = {seq(0, 5, 0, 0, 2, true), seq(5, 2, 0, 2, 1, true)};
  Got g1;
  ASSERT_TRUE((*w)->trySubmit(s1, g1.done()).isOk());
  ASSERT_EQ(g1.f.wait_for(30s), std::future_status::ready);
  auto [st1, ids1] = g1.f.get();
  ASSERT_TRUE(st1.isOk()) << st1.toString();
  llm::SamplingParams greedy;
  const auto ra = testing::fakeReference(a, 2, greedy, 1000);
  const auto rb = testing::fakeReference(b, 1, greedy, 1000);
  EXPECT_EQ(ids1, (std::vector<int32_t>{ra[0], rb[0]}));

  // A decode of a only: position 5, the earlier tokens come back from blocks 3 and 1.
  WorkBatch s2;
  s2.kind = shm::BatchKind::kGenerate;
  s2.tokens = {ids1[0]};
  s2.block_ids = {3, 1};
  s2.llm_seqs = {seq(0, 1, 5, 0, 2, true)};
  Got g2;
  ASSERT_TRUE((*w)->trySubmit(s2, g2.done()).isOk());
  ASSERT_EQ(g2.f.wait_for(30s), std::future_status::ready);
  auto [st2, ids2] = g2.f.get();
  ASSERT_TRUE(st2.isOk()) << st2.toString();
  EXPECT_EQ(ids2, (std::vector<int32_t>{ra[1]}));

  // A block table that does not cover the new tokens is refused as a whole.
  WorkBatch s3 = s2;
  s3.llm_seqs = {seq(0, 1, 8, 0, 2, true)};
  Got g3;
  ASSERT_TRUE((*w)->trySubmit(s3, g3.done()).isOk());
  ASSERT_EQ(g3.f.wait_for(30s), std::future_status::ready);
  auto [st3, ids3] = g3.f.get();
  EXPECT_EQ(st3.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st3.message().find("cover"), std::string::npos) << st3.toString();
  EXPECT_TRUE(ids3.empty());

  // A step larger than the arena is refused before it reaches the worker.
  WorkBatch big;
  big.kind = shm::BatchKind::kGenerate;
  big.tokens.assign(20000, 1);
  big.llm_seqs = {seq(0, 20000, 0, 0, 0, true)};
  EXPECT_EQ((*w)->trySubmit(big, [](const WorkResult&) {}).code(), StatusCode::kInvalidArgument);
  (*w)->stop();
}

}  // namespace
}  // namespace garden::tulip
