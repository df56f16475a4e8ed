#include "bench/loadgen/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/status.h"

namespace garden::bench {

double percentileSorted(const std::vector<double>& sorted, double q) {
  CHECK(!sorted.empty() && q > 0 && q <= 100);
  size_t rank = static_cast<size_t>(std::ceil(q / 100.0 * static_cast<double>(sorted.size())));
  if (rank < 1) rank = 1;
  return sorted[std::min(rank, sorted.size()) - 1];
}

LatencySummary summarize(std::vector<double> samples) {
  LatencySummary s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  s.count = samples.size();
  s.min = samples.front();
  s.max = samples.back();
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(s.count);
  s.p50 = percentileSorted(samples, 50);
  s.p90 = percentileSorted(samples, 90);
  s.p99 = percentileSorted(samples, 99);
  return s;
}

void Recorder::failure(const std::string& status, const std::string& message) {
  ++errors;
  ++by_status[status];
  if (error_samples.size() < 5) error_samples.push_back(status + ": " + message);
}

void Recorder::merge(const Recorder& o) {
  latency_ms.insert(latency_ms.end(), o.latency_ms.begin(), o.latency_ms.end());
  for (auto& [k, v] : o.by_status) by_status[k] += v;
  ok += o.ok;
  errors += o.errors;
  items += o.items;
  tokens += o.tokens;
  server_queue_us.insert(server_queue_us.end(), o.server_queue_us.begin(), o.server_queue_us.end());
  server_inference_us.insert(server_inference_us.end(), o.server_inference_us.begin(),
                             o.server_inference_us.end());
  server_total_us.insert(server_total_us.end(), o.server_total_us.begin(), o.server_total_us.end());
  for (auto [mine, theirs] : {std::pair{&gw_tokenize_us, &o.gw_tokenize_us},
                              {&gw_upstream_us, &o.gw_upstream_us},
                              {&gw_total_us, &o.gw_total_us},
                              {&gw_own_us, &o.gw_own_us},
                              {&gw_tulip_queue_us, &o.gw_tulip_queue_us},
                              {&gw_tulip_inference_us, &o.gw_tulip_inference_us},
                              {&gw_client_us, &o.gw_client_us}}) {
    mine->insert(mine->end(), theirs->begin(), theirs->end());
  }
  ttft_ms.insert(ttft_ms.end(), o.ttft_ms.begin(), o.ttft_ms.end());
  itl_ms.insert(itl_ms.end(), o.itl_ms.begin(), o.itl_ms.end());
  tpot_ms.insert(tpot_ms.end(), o.tpot_ms.begin(), o.tpot_ms.end());
  output_tokens += o.output_tokens;
  for (auto& [k, v] : o.finish_reasons) finish_reasons[k] += v;
  for (auto& e : o.error_samples)
    if (error_samples.size() < 5) error_samples.push_back(e);
}

}  // namespace garden::bench
