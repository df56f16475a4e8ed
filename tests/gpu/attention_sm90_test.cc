// The Hopper attention kernel (services/rose/ops/cuda/attention_sm90.cuh: AttentionVariant kSm90,
// kSm90Basic and the TMA-free bisection variant kSm90CpAsync; AttentionPolicy::kSm90) against the
// CPU fp32 reference and against the mma.sync kernel (narrow64), on fresh random inputs: batch 1
// and varlen batches, lengths 1 .. 4097 (odd ones and the tile edges 127/128/129), causal and
// bidirectional, several GQA groups. Written to be debugged from one run's log: every case prints
// a summary line; a mismatch prints the first bad element, the bad (sequence, 128-row query tile,
// head) tiles, and histograms of the bad elements by consumer warpgroup / warp / row mod 8 /
// head-dim half / column mod 8 (a layout bug shows as a pattern there), and whether the kernel's
// mbarrier watchdog gave up (a hang).

#include "services/rose/ops/cuda/attention_sm90.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "services/rose/ops/cuda/attention.cuh"
#include "services/rose/ops/cuda/cuda_backend.h"
#include "tests/gpu/gpu_test_util.h"

namespace garden::rose::gputest {
namespace {

class AttentionSm90 : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = makeBackends();
    ASSERT_TRUE(be_.cpu && be_.gpu);
    rng_.seed(::testing::UnitTest::GetInstance()->random_seed() + 90);
  }
  Backend& cpu() { return *be_.cpu; }
  Backend& gpu() { return *be_.gpu; }
  cuda::CudaBackend& cb() { return static_cast<cuda::CudaBackend&>(gpu()); }
  DType act() { return gpu().activationDType(); }
  Backends be_;
  std::mt19937 rng_;
};

struct Case {
  int32_t hq, hkv;
  bool causal;
  std::vector<int32_t> lens;
  float range = 2.f;  // inputs uniform in [-range, range)
};

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "Hq" << c.hq << " Hkv" << c.hkv << (c.causal ? " causal" : " bidir") << " range " << c.range
    << " seqs";
  size_t shown = 0;
  for (int32_t l : c.lens) {
    if (shown++ == 12) {
      s << " ... (" << c.lens.size() << " seqs)";
      break;
    }
    s << ' ' << l;
  }
  return s.str();
}

