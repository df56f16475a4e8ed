#include "services/rose/ops/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/logging.h"
#include "services/rose/ops/cuda/attention.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/paged_attention_sm90.cuh"
#include "services/rose/ops/cuda/embedding.cuh"
#include "services/rose/ops/cuda/fp8_block.h"
#include "services/rose/ops/cuda/fp8_dense.cuh"
#include "services/rose/ops/cuda/fp8_gemm.h"
#include "services/rose/ops/cuda/gemm_wg.cuh"
#include "services/rose/ops/cuda/kv_block_copy.cuh"
#include "services/rose/ops/cuda/moe_lt_gemm.h"
#include "services/rose/ops/cuda/moe_router_f32.cuh"
#include "services/rose/ops/cuda/pool.cuh"
#include "services/rose/ops/cuda/qk_norm_rope.cuh"
#include "services/rose/ops/cuda/rms_norm.cuh"
#include "services/rose/ops/cuda/swiglu.cuh"

namespace garden::rose {

Result<std::unique_ptr<Backend>> makeCudaBackend(const BackendOptions& opts) {
  ASSIGN_OR_RETURN(auto b, cuda::CudaBackend::create(opts));
  // Process-global, like the other gpt-oss kernel knobs (one backend per process).
  cuda::setPagedAttnSm90(opts.cuda.paged_attention_sm90_min_tokens, true);
  cuda::applyMoePrefill(opts.cuda.moe_prefill, opts.cuda.moe_prefill_min_rows_per_expert);
  cuda::applyMoeLt(opts.cuda);
  cuda::setRouterMma(opts.cuda.router_mma);  // [TAG_ROUTER_MMA]
  return std::unique_ptr<Backend>(std::move(b));
}

Result<int32_t> cudaDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count <= 0) {
    return unavailable(std::string("no CUDA device: ") + cudaGetErrorString(err));
  }
  return static_cast<int32_t>(count);
}

namespace cuda {
namespace {

constexpr size_t kStagingBytes = size_t{16} << 20;

// Op contract violations are broken invariants (backend.h): abort with the reason.
void checkOk(const Status& s, const char* op) {
  if (s.isOk()) return;
  std::string m = std::string("cuda backend: ") + op + ": " + s.toString() + "\n";
  std::fwrite(m.data(), 1, m.size(), stderr);
  std::abort();
}

void require(bool cond, const char* op, const char* what) {
  if (!cond) checkOk(internalError(what), op);
}

using bf16 = __nv_bfloat16;

bool is(const Tensor& t, DType d) { return !t.empty() && t.dtype == d; }

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(cudaEvent_t e) : e_(e) {}
  ~CudaEvent() override { cudaEventDestroy(e_); }
  bool query() override { return cudaEventQuery(e_) != cudaErrorNotReady; }
  Status wait() override {
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e_));
    return okStatus();
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_;
};

}  // namespace

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const BackendOptions& opts) {
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (opts.device_index < 0 || opts.device_index >= count) {
    return invalidArgument("cuda backend: device_index " + std::to_string(opts.device_index) +
                           " out of range (" + std::to_string(count) + " devices)");
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend(opts.device_index, opts.cuda));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(b->device_));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));
  ASSIGN_OR_RETURN(
      b->gemm_, GemmRunner::create(size_t{32} << 20, opts.cuda.gemm_tune, opts.cuda.gemm_smallm));
  b->gemm_->setTuneChain(opts.cuda.gemm_tune_chain);  // [TAG_GEMM_TUNE_CHAIN]
  if (opts.cuda.gemm_wg > 0) {  // [TAG_GEMM_WG]
    if (wgGemmAvailable()) {
      RETURN_IF_ERROR(b->gemm_->setWgGemm(true, opts.cuda.gemm_wg == 2));
    } else {
      log::warn("GARDEN_GEMM_WG: the Hopper GEMM needs an sm_90 device; not used");
    }
  }
  b->graphs_ = std::make_unique<GraphCache>(b->stream_);
  CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(reinterpret_cast<void**>(&b->staging_), kStagingBytes, cudaHostAllocDefault));
  b->staging_bytes_ = kStagingBytes;
  return b;
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (kv_pairs_ != nullptr) cudaFree(kv_pairs_);
  graphs_.reset();
  gemm_.reset();
  for (auto& s : staged_) cudaEventDestroy(s.done);
  for (auto e : free_events_) cudaEventDestroy(e);
  if (staging_ != nullptr) cudaFreeHost(staging_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Result<Buffer> CudaBackend::allocate(size_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return resourceExhausted("cuda backend: cannot allocate " + std::to_string(bytes) +
                             " bytes of device memory: " + cudaGetErrorString(e));
  }
  return Buffer(this, p, bytes);
}

