// The rose binary over rank processes (--tp/--dp/--ep, services/rose/parallel/rank_runtime.h),
// driven through its shared-memory channel exactly as tulip drives it (rose spawned on a channel
// the test created):
//   - every layout serves the same sampled tokens as the unsharded GptOssModel (driven directly
//     in this process): a batched prefill of three sequences, then decode steps — greedy with
//     top logprobs, greedy with a presence penalty and a logit bias from a sampler-state reload,
//     seeded temperature 1 with min_p; ModelFacts announce tulip's whole block-id space and the
//     sampler-state capability (rank 0 samples);
//   - supervision: kill -9 of a follower rank, or SIGSTOP of one, fails rose at once (exit 1,
//     channel kFailed) and leaves no rank process behind; kill -9 of rank 0 takes the others
//     with it; a layout the model cannot hold fails at start with no rank left.
// The tiny model (rose-mkmodel's writer): 4 q / 2 kv heads, 4 experts top-2, intermediate 64
// (two 32-column units, so 2 ranks can split the experts' columns).

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/shm/channel.h"
#include "common/shm/llm_batch.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/ops/backend.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/tools/mkmodel_gpt_oss.h"
#include "tests/support/child_process.h"

namespace garden::rose {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr int32_t kBlock = 4;
constexpr int32_t kKvBlocks = 32;  // tulip's ids; with --dp 2 each group caches 16
constexpr int kDecodeSteps = 10;

std::string roseBin() { return garden::testing::builtBinary("services/rose/rose"); }

// (pid, parent pid, state) of every process.
struct Proc {
  pid_t pid, ppid;
  char state;
};
std::vector<Proc> processes() {
  std::vector<Proc> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    Proc p{pid, 0, '?'};
    rest >> p.state >> p.ppid;
    out.push_back(p);
  }
  closedir(d);
  return out;
}
std::vector<pid_t> childrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const Proc& p : processes()) {
    if (p.ppid == parent) out.push_back(p.pid);
  }
  return out;
}
// Gone, or a zombie some other reaper (init) has not collected yet: nothing runs.
bool processGone(pid_t pid) {
  for (const Proc& p : processes()) {
    if (p.pid == pid) return p.state == 'Z';
  }
  return true;
}
bool waitGone(pid_t pid, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (processGone(pid)) return true;
    std::this_thread::sleep_for(10ms);
  }
  return processGone(pid);
}

// One sequence of the test's workload: its prompt, its blocks (ids inside one dp group of
// 16), its sampling; with a state slot, the prefill reloads it [TAG_LLM_SAMPLER_STATE] (the
// prompt tokens and one logit bias).
struct Seq {
  std::vector<int32_t> tokens;  // prompt, then what was sampled
  int32_t first_block;
  llm::SamplingParams sampling;
  size_t prompt_len = 0;
};

std::vector<Seq> workload() {
  auto prompt = [](int32_t n, int32_t start) {
    std::vector<int32_t> v;
    for (int32_t i = 0; i < n; ++i) v.push_back(start + 7919 * i);
    return v;
  };
  // Blocks: seq 0 in dp group 0 ([0, 16)), seqs 1 and 2 in group 1 ([16, 32)); 6 blocks each.
  // 0: greedy with 3 top logprobs; 1: greedy with a presence penalty and a logit bias (state
  // slot 1); 2: temperature 1, seeded, min_p.
  std::vector<Seq> seqs(3);
  seqs[0].tokens = prompt(5, 11);
  seqs[0].first_block = 2;
  seqs[0].sampling.logprobs = 3;
  seqs[1].tokens = prompt(9, 3001);
  seqs[1].first_block = 17;
  seqs[1].sampling.presence_penalty = 1.5f;
  seqs[1].sampling.state_slot = 1;
  seqs[2].tokens = prompt(6, 150);
  seqs[2].first_block = 24;
  seqs[2].sampling.temperature = 1.f;
  seqs[2].sampling.seed = 99;
  seqs[2].sampling.min_p = 0.05f;
  for (Seq& q : seqs) q.prompt_len = q.tokens.size();
  return seqs;
}