// Compares got with ref (both [tokens, hq * 128]); returns the number of bad elements (plus one
// when some (token, head) row's relative L2 error exceeds max_rel_l2 > 0: long diffuse rows have
// small outputs that the elementwise tolerance would not police) and prints the diagnosis when
// there are any (always the one-line summary).
int64_t diagnose(const std::vector<float>& got, const std::vector<float>& ref,
                 const std::vector<int32_t>& cu, int hq, double atol, double rtol,
                 double max_rel_l2, const std::string& what) {
  constexpr int d = 128;
  int64_t bad = 0, nonfinite = 0;
  double max_err = 0, worst_rel_l2 = 0;
  std::string first;
  // (seq, query tile, head) -> (bad count, max err, first bad row in seq, first bad dim)
  std::map<std::tuple<int, int, int>, std::tuple<int64_t, double, int, int>> tiles;
  std::array<int64_t, 2> by_wg{}, by_half{};
  std::array<int64_t, 4> by_warp{};
  std::array<int64_t, 8> by_row8{}, by_col8{};
  for (size_t sq = 0; sq + 1 < cu.size(); ++sq) {
    for (int32_t row = 0; row < cu[sq + 1] - cu[sq]; ++row) {
      const int64_t tok = cu[sq] + row;
      for (int h = 0; h < hq; ++h) {
        double num = 0, den = 0;
        for (int i = 0; i < d; ++i) {
          const size_t k = static_cast<size_t>((tok * hq + h) * d + i);
          const double g = got[k], r = ref[k];
          if (!std::isfinite(g)) ++nonfinite;
          const double err = std::fabs(g - r);
          num += (g - r) * (g - r);
          den += r * r;
          if (err <= atol + rtol * std::fabs(r)) continue;  // NaN counts as bad
          ++bad;
          max_err = std::isfinite(err) ? std::max(max_err, err) : INFINITY;
          if (first.empty()) {
            std::ostringstream s;
            s << "first bad element: seq " << sq << " (len " << cu[sq + 1] - cu[sq] << ") row "
              << row << " token " << tok << " head " << h << " dim " << i << ": got " << g
              << " want " << r;
            first = s.str();
          }
          auto& t = tiles[{static_cast<int>(sq), row / 128, h}];
          if (std::get<0>(t)++ == 0) {
            std::get<2>(t) = row;
            std::get<3>(t) = i;
          }
          std::get<1>(t) = std::max(std::get<1>(t), std::isfinite(err) ? err : INFINITY);
          ++by_wg[(row % 128) / 64];
          ++by_warp[(row % 64) / 16];
          ++by_row8[row % 8];
          ++by_half[i / 64];
          ++by_col8[i % 8];
        }
        const double rel = std::sqrt(num / std::max(den, 1e-30));
        if (!(rel <= worst_rel_l2)) worst_rel_l2 = rel;
      }
    }
  }
  std::printf("  %-22s bad %lld  nonfinite %lld  max_err %.3g  worst row rel-L2 %.3g\n",
              what.c_str(), static_cast<long long>(bad), static_cast<long long>(nonfinite), max_err,
              worst_rel_l2);
  if (max_rel_l2 > 0 && !(worst_rel_l2 <= max_rel_l2)) {
    std::printf("    worst row relative L2 error %.3g > %.3g\n", worst_rel_l2, max_rel_l2);
    if (bad == 0) return 1;
  }
  if (bad == 0) return 0;
  std::printf("    %s\n", first.c_str());
  std::printf("    bad tiles: %zu (seq, q-tile, head: n_bad, max_err, first bad row/dim)\n",
              tiles.size());
  int shown = 0;
  for (const auto& [key, val] : tiles) {
    if (shown++ == 16) break;
    std::printf("      seq %d tile %d head %d: %lld bad, max %.3g, first row %d dim %d\n",
                std::get<0>(key), std::get<1>(key), std::get<2>(key),
                static_cast<long long>(std::get<0>(val)), std::get<1>(val), std::get<2>(val),
                std::get<3>(val));
  }
  auto hist = [](const char* name, const auto& a) {
    std::printf("    by %-18s", name);
    for (int64_t v : a) std::printf(" %lld", static_cast<long long>(v));
    std::printf("\n");
  };
  hist("warpgroup (row/64):", by_wg);
  hist("warp (row%64/16):", by_warp);
  hist("row % 8:", by_row8);
  hist("dim half:", by_half);
  hist("dim % 8:", by_col8);
  return bad;
}

enum class Kernel { kNarrow64, kSm90, kSm90Basic, kSm90CpAsync, kPolicySm90 };
const char* runName(Kernel r) {
  switch (r) {
    case Kernel::kNarrow64:
      return "narrow64 (mma.sync)";
    case Kernel::kSm90:
      return "sm90";
    case Kernel::kSm90Basic:
      return "sm90basic";
    case Kernel::kSm90CpAsync:
      return "sm90cpasync";
    case Kernel::kPolicySm90:
      return "policy sm90";
  }
  return "?";
}

// GARDEN_SM90_TEST_ONLY=<name> (sm90cpasync, sm90basic, sm90, policy sm90) runs only that variant
// of the sm90 ones (bisection after a crash, which ends the process).
bool selected(Kernel r) {
  const char* only = std::getenv("GARDEN_SM90_TEST_ONLY");
  return r == Kernel::kNarrow64 || only == nullptr || *only == '\0' ||
         std::strcmp(only, runName(r)) == 0;
}

