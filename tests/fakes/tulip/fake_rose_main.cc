// fake-rose: a stand-in rose for tulip's worker tests. Speaks the real shm protocol with a trivial
// "model": an embedding row is [sum(ids), len, 0, 1] (hidden 4); a score is len.
// Failure modes on demand:
//   --delay-ms N        each batch takes N ms
//   --step-us F --step-us-per-token P
//                       embedding/score batches take F + P x tokens microseconds (a GPU-like cost:
//                       a fixed part per batch plus a part per token, so batching pays; sleeps,
//                       so it costs no CPU). --max-seq-len also applies in embedding mode.
//   --crash-after N     exit(3) when batch N+1 arrives
//   --hang-after N      after N batches stop beating and answering (alive but stuck)
//   --stall-after N     after N batches keep beating but never answer (a step that never ends;
//                       with --progress: a wedged compute, the progress counter stops too)
//   --progress          report step progress [TAG_STEP_PROGRESS] (like rose's cpu backend): the
//                       counter advances every 10 ms of a --delay-ms step and once per batch
//   --fail-start        report WorkerState::kFailed instead of loading
//   --create-shm        sidecar mode: create the segment (depth 2) instead of attaching
// LLM mode (--llm): ModelFacts kind "llm" and kGenerate steps run through the deterministic fake
// model of tests/fakes/tulip/fake_llm_model.h (next token = f(tokens so far), read back through
// the block tables from a fake KV cache), so the expected streams are computable:
//   --kv-blocks N (64)  --kv-block-size N (4)  --max-seq-len N (128)  --eos ID (999)
//   --vocab N (1000)    --name NAME (fake-llm)    --max-seqs N (0 = no limit; larger steps refused)
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "common/shm/channel.h"
#include "common/shm/llm_batch.h"
#include "tests/fakes/tulip/fake_llm_model.h"

using namespace garden;

static volatile sig_atomic_t g_stop = 0;

