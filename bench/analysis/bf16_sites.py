#!/usr/bin/env python3
"""Which bf16 rounding sites of rose's CUDA gpt-oss path cost the most top-1 agreement?

A numpy-only (no torch, no safetensors package) float32 re-implementation of the gpt-oss
forward pass (/work/shared/spec/gpt-oss.md §2.2-§2.5), with bf16 round-to-nearest-even
rounding switchable at named sites, and TF32 matmul emulation.

  1. --validate: the fp32 forward against Hugging Face transformers' logits in
     tests/conformance/gpt_oss/fixtures (bf16 and MXFP4 checkpoints), at the conformance
     test's tolerance (max over rows of max|diff| / max|want| <= 1e-4); also the greedy tokens,
     prefill + one-token decode against the full pass, MXFP4 == bf16 experts, YaRN tables.
     Refuses to measure when this fails.
  2. --model DIR: teacher-forced measurement. For each prompt (random ids in [0, 199998),
     fixed seeds) the fp32 model greedily decodes 32 tokens (prefill + 31 one-token decode
     steps with a KV cache); those 32 logits rows are the reference. Then each configuration
     runs ONE full pass over prompt + the first 31 greedy tokens and its logits at the same 32
     positions (the ones predicting the 32 greedy tokens, as tests/gpu/llm_model_test.cc's
     teacherForced does) are compared with the reference: top-1 agreement, min / median cosine.

Sites (bf16 rounding of float32 values, round to nearest even):
  embed       embedding rows (a no-op: the checkpoint's rows are bf16 already)
  norm_out    every RMSNorm output that feeds a GEMM: attention input norm -> QKV,
              post-attention norm -> experts, final norm -> lm_head (router: never; rose's CUDA
              router reads the f32 stream with f32 weights)
  qkv_out     QKV GEMM output incl. bias, before RoPE
  kv_cache    K (after RoPE) and V as stored
  attn_out    attention output = O-proj input
  oproj_out   O-proj output (incl. bias) before the residual add
  moe_in      the experts' input rows (the same tensor as norm_out's post-attention norm)
  swiglu_out  expert intermediate after the clamped SwiGLU = down-proj input
  expert_out  each expert's down-proj output (incl. bias) before the weighted combine
  moe_out     the combined MoE output before the residual add
  residual    the residual stream after every add (CUDA keeps it f32)
Sub-sites of norm_out (to split it): norm_attn (attention input norm -> QKV) and norm_final
(final norm -> lm_head); the third part is moe_in.
Extra sites (not in the "cuda" set; found by reading rose's CUDA kernels): q_rope (q after
RoPE: ropeKvWrite rotates q in place in the bf16 qkv buffer) and attn_probs (the
un-normalized softmax numerators P rounded to bf16 before P.V, as the sm90 attention kernels
feed P to wgmma from registers as bf16; the denominator stays f32).
"cuda" = every site above except residual (and the extras). Some configurations round to IEEE
fp16 instead of bf16 at chosen sites (Opts(f16=...); overflows to inf are counted and logged).

Columns: agreement (top-1 equal to fp32's), min / median cosine of the logits rows, decisive
flips (top-1 differs where fp32's top-2 margin is >= 0.05), routes differing (share of
(token, layer) pairs over the whole sequences whose top-k expert SET differs from the fp32 full
pass's), mean relative logit error (mean over positions of |got - fp32| / |fp32|, L2 norms).

TF32 emulation: both inputs of every float32 matmul (QKV, O, router, experts, lm_head, and the
two attention products Q.K^T and P.V, as Hugging Face eager attention does them with matmul)
rounded to 10 mantissa bits (nearest-even; "tf32 (truncating)" drops the 13 bits instead). The weights are bf16
(7 mantissa bits), so only the activations change; this is checked at load.

Usage (Debian's /usr/bin/python3 with apt's python3-numpy; results:
bench/results/bf16-sites-2026-12-05-cpu.md):
  python3 bench/analysis/bf16_sites.py --validate
  python3 bench/analysis/bf16_sites.py --model /tmp/DIR [--prompts 6 --prompt-len 1000]
      [--prompt-file prompts.json] [--configs all] [--out table.md]
"""

import argparse
import json
import os
import platform
import struct
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "conformance", "gpt_oss", "fixtures")
CONFORMANCE_REL_TOL = 1e-4  # tests/conformance/gpt_oss/gpt_oss_conformance_test.cc kRelTol

SITES = ["embed", "norm_out", "qkv_out", "kv_cache", "attn_out", "oproj_out", "moe_in",
         "swiglu_out", "expert_out", "moe_out", "residual"]
EXTRA_SITES = ["q_rope", "attn_probs"]
SUB_SITES = ["norm_attn", "norm_final"]
CUDA_SITES = [s for s in SITES if s != "residual"]

