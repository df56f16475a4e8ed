// gpt-oss forward steps on the CUDA backend without the mesh (rose's GptOssModel straight on a
// checkpoint directory, e.g. bench/suites/make_random_gpt_oss.py's random 20b-shaped one).
// Workloads (each warmed up once, then timed; wall time of the whole step incl. host planning,
// synchronized):
//   load        checkpoint → GPU (MXFP4 experts resident unless --moe-weights bf16; fp8 adds the
//               FP8 copy the prefill-sized MoE steps use, and prints its inexact weight count)
//   prefill L   one sequence of L random tokens, in chunks of --max-batch-tokens, sampling the
//               last token (TTFT without the mesh)
//   decode B@C  B sequences with C tokens of context each, one token per sequence per step;
//               median step time over --decode-steps → B / step tokens/s
// Output: one line per workload (and a JSON line with --json FILE).
//   rose_llm_bench --model DIR [--prefill 2048,8192,32768] [--decode 1@8192,64@1024]
//                  [--decode-steps 32] [--max-batch-tokens 16384]
//                  [--moe-weights auto|mxfp4|fp8|mxfp4-bf16|bf16] [--fp8-min-tokens N]
//                  [--cuda-graphs on|off] [--residual f32|bf16] [--router f32|bf16] [--norm-round once|twice] [--kv-tokens N] [--masks D]
//                  [--dtype bfloat16|float16] [--attn-dtype D] [--moe-dtype D] [--head-dtype D]
//                  [--moe-out f32|act] [--proj-out f32|f16|qkv|o]
//                  [--profile] [--bar-dump DIR [--bar-prompts L1,L2,...]] [--moe-k-slices N]
//                  [--fuse-combine-norm on|off] [--moe-wide on|off] [--moe-wide-min-avg N]
//   --moe-wide off: block_m 64 MXFP4 tiles take the tiled kernel, not the wide one [TAG_MOE_WIDE];
//   --moe-wide-min-avg N: rows per expert on average above which MXFP4 experts take block_m 64
//              (default cuda::kMoeWideDefaultMinAvg).
//   --gemm-small-buckets on|off: the dense GEMMs tune M <= 8 in power-of-two buckets (default on,
//              cuda::setLlmGemmSmallBuckets [TAG_GEMM_SMALL_BUCKETS]); off: one bucket 1..64.
//   --gemm-gemv on|off: also time the CUDA-core GEMV for the small buckets [TAG_GEMV] (default
//              off: not yet verified on a GPU).
//   --attn-prefill sm90|sm90basic|sm90c2|sm90c2s4|mma: prefill chunks of >= 128 tokens of the
//              full-causal layers take the Hopper paged attention (3 consumer warpgroups, 192
//              rows per block, pipelined or basic; or 2, 128 rows, with a 2- or 4-tile K/V ring)
//              or the mma.sync kernel like decode
//              (default sm90) [TAG_PAGED_ATTN_SM90]; --attn-sm90-min-tokens N moves the threshold.
//   --attn-bench C@H,...: the attention op alone (see attnBench), then exit.
//   --kv-copy L1,L2,... [--kv-copy-layers 24|36]: the prefill/decode handoff's KV block copy
//              alone (see kvCopyBench), then exit.
//   --moe-prefill auto|chunk|step|tiled: MXFP4 MoE work on the wgmma kernel (or dequantized per
//              call into bf16 and run as per-expert cuBLASLt GEMMs [TAG_MOE_LT_BF16]) for whole
//              steps of >= 64 rows per expert where the wgmma kernel runs every expert, else as
//              chunk (auto, the default, as rose) [TAG_MOE_PREFILL_AUTO]; for each prefill chunk
//              of >= --moe-prefill-min-rows N (default 256; 64 with the wgmma kernel) rows per
//              expert on its own (chunk); for whole steps that large (step, alias cublas); or
//              never (tiled).
//   --prefill-reps N: time each --prefill length N times after its warm-up, report the median.
//   --moe-lt-streams N, --moe-lt-epilogue on|off, --moe-lt-overlap on|off: how that path runs
//              (CudaKernelOptions::moe_lt_*: its per-expert GEMMs over N streams, the expert
//              biases as GEMM epilogues, the down experts dequantized on a stream of their own
//              during the gate_up GEMMs; defaults as rose) [TAG_MOE_LT_STREAMS].
//   --moe-lt-wgmma on|off: that path's GEMMs as one wgmma launch per projection over the MXFP4
//              experts instead (moe_wgmma.cuh) [TAG_MOE_WGMMA]; --moe-wgmma-min-rows N: with it,
//              chunks of >= min(N, --moe-prefill-min-rows) rows per expert take the path
//              (default 64); --moe-wgmma-device-plan on|off: its token tiles planned on the
//              device, no host wait per layer (default on) [TAG_MOE_WGMMA_DEVICE_PLAN];
//              --moe-wgmma-smem-a on|off: its dequantized weights through shared memory, a
//              dequantization warpgroup of its own (default off) [TAG_MOE_WGMMA_SMEM_A].
//   --attn-split-keys N: a decode token's keys are split into chunks of at least N (multiple of
//              64; default: cuda::pagedAttnSplitKeysFor's rule) for the split-KV attention.
//   --attn-decode-warps on|off: single-token (decode) attention items on the four-warp path
//              [TAG_ATTN_DECODE_WARPS] (default off: slower at batch 1) or the two-stage
//              one-warp path.
//   --attn-carveout PCT: the preferred shared-memory carveout of the RoPE, attention and combine
//              kernels (A/B of the decode attention's shared memory).
//   --fuse-combine-norm on|off: each layer's MoE combine fused into the next RMSNorm
//              (GptOssOptions::fuse_combine_norm [TAG_COMBINE_NORM]; same bits; default on).
//   --profile-skip LIST: leave these op groups out of every forward pass (norm, qkv, rope, attn,
//              oproj, router, moe, head; GptOssOptions::profile_skip): the step time against
//              the full step is their cost inside the CUDA graph (the outputs are wrong).
//   --gemm-flush read|write: how the GEMM tuner flushes L2 before each timed run (read: a read
//              pass leaving clean lines; write: a memset, the default until measured)
//              [TAG_GEMM_READ_FLUSH].
//   --router-fused on|off: the f32 router's top-k inside the router kernel (default off,
//              cuda::setRouterFusedRoute [TAG_ROUTER_FUSED_ROUTE]; same bits); off: the separate
//              route kernel.
//   --router-tiled-min N: steps of >= N tokens run the f32 router's register-tiled kernel (same
//              bits; default 128, 0 = never) [TAG_ROUTER_F32_TILED]; --router-tiled-rows on|off: its
//              f32 rows staged as they lie, coalesced (default off: no gain measured)
//              [TAG_ROUTER_F32_TILED_ROWS]; --router-tiled-tok 32|64: its token tile (same bits)
//              [TAG_ROUTER_F32_TILED_TOK].
//   --moe-align-multiblock on|off: large steps' MoE align on many blocks (default on; same
//              output) [TAG_MOE_ALIGN_MULTIBLOCK].
//   --route-align on|off: decode-sized steps' route and MoE align in one kernel (default off: no
//              gain measured; same output) [TAG_ROUTE_ALIGN].
//   --router-mma on|off: the f32 router on bf16 tensor cores with split operands (default off,
//              CudaKernelOptions::router_mma [TAG_ROUTER_MMA]); off: the CUDA-core f32 kernel.
//   --moe-prefetch N: the MXFP4 decode MoE kernel asks L2 for its weight tiles N K tiles beyond
//              its register ring (cuda::setMoeL2Prefetch [TAG_MOE_L2_PREFETCH]; same bits; 0 off).
//              With --moe-gemm, a list: the default decode shape at each distance.
//   --pdl-gemv on|off: the M = 1 QKV / O-proj on the CUDA-core GEMV launched programmatically
//              (CudaKernelOptions::pdl_gemv [TAG_PDL_GEMV], default off: the tuned cuBLASLt
//              choice, or the GEMV timed beside it with --gemm-gemv on).
//   --gemm-row-invariant on|off: every M bucket of gpt-oss's dense GEMMs held to one reference
//              algorithm's bits (CudaKernelOptions::gemm_row_invariant [TAG_GEMM_ROW_INVARIANT];
//              on by default).
//   --chain-pdl on|off: the K-chain GEMM kernel launched programmatically, its first weight
//              tiles streamed before it waits for the previous kernel (CudaKernelOptions::chain_pdl
//              [TAG_CHAIN_PDL]; on by default since s25).
//   --pdl-graph on|off: rose's own gpt-oss kernels launched programmatically, in CUDA graphs too
//              (CudaKernelOptions::pdl_graph [TAG_PDL_GRAPH]; same bits).
//   --moe-decode-variant N: the shape of the block_m 16 MXFP4 decode MoE kernel for every step
//              (cuda::setMoeDecodeVariant; same bits; 0 the default).
//   --moe-k-slices N: the decode-regime expert GEMMs sum K in N fixed slices (1..8; default 1,
//              one chain) [TAG_MOE_K_SLICES]. With --moe-gemm, a list
//              (e.g. 1,2,4,8): every count is timed.
//   --masks D: every sampled sequence draws under a random token mask allowing a fraction D of
//              the vocabulary (structured outputs [TAG_TOKEN_MASK]: the masks' upload and the
//              masked sampler, as rose sees a step from tulip; not tulip's mask computation).
//              Compare the decode step with and without to get the rose side of the
//              constrained path's cost. Needs a sampler that announces token masks.
//   --profile: one decode step per workload between cudaProfilerStart/Stop, for
//              ncu --profile-from-start off
//   --batch-check B1,B2,... [--batch-check-prompt N]: instead of timing, whether one sequence's
//              tokens and logits depend on the batch around it (batchCheck below)
//   --bar-dump DIR [--bar-prompts 16,64,256,1024,2100]: instead of timing, the rose side of the
//              real-shape accuracy bar (bench/suites/hf_llm_bar20b.py runs Hugging Face
//              transformers in fp32 and fp32+TF32 on the same tokens): per prompt length L,
//              random tokens (std::mt19937 seeded with L, uniform in [0, 199997]) prefilled in
//              chunks of 256 with every row's logits; per position the argmax and the two
//              largest logits go to DIR/rose_top2_<i>.bin (int32 id, float first, float second),
//              the tokens to DIR/seqs.json; prompts of <= 64 tokens also every row's logits
//              (DIR/rose_logits_<i>.f32, float32 [L, vocab]).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "common/safetensors.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/ops/paged_kv_cache.h"
#include "services/rose/parallel/kv_handoff.h"
#include "services/rose/ops/cuda/cuda_backend.h"
#include "services/rose/ops/cuda/gemm.h"
#include "services/rose/ops/cuda/moe_lt_gemm.h"
#include "services/rose/ops/cuda/llm_ops_cuda.h"
#include "services/rose/ops/cuda/moe_gemm.cuh"
#include "services/rose/ops/cuda/moe_router_f32.cuh"
#include "services/rose/ops/cuda/moe_permute.cuh"
#include "services/rose/ops/cuda/paged_attention.cuh"
#include "services/rose/ops/cuda/rope_kv.cuh"
#include "services/rose/ops/cuda/paged_attention_sm90.cuh"

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
  // GPU span of the last step / of the last prefill's steps: from an event recorded before the
  // step's first operation to one after its last (CUDA only; 0 elsewhere). wall - span = the
  // host's own time around the step (planning, the final wait's wake-up).
  double last_gpu_s = 0, last_prefill_gpu_s = 0;
  cudaEvent_t span_ev[2] = {nullptr, nullptr};
  std::mt19937 rng{1};
  double mask_density = 0;      // --masks: 0 = unconstrained
  std::vector<uint32_t> masks;  // one random mask per sampled row, reused every step

  struct Seq {
    std::vector<int32_t> tokens;
    int32_t cached = 0;
    std::vector<int32_t> blocks;
    bool logits = false;  // return the row it samples from (LogitsMode::kLast) into step's `logits`
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
  // `logits`: room for the rows of the sampling sequences that set Seq::logits, in their order.
  double step(std::vector<Seq*> seqs, float* logits = nullptr) {
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
      if (d.sample && s->logits && logits != nullptr) d.logits = LogitsMode::kLast;
      if (d.sample && mask_density > 0) {
        int32_t k = 0;
        for (const LlmStepSeq& e : desc) k += e.mask_index > 0;
        d.mask_index = k + 1;
      }
      desc.push_back(d);
      toks.insert(toks.end(), s->tokens.begin() + s->cached, s->tokens.begin() + s->cached + n);
      blocks.insert(blocks.end(), s->blocks.begin(), s->blocks.end());
    }
    const int64_t words = (model->vocabSize() + 31) / 32;
    size_t num_masks = 0;
    for (const LlmStepSeq& e : desc) num_masks += e.mask_index > 0;
    if (num_masks * static_cast<size_t>(words) > masks.size()) {
      std::uniform_real_distribution<double> u(0, 1);
      const size_t have = masks.size() / static_cast<size_t>(words);
      masks.resize(num_masks * static_cast<size_t>(words), 0);
      for (size_t m = have; m < num_masks; ++m) {
        for (int64_t id = 0; id < model->vocabSize(); ++id) {
          if (u(rng) < mask_density || id == 0) {
            masks[m * static_cast<size_t>(words) + static_cast<size_t>(id / 32)] |= 1u << (id % 32);
          }
        }
      }
    }
    LlmStep st{desc, toks, blocks, {},
               std::span<const uint32_t>(masks.data(), num_masks * static_cast<size_t>(words)),
               words};
    Status v = model->validate(st, *kv);
    if (!v.isOk()) {
      std::fprintf(stderr, "invalid step: %s\n", v.toString().c_str());
      std::exit(1);
    }
    std::vector<int32_t> sampled(ran.size());
    auto* cb = dynamic_cast<cuda::CudaBackend*>(backend.get());
    if (cb != nullptr && span_ev[0] == nullptr) {
      cudaEventCreate(&span_ev[0]);
      cudaEventCreate(&span_ev[1]);
    }
    const auto t0 = Clock::now();
    if (cb != nullptr) cudaEventRecord(span_ev[0], cb->stream());
    backend->launch([&] { model->enqueueStep(st, *kv, logits, sampled.data()); });
    if (cb != nullptr) cudaEventRecord(span_ev[1], cb->stream());
    last_host_s = std::chrono::duration<double>(Clock::now() - t0).count();
    Status s = backend->synchronize();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    last_gpu_s = 0;
    if (cb != nullptr) {
      float ms = 0.f;
      if (cudaEventElapsedTime(&ms, span_ev[0], span_ev[1]) == cudaSuccess) last_gpu_s = ms / 1e3;
    }
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
    last_prefill_gpu_s = 0;
    while (s.cached < len) {
      total += step({&s});
      last_prefill_gpu_s += last_gpu_s;
    }
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
    std::vector<double> times, host, gpu;
    for (int i = 0; i < steps; ++i) {
      times.push_back(step(ptrs));
      host.push_back(last_host_s);
      gpu.push_back(last_gpu_s);
    }
    if (profile) {
      cudaProfilerStart();
      step(ptrs);
      cudaProfilerStop();
    }
    std::sort(times.begin(), times.end());
    std::sort(host.begin(), host.end());
    std::sort(gpu.begin(), gpu.end());
    if (host_s) *host_s = host[host.size() / 2];
    last_gpu_s = gpu[gpu.size() / 2];  // the median GPU span
    return times[times.size() / 2];
  }
};


