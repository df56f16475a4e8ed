#!/usr/bin/env python3
"""Validates the outputs grammar_o200k_test wrote (grammar_o200k_outputs.jsonl: one JSON line per
finished random generation under a schema's token masks) with Python's `jsonschema`, a reference
JSON Schema validator independent of common/grammar and of the tests' own SchemaValidator.

Each document must parse with Python's json module and validate under Draft 2020-12 with the
format checker (the formats jsonschema checks with the packages installed). `nullable: true`
(the OpenAPI keyword common/grammar accepts) is rewritten to a type union first, since JSON
Schema ignores it. Exits 1 on any failure, printing each; 0 with counts otherwise. Fails (does not
skip) when jsonschema is missing.
"""
import importlib.metadata
import json
import sys

try:
    import jsonschema
except ImportError:
    print("jsonschema_crosscheck: the Python package 'jsonschema' is required", file=sys.stderr)
    sys.exit(1)


def openapi_nullable(s):
    if isinstance(s, dict):
        s = {k: openapi_nullable(v) for k, v in s.items()}
        if s.pop("nullable", False) is True and "type" in s:
            t = s["type"]
            s["type"] = (t if isinstance(t, list) else [t]) + ["null"]
        return s
    if isinstance(s, list):
        return [openapi_nullable(v) for v in s]
    return s


def main(path):
    lines = [l for l in open(path, encoding="utf-8") if l.strip()]
    if not lines:
        print(f"jsonschema_crosscheck: {path} holds no outputs", file=sys.stderr)
        return 1
    cls = jsonschema.Draft202012Validator
    failures, names = 0, set()
    for n, line in enumerate(lines, 1):
        rec = json.loads(line)
        names.add(rec["name"])
        schema = openapi_nullable(rec["schema"])
        text = bytes.fromhex(rec["doc_hex"]).decode("utf-8")
        try:
            doc = json.loads(text)
        except ValueError as e:
            print(f"line {n} ({rec['name']}): not JSON ({e}): {text!r}")
            failures += 1
            continue
        errors = list(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(doc))
        for e in errors:
            print(f"line {n} ({rec['name']}): {e.message} at {list(e.absolute_path)}: {text!r}")
        failures += bool(errors)
    print(f"jsonschema {importlib.metadata.version('jsonschema')}: "
          f"{len(lines)} outputs over {len(names)} schemas, {failures} invalid")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
