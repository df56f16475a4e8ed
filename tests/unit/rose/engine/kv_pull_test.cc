// Prefill/decode disaggregation on the rose side [TAG_KV_PULL]: two LlmRunners, each behind its
// own step loop and shm channel, on the CPU backend with the tiny gpt-oss checkpoint of
// tests/conformance/gpt_oss/fixtures (its outputs are checked against transformers there):
//   - the prefill worker keeps its KV cache in a named export (LlmRunnerOptions::kv_export) and
//     runs prompts (chunked), sampling each prompt's first token;
//   - the decode worker takes a kKvPull batch naming the export and (src, dst) pairs, completes
//     it with no rows, and decodes the sequences from its own blocks;
//   - every sampled id equals one model running prefill and decode on one cache (greedy and
//     seeded), with and without a window pool (the fixture's sliding window is 8 tokens);
//   - pulled blocks hold the exporter's bytes exactly (every layer, K and V), other blocks keep
//     theirs;
//   - refusals name the field and copy nothing: unknown export, another pid, pairs out of range,
//     a destination twice, window pairs without a window pool, counts that disagree, a worker
//     whose cache differs in shape.

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/shm/channel.h"
#include "common/shm/llm_batch.h"
#include "services/rose/engine/llm_runner.h"
#include "services/rose/engine/step_loop.h"
#include "services/rose/model/gpt_oss.h"
#include "services/rose/ops/backend.h"
#include "services/rose/ops/llm_ops.h"

namespace garden::rose {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string fixtureDir() {
  const char* src = std::getenv("GARDEN_SOURCE_DIR");
  return ((src ? fs::path(src) : fs::path(".")) / "tests/conformance/gpt_oss/fixtures/mxfp4")
      .string();
}

constexpr int32_t kBlockSize = 4, kMaxSeqs = 4, kMaxLen = 64;
constexpr int64_t kMaxTokens = 48;
constexpr uint64_t kInputBytes = 16384;

// One worker: backend, ops, model, runner, step loop, channel.
struct Worker {
  std::optional<shm::Channel> channel;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LlmOps> ops;
  std::unique_ptr<GptOssModel> model;
  std::unique_ptr<LlmRunner> runner;
  std::unique_ptr<StepLoop> loop;
  uint64_t next_id = 100;

  ~Worker() {
    loop.reset();
    runner.reset();
  }