// --bar-dump (see the header).
int barDump(Bench& b, const std::string& dir, const std::string& list) {
  const int64_t vocab = b.model->vocabSize();
  constexpr int32_t kChunk = 256;  // <= GptOssOptions::max_logits_rows below
  std::vector<float> lg(static_cast<size_t>(kChunk * vocab));
  std::string js = "[";
  int idx = 0;
  for (const auto& p : split(list, ',')) {
    const int len = std::atoi(p.c_str());
    std::mt19937 rng(static_cast<uint32_t>(len));
    std::uniform_int_distribution<int32_t> dist(0, 199997);
    Bench::Seq s;
    s.tokens.resize(static_cast<size_t>(len));
    for (auto& t : s.tokens) t = dist(rng);
    b.next_block = 0;
    b.ensureBlocks(s, len);
    std::ofstream f(dir + "/rose_top2_" + std::to_string(idx) + ".bin", std::ios::binary);
    // Prompts of up to 64 tokens also keep every row's logits (cosine / error size vs the peer).
    std::ofstream full;
    if (len <= 64)
      full.open(dir + "/rose_logits_" + std::to_string(idx) + ".f32", std::ios::binary);
    for (int32_t pos = 0; pos < len; pos += kChunk) {
      const int32_t n = std::min<int32_t>(kChunk, len - pos);
      std::vector<LlmStepSeq> desc(1);
      desc[0].num_tokens = n;
      desc[0].position = pos;
      desc[0].num_blocks = (pos + n + b.block_size - 1) / b.block_size;
      desc[0].logits = LogitsMode::kAll;
      std::vector<int32_t> toks(s.tokens.begin() + pos, s.tokens.begin() + pos + n);
      LlmStep st{desc, toks, std::span<const int32_t>(s.blocks.data(), static_cast<size_t>(desc[0].num_blocks))};
      Status v = b.model->validate(st, *b.kv);
      if (!v.isOk()) {
        std::fprintf(stderr, "invalid step: %s\n", v.toString().c_str());
        return 1;
      }
      b.backend->launch([&] { b.model->enqueueStep(st, *b.kv, lg.data(), nullptr); });
      Status sy = b.backend->synchronize();
      if (!sy.isOk()) {
        std::fprintf(stderr, "step failed: %s\n", sy.toString().c_str());
        return 1;
      }
      if (full.is_open())
        full.write(reinterpret_cast<const char*>(lg.data()),
                   static_cast<std::streamsize>(static_cast<size_t>(n) * static_cast<size_t>(vocab) * 4));
      for (int32_t r = 0; r < n; ++r) {
        const float* row = lg.data() + static_cast<size_t>(r) * static_cast<size_t>(vocab);
        int32_t best = 0;
        float v1 = -INFINITY, v2 = -INFINITY;
        for (int64_t i = 0; i < vocab; ++i) {
          if (row[i] > v1) {
            v2 = v1;
            v1 = row[i];
            best = static_cast<int32_t>(i);
          } else if (row[i] > v2) {
            v2 = row[i];
          }
        }
        f.write(reinterpret_cast<const char*>(&best), 4);
        f.write(reinterpret_cast<const char*>(&v1), 4);
        f.write(reinterpret_cast<const char*>(&v2), 4);
      }
    }
    if (idx > 0) js += ',';
    js += "{\"prompt_len\":";
    js += std::to_string(len);
    js += ",\"tokens\":[";
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (i > 0) js += ',';
      js += std::to_string(s.tokens[i]);
    }
    js += "]}";
    std::printf("bar dump: prompt %d tokens -> rose_top2_%d.bin\n", len, idx);
    ++idx;
  }
  std::ofstream(dir + "/seqs.json") << js << "]\n";
  return 0;
}