// One step over `seqs`: a prefill of every prompt when `prefill`, else one decode token each.
// `window`: each table followed by its window table [TAG_KV_WINDOW_GROUP] for a rose started
// with --kv-window-blocks 32 (the model's window is 8 keys): -1 for blocks the step's first
// query no longer reads, else the block's id rotated by 5 inside its 16-id half (a dp group of
// --dp 2, half of the one group otherwise).
struct StepArrays {
  std::vector<llm::LlmStepSeq> seqs;
  std::vector<int32_t> tokens, blocks, state;
};
StepArrays makeStep(const std::vector<Seq>& seqs, bool prefill, bool window = true) {
  StepArrays s;
  for (const Seq& q : seqs) {
    llm::LlmStepSeq d;
    const int32_t len = static_cast<int32_t>(q.tokens.size());
    d.token_offset = static_cast<int32_t>(s.tokens.size());
    d.num_tokens = prefill ? len : 1;
    d.position = prefill ? 0 : len - 1;
    d.block_offset = static_cast<int32_t>(s.blocks.size());
    d.num_blocks = (len + kBlock - 1) / kBlock;
    d.sample = 1;
    d.sampling = q.sampling;
    if (prefill && q.sampling.state_slot >= 0) {
      d.state_offset = static_cast<int32_t>(s.state.size());
      d.state_prompt = static_cast<int32_t>(q.prompt_len);
      d.state_bias = 1;
      s.state.insert(s.state.end(), q.tokens.begin(), q.tokens.begin() + q.prompt_len);
      const float bias = 0.75f;
      int32_t bits;
      std::memcpy(&bits, &bias, 4);
      s.state.insert(s.state.end(), {q.tokens[0], bits});
    }
    for (int32_t i = prefill ? 0 : len - 1; i < len; ++i) s.tokens.push_back(q.tokens[i]);
    for (int32_t b = 0; b < d.num_blocks; ++b) s.blocks.push_back(q.first_block + b);
    if (window) {
      d.window_table = 1;
      for (int32_t b = 0; b < d.num_blocks; ++b) {
        const int32_t id = q.first_block + b;
        const bool dropped = (b + 1) * kBlock <= d.position - 8 + 1;
        s.blocks.push_back(dropped ? -1 : id / 16 * 16 + (id % 16 + 5) % 16);
      }
    }
    s.seqs.push_back(d);
  }
  return s;
}