  shm::Completion submitAndWait(const shm::BatchDesc& d) {
    EXPECT_TRUE(channel->trySubmit(d));
    EXPECT_TRUE(loop->step(1s));
    auto c = channel->waitCompletion(20s);
    EXPECT_TRUE(c.has_value());
    return c.value_or(shm::Completion{});
  }
};

GptOssOptions modelOptions() {
  GptOssOptions go;
  go.max_batch_tokens = kMaxTokens;
  go.max_seqs = kMaxSeqs;
  go.max_logits_rows = kMaxSeqs;
  go.max_model_len = kMaxLen;
  go.min_block_size = kBlockSize;
  return go;
}

std::unique_ptr<Worker> startWorker(const std::string& tag, int32_t blocks, int32_t window_blocks,
                                    const std::string& kv_export) {
  static std::atomic<int> counter{0};
  auto w = std::make_unique<Worker>();
  const std::string name = "/rose-kv-pull-test-" + std::to_string(getpid()) + "-" + tag + "-" +
                           std::to_string(counter++);
  auto ch = shm::Channel::create(name, shm::Layout{2, kInputBytes, 4096});
  EXPECT_TRUE(ch.isOk()) << ch.status().toString();
  if (!ch.isOk()) return nullptr;
  w->channel.emplace(std::move(ch).value());
  BackendOptions bo;
  bo.threads = 1;
  bo.max_batch_tokens = kMaxTokens;
  w->backend = std::move(makeBackend("cpu", bo)).value();
  w->ops = std::move(makeLlmOps(*w->backend, 1)).value();
  auto m = GptOssModel::load(fixtureDir(), *w->backend, *w->ops, modelOptions());
  EXPECT_TRUE(m.isOk()) << m.status().toString();
  if (!m.isOk()) return nullptr;
  w->model = std::move(m).value();
  LlmRunnerOptions ro;
  ro.kv_num_blocks = blocks;
  ro.kv_num_blocks_window = window_blocks;
  ro.kv_block_size = kBlockSize;
  ro.max_seqs = kMaxSeqs;
  ro.max_batch_tokens = kMaxTokens;
  ro.kv_export = kv_export;
  auto r = LlmRunner::create(*w->backend, *w->model, ro);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  if (!r.isOk()) return nullptr;
  w->runner = std::move(r).value();
  StepLoopOptions lo;
  lo.model_name = "tiny-gpt-oss-" + tag;
  auto e = StepLoop::create(*w->channel, *w->backend, *w->runner, lo);
  EXPECT_TRUE(e.isOk()) << e.status().toString();
  if (!e.isOk()) return nullptr;
  w->loop = std::move(e).value();
  w->loop->announceReady();
  return w;
}

// A sequence of a step: its new tokens, position, block table and (with a window pool) window
// table; `sample` draws with `sp`.
struct Seq {
  std::vector<int32_t> tokens;
  int32_t position = 0;
  std::vector<int32_t> table;
  std::vector<int32_t> window;  // empty: no window pool
  bool sample = false;
  SamplingParams sp;
};

shm::BatchDesc putStep(Worker& w, uint32_t slot, const std::vector<Seq>& seqs) {
  std::vector<LlmStepSeq> desc;
  std::vector<int32_t> tokens, blocks;
  for (const Seq& s : seqs) {
    LlmStepSeq q;
    q.token_offset = static_cast<int32_t>(tokens.size());
    q.num_tokens = static_cast<int32_t>(s.tokens.size());
    q.position = s.position;
    q.block_offset = static_cast<int32_t>(blocks.size());
    q.num_blocks = static_cast<int32_t>(kvBlocksFor(s.position + q.num_tokens, kBlockSize));
    q.sample = s.sample ? 1 : 0;
    q.sampling = s.sp;
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    blocks.insert(blocks.end(), s.table.begin(), s.table.begin() + q.num_blocks);
    if (!s.window.empty()) {
      q.window_table = 1;
      blocks.insert(blocks.end(), s.window.begin(), s.window.begin() + q.num_blocks);
    }
    desc.push_back(q);
  }
  auto in = w.channel->inputArena(slot);
  shm::BatchDesc d;
  d.batch_id = ++w.next_id;
  d.slot = slot;
  d.kind = shm::BatchKind::kGenerate;
  d.num_seqs = static_cast<uint32_t>(desc.size());
  d.num_tokens = static_cast<uint32_t>(tokens.size());
  d.num_blocks = static_cast<uint32_t>(blocks.size());
  uint64_t off = 0;
  d.seqs_offset = off;
  std::memcpy(in.data() + off, desc.data(), desc.size() * sizeof(LlmStepSeq));
  off += shm::llmAlignUp(desc.size() * sizeof(LlmStepSeq));
  d.tokens_offset = off;
  std::memcpy(in.data() + off, tokens.data(), tokens.size() * 4);
  off += shm::llmAlignUp(tokens.size() * 4);
  d.blocks_offset = off;
  std::memcpy(in.data() + off, blocks.data(), blocks.size() * 4);
  return d;
}

std::vector<int32_t> runStep(Worker& w, uint32_t slot, const std::vector<Seq>& seqs) {
  shm::Completion c = w.submitAndWait(putStep(w, slot, seqs));
  EXPECT_EQ(c.status_code, 0) << c.message;
  std::vector<int32_t> out(c.rows);
  if (!out.empty()) std::memcpy(out.data(), w.channel->outputArena(slot).data(), out.size() * 4);
  return out;
}

// A kKvPull batch: `source`/`pid`, full-pool pairs then window-pool pairs.
shm::BatchDesc putPull(Worker& w, uint32_t slot, const std::string& source, int32_t pid,
                       const std::vector<int32_t>& pairs,
                       const std::vector<int32_t>& window_pairs = {}) {
  shm::KvPullDesc pd;
  std::snprintf(pd.source, sizeof(pd.source), "%s", source.c_str());
  pd.source_pid = pid;
  pd.num_pairs = static_cast<uint32_t>(pairs.size() / 2);
  pd.num_window_pairs = static_cast<uint32_t>(window_pairs.size() / 2);
  auto in = w.channel->inputArena(slot);
  shm::BatchDesc d;
  d.batch_id = ++w.next_id;
  d.slot = slot;
  d.kind = shm::BatchKind::kKvPull;
  d.seqs_offset = 0;
  std::memcpy(in.data(), &pd, sizeof(pd));
  d.blocks_offset = shm::llmAlignUp(sizeof(pd));
  std::vector<int32_t> all = pairs;
  all.insert(all.end(), window_pairs.begin(), window_pairs.end());
  if (!all.empty()) std::memcpy(in.data() + d.blocks_offset, all.data(), all.size() * 4);
  d.num_blocks = static_cast<uint32_t>(all.size());
  return d;
}

// The whole cache of a worker, layer by layer, K then V (host memory on the cpu backend).
std::vector<std::byte> cacheBytes(const PagedKvCache& kv) {
  std::vector<std::byte> out;
  for (int32_t l = 0; l < kv.shape().num_layers; ++l) {
    for (const Tensor& t : {kv.keys(l), kv.values(l)}) {
      const auto* p = static_cast<const std::byte*>(t.data);
      out.insert(out.end(), p, p + t.bytes());
    }
  }
  return out;
}

// One block of one layer (K or V) of a cache.
std::vector<std::byte> blockBytes(const PagedKvCache& kv, int32_t layer, bool keys,
                                  int32_t block) {
  const Tensor t = keys ? kv.keys(layer) : kv.values(layer);
  const size_t bb = t.bytes() / static_cast<size_t>(kv.shape().layerBlocks(layer));
  const auto* p = static_cast<const std::byte*>(t.data) + static_cast<size_t>(block) * bb;
  return {p, p + bb};
}

std::string exportName(const std::string& tag) {
  return "garden-kv-pull-test-" + std::to_string(getpid()) + "-" + tag;
}

// Two prompts prefilled on one worker (one in two chunks), their blocks pulled into another,
// decoded there: the same ids as one worker doing all of it. `window`: both keep window pools.
void prefillPullDecode(bool window) {
  SCOPED_TRACE(window ? "window pools" : "one pool");
  const std::string name = exportName(window ? "w" : "p");
  const int32_t wb = window ? 24 : 0;
  auto prefill = startWorker("prefill", 32, wb, name);
  auto decode = startWorker("decode", 24, wb, "");
  auto whole = startWorker("whole", 32, wb, "");
  ASSERT_TRUE(prefill && decode && whole);
  const shm::ModelFacts pf = prefill->channel->modelFacts();
  EXPECT_STREQ(pf.kv_export, name.c_str());
  EXPECT_NE(pf.llm_caps & shm::kLlmCapKvPull, 0u);
  EXPECT_STREQ(decode->channel->modelFacts().kv_export, "");
  // The export exists while its worker lives.
  EXPECT_TRUE(fs::exists("/dev/shm/" + name));

  SamplingParams greedy, seeded;
  seeded.temperature = 0.8f;
  seeded.top_k = 50;
  seeded.seed = 99;
  const std::vector<int32_t> a_prompt = {5, 17, 300, 42, 99, 7, 260, 11, 400, 3, 77, 13, 8};
  const std::vector<int32_t> b_prompt = {1, 2, 3, 4, 5, 6, 7};
  // Prefill-side and whole-worker tables (the whole worker uses the prefill side's ids), and
  // the decode side's own ids; window tables in the window pool's ids.
  const std::vector<int32_t> a_pre = {5, 9, 2, 30, 17, 11, 20, 21, 22, 23, 24, 25};
  const std::vector<int32_t> b_pre = {0, 31, 7, 12, 13, 14, 15, 16, 18, 19, 26, 27};
  const std::vector<int32_t> a_dec = {3, 0, 1, 10, 4, 5, 6, 7, 8, 9, 11, 12};
  const std::vector<int32_t> b_dec = {23, 22, 2, 13, 14, 15, 16, 17, 18, 19, 20, 21};
  const std::vector<int32_t> a_wpre = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<int32_t> b_wpre = {13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 0};
  const std::vector<int32_t> a_wdec = {23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12};
  const std::vector<int32_t> b_wdec = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  auto seqOf = [&](std::vector<int32_t> toks, int32_t pos, const std::vector<int32_t>& table,
                   const std::vector<int32_t>& wtable, bool sample, SamplingParams sp) {
    Seq s;
    s.tokens = std::move(toks);
    s.position = pos;
    s.table = table;
    if (window) s.window = wtable;
    s.sample = sample;
    s.sp = sp;
    return s;
  };
  // Prefill: A in two chunks (8 + 5), B whole; A and B sample their first token at the end.
  std::vector<int32_t> a8(a_prompt.begin(), a_prompt.begin() + 8);
  std::vector<int32_t> a5(a_prompt.begin() + 8, a_prompt.end());
  const std::vector<Seq> step1 = {seqOf(a8, 0, a_pre, a_wpre, false, greedy),
                                  seqOf(b_prompt, 0, b_pre, b_wpre, true, seeded)};
  const std::vector<Seq> step2 = {seqOf(a5, 8, a_pre, a_wpre, true, greedy)};
  const auto p1 = runStep(*prefill, 0, step1);
  const auto w1 = runStep(*whole, 0, step1);
  const auto p2 = runStep(*prefill, 1, step2);
  const auto w2 = runStep(*whole, 1, step2);
  ASSERT_EQ(p1.size(), 1u);
  ASSERT_EQ(p2.size(), 1u);
  EXPECT_EQ(p1, w1);
  EXPECT_EQ(p2, w2);

  // The handoff: A's 13 tokens (4 blocks) and B's 7 (2 blocks); with a window pool the window
  // tables' blocks too (all of them: the window of 8 keeps the last 2-3 blocks, pulling the
  // rest costs nothing but bytes).
  const int32_t a_n = 4, b_n = 2;
  std::vector<int32_t> pairs, wpairs;
  for (int32_t i = 0; i < a_n; ++i) pairs.insert(pairs.end(), {a_pre[i], a_dec[i]});
  for (int32_t i = 0; i < b_n; ++i) pairs.insert(pairs.end(), {b_pre[i], b_dec[i]});
  if (window) {
    for (int32_t i = 0; i < a_n; ++i) wpairs.insert(wpairs.end(), {a_wpre[i], a_wdec[i]});
    for (int32_t i = 0; i < b_n; ++i) wpairs.insert(wpairs.end(), {b_wpre[i], b_wdec[i]});
  }
  const auto before = cacheBytes(decode->runner->kvCache());
  shm::Completion c = decode->submitAndWait(
      putPull(*decode, 0, name, prefill->channel->workerPid(), pairs, wpairs));
  ASSERT_EQ(c.status_code, 0) << c.message;
  EXPECT_EQ(c.rows, 0u);
  EXPECT_EQ(c.output_bytes, 0u);
  // Exact bytes where pulled; untouched elsewhere.
  const PagedKvCache& src = prefill->runner->kvCache();
  const PagedKvCache& dst = decode->runner->kvCache();
  const KvCacheShape& shape = dst.shape();
  size_t at = 0;
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    const bool wl = shape.windowLayer(l);
    const std::vector<int32_t>& lp = wl ? wpairs : pairs;
    for (bool keys : {true, false}) {
      for (int32_t b = 0; b < shape.layerBlocks(l); ++b) {
        const auto got = blockBytes(dst, l, keys, b);
        int32_t from = -1;
        for (size_t i = 0; i < lp.size(); i += 2) {
          if (lp[i + 1] == b) from = lp[i];
        }
        if (from >= 0) {
          EXPECT_EQ(got, blockBytes(src, l, keys, from))
              << "layer " << l << (keys ? " K" : " V") << " block " << b;
        } else {
          EXPECT_EQ(std::memcmp(got.data(), before.data() + at, got.size()), 0)
              << "layer " << l << (keys ? " K" : " V") << " block " << b << " changed";
        }
        at += got.size();
      }
    }
  }
  ASSERT_EQ(at, before.size());

