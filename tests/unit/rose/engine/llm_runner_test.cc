// The step loop running the LlmRunner in-process on a real shm Channel, with the CPU backend
// and the tiny gpt-oss checkpoint from tests/conformance/gpt_oss/fixtures (its outputs are
// checked against transformers there): kGenerate steps (chunked prefill, several sequences per
// step, decode) give exactly the sampled ids of a GptOssModel driven directly, greedy and seeded;
// malformed descriptors and expired deadlines are answered without running and without touching
// the KV cache, and the loop keeps serving; ModelFacts announce the llm; eos ids and checkpoint
// kind are read from the model's files.

#include "services/rose/engine/llm_runner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <vector>

#include "common/shm/channel.h"
#include "common/shm/llm_batch.h"
#include "services/rose/engine/step_loop.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

fs::path sourceDir() {
  const char* src = std::getenv("GARDEN_SOURCE_DIR");
  return src ? fs::path(src) : fs::path(".");
}
std::string fixtureDir() {
  return (sourceDir() / "tests/conformance/gpt_oss/fixtures/mxfp4").string();
}

constexpr int32_t kBlocks = 32, kBlockSize = 4, kMaxSeqs = 4, kMaxLen = 64;
constexpr int64_t kMaxTokens = 48;
constexpr uint64_t kInputBytes = 16384;

LlmStepSeq seq(int32_t tok_off, int32_t n, int32_t pos, int32_t blk_off, int32_t nblk,
               bool sample = false, SamplingParams sp = {}) {
  LlmStepSeq s;
  s.token_offset = tok_off;
  s.num_tokens = n;
  s.position = pos;
  s.block_offset = blk_off;
  s.num_blocks = nblk;
  s.sample = sample ? 1 : 0;
  s.sampling = sp;
  return s;
}

struct Step {
  std::vector<LlmStepSeq> seqs;
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
};

class LlmRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    name_ = "/rose-llm-runner-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    auto ch = shm::Channel::create(name_, shm::Layout{3, kInputBytes, 4096});
    ASSERT_TRUE(ch.isOk()) << ch.status().toString();
    channel_.emplace(std::move(ch).value());
    BackendOptions bo;
    bo.threads = 1;
    bo.max_batch_tokens = kMaxTokens;
    GptOssOptions go;
    go.max_batch_tokens = kMaxTokens;
    go.max_seqs = kMaxSeqs;
    go.max_logits_rows = kMaxSeqs;
    go.max_model_len = kMaxLen;
    go.min_block_size = kBlockSize;
    for (int i = 0; i < 2; ++i) {
      backends_[i] = std::move(makeBackend("cpu", bo)).value();
      ops_[i] = std::move(makeLlmOps(*backends_[i], 1)).value();
      auto m = GptOssModel::load(fixtureDir(), *backends_[i], *ops_[i], go);
      ASSERT_TRUE(m.isOk()) << m.status().toString();
      models_[i] = std::move(m).value();
    }
    ref_kv_ = PagedKvCache::create(*backends_[1], models_[1]->kvShape(kBlocks, kBlockSize),
                                   models_[1]->kvDType())
                  .value();
    LlmRunnerOptions ro;
    ro.kv_num_blocks = kBlocks;
    ro.kv_block_size = kBlockSize;
    ro.max_seqs = kMaxSeqs;
    ro.max_batch_tokens = kMaxTokens;
    ro.eos_ids = {2, 7};
    ro.late_mask_timeout = late_mask_timeout_;
    auto r = LlmRunner::create(*backends_[0], *models_[0], ro);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    runner_ = std::move(r).value();
    StepLoopOptions lo;
    lo.model_name = "tiny-gpt-oss";
    auto e = StepLoop::create(*channel_, *backends_[0], *runner_, lo);
    ASSERT_TRUE(e.isOk()) << e.status().toString();
    loop_ = std::move(e).value();
    loop_->announceReady();
  }

  void TearDown() override {
    loop_.reset();
    runner_.reset();
  }

  // Writes the step's three arrays into `slot`'s input arena (8-byte aligned, back to back) and
  // returns a descriptor for them.
  shm::BatchDesc put(uint32_t slot, const Step& s) {
    auto in = channel_->inputArena(slot);
    shm::BatchDesc d;
    d.batch_id = ++next_id_;
    d.slot = slot;
    d.kind = shm::BatchKind::kGenerate;
    d.num_seqs = static_cast<uint32_t>(s.seqs.size());
    d.num_blocks = static_cast<uint32_t>(s.blocks.size());
    uint32_t total = 0;
    for (const auto& q : s.seqs) total += static_cast<uint32_t>(q.num_tokens);
    d.num_tokens = total;
    uint64_t off = 0;
    d.seqs_offset = off;
    std::memcpy(in.data() + off, s.seqs.data(), s.seqs.size() * sizeof(LlmStepSeq));
    off += shm::llmAlignUp(s.seqs.size() * sizeof(LlmStepSeq));
    d.tokens_offset = off;
    std::memcpy(in.data() + off, s.tokens.data(), s.tokens.size() * 4);
    off += shm::llmAlignUp(s.tokens.size() * 4);
    d.blocks_offset = off;
    std::memcpy(in.data() + off, s.blocks.data(), s.blocks.size() * 4);
    std::strcpy(d.request_id, "req-llm-test");
    return d;
  }

  shm::Completion submitAndWait(const shm::BatchDesc& d) {
    EXPECT_TRUE(channel_->trySubmit(d));
    EXPECT_TRUE(loop_->step(1s));
    auto c = channel_->waitCompletion(20s);
    EXPECT_TRUE(c.has_value());
    return c.value_or(shm::Completion{});
  }

  // Runs the step through the loop; returns the sampled ids (asserting success).
  std::vector<int32_t> loopStep(uint32_t slot, const Step& s) {
    shm::Completion c = submitAndWait(put(slot, s));
    EXPECT_EQ(c.status_code, 0) << c.message;
    EXPECT_EQ(c.slot, slot);
    uint32_t sampling = 0;
    for (const auto& q : s.seqs) sampling += q.sample;
    EXPECT_EQ(c.rows, sampling);
    EXPECT_EQ(c.cols, 1u);
    EXPECT_EQ(c.output_bytes, 4u * sampling);
    std::vector<int32_t> out(c.rows);
    std::memcpy(out.data(), channel_->outputArena(slot).data(), out.size() * 4);
    return out;
  }

  // The same step on the independent reference model and cache.
  std::vector<int32_t> refStep(const Step& s) {
    LlmStep step{s.seqs, s.tokens, s.blocks};
    Status st = models_[1]->validate(step, *ref_kv_);
    EXPECT_TRUE(st.isOk()) << st.toString();
    std::vector<int32_t> out;
    for (const auto& q : s.seqs) {
      if (q.sample) out.push_back(-1);
    }
    models_[1]->enqueueStep(step, *ref_kv_, nullptr, out.data());
    EXPECT_TRUE(backends_[1]->synchronize().isOk());
    return out;
  }

  // Snapshot of the runner's whole KV cache (CPU backend memory is host memory).
  std::vector<std::byte> kvBytes() {
    const PagedKvCache& kv = runner_->kvCache();
    std::vector<std::byte> out;
    for (int32_t l = 0; l < kv.shape().num_layers; ++l) {
      for (const Tensor& t : {kv.keys(l), kv.values(l)}) {
        const auto* p = static_cast<const std::byte*>(t.data);
        out.insert(out.end(), p, p + t.bytes());
      }
    }
    return out;
  }

  void expectRejected(const shm::BatchDesc& d, StatusCode code, const std::string& needle) {
    shm::Completion c = submitAndWait(d);
    EXPECT_EQ(c.status_code, static_cast<int32_t>(code)) << c.message;
    EXPECT_EQ(c.batch_id, d.batch_id);
    EXPECT_EQ(c.rows, 0u);
    EXPECT_NE(std::string(c.message).find(needle), std::string::npos)
        << "'" << c.message << "' lacks '" << needle << "'";
  }

  std::string name_;
  std::optional<shm::Channel> channel_;
  std::unique_ptr<Backend> backends_[2];
  std::unique_ptr<LlmOps> ops_[2];
  std::unique_ptr<GptOssModel> models_[2];  // [0] serves the loop, [1] is the reference
  std::unique_ptr<PagedKvCache> ref_kv_;
  std::unique_ptr<LlmRunner> runner_;
  std::unique_ptr<StepLoop> loop_;
  uint64_t next_id_ = 500;
  std::chrono::milliseconds late_mask_timeout_{10000};
};

TEST_F(LlmRunnerTest, AnnouncesLlmFacts) {
  EXPECT_EQ(channel_->state(), shm::WorkerState::kReady);
  EXPECT_EQ(channel_->workerPid(), getpid());
  const shm::ModelFacts f = channel_->modelFacts();
  EXPECT_STREQ(f.kind, "llm");
  EXPECT_STREQ(f.name, "tiny-gpt-oss");
  EXPECT_EQ(f.vocab_size, 512u);
  EXPECT_EQ(f.hidden_size, 32u);
  EXPECT_EQ(f.max_seq_len, static_cast<uint32_t>(kMaxLen));
  EXPECT_EQ(f.max_batch_tokens, static_cast<uint32_t>(kMaxTokens));
  EXPECT_EQ(f.max_seqs, static_cast<uint32_t>(kMaxSeqs));
  EXPECT_EQ(f.kv_num_blocks, static_cast<uint32_t>(kBlocks));
  EXPECT_EQ(f.kv_block_size, static_cast<uint32_t>(kBlockSize));
  EXPECT_EQ(f.eos_ids[0], 2);
  EXPECT_EQ(f.eos_ids[1], 7);
  EXPECT_EQ(f.eos_ids[2], -1);
  EXPECT_EQ(f.eos_ids[3], -1);
  // The CPU ops implement sampler state [TAG_LLM_SAMPLER_STATE]: tulip admits logprobs etc.
  EXPECT_EQ(f.llm_caps & shm::kLlmCapSamplerState, shm::kLlmCapSamplerState);
  // ... and token masks [TAG_TOKEN_MASK]: tulip admits response_format.
  EXPECT_EQ(f.llm_caps & shm::kLlmCapTokenMask, shm::kLlmCapTokenMask);
  EXPECT_EQ(f.llm_caps & shm::kLlmCapLateMask, shm::kLlmCapLateMask);
  EXPECT_STREQ(f.sampler, "cpu");
  EXPECT_EQ(runner_->kvCache().shape().num_blocks, kBlocks);
}

