#!/usr/bin/env python3
"""Renders benchmark results (garden.bench.result.v1 JSON files) into a markdown report and SVG
plots. Standard library only (runs on the dev machine and the GPU host alike).

    python3 bench/render/render.py --out DIR RESULTS_DIR [PEER_RESULTS_DIR ...]

Writes DIR/report.md, DIR/latency_vs_concurrency.svg and DIR/cost_per_million_tokens.svg.
Every *.json under the given directories with the result schema is read (other files are
ignored). Results from different systems (garden, hf_transformers) that share a workload name are
compared side by side with their ratio. Cost per million tokens assumes one GPU at --usd-per-hour
(default $3.00), fully used by the workload: cost = usd_per_hour / 3600 / tokens_per_s * 1e6.
Exit status 0, or 2 when no result was found.
"""
import argparse
import html
import json
import math
import os
import sys

SCHEMA = "garden.bench.result.v1"
SUITE_ORDER = ["low_latency_embedding", "low_latency_scoring", "high_throughput",
               "high_concurrency", "chat_streaming"]
SUITE_TITLES = {
    "low_latency_embedding": "1. Low-latency embedding (batch 1, sequential, pre-tokenized, gRPC)",
    "low_latency_scoring": "2. Low-latency scoring (512 tokens, sequential, gRPC)",
    "high_throughput": "3. High throughput (batches of 100, 4 clients, gRPC)",
    "high_concurrency": "4. High concurrency through ivy (text, 512 tokens, batch 1)",
    "chat_streaming": "Chat streaming (SSE through ivy)",
}
# The goals for one H200 (tulip gRPC, pre-tokenized).
LATENCY_GOALS_MS = {"embed_tok128_b1_c1": 1.0, "embed_tok512_b1_c1": 1.5,
                    "embed_tok4096_b1_c1": 12.0}
THROUGHPUT_GOALS = {"embed_tok512_b100_c4": 1150.0, "embed_tok1024_b100_c4": 550.0,
                    "embed_tok4096_b100_c4": 100.0}
SYSTEM_ORDER = ["garden", "hf_transformers"]
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


def load_results(dirs):
    out = []
    for d in dirs:
        paths = []
        if os.path.isfile(d):
            paths = [d]
        else:
            for root, _, files in os.walk(d):
                paths += [os.path.join(root, f) for f in sorted(files) if f.endswith(".json")]
        for p in sorted(paths):
            try:
                with open(p) as f:
                    r = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(r, dict) and r.get("schema") == SCHEMA:
                r["_path"] = p
                out.append(r)
    # One result per (system, workload, protocol): a later file of the same key wins.
    dedup = {}
    for r in out:
        key = (r.get("system", "?"), r.get("workload", "?"), r.get("config", {}).get("protocol"))
        if key in dedup:
            print(f"render.py: {r['_path']} replaces {dedup[key]['_path']}", file=sys.stderr)
        dedup[key] = r
    return list(dedup.values())


def cost_per_million_tokens(tokens_per_s, usd_per_hour=3.0):
    if not tokens_per_s or tokens_per_s <= 0:
        return None
    return usd_per_hour / 3600.0 / tokens_per_s * 1e6


def is_gpu(r):
    g = (r.get("host") or {}).get("gpu", "none")
    return bool(g) and g != "none"


def fmt(v, digits=3):
    if v is None:
        return "-"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.1f}"
    return f"{v:.{digits}g}" if abs(v) < 1 else f"{v:.{digits}f}".rstrip("0").rstrip(".")


def system_key(s):
    return (SYSTEM_ORDER.index(s) if s in SYSTEM_ORDER else len(SYSTEM_ORDER), s)


def workload_key(r):
    c = r.get("config", {})
    return (c.get("mode", ""), c.get("input", ""), c.get("seq_len", 0), c.get("batch", 0),
            c.get("concurrency", 0), r.get("workload", ""))


def goal_text(r):
    w = r.get("workload")
    lat = r.get("latency_ms", {})
    thr = r.get("throughput", {})
    if w in LATENCY_GOALS_MS:
        g = LATENCY_GOALS_MS[w]
        text = f"p50 <= {fmt(g)} ms, p99 <= 1.3x p50"
    elif w in THROUGHPUT_GOALS:
        g = THROUGHPUT_GOALS[w]
        text = f">= {fmt(g)} emb/s"
    else:
        return ""
    if r.get("system") != "garden":
        return ""
    if not is_gpu(r):
        return text + " (n/a: CPU run)"
    if w in LATENCY_GOALS_MS:
        ok = lat.get("p50", 1e9) <= g and lat.get("p99", 1e9) <= 1.3 * lat.get("p50", 0)
    else:
        ok = thr.get("items_per_s", 0) >= g
    return text + (" **met**" if ok else " **missed**")


