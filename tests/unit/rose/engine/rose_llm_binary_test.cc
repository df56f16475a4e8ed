// The `rose` binary on a gpt-oss checkpoint (rose-mkmodel's tiny one, real o200k_harmony vocab
// size): as a sidecar (--create-shm) it announces kind "llm", its KV cache and the checkpoint's
// eos ids, serves a kGenerate step with the ids a directly driven GptOssModel samples, and stops
// cleanly on SIGTERM; spawned on a channel it sizes the KV cache from --kv-cache-mb; on a machine
// without a GPU --device cuda fails with a clear state; bad KV / expert flags exit 2.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/shm/channel.h"
#include "common/shm/llm_batch.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/ops/backend.h"
#include "services/rose/tools/mkmodel_gpt_oss.h"
#include "tests/support/child_process.h"

namespace garden::rose {
namespace {

using namespace std::chrono_literals;

std::string roseBin() { return garden::testing::builtBinary("services/rose/rose"); }
namespace fs = std::filesystem;

bool waitState(shm::Channel& ch, shm::WorkerState s, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (ch.state() == s) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// One tiny gpt-oss checkpoint for the whole suite (written once, ~26 MB).
class RoseLlmBinary : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char t[] = "/tmp/rose_llm_binary_XXXXXX";
    dir_ = new fs::path(mkdtemp(t));
    MkGptOssOptions o;
    o.out_dir = (*dir_ / "tiny-gpt-oss").string();
    o.seed = 3;
    Status st = makeGptOssModel(o);
    ASSERT_TRUE(st.isOk()) << st.toString();
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  static std::string modelDir() { return (*dir_ / "tiny-gpt-oss").string(); }
  static fs::path* dir_;
};
fs::path* RoseLlmBinary::dir_ = nullptr;

// SIGTERM, then rose exits 0 within 15 s.
void stopCleanly(pid_t pid) {
  kill(pid, SIGTERM);
  const int st = garden::testing::waitChildExit(pid, 15s);
  ASSERT_NE(st, -1) << "rose did not exit on SIGTERM";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
}

TEST_F(RoseLlmBinary, SidecarAnnouncesTheLlmAndServesAStep) {
  const std::string name = garden::testing::uniqueShmName("/rose-llm-bin-", "sidecar");
  pid_t pid = garden::testing::spawnChild({roseBin(),
                                           "--model",
                                           modelDir(),
                                           "--shm-name",
                                           name,
                                           "--create-shm",
                                           "--depth",
                                           "2",
                                           "--threads",
                                           "1",
                                           "--max-batch-tokens",
                                           "64",
                                           "--kv-blocks",
                                           "40",
                                           "--kv-block-size",
                                           "16",
                                           "--max-model-len",
                                           "256",
                                           "--max-seqs",
                                           "8"});
  ASSERT_GT(pid, 0);
  std::optional<shm::Channel> ch;
  const auto end = std::chrono::steady_clock::now() + 60s;
  while (!ch && std::chrono::steady_clock::now() < end) {
    auto a = shm::Channel::attach(name);
    if (a.isOk() && a->state() == shm::WorkerState::kReady) {
      ch.emplace(std::move(a).value());
    } else {
      std::this_thread::sleep_for(20ms);
    }
  }
  ASSERT_TRUE(ch.has_value()) << "sidecar rose did not create a ready channel";
  const shm::ModelFacts f = ch->modelFacts();
  EXPECT_STREQ(f.kind, "llm");
  EXPECT_STREQ(f.name, "tiny-gpt-oss");
  EXPECT_EQ(f.vocab_size, 201088u);
  EXPECT_EQ(f.hidden_size, 32u);
  EXPECT_EQ(f.max_seq_len, 256u);
  EXPECT_EQ(f.max_batch_tokens, 64u);
  EXPECT_EQ(f.max_seqs, 8u);
  EXPECT_EQ(f.kv_num_blocks, 40u);
  EXPECT_EQ(f.kv_block_size, 16u);
  // [TAG_KV_WINDOW_GROUP] The sliding layer (window 8) in a pool of its own, auto-sized on the
  // cpu: 2 x (max_seqs 8 x (ceil(7 / 16) + 2) + ceil(64 / 16)) blocks.
  EXPECT_EQ(f.kv_num_blocks_window, 56u);
  EXPECT_EQ(f.kv_window, 8u);
  // generation_config.json as published: <|return|>, <|endoftext|>, <|call|>.
  EXPECT_EQ(f.eos_ids[0], 200002);
  EXPECT_EQ(f.eos_ids[1], 199999);
  EXPECT_EQ(f.eos_ids[2], 200012);
  EXPECT_EQ(f.eos_ids[3], -1);
  EXPECT_EQ(ch->layout().slots, 2u);
  // Input arena sized for max_seqs sequences of max_model_len tokens (a block table and a window
  // table each), plus one whole sampler-state reload [TAG_LLM_SAMPLER_STATE].
  EXPECT_EQ(ch->layout().input_bytes,
            shm::llmStepBytes(8, 64, 2 * 8 * 16, 256 + 2 * llm::kMaxLogitBias));

  // One step: a Harmony-looking prompt (greedy) and a seeded second sequence.
  const std::vector<int32_t> tokens = {200006, 1428,   200008, 12194, 200007,
                                       200006, 173781, 9,      8,     7};
  std::vector<llm::LlmStepSeq> seqs(2);
  seqs[0].token_offset = 0;
  seqs[0].num_tokens = 7;
  seqs[0].num_blocks = 1;
  seqs[0].block_offset = 0;
  seqs[0].sample = 1;
  seqs[0].window_table = 1;
  seqs[1].token_offset = 7;
  seqs[1].num_tokens = 3;
  seqs[1].block_offset = 2;
  seqs[1].num_blocks = 1;
  seqs[1].sample = 1;
  seqs[1].sampling.temperature = 1.0f;
  seqs[1].sampling.seed = 99;
  seqs[1].window_table = 1;
  // Each block table followed by its window table (ids of the window pool).
  const std::vector<int32_t> blocks = {39, 55, 4, 0};
  // The three arrays back to back, each 8-byte aligned (offsets from the struct size, which grows
  // with the channel version).
  const uint64_t tokens_offset = shm::llmAlignUp(seqs.size() * sizeof(llm::LlmStepSeq));
  const uint64_t blocks_offset = tokens_offset + shm::llmAlignUp(tokens.size() * 4);
  auto in = ch->inputArena(1);
  std::memcpy(in.data(), seqs.data(), seqs.size() * sizeof(llm::LlmStepSeq));
  std::memcpy(in.data() + tokens_offset, tokens.data(), tokens.size() * 4);
  std::memcpy(in.data() + blocks_offset, blocks.data(), blocks.size() * 4);
  shm::BatchDesc d;
  d.batch_id = 42;
  d.slot = 1;
  d.kind = shm::BatchKind::kGenerate;
  d.num_seqs = 2;
  d.num_tokens = 10;
  d.num_blocks = 4;
  d.seqs_offset = 0;
  d.tokens_offset = tokens_offset;
  d.blocks_offset = blocks_offset;
  ASSERT_TRUE(ch->trySubmit(d));
  auto c = ch->waitCompletion(30s);
  ASSERT_TRUE(c.has_value());
  ASSERT_EQ(c->status_code, 0) << c->message;
  EXPECT_EQ(c->batch_id, 42u);
  ASSERT_EQ(c->rows, 2u);
  EXPECT_EQ(c->cols, 1u);
  std::vector<int32_t> got(2);
  std::memcpy(got.data(), ch->outputArena(1).data(), 8);

  // The same step on the model driven directly, every layer in one pool: the same tokens.
  auto backend = std::move(makeBackend("cpu", BackendOptions{1, 0, 64})).value();
  auto ops = std::move(makeLlmOps(*backend, 1)).value();
  GptOssOptions go;
  go.max_batch_tokens = 64;
  go.max_seqs = 8;
  go.max_logits_rows = 8;
  go.max_model_len = 256;
  auto model = std::move(GptOssModel::load(modelDir(), *backend, *ops, go)).value();
  auto kv =
      std::move(PagedKvCache::create(*backend, model->kvShape(40, 16), model->kvDType())).value();
  std::vector<llm::LlmStepSeq> plain = seqs;
  plain[1].block_offset = 1;
  for (auto& sq : plain) sq.window_table = 0;
  const std::vector<int32_t> plain_blocks = {39, 4};
  LlmStep step{plain, tokens, plain_blocks};
  ASSERT_TRUE(model->validate(step, *kv).isOk());
  std::vector<int32_t> want(2, -1);
  model->enqueueStep(step, *kv, nullptr, want.data());
  ASSERT_TRUE(backend->synchronize().isOk());
  EXPECT_EQ(got, want);

  // An embedding batch is refused by name.
  shm::BatchDesc e;
  e.batch_id = 43;
  e.slot = 0;
  e.kind = shm::BatchKind::kEmbed;
  e.num_seqs = 1;
  e.num_tokens = 1;
  ASSERT_TRUE(ch->trySubmit(e));
  c = ch->waitCompletion(30s);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->status_code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(c->message).find("serves an llm"), std::string::npos) << c->message;

