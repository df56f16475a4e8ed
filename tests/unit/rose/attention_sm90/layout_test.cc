// The Hopper attention kernel's index arithmetic (services/rose/ops/cuda/attention_sm90_layout.h),
// checked on the CPU against models of the hardware written from the PTX ISA and the CUDA driver
// documentation:
//   - the 128-byte swizzle a TMA box lands in, vs the kernel's tileOffset();
//   - the wgmma shared-memory descriptors the kernel builds (start, LBO, SBO, layout, and the
//     per-k-step / per-stage additions it makes to them), decoded through the canonical K-major
//     and MN-major SWIZZLE_128B layouts, vs where the copy put each operand element;
//   - the accumulator and register-A fragment layouts, and the S -> P register hand-over;
//   - an emulation of one consumer warpgroup's S = Q K^T and O += P V through those descriptors
//     and fragments vs a direct matrix product;
//   - the tensor-map shape and box coordinates; the shared-memory plan;
//   - the block -> (sequence, query tile, head) schedule over varlen batches, the key tiles a
//     block visits and the one mask step, vs the causal / bidirectional reference sets.
// None of this runs the GPU: a wrong model of the hardware would pass here and fail there.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "services/rose/ops/cuda/attention_sm90_layout.h"

namespace garden::rose::cuda::sm90 {
namespace {

// ---- hardware models ---------------------------------------------------------------------------

struct Desc {
  uint32_t start, lbo, sbo, base_offset, layout;
};
Desc decode(uint64_t d) {
  Desc r;
  r.start = static_cast<uint32_t>(d & 0x3FFFu) << 4;
  r.lbo = static_cast<uint32_t>((d >> 16) & 0x3FFFu) << 4;
  r.sbo = static_cast<uint32_t>((d >> 32) & 0x3FFFu) << 4;
  r.base_offset = static_cast<uint32_t>((d >> 49) & 7u);
  r.layout = static_cast<uint32_t>(d >> 62);
  return r;
}
// Byte address wgmma reads for element (mn, k) (k < 16) of a K-major SWIZZLE_128B operand: rows
// of 128 bytes, 8-row groups SBO apart, the swizzle on the absolute address bits.
uint32_t kMajorAddress(uint64_t desc, int mn, int k) {
  const Desc d = decode(desc);
  EXPECT_EQ(d.layout, 1u);
  EXPECT_EQ(d.base_offset, 0u);
  return swizzle128(d.start + static_cast<uint32_t>(mn / 8) * d.sbo +
                    static_cast<uint32_t>(mn % 8) * 128 + static_cast<uint32_t>(k) * 2);
}
// Element (k, n) (k < 16) of an MN-major SWIZZLE_128B operand: 64 contiguous n per 128-byte row,
// n atoms LBO apart, k rows 128 bytes apart in groups of 8 that are SBO apart.
uint32_t mnMajorAddress(uint64_t desc, int k, int n) {
  const Desc d = decode(desc);
  EXPECT_EQ(d.layout, 1u);
  EXPECT_EQ(d.base_offset, 0u);
  return swizzle128(d.start + static_cast<uint32_t>(n / 64) * d.lbo +
                    static_cast<uint32_t>(k / 8) * d.sbo + static_cast<uint32_t>(k % 8) * 128 +
                    static_cast<uint32_t>(n % 64) * 2);
}
// Where a SWIZZLE_128B TMA box {64 columns, rows} written at 1024-aligned `box_base` puts its
// element (r, c): row-major 128-byte rows, then the address swizzle.
uint32_t tmaBoxAddress(uint32_t box_base, int r, int c) {
  return swizzle128(box_base + static_cast<uint32_t>(r) * 128 + static_cast<uint32_t>(c) * 2);
}

// A plausible dynamic shared-memory base (the kernel rounds it up to 1024).
constexpr uint32_t kBase = 0x400;

float bf16Round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  u &= 0xFFFF0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// ---- swizzle and descriptors -------------------------------------------------------------------

TEST(AttentionSm90Layout, TileOffsetIsWhereTheTmaBoxesPutEachElement) {
  std::set<uint32_t> seen;
  for (int r = 0; r < 128; ++r) {
    for (int c = 0; c < 128; ++c) {
      const uint32_t half_base = kBase + static_cast<uint32_t>(c / 64) * kHalfBytes;
      ASSERT_EQ(half_base % kSwizzleAtomBytes, 0u);
      ASSERT_EQ(kBase + tileOffset(r, c), tmaBoxAddress(half_base, r, c % 64))
          << "row " << r << " col " << c;
      seen.insert(tileOffset(r, c));
    }
  }
  // A bijection onto the 32 KB tile, 2 bytes per element.
  EXPECT_EQ(seen.size(), 128u * 128u);
  EXPECT_EQ(*seen.begin(), 0u);
  EXPECT_EQ(*seen.rbegin(), kTileBytes - 2);
}

TEST(AttentionSm90Layout, DescriptorFieldsAndInPlaceAdvance) {
  const uint64_t d = makeDescriptor(0x12340, kMnMajorLbo, kMnMajorSbo);
  const Desc x = decode(d);
  EXPECT_EQ(x.start, 0x12340u);
  EXPECT_EQ(x.lbo, kHalfBytes);
  EXPECT_EQ(x.sbo, 1024u);
  EXPECT_EQ(x.base_offset, 0u);
  EXPECT_EQ(x.layout, 1u);  // SWIZZLE_128B
  EXPECT_EQ(decode(makeDescriptor(0x400, kKMajorLbo, kKMajorSbo)).lbo, 16u);
  // The kernel adds (byte offset >> 4) to a descriptor built once: no carry may leave the 14-bit
  // start field anywhere in the block's shared memory (at most 227 KB).
  using L = SmemLayout<2>;
  for (uint32_t base = 0; base + L::kBytes <= 232448; base += kSwizzleAtomBytes) {
    for (uint32_t region :
         {L::kQ, L::kQ + 64 * kRowBytes, L::kK, L::kK + kTileBytes, L::kV, L::kV + kTileBytes}) {
      const uint64_t k0 = makeDescriptor(base + region, kKMajorLbo, kKMajorSbo);
      for (int kk = 0; kk < 8; ++kk) {
        ASSERT_EQ(k0 + (kMajorStepOffset(kk) >> 4),
                  makeDescriptor(base + region + kMajorStepOffset(kk), kKMajorLbo, kKMajorSbo));
        ASSERT_EQ(
            makeDescriptor(base + region, kMnMajorLbo, kMnMajorSbo) + (mnMajorStepOffset(kk) >> 4),
            makeDescriptor(base + region + mnMajorStepOffset(kk), kMnMajorLbo, kMnMajorSbo));
      }
    }
    // Per-stage advance, as the kernel does it (stage * kTileBytes >> 4).
    ASSERT_EQ(makeDescriptor(base + L::kK, kKMajorLbo, kKMajorSbo) + (kTileBytes >> 4),
              makeDescriptor(base + L::kK + kTileBytes, kKMajorLbo, kKMajorSbo));
  }
}

TEST(AttentionSm90Layout, QAndKDescriptorsReadTheTileElementsOfEachKStep) {
  using L = SmemLayout<2>;
  const uint32_t s_q = kBase + L::kQ;
  for (int w = 0; w < 2; ++w) {
    const uint64_t q_desc =
        makeDescriptor(s_q + w * kWarpgroupRows * kRowBytes, kKMajorLbo, kKMajorSbo);
    for (int kk = 0; kk < 8; ++kk) {
      for (int m = 0; m < 64; ++m) {
        for (int k = 0; k < 16; ++k) {
          ASSERT_EQ(kMajorAddress(q_desc + (kMajorStepOffset(kk) >> 4), m, k),
                    s_q + tileOffset(w * 64 + m, kk * 16 + k))
              << "Q warpgroup " << w << " k-step " << kk << " row " << m << " k " << k;
        }
      }
    }
  }
  for (int stage = 0; stage < 2; ++stage) {
    const uint32_t s_k = kBase + L::kK + stage * kTileBytes;
    const uint64_t k_desc =
        makeDescriptor(kBase + L::kK, kKMajorLbo, kKMajorSbo) + stage * (kTileBytes >> 4);
    for (int kk = 0; kk < 8; ++kk) {
      for (int n = 0; n < 128; ++n) {
        for (int k = 0; k < 16; ++k) {
          ASSERT_EQ(kMajorAddress(k_desc + (kMajorStepOffset(kk) >> 4), n, k),
                    s_k + tileOffset(n, kk * 16 + k))
              << "K stage " << stage << " k-step " << kk << " key " << n << " k " << k;
        }
      }
    }
  }
}

TEST(AttentionSm90Layout, VDescriptorReadsTheTileTransposed) {
  using L = SmemLayout<2>;
  for (int stage = 0; stage < 2; ++stage) {
    const uint32_t s_v = kBase + L::kV + stage * kTileBytes;
    const uint64_t v_desc =
        makeDescriptor(kBase + L::kV, kMnMajorLbo, kMnMajorSbo) + stage * (kTileBytes >> 4);
    for (int kk = 0; kk < 8; ++kk) {
      for (int k = 0; k < 16; ++k) {
        for (int n = 0; n < 128; ++n) {
          ASSERT_EQ(mnMajorAddress(v_desc + (mnMajorStepOffset(kk) >> 4), k, n),
                    s_v + tileOffset(kk * 16 + k, n))
              << "V stage " << stage << " k-step " << kk << " key " << k << " dim " << n;
        }
      }
    }
  }
}

// ---- fragments ---------------------------------------------------------------------------------

TEST(AttentionSm90Layout, AccumulatorAndAFragmentsCoverTheirTilesOnce) {
  std::vector<int> acc(64 * 128, 0), a(64 * 16, 0);
  for (int tid = 0; tid < 128; ++tid) {
    for (int e = 0; e < 64; ++e) {
      const int r = accRow(tid, e), c = accCol(tid, e);
      ASSERT_TRUE(r >= 0 && r < 64 && c >= 0 && c < 128);
      ++acc[r * 128 + c];
    }
    for (int reg = 0; reg < 4; ++reg) {
      for (int h = 0; h < 2; ++h) {
        const int r = aRow(tid, reg), c = aCol(tid, reg, h);
        ASSERT_TRUE(r >= 0 && r < 64 && c >= 0 && c < 16);
        ++a[r * 16 + c];
      }
    }
  }
  EXPECT_TRUE(std::all_of(acc.begin(), acc.end(), [](int n) { return n == 1; }));
  EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](int n) { return n == 1; }));
  // Warp w owns rows 16w .. 16w + 15 in both layouts (the PTX ISA's m64nNk16 figures).
  for (int tid = 0; tid < 128; ++tid) {
    EXPECT_EQ(accRow(tid, 0) / 16, tid / 32);
    EXPECT_EQ(aRow(tid, 3) / 16, tid / 32);
  }
}