// Three sequences: A's prompt is prefilled in two chunks, B (seeded sampling) and C (greedy) in
// one; then all three decode together for several steps, each fed the token the loop sampled
// for it. Every sampled id equals the direct model's on the same steps.
TEST_F(LlmRunnerTest, ChunkedPrefillAndDecodeEqualTheModelDrivenDirectly) {
  SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.top_p = 0.9f;
  seeded.top_k = 40;
  seeded.seed = 12345;
  SamplingParams greedy;  // temperature 0
  const std::vector<int32_t> a_prompt = {5, 17, 300, 42, 99, 7, 260, 11, 400, 3};
  const std::vector<int32_t> b_prompt = {1, 2, 3, 4, 5, 6, 7};
  const std::vector<int32_t> c_prompt = {500, 9, 77};
  // Non-contiguous block tables (6 blocks = 24 tokens each), handed whole every step.
  const std::vector<int32_t> a_blocks = {3, 7, 11, 15, 19, 23};
  const std::vector<int32_t> b_blocks = {0, 5, 9, 13, 20, 30};
  const std::vector<int32_t> c_blocks = {2, 8, 14, 21, 22, 31};
  std::vector<int32_t> all_blocks = a_blocks;
  all_blocks.insert(all_blocks.end(), b_blocks.begin(), b_blocks.end());
  all_blocks.insert(all_blocks.end(), c_blocks.begin(), c_blocks.end());

  auto compare = [&](uint32_t slot, const Step& s) {
    auto got = loopStep(slot, s);
    auto want = refStep(s);
    EXPECT_EQ(got, want) << "slot " << slot;
    return got;
  };

  // Step 1: A's first chunk (no sample), B and C whole prompts (sample).
  Step s1;
  s1.seqs = {seq(0, 6, 0, 0, 6), seq(6, 7, 0, 6, 6, true, seeded),
             seq(13, 3, 0, 12, 6, true, greedy)};
  s1.tokens.assign(a_prompt.begin(), a_prompt.begin() + 6);
  s1.tokens.insert(s1.tokens.end(), b_prompt.begin(), b_prompt.end());
  s1.tokens.insert(s1.tokens.end(), c_prompt.begin(), c_prompt.end());
  s1.blocks = all_blocks;
  auto out = compare(0, s1);
  ASSERT_EQ(out.size(), 2u);
  int32_t b_next = out[0], c_next = out[1];

  // Step 2: A's second chunk (sample), B and C decode.
  Step s2;
  s2.seqs = {seq(0, 4, 6, 0, 6, true, greedy), seq(4, 1, 7, 6, 6, true, seeded),
             seq(5, 1, 3, 12, 6, true, greedy)};
  s2.tokens.assign(a_prompt.begin() + 6, a_prompt.end());
  s2.tokens.push_back(b_next);
  s2.tokens.push_back(c_next);
  s2.blocks = all_blocks;
  out = compare(1, s2);
  ASSERT_EQ(out.size(), 3u);
  int32_t a_next = out[0];
  b_next = out[1];
  c_next = out[2];
  int32_t a_pos = 10, b_pos = 8, c_pos = 4;

  // Decode steps, rotating over the slots; crosses the fixture's sliding window (8).
  std::vector<int32_t> a_gen;
  for (int i = 0; i < 6; ++i) {
    Step s;
    s.seqs = {seq(0, 1, a_pos, 0, 6, true, greedy), seq(1, 1, b_pos, 6, 6, true, seeded),
              seq(2, 1, c_pos, 12, 6, true, greedy)};
    s.tokens = {a_next, b_next, c_next};
    s.blocks = all_blocks;
    out = compare(static_cast<uint32_t>(i % 3), s);
    ASSERT_EQ(out.size(), 3u);
    a_next = out[0];
    b_next = out[1];
    c_next = out[2];
    ++a_pos, ++b_pos, ++c_pos;
    a_gen.push_back(a_next);
    for (int32_t id : out) EXPECT_TRUE(id >= 0 && id < 512) << id;
  }
  EXPECT_EQ(loop_->stats().batches_run, 8u);
  EXPECT_EQ(loop_->stats().batches_rejected, 0u);
}

// A step in which no sequence samples (a prefill chunk) completes with zero rows.
TEST_F(LlmRunnerTest, StepWithoutSamplingCompletesWithNoRows) {
  Step s;
  s.seqs = {seq(0, 5, 0, 0, 2)};
  s.tokens = {1, 2, 3, 4, 5};
  s.blocks = {4, 9};
  shm::Completion c = submitAndWait(put(2, s));
  EXPECT_EQ(c.status_code, 0) << c.message;
  EXPECT_EQ(c.rows, 0u);
  EXPECT_EQ(c.output_bytes, 0u);
}

