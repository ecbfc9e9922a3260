#!/usr/bin/env python3
"""Tokenises a text file with GPT-2's BPE (tiktoken) into llm.c's .bin token format for train_gpt.

    python3 examples/tokenize_gpt2.py input.txt train.bin [--val val.bin --val-fraction 0.1]

Format (read by mpar::data::TokenFile): 256 little-endian int32 header words -- magic 20240520,
version 1, token count, zeros -- then the tokens as little-endian uint16. Needs `pip install tiktoken`
(an optional dependency: the C++ side needs nothing), which downloads the BPE files on first use;
`--bytes` writes one id per byte instead, with neither. Documents are not split: an end-of-text token
(50256) starts the stream, as in llm.c's data scripts.
"""
import argparse
import struct
import sys


def write_bin(path, tokens):
    if any(t < 0 or t > 0xFFFF for t in tokens):
        sys.exit(f"tokenize_gpt2: a token id does not fit uint16 (version 1); {path} not written")
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
    print(f"wrote {len(tokens)} tokens to {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--val", help="also write the last --val-fraction of the tokens to this file")
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--bytes", action="store_true",
                    help="one id per byte of the input instead of GPT-2's BPE (no tiktoken, no download: for trying the path)")
    a = ap.parse_args()
    if a.bytes:
        with open(a.input, "rb") as f:
            split(a, list(f.read()))
        return
    try:
        import tiktoken
    except ImportError:
        sys.exit("tokenize_gpt2: needs tiktoken (pip install tiktoken)")
    enc = tiktoken.get_encoding("gpt2")
    with open(a.input, encoding="utf-8") as f:
        text = f.read()
    split(a, [enc.eot_token] + enc.encode_ordinary(text))


def split(a, tokens):
    if a.val:
        cut = int(len(tokens) * (1.0 - a.val_fraction))
        write_bin(a.output, tokens[:cut])
        write_bin(a.val, tokens[cut:])
    else:
        write_bin(a.output, tokens)


if __name__ == "__main__":
    main()
