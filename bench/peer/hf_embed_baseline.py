#!/usr/bin/env python3
"""Hugging Face transformers peer baseline for the embedding suites 1-4, on the same GPU in the same
run as garden, writing the same result schema (garden.bench.result.v1, system "hf_transformers")
so bench/render/render.py puts both side by side with their ratio.

    python3 bench/peer/hf_embed_baseline.py --out DIR [--suites 1,2,3] [--quick]
    python3 bench/peer/hf_embed_baseline.py --out DIR --suites 4 --tokenizer tokenizer.json
    python3 bench/peer/hf_embed_baseline.py --out DIR --suites 1,3 --compile --jsonl

--compile runs the model under torch.compile(mode="reduce-overhead") (Inductor + CUDA graphs; system
"hf_transformers_compiled"): the strongest stock-PyTorch peer for batch-1 latency. Each new shape
costs a compile (the first call; its seconds are in "notes" and on stderr, never in the timings) —
`--dynamic auto` (default) is torch.compile's own behaviour: the first shape is compiled static,
a second one makes the changed dimensions symbolic (so suites 1+3 compile ~3 times, then CUDA
graphs are recorded per shape); `--dynamic false` specializes every shape (fastest kernels, one
compile per shape: minutes). `--max-seconds` skips workloads that would start past a budget so a
time-limited device call still gets every finished workload's JSON. Suite 4 (client threads
sharing one model) is refused with --compile: CUDA-graph trees are per thread. --jsonl also prints
each result as one JSON line on stdout (the same garden.bench.result.v1 object as the file).

The model is transformers' Qwen3 (AutoModel.from_config) at Qwen3-Embedding-0.6B shape with
random weights (no network on the GPU host): hidden 1024, 28 layers, 16 heads, 8 kv heads, head
dim 128, intermediate 3072, vocab 151669, bf16, attn_implementation="sdpa". Embedding = last-token
pooling + L2 normalize (Qwen3-Embedding's recipe). Scoring (suite 2) = the same forward, then the
last token's hidden state against two rows of a [2, hidden] head (the "yes"/"no" rows of an LM
head, which is what a Qwen3-Reranker score needs), score = sigmoid(yes - no).

Timing: each request is timed with CUDA events from the host-to-device copy of its token ids to
the device-to-host copy of its results (so the host<->GPU hops a server pays are counted), after
warm-up, with torch.inference_mode(). Inputs are seeded random ids of exactly the target length,
so no padding is ever needed (attention_mask all ones). Suite 3's "four concurrent clients" have
no meaning for a single in-process model: batches of 100 run back to back on one stream, which is
the most throughput HF gets from one GPU without a server (recorded in "notes").
Suite 4 (high concurrency, text): ~512-token texts of common English words (calibrated with the
given tokenizer.json through HF `tokenizers`, as garden's loadgen calibrates against ivy), batch 1,
1/2/4/8/16 client threads sharing the one in-process model, each request timed on the host from
tokenization to the embedding on the host — what a thread-per-request HF server would do, without
its HTTP layer (recorded in "notes").
Exit status 0, 1 when torch/transformers/CUDA are missing (with a message saying which).
"""
import argparse
import datetime
import json
import math
import os
import platform
import random
import socket
import subprocess
import sys
import time

QWEN3_EMBEDDING_06B = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                           num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                           vocab_size=151669, max_position_embeddings=32768, rms_norm_eps=1e-6,
                           rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu")

# (suite, workload, mode, batch, seq_len, concurrency label, default count, default seconds)
WORKLOADS = []
for n in (128, 512, 4096):
    WORKLOADS.append(("1", "low_latency_embedding", f"embed_tok{n}_b1_c1", "embed", 1, n, 1, 500, 0))
for b in (5, 25, 50):
    WORKLOADS.append(("2", "low_latency_scoring", f"score_tok512_b{b}_c1", "score", b, 512, 1, 200, 0))
for n in (512, 1024, 4096):
    WORKLOADS.append(("3", "high_throughput", f"embed_tok{n}_b100_c4", "embed", 100, n, 4, 0, 20))


