#pragma once
// Reading Hugging Face safetensors checkpoints: one `model.safetensors` file, or shards listed by
// a `*.safetensors.index.json` (`weight_map`: tensor name → shard file). Files are mmap'ed
// read-only; tensors are views into the mapping (no copy), with helpers that convert bf16 / f16 /
// f32 data to float32.
//
// Every header is validated before use (JSON shape, dtype names, shapes vs byte ranges, ranges vs
// file size, overlaps); a malformed file yields INVALID_ARGUMENT / DATA_LOSS naming the file and
// tensor, never a crash. Also holds garden::DType, the element-type enum the rose op interface
// shares.
//
// Threads: a loaded SafetensorsFile / SafetensorsCheckpoint is immutable; any thread may read it.
// The object owns its mappings: views stay valid while it lives.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace garden {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 3, kI64 = 4, kU8 = 5, kI8 = 6 };

size_t dtypeSize(DType d);
std::string_view dtypeName(DType d);  // safetensors spelling: "F32", "F16", "BF16", ...
Result<DType> parseDType(std::string_view safetensors_name);

// Scalar conversions (round-to-nearest-even for float → bf16/f16; NaN stays NaN).
float bf16ToF32(uint16_t v);
uint16_t f32ToBf16(float v);
float f16ToF32(uint16_t v);
uint16_t f32ToF16(float v);

// Converts `count` elements of `src` (F32, F16 or BF16) to float32 into dst.
Status convertToF32(const void* src, DType src_dtype, size_t count, float* dst);

// One tensor inside a mapped file.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // into the mapping
  size_t bytes = 0;

  int64_t numel() const;
  // Copies into a new float32 vector (F32 / F16 / BF16 only).
  Result<std::vector<float>> toF32() const;
};

// One mapped .safetensors file.
class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Parses an in-memory image (tests, fuzzing). The bytes must outlive the object.
  static Result<std::unique_ptr<SafetensorsFile>> fromBytes(std::span<const std::byte> bytes,
                                                            std::string label);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorView* find(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  Status parse(std::span<const std::byte> bytes);

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: model.safetensors, or an index + shards, or (fallback) every
// *.safetensors file in the directory. Tensor names are unique across shards.
class SafetensorsCheckpoint {
 public:
  static Result<std::unique_ptr<SafetensorsCheckpoint>> openDir(const std::string& dir);

  const TensorView* find(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  size_t fileCount() const { return files_.size(); }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*, std::less<>> index_;
};

// Writes a safetensors file (F32 / F16 / BF16 / I32 data, given as raw little-endian bytes).
// Tensors are written in the order given; the header is padded with spaces to 8 bytes. Used by
// rose-mkmodel and tests. Deterministic: same input, same bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};
Status writeSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});
// The same image in memory.
std::vector<std::byte> serializeSafetensors(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace garden