// One launch on qkv (device, [rows, width]); the output poisoned first.
std::vector<float> launch(AttentionSm90& t, Backend& gpu, cuda::CudaBackend& cb, DType act,
                          const Tensor& qkv, const Tensor& cu, int64_t num_tokens, int32_t seqs,
                          const Case& c, Kernel r, int64_t out_rows) {
  auto go = allocate(gpu, act, {out_rows, static_cast<int64_t>(c.hq) * 128});
  poison(gpu, go.view);
  cuda::AttentionArgs a;
  a.qkv = qkv.as<__nv_bfloat16>();
  a.cu_seqlens = cu.as<int32_t>();
  a.out = go.view.as<__nv_bfloat16>();
  a.num_tokens = num_tokens;
  a.num_seqs = seqs;
  a.num_q_heads = c.hq;
  a.num_kv_heads = c.hkv;
  a.head_dim = 128;
  a.scale = 1.f / std::sqrt(128.f);
  a.causal = c.causal;
  std::printf("  launching %s\n", runName(r));
  std::fflush(stdout);  // the last line of a log that a crash cut short
  Status s;
  switch (r) {
    case Kernel::kNarrow64:
      s = cuda::launchAttentionVariant(a, cb.stream(), cuda::AttentionVariant::kNarrow64);
      break;
    case Kernel::kSm90:
      s = cuda::launchAttentionVariant(a, cb.stream(), cuda::AttentionVariant::kSm90);
      break;
    case Kernel::kSm90Basic:
      s = cuda::launchAttentionVariant(a, cb.stream(), cuda::AttentionVariant::kSm90Basic);
      break;
    case Kernel::kSm90CpAsync:
      s = cuda::launchAttentionVariant(a, cb.stream(), cuda::AttentionVariant::kSm90CpAsync);
      break;
    case Kernel::kPolicySm90:
      s = cuda::launchAttention(a, cb.stream(), cuda::AttentionPolicy::kSm90);
      break;
  }
  EXPECT_TRUE(s.isOk()) << runName(r) << ": " << s.toString();
  auto out = download(gpu, go.view);
  auto fired = cuda::attentionSm90WatchdogFired();
  EXPECT_TRUE(fired.isOk()) << fired.status().toString();
  if (fired.isOk()) {
    EXPECT_FALSE(*fired) << runName(r)
                         << ": the kernel's mbarrier watchdog gave up (a pipeline hang)";
    if (*fired) std::printf("  %s: WATCHDOG FIRED (mbarrier wait gave up)\n", runName(r));
  }
  (void)t;
  return out;
}

TEST_F(AttentionSm90, MatchesReferenceAndMmaSyncKernel) {
  std::vector<Case> cases;
  const std::vector<std::vector<int32_t>> both = {{1},
                                                  {2},
                                                  {17},
                                                  {127},
                                                  {128},
                                                  {129},
                                                  {1, 63, 64, 65, 130, 7},
                                                  {300, 5, 1000},
                                                  {1537},
                                                  {255, 256, 257},
                                                  {4096}};
  for (bool causal : {true, false}) {
    for (const auto& lens : both) cases.push_back({16, 8, causal, lens});
    std::vector<int32_t> rnd(24);
    for (auto& l : rnd) l = 1 + static_cast<int32_t>(rng_() % 600);
    cases.push_back({16, 8, causal, rnd});
    cases.push_back({4, 4, causal, {33, 129, 2}});
    cases.push_back({6, 2, causal, {100, 3, 257}});
    cases.push_back({32, 8, causal, {513, 77}});
    cases.push_back({8, 1, causal, {200, 64}});
    cases.push_back({16, 8, causal, {1000, 3}, 0.25f});  // diffuse softmax
    cases.push_back({16, 8, causal, {300}, 4.f});        // very peaked softmax
  }
  cases.push_back({16, 8, true, {4097}});
  cases.push_back({16, 8, false, {2049, 1}});
  int failed_cases = 0;
  for (const Case& c : cases) {
    const std::string name = describe(c);
    SCOPED_TRACE(name);
    std::printf("case %s\n", name.c_str());
    const auto cu = cumulative(c.lens);
    const int64_t t = cu.back();
    const int64_t width = static_cast<int64_t>(c.hq + 2 * c.hkv) * 128;
    auto qkv = randomBf16(static_cast<size_t>(t * width), rng_, -c.range, c.range);
    auto cq = upload(cpu(), DType::kF32, {t, width}, qkv);
    auto gq = upload(gpu(), act(), {t, width}, qkv);
    const int64_t ns = static_cast<int64_t>(c.lens.size());
    auto ccu = uploadI32(cpu(), {ns + 1}, cu);
    auto gcu = uploadI32(gpu(), {ns + 1}, cu);
    auto co = allocate(cpu(), DType::kF32, {t, static_cast<int64_t>(c.hq) * 128});
    AttentionParams p;
    p.num_seqs = static_cast<int32_t>(ns);
    p.num_q_heads = c.hq;
    p.num_kv_heads = c.hkv;
    p.head_dim = 128;
    p.max_seqlen = *std::max_element(c.lens.begin(), c.lens.end());
    p.scale = 1.f / std::sqrt(128.f);
    p.causal = c.causal;
    cpu().attention(cq.view, ccu.view, co.view, p);
    const auto ref = download(cpu(), co.view);
    const auto old = launch(*this, gpu(), cb(), act(), gq.view, gcu.view, t,
                            static_cast<int32_t>(ns), c, Kernel::kNarrow64, t);
    diagnose(old, ref, cu, c.hq, 1e-2, 2e-2, 1e-2, "narrow64 vs ref");
    int64_t bad_case = 0;
    // Bisection order: cp.async loads (no tensor map), TMA loads, then the pipelined schedule.
    for (Kernel r :
         {Kernel::kSm90CpAsync, Kernel::kSm90Basic, Kernel::kSm90, Kernel::kPolicySm90}) {
      if (!selected(r)) continue;
      const auto got = launch(*this, gpu(), cb(), act(), gq.view, gcu.view, t,
                              static_cast<int32_t>(ns), c, r, t);
      const int64_t bad =
          diagnose(got, ref, cu, c.hq, 1e-2, 2e-2, 1e-2, std::string(runName(r)) + " vs ref");
      EXPECT_EQ(bad, 0) << runName(r) << " differs from the CPU reference";
      // Both kernels are within bf16 rounding of the reference, so of each other.
      const int64_t bad_old =
          diagnose(got, old, cu, c.hq, 2e-2, 4e-2, 0, std::string(runName(r)) + " vs narrow64");
      EXPECT_EQ(bad_old, 0) << runName(r) << " differs from the mma.sync kernel";
      bad_case += bad + bad_old;
    }
    if (bad_case != 0) ++failed_cases;
  }
  std::printf("%d of %zu cases failed\n", failed_cases, cases.size());
}

