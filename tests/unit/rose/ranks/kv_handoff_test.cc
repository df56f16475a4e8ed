// The host-memory KV handoff (services/rose/parallel/kv_handoff.h) between two processes:
//   - prefill/decode: a "prefill" process runs a tiny gpt-oss prompt on a cache over exported
//     pools (blocks 5, 9, 2) and samples the first token; a "decode" process maps the pools,
//     pulls those blocks into ITS cache under other ids (0, 1, 3) and generates from there: the
//     tokens equal one process doing prefill and decode on one cache;
//   - bytes: pulled blocks equal the source in every layer, K and V; blocks not named keep
//     their sentinel;
//   - refusals: ids out of range, a destination written twice, layer or block-size mismatch,
//     mapping with another shape, and writing through an imported (read-only) pair.

#include "services/rose/parallel/kv_handoff.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "services/rose/model/gpt_oss.h"
#include "services/rose/ops/llm_ops.h"
#include "services/rose/tools/mkmodel_gpt_oss.h"

namespace garden::rose {
namespace {

namespace fs = std::filesystem;

constexpr int32_t kBlock = 4;
constexpr int kDecode = 6;

std::string modelDir() {
  static const std::string dir = [] {
    const std::string d = (fs::temp_directory_path() /
                           ("kv_handoff_" + std::to_string(getpid()))).string();
    MkGptOssOptions o;
    o.out_dir = d;
    o.seed = 17;
    EXPECT_TRUE(makeGptOssModel(o).isOk());
    return d;
  }();
  return dir;
}

struct Model {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LlmOps> ops;
  std::unique_ptr<GptOssModel> model;
};
Model load() {
  Model m;
  m.backend = std::move(makeBackend("cpu", BackendOptions{1, 0, 64})).value();
  m.ops = std::move(makeLlmOps(*m.backend, 1)).value();
  GptOssOptions go;
  go.max_batch_tokens = 32;
  go.max_seqs = 1;
  go.max_logits_rows = 1;
  go.max_model_len = 64;
  go.min_block_size = kBlock;
  m.model = std::move(GptOssModel::load(modelDir(), *m.backend, *m.ops, go)).value();
  return m;
}

// One step of one sequence: `tokens` new at `position`, block table `blocks`; the sampled id.
int32_t step(Model& m, PagedKvCache& kv, const std::vector<int32_t>& tokens, int32_t position,
             const std::vector<int32_t>& blocks) {
  LlmStepSeq s;
  s.num_tokens = static_cast<int32_t>(tokens.size());
  s.position = position;
  s.num_blocks = static_cast<int32_t>(kvBlocksFor(position + s.num_tokens, kBlock));
  s.sample = 1;
  std::vector<LlmStepSeq> seqs = {s};
  const std::vector<int32_t> table(blocks.begin(), blocks.begin() + s.num_blocks);
  const LlmStep st{seqs, tokens, table, {}};
  Status v = m.model->validate(st, kv);
  EXPECT_TRUE(v.isOk()) << v.toString();
  int32_t id = -1;
  m.backend->launch([&] { m.model->enqueueStep(st, kv, nullptr, &id); });
  EXPECT_TRUE(m.backend->synchronize().isOk());
  return id;
}

const std::vector<int32_t> kPrompt = {200006, 1428, 200008, 12194, 200007, 17, 99, 4096, 5, 6, 7};

TEST(KvHandoff, DecodeProcessContinuesFromPulledBlocks) {
  // Both processes are forked before either loads anything (no backend threads across fork).
  ASSERT_TRUE(fs::exists(modelDir() + "/config.json"));
  auto cfg = loadGptOssConfig(modelDir());
  ASSERT_TRUE(cfg.isOk()) << cfg.status().toString();
  const KvCacheShape prefill_shape{static_cast<int32_t>(cfg->base.num_hidden_layers), 12, kBlock,
                                   static_cast<int32_t>(cfg->base.num_key_value_heads),
                                   static_cast<int32_t>(cfg->base.head_dim)};
  auto pools = std::move(SharedKvPools::create(prefill_shape, DType::kF32)).value();
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Decode process: waits for the prefill's first token, pulls blocks 5, 9, 2 into 0, 1, 3.
    int32_t first = -1;
    if (read(to_child[0], &first, sizeof(first)) != sizeof(first)) _exit(10);
    Model m = load();
    auto src = SharedKvPools::map(pools->fd(), prefill_shape, m.model->kvDType());
    if (!src.isOk()) _exit(11);
    auto kv = std::move(PagedKvCache::create(*m.backend, m.model->kvShape(16, kBlock),
                                             m.model->kvDType()))
                  .value();
    const std::vector<int32_t> pairs = {5, 0, 9, 1, 2, 3};
    if (!copyKvBlocks(*m.backend, (*src)->view(), *kv, pairs).isOk()) _exit(12);
    const std::vector<int32_t> blocks = {0, 1, 3, 7, 8};  // the rest of the table: fresh blocks
    std::vector<int32_t> got = {first};
    for (int i = 0; i < kDecode; ++i) {
      got.push_back(step(m, *kv, {got.back()}, static_cast<int32_t>(kPrompt.size()) + i, blocks));
    }
    if (write(to_parent[1], got.data(), got.size() * 4) != static_cast<ssize_t>(got.size() * 4)) {
      _exit(13);
    }
    _exit(0);
  }
  // Reference: prefill and decode on one cache.
  std::vector<int32_t> want;
  {
    Model m = load();
    auto kv = std::move(PagedKvCache::create(*m.backend, m.model->kvShape(16, kBlock),
                                             m.model->kvDType()))
                  .value();
    const std::vector<int32_t> blocks = {0, 1, 2, 3, 4};
    want.push_back(step(m, *kv, kPrompt, 0, blocks));
    for (int i = 0; i < kDecode; ++i) {
      want.push_back(step(m, *kv, {want.back()},
                          static_cast<int32_t>(kPrompt.size()) + i, blocks));
    }
  }
  // Prefill process: the prompt on the exported pools, blocks 5, 9, 2.
  Model pm = load();
  ASSERT_EQ(pm.model->kvShape(12, kBlock).num_kv_heads, prefill_shape.num_kv_heads);
  auto kv = std::move(pools->cache()).value();
  const int32_t first = step(pm, *kv, kPrompt, 0, {5, 9, 2});
  ASSERT_EQ(write(to_child[1], &first, sizeof(first)), static_cast<ssize_t>(sizeof(first)));
  std::vector<int32_t> got(kDecode + 1, -1);
  const ssize_t n = read(to_parent[0], got.data(), got.size() * 4);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "decode process status " << st;
  ASSERT_EQ(n, static_cast<ssize_t>(got.size() * 4));
  EXPECT_EQ(got, want);
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
}

TEST(KvHandoff, PulledBytesAreExactAndOthersUntouched) {
  const KvCacheShape s{3, 10, 4, 2, 8};  // 3 layers, 10 blocks of 4 x 2 heads x 8
  auto pools = std::move(SharedKvPools::create(s, DType::kF32)).value();
  {
    auto src = std::move(pools->cache()).value();
    for (int32_t l = 0; l < s.num_layers; ++l) {
      auto* k = static_cast<float*>(src->keys(l).data);
      auto* v = static_cast<float*>(src->values(l).data);
      for (int64_t i = 0; i < src->keys(l).numel(); ++i) {
        k[i] = static_cast<float>(l * 100000 + i);
        v[i] = -static_cast<float>(l * 100000 + i) - 1.f;
      }
    }
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto backend = std::move(makeBackend("cpu", BackendOptions{1, 0, 64})).value();
    auto src = SharedKvPools::map(pools->fd(), s, DType::kF32);
    if (!src.isOk()) _exit(20);
    KvCacheShape ds = s;
    ds.num_blocks = 7;
    auto dst = std::move(PagedKvCache::create(*backend, ds, DType::kF32)).value();
    for (int32_t l = 0; l < ds.num_layers; ++l) {
      std::fill_n(static_cast<float*>(dst->keys(l).data), dst->keys(l).numel(), 7.5f);
      std::fill_n(static_cast<float*>(dst->values(l).data), dst->values(l).numel(), 7.5f);
    }
    const std::vector<int32_t> pairs = {9, 0, 0, 6, 4, 2, 5, 3};
    if (!copyKvBlocks(*backend, (*src)->view(), *dst, pairs).isOk()) _exit(21);
    if (!backend->synchronize().isOk()) _exit(22);
    const int64_t per_block = 4 * 2 * 8;
    for (int32_t l = 0; l < ds.num_layers; ++l) {
      const auto* k = static_cast<const float*>(dst->keys(l).data);
      const auto* v = static_cast<const float*>(dst->values(l).data);
      for (int32_t b = 0; b < ds.num_blocks; ++b) {
        int32_t from = -1;
        for (size_t i = 0; i < pairs.size(); i += 2) {
          if (pairs[i + 1] == b) from = pairs[i];
        }
        for (int64_t e = 0; e < per_block; ++e) {
          const float wk = from < 0 ? 7.5f : static_cast<float>(l * 100000 + from * per_block + e);
          const float wv = from < 0 ? 7.5f : -wk - 1.f;
          if (k[b * per_block + e] != wk || v[b * per_block + e] != wv) _exit(23);
        }
      }
    }
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "importer status " << st;
}

TEST(KvHandoff, RefusesBadPairsAndShapes) {
  auto backend = std::move(makeBackend("cpu", BackendOptions{1, 0, 64})).value();
  const KvCacheShape s{2, 6, 4, 2, 8};
  auto pools = std::move(SharedKvPools::create(s, DType::kF32)).value();
  auto dst = std::move(PagedKvCache::create(*backend, s, DType::kF32)).value();
  const KvPoolView src = pools->view();
  auto refused = [&](std::vector<int32_t> pairs, const std::string& says) {
    Status st = copyKvBlocks(*backend, src, *dst, pairs);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
    EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
  };
  refused({6, 0}, "pair 0: source block 6");
  refused({0, 0, 1, -1}, "pair 1: destination block -1");
  refused({0, 3, 1, 3}, "pair 1: destination block 3 written twice");
  refused({0}, "(src, dst) pairs");
  KvCacheShape other = s;
  other.head_dim = 16;
  auto wide = std::move(PagedKvCache::create(*backend, other, DType::kF32)).value();
  Status st = copyKvBlocks(*backend, src, *wide, std::vector<int32_t>{0, 0});
  EXPECT_NE(st.message().find("block_bytes"), std::string::npos) << st.message();
  other = s;
  other.num_layers = 3;
  auto deep = std::move(PagedKvCache::create(*backend, other, DType::kF32)).value();
  st = copyKvBlocks(*backend, src, *deep, std::vector<int32_t>{0, 0});
  EXPECT_NE(st.message().find("layers"), std::string::npos) << st.message();
  // The same bytes per block in another element type [TAG_ATTN_F16].
  {
    auto bf = std::move(SharedKvPools::create(s, DType::kBF16)).value();
    auto half = std::move(PagedKvCache::create(*backend, s, DType::kF16)).value();
    st = copyKvBlocks(*backend, bf->view(), *half, std::vector<int32_t>{0, 0});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
    EXPECT_NE(st.message().find("dtype BF16 (source) != F16 (destination)"), std::string::npos)
        << st.message();
  }
  // Mapping with another shape, and a cache over an imported pair.
  EXPECT_FALSE(SharedKvPools::map(pools->fd(), other, DType::kF32).isOk());
  auto mapped = SharedKvPools::map(pools->fd(), s, DType::kF32);
  ASSERT_TRUE(mapped.isOk()) << mapped.status().toString();
  EXPECT_EQ((*mapped)->cache().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(copyKvBlocks(*backend, src, *dst, std::vector<int32_t>{0, 5, 5, 0}).isOk());
  EXPECT_TRUE(backend->synchronize().isOk());
}

// [TAG_KV_PULL_CUDA] The copy through Backend::copyKvBlocks (the cpu backend's; the CUDA kernel
// does the same per layer, tests/gpu/ipc_test.cc) with window pools on an irregular set of layers
// (0, 2 and 3 of 5) and every pool of another size on each side: each layer's blocks come from its
// own pool's pairs, at that layer's offset; every byte of every block is checked.
TEST(KvHandoff, WindowLayersTakeTheirOwnPairsAtTheirOwnOffsets) {
  auto backend = std::move(makeBackend("cpu", BackendOptions{1, 0, 64})).value();
  KvCacheShape s{5, 7, 4, 2, 8};
  s.num_blocks_window = 3;
  s.window_layers = 0b01101;
  KvCacheShape d = s;
  d.num_blocks = 5;
  d.num_blocks_window = 4;
  auto pools = std::move(SharedKvPools::create(s, DType::kF32)).value();
  auto dst = std::move(PagedKvCache::create(*backend, d, DType::kF32)).value();
  const int64_t per_block = int64_t{4} * 2 * 8;  // floats of one block
  // Source value of (layer, block, element, K/V); destination sentinel -3.
  auto value = [&](int l, int b, int64_t e, int v) {
    return static_cast<float>(((l * 31 + b) * 1000 + e) * (v ? -1 : 1));
  };
  for (int v = 0; v < 2; ++v) {
    auto* src = reinterpret_cast<float*>(
        const_cast<std::byte*>(v ? pools->view().v : pools->view().k));
    for (int l = 0; l < s.num_layers; ++l) {
      float* layer = src + s.layerOffset(l);
      for (int b = 0; b < s.layerBlocks(l); ++b) {
        for (int64_t e = 0; e < per_block; ++e) layer[b * per_block + e] = value(l, b, e, v);
      }
    }
    const Tensor t = v ? dst->values(0) : dst->keys(0);
    std::fill_n(static_cast<float*>(t.data), d.totalElements(), -3.f);
  }
  const std::vector<int32_t> pairs = {6, 0, 2, 4, 0, 2};  // full pool (layers 1, 4)
  const std::vector<int32_t> window = {2, 3, 0, 1};       // window pool (layers 0, 2, 3)
  ASSERT_TRUE(copyKvBlocks(*backend, pools->view(), *dst, pairs, window).isOk());
  ASSERT_TRUE(backend->synchronize().isOk());
  int64_t checked = 0;
  for (int v = 0; v < 2; ++v) {
    const Tensor t = v ? dst->values(0) : dst->keys(0);
    const float* out = static_cast<const float*>(t.data);
    for (int l = 0; l < d.num_layers; ++l) {
      const std::vector<int32_t>& lp = d.windowLayer(l) ? window : pairs;
      for (int b = 0; b < d.layerBlocks(l); ++b) {
        int from = -1;
        for (size_t i = 0; i < lp.size(); i += 2) {
          if (lp[i + 1] == b) from = lp[i];
        }
        for (int64_t e = 0; e < per_block; ++e, ++checked) {
          const float want = from < 0 ? -3.f : value(l, from, e, v);
          ASSERT_EQ(out[d.layerOffset(l) + b * per_block + e], want)
              << "layer " << l << " block " << b << " element " << e << (v ? " V" : " K");
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * d.totalElements());
}

}  // namespace
}  // namespace garden::rose