def percentile(sorted_vals, q):
    """Nearest rank, as the loadgen computes it (bench/loadgen/stats.cc)."""
    if not sorted_vals:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(sorted_vals)))
    return sorted_vals[min(rank, len(sorted_vals)) - 1]


def summarize(samples):
    s = sorted(samples)
    if not s:
        return dict(count=0, min=0, mean=0, p50=0, p90=0, p99=0, max=0)
    return dict(count=len(s), min=s[0], mean=sum(s) / len(s), p50=percentile(s, 50),
                p90=percentile(s, 90), p99=percentile(s, 99), max=s[-1])


def host_info():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = "none"
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20).stdout.strip().replace("\n", ";") or "none"
    except (OSError, subprocess.SubprocessError):
        pass
    return dict(hostname=socket.gethostname(), cpu=cpu, cores=os.cpu_count() or 0,
                kernel=f"{platform.system()} {platform.release()}", gpu=gpu)


def make_result(w, args, host, versions, lat_ms, items, tokens, wall_s, notes, input_kind="tokens",
                system="hf_transformers"):
    suite_no, suite, name, mode, batch, seq, conc = w[:7]
    return {
        "schema": "garden.bench.result.v1", "workload": name, "suite": suite,
        "system": system,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": os.environ.get("GARDEN_COMMIT", "unknown"), "host": host,
        "flags": {k: str(v) for k, v in vars(args).items()} | versions,
        "config": dict(mode=mode, protocol="in-process", input=input_kind, endpoint="", batch=batch,
                       seq_len=seq, concurrency=conc, warmup=args.warmup, count=len(lat_ms),
                       duration_s=0),
        "model": dict(name="Qwen3-Embedding-0.6B-shape (random weights)", kind="embedding",
                      hidden_size=QWEN3_EMBEDDING_06B["hidden_size"], max_seq_len=32768,
                      vocab_size=QWEN3_EMBEDDING_06B["vocab_size"]),
        "input_tokens": dict(per_input_mean=seq, per_input_min=seq, per_input_max=seq),
        "requests": dict(ok=len(lat_ms), errors=0, by_status={"OK": len(lat_ms)},
                         error_samples=[]),
        "duration_s": wall_s,
        "latency_ms": summarize(lat_ms),
        "throughput": dict(requests_per_s=len(lat_ms) / wall_s, items_per_s=items / wall_s,
                           tokens_per_s=tokens / wall_s,
                           **({"embeddings_per_s": items / wall_s} if mode == "embed" else {})),
        "notes": notes,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description="HF transformers peer baseline (suites 1-4)")
    ap.add_argument("--out", required=True, help="results directory (created)")
    ap.add_argument("--suites", default="1,2,3", help="comma-separated suite numbers")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up requests per workload")
    ap.add_argument("--count", type=int, default=0, help="timed requests (overrides defaults)")
    ap.add_argument("--duration", type=float, default=0,
                    help="timed seconds for throughput workloads (overrides the default 20)")
    ap.add_argument("--max-len", type=int, default=0, help="skip longer workloads")
    ap.add_argument("--quick", action="store_true", help="tiny counts (a smoke run)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation")
    ap.add_argument("--tokenizer", default="", help="suite 4: the model's tokenizer.json")
    ap.add_argument("--clients", default="1,2,4,8,16", help="suite 4: client threads per level")
    ap.add_argument("--compile", action="store_true",
                    help='torch.compile(model, mode="reduce-overhead") (Inductor + CUDA graphs)')
    ap.add_argument("--dynamic", default="auto", choices=("auto", "true", "false"),
                    help="--compile: torch.compile's dynamic= (auto = None, torch's default)")
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="skip workloads that would start after this many seconds (0 = no limit)")
    ap.add_argument("--jsonl", action="store_true",
                    help="also print each result as one JSON line on stdout")
    args = ap.parse_args(argv)
    if "4" in args.suites.split(",") and not args.tokenizer:
        print("hf_embed_baseline.py: suite 4 needs --tokenizer tokenizer.json", file=sys.stderr)
        return 2
    if args.compile and "4" in args.suites.split(","):
        print("hf_embed_baseline.py: suite 4 runs client threads on one model; --compile's CUDA "
              "graphs are per thread, so run suite 4 without --compile", file=sys.stderr)
        return 2
    began = time.perf_counter()

    try:
        import torch
        import transformers
        from transformers import AutoModel, Qwen3Config
    except ImportError as e:
        print(f"hf_embed_baseline.py: needs torch and transformers ({e})", file=sys.stderr)
        return 1
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("hf_embed_baseline.py: CUDA is not available (use --device cpu for a smoke run)",
              file=sys.stderr)
        return 1
    dev = torch.device(args.device)
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    cfg = Qwen3Config(**QWEN3_EMBEDDING_06B)
    t0 = time.time()
    with torch.device(dev):
        model = AutoModel.from_config(cfg, attn_implementation=args.attn)
    model = model.to(dtype=torch.bfloat16).eval()
    head = torch.randn(2, cfg.hidden_size, dtype=torch.bfloat16, device=dev) * 0.02
    print(f"model ready in {time.time() - t0:.1f} s: "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params, attn={args.attn}",
          file=sys.stderr)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "attn_implementation": args.attn}
    system = "hf_transformers"
    run_model = model
    if args.compile:
        import torch._dynamo
        # One graph per (batch, length) shape seen: suites 1-3 have nine; the default limit is 8.
        for knob in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 64)
        dyn = {"auto": None, "true": True, "false": False}[args.dynamic]
        run_model = torch.compile(model, mode="reduce-overhead", dynamic=dyn)
        system = "hf_transformers_compiled"
        versions |= {"compile": "reduce-overhead", "dynamic": args.dynamic}
    host = host_info()
    cuda = dev.type == "cuda"
    rng = random.Random(args.seed)
    suites = set(args.suites.split(","))

    def forward(ids_cpu, mode):
        ids = ids_cpu.to(dev, non_blocking=True)
        if args.compile:
            # No padding anywhere, so no mask (an all-ones mask is the same attention; None keeps
            # the mask's data-dependent checks out of the graph), and no KV cache (an embedding
            # needs none; it would be a graph output per layer). Outputs of a CUDA-graph replay
            # live in its pool until the next replay: everything below copies out first.
            torch.compiler.cudagraph_mark_step_begin()
            h = run_model(input_ids=ids, use_cache=False).last_hidden_state[:, -1, :]
        else:
            mask = torch.ones_like(ids)
            h = model(input_ids=ids, attention_mask=mask).last_hidden_state[:, -1, :]
        if mode == "embed":
            out = torch.nn.functional.normalize(h.float(), p=2, dim=-1)
        else:
            logits = h @ head.t()
            out = torch.sigmoid((logits[:, 0] - logits[:, 1]).float())
        return out.to("cpu", non_blocking=False)

    for w in WORKLOADS:
        suite_no, suite, name, mode, batch, seq, conc, dcount, dsecs = w
        if suite_no not in suites or (args.max_len and seq > args.max_len):
            continue
        if args.max_seconds and time.perf_counter() - began > args.max_seconds:
            print(f"{name}: skipped (--max-seconds {args.max_seconds:g} spent)", file=sys.stderr)
            continue
        pool = []
        for _ in range(4):
            ids = [[rng.randrange(10, 151643) for _ in range(seq)] for _ in range(batch)]
            t = torch.tensor(ids, dtype=torch.long)
            pool.append(t.pin_memory() if cuda else t)
        count, secs = dcount, dsecs
        if args.count:
            count, secs = args.count, 0
        elif args.duration and dsecs:
            secs = args.duration
        if args.quick:
            count, secs = 3, 0
        warm = 2 if args.quick else args.warmup
        if args.compile:
            warm = max(warm, 3)  # the first calls compile and record the CUDA graph
        with torch.inference_mode():
            tw = time.perf_counter()
            forward(pool[0], mode)
            if cuda:
                torch.cuda.synchronize()
            first_s = time.perf_counter() - tw
            for i in range(1, warm):
                forward(pool[i % len(pool)], mode)
            if cuda:
                torch.cuda.synchronize()
            if args.compile:
                print(f"{name}: first call (compile + graph capture) {first_s:.1f} s",
                      file=sys.stderr)
            lat = []
            start = time.perf_counter()
            i = 0
            while (count and i < count) or (not count and time.perf_counter() - start < secs):
                x = pool[i % len(pool)]
                if cuda:
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    e0.record()
                    forward(x, mode)
                    e1.record()
                    e1.synchronize()
                    lat.append(e0.elapsed_time(e1))
                else:
                    t1 = time.perf_counter()
                    forward(x, mode)
                    lat.append((time.perf_counter() - t1) * 1e3)
                i += 1
            wall = time.perf_counter() - start
        notes = ("in-process HF transformers; latency by CUDA events around H2D copy, forward, "
                 "pooling and D2H copy" if cuda else "CPU smoke run (not a GPU figure)")
        if conc > 1:
            notes += "; batches run back to back on one stream (no server, no client concurrency)"
        if args.compile:
            notes += (f'; torch.compile(mode="reduce-overhead", dynamic={args.dynamic}), no '
                      f"attention mask (no padding); first call (compile + capture) {first_s:.1f} s,"
                      f" not timed")
        r = make_result(w, args, host, versions, lat, len(lat) * batch, len(lat) * batch * seq,
                        wall, notes, system=system)
        with open(os.path.join(args.out, f"{name}.json"), "w") as f:
            json.dump(r, f, indent=1)
        if args.jsonl:
            print(json.dumps(r), flush=True)
        print(f"{name}: {len(lat)} requests, p50 {r['latency_ms']['p50']:.3f} ms, p99 "
              f"{r['latency_ms']['p99']:.3f} ms, {r['throughput']['items_per_s']:.1f} items/s",
              file=sys.stderr)
    if "4" in suites:
        suite4(args, host, versions, forward, rng)
    return 0


