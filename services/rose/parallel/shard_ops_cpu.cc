// ShardOps on the CPU backend (host memory, F32), the reference for the sharded model.

#include <cstring>

#include "services/rose/parallel/shard_ops.h"

namespace garden::rose {
namespace {

class CpuShardOps final : public ShardOps {
 public:
  explicit CpuShardOps(Backend& b) : backend_(b) {}

  void embeddingSlice(const Tensor& table, const Tensor& ids, int64_t vocab_begin,
                      const Tensor& out) override {
    sync();
    CHECK(table.dtype == DType::kF32 && out.dtype == DType::kF32 && ids.dtype == DType::kI32);
    const int64_t h = table.cols(), vr = table.rows(), t = ids.numel();
    CHECK(out.rows() == t && out.cols() == h);
    const int32_t* id = ids.as<int32_t>();
    for (int64_t i = 0; i < t; ++i) {
      float* o = out.as<float>() + i * h;
      const int64_t r = static_cast<int64_t>(id[i]) - vocab_begin;
      if (r >= 0 && r < vr) {
        std::memcpy(o, table.as<float>() + r * h, sizeof(float) * static_cast<size_t>(h));
      } else {
        std::memset(o, 0, sizeof(float) * static_cast<size_t>(h));
      }
    }
  }

  void combineRows(const Tensor& in, const Tensor& rows, std::span<const int32_t> host_rows,
                   const Tensor& out) override {
    sync();
    CHECK(in.dtype == DType::kF32 && out.dtype == DType::kF32 && rows.dtype == DType::kI32);
    const int64_t h = out.cols(), p = rows.numel();
    CHECK(static_cast<int64_t>(host_rows.size()) == p);
    CHECK(p == 0 || (in.rows() == p && in.cols() == h));
    if (out.numel() > 0) std::memset(out.data, 0, out.bytes());
    const int32_t* r = rows.as<int32_t>();
    for (int64_t j = 0; j < p; ++j) {
      CHECK(r[j] >= 0 && r[j] < out.rows() && r[j] == host_rows[static_cast<size_t>(j)]);
      float* o = out.as<float>() + static_cast<int64_t>(r[j]) * h;
      const float* s = in.as<float>() + j * h;
      for (int64_t c = 0; c < h; ++c) o[c] += s[c];
    }
  }

  void concatColumns(const Tensor& in, std::span<const int64_t> cols, const Tensor& out) override {
    sync();
    CHECK(in.dtype == out.dtype);
    const size_t es = dtypeSize(out.dtype);
    const int64_t r = out.rows(), width = out.cols();
    int64_t total = 0;
    for (int64_t c : cols) total += c;
    CHECK(total == width && in.numel() == r * width);
    const auto* src = static_cast<const std::byte*>(in.data);
    auto* dst = static_cast<std::byte*>(out.data);
    int64_t col0 = 0;
    for (int64_t c : cols) {
      for (int64_t i = 0; i < r; ++i) {
        std::memcpy(dst + (i * width + col0) * es, src + i * c * es, es * static_cast<size_t>(c));
      }
      src += r * c * es;
      col0 += c;
    }
  }

 private:
  void sync() { (void)backend_.synchronize(); }
  Backend& backend_;
};

}  // namespace

Result<std::unique_ptr<ShardOps>> makeShardOps(Backend& backend) {
  if (backend.name() == "cpu") {
    return std::unique_ptr<ShardOps>(std::make_unique<CpuShardOps>(backend));
  }
#if defined(GARDEN_HAVE_CUDA) && GARDEN_HAVE_CUDA
  if (backend.name() == "cuda") return makeCudaShardOps(backend);
#endif
  return unimplemented("sharded gpt-oss ops are written for the cpu and cuda backends only "
                       "(backend '" + std::string(backend.name()) + "')");
}

}  // namespace garden::rose