  // Decode on the decode worker (its own ids) and on the whole worker (the prefill ids).
  int32_t a_next = p2[0], b_next = p1[0];
  int32_t a_pos = 13, b_pos = 7;
  for (int i = 0; i < 12; ++i) {
    const std::vector<Seq> d = {seqOf({a_next}, a_pos, a_dec, a_wdec, true, greedy),
                                seqOf({b_next}, b_pos, b_dec, b_wdec, true, seeded)};
    const std::vector<Seq> wh = {seqOf({a_next}, a_pos, a_pre, a_wpre, true, greedy),
                                 seqOf({b_next}, b_pos, b_pre, b_wpre, true, seeded)};
    const auto got = runStep(*decode, static_cast<uint32_t>(i % 2), d);
    const auto want = runStep(*whole, static_cast<uint32_t>(i % 2), wh);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got, want) << "decode step " << i;
    a_next = want[0];
    b_next = want[1];
    ++a_pos;
    ++b_pos;
  }
  EXPECT_EQ(decode->loop->stats().batches_rejected, 0u);
  prefill.reset();
  EXPECT_FALSE(fs::exists("/dev/shm/" + name)) << "the export outlived its worker";
}

TEST(KvPull, PrefillOnOneWorkerDecodeOnAnotherEqualsOneWorker) { prefillPullDecode(false); }

