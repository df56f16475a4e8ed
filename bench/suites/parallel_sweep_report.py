#!/usr/bin/env python3
"""The report of bench/suites/gpu_parallel_sweep.sh (issue 19): reads its sweep.jsonl and writes
OUT_DIR/SWEEP.md (prefill latency per layout and prompt length beside the published ROSE figures
and the goal of half of them, with the cost per million input tokens; decode speed and cost per
million output tokens) and OUT_DIR/decode_cost.svg (per-stream tokens/s against the cost per
million output tokens, one line per layout, points in the order of the decode entries).
    parallel_sweep_report.py SWEEP_JSONL OUT_DIR [--gpu-hour-usd 3] [--published 120b|20b|none]
No third-party modules: the SVG is written by hand.
"""
import argparse
import json
import math
import os
import sys

# Published ROSE prefill latency (s) for one request, from issue 19 (EP = TP) and issue 16 (TP1).
PUBLISHED = {
    "120b": {
        "--ep 1": [0.364, 2.42, 7.38, 23.9],
        "--tp 2 --ep 2": [0.190, 1.245, 3.786, 12.116],
        "--tp 4 --ep 4": [0.165, 0.900, 2.449, 7.165],
        "--tp 8 --ep 8": [0.179, 0.839, 2.003, 5.119],
    },
    "20b": {
        "--ep 1": [0.239, 1.61, 4.90, 16.0],
        "--tp 2 --ep 2": [0.127, 0.833, 2.522, 8.143],
        "--tp 4 --ep 4": [0.108, 0.593, 1.616, 4.766],
        "--tp 8 --ep 8": [0.116, 0.547, 1.310, 3.365],
    },
}
PUBLISHED_LENGTHS = [8192, 32768, 65536, 131072]


def usd_per_million(seconds, tokens, gpus, gpu_hour_usd):
    """Cost of `tokens` tokens served in `seconds` on `gpus` GPUs, per million tokens."""
    if not seconds or not tokens:
        return None
    return gpus * gpu_hour_usd * seconds / 3600.0 / tokens * 1e6


def fmt(v, digits=3):
    return "—" if v is None else f"{v:.{digits}f}"


