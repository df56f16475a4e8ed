#!/usr/bin/env python3
"""Unit tests of bench/render/render.py (stdlib unittest): cost formula, goal verdicts, peer
ratios, markdown table shape and well-formed SVG, on synthetic results."""
import io
import json
import os
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from contextlib import redirect_stderr

SRC = os.environ.get("GARDEN_SOURCE_DIR",
                     os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path.insert(0, os.path.join(SRC, "bench", "render"))
import render  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def result(workload, system="garden", suite="low_latency_embedding", mode="embed", seq=128,
           batch=1, conc=1, p50=1.0, p99=1.2, items=1000.0, tokens=None, gpu="NVIDIA H200"):
    return {
        "schema": render.SCHEMA, "workload": workload, "suite": suite, "system": system,
        "date": "2026-11-30T00:00:00Z", "git_commit": "abc",
        "host": {"hostname": "h", "cpu": "c", "cores": 16, "kernel": "k", "gpu": gpu},
        "config": {"mode": mode, "input": "tokens", "seq_len": seq, "batch": batch,
                   "concurrency": conc},
        "requests": {"ok": 100, "errors": 0, "by_status": {"OK": 100}},
        "latency_ms": {"count": 100, "min": p50 / 2, "mean": p50, "p50": p50, "p90": p99,
                       "p99": p99, "max": p99 * 2},
        "throughput": {"requests_per_s": items / batch, "items_per_s": items,
                       "tokens_per_s": tokens if tokens is not None else items * seq},
    }


class RenderTest(unittest.TestCase):
    def test_cost_per_million_tokens(self):
        # $3/h over 1e6 tokens/s: 3/3600 dollars per 1e6 tokens.
        self.assertAlmostEqual(render.cost_per_million_tokens(1e6), 3.0 / 3600)
        self.assertAlmostEqual(render.cost_per_million_tokens(1000, 3.0), 3.0 / 3600 * 1000)
        self.assertIsNone(render.cost_per_million_tokens(0))

    def test_goals_met_missed_and_cpu(self):
        met = result("embed_tok128_b1_c1", p50=0.9, p99=1.1)
        missed_tail = result("embed_tok512_b1_c1", seq=512, p50=1.4, p99=2.0)
        thr = result("embed_tok512_b100_c4", suite="high_throughput", seq=512, batch=100,
                     conc=4, items=900)
        cpu = result("embed_tok4096_b1_c1", seq=4096, p50=0.5, p99=0.6, gpu="none")
        self.assertIn("**met**", render.goal_text(met))
        self.assertIn("**missed**", render.goal_text(missed_tail))  # p99 > 1.3 x p50
        self.assertIn("**missed**", render.goal_text(thr))  # 900 < 1150
        self.assertIn("n/a: CPU run", render.goal_text(cpu))
        self.assertEqual(render.goal_text(result("embed_tok128_b1_c1", system="hf_transformers")),
                         "")

    def test_markdown_tables_and_peer_ratio(self):
        rs = [result("embed_tok512_b100_c4", suite="high_throughput", seq=512, batch=100,
                     conc=4, p50=80, p99=90, items=1200),
              result("embed_tok512_b100_c4", system="hf_transformers", suite="high_throughput",
                     seq=512, batch=100, conc=4, p50=200, p99=210, items=300)]
        md = render.render_markdown(rs, 3.0)
        self.assertIn("## Garden vs peers", md)
        row = [l for l in md.splitlines() if l.startswith("| embed_tok512_b100_c4 | hf_transformers | 80")]
        self.assertEqual(len(row), 1, md)
        cells = [c.strip() for c in row[0].strip("|").split("|")]
        self.assertEqual(cells[4], "2.5")  # 200 / 80
        self.assertEqual(cells[7], "4")    # 1200 / 300
        self.assertNotIn("CPU harness check", md)
        header = None
        for line in md.splitlines():
            if line.startswith("| workload | system | ok"):
                header = line.count("|")
            elif not line:
                header = None
            elif header and line.startswith("| "):
                self.assertEqual(line.count("|"), header, line)

    def test_svgs_are_well_formed(self):
        rs = [result(f"embed_text512_b1_c{c}", suite="high_concurrency", seq=512, conc=c,
                     p50=c * 1.0, p99=c * 1.5) for c in (1, 2, 4, 8, 16)]
        rs.append(result("chat_text128_c4", suite="chat_streaming", mode="chat"))
        root = ET.fromstring(render.svg_latency_vs_concurrency(rs))
        self.assertEqual(root.tag, SVG + "svg")
        lines = root.findall(SVG + "polyline")
        self.assertEqual(len(lines), 2)  # p50 and p99 of the one family
        self.assertEqual(len(lines[0].get("points").split()), 5)
        root = ET.fromstring(render.svg_cost(rs, 3.0))
        self.assertEqual(len(root.findall(SVG + "rect")), 1 + 5)  # background + one bar each
        # No multi-concurrency family: still a valid SVG that says so.
        root = ET.fromstring(render.svg_latency_vs_concurrency(rs[:1]))
        self.assertIn("more than one concurrency", "".join(root.itertext()))
        # Names with markup characters are escaped.
        odd = [result("a<b>&c", tokens=10)]
        ET.fromstring(render.svg_cost(odd, 3.0))

    def test_main_reads_dirs_ignores_other_json_and_fails_when_empty(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out")
            err = io.StringIO()
            with redirect_stderr(err):
                self.assertEqual(render.main(["--out", out, d]), 2)
            with open(os.path.join(d, "other.json"), "w") as f:
                json.dump({"not": "a result"}, f)
            with open(os.path.join(d, "broken.json"), "w") as f:
                f.write("{")
            with open(os.path.join(d, "r.json"), "w") as f:
                json.dump(result("embed_tok128_b1_c1", gpu="none"), f)
            with redirect_stderr(err):
                self.assertEqual(render.main(["--out", out, d]), 0)
            with open(os.path.join(out, "report.md")) as f:
                md = f.read()
            self.assertIn("CPU harness check", md)
            self.assertIn("embed_tok128_b1_c1", md)
            for svg in ("latency_vs_concurrency.svg", "cost_per_million_tokens.svg"):
                ET.parse(os.path.join(out, svg))


if __name__ == "__main__":
    unittest.main(verbosity=2)