TEST(KvPull, WindowPoolsArePulledToo) { prefillPullDecode(true); }

TEST(KvPull, RefusalsNameTheFieldAndCopyNothing) {
  const std::string name = exportName("r");
  auto prefill = startWorker("prefill", 16, 0, name);
  auto decode = startWorker("decode", 8, 0, "");
  ASSERT_TRUE(prefill && decode);
  const int32_t pid = prefill->channel->workerPid();
  // Something in the exporter's blocks, so a wrong copy would show.
  runStep(*prefill, 0, {Seq{{1, 2, 3, 4, 5, 6}, 0, {3, 4}, {}, true, {}}});
  const auto before = cacheBytes(decode->runner->kvCache());
  auto refused = [&](const shm::BatchDesc& d, StatusCode code, const std::string& says) {
    shm::Completion c = decode->submitAndWait(d);
    EXPECT_EQ(c.status_code, static_cast<int32_t>(code)) << c.message;
    EXPECT_NE(std::string(c.message).find(says), std::string::npos)
        << "'" << c.message << "' lacks '" << says << "'";
    EXPECT_EQ(cacheBytes(decode->runner->kvCache()), before) << says;
  };
  refused(putPull(*decode, 0, name + "-none", pid, {3, 0}), StatusCode::kFailedPrecondition,
          "no kv export named " + name + "-none");
  refused(putPull(*decode, 1, name, pid + 100000, {3, 0}), StatusCode::kFailedPrecondition,
          "belongs to pid " + std::to_string(pid));
  refused(putPull(*decode, 0, name, pid, {16, 0}), StatusCode::kInvalidArgument,
          "pair 0: source block 16 outside [0, 16)");
  refused(putPull(*decode, 1, name, pid, {3, 0, 4, 8}), StatusCode::kInvalidArgument,
          "pair 1: destination block 8 outside [0, 8)");
  refused(putPull(*decode, 0, name, pid, {3, 1, 4, 1}), StatusCode::kInvalidArgument,
          "pair 1: destination block 1 written twice");
  refused(putPull(*decode, 1, name, pid, {3, 1}, {0, 0}), StatusCode::kInvalidArgument,
          "window pairs without a window pool");
  refused(putPull(*decode, 0, name, pid, {}), StatusCode::kInvalidArgument, "no pairs");
  {
    shm::BatchDesc d = putPull(*decode, 1, name, pid, {3, 1});
    d.num_blocks = 4;
    refused(d, StatusCode::kInvalidArgument, "num_blocks 4 != 2 * (num_pairs 1");
  }
  {
    shm::BatchDesc d = putPull(*decode, 0, name, pid, {3, 1});
    d.num_seqs = 1;
    refused(d, StatusCode::kInvalidArgument, "num_seqs and num_tokens must be 0");
  }
  {
    shm::BatchDesc d = putPull(*decode, 1, name, pid, {3, 1});
    d.blocks_offset = kInputBytes - 4;
    refused(d, StatusCode::kInvalidArgument, "run past the input arena");
  }
  {
    shm::BatchDesc d = putPull(*decode, 0, "", pid, {3, 1});
    refused(d, StatusCode::kInvalidArgument, "source must be a non-empty");
  }
  // A worker whose cache has a window pool cannot take blocks from one without.
  auto windowed = startWorker("windowed", 8, 8, "");
  ASSERT_TRUE(windowed);
  shm::Completion c = windowed->submitAndWait(putPull(*windowed, 0, name, pid, {3, 1}));
  EXPECT_EQ(c.status_code, static_cast<int32_t>(StatusCode::kInvalidArgument)) << c.message;
  EXPECT_NE(std::string(c.message).find("window pool: the source has none"), std::string::npos)
      << c.message;
  // The loop went on serving: a good pull after the refusals.
  c = decode->submitAndWait(putPull(*decode, 1, name, pid, {3, 1, 4, 2}));
  EXPECT_EQ(c.status_code, 0) << c.message;
  EXPECT_EQ(blockBytes(decode->runner->kvCache(), 0, true, 1),
            blockBytes(prefill->runner->kvCache(), 0, true, 3));
}