  EXPECT_FALSE(ch->heartbeatStale(2s));
  stopCleanly(pid);
}

TEST_F(RoseLlmBinary, SpawnedSizesTheKvCacheFromMegabytes) {
  // [TAG_KV_WINDOW_GROUP] Blocks of K and V x 1 layer x 8 tokens x 2 kv heads x 64 dims x 4 bytes
  // (f32 on cpu), the same size in both pools (one sliding layer, one full).
  constexpr uint32_t kBlockBytes = 2 * 1 * 8 * 2 * 64 * 4;
  for (const char* mb : {"1", "8"}) {
    SCOPED_TRACE(std::string(mb) + " MiB");
    const std::string name = garden::testing::uniqueShmName("/rose-llm-bin-", "spawned");
    auto ch = shm::Channel::create(name, shm::Layout{2, 8192, 4096});
    ASSERT_TRUE(ch.isOk()) << ch.status().toString();
    pid_t pid = garden::testing::spawnChild({roseBin(), "--model", modelDir(), "--shm-name", name,
                                             "--threads", "1", "--max-batch-tokens", "32",
                                             "--kv-cache-mb", mb, "--kv-block-size", "8",
                                             "--max-model-len", "128", "--max-seqs", "4"});
    ASSERT_GT(pid, 0);
    ASSERT_TRUE(waitState(*ch, shm::WorkerState::kReady, 60s)) << "rose did not become ready";
    EXPECT_EQ(ch->workerPid(), pid);
    const shm::ModelFacts f = ch->modelFacts();
    EXPECT_STREQ(f.kind, "llm");
    const uint32_t budget = static_cast<uint32_t>(std::stoi(mb)) << 20;
    if (std::string(mb) == "1") {
      // The running sequences' share decides: 2 x (4 seqs x (ceil(7 / 8) + 2) + ceil(32 / 8)) =
      // 32 window blocks (more than 1/8 of the full pool); the full pool takes the rest.
      EXPECT_EQ(f.kv_num_blocks_window, 32u);
      EXPECT_EQ(f.kv_num_blocks, (budget - 32 * kBlockBytes) / kBlockBytes);
    } else {
      // One window block per 8 full blocks decides: full x (1 + 1/8) blocks = 1024 blocks of
      // budget, full = 910, window = 910 / 8 = 113; the full pool takes the rest (911).
      EXPECT_EQ(f.kv_num_blocks_window, 113u);
      EXPECT_EQ(f.kv_num_blocks, (budget - 113 * kBlockBytes) / kBlockBytes);
    }
    EXPECT_EQ(f.kv_window, 8u);
    EXPECT_EQ(f.kv_block_size, 8u);
    EXPECT_EQ(f.max_seq_len, 128u);
    stopCleanly(pid);
    EXPECT_EQ(ch->state(), shm::WorkerState::kStopping);
  }
}

// [TAG_KV_WINDOW_GROUP] A window pool smaller than one sequence's largest chunk reads
// (ceil((8 - 1 + 32) / 8) + 1 = 6 blocks) cannot start: exit 1, state kFailed; --kv-window-blocks
// 0 keeps every layer in the one pool.
TEST_F(RoseLlmBinary, WindowPoolTooSmallFailsAndZeroTurnsItOff) {
  for (const char* blocks : {"5", "0"}) {
    SCOPED_TRACE(blocks);
    const std::string name = garden::testing::uniqueShmName("/rose-llm-bin-", "window");
    auto ch = shm::Channel::create(name, shm::Layout{2, 8192, 4096});
    ASSERT_TRUE(ch.isOk()) << ch.status().toString();
    pid_t pid = garden::testing::spawnChild(
        {roseBin(), "--model", modelDir(), "--shm-name", name, "--threads", "1",
         "--max-batch-tokens", "32", "--kv-blocks", "20", "--kv-block-size", "8",
         "--max-model-len", "128", "--max-seqs", "4", "--kv-window-blocks", blocks,
         "--log-level", "error"});
    ASSERT_GT(pid, 0);
    if (std::string(blocks) == "5") {
      int st = garden::testing::waitChildExit(pid, 30s);
      ASSERT_NE(st, -1) << "rose did not exit";
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st;
      EXPECT_EQ(ch->state(), shm::WorkerState::kFailed);
      continue;
    }
    ASSERT_TRUE(waitState(*ch, shm::WorkerState::kReady, 60s)) << "rose did not become ready";
    const shm::ModelFacts f = ch->modelFacts();
    EXPECT_EQ(f.kv_num_blocks, 20u);
    EXPECT_EQ(f.kv_num_blocks_window, 0u);
    EXPECT_EQ(f.kv_window, 0u);
    stopCleanly(pid);
  }
}

// Without a GPU (CI, the development machines) --device cuda cannot start: exit 1, state kFailed.
TEST_F(RoseLlmBinary, CudaDeviceWithoutAGpuFailsClearly) {
  const std::string name = garden::testing::uniqueShmName("/rose-llm-bin-", "cuda");
  auto ch = shm::Channel::create(name, shm::Layout{2, 8192, 4096});
  ASSERT_TRUE(ch.isOk()) << ch.status().toString();
  pid_t pid = garden::testing::spawnChild({roseBin(), "--model", modelDir(), "--shm-name", name,
                                           "--device", "cuda", "--log-level", "error"});
  ASSERT_GT(pid, 0);
  int st = garden::testing::waitChildExit(pid, 30s);
  ASSERT_NE(st, -1) << "rose did not exit";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st;
  EXPECT_EQ(ch->state(), shm::WorkerState::kFailed);
}

TEST_F(RoseLlmBinary, BadKvFlagsExitTwo) {
  const std::string name = garden::testing::uniqueShmName("/rose-llm-bin-", "flags");
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--kv-block-size", "0"},
        std::vector<std::string>{"--kv-blocks=-1"},
        std::vector<std::string>{"--kv-blocks", "0", "--kv-cache-mb=-1"},
        std::vector<std::string>{"--kv-cache-fraction", "0"},
        std::vector<std::string>{"--kv-cache-fraction", "1.5"},
        std::vector<std::string>{"--moe-weights", "fp4"},
        std::vector<std::string>{"--late-masks", "maybe"},
        std::vector<std::string>{"--dtype", "float32"},
        std::vector<std::string>{"--kv-window-blocks=-2"},
        std::vector<std::string>{"--attn-prefill", "wgmma"},
        std::vector<std::string>{"--moe-prefill", "lt"},
        std::vector<std::string>{"--attn-prefill", "sm90", "--kv-block-size", "12"},
        std::vector<std::string>{"--cuda-device", "0"},  // needs --device cuda
        std::vector<std::string>{"--cuda-device=-2"}}) {
    std::vector<std::string> args = {roseBin(),    "--model", modelDir(),
                                     "--shm-name", name,      "--create-shm"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_t pid = garden::testing::spawnChild(args);
    ASSERT_GT(pid, 0);
    int st = garden::testing::waitChildExit(pid, 30s);
    ASSERT_NE(st, -1);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << extra[0] << " status " << st;
  }
}

}  // namespace
}  // namespace garden::rose
