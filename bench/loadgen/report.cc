#include "bench/loadgen/report.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <thread>

#include "common/json_writer.h"

namespace garden::bench {

namespace {
std::string commandOutput(const char* cmd) {
  std::string out;
  FILE* f = popen(cmd, "r");
  if (!f) return out;
  char buf[512];
  while (fgets(buf, sizeof(buf), f)) out += buf;
  pclose(f);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  for (auto& c : out)
    if (c == '\n') c = ';';
  return out;
}

void summaryObject(JsonWriter& w, std::string_view key, const std::vector<double>& samples) {
  LatencySummary s = summarize(samples);
  w.key(key).beginObject();
  w.field("count", s.count).field("min", s.min).field("mean", s.mean).field("p50", s.p50);
  w.field("p90", s.p90).field("p99", s.p99).field("max", s.max);
  w.endObject();
}
}  // namespace

HostInfo describeHost() {
  HostInfo h;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) h.hostname = name;
  std::ifstream cpu("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpu, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto c = line.find(':');
      h.cpu = line.substr(c + 2);
      break;
    }
  }
  h.cores = static_cast<int>(std::thread::hardware_concurrency());
  utsname u{};
  if (uname(&u) == 0) h.kernel = std::string(u.sysname) + " " + u.release;
  h.gpu = commandOutput(
      "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null");
  if (h.gpu.empty()) h.gpu = "none";
  return h;
}

std::string isoNowUtc() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string renderReport(const RunReport& r) {
  const Recorder& rec = r.measured.rec;
  const double wall = r.measured.wall_s > 0 ? r.measured.wall_s : 1e-9;
  JsonWriter w;
  w.beginObject();
  w.field("schema", "garden.bench.result.v1");
  w.field("workload", r.workload).field("suite", r.suite).field("system", r.system);
  w.field("date", r.date).field("git_commit", r.commit);
  w.key("host").beginObject();
  w.field("hostname", r.host.hostname).field("cpu", r.host.cpu).field("cores", r.host.cores);
  w.field("kernel", r.host.kernel).field("gpu", r.host.gpu).endObject();
  w.key("flags").beginObject();
  for (auto& [k, v] : r.flags) w.field(k, v);
  w.endObject();
  w.key("config").beginObject();
  w.field("mode", modeName(r.mode)).field("protocol", protocolName(r.protocol));
  w.field("input", inputKindName(r.input)).field("endpoint", r.endpoint);
  w.field("batch", r.batch).field("seq_len", r.seq_len).field("concurrency", r.concurrency);
  w.field("warmup", r.warmup).field("count", r.count).field("duration_s", r.duration_s);
  w.endObject();
  w.key("model").beginObject();
  w.field("name", r.model.name).field("kind", r.model.kind);
  w.field("hidden_size", r.model.hidden_size).field("max_seq_len", r.model.max_seq_len);
  w.field("vocab_size", r.model.vocab_size).endObject();
  w.key("input_tokens").beginObject();
  w.field("per_input_mean", r.input_tokens_mean).field("per_input_min", r.input_tokens_min);
  w.field("per_input_max", r.input_tokens_max).endObject();
  w.key("requests").beginObject();
  w.field("ok", rec.ok).field("errors", rec.errors);
  w.key("by_status").beginObject();
  for (auto& [k, v] : rec.by_status) w.field(k, v);
  w.endObject();
  w.key("error_samples").beginArray();
  for (auto& e : rec.error_samples) w.value(e);
  w.endArray().endObject();
  w.field("duration_s", r.measured.wall_s);
  summaryObject(w, "latency_ms", rec.latency_ms);
  w.key("throughput").beginObject();
  w.field("requests_per_s", static_cast<double>(rec.ok) / wall);
  w.field("items_per_s", static_cast<double>(rec.items) / wall);
  if (r.mode == Mode::kEmbed) w.field("embeddings_per_s", static_cast<double>(rec.items) / wall);
  w.field("tokens_per_s", static_cast<double>(rec.tokens) / wall);
  w.endObject();
  if (!rec.server_total_us.empty()) {
    w.key("server_us").beginObject();
    summaryObject(w, "queue", rec.server_queue_us);
    summaryObject(w, "inference", rec.server_inference_us);
    summaryObject(w, "total", rec.server_total_us);
    w.endObject();
  }
  if (!rec.gw_total_us.empty()) {  // HTTP embeddings: ivy's timing headers
    w.key("gateway_us").beginObject();
    summaryObject(w, "tokenize", rec.gw_tokenize_us);
    summaryObject(w, "upstream", rec.gw_upstream_us);
    summaryObject(w, "total", rec.gw_total_us);
    summaryObject(w, "own", rec.gw_own_us);
    summaryObject(w, "tulip_queue", rec.gw_tulip_queue_us);
    summaryObject(w, "tulip_inference", rec.gw_tulip_inference_us);
    summaryObject(w, "client", rec.gw_client_us);
    w.endObject();
  }
  if (r.mode == Mode::kChat) {
    w.key("chat").beginObject();
    summaryObject(w, "ttft_ms", rec.ttft_ms);
    summaryObject(w, "itl_ms", rec.itl_ms);
    summaryObject(w, "tpot_ms", rec.tpot_ms);
    w.field("output_tokens", rec.output_tokens);
    w.field("output_tokens_per_s", static_cast<double>(rec.output_tokens) / wall);
    w.key("finish_reasons").beginObject();
    for (auto& [k, v] : rec.finish_reasons) w.field(k, v);
    w.endObject();
    w.endObject();
  }
  w.endObject();
  std::string out = w.take();
  out.push_back('\n');
  return out;
}

std::string summaryLine(const RunReport& r) {
  const Recorder& rec = r.measured.rec;
  LatencySummary s = summarize(rec.latency_ms);
  double wall = r.measured.wall_s > 0 ? r.measured.wall_s : 1e-9;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "%s: %llu ok, %llu err, p50 %.3f ms p90 %.3f ms p99 %.3f ms max %.3f ms, "
                "%.1f items/s, %.0f tokens/s over %.2f s",
                r.workload.c_str(), static_cast<unsigned long long>(rec.ok),
                static_cast<unsigned long long>(rec.errors), s.p50, s.p90, s.p99, s.max,
                static_cast<double>(rec.items) / wall, static_cast<double>(rec.tokens) / wall,
                r.measured.wall_s);
  return buf;
}

}  // namespace garden::bench