void CudaBackend::release(void* data, size_t /*bytes*/) { cudaFree(data); }

Status CudaBackend::uploadConvert(const Tensor& dst, const HostView& src) {
  if (dst.empty()) return invalidArgument("uploadConvert: empty destination");
  if (dst.numel() != src.numel) {
    return invalidArgument("uploadConvert: destination has " + std::to_string(dst.numel()) +
                           " elements, source " + std::to_string(src.numel));
  }
  const size_t n = static_cast<size_t>(src.numel);
  std::vector<uint16_t> tmp16;
  std::vector<float> tmp32;
  const void* host = src.data;
  if (dst.dtype == DType::kBF16 || dst.dtype == DType::kF16) {
    // [TAG_ATTN_F16] F16 too (bf16 -> fp16: exact in fp16's range).
    if (src.dtype != dst.dtype) {
      tmp32.resize(n);
      RETURN_IF_ERROR(convertToF32(src.data, src.dtype, n, tmp32.data()));
      tmp16.resize(n);
      const bool bf = dst.dtype == DType::kBF16;
      for (size_t i = 0; i < n; ++i) tmp16[i] = bf ? f32ToBf16(tmp32[i]) : f32ToF16(tmp32[i]);
      host = tmp16.data();
    }
  } else if (dst.dtype == DType::kF32) {
    if (src.dtype != DType::kF32) {
      tmp32.resize(n);
      RETURN_IF_ERROR(convertToF32(src.data, src.dtype, n, tmp32.data()));
      host = tmp32.data();
    }
  } else if (dst.dtype == DType::kI32) {
    if (src.dtype != DType::kI32)
      return invalidArgument("uploadConvert: I32 destination needs I32 source");
  } else {
    return invalidArgument("uploadConvert: unsupported destination dtype " +
                           std::string(dtypeName(dst.dtype)));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyHostToDevice, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return okStatus();
}

Result<uint64_t> CudaBackend::deviceMemoryFree() {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  size_t free_b = 0, total_b = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<uint64_t>(free_b);
}

Status CudaBackend::registerHostMemory(void* ptr, size_t bytes) {
  CUDA_RETURN_IF_ERROR(cudaHostRegister(ptr, bytes, cudaHostRegisterDefault));
  return okStatus();
}

void CudaBackend::unregisterHostMemory(void* ptr) { cudaHostUnregister(ptr); }

// ---- peer memory and the KV block copy [TAG_KV_PULL_CUDA] ----

Result<PeerMemoryHandle> CudaBackend::exportPeerMemory(const void* base) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  cudaIpcMemHandle_t h;
  CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&h, const_cast<void*>(base)));
  static_assert(sizeof(h) <= sizeof(PeerMemoryHandle::bytes));
  PeerMemoryHandle out;
  std::memcpy(out.bytes.data(), &h, sizeof(h));
  return out;
}

Result<void*> CudaBackend::openPeerMemory(const PeerMemoryHandle& handle) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.bytes.data(), sizeof(h));
  void* p = nullptr;
  // Another GPU's memory is reached over NVLink/PCIe once peer access is on (lazily).
  CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  return p;
}

void CudaBackend::closePeerMemory(void* mapped) {
  if (mapped != nullptr) (void)cudaIpcCloseMemHandle(mapped);
}

