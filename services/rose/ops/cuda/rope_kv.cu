#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/rope_kv.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// The cache row head h of token t is copied to: k heads into k_cache, v heads into v_cache;
// nullptr for a q head or a slot outside the cache (validated by the model; never written).
template <typename T>
__device__ __forceinline__ T* kvCacheRow(const RopeKvArgs& a, int64_t t, int h, bool is_v) {
  if (h < a.num_q_heads) return nullptr;
  const int64_t slot = a.slots[t];
  if (slot < 0 || slot >= a.num_slots) return nullptr;
  const int g = is_v ? h - a.num_q_heads - a.num_kv_heads : h - a.num_q_heads;
  return reinterpret_cast<T*>(is_v ? a.v_cache : a.k_cache) +
         (slot * a.num_kv_heads + g) * static_cast<int64_t>(a.head_dim);
}

// Warp w handles item w = t * (Hq + 2*Hkv) + head: q heads and k heads are rotated in place (k
// is also written to the cache), v heads are copied to the cache. Lane l owns the pairs
// (i, i + half) for i = l, l + 32, ... < half (rotated part) and the dims >= rotary_dim.
// kF32In [TAG_PROJ_F32]: the inputs come from a.qkv_in and every dim of the head is written to
// qkv (rounded once) before the cache copy reads it back.
template <typename T, bool kF32In>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) ropeKvKernel(RopeKvArgs a) {
  pdlWait();  // [TAG_PDL_GRAPH]
  pdlTrigger();
  const int lane = threadIdx.x & 31;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (item >= a.num_tokens * heads) return;
  const int64_t t = item / heads;
  const int h = static_cast<int>(item % heads);
  const int d = a.head_dim;
  const int64_t off = t * static_cast<int64_t>(heads) * d + static_cast<int64_t>(h) * d;
  T* p = reinterpret_cast<T*>(a.qkv) + off;
  const bool is_v = h >= a.num_q_heads + a.num_kv_heads;
  const bool rotate = !is_v && a.rotary_dim > 0;
  if (rotate) {
    const int half = a.rotary_dim / 2;
    const int pos = min(max(a.positions[t], 0), a.max_pos - 1);
    const float* c = a.cos + static_cast<int64_t>(pos) * half;
    const float* s = a.sin + static_cast<int64_t>(pos) * half;
    for (int i = lane; i < half; i += 32) {
      float x1, x2;
      if constexpr (kF32In) {
        x1 = a.qkv_in[off + i];
        x2 = a.qkv_in[off + i + half];
      } else {
        x1 = toF32(p[i]);
        x2 = toF32(p[i + half]);
      }
      const float ci = c[i], si = s[i];
      p[i] = fromF32<T>(x1 * ci - x2 * si);
      p[i + half] = fromF32<T>(x2 * ci + x1 * si);
    }
  }
  if constexpr (kF32In) {  // the dims not rotated: rounded into qkv
    for (int i = (rotate ? a.rotary_dim : 0) + lane; i < d; i += 32) {
      p[i] = fromF32<T>(a.qkv_in[off + i]);
    }
  }
  if (rotate || kF32In) __syncwarp();
  T* dst = kvCacheRow<T>(a, t, h, is_v);
  if (dst == nullptr) return;
  for (int i = lane * 2; i < d; i += 64) {
    *reinterpret_cast<uint32_t*>(dst + i) = *reinterpret_cast<const uint32_t*>(p + i);
  }
}

// [TAG_ROPE_KV_VEC] The same operation with 16-byte accesses, for head_dim and rotary_dim / 2
// multiples of 8 and 16-byte aligned tensors: thread u of a (token, head) owns the rotated pairs
// (8u .. 8u + 7, + half) (u < half / 8; one 16-byte load of each side and two of cos/sin) or one
// 8-dim chunk past rotary_dim. The same f32 expressions per element as ropeKvKernel, rounded once.
// One warp per (token, head) moved 128 bytes in 2-byte accesses: 140 us per 8k-token layer of
// gpt-oss-20b (ncu, 2026-12-04), ~4x its traffic at HBM speed.
constexpr int kVecThreads = 256;

