// MXFP4 dequantization against hand-computed values (spec §2.5): nibble order, E2M1 table,
// E8M0 scale bias, bf16 exactness, and shape validation.

#include "services/rose/model/mxfp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/safetensors.h"

namespace garden::rose {
namespace {

TEST(Mxfp4, Fp4Table) {
  const float want[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(fp4Value(static_cast<uint8_t>(c)), want[c]) << c;
  EXPECT_TRUE(std::signbit(fp4Value(8)));
}

TEST(Mxfp4, HandComputedBlock) {
  // One row, two groups. Group 0, scale 128 (×2): byte 0x21 → element 0 = code 1 (0.5·2 = 1),
  // element 1 = code 2 (1·2 = 2); byte 0xF9 → element 2 = code 9 (−0.5·2 = −1), element 3 =
  // code 15 (−6·2 = −12); rest zero. Group 1, scale 124 (×1/8): byte 0x7E at index 15 →
  // element 62 = code 14 (−4/8 = −0.5), element 63 = code 7 (6/8 = 0.75).
  std::vector<uint8_t> blocks(32, 0), scales = {128, 124};
  blocks[0] = 0x21;
  blocks[1] = 0xF9;
  blocks[16 + 15] = 0x7E;
  std::vector<float> out(64, 99.f);
  dequantizeMxfp4(blocks.data(), scales.data(), 1, 2, out.data());
  EXPECT_EQ(out[0], 1.f);
  EXPECT_EQ(out[1], 2.f);
  EXPECT_EQ(out[2], -1.f);
  EXPECT_EQ(out[3], -12.f);
  for (int i = 4; i < 62; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], 0.f) << i;
  EXPECT_EQ(out[62], -0.5f);
  EXPECT_EQ(out[63], 0.75f);
  std::vector<uint16_t> bf(64);
  dequantizeMxfp4Bf16(blocks.data(), scales.data(), 1, 2, bf.data());
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(bf16ToF32(bf[static_cast<size_t>(i)]), out[static_cast<size_t>(i)]) << i;
}

TEST(Mxfp4, ExtremeScalesStayExact) {
  // s = 0: 2^-127 (0.5·2^-127 = 2^-128 is a float32/bf16 subnormal); s = 254: 6·2^127.
  std::vector<uint8_t> blocks(16, 0x00), scales = {0};
  blocks[0] = 0x71;  // code 1 then code 7
  std::vector<float> out(32);
  dequantizeMxfp4(blocks.data(), scales.data(), 1, 1, out.data());
  EXPECT_EQ(out[0], std::ldexp(1.f, -128));
  EXPECT_EQ(out[1], std::ldexp(6.f, -127));
  std::vector<uint16_t> bf(32);
  dequantizeMxfp4Bf16(blocks.data(), scales.data(), 1, 1, bf.data());
  EXPECT_EQ(bf16ToF32(bf[0]), out[0]);
  EXPECT_EQ(bf16ToF32(bf[1]), out[1]);
  scales[0] = 254;
  dequantizeMxfp4(blocks.data(), scales.data(), 1, 1, out.data());
  EXPECT_EQ(out[1], std::ldexp(6.f, 127));
}

TEST(Mxfp4, ShapeValidation) {
  std::vector<std::byte> dummy(4 * 2 * 3 * 16);
  TensorView b{"x_blocks", DType::kU8, {4, 2, 3, 16}, dummy.data(), dummy.size()};
  TensorView s{"x_scales", DType::kU8, {4, 2, 3}, dummy.data(), 24};
  auto ok = checkMxfp4(b, s);
  ASSERT_TRUE(ok.isOk()) << ok.status().toString();
  EXPECT_EQ(ok->prefix, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(ok->groups, 3);
  EXPECT_EQ(ok->rows(), 8);
  TensorView s_bad = s;
  s_bad.shape = {4, 3, 3};
  EXPECT_EQ(checkMxfp4(b, s_bad).status().code(), StatusCode::kInvalidArgument);
  TensorView b_bad = b;
  b_bad.dtype = DType::kBF16;
  auto err = checkMxfp4(b_bad, s);
  EXPECT_EQ(err.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(err.status().message().find("x_blocks"), std::string::npos);
  TensorView b_bad2 = b;
  b_bad2.shape = {4, 2, 3, 8};
  EXPECT_FALSE(checkMxfp4(b_bad2, s).isOk());
}

}  // namespace
}  // namespace garden::rose
