#include "services/rose/ops/cuda/common.cuh"
#include "services/rose/ops/cuda/cuda_utils.h"
#include "services/rose/ops/cuda/moe_gemm.cuh"

namespace garden::rose::cuda {
namespace {

constexpr int kBK = kMoeGemmTileK;    // 64
constexpr int kPackN = kMoeGemmTileN;  // 128: rows of one packed MXFP4 tile [TAG_MXFP4_TILED]
constexpr int kRowS = kBK + 8;  // padded smem row (bf16 elements): conflict-free ldmatrix

// The bf16 bit pattern of an E2M1 code (low 4 bits).
// E2M1: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; exponent 0 is 0 or 0.5.
__host__ __device__ constexpr uint16_t e2m1Bf16(unsigned code) {
  const unsigned mag = code & 7, e = mag >> 1, m = mag & 1;
  const unsigned bits = mag == 0 ? 0u : mag == 1 ? 0x3F00u : (((126u + e) << 7) | (m << 6));
  return static_cast<uint16_t>(bits | ((code & 8) ? 0x8000u : 0u));
}
static_assert(e2m1Bf16(1) == 0x3F00 && e2m1Bf16(2) == 0x3F80 && e2m1Bf16(3) == 0x3FC0 &&
              e2m1Bf16(4) == 0x4000 && e2m1Bf16(5) == 0x4040 && e2m1Bf16(6) == 0x4080 &&
              e2m1Bf16(7) == 0x40C0 && e2m1Bf16(15) == 0xC0C0 && e2m1Bf16(8) == 0x8000);

// 2^(s - 127) as a bf16 pair (s = 0: the subnormal 2^-127; 255: +inf, as the reference's ldexp).
__device__ __forceinline__ __nv_bfloat162 e8m0Bf16x2(unsigned s) {
  const uint32_t b = s == 0 ? 0x0040u : (s == 255 ? 0x7F80u : (s << 7));
  const uint32_t two = b | (b << 16);
  return *reinterpret_cast<const __nv_bfloat162*>(&two);
}

template <int kBM, int kBN, int kStages, bool kMx>
constexpr size_t moeGemmSmemBytes() {
  size_t bytes = size_t{kStages} * kBM * kRowS * 2;  // A stages
  if (kMx) {
    bytes += size_t{kStages} * (kBN * 32 + kBN * 2);  // raw codes + scales per stage
    bytes += 256 * 4;                                 // byte -> bf16x2 table
    bytes += size_t{kBN} * kRowS * 2;                 // dequantized B tile
  } else {
    bytes += size_t{kStages} * kBN * kRowS * 2;  // B stages
  }
  return bytes;
}

// Block: kWM x kWN warps, each kMT m16 tiles x kNT n8 tiles; block tile kBM x kBN (32 or 128;
// a 32-row tile reads a quarter of a packed 128-row MXFP4 tile), K tiles of 64, kStages-deep
// cp.async pipeline. Every configuration runs the same mma chain per output element (K tiles in
// order, k16 steps in order), so a row's bits do not depend on the configuration.
template <int kWM, int kWN, int kMT, int kNT, int kStages, bool kMx, MoeGemmEpilogue kEpi>
__global__ void __launch_bounds__(kWM * kWN * 32) moeGemmKernel(MoeGemmArgs a) {
  constexpr int kThreads = kWM * kWN * 32;
  constexpr int kBM = kWM * kMT * 16;
  constexpr int kBN = kWN * kNT * 8;
  static_assert(kBN == 32 || kBN == kPackN, "block N tile must be 32 or 128");
  static_assert(kNT % 2 == 0, "n8 tiles come in pairs (ldmatrix.x4)");
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* s_a = reinterpret_cast<__nv_bfloat16*>(smem);  // [kStages][kBM][kRowS]
  unsigned char* rest = smem + size_t{kStages} * kBM * kRowS * 2;
  uint8_t* s_codes = rest;                                   // kMx: [kStages][kBN * 32]
  uint8_t* s_scales = rest + kStages * kBN * 32;             // kMx: [kStages][kBN * 2]
  uint32_t* s_lut = reinterpret_cast<uint32_t*>(s_scales + kStages * kBN * 2);  // kMx: [256]
  __nv_bfloat16* s_bdq = reinterpret_cast<__nv_bfloat16*>(s_lut + 256);        // kMx: [kBN][kRowS]
  __nv_bfloat16* s_b = reinterpret_cast<__nv_bfloat16*>(rest);  // !kMx: [kStages][kBN][kRowS]

  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) return;
  const int e = a.tile_expert[tile];
  if (e < 0 || e >= a.num_experts) return;
  const int nt_blk = blockIdx.y;
  const int n0 = nt_blk * kBN;
  const int m0 = tile * kBM;
  const int kt_count = (a.k + kBK - 1) / kBK;
  const int pack_tiles = (a.n + kPackN - 1) / kPackN;  // 128-row tiles of the packed layout
  const int pack_row0 = n0 % kPackN;                    // this block's first row in its pack tile
  const int tid = threadIdx.x;