// A second worker asking for the same export name while the first lives is refused (the pid is
// named); a crashed exporter's segment (its pid dead) is replaced; the name is removed when the
// runner that made it goes.
TEST(KvPull, ExportNamesAreNotStolenAndCrashedOnesAreReplaced) {
  const std::string name = exportName("n");
  BackendOptions bo;
  bo.threads = 1;
  bo.max_batch_tokens = kMaxTokens;
  auto backend = std::move(makeBackend("cpu", bo)).value();
  auto ops = std::move(makeLlmOps(*backend, 1)).value();
  auto model = std::move(GptOssModel::load(fixtureDir(), *backend, *ops, modelOptions())).value();
  LlmRunnerOptions ro;
  ro.kv_num_blocks = 8;
  ro.kv_block_size = kBlockSize;
  ro.max_seqs = kMaxSeqs;
  ro.max_batch_tokens = kMaxTokens;
  ro.kv_export = name;
  {
    auto first = LlmRunner::create(*backend, *model, ro);
    ASSERT_TRUE(first.isOk()) << first.status().toString();
    auto second = LlmRunner::create(*backend, *model, ro);
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(second.status().message().find("in use by pid " + std::to_string(getpid())),
              std::string::npos)
        << second.status().message();
  }
  EXPECT_FALSE(fs::exists("/dev/shm/" + name));
  // A crashed exporter: a child creates the export and exits without unlinking it.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto pools = SharedKvPools::createNamed(name, KvCacheShape{2, 4, 4, 1, 8}, DType::kF32);
    if (pools.isOk()) (void)pools->release();  // no destructor: the segment stays, as after SIGKILL
    _exit(pools.isOk() ? 0 : 1);
  }
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ASSERT_TRUE(fs::exists("/dev/shm/" + name));
  {
    auto old = SharedKvPools::openNamed(name, child);
    ASSERT_TRUE(old.isOk()) << old.status().toString();
    EXPECT_EQ((*old)->shape().num_blocks, 4);
  }
  auto again = LlmRunner::create(*backend, *model, ro);
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  auto now = SharedKvPools::openNamed(name, getpid());
  ASSERT_TRUE(now.isOk()) << now.status().toString();
  EXPECT_EQ((*now)->shape().num_blocks, 8);
  // A file that is not an export is never removed.
  const std::string other = exportName("x");
  {
    const int fd = shm_open(("/" + other).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 8192), 0);
    close(fd);
  }
  auto taken = SharedKvPools::createNamed(other, KvCacheShape{1, 1, 1, 1, 1}, DType::kF32);
  EXPECT_EQ(taken.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(taken.status().message().find("not a garden KV export"), std::string::npos)
      << taken.status().message();
  EXPECT_TRUE(fs::exists("/dev/shm/" + other));
  shm_unlink(("/" + other).c_str());
}