def render_markdown(results, usd_per_hour):
    lines = ["# Benchmark report", ""]
    systems = sorted({r.get("system", "?") for r in results}, key=system_key)
    lines.append("| system | host | cpu | gpu | commit | date |")
    lines.append("|---|---|---|---|---|---|")
    for s in systems:
        rs = [r for r in results if r.get("system") == s]
        hosts = sorted({json.dumps(r.get("host", {}), sort_keys=True) for r in rs})
        for h in hosts:
            hd = json.loads(h)
            sub = [r for r in rs if json.dumps(r.get("host", {}), sort_keys=True) == h]
            commits = ", ".join(sorted({str(r.get("git_commit", "?")) for r in sub}))
            dates = sorted(str(r.get("date", "?")) for r in sub)
            date = dates[0] if dates[0] == dates[-1] else f"{dates[0]} .. {dates[-1]}"
            lines.append(f"| {s} | {hd.get('hostname', '?')} | {hd.get('cpu', '?')} "
                         f"({hd.get('cores', '?')} cores) | {hd.get('gpu', 'none')} | "
                         f"{commits} | {date} |")
    if not any(is_gpu(r) for r in results):
        lines += ["", "> CPU harness check: no GPU in these results. The numbers show that the "
                  "harness works end to end; they are not GPU performance figures."]
    lines += ["", f"Cost per million tokens assumes one GPU at ${usd_per_hour:.2f} per hour, fully "
              "used by the workload (input tokens).", ""]
    suites = sorted({r.get("suite", "adhoc") for r in results},
                    key=lambda s: (SUITE_ORDER.index(s) if s in SUITE_ORDER else 99, s))
    for suite in suites:
        rs = sorted([r for r in results if r.get("suite", "adhoc") == suite],
                    key=lambda r: (workload_key(r), system_key(r.get("system", ""))))
        lines += [f"## {SUITE_TITLES.get(suite, suite)}", ""]
        if suite == "chat_streaming":
            lines.append("| workload | system | ok | errors | TTFT p50 ms | TTFT p99 ms | ITL p50 ms "
                         "| ITL p99 ms | output tok/s |")
            lines.append("|---|---|---|---|---|---|---|---|---|")
            for r in rs:
                c = r.get("chat", {})
                req = r.get("requests", {})
                lines.append(
                    f"| {r['workload']} | {r.get('system')} | {req.get('ok', 0)} | "
                    f"{req.get('errors', 0)} | {fmt(c.get('ttft_ms', {}).get('p50'))} | "
                    f"{fmt(c.get('ttft_ms', {}).get('p99'))} | {fmt(c.get('itl_ms', {}).get('p50'))} | "
                    f"{fmt(c.get('itl_ms', {}).get('p99'))} | {fmt(c.get('output_tokens_per_s'))} |")
            lines.append("")
            continue
        lines.append("| workload | system | ok | errors | p50 ms | p90 ms | p99 ms | max ms | "
                     "items/s | tokens/s | $/M tokens | goal |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rs:
            lat = r.get("latency_ms", {})
            thr = r.get("throughput", {})
            req = r.get("requests", {})
            errs = req.get("errors", 0)
            if errs:
                by = {k: v for k, v in req.get("by_status", {}).items() if k != "OK"}
                errs = f"{errs} ({', '.join(f'{k}: {v}' for k, v in sorted(by.items()))})"
            lines.append(
                f"| {r['workload']} | {r.get('system')} | {req.get('ok', 0)} | {errs} | "
                f"{fmt(lat.get('p50'))} | {fmt(lat.get('p90'))} | {fmt(lat.get('p99'))} | "
                f"{fmt(lat.get('max'))} | {fmt(thr.get('items_per_s'))} | "
                f"{fmt(thr.get('tokens_per_s'))} | "
                f"{fmt(cost_per_million_tokens(thr.get('tokens_per_s'), usd_per_hour))} | "
                f"{goal_text(r)} |")
        lines.append("")
        server = [r for r in rs if r.get("server_us")]
        if server:
            lines += ["Where the time goes (tulip's own timings, p50 in ms): queue = waiting for a "
                      "batch, inference = wall time from the request's first batch being submitted to rose "
                      "until its last result was published, tulip = "
                      "tulip's whole handling; client - tulip = network, gRPC and serialization.", "",
                      "| workload | client p50 | tulip p50 | queue p50 | inference p50 | "
                      "client - tulip |", "|---|---|---|---|---|---|"]
            for r in server:
                s = r["server_us"]
                c50 = r.get("latency_ms", {}).get("p50", 0)
                t50 = s.get("total", {}).get("p50", 0) / 1000.0
                lines.append(f"| {r['workload']} | {fmt(c50)} | {fmt(t50)} | "
                             f"{fmt(s.get('queue', {}).get('p50', 0) / 1000.0)} | "
                             f"{fmt(s.get('inference', {}).get('p50', 0) / 1000.0)} | "
                             f"{fmt(c50 - t50)} |")
            lines.append("")
    # Side by side with the peer.
    by_w = {}
    for r in results:
        by_w.setdefault(r.get("workload"), {})[r.get("system")] = r
    pairs = [(w, d) for w, d in by_w.items() if "garden" in d and len(d) > 1]
    if pairs:
        lines += ["## Garden vs peers", "",
                  "Ratios: peer p50 / garden p50 (latency speed-up) and garden items/s / peer "
                  "items/s (throughput speed-up); above 1 means garden is faster.", "",
                  "| workload | peer | garden p50 ms | peer p50 ms | latency x | garden items/s "
                  "| peer items/s | throughput x |", "|---|---|---|---|---|---|---|---|"]
        for w, d in sorted(pairs, key=lambda p: workload_key(p[1]["garden"])):
            g = d["garden"]
            for s, p in sorted(d.items(), key=lambda kv: system_key(kv[0])):
                if s == "garden":
                    continue
                gl, pl = g.get("latency_ms", {}).get("p50"), p.get("latency_ms", {}).get("p50")
                gt = g.get("throughput", {}).get("items_per_s")
                pt = p.get("throughput", {}).get("items_per_s")
                lx = pl / gl if gl and pl else None
                tx = gt / pt if gt and pt else None
                lines.append(f"| {w} | {s} | {fmt(gl)} | {fmt(pl)} | {fmt(lx)} | {fmt(gt)} | "
                             f"{fmt(pt)} | {fmt(tx)} |")
        lines.append("")
    lines += ["Plots: [latency vs concurrency](latency_vs_concurrency.svg), "
              "[cost per million tokens](cost_per_million_tokens.svg).", ""]
    return "\n".join(lines)


def nice_ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1
    span = hi - lo
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= n:
            step *= m
            break
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 0.5:
        ticks.append(round(v, 10))
        v += step
    return ticks


def svg_doc(width, height, body, title):
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">\n'
            f'<title>{html.escape(title)}</title>\n'
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>\n'
            + "\n".join(body) + "\n</svg>\n")