  if constexpr (kMx) {
    for (int i = tid; i < 256; i += kThreads) {
      s_lut[i] = static_cast<uint32_t>(e2m1Bf16(i & 15)) |
                 (static_cast<uint32_t>(e2m1Bf16(i >> 4)) << 16);
    }
  }

  auto load_stage = [&](int kt, int slot) {
    __nv_bfloat16* sa = s_a + slot * kBM * kRowS;
    for (int i = tid; i < kBM * (kBK / 8); i += kThreads) {
      const int r = i / (kBK / 8);
      const int c = (i % (kBK / 8)) * 8;
      const int pr = m0 + r;
      const int src = a.a_rows != nullptr ? a.a_rows[pr] : pr;
      const int kk = kt * kBK + c;
      const bool valid = src >= 0 && kk < a.k;
      const __nv_bfloat16* p = a.a + (valid ? static_cast<int64_t>(src) * a.k + kk : 0);
      cpAsync16(sa + r * kRowS + c, p, valid);
    }
    if constexpr (kMx) {
      const int64_t tb = (static_cast<int64_t>(e) * pack_tiles + n0 / kPackN) * kt_count + kt;
      const uint8_t* cs = a.codes + tb * (kPackN * 32) + pack_row0 * 32;
      const uint8_t* ss = a.scales + tb * (kPackN * 2) + pack_row0 * 2;
      for (int i = tid; i < kBN * 32 / 16; i += kThreads)
        cpAsync16(s_codes + slot * kBN * 32 + i * 16, cs + i * 16, true);
      for (int i = tid; i < kBN * 2 / 16; i += kThreads)
        cpAsync16(s_scales + slot * kBN * 2 + i * 16, ss + i * 16, true);
    } else {
      __nv_bfloat16* sb = s_b + slot * kBN * kRowS;
      for (int i = tid; i < kBN * (kBK / 8); i += kThreads) {
        const int r = i / (kBK / 8);
        const int c = (i % (kBK / 8)) * 8;
        const int n = n0 + r;
        const int kk = kt * kBK + c;
        const bool valid = n < a.n && kk < a.k;
        const __nv_bfloat16* p =
            a.w + (valid ? (static_cast<int64_t>(e) * a.n + n) * a.k + kk : 0);
        cpAsync16(sb + r * kRowS + c, p, valid);
      }
    }
  };