template <typename T, bool kF32In>
__global__ void __launch_bounds__(kVecThreads) ropeKvVecKernel(RopeKvArgs a, int units) {
  pdlWait();  // [TAG_PDL_GRAPH]
  pdlTrigger();
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kVecThreads + threadIdx.x;
  if (idx >= a.num_tokens * heads * units) return;
  const int u = static_cast<int>(idx % units);
  const int64_t th = idx / units;
  const int64_t t = th / heads;
  const int h = static_cast<int>(th % heads);
  const int d = a.head_dim, half = a.rotary_dim / 2;
  const int64_t off = t * static_cast<int64_t>(heads) * d + static_cast<int64_t>(h) * d;
  T* p = reinterpret_cast<T*>(a.qkv) + off;
  const bool is_v = h >= a.num_q_heads + a.num_kv_heads;
  const bool rot = u < half / 8;
  // Dims [c0, c0 + 8) and, for a rotated pair chunk, [c0 + half, c0 + half + 8).
  const int c0 = rot ? 8 * u : a.rotary_dim + 8 * (u - half / 8);
  uint4 lo{}, hi{};
  float fl[8], fr[8];  // kF32In: the f32 inputs of the two sides
  if constexpr (kF32In) {
    const float* src = a.qkv_in + off;
    *reinterpret_cast<float4*>(fl) = *reinterpret_cast<const float4*>(src + c0);
    *reinterpret_cast<float4*>(fl + 4) = *reinterpret_cast<const float4*>(src + c0 + 4);
    if (rot) {
      *reinterpret_cast<float4*>(fr) = *reinterpret_cast<const float4*>(src + c0 + half);
      *reinterpret_cast<float4*>(fr + 4) = *reinterpret_cast<const float4*>(src + c0 + half + 4);
    }
  } else {
    lo = *reinterpret_cast<const uint4*>(p + c0);
    if (rot) hi = *reinterpret_cast<const uint4*>(p + c0 + half);
  }
  T* l = reinterpret_cast<T*>(&lo);
  T* r = reinterpret_cast<T*>(&hi);
  if (rot && !is_v) {
    const int pos = min(max(a.positions[t], 0), a.max_pos - 1);
    const float* cp = a.cos + static_cast<int64_t>(pos) * half + c0;
    const float* sp = a.sin + static_cast<int64_t>(pos) * half + c0;
    float c[8], sn[8];
    *reinterpret_cast<float4*>(c) = *reinterpret_cast<const float4*>(cp);
    *reinterpret_cast<float4*>(c + 4) = *reinterpret_cast<const float4*>(cp + 4);
    *reinterpret_cast<float4*>(sn) = *reinterpret_cast<const float4*>(sp);
    *reinterpret_cast<float4*>(sn + 4) = *reinterpret_cast<const float4*>(sp + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float x1 = kF32In ? fl[i] : toF32(l[i]);
      const float x2 = kF32In ? fr[i] : toF32(r[i]);
      l[i] = fromF32<T>(x1 * c[i] - x2 * sn[i]);
      r[i] = fromF32<T>(x2 * c[i] + x1 * sn[i]);
    }
  } else if constexpr (kF32In) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      l[i] = fromF32<T>(fl[i]);
      if (rot) r[i] = fromF32<T>(fr[i]);
    }
  }
  if ((rot && !is_v) || kF32In) {
    *reinterpret_cast<uint4*>(p + c0) = lo;
    if (rot) *reinterpret_cast<uint4*>(p + c0 + half) = hi;
  }
  T* dst = kvCacheRow<T>(a, t, h, is_v);
  if (dst == nullptr) return;
  *reinterpret_cast<uint4*>(dst + c0) = lo;
  if (rot) *reinterpret_cast<uint4*>(dst + c0 + half) = hi;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