// Rows past the batch (num_tokens > cu_seqlens[num_seqs], as in a CUDA-graph bucket) hold NaN:
// the last sequence's partial K/V tile reads them through the copy engine, so its keys must be
// masked by selection and its V rows zeroed before P V (0 * NaN is NaN).
TEST_F(AttentionSm90, NanRowsPastTheBatchDoNotLeakIn) {
  for (bool causal : {true, false}) {
    for (const std::vector<int32_t>& lens :
         std::vector<std::vector<int32_t>>{{100}, {5, 200}, {129, 1, 255}}) {
      Case c{16, 8, causal, lens};
      SCOPED_TRACE(describe(c));
      std::printf("case %s + 300 NaN rows\n", describe(c).c_str());
      const auto cu = cumulative(lens);
      const int64_t t = cu.back(), padded = t + 300;
      const int64_t width = static_cast<int64_t>(c.hq + 2 * c.hkv) * 128;
      auto qkv = randomBf16(static_cast<size_t>(t * width), rng_, -2.f, 2.f);
      auto cq = upload(cpu(), DType::kF32, {t, width}, qkv);
      qkv.resize(static_cast<size_t>(padded * width), std::numeric_limits<float>::quiet_NaN());
      auto gq = upload(gpu(), act(), {padded, width}, qkv);
      const int64_t ns = static_cast<int64_t>(lens.size());
      auto ccu = uploadI32(cpu(), {ns + 1}, cu);
      auto gcu = uploadI32(gpu(), {ns + 1}, cu);
      auto co = allocate(cpu(), DType::kF32, {t, static_cast<int64_t>(c.hq) * 128});
      AttentionParams p;
      p.num_seqs = static_cast<int32_t>(ns);
      p.num_q_heads = c.hq;
      p.num_kv_heads = c.hkv;
      p.head_dim = 128;
      p.max_seqlen = *std::max_element(lens.begin(), lens.end());
      p.scale = 1.f / std::sqrt(128.f);
      p.causal = causal;
      cpu().attention(cq.view, ccu.view, co.view, p);
      const auto ref = download(cpu(), co.view);
      for (Kernel r : {Kernel::kSm90CpAsync, Kernel::kSm90Basic, Kernel::kSm90}) {
        if (!selected(r)) continue;
        auto got = launch(*this, gpu(), cb(), act(), gq.view, gcu.view, padded,
                          static_cast<int32_t>(ns), c, r, padded);
        got.resize(ref.size());  // rows past the batch are not written
        EXPECT_EQ(diagnose(got, ref, cu, c.hq, 1e-2, 2e-2, 1e-2, runName(r)), 0) << runName(r);
      }
    }
  }
}

