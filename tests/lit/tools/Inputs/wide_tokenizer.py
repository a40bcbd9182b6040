#!/usr/bin/python3
"""Write a tokenizer.json whose ids pass 65,535 (sp-tokenize-wide.test).

A byte-level BPE of GPT-2's kind: the 256 bytes are ids 0-255, every pair of
lowercase ASCII letters x y merges (in alphabetical order) into the id
65536 + 26 x + y, and an added token "<|end|>" is id VOCAB - 1, so the
vocabulary has VOCAB ids and text of words holds ids on both sides of 65,536.

    /usr/bin/python3 wide_tokenizer.py OUT.json [--vocab 70000]
"""
import argparse
import json


def byte_level(b):
    """GPT-2's bytes_to_unicode for one byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + sum(1 for c in range(b) if c not in printable))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, default=70000)
    a = ap.parse_args()
    vocab = {byte_level(b): b for b in range(256)}
    merges = []
    letters = "abcdefghijklmnopqrstuvwxyz"
    for i, x in enumerate(letters):
        for j, y in enumerate(letters):
            vocab[x + y] = 65536 + 26 * i + j
            merges.append(f"{x} {y}")
    assert max(vocab.values()) < a.vocab - 1
    tok = {
        "version": "1.0",
        "added_tokens": [{"id": a.vocab - 1, "content": "<|end|>", "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "model": {"type": "BPE", "vocab": vocab, "merges": merges},
    }
    with open(a.out, "w") as f:
        json.dump(tok, f)


if __name__ == "__main__":
    main()