class RoseRanks : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char t[] = "/tmp/rose_ranks_XXXXXX";
    dir_ = new fs::path(mkdtemp(t));
    MkGptOssOptions o;
    o.out_dir = modelDir();
    o.seed = 5;
    o.intermediate_size = 64;
    Status st = makeGptOssModel(o);
    ASSERT_TRUE(st.isOk()) << st.toString();
    reference_lps_ = new std::vector<std::vector<llm::LlmTokenLogprobs>>();
    reference_ = new std::vector<std::vector<int32_t>>(referenceTokens());
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
    delete reference_;
    delete reference_lps_;
  }
  static std::string modelDir() { return (*dir_ / "gpt-oss").string(); }

  // The unsharded model in this process: sampled ids per step (and logprob records).
  static std::vector<std::vector<int32_t>> referenceTokens() {
    auto backend = std::move(makeBackend("cpu", BackendOptions{1, 0, 64})).value();
    auto ops = std::move(makeLlmOps(*backend, 1)).value();
    GptOssOptions go;
    go.max_batch_tokens = 32;
    go.max_seqs = 4;
    go.max_logits_rows = 4;
    go.max_model_len = 64;
    go.min_block_size = kBlock;
    auto model = std::move(GptOssModel::load(modelDir(), *backend, *ops, go)).value();
    auto kv = std::move(PagedKvCache::create(*backend, model->kvShape(kKvBlocks, kBlock),
                                             model->kvDType()))
                  .value();
    std::vector<Seq> seqs = workload();
    std::vector<std::vector<int32_t>> out;
    for (int step = 0; step <= kDecodeSteps; ++step) {
      const StepArrays a = makeStep(seqs, step == 0, /*window=*/false);
      const LlmStep s{a.seqs, a.tokens, a.blocks, a.state};
      Status v = model->validate(s, *kv);
      EXPECT_TRUE(v.isOk()) << v.toString();
      std::vector<int32_t> ids(seqs.size(), -1);
      std::vector<llm::LlmTokenLogprobs> lps(seqs.size());
      backend->launch([&] { model->enqueueStep(s, *kv, nullptr, ids.data(), lps.data()); });
      EXPECT_TRUE(backend->synchronize().isOk());
      reference_lps_->push_back(lps);
      for (size_t i = 0; i < seqs.size(); ++i) seqs[i].tokens.push_back(ids[i]);
      out.push_back(ids);
    }
    return out;
  }

  // rose spawned on a fresh channel with `extra` flags; waits for kReady (or exit).
  struct Worker {
    std::string name;
    std::optional<shm::Channel> ch;
    pid_t pid = -1;
  };
  static Worker start(const std::vector<std::string>& extra, bool expect_ready = true) {
    Worker w;
    w.name = garden::testing::uniqueShmName("/rose-ranks-", "w");
    auto ch = shm::Channel::create(w.name, shm::Layout{2, 1 << 16, 4096});
    EXPECT_TRUE(ch.isOk()) << ch.status().toString();
    if (!ch.isOk()) return w;
    w.ch.emplace(std::move(ch).value());
    std::vector<std::string> args = {roseBin(), "--model", modelDir(), "--shm-name", w.name,
                                     "--threads", "1", "--max-batch-tokens", "32",
                                     "--kv-block-size", std::to_string(kBlock),
                                     "--max-model-len", "64", "--max-seqs", "4",
                                     "--log-level", "warn"};
    if (std::find(extra.begin(), extra.end(), "--kv-blocks") == extra.end()) {
      args.insert(args.end(), {"--kv-blocks", std::to_string(kKvBlocks)});
    }
    args.insert(args.end(), {"--kv-window-blocks", "32"});  // makeStep's window tables
    args.insert(args.end(), extra.begin(), extra.end());
    w.pid = garden::testing::spawnChild(args);
    if (!expect_ready) return w;
    const auto end = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < end && w.ch->state() != shm::WorkerState::kReady) {
      int st = 0;
      if (waitpid(w.pid, &st, WNOHANG) == w.pid) {
        ADD_FAILURE() << "rose exited during start, status " << st;
        w.pid = -1;
        return w;
      }
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(w.ch->state(), shm::WorkerState::kReady);
    return w;
  }

  // One step through the channel; the sampled ids (empty on an error completion).
  static std::vector<int32_t> runStep(shm::Channel& ch, const StepArrays& a, uint64_t id,
                                      std::string* error = nullptr,
                                      std::vector<llm::LlmTokenLogprobs>* lps = nullptr) {
    const uint32_t slot = static_cast<uint32_t>(id % 2);
    const uint64_t tokens_off = shm::llmAlignUp(a.seqs.size() * sizeof(llm::LlmStepSeq));
    const uint64_t blocks_off = tokens_off + shm::llmAlignUp(a.tokens.size() * 4);
    const uint64_t state_off = blocks_off + shm::llmAlignUp(a.blocks.size() * 4);
    auto in = ch.inputArena(slot);
    std::memcpy(in.data(), a.seqs.data(), a.seqs.size() * sizeof(llm::LlmStepSeq));
    std::memcpy(in.data() + tokens_off, a.tokens.data(), a.tokens.size() * 4);
    std::memcpy(in.data() + blocks_off, a.blocks.data(), a.blocks.size() * 4);
    if (!a.state.empty()) std::memcpy(in.data() + state_off, a.state.data(), a.state.size() * 4);
    shm::BatchDesc d;
    d.batch_id = id;
    d.slot = slot;
    d.kind = shm::BatchKind::kGenerate;
    d.num_seqs = static_cast<uint32_t>(a.seqs.size());
    d.num_tokens = static_cast<uint32_t>(a.tokens.size());
    d.num_blocks = static_cast<uint32_t>(a.blocks.size());
    d.seqs_offset = 0;
    d.tokens_offset = tokens_off;
    d.blocks_offset = blocks_off;
    d.state_offset = state_off;
    d.num_state = static_cast<uint32_t>(a.state.size());
    EXPECT_TRUE(ch.trySubmit(d));
    auto c = ch.waitCompletion(30s);
    EXPECT_TRUE(c.has_value()) << "no completion for step " << id;
    if (!c) return {};
    EXPECT_EQ(c->batch_id, id);
    if (c->status_code != 0) {
      if (error != nullptr) *error = c->message;
      return {};
    }
    std::vector<int32_t> ids(c->rows);
    std::memcpy(ids.data(), ch.outputArena(slot).data(), ids.size() * 4);
    if (lps != nullptr) {
      lps->assign(ids.size(), llm::LlmTokenLogprobs{});
      if (c->cols == shm::kLlmLogprobsCols) {
        std::memcpy(lps->data(), ch.outputArena(slot).data() + 4 * ids.size(),
                    lps->size() * sizeof(llm::LlmTokenLogprobs));
      }
    }
    return ids;
  }

  static void stop(Worker& w) {
    if (w.pid <= 0) return;
    const std::vector<pid_t> ranks = childrenOf(w.pid);
    kill(w.pid, SIGTERM);
    const int st = garden::testing::waitChildExit(w.pid, 20s);
    ASSERT_NE(st, -1) << "rose did not exit on SIGTERM";
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
    for (pid_t r : ranks) EXPECT_TRUE(processGone(r)) << "rank pid " << r << " left behind";
  }

  static fs::path* dir_;
  static std::vector<std::vector<int32_t>>* reference_;
  static std::vector<std::vector<llm::LlmTokenLogprobs>>* reference_lps_;
};
fs::path* RoseRanks::dir_ = nullptr;
std::vector<std::vector<int32_t>>* RoseRanks::reference_ = nullptr;
std::vector<std::vector<llm::LlmTokenLogprobs>>* RoseRanks::reference_lps_ = nullptr;

