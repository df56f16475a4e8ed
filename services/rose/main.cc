// rose: the model worker. Loads a Hugging Face checkpoint onto a backend (cpu or cuda), attaches
// to (or, with --create-shm, creates) the shared-memory channel, announces its model facts and
// serves batches until SIGTERM/SIGINT, or until its owner (tulip) is gone. One serve path for
// every model: the checkpoint's config.json picks the runner that the step loop
// (services/rose/engine/step_loop.h) runs —
//   - a Qwen3 embedding / scoring model: EmbeddingRunner (embed and score batches);
//   - a gpt-oss checkpoint (model_type "gpt_oss" / GptOssForCausalLM): LlmRunner (one kGenerate
//     step per batch, a paged KV cache allocated at start), on the cpu reference ops or the cuda
//     ones (MXFP4 experts resident unless --moe-weights bf16; fp8 adds an FP8 copy for prefill).
//
//   rose --model DIR --shm-name NAME [--device cpu|cuda] [--cuda-device N] [--max-batch-tokens 8192]
//        [--threads N]
//        [--create-shm --depth 4 --input-bytes N --output-bytes N]
//   embedding:  [--pooling default|last|mean|cls] [--attention default|causal|bidirectional]
//               [--cuda-graphs on|off] [--precapture SEQSxTOKENS,...]   (cuda backend: batches
//               padded to (sequences, tokens) buckets and replayed as CUDA graphs)
//               [--weights bf16|fp8|fp8-mlp]   (cuda: projections in FP8 e4m3 [TAG_EMBED_FP8])
//   gpt-oss:    [--kv-block-size 16] [--kv-blocks N | --kv-cache-mb MB | --kv-cache-fraction 0.9]
//               [--max-model-len N] [--max-seqs 256] [--moe-weights auto|mxfp4|fp8|bf16]
//               [--kv-window-blocks -1|0|N] (sliding layers' own pool: -1 auto, 0 none)
//               [--attn-prefill sm90|mma] [--moe-prefill chunk|step|tiled]
//               [--kv-export NAME] (prefill/decode disaggregation: the KV cache in
//               /dev/shm/NAME (cpu) or its CUDA IPC handles there (cuda) for other workers'
//               kv pulls; one rank)
//               (KV cache: --kv-blocks, else --kv-cache-mb, else on a GPU that fraction of the
//               device memory the model left free, on the cpu 256 MiB)
//
// gpt-oss over several ranks (docs/multi-gpu.md): [--tp T] [--dp D] [--ep E] (world T x D ranks,
// one process each; this process is rank 0 and starts ranks 1..N-1 as
// `rose <the same flags> --rank r --rank-fd FD`, services/rose/parallel/rank_runtime.h)
//             [--rank-heartbeat-timeout-ms 3000] [--rank-comm-timeout-ms 0]
// With --dp D, --kv-blocks and --kv-window-blocks count tulip's block ids (multiples of D; each
// dp group caches 1/D).
//
// The cuda backend's kernel choices come from the environment, read once here:
// GARDEN_ATTENTION_KERNEL=auto|sm90|mma|narrow, GARDEN_GEMM_TUNE=0|1, GARDEN_GEMM_SMALLM=0|1, GARDEN_PDL=0|1,
// GARDEN_PAGED_ATTENTION=sm90|mma, GARDEN_MOE_PREFILL=auto|chunk|step|tiled (cublas = step),
// GARDEN_MOE_LT_STREAMS=1..8, GARDEN_MOE_LT_EPILOGUE=0|1, GARDEN_MOE_LT_OVERLAP=0|1,
// GARDEN_MOE_LT_WGMMA=0|1, GARDEN_ROUTER_MMA=0|1, GARDEN_PDL_GEMV=0|1, GARDEN_PDL_GRAPH=0|1,
// GARDEN_MOE_WGMMA_DEVICE_PLAN=0|1, GARDEN_MOE_WGMMA_SMEM_A=0|1, GARDEN_GEMM_ROW_INVARIANT=0|1,
// GARDEN_CHAIN_PDL=0|1, GARDEN_ATTN_FP8_OUT=0|1, GARDEN_QK_ROPE=auto|legacy|pair1|pair2|pair4|pair8,
// GARDEN_GEMM_WG=0|1|pdl, GARDEN_GEMM_TUNE_VIEW=cold|chain
// (services/rose/ops/backend.h CudaKernelOptions).
//
// Exit codes: 0 clean stop, 1 startup failure (the channel's state is kFailed when it was
// reachable), 2 bad flags or GARDEN_* values.

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/shm/channel.h"
#include "services/rose/engine/embedding_runner.h"
#include "services/rose/engine/llm_runner.h"
#include "services/rose/engine/step_loop.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/model/qwen3.h"
#include "services/rose/ops/backend.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/ops/paged_attention_fit.h"
#include "services/rose/parallel/rank_runtime.h"
#include "services/rose/parallel/shard_ops.h"

namespace {

using namespace garden;

volatile sig_atomic_t g_stop = 0;

void onSignal(int) { g_stop = 1; }

bool processAlive(int32_t pid) {
  if (pid <= 0) return true;  // unknown: do not guess
  return kill(pid, 0) == 0 || errno == EPERM;
}

// Test knob [TAG_STEP_PROGRESS]: with GARDEN_TEST_HANG_RANK=r set, the cpu backend's hang knob
// (GARDEN_CPU_TEST_HANG_AT_MARK, which every rank inherits) applies to rank r only, so a test can
// wedge one rank of several. Held while the backend is created (it reads the knob then); the
// environment is restored afterwards, so the ranks rank 0 starts inherit the knob.
class HangRankKnob {
 public:
  explicit HangRankKnob(int32_t rank) {
    const char* e = std::getenv("GARDEN_TEST_HANG_RANK");
    const char* hang = std::getenv("GARDEN_CPU_TEST_HANG_AT_MARK");
    if (e == nullptr || *e == 0 || hang == nullptr || std::atoi(e) == rank) return;
    saved_ = hang;
    unsetenv("GARDEN_CPU_TEST_HANG_AT_MARK");
  }
  ~HangRankKnob() {
    if (saved_) setenv("GARDEN_CPU_TEST_HANG_AT_MARK", saved_->c_str(), 1);
  }

