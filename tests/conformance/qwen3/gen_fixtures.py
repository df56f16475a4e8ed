#!/usr/bin/env python3
"""Reference outputs for rose's Qwen3 forward pass, computed by Hugging Face transformers.

Run once on a machine with torch + transformers (the GPU host; the model runs on its CPU in
float32, so no TF32 or GPU nondeterminism enters):

    python3 tests/conformance/qwen3/gen_fixtures.py --out OUTDIR

and copy OUTDIR/* into tests/conformance/qwen3/fixtures/. It writes:

  config.json, model.safetensors   a tiny random Qwen3ForCausalLM (untied lm_head), float32,
                                   saved with save_pretrained (names carry the `model.` prefix)
  config_cls.json, score.safetensors
                                   the same base model as Qwen3ForSequenceClassification
                                   (num_labels=1): its config and its score.weight
  expected.json                    inputs and outputs, see below
  log.txt                          versions and self-checks

expected.json holds, for several token sequences of different lengths (incl. length 1), each run
alone (batch of one, no padding):
  causal.hidden[i]          Qwen3Model last_hidden_state (after the final norm), flattened [L*H]
  causal.pooled.{last,mean,cls}[i]
                            pooling of that hidden state + L2 normalization (sentence-transformers'
                            Pooling/Normalize modules when installed, else the same formulas)
  bidirectional.hidden[i], bidirectional.pooled...
                            the same decoder layers called with attention_mask=None under eager
                            attention (eager_attention_forward applies no mask then, i.e. every
                            token attends to every token of its sequence). The script checks that
                            this manual layer loop, given an explicit causal mask, reproduces
                            Qwen3Model's own output, so the loop itself is validated.
  score.yes_no              logits of token ids yes/no at the last position from
                            Qwen3ForCausalLM (untied lm_head) and sigmoid(l_yes - l_no)
  score.tied                the same with a tie_word_embeddings=True Qwen3ForCausalLM holding the
                            same base weights (lm_head = embed_tokens)
  score.cls                 Qwen3ForSequenceClassification logits (num_labels=1) and their sigmoid
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3ForSequenceClassification

SEED = 20261130
VOCAB = 256
HIDDEN = 64
LENGTHS = [1, 2, 5, 16, 37]
YES_ID, NO_ID = 17, 42


def make_config(**over):
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        attention_bias=False,
        hidden_act="silu",
    )
    kw.update(over)
    cfg = Qwen3Config(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def randomize(model, gen):
    """Weights with unit-ish scale (the default init std 0.02 makes attention nearly uniform)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in**0.5)


def flat(t):
    return [float(x) for x in t.reshape(-1).tolist()]


def pool_all(hidden_list, log):
    """hidden_list: list of [L, H] tensors. Returns {mode: [[H floats] per seq]}."""
    out = {"last": [], "mean": [], "cls": []}
    try:
        from sentence_transformers.models import Normalize, Pooling

        norm = Normalize()
        pools = {
            "last": Pooling(HIDDEN, pooling_mode="lasttoken"),
            "mean": Pooling(HIDDEN, pooling_mode="mean"),
            "cls": Pooling(HIDDEN, pooling_mode="cls"),
        }
        for h in hidden_list:
            feats = {
                "token_embeddings": h[None],
                "attention_mask": torch.ones(1, h.shape[0], dtype=torch.int64),
            }
            for mode, pool in pools.items():
                pooled = norm(pool(dict(feats)))["sentence_embedding"][0]
                out[mode].append(flat(pooled))
        log("pooling reference: sentence_transformers " + __import__("sentence_transformers").__version__)
    except Exception as e:  # not installed, or an API this script does not know
        out = {"last": [], "mean": [], "cls": []}
        log(f"sentence_transformers unusable ({type(e).__name__}: {e})")
        for h in hidden_list:
            out["last"].append(flat(F.normalize(h[-1], p=2, dim=-1)))
            out["mean"].append(flat(F.normalize(h.mean(0), p=2, dim=-1)))
            out["cls"].append(flat(F.normalize(h[0], p=2, dim=-1)))
        log("pooling reference: torch formulas (sentence_transformers not installed)")
    return out