Status CudaBackend::copyKvBlocks(const KvBlockCopy& c) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const size_t entries = c.pairs.size() + c.window_pairs.size();
  if (c.pairs.size() % 2 != 0 || c.window_pairs.size() % 2 != 0) {
    return invalidArgument("kv block copy: pairs must be (src, dst) pairs");
  }
  if (entries == 0) return okStatus();
  const size_t bytes = entries * sizeof(int32_t);
  if (bytes > kv_pairs_bytes_) {
    // Rare (the longest handoff so far grows it): the old buffer may still be read.
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    if (kv_pairs_ != nullptr) CUDA_RETURN_IF_ERROR(cudaFree(kv_pairs_));
    kv_pairs_ = nullptr;
    kv_pairs_bytes_ = 0;
    const size_t want = std::max<size_t>(bytes, 64 << 10);
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&kv_pairs_), want));
    kv_pairs_bytes_ = want;
  }
  if (bytes > staging_bytes_ / 2) {
    std::vector<int32_t> all(c.pairs.begin(), c.pairs.end());
    all.insert(all.end(), c.window_pairs.begin(), c.window_pairs.end());
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(kv_pairs_, all.data(), bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  } else {
    char* st = stage(bytes);
    std::memcpy(st, c.pairs.data(), c.pairs.size() * sizeof(int32_t));
    std::memcpy(st + c.pairs.size() * sizeof(int32_t), c.window_pairs.data(),
                c.window_pairs.size() * sizeof(int32_t));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(kv_pairs_, st, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_.back().done, stream_));
  }
  KvCopyGeometry g;
  g.layers = c.layers;
  g.window_layers = c.window_layers;
  g.src_blocks = c.src_blocks;
  g.src_blocks_window = c.src_blocks_window;
  g.dst_blocks = c.dst_blocks;
  g.dst_blocks_window = c.dst_blocks_window;
  g.block_bytes = c.block_bytes;
  const auto n = static_cast<int32_t>(c.pairs.size() / 2);
  const auto nw = static_cast<int32_t>(c.window_pairs.size() / 2);
  CUDA_RETURN_IF_ERROR(launchKvBlockCopy(
      static_cast<const char*>(c.src_k), static_cast<const char*>(c.src_v),
      static_cast<char*>(c.dst_k), static_cast<char*>(c.dst_v), g, kv_pairs_, n,
      nw > 0 ? kv_pairs_ + c.pairs.size() : nullptr, nw, stream_));
  return okStatus();
}

void CudaBackend::launch(std::function<void()> work) {
  CUDA_CHECK(cudaSetDevice(device_));
  work();
}

Result<std::unique_ptr<Event>> CudaBackend::createEvent() {
  cudaEvent_t e = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return std::unique_ptr<Event>(new CudaEvent(e));
}

Status CudaBackend::recordEvent(Event& event) {
  auto* ce = dynamic_cast<CudaEvent*>(&event);
  if (ce == nullptr) return invalidArgument("recordEvent: not an event of the cuda backend");
  CUDA_RETURN_IF_ERROR(cudaEventRecord(ce->get(), stream_));
  return okStatus();
}

Status CudaBackend::synchronize() {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return okStatus();
}

char* CudaBackend::stage(size_t bytes) {
  const size_t need = (bytes + 255) / 256 * 256;
  size_t begin = staging_cursor_;
  if (begin + need > staging_bytes_) begin = 0;
  const size_t end = begin + need;
  // Copies complete in stream order: waiting for the newest overlapping one frees all older.
  int last = -1;
  for (size_t i = 0; i < staged_.size(); ++i) {
    if (staged_[i].begin < end && begin < staged_[i].end) last = static_cast<int>(i);
  }
  for (int i = 0; i <= last; ++i) {
    Staged s = staged_.front();
    staged_.pop_front();
    if (i == last) CUDA_CHECK(cudaEventSynchronize(s.done));
    free_events_.push_back(s.done);
  }
  staging_cursor_ = end;
  Staged s;
  s.begin = begin;
  s.end = end;
  if (free_events_.empty()) {
    CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  } else {
    s.done = free_events_.back();
    free_events_.pop_back();
  }
  staged_.push_back(s);
  return staging_ + begin;
}

void CudaBackend::copyToDevice(const Tensor& dst, const void* src, size_t bytes) {
  require(bytes <= dst.bytes(), "copyToDevice", "more bytes than the destination view holds");
  if (bytes == 0) return;
  if (bytes > staging_bytes_ / 2) {
    // Rare (load-time sized) copy: synchronous from pageable memory.
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  char* st = stage(bytes);
  std::memcpy(st, src, bytes);
  CUDA_CHECK(cudaMemcpyAsync(dst.data, st, bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaEventRecord(staged_.back().done, stream_));
}

void CudaBackend::copyToHost(void* dst, const Tensor& src, size_t bytes) {
  require(bytes <= src.bytes(), "copyToHost", "more bytes than the source view holds");
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src.data, bytes, cudaMemcpyDeviceToHost, stream_));
}

