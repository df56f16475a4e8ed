#!/usr/bin/env python3
"""Derives a Hugging Face tokenizer.json (Unigram model) from a sentencepiece .model with
transformers' own converter (SpmConverter, what `from_pretrained` uses for sentencepiece
models), then writes HF `tokenizers` reference ids for corpus.jsonl:

    python3 gen_unigram_json_fixtures.py --model m.model --out DIR

DIR/<stem>.tokenizer.json and DIR/<stem>.jsonl ({"text","ids","decode","decoded"}).
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default=os.path.join(HERE, "corpus.jsonl"))
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


if __name__ == "__main__":
    main()