def manual_layers(base, ids, mask):
    """Qwen3Model.forward's loop, with an explicit attention mask. mask=None means bidirectional:
    eager attention adds no mask then, and the layers' is_causal flag (which the sdpa path reads
    when no mask is given) is cleared for the duration."""
    h = base.embed_tokens(ids)
    pos = torch.arange(ids.shape[1])[None]
    pe = base.rotary_emb(h, pos)
    saved = [layer.self_attn.is_causal for layer in base.layers]
    try:
        if mask is None:
            for layer in base.layers:
                layer.self_attn.is_causal = False
        for layer in base.layers:
            out = layer(h, attention_mask=mask, position_embeddings=pe, position_ids=pos)
            h = out[0] if isinstance(out, tuple) else out
    finally:
        for layer, c in zip(base.layers, saved):
            layer.self_attn.is_causal = c
    return base.norm(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lines = []

    def log(s):
        print(s)
        lines.append(s)

    log(f"torch {torch.__version__} transformers {transformers.__version__} python {sys.version.split()[0]}")
    torch.manual_seed(SEED)
    torch.set_num_threads(4)
    gen = torch.Generator().manual_seed(SEED)

    model = Qwen3ForCausalLM(make_config()).to(torch.float32).eval()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    log(f"attention implementation: {model.config._attn_implementation}")
    randomize(model, gen)
    base = model.model

    seqs = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in LENGTHS]
    expected = {
        "generator": "tests/conformance/qwen3/gen_fixtures.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sequences": seqs,
        "hidden_size": HIDDEN,
    }

    causal_h, bidir_h = [], []
    yes_logits, no_logits, scores = [], [], []
    with torch.no_grad():
        max_loop_diff = 0.0
        for s in seqs:
            ids = torch.tensor([s])
            hf = base(input_ids=ids).last_hidden_state[0]
            L = ids.shape[1]
            causal_mask = torch.full((L, L), torch.finfo(torch.float32).min).triu(1)[None, None]
            loop_causal = manual_layers(base, ids, causal_mask)[0]
            max_loop_diff = max(max_loop_diff, float((loop_causal - hf).abs().max()))
            bidir = manual_layers(base, ids, None)[0]
            causal_h.append(hf)
            bidir_h.append(bidir)
            logits = model(input_ids=ids).logits[0, -1]
            yes_logits.append(float(logits[YES_ID]))
            no_logits.append(float(logits[NO_ID]))
            scores.append(float(torch.sigmoid(logits[YES_ID] - logits[NO_ID])))
        log(f"manual causal loop vs Qwen3Model: max abs diff {max_loop_diff:.3e}")
        assert max_loop_diff < 1e-5, "the manual layer loop does not reproduce Qwen3Model"
        # Length 1: causal and bidirectional must agree; longer: they must differ.
        assert float((causal_h[0] - bidir_h[0]).abs().max()) < 1e-6
        assert float((causal_h[-1] - bidir_h[-1]).abs().max()) > 1e-3

    expected["causal"] = {"hidden": [flat(h) for h in causal_h], "pooled": pool_all(causal_h, log)}
    expected["bidirectional"] = {"hidden": [flat(h) for h in bidir_h], "pooled": pool_all(bidir_h, log)}

    # Tied embeddings: same base weights, lm_head = embed_tokens.
    tied = Qwen3ForCausalLM(make_config(tie_word_embeddings=True)).to(torch.float32).eval()
    tied.model.load_state_dict(base.state_dict())
    if hasattr(tied, "tie_weights"):
        tied.tie_weights()
    if not torch.equal(tied.lm_head.weight, tied.model.embed_tokens.weight):
        log("tie_weights() did not tie lm_head; sharing the embedding parameter explicitly")
        tied.lm_head.weight = tied.model.embed_tokens.weight
    assert torch.equal(tied.lm_head.weight, tied.model.embed_tokens.weight)
    assert not torch.equal(model.lm_head.weight, base.embed_tokens.weight)
    tied_scores, tied_yes, tied_no = [], [], []
    with torch.no_grad():
        for s in seqs:
            logits = tied(input_ids=torch.tensor([s])).logits[0, -1]
            tied_yes.append(float(logits[YES_ID]))
            tied_no.append(float(logits[NO_ID]))
            tied_scores.append(float(torch.sigmoid(logits[YES_ID] - logits[NO_ID])))

    # Classification head.
    cls_cfg = make_config(num_labels=1, architectures=["Qwen3ForSequenceClassification"])
    cls = Qwen3ForSequenceClassification(cls_cfg).to(torch.float32).eval()
    cls.model.load_state_dict(base.state_dict())
    with torch.no_grad():
        cls.score.weight.copy_(torch.randn(cls.score.weight.shape, generator=gen) / HIDDEN**0.5)
    cls_logits, cls_scores = [], []
    with torch.no_grad():
        for s in seqs:
            z = cls(input_ids=torch.tensor([s])).logits[0, 0]
            cls_logits.append(float(z))
            cls_scores.append(float(torch.sigmoid(z)))

    expected["score"] = {
        "yes_id": YES_ID,
        "no_id": NO_ID,
        "yes_no": {"logit_yes": yes_logits, "logit_no": no_logits, "scores": scores},
        "tied": {"logit_yes": tied_yes, "logit_no": tied_no, "scores": tied_scores},
        "cls": {"logits": cls_logits, "scores": cls_scores},
    }

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        names = sorted(os.listdir(tmp))
        log("save_pretrained wrote: " + ", ".join(names))
        shutil.copy(os.path.join(tmp, "config.json"), os.path.join(args.out, "config.json"))
        shutil.copy(os.path.join(tmp, "model.safetensors"), os.path.join(args.out, "model.safetensors"))
    cls.config.to_json_file(os.path.join(args.out, "config_cls.json"))
    save_file({"score.weight": cls.score.weight.detach().contiguous()},
              os.path.join(args.out, "score.safetensors"))
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(expected, f, separators=(",", ":"))
    log("wrote " + ", ".join(sorted(os.listdir(args.out))))
    with open(os.path.join(args.out, "log.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # leave the traceback where the caller collects files
        import traceback

        out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "error.txt"), "w") as f:
            traceback.print_exc(file=f)
        raise
