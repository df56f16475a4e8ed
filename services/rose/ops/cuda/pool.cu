#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/pool.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kMaxChunksPerThread = 4;

// blockDim = (tx over 8-wide column chunks, ty over tokens for mean). Partial sums over token
// stripes are combined in a fixed order through shared memory [ty][hidden].
__global__ void poolKernel(PoolArgs a) {
  extern __shared__ float sm[];  // [ty * hidden] then [32] for the norm reduction
  const int seq = blockIdx.x;
  const int start = a.cu_seqlens[seq];
  const int len = a.cu_seqlens[seq + 1] - start;
  const int chunks = static_cast<int>(a.hidden_size / 8);
  const int tx = threadIdx.x, ty = threadIdx.y;
  float acc[kMaxChunksPerThread][8];
#pragma unroll
  for (int k = 0; k < kMaxChunksPerThread; ++k)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[k][i] = 0.f;

  int first = 0, count = 0, step = 1;
  if (len > 0) {
    if (a.kind == PoolKind::kLast) {
      first = len - 1;
      count = 1;
    } else if (a.kind == PoolKind::kCls) {
      first = 0;
      count = 1;
    } else {
      first = 0;
      count = len;
    }
  }
  step = blockDim.y;
  for (int tok = first + ty; tok < first + count; tok += step) {
    const __nv_bfloat16* row = a.hidden + static_cast<int64_t>(start + tok) * a.hidden_size;
#pragma unroll
    for (int k = 0; k < kMaxChunksPerThread; ++k) {
      const int c = tx + k * blockDim.x;
      if (c < chunks) {
        float v[8];
        loadF32x8(row + c * 8, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[k][i] += v[i];
      }
    }
  }
  float* part = sm;
  float* red = sm + blockDim.y * a.hidden_size;
#pragma unroll
  for (int k = 0; k < kMaxChunksPerThread; ++k) {
    const int c = tx + k * blockDim.x;
    if (c < chunks)
#pragma unroll
      for (int i = 0; i < 8; ++i) part[ty * a.hidden_size + c * 8 + i] = acc[k][i];
  }
  __syncthreads();
  // Stripe 0 combines the partial sums (fixed order) and finishes.
  const float inv_count = count > 0 ? 1.f / static_cast<float>(count) : 0.f;
  float ss = 0.f;
  if (ty == 0) {
#pragma unroll
    for (int k = 0; k < kMaxChunksPerThread; ++k) {
      const int c = tx + k * blockDim.x;
      if (c < chunks) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          float v = 0.f;
          for (int y = 0; y < static_cast<int>(blockDim.y); ++y)
            v += part[y * a.hidden_size + c * 8 + i];
          v *= inv_count;
          acc[k][i] = v;
          ss += v * v;
        }
      }
    }
    ss = warpSum(ss);
    if ((tx & 31) == 0) red[tx / 32] = ss;
  }
  __syncthreads();
  if (ty != 0) return;
  float scale = 1.f;
  if (a.normalize) {
    float tot = 0.f;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) tot += red[w];
    scale = 1.f / fmaxf(sqrtf(tot), 1e-12f);
  }
  float* out = a.out + static_cast<int64_t>(seq) * a.hidden_size;
#pragma unroll
  for (int k = 0; k < kMaxChunksPerThread; ++k) {
    const int c = tx + k * blockDim.x;
    if (c < chunks) {
      float4* o4 = reinterpret_cast<float4*>(out + c * 8);
      o4[0] =
          make_float4(acc[k][0] * scale, acc[k][1] * scale, acc[k][2] * scale, acc[k][3] * scale);
      o4[1] =
          make_float4(acc[k][4] * scale, acc[k][5] * scale, acc[k][6] * scale, acc[k][7] * scale);
    }
  }
}

// Mean pooling, kClusterPerSequence: a cluster of kClusterBlocks blocks per sequence (grid
// kClusterBlocks x num_seqs). Block `rank` sums the tokens rank*ty + y + k*(kClusterBlocks*ty),
// kUnroll tokens per step (independent 16-byte loads in flight), its token stripes are combined
// through shared memory, and rank 0 adds the kClusterBlocks block sums read through distributed
// shared memory in rank order, scales, normalizes and writes. The summation order depends on the
// sequence's length and hidden size alone: batch-invariant and deterministic.
constexpr int kClusterBlocks = 8;
constexpr int kUnroll = 4;

__global__ void __cluster_dims__(kClusterBlocks, 1, 1) poolMeanClusterKernel(PoolArgs a) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ float sm[];  // [ty * hidden] partial sums, then [32] for the norm reduction
  const int rank = static_cast<int>(cluster.block_rank());
  const int seq = blockIdx.y;
  const int start = a.cu_seqlens[seq];
  const int len = a.cu_seqlens[seq + 1] - start;
  const int chunks = static_cast<int>(a.hidden_size / 8);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int stripes = static_cast<int>(blockDim.y);
  float acc[kMaxChunksPerThread][8];
