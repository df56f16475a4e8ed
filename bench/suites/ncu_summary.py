#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log over ONE forward pass (from the first
kernel up to the next launch of the same first kernel) by kernel family; prints a table."""
import csv, re, sys
from collections import defaultdict

rows = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    ns = v * {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1)
    rows.append((r["Kernel Name"], ns))
if not rows:
    print("no kernels profiled"); sys.exit(1)
first = rows[0][0]
end = next((i for i in range(1, len(rows)) if rows[i][0] == first), len(rows))
one = rows[:end]
fam = defaultdict(lambda: [0.0, 0])
for name, ns in one:
    # "void garden::<unnamed>::swigluKernel(garden::SwigluArgs)" -> "garden::swigluKernel"
    # (anonymous namespaces are spelled "<unnamed>" or "(anonymous namespace)").
    key = name.replace("<unnamed>::", "").replace("(anonymous namespace)::", "")
    key = re.sub(r"<.*", "", key.split("(")[0]).replace("void ", "").strip()
    if "gemm" in name.lower() or "cutlass" in name.lower() or name.startswith("sm90_") or "xmma" in name:
        key = "GEMM (cuBLASLt): " + key[:40]
    fam[key][0] += ns
    fam[key][1] += 1
total = sum(ns for _, ns in one)
print(f"kernels in one forward: {len(one)}; summed kernel time {total/1e3:.1f} us")
for k, (ns, n) in sorted(fam.items(), key=lambda kv: -kv[1][0]):
    print(f"{ns/1e3:10.1f} us {100*ns/total:5.1f}%  x{n:<4d} {k}")
