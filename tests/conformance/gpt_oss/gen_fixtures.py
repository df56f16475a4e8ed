#!/usr/bin/env python3
"""Reference outputs for rose's gpt-oss forward pass, computed by Hugging Face transformers.

Run once on a machine with torch + transformers (the model runs on the CPU in float32, eager
attention, so no TF32 or GPU nondeterminism enters):

    python3 tests/conformance/gpt_oss/gen_fixtures.py --out OUTDIR

and copy OUTDIR/* into tests/conformance/gpt_oss/fixtures/. It writes:

  bf16/config.json, bf16/model.safetensors
        a tiny random GptOssForCausalLM saved with save_pretrained in bfloat16 (a "bf16
        re-export": experts as dense `mlp.experts.gate_up_proj` / `down_proj` in transformers'
        in-memory layout). Every weight is bf16-representable, so the float32 reference below
        runs on exactly these values.
  mxfp4/config.json, mxfp4/model.safetensors
        the same model as the published checkpoints store it: non-expert tensors bf16, expert
        weights MXFP4 (`*_blocks` uint8 [E, rows, K/32, 16], `*_scales` uint8 [E, rows, K/32],
        rows = output features, low nibble = even element, E8M0 scale bias 127), expert biases
        bf16, config with quantization_config.quant_method = "mxfp4". The random expert weights
        were quantized first and the model holds their dequantized values, so both checkpoints
        describe the same function.
  expected.json        config facts, HF's RoPE inv_freq / attention scaling / cos / sin samples,
                       token sequences (prompt + greedy continuation) and greedy margins
  expected.safetensors seq{i}.logits F32 [len(prompt)+len(generated), vocab]: one full forward
                       pass of GptOssForCausalLM over prompt + generated tokens
  log.txt              versions and self-checks (an independent float64 re-implementation of the
                       spec vs HF, generate() vs recomputed greedy, HF's own MXFP4 dequantizer
                       vs this script's)
"""

import argparse
import copy
import json
import math
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import GptOssConfig, GptOssForCausalLM

SEED = 20261130
VOCAB = 512
HIDDEN = 32          # multiple of 32 (MXFP4 groups along the input dim); != 2*INTER, != INTER
INTER = 64           # so every expert layout is unambiguous by shape
LAYERS = 4
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16        # HEADS*HEAD_DIM = 64 != HIDDEN, like the real model (4096 vs 2880)
EXPERTS = 4
TOPK = 2
WINDOW = 8
PROMPT_LENS = [24, 11]
NEW_TOKENS = 8
ALPHA = 1.702
LIMIT = 7.0

FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def make_config():
    kw = dict(
        num_hidden_layers=LAYERS,
        num_local_experts=EXPERTS,
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        head_dim=HEAD_DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        sliding_window=WINDOW,
        num_experts_per_tok=TOPK,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(LAYERS)],
    )
    # RoPE: the config class defaults ARE the published YaRN settings (theta 150000, factor 32,
    # beta_fast 32, beta_slow 1, original_max_position_embeddings 4096, truncate false); they are
    # not passed so that both the transformers 4 (rope_scaling) and 5 (rope_parameters) spellings
    # come out as that version writes them. The script checks the resulting inv_freq below.
    cfg = GptOssConfig(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


def quantize_mxfp4(w):
    """w float32 [..., K] (K % 32 == 0) -> (blocks uint8 [..., K/32, 16], scales uint8 [..., K/32])."""
    *pre, k = w.shape
    g = w.reshape(*pre, k // 32, 32)
    amax = g.abs().amax(-1).clamp(min=2.0 ** -100)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-120, 120)
    scaled = g / torch.pow(2.0, e)[..., None]
    mags = torch.tensor(FP4[:8], dtype=torch.float32)
    idx = (scaled.abs()[..., None] - mags).abs().argmin(-1)  # 0..7
    neg = (scaled < 0) & (idx > 0)
    codes = (idx + 8 * neg.to(idx.dtype)).to(torch.uint8).reshape(*pre, k // 32, 16, 2)
    blocks = (codes[..., 0] | (codes[..., 1] << 4)).to(torch.uint8)
    scales = (e + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def dequantize_mxfp4(blocks, scales):
    """The reference algorithm (transformers convert_moe_packed_tensors / gpt_oss weights.py)."""
    lut = torch.tensor(FP4, dtype=torch.float32)
    *pre, g, b = blocks.shape
    lo = (blocks & 0x0F).long()
    hi = (blocks >> 4).long()
    out = torch.empty(*pre, g, b * 2, dtype=torch.float32)
    out[..., 0::2] = lut[lo]
    out[..., 1::2] = lut[hi]
    out = out * torch.pow(2.0, scales.to(torch.float32) - 127.0)[..., None]
    return out.reshape(*pre, g * b * 2)


def spec_inv_freq():
    """YaRN per the spec (float64): returns (inv_freq[half], attention_scaling)."""
    d, theta, s, l0, bf, bs = HEAD_DIM, 150000.0, 32.0, 4096, 32.0, 1.0
    half = d // 2

    def corr(rot):
        return d * math.log(l0 / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(corr(bf), 0), min(corr(bs), d - 1)
    inv = []
    for i in range(half):
        base = theta ** (-2.0 * i / d)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        m = 1 - ramp
        inv.append(base / s * (1 - m) + base * m)
    return torch.tensor(inv, dtype=torch.float64), 0.1 * math.log(s) + 1.0


def spec_forward(sd, layer_types, ids, log_counts):
    """Independent float64 forward pass written from the spec, on the bf16 state dict."""
    f = {k: v.to(torch.float64) for k, v in sd.items()}
    ids = torch.tensor(ids)
    t_len = len(ids)
    x = f["model.embed_tokens.weight"][ids]
    inv, c = spec_inv_freq()
    ang = torch.arange(t_len, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang) * c, torch.sin(ang) * c

    def rms(v, w):
        return v / torch.sqrt((v * v).mean(-1, keepdim=True) + 1e-5) * w

    def rope(u):  # [T, heads, D]
        h = HEAD_DIM // 2
        u1, u2 = u[..., :h], u[..., h:]
        cc, ss = cos[:, None, :], sin[:, None, :]
        return torch.cat([u1 * cc - u2 * ss, u2 * cc + u1 * ss], -1)

    clamps = {"gate": 0, "up": 0}
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        t = rms(x, f[p + "input_layernorm.weight"])
        q = (t @ f[p + "self_attn.q_proj.weight"].T + f[p + "self_attn.q_proj.bias"]).reshape(t_len, HEADS, HEAD_DIM)
        k = (t @ f[p + "self_attn.k_proj.weight"].T + f[p + "self_attn.k_proj.bias"]).reshape(t_len, KV_HEADS, HEAD_DIM)
        v = (t @ f[p + "self_attn.v_proj.weight"].T + f[p + "self_attn.v_proj.bias"]).reshape(t_len, KV_HEADS, HEAD_DIM)
        q, k = rope(q), rope(k)
        sliding = layer_types[l] == "sliding_attention"
        i_idx = torch.arange(t_len)[:, None]
        j_idx = torch.arange(t_len)[None, :]
        allowed = j_idx <= i_idx
        if sliding:
            allowed = allowed & (i_idx - j_idx < WINDOW)
        out = torch.zeros(t_len, HEADS, HEAD_DIM, dtype=torch.float64)
        for h in range(HEADS):
            g = h // (HEADS // KV_HEADS)
            s = q[:, h] @ k[:, g].T * HEAD_DIM ** -0.5
            s = s.masked_fill(~allowed, -math.inf)
            sink = f[p + "self_attn.sinks"][h]
            m = torch.maximum(s.max(-1).values, sink)
            e = torch.exp(s - m[:, None])
            z = e.sum(-1) + torch.exp(sink - m)
            out[:, h] = (e / z[:, None]) @ v[:, g]
        x = x + out.reshape(t_len, -1) @ f[p + "self_attn.o_proj.weight"].T + f[p + "self_attn.o_proj.bias"]
        t = rms(x, f[p + "post_attention_layernorm.weight"])
        r = t @ f[p + "mlp.router.weight"].T + f[p + "mlp.router.bias"]
        top = torch.topk(r, TOPK, dim=-1)
        w = torch.softmax(top.values, -1)
        gu = f[p + "mlp.experts.gate_up_proj"]      # [E, H, 2I] (HF layout, checked by the caller)
        dn = f[p + "mlp.experts.down_proj"]         # [E, I, H]
        gub = f[p + "mlp.experts.gate_up_proj_bias"]
        dnb = f[p + "mlp.experts.down_proj_bias"]
        y = torch.zeros_like(x)
        for ti in range(t_len):
            for kk in range(TOPK):
                e_id = int(top.indices[ti, kk])
                h1 = t[ti] @ gu[e_id] + gub[e_id]
                gate, up = h1[0::2], h1[1::2]
                clamps["gate"] += int((gate > LIMIT).sum())
                clamps["up"] += int((up.abs() > LIMIT).sum())
                gate = gate.clamp(max=LIMIT)
                up = up.clamp(-LIMIT, LIMIT)
                a = gate * torch.sigmoid(ALPHA * gate) * (up + 1)
                y[ti] += w[ti, kk] * (a @ dn[e_id] + dnb[e_id])
        x = x + y
    x = rms(x, f["model.norm.weight"])
    log_counts.append(clamps)
    return x @ f["lm_head.weight"].T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "bf16"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "mxfp4"), exist_ok=True)
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(str(s))

    def flush_log():
        with open(os.path.join(args.out, "log.txt"), "w") as fh:
            fh.write("\n".join(lines) + "\n")

    try:
        run(args, log)
    finally:
        flush_log()


def run(args, log):
    log(f"torch {torch.__version__} transformers {transformers.__version__} python {sys.version.split()[0]}")
    torch.manual_seed(SEED)
    torch.set_num_threads(4)
    gen = torch.Generator().manual_seed(SEED)

    cfg = make_config()
    model = GptOssForCausalLM(cfg).to(torch.float32).eval()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    log(f"attention implementation: {model.config._attn_implementation}")
    log(f"layer_types: {model.config.layer_types}")
    log("rope config: " + str(getattr(model.config, "rope_parameters", None) or getattr(model.config, "rope_scaling", None)))

    # ---- random weights, all bf16-representable; experts via MXFP4 ----
    quant = {}  # layer -> dict of blocks/scales (published layout: [E, out, K/32, 16])
    found = {"gate_up": 0, "down": 0}
    layout = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                v = 1.0 + 0.2 * torch.randn(shape, generator=gen)
            elif "embed_tokens" in name:
                v = torch.randn(shape, generator=gen)
            elif name.endswith("self_attn.sinks"):
                v = 1.5 * torch.randn(shape, generator=gen)
            elif name.endswith("mlp.router.weight"):
                v = 2.0 * torch.randn(shape, generator=gen) / HIDDEN ** 0.5
            elif name.endswith("mlp.router.bias"):
                v = 0.5 * torch.randn(shape, generator=gen)
            elif name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
                is_gu = name.endswith("gate_up_proj")
                out_f, in_f = (2 * INTER, HIDDEN) if is_gu else (HIDDEN, INTER)
                std = 3.0 / in_f ** 0.5 if is_gu else 0.5 / in_f ** 0.5
                w = std * torch.randn((EXPERTS, out_f, in_f), generator=gen)  # [E, out, in]
                blocks, scales = quantize_mxfp4(w)
                deq = dequantize_mxfp4(blocks, scales)  # [E, out, in], exact in bf16
                assert torch.equal(bf16(deq), deq)
                if shape == (EXPERTS, in_f, out_f):
                    v = deq.transpose(1, 2).contiguous()
                    layout[name.split(".")[-1]] = "[E, in, out] (x @ W)"
                elif shape == (EXPERTS, out_f, in_f):
                    v = deq
                    layout[name.split(".")[-1]] = "[E, out, in] (W @ x)"
                else:
                    raise RuntimeError(f"unexpected expert parameter shape {name} {shape}")
                layer = int(name.split("layers.")[1].split(".")[0])
                key = "gate_up_proj" if is_gu else "down_proj"
                quant.setdefault(layer, {})[key] = (blocks, scales)
                found["gate_up" if is_gu else "down"] += 1
            elif name.endswith("_bias") or name.endswith(".bias"):
                v = (1.0 if "experts" in name else 0.2) * torch.randn(shape, generator=gen)
            elif name == "lm_head.weight":
                v = torch.randn(shape, generator=gen) / HIDDEN ** 0.5
            elif name.endswith("q_proj.weight") or name.endswith("k_proj.weight"):
                v = 1.2 * torch.randn(shape, generator=gen) / shape[-1] ** 0.5
            elif name.endswith(".weight"):
                v = torch.randn(shape, generator=gen) / shape[-1] ** 0.5
            else:
                raise RuntimeError(f"parameter this script does not know: {name} {shape}")
            p.copy_(bf16(v))
    assert found == {"gate_up": LAYERS, "down": LAYERS}, found
    log(f"expert parameter layout in memory: {layout}")
    for n, p in model.named_parameters():
        assert torch.equal(bf16(p.data), p.data), n

    # ---- RoPE as transformers computes it ----
    rope_info = {}
    rot = getattr(model.model, "rotary_emb", None)
    if rot is None:
        rot = getattr(model.model.layers[0].self_attn, "rotary_emb", None)
    if rot is not None:
        inv_hf = rot.inv_freq.detach().to(torch.float32)
        scaling = float(rot.attention_scaling)
        inv_spec, c_spec = spec_inv_freq()
        rel = float(((inv_hf.double() - inv_spec).abs() / inv_spec).max())
        log(f"HF inv_freq vs spec formula: max rel diff {rel:.3e}; attention_scaling HF {scaling!r} spec {c_spec!r}")
        sample_pos = [0, 1, 2, 5, 23, 100, 1000, 4095]
        dummy = torch.zeros(1, len(sample_pos), HIDDEN)
        cos, sin = rot(dummy, torch.tensor([sample_pos]))
        rope_info = {
            "inv_freq": [float(x) for x in inv_hf.tolist()],
            "attention_scaling": scaling,
            "positions": sample_pos,
            "cos": [float(x) for x in cos[0].reshape(-1).tolist()],
            "sin": [float(x) for x in sin[0].reshape(-1).tolist()],
            "cos_width": int(cos.shape[-1]),
        }
    else:
        log("no rotary_emb module found; RoPE samples not recorded")

    # ---- sequences: prompt + greedy continuation (full recompute each step) ----
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    seqs, tensors = [], {}
    with torch.no_grad():
        for si, prompt in enumerate(prompts):
            ids = list(prompt)
            margins = []
            for _ in range(NEW_TOKENS):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
                top2 = torch.topk(logits, 2)
                margins.append(float(top2.values[0] - top2.values[1]))
                ids.append(int(top2.indices[0]))
            full = model(input_ids=torch.tensor([ids])).logits[0].to(torch.float32).contiguous()
            # The full pass must reproduce the step-by-step argmaxes.
            for k in range(NEW_TOKENS):
                if int(full[len(prompt) - 1 + k].argmax()) != ids[len(prompt) + k]:
                    log(f"seq{si}: WARNING full-pass argmax differs from step-by-step greedy at step {k}")
            gen_ids = ids[len(prompt):]
            try:
                # An explicit all-ones mask: with pad_token_id set and no mask, generate() would
                # treat prompt tokens equal to the pad id as padding.
                g = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                   max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS,
                                   pad_token_id=0)
                g = g[0, len(prompt):].tolist()
                log(f"seq{si}: generate() (KV cache) {'matches' if g == gen_ids else 'DIFFERS from'} recomputed greedy: {g}")
            except Exception as ex:  # generation API drift is not fatal for the fixtures
                log(f"seq{si}: generate() failed: {type(ex).__name__}: {ex}")
            log(f"seq{si}: prompt {len(prompt)} tokens, generated {gen_ids}, min greedy margin {min(margins):.4f}")
            seqs.append({"prompt": prompt, "generated": gen_ids, "margins": margins})
            tensors[f"seq{si}.logits"] = full

    # ---- save the bf16 re-export, then derive the MXFP4 checkpoint from it ----
    with tempfile.TemporaryDirectory() as tmp:
        bf = copy.deepcopy(model).to(torch.bfloat16)
        bf.save_pretrained(tmp)
        log("save_pretrained wrote: " + ", ".join(sorted(os.listdir(tmp))))
        shutil.copy(os.path.join(tmp, "config.json"), os.path.join(args.out, "bf16", "config.json"))
        shutil.copy(os.path.join(tmp, "model.safetensors"), os.path.join(args.out, "bf16", "model.safetensors"))
    sd = load_file(os.path.join(args.out, "bf16", "model.safetensors"))
    log("bf16 checkpoint tensors: " + ", ".join(f"{k}{list(v.shape)}:{str(v.dtype).replace('torch.', '')}"
                                             for k, v in sorted(sd.items()) if "layers.0." in k or "layers" not in k))

    # Independent float64 forward from the spec vs HF's float32 logits.
    sd_hf_layout = dict(sd)
    for l in range(LAYERS):
        for key, (out_f, in_f) in (("gate_up_proj", (2 * INTER, HIDDEN)), ("down_proj", (HIDDEN, INTER))):
            n = f"model.layers.{l}.mlp.experts.{key}"
            t = sd[n]
            if tuple(t.shape) == (EXPERTS, out_f, in_f):
                sd_hf_layout[n] = t.transpose(1, 2)
            else:
                assert tuple(t.shape) == (EXPERTS, in_f, out_f), (n, t.shape)
    counts = []
    for si, s in enumerate(seqs):
        ref = spec_forward(sd_hf_layout, model.config.layer_types, s["prompt"] + s["generated"], counts)
        hf = tensors[f"seq{si}.logits"].double()
        rel = float((ref - hf).abs().max() / hf.abs().max())
        log(f"seq{si}: spec float64 re-implementation vs HF float32: max |diff| / max |logit| = {rel:.3e}; clamps hit {counts[-1]}")

    mx = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
            continue
        mx[k] = v.to(torch.bfloat16).contiguous()
    for l, q in quant.items():
        for key, (blocks, scales) in q.items():
            mx[f"model.layers.{l}.mlp.experts.{key}_blocks"] = blocks
            mx[f"model.layers.{l}.mlp.experts.{key}_scales"] = scales
    save_file(mx, os.path.join(args.out, "mxfp4", "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(args.out, "bf16", "config.json")) as fh:
        mcfg = json.load(fh)
    mcfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }
    with open(os.path.join(args.out, "mxfp4", "config.json"), "w") as fh:
        json.dump(mcfg, fh, indent=2)

    # Cross-check this script's dequantizer against transformers' own, when importable.
    try:
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors

        blocks, scales = quant[0]["gate_up_proj"]
        theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16).to(torch.float32)
        ours = dequantize_mxfp4(blocks, scales)
        if theirs.shape != ours.shape and theirs.transpose(1, 2).shape == ours.shape:
            theirs = theirs.transpose(1, 2)
        log(f"transformers convert_moe_packed_tensors {'==' if torch.equal(theirs, ours) else '!='} this script's dequantizer "
            f"(shapes {list(theirs.shape)} / {list(ours.shape)})")
    except Exception as ex:
        log(f"transformers' MXFP4 dequantizer not compared: {type(ex).__name__}: {ex}")

    expected = {
        "generator": "tests/conformance/gpt_oss/gen_fixtures.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "vocab_size": VOCAB,
        "sliding_window": WINDOW,
        "layer_types": list(model.config.layer_types),
        "rope": rope_info,
        "sequences": seqs,
    }
    with open(os.path.join(args.out, "expected.json"), "w") as fh:
        json.dump(expected, fh, separators=(",", ":"))
    save_file(tensors, os.path.join(args.out, "expected.safetensors"))
    for root, _, files in os.walk(args.out):
        for fn in sorted(files):
            pth = os.path.join(root, fn)
            log(f"wrote {os.path.relpath(pth, args.out)} ({os.path.getsize(pth)} bytes)")


if __name__ == "__main__":
    main()
