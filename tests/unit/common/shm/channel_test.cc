#include "common/shm/channel.h"
#include "common/shm/llm_batch.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

namespace garden::shm {
namespace {

using namespace std::chrono_literals;

std::string uniqueName(const char* tag) {
  static int n = 0;
  return "/garden-test-" + std::string(tag) + "-" + std::to_string(getpid()) + "-" +
         std::to_string(n++);
}

BatchDesc desc(uint64_t id, uint32_t slot) {
  BatchDesc d;
  d.batch_id = id;
  d.slot = slot;
  d.num_seqs = static_cast<uint32_t>(id % 7 + 1);
  d.num_tokens = static_cast<uint32_t>(id * 3 + 1);
  return d;
}

TEST(ShmChannel, CreateAttachAndSeeSameHeader) {
  auto name = uniqueName("attach");
  auto owner = Channel::create(name, Layout{3, 4096, 8192});
  ASSERT_TRUE(owner.isOk()) << owner.status().toString();
  auto worker = Channel::attach(name);
  ASSERT_TRUE(worker.isOk()) << worker.status().toString();
  EXPECT_EQ(worker->layout().slots, 3u);
  EXPECT_EQ(worker->layout().input_bytes, 4096u);
  EXPECT_EQ(worker->layout().output_bytes, 8192u);
  EXPECT_EQ(worker->ownerPid(), getpid());
  worker->setWorkerPid(1234);
  EXPECT_EQ(owner->workerPid(), 1234);
  ModelFacts f;
  f.hidden_size = 1024;
  std::strcpy(f.name, "tiny");
  worker->setModelFacts(f);
  worker->setState(WorkerState::kReady);
  EXPECT_EQ(owner->state(), WorkerState::kReady);
  EXPECT_EQ(owner->modelFacts().hidden_size, 1024u);
  EXPECT_STREQ(owner->modelFacts().name, "tiny");
  // Arenas are distinct per slot and shared between the two mappings.
  auto in1 = owner->inputArena(1);
  std::memset(in1.data(), 0x5a, in1.size());
  EXPECT_EQ(static_cast<int>(worker->inputArena(1)[17]), 0x5a);
  EXPECT_NE(static_cast<int>(worker->inputArena(0)[17]), 0x5a);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(owner->outputArenaAll().data()) % 4096, 0u);
}

TEST(ShmChannel, AttachMissingOrBadSegmentFails) {
  auto missing = Channel::attach(uniqueName("missing"));
  EXPECT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  auto name = uniqueName("bad");
  {
    auto c = Channel::create(name, Layout{2, 4096, 4096});
    ASSERT_TRUE(c.isOk());
    std::memset(c->base(), 0, 8);  // wipe the magic
    auto bad = Channel::attach(name);
    ASSERT_FALSE(bad.isOk());
    EXPECT_NE(bad.status().message().find("bad magic"), std::string::npos);
  }
  // The owner unlinked the name on destruction.
  EXPECT_FALSE(Channel::attach(name).isOk());
}

TEST(ShmChannel, RejectsBadLayout) {
  EXPECT_FALSE(Channel::create(uniqueName("layout"), Layout{0, 4096, 4096}).isOk());
  EXPECT_FALSE(Channel::create(uniqueName("layout"), Layout{2, 0, 4096}).isOk());
}

TEST(ShmChannel, RingFifoWrapAroundAndFull) {
  auto c = Channel::create(uniqueName("ring"), Layout{4, 4096, 4096});
  ASSERT_TRUE(c.isOk());
  uint64_t next_push = 0, next_pop = 0;
  // Many rounds of uneven push/pop so indices wrap the ring many times.
  for (int round = 0; round < 1000; ++round) {
    int pushes = round % 5;
    for (int i = 0; i < pushes; ++i) {
      bool ok = c->trySubmit(desc(next_push, next_push % 4));
      if (next_push - next_pop >= 4) {
        EXPECT_FALSE(ok) << "ring accepted a 5th entry";
      } else {
        ASSERT_TRUE(ok);
        ++next_push;
      }
    }
    int pops = (round * 7) % 4;
    for (int i = 0; i < pops; ++i) {
      auto d = c->waitSubmission(0us);
      if (next_pop == next_push) {
        EXPECT_FALSE(d.has_value());
      } else {
        ASSERT_TRUE(d.has_value());
        EXPECT_EQ(d->batch_id, next_pop);
        EXPECT_EQ(d->num_tokens, next_pop * 3 + 1);
        ++next_pop;
      }
    }
  }
  EXPECT_GT(next_pop, 100u);
  // Fill completely: exactly `slots` entries fit.
  while (c->waitSubmission(0us)) {
  }
  for (uint32_t i = 0; i < 4; ++i) EXPECT_TRUE(c->trySubmit(desc(i, i)));
  EXPECT_FALSE(c->trySubmit(desc(99, 0)));
  EXPECT_EQ(c->waitSubmission(0us)->batch_id, 0u);
  EXPECT_TRUE(c->trySubmit(desc(100, 0)));
}

TEST(ShmChannel, CompletionRingIndependent) {
  auto c = Channel::create(uniqueName("comp"), Layout{2, 4096, 4096});
  ASSERT_TRUE(c.isOk());
  Completion done;
  done.batch_id = 7;
  done.status_code = 3;
  std::strcpy(done.message, "bad ids");
  EXPECT_TRUE(c->tryComplete(done));
  EXPECT_FALSE(c->waitSubmission(0us).has_value());
  auto got = c->waitCompletion(0us);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->batch_id, 7u);
  EXPECT_STREQ(got->message, "bad ids");
}