TEST_F(LlmRunnerTest, MalformedDescriptorsAreRejectedWithoutTouchingTheCache) {
  // A live sequence with its prompt in blocks 0 and 1.
  Step live;
  live.seqs = {seq(0, 5, 0, 0, 2, true)};
  live.tokens = {10, 20, 30, 40, 50};
  live.blocks = {0, 1};
  auto first = loopStep(0, live);
  ASSERT_EQ(first, refStep(live));
  const std::vector<std::byte> before = kvBytes();

  // A valid-looking step that writes the live sequence's blocks (position 0, block 0), made
  // invalid by a second sequence; each variant below is rejected as a whole.
  Step clobber;
  clobber.seqs = {seq(0, 3, 0, 0, 1, true), seq(3, 2, 0, 1, 1, true)};
  clobber.tokens = {7, 8, 9, 1, 2};
  clobber.blocks = {0, 1};

  auto bad_token = clobber;
  bad_token.tokens[4] = 512;  // vocabulary is 512
  expectRejected(put(1, bad_token), StatusCode::kInvalidArgument, "outside the vocabulary");

  auto bad_block = clobber;
  bad_block.blocks[1] = kBlocks;  // one past the cache
  expectRejected(put(1, bad_block), StatusCode::kInvalidArgument, "outside the cache");

  auto bad_range = clobber;
  bad_range.seqs[1].block_offset = 2;  // past the block id array
  expectRejected(put(1, bad_range), StatusCode::kInvalidArgument, "block id array");

  auto logits = clobber;
  logits.seqs[1].logits = LogitsMode::kLast;
  expectRejected(put(1, logits), StatusCode::kInvalidArgument, "logits");

  auto too_long = clobber;
  too_long.seqs[1].position = kMaxLen - 1;  // position + num_tokens > max_model_len
  too_long.seqs[1].num_blocks = 1;
  expectRejected(put(1, too_long), StatusCode::kInvalidArgument, "max_model_len");

  shm::BatchDesc d = put(1, clobber);
  d.num_tokens += 1;  // the sequences sum to 5
  expectRejected(d, StatusCode::kInvalidArgument, "sum to 5");

  d = put(1, clobber);
  d.seqs_offset = kInputBytes - 8;
  expectRejected(d, StatusCode::kInvalidArgument, "seqs (offset");

  d = put(1, clobber);
  d.blocks_offset = ~uint64_t{0} - 7;  // overflow-safe range check
  expectRejected(d, StatusCode::kInvalidArgument, "blocks (offset");

  d = put(1, clobber);
  d.tokens_offset += 4;
  expectRejected(d, StatusCode::kInvalidArgument, "aligned");

  d = put(1, clobber);
  d.num_seqs = kMaxSeqs + 1;
  expectRejected(d, StatusCode::kInvalidArgument, "max_seqs");

  d = put(1, clobber);
  d.num_tokens = kMaxTokens + 1;
  expectRejected(d, StatusCode::kInvalidArgument, "max_batch_tokens");

  d = put(1, clobber);
  d.num_seqs = 0;
  expectRejected(d, StatusCode::kInvalidArgument, "num_seqs");

  d = put(1, clobber);
  d.num_blocks = static_cast<uint32_t>(runner_->maxStepBlocks() + 1);
  expectRejected(d, StatusCode::kInvalidArgument, "num_blocks");

  d = put(1, clobber);
  d.kind = shm::BatchKind::kEmbed;
  expectRejected(d, StatusCode::kInvalidArgument, "serves an llm");
  d.kind = static_cast<shm::BatchKind>(99);
  expectRejected(d, StatusCode::kInvalidArgument, "serves an llm");

  d = put(1, clobber);
  d.slot = 7;
  expectRejected(d, StatusCode::kInvalidArgument, "slot 7");

  EXPECT_EQ(kvBytes(), before) << "a rejected step wrote the KV cache";
  EXPECT_EQ(loop_->stats().batches_rejected, 16u);
  ASSERT_TRUE(loop_->waitIdle(std::chrono::seconds(10)));  // answers are published, then counted
  EXPECT_EQ(loop_->inFlight(), 0u);

  // The loop keeps serving: the live sequence decodes exactly as the reference's.
  int32_t next = first[0];
  for (int32_t pos = 5; pos < 8; ++pos) {
    Step s;
    s.seqs = {seq(0, 1, pos, 0, 2, true)};
    s.tokens = {next};
    s.blocks = {0, 1};
    auto got = loopStep(static_cast<uint32_t>(pos % 3), s);
    ASSERT_EQ(got, refStep(s));
    next = got[0];
  }
}

TEST_F(LlmRunnerTest, ExpiredDeadlineIsAnsweredWithoutRunning) {
  const std::vector<std::byte> before = kvBytes();
  Step s;
  s.seqs = {seq(0, 3, 0, 0, 1, true)};
  s.tokens = {1, 2, 3};
  s.blocks = {5};
  shm::BatchDesc d = put(0, s);
  d.deadline_ns = shm::monotonicNowNs() - 1'000'000;
  expectRejected(d, StatusCode::kDeadlineExceeded, "deadline");
  EXPECT_EQ(kvBytes(), before);
  EXPECT_EQ(loop_->stats().batches_run, 0u);
  // A deadline in the future runs.
  d = put(0, s);
  d.deadline_ns = shm::monotonicNowNs() + 60'000'000'000;
  shm::Completion c = submitAndWait(d);
  EXPECT_EQ(c.status_code, 0) << c.message;
  EXPECT_EQ(c.rows, 1u);
  EXPECT_EQ(loop_->stats().batches_run, 1u);
}