void CudaBackend::embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  require(is(table, DType::kBF16) && is(ids, DType::kI32) && is(out, DType::kBF16), "embedding",
          "dtypes must be table BF16, ids I32, out BF16");
  require(out.rows() == ids.numel() && out.cols() == table.cols(), "embedding", "shape mismatch");
  EmbeddingArgs a;
  a.table = table.as<bf16>();
  a.ids = ids.as<int32_t>();
  a.out = out.as<bf16>();
  a.num_tokens = ids.numel();
  a.hidden = table.cols();
  a.vocab = table.rows();
  checkOk(launchEmbedding(a, stream_), "embedding");
}

void CudaBackend::rmsNorm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                          const Tensor& out, const RmsNormParams& p) {
  // [TAG_ATTN_F16] x and out may be F16 (gpt-oss's fp16 attention block); an F16 x only with
  // the F32 residual stream.
  require((is(x, DType::kBF16) || is(x, DType::kF16) || is(x, DType::kF32)) &&
              is(weight, DType::kBF16) && (is(out, DType::kBF16) || is(out, DType::kF16)),
          "rmsNorm", "dtypes must be BF16 (x: BF16, F16 or F32; out: BF16 or F16)");
  require(x.dtype == DType::kBF16 || (!residual.empty() && residual.dtype == DType::kF32),
          "rmsNorm", "an F16 or F32 x needs the F32 residual");
  require(residual.empty() || residual.dtype == DType::kBF16 || residual.dtype == DType::kF32,
          "rmsNorm", "residual must be BF16 or F32");
  require(out.rows() == x.rows() && out.cols() == x.cols() && weight.numel() == x.cols(), "rmsNorm",
          "shape mismatch");
  require(residual.empty() || (residual.rows() == x.rows() && residual.cols() == x.cols()),
          "rmsNorm", "residual shape mismatch");
  RmsNormArgs a;
  a.x = static_cast<const bf16*>(x.data);
  a.x_f16 = x.dtype == DType::kF16;
  a.x_f32 = x.dtype == DType::kF32;
  a.out_f16 = out.dtype == DType::kF16;
  const bool f32_res = !residual.empty() && residual.dtype == DType::kF32;
  a.residual = residual.empty() || f32_res ? nullptr : residual.as<bf16>();
  a.residual_f32 = f32_res ? residual.as<float>() : nullptr;
  a.residual_init = p.residual_init;
  a.round_normalized = p.round_normalized;
  a.weight = weight.as<bf16>();
  a.out = static_cast<bf16*>(out.data);
  a.rows = x.rows();
  a.hidden = x.cols();
  a.eps = p.eps;
  a.pdl_graph = kernels_.pdl_graph && p.programmatic_in_graphs;  // [TAG_PDL_GRAPH]
  checkOk(launchRmsNorm(a, stream_, kernels_.pdl), "rmsNorm");
}

// ---- [TAG_EMBED_FP8] ----
namespace {
// An activation Fp8Matrix of rows x cols: U8 codes [rows, cols], F32 scales [cols/128, rows].
bool fp8Activation(const Fp8Matrix& m, int64_t rows, int64_t cols) {
  return is(m.codes, DType::kU8) && is(m.scales, DType::kF32) && m.codes.rows() == rows &&
         m.codes.cols() == cols && cols % kFp8Block == 0 && m.scales.numel() == cols / kFp8Block * rows;
}
}  // namespace

void CudaBackend::quantizeFp8Weight(const Tensor& w, const Fp8Matrix& out) {
  require(is(w, DType::kBF16) && is(out.codes, DType::kU8) && is(out.scales, DType::kF32),
          "quantizeFp8Weight", "w BF16, codes U8, scales F32");
  require(out.codes.rows() == w.rows() && out.codes.cols() == w.cols() && w.cols() % kFp8Block == 0 &&
              out.scales.numel() == fp8WeightScalesPerExpert(w.rows(), w.cols()),
          "quantizeFp8Weight", "shape mismatch (K a multiple of 128)");
  Fp8WeightQuantArgs a;
  a.w = w.as<bf16>();
  a.codes = out.codes.as<uint8_t>();
  a.scales = out.scales.as<float>();
  a.n = w.rows();
  a.k = w.cols();
  checkOk(launchFp8WeightQuant(a, stream_), "quantizeFp8Weight");
}

