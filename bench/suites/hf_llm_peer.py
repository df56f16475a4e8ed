#!/usr/bin/env python3
"""The peer of rose_llm_bench: Hugging Face transformers (PyTorch, bf16, MXFP4 experts dequantized
at load, eager attention: what transformers runs for gpt-oss without the hub's kernels) on the same
checkpoint and shapes — prefill of N tokens, decode steps of a batch at a context length. Prints
one line per figure as rose_llm_bench does, flushing each, so a run cut short keeps what it had.
    hf_llm_peer.py MODEL_DIR [--prefill 2048,8192] [--decode 1@8192,64@1024] [--steps 16]
"""
import argparse
import sys
import time

import torch
from transformers import GptOssForCausalLM

try:
    from transformers import Mxfp4Config
except ImportError:
    Mxfp4Config = None


def sync():
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prefill", default="2048,8192")
    ap.add_argument("--decode", default="1@8192,64@1024")
    ap.add_argument("--steps", type=int, default=16)
    a = ap.parse_args()
    t0 = time.time()
    kw = {"device_map": "cuda", "attn_implementation": "eager"}
    if Mxfp4Config is not None:
        kw["quantization_config"] = Mxfp4Config(dequantize=True)
    m = GptOssForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, **kw).eval()
    sync()
    print(f"hf load {time.time() - t0:.2f} s (experts dequantized to bf16)", flush=True)
    vocab = m.config.vocab_size
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode():
        m(torch.randint(0, vocab, (1, 64), device="cuda", generator=g))  # warm-up
        sync()
        for n in [int(x) for x in a.prefill.split(",") if x]:
            ids = torch.randint(0, vocab, (1, n), device="cuda", generator=g)
            try:
                sync()
                t = time.time()
                m(ids, use_cache=False, logits_to_keep=1)
                sync()
                dt = time.time() - t
                print(f"hf prefill {n:6d} tokens: {dt:.4f} s  ({n / dt:.0f} tokens/s)", flush=True)
            except torch.cuda.OutOfMemoryError as e:
                print(f"hf prefill {n:6d} tokens: out of memory ({e})", flush=True)
            torch.cuda.empty_cache()
        for spec in [s for s in a.decode.split(",") if s]:
            b, ctx = (int(x) for x in spec.split("@"))
            try:
                ids = torch.randint(0, vocab, (b, ctx), device="cuda", generator=g)
                out = m(ids, use_cache=True, logits_to_keep=1)
                pkv = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
                for _ in range(2):  # warm-up steps
                    out = m(nxt, past_key_values=pkv, use_cache=True)
                    pkv, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                sync()
                t = time.time()
                for _ in range(a.steps):
                    out = m(nxt, past_key_values=pkv, use_cache=True)
                    pkv, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                sync()
                ms = (time.time() - t) * 1000 / a.steps
                print(f"hf decode batch {b:3d} @ {ctx:5d}: step {ms:.3f} ms  "
                      f"({b * 1000 / ms:.0f} tokens/s)", flush=True)
                del out, pkv
            except torch.cuda.OutOfMemoryError as e:
                print(f"hf decode batch {b:3d} @ {ctx:5d}: out of memory ({e})", flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
