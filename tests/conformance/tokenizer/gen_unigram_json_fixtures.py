#!/usr/bin/env python3
"""Derives a Hugging Face tokenizer.json (Unigram model) from a sentencepiece .model with
transformers' own converter (SpmConverter, what `from_pretrained` uses for sentencepiece
models), then writes HF `tokenizers` reference ids for corpus.jsonl:

    python3 gen_unigram_json_fixtures.py --model m.model --out DIR

DIR/<stem>.tokenizer.json and DIR/<stem>.jsonl ({"text","ids","decode","decoded"}).

With --variants, also DIR/<stem>_bytefb_added.tokenizer.json(.jsonl): the converted file with
byte_fallback on, the decoder chain Sequence[Replace(U+2581 -> " "), ByteFallback, Fuse,
Strip(" ", 1, 0)] and added tokens using lstrip / rstrip / single_word / normalized (HF
`tokenizers` runs the edited file; its ids and decodes are the reference). Its decode cases
also include seeded random id sequences (byte pieces, broken UTF-8 runs, added tokens).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def convert(model_path):
    from transformers.convert_slow_tokenizer import SpmConverter

    class Original:  # what SpmConverter reads from a slow tokenizer
        vocab_file = model_path
        legacy = False
        add_prefix_space = True

        def __init__(self):
            self.split_by_punct = False

    conv = SpmConverter(Original())
    return conv.converted(), "transformers.convert_slow_tokenizer.SpmConverter"


META = "\u2581"

# Added tokens of the variant: (content, special, lstrip, rstrip, single_word, normalized).
VARIANT_ADDED = [
    ("<mask>", False, True, False, False, False),
    ("[SEP]", False, False, True, False, False),
    ("<|sp|>", True, True, True, False, False),
    ("ab", False, False, False, True, False),
    ("\u00fcber", False, False, False, True, False),
    ("\ufb01x", False, False, False, False, True),          # "fix" after nmt_nfkc
    ("\uff34\uff45\uff53\uff54", False, True, False, False, True),  # "Test" after nmt_nfkc
    ("<mask_long>", False, False, False, False, False),
]

VARIANT_TEXTS = [
    "a <mask> b", "x   <mask>y", "<mask>", "  <mask>  <mask>", "[SEP]   z", "a[SEP]\t\nb",
    "<|sp|>  hi  <|sp|>", "ab abc cab ab. (ab) _ab ab1", "\u00fcber \u00fcberall x\u00fcber",
    "fix \ufb01x prefix fixed", "Test \uff34\uff45\uff53\uff54 Testing  Test", "<mask_long> <mask_",
    "emoji \U0001F600\U0001F680 and \u4e00\u9fa5\u3402 rare", "\u00e9\u0301 \u2581x \u2581\u2581",
    " leading", "trailing ", "ab", "<mask>ab<mask>",
]


def make_variant(tok, stem, out_dir, corpus):
    from tokenizers import Tokenizer
    import random
    spec = json.loads(tok.to_str())
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": META}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    vocab_size = len(spec["model"]["vocab"])
    added = []
    for k, (content, special, lstrip, rstrip, single, normalized) in enumerate(VARIANT_ADDED):
        added.append({"id": vocab_size + k, "content": content, "single_word": single,
                      "lstrip": lstrip, "rstrip": rstrip, "normalized": normalized,
                      "special": special})
    spec["added_tokens"] = added
    vt = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    name = stem + "_bytefb_added"
    # Saved as HF serializes it after loading: the ids it really gave the added tokens (a
    # content already in the vocabulary keeps its vocabulary id).
    vt.save(os.path.join(out_dir, name + ".tokenizer.json"))
    added_ids = [vt.token_to_id(a["content"]) for a in added]
    byte_ids = [i for i, (p, _) in enumerate(spec["model"]["vocab"]) if
                len(p) == 6 and p.startswith("<0x") and p.endswith(">")]
    rng = random.Random(11)
    with open(os.path.join(out_dir, name + ".jsonl"), "w", encoding="utf-8") as f:
        for n, t in enumerate(VARIANT_TEXTS + corpus):
            ids = vt.encode(t, add_special_tokens=False).ids
            dec = list(ids)
            if n % 2 == 1:  # random ids: byte runs (valid and broken), added tokens, pieces
                dec = []
                for _ in range(rng.randint(1, 12)):
                    r = rng.random()
                    if r < 0.5 and byte_ids:
                        dec.append(rng.choice(byte_ids))
                    elif r < 0.6:
                        dec.append(rng.choice(added_ids))
                    else:
                        dec.append(rng.randrange(vocab_size))
            f.write(json.dumps({"text": t, "ids": ids, "decode": dec,
                                "decoded": vt.decode(dec, skip_special_tokens=False)},
                               ensure_ascii=False, separators=(",", ":")) + "\n")
    print("%s: variant written" % name, file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default=os.path.join(HERE, "corpus.jsonl"))
    ap.add_argument("--variants", action="store_true",
                    help="also write the ByteFallback-decoder / added-token variant")
    args = ap.parse_args()
    corpus = [json.loads(l) for l in open(args.corpus, encoding="utf-8")]
    os.makedirs(args.out, exist_ok=True)
    for model in args.model:
        stem = os.path.splitext(os.path.basename(model))[0]
        tok, how = convert(model)
        tok.save(os.path.join(args.out, stem + ".tokenizer.json"))
        with open(os.path.join(args.out, stem + ".jsonl"), "w", encoding="utf-8") as f:
            for text in corpus:
                ids = tok.encode(text, add_special_tokens=False).ids
                f.write(json.dumps({"text": text, "ids": ids, "decode": ids,
                                    "decoded": tok.decode(ids, skip_special_tokens=False)},
                                   ensure_ascii=False, separators=(",", ":")) + "\n")
        print("%s: converted with %s" % (stem, how), file=sys.stderr)
        if args.variants:
            make_variant(tok, stem, args.out, corpus)


if __name__ == "__main__":
    main()
