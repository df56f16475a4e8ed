// Whole-forward benchmark of rose's Qwen3 embedding pass on the CPU backend (the fp32 reference
// that the embedded default and every GPU kernel test run on), without the mesh.
//
// Workloads: one sequence of 128 / 512 / 2048 tokens (--tokens), last-token pooling + L2, causal
// attention, on a checkpoint of the Qwen3-Embedding-0.6B layer shapes
// (`rose-mkmodel --shape qwen3-0.6b`). For each length: one warm-up pass, then --iters timed
// passes; the median wall time (first enqueue to the end of synchronize) and the process CPU time
// of that pass are reported, with the effective GFLOP/s of the pass's matmul work (the four
// linear layers per layer plus the causal attention's q·kᵀ and p·v). Correctness before timing:
// the pooled embedding must be finite and of unit norm, and the repeated passes must give the
// same bits (the CPU backend is deterministic for a fixed thread count).
//
//   rose_cpu_forward_bench MODEL_DIR [--tokens 128,512,2048] [--iters 3] [--threads 0]
// Prints one table (markdown); exit 0 when every check passed, 2 otherwise.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "services/rose/model/qwen3.h"
#include "services/rose/ops/backend.h"

namespace {

double processCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<int> parseList(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p != 0;) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || v <= 0) return {};
    out.push_back(static_cast<int>(v));
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace garden;
  using namespace garden::rose;
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: rose_cpu_forward_bench MODEL_DIR [--tokens 128,512,2048] [--iters N] "
                 "[--threads N]\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<int> lengths = {128, 512, 2048};
  int iters = 3, threads = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokens") {
      lengths = parseList(argv[i + 1]);
    } else if (a == "--iters") {
      iters = std::max(1, std::atoi(argv[i + 1]));
    } else if (a == "--threads") {
      threads = std::max(0, std::atoi(argv[i + 1]));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (lengths.empty()) {
    std::fprintf(stderr, "--tokens: a comma-separated list of positive lengths\n");
    return 2;
  }
  const int longest = *std::max_element(lengths.begin(), lengths.end());
  BackendOptions bo;
  bo.threads = threads;
  bo.max_batch_tokens = longest;
  auto backend = makeBackend("cpu", bo);
  if (!backend.isOk()) {
    std::fprintf(stderr, "%s\n", backend.status().toString().c_str());
    return 1;
  }
  Backend& b = **backend;
  Qwen3Options mo;
  mo.max_batch_tokens = longest;
  mo.pooling_override = PoolMode::kLast;
  mo.load_lm_head = false;
  mo.causal = 1;
  auto model = Qwen3Model::load(dir, b, mo);
  if (!model.isOk()) {
    std::fprintf(stderr, "%s\n", model.status().toString().c_str());
    return 1;
  }
  Qwen3Model& m = **model;
  const ModelConfig& c = m.config();
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads,
                hkv = c.num_key_value_heads, inter = c.intermediate_size;
  // Multiply-adds per token of the four linear layers of one layer.
  const double linear_macs =
      static_cast<double>(h * (hq + 2 * hkv) * d + hq * d * h + h * 2 * inter + inter * h);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(m.vocabSize()) - 1);
  int failures = 0;
  std::printf(
      "# rose cpu forward: Qwen3 %lld layers, hidden %lld, %lld/%lld heads of %lld, "
      "intermediate %lld; one sequence; median of %d after 1 warm-up\n",
      static_cast<long long>(c.num_hidden_layers), static_cast<long long>(h),
      static_cast<long long>(hq), static_cast<long long>(hkv), static_cast<long long>(d),
      static_cast<long long>(inter), iters);
  std::printf("| tokens | wall ms | cpu s | GFLOP | GFLOP/s (wall) | GFLOP/s per cpu-s |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|\n");
  for (int len : lengths) {
    std::vector<int32_t> ids(static_cast<size_t>(len)), lens{len};
    for (auto& x : ids) x = tok(rng);
    const BatchInput in{ids, lens};
    if (Status st = m.validate(in); !st.isOk()) {
      std::fprintf(stderr, "%d tokens: %s\n", len, st.toString().c_str());
      return 1;
    }
    std::vector<float> first(static_cast<size_t>(h)), out(static_cast<size_t>(h));
    m.enqueueEmbed(in, PoolMode::kLast, true, first.data());
    if (!b.synchronize().isOk()) return 1;
    double norm = 0;
    bool finite = true;
    for (float v : first) {
      finite = finite && std::isfinite(v);
      norm += static_cast<double>(v) * v;
    }
    if (!finite || std::fabs(std::sqrt(norm) - 1.0) > 1e-3) {
      std::printf("CHECK FAILED %d tokens: embedding not finite or not unit norm (%f)\n", len,
                  std::sqrt(norm));
      ++failures;
    }
    std::vector<double> wall, cpu;
    for (int i = 0; i < iters; ++i) {
      const double c0 = processCpuSeconds();
      const auto t0 = std::chrono::steady_clock::now();
      m.enqueueEmbed(in, PoolMode::kLast, true, out.data());
      if (!b.synchronize().isOk()) return 1;
      wall.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      cpu.push_back(processCpuSeconds() - c0);
      if (std::memcmp(out.data(), first.data(), out.size() * sizeof(float)) != 0) {
        std::printf("CHECK FAILED %d tokens: pass %d differs from the first\n", len, i);
        ++failures;
      }
    }
    std::sort(wall.begin(), wall.end());
    std::sort(cpu.begin(), cpu.end());
    const double w = wall[wall.size() / 2], cs = cpu[cpu.size() / 2];
    // Causal attention: sum over t of (t+1) keys, q·k and p·v, per q head.
    const double attn_macs =
        static_cast<double>(hq * d) * 2.0 * (static_cast<double>(len) * (len + 1) / 2.0);
    const double gflop =
        2.0 * static_cast<double>(c.num_hidden_layers) * (linear_macs * len + attn_macs) / 1e9;
    std::printf("| %d | %.1f | %.2f | %.1f | %.1f | %.1f |\n", len, w, cs, gflop, gflop / (w / 1e3),
                gflop / cs);
    std::fflush(stdout);
  }
  return failures == 0 ? 0 : 2;
}