 private:
  std::optional<std::string> saved_;
};

// Flags of the embedding runner, validated.
struct EmbeddingArgs {
  std::optional<rose::PoolMode> pooling;  // unset: from the model directory
  int causal = -1;                        // Qwen3Options::causal
  uint32_t fp8_projections = 0;           // Qwen3Options::fp8_projections [TAG_EMBED_FP8]
  bool cuda_graphs = true;
  std::vector<std::pair<int32_t, int64_t>> precapture;
};

// Flags of the LLM runner.
struct LlmArgs {
  bool cuda_graphs = true;  // --cuda-graphs: decode steps as CUDA graphs
  int32_t kv_block_size = 16;
  int64_t kv_blocks = 0;            // 0: from kv_cache_mb
  int64_t kv_cache_mb = 0;          // KV cache budget when kv_blocks is 0; 0: see below
  double kv_cache_fraction = 0.9;   // both 0 on a GPU: this share of the free device memory
  // [TAG_KV_WINDOW_GROUP] Blocks of the sliding layers' own pool: -1 auto (kvWindowBlocks), 0
  // none (every layer in the one pool), N.
  int64_t kv_window_blocks = -1;
  std::string moe_weights = "auto";  // auto | mxfp4 | fp8 | mxfp4-bf16 | bf16
  int64_t max_model_len = 0;  // 0: the model's (max_position_embeddings, at most 131072)
  int32_t max_seqs = 256;     // sequences per step
  std::string late_masks = "auto";  // auto | on | off [TAG_LATE_MASKS]
  std::string dtype = "bfloat16";  // bfloat16 | float16 [TAG_ATTN_F16]
  std::string gemm_prewarm = "on";  // on | off: GptOssModel::prewarmGemms at load
  std::string attn_prefill = "env";  // sm90 | mma | env (GARDEN_PAGED_ATTENTION, default sm90)
  std::string moe_prefill = "env";   // auto | chunk | step | tiled | env (GARDEN_MOE_PREFILL, default auto)
  std::string kv_export;  // [TAG_KV_PULL] export the KV cache under this name
};

// Flags of a model sharded over rank processes (--tp/--dp/--ep).
struct RankArgs {
  rose::ParallelConfig parallel;
  int32_t rank = 0;     // this process's rank (followers: set by rank 0)
  int32_t rank_fd = -1;  // followers: the rank segment rank 0 handed down
  int64_t heartbeat_timeout_ms = 3000;
  int64_t comm_timeout_ms = 0;
  // cuda ranks: all-reduces up to this many bytes through the CUDA IPC all-reduce (0: every
  // collective staged through host memory) [TAG_STAGED_COMM].
  int64_t ipc_allreduce_bytes = 0;
  std::string nccl = "off";  // cuda ranks: NCCL for the collectives the IPC kernel does not take
  // cuda ranks: all-to-alls through the CUDA IPC kernel, slots of this many bytes per source
  // (0: none) [TAG_IPC_ALLTOALL]
  int64_t ipc_alltoall_bytes = 0;
  // max_batch_tokens: no rank sends another more rows than the step has tokens.
  rose::RankDeviceComm deviceComm(int64_t max_batch_tokens) const {
    return {static_cast<size_t>(ipc_allreduce_bytes), nccl == "on",
            static_cast<size_t>(ipc_alltoall_bytes), max_batch_tokens};
  }
  bool sharded() const { return parallel.world() > 1 || rank > 0; }
};

// "SEQSxTOKENS,..." → buckets; nullopt (after printing why) on a bad item.
std::optional<std::vector<std::pair<int32_t, int64_t>>> parsePrecapture(const std::string& s) {
  std::vector<std::pair<int32_t, int64_t>> list;
  for (size_t at = 0; at < s.size();) {
    size_t end = s.find(',', at);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(at, end - at);
    long long seqs = 0, toks = 0;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%lldx%lld%c", &seqs, &toks, &tail) != 2 || seqs <= 0 ||
        toks < seqs || toks > (1 << 24)) {
      std::fprintf(stderr, "rose: --precapture: '%s' is not SEQSxTOKENS (1 <= SEQS <= TOKENS)\n",
                   item.c_str());
      return std::nullopt;
    }
    list.emplace_back(static_cast<int32_t>(seqs), static_cast<int64_t>(toks));
    at = end + 1;
  }
  return list;
}

// Prints why and returns false when an LLM flag is out of range.
bool validLlmArgs(const LlmArgs& f) {
  if (f.kv_block_size <= 0 || f.kv_block_size > 1024) {
    std::fprintf(stderr, "rose: --kv-block-size must be in [1, 1024]\n");
    return false;
  }
  if (f.kv_blocks < 0 || f.kv_blocks > INT32_MAX) {
    std::fprintf(stderr, "rose: --kv-blocks must be in [0, 2147483647]\n");
    return false;
  }
  if (f.kv_window_blocks < -1 || f.kv_window_blocks > INT32_MAX) {
    std::fprintf(stderr, "rose: --kv-window-blocks must be -1 (auto), 0 (none) or a block count\n");
    return false;
  }
  if (f.kv_cache_mb < 0) {
    std::fprintf(stderr, "rose: --kv-cache-mb must be >= 0 (0: from --kv-cache-fraction)\n");
    return false;
  }
  if (!(f.kv_cache_fraction > 0 && f.kv_cache_fraction <= 1)) {
    std::fprintf(stderr, "rose: --kv-cache-fraction must be in (0, 1]\n");
    return false;
  }
  if (rose::MoeWeightsMode m; !rose::moeWeightsFromName(f.moe_weights, &m)) {
    std::fprintf(stderr, "rose: --moe-weights must be auto, mxfp4, fp8, mxfp4-bf16 or bf16\n");
    return false;
  }
  rose::CudaKernelOptions::MoePrefill moe_prefill;
  if (f.moe_prefill != "env" && !rose::moePrefillFromName(f.moe_prefill, &moe_prefill)) {
    std::fprintf(stderr, "rose: --moe-prefill must be chunk, step (or cublas) or tiled\n");
    return false;
  }
  if (f.attn_prefill != "env" && f.attn_prefill != "sm90" && f.attn_prefill != "mma") {
    std::fprintf(stderr, "rose: --attn-prefill must be sm90 or mma\n");
    return false;
  }
  if (f.gemm_prewarm != "on" && f.gemm_prewarm != "off") {
    std::fprintf(stderr, "rose: --gemm-prewarm must be on or off\n");
    return false;
  }
  if (f.late_masks != "auto" && f.late_masks != "on" && f.late_masks != "off") {
    std::fprintf(stderr, "rose: --late-masks must be auto, on or off\n");
    return false;
  }
  if (f.dtype != "bfloat16" && f.dtype != "float16") {
    std::fprintf(stderr, "rose: --dtype must be bfloat16 or float16\n");
    return false;
  }
  if (f.max_model_len < 0 || f.max_seqs <= 0 || f.max_seqs > 65536) {
    std::fprintf(stderr, "rose: --max-model-len must be >= 0 and --max-seqs in [1, 65536]\n");
    return false;
  }
  return true;
}

// What serving one checkpoint holds besides the channel and the backend: the model (with its LLM
// ops) and the runner the step loop runs. Members are destroyed bottom-up: the runner before the
// model it refers to.
struct Workload {
  std::unique_ptr<rose::LlmOps> ops;
  std::unique_ptr<rose::Qwen3Model> qwen3;
  std::unique_ptr<rose::GptOssModel> gpt_oss;
  // Sharded (--tp/--dp/--ep, rank 0): the segment, the other ranks, this rank's shard.
  std::unique_ptr<rose::RankSegment> segment;
  std::unique_ptr<rose::RankSupervisor> ranks;
  rose::RankSegment::Comms comms;
  std::unique_ptr<rose::ShardOps> shard_ops;
  std::unique_ptr<rose::GptOssShard> shard;
  std::unique_ptr<rose::LlmStepModel> step_model;
  std::unique_ptr<rose::Runner> runner;
  rose::EmbeddingRunner* embedding = nullptr;  // == runner for an embedding model
  rose::LlmRunner* llm = nullptr;              // == runner for an LLM
};

