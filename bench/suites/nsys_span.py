#!/usr/bin/env python3
"""Summarizes `nsys stats --report cuda_gpu_trace --format csv` output of one profiled window
(rose_llm_bench --profile: one step between cudaProfilerStart/Stop): the window's span from the
first kernel's start to the last kernel's end, the sum of kernel durations, the idle time between
kernels (span - busy, kernels do not overlap on one stream) and the largest gaps, then the kernel
time per name. Usage: nsys_span.py TRACE.csv [TOP]"""
import csv
import sys
from collections import defaultdict


def main() -> int:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    rows = []
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.strip()]
    # nsys may print a banner before the CSV header: start at the header line.
    start = next((i for i, ln in enumerate(lines) if "Start" in ln and "Duration" in ln), None)
    if start is None:
        print(f"{path}: no cuda_gpu_trace header")
        return 1
    reader = csv.DictReader(lines[start:])
    cols = reader.fieldnames or []
    c_start = next(c for c in cols if c.startswith("Start"))
    c_dur = next(c for c in cols if c.startswith("Duration"))
    c_name = next(c for c in cols if c == "Name")
    for r in reader:
        try:
            s, d = float(r[c_start]), float(r[c_dur])
        except (TypeError, ValueError):
            continue
        name = r[c_name]
        if name.startswith("[CUDA mem") or name.startswith("[CUDA memcpy") or name.startswith("[CUDA memset"):
            kind = "copy"
        else:
            kind = "kernel"
        rows.append((s, d, name, kind))
    if not rows:
        print(f"{path}: no rows")
        return 1
    rows.sort()
    span = rows[-1][0] + rows[-1][1] - rows[0][0]
    busy = sum(d for _, d, _, _ in rows)
    gaps = []
    for a, b in zip(rows, rows[1:]):
        g = b[0] - (a[0] + a[1])
        gaps.append((g, a[2], b[2]))
    idle = sum(g for g, _, _ in gaps if g > 0)
    unit = 1e3  # ns -> us
    print(f"{len(rows)} operations, span {span / unit:.1f} us, busy {busy / unit:.1f} us, "
          f"idle between operations {idle / unit:.1f} us "
          f"(mean gap {idle / max(1, len(gaps)) / unit:.2f} us)")
    gaps.sort(reverse=True)
    print("largest gaps (us): " + "; ".join(
        f"{g / unit:.1f} before {b[:40]}" for g, _, b in gaps[:8]))
    per = defaultdict(lambda: [0.0, 0])
    for _, d, name, _ in rows:
        key = name.split("(")[0][:70]
        per[key][0] += d
        per[key][1] += 1
    for key, (d, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{d / unit:10.1f} us {n:5d}x {100 * d / busy:5.1f}%  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
