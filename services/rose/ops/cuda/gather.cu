#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/gather.cuh"

namespace garden::rose::cuda {
namespace {

// One block per output row; 16-byte copies when the row allows, else bytes.
__global__ void gatherRowsKernel(const unsigned char* in, int64_t in_rows, const int32_t* rows,
                                 int64_t row_bytes, unsigned char* out) {
  const int64_t r = blockIdx.x;
  const int32_t src = rows[r];
  if (src < 0 || src >= in_rows) return;
  const unsigned char* s = in + static_cast<int64_t>(src) * row_bytes;
  unsigned char* d = out + r * row_bytes;
  if (row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(s) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(d) % 16 == 0) {
    for (int64_t i = threadIdx.x; i < row_bytes / 16; i += blockDim.x)
      reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
  } else {
    for (int64_t i = threadIdx.x; i < row_bytes; i += blockDim.x) d[i] = s[i];
  }
}

__global__ void copyTokensKernel(const int32_t* src, int64_t src_len, const int32_t* pairs,
                                 int64_t num_pairs, int32_t* ids, int64_t ids_len) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_pairs) return;
  const int32_t dst = pairs[2 * i], row = pairs[2 * i + 1];
  if (dst < 0 || dst >= ids_len || row < 0 || row >= src_len) return;
  ids[dst] = src[row];
}

}  // namespace

Status launchGatherRows(const void* in, int64_t in_rows, const int32_t* rows, int64_t num_rows,
                        int64_t row_bytes, void* out, cudaStream_t stream) {
  if (num_rows == 0) return okStatus();
  if (row_bytes <= 0) return invalidArgument("gather_rows: empty rows");
  gatherRowsKernel<<<static_cast<unsigned>(num_rows), 256, 0, stream>>>(
      static_cast<const unsigned char*>(in), in_rows, rows, row_bytes,
      static_cast<unsigned char*>(out));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

Status launchCopyTokens(const int32_t* src, int64_t src_len, const int32_t* pairs,
                        int64_t num_pairs, int32_t* ids, int64_t ids_len, cudaStream_t stream) {
  if (num_pairs == 0) return okStatus();
  copyTokensKernel<<<static_cast<unsigned>((num_pairs + 255) / 256), 256, 0, stream>>>(
      src, src_len, pairs, num_pairs, ids, ids_len);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
