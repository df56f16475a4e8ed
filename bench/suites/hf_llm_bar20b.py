#!/usr/bin/env python3
"""The real-shape accuracy bar of rose's gpt-oss CUDA path (issue 16): a random gpt-oss-20b-shaped
MXFP4 checkpoint (bench/suites/make_random_gpt_oss.py), Hugging Face transformers in fp32
(experts dequantized, eager attention) as the reference, on prompts from 16 to 2,000+ tokens.

Input: the folder `rose_llm_bench --bar-dump DIR` wrote (seqs.json: the prompts' tokens;
rose_top2_<i>.bin: per position int32 argmax, float32 largest and second-largest logit of rose's
CUDA backend; rose_logits_<i>.f32: every row's logits of the short prompts). transformers runs
every prompt in one forward pass three times on the same weights: fp32 with TF32 matmuls off (the
reference), with TF32 on (the bar), and converted to bf16 (context: what a bf16 model does). On
the short prompts the full logits give cosines and the relative RMS error against the reference. Reported per prompt and in total: top-1
agreement with the fp32 reference of rose and of fp32+TF32, and how many of each one's
disagreements sit at a near-tie of the reference (top-2 gap < 0.05 / < 0.2). The bar: rose's
agreement >= fp32+TF32's (for the first DIR; further DIRs are rose A/B runs on the same tokens,
e.g. other accuracy knobs, reported beside it). Exit 1 when the bar is not met. A JSON summary
goes to the first DIR's bar20b.json.
    python3 bench/suites/hf_llm_bar20b.py MODEL_DIR DIR [DIR ...]
"""
import json
import os
import sys
import time

import numpy as np
import torch
from transformers import GptOssForCausalLM

try:
    from transformers import Mxfp4Config
except ImportError:  # older transformers
    Mxfp4Config = None


def main():
    model_dir, dirs = sys.argv[1], sys.argv[2:]
    d = dirs[0]
    seqs = json.load(open(os.path.join(d, "seqs.json")))
    rec = np.dtype([("id", "<i4"), ("v1", "<f4"), ("v2", "<f4")])
    roses = {}
    for k, rd in enumerate(dirs):
        assert json.load(open(os.path.join(rd, "seqs.json"))) == seqs, rd + ": other tokens"
        rose = [np.fromfile(os.path.join(rd, f"rose_top2_{i}.bin"), dtype=rec)
                for i in range(len(seqs))]
        for s, r in zip(seqs, rose):
            assert r.size == s["prompt_len"], (rd, r.size, s["prompt_len"])
        roses["rose cuda" if k == 0 else "rose " + os.path.basename(rd.rstrip("/"))] = rose

    t0 = time.time()
    kw = {"attn_implementation": "eager"}
    if Mxfp4Config is not None:
        kw["quantization_config"] = Mxfp4Config(dequantize=True)
    model = GptOssForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kw)
    model = model.to(device="cuda", dtype=torch.float32).eval()
    print(f"hf load {time.time() - t0:.1f} s (fp32, experts dequantized)", flush=True)

    # Full logits kept for the short prompts (rose wrote rose_logits_<i>.f32 for them).
    full_idx = [i for i in range(len(seqs)) if os.path.exists(os.path.join(d, f"rose_logits_{i}.f32"))]
    runs, fulls = {}, {}
    # fp32 (the reference), fp32 with TF32 matmuls (the bar), then the same weights in bf16
    # (what a bf16 engine is: for context, not the bar).
    for name, tf32, dtype in [("hf fp32", False, torch.float32), ("hf fp32+tf32", True, torch.float32),
                              ("hf bf16", False, torch.bfloat16)]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if dtype != torch.float32:
            model = model.to(dtype)
        out, full = [], {}
        t0 = time.time()
        with torch.no_grad():
            for i, s in enumerate(seqs):
                ids = torch.tensor([s["tokens"]], device="cuda")
                logits = model(input_ids=ids).logits[0].float()
                v, ix = torch.topk(logits, 2, dim=-1)
                out.append((ix[:, 0].cpu().numpy(), (v[:, 0] - v[:, 1]).cpu().numpy()))
                if i in full_idx:
                    full[i] = logits.cpu()
                del logits
        torch.cuda.synchronize()
        print(f"{name}: {time.time() - t0:.1f} s for {sum(s['prompt_len'] for s in seqs)} positions",
              flush=True)
        runs[name] = out
        fulls[name] = full
    for k, rd in enumerate(dirs):
        name = "rose cuda" if k == 0 else "rose " + os.path.basename(rd.rstrip("/"))
        fulls[name] = {i: torch.from_numpy(np.fromfile(os.path.join(rd, f"rose_logits_{i}.f32"),
                                                       dtype=np.float32).reshape(seqs[i]["prompt_len"], -1))
                       for i in full_idx}
    if full_idx:
        print(f"full logits vs hf fp32 on the {sum(seqs[i]['prompt_len'] for i in full_idx)} positions of "
              f"prompts {[seqs[i]['prompt_len'] for i in full_idx]}:")
        print(f"{'':22s} {'worst cos':>10s} {'median cos':>11s} {'rms diff / rms ref':>19s}")
        ref_full = fulls["hf fp32"]
        for name, full in fulls.items():
            if name == "hf fp32":
                continue
            cos, rel = [], []
            for i in full_idx:
                r, g_ = ref_full[i].double(), full[i].double()
                cos.append(torch.nn.functional.cosine_similarity(r, g_, dim=-1))
                rel.append(((g_ - r).pow(2).mean(-1) / r.pow(2).mean(-1)).sqrt())
            cos, rel = torch.cat(cos), torch.cat(rel)
            print(f"{name:22s} {float(cos.min()):10.6f} {float(cos.median()):11.7f} {float(rel.median()):19.5f}")

    ref = runs["hf fp32"]
    rows = {name: [r["id"] for r in rose] for name, rose in roses.items()}
    rows["hf fp32+tf32"] = [x[0] for x in runs["hf fp32+tf32"]]
    rows["hf bf16"] = [x[0] for x in runs["hf bf16"]]
    summary = {"prompts": [s["prompt_len"] for s in seqs]}
    print(f"{'':14s} {'prompt':>7s} {'agree':>14s}  flips at ref gap <0.05  <0.2")
    totals = {}
    for name, ids_list in rows.items():
        agree_t = pos_t = tie05 = tie2 = 0
        for s, got, (rid, gap) in zip(seqs, ids_list, ref):
            same = got == rid
            flips = ~same
            a, n = int(same.sum()), int(same.size)
            t05, t2 = int((flips & (gap < 0.05)).sum()), int((flips & (gap < 0.2)).sum())
            agree_t += a
            pos_t += n
            tie05 += t05
            tie2 += t2
            print(f"{name:14s} {s['prompt_len']:7d} {a:5d}/{n:<5d} {a / n:6.1%}  {t05:8d} {t2:5d}")
        totals[name] = agree_t / pos_t
        summary[name] = {"agree": agree_t, "positions": pos_t, "flips_gap_lt_0.05": tie05,
                         "flips_gap_lt_0.2": tie2}
        print(f"{name:14s} {'all':>7s} {agree_t:5d}/{pos_t:<5d} {agree_t / pos_t:6.1%}  {tie05:8d} {tie2:5d}")
    ok = totals["rose cuda"] >= totals["hf fp32+tf32"]
    summary["bar_met"] = ok
    print("bar (rose cuda top-1 agreement with hf fp32 >= hf fp32+tf32's):", "MET" if ok else "NOT MET")
    json.dump(summary, open(os.path.join(d, "bar20b.json"), "w"), indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