TEST(AttentionSm90Layout, PRegistersHoldTheSameThreadsSElements) {
  for (int tid = 0; tid < 128; ++tid) {
    for (int kk = 0; kk < 8; ++kk) {
      for (int reg = 0; reg < 4; ++reg) {
        for (int h = 0; h < 2; ++h) {
          const int e = pSourceElement(kk, reg) + h;
          ASSERT_EQ(accRow(tid, e), aRow(tid, reg)) << tid << " " << kk << " " << reg;
          ASSERT_EQ(accCol(tid, e), kk * 16 + aCol(tid, reg, h)) << tid << " " << kk << " " << reg;
        }
      }
    }
  }
}

// One consumer warpgroup's step, emulated instruction by instruction: the kernel's descriptors
// and k-step loop, operands read from a byte image of shared memory through the descriptor
// model, A of P V from the fragment registers. Against a direct product.
TEST(AttentionSm90Layout, EmulatedWarpgroupStepMatchesDirectProduct) {
  using L = SmemLayout<2>;
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint8_t> smem(kBase + L::kBytes, 0);
  auto put = [&](uint32_t addr, float v) {
    const float b = bf16Round(v);
    uint32_t bits;
    std::memcpy(&bits, &b, 4);
    const uint16_t hi = static_cast<uint16_t>(bits >> 16);
    std::memcpy(&smem[addr], &hi, 2);
  };
  auto get = [&](uint32_t addr) {
    uint16_t hi;
    std::memcpy(&hi, &smem[addr], 2);
    const uint32_t bits = static_cast<uint32_t>(hi) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  const int stage = 1, w = 1;
  float q[128][128], k[128][128], v[128][128];
  for (int r = 0; r < 128; ++r) {
    for (int c = 0; c < 128; ++c) {
      q[r][c] = bf16Round(u(rng));
      k[r][c] = bf16Round(u(rng));
      v[r][c] = bf16Round(u(rng));
      put(kBase + L::kQ + tileOffset(r, c), q[r][c]);
      put(kBase + L::kK + stage * kTileBytes + tileOffset(r, c), k[r][c]);
      put(kBase + L::kV + stage * kTileBytes + tileOffset(r, c), v[r][c]);
    }
  }
  const uint64_t q_desc =
      makeDescriptor(kBase + L::kQ + w * kWarpgroupRows * kRowBytes, kKMajorLbo, kKMajorSbo);
  const uint64_t k_desc =
      makeDescriptor(kBase + L::kK, kKMajorLbo, kKMajorSbo) + stage * (kTileBytes >> 4);
  const uint64_t v_desc =
      makeDescriptor(kBase + L::kV, kMnMajorLbo, kMnMajorSbo) + stage * (kTileBytes >> 4);
  // S: per thread, 64 accumulators; wgmma m64n128k16 with both operands from descriptors.
  static float s[128][64];
  for (int kk = 0; kk < 8; ++kk) {
    const uint64_t da = q_desc + (kMajorStepOffset(kk) >> 4);
    const uint64_t db = k_desc + (kMajorStepOffset(kk) >> 4);
    for (int tid = 0; tid < 128; ++tid) {
      for (int e = 0; e < 64; ++e) {
        double acc = kk == 0 ? 0.0 : s[tid][e];
        for (int kx = 0; kx < 16; ++kx) {
          acc += static_cast<double>(get(kMajorAddress(da, accRow(tid, e), kx))) *
                 get(kMajorAddress(db, accCol(tid, e), kx));
        }
        s[tid][e] = static_cast<float>(acc);
      }
    }
  }
  for (int tid = 0; tid < 128; ++tid) {
    for (int e = 0; e < 64; ++e) {
      double ref = 0;
      for (int c = 0; c < 128; ++c)
        ref += static_cast<double>(q[64 * w + accRow(tid, e)][c]) * k[accCol(tid, e)][c];
      ASSERT_NEAR(s[tid][e], ref, 1e-4) << "S thread " << tid << " element " << e;
    }
  }
  // P = some function of S (here tanh, bf16-rounded as packBf16x2 does), handed over as A
  // registers exactly as toP() packs them; O = P V through the MN-major descriptor.
  static float p_regs[128][32][2];
  for (int tid = 0; tid < 128; ++tid) {
    for (int kk = 0; kk < 8; ++kk) {
      for (int reg = 0; reg < 4; ++reg) {
        const int e = pSourceElement(kk, reg);
        p_regs[tid][4 * kk + reg][0] = bf16Round(std::tanh(s[tid][e]));
        p_regs[tid][4 * kk + reg][1] = bf16Round(std::tanh(s[tid][e + 1]));
      }
    }
  }
  // The A operand as the hardware assembles it from all 128 threads' registers.
  static float a_tile[8][64][16];
  for (int tid = 0; tid < 128; ++tid) {
    for (int kk = 0; kk < 8; ++kk) {
      for (int reg = 0; reg < 4; ++reg) {
        for (int h = 0; h < 2; ++h) {
          a_tile[kk][aRow(tid, reg)][aCol(tid, reg, h)] = p_regs[tid][4 * kk + reg][h];
        }
      }
    }
  }
  static float o[128][64];
  for (int kk = 0; kk < 8; ++kk) {
    const uint64_t db = v_desc + (mnMajorStepOffset(kk) >> 4);
    for (int tid = 0; tid < 128; ++tid) {
      for (int e = 0; e < 64; ++e) {
        double acc = kk == 0 ? 0.0 : o[tid][e];
        for (int kx = 0; kx < 16; ++kx) {
          acc += static_cast<double>(a_tile[kk][accRow(tid, e)][kx]) *
                 get(mnMajorAddress(db, kx, accCol(tid, e)));
        }
        o[tid][e] = static_cast<float>(acc);
      }
    }
  }
  // Direct: O[row][d] = sum_key bf16(tanh(S[row][key])) V[key][d], S from the direct product.
  std::vector<double> srow(128);
  for (int row = 0; row < 64; ++row) {
    for (int key = 0; key < 128; ++key) {
      double acc = 0;
      for (int c = 0; c < 128; ++c) acc += static_cast<double>(q[64 * w + row][c]) * k[key][c];
      srow[key] = bf16Round(std::tanh(static_cast<float>(acc)));
    }
    for (int tid = 0; tid < 128; ++tid) {
      for (int e = 0; e < 64; ++e) {
        if (accRow(tid, e) != row) continue;
        double ref = 0;
        for (int key = 0; key < 128; ++key) ref += srow[key] * v[key][accCol(tid, e)];
        ASSERT_NEAR(o[tid][e], ref, 2e-2) << "O row " << row << " dim " << accCol(tid, e);
      }
    }
  }
}

// ---- tensor map and shared memory --------------------------------------------------------------

TEST(AttentionSm90Layout, TensorMapShapeAndColumns) {
  for (auto [hq, hkv] : {std::pair{16, 8}, {32, 8}, {4, 4}, {6, 2}}) {
    const int64_t t = 4099;
    const QkvTensorMapShape s = qkvTensorMapShape(t, hq, hkv);
    const int64_t width = static_cast<int64_t>(hq + 2 * hkv) * 128;
    EXPECT_EQ(s.dims[0], static_cast<uint64_t>(width));
    EXPECT_EQ(s.dims[1], static_cast<uint64_t>(t));
    EXPECT_EQ(s.row_stride_bytes, static_cast<uint64_t>(width) * 2);
    EXPECT_EQ(s.row_stride_bytes % 16, 0u);  // cuTensorMapEncodeTiled: strides multiple of 16
    EXPECT_EQ(s.box[0] * 2, 128u);           // inner box extent = the 128-byte swizzle span
    EXPECT_LE(s.box[1], 256u);
    EXPECT_EQ(2u * s.box[0] * s.box[1] * 2u, kTileBytes);  // expect_tx bytes of a box pair
    // Packed row: [q heads][k heads][v heads] x 128. Each box stays inside its head.
    for (int h = 0; h < hq; ++h) {
      for (int half = 0; half < 2; ++half) EXPECT_EQ(qColumn(h, half), h * 128 + half * 64);
    }
    for (int h = 0; h < hkv; ++h) {
      for (int half = 0; half < 2; ++half) {
        EXPECT_EQ(kColumn(hq, h, half), (hq + h) * 128 + half * 64);
        EXPECT_EQ(vColumn(hq, hkv, h, half), (hq + hkv + h) * 128 + half * 64);
        EXPECT_LE(vColumn(hq, hkv, h, half) + 64, width);
      }
    }
  }
}

TEST(AttentionSm90Layout, SharedMemoryPlan) {
  using L = SmemLayout<2>;
  for (uint32_t off : {L::kQ, L::kK, L::kK + kTileBytes, L::kV, L::kV + kTileBytes}) {
    EXPECT_EQ(off % kSwizzleAtomBytes, 0u);
  }
  EXPECT_EQ(L::kBarriers % 8, 0u);
  EXPECT_EQ(L::kBytes, 5 * kTileBytes + 8 * 9);
  EXPECT_LE(L::kDynamicBytes, 232448u);  // the H100/H200 per-block opt-in limit (227 KB)
}

// ---- schedule and masks ------------------------------------------------------------------------

// The device's findAttentionTile, scalar: tile -> (sequence, first row in sequence order).
bool findTileRef(const std::vector<int32_t>& cu, int tile, int& seq, int& q0) {
  int base = 0;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int n = (cu[s + 1] - cu[s] + kBlockM - 1) / kBlockM;
    if (tile < base + n) {
      seq = static_cast<int>(s);
      q0 = (tile - base) * kBlockM;
      return true;
    }
    base += n;
  }
  return false;
}