void CudaBackend::quantizeFp8(const Tensor& x, const Fp8Matrix& out) {
  require(is(x, DType::kBF16) && fp8Activation(out, x.rows(), x.cols()), "quantizeFp8",
          "x BF16 [M, K], codes U8 [M, K], scales F32 [K/128, M] (K a multiple of 128)");
  Fp8RowQuantArgs a;
  a.x = x.as<bf16>();
  a.codes = out.codes.as<uint8_t>();
  a.scales = out.scales.as<float>();
  a.rows = x.rows();
  a.k = x.cols();
  checkOk(launchFp8RowQuant(a, stream_, kernels_.pdl), "quantizeFp8");
}

void CudaBackend::rmsNormFp8(const Tensor& x, const Tensor& residual, const Tensor& weight,
                             const Fp8Matrix& out, const RmsNormParams& p) {
  require(is(x, DType::kBF16) && is(weight, DType::kBF16) &&
              (residual.empty() || residual.dtype == DType::kBF16),
          "rmsNormFp8", "x, weight and the residual must be BF16");
  require(weight.numel() == x.cols() && fp8Activation(out, x.rows(), x.cols()) &&
              (residual.empty() || (residual.rows() == x.rows() && residual.cols() == x.cols())),
          "rmsNormFp8", "shape mismatch");
  RmsNormArgs a;
  a.x = x.as<bf16>();
  a.residual = residual.empty() ? nullptr : residual.as<bf16>();
  a.residual_init = p.residual_init;
  a.round_normalized = p.round_normalized;
  a.weight = weight.as<bf16>();
  a.out_fp8 = out.codes.as<uint8_t>();
  a.out_scales = out.scales.as<float>();
  a.rows = x.rows();
  a.hidden = x.cols();
  a.eps = p.eps;
  a.pdl_graph = kernels_.pdl_graph && p.programmatic_in_graphs;
  checkOk(launchRmsNorm(a, stream_, kernels_.pdl), "rmsNormFp8");
}

void CudaBackend::swigluFp8(const Tensor& gate_up, const Fp8Matrix& out) {
  require(is(gate_up, DType::kBF16) && gate_up.cols() % 2 == 0 &&
              fp8Activation(out, gate_up.rows(), gate_up.cols() / 2),
          "swigluFp8", "gate_up BF16 [T, 2I], out codes U8 [T, I] + scales F32 [I/128, T]");
  SwigluArgs a;
  a.gate_up = gate_up.as<bf16>();
  a.out_fp8 = out.codes.as<uint8_t>();
  a.out_scales = out.scales.as<float>();
  a.num_tokens = gate_up.rows();
  a.inter = gate_up.cols() / 2;
  checkOk(launchSwiglu(a, stream_, kernels_.pdl), "swigluFp8");
}

void CudaBackend::linearFp8(const Fp8Matrix& x, const Fp8Matrix& w, const Tensor& y) {
  const int64_t m = x.codes.rows(), n = w.codes.rows(), k = w.codes.cols();
  require(fp8Activation(x, m, k) && is(w.codes, DType::kU8) && is(w.scales, DType::kF32) &&
              w.scales.numel() == fp8WeightScalesPerExpert(n, k) && is(y, DType::kBF16) &&
              y.rows() == m && y.cols() == n,
          "linearFp8", "x [M, K] and w [N, K] FP8 with their scales, y BF16 [M, N]");
  require(m % 4 == 0 && n % 4 == 0, "linearFp8", "M and N must be multiples of 4");
  if (m == 0) return;
  if (!fp8_gemm_) {
    auto g = Fp8Gemm::create();
    checkOk(g.status(), "linearFp8");
    fp8_gemm_ = std::move(*g);
  }
  Fp8GemmArgs a;
  a.x = x.codes.as<uint8_t>();
  a.x_scales = x.scales.as<float>();
  a.w = w.codes.as<uint8_t>();
  a.w_scales = w.scales.as<float>();
  a.y = y.as<bf16>();
  a.m = m;
  a.n = n;
  a.k = k;
  checkOk(fp8_gemm_->run(a, stream_), "linearFp8");
}

