#!/usr/bin/env python3
"""Times Hugging Face `tokenizers` single-thread encode on the texts tokenizer_bench dumped
(--dump-texts): throughput over the documents (MB/s) and p50/p99 latency of the ~512-token
text. Prints one JSON object per line, in tokenizer_bench's format.

    RAYON_NUM_THREADS=1 python3 hf_bench.py --texts DIR --bpe qwen3=PATH --bpe gptoss=PATH
"""
import argparse
import json
import os
import time

from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", required=True)
    ap.add_argument("--bpe", action="append", default=[])
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    for spec in args.bpe:
        name, path = spec.split("=", 1)
        tok = Tokenizer.from_file(path)
        tok.encode_special_tokens = True  # caller text, as ivy encodes it
        data = json.load(open(os.path.join(args.texts, "bpe_%s.json" % name), encoding="utf-8"))
        docs, t512 = data["docs"], data["latency512"]
        nbytes = sum(len(d.encode("utf-8")) for d in docs)
        for d in docs:
            tok.encode(d, add_special_tokens=False)
        total_bytes = tokens = 0
        start = time.perf_counter()
        while True:
            for d in docs:
                tokens += len(tok.encode(d, add_special_tokens=False).ids)
            total_bytes += nbytes
            elapsed = time.perf_counter() - start
            if elapsed >= args.seconds:
                break
        print(json.dumps({"workload": "bpe:%s/throughput" % name, "impl": "hf_tokenizers",
                          "mb_per_s": total_bytes / elapsed / 1e6,
                          "tokens_per_s": tokens / elapsed, "tokens": 0}), flush=True)
        n512 = len(tok.encode(t512, add_special_tokens=False).ids)
        for _ in range(50):
            tok.encode(t512, add_special_tokens=False)
        us = []
        for _ in range(3000):
            t0 = time.perf_counter()
            tok.encode(t512, add_special_tokens=False)
            us.append((time.perf_counter() - t0) * 1e6)
        us.sort()
        print(json.dumps({"workload": "bpe:%s/latency512" % name, "impl": "hf_tokenizers",
                          "p50_us": us[len(us) // 2], "p99_us": us[len(us) * 99 // 100],
                          "tokens": n512}), flush=True)


if __name__ == "__main__":
    main()
