#!/usr/bin/env python3
"""Sums `ncu --csv --metrics gpu__time_duration.sum` logs of rose_llm_bench --profile (every kernel
between the profiler markers: one decode step per --decode workload, one prefill per --prefill
length) by kernel name; prints, per log, the total and each kernel family's time, count and share.
    python3 bench/suites/ncu_llm_summary.py LOG.csv [LOG2.csv ...]
"""
import csv
import re
import sys
from collections import defaultdict

UNITS = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}


def family(name):
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    base = re.sub(r"<.*", "", name.split("(")[0]).strip()
    base = re.sub(r"^void ", "", base)
    base = re.sub(r"^garden::rose::cuda::", "", base)
    low = name.lower()
    if "cutlass" in low or name.startswith("sm90_") or "xmma" in low or "gemm" in low and "moe" not in low:
        return "cuBLASLt GEMM"
    m = re.search(r"(moeGemmKernel|moeGemmMxDecodeKernel)<([^>]*)>", name)
    if m:
        return m.group(1) + "<" + m.group(2).replace("garden::rose::cuda::", "")[:50] + ">"
    return base[:60]


for path in sys.argv[1:]:
    rows = []
    try:
        with open(path, newline="") as f:
            lines = [l for l in f if l.startswith('"')]
    except OSError as e:
        print(f"{path}: {e}")
        continue
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        rows.append((r["Kernel Name"], v * UNITS.get(r.get("Metric Unit", "ns"), 1)))
    if not rows:
        print(f"{path}: no kernels profiled")
        continue
    fam = defaultdict(lambda: [0.0, 0])
    for name, ns in rows:
        k = family(name)
        fam[k][0] += ns
        fam[k][1] += 1
    total = sum(ns for _, ns in rows)
    print(f"== {path.split('/')[-1]}: {len(rows)} kernels, {total / 1e3:.1f} us of kernel time")
    for k, (ns, n) in sorted(fam.items(), key=lambda kv: -kv[1][0]):
        print(f"  {ns / 1e3:10.1f} us  {n:5d}x  {100 * ns / total:5.1f}%  {k}")