def svg_plot(series, path, xlabel, ylabel):
    """series: {name: [(x, y, label), ...]} -> a line chart in `path`."""
    pts = [p for s in series.values() for p in s if p[0] is not None and p[1] is not None]
    if not pts:
        return False
    w, h, ml, mr, mt, mb = 720, 440, 70, 170, 20, 50
    x0, x1 = 0.0, max(p[0] for p in pts) * 1.1
    y0, y1 = 0.0, max(p[1] for p in pts) * 1.1
    sx = lambda x: ml + (x - x0) / (x1 - x0 or 1) * (w - ml - mr)
    sy = lambda y: h - mb - (y - y0) / (y1 - y0 or 1) * (h - mt - mb)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<line x1="{ml}" y1="{h - mb}" x2="{w - mr}" y2="{h - mb}" stroke="black"/>',
           f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{h - mb}" stroke="black"/>']
    for i in range(6):
        xv, yv = x0 + (x1 - x0) * i / 5, y0 + (y1 - y0) * i / 5
        out.append(f'<text x="{sx(xv):.1f}" y="{h - mb + 15}" text-anchor="middle">{xv:.3g}</text>')
        out.append(f'<text x="{ml - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
    out.append(f'<text x="{(ml + w - mr) / 2}" y="{h - 12}" text-anchor="middle">{xlabel}</text>')
    out.append(f'<text transform="translate(16,{(mt + h - mb) / 2}) rotate(-90)" '
               f'text-anchor="middle">{ylabel}</text>')
    for i, (name, s) in enumerate(series.items()):
        c = colors[i % len(colors)]
        good = [p for p in s if p[0] is not None and p[1] is not None]
        if len(good) > 1:
            d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in good)
            out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        for x, y, label in good:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{c}"/>')
            out.append(f'<text x="{sx(x) + 5:.1f}" y="{sy(y) - 5:.1f}" fill="{c}">{label}</text>')
        out.append(f'<text x="{w - mr + 10}" y="{mt + 16 * (i + 1)}" fill="{c}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rows")
    ap.add_argument("out_dir")
    ap.add_argument("--gpu-hour-usd", type=float, default=3.0)
    ap.add_argument("--published", default="120b", choices=["120b", "20b", "none"])
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.rows) if l.strip()]
    layouts = []
    for r in rows:
        if r["layout"] not in layouts:
            layouts.append(r["layout"])
    md = ["# Parallel sweep (bench/suites/gpu_parallel_sweep.sh)", "",
          f"Cost at ${a.gpu_hour_usd:g} per GPU-hour times the layout's GPUs. Prefill: one request "
          "at a time, TTFT p50 of distinct prompts with one output token. Decode: B streams at once "
          "with C-token prompts; inter-token latency after the first token.", ""]
    for r in rows:
        if "skipped" in r or "error" in r:
            md.append(f"- layout `{r['layout']}`: {r.get('skipped') or r.get('error')}"
                      + (f" ({r['kind']} {r['shape']})" if "kind" in r else ""))
    lengths = sorted({int(r["shape"]) for r in rows if r.get("kind") == "prefill"})
    if lengths:
        md += ["", "## Prefill latency (s) and cost per million input tokens", "",
               "| layout | GPUs | " + " | ".join(f"{L:,}" for L in lengths) + " |",
               "|---|---|" + "---|" * len(lengths)]
        pub = PUBLISHED.get(a.published, {})
        for lay in layouts:
            cells, gpus = [], None
            for L in lengths:
                r = next((x for x in rows if x["layout"] == lay and x.get("kind") == "prefill"
                          and int(x["shape"]) == L), None)
                if r is None or "error" in r or not r.get("ok"):
                    cells.append("—")
                    continue
                gpus = r["gpus"]
                s = r["ttft_ms"].get("p50", 0) / 1000.0
                cost = usd_per_million(s, L, gpus, a.gpu_hour_usd)
                cell = f"{s:.3f} (${fmt(cost, 2)})"
                if lay in pub and L in PUBLISHED_LENGTHS:
                    p = pub[lay][PUBLISHED_LENGTHS.index(L)]
                    cell += " ✓" if s <= p / 2 else ""
                cells.append(cell)
            if gpus is None:
                continue
            md.append(f"| `{lay}` | {gpus} | " + " | ".join(cells) + " |")
            if lay in pub and any(L in PUBLISHED_LENGTHS for L in lengths):
                pc = [f"{pub[lay][PUBLISHED_LENGTHS.index(L)]:.3f} → ≤ "
                      f"{pub[lay][PUBLISHED_LENGTHS.index(L)] / 2:.3f}"
                      if L in PUBLISHED_LENGTHS else "—" for L in lengths]
                md.append(f"| published ROSE {a.published} `{lay}` → goal | | " + " | ".join(pc)
                          + " |")
        if any(l in pub for l in layouts) and any(L in PUBLISHED_LENGTHS for L in lengths):
            md.append("")
            md.append("✓: at most half the published figure (issue 19's goal).")
    dec = [r for r in rows if r.get("kind") == "decode" and "error" not in r and r.get("ok")]
    series = {}
    if dec:
        md += ["", "## Decode speed and cost per million output tokens", "",
               "| layout | GPUs | streams @ context | ITL p50 / p99 ms | tok/s per stream | "
               "output tok/s | $ per M output tokens |", "|---|---|---|---|---|---|---|"]
        for r in dec:
            itl = r["itl_ms"]
            per = 1000.0 / itl["p50"] if itl.get("p50") else None
            tps = r.get("output_tokens_per_s")
            cost = usd_per_million(1.0, tps, r["gpus"], a.gpu_hour_usd) if tps else None
            md.append(f"| `{r['layout']}` | {r['gpus']} | {r['shape']} | {fmt(itl.get('p50'), 2)} / "
                      f"{fmt(itl.get('p99'), 2)} | {fmt(per, 1)} | {fmt(tps, 1)} | {fmt(cost, 3)} |")
            series.setdefault(f"{r['layout']} ({r['gpus']} GPU)", []).append(
                (cost, per, r["shape"]))
        if svg_plot(series, os.path.join(a.out_dir, "decode_cost.svg"),
                    "$ per million output tokens", "tokens/s per stream"):
            md += ["", "![decode speed against cost](decode_cost.svg)"]
    with open(os.path.join(a.out_dir, "SWEEP.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
