#!/usr/bin/env python3
"""Reference for tests/gpu/e2e_test.cc: a Qwen3 model at Qwen3-Embedding-0.6B shapes with random
weights (fixed seed), saved as a Hugging Face checkpoint (config.json + model.safetensors, bf16),
and its embeddings computed by Hugging Face transformers in bf16 on the GPU (last-token pooling,
L2-normalized), one sequence at a time (no padding). Writes into --out:
  model/            the checkpoint rose loads
  seqlens.i32       int32 [n]
  tokens.i32        int32 [sum(seqlens)], sequences back to back
  hf_embeddings.f32 float32 [n, hidden]   (bf16 model: the reference the test asserts against)
  hf_embeddings_fp32.f32                  (the same weights run in float32: context only)
"""
import argparse
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Qwen3Config, Qwen3Model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=28)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    cfg = Qwen3Config(
        vocab_size=151669, hidden_size=1024, intermediate_size=3072,
        num_hidden_layers=args.layers, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, max_position_embeddings=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(1234)
    # Random init in float32, saved as a bf16 checkpoint; then loaded back the way users load a
    # model (from_pretrained with a dtype), so non-persistent buffers such as RoPE's inv_freq are
    # computed in float32 as transformers intends (casting a built model with .to(bfloat16) would
    # round inv_freq to bf16 too).
    Qwen3Model(cfg).to(dtype=torch.bfloat16).save_pretrained(
        os.path.join(args.out, "model"), safe_serialization=True)
    print(open(os.path.join(args.out, "model", "config.json")).read())
    rng = np.random.default_rng(99)
    lens = [1, 2, 7, 17, 64, 65, 127, 300, 513, 1000, 33, 2048]
    tokens = [rng.integers(0, cfg.vocab_size, size=n, dtype=np.int32) for n in lens]

    def run(dtype):
        model = Qwen3Model.from_pretrained(os.path.join(args.out, "model"), dtype=dtype,
                                           attn_implementation="sdpa").cuda().eval()
        rot = model.rotary_emb
        print(f"{dtype}: inv_freq dtype {rot.inv_freq.dtype}, [:4] {rot.inv_freq[:4].tolist()}")
        out = []
        with torch.no_grad():
            for ids in tokens:
                x = torch.from_numpy(ids.astype(np.int64))[None].cuda()
                h = model(input_ids=x).last_hidden_state[0, -1]
                out.append(F.normalize(h.float(), p=2, dim=-1).cpu().numpy())
        del model
        return out

    embs = run(torch.bfloat16)
    embs32 = run(torch.float32)
    for n, a, b in zip(lens, embs, embs32):
        print(f"  len {n:5d}: cosine(HF bf16, HF fp32) = {float(np.dot(a, b)):.6f}")
    np.stack(embs32).astype(np.float32).tofile(os.path.join(args.out, "hf_embeddings_fp32.f32"))
    np.asarray(lens, dtype=np.int32).tofile(os.path.join(args.out, "seqlens.i32"))
    np.concatenate(tokens).astype(np.int32).tofile(os.path.join(args.out, "tokens.i32"))
    np.stack(embs).astype(np.float32).tofile(os.path.join(args.out, "hf_embeddings.f32"))
    print(f"e2e reference: {len(lens)} sequences, {sum(lens)} tokens, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
