#!/usr/bin/env python3
"""Random-weight model files in llama2.c's legacy format, and a dummy tokenizer.bin, for timing
llama2.c's run.c beside bench_generate (bench/generate_vs_runc.py, docs/performance.md).

    llama2c_random.py OUT_DIR [--shape stories15M|stories42M] [--seed N]

writes OUT_DIR/<shape>.bin and OUT_DIR/tokenizer.bin (never into the repository: OUT_DIR is
yours). Written from llama2.c's format as its run.c reads it:

  model.bin: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
             a positive vocab_size means the classifier is the token embedding), then float32
             arrays in this order: token embedding [vocab, dim], attention RMSNorm [L, dim],
             wq [L, dim, dim], wk [L, kv_dim, dim], wv [L, kv_dim, dim], wo [L, dim, dim],
             ffn RMSNorm [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim],
             final RMSNorm [dim], and the two unused RoPE tables [seq_len, head_size / 2] each.
  tokenizer.bin: int32 max_token_length, then per token: float32 score, int32 length, bytes.
             32000 pieces: <unk>, <s>, </s>, the 256 byte pieces <0x00>..<0xFF>, then "w<id>".

Weights are normal(0, 0.02) and RMSNorm gains one, as xgrad's initialisation. Token 1 (BOS)
has an all-zero embedding row: with the tied classifier its logit is exactly 0 while the
others' maximum is positive, so greedy decoding never emits BOS, which would stop run.c early
(the timed run must decode all its steps). Speed does not depend on the values.
"""
import argparse
import os
import struct
import sys

import numpy as np

SHAPES = {
    # dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
    "stories15M": (288, 768, 6, 6, 6, 32000, 256),
    "stories42M": (512, 1376, 8, 8, 8, 32000, 1024),
}


def write_model(path, shape, seed):
    dim, hidden, layers, heads, kv_heads, vocab, seq = SHAPES[shape]
    head_size = dim // heads
    kv_dim = kv_heads * head_size
    rng = np.random.default_rng(seed)

    def normal(*size):
        return rng.normal(0.0, 0.02, size=size).astype(np.float32)

    tok = normal(vocab, dim)
    tok[1] = 0.0  # BOS: see the module docstring
    arrays = [
        tok,
        np.ones((layers, dim), np.float32),
        normal(layers, dim, dim),
        normal(layers, kv_dim, dim),
        normal(layers, kv_dim, dim),
        normal(layers, dim, dim),
        np.ones((layers, dim), np.float32),
        normal(layers, hidden, dim),
        normal(layers, dim, hidden),
        normal(layers, hidden, dim),
        np.ones(dim, np.float32),
        np.zeros((seq, head_size // 2), np.float32),
        np.zeros((seq, head_size // 2), np.float32),
    ]
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, seq))
        for a in arrays:
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())


def write_tokenizer(path, vocab=32000):
    pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % i for i in range(256)]
    pieces += [b"w%d" % i for i in range(len(pieces), vocab)]
    with open(path, "wb") as f:
        f.write(struct.pack("<i", max(len(p) for p in pieces)))
        for i, p in enumerate(pieces):
            f.write(struct.pack("<fi", -float(i), len(p)))
            f.write(p)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="folder to write <shape>.bin and tokenizer.bin into (created if missing)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="stories15M")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    model = os.path.join(args.out_dir, args.shape + ".bin")
    write_model(model, args.shape, args.seed)
    write_tokenizer(os.path.join(args.out_dir, "tokenizer.bin"))
    print(model, os.path.getsize(model), "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
