// gpt-oss forward steps on the CUDA backend without the mesh (rose's GptOssModel straight on a
// checkpoint directory, e.g. bench/suites/make_random_gpt_oss.py's random 20b-shaped one).
// Workloads (each warmed up once, then timed; wall time of the whole step incl. host planning,
// synchronized):
//   load        checkpoint → GPU (MXFP4 experts resident unless --moe-weights bf16)
//   prefill L   one sequence of L random tokens, in chunks of --max-batch-tokens, sampling the
//               last token (TTFT without the mesh)
//   decode B@C  B sequences with C tokens of context each, one token per sequence per step;
//               median step time over --decode-steps → B / step tokens/s
// Output: one line per workload (and a JSON line with --json FILE).
//   rose_llm_bench --model DIR [--prefill 2048,8192,32768] [--decode 1@8192,64@1024]
//                  [--decode-steps 32] [--max-batch-tokens 16384] [--moe-weights auto|mxfp4|bf16]
//                  [--cuda-graphs on|off] [--kv-tokens N] [--profile]   (one decode step per workload between cudaProfilerStart/Stop, for
//                                 ncu --profile-from-start off)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "services/rose/model/gpt_oss.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/ops/paged_kv_cache.h"

namespace {

using namespace garden;
using namespace garden::rose;
using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct Bench {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LlmOps> ops;
  std::unique_ptr<GptOssModel> model;
  std::unique_ptr<PagedKvCache> kv;
  int32_t block_size = 16;
  int32_t next_block = 0;
  int64_t max_batch_tokens = 16384;
  double last_host_s = 0;  // host time of the last step's enqueue (before the GPU finished)
  std::mt19937 rng{1};

  struct Seq {
    std::vector<int32_t> tokens;
    int32_t cached = 0;
    std::vector<int32_t> blocks;
  };

  void ensureBlocks(Seq& s, int32_t tokens) {
    const int32_t need = (tokens + block_size - 1) / block_size;
    while (static_cast<int32_t>(s.blocks.size()) < need) {
      if (next_block >= kv->shape().num_blocks) {
        std::fprintf(stderr, "out of KV blocks\n");
        std::exit(1);
      }
      s.blocks.push_back(next_block++);
    }
  }

  // One step: each sequence computes min(pending, budget share) tokens; samples when done.
  double step(std::vector<Seq*> seqs) {
    std::vector<LlmStepSeq> desc;
    std::vector<int32_t> toks, blocks;
    int64_t budget = max_batch_tokens;
    std::vector<Seq*> ran;
    for (Seq* s : seqs) {
      const int32_t pending = static_cast<int32_t>(s->tokens.size()) - s->cached;
      const int32_t n = static_cast<int32_t>(std::min<int64_t>(pending, budget));
      if (n <= 0) continue;  // out of budget this step
      ran.push_back(s);
      budget -= n;
      ensureBlocks(*s, s->cached + n);
      LlmStepSeq d;
      d.token_offset = static_cast<int32_t>(toks.size());
      d.num_tokens = n;
      d.position = s->cached;
      d.block_offset = static_cast<int32_t>(blocks.size());
      d.num_blocks = static_cast<int32_t>(s->blocks.size());
      d.sample = n == pending ? 1 : 0;
      desc.push_back(d);
      toks.insert(toks.end(), s->tokens.begin() + s->cached, s->tokens.begin() + s->cached + n);
      blocks.insert(blocks.end(), s->blocks.begin(), s->blocks.end());
    }
    LlmStep st{desc, toks, blocks};
    Status v = model->validate(st, *kv);
    if (!v.isOk()) {
      std::fprintf(stderr, "invalid step: %s\n", v.toString().c_str());
      std::exit(1);
    }
    std::vector<int32_t> sampled(ran.size());
    const auto t0 = Clock::now();
    backend->launch([&] { model->enqueueStep(st, *kv, nullptr, sampled.data()); });
    last_host_s = std::chrono::duration<double>(Clock::now() - t0).count();
    Status s = backend->synchronize();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!s.isOk()) {
      std::fprintf(stderr, "step failed: %s\n", s.toString().c_str());
      std::exit(1);
    }
    size_t si = 0;
    for (size_t i = 0; i < ran.size(); ++i) {
      ran[i]->cached += desc[i].num_tokens;
      if (desc[i].sample) ran[i]->tokens.push_back(sampled[si++]);
    }
    return secs;
  }