// --batch-check B1,B2,... [TAG_BATCH_CHECK]: does a sequence's output depend on what else is in
// its batch, at the checkpoint's real shapes? One target sequence (a --batch-check-prompt token
// random prompt, default 1000) is prefilled in one step and decoded greedily for --decode-steps
// steps alone; then as the first of B sequences whose other prompts are random (40..1500
// tokens): prefilled in the same step as the first chunks of the others, decoded beside their
// prefill chunks and their decodes. Two passes each: ids only (decode steps on the CUDA-graph
// path, as served) and with the target's logits row every step (eager). Prints, per B and
// pass, how many of the target's tokens equal the alone run's and the first step whose logits
// row differs in any bit (with the row's largest |difference| there). Exit 3 when any
// differ, so the suite can tell; a tie broken differently shows as a token and a logits
// difference at the same step.
int batchCheck(Bench& b, const std::string& list, int prompt_len, int steps) {
  const int64_t vocab = b.model->vocabSize();
  b.rng.seed(20261206);  // the same prompts on every run
  std::uniform_int_distribution<int> len(40, 1500);
  const std::vector<int32_t> target = b.randomTokens(prompt_len);
  struct Run {
    std::vector<int32_t> ids;
    std::vector<std::vector<float>> rows;
  };
  auto run = [&](const std::vector<std::vector<int32_t>>& others, bool logits) {
    b.next_block = 0;
    std::vector<Bench::Seq> seqs(1 + others.size());
    seqs[0].tokens = target;
    seqs[0].logits = logits;
    for (size_t i = 0; i < others.size(); ++i) seqs[i + 1].tokens = others[i];
    std::vector<Bench::Seq*> ptrs;
    for (auto& q : seqs) ptrs.push_back(&q);
    Run r;
    std::vector<float> row(static_cast<size_t>(vocab));
    // The prefill's token, then `steps` decode tokens.
    while (static_cast<int>(r.ids.size()) < steps + 1) {
      const size_t had = seqs[0].tokens.size();
      b.step(ptrs, logits ? row.data() : nullptr);
      if (seqs[0].tokens.size() > had) {
        r.ids.push_back(seqs[0].tokens.back());
        if (logits) r.rows.push_back(row);
      }
    }
    return r;
  };
  const Run alone_ids = run({}, false), alone_rows = run({}, true);
  bool all_equal = alone_ids.ids == alone_rows.ids;
  std::printf("batch check: target prompt %d tokens, %d decode steps; alone, ids-only and "
              "logits passes give %s tokens\n",
              prompt_len, steps, all_equal ? "the same" : "DIFFERENT");
  for (const auto& e : split(list, ',')) {
    const int batch = std::atoi(e.c_str());
    std::vector<std::vector<int32_t>> others;
    for (int i = 1; i < batch; ++i) others.push_back(b.randomTokens(len(b.rng)));
    for (bool logits : {false, true}) {
      const Run got = run(others, logits);
      const Run& want = logits ? alone_rows : alone_ids;
      size_t same = 0;
      int first_token = -1;
      for (size_t i = 0; i < want.ids.size(); ++i) {
        if (got.ids[i] == want.ids[i]) {
          ++same;
        } else if (first_token < 0) {
          first_token = static_cast<int>(i);
        }
      }
      int first_row = -1;
      double max_diff = 0;
      for (size_t i = 0; logits && i < want.rows.size() && first_row < 0; ++i) {
        if (std::memcmp(got.rows[i].data(), want.rows[i].data(),
                        static_cast<size_t>(vocab) * sizeof(float)) != 0) {
          first_row = static_cast<int>(i);
          for (int64_t v = 0; v < vocab; ++v)
            max_diff = std::max(max_diff, std::fabs(static_cast<double>(got.rows[i][v]) -
                                                    want.rows[i][v]));
        }
      }
      const bool equal = first_token < 0 && first_row < 0;
      all_equal = all_equal && equal;
      std::printf("batch check B=%d %s: tokens equal %zu/%zu (first differing step %d)", batch,
                  logits ? "logits" : "ids", same, want.ids.size(), first_token);
      if (logits)
        std::printf(", logits rows equal bit for bit %s (first differing step %d, max |diff| "
                    "%.3g there)",
                    first_row < 0 ? "every step" : "NOT", first_row, max_diff);
      std::printf("%s\n", equal ? "" : "  BATCH-DEPENDENT");
      std::fflush(stdout);
    }
  }
  return all_equal ? 0 : 3;
}

// A CUDA backend and its LLM ops reserved for gpt-oss-20b's shapes (hidden 2880, 32 experts,
// top-4, 64 q / 8 kv heads of 64) at the given step limits, for the op benchmarks; nullopt with
// the reason on stderr when either fails.
// The --moe-lt-* flags (CudaKernelOptions::moe_lt_*), for both backends this program makes.
CudaKernelOptions g_lt_flags;
void applyLtFlags(BackendOptions& bo) {
  bo.cuda.moe_lt_streams = g_lt_flags.moe_lt_streams;
  bo.cuda.moe_lt_bias_epilogue = g_lt_flags.moe_lt_bias_epilogue;
  bo.cuda.moe_lt_overlap_dequant = g_lt_flags.moe_lt_overlap_dequant;
  bo.cuda.moe_lt_wgmma = g_lt_flags.moe_lt_wgmma;
  bo.cuda.moe_wgmma_min_rows_per_expert = g_lt_flags.moe_wgmma_min_rows_per_expert;
  bo.cuda.router_mma = g_lt_flags.router_mma;
  bo.cuda.pdl_gemv = g_lt_flags.pdl_gemv;
  bo.cuda.gemm_row_invariant = g_lt_flags.gemm_row_invariant;  // [TAG_GEMM_ROW_INVARIANT]
  bo.cuda.chain_pdl = g_lt_flags.chain_pdl;                    // [TAG_CHAIN_PDL]
  bo.cuda.pdl_graph = g_lt_flags.pdl_graph;
  bo.cuda.moe_wgmma_device_plan = g_lt_flags.moe_wgmma_device_plan;
  bo.cuda.moe_wgmma_smem_a = g_lt_flags.moe_wgmma_smem_a;  // [TAG_MOE_WGMMA_SMEM_A]
}

