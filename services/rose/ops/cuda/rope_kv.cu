#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/rope_kv.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// Warp w handles item w = t * (Hq + 2*Hkv) + head: q heads and k heads are rotated in place (k
// is also written to the cache), v heads are copied to the cache. Lane l owns the pairs
// (i, i + half) for i = l, l + 32, ... < half (rotated part) and the dims >= rotary_dim.
__global__ void __launch_bounds__(kWarpsPerBlock * 32) ropeKvKernel(RopeKvArgs a) {
  const int lane = threadIdx.x & 31;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (item >= a.num_tokens * heads) return;
  const int64_t t = item / heads;
  const int h = static_cast<int>(item % heads);
  const int d = a.head_dim;
  __nv_bfloat16* p = a.qkv + t * static_cast<int64_t>(heads) * d + static_cast<int64_t>(h) * d;
  const bool is_v = h >= a.num_q_heads + a.num_kv_heads;
  if (!is_v && a.rotary_dim > 0) {
    const int half = a.rotary_dim / 2;
    const int pos = min(max(a.positions[t], 0), a.max_pos - 1);
    const float* c = a.cos + static_cast<int64_t>(pos) * half;
    const float* s = a.sin + static_cast<int64_t>(pos) * half;
    for (int i = lane; i < half; i += 32) {
      const float x1 = __bfloat162float(p[i]);
      const float x2 = __bfloat162float(p[i + half]);
      const float ci = c[i], si = s[i];
      p[i] = __float2bfloat16(x1 * ci - x2 * si);
      p[i + half] = __float2bfloat16(x2 * ci + x1 * si);
    }
    __syncwarp();
  }
  if (h < a.num_q_heads) return;
  const int64_t slot = a.slots[t];
  if (slot < 0 || slot >= a.num_slots) return;  // validated by the model; never write outside
  const int g = is_v ? h - a.num_q_heads - a.num_kv_heads : h - a.num_q_heads;
  __nv_bfloat16* dst = (is_v ? a.v_cache : a.k_cache) +
                       (slot * a.num_kv_heads + g) * static_cast<int64_t>(d);
  for (int i = lane * 2; i < d; i += 64) {
    *reinterpret_cast<__nv_bfloat162*>(dst + i) = *reinterpret_cast<const __nv_bfloat162*>(p + i);
  }
}

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
      reinterpret_cast<uintptr_t>(a.v_cache) % 4 != 0)
    return invalidArgument("rope_kv: qkv and caches must be 4-byte aligned");
  return okStatus();
}

Status launchRopeKv(const RopeKvArgs& a, cudaStream_t stream) {
  RETURN_IF_ERROR(checkRopeKv(a));
  if (a.num_tokens == 0) return okStatus();
  const int64_t items = a.num_tokens * (a.num_q_heads + 2 * a.num_kv_heads);
  const dim3 grid(static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock));
  ropeKvKernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
