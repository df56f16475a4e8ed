#!/usr/bin/env python3
"""Where the local-memory spills of a kernel sit, from `cuobjdump -sass` output: for the kernels
whose name contains PATTERN, the number of spill loads/stores (LDL/STL) and how many of them lie
inside a main loop (between a backward branch's target and the branch) that also holds a
tensor-core op (HGMMA/HMMA) — spills there run every K step, elsewhere once per tile.
    python3 bench/suites/sass_spills.py FILE.sass PATTERN
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_parse import kernels as parse  # noqa: E402

path, pat = sys.argv[1], sys.argv[2]
kernels = parse(path)
for name, body in kernels:
    if pat not in name:
        continue
    addr_index = {a: i for i, (a, _, _) in enumerate(body)}
    loops = []
    for i, (a, op, rest) in enumerate(body):
        if op.startswith("BRA"):
            t = re.search(r"0x([0-9a-f]+)", rest)
            if t and int(t.group(1), 16) <= a and int(t.group(1), 16) in addr_index:
                loops.append((addr_index[int(t.group(1), 16)], i))
    mma_loops = [(s, e) for s, e in loops
                 if any(body[k][1].startswith(("HGMMA", "HMMA")) for k in range(s, e + 1))]
    spills = [i for i, (_, op, _) in enumerate(body) if op.startswith(("LDL", "STL"))]
    inside = [i for i in spills if any(s <= i <= e for s, e in mma_loops)]
    print(f"{name[:90]}: {len(body)} instructions, {len(spills)} LDL/STL, "
          f"{len(inside)} inside {len(mma_loops)} loops holding tensor-core ops")