TEST(AttentionSm90Layout, GridCoversEveryQueryTileAndHeadOnce) {
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> batches = {
      {1}, {4096}, {4097}, {127, 128, 129}, {1, 1, 1, 1}, {300, 5, 1000}, {65, 1, 1000, 127, 63}};
  for (int i = 0; i < 20; ++i) {
    std::vector<int32_t> lens(1 + rng() % 40);
    for (auto& l : lens) l = 1 + static_cast<int32_t>(rng() % 700);
    batches.push_back(lens);
  }
  for (bool causal : {false, true}) {
    for (const auto& lens : batches) {
      std::vector<int32_t> cu(lens.size() + 1, 0);
      for (size_t s = 0; s < lens.size(); ++s) cu[s + 1] = cu[s] + lens[s];
      const int hq = 16;
      const int64_t blocks = maxQueryTiles(cu.back(), static_cast<int>(lens.size())) * hq;
      std::set<std::tuple<int, int, int>> seen;  // (seq, q0, head)
      int64_t idle = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        int seq = 0, tq0 = 0;
        if (!findTileRef(cu, static_cast<int>(blockTile(b, hq)), seq, tq0)) {
          ++idle;
          continue;
        }
        const int len = lens[seq];
        const int q0 = queryTileStart(len, tq0 / kBlockM, causal);
        ASSERT_TRUE(q0 >= 0 && q0 < len && q0 % kBlockM == 0);
        ASSERT_TRUE(seen.insert({seq, q0, blockHead(b, hq)}).second) << "block " << b;
      }
      int64_t want = 0;
      for (int32_t l : lens) want += (l + kBlockM - 1) / kBlockM;
      EXPECT_EQ(static_cast<int64_t>(seen.size()), want * hq);
      EXPECT_EQ(idle, blocks - want * hq);
    }
  }
}