# --------------------------------------------------------------------------------------------
# Rounding helpers


def bf16_round(x):
    """float32 -> bf16 (round to nearest even) -> float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    r = (u + np.uint32(0x7FFF) + lsb) & np.uint32(0xFFFF0000)
    return r.view(np.float32)


def tf32_round(x):
    """float32 -> TF32 (10 mantissa bits, round to nearest even) -> float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    lsb = (u >> np.uint32(13)) & np.uint32(1)
    r = (u + np.uint32(0xFFF) + lsb) & np.uint32(0xFFFFE000)
    return r.view(np.float32)


def tf32_trunc(x):
    """float32 -> TF32 by dropping the 13 low mantissa bits (round toward zero)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return (u & np.uint32(0xFFFFE000)).view(np.float32)


def bf16_exact(x):
    return bool(np.array_equal(bf16_round(x), np.asarray(x, dtype=np.float32)))


# --------------------------------------------------------------------------------------------
# safetensors (parsed by hand: u64 LE header length, JSON header, raw LE data)

_DT = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
       "U8": np.uint8, "I8": np.int8, "I32": np.int32, "I64": np.int64, "U16": np.uint16}


class Safetensors:
    def __init__(self, path):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            self.header = json.loads(f.read(n).decode("utf-8"))
        self.base = 8 + n
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")
        self.header.pop("__metadata__", None)

    def names(self):
        return list(self.header.keys())

    def __contains__(self, name):
        return name in self.header

    def raw(self, name):
        h = self.header[name]
        a, b = h["data_offsets"]
        dt = _DT[h["dtype"]]
        buf = self.mm[self.base + a:self.base + b]
        return h["dtype"], np.frombuffer(buf, dtype=np.dtype(dt).newbyteorder("<")).reshape(h["shape"])

    def f32(self, name):
        dt, a = self.raw(name)
        if dt == "BF16":
            return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
        if dt in ("F32", "F16", "F64"):
            return a.astype(np.float32)
        raise ValueError(f"{name}: dtype {dt} is not a float")


FP4_VALUES = np.array([+0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def dequant_mxfp4(blocks, scales):
    """blocks [..., G, 16] u8, scales [..., G] u8 -> [..., G*32] f32 (spec §2.5)."""
    lo = blocks & 0x0F  # even element
    hi = blocks >> 4  # odd element
    codes = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    vals = FP4_VALUES[codes]
    exp = scales.astype(np.int32) - 127
    out = np.ldexp(vals, exp[..., None]).astype(np.float32)
    return out.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


# --------------------------------------------------------------------------------------------
# Model


class Model:
    def __init__(self, d):
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        self.dir = d
        self.cfg = c
        self.H = c["hidden_size"]
        self.L = c["num_hidden_layers"]
        self.Hq = c["num_attention_heads"]
        self.Hkv = c["num_key_value_heads"]
        self.D = c.get("head_dim", self.H // self.Hq)
        self.I = c["intermediate_size"]
        self.E = c.get("num_local_experts", c.get("num_experts"))
        self.K = c.get("num_experts_per_tok", c.get("experts_per_token"))
        self.window = c["sliding_window"]
        lt = c.get("layer_types") or [("sliding_attention" if i % 2 == 0 else "full_attention")
                                      for i in range(self.L)]
        self.sliding = [t == "sliding_attention" for t in lt]
        self.eps = float(c.get("rms_norm_eps", 1e-5))
        self.limit = float(c.get("swiglu_limit", 7.0))
        self.alpha = float(c.get("swiglu_alpha", 1.702))
        rp = c.get("rope_parameters") or c.get("rope_scaling") or {}
        self.theta = float(rp.get("rope_theta", c.get("rope_theta", 150000.0)))
        self.rope = rp
        self.vocab = c["vocab_size"]
        st = Safetensors(os.path.join(d, "model.safetensors"))
        self.st = st
        self.expert_format = None
        self.weights_bf16_exact = True
        self._load(st, c)
        self._rope_init()

    def _chk(self, a):
        # Every GEMM weight must be exactly bf16 (so TF32 rounding of weights is the identity).
        if not bf16_exact(a):
            self.weights_bf16_exact = False
        return a

    def _load(self, st, c):
        H, Hq, Hkv, D, I, E = self.H, self.Hq, self.Hkv, self.D, self.I, self.E
        self.embed = st.f32("model.embed_tokens.weight")  # [V, H]
        head = "model.embed_tokens.weight" if c.get("tie_word_embeddings") else "lm_head.weight"
        self.lm_head_T = np.ascontiguousarray(self._chk(st.f32(head)).T)  # [H, V]
        self.final_norm = st.f32("model.norm.weight")
        self.layers = []
        for l in range(self.L):
            p = f"model.layers.{l}."
            Ly = {}
            Ly["in_norm"] = st.f32(p + "input_layernorm.weight")
            Ly["post_norm"] = st.f32(p + "post_attention_layernorm.weight")
            q = st.f32(p + "self_attn.q_proj.weight")
            k = st.f32(p + "self_attn.k_proj.weight")
            v = st.f32(p + "self_attn.v_proj.weight")
            assert q.shape == (Hq * D, H) and k.shape == (Hkv * D, H) and v.shape == (Hkv * D, H)
            Ly["wqkv_T"] = np.ascontiguousarray(self._chk(np.concatenate([q, k, v], 0)).T)
            Ly["bqkv"] = np.concatenate([st.f32(p + "self_attn.q_proj.bias"),
                                         st.f32(p + "self_attn.k_proj.bias"),
                                         st.f32(p + "self_attn.v_proj.bias")])
            o = st.f32(p + "self_attn.o_proj.weight")
            assert o.shape == (H, Hq * D)
            Ly["wo_T"] = np.ascontiguousarray(self._chk(o).T)
            Ly["bo"] = st.f32(p + "self_attn.o_proj.bias")
            Ly["sinks"] = st.f32(p + "self_attn.sinks")
            r = st.f32(p + "mlp.router.weight")
            assert r.shape == (E, H)
            Ly["wr_T"] = np.ascontiguousarray(self._chk(r).T)
            Ly["br"] = st.f32(p + "mlp.router.bias")
            ep = p + "mlp.experts."
            if ep + "gate_up_proj_blocks" in st:
                self.expert_format = "mxfp4"
                w1 = dequant_mxfp4(st.raw(ep + "gate_up_proj_blocks")[1],
                                   st.raw(ep + "gate_up_proj_scales")[1])  # [E, 2I, H]
                w2 = dequant_mxfp4(st.raw(ep + "down_proj_blocks")[1],
                                   st.raw(ep + "down_proj_scales")[1])  # [E, H, I]
                assert w1.shape == (E, 2 * I, H) and w2.shape == (E, H, I), (w1.shape, w2.shape)
                w1 = w1.transpose(0, 2, 1)  # [E, H, 2I]  (x @ W)
                w2 = w2.transpose(0, 2, 1)  # [E, I, H]
            else:
                self.expert_format = "bf16"
                w1 = st.f32(ep + "gate_up_proj")
                w2 = st.f32(ep + "down_proj")
                # transformers' layout is [E, in, out]; accept [E, out, in] too
                if w1.shape == (E, 2 * I, H) and w1.shape != (E, H, 2 * I):
                    w1 = w1.transpose(0, 2, 1)
                if w2.shape == (E, H, I) and w2.shape != (E, I, H):
                    w2 = w2.transpose(0, 2, 1)
                assert w1.shape == (E, H, 2 * I) and w2.shape == (E, I, H), (w1.shape, w2.shape)
            Ly["w1"] = np.ascontiguousarray(self._chk(w1))
            Ly["w2"] = np.ascontiguousarray(self._chk(w2))
            Ly["b1"] = st.f32(ep + "gate_up_proj_bias")  # [E, 2I] interleaved
            Ly["b2"] = st.f32(ep + "down_proj_bias")  # [E, H]
            self.layers.append(Ly)

    def _rope_init(self):
        """YaRN as transformers' _compute_yarn_parameters (truncate false) in float32."""
        D, rp = self.D, self.rope
        half = D // 2
        base = self.theta
        factor = float(rp.get("factor", 1.0))
        rtype = rp.get("rope_type", rp.get("type", "default"))
        # base ** (arange / D): the exponent in float32 as transformers has it, the power correctly
        # rounded (numpy's float32 power is 2 ulp off at one entry of the fixture's table)
        ex_ = (np.arange(0, D, 2, dtype=np.float32) / np.float32(D)).astype(np.float64)
        pos_freqs = (base ** ex_).astype(np.float32)
        extrap = (np.float32(1.0) / pos_freqs).astype(np.float32)
        if rtype != "yarn":
            self.inv_freq = extrap
            self.mscale = 1.0
            return
        interp = (np.float32(1.0) / (np.float32(factor) * pos_freqs)).astype(np.float32)
        bf, bs = float(rp.get("beta_fast", 32.0)), float(rp.get("beta_slow", 1.0))
        omax = float(rp.get("original_max_position_embeddings", 4096))

        def corr_dim(nrot):
            return (D * np.log(omax / (nrot * 2 * np.pi))) / (2 * np.log(base))

        low, high = corr_dim(bf), corr_dim(bs)
        if rp.get("truncate", True):
            low, high = np.floor(low), np.ceil(high)
        low, high = max(low, 0), min(high, D - 1)
        if low == high:
            high += 0.001
        ramp = ((np.arange(half, dtype=np.float32) - np.float32(low)) / np.float32(high - low)).astype(np.float32)
        ramp = np.clip(ramp, 0, 1).astype(np.float32)
        extrap_factor = (np.float32(1) - ramp).astype(np.float32)
        self.inv_freq = (interp * (np.float32(1) - extrap_factor) + extrap * extrap_factor).astype(np.float32)
        ms = rp.get("attention_factor")
        self.mscale = float(ms) if ms is not None else 0.1 * np.log(factor) + 1.0

    def rope_tables(self, pos):
        ang = (pos.astype(np.float32)[:, None] * self.inv_freq[None, :]).astype(np.float32)
        c = (np.cos(ang.astype(np.float64)).astype(np.float32) * np.float32(self.mscale)).astype(np.float32)
        s = (np.sin(ang.astype(np.float64)).astype(np.float32) * np.float32(self.mscale)).astype(np.float32)
        return c, s