// Several steps in flight on different slots (independent sequences): each completes with its
// own result, in submission order.
TEST_F(LlmRunnerTest, PipelinedStepsOnSeveralSlots) {
  std::vector<Step> steps;
  for (int i = 0; i < 3; ++i) {
    Step s;
    s.seqs = {seq(0, 4, 0, 0, 1, true)};
    s.tokens = {10 + i, 20 + i, 30 + i, 40 + i};
    s.blocks = {10 + i};
    steps.push_back(s);
  }
  std::vector<shm::BatchDesc> ds;
  for (uint32_t i = 0; i < 3; ++i) {
    ds.push_back(put(i, steps[i]));
    ASSERT_TRUE(channel_->trySubmit(ds.back()));
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loop_->step(1s));
  for (uint32_t i = 0; i < 3; ++i) {
    auto c = channel_->waitCompletion(20s);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->batch_id, ds[i].batch_id);
    ASSERT_EQ(c->status_code, 0) << c->message;
    int32_t got;
    std::memcpy(&got, channel_->outputArena(i).data(), 4);
    EXPECT_EQ(std::vector<int32_t>{got}, refStep(steps[i]));
  }
}

// [TAG_LLM_PREV_TOKEN] tulip sends a decode step whose first token is "row 0 of what the previous
// step samples" while that step has not run yet; the CPU backend runs enqueueStep on its own
// queue, later. The runner must check prev_row against the step it launched last, not against the
// model's count, which moves only when the queue gets there (CI saw "prev_row 0 is not a row of
// the previous step's 0 sampled ids" this way). Here the queue is held until both are admitted.
TEST_F(LlmRunnerTest, NextStepMayNameARowOfAStepThatHasNotRunYet) {
  Step a;
  a.seqs = {seq(0, 5, 0, 0, 2, true)};
  a.tokens = {11, 12, 13, 14, 15};
  a.blocks = {3, 4};
  Step b;  // its token is a placeholder: rose takes row 0 of a's sampled ids
  b.seqs = {seq(0, 1, 5, 0, 2, true)};
  b.seqs[0].prev_row = 0;
  b.tokens = {0};
  b.blocks = {3, 4};
  std::promise<void> release;
  std::shared_future<void> held = release.get_future().share();
  backends_[0]->launch([held] { held.wait(); });
  const shm::BatchDesc da = put(0, a);
  const shm::BatchDesc db = put(1, b);
  ASSERT_TRUE(channel_->trySubmit(da));
  ASSERT_TRUE(channel_->trySubmit(db));
  ASSERT_TRUE(loop_->step(1s));
  ASSERT_TRUE(loop_->step(1s));
  release.set_value();
  int32_t got[2] = {-1, -1};
  for (int i = 0; i < 2; ++i) {
    auto c = channel_->waitCompletion(20s);
    ASSERT_TRUE(c.has_value());
    ASSERT_EQ(c->status_code, 0) << c->message;
    std::memcpy(&got[c->slot], channel_->outputArena(c->slot).data(), 4);
  }
  const std::vector<int32_t> want_a = refStep(a);
  b.tokens = {want_a[0]};  // what prev_row stands for, given to the reference directly
  b.seqs[0].prev_row = -1;
  const std::vector<int32_t> want_b = refStep(b);
  EXPECT_EQ(got[0], want_a[0]);
  EXPECT_EQ(got[1], want_b[0]);
}