int main(int argc, char** argv) {
  std::string name;
  int delay_ms = 0, step_us = 0, step_us_per_token = 0, crash_after = -1, hang_after = -1,
      stall_after = -1;
  bool fail_start = false, create = false, llm = false, max_seq_len_set = false, progress = false;
  uint32_t kv_blocks = 64, kv_block_size = 4, max_seq_len = 128, vocab = 1000, max_seqs = 0;
  int32_t eos = 999;
  std::string model_name = "fake-llm";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--shm-name") name = next();
    else if (a == "--delay-ms") delay_ms = std::atoi(next().c_str());
    else if (a == "--crash-after") crash_after = std::atoi(next().c_str());
    else if (a == "--hang-after") hang_after = std::atoi(next().c_str());
    else if (a == "--stall-after") stall_after = std::atoi(next().c_str());
    else if (a == "--fail-start") fail_start = true;
    else if (a == "--progress") progress = true;
    else if (a == "--create-shm") create = true;
    else if (a == "--llm") llm = true;
    else if (a == "--kv-blocks") kv_blocks = std::atoi(next().c_str());
    else if (a == "--kv-block-size") kv_block_size = std::atoi(next().c_str());
    else if (a == "--max-seq-len") {
      max_seq_len = std::atoi(next().c_str());
      max_seq_len_set = true;
    } else if (a == "--step-us")
      step_us = std::atoi(next().c_str());
    else if (a == "--step-us-per-token")
      step_us_per_token = std::atoi(next().c_str());
    else if (a == "--eos") eos = std::atoi(next().c_str());
    else if (a == "--vocab") vocab = std::atoi(next().c_str());
    else if (a == "--max-seqs") max_seqs = std::atoi(next().c_str());
    else if (a == "--name") model_name = next();
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
  f.max_seq_len = max_seq_len_set ? max_seq_len : 64;
  f.vocab_size = 1000;
  f.has_score_head = 1;
  std::strcpy(f.name, "fake");
  std::strcpy(f.kind, "embedding");
  if (llm) {
    f.max_seq_len = max_seq_len;
    f.vocab_size = vocab;
    f.has_score_head = 0;
    f.kv_num_blocks = kv_blocks;
    f.kv_block_size = kv_block_size;
    f.eos_ids[0] = eos;
    f.max_seqs = max_seqs;
    std::snprintf(f.name, sizeof(f.name), "%s", model_name.c_str());
    std::strcpy(f.kind, "llm");
  }
  garden::tulip::testing::FakeLlmEngine engine(kv_blocks, kv_block_size, vocab);
  ch->setModelFacts(f);
  ch->setProgressReported(progress);
  auto advance = [&] {
    if (progress) ch->progressCounter()->fetch_add(1, std::memory_order_relaxed);
  };
  ch->beat();
  ch->setState(shm::WorkerState::kReady);
  int served = 0;
  while (!g_stop) {
    ch->beat();
    auto d = ch->waitSubmission(std::chrono::milliseconds(50));
    if (!d) continue;
    const int64_t taken_ns = shm::monotonicNowNs();
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
        advance();
        usleep(10000);
      }
    }
    advance();
    auto in = ch->inputArena(d->slot);
    auto out = ch->outputArena(d->slot);
    if (d->kind == shm::BatchKind::kGenerate) {
      shm::Completion c;
      c.batch_id = d->batch_id;
      c.slot = d->slot;
      const uint64_t need = d->num_seqs == 0 ? ~0ull
                                             : shm::llmStepBytes(d->num_seqs, d->num_tokens,
                                                                 d->num_blocks);
      Result<std::vector<int32_t>> ids = invalidArgument("not an LLM worker");
      if (!llm) {
        ids = unimplemented("batch kind generate is not served by this fake (embedding mode)");
      } else if (max_seqs > 0 && d->num_seqs > max_seqs) {
        ids = invalidArgument("num_seqs " + std::to_string(d->num_seqs) + " exceeds max_seqs");
      } else if (need > in.size() || d->seqs_offset + d->num_seqs * sizeof(llm::LlmStepSeq) >
                                         in.size() ||
                 d->tokens_offset + d->num_tokens * 4ull > in.size() ||
                 d->blocks_offset + d->num_blocks * 4ull > in.size()) {
        ids = invalidArgument("step arrays run past the input arena");
      } else {
        std::span<const llm::LlmStepSeq> seqs(
            reinterpret_cast<const llm::LlmStepSeq*>(in.data() + d->seqs_offset), d->num_seqs);
        std::span<const int32_t> toks(
            reinterpret_cast<const int32_t*>(in.data() + d->tokens_offset), d->num_tokens);
        std::span<const int32_t> blocks(
            reinterpret_cast<const int32_t*>(in.data() + d->blocks_offset), d->num_blocks);
        uint64_t sum = 0;
        for (const auto& sq : seqs) sum += sq.num_tokens > 0 ? sq.num_tokens : 0;
        if (sum != d->num_tokens) ids = invalidArgument("num_tokens != sum of the sequences'");
        else ids = engine.step(seqs, toks, blocks);
      }
      if (ids.isOk()) {
        std::memcpy(out.data(), ids->data(), ids->size() * sizeof(int32_t));
        c.rows = static_cast<uint32_t>(ids->size());
        c.cols = 1;
        c.output_bytes = c.rows * sizeof(int32_t);
      } else {
        c.status_code = static_cast<int32_t>(ids.status().code());
        std::snprintf(c.message, sizeof(c.message), "%s", ids.status().message().c_str());
        std::fprintf(stderr, "fake-rose: step refused: %s\n", ids.status().message().c_str());
      }
      ch->tryComplete(c);
      ++served;
      continue;
    }
    if (step_us > 0 || step_us_per_token > 0) {
      const int64_t cost_ns =
          (int64_t{step_us} + int64_t{step_us_per_token} * d->num_tokens) * 1000;
      timespec ts{static_cast<time_t>(cost_ns / 1000000000),
                  static_cast<long>(cost_ns % 1000000000)};
      nanosleep(&ts, nullptr);
    }
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
    c.taken_ns = taken_ns;
    c.published_ns = shm::monotonicNowNs();
    c.step_us = static_cast<uint64_t>((c.published_ns - taken_ns) / 1000);  // as rose reports it
    ch->tryComplete(c);
    ++served;
  }
  ch->setState(shm::WorkerState::kStopping);
  return 0;
}