Result<Workload> loadEmbedding(const std::string& dir, rose::Backend& backend,
                               int64_t max_batch_tokens, const EmbeddingArgs& a) {
  Workload w;
  rose::Qwen3Options mo;
  mo.max_batch_tokens = max_batch_tokens;
  mo.causal = a.causal;
  mo.fp8_projections = a.fp8_projections;
  mo.pooling_override = a.pooling;
  ASSIGN_OR_RETURN(w.qwen3, rose::Qwen3Model::load(dir, backend, mo));
  rose::EmbeddingRunnerOptions ro;
  ro.default_pooling = w.qwen3->pooling().mode;
  ro.cuda_graphs = a.cuda_graphs;
  ro.precapture = a.precapture;
  ASSIGN_OR_RETURN(auto runner, rose::EmbeddingRunner::create(backend, *w.qwen3, ro));
  w.embedding = runner.get();
  w.runner = std::move(runner);
  return w;
}

// KV blocks this process caches: --kv-blocks, else the --kv-cache-mb budget, else
// --kv-cache-fraction of the free device memory (256 MiB on the cpu), less `reserved_bytes`
// (the window pool), in blocks of `one`'s size (its full-pool layers: K and V).
Result<int64_t> kvBlocks(rose::Backend& backend, const LlmArgs& f, const rose::KvCacheShape& one,
                         DType kv_dtype, int64_t reserved_bytes = 0) {
  int64_t kv_blocks = f.kv_blocks;
  if (kv_blocks == 0) {
    const int64_t block_bytes =
        2 * one.elementsPerLayer() * (one.num_layers - one.numWindowLayers()) *
        static_cast<int64_t>(dtypeSize(kv_dtype));
    int64_t budget = f.kv_cache_mb << 20;
    std::string from = "--kv-cache-mb " + std::to_string(f.kv_cache_mb);
    if (budget == 0) {
      // What the weights and workspaces left on the device, or 256 MiB of host memory (cpu).
      const Result<uint64_t> free_b = backend.deviceMemoryFree();
      budget = free_b.isOk() ? static_cast<int64_t>(static_cast<double>(*free_b) *
                                                    f.kv_cache_fraction)
                             : int64_t{256} << 20;
      from = free_b.isOk() ? "--kv-cache-fraction of " + std::to_string(*free_b >> 20) +
                                 " MiB free on the device"
                           : "the default 256 MiB";
    }
    kv_blocks = std::min<int64_t>(std::max<int64_t>(0, budget - reserved_bytes) / block_bytes,
                                  INT32_MAX);
    if (kv_blocks == 0) {
      return invalidArgument(from + " holds no KV block (" + std::to_string(block_bytes) +
                             " bytes each" +
                             (reserved_bytes > 0 ? ", after " + std::to_string(reserved_bytes >> 20) +
                                                       " MiB of window pool (--kv-window-blocks)"
                                                 : std::string()) +
                             ")");
    }
  }
  return kv_blocks;
}

// [TAG_KV_WINDOW_GROUP] Blocks of the sliding layers' own pool for a model whose window is
// `window` keys (0: none). --kv-window-blocks N: N (at least what one sequence's largest chunk
// reads: ceil((window - 1 + max_batch_tokens) / block_size) + 1); 0: none; -1 (auto; cpu and
// cuda, the latter verified on the H200 2026-12-05: GpuGptOss.WindowPoolGivesTheSameBitsAsOnePool,
// memcheck clean, 256-stream serving unchanged): at least
// twice what max_seqs running sequences can hold at once (each ceil((window - 1) / block_size)
// + 2 blocks, plus one step's new tokens), the second half for the prefix cache's window blocks
// — returned negated (the caller raises it to one window block per 8 full blocks, below).
Result<int64_t> kvWindowBlocks(const LlmArgs& f, int32_t window,
                               int64_t max_batch_tokens) {
  if (window <= 0 || f.kv_window_blocks == 0) return int64_t{0};
  const int64_t bs = f.kv_block_size;
  if (f.kv_window_blocks < 0) {
    const int64_t per_seq = (window - 1 + bs - 1) / bs + 2;
    return -2 * (int64_t{f.max_seqs} * per_seq + (max_batch_tokens + bs - 1) / bs);
  }
  const int64_t least = (window - 1 + max_batch_tokens + bs - 1) / bs + 1;
  if (f.kv_window_blocks < least) {
    return invalidArgument("--kv-window-blocks " + std::to_string(f.kv_window_blocks) +
                           ": one sequence's largest chunk (--max-batch-tokens " +
                           std::to_string(max_batch_tokens) + ", window " +
                           std::to_string(window) + ") reads up to " + std::to_string(least) +
                           " blocks");
  }
  return f.kv_window_blocks;
}

// [TAG_KV_WINDOW_GROUP] The KV pools of this process (of one dp group for a sharded model,
// whose `f` then counts one group's blocks): the window pool (kvWindowBlocks; auto raised to one
// window block per 8 full blocks) and the full pool in the rest of the budget (kvBlocks).
// `one`: the cache shape of one block in each pool (its window layers marked when the model has
// sliding layers).
struct KvPools {
  int64_t full = 0, window = 0;
};
Result<KvPools> kvPools(rose::Backend& backend, const LlmArgs& f, int32_t window,
                        int64_t max_batch_tokens, const rose::KvCacheShape& one, DType dtype) {
  KvPools p;
  ASSIGN_OR_RETURN(p.window, kvWindowBlocks(f, window, max_batch_tokens));
  rose::KvCacheShape shape = one;
  if (one.numWindowLayers() == 0) p.window = 0;  // (a model of more than 64 layers: none)
  if (p.window == 0) {  // every layer in the one pool
    shape.num_blocks_window = 0;
    shape.window_layers = 0;
  }
  const int64_t layer_block_bytes = shape.slotElements() *
                                    static_cast<int64_t>(dtypeSize(dtype)) * f.kv_block_size *
                                    2;  // K and V of one block of one layer
  const int64_t window_block_bytes = layer_block_bytes * shape.numWindowLayers();
  if (p.window < 0) {
    // Auto: a prefix hit needs the window blocks before its end as well as the full blocks, so
    // the window pool keeps one block per 8 full blocks when that is more than the running
    // sequences' share: the window (ceil(window / block_size) + 1 = 9 blocks at the published
    // shape) of every prefix the full pool can keep cached, for contexts from ~1,150 tokens.
    // --kv-blocks N fixes the full pool; a budget is split so that full x (bf + bw / 8) = budget.
    const int64_t least = -p.window;
    ASSIGN_OR_RETURN(const int64_t all_full, kvBlocks(backend, f, shape, dtype));
    const int64_t full_block_bytes =
        layer_block_bytes * (shape.num_layers - shape.numWindowLayers());
    const int64_t full =
        f.kv_blocks > 0 ? all_full
                        : static_cast<int64_t>(static_cast<double>(all_full) * full_block_bytes /
                                               (full_block_bytes + window_block_bytes / 8.0));
    p.window = std::min<int64_t>(std::max(least, full / 8), INT32_MAX);
  }
  const int64_t window_bytes = p.window * window_block_bytes;
  ASSIGN_OR_RETURN(p.full, kvBlocks(backend, f, shape, dtype, window_bytes));
  if (p.window > 0) {
    log::info("kv window pool", {{"window", window},
                                 {"blocks", p.window},
                                 {"mib", window_bytes >> 20},
                                 {"full_blocks", p.full}});
  }
  return p;
}