Status checkRopeKv(const RopeKvArgs& a) {
  if (a.head_dim <= 0 || a.head_dim % 2 != 0 || a.head_dim > 256)
    return invalidArgument("rope_kv: head_dim must be even and in [2, 256]");
  if (a.rotary_dim < 0 || a.rotary_dim % 2 != 0 || a.rotary_dim > a.head_dim)
    return invalidArgument("rope_kv: rotary_dim must be even and <= head_dim");
  if (a.num_q_heads <= 0 || a.num_kv_heads <= 0)
    return invalidArgument("rope_kv: head counts must be positive");
  if (a.rotary_dim > 0 && (a.max_pos <= 0 || a.cos == nullptr || a.sin == nullptr))
    return invalidArgument("rope_kv: empty cos/sin table");
  if (reinterpret_cast<uintptr_t>(a.qkv) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(a.k_cache) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(a.v_cache) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(a.qkv_in) % 4 != 0)
    return invalidArgument("rope_kv: qkv, qkv_in and caches must be 4-byte aligned");
  return okStatus();
}

namespace {
template <typename T, bool kF32In>
cudaError_t launchRopeKvAs(const RopeKvArgs& a, cudaStream_t stream) {
  const int64_t heads = a.num_q_heads + 2 * a.num_kv_heads;
  if (a.head_dim % 8 == 0 && (a.rotary_dim / 2) % 8 == 0 && aligned16(a.qkv) &&
      aligned16(a.k_cache) && aligned16(a.v_cache) && (!kF32In || aligned16(a.qkv_in)) &&
      (a.rotary_dim == 0 || (aligned16(a.cos) && aligned16(a.sin)))) {
    const int units = a.rotary_dim / 16 + (a.head_dim - a.rotary_dim) / 8;
    const int64_t threads = a.num_tokens * heads * units;
    const unsigned blocks = static_cast<unsigned>((threads + kVecThreads - 1) / kVecThreads);
    return launchPdlAlways(a.pdl, ropeKvVecKernel<T, kF32In>, dim3(blocks), dim3(kVecThreads), 0,
                           stream, a, units);
  } else {
    const int64_t items = a.num_tokens * heads;
    const dim3 grid(static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock));
    return launchPdlAlways(a.pdl, ropeKvKernel<T, kF32In>, grid, dim3(kWarpsPerBlock * 32), 0,
                           stream, a);
  }
}
}  // namespace

Status setRopeKvCarveout(int percent) {
  const auto set = [percent](auto* kernel) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent);
  };
  CUDA_RETURN_IF_ERROR(set(ropeKvVecKernel<bf16, false>));
  CUDA_RETURN_IF_ERROR(set(ropeKvVecKernel<bf16, true>));
  CUDA_RETURN_IF_ERROR(set(ropeKvVecKernel<f16, false>));
  CUDA_RETURN_IF_ERROR(set(ropeKvVecKernel<f16, true>));
  CUDA_RETURN_IF_ERROR(set(ropeKvKernel<bf16, false>));
  CUDA_RETURN_IF_ERROR(set(ropeKvKernel<bf16, true>));
  CUDA_RETURN_IF_ERROR(set(ropeKvKernel<f16, false>));
  CUDA_RETURN_IF_ERROR(set(ropeKvKernel<f16, true>));
  return okStatus();
}

Status launchRopeKv(const RopeKvArgs& a, cudaStream_t stream) {
  RETURN_IF_ERROR(checkRopeKv(a));
  if (a.num_tokens == 0) return okStatus();
  const bool f32_in = a.qkv_in != nullptr;
  if (a.f16) {
    CUDA_RETURN_IF_ERROR((f32_in ? launchRopeKvAs<f16, true>(a, stream)
                                 : launchRopeKvAs<f16, false>(a, stream)));
  } else {
    CUDA_RETURN_IF_ERROR((f32_in ? launchRopeKvAs<bf16, true>(a, stream)
                                 : launchRopeKvAs<bf16, false>(a, stream)));
  }
  return okStatus();
}

}  // namespace garden::rose::cuda
