#!/usr/bin/env python3
"""The chat mesh on a GPU, from outside: HTTP requests to an ivy whose tulip drives a rose on
--device cuda (bench/suites/gpu_mesh_smoke.sh starts them). Standard library only (the GPU host
has no registry access). Checks every answer and prints one JSON line of figures; exit 1 when a
check fails.
    gpu_mesh_smoke.py BASE_URL MODEL_NAME
"""
import json
import sys
import threading
import time
import urllib.error
import urllib.request

BASE, MODEL = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return ok


def call(method, path, body=None, timeout=300):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def wait_ready(limit_s=180):
    end = time.time() + limit_s
    while time.time() < end:
        try:
            if call("GET", "/ready", timeout=5)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def chat(max_tokens, content="Write a long story about a garden.", **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0}
    body.update(extra)
    t0 = time.time()
    st, text, _ = call("POST", "/v1/chat/completions", body)
    return st, text, time.time() - t0


def stream_chat(max_tokens):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to one hundred."}],
            "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(BASE + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    t0 = time.time()
    first = None
    events, done, usage = 0, False, None
    with urllib.request.urlopen(req, timeout=300) as r:
        check(r.status == 200, f"stream status {r.status}")
        check(r.headers.get("Content-Type", "").startswith("text/event-stream"),
              "stream content type")
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if first is None:
                first = time.time() - t0
            payload = line[6:]
            if payload == "[DONE]":
                done = True
                break
            ev = json.loads(payload)
            check("error" not in ev, f"stream error event {payload[:200]}")
            events += 1
            if ev.get("usage"):
                usage = ev["usage"]
    return events, done, usage, first, time.time() - t0


def main():
    if not check(wait_ready(), "ivy /ready within 180 s"):
        return finish({})
    out = {}
    st, text, _ = call("GET", "/v1/models")
    check(st == 200 and MODEL in text, f"/v1/models lists {MODEL}: {st} {text[:200]}")

    # One request, then the decode rate of one sequence.
    st, text, dt = chat(16)
    check(st == 200, f"chat 16 tokens: {st} {text[:300]}")
    st, text, dt = chat(256)
    if check(st == 200, f"chat 256 tokens: {st} {text[:300]}"):
        r = json.loads(text)
        u = r["usage"]
        check(u["completion_tokens"] >= 1, "completion tokens counted")
        check(r["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls"),
              "finish_reason")
        out["single_completion_tokens"] = u["completion_tokens"]
        out["single_prompt_tokens"] = u["prompt_tokens"]
        out["single_wall_s"] = round(dt, 3)
        out["single_tok_per_s"] = round(u["completion_tokens"] / dt, 1)

    events, done, usage, ttft, wall = stream_chat(128)
    check(done, "stream ends with [DONE]")
    check(events >= 2, f"stream events {events}")
    check(usage is not None and usage.get("completion_tokens", 0) >= 1, "stream usage")
    out["stream_events"] = events
    out["stream_first_event_s"] = round(ttft or -1, 3)
    out["stream_wall_s"] = round(wall, 3)

    st, text, _ = call("POST", "/v1/completions",
                       {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 32})
    check(st == 200 and '"text_completion"' in text.replace(" ", ""),
          f"completions: {st} {text[:300]}")

    # A model that does not embed: 400 naming the model, never a 500.
    st, text, _ = call("POST", "/v1/embeddings", {"model": MODEL, "input": "x"})
    check(st == 400, f"embeddings on a chat model: {st} {text[:200]}")

    # Concurrency: N clients at once, every answer 200 with its tokens.
    for n, max_tokens in ((16, 128), (64, 128)):
        results = [None] * n

        def one(i):
            results[i] = chat(max_tokens, content=f"Story number {i}: a garden at night.")
        t0 = time.time()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        ok = [r for r in results if r and r[0] == 200]
        check(len(ok) == n, f"{n} concurrent chats: {len(ok)} answered 200; first other: "
              f"{next((r[:2] for r in results if not r or r[0] != 200), None)}")
        toks = sum(json.loads(r[1])["usage"]["completion_tokens"] for r in ok)
        out[f"concurrent{n}_completion_tokens"] = toks
        out[f"concurrent{n}_wall_s"] = round(wall, 3)
        out[f"concurrent{n}_tok_per_s"] = round(toks / wall, 1)

    st, text, _ = call("GET", "/metrics")
    check(st == 200, f"ivy /metrics {st}")
    return finish(out)


def finish(out):
    out["failures"] = failures
    print(json.dumps(out), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