TEST(ShmChannel, WaitTimesOutThenWakesOnPush) {
  auto c = Channel::create(uniqueName("wait"), Layout{2, 4096, 4096});
  ASSERT_TRUE(c.isOk());
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(c->waitSubmission(30ms).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 25ms);

  auto worker = Channel::attach(c->name());
  ASSERT_TRUE(worker.isOk());
  std::thread producer([&] {
    std::this_thread::sleep_for(50ms);
    c->trySubmit(desc(42, 1));
  });
  t0 = std::chrono::steady_clock::now();
  std::optional<BatchDesc> got;
  // Woken by the push, not by the 20 s timeout (the bound leaves room for a loaded machine).
  while (!got && std::chrono::steady_clock::now() - t0 < 60s) got = worker->waitSubmission(20s);
  producer.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->batch_id, 42u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST(ShmChannel, WakeAllReleasesSleeper) {
  auto c = Channel::create(uniqueName("wake"), Layout{2, 4096, 4096});
  ASSERT_TRUE(c.isOk());
  std::atomic<bool> returned{false};
  std::thread sleeper([&] {
    (void)c->waitCompletion(10s);
    returned = true;
  });
  std::this_thread::sleep_for(50ms);
  auto t0 = std::chrono::steady_clock::now();
  while (!returned && std::chrono::steady_clock::now() - t0 < 3s) {
    c->wakeAll();
    std::this_thread::sleep_for(5ms);
  }
  sleeper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST(ShmChannel, HeartbeatStaleness) {
  auto c = Channel::create(uniqueName("beat"), Layout{2, 4096, 4096});
  ASSERT_TRUE(c.isOk());
  EXPECT_FALSE(c->heartbeatStale(10ms)) << "no beat yet is not stale";
  c->beat();
  EXPECT_FALSE(c->heartbeatStale(1000ms));
  // Thresholds far above a scheduling hiccup between two statements on a loaded machine (20 ms
  // was not).
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(c->heartbeatStale(200ms));
  c->beat();
  EXPECT_FALSE(c->heartbeatStale(5000ms));  // fresh again (no 200 ms bet on the scheduler)
}

// A real second process: the child attaches by name, echoes each batch's input back through the
// output arena of the same slot, and completes it. The parent checks order and contents, reusing
// slots many times over (the pipelined pattern tulip uses).
TEST(ShmChannel, TwoProcessProducerConsumer) {
  auto name = uniqueName("twoproc");
  constexpr uint32_t kSlots = 3;
  auto c = Channel::create(name, Layout{kSlots, 4096, 4096});
  ASSERT_TRUE(c.isOk());
  constexpr int kBatches = 2000;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto w = Channel::attach(name);
    if (!w.isOk()) _exit(10);
    w->setWorkerPid(getpid());
    for (int n = 0; n < kBatches;) {
      w->beat();
      auto d = w->waitSubmission(std::chrono::milliseconds(100));
      if (!d) continue;
      auto in = w->inputArena(d->slot);
      auto out = w->outputArena(d->slot);
      int32_t v;
      std::memcpy(&v, in.data(), 4);
      v = v * 2 + 1;
      std::memcpy(out.data(), &v, 4);
      Completion done;
      done.batch_id = d->batch_id;
      done.slot = d->slot;
      done.rows = 1;
      done.cols = 1;
      while (!w->tryComplete(done)) {
      }
      ++n;
    }
    _exit(0);
  }
  std::vector<bool> slot_busy(kSlots, false);
  uint64_t submitted = 0, completed = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (completed < kBatches && std::chrono::steady_clock::now() - t0 < 30s) {
    for (uint32_t s = 0; s < kSlots && submitted < kBatches; ++s) {
      if (slot_busy[s]) continue;
      int32_t v = static_cast<int32_t>(submitted);
      std::memcpy(c->inputArena(s).data(), &v, 4);
      ASSERT_TRUE(c->trySubmit(desc(submitted, s)));
      slot_busy[s] = true;
      ++submitted;
    }
    auto done = c->waitCompletion(std::chrono::milliseconds(100));
    if (!done) continue;
    ASSERT_EQ(done->batch_id, completed) << "completions out of order";
    int32_t v;
    std::memcpy(&v, c->outputArena(done->slot).data(), 4);
    ASSERT_EQ(v, static_cast<int32_t>(done->batch_id) * 2 + 1);
    slot_busy[done->slot] = false;
    ++completed;
  }
  EXPECT_EQ(completed, static_cast<uint64_t>(kBatches));
  EXPECT_EQ(c->workerPid(), pid);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A worker that stops (SIGSTOP: alive but stuck) goes stale; the owner sees it.
TEST(ShmChannel, StaleHeartbeatOfStoppedWorker) {
  auto name = uniqueName("stuck");
  auto c = Channel::create(name, Layout{2, 4096, 4096});
  ASSERT_TRUE(c.isOk());
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto w = Channel::attach(name);
    if (!w.isOk()) _exit(10);
    while (true) {
      w->beat();
      usleep(10000);
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  while (c->lastBeatNs() == 0 && std::chrono::steady_clock::now() - t0 < 5s) usleep(1000);
  ASSERT_NE(c->lastBeatNs(), 0);
  // Beating: fresh within 200 ms at some point of a generous wait (a loaded machine may hold the
  // child off the CPU for a while, so no single instant is asserted).
  t0 = std::chrono::steady_clock::now();
  while (c->heartbeatStale(std::chrono::milliseconds(200)) &&
         std::chrono::steady_clock::now() - t0 < 5s)
    usleep(1000);
  EXPECT_FALSE(c->heartbeatStale(std::chrono::milliseconds(200)));
  kill(pid, SIGSTOP);
  usleep(300000);
  EXPECT_TRUE(c->heartbeatStale(std::chrono::milliseconds(200)));
  kill(pid, SIGCONT);
  t0 = std::chrono::steady_clock::now();
  while (c->heartbeatStale(std::chrono::milliseconds(200)) &&
         std::chrono::steady_clock::now() - t0 < 5s)
    usleep(1000);
  EXPECT_FALSE(c->heartbeatStale(std::chrono::milliseconds(200)));
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// --- stale segments [TAG_SHM_STALE] --------------------------------------------------------------

bool segmentExists(const std::string& name) { return access(("/dev/shm" + name).c_str(), F_OK) == 0; }

// A child process that creates `name` (or, with `attach`, attaches to it and records itself as the
// worker), with `worker_pid` recorded as the worker when not 0, reports on a pipe, and waits to be
// killed: killed with SIGKILL it leaves the segment behind, as a crashed tulip or rose does.
pid_t childOf(const std::string& name, bool attach, pid_t worker_pid = 0) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    auto c = attach ? Channel::attach(name) : Channel::create(name, Layout{2, 4096, 4096});
    char ok = c.isOk() ? 1 : 0;
    if (c.isOk() && attach) c->setWorkerPid(getpid());
    if (c.isOk() && worker_pid != 0) c->setWorkerPid(worker_pid);
    if (write(fds[1], &ok, 1) != 1) _exit(3);
    while (true) pause();
  }
  close(fds[1]);
  char ok = 0;
  const bool got = read(fds[0], &ok, 1) == 1;
  close(fds[0]);
  if (!got || !ok) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

void killAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

TEST(ShmStaleSegment, AKilledOwnersSegmentIsReplacedAtTheNextCreate) {
  const auto name = uniqueName("killed");
  const pid_t owner = childOf(name, false);
  ASSERT_GT(owner, 0);
  killAndReap(owner);
  ASSERT_TRUE(segmentExists(name)) << "SIGKILL leaves the segment behind";
  auto c = Channel::create(name, Layout{2, 4096, 4096});
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->ownerPid(), getpid());
  EXPECT_EQ(c->workerPid(), 0);  // a fresh header, not the dead one's
}

TEST(ShmStaleSegment, ALiveOwnerKeepsItsSegment) {
  const auto name = uniqueName("live");
  const pid_t owner = childOf(name, false);
  ASSERT_GT(owner, 0);
  auto c = Channel::create(name, Layout{2, 4096, 4096});
  ASSERT_FALSE(c.isOk());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("in use by live process " + std::to_string(owner) +
                                      " (its owner)"),
            std::string::npos)
      << c.status().message();
  auto still = Channel::attach(name);  // untouched: still the live owner's
  ASSERT_TRUE(still.isOk());
  EXPECT_EQ(still->ownerPid(), owner);
  killAndReap(owner);
  EXPECT_TRUE(Channel::create(name, Layout{2, 4096, 4096}).isOk());
}

TEST(ShmStaleSegment, ALiveWorkerKeepsTheSegmentAfterItsOwnerDied) {
  const auto name = uniqueName("worker");
  const pid_t owner = childOf(name, false);
  ASSERT_GT(owner, 0);
  const pid_t worker = childOf(name, true);
  ASSERT_GT(worker, 0);
  killAndReap(owner);
  auto c = Channel::create(name, Layout{2, 4096, 4096});
  ASSERT_FALSE(c.isOk());
  EXPECT_NE(c.status().message().find("in use by live process " + std::to_string(worker) +
                                      " (its worker)"),
            std::string::npos)
      << c.status().message();
  killAndReap(worker);
  EXPECT_TRUE(Channel::create(name, Layout{2, 4096, 4096}).isOk());
}

TEST(ShmStaleSegment, AZombieOwnerDoesNotKeepIt) {
  // Killed but not reaped (a container whose pid 1 does not reap): it maps nothing any more.
  const auto name = uniqueName("zombie");
  const pid_t owner = childOf(name, false);
  ASSERT_GT(owner, 0);
  kill(owner, SIGKILL);
  // Wait until it is a zombie (its /proc stat says Z), without reaping it.
  const auto t0 = std::chrono::steady_clock::now();
  auto state = [&] {
    std::string stat;
    FILE* f = std::fopen(("/proc/" + std::to_string(owner) + "/stat").c_str(), "r");
    if (f == nullptr) return '?';
    char buf[512] = {};
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    stat.assign(buf, n);
    const size_t p = stat.rfind(')');
    return p != std::string::npos && p + 2 < stat.size() ? stat[p + 2] : '?';
  };
  while (state() != 'Z' && std::chrono::steady_clock::now() - t0 < 30s) usleep(1000);
  ASSERT_EQ(state(), 'Z');
  auto c = Channel::create(name, Layout{2, 4096, 4096});
  EXPECT_TRUE(c.isOk()) << c.status().toString();
  waitpid(owner, nullptr, 0);
}

TEST(ShmStaleSegment, ARecordedPidThatDoesNotMapItDoesNotKeepIt) {
  // The dead owner recorded this (live) process as its worker: a pid that lives on without the
  // mapping (a reused pid) must not keep a dead channel.
  const auto name = uniqueName("reused");
  const pid_t owner = childOf(name, false, getpid());
  ASSERT_GT(owner, 0);
  killAndReap(owner);
  auto c = Channel::create(name, Layout{2, 4096, 4096});
  EXPECT_TRUE(c.isOk()) << c.status().toString();
}

TEST(ShmStaleSegment, AnotherUsersOrAnotherModesSegmentIsLeftAlone) {
  EXPECT_FALSE(*removeStaleSegment(uniqueName("absent"), geteuid()));  // nothing there
  // Stale by every other measure, but not ours: refused, left in place.
  const auto name = uniqueName("uid");
  const pid_t owner = childOf(name, false);
  ASSERT_GT(owner, 0);
  killAndReap(owner);
  auto other = removeStaleSegment(name, geteuid() + 1);
  ASSERT_FALSE(other.isOk());
  EXPECT_NE(other.status().message().find("owned by uid " + std::to_string(geteuid()) +
                                          ", not " + std::to_string(geteuid() + 1)),
            std::string::npos)
      << other.status().message();
  EXPECT_NE(other.status().message().find("rm /dev/shm" + name), std::string::npos);
  EXPECT_TRUE(segmentExists(name));
  auto ours = removeStaleSegment(name, geteuid());
  ASSERT_TRUE(ours.isOk()) << ours.status().toString();
  EXPECT_TRUE(*ours);
  EXPECT_FALSE(segmentExists(name));
  // A file garden did not make (mode 0644): create() refuses to take its name.
  const auto foreign = uniqueName("mode");
  const int fd = shm_open(foreign.c_str(), O_CREAT | O_EXCL | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchmod(fd, 0644), 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  auto c = Channel::create(foreign, Layout{2, 4096, 4096});
  ASSERT_FALSE(c.isOk());
  EXPECT_NE(c.status().message().find("mode 0644, not the 0600 garden creates"),
            std::string::npos)
      << c.status().message();
  EXPECT_TRUE(segmentExists(foreign));
  shm_unlink(foreign.c_str());
}

TEST(ShmStaleSegment, AHeaderlessSegmentGoesOnlyWhenNoProcessMapsIt) {
  // Never initialized (its creator died before writing the header): no pids to ask, so every
  // process's mappings are.
  const auto name = uniqueName("headerless");
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchmod(fd, 0600), 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  void* m = mmap(nullptr, 64, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  close(fd);
  auto busy = Channel::create(name, Layout{2, 4096, 4096});
  ASSERT_FALSE(busy.isOk());
  EXPECT_NE(busy.status().message().find("mapped by live process " + std::to_string(getpid())),
            std::string::npos)
      << busy.status().message();
  munmap(m, 64);
  auto c = Channel::create(name, Layout{2, 4096, 4096});
  EXPECT_TRUE(c.isOk()) << c.status().toString();
}

TEST(ShmStaleSegment, CreateMakesMode0600WhateverTheUmask) {
  const mode_t old = umask(0);
  const auto name = uniqueName("umask");
  auto c = Channel::create(name, Layout{2, 4096, 4096});
  umask(old);
  ASSERT_TRUE(c.isOk());
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

}  // namespace
// [TAG_LATE_MASKS] The late-mask ready word across two processes (a MAP_SHARED page, as the
// channel's arena is): the child waits, the parent writes the masks and publishes; the child sees
// ready and the masks. Then the timeout: an await that runs out marks the region abandoned, and a
// publish after that fails (tulip learns the draws were unconstrained).
TEST(ShmLateMasks, PublishWakesAWaiterInAnotherProcess) {
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  auto* region = static_cast<std::byte*>(page);
  initLateMasks(region);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!awaitLateMasks(region, std::chrono::seconds(20))) _exit(2);
    uint32_t mask;
    std::memcpy(&mask, region + kLateMaskHeaderBytes, 4);
    _exit(mask == 0xC0FFEEu ? 0 : 3);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the child is asleep by now
  EXPECT_EQ(lateMaskState(region), kLateMasksPending);
  const uint32_t mask = 0xC0FFEEu;
  std::memcpy(region + kLateMaskHeaderBytes, &mask, 4);
  EXPECT_TRUE(publishLateMasks(region));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(lateMaskState(region), kLateMasksReady);
  EXPECT_TRUE(awaitLateMasks(region, std::chrono::milliseconds(0)));  // stays ready
  munmap(page, 4096);
}

TEST(ShmLateMasks, AnAwaitThatRunsOutAbandonsThem) {
  alignas(8) std::byte region[16] = {};
  initLateMasks(region);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(awaitLateMasks(region, std::chrono::milliseconds(50)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50));
  EXPECT_EQ(lateMaskState(region), kLateMasksAbandoned);
  EXPECT_FALSE(publishLateMasks(region));
  EXPECT_EQ(lateMaskState(region), kLateMasksAbandoned);
  // Published first: an await returns at once, whatever its timeout.
  initLateMasks(region);
  EXPECT_TRUE(publishLateMasks(region));
  EXPECT_TRUE(awaitLateMasks(region, std::chrono::milliseconds(0)));
}

}  // namespace garden::shm
