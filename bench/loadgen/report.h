#pragma once
// The load generator's result file: one JSON object per workload run (schema
// "garden.bench.result.v1", documented in bench/README.md and shared with
// bench/peer/hf_embed_baseline.py), plus the host description and ISO date that go into it.
// Pure functions; thread-compatible.

#include <string>
#include <utility>
#include <vector>

#include "bench/loadgen/driver.h"
#include "bench/loadgen/stats.h"

namespace garden::bench {

struct HostInfo {
  std::string hostname, cpu, kernel, gpu;  // gpu: nvidia-smi's name list, or "none"
  int cores = 0;
};
HostInfo describeHost();
std::string isoNowUtc();

struct RunReport {
  std::string workload, suite, system = "garden";
  std::string date, commit;
  HostInfo host;
  std::vector<std::pair<std::string, std::string>> flags;  // every flag with its value
  Mode mode = Mode::kEmbed;
  Protocol protocol = Protocol::kGrpc;
  InputKind input = InputKind::kTokens;
  std::string endpoint;
  int32_t batch = 1, seq_len = 0, concurrency = 1;
  uint64_t warmup = 0, count = 0;
  double duration_s = 0;
  ServedModel model;
  // Tokens per input over the request pool (exact for token inputs, measured for text).
  double input_tokens_mean = 0, input_tokens_min = 0, input_tokens_max = 0;
  PhaseResult measured;
};

std::string renderReport(const RunReport& r);
// One human line: "embed_tok128_b1_c1: 1000 ok, 0 err, p50 0.91 ms p99 1.10 ms, 1093.2 items/s".
std::string summaryLine(const RunReport& r);

}  // namespace garden::bench