struct Layout {
  int32_t tp, dp, ep;
};

class RoseRanksLayout : public RoseRanks, public ::testing::WithParamInterface<Layout> {};

TEST_P(RoseRanksLayout, ServesTheTokensOfOneRank) {
  const Layout l = GetParam();
  Worker w = start({"--tp", std::to_string(l.tp), "--dp", std::to_string(l.dp), "--ep",
                    std::to_string(l.ep)});
  ASSERT_GT(w.pid, 0);
  ASSERT_TRUE(w.ch.has_value());
  EXPECT_EQ(childrenOf(w.pid).size(), static_cast<size_t>(l.tp * l.dp - 1))
      << "one process per rank";
  const shm::ModelFacts f = w.ch->modelFacts();
  EXPECT_STREQ(f.kind, "llm");
  EXPECT_EQ(f.kv_num_blocks, static_cast<uint32_t>(kKvBlocks)) << "tulip's whole id space";
  EXPECT_EQ(f.kv_num_blocks_window, 32u) << "the window pool, tulip's ids too";
  EXPECT_EQ(f.kv_window, 8u);
  EXPECT_NE(f.llm_caps & shm::kLlmCapSamplerState, 0u) << "rank 0's sampler has the state";

  std::vector<Seq> seqs = workload();
  for (int step = 0; step <= kDecodeSteps; ++step) {
    std::string err;
    std::vector<llm::LlmTokenLogprobs> lps;
    const std::vector<int32_t> ids =
        runStep(*w.ch, makeStep(seqs, step == 0), static_cast<uint64_t>(step + 1), &err, &lps);
    ASSERT_EQ(ids, (*reference_)[static_cast<size_t>(step)]) << "step " << step << " " << err;
    // Logprobs (sequence 0 asked for 3): the same ids, values within the sharded sums' rounding.
    const llm::LlmTokenLogprobs& got = lps[0];
    const llm::LlmTokenLogprobs& want = (*reference_lps_)[static_cast<size_t>(step)][0];
    ASSERT_EQ(got.num_top, 3) << "step " << step;
    EXPECT_NEAR(got.logprob, want.logprob, 1e-4) << "step " << step;
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(got.top_ids[k], want.top_ids[k]) << "step " << step << " top " << k;
      EXPECT_NEAR(got.top_logprobs[k], want.top_logprobs[k], 1e-4) << "step " << step;
    }
    EXPECT_EQ(lps[1].num_top, -1);
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i].tokens.push_back(ids[i]);
  }
  // A step the shard cannot run is refused by rank 0 before any rank sees it: a sequence whose
  // blocks straddle two dp groups (with --dp 2).
  std::string err;
  if (l.dp > 1) {
    StepArrays bad = makeStep(workload(), true);
    bad.blocks[bad.seqs[0].block_offset + 1] = 20;  // group 1, the rest of seq 0 in group 0
    EXPECT_TRUE(runStep(*w.ch, bad, 100, &err).empty());
    EXPECT_NE(err.find("dp group"), std::string::npos) << err;
  }
  // And serving goes on.
  const StepArrays again = makeStep(workload(), true);
  EXPECT_EQ(runStep(*w.ch, again, 102), (*reference_)[0]);
  stop(w);
}

INSTANTIATE_TEST_SUITE_P(Layouts, RoseRanksLayout,
                         ::testing::Values(Layout{2, 1, 1}, Layout{2, 1, 2}, Layout{2, 2, 4},
                                           Layout{1, 2, 2}, Layout{1, 2, 1}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return "tp" + std::to_string(i.param.tp) + "_dp" +
                                  std::to_string(i.param.dp) + "_ep" + std::to_string(i.param.ep);
                         });

