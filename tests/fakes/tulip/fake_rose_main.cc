// fake-rose: a stand-in rose for tulip's worker tests. Speaks the real shm protocol with a trivial
// "model": an embedding row is [sum(ids), len, 0, 1] (hidden 4); a score is len.
// Failure modes on demand:
//   --delay-ms N        each batch takes N ms
//   --crash-after N     exit(3) when batch N+1 arrives
//   --hang-after N      after N batches stop beating and answering (alive but stuck)
//   --stall-after N     after N batches keep beating but never answer (a step that never ends)
//   --fail-start        report WorkerState::kFailed instead of loading
//   --create-shm        sidecar mode: create the segment (depth 2) instead of attaching
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "common/shm/channel.h"

using namespace garden;

static volatile sig_atomic_t g_stop = 0;

int main(int argc, char** argv) {
  std::string name;
  int delay_ms = 0, crash_after = -1, hang_after = -1, stall_after = -1;
  bool fail_start = false, create = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--shm-name") name = next();
    else if (a == "--delay-ms") delay_ms = std::atoi(next().c_str());
    else if (a == "--crash-after") crash_after = std::atoi(next().c_str());
    else if (a == "--hang-after") hang_after = std::atoi(next().c_str());
    else if (a == "--stall-after") stall_after = std::atoi(next().c_str());
    else if (a == "--fail-start") fail_start = true;
    else if (a == "--create-shm") create = true;
    // everything else (--model, --device, ...) is accepted and ignored
  }
  signal(SIGTERM, [](int) { g_stop = 1; });
  auto ch = create ? shm::Channel::create(name, shm::Layout{2, 1 << 16, 1 << 16})
                   : shm::Channel::attach(name);
  if (!ch.isOk()) {
    std::fprintf(stderr, "fake-rose: %s\n", ch.status().toString().c_str());
    return 1;
  }
  ch->setWorkerPid(getpid());
  if (fail_start) {
    ch->setState(shm::WorkerState::kFailed);
    return 1;
  }
  shm::ModelFacts f;
  f.hidden_size = 4;
  f.max_seq_len = 64;
  f.vocab_size = 1000;
  f.has_score_head = 1;
  std::strcpy(f.name, "fake");
  std::strcpy(f.kind, "embedding");
  ch->setModelFacts(f);
  ch->beat();
  ch->setState(shm::WorkerState::kReady);
  int served = 0;
  while (!g_stop) {
    ch->beat();
    auto d = ch->waitSubmission(std::chrono::milliseconds(50));
    if (!d) continue;
    if (crash_after >= 0 && served >= crash_after) std::exit(3);
    if (hang_after >= 0 && served >= hang_after) {
      while (true) pause();
    }
    if (stall_after >= 0 && served >= stall_after) {
      while (!g_stop) {
        ch->beat();
        usleep(10000);
      }
      break;
    }
    if (delay_ms > 0) {
      for (int t = 0; t < delay_ms; t += 10) {
        ch->beat();
        usleep(10000);
      }
    }
    auto in = ch->inputArena(d->slot);
    auto out = ch->outputArena(d->slot);
    const int32_t* toks = reinterpret_cast<const int32_t*>(in.data() + d->tokens_offset);
    const int32_t* lens = reinterpret_cast<const int32_t*>(in.data() + d->seqlens_offset);
    float* rows = reinterpret_cast<float*>(out.data());
    const uint32_t cols = d->kind == shm::BatchKind::kScore ? 1 : 4;
    size_t off = 0;
    for (uint32_t s = 0; s < d->num_seqs; ++s) {
      float sum = 0;
      for (int32_t i = 0; i < lens[s]; ++i) sum += static_cast<float>(toks[off + i]);
      off += lens[s];
      if (cols == 1) {
        rows[s] = static_cast<float>(lens[s]);
      } else {
        rows[s * 4 + 0] = sum;
        rows[s * 4 + 1] = static_cast<float>(lens[s]);
        rows[s * 4 + 2] = 0;
        rows[s * 4 + 3] = 1;
      }
    }
    shm::Completion c;
    c.batch_id = d->batch_id;
    c.slot = d->slot;
    c.rows = d->num_seqs;
    c.cols = cols;
    c.output_bytes = uint64_t{d->num_seqs} * cols * sizeof(float);
    ch->tryComplete(c);
    ++served;
  }
  ch->setState(shm::WorkerState::kStopping);
  return 0;
}