  float acc[kMT][kNT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  const int warp = tid / 32;
  const int lane = tid & 31;
  const int wm = warp / kWN;
  const int wn = warp % kWN;
  const int row_base = wm * kMT * 16;
  const int col_base = wn * kNT * 8;
  const int mi = lane >> 3;
  const int mr = lane & 7;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kt_count) load_stage(s, s);
    cpAsyncCommit();
  }
  for (int kt = 0; kt < kt_count; ++kt) {
    cpAsyncWait<kStages - 2>();
    __syncthreads();
    {
      const int nk = kt + kStages - 1;
      if (nk < kt_count) load_stage(nk, nk % kStages);
      cpAsyncCommit();
    }
    const int slot = kt % kStages;
    const __nv_bfloat16* sb;
    if constexpr (kMx) {
      const uint8_t* codes = s_codes + slot * kBN * 32;
      const uint8_t* scales = s_scales + slot * kBN * 2;
      for (int u = tid; u < kBN * 2; u += kThreads) {
        const int r = u >> 1, h = u & 1;
        const uint4 raw = *reinterpret_cast<const uint4*>(codes + r * 32 + h * 16);
        const __nv_bfloat162 sc = e8m0Bf16x2(scales[r * 2 + h]);
        uint32_t outw[16];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const uint32_t word = w == 0 ? raw.x : w == 1 ? raw.y : w == 2 ? raw.z : raw.w;
#pragma unroll
          for (int bi = 0; bi < 4; ++bi) {
            const uint32_t pair = s_lut[(word >> (8 * bi)) & 0xff];
            __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&pair);
            v = __hmul2(v, sc);
            outw[w * 4 + bi] = *reinterpret_cast<const uint32_t*>(&v);
          }
        }
        uint4* dst = reinterpret_cast<uint4*>(s_bdq + r * kRowS + h * 32);
#pragma unroll
        for (int q = 0; q < 4; ++q)
          dst[q] = make_uint4(outw[4 * q], outw[4 * q + 1], outw[4 * q + 2], outw[4 * q + 3]);
      }
      __syncthreads();
      sb = s_bdq;
    } else {
      sb = s_b + slot * kBN * kRowS;
    }
    const __nv_bfloat16* sa = s_a + slot * kBM * kRowS;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        ldmatrixX4(af[mt], sa + (row_base + mt * 16 + (lane & 15)) * kRowS + ks * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int nt2 = 0; nt2 < kNT / 2; ++nt2) {
        uint32_t b[4];
        ldmatrixX4(b, sb + (col_base + nt2 * 16 + (mi >> 1) * 8 + mr) * kRowS + ks * 16 + (mi & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mmaBf16(acc[mt][2 * nt2], af[mt], b[0], b[1]);
          mmaBf16(acc[mt][2 * nt2 + 1], af[mt], b[2], b[3]);
        }
      }
    }
  }
  cpAsyncWait<0>();

  const int g8 = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const int64_t ra = m0 + row_base + mt * 16 + g8;
    const int64_t rb = ra + 8;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int col = n0 + col_base + nt * 8 + 2 * t4;
      if (col >= a.n) continue;
      float b0 = 0.f, b1 = 0.f;
      if (a.bias != nullptr) {
        b0 = __bfloat162float(a.bias[static_cast<int64_t>(e) * a.n + col]);
        b1 = __bfloat162float(a.bias[static_cast<int64_t>(e) * a.n + col + 1]);
      }
      const float* c = acc[mt][nt];
      if constexpr (kEpi == MoeGemmEpilogue::kSwiglu) {
        const float lim = a.swiglu_limit, alpha = a.swiglu_alpha;
        auto act = [&](float gate, float up) {
          const float g = fminf(gate, lim);
          const float u = fminf(fmaxf(up, -lim), lim);
          return g / (1.f + expf(-alpha * g)) * (u + 1.f);
        };
        const int half_n = a.n / 2;
        a.out[ra * half_n + col / 2] = __float2bfloat16(act(c[0] + b0, c[1] + b1));
        a.out[rb * half_n + col / 2] = __float2bfloat16(act(c[2] + b0, c[3] + b1));
      } else {
        *reinterpret_cast<uint32_t*>(a.out + ra * a.n + col) = packBf16x2(c[0] + b0, c[1] + b1);
        *reinterpret_cast<uint32_t*>(a.out + rb * a.n + col) = packBf16x2(c[2] + b0, c[3] + b1);
      }
    }
  }
}

template <int kWM, int kWN, int kMT, int kNT, int kStages, bool kMx, MoeGemmEpilogue kEpi>
Status launchInstance(const MoeGemmArgs& a, cudaStream_t stream) {
  constexpr int kBM = kWM * kMT * 16;
  constexpr int kBN = kWN * kNT * 8;
  constexpr size_t smem = moeGemmSmemBytes<kBM, kBN, kStages, kMx>();
  auto kernel = moeGemmKernel<kWM, kWN, kMT, kNT, kStages, kMx, kEpi>;
  static bool configured = false;  // one attribute call per instance (load time, not captured)
  if (!configured) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
    configured = true;
  }
  const dim3 grid(static_cast<unsigned>(a.max_tiles),
                  static_cast<unsigned>((a.n + kBN - 1) / kBN));
  kernel<<<grid, kWM * kWN * 32, smem, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

template <bool kMx, MoeGemmEpilogue kEpi>
Status launchTile(const MoeGemmArgs& a, cudaStream_t stream) {
  switch (a.block_m) {
    // Few rows per expert (decode): one warp per 16 x 32 tile, 6 stages in flight, so the
    // weight stream is spread over many blocks with many loads outstanding.
    case 16: return launchInstance<1, 1, 1, 4, 6, kMx, kEpi>(a, stream);
    case 64: return launchInstance<2, 4, 2, 4, 3, kMx, kEpi>(a, stream);
    case 128: return launchInstance<4, 2, 2, 8, 3, kMx, kEpi>(a, stream);
    default: return invalidArgument("moe_gemm: block_m must be 16, 64 or 128");
  }
}