def svg_latency_vs_concurrency(results):
    """Lines of p50 and p99 latency against concurrent clients, one series per
    (system, workload family) where a family is every workload equal but for concurrency."""
    fams = {}
    for r in results:
        c = r.get("config", {})
        if c.get("mode") == "chat" or not r.get("latency_ms", {}).get("count"):
            continue
        key = (r.get("system"), c.get("mode"), c.get("input"), c.get("seq_len"), c.get("batch"))
        fams.setdefault(key, []).append(r)
    fams = {k: sorted(v, key=lambda r: r["config"]["concurrency"]) for k, v in fams.items()
            if len({r["config"]["concurrency"] for r in v}) > 1}
    W, H, L, R, T, B = 720, 420, 70, 220, 40, 50
    title = "Latency vs concurrent clients"
    body = [f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{title}</text>']
    if not fams:
        body.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no workload was run at '
                    'more than one concurrency</text>')
        return svg_doc(W, H, body, title)
    xs = sorted({r["config"]["concurrency"] for v in fams.values() for r in v})
    ymax = max(r["latency_ms"]["p99"] for v in fams.values() for r in v) * 1.1
    yt = nice_ticks(0, ymax)
    ymax = yt[-1]
    lx = [math.log2(x) for x in xs]
    x0, x1 = min(lx), max(lx) if max(lx) > min(lx) else min(lx) + 1
    px = lambda x: L + (math.log2(x) - x0) / (x1 - x0) * (W - L - R)
    py = lambda y: H - B - y / ymax * (H - T - B)
    body.append(f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>')
    body.append(f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>')
    for y in yt:
        body.append(f'<line x1="{L}" y1="{py(y):.1f}" x2="{W - R}" y2="{py(y):.1f}" '
                    f'stroke="#ddd"/>')
        body.append(f'<text x="{L - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{fmt(y)}</text>')
    for x in xs:
        body.append(f'<text x="{px(x):.1f}" y="{H - B + 18}" text-anchor="middle">{x}</text>')
    body.append(f'<text x="{(L + W - R) / 2}" y="{H - 10}" text-anchor="middle">concurrent '
                'clients</text>')
    body.append(f'<text x="16" y="{(T + H - B) / 2}" text-anchor="middle" '
                f'transform="rotate(-90 16 {(T + H - B) / 2})">latency (ms)</text>')
    ly = T
    for i, (k, v) in enumerate(sorted(fams.items(), key=lambda kv: (system_key(kv[0][0]), str(kv[0])))):
        color = COLORS[i % len(COLORS)]
        for q, dash in (("p50", ""), ("p99", ' stroke-dasharray="5,4"')):
            pts = " ".join(f'{px(r["config"]["concurrency"]):.1f},{py(r["latency_ms"][q]):.1f}'
                           for r in v)
            body.append(f'<polyline points="{pts}" fill="none" stroke="{color}" '
                        f'stroke-width="2"{dash}/>')
            for r in v:
                body.append(f'<circle cx="{px(r["config"]["concurrency"]):.1f}" '
                            f'cy="{py(r["latency_ms"][q]):.1f}" r="3" fill="{color}"/>')
            unit = "tok" if k[2] == "tokens" else "text"
            label = f'{k[0]} {k[1]} {unit}{k[3]} b{k[4]} {q}'
            body.append(f'<line x1="{W - R + 12}" y1="{ly + 6}" x2="{W - R + 36}" y2="{ly + 6}" '
                        f'stroke="{color}" stroke-width="2"{dash}/>')
            body.append(f'<text x="{W - R + 42}" y="{ly + 10}">{html.escape(label)}</text>')
            ly += 18
    return svg_doc(W, H, body, title)


def svg_cost(results, usd_per_hour):
    """Horizontal bars: dollars per million input tokens for each workload and system."""
    rows = []
    for r in sorted(results, key=lambda r: (workload_key(r), system_key(r.get("system", "")))):
        c = cost_per_million_tokens(r.get("throughput", {}).get("tokens_per_s"), usd_per_hour)
        if c is not None and r.get("config", {}).get("mode") != "chat":
            rows.append((r["workload"], r.get("system", "?"), c))
    title = f"Cost per million input tokens at ${usd_per_hour:.2f}/GPU-hour"
    W, L, R, T, B, bar = 760, 230, 90, 40, 40, 16
    H = T + B + max(1, len(rows)) * (bar + 6)
    body = [f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">'
            f'{html.escape(title)}</text>']
    if not rows:
        body.append(f'<text x="{W / 2}" y="{T + 20}" text-anchor="middle">no throughput '
                    'results</text>')
        return svg_doc(W, H, body, title)
    # A log scale: CPU and GPU runs, or peers, differ by orders of magnitude.
    vmax = max(c for _, _, c in rows)
    vmin = min(c for _, _, c in rows)
    lo = 10 ** math.floor(math.log10(vmin)) if vmin > 0 else 1e-6
    hi = 10 ** math.ceil(math.log10(vmax)) if vmax > 0 else 1
    if hi <= lo:
        hi = lo * 10
    px = lambda v: L + (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (W - L - R)
    systems = sorted({s for _, s, _ in rows}, key=system_key)
    d = lo
    while d <= hi * 1.0001:
        body.append(f'<line x1="{px(d):.1f}" y1="{T}" x2="{px(d):.1f}" y2="{H - B}" stroke="#ddd"/>')
        body.append(f'<text x="{px(d):.1f}" y="{H - B + 16}" text-anchor="middle">${fmt(d)}</text>')
        d *= 10
    for i, (w, s, c) in enumerate(rows):
        y = T + i * (bar + 6)
        color = COLORS[systems.index(s) % len(COLORS)]
        body.append(f'<text x="{L - 6}" y="{y + bar - 4}" text-anchor="end">'
                    f'{html.escape(w)} ({html.escape(s)})</text>')
        body.append(f'<rect x="{L}" y="{y}" width="{max(1.0, px(c) - L):.1f}" height="{bar}" '
                    f'fill="{color}"/>')
        body.append(f'<text x="{max(L + 1.0, px(c)) + 4:.1f}" y="{y + bar - 4}">${fmt(c)}</text>')
    body.append(f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>')
    return svg_doc(W, H, body, title)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", help="result directories or files")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--usd-per-hour", type=float, default=3.0)
    a = ap.parse_args(argv)
    results = load_results(a.dirs)
    if not results:
        print(f"render.py: no {SCHEMA} results under {', '.join(a.dirs)}", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(render_markdown(results, a.usd_per_hour))
    with open(os.path.join(a.out, "latency_vs_concurrency.svg"), "w") as f:
        f.write(svg_latency_vs_concurrency(results))
    with open(os.path.join(a.out, "cost_per_million_tokens.svg"), "w") as f:
        f.write(svg_cost(results, a.usd_per_hour))
    print(f"render.py: {len(results)} results -> {a.out}/report.md, "
          "latency_vs_concurrency.svg, cost_per_million_tokens.svg", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