// Structured outputs with the sampler state through the shm format [TAG_TOKEN_MASK]
// [TAG_LLM_SAMPLER_STATE]: the state words after the block ids, the token bitmasks at
// seqlens_offset after them (tulip's ShmWorker layout). Sequence 0 samples under a mask with a
// +100 logit_bias on a forbidden id, penalties and logprobs; sequence 1 under another mask
// (greedy); sequence 2 is unconstrained. Each id is the reference model's on the same step (and
// allowed by its mask); the logprob records are the reference's (raw logits). Then malformed
// mask fields are refused naming them.
TEST_F(LlmRunnerTest, MaskedStepWithSamplerStateAndLogprobs) {
  const size_t words = shm::llmMaskWords(512);
  SamplingParams drawn;
  drawn.temperature = 0.8f;
  drawn.seed = 77;
  drawn.frequency_penalty = 0.5f;
  drawn.repetition_penalty = 1.3f;
  drawn.logprobs = 3;
  drawn.state_slot = 1;
  SamplingParams greedy;
  Step s;
  s.seqs = {seq(0, 4, 0, 0, 1, true, drawn), seq(4, 3, 0, 1, 1, true, greedy),
            seq(7, 2, 0, 2, 1, true, greedy)};
  s.seqs[0].mask_index = 2;  // masks may be named in any order
  s.seqs[1].mask_index = 1;
  s.tokens = {10, 20, 30, 40, 11, 12, 13, 14, 15};
  s.blocks = {5, 6, 7};
  // Sequence 0's reload: 4 prompt ids, no output, 2 bias pairs (+100 on forbidden id 300).
  auto bits = [](float f) {
    int32_t b;
    std::memcpy(&b, &f, 4);
    return b;
  };
  const std::vector<int32_t> state = {10, 20, 30, 40, 300, bits(100.f), 17, bits(-5.f)};
  s.seqs[0].state_offset = 0;
  s.seqs[0].state_prompt = 4;
  s.seqs[0].state_bias = 2;
  std::vector<uint32_t> masks(2 * words, 0);
  auto allow = [&](size_t k, int32_t id) { masks[k * words + id / 32] |= 1u << (id % 32); };
  for (int32_t id : {3, 17, 40, 100, 257, 511}) allow(1, id);  // sequence 0's (mask 2)
  for (int32_t id : {0, 64, 65, 499}) allow(0, id);              // sequence 1's (mask 1)

  shm::BatchDesc d = put(0, s);
  auto in = channel_->inputArena(0);
  uint64_t off = d.blocks_offset + shm::llmAlignUp(s.blocks.size() * 4);
  d.state_offset = off;
  d.num_state = static_cast<uint32_t>(state.size());
  std::memcpy(in.data() + off, state.data(), state.size() * 4);
  off += shm::llmAlignUp(state.size() * 4);
  d.seqlens_offset = off;
  std::memcpy(in.data() + off, masks.data(), masks.size() * 4);
  shm::Completion c = submitAndWait(d);
  ASSERT_EQ(c.status_code, 0) << c.message;
  ASSERT_EQ(c.rows, 3u);
  ASSERT_EQ(c.cols, shm::kLlmLogprobsCols);
  std::vector<int32_t> got(3);
  std::vector<llm::LlmTokenLogprobs> got_lp(3);
  std::memcpy(got.data(), channel_->outputArena(0).data(), 12);
  std::memcpy(got_lp.data(), channel_->outputArena(0).data() + 12, sizeof(llm::LlmTokenLogprobs) * 3);

  LlmStep step{s.seqs, s.tokens, s.blocks, state, masks, static_cast<int64_t>(words)};
  ASSERT_TRUE(models_[1]->validate(step, *ref_kv_).isOk());
  std::vector<int32_t> want(3, -1);
  std::vector<llm::LlmTokenLogprobs> want_lp(3);
  models_[1]->enqueueStep(step, *ref_kv_, nullptr, want.data(), want_lp.data());
  ASSERT_TRUE(backends_[1]->synchronize().isOk());
  EXPECT_EQ(got, want);
  auto allowed = [&](size_t k, int32_t id) { return (masks[k * words + id / 32] >> (id % 32)) & 1u; };
  EXPECT_TRUE(allowed(1, got[0])) << got[0];
  EXPECT_NE(got[0], 300) << "+100 must not bring back a forbidden id";
  EXPECT_TRUE(allowed(0, got[1])) << got[1];
  EXPECT_EQ(got_lp[0].num_top, 3);
  EXPECT_EQ(got_lp[0].logprob, want_lp[0].logprob);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(got_lp[0].top_ids[j], want_lp[0].top_ids[j]);
  EXPECT_EQ(got_lp[1].num_top, -1);
  EXPECT_EQ(got_lp[2].num_top, -1);

  // Malformed: a mask_index on a sequence that does not sample; masks past the input arena.
  Step bad = s;
  bad.seqs = {seq(0, 4, 4, 0, 2, false, greedy)};
  bad.seqs[0].mask_index = 1;
  bad.tokens = {1, 2, 3, 4};
  bad.blocks = {5, 8};
  shm::BatchDesc bd = put(1, bad);
  bd.seqlens_offset = bd.blocks_offset + 8;
  expectRejected(bd, StatusCode::kInvalidArgument, "mask_index");
  Step far = bad;
  far.seqs[0].sample = 1;
  shm::BatchDesc fd = put(2, far);
  fd.seqlens_offset = kInputBytes - 8;
  expectRejected(fd, StatusCode::kInvalidArgument, "token masks");
}

// [TAG_LATE_MASKS] A step whose masks come late: two sampled sequences with masks (a drawn one
// and a greedy one). The step is launched with the masks unwritten; it does not complete while
// they are pending (the forward pass ran, the draw waits); once they are written and published
// it completes with the ids the reference draws from the same masks given up front.
struct LateMaskStep {
  Step step;
  std::vector<uint32_t> masks;
};
LateMaskStep lateMaskStep() {
  const size_t words = shm::llmMaskWords(512);
  SamplingParams drawn;
  drawn.temperature = 0.9f;
  drawn.seed = 5;
  SamplingParams greedy;
  LateMaskStep l;
  l.step.seqs = {seq(0, 4, 0, 0, 1, true, drawn), seq(4, 3, 0, 1, 1, true, greedy)};
  l.step.seqs[0].mask_index = 1;
  l.step.seqs[1].mask_index = 2;
  l.step.tokens = {10, 20, 30, 40, 11, 12, 13};
  l.step.blocks = {5, 6};
  l.masks.assign(2 * words, 0);
  auto allow = [&](size_t k, int32_t id) { l.masks[k * words + id / 32] |= 1u << (id % 32); };
  for (int32_t id : {3, 17, 40, 100, 257, 511}) allow(0, id);
  for (int32_t id : {0, 64, 65, 499}) allow(1, id);
  return l;
}

