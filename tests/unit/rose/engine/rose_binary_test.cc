// The `rose` binary as a process: spawned by a stand-in tulip on a Channel it created, in sidecar
// mode (--create-shm), with a bad model directory, and orphaned (it must exit when its parent
// dies). Results are compared with a direct forward pass of the same checkpoint.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/shm/channel.h"
#include "services/rose/model/qwen3.h"
#include "services/rose/ops/backend.h"
#include "tests/support/child_process.h"

namespace garden::rose {
namespace {

using namespace std::chrono_literals;

std::string roseBin() { return garden::testing::builtBinary("services/rose/rose"); }

std::string sourceDir() {
  const char* s = std::getenv("GARDEN_SOURCE_DIR");
  return s ? s : ".";
}
std::string fixtureDir() { return sourceDir() + "/tests/conformance/qwen3/fixtures"; }

bool waitState(shm::Channel& ch, shm::WorkerState s, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (ch.state() == s) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// Submits one embed batch and checks the result against a direct forward pass.
void checkServes(shm::Channel& ch, uint32_t slot) {
  const std::vector<int32_t> tokens = {11, 22, 33, 44, 55};
  const std::vector<int32_t> lens = {2, 3};
  auto in = ch.inputArena(slot);
  std::memcpy(in.data(), tokens.data(), tokens.size() * 4);
  std::memcpy(in.data() + 64, lens.data(), lens.size() * 4);
  shm::BatchDesc d;
  d.batch_id = 7;
  d.slot = slot;
  d.num_seqs = 2;
  d.num_tokens = 5;
  d.seqlens_offset = 64;
  ASSERT_TRUE(ch.trySubmit(d));
  auto c = ch.waitCompletion(20s);
  ASSERT_TRUE(c.has_value());
  ASSERT_EQ(c->status_code, 0) << c->message;
  ASSERT_EQ(c->rows, 2u);
  ASSERT_EQ(c->cols, 64u);

  BackendOptions bo;
  bo.threads = 1;
  auto backend = std::move(makeBackend("cpu", bo)).value();
  Qwen3Options mo;
  mo.max_batch_tokens = 64;
  auto model = std::move(Qwen3Model::load(fixtureDir(), *backend, mo)).value();
  std::vector<float> want(2 * 64);
  model->enqueueEmbed({tokens, lens}, model->pooling().mode, true, want.data());
  ASSERT_TRUE(backend->synchronize().isOk());
  std::vector<float> got(2 * 64);
  std::memcpy(got.data(), ch.outputArena(slot).data(), got.size() * 4);
  EXPECT_EQ(got, want);
}

TEST(RoseBinary, SpawnedRoseServesAndStopsOnSigterm) {
  const std::string name = garden::testing::uniqueShmName("/rose-bin-", "spawned");
  auto ch = shm::Channel::create(name, shm::Layout{2, 4096, 64 * 64 * 4});
  ASSERT_TRUE(ch.isOk()) << ch.status().toString();
  pid_t pid = garden::testing::spawnChild({roseBin(), "--model", fixtureDir(), "--shm-name", name,
                                           "--threads", "1", "--max-batch-tokens", "64"});
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(waitState(*ch, shm::WorkerState::kReady, 30s)) << "rose did not become ready";
  EXPECT_EQ(ch->workerPid(), pid);
  EXPECT_EQ(ch->modelFacts().hidden_size, 64u);
  EXPECT_STREQ(ch->modelFacts().name, "fixtures");
  checkServes(*ch, 1);
  EXPECT_FALSE(ch->heartbeatStale(1s));
  kill(pid, SIGTERM);
  int st = garden::testing::waitChildExit(pid, 10s);
  ASSERT_NE(st, -1) << "rose did not exit on SIGTERM";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  EXPECT_EQ(ch->state(), shm::WorkerState::kStopping);
}

TEST(RoseBinary, SidecarCreatesTheChannel) {
  const std::string name = garden::testing::uniqueShmName("/rose-bin-", "sidecar");
  pid_t pid = garden::testing::spawnChild({roseBin(), "--model", fixtureDir(), "--shm-name", name,
                                           "--create-shm", "--depth", "2", "--threads", "1",
                                           "--max-batch-tokens", "64"});
  ASSERT_GT(pid, 0);
  std::optional<shm::Channel> ch;
  const auto end = std::chrono::steady_clock::now() + 30s;
  while (!ch && std::chrono::steady_clock::now() < end) {
    auto a = shm::Channel::attach(name);
    if (a.isOk() && a->state() == shm::WorkerState::kReady) {
      ch.emplace(std::move(a).value());
    } else {
      std::this_thread::sleep_for(20ms);
    }
  }
  ASSERT_TRUE(ch.has_value()) << "sidecar rose did not create a ready channel";
  EXPECT_EQ(ch->layout().slots, 2u);
  EXPECT_EQ(ch->layout().output_bytes, 64u * 64 * 4);  // max_batch_tokens x hidden x f32
  checkServes(*ch, 0);
  kill(pid, SIGTERM);
  int st = garden::testing::waitChildExit(pid, 10s);
  ASSERT_NE(st, -1);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TEST(RoseBinary, BadModelDirectoryReportsFailed) {
  const std::string name = garden::testing::uniqueShmName("/rose-bin-", "bad");
  auto ch = shm::Channel::create(name, shm::Layout{1, 4096, 4096});
  ASSERT_TRUE(ch.isOk());
  pid_t pid =
      garden::testing::spawnChild({roseBin(), "--model", "/nonexistent/model", "--shm-name", name});
  int st = garden::testing::waitChildExit(pid, 20s);
  ASSERT_NE(st, -1);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1);
  EXPECT_EQ(ch->state(), shm::WorkerState::kFailed);
}

TEST(RoseBinary, BadFlagsExitWithUsageError) {
  pid_t pid = garden::testing::spawnChild(
      {roseBin(), "--model", fixtureDir(), "--shm-name", "/x", "--pooling", "max"});
  int st = garden::testing::waitChildExit(pid, 10s);
  ASSERT_NE(st, -1);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2);
  pid = garden::testing::spawnChild(
      {roseBin(), "--model", fixtureDir(), "--shm-name", "/x", "--device", "cuda", "--create-shm"});
  st = garden::testing::waitChildExit(pid, 20s);
  ASSERT_NE(st, -1);
#if !(defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA)
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1);  // FAILED_PRECONDITION: no CUDA build
#endif
  // A kernel choice rose does not know is a configuration error like a bad flag, on any device
  // (read once at start-up; the child inherits this process's environment).
  ASSERT_EQ(setenv("GARDEN_ATTENTION_KERNEL", "v2", 1), 0);
  pid = garden::testing::spawnChild(
      {roseBin(), "--model", fixtureDir(), "--shm-name", "/x", "--create-shm"});
  ASSERT_EQ(unsetenv("GARDEN_ATTENTION_KERNEL"), 0);
  st = garden::testing::waitChildExit(pid, 10s);
  ASSERT_NE(st, -1);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << "status " << st;
}

TEST(RoseBinary, ExitsWhenItsParentDies) {
  // Orphans are re-parented to this process, so the test can reap rose after its parent exits.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const std::string name = garden::testing::uniqueShmName("/rose-bin-", "orphan");
  auto ch = shm::Channel::create(name, shm::Layout{1, 4096, 64 * 64 * 4});
  ASSERT_TRUE(ch.isOk());
  pid_t parent = fork();
  if (parent == 0) {
    // The stand-in tulip: spawns rose, waits until it is ready, then dies abruptly.
    pid_t rose = garden::testing::spawnChild({roseBin(), "--model", fixtureDir(), "--shm-name",
                                              name, "--threads", "1", "--max-batch-tokens", "64"});
    const auto end = std::chrono::steady_clock::now() + 30s;
    while (ch->state() != shm::WorkerState::kReady && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(10ms);
    }
    _exit(rose > 0 && ch->state() == shm::WorkerState::kReady ? 0 : 1);
  }
  int pst = garden::testing::waitChildExit(parent, 40s);
  ASSERT_NE(pst, -1);
  ASSERT_TRUE(WIFEXITED(pst) && WEXITSTATUS(pst) == 0) << "rose did not start under its parent";
  const pid_t rose = ch->workerPid();
  ASSERT_GT(rose, 0);
  int st = garden::testing::waitChildExit(rose, 10s);
  ASSERT_NE(st, -1) << "rose outlived its parent";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  EXPECT_EQ(ch->state(), shm::WorkerState::kStopping);
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST(RoseBinary, ExitsWhenTheChannelOwnerIsGone) {
  // The owner (tulip) created the channel and died without unlinking it (_exit skips the
  // destructor); rose, whose own parent (this test) is alive, must notice the dead owner pid.
  const std::string name = garden::testing::uniqueShmName("/rose-bin-", "owner");
  pid_t owner = fork();
  if (owner == 0) {
    auto ch = shm::Channel::create(name, shm::Layout{1, 4096, 64 * 64 * 4});
    _exit(ch.isOk() ? 0 : 1);
  }
  int ost = garden::testing::waitChildExit(owner, 10s);
  ASSERT_TRUE(WIFEXITED(ost) && WEXITSTATUS(ost) == 0);
  auto ch = shm::Channel::attach(name);
  ASSERT_TRUE(ch.isOk()) << ch.status().toString();
  EXPECT_EQ(ch->ownerPid(), owner);
  pid_t pid = garden::testing::spawnChild({roseBin(), "--model", fixtureDir(), "--shm-name", name,
                                           "--threads", "1", "--max-batch-tokens", "64"});
  int st = garden::testing::waitChildExit(pid, 20s);
  shm_unlink(name.c_str());
  ASSERT_NE(st, -1) << "rose kept running without its channel owner";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  EXPECT_EQ(ch->state(), shm::WorkerState::kStopping);
}

}  // namespace
}  // namespace garden::rose
