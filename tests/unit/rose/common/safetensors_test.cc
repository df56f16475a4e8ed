// common/safetensors: round trips through the writer, bf16/f16/f32 conversion against exact
// values, sharded checkpoints with an index, and malformed files that must give clear errors.

#include "common/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace garden {
namespace {

namespace fs = std::filesystem;

template <typename T>
std::vector<std::byte> bytesOf(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

struct TempDir {
  fs::path path;
  TempDir() {
    char t[] = "/tmp/st_test_XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void writeRaw(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// A file image with the given header JSON and data bytes.
std::string image(const std::string& header, size_t data_bytes, size_t pad_to = 0) {
  std::string h = header;
  while (pad_to && h.size() % pad_to) h += ' ';
  std::string out(8, '\0');
  uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  return out + h + std::string(data_bytes, '\x01');
}

Status parseImage(const std::string& img) {
  auto f = SafetensorsFile::fromBytes(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(img.data()), img.size()), "t");
  return f.status();
}

TEST(Safetensors, WriteThenReadRoundTrip) {
  TempDir d;
  std::vector<float> a = {1.f, -2.f, 3.5f, 0.f, 1e-8f, -7.25f};
  std::vector<uint16_t> b = {f32ToBf16(1.5f), f32ToBf16(-0.75f)};
  std::vector<int32_t> c = {7, -8, 9};
  ASSERT_TRUE(writeSafetensors((d.path / "x.safetensors").string(),
                               {{"a", DType::kF32, {2, 3}, bytesOf(a)},
                                {"b.weight", DType::kBF16, {2}, bytesOf(b)},
                                {"c", DType::kI32, {3}, bytesOf(c)}},
                               {{"format", "pt"}})
                  .isOk());
  auto f = SafetensorsFile::open((d.path / "x.safetensors").string());
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  EXPECT_EQ((*f)->tensors().size(), 3u);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  const TensorView* ta = (*f)->find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, DType::kF32);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->numel(), 6);
  EXPECT_EQ(*ta->toF32(), a);
  const TensorView* tb = (*f)->find("b.weight");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(*tb->toF32(), (std::vector<float>{1.5f, -0.75f}));
  const TensorView* tc = (*f)->find("c");
  ASSERT_NE(tc, nullptr);
  EXPECT_EQ(std::memcmp(tc->data, c.data(), 12), 0);
  EXPECT_FALSE(tc->toF32().isOk());  // I32 is not a float type
  EXPECT_EQ((*f)->find("missing"), nullptr);
  // Header is 8-byte aligned so data is too.
  uint64_t n;
  std::ifstream in(d.path / "x.safetensors", std::ios::binary);
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, SerializationIsDeterministic) {
  std::vector<float> a = {1, 2, 3};
  auto x = serializeSafetensors({{"a", DType::kF32, {3}, bytesOf(a)}});
  auto y = serializeSafetensors({{"a", DType::kF32, {3}, bytesOf(a)}});
  EXPECT_EQ(x, y);
}

TEST(Safetensors, Bf16AndF16Conversions) {
  // Exact values.
  EXPECT_EQ(bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(bf16ToF32(0xc040), -3.0f);
  EXPECT_EQ(f16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(f16ToF32(0xc000), -2.0f);
  EXPECT_EQ(f16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(f16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16ToF32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(f16ToF32(0x7c00)));
  EXPECT_TRUE(std::isnan(f16ToF32(0x7e00)));
  EXPECT_TRUE(std::isnan(bf16ToF32(f32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  // Round to nearest even.
  EXPECT_EQ(f32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie → even (down)
  EXPECT_EQ(f32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie → even (up)
  EXPECT_EQ(f32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32ToF16(65520.0f), 0x7c00);               // rounds to inf
  EXPECT_EQ(f32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 1 subnormal → 0
  EXPECT_EQ(f32ToF16(std::ldexp(1.5f, -25)), 0x0001);
  // Every f16 value survives f16 → f32 → f16; every bf16 value survives bf16 → f32 → bf16.
  for (uint32_t v = 0; v < 65536; ++v) {
    const uint16_t h = static_cast<uint16_t>(v);
    const float f = f16ToF32(h);
    if (!std::isnan(f)) {
      ASSERT_EQ(f32ToF16(f), h) << std::hex << v;
    }
    const float g = bf16ToF32(h);
    if (!std::isnan(g)) {
      ASSERT_EQ(f32ToBf16(g), h) << std::hex << v;
    }
  }
  // Random floats: the conversion is the nearest representable value.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-100.f, 100.f);
  for (int i = 0; i < 10000; ++i) {
    const float x = dist(rng);
    const float hb = bf16ToF32(f32ToBf16(x));
    EXPECT_LE(std::fabs(hb - x), std::fabs(x) * std::ldexp(1.0f, -8) * 1.0001f);
    const float hf = f16ToF32(f32ToF16(x));
    EXPECT_LE(std::fabs(hf - x), std::fabs(x) * std::ldexp(1.0f, -11) * 1.0001f + 1e-7f);
  }
  std::vector<uint16_t> src = {f32ToF16(0.5f), f32ToF16(-4.0f)};
  std::vector<float> dst(2);
  ASSERT_TRUE(convertToF32(src.data(), DType::kF16, 2, dst.data()).isOk());
  EXPECT_EQ(dst, (std::vector<float>{0.5f, -4.0f}));
  EXPECT_FALSE(convertToF32(src.data(), DType::kI32, 1, dst.data()).isOk());
}

TEST(Safetensors, ShardedCheckpointWithIndex) {
  TempDir d;
  std::vector<float> a = {1, 2}, b = {3, 4, 5};
  ASSERT_TRUE(writeSafetensors((d.path / "model-00001-of-00002.safetensors").string(),
                               {{"model.a", DType::kF32, {2}, bytesOf(a)}})
                  .isOk());
  ASSERT_TRUE(writeSafetensors((d.path / "model-00002-of-00002.safetensors").string(),
                               {{"model.b", DType::kF32, {3}, bytesOf(b)}})
                  .isOk());
  writeRaw(
      d.path / "model.safetensors.index.json",
      R"({"metadata":{"total_size":20},"weight_map":{"model.a":"model-00001-of-00002.safetensors",)"
      R"("model.b":"model-00002-of-00002.safetensors"}})");
  auto ck = SafetensorsCheckpoint::openDir(d.path.string());
  ASSERT_TRUE(ck.isOk()) << ck.status().toString();
  EXPECT_EQ((*ck)->fileCount(), 2u);
  EXPECT_EQ((*ck)->names(), (std::vector<std::string>{"model.a", "model.b"}));
  EXPECT_EQ(*(*ck)->find("model.b")->toF32(), b);

  // An index naming a tensor its shard does not hold.
  writeRaw(
      d.path / "model.safetensors.index.json",
      R"({"weight_map":{"model.a":"model-00002-of-00002.safetensors","model.b":"model-00002-of-00002.safetensors"}})");
  auto bad = SafetensorsCheckpoint::openDir(d.path.string());
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("model.a"), std::string::npos) << bad.status().message();

  // An index naming a missing shard.
  writeRaw(d.path / "model.safetensors.index.json",
           R"({"weight_map":{"model.a":"model-00009-of-00009.safetensors"}})");
  bad = SafetensorsCheckpoint::openDir(d.path.string());
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("model-00009"), std::string::npos);

  // A shard path escaping the directory.
  writeRaw(d.path / "model.safetensors.index.json",
           R"({"weight_map":{"model.a":"../x.safetensors"}})");
  bad = SafetensorsCheckpoint::openDir(d.path.string());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);

  writeRaw(d.path / "model.safetensors.index.json", R"({"weight_map": 3})");
  bad = SafetensorsCheckpoint::openDir(d.path.string());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("weight_map"), std::string::npos);
}

TEST(Safetensors, DirectoryWithoutIndexUsesEveryFileAndRejectsDuplicates) {
  TempDir d;
  std::vector<float> a = {1};
  EXPECT_EQ(SafetensorsCheckpoint::openDir(d.path.string()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(SafetensorsCheckpoint::openDir((d.path / "nope").string()).status().code(),
            StatusCode::kNotFound);
  ASSERT_TRUE(
      writeSafetensors((d.path / "a.safetensors").string(), {{"x", DType::kF32, {1}, bytesOf(a)}})
          .isOk());
  ASSERT_TRUE(
      writeSafetensors((d.path / "b.safetensors").string(), {{"y", DType::kF32, {1}, bytesOf(a)}})
          .isOk());
  auto ck = SafetensorsCheckpoint::openDir(d.path.string());
  ASSERT_TRUE(ck.isOk());
  EXPECT_EQ((*ck)->names().size(), 2u);
  ASSERT_TRUE(
      writeSafetensors((d.path / "c.safetensors").string(), {{"x", DType::kF32, {1}, bytesOf(a)}})
          .isOk());
  auto dup = SafetensorsCheckpoint::openDir(d.path.string());
  ASSERT_FALSE(dup.isOk());
  EXPECT_NE(dup.status().message().find("'x'"), std::string::npos);
}

TEST(Safetensors, MalformedFilesGiveClearErrors) {
  struct Case {
    const char* what;
    std::string img;
    const char* needle;
  };
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::vector<Case> cases = {
      {"too short", std::string(5, '\0'), "too short"},
      {"header length past the end",
       [] {
         std::string s(8, '\0');
         uint64_t n = 1000;
         std::memcpy(s.data(), &n, 8);
         return s + "{}";
       }(),
       "past the end"},
      {"huge header length",
       [] {
         std::string s(8, '\0');
         uint64_t n = ~uint64_t{0};
         std::memcpy(s.data(), &n, 8);
         return s;
       }(),
       "exceeds"},
      {"not JSON", image("{not json", 0), "not valid JSON"},
      {"not an object", image("[1,2]", 0), "not a JSON object"},
      {"entry not an object", image(R"({"t":3})", 0), "'t'"},
      {"unknown dtype", image(R"({"t":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1), "F8"},
      {"missing shape", image(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", 4), "shape"},
      {"negative shape", image(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       "shape"},
      {"offsets count", image(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4),
       "two entries"},
      {"offsets reversed", image(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4),
       "begin > end"},
      {"past the data", image("{" + ok_entry + "}", 4), "beyond the data"},
      {"size mismatch", image(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "need 12 bytes"},
      {"shape overflow",
       image(
           R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})",
           8),
       "overflow"},
      {"overlap",
       image(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           12),
       "overlap"},
      {"metadata not strings", image(R"({"__metadata__":{"k":1}})", 0), "__metadata__"},
  };
  for (const Case& c : cases) {
    Status st = parseImage(c.img);
    EXPECT_FALSE(st.isOk()) << c.what;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << c.what << ": " << st.message();
  }
  // The good one parses.
  EXPECT_TRUE(parseImage(image("{" + ok_entry + "}", 8)).isOk());
  // Random garbage never crashes.
  std::mt19937 rng(3);
  for (int i = 0; i < 2000; ++i) {
    std::string img = image("{" + ok_entry + "}", 8);
    for (int k = 0; k < 3; ++k) img[rng() % img.size()] = static_cast<char>(rng());
    (void)parseImage(img);
  }
}

TEST(Safetensors, OpenMissingFileIsNotFound) {
  auto f = SafetensorsFile::open("/nonexistent/x.safetensors");
  ASSERT_FALSE(f.isOk());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("/nonexistent/x.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace garden