struct OpsBench {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LlmOps> ops;
};
std::optional<OpsBench> makeOpsBench(int64_t max_tokens, int32_t max_seqs, int64_t max_model_len) {
  BackendOptions bo;
  applyLtFlags(bo);
  auto be = makeBackend("cuda", bo);
  if (!be.isOk()) {
    std::fprintf(stderr, "backend: %s\n", be.status().toString().c_str());
    return std::nullopt;
  }
  OpsBench b;
  b.backend = std::move(be).value();
  b.ops = makeLlmOps(*b.backend).value();
  LlmOpsLimits lim;
  lim.max_tokens = max_tokens;
  lim.max_seqs = max_seqs;
  lim.max_logits_rows = 1;
  lim.max_model_len = max_model_len;
  lim.vocab = 1;
  lim.hidden = 2880;
  lim.intermediate = 2880;
  lim.num_experts = 32;
  lim.top_k = 4;
  lim.num_q_heads = 64;
  lim.num_kv_heads = 8;
  lim.head_dim = 64;
  if (Status st = b.ops->reserve(lim); !st.isOk()) {
    std::fprintf(stderr, "reserve: %s\n", st.toString().c_str());
    return std::nullopt;
  }
  return b;
}

// --moe-gemm T1,T2,...: LlmOps::moeExperts alone at gpt-oss-20b's expert shapes (32 experts,
// top-4, hidden = intermediate = 2880, MXFP4 resident, random codes and scales), T tokens with
// random distinct experts each; kLayers weight copies are cycled so the weights come from HBM as
// in a forward pass. For each K slice count [TAG_MOE_K_SLICES] the tiled kernel (its relative L2
// difference from the one-chain sum printed) and each decode-kernel shape (setMoeDecodeVariant
// 0, 5, 1-3, their bits compared with the tiled kernel's at the same slicing) are timed with CUDA
// events (median of 7 batches of 24 calls). Prints one line per (T, slices, kernel). With
// --moe-weights fp8 also the FP8 experts (uploaded with the FP8 copy, every T forced onto it) and
// their relative L2 difference from the MXFP4 tiled kernel. Always also the bf16 cuBLASLt path
// [TAG_MOE_LT_BF16] (every T forced onto it; the experts dequantized per call) and its relative
// L2 difference from the tiled kernel.
int moeGemmBench(const std::string& list, bool fp8, const std::vector<int>& slices,
                 const std::vector<int>& prefetch) {
  constexpr int kLayers = 6, kE = 32, kK = 4, kH = 2880, kI = 2880;
  std::vector<int> ts;
  for (const auto& x : split(list, ',')) ts.push_back(std::atoi(x.c_str()));
  const int tmax = *std::max_element(ts.begin(), ts.end());
  std::optional<OpsBench> ob = makeOpsBench(tmax, tmax, 4096);
  if (!ob) return 1;
  std::unique_ptr<Backend> backend = std::move(ob->backend);
  std::unique_ptr<LlmOps> ops = std::move(ob->ops);
  std::mt19937 rng(5);
  auto mx = [&](int64_t rows, int64_t cols, std::vector<uint8_t>& c, std::vector<uint8_t>& sc) {
    c.resize(static_cast<size_t>(kE * rows * cols / 2));
    sc.resize(static_cast<size_t>(kE * rows * cols / 32));
    for (auto& b : c) b = static_cast<uint8_t>(rng());
    for (auto& b : sc) b = static_cast<uint8_t>(118 + rng() % 3);
  };
  std::vector<ExpertWeights> w1, w2;
  std::vector<OwnedTensor> b1, b2;
  cuda::setMoeLtBf16MinTokens(INT64_MAX);  // switched on (off for every step): the scratch exists
  cuda::setMoeLtBf16MinRowsPerExpert(0);    // the runs below decide by tokens alone
  {
    std::vector<uint8_t> c1, s1, c2, s2;
    mx(2 * kI, kH, c1, s1);
    mx(kH, kI, c2, s2);
    for (int l = 0; l < kLayers; ++l) {
      const ExpertCopy copy = fp8 ? ExpertCopy::kFp8 : ExpertCopy::kNone;
      w1.push_back(ops->uploadMxfp4Experts(c1.data(), s1.data(), kE, 2 * kI, kH, copy).value());
      w2.push_back(ops->uploadMxfp4Experts(c2.data(), s2.data(), kE, kH, kI, copy).value());
      b1.push_back(backend->allocateTensor(DType::kBF16, {kE, 2 * kI}).value());
      b2.push_back(backend->allocateTensor(DType::kBF16, {kE, kH}).value());
      std::vector<float> z(static_cast<size_t>(kE * 2 * kI), 0.01f);
      (void)backend->uploadConvert(b1.back().view, {z.data(), DType::kF32, kE * 2 * kI});
      (void)backend->uploadConvert(b2.back().view, {z.data(), DType::kF32, kE * kH});
    }
  }
  auto x = backend->allocateTensor(DType::kBF16, {tmax, kH}).value();
  auto out = backend->allocateTensor(DType::kBF16, {tmax, kH}).value();
  auto ids = backend->allocateTensor(DType::kI32, {tmax, kK}).value();
  auto wts = backend->allocateTensor(DType::kF32, {tmax, kK}).value();
  {
    std::vector<float> xv(static_cast<size_t>(tmax * kH));
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : xv) v = nd(rng);
    (void)backend->uploadConvert(x.view, {xv.data(), DType::kF32, tmax * kH});
    std::vector<int32_t> iv;
    std::vector<float> wv;
    for (int i = 0; i < tmax; ++i) {
      std::vector<int32_t> perm(kE);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int j = 0; j < kK; ++j) {
        iv.push_back(perm[static_cast<size_t>(j)]);
        wv.push_back(0.25f);
      }
    }
    backend->copyToDevice(ids.view, iv.data(), iv.size() * sizeof(int32_t));
    (void)backend->uploadConvert(wts.view, {wv.data(), DType::kF32, tmax * kK});
    (void)backend->synchronize();
  }
  MoeExpertsParams mp{kE, kK, kH, kI, 7.f, 1.702f};
  cudaStream_t stream = dynamic_cast<cuda::CudaBackend&>(*backend).stream();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto bitsToFloat = [](uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  auto relL2 = [&](const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double fa = bitsToFloat(a[i]), fb = bitsToFloat(b[i]);
      num += (fa - fb) * (fa - fb);
      den += fb * fb;
    }
    return std::sqrt(num / std::max(den, 1e-30));
  };
  for (int t : ts) {
    const Tensor xt = x.view.rowSlice(0, t), ot = out.view.rowSlice(0, t);
    const Tensor it = ids.view.rowSlice(0, t), wt = wts.view.rowSlice(0, t);
    std::vector<uint16_t> chain, ref, got(static_cast<size_t>(t * kH));
    // Per K slice count [TAG_MOE_K_SLICES]: the tiled kernel first (its bits are the reference
    // for that slicing), then each decode-kernel shape at block_m 16, then (one chain only) each
    // wide-kernel shape at block_m 64 [TAG_MOE_WIDE] and the default choice; then the FP8
    // experts once.
    enum class Kind { kTiled, kDecode, kWide, kAuto, kFp8, kLtBf16 };
    struct Run {
      int slices;
      Kind kind;
      int variant = 0;   // the decode or wide kernel's shape
      int prefetch = 0;  // MoeGemmArgs::l2_prefetch [TAG_MOE_L2_PREFETCH]
    };
    std::vector<Run> runs;
    for (int sl : slices) {
      runs.push_back({sl, Kind::kTiled});
      if (!prefetch.empty()) {  // --moe-prefetch: the default decode shape at each distance
        for (int pf : prefetch) runs.push_back({sl, Kind::kDecode, 0, pf});
      } else {
        for (int v : {0, 5, 1, 2, 3}) runs.push_back({sl, Kind::kDecode, v});
      }
      if (sl == 1) {
        for (int v : {0, 1, 2, 3}) runs.push_back({sl, Kind::kWide, v});
        runs.push_back({sl, Kind::kAuto});
      }
    }
    if (fp8) runs.push_back({cuda::kMoeDefaultKSlices, Kind::kFp8});
    runs.push_back({cuda::kMoeDefaultKSlices, Kind::kLtBf16});
    for (const Run& run : runs) {
      const int sl = run.slices;
      cuda::setMoeKSlices(sl);
      cuda::setMoeDecodeVariant(run.kind == Kind::kTiled    ? -1
                                : run.kind == Kind::kDecode ? run.variant
                                                            : 0);
      cuda::setMoeWideVariant(run.kind == Kind::kWide                                ? run.variant
                              : run.kind == Kind::kAuto || run.kind == Kind::kFp8 ||
                                        run.kind == Kind::kLtBf16
                                  ? 0
                                                                                  : -1);
      cuda::setMoeBlockMOverride(run.kind == Kind::kWide ? 64 : 0);
      cuda::setMoeFp8MinTokens(run.kind == Kind::kFp8 ? 1 : INT64_MAX);
      cuda::setMoeLtBf16MinTokens(run.kind == Kind::kLtBf16 ? 1 : INT64_MAX);
      cuda::setMoeL2Prefetch(run.prefetch);
      auto call = [&](int l) {
        ops->moeExperts(xt, it, wt, w1[static_cast<size_t>(l)], b1[static_cast<size_t>(l)].view,
                        w2[static_cast<size_t>(l)], b2[static_cast<size_t>(l)].view, ot, mp);
      };
      for (int l = 0; l < kLayers; ++l) call(l);
      (void)backend->synchronize();
      cudaMemcpy(got.data(), ot.data, got.size() * 2, cudaMemcpyDeviceToHost);
      std::string note;
      if (run.kind == Kind::kTiled) {
        ref = got;
        if (sl == 1) chain = got;
        char buf[96];
        std::snprintf(buf, sizeof buf, "  rel_l2 vs one chain %.2e", chain.empty() ? 0.0 : relL2(got, chain));
        note = buf;
      } else if (run.kind == Kind::kFp8 || run.kind == Kind::kLtBf16) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "  rel_l2 vs the MXFP4 tiled kernel %.4f", relL2(got, ref));
        note = buf;
      } else {
        note = got == ref ? "  bits == tiled" : "  OUTPUT DIFFERS FROM THE TILED KERNEL";
      }
      std::vector<float> us;
      for (int rep = 0; rep < 7; ++rep) {
        cudaEventRecord(e0, stream);
        for (int i = 0; i < 24; ++i) call(i % kLayers);
        cudaEventRecord(e1, stream);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        us.push_back(ms * 1000.f / 24);
      }
      std::sort(us.begin(), us.end());
      if (run.kind == Kind::kFp8 || run.kind == Kind::kLtBf16) {
        std::printf("moe T=%4d %-15s: %8.2f us/call (min %.2f)%s\n", t,
                    run.kind == Kind::kFp8 ? "fp8" : "bf16 cublaslt", us[3], us[0], note.c_str());
      } else {
        const std::string name = run.kind == Kind::kTiled  ? "tiled"
                                 : run.kind == Kind::kAuto ? "auto"
                                 : run.kind == Kind::kWide ? "wide v" + std::to_string(run.variant)
                                 : run.prefetch > 0 ? "dec pf" + std::to_string(run.prefetch)
                                                           : "dec v" + std::to_string(run.variant);
        std::printf("moe T=%4d slices %d %-7s: %8.2f us/call (min %.2f)%s\n", t, sl, name.c_str(),
                    us[3], us[0], note.c_str());
      }
      std::fflush(stdout);
    }
  }
  cuda::setMoeKSlices(cuda::kMoeDefaultKSlices);
  cuda::setMoeL2Prefetch(cuda::kMoeDefaultL2Prefetch);
  cuda::setMoeDecodeVariant(0);
  cuda::setMoeWideVariant(0);
  cuda::setMoeBlockMOverride(0);
  cuda::setMoeFp8MinTokens(cuda::kMoeFp8DefaultMinTokens);
  cuda::setMoeLtBf16MinTokens(0);
  return 0;
}