#pragma unroll
  for (int k = 0; k < kMaxChunksPerThread; ++k)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[k][i] = 0.f;

  const int step = kClusterBlocks * stripes;
  const int first = rank * stripes + ty;
  int tok = first;
  // kUnroll tokens a step: their loads are independent and issued before the adds.
  for (; tok + (kUnroll - 1) * step < len; tok += kUnroll * step) {
#pragma unroll
    for (int k = 0; k < kMaxChunksPerThread; ++k) {
      const int c = tx + k * static_cast<int>(blockDim.x);
      if (c < chunks) {
        float v[kUnroll][8];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          loadF32x8(a.hidden + static_cast<int64_t>(start + tok + u * step) * a.hidden_size + c * 8,
                    v[u]);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[k][i] += v[u][i];
      }
    }
  }
  for (; tok < len; tok += step) {
#pragma unroll
    for (int k = 0; k < kMaxChunksPerThread; ++k) {
      const int c = tx + k * static_cast<int>(blockDim.x);
      if (c < chunks) {
        float v[8];
        loadF32x8(a.hidden + static_cast<int64_t>(start + tok) * a.hidden_size + c * 8, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[k][i] += v[i];
      }
    }
  }
  float* part = sm;
  float* red = sm + stripes * a.hidden_size;
#pragma unroll
  for (int k = 0; k < kMaxChunksPerThread; ++k) {
    const int c = tx + k * static_cast<int>(blockDim.x);
    if (c < chunks)
#pragma unroll
      for (int i = 0; i < 8; ++i) part[ty * a.hidden_size + c * 8 + i] = acc[k][i];
  }
  __syncthreads();
  // Stripe 0 folds the block's stripes into part[0..hidden) (fixed order).
  if (ty == 0) {
#pragma unroll
    for (int k = 0; k < kMaxChunksPerThread; ++k) {
      const int c = tx + k * static_cast<int>(blockDim.x);
      if (c < chunks) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          float v = part[c * 8 + i];
          for (int y = 1; y < stripes; ++y) v += part[y * a.hidden_size + c * 8 + i];
          part[c * 8 + i] = v;
        }
      }
    }
  }
  cluster.sync();  // every block's sum is in its shared memory
  float ss = 0.f;
  const float inv_count = len > 0 ? 1.f / static_cast<float>(len) : 0.f;
  if (rank == 0 && ty == 0) {
#pragma unroll
    for (int k = 0; k < kMaxChunksPerThread; ++k) {
      const int c = tx + k * static_cast<int>(blockDim.x);
      if (c < chunks) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[k][i] = 0.f;
        for (int r = 0; r < kClusterBlocks; ++r) {
          const float* remote = cluster.map_shared_rank(part, r);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[k][i] += remote[c * 8 + i];
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          acc[k][i] *= inv_count;
          ss += acc[k][i] * acc[k][i];
        }
      }
    }
    ss = warpSum(ss);
    if ((tx & 31) == 0) red[tx / 32] = ss;
  }
  cluster.sync();  // rank 0 is done reading the others' shared memory
  if (rank != 0 || ty != 0) return;
  __syncwarp();
  float scale = 1.f;
  if (a.normalize) {
    // red[] was written by stripe-0 warps before the cluster barrier.
    float tot = 0.f;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) tot += red[w];
    scale = 1.f / fmaxf(sqrtf(tot), 1e-12f);
  }
  float* out = a.out + static_cast<int64_t>(seq) * a.hidden_size;
#pragma unroll
  for (int k = 0; k < kMaxChunksPerThread; ++k) {
    const int c = tx + k * static_cast<int>(blockDim.x);
    if (c < chunks) {
      float4* o4 = reinterpret_cast<float4*>(out + c * 8);
      o4[0] =
          make_float4(acc[k][0] * scale, acc[k][1] * scale, acc[k][2] * scale, acc[k][3] * scale);
      o4[1] =
          make_float4(acc[k][4] * scale, acc[k][5] * scale, acc[k][6] * scale, acc[k][7] * scale);
    }
  }
}