WORDS = ("time person year way day thing man world life hand part child eye woman place work week "
         "case point government company number group problem fact about after again also back "
         "because before between both come could down even first give good great high into just "
         "know large last little long make many more most much never new number only other over "
         "people right same should small some still such take than that their there these think "
         "through under very want water well what when where which while would write young").split()


def suite4(args, host, versions, forward, rng):
    """Suite 4 against the in-process model: text in, one embedding out, `c` client threads."""
    import threading

    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(args.tokenizer)
    target = 512
    texts = []
    for _ in range(16):  # calibrated like the loadgen: within 1 % of the target token count
        words = [rng.choice(WORDS) for _ in range(target)]
        n = len(words)
        while True:
            t = len(tok.encode(" ".join(words[:n])).ids)
            if abs(t - target) <= target // 100:
                break
            n += 1 if t < target else -1
            if n > len(words):
                words.append(rng.choice(WORDS))
        texts.append(" ".join(words[:n]))
    secs = args.duration or (1 if args.quick else 8)
    with torch.inference_mode():
        for i in range(2 if args.quick else args.warmup):
            forward(torch.tensor([tok.encode(texts[i % 16]).ids], dtype=torch.long), "embed")
    for c in [int(x) for x in args.clients.split(",")]:
        lat = []
        lock = threading.Lock()
        stop = time.perf_counter() + secs

        def client(k):
            mine = []
            with torch.inference_mode():
                i = k
                while time.perf_counter() < stop:
                    t1 = time.perf_counter()
                    ids = tok.encode(texts[i % 16]).ids
                    forward(torch.tensor([ids], dtype=torch.long), "embed")
                    mine.append((time.perf_counter() - t1) * 1e3)
                    i += c
            with lock:
                lat.extend(mine)

        start = time.perf_counter()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(c)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - start
        w = ("4", "high_concurrency", f"embed_text512_b1_c{c}", "embed", 1, target, c, 0, secs)
        notes = ("in-process HF transformers + tokenizers; one model shared by client threads "
                 "(no HTTP layer, no batching across clients); latency on the host from "
                 "tokenization to the embedding on the host")
        r = make_result(w, args, host, versions, lat, len(lat), len(lat) * target, wall, notes,
                        input_kind="text")
        with open(os.path.join(args.out, f"embed_text512_b1_c{c}.json"), "w") as f:
            json.dump(r, f, indent=1)
        if args.jsonl:
            print(json.dumps(r), flush=True)
        print(f"embed_text512_b1_c{c}: {len(lat)} requests, p50 {r['latency_ms']['p50']:.3f} ms, "
              f"{r['throughput']['items_per_s']:.1f} emb/s", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
