#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/moe_route.cuh"
#include "services/rose/ops/cuda/moe_route_device.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void __launch_bounds__(kWarpsPerBlock * 32) moeRouteKernel(MoeRouteArgs a) {
  pdlWait();  // [TAG_PDL_GRAPH]
  pdlTrigger();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= a.num_tokens) return;
  moeRouteToken(a, t, threadIdx.x & 31);
}

}  // namespace

Status checkMoeRoute(const MoeRouteArgs& a) {
  if (a.num_experts <= 0 || a.num_experts > kMoeRouteMaxExperts)
    return invalidArgument("moe_route: num_experts must be in [1, 256]");
  if (a.top_k <= 0 || a.top_k > kMoeRouteMaxTopK || a.top_k > a.num_experts)
    return invalidArgument("moe_route: top_k must be in [1, min(8, num_experts)]");
  if (a.splits < 0 || (a.splits > 0 && (a.ss == nullptr || a.hidden <= 0)))
    return invalidArgument("moe_route: splits needs ss and hidden");
  return okStatus();
}

Status launchMoeRoute(const MoeRouteArgs& a, cudaStream_t stream) {
  RETURN_IF_ERROR(checkMoeRoute(a));
  if (a.num_tokens == 0) return okStatus();
  const dim3 grid(static_cast<unsigned>((a.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock));
  CUDA_RETURN_IF_ERROR(
      launchPdlAlways(a.pdl, moeRouteKernel, grid, dim3(kWarpsPerBlock * 32), 0, stream, a));
  return okStatus();
}

}  // namespace garden::rose::cuda
