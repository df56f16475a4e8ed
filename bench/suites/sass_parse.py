"""`cuobjdump -sass` output as (kernel name, [(address, opcode, operands)]) per function, shared by
sass_digest.py and sass_spills.py."""
import re


def kernels(path):
    out, cur, body = [], None, []
    for line in open(path, errors="replace"):
        m = re.search(r"Function : (\S+)", line)
        if m:
            if cur:
                out.append((cur, body))
            cur, body = m.group(1), []
            continue
        if cur:
            ins = re.search(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)([^;]*);", line)
            if ins:
                body.append((int(ins.group(1), 16), ins.group(3), ins.group(4)))
    if cur:
        out.append((cur, body))
    return out
