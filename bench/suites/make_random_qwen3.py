#!/usr/bin/env python3
"""Writes a Qwen3-Embedding-0.6B-shaped checkpoint with random weights (bf16, Hugging Face layout)
for GPU benchmarks on a host without network access. Shapes from the published config: hidden 1024,
28 layers, 16 heads, 8 kv heads, head_dim 128, intermediate 3072, vocab 151669, tied embeddings.
Needs torch + transformers (the GPU host has them).
    python3 bench/suites/make_random_qwen3.py --out DIR [--seed 0]
"""
import argparse
import json
import os

import torch
from transformers import Qwen3Config, Qwen3Model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    cfg = Qwen3Config(
        hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, intermediate_size=3072, vocab_size=151669, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        torch_dtype="bfloat16")
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3Model(cfg).to(torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True)
    # Last-token pooling, as Qwen3-Embedding's sentence-transformers config says.
    with open(os.path.join(args.out, "modules.json"), "w") as f:
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}], f)
    os.makedirs(os.path.join(args.out, "1_Pooling"), exist_ok=True)
    with open(os.path.join(args.out, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 1024, "pooling_mode_lasttoken": True,
                   "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": False}, f)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
