#pragma once
// wgmma m64nNk16 (bf16 or fp16 in, f32 accumulate) with A and B both K-major shared-memory
// descriptors (128-byte swizzle, no transpose), for N = 16, 32, ..., 256: the MXFP4 expert GEMM's
// shared-memory-A form (moe_wgmma.cu [TAG_MOE_WGMMA_SMEM_A]), whose dequantized weights are
// stored to shared memory and whose token rows are B. The accumulator operand lists are in
// sm90_wgmma_acc.cuh; this file was written by a short generator (as sm90_wgmma_rs.cuh) and is
// kept as text. Device code only.

#include <cstdint>

#include "services/rose/ops/cuda/sm90_wgmma_acc.cuh"

namespace garden::rose::cuda::ptx90 {

// D (64 x N f32: N / 2 registers per thread) += A (64 x 16, K-major descriptor) * B (16 x N,
// K-major descriptor). kHalf: both operands IEEE fp16 instead of bf16 [TAG_ATTN_F16].
template <int kN, bool kHalf = false>
__device__ __forceinline__ void wgmmaSSK(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b);

#define GARDEN_WGMMA_SSK_SPECIALIZE(N, M)                                                      \
  template <>                                                                                 \
  __device__ __forceinline__ void wgmmaSSK<N, false>(float(&d)[M], uint64_t desc_a,           \
                                                     uint64_t desc_b) {                       \
    GARDEN_WGMMA_SSK_##N("bf16");                                                             \
  }                                                                                           \
  template <>                                                                                 \
  __device__ __forceinline__ void wgmmaSSK<N, true>(float(&d)[M], uint64_t desc_a,            \
                                                    uint64_t desc_b) {                        \
    GARDEN_WGMMA_SSK_##N("f16");                                                              \
  }

#define GARDEN_WGMMA_SSK_16(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY " {" GARDEN_WGMMA_D_8 \
               "}, %8, %9, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_8 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(16, 8)
#undef GARDEN_WGMMA_SSK_16

#define GARDEN_WGMMA_SSK_32(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " {" GARDEN_WGMMA_D_16 \
               "}, %16, %17, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_16 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(32, 16)
#undef GARDEN_WGMMA_SSK_32

#define GARDEN_WGMMA_SSK_48(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n48k16.f32." TY "." TY " {" GARDEN_WGMMA_D_24 \
               "}, %24, %25, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_24 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(48, 24)
#undef GARDEN_WGMMA_SSK_48

#define GARDEN_WGMMA_SSK_64(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" GARDEN_WGMMA_D_32 \
               "}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_32 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(64, 32)
#undef GARDEN_WGMMA_SSK_64

#define GARDEN_WGMMA_SSK_80(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n80k16.f32." TY "." TY " {" GARDEN_WGMMA_D_40 \
               "}, %40, %41, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_40 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(80, 40)
#undef GARDEN_WGMMA_SSK_80

#define GARDEN_WGMMA_SSK_96(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n96k16.f32." TY "." TY " {" GARDEN_WGMMA_D_48 \
               "}, %48, %49, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_48 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(96, 48)
#undef GARDEN_WGMMA_SSK_96

#define GARDEN_WGMMA_SSK_112(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %58, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n112k16.f32." TY "." TY " {" GARDEN_WGMMA_D_56 \
               "}, %56, %57, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_56 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(112, 56)
#undef GARDEN_WGMMA_SSK_112

#define GARDEN_WGMMA_SSK_128(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" GARDEN_WGMMA_D_64 \
               "}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_64 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(128, 64)
#undef GARDEN_WGMMA_SSK_128

#define GARDEN_WGMMA_SSK_144(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %74, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n144k16.f32." TY "." TY " {" GARDEN_WGMMA_D_72 \
               "}, %72, %73, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_72 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(144, 72)
#undef GARDEN_WGMMA_SSK_144

#define GARDEN_WGMMA_SSK_160(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n160k16.f32." TY "." TY " {" GARDEN_WGMMA_D_80 \
               "}, %80, %81, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_80 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(160, 80)
#undef GARDEN_WGMMA_SSK_160

#define GARDEN_WGMMA_SSK_176(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n176k16.f32." TY "." TY " {" GARDEN_WGMMA_D_88 \
               "}, %88, %89, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_88 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(176, 88)
#undef GARDEN_WGMMA_SSK_176

#define GARDEN_WGMMA_SSK_192(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n192k16.f32." TY "." TY " {" GARDEN_WGMMA_D_96 \
               "}, %96, %97, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_96 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(192, 96)
#undef GARDEN_WGMMA_SSK_192

#define GARDEN_WGMMA_SSK_208(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %106, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n208k16.f32." TY "." TY " {" GARDEN_WGMMA_D_104 \
               "}, %104, %105, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_104 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(208, 104)
#undef GARDEN_WGMMA_SSK_208

#define GARDEN_WGMMA_SSK_224(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %114, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n224k16.f32." TY "." TY " {" GARDEN_WGMMA_D_112 \
               "}, %112, %113, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_112 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(224, 112)
#undef GARDEN_WGMMA_SSK_224

#define GARDEN_WGMMA_SSK_240(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %122, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n240k16.f32." TY "." TY " {" GARDEN_WGMMA_D_120 \
               "}, %120, %121, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_120 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(240, 120)
#undef GARDEN_WGMMA_SSK_240

#define GARDEN_WGMMA_SSK_256(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {" GARDEN_WGMMA_D_128 \
               "}, %128, %129, p, 1, 1, 0, 0;\n}\n" \
               : GARDEN_WGMMA_DOUT_128 \
               : "l"(desc_a), "l"(desc_b), "r"(1));
GARDEN_WGMMA_SSK_SPECIALIZE(256, 128)
#undef GARDEN_WGMMA_SSK_256

#undef GARDEN_WGMMA_SSK_SPECIALIZE

}  // namespace garden::rose::cuda::ptx90
