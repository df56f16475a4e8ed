#!/usr/bin/env python3
"""Writes a gpt-oss-shaped checkpoint with random weights in the published Hugging Face layout
(MXFP4 experts `*_blocks` / `*_scales`, everything else bf16, one safetensors file per layer
group + an index) for GPU benchmarks on a host without network access. Shapes from the published
configs (20b: 24 layers, 32 experts; 120b: 36 layers, 128 experts; hidden 2880, 64 q heads, 8 kv
heads, head_dim 64, intermediate 2880, vocab 201088). Weights are drawn on the GPU with torch (the
GPU host has it): bf16 normals scaled like a trained model's (1/sqrt(fan_in)), MXFP4 codes uniform
with E8M0 scales chosen so the dequantized weights have std ~1/sqrt(fan_in), as rose-mkmodel does.
    python3 bench/suites/make_random_gpt_oss.py --out DIR [--shape 20b|120b] [--layers N] [--seed 0]
(--layers overrides the layer count, e.g. for a quick run.)
"""
import argparse
import json
import math
import os

import torch
from safetensors.torch import save_file

SHAPES = {"20b": (24, 32), "120b": (36, 128)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="20b")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    layers, experts = SHAPES[args.shape]
    if args.layers > 0:
        layers = args.layers
    h, inter, hq, hkv, d, vocab = 2880, 2880, 64, 8, 64, 201088
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev)
    g.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)

    def bf16(shape, std, offset=0.0):
        return (torch.randn(shape, generator=g, device=dev, dtype=torch.float32) * std + offset).to(
            torch.bfloat16).cpu()

    def mxfp4(e, out, inp):
        groups = inp // 32
        blocks = torch.randint(0, 256, (e, out, groups, 16), generator=g, device=dev,
                               dtype=torch.int32).to(torch.uint8).cpu()
        base = 127 + round(math.log2(1.0 / (math.sqrt(inp) * 2.93)))
        scales = (base - 1 + torch.randint(0, 3, (e, out, groups), generator=g, device=dev,
                                           dtype=torch.int32)).to(torch.uint8).cpu()
        return blocks, scales

    weight_map = {}
    files = []

    def flush(name, tensors):
        save_file(tensors, os.path.join(args.out, name), metadata={"format": "pt"})
        for k in tensors:
            weight_map[k] = name
        files.append(name)

    flush("model-embed.safetensors", {
        "model.embed_tokens.weight": bf16((vocab, h), 1.0),
        "lm_head.weight": bf16((vocab, h), 1.0 / math.sqrt(h)),
        "model.norm.weight": bf16((h,), 0.05, 1.0),
    })
    for l in range(layers):
        p = f"model.layers.{l}."
        t = {
            p + "input_layernorm.weight": bf16((h,), 0.05, 1.0),
            p + "post_attention_layernorm.weight": bf16((h,), 0.05, 1.0),
            p + "self_attn.q_proj.weight": bf16((hq * d, h), 1.0 / math.sqrt(h)),
            p + "self_attn.q_proj.bias": bf16((hq * d,), 0.02),
            p + "self_attn.k_proj.weight": bf16((hkv * d, h), 1.0 / math.sqrt(h)),
            p + "self_attn.k_proj.bias": bf16((hkv * d,), 0.02),
            p + "self_attn.v_proj.weight": bf16((hkv * d, h), 1.0 / math.sqrt(h)),
            p + "self_attn.v_proj.bias": bf16((hkv * d,), 0.02),
            p + "self_attn.o_proj.weight": bf16((h, hq * d), 1.0 / math.sqrt(hq * d)),
            p + "self_attn.o_proj.bias": bf16((h,), 0.02),
            p + "self_attn.sinks": bf16((hq,), 1.0),
            p + "mlp.router.weight": bf16((experts, h), 1.0 / math.sqrt(h)),
            p + "mlp.router.bias": bf16((experts,), 0.1),
            p + "mlp.experts.gate_up_proj_bias": bf16((experts, 2 * inter), 0.02),
            p + "mlp.experts.down_proj_bias": bf16((experts, h), 0.02),
        }
        b, s = mxfp4(experts, 2 * inter, h)
        t[p + "mlp.experts.gate_up_proj_blocks"] = b
        t[p + "mlp.experts.gate_up_proj_scales"] = s
        b, s = mxfp4(experts, h, inter)
        t[p + "mlp.experts.down_proj_blocks"] = b
        t[p + "mlp.experts.down_proj_scales"] = s
        flush(f"model-layer{l:03d}.safetensors", t)
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    cfg = {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
        "attention_dropout": 0.0, "eos_token_id": 200002, "pad_token_id": 199999,
        "head_dim": d, "hidden_act": "silu", "hidden_size": h, "initial_context_length": 4096,
        "initializer_range": 0.02, "intermediate_size": inter,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                        for i in range(layers)],
        "max_position_embeddings": 131072, "num_attention_heads": hq,
        "num_experts_per_tok": 4, "experts_per_token": 4, "num_hidden_layers": layers,
        "num_key_value_heads": hkv, "num_local_experts": experts, "output_router_logits": False,
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head"]},
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn",
                         "truncate": False},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
        "swiglu_limit": 7.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": vocab,
        "garden_random_weights": f"gpt-oss-{args.shape} shape, {layers} layers, seed {args.seed}",
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012],
                   "pad_token_id": 199999}, f)
    print("wrote", args.out, len(files), "files")


if __name__ == "__main__":
    main()
