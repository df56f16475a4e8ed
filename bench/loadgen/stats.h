#pragma once
// Latency statistics for the load generator: nearest-rank percentiles over recorded samples, and
// error counts keyed by status name. Plain values; thread-compatible (each driver client records
// into its own Recorder, merged once a phase ends).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace garden::bench {

struct LatencySummary {
  uint64_t count = 0;
  double min = 0, mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;  // unit of the samples
};

// Nearest-rank percentile of `sorted` (ascending, non-empty): the smallest sample such that at
// least q% of samples are <= it. q in (0, 100].
double percentileSorted(const std::vector<double>& sorted, double q);

// Summary of `samples` (any order; empty gives all zeros).
LatencySummary summarize(std::vector<double> samples);

// What one closed-loop client (or a merge of several) observed.
struct Recorder {
  std::vector<double> latency_ms;             // successful requests only
  std::map<std::string, uint64_t> by_status;  // "OK", "INVALID_ARGUMENT", "HTTP_503", ...
  uint64_t ok = 0, errors = 0;
  uint64_t items = 0;   // embeddings / scores / chat completions returned by successful requests
  uint64_t tokens = 0;  // input tokens of successful requests (server-reported where available)
  // Server-side stage timings (gRPC Timings) of successful requests, in microseconds.
  std::vector<double> server_queue_us, server_inference_us, server_total_us;
  // HTTP embeddings: ivy's timing headers (docs/gateway.md [TAG_TIMING_HEADERS]), µs: tokenize,
  // upstream (request sent to tulip until its answer), total (arrival until the answer), own
  // (total - upstream: parse, tokenize, admission, the JSON answer, the hand-offs), tulip's queue
  // and inference, and the client's share (latency - total: the loadgen's own send/receive and
  // the HTTP transfers).
  std::vector<double> gw_tokenize_us, gw_upstream_us, gw_total_us, gw_own_us, gw_tulip_queue_us,
      gw_tulip_inference_us, gw_client_us;
  // Chat streams: time to first token, inter-token gaps (between SSE events that carry generated
  // text), time per output token ((latency - TTFT) / (output tokens - 1), per stream with at least
  // two events with text: robust to several tokens arriving in one event), output tokens, finish
  // reasons.
  std::vector<double> ttft_ms, itl_ms, tpot_ms;
  uint64_t output_tokens = 0;
  std::map<std::string, uint64_t> finish_reasons;  // "length", "stop", ... ("none": not sent)
  // First few error messages, for the report (bounded).
  std::vector<std::string> error_samples;

  void success(double ms) {
    latency_ms.push_back(ms);
    ++ok;
    ++by_status["OK"];
  }
  void failure(const std::string& status, const std::string& message);
  void merge(const Recorder& other);
};

}  // namespace garden::bench