  std::vector<int32_t> randomTokens(int n) {
    std::uniform_int_distribution<int32_t> d(0, 199997);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = d(rng);
    return t;
  }

  // Seconds to prefill one sequence of `len` tokens (all chunks) and sample its first token.
  double prefill(int len) {
    next_block = 0;
    Seq s;
    s.tokens = randomTokens(len);
    double total = 0;
    while (s.cached < len) total += step({&s});
    return total;
  }

  // Median decode step time for `batch` sequences at `ctx` tokens of context (and the median
  // host enqueue time in *host_s). profile: one extra step between cudaProfilerStart/Stop.
  double decode(int batch, int ctx, int steps, double* host_s = nullptr, bool profile = false) {
    next_block = 0;
    std::vector<Seq> seqs(static_cast<size_t>(batch));
    std::vector<Seq*> ptrs;
    for (auto& s : seqs) {
      s.tokens = randomTokens(ctx);
      ptrs.push_back(&s);
    }
    // Prefill the contexts (not timed).
    bool pending = true;
    while (pending) {
      pending = false;
      std::vector<Seq*> todo;
      for (auto* s : ptrs) {
        if (s->cached < static_cast<int32_t>(s->tokens.size()) - 1) todo.push_back(s);
      }
      if (todo.empty()) break;
      pending = true;
      step(todo);
    }
    std::vector<double> times, host;
    for (int i = 0; i < steps; ++i) {
      times.push_back(step(ptrs));
      host.push_back(last_host_s);
    }
    if (profile) {
      cudaProfilerStart();
      step(ptrs);
      cudaProfilerStop();
    }
    std::sort(times.begin(), times.end());
    std::sort(host.begin(), host.end());
    if (host_s) *host_s = host[host.size() / 2];
    return times[times.size() / 2];
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, json_path, moe = "auto";
  std::string prefill_list = "2048,8192,32768", decode_list = "1@8192,64@1024";
  int decode_steps = 32;
  int64_t max_batch_tokens = 16384;
  bool graphs = true;     // --cuda-graphs on|off: decode steps as CUDA graphs
  int64_t kv_tokens = 0;  // --kv-tokens N: size the KV cache for at least N tokens
  bool profile = false;  // one decode step of each --decode workload between profiler markers
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") model_dir = next();
    else if (a == "--prefill") prefill_list = next();
    else if (a == "--decode") decode_list = next();
    else if (a == "--decode-steps") decode_steps = std::atoi(next().c_str());
    else if (a == "--max-batch-tokens") max_batch_tokens = std::atoll(next().c_str());
    else if (a == "--moe-weights") moe = next();
    else if (a == "--json") json_path = next();
    else if (a == "--profile") profile = true;
    else if (a == "--cuda-graphs") graphs = next() == "on";
    else if (a == "--kv-tokens") kv_tokens = std::atoll(next().c_str());
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (model_dir.empty()) {
    std::fprintf(stderr, "--model DIR is required\n");
    return 2;
  }
  Bench b;
  b.max_batch_tokens = max_batch_tokens;
  BackendOptions bo;
  bo.max_batch_tokens = max_batch_tokens;
  auto be = makeBackend("cuda", bo);
  if (!be.isOk()) {
    std::fprintf(stderr, "%s\n", be.status().toString().c_str());
    return 1;
  }
  b.backend = std::move(be).value();
  b.ops = makeLlmOps(*b.backend).value();
  GptOssOptions go;
  go.max_batch_tokens = max_batch_tokens;
  go.max_seqs = 256;
  go.max_logits_rows = 256;
  go.max_model_len = 131072;
  go.cuda_graphs = graphs;
  go.moe_weights = moe == "bf16" ? MoeWeightsMode::kDense
                   : moe == "mxfp4" ? MoeWeightsMode::kMxfp4
                                    : MoeWeightsMode::kAuto;
  const auto t0 = Clock::now();
  auto m = GptOssModel::load(model_dir, *b.backend, *b.ops, go);
  if (!m.isOk()) {
    std::fprintf(stderr, "load: %s\n", m.status().toString().c_str());
    return 1;
  }
  b.model = std::move(m).value();
  const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  // KV cache: the largest prefill or decode working set, in 16-token blocks.
  int64_t need_tokens = 0;
  for (const auto& p : split(prefill_list, ',')) need_tokens = std::max<int64_t>(need_tokens, std::atoll(p.c_str()) + 16);
  for (const auto& d : split(decode_list, ',')) {
    auto bc = split(d, '@');
    if (bc.size() != 2) {
      std::fprintf(stderr, "--decode entries are BATCH@CONTEXT\n");
      return 2;
    }
    const int64_t batch = std::atoll(bc[0].c_str()), ctx = std::atoll(bc[1].c_str());
    need_tokens = std::max<int64_t>(need_tokens, batch * (ctx + decode_steps + 2 * 16));
  }
  need_tokens = std::max(need_tokens, kv_tokens);
  const int32_t blocks = static_cast<int32_t>((need_tokens + 15) / 16 + 64);
  auto kv = PagedKvCache::create(*b.backend, b.model->kvShape(blocks, 16), b.model->kvDType());
  if (!kv.isOk()) {
    std::fprintf(stderr, "kv cache: %s\n", kv.status().toString().c_str());
    return 1;
  }
  b.kv = std::move(kv).value();
  size_t mem_free = 0, mem_total = 0;
  cudaMemGetInfo(&mem_free, &mem_total);
  std::printf("load %.2f s (experts %s), kv cache %d blocks = %lld tokens (%.2f GB); GPU memory "
              "used %.1f GB, free %.1f GB of %.1f GB\n",
              load_s, b.model->expertFormat() == ExpertFormat::kMxfp4 ? "mxfp4" : "dense", blocks,
              static_cast<long long>(blocks) * 16, static_cast<double>(b.kv->bytes()) / 1e9,
              static_cast<double>(mem_total - mem_free) / 1e9, static_cast<double>(mem_free) / 1e9,
              static_cast<double>(mem_total) / 1e9);
  std::ofstream json;
  if (!json_path.empty()) json.open(json_path);
  for (const auto& p : split(prefill_list, ',')) {
    const int len = std::atoi(p.c_str());
    b.prefill(len);  // warm-up (GEMM tuning, first-use allocations)
    const double s = b.prefill(len);
    if (profile) {
      cudaProfilerStart();
      b.prefill(len);
      cudaProfilerStop();
    }
    std::printf("prefill %6d tokens: %.4f s  (%.0f tokens/s)\n", len, s, len / s);
    std::fflush(stdout);
    if (json) json << "{\"workload\":\"prefill\",\"tokens\":" << len << ",\"seconds\":" << s << "}\n";
  }
  for (const auto& d : split(decode_list, ',')) {
    auto bc = split(d, '@');
    const int batch = std::atoi(bc[0].c_str()), ctx = std::atoi(bc[1].c_str());
    b.decode(batch, ctx, 4);  // warm-up
    double host = 0;
    const double s = b.decode(batch, ctx, decode_steps, &host, profile);
    std::printf("decode batch %3d @ %6d: step %.3f ms, host enqueue %.3f ms  (%.0f tokens/s)\n",
                batch, ctx, s * 1e3, host * 1e3, batch / s);
    std::fflush(stdout);
    if (json) json << "{\"workload\":\"decode\",\"batch\":" << batch << ",\"context\":" << ctx
                   << ",\"step_seconds\":" << s << "}\n";
  }
  return 0;
}