TEST_F(LlmRunnerTest, LateMasksAreAwaitedBeforeTheDraw) {
  const LateMaskStep l = lateMaskStep();
  shm::BatchDesc d = put(0, l.step);
  auto in = channel_->inputArena(0);
  d.seqlens_offset = d.blocks_offset + shm::llmAlignUp(l.step.blocks.size() * 4);
  d.flags = shm::kBatchLateMasks;
  std::byte* region = in.data() + d.seqlens_offset;
  shm::initLateMasks(region);
  ASSERT_TRUE(channel_->trySubmit(d));
  ASSERT_TRUE(loop_->step(1s));
  EXPECT_FALSE(channel_->waitCompletion(300ms).has_value()) << "sampled before its masks came";
  EXPECT_EQ(shm::lateMaskState(region), shm::kLateMasksPending);
  std::memcpy(region + shm::kLateMaskHeaderBytes, l.masks.data(), l.masks.size() * 4);
  ASSERT_TRUE(shm::publishLateMasks(region));
  auto c = channel_->waitCompletion(20s);
  ASSERT_TRUE(c.has_value());
  ASSERT_EQ(c->status_code, 0) << c->message;
  ASSERT_EQ(c->rows, 2u);
  std::vector<int32_t> got(2);
  std::memcpy(got.data(), channel_->outputArena(0).data(), 8);

  const size_t words = shm::llmMaskWords(512);
  LlmStep step{l.step.seqs, l.step.tokens, l.step.blocks, {}, l.masks,
               static_cast<int64_t>(words)};
  ASSERT_TRUE(models_[1]->validate(step, *ref_kv_).isOk());
  std::vector<int32_t> want(2, -1);
  models_[1]->enqueueStep(step, *ref_kv_, nullptr, want.data());
  ASSERT_TRUE(backends_[1]->synchronize().isOk());
  EXPECT_EQ(got, want);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_TRUE((l.masks[k * words + got[k] / 32] >> (got[k] % 32)) & 1u) << k << ": " << got[k];
  }

  // The flag without a masked sequence, and unknown flag bits, are refused.
  Step plain = l.step;
  for (auto& q : plain.seqs) q.mask_index = 0;
  shm::BatchDesc bd = put(1, plain);
  bd.seqlens_offset = d.seqlens_offset;
  bd.flags = shm::kBatchLateMasks;
  expectRejected(bd, StatusCode::kInvalidArgument, "no sequence has a mask_index");
  bd = put(1, plain);
  bd.flags = 1u << 7;
  expectRejected(bd, StatusCode::kInvalidArgument, "unknown bits");
}

// [TAG_LATE_MASKS] Masks that never come: after late_mask_timeout the step draws without them
// (the same ids as the reference without masks) and the region is marked abandoned, so tulip's
// publish fails and it knows the draws were not constrained.
class LlmRunnerShortLateTimeoutTest : public LlmRunnerTest {
 protected:
  void SetUp() override {
    late_mask_timeout_ = std::chrono::milliseconds(200);
    LlmRunnerTest::SetUp();
  }
};

TEST_F(LlmRunnerShortLateTimeoutTest, MasksThatNeverComeAreAbandoned) {
  const LateMaskStep l = lateMaskStep();
  shm::BatchDesc d = put(0, l.step);
  d.seqlens_offset = d.blocks_offset + shm::llmAlignUp(l.step.blocks.size() * 4);
  d.flags = shm::kBatchLateMasks;
  std::byte* region = channel_->inputArena(0).data() + d.seqlens_offset;
  shm::initLateMasks(region);
  const auto t0 = std::chrono::steady_clock::now();
  shm::Completion c = submitAndWait(d);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));
  ASSERT_EQ(c.status_code, 0) << c.message;
  ASSERT_EQ(c.rows, 2u);
  EXPECT_EQ(shm::lateMaskState(region), shm::kLateMasksAbandoned);
  EXPECT_FALSE(shm::publishLateMasks(region));
  std::vector<int32_t> got(2);
  std::memcpy(got.data(), channel_->outputArena(0).data(), 8);
  Step unmasked = l.step;
  for (auto& q : unmasked.seqs) q.mask_index = 0;
  EXPECT_EQ(got, refStep(unmasked));
  // ... which the masks would have forbidden (so the test tells the two apart).
  const size_t words = shm::llmMaskWords(512);
  EXPECT_FALSE((l.masks[words + got[1] / 32] >> (got[1] % 32)) & 1u) << got[1];
}

// The fixture checkpoint on a one-thread CPU backend, small limits: for LlmRunner::create's checks.
struct TinyModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LlmOps> ops;
  std::unique_ptr<GptOssModel> model;
};
TinyModel tinyModel() {
  TinyModel t;
  t.backend = std::move(makeBackend("cpu", BackendOptions{1, 0, 16})).value();
  t.ops = std::move(makeLlmOps(*t.backend, 1)).value();
  GptOssOptions go;
  go.max_batch_tokens = 16;
  go.max_seqs = 2;
  go.max_logits_rows = 2;
  go.max_model_len = 32;
  t.model = std::move(GptOssModel::load(fixtureDir(), *t.backend, *t.ops, go)).value();
  return t;
}

