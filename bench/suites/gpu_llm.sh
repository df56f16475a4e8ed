#!/usr/bin/env bash
# The gpt-oss GPU work in ONE device call, building nothing. Input GPUBIN (bench/suites/gpu_pack.sh
# with the LLM binaries) and an output folder; steps (each with a time limit, all under
# SESSION_DEADLINE_S, default 560 s):
#   llmops    gpu_llm_ops_test: every gpt-oss CUDA op vs the CPU reference ops
#   llmsel    gpu_llm_ops_test: the MoE and sampler cases only
#   moeops    gpu_llm_ops_test: the router, route and MoE expert cases only
#   decode20b rose_llm_bench decode 1@8192 and 64@1024 only (needs mk20b)
#   pdltests  [TAG_PDL_GEMV] gpu_kernels_test's GEMV cases and gpu_llm_model_test's
#             PdlGemvGivesTheSameBits (+ graphs == eager, combine-norm, batch independence)
#   attnwarps [TAG_ATTN_DECODE_WARPS] gpu_llm_ops_test's attention cases (the single-token cases on
#             both paths), then compute-sanitizer memcheck over the decode cases of both paths
#   attncarve decode 1@8192, 8@4096, 64@1024 with --attn-decode-warps on / off, each with the
#             driver's shared-memory carveout and with --attn-carveout 100 (RoPE, attention and
#             combine under one carveout), two rounds (needs mk20b) [TAG_ATTN_DECODE_WARPS]
#   f16speed  prefill 8k (median of 3) and decode 1@8192, 64@1024 with the default dtype and with
#             --dtype float16 (needs mk20b)
#   embpdl    a random Qwen3-Embedding-0.6B-shaped checkpoint, then rose_forward_bench with
#             GARDEN_PDL_GRAPH=0 and =1 (the embedding graphs' programmatic RMSNorms)
#   pdlgraph  [TAG_PDL_GRAPH] gpu_llm_model_test's PdlGraphGivesTheSameBits, then with
#             GARDEN_PDL_GRAPH=1 the whole gpu_llm_model_test, gpu_llm_ops_test and the embedding
#             GPU tests (programmatic launches everywhere they apply)
#   decab     decode 1@8192, 8@4096, 64@1024 (DECAB_DECODE) per rose_llm_bench flag set in
#             DECAB_VARIANTS (default: --pdl-gemv on, the default, --gemm-gemv on; e.g.
#             "'--moe-decode-variant 0' '--moe-decode-variant 5'"), DECAB_ROUNDS times in turn
#             (default 2; needs mk20b)
#   moedec    gpu_llm_ops_test's decode / K-slice / expert / wide MoE cases (every decode kernel
#             shape against the tiled kernel), then compute-sanitizer memcheck over the expert and
#             K-slice cases
#   rowinv    [TAG_GEMM_ROW_INVARIANT] gpu_kernels_test's row-invariance, small-bucket and K-chain kernel cases, then
#             the whole gpu_llm_model_test with GARDEN_GEMM_ROW_INVARIANT=1
#   rowinvab  decode 1@8192, 8@4096, 64@1024 with --gemm-row-invariant on / off (needs mk20b)
#   chainpdl  [TAG_CHAIN_PDL] gpu_kernels_test's K-chain cases (the programmatic launch's bits, its
#             input read after the previous kernel), the whole gpu_llm_model_test with
#             GARDEN_CHAIN_PDL=1, then rose_llm_bench --batch-check 8,64 --chain-pdl on (needs mk20b)
#   chainpdlab  decode 1@8192, 8@4096, 64@1024 with --chain-pdl on / off (needs mk20b)
#   rowinvpf  prefill 8k / 32k (median of 3) with --gemm-row-invariant on / off (needs mk20b)
#   ssops     [TAG_MOE_WGMMA_SMEM_A] GpuFp8Moe.WgmmaExperts* (the shared-memory-A form's bits,
#             host and device plan, against the tiled kernels), then the wgmma / batch model tests
#             with GARDEN_MOE_WGMMA_SMEM_A=1
#   ssmem     compute-sanitizer memcheck over GpuFp8Moe.WgmmaExperts* (both consumer forms)
#   ssab      20b prefill 8k / 32k (median of 3) with --moe-wgmma-smem-a on / off (needs mk20b)
#   ssab120b  the same at 120b, KV for 40k tokens (fits an H100; needs mk120b)
#   ssncu120b ncu --set full on the first two wgmma launches of a 120b 8k prefill with
#             --moe-wgmma-smem-a on (needs mk120b; wgncufull120b is the register form)
#   batchcheck  [TAG_BATCH_CHECK] rose_llm_bench --batch-check 8,64 on the 20b checkpoint: one
#             sequence's tokens and logits alone and inside batches of 8 / 64, with
#             --gemm-row-invariant on (the step's result) and off (reported) (needs mk20b)
#   f16suite  the whole gpu_llm_model_test with GARDEN_TEST_GPTOSS_DTYPE=float16, then its dtype,
#             FP8 and bf16 cuBLASLt cases without it
#   embcheck  gpu_model_graph_test (the embedding graphs: graphed == eager), then rose_forward_bench
#             on a random Qwen3-Embedding-0.6B-shaped checkpoint (its RMSNorms plain in graphs)
#   f16moe    [TAG_MOE_F16_OUT_SCALE] gpu_llm_ops_test's fp16 expert outputs past fp16's range (every
#             expert kernel), the MoE op against the CPU (bf16 and fp16) and the wgmma cases, then
#             the whole gpu_llm_model_test with GARDEN_TEST_GPTOSS_DTYPE=float16
#   decbshapes  gpu_llm_ops_test: the decode MoE kernel shapes and K slices cases
#   decbgemm  rose_llm_bench --moe-gemm at 1..96 tokens (DECB_TS), one K chain: every decode shape
#   llmmodel  gpu_llm_model_test: tiny checkpoint end to end vs the CPU reference (writes the
#             bf16-bar inputs to /tmp/llm_bar)
#   hfbar     tests/gpu/hf_llm_bar.py: Hugging Face transformers (fp32, fp32+TF32, bf16) on the same
#             positions; rose's CUDA top-1 agreement must reach HF fp32+TF32's
#   regress   the embedding GPU tests (gpu_kernels_test, gpu_graph_test, gpu_model_graph_test)
#   memcheck  compute-sanitizer memcheck over the LLM ops test (a subset of cases)
#   mk20b     bench/suites/make_random_gpt_oss.py: a random gpt-oss-20b-shaped MXFP4 checkpoint
#   bench20b  rose_llm_bench on it: load, prefill 2k/8k/32k, decode 1@8192 and 64@1024
#   bench20b_bf16  the same with the experts dequantized to bf16 at load (--moe-weights bf16)
#   bench20b_fp8   prefill 2k/8k/32k with --moe-weights fp8 (the experts' FP8 e4m3 copy with 128x128
#             block scales, cuBLASLt block-scaled GEMMs per expert, for MoE steps of >= 257
#             tokens; decode stays MXFP4) — compare its prefill lines with bench20b's
#   bench20b_bf16res  prefill 8k and decode with the bf16 residual stream (GptOssOptions::f32_residual
#             off): the speed side of the f32 stream
#   routeracc the routed tiny model's teacher-forced agreement with the CPU (gpu_llm_model_test
#             RoutedModelTeacherForcedAgainstTheCpu + the no-routing test) per accuracy knob: the
#             default (f32 router [TAG_ROUTER_F32], norm rounded once), the router on the bf16 row,
#             the norm rounded twice, and both old settings (the previous default)
#   bench20b_router  prefill 8k and decode with the router on the bf16 row (--router bf16): the
#             speed side of the f32 router, against bench20b
#   masks     decode 64@1024 with and without --masks 0.05 (rose's side of the structured-output
#             cost; needs mk20b)
#   bar20b    the real-shape accuracy bar (needs mk20b): rose_llm_bench --bar-dump on prompts of
#             16..2100 tokens (default settings, then --router bf16 --norm-round twice as
#             the A/B), then bench/suites/hf_llm_bar20b.py: transformers fp32 (reference) and
#             fp32+TF32 on the same tokens; rose's top-1 agreement must reach TF32's
#   bar2l     the same bar on a 2-layer 20b-shaped checkpoint (every real-shape kernel, little depth
#             for rounding to grow through): tells a kernel error from amplified rounding
#   ncudec    ncu --set full on the first MXFP4 decode-kernel launches of rose_llm_bench --moe-gemm 1,64
#             (occupancy, stall reasons, memory throughput of the decode MoE kernel)
#   fp8ops    gpu_llm_ops_test GpuFp8Moe.*: requant, activation quant and the FP8 experts vs the CPU
#   moegemm_fp8  rose_llm_bench --moe-gemm with --moe-weights fp8: the MoE op alone, MXFP4 kernels
#             and the FP8 path side by side per token count (the FP8 row's rel_l2 vs MXFP4)
#   hfpeer    bench/suites/hf_llm_peer.py: Hugging Face transformers (bf16, eager) on the same
#             checkpoint and shapes, the peer of bench20b (needs mk20b)
#   wgops     gpu_llm_ops_test GpuFp8Moe.WgmmaExperts*: the wgmma MXFP4 expert GEMM [TAG_MOE_WGMMA]
#             against the tiled kernels, the cuBLASLt path and the f32 reference
#   wgmodel   gpu_llm_model_test: the wgmma kernel in the model (batch independence, teacher-forced
#             against the tiled kernels) beside the cuBLASLt path's chunk tests
#   wgab / wgab120b  prefill 8k / 32k (median of 3) with --moe-lt-wgmma on and off (20b also 64k,
#             128k with it on; needs mk20b / mk120b)
#   wgncu     per-kernel times of an 8k 20b prefill with the wgmma kernel (ncu)
#   wgncufull ncu --set full on the first two wgmma launches of an 8k 20b prefill (gate_up, down)
#   wgncufull120b  the same at 120b (needs mk120b)
#   wgcross   prefill with the chunk path from 1 row per expert (the wgmma kernel by default)
#             against the tiled kernels: 20b 512..2048 tokens, 120b 2k..8k (the threshold)
#   wgmem     compute-sanitizer memcheck over the wgmma op test
#   wgsass    where the wgmma kernel's register spills sit (bench/suites/sass_spills.py)
#   wgcross2  the chunk path from 1 row per expert against the tiled kernels at small chunks (20b
#             128..512 tokens, 120b 512..1536)
#   wgncu120  per-kernel times of an 8k 120b prefill (ncu)
#   rowsab    20b prefill 8k / 32k (median of 3) with the tiled router's rows staged as they lie
#             (--router-tiled-rows on) and transposed (off) [TAG_ROUTER_F32_TILED_ROWS]
#   wgplan    the wgmma path with its tiles planned on the device [TAG_MOE_WGMMA_DEVICE_PLAN]: the op
#             test (the device plan's bits = the host plan's, also after a larger step) and the
#             model tests (tokens = the host plan's); wgplanmem: memcheck over the op test
#   wgplanab / wgplanab120b  prefill 8k / 32k (median of 3) with --moe-wgmma-device-plan on and
#             off (needs mk20b / mk120b)
#   figs / figs120b  the figures with the defaults (+ ${FIGS_FLAGS:-}): prefill 8k / 32k (median of 5)
#             and 64k / 128k, decode (20b: 1@8192, 64@1024; 120b: 1@8192), each with its GPU span
#             (needs mk20b / mk120b); figs also says whether nsys is on the host (it was not,
#             2026-12-04 s12)
#   alignops  gpu_llm_ops_test *MoeAlign* (incl. the multi-block align [TAG_MOE_ALIGN_MULTIBLOCK]
#             against the CPU layout), then memcheck over the block-kernel case
#   tokab / tokab120b  prefill 8k / 32k (median of 3) with the tiled router's 32- and 64-token
#             tiles [TAG_ROUTER_F32_TILED_TOK] (needs mk20b / mk120b)
#   alignab / alignab120b  prefill 8k / 32k (median of 3) with --moe-align-multiblock on / off
#             (needs mk20b / mk120b)
#   tiledab / tiledab120b  prefill 8k / 32k (median of 3) with the f32 router's register-tiled
#             kernel for steps of >= 128 tokens (the default) and without (--router-tiled-min 0),
#             then 64k / 128k (and 120b decode b1) with the defaults [TAG_ROUTER_F32_TILED]
#   autoab    256 streams 1k/1k through the mesh with GARDEN_MOE_PREFILL=auto (the default: whole
#             steps on the wgmma kernel) and chunk [TAG_MOE_PREFILL_AUTO]
#   routerops gpu_llm_ops_test '*MoeRoute*': the route and both f32 routers (the CUDA-core kernel and
#             the tensor-core one [TAG_ROUTER_MMA]) against the CPU and f64 sums
#   routermem compute-sanitizer memcheck over the router tests
#   routerab / routerab120b  prefill 8k / 32k (median of 3) and decode with --router-mma on and off
#             (needs mk20b / mk120b)
#   stepab    256 streams 1k/1k through the mesh with GARDEN_MOE_PREFILL=step (whole steps on the
#             MoE prefill path) and chunk (the default)
#   sweepab   256 streams 1k/1k through the mesh with the wgmma kernel (default: chunks from 64 rows
#             per expert take it) and without (GARDEN_MOE_LT_WGMMA=0: the cuBLASLt GEMMs from 256)
#   mesh      bench/suites/gpu_mesh_smoke.sh: tulip + rose --device cuda + ivy on the 20b-shaped
#             checkpoint (needs mk20b, and the gpt-oss tokenizer.json at GPUBIN/tokenizer.json),
#             HTTP chat / stream / completions / concurrent chats through ivy
#   moegemm   rose_llm_bench --moe-gemm: the MoE experts op alone at 20b shapes, per K slice count
#             (1, 2, 4, 8 [TAG_MOE_K_SLICES]), decode-kernel shape and token count (each shape's
#             bits checked against the tiled kernel's at the same slicing)
#   sweepjson the constrained-decode cost through the mesh (issue 18's <= 5 % at batch 64): 64
#             streams of 1k-in / 512-out chats without response_format, with json_object (tulip's
#             defaults), with json_object and --llm-constrained-overlap (constrained sequences
#             every other step), and with json_object and --mask-threads 0 (masks filled
#             serially); tulip's mask counters beside each (needs mk20b, GPUBIN/tokenizer.json)
#   latemask  late token masks on CUDA [TAG_LATE_MASKS]: gpu_llm_model_test's LateMasks case (the
#             check behind kLateMaskVerified), then 64 streams of 1k-in / 512-out chats without
#             response_format, with a json_schema that keeps every stream 512 tokens long
#             (bench/suites/schemas/long_arrays.json: the whole batch stays constrained) with rose
#             --late-masks=off (one step in flight while constrained), and as the default runs it
#             (planned ahead, masks late; needs mk20b, GPUBIN/tokenizer.json)
#   fusecn    the MoE combine fused into the next RMSNorm [TAG_COMBINE_NORM]: gpu_llm_model_test's
#             CombineNorm case (same bits as the two kernels), then decode 1@8192 and 64@1024
#             with --fuse-combine-norm off / on (needs mk20b)
#   moewide   gpu_llm_ops_test: the MoE cases (incl. MoeWideKernelEqualsTheTiledKernel
#             [TAG_MOE_WIDE]) and the paged attention cases
#   widegemm  rose_llm_bench --moe-gemm at 1..512 tokens, one K chain: the tiled kernel, the
#             decode kernel's shapes, the wide kernel's shapes at block_m 64 (bits compared with
#             the tiled kernel's), and the default choice
#             (MOEWIDE_FILTER / WIDEGEMM_TS: other test filter / token counts)
#   wideab    decode 1@8192, 64@1024, 256@1024 with the default and --moe-wide off (needs mk20b)
#   smallgemm GpuOps.Linear* (incl. LinearSmallBucketsNestPowerOfTwoGraphs), then decode at 1, 2, 4,
#             8 and 64 sequences with --gemm-small-buckets on / off [TAG_GEMM_SMALL_BUCKETS]
#             (needs mk20b; the "gemm tuned" lines say which kernel each bucket took)
#   gemv      GpuOps.Gemv* + GpuOps.Linear* (the CUDA-core GEMV [TAG_GEMV] vs the host, its bits
#             across M and shapes, the runner timing it), then decode at 1/2/4/8 sequences with
#             --gemm-gemv on / off (needs mk20b; the "gemm tuned" lines say what won each bucket)
#   moepf     rose_llm_bench --moe-gemm at 1..512 tokens with --moe-prefetch 0,8,16,32 (the decode
#             kernel's L2 prefetch distance [TAG_MOE_L2_PREFETCH]; bits checked per run), the wide
#             kernel and the default choice beside them
#   pfdec     decode 1@8192, 64@1024, 256@1024 (needs mk20b) with --moe-prefetch 0 / 8 / 16 / 32
#             (then GEMV on with the best guess: PFDEC_GEMV_PF)
#   ncusrc    ncu --set full on the first two MXFP4 decode-kernel launches at T = 1 and the first two
#             wide-kernel launches at T = 256 (rose_llm_bench --moe-gemm), reports kept; their
#             source pages as SASS with per-instruction stall samples (*.sass.csv; read them with
#             bench/suites/ncu_sass_stalls.py); NCUSRC_PF: the L2 prefetch distance (default 0, the
#             decode kernel's default, whose steady loop only runs without the prefetch)
#   declat    decode at 1/2/4/8 sequences and 64..256 @ 1k: the default, --moe-wide-min-avg 24 (the
#             previous threshold) and --moe-prefetch 0 (needs mk20b)
#   flushab   decode at 1/2/8 sequences and 64 @ 1k with the GEMM tuner's L2 flush as a memset
#             (write) or a read pass (read) [TAG_GEMM_READ_FLUSH], each with the GEMV off / on
#             (the "gemm tuned" lines say what each bucket took and timed)
#   fusedab   decode at 1/2/8 sequences and 64/256 @ 1k with the route inside the f32 router
#             kernel (--router-fused on [TAG_ROUTER_FUSED_ROUTE]) and as its own kernel (the default)
#   decdef    declat's first run only: decode at 1/2/4/8 sequences and 64..256 @ 1k, default settings
#   winmodel  the sliding-window KV pool on CUDA [TAG_KV_WINDOW_GROUP]: gpu_llm_model_test's
#             WindowPool case (bits equal to one pool, holes, reused blocks, decode graphs) and
#             DecodeGraphs, then memcheck over the WindowPool case
#   f16ops    [TAG_ATTN_F16] RoPE + KV write, every paged attention case (fp16 twins included) and
#             the MoE experts (fp16 beside bf16) vs the CPU, then memcheck over RoPE and 4 fp16 attention cases (44, 47: decode with
#             split-KV, prefill chunks in a window; 54, 57: the same on the Hopper kernel)
#   f16moeops f16ops' MoE experts tests alone
#   f16proj   [TAG_PROJ_F32] GpuOps.LinearF16* (fp16 operands, fp16 / f32 outputs and biases) and
#             GpuOps.LinearMatchesReference, the RoPE/KV cases (f32 input among them) with memcheck,
#             then the model suite with the fp16 attention block and its f32 projections alone
#             (GARDEN_TEST_GPTOSS_ATTN=float16 GARDEN_TEST_GPTOSS_PROJ=f32)
#   f16model  gpu_llm_model_test's Fp16Attention case (bf16 / fp16 attention / fp16 everywhere with
#             16-bit outputs / --dtype float16, teacher-forced on the routed model), then the model suite's property tests with
#             GARDEN_TEST_GPTOSS_ATTN=float16 (attention only) and GARDEN_TEST_GPTOSS_DTYPE=float16
#             (everything --dtype float16 covers)
#   f16bench  rose_llm_bench prefill 8k and decode 1@8192, 64@1024, 256@1024 in bf16, with
#             --dtype float16 and with --dtype float16 minus its f32 outputs (--proj-out f16
#             --moe-out act: the s14 form) (needs mk20b)
#   f16bar    the real-shape bar (bar20b): --dtype float16 first (the bar is checked on it), then
#             as A/B without the f32 projections (--proj-out f16), without the f32 MoE output
#             (--moe-out act) and without both (needs mk20b); f16bar2l (older form) on the 2-layer
#             checkpoint
#   f16barp   the bar20b prompts with --dtype float16 and each projection's f32 output alone
#             (--proj-out f16 / qkv / o): which of the two f32 outputs costs agreement (needs mk20b)
#   f16barx   the same bar on 12 prompts (the 5 of bar20b plus 7 more of 17..2101 tokens, each its own
#             seed) with --dtype float16 and with --dtype float16 --proj-out f16 (the better of the
#             two on bar20b's five, 2026-12-05 s18): within one long prompt positions are not independent
#             (once a trajectory parts, the positions after it part too), so one 2,100-token prompt
#             is a small sample; this says whether a gap on bar20b's five is systematic (needs mk20b)
#   winsweep  gpu_chat_sweep.sh at 256 streams with --kv-window-blocks 0 and 32000 (about what auto
#             gives 20b on the H200: 1/9 of ~115 GB; needs mk20b, GPUBIN/tokenizer.json)
#   attnops   the paged attention tests alone (mma.sync and Hopper kernels, plan checks)
#   attnmem   compute-sanitizer memcheck over paged attention cases 1x, 2x, 3x (Hopper ones among them)
#   attnsrc   ncu --set full over the first Hopper paged attention launch of --attn-bench
#             16384@16384: the SASS stall ledger (ncu_sass_stalls.py) and the details page
#   attnncu   ncu (speed of light, warp states, pipes) over the first Hopper paged attention launch
#             of --attn-bench 16384@49152
#   pattnbench rose_llm_bench --attn-bench: the paged attention op alone at prefill chunks with history,
#             mma.sync vs the Hopper kernel [TAG_PAGED_ATTN_SM90] (no model needed)
#   prefillab 20b prefill 8k/32k/64k/128k with --attn-prefill mma / sm90 / sm90c2 (needs mk20b;
#             prefillfp8 for the FP8 experts)
#   prefilldef / prefillfp8  20b prefill 8k/32k/64k/128k with the defaults / --moe-weights fp8
#             (needs mk20b)
#   ltops     GpuFp8Moe.*: the FP8 and the bf16 cuBLASLt expert paths [TAG_MOE_LT_BF16] against the CPU
#   ltmem     compute-sanitizer memcheck over the bf16 cuBLASLt path's tests
#   moegemm_lt  the MoE op alone at 512..8192 tokens: tiled / wide / FP8 / bf16 cuBLASLt
#   smallk / smallkmem  the RoPE/KV write, MoE align and the bf16 path's SwiGLU against the CPU (the
#             16-byte / range forms [TAG_ROPE_KV_VEC] [TAG_MOE_ALIGN_RANGES] [TAG_MOE_SWIGLU_VEC]), and
#             compute-sanitizer memcheck over the first two
#   ltstreams GpuFp8Moe.LtBf16Streams*: the path's bits under every way of running it, and with the
#             bf16 expert copy [TAG_MOE_BF16_COPY]
#   prefillcopy  20b prefill 8k..128k (median of 3) and decode 1@8192 with --moe-weights mxfp4-bf16
#             (needs mk20b)
#   ltab / ltab120b  20b / 120b prefill 8k and 32k (median of 3) for each way of running the bf16
#             cuBLASLt path [TAG_MOE_LT_STREAMS]: --moe-lt-streams N, --moe-lt-epilogue, --moe-lt-overlap
#             (needs mk20b / mk120b)
#   ltcrossnew  20b and 120b prefill at the sizes around the crossover, tiled vs step mode with the
#             defaults (where the path starts to win now; needs mk20b and mk120b)
#   ltcross2  the crossover again with 5 timed runs each: 20b 2k..6k, 120b 8k..16k tokens, tiled vs step
#             (needs mk20b and mk120b)
#   chunk120b 120b prefill 32k / 64k in 32k-token chunks (--max-batch-tokens 32768; needs mk120b)
#   prefilltiled / prefill120btiled  20b / 120b prefill 8k..128k on the tiled MXFP4 MoE kernels alone
#   prefilllt / prefill120blt  20b / 120b prefill 8k..128k with --moe-prefill cublas (= step; needs
#             mk20b / mk120b)
#   ltcross / ltcross120b  20b / 120b prefill from 1k tokens up, --moe-prefill tiled then cublas with
#             --moe-prefill-min-rows 1 (steps of >= 1024 tokens): where the bf16 cuBLASLt path starts to
#             win (needs mk20b / mk120b)
#   proflt    ncu over one 8k 20b prefill with --moe-prefill cublas: time per kernel, summed by name
#   prefill128k  20b prefill of one 64k and one 128k request (issue 16's table; never run yet),
#             MXFP4 experts then the FP8 copy (needs mk20b; KV for 140k tokens)
#   sweepfp8  gpu_chat_sweep.sh at 256 streams with rose --moe-weights fp8 (prefill steps of
#             >= 257 tokens on the FP8 experts; prefill is 25-30 % of that run's wall)
#   sweep256  gpu_chat_sweep.sh at 256 concurrent streams only (the saturated row; needs mk20b)
#   dec512    decode steps at 256 / 384 / 512 / 768 sequences @ 1k (rose_llm_bench; needs mk20b): what
#             a running set above 256 costs per token
#   sweep512  gpu_chat_sweep.sh with a running set of 512 (MAX_NUM_SEQS=512) and two requests per
#             client (REQS_PER_CLIENT=2: the second wave's prefill mixes with the first's decode),
#             at 256 and 512 streams (needs mk20b, GPUBIN/tokenizer.json)
#   ncuwide   ncu --set full on the first two wide-kernel launches of --moe-gemm 256
#   widedec   decode 1@8192, 64/128/256@1024 (needs mk20b): the default, --moe-wide off,
#             --moe-wide-min-avg 16 / 8 / 4, --attn-split-keys 256 / 128
#   grammar   bench/grammar/grammar_bench on the GPU host's CPUs (structured outputs: schema compile,
#             token tables cold / with tulip's JSON prewarm, per-token masks; needs
#             GPUBIN/tokenizer.json, which gpu_pack.sh adds when the checkout has it)
#   sliceab   decode 1@8192 and 64@1024 with one K chain (--moe-k-slices 1, the default), then
#             with 2 slices (needs mk20b): the model-level side of moegemm
#   sass      the decode MoE kernels' instruction digest (cuobjdump: where the loads sit)
#   ipc       gpu_ipc_test: two processes on the GPU, CUDA-IPC all-reduce and KV-block handoff
#   disagg    [TAG_KV_PULL_CUDA] gpu_ipc_test (the named device export and the window-aware block
#             copy between two processes), then gpu_disagg_test (tulip --disaggregate --device cuda,
#             two roses on one GPU, against one rose)
#   shard1gpu issue 19's CUDA ranks on one GPU: gpu_shard_test (the CUDA shard ops vs the CPU, then
#             the sharded model on rank threads with staged collectives vs the single-GPU model,
#             six layouts), compute-sanitizer memcheck over the shard ops, then gpu_ranks_test
#             (tulip over `rose --device cuda --tp 2 --ep 2` / `--dp 2 --ep 2` rank processes
#             against the unsharded rose; GPUBIN's rose and tulip)
#   sm90      gpu_kernels_test AttentionSm90.* once per Hopper attention variant (each under its own
#             time limit, so a hang in one leaves the others' results)
#   attnbench rose_kernel_bench attention: every attention variant side by side
#   embfp8    [TAG_EMBED_FP8] gpu_kernels_test (all: the FP8 dense ops and the RMSNorm / SwiGLU they
#             change), gpu_model_graph_test (all, ModelFp8Test included), then a random
#             Qwen3-Embedding-0.6B-shaped model: rose_forward_bench --weights-ab (bf16 vs fp8)
#   embfp8m   embfp8 without gpu_kernels_test (the model tests and the forward A/B only)
#   attnfp8ab [TAG_ATTN_FP8_OUT] rose_forward_bench --weights-ab with GARDEN_ATTN_FP8_OUT=0 / 1
#             (the O-proj operand quantized by its own kernel / from the attention's epilogue)
#   embstreams  rose_forward_bench --streams-ab: embedding batches on one stream vs two (a
#             second batch in flight), 16x512 / 8x1024 / 2x4096 / 1x512 / 4x128
#   elem      rose_kernel_bench elementwise: the elementwise kernels' bandwidth at 8192 tokens
#             (QK-norm + RoPE: every variant, also at 512 and 128 tokens; RMSNorm also at 128 / 512 rows)
#   qkab      [TAG_QK_ROPE_PAIR] the forward with the legacy QK-norm + RoPE kernel beside the
#             pair kernel (auto, 4 and 2 heads per warp) and the legacy one again (the noise),
#             rose_forward_bench --ab on a random Qwen3-Embedding-0.6B-shaped checkpoint
#             (QK-norm + RoPE, its bytes by the copy engine, SwiGLU, RMSNorm)
#   elemncu   ncu (speed of light, memory, occupancy, warp stalls) on the first launch each of
#             QK-norm + RoPE, SwiGLU and RMSNorm in rose_kernel_bench elementwise (8192 tokens)
#   embprof   bench/suites/gpu_profile.sh at 16x512 and 1x128: the embedding forward's kernels
#             (ncu durations of the second eager pass) summed by family
#   gemmfp8   rose_kernel_bench gemm_fp8: the Qwen3 layer GEMMs in bf16 (tuned runner) beside FP8
#             e4m3 with block, outer-vector and per-tensor scales [TAG_EMBED_FP8]
#   prefill120b  120b prefill 8k/32k/64k/128k (issue 16's table; needs mk120b)
#   mk120b    the same at gpt-oss-120b's shapes, in /dev/shm (the GPU machine's disk is too small;
#             rose mmaps the files from the page cache)
#   bench120b rose_llm_bench on it with a KV cache for 140k tokens: load, memory, prefill, decode
#   bench20b_nograph  decode as bench20b with --cuda-graphs off (what the graphs save)
#   profdec   ncu over one decode step of 1@8192 and of 64@1024, caches left warm (--cache-control
#             none: weights come from HBM anyway at these sizes, the small tensors stay in L2 as in
#             a real step)
#   sweepttft the sweep with SKIP_REASONING=true (the answer starts on the final channel, so the
#             first generated token is content: TTFT is the engine's; without it a random model's
#             first tokens fill the Harmony header up to ivy's 256-token limit and TTFT is ~256
#             inter-token gaps longer), every prompt distinct; then 256 streams on a fresh mesh
#             with POOL=32 (32 prompts cycled, the sweeps before 2026-12-04 s12)
#   mbtab     256 streams (distinct prompts, engine TTFT) with tulip --max-batch-tokens 16384 and
#             8192, a fresh mesh each
#   sweep     bench/suites/gpu_chat_sweep.sh: 1k-in/1k-out streamed chats through ivy at 1/16/64/256
#             concurrent streams (TTFT, inter-token p50/p99, output tokens/s; needs mk20b)
#   prof      ncu over one decode step (1@8192) and one 8k prefill: time per kernel, summed by name
#             (bench/suites/ncu_summary.py)
#   gemmwgab  [TAG_GEMM_WG] the Hopper GEMM's GPU tests (GpuWgGemm.*), then the embedding forward
#             with it among the tuned GEMM candidates (gemmwg; gemmwgpdl: launched programmatically)
#             against cuBLASLt alone (gemmlt) at 1x128 ... 16x512; the tuning lines (per bucket:
#             best_us, best_cublaslt_us, best_wg_us, the winner) in wg_tuned.txt
#   gemmsmall rose_kernel_bench gemm_smallm: the few-token GEMMs on Qwen3-0.6B's linears at M = 1 ... 512,
#             cuBLASLt alone / + the small-M kernel / + the Hopper kernel as tuned runners and every
#             custom configuration directly, cold (one launch after an L2 flush) and chained (32
#             launches in a graph over weight copies streaming from HBM) and hot (the same chain over one
#             L2-resident copy)
#   tuneab    [TAG_GEMM_TUNE_CHAIN] the embedding GPU tests (gpu_kernels_test's Linear / GEMM cases,
#             gpu_model_graph_test) with GARDEN_GEMM_TUNE_VIEW=chain GARDEN_GEMM_WG=pdl, then the
#             embedding forward A/B gemmlt, gemmwgpdl, gemmlt+tunechain, gemmwgpdl+tunechain, gemmlt
#             at 1x128 ... 2x4096 (TUNEAB_SHAPES); the tuning lines in tune_tuned.txt
#     bench/suites/gpu_llm.sh GPUBIN OUT [steps...]
# Prints one summary line per step last; writes logs to OUT (and OUT/llm_logs.tgz).
set -uo pipefail
BIN="$(cd "$1" && pwd)"; OUT="$2"; shift 2
STEPS=${*:-llmops llmmodel hfbar regress memcheck mk20b bench20b prof}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"
LOGS=$(mktemp -d)
export LD_LIBRARY_PATH="$BIN/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
START=$(date +%s); DEADLINE=${SESSION_DEADLINE_S:-560}
summary=""; failed=0
# prefillab MODEL FLAG VALUE...: rose_llm_bench prefill 8k / 32k (median of 3) once per value of
# one flag (the A/B steps' common form; exported so `step` can run it).
prefillab() {
  local model=$1 flag=$2 v; shift 2
  for v in "$@"; do
    echo "== $flag $v"
    "$BIN/rose_llm_bench" --model "$model" --prefill 8192,32768 --prefill-reps 3 --decode '' \
      --max-batch-tokens 16384 --kv-tokens "${PREFILL_KV:-140000}" "$flag" "$v" 2>&1 | grep -v 'gemm tuned'
  done
}
export -f prefillab
# ncuwg MODEL KV [FLAGS...]: ncu --set full on the first two wgmma MoE launches (gate_up, down) of
# an 8k prefill.
ncuwg() {
  local model=$1 kv=$2; shift 2
  ncu --set full -k regex:moeWgmma -c 2 "$BIN/rose_llm_bench" --model "$model" --prefill 8192 \
    --decode '' --max-batch-tokens 16384 --kv-tokens "$kv" "$@" 2>&1 | grep -v 'gemm tuned' | tail -260
}
export -f ncuwg
export BIN
step() {  # step NAME LOG LIMIT CMD...
  local name=$1 log=$2 limit=$3; shift 3
  local left=$(( DEADLINE - ($(date +%s) - START) ))
  if [ $left -lt 10 ]; then summary+="$name SKIPPED (budget)"$'\n'; failed=$((failed+1)); return; fi
  [ $limit -gt $left ] && limit=$left
  local t0=$(date +%s)
  timeout "$limit" bash -c '"$@"' _ "$@" >"$LOGS/$log" 2>&1
  local rc=$? dt=$(( $(date +%s) - t0 ))
  [ $rc -ne 0 ] && failed=$((failed+1))
  summary+="$(printf '%-9s rc=%-3s %4ss %s' "$name" "$rc" "$dt" "$log")"$'\n'
  echo "== $name rc=$rc ${dt}s"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|ERROR SUMMARY|Failure|error|FAIL:|^\{" "$LOGS/$log" | head -25
}
# decodeab NAME LOG VARIANTS: decode 1@8192, 8@4096, 64@1024 (DECAB_DECODE) once per rose_llm_bench
# flag set of VARIANTS (quoted words, e.g. "'--x on' ''"), DECAB_ROUNDS (default 2) rounds in turn
# (needs mk20b): the decode A/B steps' common form.
decodeab() {
  step "$1" "$2" 420 bash -c "for r in \$(seq ${DECAB_ROUNDS:-2}); do for v in $3; do echo \"== [\$r] \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode ${DECAB_DECODE:-1@8192,8@4096,64@1024} --decode-steps 32 --max-batch-tokens 16384 \$v 2>&1 | grep -v 'gemm tuned' | grep -vE '^(load|moe prefill)'; done; done"
}
finish() {
  cp "$LOGS"/*.log "$LOGS"/*.txt "$OUT/" 2>/dev/null
  tar -czf "$OUT/llm_logs.tgz" -C "$LOGS" . 2>/dev/null
}
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv | tee "$LOGS/gpu.txt"
for s in $STEPS; do
  case $s in
    llmops) step llmops llm_ops.log 200 "$BIN/gpu_llm_ops_test" ;;
    moeops) step moeops moe_ops.log 200 "$BIN/gpu_llm_ops_test" --gtest_filter='*MoeRoute*:*MoeExperts*:*MoeAlign*' ;;
    moedec) step moedec moe_dec.log 300 bash -c "'$BIN/gpu_llm_ops_test' --gtest_brief=1 --gtest_filter='*MoeDecodeKernelShapes*:*MoeKSlices*:*MoeExperts*:*MoeWide*' && compute-sanitizer --tool memcheck --error-exitcode 3 '$BIN/gpu_llm_ops_test' --gtest_brief=1 --gtest_filter='*MoeExperts*:*MoeKSlices*'" ;;
    rowinv) step rowinv rowinv.log 500 bash -c "rc=0; '$BIN/gpu_kernels_test' --gtest_filter='*RowInvariant*:*SmallBuckets*:*ChainGemm*' || rc=1; GARDEN_GEMM_ROW_INVARIANT=1 '$BIN/gpu_llm_model_test' --gtest_brief=1 || rc=1; exit \$rc" ;;
    rowinvab) decodeab rowinvab rowinvab.txt "'--gemm-row-invariant on' ''" ;;
    chainpdl) step chainpdl chainpdl.log 400 bash -c "rc=0; '$BIN/gpu_kernels_test' --gtest_filter='*Chain*' || rc=1; GARDEN_CHAIN_PDL=1 '$BIN/gpu_llm_model_test' --gtest_brief=1 || rc=1; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --batch-check 8,64 --decode-steps 32 --max-batch-tokens 16384 --chain-pdl on > /tmp/bcp.txt 2>&1 || rc=1; grep -v 'gemm tuned' /tmp/bcp.txt; exit \$rc" ;;
    chainpdlab) decodeab chainpdlab chainpdlab.txt "'--chain-pdl on' ''" ;;
    ssops) step ssops ssops.log 420 bash -c "rc=0; '$BIN/gpu_llm_ops_test' --gtest_filter='GpuFp8Moe.WgmmaExperts*' || rc=1; GARDEN_MOE_WGMMA_SMEM_A=1 '$BIN/gpu_llm_model_test' --gtest_brief=1 --gtest_filter='*Wgmma*:*AutoMode*:*ChunkMode*:*TokensDoNotDependOnTheBatch*' || rc=1; exit \$rc" ;;
    ssmem) step ssmem ss_mem.log 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/gpu_llm_ops_test" --gtest_brief=1 --gtest_filter='GpuFp8Moe.WgmmaExperts*' ;;
    ssab) step ssab ssab.txt 300 prefillab /tmp/gptoss20b --moe-wgmma-smem-a on off ;;
    ssab120b) step ssab120b ssab120b.txt 360 bash -c "PREFILL_KV=40000 prefillab /dev/shm/gptoss120b --moe-wgmma-smem-a on off" ;;
    ssncu120b) step ssncu120b ssncu120b.txt 240 ncuwg /dev/shm/gptoss120b 40000 --moe-wgmma-smem-a on ;;
    batchcheck) step batchcheck batchcheck.txt 500 bash -c "rc=0; for v in on off; do echo \"== --gemm-row-invariant \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --batch-check 8,64 --decode-steps 32 --max-batch-tokens 16384 --gemm-row-invariant \$v > /tmp/bc.txt 2>&1; r=\$?; grep -v 'gemm tuned' /tmp/bc.txt; echo \"== exit \$r\"; if [ \$v = on ] && [ \$r -ne 0 ]; then rc=1; fi; done; exit \$rc" ;;
    rowinvpf) step rowinvpf rowinvpf.txt 300 bash -c "prefillab /tmp/gptoss20b --gemm-row-invariant on off" ;;
    f16suite) step f16suite f16suite.log 300 bash -c "rc=0; GARDEN_TEST_GPTOSS_DTYPE=float16 '$BIN/gpu_llm_model_test' --gtest_brief=1 || rc=1; '$BIN/gpu_llm_model_test' --gtest_brief=1 --gtest_filter='*Fp16Attention*:*Fp8ExpertsTrack*:*LtBf16Prefill*' || rc=1; exit \$rc" ;;
    embcheck) step embcheck embcheck.txt 300 bash -c "rc=0; '$BIN/gpu_model_graph_test' --gtest_brief=1 || rc=1; python3 '$ROOT/bench/suites/make_random_qwen3.py' --out /tmp/q3emb > /dev/null && '$BIN/rose_forward_bench' /tmp/q3emb --iters 20 2>&1 | grep -v 'gemm tuned' || rc=1; exit \$rc" ;;
    f16moe) step f16moe f16moe.log 300 bash -c "rc=0; '$BIN/gpu_llm_ops_test' --gtest_filter='*Fp16ExpertOutputs*:*MoeExpertsMatch*:GpuFp8Moe.Wgmma*' || rc=1; GARDEN_TEST_GPTOSS_DTYPE=float16 '$BIN/gpu_llm_model_test' --gtest_brief=1 || rc=1; exit \$rc" ;;
    decbshapes) step decbshapes decb_shapes.log 120 "$BIN/gpu_llm_ops_test" --gtest_filter='*MoeDecodeKernelShapes*:*MoeKSlices*' ;;
    decbgemm) step decbgemm decbgemm.txt 200 "$BIN/rose_llm_bench" --moe-gemm "${DECB_TS:-1,2,4,8,16,32,64,96}" --moe-k-slices 1 ;;
    pdltests) step pdltests pdl_tests.log 300 bash -c "rc=0; '$BIN/gpu_kernels_test' --gtest_filter='*Gemv*' || rc=1; '$BIN/gpu_llm_model_test' --gtest_filter='*PdlGemv*:*DecodeGraphsEqualEager*:*CombineNormFusion*:*TokensDoNotDependOnTheBatch' || rc=1; exit \$rc" ;;
    attnwarps) step attnwarps attn_warps.log 300 bash -c "'$BIN/gpu_llm_ops_test' --gtest_brief=1 --gtest_filter='*PagedAttention*' && compute-sanitizer --tool memcheck --error-exitcode 3 '$BIN/gpu_llm_ops_test' --gtest_brief=1 --gtest_filter='Cases/GpuPagedAttention.MatchesCpu/0:Cases/GpuPagedAttention.MatchesCpu/1:Cases/GpuPagedAttention.MatchesCpu/6?:Cases/GpuPagedAttention.MatchesCpu/70:Cases/GpuPagedAttention.MatchesCpu/71:Cases/GpuPagedAttention.MatchesCpu/8?'" ;;
    attncarve) decodeab attncarve attncarve.txt "'--attn-decode-warps on' '--attn-decode-warps off' '--attn-decode-warps on --attn-carveout 100' '--attn-decode-warps off --attn-carveout 100'" ;;
    f16speed) step f16speed f16speed.txt 300 bash -c "for v in '' '--dtype float16'; do echo \"== dtype flags: \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192 --prefill-reps 3 --decode 1@8192,64@1024 --decode-steps 32 --max-batch-tokens 16384 \$v 2>&1 | grep -v 'gemm tuned' | grep -vE '^moe prefill'; done" ;;
    embpdl) step embpdl embpdl.txt 240 bash -c "python3 '$ROOT/bench/suites/make_random_qwen3.py' --out /tmp/q3emb > /dev/null && for v in 0 1; do echo \"== GARDEN_PDL_GRAPH=\$v\"; GARDEN_PDL_GRAPH=\$v '$BIN/rose_forward_bench' /tmp/q3emb --iters 20 2>&1 | grep -v 'gemm tuned'; done" ;;
    pdlgraph) step pdlgraph pdl_graph.log 400 bash -c "rc=0; '$BIN/gpu_llm_model_test' --gtest_filter='*PdlGraph*' || rc=1; for t in gpu_llm_model_test gpu_llm_ops_test gpu_kernels_test gpu_graph_test gpu_model_graph_test; do [ -x '$BIN/'\$t ] || { echo \"== \$t not in the pack\"; continue; }; echo \"== GARDEN_PDL_GRAPH=1 \$t\"; GARDEN_PDL_GRAPH=1 '$BIN/'\$t --gtest_brief=1 || rc=1; done; exit \$rc" ;;
    decab) decodeab decab decab.txt "${DECAB_VARIANTS:-'--pdl-gemv on' '' '--gemm-gemv on'}" ;;
    decode20b) step decode20b decode20b.txt 120 "$BIN/rose_llm_bench" --model /tmp/gptoss20b --prefill '' --decode 1@8192,64@1024 --decode-steps 32 --max-batch-tokens 16384 ;;
    llmsel) step llmsel llm_sel.log 200 "$BIN/gpu_llm_ops_test" --gtest_filter='*MoeExperts*:GpuFp8Moe.*:GpuLlmOps.SamplerState*:GpuLlmOps.SamplingFollowsTheCpuDistribution:GpuLlmOps.GreedyIsTheCpuArgmax' ;;
    llmmodel) mkdir -p /tmp/llm_bar; step llmmodel llm_model.log 240 env GARDEN_LLM_BAR_DIR=/tmp/llm_bar "$BIN/gpu_llm_model_test" ;;
    hfbar) step hfbar hfbar.log 200 python3 "$ROOT/tests/gpu/hf_llm_bar.py" /tmp/llm_bar ;;
    regress) step regress regress.log 200 bash -c "'$BIN/gpu_kernels_test' --gtest_brief=1 && '$BIN/gpu_graph_test' --gtest_brief=1 && '$BIN/gpu_model_graph_test' --gtest_brief=1" ;;
    memcheck) step memcheck memcheck.log 200 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/gpu_llm_ops_test" --gtest_filter='*RopeKv*:*MoeRoute*:*MoeAlign*:*Gather*:*Greedy*:Cases/GpuPagedAttention.MatchesCpu/0:Cases/GpuPagedAttention.MatchesCpu/4:*MoeExperts*' ;;
    attnops) step attnops attn_ops.log 200 "$BIN/gpu_llm_ops_test" --gtest_filter='*PagedAttention*' ;;
    attnmem) step attnmem attn_mem.log 200 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/gpu_llm_ops_test" --gtest_filter='Cases/GpuPagedAttention.MatchesCpu/1*:Cases/GpuPagedAttention.MatchesCpu/2*:Cases/GpuPagedAttention.MatchesCpu/3*' ;;
    attnsrc) step attnsrc attn_src.txt 200 bash -c "ncu --set full --import-source no -k regex:pagedAttnSm90Kernel -c 1 -o '$LOGS/ncu_attn' '$BIN/rose_llm_bench' --attn-bench 16384@16384 >/dev/null 2>&1; ncu -i '$LOGS/ncu_attn.ncu-rep' --page source --csv --print-source sass > '$LOGS/ncu_attn.sass.csv' 2>&1; python3 '$ROOT/bench/suites/ncu_sass_stalls.py' '$LOGS/ncu_attn.sass.csv' 40; ncu -i '$LOGS/ncu_attn.ncu-rep' --page details 2>&1 | grep -E 'Duration|Registers Per|Executed Ipc A|Eligible Warps|Active Warps Per|Issue Slots|Tensor|Shared|Bank'" ;;
    attnncu) step attnncu attn_ncu.txt 200 ncu -k regex:pagedAttnSm90Kernel -c 1 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section Occupancy "$BIN/rose_llm_bench" --attn-bench 16384@49152 ;;
    pattnbench) step pattnbench paged_attn_bench.txt 200 "$BIN/rose_llm_bench" --attn-bench 16384@0,16384@49152,16384@114688,8192@0,2048@0,1024@4096,512@0,256@1000 ;;
    prefillab) step prefillab prefillab.txt 400 bash -c "for v in mma sm90 sm90c2; do echo \"== --attn-prefill \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192,32768,65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --attn-prefill \$v 2>&1 | grep -v 'gemm tuned'; done" ;;
    prefilldef) step prefilldef prefilldef.txt 200 bash -c "'$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192,32768,65536,131072 --prefill-reps 3 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 2>&1 | grep -v 'gemm tuned'" ;;
    wgops) step wgops wg_ops.log 240 "$BIN/gpu_llm_ops_test" --gtest_filter="${WGOPS_FILTER:-GpuFp8Moe.WgmmaExperts*:GpuFp8Moe.LtBf16ExpertsMatch*}" ;;
    wgncufull120b) step wgncufull120b wgncufull120b.txt 240 ncuwg /dev/shm/gptoss120b 40000 ;;
    wgncufull) step wgncufull wgncufull.txt 240 ncuwg /tmp/gptoss20b 140000 ;;
    wgcross) step wgcross wgcross.txt 300 bash -c "for m in '/tmp/gptoss20b 512,1024,1536,2048' '/dev/shm/gptoss120b 2048,4096,6144,8192'; do set -- \$m; for v in tiled chunk; do echo \"== \$1 --moe-prefill \$v\"; '$BIN/rose_llm_bench' --model \$1 --prefill \$2 --prefill-reps 3 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-prefill \$v --moe-prefill-min-rows 1 2>&1 | grep -v 'gemm tuned'; done; done" ;;
    wgmodel) step wgmodel wg_model.log 240 "$BIN/gpu_llm_model_test" --gtest_filter='*Wgmma*:*ChunkMode*:*LtBf16Prefill*' ;;
    rowsab) step rowsab rowsab.txt 300 prefillab /tmp/gptoss20b --router-tiled-rows on off ;;
    wgplan) step wgplan wgplan.log 300 bash -c "'$BIN/gpu_llm_ops_test' --gtest_filter='GpuFp8Moe.WgmmaExperts*' && '$BIN/gpu_llm_model_test' --gtest_filter='*WgmmaDevicePlan*:*AutoMode*'" ;;
    wgplanmem) step wgplanmem wgplan_mem.log 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/gpu_llm_ops_test" --gtest_filter='GpuFp8Moe.WgmmaExperts*' ;;
    wgplanab) step wgplanab wgplanab.txt 300 prefillab /tmp/gptoss20b --moe-wgmma-device-plan on off ;;
    wgplanab120b) step wgplanab120b wgplanab120b.txt 320 prefillab /dev/shm/gptoss120b --moe-wgmma-device-plan on off ;;
    tiledab) step tiledab tiledab.txt 300 bash -c "for v in 128 0; do echo \"== --router-tiled-min \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192,32768 --prefill-reps 3 --decode 1@8192,64@1024 --decode-steps 32 --max-batch-tokens 16384 --kv-tokens 140000 --router-tiled-min \$v 2>&1 | grep -v 'gemm tuned'; done; echo '== defaults, long'; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 2>&1 | grep -v 'gemm tuned'" ;;
    tiledab120b) step tiledab120b tiledab120b.txt 320 bash -c "for v in 128 0; do echo \"== --router-tiled-min \$v\"; '$BIN/rose_llm_bench' --model /dev/shm/gptoss120b --prefill 8192,32768 --prefill-reps 3 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --router-tiled-min \$v 2>&1 | grep -v 'gemm tuned'; done; echo '== defaults, long'; '$BIN/rose_llm_bench' --model /dev/shm/gptoss120b --prefill 65536,131072 --decode 1@8192 --decode-steps 32 --max-batch-tokens 16384 --kv-tokens 140000 2>&1 | grep -v 'gemm tuned'" ;;
    autoab) step autoab autoab.txt 300 bash -c "for v in auto chunk; do echo \"== GARDEN_MOE_PREFILL=\$v\"; GARDEN_MOE_PREFILL=\$v TAG=_\$v bash '$ROOT/bench/suites/gpu_chat_sweep.sh' '$BIN' /tmp/gptoss20b '$BIN/tokenizer.json' '$LOGS/autoab' 256; done" ;;
    f16ops) step f16ops f16ops.log 360 bash -c "'$BIN/gpu_llm_ops_test' --gtest_filter='*RopeKv*:*GpuPagedAttention*:*MoeExpertsMatchCpu*:*MoeWideKernel*' 2>&1 | grep -E 'f16|OK|FAILED|Failure|Expected|Which is|PASSED' | tail -90 && compute-sanitizer --tool memcheck --error-exitcode 3 '$BIN/gpu_llm_ops_test' --gtest_filter='*RopeKv*:Cases/GpuPagedAttention.MatchesCpu/44:Cases/GpuPagedAttention.MatchesCpu/47:Cases/GpuPagedAttention.MatchesCpu/54:Cases/GpuPagedAttention.MatchesCpu/57' 2>&1 | tail -5" ;;
    f16moeops) step f16moeops f16moeops.log 240 bash -c "'$BIN/gpu_llm_ops_test' --gtest_filter='*MoeExpertsMatchCpu*:*MoeWideKernel*' 2>&1 | grep -E 'f16|OK|FAILED|Failure|Expected|Which is|PASSED' | tail -40" ;;
    f16proj) step f16proj f16proj.log 360 bash -c "'$BIN/gpu_kernels_test' --gtest_filter='*LinearF16*:*LinearMatchesReference*' 2>&1 | grep -E 'f16 linear|OK|FAILED|Failure|Expected|Which is|PASSED|rror' ; '$BIN/gpu_llm_ops_test' --gtest_filter='*RopeKv*' 2>&1 | grep -E 'OK|FAILED|Failure|Expected|Which is|PASSED|rror' ; compute-sanitizer --tool memcheck --error-exitcode 3 '$BIN/gpu_llm_ops_test' --gtest_filter='*RopeKv*' 2>&1 | tail -3; echo '== GARDEN_TEST_GPTOSS_ATTN=float16 GARDEN_TEST_GPTOSS_PROJ=f32'; GARDEN_TEST_GPTOSS_ATTN=float16 GARDEN_TEST_GPTOSS_PROJ=f32 '$BIN/gpu_llm_model_test' --gtest_filter='*ChunkedPrefill*:*PrefixCache*:*TokensDoNotDependOnTheBatch*:*DecodeGraphs*:*WindowPool*:*WithoutRoutingChoice*:*RoutedModelTeacherForced*:*LateMasks*:*CombineNorm*:*Wgmma*:*ChunkMode*:*AutoMode*' 2>&1 | grep -E 'teacher-forced \] E|wgmma model|OK|FAILED|Failure|Expected|Which is|PASSED|INVALID|rror|Value of'" ;;
    f16model) step f16model f16model.log 480 bash -c "'$BIN/gpu_llm_model_test' --gtest_filter='*Fp16Attention*' 2>&1 | grep -E 'attn dtype|OK|FAILED|Failure|Expected|Which is' ; for m in ATTN DTYPE; do echo \"== GARDEN_TEST_GPTOSS_\$m=float16\"; env GARDEN_TEST_GPTOSS_\$m=float16 '$BIN/gpu_llm_model_test' --gtest_filter='*ChunkedPrefill*:*PrefixCache*:*TokensDoNotDependOnTheBatch*:*DecodeGraphs*:*WindowPool*:*WithoutRoutingChoice*:*RoutedModelTeacherForced*:*LateMasks*:*CombineNorm*:*Wgmma*:*ChunkMode*:*AutoMode*' 2>&1 | grep -E 'teacher-forced \] E|wgmma model|OK|FAILED|Failure|Expected|Which is|PASSED|INVALID|rror|Value of'; done" ;;
    f16bench) step f16bench f16bench.txt 400 bash -c "for v in '--dtype bfloat16' '--dtype float16' '--dtype float16 --proj-out f16 --moe-out act'; do echo \"== \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192 --prefill-reps 3 --decode 1@8192,64@1024,256@1024 --decode-steps 32 --max-batch-tokens 16384 \$v 2>&1 | grep -v 'gemm tuned'; done" ;;
    f16bar) step f16bar f16bar.txt 480 bash -c "rm -rf /tmp/bar_f16 /tmp/bar_noproj /tmp/bar_nomoeout /tmp/bar_16out && mkdir -p /tmp/bar_f16 /tmp/bar_noproj /tmp/bar_nomoeout /tmp/bar_16out && '$BIN/rose_llm_bench' --model /tmp/gptoss20b --bar-dump /tmp/bar_f16 --dtype float16 2>&1 | grep -v 'gemm tuned' && '$BIN/rose_llm_bench' --model /tmp/gptoss20b --bar-dump /tmp/bar_noproj --dtype float16 --proj-out f16 2>&1 | grep -v 'gemm tuned' && '$BIN/rose_llm_bench' --model /tmp/gptoss20b --bar-dump /tmp/bar_nomoeout --dtype float16 --moe-out act 2>&1 | grep -v 'gemm tuned' && '$BIN/rose_llm_bench' --model /tmp/gptoss20b --bar-dump /tmp/bar_16out --dtype float16 --proj-out f16 --moe-out act 2>&1 | grep -v 'gemm tuned' && python3 '$ROOT/bench/suites/hf_llm_bar20b.py' /tmp/gptoss20b /tmp/bar_f16 /tmp/bar_noproj /tmp/bar_nomoeout /tmp/bar_16out; rc=\$?; cp /tmp/bar_f16/bar20b.json '$LOGS/bar20b_f16.json' 2>/dev/null; exit \$rc" ;;
    f16barp) step f16barp f16barp.txt 400 bash -c "rm -rf /tmp/barp_f16 /tmp/barp_qkv /tmp/barp_o && mkdir -p /tmp/barp_f16 /tmp/barp_qkv /tmp/barp_o && for v in f16 qkv o; do '$BIN/rose_llm_bench' --model /tmp/gptoss20b --bar-dump /tmp/barp_\$v --dtype float16 --proj-out \$v 2>&1 | grep -v 'gemm tuned' || exit 1; done && python3 '$ROOT/bench/suites/hf_llm_bar20b.py' /tmp/gptoss20b /tmp/barp_f16 /tmp/barp_qkv /tmp/barp_o" ;;
    f16barx) step f16barx f16barx.txt 540 bash -c "rm -rf /tmp/barx /tmp/barx_noproj && mkdir -p /tmp/barx /tmp/barx_noproj && '$BIN/rose_llm_bench' --model /tmp/gptoss20b --bar-dump /tmp/barx --dtype float16 --bar-prompts 16,64,256,1024,2100,17,65,257,1025,2101,1023,2099 2>&1 | grep -v 'gemm tuned' && '$BIN/rose_llm_bench' --model /tmp/gptoss20b --bar-dump /tmp/barx_noproj --dtype float16 --proj-out f16 --bar-prompts 16,64,256,1024,2100,17,65,257,1025,2101,1023,2099 2>&1 | grep -v 'gemm tuned' && python3 '$ROOT/bench/suites/hf_llm_bar20b.py' /tmp/gptoss20b /tmp/barx /tmp/barx_noproj; rc=\$?; cp /tmp/barx/bar20b.json '$LOGS/bar20bx_f16.json' 2>/dev/null; exit \$rc" ;;
    f16bar2l) step f16bar2l f16bar2l.txt 300 bash -c "rm -rf /tmp/g2 /tmp/b2_f16 /tmp/b2_nohead /tmp/b2_attnf16 /tmp/b2_bf16 && mkdir -p /tmp/b2_f16 /tmp/b2_nohead /tmp/b2_attnf16 /tmp/b2_bf16 && python3 '$ROOT/bench/suites/make_random_gpt_oss.py' --out /tmp/g2 --layers 2 && '$BIN/rose_llm_bench' --model /tmp/g2 --bar-dump /tmp/b2_f16 --dtype float16 2>&1 | grep -v 'gemm tuned' && '$BIN/rose_llm_bench' --model /tmp/g2 --bar-dump /tmp/b2_nohead --attn-dtype float16 --moe-dtype float16 2>&1 | grep -v 'gemm tuned' && '$BIN/rose_llm_bench' --model /tmp/g2 --bar-dump /tmp/b2_attnf16 --attn-dtype float16 2>&1 | grep -v 'gemm tuned' && '$BIN/rose_llm_bench' --model /tmp/g2 --bar-dump /tmp/b2_bf16 2>&1 | grep -v 'gemm tuned' && python3 '$ROOT/bench/suites/hf_llm_bar20b.py' /tmp/g2 /tmp/b2_f16 /tmp/b2_nohead /tmp/b2_attnf16 /tmp/b2_bf16; rc=\$?; cp /tmp/b2_f16/bar20b.json '$LOGS/bar2l_f16.json' 2>/dev/null; exit \$rc" ;;
    winmodel) step winmodel win_model.log 300 bash -c "'$BIN/gpu_llm_model_test' --gtest_filter='*WindowPool*:*DecodeGraphs*' && compute-sanitizer --tool memcheck --error-exitcode 3 '$BIN/gpu_llm_model_test' --gtest_filter='*WindowPool*'" ;;
    winsweep) step winsweep winsweep.txt 400 bash -c "for v in '0 _nowin' '32000 _win'; do set -- \$v; echo \"== --kv-window-blocks \$1\"; TAG=\$2 TULIP_ARGS=\"--rose-arg=--kv-window-blocks=\$1\" bash '$ROOT/bench/suites/gpu_chat_sweep.sh' '$BIN' /tmp/gptoss20b '$BIN/tokenizer.json' '$LOGS/winsweep' 256; grep -h -E 'kv window pool|kv cache ready|\"ready\"' '$LOGS'/winsweep/sweep_tulip\$2.log | head -4; done" ;;
    routerops) step routerops router_ops.log 200 "$BIN/gpu_llm_ops_test" --gtest_filter='*MoeRoute*' ;;
    figs) step figs figs.txt 300 bash -c "command -v nsys || echo 'no nsys'; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192,32768 --prefill-reps 5 --decode 1@8192,64@1024 --decode-steps 32 --max-batch-tokens 16384 --kv-tokens 140000 ${FIGS_FLAGS:-} 2>&1 | grep -v 'gemm tuned'; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 ${FIGS_FLAGS:-} 2>&1 | grep -v 'gemm tuned'" ;;
    figs120b) step figs120b figs120b.txt 320 bash -c "'$BIN/rose_llm_bench' --model /dev/shm/gptoss120b --prefill 8192,32768 --prefill-reps 5 --decode 1@8192 --decode-steps 32 --max-batch-tokens 16384 --kv-tokens 140000 ${FIGS_FLAGS:-} 2>&1 | grep -v 'gemm tuned'; '$BIN/rose_llm_bench' --model /dev/shm/gptoss120b --prefill 65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 ${FIGS_FLAGS:-} 2>&1 | grep -v 'gemm tuned'" ;;
    alignops) step alignops align_ops.log 300 bash -c "'$BIN/gpu_llm_ops_test' --gtest_filter='*MoeAlign*' && compute-sanitizer --tool memcheck --error-exitcode 3 '$BIN/gpu_llm_ops_test' --gtest_filter='*MoeAlignBlock*'" ;;
    tokab) step tokab tokab.txt 300 prefillab /tmp/gptoss20b --router-tiled-tok 32 64 ;;
    tokab120b) step tokab120b tokab120b.txt 320 prefillab /dev/shm/gptoss120b --router-tiled-tok 32 64 ;;
    alignab) step alignab alignab.txt 300 prefillab /tmp/gptoss20b --moe-align-multiblock on off ;;
    alignab120b) step alignab120b alignab120b.txt 320 prefillab /dev/shm/gptoss120b --moe-align-multiblock on off ;;
    routermem) step routermem router_mem.log 200 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/gpu_llm_ops_test" --gtest_filter='*MoeRouteMma*:*MoeRouteF32Matches*:*MoeRouteF32Tiled*' ;;
    routerab) step routerab routerab.txt 300 bash -c "for v in on off; do echo \"== --router-mma \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192,32768 --prefill-reps 3 --decode 1@8192,64@1024 --decode-steps 32 --max-batch-tokens 16384 --kv-tokens 140000 --router-mma \$v 2>&1 | grep -v 'gemm tuned'; done" ;;
    routerab120b) step routerab120b routerab120b.txt 320 bash -c "for v in on off; do echo \"== --router-mma \$v\"; '$BIN/rose_llm_bench' --model /dev/shm/gptoss120b --prefill 8192,32768 --prefill-reps 3 --decode 1@8192 --decode-steps 32 --max-batch-tokens 16384 --kv-tokens 140000 --router-mma \$v 2>&1 | grep -v 'gemm tuned'; done" ;;
    stepab) step stepab stepab.txt 300 bash -c "for v in step chunk; do echo \"== GARDEN_MOE_PREFILL=\$v\"; GARDEN_MOE_PREFILL=\$v TAG=_\$v bash '$ROOT/bench/suites/gpu_chat_sweep.sh' '$BIN' /tmp/gptoss20b '$BIN/tokenizer.json' '$LOGS/stepab' 256; done" ;;
    wgab) step wgab wgab.txt 300 bash -c "for v in on off; do echo \"== --moe-lt-wgmma \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192,32768 --prefill-reps 3 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-lt-wgmma \$v 2>&1 | grep -v 'gemm tuned'; done; echo '== --moe-lt-wgmma on, long'; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-lt-wgmma on 2>&1 | grep -v 'gemm tuned'" ;;
    wgab120b) step wgab120b wgab120b.txt 320 prefillab /dev/shm/gptoss120b --moe-lt-wgmma on off ;;
    wgncu) step wgncu wgncu.txt 240 bash -c "ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file '$LOGS/ncu_prefill_wg.csv' '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192 --decode '' --profile --moe-lt-wgmma on >/dev/null 2>&1; python3 '$ROOT/bench/suites/ncu_llm_summary.py' '$LOGS/ncu_prefill_wg.csv'" ;;
    wgmem) step wgmem wg_mem.log 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/gpu_llm_ops_test" --gtest_filter='GpuFp8Moe.WgmmaExperts*' ;;
    wgsass) step wgsass wgsass.txt 120 bash -c "cuobjdump -sass '$BIN/rose_llm_bench' > '$LOGS/rlb.sass' 2>&1; python3 '$ROOT/bench/suites/sass_spills.py' '$LOGS/rlb.sass' moeWgmma" ;;
    wgcross2) step wgcross2 wgcross2.txt 300 bash -c "for m in '/tmp/gptoss20b 128,256,384,512' '/dev/shm/gptoss120b 512,1024,1536'; do set -- \$m; for v in tiled chunk; do echo \"== \$1 --moe-prefill \$v\"; '$BIN/rose_llm_bench' --model \$1 --prefill \$2 --prefill-reps 5 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-prefill \$v --moe-prefill-min-rows 1 2>&1 | grep -v 'gemm tuned'; done; done" ;;
    wgncu120) step wgncu120 wgncu120.txt 240 bash -c "ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file '$LOGS/ncu_prefill_wg120.csv' '$BIN/rose_llm_bench' --model /dev/shm/gptoss120b --prefill 8192 --decode '' --profile --kv-tokens 140000 >/dev/null 2>&1; python3 '$ROOT/bench/suites/ncu_llm_summary.py' '$LOGS/ncu_prefill_wg120.csv'" ;;
    sweepab) step sweepab sweepab.txt 300 bash -c "for v in 1 0; do echo \"== GARDEN_MOE_LT_WGMMA=\$v\"; GARDEN_MOE_LT_WGMMA=\$v TAG=_wg\$v bash '$ROOT/bench/suites/gpu_chat_sweep.sh' '$BIN' /tmp/gptoss20b '$BIN/tokenizer.json' '$LOGS/sweepab' 256; done" ;;
    ltops) step ltops lt_ops.log 300 "$BIN/gpu_llm_ops_test" --gtest_filter='GpuFp8Moe.*' ;;
    ltmem) step ltmem lt_mem.log 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/gpu_llm_ops_test" --gtest_filter='GpuFp8Moe.Bf16*:GpuFp8Moe.LtBf16*' ;;
    moegemm_lt) step moegemm_lt moegemm_lt.txt 240 "$BIN/rose_llm_bench" --moe-gemm 512,1024,2048,4096,8192 --moe-k-slices 1 --moe-weights fp8 ;;
    smallk) step smallk smallk.log 240 "$BIN/gpu_llm_ops_test" --gtest_filter='*RopeKv*:*MoeAlign*:GpuFp8Moe.LtBf16ExpertsMatch*:*MoeExperts*' ;;
    smallkmem) step smallkmem smallk_mem.log 200 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/gpu_llm_ops_test" --gtest_filter='*RopeKv*:*MoeAlign*' ;;
    ltstreams) step ltstreams lt_streams.log 240 "$BIN/gpu_llm_ops_test" --gtest_filter='GpuFp8Moe.LtBf16Streams*' ;;
    prefillcopy) step prefillcopy prefillcopy.txt 200 bash -c "'$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192,32768,65536,131072 --prefill-reps 3 --decode 1@8192 --max-batch-tokens 16384 --kv-tokens 140000 --moe-weights mxfp4-bf16 2>&1 | grep -v 'gemm tuned'" ;;
    ltab) step ltab ltab.txt 320 bash -c "for v in '1 off off' '1 on off' '2 on on' '4 on off' '4 on on' '8 on on'; do set -- \$v; echo \"== --moe-lt-streams \$1 --moe-lt-epilogue \$2 --moe-lt-overlap \$3\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192,32768 --prefill-reps 3 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-lt-streams \$1 --moe-lt-epilogue \$2 --moe-lt-overlap \$3 2>&1 | grep -v 'gemm tuned'; done" ;;
    ltab120b) step ltab120b ltab120b.txt 320 bash -c "for v in '1 off off' '4 on on' '8 on on'; do set -- \$v; echo \"== --moe-lt-streams \$1 --moe-lt-epilogue \$2 --moe-lt-overlap \$3\"; '$BIN/rose_llm_bench' --model /dev/shm/gptoss120b --prefill 8192,32768 --prefill-reps 3 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-lt-streams \$1 --moe-lt-epilogue \$2 --moe-lt-overlap \$3 2>&1 | grep -v 'gemm tuned'; done" ;;
    ltcross2) step ltcross2 ltcross2.txt 300 bash -c "for m in '/tmp/gptoss20b 2048,2560,3072,4096,6144' '/dev/shm/gptoss120b 8192,12288,16384'; do set -- \$m; for v in tiled step; do echo \"== \$1 --moe-prefill \$v\"; '$BIN/rose_llm_bench' --model \$1 --prefill \$2 --prefill-reps 5 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-prefill \$v --moe-prefill-min-rows 1 2>&1 | grep -v 'gemm tuned'; done; done" ;;
    chunk120b) step chunk120b chunk120b.txt 200 bash -c "'$BIN/rose_llm_bench' --model /dev/shm/gptoss120b --prefill 32768,65536 --decode '' --max-batch-tokens 32768 --kv-tokens 140000 2>&1 | grep -v 'gemm tuned'" ;;
    ltcrossnew) step ltcrossnew ltcrossnew.txt 300 bash -c "for m in '/tmp/gptoss20b 1024,1536,2048' '/dev/shm/gptoss120b 2048,4096,6144,8192'; do set -- \$m; for v in tiled step; do echo \"== \$1 --moe-prefill \$v\"; '$BIN/rose_llm_bench' --model \$1 --prefill \$2 --prefill-reps 3 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-prefill \$v --moe-prefill-min-rows 1 2>&1 | grep -v 'gemm tuned'; done; done" ;;
    prefilltiled) step prefilltiled prefilltiled.txt 200 bash -c "'$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192,32768,65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-prefill tiled 2>&1 | grep -v 'gemm tuned'" ;;
    prefill120btiled) step prefill120btiled prefill120btiled.txt 300 "$BIN/rose_llm_bench" --model /dev/shm/gptoss120b --prefill 8192,32768,65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-prefill tiled ;;
    prefilllt) step prefilllt prefilllt.txt 200 bash -c "'$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192,32768,65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-prefill cublas 2>&1 | grep -v 'gemm tuned'" ;;
    ltcross) step ltcross ltcross.txt 300 bash -c "for v in tiled step; do echo \"== --moe-prefill \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 1024,1536,2048,3072,4096,8192 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-prefill \$v --moe-prefill-min-rows 1 2>&1 | grep -v 'gemm tuned'; done" ;;
    ltcross120b) step ltcross120b ltcross120b.txt 400 bash -c "for v in tiled step; do echo \"== --moe-prefill \$v\"; '$BIN/rose_llm_bench' --model /dev/shm/gptoss120b --prefill 1024,2048,4096,8192,16384,32768,65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-prefill \$v --moe-prefill-min-rows 1 2>&1 | grep -v 'gemm tuned'; done" ;;
    proflt) step proflt proflt.txt 240 bash -c "ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file '$LOGS/ncu_prefill_lt.csv' '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192 --decode '' --profile --moe-prefill cublas >/dev/null 2>&1; python3 '$ROOT/bench/suites/ncu_llm_summary.py' '$LOGS/ncu_prefill_lt.csv'" ;;
    prefill120blt) step prefill120blt prefill120blt.txt 300 "$BIN/rose_llm_bench" --model /dev/shm/gptoss120b --prefill 8192,32768,65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-prefill cublas ;;
    prefillfp8) step prefillfp8 prefillfp8.txt 200 bash -c "'$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192,32768,65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-weights fp8 2>&1 | grep -v 'gemm tuned'" ;;
    mk20b) step mk20b mk20b.log 240 python3 "$ROOT/bench/suites/make_random_gpt_oss.py" --out /tmp/gptoss20b --shape 20b ;;
    bench20b) step bench20b bench20b.txt 300 "$BIN/rose_llm_bench" --model /tmp/gptoss20b --prefill 2048,8192,32768 --decode 1@8192,64@1024 --decode-steps 32 --max-batch-tokens 16384 --json "$LOGS/bench20b.jsonl" ;;
    moegemm) step moegemm moegemm.txt 200 "$BIN/rose_llm_bench" --moe-gemm 1,2,4,8,16,32,64,128,192,256 --moe-k-slices 1,2,4,8 ;;
    sweepjson) step sweepjson sweepjson.txt 400 bash -c "export OUTPUT_TOKENS=512 SKIP_REASONING=true TEMPERATURE=0; for v in 'none _plain' 'json_object _json' 'json_object _json_overlap --llm-constrained-overlap' 'json_object _json_serial --mask-threads 0'; do set -- \$v; RESPONSE_FORMAT=\$1 TAG=\$2 TULIP_ARGS=\"\$3 \$4\" bash '$ROOT/bench/suites/gpu_chat_sweep.sh' '$BIN' /tmp/gptoss20b '$BIN/tokenizer.json' '$LOGS/sweepjson' 64; done" ;;
    latemask) step latemask latemask.txt 460 bash -c "'$BIN/gpu_llm_model_test' --gtest_filter='*LateMasks*' 2>&1 | tail -15; export OUTPUT_TOKENS=512 SKIP_REASONING=true TEMPERATURE=0; for v in 'none _plain' 'json_schema _schema_sync --rose-arg=--late-masks=off' 'json_schema _schema_late'; do set -- \$v; s=''; [ \$1 = json_schema ] && s='$ROOT/bench/suites/schemas/long_arrays.json'; RESPONSE_FORMAT=\$1 RESPONSE_SCHEMA=\$s TAG=\$2 TULIP_ARGS=\"\$3\" bash '$ROOT/bench/suites/gpu_chat_sweep.sh' '$BIN' /tmp/gptoss20b '$BIN/tokenizer.json' '$LOGS/latemask' 64; done" ;;
    moewide) step moewide moe_wide.log 360 "$BIN/gpu_llm_ops_test" --gtest_filter="${MOEWIDE_FILTER:-GpuLlmOps.Moe*:Cases/GpuPagedAttention.*}" ;;
    widegemm) step widegemm widegemm.txt 200 "$BIN/rose_llm_bench" --moe-gemm "${WIDEGEMM_TS:-1,8,32,64,96,128,192,256,384,512}" --moe-k-slices 1 ;;
    wideab) step wideab wideab.txt 200 bash -c "for v in '' '--moe-wide off'; do echo \"== \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 1@8192,64@1024,256@1024 --decode-steps 24 --max-batch-tokens 16384 --kv-tokens 290000 \$v 2>&1 | grep -v 'gemm tuned'; done" ;;
    smallgemm) step smallgemm smallgemm.txt 240 bash -c "'$BIN/gpu_kernels_test' --gtest_filter='GpuOps.Linear*' 2>&1 | grep -E 'OK|FAIL|Failure|small buckets|Expected|Which'; for v in on off; do echo \"== --gemm-small-buckets \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 1@8192,2@8192,4@4096,8@2048,64@1024 --decode-steps 24 --max-batch-tokens 16384 --gemm-small-buckets \$v 2>&1; done" ;;
    gemv) step gemv gemv.txt 240 bash -c "'$BIN/gpu_kernels_test' --gtest_filter='GpuOps.Gemv*:GpuOps.Linear*' 2>&1 | grep -E 'OK|FAIL|Failure|gemv|small buckets|Expected|Which'; for v in on off; do echo \"== --gemm-gemv \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 1@8192,2@8192,4@4096,8@2048 --decode-steps 24 --max-batch-tokens 16384 --gemm-gemv \$v 2>&1; done" ;;
    moepf) step moepf moepf.txt 240 "$BIN/rose_llm_bench" --moe-gemm "${MOEPF_TS:-1,2,4,8,16,32,64,128,256,512}" --moe-k-slices 1 --moe-prefetch "${MOEPF_PF:-0,8,16,32}" ;;
    pfdec) step pfdec pfdec.txt 360 bash -c "for v in '--moe-prefetch 0' '--moe-prefetch 8' '--moe-prefetch 16' '--moe-prefetch 32' '--moe-prefetch ${PFDEC_GEMV_PF:-16} --gemm-gemv on'; do echo \"== \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 1@8192,64@1024,256@1024 --decode-steps 24 --max-batch-tokens 16384 --kv-tokens 290000 \$v 2>&1 | grep -v 'gemm tuned'; done" ;;
    ncusrc) step ncusrc ncusrc.txt 240 bash -c "ncu --set full --import-source no -k regex:moeGemmMxDecode -c 2 -o '$LOGS/ncu_dec1' '$BIN/rose_llm_bench' --moe-gemm 1 --moe-prefetch ${NCUSRC_PF:-0} >/dev/null 2>&1; ncu --set full --import-source no -k regex:moeGemmMxWide -c 2 -o '$LOGS/ncu_wide256' '$BIN/rose_llm_bench' --moe-gemm 256 --moe-prefetch ${NCUSRC_PF:-0} >/dev/null 2>&1; for r in ncu_dec1 ncu_wide256; do ncu -i '$LOGS/'\$r.ncu-rep --page source --csv --print-source sass > '$LOGS/'\$r.sass.csv 2>&1; echo \"\$r: \$(wc -l < '$LOGS/'\$r.sass.csv) lines\"; ncu -i '$LOGS/'\$r.ncu-rep --page details 2>&1 | grep -E 'moeGemm|Duration|Registers Per|Executed Ipc A|DRAM Through|Eligible Warps|Active Warps Per|Executed Instructions  '; done" ;;
    declat) step declat declat.txt 300 bash -c "for v in '' '--moe-wide-min-avg 24' '--moe-prefetch 0'; do echo \"== \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 1@8192,2@8192,4@4096,8@2048,64@1024,96@1024,128@1024,192@1024,256@1024 --decode-steps 24 --max-batch-tokens 16384 --kv-tokens 290000 \$v 2>&1 | grep -v 'gemm tuned'; done" ;;
    flushab) step flushab flushab.txt 240 bash -c "for f in write read; do for g in off on; do echo \"== --gemm-flush \$f --gemm-gemv \$g\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 1@8192,2@8192,8@2048,64@1024 --decode-steps 24 --max-batch-tokens 16384 --kv-tokens 290000 --gemm-flush \$f --gemm-gemv \$g 2>&1; done; done" ;;
    fusedab) step fusedab fusedab.txt 200 bash -c "for v in on off; do echo \"== --router-fused \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 1@8192,2@8192,8@2048,64@1024,256@1024 --decode-steps 24 --max-batch-tokens 16384 --kv-tokens 290000 --router-fused \$v 2>&1 | grep -v 'gemm tuned'; done" ;;
    decdef) step decdef decdef.txt 120 bash -c "'$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 1@8192,2@8192,4@4096,8@2048,64@1024,96@1024,128@1024,192@1024,256@1024 --decode-steps 24 --max-batch-tokens 16384 --kv-tokens 290000 2>&1 | grep -v 'gemm tuned'" ;;
    prefill128k) step prefill128k prefill128k.txt 400 bash -c "for w in mxfp4 fp8; do echo \"== --moe-weights \$w\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 --moe-weights \$w 2>&1 | grep -v 'gemm tuned'; done" ;;
    sweepfp8) step sweepfp8 sweepfp8.txt 300 bash -c "TAG=_fp8 TULIP_ARGS='--rose-arg=--moe-weights=fp8' bash '$ROOT/bench/suites/gpu_chat_sweep.sh' '$BIN' /tmp/gptoss20b '$BIN/tokenizer.json' '$LOGS/sweepfp8' 256" ;;
    prefill120b) step prefill120b prefill120b.txt 300 "$BIN/rose_llm_bench" --model /dev/shm/gptoss120b --prefill 8192,32768,65536,131072 --decode '' --max-batch-tokens 16384 --kv-tokens 140000 ;;
    sweep256) step sweep256 sweep256.txt 300 bash "$ROOT/bench/suites/gpu_chat_sweep.sh" "$BIN" /tmp/gptoss20b "$BIN/tokenizer.json" "$LOGS/sweep256" 256 ;;
    dec512) step dec512 dec512.txt 240 bash -c "'$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 256@1024,384@1024,512@1024,768@1024 --decode-steps 32 2>&1 | grep -v 'gemm tuned'" ;;
    sweep512) step sweep512 sweep512.txt 420 env MAX_NUM_SEQS=512 REQS_PER_CLIENT=2 bash "$ROOT/bench/suites/gpu_chat_sweep.sh" "$BIN" /tmp/gptoss20b "$BIN/tokenizer.json" "$LOGS/sweep512" "256 512" ;;
    ncuwide) step ncuwide ncuwide.txt 200 bash -c "ncu --set full -k regex:moeGemmMxWide -c 2 '$BIN/rose_llm_bench' --moe-gemm 256 2>&1 | grep -v 'gemm tuned' | tail -250" ;;
    widedec) step widedec widedec.txt 400 bash -c "for v in '' '--moe-wide off' '--moe-wide-min-avg 16' '--moe-wide-min-avg 8' '--moe-wide-min-avg 4' '--attn-split-keys 256' '--attn-split-keys 128'; do echo \"== \$v\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 1@8192,64@1024,128@1024,256@1024 --decode-steps 24 --max-batch-tokens 16384 --kv-tokens 290000 \$v 2>&1 | grep -v 'gemm tuned'; done" ;;
    fusecn) step fusecn fusecn.txt 300 bash -c "'$BIN/gpu_llm_model_test' --gtest_filter='*CombineNorm*' 2>&1 | tail -8; for f in off on; do echo \"== --fuse-combine-norm \$f\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 1@8192,64@1024 --decode-steps 32 --max-batch-tokens 16384 --fuse-combine-norm \$f 2>&1 | grep -v 'gemm tuned'; done" ;;
    grammar) step grammar grammar.txt 200 bash -c "nproc; lscpu | grep -E 'Model name|^CPU\\(s\\)'; '$BIN/grammar_bench' --tokenizer '$BIN/tokenizer.json' --benchmark_filter='^(schema|tables_cold|tables_cold_1t|tables_tulip|mask)/'" ;;
    sliceab) step sliceab sliceab.txt 200 bash -c "for s in 1 2; do echo \"== --moe-k-slices \$s\"; '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 1@8192,64@1024 --decode-steps 32 --max-batch-tokens 16384 --moe-k-slices \$s; done" ;;
    sass) step sass sass.txt 60 bash -c "cuobjdump -sass '$BIN/rose_llm_bench' > '$LOGS/rose_llm_bench.sass' 2>&1; python3 '$ROOT/bench/suites/sass_digest.py' '$LOGS/rose_llm_bench.sass' moeGemmMxDecodeKernel" ;;
    ipc) step ipc ipc.log 200 env NCCL_NVLS_ENABLE=0 "$BIN/gpu_ipc_test" ;;
    disagg) step disagg disagg.log 400 bash -c "set -o pipefail; '$BIN/gpu_ipc_test' 2>&1 | grep -E 'rank|OK|FAILED|PASSED' | tail -12; mkdir -p /tmp/gbd/services/rose /tmp/gbd/services/tulip && ln -sf '$BIN/rose' /tmp/gbd/services/rose/rose && ln -sf '$BIN/tulip' /tmp/gbd/services/tulip/tulip && GARDEN_BUILD_DIR=/tmp/gbd '$BIN/gpu_disagg_test' 2>&1 | tail -40" ;;
    shard1gpu) step shard1gpu shard1gpu.log 400 bash -c "'$BIN/gpu_shard_test' 2>&1 | tail -40; compute-sanitizer --tool memcheck --error-exitcode 3 '$BIN/gpu_shard_test' --gtest_filter='GpuShardOps.*' 2>&1 | tail -4; mkdir -p /tmp/gbd/services/rose /tmp/gbd/services/tulip && ln -sf '$BIN/rose' /tmp/gbd/services/rose/rose && ln -sf '$BIN/tulip' /tmp/gbd/services/tulip/tulip && GARDEN_BUILD_DIR=/tmp/gbd '$BIN/gpu_ranks_test' 2>&1 | tail -30" ;;
    sm90) step sm90 sm90.log 240 bash -c "for v in sm90cpasync sm90basic sm90 'policy sm90'; do echo \"== GARDEN_SM90_TEST_ONLY=\$v\"; GARDEN_SM90_TEST_ONLY=\"\$v\" timeout 60 '$BIN/gpu_kernels_test' --gtest_filter='AttentionSm90.*' 2>&1 | tail -40; echo \"rc=\$?\"; done" ;;
    embfp8) step embfp8 embfp8.txt 480 bash -c "set -o pipefail; rc=0; '$BIN/gpu_kernels_test' --gtest_brief=1 2>&1 | grep -vE 'gemm tuned|launching|^  sm90|^  narrow|^  wide|^case ' || rc=1; '$BIN/gpu_model_graph_test' --gtest_brief=1 2>&1 | grep -v 'gemm tuned' || rc=1; python3 '$ROOT/bench/suites/make_random_qwen3.py' --out /tmp/q3emb > /dev/null && '$BIN/rose_forward_bench' /tmp/q3emb --iters 20 --weights-ab 2>&1 | grep -v 'gemm tuned' || rc=1; exit \$rc" ;;
    embfp8m) step embfp8m embfp8m.txt 300 bash -c "set -o pipefail; rc=0; '$BIN/gpu_model_graph_test' --gtest_brief=1 2>&1 | grep -v 'gemm tuned' || rc=1; python3 '$ROOT/bench/suites/make_random_qwen3.py' --out /tmp/q3emb > /dev/null && '$BIN/rose_forward_bench' /tmp/q3emb --iters 20 --weights-ab 2>&1 | grep -v 'gemm tuned' || rc=1; exit \$rc" ;;
    attnfp8ab) step attnfp8ab attnfp8ab.txt 240 bash -c "set -o pipefail; rc=0; python3 '$ROOT/bench/suites/make_random_qwen3.py' --out /tmp/q3emb > /dev/null && for v in 0 1; do echo \"== GARDEN_ATTN_FP8_OUT=\$v\"; GARDEN_FORWARD_SHAPES=1x512,16x512,8x1024,2x4096 GARDEN_ATTN_FP8_OUT=\$v '$BIN/rose_forward_bench' /tmp/q3emb --iters 20 --weights-ab 2>&1 | grep -v 'gemm tuned' || rc=1; done; exit \$rc" ;;
    embstreams) step embstreams embstreams.txt 200 bash -c "set -o pipefail; python3 '$ROOT/bench/suites/make_random_qwen3.py' --out /tmp/q3emb > /dev/null && GARDEN_FORWARD_SHAPES=16x512,8x1024,2x4096,1x512,4x128 '$BIN/rose_forward_bench' /tmp/q3emb --iters 10 --streams-ab 2>&1 | grep -v 'gemm tuned'" ;;
    gemmwgab) step gemmwgab gemmwgab.txt 360 bash -c "rc=0; '$BIN/gpu_kernels_test' --gtest_brief=1 --gtest_filter='GpuWgGemm.*' 2>&1 | grep -v 'gemm tuned' || rc=1; python3 '$ROOT/bench/suites/make_random_qwen3.py' --out /tmp/q3emb > /dev/null && GARDEN_FORWARD_SHAPES=${WGAB_SHAPES:-1x128,1x256,1x512,4x128,16x512} '$BIN/rose_forward_bench' /tmp/q3emb --iters 20 --ab gemmlt,gemmwg,gemmwgpdl,gemmlt > /tmp/wgab.txt 2>&1 || rc=1; grep 'gemm tuned' /tmp/wgab.txt > '$LOGS/wg_tuned.txt'; grep -v 'gemm tuned' /tmp/wgab.txt; exit \$rc" ;;
    tuneab) step tuneab tuneab.txt 360 bash -c "rc=0; GARDEN_GEMM_TUNE_VIEW=chain GARDEN_GEMM_WG=pdl '$BIN/gpu_kernels_test' --gtest_brief=1 --gtest_filter='GpuOps.Linear*:GpuWgGemm.*' 2>&1 | grep -v 'gemm tuned' || rc=1; GARDEN_GEMM_TUNE_VIEW=chain GARDEN_GEMM_WG=pdl '$BIN/gpu_model_graph_test' --gtest_brief=1 2>&1 | grep -v 'gemm tuned' || rc=1; python3 '$ROOT/bench/suites/make_random_qwen3.py' --out /tmp/q3emb > /dev/null && GARDEN_FORWARD_SHAPES=${TUNEAB_SHAPES:-1x128,1x256,1x512,4x128,16x512,2x4096} '$BIN/rose_forward_bench' /tmp/q3emb --iters 20 --ab gemmlt,gemmwgpdl,gemmlt+tunechain,gemmwgpdl+tunechain,gemmlt > /tmp/tuneab.txt 2>&1 || rc=1; grep 'gemm tuned' /tmp/tuneab.txt > '$LOGS/tune_tuned.txt'; grep -v 'gemm tuned' /tmp/tuneab.txt; exit \$rc" ;;
    gemmsmall) step gemmsmall gemmsmall.txt 300 bash -c "'$BIN/rose_kernel_bench' gemm_smallm 2>&1 | grep -v 'gemm tuned'" ;;
    elem) step elem elem.txt 150 timeout 140 "$BIN/rose_kernel_bench" elementwise ;;
    qkab) step qkab qkab.txt 240 bash -c "python3 '$ROOT/bench/suites/make_random_qwen3.py' --out /tmp/q3emb > /dev/null && GARDEN_FORWARD_SHAPES=1x128,1x512,16x512,8x1024,2x4096 '$BIN/rose_forward_bench' /tmp/q3emb --iters 20 --ab qklegacy,qkauto,qkpair4,qkpair2,qklegacy 2>&1 | grep -v 'gemm tuned'" ;;
    elemncu) step elemncu elemncu.txt 240 bash -c "for k in qkNormRopeKernel swigluKernel rmsNormKernel; do echo \"== \$k\"; ncu -k regex:\$k -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats '$BIN/rose_kernel_bench' elementwise 2>&1 | grep -vE '^(embedding|rms_norm_add|qk_norm_rope|swiglu) '; done" ;;
    embprof) step embprof embprof.txt 200 bash -c "bash '$ROOT/bench/suites/gpu_profile.sh' '$BIN' '$LOGS/embprof' 16x512 1x128 2>&1 | grep -v 'gemm tuned'" ;;
    gemmfp8) step gemmfp8 gemmfp8.txt 200 timeout 190 "$BIN/rose_kernel_bench" gemm_fp8 ;;
    attnbench) step attnbench attnbench.txt 120 timeout 110 "$BIN/rose_kernel_bench" attention ;;
    mk120b) step mk120b mk120b.log 300 bash -c "df -h /dev/shm /tmp; free -g; python3 '$ROOT/bench/suites/make_random_gpt_oss.py' --out /dev/shm/gptoss120b --shape 120b && du -sh /dev/shm/gptoss120b" ;;
    bench120b) step bench120b bench120b.txt 300 "$BIN/rose_llm_bench" --model /dev/shm/gptoss120b --prefill 8192,32768 --decode 1@8192,64@1024 --decode-steps 16 --max-batch-tokens 16384 --kv-tokens 140000 --json "$LOGS/bench120b.jsonl" ;;
    bench20b_nograph) step bench20b_nograph bench20b_nograph.txt 200 "$BIN/rose_llm_bench" --model /tmp/gptoss20b --prefill '' --decode 1@8192,64@1024 --decode-steps 32 --max-batch-tokens 16384 --cuda-graphs off --json "$LOGS/bench20b_nograph.jsonl" ;;
    profdec) step profdec profdec.txt 240 bash -c "for w in 1@8192 64@1024; do ncu --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file '$LOGS/ncu_decode_'\$w'.csv' '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode \$w --decode-steps 4 --profile >/dev/null 2>&1; done; python3 '$ROOT/bench/suites/ncu_llm_summary.py' '$LOGS'/ncu_decode_*.csv" ;;
    bench20b_fp8) step bench20b_fp8 bench20b_fp8.txt 300 "$BIN/rose_llm_bench" --model /tmp/gptoss20b --prefill 2048,8192,32768 --decode 1@8192 --decode-steps 16 --max-batch-tokens 16384 --moe-weights fp8 --json "$LOGS/bench20b_fp8.jsonl" ;;
    bar20b) step bar20b bar20b.txt 400 bash -c "rm -rf /tmp/bar20b /tmp/bar20b_old && mkdir -p /tmp/bar20b /tmp/bar20b_old && '$BIN/rose_llm_bench' --model /tmp/gptoss20b --bar-dump /tmp/bar20b 2>&1 | grep -v 'gemm tuned' && '$BIN/rose_llm_bench' --model /tmp/gptoss20b --bar-dump /tmp/bar20b_old --router bf16 --norm-round twice 2>&1 | grep -v 'gemm tuned' && python3 '$ROOT/bench/suites/hf_llm_bar20b.py' /tmp/gptoss20b /tmp/bar20b /tmp/bar20b_old; rc=\$?; cp /tmp/bar20b/bar20b.json '$LOGS/' 2>/dev/null; exit \$rc" ;;
    bar2l) step bar2l bar2l.txt 300 bash -c "rm -rf /tmp/g2 /tmp/bar2l && mkdir -p /tmp/bar2l && python3 '$ROOT/bench/suites/make_random_gpt_oss.py' --out /tmp/g2 --layers 2 && '$BIN/rose_llm_bench' --model /tmp/g2 --bar-dump /tmp/bar2l 2>&1 | grep -v 'gemm tuned' && python3 '$ROOT/bench/suites/hf_llm_bar20b.py' /tmp/g2 /tmp/bar2l; rc=\$?; cp /tmp/bar2l/bar20b.json '$LOGS/bar2l.json' 2>/dev/null; exit \$rc" ;;
    ncudec) step ncudec ncudec.txt 200 bash -c "ncu --set full -k regex:moeGemmMxDecode -c 4 '$BIN/rose_llm_bench' --moe-gemm 1,64 2>&1 | grep -v 'gemm tuned' | tail -400" ;;
    routeracc) step routeracc routeracc.log 300 bash -c "for v in 'f32 once' 'bf16 once' 'f32 twice' 'bf16 twice'; do set -- \$v; echo \"== router \$1 norm-round \$2\"; GARDEN_TEST_GPTOSS_ROUTER=\$1 GARDEN_TEST_GPTOSS_NORM_ROUND=\$2 '$BIN/gpu_llm_model_test' --gtest_filter='*RoutedModelTeacherForcedAgainstTheCpu*:*TeacherForcedWithoutRoutingChoice*' 2>&1 | grep -E 'teacher-forced \] E|OK|FAILED|Failure|Expected|Which is'; done" ;;
    bench20b_router) step bench20b_router bench20b_router.txt 200 "$BIN/rose_llm_bench" --model /tmp/gptoss20b --prefill 8192 --decode 1@8192,64@1024 --decode-steps 32 --max-batch-tokens 16384 --router bf16 --json "$LOGS/bench20b_router.jsonl" ;;
    masks) step masks masks.txt 200 bash -c "'$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 64@1024,1@8192 --decode-steps 32 --max-batch-tokens 16384 && '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 64@1024,1@8192 --decode-steps 32 --max-batch-tokens 16384 --masks 0.05" ;;
    bench20b_bf16res) step bench20b_bf16res bench20b_bf16res.txt 200 "$BIN/rose_llm_bench" --model /tmp/gptoss20b --prefill 8192 --decode 1@8192,64@1024 --decode-steps 32 --max-batch-tokens 16384 --residual bf16 --json "$LOGS/bench20b_bf16res.jsonl" ;;
    fp8ops) step fp8ops fp8_ops.log 300 "$BIN/gpu_llm_ops_test" --gtest_filter='GpuFp8Moe.*' ;;
    moegemm_fp8) step moegemm_fp8 moegemm_fp8.txt 200 "$BIN/rose_llm_bench" --moe-gemm 256,512,1024,2048,4096,8192 --moe-weights fp8 ;;
    bench20b_bf16) step bench20b_bf16 bench20b_bf16.txt 200 "$BIN/rose_llm_bench" --model /tmp/gptoss20b --prefill 2048,8192 --decode 1@8192,64@1024 --decode-steps 32 --max-batch-tokens 16384 --moe-weights bf16 --json "$LOGS/bench20b_bf16.jsonl" ;;
    hfpeer) step hfpeer hfpeer.txt 240 python3 "$ROOT/bench/suites/hf_llm_peer.py" /tmp/gptoss20b --prefill 2048,8192 --decode 1@8192,64@1024 --steps 16 ;;
    mesh) step mesh mesh.log 200 bash "$ROOT/bench/suites/gpu_mesh_smoke.sh" "$BIN" /tmp/gptoss20b "$BIN/tokenizer.json" "$LOGS" ;;
    sweepttft) step sweepttft sweepttft.txt 420 bash -c "SKIP_REASONING=true TAG=_skip bash '$ROOT/bench/suites/gpu_chat_sweep.sh' '$BIN' /tmp/gptoss20b '$BIN/tokenizer.json' '$LOGS/sweepttft'; SKIP_REASONING=true POOL=32 TAG=_pool32 bash '$ROOT/bench/suites/gpu_chat_sweep.sh' '$BIN' /tmp/gptoss20b '$BIN/tokenizer.json' '$LOGS/sweepttft' '256'" ;;
    mbtab) step mbtab mbtab.txt 300 bash -c "for v in 16384 8192; do SKIP_REASONING=true MAX_BATCH_TOKENS=\$v TAG=_mbt\$v bash '$ROOT/bench/suites/gpu_chat_sweep.sh' '$BIN' /tmp/gptoss20b '$BIN/tokenizer.json' '$LOGS/mbtab' 256; done" ;;
    sweep) step sweep sweep.txt 420 bash "$ROOT/bench/suites/gpu_chat_sweep.sh" "$BIN" /tmp/gptoss20b "$BIN/tokenizer.json" "$LOGS/sweep" ;;
    prof) step prof prof.txt 240 bash -c "ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file '$LOGS/ncu_decode.csv' '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill '' --decode 1@8192,64@1024 --decode-steps 4 --profile >/dev/null 2>&1; ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file '$LOGS/ncu_prefill.csv' '$BIN/rose_llm_bench' --model /tmp/gptoss20b --prefill 8192 --decode '' --profile >/dev/null 2>&1; python3 '$ROOT/bench/suites/ncu_llm_summary.py' '$LOGS/ncu_decode.csv' '$LOGS/ncu_prefill.csv'" ;;
    *) echo "unknown step $s"; failed=$((failed+1)) ;;
  esac
done
for f in attnbench.txt decode20b.txt sweepjson.txt grammar.txt sliceab.txt moegemm.txt moegemm_fp8.txt sass.txt bench20b.txt bench120b.txt bench20b_nograph.txt bench20b_bf16.txt bench20b_fp8.txt bench20b_bf16res.txt hfpeer.txt sweep.txt; do
  [ -f "$LOGS/$f" ] && grep -v '"gemm tuned"' "$LOGS/$f"
done
[ -f "$LOGS/prof.txt" ] && cat "$LOGS/prof.txt"
[ -f "$LOGS/profdec.txt" ] && cat "$LOGS/profdec.txt"
[ -f "$LOGS/hfbar.log" ] && grep -v Warning "$LOGS/hfbar.log" | tail -8
echo "---- summary"; printf "%s" "$summary" | tee "$LOGS/summary.txt"
exit $failed
