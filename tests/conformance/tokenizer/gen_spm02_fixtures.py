#!/usr/bin/env python3
"""Unigram fixtures from the sentencepiece Python package (0.2.x, what users compare against;
Debian's libsentencepiece is 0.1.97, which breaks Viterbi ties differently). Run where
`import sentencepiece` gives 0.2.x (the GPU host has 0.2.2):
    python3 gen_spm02_fixtures.py OUT_DIR
Trains a few unigram models with 0.2.x's trainer on corpus.jsonl plus seeded recombinations of
its words, then encodes the corpus, the Apache-2.0 text (whole and per paragraph) and runs of
repeated characters/patterns (where ties are common) with each model. Writes OUT_DIR/<name>.model
and OUT_DIR/expected.jsonl: {"model", "text", "ids", "pieces"} per line, and OUT_DIR/VERSION."""
import json
import os
import random
import sys

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
corpus = [json.loads(l) for l in open(os.path.join(HERE, "corpus.jsonl"), encoding="utf-8")]
license_text = open(os.path.join(HERE, "fixtures", "spm02", "license_apache2.txt"), encoding="utf-8").read()

rng = random.Random(1234)
words = [w for line in corpus for w in line.split()] + license_text.split()
train = os.path.join(out, "train.txt")
with open(train, "w", encoding="utf-8") as f:
    for line in corpus:
        if line.strip():
            f.write(line.replace("\n", " ") + "\n")
    for para in license_text.split("\n\n"):
        f.write(" ".join(para.split()) + "\n")
    for _ in range(3000):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(3, 20))) + "\n")

models = {
    "nfkc_v800": "--vocab_size=800 --normalization_rule_name=nmt_nfkc",
    "nfkc_v2000_bytes": "--vocab_size=2000 --normalization_rule_name=nmt_nfkc --byte_fallback=true",
    "identity_v1000": "--vocab_size=1000 --normalization_rule_name=identity",
    "nfkc_v4000_digits": "--vocab_size=4000 --normalization_rule_name=nmt_nfkc --split_digits=true",
}
texts = list(corpus)
texts.append(license_text)
texts += [p for p in license_text.split("\n\n") if p.strip()]
for ch in ["a", "e", "s", "x", "0", "1", "-", "=", ".", " ", "é", "中"]:
    for n in list(range(1, 41)) + [50, 63, 64, 65, 100, 127, 128, 200, 257]:
        texts.append(ch * n)
for pat in ["ab", "abc", "the ", "aa b", "Lorem ipsum ", "www.", "==", "0123456789"]:
    for n in [1, 2, 3, 5, 8, 13, 21, 34]:
        texts.append(pat * n)
for _ in range(200):  # random strings over a few letters: dense with ties
    texts.append("".join(rng.choice("aabbstn e") for _ in range(rng.randint(1, 80))))

with open(os.path.join(out, "VERSION"), "w") as f:
    f.write(spm.__version__ + "\n")
with open(os.path.join(out, "expected.jsonl"), "w", encoding="utf-8") as f:
    for name, args in models.items():
        prefix = os.path.join(out, name)
        spm.SentencePieceTrainer.Train(
            f"--input={train} --model_prefix={prefix} --model_type=unigram --hard_vocab_limit=false "
            f"--num_threads=4 --minloglevel=2 --seed_sentencepiece_size=100000 {args}")
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
        for t in texts:
            ids = sp.encode(t)
            f.write(json.dumps({"model": name, "text": t, "ids": ids,
                                "pieces": [sp.id_to_piece(i) for i in ids]}, ensure_ascii=False) + "\n")
        os.remove(prefix + ".vocab")
os.remove(train)
print("sentencepiece", spm.__version__, "models", len(models), "texts", len(texts))