// --kv-copy L1,L2,...: the prefill/decode handoff's KV copy alone [TAG_KV_PULL_CUDA]
// (Backend::copyKvBlocks, the kernel of a kKvPull batch): one sequence of L tokens at gpt-oss's KV
// shape (--kv-copy-layers 24 for 20b, 36 for 120b; 8 kv heads, head_dim 64, blocks of 16, bf16;
// every other layer a window layer of 128 tokens in its own pool, which keeps only the 9 blocks
// the next query can see), source blocks in order, destination ids shuffled, between two caches
// of one process on one GPU (the decode rose reads the prefill rose's pools through CUDA IPC; on
// one GPU that is the same memory). ms per copy (median of 9 after a warm-up, CUDA events) and
// GB/s of bytes read (the same again are written).
int kvCopyBench(const std::string& list, int32_t layers) {
  BackendOptions bo;
  auto be = makeBackend("cuda", bo);
  if (!be.isOk()) {
    std::fprintf(stderr, "%s\n", be.status().toString().c_str());
    return 1;
  }
  Backend& backend = **be;
  auto* cb = static_cast<cuda::CudaBackend*>(&backend);
  std::vector<int64_t> lens;
  for (const auto& x : split(list, ',')) lens.push_back(std::atoll(x.c_str()));
  const int64_t lmax = *std::max_element(lens.begin(), lens.end());
  constexpr int32_t kBs = 16, kWindowBlocks = 128 / kBs + 1;
  KvCacheShape shape;
  shape.num_layers = layers;
  shape.num_blocks = static_cast<int32_t>(kvBlocksFor(lmax, kBs) + 16);
  shape.block_size = kBs;
  shape.num_kv_heads = 8;
  shape.head_dim = 64;
  shape.num_blocks_window = 4 * kWindowBlocks;
  for (int32_t l = 0; l < layers && l < 64; l += 2) shape.window_layers |= uint64_t{1} << l;
  auto src = PagedKvCache::create(backend, shape, DType::kBF16);
  auto dst = PagedKvCache::create(backend, shape, DType::kBF16);
  if (!src.isOk() || !dst.isOk()) {
    std::fprintf(stderr, "kv caches: %s\n",
                 (src.isOk() ? dst.status() : src.status()).toString().c_str());
    return 1;
  }
  const int64_t block_bytes = int64_t{kBs} * 8 * 64 * 2;
  std::mt19937 rng(3);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (const int64_t len : lens) {
    const int32_t nb = static_cast<int32_t>(kvBlocksFor(len, kBs));
    const int32_t nw = std::min(nb, kWindowBlocks);
    std::vector<int32_t> ids(static_cast<size_t>(shape.num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> pairs, wpairs;
    for (int32_t b = 0; b < nb; ++b) pairs.insert(pairs.end(), {b, ids[static_cast<size_t>(b)]});
    for (int32_t b = 0; b < nw; ++b) wpairs.insert(wpairs.end(), {b, (b * 7) % shape.num_blocks_window});
    // (the window ids: 7 is coprime with 4 * 9, so they are distinct)
    const KvPoolView view = kvPoolView(**src);
    std::vector<float> ms;
    for (int rep = 0; rep < 10; ++rep) {
      cudaEventRecord(e0, cb->stream());
      const Status st = copyKvBlocks(backend, view, **dst, pairs, wpairs);
      cudaEventRecord(e1, cb->stream());
      if (!st.isOk()) {
        std::fprintf(stderr, "kv copy: %s\n", st.toString().c_str());
        return 1;
      }
      cudaEventSynchronize(e1);
      float t = 0;
      cudaEventElapsedTime(&t, e0, e1);
      if (rep > 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const int32_t wl = shape.numWindowLayers();
    const double bytes =
        2.0 * block_bytes * (static_cast<double>(layers - wl) * nb + static_cast<double>(wl) * nw);
    const double med = ms[ms.size() / 2];
    std::printf("kv copy L=%6lld layers %d: %6d + %d window blocks, %8.1f MB read, %7.3f ms "
                "(min %.3f), %6.0f GB/s read\n",
                static_cast<long long>(len), layers, nb, nw, bytes / 1e6, med, ms.front(),
                bytes / (med * 1e-3) / 1e9);
    std::fflush(stdout);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 0;
}

// --attn-bench C@H,...: gpt-oss-20b's attention op alone (64 q heads, 8 kv heads, head_dim 64,
// sinks, KV blocks of 16 in shuffled order) for one sequence's prefill chunk of C tokens after H
// cached ones, full causal and window 128, on the mma.sync kernel and the Hopper kernel
// (pipelined and basic) [TAG_PAGED_ATTN_SM90]: ms per launch (median of 7 after a warm-up),
// TFLOP/s (4 * 64 heads * 64 * visible keys per row), and the Hopper outputs' relative L2 and
// max |diff| against the mma.sync output (bf16; they differ by rounding only).
int attnBench(const std::string& list) {
  constexpr int kHq = 64, kHkv = 8, kD = 64, kBs = 16;
  std::vector<std::pair<int, int>> cases;
  int max_ctx = 0, max_chunk = 0;
  for (const auto& x : split(list, ',')) {
    const size_t at = x.find('@');
    const int c = std::atoi(x.substr(0, at).c_str());
    const int h = at == std::string::npos ? 0 : std::atoi(x.substr(at + 1).c_str());
    if (c <= 0 || h < 0) {
      std::fprintf(stderr, "--attn-bench: cases are CHUNK@HISTORY\n");
      return 2;
    }
    cases.emplace_back(c, h);
    max_ctx = std::max(max_ctx, c + h);
    max_chunk = std::max(max_chunk, c);
  }
  std::optional<OpsBench> ob = makeOpsBench(max_chunk, 1, max_ctx);
  if (!ob) return 1;
  std::unique_ptr<Backend> backend = std::move(ob->backend);
  std::unique_ptr<LlmOps> ops = std::move(ob->ops);
  const int32_t blocks = (max_ctx + kBs - 1) / kBs + 8;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto kv = PagedKvCache::create(*backend, KvCacheShape{1, blocks, kBs, kHkv, kD},
                                 backend->activationDType())
                .value();
  {
    std::vector<float> host(static_cast<size_t>(blocks) * kBs * kHkv * kD);
    for (const Tensor& t : {kv->keys(0), kv->values(0)}) {
      for (float& v : host) v = nd(rng);
      (void)backend->uploadConvert(t, {host.data(), DType::kF32, static_cast<int64_t>(host.size())});
    }
  }
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const int64_t width = (kHq + 2 * kHkv) * kD;
  auto qkv = backend->allocateTensor(DType::kBF16, {max_chunk, width}).value();
  {
    std::vector<float> host(static_cast<size_t>(max_chunk * width));
    for (float& v : host) v = nd(rng);
    (void)backend->uploadConvert(qkv.view, {host.data(), DType::kF32, static_cast<int64_t>(host.size())});
  }
  auto sinks = backend->allocateTensor(DType::kF32, {kHq}).value();
  {
    std::vector<float> host(kHq);
    for (float& v : host) v = nd(rng);
    backend->copyToDevice(sinks.view, host.data(), host.size() * sizeof(float));
  }
  auto tables = backend->allocateTensor(DType::kI32, {1, blocks}).value();
  backend->copyToDevice(tables.view, table.data(), table.size() * sizeof(int32_t));
  auto cu = backend->allocateTensor(DType::kI32, {2}).value();
  auto pos = backend->allocateTensor(DType::kI32, {max_chunk}).value();
  auto out = backend->allocateTensor(DType::kBF16, {max_chunk, kHq * kD}).value();
  struct Variant {
    const char* name;
    int32_t min_tokens;
    bool pipelined;
    int32_t stages;
    int32_t consumers;
  };
  const Variant variants[] = {{"mma", 0, true, 2, 3},       {"sm90", 1, true, 2, 3},
                              {"sm90basic", 1, false, 2, 3}, {"sm90c2", 1, true, 2, 2},
                              {"sm90c2s4", 1, true, 4, 2},   {"sm90c2basic", 1, false, 2, 2}};
  for (const auto& [chunk, hist] : cases) {
    const std::vector<int32_t> cu_h{0, chunk};
    std::vector<int32_t> pos_h(static_cast<size_t>(chunk));
    std::iota(pos_h.begin(), pos_h.end(), hist);
    backend->copyToDevice(cu.view, cu_h.data(), cu_h.size() * sizeof(int32_t));
    backend->copyToDevice(pos.view, pos_h.data(), pos_h.size() * sizeof(int32_t));
    const Tensor q_view{qkv.view.data, DType::kBF16, {chunk, width}};
    const Tensor o_view{out.view.data, DType::kBF16, {chunk, kHq * kD}};
    const Tensor pos_view{pos.view.data, DType::kI32, {chunk}};
    for (int32_t window : {0, 128}) {
      double keys = 0;
      for (int32_t p : pos_h) keys += window > 0 ? std::min(p + 1, window) : p + 1;
      const double flops = 4.0 * kHq * kD * keys;
      std::vector<uint16_t> ref;
      for (const Variant& v : variants) {
        cuda::setPagedAttnSm90(v.min_tokens, v.pipelined, v.stages, /*windows=*/true, v.consumers);
        const std::vector<int32_t> windows{window};
        AttentionPlanInput plan{cu_h, pos_h, windows, kHq, kHkv, kD};
        PagedAttentionParams p;
        p.num_seqs = 1;
        p.num_q_heads = kHq;
        p.num_kv_heads = kHkv;
        p.head_dim = kD;
        p.block_size = kBs;
        p.max_blocks_per_seq = blocks;
        p.max_context = chunk + hist;
        p.sliding_window = window;
        p.scale = 0.125f;
        std::vector<double> ms;
        for (int rep = 0; rep < 8; ++rep) {
          ops->planAttention(plan);
          (void)backend->synchronize();
          const auto t0 = std::chrono::steady_clock::now();
          ops->pagedAttention(q_view, kv->keys(0), kv->values(0), cu.view, pos_view, tables.view,
                              sinks.view, o_view, p);
          (void)backend->synchronize();
          const auto t1 = std::chrono::steady_clock::now();
          if (rep > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        std::vector<uint16_t> got(static_cast<size_t>(chunk) * kHq * kD);
        backend->copyToHost(got.data(), o_view, got.size() * 2);
        (void)backend->synchronize();
        double num = 0, den = 0, maxd = 0;
        size_t nonfinite = 0;
        if (ref.empty()) {
          ref = got;
        }
        for (size_t i = 0; i < got.size(); ++i) {
          const double a = bf16ToF32(got[i]), b = bf16ToF32(ref[i]);
          if (!std::isfinite(a)) ++nonfinite;
          num += (a - b) * (a - b);
          den += b * b;
          maxd = std::max(maxd, std::fabs(a - b));
        }
        const Result<bool> wd = cuda::pagedAttnSm90WatchdogFired();
        const bool fired = !wd.isOk() || wd.value();
        std::printf("attn chunk %d after %d window %d %-11s %8.3f ms %6.1f TFLOP/s  vs mma rel_l2 "
                    "%.2e max_abs %.2e non-finite %zu watchdog %s\n",
                    chunk, hist, window, v.name, med, flops / med / 1e9, den > 0 ? std::sqrt(num / den) : 0.0,
                    maxd, nonfinite, fired ? "FIRED" : "ok");
        std::fflush(stdout);
      }
    }
  }
  cuda::setPagedAttnSm90(cuda::kPagedAttnSm90DefaultMinTokens, true);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  std::string attn_prefill = "sm90";
  int32_t attn_min_tokens = cuda::kPagedAttnSm90DefaultMinTokens;
  CudaKernelOptions::MoePrefill moe_prefill = CudaKernelOptions{}.moe_prefill;  // [TAG_MOE_LT_BF16]
  int64_t lt_min_rows = kMoePrefillMinRowsPerExpert;
  std::string model_dir, json_path, moe = "auto";
  std::string prefill_list = "2048,8192,32768", decode_list = "1@8192,64@1024";
  int decode_steps = 32;
  int prefill_reps = 1;  // --prefill-reps N: timed runs per prefill length (median reported)
  int64_t max_batch_tokens = 16384;
  bool graphs = true;     // --cuda-graphs on|off: decode steps as CUDA graphs
  bool f32_residual = true;  // --residual f32|bf16: GptOssOptions::f32_residual
  bool f32_router = true;    // --router f32|bf16: GptOssOptions::f32_router
  bool round_once = true;    // --norm-round once|twice: GptOssOptions::norm_round_once
  bool attn_f16 = false;     // --attn-dtype bfloat16|float16: GptOssOptions::attn_f16 [TAG_ATTN_F16]
  bool moe_f16 = false;      // --moe-dtype bfloat16|float16: GptOssOptions::moe_f16
  bool head_f16 = false;     // --head-dtype bfloat16|float16: GptOssOptions::head_f16 (--dtype: all three)
  bool moe_out_f32 = false;  // --moe-out f32|act: GptOssOptions::moe_out_f32
  bool proj_f32 = false;     // --proj-out f32|f16: GptOssOptions::proj_f32 [TAG_PROJ_F32]
  bool proj_qkv = true, proj_o = true;  // --proj-out qkv / o: only that projection in f32
  // (--dtype float16: all five on, as rose's --dtype; a later --moe-out / --proj-out overrides)
  bool fuse_cn = GptOssOptions{}.fuse_combine_norm;
  uint32_t profile_skip = 0;  // --profile-skip norm,qkv,...: GptOssOptions::profile_skip  // --fuse-combine-norm on|off: GptOssOptions::fuse_combine_norm
  int64_t kv_tokens = 0;  // --kv-tokens N: size the KV cache for at least N tokens
  std::string moe_list;   // --moe-gemm T1,T2,...: time the MoE experts op alone (no model)
  std::string kv_copy_list;    // --kv-copy L1,L2,...: the KV handoff copy alone [TAG_KV_PULL_CUDA]
  int32_t kv_copy_layers = 24;  // --kv-copy-layers N
  std::string k_slices = std::to_string(cuda::kMoeDefaultKSlices);  // --moe-k-slices N[,N...]
  std::string prefetch_list;  // --moe-prefetch N[,N...] [TAG_MOE_L2_PREFETCH]
  bool profile = false;  // one decode step of each --decode workload between profiler markers
  int64_t fp8_min_tokens = 0;  // --fp8-min-tokens N: MoE steps of >= N tokens use the FP8 copy
  double mask_density = 0;  // --masks D
  std::string bar_dir, bar_prompts = "16,64,256,1024,2100";  // --bar-dump DIR, --bar-prompts
  std::string batch_check;           // --batch-check B1,B2,... [TAG_BATCH_CHECK]
  int batch_check_prompt = 1000;     // --batch-check-prompt N
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
    else if (a == "--residual") f32_residual = next() == "f32";
    else if (a == "--router") f32_router = next() == "f32";
    else if (a == "--attn-dtype") attn_f16 = next() == "float16";
    else if (a == "--moe-dtype") moe_f16 = next() == "float16";
    else if (a == "--head-dtype") head_f16 = next() == "float16";
    else if (a == "--moe-out") moe_out_f32 = next() == "f32";
    else if (a == "--proj-out") {
      const std::string v = next();
      if (v != "f32" && v != "f16" && v != "qkv" && v != "o") {
        std::fprintf(stderr, "--proj-out: f32, f16, qkv or o\n");
        return 2;
      }
      proj_f32 = v != "f16";
      proj_qkv = v != "o";
      proj_o = v != "qkv";
    }
    else if (a == "--dtype") {
      GptOssOptions d;
      if (!applyGptOssDtype(next(), d)) {
        std::fprintf(stderr, "--dtype must be bfloat16 or float16\n");
        return 2;
      }
      attn_f16 = d.attn_f16, moe_f16 = d.moe_f16, head_f16 = d.head_f16;
      moe_out_f32 = d.moe_out_f32, proj_f32 = d.proj_f32;
    } else if (a == "--norm-round") round_once = next() == "once";
    else if (a == "--fuse-combine-norm") fuse_cn = next() == "on";
    else if (a == "--profile-skip") {
      for (const auto& g : split(next(), ',')) {
        using G = GptOssOptions;
        const uint32_t bit = g == "norm" ? G::kSkipNorm : g == "qkv" ? G::kSkipQkv
                           : g == "rope" ? G::kSkipRope : g == "attn" ? G::kSkipAttn
                           : g == "oproj" ? G::kSkipOproj : g == "router" ? G::kSkipRouter
                           : g == "moe" ? G::kSkipMoe : g == "head" ? G::kSkipHead : 0u;
        if (bit == 0) {
          std::fprintf(stderr, "--profile-skip: unknown group '%s'\n", g.c_str());
          return 2;
        }
        profile_skip |= bit;
      }
    }
    else if (a == "--kv-tokens") kv_tokens = std::atoll(next().c_str());
    else if (a == "--moe-gemm") moe_list = next();
    else if (a == "--moe-k-slices") k_slices = next();
    else if (a == "--moe-prefetch") prefetch_list = next();
    else if (a == "--moe-wide-min-avg") cuda::setMoeWideMinAvg(std::atoi(next().c_str()));
    else if (a == "--moe-wide") cuda::setMoeWideVariant(next() == "off" ? -1 : 0);
    else if (a == "--moe-decode-variant") cuda::setMoeDecodeVariant(std::atoi(next().c_str()));
    else if (a == "--attn-bench") return attnBench(next());
    else if (a == "--kv-copy") kv_copy_list = next();
    else if (a == "--kv-copy-layers") kv_copy_layers = std::atoi(next().c_str());
    else if (a == "--attn-prefill") {
      const std::string v = next();
      if (v != "sm90" && v != "sm90basic" && v != "sm90c2" && v != "sm90c2s4" && v != "mma") {
        std::fprintf(stderr, "--attn-prefill: sm90, sm90basic, sm90c2, sm90c2s4 or mma\n");
        return 2;
      }
      attn_prefill = v;
    } else if (a == "--attn-sm90-min-tokens") {
      attn_min_tokens = std::atoi(next().c_str());
    }
    else if (a == "--attn-split-keys") cuda::setPagedAttnSplitKeys(std::atoi(next().c_str()));
    else if (a == "--attn-decode-warps") cuda::setPagedAttnDecodeWarps(next() == "on");
    else if (a == "--attn-carveout") {
      const int pct = std::atoi(next().c_str());
      if (!cuda::setPagedAttnCarveout(pct).isOk() || !cuda::setRopeKvCarveout(pct).isOk()) {
        std::fprintf(stderr, "--attn-carveout: the attribute was refused\n");
        return 2;
      }
    }
    else if (a == "--gemm-small-buckets") cuda::setLlmGemmSmallBuckets(next() == "on");
    else if (a == "--gemm-gemv") cuda::setLlmGemv(next() == "on");
    else if (a == "--gemm-flush") cuda::GemmRunner::setReadFlush(next() == "read");
    else if (a == "--router-fused") cuda::setRouterFusedRoute(next() == "on");
    else if (a == "--router-mma") g_lt_flags.router_mma = next() == "on";
    else if (a == "--pdl-gemv") g_lt_flags.pdl_gemv = next() == "on";
    else if (a == "--gemm-row-invariant") g_lt_flags.gemm_row_invariant = next() == "on";
    else if (a == "--chain-pdl") g_lt_flags.chain_pdl = next() == "on";
    else if (a == "--pdl-graph") g_lt_flags.pdl_graph = next() == "on";
    else if (a == "--router-tiled-min") cuda::setRouterF32TiledMinTokens(std::atoll(next().c_str()));
    else if (a == "--router-tiled-rows") cuda::setRouterF32TiledRows(next() == "on");
    else if (a == "--router-tiled-tok") cuda::setRouterF32TiledTok(std::atoi(next().c_str()));
    else if (a == "--moe-align-multiblock") cuda::setMoeAlignMultiBlock(next() == "on");
    else if (a == "--route-align") cuda::setLlmRouteAlign(next() == "on");
    else if (a == "--fp8-min-tokens") fp8_min_tokens = std::atoll(next().c_str());
    else if (a == "--moe-prefill") {
      if (!moePrefillFromName(next(), &moe_prefill)) {
        std::fprintf(stderr, "--moe-prefill: auto, chunk, step (or cublas) or tiled\n");
        return 2;
      }
    } else if (a == "--moe-prefill-min-rows") {
      lt_min_rows = std::atoll(next().c_str());
    } else if (a == "--prefill-reps") {
      prefill_reps = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--moe-lt-streams") {
      g_lt_flags.moe_lt_streams = std::atoi(next().c_str());
    } else if (a == "--moe-lt-epilogue") {
      g_lt_flags.moe_lt_bias_epilogue = next() == "on";
    } else if (a == "--moe-lt-overlap") {
      g_lt_flags.moe_lt_overlap_dequant = next() == "on";
    } else if (a == "--moe-lt-wgmma") {
      g_lt_flags.moe_lt_wgmma = next() == "on";
    } else if (a == "--moe-wgmma-device-plan") {
      g_lt_flags.moe_wgmma_device_plan = next() == "on";
    } else if (a == "--moe-wgmma-smem-a") {
      g_lt_flags.moe_wgmma_smem_a = next() == "on";
    } else if (a == "--moe-wgmma-min-rows") {
      g_lt_flags.moe_wgmma_min_rows_per_expert = std::atoll(next().c_str());
    }
    else if (a == "--masks") mask_density = std::atof(next().c_str());
    else if (a == "--bar-dump") bar_dir = next();
    else if (a == "--bar-prompts") bar_prompts = next();
    else if (a == "--batch-check") batch_check = next();
    else if (a == "--batch-check-prompt") batch_check_prompt = std::atoi(next().c_str());
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  std::vector<int> slice_counts;
  for (const auto& x : split(k_slices, ',')) slice_counts.push_back(std::atoi(x.c_str()));
  for (int sc : slice_counts) {
    if (sc < 1 || sc > 8) {
      std::fprintf(stderr, "--moe-k-slices: counts must be 1..8\n");
      return 2;
    }
  }
  std::vector<int> prefetch;
  for (const auto& x : split(prefetch_list, ',')) prefetch.push_back(std::atoi(x.c_str()));
  if (!moe_list.empty()) return moeGemmBench(moe_list, moe == "fp8", slice_counts, prefetch);
  if (!kv_copy_list.empty()) return kvCopyBench(kv_copy_list, kv_copy_layers);
  if (prefetch.size() > 1) {
    std::fprintf(stderr, "--moe-prefetch takes one distance without --moe-gemm\n");
    return 2;
  }
  if (!prefetch.empty()) cuda::setMoeL2Prefetch(prefetch[0]);
  if (slice_counts.size() != 1) {
    std::fprintf(stderr, "--moe-k-slices takes one count without --moe-gemm\n");
    return 2;
  }
  cuda::setMoeKSlices(slice_counts[0]);
  if (model_dir.empty()) {
    std::fprintf(stderr, "--model DIR is required\n");
    return 2;
  }
  Bench b;
  b.mask_density = mask_density;
  b.max_batch_tokens = max_batch_tokens;
  BackendOptions bo;
  bo.max_batch_tokens = max_batch_tokens;
  bo.cuda.paged_attention_sm90_min_tokens = attn_prefill == "mma" ? 0 : attn_min_tokens;
  bo.cuda.moe_prefill = moe_prefill;
  bo.cuda.moe_prefill_min_rows_per_expert = lt_min_rows;
  applyLtFlags(bo);
  auto be = makeBackend("cuda", bo);
  if (!be.isOk()) {
    std::fprintf(stderr, "%s\n", be.status().toString().c_str());
    return 1;
  }
  cuda::setPagedAttnSm90(bo.cuda.paged_attention_sm90_min_tokens, attn_prefill != "sm90basic",
                         attn_prefill == "sm90c2s4" ? 4 : 2, /*windows=*/false,
                         attn_prefill.rfind("sm90c2", 0) == 0 ? 2 : 3);
  b.backend = std::move(be).value();
  b.ops = makeLlmOps(*b.backend).value();
  GptOssOptions go;
  go.max_batch_tokens = max_batch_tokens;
  // rose's default (--max-seqs 256), or the largest --decode batch above it (a saturated serving
  // run's running set can exceed 256: tulip --max-num-seqs with rose --max-seqs).
  int32_t max_seqs = 256;
  for (const auto& d : split(decode_list, ',')) {
    max_seqs = std::max<int32_t>(max_seqs, std::atoi(d.c_str()));
  }
  for (const auto& d : split(batch_check, ',')) {
    max_seqs = std::max<int32_t>(max_seqs, std::atoi(d.c_str()));
  }
  go.max_seqs = max_seqs;
  go.max_logits_rows = max_seqs;
  go.max_model_len = 131072;
  go.cuda_graphs = graphs;
  go.f32_residual = f32_residual;
  go.f32_router = f32_router;
  go.norm_round_once = round_once;
  go.fuse_combine_norm = fuse_cn;
  go.profile_skip = profile_skip;
  go.attn_f16 = attn_f16;
  go.moe_f16 = moe_f16;
  go.head_f16 = head_f16;
  go.moe_out_f32 = moe_out_f32;
  go.proj_f32 = proj_f32;
  go.proj_f32_qkv = proj_qkv;
  go.proj_f32_o = proj_o;
  if (!moeWeightsFromName(moe, &go.moe_weights)) {
    std::fprintf(stderr, "--moe-weights must be auto, mxfp4, fp8, mxfp4-bf16 or bf16\n");
    return 2;
  }
  if (fp8_min_tokens > 0) cuda::setMoeFp8MinTokens(fp8_min_tokens);
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
  if (!bar_dir.empty()) {
    prefill_list = bar_prompts;
    decode_list.clear();
  }
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
  for (const auto& d : split(batch_check, ',')) {  // the others' prompts are at most 1500 tokens
    const int64_t batch = std::atoll(d.c_str());
    if (batch < 1 || batch_check_prompt < 1 || batch_check_prompt > max_batch_tokens) {
      std::fprintf(stderr, "--batch-check: batches >= 1, a prompt of 1..--max-batch-tokens\n");
      return 2;
    }
    need_tokens = std::max<int64_t>(need_tokens, batch_check_prompt + (batch - 1) * 1500 +
                                                     batch * (decode_steps + 2 * 16));
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
              load_s,
              b.model->fp8Experts() ? "mxfp4+fp8"
              : b.model->expertFormat() == ExpertFormat::kMxfp4 ? "mxfp4"
                                                                  : "dense",
              blocks,
              static_cast<long long>(blocks) * 16, static_cast<double>(b.kv->bytes()) / 1e9,
              static_cast<double>(mem_total - mem_free) / 1e9, static_cast<double>(mem_free) / 1e9,
              static_cast<double>(mem_total) / 1e9);
  if (cuda::moeLtBf16MinTokens() > 0)
    std::printf("moe prefill: MXFP4 MoE %s of >= %lld rows per expert %s\n",
                b.ops->moeChunkMinRowsPerExpert() == 0 && cuda::moeLtBf16Auto()
                    ? "whole steps (auto)"
                : cuda::moeLtBf16PerChunk() ? "chunks"
                                            : "steps",
                static_cast<long long>(cuda::moeLtMinRowsPerExpert(cuda::moeLtWgmma())),
                cuda::moeLtWgmma() ? "run the wgmma kernel on the MXFP4 experts [TAG_MOE_WGMMA]"
                                   : "dequantize into bf16 and run cuBLASLt GEMMs [TAG_MOE_LT_BF16]");
  if (b.model->fp8Experts()) {
    const double nz = static_cast<double>(b.model->fp8NonzeroWeights());
    std::printf("fp8 experts: %llu of %llu non-zero weights not exact in e4m3 (%.3g %%); MoE "
                "steps of >= %lld tokens use them\n",
                static_cast<unsigned long long>(b.model->fp8InexactWeights()),
                static_cast<unsigned long long>(b.model->fp8NonzeroWeights()),
                nz > 0 ? 100.0 * static_cast<double>(b.model->fp8InexactWeights()) / nz : 0.0,
                static_cast<long long>(cuda::moeFp8MinTokens()));
  }
  if (!bar_dir.empty()) return barDump(b, bar_dir, bar_prompts);
  if (!batch_check.empty()) return batchCheck(b, batch_check, batch_check_prompt, decode_steps);
  std::ofstream json;
  if (!json_path.empty()) json.open(json_path);
  for (const auto& p : split(prefill_list, ',')) {
    const int len = std::atoi(p.c_str());
    b.prefill(len);  // warm-up (GEMM tuning, first-use allocations)
    const uint64_t lt0 = cuda::moeLtBf16Steps(), fp80 = cuda::moeFp8Steps();
    std::vector<double> runs, spans;
    for (int r = 0; r < prefill_reps; ++r) {
      runs.push_back(b.prefill(len));
      spans.push_back(b.last_prefill_gpu_s);
    }
    std::sort(runs.begin(), runs.end());
    std::sort(spans.begin(), spans.end());
    const double s = runs[runs.size() / 2];  // the median (the upper one of an even count)
    const uint64_t lt_steps = (cuda::moeLtBf16Steps() - lt0) / static_cast<uint64_t>(prefill_reps);
    const uint64_t fp8_steps = (cuda::moeFp8Steps() - fp80) / static_cast<uint64_t>(prefill_reps);
    if (profile) {
      cudaProfilerStart();
      b.prefill(len);
      cudaProfilerStop();
    }
    std::printf("prefill %6d tokens: %.4f s  (%.0f tokens/s; MoE layer steps on fp8 %llu, bf16 "
                "cublaslt %llu; median of %d, min %.4f; GPU span median %.4f s)\n",
                len, s, len / s, static_cast<unsigned long long>(fp8_steps),
                static_cast<unsigned long long>(lt_steps), prefill_reps, runs.front(),
                spans[spans.size() / 2]);
    std::fflush(stdout);
    if (json) json << "{\"workload\":\"prefill\",\"tokens\":" << len << ",\"seconds\":" << s << "}\n";
  }
  for (const auto& d : split(decode_list, ',')) {
    auto bc = split(d, '@');
    const int batch = std::atoi(bc[0].c_str()), ctx = std::atoi(bc[1].c_str());
    b.decode(batch, ctx, 4);  // warm-up
    double host = 0;
    const double s = b.decode(batch, ctx, decode_steps, &host, profile);
    std::printf("decode batch %3d @ %6d%s: step %.3f ms, host enqueue %.3f ms, GPU span %.3f ms  "
                "(%.0f tokens/s)\n",
                batch, ctx, mask_density > 0 ? " masked" : "", s * 1e3, host * 1e3,
                b.last_gpu_s * 1e3, batch / s);
    std::fflush(stdout);
    if (json) json << "{\"workload\":\"decode\",\"masks\":" << mask_density << ",\"batch\":" << batch << ",\"context\":" << ctx
                   << ",\"step_seconds\":" << s << "}\n";
  }
  return 0;
}