__global__ void scoreKernel(ScoreArgs a) {
  const int seq = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (seq >= a.num_seqs) return;
  const int start = a.cu_seqlens[seq];
  const int len = a.cu_seqlens[seq + 1] - start;
  if (len <= 0) {
    if (lane == 0) a.out[seq] = 0.f;
    return;
  }
  const __nv_bfloat16* h = a.hidden + static_cast<int64_t>(start + len - 1) * a.hidden_size;
  const __nv_bfloat16* wp = a.head + static_cast<int64_t>(a.pos_row) * a.hidden_size;
  const __nv_bfloat16* wn =
      a.neg_row >= 0 ? a.head + static_cast<int64_t>(a.neg_row) * a.hidden_size : nullptr;
  float zp = 0.f, zn = 0.f;
  for (int64_t c = lane * 8; c < a.hidden_size; c += 32 * 8) {
    float hv[8], pv[8];
    loadF32x8(h + c, hv);
    loadF32x8(wp + c, pv);
#pragma unroll
    for (int i = 0; i < 8; ++i) zp += hv[i] * pv[i];
    if (wn != nullptr) {
      float nv[8];
      loadF32x8(wn + c, nv);
#pragma unroll
      for (int i = 0; i < 8; ++i) zn += hv[i] * nv[i];
    }
  }
  const float z = warpSum(zp) - warpSum(zn);
  if (lane == 0) a.out[seq] = a.apply_sigmoid ? 1.f / (1.f + expf(-z)) : z;
}

// The checks both variants share.
Status checkArgs(const PoolArgs& a) {
  if (a.hidden_size <= 0 || a.hidden_size % 8 != 0 || a.hidden_size > 8192)
    return invalidArgument("pool: hidden_size must be a multiple of 8 in [8, 8192]");
  if (reinterpret_cast<uintptr_t>(a.hidden) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.out) % 16 != 0)
    return invalidArgument("pool: hidden and out must be 16-byte aligned");
  if (a.kind != PoolKind::kLast && a.kind != PoolKind::kMean && a.kind != PoolKind::kCls)
    return invalidArgument("pool: unknown pooling kind");
  return okStatus();
}

}  // namespace

Status checkPoolVariant(const PoolArgs& a, PoolVariant v) {
  RETURN_IF_ERROR(checkArgs(a));
  switch (v) {
    case PoolVariant::kBlockPerSequence:
      return okStatus();
    case PoolVariant::kClusterPerSequence:
      if (a.kind != PoolKind::kMean)
        return unimplemented("pool: the cluster-per-sequence variant pools by mean only");
      if (a.num_seqs > 65535)
        return unimplemented(
            "pool: the cluster-per-sequence variant takes at most 65535 "
            "sequences, got " +
            std::to_string(a.num_seqs));
      return okStatus();
  }
  return invalidArgument("pool: unknown variant " + std::to_string(static_cast<int>(v)));
}

Result<PoolVariant> selectPoolVariant(const PoolArgs& a) {
  RETURN_IF_ERROR(checkArgs(a));
  // Mean pooling on a cluster per sequence when it can run; the one-token modes read one row.
  if (checkPoolVariant(a, PoolVariant::kClusterPerSequence).isOk())
    return PoolVariant::kClusterPerSequence;
  return PoolVariant::kBlockPerSequence;
}

Status launchPoolVariant(const PoolArgs& a, cudaStream_t stream, PoolVariant v) {
  if (a.num_seqs == 0) return okStatus();
  RETURN_IF_ERROR(checkPoolVariant(a, v));
  const int chunks = static_cast<int>(a.hidden_size / 8);
  const int tx = std::min(
      512, std::max(32, ((chunks + kMaxChunksPerThread - 1) / kMaxChunksPerThread + 31) / 32 * 32));
  // Token stripes only matter for mean pooling; sized from hidden alone (batch invariance) and
  // kept under 48 KB of partial sums.
  int ty = 1;
  if (a.kind == PoolKind::kMean) {
    ty = std::max(1, std::min(1024 / tx, static_cast<int>(40960 / (a.hidden_size * 4))));
    ty = std::min(ty, 8);
  }
  const size_t smem = sizeof(float) * (static_cast<size_t>(ty) * a.hidden_size + 32);
  if (v == PoolVariant::kClusterPerSequence) {
    poolMeanClusterKernel<<<dim3(kClusterBlocks, a.num_seqs), dim3(tx, ty), smem, stream>>>(a);
  } else {
    poolKernel<<<a.num_seqs, dim3(tx, ty), smem, stream>>>(a);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

Status launchPool(const PoolArgs& a, cudaStream_t stream) {
  if (a.num_seqs == 0) return okStatus();
  ASSIGN_OR_RETURN(PoolVariant v, selectPoolVariant(a));
  return launchPoolVariant(a, stream, v);
}

Status launchScore(const ScoreArgs& a, cudaStream_t stream) {
  if (a.num_seqs == 0) return okStatus();
  if (a.hidden_size <= 0 || a.hidden_size % 8 != 0)
    return invalidArgument("score: hidden_size must be a multiple of 8");
  if (a.pos_row < 0) return invalidArgument("score: pos_row must be >= 0");
  constexpr int kWarps = 4;
  const int blocks = (a.num_seqs + kWarps - 1) / kWarps;
  scoreKernel<<<blocks, kWarps * 32, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