rose::GptOssOptions gptOssOptions(int64_t max_batch_tokens, const LlmArgs& f) {
  rose::GptOssOptions go;
  go.max_batch_tokens = max_batch_tokens;
  go.max_seqs = f.max_seqs;
  go.max_logits_rows = f.max_seqs;  // logits never leave rose: one sampled row per sequence
  go.max_model_len = f.max_model_len;
  go.min_block_size = f.kv_block_size;
  go.cuda_graphs = f.cuda_graphs;
  rose::applyGptOssDtype(f.dtype, go);  // checked at parse time
  return go;
}

Result<Workload> loadLlm(const std::string& dir, rose::Backend& backend, int32_t threads,
                         int64_t max_batch_tokens, const LlmArgs& f) {
  Workload w;
  ASSIGN_OR_RETURN(w.ops, rose::makeLlmOps(backend, threads));
  rose::GptOssOptions go = gptOssOptions(max_batch_tokens, f);
  rose::moeWeightsFromName(f.moe_weights, &go.moe_weights);  // validLlmArgs checked the name
  ASSIGN_OR_RETURN(w.gpt_oss, rose::GptOssModel::load(dir, backend, *w.ops, go));
  if (f.gemm_prewarm == "on") {  // before the KV cache takes what is left of the device memory
    const auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(const int64_t runs, w.gpt_oss->prewarmGemms());
    if (runs > 0) {
      log::info("gemm prewarm", {{"runs", runs},
                                 {"ms", std::chrono::duration<double, std::milli>(
                                            std::chrono::steady_clock::now() - t0)
                                            .count()}});
    }
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> eos, rose::loadEosIds(dir));
  ASSIGN_OR_RETURN(const KvPools pools,
                   kvPools(backend, f, w.gpt_oss->slidingWindow(), max_batch_tokens,
                           w.gpt_oss->kvShape(1, f.kv_block_size, 1), w.gpt_oss->kvDType()));
  const int64_t kv_blocks = pools.full, window_blocks = pools.window;
  rose::LlmRunnerOptions ro;
  ro.kv_num_blocks = static_cast<int32_t>(kv_blocks);
  ro.kv_num_blocks_window = static_cast<int32_t>(window_blocks);
  ro.kv_block_size = f.kv_block_size;
  ro.max_seqs = f.max_seqs;
  ro.max_batch_tokens = max_batch_tokens;
  ro.eos_ids = std::move(eos);
  ro.late_masks = f.late_masks == "on"    ? rose::LlmRunnerOptions::LateMasks::kOn
                  : f.late_masks == "off" ? rose::LlmRunnerOptions::LateMasks::kOff
                                          : rose::LlmRunnerOptions::LateMasks::kAuto;
  ro.kv_export = f.kv_export;
  ASSIGN_OR_RETURN(auto runner, rose::LlmRunner::create(backend, *w.gpt_oss, ro));
  w.llm = runner.get();
  w.runner = std::move(runner);
  return w;
}

// Rank 0 of a sharded gpt-oss: the rank segment, ranks 1..N-1 started (re-running this binary
// with `self_argv` plus --rank/--rank-fd) and loading beside this rank's shard, the KV cache
// sized here and announced to them, and the runner over a ShardedStepModel once all are ready.
Result<Workload> loadLlmSharded(const std::string& dir, rose::Backend& backend, int32_t threads,
                                int64_t max_batch_tokens, const LlmArgs& f, const RankArgs& ra,
                                const std::vector<std::string>& self_argv) {
  Workload w;
  const rose::ParallelConfig& par = ra.parallel;
  if (f.kv_window_blocks > 0 && f.kv_window_blocks % par.dp != 0) {  // [TAG_KV_WINDOW_GROUP]
    return invalidArgument("--kv-window-blocks must be a multiple of --dp (it counts tulip's "
                           "window block ids, one equal share per dp group)");
  }
  ASSIGN_OR_RETURN(const rose::GptOssConfig cfg, rose::loadGptOssConfig(dir));
  const ModelConfig& c = cfg.base;
  RETURN_IF_ERROR(rose::checkParallelConfig(par, c.num_attention_heads, c.num_key_value_heads,
                                            c.num_local_experts, c.intermediate_size,
                                            c.vocab_size));
  // The relay carries what the runner's staging can: max_seqs tables of the longest sequence.
  const int64_t max_len = f.max_model_len > 0
                              ? f.max_model_len
                              : std::min<int64_t>(c.max_position_embeddings, 131072);
  rose::RankSegmentOptions so;
  so.parallel = par;
  // (Twice the tables: a window table may follow each [TAG_KV_WINDOW_GROUP].)
  so.step_bytes = rose::relayedStepBytes(
      static_cast<uint64_t>(f.max_seqs), static_cast<uint64_t>(max_batch_tokens),
      2 * static_cast<uint64_t>(f.max_seqs) *
          static_cast<uint64_t>(rose::kvBlocksFor(max_len, f.kv_block_size)));
  so.comm_timeout_ms = static_cast<uint32_t>(ra.comm_timeout_ms);
  ASSIGN_OR_RETURN(w.segment, rose::RankSegment::create(so));
  w.segment->setPid(0, getpid());
  w.ranks = std::make_unique<rose::RankSupervisor>(
      *w.segment, std::chrono::milliseconds(ra.heartbeat_timeout_ms));
  for (int32_t r = 1; r < par.world(); ++r) RETURN_IF_ERROR(w.ranks->spawn(r, self_argv));

  ASSIGN_OR_RETURN(w.ops, rose::makeLlmOps(backend, threads));
  ASSIGN_OR_RETURN(w.shard_ops, rose::makeShardOps(backend));
  w.comms = w.segment->communicators(0, &backend, ra.deviceComm(max_batch_tokens));
  ASSIGN_OR_RETURN(w.shard,
                   rose::GptOssShard::load(dir, backend, *w.ops, *w.shard_ops,
                                           gptOssOptions(max_batch_tokens, f), par, 0,
                                           w.comms.view()));
  ASSIGN_OR_RETURN(std::vector<int32_t> eos, rose::loadEosIds(dir));
  LlmArgs per_group = f;
  per_group.kv_blocks = f.kv_blocks / par.dp;
  if (f.kv_window_blocks > 0) per_group.kv_window_blocks = f.kv_window_blocks / par.dp;
  ASSIGN_OR_RETURN(const KvPools pools,
                   kvPools(backend, per_group, w.shard->slidingWindow(), max_batch_tokens,
                           w.shard->kvShape(1, f.kv_block_size, 1), w.shard->kvDType()));
  const int64_t blocks = pools.full, window_blocks = pools.window;
  if ((blocks + window_blocks) * par.dp > INT32_MAX) {
    return invalidArgument("KV blocks x --dp exceed 2^31 - 1");
  }
  w.segment->setKvBlocksPerGroup(static_cast<int32_t>(blocks),
                                 static_cast<int32_t>(window_blocks));
  RETURN_IF_ERROR(w.ranks->waitReady(std::chrono::minutes(30)));
  if (par.dp > 1) {
    log::info("--dp > 1: the KV block ids form one group per dp group (announced to tulip, which "
              "keeps every sequence in one group); a step with a table that straddles groups is "
              "refused",
              {{"dp", par.dp}, {"blocks_per_group", blocks}});
  }
  w.step_model = std::make_unique<rose::ShardedStepModel>(*w.shard, *w.segment);
  rose::LlmRunnerOptions ro;
  ro.kv_num_blocks = static_cast<int32_t>(blocks * par.dp);
  ro.kv_num_blocks_window = static_cast<int32_t>(window_blocks * par.dp);
  ro.kv_block_groups = par.dp;
  ro.kv_block_size = f.kv_block_size;
  ro.max_seqs = f.max_seqs;
  ro.max_batch_tokens = max_batch_tokens;
  ro.eos_ids = std::move(eos);
  ro.kv_pull = false;  // the ranks hold the cache [TAG_KV_PULL]
  ASSIGN_OR_RETURN(auto runner, rose::LlmRunner::create(backend, *w.step_model, ro));
  w.llm = runner.get();
  w.runner = std::move(runner);
  return w;
}