// [TAG_KV_PULL_CUDA] A device export (what `rose --device cuda --kv-export` makes) is the header
// only, with the pools' IPC handles: read back exactly by openNamed, its name kept from others
// while it lives; a cpu worker refuses to pull from it (FAILED_PRECONDITION naming the memory),
// copyKvBlocks refuses its unmapped view, and a cpu backend cannot map it (UNIMPLEMENTED). (The
// CUDA side — mapping and copying — runs in tests/gpu/ipc_test.cc and gpu_disagg_test.)
TEST(KvPull, DeviceExportsCarryTheirHandlesAndCpuWorkersRefuseThem) {
  const std::string name = exportName("d");
  PeerMemoryHandle k, v;
  for (size_t i = 0; i < k.bytes.size(); ++i) {
    k.bytes[i] = static_cast<unsigned char>(i * 7 + 1);
    v.bytes[i] = static_cast<unsigned char>(255 - i);
  }
  // The fixture's cache shape at 16 blocks (so a pull's pairs pass the shape checks).
  auto decode = startWorker("decode", 8, 0, "");
  ASSERT_TRUE(decode);
  const KvCacheShape want = decode->model->kvShape(16, kBlockSize, 0);
  auto exp = SharedKvPools::createNamedDevice(name, want, decode->model->kvDType(), k, v);
  ASSERT_TRUE(exp.isOk()) << exp.status().toString();
  EXPECT_TRUE((*exp)->onDevice());
  EXPECT_EQ(fs::file_size("/dev/shm/" + name), 4096u) << "the header only";
  auto cache = (*exp)->cache();
  EXPECT_EQ(cache.status().code(), StatusCode::kFailedPrecondition);
  auto taken = SharedKvPools::createNamedDevice(name, want, decode->model->kvDType(), k, v);
  EXPECT_EQ(taken.status().code(), StatusCode::kFailedPrecondition);
  auto got = SharedKvPools::openNamed(name, getpid());
  ASSERT_TRUE(got.isOk()) << got.status().toString();
  EXPECT_TRUE((*got)->onDevice());
  EXPECT_EQ((*got)->kHandle().bytes, k.bytes);
  EXPECT_EQ((*got)->vHandle().bytes, v.bytes);
  EXPECT_EQ((*got)->shape().num_blocks, 16);
  EXPECT_EQ((*got)->shape().num_layers, want.num_layers);
  EXPECT_EQ((*got)->dtype(), decode->model->kvDType());
  EXPECT_EQ((*got)->view().k, nullptr);
  EXPECT_TRUE((*got)->view().device);
  auto own = PagedKvCache::create(*decode->backend, want, decode->model->kvDType());
  ASSERT_TRUE(own.isOk());
  const Status copy =
      copyKvBlocks(*decode->backend, (*got)->view(), **own, std::vector<int32_t>{0, 0});
  EXPECT_EQ(copy.code(), StatusCode::kFailedPrecondition) << copy.toString();
  EXPECT_NE(copy.message().find("device memory"), std::string::npos) << copy.message();
  EXPECT_EQ((*got)->mapDevice(*decode->backend).code(), StatusCode::kUnimplemented);
  // Through the channel: the cpu worker's pull is refused, its cache untouched.
  const auto before = cacheBytes(decode->runner->kvCache());
  shm::Completion c = decode->submitAndWait(putPull(*decode, 0, name, getpid(), {3, 1}));
  EXPECT_EQ(c.status_code, static_cast<int32_t>(StatusCode::kFailedPrecondition)) << c.message;
  EXPECT_NE(std::string(c.message).find("the source cache is in device memory"),
            std::string::npos)
      << c.message;
  EXPECT_EQ(cacheBytes(decode->runner->kvCache()), before);
  exp->reset();
  EXPECT_FALSE(fs::exists("/dev/shm/" + name));
}

// Bad export names are refused before anything is created.
TEST(KvPull, ExportNamesAreChecked) {
  for (const std::string& bad :
       std::vector<std::string>{"", ".hidden", "a/b", std::string(64, 'x'), "sp ace"}) {
    auto p = SharedKvPools::createNamed(bad, KvCacheShape{1, 1, 1, 1, 1}, DType::kF32);
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace garden::rose
