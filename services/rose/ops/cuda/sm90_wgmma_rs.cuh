#pragma once
// wgmma m64nNk16 (bf16 or fp16 in, f32 accumulate) with A from registers and B a K-major
// shared-memory descriptor (no transpose), for N = 16, 32, ..., 256: the MXFP4 expert GEMM of
// moe_wgmma.cu, whose weights are dequantized into the A registers and whose token rows are B.
// (sm90_ptx.cuh's wgmmaRS / wgmmaRS64 read B MN-major.) The accumulator operand lists are in
// sm90_wgmma_acc.cuh (inline PTX takes no arrays); this file was written by a short generator and
// is kept as text. Device code only.

#include <cstdint>

#include "services/rose/ops/cuda/sm90_wgmma_acc.cuh"

namespace garden::rose::cuda::ptx90 {

// D (64 x N f32: N / 2 registers per thread) += A (64 x 16 bf16: 4 registers per thread, the
// mma.m16n8k16 A fragment of the thread's warp's 16 rows) * B (16 x N, K-major descriptor).
// kHalf: both operands IEEE fp16 instead of bf16 [TAG_ATTN_F16] (the MoE side in fp16); each N's
// instruction is written once, as a macro over the type suffix.
template <int kN, bool kHalf = false>
__device__ __forceinline__ void wgmmaRSK(float (&d)[kN / 2], uint32_t a0, uint32_t a1,
                                         uint32_t a2, uint32_t a3, uint64_t desc_b);

// The bf16 and fp16 specializations of wgmmaRSK<N> (M = N / 2 accumulators) from N's instruction
// GARDEN_WGMMA_RSK_<N>(type suffix).
#define GARDEN_WGMMA_RSK_SPECIALIZE(N, M)                                                       \
  template <>                                                                                  \
  __device__ __forceinline__ void wgmmaRSK<N, false>(float(&d)[M], uint32_t a0, uint32_t a1,   \
                                                     uint32_t a2, uint32_t a3,                  \
                                                     uint64_t desc_b) {                         \
    GARDEN_WGMMA_RSK_##N("bf16");                                                              \
  }                                                                                            \
  template <>                                                                                  \
  __device__ __forceinline__ void wgmmaRSK<N, true>(float(&d)[M], uint32_t a0, uint32_t a1,    \
                                                    uint32_t a2, uint32_t a3,                   \
                                                    uint64_t desc_b) {                          \
    GARDEN_WGMMA_RSK_##N("f16");                                                               \
  }

#define GARDEN_WGMMA_RSK_16(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY " {" GARDEN_WGMMA_D_8 \
               "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_8 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(16, 8)
#undef GARDEN_WGMMA_RSK_16

#define GARDEN_WGMMA_RSK_32(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " {" GARDEN_WGMMA_D_16 \
               "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_16 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(32, 16)
#undef GARDEN_WGMMA_RSK_32

#define GARDEN_WGMMA_RSK_48(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n48k16.f32." TY "." TY " {" GARDEN_WGMMA_D_24 \
               "}, {%24, %25, %26, %27}, %28, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_24 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(48, 24)
#undef GARDEN_WGMMA_RSK_48

#define GARDEN_WGMMA_RSK_64(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" GARDEN_WGMMA_D_32 \
               "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_32 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(64, 32)
#undef GARDEN_WGMMA_RSK_64

#define GARDEN_WGMMA_RSK_80(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n80k16.f32." TY "." TY " {" GARDEN_WGMMA_D_40 \
               "}, {%40, %41, %42, %43}, %44, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_40 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(80, 40)
#undef GARDEN_WGMMA_RSK_80

#define GARDEN_WGMMA_RSK_96(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n96k16.f32." TY "." TY " {" GARDEN_WGMMA_D_48 \
               "}, {%48, %49, %50, %51}, %52, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_48 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(96, 48)
#undef GARDEN_WGMMA_RSK_96

#define GARDEN_WGMMA_RSK_112(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %61, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n112k16.f32." TY "." TY " {" GARDEN_WGMMA_D_56 \
               "}, {%56, %57, %58, %59}, %60, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_56 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(112, 56)
#undef GARDEN_WGMMA_RSK_112

#define GARDEN_WGMMA_RSK_128(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" GARDEN_WGMMA_D_64 \
               "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_64 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(128, 64)
#undef GARDEN_WGMMA_RSK_128

#define GARDEN_WGMMA_RSK_144(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %77, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n144k16.f32." TY "." TY " {" GARDEN_WGMMA_D_72 \
               "}, {%72, %73, %74, %75}, %76, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_72 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(144, 72)
#undef GARDEN_WGMMA_RSK_144

#define GARDEN_WGMMA_RSK_160(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %85, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n160k16.f32." TY "." TY " {" GARDEN_WGMMA_D_80 \
               "}, {%80, %81, %82, %83}, %84, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_80 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(160, 80)
#undef GARDEN_WGMMA_RSK_160

#define GARDEN_WGMMA_RSK_176(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %93, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n176k16.f32." TY "." TY " {" GARDEN_WGMMA_D_88 \
               "}, {%88, %89, %90, %91}, %92, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_88 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(176, 88)
#undef GARDEN_WGMMA_RSK_176

#define GARDEN_WGMMA_RSK_192(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n192k16.f32." TY "." TY " {" GARDEN_WGMMA_D_96 \
               "}, {%96, %97, %98, %99}, %100, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_96 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(192, 96)
#undef GARDEN_WGMMA_RSK_192

#define GARDEN_WGMMA_RSK_208(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %109, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n208k16.f32." TY "." TY " {" GARDEN_WGMMA_D_104 \
               "}, {%104, %105, %106, %107}, %108, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_104 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(208, 104)
#undef GARDEN_WGMMA_RSK_208

#define GARDEN_WGMMA_RSK_224(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %117, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n224k16.f32." TY "." TY " {" GARDEN_WGMMA_D_112 \
               "}, {%112, %113, %114, %115}, %116, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_112 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(224, 112)
#undef GARDEN_WGMMA_RSK_224

#define GARDEN_WGMMA_RSK_240(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %125, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n240k16.f32." TY "." TY " {" GARDEN_WGMMA_D_120 \
               "}, {%120, %121, %122, %123}, %124, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_120 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(240, 120)
#undef GARDEN_WGMMA_RSK_240

#define GARDEN_WGMMA_RSK_256(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {" GARDEN_WGMMA_D_128 \
               "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_128 \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(1));
GARDEN_WGMMA_RSK_SPECIALIZE(256, 128)
#undef GARDEN_WGMMA_RSK_256

#undef GARDEN_WGMMA_RSK_SPECIALIZE

}  // namespace garden::rose::cuda::ptx90