void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
  // bf16, or every 16-bit operand fp16 [TAG_ATTN_F16]; y may be F32: logits (no bias), or with
  // fp16 operands an F32 bias too (gpt-oss's projections kept in f32 [TAG_PROJ_F32]).
  const bool f16 = is(w, DType::kF16);
  const DType t16 = f16 ? DType::kF16 : DType::kBF16;
  require(is(x, t16) && is(w, t16) && (is(y, t16) || is(y, DType::kF32)), "linear",
          "x and w must be BF16 (or both F16), y their dtype or F32");
  require(x.cols() == w.cols() && y.rows() == x.rows() && y.cols() == w.rows(), "linear",
          "shape mismatch");
  if (y.dtype == DType::kF32) {
    require(bias.empty() || (f16 && bias.dtype == DType::kF32 && bias.numel() == w.rows()),
            "linear", "an F32 output takes no bias, or with F16 operands an F32 bias [N]");
    checkOk(f16 ? gemm_->runF16F32(x.data, w.data, bias.empty() ? nullptr : bias.as<float>(),
                                   y.as<float>(), x.rows(), w.rows(), w.cols(), stream_)
                : gemm_->runF32(x.as<bf16>(), w.as<bf16>(), y.as<float>(), x.rows(), w.rows(),
                                w.cols(), stream_),
            "linear");
    return;
  }
  require(bias.empty() || (bias.dtype == t16 && bias.numel() == w.rows()), "linear",
          "bias must be [N] in w's dtype");
  checkOk(f16 ? gemm_->runF16(x.data, w.data, bias.empty() ? nullptr : bias.data, y.data,
                              x.rows(), w.rows(), w.cols(), stream_)
              : gemm_->run(x.as<bf16>(), w.as<bf16>(), bias.empty() ? nullptr : bias.as<bf16>(),
                           y.as<bf16>(), x.rows(), w.rows(), w.cols(), stream_),
          "linear");
}

Result<int64_t> CudaBackend::prewarmLinear(const Tensor& w, const Tensor& bias, DType y_dtype,
                                           int64_t max_rows) {
  const bool f16 = is(w, DType::kF16);  // [TAG_ATTN_F16]
  if (!(is(w, DType::kBF16) || f16) || w.ndim != 2 || max_rows <= 0)
    return invalidArgument("prewarmLinear: a BF16 or F16 [N, K] weight and max_rows > 0");
  if (y_dtype != (f16 ? DType::kF16 : DType::kBF16) && y_dtype != DType::kF32)
    return invalidArgument("prewarmLinear: y must be BF16 (F16 for an F16 weight) or F32");
  if (!gemm_->tuning()) return int64_t{0};
  const int64_t n = w.rows(), k = w.cols();
  // Pseudo-random rows (not zeros: the tuner checks on them that its winner gives a row the
  // same bits at another M, which constant rows would pass trivially).
  std::vector<uint16_t> host(static_cast<size_t>(max_rows * k));
  uint32_t state = 0x9e3779b9u;
  for (uint16_t& v : host) {
    state = state * 1664525u + 1013904223u;
    // bf16 (fp16) in +-[0.5, 2): sign, exponent 126 or 127 (14 or 15), random mantissa.
    v = f16 ? static_cast<uint16_t>(((state >> 16) & 0x8000u) | ((14u + ((state >> 8) & 1u)) << 10) |
                                    ((state >> 9) & 0x3ffu))
            : static_cast<uint16_t>(((state >> 16) & 0x8000u) | ((126u + ((state >> 8) & 1u)) << 7) |
                                    ((state >> 9) & 0x7fu));
  }
  ASSIGN_OR_RETURN(Buffer xb, allocate(host.size() * sizeof(uint16_t)));
  ASSIGN_OR_RETURN(Buffer yb, allocate(static_cast<size_t>(max_rows * n) * dtypeSize(y_dtype)));
  const Tensor x(xb.data(), f16 ? DType::kF16 : DType::kBF16, {max_rows, k});
  copyToDevice(x, host.data(), host.size() * sizeof(uint16_t));
  const Tensor y(yb.data(), y_dtype, {max_rows, n});
  // An F32 output keeps a bias only if it is F32 too (the projections kept in f32).
  const Tensor b = y_dtype == DType::kF32 && bias.dtype != DType::kF32 ? Tensor() : bias;
  int64_t runs = 0;
  for (int64_t m = 1; m <= max_rows;) {
    const int64_t bucket = gemm_->bucketOf(m);
    const int64_t rows = std::min(bucket, max_rows);
    linear(x.rowSlice(0, rows), w, b, y.rowSlice(0, rows));
    ++runs;
    m = bucket + 1;
  }
  RETURN_IF_ERROR(synchronize());
  return runs;
}

