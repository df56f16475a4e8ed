// ShardOps on the CUDA backend (parallel/shard_ops.h): the sharded gpt-oss's vocabulary-slice
// embedding, its expert combine and its logit-column concatenation, on the backend's stream.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "services/rose/ops/cuda/cuda_backend.h"
#include "services/rose/parallel/cuda/shard_kernels.cuh"
#include "services/rose/parallel/shard_ops.h"

namespace garden::rose {
namespace {

using cuda::ShardElem;

// Op contract violations are broken invariants (as llm_ops.h): abort with the reason.
void checkOk(const Status& s, const char* op) {
  if (s.isOk()) return;
  std::string m = std::string("cuda shard ops: ") + op + ": " + s.toString() + "\n";
  std::fwrite(m.data(), 1, m.size(), stderr);
  std::abort();
}
void require(bool cond, const char* op, const char* what) {
  if (!cond) checkOk(internalError(what), op);
}

bool elemOf(DType d, ShardElem* e) {
  switch (d) {
    case DType::kF32:
      *e = ShardElem::kF32;
      return true;
    case DType::kBF16:
      *e = ShardElem::kBF16;
      return true;
    case DType::kF16:
      *e = ShardElem::kF16;
      return true;
    default:
      return false;
  }
}

class CudaShardOps final : public ShardOps {
 public:
  explicit CudaShardOps(cuda::CudaBackend& b) : b_(b) {}

  void embeddingSlice(const Tensor& table, const Tensor& ids, int64_t vocab_begin,
                      const Tensor& out) override {
    ShardElem te{}, oe{};
    require(elemOf(table.dtype, &te) && elemOf(out.dtype, &oe) && ids.dtype == DType::kI32,
            "embeddingSlice", "table and out F32/BF16/F16, ids I32");
    const int64_t h = table.cols(), t = ids.numel();
    require(out.rows() == t && out.cols() == h, "embeddingSlice", "shape mismatch");
    checkOk(cuda::launchEmbeddingSlice(table.data, te, table.rows(), ids.as<int32_t>(), t,
                                       vocab_begin, h, out.data, oe, b_.stream()),
            "embeddingSlice");
  }

  // The sum's plan (which pairs feed which row, in pair order) is a stable counting sort of
  // host_rows, uploaded with the step's other host-made indices; the kernel then adds each row's
  // pairs in that order in f32 — for F32 the CPU reference's exact sequence of additions.
  void combineRows(const Tensor& in, const Tensor& rows, std::span<const int32_t> host_rows,
                   const Tensor& out) override {
    ShardElem e{};
    require(elemOf(out.dtype, &e) && in.dtype == out.dtype && rows.dtype == DType::kI32,
            "combineRows", "in and out the same F32/BF16/F16, rows I32");
    const int64_t r = out.rows(), h = out.cols(), p = rows.numel();
    require(static_cast<int64_t>(host_rows.size()) == p, "combineRows",
            "host_rows must hold the P row ids");
    require(p == 0 || (in.rows() == p && in.cols() == h), "combineRows", "shape mismatch");
    if (r == 0) return;
    plan_.assign(static_cast<size_t>(r + 1 + p), 0);
    int32_t* offsets = plan_.data();
    int32_t* order = plan_.data() + r + 1;
    for (int32_t row : host_rows) {
      require(row >= 0 && row < r, "combineRows", "row id outside [0, R)");
      ++offsets[row + 1];
    }
    for (int64_t i = 0; i < r; ++i) offsets[i + 1] += offsets[i];
    fill_.assign(offsets, offsets + r);
    for (int64_t j = 0; j < p; ++j) {
      order[fill_[static_cast<size_t>(host_rows[static_cast<size_t>(j)])]++] =
          static_cast<int32_t>(j);
    }
    const int64_t n = r + 1 + p;
    if (workspace_.view.numel() < n) {
      // Growing: nothing enqueued may still read the old plan.
      checkOk(b_.synchronize(), "combineRows");
      const int64_t grown = std::max<int64_t>(n, 2 * workspace_.view.numel());
      workspace_ = {};
      auto ws = b_.allocateTensor(DType::kI32, {grown});
      checkOk(ws.status(), "combineRows");
      workspace_ = std::move(ws).value();
    }
    const Tensor dev(workspace_.view.data, DType::kI32, {n});
    b_.copyToDevice(dev, plan_.data(), sizeof(int32_t) * static_cast<size_t>(n));
    const int32_t* d = dev.as<int32_t>();
    checkOk(cuda::launchCombineRows(in.data, d, d + r + 1, r, h, out.data, e, b_.stream()),
            "combineRows");
  }

  void concatColumns(const Tensor& in, std::span<const int64_t> cols, const Tensor& out) override {
    require(in.dtype == out.dtype, "concatColumns", "in and out of one dtype");
    const size_t es = dtypeSize(out.dtype);
    const int64_t r = out.rows(), width = out.cols();
    int64_t total = 0;
    for (int64_t c : cols) total += c;
    require(total == width && in.numel() == r * width, "concatColumns", "shape mismatch");
    const auto* src = static_cast<const char*>(in.data);
    auto* dst = static_cast<char*>(out.data);
    int64_t col0 = 0;
    for (int64_t c : cols) {
      if (c > 0 && r > 0) {
        const cudaError_t err =
            cudaMemcpy2DAsync(dst + col0 * es, static_cast<size_t>(width) * es, src,
                              static_cast<size_t>(c) * es, static_cast<size_t>(c) * es,
                              static_cast<size_t>(r), cudaMemcpyDeviceToDevice, b_.stream());
        if (err != cudaSuccess) checkOk(internalError(cudaGetErrorString(err)), "concatColumns");
      }
      src += r * c * static_cast<int64_t>(es);
      col0 += c;
    }
  }

 private:
  cuda::CudaBackend& b_;
  std::vector<int32_t> plan_, fill_;
  OwnedTensor workspace_;  // the uploaded combine plan
};

}  // namespace

Result<std::unique_ptr<ShardOps>> makeCudaShardOps(Backend& backend) {
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&backend);
  if (cb == nullptr) {
    return invalidArgument("cuda shard ops need the cuda backend (got '" +
                           std::string(backend.name()) + "')");
  }
  return std::unique_ptr<ShardOps>(std::make_unique<CudaShardOps>(*cb));
}

}  // namespace garden::rose