// Under the sm90 policy a sequence's output is the same bits alone and in a batch (the policy
// picks kSm90 at every size; tiles start at each sequence's first token).
TEST_F(AttentionSm90, RowDoesNotDependOnBatch) {
  const int32_t hq = 16, hkv = 8;
  const int64_t width = (hq + 2 * hkv) * 128;
  for (bool causal : {true, false}) {
    const int32_t la = 1000;
    auto a_rows = randomBf16(static_cast<size_t>(la * width), rng_, -2.f, 2.f);
    for (Kernel r : {Kernel::kPolicySm90, Kernel::kSm90, Kernel::kSm90Basic}) {
      auto run = [&](const std::vector<int32_t>& lens, int which) {
        const auto cu = cumulative(lens);
        const int64_t t = cu.back();
        auto qkv = randomBf16(static_cast<size_t>(t * width), rng_, -2.f, 2.f);
        std::copy(a_rows.begin(), a_rows.end(),
                  qkv.begin() + cu[static_cast<size_t>(which)] * width);
        auto gq = upload(gpu(), act(), {t, width}, qkv);
        auto gcu = uploadI32(gpu(), {static_cast<int64_t>(lens.size()) + 1}, cu);
        Case c{hq, hkv, causal, lens};
        auto all = launch(*this, gpu(), cb(), act(), gq.view, gcu.view, t,
                          static_cast<int32_t>(lens.size()), c, r, t);
        return std::vector<float>(all.begin() + cu[static_cast<size_t>(which)] * hq * 128,
                                  all.begin() + (cu[static_cast<size_t>(which)] + la) * hq * 128);
      };
      auto alone = run({la}, 0);
      auto batched = run({5, 4096, la, 1, 77}, 2);
      ASSERT_EQ(alone.size(), batched.size());
      EXPECT_EQ(0, std::memcmp(alone.data(), batched.data(), alone.size() * sizeof(float)))
          << runName(r) << (causal ? " causal" : " bidirectional")
          << ": a sequence's attention changed with its batch";
      EXPECT_TRUE(
          std::all_of(alone.begin(), alone.end(), [](float v) { return std::isfinite(v); }));
    }
  }
}

TEST_F(AttentionSm90, PolicyAndRefusals) {
  cuda::AttentionArgs a;
  a.num_tokens = 1;
  a.num_seqs = 1;
  a.num_q_heads = 16;
  a.num_kv_heads = 8;
  a.head_dim = 128;
  a.scale = 0.088f;
  // kSm90 at every size for head_dim 128; kAuto never picks it (it is not bit-identical).
  for (int64_t tokens : {1, 100, 4096, 100000}) {
    a.num_tokens = tokens;
    auto v = cuda::selectAttentionVariant(a, cuda::AttentionPolicy::kSm90, 132);
    ASSERT_TRUE(v.isOk()) << v.status().toString();
    EXPECT_EQ(*v, cuda::AttentionVariant::kSm90);
    auto va = cuda::selectAttentionVariant(a, cuda::AttentionPolicy::kAuto, 132);
    ASSERT_TRUE(va.isOk());
    EXPECT_NE(*va, cuda::AttentionVariant::kSm90);
    EXPECT_NE(*va, cuda::AttentionVariant::kSm90Basic);
    EXPECT_NE(*va, cuda::AttentionVariant::kSm90CpAsync);
  }
  EXPECT_TRUE(cuda::checkAttentionVariant(a, cuda::AttentionVariant::kSm90).isOk());
  // head_dim 64: the variants refuse by name; the policy falls back to the narrow kernel.
  a.head_dim = 64;
  for (auto v : {cuda::AttentionVariant::kSm90, cuda::AttentionVariant::kSm90Basic,
                 cuda::AttentionVariant::kSm90CpAsync}) {
    const Status s = cuda::checkAttentionVariant(a, v);
    EXPECT_FALSE(s.isOk());
    EXPECT_NE(s.message().find(cuda::attentionVariantName(v)), std::string::npos) << s.toString();
    EXPECT_FALSE(cuda::launchAttentionVariant(a, cb().stream(), v).isOk());
  }
  auto v64 = cuda::selectAttentionVariant(a, cuda::AttentionPolicy::kSm90, 132);
  ASSERT_TRUE(v64.isOk());
  EXPECT_TRUE(*v64 == cuda::AttentionVariant::kNarrow16 ||
              *v64 == cuda::AttentionVariant::kNarrow64);
  a.head_dim = 128;
  a.scale = 0.f;
  EXPECT_FALSE(cuda::checkAttentionVariant(a, cuda::AttentionVariant::kSm90).isOk());
  EXPECT_STREQ(cuda::attentionVariantName(cuda::AttentionVariant::kSm90Basic), "sm90basic");
  EXPECT_STREQ(cuda::attentionVariantName(cuda::AttentionVariant::kSm90CpAsync), "sm90cpasync");
}

}  // namespace
}  // namespace garden::rose::gputest