// Ranks 1..N-1: load this rank's shard, take the KV size from rank 0, serve relayed steps.
// Returns the exit code. The process beats its rank's heartbeat from the start (loading
// included) until it ends; it dies with rank 0 (PR_SET_PDEATHSIG, set by rank 0's fork).
int runFollowerRank(const std::string& dir, const std::string& device, int32_t threads,
                    int64_t max_batch_tokens, const LlmArgs& f, const RankArgs& ra,
                    const rose::BackendOptions& bo) {
  auto seg = rose::RankSegment::open(ra.rank_fd);
  if (!seg.isOk()) {
    log::error("cannot open the rank segment", {{"rank", ra.rank}, {"error", seg.status()}});
    return 1;
  }
  rose::RankSegment& s = **seg;
  const rose::ParallelConfig par = s.parallel();
  if (ra.rank >= par.world()) {
    log::error("--rank outside the world", {{"rank", ra.rank}, {"world", par.world()}});
    s.abort();
    return 1;
  }
  std::atomic<bool> beating{true};
  std::thread beater([&] {
    while (beating.load()) {
      s.beat(ra.rank);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  auto finish = [&](int code) {
    beating = false;
    beater.join();
    return code;
  };
  auto failed = [&](const Status& st, const char* what) {
    log::error(what, {{"rank", ra.rank}, {"error", st}});
    s.abort();
    return finish(1);
  };
  auto backend = [&] {
    HangRankKnob knob(ra.rank);
    return rose::makeBackend(device, bo);
  }();
  if (!backend.isOk()) return failed(backend.status(), "cannot create the backend");
  auto ops = rose::makeLlmOps(**backend, threads);
  if (!ops.isOk()) return failed(ops.status(), "cannot create the LLM ops");
  auto shard_ops = rose::makeShardOps(**backend);
  if (!shard_ops.isOk()) return failed(shard_ops.status(), "cannot create the shard ops");
  rose::RankSegment::Comms comms =
      s.communicators(ra.rank, backend->get(), ra.deviceComm(max_batch_tokens));
  auto shard = rose::GptOssShard::load(dir, **backend, **ops, **shard_ops,
                                       gptOssOptions(max_batch_tokens, f), par, ra.rank,
                                       comms.view());
  if (!shard.isOk()) return failed(shard.status(), "cannot load this rank's shard");
  int32_t blocks = 0;
  while ((blocks = s.kvBlocksPerGroup()) == 0) {
    if (g_stop || s.aborted()) return finish(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto kv = rose::PagedKvCache::create(
      **backend, (*shard)->kvShape(blocks, f.kv_block_size, s.kvWindowBlocksPerGroup()),
      (*shard)->kvDType());
  if (!kv.isOk()) return failed(kv.status(), "cannot allocate this rank's KV cache");
  log::info("rank ready", {{"rank", ra.rank},
                           {"world", par.world()},
                           {"tp", par.tp},
                           {"dp", par.dp},
                           {"ep", par.ep},
                           {"kv_blocks", blocks}});
  const int code = rose::runFollower(s, ra.rank, **shard, **kv, **backend, [] { return g_stop != 0; });
  log::info("rank stopped", {{"rank", ra.rank}, {"code", code}});
  return finish(code);
}

// The model name tulip and ivy show: the directory's name.
std::string modelName(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  std::string name = p.filename().string();
  return name.empty() ? p.parent_path().filename().string() : name;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, shm_name, device = "cpu";
  std::string log_level = "info";
  uint32_t metrics_port = 0;
  std::string metrics_host = "127.0.0.1";
  int64_t max_batch_tokens = 8192;
  int32_t threads = 0;
  int32_t cuda_device = -1;  // -1: GPU 0 (a sharded rank: rank % visible GPUs)
  bool create_shm = false;
  uint32_t depth = 4;
  uint64_t input_bytes = 0, output_bytes = 0;

  Flags flags("rose",
              "Garden model worker: runs a Qwen3 or gpt-oss checkpoint for tulip over "
              "shared memory");
  flags.add("model", &model_dir, "Hugging Face model directory (config.json + *.safetensors)")
      .add("shm-name", &shm_name,
           "shared-memory channel name (tulip creates it unless --create-shm)")
      .add("device", &device, "backend: cpu or cuda")
      .add("cuda-device", &cuda_device,
           "cuda: the GPU to run on, an index among the visible ones (-1: GPU 0; a rank of a "
           "sharded rose: rank % visible GPUs). E.g. a prefill rose on GPU 1 beside a decode "
           "rose on GPU 0 (tulip --disaggregate)")
      .add("max-batch-tokens", &max_batch_tokens, "largest batch in tokens (sizes the workspace)")
      .add("threads", &threads, "cpu backend compute threads (0 = all cores)")
      .add("create-shm", &create_shm, "create the channel (sidecar mode: tulip attaches)")
      .add("depth", &depth, "with --create-shm: pipeline depth (slots)")
      .add("input-bytes", &input_bytes,
           "with --create-shm: input arena bytes per slot (0 = from the model)")
      .add("output-bytes", &output_bytes,
           "with --create-shm: output arena bytes per slot (0 = from the model)")
      .add("metrics-port", &metrics_port, "HTTP port for /metrics and /health (0 = off)")
      .add("metrics-host", &metrics_host, "address --metrics-port binds (0.0.0.0: every interface)")
      .add("log-level", &log_level, "debug, info, warn, error");
  // Embedding models.
  std::string pooling = "default", attention = "default", cuda_graphs = "on", precapture,
              weights = "bf16";
  flags
      .add("pooling", &pooling,
           "embedding: default (from modules.json / 1_Pooling, else last), last, mean, cls")
      .add("attention", &attention,
           "embedding: default (config.json is_causal, else causal), causal, bidirectional")
      .add("cuda-graphs", &cuda_graphs,
           "on|off: embedding batches and gpt-oss decode steps through CUDA graphs (cuda backend "
           "only)")
      .add("precapture", &precapture,
           "embedding: SEQSxTOKENS,...: graph buckets to capture at start (e.g. 1x512,64x8192)")
      .add("weights", &weights,
           "embedding: bf16 (default), fp8 (the layers' four projections in FP8 e4m3 with "
           "128x128 block scales, inputs quantized per token and 128 inputs) or fp8-mlp (only "
           "gate_up and down): cuda only, faster large batches at a small accuracy cost "
           "(docs/embeddings-cuda.md)");
  // gpt-oss.
  LlmArgs llm;
  flags.add("kv-block-size", &llm.kv_block_size, "gpt-oss: tokens per KV cache block")
      .add("kv-blocks", &llm.kv_blocks, "gpt-oss: KV cache blocks (0 = from --kv-cache-mb)")
      .add("kv-cache-mb", &llm.kv_cache_mb,
           "gpt-oss: KV cache MiB when --kv-blocks is 0 (0: --kv-cache-fraction on a GPU, "
           "256 MiB on the cpu)")
      .add("kv-window-blocks", &llm.kv_window_blocks,
           "gpt-oss: blocks of the sliding-window layers' own KV pool, which keeps only what "
           "their window still reads: -1 auto (the larger of twice what --max-seqs sequences hold "
           "and one block per 8 full blocks), 0 none (every layer in the one pool), N")
      .add("kv-cache-fraction", &llm.kv_cache_fraction,
           "gpt-oss: share of the device memory left after loading that the KV cache takes when "
           "--kv-blocks and --kv-cache-mb are 0")
      .add("moe-weights", &llm.moe_weights,
           "gpt-oss: auto|mxfp4|fp8|mxfp4-bf16|bf16: experts kept MXFP4 (cuda), MXFP4 plus an "
           "FP8 copy for prefill (cuda), MXFP4 plus a bf16 copy the prefill path reads instead "
           "of dequantizing per call (cuda; +4.5x expert memory), or dequantized to the weight "
           "dtype")
      .add("max-model-len", &llm.max_model_len,
           "gpt-oss: longest sequence (0 = the model's, at most 131072)")
      .add("max-seqs", &llm.max_seqs, "gpt-oss: sequences per step")
      .add("attn-prefill", &llm.attn_prefill,
           "gpt-oss: sm90|mma: prefill chunks of >= 128 tokens on the Hopper paged attention "
           "kernel (default; GARDEN_PAGED_ATTENTION sets it too) or on the mma.sync kernel "
           "decode uses (cuda)")
      .add("moe-prefill", &llm.moe_prefill,
           "gpt-oss: auto|chunk|step|tiled (cuda): MoE work over MXFP4 experts on the wgmma "
           "kernel (or, where it cannot run them, dequantized per call into bf16 cuBLASLt GEMMs) "
           "instead of the tiled kernels: for whole steps of >= 64 rows per expert (tokens x "
           "top_k / experts) where the wgmma kernel runs every expert, else as chunk (auto, the "
           "default; GARDEN_MOE_PREFILL sets it too); for each sequence's prefill chunk that "
           "large on its own (chunk; 256 rows per expert for the cuBLASLt GEMMs); for whole "
           "steps of >= 1024 tokens (step, alias cublas: with the cuBLASLt GEMMs the step's "
           "other rows then get other bits than alone); or never (tiled)")
      .add("gemm-prewarm", &llm.gemm_prewarm,
           "gpt-oss: on|off: at load, tune the dense GEMMs for every row count a step can bring "
           "(cuda; otherwise the first step of each size pays it)")
      .add("late-masks", &llm.late_masks,
           "gpt-oss structured outputs: auto|on|off: take a step's token masks after it was "
           "launched (tulip's late masks). auto: where the backend has verified it (cpu, cuda); "
           "on: also where it has not; off: never")
      .add("dtype", &llm.dtype,
           "gpt-oss: bfloat16|float16: activations (between ops), KV cache and the non-expert "
           "weights in bf16 (default) or IEEE fp16 (cuda: 3 more significand bits at about the "
           "same speed; MXFP4 experts dequantized to fp16, every scale byte <= 128; not with "
           "--moe-weights fp8 or mxfp4-bf16). The residual stream, the router, softmax and "
           "every accumulation stay f32 either way")
      .add("kv-export", &llm.kv_export,
           "gpt-oss, prefill/decode disaggregation: export the KV cache as /dev/shm/NAME (cpu: "
           "the cache itself; cuda: its CUDA IPC handles) so another worker's kv pull batches "
           "can copy blocks out of it (announced to tulip; one rank)");
  // gpt-oss over several ranks (docs/multi-gpu.md).
  RankArgs ranks;
  flags.add("tp", &ranks.parallel.tp, "gpt-oss: tensor-parallel ranks (attention heads, vocabulary)")
      .add("dp", &ranks.parallel.dp, "gpt-oss: data-parallel groups of --tp ranks")
      .add("ep", &ranks.parallel.ep,
           "gpt-oss: expert-parallel groups (divides --tp x --dp; the ranks of a group split "
           "its experts' columns)")
      .add("rank", &ranks.rank, "internal: this process's rank (set by rank 0)")
      .add("rank-fd", &ranks.rank_fd, "internal: the rank segment's descriptor (set by rank 0)")
      .add("rank-heartbeat-timeout-ms", &ranks.heartbeat_timeout_ms,
           "rank 0 fails the worker when another rank has not beaten for this long")
      .add("rank-comm-timeout-ms", &ranks.comm_timeout_ms,
           "a rank waiting longer than this in one collective exits (0: wait; rank 0's checks "
           "end a dead world)")
      .add("rank-ipc-allreduce-bytes", &ranks.ipc_allreduce_bytes,
           "cuda ranks: all-reduces of F32/BF16 up to this many bytes run as the CUDA IPC "
           "all-reduce on the GPU (a multiple of 16); 0 (default until measured): every "
           "collective is staged through host memory")
      .add("rank-ipc-alltoall-bytes", &ranks.ipc_alltoall_bytes,
           "cuda ranks: all-to-alls (the expert dispatch and its return) run as the CUDA IPC "
           "all-to-all with per-row flags when --max-batch-tokens rows of theirs fit this many "
           "bytes (a multiple of 16; each rank holds 2 x world such slots); 0 (default until "
           "measured): NCCL or staged")
      .add("rank-nccl", &ranks.nccl,
           "on|off: cuda ranks use NCCL for all-reduces above --rank-ipc-allreduce-bytes, "
           "broadcasts, all-gathers and the expert all-to-all (one GPU per rank; NVLink "
           "multicast stays off); off (default until measured): staged through host memory");
  flags.useEnv("ROSE_");
  flags.parseOrExit(argc, argv);
  log::setService("rose");

  // ---- flags (exit 2) ----
  if (auto lv = log::parseLevel(log_level); lv.isOk()) {
    log::setLevel(*lv);
  } else {
    std::fprintf(stderr, "rose: --log-level: %s\n", lv.status().message().c_str());
    return 2;
  }
  if (model_dir.empty() || shm_name.empty()) {
    std::fprintf(stderr, "rose: --model and --shm-name are required (see --help)\n");
    return 2;
  }
  if (max_batch_tokens <= 0 || max_batch_tokens > (1 << 24)) {
    std::fprintf(stderr, "rose: --max-batch-tokens must be in [1, 16777216]\n");
    return 2;
  }
  if (create_shm && (depth == 0 || depth > 64)) {
    std::fprintf(stderr, "rose: --depth must be in [1, 64]\n");
    return 2;
  }
  EmbeddingArgs emb;
  if (cuda_graphs != "on" && cuda_graphs != "off") {
    std::fprintf(stderr, "rose: --cuda-graphs must be on or off\n");
    return 2;
  }
  emb.cuda_graphs = cuda_graphs == "on";
  llm.cuda_graphs = cuda_graphs == "on";
  if (auto list = parsePrecapture(precapture); list) {
    emb.precapture = std::move(*list);
  } else {
    return 2;
  }
  if (pooling != "default") {
    auto pm = rose::parsePoolMode(pooling);
    if (!pm.isOk()) {
      std::fprintf(stderr, "rose: --pooling: %s\n", pm.status().message().c_str());
      return 2;
    }
    emb.pooling = *pm;
  }
  if (attention == "causal") {
    emb.causal = 1;
  } else if (attention == "bidirectional") {
    emb.causal = 0;
  } else if (attention != "default") {
    std::fprintf(stderr, "rose: --attention must be default, causal or bidirectional\n");
    return 2;
  }
  if (!rose::fp8ProjectionsFromName(weights, &emb.fp8_projections)) {
    std::fprintf(stderr, "rose: --weights must be bf16, fp8 or fp8-mlp\n");
    return 2;
  }
  if (!validLlmArgs(llm)) return 2;
  {
    const rose::ParallelConfig& p = ranks.parallel;
    if (p.tp < 1 || p.dp < 1 || p.ep < 1 || p.tp * p.dp > 64 || (p.tp * p.dp) % p.ep != 0) {
      std::fprintf(stderr,
                   "rose: --tp, --dp, --ep must be >= 1, --tp x --dp <= 64, and --ep must divide "
                   "--tp x --dp\n");
      return 2;
    }
    if (ranks.rank < 0 || (ranks.rank > 0) != (ranks.rank_fd >= 0)) {
      std::fprintf(stderr, "rose: --rank and --rank-fd are set by rank 0, together\n");
      return 2;
    }
    if (llm.kv_blocks % p.dp != 0) {
      std::fprintf(stderr, "rose: --kv-blocks must be a multiple of --dp (each dp group caches "
                           "an equal share)\n");
      return 2;
    }
    if (ranks.ipc_allreduce_bytes < 0 || ranks.ipc_allreduce_bytes % 16 != 0 ||
        (ranks.ipc_allreduce_bytes > 0 && device != "cuda")) {
      std::fprintf(stderr, "rose: --rank-ipc-allreduce-bytes must be a multiple of 16, and needs "
                           "--device cuda\n");
      return 2;
    }
    if (ranks.ipc_alltoall_bytes < 0 || ranks.ipc_alltoall_bytes % 16 != 0 ||
        (ranks.ipc_alltoall_bytes > 0 && device != "cuda")) {
      std::fprintf(stderr, "rose: --rank-ipc-alltoall-bytes must be a multiple of 16, and needs "
                           "--device cuda\n");
      return 2;
    }
    if ((ranks.nccl != "on" && ranks.nccl != "off") || (ranks.nccl == "on" && device != "cuda")) {
      std::fprintf(stderr, "rose: --rank-nccl must be on or off, and on needs --device cuda\n");
      return 2;
    }
    if (ranks.heartbeat_timeout_ms <= 0 || ranks.comm_timeout_ms < 0 ||
        ranks.comm_timeout_ms > UINT32_MAX) {
      std::fprintf(stderr,
                   "rose: --rank-heartbeat-timeout-ms must be > 0 and --rank-comm-timeout-ms "
                   ">= 0\n");
      return 2;
    }
  }
  if (!llm.kv_export.empty() && ranks.sharded()) {  // [TAG_KV_PULL]
    std::fprintf(stderr, "rose: --kv-export needs one rank (a sharded cache lives in the ranks)\n");
    return 2;
  }
  // The cuda backend's kernel choices: GARDEN_* read once, here (backend.h CudaKernelOptions).
  rose::CudaKernelOptions kernels;
  if (Status st = rose::cudaKernelOptionsFromEnv(kernels); !st.isOk()) {
    std::fprintf(stderr, "rose: %s\n", st.message().c_str());
    return 2;
  }

  if (llm.attn_prefill == "mma") kernels.paged_attention_sm90_min_tokens = 0;
  if (llm.attn_prefill == "sm90") kernels.paged_attention_sm90_min_tokens = 128;
  if (llm.moe_prefill != "env") rose::moePrefillFromName(llm.moe_prefill, &kernels.moe_prefill);
  {
    const int32_t bs = llm.kv_block_size;
    if (!rose::pagedAttentionSm90FitsBlockSize(bs) &&
        kernels.paged_attention_sm90_min_tokens > 0) {
      if (llm.attn_prefill == "sm90") {
        std::fprintf(stderr, "rose: --attn-prefill sm90 needs a --kv-block-size that divides 128 "
                             "or is a multiple of it (>= 8)\n");
        return 2;
      }
      kernels.paged_attention_sm90_min_tokens = 0;  // the default falls back to mma.sync
      std::fprintf(stderr, "rose: --kv-block-size %d: gpt-oss prefill attention runs on the mma.sync "
                           "kernel (the Hopper one copies pages of a size dividing 128)\n", bs);
    }
  }

  if (cuda_device < -1 || (cuda_device >= 0 && (device != "cuda" || ranks.sharded()))) {
    std::fprintf(stderr, "rose: --cuda-device needs --device cuda and one rank (an index >= 0)\n");
    return 2;
  }
  rose::BackendOptions bo;
  bo.threads = threads;
  bo.max_batch_tokens = max_batch_tokens;
  bo.cuda = kernels;
#if defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA
  // [TAG_RANK_DEVICE] A CUDA rank runs on GPU rank % (GPUs this process sees): one GPU per rank
  // where the node has world GPUs; where it has fewer, ranks share GPUs (one GPU serving every
  // rank is how the sharded model is checked on a single-GPU host; --kv-blocks then sizes the
  // caches, since every rank would otherwise take its fraction of the same free memory).
  if (cuda_device >= 0) {
    bo.device_index = cuda_device;  // out of range: makeBackend says so (exit 1)
  } else if (device == "cuda" && ranks.sharded()) {
    const Result<int32_t> gpus = rose::cudaDeviceCount();
    if (gpus.isOk()) bo.device_index = ranks.rank % *gpus;
    // NCCL puts one rank of a communicator on one GPU.
    if (ranks.nccl == "on" && (!gpus.isOk() || *gpus < ranks.parallel.world())) {
      std::fprintf(stderr, "rose: --rank-nccl on needs a GPU per rank (%d ranks, %d GPUs visible)\n",
                   ranks.parallel.world(), gpus.isOk() ? *gpus : 0);
      return 2;
    }
  }
#endif
  if (ranks.rank > 0) {
    // Ranks 1..N-1: started by rank 0, which set PR_SET_PDEATHSIG = SIGKILL; no channel.
    struct sigaction sa = {};
    sa.sa_handler = onSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGINT, SIG_IGN);  // a terminal's ^C reaches every rank: rank 0 stops the others
    signal(SIGPIPE, SIG_IGN);
    return runFollowerRank(model_dir, device, threads, max_batch_tokens, llm, ranks, bo);
  }

  // Die with the parent (tulip) when spawned by it; sidecars watch nothing but signals.
  const pid_t parent = getppid();
  if (!create_shm) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) return 1;  // the parent died before prctl
  }
  struct sigaction sa = {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // ---- start (exit 1) ----
  // Load the model first when creating the channel (its size depends on the model); otherwise
  // attach first so tulip sees kStarting / kFailed.
  std::optional<shm::Channel> channel;
  auto fail = [&](const Status& st, const char* what) {
    log::error(what, {{"error", st}});
    if (channel) channel->setState(shm::WorkerState::kFailed);
    return 1;
  };
  if (!create_shm) {
    auto ch = shm::Channel::attach(shm_name);
    if (!ch.isOk()) return fail(ch.status(), "cannot attach to the shm channel");
    channel.emplace(std::move(ch).value());
    channel->setWorkerPid(static_cast<int32_t>(getpid()));
    channel->setState(shm::WorkerState::kStarting);
  }

  // Heartbeat while loading (large checkpoints take a while; so do graph captures and the KV
  // cache), until the step loop beats.
  std::atomic<bool> loading{true};
  std::thread beater;
  if (channel) {
    beater = std::thread([&] {
      while (loading.load()) {
        channel->beat();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  auto stopBeater = [&] {
    loading = false;
    if (beater.joinable()) beater.join();
  };

  auto backend = [&] {
    HangRankKnob knob(0);
    return rose::makeBackend(device, bo);
  }();
  if (!backend.isOk()) {
    stopBeater();
    return fail(backend.status(), "cannot create the backend");
  }
  // config.json decides the runner; a directory without a readable one is left to the
  // embedding loader, which says what is missing.
  const Result<bool> is_llm = rose::isGptOssCheckpoint(model_dir);
  const auto t0 = std::chrono::steady_clock::now();
  Result<Workload> loaded = invalidArgument("unreachable");
  if (ranks.sharded() && !(is_llm.isOk() && *is_llm)) {
    loaded = invalidArgument("--tp/--dp/--ep shard a gpt-oss checkpoint; " + model_dir +
                             " is not one");
  } else if (ranks.sharded()) {
    // The other ranks re-run this binary with the same flags.
    std::vector<std::string> self(argv, argv + argc);
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) self[0] = exe.string();
    loaded = loadLlmSharded(model_dir, **backend, threads, max_batch_tokens, llm, ranks, self);
  } else if (is_llm.isOk() && *is_llm) {
    loaded = loadLlm(model_dir, **backend, threads, max_batch_tokens, llm);
  } else {
    loaded = loadEmbedding(model_dir, **backend, max_batch_tokens, emb);
  }
  stopBeater();
  if (!loaded.isOk()) return fail(loaded.status(), "cannot load the model");
  Workload& w = *loaded;
  const auto load_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();

  if (create_shm) {
    shm::Layout layout = w.runner->layoutFor(depth);
    if (input_bytes != 0) layout.input_bytes = input_bytes;
    if (output_bytes != 0) layout.output_bytes = output_bytes;
    auto ch = shm::Channel::create(shm_name, layout);
    if (!ch.isOk()) return fail(ch.status(), "cannot create the shm channel");
    channel.emplace(std::move(ch).value());
  }

  rose::StepLoopOptions lo;
  lo.model_name = modelName(model_dir);
  auto loop = rose::StepLoop::create(*channel, **backend, *w.runner, lo);
  if (!loop.isOk()) return fail(loop.status(), "cannot start the step loop");
  (*loop)->announceReady();
  if (w.embedding != nullptr) {
    const rose::Qwen3Model& m = *w.qwen3;
    log::info("ready", {{"model", model_dir},
                        {"kind", "embedding"},
                        {"device", device},
                        {"shm", shm_name},
                        {"hidden", m.hiddenSize()},
                        {"layers", m.config().num_hidden_layers},
                        {"pooling", rose::poolModeName(m.pooling().mode)},
                        {"causal", m.causal()},
                        {"weights", weights},
                        {"score_head", m.hasScoreHead()},
                        {"max_batch_tokens", max_batch_tokens},
                        {"cuda_graphs", w.embedding->graphs()},
                        {"load_ms", static_cast<int64_t>(load_ms)}});
  } else {
    const ModelConfig& c = w.shard ? w.shard->config().base : w.gpt_oss->config().base;
    const rose::PagedKvCache& kv = w.llm->kvCache();
    const rose::ParallelConfig par = ranks.parallel;
    log::info("ready", {{"model", model_dir},
                        {"kind", "llm"},
                        {"device", device},
                        {"shm", shm_name},
                        {"hidden", c.hidden_size},
                        {"layers", c.num_hidden_layers},
                        {"experts", c.num_local_experts},
                        {"tp", par.tp},
                        {"dp", par.dp},
                        {"ep", par.ep},
                        {"max_model_len", w.shard ? w.shard->maxModelLen() : w.gpt_oss->maxModelLen()},
                        {"kv_blocks", kv.shape().num_blocks},
                        {"kv_block_size", kv.shape().block_size},
                        {"kv_tokens", static_cast<int64_t>(kv.shape().num_blocks) *
                                          kv.shape().block_size},
                        {"kv_window_blocks", kv.shape().num_blocks_window},
                        {"kv_mb", static_cast<int64_t>(kv.bytes() >> 20)},
                        {"max_batch_tokens", max_batch_tokens},
                        {"experts_fp8", w.gpt_oss != nullptr && w.gpt_oss->fp8Experts()},
                        {"fp8_inexact_weights",
                         static_cast<int64_t>(w.gpt_oss ? w.gpt_oss->fp8InexactWeights() : 0)},
                        {"fp8_nonzero_weights",
                         static_cast<int64_t>(w.gpt_oss ? w.gpt_oss->fp8NonzeroWeights() : 0)},
                        {"load_ms", static_cast<int64_t>(load_ms)}});
  }

  MetricsHttpServer metrics_http;
  if (metrics_port != 0) {
    Status mst = metrics_http.start(metrics_host, static_cast<uint16_t>(metrics_port));
    if (!mst.isOk()) return fail(mst, "cannot serve metrics");
  }

  // Owner liveness: when tulip created the channel, its pid is in the header.
  const int32_t owner = create_shm ? 0 : channel->ownerPid();
  auto last_check = std::chrono::steady_clock::now();
  bool owner_gone = false;
  (*loop)->run([&] {
    if (g_stop) return true;
    if (w.ranks) {
      // One rank gone, stopped or aborted fails the whole worker at once: no drain (its compute
      // may be blocked in a collective for good), every rank killed and reaped, exit non-zero;
      // tulip restarts rose, hence all ranks.
      if (Status rs = w.ranks->check(); !rs.isOk()) {
        log::error("a rank failed; stopping every rank", {{"error", rs}});
        channel->setState(shm::WorkerState::kFailed);
        w.ranks->killAll();
        std::fflush(nullptr);
        _exit(1);
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check >= std::chrono::milliseconds(500)) {
      last_check = now;
      if (!processAlive(owner) || (!create_shm && getppid() != parent)) {
        owner_gone = true;
        return true;
      }
    }
    return false;
  });
  const rose::StepLoopStats st = (*loop)->stats();
  const rose::GraphExecStats graph =
      w.embedding != nullptr ? w.embedding->graphStats() : rose::GraphExecStats{};
  log::info("stopped", {{"reason", owner_gone ? "owner gone" : "signal"},
                        {"batches_run", st.batches_run},
                        {"batches_rejected", st.batches_rejected},
                        {"graph_eager", graph.eager},
                        {"graph_captures", graph.captures},
                        {"graph_replays", graph.replays},
                        {"graph_capture_failures", graph.capture_failures}});
  loop->reset();
  if (w.ranks) w.ranks->stop(std::chrono::seconds(5));
  return 0;
}