__global__ void mxfp4PackKernel(const uint8_t* src_codes, const uint8_t* src_scales, int64_t first,
                                int64_t count, int64_t n, int64_t groups, int64_t n_tiles,
                                int64_t k_tiles, uint8_t* codes, uint8_t* scales) {
  const int64_t total = count * n_tiles * k_tiles * kPackN;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i % kPackN;
    const int64_t kt = (i / kPackN) % k_tiles;
    const int64_t nt = (i / (kPackN * k_tiles)) % n_tiles;
    const int64_t el = i / (kPackN * k_tiles * n_tiles);
    const int64_t row = nt * kPackN + r;
    const int64_t tb = ((first + el) * n_tiles + nt) * k_tiles + kt;
    uint4* dst = reinterpret_cast<uint4*>(codes + tb * (kPackN * 32) + r * 32);
    uint8_t* dsc = scales + tb * (kPackN * 2) + r * 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t g = 2 * kt + h;
      if (row < n && g < groups) {
        const int64_t src = (el * n + row) * groups + g;
        dst[h] = *reinterpret_cast<const uint4*>(src_codes + src * 16);
        dsc[h] = src_scales[src];
      } else {
        dst[h] = make_uint4(0, 0, 0, 0);
        dsc[h] = 127;
      }
    }
  }
}

}  // namespace

int32_t moeGemmBlockM(int64_t assignments, int32_t num_experts) {
  const int64_t avg = assignments / (num_experts > 0 ? num_experts : 1);
  if (avg <= 24) return 16;
  if (avg <= 96) return 64;
  return 128;
}

Status checkMoeGemm(const MoeGemmArgs& a) {
  const bool mx = a.codes != nullptr;
  if (mx == (a.w != nullptr))
    return invalidArgument("moe_gemm: exactly one of bf16 weights and MXFP4 codes");
  if (mx && a.scales == nullptr) return invalidArgument("moe_gemm: MXFP4 scales missing");
  if (a.n <= 0 || a.n % 2 != 0) return invalidArgument("moe_gemm: N must be positive and even");
  if (a.k <= 0 || a.k % (mx ? 32 : 8) != 0)
    return invalidArgument(mx ? "moe_gemm: K must be a multiple of 32 (MXFP4 groups)"
                              : "moe_gemm: K must be a multiple of 8");
  if (a.block_m != 16 && a.block_m != 64 && a.block_m != 128)
    return invalidArgument("moe_gemm: block_m must be 16, 64 or 128");
  if (a.max_tiles <= 0 || a.num_experts <= 0)
    return invalidArgument("moe_gemm: empty tile list or no experts");
  if (reinterpret_cast<uintptr_t>(a.a) % 16 != 0 || reinterpret_cast<uintptr_t>(a.w) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.codes) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.scales) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.out) % 4 != 0)
    return invalidArgument("moe_gemm: operands must be 16-byte aligned (out 4-byte)");
  return okStatus();
}

Status launchMoeGemm(const MoeGemmArgs& a, cudaStream_t stream) {
  RETURN_IF_ERROR(checkMoeGemm(a));
  const bool mx = a.codes != nullptr;
  if (a.epilogue == MoeGemmEpilogue::kSwiglu) {
    return mx ? launchTile<true, MoeGemmEpilogue::kSwiglu>(a, stream)
              : launchTile<false, MoeGemmEpilogue::kSwiglu>(a, stream);
  }
  return mx ? launchTile<true, MoeGemmEpilogue::kBias>(a, stream)
            : launchTile<false, MoeGemmEpilogue::kBias>(a, stream);
}

Status launchMxfp4Pack(const uint8_t* src_codes, const uint8_t* src_scales, int64_t first,
                       int64_t count, const Mxfp4PackedShape& shape, uint8_t* codes,
                       uint8_t* scales, cudaStream_t stream) {
  if (shape.k % 32 != 0 || shape.n <= 0 || first < 0 || first + count > shape.experts)
    return invalidArgument("mxfp4_pack: bad shape");
  const int64_t total = count * shape.n_tiles() * shape.k_tiles() * kPackN;
  if (total == 0) return okStatus();
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 65535);
  mxfp4PackKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      src_codes, src_scales, first, count, shape.n, shape.k / 32, shape.n_tiles(),
      shape.k_tiles(), codes, scales);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return okStatus();
}

}  // namespace garden::rose::cuda