void CudaBackend::qkNormRope(const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                             const Tensor& positions, const Tensor& cos, const Tensor& sin,
                             const QkNormRopeParams& p) {
  require(is(qkv, DType::kBF16) && is(positions, DType::kI32), "qkNormRope",
          "qkv must be BF16, positions I32");
  require(qkv.cols() == static_cast<int64_t>(p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim,
          "qkNormRope", "qkv columns != (Hq + 2*Hkv) * head_dim");
  require(positions.numel() == qkv.rows(), "qkNormRope", "positions must have one entry per token");
  if (p.apply_norm) {
    require(is(q_weight, DType::kBF16) && is(k_weight, DType::kBF16) &&
                q_weight.numel() == p.head_dim && k_weight.numel() == p.head_dim,
            "qkNormRope", "q/k norm weights must be BF16 [head_dim]");
  }
  if (p.rotary_dim > 0) {
    require(is(cos, DType::kF32) && is(sin, DType::kF32) && cos.cols() == p.rotary_dim / 2 &&
                sin.rows() == cos.rows() && sin.cols() == cos.cols(),
            "qkNormRope", "cos/sin must be F32 [max_pos, rotary_dim/2]");
  }
  QkNormRopeArgs a;
  a.qkv = qkv.as<bf16>();
  a.q_weight = p.apply_norm ? q_weight.as<bf16>() : nullptr;
  a.k_weight = p.apply_norm ? k_weight.as<bf16>() : nullptr;
  a.positions = positions.as<int32_t>();
  a.cos = p.rotary_dim > 0 ? cos.as<float>() : nullptr;
  a.sin = p.rotary_dim > 0 ? sin.as<float>() : nullptr;
  a.num_tokens = qkv.rows();
  a.num_q_heads = p.num_q_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.head_dim = p.head_dim;
  a.rotary_dim = p.rotary_dim;
  a.max_pos = p.rotary_dim > 0 ? static_cast<int32_t>(cos.rows()) : 0;
  a.eps = p.eps;
  a.apply_norm = p.apply_norm;
  a.variant = kernels_.qk_rope_variant;
  checkOk(launchQkNormRope(a, stream_, kernels_.pdl), "qkNormRope");
}

namespace {
AttentionPolicy attentionPolicy(const CudaKernelOptions& k) {
  return k.attention_sm90 ? AttentionPolicy::kSm90
         : k.attention_wide ? AttentionPolicy::kAuto
                            : AttentionPolicy::kNarrow;
}
}  // namespace

AttentionArgs CudaBackend::attentionArgs(const Tensor& qkv, const Tensor& cu_seqlens,
                                         const Tensor& out, const AttentionParams& p) {
  require(is(qkv, DType::kBF16) && is(out, DType::kBF16) && is(cu_seqlens, DType::kI32),
          "attention", "qkv/out must be BF16, cu_seqlens I32");
  require(qkv.cols() == static_cast<int64_t>(p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim,
          "attention", "qkv columns != (Hq + 2*Hkv) * head_dim");
  require(
      out.rows() == qkv.rows() && out.cols() == static_cast<int64_t>(p.num_q_heads) * p.head_dim,
      "attention", "out must be [T, Hq*head_dim]");
  require(cu_seqlens.numel() >= p.num_seqs + 1, "attention", "cu_seqlens too short");
  AttentionArgs a;
  a.qkv = qkv.as<bf16>();
  a.cu_seqlens = cu_seqlens.as<int32_t>();
  a.out = out.as<bf16>();
  a.num_tokens = qkv.rows();
  a.num_seqs = p.num_seqs;
  a.num_q_heads = p.num_q_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.head_dim = p.head_dim;
  a.scale = p.scale;
  a.causal = p.causal;
  return a;
}

void CudaBackend::attention(const Tensor& qkv, const Tensor& cu_seqlens, const Tensor& out,
                            const AttentionParams& p) {
  const AttentionArgs a = attentionArgs(qkv, cu_seqlens, out, p);
  checkOk(launchAttention(a, stream_, attentionPolicy(kernels_), kernels_.pdl), "attention");
}

void CudaBackend::attentionFp8(const Tensor& qkv, const Tensor& cu_seqlens, const Tensor& scratch,
                               const Fp8Matrix& out, const AttentionParams& p) {
  AttentionArgs a = attentionArgs(qkv, cu_seqlens, scratch, p);
  require(fp8Activation(out, qkv.rows(), scratch.cols()), "attentionFp8",
          "out: codes U8 [T, Hq*head_dim], scales F32 [Hq*head_dim/128, T]");
  // One selection for both outcomes (launchAttention would select again).
  Result<AttentionVariant> v = selectAttentionVariant(a, attentionPolicy(kernels_), smCount());
  checkOk(v.status(), "attentionFp8");
  if (kernels_.attention_fp8_out && attentionVariantIsSm90(*v)) {
    a.out = nullptr;  // [TAG_ATTN_FP8_OUT] the codes and scales from the epilogue
    a.out_fp8 = out.codes.as<uint8_t>();
    a.out_scales = out.scales.as<float>();
    a.out_scale_rows = out.codes.rows();
    checkOk(launchAttentionVariant(a, stream_, *v, kernels_.pdl), "attentionFp8");
    return;
  }
  checkOk(launchAttentionVariant(a, stream_, *v, kernels_.pdl), "attentionFp8");
  quantizeFp8(scratch, out);
}

void CudaBackend::swiglu(const Tensor& gate_up, const Tensor& out) {
  require(is(gate_up, DType::kBF16) && is(out, DType::kBF16), "swiglu", "dtypes must be BF16");
  require(gate_up.rows() == out.rows() && gate_up.cols() == 2 * out.cols(), "swiglu",
          "gate_up must be [T, 2I] and out [T, I]");
  SwigluArgs a;
  a.gate_up = gate_up.as<bf16>();
  a.out = out.as<bf16>();
  a.num_tokens = out.rows();
  a.inter = out.cols();
  checkOk(launchSwiglu(a, stream_, kernels_.pdl), "swiglu");
}

void CudaBackend::pool(const Tensor& hidden, const Tensor& cu_seqlens, const Tensor& out,
                       const PoolParams& p) {
  require(is(hidden, DType::kBF16) && is(out, DType::kF32) && is(cu_seqlens, DType::kI32), "pool",
          "hidden BF16, out F32, cu_seqlens I32");
  require(out.rows() == p.num_seqs && out.cols() == hidden.cols() &&
              cu_seqlens.numel() >= p.num_seqs + 1,
          "pool", "shape mismatch");
  PoolArgs a;
  a.hidden = hidden.as<bf16>();
  a.cu_seqlens = cu_seqlens.as<int32_t>();
  a.out = out.as<float>();
  a.num_seqs = p.num_seqs;
  a.hidden_size = hidden.cols();
  a.kind = static_cast<PoolKind>(static_cast<int32_t>(p.mode));
  a.normalize = p.normalize;
  checkOk(launchPool(a, stream_), "pool");
}

void CudaBackend::score(const Tensor& hidden, const Tensor& cu_seqlens, const Tensor& head,
                        const Tensor& out, const ScoreParams& p) {
  require(is(hidden, DType::kBF16) && is(head, DType::kBF16) && is(out, DType::kF32) &&
              is(cu_seqlens, DType::kI32),
          "score", "hidden/head BF16, out F32, cu_seqlens I32");
  require(head.cols() == hidden.cols() && out.numel() == p.num_seqs && p.pos_row < head.rows() &&
              p.neg_row < head.rows(),
          "score", "shape mismatch");
  ScoreArgs a;
  a.hidden = hidden.as<bf16>();
  a.cu_seqlens = cu_seqlens.as<int32_t>();
  a.head = head.as<bf16>();
  a.out = out.as<float>();
  a.num_seqs = p.num_seqs;
  a.hidden_size = hidden.cols();
  a.pos_row = p.pos_row;
  a.neg_row = p.neg_row;
  a.apply_sigmoid = p.apply_sigmoid;
  checkOk(launchScore(a, stream_), "score");
}

Status CudaBackend::runGraph(const GraphKey& key, const std::function<void()>& body) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return graphs_->run(key, [&]() -> Status {
    body();
    return okStatus();
  });
}

Status CudaBackend::precaptureGraph(const GraphKey& key, const std::function<void()>& body) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return graphs_->precapture(key, [&]() -> Status {
    body();
    return okStatus();
  });
}

}  // namespace cuda
}  // namespace garden::rose
