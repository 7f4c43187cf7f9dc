#!/usr/bin/env python3
"""Byte-level BPE goldens for tests/unit/test_bpe.cpp.

Trains a small GPT-2-style byte-level BPE (Hugging Face `tokenizers`,
ByteLevelBPETokenizer: GPT-2's pre-tokenisation regex and byte-to-unicode
map, vocabulary 1000 with <|endoftext|>) on apps/data/kjv-genesis.txt, writes
its vocab.json and merges.txt to tests/golden/lm/bpe/, and writes
encodings.json: a few hundred strings (lines of the text, hand-written
non-ASCII strings and seeded random mixtures of scripts, whitespace kinds,
digits, punctuation, contractions and emoji) with the ids that transformers'
GPT2Tokenizer (the Python reference implementation) gives them, checked
against GPT2TokenizerFast too.

Run with /work/venv-peers/bin/python (transformers 4.38, tokenizers 0.15).
"""
import json
import os
import random

from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Tokenizer, GPT2TokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "lm", "bpe")

HANDWRITTEN = [
    "", " ", "  ", "\n", "\n\n", " \n ", "\t", "a", "A b", "hello world",
    "Hello, World!", "It's what they're doing, isn't it? We'll see; I'd say you've won.",
    "don't DON'T Don't", "'s 't 're 've 'm 'll 'd", "x's'y", "   leading spaces",
    "trailing spaces   ", "tabs\tand\tnewlines\n", "multiple\n\n\nnewlines",
    "numbers 123 4567 89.10 1,000,000", "3.14159 and 2718", "mixed123abc456",
    "Crème brûlée à la française", "naïve café résumé", "Straße groß", "Ærøskøbing",
    "Ελληνικά γράμματα", "Русский текст, привет!", "日本語のテキスト", "中文字符测试",
    "한국어 문장", "العربية", "עברית", "हिन्दी", "ไทย", "😀 emoji 🎉🎉", "👍🏽 thumbs",
    "👨‍👩‍👧 family", "e\u0301 combining", "non\u00a0breaking\u00a0space",
    "ideographic\u3000space", "line\u2028separator", "next\u0085line", "zero\u200bwidth",
    "mixed: abc123!@#$%^&*()_+-=[]{}|;':\",./<>?", "In the beginning God created the heaven",
    "<|endoftext|>", "before<|endoftext|>after", "a <|endoftext|> b",
    "\u0000control\u0001chars\u007f", "ﬁ ligature", "½ ¾ ² ³", "Ⅻ roman", "١٢٣ arabic digits",
    "…“quoted”—dash–", "\r\n windows \r\n", " \t \n mixed whitespace \t",
]

POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") * 3
    + list("0123456789") * 2
    + list(" " * 20) + ["\n", "\t", "\r", "\u00a0", "\u3000", "  "]
    + list(".,;:!?'\"()[]{}-_/\\@#$%^&*+=<>|~`")
    + ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
    + list("éèêëàâäôöûüçñßøåæœ") + list("αβγδεζηθλμπσω") + list("абвгдежзий")
    + list("日本語中文字한국어") + ["😀", "🎉", "👍", "🚀"] + ["\u0301", "\u200b"]
)


def strings():
    rnd = random.Random(20240520)
    out = list(HANDWRITTEN)
    lines = [l for l in open(os.path.join(ROOT, "apps", "data", "kjv-genesis.txt"), encoding="utf-8").read().split("\n") if l.strip()]
    for _ in range(150):
        i = rnd.randrange(len(lines) - 3)
        out.append("\n".join(lines[i:i + rnd.randint(1, 3)]))
    for _ in range(150):
        out.append("".join(rnd.choice(POOL) for _ in range(rnd.randint(1, 40))))
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train([os.path.join(ROOT, "apps", "data", "kjv-genesis.txt")], vocab_size=1000,
              min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
    tok.save_model(OUT)
    vocab, merges = os.path.join(OUT, "vocab.json"), os.path.join(OUT, "merges.txt")
    slow = GPT2Tokenizer(vocab, merges)
    fast = GPT2TokenizerFast(vocab, merges)
    cases = []
    for s in strings():
        ids = slow.encode(s)
        assert ids == fast.encode(s), (s, ids, fast.encode(s))
        cases.append({"text": s, "ids": ids, "decoded": slow.decode(ids, clean_up_tokenization_spaces=False)})
    with open(os.path.join(OUT, "encodings.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer": "transformers GPT2Tokenizer 4.38.2 (checked against GPT2TokenizerFast, tokenizers 0.15.2)",
                   "cases": cases}, f, ensure_ascii=False, indent=0)
    print(len(cases), "cases;", len(json.load(open(vocab))), "vocabulary entries")


if __name__ == "__main__":
    main()