TEST(AttentionSm90Layout, KeyTilesAndTheOneMaskStepGiveTheReferenceSets) {
  std::vector<int> lens = {1, 2, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300, 1000, 4096, 4097};
  for (bool causal : {false, true}) {
    for (int len : lens) {
      for (int q0 = 0; q0 < len; q0 += kBlockM) {
        const int n = kvTiles(len, q0, causal);
        ASSERT_GE(n, 1);
        const int first_key0 = (n - 1) * kBlockN;  // the tile processed first, masked
        for (int row = q0; row < q0 + kBlockM; ++row) {
          // Every row of the block (stored or not) sees a key of the masked tile: finite max.
          bool any = false;
          for (int key = first_key0; key < first_key0 + kBlockN; ++key) {
            any = any || keyVisible(key, row, len, causal);
          }
          ASSERT_TRUE(any) << "len " << len << " row " << row;
          // The unmasked tiles: all their keys visible to every row of the block.
          for (int key = 0; key < first_key0; ++key) {
            ASSERT_TRUE(keyVisible(key, row, len, causal) || row >= len)
                << "len " << len << " row " << row << " key " << key;
            ASSERT_TRUE(key < len && (!causal || key <= row));
          }
          if (row >= len) continue;
          // Visited and visible = the reference set, and nothing past the visited tiles.
          for (int key = 0; key < len; ++key) {
            const bool visited = key < n * kBlockN;
            const bool visible = key < first_key0 || keyVisible(key, row, len, causal);
            ASSERT_EQ(visited && visible, !causal || key <= row)
                << "len " << len << " row " << row << " key " << key;
          }
        }
        // Keys past the sequence in the masked tile are exactly those whose V rows are zeroed.
        for (int key = first_key0; key < first_key0 + kBlockN; ++key) {
          bool seen_by_any = false;
          for (int row = q0; row < std::min(len, q0 + kBlockM); ++row) {
            seen_by_any = seen_by_any || keyVisible(key, row, len, causal);
          }
          if (key >= len) {
            ASSERT_FALSE(seen_by_any) << "len " << len << " key " << key;
          }
        }
      }
    }
  }
}

TEST(AttentionSm90Layout, CausalTilesRunLongestFirst) {
  for (int len : {1, 128, 129, 1000, 4096}) {
    const int tiles = (len + kBlockM - 1) / kBlockM;
    int prev = 1 << 30;
    for (int i = 0; i < tiles; ++i) {
      const int work = kvTiles(len, queryTileStart(len, i, true), true);
      EXPECT_LE(work, prev);
      prev = work;
    }
    EXPECT_EQ(queryTileStart(len, 0, false), 0);
  }
}

}  // namespace
}  // namespace garden::rose::cuda::sm90
