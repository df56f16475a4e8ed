#!/usr/bin/env python3
"""Generates the BPE conformance fixtures with Hugging Face `tokenizers` (the reference):

    python3 gen_bpe_fixtures.py --tokenizer qwen3=PATH --tokenizer gptoss=PATH --out DIR

For every corpus.jsonl text: {"text", "ids" (encode, add_special_tokens=False: special tokens
written in the text are matched, the library default), "ids_text" (the same with
encode_special_tokens=True: special tokens stay text, which is what ivy does with caller text),
"decode" (= ids), "decoded", "decoded_skip" (decode with skip_special_tokens False / True)}.
Then seeded random id sequences (byte-level pieces that split characters, special tokens,
anything in the vocabulary): {"decode", "decoded", "decoded_skip"}. Output: DIR/<name>.jsonl.
"""
import argparse
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", action="append", required=True, help="name=path")
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default=os.path.join(HERE, "corpus.jsonl"))
    args = ap.parse_args()
    corpus = [json.loads(l) for l in open(args.corpus, encoding="utf-8")]
    os.makedirs(args.out, exist_ok=True)
    for spec in args.tokenizer:
        name, path = spec.split("=", 1)
        tok = Tokenizer.from_file(path)
        tok_text = Tokenizer.from_file(path)
        tok_text.encode_special_tokens = True
        assert tok_text.encode_special_tokens is True
        vocab = tok.get_vocab_size(with_added_tokens=True)
        specials = sorted(t.content for t in tok.get_added_tokens_decoder().values() if t.special)
        special_ids = [tok.token_to_id(s) for s in specials]
        n = 0
        with open(os.path.join(args.out, name + ".jsonl"), "w", encoding="utf-8") as f:
            def put(rec):
                f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
            for text in corpus:
                ids = tok.encode(text, add_special_tokens=False).ids
                ids_text = tok_text.encode(text, add_special_tokens=False).ids
                put({"text": text, "ids": ids, "ids_text": ids_text, "decode": ids,
                     "decoded": tok.decode(ids, skip_special_tokens=False),
                     "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
                n += 1
            rng = random.Random(20261130)
            for i in range(1500):
                k = rng.randint(1, 10)
                ids = []
                for _ in range(k):
                    r = rng.random()
                    if r < 0.45:
                        ids.append(rng.randrange(256))  # single-byte pieces: broken UTF-8
                    elif r < 0.6:
                        ids.append(rng.choice(special_ids))
                    else:
                        ids.append(rng.randrange(vocab))
                put({"decode": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                     "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
                n += 1
        print("%s: %d fixture lines (tokenizers %s)" % (name, n, tokenizers.__version__),
              file=sys.stderr)


if __name__ == "__main__":
    main()