// [TAG_LATE_MASKS] --late-masks: auto announces what the backend verified (the CPU: yes), off
// never, on wherever the step path implements them.
TEST(LlmRunnerCreate, LateMasksOptionDecidesTheCapability) {
  TinyModel t = tinyModel();
  Backend* backend = t.backend.get();
  GptOssModel* model = t.model.get();
  using LM = LlmRunnerOptions::LateMasks;
  for (auto [mode, want] : {std::pair{LM::kAuto, true}, std::pair{LM::kOn, true},
                            std::pair{LM::kOff, false}}) {
    LlmRunnerOptions ro;
    ro.kv_num_blocks = 8;
    ro.max_seqs = 2;
    ro.max_batch_tokens = 16;
    ro.late_masks = mode;
    auto r = LlmRunner::create(*backend, *model, ro);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_EQ(((*r)->facts().llm_caps & shm::kLlmCapLateMask) != 0, want)
        << static_cast<int>(mode);
    EXPECT_NE((*r)->facts().llm_caps & shm::kLlmCapTokenMask, 0u);
  }
}

TEST(LlmRunnerCreate, BadOptionsAreClearErrors) {
  auto ch = shm::Channel::create("/rose-llm-runner-create-" + std::to_string(getpid()),
                                 shm::Layout{2, 4096, 4096});
  ASSERT_TRUE(ch.isOk());
  TinyModel t = tinyModel();
  Backend* backend = t.backend.get();
  GptOssModel* model = t.model.get();
  LlmRunnerOptions ro;
  ro.kv_num_blocks = 0;
  auto r = LlmRunner::create(*backend, *model, ro);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("kv_num_blocks"), std::string::npos);
  ro.kv_num_blocks = 8;
  ro.eos_ids = {512};
  r = LlmRunner::create(*backend, *model, ro);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("eos id 512"), std::string::npos);
  ro.eos_ids = {1, 2, 3, 4, 5};
  r = LlmRunner::create(*backend, *model, ro);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  ro.eos_ids = {};
  ro.max_seqs = 2000;  // 8000 bytes of ids > the 4096-byte output arena
  r = LlmRunner::create(*backend, *model, ro);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  auto loop = StepLoop::create(*ch, *backend, **r, StepLoopOptions{});
  EXPECT_EQ(loop.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loop.status().message().find("output arena"), std::string::npos);
  ro.max_seqs = 2;
  r = LlmRunner::create(*backend, *model, ro);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  loop = StepLoop::create(*ch, *backend, **r, StepLoopOptions{});
  EXPECT_TRUE(loop.isOk()) << loop.status().toString();
}

// ---- checkpoint files ----

struct TempDir {
  fs::path path;
  TempDir() {
    char t[] = "/tmp/llm_runner_test_XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
  }
};

TEST(LlmCheckpointFiles, KindDetection) {
  EXPECT_TRUE(isGptOssCheckpoint(fixtureDir()).value());
  EXPECT_FALSE(
      isGptOssCheckpoint((sourceDir() / "tests/conformance/qwen3/fixtures").string()).value());
  TempDir t;
  t.write("config.json", R"({"architectures": ["GptOssForCausalLM"]})");
  EXPECT_TRUE(isGptOssCheckpoint(t.path.string()).value());
  t.write("config.json", R"({"model_type": "qwen3", "architectures": ["Qwen3Model"]})");
  EXPECT_FALSE(isGptOssCheckpoint(t.path.string()).value());
  t.write("config.json", "{not json");
  EXPECT_EQ(isGptOssCheckpoint(t.path.string()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(isGptOssCheckpoint((t.path / "missing").string()).status().code(),
            StatusCode::kNotFound);
}

TEST(LlmCheckpointFiles, EosIdsFromGenerationConfigElseConfig) {
  // The fixture has eos_token_id null and no generation_config.json.
  EXPECT_TRUE(loadEosIds(fixtureDir()).value().empty());
  TempDir t;
  t.write("config.json", R"({"eos_token_id": 200002})");
  EXPECT_EQ(loadEosIds(t.path.string()).value(), (std::vector<int32_t>{200002}));
  t.write("generation_config.json",
          R"({"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012, 200002]})");
  EXPECT_EQ(loadEosIds(t.path.string()).value(), (std::vector<int32_t>{200002, 199999, 200012}));
  t.write("generation_config.json", R"({"eos_token_id": 200012})");
  EXPECT_EQ(loadEosIds(t.path.string()).value(), (std::vector<int32_t>{200012}));
  // No eos in generation_config.json: config.json's.
  t.write("generation_config.json", R"({"do_sample": true})");
  EXPECT_EQ(loadEosIds(t.path.string()).value(), (std::vector<int32_t>{200002}));
  t.write("generation_config.json", R"({"eos_token_id": [1, 2, 3, 4, 5]})");
  auto r = loadEosIds(t.path.string());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("at most 4"), std::string::npos) << r.status().toString();
  t.write("generation_config.json", R"({"eos_token_id": "x"})");
  r = loadEosIds(t.path.string());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("generation_config.json: eos_token_id"), std::string::npos)
      << r.status().toString();
}

}  // namespace
}  // namespace garden::rose
