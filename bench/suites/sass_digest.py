#!/usr/bin/env python3
"""Digest of `cuobjdump -sass` output for the kernels whose name contains a pattern: per kernel,
the instruction count, the global loads / tensor-core ops / barriers and, for the main loop, the
order of LDG, HMMA and BAR (one letter each: L = LDG, M = HMMA, B = BAR, S = LDS/LDSM) so one can
see how many loads are issued ahead of the mma that use them.
    python3 bench/suites/sass_digest.py FILE.sass PATTERN
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_parse import kernels as parse  # noqa: E402

path, pat = sys.argv[1], sys.argv[2]
kernels = [(name, [op for _, op, _ in body]) for name, body in parse(path)]
for name, body in kernels:
    if pat not in name:
        continue
    letters = "".join("L" if op.startswith("LDG") else "M" if op.startswith("HMMA") else
                      "B" if op.startswith("BAR") else "S" if op.startswith(("LDS", "LDSM")) else
                      "" for op in body)
    print(f"{name[:120]}\n  {len(body)} instructions, LDG {letters.count('L')}, HMMA {letters.count('M')},"
          f" BAR {letters.count('B')}, LDS/LDSM {letters.count('S')}")
    print("  order:", letters[:400])
