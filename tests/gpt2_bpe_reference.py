#!/usr/bin/env python3
"""Independent reference for the GPT-2 byte-level BPE tokenizer (data/gpt2_bpe.cpp).

Builds a small GPT-2-format vocabulary (vocab.json + merges.txt, learned by plain BPE on the text below)
and encodes a set of tricky strings with the algorithm of OpenAI's GPT-2 encoder.py: the `regex`
pre-tokenizer pattern, bytes_to_unicode, and rank-ordered merges. Writes tests/data/gpt2_tiny/{vocab.json,
merges.txt,cases.tsv}; data_test checks that the C++ tokenizer reproduces every case exactly.

cases.tsv: one case per line, three tab-separated fields, all text hex-encoded UTF-8:
  text    comma-separated pre-tokens    space-separated ids

Usage: python3 tests/gpt2_bpe_reference.py   (needs `pip install regex`)
"""
import json
import os
import random

import regex

PAT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

CORPUS = """The quick brown fox jumps over the lazy dog. It's what they'd said: we'll see, we've seen,
I'm here and you're there. Numbers like 1234 and 56789 appear, 3.14159 too! Hello world, hello again.
Über naïve café résumé — Ωmega λambda. 中文字符 и русский текст. Don't stop; won't stop. The end.
The the the and and of of to to in in is is that that it it was was for for on on are are with with.
"""

TEXTS = [
    "Hello world", "Hello world!", " Hello", "  Hello  world  ", "hello\nworld", "a\n\n  b", "tabs\tand\ttabs",
    "It's", "it's we'll they'd I'm you're we've don't", "'s", " 's", "'S", "x'll've", "''", "?'s", "a 'b",
    "12345 6789", "3.14159", "abc123def", "٣٤ ٥", "Ⅻ ½", "café résumé", "naïve", "e\u0301", "Ωmega λ", "中文字符",
    "русский текст", "emoji 😀😀 ok", "\u00a0nbsp", "x\u3000y", "\x1cfs\x1d", "\r\n\r\n", "   ", " ", "\n", "",
    "end  ", "!!!???", " ...", "a--b", "The quick brown fox jumps over the lazy dog.", "\u2028line\u2029sep",
    "mixed 12ab34 cd", "\t\t x", "x \t y", " \n x", "THE END", "the the the",
]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


BYTE_ENCODER = bytes_to_unicode()


def learn_merges(text, count):
    words = {}
    for tok in PAT.findall(text):
        w = tuple(BYTE_ENCODER[b] for b in tok.encode("utf-8"))
        words[w] = words.get(w, 0) + 1
    merges = []
    for _ in range(count):
        pairs = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = max(sorted(pairs), key=lambda p: pairs[p])
        merges.append(best)
        new_words = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words
    return merges


def get_pairs(word):
    return set(zip(word, word[1:]))


def bpe(token, ranks):
    """encoder.py's Encoder.bpe, returning the list of symbols."""
    word = tuple(token)
    pairs = get_pairs(word)
    if not pairs:
        return list(word)
    while True:
        bigram = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new_word, i = [], 0
        while i < len(word):
            try:
                j = word.index(first, i)
                new_word.extend(word[i:j])
                i = j
            except ValueError:
                new_word.extend(word[i:])
                break
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new_word.append(first + second)
                i += 2
            else:
                new_word.append(word[i])
                i += 1
        word = tuple(new_word)
        if len(word) == 1:
            break
        pairs = get_pairs(word)
    return list(word)


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gpt2_tiny")
    os.makedirs(out_dir, exist_ok=True)
    merges = learn_merges(CORPUS, 300)
    vocab = {}
    for b in range(256):
        vocab[BYTE_ENCODER[b]] = len(vocab)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    ranks = {m: i for i, m in enumerate(merges)}
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")

    rng = random.Random(1234)
    pool = list("aZ09 '\n\t!.,é中😀٣\u00a0\u0301sltrevmd") + ["'s", "'ll", " "] * 3
    texts = TEXTS + ["".join(rng.choice(pool) for _ in range(rng.randint(1, 30))) for _ in range(200)]
    with open(os.path.join(out_dir, "cases.tsv"), "w", encoding="ascii") as f:
        for text in texts:
            pieces = PAT.findall(text)
            assert "".join(pieces) == text
            ids = []
            for p in pieces:
                ids += [vocab[s] for s in bpe("".join(BYTE_ENCODER[b] for b in p.encode("utf-8")), ranks)]
            f.write(text.encode("utf-8").hex() + "\t" + ",".join(p.encode("utf-8").hex() for p in pieces) + "\t" +
                    " ".join(map(str, ids)) + "\n")
    print(f"wrote {out_dir}: {len(vocab)} tokens, {len(merges)} merges, {len(texts)} cases")


if __name__ == "__main__":
    main()