# --------------------------------------------------------------------------------------------
# Forward


def f16_round(x):
    """float32 -> IEEE fp16 (round to nearest even; overflow -> inf) -> float32."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


class Opts:
    def __init__(self, sites=(), tf32=None, f16=()):
        self.f16 = frozenset(f16)  # sites rounded to fp16 instead of bf16
        self.sites = frozenset(sites) | self.f16
        for s in self.sites:
            assert s in SITES or s in EXTRA_SITES or s in SUB_SITES, s
        self.tf32 = tf32  # None, "rne", "trunc"
        self.route_log = None  # a list: moe() appends each layer's sorted top-k ids [T, K]
        self.f16_overflow = 0  # finite values that became inf in fp16

    def r(self, site, x, also=None):
        if site in self.f16 or also in self.f16:
            y = f16_round(x)
            self.f16_overflow += int(np.count_nonzero(np.isinf(y) & np.isfinite(x)))
            return y
        return bf16_round(x) if site in self.sites or also in self.sites else x

    def mm(self, a, b):
        if self.tf32 is None:
            return a @ b
        f = tf32_round if self.tf32 == "rne" else tf32_trunc
        return f(a) @ f(b)

    def mm_w(self, a, w):
        """activation @ weight; weights are bf16-exact so TF32 leaves them unchanged."""
        if self.tf32 is None:
            return a @ w
        f = tf32_round if self.tf32 == "rne" else tf32_trunc
        return f(a) @ w


def rmsnorm(x, w, eps):
    var = np.mean(x.astype(np.float32) * x, axis=-1, keepdims=True, dtype=np.float32)
    y = x * (np.float32(1.0) / np.sqrt(var + np.float32(eps)))
    return (w * y).astype(np.float32)


def rope_apply(x, c, s):
    """x [T, h, D]; half-split pairing."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c = c[:, None, :]
    s = s[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(np.float32)


def attention(m, Ly, q, K, V, pos_q, pos_k, sliding, o):
    """q [T, Hq, D] (rotated); K, V [S, Hkv, D]. Returns [T, Hq*D]."""
    T = q.shape[0]
    G = m.Hq // m.Hkv
    scale = np.float32(1.0 / np.sqrt(m.D))
    allowed = pos_k[None, :] <= pos_q[:, None]
    if sliding:
        allowed &= (pos_q[:, None] - pos_k[None, :]) < m.window
    out = np.empty((T, m.Hq, m.D), dtype=np.float32)
    for g in range(m.Hkv):
        qg = np.ascontiguousarray(q[:, g * G:(g + 1) * G, :].transpose(1, 0, 2))  # [G, T, D]
        kg = np.ascontiguousarray(K[:, g, :].T)  # [D, S]
        vg = np.ascontiguousarray(V[:, g, :])  # [S, D]
        s = o.mm(qg, kg) * scale  # [G, T, S]
        s = np.where(allowed[None], s, np.float32(-np.inf))
        sink = Ly["sinks"][g * G:(g + 1) * G][:, None, None]  # [G, 1, 1]
        M = np.maximum(s.max(axis=-1, keepdims=True), sink)
        p = np.exp(s - M)
        den = p.sum(axis=-1, keepdims=True, dtype=np.float32) + np.exp(sink - M)
        if "attn_probs" in o.sites:  # flash style: bf16 numerators, f32 denominator
            og = (o.r("attn_probs", p) @ vg) / den
        elif o.tf32 is not None:  # HF eager: normalized probs (sink column dropped) @ V
            og = o.mm((p / den).astype(np.float32), vg)
        else:
            og = (p / den).astype(np.float32) @ vg
        out[:, g * G:(g + 1) * G, :] = og.transpose(1, 0, 2)
    return out.reshape(T, m.Hq * m.D)


def moe(m, Ly, t_f32, t_exp, o):
    """t_f32: norm output in f32 (the router's input); t_exp: the experts' input rows."""
    T = t_f32.shape[0]
    logits = o.mm_w(t_f32, Ly["wr_T"]) + Ly["br"]  # [T, E]
    # top-k, descending; ties broken toward the lower index (stable sort)
    idx = np.argsort(-logits, axis=-1, kind="stable")[:, :m.K]
    if o.route_log is not None:
        o.route_log.append(np.sort(idx, axis=-1))
    sel = np.take_along_axis(logits, idx, axis=-1)
    sel = sel - sel.max(axis=-1, keepdims=True)
    w = np.exp(sel)
    w = (w / w.sum(axis=-1, keepdims=True)).astype(np.float32)  # [T, K]
    out = np.zeros((T, m.H), dtype=np.float32)
    for e in range(m.E):
        rows, slot = np.nonzero(idx == e)
        if rows.size == 0:
            continue
        x = t_exp[rows]
        h = o.mm_w(x, Ly["w1"][e]) + Ly["b1"][e]  # [n, 2I]
        gate = np.minimum(h[:, 0::2], np.float32(m.limit))
        up = np.clip(h[:, 1::2], np.float32(-m.limit), np.float32(m.limit))
        glu = gate * (np.float32(1.0) / (np.float32(1.0) + np.exp(-np.float32(m.alpha) * gate)))
        a = o.r("swiglu_out", (glu * (up + np.float32(1.0))).astype(np.float32))
        y = o.mm_w(a, Ly["w2"][e]) + Ly["b2"][e]  # [n, H]
        y = o.r("expert_out", y.astype(np.float32))
        np.add.at(out, rows, w[rows, slot][:, None] * y)
    return out


class Cache:
    def __init__(self, L):
        self.K = [None] * L
        self.V = [None] * L
        self.n = 0


def forward(m, tokens, o, cache=None, rows=None):
    """Runs tokens at positions cache.n ... (a fresh cache: a full pass). Returns the logits of
    the chunk's rows `rows` (default: all) [len(rows), V]."""
    if cache is None:
        cache = Cache(m.L)
    tokens = np.asarray(tokens, dtype=np.int64)
    T = tokens.shape[0]
    p0 = cache.n
    pos_q = np.arange(p0, p0 + T, dtype=np.int64)
    cos, sin = m.rope_tables(pos_q)
    x = o.r("embed", m.embed[tokens].astype(np.float32))
    nq, nk = m.Hq * m.D, m.Hkv * m.D
    for l, Ly in enumerate(m.layers):
        t = o.r("norm_out", rmsnorm(x, Ly["in_norm"], m.eps), also="norm_attn")
        qkv = o.r("qkv_out", (o.mm_w(t, Ly["wqkv_T"]) + Ly["bqkv"]).astype(np.float32))
        q = qkv[:, :nq].reshape(T, m.Hq, m.D)
        k = qkv[:, nq:nq + nk].reshape(T, m.Hkv, m.D)
        v = np.ascontiguousarray(qkv[:, nq + nk:].reshape(T, m.Hkv, m.D))
        q = o.r("q_rope", rope_apply(q, cos, sin))
        k = o.r("kv_cache", rope_apply(k, cos, sin))
        v = o.r("kv_cache", v)
        if cache.K[l] is None:
            cache.K[l], cache.V[l] = k, v
        else:
            cache.K[l] = np.concatenate([cache.K[l], k], 0)
            cache.V[l] = np.concatenate([cache.V[l], v], 0)
        pos_k = np.arange(0, p0 + T, dtype=np.int64)
        a = o.r("attn_out", attention(m, Ly, q, cache.K[l], cache.V[l], pos_q, pos_k,
                                      m.sliding[l], o))
        y = o.r("oproj_out", (o.mm_w(a, Ly["wo_T"]) + Ly["bo"]).astype(np.float32))
        x = o.r("residual", (x + y).astype(np.float32))
        t32 = rmsnorm(x, Ly["post_norm"], m.eps)
        t_exp = o.r("moe_in", o.r("norm_out", t32))
        y = o.r("moe_out", moe(m, Ly, t32, t_exp, o))
        x = o.r("residual", (x + y).astype(np.float32))
    cache.n = p0 + T
    sel = x if rows is None else x[np.asarray(rows)]
    t = o.r("norm_out", rmsnorm(sel, m.final_norm, m.eps), also="norm_final")
    return o.mm_w(t, m.lm_head_T).astype(np.float32)


def greedy(m, prompt, n_new, o=None):
    """Prefill + (n_new - 1) one-token decode steps. Returns (tokens [n_new], logits [n_new, V])."""
    o = o or Opts()
    cache = Cache(m.L)
    lg = forward(m, prompt, o, cache, rows=[len(prompt) - 1])[0]
    toks, rows = [int(np.argmax(lg))], [lg]
    while len(toks) < n_new:
        lg = forward(m, [toks[-1]], o, cache, rows=[0])[0]
        toks.append(int(np.argmax(lg)))
        rows.append(lg)
    return toks, np.stack(rows)


# --------------------------------------------------------------------------------------------
# Validation against transformers (the conformance fixture)


def max_row_rel_err(got, want):
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max(axis=1)
    mx = np.maximum(np.abs(want.astype(np.float64)).max(axis=1), 1e-30)
    return float((diff / mx).max()), float(diff.max())


def validate(log):
    with open(os.path.join(FIXTURES, "expected.json")) as f:
        ex = json.load(f)
    est = Safetensors(os.path.join(FIXTURES, "expected.safetensors"))
    ok = True
    lines = []

    def say(s):
        lines.append(s)
        log(s)

    models = {}
    for variant in ("bf16", "mxfp4"):
        m = Model(os.path.join(FIXTURES, variant))
        models[variant] = m
        worst_rel, worst_abs = 0.0, 0.0
        for i, s in enumerate(ex["sequences"]):
            allt = s["prompt"] + s["generated"]
            want = est.f32(f"seq{i}.logits")
            got = forward(m, allt, Opts())
            rel, ab = max_row_rel_err(got, want)
            worst_rel, worst_abs = max(worst_rel, rel), max(worst_abs, ab)
            toks, dec = greedy(m, s["prompt"], len(s["generated"]))
            P = len(s["prompt"])
            drel, dab = max_row_rel_err(dec, want[P - 1:P - 1 + len(toks)])
            same = toks == s["generated"]
            say(f"  {variant} seq{i} ({len(s['prompt'])}+{len(s['generated'])} tokens): full pass max row "
                f"rel err {rel:.3e}, max |diff| {ab:.3e} (max |logit| {np.abs(want).max():.3f}); "
                f"prefill+decode rel err {drel:.3e}, greedy tokens {'identical' if same else 'DIFFER'}")
            ok &= rel <= CONFORMANCE_REL_TOL and drel <= CONFORMANCE_REL_TOL and same
        say(f"  {variant}: worst full-pass max row rel err {worst_rel:.3e} (tolerance "
            f"{CONFORMANCE_REL_TOL:g}), worst max |diff| {worst_abs:.3e}; experts {m.expert_format}")
    # MXFP4 dequantization == the bf16 checkpoint's experts, exactly
    eq = all(np.array_equal(a[k], b[k]) for a, b in zip(models["bf16"].layers, models["mxfp4"].layers)
             for k in ("w1", "w2"))
    say(f"  MXFP4 experts dequantize to the bf16 checkpoint's experts exactly: {eq}")
    ok &= eq
    # YaRN
    m = models["bf16"]
    r = ex["rope"]
    inv = np.array(r["inv_freq"], dtype=np.float64)
    inv_rel = float(np.max(np.abs(m.inv_freq - inv) / inv))
    pos = np.array(r["positions"])
    c, s_ = m.rope_tables(pos)
    cd = float(max(np.abs(c - np.array(r["cos"]).reshape(c.shape)).max(),
                   np.abs(s_ - np.array(r["sin"]).reshape(s_.shape)).max()))
    say(f"  YaRN: inv_freq max rel diff {inv_rel:.2e}, attention scaling {m.mscale!r} vs "
        f"{r['attention_scaling']!r}, cos/sin max |diff| {cd:.2e} (positions up to {pos.max()})")
    ok &= inv_rel < 1e-6 and abs(m.mscale - r["attention_scaling"]) < 1e-7 and cd < 1e-6 + 2e-7 * pos.max()
    say("  VALIDATION " + ("PASSED" if ok else "FAILED"))
    return ok, lines


# --------------------------------------------------------------------------------------------
# Measurement


def configurations(which):
    cfgs = [("fp32", Opts()), ("cuda", Opts(CUDA_SITES))]
    for s in CUDA_SITES:
        cfgs.append((f"cuda minus {s}", Opts([x for x in CUDA_SITES if x != s])))
    cfgs.append(("cuda minus norm_out+moe_in", Opts([x for x in CUDA_SITES if x not in ("norm_out", "moe_in")])))
    no_norm = [x for x in CUDA_SITES if x != "norm_out"]  # moe_in stays
    cfgs.append(("cuda minus norm_final", Opts(no_norm + ["norm_attn"])))
    cfgs.append(("cuda minus norm_attn", Opts(no_norm + ["norm_final"])))
    for s in SITES[:2] + SUB_SITES + SITES[2:] + EXTRA_SITES:
        cfgs.append((f"only {s}", Opts([s])))
    # the cuda set split into attention / MoE sides (norm_out = norm_attn + moe_in + norm_final)
    attn_side = ["norm_attn", "qkv_out", "kv_cache", "attn_out", "oproj_out"]
    moe_side = ["moe_in", "swiglu_out", "expert_out", "moe_out"]
    split = ["embed", "norm_final"] + attn_side + moe_side
    cfgs.append(("cuda minus attention side (" + " ".join(attn_side) + ")",
                 Opts([x for x in split if x not in attn_side])))
    cfgs.append(("cuda minus MoE side (" + " ".join(moe_side) + ")",
                 Opts([x for x in split if x not in moe_side])))
    cfgs.append(("cuda, every site fp16 instead of bf16", Opts(f16=split)))
    cfgs.append(("cuda, attention side fp16", Opts(split, f16=attn_side)))
    cfgs.append(("cuda, MoE side fp16", Opts(split, f16=moe_side)))
    cfgs.append(("cuda, norm_attn+moe_in fp16", Opts(split, f16=["norm_attn", "moe_in"])))
    cfgs.append(("cuda + q_rope + attn_probs", Opts(CUDA_SITES + EXTRA_SITES)))
    cfgs.append(("cuda + q_rope + attn_probs, every site fp16", Opts(f16=split + EXTRA_SITES)))
    cfgs.append(("cuda + q_rope + attn_probs minus norm_out+moe_in",
                 Opts([x for x in CUDA_SITES + EXTRA_SITES if x not in ("norm_out", "moe_in")])))
    cfgs.append(("all sites (cuda + residual + q_rope + attn_probs)", Opts(SITES + EXTRA_SITES)))
    # rose's --dtype float16 as the GPU computes it: the 2026-12-05 s14 form (every site fp16, q
    # rounded again after RoPE, P in fp16), then without the roundings of the f32 projection /
    # MoE outputs [TAG_PROJ_F32]: q/k/v only after RoPE (q_rope, kv_cache), O-proj and MoE
    # outputs into the f32 stream unrounded.
    f16_gpu = split + EXTRA_SITES
    cfgs.append(("--dtype float16 (s14: 16-bit outputs)", Opts(f16=f16_gpu)))
    cfgs.append(("--dtype float16 (s14) + moe_out f32",
                 Opts(f16=[x for x in f16_gpu if x != "moe_out"])))
    cfgs.append(("--dtype float16 (s14) + qkv/oproj f32",
                 Opts(f16=[x for x in f16_gpu if x not in ("qkv_out", "oproj_out")])))
    cfgs.append(("--dtype float16 (s15: qkv/oproj/moe_out f32)",
                 Opts(f16=[x for x in f16_gpu if x not in ("qkv_out", "oproj_out", "moe_out")])))
    cfgs.append(("--dtype float16 (s15) + expert_out f32",
                 Opts(f16=[x for x in f16_gpu
                           if x not in ("qkv_out", "oproj_out", "moe_out", "expert_out")])))
    cfgs.append(("tf32", Opts(tf32="rne")))
    cfgs.append(("tf32 (truncating)", Opts(tf32="trunc")))
    if which == "all":
        return cfgs
    names = [w.strip() for w in which.split(",")]
    return [c for c in cfgs if c[0] in names or c[0] == "fp32"]  # fp32: the routing reference


def cosine(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--validate", action="store_true", help="only the fixture validation")
    ap.add_argument("--model", help="gpt-oss checkpoint directory to measure")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--prompt-len", type=int, default=1000)
    ap.add_argument("--new", type=int, default=32, help="greedy tokens (compared positions) per prompt")
    ap.add_argument("--seed0", type=int, default=1, help="prompt i uses numpy default_rng(seed0 + i)")
    ap.add_argument("--prompt-file", help="JSON list of prompts (lists of token ids) instead of random ones")
    ap.add_argument("--configs", default="all", help="comma-separated configuration names, or all")
    ap.add_argument("--out", help="write a markdown table here")
    args = ap.parse_args()

    def log(s):
        print(s, flush=True)

    t0 = time.time()
    log("== step 3: fp32 forward vs Hugging Face transformers (tests/conformance/gpt_oss/fixtures)")
    ok, vlines = validate(log)
    if not ok:
        log("validation failed: not measuring")
        return 1
    if args.validate or not args.model:
        return 0

    log(f"== loading {args.model}")
    m = Model(args.model)
    log(f"   hidden {m.H}, layers {m.L}, heads {m.Hq}/{m.Hkv} x {m.D}, intermediate {m.I}, experts "
        f"{m.E} top-{m.K}, window {m.window}, sliding {m.sliding}, vocab {m.vocab}, experts "
        f"{m.expert_format}, every GEMM weight bf16-exact: {m.weights_bf16_exact}")
    if not m.weights_bf16_exact:
        log("   WARNING: some GEMM weights are not bf16-exact: tf32 leaves them unrounded")

    seqs = []
    if args.prompt_file:
        with open(args.prompt_file) as f:
            prompts = [list(map(int, p)) for p in json.load(f)]
        args.prompts = len(prompts)
        prompt_desc = (f"{len(prompts)} prompts from {args.prompt_file} (lengths "
                       f"{','.join(str(len(p)) for p in prompts)})")
    else:
        prompts = [np.random.default_rng(args.seed0 + i).integers(0, 199998, size=args.prompt_len).tolist()
                   for i in range(args.prompts)]
        prompt_desc = (f"{args.prompts} x {args.prompt_len} random ids (numpy default_rng(seed), seeds "
                       f"{args.seed0}..{args.seed0 + args.prompts - 1})")
    for i, prompt in enumerate(prompts):
        t1 = time.time()
        toks, ref = greedy(m, prompt, args.new)
        seqs.append((prompt, toks, ref))
        top2 = np.sort(ref, axis=1)[:, -2:]
        margins = top2[:, 1] - top2[:, 0]
        log(f"   prompt {i} ({len(prompt)} tokens): fp32 greedy {args.new} tokens "
            f"in {time.time() - t1:.1f} s; top-2 margin min {margins.min():.4f}, "
            f"<0.05 at {(margins < 0.05).sum()}/{len(margins)}")

    cfgs = configurations(args.configs)
    results = []
    n_pos = args.prompts * args.new
    log(f"== {len(cfgs)} configurations x {args.prompts} prompts, one full pass each, "
        f"{n_pos} compared positions")
    log(f"{'configuration':58s} {'agree':>9s} {'%':>6s} {'min cos':>9s} {'median cos':>11s} "
        f"{'decisive':>8s} {'routes':>7s} {'rel err':>8s}  time")
    ref_routes = None
    for name, o in cfgs:
        t1 = time.time()
        agree, decisive, coss, routes, errs = 0, 0, [], [], []
        for prompt, toks, ref in seqs:
            allt = prompt + toks[:-1]
            rows = list(range(len(prompt) - 1, len(allt)))
            o.route_log = []
            got = forward(m, allt, o, rows=rows)
            routes.append(o.route_log)
            o.route_log = None
            for a, b in zip(ref, got):
                same = int(np.argmax(a) == np.argmax(b))
                agree += same
                top2 = np.sort(a)[-2:]
                decisive += int(not same and top2[1] - top2[0] >= 0.05)
                coss.append(cosine(a, b))
                errs.append(float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(a.astype(np.float64))))
        if ref_routes is None:
            ref_routes = routes  # the first configuration (fp32) is the routing reference
        diff = sum(int((~np.all(x == y, axis=-1)).sum()) for rs, rr in zip(routes, ref_routes)
                   for x, y in zip(rs, rr))
        tot = sum(x.shape[0] for rs in ref_routes for x in rs)
        coss = np.array(coss)
        if o.f16_overflow:
            log(f"   {name}: {o.f16_overflow} finite values overflowed to inf in fp16")
        res = (name, agree, n_pos, 100.0 * agree / n_pos, float(coss.min()), float(np.median(coss)),
               decisive, 100.0 * diff / tot, float(np.mean(errs)))
        results.append(res)
        log(f"{name:58s} {agree:4d}/{n_pos:<4d} {res[3]:6.1f} {res[4]:9.6f} {res[5]:11.7f} "
            f"{decisive:8d} {res[7]:6.2f}% {res[8]:8.5f}  {time.time() - t1:.0f} s")
    total = time.time() - t0
    log(f"== total {total:.0f} s")

    if args.out:
        with open(args.out, "w") as f:
            f.write(f"<!-- written by bench/analysis/bf16_sites.py; {time.strftime('%Y-%m-%d %H:%M:%S')} -->\n")
            f.write(f"python {platform.python_version()}, numpy {np.__version__}, total {total:.0f} s\n\n")
            f.write("Validation (step 3):\n\n```\n" + "\n".join(vlines) + "\n```\n\n")
            f.write(f"Model: {args.model}: hidden {m.H}, {m.L} layers, {m.Hq}/{m.Hkv} heads x {m.D}, "
                    f"intermediate {m.I}, {m.E} experts top-{m.K}, window {m.window}, experts "
                    f"{m.expert_format}. Prompts: {prompt_desc}; {args.new} greedy fp32 tokens each, "
                    f"{n_pos} positions.\n\n")
            f.write("| configuration | agreement | % | min cos | median cos | decisive flips | "
                    "routes differing | mean rel. logit error |\n|---|---|---|---|---|---|---|---|\n")
            for name, agree, n, pct, mn, md, dec, rt, er in results:
                f.write(f"| {name} | {agree}/{n} | {pct:.1f} | {mn:.6f} | {md:.7f} | {dec} | {rt:.2f} % "
                        f"| {er:.5f} |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