// kill -9 of a follower: rank 0 fails the worker (exit 1, kFailed) and reaps every rank.
TEST_F(RoseRanks, KilledRankFailsTheWorkerWithNoRankLeft) {
  Worker w = start({"--tp", "2", "--ep", "2"});
  ASSERT_GT(w.pid, 0);
  std::vector<Seq> seqs = workload();
  ASSERT_EQ(runStep(*w.ch, makeStep(seqs, true), 1), (*reference_)[0]);
  const std::vector<pid_t> ranks = childrenOf(w.pid);
  ASSERT_EQ(ranks.size(), 1u);
  ASSERT_EQ(kill(ranks[0], SIGKILL), 0);
  const int st = garden::testing::waitChildExit(w.pid, 10s);
  ASSERT_NE(st, -1) << "rose kept running without its rank 1";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st;
  EXPECT_EQ(w.ch->state(), shm::WorkerState::kFailed);
  EXPECT_TRUE(processGone(ranks[0]));
}

// SIGSTOP of a follower: its heartbeat stops; rank 0 fails within --rank-heartbeat-timeout-ms (1 s)
// and kills the stopped rank too.
TEST_F(RoseRanks, StoppedRankFailsTheWorkerWithNoRankLeft) {
  Worker w = start({"--tp", "2", "--rank-heartbeat-timeout-ms", "1000"});
  ASSERT_GT(w.pid, 0);
  const std::vector<pid_t> ranks = childrenOf(w.pid);
  ASSERT_EQ(ranks.size(), 1u);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(ranks[0], SIGSTOP), 0);
  const int st = garden::testing::waitChildExit(w.pid, 10s);
  ASSERT_NE(st, -1) << "rose kept running with rank 1 stopped";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st;
  EXPECT_EQ(w.ch->state(), shm::WorkerState::kFailed);
  EXPECT_TRUE(processGone(ranks[0]));
}

// kill -9 of rank 0 (what tulip does on a restart): the followers die with it (PDEATHSIG).
TEST_F(RoseRanks, KilledRankZeroTakesTheOthersWithIt) {
  Worker w = start({"--dp", "2", "--ep", "2"});
  ASSERT_GT(w.pid, 0);
  const std::vector<pid_t> ranks = childrenOf(w.pid);
  ASSERT_EQ(ranks.size(), 1u);
  ASSERT_EQ(kill(w.pid, SIGKILL), 0);
  ASSERT_NE(garden::testing::waitChildExit(w.pid, 10s), -1);
  EXPECT_TRUE(waitGone(ranks[0], 5s)) << "rank 1 outlived rank 0";
}

// A layout the checkpoint cannot hold: exit 1 with the channel kFailed and no rank started or
// left; flags that contradict each other: exit 2.
TEST_F(RoseRanks, BadLayoutsFailAtStart) {
  Worker w = start({"--tp", "4", "--ep", "1"}, /*expect_ready=*/false);  // 4 ranks x 64 columns
  ASSERT_GT(w.pid, 0);
  int st = garden::testing::waitChildExit(w.pid, 30s);
  ASSERT_NE(st, -1);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st;
  EXPECT_EQ(w.ch->state(), shm::WorkerState::kFailed);
  EXPECT_TRUE(childrenOf(w.pid).empty());
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--tp", "2", "--ep", "3"},
        std::vector<std::string>{"--tp", "0"},
        std::vector<std::string>{"--rank", "1"},
        std::vector<std::string>{"--dp", "2", "--ep", "2", "--kv-blocks", "33"},
        // the CUDA IPC collectives on the cpu backend, or a slot size off 16 bytes
        std::vector<std::string>{"--tp", "2", "--rank-ipc-allreduce-bytes", "1024"},
        std::vector<std::string>{"--tp", "2", "--rank-ipc-alltoall-bytes", "1024"},
        std::vector<std::string>{"--tp", "2", "--rank-ipc-alltoall-bytes", "-16"}}) {
    Worker bad = start(extra, false);
    ASSERT_GT(bad.pid, 0);
    st = garden::testing::waitChildExit(bad.pid, 30s);
    ASSERT_NE(st, -1);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << extra[0] << " status " << st;
  }
}

}  // namespace
}  // namespace garden::rose
