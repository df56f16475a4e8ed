#pragma once
// The accumulator operands of wgmma m64nNk16 with f32 accumulators, N = 16, 32, ..., 256 (M = N / 2
// registers per thread), shared by the register-A and shared-memory-A wrappers
// (sm90_wgmma_rs.cuh, sm90_wgmma_ss.cuh): GARDEN_WGMMA_D_<M>, the "%0, ..., %(M - 1)" list of the
// instruction text, and GARDEN_WGMMA_DOUT_<M>, the matching "+f"(d[i]) output operands, each list
// the previous one and 8 more. Inline PTX takes no arrays, so the lists are spelled out; written
// by a short generator, kept as text.

#define GARDEN_WGMMA_D_8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define GARDEN_WGMMA_DOUT_8 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), \
  "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define GARDEN_WGMMA_D_16 GARDEN_WGMMA_D_8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define GARDEN_WGMMA_DOUT_16 \
  GARDEN_WGMMA_DOUT_8, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), \
  "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define GARDEN_WGMMA_D_24 GARDEN_WGMMA_D_16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define GARDEN_WGMMA_DOUT_24 \
  GARDEN_WGMMA_DOUT_16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
  "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
#define GARDEN_WGMMA_D_32 GARDEN_WGMMA_D_24 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define GARDEN_WGMMA_DOUT_32 \
  GARDEN_WGMMA_DOUT_24, "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
  "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define GARDEN_WGMMA_D_40 GARDEN_WGMMA_D_32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define GARDEN_WGMMA_DOUT_40 \
  GARDEN_WGMMA_DOUT_32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
  "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define GARDEN_WGMMA_D_48 GARDEN_WGMMA_D_40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define GARDEN_WGMMA_DOUT_48 \
  GARDEN_WGMMA_DOUT_40, "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
  "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#define GARDEN_WGMMA_D_56 GARDEN_WGMMA_D_48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define GARDEN_WGMMA_DOUT_56 \
  GARDEN_WGMMA_DOUT_48, "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), \
  "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
#define GARDEN_WGMMA_D_64 GARDEN_WGMMA_D_56 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define GARDEN_WGMMA_DOUT_64 \
  GARDEN_WGMMA_DOUT_56, "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
  "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define GARDEN_WGMMA_D_72 GARDEN_WGMMA_D_64 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define GARDEN_WGMMA_DOUT_72 \
  GARDEN_WGMMA_DOUT_64, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), \
  "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])
#define GARDEN_WGMMA_D_80 GARDEN_WGMMA_D_72 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define GARDEN_WGMMA_DOUT_80 \
  GARDEN_WGMMA_DOUT_72, "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), \
  "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
#define GARDEN_WGMMA_D_88 GARDEN_WGMMA_D_80 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define GARDEN_WGMMA_DOUT_88 \
  GARDEN_WGMMA_DOUT_80, "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), \
  "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
#define GARDEN_WGMMA_D_96 GARDEN_WGMMA_D_88 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define GARDEN_WGMMA_DOUT_96 \
  GARDEN_WGMMA_DOUT_88, "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), \
  "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define GARDEN_WGMMA_D_104 GARDEN_WGMMA_D_96 ", %96, %97, %98, %99, %100, %101, %102, %103"
#define GARDEN_WGMMA_DOUT_104 \
  GARDEN_WGMMA_DOUT_96, "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), \
  "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103])
#define GARDEN_WGMMA_D_112 GARDEN_WGMMA_D_104 ", %104, %105, %106, %107, %108, %109, %110, %111"
#define GARDEN_WGMMA_DOUT_112 \
  GARDEN_WGMMA_DOUT_104, "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), \
  "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
#define GARDEN_WGMMA_D_120 GARDEN_WGMMA_D_112 ", %112, %113, %114, %115, %116, %117, %118, %119"
#define GARDEN_WGMMA_DOUT_120 \
  GARDEN_WGMMA_DOUT_112, "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), \
  "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119])
#define GARDEN_WGMMA_D_128 GARDEN_WGMMA_D_120 ", %120, %121, %122, %123, %124, %125, %126, %127"
#define GARDEN_WGMMA_DOUT_128 \
  GARDEN_WGMMA_DOUT_120, "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), \
  "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
