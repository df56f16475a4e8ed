#include "services/rose/model/mxfp4.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace garden::rose {
namespace {

constexpr float kFp4[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

std::string shapeString(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

template <typename Store>
void dequantize(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t groups,
                Store store) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int exp = static_cast<int>(scales[r * groups + g]) - 127;
      const uint8_t* b = blocks + (r * groups + g) * 16;
      const int64_t base = (r * groups + g) * 32;
      for (int j = 0; j < 16; ++j) {
        store(base + 2 * j, std::ldexp(kFp4[b[j] & 0x0F], exp));
        store(base + 2 * j + 1, std::ldexp(kFp4[b[j] >> 4], exp));
      }
    }
  }
}

}  // namespace

float fp4Value(uint8_t code) { return kFp4[code & 0x0F]; }

void dequantizeMxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t groups,
                     float* out) {
  dequantize(blocks, scales, rows, groups, [out](int64_t i, float v) { out[i] = v; });
}

void dequantizeMxfp4Bf16(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t groups,
                         uint16_t* out) {
  dequantize(blocks, scales, rows, groups, [out](int64_t i, float v) { out[i] = f32ToBf16(v); });
}

int64_t Mxfp4Shape::rows() const {
  int64_t n = 1;
  for (int64_t d : prefix) n *= d;
  return n;
}

Result<Mxfp4Shape> checkMxfp4(const TensorView& blocks, const TensorView& scales) {
  if (blocks.dtype != DType::kU8 || scales.dtype != DType::kU8) {
    return invalidArgument("MXFP4 tensors '" + blocks.name + "' / '" + scales.name +
                           "' must be U8 (got " + std::string(dtypeName(blocks.dtype)) + " / " +
                           std::string(dtypeName(scales.dtype)) + ")");
  }
  const auto& bs = blocks.shape;
  const auto& ss = scales.shape;
  if (bs.size() < 2 || bs.back() != 16 || ss.size() + 1 != bs.size() ||
      !std::equal(ss.begin(), ss.end(), bs.begin())) {
    return invalidArgument("MXFP4 tensors '" + blocks.name + "' " + shapeString(bs) + " and '" +
                           scales.name + "' " + shapeString(ss) +
                           " do not match the layout blocks [..., G, 16] / scales [..., G]");
  }
  Mxfp4Shape s;
  s.prefix.assign(ss.begin(), ss.end() - 1);
  s.groups = ss.back();
  if (s.groups <= 0) return invalidArgument("MXFP4 tensor '" + blocks.name + "' has no groups");
  return s;
}

}  // namespace garden::rose
